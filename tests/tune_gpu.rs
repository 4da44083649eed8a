//! The autotuner's GPU backend.
//!
//! Without a GPU (this machine, CI): the candidate set read from the fixture manifest
//! (sm_90a variants on cc 9.0, the portable sm_80 PTX elsewhere, the artifact hash that
//! is actually loaded), unknown kernels named with the tunable ones, and
//! `tritonrt autotune` / `gpu_targets` refusing with `TuneNoDevice` when no device can be
//! used. The GPU test prints `SKIP: ...` and returns.
//!
//! On a GPU (with a ptx_cache holding the PQ kernels: `TRITONRT_PTX_CACHE`, else the
//! crate's `ptx_cache/`): autotunes a small random GQA workload (fresh seed, odd or even
//! `S`) for `pq_score_kernel_v6` and the workload's select kernel into a temporary
//! tuning table (`TRITONRT_CACHE_DIR` = a temp dir), then checks
//! - every candidate is either timed or excluded, a winner exists and is timed, and no
//!   candidate was excluded for a wrong output (every compiled variant is correct);
//! - every timed candidate, run again, matches the default variant on the check sets;
//! - the winner and the default against CPU f64 references on fresh inputs: v6 scores
//!   (NaN-poisoned outputs, odd `n`, an MQA stride-0 centroid view) and whole decode
//!   steps by the spec's check;
//! - the indexer runs and reports the table's choice: the tuned select winner, a crafted
//!   entry's non-default winner (origin `table`), the default for a stale entry and for a
//!   corrupt table (origin `default`);
//! - one step kernel (`pq_emit` of a small radix-select step) tuned into a table file:
//!   the entry's winner is the variant the indexer then launches and reports (origin
//!   `table`), a crafted non-default winner likewise, an override wins over the table,
//!   and every such step passes the spec's check.

#[macro_use]
mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use rand::{Rng, SeedableRng};
use tritonrt::abi::KernelArg;
use tritonrt::artifact::ArtifactStore;
use tritonrt::driver::Kernel;
use tritonrt::pq::gpu::{
    execute_with_path, open_runtime, select_kernel_name, KernelChoice, SelectPath, VariantChoice,
    VariantOrigin,
};
use tritonrt::pq::tune::{
    candidate_set, device_key, gpu_targets, gpu_targets_on, GpuRequest, StepWorkload, SCORE_V6,
};
use tritonrt::pq::Workload;
use tritonrt::pq::{check, PqInputs};
use tritonrt::runtime::Runtime;
use tritonrt::tune::{tune, ExclusionReason, OutputCheck, TuneSettings, TuningEntry, TuningTable};
use tritonrt::Error;

fn fixtures() -> PathBuf {
    std::env::var_os("TRITONRT_TEST_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures"))
}

fn ptx_cache() -> PathBuf {
    std::env::var_os("TRITONRT_PTX_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("ptx_cache"))
}

fn fresh_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

#[test]
fn candidate_set_takes_the_variants_loaded_on_the_device() {
    let store = ArtifactStore::open(fixtures().join("ptx_cache")).unwrap();
    let sm90 = candidate_set(&store, "axpy_kernel", (9, 0)).unwrap();
    assert_eq!(sm90.candidates().len(), 1);
    let c = sm90.default_candidate();
    let v = store.variant(&c.id).unwrap();
    assert_eq!(v.arch, 90, "{}", c.id);
    assert_eq!(&c.artifact_sha256, &v.cubin.as_ref().unwrap().sha256);
    assert_eq!(c.source_hash, v.source_hash);

    // another GPU JITs the portable PTX: the sm_80 variant, keyed by the PTX's hash
    let sm86 = candidate_set(&store, "axpy_kernel", (8, 6)).unwrap();
    let c86 = sm86.default_candidate();
    let v86 = store.variant(&c86.id).unwrap();
    assert_eq!(v86.arch, 80, "{}", c86.id);
    assert_eq!(c86.artifact_sha256, v86.ptx.sha256);
    assert_ne!(sm90.checksum(), sm86.checksum());

    let e = candidate_set(&store, "pq_score_kernel_v7", (9, 0)).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("pq_score_kernel_v7") && msg.contains("tunable kernels"),
        "{msg}"
    );
}

