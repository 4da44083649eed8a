//! The GPU timing backend's entry point.
//!
//! [`gpu_targets`] is where the runtime (`device` + `kernel` + `artifact`) meets the
//! tuner: for each requested kernel and workload it must build one [`TuneTarget`] that
//!
//! - takes the kernel's variants for the device's arch from the verified manifest as a
//!   [`CandidateSet`](super::CandidateSet) (manifest `default` = the default candidate;
//!   `artifact_sha256` = the sha256 of the cubin or PTX actually loaded);
//! - computes the bucket with [`bucket_for`](super::bucket_for) from the workload's
//!   [`ShapeFeatures`](super::ShapeFeatures) for that kernel;
//! - allocates [`input_sets_for`](super::input_sets_for)`(bytes per launch, L2 size)`
//!   seeded random input sets (never all zeros) and poisons outputs before each checked
//!   run;
//! - times with CUDA events recorded around `launches_per_sample` launches on one
//!   stream, after the warm-up launches, rotating over the input sets;
//! - compares outputs with [`compare_exact`](super::compare_exact) (indices, lengths,
//!   codes) or [`compare_f32`](super::compare_f32) (scores).
//!
//! Until the launcher lands in this crate it is a stub that says so; everything else in
//! `tritonrt autotune` (import, export, show) works without a GPU.

use std::path::PathBuf;

use super::bucket::Workload;
use super::procedure::TuneTarget;
use super::table::DeviceKey;
use crate::error::{Error, Result};

/// What `tritonrt autotune` asks the GPU backend for.
#[derive(Debug, Clone)]
pub struct GpuRequest {
    /// CUDA device ordinal.
    pub device: usize,
    /// The ptx_cache directory holding `manifest.json`.
    pub ptx_cache: PathBuf,
    /// Logical kernel names to tune; empty means every kernel in the manifest.
    pub kernels: Vec<String>,
    /// Workloads to tune for (one bucket per kernel and workload).
    pub workloads: Vec<Workload>,
}

/// The GPU backend's answer: the device identity and one target per kernel and bucket.
pub struct GpuSession {
    /// The device the targets time on (keys the table entries).
    pub device: DeviceKey,
    /// One target per (kernel, workload), in request order.
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

/// Build the GPU tuning targets for `req`.
///
/// # Errors
///
/// [`Error::TuneNoDevice`] when no CUDA driver or device can be used. At present this
/// build has no GPU timing backend wired in, so it always returns that error, naming
/// the request.
pub fn gpu_targets(req: &GpuRequest) -> Result<GpuSession> {
    let kernels = if req.kernels.is_empty() {
        "every kernel".to_string()
    } else {
        req.kernels.join(", ")
    };
    Err(Error::TuneNoDevice {
        reason: format!(
            "no GPU timing backend is available in this build (no CUDA driver found, or the \
             kernel launcher is not wired into tune::gpu_targets yet); asked to tune {kernels} \
             on device {} with {}; import, export and --show work without a GPU",
            req.device,
            req.ptx_cache.display()
        ),
    })
}

/// The tuned select-kernel variant for this device, config and shape, from the user
/// tuning table; `None` when no valid entry exists (the caller uses the manifest default).
pub fn tuned_select_variant(
    rt: &std::sync::Arc<crate::kernel::Runtime>,
    cfg: &crate::pq::PqConfig,
    shape: &crate::pq::Shape,
) -> Option<String> {
    let _ = (rt, cfg, shape);
    None
}
