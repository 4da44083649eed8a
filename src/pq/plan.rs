//! The step plan: which kernels a decode step launches, decided as data.
//!
//! [`plan_step`] is a pure function (no GPU, no driver call) from the config, the shape,
//! `S`, `N_cached`, the [`SelectPath`] asked for and the few device facts that matter
//! ([`PlanFacts`]: SM count, which histogram-path kernels are built) to a [`StepPlan`],
//! whose [`StepKind`] the indexer then turns into launches. [`StepInfo`], what a step
//! reports, is derived from the plan.

use crate::error::{Error, Result};
use crate::pq::config::{PqConfig, Shape};
use crate::pq::kernels::{HIST_COMBOS, K_PADS};

/// More new keys than this in one step are quantized by the bulk quantize kernel
/// (`pq_quant`, tiles of keys x centroids on the tensor cores over every SM) launched
/// before the select kernel, instead of inside the select kernel (its chunks, or the
/// histogram kernels' companion CTAs). The default of [`PlanFacts::bulk_min`]; see
/// ARCHITECTURE.md, "The decode step", for the measurement that chose it.
///
/// Measured on an H200 (NOTES.md, "multi-token steps (issue 21, item 1)"; B=1 H=32
/// H_kv=8 S=32768 bf16, graph wall): 1 new key 24.9 us in the select kernel against 29.6
/// with `pq_quant`; 2 keys 31.1 against 28.5; 8 keys 52.5 against 28.1.
pub const BULK_QUANTIZE_MIN: usize = 1;

/// The most bytes of `weight_list` per row for which [`SelectPath::Index`] lets each
/// row's companion CTA write them (one CTA writes ~30 GB/s, ~4.3 us for 128 KB, within
/// the row CTA's ~10 us; measured on the H100, NOTES.md, "`pq_index` selects by cuts and
/// sorts; one launch for few rows": reference workload (128 000 bytes per row) 12.0 us
/// GPU per step against 13.6 with `pq_wfill`; S = 65536 (256 KiB) 15.9 us, the row
/// waiting for its weights).
pub const COMPANION_FILL_MAX_BYTES: usize = 128 * 1024;

/// Rows (`B*H`) below which [`SelectPath::Auto`] takes the split histogram path (with
/// at least [`AUTO_SPLIT_MIN_KEYS`] quantized keys), and from which it takes `pq_hist`
/// (with at least [`AUTO_HIST_MIN_KEYS`]).
pub const AUTO_HIST_MIN_ROWS: usize = 64;
/// Quantized keys from which [`SelectPath::Auto`] takes the split path (fewer than
/// [`AUTO_HIST_MIN_ROWS`] rows).
pub const AUTO_SPLIT_MIN_KEYS: usize = 16384;
/// Quantized keys from which [`SelectPath::Auto`] takes `pq_hist` (at least
/// [`AUTO_HIST_MIN_ROWS`] rows).
pub const AUTO_HIST_MIN_KEYS: usize = 32768;

/// The most bytes of indexed-path buckets (`i32 [B*H, 4096, capc]`, see
/// [`index_bucket_bytes`]) for which [`SelectPath::Auto`] takes the indexed path; above
/// it Auto takes `pq_hist` or split as it would without `pq_index` (the default of
/// [`IndexFacts::bucket_budget`]; `GpuIndexer::set_index_bucket_budget` moves it).
///
/// Why 256 MiB: the large workload (B=4 H=32 S=131072, 128 rows) needs 160 MiB of
/// buckets and is where the indexed path wins most (H100, `tritonrt run`: 44-46 us
/// against 81.6 `pq_hist` and 84.6 split; NOTES.md, "the indexed histogram path
/// (`pq_wfill` + `pq_index`): large target met"), so the budget keeps it with room for
/// about 1.6 times as many row-keys (B=4 up to S of about 210k, or B=6 at 131072). Past
/// that the buckets grow by 8 bytes per key and query head (2 GB at 1024 rows of 131k
/// keys, per layer), while the paths Auto falls back to need no per-key state beyond the
/// codes and were measured within 2x of it (128 rows: 80-90 us).
pub const INDEX_BUCKET_BUDGET_BYTES: usize = 256 << 20;

