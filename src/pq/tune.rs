//! The GPU timing backend: where the runtime (`device` + `kernel` + `artifact`) meets the
//! tuner.
//!
//! [`gpu_targets`] opens a [`Runtime`] on the requested device and builds one
//! [`TuneTarget`] per (workload, kernel). Each target
//!
//! - takes the kernel's variants usable on the device from the verified manifest as a
//!   [`CandidateSet`] ([`candidate_set`]: the variants of the arch the manifest default
//!   for this device was compiled for, so sm_90a variants on cc 9.0 and the portable
//!   sm_80 ones elsewhere; `artifact_sha256` is the sha256 of the cubin or PTX that is
//!   actually loaded);
//! - computes its bucket with [`bucket_for`] (decode features: alignment 1, see
//!   [`crate::tune::bucket`]);
//! - allocates, at its first use (so a session of many targets holds the memory of one),
//!   [`input_sets_for`]`(bytes per launch, L2 size)` seeded standard-normal / uniform
//!   input sets, never all zeros, and poisons outputs (NaN, -7) before each checked run;
//! - runs its check on the first and the last input set; the last one has an odd number
//!   of keys `n` (one less than the workload's when that is even), so a variant that
//!   would only be valid for aligned `n` fails the check, as the decode bucket
//!   (`align1`) requires;
//! - times with CUDA events on one stream: warm-up, then one event pair per sample around
//!   `launches_per_sample` back-to-back launches rotating over the input sets, no host
//!   synchronization between samples (so the queue stays ahead of the GPU), one
//!   synchronization at the end.
//!
//! The kernels (`kernels_triton/pq_score.py`, `kernels_triton/pq_select.py`):
//!
//! - `pq_score_kernel_v6`: the upstream scoring contract. fp32 query `[B, H, M, d_s]`,
//!   fp32 centroids `[B, H, M, K, d_s]`, int64 codes in the upstream layout `[B, N, H, M]`
//!   seen as `[B, H, M, N]` through strides, fp32 scores `[B, H, N]`; grid
//!   `(B * H * cdiv(n, BLOCK_KEYS),)`. A GQA workload (`H_kv < H`) is tuned on tensors
//!   expanded to `H` heads (the per-head stride view only exists for `G == 1`); the kernel
//!   does the same work either way. Outputs are compared with [`compare_f32`]
//!   (rtol [`SCORE_RTOL`], atol [`SCORE_ATOL`]: variants sum in different orders).
//! - `pq_score_lut.q_<qt>`: the same scores from the runtime's u8 code state
//!   `[B, H_kv, M, cap]` through a per-head lookup table; scores `[B*H, n]`; grid
//!   `(cdiv(n, BLOCK), B*H)`. Compared like v6.
//! - `pq_select.h<K_PAD>.q_<qt>.w_<wt>`: the decode step's select kernel, tuned through
//!   [`GpuIndexer`] with `select_variant = Some(id)`: each step quantizes one new key and
//!   selects, so a "launch" is one whole decode step (CUDA-graph replay of the step, which
//!   is one select-kernel launch, as `tritonrt run`/`bench` issue it). Outputs
//!   (`sparse_list`, `sparse_len`, `weight_list`, codes) must equal the default variant's
//!   exactly; if they do not, the spec's rule ([`crate::pq::check()`]) decides, since a
//!   variant may order a near-tie differently (counted in the entry's workload text).
//!
//! [`tuned_select_variant`] is the launch-time side: the tuned select variant for a
//! config and shape from the default tuning table, if a current entry exists.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};
use rand::rngs::SmallRng;
use rand::{Rng, RngCore, SeedableRng};
use rand_distr::StandardNormal;

use crate::abi::{arg_positions, KernelArg};
use crate::artifact::{ArgType, ArtifactStore, Dtype, Variant};
use crate::driver::device::Device;
use crate::driver::{DeviceBuf, DeviceDtype, Kernel};
use crate::error::{Error, Result};
use crate::pq::gpu::{select_kernel_name, DeviceTensorRef, GpuIndexer, LaunchMode};
use crate::pq::{DType, PqConfig, PqInputs, PqOutput, Shape};
use crate::runtime::Runtime;
use crate::tune::bucket::{align_of, bucket_for, ShapeBucket, ShapeFeatures, Workload};
use crate::tune::candidate::{Candidate, CandidateSet};
use crate::tune::procedure::TuneTarget;
use crate::tune::procedure::{compare_exact, compare_f32, input_sets_for, OutputCheck, TimingPlan};
use crate::tune::table::{DeviceKey, SelectionSource, TuningTable};

/// The upstream scoring kernel's logical name.
pub const SCORE_V6: &str = "pq_score_kernel_v6";
/// Prefix of the lookup-table scoring kernels (`pq_score_lut.q_<qt>`).
pub const SCORE_LUT_PREFIX: &str = "pq_score_lut.q_";
/// Prefix of the select kernels (`pq_select.h<K_PAD>.q_<qt>.w_<wt>`).
pub const SELECT_PREFIX: &str = "pq_select.h";
/// Relative tolerance when comparing a scoring variant's fp32 scores with the default's.
pub const SCORE_RTOL: f32 = 1e-4;
/// Absolute tolerance (score units) for the same comparison: scores of standard-normal
/// inputs are sums of `D = 128` products (magnitude ~10); summing in another order moves
/// them by ~1e-5, a wrong variant by O(1).
pub const SCORE_ATOL: f32 = 1e-3;
/// L2 size assumed when the driver does not report one, bytes (H100: 50 MB).
pub const DEFAULT_L2_BYTES: u64 = 50 * 1024 * 1024;
/// Seed of the tuning inputs when the request gives none.
pub const DEFAULT_SEED: u64 = 0x7475_6e65;

/// What `tritonrt autotune` asks the GPU backend for.
#[derive(Debug, Clone)]
pub struct GpuRequest {
    /// CUDA device ordinal.
    pub device: usize,
    /// The ptx_cache directory holding `manifest.json`.
    pub ptx_cache: PathBuf,
    /// Logical kernel names to tune; empty means the tunable kernels of each workload
    /// ([`default_kernels`]). `pq_select` and `pq_score_lut` are accepted as shorthands
    /// for the workload's select kernel and `pq_score_lut.q_fp32`.
    pub kernels: Vec<String>,
    /// Workloads to tune for (one bucket per kernel and workload).
    pub workloads: Vec<Workload>,
    /// Seed of the generated inputs.
    pub seed: u64,
}

/// The GPU backend's answer: the device identity and one target per kernel and bucket.
pub struct GpuSession {
    /// The runtime the targets launch on.
    pub runtime: Arc<Runtime>,
    /// The device the targets time on (keys the table entries).
    pub device: DeviceKey,
    /// One target per (workload, kernel): workloads in request order, kernels in request
    /// order within each. Targets allocate their inputs at first use and free them when
    /// dropped, so tune and drop them one at a time.
    pub targets: Vec<Box<dyn TuneTarget>>,
}

impl std::fmt::Debug for GpuSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuSession")
            .field("device", &self.device)
            .field("targets", &self.targets.len())
            .finish()
    }
}

/// The table key of a device: name, arch and driver version as the driver reports them.
pub fn device_key(dev: &Device) -> DeviceKey {
    DeviceKey::new(
        dev.name(),
        dev.arch(),
        u32::try_from(dev.driver_version()).unwrap_or(0),
    )
}

/// The device's L2 cache size in bytes ([`DEFAULT_L2_BYTES`] if the driver does not say).
pub fn l2_bytes(dev: &Device) -> u64 {
    dev.context()
        .attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)
        .ok()
        .filter(|&v| v > 0)
        .map_or(DEFAULT_L2_BYTES, |v| v as u64)
}

