//! Seeded generators of [`PqInputs`] (feature `cli`: they use `rand`): the spec's
//! workload inputs and well-separated small-integer inputs. See [`super::workload`].

use rand::rngs::SmallRng;
use rand::{Rng, RngCore, SeedableRng};
use rand_distr::StandardNormal;

use super::config::{DType, Metric, PqConfig, Shape};
use super::workload::{KeyFill, PqInputs, FULL_KEY_FILL_LIMIT, KEY_MARGIN};
use super::{par_chunks_mut, par_items};
use crate::error::{Error, Result};

/// Values per independently seeded chunk of a generated tensor (not keys).
const GEN_CHUNK: usize = 1 << 16;

/// Key rows per parallel work item when generating keys.
const KEY_ROWS_PER_ITEM: usize = 1 << 10;

impl KeyFill {
    /// The first key position to fill for this policy (0: all rows).
    fn first_position(self, cfg: &PqConfig, shape: &Shape, n_cached: usize) -> usize {
        let all = match self {
            KeyFill::All => true,
            KeyFill::Needed => false,
            KeyFill::Auto => shape.b * shape.h_kv * shape.s * shape.d <= FULL_KEY_FILL_LIMIT,
        };
        if all {
            0
        } else {
            (cfg.init_offset + n_cached)
                .saturating_sub(KEY_MARGIN)
                .min(shape.s)
        }
    }
}

/// SplitMix64 finalizer: turns (seed, stream, chunk) into well-mixed RNG seeds.
fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// An RNG for one chunk of one tensor stream.
fn chunk_rng(seed: u64, stream: u64, chunk: u64) -> SmallRng {
    SmallRng::seed_from_u64(mix64(mix64(seed ^ mix64(stream)) ^ chunk))
}

/// Fill `out` with standard-normal values rounded to `dtype`, in parallel chunks.
fn fill_normal(out: &mut [f32], seed: u64, stream: u64, dtype: DType) {
    par_chunks_mut(out, GEN_CHUNK, |i, c| {
        let mut rng = chunk_rng(seed, stream, i as u64);
        for x in c.iter_mut() {
            *x = dtype.round(rng.sample::<f32, _>(StandardNormal));
        }
    });
}

/// Fill `out` with uniform codes in `0..2^bits`, in parallel chunks.
fn fill_codes(out: &mut [i64], seed: u64, stream: u64, bits: u32) {
    par_chunks_mut(out, GEN_CHUNK, |i, c| {
        let mut rng = chunk_rng(seed, stream, i as u64);
        for x in c.iter_mut() {
            *x = (rng.next_u32() >> (32 - bits)) as i64;
        }
    });
}

impl PqInputs {
    /// Seeded inputs as in the spec's workloads: standard-normal `query`, `key` and
    /// `centroids` (all `d_c` coordinates), uniform codes in `0..K` for `n_cached` keys.
    /// `query`/`key` are rounded to `cfg.input_dtype`.
    ///
    /// Metric ip: `phi[b, g, m] = max_c ||centroids[b, g, m, c, 0..d_s]||^2`. With
    /// standard-normal keys and centroids this sits well above a typical key's
    /// `||x_m||^2` (about `d_s`), so the augmentation's square-root argument is mostly
    /// positive, as it is for real ip-to-l2 constants (max key norm over the data).
    ///
    /// Keys are filled by [`KeyFill::Auto`] (all of them up to [`FULL_KEY_FILL_LIMIT`]
    /// values, else only those the step reads; see the module docs).
    ///
    /// Deterministic in `(seed, cfg, shape, n_cached)`; parallel over all cores.
    /// Errors: an invalid config or `n_cached > max(0, S - init_offset)`.
    pub fn random(cfg: &PqConfig, shape: Shape, n_cached: usize, seed: u64) -> Result<Self> {
        Self::random_with(cfg, shape, n_cached, seed, KeyFill::Auto)
    }

