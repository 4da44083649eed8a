//! Ragged steps on the GPU (spec "Ragged batches"): [`GpuIndexer::step_ragged`] and
//! [`GpuIndexer::step_ragged_device`] run one step over `B` sequences at their own
//! lengths `S_b <= S_alloc` (`S_alloc` the indexer's `shape().s`), each row with its own
//! `N_cached[b]`, on one of three paths ([`RaggedPath`], chosen per config by
//! [`ragged_path`]). Every path starts with
//!
//! - `pq_rgq.k_<qt>`, grid `(B*H_kv*M, NCH)`: each long row's new keys' codes, and the
//!   rows checked.
//!
//! **Index** (`kernels_triton/pq_rgindex.py`; where the fixed-`S` indexed path applies,
//! `M <= 2`, `K^M <= 4096`, query dtype = weight dtype, with `heavy_size` at `S_alloc` at
//! most `TP / 2` and the buckets within the indexer's budget), the fixed-`S` indexed path
//! with per-row lengths:
//!
//! - `pq_rgwfill.w_<t>`, grid `(B*H, cdiv(S_alloc, CH))`: each row's sink and window ones
//!   (every position of a short row) and zeros up to its weights' extent;
//! - `pq_rgindex.m2.q_<t>.w_<t>`, grid `(B*H,)`, `pq_rgwfill`'s programmatic dependent:
//!   each long row's buckets and combination histogram (`ihist` / `ihistn` / `bkt`,
//!   shared with the fixed-`S` indexed path; recounted on the device where the row's count
//!   was lowered below what they count) moved to its candidates, its heavy keys gathered
//!   from the buckets near the top (a pass over its codes where they do not fit); short
//!   rows list every position; every row its padding, length and weights' extent.
//!   sm_80 has no programmatic dependent launch: no `pq_rgwfill`, each row CTA writes its
//!   own weights first.
//!
//! **Split** (`kernels_triton/pq_rgsplit.py`; where the combination histogram applies,
//! `K^M <= 4096` and `M <= 4`), the fixed-`S` split path with per-row lengths:
//!
//! - `pq_rgthresh.m<MP>.q_<qt>`, grid `(B*H,)`: each long row's persistent combination
//!   histogram (`hist` / `histn`, shared with the fixed-`S` histogram paths; reset on the
//!   device where the row's count was lowered below what it counts) moved to its
//!   candidates, its lookup table and threshold; every row's stale-weight range (its
//!   128-register build `pq_rgthresh.r128` where the rows need more than one round of the
//!   other, [`crate::pq::kernels`]'s `RaggedSplitKernels::thresh_for`);
//! - `pq_rgsemit.m<MP>.w_<wt>`, grid `(B*H*NP,)`, `NP` = [`ragged_split_parts`]: each
//!   row's parts rank and write their slices (the earlier parts' counts through flag
//!   words), short rows list every position; every CTA zeroes its share of the row's
//!   stale weights and pads its share of `sparse_list`; part 0 the length and the row's
//!   `N_cached`.
//!
//! The weights' extent `wext i64 [B*H]` (how far each weight row may hold non-zeros; the
//! indexed and split paths) lets a step write each weight row up to its `S_b` and zero
//! only what an earlier step left beyond it: a decode loop does not rewrite `S_alloc -
//! S_b` zeros per row each step. It is set to `S_alloc` (unknown) whenever the buffer's contents are not the
//! ragged steps' own (first ragged use, [`GpuIndexer::poison_outputs`]).
//!
//! **Radix** (`kernels_triton/pq_ragged.py`; every config, the path of those the
//! histogram does not take), eight launches:
//!
//! - `pq_rglut.q_<qt>`, grid `(B*H, M, cdiv(K, BLOCK_C))`: each long row's lookup table
//!   (and the rounds' histograms and tickets zeroed);
//! - `pq_rground`, grid `(B*H, P)`, `P = max(1, cdiv(S_alloc - init_offset, TILE))`,
//!   four times: the exact top-k threshold, one 8-bit digit of the rank key a round, the
//!   row's last CTA to arrive closing the round;
//! - `pq_rgcnt`, grid `(B*H, NP)`, `NP = cdiv(S_alloc, TILE)`: each part's taken
//!   candidates counted;
//! - `pq_rgemit.w_<wt>`, the same grid: each part writes its slice of the row's list
//!   (placed after the earlier parts' entries), weights and padding; part 0 the length and
//!   the row's `N_cached`.
//!
//! Every length-dependent quantity is read on the device, from the lengths buffer and the
//! rows' counts (`i64 [B]`, kept by the indexer), so the launches' arguments depend only on
//! `S_alloc` and the shapes: one captured graph serves any lengths. The outputs keep fixed
//! device shapes: `sparse_list i64 [B, H, T]` (`T` = [`ragged_row_len`], the largest
//! total any length up to `S_alloc` has; each row `-1` past its `total_b`), `sparse_len
//! i64 [B, H]`, `weight_list [B, H, S_alloc]` (zeros past `S_b`); [`GpuIndexer::download_ragged`]
//! cuts `sparse_list` to `max_b total_b` as the spec's layout says.

use std::sync::Arc;

use cudarc::driver::{CudaStream, DevicePtr};

use crate::abi::KernelArg;
use crate::driver::{DevBuf, DeviceBuf};
use crate::error::{Error, Result};
use crate::pq::config::{DType, Metric, PqConfig};
use crate::pq::graph::{GraphKey, StepGraph};
use crate::pq::indexer::{check_tensor, GpuIndexer, LaunchMode};
use crate::pq::launch::{i32_arg, issue, DeviceTensorRef, Launch};
use crate::pq::ragged::{
    plan_ragged, ragged_path, ragged_row_len, ragged_split_parts, RaggedInputs, RaggedOutput,
    RaggedPath, RaggedPlan,
};
use crate::pq::variants::KernelChoice;
use crate::pq::Size;
use crate::runtime::Runtime;

/// CTAs per (batch, KV head, subvector) that quantize a row's new keys, by default
/// ([`GpuIndexer::set_ragged_quant_ctas`]): each takes every `NCH`-th new key.
pub const RAGGED_QUANT_CTAS: usize = 4;

/// What a ragged step reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RaggedInfo {
    /// `S_alloc`: the key tensor's length and `weight_list`'s row length.
    pub s_alloc: usize,
    /// `T`: the row length of `sparse_list` on the device ([`ragged_row_len`]).
    pub row_len: usize,
    /// Kernel launches the step issued (or graph nodes replayed).
    pub launches: usize,
    /// The kernels the step ran.
    pub path: RaggedPath,
    /// Whether a graph was captured (false: replayed, updated in place, or no graph).
    pub captured: bool,
}