/// The sha256 of the artifact that is loaded for `v` on a device of compute capability
/// `cc`: the cubin when it was built for exactly this arch, else the PTX (JIT).
fn artifact_sha(v: &Variant, cc: (u32, u32)) -> String {
    match &v.cubin {
        Some(c) if v.cubin_matches(cc) => c.sha256.clone(),
        _ => v.ptx.sha256.clone(),
    }
}

/// The competing variants of logical kernel `kernel` on a device of compute capability
/// `cc`: every variant of the arch that the manifest's default for this device
/// ([`ArtifactStore::select_for_device`]) was compiled for, usable on `cc`, with that
/// default as the default candidate.
///
/// # Errors
///
/// [`Error::Invalid`] when the manifest has no variant of `kernel` (naming the tunable
/// kernels it does have), [`Error::NoVariantForDevice`], [`Error::TuneCandidates`].
pub fn candidate_set(store: &ArtifactStore, kernel: &str, cc: (u32, u32)) -> Result<CandidateSet> {
    if store.variants(kernel).is_empty() {
        return Err(Error::invalid(
            "kernel",
            format!(
                "{kernel} is not in {}; tunable kernels there: {}",
                store.manifest_path().display(),
                tunable_kernels(store).join(", ")
            ),
        ));
    }
    let default = store.select_for_device(kernel, cc)?;
    let candidates: Vec<Candidate> = store
        .variants(kernel)
        .into_iter()
        .filter(|v| v.arch == default.arch && v.usable_on(cc))
        .map(|v| {
            Candidate::new(
                v.id.clone(),
                v.kernel.clone(),
                v.source_hash.clone(),
                artifact_sha(v, cc),
                v.id == default.id,
            )
        })
        .collect();
    CandidateSet::new(kernel, candidates)
}

/// The logical kernels in `store` that this backend can tune (sorted, distinct).
pub fn tunable_kernels(store: &ArtifactStore) -> Vec<String> {
    let mut names: Vec<String> = store
        .all_variants()
        .iter()
        .map(|v| v.kernel.clone())
        .filter(|k| kind_of(k).is_some())
        .collect();
    names.sort();
    names.dedup();
    names
}

/// The indexer config of a tuning workload: the reference config (euclidean, fp32 query,
/// key and weights) with the workload's sink, window, heavy, init_offset, M and bits.
pub fn pq_config_for(w: &Workload) -> PqConfig {
    PqConfig {
        sink_size: w.sink as usize,
        window_size: w.window as usize,
        heavy_size: w.heavy as usize,
        init_offset: w.init_offset as usize,
        pq_group_factor: w.subvectors as usize,
        pq_bits: w.bits,
        ..PqConfig::reference_workload()
    }
}

/// The step shape of a tuning workload.
pub fn shape_for(w: &Workload) -> Shape {
    Shape {
        b: w.batch as usize,
        h: w.heads as usize,
        h_kv: w.kv_heads as usize,
        s: w.seq_len as usize,
        d: w.head_dim as usize,
    }
}

/// The kernels tuned for workload `w` when none are named: `pq_score_kernel_v6`, the
/// select kernel `w`'s config uses (fp32 query and weights), and `pq_score_lut.q_fp32`.
///
/// # Errors
///
/// `heavy` above the compiled top-k widths ([`select_kernel_name`]).
pub fn default_kernels(w: &Workload) -> Result<Vec<String>> {
    Ok(vec![
        SCORE_V6.to_string(),
        select_kernel_name(&pq_config_for(w))?,
        format!("{SCORE_LUT_PREFIX}fp32"),
    ])
}

/// The bucket of a select-kernel launch: kernel `select_kernel_name(cfg)`, dtypes
/// `[query, weights]`, decode features (rows `B*H`, `n = S - init_offset`, alignment 1,
/// `d_s`, `K`, `heavy`). The same function serves tuning and lookup, so the two agree.
///
/// # Errors
///
/// As [`select_kernel_name`] and [`bucket_for`].
pub fn select_bucket(cfg: &PqConfig, shape: &Shape, arch: u32) -> Result<ShapeBucket> {
    let name = select_kernel_name(cfg)?;
    bucket_for(
        &name,
        &[cfg.input_dtype.as_str(), cfg.weight_dtype.as_str()],
        arch,
        &ShapeFeatures::decode(
            (shape.b * shape.h) as u64,
            cfg.n_quantized(shape.s) as u64,
            cfg.d_sub(shape.d) as u32,
            cfg.k_centroids() as u32,
            cfg.heavy_size as u32,
        ),
    )
}

/// The bucket of a scoring kernel (`pq_score_kernel_v6`, `pq_score_lut.q_<qt>`) for
/// workload `w`: dtypes `[dtype]`, decode features with no top-k (`heavy = 0`).
///
/// # Errors
///
/// As [`bucket_for`].
pub fn score_bucket(kernel: &str, dtype: &str, w: &Workload, arch: u32) -> Result<ShapeBucket> {
    let f = w.features();
    bucket_for(
        kernel,
        &[dtype],
        arch,
        &ShapeFeatures::decode(f.rows, f.n_keys, f.sub_dim, f.centroids, 0),
    )
}

/// Environment variable naming the tuning table file (as `tritonrt autotune --table`);
/// when unset or empty the default path ([`crate::tune::table::default_path`]) is used.
pub const TABLE_ENV: &str = "TRITONRT_TUNING_TABLE";

/// The tuning table the runtime reads at launch: `$TRITONRT_TUNING_TABLE` when set, else
/// [`TuningTable::open_default`]. Never fails: a missing table is empty, a corrupt one
/// is ignored with one warning.
pub fn runtime_table() -> TuningTable {
    match std::env::var_os(TABLE_ENV) {
        Some(p) if !p.is_empty() => TuningTable::open(std::path::Path::new(&p)),
        _ => TuningTable::open_default(),
    }
}

/// The tuned select-kernel variant for this device, config and shape, from the runtime's
/// tuning table ([`runtime_table`]); `None` when no current entry exists or the default
/// variant won (the caller then uses the manifest default). A corrupt table is ignored
/// with one warning. Cost: one small file read and a few hashes; call it once per
/// indexer.
pub fn tuned_select_variant(rt: &Arc<Runtime>, cfg: &PqConfig, shape: &Shape) -> Option<String> {
    tuned_select_variant_in(&runtime_table(), rt, cfg, shape)
}

/// [`tuned_select_variant`] with an explicit table.
pub fn tuned_select_variant_in(
    table: &TuningTable,
    rt: &Arc<Runtime>,
    cfg: &PqConfig,
    shape: &Shape,
) -> Option<String> {
    if table.is_empty() {
        return None;
    }
    let dev = rt.device();
    let name = select_kernel_name(cfg).ok()?;
    let set = candidate_set(rt.store(), &name, dev.cc()).ok()?;
    let bucket = select_bucket(cfg, shape, dev.arch()).ok()?;
    let sel = table.select(&device_key(dev), &set, &bucket);
    match sel.source {
        SelectionSource::Tuned { .. } => Some(sel.variant),
        SelectionSource::Default(_) => None,
    }
}

/// Build the GPU tuning targets for `req` on a runtime opened on `req.device` with
/// `req.ptx_cache` and the user cubin cache.
///
/// # Errors
///
/// [`Error::TuneNoDevice`] when this machine has no CUDA driver or no such device (the
/// reason names it); otherwise as [`gpu_targets_on`] and the runtime's errors (a bad
/// ptx_cache, a driver that loads but fails).
pub fn gpu_targets(req: &GpuRequest) -> Result<GpuSession> {
    let rt = match crate::pq::gpu::open_runtime(req.device, &req.ptx_cache)? {
        Ok(rt) => rt,
        Err(why) => {
            let kernels = if req.kernels.is_empty() {
                "the default kernels".to_string()
            } else {
                req.kernels.join(", ")
            };
            return Err(Error::TuneNoDevice {
                reason: format!(
                    "{why}; asked to tune {kernels} on device {} with {}; import, export \
                     and --show work without a GPU",
                    req.device,
                    req.ptx_cache.display()
                ),
            });
        }
    };
    gpu_targets_on(rt, req)
}

