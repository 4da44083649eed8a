//! The CPU reference of the prefill: the spec's steps 1-6 in f64, the oracle the GPU
//! result is checked against ([`super::check`]).
//!
//! Per group (spec step 1: the subvectors `x_j`, `j < n`, as f64 from the f32 keys):
//! - metric ip (step 2): `phi = max_j ||x_j||^2` with each squared norm summed in f32 in
//!   ascending coordinate order ([`sq_norm_f32`]; the spec's "fp32 maximum of the squared
//!   norms"), returned as f32; every `x_j` is extended by `sqrt(max(0, phi - ||x_j||^2))`,
//!   computed in f64 from that f32 `phi` and the f64 squared norm. The augmented
//!   coordinate takes part in distances and in the centroid means (`d_c = d_s + 1`).
//! - init (step 3): the keys of [`init_indices`], or the given centroids.
//! - Lloyd iterations (step 4), the rule the GPU follows too: for `t` in
//!   `0..kmeans_iter`: assign `a_t` (argmin of the f64 squared distance, lowest `k` on
//!   ties); if `t > 0` and `a_t == a_{t-1}` for every key of the group, stop (the
//!   centroids are a fixed point); else update every centroid to the mean of its members
//!   (f64 sum in ascending `j`, divided by the count), a cluster with no member keeping
//!   its previous centroid. `iterations` counts the updates.
//! - codes (step 5): the argmin against the final centroids (the last assignment when the
//!   loop stopped early, else one more assignment).
//!
//! Squared distances are f64 sums over the `d_c` coordinates in a fixed order
//! ([`dist2`]). The argmin over `k` is searched with an f32 screening pass whose error
//! is bounded, then [`dist2`] for every centroid the bound cannot rule out: the same
//! winner and the same f64 distance as a full f64 search ([`nearest`]), several times
//! faster. The work is spread over (group, key chunk) items of a fixed size, and
//! every sum runs in a fixed order, so the result does not depend on the thread count.

use super::super::par_items;
use super::{init_indices, PrefillConfig, PrefillInputs, PrefillOutput, PrefillShape};
use crate::error::Result;
use crate::pq::config::Metric;

/// Keys per work item of an assignment pass (fixed, so results never depend on the
/// thread count).
const ASSIGN_CHUNK: usize = 2048;

/// The reference's result: the spec's outputs plus what the checker compares against.
#[derive(Debug, Clone, PartialEq)]
pub struct RefPrefill {
    /// `[B, H_kv, M, K, d_c]` final centroids in f64.
    pub centroids: Vec<f64>,
    /// `[B, n, H_kv, M]` codes in `0..K` (upstream layout): the argmin against the final
    /// centroids.
    pub codes: Vec<i64>,
    /// `[B * H_kv * M]` fp32 `phi` (metric ip), else `None`.
    pub phi: Option<Vec<f32>>,
    /// `[B * H_kv * M]` final inertia per group, `sum_j min_k ||x_j - c_k||^2` in f64 with
    /// the final f64 centroids (augmented vectors under ip).
    pub inertia: Vec<f64>,
    /// `[B * H_kv * M]` centroid updates performed per group (`1..=kmeans_iter`).
    pub iterations: Vec<u32>,
    /// `n = S - init_offset`.
    pub n: usize,
}

impl RefPrefill {
    /// The spec's outputs: centroids rounded to f32, the rest as they are.
    pub fn to_output(&self) -> PrefillOutput {
        PrefillOutput {
            centroids: self.centroids.iter().map(|&c| c as f32).collect(),
            codes: self.codes.clone(),
            phi: self.phi.clone(),
            n: self.n,
            iterations: self.iterations.clone(),
        }
    }
}

/// `||x||^2` summed in f32 in ascending coordinate order (how `phi` is defined).
pub fn sq_norm_f32(x: &[f32]) -> f32 {
    x.iter().fold(0f32, |acc, &v| acc + v * v)
}