/// The ragged steps' device buffers and host-side knowledge (part of [`GpuIndexer`]).
pub(crate) struct RaggedState {
    /// `i64 [B]`: the lengths of [`GpuIndexer::step_ragged`], uploaded before its launches.
    lens_in: DevBuf<i64>,
    /// `i64 [B]`: the lengths the last step ran with (copied by `pq_rgq`).
    seen: DevBuf<i64>,
    /// `i64 [B]`: each row's `N_cached` (the device's count is authoritative).
    ncached: DevBuf<i64>,
    /// `i64 [B]`: each row's `N_cached` as the last step began (copied by `pq_rgq`; the
    /// indexed path's reset test reads it, its launch writes `ncached`).
    nc0: DevBuf<i64>,
    /// `i32 [B]`: whether each row's length and count were valid at the last step.
    stat: DevBuf<i32>,
    /// `i32 [2]`: rows refused on the device since the last check, and the first of them
    /// (`i32::MAX` for none).
    err: DevBuf<i32>,
    /// `f32 [B*H, M, K]`: each row's lookup table (scratch).
    lut: DevBuf<f32>,
    /// `i64 [B*H, 8]`: each row's threshold state (scratch, written by round 0).
    rst: DevBuf<i64>,
    /// `i32 [B*H, 256]`: each row's round histogram (zeroed by `pq_rglut`).
    rhist: DevBuf<i32>,
    /// `i32 [B*H]`: each row's round ticket (zeroed by `pq_rglut`).
    rtick: DevBuf<i32>,
    /// `i32 [B*H, 2, NP]`: each emit part's sure and tie counts (scratch).
    pcnt: DevBuf<i32>,
    /// `i64 [B*H]`: how far each weight row may hold non-zeros (split path; `S_alloc`
    /// where unknown).
    wext: DevBuf<i64>,
    /// `i64 [B*H, 2]`: each row's stale weights `[lo, hi)` for the split emit to zero
    /// (scratch, written by `pq_rgthresh`).
    wz: DevBuf<i64>,
    /// The path asked for ([`GpuIndexer::set_ragged_path`]), else the config's.
    forced: Option<RaggedPath>,
    /// The rows' counts where the host knows them (after [`GpuIndexer::step_ragged`] or
    /// [`GpuIndexer::set_row_n_cached`]; not after a device-length step).
    host_nc: Option<Vec<usize>>,
    /// Whether `ncached` holds the rows' counts (from the first ragged step, or
    /// [`GpuIndexer::set_row_n_cached`], until codes are imported again).
    pub active: bool,
    /// `T` (fixed by the config and `S_alloc`).
    row_len: usize,
    /// `NCH` of `pq_rgq`.
    quant_ctas: usize,
    last: Option<RaggedInfo>,
    graph: StepGraph<RaggedInfo>,
}

impl RaggedState {
    /// Nothing allocated yet; `T` for `cfg` at `s_alloc`.
    pub fn new(cfg: &PqConfig, s_alloc: usize) -> Self {
        RaggedState {
            lens_in: DevBuf::new(),
            seen: DevBuf::new(),
            ncached: DevBuf::new(),
            nc0: DevBuf::new(),
            stat: DevBuf::new(),
            err: DevBuf::new(),
            lut: DevBuf::new(),
            rst: DevBuf::new(),
            rhist: DevBuf::new(),
            rtick: DevBuf::new(),
            pcnt: DevBuf::new(),
            wext: DevBuf::new(),
            wz: DevBuf::new(),
            forced: None,
            host_nc: None,
            active: false,
            row_len: ragged_row_len(cfg, s_alloc),
            quant_ctas: RAGGED_QUANT_CTAS,
            last: None,
            graph: StepGraph::default(),
        }
    }

    /// Forget the rows' counts and the captured graph (codes are being replaced: every
    /// row holds the imported count at the next ragged step).
    pub fn forget(&mut self) {
        self.active = false;
        self.host_nc = None;
        self.last = None;
        self.graph.clear();
    }

    /// Device bytes of the ragged buffers.
    pub fn bytes(&self) -> usize {
        8 * (self.lens_in.len()
            + self.seen.len()
            + self.ncached.len()
            + self.nc0.len()
            + self.rst.len()
            + self.wext.len()
            + self.wz.len())
            + 4 * (self.stat.len()
                + self.err.len()
                + self.lut.len()
                + self.rhist.len()
                + self.rtick.len()
                + self.pcnt.len())
    }
}

/// A size as the ragged kernels take it: `(count, ratio)`, ratio `-1.0` for a count.
fn size_args(v: Size) -> (i64, f64) {
    match v {
        Size::Count(n) => (i64::try_from(n).unwrap_or(i64::MAX), -1.0),
        Size::Ratio(r) => (0, r),
    }
}

/// A grid extent: `v` (what `what` names) as a `u32` no larger than `max` (the driver's
/// limit for that dimension: `i32::MAX` for x, 65535 for y and z).
///
/// Errors: [`Error::Invalid`] naming `what` and `v` where it is larger.
fn grid_dim(what: &str, v: usize, max: usize) -> Result<u32> {
    u32::try_from(v)
        .ok()
        .filter(|&x| (x as usize) <= max)
        .ok_or_else(|| Error::invalid("ragged grid", format!("{what} = {v} beyond the grid")))
}

/// The largest grid x extent a launch takes.
const GRID_X: usize = i32::MAX as usize;

fn drv(what: &'static str) -> impl Fn(cudarc::driver::DriverError) -> Error {
    move |e| crate::driver::device::driver_err(what, e)
}

impl GpuIndexer {
    /// An indexer for a ragged batch read from the host: [`GpuIndexer::new`] at
    /// `x.inputs.shape` (`shape.s` = `S_alloc`) with `x.inputs`' codebook, its cached
    /// codes imported ([`GpuIndexer::import_codes`], `N = x.inputs.n_cached` per row) and
    /// each row's `N_cached[b]` set ([`GpuIndexer::set_row_n_cached`]). Synchronous.
    /// Upload the query and keys with [`crate::pq::harness::DeviceInputs::upload_ragged`].
    ///
    /// Errors: as [`GpuIndexer::new`], [`GpuIndexer::import_codes`] and
    /// [`GpuIndexer::set_row_n_cached`].
    pub fn for_ragged(
        rt: Arc<Runtime>,
        stream: Arc<CudaStream>,
        cfg: PqConfig,
        x: &RaggedInputs,
        choice: &KernelChoice,
    ) -> Result<Self> {
        let i = &x.inputs;
        let mut ix = Self::new(
            rt,
            stream,
            cfg,
            i.shape,
            &i.centroids,
            i.phi.as_deref(),
            choice,
        )?;
        ix.import_codes(&i.codes, i.n_cached)?;
        ix.set_row_n_cached(&x.n_cached)?;
        Ok(ix)
    }

