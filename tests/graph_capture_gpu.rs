//! On a GPU: graph captures that the driver invalidates are begun again
//! (`KernelGraph::capture`), and tritonrt's context-wide calls on other threads wait for
//! captures instead of invalidating them. A crate of its own, so that no other test's
//! calls run beside these (the tests here take turns: one invalidates its own captures
//! on purpose). Skips with a visible `SKIP:` line when no CUDA driver or device is
//! present.

#[macro_use]
mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaSlice, CudaStream};
use rand::{Rng, SeedableRng};
use tritonrt::abi::KernelArg;
use tritonrt::driver::{DeviceBuf, Kernel, KernelGraph};

const BLOCK: usize = 1024;

/// Fresh axpy inputs: `(seed, n, x, y, a)` with `n` just past `min_n` (a partial last
/// CTA), `x`, `y` in [-100, 100), `a` in [0.5, 3).
fn axpy_inputs(min_n: usize) -> (u64, usize, Vec<f32>, Vec<f32>, f32) {
    let s = common::test_seed();
    let mut rng = rand::rngs::StdRng::seed_from_u64(s);
    let n = min_n + rng.random_range(1..BLOCK - 1);
    let x: Vec<f32> = (0..n).map(|_| rng.random_range(-100.0f32..100.0)).collect();
    let y: Vec<f32> = (0..n).map(|_| rng.random_range(-100.0f32..100.0)).collect();
    (s, n, x, y, rng.random_range(0.5f32..3.0))
}

/// The axpy kernel's arguments on `st`: `out = a * x + y` over `out.len()` elements
/// (`x`, `y` and `out` of one length; the kernel touches indices below it).
fn axpy_args(
    st: &Arc<CudaStream>,
    x: &CudaSlice<f32>,
    y: &CudaSlice<f32>,
    out: &CudaSlice<f32>,
    a: f32,
) -> Vec<KernelArg> {
    vec![
        KernelArg::Buf(DeviceBuf::of(x, st)),
        KernelArg::Buf(DeviceBuf::of(y, st)),
        KernelArg::Buf(DeviceBuf::of(out, st)),
        KernelArg::F32(a),
        KernelArg::I32(out.len() as i32),
    ]
}

/// The tests of this crate run one at a time (a capture invalidated on purpose on one
/// thread may take another thread's capture with it).
static TURNS: Mutex<()> = Mutex::new(());