/// Squared L2 distance in f64 between two vectors of the same length, summed in four
/// interleaved partial sums (coordinates `i % 4`), then `(s0 + s1) + (s2 + s3)`, then
/// the tail: a fixed order, vectorizable.
pub fn dist2(a: &[f64], b: &[f64]) -> f64 {
    let mut s = [0f64; 4];
    let (ac, bc) = (a.chunks_exact(4), b.chunks_exact(4));
    let (ar, br) = (ac.remainder(), bc.remainder());
    for (x, y) in ac.zip(bc) {
        for i in 0..4 {
            let d = x[i] - y[i];
            s[i] += d * d;
        }
    }
    let mut total = (s[0] + s[1]) + (s[2] + s[3]);
    for (x, y) in ar.iter().zip(br) {
        let d = x - y;
        total += d * d;
    }
    total
}

/// The nearest of `centroids` (`K * d_c` values) to `x` (`d_c` values): `(k, distance)`
/// by [`dist2`], the lowest `k` on ties.
pub fn nearest(x: &[f64], centroids: &[f64]) -> (usize, f64) {
    let mut best = (0usize, f64::INFINITY);
    for (k, c) in centroids.chunks_exact(x.len()).enumerate() {
        let d = dist2(x, c);
        if d < best.1 {
            best = (k, d);
        }
    }
    best
}

/// Centroids per block of the f32 screening pass (the block's dot products accumulate
/// side by side, which vectorizes without any reduction).
const BLOCK: usize = 16;

/// A set of `K` f64 centroids prepared for [`Screen::nearest`], which returns exactly
/// what [`nearest`] returns, several times faster.
///
/// How: an f32 pass estimates every distance as `||x||^2 + ||c_k||^2 - 2 <x, c_k>` (the
/// norms in f64, the dot product in f32 from the f32-rounded vectors, summed in
/// ascending coordinate order), with an error below
/// `e_k = (d_c + 4) * 2^-23 * (||x||^2 + ||c_k||^2) + 1e-30`: input rounding (`2u`) and
/// summation (`(d_c - 1) u`) on `sum |x_i c_i| <= (||x||^2 + ||c_k||^2) / 2`, doubled for
/// the distance, with a factor 2 to spare, and an absolute term against f32 underflow.
/// Every `k` whose lower bound `est_k - e_k` does not exceed `min_j (est_j + e_j)` is then
/// measured with [`dist2`] in ascending `k`; any other `k` is strictly farther than one of
/// those, so the winner (lowest `k` on ties) and its f64 distance are exactly
/// [`nearest`]'s. A non-finite estimate (f32 overflow) is always measured.
pub(crate) struct Screen<'a> {
    /// `[K, d_c]` f64 centroids.
    cents: &'a [f64],
    /// `[ceil(K / BLOCK), d_c, BLOCK]` f32 centroids, zero-padded past `K`.
    blocks: Vec<f32>,
    /// `[K]` f64 squared norms.
    norms: Vec<f64>,
    dc: usize,
}

/// Per-thread buffers of [`Screen::nearest`].
pub(crate) struct ScreenScratch {
    x32: Vec<f32>,
    dots: Vec<f32>,
    lo: Vec<f64>,
}

impl<'a> Screen<'a> {
    /// Prepare `cents` (`K * d_c` values).
    pub(crate) fn new(cents: &'a [f64], dc: usize) -> Self {
        let k = cents.len() / dc;
        let nblk = k.div_ceil(BLOCK);
        let mut blocks = vec![0f32; nblk * dc * BLOCK];
        let mut norms = Vec::with_capacity(k);
        for (kk, c) in cents.chunks_exact(dc).enumerate() {
            let (blk, lane) = (kk / BLOCK, kk % BLOCK);
            for (i, &v) in c.iter().enumerate() {
                blocks[(blk * dc + i) * BLOCK + lane] = v as f32;
            }
            norms.push(c.iter().map(|v| v * v).sum::<f64>());
        }
        Screen {
            cents,
            blocks,
            norms,
            dc,
        }
    }

    /// Buffers for [`Screen::nearest`].
    pub(crate) fn scratch(&self) -> ScreenScratch {
        let k = self.norms.len();
        ScreenScratch {
            x32: vec![0f32; self.dc],
            dots: vec![0f32; k.div_ceil(BLOCK) * BLOCK],
            lo: vec![0f64; k],
        }
    }

