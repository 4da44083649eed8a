//! CPU tests of the autotuner: shape buckets, the tuning table (persistence, merge,
//! stale and corrupt tables, atomic writes) and the tuning procedure against a dummy
//! backend that computes real outputs on the CPU and reports synthetic timings.
//!
//! Random inputs are seeded but vary from run to run; the seed is printed and can be
//! fixed with `TRITONRT_TEST_SEED=<u64>`.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tritonrt::pq::{Size, Workload};
use tritonrt::tune::candidate::{candidate_checksum, kernel_hash};
use tritonrt::tune::table::{cache_dir_from, lock_path};
use tritonrt::tune::{
    align_of, bucket_for, compare_exact, compare_f32, input_sets_for, render_report,
    render_summary, tune, Candidate, CandidateSet, DefaultReason, DeviceKey, ExclusionReason,
    OutputCheck, SelectionSource, ShapeBucket, ShapeFeatures, TimingPlan, TimingStats,
    TuneSettings, TuneTarget, TuningEntry, TuningTable, ALIGN_CAP, SCHEMA_VERSION,
};
use tritonrt::Error;

const KERNEL: &str = "pq_score_kernel_v6";

mod common;

fn seed() -> u64 {
    common::test_seed()
}

fn h100() -> DeviceKey {
    DeviceKey::new("NVIDIA H100 80GB HBM3", 90, 12080)
}

fn ref_bucket() -> ShapeBucket {
    bucket_for(KERNEL, &["fp32"], 90, &Workload::reference().features()).unwrap()
}

// ---------------------------------------------------------------------------------
// Shape buckets
// ---------------------------------------------------------------------------------

#[test]
fn bucket_string_form_is_stable() {
    let r = ref_bucket();
    assert_eq!(
        r.to_string(),
        "b1:pq_score_kernel_v6:fp32:sm90:rows<=32:n<=32768:align1:ds64:K64:heavy<=128"
    );
    let l = bucket_for(KERNEL, &["fp32"], 90, &Workload::large().features()).unwrap();
    assert_eq!(
        l.to_string(),
        "b1:pq_score_kernel_v6:fp32:sm90:rows<=128:n<=131072:align1:ds64:K64:heavy<=128"
    );
    let mixed = bucket_for(
        "pq_score_lut.q_bf16",
        &["bf16", "fp32"],
        80,
        &ShapeFeatures::one_shot(6, 1000, 32, 256, 100),
    )
    .unwrap();
    assert_eq!(
        mixed.to_string(),
        "b1:pq_score_lut.q_bf16:bf16+fp32:sm80:rows<=8:n<=1024:align8:ds32:K256:heavy<=128"
    );
    for b in [r, l, mixed] {
        let parsed: ShapeBucket = b.to_string().parse().unwrap();
        assert_eq!(parsed, b);
        assert_eq!(parsed.to_string(), b.to_string());
    }
}

#[test]
fn bucket_same_for_shapes_that_share_a_winner() {
    let base = ShapeFeatures::decode(32, 31872, 64, 64, 128);
    let a = bucket_for(KERNEL, &["fp32"], 90, &base).unwrap();
    // The next decode steps: n grows by one, same bucket (alignment 1 throughout).
    for n in [31873, 31874, 32768, 16385] {
        let f = ShapeFeatures { n_keys: n, ..base };
        assert_eq!(bucket_for(KERNEL, &["fp32"], 90, &f).unwrap(), a, "n = {n}");
    }
    // Rows rounded up to a power of two; heavy padded likewise.
    for (rows, heavy) in [(17, 128), (24, 65), (32, 100)] {
        let f = ShapeFeatures {
            rows,
            heavy,
            ..base
        };
        assert_eq!(
            bucket_for(KERNEL, &["fp32"], 90, &f).unwrap(),
            a,
            "rows {rows} heavy {heavy}"
        );
    }
}

#[test]
fn bucket_differs_on_what_changes_speed_or_validity() {
    let base = ShapeFeatures::decode(32, 31872, 64, 64, 128);
    let a = bucket_for(KERNEL, &["fp32"], 90, &base).unwrap();
    let variants = [
        ("kernel", bucket_for("pq_score_lut", &["fp32"], 90, &base)),
        ("dtype", bucket_for(KERNEL, &["bf16"], 90, &base)),
        ("arch", bucket_for(KERNEL, &["fp32"], 80, &base)),
        (
            "rows",
            bucket_for(KERNEL, &["fp32"], 90, &ShapeFeatures { rows: 33, ..base }),
        ),
        (
            "n band",
            bucket_for(
                KERNEL,
                &["fp32"],
                90,
                &ShapeFeatures {
                    n_keys: 32769,
                    ..base
                },
            ),
        ),
        (
            "d_s",
            bucket_for(
                KERNEL,
                &["fp32"],
                90,
                &ShapeFeatures {
                    sub_dim: 32,
                    ..base
                },
            ),
        ),
        (
            "K",
            bucket_for(
                KERNEL,
                &["fp32"],
                90,
                &ShapeFeatures {
                    centroids: 256,
                    ..base
                },
            ),
        ),
        (
            "heavy",
            bucket_for(KERNEL, &["fp32"], 90, &ShapeFeatures { heavy: 129, ..base }),
        ),
        (
            "alignment",
            bucket_for(
                KERNEL,
                &["fp32"],
                90,
                &ShapeFeatures {
                    n_align: 128,
                    ..base
                },
            ),
        ),
    ];
    for (what, b) in variants {
        let b = b.unwrap();
        assert_ne!(b, a, "{what} must change the bucket");
        assert_ne!(
            b.to_string(),
            a.to_string(),
            "{what} must change the string form"
        );
    }
    // burn #5352: one-shot launches with aligned and unaligned n in the same power-of-two
    // band must not share a bucket.
    let aligned = bucket_for(
        KERNEL,
        &["fp32"],
        90,
        &ShapeFeatures::one_shot(32, 32768, 64, 64, 128),
    );
    let unaligned = bucket_for(
        KERNEL,
        &["fp32"],
        90,
        &ShapeFeatures::one_shot(32, 32767, 64, 64, 128),
    );
    let (aligned, unaligned) = (aligned.unwrap(), unaligned.unwrap());
    assert_eq!(aligned.n_band, unaligned.n_band);
    assert_ne!(aligned, unaligned);
    assert!(aligned.n_divisible_by(512) && aligned.n_divisible_by(64));
    assert!(!unaligned.n_divisible_by(64) && unaligned.n_divisible_by(1));
}

