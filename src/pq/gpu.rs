//! The indexer's GPU pipeline: the decode step as Triton kernels launched from Rust.
//!
//! State on the device, per indexer (all sizes fixed by `B, H, H_kv, D` and the config):
//! - codes `u8 [B, H_kv, M, cap]`: one byte per (key, subvector), `cap` grows
//!   geometrically (x2, multiple of 16) so a decode step never copies the codebook;
//! - centroids `f32 [B, H_kv, M, K, d_c]` and `phi f32 [B * H_kv * M]` (ip only);
//! - scratch of the select kernel (per-CTA lookup table, staging, per-chunk candidates,
//!   per-row completion counters) and the outputs `sparse_list i64 [B, H, total]`,
//!   `sparse_len i64 [B, H]`, `weight_list [B, H, S]` (weight dtype), reused across steps
//!   and grown only when a step needs more.
//!
//! One step (launch contract: `kernels_triton/README.md`):
//! - short sequence (`S <= heavy + init_offset + 1 + K`): `pq_short.w_<wt>`;
//! - otherwise, when many keys are new (catch-up), `pq_quantize.k_<qt>` first; then
//!   `pq_select.h<K_PAD>.q_<qt>.w_<wt>`: quantize the few new keys, score every quantized
//!   key through a per-head lookup table, mask the window, top-k per chunk, and (last CTA
//!   of each row) merge, assemble sink + heavy + window, sort, write all outputs;
//! - or, where [`SelectPath`] picks it (`K^M <= 4096`, M <= 4, the step's new keys are
//!   not candidates), `pq_hist.m<MP>.q_<qt>.w_<wt>`: one CTA per row finds the threshold
//!   on a persistent histogram of code combinations (`i32 [B*H, 4096]`, moved by the
//!   kernel itself from the keys it counted to the step's candidates) and emits in one
//!   pass over the row (`kernels_triton/pq_hist.py`);
//! - or, on the same state where every heavy pick lies between sink and window (the usual
//!   decode step), the split histogram path: `pq_thresh.m<MP>.q_<qt>` finds each row's
//!   threshold as `pq_hist` does and writes its class bounds, then
//!   `pq_emit.m<MP>.w_<wt>` spreads each row's pass over `cdiv(n, TILE)` CTAs that
//!   exchange their counts through per-part flag words (`kernels_triton/pq_split.py`);
//! - or the indexed histogram path (`M <= 2`, query dtype = weight dtype):
//!   `pq_index.m2.q_<t>.w_<t>` finds each row's threshold as `pq_hist` does and gathers
//!   the taken keys from per-combination buckets of key positions (`i32 [B*H, 4096,
//!   CAPC]`, filled as keys join the candidates), so no step reads the row's codes again
//!   (`kernels_triton/pq_index.py`); `weight_list`'s zeros and sink/window ones come
//!   either from each row's companion CTA in the same launch (few rows of few keys: the
//!   step is one launch) or from `pq_wfill.w_<wt>` over every SM, `pq_index` being its
//!   programmatic dependent launch (sm_90; on sm_80 each row CTA writes its own).
//!
//! The steady-state step allocates nothing, copies nothing between host and device and
//! never synchronizes. [`LaunchMode::Graph`] captures the step once into a CUDA graph per
//! (shape, `S`, buffers) and replays it; a later step with the same key replays without
//! capturing (re-quantizing a key that is already quantized writes the same code, so a
//! replay after the state moved on is still exact).

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::{CudaGraph, CudaSlice, CudaStream, DevicePtr};

use crate::error::{Error, Result};
use crate::kernel::{arg_positions, Kernel, KernelArg, Runtime};
use crate::pq::config::{DType, Metric, PqConfig, Shape};
use crate::pq::reference::PqOutput;
use crate::pq::workload::PqInputs;

/// Top-k widths the select kernel is compiled for (`K_PAD`, a power of two >= heavy);
/// source: `kernels_triton/pq_select.py`'s `K_PADS`.
pub const K_PADS: [usize; 3] = [128, 256, 512];

/// More new keys than this in one step are quantized by the bulk quantize kernel
/// (one CTA per key and KV head) instead of inside the select kernel's chunks.
pub const BULK_QUANTIZE_MIN: usize = 8;

/// Code combinations the histogram path counts per row (`NC` in
/// `kernels_triton/pq_hist.py`): the path needs `K^M <= HIST_COMBOS`.
pub const HIST_COMBOS: usize = 4096;
/// Threshold rounds x bins of the histogram path's scratch (`LEVELS`, `NB` in
/// `kernels_triton/pq_hist.py`).
const HIST_LEVEL_BINS: usize = 3 * 1024;

/// Which select kernel a (non-short) step uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum SelectPath {
    /// The histogram path where it applies and the shape favours it: the indexed path
    /// (`pq_index`, its weights written as [`SelectPath::Index`] chooses) wherever it is
    /// built (NOTES.md, session 12: large workload 44.0-45.1 us, reference 19.1-20.5);
    /// else split (`pq_thresh` and `pq_emit`) for fewer than 64 rows (`B*H`) of at least
    /// 16384 quantized keys, `pq_hist` for at least 64 rows and 32768 keys; else
    /// `pq_select`. Measured on the
    /// H100 (NOTES.md, sessions 3 and 5-8): one `pq_hist` CTA per row leaves most SMs
    /// idle with few rows, where the split path spreads the emit over every SM (reference
    /// workload, `tritonrt run` wall per step: 25.3 us split, 34.7 pq_hist, 32.9 chunked
    /// in session 6); with 128 rows of 131k keys `pq_hist` is fastest (82.6 us, split
    /// 85.0, chunked 254.9 in session 6).
    #[default]
    Auto,
    /// Always `pq_select` (top-k per chunk of keys, merged by each row's last CTA).
    Chunked,
    /// `pq_hist` whenever it applies (`K^M <= 4096`, `M <= 4`, at most
    /// [`BULK_QUANTIZE_MIN`] new keys, none of them a candidate); else `pq_select`.
    Hist,
    /// `pq_thresh` + `pq_emit` whenever they apply (as [`SelectPath::Hist`], and
    /// `init_offset >= min(sink, S)`, `S - min(window, S) - init_offset >= k`); else as
    /// [`SelectPath::Hist`].
    Split,
    /// `pq_index` wherever it is built and the histogram path applies (as
    /// [`SelectPath::Hist`], `M <= 2`, query dtype = weight dtype, `B*H*S < 2^31`); else
    /// as [`SelectPath::Split`]. Its weights come from each row's companion CTA
    /// ([`SelectPath::IndexCompanion`]) when every CTA of the launch has an SM of its own
    /// (`2 B*H <=` SMs) and a row's weights are at most [`COMPANION_FILL_MAX_BYTES`] (or
    /// no `pq_wfill` is built: sm_80), else as [`SelectPath::IndexWfill`].
    Index,
    /// [`SelectPath::Index`] with `weight_list` written by each row's companion CTA in
    /// the same launch (grid `(B*H, 2)`: CTA `(r, 0)` writes row `r`'s zeros and sink /
    /// window ones, releases a ready flag, then quantizes; the row CTA `(r, 1)` acquires
    /// the flag before its heavy ones). One launch, no programmatic dependency. A row
    /// CTA waits only for a CTA of a lower block index, which the GPU starts first.
    IndexCompanion,
    /// [`SelectPath::Index`] with `weight_list` written by `pq_wfill` over every SM,
    /// `pq_index` its programmatic dependent launch (sm_90); where no `pq_wfill` is built
    /// (sm_80) each row CTA writes its own row first.
    IndexWfill,
}

/// The most bytes of `weight_list` per row for which [`SelectPath::Index`] lets each
/// row's companion CTA write them (one CTA writes ~30 GB/s, ~4.3 us for 128 KB, within the
/// row CTA's ~10 us; measured on the H100, NOTES.md, session 12: reference workload
/// (128 000 bytes per row) 12.0 us GPU per step against 13.6 with `pq_wfill`; S = 65536
/// (256 KiB) 15.9 us, the row waiting for its weights).
pub const COMPANION_FILL_MAX_BYTES: usize = 128 * 1024;

/// How a step is issued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LaunchMode {
    /// Plain kernel launches on the stream.
    Launch,
    /// Capture the step into a CUDA graph (once per step key) and replay it.
    Graph,
}

/// A device tensor the caller owns: base address, dtype and strides in elements.
///
/// `query` is `[B, H, 1, D]` and `key` is `[B, H_kv, S_alloc, D]`; the innermost
/// dimension must be contiguous (stride 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DeviceTensorRef {
    ptr: u64,
    dtype: DType,
    strides: [i64; 3],
}

impl DeviceTensorRef {
    /// A view of caller-owned device memory. `strides` are the element strides of the
    /// first three dimensions (`[batch, head, position]`); the last dimension (`D`) is
    /// contiguous.
    ///
    /// # Safety
    ///
    /// `ptr` must be a device address in the indexer's CUDA context, of dtype `dtype`,
    /// valid for every element the indexer reads (query: all `B x H x D`; key: the new
    /// positions `init_offset + N_cached .. S` of every batch and KV head) until the
    /// step that reads it completes on the indexer's stream.
    pub unsafe fn new(ptr: u64, dtype: DType, strides: [i64; 3]) -> Self {
        DeviceTensorRef {
            ptr,
            dtype,
            strides,
        }
    }

    /// The device address.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }
}

/// Device buffers holding one step's outputs (valid until the next step).
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
    /// Whether a graph was captured (false: replayed, or no graph).
    pub captured: bool,
    /// Whether the histogram select path (`pq_hist`, or split) ran.
    pub hist: bool,
    /// Whether it ran split: `pq_thresh` + `pq_emit`.
    pub split: bool,
    /// Whether it ran indexed: `pq_index` (after `pq_wfill`, or alone).
    pub index: bool,
    /// Whether the indexed step was one launch, each row's companion CTA writing its
    /// weights (see [`SelectPath::IndexCompanion`]).
    pub companion: bool,
}