    /// The nearest centroid to `x` (`d_c` values): exactly [`nearest`]`(x, cents)`.
    pub(crate) fn nearest(&self, x: &[f64], s: &mut ScreenScratch) -> (usize, f64) {
        let mut nx = 0f64;
        for (o, &v) in s.x32.iter_mut().zip(x) {
            *o = v as f32;
            nx += v * v;
        }
        for (blk, out) in self
            .blocks
            .chunks_exact(self.dc * BLOCK)
            .zip(s.dots.chunks_exact_mut(BLOCK))
        {
            let rows = blk.as_chunks::<BLOCK>().0;
            let mut acc = [0f32; BLOCK];
            for (&xi, row) in s.x32.iter().zip(rows) {
                for l in 0..BLOCK {
                    acc[l] += xi * row[l];
                }
            }
            out.copy_from_slice(&acc);
        }
        let tol = (self.dc + 4) as f64 * f64::powi(2.0, -23);
        let mut upper = f64::INFINITY;
        for ((lo, &dot), &nc) in s.lo.iter_mut().zip(&s.dots).zip(&self.norms) {
            let est = nx + nc - 2.0 * dot as f64;
            let e = tol * (nx + nc) + 1e-30;
            if est.is_finite() && e.is_finite() {
                *lo = est - e;
                upper = upper.min(est + e);
            } else {
                *lo = f64::NEG_INFINITY;
            }
        }
        let mut best = (0usize, f64::INFINITY);
        for (k, &lo) in s.lo.iter().enumerate() {
            // Never NaN: `lo` is finite or -inf, `upper` finite or +inf.
            if lo <= upper {
                let d = dist2(x, &self.cents[k * self.dc..(k + 1) * self.dc]);
                if d < best.1 {
                    best = (k, d);
                }
            }
        }
        best
    }
}

/// Subvector `j` of group `gi`: `key[b, g, init_offset + j, m * d_s ..][..d_s]`.
///
/// # Panics
/// If the indices are out of range (validate the inputs first).
pub fn subvector<'a>(
    cfg: &PrefillConfig,
    inputs: &'a PrefillInputs,
    gi: usize,
    j: usize,
) -> &'a [f32] {
    let sh = &inputs.shape;
    let ds = cfg.d_sub(sh.d);
    let (b, g, m) = cfg.group_coords(sh, gi);
    &inputs.key[sh.key_offset(b, g, cfg.init_offset + j) + m * ds..][..ds]
}

/// `phi` of group `gi`: the f32 maximum over its `n` keys of [`sq_norm_f32`].
pub fn group_phi(cfg: &PrefillConfig, inputs: &PrefillInputs, gi: usize) -> f32 {
    (0..cfg.n(inputs.shape.s))
        .map(|j| sq_norm_f32(subvector(cfg, inputs, gi, j)))
        .fold(0f32, f32::max)
}

/// Write `x` as f64 into `out[..d_s]` and, with `phi = Some(p)` (metric ip), the
/// augmented coordinate `sqrt(max(0, p - ||x||^2))` (f64 squared norm, ascending) into
/// `out[d_s]`.
pub fn augment(x: &[f32], phi: Option<f32>, out: &mut [f64]) {
    let mut norm = 0f64;
    for (o, &v) in out.iter_mut().zip(x) {
        let v = v as f64;
        *o = v;
        norm += v * v;
    }
    if let Some(p) = phi {
        out[x.len()] = (p as f64 - norm).max(0.0).sqrt();
    }
}

/// The `n * d_c` augmented f64 subvectors of group `gi` (see [`augment`]).
pub fn group_points(
    cfg: &PrefillConfig,
    inputs: &PrefillInputs,
    gi: usize,
    phi: Option<f32>,
) -> Vec<f64> {
    let (n, dc) = (cfg.n(inputs.shape.s), cfg.d_c(inputs.shape.d));
    let mut pts = vec![0f64; n * dc];
    for (j, out) in pts.chunks_exact_mut(dc).enumerate() {
        augment(subvector(cfg, inputs, gi, j), phi, out);
    }
    pts
}

