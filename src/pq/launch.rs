//! From a [`StepPlan`] to kernel launches: each kernel's grid and arguments, in
//! signature order, over the indexer's [`DeviceState`] and the caller's tensors.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::CudaStream;

use crate::abi::{arg_positions, KernelArg};
use crate::driver::Kernel;
use crate::driver::{DevBuf, DeviceBuf};
use crate::error::{Error, Result};
use crate::pq::config::{DType, Metric};
use crate::pq::kernels::{constexpr_usize, Kernels};
use crate::pq::plan::{StepKind, StepPlan};
use crate::pq::state::DeviceState;

/// A device tensor the caller owns: its buffer, element dtype and strides in elements.
///
/// `query` is `[B, H, 1, D]` and `key` is `[B, H_kv, S_alloc, D]`; the innermost
/// dimension must be contiguous (stride 1). The buffer comes from a live allocation
/// ([`DeviceBuf::of`] on the caller's `CudaSlice` / `CudaView`, of any element type: its
/// bytes are read as `dtype`); each step checks that every element it reads lies inside
/// it. The caller keeps the allocation alive until the steps that read it complete on the
/// indexer's stream (a captured graph reads it again at each replay).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DeviceTensorRef {
    buf: DeviceBuf,
    dtype: DType,
    strides: [i64; 3],
}

impl DeviceTensorRef {
    /// A view of `buf` as a tensor of `dtype` with element strides `strides` for
    /// `[batch, head, position]` (the last dimension, `D`, contiguous).
    ///
    /// Errors: [`Error::Invalid`] naming the buffer's length or address when it is not a
    /// whole number of `dtype` elements or not aligned to one, or a negative stride.
    pub fn new(buf: DeviceBuf, dtype: DType, strides: [i64; 3]) -> Result<Self> {
        let size = dtype.size_bytes();
        if !buf.bytes().is_multiple_of(size) || !buf.addr().is_multiple_of(size as u64) {
            return Err(Error::invalid(
                "device tensor",
                format!(
                    "{} bytes at {:#x} are not whole {} elements ({size} bytes, aligned)",
                    buf.bytes(),
                    buf.addr(),
                    dtype.as_str()
                ),
            ));
        }
        if strides.iter().any(|&st| st < 0) {
            return Err(Error::invalid(
                "device tensor",
                format!("negative stride in {strides:?} (elements)"),
            ));
        }
        Ok(DeviceTensorRef {
            buf: buf.as_dtype(dtype.triton()),
            dtype,
            strides,
        })
    }

    /// The device buffer, as a kernel argument of the element dtype.
    pub fn buf(&self) -> DeviceBuf {
        self.buf
    }

    /// The element dtype.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Element strides of `[batch, head, position]`.
    pub fn strides(&self) -> [i64; 3] {
        self.strides
    }

    /// Check that a `[d0, d1, d2, d]` tensor with these strides lies inside the buffer.
    /// Errors: [`Error::Invalid`] naming `what`, the shape, the strides and the lengths.
    pub fn check_extent(&self, what: &str, dims: [usize; 4]) -> Result<()> {
        if dims.contains(&0) {
            return Ok(());
        }
        let last = (0..3).fold(dims[3] as u128, |acc, i| {
            acc + (dims[i] as u128 - 1) * self.strides[i] as u128
        });
        let have = (self.buf.bytes() / self.dtype.size_bytes()) as u128;
        if last > have {
            return Err(Error::invalid(
                what,
                format!(
                    "a {dims:?} tensor with strides {:?} reaches element {last}, but its buffer holds {have}",
                    self.strides
                ),
            ));
        }
        Ok(())
    }
}

/// One kernel launch of a step: kernel, grid and arguments in signature order.
pub(crate) struct Launch {
    pub kernel: Arc<Kernel>,
    pub grid: [u32; 3],
    pub args: Vec<KernelArg>,
}

/// The arguments of each kernel in signature order, from the named lists a step builds
/// (see [`crate::abi::arg_positions`]). The positions are found once per kernel and
/// kept: the lists are built in the same order every step, so later steps take one pass
/// over the signature (each position's name re-checked) instead of a name search per
/// argument (measured on the H100, NOTES.md, "what a replayed step costs beyond its
/// kernels; planning in the launch path": the split path's planning cost 13 us of host
/// time per plain-launch step with the search).
#[derive(Default)]
pub(crate) struct ArgOrder(RefCell<HashMap<usize, (usize, Vec<usize>)>>);

