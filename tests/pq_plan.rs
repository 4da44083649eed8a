//! The GPU step plan on the CPU: `plan_step` is pure, so every branch of the choice
//! between the short path, the chunked select (with or without bulk quantize), `pq_hist`,
//! the split path and the indexed path's three weight fills is checked here without a
//! GPU, with the device facts (SM count, which kernels are built) made up per case.

use tritonrt::pq::plan::{
    bucket_capacity, code_capacity, hist_built_for, index_bucket_bytes, index_built_for, plan_step,
    range_built_for, takes_index, HistFacts, IndexFacts, PlanFacts, RangeFacts, SelectPath,
    StepKind, StepPlan, AUTO_HIST_MIN_KEYS, AUTO_HIST_MIN_ROWS, AUTO_SPLIT_MIN_KEYS,
    BULK_QUANTIZE_MIN, COMPANION_FILL_MAX_BYTES, INDEX_BUCKET_BUDGET_BYTES, SHIPPED_EMIT_TILE,
    SHIPPED_INDEX_TP,
};
use tritonrt::pq::{DType, PqConfig, Shape, Size};
use tritonrt::Error;

/// `pq_emit`'s TILE in these tests.
const TILE: usize = 2048;
/// The H100's SM count.
const H100_SMS: u32 = 132;

/// The reference config: sink = window = heavy = init_offset = 128, M = 2, K = 64
/// (short threshold 321), fp32.
fn rcfg() -> PqConfig {
    PqConfig::reference_workload()
}

/// `rows = b x h` rows (`H_kv = H`, `D = 128`; `S` is the step's).
fn shape(b: usize, h: usize) -> Shape {
    Shape {
        b,
        h,
        h_kv: h,
        s: 0,
        d: 128,
    }
}

/// The practical workloads' shape: B = 1, H = 32, H_kv = 8, D = 128 (`S` is the step's).
fn gqa_shape() -> Shape {
    Shape {
        h_kv: 8,
        ..shape(1, 32)
    }
}

/// `pq_index`'s TP (keys a row gathers; `kernels_triton/pq_index.py`).
const TP: usize = 256;

/// Every histogram kernel built (sm_90: `pq_wfill` too) on `sms` SMs.
fn sm90(sms: u32) -> PlanFacts {
    PlanFacts {
        sm_count: sms,
        hist: Some(HistFacts { emit_tile: TILE }),
        index: Some(IndexFacts {
            wfill: true,
            tp: TP,
            bucket_budget: INDEX_BUCKET_BUDGET_BYTES,
        }),
        bulk_min: BULK_QUANTIZE_MIN,
        chunked: Some(512),
        range: None,
    }
}

/// `pq_index` built without `pq_wfill` (sm_80).
fn sm80(sms: u32) -> PlanFacts {
    PlanFacts {
        index: Some(IndexFacts {
            wfill: false,
            tp: TP,
            bucket_budget: INDEX_BUCKET_BUDGET_BYTES,
        }),
        ..sm90(sms)
    }
}

/// `pq_hist` / split built, no indexed path (e.g. M = 4, or query dtype != weight dtype).
fn no_index() -> PlanFacts {
    PlanFacts {
        index: None,
        ..sm90(H100_SMS)
    }
}

/// No histogram kernel built (`K^M > 4096`); `index` set anyway to show it is ignored.
fn no_hist() -> PlanFacts {
    PlanFacts {
        hist: None,
        ..sm90(H100_SMS)
    }
}

fn plan(
    cfg: &PqConfig,
    sh: Shape,
    s: usize,
    n_old: usize,
    path: SelectPath,
    f: &PlanFacts,
) -> StepPlan {
    plan_step(cfg, &sh, s, n_old, path, f).unwrap()
}

/// The kind of a decode step with `new` new keys at `s`.
fn kind(
    cfg: &PqConfig,
    sh: Shape,
    s: usize,
    new: usize,
    path: SelectPath,
    f: &PlanFacts,
) -> StepKind {
    let n = cfg.n_quantized(s);
    plan(cfg, sh, s, n - new, path, f).kind
}

const ALL_PATHS: [SelectPath; 7] = [
    SelectPath::Auto,
    SelectPath::Chunked,
    SelectPath::Hist,
    SelectPath::Split,
    SelectPath::Index,
    SelectPath::IndexCompanion,
    SelectPath::IndexWfill,
];

#[test]
fn short_path_up_to_the_threshold() {
    let cfg = rcfg();
    let th = cfg.short_threshold(0); // count sizes: the same at every S
    assert_eq!(th, 128 + 128 + 1 + 64);
    for path in ALL_PATHS {
        for s in [1, 100, th - 1, th] {
            for n_old in [0, 5, 1000] {
                let p = plan(&cfg, shape(1, 32), s, n_old, path, &sm90(H100_SMS));
                assert_eq!(p.kind, StepKind::Short, "S={s} {path:?}");
                // the short path quantizes nothing: N_cached stays
                assert_eq!((p.s, p.n_old, p.n, p.total), (s, n_old, n_old, s));
                let i = p.info();
                assert!(i.short && !i.hist && !i.split && !i.index && !i.companion);
                assert_eq!((i.launches, i.total, i.s, i.captured), (1, s, s, false));
            }
        }
        let p = plan(&cfg, shape(1, 32), th + 1, 0, path, &sm90(H100_SMS));
        assert_ne!(p.kind, StepKind::Short);
        assert_eq!((p.n, p.total), (th + 1 - 128, 128 + 128 + 128));
    }
}

