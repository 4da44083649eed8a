//! Seeded random configs and shapes on every step path, against the CPU reference (f64)
//! by the spec's rule: shapes, sizes and configs no other test lists. Each case draws
//! `D`, `M` (a divisor of `D`, 1..8), bits 1..8, the query/key and weight dtypes, the
//! metric, `B`, `H_kv`, the GQA group, `S` (short sequences included), sink, window and
//! heavy (counts or ratios of `S`, heavy from 0 to past `n`), `init_offset` and how many
//! keys are new (one, a few, or every one) and, on random inputs, whether the queries are
//! scaled by 1024 or queries and centroids share a large component (scores far from zero,
//! past the ranks' linear range), then runs the step under `Auto` and under every path a
//! caller can force. Each run poisons its outputs, must pass the spec's rule
//! (exactly on well-separated inputs, every other case) and give a bit-identical graph
//! replay; a forced path may be refused only where the chunked kernel has no top-k width
//! for the heavy size, and the error must name `heavy_size`. Ragged batches of such
//! configs, rows of random lengths and code counts, run on each ragged path the config
//! takes. The seed is printed (`TRITONRT_TEST_SEED` replays it). Skipped, saying so,
//! without a GPU.

mod common;

use std::sync::Arc;

use rand::{Rng, SeedableRng};
use tritonrt::pq::gpu::{execute_with_path, KernelChoice, SelectPath};
use tritonrt::pq::{check, check_exact, DType, Metric, PqConfig, PqInputs, Shape, Size};
use tritonrt::runtime::Runtime;

fn runtime() -> Option<Arc<Runtime>> {
    common::gpu_runtime("random-config GPU tests")
}

/// Cases drawn (each run on `Auto` and every forced path).
const CASES: usize = 28;

/// Ragged batches drawn (each run on every ragged path its config takes).
const RAGGED_CASES: usize = 12;

fn dtype(rng: &mut impl Rng) -> DType {
    [DType::F32, DType::BF16, DType::F16][rng.random_range(0..3)]
}

/// A size of `S`: a count in `0..=max`, or (one time in four) a ratio with a decimal
/// point's worth of digits, up to `max_ratio`.
fn size(rng: &mut impl Rng, max: usize, max_ratio: f64) -> Size {
    if rng.random_range(0..4) == 0 {
        Size::Ratio((rng.random_range(0.0f64..max_ratio) * 1000.0).round() / 1000.0)
    } else {
        Size::Count(rng.random_range(0..=max))
    }
}

/// One random case: the config, the shape, the keys already quantized, and whether the
/// inputs are well separated (checked exactly).
fn draw(rng: &mut impl Rng, i: usize) -> (PqConfig, Shape, usize, bool) {
    let d = [32usize, 64, 96, 128][rng.random_range(0..4)];
    let ms: Vec<usize> = (1..=8).filter(|m| d.is_multiple_of(*m)).collect();
    let m = ms[rng.random_range(0..ms.len())];
    let bits = rng.random_range(1..=8u32);
    let h_kv = rng.random_range(1..=4usize);
    let g = [1usize, 2, 4][rng.random_range(0..3)];
    let b = rng.random_range(1..=3usize);
    // S: one case in five log-uniform over 16 .. 800 (mostly short sequences), else
    // uniform over 800 .. 24000 (the histogram paths' thresholds and beyond)
    let s = if rng.random_range(0..5) == 0 {
        (16.0f64 * 50.0f64.powf(rng.random_range(0.0..1.0))) as usize
    } else {
        rng.random_range(800..=24000)
    };
    let heavy = match rng.random_range(0..5) {
        0 => Size::Count(rng.random_range(0..=s)), // up to past n
        1 => Size::Ratio((rng.random_range(0.0f64..0.3) * 1000.0).round() / 1000.0),
        2 => Size::Count(rng.random_range(0..=128)),
        _ => Size::Count(rng.random_range(0..=s / 8)),
    };
    let cfg = PqConfig {
        sink_size: size(rng, 300, 0.05),
        window_size: size(rng, 300, 0.05),
        heavy_size: heavy,
        init_offset: rng.random_range(0..=200),
        pq_group_factor: m,
        pq_bits: bits,
        metric: if rng.random_bool(0.5) {
            Metric::Euclidean
        } else {
            Metric::Ip
        },
        input_dtype: dtype(rng),
        weight_dtype: dtype(rng),
    };
    let shape = Shape {
        b,
        h: h_kv * g,
        h_kv,
        s,
        d,
    };
    let n = cfg.n_quantized(s);
    // new keys: one (the decode step), a few, or all of them (the first step)
    let new = match rng.random_range(0..4) {
        0 | 1 => 1,
        2 => rng.random_range(2..=300),
        _ => n,
    }
    .min(n);
    (cfg, shape, n - new, i % 2 == 1)
}

