//! CPU tests of the PQ indexer's host side: the reference against hand-computed cases and
//! an independent naive implementation, the checker against planted errors, safetensors
//! I/O (round trip, bad files, atomic writes) and `tritonrt run --backend cpu`.

mod common;

use common::tritonrt;
use std::path::Path;

use tritonrt::artifact::write_atomic;
use tritonrt::pq::check::{check_with, CheckMode, CheckOptions, ViolationKind};
use tritonrt::pq::io::{read_inputs, read_outputs, write_inputs, write_outputs};
use tritonrt::pq::reference::{quantize_key, subvector_distance};
use tritonrt::pq::{
    check, check_exact, step, DType, Metric, PqConfig, PqConfigOverrides, PqInputs, PqOutput,
    Shape, Size,
};

// ----------------------------------------------------------------------------------
// Helpers
// ----------------------------------------------------------------------------------

fn cfg(
    sink: usize,
    window: usize,
    heavy: usize,
    init_offset: usize,
    m: usize,
    bits: u32,
    metric: Metric,
) -> PqConfig {
    PqConfig {
        sink_size: Size::Count(sink),
        window_size: Size::Count(window),
        heavy_size: Size::Count(heavy),
        init_offset,
        pq_group_factor: m,
        pq_bits: bits,
        metric,
        input_dtype: DType::F32,
        weight_dtype: DType::F32,
    }
}

/// 0/1 weights of one row from its positions.
fn weights_of(s: usize, positions: &[i64]) -> Vec<f32> {
    let mut w = vec![0.0; s];
    for &p in positions {
        w[p as usize] = 1.0;
    }
    w
}

/// Codes `[B, N, H_kv=1, M]` from per-batch lists of per-key codes.
fn codes_h1(per_batch: &[Vec<Vec<i64>>]) -> Vec<i64> {
    per_batch.iter().flatten().flatten().copied().collect()
}

/// An independent, deliberately plain implementation of the spec (full sort, no
/// threads, no tables) to compare the reference with on random inputs.
fn naive(cfg: &PqConfig, x: &PqInputs) -> (Vec<Vec<i64>>, Vec<i64>, usize) {
    let sh = x.shape;
    let (m_, k_, ds, dc) = (
        cfg.pq_group_factor,
        1usize << cfg.pq_bits,
        sh.d / cfg.pq_group_factor,
        cfg.d_c(sh.d),
    );
    let g_of = |h: usize| h / (sh.h / sh.h_kv);
    // the sizes at this S (counts in these tests' configs)
    let (sink_n, win_n, heavy_n) = (
        cfg.sink_size.resolve(sh.s),
        cfg.window_size.resolve(sh.s),
        cfg.heavy_size.resolve(sh.s),
    );
    let short = sh.s <= heavy_n + cfg.init_offset + 1 + k_;
    if short {
        let rows = (0..sh.b * sh.h)
            .map(|_| (0..sh.s as i64).collect())
            .collect();
        return (rows, x.codes.clone(), x.n_cached);
    }
    let n = sh.s - cfg.init_offset;
    // code(b, j, g, m)
    let code = |b: usize, j: usize, g: usize, m: usize| -> i64 {
        if j < x.n_cached {
            return x.codes[((b * x.n_cached + j) * sh.h_kv + g) * m_ + m];
        }
        let p = cfg.init_offset + j;
        let key: Vec<f64> = (0..ds)
            .map(|i| x.key[((b * sh.h_kv + g) * sh.s + p) * sh.d + m * ds + i] as f64)
            .collect();
        let mut xv = key.clone();
        if cfg.metric == Metric::Ip {
            let phi = x.phi.as_ref().unwrap()[(b * sh.h_kv + g) * m_ + m] as f64;
            let nrm: f64 = key.iter().map(|v| v * v).sum();
            xv.push((phi - nrm).max(0.0).sqrt());
        }
        let mut best = (0usize, f64::INFINITY);
        for c in 0..k_ {
            let cen = &x.centroids[((((b * sh.h_kv + g) * m_ + m) * k_) + c) * dc..][..dc];
            let dist: f64 = xv
                .iter()
                .zip(cen)
                .map(|(a, &b)| (a - b as f64).powi(2))
                .sum();
            if dist < best.1 {
                best = (c, dist);
            }
        }
        best.0 as i64
    };
    let mut codes = vec![0i64; sh.b * n * sh.h_kv * m_];
    for b in 0..sh.b {
        for j in 0..n {
            for g in 0..sh.h_kv {
                for m in 0..m_ {
                    codes[((b * n + j) * sh.h_kv + g) * m_ + m] = code(b, j, g, m);
                }
            }
        }
    }
    let sink = sink_n.min(sh.s);
    let win = win_n.min(sh.s);
    let w0 = (sh.s as i64 - win as i64 - cfg.init_offset as i64).max(0) as usize;
    let k = heavy_n.min(n);
    let mut rows = Vec::new();
    for b in 0..sh.b {
        for h in 0..sh.h {
            let g = g_of(h);
            let q = &x.query[(b * sh.h + h) * sh.d..][..sh.d];
            let mut sc: Vec<(f64, usize)> = (0..w0)
                .map(|j| {
                    let mut s = 0f64;
                    for m in 0..m_ {
                        let c = codes[((b * n + j) * sh.h_kv + g) * m_ + m] as usize;
                        let cen = &x.centroids[((((b * sh.h_kv + g) * m_ + m) * k_) + c) * dc..];
                        for i in 0..ds {
                            s += q[m * ds + i] as f64 * cen[i] as f64;
                        }
                    }
                    (s, j)
                })
                .collect();
            sc.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
            let mut heavy: Vec<usize> = sc.iter().take(k).map(|&(_, j)| j).collect();
            let mut next = w0;
            while heavy.len() < k {
                heavy.push(next);
                next += 1;
            }
            let mut row: Vec<i64> = (0..sink as i64).collect();
            row.extend(heavy.iter().map(|&j| (j + cfg.init_offset) as i64));
            row.extend((sh.s - win) as i64..sh.s as i64);
            row.sort_unstable();
            rows.push(row);
        }
    }
    (rows, codes, n)
}

/// Compare the reference with the naive implementation and run the checker on it.
fn assert_matches_naive(cfg: &PqConfig, x: &PqInputs, what: &str) -> PqOutput {
    let out = step(cfg, x).unwrap_or_else(|e| panic!("{what}: {e}"));
    let (rows, codes, n) = naive(cfg, x);
    assert_eq!(out.n_cached, n, "{what}: n_cached");
    assert_eq!(out.codes, codes, "{what}: codes");
    let sh = x.shape;
    for b in 0..sh.b {
        for h in 0..sh.h {
            let want = &rows[b * sh.h + h];
            assert_eq!(
                out.row(b, h),
                &want[..],
                "{what}: sparse_list row b={b} h={h}"
            );
            assert_eq!(
                out.weight_row(b, h),
                &weights_of(sh.s, want)[..],
                "{what}: weights"
            );
            assert_eq!(
                out.sparse_len[b * sh.h + h],
                want.len() as i64,
                "{what}: len"
            );
        }
    }
    assert_eq!(out.total, cfg.total(sh.s), "{what}: total");
    let report = check(cfg, x, &out);
    assert!(
        report.passed(),
        "{what}: checker rejects the reference: {report}"
    );
    out
}

// ----------------------------------------------------------------------------------
// Hand-computed cases
// ----------------------------------------------------------------------------------

