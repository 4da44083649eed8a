//! [`ShardedIndexer`]: the decode-step indexer with its heads split over several GPUs of
//! one process, as a tensor-parallel engine shards attention ([`ShardPlan`]).
//!
//! Each device has its own [`Runtime`] (context, loaded kernels; the on-disk cubin cache
//! and tuning table are shared, keyed by arch and driver), and each shard is a plain
//! [`GpuIndexer`] on a stream of its device holding the codes, centroids and phi of its
//! KV heads only. A step issues every shard's launches on its own stream (nothing is
//! copied between devices, nothing waits), then the caller synchronizes when it needs the
//! outputs ([`ShardedIndexer::synchronize`]). Each shard writes the rows of its own query
//! heads, in its own buffers or the caller's; [`ShardedIndexer::download_stitched`]
//! stitches them into the full `[B, H, ...]` outputs on the host.
//!
//! Nothing of one device is handed to another: each shard's stream is checked against
//! its runtime's device at creation, and each step's query, key and output buffers when
//! their addresses change ([`crate::Error::DeviceMismatch`], naming both ordinals).

use std::sync::Arc;

use cudarc::driver::CudaStream;

use crate::error::{Error, Result};
use crate::pq::config::{PqConfig, Shape};
use crate::pq::harness::{DeviceInputs, StepTiming};
use crate::pq::indexer::{GpuIndexer, LaunchMode};
use crate::pq::launch::DeviceTensorRef;
use crate::pq::memory::StateBytes;
use crate::pq::plan::{SelectPath, StepInfo};
use crate::pq::reference::PqOutput;
use crate::pq::shard_plan::ShardPlan;
use crate::pq::state::StepOutputs;
use crate::pq::variants::KernelChoice;
use crate::pq::workload::PqInputs;
use crate::runtime::Runtime;

/// One shard's step inputs, on that shard's device: `query [B, H/G, 1, D]` (its query
/// heads) and `key [B, H_kv/G, S_alloc, D]` (its KV heads), as [`GpuIndexer::step`]
/// takes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardInput {
    /// The shard's query heads.
    pub query: DeviceTensorRef,
    /// The shard's KV heads.
    pub key: DeviceTensorRef,
}

/// The indexer over `G` devices (see the module docs). Not `Sync`, like [`GpuIndexer`].
pub struct ShardedIndexer {
    plan: ShardPlan,
    shards: Vec<GpuIndexer>,
}

impl ShardedIndexer {
    /// Shard `shape`'s heads over `runtimes` (one per shard, in shard order; shard `d`
    /// takes query heads `[d H/G, (d+1) H/G)` and KV heads likewise), each on a new
    /// stream of its device. `centroids` (`f32 [B, H_kv, M, K, d_c]`) and `phi`
    /// (`f32 [B * H_kv * M]`, metric ip) are the full host tensors; each shard uploads
    /// its slice. `choice` picks every shard's variants (each shard's bucket is its own
    /// shape's). A runtime may appear twice (two shards on one GPU, each on its own
    /// stream: the split without a second device).
    ///
    /// Errors: no runtime; `H_kv % G != 0` (see [`ShardPlan::new`]); those of
    /// [`GpuIndexer::new`] for any shard.
    pub fn new(
        runtimes: &[Arc<Runtime>],
        cfg: PqConfig,
        shape: Shape,
        centroids: &[f32],
        phi: Option<&[f32]>,
        choice: &KernelChoice,
    ) -> Result<Self> {
        let streams = runtimes
            .iter()
            .map(|rt| rt.device().new_stream())
            .collect::<Result<Vec<_>>>()?;
        Self::with_streams(runtimes, streams, cfg, shape, centroids, phi, choice)
    }