    /// `T`: the row length of a ragged step's `sparse_list` on the device, the largest
    /// `total` any length `1..=S_alloc` has ([`ragged_row_len`]).
    pub fn ragged_row_len(&self) -> usize {
        self.ragged.row_len
    }

    /// Quantize each row's new keys with `n` CTAs per (batch, KV head, subvector) in
    /// later ragged steps (default [`RAGGED_QUANT_CTAS`]; at least 1). More help
    /// catch-up steps of many keys; each CTA beyond a row's new keys exits at once.
    pub fn set_ragged_quant_ctas(&mut self, n: usize) {
        self.ragged.quant_ctas = n.clamp(1, 65535);
    }

    /// Run later ragged steps on `path` (`None`: the config's, [`ragged_path`]); for
    /// measurements and tests (the radix path serves every config). Where the path
    /// changes after ragged steps ran, the next step counts every row's combination
    /// histogram anew (stream-ordered zeroing: each histogram path keeps its own counts).
    ///
    /// Errors: [`Error::Invalid`] where the split path is asked for a config the
    /// combination histogram does not take, or the indexed or split path where its
    /// kernels are not built (the path in force stays); driver errors.
    pub fn set_ragged_path(&mut self, path: Option<RaggedPath>) -> Result<()> {
        let before = self.ragged_path().ok();
        let old = std::mem::replace(&mut self.ragged.forced, path);
        match self.ragged_path() {
            Ok(now) => {
                if self.ragged.active && before != Some(now) {
                    // each histogram path keeps its own persistent counts, which the other
                    // path's steps do not maintain (a row rewound and quantized again in
                    // between): the next step counts every row anew
                    self.state.reset_hist()?;
                }
                Ok(())
            }
            Err(e) => {
                self.ragged.forced = old;
                Err(e)
            }
        }
    }

    /// The path later ragged steps take ([`GpuIndexer::set_ragged_path`], else
    /// [`ragged_path`] for this config and kernel set).
    ///
    /// Errors: those of [`ragged_path`].
    pub fn ragged_path(&self) -> Result<RaggedPath> {
        let built = self
            .kernels
            .ragged
            .as_ref()
            .is_some_and(|rk| rk.split.is_some());
        ragged_path(
            &self.state.cfg,
            built,
            self.ragged_index_fits(),
            self.ragged.forced,
        )
    }

    /// Whether the ragged indexed path's kernels are built for this config (`Ok`), and
    /// whether `Auto` would take it (`Ok(true)`): `heavy_size` at `S_alloc` at most `TP /
    /// 2` and the buckets (`B*H x 4096 x capc` i32 at the code capacity of `S_alloc`'s
    /// keys) within the indexer's bucket budget, as the fixed-`S` rule
    /// ([`crate::pq::plan::SelectPath::Auto`]).
    ///
    /// Errors: [`Error::Invalid`] naming what the path needs where it is not built.
    fn ragged_index_fits(&self) -> Result<bool> {
        let (cfg, sh) = (&self.state.cfg, &self.state.shape);
        let ik = self
            .kernels
            .ragged
            .as_ref()
            .and_then(|rk| rk.index.as_ref())
            .ok_or_else(|| {
                Error::invalid(
                    "ragged path",
                    format!(
                        "the indexed ragged path needs M <= 2, K^M <= {}, query dtype = \
                         weight dtype (this config: M = {}, K = {}, {:?} / {:?}) and \
                         pq_rgindex / pq_rgwfill in the ptx_cache \
                         (kernels_triton/pq_rgindex.py)",
                        crate::pq::kernels::HIST_COMBOS,
                        cfg.m(),
                        cfg.k_centroids(),
                        cfg.input_dtype,
                        cfg.weight_dtype
                    ),
                )
            })?;
        let cap = self
            .state
            .cap
            .max(crate::pq::plan::code_capacity(cfg.n_quantized(sh.s)));
        let budget = self
            .facts
            .index
            .map_or(crate::pq::plan::INDEX_BUCKET_BUDGET_BYTES, |ix| {
                ix.bucket_budget
            });
        Ok(cfg.heavy_at(sh.s) <= ik.tp / 2
            && crate::pq::plan::index_bucket_bytes(sh.b * sh.h, cap) <= budget)
    }

    /// Mark every weight row's contents unknown to the ragged split path (its next step
    /// rewrites each row up to `S_alloc`): after something other than a ragged step wrote
    /// the weights. Stream-ordered; nothing when no ragged step ran.
    pub(crate) fn ragged_weights_unknown(&mut self) -> Result<()> {
        let sa = self.state.shape.s as i64;
        let st = self.state.stream.clone();
        if let Some(dst) = self.ragged.wext.slice_mut() {
            let v = vec![sa; dst.len()];
            st.memcpy_htod(&v, dst)
                .map_err(drv("resetting the ragged weights' extents"))?;
        }
        Ok(())
    }

    /// Set each row's `N_cached` for ragged steps: row `b` holds the first `n_cached[b]`
    /// of the codes the indexer holds ([`GpuIndexer::n_cached`], imported with
    /// [`GpuIndexer::import_codes`]; the rest of its codes are ignored and rewritten as
    /// its keys are quantized). Without this call, the first ragged step starts every row
    /// at [`GpuIndexer::n_cached`]. Synchronous (a small upload).
    ///
    /// Errors: [`Error::Invalid`] naming the row and the values: not one count per batch
    /// row, a count above the codes held; driver errors.
    pub fn set_row_n_cached(&mut self, n_cached: &[usize]) -> Result<()> {
        let (b, held) = (self.state.shape.b, self.state.n_cached);
        if n_cached.len() != b {
            return Err(Error::invalid(
                "n_cached",
                format!(
                    "{} counts, expected one per batch row (B = {b})",
                    n_cached.len()
                ),
            ));
        }
        if let Some((row, &n)) = n_cached.iter().enumerate().find(|(_, &n)| n > held) {
            return Err(Error::invalid(
                "n_cached",
                format!("row {row}: n_cached = {n}, but the indexer holds {held} codes per row"),
            ));
        }
        self.ensure_ragged()?;
        self.upload_counts(n_cached)?;
        self.synchronize()
    }

    /// Each row's `N_cached` (the host's copy where it has one, else read from the
    /// device: synchronous). Before any ragged step, every row holds
    /// [`GpuIndexer::n_cached`].
    ///
    /// Errors: driver errors.
    pub fn row_n_cached(&self) -> Result<Vec<usize>> {
        if !self.ragged.active {
            return Ok(vec![self.state.n_cached; self.state.shape.b]);
        }
        if let Some(v) = &self.ragged.host_nc {
            return Ok(v.clone());
        }
        self.synchronize()?;
        let v = self.read_i64(&self.ragged.ncached, "downloading the rows' n_cached")?;
        Ok(v.into_iter().map(|x| x.max(0) as usize).collect())
    }