/// Code capacity per (batch, KV head, subvector), in keys, of a code state grown to hold
/// `n` keys from empty: `n` rounded up to a multiple of 16, at least 16 (the indexer
/// grows it to `max(n, min(2 x old capacity, the keys of S_alloc))` rounded the same way).
pub fn code_capacity(n: usize) -> usize {
    n.max(16).div_ceil(16) * 16
}

/// The indexed path's bucket capacity `capc` (key positions per combination per row)
/// for a code capacity of `cap` keys: twice a uniform share of the keys per combination,
/// plus 16 (`2 cdiv(cap, 4096) + 16`). A row whose taken combinations hold more keys
/// falls back to a pass over its codes, still exact.
pub fn bucket_capacity(cap: usize) -> usize {
    2 * cap.div_ceil(HIST_COMBOS) + 16
}

/// Bytes of the indexed path's buckets, `i32 [rows, 4096, capc]` with `capc =`
/// [`bucket_capacity`]`(cap)`, for `rows = B*H` and a code capacity of `cap` keys (the
/// large workload: 128 rows, cap 130944, capc 80: 167 772 160 bytes).
pub fn index_bucket_bytes(rows: usize, cap: usize) -> usize {
    rows.saturating_mul(HIST_COMBOS)
        .saturating_mul(bucket_capacity(cap))
        .saturating_mul(4)
}

/// Which select kernel a (non-short) step uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum SelectPath {
    /// The histogram path where it applies and the shape favours it: the indexed path
    /// (`pq_index`, its weights written as [`SelectPath::Index`] chooses) wherever it is
    /// built (NOTES.md, "`pq_index` selects by cuts and sorts; one launch for few rows":
    /// large workload 44.0-45.1 us, reference 19.1-20.5); else split (`pq_thresh` and
    /// `pq_emit`) for fewer than 64 rows (`B*H`) of at least 16384 quantized keys,
    /// `pq_hist` for at least 64 rows and 32768 keys; else `pq_select`. Measured on the
    /// H100 (NOTES.md, "the histogram path split in two launches" and "the threshold
    /// rounds"): one `pq_hist` CTA per row leaves most SMs idle with few rows, where the
    /// split path spreads the emit over every SM (reference workload, `tritonrt run`
    /// wall per step: 25.3 us split, 34.7 pq_hist, 32.9 chunked); with 128 rows of 131k
    /// keys `pq_hist` is fastest (82.6 us, split 85.0, chunked 254.9).
    #[default]
    Auto,
    /// Always `pq_select` (top-k per chunk of keys, merged by each row's last CTA).
    Chunked,
    /// `pq_hist` whenever it applies (`K^M <= 4096`, `M <= 4`; new keys beyond
    /// [`PlanFacts::bulk_min`], or any new key that is a candidate, are quantized by
    /// `pq_quant` first); else `pq_select`.
    Hist,
    /// `pq_thresh` + `pq_emit` whenever they apply (as [`SelectPath::Hist`]); else
    /// chunked.
    Split,
    /// `pq_index` wherever it is built and the histogram path applies (as
    /// [`SelectPath::Hist`], `M <= 2`, query dtype = weight dtype, `B*H*S < 2^31`); else
    /// as [`SelectPath::Split`]. Its weights come from each row's companion CTA
    /// ([`SelectPath::IndexCompanion`]) when every CTA of the launch has an SM of its own
    /// (`2 B*H <=` SMs), `weight_list` is fp32 and a row's weights are at most
    /// [`COMPANION_FILL_MAX_BYTES`] (or no `pq_wfill` is built: sm_80), else as
    /// [`SelectPath::IndexWfill`]. With 16-bit weights the companion fill was the slower
    /// form at every shape measured (H100, graph wall, one new key; NOTES.md, "companion
    /// fill and 16-bit weights"): bf16 B=1 H=32 H_kv=8 S=32768 27.9 us against 21.8 with
    /// `pq_wfill`, S=65536 38.7 against 23.5; fp32 within 0.6 us either way, the
    /// reference workload 19.5 against 21.5.
    Index,
    /// [`SelectPath::Index`] with `weight_list` written by each row's companion CTA in
    /// the same launch (grid `(B*H, 2)`: CTA `(r, 0)` writes row `r`'s zeros and sink /
    /// window ones, then quantizes; the row CTA `(r, 1)` writes its heavy ones, and
    /// whichever of the two arrives second on the row's counter rewrites the row's ones
    /// from `sparse_list`). One launch, no programmatic dependency.
    IndexCompanion,
    /// [`SelectPath::Index`] with `weight_list` written by `pq_wfill` over every SM,
    /// `pq_index` its programmatic dependent launch (sm_90); where no `pq_wfill` is built
    /// (sm_80) each row CTA writes its own row first.
    IndexWfill,
}

