//! Launch latency of the fp32 axpy kernel from Rust (harness-less bench; run on a GPU):
//!
//! - module load: cold (PTX JIT by the driver + load) vs warm (verified cubin from the
//!   tritonrt cache + load) vs the manifest's own cubin, per artifact, medians;
//! - launch + synchronize latency, median (p10, p90) over `--iters` launches (default 2000),
//!   and back-to-back launch throughput, for small and large n;
//! - the floor under a replayed decode step: a CUDA graph of one or two launches (n =
//!   4096) replayed and waited for, beside the same launches issued one by one.
//!
//! `cargo bench --bench launch_latency -- [--ptx-cache DIR] [--iters N] [--json FILE]`
//! (default ptx_cache: tests/fixtures/ptx_cache, or $TRITONRT_PTX_CACHE). The same
//! measurements through Triton's Python launcher: `benches/launch_latency_triton.py`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use tritonrt::abi::KernelArg;
use tritonrt::artifact::{ArtifactStore, Variant};
use tritonrt::driver::Device;
use tritonrt::driver::Kernel;
use tritonrt::driver::{BuiltCubin, CacheOutcome};
use tritonrt::jit::{cache_key, CubinCache, Lookup};

const KERNEL: &str = "axpy_kernel";

/// The variant's BLOCK (elements per CTA): the grid is `cdiv(n, BLOCK)`.
fn block(k: &Kernel) -> usize {
    k.variant()
        .constexprs
        .get("BLOCK")
        .and_then(|v| v.as_u64())
        .expect("axpy variant without an integer BLOCK constexpr") as usize
}

struct Opts {
    ptx_cache: PathBuf,
    iters: usize,
    load_reps: usize,
    json: Option<PathBuf>,
}

fn opts() -> Opts {
    let mut o = Opts {
        ptx_cache: std::env::var_os("TRITONRT_PTX_CACHE")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                PathBuf::from(concat!(
                    env!("CARGO_MANIFEST_DIR"),
                    "/tests/fixtures/ptx_cache"
                ))
            }),
        iters: 2000,
        load_reps: 20,
        json: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--ptx-cache" => o.ptx_cache = value(&mut args, "--ptx-cache", "DIR").into(),
            "--iters" => o.iters = count(&mut args, "--iters"),
            "--load-reps" => o.load_reps = count(&mut args, "--load-reps"),
            "--json" => o.json = Some(value(&mut args, "--json", "FILE").into()),
            "--bench" => {} // passed by `cargo bench`
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => usage_error(&format!("unknown argument {other:?}")),
        }
    }
    o
}

const USAGE: &str = "\
launch latency of the fp32 axpy kernel from Rust (needs a CUDA GPU)

usage: cargo bench --bench launch_latency -- [--ptx-cache DIR] [--iters N] [--load-reps N] [--json FILE]

  --ptx-cache DIR  the ptx_cache holding axpy_kernel (default: $TRITONRT_PTX_CACHE, else tests/fixtures/ptx_cache)
  --iters N        launches per latency measurement (default 2000)
  --load-reps N    module loads per load measurement (default 20)
  --json FILE      also write the results as JSON lines to FILE";

/// Print `msg` and the usage to stderr and exit with status 2.
fn usage_error(msg: &str) -> ! {
    eprintln!("error: {msg}\n\n{USAGE}");
    std::process::exit(2)
}

/// The value after `flag` (`what` names it in the error when it is missing).
fn value(args: &mut impl Iterator<Item = String>, flag: &str, what: &str) -> String {
    args.next()
        .unwrap_or_else(|| usage_error(&format!("{flag} needs a value ({what})")))
}

/// The positive integer after `flag`.
fn count(args: &mut impl Iterator<Item = String>, flag: &str) -> usize {
    let v = value(args, flag, "N");
    match v.parse::<usize>() {
        Ok(n) if n > 0 => n,
        _ => usage_error(&format!("{flag} takes a positive integer, not {v:?}")),
    }
}

/// Median, p10, p90, mean of durations, in microseconds.
fn stats(mut d: Vec<Duration>) -> [f64; 4] {
    d.sort();
    let us = |x: Duration| x.as_secs_f64() * 1e6;
    let q = |p: f64| us(d[((d.len() - 1) as f64 * p).round() as usize]);
    let mean = d.iter().map(|x| us(*x)).sum::<f64>() / d.len() as f64;
    [q(0.5), q(0.1), q(0.9), mean]
}