/// Captures the driver invalidates are begun again: `issue` waits for the whole context
/// on its first call (a capture-unsafe call from the capturing thread, which invalidates
/// the capture), so the capture takes two attempts and its graph replays axpy bit-exactly
/// into a NaN-poisoned output; an `issue` that does so on every call fails after
/// `KernelGraph::CAPTURE_ATTEMPTS` attempts with an error that says so.
#[test]
fn graph_capture_begins_an_invalidated_capture_again() {
    let _turn = TURNS.lock().unwrap_or_else(|p| p.into_inner());
    let Some((dev, rt, _cubins)) =
        common::fixture_runtime("graph_capture_begins_an_invalidated_capture_again")
    else {
        return;
    };
    let k = rt.default_kernel("axpy_kernel").unwrap();
    let stream = dev.new_stream().unwrap();
    let (s, n, x, y, a) = axpy_inputs(65536);
    let xd = stream.clone_htod(&x).unwrap();
    let yd = stream.clone_htod(&y).unwrap();
    let mut outd = stream.clone_htod(&vec![f32::NAN; n]).unwrap();
    let grid = [n.div_ceil(BLOCK) as u32, 1, 1];
    let axpy = |st: &Arc<CudaStream>, out: &CudaSlice<f32>| {
        k.launch(st, grid, &axpy_args(st, &xd, &yd, out, a))
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

/// While one thread captures graph after graph, another thread waits on the whole context
/// and loads, launches and drops modules (a kernel of its own each time: load, context
/// wait, unload) as fast as it can. Each of those calls waits for the capture running at
/// the time, so no capture is invalidated (one attempt each), no context wait is refused,
/// and every graph replays axpy bit-exactly into a NaN-poisoned output. Without the wait
/// the driver invalidated captures within a few hundred, refused waits, and crashed.
#[test]
fn context_wide_calls_on_other_threads_wait_for_captures() {
    let _turn = TURNS.lock().unwrap_or_else(|p| p.into_inner());
    let Some((dev, rt, _cubins)) =
        common::fixture_runtime("context_wide_calls_on_other_threads_wait_for_captures")
    else {
        return;
    };
    let k = rt.default_kernel("axpy_kernel").unwrap();
    let variant = k.variant().clone();
    let built = rt.cache().get_or_build(&dev, rt.store(), &variant).unwrap();
    let (s, n, x, y, a) = axpy_inputs(4096);
    let grid = [n.div_ceil(BLOCK) as u32, 1, 1];
    let want: Vec<u32> = (0..n).map(|i| a.mul_add(x[i], y[i]).to_bits()).collect();

    const CAPTURES: usize = 300;
    let capturing = AtomicBool::new(true);
    let (attempts, bad, other) = std::thread::scope(|sc| {
        let other = sc.spawn(|| {
            // the other thread: context waits, and kernels loaded, run and dropped
            let st = dev.new_stream().unwrap();
            let xd = st.clone_htod(&x).unwrap();
            let yd = st.clone_htod(&y).unwrap();
            let outd = st.clone_htod(&vec![f32::NAN; n]).unwrap();
            let (mut waits, mut loads) = (0usize, 0usize);
            while capturing.load(Ordering::SeqCst) {
                dev.synchronize().expect("a context wait beside a capture");
                waits += 1;
                let mine = Kernel::load(&dev, &variant, &built).unwrap();
                mine.launch(&st, grid, &axpy_args(&st, &xd, &yd, &outd, a))
                    .unwrap();
                drop(mine);
                loads += 1;
            }
            let out = st.clone_dtoh(&outd).unwrap();
            let ok = (0..n).all(|i| out[i].to_bits() == want[i]);
            (waits, loads, ok)
        });
        let st = dev.new_stream().unwrap();
        let xd = st.clone_htod(&x).unwrap();
        let yd = st.clone_htod(&y).unwrap();
        let mut outd = st.clone_htod(&vec![f32::NAN; n]).unwrap();
        let mut attempts = Vec::with_capacity(CAPTURES);
        let mut bad = 0usize;
        for c in 0..CAPTURES {
            let g = KernelGraph::capture(&st, |gs| {
                k.launch(gs, grid, &axpy_args(gs, &xd, &yd, &outd, a))
            })
            .unwrap();
            attempts.push(g.capture_attempts());
            if c % 30 == 0 {
                st.memcpy_htod(&vec![f32::NAN; n], &mut outd).unwrap();
                g.launch().unwrap();
                let out = st.clone_dtoh(&outd).unwrap();
                bad += (0..n).filter(|&i| out[i].to_bits() != want[i]).count();
            }
        }
        capturing.store(false, Ordering::SeqCst);
        (attempts, bad, other.join().unwrap())
    });
    let (waits, loads, other_ok) = other;
    let retried = attempts.iter().filter(|&&t| t > 1).count();
    assert_eq!(
        retried, 0,
        "{retried} of {CAPTURES} captures were invalidated"
    );
    assert_eq!(bad, 0, "{bad} elements wrong in the replays (seed {s})");
    assert!(
        other_ok,
        "the other thread's launches were wrong (seed {s})"
    );
    assert!(
        waits > 0 && loads > 0,
        "the other thread made no call while captures ran"
    );
    eprintln!(
        "GPU: {CAPTURES} captures, each at its first attempt, beside {waits} context waits and \
         {loads} module loads and unloads on another thread; replays bit-exact"
    );
}
