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
//! - the decode step's kernels (every kernel a step of the workload launches: for the
//!   practical workloads `pq_emit` with `pq_thresh` or with `pq_rsel`, for
//!   the reference workload `pq_index` (and `pq_wfill`), `pq_quant` for steps with several
//!   new keys, `pq_select` or `pq_hist` where the step takes them), tuned through
//!   [`crate::pq::gpu::GpuIndexer`]: each candidate's indexer runs that variant
//!   (an override) and every other kernel at its current choice (the tuning table being
//!   written, else the manifest default), so tuning the step's kernels one after the
//!   other is a coordinate pass; a "launch" is one whole decode step (CUDA-graph replay
//!   of the step, as `tritonrt run`/`bench` issue it). Outputs (`sparse_list`,
//!   `sparse_len`, `weight_list`, codes) must equal the default variant's exactly; if
//!   they do not, the spec's rule ([`crate::pq::check()`]) decides, since a variant may
//!   order a near-tie differently (counted in the entry's workload text). Their bucket is
//!   [`step_bucket`] at the workload's shape, what the indexer looks up at creation.
//!
//! With no kernel named, a workload tunes every kernel its step launches that has more
//! than one variant ([`default_kernels`]); the default workloads are the practical ones
//! and the reference ([`default_workloads`]).

use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

use crate::artifact::ArtifactStore;
use crate::driver::device::Device;
use crate::error::{Error, Result};
use crate::pq::gpu::{select_kernel_name, KernelChoice, SelectPath, StepPlan};
use crate::pq::kernels::Kernels;
use crate::pq::matrix::bench_matrix;
use crate::pq::plan::plan_step;
use crate::pq::Workload;
use crate::pq::{DType, PqConfig, Shape};
use crate::runtime::Runtime;
use crate::tune::bucket::{bucket_for, ShapeBucket, ShapeFeatures};
use crate::tune::candidate::CandidateSet;
use crate::tune::procedure::TuneTarget;
use crate::tune::table::DeviceKey;

pub use crate::pq::variants::{
    device_candidates, device_key, runtime_table, step_bucket, TABLE_ENV,
};

/// The upstream scoring kernel's logical name.
pub const SCORE_V6: &str = "pq_score_kernel_v6";
/// Prefix of the lookup-table scoring kernels (`pq_score_lut.q_<qt>`).
pub const SCORE_LUT_PREFIX: &str = "pq_score_lut.q_";
/// Prefix of the select kernels (`pq_select.h<K_PAD>.q_<qt>.w_<wt>`).
pub const SELECT_PREFIX: &str = "pq_select.h";
/// Prefixes of the decode step's kernels, tuned through the indexer (a step of the
/// workload must launch the kernel).
pub const STEP_PREFIXES: [&str; 9] = [
    SELECT_PREFIX,
    "pq_hist.",
    "pq_thresh.",
    "pq_emit.",
    "pq_index.",
    "pq_wfill.",
    "pq_rsel.",
    "pq_quant.",
    "pq_short.",
];
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
    /// Logical kernel names to tune; empty means the kernels each workload's step
    /// launches that have more than one variant ([`default_kernels`]). `pq_select` and
    /// `pq_score_lut` are accepted as shorthands for the workload's select kernel and
    /// `pq_score_lut.q_fp32`.
    pub kernels: Vec<String>,
    /// Workloads to tune for (one bucket per kernel and workload).
    pub workloads: Vec<StepWorkload>,
    /// Seed of the generated inputs.
    pub seed: u64,
    /// New keys per decode step of the step kernels' targets (1: a decode step; more:
    /// the step quantizes them with `pq_quant` first, which is then tuned too). At least 1.
    pub new_keys: usize,
    /// The tuning table the step targets' indexers read for the kernels not under test
    /// (their current choice: entries saved by earlier targets of the same run count);
    /// None: [`runtime_table`]'s.
    pub table: Option<PathBuf>,
}

/// A workload of the step tuner: a named config (dtypes included) and shape (`shape.s`
/// the step's `S`).
#[derive(Debug, Clone, PartialEq)]
pub struct StepWorkload {
    /// Name for reports (`reference`, `practical-m2b8`, `custom`, ...).
    pub name: String,
    /// The config.
    pub cfg: PqConfig,
    /// The shape, `S` included.
    pub shape: Shape,
}

impl StepWorkload {
    /// The same sizes as a [`Workload`] (the scoring kernels' targets take one; fp32).
    pub fn workload(&self) -> Workload {
        let (c, sh) = (&self.cfg, &self.shape);
        Workload {
            name: self.name.clone(),
            batch: sh.b as u64,
            heads: sh.h as u64,
            kv_heads: sh.h_kv as u64,
            seq_len: sh.s as u64,
            head_dim: sh.d as u64,
            subvectors: c.pq_group_factor as u64,
            bits: c.pq_bits,
            sink: c.sink_size,
            window: c.window_size,
            heavy: c.heavy_size,
            init_offset: c.init_offset as u64,
        }
    }
}

