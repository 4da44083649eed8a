//! The GPU pipeline against the CPU reference (f64) on fresh random inputs, by the spec's
//! correctness rule (exact heavy sets where scores are well separated), for many shapes:
//! the reference and large workloads, both metrics, GQA, bf16/fp16, the short path, S
//! just above the threshold, init_offset < sink, bulk quantization, B > 1.
//!
//! Every case poisons the outputs first, runs the step with plain launches and again as
//! a CUDA graph, and requires the two to be bit-identical; each runs once on the chunked
//! select kernel, once on the histogram kernel (`pq_hist`) and once on the split
//! histogram path (`pq_thresh` + `pq_emit`) where those apply. Skipped, saying so, on a
//! machine without a CUDA driver or device.

#[macro_use]
mod common;

use std::sync::Arc;

use tritonrt::pq::gpu::{
    execute_with_path, DeviceInputs, GpuIndexer, KernelChoice, LaunchMode, SelectPath, StepInfo,
};
use tritonrt::pq::{
    check, check_exact, CheckReport, DType, Metric, PqConfig, PqInputs, Shape, Size,
};
use tritonrt::runtime::Runtime;

use common::inputs_for;

fn runtime() -> Option<Arc<Runtime>> {
    common::gpu_runtime("GPU pipeline tests")
}

fn seed() -> u64 {
    common::test_seed()
}

#[derive(Clone, Copy)]
struct Case {
    name: &'static str,
    cfg: PqConfig,
    shape: Shape,
    /// Keys already quantized; None: S - 1 - init_offset (one new key).
    n_cached: Option<usize>,
    /// Well-separated small-integer inputs, checked exactly.
    exact: bool,
}

fn base() -> PqConfig {
    PqConfig::reference_workload()
}

fn sh(b: usize, h: usize, h_kv: usize, s: usize, d: usize) -> Shape {
    Shape { b, h, h_kv, s, d }
}

fn cases() -> Vec<Case> {
    let r = base();
    let thr = r.short_threshold(0); // count sizes: the same at every S
    let c = |name, cfg, shape| Case {
        name,
        cfg,
        shape,
        n_cached: None,
        exact: false,
    };
    let mut v = vec![
        c("reference workload", r, sh(1, 32, 32, 32000, 128)),
        c("large workload", r, sh(4, 32, 32, 131072, 128)),
        c(
            "metric ip",
            PqConfig {
                metric: Metric::Ip,
                ..r
            },
            sh(1, 32, 32, 32000, 128),
        ),
        c("GQA G=4", r, sh(1, 32, 8, 8192, 128)),
        c(
            "GQA G=8 B=2 ip",
            PqConfig {
                metric: Metric::Ip,
                ..r
            },
            sh(2, 16, 2, 6000, 128),
        ),
        c(
            "bf16 in, bf16 weights",
            PqConfig {
                input_dtype: DType::BF16,
                weight_dtype: DType::BF16,
                ..r
            },
            sh(1, 32, 32, 16384, 128),
        ),
        c(
            "fp16 in, fp32 weights",
            PqConfig {
                input_dtype: DType::F16,
                ..r
            },
            sh(1, 8, 8, 9000, 128),
        ),
        c(
            "fp32 in, fp16 weights",
            PqConfig {
                weight_dtype: DType::F16,
                ..r
            },
            sh(2, 4, 4, 7000, 128),
        ),
        c("short path at the threshold", r, sh(1, 8, 8, thr, 128)),
        c("short path, tiny S", r, sh(2, 4, 2, 5, 128)),
        c(
            "S = threshold + 1 (fewer candidates than heavy)",
            r,
            sh(1, 8, 8, thr + 1, 128),
        ),
        c("S = threshold + 40", r, sh(1, 8, 4, thr + 40, 128)),
        c(
            "init_offset < sink",
            PqConfig {
                init_offset: 16,
                sink_size: Size::Count(64),
                ..r
            },
            sh(1, 8, 8, 3000, 128),
        ),
        c(
            "init_offset = 0",
            PqConfig {
                init_offset: 0,
                ..r
            },
            sh(1, 8, 8, 4000, 128),
        ),
        c(
            "heavy 256",
            PqConfig {
                heavy_size: Size::Count(256),
                ..r
            },
            sh(1, 16, 16, 20000, 128),
        ),
        c(
            "heavy 500",
            PqConfig {
                heavy_size: Size::Count(500),
                ..r
            },
            sh(1, 8, 8, 20000, 128),
        ),
        c(
            "heavy 64, sink 4, window 32",
            PqConfig {
                heavy_size: Size::Count(64),
                sink_size: Size::Count(4),
                window_size: Size::Count(32),
                ..r
            },
            sh(1, 8, 8, 10000, 128),
        ),
        c(
            "bits 8, M 4, D 64",
            PqConfig {
                pq_bits: 8,
                pq_group_factor: 4,
                ..r
            },
            sh(1, 8, 8, 12000, 64),
        ),
        c(
            "bits 4, M 1, ip bf16",
            PqConfig {
                pq_bits: 4,
                pq_group_factor: 1,
                metric: Metric::Ip,
                input_dtype: DType::BF16,
                ..r
            },
            sh(1, 8, 4, 5000, 128),
        ),
        c("D 96 (d_s 48)", r, sh(1, 8, 8, 9000, 96)),
        c("S not a multiple of any block", r, sh(3, 8, 8, 32001, 128)),
    ];
    v.push(Case {
        n_cached: Some(r.n_quantized(9000) - 100),
        ..c("100 new keys (bulk quantize)", r, sh(1, 8, 4, 9000, 128))
    });
    v.push(Case {
        n_cached: Some(0),
        ..c(
            "every key new (N_cached = 0), ip",
            PqConfig {
                metric: Metric::Ip,
                ..r
            },
            sh(1, 4, 4, 3000, 128),
        )
    });
    v.push(Case {
        n_cached: Some(r.n_quantized(4000) - 3),
        ..c("3 new keys (in-kernel quantize)", r, sh(2, 8, 8, 4000, 128))
    });
    v.push(Case {
        exact: true,
        ..c("small integers, exact", r, sh(1, 32, 32, 10000, 128))
    });
    v.push(Case {
        exact: true,
        ..c(
            "small integers, exact, GQA bf16 ip",
            PqConfig {
                input_dtype: DType::BF16,
                metric: Metric::Ip,
                ..r
            },
            sh(2, 16, 4, 6000, 128),
        )
    });
    v
}