impl SelectPath {
    /// Every path a caller can force, one of each kind of select launch (`Index`, which
    /// picks one of its two weight fills, and `Auto` left out): for sweeps over the paths
    /// and for finding which path launches a given kernel.
    pub const FORCED: [SelectPath; 5] = [
        SelectPath::Chunked,
        SelectPath::Hist,
        SelectPath::Split,
        SelectPath::IndexWfill,
        SelectPath::IndexCompanion,
    ];

    /// Whether this path asks for the indexed histogram path where it applies: under
    /// [`SelectPath::Index`], its two weight-fill forms and [`SelectPath::Auto`]
    /// (measured on the H100, NOTES.md, "the indexed histogram path (`pq_wfill` +
    /// `pq_index`): large target met", `tritonrt run`: large workload 46.1 us against
    /// 81.6 pq_hist and 84.6 split; reference 24.2-24.7 against 25.4-25.6 split; S = 8192:
    /// 24.5 us in the JIT harness against 31.6 for pq_select's default variant). The
    /// indexer allocates the indexed path's buckets only for steps that take it
    /// ([`takes_index`]), which needs one of these paths.
    pub fn wants_index(self) -> bool {
        matches!(
            self,
            SelectPath::Index
                | SelectPath::IndexCompanion
                | SelectPath::IndexWfill
                | SelectPath::Auto
        )
    }
}

/// The histogram-path kernels built for a config (`pq_hist`, `pq_thresh`, `pq_emit`:
/// `K^M <= 4096`, `M <= 4`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HistFacts {
    /// `pq_emit`'s `TILE`: quantized keys per emit CTA (> 0).
    pub emit_tile: usize,
}

/// The indexed path's kernels built for a config (`pq_index`: `M <= 2`, `K^M <= 4096`,
/// query dtype = weight dtype).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IndexFacts {
    /// Whether `pq_wfill` is built beside it (the `pq_index` variant has `PDL=1`: sm_90);
    /// without it (sm_80) each row CTA writes its own weights unless its companion does.
    pub wfill: bool,
    /// `pq_index`'s `TP`: the most keys a row gathers from its buckets. A row with more
    /// heavy picks than this falls back to a pass over its codes in the same CTA.
    pub tp: usize,
    /// The most bytes of buckets ([`index_bucket_bytes`] at the step's `n`) for which
    /// [`SelectPath::Auto`] takes the indexed path ([`INDEX_BUCKET_BUDGET_BYTES`] by
    /// default). The forced index paths ignore it.
    pub bucket_budget: usize,
}

/// The radix-select split path's kernels built for a config (`pq_rsel`, `pq_emit`: `K^M >
/// 4096` or `M > 4`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RangeFacts {
    /// `pq_emit`'s `TILE`: quantized keys per emit CTA (> 0).
    pub emit_tile: usize,
}

