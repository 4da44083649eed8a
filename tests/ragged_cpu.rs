//! Ragged batches on the CPU (spec "Ragged batches"): the reference per entry with the
//! padding rules, equal lengths equal to the fixed-`S` step, the checker catching each
//! padding and per-entry error, and the refusals naming the row and the values.

mod common;

use tritonrt::pq::check::{CheckOptions, ViolationKind};
use tritonrt::pq::ragged::{
    check_ragged, plan_ragged, ragged_path, ragged_row_len, ragged_split_parts, reference_step,
    RaggedInputs, RaggedPath,
};
use tritonrt::pq::{step, PqConfig, PqInputs, Shape, Size};

fn cfg() -> PqConfig {
    PqConfig {
        sink_size: Size::Count(8),
        window_size: Size::Count(16),
        heavy_size: Size::Count(24),
        init_offset: 8,
        pq_bits: 4,
        ..PqConfig::reference_workload()
    }
}

fn shape(b: usize, s: usize) -> Shape {
    Shape {
        b,
        h: 4,
        h_kv: 2,
        s,
        d: 16,
    }
}

fn seed() -> u64 {
    common::test_seed()
}

/// Lengths of every kind at once: the short path (S_b below the threshold, and S_b = 1),
/// S_b = K-ish, S_b = S_alloc, and rows with fewer cached codes (several new keys).
#[test]
fn reference_pads_each_entry_and_checker_passes_it() {
    let c = cfg();
    let s_alloc = 900;
    let thr = c.short_threshold(0); // count sizes: the same at every S
    let lens: Vec<i64> = vec![1, thr as i64, thr as i64 + 1, 300, 16, s_alloc as i64];
    let b = lens.len();
    let n_max = c.n_quantized(s_alloc) - 1;
    let x = PqInputs::random(&c, shape(b, s_alloc), n_max, seed()).unwrap();
    let n_cached: Vec<i64> = lens
        .iter()
        .enumerate()
        .map(|(i, &s)| {
            let n = c.n_quantized(s as usize) as i64;
            // one new key, several (row 3), or the short path's count
            if c.is_short(s as usize) {
                0
            } else if i == 3 {
                n - 7
            } else {
                n - 1
            }
        })
        .collect();
    let rx = RaggedInputs::new(&c, x, &lens, Some(&n_cached)).unwrap();
    let out = reference_step(&c, &rx).unwrap();
    let want_total = lens.iter().map(|&s| c.total(s as usize)).max().unwrap();
    assert_eq!(out.total, want_total);
    for (bi, &s) in lens.iter().enumerate() {
        let s = s as usize;
        let t_b = c.total(s);
        for h in 0..4 {
            let r = bi * 4 + h;
            assert_eq!(out.sparse_len[r], t_b as i64);
            let row = &out.sparse_list[r * out.total..(r + 1) * out.total];
            assert!(row[t_b..].iter().all(|&v| v == -1), "row {bi}: tail not -1");
            assert!(row[..t_b].iter().all(|&v| (0..s as i64).contains(&v)));
            let w = &out.weight_list[r * s_alloc..(r + 1) * s_alloc];
            assert!(
                w[s..].iter().all(|&v| v == 0.0),
                "row {bi}: weights past S_b"
            );
            assert!(w[..s].contains(&1.0), "row {bi}: no weight set");
            if c.is_short(s) {
                assert_eq!(&row[..t_b], &(0..s as i64).collect::<Vec<_>>()[..]);
            }
        }
        let want_n = if c.is_short(s) { 0 } else { c.n_quantized(s) };
        assert_eq!(out.n_cached[bi], want_n, "row {bi}: n_cached");
    }
    let opts = CheckOptions::default();
    let rep = check_ragged(&c, &rx, &out, &opts);
    assert!(rep.passed(), "{rep}");
    assert_eq!(rep.rows, 4 * b);
}

/// With equal lengths the ragged step is exactly the fixed-S step.
#[test]
fn equal_lengths_are_the_fixed_step() {
    let c = cfg();
    let s = 700;
    let n = PqInputs::default_n_cached(&c, s);
    let x = PqInputs::random(&c, shape(3, s), n, seed()).unwrap();
    let fixed = step(&c, &x).unwrap();
    let rx = RaggedInputs::new(&c, x, &[s as i64; 3], None).unwrap();
    let out = reference_step(&c, &rx).unwrap();
    assert_eq!(out.sparse_list, fixed.sparse_list);
    assert_eq!(out.sparse_len, fixed.sparse_len);
    assert_eq!(out.weight_list, fixed.weight_list);
    assert_eq!(out.codes, fixed.codes);
    assert_eq!(out.n_cached, vec![fixed.n_cached; 3]);
}