#[test]
fn gpu_pipeline_matches_cpu_reference() {
    let Some(rt) = runtime() else { return };
    let seed = seed();
    let mut failures = Vec::new();
    let (mut runs, mut hist_runs, mut split_runs, mut index_runs) = (0, 0, 0, 0);
    let mut companion_runs = 0;
    let cases = cases();
    for (i, case) in cases.iter().enumerate() {
        let n_cached = case
            .n_cached
            .unwrap_or_else(|| PqInputs::default_n_cached(&case.cfg, case.shape.s));
        let s = seed.wrapping_add(i as u64 * 7919);
        let inputs = inputs_for(&case.cfg, case.shape, n_cached, case.exact, s);
        for path in SelectPath::FORCED {
            let t = std::time::Instant::now();
            let ex = match execute_with_path(
                &rt,
                &case.cfg,
                &inputs,
                &KernelChoice::manifest_defaults(),
                path,
                None,
                0,
                false,
            ) {
                Ok(ex) => ex,
                Err(e) => {
                    eprintln!("FAIL {:2} {} ({path:?}): {e}", i, case.name);
                    failures.push(case.name);
                    continue;
                }
            };
            if (path == SelectPath::Hist && !ex.hist_path)
                || (path == SelectPath::Split && !ex.split_path)
                || (matches!(path, SelectPath::IndexWfill | SelectPath::IndexCompanion)
                    && !ex.index_path)
            {
                continue; // that path does not apply: the same run as an earlier one
            }
            if ex.index_path && ex.index_companion != (path == SelectPath::IndexCompanion) {
                eprintln!(
                    "FAIL {:2} {} ({path:?}): companion fill {} against the path asked for",
                    i, case.name, ex.index_companion
                );
                failures.push(case.name);
            }
            runs += 1;
            hist_runs += usize::from(ex.hist_path && !ex.split_path && !ex.index_path);
            split_runs += usize::from(ex.split_path);
            index_runs += usize::from(ex.index_path);
            companion_runs += usize::from(ex.index_companion);
            let gpu_ms = t.elapsed().as_secs_f64() * 1e3;
            let report = if case.exact {
                check_exact(&case.cfg, &inputs, &ex.output)
            } else {
                check(&case.cfg, &inputs, &ex.output)
            };
            let ok = report.passed() && ex.graph_matches;
            eprintln!(
                "{} {:2} {:<48} {:<7} B={} H={} H_kv={} S={} D={} graph={} [{}] ({:.0} ms)",
                if ok { "ok  " } else { "FAIL" },
                i,
                case.name,
                ex.kind.name(),
                case.shape.b,
                case.shape.h,
                case.shape.h_kv,
                case.shape.s,
                case.shape.d,
                if ex.graph_matches {
                    "identical"
                } else {
                    "DIFFERS"
                },
                report,
                gpu_ms
            );
            if !ok {
                failures.push(case.name);
            }
        }
    }
    eprintln!(
        "{} passed, {} failed (GPU pipeline vs CPU reference, {} cases, {runs} runs, {hist_runs} on pq_hist, {split_runs} split, {index_runs} indexed, {companion_runs} of them with companion fill)",
        runs - failures.len(),
        failures.len(),
        cases.len()
    );
    assert!(failures.is_empty(), "failed cases: {failures:?}");
    assert!(
        hist_runs >= 12,
        "only {hist_runs} cases ran the histogram path (expected every case with K^M <= 4096 and a long sequence)"
    );
    assert!(
        split_runs >= 8,
        "only {split_runs} cases ran the split histogram path (expected every pq_hist case whose heavy picks lie between sink and window)"
    );
    assert!(
        index_runs >= 8,
        "only {index_runs} runs took the indexed histogram path (expected two for every pq_hist case with M <= 2 and one dtype)"
    );
    assert!(
        2 * companion_runs == index_runs,
        "{companion_runs} of {index_runs} indexed runs had companion fill (expected half)"
    );
}

#[test]
fn gpu_state_grows_and_round_trips_codes() {
    let Some(rt) = runtime() else { return };
    let cfg = base();
    let shape = sh(1, 8, 4, 6000, 128);
    let n0 = 100;
    let (mut ix, inputs) = imported_indexer(&rt, cfg, shape, n0, SelectPath::default());
    assert_eq!(
        ix.export_codes().expect("export"),
        inputs.codes,
        "import/export round trip"
    );
    let cap0 = ix.capacity();
    let dev = DeviceInputs::upload(ix.stream(), &inputs, &cfg).expect("upload");
    // decode steps S = 6000 - 3 .. 6000: the state grows past its first capacity
    for s in [5997, 5998, 6000] {
        ix.step(dev.query(), dev.key(), s, LaunchMode::Graph)
            .expect("step");
    }
    ix.synchronize().expect("sync");
    assert!(
        ix.capacity() > cap0,
        "capacity grew ({cap0} -> {})",
        ix.capacity()
    );
    assert_eq!(ix.n_cached(), cfg.n_quantized(6000));
    let out = ix.download().expect("download");
    let report = check(&cfg, &inputs, &out);
    assert!(report.passed(), "{report}");
    // a step behind the state is refused with a clear error
    let err = ix
        .step(dev.query(), dev.key(), 5000, LaunchMode::Launch)
        .expect_err("state ahead of the sequence");
    assert!(err.to_string().contains("already quantized"), "{err}");
}

/// Random inputs for `shape` with `n0` cached keys and an indexer on a new stream, select
/// path `path`, holding their codes.
fn imported_indexer(
    rt: &Arc<Runtime>,
    cfg: PqConfig,
    shape: Shape,
    n0: usize,
    path: SelectPath,
) -> (GpuIndexer, PqInputs) {
    imported_indexer_seeded(rt, cfg, shape, n0, path, seed())
}

/// [`imported_indexer`] with inputs drawn from `seed`.
fn imported_indexer_seeded(
    rt: &Arc<Runtime>,
    cfg: PqConfig,
    shape: Shape,
    n0: usize,
    path: SelectPath,
    seed: u64,
) -> (GpuIndexer, PqInputs) {
    let inputs = PqInputs::random(&cfg, shape, n0, seed).expect("inputs");
    let stream = rt.device().new_stream().expect("stream");
    let mut ix = GpuIndexer::new(
        rt.clone(),
        stream.clone(),
        cfg,
        shape,
        &inputs.centroids,
        None,
        &KernelChoice::manifest_defaults(),
    )
    .expect("indexer");
    ix.set_select_path(path);
    ix.import_codes(&inputs.codes, n0).expect("import");
    (ix, inputs)
}

/// A decode loop on one indexer with `path`: codes imported for `S = s0` minus one key,
/// then graph-mode steps `S = s0 ..= s1`, one new key each. Returns the indexer, the
/// device and host inputs and every step's info (after a synchronize).
fn decode_loop(
    rt: &Arc<Runtime>,
    cfg: PqConfig,
    shape: Shape,
    (s0, s1): (usize, usize),
    path: SelectPath,
) -> (GpuIndexer, DeviceInputs, PqInputs, Vec<StepInfo>) {
    let n0 = cfg.n_quantized(s0) - 1;
    let (mut ix, inputs) = imported_indexer(rt, cfg, shape, n0, path);
    let dev = DeviceInputs::upload(ix.stream(), &inputs, &cfg).expect("upload");
    ix.prepare(s1).expect("buffers for the largest step");
    let infos = (s0..=s1)
        .map(|s| {
            ix.step(dev.query(), dev.key(), s, LaunchMode::Graph)
                .expect("step")
        })
        .collect();
    ix.synchronize().expect("sync");
    (ix, dev, inputs, infos)
}