    /// [`ShardedIndexer::new`] on the caller's streams (an engine's, one per shard):
    /// `streams[d]` must belong to `runtimes[d]`'s device and context.
    ///
    /// Errors: as [`ShardedIndexer::new`]; a stream count other than the runtime count;
    /// a stream of another device than its runtime's ([`Error::DeviceMismatch`], naming
    /// both ordinals).
    pub fn with_streams(
        runtimes: &[Arc<Runtime>],
        streams: Vec<Arc<CudaStream>>,
        cfg: PqConfig,
        shape: Shape,
        centroids: &[f32],
        phi: Option<&[f32]>,
        choice: &KernelChoice,
    ) -> Result<Self> {
        if streams.len() != runtimes.len() {
            return Err(Error::invalid(
                "streams",
                format!(
                    "{} streams for {} runtimes (one stream per shard)",
                    streams.len(),
                    runtimes.len()
                ),
            ));
        }
        let plan = ShardPlan::new(shape, runtimes.len())?;
        cfg.validate(&shape)?;
        let mut shards = Vec::with_capacity(runtimes.len());
        for (d, (rt, stream)) in runtimes.iter().zip(streams).enumerate() {
            let cent = plan.slice_centroids(&cfg, centroids, d)?;
            let phi_d = match phi {
                Some(p) => Some(plan.slice_phi(&cfg, p, d)?),
                None => None,
            };
            shards.push(GpuIndexer::new(
                rt.clone(),
                stream,
                cfg,
                plan.shard_shape(),
                &cent,
                phi_d.as_deref(),
                choice,
            )?);
        }
        Ok(ShardedIndexer { plan, shards })
    }

    /// A sharded indexer from indexers the caller made itself, one per shard in shard
    /// order (e.g. each from its device's prefill, [`GpuIndexer::from_prefill`]), each
    /// for [`ShardPlan::shard_shape`] of `shape` over `indexers.len()` devices.
    ///
    /// Errors: `H_kv % G != 0`; an indexer whose shape is not the shard shape (named).
    pub fn from_indexers(shape: Shape, indexers: Vec<GpuIndexer>) -> Result<Self> {
        let plan = ShardPlan::new(shape, indexers.len())?;
        let want = plan.shard_shape();
        for (d, ix) in indexers.iter().enumerate() {
            let got = ix.shape();
            if (got.b, got.h, got.h_kv, got.d) != (want.b, want.h, want.h_kv, want.d) {
                return Err(Error::invalid(
                    "shard",
                    format!(
                        "indexer {d} is for {got}, a shard of {shape} over {} devices is {want}",
                        indexers.len()
                    ),
                ));
            }
        }
        Ok(ShardedIndexer {
            plan,
            shards: indexers,
        })
    }

    /// How the heads are split.
    pub fn plan(&self) -> &ShardPlan {
        &self.plan
    }

    /// The shards' indexers, in shard order.
    pub fn shards(&self) -> &[GpuIndexer] {
        &self.shards
    }

    /// Shard `d`'s indexer, mutably. Panics if `d >= G`.
    pub fn shard_mut(&mut self, d: usize) -> &mut GpuIndexer {
        &mut self.shards[d]
    }

    /// The device ordinal of each shard, in shard order.
    pub fn ordinals(&self) -> Vec<usize> {
        self.shards
            .iter()
            .map(|s| s.runtime().device().ordinal())
            .collect()
    }

    /// Choose the select path of every shard's later steps.
    pub fn set_select_path(&mut self, path: SelectPath) {
        self.shards.iter_mut().for_each(|s| s.set_select_path(path));
    }

    /// Replace every shard's code state with its KV heads of the full upstream-layout
    /// codes `i64 [B, n, H_kv, M]`. Synchronous.
    ///
    /// Errors: a length mismatch, a code out of range (as
    /// [`GpuIndexer::import_codes`]), driver errors.
    pub fn import_codes(&mut self, codes: &[i64], n: usize) -> Result<()> {
        for d in 0..self.shards.len() {
            let cfg = *self.shards[d].config();
            let part = self.plan.slice_codes(&cfg, codes, n, d)?;
            self.shards[d].import_codes(&part, n)?;
        }
        Ok(())
    }

    /// Upload the full host `inputs` as each shard's query and key heads, on that
    /// shard's stream and device (see [`DeviceInputs::upload`]).
    ///
    /// Errors: inputs of another shape; driver errors.
    pub fn upload(&self, inputs: &PqInputs) -> Result<Vec<DeviceInputs>> {
        (0..self.shards.len())
            .map(|d| {
                let ix = &self.shards[d];
                let cfg = *ix.config();
                let part = self.plan.slice_inputs(&cfg, inputs, d)?;
                DeviceInputs::upload(ix.stream(), &part, &cfg)
            })
            .collect()
    }

    /// The [`ShardInput`]s of uploaded inputs.
    pub fn inputs_of(uploaded: &[DeviceInputs]) -> Vec<ShardInput> {
        uploaded
            .iter()
            .map(|u| ShardInput {
                query: *u.query(),
                key: *u.key(),
            })
            .collect()
    }

