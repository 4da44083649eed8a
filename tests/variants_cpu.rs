//! CPU tests of which variant each indexer kernel runs: the decode step's shape buckets
//! (keyed by `M`, bits, dtypes, heavy and arch), the launch-time rule (an override, else
//! the table's current winner, else the manifest default) with its origin, stale entries
//! ignored, the `KernelChoice` API, and the CLI flags that expose it.

use std::path::Path;
use std::process::Command;

use tritonrt::artifact::ArtifactStore;
use tritonrt::pq::gpu::KernelChoice;
use tritonrt::pq::matrix::{practical_config, PRACTICAL_SHAPE};
use tritonrt::pq::variants::step_bucket;
use tritonrt::pq::{DType, PqConfig, Shape};
use tritonrt::tune::{
    choose_variant, Candidate, CandidateSet, CandidateTiming, DeviceKey, ShapeBucket, TuningEntry,
    TuningTable, VariantOrigin,
};

const EMIT: &str = "pq_emit.m2.w_bf16";

fn h100() -> DeviceKey {
    DeviceKey::new("NVIDIA H100 80GB HBM3", 90, 12080)
}

fn emit_set() -> CandidateSet {
    let c = |tile: u32, w: u32, default: bool| {
        Candidate::new(
            format!("{EMIT}.MP=2.QB=64.TILE={tile}.w{w}.s1.sm90"),
            EMIT,
            "a".repeat(64),
            format!("{tile:x}{w:x}").repeat(16),
            default,
        )
    };
    CandidateSet::new(
        EMIT,
        vec![c(4096, 4, true), c(2048, 4, false), c(8192, 8, false)],
    )
    .unwrap()
}

fn bucket(cfg: &PqConfig) -> ShapeBucket {
    step_bucket(EMIT, cfg, &PRACTICAL_SHAPE, 90).unwrap()
}

/// An entry of `set` for `bucket` whose winner is `winner` (every candidate timed).
fn entry(set: &CandidateSet, bucket: &ShapeBucket, winner: &str) -> TuningEntry {
    let timings = set
        .candidates()
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let us = if c.id == winner {
                10.0
            } else {
                20.0 + i as f64
            };
            CandidateTiming {
                id: c.id.clone(),
                median_us: us,
                min_us: us,
                max_us: us,
                count: 4,
            }
        })
        .collect();
    let d = h100();
    TuningEntry {
        gpu: d.gpu,
        arch: d.arch,
        driver_version: d.driver_version,
        kernel: set.kernel().into(),
        kernel_hash: set.kernel_hash().into(),
        candidate_checksum: set.checksum().into(),
        bucket: bucket.to_string(),
        winner: winner.into(),
        default_variant: set.default_candidate().id.clone(),
        timings,
        excluded: vec![],
        workload: String::new(),
        method: String::new(),
        tritonrt_version: String::new(),
        tuned_at_unix_s: 0,
    }
}

#[test]
fn step_bucket_keys_what_changes_validity_and_speed() {
    let base = practical_config(2, 8, 3020);
    let b = bucket(&base);
    assert_eq!(
        b.to_string(),
        "b1:pq_emit.m2.w_bf16:bf16+bf16+bf16:sm90:rows<=32:n<=32768:align1:ds64:K256:\
         heavy<=4096:M2"
    );
    assert_eq!(b.to_string().parse::<ShapeBucket>().unwrap(), b);
    // M, bits, each dtype, heavy bucket, arch: each its own bucket
    let others = [
        bucket(&practical_config(4, 8, 3020)),
        bucket(&practical_config(2, 6, 3020)),
        bucket(&PqConfig {
            weight_dtype: DType::F32,
            ..base
        }),
        bucket(&PqConfig {
            input_dtype: DType::F16,
            ..base
        }),
        bucket(&practical_config(2, 8, 5000)),
        step_bucket(EMIT, &base, &PRACTICAL_SHAPE, 80).unwrap(),
        step_bucket(
            EMIT,
            &base,
            &Shape {
                s: 131072,
                ..PRACTICAL_SHAPE
            },
            90,
        )
        .unwrap(),
    ];
    for o in &others {
        assert_ne!(o, &b, "{o}");
        assert_eq!(o.to_string().parse::<ShapeBucket>().unwrap(), *o);
    }
    // shapes that share a winner share the bucket: heavy 3000 and 3020, S one apart
    assert_eq!(bucket(&practical_config(2, 8, 3000)), b);
    let next = step_bucket(
        EMIT,
        &base,
        &Shape {
            s: PRACTICAL_SHAPE.s - 1,
            ..PRACTICAL_SHAPE
        },
        90,
    )
    .unwrap();
    assert_eq!(next, b);
    // the ten-field form (no M) still reads; M0 is not a form
    let old = "b1:pq_score_kernel_v6:fp32:sm90:rows<=32:n<=32768:align1:ds64:K64:heavy<=128";
    let ob: ShapeBucket = old.parse().unwrap();
    assert_eq!((ob.subvectors, ob.to_string().as_str()), (0, old));
    let e = format!("{old}:M0").parse::<ShapeBucket>().unwrap_err();
    assert!(e.to_string().contains("M must be at least 1"), "{e}");
    let e = format!("{old}:Mx").parse::<ShapeBucket>().unwrap_err();
    assert!(e.to_string().contains("M<number>"), "{e}");
}

