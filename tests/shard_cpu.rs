//! Heads sharded over several devices, without a GPU: the head ranges, the `H_kv % G`
//! refusal, `--devices` parsing, and that the CPU reference run shard by shard on the
//! sliced inputs and stitched back gives exactly the whole batch's reference output.

#[macro_use]
mod common;

use std::process::Command;

use tritonrt::pq::shard_plan::{parse_devices, ShardPlan};
use tritonrt::pq::{check, step, Metric, PqConfig, PqInputs, Shape, Size};
use tritonrt::Error;

fn sh(b: usize, h: usize, h_kv: usize, s: usize, d: usize) -> Shape {
    Shape { b, h, h_kv, s, d }
}

#[test]
fn head_ranges_cover_every_head_once_and_keep_each_query_head_with_its_kv_head() {
    for (h, h_kv) in [(32, 32), (32, 8), (16, 4), (8, 2), (64, 8), (4, 4)] {
        for g in (1..=h_kv).filter(|g| h_kv % g == 0) {
            let plan = ShardPlan::new(sh(2, h, h_kv, 100, 64), g).unwrap();
            assert_eq!(plan.devices(), g);
            let ss = plan.shard_shape();
            assert_eq!(
                (ss.h, ss.h_kv, ss.b, ss.s, ss.d),
                (h / g, h_kv / g, 2, 100, 64)
            );
            let mut seen_q = vec![0; h];
            let mut seen_kv = vec![0; h_kv];
            for d in 0..g {
                let (q, kv) = (plan.q_heads(d), plan.kv_heads(d));
                assert_eq!(
                    q,
                    d * h / g..(d + 1) * h / g,
                    "H={h} H_kv={h_kv} G={g} d={d}"
                );
                assert_eq!(kv, d * h_kv / g..(d + 1) * h_kv / g);
                for qh in q.clone() {
                    seen_q[qh] += 1;
                    assert_eq!(plan.shard_of_head(qh), d);
                    // the KV head this query head reads (h / (H / H_kv)) is on its shard
                    let kvh = qh / (h / h_kv);
                    assert!(
                        kv.contains(&kvh),
                        "head {qh} reads KV head {kvh}, not in {kv:?}"
                    );
                }
                for k in kv {
                    seen_kv[k] += 1;
                }
            }
            assert!(seen_q.iter().all(|&c| c == 1), "H={h} H_kv={h_kv} G={g}");
            assert!(seen_kv.iter().all(|&c| c == 1));
        }
    }
}

#[test]
fn kv_heads_not_divisible_by_the_device_count_is_a_clear_error() {
    let e = ShardPlan::new(sh(1, 48, 6, 100, 64), 4).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, Error::Invalid { .. }), "{e:?}");
    for want in ["H_kv = 6", "G = 4", "1, 2, 3, 6"] {
        assert!(msg.contains(want), "{msg:?} lacks {want:?}");
    }
    let e = ShardPlan::new(sh(1, 32, 8, 100, 64), 0).unwrap_err();
    assert!(e.to_string().contains("at least one device"), "{e}");
    let e = ShardPlan::new(sh(1, 32, 6, 100, 64), 2).unwrap_err();
    assert!(e.to_string().contains("divide H = 32"), "{e}");
    // G = 1 is the unsharded indexer
    let p = ShardPlan::new(sh(1, 32, 8, 100, 64), 1).unwrap();
    assert_eq!(p.q_heads(0), 0..32);
    assert_eq!(p.kv_heads(0), 0..8);
}

#[test]
fn device_lists_parse_and_bad_ones_are_named() {
    assert_eq!(parse_devices("0,1").unwrap(), vec![0, 1]);
    assert_eq!(parse_devices("0").unwrap(), vec![0]);
    assert_eq!(parse_devices("0-3").unwrap(), vec![0, 1, 2, 3]);
    assert_eq!(parse_devices(" 2 , 0-1 ").unwrap(), vec![2, 0, 1]);
    assert_eq!(parse_devices("5-5,7").unwrap(), vec![5, 7]);
    for (bad, want) in [
        ("", "empty list"),
        ("  ", "empty list"),
        ("1,", "empty item"),
        (",1", "empty item"),
        ("a", "\"a\""),
        ("0,-1", "not a device ordinal"),
        ("1.5", "not a device ordinal"),
        ("3-1", "runs backwards"),
        ("0,0", "device 0 appears twice"),
        ("0-2,1", "device 1 appears twice"),
    ] {
        let e = parse_devices(bad).unwrap_err().to_string();
        assert!(e.contains(want), "{bad:?}: {e:?} lacks {want:?}");
        assert!(e.contains("devices"), "{e}");
    }
}

/// A config small enough for the CPU reference to run many cases quickly.
fn small_cfg() -> PqConfig {
    PqConfig {
        sink_size: Size::Count(8),
        window_size: Size::Count(8),
        heavy_size: Size::Count(16),
        init_offset: 8,
        pq_group_factor: 2,
        pq_bits: 4,
        ..PqConfig::reference_workload()
    }
}

