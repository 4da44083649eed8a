//! On a GPU: the fp32 axpy fixture launched from Rust matches the CPU exactly, through
//! both the manifest cubin (sm_90a on cc 9.0) and the driver JIT of the portable sm_80
//! PTX; cache hits on reload; argument checks on the real launch path; a PTX newer than
//! the driver is refused before loading; several threads share one Runtime.
//! Skips with a visible `SKIP:` line when no CUDA driver or device is present.

#[macro_use]
mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use rand::{Rng, SeedableRng};
use tritonrt::abi::KernelArg;
use tritonrt::artifact::{manifest_to_bytes, sha256_hex, ArtifactStore};
use tritonrt::driver::CacheOutcome;
use tritonrt::driver::Kernel;
use tritonrt::driver::{probe_driver, Device, DeviceBuf};
use tritonrt::jit::CubinCache;
use tritonrt::runtime::Runtime;
use tritonrt::Error;

const SM90: &str = "axpy_kernel.BLOCK=1024.w4.s1.sm90";
const SM80: &str = "axpy_kernel.BLOCK=1024.w4.s1.sm80";
const BLOCK: usize = 1024;

fn fixtures() -> PathBuf {
    std::env::var_os("TRITONRT_TEST_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures"))
}

fn device_or_skip(test: &str) -> Option<Arc<Device>> {
    match probe_driver().and_then(|_| Device::new(0)) {
        Ok(d) => Some(d),
        Err(e) => {
            skip!("{test}: no CUDA device: {e}");
            None
        }
    }
}

fn seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

fn ptr<T>(s: &CudaSlice<T>, stream: &Arc<CudaStream>) -> u64 {
    let (p, _sync) = s.device_ptr(stream);
    p
}

/// Run axpy on fresh random data with `k` and check every element bit-exactly against
/// `a.mul_add(x, y)` (Triton fuses `a * x + y` into one fp32 FMA, which is correctly
/// rounded, as is f32::mul_add), and within half an f32 ulp of the f64 reference.
/// Elements past `n` were poisoned with NaN and must stay NaN (the mask works).
fn check_axpy(k: &Kernel, stream: &Arc<CudaStream>, seed: u64) -> usize {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let n = 1_000_000 + rng.random_range(1..BLOCK - 1); // never a multiple of BLOCK
    let pad = 4096;
    let x: Vec<f32> = (0..n).map(|_| rng.random_range(-100.0f32..100.0)).collect();
    let y: Vec<f32> = (0..n).map(|_| rng.random_range(-100.0f32..100.0)).collect();
    let a: f32 = rng.random_range(0.5f32..3.0) * if rng.random::<bool>() { -1.0 } else { 1.0 };
    let xd = stream.clone_htod(&x).unwrap();
    let yd = stream.clone_htod(&y).unwrap();
    let mut outd = stream.clone_htod(&vec![f32::NAN; n + pad]).unwrap();
    let grid = [n.div_ceil(BLOCK) as u32, 1, 1];
    // typed buffers: the safe launch checks each one's dtype against *fp32
    let args = [
        KernelArg::Buf(DeviceBuf::of(&xd, stream)),
        KernelArg::Buf(DeviceBuf::of(&yd, stream)),
        KernelArg::Buf(DeviceBuf::of(&outd, stream)),
        KernelArg::F32(a),
        KernelArg::I32(n as i32),
    ];
    // Bounds: x, y have n elements and out n + pad; the kernel touches indices < n.
    k.launch(stream, grid, &args).unwrap();
    stream.synchronize().unwrap();
    let out = stream.clone_dtoh(&outd).unwrap();
    let mut mismatches = 0;
    for i in 0..n {
        let want = a.mul_add(x[i], y[i]);
        let ref64 = a as f64 * x[i] as f64 + y[i] as f64;
        let ulp = f32::EPSILON as f64 * (ref64.abs().max(f32::MIN_POSITIVE as f64));
        if out[i].to_bits() != want.to_bits() || (out[i] as f64 - ref64).abs() > ulp {
            if mismatches < 5 {
                eprintln!("  [{i}] got {} want {want} (f64 {ref64})", out[i]);
            }
            mismatches += 1;
        }
    }
    assert_eq!(
        mismatches, 0,
        "{} of {n} elements differ (seed {seed})",
        mismatches
    );
    assert!(out[n..].iter().all(|v| v.is_nan()), "kernel wrote past n");
    // Not a vacuous check: outputs are non-trivial.
    assert!(out[..n].iter().filter(|v| v.abs() > 1.0).count() > n / 2);
    let _ = &mut outd;
    n
}