#[test]
fn align_of_is_largest_power_of_two_divisor_capped() {
    let mut rng = StdRng::seed_from_u64(seed());
    assert_eq!(align_of(0), ALIGN_CAP);
    assert_eq!(align_of(1), 1);
    assert_eq!(align_of(31872), 128);
    assert_eq!(align_of(1 << 20), ALIGN_CAP);
    for _ in 0..1000 {
        let n: u64 = rng.random_range(1..1u64 << 40);
        let a = align_of(n);
        assert!(a.is_power_of_two() && a <= ALIGN_CAP);
        assert_eq!(n % a, 0, "n {n} align {a}");
        if a < ALIGN_CAP {
            assert_ne!(n % (2 * a), 0, "n {n} align {a} is not the largest");
        }
    }
}

#[test]
fn bucket_for_rejects_bad_input() {
    let f = ShapeFeatures::decode(32, 100, 64, 64, 128);
    let msg = |r: Result<ShapeBucket, Error>| r.unwrap_err().to_string();
    assert!(msg(bucket_for("a:b", &["fp32"], 90, &f)).contains("\"a:b\""));
    assert!(msg(bucket_for("", &["fp32"], 90, &f)).contains("kernel name"));
    assert!(msg(bucket_for(KERNEL, &[], 90, &f)).contains("at least one dtype"));
    assert!(msg(bucket_for(KERNEL, &["fp+32"], 90, &f)).contains("fp+32"));
    assert!(msg(bucket_for(
        KERNEL,
        &["fp32"],
        90,
        &ShapeFeatures { rows: 0, ..f }
    ))
    .contains("rows"));
    let m = msg(bucket_for(
        KERNEL,
        &["fp32"],
        90,
        &ShapeFeatures { n_align: 8, ..f },
    ));
    assert!(m.contains("n_align 8 does not divide n = 100"), "{m}");
    let m = msg(bucket_for(
        KERNEL,
        &["fp32"],
        90,
        &ShapeFeatures { n_align: 3, ..f },
    ));
    assert!(m.contains("power of two"), "{m}");
    for bad in [
        "b2:pq:fp32:sm90:rows<=32:n<=32768:align1:ds64:K64:heavy<=128",
        "b1:pq:fp32:sm90:rows<=33:n<=32768:align1:ds64:K64:heavy<=128",
        "b1:pq:fp32:sm90:rows<=32:n<=32768:align1:ds64:K64",
        "b1:pq:fp32:smX:rows<=32:n<=32768:align1:ds64:K64:heavy<=128",
    ] {
        assert!(bad.parse::<ShapeBucket>().is_err(), "{bad} parsed");
    }
}

#[test]
fn workload_parsing() {
    let r: Workload = "reference".parse().unwrap();
    assert_eq!(r, Workload::reference());
    assert_eq!(r.n_keys(), 31872);
    let l: Workload = "large".parse().unwrap();
    assert_eq!((l.batch, l.seq_len, l.rows()), (4, 131072, 128));
    let c: Workload = "2, 32, 8, 65536, 128".parse().unwrap();
    assert_eq!(
        (c.batch, c.heads, c.kv_heads, c.seq_len, c.head_dim),
        (2, 32, 8, 65536, 128)
    );
    assert_eq!((c.subvectors, c.bits, c.heavy), (2, 6, Size::Count(128)));
    let c: Workload = "1,8,8,4096,64,4,8,256".parse().unwrap();
    assert_eq!((c.subvectors, c.bits, c.heavy), (4, 8, Size::Count(256)));
    assert_eq!(c.features().sub_dim, 16);
    assert_eq!(c.features().centroids, 256);
    for (bad, needle) in [
        ("1,32,5,100,128", "H % H_kv"),
        ("1,32,32,100,128,3", "D % M"),
        ("1,32,32,100,128,2,9", "bits"),
        ("1,32,32,x,128", "field 4 (S)"),
        ("1,2,3", "got 3 fields"),
        ("huge", "got 1 fields"),
    ] {
        let e = bad.parse::<Workload>().unwrap_err().to_string();
        assert!(e.contains(needle), "{bad}: {e}");
    }
}

// ---------------------------------------------------------------------------------
// Candidate sets
// ---------------------------------------------------------------------------------

fn cand(id: &str, default: bool) -> Candidate {
    Candidate::new(
        format!("{KERNEL}.{id}"),
        KERNEL,
        "5ca1ab1e".repeat(8),
        format!(
            "{:0>64}",
            id.len() * 7919 + id.bytes().map(u64::from).sum::<u64>() as usize
        ),
        default,
    )
}

#[test]
fn candidate_set_hashes() {
    let a = vec![cand("a", true), cand("b", false), cand("c", false)];
    let s1 = CandidateSet::new(KERNEL, a.clone()).unwrap();
    let mut rev = a.clone();
    rev.reverse();
    let s2 = CandidateSet::new(KERNEL, rev).unwrap();
    assert_eq!(
        s1.checksum(),
        s2.checksum(),
        "checksum must not depend on order"
    );
    assert_eq!(s1.kernel_hash(), "5ca1ab1e".repeat(8));
    assert_eq!(s1.default_candidate().id, format!("{KERNEL}.a"));
    assert!(s1.contains(&format!("{KERNEL}.b")) && !s1.contains("nope"));

    let mut recompiled = a.clone();
    recompiled[1].artifact_sha256 = "f".repeat(64);
    assert_ne!(candidate_checksum(&recompiled), s1.checksum());
    let mut more = a.clone();
    more.push(cand("d", false));
    assert_ne!(candidate_checksum(&more), s1.checksum());
    let mut edited = a.clone();
    edited[2].source_hash = "e".repeat(64);
    assert_ne!(kernel_hash(&edited), s1.kernel_hash());
    assert_eq!(kernel_hash(&edited).len(), 64);

    let err = |v: Vec<Candidate>| CandidateSet::new(KERNEL, v).unwrap_err().to_string();
    assert!(err(vec![]).contains("no variants"));
    assert!(err(vec![cand("a", false)]).contains("exactly one default variant, got 0"));
    assert!(err(vec![cand("a", true), cand("b", true)]).contains("got 2"));
    assert!(err(vec![cand("a", true), cand("a", false)]).contains("appears twice"));
    let mut other = cand("x", false);
    other.kernel = "other".into();
    assert!(err(vec![cand("a", true), other]).contains("belongs to kernel other"));
}

