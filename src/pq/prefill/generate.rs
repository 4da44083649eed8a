//! Seeded generators of [`PrefillInputs`] (feature `cli`: they use `rand`): standard
//! normal keys, and well-separated small-integer clusters whose k-means answer is exact.

use std::collections::HashSet;

use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_distr::StandardNormal;

use super::super::{par_chunks_mut, par_items};
use super::{mix64, KmeansInit, PrefillConfig, PrefillInputs, PrefillShape};
use crate::error::{Error, Result};
use crate::pq::config::Metric;

/// Key rows per independently seeded chunk.
const ROWS_PER_CHUNK: usize = 1 << 10;

/// Values per independently seeded chunk of the given centroids.
const VALUES_PER_CHUNK: usize = 1 << 16;

/// The center coordinates' magnitude of [`PrefillInputs::separated`].
const SEPARATED_SCALE: i32 = 8;

/// An RNG for one chunk of one tensor stream, from (seed, stream, chunk).
fn chunk_rng(seed: u64, stream: u64, chunk: u64) -> SmallRng {
    SmallRng::seed_from_u64(mix64(
        mix64(seed ^ mix64(stream.wrapping_add(0x5851_F42D_4C95_7F2D))) ^ chunk,
    ))
}

impl PrefillInputs {
    /// Seeded inputs: standard-normal keys rounded to `cfg.input_dtype` (every position,
    /// `init_offset` ones included) and, for [`KmeansInit::Given`], standard-normal fp32
    /// starting centroids in all `d_c` coordinates (so some clusters may stay empty).
    ///
    /// Deterministic in `(seed, cfg, shape)`, whatever the thread count.
    /// Errors: an invalid config ([`PrefillConfig::validate`]).
    pub fn random(cfg: &PrefillConfig, shape: PrefillShape, seed: u64) -> Result<Self> {
        cfg.validate(&shape)?;
        let mut key = vec![0f32; shape.key_len()];
        let (d, dtype) = (shape.d, cfg.input_dtype);
        par_chunks_mut(&mut key, ROWS_PER_CHUNK * d, |c, rows| {
            let mut rng = chunk_rng(seed, 1, c as u64);
            for x in rows.iter_mut() {
                *x = dtype.round(rng.sample::<f32, _>(StandardNormal));
            }
        });
        let centroids = (cfg.init == KmeansInit::Given).then(|| {
            let mut c = vec![0f32; cfg.centroids_len(&shape)];
            par_chunks_mut(&mut c, VALUES_PER_CHUNK, |i, out| {
                let mut rng = chunk_rng(seed, 2, i as u64);
                for x in out.iter_mut() {
                    *x = rng.sample::<f32, _>(StandardNormal);
                }
            });
            c
        });
        Ok(PrefillInputs {
            shape,
            key,
            centroids,
        })
    }