#[test]
fn axpy_matches_cpu_exactly_via_cubin_and_jit() {
    let Some(dev) = device_or_skip("axpy_matches_cpu_exactly_via_cubin_and_jit") else {
        return;
    };
    let store = ArtifactStore::open(fixtures().join("ptx_cache")).unwrap();
    let t = tempfile::tempdir().unwrap();
    let cache = CubinCache::new(t.path()).unwrap();
    let rt = Runtime::new(dev.clone(), store.clone(), cache.clone());
    let stream = dev.new_stream().unwrap();
    eprintln!(
        "GPU: {} sm_{} driver {} (PTX ISA <= {})",
        dev.name(),
        dev.arch(),
        dev.driver_version(),
        dev.ptx_isa_max()
    );
    let mut ran = 0;
    for v in store.all_variants() {
        if !v.usable_on(dev.cc()) {
            eprintln!(
                "  {} not usable on sm_{} (skipped, expected)",
                v.id,
                dev.arch()
            );
            continue;
        }
        let k = rt.kernel(&v.id).unwrap();
        let info = k.load_info();
        let expect = if v.cubin_matches(dev.cc()) {
            CacheOutcome::ManifestCubin
        } else {
            CacheOutcome::Built
        };
        assert_eq!(info.outcome, expect, "{}", v.id);
        let s = seed();
        let n = check_axpy(&k, &stream, s);
        eprintln!(
            "GPU ran {} via {} (load {:.3} ms, {} regs): n={n} seed={s}: all elements bit-exact",
            v.id,
            info.outcome.label(),
            info.total().as_secs_f64() * 1e3,
            k.num_regs()
        );
        // Loaded once per runtime.
        assert!(Arc::ptr_eq(&k, &rt.kernel(&v.id).unwrap()));
        ran += 1;
    }
    assert!(ran >= 1, "no variant usable on this GPU");
    // The best default for this device.
    let d = rt.default_kernel("axpy_kernel").unwrap();
    let want = if dev.arch() == 90 { SM90 } else { SM80 };
    assert_eq!(d.id(), want);
    assert_eq!(rt.kernel_for("axpy_kernel", Some(SM80)).unwrap().id(), SM80);

    // A fresh runtime over the same cache finds the JIT output (cache hit).
    let rt2 = Runtime::new(dev.clone(), store, cache);
    let k2 = rt2.kernel(SM80).unwrap();
    assert_eq!(k2.load_info().outcome, CacheOutcome::Hit);
    let n = check_axpy(&k2, &stream, seed());
    eprintln!("GPU ran {SM80} from the cubin cache (hit): n={n}: bit-exact");
}

