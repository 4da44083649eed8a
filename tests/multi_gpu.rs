//! Several GPUs: the indexer's heads sharded over two devices of one process
//! ([`ShardedIndexer`]) checked against the CPU reference of the whole batch, nothing of
//! one device handed to the other (streams, buffers, kernels), and two processes with one
//! device each (`tritonrt run --device N`, concurrently).
//!
//! With one GPU, each test says it skipped the second device ("skipped: needs 2 GPUs
//! (found 1)") and runs what it can on device 0: the sharded indexer with G = 1, and
//! with G = 2 as two shards on device 0 (each on its own stream). Without a GPU every
//! test skips, saying so.
//!
//! Run on a machine without Rust: copy this test binary and the `tritonrt` binary, set
//! `TRITONRT_PTX_CACHE` and `TRITONRT_BIN` (the `tritonrt` binary the two-process test
//! spawns; default: the one cargo built beside this test), then `<binary> --nocapture
//! --test-threads=1`.

#[macro_use]
mod common;

use std::process::Command;
use std::sync::Arc;

use tritonrt::driver::{Device, DeviceBuf};
use tritonrt::pq::gpu::{GpuIndexer, KernelChoice, LaunchMode, StepOutputs};
use tritonrt::pq::shard_plan::ShardPlan;
use tritonrt::pq::sharded::{ShardInput, ShardedIndexer};
use tritonrt::pq::{check, DType, Metric, PqConfig, PqInputs, PqOutput, Shape};
use tritonrt::runtime::Runtime;
use tritonrt::Error;

fn ptx_cache() -> String {
    std::env::var("TRITONRT_PTX_CACHE")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/ptx_cache").to_string())
}

/// The runtime of every CUDA device (one per device, in ordinal order), or `None` after
/// a visible skip naming `what` when there is no driver or no device.
fn runtimes(what: &str) -> Option<Vec<Arc<Runtime>>> {
    let first = common::gpu_runtime(what)?;
    let n = Device::count().expect("counting devices");
    let mut rts = vec![first];
    for o in 1..n {
        rts.push(
            Runtime::open(Device::new(o).expect("opening a device"), ptx_cache())
                .expect("opening a runtime"),
        );
    }
    for rt in &rts {
        let d = rt.device();
        eprintln!("device {}: {} (sm_{})", d.ordinal(), d.name(), d.arch());
    }
    Some(rts)
}

fn sh(b: usize, h: usize, h_kv: usize, s: usize, d: usize) -> Shape {
    Shape { b, h, h_kv, s, d }
}

/// Every entry of a shard's output written: no poison (-7) left in the lists, each
/// sparse_len equal to `total`, every weight 0 or 1 (the poison is a huge finite value).
fn assert_fully_written(what: &str, o: &PqOutput) {
    if let Some(i) = o.sparse_list.iter().position(|&x| x < 0) {
        panic!(
            "{what}: sparse_list[{i}] = {} (unwritten)",
            o.sparse_list[i]
        );
    }
    if let Some(i) = o.sparse_len.iter().position(|&x| x != o.total as i64) {
        panic!(
            "{what}: sparse_len[{i}] = {} (total {})",
            o.sparse_len[i], o.total
        );
    }
    if let Some(i) = o.weight_list.iter().position(|&w| w != 0.0 && w != 1.0) {
        panic!(
            "{what}: weight_list[{i}] = {} (unwritten)",
            o.weight_list[i]
        );
    }
}

/// `d`'s sharded outputs in caller buffers (poisoned first) on its device.
struct CallerOutputs {
    sl: cudarc::driver::CudaSlice<i64>,
    len: cudarc::driver::CudaSlice<i64>,
    w: cudarc::driver::CudaSlice<u8>,
}