    /// Seeded well-separated small-integer clusters, for which the spec's rule (c)
    /// demands exact equality of codes and centroids.
    ///
    /// Per group, with `V = 8` (the center scale), the `d_s` coordinates are split
    /// into `p` center coordinates and `q` noise coordinates (`q = 3` when `d_s` leaves
    /// room for `K` centers in the rest, else 0):
    /// - `K` distinct centers `V * c_k`, each `c_k` with entries in `{-1, 0, 1}` on the
    ///   center coordinates and exactly `w` or `w - 1` nonzeros (0 on the noise
    ///   coordinates), so two centers are at least `V` apart;
    /// - key `j = floor(k * n / K)` belongs to cluster `k` (so the strided init picks one
    ///   key of each cluster), every other key to a random cluster;
    /// - a key is its center plus noise on the noise coordinates with squared norm
    ///   exactly 2: in a cluster of two or more members the noise comes in pairs `+e, -e`
    ///   and (odd sizes) one triple `s(e_a - e_b), s(e_b - e_c), s(e_c - e_a)`, so the
    ///   members sum to exactly `count * center`; a one-member cluster's center includes
    ///   its noise `(1, 1, 0)`.
    ///
    /// Why k-means is exact here: a key is within squared distance 8 of any member of its
    /// cluster and at least `(V - sqrt 8)^2 > 26` from any member of another, so the
    /// first assignment (from the strided keys, or from given centroids within 0.5 of
    /// the centers) finds the clusters, the update yields the centers exactly (integer
    /// sums below 2^24, exact division), and the next assignment is unchanged: one
    /// update, then a stop. Under ip every key of a cluster has the same squared norm
    /// (`V^2 * weight + 2`), so `phi = V^2 * w_max + 2` and the augmented coordinate is 0
    /// or `V`, exact too. Every value is an integer with `|v| <= 8`, exact in bf16 and
    /// fp16, and all sums stay exact in fp32 while `n * 8 < 2^24`.
    ///
    /// [`KmeansInit::Given`]: the starting centroids are the centers (with their
    /// augmented coordinate under ip) plus 0.5 on coordinate 0. [`KmeansInit::Random`]
    /// may draw two keys of one cluster: its answer is not guaranteed exact. Positions
    /// before `init_offset` hold random integers in `-2..=2`.
    ///
    /// Errors: an invalid config; `d_s` too small to hold `K` separated centers
    /// ([`Error::Invalid`], naming `d_s`, `K` and the most centers possible).
    pub fn separated(cfg: &PrefillConfig, shape: PrefillShape, seed: u64) -> Result<Self> {
        cfg.validate(&shape)?;
        let (ds, dc, k, n) = (
            cfg.d_sub(shape.d),
            cfg.d_c(shape.d),
            cfg.k_centroids(),
            cfg.n(shape.s),
        );
        let layout = CenterLayout::choose(ds, k).ok_or_else(|| {
            Error::invalid(
                "separated prefill inputs",
                format!(
                    "subvector dim d_s = D/M = {} leaves room for at most {} separated \
                     centers, fewer than K = {k}; use a larger D/M or fewer bits",
                    ds,
                    CenterLayout::max_centers(ds)
                ),
            )
        })?;
        let groups = cfg.groups(&shape);
        let mut plans: Vec<Option<GroupPlan>> = (0..groups).map(|_| None).collect();
        {
            let items: Vec<(usize, &mut Option<GroupPlan>)> =
                plans.iter_mut().enumerate().collect();
            par_items(items, |(gi, slot)| {
                let mut rng = chunk_rng(seed, 3, gi as u64);
                *slot = Some(GroupPlan::new(&layout, k, n, &mut rng));
            });
        }
        let plans: Vec<GroupPlan> = plans.into_iter().flatten().collect();

        let (s, d, mm, off) = (shape.s, shape.d, cfg.pq_group_factor, cfg.init_offset);
        let v = SEPARATED_SCALE as f32;
        let mut key = vec![0f32; shape.key_len()];
        let plans_ref = &plans;
        par_chunks_mut(&mut key, s * d, |bg, slab| {
            let mut rng = chunk_rng(seed, 4, bg as u64);
            for (p, row) in slab.chunks_mut(d).enumerate() {
                if p < off {
                    for x in row.iter_mut() {
                        *x = rng.random_range(-2i32..=2) as f32;
                    }
                    continue;
                }
                let j = p - off;
                for (m, sub) in row.chunks_mut(ds).enumerate() {
                    let plan = &plans_ref[bg * mm + m];
                    let c = plan.labels[j] as usize;
                    for (x, &e) in sub.iter_mut().zip(&plan.centers[c]) {
                        *x = v * e as f32;
                    }
                    for (x, &e) in sub[layout.p..].iter_mut().zip(&plan.noise[j]) {
                        *x = e as f32;
                    }
                }
            }
        });

        let centroids = (cfg.init == KmeansInit::Given).then(|| {
            let mut out = vec![0f32; groups * k * dc];
            for (plan, blk) in plans.iter().zip(out.chunks_mut(k * dc)) {
                let norms: Vec<i64> = (0..k).map(|c| plan.sq_norm(&layout, c)).collect();
                let phi = norms.iter().copied().max().unwrap_or(0);
                for (c, cen) in blk.chunks_mut(dc).enumerate() {
                    for (x, &e) in cen.iter_mut().zip(&plan.centers[c]) {
                        *x = v * e as f32;
                    }
                    if plan.singleton[c] {
                        for (x, &e) in cen[layout.p..ds].iter_mut().zip(&SINGLETON_NOISE) {
                            *x = e as f32;
                        }
                    }
                    if cfg.metric == Metric::Ip {
                        cen[ds] = ((phi - norms[c]) as f64).sqrt() as f32;
                    }
                    cen[0] += 0.5;
                }
            }
            out
        });
        Ok(PrefillInputs {
            shape,
            key,
            centroids,
        })
    }
}