impl From<Workload> for StepWorkload {
    fn from(w: Workload) -> Self {
        StepWorkload {
            cfg: w.config(),
            shape: w.shape(),
            name: w.name,
        }
    }
}

impl std::fmt::Display for StepWorkload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let sh = &self.shape;
        write!(
            f,
            "{}: B={} H={} H_kv={} S={} D={} {}",
            self.name, sh.b, sh.h, sh.h_kv, sh.s, sh.d, self.cfg
        )
    }
}

impl FromStr for StepWorkload {
    type Err = Error;

    /// A row of the bench matrix by name (`practical-m2b6`, `practical-m2b8`,
    /// `practical-m4b8`, `practical-large`, `heavy-512`, ...: [`bench_matrix`]), else a
    /// [`Workload`] (`reference`, `large`, `B,H,H_kv,S,D[,M[,bits[,heavy]]]`, fp32).
    fn from_str(s: &str) -> Result<Self> {
        let name = s.trim();
        if let Some(r) = bench_matrix().into_iter().find(|r| r.name == name) {
            return Ok(StepWorkload {
                name: r.name,
                cfg: r.cfg,
                shape: r.shape,
            });
        }
        match name.parse::<Workload>() {
            Ok(w) => Ok(w.into()),
            Err(e) => {
                let rows: Vec<String> = bench_matrix().into_iter().map(|r| r.name).collect();
                Err(Error::invalid(
                    "workload",
                    format!("{e}; or a row of the bench matrix: {}", rows.join(", ")),
                ))
            }
        }
    }
}

/// The workloads `tritonrt autotune` tunes when none is named: the practical ones (bf16,
/// heavy `floor(0.0921875 S)`, `(M, bits)` in (2, 6), (2, 8), (4, 8)) and the reference.
pub fn default_workloads() -> Vec<StepWorkload> {
    [
        "practical-m2b6",
        "practical-m2b8",
        "practical-m4b8",
        "reference",
    ]
    .iter()
    .filter_map(|n| n.parse().ok())
    .collect()
}

/// The GPU backend's answer: the device identity and one target per kernel and bucket.
pub struct GpuSession {
    /// The runtime the targets launch on.
    pub runtime: Arc<Runtime>,
    /// The device the targets time on (keys the table entries).
    pub device: DeviceKey,
    /// One target per (workload, kernel): workloads in request order, kernels in request
    /// order within each (a step's kernels in launch order). Targets allocate their
    /// inputs at first use and free them when dropped, so tune and drop them one at a
    /// time.
    pub targets: Vec<Box<dyn TuneTarget>>,
    /// Per workload, what its step launches and why a kernel is not tuned (one variant),
    /// for the report.
    pub notes: Vec<String>,
}

impl std::fmt::Debug for GpuSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuSession")
            .field("device", &self.device)
            .field("targets", &self.targets.len())
            .finish()
    }
}

/// The device's L2 cache size in bytes ([`DEFAULT_L2_BYTES`] if the driver does not say).
pub fn l2_bytes(dev: &Device) -> u64 {
    dev.context()
        .attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)
        .ok()
        .filter(|&v| v > 0)
        .map_or(DEFAULT_L2_BYTES, |v| v as u64)
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
    device_candidates(store, kernel, cc)
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

/// The step a workload's decode step runs with `new_keys` new keys under `path`: its plan
/// and the kernels it launches (logical names, launch order, each once), on `rt`'s GPU
/// with the manifest defaults (which variants run does not change which kernels do).
///
/// # Errors
///
/// The config's validation, a kernel missing from the manifest, the plan's refusal.
pub fn step_kernels(
    rt: &Runtime,
    w: &StepWorkload,
    new_keys: usize,
    path: SelectPath,
) -> Result<(StepPlan, Vec<String>)> {
    let (cfg, sh) = (&w.cfg, &w.shape);
    cfg.validate(sh)?;
    let ks = Kernels::load(rt, cfg, sh, &KernelChoice::manifest_defaults())?;
    let facts = ks.facts(rt.device().sm_count());
    let n = cfg.n_quantized(sh.s);
    let plan = plan_step(cfg, sh, sh.s, n.saturating_sub(new_keys), path, &facts)?;
    // contiguous keys [B, H_kv, S, D] at an aligned address: the usual cache layout
    let strides = [
        (sh.h_kv * sh.s * sh.d) as i64,
        (sh.s * sh.d) as i64,
        sh.d as i64,
    ];
    let names = ks
        .launched(&plan, 1 << 20, strides, cfg.d_sub(sh.d))
        .into_iter()
        .map(|k| k.variant().kernel.clone())
        .collect();
    Ok((plan, names))
}

