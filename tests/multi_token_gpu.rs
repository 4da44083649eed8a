//! Multi-token decode steps on the GPU (spec, "Multi-token steps"): 1, 2, 7, 64, 4096 and
//! all keys but one new in one step, against the CPU reference (f64) by the spec's rule,
//! on fresh random inputs, for every select path, plain launches and graph replay.
//!
//! Every run poisons the outputs, runs the step with plain launches and again as a CUDA
//! graph (the two must be bit-identical), and checks the codes (each new key's code the
//! reference's or a near tie) and the selection. Steps with more than
//! `BULK_QUANTIZE_MIN` new keys, or a candidate among them, quantize with `pq_quant`
//! first; the few-key counts also run with `pq_quant` forced (`bulk_min = 0`), so both
//! forms are checked at every count. Skipped, saying so, without a CUDA device.

#[macro_use]
mod common;

use std::sync::Arc;

use tritonrt::pq::gpu::{
    execute_with_path, DeviceInputs, GpuIndexer, KernelChoice, LaunchMode, SelectPath,
    BULK_QUANTIZE_MIN,
};
use tritonrt::pq::{check, DType, Metric, PqConfig, PqInputs, Shape};
use tritonrt::runtime::Runtime;

/// The manifest defaults with `pq_quant` variant `id` (when given) in place of its
/// kernel's default: an id of `pq_quant.k_<qt>` alone also serves aligned keys.
fn quant_choice(rt: &Runtime, id: Option<&str>) -> KernelChoice {
    let base = KernelChoice::manifest_defaults();
    match id {
        Some(id) => base
            .with_variant_id(rt.store(), id)
            .expect("a variant of the manifest"),
        None => base,
    }
}

fn runtime() -> Option<Arc<Runtime>> {
    common::gpu_runtime("multi-token GPU tests")
}

/// The new-key counts the issue asks for; `usize::MAX` stands for "all but one".
const COUNTS: [usize; 6] = [1, 2, 7, 64, 4096, usize::MAX];

const PATHS: [SelectPath; 6] = [
    SelectPath::Auto,
    SelectPath::Chunked,
    SelectPath::Hist,
    SelectPath::Split,
    SelectPath::IndexCompanion,
    SelectPath::IndexWfill,
];

struct Case {
    name: &'static str,
    cfg: PqConfig,
    shape: Shape,
}

fn cases() -> Vec<Case> {
    let r = PqConfig::reference_workload();
    let bf16 = PqConfig {
        input_dtype: DType::BF16,
        weight_dtype: DType::BF16,
        ..r
    };
    let sh = |b, h, h_kv, s, d| Shape { b, h, h_kv, s, d };
    vec![
        // the target shape, shortened: GQA, bf16, M = 2, bits = 6
        Case {
            name: "bf16 GQA M=2 bits=6",
            cfg: bf16,
            shape: sh(1, 32, 8, 8192, 128),
        },
        Case {
            name: "fp32 ip M=2 bits=6",
            cfg: PqConfig {
                metric: Metric::Ip,
                ..r
            },
            shape: sh(1, 8, 8, 6000, 128),
        },
        // K = 256: four centroid blocks per key; d_s = 128
        Case {
            name: "fp16 M=1 bits=8 B=2",
            cfg: PqConfig {
                pq_group_factor: 1,
                pq_bits: 8,
                input_dtype: DType::F16,
                weight_dtype: DType::F16,
                ..r
            },
            shape: sh(2, 4, 2, 5000, 128),
        },
        // d_s = 16 (less than a dot tile's 32), K = 16, weights of another dtype
        Case {
            name: "bf16 M=4 bits=4 D=64 w=fp32",
            cfg: PqConfig {
                pq_group_factor: 4,
                pq_bits: 4,
                input_dtype: DType::BF16,
                weight_dtype: DType::F32,
                ..r
            },
            shape: sh(1, 8, 4, 4700, 64),
        },
        // K = 2, M = 8 (d_s = 16): the histogram path's combos 256
        Case {
            name: "fp32 ip M=8 bits=1",
            cfg: PqConfig {
                pq_group_factor: 8,
                pq_bits: 1,
                metric: Metric::Ip,
                ..r
            },
            shape: sh(1, 4, 4, 4600, 128),
        },
    ]
}

/// `new` new keys at the case's S (`usize::MAX`: all but one).
fn n_cached(cfg: &PqConfig, s: usize, new: usize) -> usize {
    let n = cfg.n_quantized(s);
    if new == usize::MAX {
        1
    } else {
        n - new.min(n)
    }
}