/// Build the targets for `req` on an open runtime (`req.device` and `req.ptx_cache` are
/// not used).
///
/// # Errors
///
/// [`Error::Invalid`]: no workload, an invalid workload, a kernel that is not in the
/// manifest or that this backend cannot tune, a select kernel whose top-k width does
/// not serve the workload's `heavy`, a workload on the short path or with no quantized
/// key; [`Error::TuneCandidates`] / [`Error::NoVariantForDevice`] from
/// [`candidate_set`].
pub fn gpu_targets_on(rt: Arc<Runtime>, req: &GpuRequest) -> Result<GpuSession> {
    if req.workloads.is_empty() {
        return Err(Error::invalid("workload", "no workload to tune for"));
    }
    let dev = rt.device().clone();
    let l2 = l2_bytes(&dev);
    let mut targets: Vec<Box<dyn TuneTarget>> = Vec::new();
    for (wi, w) in req.workloads.iter().enumerate() {
        w.validate()?;
        if w.n_keys() < 2 {
            return Err(Error::invalid(
                "workload",
                format!(
                    "{w}: S - init_offset = {} quantized keys, expected at least 2",
                    w.n_keys()
                ),
            ));
        }
        let names = if req.kernels.is_empty() {
            default_kernels(w)?
        } else {
            req.kernels
                .iter()
                .map(|k| resolve_alias(k, w))
                .collect::<Result<Vec<_>>>()?
        };
        for (ki, name) in names.iter().enumerate() {
            let set = candidate_set(rt.store(), name, dev.cc())?;
            let seed = req.seed ^ ((wi as u64) << 40) ^ ((ki as u64) << 48);
            let t: Box<dyn TuneTarget> = match kind_of(name) {
                Some(Kind::ScoreV6) => Box::new(ScoreV6Target::new(rt.clone(), set, w, l2, seed)?),
                Some(Kind::ScoreLut(qt)) => {
                    Box::new(ScoreLutTarget::new(rt.clone(), set, w, qt, l2, seed)?)
                }
                Some(Kind::Select(qt, wt)) => {
                    Box::new(SelectTarget::new(rt.clone(), set, w, qt, wt, l2, seed)?)
                }
                None => {
                    return Err(Error::invalid(
                        "kernel",
                        format!(
                            "{name}: no tuning target for this kernel; tunable kernels in \
                             the manifest: {}",
                            tunable_kernels(rt.store()).join(", ")
                        ),
                    ))
                }
            };
            targets.push(t);
        }
    }
    Ok(GpuSession {
        device: device_key(&dev),
        runtime: rt,
        targets,
    })
}

fn resolve_alias(name: &str, w: &Workload) -> Result<String> {
    Ok(match name {
        "pq_select" | "select" => select_kernel_name(&pq_config_for(w))?,
        "pq_score_lut" | "lut" => format!("{SCORE_LUT_PREFIX}fp32"),
        "v6" | "pq_score" => SCORE_V6.to_string(),
        other => other.to_string(),
    })
}

/// What kind of target a logical kernel name needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    ScoreV6,
    ScoreLut(DType),
    Select(DType, DType),
}

fn kind_of(name: &str) -> Option<Kind> {
    if name == SCORE_V6 {
        return Some(Kind::ScoreV6);
    }
    if let Some(qt) = name.strip_prefix(SCORE_LUT_PREFIX) {
        return qt.parse().ok().map(Kind::ScoreLut);
    }
    let rest = name.strip_prefix(SELECT_PREFIX)?;
    let mut parts = rest.split('.');
    let (kp, q, wt) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || kp.parse::<usize>().is_err() {
        return None;
    }
    let qt = q.strip_prefix("q_")?.parse().ok()?;
    let wt = wt.strip_prefix("w_")?.parse().ok()?;
    Some(Kind::Select(qt, wt))
}

// ---------------------------------------------------------------------------------
// shared helpers

fn err_s(e: impl std::fmt::Display) -> String {
    e.to_string()
}

fn constexpr(k: &Kernel, name: &str) -> std::result::Result<usize, String> {
    k.variant()
        .constexprs
        .get(name)
        .and_then(|v| v.as_u64())
        .map(|v| v as usize)
        .ok_or_else(|| format!("variant {} has no integer constexpr {name}", k.id()))
}

/// Order named arguments by the variant's signature ([`arg_positions`]: every
/// argument exactly once, no unknown name).
fn named_args(
    k: &Kernel,
    named: &[(&str, KernelArg)],
) -> std::result::Result<Vec<KernelArg>, String> {
    let names: Vec<&str> = named.iter().map(|(n, _)| *n).collect();
    let pos = arg_positions(&k.variant().signature, &names, false).map_err(|msg| {
        format!(
            "{}: {msg} (signature: {})",
            k.id(),
            k.variant().signature_string()
        )
    })?;
    Ok(pos.iter().map(|&i| named[i].1).collect())
}

fn i32a(what: &str, v: usize) -> std::result::Result<KernelArg, String> {
    i32::try_from(v)
        .map(KernelArg::I32)
        .map_err(|_| format!("{what} = {v} does not fit the kernel's i32 argument"))
}

fn i64a(v: usize) -> KernelArg {
    KernelArg::I64(v as i64)
}

fn dbuf<T: DeviceDtype>(s: &CudaSlice<T>, stream: &CudaStream) -> DeviceBuf {
    DeviceBuf::of(s, stream)
}

/// The element dtype of `k`'s pointer argument `name` (for a buffer of bytes).
fn ptr_dtype(k: &Kernel, name: &str) -> std::result::Result<Dtype, String> {
    match k
        .variant()
        .signature
        .iter()
        .find(|a| a.name == name)
        .map(|a| a.ty)
    {
        Some(ArgType::Ptr(Some(d))) => Ok(d),
        other => Err(format!(
            "{}: {name} is not a typed pointer argument ({other:?})",
            k.id()
        )),
    }
}

/// The number of keys of input set `s` of `n_sets`: the workload's `n`, except the last
/// set, whose `n` has alignment exactly `align` (`n - 1` when `n` is more aligned), so the
/// check covers the bucket's alignment.
fn set_n(n: usize, align: u64, s: usize, n_sets: usize) -> usize {
    if s + 1 == n_sets && n_sets > 1 && align_of(n as u64) > align && n > 1 {
        n - 1
    } else {
        n
    }
}

/// A seeded RNG for chunk `i` of stream `stream` of a target's inputs.
fn rng_for(seed: u64, stream: u64, i: usize) -> SmallRng {
    let z = seed
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(stream.wrapping_mul(0xBF58_476D_1CE4_E5B9))
        .wrapping_add(i as u64);
    SmallRng::seed_from_u64(z)
}

const CHUNK: usize = 1 << 16;

/// Standard-normal values rounded to `dtype`, generated on all cores.
fn normal_vec(len: usize, seed: u64, stream: u64, dtype: DType) -> Vec<f32> {
    let mut v = vec![0f32; len];
    crate::pq::par_chunks_mut(&mut v, CHUNK, |i, c| {
        let mut rng = rng_for(seed, stream, i);
        for x in c.iter_mut() {
            *x = dtype.round(rng.sample::<f32, _>(StandardNormal));
        }
    });
    v
}

