//! The indexer's device bytes and the bench matrix on the CPU: `state_bytes_for` (pure)
//! at the workloads, before and after the indexed path's buckets became
//! plan-driven; the matrix's rows, heavy sizes, shapes and the plan each row gets on an
//! H100 with the shipped kernels; the shipped kernel sizes those use, against
//! `ptx_cache/manifest.json`.

use tritonrt::pq::matrix::{
    bench_matrix, practical_heavy, practical_large_heavy, select_rows, HEAVY_SWEEP,
    PRACTICAL_LARGE_SHAPE, PRACTICAL_SHAPE,
};
use tritonrt::pq::memory::{state_bytes_for, SelectSizes, StateBytes, SHIPPED_SELECT_CHUNK};
use tritonrt::pq::plan::{
    plan_step, PlanFacts, SelectPath, StepKind, SHIPPED_EMIT_TILE, SHIPPED_INDEX_TP,
};
use tritonrt::pq::{DType, Metric, PqConfig, Shape, Size, Workload};

/// The H100's SM count.
const H100_SMS: u32 = 132;

/// `state_bytes_for` of `cfg` at `shape` (its S) under `path`, shipped sm_90 kernels.
fn predicted(cfg: &PqConfig, shape: &Shape, path: SelectPath) -> StateBytes {
    state_bytes_for(
        cfg,
        shape,
        shape.s,
        path,
        &PlanFacts::shipped_sm90(cfg, shape.s, H100_SMS),
        SelectSizes::shipped(cfg, shape.s),
    )
}

fn practical_large(heavy: usize) -> PqConfig {
    tritonrt::pq::matrix::practical_config(2, 6, heavy)
}

/// The target: at most 64 MB per layer at the practical large workload (B=4 H=32
/// H_kv=8 S=131072 D=128 bf16, M=2 bits=6). Before: Auto allocated the indexed path's
/// buckets (168 MB) and counts though no step of this config takes that path (12851 or
/// 12083 heavy picks against TP / 2 = 128); the forced index path still allocates what
/// Auto used to.
#[test]
fn practical_large_state_fits_64_mb() {
    let sh = PRACTICAL_LARGE_SHAPE;
    let (rows, n): (usize, usize) = (128, 131072 - 128);
    for heavy in [12851usize, 12083] {
        let cfg = practical_large(heavy);
        let after = predicted(&cfg, &sh, SelectPath::Auto);
        // every group, from the buffers' shapes
        // centroids, phi, pq_quant's bf16 split of them and their norms
        let codebook = 4 * 8 * 2 * 64 * 64 * 4 + 4 + 4 * 8 * 2 * 64 * (3 * 64 * 2 + 4);
        let codes = 4 * 8 * 2 * n + 4;
        let select = rows * 4 + rows * 2 * 64 * 4; // counters, one lookup table per row
        let hist = rows * 4096 * 4
            + rows * 4
            + rows * 2 * 64 * 4
            + rows * 2 * 4
            + rows * 4
            + 4
            + rows * 4096 // the combinations' classes
            + rows * n.div_ceil(4096) * 8;
        let outputs = rows * 8 + rows * (128 + heavy + 128) * 8 + rows * 131072 * 2;
        assert_eq!(
            after,
            StateBytes {
                codebook,
                codes,
                select,
                hist,
                index: 0,
                buckets: 0,
                outputs,
            },
            "heavy {heavy}"
        );
        let before = predicted(&cfg, &sh, SelectPath::IndexWfill);
        let index = rows * 4096 * 4 + rows * 4 + rows * 256 * 4 + rows * 4;
        let buckets = rows * 4096 * 80 * 4;
        assert_eq!(buckets, 167_772_160);
        assert_eq!(
            before,
            StateBytes {
                index,
                buckets,
                ..after
            }
        );
        assert!(after.total() <= 64_000_000, "{}", after.total());
        println!(
            "practical large, heavy {heavy}: before {} bytes ({} without outputs), after {} bytes ({} without outputs); {after:?}",
            before.total(),
            before.state(),
            after.total(),
            after.state()
        );
    }
    assert_eq!(
        predicted(&practical_large(12851), &sh, SelectPath::Auto).total(),
        60_783_116
    );
    assert_eq!(
        predicted(&practical_large(12851), &sh, SelectPath::Auto).state(),
        13_806_092
    );
    assert_eq!(
        predicted(&practical_large(12851), &sh, SelectPath::IndexWfill).total(),
        230_784_524
    );
    assert_eq!(
        predicted(&practical_large(12083), &sh, SelectPath::Auto).total(),
        59_996_684
    );
}