/// How a random case's inputs are reshaped (well-separated cases are left as drawn).
#[derive(Debug, Clone, Copy)]
enum Distort {
    /// Standard normal, as drawn.
    None,
    /// Queries scaled by 1024 (exact in every dtype): scores in the tens of thousands,
    /// past the ranks' linear range (16384).
    Scaled,
    /// Queries and centroids sharing a large component (the first coordinate of each
    /// query subvector 64, of each centroid 300 +- 40): every score far from zero
    /// within some percent.
    Offset,
}

fn distort(rng: &mut impl Rng, cfg: &PqConfig, x: &mut PqInputs, exact: bool) -> Distort {
    if exact {
        return Distort::None;
    }
    let how = [Distort::None, Distort::Scaled, Distort::Offset][rng.random_range(0..3)];
    let (ds, dc) = (cfg.d_sub(x.shape.d), cfg.d_c(x.shape.d));
    match how {
        Distort::None => {}
        Distort::Scaled => x.query.iter_mut().for_each(|v| *v *= 1024.0),
        Distort::Offset => {
            x.query.chunks_mut(ds).for_each(|q| q[0] = 64.0);
            for c in x.centroids.chunks_mut(dc) {
                c[0] = 300.0 + rng.random_range(-40.0f32..40.0);
            }
        }
    }
    how
}

fn describe(cfg: &PqConfig, shape: &Shape, n_cached: usize, exact: bool) -> String {
    format!(
        "B={} H={} H_kv={} S={} D={} M={} bits={} {}/{} {} sink {:?} window {:?} heavy {:?} \
         init_offset {} n_cached {n_cached} {}",
        shape.b,
        shape.h,
        shape.h_kv,
        shape.s,
        shape.d,
        cfg.pq_group_factor,
        cfg.pq_bits,
        cfg.input_dtype.as_str(),
        cfg.weight_dtype.as_str(),
        cfg.metric.as_str(),
        cfg.sink_size,
        cfg.window_size,
        cfg.heavy_size,
        cfg.init_offset,
        if exact { "exact" } else { "random" }
    )
}

#[test]
fn gpu_random_configs_on_every_path() {
    let Some(rt) = runtime() else { return };
    let seed = common::test_seed();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut paths = vec![SelectPath::Auto];
    paths.extend(SelectPath::FORCED);
    let (mut runs, mut refused) = (0usize, 0usize);
    let mut failures = Vec::new();
    for i in 0..CASES {
        let (cfg, shape, n_cached, exact) = draw(&mut rng, i);
        let mut what = describe(&cfg, &shape, n_cached, exact);
        let mut x = common::inputs_for(&cfg, shape, n_cached, exact, seed.wrapping_add(i as u64));
        what += &format!(" {:?}", distort(&mut rng, &cfg, &mut x, exact));
        for &path in &paths {
            let ran = execute_with_path(
                &rt,
                &cfg,
                &x,
                &KernelChoice::manifest_defaults(),
                path,
                None,
                0,
                false,
            );
            match ran {
                Ok(ex) => {
                    runs += 1;
                    let report = if exact {
                        check_exact(&cfg, &x, &ex.output)
                    } else {
                        check(&cfg, &x, &ex.output)
                    };
                    let ok = report.passed() && ex.graph_matches;
                    eprintln!(
                        "{} case {i} {path:?} ran {}: graph {} [{report}] {what}",
                        if ok { "ok  " } else { "FAIL" },
                        ex.kind.name(),
                        if ex.graph_matches {
                            "identical"
                        } else {
                            "DIFFERS"
                        }
                    );
                    if !ok {
                        failures.push(format!("case {i} {path:?}: {what}"));
                    }
                }
                // the chunked kernel is compiled for top-k widths up to 512: a path that
                // falls back to it with more heavy picks is refused, naming the field
                Err(e) if path != SelectPath::Auto && e.to_string().contains("heavy_size") => {
                    refused += 1;
                    eprintln!("refused case {i} {path:?}: {e}");
                }
                Err(e) => {
                    eprintln!("FAIL case {i} {path:?}: {e} ({what})");
                    failures.push(format!("case {i} {path:?}: {what}: {e}"));
                }
            }
        }
    }
    eprintln!(
        "{} passed, {} failed, {refused} refused (heavy above the chunked kernel's width) \
         over {CASES} random cases x {} paths",
        runs.saturating_sub(failures.len()),
        failures.len(),
        paths.len()
    );
    assert!(failures.is_empty(), "failed: {failures:#?}");
    assert!(runs >= CASES, "every case ran at least under Auto");
}