/// Uniform codes in `0..k` (`k` a power of two <= 256), generated on all cores.
fn codes_vec<T: Send + TryFrom<u32> + Default + Copy>(
    len: usize,
    k: usize,
    seed: u64,
    stream: u64,
) -> Vec<T> {
    let mut v = vec![T::default(); len];
    let mask = (k as u32).saturating_sub(1);
    crate::pq::par_chunks_mut(&mut v, CHUNK, |i, c| {
        let mut rng = rng_for(seed, stream, i);
        for x in c.iter_mut() {
            *x = T::try_from(rng.next_u32() & mask).unwrap_or_default();
        }
    });
    v
}

/// Values as little-endian bytes of `dtype`.
fn to_bytes(v: &[f32], dtype: DType) -> Vec<u8> {
    match dtype {
        DType::F32 => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        DType::BF16 => v
            .iter()
            .flat_map(|&x| half::bf16::from_f32(x).to_le_bytes())
            .collect(),
        DType::F16 => v
            .iter()
            .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
            .collect(),
    }
}

/// Time `plan` with CUDA events on `stream`: `plan.warmup` launches, then
/// `plan.samples` samples of `plan.launches_per_sample` launches, one event between
/// consecutive samples, one synchronization at the end. `launch(set)` issues one launch
/// on input set `set` (rotating). Returns microseconds per launch, one value per sample.
fn time_with_events(
    dev: &Device,
    stream: &Arc<CudaStream>,
    plan: &TimingPlan,
    launch: &mut dyn FnMut(usize) -> std::result::Result<(), String>,
) -> std::result::Result<Vec<f64>, String> {
    let sets = plan.input_sets.max(1);
    let lps = plan.launches_per_sample.max(1);
    let mut i = 0usize;
    for _ in 0..plan.warmup {
        launch(i % sets)?;
        i += 1;
    }
    let events = (0..=plan.samples)
        .map(|_| dev.new_event(true))
        .collect::<Result<Vec<_>>>()
        .map_err(err_s)?;
    let rec = |e: &cudarc::driver::CudaEvent| {
        e.record(stream)
            .map_err(|e| format!("recording an event: {e}"))
    };
    rec(&events[0])?;
    for s in 0..plan.samples {
        for _ in 0..lps {
            launch(i % sets)?;
            i += 1;
        }
        rec(&events[s + 1])?;
    }
    stream
        .synchronize()
        .map_err(|e| format!("synchronizing after the timed launches: {e}"))?;
    events
        .windows(2)
        .map(|w| {
            w[0].elapsed_ms(&w[1])
                .map(|ms| ms as f64 * 1000.0 / lps as f64)
                .map_err(|e| format!("reading event times: {e}"))
        })
        .collect()
}

// ---------------------------------------------------------------------------------
// pq_score_kernel_v6

#[derive(Debug, Clone, Copy)]
struct ScoreDims {
    b: usize,
    h: usize,
    h_kv: usize,
    m: usize,
    ds: usize,
    k: usize,
    n: usize,
}

impl ScoreDims {
    fn of(w: &Workload) -> Self {
        ScoreDims {
            b: w.batch as usize,
            h: w.heads as usize,
            h_kv: w.kv_heads as usize,
            m: w.subvectors as usize,
            ds: (w.head_dim / w.subvectors) as usize,
            k: 1usize << w.bits,
            n: w.n_keys() as usize,
        }
    }
}

struct ScoreSet {
    codes: CudaSlice<i64>,
    scores: CudaSlice<f32>,
    n: usize,
}

struct ScoreV6State {
    stream: Arc<CudaStream>,
    query: CudaSlice<f32>,
    centroids: CudaSlice<f32>,
    sets: Vec<ScoreSet>,
    oracle: Vec<Option<Vec<f32>>>,
    poison: Vec<f32>,
}

/// `pq_score_kernel_v6` on one workload (see the module docs).
struct ScoreV6Target {
    rt: Arc<Runtime>,
    set: CandidateSet,
    bucket: ShapeBucket,
    workload: Workload,
    d: ScoreDims,
    n_sets: usize,
    seed: u64,
    state: Option<ScoreV6State>,
}

impl ScoreV6Target {
    fn new(rt: Arc<Runtime>, set: CandidateSet, w: &Workload, l2: u64, seed: u64) -> Result<Self> {
        let d = ScoreDims::of(w);
        let bucket = score_bucket(SCORE_V6, "fp32", w, rt.device().arch())?;
        let rows = d.b * d.h;
        let bytes = rows * d.n * (d.m * 8 + 4) + rows * d.m * (d.k + 1) * d.ds * 4;
        Ok(ScoreV6Target {
            n_sets: input_sets_for(bytes as u64, l2),
            rt,
            set,
            bucket,
            workload: w.clone(),
            d,
            seed,
            state: None,
        })
    }

    fn state(&mut self) -> std::result::Result<&mut ScoreV6State, String> {
        if self.state.is_none() {
            let d = self.d;
            let stream = self.rt.device().new_stream().map_err(err_s)?;
            let up = |v: &[f32], what: &str| {
                stream
                    .clone_htod(v)
                    .map_err(|e| format!("uploading {what}: {e}"))
            };
            let query = up(
                &normal_vec(d.b * d.h * d.m * d.ds, self.seed, 1, DType::F32),
                "query",
            )?;
            let centroids = up(
                &normal_vec(d.b * d.h * d.m * d.k * d.ds, self.seed, 2, DType::F32),
                "centroids",
            )?;
            let mut sets = Vec::with_capacity(self.n_sets);
            for s in 0..self.n_sets {
                let codes: Vec<i64> =
                    codes_vec(d.b * d.n * d.h * d.m, d.k, self.seed, 10 + s as u64);
                let codes = stream
                    .clone_htod(&codes)
                    .map_err(|e| format!("uploading codes of input set {s}: {e}"))?;
                let scores = stream
                    .alloc_zeros::<f32>(d.b * d.h * d.n)
                    .map_err(|e| format!("allocating scores of input set {s}: {e}"))?;
                sets.push(ScoreSet {
                    codes,
                    scores,
                    n: set_n(d.n, self.bucket.n_align, s, self.n_sets),
                });
            }
            stream.synchronize().map_err(err_s)?;
            self.state = Some(ScoreV6State {
                stream,
                query,
                centroids,
                sets,
                oracle: vec![None; self.n_sets],
                poison: vec![f32::NAN; d.b * d.h * d.n],
            });
        }
        Ok(self.state.as_mut().expect("set above"))
    }
}

/// A launch prepared for one input set: Triton grid and arguments in signature order.
type Prepared = ([u32; 3], Vec<KernelArg>);

