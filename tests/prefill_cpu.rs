//! CPU tests of the prefill's host side: config validation, the init keys, the f64
//! reference (against exact separated clusters, hand-made cases and an independent naive
//! k-means) and the checker (passes the reference, fails planted errors).

use tritonrt::pq::prefill::check::{check, check_exact, PrefillViolationKind as Kind};
use tritonrt::pq::prefill::reference::{prefill, sq_norm_f32, RefPrefill};
use tritonrt::pq::prefill::{
    init_indices, upstream_codes, KmeansInit, PrefillConfig, PrefillInputs, PrefillOutput,
    PrefillShape,
};
use tritonrt::pq::reference::quantize_subvector;
use tritonrt::pq::{DType, Metric, PqConfig};

// ----------------------------------------------------------------------------------
// Helpers
// ----------------------------------------------------------------------------------

fn cfg(m: usize, bits: u32, metric: Metric, init: KmeansInit) -> PrefillConfig {
    PrefillConfig {
        pq_group_factor: m,
        pq_bits: bits,
        metric,
        init_offset: 16,
        kmeans_iter: 10,
        init,
        input_dtype: DType::F32,
    }
}

fn shape(b: usize, h_kv: usize, s: usize, d: usize) -> PrefillShape {
    PrefillShape { b, h_kv, s, d }
}

fn err(c: &PrefillConfig, sh: &PrefillShape) -> String {
    c.validate(sh).unwrap_err().to_string()
}

/// The keys of group `gi` as f32 subvectors, `n` of them.
fn group_keys(c: &PrefillConfig, inp: &PrefillInputs, gi: usize) -> Vec<Vec<f32>> {
    let sh = inp.shape;
    let ds = c.d_sub(sh.d);
    let (b, g, m) = c.group_coords(&sh, gi);
    (0..c.n(sh.s))
        .map(|j| {
            let o = sh.key_offset(b, g, c.init_offset + j) + m * ds;
            inp.key[o..o + ds].to_vec()
        })
        .collect()
}

/// Code of key `j` of group `gi` in an upstream-layout code vector.
fn code_of(c: &PrefillConfig, sh: &PrefillShape, codes: &[i64], gi: usize, j: usize) -> i64 {
    let (b, g, m) = c.group_coords(sh, gi);
    codes[c.code_index(sh, b, j, g, m)]
}

// ----------------------------------------------------------------------------------
// Config and init
// ----------------------------------------------------------------------------------

#[test]
fn validation_names_field_value_and_what_is_allowed() {
    let c = cfg(2, 6, Metric::Euclidean, KmeansInit::Strided);
    let sh = shape(1, 2, 100, 64);
    // n = 100 - 16 = 84 >= 64: fine; S = 79 gives n = 63 < 64.
    c.validate(&sh).unwrap();
    let e = err(&c, &shape(1, 2, 79, 64));
    assert!(
        e.contains("seq_len = 79")
            && e.contains("n = S - init_offset = 79 - 16 = 63")
            && e.contains("K = 2^bits = 2^6 = 64"),
        "{e}"
    );
    // init_offset beyond S: n = 0.
    let e = err(
        &PrefillConfig {
            init_offset: 500,
            ..c
        },
        &sh,
    );
    assert!(e.contains("n = S - init_offset = 100 - 500 = 0"), "{e}");
    let e = err(
        &PrefillConfig {
            kmeans_iter: 0,
            ..c
        },
        &sh,
    );
    assert!(e.contains("kmeans_iter = 0") && e.contains("1..="), "{e}");
    let e = err(
        &PrefillConfig {
            pq_group_factor: 3,
            ..c
        },
        &sh,
    );
    assert!(
        e.contains("pq_group_factor = 3")
            && e.contains("D = 64")
            && e.contains("D % M = 64 % 3 = 1"),
        "{e}"
    );
    let e = err(
        &PrefillConfig {
            pq_group_factor: 0,
            ..c
        },
        &sh,
    );
    assert!(e.contains("pq_group_factor = 0"), "{e}");
    for bits in [0, 9] {
        let e = err(&PrefillConfig { pq_bits: bits, ..c }, &sh);
        assert!(
            e.contains(&format!("pq_bits = {bits}")) && e.contains("1..=8"),
            "{e}"
        );
    }
    let e = err(
        &PrefillConfig {
            pq_group_factor: 1,
            ..c
        },
        &shape(1, 1, 100, 512),
    );
    assert!(
        e.contains("pq_group_factor = 1") && e.contains("D/M <= 256") && e.contains("512/1 = 512"),
        "{e}"
    );
    // D/M = 256 is allowed.
    PrefillConfig {
        pq_group_factor: 2,
        ..c
    }
    .validate(&shape(1, 1, 100, 512))
    .unwrap();
    for (field, sh) in [
        ("batch", shape(0, 2, 100, 64)),
        ("kv_heads", shape(1, 0, 100, 64)),
        ("seq_len", shape(1, 2, 0, 64)),
        ("head_dim", shape(1, 2, 100, 0)),
    ] {
        let e = err(&c, &sh);
        assert!(e.contains(&format!("{field} = 0")), "{e}");
    }
}