#[test]
fn rejects_an_empty_sequence_and_a_state_ahead_of_it() {
    let cfg = rcfg();
    let f = sm90(H100_SMS);
    let e = plan_step(&cfg, &shape(1, 32), 0, 0, SelectPath::Auto, &f).unwrap_err();
    assert!(matches!(e, Error::Invalid { .. }), "{e}");
    let s = 1000;
    let n = cfg.n_quantized(s);
    let e = plan_step(&cfg, &shape(1, 32), s, n + 1, SelectPath::Auto, &f).unwrap_err();
    assert!(e.to_string().contains("ahead of the sequence"), "{e}");
    // exactly caught up: no new key
    let p = plan(&cfg, shape(1, 32), s, n, SelectPath::Chunked, &f);
    assert_eq!(p.kind, StepKind::Chunked);
}

#[test]
fn chunked_bulk_quantizes_more_than_the_minimum_of_new_keys() {
    let cfg = rcfg();
    let s = 32000;
    let n = cfg.n_quantized(s);
    for f in [sm90(H100_SMS), no_index(), no_hist()] {
        for (n_old, bulk) in [
            (n, false),
            (n - 1, false),
            (n - BULK_QUANTIZE_MIN, false),
            (n - BULK_QUANTIZE_MIN - 1, true),
            (0, true),
        ] {
            let p = plan(&cfg, shape(1, 32), s, n_old, SelectPath::Chunked, &f);
            assert_eq!((p.kind, p.bulk_quantize), (StepKind::Chunked, bulk));
            let i = p.info();
            assert_eq!(i.launches, 1 + usize::from(bulk));
            assert_eq!(i.bulk_quantize, bulk);
            assert!(!i.short && !i.hist && !i.split && !i.index && !i.companion);
        }
    }
}

#[test]
fn without_histogram_kernels_every_path_is_chunked() {
    let cfg = rcfg();
    for path in ALL_PATHS {
        for (b, h, s) in [(1, 32, 32000), (4, 32, 131072), (1, 8, 20000)] {
            assert_eq!(
                kind(&cfg, shape(b, h), s, 1, path, &no_hist()),
                StepKind::Chunked,
                "{path:?} B={b} H={h} S={s}"
            );
        }
    }
}

#[test]
fn histogram_path_takes_any_number_of_new_keys_quantized_first_beyond_the_minimum() {
    let cfg = rcfg();
    let s = 32000;
    let n = cfg.n_quantized(s);
    for path in [SelectPath::Hist, SelectPath::Split, SelectPath::Index] {
        for f in [sm90(H100_SMS), no_index()] {
            let one = plan(&cfg, shape(1, 32), s, n - 1, path, &f);
            for new in [
                BULK_QUANTIZE_MIN,
                BULK_QUANTIZE_MIN + 1,
                100,
                4096,
                n - 1,
                n,
            ] {
                let p = plan(&cfg, shape(1, 32), s, n - new, path, &f);
                // the select kernels are the one-key step's, whatever the count
                assert_eq!(p.kind, one.kind, "{path:?} {new} new keys");
                assert!(p.kind.is_hist());
                assert_eq!(p.bulk_quantize, new > BULK_QUANTIZE_MIN, "{path:?} {new}");
                assert_eq!(
                    p.info().launches,
                    one.kind.launches() + usize::from(p.bulk_quantize)
                );
            }
            // a lower minimum moves the threshold, down to bulk for one key
            let f0 = PlanFacts { bulk_min: 0, ..f };
            let p = plan(&cfg, shape(1, 32), s, n - 1, path, &f0);
            assert!(p.bulk_quantize && p.kind == one.kind, "{path:?}");
            assert!(!plan(&cfg, shape(1, 32), s, n, path, &f0).bulk_quantize);
        }
    }
    // a window narrower than the new keys: some new key is a candidate (w0 > n_old),
    // quantized first even below the minimum
    let narrow = PqConfig {
        window_size: Size::Count(4),
        ..rcfg()
    };
    let f = sm90(H100_SMS);
    let f8 = PlanFacts { bulk_min: 8, ..f };
    let p = plan(&narrow, shape(1, 32), s, n - 4, SelectPath::Hist, &f8);
    assert_eq!((p.kind, p.bulk_quantize), (StepKind::Hist, false));
    for path in [
        SelectPath::Hist,
        SelectPath::Split,
        SelectPath::Index,
        SelectPath::Auto,
    ] {
        let p = plan(&narrow, shape(1, 32), s, n - 5, path, &f8);
        assert!(p.kind.is_hist() && p.bulk_quantize, "{path:?}: {p:?}");
    }
    // the chunked select quantizes candidates in its own chunks: no bulk for 5 keys
    let p = plan(&narrow, shape(1, 32), s, n - 5, SelectPath::Chunked, &f8);
    assert_eq!((p.kind, p.bulk_quantize), (StepKind::Chunked, false));
}