/// The grid and arguments of a v6 launch on input set `s` of `st`.
fn v6_args(
    k: &Kernel,
    d: &ScoreDims,
    st: &ScoreV6State,
    s: usize,
) -> std::result::Result<Prepared, String> {
    let set = &st.sets[s];
    let bk = constexpr(k, "BLOCK_KEYS")?;
    let (b, h, m, ds, kk, n) = (d.b, d.h, d.m, d.ds, d.k, d.n);
    let args = named_args(
        k,
        &[
            ("queries_ptr", KernelArg::Buf(dbuf(&st.query, &st.stream))),
            (
                "centroids_ptr",
                KernelArg::Buf(dbuf(&st.centroids, &st.stream)),
            ),
            ("codebook_ptr", KernelArg::Buf(dbuf(&set.codes, &st.stream))),
            ("scores_ptr", KernelArg::Buf(dbuf(&set.scores, &st.stream))),
            ("b", i32a("B", b)?),
            ("h", i32a("H", h)?),
            ("n_subvec", i32a("M", m)?),
            ("subvec_d", i32a("d_s", ds)?),
            ("n_clustered", i32a("n", set.n)?),
            ("q_stride_b", i64a(h * m * ds)),
            ("q_stride_h", i64a(m * ds)),
            ("q_stride_subvec", i64a(ds)),
            ("q_stride_d", i64a(1)),
            ("c_stride_b", i64a(h * m * kk * ds)),
            ("c_stride_h", i64a(m * kk * ds)),
            ("c_stride_subvec", i64a(kk * ds)),
            ("c_stride_cent", i64a(ds)),
            ("c_stride_d", i64a(1)),
            // upstream codes [B, N, H, M] seen as [B, H, M, N]
            ("cb_stride_b", i64a(n * h * m)),
            ("cb_stride_h", i64a(m)),
            ("cb_stride_subvec", i64a(1)),
            ("cb_stride_clustered", i64a(h * m)),
            ("s_stride_b", i64a(h * n)),
            ("s_stride_h", i64a(n)),
            ("s_stride_clustered", i64a(1)),
        ],
    )?;
    let programs = b * h * set.n.div_ceil(bk.max(1));
    Ok(([u32::try_from(programs).map_err(err_s)?, 1, 1], args))
}

/// Launch `k` with `p`, prepared by [`v6_args`] for `k` on `st`.
fn launch_v6(k: &Kernel, st: &ScoreV6State, p: &Prepared) -> std::result::Result<(), String> {
    // Bounds: `p` was built by v6_args from this state's buffers: query [B,H,M,d_s],
    // centroids [B,H,M,K,d_s], codes [B,N,H,M] (values in 0..K) and scores [B,H,N] are
    // allocations of this state, alive until it is dropped (run and time synchronize
    // the stream before returning); v6_args's strides describe exactly those layouts,
    // the kernel masks keys >= n_clustered (<= N) and d >= d_s, and every launch is on
    // st.stream, the only stream using them.
    k.launch(&st.stream, p.0, &p.1).map_err(err_s)
}

fn read_f32(
    stream: &Arc<CudaStream>,
    buf: &CudaSlice<f32>,
) -> std::result::Result<Vec<f32>, String> {
    let v = stream
        .clone_dtoh(buf)
        .map_err(|e| format!("downloading scores: {e}"))?;
    stream.synchronize().map_err(err_s)?;
    Ok(v)
}

impl TuneTarget for ScoreV6Target {
    fn candidates(&self) -> &CandidateSet {
        &self.set
    }
    fn bucket(&self) -> &ShapeBucket {
        &self.bucket
    }
    fn workload(&self) -> String {
        format!(
            "{}; scores fp32 [B, H, n={}] from int64 codes [B, N, H, M]{}; input set {} \
             has n={} (odd, for the align1 bucket)",
            self.workload,
            self.d.n,
            if self.d.h != self.d.h_kv {
                " (GQA expanded to H heads)"
            } else {
                ""
            },
            self.n_sets - 1,
            set_n(self.d.n, self.bucket.n_align, self.n_sets - 1, self.n_sets)
        )
    }
    fn timer(&self) -> String {
        "CUDA events on one stream, back-to-back launches, no host sync between samples".into()
    }
    fn input_sets(&self) -> usize {
        self.n_sets
    }
    fn run(&mut self, c: &Candidate, s: usize) -> std::result::Result<(), String> {
        let k = self.rt.kernel(&c.id).map_err(err_s)?;
        let d = self.d;
        let st = self.state()?;
        let stream = st.stream.clone();
        stream
            .memcpy_htod(&st.poison, &mut st.sets[s].scores)
            .map_err(|e| format!("poisoning scores: {e}"))?;
        let p = v6_args(&k, &d, st, s)?;
        launch_v6(&k, st, &p)?;
        stream
            .synchronize()
            .map_err(|e| format!("running {}: {e}", c.id))?;
        if c.is_default && st.oracle[s].is_none() {
            st.oracle[s] = Some(read_f32(&stream, &st.sets[s].scores)?);
        }
        Ok(())
    }
    fn output_matches_default(
        &mut self,
        _c: &Candidate,
        s: usize,
    ) -> std::result::Result<OutputCheck, String> {
        let st = self.state()?;
        let got = read_f32(&st.stream, &st.sets[s].scores)?;
        let want = st.oracle[s].as_ref().ok_or_else(|| {
            format!("no oracle for input set {s} (the default has not run on it)")
        })?;
        Ok(compare_f32(want, &got, SCORE_RTOL, SCORE_ATOL))
    }
    fn time(&mut self, c: &Candidate, plan: &TimingPlan) -> std::result::Result<Vec<f64>, String> {
        let k = self.rt.kernel(&c.id).map_err(err_s)?;
        let d = self.d;
        let dev = self.rt.device().clone();
        let st = self.state()?;
        let stream = st.stream.clone();
        let st: &ScoreV6State = st;
        let prepared = (0..st.sets.len())
            .map(|s| v6_args(&k, &d, st, s))
            .collect::<std::result::Result<Vec<_>, String>>()?;
        time_with_events(&dev, &stream, plan, &mut |s| {
            launch_v6(&k, st, &prepared[s])
        })
    }
}

// ---------------------------------------------------------------------------------
// pq_score_lut.q_<qt>

struct LutSet {
    codes: CudaSlice<u8>,
    scores: CudaSlice<f32>,
    n: usize,
}

struct LutState {
    stream: Arc<CudaStream>,
    query: CudaSlice<u8>,
    centroids: CudaSlice<f32>,
    sets: Vec<LutSet>,
    oracle: Vec<Option<Vec<f32>>>,
    poison: Vec<f32>,
}

/// `pq_score_lut.q_<qt>` on one workload (see the module docs).
struct ScoreLutTarget {
    rt: Arc<Runtime>,
    set: CandidateSet,
    bucket: ShapeBucket,
    workload: Workload,
    qt: DType,
    d: ScoreDims,
    cap: usize,
    n_sets: usize,
    seed: u64,
    state: Option<LutState>,
}

impl ScoreLutTarget {
    fn new(
        rt: Arc<Runtime>,
        set: CandidateSet,
        w: &Workload,
        qt: DType,
        l2: u64,
        seed: u64,
    ) -> Result<Self> {
        let d = ScoreDims::of(w);
        let kernel = set.kernel().to_string();
        let bucket = score_bucket(&kernel, qt.as_str(), w, rt.device().arch())?;
        let cap = d.n.div_ceil(16) * 16;
        let bytes = d.b * d.h_kv * d.m * cap + d.b * d.h * d.n * 4;
        Ok(ScoreLutTarget {
            n_sets: input_sets_for(bytes as u64, l2),
            rt,
            set,
            bucket,
            workload: w.clone(),
            qt,
            d,
            cap,
            seed,
            state: None,
        })
    }