/// The reference and large workloads keep their buckets (Auto takes the indexed path
/// there); the paths that never index hold none.
#[test]
fn reference_and_large_keep_their_buckets() {
    for (w, capc) in [(Workload::reference(), 32usize), (Workload::large(), 80)] {
        let (cfg, sh) = (w.config(), w.shape());
        let rows = sh.b * sh.h;
        let auto = predicted(&cfg, &sh, SelectPath::Auto);
        assert_eq!(auto.buckets, rows * 4096 * capc * 4, "{}", w.name);
        assert_eq!(auto.index, rows * (4096 + 1 + 256 + 1) * 4);
        for path in [SelectPath::Hist, SelectPath::Split, SelectPath::Chunked] {
            let p = predicted(&cfg, &sh, path);
            assert_eq!((p.buckets, p.index), (0, 0), "{} {path:?}", w.name);
            assert_eq!(p.total() + auto.buckets + auto.index, auto.total());
        }
        println!("{}: {} bytes, {auto:?}", w.name, auto.total());
    }
    // the large workload: 128 rows, cap 130944: 168 MB of buckets
    let l = predicted(
        &Workload::large().config(),
        &Workload::large().shape(),
        SelectPath::Auto,
    );
    assert_eq!(l.buckets, 167_772_160);
    // the chunked scratch where pq_select is built (reference: 4 CTAs per row)
    let r = Workload::reference();
    let p = predicted(&r.config(), &r.shape(), SelectPath::Auto);
    let ctas = 32 * 31872usize.div_ceil(SHIPPED_SELECT_CHUNK);
    assert_eq!(
        p.select,
        32 * 4 + ctas * 2 * 64 * 4 + ctas * 256 * 8 + ctas * 128 * 8
    );
    // ip: phi per (b, g, m); short steps: outputs and creation-time buffers only
    let ip = PqConfig {
        metric: Metric::Ip,
        ..r.config()
    };
    let sh = r.shape();
    let e = predicted(&r.config(), &sh, SelectPath::Auto).codebook;
    // fp32 keys: the centroids' norms and one unwritten element of bf16 split (only the
    // bf16-key builds of pq_quant read the split)
    let norms = 32 * 2 * 64 * 4;
    assert_eq!(e, 32 * 2 * 64 * 64 * 4 + 4 + norms + 2);
    assert_eq!(
        predicted(&ip, &sh, SelectPath::Auto).codebook,
        32 * 2 * 64 * 65 * 4 + 32 * 2 * 4 + norms + 2
    );
    let bf16 = PqConfig {
        input_dtype: tritonrt::pq::DType::BF16,
        weight_dtype: tritonrt::pq::DType::BF16,
        ..r.config()
    };
    assert_eq!(
        predicted(&bf16, &sh, SelectPath::Auto).codebook,
        32 * 2 * 64 * 64 * 4 + 4 + norms + 32 * 2 * 3 * 64 * 64 * 2
    );
    let short = predicted(&r.config(), &Shape { s: 300, ..sh }, SelectPath::Auto);
    assert_eq!((short.buckets, short.index, short.codes), (0, 0, 4));
    assert_eq!(short.outputs, 32 * 8 + 32 * 300 * 8 + 32 * 300 * 4);
}

