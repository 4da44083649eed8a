//! Which kernels and variants an indexer configuration uses, loaded from a [`Runtime`].

use std::sync::Arc;

use crate::driver::Kernel;
use crate::error::{Error, Result};
use crate::pq::config::{DType, PqConfig, Shape};
use crate::pq::plan::{
    hist_built_for, index_built_for, range_built_for, HistFacts, IndexFacts, PlanFacts, RangeFacts,
    StepKind, StepPlan, BULK_QUANTIZE_MIN, INDEX_BUCKET_BUDGET_BYTES,
};
use crate::pq::variants::{KernelChoice, Loader};
use crate::runtime::Runtime;
use crate::tune::choice::VariantChoice;

/// Top-k widths the select kernel is compiled for (`K_PAD`, a power of two >= heavy);
/// source: `kernels_triton/pq_select.py`'s `K_PADS`.
pub const K_PADS: [usize; 3] = [128, 256, 512];

/// Code combinations the histogram path counts per row (`NC` in
/// `kernels_triton/pq_hist.py`): the path needs `K^M <= HIST_COMBOS`.
pub const HIST_COMBOS: usize = 4096;

/// The kernels' dtype suffix of `d` (`fp32`, `bf16`, `fp16`).
pub(crate) fn dt(d: DType) -> &'static str {
    match d {
        DType::F32 => "fp32",
        DType::BF16 => "bf16",
        DType::F16 => "fp16",
    }
}

/// The integer constexpr `name` of `k`'s variant.
///
/// Errors: [`Error::Invalid`] naming the variant where it has no such integer.
pub(crate) fn constexpr_usize(k: &Kernel, name: &str) -> Result<usize> {
    k.variant()
        .constexprs
        .get(name)
        .and_then(|v| v.as_u64())
        .map(|v| v as usize)
        .ok_or_else(|| {
            Error::invalid(
                format!("kernel variant {}", k.id()),
                format!("missing integer constexpr {name}"),
            )
        })
}

/// Select-kernel variant names for this config at sequence length `s`:
/// `pq_select.h<K_PAD>.q_<qt>.w_<wt>`, `K_PAD` the smallest of [`K_PADS`] at least
/// `heavy_size` resolved at `s` ([`PqConfig::heavy_at`]; a count `heavy_size` gives the
/// same name at every `s`). An indexer passes its capacity `S_alloc`, the largest `S`
/// it expects, so that its kernel serves every step up to there (a ratio's resolved
/// size grows with `S`).
///
/// Errors: [`Error::Invalid`] when the resolved `heavy_size` exceeds the largest of
/// [`K_PADS`].
pub fn select_kernel_name(cfg: &PqConfig, s: usize) -> Result<String> {
    let heavy = cfg.heavy_at(s);
    let k_pad = K_PADS
        .iter()
        .copied()
        .find(|&p| p >= heavy)
        .ok_or_else(|| {
            let size = if cfg.heavy_size.is_ratio() {
                format!("{} (heavy_size {} at S = {s})", heavy, cfg.heavy_size)
            } else {
                heavy.to_string()
            };
            Error::invalid(
                "heavy_size",
                format!(
                    "{size} exceeds the largest compiled top-k width {} (K_PADS in kernels_triton/pq_select.py)",
                    K_PADS[K_PADS.len() - 1]
                ),
            )
        })?;
    Ok(format!(
        "pq_select.h{k_pad}.q_{}.w_{}",
        dt(cfg.input_dtype),
        dt(cfg.weight_dtype)
    ))
}

/// The indexed histogram path's kernels.
pub(crate) struct IndexKernels {
    /// `pq_index.m2.q_<t>.w_<t>` as built (sm_90: a programmatic dependent launch).
    pub index: Arc<Kernel>,
    /// The same function launched without a programmatic dependency (the companion-fill
    /// step, where no primary precedes it).
    pub alone: Arc<Kernel>,
    /// `pq_wfill.w_<t>`; none where the pq_index variant has `PDL=0` (sm_80: its row
    /// CTAs write their weights themselves unless their companions do).
    pub wfill: Option<Arc<Kernel>>,
    /// pq_index's `TP` (gathered keys per row at most).
    pub tp: usize,
}