#[test]
fn choice_is_override_then_table_then_default() {
    let set = emit_set();
    let b = bucket(&practical_config(2, 8, 3020));
    let (def, fast, other) = (
        set.candidates()[0].id.clone(),
        set.candidates()[2].id.clone(),
        set.candidates()[1].id.clone(),
    );
    // an empty table: the default
    let empty = TuningTable::new();
    let c = choose_variant(&set, None, &empty, &h100(), &b).unwrap();
    assert_eq!(
        (c.variant.as_str(), c.origin),
        (def.as_str(), VariantOrigin::Default)
    );
    assert_eq!(c.kernel, EMIT);
    // a current entry: its winner, from the table
    let mut t = TuningTable::new();
    t.insert(entry(&set, &b, &fast)).unwrap();
    let c = choose_variant(&set, None, &t, &h100(), &b).unwrap();
    assert_eq!(
        (c.variant.as_str(), c.origin),
        (fast.as_str(), VariantOrigin::Table)
    );
    assert_eq!(c.to_string(), format!("{fast} (table)"));
    // the default as the tuned winner is the table's choice too
    let mut td = TuningTable::new();
    td.insert(entry(&set, &b, &def)).unwrap();
    let c = choose_variant(&set, None, &td, &h100(), &b).unwrap();
    assert_eq!(
        (c.variant.as_str(), c.origin),
        (def.as_str(), VariantOrigin::Table)
    );
    // an override wins over the table
    let c = choose_variant(&set, Some(&other), &t, &h100(), &b).unwrap();
    assert_eq!(
        (c.variant.as_str(), c.origin),
        (other.as_str(), VariantOrigin::Override)
    );
    // an override that is not a candidate: an error naming it and the candidates
    let e = choose_variant(&set, Some("pq_emit.m2.w_bf16.nope"), &t, &h100(), &b)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("pq_emit.m2.w_bf16.nope") && e.contains(&def),
        "{e}"
    );
    // another bucket, another GPU: no entry, the default
    let b4 = bucket(&practical_config(4, 8, 3020));
    let c = choose_variant(&set, None, &t, &h100(), &b4).unwrap();
    assert_eq!(c.origin, VariantOrigin::Default);
    let h200 = DeviceKey::new("NVIDIA H200", 90, 12080);
    let c = choose_variant(&set, None, &t, &h200, &b).unwrap();
    assert_eq!(c.origin, VariantOrigin::Default);
}