#[test]
fn inputs_validation_names_the_tensor() {
    let c = cfg(2, 3, Metric::Euclidean, KmeansInit::Strided);
    let sh = shape(1, 2, 40, 8);
    let mut inp = PrefillInputs::random(&c, sh, 1).unwrap();
    inp.validate(&c).unwrap();
    inp.key[77] = f32::NAN;
    assert_eq!(
        inp.first_nonfinite().map(|(t, i, _)| (t, i)),
        Some(("key", 77))
    );
    let e = inp.validate(&c).unwrap_err().to_string();
    assert!(
        e.contains("`key`") && e.contains("NaN at flat index 77") && e.contains("finite"),
        "{e}"
    );
    assert!(prefill(&c, &inp).is_err());
    inp.key.pop();
    let e = inp.validate(&c).unwrap_err().to_string();
    assert!(e.contains("`key`") && e.contains("639 values"), "{e}");
    // Given needs centroids of the right length.
    let g = PrefillConfig {
        init: KmeansInit::Given,
        ..c
    };
    let inp = PrefillInputs::random(&c, sh, 1).unwrap();
    let e = inp.validate(&g).unwrap_err().to_string();
    assert!(
        e.contains("pq_centroids") && e.contains("none") && e.contains("K=8"),
        "{e}"
    );
    let mut inp = PrefillInputs::random(&g, sh, 1).unwrap();
    inp.validate(&g).unwrap();
    inp.centroids.as_mut().unwrap()[5] = f32::INFINITY;
    let e = inp.validate(&g).unwrap_err().to_string();
    assert!(
        e.contains("pq_centroids") && e.contains("inf at flat index 5"),
        "{e}"
    );
}

#[test]
fn init_and_config_helpers() {
    for (s, i) in [
        ("strided", KmeansInit::Strided),
        ("random:42", KmeansInit::Random { seed: 42 }),
        ("given", KmeansInit::Given),
    ] {
        assert_eq!(s.parse::<KmeansInit>().unwrap(), i);
        assert_eq!(i.to_string(), s);
    }
    assert_eq!(
        "Random".parse::<KmeansInit>().unwrap(),
        KmeansInit::Random { seed: 0 }
    );
    assert!("random:x".parse::<KmeansInit>().is_err());
    assert!("kmeans++".parse::<KmeansInit>().is_err());

    let pq = PqConfig {
        metric: Metric::Ip,
        input_dtype: DType::BF16,
        ..PqConfig::reference_workload()
    };
    let c = PrefillConfig::from_pq(&pq, 7, KmeansInit::Strided);
    assert_eq!(
        (c.m(), c.pq_bits, c.init_offset, c.kmeans_iter),
        (2, 6, 128, 7)
    );
    assert_eq!(c.pq_config(128, 128, 128, DType::F32), pq);
    let sh = shape(2, 3, 1000, 128);
    assert_eq!((c.k_centroids(), c.d_sub(128), c.d_c(128)), (64, 64, 65));
    assert_eq!((c.n(1000), c.n(100), c.groups(&sh)), (872, 0, 12));
    assert_eq!(c.group_coords(&sh, 11), (1, 2, 1));
    assert_eq!(c.group_coords(&sh, 4), (0, 2, 0));
    assert_eq!(c.centroids_len(&sh), 12 * 64 * 65);
    assert_eq!(c.codes_len(&sh), 2 * 872 * 3 * 2);
}

