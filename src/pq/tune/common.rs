//! Helpers shared by the tuning targets: argument building, seeded inputs, timing.

use crate::abi::{arg_positions, KernelArg};
use crate::artifact::{ArgType, Dtype};
use crate::driver::device::Device;
use crate::driver::{DeviceBuf, DeviceDtype, Kernel};
use crate::error::Result;
use crate::pq::DType;
use crate::tune::bucket::align_of;
use crate::tune::procedure::TimingPlan;
use cudarc::driver::{CudaSlice, CudaStream};
use rand::rngs::SmallRng;
use rand::{Rng, RngCore, SeedableRng};
use rand_distr::StandardNormal;
use std::sync::Arc;

// ---------------------------------------------------------------------------------
// shared helpers

pub(super) fn err_s(e: impl std::fmt::Display) -> String {
    e.to_string()
}

pub(super) fn constexpr(k: &Kernel, name: &str) -> std::result::Result<usize, String> {
    k.variant()
        .constexprs
        .get(name)
        .and_then(|v| v.as_u64())
        .map(|v| v as usize)
        .ok_or_else(|| format!("variant {} has no integer constexpr {name}", k.id()))
}

/// Order named arguments by the variant's signature ([`arg_positions`]: every
/// argument exactly once, no unknown name).
pub(super) fn named_args(
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

pub(super) fn i32a(what: &str, v: usize) -> std::result::Result<KernelArg, String> {
    i32::try_from(v)
        .map(KernelArg::I32)
        .map_err(|_| format!("{what} = {v} does not fit the kernel's i32 argument"))
}

pub(super) fn i64a(v: usize) -> KernelArg {
    KernelArg::I64(v as i64)
}

pub(super) fn dbuf<T: DeviceDtype>(s: &CudaSlice<T>, stream: &CudaStream) -> DeviceBuf {
    DeviceBuf::of(s, stream)
}

/// The element dtype of `k`'s pointer argument `name` (for a buffer of bytes).
pub(super) fn ptr_dtype(k: &Kernel, name: &str) -> std::result::Result<Dtype, String> {
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
pub(super) fn set_n(n: usize, align: u64, s: usize, n_sets: usize) -> usize {
    if s + 1 == n_sets && n_sets > 1 && align_of(n as u64) > align && n > 1 {
        n - 1
    } else {
        n
    }
}

/// A seeded RNG for chunk `i` of stream `stream` of a target's inputs.
pub(super) fn rng_for(seed: u64, stream: u64, i: usize) -> SmallRng {
    let z = seed
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(stream.wrapping_mul(0xBF58_476D_1CE4_E5B9))
        .wrapping_add(i as u64);
    SmallRng::seed_from_u64(z)
}

pub(super) const CHUNK: usize = 1 << 16;

/// Standard-normal values rounded to `dtype`, generated on all cores.
pub(super) fn normal_vec(len: usize, seed: u64, stream: u64, dtype: DType) -> Vec<f32> {
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
pub(super) fn codes_vec<T: Send + TryFrom<u32> + Default + Copy>(
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
pub(super) fn to_bytes(v: &[f32], dtype: DType) -> Vec<u8> {
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
pub(super) fn time_with_events(
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
