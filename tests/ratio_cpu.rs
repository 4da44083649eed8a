//! Sizes given as ratios of the sequence length (spec "Sizes given as ratios"; issue 26,
//! item 1) on the CPU: `Size` parsing, printing and serde; resolution per step (the CPU
//! reference, a ragged batch, the plan and the select kernel's name at two `S`); the
//! safetensors metadata round trip; and `tritonrt run` with ratio flags. Refusals name
//! the field, the value and what is allowed.

mod common;

use common::tritonrt;

use std::collections::HashMap;

use rand::{Rng, SeedableRng};
use tritonrt::pq::check::{check_with, CheckMode, CheckOptions};
use tritonrt::pq::gpu::select_kernel_name;
use tritonrt::pq::io::{read_inputs, read_outputs, write_inputs};
use tritonrt::pq::plan::{plan_step, HistFacts, IndexFacts, PlanFacts, SelectPath, StepKind};
use tritonrt::pq::ragged::{check_ragged, reference_step, RaggedInputs};
use tritonrt::pq::{step, PqConfig, PqConfigOverrides, PqInputs, Shape, Size, Workload};

fn rng() -> rand::rngs::StdRng {
    rand::rngs::StdRng::seed_from_u64(common::test_seed())
}

/// `floor(p / 2^e * s)` in integers: the resolution of a ratio that is exact in binary,
/// computed without floating point.
fn floor_binary(p: u64, e: u32, s: usize) -> usize {
    ((p as u128 * s as u128) >> e) as usize
}

// ----------------------------------------------------------------------------------
// Size: parse, print, resolve, serde
// ----------------------------------------------------------------------------------

#[test]
fn sizes_parse_as_counts_or_ratios_and_print_back() {
    for (txt, want) in [
        ("0.1", Size::Ratio(0.1)),
        ("1.0", Size::Ratio(1.0)),
        ("0.0", Size::Ratio(0.0)),
        (" 0.5 ", Size::Ratio(0.5)),
        ("5e-2", Size::Ratio(0.05)),
        (".25", Size::Ratio(0.25)),
        ("0.0921875", Size::Ratio(0.0921875)),
        ("0", Size::Count(0)),
        ("1", Size::Count(1)),
        ("128", Size::Count(128)),
        ("+7", Size::Count(7)),
    ] {
        let got = Size::parse_field("heavy_size", txt).unwrap();
        assert_eq!(got, want, "{txt:?}");
        assert_eq!(txt.parse::<Size>().unwrap(), want, "{txt:?} via FromStr");
        // Display writes what parses back to the same size (a ratio keeps its point)
        let shown = got.to_string();
        assert_eq!(shown.parse::<Size>().unwrap(), got, "{txt:?} -> {shown:?}");
        assert_eq!(got.is_ratio(), matches!(want, Size::Ratio(_)));
    }
    assert_eq!(Size::Ratio(1.0).to_string(), "1.0");
    assert_eq!(Size::Ratio(0.1).to_string(), "0.1");
    assert_eq!(Size::Count(128).to_string(), "128");
    // 1 and 1.0 differ: one key against all of S
    assert_ne!(Size::Count(1), Size::Ratio(1.0));
    assert_ne!(Size::Count(0), Size::Ratio(0.0));
    // random ratios, tiny ones (exponent notation) included, round-trip bit for bit
    let mut r = rng();
    for i in 0..2000 {
        let v: f64 = if i % 4 == 0 {
            r.random::<f64>() * 1e-9
        } else {
            r.random::<f64>()
        };
        let z = Size::ratio("heavy_size", v).unwrap();
        let back = Size::parse_field("heavy_size", &z.to_string()).unwrap();
        match back {
            Size::Ratio(b) => assert_eq!(b.to_bits(), v.to_bits(), "{v:?} -> {z}"),
            Size::Count(_) => panic!("{v:?} printed as {z}, read back as a count"),
        }
        let n: usize = r.random_range(0..1 << 40);
        assert_eq!(
            Size::Count(n).to_string().parse::<Size>().unwrap(),
            Size::Count(n)
        );
    }
}