/// Ragged batches of seeded random configs (as [`draw`]'s, `B` 1..6) whose rows have
/// random lengths `1..=S_alloc` (short rows included) and random counts of codes (one new
/// key, a few, or none yet), on each ragged path the config takes (indexed and split
/// where the combination histogram applies, radix always), plain launches and graph
/// replay: each step must pass the ragged checker (every row at its own `S_b` against the
/// CPU reference, exactly on well-separated inputs every other case).
#[test]
fn gpu_random_ragged_batches_on_every_path() {
    use tritonrt::pq::gpu::LaunchMode;
    use tritonrt::pq::plan::{hist_built_for, index_built_for};
    use tritonrt::pq::ragged::{check_ragged, RaggedInputs, RaggedPath};

    let Some(rt) = runtime() else { return };
    let seed = common::test_seed();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0x5eed);
    let (mut runs, mut failures) = (0usize, Vec::new());
    for i in 0..RAGGED_CASES {
        let (cfg, mut shape, _, exact) = draw(&mut rng, i);
        shape.b = rng.random_range(1..=6);
        shape.s = shape.s.max(2);
        let s_alloc = shape.s;
        let lens: Vec<usize> = (0..shape.b)
            .map(|r| match r % 3 {
                0 => s_alloc,
                1 => rng.random_range(1..=s_alloc),
                _ => rng.random_range(s_alloc / 2..=s_alloc).max(1),
            })
            .collect();
        let ncs: Vec<usize> = lens
            .iter()
            .map(|&s| {
                let n = cfg.n_quantized(s);
                match rng.random_range(0..4) {
                    0 | 1 => n.saturating_sub(1),
                    2 => n.saturating_sub(rng.random_range(2..=64)),
                    _ => 0,
                }
            })
            .collect();
        let n_max = ncs.iter().copied().max().unwrap_or(0);
        let what = format!(
            "{} lens {lens:?} n_cached {ncs:?}",
            describe(&cfg, &shape, n_max, exact)
        );
        let mut x = common::inputs_for(&cfg, shape, n_max, exact, seed.wrapping_add(i as u64));
        let what = format!("{what} {:?}", distort(&mut rng, &cfg, &mut x, exact));
        let l: Vec<i64> = lens.iter().map(|&v| v as i64).collect();
        let n: Vec<i64> = ncs.iter().map(|&v| v as i64).collect();
        let rx = RaggedInputs::new(&cfg, x, &l, Some(&n))
            .unwrap_or_else(|e| panic!("ragged inputs for {what}: {e}"));
        let mut paths = vec![RaggedPath::Radix];
        if hist_built_for(&cfg) {
            paths.push(RaggedPath::Split);
        }
        if index_built_for(&cfg) {
            paths.push(RaggedPath::Index);
        }
        let opts = common::check_options(exact);
        for path in paths {
            for mode in [LaunchMode::Launch, LaunchMode::Graph] {
                let ran = (|| -> Result<bool, String> {
                    let (mut ix, dev) = common::ragged_indexer(&rt, &cfg, &rx, Some(path))
                        .map_err(|e| e.to_string())?;
                    ix.step_ragged(dev.query(), dev.key(), &rx.seq_lens, mode)
                        .map_err(|e| e.to_string())?;
                    let out = ix.download_ragged().map_err(|e| e.to_string())?;
                    let report = check_ragged(&cfg, &rx, &out, &opts);
                    eprintln!(
                        "{} ragged case {i} {path:?} {mode:?} [{report}] {what}",
                        if report.passed() { "ok  " } else { "FAIL" }
                    );
                    Ok(report.passed())
                })();
                runs += 1;
                match ran {
                    Ok(true) => {}
                    Ok(false) => {
                        failures.push(format!("ragged case {i} {path:?} {mode:?}: {what}"))
                    }
                    Err(e) => {
                        eprintln!("FAIL ragged case {i} {path:?} {mode:?}: {e} ({what})");
                        failures.push(format!("ragged case {i} {path:?} {mode:?}: {what}: {e}"));
                    }
                }
            }
        }
    }
    eprintln!(
        "{} passed, {} failed over {RAGGED_CASES} random ragged batches",
        runs - failures.len(),
        failures.len()
    );
    assert!(failures.is_empty(), "failed: {failures:#?}");
}