// ---------------------------------------------------------------------------------
// A dummy backend: out[i] = 2 * x[i] + 1 on the CPU, synthetic timings.
// ---------------------------------------------------------------------------------

#[derive(Clone, Debug)]
enum Behaviour {
    /// Correct output, this many microseconds per launch.
    Good(f64),
    /// Output off by a small amount at one element; this fast.
    Wrong(f64),
    /// Leaves the last element unwritten (poisoned).
    Partial(f64),
    /// Launch fails with this message.
    LaunchFails(&'static str),
    /// Runs correctly but timing fails.
    TimingFails,
    /// Runs correctly but returns NaN samples.
    NanSamples,
    /// Output changes from one run to the next (correct first time).
    Nondeterministic(f64),
}

struct Dummy {
    set: CandidateSet,
    bucket: ShapeBucket,
    behaviour: HashMap<String, Behaviour>,
    inputs: Vec<Vec<f32>>,
    out: Vec<f32>,
    oracle: HashMap<usize, Vec<f32>>,
    rng: StdRng,
    runs: HashMap<String, usize>,
    /// (candidate id, plan) of every time() call, in order.
    timed: Vec<(String, TimingPlan)>,
}

impl Dummy {
    fn new(spec: &[(&str, bool, Behaviour)], seed: u64) -> Self {
        let cands: Vec<Candidate> = spec.iter().map(|(id, d, _)| cand(id, *d)).collect();
        let behaviour = spec
            .iter()
            .map(|(id, _, b)| (format!("{KERNEL}.{id}"), b.clone()))
            .collect();
        let mut rng = StdRng::seed_from_u64(seed);
        let len = rng.random_range(100..300);
        let inputs = (0..3)
            .map(|_| (0..len).map(|_| rng.random_range(-4.0f32..4.0)).collect())
            .collect();
        Dummy {
            set: CandidateSet::new(KERNEL, cands).unwrap(),
            bucket: ref_bucket(),
            behaviour,
            inputs,
            out: Vec::new(),
            oracle: HashMap::new(),
            rng,
            runs: HashMap::new(),
            timed: Vec::new(),
        }
    }

