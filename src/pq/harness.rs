//! The execute / bench harness around [`GpuIndexer`]: host inputs uploaded to the
//! device ([`DeviceInputs`]), one step checked against its CUDA-graph replay and timed
//! ([`execute`], [`execute_with_path`]), and `tritonrt bench`'s measurements
//! ([`bench_shape`], [`memory_floor_bytes`], [`copy_bandwidth`]).

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};

use crate::driver::DeviceBuf;
use crate::error::{Error, Result};
use crate::pq::config::{DType, PqConfig, Shape};
use crate::pq::indexer::{GpuIndexer, LaunchMode};
use crate::pq::launch::DeviceTensorRef;
use crate::pq::memory::StateBytes;
use crate::pq::plan::{SelectPath, StepKind};
use crate::pq::ragged::RaggedInputs;
use crate::pq::reference::PqOutput;
use crate::pq::variants::KernelChoice;
use crate::pq::workload::PqInputs;
use crate::runtime::Runtime;
use crate::tune::choice::VariantChoice;

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
pub(crate) fn to_words(v: &[f32], dtype: DType) -> Vec<u16> {
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
        Self::upload_from(stream, inputs, cfg, cfg.init_offset + inputs.n_cached)
    }

    /// [`DeviceInputs::upload`] for a ragged batch: the key rows from `init_offset +
    /// min_b N_cached[b]` on, the first any entry reads.
    ///
    /// Errors: driver errors.
    pub fn upload_ragged(
        stream: &Arc<CudaStream>,
        x: &RaggedInputs,
        cfg: &PqConfig,
    ) -> Result<Self> {
        let first = cfg.init_offset + x.n_cached.iter().copied().min().unwrap_or(0);
        Self::upload_from(stream, &x.inputs, cfg, first)
    }

    /// [`DeviceInputs::upload`] copying the key rows from position `first` on (a ragged
    /// batch reads from `init_offset + min_b n_cached[b]`); the rest of the key buffer is
    /// zero.
    ///
    /// Errors: driver errors.
    pub fn upload_from(
        stream: &Arc<CudaStream>,
        inputs: &PqInputs,
        cfg: &PqConfig,
        first: usize,
    ) -> Result<Self> {
        let sh = inputs.shape;
        let dtype = cfg.input_dtype;
        let wpe = dtype.size_bytes() / 2; // 16-bit words per element
        let drv = |what: &'static str| move |e| crate::driver::device::driver_err(what, e);
        let query = stream
            .clone_htod(&to_words(&inputs.query, dtype))
            .map_err(drv("uploading query"))?;
        let mut key = stream
            .alloc_zeros::<u16>(sh.b * sh.h_kv * sh.s * sh.d * wpe)
            .map_err(drv("allocating key"))?;
        let first = first.min(sh.s);
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
        let q_ref = DeviceTensorRef::new(DeviceBuf::of(&query, stream), dtype, [q_sb, q_sh, 0])?;
        let k_ref = DeviceTensorRef::new(DeviceBuf::of(&key, stream), dtype, [k_sb, k_sh, k_ss])?;
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
    if let Err(e) = crate::driver::device::probe_driver() {
        return Ok(Err(e.to_string()));
    }
    let count = crate::driver::device::Device::count()?;
    if ordinal >= count {
        return Ok(Err(format!(
            "no CUDA device {ordinal} (this machine has {count})"
        )));
    }
    Ok(Ok(Runtime::open(
        crate::driver::device::Device::new(ordinal)?,
        ptx_cache,
    )?))
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
    /// The kernels the first step launched, in launch order, each with the variant that
    /// ran and where it came from (override, tuning table, manifest default).
    pub kernels: Vec<VariantChoice>,
    /// Whether the steps ran the histogram select path (`pq_hist`, or split).
    pub hist_path: bool,
    /// Whether they ran it split (`pq_thresh` + `pq_emit`).
    pub split_path: bool,
    /// Whether they ran the radix-select split path (`pq_rsel`, `pq_emit`).
    pub range_path: bool,
    /// Whether they ran it indexed (`pq_index`, after `pq_wfill` or alone).
    pub index_path: bool,
    /// Whether the indexed step was one launch, the rows' companion CTAs writing the
    /// weights ([`SelectPath::IndexCompanion`]).
    pub index_companion: bool,
    /// Whether `pq_quant` quantized the new keys before the select kernel.
    pub bulk_quantize: bool,
    /// The first step's kind (the flags above are derived from it).
    pub kind: StepKind,
    /// The indexer's device bytes after the last step, by group
    /// ([`GpuIndexer::memory`]).
    pub state: StateBytes,
    /// The outputs of the last timed step (a graph replay), on the host; only from
    /// [`bench_shape`] (None from [`execute`] and [`execute_with_path`]).
    pub last_output: Option<PqOutput>,
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
        } else if self.range_path {
            "pq_rsel + pq_emit (radix-select split path)"
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
    choice: &KernelChoice,
    timed_steps: usize,
    gpu_time: bool,
) -> Result<Execution> {
    execute_with_path(
        rt,
        cfg,
        inputs,
        choice,
        SelectPath::Auto,
        None,
        timed_steps,
        gpu_time,
    )
}