/// A growable device buffer of `T` (grows only, never shrinks; contents are not kept).
struct DevBuf<T> {
    buf: Option<CudaSlice<T>>,
}

impl<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits> DevBuf<T> {
    fn new() -> Self {
        DevBuf { buf: None }
    }
    fn ensure(&mut self, stream: &Arc<CudaStream>, len: usize) -> Result<()> {
        let have = self.buf.as_ref().map_or(0, |b| b.len());
        if have < len.max(1) {
            let new_len = len.max(1).max(have * 2);
            self.buf = Some(stream.alloc_zeros::<T>(new_len).map_err(|e| {
                crate::device::driver_err(format!("allocating {new_len} elements"), e)
            })?);
        }
        Ok(())
    }
    fn ptr(&self, stream: &CudaStream) -> u64 {
        match &self.buf {
            Some(b) => b.device_ptr(stream).0,
            None => 0,
        }
    }
    fn slice(&self) -> Option<&CudaSlice<T>> {
        self.buf.as_ref()
    }
}

/// The indexed histogram path's kernels.
struct IndexKernels {
    /// `pq_index.m2.q_<t>.w_<t>` as built (sm_90: a programmatic dependent launch).
    index: Arc<Kernel>,
    /// The same function launched without a programmatic dependency (the companion-fill
    /// step, where no primary precedes it).
    alone: Arc<Kernel>,
    /// `pq_wfill.w_<t>`; none where the pq_index variant has `PDL=0` (sm_80: its row
    /// CTAs write their weights themselves unless their companions do).
    wfill: Option<Arc<Kernel>>,
    /// pq_index's `TP` (gathered keys per row at most).
    tp: usize,
}

/// The kernels of one indexer configuration.
struct Kernels {
    select: Arc<Kernel>,
    /// `pq_hist.m<MP>.q_<qt>.w_<wt>`, where the config allows it (`K^M <= 4096`, M <= 4).
    hist: Option<Arc<Kernel>>,
    /// `pq_thresh.m<MP>.q_<qt>` and `pq_emit.m<MP>.w_<wt>` (the split histogram path),
    /// with the emit variant's `TILE` (positions per CTA); where `hist` is.
    split: Option<(Arc<Kernel>, Arc<Kernel>, usize)>,
    /// The indexed histogram path, where built (`M <= 2`, `K^M <= 4096`, query dtype =
    /// weight dtype).
    index: Option<IndexKernels>,
    short: Arc<Kernel>,
    quantize: Arc<Kernel>,
    import: Arc<Kernel>,
    export: Arc<Kernel>,
    /// Keys per select CTA (the select variant's `CHUNK`).
    chunk: usize,
    /// The select variant's `K_PAD`.
    k_pad: usize,
    /// The select variant's staging width in keys (`2 * K_PAD`).
    stage: usize,
}

/// One kernel launch of a step: kernel, grid and arguments in signature order.
struct Launch {
    kernel: Arc<Kernel>,
    grid: [u32; 3],
    args: Vec<KernelArg>,
}

/// What a captured graph was captured for.
#[derive(Debug, Clone, PartialEq, Eq)]
struct GraphKey {
    s: usize,
    query: DeviceTensorRef,
    key: DeviceTensorRef,
    buffers: Vec<u64>,
}

struct Captured {
    key: GraphKey,
    /// `N_cached` at capture: replays re-quantize keys from here, so a replay is exact
    /// while the state holds at least this many codes.
    n_old: usize,
    info: StepInfo,
    /// The graph's kernel nodes, in launch order (empty: never updated, only replayed).
    nodes: Vec<cudarc::driver::sys::CUgraphNode>,
    /// Variant id of each node's kernel.
    kernels: Vec<String>,
    graph: CudaGraph,
}

/// The PQCache decode-step indexer on one GPU stream.
///
/// Not `Sync`: one indexer serves one decode loop. Create one per stream.
pub struct GpuIndexer {
    rt: Arc<Runtime>,
    stream: Arc<CudaStream>,
    cfg: PqConfig,
    shape: Shape,
    kernels: Kernels,
    centroids: CudaSlice<f32>,
    phi: CudaSlice<f32>,
    codes: DevBuf<u8>,
    cap: usize,
    n_cached: usize,
    lut: DevBuf<f32>,
    /// Histogram path state: combination counts `i32 [B*H, HIST_COMBOS]` of the keys
    /// `j < histn[r]`, `histn i32 [B*H]`, the threshold rounds' bins (kept zero by the
    /// kernel) and the per-row lookup table. Zero-filled at creation and on import.
    hist: DevBuf<i32>,
    histn: DevBuf<i32>,
    hist_lvl: DevBuf<i32>,
    hist_lut: DevBuf<f32>,
    /// Split path scratch: each row's class bounds `f32 [B*H, 2]` (`t_sure`, `t_maybe`:
    /// `pq_emit` scores keys through `hist_lut` and compares), maybe keys to take `i32
    /// [B*H]`, the emit's part flags `i64 [B*H, cdiv(n, TILE)]` and ticket counter `i32
    /// [1]` (both zeroed by `pq_thresh` each step).
    split_bnd: DevBuf<f32>,
    split_need: DevBuf<i32>,
    split_flag: DevBuf<i64>,
    split_ctr: DevBuf<i32>,
    /// Indexed path state: its own combination counts `i32 [B*H, HIST_COMBOS]` of the
    /// keys `j < ihistn[r]` (`ihistn i32 [B*H]`), the buckets `i32 [B*H, HIST_COMBOS,
    /// capc]` (key positions per combination, slot = count when the key joined; a
    /// combination's keys past `capc` are not kept and its rows fall back to a pass over
    /// the codes), the gather's start marks `i32 [B*H, TP]` and the rows' weights-ready
    /// flags `i32 [B*H]` (companion fill; both kept zero by the kernel).
    /// Counts zero-filled at creation, on import and when `capc` changes. The buckets
    /// take `B*H x 4096 x capc x 4` bytes, `capc = 2 cdiv(cap, 4096) + 16` (large
    /// workload: 128 rows, cap 130944: 168 MB), allocated only when the path is chosen.
    ihist: DevBuf<i32>,
    ihistn: DevBuf<i32>,
    bkt: DevBuf<i32>,
    mark: DevBuf<i32>,
    ready: DevBuf<i32>,
    capc: usize,
    path: SelectPath,
    stage: DevBuf<i64>,
    cand: DevBuf<i64>,
    count: DevBuf<i32>,
    sparse_list: DevBuf<i64>,
    sparse_len: DevBuf<i64>,
    weight: DevBuf<u8>,
    last: Option<StepInfo>,
    arg_order: ArgOrder,
    graph: Option<Captured>,
}

fn dt(d: DType) -> &'static str {
    match d {
        DType::F32 => "fp32",
        DType::BF16 => "bf16",
        DType::F16 => "fp16",
    }
}