/// What [`plan_step`] needs to know of the GPU and of the kernels built for the config
/// (the architecture matters only through which variants exist).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PlanFacts {
    /// Streaming multiprocessors of the GPU.
    pub sm_count: u32,
    /// The histogram path's kernels, where built (none: every step is chunked or short).
    pub hist: Option<HistFacts>,
    /// The indexed path's kernels, where built (used only where `hist` is too).
    pub index: Option<IndexFacts>,
    /// More new keys than this are quantized by `pq_quant` before the select kernel
    /// ([`BULK_QUANTIZE_MIN`] unless set otherwise, e.g. to measure the threshold).
    pub bulk_min: usize,
    /// The top-k width `K_PAD` of the chunked select kernel (`pq_select`) loaded for
    /// the config, None where none is (`heavy_size` resolved at the indexer's capacity
    /// above 512, its largest width). A step can take the chunked path only where its
    /// own resolved `heavy_size` is at most this (a ratio's count grows with `S`). The
    /// histogram family takes any heavy size; a step that needs the chunked path
    /// without a kernel for its heavy size is refused.
    pub chunked: Option<usize>,
    /// The radix-select split path's kernels, where built (configs the combination
    /// histogram does not take: `K^M > 4096` or `M > 4`).
    pub range: Option<RangeFacts>,
}

/// `pq_emit`'s `TILE` in the shipped kernel set's sm_90 defaults (`ptx_cache/manifest.json`;
/// `tests/pq_memory.rs` checks it), for [`PlanFacts::shipped_sm90`].
pub const SHIPPED_EMIT_TILE: usize = 4096;
/// `pq_index`'s `TP` in the shipped kernel set (checked as [`SHIPPED_EMIT_TILE`]).
pub const SHIPPED_INDEX_TP: usize = 256;

/// Whether the histogram family (`pq_hist`, `pq_thresh`, `pq_emit`) is built for `cfg`:
/// `K^M <=` [`HIST_COMBOS`] and `M <= 4`.
pub fn hist_built_for(cfg: &PqConfig) -> bool {
    let combos = cfg.k_centroids().checked_pow(cfg.m() as u32);
    combos.is_some_and(|c| c <= HIST_COMBOS) && cfg.m() <= 4
}

/// Whether the radix-select split path (`pq_rsel`, `pq_emit`) is built for
/// `cfg`: wherever the histogram family is not ([`hist_built_for`]: `K^M > 4096` or
/// `M > 4`), so one of the two serves every config.
pub fn range_built_for(cfg: &PqConfig) -> bool {
    !hist_built_for(cfg)
}

/// Whether the indexed path (`pq_index`) is built for `cfg` (kernels_triton/pq_index.py):
/// the histogram family is ([`hist_built_for`]), `M <= 2` and the query dtype is the
/// weight dtype.
pub fn index_built_for(cfg: &PqConfig) -> bool {
    hist_built_for(cfg) && cfg.m() <= 2 && cfg.input_dtype == cfg.weight_dtype
}

impl PlanFacts {
    /// The facts an indexer for `cfg` has on an sm_90 GPU of `sm_count` SMs with the
    /// shipped kernel set's defaults: the histogram family where [`hist_built_for`]
    /// (`TILE` [`SHIPPED_EMIT_TILE`]), `pq_index` with `pq_wfill` where
    /// [`index_built_for`] (`TP` [`SHIPPED_INDEX_TP`], budget
    /// [`INDEX_BUCKET_BUDGET_BYTES`]), the chunked kernel where `heavy_size` resolved
    /// at `s_alloc` is at most 512 (its smallest top-k width that holds it),
    /// [`BULK_QUANTIZE_MIN`]. For planning and sizing on the CPU (tests, the bench
    /// matrix's definition); a live indexer reads its facts from the kernels it loaded
    /// (`GpuIndexer::plan_facts`).
    pub fn shipped_sm90(cfg: &PqConfig, s_alloc: usize, sm_count: u32) -> PlanFacts {
        let heavy = cfg.heavy_at(s_alloc);
        PlanFacts {
            sm_count,
            hist: hist_built_for(cfg).then_some(HistFacts {
                emit_tile: SHIPPED_EMIT_TILE,
            }),
            index: index_built_for(cfg).then_some(IndexFacts {
                wfill: true,
                tp: SHIPPED_INDEX_TP,
                bucket_budget: INDEX_BUCKET_BUDGET_BYTES,
            }),
            bulk_min: BULK_QUANTIZE_MIN,
            chunked: K_PADS.iter().copied().find(|&p| p >= heavy),
            range: range_built_for(cfg).then_some(RangeFacts {
                emit_tile: SHIPPED_EMIT_TILE,
            }),
        }
    }
}