#[test]
fn ratios_resolve_per_step_as_upstream() {
    // upstream's int(value * S), e.g. the heavy size that keeps 256 keys of sink and
    // window out of a 10 % budget at S = 32768
    assert_eq!(Size::Ratio(0.1).resolve(32768), 3276);
    assert_eq!(Size::Ratio(0.1 - 256.0 / 32768.0).resolve(32768), 3020);
    assert_eq!("0.0921875".parse::<Size>().unwrap().resolve(32768), 3020);
    assert_eq!(Size::Ratio(0.1).resolve(32000), 3200);
    assert_eq!(Size::Ratio(0.1).resolve(9), 0);
    assert_eq!(Size::Ratio(0.0).resolve(1 << 20), 0);
    assert_eq!(Size::Count(128).resolve(5), 128); // a count is itself at every S
    let mut r = rng();
    for _ in 0..5000 {
        let s: usize = r.random_range(1..1 << 24);
        assert_eq!(Size::Ratio(1.0).resolve(s), s);
        // a ratio exact in binary resolves to the integer floor
        let e: u32 = r.random_range(1..30);
        let p: u64 = r.random_range(0..=1u64 << e);
        let v = p as f64 / (1u64 << e) as f64;
        assert_eq!(
            Size::Ratio(v).resolve(s),
            floor_binary(p, e, s),
            "{p}/2^{e} at S={s}"
        );
        // any ratio: at most S, and never decreasing as S grows
        let v: f64 = r.random();
        let (a, b) = (Size::Ratio(v).resolve(s), Size::Ratio(v).resolve(s + 1));
        assert!(a <= s && a <= b && b <= a + 1, "{v} at S={s}: {a}, {b}");
    }
}

#[test]
fn bad_sizes_are_refused_naming_the_field_value_and_range() {
    for (txt, why) in [
        ("-1", "negative"),
        ("-0.1", "negative"),
        ("-0.0", "negative"),
        ("1.5", "above 1.0"),
        ("2.0", "above 1.0"),
        ("1e3", "above 1.0"),
        ("1.0000001", "above 1.0"),
        ("nan", "not a number"),
        ("NaN", "not a number"),
        ("inf", "not a number"),
        ("abc", "not a number"),
        ("0x10", "not a number"),
        ("1.2.3", "not a number"),
        ("", "empty"),
        ("99999999999999999999999", "too large"),
    ] {
        for field in ["sink_size", "window_size", "heavy_size"] {
            let e = Size::parse_field(field, txt).expect_err(txt).to_string();
            assert!(
                e.contains(field) && e.contains(why) && e.contains("[0, 1]"),
                "{field} {txt:?}: {e}"
            );
            if !txt.is_empty() {
                assert!(e.contains(&format!("{field} = {txt}")), "{e}");
            }
        }
    }
    for v in [
        f64::NAN,
        -0.5,
        1.0 + f64::EPSILON,
        f64::INFINITY,
        f64::NEG_INFINITY,
    ] {
        let e = Size::ratio("heavy_size", v)
            .expect_err("bad ratio")
            .to_string();
        assert!(e.contains("heavy_size") && e.contains("[0, 1]"), "{v}: {e}");
    }
    // a config holding a bad ratio (built directly) is refused by validation, by name
    let sh = Shape::reference();
    let base = PqConfig::reference_workload();
    for (c, field) in [
        (
            PqConfig {
                heavy_size: Size::Ratio(1.5),
                ..base
            },
            "heavy_size = 1.5",
        ),
        (
            PqConfig {
                sink_size: Size::Ratio(f64::NAN),
                ..base
            },
            "sink_size = NaN",
        ),
        (
            PqConfig {
                window_size: Size::Ratio(-0.25),
                ..base
            },
            "window_size = -0.25",
        ),
    ] {
        let e = c.validate(&sh).expect_err(field).to_string();
        assert!(e.contains(field) && e.contains("[0, 1]"), "{e}");
    }
    // so is a workload
    let w = Workload {
        heavy: Size::Ratio(3.0),
        ..Workload::reference()
    };
    let e = w.validate().unwrap_err().to_string();
    assert!(e.contains("heavy_size = 3.0"), "{e}");
    // the other config errors name the field, the value and the allowed range too
    let e = PqConfig {
        pq_group_factor: 3,
        ..base
    }
    .validate(&sh)
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("pq_group_factor = 3") && e.contains("D = 128") && e.contains("D % M"),
        "{e}"
    );
    for bits in [0, 9] {
        let e = PqConfig {
            pq_bits: bits,
            ..base
        }
        .validate(&sh)
        .unwrap_err()
        .to_string();
        assert!(
            e.contains(&format!("pq_bits = {bits}")) && e.contains("1..=8"),
            "{e}"
        );
    }
}