#[test]
fn split_for_every_row_of_the_histogram_family() {
    let cfg = rcfg();
    let s = 32000;
    let parts = cfg.n_quantized(s).div_ceil(TILE);
    assert_eq!(parts, 16);
    // Split, and the index paths where no pq_index is built, take split when it applies
    for path in [
        SelectPath::Split,
        SelectPath::Index,
        SelectPath::IndexCompanion,
        SelectPath::IndexWfill,
    ] {
        let k = kind(&cfg, shape(1, 32), s, 1, path, &no_index());
        assert_eq!(k, StepKind::Split { parts }, "{path:?}");
        let i = plan(
            &cfg,
            shape(1, 32),
            s,
            cfg.n_quantized(s) - 1,
            path,
            &no_index(),
        )
        .info();
        assert!(i.hist && i.split && !i.index && !i.companion && i.launches == 2);
    }
    // rows whose heavy picks reach into the sink or the window split too (pq_emit places
    // any row); Hist still never splits
    let sink_past_offset = PqConfig {
        sink_size: Size::Count(256),
        ..rcfg()
    };
    let window_past_offset = PqConfig {
        window_size: Size::Count(100_000),
        ..rcfg()
    };
    let heavy_in_window = PqConfig {
        window_size: Size::Count(800),
        ..rcfg()
    };
    for (c, s) in [
        (sink_past_offset, 32000),
        (window_past_offset, 32000),
        (heavy_in_window, 1000),
    ] {
        assert!(!c.is_short(s));
        for path in [SelectPath::Split, SelectPath::Index, SelectPath::Hist] {
            let want = if path == SelectPath::Hist {
                StepKind::Hist
            } else {
                StepKind::Split {
                    parts: c.n_quantized(s).div_ceil(TILE),
                }
            };
            assert_eq!(
                kind(&c, shape(1, 32), s, 1, path, &no_index()),
                want,
                "{c} S={s} {path:?}"
            );
        }
    }
    // Hist never splits, Chunked never takes the histogram path
    assert_eq!(
        kind(&cfg, shape(1, 32), s, 1, SelectPath::Hist, &sm90(H100_SMS)),
        StepKind::Hist
    );
    assert_eq!(
        kind(
            &cfg,
            shape(1, 32),
            s,
            1,
            SelectPath::Chunked,
            &sm90(H100_SMS)
        ),
        StepKind::Chunked
    );
}

#[test]
fn auto_without_the_indexed_path_by_rows_and_keys() {
    let cfg = rcfg();
    let f = no_index();
    let s_for = |n: usize| n + cfg.init_offset;
    let auto =
        |rows_h: usize, n: usize| kind(&cfg, shape(1, rows_h), s_for(n), 1, SelectPath::Auto, &f);
    let chunked = StepKind::Chunked;
    let split = |n: usize| StepKind::Split {
        parts: n.div_ceil(TILE),
    };
    let few = AUTO_HIST_MIN_ROWS - 1;
    let many = AUTO_HIST_MIN_ROWS;
    // fewer rows than 64: split from 16384 keys
    assert_eq!(auto(32, AUTO_SPLIT_MIN_KEYS), split(AUTO_SPLIT_MIN_KEYS));
    assert_eq!(auto(32, AUTO_SPLIT_MIN_KEYS - 1), chunked);
    assert_eq!(auto(few, 20000), split(20000));
    assert_eq!(auto(few, 200_000), split(200_000));
    // 64 rows and more: pq_hist from 32768 keys
    assert_eq!(auto(many, 20000), chunked);
    assert_eq!(auto(many, AUTO_HIST_MIN_KEYS - 1), chunked);
    assert_eq!(auto(many, AUTO_HIST_MIN_KEYS), StepKind::Hist);
    assert_eq!(auto(128, 131072 - 128), StepKind::Hist);
    // a heavy pick among the sink positions changes nothing: split with few rows,
    // pq_hist with many
    let sink_past_offset = PqConfig {
        sink_size: Size::Count(256),
        ..rcfg()
    };
    assert_eq!(
        kind(
            &sink_past_offset,
            shape(1, 32),
            40000,
            1,
            SelectPath::Auto,
            &f
        ),
        split(40000 - 128)
    );
    assert_eq!(
        kind(
            &sink_past_offset,
            shape(1, 64),
            40000,
            1,
            SelectPath::Auto,
            &f
        ),
        StepKind::Hist
    );
    // catch-up: pq_quant first, then the one-key step's kernels
    let p = plan(
        &cfg,
        shape(1, 32),
        32000,
        cfg.n_quantized(32000) - BULK_QUANTIZE_MIN - 1,
        SelectPath::Auto,
        &f,
    );
    assert_eq!(
        (p.kind, p.bulk_quantize),
        (
            kind(&cfg, shape(1, 32), 32000, 1, SelectPath::Auto, &f),
            true
        )
    );
    // the spec's workloads: reference split, large pq_hist
    let r = Shape::reference();
    assert_eq!(
        kind(&cfg, r, r.s, 1, SelectPath::Auto, &f),
        split(r.s - 128)
    );
    let l = Shape::large();
    assert_eq!(kind(&cfg, l, l.s, 1, SelectPath::Auto, &f), StepKind::Hist);
}