/// What one decode step launches, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StepKind {
    /// Short sequence (`S <= heavy + init_offset + 1 + K`): `pq_short` alone, grid
    /// `(cdiv(S, BLOCK), B*H)`.
    Short,
    /// `pq_select` over `cdiv(n, CHUNK)` chunks per row (it quantizes the new keys in
    /// its chunks unless `pq_quant` ran first: [`StepPlan::bulk_quantize`]).
    Chunked,
    /// `pq_hist` alone, grid `(B*H, 2)`.
    Hist,
    /// `pq_thresh` (grid `(B*H, 2)`) then `pq_emit` (grid `B*H x parts`).
    Split {
        /// Emit CTAs per row: `cdiv(n, TILE)`.
        parts: usize,
    },
    /// `pq_rsel` (grid `(CLUSTER, B*H)`: one cluster of CTAs a row, which writes its row's
    /// lookup table first), then `pq_emit` (grid `B*H x parts`): the split path with its
    /// threshold found by a radix select over the keys' scores (any `K^M`).
    Range {
        /// Emit CTAs per row: `cdiv(n, TILE)`.
        parts: usize,
    },
    /// `pq_wfill` (one CTA per SM) then `pq_index` (grid `(B*H, 2)`) as its programmatic
    /// dependent launch.
    IndexWfill,
    /// `pq_index` alone, each row CTA writing its own row's weights first (no `pq_wfill`
    /// built: sm_80).
    IndexRowFill,
    /// `pq_index` alone without a programmatic dependency, each row's companion CTA
    /// writing the row's weights (`fill = 1`).
    IndexCompanion,
}

impl StepKind {
    /// Kernel launches of a step of this kind, `pq_quant` not counted.
    pub fn launches(self) -> usize {
        match self {
            StepKind::Short
            | StepKind::Chunked
            | StepKind::Hist
            | StepKind::IndexRowFill
            | StepKind::IndexCompanion => 1,
            StepKind::Split { .. } | StepKind::Range { .. } | StepKind::IndexWfill => 2,
        }
    }

    /// Whether it is a histogram path (`pq_hist`, split, radix-select split or indexed).
    pub fn is_hist(self) -> bool {
        matches!(
            self,
            StepKind::Hist
                | StepKind::Split { .. }
                | StepKind::Range { .. }
                | StepKind::IndexWfill
                | StepKind::IndexRowFill
                | StepKind::IndexCompanion
        )
    }

    /// Whether it is the indexed histogram path (`pq_index`).
    pub fn is_index(self) -> bool {
        matches!(
            self,
            StepKind::IndexWfill | StepKind::IndexRowFill | StepKind::IndexCompanion
        )
    }

    /// A short name for reports and JSON: `short`, `chunked`, `hist`, `split`,
    /// `radix-split`, `index-wfill`, `index-rowfill`, `index-companion`.
    pub fn name(self) -> &'static str {
        match self {
            StepKind::Short => "short",
            StepKind::Chunked => "chunked",
            StepKind::Hist => "hist",
            StepKind::Split { .. } => "split",
            StepKind::Range { .. } => "radix-split",
            StepKind::IndexWfill => "index-wfill",
            StepKind::IndexRowFill => "index-rowfill",
            StepKind::IndexCompanion => "index-companion",
        }
    }
}

/// One decode step, planned: what it launches and the counts the launches use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StepPlan {
    /// What the step's select launches are.
    pub kind: StepKind,
    /// Whether `pq_quant` (grid `(cdiv(n - n_old, BLOCK_N), B*H_kv*M)`) quantizes the new
    /// keys first, the select kernels then seeing `n_old = n` (nothing to quantize);
    /// else the select kernel quantizes them itself (never on the short path).
    pub bulk_quantize: bool,
    /// `S` of the step.
    pub s: usize,
    /// `N_cached` before the step.
    pub n_old: usize,
    /// `N_cached` after the step: `S - init_offset`, or `n_old` on the short path.
    pub n: usize,
    /// Entries per row of `sparse_list` (`S` on the short path).
    pub total: usize,
}