/// The kernels tuned for workload `w` when none are named: every kernel its decode step
/// (`new_keys` new keys, [`SelectPath::Auto`]) launches that has more than one variant on
/// this GPU, in launch order; and a note per kernel left out.
///
/// # Errors
///
/// As [`step_kernels`] and [`candidate_set`].
pub fn default_kernels(
    rt: &Runtime,
    w: &StepWorkload,
    new_keys: usize,
) -> Result<(Vec<String>, Vec<String>)> {
    let (plan, names) = step_kernels(rt, w, new_keys, SelectPath::Auto)?;
    let mut tuned = Vec::new();
    let mut notes = Vec::new();
    for name in names {
        let set = candidate_set(rt.store(), &name, rt.device().cc())?;
        if set.candidates().len() > 1 {
            tuned.push(name);
        } else {
            notes.push(format!(
                "{}: its step ({}) launches {name}, which has one variant on this GPU: \
                 nothing to tune",
                w.name,
                plan.kind.name()
            ));
        }
    }
    Ok((tuned, notes))
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
    if req.new_keys == 0 {
        return Err(Error::invalid(
            "new keys",
            "expected at least 1 new key per step, got 0",
        ));
    }
    let dev = rt.device().clone();
    let l2 = l2_bytes(&dev);
    let mut targets: Vec<Box<dyn TuneTarget>> = Vec::new();
    let mut notes = Vec::new();
    for (wi, w) in req.workloads.iter().enumerate() {
        w.cfg.validate(&w.shape)?;
        let n = w.cfg.n_quantized(w.shape.s);
        if n < req.new_keys + 1 {
            return Err(Error::invalid(
                "workload",
                format!(
                    "{w}: S - init_offset = {n} quantized keys, expected more than the {} \
                     new key(s) per step",
                    req.new_keys
                ),
            ));
        }
        let names = if req.kernels.is_empty() {
            let (names, why) = default_kernels(&rt, w, req.new_keys)?;
            notes.extend(why);
            names
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
                Some(Kind::ScoreV6) => Box::new(ScoreV6Target::new(
                    rt.clone(),
                    set,
                    &w.workload(),
                    l2,
                    seed,
                )?),
                Some(Kind::ScoreLut(qt)) => Box::new(ScoreLutTarget::new(
                    rt.clone(),
                    set,
                    &w.workload(),
                    qt,
                    l2,
                    seed,
                )?),
                Some(Kind::Step) => {
                    let path = path_launching(&rt, w, req.new_keys, name)?;
                    let spec = StepSpec {
                        workload: w.clone(),
                        path,
                        new_keys: req.new_keys,
                        table: req.table.clone(),
                    };
                    Box::new(StepTarget::new(rt.clone(), set, spec, l2, seed)?)
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
        notes,
    })
}

/// The select path under which `w`'s step launches kernel `name`: [`SelectPath::Auto`]
/// where it does (what runs), else the first forced path that does.
///
/// # Errors
///
/// [`Error::Invalid`] naming the kernels the step launches when no path launches `name`.
fn path_launching(
    rt: &Runtime,
    w: &StepWorkload,
    new_keys: usize,
    name: &str,
) -> Result<SelectPath> {
    let (_, auto) = step_kernels(rt, w, new_keys, SelectPath::Auto)?;
    if auto.iter().any(|k| k == name) {
        return Ok(SelectPath::Auto);
    }
    for path in SelectPath::FORCED {
        if let Ok((_, ks)) = step_kernels(rt, w, new_keys, path) {
            if ks.iter().any(|k| k == name) {
                return Ok(path);
            }
        }
    }
    Err(Error::invalid(
        "kernel",
        format!(
            "{name}: no decode step of workload {w} with {new_keys} new key(s) launches it \
             under any select path; its step launches {}",
            auto.join(", ")
        ),
    ))
}

fn resolve_alias(name: &str, w: &StepWorkload) -> Result<String> {
    Ok(match name {
        "pq_select" | "select" => select_kernel_name(&w.cfg, w.shape.s)?,
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
    /// A kernel of the decode step, timed through the indexer.
    Step,
}

fn kind_of(name: &str) -> Option<Kind> {
    if name == SCORE_V6 {
        return Some(Kind::ScoreV6);
    }
    if let Some(qt) = name.strip_prefix(SCORE_LUT_PREFIX) {
        return qt.parse().ok().map(Kind::ScoreLut);
    }
    STEP_PREFIXES
        .iter()
        .any(|p| name.starts_with(p) && name.len() > p.len())
        .then_some(Kind::Step)
}

mod common;
mod score_lut;
mod score_v6;
mod step;

use score_lut::ScoreLutTarget;
use score_v6::ScoreV6Target;
use step::{StepSpec, StepTarget};