fn ptr<T>(s: &CudaSlice<T>, st: &Arc<CudaStream>) -> u64 {
    s.device_ptr(st).0
}

fn main() {
    let o = opts();
    // Time the driver's JIT itself, not its on-disk JIT cache.
    if std::env::var_os("CUDA_CACHE_DISABLE").is_none() {
        std::env::set_var("CUDA_CACHE_DISABLE", "1");
    }
    let dev = Device::new(0).expect("a CUDA device");
    let store = ArtifactStore::open(&o.ptx_cache).expect("ptx_cache");
    let tmp = tempfile::tempdir().unwrap();
    let cache = CubinCache::new(tmp.path()).unwrap();
    println!(
        "device: {} sm_{} driver {} (CUDA {}.{}, PTX ISA <= {}); CUDA_CACHE_DISABLE={}",
        dev.name(),
        dev.arch(),
        dev.driver_version(),
        dev.driver_cuda_version().0,
        dev.driver_cuda_version().1,
        dev.ptx_isa_max(),
        std::env::var("CUDA_CACHE_DISABLE").unwrap_or_default()
    );
    let variants: Vec<&Variant> = store
        .variants(KERNEL)
        .into_iter()
        .filter(|v| v.usable_on(dev.cc()))
        .collect();
    let mut json = Vec::new();

    println!("\n== module load ({} reps, median ms) ==", o.load_reps);
    println!(
        "{:<36} {:>14} {:>14} {:>14} {:>14}",
        "artifact", "cold JIT+load", "(JIT only)", "cache+load", "manifest cubin"
    );
    let mut kernels = Vec::new();
    for v in &variants {
        let ptx = store.read_ptx(v).unwrap();
        let (mut cold, mut jit_only, mut warm, mut manifest) = (vec![], vec![], vec![], vec![]);
        let mut last = None;
        for _ in 0..o.load_reps.min(10) {
            let t0 = Instant::now();
            let out = match dev.jit_ptx(&ptx, &v.ptx.file, None) {
                Ok(out) => out,
                Err(f) => {
                    println!("{}: JIT failed: {}: {}", v.id, f.code, f.log);
                    break;
                }
            };
            let t_jit = t0.elapsed();
            let built = BuiltCubin {
                cubin: out.cubin,
                outcome: CacheOutcome::Built,
                origin: (store.path_of(&v.ptx), v.ptx.sha256.clone()),
                elapsed: t_jit,
                jit_log: None,
            };
            let k = Kernel::load(&dev, v, &built).unwrap();
            cold.push(t0.elapsed());
            jit_only.push(t_jit);
            last = Some(built.cubin.clone());
            drop(k);
        }
        let key = cache_key(
            &v.ptx.sha256,
            dev.arch(),
            dev.driver_version(),
            &cache.options(),
        );
        if let Some(cubin) = &last {
            cache.store(&key, cubin).unwrap();
        }
        let warm_reps = if last.is_some() { o.load_reps } else { 0 };
        for _ in 0..warm_reps {
            let t0 = Instant::now();
            let Lookup::Hit(cubin) = cache.lookup(&key) else {
                panic!("cache entry missing")
            };
            let built = BuiltCubin {
                cubin,
                outcome: CacheOutcome::Hit,
                origin: (cache.entry_path(&key), String::new()),
                elapsed: t0.elapsed(),
                jit_log: None,
            };
            let k = Kernel::load(&dev, v, &built).unwrap();
            warm.push(t0.elapsed());
            drop(k);
        }
        if v.cubin_matches(dev.cc()) {
            for _ in 0..o.load_reps {
                let t0 = Instant::now();
                let built = cache.get_or_build(&dev, &store, v).unwrap();
                assert_eq!(built.outcome, CacheOutcome::ManifestCubin);
                let k = Kernel::load(&dev, v, &built).unwrap();
                manifest.push(t0.elapsed());
                drop(k);
            }
        }
        let ms = |d: Vec<Duration>| {
            if d.is_empty() {
                f64::NAN
            } else {
                stats(d)[0] / 1e3
            }
        };
        let (c, j, w, m) = (ms(cold), ms(jit_only), ms(warm), ms(manifest));
        println!("{:<36} {c:>14.3} {j:>14.3} {w:>14.3} {m:>14.3}", v.id);
        json.push(format!(
            "{{\"what\":\"load\",\"id\":\"{}\",\"cold_jit_load_ms\":{c:.4},\"jit_ms\":{j:.4},\"cache_load_ms\":{w:.4},\"manifest_cubin_load_ms\":{}}}",
            v.id,
            if m.is_nan() { "null".to_string() } else { format!("{m:.4}") }
        ));
        let built = cache.get_or_build(&dev, &store, v).unwrap();
        kernels.push(Kernel::load(&dev, v, &built).unwrap());
    }

    println!("\n== launch + synchronize, {} launches (us) ==", o.iters);
    println!(
        "{:<36} {:>9} {:>9} {:>9} {:>9} {:>9} {:>14}",
        "artifact", "n", "median", "p10", "p90", "mean", "b2b us/launch"
    );
    let stream = dev.new_stream().unwrap();
    for k in &kernels {
        for n in [4096usize, 1 << 20] {
            let x: Vec<f32> = (0..n).map(|i| (i % 977) as f32 * 0.25 - 100.0).collect();
            let y: Vec<f32> = (0..n).map(|i| (i % 313) as f32 * -0.5 + 7.0).collect();
            let a = 1.75f32;
            let xd = stream.clone_htod(&x).unwrap();
            let yd = stream.clone_htod(&y).unwrap();
            let od = stream.clone_htod(&vec![f32::NAN; n]).unwrap();
            let args = [
                KernelArg::RawPtr(ptr(&xd, &stream)),
                KernelArg::RawPtr(ptr(&yd, &stream)),
                KernelArg::RawPtr(ptr(&od, &stream)),
                KernelArg::F32(a),
                KernelArg::I32(n as i32),
            ];
            let grid = [n.div_ceil(block(k)) as u32, 1, 1];
            // SAFETY (all launches below): x, y, out hold n f32 each and live until the
            // final synchronize; nothing else touches them.
            for _ in 0..200 {
                unsafe { k.launch_raw(&stream, grid, &args) }.unwrap();
            }
            stream.synchronize().unwrap();
            let out = stream.clone_dtoh(&od).unwrap();
            let bad = (0..n)
                .filter(|&i| out[i].to_bits() != a.mul_add(x[i], y[i]).to_bits())
                .count();
            assert_eq!(bad, 0, "wrong results");
            let mut lat = Vec::with_capacity(o.iters);
            for _ in 0..o.iters {
                let t0 = Instant::now();
                unsafe { k.launch_raw(&stream, grid, &args) }.unwrap();
                stream.synchronize().unwrap();
                lat.push(t0.elapsed());
            }
            let b2b_n = 10_000;
            let t0 = Instant::now();
            for _ in 0..b2b_n {
                unsafe { k.launch_raw(&stream, grid, &args) }.unwrap();
            }
            stream.synchronize().unwrap();
            let b2b = t0.elapsed().as_secs_f64() * 1e6 / b2b_n as f64;
            let [med, p10, p90, mean] = stats(lat);
            println!(
                "{:<36} {n:>9} {med:>9.2} {p10:>9.2} {p90:>9.2} {mean:>9.2} {b2b:>14.2}",
                k.id()
            );
            json.push(format!(
                "{{\"what\":\"launch_sync\",\"impl\":\"tritonrt\",\"id\":\"{}\",\"n\":{n},\"iters\":{},\"median_us\":{med:.3},\"p10_us\":{p10:.3},\"p90_us\":{p90:.3},\"mean_us\":{mean:.3},\"b2b_us_per_launch\":{b2b:.3}}}",
                k.id(),
                o.iters
            ));
        }
    }
    // The floor under a replayed decode step: a CUDA graph of one or two small launches
    // (axpy, n = 4096), replayed and waited for, against the same launches issued one by
    // one; and the wait itself by cuStreamSynchronize vs polling cuStreamQuery.
    println!(
        "\n== graph replay vs plain launches, + wait, n = 4096, {} steps (us) ==",
        o.iters
    );
    println!(
        "{:<44} {:>9} {:>9} {:>9} {:>9}",
        "what", "median", "p10", "p90", "mean"
    );
    let n = 4096usize;
    let x: Vec<f32> = (0..n).map(|i| (i % 977) as f32 * 0.25 - 100.0).collect();
    let xd = stream.clone_htod(&x).unwrap();
    let yd = stream.clone_htod(&x).unwrap();
    let od = stream.clone_htod(&vec![f32::NAN; n]).unwrap();
    let k = kernels
        .iter()
        .find(|k| k.id().starts_with("axpy_kernel.BLOCK=1024.w4.") && !k.id().ends_with("sm80"))
        .unwrap_or(&kernels[0]);
    println!("({})", k.id());
    let args = [
        KernelArg::RawPtr(ptr(&xd, &stream)),
        KernelArg::RawPtr(ptr(&yd, &stream)),
        KernelArg::RawPtr(ptr(&od, &stream)),
        KernelArg::F32(0.5),
        KernelArg::I32(n as i32),
    ];
    let grid = [n.div_ceil(block(k)) as u32, 1, 1];
    // SAFETY (every launch below, captured or not): x, y, out hold n f32 each and live
    // until the last synchronize; nothing else touches them.
    let issue = |launches: usize| {
        for _ in 0..launches {
            unsafe { k.launch_raw(&stream, grid, &args) }.unwrap();
        }
    };
    let poll = |s: &CudaStream| loop {
        // SAFETY: a live stream of this context.
        match unsafe { cudarc::driver::sys::cuStreamQuery(s.cu_stream()) } {
            cudarc::driver::sys::CUresult::CUDA_SUCCESS => break,
            cudarc::driver::sys::CUresult::CUDA_ERROR_NOT_READY => std::hint::spin_loop(),
            e => panic!("cuStreamQuery: {e:?}"),
        }
    };
    let time = |what: &str, json: &mut Vec<String>, step: &dyn Fn()| {
        for _ in 0..200 {
            step();
        }
        let lat: Vec<Duration> = (0..o.iters)
            .map(|_| {
                let t0 = Instant::now();
                step();
                t0.elapsed()
            })
            .collect();
        let [med, p10, p90, mean] = stats(lat);
        println!("{what:<44} {med:>9.2} {p10:>9.2} {p90:>9.2} {mean:>9.2}");
        json.push(format!(
            "{{\"what\":\"replay_floor\",\"case\":\"{what}\",\"median_us\":{med:.3},\"p10_us\":{p10:.3},\"p90_us\":{p90:.3}}}"
        ));
    };
    let capture = |launches: usize| {
        stream
            .begin_capture(
                cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
            .unwrap();
        issue(launches);
        stream
            .end_capture(cudarc::driver::sys::CUgraphInstantiate_flags(0))
            .unwrap()
            .expect("a captured graph")
    };
    let (g1, g2) = (capture(1), capture(2));
    for launches in [1usize, 2] {
        time(
            &format!("{launches} plain launch(es) + stream sync"),
            &mut json,
            &|| {
                issue(launches);
                stream.synchronize().unwrap();
            },
        );
    }
    for (launches, g) in [(1usize, &g1), (2, &g2)] {
        time(
            &format!("graph of {launches} + stream sync"),
            &mut json,
            &|| {
                g.launch().unwrap();
                stream.synchronize().unwrap();
            },
        );
        time(
            &format!("graph of {launches} + poll cuStreamQuery"),
            &mut json,
            &|| {
                g.launch().unwrap();
                poll(&stream);
            },
        );
    }
    stream.synchronize().unwrap();
    let out = stream.clone_dtoh(&od).unwrap();
    assert!(
        (0..n).all(|i| out[i].to_bits() == 0.5f32.mul_add(x[i], x[i]).to_bits()),
        "graph replay: wrong results"
    );

    // Host-side cost of checking + packing the arguments alone.
    let v = kernels[0].variant().clone();
    let args = [
        KernelArg::RawPtr(0x1000),
        KernelArg::RawPtr(0x2000),
        KernelArg::RawPtr(0x3000),
        KernelArg::F32(1.0),
        KernelArg::I32(7),
    ];
    let reps = 1_000_000;
    let t0 = Instant::now();
    for _ in 0..reps {
        std::hint::black_box(tritonrt::abi::pack_args(std::hint::black_box(&v), &args).unwrap());
    }
    let ns = t0.elapsed().as_secs_f64() * 1e9 / reps as f64;
    println!("\nargument check + pack: {ns:.1} ns per launch (host)");
    json.push(format!("{{\"what\":\"pack_args\",\"ns\":{ns:.2}}}"));
    if let Some(p) = o.json {
        std::fs::write(&p, json.join("\n") + "\n").unwrap();
        println!("wrote {}", p.display());
    }
}