#[test]
fn sizes_and_configs_round_trip_through_serde() {
    let c = PqConfig {
        heavy_size: Size::Ratio(0.1),
        window_size: Size::Ratio(1.0),
        sink_size: Size::Count(4),
        ..PqConfig::reference_workload()
    };
    let j = serde_json::to_string(&c).unwrap();
    assert!(
        j.contains("\"heavy_size\":0.1")
            && j.contains("\"window_size\":1.0")
            && j.contains("\"sink_size\":4"),
        "{j}"
    );
    assert_eq!(serde_json::from_str::<PqConfig>(&j).unwrap(), c);
    // strings as files hold them, and refusals
    assert_eq!(
        serde_json::from_str::<Size>("\"0.25\"").unwrap(),
        Size::Ratio(0.25)
    );
    assert_eq!(
        serde_json::from_str::<Size>("\"128\"").unwrap(),
        Size::Count(128)
    );
    for bad in ["1.5", "-3", "\"-0.1\"", "\"x\"", "null"] {
        assert!(serde_json::from_str::<Size>(bad).is_err(), "{bad}");
    }
}

// ----------------------------------------------------------------------------------
// Per-step resolution: the CPU reference, a ragged batch
// ----------------------------------------------------------------------------------

fn small_shape(b: usize, s: usize) -> Shape {
    Shape {
        b,
        h: 4,
        h_kv: 2,
        s,
        d: 16,
    }
}

/// heavy = 0.1, window = 0.03125 (1/32, exact in binary), sink = 4: the reference at two
/// sequence lengths picks floor(0.1 S) heavy keys and floor(S / 32) window keys at each,
/// and its output equals the count config's resolved at that S.
#[test]
fn reference_resolves_a_ratio_at_each_step() {
    let c = PqConfig {
        sink_size: Size::Count(4),
        window_size: Size::Ratio(0.03125),
        heavy_size: Size::Ratio(0.1),
        init_offset: 8,
        pq_bits: 4,
        ..PqConfig::reference_workload()
    };
    let mut r = rng();
    let s1: usize = r.random_range(300..900);
    let s2 = s1 + r.random_range(1..400);
    let mut seen = Vec::new();
    for s in [s1, s2] {
        let sh = small_shape(2, s);
        let x = PqInputs::random(&c, sh, PqInputs::default_n_cached(&c, s), r.random()).unwrap();
        let out = step(&c, &x).unwrap();
        let heavy = (s as f64 * 0.1) as usize; // upstream's int(0.1 * S)
        let window = s >> 5;
        assert!(s > heavy + 8 + 1 + 16, "S={s} must take the long path");
        let total = 4 + heavy + window;
        assert_eq!(out.total, total, "S={s}");
        assert!(out.sparse_len.iter().all(|&l| l == total as i64), "S={s}");
        for b in 0..2 {
            for h in 0..4 {
                assert_eq!(out.heavy_positions(&c, b, h).len(), heavy, "S={s}");
                // the window is the last floor(S / 32) positions
                let row = out.row(b, h);
                assert!(row.ends_with(&((s - window) as i64..s as i64).collect::<Vec<_>>()));
            }
        }
        // the same step with the sizes given as the counts they resolve to
        let counts = c.resolved(s);
        assert_eq!(counts.heavy_size, Size::Count(heavy));
        assert_eq!(counts.window_size, Size::Count(window));
        assert_eq!(step(&counts, &x).unwrap(), out, "S={s}");
        let rep = check_with(
            &c,
            &x,
            &out,
            &CheckOptions {
                mode: CheckMode::Spec,
                ..CheckOptions::default()
            },
        );
        assert!(rep.passed(), "S={s}: {rep}");
        seen.push(heavy);
    }
    assert!(seen[0] < seen[1] || s2 - s1 < 10, "{seen:?}");
    // the short-path threshold moves with S too: heavy + init_offset + 1 + K at that S
    for s in [100, 1000, 10_000] {
        assert_eq!(c.short_threshold(s), s / 10 + 8 + 1 + 16);
    }
}