/// The noise of a one-member cluster (part of its center).
const SINGLETON_NOISE: [i8; 3] = [1, 1, 0];

/// How [`PrefillInputs::separated`] places its centers in `d_s` coordinates.
#[derive(Debug, Clone, Copy)]
struct CenterLayout {
    /// Center coordinates `0..p`.
    p: usize,
    /// Noise coordinates `p..p + q` (3 or 0).
    q: usize,
    /// Centers have `w` or `w - 1` nonzero coordinates.
    w: usize,
    /// Number of such centers (f64: it may be astronomically large).
    count: f64,
}

/// `C(p, w) * 2^w`, the number of sign patterns with `w` nonzeros in `p` coordinates.
fn patterns(p: usize, w: usize) -> f64 {
    if w > p {
        return 0.0;
    }
    let mut c = 1f64;
    for i in 0..w {
        c = c * (p - i) as f64 / (i + 1) as f64;
    }
    c * 2f64.powi(w as i32)
}

impl CenterLayout {
    /// Centers with `w` or `w - 1` nonzeros in `p` coordinates.
    fn count(p: usize, w: usize) -> f64 {
        patterns(p, w) + patterns(p, w - 1)
    }

    /// The layout for `K` centers: noise coordinates if possible; the smallest `w >= 2`
    /// with at least `4K` centers (random draws), else the `w` with the most centers.
    fn choose(ds: usize, k: usize) -> Option<Self> {
        for q in [3usize, 0] {
            if ds <= q {
                continue;
            }
            let p = ds - q;
            let kk = k as f64;
            let pick = (2..=p)
                .find(|&w| Self::count(p, w) >= 4.0 * kk)
                .or_else(|| {
                    (1..=p)
                        .max_by(|&a, &b| Self::count(p, a).total_cmp(&Self::count(p, b)))
                        .filter(|&w| Self::count(p, w) >= kk)
                });
            if let Some(w) = pick {
                return Some(CenterLayout {
                    p,
                    q,
                    w,
                    count: Self::count(p, w),
                });
            }
        }
        None
    }

    /// The most centers any layout gives for `d_s` (for the error message).
    fn max_centers(ds: usize) -> u64 {
        (1..=ds).map(|w| Self::count(ds, w)).fold(0f64, f64::max) as u64
    }

    /// Every center (`count` must be small), in a fixed order.
    fn enumerate(&self) -> Vec<Vec<i8>> {
        let mut out = Vec::new();
        for w in [self.w, self.w - 1] {
            let mut idx: Vec<usize> = (0..w).collect();
            loop {
                for signs in 0..(1u32 << w) {
                    let mut c = vec![0i8; self.p];
                    for (t, &i) in idx.iter().enumerate() {
                        c[i] = if signs >> t & 1 == 1 { -1 } else { 1 };
                    }
                    out.push(c);
                }
                // Next combination of w out of p, lexicographic.
                let mut t = w;
                while t > 0 && idx[t - 1] == self.p - w + t - 1 {
                    t -= 1;
                }
                if t == 0 {
                    break;
                }
                idx[t - 1] += 1;
                for u in t..w {
                    idx[u] = idx[u - 1] + 1;
                }
            }
        }
        out
    }