/// The split histogram path's kernels.
pub(crate) struct SplitKernels {
    /// `pq_thresh.m<MP>.q_<qt>`.
    pub thresh: Arc<Kernel>,
    /// `pq_emit.m<MP>.w_<wt>`.
    pub emit: Arc<Kernel>,
    /// The emit variant's `TILE` (positions per CTA).
    pub tile: usize,
}

/// The radix-select split path's kernels (`kernels_triton/pq_range.py`): the threshold
/// found by rounds of histograms over the keys' scores, for configs with more code
/// combinations than the combination histogram takes (`K^M > 4096` or `M > 4`), then the
/// split path's emit.
pub(crate) struct RangeKernels {
    /// `pq_rsel.m<MP>.q_<qt>`: the lookup table and the select's rounds, one cluster of
    /// CTAs a row.
    pub rsel: Arc<Kernel>,
    /// `pq_rsel`'s `BLOCK_C`: centroids per table tile (the new key's partial argmins are
    /// `cdiv(K, BLOCK_C)` per subvector).
    pub lut_block: usize,
    /// `pq_rsel`'s `CLUSTER`: CTAs per row (the launch's cluster on sm_90; 1 on sm_80).
    pub rsel_ctas: usize,
    /// `pq_emit.m<MP>.w_<wt>`.
    pub emit: Arc<Kernel>,
    /// The emit variant's `TILE` (positions per CTA).
    pub emit_tile: usize,
}

/// Whether keys at byte address `addr` with element strides `strides` (`[batch, head,
/// position]`) and subvectors of `d_s` elements meet `pq_quant.a16`'s declarations: the
/// address a multiple of 16 bytes, the strides and `d_s` multiples of 16 elements.
pub(crate) fn vector_loads_allowed(addr: u64, strides: [i64; 3], d_s: usize) -> bool {
    addr.is_multiple_of(16) && strides.iter().all(|s| s % 16 == 0) && d_s.is_multiple_of(16)
}

/// A `pq_quant` kernel, the keys of each of its tiles (its variant's `BLOCK_N`) and how
/// many of its CTAs an SM holds at once (the grid is sized to one round of them).
#[derive(Clone)]
pub(crate) struct QuantKernel {
    /// Launched without programmatic stream serialization: after anything on the
    /// stream, the caller's kernels included.
    pub kernel: Arc<Kernel>,
    /// The same function as built: on sm_90 (`PDL=1`) launched as the programmatic
    /// dependent of the launch before it, which must be the indexer's own `pq_wfill`
    /// (`kernels_triton/pq_quant.py`, "Chained after `pq_wfill`").
    pub chained: Arc<Kernel>,
    pub block: usize,
    pub ctas_per_sm: usize,
}

impl QuantKernel {
    /// `kernel` with its `BLOCK_N` and occupancy.
    ///
    /// Errors: [`Error::Invalid`] where the variant has no integer `BLOCK_N`; the
    /// driver's, querying the occupancy.
    fn new(kernel: Arc<Kernel>) -> Result<Self> {
        Ok(Self {
            block: constexpr_usize(&kernel, "BLOCK_N")?,
            ctas_per_sm: kernel.max_ctas_per_sm()? as usize,
            kernel: Arc::new(kernel.without_pdl()),
            chained: kernel,
        })
    }
}