/// One group's k-means state.
struct Group {
    /// `[n, d_c]` augmented f64 points.
    points: Vec<f64>,
    /// `[K, d_c]` current centroids.
    cents: Vec<f64>,
    /// `[n]` the latest assignment.
    labels: Vec<u32>,
    /// `[n]` the assignment before it.
    prev: Vec<u32>,
    /// `[n]` each key's distance to its assigned centroid, from the latest assignment.
    dist: Vec<f64>,
    /// Updates performed.
    iterations: u32,
    /// Still iterating (the latest assignment is not against the final centroids).
    active: bool,
}

/// One assignment work item: a chunk of points, the group's centroids, and the chunk's
/// labels and distances to write.
type AssignItem<'a> = (&'a [f64], &'a [f64], &'a mut [u32], &'a mut [f64]);

/// Assign every key of every active group (parallel over fixed-size key chunks).
fn assign_pass(groups: &mut [Group], dc: usize) {
    let mut items: Vec<AssignItem<'_>> = Vec::new();
    for g in groups.iter_mut().filter(|g| g.active) {
        let Group {
            points,
            cents,
            labels,
            dist,
            ..
        } = g;
        for ((p, l), d) in points
            .chunks(ASSIGN_CHUNK * dc)
            .zip(labels.chunks_mut(ASSIGN_CHUNK))
            .zip(dist.chunks_mut(ASSIGN_CHUNK))
        {
            items.push((p, cents, l, d));
        }
    }
    par_items(items, |(pts, cents, labels, dist)| {
        let screen = Screen::new(cents, dc);
        let mut scratch = screen.scratch();
        for ((x, l), d) in pts.chunks_exact(dc).zip(labels).zip(dist) {
            let (k, best) = screen.nearest(x, &mut scratch);
            *l = k as u32;
            *d = best;
        }
    });
}

/// Centroid update of one group: the f64 mean of each cluster's members (ascending `j`),
/// empty clusters unchanged.
fn update(g: &mut Group, k: usize, dc: usize) {
    let mut sums = vec![0f64; k * dc];
    let mut counts = vec![0u64; k];
    for (x, &l) in g.points.chunks_exact(dc).zip(&g.labels) {
        let l = l as usize;
        counts[l] += 1;
        for (s, v) in sums[l * dc..(l + 1) * dc].iter_mut().zip(x) {
            *s += v;
        }
    }
    for ((c, s), &cnt) in g
        .cents
        .chunks_exact_mut(dc)
        .zip(sums.chunks_exact(dc))
        .zip(&counts)
    {
        if cnt > 0 {
            for (ci, si) in c.iter_mut().zip(s) {
                *ci = si / cnt as f64;
            }
        }
    }
}