#[test]
fn launch_checks_arguments_before_the_driver() {
    let Some(dev) = device_or_skip("launch_checks_arguments_before_the_driver") else {
        return;
    };
    let store = ArtifactStore::open(fixtures().join("ptx_cache")).unwrap();
    let t = tempfile::tempdir().unwrap();
    let rt = Runtime::new(dev.clone(), store, CubinCache::new(t.path()).unwrap());
    let k = rt.default_kernel("axpy_kernel").unwrap();
    let stream = dev.new_stream().unwrap();
    let buf = stream.clone_htod(&vec![1.0f32; 4096]).unwrap();
    let p = ptr(&buf, &stream);
    let good = [
        KernelArg::RawPtr(p),
        KernelArg::RawPtr(p),
        KernelArg::RawPtr(p),
        KernelArg::F32(2.0),
        KernelArg::I32(4096),
    ];
    let mut misaligned = good;
    misaligned[1] = KernelArg::RawPtr(p + 4);
    // SAFETY: refused before launch; nothing reaches the GPU.
    let e = unsafe { k.launch_raw(&stream, [4, 1, 1], &misaligned) }.unwrap_err();
    assert!(matches!(e, Error::ArgDivisibility { index: 1, .. }), "{e}");
    let mut wrong = good;
    wrong[4] = KernelArg::I64(4096);
    // SAFETY: refused before launch.
    let e = unsafe { k.launch_raw(&stream, [4, 1, 1], &wrong) }.unwrap_err();
    assert!(
        e.to_string()
            .contains("argument 4 (n) expects i32, got I64"),
        "{e}"
    );
    // SAFETY: refused before launch.
    let e = unsafe { k.launch_raw(&stream, [4, 1, 1], &good[..4]) }.unwrap_err();
    assert!(matches!(e, Error::ArgCount { .. }), "{e}");
    // A zero grid launches nothing and is fine, as in Triton.
    // SAFETY: buffers valid; nothing runs.
    unsafe { k.launch_raw(&stream, [0, 1, 1], &good) }.unwrap();
    // The safe launch refuses bare addresses and buffers of another dtype.
    let e = k.launch(&stream, [4, 1, 1], &good).unwrap_err();
    assert!(e.to_string().contains("bare device address"), "{e}");
    let ints = stream.clone_htod(&vec![1i32; 4096]).unwrap();
    let mut typed = good;
    for a in typed.iter_mut().take(3) {
        *a = KernelArg::Buf(DeviceBuf::of(&buf, &stream));
    }
    typed[1] = KernelArg::Buf(DeviceBuf::of(&ints, &stream));
    let e = k.launch(&stream, [4, 1, 1], &typed).unwrap_err();
    assert!(
        e.to_string().contains("expects *fp32, got Buf of *i32"),
        "{e}"
    );
    typed[1] = KernelArg::Buf(DeviceBuf::of(&buf, &stream));
    k.launch(&stream, [0, 1, 1], &typed).unwrap();
    eprintln!(
        "GPU: misaligned pointer, wrong type, wrong arity, a bare address in a safe launch and a buffer of another dtype refused before launch"
    );
}

#[test]
fn ptx_newer_than_driver_is_refused_before_loading() {
    let Some(dev) = device_or_skip("ptx_newer_than_driver_is_refused_before_loading") else {
        return;
    };
    // Copy the store and rewrite the sm_80 PTX to claim ISA 99.0 (manifest updated so
    // the integrity check passes and the version check is what refuses it).
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("ptx_cache");
    fs::create_dir_all(&dir).unwrap();
    for e in fs::read_dir(fixtures().join("ptx_cache")).unwrap() {
        let e = e.unwrap();
        fs::copy(e.path(), dir.join(e.file_name())).unwrap();
    }
    let store = ArtifactStore::open(&dir).unwrap();
    let mut m = store.manifest().clone();
    let v = m.variants.iter_mut().find(|v| v.id == SM80).unwrap();
    let ptx = fs::read_to_string(dir.join(&v.ptx.file)).unwrap();
    let ptx = ptx.replacen(&format!(".version {}", v.ptx_version), ".version 99.0", 1);
    v.ptx.sha256 = sha256_hex(ptx.as_bytes());
    v.ptx.size = ptx.len() as u64;
    v.ptx.file = format!("{}.ptx", v.ptx.sha256);
    v.ptx_version = "99.0".into();
    fs::write(dir.join(&v.ptx.file), &ptx).unwrap();
    fs::write(dir.join("manifest.json"), manifest_to_bytes(&m).unwrap()).unwrap();
    let rt = Runtime::new(
        dev.clone(),
        ArtifactStore::open(&dir).unwrap(),
        CubinCache::new(t.path().join("cubins")).unwrap(),
    );
    let e = rt.kernel(SM80).unwrap_err();
    assert!(matches!(e, Error::PtxTooNew { .. }), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("99.0") && msg.contains(&dev.ptx_isa_max().to_string()),
        "{msg}"
    );
    eprintln!("GPU: refused as expected: {msg}");
}