/// On the real ptx_cache (when present): every tunable kernel has a candidate set on
/// cc 9.0 made of exactly its sm_90a variants, keyed by their cubins, with the manifest
/// default; the kernels tuned by default for each workload are all tunable.
#[test]
fn candidate_sets_of_the_pq_kernels() {
    let dir = ptx_cache();
    let Ok(store) = ArtifactStore::open(&dir) else {
        skip!(
            "candidate_sets_of_the_pq_kernels: no ptx_cache at {}",
            dir.display()
        );
        return;
    };
    if store.variants(SCORE_V6).is_empty() {
        skip!(
            "candidate_sets_of_the_pq_kernels: {} has no PQ kernels",
            dir.display()
        );
        return;
    }
    let names = tritonrt::pq::tune::tunable_kernels(&store);
    for k in [
        "pq_emit.m2.w_bf16",
        "pq_rsel.m2.q_bf16",
        "pq_thresh.m2.q_bf16",
        "pq_index.m2.q_fp32.w_fp32",
        "pq_wfill.w_fp32",
        "pq_quant.a16.k_bf16",
        "pq_select.h128.q_fp32.w_fp32",
    ] {
        assert!(names.iter().any(|n| n == k), "{k} not in {names:?}");
    }
    for k in &names {
        let set = candidate_set(&store, k, (9, 0)).unwrap();
        let all90 = store.variants(k).iter().filter(|v| v.arch == 90).count();
        assert_eq!(set.candidates().len(), all90, "{k}");
        for c in set.candidates() {
            let v = store.variant(&c.id).unwrap();
            assert_eq!(v.arch, 90);
            assert_eq!(c.is_default, v.default, "{}", c.id);
            assert_eq!(&c.artifact_sha256, &v.cubin.as_ref().unwrap().sha256);
        }
    }
    let v6 = candidate_set(&store, SCORE_V6, (9, 0)).unwrap();
    assert!(
        v6.candidates().len() >= 5,
        "v6 has {} variants",
        v6.candidates().len()
    );
}

#[test]
fn gpu_targets_without_a_usable_device_is_tune_no_device() {
    let req = GpuRequest {
        device: 999,
        ptx_cache: fixtures().join("ptx_cache"),
        kernels: vec![SCORE_V6.into()],
        workloads: vec![Workload::reference().into()],
        seed: 1,
        new_keys: 1,
        table: None,
    };
    match gpu_targets(&req) {
        Err(Error::TuneNoDevice { reason }) => {
            assert!(reason.contains("device 999"), "{reason}");
            assert!(reason.contains(SCORE_V6), "{reason}");
        }
        other => panic!("expected TuneNoDevice, got {other:?}"),
    }
}

fn dptr<T>(s: &CudaSlice<T>, st: &Arc<CudaStream>) -> u64 {
    s.device_ptr(st).0
}