#[test]
fn stale_entries_fall_back_to_the_default() {
    let set = emit_set();
    let b = bucket(&practical_config(2, 8, 3020));
    let fast = set.candidates()[2].id.clone();
    let def = set.default_candidate().id.clone();
    let mut t = TuningTable::new();
    t.insert(entry(&set, &b, &fast)).unwrap();
    // the kernel was edited: another source hash
    let edited = CandidateSet::new(
        EMIT,
        set.candidates()
            .iter()
            .map(|c| Candidate {
                source_hash: "e".repeat(64),
                ..c.clone()
            })
            .collect(),
    )
    .unwrap();
    // a variant was added to the set: another candidate checksum
    let mut more = set.candidates().to_vec();
    more.push(Candidate::new(
        format!("{EMIT}.MP=2.QB=64.TILE=1024.w4.s1.sm90"),
        EMIT,
        "a".repeat(64),
        "f".repeat(64),
        false,
    ));
    let more = CandidateSet::new(EMIT, more).unwrap();
    for s in [&edited, &more] {
        let c = choose_variant(s, None, &t, &h100(), &b).unwrap();
        assert_eq!(
            (c.variant.as_str(), c.origin),
            (def.as_str(), VariantOrigin::Default)
        );
    }
    // a newer driver: the entry is for another device key
    let newer = DeviceKey::new("NVIDIA H100 80GB HBM3", 90, 12090);
    let c = choose_variant(&set, None, &t, &newer, &b).unwrap();
    assert_eq!(c.origin, VariantOrigin::Default);
}

#[test]
fn kernel_choice_overrides() {
    let c = KernelChoice::new()
        .with_variant(EMIT, "x")
        .with_variant("pq_rsel.m2", "y")
        .with_variant(EMIT, "z");
    assert_eq!(c.variant_for(EMIT), Some("z"));
    assert_eq!(c.variant_for("pq_rsel.m2"), Some("y"));
    assert_eq!(c.variant_for("pq_rsel.m4"), None);
    assert_eq!(c.overrides().len(), 2);
    assert!(KernelChoice::manifest_defaults().overrides().is_empty());

    // by id: the kernel comes from the manifest
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/ptx_cache");
    let store = ArtifactStore::open(&dir).unwrap();
    let v = store
        .variants("axpy_kernel")
        .first()
        .map(|v| v.id.clone())
        .unwrap();
    let c = KernelChoice::manifest_defaults()
        .with_variant_id(&store, &v)
        .unwrap();
    assert_eq!(c.variant_for("axpy_kernel"), Some(v.as_str()));
    let e = KernelChoice::new()
        .with_variant_id(&store, "no_such_kernel.w4.sm90")
        .unwrap_err()
        .to_string();
    assert!(e.contains("no_such_kernel.w4.sm90"), "{e}");
}

fn tritonrt(args: &[&str], cache: &Path) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tritonrt"))
        .args(args)
        .env("TRITONRT_CACHE_DIR", cache)
        .env_remove("TRITONRT_TUNING_TABLE")
        .env("CUDA_VISIBLE_DEVICES", "")
        .output()
        .expect("running tritonrt");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn cli_help_and_refusals() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path();
    let (code, out, _) = tritonrt(&["autotune", "--help"], cache);
    assert_eq!(code, 0);
    for s in [
        "--new-keys",
        "practical-m2b8",
        "practical-m4b8",
        "reference",
        "current choice",
    ] {
        assert!(out.contains(s), "autotune --help lacks {s}");
    }
    for cmd in ["run", "bench"] {
        let (code, out, _) = tritonrt(&[cmd, "--help"], cache);
        assert_eq!(code, 0);
        assert!(
            out.contains("--variant <ID>"),
            "{cmd} --help lacks --variant"
        );
        assert!(!out.contains("--select-variant"), "{cmd} --help");
        assert!(!out.contains("--quant-variant"), "{cmd} --help");
    }
    // bad input: clear errors before any GPU is needed
    let (code, _, err) = tritonrt(&["autotune", "--new-keys", "0"], cache);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--new-keys"), "{err}");
    let (code, _, err) = tritonrt(&["autotune", "--workload", "practical-m9b9"], cache);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("practical-m2b8"), "{err}");
    // a matrix row parses, then tuning needs a GPU
    let (code, _, err) = tritonrt(&["autotune", "--workload", "practical-m2b8"], cache);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("needs a CUDA device"), "{err}");
    let (code, _, err) = tritonrt(&["bench", "--variant", "x", "--soak", "2"], cache);
    assert_ne!(code, 0, "{err}");
    assert!(err.contains("--variant") && err.contains("--soak"), "{err}");
}