    /// The plan of a ragged step at `seq_lens` from the rows' current counts (nothing is
    /// issued; may read the counts back: see [`GpuIndexer::row_n_cached`]).
    ///
    /// Errors: those of [`plan_ragged`] (a length of 0 or above `S_alloc`, a row whose
    /// state is ahead of its sequence, not one length per batch row), driver errors.
    pub fn plan_ragged(&self, seq_lens: &[usize]) -> Result<RaggedPlan> {
        if seq_lens.len() != self.state.shape.b {
            return Err(Error::invalid(
                "seq_lens",
                format!(
                    "{} lengths, expected one per batch row (B = {})",
                    seq_lens.len(),
                    self.state.shape.b
                ),
            ));
        }
        let nc = self.row_n_cached()?;
        plan_ragged(&self.state.cfg, self.state.shape.s, seq_lens, &nc)
    }

    /// One ragged step (spec "Ragged batches"): row `b` at length `seq_lens[b]` (`1 ..=
    /// S_alloc`, `S_alloc = shape().s`) with its own `N_cached[b]`. `query` is `[B, H, 1,
    /// D]`, `key` `[B, H_kv, S_alloc, D]` (row `b` reads positions `init_offset +
    /// N_cached[b] .. S_b`). Outputs in the indexer's buffers: see the module docs and
    /// [`GpuIndexer::download_ragged`]. The lengths are checked here, then uploaded into the
    /// indexer's lengths buffer (a copy from pageable host memory, which waits for the
    /// stream's earlier work; a decode loop that must not wait uses
    /// [`GpuIndexer::step_ragged_device`]). In graph mode the captured graph does not depend
    /// on the lengths: a later step with other lengths replays it.
    ///
    /// Errors: [`Error::Invalid`] naming the row and the values (a length of 0 or above
    /// `S_alloc`, a row with more cached codes than keys at its length, not one length per
    /// batch row), dtype or extent of `query` / `key`, ragged kernels not built, driver
    /// errors. Nothing is issued when the lengths are refused.
    pub fn step_ragged(
        &mut self,
        query: &DeviceTensorRef,
        key: &DeviceTensorRef,
        seq_lens: &[usize],
        mode: LaunchMode,
    ) -> Result<RaggedInfo> {
        let plan = self.plan_ragged(seq_lens)?;
        self.ensure_ragged()?;
        let lens: Vec<i64> = seq_lens.iter().map(|&s| s as i64).collect();
        let st = self.state.stream.clone();
        let dst = self
            .ragged
            .lens_in
            .slice_mut()
            .ok_or_else(|| Error::invalid("seq_lens", "the lengths buffer is not allocated"))?;
        st.memcpy_htod(&lens, dst)
            .map_err(drv("uploading seq_lens"))?;
        let buf = self.ragged.lens_in.buf();
        let info = self.ragged_launch(query, key, buf, mode)?;
        self.ragged.host_nc = Some(plan.rows.iter().map(|r| r.n).collect());
        Ok(info)
    }

    /// [`GpuIndexer::step_ragged`] with the lengths read on the device from `seq_lens`
    /// (`i64 [B]`, the caller's buffer on this indexer's device, written in stream order
    /// before the step: an engine updates it between replays of one captured graph).
    /// Nothing is copied or synchronized. Rows whose length or count is invalid (`S_b`
    /// outside `1..=S_alloc`, more cached codes than keys) are refused on the device: their
    /// outputs list nothing (`sparse_len = -1`, `sparse_list` all `-1`, zero weights),
    /// their count stays, and [`GpuIndexer::check_ragged_errors`] (or
    /// [`GpuIndexer::download_ragged`]) reports them by row and values.
    ///
    /// Errors: `seq_lens` shorter than `B` values or of another device, and those of
    /// [`GpuIndexer::step_ragged`] but the lengths' checks.
    pub fn step_ragged_device<L: DevicePtr<i64>>(
        &mut self,
        query: &DeviceTensorRef,
        key: &DeviceTensorRef,
        seq_lens: &L,
        mode: LaunchMode,
    ) -> Result<RaggedInfo> {
        let b = self.state.shape.b;
        if seq_lens.len() < b {
            return Err(Error::invalid(
                "seq_lens",
                format!("{} i64 values, expected B = {b}", seq_lens.len()),
            ));
        }
        let buf = DeviceBuf::of(seq_lens, &self.state.stream);
        let dev = self.rt.device();
        dev.check_addr(
            buf.addr(),
            "the step's seq_lens buffer",
            &format!("the indexer (device {})", dev.ordinal()),
        )?;
        self.ensure_ragged()?;
        let info = self.ragged_launch(query, key, buf, mode)?;
        self.ragged.host_nc = None;
        Ok(info)
    }

    /// Report rows a ragged step refused on the device since the last check (their
    /// outputs list nothing), and clear the record. Synchronous.
    ///
    /// Errors: [`Error::Invalid`] naming how many rows, the first row and its values
    /// (`S_b`, `n_cached`, `S_alloc`, `init_offset`); driver errors.
    pub fn check_ragged_errors(&mut self) -> Result<()> {
        if self.ragged.err.is_empty() {
            return Ok(());
        }
        self.synchronize()?;
        let err = self.read_i32(&self.ragged.err, "reading the ragged step's refusals")?;
        if err[0] == 0 {
            return Ok(());
        }
        let b = err[1].max(0) as usize;
        let seen = self.read_i64(&self.ragged.seen, "reading seq_lens")?;
        let nc = self.read_i64(&self.ragged.ncached, "reading n_cached")?;
        self.reset_err()?;
        let (s, n) = (
            seen.get(b).copied().unwrap_or(-1),
            nc.get(b).copied().unwrap_or(-1),
        );
        let io = self.state.cfg.init_offset;
        Err(Error::invalid(
            "seq_lens",
            format!(
                "{} row(s) refused on the device; first: row {b}: S_b = {s}, n_cached = {n}; \
                 expected 1 <= S_b <= S_alloc = {} and n_cached <= S_b - init_offset \
                 (init_offset = {io})",
                err[0], self.state.shape.s
            ),
        ))
    }