/// The ragged step's kernels (`kernels_triton/pq_ragged.py`): every entry at its own
/// length, read on the device.
pub(crate) struct RaggedKernels {
    /// `pq_rgq.k_<qt>`: each row's new keys' codes, grid `(B*H_kv*M, NCH)`.
    pub rgq: Arc<Kernel>,
    /// `pq_rglut.q_<qt>`: the rows' lookup tables, grid `(B*H, M, cdiv(K, lut_block))`.
    pub rglut: Arc<Kernel>,
    /// `pq_rground`: one threshold round, grid `(B*H, max(1, cdiv(S_alloc -
    /// init_offset, round_tile)))`, launched four times.
    pub rground: Arc<Kernel>,
    /// `pq_rgcnt`: each part's taken-candidate counts, grid `(B*H, cdiv(S_alloc,
    /// emit_tile))`.
    pub rgcnt: Arc<Kernel>,
    /// `pq_rgemit.w_<wt>`: each part's slice of the outputs, the same grid.
    pub rgemit: Arc<Kernel>,
    /// `BLOCK_C` of `pq_rglut`.
    pub lut_block: usize,
    /// `TILE` of `pq_rground` (keys per CTA).
    pub round_tile: usize,
    /// `TILE` of `pq_rgcnt` and `pq_rgemit` (positions per CTA; the same parts).
    pub emit_tile: usize,
    /// The ragged split histogram path (`kernels_triton/pq_rgsplit.py`), where the
    /// combination histogram applies ([`hist_built_for`]) and its kernels are built.
    pub split: Option<RaggedSplitKernels>,
    /// The ragged indexed path (`kernels_triton/pq_rgindex.py`), where the indexed path
    /// applies ([`index_built_for`]) and its kernels are built.
    pub index: Option<RaggedIndexKernels>,
}

/// The ragged step's indexed path (`kernels_triton/pq_rgindex.py`), after `pq_rgq`.
pub(crate) struct RaggedIndexKernels {
    /// `pq_rgindex.m2.q_<t>.w_<t>`: each row's selection gathered from its combination
    /// buckets, grid `(B*H,)` (sm_90: `pq_rgwfill`'s programmatic dependent).
    pub index: Arc<Kernel>,
    /// `pq_rgwfill.w_<t>`: the rows' weights, grid `(B*H, cdiv(S_alloc, wfill_ch))`; none
    /// where `pq_rgindex` has `PDL=0` (sm_80: each row CTA writes its own weights).
    pub wfill: Option<Arc<Kernel>>,
    /// `CH` of `pq_rgwfill` (weight positions per CTA).
    pub wfill_ch: usize,
    /// `TP` of `pq_rgindex` (gathered keys per row at most).
    pub tp: usize,
}

/// The ragged step's split histogram path (`kernels_triton/pq_rgsplit.py`), after
/// `pq_rgq`.
pub(crate) struct RaggedSplitKernels {
    /// `pq_rgthresh.m<MP>.q_<qt>`: each row's histogram moved, its threshold, grid `(B*H,)`.
    pub thresh: Arc<Kernel>,
    /// `pq_rgthresh.r128.m<MP>.q_<qt>`: the same kernel held to 128 registers a thread (two
    /// CTAs an SM), where built; taken for more rows than one round of `thresh` holds
    /// ([`RaggedSplitKernels::thresh_for`]).
    pub thresh_r128: Option<Arc<Kernel>>,
    /// How many `thresh` CTAs an SM holds at once (the driver's occupancy).
    pub thresh_ctas_per_sm: usize,
    /// `pq_rgsemit.m<MP>.w_<wt>`: each row's emit over its parts, grid `(B*H*NP,)`.
    pub emit: Arc<Kernel>,
    /// The emit variant's `TILE` (keys per part).
    pub tile: usize,
}

impl RaggedSplitKernels {
    /// The threshold kernel for `rows` rows on `sm_count` SMs: `thresh_r128` where the rows
    /// need more than one round of `thresh` CTAs and it is built (its spills cost more
    /// than they save within one round: NOTES.md, "the ragged threshold at 128
    /// registers"), else `thresh`.
    pub fn thresh_for(&self, rows: usize, sm_count: u32) -> &Arc<Kernel> {
        match &self.thresh_r128 {
            Some(k) if rows > sm_count as usize * self.thresh_ctas_per_sm.max(1) => k,
            _ => &self.thresh,
        }
    }
}

/// The chunked select kernel and the sizes its launches use.
pub(crate) struct SelectKernel {
    pub kernel: Arc<Kernel>,
    /// Keys per select CTA (the variant's `CHUNK`).
    pub chunk: usize,
    /// The variant's `K_PAD`.
    pub k_pad: usize,
    /// The variant's staging width in keys (`2 * K_PAD`).
    pub stage: usize,
}