/// The decode loop's last step checked against the CPU reference by the spec's rule,
/// after asserting that the whole loop captured its graph once (later steps updated it
/// in place). Returns the check's report.
fn loop_checked_once_captured(
    ix: &GpuIndexer,
    cfg: &PqConfig,
    inputs: &PqInputs,
    infos: &[StepInfo],
) -> CheckReport {
    let captures = infos.iter().filter(|i| i.captured).count();
    assert_eq!(captures, 1, "one capture, then in-place updates");
    let out = ix.download().expect("download");
    check(cfg, inputs, &out)
}

#[test]
fn gpu_decode_loop_updates_the_graph_in_place() {
    let Some(rt) = runtime() else { return };
    let cfg = base();
    // S runs 8310 ..= 8330, one new key per step; n = S - 128 crosses 8192, so the
    // select grid grows from 1 to 2 chunks per row (CHUNK 8192) midway
    let (s0, s1) = (8310, 8330);
    let shape = sh(1, 8, 4, s1, 128);
    checked_path_loop(
        &rt,
        cfg,
        shape,
        (s0, s1),
        SelectPath::Chunked,
        "chunked",
        |i| !i.hist,
    );
}

/// A ratio heavy size (spec "Sizes given as ratios") over a graph-replayed decode loop:
/// heavy = floor(0.05 S) moves from 415 to 416 at S = 8320, so the captured nodes are
/// updated in place with the new size (and the longer sparse_list); every step reports
/// its own total and the last one matches the CPU reference. The chunked kernel is the
/// one for heavy at the capacity S = 8330 (K_PAD 512).
#[test]
fn gpu_ratio_heavy_decode_loop_resolves_each_step() {
    let Some(rt) = runtime() else { return };
    let cfg = PqConfig {
        heavy_size: Size::Ratio(0.05),
        ..base()
    };
    let (s0, s1) = (8310, 8330);
    let shape = sh(1, 8, 4, s1, 128);
    for path in [SelectPath::Chunked, SelectPath::Auto] {
        let (ix, _dev, inputs, infos) = decode_loop(&rt, cfg, shape, (s0, s1), path);
        assert!(
            ix.select_variant().contains("h512"),
            "{}",
            ix.select_variant()
        );
        for (s, info) in (s0..=s1).zip(&infos) {
            assert_eq!(info.total, 128 + s / 20 + 128, "{path:?} S={s}");
        }
        let report = loop_checked_once_captured(&ix, &cfg, &inputs, &infos);
        eprintln!("ratio heavy 0.05, {path:?}, S={s0}..={s1}: [{report}]");
        assert!(report.passed(), "{path:?}: {report}");
    }
}

#[test]
fn gpu_hist_path_decode_loop_and_reimport() {
    hist_loop_and_reimport(SelectPath::Hist, "histogram", |i| {
        i.hist && !i.split && !i.index
    });
}

#[test]
fn gpu_index_path_decode_loop_and_reimport() {
    // the indexed path's buckets fill as keys join the candidates, one per step; the
    // re-import must empty them (counted anew), not reuse them. 16 rows of ~9000 keys:
    // Index takes the companion fill (one launch)
    hist_loop_and_reimport(SelectPath::Index, "indexed", |i| {
        i.hist && i.index && i.companion && i.launches == 1
    });
}

#[test]
fn gpu_index_wfill_decode_loop_and_reimport() {
    // the same with the weights written by pq_wfill (sm_90: pq_index its programmatic
    // dependent; sm_80: by each row CTA, one launch)
    hist_loop_and_reimport(SelectPath::IndexWfill, "indexed (pq_wfill)", |i| {
        i.hist && i.index && !i.companion
    });
}

/// A decode loop on a histogram path (`ran` tells whether a step ran it): each step
/// moves every row's histogram by one key (graph updated in place); then a re-import
/// resets it and it is counted anew. Both checked against the CPU reference.
fn hist_loop_and_reimport(path: SelectPath, what: &str, ran: fn(&StepInfo) -> bool) {
    let Some(rt) = runtime() else { return };
    let cfg = base();
    let (s0, s1) = (9000, 9016);
    let shape = sh(2, 8, 4, s1, 128);
    let (mut ix, dev, inputs, infos) = decode_loop(&rt, cfg, shape, (s0, s1), path);
    for (s, info) in (s0..=s1).zip(&infos) {
        assert!(ran(info), "S={s}: the {what} path did not run: {info:?}");
    }
    let report = loop_checked_once_captured(&ix, &cfg, &inputs, &infos);
    eprintln!("{what} decode loop S={s0}..={s1}: [{report}]");
    assert!(report.passed(), "{what} decode loop: {report}");
    // replace the codes: the histogram must be recounted, not reused
    let codes = ix.export_codes().expect("export");
    let n1 = ix.n_cached();
    let mut shifted = codes.clone();
    for c in shifted.iter_mut() {
        *c = (*c + 1) % cfg.k_centroids() as i64;
    }
    ix.import_codes(&shifted, n1).expect("re-import");
    let info = ix
        .step(dev.query(), dev.key(), s1, LaunchMode::Launch)
        .expect("step after re-import");
    assert!(
        ran(&info),
        "after re-import: the {what} path did not run: {info:?}"
    );
    let out2 = ix.download().expect("download");
    let inputs2 = PqInputs {
        codes: shifted,
        n_cached: n1,
        ..inputs.clone()
    };
    let report2 = check(&cfg, &inputs2, &out2);
    eprintln!("{what}: after re-import: [{report2}]");
    assert!(report2.passed(), "{what}: after re-import: {report2}");
}

#[test]
fn gpu_split_path_decode_loop() {
    let Some(rt) = runtime() else { return };
    let cfg = base();
    // the split path (pq_thresh + pq_emit) over a decode loop whose parts per row grow:
    // n = S - 128 crosses 16384, a multiple of every emit TILE (1024 .. 8192 keys per
    // CTA), so the emit grid changes while the graph is updated in place
    let (s0, s1) = (16508, 16518);
    let shape = sh(2, 8, 4, s1, 128);
    checked_path_loop(&rt, cfg, shape, (s0, s1), SelectPath::Split, "split", |i| {
        i.split && i.launches == 2
    });
}