impl ArgOrder {
    /// `named` ordered by `k`'s signature; `subset` as in [`arg_positions`].
    /// Errors: [`Error::Invalid`] naming the kernel and the argument.
    pub fn args(
        &self,
        k: &Kernel,
        named: &[(&str, KernelArg)],
        subset: bool,
    ) -> Result<Vec<KernelArg>> {
        let sig = &k.variant().signature;
        // the kernel's address names it: the indexer holds its kernels for its lifetime,
        // and a reused address with other names fails the check below and is redone
        let id = k as *const Kernel as usize;
        if let Some((len, pos)) = self.0.borrow().get(&id) {
            if *len == named.len()
                && pos.len() == sig.len()
                && pos.iter().zip(sig).all(|(&i, a)| named[i].0 == a.name)
            {
                return Ok(pos.iter().map(|&i| named[i].1).collect());
            }
        }
        let names: Vec<&str> = named.iter().map(|(n, _)| *n).collect();
        let pos = arg_positions(sig, &names, subset)
            .map_err(|msg| Error::invalid(format!("arguments of {}", k.id()), msg))?;
        let args = pos.iter().map(|&i| named[i].1).collect();
        self.0.borrow_mut().insert(id, (named.len(), pos));
        Ok(args)
    }
}

/// `v` as a kernel's i32 argument. Errors: [`Error::Invalid`] naming `what` when it
/// does not fit.
pub(crate) fn i32_arg(what: &str, v: usize) -> Result<KernelArg> {
    i32::try_from(v)
        .map(KernelArg::I32)
        .map_err(|_| Error::invalid(what, format!("{v} does not fit the kernel's i32 argument")))
}

/// What the launches of a step are built from: the kernels, the device state (sized by
/// `DeviceState::ensure_buffers` for the step), the argument orders and the SM count.
pub(crate) struct StepLaunches<'a> {
    pub kernels: &'a Kernels,
    pub state: &'a DeviceState,
    pub order: &'a ArgOrder,
    pub sm_count: u32,
}

/// [`Error::Invalid`] for a plan naming a kernel this indexer did not load.
fn not_built(what: &str) -> Error {
    Error::invalid("step plan", format!("{what} is not built for this config"))
}