/// Each padding or per-entry error is caught and names its row.
#[test]
fn checker_catches_padding_and_entry_errors() {
    let c = cfg();
    let s_alloc = 800;
    let lens = [500i64, 30, 800];
    let n_max = c.n_quantized(s_alloc) - 1;
    let x = PqInputs::random(&c, shape(3, s_alloc), n_max, seed()).unwrap();
    let n_cached: Vec<i64> = lens
        .iter()
        .map(|&s| {
            if c.is_short(s as usize) {
                0
            } else {
                c.n_quantized(s as usize) as i64 - 1
            }
        })
        .collect();
    let rx = RaggedInputs::new(&c, x, &lens, Some(&n_cached)).unwrap();
    let good = reference_step(&c, &rx).unwrap();
    let opts = CheckOptions::default();
    let fails = |o: &tritonrt::pq::ragged::RaggedOutput, kind: ViolationKind, row: usize| {
        let rep = check_ragged(&c, &rx, o, &opts);
        assert!(rep.count(kind) > 0, "{kind:?} not caught: {rep}");
        assert!(
            rep.listed.iter().any(|v| v.b == Some(row)),
            "row {row} not named: {rep}"
        );
    };
    // a tail entry of row 1 (the short row: 30 entries of 48) not -1
    let mut o = good.clone();
    let t1 = c.total(30);
    assert!(t1 < o.total);
    o.sparse_list[4 * o.total + t1] = 3;
    fails(&o, ViolationKind::SparseLen, 1);
    // a weight past S_b of row 1 (a short row)
    let mut o = good.clone();
    o.weight_list[4 * s_alloc + 100] = 1.0;
    fails(&o, ViolationKind::WeightList, 1);
    // a heavy pick of row 2 swapped for a masked one
    let mut o = good.clone();
    let r = 2 * 4;
    let row = &mut o.sparse_list[r * o.total..(r + 1) * o.total];
    let hi = 8 + 5; // a heavy entry (after the 8 sinks)
    let old = row[hi] as usize;
    let new = 800 - 16 - 1; // just before the window: masked? choose a j >= w0
    row[hi] = new as i64;
    row[..c.total(800)].sort_unstable();
    o.weight_list[r * s_alloc + old] = 0.0;
    o.weight_list[r * s_alloc + new] = 1.0;
    let rep = check_ragged(&c, &rx, &o, &opts);
    assert!(!rep.passed(), "a swapped heavy pick passed");
    assert!(rep.listed.iter().any(|v| v.b == Some(2)), "{rep}");
    // a wrong n_cached
    let mut o = good.clone();
    o.n_cached[0] += 1;
    fails(&o, ViolationKind::Codes, 0);
}

/// Bad lengths are refused naming the row and the values.
#[test]
fn bad_lengths_are_refused_naming_the_row() {
    let c = cfg();
    let s_alloc = 600;
    let n = c.n_quantized(s_alloc) - 1;
    let x = PqInputs::random(&c, shape(2, s_alloc), n, 3).unwrap();
    let err = |lens: &[i64], nc: Option<&[i64]>| {
        RaggedInputs::new(&c, x.clone(), lens, nc)
            .expect_err("accepted")
            .to_string()
    };
    let e = err(&[600, 601], None);
    assert!(
        e.contains("row 1") && e.contains("601") && e.contains("600"),
        "{e}"
    );
    let e = err(&[-3, 100], None);
    assert!(e.contains("row 0") && e.contains("-3"), "{e}");
    let e = err(&[0, 100], None);
    assert!(e.contains("row 0") && e.contains("S_b = 0"), "{e}");
    let e = err(&[600], None);
    assert!(e.contains("seq_lens") && e.contains("B=2"), "{e}");
    // more codes than the row has keys: row 1 at S_b = 300 holds 300 - 8 = 292 keys
    let e = err(&[600, 300], Some(&[10, 400]));
    assert!(
        e.contains("row 1") && e.contains("400") && e.contains("292"),
        "{e}"
    );
    // more than the codes tensor holds
    let e = err(&[600, 600], Some(&[10, n as i64 + 1]));
    assert!(
        e.contains("row 1") && e.contains(&(n + 1).to_string()),
        "{e}"
    );
    let e = err(&[600, 600], Some(&[-1, 5]));
    assert!(e.contains("row 0") && e.contains("-1"), "{e}");
}