    /// The last ragged step's outputs and each row's codes, on the host (synchronous):
    /// `sparse_list` cut to `max_b total_b` per row (`-1` past each row's `total_b`),
    /// `sparse_len`, `weight_list [B, H, S_alloc]` as 0/1 f32, codes `[B, max_b n_b,
    /// H_kv, M]` (zero past each row's count) and the rows' counts.
    ///
    /// Errors: no ragged step has run; rows the step refused
    /// ([`GpuIndexer::check_ragged_errors`]); driver errors.
    pub fn download_ragged(&mut self) -> Result<RaggedOutput> {
        let info = self
            .ragged
            .last
            .ok_or_else(|| Error::invalid("download_ragged", "no ragged step has run"))?;
        self.check_ragged_errors()?;
        let (cfg, sh) = (self.state.cfg, self.state.shape);
        let rows = sh.b * sh.h;
        let (t, sa) = (info.row_len, info.s_alloc);
        let seq_lens: Vec<usize> = self
            .read_i64(&self.ragged.seen, "reading seq_lens")?
            .into_iter()
            .take(sh.b)
            .map(|s| s.max(0) as usize)
            .collect();
        let n_cached: Vec<usize> = self
            .read_i64(&self.ragged.ncached, "reading n_cached")?
            .into_iter()
            .take(sh.b)
            .map(|s| s.max(0) as usize)
            .collect();
        let (sl_dev, sparse_len, wraw) = self.state.download_outputs(t, sa)?;
        let total = seq_lens
            .iter()
            .map(|&s| cfg.total(s))
            .max()
            .unwrap_or(0)
            .min(t);
        let mut sparse_list = Vec::with_capacity(rows * total);
        for r in 0..rows {
            sparse_list.extend_from_slice(&sl_dev[r * t..r * t + total]);
        }
        let weight_list = weights_f32(cfg.weight_dtype, &wraw);
        let (h_kv, m) = (sh.h_kv, cfg.m());
        let n_max = n_cached.iter().copied().max().unwrap_or(0);
        let mut codes = vec![0i64; sh.b * n_max * h_kv * m];
        if n_max > 0 {
            let mut tmp: DevBuf<i64> = DevBuf::new();
            tmp.ensure(&self.state.stream, codes.len())?;
            self.state.launch_codes_copy(
                &self.kernels,
                &self.arg_order,
                true,
                self.state.codes.buf(),
                tmp.buf(),
                n_max,
                self.state.cap,
            )?;
            let all = self.read_i64(&tmp, "downloading codes")?;
            let row = n_max * h_kv * m;
            for (b, &n) in n_cached.iter().enumerate() {
                let keep = n.min(n_max) * h_kv * m;
                codes[b * row..b * row + keep].copy_from_slice(&all[b * row..b * row + keep]);
            }
        }
        self.ragged.host_nc = Some(n_cached.clone());
        Ok(RaggedOutput {
            b: sh.b,
            h: sh.h,
            h_kv,
            m,
            s_alloc: sa,
            seq_lens,
            total,
            sparse_list,
            sparse_len,
            weight_list,
            n_max,
            codes,
            n_cached,
        })
    }

    /// Allocate the ragged buffers and the outputs at `S_alloc` (first ragged use: the
    /// rows start at the codes held), so that steps allocate nothing after.
    fn ensure_ragged(&mut self) -> Result<()> {
        if self.kernels.ragged.is_none() {
            return Err(Error::invalid(
                "ragged step",
                "pq_rgq / pq_rglut / pq_rground / pq_rgcnt / pq_rgemit are not in this \
                 ptx_cache (kernels_triton/pq_ragged.py; rebuild with kernels_triton/build.py)",
            ));
        }
        if self.state.outputs.is_some() {
            return Err(Error::invalid(
                "ragged step",
                "caller output buffers are not supported by ragged steps",
            ));
        }
        let (cfg, sh) = (self.state.cfg, self.state.shape);
        let st = self.state.stream.clone();
        let rows = sh.b * sh.h;
        let np = self
            .kernels
            .ragged
            .as_ref()
            .map_or(1, |rk| sh.s.div_ceil(rk.emit_tile));
        let r = &mut self.ragged;
        r.lens_in.ensure(&st, sh.b)?;
        r.seen.ensure(&st, sh.b)?;
        r.nc0.ensure(&st, sh.b)?;
        r.stat.ensure(&st, sh.b)?;
        r.lut.ensure(&st, rows * cfg.m() * cfg.k_centroids())?;
        r.rst.ensure(&st, rows * 8)?;
        r.rhist.ensure(&st, rows * 256)?;
        r.rtick.ensure(&st, rows)?;
        r.pcnt.ensure(&st, rows * 2 * np)?;
        let split_tile = self
            .kernels
            .ragged
            .as_ref()
            .and_then(|rk| rk.split.as_ref())
            .map(|sp| sp.tile);
        let new_wext = r.wext.is_empty();
        r.wext.ensure(&st, rows)?;
        if let Some(tile) = split_tile {
            r.wz.ensure(&st, rows * 2)?;
            let parts = ragged_split_parts(sh.s, cfg.init_offset, tile);
            self.state.split_flag.ensure(&st, rows * parts)?;
        }
        self.state.sparse_list.ensure(&st, rows * r.row_len)?;
        self.state
            .weight
            .ensure(&st, rows * sh.s * cfg.weight_dtype.size_bytes())?;
        if r.err.is_empty() {
            r.err.ensure(&st, 2)?;
            self.reset_err()?;
        }
        if new_wext || !self.ragged.active {
            // the weights hold what a fixed-S step (or nothing) left
            self.ragged_weights_unknown()?;
        }
        if !self.ragged.active {
            // rows hold what the state holds; codes grow to S_alloc's keys once, before
            // any row holds more than the state's count (growth keeps only those)
            let n_alloc = cfg.n_quantized(sh.s);
            self.state
                .grow_codes(&self.kernels, &self.arg_order, n_alloc)?;
            self.ragged.ncached.ensure(&st, sh.b)?;
            let held = vec![self.state.n_cached; sh.b];
            self.upload_counts(&held)?;
        }
        if self.ragged_path()? == RaggedPath::Index {
            // the buckets, their counts and marks at S_alloc (codes grown above)
            self.state
                .ensure_buffers(&self.kernels, &self.arg_order, true, sh.s)?;
        }
        Ok(())
    }

    /// Upload the rows' counts (stream order) and remember them.
    fn upload_counts(&mut self, n_cached: &[usize]) -> Result<()> {
        let st = self.state.stream.clone();
        let v: Vec<i64> = n_cached.iter().map(|&n| n as i64).collect();
        self.ragged.ncached.ensure(&st, v.len())?;
        let dst = self
            .ragged
            .ncached
            .slice_mut()
            .ok_or_else(|| Error::invalid("n_cached", "the counts buffer is not allocated"))?;
        st.memcpy_htod(&v, dst)
            .map_err(drv("uploading the rows' n_cached"))?;
        self.ragged.host_nc = Some(n_cached.to_vec());
        self.ragged.active = true;
        Ok(())
    }

    /// `err = [0, i32::MAX]` (no row refused).
    fn reset_err(&mut self) -> Result<()> {
        let st = self.state.stream.clone();
        if let Some(dst) = self.ragged.err.slice_mut() {
            st.memcpy_htod(&[0i32, i32::MAX], dst)
                .map_err(drv("clearing the ragged refusals"))?;
        }
        Ok(())
    }