/// A graph-mode decode loop on `path` over `S = s0 ..= s1` whose every step ran the
/// `what` path (`ran`), captured its graph once (later steps updated it in place), and
/// whose last step passes the CPU reference.
fn checked_path_loop(
    rt: &Arc<Runtime>,
    cfg: PqConfig,
    shape: Shape,
    (s0, s1): (usize, usize),
    path: SelectPath,
    what: &str,
    ran: fn(&StepInfo) -> bool,
) {
    let (ix, _dev, inputs, infos) = decode_loop(rt, cfg, shape, (s0, s1), path);
    for (s, info) in (s0..=s1).zip(&infos) {
        assert!(ran(info), "S={s}: the {what} path did not run: {info:?}");
    }
    let report = loop_checked_once_captured(&ix, &cfg, &inputs, &infos);
    eprintln!("{what} decode loop S={s0}..={s1}: [{report}]");
    assert!(report.passed(), "{what} decode loop: {report}");
}

/// The radix-select split path ((M, bits) = (2, 8), heavy 10% of S) over a graph-replayed
/// decode loop: its select kernel runs one cluster of CTAs a row (sm_90), and the
/// captured cluster node is updated in place as S grows (one capture for the loop); the
/// last step matches the CPU reference.
#[test]
fn gpu_radix_decode_loop_updates_the_graph_in_place() {
    let Some(rt) = runtime() else { return };
    let cfg = PqConfig {
        heavy_size: Size::Ratio(0.1),
        pq_group_factor: 2,
        pq_bits: 8,
        ..base()
    };
    let (s0, s1) = (9000, 9012);
    let shape = sh(1, 8, 2, s1, 128);
    checked_path_loop(
        &rt,
        cfg,
        shape,
        (s0, s1),
        SelectPath::Auto,
        "radix-select",
        |i| i.range && i.launches == 2,
    );
}

/// Every select path gives the right answer while another stream keeps the SMs busy, so
/// the step's CTAs start late, staggered and in another order than on an idle GPU.
///
/// The busy work is `pq_wfill` over a 1 GiB buffer on a second stream (a persistent grid
/// of 1, 4 or 16 CTAs per SM: at 16 every SM is full and the step's CTAs get an SM only as
/// busy CTAs exit), queued three deep just before each step; the step then runs with
/// plain launches and as a graph replay, on fresh random inputs, each checked against the
/// CPU reference by the spec's rule. Shapes: the reference workload and S = 6000 with 8
/// heads over 8 and over 2 KV heads (where the indexed path once returned wrong heavy
/// sets when CTAs were scheduled differently), one new key each; and a step of 4096 new
/// keys (`pq_quant` first: on the indexed path with `pq_wfill` it runs as `pq_wfill`'s
/// programmatic dependent and `pq_index` as its own, so a code read before `pq_quant`
/// finished, or a weight one before `pq_wfill`'s zeros, shows here).
#[test]
fn gpu_paths_correct_beside_a_busy_stream() {
    use cudarc::driver::DevicePtr;
    use tritonrt::abi::KernelArg;
    let Some(rt) = runtime() else { return };
    let seed = seed();
    let busy = match rt.default_kernel("pq_wfill.w_fp32") {
        Ok(k) => k,
        Err(e) => {
            skip!("no pq_wfill on this GPU's arch to keep the SMs busy: {e}");
            return;
        }
    };
    let busy_stream = rt.device().new_stream().expect("stream");
    let (rows, cols) = (1usize << 14, 1usize << 14); // 2^28 f32 elements, 1 GiB
    let buf = busy_stream
        .alloc_zeros::<f32>(rows * cols)
        .expect("1 GiB busy buffer");
    let (busy_ptr, _sync) = buf.device_ptr(&busy_stream);
    let sms = rt.device().sm_count();
    let cfg = base();
    // (shape, new keys, paths)
    let cases: [(_, usize, &[SelectPath]); 4] = [
        (sh(1, 32, 32, 32000, 128), 1, &SelectPath::FORCED),
        (sh(1, 8, 8, 6000, 128), 1, &SelectPath::FORCED),
        (sh(1, 8, 2, 6000, 128), 1, &SelectPath::FORCED),
        (
            sh(1, 32, 8, 32768, 128),
            4096,
            &[SelectPath::IndexWfill, SelectPath::IndexCompanion],
        ),
    ];
    let (mut runs, mut failures) = (0usize, Vec::new());
    for (si, &(shape, new_keys, paths)) in cases.iter().enumerate() {
        for (pi, &path) in paths.iter().enumerate() {
            for (fi, per_sm) in [1u32, 4, 16].into_iter().enumerate() {
                let s = seed.wrapping_add((si * 100 + pi * 10 + fi) as u64 * 7919);
                let n_cached = PqInputs::default_n_cached(&cfg, shape.s) + 1 - new_keys;
                let (mut ix, inputs) = imported_indexer_seeded(&rt, cfg, shape, n_cached, path, s);
                let dev = DeviceInputs::upload(ix.stream(), &inputs, &cfg).expect("upload");
                ix.prepare(shape.s).expect("prepare");
                for mode in [LaunchMode::Launch, LaunchMode::Graph] {
                    ix.rewind(n_cached);
                    ix.poison_outputs().expect("poison");
                    ix.synchronize().expect("sync");
                    for _ in 0..3 {
                        let args = [
                            KernelArg::RawPtr(busy_ptr),
                            KernelArg::I32(rows as i32),
                            KernelArg::I32(cols as i32),
                            KernelArg::I32(1),
                            KernelArg::I32(1),
                        ];
                        // SAFETY: pq_wfill writes elements 0 .. rows * cols of the
                        // buffer, which holds exactly that many f32 and outlives the
                        // launch (synchronized below); nothing else touches it.
                        unsafe { busy.launch_raw(&busy_stream, [sms * per_sm, 1, 1], &args) }
                            .expect("busy launch");
                    }
                    let info = ix
                        .step(dev.query(), dev.key(), shape.s, mode)
                        .expect("step");
                    ix.synchronize().expect("sync");
                    busy_stream.synchronize().expect("busy sync");
                    let report = check(&cfg, &inputs, &ix.download().expect("download"));
                    runs += 1;
                    let ok = report.passed();
                    eprintln!(
                        "{} {path:?} B={} H={} H_kv={} S={} new {new_keys} busy {per_sm} CTAs/SM {mode:?} ({}): [{report}]",
                        if ok { "ok  " } else { "FAIL" },
                        shape.b,
                        shape.h,
                        shape.h_kv,
                        shape.s,
                        info.kind.name(),
                    );
                    if !ok {
                        failures.push(format!(
                            "{path:?} {shape:?} new {new_keys} {per_sm}/SM {mode:?}"
                        ));
                    }
                }
            }
        }
    }
    eprintln!(
        "{} passed, {} failed (select paths beside a busy stream)",
        runs - failures.len(),
        failures.len()
    );
    assert!(failures.is_empty(), "failed: {failures:?}");
}