    fn timed_ids(&self) -> Vec<&str> {
        self.timed.iter().map(|(id, _)| id.as_str()).collect()
    }
}

impl TuneTarget for Dummy {
    fn candidates(&self) -> &CandidateSet {
        &self.set
    }
    fn bucket(&self) -> &ShapeBucket {
        &self.bucket
    }
    fn workload(&self) -> String {
        "dummy axpb".into()
    }
    fn timer(&self) -> String {
        "synthetic".into()
    }
    fn input_sets(&self) -> usize {
        self.inputs.len()
    }
    fn run(&mut self, c: &Candidate, s: usize) -> Result<(), String> {
        let b = self.behaviour[&c.id].clone();
        let n_run = {
            let r = self.runs.entry(c.id.clone()).or_default();
            *r += 1;
            *r
        };
        let x = &self.inputs[s];
        self.out = vec![f32::NAN; x.len()]; // poison
        if let Behaviour::LaunchFails(m) = b {
            return Err(m.to_string());
        }
        let n = match b {
            Behaviour::Partial(_) => x.len() - 1,
            _ => x.len(),
        };
        for (o, &xi) in self.out.iter_mut().zip(x).take(n) {
            *o = 2.0 * xi + 1.0;
        }
        match b {
            Behaviour::Wrong(_) => {
                let i = self.rng.random_range(0..n);
                self.out[i] += 0.5;
            }
            Behaviour::Nondeterministic(_) if n_run > 1 => self.out[0] += 1.0,
            _ => {}
        }
        if c.is_default && !self.oracle.contains_key(&s) {
            self.oracle.insert(s, self.out.clone());
        }
        Ok(())
    }
    fn output_matches_default(&mut self, _c: &Candidate, s: usize) -> Result<OutputCheck, String> {
        let want = self.oracle.get(&s).ok_or("no oracle for this input set")?;
        Ok(compare_f32(want, &self.out, 1e-6, 1e-6))
    }
    fn time(&mut self, c: &Candidate, plan: &TimingPlan) -> Result<Vec<f64>, String> {
        self.timed.push((c.id.clone(), *plan));
        let us = match self.behaviour[&c.id] {
            Behaviour::Good(us)
            | Behaviour::Wrong(us)
            | Behaviour::Partial(us)
            | Behaviour::Nondeterministic(us) => us,
            Behaviour::TimingFails => return Err("event elapsed time failed".into()),
            Behaviour::NanSamples => return Ok(vec![f64::NAN; plan.samples]),
            Behaviour::LaunchFails(_) => return Err("not launchable".into()),
        };
        // +-1 % multiplicative noise.
        Ok((0..plan.samples)
            .map(|_| us * (1.0 + self.rng.random_range(-0.01..0.01)))
            .collect())
    }
}

fn quiet() -> TuneSettings {
    TuneSettings {
        repeats: 30,
        warmup: 3,
        launches_per_sample: 5,
        rounds: 3,
        progress: false,
        // the dummy's times are fake; the budget is tested on its own below
        budget_s_per_candidate: 0.0,
        ..TuneSettings::default()
    }
}

fn id(s: &str) -> String {
    format!("{KERNEL}.{s}")
}

// ---------------------------------------------------------------------------------
// The tuning procedure
// ---------------------------------------------------------------------------------

#[test]
fn tune_budget_caps_samples_of_slow_kernels() -> Result<(), String> {
    // a dummy whose launches "take" 10 ms: 30 samples x 5 launches would be 1.5 s per
    // candidate; a 0.22 s budget allows 4 samples (no fewer than the 3 rounds).
    let mut t = Dummy::new(
        &[
            ("BLOCK_KEYS=128.w4.s2", true, Behaviour::Good(10_000.0)),
            ("BLOCK_KEYS=512.w8.s3", false, Behaviour::Good(5_000.0)),
        ],
        seed(),
    );
    let settings = TuneSettings {
        budget_s_per_candidate: 0.22,
        ..quiet()
    };
    let e = tune(&mut t, &h100(), &settings).map_err(|e| e.to_string())?;
    for tm in &e.timings {
        assert_eq!(tm.count, 4, "{}: samples under the budget", tm.id);
    }
    assert_eq!(e.winner, id("BLOCK_KEYS=512.w8.s3"));
    Ok(())
}

#[test]
fn tune_picks_fastest_valid_variant() {
    let mut t = Dummy::new(
        &[
            ("BLOCK_KEYS=128.w4.s2", true, Behaviour::Good(10.0)),
            ("BLOCK_KEYS=256.w4.s2", false, Behaviour::Good(8.0)),
            ("BLOCK_KEYS=512.w8.s3", false, Behaviour::Good(5.0)),
            ("BLOCK_KEYS=64.w2.s1", false, Behaviour::Good(20.0)),
        ],
        seed(),
    );
    let e = tune(&mut t, &h100(), &quiet()).unwrap();
    assert_eq!(e.winner, id("BLOCK_KEYS=512.w8.s3"));
    assert_eq!(e.default_variant, id("BLOCK_KEYS=128.w4.s2"));
    assert_eq!(e.timings.len(), 4);
    assert!(e.excluded.is_empty());
    for tm in &e.timings {
        assert_eq!(tm.count, 30, "{}", tm.id);
        assert!(tm.min_us <= tm.median_us && tm.median_us <= tm.max_us);
    }
    let s = e.speedup().unwrap();
    assert!((s - 2.0).abs() < 0.05, "speedup {s}");
    assert_eq!(e.kernel_hash, t.set.kernel_hash());
    assert_eq!(e.candidate_checksum, t.set.checksum());
    assert_eq!(e.bucket, ref_bucket().to_string());
    assert_eq!(
        (e.gpu.as_str(), e.arch, e.driver_version),
        ("NVIDIA H100 80GB HBM3", 90, 12080)
    );
    assert!(e.problem().is_none(), "{:?}", e.problem());
    // Timing is interleaved in rounds whose order rotates, and each call warms up.
    assert_eq!(t.timed.len(), 3 * 4);
    assert_ne!(t.timed[0].0, t.timed[4].0);
    assert!(t.timed.iter().all(|(_, p)| p.warmup == 3
        && p.launches_per_sample == 5
        && p.input_sets == 3
        && p.samples == 10));
    // The default ran twice per check set (first and last input set).
    assert_eq!(t.runs[&id("BLOCK_KEYS=128.w4.s2")], 4);
    assert_eq!(t.runs[&id("BLOCK_KEYS=256.w4.s2")], 2);
}

#[test]
fn tune_excludes_wrong_and_failing_variants_even_when_fastest() {
    let mut t = Dummy::new(
        &[
            ("default", true, Behaviour::Good(10.0)),
            ("wrong", false, Behaviour::Wrong(1.0)),
            ("partial", false, Behaviour::Partial(0.5)),
            ("nolaunch", false, Behaviour::LaunchFails("CUDA_ERROR_OUT_OF_RESOURCES: too much shared memory (232448 > 232448 - 1 bytes)")),
            ("ok", false, Behaviour::Good(7.0)),
        ],
        seed(),
    );
    let e = tune(&mut t, &h100(), &quiet()).unwrap();
    assert_eq!(e.winner, id("ok"));
    let timed: Vec<&str> = e.timings.iter().map(|t| t.id.as_str()).collect();
    assert_eq!(timed, vec![id("default"), id("ok")]);
    let reason = |v: &str| {
        e.excluded
            .iter()
            .find(|x| x.id == id(v))
            .unwrap_or_else(|| panic!("{v} not excluded: {:?}", e.excluded))
            .clone()
    };
    let w = reason("wrong");
    assert_eq!(w.reason, ExclusionReason::WrongOutput);
    assert!(
        w.detail.contains("input set 0") && w.detail.contains("1 of"),
        "{}",
        w.detail
    );
    let p = reason("partial");
    assert_eq!(p.reason, ExclusionReason::WrongOutput);
    assert!(p.detail.contains("got NaN"), "{}", p.detail);
    let f = reason("nolaunch");
    assert_eq!(f.reason, ExclusionReason::LaunchFailed);
    assert!(
        f.detail.contains("CUDA_ERROR_OUT_OF_RESOURCES"),
        "{}",
        f.detail
    );
    // Excluded variants are never timed.
    for bad in ["wrong", "partial", "nolaunch"] {
        assert!(
            !t.timed_ids().contains(&id(bad).as_str()),
            "{bad} was timed"
        );
    }
    // The evidence survives the table.
    let mut table = TuningTable::new();
    table.insert(e.clone()).unwrap();
    let back =
        TuningTable::from_json_bytes(table.to_json_string().as_bytes(), Path::new("mem"), true)
            .unwrap();
    assert_eq!(back.entries(), std::slice::from_ref(&e));
    // And the report says all of it.
    let r = render_report(&e);
    eprintln!("{r}");
    for needle in [
        "winner: pq_score_kernel_v6.ok",
        "excluded, wrong output: input set 0",
        "excluded, launch failed: input set 0: CUDA_ERROR_OUT_OF_RESOURCES",
        "1.00x",
        "default",
    ] {
        assert!(r.contains(needle), "report lacks {needle:?}:\n{r}");
    }
}

#[test]
fn tune_excludes_variants_that_fail_timing() {
    let mut t = Dummy::new(
        &[
            ("default", true, Behaviour::Good(10.0)),
            ("timingfails", false, Behaviour::TimingFails),
            ("nan", false, Behaviour::NanSamples),
            ("fast", false, Behaviour::Good(9.0)),
        ],
        seed(),
    );
    let e = tune(&mut t, &h100(), &quiet()).unwrap();
    assert_eq!(e.winner, id("fast"));
    assert_eq!(e.timings.len(), 2);
    for v in ["timingfails", "nan"] {
        let x = e.excluded.iter().find(|x| x.id == id(v)).unwrap();
        assert_eq!(x.reason, ExclusionReason::TimingFailed, "{v}");
    }
    // Dropped after their first failure: timed in round 0 only.
    assert_eq!(t.timed_ids().iter().filter(|i| **i == id("nan")).count(), 1);
}

#[test]
fn tune_keeps_default_unless_clearly_faster() {
    let spec = [
        ("default", true, Behaviour::Good(10.0)),
        ("marginal", false, Behaviour::Good(9.95)),
    ];
    // Noise is +-1 %, so the medians differ by ~0.5 %: below a 3 % margin.
    let settings = TuneSettings {
        min_speedup: 0.03,
        ..quiet()
    };
    let e = tune(&mut Dummy::new(&spec, seed()), &h100(), &settings).unwrap();
    assert_eq!(e.winner, id("default"));
    // With a 20x gap the margin is irrelevant.
    let spec = [
        ("default", true, Behaviour::Good(10.0)),
        ("fast", false, Behaviour::Good(0.5)),
    ];
    let e = tune(&mut Dummy::new(&spec, seed()), &h100(), &settings).unwrap();
    assert_eq!(e.winner, id("fast"));
}

#[test]
fn tune_fails_clearly_without_a_working_default() {
    let spec = [
        (
            "default",
            true,
            Behaviour::LaunchFails("CUDA_ERROR_NO_BINARY_FOR_GPU"),
        ),
        ("ok", false, Behaviour::Good(1.0)),
    ];
    let e = tune(&mut Dummy::new(&spec, seed()), &h100(), &quiet()).unwrap_err();
    assert!(
        matches!(
            e,
            Error::TuneDefaultFailed {
                stage: "launch",
                ..
            }
        ),
        "{e}"
    );
    assert!(
        e.to_string().contains("CUDA_ERROR_NO_BINARY_FOR_GPU"),
        "{e}"
    );
    assert!(e.to_string().contains("pq_score_kernel_v6.default"), "{e}");

    let spec = [("default", true, Behaviour::Nondeterministic(1.0))];
    let e = tune(&mut Dummy::new(&spec, seed()), &h100(), &quiet()).unwrap_err();
    assert!(
        matches!(
            e,
            Error::TuneDefaultFailed {
                stage: "determinism check",
                ..
            }
        ),
        "{e}"
    );

    let spec = [("default", true, Behaviour::TimingFails)];
    let e = tune(&mut Dummy::new(&spec, seed()), &h100(), &quiet()).unwrap_err();
    assert!(
        matches!(
            e,
            Error::TuneDefaultFailed {
                stage: "timing",
                ..
            }
        ),
        "{e}"
    );

    let spec = [("default", true, Behaviour::Good(1.0))];
    let bad = TuneSettings {
        repeats: 0,
        ..quiet()
    };
    assert!(tune(&mut Dummy::new(&spec, seed()), &h100(), &bad).is_err());
}

#[test]
fn timing_stats_and_helpers() {
    let s = TimingStats::from_samples(&[5.0, 1.0, 3.0]).unwrap();
    assert_eq!(
        (s.median_us, s.min_us, s.max_us, s.count),
        (3.0, 1.0, 5.0, 3)
    );
    let s = TimingStats::from_samples(&[4.0, 1.0, 3.0, 2.0]).unwrap();
    assert_eq!(s.median_us, 2.5);
    assert!(TimingStats::from_samples(&[]).is_none());
    assert!(TimingStats::from_samples(&[1.0, f64::NAN]).is_none());
    assert!(TimingStats::from_samples(&[1.0, -1.0]).is_none());

    assert_eq!(input_sets_for(4 << 20, 50 << 20), 25);
    assert_eq!(input_sets_for(1 << 30, 50 << 20), 2);
    assert_eq!(input_sets_for(1, 50 << 20), 64);
    assert_eq!(input_sets_for(0, 50 << 20), 2);

    assert_eq!(
        compare_f32(&[1.0, 2.0], &[1.0, 2.0 + 1e-7], 1e-5, 0.0),
        OutputCheck::Matches
    );
    let d = compare_f32(&[1.0, 2.0, 3.0], &[1.0, 2.5, f32::NAN], 1e-5, 1e-5);
    assert!(
        matches!(&d, OutputCheck::Differs(m) if m.contains("2 of 3") && m.contains("index 1")),
        "{d:?}"
    );
    assert!(matches!(
        compare_f32(&[1.0], &[1.0, 2.0], 0.0, 0.0),
        OutputCheck::Differs(_)
    ));
    assert_eq!(
        compare_exact(&[1i64, 2, 3], &[1, 2, 3]),
        OutputCheck::Matches
    );
    let d = compare_exact(&[1i64, 2, 3], &[1, 9, 3]);
    assert!(
        matches!(&d, OutputCheck::Differs(m) if m.contains("expected 2, got 9")),
        "{d:?}"
    );
}

// ---------------------------------------------------------------------------------
// The tuning table
// ---------------------------------------------------------------------------------

/// A real entry produced by the procedure on the dummy backend.
fn tuned_entry(
    spec: &[(&str, bool, Behaviour)],
    bucket: Option<ShapeBucket>,
) -> (TuningEntry, CandidateSet) {
    let mut t = Dummy::new(spec, seed());
    if let Some(b) = bucket {
        t.bucket = b;
    }
    let e = tune(&mut t, &h100(), &quiet()).unwrap();
    (e, t.set.clone())
}

fn std_spec() -> Vec<(&'static str, bool, Behaviour)> {
    vec![
        ("a", true, Behaviour::Good(10.0)),
        ("b", false, Behaviour::Good(4.0)),
        ("c", false, Behaviour::Wrong(1.0)),
    ]
}

#[test]
fn cache_dir_resolution() {
    let user = Some(Path::new("/home/u/.cache").to_path_buf());
    assert_eq!(
        cache_dir_from(Some("/x/y".into()), user.clone()).unwrap(),
        Path::new("/x/y")
    );
    assert_eq!(
        cache_dir_from(Some("".into()), user.clone()).unwrap(),
        Path::new("/home/u/.cache/tritonrt")
    );
    assert_eq!(
        cache_dir_from(None, user).unwrap(),
        Path::new("/home/u/.cache/tritonrt")
    );
    let e = cache_dir_from(None, None).unwrap_err().to_string();
    assert!(e.contains("TRITONRT_CACHE_DIR"), "{e}");
}

#[test]
fn table_round_trip_and_lookup() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sub").join("tuning.json");
    let (e, set) = tuned_entry(&std_spec(), None);
    assert_eq!(e.winner, id("b"));
    let mut t = TuningTable::new();
    assert!(!t.insert(e.clone()).unwrap());
    t.save(&path).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains(&format!("\"schema_version\": {SCHEMA_VERSION}")));
    assert!(text.ends_with('\n'));

    let back = TuningTable::load(&path).unwrap();
    assert_eq!(back.entries(), t.entries());
    assert_eq!(
        back.to_json_string(),
        text,
        "serialization must be deterministic"
    );
    let b = ref_bucket();
    assert_eq!(
        back.winner(&h100(), set.kernel_hash(), set.checksum(), &b),
        Some(id("b").as_str())
    );
    let sel = back.select(&h100(), &set, &b);
    assert_eq!(sel.variant, id("b"));
    assert!(matches!(sel.source, SelectionSource::Tuned { speedup } if speedup > 2.0));

    // Another device or another bucket: no entry, the default.
    let other_gpu = DeviceKey::new("NVIDIA A100-SXM4-80GB", 80, 12080);
    assert_eq!(
        back.winner(&other_gpu, set.kernel_hash(), set.checksum(), &b),
        None
    );
    let newer_driver = DeviceKey {
        driver_version: 13000,
        ..h100()
    };
    assert_eq!(
        back.winner(&newer_driver, set.kernel_hash(), set.checksum(), &b),
        None
    );
    let other_bucket = bucket_for(KERNEL, &["fp32"], 90, &Workload::large().features()).unwrap();
    let sel = back.select(&h100(), &set, &other_bucket);
    assert_eq!(
        (sel.variant.as_str(), &sel.source),
        (
            id("a").as_str(),
            &SelectionSource::Default(DefaultReason::NoEntry)
        )
    );
}