/// One case: the sharded step over `rts` (shard d on `rts[d]`), with plain launches and
/// as a graph, into its own and into caller buffers, every shard checked against the
/// CPU reference of its heads and the stitched result against the whole batch's.
fn run_case(
    name: &str,
    rts: &[Arc<Runtime>],
    cfg: PqConfig,
    shape: Shape,
    n_cached: usize,
    seed: u64,
) {
    let g = rts.len();
    let ords: Vec<usize> = rts.iter().map(|r| r.device().ordinal()).collect();
    let t0 = std::time::Instant::now();
    let inputs = PqInputs::random(&cfg, shape, n_cached, seed).unwrap();
    let plan = ShardPlan::new(shape, g).unwrap();
    let mut ix = ShardedIndexer::new(
        rts,
        cfg,
        shape,
        &inputs.centroids,
        inputs.phi.as_deref(),
        &KernelChoice::manifest_defaults(),
    )
    .unwrap();
    assert_eq!(ix.ordinals(), ords);
    ix.import_codes(&inputs.codes, n_cached).unwrap();
    let up = ix.upload(&inputs).unwrap();
    let shard_in: Vec<ShardInput> = ShardedIndexer::inputs_of(&up);
    let s = shape.s;
    ix.prepare(s).unwrap();
    ix.poison_outputs().unwrap();
    let infos = ix.step(&shard_in, s, LaunchMode::Launch).unwrap();
    assert_eq!(infos.len(), g);
    ix.synchronize().unwrap();
    let parts = ix.download().unwrap();
    for (d, part) in parts.iter().enumerate() {
        let what = format!("{name}: shard {d} (device {})", ords[d]);
        assert_eq!(
            (part.b, part.h, part.h_kv),
            (shape.b, shape.h / g, shape.h_kv / g),
            "{what}"
        );
        assert_fully_written(&what, part);
        // the shard's outputs are its heads' and only those: the reference of its slice
        let mine = plan.slice_inputs(&cfg, &inputs, d).unwrap();
        let r = check(&cfg, &mine, part);
        assert!(
            r.passed(),
            "{what}, against the reference of its heads: {r}"
        );
        // its kernels are loaded on its own device
        for k in ix.shards()[d].kernels() {
            assert_eq!(k.device().ordinal(), ords[d], "{what}: kernel {}", k.id());
        }
        assert_eq!(
            ix.shards()[d].stream().context().ordinal(),
            ords[d],
            "{what}: stream"
        );
    }
    let stitched = plan.stitch(&parts).unwrap();
    let r = check(&cfg, &inputs, &stitched);
    assert!(
        r.passed(),
        "{name}: stitched over {g} shards, against the whole batch: {r}"
    );

    // graph replay gives the same bytes
    ix.rewind(n_cached);
    ix.poison_outputs().unwrap();
    ix.step(&shard_in, s, LaunchMode::Graph).unwrap();
    ix.synchronize().unwrap();
    let again = ix.download_stitched().unwrap();
    assert!(
        again.sparse_list == stitched.sparse_list
            && again.sparse_len == stitched.sparse_len
            && again.codes == stitched.codes
            && again
                .weight_list
                .iter()
                .map(|x| x.to_bits())
                .eq(stitched.weight_list.iter().map(|x| x.to_bits())),
        "{name}: graph replay differs from plain launches"
    );

    // into caller buffers on each shard's device, poisoned first: fully overwritten, equal
    let ss = plan.shard_shape();
    let rows = ss.b * ss.h;
    let total = cfg.total(s);
    let wb = cfg.weight_dtype.size_bytes();
    let bufs: Vec<CallerOutputs> = ix
        .shards()
        .iter()
        .map(|sh| {
            let st = sh.stream();
            CallerOutputs {
                sl: st.clone_htod(&vec![-7i64; rows * total]).unwrap(),
                len: st.clone_htod(&vec![-7i64; rows]).unwrap(),
                w: st.clone_htod(&vec![0x7fu8; rows * s * wb]).unwrap(),
            }
        })
        .collect();
    let outs: Vec<StepOutputs> = ix
        .shards()
        .iter()
        .zip(&bufs)
        .map(|(sh, b)| StepOutputs {
            sparse_list: DeviceBuf::of(&b.sl, sh.stream()),
            sparse_len: DeviceBuf::of(&b.len, sh.stream()),
            weight_list: DeviceBuf::of(&b.w, sh.stream()).as_dtype(cfg.weight_dtype.triton()),
        })
        .collect();
    ix.rewind(n_cached);
    ix.step_into(&shard_in, s, LaunchMode::Graph, &outs)
        .unwrap();
    ix.synchronize().unwrap();
    for (d, (sh, b)) in ix.shards().iter().zip(&bufs).enumerate() {
        let st = sh.stream();
        let sl = st.clone_dtoh(&b.sl).unwrap();
        let len = st.clone_dtoh(&b.len).unwrap();
        let w = st.clone_dtoh(&b.w).unwrap();
        let p = &parts[d];
        assert_eq!(sl, p.sparse_list, "{name}: shard {d}: caller sparse_list");
        assert_eq!(len, p.sparse_len, "{name}: shard {d}: caller sparse_len");
        let w: Vec<f32> = match cfg.weight_dtype {
            DType::F32 => w
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            DType::BF16 => w
                .chunks_exact(2)
                .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            DType::F16 => w
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
        };
        assert_eq!(w, p.weight_list, "{name}: shard {d}: caller weight_list");
    }
    eprintln!(
        "ok: {name}: {shape} over devices {ords:?} ({} per device), stitched step passes the spec check ({:.1} s)",
        ss,
        t0.elapsed().as_secs_f64()
    );
}