/// The kernels of one indexer configuration.
pub(crate) struct Kernels {
    /// `pq_select.h<K_PAD>.q_<qt>.w_<wt>`, where `heavy_size` resolved at the indexer's
    /// capacity `S_alloc` fits a compiled top-k width (at most 512); the histogram
    /// family takes any heavy size. A step whose resolved heavy size exceeds its `K_PAD`
    /// cannot take it ([`PlanFacts::chunked`]).
    pub select: Option<SelectKernel>,
    /// `pq_hist.m<MP>.q_<qt>.w_<wt>`, where the config allows it (`K^M <= 4096`, M <= 4).
    pub hist: Option<Arc<Kernel>>,
    /// `pq_thresh` and `pq_emit` (the split histogram path); where `hist` is.
    pub split: Option<SplitKernels>,
    /// The indexed histogram path, where built (`M <= 2`, `K^M <= 4096`, query dtype =
    /// weight dtype).
    pub index: Option<IndexKernels>,
    /// The radix-select split path, where the combination histogram does not apply
    /// (`K^M > 4096` or `M > 4`) and its kernels are built.
    pub range: Option<RangeKernels>,
    pub short: Arc<Kernel>,
    /// `pq_quant.k_<qt>`: a step's new keys, before the select kernel
    /// (`kernels_triton/pq_quant.py`), for any key layout.
    pub quant: QuantKernel,
    /// `pq_quant.a16.k_<qt>`: the same for keys whose address (16 bytes), strides and
    /// `d_s` (16 elements) are multiples of 16 (vector loads); where built.
    pub quant_a16: Option<QuantKernel>,
    /// `pq_cprep`: the centroids' norms and bf16 split that `pq_quant` reads, made once
    /// per indexer ([`crate::pq::state::DeviceState::new`]).
    pub cprep: Arc<Kernel>,
    pub import: Arc<Kernel>,
    pub export: Arc<Kernel>,
    /// The ragged step's kernels, where built (an older kernel cache has none: ragged
    /// steps are then refused, naming them).
    pub ragged: Option<RaggedKernels>,
    /// Every kernel loaded, its variant and where the variant came from, in load order.
    pub choices: Vec<VariantChoice>,
}