/// Which select kernels a step ran, for the logs.
/// The engine API refuses bad device inputs with a message naming them: a centroid
/// buffer of the wrong length, device codes outside `0..K` (counted on the device), output
/// buffers too small or of the wrong dtype, a key view too short for the step; and on
/// good inputs `step_into` writes the same bytes into the caller's buffers as `step` into
/// the indexer's own.
#[test]
fn gpu_engine_api_checks_device_inputs() {
    use cudarc::driver::CudaSlice;
    use tritonrt::driver::DeviceBuf;
    use tritonrt::pq::gpu::StepOutputs;
    let Some(rt) = runtime() else { return };
    let cfg = base();
    let shape = sh(1, 8, 2, 6000, 128);
    let n0 = PqInputs::default_n_cached(&cfg, shape.s);
    let inputs = PqInputs::random(&cfg, shape, n0, seed()).expect("inputs");
    let stream = rt.device().new_stream().expect("stream");
    let cent: CudaSlice<f32> = stream.clone_htod(&inputs.centroids).unwrap();
    let short: CudaSlice<f32> = stream.clone_htod(&inputs.centroids[1..]).unwrap();
    let none = None::<&CudaSlice<f32>>;
    let e = GpuIndexer::new_on_device(
        rt.clone(),
        stream.clone(),
        cfg,
        shape,
        &short,
        none,
        &KernelChoice::manifest_defaults(),
    )
    .err()
    .expect("short centroids refused");
    assert!(e.to_string().contains("pq_centroids"), "{e}");
    let mut ix = GpuIndexer::new_on_device(
        rt.clone(),
        stream.clone(),
        cfg,
        shape,
        &cent,
        none,
        &KernelChoice::manifest_defaults(),
    )
    .expect("indexer");
    let mut bad_codes = inputs.codes.clone();
    bad_codes[17] = 64; // K = 64
    bad_codes[99] = -1;
    let bad: CudaSlice<i64> = stream.clone_htod(&bad_codes).unwrap();
    let e = ix
        .import_codes_on_device(&bad, n0)
        .expect_err("codes outside 0..K");
    assert!(
        e.to_string().contains("2 of the") && e.to_string().contains("outside 0..64"),
        "{e}"
    );
    let codes: CudaSlice<i64> = stream.clone_htod(&inputs.codes).unwrap();
    ix.import_codes_on_device(&codes, n0).expect("import");
    let dev = DeviceInputs::upload(&stream, &inputs, &cfg).expect("upload");
    let rows = shape.b * shape.h;
    let total = cfg.total(shape.s);
    let sl: CudaSlice<i64> = stream.alloc_zeros(rows * total).unwrap();
    let len: CudaSlice<i64> = stream.alloc_zeros(rows).unwrap();
    let w: CudaSlice<f32> = stream.alloc_zeros(rows * shape.s).unwrap();
    let w_small: CudaSlice<f32> = stream.alloc_zeros(rows * shape.s - 1).unwrap();
    let w_ints: CudaSlice<i32> = stream.alloc_zeros(rows * shape.s).unwrap();
    let out = |w: DeviceBuf| StepOutputs {
        sparse_list: DeviceBuf::of(&sl, &stream),
        sparse_len: DeviceBuf::of(&len, &stream),
        weight_list: w,
    };
    for (w_bad, what) in [
        (DeviceBuf::of(&w_small, &stream), "too small"),
        (DeviceBuf::of(&w_ints, &stream), "of i32"),
    ] {
        let e = ix
            .step_into(
                dev.query(),
                dev.key(),
                shape.s,
                LaunchMode::Launch,
                out(w_bad),
            )
            .expect_err(what);
        assert!(e.to_string().contains("weight_list"), "{what}: {e}");
    }
    // a step at S + 1 with outputs big enough for it: the key view (S positions) is short
    let w_next: CudaSlice<f32> = stream.alloc_zeros(rows * (shape.s + 1)).unwrap();
    let short_key =
        tritonrt::pq::gpu::DeviceTensorRef::new(dev.key().buf(), DType::F32, dev.key().strides())
            .unwrap();
    let e = ix
        .step_into(
            dev.query(),
            &short_key,
            shape.s + 1,
            LaunchMode::Launch,
            out(DeviceBuf::of(&w_next, &stream)),
        )
        .expect_err("a step past the key buffer");
    assert!(
        e.to_string().contains("key") && e.to_string().contains("buffer holds"),
        "{e}"
    );
    ix.rewind(n0);
    ix.step_into(
        dev.query(),
        dev.key(),
        shape.s,
        LaunchMode::Graph,
        out(DeviceBuf::of(&w, &stream)),
    )
    .expect("step_into");
    ix.synchronize().unwrap();
    let (got_sl, got_len, got_w) = (
        stream.clone_dtoh(&sl).unwrap(),
        stream.clone_dtoh(&len).unwrap(),
        stream.clone_dtoh(&w).unwrap(),
    );
    ix.rewind(n0);
    ix.step(dev.query(), dev.key(), shape.s, LaunchMode::Launch)
        .expect("step");
    let own = ix.download().expect("download");
    assert_eq!(got_sl, own.sparse_list, "sparse_list");
    assert_eq!(got_len, own.sparse_len, "sparse_len");
    assert_eq!(got_w, own.weight_list, "weight_list");
    let report = check(&cfg, &inputs, &own);
    assert!(report.passed(), "{report}");
    eprintln!("engine API: bad centroids, codes, outputs and key extent refused; step_into == step: [{report}]");
}