/// Launch v6 variant `id` on fresh inputs with an MQA centroid view (head stride 0) and
/// an odd `n`, and compare with the CPU f64 reference. Returns the number of scores.
fn check_v6_against_cpu(rt: &Arc<Runtime>, id: &str, seed: u64) -> usize {
    let k: Arc<Kernel> = rt.kernel(id).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let (b, h, m, ds, kk) = (2usize, 3usize, 2usize, 64usize, 64usize);
    let n = 2 * rng.random_range(700..1500) + 1;
    let normal = |rng: &mut rand::rngs::StdRng, len: usize| -> Vec<f32> {
        (0..len).map(|_| rng.random_range(-2.0f32..2.0)).collect()
    };
    let q = normal(&mut rng, b * h * m * ds);
    let cent = normal(&mut rng, b * m * kk * ds); // [B, 1, M, K, d_s]: shared by all heads
    let codes: Vec<i64> = (0..b * n * h * m)
        .map(|_| rng.random_range(0..kk as i64))
        .collect();
    let st = rt.device().new_stream().unwrap();
    let qd = st.clone_htod(&q).unwrap();
    let cd = st.clone_htod(&cent).unwrap();
    let cbd = st.clone_htod(&codes).unwrap();
    let pad = 64;
    let sd = st.clone_htod(&vec![f32::NAN; b * h * n + pad]).unwrap();
    let bk = k.variant().constexprs["BLOCK_KEYS"].as_u64().unwrap() as usize;
    let i64a = |v: usize| KernelArg::I64(v as i64);
    let named = [
        ("queries_ptr", KernelArg::RawPtr(dptr(&qd, &st))),
        ("centroids_ptr", KernelArg::RawPtr(dptr(&cd, &st))),
        ("codebook_ptr", KernelArg::RawPtr(dptr(&cbd, &st))),
        ("scores_ptr", KernelArg::RawPtr(dptr(&sd, &st))),
        ("b", KernelArg::I32(b as i32)),
        ("h", KernelArg::I32(h as i32)),
        ("n_subvec", KernelArg::I32(m as i32)),
        ("subvec_d", KernelArg::I32(ds as i32)),
        ("n_clustered", KernelArg::I32(n as i32)),
        ("q_stride_b", i64a(h * m * ds)),
        ("q_stride_h", i64a(m * ds)),
        ("q_stride_subvec", i64a(ds)),
        ("q_stride_d", i64a(1)),
        ("c_stride_b", i64a(m * kk * ds)),
        ("c_stride_h", i64a(0)),
        ("c_stride_subvec", i64a(kk * ds)),
        ("c_stride_cent", i64a(ds)),
        ("c_stride_d", i64a(1)),
        ("cb_stride_b", i64a(n * h * m)),
        ("cb_stride_h", i64a(m)),
        ("cb_stride_subvec", i64a(1)),
        ("cb_stride_clustered", i64a(h * m)),
        ("s_stride_b", i64a(h * n)),
        ("s_stride_h", i64a(n)),
        ("s_stride_clustered", i64a(1)),
    ];
    let args: Vec<KernelArg> = k
        .variant()
        .signature
        .iter()
        .map(|a| named.iter().find(|(nm, _)| *nm == a.name).unwrap().1)
        .collect();
    let grid = [(b * h * n.div_ceil(bk)) as u32, 1, 1];
    // SAFETY: every buffer is allocated above with the sizes the strides describe
    // (centroids through a stride-0 head view of [B, 1, M, K, d_s]), codes are in 0..K,
    // the kernel writes scores j < n of each [B, H, n] row; all on `st`.
    unsafe { k.launch_raw(&st, grid, &args) }.unwrap();
    st.synchronize().unwrap();
    let got = st.clone_dtoh(&sd).unwrap();
    st.synchronize().unwrap();
    let mut bad = 0;
    for bi in 0..b {
        for hi in 0..h {
            for j in 0..n {
                let mut want = 0f64;
                for mi in 0..m {
                    let c = codes[((bi * n + j) * h + hi) * m + mi] as usize;
                    for d in 0..ds {
                        want += q[((bi * h + hi) * m + mi) * ds + d] as f64
                            * cent[((bi * m + mi) * kk + c) * ds + d] as f64;
                    }
                }
                let g = got[(bi * h + hi) * n + j] as f64;
                let close = (g - want).abs() <= 1e-3 + 1e-5 * want.abs(); // false for NaN
                if !close {
                    bad += 1;
                    if bad <= 3 {
                        eprintln!("{id}: score[{bi},{hi},{j}] = {g}, CPU f64 {want}");
                    }
                }
            }
        }
    }
    assert_eq!(
        bad, 0,
        "{id}: {bad} scores differ from the CPU f64 reference"
    );
    assert!(
        got[b * h * n..].iter().all(|x| x.is_nan()),
        "{id} wrote past the scores"
    );
    b * h * n
}

fn check_entry(entry: &TuningEntry, ids: &[String]) {
    let timed: Vec<&str> = entry.timings.iter().map(|t| t.id.as_str()).collect();
    let excluded: Vec<&str> = entry.excluded.iter().map(|x| x.id.as_str()).collect();
    for id in ids {
        assert!(
            timed.contains(&id.as_str()) ^ excluded.contains(&id.as_str()),
            "{}: candidate {id} must be timed or excluded, exactly once",
            entry.kernel
        );
    }
    assert_eq!(timed.len() + excluded.len(), ids.len(), "{}", entry.kernel);
    assert!(
        timed.contains(&entry.winner.as_str()),
        "winner {}",
        entry.winner
    );
    assert!(timed.contains(&entry.default_variant.as_str()));
    for x in &entry.excluded {
        assert!(
            !matches!(
                x.reason,
                ExclusionReason::WrongOutput | ExclusionReason::CheckFailed
            ),
            "{}: variant {} gave a wrong output: {}",
            entry.kernel,
            x.id,
            x.detail
        );
    }
    for t in &entry.timings {
        assert!(
            t.median_us > 0.0 && t.min_us <= t.median_us && t.median_us <= t.max_us,
            "{t:?}"
        );
    }
}