impl Kernels {
    /// Load the kernels of `cfg` (validated, `K <= 256`) from `rt`, each at the variant
    /// `choice` gives it (an override, else the tuning table's current winner for the
    /// kernel and the bucket of `shape`, else the manifest default:
    /// [`crate::pq::variants::KernelChoice`]): the histogram and indexed paths' kernels
    /// where the config allows them (the indexed path only where its variants are
    /// built). `shape.s` is the capacity `S_alloc`, the largest `S` the indexer expects:
    /// the select kernel is the one for `heavy_size` resolved there (a ratio's count
    /// grows with `S`; a count is the same everywhere).
    ///
    /// Errors: a missing kernel variant or constexpr, an override that is no variant of
    /// its kernel on this GPU or names a kernel this config does not load (e.g. a select
    /// kernel while heavy_size is above the compiled top-k widths), driver errors.
    pub fn load(
        rt: &Runtime,
        cfg: &PqConfig,
        shape: &Shape,
        choice: &KernelChoice,
    ) -> Result<Self> {
        let m = cfg.m();
        let mut ld = Loader::new(rt, choice, cfg, shape);
        // heavy sizes above the largest top-k width: no chunked kernel (the plan refuses
        // the steps that would need it; an override of one is refused as unused)
        let select = match select_kernel_name(cfg, shape.s) {
            Ok(name) => {
                let kernel = ld.load(&name)?;
                let k_pad = constexpr_usize(&kernel, "K_PAD")?;
                Some(SelectKernel {
                    chunk: constexpr_usize(&kernel, "CHUNK")?,
                    k_pad,
                    stage: 2 * k_pad,
                    kernel,
                })
            }
            Err(_) => None,
        };
        let qt = dt(cfg.input_dtype);
        let wt = dt(cfg.weight_dtype);
        let index = if index_built_for(cfg) {
            // built for these configs only (kernels_triton/pq_index.py)
            match (
                ld.load_optional(&format!("pq_index.m2.q_{qt}.w_{wt}"))?,
                ld.load_optional(&format!("pq_wfill.w_{wt}"))?,
            ) {
                (Some(ix), Some(fill)) => {
                    let tp = constexpr_usize(&ix, "TP")?;
                    let wfill = (constexpr_usize(&ix, "PDL")? == 1).then_some(fill);
                    if let Some(f) = &wfill {
                        // pq_index (32 KB of shared memory per CTA) must fit beside it
                        f.prefer_shared_carveout()?;
                    }
                    Some(IndexKernels {
                        alone: Arc::new(ix.without_pdl()),
                        index: ix,
                        wfill,
                        tp,
                    })
                }
                _ => None,
            }
        } else {
            None
        };
        let quant_name = format!("pq_quant.k_{qt}");
        let a16_name = format!("pq_quant.a16.k_{qt}");
        let quant = QuantKernel::new(ld.load(&quant_name)?)?;
        // an override of the any-layout build alone: it serves every key layout (see
        // KernelChoice); an older kernel cache has no vector-load build
        let quant_a16 = if ld.overridden(&quant_name) && !ld.overridden(&a16_name) {
            None
        } else {
            match ld.load_optional(&a16_name)? {
                Some(k) => Some(QuantKernel::new(k)?),
                None => None,
            }
        };
        let (hist, split) = if hist_built_for(cfg) {
            let mp = if m <= 2 { 2 } else { 4 };
            let emit = ld.load(&format!("pq_emit.m{mp}.w_{wt}"))?;
            let tile = constexpr_usize(&emit, "TILE")?;
            (
                Some(ld.load(&format!("pq_hist.m{mp}.q_{qt}.w_{wt}"))?),
                Some(SplitKernels {
                    thresh: ld.load(&format!("pq_thresh.m{mp}.q_{qt}"))?,
                    emit,
                    tile,
                }),
            )
        } else {
            (None, None)
        };
        let range = if range_built_for(cfg) {
            let mp = match m {
                ..=2 => 2,
                3 | 4 => 4,
                _ => 8,
            };
            match ld.load_optional(&format!("pq_rsel.m{mp}.q_{qt}"))? {
                Some(rsel) => {
                    let emit = ld.load(&format!("pq_emit.m{mp}.w_{wt}"))?;
                    Some(RangeKernels {
                        lut_block: constexpr_usize(&rsel, "BLOCK_C")?,
                        rsel_ctas: constexpr_usize(&rsel, "CLUSTER")?,
                        emit_tile: constexpr_usize(&emit, "TILE")?,
                        rsel,
                        emit,
                    })
                }
                None => None, // an older kernel cache: the chunked path serves
            }
        } else {
            None
        };
        let ragged = match (
            ld.load_optional(&format!("pq_rgq.k_{qt}"))?,
            ld.load_optional(&format!("pq_rglut.q_{qt}"))?,
            ld.load_optional("pq_rground")?,
            ld.load_optional("pq_rgcnt")?,
            ld.load_optional(&format!("pq_rgemit.w_{wt}"))?,
        ) {
            (Some(rgq), Some(rglut), Some(rground), Some(rgcnt), Some(rgemit)) => {
                let emit_tile = constexpr_usize(&rgemit, "TILE")?;
                if constexpr_usize(&rgcnt, "TILE")? != emit_tile {
                    return Err(Error::invalid(
                        "ragged kernels",
                        format!(
                            "{} and {} have different TILEs (they must cut a row into the \
                             same parts)",
                            rgcnt.id(),
                            rgemit.id()
                        ),
                    ));
                }
                let mp = if m <= 2 { 2 } else { 4 };
                let (thresh, emit) = if hist_built_for(cfg) {
                    (
                        ld.load_optional(&format!("pq_rgthresh.m{mp}.q_{qt}"))?,
                        ld.load_optional(&format!("pq_rgsemit.m{mp}.w_{wt}"))?,
                    )
                } else {
                    (None, None)
                };
                let split = match (thresh, emit) {
                    (Some(thresh), Some(emit)) => Some(RaggedSplitKernels {
                        tile: constexpr_usize(&emit, "TILE")?,
                        thresh_r128: ld.load_optional(&format!("pq_rgthresh.r128.m{mp}.q_{qt}"))?,
                        thresh_ctas_per_sm: thresh.max_ctas_per_sm()? as usize,
                        thresh,
                        emit,
                    }),
                    _ => None, // the radix ragged kernels serve
                };
                let index = if index_built_for(cfg) {
                    match (
                        ld.load_optional(&format!("pq_rgindex.m2.q_{qt}.w_{wt}"))?,
                        ld.load_optional(&format!("pq_rgwfill.w_{wt}"))?,
                    ) {
                        (Some(ix), Some(fill)) => {
                            let pdl = constexpr_usize(&ix, "PDL")? == 1;
                            if pdl {
                                // a pq_rgindex CTA must fit beside a pq_rgwfill CTA
                                fill.prefer_shared_carveout()?;
                            }
                            Some(RaggedIndexKernels {
                                tp: constexpr_usize(&ix, "TP")?,
                                wfill_ch: constexpr_usize(&fill, "CH")?,
                                wfill: pdl.then_some(fill),
                                index: ix,
                            })
                        }
                        _ => None, // the split path serves
                    }
                } else {
                    None
                };
                Some(RaggedKernels {
                    split,
                    index,
                    lut_block: constexpr_usize(&rglut, "BLOCK_C")?,
                    round_tile: constexpr_usize(&rground, "TILE")?,
                    emit_tile,
                    rgq,
                    rglut,
                    rground,
                    rgcnt,
                    rgemit,
                })
            }
            _ => None, // an older kernel cache: ragged steps are refused, naming them
        };
        let short = ld.load(&format!("pq_short.w_{wt}"))?;
        let cprep = ld.load("pq_cprep")?;
        let import = ld.load("pq_codes_import")?;
        let export = ld.load("pq_codes_export")?;
        let choices = ld.finish()?;
        Ok(Kernels {
            ragged,
            hist,
            split,
            index,
            range,
            select,
            short,
            quant,
            quant_a16,
            cprep,
            import,
            export,
            choices,
        })
    }