    fn state(&mut self) -> std::result::Result<&mut LutState, String> {
        if self.state.is_none() {
            let d = self.d;
            let stream = self.rt.device().new_stream().map_err(err_s)?;
            let q = normal_vec(d.b * d.h * d.m * d.ds, self.seed, 1, self.qt);
            let query = stream
                .clone_htod(&to_bytes(&q, self.qt))
                .map_err(|e| format!("uploading query: {e}"))?;
            let centroids = stream
                .clone_htod(&normal_vec(
                    d.b * d.h_kv * d.m * d.k * d.ds,
                    self.seed,
                    2,
                    DType::F32,
                ))
                .map_err(|e| format!("uploading centroids: {e}"))?;
            let mut sets = Vec::with_capacity(self.n_sets);
            for s in 0..self.n_sets {
                let codes: Vec<u8> =
                    codes_vec(d.b * d.h_kv * d.m * self.cap, d.k, self.seed, 10 + s as u64);
                let codes = stream
                    .clone_htod(&codes)
                    .map_err(|e| format!("uploading codes of input set {s}: {e}"))?;
                let scores = stream
                    .alloc_zeros::<f32>(d.b * d.h * d.n)
                    .map_err(|e| format!("allocating scores of input set {s}: {e}"))?;
                sets.push(LutSet {
                    codes,
                    scores,
                    n: set_n(d.n, self.bucket.n_align, s, self.n_sets),
                });
            }
            stream.synchronize().map_err(err_s)?;
            self.state = Some(LutState {
                stream,
                query,
                centroids,
                sets,
                oracle: vec![None; self.n_sets],
                poison: vec![f32::NAN; d.b * d.h * d.n],
            });
        }
        Ok(self.state.as_mut().expect("set above"))
    }
}

/// The grid and arguments of a LUT-kernel launch on input set `s` of `st`.
fn lut_args(
    k: &Kernel,
    d: &ScoreDims,
    cap: usize,
    st: &LutState,
    s: usize,
) -> std::result::Result<Prepared, String> {
    let set = &st.sets[s];
    let block = constexpr(k, "BLOCK")?;
    let dd = d.m * d.ds;
    let args = named_args(
        k,
        &[
            (
                "q_ptr",
                KernelArg::Buf(dbuf(&st.query, &st.stream).as_dtype(ptr_dtype(k, "q_ptr")?)),
            ),
            ("cent_ptr", KernelArg::Buf(dbuf(&st.centroids, &st.stream))),
            ("codes_ptr", KernelArg::Buf(dbuf(&set.codes, &st.stream))),
            ("scores_ptr", KernelArg::Buf(dbuf(&set.scores, &st.stream))),
            ("q_sb", i64a(d.h * dd)),
            ("q_sh", i64a(dd)),
            ("H", i32a("H", d.h)?),
            ("G", i32a("G", d.h / d.h_kv)?),
            ("M", i32a("M", d.m)?),
            ("K", i32a("K", d.k)?),
            ("d_s", i32a("d_s", d.ds)?),
            ("d_c", i32a("d_c", d.ds)?),
            ("n", i32a("n", set.n)?),
            ("cap", i32a("cap", cap)?),
        ],
    )?;
    let grid = [
        u32::try_from(set.n.div_ceil(block.max(1))).map_err(err_s)?,
        u32::try_from(d.b * d.h).map_err(err_s)?,
        1,
    ];
    Ok((grid, args))
}

/// Launch `k` with `p`, prepared by [`lut_args`] for `k` on `st`.
fn launch_lut(k: &Kernel, st: &LutState, p: &Prepared) -> std::result::Result<(), String> {
    // Bounds: `p` was built by lut_args from this state's buffers: query [B,H,D] in the
    // kernel's dtype, centroids [B,H_kv,M,K,d_s] fp32, codes u8 [B,H_kv,M,cap] and
    // scores [B*H, N >= n] are allocations of this state, alive until it is dropped; the
    // kernel reads codes j < cap, writes scores j < n of each row (row stride n <= N),
    // masks d >= d_s and c >= K; everything runs on st.stream only.
    k.launch(&st.stream, p.0, &p.1).map_err(err_s)
}

impl TuneTarget for ScoreLutTarget {
    fn candidates(&self) -> &CandidateSet {
        &self.set
    }
    fn bucket(&self) -> &ShapeBucket {
        &self.bucket
    }
    fn workload(&self) -> String {
        format!(
            "{}; scores fp32 [B*H, n={}] from u8 codes [B, H_kv, M, cap={}], query {}; \
             input set {} has n={} (odd, for the align1 bucket)",
            self.workload,
            self.d.n,
            self.cap,
            self.qt,
            self.n_sets - 1,
            set_n(self.d.n, self.bucket.n_align, self.n_sets - 1, self.n_sets)
        )
    }
    fn timer(&self) -> String {
        "CUDA events on one stream, back-to-back launches, no host sync between samples".into()
    }
    fn input_sets(&self) -> usize {
        self.n_sets
    }
    fn run(&mut self, c: &Candidate, s: usize) -> std::result::Result<(), String> {
        let k = self.rt.kernel(&c.id).map_err(err_s)?;
        let (d, cap) = (self.d, self.cap);
        let st = self.state()?;
        let stream = st.stream.clone();
        stream
            .memcpy_htod(&st.poison, &mut st.sets[s].scores)
            .map_err(|e| format!("poisoning scores: {e}"))?;
        let p = lut_args(&k, &d, cap, st, s)?;
        launch_lut(&k, st, &p)?;
        stream
            .synchronize()
            .map_err(|e| format!("running {}: {e}", c.id))?;
        if c.is_default && st.oracle[s].is_none() {
            st.oracle[s] = Some(read_f32(&stream, &st.sets[s].scores)?);
        }
        Ok(())
    }
    fn output_matches_default(
        &mut self,
        _c: &Candidate,
        s: usize,
    ) -> std::result::Result<OutputCheck, String> {
        let st = self.state()?;
        let got = read_f32(&st.stream, &st.sets[s].scores)?;
        let want = st.oracle[s].as_ref().ok_or_else(|| {
            format!("no oracle for input set {s} (the default has not run on it)")
        })?;
        Ok(compare_f32(want, &got, SCORE_RTOL, SCORE_ATOL))
    }
    fn time(&mut self, c: &Candidate, plan: &TimingPlan) -> std::result::Result<Vec<f64>, String> {
        let k = self.rt.kernel(&c.id).map_err(err_s)?;
        let (d, cap) = (self.d, self.cap);
        let dev = self.rt.device().clone();
        let st = self.state()?;
        let stream = st.stream.clone();
        let st: &LutState = st;
        let prepared = (0..st.sets.len())
            .map(|s| lut_args(&k, &d, cap, st, s))
            .collect::<std::result::Result<Vec<_>, String>>()?;
        time_with_events(&dev, &stream, plan, &mut |s| {
            launch_lut(&k, st, &prepared[s])
        })
    }
}

// ---------------------------------------------------------------------------------
// pq_select.h<K_PAD>.q_<qt>.w_<wt>, through GpuIndexer

struct SelectState {
    stream: Arc<CudaStream>,
    /// Host inputs at the workload's `S` (query, key rows the steps read, centroids);
    /// `codes` is empty: each set has its own.
    base: PqInputs,
    set_codes: Vec<Vec<i64>>,
    _query: CudaSlice<u8>,
    _key: CudaSlice<u8>,
    q_ref: DeviceTensorRef,
    k_ref: DeviceTensorRef,
    indexers: HashMap<(String, usize), GpuIndexer>,
    oracle: Vec<Option<PqOutput>>,
}

/// The select kernel on one workload, through the decode step (see the module docs).
struct SelectTarget {
    rt: Arc<Runtime>,
    set: CandidateSet,
    bucket: ShapeBucket,
    workload: Workload,
    cfg: PqConfig,
    shape: Shape,
    n_sets: usize,
    seed: u64,
    state: Option<SelectState>,
    /// Checks that passed by the spec's rule only (outputs not bit-identical).
    spec_only: Vec<String>,
}