    fn check_count(&self, what: &str, n: usize) -> Result<()> {
        if n != self.shards.len() {
            return Err(Error::invalid(
                what,
                format!("{n} given for {} shards (one per shard)", self.shards.len()),
            ));
        }
        Ok(())
    }

    /// One decode step at length `s` on every shard: each shard's launches are issued on
    /// its own stream, in shard order, and nothing waits (call
    /// [`ShardedIndexer::synchronize`]). `inputs[d]` lives on shard `d`'s device.
    ///
    /// Errors: not one input per shard; those of [`GpuIndexer::step`] (a buffer of
    /// another device included). On an error, the shards before the failing one have
    /// issued their step.
    pub fn step(
        &mut self,
        inputs: &[ShardInput],
        s: usize,
        mode: LaunchMode,
    ) -> Result<Vec<StepInfo>> {
        self.check_count("shard inputs", inputs.len())?;
        self.shards
            .iter_mut()
            .zip(inputs)
            .map(|(ix, i)| ix.step(&i.query, &i.key, s, mode))
            .collect()
    }

    /// [`ShardedIndexer::step`] writing into the caller's buffers: `outputs[d]` on shard
    /// `d`'s device, sized for its rows (`B x H/G`), as [`GpuIndexer::step_into`].
    ///
    /// Errors: not one input and one output set per shard; those of
    /// [`GpuIndexer::step_into`].
    pub fn step_into(
        &mut self,
        inputs: &[ShardInput],
        s: usize,
        mode: LaunchMode,
        outputs: &[StepOutputs],
    ) -> Result<Vec<StepInfo>> {
        self.check_count("shard inputs", inputs.len())?;
        self.check_count("shard outputs", outputs.len())?;
        self.shards
            .iter_mut()
            .zip(inputs.iter().zip(outputs))
            .map(|(ix, (i, o))| ix.step_into(&i.query, &i.key, s, mode, *o))
            .collect()
    }

    /// Wait for every shard's steps. Errors: driver errors (a kernel's fault surfaces
    /// here, on the shard that ran it).
    pub fn synchronize(&self) -> Result<()> {
        self.shards.iter().try_for_each(|s| s.synchronize())
    }

    /// Forget quantized keys past `n` on every shard (see [`GpuIndexer::rewind`]).
    pub fn rewind(&mut self, n: usize) {
        self.shards.iter_mut().for_each(|s| s.rewind(n));
    }

    /// Every device byte the shards allocated, summed over the devices (see
    /// [`GpuIndexer::state_bytes`]; each device holds its own shard's).
    pub fn state_bytes(&self) -> usize {
        self.shards.iter().map(GpuIndexer::state_bytes).sum()
    }

    /// [`ShardedIndexer::state_bytes`] by group of buffers, summed over the shards.
    pub fn memory(&self) -> StateBytes {
        self.shards
            .iter()
            .fold(StateBytes::default(), |acc, ix| acc.add(&ix.memory()))
    }

    /// Allocate every shard's buffers for a step at `s` (see [`GpuIndexer::prepare`]).
    ///
    /// Errors: driver errors.
    pub fn prepare(&mut self, s: usize) -> Result<()> {
        self.shards.iter_mut().try_for_each(|ix| ix.prepare(s))
    }

    /// Poison every shard's own output buffers (see [`GpuIndexer::poison_outputs`]).
    ///
    /// Errors: driver errors.
    pub fn poison_outputs(&mut self) -> Result<()> {
        self.shards.iter_mut().try_for_each(|s| s.poison_outputs())
    }

    /// Each shard's last outputs and codes on the host, in shard order: its rows only
    /// (`[B, H/G, ...]`, codes `[B, n, H_kv/G, M]`). Synchronous.
    ///
    /// Errors: as [`GpuIndexer::download`].
    pub fn download(&self) -> Result<Vec<PqOutput>> {
        self.shards.iter().map(|s| s.download()).collect()
    }

    /// The last step's full outputs `[B, H, ...]` and codes `[B, n, H_kv, M]`, stitched
    /// from the shards' ([`ShardPlan::stitch`]). Synchronous.
    ///
    /// Errors: as [`ShardedIndexer::download`].
    pub fn download_stitched(&self) -> Result<PqOutput> {
        self.plan.stitch(&self.download()?)
    }
}