    /// [`PqInputs::random`] with an explicit key-fill policy. Rows that are filled hold
    /// the same values under every policy.
    pub fn random_with(
        cfg: &PqConfig,
        shape: Shape,
        n_cached: usize,
        seed: u64,
        fill: KeyFill,
    ) -> Result<Self> {
        cfg.validate(&shape)?;
        let (mm, k, ds, dc) = (
            cfg.pq_group_factor,
            cfg.k_centroids(),
            cfg.d_sub(shape.d),
            cfg.d_c(shape.d),
        );
        let mut query = vec![0f32; shape.b * shape.h * shape.d];
        fill_normal(&mut query, seed, 1, cfg.input_dtype);
        // Zeroed allocation: rows that are never written are never backed by memory.
        let mut key = vec![0f32; shape.b * shape.h_kv * shape.s * shape.d];
        let first = fill.first_position(cfg, &shape, n_cached);
        let (s, d, dtype) = (shape.s, shape.d, cfg.input_dtype);
        par_chunks_mut(&mut key, KEY_ROWS_PER_ITEM * d, |item, rows| {
            for (t, row) in rows.chunks_mut(d).enumerate() {
                let r = item * KEY_ROWS_PER_ITEM + t;
                if r % s >= first {
                    let mut rng = chunk_rng(seed, 2, r as u64);
                    for x in row.iter_mut() {
                        *x = dtype.round(rng.sample::<f32, _>(StandardNormal));
                    }
                }
            }
        });
        let mut centroids = vec![0f32; shape.b * shape.h_kv * mm * k * dc];
        fill_normal(&mut centroids, seed, 3, DType::F32);
        let mut codes = vec![0i64; shape.b * n_cached * shape.h_kv * mm];
        fill_codes(&mut codes, seed, 4, cfg.pq_bits);
        let phi = (cfg.metric == Metric::Ip).then(|| {
            centroids
                .chunks(k * dc)
                .map(|blk| {
                    blk.chunks(dc)
                        .map(|c| c[..ds].iter().map(|v| v * v).sum::<f32>())
                        .fold(0f32, f32::max)
                })
                .collect::<Vec<f32>>()
        });
        let inputs = PqInputs {
            shape,
            query,
            key,
            centroids,
            codes,
            n_cached,
            phi,
        };
        inputs.validate(cfg)?;
        Ok(inputs)
    }