/// Euclidean, B=2 (batches share keys/codes, differ in the query), H=H_kv=1, D=2, M=2
/// (d_s=1), bits=1 (K=2); sink=1, window=1, heavy=2, init_offset=1; S=8.
///
/// Threshold = heavy + init_offset + 1 + K = 2+1+1+2 = 6 < 8: long path.
/// n = S - init_offset = 7 (j=0..6 at positions 1..7); w0 = 8-1-1 = 6: candidates j=0..5.
/// k = 2, total = 1 + 2 + 1 = 4. N_cached = 5: keys j=5 (pos 6) and j=6 (pos 7) are new.
///
/// Centroids (both batches): m=0: c0=-1, c1=2; m=1: c0=0.5, c1=-3.
/// New key j=5 = [1.6, 0.0]: m=0 |1.6+1|^2=6.76 vs |1.6-2|^2=0.16 -> 1;
///                           m=1 |0-0.5|^2=0.25 vs |0+3|^2=9     -> 0.  codes [1,0]
/// New key j=6 = [-0.4, -1.2]: m=0 0.36 vs 5.76 -> 0; m=1 2.89 vs 3.24 -> 0. codes [0,0]
/// Cached codes: j0 [0,0], j1 [1,0], j2 [1,1], j3 [0,1], j4 [0,0].
///
/// Batch 0, q = [1, 2]: lut m0 = [-1, 2], m1 = [1, -6].
///   scores j0..j5 = [0, 3, -4, -7, 0, 3] -> top-2 j1, j5 -> positions 2, 6.
///   sparse_list = {0} + {2, 6} + {7} = [0, 2, 6, 7].
/// Batch 1, q = [-1, -2]: lut m0 = [1, -2], m1 = [-1, 6].
///   scores = [0, -3, 4, 7, 0, -3] -> top-2 j3, j2 -> positions 4, 3.
///   sparse_list = [0, 3, 4, 7].
#[test]
fn hand_case_euclidean_two_batches_two_new_keys() {
    let c = cfg(1, 1, 2, 1, 2, 1, Metric::Euclidean);
    let shape = Shape {
        b: 2,
        h: 1,
        h_kv: 1,
        s: 8,
        d: 2,
    };
    // Keys at positions 0..8; positions 0..6 are never read (put junk there).
    let keys_one: Vec<f32> = vec![
        9.0, 9.0, // p0 (not quantized: before init_offset)
        7.0, -7.0, // p1 = j0 (cached)
        7.0, -7.0, // p2 = j1
        7.0, -7.0, // p3
        7.0, -7.0, // p4
        7.0, -7.0, // p5 = j4
        1.6, 0.0, // p6 = j5 (new)
        -0.4, -1.2, // p7 = j6 (new)
    ];
    let cent_one: Vec<f32> = vec![-1.0, 2.0, 0.5, -3.0]; // [M=2, K=2, d_c=1]
    let cached = vec![vec![0, 0], vec![1, 0], vec![1, 1], vec![0, 1], vec![0, 0]];
    let x = PqInputs {
        shape,
        query: vec![1.0, 2.0, -1.0, -2.0],
        key: [keys_one.clone(), keys_one].concat(),
        centroids: [cent_one.clone(), cent_one].concat(),
        codes: codes_h1(&[cached.clone(), cached.clone()]),
        n_cached: 5,
        phi: None,
    };
    let out = step(&c, &x).unwrap();
    assert_eq!(out.total, 4);
    assert_eq!(out.row(0, 0), &[0, 2, 6, 7]);
    assert_eq!(out.row(1, 0), &[0, 3, 4, 7]);
    assert_eq!(out.sparse_len, vec![4, 4]);
    assert_eq!(out.weight_row(0, 0), &[1., 0., 1., 0., 0., 0., 1., 1.]);
    assert_eq!(out.weight_row(1, 0), &[1., 0., 0., 1., 1., 0., 0., 1.]);
    let mut all = cached.clone();
    all.push(vec![1, 0]);
    all.push(vec![0, 0]);
    assert_eq!(out.n_cached, 7);
    assert_eq!(out.codes, codes_h1(&[all.clone(), all]));
    assert_eq!(quantize_key(&c, &x, 0, 0, 6), vec![1, 0]);
    assert!(check_exact(&c, &x, &out).passed());
    assert_matches_naive(&c, &x, "hand euclidean");

    // The same numbers as GQA: B=1, H=2 query heads sharing H_kv=1 KV head. Head 0 has
    // batch 0's query, head 1 batch 1's: the rows are the same as above.
    let gqa = PqInputs {
        shape: Shape {
            b: 1,
            h: 2,
            h_kv: 1,
            ..shape
        },
        key: x.key[..16].to_vec(),
        centroids: x.centroids[..4].to_vec(),
        codes: codes_h1(&[cached]),
        ..x.clone()
    };
    let out = step(&c, &gqa).unwrap();
    assert_eq!(out.row(0, 0), &[0, 2, 6, 7]);
    assert_eq!(out.row(0, 1), &[0, 3, 4, 7]);
    assert_eq!(out.codes[10..], [1, 0, 0, 0]);
    assert_matches_naive(&c, &gqa, "hand GQA");
}

/// Metric ip: D=2, M=1 (d_s=2, d_c=3), bits=1 (K=2); sink=0, window=1, heavy=1,
/// init_offset=0; S=6, phi=10. Threshold 1+0+1+2 = 4 < 6. n=6, w0=5, k=1, total=2.
///
/// Centroids c0=[1,0,0], c1=[0,0,3]; q=[-1,0]: lut = [-1, 0] (third coordinate unused).
/// Cached codes j0..j3 = 0 (score -1 each). New keys:
///   j4 = [0.6, 0]: |x|^2=0.36, aug=sqrt(9.64)=3.1048
///        c0: 0.16 + 0 + 3.1048^2 = 9.80;  c1: 0.36 + 0 + 0.1048^2 = 0.371 -> code 1
///        (plain euclidean on 2 coordinates would give c0: 0.16 < c1: 0.36 -> code 0)
///   j5 = [0, 5]: |x|^2=25 > phi, aug = sqrt(max(0, -15)) = 0
///        c0: 1 + 25 + 0 = 26;  c1: 0 + 25 + 9 = 34 -> code 0
///        (an |phi - |x|^2| variant would give aug=3.873, c1 closer -> code 1)
/// Scores j0..j4 = [-1, -1, -1, -1, 0] -> heavy j4 -> position 4.
/// sparse_list = {} + {4} + {5} = [4, 5].
#[test]
fn hand_case_ip_augmentation() {
    let c = cfg(0, 1, 1, 0, 1, 1, Metric::Ip);
    let shape = Shape {
        b: 1,
        h: 1,
        h_kv: 1,
        s: 6,
        d: 2,
    };
    let x = PqInputs {
        shape,
        query: vec![-1.0, 0.0],
        key: vec![
            5.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0, // j0..j3 cached (not read)
            0.6, 0.0, // j4
            0.0, 5.0, // j5
        ],
        centroids: vec![1.0, 0.0, 0.0, 0.0, 0.0, 3.0],
        codes: vec![0, 0, 0, 0],
        n_cached: 4,
        phi: Some(vec![10.0]),
    };
    let d = subvector_distance(&[0.6, 0.0], &[0.0, 0.0, 3.0], Some(10.0));
    assert!(
        (d - (0.36 + (9.64f64.sqrt() - 3.0).powi(2))).abs() < 1e-6,
        "{d}"
    );
    let out = step(&c, &x).unwrap();
    assert_eq!(out.total, 2);
    assert_eq!(out.row(0, 0), &[4, 5]);
    assert_eq!(out.codes, vec![0, 0, 0, 0, 1, 0]);
    assert_eq!(out.weight_row(0, 0), &[0., 0., 0., 0., 1., 1.]);
    assert!(check(&c, &x, &out).passed());
    assert_matches_naive(&c, &x, "hand ip");
}

/// init_offset < sink (duplicates stay) and a masked high scorer: D=1, M=1, bits=2
/// (K=4), sink=4, window=2, heavy=2, init_offset=0, S=10. Threshold 2+0+1+4 = 7 < 10.
/// n=10, w0 = 10-2-0 = 8 (candidates j0..j7), k=2, total = 4+2+2 = 8.
/// Centroids [0],[1],[2],[3], q=[1]: lut = [0,1,2,3] = the code.
/// Codes j0..j8 = [0,3,1,0,1,2,3,2,3]; new key j9 = [2.9] -> code 3 (masked anyway).
/// Top-2 among j0..j7: j1 and j6 (3); j8 (3) is masked. Positions 1 and 6.
/// sparse_list = sink [0,1,2,3] + heavy [1,6] + window [8,9] = [0,1,1,2,3,6,8,9].
#[test]
fn hand_case_duplicates_when_init_offset_below_sink() {
    let c = cfg(4, 2, 2, 0, 1, 2, Metric::Euclidean);
    let shape = Shape {
        b: 1,
        h: 1,
        h_kv: 1,
        s: 10,
        d: 1,
    };
    let x = PqInputs {
        shape,
        query: vec![1.0],
        key: vec![-4.0, -4.0, -4.0, -4.0, -4.0, -4.0, -4.0, -4.0, -4.0, 2.9],
        centroids: vec![0.0, 1.0, 2.0, 3.0],
        codes: vec![0, 3, 1, 0, 1, 2, 3, 2, 3],
        n_cached: 9,
        phi: None,
    };
    let out = step(&c, &x).unwrap();
    assert_eq!(out.total, 8);
    assert_eq!(out.row(0, 0), &[0, 1, 1, 2, 3, 6, 8, 9]);
    assert_eq!(out.sparse_len, vec![8]);
    assert_eq!(
        out.weight_row(0, 0),
        &[1., 1., 1., 1., 0., 0., 1., 0., 1., 1.]
    );
    assert_eq!(out.codes[9], 3);
    assert_eq!(out.heavy_positions(&c, 0, 0), vec![1, 6]);
    assert!(check_exact(&c, &x, &out).passed());
    assert_matches_naive(&c, &x, "hand duplicates");
}