/// Plan one decode step at sequence length `s` with `n_old` keys already quantized,
/// for `shape` (its `s` is ignored; `B*H` rows), under `path` on a GPU and kernel set
/// described by `facts`. Pure: no GPU, no driver call.
///
/// The rules, in order: the short path when `cfg.is_short(s)`; else the new keys are
/// quantized by `pq_quant` first when there are more than `facts.bulk_min` of them, or
/// when the step takes a histogram path and one of them is a candidate (`w0 > n_old`:
/// the histogram kernels' companion CTAs write codes the row CTAs would read); the
/// histogram path applies where `facts.hist` is built (any number of new keys); the
/// indexed form where also
/// `facts.index` is built, `path.wants_index()` and `B*H*S` fits an i32, and under
/// [`SelectPath::Auto`] at most `TP / 2` heavy picks and buckets within
/// [`IndexFacts::bucket_budget`] ([`takes_index`]; its weight fill as
/// [`SelectPath::Index`] describes); else `pq_hist` or split as `path` asks
/// ([`SelectPath::Auto`]: split for fewer than [`AUTO_HIST_MIN_ROWS`] rows of at least
/// [`AUTO_SPLIT_MIN_KEYS`] keys where split applies, `pq_hist` for at least
/// [`AUTO_HIST_MIN_ROWS`] rows of at least [`AUTO_HIST_MIN_KEYS`] keys); else chunked.
/// Every size is resolved at `s` (spec "Sizes given as ratios"): the short threshold,
/// `k`, sink and window, and whether the loaded chunked kernel's top-k width
/// ([`PlanFacts::chunked`]) holds this step's heavy size (if not, `Auto` takes the
/// histogram family).
///
/// Errors: [`Error::Invalid`] (`seq_len`) when `s == 0`, or on a long-path step when
/// `s - init_offset < n_old` (the state is ahead of the sequence); [`Error::Invalid`]
/// (`heavy_size`, naming the resolved size, the kernel's width and why the chunked path
/// was needed) when the step needs the chunked path and no loaded chunked kernel holds
/// its heavy size.
pub fn plan_step(
    cfg: &PqConfig,
    shape: &Shape,
    s: usize,
    n_old: usize,
    path: SelectPath,
    facts: &PlanFacts,
) -> Result<StepPlan> {
    if s == 0 {
        return Err(Error::invalid("seq_len", "S must be >= 1"));
    }
    if cfg.is_short(s) {
        return Ok(StepPlan {
            kind: StepKind::Short,
            bulk_quantize: false,
            s,
            n_old,
            n: n_old,
            total: s,
        });
    }
    let n = cfg.n_quantized(s);
    if n < n_old {
        return Err(Error::invalid(
            "seq_len",
            format!(
                "S - init_offset = {n} but {n_old} keys are already quantized: the state is ahead of the sequence"
            ),
        ));
    }
    let many = n - n_old > facts.bulk_min;
    // the chunked kernel serves this step where its top-k width holds the step's heavy
    // size (resolved at this S: a ratio's count grows with S)
    let heavy = cfg.heavy_at(s);
    let chunked = facts.chunked.is_some_and(|k_pad| heavy <= k_pad);
    let (kind, bulk_quantize) = match hist_kind(cfg, shape, s, path, facts, chunked) {
        // the kernel's quantizing CTAs write the new keys' codes while its row CTAs read
        // the candidates' codes: in the same launch only where no new key is a candidate
        // (the radix-select path quantizes at most one new key itself)
        Some(k) => (
            k,
            many || cfg.window_start(s) > n_old
                || (matches!(k, StepKind::Range { .. }) && n - n_old > 1),
        ),
        None => (StepKind::Chunked, many),
    };
    if kind == StepKind::Chunked && !chunked {
        let why = if path == SelectPath::Chunked {
            "--select-path chunked was asked for".to_string()
        } else {
            // a kernel cache built before the radix-select path existed
            "the kernel cache has neither the histogram nor the radix-select kernels for \
             this config"
                .to_string()
        };
        let size = if cfg.heavy_size.is_ratio() {
            format!("{heavy} (heavy_size {} at S = {s})", cfg.heavy_size)
        } else {
            heavy.to_string()
        };
        let width = match facts.chunked {
            // a ratio heavy_size resolved at the indexer's capacity fit a smaller width
            Some(k_pad) => format!(
                "the top-k width {k_pad} of the chunked select kernel loaded for this \
                 indexer (chosen for heavy_size at its capacity S; the largest built is 512)"
            ),
            None => "512, the largest top-k width of the chunked select kernel".into(),
        };
        return Err(Error::invalid(
            "heavy_size",
            format!("{size} exceeds {width}, which this step needs: {why}"),
        ));
    }
    Ok(StepPlan {
        kind,
        bulk_quantize,
        s,
        n_old,
        n,
        total: cfg.total(s),
    })
}