#[test]
fn strided_init_is_floor_k_n_over_k() {
    let c = cfg(2, 3, Metric::Euclidean, KmeansInit::Strided);
    let sh = shape(2, 1, 16 + 21, 8);
    let idx = init_indices(&c, &sh).unwrap();
    let row = [0u32, 2, 5, 7, 10, 13, 15, 18]; // floor(k * 21 / 8)
    assert_eq!(idx.len(), 4 * 8);
    for g in idx.chunks(8) {
        assert_eq!(g, row);
    }
    // Large n: computed without overflow.
    let c8 = cfg(1, 8, Metric::Euclidean, KmeansInit::Strided);
    let big = shape(1, 1, 16 + 131072 * 3, 8);
    let idx = init_indices(&c8, &big).unwrap();
    assert_eq!(idx[255], (255u64 * 393216 / 256) as u32);
    let g = PrefillConfig {
        init: KmeansInit::Given,
        ..c
    };
    assert!(init_indices(&g, &sh).is_none());
}

#[test]
fn random_init_is_distinct_in_range_and_deterministic() {
    let sh = shape(2, 3, 16 + 1000, 8);
    let c = cfg(2, 8, Metric::Euclidean, KmeansInit::Random { seed: 5 });
    let a = init_indices(&c, &sh).unwrap();
    assert_eq!(a.len(), 12 * 256);
    assert_eq!(a, init_indices(&c, &sh).unwrap());
    for g in a.chunks(256) {
        let mut s = g.to_vec();
        s.sort_unstable();
        s.dedup();
        assert_eq!(s.len(), 256, "duplicates in a group");
        assert!(s.iter().all(|&j| j < 1000));
    }
    // Groups differ, seeds differ.
    assert_ne!(a[..256], a[256..512]);
    let b = init_indices(
        &PrefillConfig {
            init: KmeansInit::Random { seed: 6 },
            ..c
        },
        &sh,
    )
    .unwrap();
    assert_ne!(a, b);
    // n == K: a permutation of 0..K.
    let sh = shape(1, 1, 16 + 16, 8);
    let c = cfg(1, 4, Metric::Euclidean, KmeansInit::Random { seed: 1 });
    let mut p = init_indices(&c, &sh).unwrap();
    p.sort_unstable();
    assert_eq!(p, (0..16).collect::<Vec<u32>>());
    // Roughly uniform: the mean index of many draws is near n/2.
    let sh = shape(4, 8, 16 + 10000, 8);
    let c = cfg(2, 6, Metric::Euclidean, KmeansInit::Random { seed: 9 });
    let idx = init_indices(&c, &sh).unwrap();
    let mean = idx.iter().map(|&j| j as f64).sum::<f64>() / idx.len() as f64;
    assert!((mean - 5000.0).abs() < 200.0, "mean {mean}");
}

#[test]
fn upstream_codes_from_group_major_u8() {
    let c = cfg(2, 3, Metric::Euclidean, KmeansInit::Strided);
    let sh = shape(2, 3, 16 + 10, 8);
    let (n, cap, groups) = (10, 13, 12);
    let gm: Vec<u8> = (0..groups * cap).map(|i| (i * 7 % 8) as u8).collect();
    let up = upstream_codes(&c, &sh, &gm, cap);
    assert_eq!(up.len(), 2 * n * 3 * 2);
    for gi in 0..groups {
        for j in 0..n {
            assert_eq!(code_of(&c, &sh, &up, gi, j), gm[gi * cap + j] as i64);
        }
    }
}

// ----------------------------------------------------------------------------------
// The reference
// ----------------------------------------------------------------------------------