#[test]
fn indexed_path_where_built_and_asked_for() {
    let cfg = rcfg();
    let f = sm90(H100_SMS);
    let (r, l) = (Shape::reference(), Shape::large());
    // Auto and Index: the reference workload is one launch (64 CTAs, 128 000 bytes a
    // row), the large one pq_wfill + pq_index (256 CTAs > 132 SMs)
    for path in [SelectPath::Auto, SelectPath::Index] {
        let p = plan(&cfg, r, r.s, cfg.n_quantized(r.s) - 1, path, &f);
        assert_eq!(p.kind, StepKind::IndexCompanion);
        let i = p.info();
        assert!(i.hist && i.index && i.companion && !i.split && !i.short && i.launches == 1);
        let p = plan(&cfg, l, l.s, cfg.n_quantized(l.s) - 1, path, &f);
        assert_eq!(p.kind, StepKind::IndexWfill);
        let i = p.info();
        assert!(i.hist && i.index && !i.companion && !i.split && i.launches == 2);
        // also below the Auto thresholds of pq_hist / split
        assert!(kind(&cfg, shape(1, 8), 1000, 1, path, &f).is_index());
    }
    // the forced fills
    assert_eq!(
        kind(&cfg, l, l.s, 1, SelectPath::IndexCompanion, &f),
        StepKind::IndexCompanion
    );
    assert_eq!(
        kind(&cfg, r, r.s, 1, SelectPath::IndexWfill, &f),
        StepKind::IndexWfill
    );
    // paths that do not want it
    assert_eq!(kind(&cfg, r, r.s, 1, SelectPath::Hist, &f), StepKind::Hist);
    assert_eq!(
        kind(&cfg, r, r.s, 1, SelectPath::Split, &f),
        StepKind::Split { parts: 16 }
    );
    assert_eq!(
        kind(&cfg, r, r.s, 1, SelectPath::Chunked, &f),
        StepKind::Chunked
    );
    for path in ALL_PATHS {
        assert_eq!(
            path.wants_index(),
            !matches!(
                path,
                SelectPath::Chunked | SelectPath::Hist | SelectPath::Split
            )
        );
    }
}

#[test]
fn companion_fill_by_sm_count_and_row_bytes() {
    let cfg = rcfg();
    let s = 20000;
    for path in [SelectPath::Auto, SelectPath::Index] {
        // every CTA of the launch on an SM of its own: 2 x rows <= SMs
        let k = |h: usize, sms: u32| kind(&cfg, shape(1, h), s, 1, path, &sm90(sms));
        assert_eq!(k(66, 132), StepKind::IndexCompanion);
        assert_eq!(k(67, 132), StepKind::IndexWfill);
        assert_eq!(k(32, 64), StepKind::IndexCompanion);
        assert_eq!(k(32, 63), StepKind::IndexWfill);
        assert_eq!(k(1, 2), StepKind::IndexCompanion);
        assert_eq!(k(1, 1), StepKind::IndexWfill);
        // fp32 weights, a row's at most COMPANION_FILL_MAX_BYTES
        let f = sm90(H100_SMS);
        let at = |c: &PqConfig, s: usize| kind(c, shape(1, 32), s, 1, path, &f);
        let fp32_max = COMPANION_FILL_MAX_BYTES / 4;
        assert_eq!(at(&cfg, fp32_max), StepKind::IndexCompanion);
        assert_eq!(at(&cfg, fp32_max + 1), StepKind::IndexWfill);
        let bf16 = PqConfig {
            input_dtype: DType::BF16,
            weight_dtype: DType::BF16,
            ..rcfg()
        };
        // 16-bit weights: pq_wfill at any row length (the companion fill measured slower)
        assert_eq!(at(&bf16, 4096), StepKind::IndexWfill);
        assert_eq!(at(&bf16, fp32_max), StepKind::IndexWfill);
        assert_eq!(at(&bf16, 2 * fp32_max + 1), StepKind::IndexWfill);
        let fp16_w = PqConfig {
            input_dtype: DType::F16,
            weight_dtype: DType::F16,
            ..rcfg()
        };
        assert_eq!(at(&fp16_w, 4096), StepKind::IndexWfill);
        // sm_80 (no pq_wfill): companions whatever the row's bytes, while they fit the
        // SMs; else each row CTA writes its own row
        let k80 = |h: usize, s: usize| kind(&cfg, shape(1, h), s, 1, path, &sm80(108));
        assert_eq!(k80(54, 200_000), StepKind::IndexCompanion);
        assert_eq!(k80(55, 20000), StepKind::IndexRowFill);
        let p = plan(
            &cfg,
            shape(1, 55),
            s,
            cfg.n_quantized(s) - 1,
            path,
            &sm80(108),
        );
        let i = p.info();
        assert!(i.hist && i.index && !i.companion && !i.split && i.launches == 1);
    }
    // the forced fills on sm_80
    let big = shape(4, 32);
    assert_eq!(
        kind(&cfg, big, s, 1, SelectPath::IndexCompanion, &sm80(108)),
        StepKind::IndexCompanion
    );
    assert_eq!(
        kind(&cfg, shape(1, 8), s, 1, SelectPath::IndexWfill, &sm80(108)),
        StepKind::IndexRowFill
    );
}