#[test]
fn stale_entries_are_ignored() {
    let (e, set) = tuned_entry(&std_spec(), None);
    let mut t = TuningTable::new();
    t.insert(e.clone()).unwrap();
    let b = ref_bucket();
    let stale = SelectionSource::Default(DefaultReason::Stale);

    // The kernel source changed.
    let edited: Vec<Candidate> = set
        .candidates()
        .iter()
        .map(|c| Candidate {
            source_hash: "e".repeat(64),
            ..c.clone()
        })
        .collect();
    let edited = CandidateSet::new(KERNEL, edited).unwrap();
    assert_eq!(
        t.winner(&h100(), edited.kernel_hash(), edited.checksum(), &b),
        None
    );
    let sel = t.select(&h100(), &edited, &b);
    assert_eq!(
        (sel.variant.as_str(), &sel.source),
        (id("a").as_str(), &stale)
    );

    // One variant recompiled (artifact hash changed).
    let mut recompiled = set.candidates().to_vec();
    recompiled[1].artifact_sha256 = "d".repeat(64);
    let recompiled = CandidateSet::new(KERNEL, recompiled).unwrap();
    assert_eq!(t.select(&h100(), &recompiled, &b).source, stale);

    // A variant added to the set.
    let mut more = set.candidates().to_vec();
    more.push(cand("new", false));
    let more = CandidateSet::new(KERNEL, more).unwrap();
    assert_eq!(t.select(&h100(), &more, &b).source, stale);
    assert_eq!(
        t.winner(&h100(), more.kernel_hash(), more.checksum(), &b),
        None
    );

    // The winner no longer exists among the candidates (the entry still claims the
    // current checksum, e.g. a hand-edited or mismatched table): validated, not used.
    let mut ghost = e.clone();
    ghost.winner = id("gone");
    ghost.timings.push(tritonrt::tune::CandidateTiming {
        id: id("gone"),
        median_us: 0.1,
        min_us: 0.1,
        max_us: 0.1,
        count: 3,
    });
    let mut t2 = TuningTable::new();
    t2.insert(ghost).unwrap();
    assert_eq!(
        t2.winner(&h100(), set.kernel_hash(), set.checksum(), &b),
        Some(id("gone").as_str())
    );
    let sel = t2.select(&h100(), &set, &b);
    assert_eq!(sel.variant, id("a"));
    assert_eq!(
        sel.source,
        SelectionSource::Default(DefaultReason::WinnerNotACandidate(id("gone")))
    );

    // An inconsistent entry (winner without timing, read leniently) is never used.
    let mut broken = e.clone();
    broken.winner = id("c"); // c was excluded as wrong
    assert!(broken.problem().is_some());
    let json = format!(
        "{{\"schema_version\": {SCHEMA_VERSION}, \"entries\": [{}]}}",
        serde_json::to_string(&broken).unwrap()
    );
    let lenient =
        TuningTable::from_json_bytes(json.as_bytes(), Path::new("t.json"), false).unwrap();
    assert_eq!(lenient.len(), 1);
    assert_eq!(
        lenient.winner(&h100(), set.kernel_hash(), set.checksum(), &b),
        None
    );
    assert_eq!(lenient.select(&h100(), &set, &b).variant, id("a"));
    let strict =
        TuningTable::from_json_bytes(json.as_bytes(), Path::new("t.json"), true).unwrap_err();
    assert!(
        matches!(strict, Error::TuneEntry { index: 0, .. }),
        "{strict}"
    );
    assert!(
        strict
            .to_string()
            .contains("winner pq_score_kernel_v6.c has no timing"),
        "{strict}"
    );
    assert!(TuningTable::new().insert(broken).is_err());
}