/// A ragged batch written to safetensors reads back as the same batch (`seq_lens` and
/// `n_cached` i64 `[B]`), and its padded outputs are written with their shapes.
#[test]
fn ragged_files_round_trip() {
    use tritonrt::pq::io::{read_inputs, read_ragged, write_ragged_inputs, write_ragged_outputs};
    use tritonrt::pq::PqConfigOverrides;
    let c = cfg();
    let dir = tempfile::tempdir().unwrap();
    let s_alloc = 640;
    let lens = [640i64, 200, 30];
    let n_max = c.n_quantized(s_alloc) - 1;
    let x = PqInputs::random(&c, shape(3, s_alloc), n_max, seed()).unwrap();
    let nc: Vec<i64> = lens
        .iter()
        .map(|&s| {
            if c.is_short(s as usize) {
                0
            } else {
                c.n_quantized(s as usize) as i64 - 2
            }
        })
        .collect();
    let rx = RaggedInputs::new(&c, x, &lens, Some(&nc)).unwrap();
    let p = dir.path().join("in.safetensors");
    write_ragged_inputs(&p, &c, &rx).unwrap();
    let (c2, x2) = read_inputs(&p, &PqConfigOverrides::default()).unwrap();
    let lens2 = read_ragged(&p).unwrap().expect("seq_lens present");
    let rx2 = RaggedInputs::new(&c2, x2, &lens2.seq_lens, lens2.n_cached.as_deref()).unwrap();
    assert_eq!(c2, c);
    assert_eq!(rx2, rx);
    let out = reference_step(&c, &rx).unwrap();
    let po = dir.path().join("out.safetensors");
    write_ragged_outputs(&po, &c, &out).unwrap();
    assert!(po.metadata().unwrap().len() > 0);
    // a fixed-S file has no seq_lens
    let pf = dir.path().join("fixed.safetensors");
    tritonrt::pq::io::write_inputs(&pf, &c, &rx.entry(0)).unwrap();
    assert!(read_ragged(&pf).unwrap().is_none());
}

/// The plan of a ragged step (what `GpuIndexer::step_ragged` validates its lengths with
/// and `tritonrt run --seq-lens` prints): short rows quantize nothing, long rows catch up
/// to `S_b - init_offset`, totals per row, and the list length is the largest total.
#[test]
fn plan_of_a_ragged_step() {
    let c = cfg();
    let thr = c.short_threshold(0);
    let lens = [1, thr, thr + 1, 300, 900];
    let ncs = [0, 3, c.n_quantized(thr + 1) - 1, c.n_quantized(300) - 7, 0];
    let p = plan_ragged(&c, 900, &lens, &ncs).unwrap();
    assert_eq!(p.s_alloc, 900);
    assert_eq!(p.short_rows(), 2);
    let shorts: Vec<bool> = p.rows.iter().map(|r| r.short).collect();
    assert_eq!(shorts, [true, true, false, false, false]);
    // short rows keep their count, long rows end at S_b - init_offset
    assert_eq!(p.rows[1].n, 3);
    assert_eq!(p.rows[1].new_keys, 0);
    assert_eq!(p.rows[2].new_keys, 1);
    assert_eq!(p.rows[3].new_keys, 7);
    assert_eq!(p.rows[4].new_keys, c.n_quantized(900));
    assert_eq!(p.new_keys(), 1 + 7 + c.n_quantized(900));
    for (r, &s) in p.rows.iter().zip(&lens) {
        assert_eq!(r.total, c.total(s));
    }
    assert_eq!(p.total, lens.iter().map(|&s| c.total(s)).max().unwrap());
}

/// Refusals of the plan name the row and the values: a zero length, one above
/// `S_alloc`, a row whose state is ahead of its sequence, mismatched counts.
#[test]
fn plan_refuses_bad_rows_naming_them() {
    let c = cfg();
    let err =
        |lens: &[usize], ncs: &[usize]| plan_ragged(&c, 900, lens, ncs).unwrap_err().to_string();
    let e = err(&[500, 901], &[0, 0]);
    assert!(
        e.contains("row 1") && e.contains("901") && e.contains("900"),
        "{e}"
    );
    let e = err(&[0, 500], &[0, 0]);
    assert!(e.contains("row 0") && e.contains("S_b = 0"), "{e}");
    let e = err(&[500, 100], &[0, 93]);
    assert!(
        e.contains("row 1") && e.contains("93") && e.contains("92"),
        "{e}"
    );
    let e = err(&[500], &[0, 0]);
    assert!(e.contains("1 lengths") && e.contains("2 rows"), "{e}");
    assert!(plan_ragged(&c, 900, &[], &[]).is_err());
}