/// Check that `r` is an exact k-means answer on separated inputs: every centroid in use
/// is the exact mean of its members (integer arithmetic), anchors keep their cluster,
/// inertia is an integer.
fn assert_exact_clusters(c: &PrefillConfig, inp: &PrefillInputs, r: &RefPrefill) {
    let sh = inp.shape;
    let (k, dc, ds, n) = (c.k_centroids(), c.d_c(sh.d), c.d_sub(sh.d), c.n(sh.s));
    for gi in 0..c.groups(&sh) {
        let keys = group_keys(c, inp, gi);
        let phi = r.phi.as_ref().map(|p| p[gi]);
        if let Some(p) = phi {
            let want = keys.iter().map(|x| sq_norm_f32(x)).fold(0f32, f32::max);
            assert_eq!(p, want);
        }
        let mut sums = vec![0i64; k * dc];
        let mut counts = vec![0i64; k];
        for (j, x) in keys.iter().enumerate() {
            let code = code_of(c, &sh, &r.codes, gi, j) as usize;
            counts[code] += 1;
            for (t, &v) in x.iter().enumerate() {
                assert_eq!(v, v.round());
                sums[code * dc + t] += v as i64;
            }
            if let Some(p) = phi {
                let aug = (p - sq_norm_f32(x)).sqrt();
                assert_eq!(aug, aug.round(), "augmented coordinate not an integer");
                sums[code * dc + ds] += aug as i64;
            }
        }
        for kk in 0..k {
            assert!(counts[kk] > 0, "group {gi}: cluster {kk} empty");
            for t in 0..dc {
                let got = r.centroids[(gi * k + kk) * dc + t];
                assert_eq!(
                    got * counts[kk] as f64,
                    sums[kk * dc + t] as f64,
                    "group {gi} centroid {kk} coordinate {t}"
                );
                assert_eq!(got, got.round(), "centroid not an integer");
            }
        }
        // The strided anchor of cluster kk keeps code kk.
        if c.init == KmeansInit::Strided {
            for kk in 0..k {
                let j = kk * n / k;
                assert_eq!(code_of(c, &sh, &r.codes, gi, j), kk as i64);
            }
        }
        assert_eq!(r.inertia[gi], r.inertia[gi].round());
    }
}

#[test]
fn separated_inputs_give_the_exact_centers() {
    for metric in [Metric::Euclidean, Metric::Ip] {
        for m in [1, 2, 4] {
            for bits in [1, 4, 6] {
                let c = PrefillConfig {
                    kmeans_iter: 5,
                    input_dtype: DType::BF16,
                    ..cfg(m, bits, metric, KmeansInit::Strided)
                };
                let sh = shape(2, 2, 16 + 300, 64);
                let inp = PrefillInputs::separated(&c, sh, 11 + m as u64).unwrap();
                assert!(inp
                    .key
                    .iter()
                    .all(|&v| DType::BF16.round(v) == v && v.abs() <= 8.0));
                let r = prefill(&c, &inp).unwrap();
                assert_exact_clusters(&c, &inp, &r);
                assert!(
                    r.iterations.iter().all(|&t| t == 1),
                    "{metric} M={m} bits={bits}: iterations {:?}",
                    r.iterations
                );
                let rep = check_exact(&c, &inp, &r, &r.to_output());
                assert!(rep.passed(), "{metric} M={m} bits={bits}: {rep}");
                assert_eq!(rep.codes_differing, 0);
                // Given centroids near the centers converge to the same answer.
                let g = PrefillConfig {
                    init: KmeansInit::Given,
                    ..c
                };
                let ginp = PrefillInputs::separated(&g, sh, 11 + m as u64).unwrap();
                assert_eq!(ginp.key, inp.key);
                let rg = prefill(&g, &ginp).unwrap();
                assert_eq!(rg.centroids, r.centroids, "{metric} M={m} bits={bits}");
                assert_eq!(rg.codes, r.codes);
            }
        }
    }
}

#[test]
fn separated_at_the_kernel_shapes_and_small_subvectors() {
    // M=8 bits=8 with D=128 (d_s = 16), ip, fp16; n = K + a few (many one-member clusters).
    let c = PrefillConfig {
        input_dtype: DType::F16,
        ..cfg(8, 8, Metric::Ip, KmeansInit::Strided)
    };
    let sh = shape(1, 1, 16 + 256 + 5, 128);
    let inp = PrefillInputs::separated(&c, sh, 3).unwrap();
    let r = prefill(&c, &inp).unwrap();
    assert_exact_clusters(&c, &inp, &r);
    assert!(check_exact(&c, &inp, &r, &r.to_output()).passed());
    // d_s = 2: up to 8 centers (bits 3); bits 4 is refused with a clear message.
    let c = cfg(4, 3, Metric::Euclidean, KmeansInit::Strided);
    let sh = shape(1, 1, 16 + 40, 8);
    let inp = PrefillInputs::separated(&c, sh, 3).unwrap();
    let r = prefill(&c, &inp).unwrap();
    assert_exact_clusters(&c, &inp, &r);
    let e = PrefillInputs::separated(&PrefillConfig { pq_bits: 4, ..c }, sh, 3)
        .unwrap_err()
        .to_string();
    assert!(e.contains("d_s = D/M = 2") && e.contains("K = 16"), "{e}");
}