/// What [`bench_sharded`] measured (microseconds per step; medians and spread in
/// [`StepTiming`]).
#[derive(Debug, Clone, PartialEq)]
pub struct ShardedBench {
    /// Device ordinal of each shard.
    pub ordinals: Vec<usize>,
    /// The shape each shard runs.
    pub shard_shape: Shape,
    /// Each shard alone (the others idle): wall-clock of step + synchronize.
    pub alone_wall: Vec<StepTiming>,
    /// Each shard alone: GPU time (CUDA events on its stream).
    pub alone_gpu: Vec<StepTiming>,
    /// The sharded step: every shard's step issued, then every stream synchronized
    /// (wall-clock of the whole).
    pub sharded_wall: StepTiming,
    /// The sharded step: GPU time of each shard's part (CUDA events on its stream, all
    /// shards issued before any is waited for).
    pub sharded_gpu: Vec<StepTiming>,
}

/// Time `ix`'s step at `s` on `inputs` (one per shard) in `mode`: each shard alone, then
/// all shards together (issued, then synchronized), each after a warm-up of
/// `steps / 10` (3 to 50) steps, rewinding to `n_cached` before each step so every step
/// quantizes the same new keys. Wall-clock and GPU time are taken in separate loops so
/// event records never sit inside the host-timed region.
///
/// Errors: the indexer's errors; driver errors; `steps == 0`.
pub fn bench_sharded(
    ix: &mut ShardedIndexer,
    inputs: &[ShardInput],
    s: usize,
    n_cached: usize,
    steps: usize,
    mode: LaunchMode,
) -> Result<ShardedBench> {
    if steps == 0 {
        return Err(Error::invalid("steps", "at least one timed step is needed"));
    }
    ix.check_count("shard inputs", inputs.len())?;
    let drv = |what: &'static str| move |e| crate::driver::device::driver_err(what, e);
    let g = ix.shards.len();
    let events = ix
        .shards
        .iter()
        .map(|sh| {
            let dev = sh.runtime().device();
            Ok((dev.new_event(true)?, dev.new_event(true)?))
        })
        .collect::<Result<Vec<_>>>()?;
    let warmup = (steps / 10).clamp(3, 50);
    // `shards`: which shards run (one alone, or all); `gpu`: record events around each
    // shard's step. Returns per-step samples: the wall time, and each shard's GPU time.
    let mut run = |shards: &[usize], gpu: bool| -> Result<(Vec<f64>, Vec<Vec<f64>>)> {
        let mut wall = Vec::with_capacity(steps);
        let mut gpus = vec![Vec::with_capacity(steps); shards.len()];
        for i in 0..warmup + steps {
            for &d in shards {
                ix.shards[d].rewind(n_cached);
            }
            let t = std::time::Instant::now();
            for &d in shards {
                let sh = &mut ix.shards[d];
                if gpu {
                    events[d]
                        .0
                        .record(sh.stream())
                        .map_err(drv("recording an event"))?;
                }
                sh.step(&inputs[d].query, &inputs[d].key, s, mode)?;
                if gpu {
                    events[d]
                        .1
                        .record(sh.stream())
                        .map_err(drv("recording an event"))?;
                }
            }
            for &d in shards {
                ix.shards[d].synchronize()?;
            }
            let us = t.elapsed().as_secs_f64() * 1e6;
            if i >= warmup {
                wall.push(us);
                if gpu {
                    for (k, &d) in shards.iter().enumerate() {
                        let ms = events[d]
                            .0
                            .elapsed_ms(&events[d].1)
                            .map_err(drv("reading an event"))?;
                        gpus[k].push(ms as f64 * 1e3);
                    }
                }
            }
        }
        Ok((wall, gpus))
    };
    let mut alone_wall = Vec::with_capacity(g);
    let mut alone_gpu = Vec::with_capacity(g);
    for d in 0..g {
        let (mut w, _) = run(&[d], false)?;
        alone_wall.push(StepTiming::from_samples(&mut w));
        let (_, mut gp) = run(&[d], true)?;
        alone_gpu.push(StepTiming::from_samples(&mut gp[0]));
    }
    let all: Vec<usize> = (0..g).collect();
    let (mut w, _) = run(&all, false)?;
    let sharded_wall = StepTiming::from_samples(&mut w);
    let (_, gp) = run(&all, true)?;
    let sharded_gpu = gp
        .into_iter()
        .map(|mut v| StepTiming::from_samples(&mut v))
        .collect();
    Ok(ShardedBench {
        ordinals: ix.ordinals(),
        shard_shape: ix.plan.shard_shape(),
        alone_wall,
        alone_gpu,
        sharded_wall,
        sharded_gpu,
    })
}