/// Each entry of a ragged batch resolves the ratio at its own S_b.
#[test]
fn ragged_entries_resolve_at_their_own_length() {
    let c = PqConfig {
        sink_size: Size::Count(8),
        window_size: Size::Count(16),
        heavy_size: Size::Ratio(0.125),
        init_offset: 8,
        pq_bits: 4,
        ..PqConfig::reference_workload()
    };
    let mut r = rng();
    let s_alloc = 1000;
    let lens: Vec<i64> = (0..4)
        .map(|_| r.random_range(200..=s_alloc as i64))
        .collect();
    let n_max = c.n_quantized(s_alloc) - 1;
    let x = PqInputs::random(&c, small_shape(4, s_alloc), n_max, r.random()).unwrap();
    let n_cached: Vec<i64> = lens
        .iter()
        .map(|&s| c.n_quantized(s as usize) as i64 - 1)
        .collect();
    let rx = RaggedInputs::new(&c, x, &lens, Some(&n_cached)).unwrap();
    let out = reference_step(&c, &rx).unwrap();
    for (bi, &s) in lens.iter().enumerate() {
        let heavy = floor_binary(1, 3, s as usize);
        for h in 0..4 {
            assert_eq!(
                out.sparse_len[bi * 4 + h],
                (8 + heavy + 16) as i64,
                "entry {bi} (S_b = {s})"
            );
        }
    }
    let rep = check_ragged(&c, &rx, &out, &CheckOptions::default());
    assert!(rep.passed(), "{rep}");
}

// ----------------------------------------------------------------------------------
// The plan and the select kernel's name with a ratio heavy size
// ----------------------------------------------------------------------------------

fn facts(chunked: Option<usize>, hist: bool) -> PlanFacts {
    PlanFacts {
        sm_count: 132,
        hist: hist.then_some(HistFacts { emit_tile: 2048 }),
        index: Some(IndexFacts {
            wfill: true,
            tp: 256,
            bucket_budget: usize::MAX,
        }),
        bulk_min: 1,
        chunked,
        range: None,
    }
}

#[test]
fn plan_resolves_a_ratio_heavy_and_refuses_what_no_kernel_serves() {
    let c = PqConfig {
        heavy_size: Size::Ratio(0.1),
        ..PqConfig::reference_workload()
    };
    let sh = Shape {
        b: 1,
        h: 32,
        h_kv: 8,
        s: 0,
        d: 128,
    };
    // the kernel an indexer loads: for heavy at its capacity S_alloc
    assert_eq!(
        select_kernel_name(&c, 1000).unwrap(),
        "pq_select.h128.q_fp32.w_fp32"
    );
    assert_eq!(
        select_kernel_name(&c, 2000).unwrap(),
        "pq_select.h256.q_fp32.w_fp32"
    );
    assert_eq!(
        select_kernel_name(&c, 5120).unwrap(),
        "pq_select.h512.q_fp32.w_fp32"
    );
    let e = select_kernel_name(&c, 5130).unwrap_err().to_string();
    assert!(
        e.contains("heavy_size") && e.contains("513") && e.contains("0.1"),
        "{e}"
    );

    let mut r = rng();
    // an indexer of capacity 1280 holds pq_select.h128: steps up to S = 1289 fit it
    let f = facts(Some(128), true);
    for _ in 0..20 {
        let s: usize = r.random_range(500..1290);
        let n = c.n_quantized(s);
        let p = plan_step(&c, &sh, s, n - 1, SelectPath::Chunked, &f).unwrap();
        assert_eq!(p.kind, StepKind::Chunked, "S={s}");
        assert_eq!(p.total, 128 + s / 10 + 128, "S={s}");
    }
    // a later step past it: the chunked path asked for is refused, naming heavy_size,
    // the ratio, the resolved size and the kernel's width
    let s: usize = r.random_range(1290..20_000);
    let n = c.n_quantized(s);
    let e = plan_step(&c, &sh, s, n - 1, SelectPath::Chunked, &f)
        .expect_err("heavy past the loaded width")
        .to_string();
    assert!(
        e.contains("heavy_size")
            && e.contains("0.1")
            && e.contains(&(s / 10).to_string())
            && e.contains("128")
            && e.contains("chunked"),
        "S={s}: {e}"
    );
    // Auto takes the histogram family there instead
    let p = plan_step(&c, &sh, s, n - 1, SelectPath::Auto, &f).unwrap();
    assert!(p.kind.is_hist(), "S={s}: {:?}", p.kind);
    assert_eq!(p.total, 128 + s / 10 + 128);
    // and with no histogram kernel (K^M > 4096) a step that needs chunked is refused
    let e = plan_step(
        &c,
        &sh,
        s,
        n - 1,
        SelectPath::Auto,
        &facts(Some(128), false),
    )
    .expect_err("no kernel for this step")
    .to_string();
    assert!(e.contains("heavy_size") && e.contains("0.1"), "{e}");
    // the short path follows the resolved threshold: heavy(S) + 128 + 1 + 64
    let p = plan_step(&c, &sh, 214, 0, SelectPath::Auto, &f).unwrap();
    assert_eq!(p.kind, StepKind::Short); // 214 <= 21 + 193
    let p = plan_step(&c, &sh, 216, 0, SelectPath::Auto, &f).unwrap();
    assert_ne!(p.kind, StepKind::Short); // 216 > 21 + 193
}