#[test]
fn gpu_multi_token_steps_match_cpu_reference() {
    let Some(rt) = runtime() else { return };
    let seed = common::test_seed();
    let mut failures = Vec::new();
    let (mut runs, mut bulk_runs, mut inline_runs) = (0, 0, 0);
    for (ci, case) in cases().iter().enumerate() {
        for (ni, &new) in COUNTS.iter().enumerate() {
            let n0 = n_cached(&case.cfg, case.shape.s, new);
            let s = seed.wrapping_add((ci * 31 + ni) as u64 * 7919);
            let inputs = PqInputs::random(&case.cfg, case.shape, n0, s).expect("inputs");
            let forced: &[Option<usize>] = if new <= BULK_QUANTIZE_MIN {
                &[None, Some(0)]
            } else {
                &[None]
            };
            for &bulk_min in forced {
                for path in PATHS {
                    let what = format!(
                        "{} new={} ({} cached) {path:?} bulk_min={bulk_min:?}",
                        case.name,
                        case.cfg.n_quantized(case.shape.s) - n0,
                        n0
                    );
                    let ex = match execute_with_path(
                        &rt,
                        &case.cfg,
                        &inputs,
                        &KernelChoice::manifest_defaults(),
                        path,
                        bulk_min,
                        0,
                        false,
                    ) {
                        Ok(ex) => ex,
                        Err(e) => {
                            eprintln!("FAIL {what}: {e}");
                            failures.push(what);
                            continue;
                        }
                    };
                    runs += 1;
                    bulk_runs += usize::from(ex.bulk_quantize);
                    inline_runs += usize::from(!ex.bulk_quantize);
                    let report = check(&case.cfg, &inputs, &ex.output);
                    let ok = report.passed() && ex.graph_matches;
                    // more than the minimum: always pq_quant first
                    let bulk_ok = new <= BULK_QUANTIZE_MIN || ex.bulk_quantize;
                    let forced_ok = bulk_min != Some(0) || ex.bulk_quantize;
                    eprintln!(
                        "{} {what}: {} bulk={} graph={} [{report}]",
                        if ok && bulk_ok && forced_ok {
                            "ok  "
                        } else {
                            "FAIL"
                        },
                        ex.select_kernel(),
                        ex.bulk_quantize,
                        if ex.graph_matches {
                            "identical"
                        } else {
                            "DIFFERS"
                        },
                    );
                    if !(ok && bulk_ok && forced_ok) {
                        failures.push(what);
                    }
                }
            }
        }
    }
    eprintln!(
        "{} of {runs} runs passed ({bulk_runs} with pq_quant first, {inline_runs} quantizing in the select kernel)",
        runs - failures.len()
    );
    assert!(failures.is_empty(), "failed: {failures:#?}");
    assert!(bulk_runs > 0 && inline_runs > 0, "both quantize forms ran");
}

/// Every built `pq_quant` variant of each case's key dtype (the vector-load kernel's and
/// the any-layout kernel's, the latter then taken for every key), forced on 7 and 4096
/// new keys, matches the CPU reference by the spec's code check (plain and graph
/// identical): the variants differ in tile sizes, warps and the bf16 centroid split.
#[test]
fn gpu_every_pq_quant_variant_matches_cpu_reference() {
    let Some(rt) = runtime() else { return };
    let seed = common::test_seed();
    let cc = rt.device().cc();
    let mut failures = Vec::new();
    let (mut runs, mut passed) = (0, 0);
    for (ci, case) in cases().iter().enumerate() {
        let qt = match case.cfg.input_dtype {
            DType::F32 => "fp32",
            DType::BF16 => "bf16",
            DType::F16 => "fp16",
        };
        let ids: Vec<String> = [format!("pq_quant.a16.k_{qt}"), format!("pq_quant.k_{qt}")]
            .iter()
            .flat_map(|k| rt.store().variants(k))
            .filter(|v| v.usable_on(cc))
            .map(|v| v.id.clone())
            .collect();
        assert!(ids.len() >= 2, "{}: pq_quant variants {ids:?}", case.name);
        for (ni, new) in [7usize, 4096].into_iter().enumerate() {
            let n0 = n_cached(&case.cfg, case.shape.s, new);
            let s = seed.wrapping_add((ci * 17 + ni) as u64 * 104_729);
            let inputs = PqInputs::random(&case.cfg, case.shape, n0, s).expect("inputs");
            for id in &ids {
                runs += 1;
                let what = format!("{} new={new} {id}", case.name);
                let ex = match execute_with_path(
                    &rt,
                    &case.cfg,
                    &inputs,
                    &quant_choice(&rt, Some(id)),
                    SelectPath::Auto,
                    Some(0),
                    0,
                    false,
                ) {
                    Ok(ex) => ex,
                    Err(e) => {
                        eprintln!("FAIL {what}: {e}");
                        failures.push(what);
                        continue;
                    }
                };
                let report = check(&case.cfg, &inputs, &ex.output);
                let ok = report.passed() && ex.graph_matches && ex.bulk_quantize;
                eprintln!("{} {what}", if ok { "ok  " } else { "FAIL" });
                passed += usize::from(ok);
                if !ok {
                    eprintln!("{report}");
                    failures.push(what);
                }
            }
        }
    }
    eprintln!("{passed} of {runs} variant runs passed");
    assert!(failures.is_empty(), "failed: {failures:#?}");
    assert!(
        runs > 0 && passed == runs,
        "{passed} of {runs} variant runs passed"
    );
}

