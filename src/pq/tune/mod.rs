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
//!   [`crate::tune::procedure::input_sets_for`]`(bytes per launch, L2 size)` seeded standard-normal / uniform
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
//!   does the same work either way. Outputs are compared with [`crate::tune::procedure::compare_f32`]
//!   (rtol [`SCORE_RTOL`], atol [`SCORE_ATOL`]: variants sum in different orders).
//! - `pq_score_lut.q_<qt>`: the same scores from the runtime's u8 code state
//!   `[B, H_kv, M, cap]` through a per-head lookup table; scores `[B*H, n]`; grid
//!   `(cdiv(n, BLOCK), B*H)`. Compared like v6.
//! - `pq_select.h<K_PAD>.q_<qt>.w_<wt>`: the decode step's select kernel, tuned through
//!   [`crate::pq::gpu::GpuIndexer`] with `select_variant = Some(id)`: each step quantizes one new key and
//!   selects, so a "launch" is one whole decode step (CUDA-graph replay of the step, which
//!   is one select-kernel launch, as `tritonrt run`/`bench` issue it). Outputs
//!   (`sparse_list`, `sparse_len`, `weight_list`, codes) must equal the default variant's
//!   exactly; if they do not, the spec's rule ([`crate::pq::check()`]) decides, since a
//!   variant may order a near-tie differently (counted in the entry's workload text).
//!
//! [`tuned_select_variant`] is the launch-time side: the tuned select variant for a
//! config and shape from the default tuning table, if a current entry exists.

use std::path::PathBuf;
use std::sync::Arc;

use crate::artifact::{ArtifactStore, Variant};
use crate::driver::device::Device;
use crate::error::{Error, Result};
use crate::pq::gpu::select_kernel_name;
use crate::pq::Workload;
use crate::pq::{DType, PqConfig, Shape};
use crate::runtime::Runtime;
use crate::tune::bucket::{bucket_for, ShapeBucket, ShapeFeatures};
use crate::tune::candidate::{Candidate, CandidateSet};
use crate::tune::procedure::TuneTarget;
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

/// The kernels tuned for workload `w` when none are named: `pq_score_kernel_v6`, the
/// select kernel `w`'s config uses (fp32 query and weights), and `pq_score_lut.q_fp32`.
///
/// # Errors
///
/// `heavy` above the compiled top-k widths ([`select_kernel_name`]).
pub fn default_kernels(w: &Workload) -> Result<Vec<String>> {
    Ok(vec![
        SCORE_V6.to_string(),
        select_kernel_name(&w.config(), w.seq_len as usize)?,
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
    let name = select_kernel_name(cfg, shape.s)?;
    bucket_for(
        &name,
        &[cfg.input_dtype.as_str(), cfg.weight_dtype.as_str()],
        arch,
        &ShapeFeatures::decode(
            (shape.b * shape.h) as u64,
            cfg.n_quantized(shape.s) as u64,
            cfg.d_sub(shape.d) as u32,
            cfg.k_centroids() as u32,
            u32::try_from(cfg.heavy_at(shape.s)).unwrap_or(u32::MAX),
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
    let name = select_kernel_name(cfg, shape.s).ok()?;
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
        "pq_select" | "select" => select_kernel_name(&w.config(), w.seq_len as usize)?,
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

mod common;
mod score_lut;
mod score_v6;
mod select;

use score_lut::ScoreLutTarget;
use score_v6::ScoreV6Target;
use select::SelectTarget;