    /// `K` distinct random centers.
    fn draw(&self, k: usize, rng: &mut SmallRng) -> Vec<Vec<i8>> {
        if self.count < 4.0 * k as f64 {
            let mut all = self.enumerate();
            all.shuffle(rng);
            all.truncate(k);
            return all;
        }
        let p_low = patterns(self.p, self.w - 1) / self.count;
        let mut seen: HashSet<Vec<i8>> = HashSet::with_capacity(2 * k);
        let mut out = Vec::with_capacity(k);
        while out.len() < k {
            let w = if rng.random::<f64>() < p_low {
                self.w - 1
            } else {
                self.w
            };
            let mut c = vec![0i8; self.p];
            for i in rand::seq::index::sample(rng, self.p, w) {
                c[i] = if rng.random::<bool>() { 1 } else { -1 };
            }
            if seen.insert(c.clone()) {
                out.push(c);
            }
        }
        out
    }
}

/// One group of [`PrefillInputs::separated`].
struct GroupPlan {
    /// `K` centers (in units of `V`, `p` coordinates each).
    centers: Vec<Vec<i8>>,
    /// `[n]` the cluster of each key.
    labels: Vec<u32>,
    /// `[n]` each key's noise (empty arrays when `q == 0`).
    noise: Vec<[i8; 3]>,
    /// `[K]` whether the cluster has exactly one member.
    singleton: Vec<bool>,
}

impl GroupPlan {
    fn new(layout: &CenterLayout, k: usize, n: usize, rng: &mut SmallRng) -> Self {
        let centers = layout.draw(k, rng);
        let mut labels: Vec<u32> = (0..n).map(|_| rng.random_range(0..k as u32)).collect();
        for c in 0..k {
            labels[(c as u64 * n as u64 / k as u64) as usize] = c as u32;
        }
        let mut members: Vec<Vec<usize>> = vec![Vec::new(); k];
        for (j, &l) in labels.iter().enumerate() {
            members[l as usize].push(j);
        }
        let singleton: Vec<bool> = members.iter().map(|m| m.len() == 1).collect();
        let mut noise = vec![[0i8; 3]; n];
        if layout.q == 3 {
            for mem in &members {
                let mut rest: &[usize] = mem;
                if mem.len() == 1 {
                    noise[mem[0]] = SINGLETON_NOISE;
                    continue;
                }
                if mem.len() % 2 == 1 {
                    // A triple s(e_a - e_b), s(e_b - e_c), s(e_c - e_a): sum 0, norms 2.
                    let r = rng.random_range(0..3usize);
                    let s: i8 = if rng.random::<bool>() { 1 } else { -1 };
                    for (t, &j) in mem[..3].iter().enumerate() {
                        let (a, b) = ((r + t) % 3, (r + t + 1) % 3);
                        noise[j][a] = s;
                        noise[j][b] = -s;
                    }
                    rest = &mem[3..];
                }
                for pair in rest.chunks_exact(2) {
                    // e: two nonzero +-1 entries out of three.
                    let zero = rng.random_range(0..3usize);
                    let mut e = [0i8; 3];
                    for (i, x) in e.iter_mut().enumerate() {
                        if i != zero {
                            *x = if rng.random::<bool>() { 1 } else { -1 };
                        }
                    }
                    noise[pair[0]] = e;
                    noise[pair[1]] = e.map(|x| -x);
                }
            }
        }
        GroupPlan {
            centers,
            labels,
            noise,
            singleton,
        }
    }

    /// The squared norm of every key of cluster `c`, as an integer.
    fn sq_norm(&self, layout: &CenterLayout, c: usize) -> i64 {
        let v = SEPARATED_SCALE as i64;
        let nz = self.centers[c].iter().filter(|&&e| e != 0).count() as i64;
        nz * v * v + if layout.q == 3 { 2 } else { 0 }
    }
}