    /// The facts [`crate::pq::plan::plan_step`] needs, on a GPU of `sm_count` SMs.
    pub fn facts(&self, sm_count: u32) -> PlanFacts {
        let hist = match (&self.hist, &self.split) {
            (Some(_), Some(sp)) => Some(HistFacts { emit_tile: sp.tile }),
            _ => None,
        };
        PlanFacts {
            sm_count,
            hist,
            index: self.index.as_ref().map(|ik| IndexFacts {
                wfill: ik.wfill.is_some(),
                tp: ik.tp,
                bucket_budget: INDEX_BUCKET_BUDGET_BYTES,
            }),
            bulk_min: BULK_QUANTIZE_MIN,
            chunked: self.select.as_ref().map(|sk| sk.k_pad),
            range: self.range.as_ref().map(|rk| RangeFacts {
                emit_tile: rk.emit_tile,
            }),
        }
    }

    /// The `pq_quant` kernel for keys at byte address `addr` with element strides
    /// `strides` and subvectors of `d_s` elements: the aligned one (vector loads) where
    /// `addr` is a multiple of 16 bytes and `strides` and `d_s` of 16 elements, else the
    /// any-layout one.
    pub fn quant_for(&self, addr: u64, strides: [i64; 3], d_s: usize) -> &QuantKernel {
        match &self.quant_a16 {
            Some(q) if vector_loads_allowed(addr, strides, d_s) => q,
            _ => &self.quant,
        }
    }