/// [`execute`] with the select path chosen by the caller, and the new-key count above
/// which `pq_quant` runs first (`bulk_min`; None: the default,
/// [`crate::pq::plan::BULK_QUANTIZE_MIN`]).
// the knobs a measurement sets one by one (path, quantize threshold, steps, GPU timing)
#[allow(clippy::too_many_arguments)]
pub fn execute_with_path(
    rt: &Arc<Runtime>,
    cfg: &PqConfig,
    inputs: &PqInputs,
    choice: &KernelChoice,
    path: SelectPath,
    bulk_min: Option<usize>,
    timed_steps: usize,
    gpu_time: bool,
) -> Result<Execution> {
    let knobs = Knobs {
        path,
        bulk_min,
        keep_last: false,
    };
    run_steps(rt, cfg, inputs, choice, &knobs, timed_steps, gpu_time)
}

/// The settings of [`run_steps`] that [`execute_with_path`] and [`bench_shape`] choose.
struct Knobs {
    path: SelectPath,
    bulk_min: Option<usize>,
    /// Download the last timed step's outputs ([`Execution::last_output`]).
    keep_last: bool,
}

/// [`execute_with_path`]'s body.
fn run_steps(
    rt: &Arc<Runtime>,
    cfg: &PqConfig,
    inputs: &PqInputs,
    choice: &KernelChoice,
    knobs: &Knobs,
    timed_steps: usize,
    gpu_time: bool,
) -> Result<Execution> {
    let (path, bulk_min) = (knobs.path, knobs.bulk_min);
    let sh = inputs.shape;
    let stream = rt.device().new_stream()?;
    let mut ix = GpuIndexer::new(
        rt.clone(),
        stream.clone(),
        *cfg,
        sh,
        &inputs.centroids,
        inputs.phi.as_deref(),
        choice,
    )?;
    ix.set_select_path(path);
    if let Some(n) = bulk_min {
        ix.set_bulk_quantize_min(n);
    }
    ix.import_codes(&inputs.codes, inputs.n_cached)?;
    let dev = DeviceInputs::upload(&stream, inputs, cfg)?;
    ix.prepare(sh.s)?;
    let kernels = ix.step_kernels(&ix.plan(sh.s)?, dev.key());
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
    let drv = |what: &'static str| move |e| crate::driver::device::driver_err(what, e);
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
    let last_output = if knobs.keep_last && timed_steps > 0 {
        Some(ix.download()?)
    } else {
        None
    };
    Ok(Execution {
        output,
        graph_matches,
        launch_timing,
        graph_timing,
        launch_gpu,
        graph_gpu,
        select_variant: ix.select_variant().to_string(),
        kernels,
        hist_path: first.hist,
        split_path: first.split,
        range_path: first.range,
        index_path: first.index,
        index_companion: first.companion,
        bulk_quantize: first.bulk_quantize,
        kind: first.kind,
        state: ix.memory(),
        last_output,
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
    let drv = |what: &'static str| move |e| crate::driver::device::driver_err(what, e);
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
    /// The kernels the step launched, in launch order, each with its variant and origin.
    pub kernels: Vec<VariantChoice>,
    /// The step's kind (the same for every timed step: each repeats the first).
    pub kind: StepKind,
    /// Whether `pq_quant` quantized the new keys before the select kernel.
    pub bulk_quantize: bool,
    /// The indexer's device bytes after the timed steps, by group (bytes).
    pub state: StateBytes,
    /// The outputs of the last timed step (a graph replay), on the host, for a check
    /// against the CPU reference ([`crate::pq::check()`] with the same inputs).
    pub last_output: PqOutput,
}

/// Time `steps` steps (after a warm-up) of `inputs` in both launch modes, wall-clock and
/// GPU time (CUDA events), rewinding the state before each so every step quantizes the
/// same new keys (the upstream benchmark's protocol). The output of the graph step is
/// checked against the plain step first (bit-identical); the last timed step's outputs
/// are downloaded afterwards ([`BenchResult::last_output`]).
///
/// Errors: the indexer's errors; a graph/launch output mismatch.
pub fn bench_shape(
    rt: &Arc<Runtime>,
    cfg: &PqConfig,
    inputs: &PqInputs,
    choice: &KernelChoice,
    steps: usize,
) -> Result<BenchResult> {
    let knobs = Knobs {
        path: SelectPath::Auto,
        bulk_min: None,
        keep_last: true,
    };
    let mut ex = run_steps(rt, cfg, inputs, choice, &knobs, steps.max(1), true)?;
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
        kernels: std::mem::take(&mut ex.kernels),
        kind: ex.kind,
        bulk_quantize: ex.bulk_quantize,
        state: ex.state,
        last_output: ex
            .last_output
            .take()
            .expect("run_steps keeps the last output when asked"),
    })
}