#[test]
fn matrix_rows_shapes_and_heavy_sizes() {
    assert_eq!(practical_heavy(32768), 3020);
    assert_eq!(practical_heavy(131072), 12083);
    assert_eq!(practical_large_heavy(131072), 12851);
    assert_eq!(practical_large_heavy(32768), 3020);
    // floor(0.0921875 S), 0.0921875 = 0.1 - 256/32768 exactly
    assert_eq!(0.1f64 - 256.0 / 32768.0, 0.0921875);
    for s in [1usize, 4096, 32000, 32768, 65536, 131072, 1 << 20] {
        assert_eq!(practical_heavy(s), (0.0921875 * s as f64).floor() as usize);
    }
    let rows = bench_matrix();
    let names: Vec<&str> = rows.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "practical-m2b6",
            "practical-m2b8",
            "practical-m4b8",
            "practical-large",
            "practical-large-ratio",
            "reference",
            "large",
            "heavy-128",
            "heavy-512",
            "heavy-2048",
            "heavy-8192",
        ]
    );
    let p = Shape {
        b: 1,
        h: 32,
        h_kv: 8,
        s: 32768,
        d: 128,
    };
    assert_eq!(PRACTICAL_SHAPE, p);
    assert_eq!(
        PRACTICAL_LARGE_SHAPE,
        Shape {
            b: 4,
            s: 131072,
            ..p
        }
    );
    let by = |n: &str| rows.iter().find(|r| r.name == n).unwrap();
    for (name, m, bits) in [
        ("practical-m2b6", 2, 6),
        ("practical-m2b8", 2, 8),
        ("practical-m4b8", 4, 8),
    ] {
        let r = by(name);
        assert_eq!(r.shape, p);
        assert_eq!(
            (r.cfg.m(), r.cfg.pq_bits, r.cfg.heavy_size),
            (m, bits, Size::Count(3020))
        );
    }
    assert_eq!(by("practical-large").cfg.heavy_size, Size::Count(12851));
    let ratio = by("practical-large-ratio").cfg;
    assert_eq!(ratio.heavy_size, Size::Ratio(0.0921875));
    assert_eq!(ratio.heavy_at(PRACTICAL_LARGE_SHAPE.s), 12083);
    assert_eq!(ratio.heavy_at(32768), 3020);
    for n in ["practical-large", "practical-large-ratio"] {
        assert_eq!(by(n).shape, PRACTICAL_LARGE_SHAPE);
        assert_eq!((by(n).cfg.m(), by(n).cfg.pq_bits), (2, 6));
    }
    for (i, heavy) in HEAVY_SWEEP.into_iter().enumerate() {
        let r = &rows[7 + i];
        assert_eq!(r.name, format!("heavy-{heavy}"));
        assert_eq!(
            (r.shape, r.cfg.heavy_size, r.cfg.m(), r.cfg.pq_bits),
            (p, Size::Count(heavy), 2, 6)
        );
    }
    for r in &rows {
        let c = r.cfg;
        c.validate(&r.shape).unwrap();
        assert_eq!(c.metric, Metric::Euclidean, "{}", r.name);
        let (io, sink, win) = (c.init_offset, c.sink_size, c.window_size);
        assert_eq!(
            (io, sink, win),
            (128, Size::Count(128), Size::Count(128)),
            "{}",
            r.name
        );
        if r.name == "reference" || r.name == "large" {
            assert_eq!((c.input_dtype, c.weight_dtype), (DType::F32, DType::F32));
            assert_eq!(c.heavy_size, Size::Count(128));
            assert_eq!(r.shape.h_kv, 32);
        } else {
            assert_eq!((c.input_dtype, c.weight_dtype), (DType::BF16, DType::BF16));
        }
    }
    assert_eq!(by("reference").shape, Shape::reference());
    assert_eq!(by("large").shape, Shape::large());
    // selection by name keeps matrix order; unknown names list the known ones
    let sel = select_rows(&["large".into(), "practical-m2b6".into()]).unwrap();
    assert_eq!(sel.len(), 2);
    assert_eq!(sel[0].name, "practical-m2b6");
    assert_eq!(select_rows(&[]).unwrap().len(), rows.len());
    let e = select_rows(&["nope".into()]).unwrap_err().to_string();
    assert!(
        e.contains("nope") && e.contains("practical-large-ratio"),
        "{e}"
    );
}

