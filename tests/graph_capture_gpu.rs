//! On a GPU: graph captures that the driver invalidates are begun again
//! (`KernelGraph::capture`). A crate of its own, so that no other test's runtime drop (a
//! wait on the whole context, which invalidates captures on any thread) runs beside it.
//! Skips with a visible `SKIP:` line when no CUDA driver or device is present.

#[macro_use]
mod common;

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};
use rand::{Rng, SeedableRng};
use tritonrt::abi::KernelArg;
use tritonrt::driver::{DeviceBuf, KernelGraph};

const BLOCK: usize = 1024;

/// Captures the driver invalidates are begun again: `issue` waits for the whole context
/// on its first call (a capture-unsafe call from the capturing thread, which invalidates
/// the capture), so the capture takes two attempts and its graph replays axpy bit-exactly
/// into a NaN-poisoned output; an `issue` that does so on every call fails after
/// `KernelGraph::CAPTURE_ATTEMPTS` attempts with an error that says so.
#[test]
fn graph_capture_begins_an_invalidated_capture_again() {
    let Some((dev, rt, _cubins)) =
        common::fixture_runtime("graph_capture_begins_an_invalidated_capture_again")
    else {
        return;
    };
    let k = rt.default_kernel("axpy_kernel").unwrap();
    let stream = dev.new_stream().unwrap();
    let s = common::test_seed();
    let mut rng = rand::rngs::StdRng::seed_from_u64(s);
    let n = 65536 + rng.random_range(1..BLOCK - 1);
    let x: Vec<f32> = (0..n).map(|_| rng.random_range(-100.0f32..100.0)).collect();
    let y: Vec<f32> = (0..n).map(|_| rng.random_range(-100.0f32..100.0)).collect();
    let a: f32 = rng.random_range(0.5f32..3.0);
    let xd = stream.clone_htod(&x).unwrap();
    let yd = stream.clone_htod(&y).unwrap();
    let mut outd = stream.clone_htod(&vec![f32::NAN; n]).unwrap();
    let grid = [n.div_ceil(BLOCK) as u32, 1, 1];
    let axpy = |st: &Arc<CudaStream>, out: &CudaSlice<f32>| {
        // Bounds: x, y and out hold n elements; the kernel touches indices < n.
        k.launch(
            st,
            grid,
            &[
                KernelArg::Buf(DeviceBuf::of(&xd, st)),
                KernelArg::Buf(DeviceBuf::of(&yd, st)),
                KernelArg::Buf(DeviceBuf::of(out, st)),
                KernelArg::F32(a),
                KernelArg::I32(n as i32),
            ],
        )
    };

    let mut calls = 0;
    let g = KernelGraph::capture(&stream, |st| {
        calls += 1;
        if calls == 1 {
            let refused = dev.synchronize();
            assert!(
                refused.is_err(),
                "a context wait during a capture was allowed"
            );
        }
        axpy(st, &outd)
    })
    .unwrap();
    assert_eq!((g.capture_attempts(), calls), (2, 2));
    g.launch().unwrap();
    let out = stream.clone_dtoh(&outd).unwrap();
    let bad = (0..n)
        .filter(|&i| out[i].to_bits() != a.mul_add(x[i], y[i]).to_bits())
        .count();
    assert_eq!(bad, 0, "{bad} of {n} elements wrong (seed {s})");

    let mut calls = 0;
    let err = KernelGraph::capture(&stream, |st| {
        calls += 1;
        let _ = dev.synchronize();
        axpy(st, &outd)
    })
    .unwrap_err();
    assert_eq!(calls, KernelGraph::CAPTURE_ATTEMPTS);
    let msg = err.to_string();
    assert!(
        msg.contains(&format!("{} attempts", KernelGraph::CAPTURE_ATTEMPTS)),
        "{msg}"
    );
    // the stream is usable again: a plain launch after the failed captures
    stream.memcpy_htod(&vec![f32::NAN; n], &mut outd).unwrap();
    axpy(&stream, &outd).unwrap();
    let out = stream.clone_dtoh(&outd).unwrap();
    assert!((0..n).all(|i| out[i].to_bits() == a.mul_add(x[i], y[i]).to_bits()));
    eprintln!("GPU: an invalidated capture begun again (2 attempts, replay bit-exact); {msg}");
}