#[test]
fn merge_on_save() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tuning.json");
    let (e1, set) = tuned_entry(&std_spec(), None);
    let large = bucket_for(KERNEL, &["fp32"], 90, &Workload::large().features()).unwrap();
    let (e2, _) = tuned_entry(&std_spec(), Some(large.clone()));

    let mut t1 = TuningTable::new();
    t1.insert(e1.clone()).unwrap();
    let s = t1.save_merged(&path).unwrap();
    assert_eq!((s.added, s.replaced), (1, 0));
    let mut t2 = TuningTable::new();
    t2.insert(e2.clone()).unwrap();
    let s = t2.save_merged(&path).unwrap();
    assert_eq!((s.added, s.replaced), (1, 0));
    let both = TuningTable::load(&path).unwrap();
    assert_eq!(both.len(), 2);
    assert_eq!(both.select(&h100(), &set, &ref_bucket()).variant, id("b"));
    assert_eq!(both.select(&h100(), &set, &large).variant, id("b"));

    // Re-tuning the same key replaces the entry: now the default wins that bucket.
    let (e3, _) = tuned_entry(
        &[
            ("a", true, Behaviour::Good(1.0)),
            ("b", false, Behaviour::Good(4.0)),
            ("c", false, Behaviour::Wrong(1.0)),
        ],
        None,
    );
    let mut t3 = TuningTable::new();
    t3.insert(e3).unwrap();
    let s = t3.save_merged(&path).unwrap();
    assert_eq!((s.added, s.replaced), (0, 1));
    let after = TuningTable::load(&path).unwrap();
    assert_eq!(after.len(), 2);
    assert_eq!(
        after.select(&h100(), &set, &ref_bucket()).source,
        SelectionSource::Default(DefaultReason::TunedDefault)
    );
    assert_eq!(after.select(&h100(), &set, &large).variant, id("b"));

    // In-memory merge counts too.
    let mut m = TuningTable::new();
    let st = m.merge(&after);
    assert_eq!((st.added, st.replaced, st.skipped), (2, 0, 0));
}