fn constexpr_usize(k: &Kernel, name: &str) -> Result<usize> {
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

/// The arguments of each kernel in signature order, from the named lists a step builds
/// (see [`crate::kernel::arg_positions`]). The positions are found once per kernel and kept: the lists
/// are built in the same order every step, so later steps take one pass over the
/// signature (each position's name re-checked) instead of a name search per argument
/// (measured on the H100, session 10: the split path's planning cost 13 us of host time
/// per plain-launch step with the search).
#[derive(Default)]
struct ArgOrder(RefCell<HashMap<usize, (usize, Vec<usize>)>>);

impl ArgOrder {
    /// `named` ordered by `k`'s signature; `subset` as in [`arg_positions`].
    /// Errors: [`Error::Invalid`] naming the kernel and the argument.
    fn args(
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

fn i32_arg(what: &str, v: usize) -> Result<KernelArg> {
    i32::try_from(v)
        .map(KernelArg::I32)
        .map_err(|_| Error::invalid(what, format!("{v} does not fit the kernel's i32 argument")))
}

/// Select-kernel variant names for this config: `pq_select.h<K_PAD>.q_<qt>.w_<wt>`.
pub fn select_kernel_name(cfg: &PqConfig) -> Result<String> {
    let k_pad = K_PADS
        .iter()
        .copied()
        .find(|&p| p >= cfg.heavy_size)
        .ok_or_else(|| {
            Error::invalid(
                "heavy_size",
                format!(
                    "{} exceeds the largest compiled top-k width {} (K_PADS in kernels_triton/pq_select.py)",
                    cfg.heavy_size,
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

impl GpuIndexer {
    /// Set up an indexer for `shape` (`S` is ignored: it comes with each step) and
    /// `cfg`, uploading `centroids` (`f32 [B, H_kv, M, K, d_c]`) and `phi`
    /// (`f32 [B * H_kv * M]`, metric ip only). `select_variant` picks a tuned variant
    /// id of the select kernel (else the manifest default for this GPU).
    ///
    /// Errors: config/shape validation, a missing kernel variant, heavy_size above the
    /// compiled top-k widths, a centroid or phi length mismatch, driver errors.
    pub fn new(
        rt: Arc<Runtime>,
        stream: Arc<CudaStream>,
        cfg: PqConfig,
        shape: Shape,
        centroids: &[f32],
        phi: Option<&[f32]>,
        select_variant: Option<&str>,
    ) -> Result<Self> {
        cfg.validate(&shape)?;
        if !cfg.k_centroids().is_power_of_two() || cfg.k_centroids() > 256 {
            return Err(Error::invalid("pq_bits", "K = 2^bits must be at most 256"));
        }
        let (m, k, d_c) = (cfg.m(), cfg.k_centroids(), cfg.d_c(shape.d));
        let want = shape.b * shape.h_kv * m * k * d_c;
        if centroids.len() != want {
            return Err(Error::invalid(
                "pq_centroids",
                format!(
                    "expected {want} f32 values [B={}, H_kv={}, M={m}, K={k}, d_c={d_c}], got {}",
                    shape.b,
                    shape.h_kv,
                    centroids.len()
                ),
            ));
        }
        let n_phi = shape.b * shape.h_kv * m;
        let phi_host: Vec<f32> = match (cfg.metric, phi) {
            (Metric::Ip, Some(p)) if p.len() == n_phi => p.to_vec(),
            (Metric::Ip, Some(p)) => {
                return Err(Error::invalid(
                    "pq_ip2l2_phi",
                    format!(
                        "expected {n_phi} f32 values [B * H_kv * M], got {}",
                        p.len()
                    ),
                ))
            }
            (Metric::Ip, None) => {
                return Err(Error::invalid(
                    "pq_ip2l2_phi",
                    "metric ip needs phi [B * H_kv * M]",
                ))
            }
            (Metric::Euclidean, _) => vec![0.0],
        };
        let name = select_kernel_name(&cfg)?;
        let select = rt.kernel_for(&name, select_variant)?;
        let qt = dt(cfg.input_dtype);
        let wt = dt(cfg.weight_dtype);
        let combos = k.checked_pow(m as u32).unwrap_or(usize::MAX);
        let index = if combos <= HIST_COMBOS && m <= 2 && qt == wt {
            // built for these configs only (kernels_triton/pq_index.py)
            match (
                rt.default_kernel(&format!("pq_index.m2.q_{qt}.w_{wt}")),
                rt.default_kernel(&format!("pq_wfill.w_{wt}")),
            ) {
                (Ok(ix), Ok(fill)) => {
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
        let (hist, split) = if combos <= HIST_COMBOS && m <= 4 {
            let mp = if m <= 2 { 2 } else { 4 };
            let emit = rt.default_kernel(&format!("pq_emit.m{mp}.w_{wt}"))?;
            let tile = constexpr_usize(&emit, "TILE")?;
            (
                Some(rt.default_kernel(&format!("pq_hist.m{mp}.q_{qt}.w_{wt}"))?),
                Some((
                    rt.default_kernel(&format!("pq_thresh.m{mp}.q_{qt}"))?,
                    emit,
                    tile,
                )),
            )
        } else {
            (None, None)
        };
        let kernels = Kernels {
            hist,
            split,
            index,
            chunk: constexpr_usize(&select, "CHUNK")?,
            k_pad: constexpr_usize(&select, "K_PAD")?,
            stage: 2 * constexpr_usize(&select, "K_PAD")?,
            select,
            short: rt.default_kernel(&format!("pq_short.w_{wt}"))?,
            quantize: rt.default_kernel(&format!("pq_quantize.k_{qt}"))?,
            import: rt.default_kernel("pq_codes_import")?,
            export: rt.default_kernel("pq_codes_export")?,
        };
        let drv = |what: &str| {
            let what = what.to_string();
            move |e| crate::device::driver_err(what, e)
        };
        let centroids = stream
            .clone_htod(centroids)
            .map_err(drv("uploading centroids"))?;
        let phi = stream.clone_htod(&phi_host).map_err(drv("uploading phi"))?;
        let mut me = GpuIndexer {
            rt,
            stream,
            cfg,
            shape,
            kernels,
            centroids,
            phi,
            codes: DevBuf::new(),
            cap: 0,
            n_cached: 0,
            lut: DevBuf::new(),
            hist: DevBuf::new(),
            histn: DevBuf::new(),
            hist_lvl: DevBuf::new(),
            hist_lut: DevBuf::new(),
            split_bnd: DevBuf::new(),
            split_need: DevBuf::new(),
            split_flag: DevBuf::new(),
            split_ctr: DevBuf::new(),
            ihist: DevBuf::new(),
            ihistn: DevBuf::new(),
            bkt: DevBuf::new(),
            mark: DevBuf::new(),
            ready: DevBuf::new(),
            capc: 0,
            path: SelectPath::default(),
            stage: DevBuf::new(),
            cand: DevBuf::new(),
            count: DevBuf::new(),
            sparse_list: DevBuf::new(),
            sparse_len: DevBuf::new(),
            weight: DevBuf::new(),
            last: None,
            arg_order: ArgOrder::default(),
            graph: None,
        };
        let rows = shape.b * shape.h;
        me.count.ensure(&me.stream, rows)?;
        me.sparse_len.ensure(&me.stream, rows)?;
        if me.kernels.hist.is_some() {
            // allocated zero-filled: an empty histogram counting no keys
            me.hist.ensure(&me.stream, rows * HIST_COMBOS)?;
            me.histn.ensure(&me.stream, rows)?;
            me.hist_lvl.ensure(&me.stream, rows * HIST_LEVEL_BINS)?;
            me.hist_lut.ensure(&me.stream, rows * m * k)?;
            me.split_bnd.ensure(&me.stream, rows * 2)?;
            me.split_need.ensure(&me.stream, rows)?;
            me.split_ctr.ensure(&me.stream, 1)?;
        }
        if let Some(ik) = &me.kernels.index {
            let tp = ik.tp;
            me.ihist.ensure(&me.stream, rows * HIST_COMBOS)?;
            me.ihistn.ensure(&me.stream, rows)?;
            me.mark.ensure(&me.stream, rows * tp)?;
            // zero-filled: no row's weights are ready
            me.ready.ensure(&me.stream, rows)?;
        }
        Ok(me)
    }

    /// The stream every step is issued on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The runtime the kernels came from.
    pub fn runtime(&self) -> &Arc<Runtime> {
        &self.rt
    }

    /// Keys quantized so far (`N_cached`).
    pub fn n_cached(&self) -> usize {
        self.n_cached
    }

    /// Code capacity per (batch, KV head, subvector), in keys.
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Choose the select kernel of later steps (default [`SelectPath::Auto`]).
    pub fn set_select_path(&mut self, path: SelectPath) {
        self.path = path;
    }

    /// Variant id of the select kernel in use.
    pub fn select_variant(&self) -> &str {
        self.kernels.select.id()
    }

    /// Every kernel variant this indexer launches (for reports).
    pub fn kernels(&self) -> Vec<Arc<Kernel>> {
        let k = &self.kernels;
        let mut v = vec![k.select.clone(), k.short.clone(), k.quantize.clone()];
        v.extend(k.hist.clone());
        if let Some((t, e, _)) = &k.split {
            v.extend([t.clone(), e.clone()]);
        }
        if let Some(ik) = &k.index {
            v.extend(ik.wfill.clone());
            v.push(ik.index.clone());
        }
        v
    }

    fn grow_codes(&mut self, n: usize) -> Result<()> {
        if n <= self.cap {
            return Ok(());
        }
        let new_cap = n.max(self.cap * 2).max(16).div_ceil(16) * 16;
        let (b, h_kv, m) = (self.shape.b, self.shape.h_kv, self.cfg.m());
        let mut next: DevBuf<u8> = DevBuf::new();
        next.ensure(&self.stream, b * h_kv * m * new_cap)?;
        if self.n_cached > 0 {
            // re-layout through the upstream i64 form, on the device (only on growth)
            let mut tmp: DevBuf<i64> = DevBuf::new();
            let nc = self.n_cached;
            tmp.ensure(&self.stream, b * nc * h_kv * m)?;
            let src = self.codes.ptr(&self.stream);
            self.launch_codes_copy(true, src, tmp.ptr(&self.stream), nc, self.cap)?;
            self.launch_codes_copy(
                false,
                tmp.ptr(&self.stream),
                next.ptr(&self.stream),
                nc,
                new_cap,
            )?;
            self.stream
                .synchronize()
                .map_err(|e| crate::device::driver_err("growing the code state", e))?;
        }
        self.codes = next;
        self.cap = new_cap;
        Ok(())
    }

    /// export (u8 state -> i64 upstream) when `export`, else import.
    fn launch_codes_copy(
        &self,
        export: bool,
        src: u64,
        dst: u64,
        n: usize,
        cap: usize,
    ) -> Result<()> {
        let k = if export {
            &self.kernels.export
        } else {
            &self.kernels.import
        };
        let block = constexpr_usize(k, "BLOCK")?;
        let rows = self.shape.b * self.shape.h_kv * self.cfg.m();
        let args = self.arg_order.args(
            k,
            &[
                ("src_ptr", KernelArg::Ptr(src)),
                ("dst_ptr", KernelArg::Ptr(dst)),
                ("N", i32_arg("N", n)?),
                ("H_kv", i32_arg("H_kv", self.shape.h_kv)?),
                ("M", i32_arg("M", self.cfg.m())?),
                ("cap", i32_arg("cap", cap)?),
            ],
            false,
        )?;
        let grid = [n.div_ceil(block).max(1) as u32, rows as u32, 1];
        // SAFETY: src and dst are this indexer's buffers (or a temp of the same
        // stream) sized for `rows x cap` u8 codes and `B x n x H_kv x M` i64 codes; the
        // kernel touches j < n <= cap only; everything runs on self.stream in order.
        unsafe { k.launch(&self.stream, grid, &args) }
    }

    /// Replace the code state with upstream-layout codes `i64 [B, n, H_kv, M]` (values
    /// in `0..K`). Synchronous (a one-time import, not part of a step).
    ///
    /// Errors: a length mismatch or a code out of range, named with its index.
    pub fn import_codes(&mut self, codes: &[i64], n: usize) -> Result<()> {
        let (b, h_kv, m, k) = (
            self.shape.b,
            self.shape.h_kv,
            self.cfg.m(),
            self.cfg.k_centroids(),
        );
        if codes.len() != b * n * h_kv * m {
            return Err(Error::invalid(
                "pq_codebook",
                format!(
                    "expected {} i64 values [B={b}, N={n}, H_kv={h_kv}, M={m}], got {}",
                    b * n * h_kv * m,
                    codes.len()
                ),
            ));
        }
        if let Some((i, c)) = codes
            .iter()
            .enumerate()
            .find(|(_, &c)| c < 0 || c as usize >= k)
        {
            return Err(Error::invalid(
                "pq_codebook",
                format!("code {c} at flat index {i} is outside 0..{k}"),
            ));
        }
        self.n_cached = 0;
        self.graph = None;
        self.reset_hist()?;
        self.grow_codes(n)?;
        if n > 0 {
            let src = self
                .stream
                .clone_htod(codes)
                .map_err(|e| crate::device::driver_err("uploading codes", e))?;
            let srcp = src.device_ptr(&self.stream).0;
            self.launch_codes_copy(false, srcp, self.codes.ptr(&self.stream), n, self.cap)?;
            self.stream
                .synchronize()
                .map_err(|e| crate::device::driver_err("importing codes", e))?;
        }
        self.n_cached = n;
        Ok(())
    }

    /// Forget the histogram path's counts (the codes they counted are being replaced):
    /// zero `hist` and `histn`, so the next histogram step counts every candidate anew.
    fn reset_hist(&mut self) -> Result<()> {
        let st = self.stream.clone();
        for b in [
            &mut self.hist,
            &mut self.histn,
            &mut self.ihist,
            &mut self.ihistn,
        ] {
            if let Some(buf) = b.buf.as_mut() {
                st.memset_zeros(buf).map_err(|e| {
                    crate::device::driver_err("clearing the combination histogram", e)
                })?;
            }
        }
        Ok(())
    }

    /// The code state in the upstream layout `i64 [B, N_cached, H_kv, M]`. Synchronous.
    pub fn export_codes(&self) -> Result<Vec<i64>> {
        let (b, h_kv, m, n) = (self.shape.b, self.shape.h_kv, self.cfg.m(), self.n_cached);
        if n == 0 {
            return Ok(Vec::new());
        }
        let mut tmp: DevBuf<i64> = DevBuf::new();
        tmp.ensure(&self.stream, b * n * h_kv * m)?;
        self.launch_codes_copy(
            true,
            self.codes.ptr(&self.stream),
            tmp.ptr(&self.stream),
            n,
            self.cap,
        )?;
        let mut host = self
            .stream
            .clone_dtoh(tmp.slice().expect("allocated above"))
            .map_err(|e| crate::device::driver_err("downloading codes", e))?;
        host.truncate(b * n * h_kv * m);
        Ok(host)
    }

    fn check_tensor(&self, what: &str, t: &DeviceTensorRef) -> Result<()> {
        if t.dtype != self.cfg.input_dtype {
            return Err(Error::invalid(
                what,
                format!(
                    "dtype {} but the config says {}",
                    t.dtype.as_str(),
                    self.cfg.input_dtype.as_str()
                ),
            ));
        }
        if t.ptr == 0 {
            return Err(Error::invalid(what, "null device address"));
        }
        Ok(())
    }

    /// Make sure every buffer a step at `s` needs exists (allocation happens here, never
    /// inside a captured or steady-state step once sizes stop growing).
    fn ensure_buffers(&mut self, s: usize) -> Result<()> {
        let rows = self.shape.b * self.shape.h;
        let (m, k) = (self.cfg.m(), self.cfg.k_centroids());
        let total = if self.cfg.is_short(s) {
            s
        } else {
            self.cfg.total(s)
        };
        self.sparse_list.ensure(&self.stream, rows * total)?;
        self.weight
            .ensure(&self.stream, rows * s * self.cfg.weight_dtype.size_bytes())?;
        if !self.cfg.is_short(s) {
            let n = self.cfg.n_quantized(s);
            let ctas = rows * n.div_ceil(self.kernels.chunk);
            self.lut.ensure(&self.stream, ctas * m * k)?;
            self.stage.ensure(&self.stream, ctas * self.kernels.stage)?;
            self.cand.ensure(&self.stream, ctas * self.kernels.k_pad)?;
            self.grow_codes(n)?;
            if let Some((_, _, tile)) = self.kernels.split {
                self.split_flag
                    .ensure(&self.stream, rows * n.div_ceil(tile))?;
            }
            if self.kernels.index.is_some() && self.index_wanted() {
                // buckets sized from the code capacity: twice a uniform share of the
                // keys per combination, plus 16 (rows whose taken combinations hold more
                // fall back to a pass over their codes, still exact)
                let capc = 2 * self.cap.div_ceil(HIST_COMBOS) + 16;
                if capc != self.capc {
                    self.bkt.ensure(&self.stream, rows * HIST_COMBOS * capc)?;
                    self.capc = capc;
                    // the bucket layout changed: count every candidate anew
                    self.reset_hist()?;
                }
            }
        }
        Ok(())
    }

    fn buffer_ptrs(&self) -> Vec<u64> {
        let s = &self.stream;
        vec![
            self.codes.ptr(s),
            self.cap as u64,
            self.lut.ptr(s),
            self.stage.ptr(s),
            self.cand.ptr(s),
            self.count.ptr(s),
            self.hist.ptr(s),
            self.histn.ptr(s),
            self.hist_lvl.ptr(s),
            self.hist_lut.ptr(s),
            self.split_bnd.ptr(s),
            self.split_need.ptr(s),
            self.split_flag.ptr(s),
            self.split_ctr.ptr(s),
            self.ihist.ptr(s),
            self.ihistn.ptr(s),
            self.bkt.ptr(s),
            self.capc as u64,
            self.mark.ptr(s),
            self.ready.ptr(s),
            self.sparse_list.ptr(s),
            self.sparse_len.ptr(s),
            self.weight.ptr(s),
        ]
    }

    /// The launches of one step at `s` with `N_cached = n_old`, in order (no allocation,
    /// nothing issued). The comments marked `Bounds:` state why each launch stays inside
    /// the indexer's buffers; [`GpuIndexer::issue`] relies on them.
    fn plan(
        &self,
        query: &DeviceTensorRef,
        key: &DeviceTensorRef,
        s: usize,
        n_old: usize,
    ) -> Result<(StepInfo, Vec<Launch>)> {
        let st = &self.stream;
        let rows = self.shape.b * self.shape.h;
        if self.cfg.is_short(s) {
            let k = &self.kernels.short;
            let block = constexpr_usize(k, "BLOCK")?;
            let args = self.arg_order.args(
                k,
                &[
                    ("sl_ptr", KernelArg::Ptr(self.sparse_list.ptr(st))),
                    ("len_ptr", KernelArg::Ptr(self.sparse_len.ptr(st))),
                    ("w_ptr", KernelArg::Ptr(self.weight.ptr(st))),
                    ("S", i32_arg("S", s)?),
                ],
                false,
            )?;
            // Bounds: ensure_buffers sized sparse_list for rows x s i64, weight for
            // rows x s elements of the weight dtype, sparse_len for rows i64; the grid
            // covers exactly s positions x rows.
            let launch = Launch {
                kernel: k.clone(),
                grid: [s.div_ceil(block) as u32, rows as u32, 1],
                args,
            };
            let info = StepInfo {
                s,
                total: s,
                short: true,
                launches: 1,
                captured: false,
                hist: false,
                split: false,
                index: false,
                companion: false,
            };
            return Ok((info, vec![launch]));
        }
        let (h_kv, d) = (self.shape.h_kv, self.shape.d);
        let (m, kc) = (self.cfg.m(), self.cfg.k_centroids());
        let d_s = self.cfg.d_sub(d);
        let n = self.cfg.n_quantized(s);
        let metric_ip = i32::from(self.cfg.metric == Metric::Ip);
        if let Some((launches, index, companion)) = self.plan_hist(query, key, s, n_old)? {
            let info = StepInfo {
                s,
                total: self.cfg.total(s),
                short: false,
                launches: launches.len(),
                captured: false,
                hist: true,
                split: launches.len() == 2 && !index,
                index,
                companion,
            };
            return Ok((info, launches));
        }
        let mut launches = Vec::with_capacity(2);
        let mut n_old_sel = n_old;
        if n - n_old > BULK_QUANTIZE_MIN {
            let k = &self.kernels.quantize;
            let args = self.arg_order.args(
                k,
                &[
                    ("k_ptr", KernelArg::Ptr(key.ptr)),
                    ("cent_ptr", KernelArg::Ptr(self.centroids.device_ptr(st).0)),
                    ("phi_ptr", KernelArg::Ptr(self.phi.device_ptr(st).0)),
                    ("codes_ptr", KernelArg::Ptr(self.codes.ptr(st))),
                    ("k_sb", KernelArg::I64(key.strides[0])),
                    ("k_sh", KernelArg::I64(key.strides[1])),
                    ("k_ss", KernelArg::I64(key.strides[2])),
                    ("H_kv", i32_arg("H_kv", h_kv)?),
                    ("M", i32_arg("M", m)?),
                    ("K", i32_arg("K", kc)?),
                    ("d_s", i32_arg("d_s", d_s)?),
                    ("pos0", i32_arg("pos0", self.cfg.init_offset + n_old)?),
                    ("t0", i32_arg("t0", n_old)?),
                    ("cap", i32_arg("cap", self.cap)?),
                    ("metric_ip", KernelArg::I32(metric_ip)),
                ],
                false,
            )?;
            // Bounds: the caller vouched (DeviceTensorRef::new) for key positions
            // init_offset + n_old .. s; codes hold cap >= n keys per row (grow_codes);
            // centroids/phi were uploaded with the validated sizes.
            launches.push(Launch {
                kernel: k.clone(),
                grid: [(n - n_old) as u32, (self.shape.b * h_kv) as u32, 1],
                args,
            });
            n_old_sel = n;
        }
        let k = &self.kernels.select;
        let n_chunks = n.div_ceil(self.kernels.chunk);
        let mut named = self.select_args(query, key, s, n_old_sel)?;
        named.extend([
            ("lut_ptr", KernelArg::Ptr(self.lut.ptr(st))),
            ("stage_ptr", KernelArg::Ptr(self.stage.ptr(st))),
            ("cand_ptr", KernelArg::Ptr(self.cand.ptr(st))),
            ("count_ptr", KernelArg::Ptr(self.count.ptr(st))),
        ]);
        let args = self.arg_order.args(k, &named, false)?;
        // Bounds: ensure_buffers sized lut/stage/cand for rows x n_chunks CTAs, codes for
        // cap >= n keys, sparse_list for rows x total, weight for rows x s, sparse_len
        // and count for rows (count starts at 0 and every row's last CTA resets it); the
        // caller vouched for query (all heads) and the new key positions.
        launches.push(Launch {
            kernel: k.clone(),
            grid: [n_chunks as u32, rows as u32, 1],
            args,
        });
        let info = StepInfo {
            s,
            total: self.cfg.total(s),
            short: false,
            launches: launches.len(),
            captured: false,
            hist: false,
            split: false,
            index: false,
            companion: false,
        };
        Ok((info, launches))
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
        let (st, cfg) = (&self.stream, &self.cfg);
        Ok(vec![
            ("q_ptr", KernelArg::Ptr(query.ptr)),
            ("k_ptr", KernelArg::Ptr(key.ptr)),
            ("cent_ptr", KernelArg::Ptr(self.centroids.device_ptr(st).0)),
            ("phi_ptr", KernelArg::Ptr(self.phi.device_ptr(st).0)),
            ("codes_ptr", KernelArg::Ptr(self.codes.ptr(st))),
            ("sl_ptr", KernelArg::Ptr(self.sparse_list.ptr(st))),
            ("len_ptr", KernelArg::Ptr(self.sparse_len.ptr(st))),
            ("w_ptr", KernelArg::Ptr(self.weight.ptr(st))),
            ("q_sb", KernelArg::I64(query.strides[0])),
            ("q_sh", KernelArg::I64(query.strides[1])),
            ("k_sb", KernelArg::I64(key.strides[0])),
            ("k_sh", KernelArg::I64(key.strides[1])),
            ("k_ss", KernelArg::I64(key.strides[2])),
            ("H", i32_arg("H", self.shape.h)?),
            ("G", i32_arg("G", self.shape.group())?),
            ("M", i32_arg("M", cfg.m())?),
            ("K", i32_arg("K", cfg.k_centroids())?),
            ("d_s", i32_arg("d_s", cfg.d_sub(self.shape.d))?),
            ("S", i32_arg("S", s)?),
            ("n_old", i32_arg("n_old", n_old)?),
            ("cap", i32_arg("cap", self.cap)?),
            ("sink", i32_arg("sink_size", cfg.sink_size)?),
            ("window", i32_arg("window_size", cfg.window_size)?),
            ("heavy", i32_arg("heavy_size", cfg.heavy_size)?),
            ("init_offset", i32_arg("init_offset", cfg.init_offset)?),
            (
                "metric_ip",
                KernelArg::I32(i32::from(cfg.metric == Metric::Ip)),
            ),
        ])
    }

    /// The named arguments of the histogram kernels: [`GpuIndexer::select_args`], the
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
        let st = &self.stream;
        let mut named = self.select_args(query, key, s, n_old)?;
        named.extend([
            ("hist_ptr", KernelArg::Ptr(hist.ptr(st))),
            ("histn_ptr", KernelArg::Ptr(histn.ptr(st))),
            ("lvl_ptr", KernelArg::Ptr(self.hist_lvl.ptr(st))),
            ("lut_ptr", KernelArg::Ptr(self.hist_lut.ptr(st))),
            ("bits", i32_arg("pq_bits", self.cfg.pq_bits as usize)?),
        ]);
        Ok(named)
    }

    /// Whether [`SelectPath`] asks for the indexed path (where it applies): under
    /// [`SelectPath::Index`] and [`SelectPath::Auto`] (measured on the H100, NOTES.md,
    /// session 11, `tritonrt run`: large workload 46.1 us against 81.6 pq_hist and 84.6
    /// split; reference 24.2-24.7 against 25.4-25.6 split; S = 8192: 24.5 us in the JIT
    /// harness against 31.6 for pq_select's default variant).
    fn index_wanted(&self) -> bool {
        matches!(
            self.path,
            SelectPath::Index
                | SelectPath::IndexCompanion
                | SelectPath::IndexWfill
                | SelectPath::Auto
        )
    }

    /// Whether an indexed step at `s` has each row's companion CTA write its weights
    /// (one launch; see [`SelectPath::Index`] for when Auto and Index choose it).
    fn companion_fill(&self, ik: &IndexKernels, s: usize) -> bool {
        match self.path {
            SelectPath::IndexCompanion => true,
            SelectPath::IndexWfill => false,
            _ => {
                let rows = self.shape.b * self.shape.h;
                let row_bytes = s * self.cfg.weight_dtype.size_bytes();
                2 * rows <= self.rt.device().sm_count() as usize
                    && (ik.wfill.is_none() || row_bytes <= COMPANION_FILL_MAX_BYTES)
            }
        }
    }

    /// The histogram path's launches for a (non-short) step at `s` with `N_cached =
    /// n_old`: `pq_hist` alone, `pq_thresh` + `pq_emit` (split), or `pq_index` after
    /// `pq_wfill` or alone (indexed: the first flag is true; the second whether the
    /// rows' companion CTAs write the weights); None where the path does not apply or
    /// [`SelectPath`] declines it.
    fn plan_hist(
        &self,
        query: &DeviceTensorRef,
        key: &DeviceTensorRef,
        s: usize,
        n_old: usize,
    ) -> Result<Option<(Vec<Launch>, bool, bool)>> {
        let (Some(k), Some((thresh, emit, tile))) = (&self.kernels.hist, &self.kernels.split)
        else {
            return Ok(None);
        };
        let cfg = &self.cfg;
        let rows = self.shape.b * self.shape.h;
        let n = cfg.n_quantized(s);
        let w0 = cfg.window_start(s);
        // the kernel's quantizing CTAs write the new keys' codes while its row CTAs read
        // the candidates' codes: only where no new key is a candidate
        let applies = n - n_old <= BULK_QUANTIZE_MIN && w0 <= n_old;
        // the split emit's preconditions: every heavy pick between sink and window
        let split_applies = cfg.init_offset >= cfg.sink_eff(s)
            && s - cfg.window_eff(s) >= cfg.init_offset
            && w0 >= cfg.heavy_k(s);
        let index = match &self.kernels.index {
            Some(ix) if applies && self.capc > 0 && self.index_wanted() => {
                // pq_wfill indexes the flat weight_list in i32
                i32::try_from(rows * s).ok().map(|_| ix)
            }
            _ => None,
        };
        if let Some(ik) = index {
            let st = &self.stream;
            let companion = self.companion_fill(ik, s);
            let mut named = self.hist_args(query, key, s, n_old, &self.ihist, &self.ihistn)?;
            named.extend([
                ("bkt_ptr", KernelArg::Ptr(self.bkt.ptr(st))),
                ("mark_ptr", KernelArg::Ptr(self.mark.ptr(st))),
                ("ready_ptr", KernelArg::Ptr(self.ready.ptr(st))),
                ("CAPC", i32_arg("bucket capacity", self.capc)?),
                ("rows", i32_arg("rows", rows)?),
                ("fill", KernelArg::I32(i32::from(companion))),
            ]);
            let ix = if companion { &ik.alone } else { &ik.index };
            let iargs = self.arg_order.args(ix, &named, true)?;
            // Bounds: pq_wfill writes weight elements 0 .. rows x s (ensure_buffers sized
            // weight for that; rows x s < 2^31 checked above), any grid size. pq_index as
            // pq_hist for hist/histn (here ihist/ihistn, new(): rows x HIST_COMBOS, rows),
            // lvl, lut, codes and the outputs; ensure_buffers sized bkt for rows x
            // HIST_COMBOS x capc (the kernel stores slots < CAPC = capc only) and new()
            // the marks for rows x TP (the kernel's constexpr, kept in IndexKernels) and
            // the ready flags for rows. Companion fill: pq_index alone (no programmatic
            // dependency), CTA (r, 0) writes row r's weights (r x s .. (r + 1) x s) and
            // sets ready[r], CTA (r, 1) waits for it before its heavy ones and clears it.
            // Else pq_index is a programmatic dependent of pq_wfill (its variant's
            // launch_pdl) and waits for it before any weight; pq_wfill: one CTA per SM,
            // so each leaves room for a pq_index CTA beside it (sm_80: no pq_wfill, each
            // row CTA writes its own row).
            let mut launches = Vec::with_capacity(2);
            if let (Some(fill), false) = (&ik.wfill, companion) {
                launches.push(Launch {
                    kernel: fill.clone(),
                    grid: [self.rt.device().sm_count().max(1), 1, 1],
                    args: self.arg_order.args(fill, &named, true)?,
                });
            }
            launches.push(Launch {
                kernel: ix.clone(),
                grid: [rows as u32, 2, 1],
                args: iargs,
            });
            return Ok(Some((launches, true, companion)));
        }
        let (wanted, split) = match self.path {
            SelectPath::Chunked => (false, false),
            SelectPath::Hist => (true, false),
            SelectPath::Split
            | SelectPath::Index
            | SelectPath::IndexCompanion
            | SelectPath::IndexWfill => (true, split_applies),
            // measured on the H100 (NOTES.md, sessions 6-8): split wins with fewer rows
            // than SMs (reference: 25.3 vs 32.9 us wall for pq_select, 34.7 for
            // pq_hist), pq_hist with 128 rows of 131k keys (large: 82.6 vs 85.0 us split)
            SelectPath::Auto => {
                let split = split_applies && rows < 64 && n >= 16384;
                (split || (rows >= 64 && n >= 32768), split)
            }
        };
        if !(applies && wanted) {
            return Ok(None);
        }
        let st = &self.stream;
        let mut named = self.hist_args(query, key, s, n_old, &self.hist, &self.histn)?;
        if !split {
            let args = self.arg_order.args(k, &named, false)?;
            // Bounds: new() sized hist (rows x HIST_COMBOS), histn (rows), the level bins
            // (rows x HIST_LEVEL_BINS) and the lookup table (rows x M x K); ensure_buffers
            // sized sparse_list (rows x total), weight (rows x s), codes (cap >= n keys); the
            // kernel reads codes j < max(histn, w0) <= n_old (histn only ever holds an
            // earlier step's w0, or 0 after reset_hist) and writes codes n_old .. n.
            // Grid: CTA (r, 0) is row r, CTA (r, 1) quantizes for row r's KV group (first
            // head of the group only; the others exit at once).
            return Ok(Some((
                vec![Launch {
                    kernel: k.clone(),
                    grid: [rows as u32, 2, 1],
                    args,
                }],
                false,
                false,
            )));
        }
        let parts = n.div_ceil(*tile);
        named.extend([
            ("bnd_ptr", KernelArg::Ptr(self.split_bnd.ptr(st))),
            ("need_ptr", KernelArg::Ptr(self.split_need.ptr(st))),
            ("flag_ptr", KernelArg::Ptr(self.split_flag.ptr(st))),
            ("ctr_ptr", KernelArg::Ptr(self.split_ctr.ptr(st))),
            ("NP", i32_arg("parts per row", parts)?),
        ]);
        // one list for both kernels: each takes the names its signature lists
        let targs = self.arg_order.args(thresh, &named, true)?;
        let eargs = self.arg_order.args(emit, &named, true)?;
        // Bounds: as pq_hist above for hist/histn/lvl/lut, codes and the outputs; new()
        // sized bnd (rows x 2), need (rows) and the ticket counter (1); hist_lut (rows x M x
        // K) is pq_thresh's output and pq_emit's input;
        // ensure_buffers sized the part flags for rows x cdiv(n, TILE) = rows x parts.
        // pq_thresh (grid as pq_hist's) zeroes the flags and the counter; pq_emit's grid
        // is exactly rows x parts CTAs, each taking one ticket < rows x parts.
        let rows_parts = u32::try_from(rows * parts)
            .map_err(|_| Error::invalid("emit grid", format!("{rows} rows x {parts} parts")))?;
        Ok(Some((
            vec![
                Launch {
                    kernel: thresh.clone(),
                    grid: [rows as u32, 2, 1],
                    args: targs,
                },
                Launch {
                    kernel: emit.clone(),
                    grid: [rows_parts, 1, 1],
                    args: eargs,
                },
            ],
            false,
            false,
        )))
    }

    /// Issue one step's launches on the stream.
    fn issue(&self, launches: &[Launch]) -> Result<()> {
        for l in launches {
            // SAFETY: `plan` built these arguments for buffers that `ensure_buffers` sized
            // for this step (see its `Bounds:` comments) and for caller-vouched query and
            // key views; every launch is on this indexer's stream, in order.
            unsafe { l.kernel.launch(&self.stream, l.grid, &l.args)? };
        }
        Ok(())
    }

    /// One decode step at sequence length `s`: quantize keys `N_cached .. s -
    /// init_offset`, select, and write the outputs into the indexer's device buffers
    /// (see [`GpuIndexer::download`]). Asynchronous: nothing waits for the GPU.
    ///
    /// Errors: dtype mismatch, `s - init_offset < N_cached` (the state is ahead of the
    /// sequence), driver/launch errors. Allocation happens only when a buffer must grow.
    pub fn step(
        &mut self,
        query: &DeviceTensorRef,
        key: &DeviceTensorRef,
        s: usize,
        mode: LaunchMode,
    ) -> Result<StepInfo> {
        self.check_tensor("query", query)?;
        self.check_tensor("key", key)?;
        if s == 0 {
            return Err(Error::invalid("seq_len", "S must be >= 1"));
        }
        let short = self.cfg.is_short(s);
        let n = if short {
            self.n_cached
        } else {
            self.cfg.n_quantized(s)
        };
        if !short && n < self.n_cached {
            return Err(Error::invalid(
                "seq_len",
                format!(
                    "S - init_offset = {n} but {} keys are already quantized: the state is ahead of the sequence",
                    self.n_cached
                ),
            ));
        }
        self.ensure_buffers(s)?;
        let n_old = self.n_cached;
        let info = match mode {
            LaunchMode::Launch => {
                let (info, launches) = self.plan(query, key, s, n_old)?;
                self.issue(&launches)?;
                info
            }
            LaunchMode::Graph => self.step_graph(query, key, s, n_old)?,
        };
        self.n_cached = n;
        self.last = Some(info);
        Ok(info)
    }

    /// Graph mode: replay the captured graph when it was captured for this very step;
    /// else, when only `S` / `N_cached` moved (same buffers, same kernels), update the
    /// captured kernel nodes' arguments and grids in place and replay; else capture anew.
    fn step_graph(
        &mut self,
        query: &DeviceTensorRef,
        key: &DeviceTensorRef,
        s: usize,
        n_old: usize,
    ) -> Result<StepInfo> {
        let gkey = GraphKey {
            s,
            query: *query,
            key: *key,
            buffers: self.buffer_ptrs(),
        };
        let drv = |what: &'static str| move |e| crate::device::driver_err(what, e);
        if let Some(c) = &self.graph {
            if c.key == gkey && c.n_old <= n_old {
                c.graph.launch().map_err(drv("replaying the step graph"))?;
                return Ok(c.info);
            }
        }
        let (info, launches) = self.plan(query, key, s, n_old)?;
        if let Some(c) = self.graph.as_mut() {
            let same_kernels = c.nodes.len() == launches.len()
                && c.kernels
                    .iter()
                    .zip(&launches)
                    .all(|(id, l)| id == l.kernel.id());
            if same_kernels
                && c.key.query == gkey.query
                && c.key.key == gkey.key
                && c.key.buffers == gkey.buffers
            {
                let exec = c.graph.cu_graph_exec();
                let updated = launches.iter().zip(&c.nodes).try_for_each(|(l, node)| {
                    // SAFETY: the node was captured from a launch in this graph (a node of
                    // another kernel is refused by update_graph_node); `plan` built the
                    // arguments for buffers sized for this step (its `Bounds:` comments);
                    // the graph is only replayed on this indexer's stream, by this (&mut)
                    // indexer.
                    unsafe { l.kernel.update_graph_node(exec, *node, l.grid, &l.args) }
                });
                if updated.is_ok() {
                    c.key = gkey;
                    c.n_old = n_old;
                    c.info = info;
                    c.graph
                        .launch()
                        .map_err(drv("replaying the updated step graph"))?;
                    return Ok(info);
                }
                // an update the driver refused (or a node of another kernel): capture anew
            }
        }
        self.graph = None;
        self.stream
            .begin_capture(
                cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
            .map_err(drv("beginning graph capture"))?;
        let issued = self.issue(&launches);
        let ended = self
            .stream
            .end_capture(cudarc::driver::sys::CUgraphInstantiate_flags(0));
        issued?;
        let graph = ended
            .map_err(drv("ending graph capture"))?
            .ok_or_else(|| Error::invalid("graph capture", "the captured step graph is empty"))?;
        // SAFETY: the graph was just instantiated and is owned by `graph`.
        let nodes = unsafe { crate::kernel::graph_kernel_nodes(graph.cu_graph())? };
        graph.launch().map_err(drv("launching the step graph"))?;
        self.graph = Some(Captured {
            key: gkey,
            n_old,
            info,
            // a graph whose kernel nodes do not line up with its launches is only replayed
            nodes: if nodes.len() == launches.len() {
                nodes
            } else {
                Vec::new()
            },
            kernels: launches.iter().map(|l| l.kernel.id().to_string()).collect(),
            graph,
        });
        Ok(StepInfo {
            captured: true,
            ..info
        })
    }

    /// Wait for every step issued so far.
    pub fn synchronize(&self) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(|e| crate::device::driver_err("synchronizing the indexer stream", e))
    }

    /// Device addresses of the last step's outputs: `(sparse_list i64 [B, H, total],
    /// sparse_len i64 [B, H], weight_list [B, H, S] in the weight dtype)`. Valid until
    /// the next step on this indexer's stream.
    pub fn output_ptrs(&self) -> (u64, u64, u64) {
        let s = &self.stream;
        (
            self.sparse_list.ptr(s),
            self.sparse_len.ptr(s),
            self.weight.ptr(s),
        )
    }

    /// Copy the last step's outputs and the code state to the host (synchronous).
    ///
    /// Errors: no step has run yet; driver errors.
    pub fn download(&self) -> Result<PqOutput> {
        let info = self
            .last
            .ok_or_else(|| Error::invalid("download", "no step has run on this indexer"))?;
        let (b, h) = (self.shape.b, self.shape.h);
        let rows = b * h;
        let drv = |what: &'static str| move |e| crate::device::driver_err(what, e);
        self.synchronize()?;
        let mut sl = self
            .stream
            .clone_dtoh(self.sparse_list.slice().expect("allocated by step"))
            .map_err(drv("downloading sparse_list"))?;
        sl.truncate(rows * info.total);
        let mut len = self
            .stream
            .clone_dtoh(self.sparse_len.slice().expect("allocated in new"))
            .map_err(drv("downloading sparse_len"))?;
        len.truncate(rows);
        let wb = self.cfg.weight_dtype.size_bytes();
        let mut wraw = self
            .stream
            .clone_dtoh(self.weight.slice().expect("allocated by step"))
            .map_err(drv("downloading weight_list"))?;
        wraw.truncate(rows * info.s * wb);
        let weight_list: Vec<f32> = match self.cfg.weight_dtype {
            DType::F32 => wraw
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            DType::BF16 => wraw
                .chunks_exact(2)
                .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            DType::F16 => wraw
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
        };
        let codes = self.export_codes()?;
        Ok(PqOutput {
            b,
            h,
            h_kv: self.shape.h_kv,
            m: self.cfg.m(),
            s: info.s,
            total: info.total,
            sparse_list: sl,
            sparse_len: len,
            weight_list,
            codes,
            n_cached: self.n_cached,
        })
    }

    /// Poison every output buffer (sparse_list and sparse_len with -7, weight_list with
    /// the byte 0x7f, a NaN-like pattern in every float dtype) so a test can tell written
    /// from unwritten. Synchronous.
    pub fn poison_outputs(&mut self) -> Result<()> {
        let st = self.stream.clone();
        let drv = |what: &'static str| move |e| crate::device::driver_err(what, e);
        if let Some(b) = self.sparse_list.buf.as_mut() {
            let v = vec![-7i64; b.len()];
            st.memcpy_htod(&v, b)
                .map_err(drv("poisoning sparse_list"))?;
        }
        if let Some(b) = self.sparse_len.buf.as_mut() {
            let v = vec![-7i64; b.len()];
            st.memcpy_htod(&v, b).map_err(drv("poisoning sparse_len"))?;
        }
        if let Some(b) = self.weight.buf.as_mut() {
            let v = vec![0x7fu8; b.len()];
            st.memcpy_htod(&v, b)
                .map_err(drv("poisoning weight_list"))?;
        }
        self.synchronize()
    }
}

/// Host inputs uploaded to the device in the layouts the indexer reads: `query
/// [B, H, 1, D]` and `key [B, H_kv, S, D]`, contiguous, in the config's input dtype.
///
/// Only the key rows a step reads (positions `init_offset + N_cached .. S` of every
/// batch and KV head) are copied; the rest of the key buffer is zero. That keeps the
/// large workload's upload at a few MB instead of 8.6 GB.
pub struct DeviceInputs {
    query: CudaSlice<u16>,
    key: CudaSlice<u16>,
    q_ref: DeviceTensorRef,
    k_ref: DeviceTensorRef,
}

/// `v` in `dtype`, as 16-bit words (fp32 values take two words each, little-endian).
fn to_words(v: &[f32], dtype: DType) -> Vec<u16> {
    match dtype {
        DType::F32 => v
            .iter()
            .flat_map(|x| {
                let b = x.to_bits();
                [b as u16, (b >> 16) as u16]
            })
            .collect(),
        DType::BF16 => v
            .iter()
            .map(|&x| half::bf16::from_f32(x).to_bits())
            .collect(),
        DType::F16 => v
            .iter()
            .map(|&x| half::f16::from_f32(x).to_bits())
            .collect(),
    }
}

impl DeviceInputs {
    /// Upload `inputs.query` and the key rows from `init_offset + inputs.n_cached` on
    /// (converted to `dtype`).
    ///
    /// Errors: driver errors (allocation of `B x H_kv x S x D` key elements included).
    pub fn upload(stream: &Arc<CudaStream>, inputs: &PqInputs, cfg: &PqConfig) -> Result<Self> {
        let sh = inputs.shape;
        let dtype = cfg.input_dtype;
        let wpe = dtype.size_bytes() / 2; // 16-bit words per element
        let drv = |what: &'static str| move |e| crate::device::driver_err(what, e);
        let query = stream
            .clone_htod(&to_words(&inputs.query, dtype))
            .map_err(drv("uploading query"))?;
        let mut key = stream
            .alloc_zeros::<u16>(sh.b * sh.h_kv * sh.s * sh.d * wpe)
            .map_err(drv("allocating key"))?;
        let first = (cfg.init_offset + inputs.n_cached).min(sh.s);
        if first < sh.s {
            for bg in 0..sh.b * sh.h_kv {
                let lo = (bg * sh.s + first) * sh.d;
                let hi = (bg * sh.s + sh.s) * sh.d;
                let words = to_words(&inputs.key[lo..hi], dtype);
                let mut view = key.slice_mut(lo * wpe..hi * wpe);
                stream
                    .memcpy_htod(&words, &mut view)
                    .map_err(drv("uploading key rows"))?;
            }
        }
        let (q_sb, q_sh) = ((sh.h * sh.d) as i64, sh.d as i64);
        let (k_sb, k_sh, k_ss) = (
            (sh.h_kv * sh.s * sh.d) as i64,
            (sh.s * sh.d) as i64,
            sh.d as i64,
        );
        let q_ptr = query.device_ptr(stream).0;
        let k_ptr = key.device_ptr(stream).0;
        // SAFETY: both buffers are owned by the returned value, hold the whole
        // contiguous tensors in `dtype` (query fully written, key rows from
        // init_offset + n_cached written, the rest zero), and live as long as it does.
        let (q_ref, k_ref) = unsafe {
            (
                DeviceTensorRef::new(q_ptr, dtype, [q_sb, q_sh, 0]),
                DeviceTensorRef::new(k_ptr, dtype, [k_sb, k_sh, k_ss]),
            )
        };
        Ok(DeviceInputs {
            query,
            key,
            q_ref,
            k_ref,
        })
    }

    /// The query view.
    pub fn query(&self) -> &DeviceTensorRef {
        &self.q_ref
    }

    /// The key view.
    pub fn key(&self) -> &DeviceTensorRef {
        &self.k_ref
    }

    /// Bytes held on the device.
    pub fn bytes(&self) -> usize {
        2 * (self.query.len() + self.key.len())
    }
}

impl GpuIndexer {
    /// Forget quantized keys past `n` (`N_cached = min(N_cached, n)`); their codes are
    /// rewritten by the next step. No copy. Used to replay the same step, as the upstream
    /// benchmark does (every call quantizes one new key).
    pub fn rewind(&mut self, n: usize) {
        self.n_cached = self.n_cached.min(n);
    }

    /// Allocate every buffer a step at `s` needs, without running it (so outputs can be
    /// poisoned before the first step, and so the first timed step allocates nothing).
    pub fn prepare(&mut self, s: usize) -> Result<()> {
        self.ensure_buffers(s)
    }
}

/// Open a [`Runtime`] on CUDA device `ordinal` with the artifacts in `ptx_cache` and the
/// user cubin cache (`TRITONRT_CACHE_DIR`). `Ok(None)` when this machine has no CUDA
/// driver or no such device (the caller falls back to the CPU, saying so); the reason is
/// in the returned string.
///
/// Errors: a driver that loads but fails, a bad ptx_cache, cache directory errors.
pub fn open_runtime(
    ordinal: usize,
    ptx_cache: &std::path::Path,
) -> Result<std::result::Result<Arc<Runtime>, String>> {
    if let Err(e) = crate::device::probe_driver() {
        return Ok(Err(e.to_string()));
    }
    let count = crate::device::Device::count()?;
    if ordinal >= count {
        return Ok(Err(format!(
            "no CUDA device {ordinal} (this machine has {count})"
        )));
    }
    let device = crate::device::Device::new(ordinal)?;
    let store = crate::artifact::ArtifactStore::open(ptx_cache)?;
    let cache = crate::jit::CubinCache::from_env()?;
    Ok(Ok(Runtime::new(device, store, cache)))
}

/// Wall-clock statistics of repeated steps, in microseconds (host timer around step +
/// synchronize).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepTiming {
    /// Median.
    pub median_us: f64,
    /// 10th percentile.
    pub p10_us: f64,
    /// 90th percentile.
    pub p90_us: f64,
    /// Number of timed steps.
    pub samples: usize,
}

impl StepTiming {
    /// Statistics of `samples_us` (sorted in place). Panics on an empty slice.
    pub fn from_samples(samples_us: &mut [f64]) -> Self {
        samples_us.sort_by(f64::total_cmp);
        let q = |p: f64| samples_us[((samples_us.len() - 1) as f64 * p).round() as usize];
        StepTiming {
            median_us: q(0.5),
            p10_us: q(0.1),
            p90_us: q(0.9),
            samples: samples_us.len(),
        }
    }
}

/// What [`execute`] produced.
#[derive(Debug)]
pub struct Execution {
    /// The first step's outputs (plain launches, outputs poisoned before), on the host.
    pub output: PqOutput,
    /// Whether the CUDA-graph step gave bit-identical outputs (sparse_list,
    /// sparse_len, weight_list, codes).
    pub graph_matches: bool,
    /// Step timing with plain launches (None when not timed).
    pub launch_timing: Option<StepTiming>,
    /// Step timing with graph replay (None when not timed).
    pub graph_timing: Option<StepTiming>,
    /// GPU time per step with plain launches, CUDA events (None unless asked for).
    pub launch_gpu: Option<StepTiming>,
    /// GPU time per step with graph replay, CUDA events (None unless asked for).
    pub graph_gpu: Option<StepTiming>,
    /// Variant id of the select kernel.
    pub select_variant: String,
    /// Whether the steps ran the histogram select path (`pq_hist`, or split).
    pub hist_path: bool,
    /// Whether they ran it split (`pq_thresh` + `pq_emit`).
    pub split_path: bool,
    /// Whether they ran it indexed (`pq_index`, after `pq_wfill` or alone).
    pub index_path: bool,
    /// Whether the indexed step was one launch, the rows' companion CTAs writing the
    /// weights ([`SelectPath::IndexCompanion`]).
    pub index_companion: bool,
    /// Name of the GPU.
    pub device_name: String,
}

impl Execution {
    /// What selected the heavy keys, for reports: the histogram path's kernels, else the
    /// select kernel's variant id.
    pub fn select_kernel(&self) -> &str {
        if self.index_path && self.index_companion {
            "pq_index (histogram path, indexed, weights by companion CTAs)"
        } else if self.index_path {
            "pq_wfill + pq_index (histogram path, indexed)"
        } else if self.split_path {
            "pq_thresh + pq_emit (histogram path, split)"
        } else if self.hist_path {
            "pq_hist (histogram path)"
        } else {
            &self.select_variant
        }
    }
}

/// Upload `inputs`, run one step with plain launches (outputs poisoned first), download
/// it, run the same step again as a captured CUDA graph and compare, then (when
/// `timed_steps > 0`) time `timed_steps` steps of each mode after a warm-up, rewinding
/// the state before each so every step quantizes the same new keys, as the upstream
/// benchmark does; with `gpu_time`, also the GPU time of each mode (CUDA events).
///
/// Errors: anything the indexer reports.
pub fn execute(
    rt: &Arc<Runtime>,
    cfg: &PqConfig,
    inputs: &PqInputs,
    select_variant: Option<&str>,
    timed_steps: usize,
    gpu_time: bool,
) -> Result<Execution> {
    execute_with_path(
        rt,
        cfg,
        inputs,
        select_variant,
        SelectPath::Auto,
        timed_steps,
        gpu_time,
    )
}

/// [`execute`] with the select path chosen by the caller.
pub fn execute_with_path(
    rt: &Arc<Runtime>,
    cfg: &PqConfig,
    inputs: &PqInputs,
    select_variant: Option<&str>,
    path: SelectPath,
    timed_steps: usize,
    gpu_time: bool,
) -> Result<Execution> {
    let sh = inputs.shape;
    let stream = rt.device().new_stream()?;
    let mut ix = GpuIndexer::new(
        rt.clone(),
        stream.clone(),
        *cfg,
        sh,
        &inputs.centroids,
        inputs.phi.as_deref(),
        select_variant,
    )?;
    ix.set_select_path(path);
    ix.import_codes(&inputs.codes, inputs.n_cached)?;
    let dev = DeviceInputs::upload(&stream, inputs, cfg)?;
    ix.prepare(sh.s)?;
    ix.poison_outputs()?;
    let first = ix.step(dev.query(), dev.key(), sh.s, LaunchMode::Launch)?;
    let output = ix.download()?;

    ix.rewind(inputs.n_cached);
    ix.poison_outputs()?;
    ix.step(dev.query(), dev.key(), sh.s, LaunchMode::Graph)?;
    let g = ix.download()?;
    let graph_matches = g.sparse_list == output.sparse_list
        && g.sparse_len == output.sparse_len
        && g.weight_list
            .iter()
            .map(|x| x.to_bits())
            .eq(output.weight_list.iter().map(|x| x.to_bits()))
        && g.codes == output.codes;

    // wall-clock (host timer around step + synchronize), then GPU time (CUDA events
    // around each step) in a separate loop, so event records never sit inside the
    // host-timed region
    let events = (rt.device().new_event(true)?, rt.device().new_event(true)?);
    let drv = |what: &'static str| move |e| crate::device::driver_err(what, e);
    let mut time = |mode: LaunchMode, gpu: bool| -> Result<Option<StepTiming>> {
        if timed_steps == 0 {
            return Ok(None);
        }
        let warmup = (timed_steps / 10).clamp(3, 50);
        let mut samples = Vec::with_capacity(timed_steps);
        for i in 0..warmup + timed_steps {
            ix.rewind(inputs.n_cached);
            let t = std::time::Instant::now();
            if gpu {
                events
                    .0
                    .record(&stream)
                    .map_err(drv("recording an event"))?;
            }
            ix.step(dev.query(), dev.key(), sh.s, mode)?;
            if gpu {
                events
                    .1
                    .record(&stream)
                    .map_err(drv("recording an event"))?;
            }
            ix.synchronize()?;
            if i >= warmup {
                samples.push(if gpu {
                    events
                        .0
                        .elapsed_ms(&events.1)
                        .map_err(drv("reading an event"))? as f64
                        * 1e3
                } else {
                    t.elapsed().as_secs_f64() * 1e6
                });
            }
        }
        Ok(Some(StepTiming::from_samples(&mut samples)))
    };
    let launch_timing = time(LaunchMode::Launch, false)?;
    let graph_timing = time(LaunchMode::Graph, false)?;
    let (launch_gpu, graph_gpu) = if gpu_time {
        (
            time(LaunchMode::Launch, true)?,
            time(LaunchMode::Graph, true)?,
        )
    } else {
        (None, None)
    };
    Ok(Execution {
        output,
        graph_matches,
        launch_timing,
        graph_timing,
        launch_gpu,
        graph_gpu,
        select_variant: ix.select_variant().to_string(),
        hist_path: first.hist,
        split_path: first.split,
        index_path: first.index,
        index_companion: first.companion,
        device_name: rt.device().name().to_string(),
    })
}

/// Bytes one step must move through device memory at the least, each input read once
/// and each output written once: u8 codes of every quantized key (`B x H_kv x M x n`),
/// `weight_list` (`B x H x S`, weight dtype), `sparse_list` + `sparse_len` (i64), the
/// query, the centroids, and the new keys read and their codes written.
pub fn memory_floor_bytes(cfg: &PqConfig, shape: &Shape, n_cached: usize) -> u64 {
    let (b, h, h_kv, s, d) = (shape.b, shape.h, shape.h_kv, shape.s, shape.d);
    let rows = (b * h) as u64;
    let qb = cfg.input_dtype.size_bytes() as u64;
    let wb = cfg.weight_dtype.size_bytes() as u64;
    if cfg.is_short(s) {
        return rows * s as u64 * (8 + wb) + rows * 8;
    }
    let m = cfg.m() as u64;
    let n = cfg.n_quantized(s) as u64;
    let new = n.saturating_sub(n_cached as u64);
    let codes = (b * h_kv) as u64 * m * n;
    let weight = rows * s as u64 * wb;
    let lists = rows * cfg.total(s) as u64 * 8 + rows * 8;
    let query = rows * d as u64 * qb;
    let cents = (b * h_kv) as u64 * m * cfg.k_centroids() as u64 * cfg.d_c(d) as u64 * 4;
    let keys = (b * h_kv) as u64 * new * (d as u64 * qb + m);
    codes + weight + lists + query + cents + keys
}

/// Device copy bandwidth in bytes per second (bytes read + bytes written), from the
/// median of 10 device-to-device copies of `bytes` bytes timed with CUDA events.
///
/// Errors: allocation or driver errors.
pub fn copy_bandwidth(rt: &Runtime, stream: &Arc<CudaStream>, bytes: usize) -> Result<f64> {
    let drv = |what: &'static str| move |e| crate::device::driver_err(what, e);
    let src = stream
        .alloc_zeros::<u8>(bytes)
        .map_err(drv("allocating copy source"))?;
    let mut dst = stream
        .alloc_zeros::<u8>(bytes)
        .map_err(drv("allocating copy target"))?;
    let (e0, e1) = (rt.device().new_event(true)?, rt.device().new_event(true)?);
    let mut ms = Vec::new();
    for i in 0..13 {
        e0.record(stream).map_err(drv("recording an event"))?;
        stream
            .memcpy_dtod(&src, &mut dst)
            .map_err(drv("device copy"))?;
        e1.record(stream).map_err(drv("recording an event"))?;
        e1.synchronize().map_err(drv("waiting for an event"))?;
        if i >= 3 {
            ms.push(e0.elapsed_ms(&e1).map_err(drv("reading an event"))? as f64);
        }
    }
    ms.sort_by(f64::total_cmp);
    Ok(2.0 * bytes as f64 / (ms[ms.len() / 2] * 1e-3))
}

/// Everything `tritonrt bench` measures for one shape.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchResult {
    /// The shape timed.
    pub shape: Shape,
    /// Wall-clock per step with plain launches (host timer around step + synchronize).
    pub launch_wall: StepTiming,
    /// Wall-clock per step with CUDA-graph replay.
    pub graph_wall: StepTiming,
    /// GPU time per step with plain launches (CUDA events around each step).
    pub launch_gpu: StepTiming,
    /// GPU time per step with graph replay (CUDA events around each replay).
    pub graph_gpu: StepTiming,
    /// [`memory_floor_bytes`] of the step.
    pub floor_bytes: u64,
    /// Select-kernel variant used.
    pub select_variant: String,
}

/// Time `steps` steps (after a warm-up) of `inputs` in both launch modes, wall-clock and
/// GPU time (CUDA events), rewinding the state before each so every step quantizes the
/// same new keys (the upstream benchmark's protocol). The output of the graph step is
/// checked against the plain step first (bit-identical).
///
/// Errors: the indexer's errors; a graph/launch output mismatch.
pub fn bench_shape(
    rt: &Arc<Runtime>,
    cfg: &PqConfig,
    inputs: &PqInputs,
    select_variant: Option<&str>,
    steps: usize,
) -> Result<BenchResult> {
    let ex = execute(rt, cfg, inputs, select_variant, steps.max(1), true)?;
    if !ex.graph_matches {
        return Err(Error::invalid(
            "graph replay",
            "the CUDA-graph step's outputs differ from the plain-launch step's",
        ));
    }
    let timed = |t: Option<StepTiming>| t.expect("execute times every mode when steps > 0");
    Ok(BenchResult {
        shape: inputs.shape,
        launch_wall: timed(ex.launch_timing),
        graph_wall: timed(ex.graph_timing),
        launch_gpu: timed(ex.launch_gpu),
        graph_gpu: timed(ex.graph_gpu),
        floor_bytes: memory_floor_bytes(cfg, &inputs.shape, inputs.n_cached),
        select_variant: ex.select_kernel().to_string(),
    })
}