#[test]
fn indexed_path_fallbacks() {
    let cfg = rcfg();
    let f = sm90(H100_SMS);
    // catch-up: pq_quant first, then the one-key step's kernels, whatever the path
    for path in ALL_PATHS {
        let r = Shape::reference();
        let p = plan(&cfg, r, 32000, cfg.n_quantized(32000) - 100, path, &f);
        assert_eq!(
            (p.kind, p.bulk_quantize),
            (kind(&cfg, r, 32000, 1, path, &f), true),
            "{path:?}"
        );
    }
    // B*H*S must fit pq_wfill's i32 flat index: 512 rows x 2^22 = 2^31 does not
    let wide = shape(4, 128);
    let s = 1 << 22;
    let n = cfg.n_quantized(s);
    let split = StepKind::Split {
        parts: n.div_ceil(TILE),
    };
    for path in [
        SelectPath::Index,
        SelectPath::IndexCompanion,
        SelectPath::IndexWfill,
        SelectPath::Split,
    ] {
        assert_eq!(kind(&cfg, wide, s, 1, path, &f), split, "{path:?}");
    }
    // Auto falls back to its own rule: 512 rows of 4M keys, pq_hist
    assert_eq!(kind(&cfg, wide, s, 1, SelectPath::Auto, &f), StepKind::Hist);
    // one position less fits an i32 (given a bucket budget for its 17 GB of buckets;
    // the default budget declines them: see bucket_budget_guards_auto)
    let roomy = PlanFacts {
        index: f.index.map(|ix| IndexFacts {
            bucket_budget: usize::MAX,
            ..ix
        }),
        ..f
    };
    assert_eq!(
        kind(&cfg, wide, s - 1, 1, SelectPath::Auto, &roomy),
        StepKind::IndexWfill
    );
    assert_eq!(
        kind(&cfg, wide, s, 1, SelectPath::Auto, &roomy),
        StepKind::Hist
    );
    assert_eq!(
        kind(&cfg, wide, s - 1, 1, SelectPath::Auto, &f),
        StepKind::Hist
    );
    assert_eq!(
        kind(&cfg, wide, s - 1, 1, SelectPath::IndexCompanion, &f),
        StepKind::IndexCompanion
    );
}

#[test]
fn launch_counts_and_flags_of_every_kind() {
    let kinds = [
        (StepKind::Short, 1),
        (StepKind::Chunked, 1),
        (StepKind::Hist, 1),
        (StepKind::Split { parts: 3 }, 2),
        (StepKind::IndexWfill, 2),
        (StepKind::IndexRowFill, 1),
        (StepKind::IndexCompanion, 1),
    ];
    for ((k, launches), bulk) in kinds.into_iter().flat_map(|kl| [(kl, false), (kl, true)]) {
        let p = StepPlan {
            kind: k,
            bulk_quantize: bulk,
            s: 1000,
            n_old: 871,
            n: 872,
            total: 384,
        };
        let i = p.info();
        assert_eq!(i.launches, launches + usize::from(bulk), "{k:?}");
        assert_eq!(i.bulk_quantize, bulk);
        assert_eq!(i.kind, k);
        assert_eq!((i.s, i.total, i.captured), (1000, 384, false));
        assert_eq!(i.short, k == StepKind::Short);
        assert_eq!(i.hist, !matches!(k, StepKind::Short | StepKind::Chunked));
        assert_eq!(i.split, matches!(k, StepKind::Split { .. }));
        assert_eq!(
            i.index,
            matches!(
                k,
                StepKind::IndexWfill | StepKind::IndexRowFill | StepKind::IndexCompanion
            )
        );
        assert_eq!(i.companion, k == StepKind::IndexCompanion);
    }
}

/// Heavy sizes above the chunked kernel's largest top-k width (512): the histogram family
/// serves them (any heavy size); a step that needs the chunked path is refused, naming
/// heavy_size, the value and why the chunked path was needed.
#[test]
fn heavy_above_512_takes_the_histogram_family_or_is_refused() {
    let big = |heavy_size, pq_bits| PqConfig {
        heavy_size: Size::Count(heavy_size),
        pq_bits,
        input_dtype: tritonrt::pq::DType::BF16,
        weight_dtype: tritonrt::pq::DType::BF16,
        ..PqConfig::reference_workload()
    };
    let sh = gqa_shape();
    let facts = PlanFacts {
        chunked: None,
        ..sm90(H100_SMS)
    };
    let s = 32768;
    for heavy in [513, 1024, 3020, 8000] {
        let cfg = big(heavy, 6);
        let n = cfg.n_quantized(s);
        for new in [1usize, 4096] {
            // more picks than pq_index gathers (TP): Auto takes split
            let p = plan(&cfg, sh, s, n - new, SelectPath::Auto, &facts);
            assert!(
                matches!(p.kind, StepKind::Split { .. }),
                "heavy {heavy}, {new} new: {:?}",
                p.kind
            );
            assert_eq!(p.total, 128 + heavy + 128);
            // asked for by name, the indexed path still runs (its rows fall back in-kernel)
            let p = plan(&cfg, sh, s, n - new, SelectPath::IndexWfill, &facts);
            assert_eq!(p.kind, StepKind::IndexWfill);
        }
        // 64 rows or more (B = 2): split too
        let sh2 = Shape { b: 2, ..sh };
        let p = plan(&cfg, sh2, s, n - 1, SelectPath::Auto, &facts);
        assert!(
            matches!(p.kind, StepKind::Split { .. }),
            "heavy {heavy}, 64 rows: {:?}",
            p.kind
        );
        // a heavy pick among the sink positions (init_offset < sink): split too
        let io = PqConfig {
            init_offset: 64,
            ..cfg
        };
        let p = plan(&io, sh, s, io.n_quantized(s) - 1, SelectPath::Auto, &facts);
        assert!(
            matches!(p.kind, StepKind::Split { .. }),
            "heavy {heavy}, init_offset < sink: {:?}",
            p.kind
        );
        for path in [SelectPath::Hist, SelectPath::Split] {
            let k = plan(&cfg, sh, s, n - 1, path, &facts).kind;
            assert!(k.is_hist() && k != StepKind::Chunked, "{path:?}: {k:?}");
        }
        // the chunked path asked for, or needed (K^M = 65536 > 4096): refused
        let e = plan_step(&cfg, &sh, s, n - 1, SelectPath::Chunked, &facts)
            .expect_err("chunked without its kernel")
            .to_string();
        assert!(
            e.contains("heavy_size") && e.contains(&heavy.to_string()) && e.contains("chunked"),
            "{e}"
        );
        let cfg8 = big(heavy, 8);
        let e = plan_step(
            &cfg8,
            &sh,
            s,
            cfg8.n_quantized(s) - 1,
            SelectPath::Auto,
            &no_hist_chunkless(),
        )
        .expect_err("K^M > 4096 without the chunked or radix-select kernels")
        .to_string();
        assert!(
            e.contains("heavy_size") && e.contains("radix-select"),
            "{e}"
        );
    }
}