#[test]
fn autotune_small_workload_on_gpu() {
    let ptx = ptx_cache();
    let tmp = tempfile::tempdir().unwrap();
    // Before the runtime opens the cubin cache: the table and cubins go to the temp dir.
    std::env::set_var("TRITONRT_CACHE_DIR", tmp.path());
    std::env::remove_var(tritonrt::pq::tune::TABLE_ENV);
    let rt = match open_runtime(0, &ptx) {
        Ok(Ok(rt)) => rt,
        Ok(Err(why)) => {
            skip!("autotune_small_workload_on_gpu: no CUDA device: {why}");
            return;
        }
        Err(e) => {
            if ptx.join("manifest.json").exists() {
                panic!("opening the runtime on {}: {e}", ptx.display());
            }
            skip!(
                "autotune_small_workload_on_gpu: no ptx_cache at {} ({e}); set \
                 TRITONRT_PTX_CACHE",
                ptx.display()
            );
            return;
        }
    };
    if rt.store().variants(SCORE_V6).is_empty() {
        skip!(
            "autotune_small_workload_on_gpu: {} has no PQ kernels",
            ptx.display()
        );
        return;
    }
    let seed = fresh_seed();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let s = rng.random_range(5000..9000);
    let w: Workload = format!("2,8,4,{s},128").parse().unwrap();
    let cfg = w.config();
    let shape = w.shape();
    let select = select_kernel_name(&cfg, shape.s).unwrap();
    eprintln!("autotune test on {}: {w}, seed {seed}", rt.device().name());
    let req = GpuRequest {
        device: 0,
        ptx_cache: ptx.clone(),
        kernels: vec![SCORE_V6.to_string(), "pq_select".to_string()],
        workloads: vec![w.clone().into()],
        seed,
        new_keys: 1,
        table: None,
    };
    let session = gpu_targets_on(rt.clone(), &req).unwrap();
    assert_eq!(session.targets.len(), 2);
    assert_eq!(session.device, device_key(rt.device()));
    let settings = TuneSettings {
        warmup: 2,
        repeats: 12,
        launches_per_sample: 3,
        rounds: 2,
        progress: false,
        ..TuneSettings::default()
    };
    let table_path = tmp.path().join("tuning.json");
    let mut entries = Vec::new();
    for mut target in session.targets {
        let set = target.candidates().clone();
        let ids: Vec<String> = set.candidates().iter().map(|c| c.id.clone()).collect();
        let entry = tune(target.as_mut(), &session.device, &settings).unwrap();
        eprint!("{}", tritonrt::tune::render_report(&entry));
        assert_eq!(entry.kernel, set.kernel());
        check_entry(&entry, &ids);
        // every timed candidate, run again, still matches the default on the check sets
        let last = target.input_sets() - 1;
        for t in &entry.timings {
            let c = set.get(&t.id).unwrap();
            for s in [0, last] {
                target.run(c, s).unwrap();
                assert_eq!(
                    target.output_matches_default(c, s).unwrap(),
                    OutputCheck::Matches,
                    "{} on input set {s}",
                    c.id
                );
            }
        }
        let mut one = TuningTable::new();
        one.insert(entry.clone()).unwrap();
        one.save_merged(&table_path).unwrap();
        entries.push(entry);
    }
    assert_eq!(TuningTable::load(&table_path).unwrap().len(), 2);

    // v6: the winner and the default against the CPU f64 reference
    let v6 = entries.iter().find(|e| e.kernel == SCORE_V6).unwrap();
    for id in [&v6.winner, &v6.default_variant] {
        let n = check_v6_against_cpu(&rt, id, seed ^ 0x5eed);
        eprintln!("{id}: {n} scores match the CPU f64 reference");
    }

    // select: whole decode steps with the winner and the default, by the spec's check
    let sel = entries.iter().find(|e| e.kernel == select).unwrap();
    let inputs = PqInputs::random(
        &cfg,
        shape,
        PqInputs::default_n_cached(&cfg, shape.s),
        seed ^ 0xfeed,
    )
    .unwrap();
    // the chunked path (where pq_select runs), the table consulted as the runtime does
    let run = |choice: &KernelChoice| {
        let ex = execute_with_path(
            &rt,
            &cfg,
            &inputs,
            choice,
            SelectPath::Chunked,
            None,
            0,
            false,
        )
        .unwrap();
        assert!(ex.graph_matches, "graph replay differs");
        let report = check(&cfg, &inputs, &ex.output);
        assert!(report.passed(), "{:?}: {report}", ex.kernels);
        let k = reported(&ex.kernels, &select);
        assert_eq!(ex.select_variant, k.variant);
        (k, ex.output)
    };
    let mut outs = Vec::new();
    for id in [&sel.winner, &sel.default_variant] {
        let (k, out) = run(&KernelChoice::manifest_defaults().with_variant(&select, id));
        assert_eq!((&k.variant, k.origin), (id, VariantOrigin::Override));
        outs.push(out);
    }
    assert_eq!(outs[0].sparse_len, outs[1].sparse_len);
    assert_eq!(outs[0].codes, outs[1].codes);

    // the launch-time lookup: the runtime's table ($TRITONRT_CACHE_DIR/tuning.json)
    let (k, _) = run(&KernelChoice::new());
    assert_eq!((&k.variant, k.origin), (&sel.winner, VariantOrigin::Table));
    let other = sel
        .timings
        .iter()
        .find(|t| t.id != sel.default_variant)
        .map(|t| t.id.clone());
    if let Some(other) = other {
        let mut crafted = sel.clone();
        crafted.winner = other.clone();
        let mut t = TuningTable::new();
        t.insert(crafted.clone()).unwrap();
        let (k, _) = run(&KernelChoice::new().with_table(Arc::new(t)));
        assert_eq!((&k.variant, k.origin), (&other, VariantOrigin::Table));
        let mut stale = crafted;
        stale.kernel_hash = "0".repeat(64);
        let mut t = TuningTable::new();
        t.insert(stale).unwrap();
        let (k, _) = run(&KernelChoice::new().with_table(Arc::new(t)));
        assert_eq!(
            (&k.variant, k.origin),
            (&sel.default_variant, VariantOrigin::Default)
        );
    } else {
        eprintln!("note: {select} has a single timed variant; crafted-entry lookup not run");
    }
    std::fs::write(&table_path, b"{ not json").unwrap();
    let (k, _) = run(&KernelChoice::new().with_table_file(&table_path));
    assert_eq!(
        (&k.variant, k.origin),
        (&sel.default_variant, VariantOrigin::Default)
    );
}