#[test]
fn n_equal_to_k_puts_every_key_in_its_own_cluster() {
    for metric in [Metric::Euclidean, Metric::Ip] {
        let c = cfg(2, 5, metric, KmeansInit::Strided);
        let sh = shape(1, 2, 16 + 32, 16);
        let inp = PrefillInputs::random(&c, sh, 21).unwrap();
        let r = prefill(&c, &inp).unwrap();
        let dc = c.d_c(16);
        for gi in 0..4 {
            let keys = group_keys(&c, &inp, gi);
            for (j, x) in keys.iter().enumerate() {
                assert_eq!(code_of(&c, &sh, &r.codes, gi, j), j as i64);
                let cen = &r.centroids[(gi * 32 + j) * dc..][..8];
                assert!(cen.iter().zip(x).all(|(&a, &b)| a == b as f64));
            }
            assert_eq!(r.iterations[gi], 1);
            if metric == Metric::Euclidean {
                assert_eq!(r.inertia[gi], 0.0);
            } else {
                assert!(r.inertia[gi] < 1e-20, "{}", r.inertia[gi]);
            }
        }
        let rep = check(&c, &inp, &r, &r.to_output());
        assert!(rep.passed(), "{rep}");
    }
}

#[test]
fn an_empty_cluster_keeps_its_given_centroid() {
    for metric in [Metric::Euclidean, Metric::Ip] {
        let c = cfg(2, 3, metric, KmeansInit::Given);
        let sh = shape(1, 1, 16 + 200, 16);
        let mut inp = PrefillInputs::random(&c, sh, 4).unwrap();
        let dc = c.d_c(16);
        let far: Vec<f32> = (0..dc).map(|t| 1000.0 + t as f32).collect();
        inp.centroids.as_mut().unwrap()[3 * dc..4 * dc].copy_from_slice(&far);
        let r = prefill(&c, &inp).unwrap();
        let kept: Vec<f32> = r.centroids[3 * dc..4 * dc]
            .iter()
            .map(|&v| v as f32)
            .collect();
        assert_eq!(kept, far);
        assert!(r.codes.iter().step_by(2).all(|&code| code != 3));
        let rep = check(&c, &inp, &r, &r.to_output());
        assert!(rep.passed(), "{rep}");
    }
}

/// An independent, plainly written Lloyd's algorithm with the spec's rule, on one group.
fn naive_kmeans(
    keys: &[Vec<f32>],
    init: Vec<Vec<f64>>,
    phi: Option<f32>,
    iters: usize,
) -> (Vec<Vec<f64>>, Vec<usize>, u32) {
    let pts: Vec<Vec<f64>> = keys
        .iter()
        .map(|x| {
            let mut v: Vec<f64> = x.iter().map(|&a| a as f64).collect();
            if let Some(p) = phi {
                let norm: f64 = v.iter().map(|a| a * a).sum();
                v.push((p as f64 - norm).max(0.0).sqrt());
            }
            v
        })
        .collect();
    let assign = |cents: &Vec<Vec<f64>>| -> Vec<usize> {
        pts.iter()
            .map(|x| {
                let mut best = (0, f64::INFINITY);
                for (k, c) in cents.iter().enumerate() {
                    let d: f64 = x.iter().zip(c).map(|(a, b)| (a - b) * (a - b)).sum();
                    if d < best.1 {
                        best = (k, d);
                    }
                }
                best.0
            })
            .collect()
    };
    let mut cents = init;
    let mut prev: Option<Vec<usize>> = None;
    let mut updates = 0;
    for _ in 0..iters {
        let a = assign(&cents);
        if prev.as_ref() == Some(&a) {
            return (cents, a, updates);
        }
        for (k, c) in cents.iter_mut().enumerate() {
            let members: Vec<&Vec<f64>> = pts
                .iter()
                .zip(&a)
                .filter(|(_, &l)| l == k)
                .map(|(p, _)| p)
                .collect();
            if !members.is_empty() {
                for (t, v) in c.iter_mut().enumerate() {
                    *v = members.iter().map(|p| p[t]).sum::<f64>() / members.len() as f64;
                }
            }
        }
        updates += 1;
        prev = Some(a);
    }
    let a = assign(&cents);
    (cents, a, updates)
}