/// Up to TP / 2 heavy picks the indexed path stays Auto's choice; above, split.
#[test]
fn heavy_up_to_tp_stays_indexed() {
    let sh = gqa_shape();
    for heavy in [100, TP / 2] {
        let cfg = PqConfig {
            heavy_size: Size::Count(heavy),
            ..PqConfig::reference_workload()
        };
        let s = 32768;
        let k = plan(
            &cfg,
            sh,
            s,
            cfg.n_quantized(s) - 1,
            SelectPath::Auto,
            &sm90(H100_SMS),
        )
        .kind;
        assert!(k.is_index(), "heavy {heavy}: {k:?}");
    }
    let cfg = PqConfig {
        heavy_size: Size::Count(TP / 2 + 1),
        ..PqConfig::reference_workload()
    };
    let k = plan(
        &cfg,
        sh,
        32768,
        cfg.n_quantized(32768) - 1,
        SelectPath::Auto,
        &sm90(H100_SMS),
    )
    .kind;
    assert!(
        matches!(k, StepKind::Split { .. }),
        "heavy TP / 2 + 1: {k:?}"
    );
}

/// No histogram kernel and no chunked kernel (`K^M > 4096`, heavy above 512).
fn no_hist_chunkless() -> PlanFacts {
    PlanFacts {
        hist: None,
        chunked: None,
        ..sm90(H100_SMS)
    }
}

/// `takes_index` is `plan_step`'s own rule: over configs, shapes, lengths, new-key counts,
/// paths and kernel sets, it says "indexed" exactly when the plan's kind is an `Index*`
/// (the indexer allocates the buckets on that answer).
#[test]
fn takes_index_is_the_plans_choice() {
    let bf16 = |heavy, m, bits| PqConfig {
        heavy_size: Size::Count(heavy),
        pq_group_factor: m,
        pq_bits: bits,
        input_dtype: DType::BF16,
        weight_dtype: DType::BF16,
        ..rcfg()
    };
    let cfgs = [
        rcfg(),
        bf16(128, 2, 6),
        bf16(3020, 2, 6),
        bf16(512, 2, 6),
        bf16(128, 2, 8),
        bf16(128, 4, 8),
        PqConfig {
            weight_dtype: DType::F32,
            ..bf16(128, 2, 6)
        },
    ];
    let shapes = [shape(1, 32), shape(4, 32), shape(4, 128), gqa_shape()];
    let mut seen = [false; 2];
    for cfg in cfgs {
        for f in [
            PlanFacts::shipped_sm90(&cfg, 1 << 20, H100_SMS),
            sm80(108),
            no_index(),
            no_hist(),
        ] {
            for sh in shapes {
                for s in [300, 1000, 32768, 131072, 1 << 22] {
                    for path in ALL_PATHS {
                        let t = takes_index(&cfg, &sh, s, path, &f);
                        let n = cfg.n_quantized(s);
                        for n_old in [n.saturating_sub(1), n.saturating_sub(5000)] {
                            match plan_step(&cfg, &sh, s, n_old, path, &f) {
                                Ok(p) => assert_eq!(
                                    t,
                                    p.kind.is_index(),
                                    "{cfg} {sh} S={s} {path:?} {f:?}"
                                ),
                                Err(_) => assert!(!t, "{cfg} {sh} S={s} {path:?}"),
                            }
                        }
                        seen[usize::from(t)] = true;
                    }
                }
            }
        }
    }
    assert_eq!(seen, [true, true], "both answers covered");
}