/// S just above the threshold with fewer candidates than k: D=1, M=1, bits=2 (K=4),
/// sink=1, window=8, heavy=4, init_offset=2. Threshold 4+2+1+4 = 11; S=12.
/// n=10, w0 = 12-8-2 = 2 candidates (j0, j1) < k=4: take both, then fill with the lowest
/// masked j2, j3. Heavy positions 2,3,4,5; window 4..12; sink {0}.
/// sparse_list = [0, 2, 3, 4, 4, 5, 5, 6, 7, 8, 9, 10, 11] (total 1+4+8 = 13).
#[test]
fn hand_case_fill_when_fewer_candidates_than_heavy() {
    let c = cfg(1, 8, 4, 2, 1, 2, Metric::Euclidean);
    let shape = Shape {
        b: 1,
        h: 1,
        h_kv: 1,
        s: 12,
        d: 1,
    };
    assert_eq!(c.short_threshold(12), 11);
    assert!(!c.is_short(12) && c.is_short(11));
    let x = PqInputs {
        shape,
        // The query prefers high codes; the masked j9 has the top code but must not win.
        query: vec![1.0],
        key: vec![0.0; 12],
        centroids: vec![0.0, 1.0, 2.0, 3.0],
        codes: vec![0, 0, 1, 1, 2, 2, 3, 3, 3],
        n_cached: 9,
        phi: None,
    };
    let out = step(&c, &x).unwrap();
    assert_eq!(out.total, 13);
    assert_eq!(out.row(0, 0), &[0, 2, 3, 4, 4, 5, 5, 6, 7, 8, 9, 10, 11]);
    assert_eq!(
        out.weight_row(0, 0),
        &[1., 0., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1.]
    );
    // The new key j9 (position 11, value 0.0) gets code 0.
    assert_eq!(out.codes.len(), 10);
    assert_eq!(out.codes[9], 0);
    assert!(check_exact(&c, &x, &out).passed());
    assert_matches_naive(&c, &x, "hand fill");

    // The checker demands the fill rule: the highest-scoring masked j instead of j3 fails.
    let mut bad = out.clone();
    let row = vec![0, 2, 3, 4, 4, 5, 6, 7, 8, 9, 10, 11, 11];
    bad.sparse_list = row.clone();
    bad.weight_list = weights_of(12, &row);
    let r = check(&c, &x, &bad);
    assert_eq!(r.count(ViolationKind::HeavyFill), 1, "{r}");
}

/// The short path at, below and above the threshold.
#[test]
fn short_path_at_and_around_the_threshold() {
    let c = cfg(3, 3, 4, 5, 2, 2, Metric::Euclidean); // threshold 4+5+1+4 = 14
    assert_eq!(c.short_threshold(14), 14);
    for (s, short) in [
        (1, true),
        (5, true),
        (13, true),
        (14, true),
        (15, false),
        (16, false),
    ] {
        let shape = Shape {
            b: 2,
            h: 4,
            h_kv: 2,
            s,
            d: 4,
        };
        let n_cached = PqInputs::default_n_cached(&c, s);
        let x = PqInputs::random(&c, shape, n_cached, 100 + s as u64).unwrap();
        let out = assert_matches_naive(&c, &x, &format!("S={s}"));
        assert_eq!(c.is_short(s), short, "S={s}");
        if short {
            assert_eq!(out.total, s);
            for b in 0..2 {
                for h in 0..4 {
                    assert_eq!(out.row(b, h), &(0..s as i64).collect::<Vec<_>>()[..]);
                    assert!(out.weight_row(b, h).iter().all(|&w| w == 1.0));
                }
            }
            // Nothing is quantized on the short path.
            assert_eq!((out.n_cached, &out.codes), (x.n_cached, &x.codes));
        } else {
            assert_eq!(out.total, 3 + 4 + 3);
            assert_eq!(out.n_cached, s - 5);
        }
    }
    // init_offset > S: short path, no quantized keys.
    let shape = Shape {
        b: 1,
        h: 1,
        h_kv: 1,
        s: 3,
        d: 4,
    };
    let x = PqInputs::random(&c, shape, 0, 1).unwrap();
    let out = step(&c, &x).unwrap();
    assert_eq!(out.row(0, 0), &[0, 1, 2]);
    assert!(PqInputs::random(&c, shape, 1, 1).is_err());
}

// ----------------------------------------------------------------------------------
// Randomized comparisons with the naive implementation
// ----------------------------------------------------------------------------------

#[test]
fn reference_matches_naive_on_varied_random_inputs() {
    struct Case {
        c: PqConfig,
        shape: Shape,
        new_keys: usize,
    }
    let base = cfg(8, 16, 12, 8, 2, 3, Metric::Euclidean);
    let sh = |b, h, h_kv, s, d| Shape { b, h, h_kv, s, d };
    let cases = [
        // GQA, B > 1, one new key.
        Case {
            c: base,
            shape: sh(2, 8, 2, 200, 16),
            new_keys: 1,
        },
        // Several new keys, some of them candidates.
        Case {
            c: base,
            shape: sh(2, 4, 4, 300, 8),
            new_keys: 150,
        },
        // Metric ip with GQA, several new keys.
        Case {
            c: PqConfig {
                metric: Metric::Ip,
                ..base
            },
            shape: sh(3, 6, 3, 256, 12),
            new_keys: 40,
        },
        // init_offset < sink (duplicates) with ip.
        Case {
            c: PqConfig {
                sink_size: Size::Count(20),
                init_offset: 4,
                metric: Metric::Ip,
                ..base
            },
            shape: sh(1, 4, 1, 180, 8),
            new_keys: 3,
        },
        // bits = 8, M = 4, no window, no sink.
        Case {
            c: cfg(0, 0, 16, 0, 4, 8, Metric::Euclidean),
            shape: sh(1, 2, 2, 400, 16),
            new_keys: 2,
        },
        // bits = 1, heavy = 0.
        Case {
            c: cfg(2, 2, 0, 1, 1, 1, Metric::Euclidean),
            shape: sh(2, 2, 1, 30, 4),
            new_keys: 5,
        },
        // Window larger than S - init_offset: fill case.
        Case {
            c: cfg(4, 100, 20, 10, 2, 2, Metric::Ip),
            shape: sh(2, 4, 2, 120, 6),
            new_keys: 2,
        },
        // Everything quantized in this step (N_cached = 0).
        Case {
            c: base,
            shape: sh(1, 2, 2, 120, 8),
            new_keys: 112,
        },
        // bf16 inputs.
        Case {
            c: PqConfig {
                input_dtype: DType::BF16,
                weight_dtype: DType::BF16,
                ..base
            },
            shape: sh(2, 4, 2, 220, 16),
            new_keys: 4,
        },
    ];
    for (i, case) in cases.iter().enumerate() {
        let n = case.c.n_quantized(case.shape.s);
        let n_cached = n - case.new_keys.min(n);
        for seed in [i as u64, 1000 + i as u64] {
            let x = PqInputs::random(&case.c, case.shape, n_cached, seed).unwrap();
            let what = format!("case {i} seed {seed} ({} / {})", case.c, case.shape);
            assert_matches_naive(&case.c, &x, &what);
            let y = PqInputs::small_integer(&case.c, case.shape, n_cached, seed).unwrap();
            assert_matches_naive(&case.c, &y, &format!("small-int {what}"));
        }
    }
}