/// Non-finite inputs (spec "Non-finite inputs") on every select path: a query head with a
/// NaN coordinate (all its scores NaN: the heavy picks are the lowest candidates), one
/// with an infinite coordinate, centroids with +inf, -inf and NaN coordinates (scores of
/// +-inf and NaN beside finite ones), and new keys with infinite or NaN coordinates
/// (their codes: the lowest code whose distance is not NaN). Each run must pass the
/// spec's rule against the f64 reference (NaN below -inf, the lowest j among NaNs), be
/// bit-identical as a graph, and give the same outputs when run again.
#[test]
fn gpu_nonfinite_inputs_rank_nan_last_on_every_path() {
    let Some(rt) = runtime() else { return };
    let seed = seed();
    let r = base();
    let shape = sh(1, 8, 4, 6000, 128);
    let cfg = PqConfig {
        heavy_size: Size::Count(128),
        ..r
    };
    let (k, ds, dc, mm) = (
        cfg.k_centroids(),
        cfg.d_sub(shape.d),
        cfg.d_c(shape.d),
        cfg.m(),
    );
    let mut failures = Vec::new();
    let mut runs = 0;
    // one new key (the histogram family applies), then 100 (bulk quantization)
    for (ci, new_keys) in [1usize, 100].into_iter().enumerate() {
        let n_cached = shape.s - cfg.init_offset - new_keys;
        let mut x =
            PqInputs::random(&cfg, shape, n_cached, seed.wrapping_add(ci as u64)).expect("inputs");
        let d = shape.d;
        x.query[0] = f32::NAN; // head 0: every score NaN
        x.query[d + 70] = f32::INFINITY; // head 1, subvector 1: +-inf entries
        let cen = |g: usize, m: usize, c: usize, i: usize| ((g * mm + m) * k + c) * dc + i;
        x.centroids[cen(0, 0, 3, 0)] = f32::INFINITY;
        x.centroids[cen(0, 1, 5, 2)] = f32::NAN;
        x.centroids[cen(1, 0, 7, 0)] = f32::INFINITY;
        x.centroids[cen(1, 0, 7, 1)] = f32::NEG_INFINITY;
        x.centroids[cen(2, 1, 9, ds - 1)] = f32::NEG_INFINITY;
        // new keys: +inf, NaN, -inf coordinates (the last one for every KV head)
        let key = |g: usize, p: usize, i: usize| (g * shape.s + p) * d + i;
        let p0 = cfg.init_offset + n_cached;
        for g in 0..shape.h_kv {
            x.key[key(g, shape.s - 1, 5)] = f32::INFINITY;
            if new_keys > 1 {
                x.key[key(g, p0, 1)] = f32::NAN;
                x.key[key(g, p0 + 1, d - 1)] = f32::NEG_INFINITY;
                x.key[key(g, p0 + 2, 0)] = f32::INFINITY;
                x.key[key(g, p0 + 2, 1)] = f32::NEG_INFINITY;
            }
        }
        for path in [
            SelectPath::Auto,
            SelectPath::Chunked,
            SelectPath::Hist,
            SelectPath::Split,
            SelectPath::IndexWfill,
            SelectPath::IndexCompanion,
        ] {
            let run = || {
                execute_with_path(
                    &rt,
                    &cfg,
                    &x,
                    &KernelChoice::manifest_defaults(),
                    path,
                    None,
                    0,
                    false,
                )
            };
            let (a, b) = match (run(), run()) {
                (Ok(a), Ok(b)) => (a, b),
                (Err(e), _) | (_, Err(e)) => {
                    eprintln!("FAIL nonfinite, {new_keys} new ({path:?}): {e}");
                    failures.push((new_keys, path));
                    continue;
                }
            };
            runs += 1;
            let report = check(&cfg, &x, &a.output);
            let same = a.output == b.output;
            let ok = report.passed() && a.graph_matches && same;
            eprintln!(
                "{} nonfinite, {new_keys:3} new keys, {path:?} ran {}: graph {}, rerun {} [{report}]",
                if ok { "ok  " } else { "FAIL" },
                a.kind.name(),
                if a.graph_matches { "identical" } else { "DIFFERS" },
                if same { "identical" } else { "DIFFERS" },
            );
            if !ok {
                failures.push((new_keys, path));
            }
        }
    }
    eprintln!(
        "{} passed, {} failed (non-finite inputs)",
        runs - failures.len().min(runs),
        failures.len()
    );
    assert!(failures.is_empty(), "failed: {failures:?}");
}

/// Queries and centroids sharing a large component: each subvector's query has a 100 in
/// its first coordinate and every centroid 200 +- 35 there, so every score lies near 4e4
/// within some percent (ranks past 16384, where one rank is 2^16 ulps of the score). The
/// radix select's rounds must not take a bin of such ranks for near-ties unless its scores
/// are (a bin 0.04 ranks wide holds scores 0.03 % apart, three times the spec's
/// tolerance). (2, 8) and (4, 8) on the radix-select path, (2, 6) on every histogram
/// path; each run passes the spec's rule against the f64 reference and its graph replay
/// is bit-identical.
#[test]
fn gpu_offset_scores_past_the_linear_ranks_keep_the_tolerance() {
    use rand::{Rng, SeedableRng};
    let Some(rt) = runtime() else { return };
    let seed = seed();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut tally = Tally::default();
    let shape = sh(1, 8, 2, 12000, 128);
    for (m, bits, dt) in [
        (2usize, 8u32, DType::BF16),
        (4, 8, DType::F32),
        (2, 6, DType::BF16),
    ] {
        let cfg = PqConfig {
            heavy_size: Size::Count(1200),
            pq_group_factor: m,
            pq_bits: bits,
            input_dtype: dt,
            weight_dtype: dt,
            ..base()
        };
        let (k, ds, dc) = (cfg.k_centroids(), cfg.d_sub(shape.d), cfg.d_c(shape.d));
        let n_cached = PqInputs::default_n_cached(&cfg, shape.s);
        let mut x = inputs_for(&cfg, shape, n_cached, false, rng.random());
        for q in x.query.chunks_mut(ds) {
            q[0] = 100.0;
        }
        for c in x.centroids.chunks_mut(dc) {
            c[0] = 200.0 + rng.random_range(-35.0f32..35.0);
        }
        assert_eq!(x.centroids.len(), shape.b * shape.h_kv * m * k * dc);
        let paths: &[SelectPath] = if bits == 6 {
            // (the chunked kernel, exact by construction, takes heavy <= 512 only)
            &[
                SelectPath::Auto,
                SelectPath::Hist,
                SelectPath::Split,
                SelectPath::IndexWfill,
                SelectPath::IndexCompanion,
            ]
        } else {
            &[SelectPath::Auto]
        };
        for &path in paths {
            let what = format!("offset scores M={m} bits={bits} {} {path:?}", dt.as_str());
            let ran = checked_step(&rt, &cfg, &x, path, false, &what, |ex| {
                bits == 6 || ex.range_path
            });
            tally.record(what, ran);
        }
    }
    tally.finish("offset scores past the linear ranks");
}

/// Heavy sizes above 512 (upstream runs 10% of S: 3020 at S = 32768) on every
/// histogram-family path: no chunked kernel exists for them, the histogram family takes
/// any heavy size. Each run passes the spec's rule (exactly, on well-separated inputs),
/// and its graph replay is bit-identical to plain launches.
#[test]
fn gpu_heavy_above_512_on_the_histogram_family() {
    let Some(rt) = runtime() else { return };
    let seed = seed();
    let mut tally = Tally::default();
    let shape = sh(1, 8, 2, 12000, 128);
    for (i, heavy) in [513usize, 1024, 3020, 8000].into_iter().enumerate() {
        let cfg = PqConfig {
            heavy_size: Size::Count(heavy),
            input_dtype: DType::BF16,
            weight_dtype: DType::BF16,
            ..base()
        };
        for exact in [false, true] {
            let n_cached = PqInputs::default_n_cached(&cfg, shape.s);
            let s = seed.wrapping_add(i as u64 * 31 + u64::from(exact));
            let x = inputs_for(&cfg, shape, n_cached, exact, s);
            for path in [
                SelectPath::Auto,
                SelectPath::Hist,
                SelectPath::Split,
                SelectPath::IndexWfill,
                SelectPath::IndexCompanion,
            ] {
                let what = format!(
                    "heavy {heavy:5} {:<6} {path:?}",
                    if exact { "exact" } else { "random" }
                );
                let ran = checked_step(&rt, &cfg, &x, path, exact, &what, |ex| ex.hist_path);
                tally.record(what, ran);
            }
        }
    }
    tally.finish("heavy above 512");
}