    fn read_i64(&self, b: &DevBuf<i64>, what: &'static str) -> Result<Vec<i64>> {
        match b.slice() {
            Some(s) => self.state.stream.clone_dtoh(s).map_err(drv(what)),
            None => Ok(Vec::new()),
        }
    }

    fn read_i32(&self, b: &DevBuf<i32>, what: &'static str) -> Result<Vec<i32>> {
        match b.slice() {
            Some(s) => self.state.stream.clone_dtoh(s).map_err(drv(what)),
            None => Ok(vec![0, 0]),
        }
    }

    /// Check the tensors, build the eight launches over the lengths in `lens` and issue
    /// them (or replay / update / capture the ragged graph).
    fn ragged_launch(
        &mut self,
        query: &DeviceTensorRef,
        key: &DeviceTensorRef,
        lens: DeviceBuf,
        mode: LaunchMode,
    ) -> Result<RaggedInfo> {
        let (cfg, sh) = (self.state.cfg, self.state.shape);
        check_tensor(&cfg, "query", query)?;
        check_tensor(&cfg, "key", key)?;
        query.check_extent("query", [sh.b, sh.h, 1, sh.d])?;
        key.check_extent("key", [sh.b, sh.h_kv, sh.s, sh.d])?;
        self.check_placement(query, key)?;
        let path = self.ragged_path()?;
        let launches = match path {
            RaggedPath::Split => self.ragged_split_launches(query, key, lens)?,
            RaggedPath::Radix => self.ragged_launches(query, key, lens)?,
            RaggedPath::Index => self.ragged_index_launches(query, key, lens)?,
        };
        let info = RaggedInfo {
            s_alloc: sh.s,
            row_len: self.ragged.row_len,
            launches: launches.len(),
            path,
            captured: false,
        };
        let info = match mode {
            LaunchMode::Launch => {
                issue(&self.state.stream, &launches)?;
                info
            }
            LaunchMode::Graph => {
                let mut buffers = self.state.buffer_ptrs();
                let r = &self.ragged;
                buffers.extend([
                    lens.addr(),
                    r.seen.ptr(),
                    r.ncached.ptr(),
                    r.nc0.ptr(),
                    r.stat.ptr(),
                    r.err.ptr(),
                    r.lut.ptr(),
                    r.rst.ptr(),
                    r.rhist.ptr(),
                    r.rtick.ptr(),
                    r.pcnt.ptr(),
                    r.wext.ptr(),
                    r.wz.ptr(),
                ]);
                let gkey = GraphKey {
                    s: sh.s,
                    sizes: [r.row_len, r.quant_ctas, path as usize],
                    query: *query,
                    key: *key,
                    buffers,
                };
                let stream = self.state.stream.clone();
                let (info, captured) = self
                    .ragged
                    .graph
                    .step(&stream, gkey, 0, || Ok((info, launches)))?;
                RaggedInfo { captured, ..info }
            }
        };
        self.ragged.last = Some(info);
        Ok(info)
    }

    /// `pq_rgq`, `pq_rglut`, four `pq_rground`, `pq_rgcnt` and `pq_rgemit` over the
    /// lengths in `lens` (`i64 [B]`).
    fn ragged_launches(
        &self,
        query: &DeviceTensorRef,
        key: &DeviceTensorRef,
        lens: DeviceBuf,
    ) -> Result<Vec<Launch>> {
        let rk = self.ragged_kernels()?;
        let (cfg, sh) = (&self.state.cfg, &self.state.shape);
        let (m, k) = (cfg.m(), cfg.k_centroids());
        let named = self.ragged_args(query, key, lens)?;
        let rows = sh.b * sh.h;
        // parts of a row: round CTAs over the candidates j < w0 <= S_alloc - init_offset,
        // emit CTAs over the positions p < S_alloc (a CTA past its row's parts exits)
        let parts =
            sh.s.saturating_sub(cfg.init_offset)
                .div_ceil(rk.round_tile)
                .max(1);
        let np = sh.s.div_ceil(rk.emit_tile).max(1);
        let lut_blocks = k.div_ceil(rk.lut_block);
        let rows = grid_dim("B*H", rows, GRID_X)?;
        let (parts, np) = (
            grid_dim("round parts", parts, 65535)?,
            grid_dim("emit parts", np, 65535)?,
        );
        let (m32, lut_blocks) = (
            grid_dim("M", m, 65535)?,
            grid_dim("K blocks", lut_blocks, 65535)?,
        );
        let mut named = named.to_vec();
        named.push(("NP", KernelArg::I32(np as i32)));
        // Bounds: ensure_ragged sized lens_in/seen/ncached (i64) and stat (i32) for B
        // rows, err for 2, the lookup table for B*H x M x K, rst for B*H x 8, rhist for B*H
        // x 256, rtick for B*H, pcnt for B*H x 2 x NP (NP = cdiv(S_alloc, emit TILE), the
        // emit grid's second extent), sparse_list for B*H x T (the kernel masks every list
        // store to ranks < T), weight for B*H x S_alloc elements (stores masked to p <
        // S_alloc), and grew the codes to cap >= S_alloc - init_offset keys (a row writes
        // codes n_cached[b] <= t < S_b - init_offset and reads j < w0 <= that, only when 1
        // <= S_b <= S_alloc: rows outside are refused before any address is formed from
        // S_b); the caller vouched (check_extent in ragged_launch) for query [B, H, 1, D]
        // and key [B, H_kv, S_alloc, D], the caller's lengths buffer holds >= B i64
        // (step_ragged_device). Ordering: pq_rgq writes the codes and stat before the
        // selection's launches read them; pq_rglut zeroes each row's histogram and ticket;
        // in a round, the row's CTAs add to its histogram and take a ticket, and only the
        // last to arrive reads the histogram, writes the row's state and zeroes both; the
        // next launch reads the state. pq_rgcnt writes pcnt[r, :, c] for the parts c with
        // c*TILE < S_b, which pq_rgemit's parts after c read (a later launch). pq_rgemit's
        // part 0 of the first head of each long row writes ncached[b], which no CTA of the
        // selection reads (pq_rgq read it, in the first launch).
        let order = &self.arg_order;
        let mut launches = vec![
            self.rgq_launch(&named)?,
            Launch {
                kernel: rk.rglut.clone(),
                grid: [rows, m32, lut_blocks],
                args: order.args(&rk.rglut, &named, true)?,
            },
        ];
        named.push(("ROUND", KernelArg::I32(0)));
        let round_at = named.len() - 1;
        for round in 0..4 {
            named[round_at].1 = KernelArg::I32(round);
            launches.push(Launch {
                kernel: rk.rground.clone(),
                grid: [rows, parts, 1],
                args: order.args(&rk.rground, &named, true)?,
            });
        }
        launches.push(Launch {
            kernel: rk.rgcnt.clone(),
            grid: [rows, np, 1],
            args: order.args(&rk.rgcnt, &named, true)?,
        });
        launches.push(Launch {
            kernel: rk.rgemit.clone(),
            grid: [rows, np, 1],
            args: order.args(&rk.rgemit, &named, true)?,
        });
        Ok(launches)
    }