/// On small-integer inputs the planted heavy set (upper-half codes) is what the
/// reference picks, for every head of every group, and exact checking passes.
#[test]
fn small_integer_inputs_have_the_planted_heavy_set() {
    for metric in [Metric::Euclidean, Metric::Ip] {
        let c = PqConfig {
            metric,
            input_dtype: DType::BF16,
            ..cfg(4, 8, 6, 4, 2, 3, Metric::Euclidean)
        };
        let shape = Shape {
            b: 2,
            h: 6,
            h_kv: 2,
            s: 150,
            d: 8,
        };
        let n = c.n_quantized(150);
        // Half the candidates are new keys quantized in this step.
        let x = PqInputs::small_integer(&c, shape, n / 2, 5).unwrap();
        assert!(x.key.iter().all(|&v| v == v.round()), "keys are integers");
        let out = step(&c, &x).unwrap();
        let w0 = c.window_start(150);
        for b in 0..2 {
            for h in 0..6 {
                let g = h / 3;
                let heavy = out.heavy_positions(&c, b, h);
                assert_eq!(heavy.len(), 6);
                for j in 0..w0 {
                    let codes = &out.codes[((b * n + j) * 2 + g) * 2..][..2];
                    let upper = codes.iter().all(|&c| c >= 4);
                    let lower = codes.iter().all(|&c| c < 4);
                    let chosen = heavy.contains(&((j + 4) as i64));
                    assert!(
                        upper == chosen && lower != chosen,
                        "b={b} h={h} j={j} {codes:?}"
                    );
                }
            }
        }
        let r = check_exact(&c, &x, &out);
        assert!(r.passed(), "{r}");
        assert!(r.min_heavy_gap.unwrap() >= 2.0, "{r}");
    }
}

// ----------------------------------------------------------------------------------
// The checker catches planted errors
// ----------------------------------------------------------------------------------

fn checker_fixture() -> (PqConfig, PqInputs, PqOutput) {
    let c = cfg(16, 16, 16, 16, 2, 4, Metric::Euclidean);
    let shape = Shape {
        b: 2,
        h: 4,
        h_kv: 2,
        s: 400,
        d: 8,
    };
    let x = PqInputs::random(&c, shape, PqInputs::default_n_cached(&c, 400) - 2, 77).unwrap();
    let out = step(&c, &x).unwrap();
    assert!(check(&c, &x, &out).passed());
    (c, x, out)
}

/// Replace row (b, h) of `out` by `row` (sorted), keeping weights consistent.
fn set_row(out: &mut PqOutput, b: usize, h: usize, mut row: Vec<i64>) {
    row.sort_unstable();
    let i = (b * out.h + h) * out.total;
    out.sparse_list[i..i + out.total].copy_from_slice(&row);
    let w = weights_of(out.s, &row);
    let i = (b * out.h + h) * out.s;
    out.weight_list[i..i + out.s].copy_from_slice(&w);
}

#[test]
fn checker_catches_a_swapped_heavy_member() {
    let (c, x, out) = checker_fixture();
    let (b, h) = (1, 3);
    let n = out.n_cached;
    let sc = tritonrt::pq::reference::scores(&c, &x, &out.codes, n, b, h, c.window_start(400));
    let heavy = out.heavy_positions(&c, b, h);
    // Best chosen member out, worst unchosen candidate in.
    let best = *heavy
        .iter()
        .max_by(|&&p, &&q| sc[p as usize - 16].total_cmp(&sc[q as usize - 16]))
        .unwrap();
    let worst = (0..sc.len())
        .filter(|&j| !heavy.contains(&(j as i64 + 16)))
        .min_by(|&a, &b| sc[a].total_cmp(&sc[b]))
        .unwrap();
    let mut row: Vec<i64> = out.row(b, h).to_vec();
    let at = row.iter().position(|&p| p == best).unwrap();
    row[at] = worst as i64 + 16;
    let mut bad = out.clone();
    set_row(&mut bad, b, h, row);
    let r = check(&c, &x, &bad);
    assert!(!r.passed());
    assert_eq!(r.count(ViolationKind::HeavyScore), 1, "{r}");
    assert_eq!(r.total_violations(), 1, "{r}");
    let text = r.to_string();
    assert!(
        text.contains("row b=1 h=3") && text.contains("heavy-score"),
        "{text}"
    );
}

#[test]
fn checker_catches_broken_sort_weight_sink_len_and_codes() {
    let (c, x, out) = checker_fixture();

    // Broken sort order (same multiset).
    let mut bad = out.clone();
    bad.sparse_list.swap(20, 21);
    let r = check(&c, &x, &bad);
    assert_eq!(r.count(ViolationKind::SortOrder), 1, "{r}");
    assert_eq!(r.total_violations(), 1, "{r}");

    // A weight where sparse_list has none.
    let mut bad = out.clone();
    let p = out.weight_row(0, 1).iter().position(|&w| w == 0.0).unwrap();
    bad.weight_list[400 + p] = 1.0;
    let r = check(&c, &x, &bad);
    assert_eq!(r.count(ViolationKind::WeightList), 1, "{r}");
    assert_eq!(r.total_violations(), 1, "{r}");

    // A weight of 0.5 counts too.
    let mut bad = out.clone();
    bad.weight_list[0] = 0.5;
    assert_eq!(check(&c, &x, &bad).count(ViolationKind::WeightList), 1);

    // Wrong sink: position 5 replaced by a non-member (weights kept consistent).
    let mut bad = out.clone();
    let mut row = out.row(0, 0).to_vec();
    let free = (0..400).find(|p| !row.contains(p) && *p >= 16).unwrap();
    let at = row.iter().position(|&p| p == 5).unwrap();
    row[at] = free;
    set_row(&mut bad, 0, 0, row);
    let r = check(&c, &x, &bad);
    assert_eq!(r.count(ViolationKind::Sink), 1, "{r}");
    assert!(r.to_string().contains("sink positions missing: [5]"), "{r}");

    // Wrong window: last position dropped for a duplicate.
    let mut bad = out.clone();
    let mut row = out.row(1, 2).to_vec();
    let last = row.len() - 1;
    row[last] = row[0];
    set_row(&mut bad, 1, 2, row);
    assert_eq!(check(&c, &x, &bad).count(ViolationKind::Window), 1);

    // sparse_len.
    let mut bad = out.clone();
    bad.sparse_len[3] = 7;
    assert_eq!(check(&c, &x, &bad).count(ViolationKind::SparseLen), 1);

    // Out of range.
    let mut bad = out.clone();
    let last = bad.sparse_list.len() - 1;
    bad.sparse_list[last] = 400;
    assert!(check(&c, &x, &bad).count(ViolationKind::Range) == 1);

    // A new key's code replaced by a clearly worse one.
    let n = out.n_cached;
    let j = n - 1;
    let i = ((n + j) * 2 + 1) * 2; // b=1, g=1, m=0
    let mut bad = out.clone();
    let good = out.codes[i];
    let cents = &x.centroids[x.centroid_offset(&c, 1, 1, 0)..][..16 * 4];
    let key = &x.key[x.key_offset(1, 1, 16 + j)..][..4];
    let worst =
        (0..16)
            .max_by(|&a, &b| {
                subvector_distance(key, &cents[a * 4..a * 4 + 4], None)
                    .total_cmp(&subvector_distance(key, &cents[b * 4..b * 4 + 4], None))
            })
            .unwrap();
    assert_ne!(worst as i64, good);
    bad.codes[i] = worst as i64;
    let r = check(&c, &x, &bad);
    assert!(r.count(ViolationKind::Codes) == 1, "{r}");
    assert!(r.to_string().contains("new key j="), "{r}");

    // A cached code changed.
    let mut bad = out.clone();
    bad.codes[0] = (bad.codes[0] + 1) % 16;
    let r = check(&c, &x, &bad);
    assert!(r.count(ViolationKind::Codes) >= 1, "{r}");
    assert!(r.to_string().contains("cached code"), "{r}");

    // Wrong shape.
    let mut bad = out.clone();
    bad.sparse_list.pop();
    assert_eq!(check(&c, &x, &bad).count(ViolationKind::Shape), 1);

    // The report lists a bounded number of violations but counts all of them.
    let mut bad = out.clone();
    bad.sparse_len.iter_mut().for_each(|l| *l = 0);
    let r = check_with(
        &c,
        &x,
        &bad,
        &CheckOptions {
            max_listed: 3,
            ..CheckOptions::default()
        },
    );
    assert_eq!(r.total_violations(), 8);
    assert_eq!(r.listed.len(), 3);
    assert!(r.to_string().contains("... and 5 more"), "{r}");
}