/// Whether a step at `s` under `path` takes the indexed path (`pq_index`), i.e. whether
/// [`plan_step`] plans one of the `Index*` kinds for it (the same rule; `n_old` does not
/// enter it). The indexer allocates the indexed path's buffers (buckets `i32 [B*H, 4096,
/// capc]`, their counts, marks and arrival counters) only for such steps. Pure.
///
/// False on the short path, where `facts.hist` or `facts.index` is not built (`K^M >
/// 4096`, `M > 2`, query dtype != weight dtype: the kernel set has no `pq_index` for the
/// config), under paths that do not want it, where `B*H*S >= 2^31`, and under
/// [`SelectPath::Auto`] with more heavy picks than `TP / 2` (any practical workload:
/// heavy 3020 or 12851 against 128) or buckets over [`IndexFacts::bucket_budget`].
pub fn takes_index(
    cfg: &PqConfig,
    shape: &Shape,
    s: usize,
    path: SelectPath,
    facts: &PlanFacts,
) -> bool {
    let chunked = facts.chunked.is_some_and(|k_pad| cfg.heavy_at(s) <= k_pad);
    s > 0
        && !cfg.is_short(s)
        && hist_kind(cfg, shape, s, path, facts, chunked).is_some_and(StepKind::is_index)
}

/// The histogram path's kind for a long-path step, None where it is not built or `path`
/// declines it (any number of new keys: `plan_step` quantizes them first where needed);
/// `chunked`: whether the chunked kernel could serve this step instead.
fn hist_kind(
    cfg: &PqConfig,
    shape: &Shape,
    s: usize,
    path: SelectPath,
    facts: &PlanFacts,
    chunked: bool,
) -> Option<StepKind> {
    let rows = shape.b * shape.h;
    let n = cfg.n_quantized(s);
    let Some(hist) = facts.hist else {
        // more combinations than the combination histogram takes, or M > 4: the radix
        // select, whatever the heavy size (measured against pq_select: NOTES.md, "every
        // config and heavy size has a path": pq_select wins only at heavy <= 128 with 32
        // rows of 32k keys, by 2-9 us of ~50, and loses everywhere else measured)
        let rf = facts.range?;
        return (path != SelectPath::Chunked).then(|| StepKind::Range {
            parts: n.div_ceil(rf.emit_tile),
        });
    };
    // more heavy picks than half of what pq_index gathers (its TP): its cuts rarely
    // isolate them, and every such row falls back to a pass over its codes in one CTA;
    // Auto takes split (or pq_hist) instead. Measured (NOTES.md, "heavy sizes above 512";
    // B=1 H=32 H_kv=8 S=32768 bf16, graph wall): H100 heavy 128 index 23.1 us, split
    // 26.2; heavy 512 index 51.2, split 26.8; heavy 3020 index 58.1, split 30.9, pq_hist
    // 44.4; H200 heavy 256 index 49.3, heavy 257 split 25.9; B=4 S=131072 heavy 12851:
    // split 89.9, pq_hist 104.6, index 145.0
    let many_picks = facts.index.is_some_and(|ix| cfg.heavy_k(s) > ix.tp / 2);
    // buckets past the budget: Auto takes what it would without pq_index (see
    // INDEX_BUCKET_BUDGET_BYTES for the number and why)
    let over_budget = facts
        .index
        .is_some_and(|ix| index_bucket_bytes(rows, code_capacity(n)) > ix.bucket_budget);
    if let Some(ix) = facts.index {
        // pq_wfill indexes the flat weight_list in i32
        if path.wants_index()
            && i32::try_from(rows * s).is_ok()
            && !(path == SelectPath::Auto && (many_picks || over_budget))
        {
            let companion = match path {
                SelectPath::IndexCompanion => true,
                SelectPath::IndexWfill => false,
                _ => {
                    let row_bytes = s * cfg.weight_dtype.size_bytes();
                    2 * rows <= facts.sm_count as usize
                        && (!ix.wfill
                            || (row_bytes <= COMPANION_FILL_MAX_BYTES
                                && cfg.weight_dtype.size_bytes() == 4))
                }
            };
            return Some(match (companion, ix.wfill) {
                (true, _) => StepKind::IndexCompanion,
                (false, true) => StepKind::IndexWfill,
                (false, false) => StepKind::IndexRowFill,
            });
        }
    }
    let (wanted, split) = match path {
        SelectPath::Chunked => (false, false),
        SelectPath::Hist => (true, false),
        SelectPath::Split
        | SelectPath::Index
        | SelectPath::IndexCompanion
        | SelectPath::IndexWfill => (true, true),
        // measured on the H100 (NOTES.md, "the histogram path split in two launches"
        // through "a leaner split emit"): split wins with fewer rows than SMs (reference:
        // 25.3 vs 32.9 us wall for pq_select, 34.7 for pq_hist), pq_hist with 128 rows of
        // 131k keys (large: 82.6 vs 85.0 us split)
        // many heavy picks, or no chunked kernel for this heavy size: the histogram
        // family whatever the shape, split (faster than pq_hist with many picks at 32 and
        // at 128 rows, see above)
        SelectPath::Auto if many_picks || !chunked => (true, true),
        SelectPath::Auto => {
            let split = rows < AUTO_HIST_MIN_ROWS && n >= AUTO_SPLIT_MIN_KEYS;
            (
                split || (rows >= AUTO_HIST_MIN_ROWS && n >= AUTO_HIST_MIN_KEYS),
                split,
            )
        }
    };
    if !wanted {
        return None;
    }
    Some(if split {
        StepKind::Split {
            parts: n.div_ceil(hist.emit_tile),
        }
    } else {
        StepKind::Hist
    })
}