impl StepLaunches<'_> {
    /// The launches of `plan`, in order (no allocation, nothing issued). The comments
    /// marked `Bounds:` state why each launch stays inside the indexer's buffers;
    /// [`issue`] relies on them.
    ///
    /// Errors: an argument that does not fit its kernel's type, a kernel the plan needs
    /// that is not loaded, an emit grid beyond `u32`.
    pub fn build(
        &self,
        plan: &StepPlan,
        query: &DeviceTensorRef,
        key: &DeviceTensorRef,
    ) -> Result<Vec<Launch>> {
        let (s, n) = (plan.s, plan.n);
        // pq_quant first where it runs; the select kernels then quantize keys n_old .. n,
        // none after pq_quant
        let (quant, n_old) = if plan.bulk_quantize {
            let chained = plan.kind == StepKind::IndexWfill;
            (Some(self.quant(key, plan.n_old, n, chained)?), n)
        } else {
            (None, plan.n_old)
        };
        if plan.kind.is_index() {
            // the indexed path places pq_quant itself
            return self.index_launches(plan, query, key, s, n_old, quant);
        }
        let mut launches: Vec<Launch> = quant.into_iter().collect();
        launches.extend(self.select_launches(plan, query, key, s, n_old, n)?);
        Ok(launches)
    }

    /// The select launches of `plan` (all but `pq_quant`), whose kernels quantize keys
    /// `n_old .. n` themselves.
    fn select_launches(
        &self,
        plan: &StepPlan,
        query: &DeviceTensorRef,
        key: &DeviceTensorRef,
        s: usize,
        n_old: usize,
        n: usize,
    ) -> Result<Vec<Launch>> {
        let (ks, state, order) = (self.kernels, self.state, self.order);
        let rows = state.rows();
        match plan.kind {
            StepKind::Short => {
                let k = &ks.short;
                let block = constexpr_usize(k, "BLOCK")?;
                let args = order.args(
                    k,
                    &[
                        ("sl_ptr", KernelArg::Buf(state.sparse_list_buf())),
                        ("len_ptr", KernelArg::Buf(state.sparse_len_buf())),
                        ("w_ptr", KernelArg::Buf(state.weight_buf())),
                        ("S", i32_arg("S", s)?),
                    ],
                    false,
                )?;
                // Bounds: ensure_buffers sized sparse_list for rows x s i64, weight for
                // rows x s elements of the weight dtype, sparse_len for rows i64; the grid
                // covers exactly s positions x rows.
                Ok(vec![Launch {
                    kernel: k.clone(),
                    grid: [s.div_ceil(block) as u32, rows as u32, 1],
                    args,
                }])
            }
            StepKind::Chunked => self.chunked(query, key, s, n_old, n),
            StepKind::Range { parts } => self.range(query, key, s, n_old, parts),
            StepKind::IndexWfill | StepKind::IndexRowFill | StepKind::IndexCompanion => {
                self.index_launches(plan, query, key, s, n_old, None)
            }
            StepKind::Hist => {
                let k = ks.hist.as_ref().ok_or_else(|| not_built("pq_hist"))?;
                let named = self.hist_args(query, key, s, n_old, &state.hist, &state.histn)?;
                let args = order.args(k, &named, false)?;
                // Bounds: new() sized hist (rows x HIST_COMBOS), histn (rows) and the lookup
                // table (rows x M x K); ensure_buffers
                // sized sparse_list (rows x total), weight (rows x s), codes (cap >= n keys); the
                // kernel reads codes j < max(histn, w0) <= n_old (histn only ever holds an
                // earlier step's w0, or 0 after reset_hist) and writes codes n_old .. n.
                // Grid: CTA (r, 0) is row r, CTA (r, 1) quantizes for row r's KV group (first
                // head of the group only; the others exit at once).
                Ok(vec![Launch {
                    kernel: k.clone(),
                    grid: [rows as u32, 2, 1],
                    args,
                }])
            }
            StepKind::Split { parts } => {
                let sp = ks.split.as_ref().ok_or_else(|| not_built("pq_thresh"))?;
                let mut named = self.hist_args(query, key, s, n_old, &state.hist, &state.histn)?;
                named.extend([
                    ("bnd_ptr", KernelArg::Buf(state.split_bnd.buf())),
                    ("need_ptr", KernelArg::Buf(state.split_need.buf())),
                    ("flag_ptr", KernelArg::Buf(state.split_flag.buf())),
                    ("ctr_ptr", KernelArg::Buf(state.split_ctr.buf())),
                    ("cls_ptr", KernelArg::Buf(state.split_cls.buf())),
                    ("NP", i32_arg("parts per row", parts)?),
                    ("by_class", KernelArg::I32(1)),
                ]);
                // one list for both kernels: each takes the names its signature lists
                let targs = order.args(&sp.thresh, &named, true)?;
                let eargs = order.args(&sp.emit, &named, true)?;
                // Bounds: as pq_hist above for hist/histn/lut, codes and the outputs; new()
                // sized bnd (rows x 2), need (rows), the ticket counter (1) and the classes (rows x
                // HIST_COMBOS: pq_thresh writes them, pq_emit gathers combinations masked below
                // HIST_COMBOS); hist_lut (rows x M x K) is pq_thresh's output;
                // ensure_buffers sized the part flags for rows x cdiv(n, TILE) = rows x parts.
                // pq_thresh (grid as pq_hist's) zeroes the flags and the counter; pq_emit's grid
                // is exactly rows x parts CTAs, each taking one ticket < rows x parts.
                let rows_parts = u32::try_from(rows * parts).map_err(|_| {
                    Error::invalid("emit grid", format!("{rows} rows x {parts} parts"))
                })?;
                Ok(vec![
                    Launch {
                        kernel: sp.thresh.clone(),
                        grid: [rows as u32, 2, 1],
                        args: targs,
                    },
                    Launch {
                        kernel: sp.emit.clone(),
                        grid: [rows_parts, 1, 1],
                        args: eargs,
                    },
                ])
            }
        }
    }

    /// The radix-select split path's launches: `pq_rsel`, `pq_emit`.
    fn range(
        &self,
        query: &DeviceTensorRef,
        key: &DeviceTensorRef,
        s: usize,
        n_old: usize,
        parts: usize,
    ) -> Result<Vec<Launch>> {
        let (ks, state, order) = (self.kernels, self.state, self.order);
        let rows = state.rows();
        let rk = ks.range.as_ref().ok_or_else(|| not_built("pq_rsel"))?;
        let mut named = self.hist_args(query, key, s, n_old, &state.hist, &state.histn)?;
        named.extend([
            ("bnd_ptr", KernelArg::Buf(state.split_bnd.buf())),
            ("need_ptr", KernelArg::Buf(state.split_need.buf())),
            ("flag_ptr", KernelArg::Buf(state.split_flag.buf())),
            ("ctr_ptr", KernelArg::Buf(state.split_ctr.buf())),
            // pq_emit scores its keys here (by_class = 0: no class table for K^M > 4096), so
            // it never reads cls_ptr: any live u8 buffer serves
            ("cls_ptr", KernelArg::Buf(state.codes.buf())),
            ("by_class", KernelArg::I32(0)),
            ("qd_ptr", KernelArg::Buf(state.rqd.buf())),
            ("qc_ptr", KernelArg::Buf(state.rqc.buf())),
            ("NP", i32_arg("parts per row", parts)?),
        ]);
        // Bounds: new() sized hist_lut (rows x M x K: pq_rsel writes it, pq_rsel and pq_emit
        // read it), bnd (rows x 2), need (rows), the ticket counter (1) and the new key's
        // partial argmins (B*H_kv x M x cdiv(K, BLOCK_C), each); ensure_buffers sized the
        // emit's part flags for rows x cdiv(n, TILE) = rows x parts, the codes (cap >= n
        // keys; pq_rsel reads codes j < w0 <= n_old and writes code n_old < n when the step
        // has its one new key: plan_step runs pq_quant first for more) and the outputs.
        // Grids: pq_rsel (CLUSTER, rows): row r's cluster of CLUSTER CTAs writes row r's
        // table (tiles of BLOCK_C centroids, masked to c < K), its emit flags (NP of them),
        // its bounds, and, for a KV group's first head, the group's partial argmins and new
        // code; pq_emit exactly rows x parts CTAs, each taking one ticket < rows x parts.
        let rows_parts = u32::try_from(rows * parts)
            .map_err(|_| Error::invalid("emit grid", format!("{rows} rows x {parts} parts")))?;
        if rows > 65535 {
            return Err(Error::invalid(
                "radix select grid",
                format!("{rows} rows (B*H) exceed the grid's 65535 rows"),
            ));
        }
        Ok(vec![
            Launch {
                kernel: rk.rsel.clone(),
                grid: [rk.rsel_ctas as u32, rows as u32, 1],
                args: order.args(&rk.rsel, &named, true)?,
            },
            Launch {
                kernel: rk.emit.clone(),
                grid: [rows_parts, 1, 1],
                args: order.args(&rk.emit, &named, true)?,
            },
        ])
    }

    /// The indexed path's launches (`pq_wfill` where the plan writes the weights with it,
    /// `pq_index`), with `quant` (`pq_quant`, where it runs first) placed so that it
    /// overlaps what does not need its codes: after `pq_wfill` as its programmatic
    /// dependent, then `pq_index` as `pq_quant`'s, told by `after_quant` to wait for it
    /// before reading a code (`kernels_triton/pq_quant.py`, "Chained after `pq_wfill`").
    fn index_launches(
        &self,
        plan: &StepPlan,
        query: &DeviceTensorRef,
        key: &DeviceTensorRef,
        s: usize,
        n_old: usize,
        quant: Option<Launch>,
    ) -> Result<Vec<Launch>> {
        let (ks, state, order) = (self.kernels, self.state, self.order);
        let rows = state.rows();
        let ik = ks.index.as_ref().ok_or_else(|| not_built("pq_index"))?;
        let companion = plan.kind == StepKind::IndexCompanion;
        let after_quant = quant.is_some();
        let mut named = self.hist_args(query, key, s, n_old, &state.ihist, &state.ihistn)?;
        named.extend([
            ("bkt_ptr", KernelArg::Buf(state.bkt.buf())),
            ("mark_ptr", KernelArg::Buf(state.mark.buf())),
            ("ready_ptr", KernelArg::Buf(state.ready.buf())),
            ("CAPC", i32_arg("bucket capacity", state.capc)?),
            ("rows", i32_arg("rows", rows)?),
            ("fill", KernelArg::I32(i32::from(companion))),
            ("after_quant", KernelArg::I32(i32::from(after_quant))),
        ]);
        // companion fill without pq_quant: no primary (launched without the PDL
        // attribute); after pq_quant: its programmatic dependent
        let ix = if companion && !after_quant {
            &ik.alone
        } else {
            &ik.index
        };
        let iargs = order.args(ix, &named, true)?;
        // Bounds: pq_wfill writes weight elements 0 .. rows x s (ensure_buffers
        // sized weight for that; rows x s < 2^31 checked by plan_step), any grid
        // size. pq_index as pq_hist for hist/histn (here ihist/ihistn, new(): rows x
        // HIST_COMBOS, rows), lut, codes and the outputs; ensure_buffers sized
        // bkt for rows x HIST_COMBOS x capc (the kernel stores slots < CAPC = capc
        // only) and new() the marks for rows x TP (the kernel's constexpr, kept in
        // IndexKernels) and the arrival counters for rows. Companion fill: CTA (r, 0)
        // writes row r's weights (r x s .. (r + 1) x s), CTA (r, 1) its heavy ones;
        // the second of the two to arrive on ready[r] rewrites the row's ones and
        // clears it. Else pq_index is a programmatic dependent of pq_wfill (its
        // variant's launch_pdl) and waits for it before any weight; pq_wfill: one CTA
        // per SM, so each leaves room for a pq_index CTA beside it (sm_80: no
        // pq_wfill, each row CTA writes its own row). With pq_quant (its own Bounds:
        // in quant()): pq_wfill (a plain launch), pq_quant (pq_wfill's dependent; the
        // two write disjoint buffers; it waits for pq_wfill before it exits), pq_index
        // (pq_quant's dependent, which waits for it before any code or weight, and so
        // for pq_wfill). A kernel built without PDL (sm_80, an override) launches
        // plainly after its predecessor, which orders the same stores.
        let mut launches = Vec::with_capacity(3);
        if plan.kind == StepKind::IndexWfill {
            let fill = ik.wfill.as_ref().ok_or_else(|| not_built("pq_wfill"))?;
            launches.push(Launch {
                kernel: fill.clone(),
                grid: [self.sm_count.max(1), 1, 1],
                args: order.args(fill, &named, true)?,
            });
        }
        launches.extend(quant);
        launches.push(Launch {
            kernel: ix.clone(),
            grid: [rows as u32, 2, 1],
            args: iargs,
        });
        Ok(launches)
    }

    /// `pq_quant` over the new keys `n_old .. n` (`n > n_old`): grid `(P, B*H_kv*M)`,
    /// codes `n_old .. n` of every KV head, each CTA looping over every `P`-th tile of
    /// `BLOCK_N` keys, `P = min(cdiv(n - n_old, BLOCK_N), max(1, floor(SMs x CTAs per SM
    /// / (B*H_kv*M))))`: every CTA resident at once, so no CTA's tiles wait for a second
    /// round; the vector-load kernel where the key layout allows
    /// ([`Kernels::quant_for`]). `chained`: launched as the programmatic dependent of
    /// the launch before it (`pq_wfill`, see [`Self::index_launches`]), else plainly.
    ///
    /// Errors: an argument beyond its kernel's type, a grid row count beyond 65535.
    fn quant(
        &self,
        key: &DeviceTensorRef,
        n_old: usize,
        n: usize,
        chained: bool,
    ) -> Result<Launch> {
        let (ks, state, order) = (self.kernels, self.state, self.order);
        let cfg = &state.cfg;
        let (b, h_kv, d) = (state.shape.b, state.shape.h_kv, state.shape.d);
        let m = cfg.m();
        let q = ks.quant_for(key.buf.addr(), key.strides, cfg.d_sub(d));
        let k = if chained { &q.chained } else { &q.kernel };
        let args = order.args(
            k,
            &[
                ("k_ptr", KernelArg::Buf(key.buf)),
                ("cent_ptr", KernelArg::Buf(state.centroids_buf)),
                ("phi_ptr", KernelArg::Buf(state.phi_buf)),
                ("prep_ptr", KernelArg::Buf(state.cprep_buf())),
                ("cn_ptr", KernelArg::Buf(state.cnorm.buf())),
                ("codes_ptr", KernelArg::Buf(state.codes.buf())),
                ("k_sb", KernelArg::I64(key.strides[0])),
                ("k_sh", KernelArg::I64(key.strides[1])),
                ("k_ss", KernelArg::I64(key.strides[2])),
                ("H_kv", i32_arg("H_kv", h_kv)?),
                ("M", i32_arg("M", m)?),
                ("K", i32_arg("K", cfg.k_centroids())?),
                ("d_s", i32_arg("d_s", cfg.d_sub(d))?),
                ("pos0", i32_arg("pos0", cfg.init_offset + n_old)?),
                ("t0", i32_arg("t0", n_old)?),
                ("n_new", i32_arg("new keys", n - n_old)?),
                ("cap", i32_arg("cap", state.cap)?),
                (
                    "metric_ip",
                    KernelArg::I32(i32::from(cfg.metric == Metric::Ip)),
                ),
            ],
            false,
        )?;
        let rows = b * h_kv * m;
        if rows > 65535 {
            return Err(Error::invalid(
                "pq_quant grid",
                format!("B*H_kv*M = {rows} rows exceed the grid's 65535"),
            ));
        }
        // Bounds: the caller vouched (DeviceTensorRef::check_extent in GpuIndexer::step)
        // for key positions up to s = init_offset + n; the kernel reads positions
        // pos0 + t, t < n_new (masked), i.e. init_offset + n_old .. s; codes hold
        // cap >= n keys per (b, g, m) row (grow_codes), written at t0 + t < n;
        // centroids/phi were uploaded with the validated sizes, each grid row reading
        // its own (b, g, m) block of K x d_c and phi[row] under ip, and of prep / cn
        // (sized rows x 3 x K x d_s and rows x K by DeviceState::new) its own row's.
        let tiles = (n - n_old).div_ceil(q.block);
        let per_row = (self.sm_count.max(1) as usize * q.ctas_per_sm / rows).max(1);
        Ok(Launch {
            kernel: k.clone(),
            grid: [tiles.min(per_row).max(1) as u32, rows as u32, 1],
            args,
        })
    }

    /// The chunked step's launch: `pq_select` over `cdiv(n, CHUNK)` chunks per row,
    /// quantizing keys `n_old .. n` in their chunks.
    fn chunked(
        &self,
        query: &DeviceTensorRef,
        key: &DeviceTensorRef,
        s: usize,
        n_old: usize,
        n: usize,
    ) -> Result<Vec<Launch>> {
        let (ks, state, order) = (self.kernels, self.state, self.order);
        // the plan takes the chunked path only where the kernel is built (PlanFacts::chunked)
        let sk = ks.select.as_ref().ok_or_else(|| {
            Error::invalid(
                "heavy_size",
                "the chunked select kernel is not built for this heavy size",
            )
        })?;
        // and where its top-k width holds this step's heavy size (resolved at s)
        let heavy = state.cfg.heavy_at(s);
        if heavy > sk.k_pad {
            return Err(Error::invalid(
                "heavy_size",
                format!(
                    "{heavy} at S = {s} exceeds the top-k width {} of the loaded chunked \
                     select kernel",
                    sk.k_pad
                ),
            ));
        }
        let k = &sk.kernel;
        let n_chunks = n.div_ceil(sk.chunk);
        let mut named = self.select_args(query, key, s, n_old)?;
        named.extend([
            ("lut_ptr", KernelArg::Buf(state.lut.buf())),
            ("stage_ptr", KernelArg::Buf(state.stage.buf())),
            ("cand_ptr", KernelArg::Buf(state.cand.buf())),
            ("count_ptr", KernelArg::Buf(state.count.buf())),
        ]);
        let args = order.args(k, &named, false)?;
        // Bounds: ensure_buffers sized lut/stage/cand for rows x n_chunks CTAs, codes for
        // cap >= n keys, sparse_list for rows x total, weight for rows x s, sparse_len
        // and count for rows (count starts at 0 and every row's last CTA resets it); the
        // caller vouched for query (all heads) and the new key positions.
        Ok(vec![Launch {
            kernel: k.clone(),
            grid: [n_chunks as u32, state.rows() as u32, 1],
            args,
        }])
    }

    /// The named arguments both select kernels (`pq_select`, `pq_hist`) take: query and
    /// key views, centroids, phi, the code state, the outputs, strides, shape and config
    /// integers, for a step at `s` whose kernel quantizes the keys `n_old .. n`.
    fn select_args(
        &self,
        query: &DeviceTensorRef,
        key: &DeviceTensorRef,
        s: usize,
        n_old: usize,
    ) -> Result<Vec<(&'static str, KernelArg)>> {
        let state = self.state;
        let cfg = &state.cfg;
        Ok(vec![
            ("q_ptr", KernelArg::Buf(query.buf)),
            ("k_ptr", KernelArg::Buf(key.buf)),
            ("cent_ptr", KernelArg::Buf(state.centroids_buf)),
            ("phi_ptr", KernelArg::Buf(state.phi_buf)),
            ("codes_ptr", KernelArg::Buf(state.codes.buf())),
            ("sl_ptr", KernelArg::Buf(state.sparse_list_buf())),
            ("len_ptr", KernelArg::Buf(state.sparse_len_buf())),
            ("w_ptr", KernelArg::Buf(state.weight_buf())),
            ("q_sb", KernelArg::I64(query.strides[0])),
            ("q_sh", KernelArg::I64(query.strides[1])),
            ("k_sb", KernelArg::I64(key.strides[0])),
            ("k_sh", KernelArg::I64(key.strides[1])),
            ("k_ss", KernelArg::I64(key.strides[2])),
            ("H", i32_arg("H", state.shape.h)?),
            ("G", i32_arg("G", state.shape.group())?),
            ("M", i32_arg("M", cfg.m())?),
            ("K", i32_arg("K", cfg.k_centroids())?),
            ("d_s", i32_arg("d_s", cfg.d_sub(state.shape.d))?),
            ("S", i32_arg("S", s)?),
            ("n_old", i32_arg("n_old", n_old)?),
            ("cap", i32_arg("cap", state.cap)?),
            // the sizes resolved at this step's S (a ratio is floor(ratio * S))
            ("sink", i32_arg("sink_size", cfg.sink_at(s))?),
            ("window", i32_arg("window_size", cfg.window_at(s))?),
            ("heavy", i32_arg("heavy_size", cfg.heavy_at(s))?),
            ("init_offset", i32_arg("init_offset", cfg.init_offset)?),
            (
                "metric_ip",
                KernelArg::I32(i32::from(cfg.metric == Metric::Ip)),
            ),
        ])
    }

    /// The named arguments of the histogram kernels: [`StepLaunches::select_args`], the
    /// combination counts `hist` / `histn` (the indexed path keeps its own), the rounds'
    /// bins, the lookup table and `bits`.
    fn hist_args(
        &self,
        query: &DeviceTensorRef,
        key: &DeviceTensorRef,
        s: usize,
        n_old: usize,
        hist: &DevBuf<i32>,
        histn: &DevBuf<i32>,
    ) -> Result<Vec<(&'static str, KernelArg)>> {
        let state = self.state;
        let mut named = self.select_args(query, key, s, n_old)?;
        named.extend([
            ("hist_ptr", KernelArg::Buf(hist.buf())),
            ("histn_ptr", KernelArg::Buf(histn.buf())),
            ("lut_ptr", KernelArg::Buf(state.hist_lut.buf())),
            ("bits", i32_arg("pq_bits", state.cfg.pq_bits as usize)?),
        ]);
        Ok(named)
    }
}

/// Issue one step's launches on `stream`.
pub(crate) fn issue(stream: &Arc<CudaStream>, launches: &[Launch]) -> Result<()> {
    for l in launches {
        // Bounds: `StepLaunches::build` built these arguments for buffers that
        // `ensure_buffers` sized for this step (see its `Bounds:` comments) and for query
        // and key views whose extent `GpuIndexer::step` checked; every launch is on this
        // indexer's stream, in order.
        l.kernel.launch(stream, l.grid, &l.args)?;
    }
    Ok(())
}