/// Two candidates with identical codes straddle the top-k boundary: either choice is
/// correct under the spec rule, only the reference's under exact mode.
#[test]
fn checker_accepts_a_tie_swap_and_exact_mode_does_not() {
    let c = cfg(16, 16, 16, 16, 2, 4, Metric::Euclidean);
    let shape = Shape {
        b: 1,
        h: 2,
        h_kv: 2,
        s: 500,
        d: 8,
    };
    let mut x = PqInputs::random(&c, shape, PqInputs::default_n_cached(&c, 500), 9).unwrap();
    let out = step(&c, &x).unwrap();
    let n = out.n_cached;
    let w0 = c.window_start(500);
    let sc = tritonrt::pq::reference::scores(&c, &x, &out.codes, n, 0, 0, w0);
    let heavy: Vec<usize> = out
        .heavy_positions(&c, 0, 0)
        .iter()
        .map(|&p| p as usize - 16)
        .collect();
    let jc = *heavy
        .iter()
        .min_by(|&&a, &&b| sc[a].total_cmp(&sc[b]))
        .unwrap();
    let ju = (0..w0).find(|j| !heavy.contains(j)).unwrap();
    // Give ju (KV head 0) the codes of jc: identical scores for head 0.
    for m in 0..2 {
        x.codes[(ju * 2) * 2 + m] = x.codes[(jc * 2) * 2 + m];
    }
    let r = step(&c, &x).unwrap();
    let ref_heavy = r.heavy_positions(&c, 0, 0);
    let (pick, other) = if ref_heavy.contains(&((jc + 16) as i64)) {
        (jc, ju)
    } else {
        (ju, jc)
    };
    assert_eq!(pick, jc.min(ju), "ties go to the lower j");
    let mut row = r.row(0, 0).to_vec();
    let at = row.iter().position(|&p| p == (pick + 16) as i64).unwrap();
    row[at] = (other + 16) as i64;
    let mut alt = r.clone();
    set_row(&mut alt, 0, 0, row);
    let spec = check(&c, &x, &alt);
    assert!(spec.passed(), "{spec}");
    assert!(spec.min_heavy_gap.unwrap().abs() < 1e-12, "{spec}");
    let exact = check_exact(&c, &x, &alt);
    assert_eq!(exact.count(ViolationKind::HeavyExact), 1, "{exact}");
    assert_eq!(exact.mode, CheckMode::Exact);
}

/// A new key halfway between two centroids: the other code is accepted as a near-tie,
/// and counted.
#[test]
fn checker_accepts_near_tie_codes() {
    let c = cfg(1, 1, 1, 1, 1, 1, Metric::Euclidean); // K=2, threshold 1+1+1+2 = 5
    let shape = Shape {
        b: 1,
        h: 1,
        h_kv: 1,
        s: 7,
        d: 2,
    };
    // c0 = [0, 0], c1 = [2, 0]; the new key (j=5, position 6) is at x = 1 + 1e-7:
    // |x - c0|^2 - |x - c1|^2 = 4e-7, relative ~2e-7 < 1e-5 of the magnitudes.
    let mut x = PqInputs {
        shape,
        query: vec![1.0, 0.0],
        key: vec![0.0; 14],
        centroids: vec![0.0, 0.0, 2.0, 0.0],
        codes: vec![0, 1, 0, 1, 0],
        n_cached: 5,
        phi: None,
    };
    x.key[12] = 1.0 + 1e-7;
    let out = step(&c, &x).unwrap();
    assert_eq!(out.codes[5], 1);
    let mut alt = out.clone();
    alt.codes[5] = 0;
    let r = check(&c, &x, &alt);
    assert!(r.passed(), "{r}");
    assert_eq!(r.near_tie_codes, 1);
    // Far from the middle the other code is wrong.
    x.key[12] = 1.5;
    let out = step(&c, &x).unwrap();
    let mut alt = out.clone();
    alt.codes[5] = 0;
    assert_eq!(check(&c, &x, &alt).count(ViolationKind::Codes), 1);
}

#[test]
fn invalid_inputs_are_reported_not_panicked() {
    let (c, mut x, out) = checker_fixture();
    x.codes[3] = 99;
    let r = check(&c, &x, &out);
    assert_eq!(r.count(ViolationKind::Inputs), 1, "{r}");
    let e = step(&c, &x).unwrap_err().to_string();
    assert!(e.contains("pq_codebook") && e.contains("99"), "{e}");
    let mut y = PqInputs::random(&c, x.shape, 10, 1).unwrap();
    y.key.pop();
    let e = step(&c, &y).unwrap_err().to_string();
    assert!(
        e.contains("tensor `key`") && e.contains("[B=2, H_kv=2, S=400, D=8]"),
        "{e}"
    );
    let ip = PqConfig {
        metric: Metric::Ip,
        ..c
    };
    let mut z = PqInputs::random(&ip, x.shape, 10, 1).unwrap();
    z.phi = None;
    let e = step(&ip, &z).unwrap_err().to_string();
    assert!(e.contains("pq_ip2l2_phi"), "{e}");
}

// ----------------------------------------------------------------------------------
// Safetensors I/O
// ----------------------------------------------------------------------------------

#[test]
fn safetensors_round_trip_inputs_and_outputs() {
    let dir = tempfile::tempdir().unwrap();
    for (metric, dtype, wdtype) in [
        (Metric::Euclidean, DType::F32, DType::F32),
        (Metric::Ip, DType::BF16, DType::BF16),
        (Metric::Euclidean, DType::F16, DType::F32),
    ] {
        let c = PqConfig {
            metric,
            input_dtype: dtype,
            weight_dtype: wdtype,
            ..cfg(8, 8, 8, 8, 2, 3, metric)
        };
        let shape = Shape {
            b: 2,
            h: 4,
            h_kv: 2,
            s: 120,
            d: 8,
        };
        let x = PqInputs::random(&c, shape, 100, 21).unwrap();
        let path = dir.path().join(format!("in-{metric}-{dtype}.safetensors"));
        write_inputs(&path, &c, &x).unwrap();
        let (c2, x2) = read_inputs(&path, &PqConfigOverrides::default()).unwrap();
        assert_eq!(c2, c);
        assert_eq!(x2, x);

        let out = step(&c, &x).unwrap();
        let opath = dir.path().join("out.safetensors");
        write_outputs(&opath, &c, &out).unwrap();
        let back = read_outputs(&opath).unwrap();
        assert_eq!(back, out);
        // The file's dtypes and shapes as issue 3 says.
        let bytes = std::fs::read(&opath).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let w = st.tensor("weight_list").unwrap();
        assert_eq!(w.shape(), &[2, 4, 120]);
        assert_eq!(
            w.dtype(),
            if wdtype == DType::F32 {
                safetensors::Dtype::F32
            } else {
                safetensors::Dtype::BF16
            }
        );
        assert_eq!(
            st.tensor("sparse_list").unwrap().shape(),
            &[2, 4, out.total]
        );
        assert_eq!(
            st.tensor("sparse_len").unwrap().dtype(),
            safetensors::Dtype::I64
        );
        assert_eq!(st.tensor("pq_codebook").unwrap().shape(), &[2, 112, 2, 2]);
    }
}

/// Write a safetensors file from (name, dtype, shape, bytes) and metadata.
fn write_raw(
    path: &Path,
    tensors: &[(&str, safetensors::Dtype, Vec<usize>, Vec<u8>)],
    meta: &[(&str, &str)],
) {
    let views: Vec<(&str, safetensors::tensor::TensorView)> = tensors
        .iter()
        .map(|(n, d, s, b)| {
            (
                *n,
                safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap(),
            )
        })
        .collect();
    let meta = meta
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    std::fs::write(path, safetensors::serialize(views, Some(meta)).unwrap()).unwrap();
}

fn f32_bytes(n: usize) -> Vec<u8> {
    (0..n)
        .flat_map(|i| (i as f32 * 0.25 - 3.0).to_le_bytes())
        .collect()
}

fn i64_bytes(n: usize) -> Vec<u8> {
    (0..n)
        .flat_map(|i| ((i % 4) as i64).to_le_bytes())
        .collect()
}

const META: [(&str, &str); 7] = [
    ("sink_size", "2"),
    ("window_size", "2"),
    ("heavy_size", "2"),
    ("init_offset", "2"),
    ("pq_group_factor", "2"),
    ("pq_bits", "2"),
    ("metric", "euclidean"),
];