    /// Seeded inputs with small-integer values whose heavy set is unambiguous, for exact
    /// comparisons between implementations (spec: "on inputs whose scores are well
    /// separated the heavy set must match the reference exactly").
    ///
    /// Construction, per `(b, g)` and subvector `m` (`d_s` coordinates, `K >= 2`):
    /// - centroid `c`: coordinate 0 is `c`, the others random in `{-1, 0, 1}`; metric ip
    ///   adds `sqrt(phi - ||centroid_c||^2)` as its last coordinate, with
    ///   `phi = max_c ||centroid_c||^2` (an integer).
    /// - query subvectors: coordinate 0 is `2 d_s - 1`, the others random in
    ///   `{-1, 0, 1}`, so `lut[c] = <q_m, centroid_c>` strictly increases with `c` (by at
    ///   least 1) for every head.
    /// - on the long path with more candidates than `k` (`w0 > k`), `k` random candidates
    ///   get all their codes in the upper half `K/2..K`, every other candidate only
    ///   lower-half codes; so every chosen score exceeds every unchosen one by at least
    ///   `M`, for every head of the group. Keys outside the candidates get uniform codes.
    /// - new keys (positions `init_offset + n_cached .. S`) equal a centroid of a code
    ///   picked by the same rule, so their quantization is unambiguous (distance ~0 vs
    ///   >= 1) under both metrics; keys that are never read are random in `{-2..=2}`.
    ///
    /// Scores are integers below 2^24, exact in fp32 whatever the summation order; query
    /// and keys are exact in bf16 (integers up to 256) for `d_s <= 128` and `K <= 256`.
    /// Keys the step does not read follow [`KeyFill::Auto`] (0.0 beyond the limit).
    /// Errors: as [`PqInputs::random`].
    pub fn small_integer(cfg: &PqConfig, shape: Shape, n_cached: usize, seed: u64) -> Result<Self> {
        cfg.validate(&shape)?;
        let Shape {
            b: bb,
            h: hh,
            h_kv: hkv,
            s,
            d,
        } = shape;
        let (mm, k, ds, dc) = (
            cfg.pq_group_factor,
            cfg.k_centroids(),
            cfg.d_sub(d),
            cfg.d_c(d),
        );
        let n = cfg.n_quantized(s);
        if n_cached > n {
            return Err(Error::PqTensor {
                file: None,
                tensor: "pq_codebook".into(),
                expected: format!("at most S - init_offset = {n} cached keys"),
                got: format!("N_cached = {n_cached}"),
            });
        }
        let half = k / 2;
        let first = KeyFill::Auto.first_position(cfg, &shape, n_cached);
        let long = !cfg.is_short(s);
        let w0 = if long { cfg.window_start(s).min(n) } else { 0 };
        let kk = if long { cfg.heavy_k(s) } else { 0 };
        let separate = long && w0 > kk;

        // Centroids and phi.
        let mut centroids = vec![0f32; bb * hkv * mm * k * dc];
        let mut phi = vec![0f32; bb * hkv * mm];
        for (blk_i, blk) in centroids.chunks_mut(k * dc).enumerate() {
            let mut rng = chunk_rng(seed, 11, blk_i as u64);
            let mut max_norm = 0i64;
            for (c, cen) in blk.chunks_mut(dc).enumerate() {
                cen[0] = c as f32;
                for v in cen[1..ds].iter_mut() {
                    *v = rng.random_range(-1i32..=1) as f32;
                }
                let norm: i64 = cen[..ds].iter().map(|&v| (v * v) as i64).sum();
                max_norm = max_norm.max(norm);
            }
            if cfg.metric == Metric::Ip {
                for cen in blk.chunks_mut(dc) {
                    let norm: i64 = cen[..ds].iter().map(|&v| (v * v) as i64).sum();
                    cen[ds] = ((max_norm - norm) as f64).sqrt() as f32;
                }
            }
            phi[blk_i] = max_norm as f32;
        }

        // Query: coordinate 0 of each subvector dominates.
        let q0 = (2 * ds - 1) as f32;
        let mut query = vec![0f32; bb * hh * d];
        for (row_i, row) in query.chunks_mut(d).enumerate() {
            let mut rng = chunk_rng(seed, 12, row_i as u64);
            for sub in row.chunks_mut(ds) {
                sub[0] = q0;
                for v in sub[1..].iter_mut() {
                    *v = rng.random_range(-1i32..=1) as f32;
                }
            }
        }

        // Per (b, g): planted heavy set, cached codes [n_cached, M], and the key slab.
        let mut key = vec![0f32; bb * hkv * s * d];
        let mut slab_codes: Vec<Vec<i64>> = vec![Vec::new(); bb * hkv];
        {
            let items: Vec<(usize, &mut [f32], &mut Vec<i64>)> = key
                .chunks_mut(s * d)
                .zip(slab_codes.iter_mut())
                .enumerate()
                .map(|(i, (k, c))| (i, k, c))
                .collect();
            let cents = &centroids;
            par_items(items, |(bg, slab, codes_out)| {
                let mut rng = chunk_rng(seed, 13, bg as u64);
                let mut chosen = vec![false; w0];
                if separate {
                    for j in rand::seq::index::sample(&mut rng, w0, kk) {
                        chosen[j] = true;
                    }
                }
                let pick = |rng: &mut SmallRng, j: usize| -> usize {
                    if separate && j < w0 {
                        if chosen[j] {
                            rng.random_range(half..k)
                        } else {
                            rng.random_range(0..half)
                        }
                    } else {
                        rng.random_range(0..k)
                    }
                };
                codes_out.reserve(n_cached * mm);
                for j in 0..n_cached {
                    for _ in 0..mm {
                        codes_out.push(pick(&mut rng, j) as i64);
                    }
                }
                for p in 0..s {
                    let row = &mut slab[p * d..(p + 1) * d];
                    let is_new = p >= cfg.init_offset && p - cfg.init_offset >= n_cached;
                    if long && is_new {
                        let j = p - cfg.init_offset;
                        for (m, sub) in row.chunks_mut(ds).enumerate() {
                            let c = pick(&mut rng, j);
                            let off = ((bg * mm + m) * k + c) * dc;
                            sub.copy_from_slice(&cents[off..off + ds]);
                        }
                    } else if p >= first {
                        for v in row.iter_mut() {
                            *v = rng.random_range(-2i32..=2) as f32;
                        }
                    }
                }
            });
        }
        let mut codes = vec![0i64; bb * n_cached * hkv * mm];
        for b in 0..bb {
            for g in 0..hkv {
                let src = &slab_codes[b * hkv + g];
                for j in 0..n_cached {
                    let dst = ((b * n_cached + j) * hkv + g) * mm;
                    codes[dst..dst + mm].copy_from_slice(&src[j * mm..(j + 1) * mm]);
                }
            }
        }
        let inputs = PqInputs {
            shape,
            query,
            key,
            centroids,
            codes,
            n_cached,
            phi: (cfg.metric == Metric::Ip).then_some(phi),
        };
        inputs.validate(cfg)?;
        Ok(inputs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_is_deterministic_and_thread_independent() {
        let cfg = PqConfig {
            metric: Metric::Ip,
            ..PqConfig::reference_workload()
        };
        let shape = Shape {
            b: 2,
            h: 4,
            h_kv: 2,
            s: 700,
            d: 16,
        };
        let a = PqInputs::random(&cfg, shape, 500, 7).unwrap();
        let b = PqInputs::random(&cfg, shape, 500, 7).unwrap();
        assert_eq!(a, b);
        let c = PqInputs::random(&cfg, shape, 500, 8).unwrap();
        assert_ne!(a.key, c.key);
        // Roughly standard normal.
        let mean = a.key.iter().map(|&x| x as f64).sum::<f64>() / a.key.len() as f64;
        let var = a
            .key
            .iter()
            .map(|&x| (x as f64 - mean).powi(2))
            .sum::<f64>()
            / a.key.len() as f64;
        assert!(
            mean.abs() < 0.05 && (var - 1.0).abs() < 0.05,
            "{mean} {var}"
        );
        assert!(a.codes.iter().all(|&c| (0..64).contains(&c)));
        assert!(a.codes.contains(&63) && a.codes.contains(&0));
        assert_eq!(a.phi.as_ref().unwrap().len(), 2 * 2 * 2);
    }

    #[test]
    fn key_fill_policies_agree_on_the_rows_they_fill() {
        let cfg = PqConfig::reference_workload();
        let shape = Shape {
            b: 2,
            h: 2,
            h_kv: 2,
            s: 1000,
            d: 8,
        };
        let all = PqInputs::random_with(&cfg, shape, 700, 3, KeyFill::All).unwrap();
        let some = PqInputs::random_with(&cfg, shape, 700, 3, KeyFill::Needed).unwrap();
        let first = 128 + 700 - KEY_MARGIN;
        for bg in 0..4 {
            for p in 0..1000 {
                let row = (bg * 1000 + p) * 8;
                let (a, b) = (&all.key[row..row + 8], &some.key[row..row + 8]);
                assert!(a.iter().all(|&x| x != 0.0), "row {p} of All is not filled");
                if p >= first {
                    assert_eq!(a, b, "row {p}");
                } else {
                    assert!(b.iter().all(|&x| x == 0.0), "row {p} of Needed is filled");
                }
            }
        }
        assert_eq!(all.codes, some.codes);
        assert_eq!(all.query, some.query);
    }

    #[test]
    fn bf16_inputs_are_rounded() {
        let cfg = PqConfig {
            input_dtype: DType::BF16,
            ..PqConfig::reference_workload()
        };
        let shape = Shape {
            b: 1,
            h: 2,
            h_kv: 2,
            s: 400,
            d: 8,
        };
        let a = PqInputs::random(&cfg, shape, 10, 1).unwrap();
        assert!(a.key.iter().all(|&x| DType::BF16.round(x) == x));
        assert!(a.query.iter().all(|&x| DType::BF16.round(x) == x));
        assert!(a.key.iter().any(|&x| x != 0.0));
    }
}