// ----------------------------------------------------------------------------------
// Safetensors metadata
// ----------------------------------------------------------------------------------

/// Rewrite a safetensors file's `__metadata__` key `key` to `value`.
fn set_meta(path: &std::path::Path, key: &str, value: &str) {
    let bytes = std::fs::read(path).unwrap();
    let (_, md) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let mut meta: HashMap<String, String> = md.metadata().clone().unwrap_or_default();
    meta.insert(key.into(), value.into());
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let views: Vec<(String, safetensors::tensor::TensorView)> = st.tensors();
    let out = safetensors::serialize(views, Some(meta)).unwrap();
    std::fs::write(path, out).unwrap();
}

fn meta_of(path: &std::path::Path) -> HashMap<String, String> {
    let bytes = std::fs::read(path).unwrap();
    let (_, md) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    md.metadata().clone().unwrap_or_default()
}

#[test]
fn metadata_round_trips_ratios_and_keeps_integers_counts() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("in.safetensors");
    let mut r = rng();
    let heavy = Size::ratio("heavy_size", r.random_range(0.01..0.2)).unwrap();
    let c = PqConfig {
        sink_size: Size::Count(4),
        window_size: Size::Ratio(1.0),
        heavy_size: heavy,
        init_offset: 8,
        pq_bits: 4,
        ..PqConfig::reference_workload()
    };
    let s = 500;
    let x = PqInputs::random(&c, small_shape(1, s), PqInputs::default_n_cached(&c, s), 5).unwrap();
    write_inputs(&p, &c, &x).unwrap();
    let meta = meta_of(&p);
    assert_eq!(meta["heavy_size"], heavy.to_string());
    assert_eq!(meta["window_size"], "1.0");
    assert_eq!(meta["sink_size"], "4");
    let (back, xb) = read_inputs(&p, &PqConfigOverrides::default()).unwrap();
    assert_eq!(back, c);
    assert_eq!(xb, x);
    // an integer string is a count, as in every file written before ratios
    set_meta(&p, "window_size", "16");
    let (back, _) = read_inputs(&p, &PqConfigOverrides::default()).unwrap();
    assert_eq!(back.window_size, Size::Count(16));
    set_meta(&p, "heavy_size", "0.1");
    let (back, _) = read_inputs(&p, &PqConfigOverrides::default()).unwrap();
    assert_eq!(back.heavy_size, Size::Ratio(0.1));
    // a flag's override replaces the file's value
    let over = PqConfigOverrides {
        heavy_size: Some(Size::Count(32)),
        ..Default::default()
    };
    assert_eq!(
        read_inputs(&p, &over).unwrap().0.heavy_size,
        Size::Count(32)
    );
    // bad values name the key, the value, the allowed forms and the file
    for (key, bad) in [
        ("heavy_size", "1.5"),
        ("sink_size", "-4"),
        ("window_size", "half"),
    ] {
        set_meta(&p, key, bad);
        let e = read_inputs(&p, &PqConfigOverrides::default())
            .expect_err(bad)
            .to_string();
        assert!(
            e.contains(&format!("{key} = {bad}"))
                && e.contains("[0, 1]")
                && e.contains("in.safetensors"),
            "{e}"
        );
        set_meta(&p, key, "8");
    }
}

// ----------------------------------------------------------------------------------
// tritonrt run
// ----------------------------------------------------------------------------------