impl SelectTarget {
    fn new(
        rt: Arc<Runtime>,
        set: CandidateSet,
        w: &Workload,
        qt: DType,
        wt: DType,
        l2: u64,
        seed: u64,
    ) -> Result<Self> {
        let cfg = PqConfig {
            input_dtype: qt,
            weight_dtype: wt,
            ..pq_config_for(w)
        };
        let shape = shape_for(w);
        cfg.validate(&shape)?;
        let name = set.kernel().to_string();
        let want = select_kernel_name(&cfg)?;
        if want != name {
            return Err(Error::invalid(
                "kernel",
                format!(
                    "{name} does not serve workload {w}: heavy={} uses {want} (the smallest \
                     compiled top-k width >= heavy)",
                    w.heavy
                ),
            ));
        }
        let bucket = select_bucket(&cfg, &shape, rt.device().arch())?;
        let me = SelectTarget {
            n_sets: 1,
            rt,
            set,
            bucket,
            workload: w.clone(),
            cfg,
            shape,
            seed,
            state: None,
            spec_only: Vec::new(),
        };
        let n = cfg.n_quantized(shape.s);
        let rows = shape.b * shape.h;
        let bytes = shape.b * shape.h_kv * cfg.m() * n
            + rows * shape.s * wt.size_bytes()
            + rows * cfg.total(shape.s) * 8;
        let n_sets = input_sets_for(bytes as u64, l2);
        let me = SelectTarget { n_sets, ..me };
        for s in 0..n_sets {
            let ss = me.set_s(s);
            if cfg.is_short(ss) {
                return Err(Error::invalid(
                    "workload",
                    format!(
                        "{w}: S={ss} takes the short path (S <= heavy + init_offset + 1 + K = \
                         {}), where the select kernel does not run",
                        cfg.short_threshold()
                    ),
                ));
            }
        }
        Ok(me)
    }

    /// `S` of input set `s` (its `n = S - init_offset` as [`set_n`] says).
    fn set_s(&self, s: usize) -> usize {
        let n = self.cfg.n_quantized(self.shape.s);
        set_n(n, self.bucket.n_align, s, self.n_sets) + self.cfg.init_offset
    }

    /// Cached keys before a step of set `s`: every key but the new one.
    fn set_n_cached(&self, s: usize) -> usize {
        PqInputs::default_n_cached(&self.cfg, self.set_s(s))
    }

    fn state(&mut self) -> std::result::Result<&mut SelectState, String> {
        if self.state.is_none() {
            let (cfg, sh) = (self.cfg, self.shape);
            let stream = self.rt.device().new_stream().map_err(err_s)?;
            let n0 = self.set_n_cached(0);
            let mut base = PqInputs::random(&cfg, sh, n0, self.seed).map_err(err_s)?;
            let mut set_codes = Vec::with_capacity(self.n_sets);
            for s in 0..self.n_sets {
                let nc = self.set_n_cached(s);
                if s == 0 {
                    set_codes.push(std::mem::take(&mut base.codes));
                } else {
                    let len = sh.b * nc * sh.h_kv * cfg.m();
                    set_codes.push(codes_vec(len, cfg.k_centroids(), self.seed, 100 + s as u64));
                }
            }
            // Query: all of it. Key [B, H_kv, S, D]: zeros, then the rows the steps read
            // (positions init_offset + N_cached .. S of every set), one copy per (b, g).
            let qt = cfg.input_dtype;
            let query = stream
                .clone_htod(&to_bytes(&base.query, qt))
                .map_err(|e| format!("uploading query: {e}"))?;
            let es = qt.size_bytes();
            let mut key = stream
                .alloc_zeros::<u8>(sh.b * sh.h_kv * sh.s * sh.d * es)
                .map_err(|e| format!("allocating key [B, H_kv, S, D]: {e}"))?;
            let p0 = (0..self.n_sets)
                .map(|s| cfg.init_offset + self.set_n_cached(s))
                .min()
                .unwrap_or(sh.s)
                .min(sh.s);
            for bg in 0..sh.b * sh.h_kv {
                let lo = (bg * sh.s + p0) * sh.d;
                let hi = (bg * sh.s + sh.s) * sh.d;
                let bytes = to_bytes(&base.key[lo..hi], qt);
                stream
                    .memcpy_htod(&bytes, &mut key.slice_mut(lo * es..hi * es))
                    .map_err(|e| format!("uploading key rows: {e}"))?;
            }
            stream.synchronize().map_err(err_s)?;
            let q_ref = DeviceTensorRef::new(
                dbuf(&query, &stream),
                qt,
                [(sh.h * sh.d) as i64, sh.d as i64, 0],
            )
            .map_err(err_s)?;
            let k_ref = DeviceTensorRef::new(
                dbuf(&key, &stream),
                qt,
                [
                    (sh.h_kv * sh.s * sh.d) as i64,
                    (sh.s * sh.d) as i64,
                    sh.d as i64,
                ],
            )
            .map_err(err_s)?;
            self.state = Some(SelectState {
                stream,
                base,
                set_codes,
                _query: query,
                _key: key,
                q_ref,
                k_ref,
                indexers: HashMap::new(),
                oracle: (0..self.n_sets).map(|_| None).collect(),
            });
        }
        Ok(self.state.as_mut().expect("set above"))
    }

    /// The indexer of candidate `id` on input set `s` (created at first use: centroids
    /// and the set's codes imported, buffers for the set's `S` allocated).
    fn indexer(&mut self, id: &str, s: usize) -> std::result::Result<(), String> {
        let (cfg, sh) = (self.cfg, self.shape);
        let (ss, nc) = (self.set_s(s), self.set_n_cached(s));
        let rt = self.rt.clone();
        let st = self.state()?;
        if st.indexers.contains_key(&(id.to_string(), s)) {
            return Ok(());
        }
        let mut ix = GpuIndexer::new(
            rt,
            st.stream.clone(),
            cfg,
            sh,
            &st.base.centroids,
            st.base.phi.as_deref(),
            Some(id),
        )
        .map_err(err_s)?;
        ix.import_codes(&st.set_codes[s], nc).map_err(err_s)?;
        ix.prepare(ss).map_err(err_s)?;
        st.indexers.insert((id.to_string(), s), ix);
        Ok(())
    }

    /// Host inputs of set `s` for the spec check: the base inputs at the set's `S`, with
    /// only the key rows the step reads copied (the others stay 0.0, never read).
    fn check_inputs(&mut self, s: usize) -> std::result::Result<PqInputs, String> {
        let (cfg, sh) = (self.cfg, self.shape);
        let (ss, nc) = (self.set_s(s), self.set_n_cached(s));
        let st = self.state()?;
        let b = &st.base;
        let mut key = vec![0f32; sh.b * sh.h_kv * ss * sh.d];
        let p0 = (cfg.init_offset + nc).min(ss);
        for bg in 0..sh.b * sh.h_kv {
            let src = (bg * sh.s + p0) * sh.d..(bg * sh.s + ss) * sh.d;
            let dst = (bg * ss + p0) * sh.d..(bg * ss + ss) * sh.d;
            key[dst].copy_from_slice(&b.key[src]);
        }
        Ok(PqInputs {
            shape: Shape { s: ss, ..sh },
            query: b.query.clone(),
            key,
            centroids: b.centroids.clone(),
            codes: st.set_codes[s].clone(),
            n_cached: nc,
            phi: b.phi.clone(),
        })
    }
}

/// Compare two step outputs exactly (integers, and weights bit for bit).
fn compare_outputs(want: &PqOutput, got: &PqOutput) -> OutputCheck {
    if (want.s, want.total, want.n_cached) != (got.s, got.total, got.n_cached) {
        return OutputCheck::Differs(format!(
            "(S, total, n_cached) = {:?}, expected {:?}",
            (got.s, got.total, got.n_cached),
            (want.s, want.total, want.n_cached)
        ));
    }
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
    for (name, r) in [
        (
            "sparse_len",
            compare_exact(&want.sparse_len, &got.sparse_len),
        ),
        (
            "sparse_list",
            compare_exact(&want.sparse_list, &got.sparse_list),
        ),
        (
            "weight_list",
            compare_exact(&bits(&want.weight_list), &bits(&got.weight_list)),
        ),
        ("codes", compare_exact(&want.codes, &got.codes)),
    ] {
        if let OutputCheck::Differs(d) = r {
            return OutputCheck::Differs(format!("{name}: {d}"));
        }
    }
    OutputCheck::Matches
}