/// The entry of `kernel` in a step's kernel report (it must be there).
fn reported(kernels: &[VariantChoice], kernel: &str) -> VariantChoice {
    kernels
        .iter()
        .find(|k| k.kernel == kernel)
        .unwrap_or_else(|| panic!("{kernel} not among the step's kernels {kernels:?}"))
        .clone()
}

/// One step kernel tuned on a small radix-select step (bf16, M=2, bits=8): the step
/// launches pq_rsel and pq_emit; pq_emit (TILE x warps variants) is tuned into
/// a table file, then the indexer launches and reports the table's choice.
#[test]
fn tune_one_step_kernel_reports_and_uses_it() {
    let ptx = ptx_cache();
    let tmp = tempfile::tempdir().unwrap();
    let rt = match open_runtime(0, &ptx) {
        Ok(Ok(rt)) => rt,
        Ok(Err(why)) => {
            skip!("tune_one_step_kernel_reports_and_uses_it: no CUDA device: {why}");
            return;
        }
        Err(e) => {
            skip!(
                "tune_one_step_kernel_reports_and_uses_it: no usable ptx_cache at {} ({e})",
                ptx.display()
            );
            return;
        }
    };
    let emit = "pq_emit.m2.w_bf16";
    let cc = rt.device().cc();
    if candidate_set(rt.store(), emit, cc).map_or(true, |c| c.candidates().len() < 2) {
        skip!("tune_one_step_kernel_reports_and_uses_it: {emit} has fewer than 2 variants here");
        return;
    }
    let seed = fresh_seed();
    let w = StepWorkload {
        name: "small-m2b8".into(),
        cfg: tritonrt::pq::matrix::practical_config(2, 8, 700),
        shape: tritonrt::pq::Shape {
            b: 1,
            h: 8,
            h_kv: 2,
            s: 8192 + (seed % 512) as usize,
            d: 128,
        },
    };
    let (cfg, shape) = (w.cfg, w.shape);
    eprintln!(
        "step-kernel tuning test on {}: {w}, seed {seed}",
        rt.device().name()
    );
    let table_path = tmp.path().join("tuning.json");
    let req = GpuRequest {
        device: 0,
        ptx_cache: ptx.clone(),
        kernels: vec![],
        workloads: vec![w.clone()],
        seed,
        new_keys: 1,
        table: Some(table_path.clone()),
    };
    let session = gpu_targets_on(rt.clone(), &req).unwrap();
    let kernels: Vec<String> = session
        .targets
        .iter()
        .map(|t| t.candidates().kernel().to_string())
        .collect();
    for n in &session.notes {
        eprintln!("note: {n}");
    }
    assert!(kernels.iter().any(|k| k == emit), "tuned: {kernels:?}");
    let settings = TuneSettings {
        warmup: 2,
        repeats: 8,
        launches_per_sample: 3,
        rounds: 2,
        progress: false,
        ..TuneSettings::default()
    };
    let mut entry = None;
    for mut target in session.targets {
        if target.candidates().kernel() != emit {
            continue;
        }
        let ids: Vec<String> = target
            .candidates()
            .candidates()
            .iter()
            .map(|c| c.id.clone())
            .collect();
        let e = tune(target.as_mut(), &session.device, &settings).unwrap();
        eprint!("{}", tritonrt::tune::render_report(&e));
        check_entry(&e, &ids);
        let mut one = TuningTable::new();
        one.insert(e.clone()).unwrap();
        one.save_merged(&table_path).unwrap();
        entry = Some(e);
    }
    let entry = entry.unwrap();

    let inputs = PqInputs::random(
        &cfg,
        shape,
        PqInputs::default_n_cached(&cfg, shape.s),
        seed ^ 0xbeef,
    )
    .unwrap();
    let run = |choice: &KernelChoice| {
        let ex = execute_with_path(&rt, &cfg, &inputs, choice, SelectPath::Auto, None, 0, false)
            .unwrap();
        assert!(ex.range_path, "the radix-select step ran: {:?}", ex.kind);
        assert!(ex.graph_matches, "graph replay differs");
        let report = check(&cfg, &inputs, &ex.output);
        assert!(report.passed(), "{:?}: {report}", ex.kernels);
        for k in ["pq_rsel.m2.q_bf16", emit] {
            reported(&ex.kernels, k);
        }
        reported(&ex.kernels, emit)
    };
    // the tuned winner runs, from the table (the default too when it won)
    let k = run(&KernelChoice::new().with_table_file(&table_path));
    assert_eq!(
        (&k.variant, k.origin),
        (&entry.winner, VariantOrigin::Table)
    );
    // a crafted entry's other variant runs (and is reported as the table's)
    if let Some(other) = entry.timings.iter().find(|t| t.id != entry.winner) {
        let mut crafted = entry.clone();
        crafted.winner = other.id.clone();
        let mut t = TuningTable::new();
        t.insert(crafted).unwrap();
        let t = Arc::new(t);
        let k = run(&KernelChoice::new().with_table(t.clone()));
        assert_eq!((&k.variant, k.origin), (&other.id, VariantOrigin::Table));
        // an override wins over the table
        let k = run(&KernelChoice::new()
            .with_table(t)
            .with_variant(emit, &entry.default_variant));
        assert_eq!(
            (&k.variant, k.origin),
            (&entry.default_variant, VariantOrigin::Override)
        );
    }
    // no table: the manifest default
    let k = run(&KernelChoice::manifest_defaults());
    assert_eq!(
        (&k.variant, k.origin),
        (&entry.default_variant, VariantOrigin::Default)
    );
    // an override of a kernel this config does not load is refused, naming it
    let bad = KernelChoice::manifest_defaults()
        .with_variant("pq_hist.m2.q_bf16.w_bf16", "pq_hist.m2.q_bf16.w_bf16.x");
    let e = execute_with_path(&rt, &cfg, &inputs, &bad, SelectPath::Auto, None, 0, false)
        .unwrap_err()
        .to_string();
    assert!(e.contains("pq_hist.m2.q_bf16.w_bf16"), "{e}");
}