/// A valid input set: B=1, H=2, H_kv=1, S=20, D=4, M=2, K=4, N=10.
fn good_tensors() -> Vec<(&'static str, safetensors::Dtype, Vec<usize>, Vec<u8>)> {
    use safetensors::Dtype::*;
    vec![
        ("query", F32, vec![1, 2, 1, 4], f32_bytes(8)),
        ("key", F32, vec![1, 1, 20, 4], f32_bytes(80)),
        ("pq_centroids", F32, vec![1, 1, 2, 4, 2], f32_bytes(16)),
        ("pq_codebook", I64, vec![1, 10, 1, 2], i64_bytes(20)),
    ]
}

fn read_err(path: &Path) -> String {
    read_inputs(path, &PqConfigOverrides::default())
        .unwrap_err()
        .to_string()
}

#[test]
fn bad_input_files_name_the_tensor_and_the_expectation() {
    use safetensors::Dtype::*;
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("in.safetensors");

    write_raw(&p, &good_tensors(), &META);
    let (c, x) = read_inputs(&p, &PqConfigOverrides::default()).unwrap();
    assert_eq!((c.pq_group_factor, c.pq_bits, x.n_cached), (2, 2, 10));
    assert_eq!(
        x.shape,
        Shape {
            b: 1,
            h: 2,
            h_kv: 1,
            s: 20,
            d: 4
        }
    );
    assert!(step(&c, &x).is_ok());

    // Missing tensor.
    let t: Vec<_> = good_tensors()
        .into_iter()
        .filter(|t| t.0 != "key")
        .collect();
    write_raw(&p, &t, &META);
    let e = read_err(&p);
    assert!(
        e.contains("tensor `key`")
            && e.contains("no such tensor")
            && e.contains("[B=1, H_kv, S, D=4]"),
        "{e}"
    );

    // Wrong dtype: key in F16 while the query is F32; centroids in F16; codebook in I32.
    let mut t = good_tensors();
    t[1] = ("key", F16, vec![1, 1, 20, 4], vec![0; 160]);
    write_raw(&p, &t, &META);
    let e = read_err(&p);
    assert!(
        e.contains("tensor `key`")
            && e.contains("dtype F32 (the dtype of `query`)")
            && e.contains("got dtype F16"),
        "{e}"
    );
    let mut t = good_tensors();
    t[2] = ("pq_centroids", F16, vec![1, 1, 2, 4, 2], vec![0; 32]);
    write_raw(&p, &t, &META);
    let e = read_err(&p);
    assert!(
        e.contains("tensor `pq_centroids`") && e.contains("dtype F32"),
        "{e}"
    );
    let mut t = good_tensors();
    t[3] = ("pq_codebook", I32, vec![1, 10, 1, 2], vec![0; 80]);
    write_raw(&p, &t, &META);
    let e = read_err(&p);
    assert!(
        e.contains("tensor `pq_codebook`")
            && e.contains("dtype I64")
            && e.contains("got dtype I32"),
        "{e}"
    );
    let mut t = good_tensors();
    t[0] = ("query", I64, vec![1, 2, 1, 4], vec![0; 64]);
    write_raw(&p, &t, &META);
    let e = read_err(&p);
    assert!(
        e.contains("tensor `query`") && e.contains("F32, BF16 or F16"),
        "{e}"
    );

    // Wrong shapes.
    let mut t = good_tensors();
    t[2] = ("pq_centroids", F32, vec![1, 1, 2, 8, 2], f32_bytes(32));
    write_raw(&p, &t, &META);
    let e = read_err(&p);
    assert!(
        e.contains("tensor `pq_centroids`") && e.contains("K=4") && e.contains("[1, 1, 2, 8, 2]"),
        "{e}"
    );
    let mut t = good_tensors();
    t[3] = ("pq_codebook", I64, vec![1, 19, 1, 2], i64_bytes(38));
    write_raw(&p, &t, &META);
    let e = read_err(&p);
    assert!(
        e.contains("tensor `pq_codebook`") && e.contains("N <= S - init_offset = 18"),
        "{e}"
    );
    let mut t = good_tensors();
    t[0] = ("query", F32, vec![1, 2, 2, 2], f32_bytes(8));
    write_raw(&p, &t, &META);
    let e = read_err(&p);
    assert!(
        e.contains("tensor `query`") && e.contains("[B, H, 1, D]"),
        "{e}"
    );
    let mut t = good_tensors();
    t[1] = ("key", F32, vec![1, 1, 20, 2], f32_bytes(40));
    write_raw(&p, &t, &META);
    assert!(read_err(&p).contains("tensor `key`"));

    // A code out of range.
    let mut t = good_tensors();
    let mut codes = i64_bytes(20);
    codes[8..16].copy_from_slice(&7i64.to_le_bytes());
    t[3] = ("pq_codebook", I64, vec![1, 10, 1, 2], codes);
    write_raw(&p, &t, &META);
    let e = read_err(&p);
    assert!(
        e.contains("pq_codebook") && e.contains("0..4") && e.contains("7 at flat index 1"),
        "{e}"
    );

    // Metric ip without phi.
    let mut meta = META;
    meta[6] = ("metric", "ip");
    let mut t = good_tensors();
    t[2] = ("pq_centroids", F32, vec![1, 1, 2, 4, 3], f32_bytes(24));
    write_raw(&p, &t, &meta);
    let e = read_err(&p);
    assert!(
        e.contains("tensor `pq_ip2l2_phi`") && e.contains("metric ip"),
        "{e}"
    );
    // ... with phi it reads.
    t.push(("pq_ip2l2_phi", F32, vec![2], f32_bytes(2)));
    write_raw(&p, &t, &meta);
    assert!(read_inputs(&p, &PqConfigOverrides::default()).is_ok());

    // Missing and bad metadata; an override fills the gap.
    write_raw(&p, &good_tensors(), &META[1..]);
    let e = read_err(&p);
    assert!(
        e.contains("missing config value `sink_size`") && e.contains("--sink-size"),
        "{e}"
    );
    let over = PqConfigOverrides {
        sink_size: Some(Size::Count(3)),
        ..Default::default()
    };
    assert_eq!(read_inputs(&p, &over).unwrap().0.sink_size, Size::Count(3));
    let mut meta = META;
    meta[1] = ("window_size", "eight");
    write_raw(&p, &good_tensors(), &meta);
    let e = read_err(&p);
    assert!(
        e.contains("window_size = eight") && e.contains("unsigned integer"),
        "{e}"
    );
    let mut meta = META;
    meta[4] = ("pq_group_factor", "4");
    write_raw(&p, &good_tensors(), &meta);
    let e = read_err(&p);
    assert!(e.contains("pq_centroids") && e.contains("M=4"), "{e}");
    // pq_group_factor, pq_bits and metric can come from the centroids' shape.
    write_raw(&p, &good_tensors(), &META[..4]);
    let (c, _) = read_inputs(&p, &PqConfigOverrides::default()).unwrap();
    assert_eq!(
        (c.pq_group_factor, c.pq_bits, c.metric),
        (2, 2, Metric::Euclidean)
    );
    // --dtype must match the file.
    write_raw(&p, &good_tensors(), &META);
    let over = PqConfigOverrides {
        input_dtype: Some(DType::BF16),
        ..Default::default()
    };
    let e = read_inputs(&p, &over).unwrap_err().to_string();
    assert!(e.contains("tensor `query`") && e.contains("bf16"), "{e}");
}

#[test]
fn truncated_and_garbage_files_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("in.safetensors");
    write_raw(&p, &good_tensors(), &META);
    let full = std::fs::read(&p).unwrap();

    std::fs::write(&p, &full[..full.len() - 10]).unwrap();
    let e = read_err(&p);
    assert!(
        e.contains("not a valid safetensors file") && e.contains("truncated"),
        "{e}"
    );
    std::fs::write(&p, &full[..40]).unwrap();
    let e = read_err(&p);
    assert!(e.contains("truncated"), "{e}");
    std::fs::write(&p, &full[..5]).unwrap();
    let e = read_err(&p);
    assert!(
        e.contains("shorter than the 8-byte header-length prefix"),
        "{e}"
    );
    // Garbage: text whose first 8 bytes read as an absurd header length.
    std::fs::write(
        &p,
        b"this is not a safetensors file at all, just some words",
    )
    .unwrap();
    let e = read_err(&p);
    assert!(
        e.contains("not a valid safetensors file") && e.contains(&p.display().to_string()),
        "{e}"
    );
    // Garbage with a plausible length prefix.
    let mut g = 16u64.to_le_bytes().to_vec();
    g.extend_from_slice(b"\x00\x01garbage garbage");
    std::fs::write(&p, &g).unwrap();
    let e = read_err(&p);
    assert!(e.contains("header is not a JSON object"), "{e}");
    // Missing file.
    let e = read_err(&dir.path().join("nope.safetensors"));
    assert!(e.contains("nope.safetensors"), "{e}");
}