#[test]
fn reference_matches_a_naive_kmeans() {
    for (metric, init, iters) in [
        (Metric::Euclidean, KmeansInit::Strided, 10),
        (Metric::Ip, KmeansInit::Strided, 3),
        (Metric::Euclidean, KmeansInit::Random { seed: 3 }, 50),
        (Metric::Ip, KmeansInit::Given, 6),
    ] {
        let c = PrefillConfig {
            kmeans_iter: iters,
            ..cfg(2, 3, metric, init)
        };
        let sh = shape(1, 2, 16 + 150, 8);
        let inp = PrefillInputs::random(&c, sh, 77).unwrap();
        let r = prefill(&c, &inp).unwrap();
        let (k, dc) = (8, c.d_c(8));
        let idx = init_indices(&c, &sh);
        for gi in 0..4 {
            let keys = group_keys(&c, &inp, gi);
            let phi = r.phi.as_ref().map(|p| p[gi]);
            let start: Vec<Vec<f64>> = match &idx {
                Some(idx) => idx[gi * k..(gi + 1) * k]
                    .iter()
                    .map(|&j| {
                        let mut v: Vec<f64> = keys[j as usize].iter().map(|&a| a as f64).collect();
                        if let Some(p) = phi {
                            let norm: f64 = v.iter().map(|a| a * a).sum();
                            v.push((p as f64 - norm).max(0.0).sqrt());
                        }
                        v
                    })
                    .collect(),
                None => inp.centroids.as_ref().unwrap()[gi * k * dc..(gi + 1) * k * dc]
                    .chunks(dc)
                    .map(|c| c.iter().map(|&v| v as f64).collect())
                    .collect(),
            };
            let (cents, codes, updates) = naive_kmeans(&keys, start, phi, iters);
            assert_eq!(r.iterations[gi], updates, "{metric} {init} group {gi}");
            for (j, &code) in codes.iter().enumerate() {
                assert_eq!(code_of(&c, &sh, &r.codes, gi, j), code as i64);
            }
            for (kk, cen) in cents.iter().enumerate() {
                for (t, &v) in cen.iter().enumerate() {
                    let got = r.centroids[(gi * k + kk) * dc + t];
                    assert!((got - v).abs() <= 1e-12 * (1.0 + v.abs()), "{got} vs {v}");
                }
            }
            let inertia: f64 = keys
                .iter()
                .map(|x| {
                    let xf: Vec<f32> = x.clone();
                    let cf: Vec<f32> = r.centroids[gi * k * dc..(gi + 1) * k * dc]
                        .iter()
                        .map(|&v| v as f32)
                        .collect();
                    quantize_subvector(&xf, &cf, dc, phi).1
                })
                .sum();
            assert!(
                (inertia - r.inertia[gi]).abs() <= 1e-5 * r.inertia[gi],
                "{inertia} vs {}",
                r.inertia[gi]
            );
        }
        // Stopping early happens on these inputs with enough iterations.
        if iters == 50 {
            assert!(r.iterations.iter().all(|&t| t < 50), "{:?}", r.iterations);
        }
    }
}

#[test]
fn random_inputs_every_dtype() {
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        for metric in [Metric::Euclidean, Metric::Ip] {
            let c = PrefillConfig {
                input_dtype: dtype,
                ..cfg(4, 6, metric, KmeansInit::Strided)
            };
            let sh = shape(2, 2, 16 + 700, 64);
            let inp = PrefillInputs::random(&c, sh, 8).unwrap();
            assert!(inp.key.iter().all(|&v| dtype.round(v) == v));
            assert!(inp.key.iter().filter(|&&v| v == 0.0).count() < inp.key.len() / 50);
            let r = prefill(&c, &inp).unwrap();
            assert_eq!(r, prefill(&c, &inp).unwrap(), "not deterministic");
            assert!(r.iterations.iter().all(|&t| (1..=10).contains(&t)));
            let out = r.to_output();
            let rep = check(&c, &inp, &r, &out);
            assert!(rep.passed(), "{dtype} {metric}: {rep}");
            assert!(rep.to_string().starts_with("PASSED"), "{rep}");
            assert!(rep.worst_inertia.unwrap().rel.abs() < 1e-9, "{rep}");
            if metric == Metric::Ip {
                assert_eq!(rep.worst_phi_rel, Some(0.0));
            }
        }
    }
}

// ----------------------------------------------------------------------------------
// The checker against planted errors
// ----------------------------------------------------------------------------------