#[test]
fn threads_share_one_runtime() {
    let Some(dev) = device_or_skip("threads_share_one_runtime") else {
        return;
    };
    let store = ArtifactStore::open(fixtures().join("ptx_cache")).unwrap();
    let t = tempfile::tempdir().unwrap();
    let rt = Runtime::new(dev.clone(), store, CubinCache::new(t.path()).unwrap());
    let base = seed();
    let hs: Vec<_> = (0..4u64)
        .map(|i| {
            let rt = rt.clone();
            std::thread::spawn(move || {
                let k = rt.default_kernel("axpy_kernel").unwrap();
                let stream = rt.device().new_stream().unwrap();
                (0..3)
                    .map(|j| check_axpy(&k, &stream, base + 10 * i + j))
                    .sum::<usize>()
            })
        })
        .collect();
    let total: usize = hs.into_iter().map(|h| h.join().unwrap()).sum();
    assert_eq!(rt.loaded().len(), 1, "loaded once for all threads");
    eprintln!("GPU: 4 threads x 3 launches on their own streams, {total} elements, bit-exact");
}

/// The cuLaunchKernelEx paths and scratch handling, exercised with the axpy cubin under
/// edited metadata (the kernel ignores the scratch pointer and the extra cluster CTAs are
/// masked off, so results must stay bit-exact): a cluster of 2 CTAs, PDL, a cooperative
/// grid, and 128 bytes/CTA of global scratch aligned to 512 that grows with the grid and
/// is freed when its stream goes away.
#[test]
fn launch_ex_paths_and_scratch() {
    let Some(dev) = device_or_skip("launch_ex_paths_and_scratch") else {
        return;
    };
    let store = ArtifactStore::open(fixtures().join("ptx_cache")).unwrap();
    let t = tempfile::tempdir().unwrap();
    let cache = CubinCache::new(t.path()).unwrap();
    let base = store
        .select_for_device("axpy_kernel", dev.cc())
        .unwrap()
        .clone();
    let built = cache.get_or_build(&dev, &store, &base).unwrap();
    type Edit = fn(&mut tritonrt::artifact::Variant);
    let edits: [(&str, Edit); 4] = [
        ("cluster num_ctas=2", |v| v.num_ctas = 2),
        ("launch_pdl", |v| v.launch_pdl = true),
        ("cooperative grid", |v| v.launch_cooperative_grid = true),
        ("global scratch 128 B/CTA, align 512", |v| {
            v.global_scratch_size = 128;
            v.global_scratch_align = 512;
        }),
    ];
    let s = seed();
    for (what, edit) in &edits {
        let mut v = base.clone();
        v.id = format!("{}+{what}", base.id);
        edit(&mut v);
        let k = Kernel::load(&dev, &v, &built).unwrap();
        let stream = dev.new_stream().unwrap();
        let n = check_axpy(&k, &stream, s);
        // Again on a second stream, then drop the first (its scratch is freed after a
        // sync on the next launch) and use a third.
        let s2 = dev.new_stream().unwrap();
        check_axpy(&k, &s2, s + 1);
        drop(stream);
        let s3 = dev.new_stream().unwrap();
        check_axpy(&k, &s3, s + 2);
        dev.synchronize().unwrap();
        eprintln!("GPU ran axpy with {what}: n~{n}, 3 streams, bit-exact");
    }
}