#[test]
fn concurrent_savers_lose_nothing_and_leave_no_temp_files() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tuning.json");
    let threads = 6;
    let per_thread = 4;
    let (template, _) = tuned_entry(&std_spec(), None);
    std::thread::scope(|s| {
        for th in 0..threads {
            let path = &path;
            let template = &template;
            s.spawn(move || {
                for k in 0..per_thread {
                    // A distinct bucket per (thread, k): rows 2..64, n bands 1024..8192.
                    let f = ShapeFeatures::decode(1 << (th + 1), 1000 << k, 64, 64, 128);
                    let mut e = template.clone();
                    e.bucket = bucket_for(KERNEL, &["fp32"], 90, &f).unwrap().to_string();
                    let mut t = TuningTable::new();
                    t.insert(e).unwrap();
                    t.save_merged(path).unwrap();
                }
            });
        }
    });
    let t = TuningTable::load(&path).unwrap();
    assert_eq!(t.len(), threads * per_thread);
    let mut names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        vec!["tuning.json".to_string(), "tuning.json.lock".to_string()]
    );
    assert_eq!(lock_path(&path), dir.path().join("tuning.json.lock"));
}

#[test]
fn corrupt_tables_are_ignored_with_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = StdRng::seed_from_u64(seed());
    let (e, set) = tuned_entry(&std_spec(), None);
    let mut good = TuningTable::new();
    good.insert(e).unwrap();
    let text = good.to_json_string();

    let garbage: Vec<u8> = (0..rng.random_range(1..4096))
        .map(|_| rng.random())
        .collect();
    let cut = rng.random_range(1..text.len() - 2);
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("garbage.json", garbage, "parsing"),
        ("truncated.json", text.as_bytes()[..cut].to_vec(), "parsing"),
        ("empty.json", Vec::new(), "parsing"),
        (
            "schema99.json",
            text.replacen("\"schema_version\": 1", "\"schema_version\": 99", 1)
                .into_bytes(),
            "schema_version 99 is not supported",
        ),
        (
            "noschema.json",
            b"{\"entries\": []}".to_vec(),
            "schema_version missing is not supported",
        ),
        (
            "schemastr.json",
            b"{\"schema_version\": \"1\", \"entries\": []}".to_vec(),
            "schema_version \"1\"",
        ),
        (
            "wrongshape.json",
            b"{\"schema_version\": 1, \"entries\": 5}".to_vec(),
            "parsing",
        ),
        (
            "array.json",
            b"[1, 2, 3]".to_vec(),
            "schema_version missing",
        ),
    ];
    for (name, bytes, needle) in cases {
        let p = dir.path().join(name);
        std::fs::write(&p, &bytes).unwrap();
        let (t, warning) = TuningTable::load_or_empty(&p);
        assert!(t.is_empty(), "{name}");
        let w = warning.unwrap_or_else(|| panic!("{name}: no warning"));
        assert!(
            w.starts_with("warning: ignoring tuning table"),
            "{name}: {w}"
        );
        assert!(w.contains(name) && w.contains(needle), "{name}: {w}");
        assert!(w.contains("default variants"), "{name}: {w}");
        // Lookup on the ignored table falls back to the default, no panic.
        assert_eq!(t.select(&h100(), &set, &ref_bucket()).variant, id("a"));
        // Strict load (import) is an error that names the file.
        let err = TuningTable::load(&p).unwrap_err();
        assert!(err.to_string().contains(name), "{name}: {err}");
        // One warning per path per process.
        let mut warnings = Vec::new();
        for _ in 0..3 {
            let t = TuningTable::open_with(&p, &mut |w| warnings.push(w.to_string()));
            assert!(t.is_empty());
        }
        assert_eq!(warnings.len(), 1, "{name}: {warnings:?}");
    }
    // Wrong schema is its own error variant.
    let p = dir.path().join("schema99.json");
    assert!(matches!(
        TuningTable::load(&p),
        Err(Error::TuneSchema { expected: 1, .. })
    ));
    // A missing file is an empty table, silently.
    let (t, w) = TuningTable::load_or_empty(&dir.path().join("absent.json"));
    assert!(t.is_empty() && w.is_none());
    // A directory where the file should be: unreadable, warning, no crash.
    std::fs::create_dir(dir.path().join("isdir.json")).unwrap();
    let (t, w) = TuningTable::load_or_empty(&dir.path().join("isdir.json"));
    assert!(t.is_empty() && w.is_some());

    // Saving over a corrupt table replaces it.
    let p = dir.path().join("truncated.json");
    let s = good.save_merged(&p).unwrap();
    assert_eq!(s.added, 1);
    assert_eq!(TuningTable::load(&p).unwrap().len(), 1);
}