/// The runs of one sweep test: each [`checked_step`] result recorded, then one count line
/// and a failure naming every run that failed or was refused.
#[derive(Default)]
struct Tally {
    runs: usize,
    failures: Vec<String>,
}

impl Tally {
    fn record(&mut self, what: String, ran: Result<bool, String>) {
        match ran {
            Ok(passed) => {
                self.runs += 1;
                if !passed {
                    self.failures.push(what);
                }
            }
            Err(e) => {
                eprintln!("FAIL {what}: {e}");
                self.failures.push(what);
            }
        }
    }

    fn finish(self, label: &str) {
        eprintln!(
            "{} passed, {} failed ({label})",
            self.runs - self.failures.len().min(self.runs),
            self.failures.len()
        );
        assert!(self.failures.is_empty(), "failed: {:?}", self.failures);
    }
}

/// One step of `cfg` on `x` under `path`, plain and as a graph, checked by the spec's rule
/// (exactly where `exact`), the graph replay bit-identical and `ran_as(&execution)`; prints
/// one line naming `what`. `Ok(passed)`, or `Err(message)` where the step was refused or
/// failed.
fn checked_step(
    rt: &Arc<Runtime>,
    cfg: &PqConfig,
    x: &PqInputs,
    path: SelectPath,
    exact: bool,
    what: &str,
    ran_as: impl Fn(&tritonrt::pq::gpu::Execution) -> bool,
) -> Result<bool, String> {
    let ex = execute_with_path(
        rt,
        cfg,
        x,
        &KernelChoice::manifest_defaults(),
        path,
        None,
        0,
        false,
    )
    .map_err(|e| e.to_string())?;
    let report = if exact {
        check_exact(cfg, x, &ex.output)
    } else {
        check(cfg, x, &ex.output)
    };
    let ok = report.passed() && ex.graph_matches && ran_as(&ex);
    eprintln!(
        "{} {what} ran {}: graph {} [{report}]",
        if ok { "ok  " } else { "FAIL" },
        ex.kind.name(),
        if ex.graph_matches {
            "identical"
        } else {
            "DIFFERS"
        },
    );
    Ok(ok)
}

/// Configs the combination histogram does not take (PQCache's (M, bits) = (2, 8) and (4,
/// 8); (3, 5) with D = 96; M > 4: (8, 4), (6, 1)) run the radix-select split path at
/// every heavy size from 0 to 10% of S and beyond 512 (where no chunked kernel exists),
/// fp32 and bf16, GQA, B = 2, metric ip: each run passes the spec's rule (exactly on
/// well-separated inputs), and its graph replay is bit-identical to plain launches.
#[test]
fn gpu_many_combinations_take_the_radix_select() {
    let Some(rt) = runtime() else { return };
    let seed = seed();
    let mut tally = Tally::default();
    let cases: [(usize, u32, DType, Metric, Shape); 7] = [
        (
            2,
            8,
            DType::BF16,
            Metric::Euclidean,
            sh(1, 8, 2, 12000, 128),
        ),
        (
            4,
            8,
            DType::BF16,
            Metric::Euclidean,
            sh(1, 8, 2, 12000, 128),
        ),
        (2, 8, DType::F32, Metric::Ip, sh(2, 4, 4, 9000, 128)),
        (3, 5, DType::F32, Metric::Euclidean, sh(1, 4, 1, 8000, 96)),
        (4, 8, DType::F16, Metric::Euclidean, sh(2, 4, 2, 5000, 128)),
        // M > 4: K^M = 2^32, and K^M = 64 (the combination histogram takes M <= 4 only)
        (8, 4, DType::BF16, Metric::Euclidean, sh(1, 8, 2, 6000, 128)),
        (6, 1, DType::F32, Metric::Ip, sh(1, 4, 2, 5000, 96)),
    ];
    for (ci, (m, bits, dt, metric, shape)) in cases.into_iter().enumerate() {
        for heavy in [0usize, 1, 127, 128, 129, 513, 1200] {
            let cfg = PqConfig {
                heavy_size: Size::Count(heavy),
                pq_group_factor: m,
                pq_bits: bits,
                input_dtype: dt,
                weight_dtype: dt,
                metric,
                ..base()
            };
            for exact in [false, true] {
                // random inputs: 7 new keys (pq_quant first); well-separated: one (quantized
                // by the path's own kernels)
                let new_keys = if exact { 1 } else { 7 };
                let n_cached = PqInputs::default_n_cached(&cfg, shape.s) + 1 - new_keys;
                let s = seed.wrapping_add((ci * 100 + heavy) as u64 * 31 + u64::from(exact));
                let x = inputs_for(&cfg, shape, n_cached, exact, s);
                let what = format!(
                    "M={m} bits={bits} {} {} B={} H={} H_kv={} S={} heavy {heavy} {new_keys} new {}",
                    dt.as_str(),
                    metric.as_str(),
                    shape.b,
                    shape.h,
                    shape.h_kv,
                    shape.s,
                    if exact { "exact" } else { "random" }
                );
                let ran = checked_step(&rt, &cfg, &x, SelectPath::Auto, exact, &what, |ex| {
                    ex.range_path
                });
                tally.record(what, ran);
            }
        }
    }
    tally.finish("radix-select split path");
}

/// The radix select past its rank cache and inside a large tie (`kernels_triton/pq_range.py`,
/// `RANK_WORDS`): rows whose CTAs hold more candidates than their caches (S = 110000:
/// 13.7 K a CTA, 6144 cached; the later rounds score the rest again from the codes), and
/// codes where nine keys in ten share one combination (at heavy 3000 the threshold falls
/// inside that tie of ~10800 keys, and the step takes the tied keys in position order).
/// Each run passes the spec's rule on the radix-select path, its graph replay
/// bit-identical to plain launches.
#[test]
fn gpu_radix_select_past_the_rank_cache_and_in_a_tie() {
    let Some(rt) = runtime() else { return };
    let seed = seed();
    let mut tally = Tally::default();
    let cfg = |heavy: usize| PqConfig {
        heavy_size: Size::Count(heavy),
        pq_group_factor: 2,
        pq_bits: 8,
        input_dtype: DType::BF16,
        weight_dtype: DType::BF16,
        ..base()
    };
    for (i, (shape, heavy, skewed)) in [
        (sh(1, 2, 1, 110_000, 64), 1000, false),
        (sh(1, 2, 1, 110_000, 64), 11_000, false),
        (sh(1, 4, 2, 12_000, 64), 300, true),
        (sh(1, 4, 2, 12_000, 64), 3000, true),
    ]
    .into_iter()
    .enumerate()
    {
        let c = cfg(heavy);
        let n_cached = PqInputs::default_n_cached(&c, shape.s);
        let mut x = inputs_for(
            &c,
            shape,
            n_cached,
            false,
            seed.wrapping_add(i as u64 * 7919),
        );
        if skewed {
            // codes [B, n_cached, H_kv, M]: keys t % 10 != 0 all take combination (5, 7)
            let (h_kv, m) = (shape.h_kv, c.m());
            for t in (0..x.n_cached).filter(|t| t % 10 != 0) {
                for b in 0..shape.b {
                    for g in 0..h_kv {
                        let at = ((b * x.n_cached + t) * h_kv + g) * m;
                        x.codes[at] = 5;
                        x.codes[at + 1] = 7;
                    }
                }
            }
        }
        let what = format!(
            "M=2 bits=8 bf16 H={} H_kv={} S={} heavy {heavy}{}",
            shape.h,
            shape.h_kv,
            shape.s,
            if skewed { " skewed codes" } else { "" }
        );
        let ran = checked_step(&rt, &c, &x, SelectPath::Auto, false, &what, |ex| {
            ex.range_path
        });
        tally.record(what, ran);
    }
    tally.finish("radix-select past the rank cache and in a tie");
}