    /// Every kernel variant the indexer launches (for reports).
    pub fn all(&self) -> Vec<Arc<Kernel>> {
        let mut v = vec![
            self.short.clone(),
            self.quant.kernel.clone(),
            self.cprep.clone(),
        ];
        v.extend(self.select.as_ref().map(|s| s.kernel.clone()));
        v.extend(self.quant_a16.as_ref().map(|q| q.kernel.clone()));
        v.extend(self.hist.clone());
        if let Some(sp) = &self.split {
            v.extend([sp.thresh.clone(), sp.emit.clone()]);
        }
        if let Some(ik) = &self.index {
            v.extend(ik.wfill.clone());
            v.push(ik.index.clone());
        }
        if let Some(rk) = &self.range {
            v.extend([rk.rsel.clone(), rk.emit.clone()]);
        }
        if let Some(rg) = &self.ragged {
            v.extend([
                rg.rgq.clone(),
                rg.rglut.clone(),
                rg.rground.clone(),
                rg.rgcnt.clone(),
                rg.rgemit.clone(),
            ]);
            if let Some(sp) = &rg.split {
                v.extend([sp.thresh.clone(), sp.emit.clone()]);
            }
        }
        v
    }

    /// The kernels a step of `plan` launches, in launch order, each once; `pq_quant` as
    /// [`Kernels::quant_for`] picks it for keys at `key_addr` with element strides
    /// `key_strides` and subvectors of `d_s` elements.
    /// A kernel the plan needs but this config did not load is left out (the step itself
    /// refuses it).
    pub fn launched(
        &self,
        plan: &StepPlan,
        key_addr: u64,
        key_strides: [i64; 3],
        d_s: usize,
    ) -> Vec<&Arc<Kernel>> {
        let mut v: Vec<&Arc<Kernel>> = Vec::with_capacity(4);
        if plan.bulk_quantize {
            v.push(&self.quant_for(key_addr, key_strides, d_s).kernel);
        }
        match plan.kind {
            StepKind::Short => v.push(&self.short),
            StepKind::Chunked => v.extend(self.select.as_ref().map(|s| &s.kernel)),
            StepKind::Hist => v.extend(self.hist.as_ref()),
            StepKind::Split { .. } => {
                if let Some(sp) = &self.split {
                    v.extend([&sp.thresh, &sp.emit]);
                }
            }
            StepKind::Range { .. } => {
                if let Some(rk) = &self.range {
                    v.extend([&rk.rsel, &rk.emit]);
                }
            }
            StepKind::IndexWfill => {
                if let Some(ik) = &self.index {
                    v.extend(ik.wfill.as_ref());
                    v.push(&ik.index);
                }
            }
            StepKind::IndexRowFill => v.extend(self.index.as_ref().map(|ik| &ik.index)),
            StepKind::IndexCompanion => v.extend(self.index.as_ref().map(|ik| &ik.alone)),
        }
        v
    }

    /// The choice (variant and origin) of the kernel whose variant is `id`.
    pub fn choice_of(&self, id: &str) -> Option<&VariantChoice> {
        self.choices.iter().find(|c| c.variant == id)
    }
}

#[cfg(test)]
mod tests {
    use super::vector_loads_allowed;

    #[test]
    fn vector_loads_need_every_term_divisible_by_16() {
        let st = [8 * 32768 * 128, 32768 * 128, 128];
        assert!(vector_loads_allowed(0x7f00_0000_0200, st, 64));
        // the address: 8 bytes off
        assert!(!vector_loads_allowed(0x7f00_0000_0208, st, 64));
        // one stride: a head of 4100 positions x 72 elements, rows of 72
        assert!(!vector_loads_allowed(
            0x1000,
            [8 * 4100 * 72, 4100 * 72, 72],
            64
        ));
        assert!(!vector_loads_allowed(0x1000, [st[0], st[1] + 8, st[2]], 64));
        // d_s = 36 (D = 72, M = 2)
        assert!(!vector_loads_allowed(0x1000, st, 36));
        // a zero batch stride (B = 1 views) is a multiple of 16
        assert!(vector_loads_allowed(0x1000, [0, st[1], st[2]], 16));
    }
}