#[test]
fn cli_run_takes_ratio_sizes() {
    let dir = tempfile::tempdir().unwrap();
    let inp = dir.path().join("in.safetensors");
    let out1 = dir.path().join("out1.safetensors");
    let out2 = dir.path().join("out2.safetensors");
    let mut r = rng();
    let s: usize = r.random_range(600..1200);
    let seed = r.random::<u32>().to_string();
    let s_txt = s.to_string();
    let (code, stdout, stderr) = tritonrt(&[
        "run",
        "--backend",
        "cpu",
        "--seq-len",
        &s_txt,
        "--heads",
        "4",
        "--kv-heads",
        "2",
        "--head-dim",
        "16",
        "--seed",
        &seed,
        "--heavy-size",
        "0.1",
        "--window-size",
        "0.0625",
        "--sink-size",
        "4",
        "--save-input",
        inp.to_str().unwrap(),
        "--output",
        out1.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let (heavy, window) = ((s as f64 * 0.1) as usize, s / 16);
    let total = 4 + heavy + window;
    assert!(
        stdout.contains("sink=4 window=0.0625 heavy=0.1")
            && stdout.contains(&format!("top {heavy} + sink 4 + window {window} = {total}")),
        "{stdout}"
    );
    let o = read_outputs(&out1).unwrap();
    assert_eq!(o.total, total);
    assert!(o.sparse_len.iter().all(|&l| l == total as i64));
    // the saved input carries the ratios; running it again gives the same step
    assert_eq!(meta_of(&inp)["heavy_size"], "0.1");
    assert_eq!(meta_of(&inp)["window_size"], "0.0625");
    let (code, stdout, stderr) = tritonrt(&[
        "run",
        "--backend",
        "cpu",
        "--input",
        inp.to_str().unwrap(),
        "--output",
        out2.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert_eq!(read_outputs(&out2).unwrap(), o);
    // a ratio heavy in the workload string
    let (code, stdout, stderr) = tritonrt(&[
        "run",
        "--backend",
        "cpu",
        "--workload",
        &format!("1,4,2,{s},16,2,6,0.05"),
        "--steps",
        "0",
    ]);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(
        stdout.contains(&format!("top {} + sink 128", (s as f64 * 0.05) as usize)),
        "{stdout}"
    );
}

#[test]
fn cli_refuses_bad_sizes_by_name_and_explains_ratios() {
    for (flag, bad, why) in [
        ("--heavy-size", "1.5", "above 1.0"),
        ("--sink-size", "-0.1", "negative"),
        ("--window-size", "NaN", "not a number"),
        ("--heavy-size", "ten", "not a number"),
    ] {
        let arg = format!("{flag}={bad}"); // `=`: clap takes "-0.1" as a value
        let (code, out, err) = tritonrt(&["run", "--backend", "cpu", &arg]);
        let field = flag.trim_start_matches("--").replace('-', "_");
        assert_eq!(code, 2, "{flag} {bad}: {out}\n{err}");
        assert!(
            err.contains(&format!("{field} = {bad}"))
                && err.contains(why)
                && err.contains("[0, 1]"),
            "{flag} {bad}: {err}"
        );
    }
    let (code, out, err) = tritonrt(&[
        "run",
        "--backend",
        "cpu",
        "--workload",
        "1,4,2,600,16,2,6,2.5",
    ]);
    assert_eq!(code, 2, "{out}\n{err}");
    assert!(err.contains("heavy_size = 2.5"), "{err}");
    // M not dividing D, bits outside 1..=8: named with the value and the allowed range
    let small = [
        "run",
        "--backend",
        "cpu",
        "--seq-len",
        "600",
        "--heads",
        "4",
        "--head-dim",
        "16",
    ];
    let (code, _, err) = tritonrt(&[&small[..], &["--pq-group-factor", "3"]].concat());
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("pq_group_factor = 3") && err.contains("D = 16"),
        "{err}"
    );
    for bits in ["0", "9"] {
        let (code, _, err) = tritonrt(&[&small[..], &["--pq-bits", bits]].concat());
        assert_eq!(code, 2, "{err}");
        assert!(
            err.contains(&format!("pq_bits = {bits}")) && err.contains("1..=8"),
            "{err}"
        );
    }
    // --help says what a ratio means, for run and for prefill's decode config
    for sub in ["run", "prefill"] {
        let (code, out, _) = tritonrt(&[sub, "--help"]);
        assert_eq!(code, 0);
        for flag in ["--heavy-size", "--sink-size", "--window-size"] {
            assert!(out.contains(flag), "{sub}: {out}");
        }
        assert!(
            out.contains("ratio of S") && out.contains("decimal point") && out.contains("floor("),
            "{sub}: {out}"
        );
    }
}