/// The reference on each shard's sliced inputs, stitched, equals the reference on the
/// whole batch, bit for bit, and passes the spec's check on the whole batch.
fn shard_by_shard_equals_whole(cfg: PqConfig, shape: Shape, n_cached: usize, g: usize, seed: u64) {
    let inputs = PqInputs::random(&cfg, shape, n_cached, seed).unwrap();
    let whole = step(&cfg, &inputs).unwrap();
    let plan = ShardPlan::new(shape, g).unwrap();
    let parts: Vec<_> = (0..g)
        .map(|d| {
            let part = plan.slice_inputs(&cfg, &inputs, d).unwrap();
            assert_eq!(part.shape, plan.shard_shape());
            let out = step(&cfg, &part).unwrap();
            assert_eq!((out.h, out.h_kv), (shape.h / g, shape.h_kv / g));
            // the shard's rows are the whole batch's rows of its query heads
            for b in 0..shape.b {
                for (i, h) in plan.q_heads(d).enumerate() {
                    assert_eq!(
                        out.row(b, i),
                        whole.row(b, h),
                        "{shape} G={g} d={d} b={b} h={h}"
                    );
                }
            }
            out
        })
        .collect();
    let stitched = plan.stitch(&parts).unwrap();
    assert_eq!(stitched, whole, "{shape} G={g} n_cached={n_cached}");
    let report = check(&cfg, &inputs, &stitched);
    assert!(report.passed(), "{shape} G={g}: {report}");
}

#[test]
fn reference_shard_by_shard_stitches_to_the_whole_batch() {
    let seed = common::test_seed();
    let cfg = small_cfg();
    let ip = PqConfig {
        metric: Metric::Ip,
        ..cfg
    };
    let s = 700;
    let one_new = PqInputs::default_n_cached(&cfg, s);
    for (cfg, shape, n_cached, g) in [
        (cfg, sh(1, 8, 8, s, 32), one_new, 2),
        (cfg, sh(2, 16, 4, s, 32), one_new, 2),
        (cfg, sh(2, 16, 4, s, 32), one_new, 4),
        (ip, sh(2, 8, 2, s, 32), one_new, 2),
        (cfg, sh(1, 8, 4, s, 32), one_new - 40, 4), // many new keys quantized
        (cfg, sh(2, 4, 2, 20, 32), 0, 2),           // short path
        (cfg, sh(1, 8, 8, s, 32), one_new, 1),
    ] {
        shard_by_shard_equals_whole(cfg, shape, n_cached, g, seed);
    }
}

#[test]
fn stitch_refuses_parts_that_do_not_fit_the_plan() {
    let cfg = small_cfg();
    let shape = sh(1, 8, 4, 300, 32);
    let inputs = PqInputs::random(&cfg, shape, PqInputs::default_n_cached(&cfg, 300), 1).unwrap();
    let plan = ShardPlan::new(shape, 2).unwrap();
    let parts: Vec<_> = (0..2)
        .map(|d| step(&cfg, &plan.slice_inputs(&cfg, &inputs, d).unwrap()).unwrap())
        .collect();
    let e = plan.stitch(&parts[..1]).unwrap_err().to_string();
    assert!(e.contains("1 parts for a plan over 2 devices"), "{e}");
    let whole = step(&cfg, &inputs).unwrap();
    let e = plan
        .stitch(&[whole.clone(), whole])
        .unwrap_err()
        .to_string();
    assert!(e.contains("shard 0: H is 8, expected 4"), "{e}");
    let e = plan.slice_inputs(&cfg, &inputs, 2).unwrap_err().to_string();
    assert!(e.contains("shard 2 of a plan over 2 devices"), "{e}");
    let other = ShardPlan::new(sh(1, 8, 4, 301, 32), 2).unwrap();
    let e = other
        .slice_inputs(&cfg, &inputs, 0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("but the plan splits"), "{e}");
    let e = plan
        .slice_centroids(&cfg, &inputs.centroids[1..], 0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("pq_centroids"), "{e}");
}

#[test]
fn bench_devices_refuses_bad_lists_and_bad_splits_before_opening_a_gpu() {
    let run = |args: &[&str]| {
        let o = Command::new(env!("CARGO_BIN_EXE_tritonrt"))
            .args(args)
            .output()
            .unwrap();
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let (code, err) = run(&["bench", "--devices", "0,x"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("\"x\" in \"0,x\" is not a device ordinal"),
        "{err}"
    );
    let (code, err) = run(&["bench", "--devices", "0-2", "--workload", "1,32,8,4096,128"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("H_kv = 8") && err.contains("G = 3"), "{err}");
    let (code, err) = run(&["bench", "--devices", "0,1", "--soak", "3"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("cannot be used with"), "{err}");
    let o = Command::new(env!("CARGO_BIN_EXE_tritonrt"))
        .args(["inspect", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&o.stdout);
    assert!(help.contains("--devices"), "{help}");
}