/// What a step ran, and where its outputs are: the indexer's device buffers, valid until
/// the next step (see `GpuIndexer::output_ptrs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepInfo {
    /// `S` of the step.
    pub s: usize,
    /// Entries per row of `sparse_list` (`S` on the short path).
    pub total: usize,
    /// Whether the short-sequence path ran.
    pub short: bool,
    /// Kernel launches the step issued (or graph nodes replayed).
    pub launches: usize,
    /// Whether `pq_quant` quantized the new keys before the select kernel.
    pub bulk_quantize: bool,
    /// Whether a graph was captured (false: replayed, or no graph).
    pub captured: bool,
    /// Whether the histogram select path (`pq_hist`, split or indexed) ran.
    pub hist: bool,
    /// Whether it ran split: `pq_thresh` + `pq_emit`.
    pub split: bool,
    /// Whether it ran the radix-select split path: `pq_rsel`, `pq_emit`.
    pub range: bool,
    /// Whether it ran indexed: `pq_index` (after `pq_wfill`, or alone).
    pub index: bool,
    /// Whether the indexed step was one launch, each row's companion CTA writing its
    /// weights (see [`SelectPath::IndexCompanion`]).
    pub companion: bool,
    /// The plan's step kind (the flags above are derived from it).
    pub kind: StepKind,
}

impl StepPlan {
    /// What the step reports, `captured` false.
    pub fn info(&self) -> StepInfo {
        let k = self.kind;
        StepInfo {
            s: self.s,
            total: self.total,
            short: k == StepKind::Short,
            launches: k.launches() + usize::from(self.bulk_quantize),
            bulk_quantize: self.bulk_quantize,
            captured: false,
            hist: k.is_hist(),
            split: matches!(k, StepKind::Split { .. }),
            range: matches!(k, StepKind::Range { .. }),
            index: k.is_index(),
            companion: k == StepKind::IndexCompanion,
            kind: k,
        }
    }
}