/// What each row plans on an H100 with the shipped kernels: the (2, 8) and (4, 8)
/// practical rows take the radix-select split path (`K^M > 4096`), the others plan as
/// Auto would, and only the rows whose steps take the indexed path hold buckets.
#[test]
fn matrix_plans_on_an_h100() {
    for r in bench_matrix() {
        let (cfg, sh) = (r.cfg, r.shape);
        let f = PlanFacts::shipped_sm90(&cfg, sh.s, H100_SMS);
        let n = cfg.n_quantized(sh.s);
        let plan = plan_step(&cfg, &sh, sh.s, n - 1, SelectPath::Auto, &f);
        let bytes = predicted(&cfg, &sh, SelectPath::Auto);
        match r.name.as_str() {
            "practical-m2b8" | "practical-m4b8" => assert!(
                matches!(plan.unwrap().kind, StepKind::Range { .. }),
                "{}",
                r.name
            ),
            "reference" => assert_eq!(plan.unwrap().kind, StepKind::IndexCompanion),
            "large" => assert_eq!(plan.unwrap().kind, StepKind::IndexWfill),
            // bf16 weights: pq_wfill
            "heavy-128" => assert_eq!(plan.unwrap().kind, StepKind::IndexWfill),
            _ => assert!(
                matches!(plan.unwrap().kind, StepKind::Split { .. }),
                "{}",
                r.name
            ),
        }
        let indexed = matches!(r.name.as_str(), "reference" | "large" | "heavy-128");
        assert_eq!(bytes.buckets > 0, indexed, "{}", r.name);
        println!("{:<22} {:>11} bytes {bytes:?}", r.name, bytes.total());
    }
}

/// The shipped kernel sizes `PlanFacts::shipped_sm90` and `SelectSizes::shipped` assume
/// are the sm_90 defaults of `ptx_cache/manifest.json`.
#[test]
fn shipped_sizes_match_the_manifest() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/ptx_cache/manifest.json");
    let m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let defaults: Vec<&serde_json::Value> = m["variants"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| v["default"] == true && v["id"].as_str().unwrap().ends_with(".sm90"))
        .collect();
    let constexpr = |prefix: &str, name: &str| -> Vec<u64> {
        let v: Vec<u64> = defaults
            .iter()
            .filter(|v| v["id"].as_str().unwrap().starts_with(prefix))
            .map(|v| v["constexprs"][name].as_u64().unwrap())
            .collect();
        assert!(!v.is_empty(), "no sm90 default {prefix}");
        v
    };
    for t in constexpr("pq_emit.", "TILE") {
        assert_eq!(t as usize, SHIPPED_EMIT_TILE);
    }
    // the radix select runs one cluster of 8 CTAs a row on sm_90 (the portable size)
    for c in constexpr("pq_rsel.", "CLUSTER") {
        assert_eq!(c, 8);
    }
    for t in constexpr("pq_index.", "TP") {
        assert_eq!(t as usize, SHIPPED_INDEX_TP);
    }
    for t in constexpr("pq_select.", "CHUNK") {
        assert_eq!(t as usize, SHIPPED_SELECT_CHUNK);
    }
    for heavy in [1usize, 128, 129, 256, 512] {
        let cfg = PqConfig {
            heavy_size: Size::Count(heavy),
            ..PqConfig::reference_workload()
        };
        let k_pad = SelectSizes::shipped(&cfg, 32000).unwrap().k_pad;
        let name = tritonrt::pq::gpu::select_kernel_name(&cfg, 32000).unwrap();
        assert!(name.starts_with(&format!("pq_select.h{k_pad}.")), "{name}");
        for kp in constexpr(&format!("{name}."), "K_PAD") {
            assert_eq!(kp as usize, k_pad);
        }
    }
    let cfg = PqConfig {
        heavy_size: Size::Count(513),
        ..PqConfig::reference_workload()
    };
    assert_eq!(SelectSizes::shipped(&cfg, 32000), None);
}