    /// The ragged kernels. Errors: [`Error::Invalid`] when they are not built.
    fn ragged_kernels(&self) -> Result<&crate::pq::kernels::RaggedKernels> {
        self.kernels
            .ragged
            .as_ref()
            .ok_or_else(|| Error::invalid("ragged step", "the ragged kernels are not built"))
    }

    /// `pq_rgq`'s launch (both paths' first): grid `(B*H_kv*M, NCH)`.
    fn rgq_launch(&self, named: &[(&str, KernelArg)]) -> Result<Launch> {
        let rk = self.ragged_kernels()?;
        let qrows = self.state.shape.b * self.state.shape.h_kv * self.state.cfg.m();
        let qrows = grid_dim("B*H_kv*M", qrows, GRID_X)?;
        Ok(Launch {
            kernel: rk.rgq.clone(),
            grid: [qrows, self.ragged.quant_ctas as u32, 1],
            args: self.arg_order.args(&rk.rgq, named, true)?,
        })
    }

    /// The split path's launches over the lengths in `lens`: `pq_rgq`, `pq_rgthresh`,
    /// `pq_rgsemit`.
    fn ragged_split_launches(
        &self,
        query: &DeviceTensorRef,
        key: &DeviceTensorRef,
        lens: DeviceBuf,
    ) -> Result<Vec<Launch>> {
        let sp = self.ragged_kernels()?.split.as_ref().ok_or_else(|| {
            Error::invalid("ragged step", "pq_rgthresh / pq_rgsemit are not built")
        })?;
        let (st, r) = (&self.state, &self.ragged);
        let (cfg, sh) = (&st.cfg, &st.shape);
        let rows = sh.b * sh.h;
        let parts = ragged_split_parts(sh.s, cfg.init_offset, sp.tile);
        let mut named = self.ragged_args(query, key, lens)?;
        named.extend([
            ("hist_ptr", KernelArg::Buf(st.hist.buf())),
            ("histn_ptr", KernelArg::Buf(st.histn.buf())),
            ("bnd_ptr", KernelArg::Buf(st.split_bnd.buf())),
            ("need_ptr", KernelArg::Buf(st.split_need.buf())),
            ("flag_ptr", KernelArg::Buf(st.split_flag.buf())),
            ("ctr_ptr", KernelArg::Buf(st.split_ctr.buf())),
            ("cls_ptr", KernelArg::Buf(st.split_cls.buf())),
            ("wz_ptr", KernelArg::Buf(r.wz.buf())),
            ("bits", i32_arg("pq_bits", cfg.pq_bits as usize)?),
            ("NP", i32_arg("emit parts per row", parts)?),
        ]);
        let rows32 = grid_dim("B*H", rows, GRID_X)?;
        let ctas = grid_dim(
            &format!("{rows} rows x {parts} emit parts"),
            rows.saturating_mul(parts),
            GRID_X,
        )?;
        // Bounds: ensure_ragged sized lens_in/seen/ncached (i64) and stat (i32) for B rows,
        // err for 2, the lookup table for B*H x M x K, wext for B*H, wz for B*H x 2,
        // split_flag for B*H x NP (NP = ragged_split_parts(S_alloc, init_offset, TILE), the
        // emit grid's per-row extent and the flag row stride), sparse_list for B*H x T
        // (every list store lands below T: a row's entries below total_b <= T, padding
        // masked to ranks < T), weight for B*H x S_alloc elements (stores masked to
        // positions < S_alloc: part stores below S_b, stale zeros below wext <= S_alloc,
        // wext being S_alloc or an earlier S_b), and grew the codes to cap >= S_alloc -
        // init_offset keys (codes read at j < cap, masked). DeviceState::new sized hist
        // (B*H x HIST_COMBOS), histn (B*H), bnd (B*H x 2), need (B*H), the classes (B*H x HIST_COMBOS: pq_rgthresh writes a long
        // row's, pq_rgsemit gathers that row's combinations, masked below HIST_COMBOS) and
        // the ticket counter (1) where the histogram kernels are
        // built (the split path needs hist_built_for, as they do). The caller vouched
        // (check_extent) for query [B, H, 1, D] and key [B, H_kv, S_alloc, D] and the
        // lengths buffer holds >= B i64. Ordering: pq_rgq writes codes n_cached[b] .. n
        // and stat before pq_rgthresh reads them; pq_rgthresh reads n_cached (before this
        // step's count: the emit writes it), moves each long row's histogram, writes the
        // table, bounds, need, wz, wext and zeroes the flags and the ticket counter, all
        // read by pq_rgsemit (the next launch), whose CTAs take tickets < B*H x NP, wait
        // only on earlier parts of their own row (lower tickets, running or done), and
        // write disjoint ranges.
        let thresh = sp.thresh_for(rows, self.facts.sm_count);
        Ok(vec![
            self.rgq_launch(&named)?,
            Launch {
                kernel: thresh.clone(),
                grid: [rows32, 1, 1],
                args: self.arg_order.args(thresh, &named, true)?,
            },
            Launch {
                kernel: sp.emit.clone(),
                grid: [ctas, 1, 1],
                args: self.arg_order.args(&sp.emit, &named, true)?,
            },
        ])
    }