/// New keys with NaN or infinite coordinates, quantized by `pq_quant` among finite ones:
/// per subvector the lowest code whose distance is not NaN (spec, "Non-finite inputs"),
/// code 0 here (centroids finite: NaN makes every distance NaN, an infinity makes every
/// one +inf), the other subvectors and keys as the reference; the step never faults.
#[test]
fn gpu_bulk_quantize_of_non_finite_keys() {
    let Some(rt) = runtime() else { return };
    let seed = common::test_seed();
    let cfg = PqConfig {
        input_dtype: DType::BF16,
        weight_dtype: DType::BF16,
        ..PqConfig::reference_workload()
    };
    let shape = Shape {
        b: 1,
        h: 8,
        h_kv: 2,
        s: 3000,
        d: 128,
    };
    let new = 200;
    let n0 = cfg.n_quantized(shape.s) - new;
    let mut inputs = PqInputs::random(&cfg, shape, n0, seed).expect("inputs");
    // (kv head, new key t, coordinate, value): subvector 0 of some keys, 1 of others
    let bad = [
        (0, 3, 5, f32::NAN),
        (1, 3, 70, f32::INFINITY),
        (0, 64, 64, f32::NEG_INFINITY),
        (1, 199, 0, f32::NAN),
        (1, 199, 127, f32::INFINITY),
    ];
    for &(g, t, c, v) in &bad {
        let p = cfg.init_offset + n0 + t;
        let off = inputs.key_offset(0, g, p) + c;
        inputs.key[off] = v;
    }
    // the default kernels on both paths, then every built pq_quant variant of bf16 keys
    let mut runs: Vec<(SelectPath, Option<String>)> =
        vec![(SelectPath::Auto, None), (SelectPath::Chunked, None)];
    for k in ["pq_quant.a16.k_bf16", "pq_quant.k_bf16"] {
        for v in rt.store().variants(k) {
            if v.usable_on(rt.device().cc()) {
                runs.push((SelectPath::Auto, Some(v.id.clone())));
            }
        }
    }
    assert!(runs.len() > 3, "pq_quant variants of bf16 keys are built");
    for (path, id) in runs {
        let ex = execute_with_path(
            &rt,
            &cfg,
            &inputs,
            &quant_choice(&rt, id.as_deref()),
            path,
            Some(0),
            0,
            false,
        )
        .expect("the step runs on non-finite keys");
        let path = (path, id);
        assert!(ex.bulk_quantize && ex.graph_matches, "{path:?}");
        let m = cfg.m();
        let n = cfg.n_quantized(shape.s);
        let code = |g: usize, t: usize, mm: usize| ex.output.codes[((n0 + t) * 2 + g) * m + mm];
        for &(g, t, c, _) in &bad {
            assert_eq!(code(g, t, c / 64), 0, "{path:?} g={g} t={t} coordinate {c}");
        }
        assert_eq!(ex.output.codes.len(), n * 2 * m);
        let report = check(&cfg, &inputs, &ex.output);
        assert!(report.passed(), "{path:?}: {report}");
    }
}

/// A graph-mode decode loop whose steps bring 1, 7, 64, 4096 and 3 new keys in turn: the
/// captured graph is updated (or captured anew where the launches change) and every
/// step's codes and selection stay right; the last is checked against the reference.
#[test]
fn gpu_graph_decode_loop_with_varying_new_keys() {
    let Some(rt) = runtime() else { return };
    let seed = common::test_seed();
    let cfg = PqConfig {
        input_dtype: DType::BF16,
        weight_dtype: DType::BF16,
        ..PqConfig::reference_workload()
    };
    let steps = [1usize, 7, 64, 4096, 3];
    let s_end = 9000;
    let shape = Shape {
        b: 1,
        h: 32,
        h_kv: 8,
        s: s_end,
        d: 128,
    };
    let n_end = cfg.n_quantized(s_end);
    let n0 = n_end - steps.iter().sum::<usize>();
    for path in [SelectPath::Auto, SelectPath::Chunked, SelectPath::Split] {
        let inputs = PqInputs::random(&cfg, shape, n0, seed).expect("inputs");
        let stream = rt.device().new_stream().expect("stream");
        let mut ix = GpuIndexer::new(
            rt.clone(),
            stream,
            cfg,
            shape,
            &inputs.centroids,
            None,
            &KernelChoice::manifest_defaults(),
        )
        .expect("indexer");
        ix.set_select_path(path);
        ix.import_codes(&inputs.codes, n0).expect("import");
        let dev = DeviceInputs::upload(ix.stream(), &inputs, &cfg).expect("upload");
        ix.prepare(s_end).expect("buffers");
        ix.poison_outputs().expect("poison");
        let mut s = cfg.init_offset + n0;
        for &k in &steps {
            s += k;
            let info = ix
                .step(dev.query(), dev.key(), s, LaunchMode::Graph)
                .expect("step");
            assert_eq!(
                info.bulk_quantize,
                k > BULK_QUANTIZE_MIN,
                "{path:?} {k} new"
            );
            assert_eq!(ix.n_cached(), cfg.n_quantized(s));
        }
        assert_eq!(s, s_end);
        ix.synchronize().expect("sync");
        let out = ix.download().expect("download");
        let report = check(&cfg, &inputs, &out);
        assert!(report.passed(), "{path:?}: {report}");
    }
}