fn random_case(metric: Metric) -> (PrefillConfig, PrefillInputs, RefPrefill, PrefillOutput) {
    let c = cfg(2, 4, metric, KmeansInit::Strided);
    let sh = shape(2, 2, 16 + 500, 32);
    let inp = PrefillInputs::random(&c, sh, 13).unwrap();
    let r = prefill(&c, &inp).unwrap();
    let out = r.to_output();
    (c, inp, r, out)
}

fn only(rep: &tritonrt::pq::prefill::PrefillCheckReport, kind: Kind) {
    assert!(!rep.passed());
    assert!(rep.count(kind) >= 1, "expected {kind:?}: {rep}");
    assert!(rep.to_string().starts_with("FAILED"), "{rep}");
    assert!(rep.to_string().contains(kind.name()), "{rep}");
}

#[test]
fn checker_fails_a_worse_code() {
    for metric in [Metric::Euclidean, Metric::Ip] {
        let (c, inp, r, mut out) = random_case(metric);
        let sh = inp.shape;
        // Key 7 of group 3: move it to its farthest centroid.
        let (gi, j) = (3, 7);
        let dc = c.d_c(32);
        let x = &group_keys(&c, &inp, gi)[j];
        let cents = &out.centroids[gi * 16 * dc..(gi + 1) * 16 * dc];
        let phi = out.phi.as_ref().map(|p| p[gi]);
        let worst = (0..16)
            .max_by(|&a, &b| {
                let da =
                    tritonrt::pq::reference::subvector_distance(x, &cents[a * dc..][..dc], phi);
                let db =
                    tritonrt::pq::reference::subvector_distance(x, &cents[b * dc..][..dc], phi);
                da.total_cmp(&db)
            })
            .unwrap();
        let (b, g, m) = c.group_coords(&sh, gi);
        out.codes[c.code_index(&sh, b, j, g, m)] = worst as i64;
        let rep = check(&c, &inp, &r, &out);
        only(&rep, Kind::Argmin);
        assert_eq!(rep.total_violations(), 1, "{rep}");
        assert_eq!(rep.listed[0].key, Some(7));
        assert_eq!(rep.listed[0].group.unwrap().0, 3);
        assert_eq!(rep.codes_differing, 1);
    }
}

#[test]
fn checker_fails_a_moved_centroid() {
    let (c, inp, r, mut out) = random_case(Metric::Euclidean);
    let dc = c.d_c(32);
    // The most populated centroid of group 1, moved by 0.5 per coordinate.
    let gi = 1;
    let sh = inp.shape;
    let mut counts = [0usize; 16];
    for j in 0..c.n(sh.s) {
        counts[code_of(&c, &sh, &out.codes, gi, j) as usize] += 1;
    }
    let kk = (0..16).max_by_key(|&k| counts[k]).unwrap();
    for v in &mut out.centroids[(gi * 16 + kk) * dc..][..dc] {
        *v += 0.5;
    }
    let rep = check(&c, &inp, &r, &out);
    only(&rep, Kind::Inertia);
    let w = rep.worst_inertia.unwrap();
    assert_eq!(w.group, gi);
    assert!(w.rel > 1e-3, "{rep}");
    // With every code wrong too, the report still shows an inertia violation.
    let mut worse = out.clone();
    worse.codes.fill(0);
    let rep = check(&c, &inp, &r, &worse);
    assert!(rep.count(Kind::Argmin) > 100, "{rep}");
    let shown = rep.to_string();
    assert!(
        shown.contains("\n  group 1 (b=0 g=0 m=1): inertia: "),
        "{shown}"
    );
    assert!(
        shown.contains("key 1: argmin: code 0 at squared distance"),
        "{shown}"
    );
    assert_eq!(shown.lines().count(), 1 + 5 + 1, "{shown}");
    // A tiny move (far below 0.1% of the inertia) passes.
    let (_, _, _, mut out) = random_case(Metric::Euclidean);
    out.centroids[(gi * 16 + kk) * dc] += 1e-4;
    assert!(check(&c, &inp, &r, &out).passed());
}