    /// The indexed path's launches over the lengths in `lens`: `pq_rgq`, `pq_rgwfill`
    /// (where built: sm_90), `pq_rgindex`.
    fn ragged_index_launches(
        &self,
        query: &DeviceTensorRef,
        key: &DeviceTensorRef,
        lens: DeviceBuf,
    ) -> Result<Vec<Launch>> {
        let ik = self.ragged_kernels()?.index.as_ref().ok_or_else(|| {
            Error::invalid("ragged step", "pq_rgindex / pq_rgwfill are not built")
        })?;
        let st = &self.state;
        let (cfg, sh) = (&st.cfg, &st.shape);
        let rows = sh.b * sh.h;
        let mut named = self.ragged_args(query, key, lens)?;
        named.extend([
            ("hist_ptr", KernelArg::Buf(st.ihist.buf())),
            ("histn_ptr", KernelArg::Buf(st.ihistn.buf())),
            ("bkt_ptr", KernelArg::Buf(st.bkt.buf())),
            ("mark_ptr", KernelArg::Buf(st.mark.buf())),
            ("CAPC", i32_arg("bucket capacity", st.capc)?),
            ("bits", i32_arg("pq_bits", cfg.pq_bits as usize)?),
        ]);
        let rows32 = grid_dim("B*H", rows, GRID_X)?;
        let chunks = grid_dim(
            "weight-fill CTAs a row",
            sh.s.div_ceil(ik.wfill_ch).max(1),
            65535,
        )?;
        // Bounds: ensure_ragged sized lens_in/seen/ncached/nc0 (i64) and stat (i32) for B
        // rows, err for 2, the lookup table for B*H x M x K, wext for B*H, sparse_list for
        // B*H x T (a row's entries below total_b <= T, padding masked to ranks < T), weight
        // for B*H x S_alloc elements (fill stores below max(S_b, wext) <= S_alloc: wext is
        // S_alloc or an earlier S_b; heavy ones at positions < S_b), grew the codes to cap
        // >= S_alloc - init_offset keys, and (ensure_buffers with the indexed path) ihist
        // (B*H x HIST_COMBOS), ihistn (B*H), the marks (B*H x TP), the buckets (B*H x
        // HIST_COMBOS x capc; slots stored below CAPC = capc only). The caller vouched (check_extent) for
        // query [B, H, 1, D] and key [B, H_kv, S_alloc, D] and the lengths buffer holds >=
        // B i64. Ordering: pq_rgq writes codes n_cached[b] .. n, stat and nc0 before
        // pq_rgwfill starts (stream order) and so before pq_rgindex, its programmatic
        // dependent, starts; pq_rgindex reads wext's old value nowhere before its
        // griddepcontrol.wait (pq_rgwfill complete) and writes ncached, which no CTA of
        // its launch reads (the reset test reads nc0). sm_80: no pq_rgwfill, each
        // pq_rgindex CTA writes its own row's weights first.
        let mut launches = vec![self.rgq_launch(&named)?];
        if let Some(fill) = &ik.wfill {
            launches.push(Launch {
                kernel: fill.clone(),
                grid: [rows32, chunks, 1],
                args: self.arg_order.args(fill, &named, true)?,
            });
        }
        launches.push(Launch {
            kernel: ik.index.clone(),
            grid: [rows32, 1, 1],
            args: self.arg_order.args(&ik.index, &named, true)?,
        });
        Ok(launches)
    }

    /// The arguments every ragged kernel takes its own from, by name: the tensors, the
    /// code state, the ragged buffers, the outputs, strides, shape and config integers,
    /// the sizes as (count, ratio) pairs.
    fn ragged_args(
        &self,
        query: &DeviceTensorRef,
        key: &DeviceTensorRef,
        lens: DeviceBuf,
    ) -> Result<Vec<(&'static str, KernelArg)>> {
        let (st, r) = (&self.state, &self.ragged);
        let (cfg, sh) = (&st.cfg, &st.shape);
        let (m, k) = (cfg.m(), cfg.k_centroids());
        let i64_arg = |what: &str, v: usize| {
            i64::try_from(v)
                .map(KernelArg::I64)
                .map_err(|_| Error::invalid(what, format!("{v} does not fit i64")))
        };
        let (sink_c, sink_r) = size_args(cfg.sink_size);
        let (win_c, win_r) = size_args(cfg.window_size);
        let (hv_c, hv_r) = size_args(cfg.heavy_size);
        Ok(vec![
            ("q_ptr", KernelArg::Buf(query.buf())),
            ("k_ptr", KernelArg::Buf(key.buf())),
            ("cent_ptr", KernelArg::Buf(st.centroids_buf)),
            ("phi_ptr", KernelArg::Buf(st.phi_buf)),
            ("codes_ptr", KernelArg::Buf(st.codes.buf())),
            ("lut_ptr", KernelArg::Buf(r.lut.buf())),
            ("rst_ptr", KernelArg::Buf(r.rst.buf())),
            ("rhist_ptr", KernelArg::Buf(r.rhist.buf())),
            ("rtick_ptr", KernelArg::Buf(r.rtick.buf())),
            ("pcnt_ptr", KernelArg::Buf(r.pcnt.buf())),
            (
                "lens_ptr",
                KernelArg::Buf(lens.as_dtype(crate::artifact::Dtype::I64)),
            ),
            ("seen_ptr", KernelArg::Buf(r.seen.buf())),
            ("nc_ptr", KernelArg::Buf(r.ncached.buf())),
            ("nc0_ptr", KernelArg::Buf(r.nc0.buf())),
            ("wext_ptr", KernelArg::Buf(r.wext.buf())),
            ("stat_ptr", KernelArg::Buf(r.stat.buf())),
            ("err_ptr", KernelArg::Buf(r.err.buf())),
            ("sl_ptr", KernelArg::Buf(st.sparse_list.buf())),
            ("len_ptr", KernelArg::Buf(st.sparse_len.buf())),
            (
                "w_ptr",
                KernelArg::Buf(st.weight.buf().as_dtype(cfg.weight_dtype.triton())),
            ),
            ("q_sb", KernelArg::I64(query.strides()[0])),
            ("q_sh", KernelArg::I64(query.strides()[1])),
            ("k_sb", KernelArg::I64(key.strides()[0])),
            ("k_sh", KernelArg::I64(key.strides()[1])),
            ("k_ss", KernelArg::I64(key.strides()[2])),
            ("H", i32_arg("H", sh.h)?),
            ("G", i32_arg("G", sh.group())?),
            ("H_kv", i32_arg("H_kv", sh.h_kv)?),
            ("M", i32_arg("M", m)?),
            ("K", i32_arg("K", k)?),
            ("d_s", i32_arg("d_s", cfg.d_sub(sh.d))?),
            ("cap", i32_arg("cap", st.cap)?),
            ("S_alloc", i64_arg("S_alloc", sh.s)?),
            ("T", i64_arg("T", r.row_len)?),
            ("init_offset", i64_arg("init_offset", cfg.init_offset)?),
            (
                "metric_ip",
                KernelArg::I32(i32::from(cfg.metric == Metric::Ip)),
            ),
            ("sink_c", KernelArg::I64(sink_c)),
            ("sink_r", KernelArg::F64(sink_r)),
            ("win_c", KernelArg::I64(win_c)),
            ("win_r", KernelArg::F64(win_r)),
            ("hv_c", KernelArg::I64(hv_c)),
            ("hv_r", KernelArg::F64(hv_r)),
            ("NCH", i32_arg("NCH", r.quant_ctas)?),
        ])
    }
}

/// `weight_list` bytes of `dtype` as f32 values.
pub(crate) fn weights_f32(dtype: DType, raw: &[u8]) -> Vec<f32> {
    match dtype {
        DType::F32 => raw
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        DType::BF16 => raw
            .chunks_exact(2)
            .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        DType::F16 => raw
            .chunks_exact(2)
            .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
    }
}