/// The prefill on the CPU (spec steps 1-6) in f64; see the module docs for the exact
/// rule. Deterministic: the result depends only on the config and the inputs.
///
/// Memory: the augmented f64 points of every group, `8 * B * H_kv * M * n * d_c` bytes
/// (twice the f32 keys), plus labels and distances.
///
/// Errors: invalid config or inputs ([`PrefillInputs::validate`]).
pub fn prefill(cfg: &PrefillConfig, inputs: &PrefillInputs) -> Result<RefPrefill> {
    inputs.validate(cfg)?;
    let sh: PrefillShape = inputs.shape;
    let (n, k, dc, ngroups) = (
        cfg.n(sh.s),
        cfg.k_centroids(),
        cfg.d_c(sh.d),
        cfg.groups(&sh),
    );
    let init = init_indices(cfg, &sh);

    // Per group: phi, points and the starting centroids.
    let mut phi = vec![0f32; ngroups];
    let mut groups: Vec<Option<Group>> = (0..ngroups).map(|_| None).collect();
    {
        let items: Vec<(usize, &mut f32, &mut Option<Group>)> = phi
            .iter_mut()
            .zip(groups.iter_mut())
            .enumerate()
            .map(|(gi, (p, g))| (gi, p, g))
            .collect();
        let init = &init;
        par_items(items, |(gi, phi_out, slot)| {
            let phi = (cfg.metric == Metric::Ip).then(|| group_phi(cfg, inputs, gi));
            *phi_out = phi.unwrap_or(0.0);
            let points = group_points(cfg, inputs, gi, phi);
            let cents: Vec<f64> = match init {
                Some(idx) => idx[gi * k..(gi + 1) * k]
                    .iter()
                    .flat_map(|&j| points[j as usize * dc..(j as usize + 1) * dc].iter())
                    .copied()
                    .collect(),
                None => inputs.centroids.as_ref().expect("validated: init given")
                    [gi * k * dc..(gi + 1) * k * dc]
                    .iter()
                    .map(|&c| c as f64)
                    .collect(),
            };
            *slot = Some(Group {
                points,
                cents,
                labels: vec![0; n],
                prev: vec![0; n],
                dist: vec![0.0; n],
                iterations: 0,
                active: true,
            });
        });
    }
    let mut groups: Vec<Group> = groups.into_iter().flatten().collect();

    // Lloyd iterations.
    for t in 0..cfg.kmeans_iter {
        if !groups.iter().any(|g| g.active) {
            break;
        }
        assign_pass(&mut groups, dc);
        let items: Vec<&mut Group> = groups.iter_mut().filter(|g| g.active).collect();
        par_items(items, |g| {
            if t > 0 && g.labels == g.prev {
                g.active = false;
                return;
            }
            update(g, k, dc);
            g.iterations += 1;
            std::mem::swap(&mut g.labels, &mut g.prev);
        });
    }
    // Groups that ran every iteration: assign against the final centroids.
    assign_pass(&mut groups, dc);

    // Outputs.
    let (hkv, mm) = (sh.h_kv, cfg.pq_group_factor);
    let mut codes = vec![0i64; cfg.codes_len(&sh)];
    let mut centroids = Vec::with_capacity(ngroups * k * dc);
    let mut inertia = Vec::with_capacity(ngroups);
    let mut iterations = Vec::with_capacity(ngroups);
    for (gi, g) in groups.iter().enumerate() {
        let (b, gh, m) = cfg.group_coords(&sh, gi);
        for (j, &l) in g.labels.iter().enumerate() {
            codes[((b * n + j) * hkv + gh) * mm + m] = l as i64;
        }
        centroids.extend_from_slice(&g.cents);
        inertia.push(g.dist.iter().sum::<f64>());
        iterations.push(g.iterations);
    }
    Ok(RefPrefill {
        centroids,
        codes,
        phi: (cfg.metric == Metric::Ip).then_some(phi),
        inertia,
        iterations,
        n,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pq::prefill::SplitMix64;

    /// Uniform in [-1, 1).
    fn unit(rng: &mut SplitMix64) -> f64 {
        (rng.next() >> 11) as f64 / (1u64 << 52) as f64 - 1.0
    }

    #[test]
    fn screened_nearest_is_exactly_nearest() {
        let mut rng = SplitMix64(7);
        for (dc, k, scale) in [
            (1, 2, 1.0),
            (7, 16, 1.0),
            (8, 64, 1e-20),
            (65, 256, 1.0),
            (129, 32, 1e18),
            (16, 64, 1e3),
        ] {
            let mut cents: Vec<f64> = (0..k * dc).map(|_| unit(&mut rng) * scale).collect();
            // Exact ties: duplicated centroids, and a centroid at 1e30 (f32 overflow).
            cents.copy_within(0..dc, (k - 1) * dc);
            cents[dc..2 * dc].fill(1e30);
            let screen = Screen::new(&cents, dc);
            let mut s = screen.scratch();
            for t in 0..300 {
                let x: Vec<f64> = if t % 3 == 0 {
                    // On a centroid (distance 0, tie between 0 and k - 1 when t % 2 == 0).
                    let c = if t % 2 == 0 { 0 } else { (t / 3) % k };
                    cents[c * dc..(c + 1) * dc].to_vec()
                } else if t % 3 == 1 {
                    // Halfway between two centroids: near-ties.
                    let (a, b) = (2 % k, (t / 3) % k);
                    (0..dc)
                        .map(|i| 0.5 * (cents[a * dc + i] + cents[b * dc + i]))
                        .collect()
                } else {
                    (0..dc).map(|_| unit(&mut rng) * scale).collect()
                };
                assert_eq!(
                    screen.nearest(&x, &mut s),
                    nearest(&x, &cents),
                    "dc={dc} k={k} scale={scale} t={t}"
                );
            }
        }
    }
}