fn cases() -> Vec<(&'static str, PqConfig, Shape, Option<usize>)> {
    let r = PqConfig::reference_workload();
    vec![
        ("reference workload", r, sh(1, 32, 32, 32000, 128), None),
        (
            "GQA G=4, B=2, ip, bf16",
            PqConfig {
                metric: Metric::Ip,
                input_dtype: DType::BF16,
                weight_dtype: DType::BF16,
                ..r
            },
            sh(2, 16, 4, 6000, 128),
            None,
        ),
        (
            "many new keys",
            r,
            sh(1, 8, 8, 9000, 128),
            Some(9000 - 128 - 300),
        ),
    ]
}

fn n_cached(cfg: &PqConfig, shape: &Shape, n: Option<usize>) -> usize {
    n.unwrap_or_else(|| PqInputs::default_n_cached(cfg, shape.s))
}

#[test]
fn sharded_indexer_matches_the_cpu_reference_of_the_whole_batch() {
    let Some(rts) = runtimes("multi-GPU tests") else {
        return;
    };
    let seed = common::test_seed();
    let sets: Vec<(String, Vec<Arc<Runtime>>)> = if rts.len() >= 2 {
        vec![
            (
                "G=2 on devices 0,1".into(),
                vec![rts[0].clone(), rts[1].clone()],
            ),
            ("G=1 on device 1".into(), vec![rts[1].clone()]),
        ]
    } else {
        skip!("second device skipped: needs 2 GPUs (found {}); running G = 1, and G = 2 as two shards on device 0", rts.len());
        vec![
            ("G=1 on device 0".into(), vec![rts[0].clone()]),
            (
                "G=2 both on device 0".into(),
                vec![rts[0].clone(), rts[0].clone()],
            ),
        ]
    };
    for (label, set) in &sets {
        for (name, cfg, shape, n) in cases() {
            let nc = n_cached(&cfg, &shape, n);
            run_case(&format!("{label}, {name}"), set, cfg, shape, nc, seed);
        }
    }
}