#[test]
fn writes_are_atomic() {
    let dir = tempfile::tempdir().unwrap();
    let (c, _x, out) = checker_fixture();
    let leftovers = |d: &Path| -> Vec<String> {
        std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains(".tmp") || n.starts_with(".tritonrt"))
            .collect()
    };
    // Target is an existing directory: the rename fails, nothing is left behind and the
    // directory is untouched.
    let target = dir.path().join("out.safetensors");
    std::fs::create_dir(&target).unwrap();
    std::fs::write(target.join("keep"), b"x").unwrap();
    let e = write_outputs(&target, &c, &out).unwrap_err().to_string();
    assert!(e.contains("out.safetensors"), "{e}");
    assert!(
        leftovers(dir.path()).is_empty(),
        "{:?}",
        leftovers(dir.path())
    );
    assert!(target.join("keep").exists());
    // Missing parent directory.
    let e = write_atomic(&dir.path().join("no/such/dir/out.safetensors"), b"abc")
        .unwrap_err()
        .to_string();
    assert!(e.contains("no/such/dir"), "{e}");
    // An inconsistent output is refused before anything is written; an existing file
    // stays as it was.
    let good = dir.path().join("good.safetensors");
    write_outputs(&good, &c, &out).unwrap();
    let before = std::fs::read(&good).unwrap();
    let mut bad = out.clone();
    bad.weight_list.pop();
    let e = write_outputs(&good, &c, &bad).unwrap_err().to_string();
    assert!(e.contains("weight_list"), "{e}");
    assert_eq!(std::fs::read(&good).unwrap(), before);
    assert!(leftovers(dir.path()).is_empty());
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&good).unwrap().permissions().mode() & 0o777;
        assert_eq!(
            mode, 0o644,
            "a new output file is rw-r--r--, not the tempfile's 0600"
        );
        std::fs::set_permissions(&good, std::fs::Permissions::from_mode(0o640)).unwrap();
    }
    // Overwriting works, keeps the file's permissions and leaves no temporary file.
    write_outputs(&good, &c, &out).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&good).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o640);
    }
    assert_eq!(read_outputs(&good).unwrap(), out);
    assert!(leftovers(dir.path()).is_empty());
}

// ----------------------------------------------------------------------------------
// The binary
// ----------------------------------------------------------------------------------

const SMALL: [&str; 10] = [
    "--seq-len",
    "600",
    "--heads",
    "4",
    "--kv-heads",
    "2",
    "--head-dim",
    "16",
    "--seed",
    "3",
];

#[test]
fn cli_run_cpu_backend_on_a_small_shape() {
    let dir = tempfile::tempdir().unwrap();
    let inp = dir.path().join("in.safetensors");
    let out1 = dir.path().join("out1.safetensors");
    let out2 = dir.path().join("out2.safetensors");
    let mut args = vec!["run", "--backend", "cpu"];
    args.extend(SMALL);
    let (i, o) = (inp.to_str().unwrap(), out1.to_str().unwrap());
    args.extend([
        "--save-input",
        i,
        "--output",
        o,
        "--metric",
        "ip",
        "--dtype",
        "bf16",
    ]);
    let (code, stdout, stderr) = tritonrt(&args);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    for want in [
        "check:   skipped (cpu backend is the reference)",
        "query [1, 4, 1, 16] bf16",
        "key [1, 2, 600, 16] bf16",
        "pq_centroids [1, 2, 2, 64, 9] fp32",
        "sparse_list [1, 4, 384] i64",
        "us per step",
        "sparse_list[0, 0, :] = [0, 1, 2,",
    ] {
        assert!(stdout.contains(want), "missing {want:?} in\n{stdout}");
    }
    // The same step from the saved file gives the same outputs.
    let o2 = out2.to_str().unwrap();
    let (code, stdout, stderr) =
        tritonrt(&["run", "--backend", "cpu", "--input", i, "--output", o2]);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert_eq!(read_outputs(&out1).unwrap(), read_outputs(&out2).unwrap());
    let (cfg, x) = read_inputs(&inp, &PqConfigOverrides::default()).unwrap();
    assert_eq!(cfg.metric, Metric::Ip);
    assert!(check(&cfg, &x, &read_outputs(&out2).unwrap()).passed());
}

#[test]
fn cli_run_auto_falls_back_and_gpu_refuses() {
    let mut args = vec!["run"];
    args.extend(SMALL);
    let (code, stdout, stderr) = tritonrt(&args);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(
        stdout.contains("no GPU backend available: running the CPU reference"),
        "{stdout}"
    );

    let mut args = vec!["run", "--backend", "gpu"];
    args.extend(SMALL);
    let (code, _, stderr) = tritonrt(&args);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("error: no GPU backend available"),
        "{stderr}"
    );
}