#[test]
fn checker_fails_a_wrong_phi_a_bad_code_and_bad_lengths() {
    let (c, inp, r, out) = random_case(Metric::Ip);
    // phi 1% too large.
    let mut bad = out.clone();
    bad.phi.as_mut().unwrap()[2] *= 1.01;
    let rep = check(&c, &inp, &r, &bad);
    only(&rep, Kind::Phi);
    assert_eq!(rep.count(Kind::Phi), 1);
    // A last-bit difference in phi is accepted.
    let mut ok = out.clone();
    let p = &mut ok.phi.as_mut().unwrap()[2];
    *p = f32::from_bits(p.to_bits() + 1);
    let rep = check(&c, &inp, &r, &ok);
    assert!(rep.passed(), "{rep}");
    // Missing phi.
    let mut bad = out.clone();
    bad.phi = None;
    only(&check(&c, &inp, &r, &bad), Kind::Shape);
    // A code >= K.
    let mut bad = out.clone();
    bad.codes[5] = 16;
    let rep = check(&c, &inp, &r, &bad);
    only(&rep, Kind::CodeRange);
    assert_eq!(rep.total_violations(), 1, "{rep}");
    bad.codes[5] = -1;
    only(&check(&c, &inp, &r, &bad), Kind::CodeRange);
    // Lengths.
    let mut bad = out.clone();
    bad.codes.pop();
    only(&check(&c, &inp, &r, &bad), Kind::Shape);
    let mut bad = out.clone();
    bad.n -= 1;
    only(&check(&c, &inp, &r, &bad), Kind::Shape);
    let mut bad = out.clone();
    bad.centroids.push(0.0);
    only(&check(&c, &inp, &r, &bad), Kind::Shape);
    let mut bad = out.clone();
    bad.iterations.pop();
    only(&check(&c, &inp, &r, &bad), Kind::Shape);
    // Iteration counts out of range.
    let mut bad = out.clone();
    bad.iterations[0] = 0;
    bad.iterations[1] = 11;
    let rep = check(&c, &inp, &r, &bad);
    only(&rep, Kind::Iterations);
    assert_eq!(rep.count(Kind::Iterations), 2);
    // A NaN centroid.
    let mut bad = out.clone();
    bad.centroids[40] = f32::NAN;
    only(&check(&c, &inp, &r, &bad), Kind::Nonfinite);
    // A reference of other inputs.
    let other = PrefillInputs::random(&c, shape(2, 2, 16 + 400, 32), 13).unwrap();
    only(&check(&c, &other, &r, &out), Kind::Inputs);
}

#[test]
fn exact_mode_catches_last_bit_differences() {
    let c = cfg(2, 4, Metric::Ip, KmeansInit::Strided);
    let sh = shape(1, 2, 16 + 200, 32);
    let inp = PrefillInputs::separated(&c, sh, 2).unwrap();
    let r = prefill(&c, &inp).unwrap();
    let out = r.to_output();
    assert!(check_exact(&c, &inp, &r, &out).passed());
    // One centroid value one ulp off: fine by the spec rule, not exact.
    let mut bad = out.clone();
    let v = &mut bad.centroids[3 * c.d_c(32) + 1];
    *v = f32::from_bits(v.to_bits() + 1);
    assert!(check(&c, &inp, &r, &bad).passed());
    let rep = check_exact(&c, &inp, &r, &bad);
    only(&rep, Kind::ExactCentroids);
    assert_eq!(rep.total_violations(), 1, "{rep}");
    // Another iteration count is fine by the spec rule, not exact.
    let mut bad = out.clone();
    bad.iterations[1] = 2;
    assert!(check(&c, &inp, &r, &bad).passed());
    only(&check_exact(&c, &inp, &r, &bad), Kind::Iterations);
    // Swapping two clusters' labels and centroids is a valid k-means answer for the spec
    // rule, but not the reference's.
    let mut sw = out.clone();
    let dc = c.d_c(32);
    for gi in 0..c.groups(&sh) {
        let blk = &mut sw.centroids[gi * 16 * dc..(gi + 1) * 16 * dc];
        let (a, b) = blk.split_at_mut(dc);
        a.swap_with_slice(&mut b[..dc]);
    }
    for code in &mut sw.codes {
        *code = match *code {
            0 => 1,
            1 => 0,
            x => x,
        };
    }
    assert!(check(&c, &inp, &r, &sw).passed());
    let rep = check_exact(&c, &inp, &r, &sw);
    only(&rep, Kind::ExactCodes);
    assert!(rep.count(Kind::ExactCentroids) > 0);
    let shown = rep.to_string();
    assert!(shown.lines().count() <= 7, "{shown}");
}