#[test]
fn nothing_of_one_device_is_handed_to_the_other() {
    let Some(rts) = runtimes("multi-GPU tests") else {
        return;
    };
    if rts.len() < 2 {
        skip!(
            "cross-device checks skipped: needs 2 GPUs (found {})",
            rts.len()
        );
        return;
    }
    let (rt0, rt1) = (&rts[0], &rts[1]);
    let cfg = PqConfig::reference_workload();
    let shape = sh(1, 8, 4, 4096, 128);
    let inputs =
        PqInputs::random(&cfg, shape, PqInputs::default_n_cached(&cfg, shape.s), 7).unwrap();
    let s1 = rt1.device().new_stream().unwrap();
    let s0 = rt0.device().new_stream().unwrap();

    // a stream of device 1 given to device 0's indexer
    let e = GpuIndexer::new(
        rt0.clone(),
        s1.clone(),
        cfg,
        shape,
        &inputs.centroids,
        None,
        &KernelChoice::manifest_defaults(),
    )
    .err()
    .expect("an indexer of device 0 on a stream of device 1 must be refused");
    match &e {
        Error::DeviceMismatch {
            what_device: 1,
            with_device: 0,
            ..
        } => {}
        other => panic!("expected DeviceMismatch 1 vs 0, got {other:?}"),
    }
    let msg = e.to_string();
    assert!(
        msg.contains("device 1") && msg.contains("device 0"),
        "{msg}"
    );
    eprintln!("refused: {msg}");

    // the check every kernel launch makes before reaching the driver
    let e = rt0
        .device()
        .check_stream(&s1, "the launch's stream", "kernel k")
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::DeviceMismatch {
                what_device: 1,
                with_device: 0,
                ..
            }
        ),
        "{e:?}"
    );
    rt0.device()
        .check_stream(&s0, "the launch's stream", "kernel k")
        .unwrap();

    // streams swapped between the shards
    let e = ShardedIndexer::with_streams(
        &[rt0.clone(), rt1.clone()],
        vec![s1.clone(), s0.clone()],
        cfg,
        shape,
        &inputs.centroids,
        None,
        &KernelChoice::manifest_defaults(),
    )
    .err()
    .expect("swapped streams must be refused");
    assert!(matches!(e, Error::DeviceMismatch { .. }), "{e:?}");
    eprintln!("refused: {e}");

    // the same kernel variant is a separate module and function per device
    let mut ix = ShardedIndexer::with_streams(
        &[rt0.clone(), rt1.clone()],
        vec![s0.clone(), s1.clone()],
        cfg,
        shape,
        &inputs.centroids,
        None,
        &KernelChoice::manifest_defaults(),
    )
    .unwrap();
    let (k0, k1) = (ix.shards()[0].kernels(), ix.shards()[1].kernels());
    for (a, b) in k0.iter().zip(&k1) {
        assert_eq!(a.id(), b.id());
        assert_eq!((a.device().ordinal(), b.device().ordinal()), (0, 1));
        assert!(!Arc::ptr_eq(a, b));
    }

    // device 1's query and key given to device 0's shard
    ix.import_codes(&inputs.codes, inputs.n_cached).unwrap();
    let up = ix.upload(&inputs).unwrap();
    let good = ShardedIndexer::inputs_of(&up);
    let addr1 = good[1].query.buf().addr();
    match rt0.device().owner_of(addr1) {
        Some(1) => {
            let swapped = [good[1], good[0]];
            let e = ix
                .step(&swapped, shape.s, LaunchMode::Launch)
                .expect_err("buffers of device 1 on device 0's shard must be refused");
            assert!(
                matches!(e, Error::DeviceMismatch { what_device: 1, with_device: 0, .. }),
                "{e:?}"
            );
            eprintln!("refused: {e}");
        }
        other => skip!(
            "wrong-device buffer check: the driver places device 1's query at {other:?}, not Some(1)"
        ),
    }
    // the indexer still works after the refusals
    ix.rewind(inputs.n_cached);
    ix.prepare(shape.s).unwrap();
    ix.poison_outputs().unwrap();
    ix.step(&good, shape.s, LaunchMode::Launch).unwrap();
    ix.synchronize().unwrap();
    let out = ix.download_stitched().unwrap();
    let r = check(&cfg, &inputs, &out);
    assert!(r.passed(), "after the refusals: {r}");
    eprintln!("ok: streams, kernels and buffers stay on their device");
}

#[test]
fn two_processes_one_device_each() {
    let Some(rts) = runtimes("multi-GPU tests") else {
        return;
    };
    let n = rts.len().min(2);
    if n < 2 {
        skip!(
            "second process skipped: needs 2 GPUs (found {}); running one process on device 0",
            rts.len()
        );
    }
    drop(rts);
    let bin = std::env::var("TRITONRT_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_tritonrt").to_string());
    let children: Vec<_> = (0..n)
        .map(|d| {
            let c = Command::new(&bin)
                .args([
                    "run",
                    "--device",
                    &d.to_string(),
                    "--backend",
                    "gpu",
                    "--workload",
                    "1,32,8,16384,128",
                    "--steps",
                    "50",
                    "--seed",
                    &(11 + d).to_string(),
                ])
                .env("TRITONRT_PTX_CACHE", ptx_cache())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap_or_else(|e| panic!("spawning {bin}: {e}"));
            (d, c)
        })
        .collect();
    for (d, c) in children {
        let o = c.wait_with_output().unwrap();
        let out = String::from_utf8_lossy(&o.stdout);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            o.status.success(),
            "tritonrt run --device {d} failed ({:?}):\n{out}\n{err}",
            o.status.code()
        );
        eprintln!("process on device {d}:\n{out}");
    }
    eprintln!("ok: {n} process(es), one device each, both checked against the CPU reference");
}