#[test]
fn cli_run_reports_bad_input_clearly() {
    let (code, _, stderr) = tritonrt(&[
        "run",
        "--backend",
        "cpu",
        "--head-dim",
        "10",
        "--pq-group-factor",
        "3",
        "--seq-len",
        "500",
    ]);
    assert_eq!(code, 2);
    assert!(
        stderr.contains("pq_group_factor = 3") && stderr.contains("D = 10"),
        "{stderr}"
    );

    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("bad.safetensors");
    let t: Vec<_> = good_tensors()
        .into_iter()
        .filter(|t| t.0 != "pq_centroids")
        .collect();
    write_raw(&p, &t, &META);
    let (code, _, stderr) = tritonrt(&["run", "--backend", "cpu", "--input", p.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(
        stderr.contains("tensor `pq_centroids`") && stderr.contains("no such tensor"),
        "{stderr}"
    );
    assert!(
        stderr.contains("caused by") || stderr.contains("reading the inputs"),
        "{stderr}"
    );

    let (code, _, stderr) = tritonrt(&["run", "--input", "x.safetensors", "--seq-len", "5"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("cannot be used with"), "{stderr}");
}

// ----------------------------------------------------------------------------------
// Size and speed on the spec's workloads (release build; run with --ignored)
// ----------------------------------------------------------------------------------

/// The reference and large workloads end to end on the CPU: generate, step, check.
/// `cargo test --release --test pq_cpu -- --ignored --nocapture` prints the timings.
#[test]
#[ignore = "large: needs a release build and ~1.5 GB of memory"]
fn spec_workloads_generate_step_and_check() {
    for (name, shape) in [("reference", Shape::reference()), ("large", Shape::large())] {
        let c = PqConfig::reference_workload();
        let t = std::time::Instant::now();
        let x = PqInputs::random(&c, shape, PqInputs::default_n_cached(&c, shape.s), 1).unwrap();
        let gen = t.elapsed();
        let t = std::time::Instant::now();
        let out = step(&c, &x).unwrap();
        let st = t.elapsed();
        let t = std::time::Instant::now();
        let r = check(&c, &x, &out);
        let ck = t.elapsed();
        eprintln!(
            "{name} ({shape}): generate {:.0} ms, step {:.0} ms, check {:.0} ms: {r}",
            gen.as_secs_f64() * 1e3,
            st.as_secs_f64() * 1e3,
            ck.as_secs_f64() * 1e3
        );
        assert!(r.passed(), "{r}");
        assert_eq!(out.total, 384);
        assert_eq!(out.n_cached, shape.s - 128);
        // Every row has 128 heavy hitters among the candidates.
        let w0 = c.window_start(shape.s) as i64;
        for (b, h) in [(0, 0), (shape.b - 1, shape.h - 1)] {
            let heavy = out.heavy_positions(&c, b, h);
            assert_eq!(heavy.len(), 128);
            assert!(heavy.iter().all(|&p| p >= 128 && p < 128 + w0));
        }
    }
}

/// A file input with a NaN or an infinity is refused, naming the tensor and the first
/// flat index; `--allow-nonfinite` runs it, and the CPU reference ranks a NaN score
/// last (below every finite score).
#[test]
fn cli_refuses_nonfinite_inputs_unless_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let c = PqConfig::reference_workload();
    let shape = Shape {
        b: 1,
        h: 4,
        h_kv: 2,
        s: 700,
        d: 16,
    };
    for (tensor, flat, v) in [("query", 5usize, f32::NAN), ("key", 1234, f32::INFINITY)] {
        let mut x = PqInputs::random(&c, shape, 500, 9).unwrap();
        match tensor {
            "query" => x.query[flat] = v,
            _ => x.key[flat] = v,
        }
        assert_eq!(
            x.first_nonfinite().map(|(t, i, _)| (t, i)),
            Some((tensor, flat))
        );
        let path = dir.path().join(format!("{tensor}.safetensors"));
        write_inputs(&path, &c, &x).unwrap();
        let p = path.to_str().unwrap();
        let (code, _, err) = tritonrt(&["run", "--backend", "cpu", "--input", p]);
        assert_ne!(code, 0, "non-finite {tensor} accepted");
        assert!(
            err.contains(&format!("tensor {tensor}"))
                && err.contains(&format!("flat index {flat}")),
            "{err}"
        );
        let (code, out, err) =
            tritonrt(&["run", "--backend", "cpu", "--input", p, "--allow-nonfinite"]);
        assert_eq!(code, 0, "--allow-nonfinite: {out}{err}");
    }
    // NaN ranks below every finite score (and -inf); among NaNs the lowest index wins
    let scores = [1.0, f64::NAN, f64::NEG_INFINITY, 3.0, f64::NAN, -2.0];
    let mut top = tritonrt::pq::reference::top_k(&scores, 5);
    top.sort_unstable();
    assert_eq!(top, vec![0, 1, 2, 3, 5]);
}

/// The reference's quantization of a non-finite key (spec "Non-finite inputs"): the lowest
/// code whose distance is not NaN, even when that distance is +inf; code 0 when every
/// distance is NaN; NaN distances never taken beside finite ones.
#[test]
fn reference_quantizes_nonfinite_keys_to_the_lowest_non_nan_code() {
    use tritonrt::pq::reference::quantize_subvector;
    let (inf, nan) = (f32::INFINITY, f32::NAN);
    // x = (+inf, 0): centroid 0 has +inf in coordinate 0 (inf - inf: NaN), centroid 1
    // is finite (distance +inf), centroid 2 too.
    let cents = [inf, 0.0, 1.0, 2.0, -1.0, 0.5];
    assert_eq!(quantize_subvector(&[inf, 0.0], &cents, 2, None).0, 1);
    // x with a NaN coordinate: every distance NaN -> code 0
    let (c, d) = quantize_subvector(&[nan, 1.0], &cents, 2, None);
    assert_eq!(c, 0);
    assert!(d.is_nan());
    // a finite key beside a NaN centroid: the NaN centroid is skipped although it comes first
    let cents = [nan, 0.0, 3.0, 3.0, 1.0, 1.0];
    assert_eq!(quantize_subvector(&[1.0, 1.0], &cents, 2, None).0, 2);
    // finite everything: argmin, lowest code on ties
    let cents = [2.0, 0.0, 0.0, 2.0, 0.0, 2.0];
    assert_eq!(quantize_subvector(&[1.0, 1.0], &cents, 2, None).0, 0);
}

/// The checker orders non-finite scores as the spec does: an output whose heavy set takes
/// a NaN-scored key over a finite one, or a higher NaN j over a lower one, fails; the
/// reference's own output passes.
#[test]
fn checker_ranks_nan_scores_last() {
    let cfg = PqConfig {
        heavy_size: Size::Count(16),
        sink_size: Size::Count(4),
        window_size: Size::Count(8),
        init_offset: 4,
        ..PqConfig::reference_workload()
    };
    let shape = Shape {
        b: 1,
        h: 2,
        h_kv: 1,
        s: 700,
        d: 16,
    };
    let mut x = PqInputs::random(&cfg, shape, 700 - 4 - 1, 11).unwrap();
    // head 0: every score NaN (the heavy picks must be the 16 lowest candidates)
    x.query[0] = f32::NAN;
    // head 1: code 0 of subvector 0 scores NaN
    x.centroids[0] = f32::NAN;
    let out = tritonrt::pq::reference::step(&cfg, &x).unwrap();
    let rep = check(&cfg, &x, &out);
    assert!(rep.passed(), "{rep}");
    let row0: Vec<i64> = out.row(0, 0).to_vec();
    let heavy0: Vec<i64> = row0[4..20].to_vec();
    assert_eq!(
        heavy0,
        (4..20).collect::<Vec<i64>>(),
        "NaN row: lowest j first"
    );
    // swap one heavy pick of head 0 for a higher NaN j: fails
    let mut bad = out.clone();
    let t = out.total;
    bad.sparse_list[4 + 15] = 100;
    bad.weight_list[19] = 0.0;
    bad.weight_list[100] = 1.0;
    assert!(
        !check(&cfg, &x, &bad).passed(),
        "a higher NaN j taken over a lower one passed"
    );
    // head 1: take a NaN-scored key (code 0 in subvector 0) over a finite one: fails
    let g_codes = |j: usize| out.codes[j * cfg.m()];
    if let Some(jn) = (0..600).find(|&j| g_codes(j) == 0) {
        let row1 = &out.sparse_list[t..2 * t];
        let mut heavy1: Vec<i64> = row1[4..20].to_vec();
        let pos = jn as i64 + 4;
        if !heavy1.contains(&pos) {
            let mut bad = out.clone();
            let dropped = heavy1[0];
            heavy1[0] = pos;
            heavy1.sort_unstable();
            bad.sparse_list[t + 4..t + 20].copy_from_slice(&heavy1);
            let s = shape.s;
            bad.weight_list[s + dropped as usize] = 0.0;
            bad.weight_list[s + pos as usize] = 1.0;
            let rep = check(&cfg, &x, &bad);
            assert!(!rep.passed(), "a NaN score taken over a finite one passed");
        }
    }
}

/// Exact mode on a candidate that quantized a new key to the other side of a distance tie
/// (accepted as a near-tie code): its heavy set follows its own codes, so the exact check
/// compares with the reference run on those codes. Key 2 lies halfway between centroids
/// (1, 0, 0, 0) and (-1, 0, 0, 0); the reference takes code 0 (score 1, the only heavy
/// pick), the candidate code 1 (score -1, tied with every other candidate, so the lowest
/// position is picked). A candidate with another heavy pick on the same codes still
/// fails the exact check (it passes the spec's rule: the scores tie).
#[test]
fn exact_check_follows_the_candidates_near_tie_codes() {
    let c = PqConfig {
        sink_size: Size::Count(0),
        window_size: Size::Count(1),
        heavy_size: Size::Count(1),
        init_offset: 0,
        pq_group_factor: 1,
        pq_bits: 1,
        ..PqConfig::reference_workload()
    };
    let shape = Shape {
        b: 1,
        h: 1,
        h_kv: 1,
        s: 6,
        d: 4,
    };
    let at = |v: f32| [v, 0.0, 0.0, 0.0];
    let x = PqInputs {
        shape,
        query: at(1.0).to_vec(),
        key: [at(-3.0), at(-3.0), at(0.0), at(-3.0), at(-3.0), at(3.0)].concat(),
        centroids: [at(1.0), at(-1.0)].concat(),
        codes: vec![],
        n_cached: 0,
        phi: None,
    };
    let reference = step(&c, &x).unwrap();
    assert_eq!(reference.codes, vec![1, 1, 0, 1, 1, 0]);
    assert_eq!(reference.row(0, 0), &[2, 5]);
    let on_other_code = PqInputs {
        codes: vec![1, 1, 1, 1, 1, 0],
        n_cached: 6,
        ..x.clone()
    };
    let candidate = step(&c, &on_other_code).unwrap();
    assert_eq!(candidate.row(0, 0), &[0, 5]);
    let report = check_exact(&c, &x, &candidate);
    assert!(report.passed(), "{report}");
    assert_eq!(report.near_tie_codes, 1, "{report}");
    // another tied pick on the candidate's own codes: the spec's rule holds, exact fails
    let mut other = candidate.clone();
    other.sparse_list = vec![1, 5];
    other.weight_list = vec![0.0, 1.0, 0.0, 0.0, 0.0, 1.0];
    assert!(check(&c, &x, &other).passed());
    let report = check_exact(&c, &x, &other);
    assert!(
        !report.passed(),
        "a heavy pick other than the reference's on the same codes"
    );
}