impl TuneTarget for SelectTarget {
    fn candidates(&self) -> &CandidateSet {
        &self.set
    }
    fn bucket(&self) -> &ShapeBucket {
        &self.bucket
    }
    fn workload(&self) -> String {
        let mut s = format!(
            "{}; decode steps through GpuIndexer (query {}, weights {}, metric {}), one new \
             key per step; input set {} has S={} (odd n, for the align1 bucket)",
            self.workload,
            self.cfg.input_dtype,
            self.cfg.weight_dtype,
            self.cfg.metric,
            self.n_sets - 1,
            self.set_s(self.n_sets - 1)
        );
        if !self.spec_only.is_empty() {
            s.push_str(&format!(
                "; outputs not bit-identical to the default but passing the spec's check: {}",
                self.spec_only.join(", ")
            ));
        }
        s
    }
    fn timer(&self) -> String {
        "CUDA events around back-to-back decode steps (CUDA-graph replay of the step: one \
         select-kernel launch), no host sync between samples"
            .into()
    }
    fn input_sets(&self) -> usize {
        self.n_sets
    }
    fn run(&mut self, c: &Candidate, s: usize) -> std::result::Result<(), String> {
        self.indexer(&c.id, s)?;
        let (ss, nc) = (self.set_s(s), self.set_n_cached(s));
        let st = self.state()?;
        let (q, k) = (st.q_ref, st.k_ref);
        let ix = st
            .indexers
            .get_mut(&(c.id.clone(), s))
            .expect("created above");
        ix.rewind(nc);
        ix.poison_outputs().map_err(err_s)?;
        ix.step(&q, &k, ss, LaunchMode::Launch).map_err(err_s)?;
        ix.synchronize()
            .map_err(|e| format!("running {}: {e}", c.id))?;
        if c.is_default && st.oracle[s].is_none() {
            st.oracle[s] = Some(ix.download().map_err(err_s)?);
        }
        Ok(())
    }
    fn output_matches_default(
        &mut self,
        c: &Candidate,
        s: usize,
    ) -> std::result::Result<OutputCheck, String> {
        let st = self.state()?;
        let got = st
            .indexers
            .get(&(c.id.clone(), s))
            .ok_or_else(|| format!("{} has not run on input set {s}", c.id))?
            .download()
            .map_err(err_s)?;
        let want = st.oracle[s].as_ref().ok_or_else(|| {
            format!("no oracle for input set {s} (the default has not run on it)")
        })?;
        let exact = compare_outputs(want, &got);
        let OutputCheck::Differs(diff) = exact else {
            return Ok(OutputCheck::Matches);
        };
        if c.is_default {
            return Ok(OutputCheck::Differs(diff));
        }
        let cfg = self.cfg;
        let inputs = self.check_inputs(s)?;
        let report = crate::pq::check(&cfg, &inputs, &got);
        if report.passed() {
            self.spec_only.push(format!("{} (set {s}: {diff})", c.id));
            Ok(OutputCheck::Matches)
        } else {
            Ok(OutputCheck::Differs(format!(
                "{diff}; and the spec's check fails: {report}"
            )))
        }
    }
    fn time(&mut self, c: &Candidate, plan: &TimingPlan) -> std::result::Result<Vec<f64>, String> {
        for s in 0..self.n_sets {
            self.indexer(&c.id, s)?;
        }
        let n_sets = self.n_sets;
        let params: Vec<(usize, usize)> = (0..n_sets)
            .map(|s| (self.set_s(s), self.set_n_cached(s)))
            .collect();
        let dev = self.rt.device().clone();
        let st = self.state()?;
        let stream = st.stream.clone();
        let (q, k) = (st.q_ref, st.k_ref);
        let mut ixs: Vec<&mut GpuIndexer> = Vec::with_capacity(n_sets);
        {
            let mut by_set: Vec<(usize, &mut GpuIndexer)> = st
                .indexers
                .iter_mut()
                .filter(|((id, _), _)| *id == c.id)
                .map(|((_, s), ix)| (*s, ix))
                .collect();
            by_set.sort_by_key(|(s, _)| *s);
            ixs.extend(by_set.into_iter().map(|(_, ix)| ix));
        }
        let mut step = |s: usize| -> std::result::Result<(), String> {
            let (ss, nc) = params[s];
            let ix = &mut ixs[s];
            ix.rewind(nc);
            ix.step(&q, &k, ss, LaunchMode::Graph)
                .map(|_| ())
                .map_err(err_s)
        };
        // capture every set's step graph before anything is timed
        for s in 0..n_sets {
            step(s)?;
        }
        time_with_events(&dev, &stream, plan, &mut step)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_parse_names() {
        assert_eq!(kind_of("pq_score_kernel_v6"), Some(Kind::ScoreV6));
        assert_eq!(
            kind_of("pq_score_lut.q_bf16"),
            Some(Kind::ScoreLut(DType::BF16))
        );
        assert_eq!(
            kind_of("pq_select.h256.q_fp16.w_fp32"),
            Some(Kind::Select(DType::F16, DType::F32))
        );
        assert_eq!(kind_of("pq_select.hx.q_fp16.w_fp32"), None);
        assert_eq!(kind_of("pq_select.h128.q_fp16"), None);
        assert_eq!(kind_of("pq_short.w_fp32"), None);
        assert_eq!(kind_of("axpy_kernel"), None);
    }

    #[test]
    fn last_set_has_odd_n() {
        assert_eq!(set_n(31872, 1, 0, 5), 31872);
        assert_eq!(set_n(31872, 1, 4, 5), 31871);
        assert_eq!(set_n(31871, 1, 4, 5), 31871);
        assert_eq!(set_n(31872, 1, 0, 1), 31872);
        assert_eq!(set_n(31872, 128, 1, 2), 31872);
    }

    #[test]
    fn generated_codes_are_in_range_and_varied() {
        let c: Vec<i64> = codes_vec(200_000, 64, 7, 3);
        assert!(c.iter().all(|&x| (0..64).contains(&x)));
        let mut seen = [false; 64];
        c.iter().for_each(|&x| seen[x as usize] = true);
        assert!(seen.iter().all(|&b| b));
        let u: Vec<u8> = codes_vec(1000, 256, 7, 3);
        assert!(u.iter().any(|&x| x > 127));
        let v = normal_vec(100_000, 1, 1, DType::F32);
        let mean = v.iter().map(|&x| x as f64).sum::<f64>() / v.len() as f64;
        let var = v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / v.len() as f64;
        assert!(
            mean.abs() < 0.02 && (var - 1.0).abs() < 0.03,
            "mean {mean} var {var}"
        );
    }

    #[test]
    fn select_bucket_matches_the_workload_features() {
        let w = Workload::reference();
        let cfg = pq_config_for(&w);
        let b = select_bucket(&cfg, &shape_for(&w), 90).unwrap();
        assert_eq!(
            b.to_string(),
            "b1:pq_select.h128.q_fp32.w_fp32:fp32+fp32:sm90:rows<=32:n<=32768:align1:ds64:K64:heavy<=128"
        );
        let s = score_bucket(SCORE_V6, "fp32", &Workload::large(), 90).unwrap();
        assert_eq!(
            s.to_string(),
            "b1:pq_score_kernel_v6:fp32:sm90:rows<=128:n<=131072:align1:ds64:K64:heavy<=0"
        );
    }
}