/// The configs and shapes whose steps never take the indexed path, so no buckets:
/// more heavy picks than TP / 2 under Auto (every practical workload), `K^M > 4096`,
/// `M > 2`, query dtype != weight dtype (the shipped facts build no `pq_index` for these),
/// `B*H*S >= 2^31`, the short path, the paths that do not want it.
#[test]
fn no_indexed_step_for_configs_the_plan_never_indexes() {
    let practical = |heavy, m, bits| PqConfig {
        heavy_size: Size::Count(heavy),
        pq_group_factor: m,
        pq_bits: bits,
        input_dtype: DType::BF16,
        weight_dtype: DType::BF16,
        ..rcfg()
    };
    let p_shape = gqa_shape();
    let l_shape = Shape { b: 4, ..p_shape };
    let on = |cfg: &PqConfig, sh: &Shape, s, path| {
        takes_index(
            cfg,
            sh,
            s,
            path,
            &PlanFacts::shipped_sm90(cfg, 1 << 20, H100_SMS),
        )
    };
    // the practical large workload: 12851 (spec) or 12083 heavy picks against TP / 2 = 128
    for heavy in [12851, 12083] {
        assert!(!on(
            &practical(heavy, 2, 6),
            &l_shape,
            131072,
            SelectPath::Auto
        ));
        // asked for by name it still runs indexed (its rows fall back in-kernel)
        assert!(on(
            &practical(heavy, 2, 6),
            &l_shape,
            131072,
            SelectPath::IndexWfill
        ));
    }
    for heavy in [3020, 129, 512, 2048, 8192] {
        assert!(!on(
            &practical(heavy, 2, 6),
            &p_shape,
            32768,
            SelectPath::Auto
        ));
    }
    assert!(on(&practical(128, 2, 6), &p_shape, 32768, SelectPath::Auto));
    // no pq_index for the config: K^M = 65536, M = 4, bf16 query with fp32 weights
    for cfg in [
        practical(128, 2, 8),
        practical(128, 4, 8),
        practical(128, 4, 3),
        PqConfig {
            weight_dtype: DType::F32,
            ..practical(128, 2, 6)
        },
    ] {
        assert!(!index_built_for(&cfg), "{cfg}");
        assert!(PlanFacts::shipped_sm90(&cfg, 1 << 20, H100_SMS)
            .index
            .is_none());
        for path in ALL_PATHS {
            assert!(!on(&cfg, &p_shape, 32768, path), "{cfg} {path:?}");
        }
    }
    assert!(hist_built_for(&practical(128, 4, 3)));
    assert!(!hist_built_for(&practical(128, 2, 8)));
    // B*H*S >= 2^31 (512 rows x 2^22), the short path, paths that do not want it
    let cfg = rcfg();
    assert!(!on(&cfg, &shape(4, 128), 1 << 22, SelectPath::Auto));
    assert!(on(
        &cfg,
        &shape(4, 128),
        (1 << 22) - 1,
        SelectPath::IndexWfill
    ));
    assert!(!on(
        &cfg,
        &shape(1, 32),
        cfg.short_threshold(1 << 20),
        SelectPath::Auto
    ));
    assert!(on(
        &cfg,
        &shape(1, 32),
        cfg.short_threshold(1 << 20) + 1,
        SelectPath::Auto
    ));
    for path in [SelectPath::Chunked, SelectPath::Hist, SelectPath::Split] {
        assert!(!on(&cfg, &Shape::reference(), 32000, path), "{path:?}");
    }
    assert!(!takes_index(
        &cfg,
        &shape(1, 32),
        0,
        SelectPath::Auto,
        &sm90(H100_SMS)
    ));
}

/// Auto declines the indexed path when its buckets would exceed the budget (256 MiB by
/// default): the large workload (160 MiB) keeps it, a batch of 7 at S = 131072 does not
/// (pq_hist instead: at least 64 rows of 32768 keys); forced index paths ignore it.
#[test]
fn bucket_budget_guards_auto() {
    assert_eq!(INDEX_BUCKET_BUDGET_BYTES, 256 << 20);
    assert_eq!(code_capacity(130944), 130944);
    assert_eq!(code_capacity(130943), 130944);
    assert_eq!(code_capacity(1), 16);
    assert_eq!(bucket_capacity(130944), 80);
    assert_eq!(bucket_capacity(31872), 32);
    assert_eq!(index_bucket_bytes(128, 130944), 167_772_160);
    let cfg = rcfg();
    let f = sm90(H100_SMS);
    let s = 131072;
    let at = |b: usize, f: &PlanFacts, path| kind(&cfg, shape(b, 32), s, 1, path, f);
    assert_eq!(at(4, &f, SelectPath::Auto), StepKind::IndexWfill);
    // 192 rows: 251 658 240 bytes, within; 224 rows: 293 601 280, over
    assert_eq!(index_bucket_bytes(192, 130944), 251_658_240);
    assert_eq!(at(6, &f, SelectPath::Auto), StepKind::IndexWfill);
    assert_eq!(index_bucket_bytes(224, 130944), 293_601_280);
    assert_eq!(at(7, &f, SelectPath::Auto), StepKind::Hist);
    assert_eq!(at(7, &f, SelectPath::Index), StepKind::IndexWfill);
    assert_eq!(
        at(7, &f, SelectPath::IndexCompanion),
        StepKind::IndexCompanion
    );
    // a budget one byte short of the large workload's buckets
    let tight = PlanFacts {
        index: f.index.map(|ix| IndexFacts {
            bucket_budget: 167_772_159,
            ..ix
        }),
        ..f
    };
    assert_eq!(at(4, &tight, SelectPath::Auto), StepKind::Hist);
    assert!(!takes_index(
        &cfg,
        &shape(4, 32),
        s,
        SelectPath::Auto,
        &tight
    ));
    assert_eq!(at(4, &tight, SelectPath::IndexWfill), StepKind::IndexWfill);
    // the reference workload needs 16.8 MB
    assert_eq!(index_bucket_bytes(32, code_capacity(31872)), 16_777_216);
    assert_eq!(
        kind(&cfg, Shape::reference(), 32000, 1, SelectPath::Auto, &tight),
        StepKind::IndexCompanion
    );
}