/// The device row length `T` of `sparse_list`: every length up to `S_alloc` fits, and it
/// is reached, with counts and with ratio sizes (whose totals grow with `S`), and with a
/// short-path threshold above `S_alloc` (every row short: `T = S_alloc`).
#[test]
fn ragged_row_length_holds_every_total() {
    let counts = cfg();
    let ratios = PqConfig {
        sink_size: Size::Ratio(0.01),
        window_size: Size::Ratio(0.02),
        heavy_size: Size::Ratio(0.1),
        ..cfg()
    };
    for c in [counts, ratios] {
        for s_alloc in [1, 30, 97, 98, 99, 500, 4096] {
            let t = ragged_row_len(&c, s_alloc);
            let all: Vec<usize> = (1..=s_alloc).map(|s| c.total(s)).collect();
            assert!(all.iter().all(|&x| x <= t), "{c} S_alloc {s_alloc}");
            assert_eq!(all.iter().copied().max(), Some(t), "{c} S_alloc {s_alloc}");
        }
    }
    let big = PqConfig {
        heavy_size: Size::Count(5000),
        ..cfg()
    };
    assert_eq!(ragged_row_len(&big, 4096), 4096);
}

/// The ragged step's path: the indexed path where its kernels are built and its
/// conditions hold (`Ok(true)`), else the split histogram path wherever the combination
/// histogram applies (`K^M <= 4096`, `M <= 4`, the decode-loop benchmark's reference
/// config included) and its kernels are built, else the radix path; forcing the split
/// path elsewhere is refused naming `K` and `M`, forcing the indexed path where it is not
/// built returns the reason given; forcing the radix path is always allowed.
#[test]
fn ragged_path_follows_the_kernels_and_the_histogram() {
    let reference = PqConfig::reference_workload(); // M = 2, bits = 6: 4096 combinations
    let m1_bits8 = PqConfig {
        pq_group_factor: 1,
        pq_bits: 8,
        ..cfg()
    };
    let m4_bits3 = PqConfig {
        pq_group_factor: 4,
        pq_bits: 3,
        ..cfg()
    };
    let no_index = || {
        Err(tritonrt::Error::invalid(
            "ragged path",
            "no pq_rgindex here",
        ))
    };
    for c in [cfg(), reference, m1_bits8, m4_bits3] {
        assert_eq!(
            ragged_path(&c, true, Ok(true), None).unwrap(),
            RaggedPath::Index,
            "{c}"
        );
        for index in [Ok(false), no_index()] {
            assert_eq!(
                ragged_path(&c, true, index, None).unwrap(),
                RaggedPath::Split,
                "{c}"
            );
        }
        assert_eq!(
            ragged_path(&c, false, Ok(false), None).unwrap(),
            RaggedPath::Radix,
            "{c}"
        );
        assert_eq!(
            ragged_path(&c, true, Ok(true), Some(RaggedPath::Radix)).unwrap(),
            RaggedPath::Radix
        );
        assert_eq!(
            ragged_path(&c, true, Ok(false), Some(RaggedPath::Index)).unwrap(),
            RaggedPath::Index,
            "forced, the indexed path ignores its heavy and bucket conditions"
        );
        let e = ragged_path(&c, true, no_index(), Some(RaggedPath::Index))
            .unwrap_err()
            .to_string();
        assert!(e.contains("no pq_rgindex here"), "{e}");
        let e = ragged_path(&c, false, Ok(true), Some(RaggedPath::Split))
            .unwrap_err()
            .to_string();
        assert!(e.contains("pq_rgthresh"), "{e}");
    }
    let m2_bits8 = PqConfig {
        pq_bits: 8,
        ..cfg()
    };
    let m8_bits1 = PqConfig {
        pq_group_factor: 8,
        pq_bits: 1,
        ..cfg()
    };
    for c in [m2_bits8, m8_bits1] {
        assert_eq!(
            ragged_path(&c, true, no_index(), None).unwrap(),
            RaggedPath::Radix,
            "{c}"
        );
        let e = ragged_path(&c, true, no_index(), Some(RaggedPath::Split))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("K^M") && e.contains(&format!("M = {}", c.m())),
            "{e}"
        );
    }
    assert_eq!(RaggedPath::Split.launches(), 3);
    assert_eq!(RaggedPath::Index.launches(), 3);
    assert_eq!(RaggedPath::Radix.launches(), 8);
}

/// The ragged split path's emit parts per row: the longest row's, at least one.
#[test]
fn ragged_split_parts_cover_the_longest_row() {
    assert_eq!(ragged_split_parts(65745, 128, 4096), 17);
    assert_eq!(ragged_split_parts(4096 + 128, 128, 4096), 1);
    assert_eq!(ragged_split_parts(4096 + 129, 128, 4096), 2);
    assert_eq!(ragged_split_parts(100, 128, 4096), 1);
    assert_eq!(ragged_split_parts(1, 0, 128), 1);
    for (s, io, tile) in [(700, 8, 128), (1, 8, 128), (5000, 0, 4096)] {
        let np = ragged_split_parts(s, io, tile);
        assert!(io + np * tile >= s && np >= 1);
    }
}