/// Every code width and subvector count the indexer takes (bits 1..8, M in {1, 2, 3, 4,
/// 6, 8} at D = 96), query/keys and weights in mixed dtypes, heavy 300 and 1000, and heavy
/// at `n - 1` and `n` (every candidate and then some, the fill rule): each run passes the
/// spec's rule against the f64 reference (exactly on well-separated inputs), its graph
/// replay bit-identical; no config is refused.
#[test]
fn gpu_every_bits_m_and_dtype_mix() {
    let Some(rt) = runtime() else { return };
    let seed = seed();
    let mut tally = Tally::default();
    let shape = sh(1, 4, 2, 2600, 96);
    let dts = [DType::F32, DType::BF16, DType::F16];
    let mut cases = Vec::new();
    for bits in 1..=8u32 {
        for (i, m) in [1usize, 2, 3, 4, 6, 8].into_iter().enumerate() {
            // a dtype pair per case, cycling through all nine; heavy above 512 every
            // other case
            let j = (bits as usize * 6 + i) % 9;
            let heavy = if (bits as usize + i).is_multiple_of(2) {
                300
            } else {
                1000
            };
            cases.push((m, bits, dts[j / 3], dts[j % 3], heavy));
        }
    }
    let n = shape.s - 128;
    for (m, bits) in [(2usize, 6u32), (1, 8), (4, 3), (2, 8)] {
        for heavy in [n - 1, n] {
            cases.push((m, bits, DType::BF16, DType::F32, heavy));
        }
    }
    for (ci, (m, bits, qt, wt, heavy)) in cases.into_iter().enumerate() {
        let cfg = PqConfig {
            heavy_size: Size::Count(heavy),
            pq_group_factor: m,
            pq_bits: bits,
            input_dtype: qt,
            weight_dtype: wt,
            ..base()
        };
        let exact = ci % 2 == 1;
        let n_cached = PqInputs::default_n_cached(&cfg, shape.s);
        let s = seed.wrapping_add(ci as u64 * 131);
        let x = inputs_for(&cfg, shape, n_cached, exact, s);
        let what = format!(
            "M={m} bits={bits} q={} w={} heavy {heavy} {}",
            qt.as_str(),
            wt.as_str(),
            if exact { "exact" } else { "random" }
        );
        let ran = checked_step(&rt, &cfg, &x, SelectPath::Auto, exact, &what, |_| true);
        tally.record(what, ran);
    }
    tally.finish("bits 1..8, M 1..8, dtype mix, heavy 300, 1000, n - 1 and n");
}

/// Rows whose heavy picks reach into the sink or the window: the sink past the first
/// quantized key (a position both sink and heavy), fewer candidates than heavy (the
/// lowest masked keys fill in: positions both heavy and window), a window reaching before
/// the first key (no candidate at all), on the radix-select path ((2, 8), (4, 8), (8, 4))
/// and on the split path ((2, 6) asked for as split). Each run passes the spec's rule
/// (exactly on well-separated inputs) and its graph replay is bit-identical.
#[test]
fn gpu_rows_reaching_into_sink_or_window() {
    let Some(rt) = runtime() else { return };
    let seed = seed();
    let mut tally = Tally::default();
    // (M, bits, dtype), (S, sink, window, heavy), path
    type Edge = ((usize, u32, DType), [usize; 4], SelectPath);
    let cases: [Edge; 7] = [
        ((2, 8, DType::BF16), [6000, 700, 128, 600], SelectPath::Auto),
        ((2, 8, DType::F32), [6000, 700, 128, 1500], SelectPath::Auto),
        (
            (2, 8, DType::F32),
            [4000, 128, 1000, 3020],
            SelectPath::Auto,
        ),
        ((4, 8, DType::BF16), [3000, 64, 5000, 600], SelectPath::Auto),
        (
            (8, 4, DType::BF16),
            [6000, 256, 300, 1024],
            SelectPath::Auto,
        ),
        (
            (2, 6, DType::BF16),
            [6000, 700, 128, 600],
            SelectPath::Split,
        ),
        (
            (2, 6, DType::F32),
            [4000, 128, 1000, 3020],
            SelectPath::Split,
        ),
    ];
    for (ci, ((m, bits, dt), [s_len, sink, window, heavy], path)) in cases.into_iter().enumerate() {
        let cfg = PqConfig {
            heavy_size: Size::Count(heavy),
            sink_size: Size::Count(sink),
            window_size: Size::Count(window),
            pq_group_factor: m,
            pq_bits: bits,
            input_dtype: dt,
            weight_dtype: dt,
            ..base()
        };
        let shape = sh(1, 8, 2, s_len, 128);
        assert!(!cfg.is_short(s_len), "case {ci} is on the short path");
        for exact in [false, true] {
            let new_keys = if exact { 1 } else { 7 };
            let n_cached = PqInputs::default_n_cached(&cfg, shape.s) + 1 - new_keys;
            let x = inputs_for(
                &cfg,
                shape,
                n_cached,
                exact,
                seed.wrapping_add(ci as u64 * 71 + u64::from(exact)),
            );
            let what = format!(
                "M={m} bits={bits} {} S={s_len} sink {sink} window {window} heavy {heavy} {path:?} {}",
                dt.as_str(),
                if exact { "exact" } else { "random" }
            );
            let want_split = path == SelectPath::Split;
            let ran = checked_step(&rt, &cfg, &x, path, exact, &what, |ex| {
                if want_split {
                    ex.split_path
                } else {
                    ex.range_path
                }
            });
            tally.record(what, ran);
        }
    }
    tally.finish("rows reaching into sink or window");
}