#[test]
fn step_kind_names_and_shipped_facts() {
    let kinds = [
        (StepKind::Short, "short"),
        (StepKind::Chunked, "chunked"),
        (StepKind::Hist, "hist"),
        (StepKind::Split { parts: 8 }, "split"),
        (StepKind::IndexWfill, "index-wfill"),
        (StepKind::IndexRowFill, "index-rowfill"),
        (StepKind::IndexCompanion, "index-companion"),
    ];
    for (k, name) in kinds {
        assert_eq!(k.name(), name);
    }
    let f = PlanFacts::shipped_sm90(&rcfg(), 1 << 20, H100_SMS);
    assert_eq!(f.sm_count, H100_SMS);
    assert_eq!(f.hist.map(|h| h.emit_tile), Some(SHIPPED_EMIT_TILE));
    let ix = f.index.expect("pq_index for the reference config");
    assert!(ix.wfill && ix.tp == SHIPPED_INDEX_TP && ix.bucket_budget == INDEX_BUCKET_BUDGET_BYTES);
    assert!(f.chunked == Some(128) && f.bulk_min == BULK_QUANTIZE_MIN);
    let big = PqConfig {
        heavy_size: Size::Count(513),
        ..rcfg()
    };
    assert!(PlanFacts::shipped_sm90(&big, 1 << 20, H100_SMS)
        .chunked
        .is_none());
}

/// `K^M > 4096` with the radix-select kernels built (no combination histogram), the
/// chunked kernel as `chunked` says.
fn radix(chunked: bool) -> PlanFacts {
    PlanFacts {
        hist: None,
        index: None,
        chunked: chunked.then_some(512),
        range: Some(RangeFacts { emit_tile: TILE }),
        ..sm90(H100_SMS)
    }
}

/// The practical configs the combination histogram cannot take ((M, bits) = (2, 8) and
/// (4, 8), heavy 3020 at S = 32768) run the radix-select split path, whatever the path
/// asked for but chunked; its emit grid follows the keys.
#[test]
fn many_combinations_take_the_radix_select() {
    let sh = gqa_shape();
    let s = 32768;
    for (m, bits) in [(2, 8), (4, 8), (3, 5)] {
        for heavy in [1, 128, 512, 3020, 30000] {
            let cfg = PqConfig {
                heavy_size: Size::Count(heavy),
                pq_group_factor: m,
                pq_bits: bits,
                ..PqConfig::reference_workload()
            };
            let n = cfg.n_quantized(s);
            for path in ALL_PATHS {
                let chunked = heavy <= 512;
                let r = plan_step(&cfg, &sh, s, n - 1, path, &radix(chunked));
                if path == SelectPath::Chunked {
                    match r {
                        Ok(p) => assert!(chunked && p.kind == StepKind::Chunked, "{p:?}"),
                        Err(e) => assert!(!chunked && e.to_string().contains("heavy_size"), "{e}"),
                    }
                    continue;
                }
                let p =
                    r.unwrap_or_else(|e| panic!("M={m} bits={bits} heavy {heavy} {path:?}: {e}"));
                assert_eq!(
                    p.kind,
                    StepKind::Range {
                        parts: n.div_ceil(TILE),
                    },
                    "M={m} bits={bits} heavy {heavy} {path:?}"
                );
                assert_eq!(p.info().launches, 2, "rsel, emit");
                assert!(p.info().range && p.info().hist && !p.info().split);
                // one new key, not a candidate: quantized inside pq_rsel
                assert!(!p.bulk_quantize);
                // 4096 new keys, some of them candidates: pq_quant first
                assert!(plan(&cfg, sh, s, n - 4096, path, &radix(chunked)).bulk_quantize);
                // two new keys, none a candidate, with the bulk minimum raised: still
                // pq_quant first (the radix path quantizes one new key at most)
                let f = PlanFacts {
                    bulk_min: 100,
                    ..radix(chunked)
                };
                assert!(plan(&cfg, sh, s, n - 2, path, &f).bulk_quantize);
            }
        }
    }
}

/// Rows whose heavy picks reach into the sink (init_offset < sink) or the window (fewer
/// candidates than heavy) take the radix-select path too, whatever the heavy size, and
/// so do configs with M > 4; only an explicit chunked request without a chunked kernel
/// for the heavy size is refused, naming heavy_size.
#[test]
fn radix_select_serves_every_row_and_m_above_4() {
    let sh = shape(1, 8);
    let cfg = PqConfig {
        heavy_size: Size::Count(600),
        sink_size: Size::Count(256), // more sink positions than init_offset (128)
        pq_bits: 8,
        ..PqConfig::reference_workload()
    };
    let s = 8192;
    let n = cfg.n_quantized(s);
    for c in [
        cfg,
        // fewer candidates than heavy: S - window - init_offset = 2000 < 3000
        PqConfig {
            heavy_size: Size::Count(3000),
            window_size: Size::Count(s - 2000 - 128),
            ..cfg
        },
        // M = 8, bits 4 (K^M = 2^32) and M = 8, bits 1 (K^M = 256, but M > 4)
        PqConfig {
            pq_group_factor: 8,
            pq_bits: 4,
            ..cfg
        },
        PqConfig {
            pq_group_factor: 8,
            pq_bits: 1,
            ..cfg
        },
    ] {
        assert!(range_built_for(&c) && !hist_built_for(&c));
        let p = plan(&c, sh, s, n - 1, SelectPath::Auto, &radix(false));
        assert!(matches!(p.kind, StepKind::Range { .. }), "{:?}", p.kind);
        assert!(!p.bulk_quantize);
    }
    let e = plan_step(&cfg, &sh, s, n - 1, SelectPath::Chunked, &radix(false))
        .expect_err("chunked asked for without a kernel for heavy 600")
        .to_string();
    assert!(e.contains("heavy_size") && e.contains("600"), "{e}");
}