#[test]
fn unknown_fields_and_missing_optional_fields_are_accepted() {
    let (e, set) = tuned_entry(&std_spec(), None);
    let mut v = serde_json::to_value(&e).unwrap();
    let obj = v.as_object_mut().unwrap();
    for k in [
        "workload",
        "method",
        "tritonrt_version",
        "tuned_at_unix_s",
        "excluded",
    ] {
        obj.remove(k);
    }
    obj.insert("from_the_future".into(), serde_json::json!({"x": 1}));
    let doc = serde_json::json!({"schema_version": 1, "entries": [v], "also_new": true});
    let t = TuningTable::from_json_bytes(doc.to_string().as_bytes(), Path::new("f.json"), true)
        .unwrap();
    assert_eq!(t.select(&h100(), &set, &ref_bucket()).variant, id("b"));
    assert!(t.entries()[0].excluded.is_empty());
    // Unknown exclusion reasons from a newer build read as Other.
    let mut v = serde_json::to_value(&e).unwrap();
    v["excluded"][0]["reason"] = serde_json::json!("too_hot");
    let doc = serde_json::json!({"schema_version": 1, "entries": [v]});
    let t = TuningTable::from_json_bytes(doc.to_string().as_bytes(), Path::new("f.json"), true)
        .unwrap();
    assert_eq!(t.entries()[0].excluded[0].reason, ExclusionReason::Other);
}

#[test]
fn summary_lists_winner_per_bucket() {
    let (e1, _) = tuned_entry(&std_spec(), None);
    let large = bucket_for(KERNEL, &["fp32"], 90, &Workload::large().features()).unwrap();
    let (e2, _) = tuned_entry(&std_spec(), Some(large.clone()));
    let s = render_summary(&[e2, e1]);
    let lines: Vec<&str> = s.lines().collect();
    assert_eq!(lines.len(), 3, "{s}");
    assert!(
        lines[1].contains("rows<=128") && lines[1].contains(&id("b")),
        "{s}"
    );
    assert!(lines[2].contains("rows<=32"), "{s}");
    assert!(lines[1].contains("NVIDIA H100"), "{s}");
}

// ---------------------------------------------------------------------------------
// The CLI, without a GPU
// ---------------------------------------------------------------------------------

fn tritonrt(args: &[&str], cache: &Path) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tritonrt"))
        .args(args)
        .env("TRITONRT_CACHE_DIR", cache)
        .env_remove("TRITONRT_TUNING_TABLE")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn cli_import_export_show_without_gpu() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let (e, _) = tuned_entry(&std_spec(), None);
    let mut t = TuningTable::new();
    t.insert(e).unwrap();
    let shipped = dir.path().join("shipped.json");
    t.save(&shipped).unwrap();

    let (code, out, err) = tritonrt(&["autotune", "--import", shipped.to_str().unwrap()], &cache);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("imported 1 entries") && out.contains("1 added"),
        "{out}"
    );
    let default_table = cache.join("tuning.json");
    assert_eq!(
        TuningTable::load(&default_table).unwrap().entries(),
        t.entries()
    );

    let exported = dir.path().join("out").join("export.json");
    std::fs::create_dir_all(exported.parent().unwrap()).unwrap();
    let (code, out, err) = tritonrt(
        &["autotune", "--export", exported.to_str().unwrap(), "--show"],
        &cache,
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("exported 1 entries"), "{out}");
    assert!(out.contains(&id("b")) && out.contains("rows<=32"), "{out}");
    assert_eq!(
        std::fs::read(&exported).unwrap(),
        std::fs::read(&default_table).unwrap()
    );

    // Import of a corrupt table: a clear error naming the file, exit code 2, table kept.
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, b"{\"schema_version\": 7}").unwrap();
    let (code, _, err) = tritonrt(&["autotune", "--import", bad.to_str().unwrap()], &cache);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("bad.json") && err.contains("schema_version 7"),
        "{err}"
    );
    assert_eq!(TuningTable::load(&default_table).unwrap().len(), 1);

    // --show on a corrupt table: one warning, no crash.
    let (code, out, err) = tritonrt(
        &["autotune", "--show", "--table", bad.to_str().unwrap()],
        &cache,
    );
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(
        err.matches("warning: ignoring tuning table").count(),
        1,
        "{err}"
    );
    assert!(out.contains("0 entries"), "{out}");

    // Tuning needs a GPU: a clear error, not a panic.
    let (code, _, err) = tritonrt(&["autotune", "--workload", "reference"], &cache);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("needs a CUDA device"), "{err}");
    let (code, _, err) = tritonrt(&["autotune", "--workload", "1,32,5,100,128"], &cache);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("H % H_kv"), "{err}");
    // Export with no table yet says what to do.
    let (code, _, err) = tritonrt(
        &[
            "autotune",
            "--export",
            dir.path().join("x.json").to_str().unwrap(),
        ],
        &dir.path().join("emptycache"),
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("run `tritonrt autotune` first"), "{err}");

    let (code, out, _) = tritonrt(&["autotune", "--help"], &cache);
    assert_eq!(code, 0);
    for flag in [
        "--kernel",
        "--workload",
        "--repeats",
        "--warmup",
        "--export",
        "--import",
        "--table",
        "--device",
        "--ptx-cache",
        "--tune",
        "--show",
    ] {
        assert!(out.contains(flag), "--help lacks {flag}");
    }
}
