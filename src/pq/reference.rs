//! The CPU reference of the decode-step indexer: the spec's steps 0-5 with f64
//! arithmetic, the oracle for tests and the fallback backend of `tritonrt run`.
//!
//! Distances and scores are accumulated in f64 from the f32 inputs, in a fixed order
//! (coordinates ascending, then subvectors ascending). Top-k ties are broken towards the
//! lower `j` so the reference is deterministic (the spec allows any choice among ties).
//! Rows are spread over threads with `std::thread::scope`; the result does not depend on
//! the thread count.

use super::config::{Metric, PqConfig};
use super::workload::PqInputs;
use super::{par_chunks_mut, par_items};
use crate::error::Result;

/// The result of one step, host side.
///
/// `total` is the row length of `sparse_list`: `S` on the short path, else
/// `sink' + k + window'` ([`PqConfig::total`]).
#[derive(Debug, Clone, PartialEq)]
pub struct PqOutput {
    /// Batch `B`.
    pub b: usize,
    /// Query heads `H`.
    pub h: usize,
    /// KV heads `H_kv` (dimension 2 of `codes`).
    pub h_kv: usize,
    /// Subvectors `M` (dimension 3 of `codes`).
    pub m: usize,
    /// Sequence length `S` (row length of `weight_list`).
    pub s: usize,
    /// Entries per row of `sparse_list`.
    pub total: usize,
    /// `[B, H, total]` token positions, ascending per row (duplicates possible when
    /// `init_offset < sink_size`).
    pub sparse_list: Vec<i64>,
    /// `[B, H]`, each equal to `total`.
    pub sparse_len: Vec<i64>,
    /// `[B, H, S]`, 1.0 where the position is in the row's `sparse_list`, else 0.0
    /// (written in `weight_dtype` by [`super::io`]).
    pub weight_list: Vec<f32>,
    /// Updated codes, upstream layout `[B, n_cached, H_kv, M]`, values in `0..K`.
    pub codes: Vec<i64>,
    /// Quantized keys held in `codes` after the step (`S - init_offset` on the long path;
    /// unchanged on the short path).
    pub n_cached: usize,
}

impl PqOutput {
    /// Row `(b, h)` of `sparse_list` (`total` entries).
    pub fn row(&self, b: usize, h: usize) -> &[i64] {
        let i = (b * self.h + h) * self.total;
        &self.sparse_list[i..i + self.total]
    }

    /// Row `(b, h)` of `weight_list` (`S` entries).
    pub fn weight_row(&self, b: usize, h: usize) -> &[f32] {
        let i = (b * self.h + h) * self.s;
        &self.weight_list[i..i + self.s]
    }

    /// Heavy positions of row `(b, h)` (ascending): `sparse_list` minus one copy of each
    /// sink position `0..sink'` and of each window position `S - window' .. S`. On the
    /// short path this is empty. Positions missing from the row are ignored here (the
    /// checker reports them).
    pub fn heavy_positions(&self, cfg: &PqConfig, b: usize, h: usize) -> Vec<i64> {
        if cfg.is_short(self.s) {
            return Vec::new();
        }
        let mut row = self.row(b, h).to_vec();
        row.sort_unstable();
        let expected = fixed_positions(cfg, self.s);
        multiset_difference(&row, &expected).0
    }
}

/// The sink and window positions of a long-path row, ascending with duplicates:
/// `0..sink'` and `S - window' .. S`.
pub fn fixed_positions(cfg: &PqConfig, s: usize) -> Vec<i64> {
    let (sink, win) = (cfg.sink_eff(s), cfg.window_eff(s));
    let mut v: Vec<i64> = (0..sink as i64).chain((s - win) as i64..s as i64).collect();
    v.sort_unstable();
    v
}

/// For two ascending lists, `(a - b, b - a)` as multisets (both ascending).
pub(crate) fn multiset_difference(a: &[i64], b: &[i64]) -> (Vec<i64>, Vec<i64>) {
    let (mut i, mut j) = (0, 0);
    let (mut only_a, mut only_b) = (Vec::new(), Vec::new());
    while i < a.len() && j < b.len() {
        match a[i].cmp(&b[j]) {
            std::cmp::Ordering::Equal => {
                i += 1;
                j += 1;
            }
            std::cmp::Ordering::Less => {
                only_a.push(a[i]);
                i += 1;
            }
            std::cmp::Ordering::Greater => {
                only_b.push(b[j]);
                j += 1;
            }
        }
    }
    only_a.extend_from_slice(&a[i..]);
    only_b.extend_from_slice(&b[j..]);
    (only_a, only_b)
}

/// Squared L2 distance in f64 between subvector `x` (`d_s` values) and one centroid
/// (`d_c` values). With `phi = Some(p)` (metric ip) `x` is first extended by
/// `sqrt(max(0, p - ||x||^2))` and compared with all `d_s + 1` centroid coordinates;
/// with `None` only the first `d_s` coordinates are used.
pub fn subvector_distance(x: &[f32], centroid: &[f32], phi: Option<f32>) -> f64 {
    let mut dist = 0f64;
    let mut norm = 0f64;
    for (&xi, &ci) in x.iter().zip(centroid) {
        let (xi, ci) = (xi as f64, ci as f64);
        dist += (xi - ci) * (xi - ci);
        norm += xi * xi;
    }
    if let Some(p) = phi {
        let aug = (p as f64 - norm).max(0.0).sqrt();
        let c = centroid[x.len()] as f64;
        dist += (aug - c) * (aug - c);
    }
    dist
}

/// The code of subvector `x` (`d_s` values) among `centroids` (`K * d_c` values, one
/// subvector's block): `argmin_c` of [`subvector_distance`], the lowest `c` on ties; a NaN
/// distance is never taken, and where every distance is NaN the code is 0 (spec
/// "Non-finite inputs": a key with a non-finite coordinate gets the lowest `c` whose
/// distance is not NaN). Returns `(code, distance)` (distance NaN where every one is).
pub fn quantize_subvector(
    x: &[f32],
    centroids: &[f32],
    d_c: usize,
    phi: Option<f32>,
) -> (usize, f64) {
    let mut best: Option<(usize, f64)> = None;
    for (c, cen) in centroids.chunks_exact(d_c).enumerate() {
        let dist = subvector_distance(x, cen, phi);
        // Strict `<` keeps the lowest c on ties; the first non-NaN distance is taken even
        // when it is +inf; a NaN distance never is.
        if !dist.is_nan() && best.is_none_or(|(_, d)| dist < d) {
            best = Some((c, dist));
        }
    }
    best.unwrap_or((0, f64::NAN))
}

/// `phi` for `(b, g, m)` under the config's metric (None for euclidean).
fn phi_of(cfg: &PqConfig, inputs: &PqInputs, b: usize, g: usize, m: usize) -> Option<f32> {
    match cfg.metric {
        Metric::Euclidean => None,
        Metric::Ip => inputs
            .phi
            .as_ref()
            .map(|p| p[(b * inputs.shape.h_kv + g) * cfg.pq_group_factor + m]),
    }
}

/// The `M` codes of the key at position `pos` of KV head `g` in batch `b` (spec step 1).
///
/// # Panics
/// If the indices are out of range for `inputs` (validate the inputs first).
pub fn quantize_key(cfg: &PqConfig, inputs: &PqInputs, b: usize, g: usize, pos: usize) -> Vec<i64> {
    let d = inputs.shape.d;
    let (ds, dc, k) = (cfg.d_sub(d), cfg.d_c(d), cfg.k_centroids());
    let key = &inputs.key[inputs.key_offset(b, g, pos)..][..d];
    (0..cfg.pq_group_factor)
        .map(|m| {
            let off = inputs.centroid_offset(cfg, b, g, m);
            let cents = &inputs.centroids[off..off + k * dc];
            let x = &key[m * ds..(m + 1) * ds];
            quantize_subvector(x, cents, dc, phi_of(cfg, inputs, b, g, m)).0 as i64
        })
        .collect()
}

/// The f64 distance between the key at `pos` (subvector `m`) and centroid `code`, as
/// used by the quantization (the checker uses it to judge near-ties).
pub fn key_code_distance(
    cfg: &PqConfig,
    inputs: &PqInputs,
    b: usize,
    g: usize,
    pos: usize,
    m: usize,
    code: usize,
) -> f64 {
    let d = inputs.shape.d;
    let (ds, dc) = (cfg.d_sub(d), cfg.d_c(d));
    let x = &inputs.key[inputs.key_offset(b, g, pos) + m * ds..][..ds];
    let off = inputs.centroid_offset(cfg, b, g, m) + code * dc;
    subvector_distance(
        x,
        &inputs.centroids[off..off + dc],
        phi_of(cfg, inputs, b, g, m),
    )
}

/// The codes after step 1: `inputs.codes` with the keys at positions
/// `init_offset + n_cached .. S` quantized and appended, as `(codes, n)` in the upstream
/// layout `[B, n, H_kv, M]`. On the short path (or with nothing new) the input codes are
/// returned unchanged. Errors: invalid inputs ([`PqInputs::validate`]).
pub fn updated_codes(cfg: &PqConfig, inputs: &PqInputs) -> Result<(Vec<i64>, usize)> {
    inputs.validate(cfg)?;
    let sh = inputs.shape;
    let n = cfg.n_quantized(sh.s);
    let n_old = inputs.n_cached;
    if cfg.is_short(sh.s) || n <= n_old {
        return Ok((inputs.codes.clone(), n_old));
    }
    let (hkv, mm) = (sh.h_kv, cfg.pq_group_factor);
    let n_new = n - n_old;
    // New codes per (b, g): [n_new, M], computed in parallel, then scattered.
    let mut fresh = vec![0i64; sh.b * hkv * n_new * mm];
    par_chunks_mut(&mut fresh, n_new * mm, |bg, out| {
        let (b, g) = (bg / hkv, bg % hkv);
        for (t, codes) in out.chunks_mut(mm).enumerate() {
            let pos = cfg.init_offset + n_old + t;
            codes.copy_from_slice(&quantize_key(cfg, inputs, b, g, pos));
        }
    });
    let mut codes = vec![0i64; sh.b * n * hkv * mm];
    let row = hkv * mm;
    for b in 0..sh.b {
        let src = &inputs.codes[b * n_old * row..(b + 1) * n_old * row];
        codes[b * n * row..b * n * row + n_old * row].copy_from_slice(src);
        for g in 0..hkv {
            for t in 0..n_new {
                let dst = ((b * n + n_old + t) * hkv + g) * mm;
                let src = ((b * hkv + g) * n_new + t) * mm;
                codes[dst..dst + mm].copy_from_slice(&fresh[src..src + mm]);
            }
        }
    }
    Ok((codes, n))
}

/// The lookup table of head `(b, h)`: `lut[m * K + c] = <q_m, centroids[b, g, m, c,
/// 0..d_s]>` in f64 (`g = h / G`; only the first `d_s` centroid coordinates, under ip
/// too).
pub fn lut(cfg: &PqConfig, inputs: &PqInputs, b: usize, h: usize) -> Vec<f64> {
    let d = inputs.shape.d;
    let (ds, dc, k, mm) = (
        cfg.d_sub(d),
        cfg.d_c(d),
        cfg.k_centroids(),
        cfg.pq_group_factor,
    );
    let g = h / inputs.shape.group();
    let q = &inputs.query[inputs.query_offset(b, h)..][..d];
    let mut out = Vec::with_capacity(mm * k);
    for m in 0..mm {
        let off = inputs.centroid_offset(cfg, b, g, m);
        let qm = &q[m * ds..(m + 1) * ds];
        for cen in inputs.centroids[off..off + k * dc].chunks_exact(dc) {
            out.push(
                qm.iter()
                    .zip(&cen[..ds])
                    .map(|(&a, &c)| a as f64 * c as f64)
                    .sum::<f64>(),
            );
        }
    }
    out
}

/// Scores of head `(b, h)` for quantized keys `j in 0..count` (spec step 2), in f64,
/// from `codes` in the upstream layout `[B, n_codes, H_kv, M]` (for example a
/// candidate's returned codes): `score[j] = sum_m lut[m, code(b, j, g, m)]`.
///
/// # Panics
/// If `count > n_codes`, `codes` is too short, or a code is outside `0..K`.
#[allow(clippy::too_many_arguments)]
pub fn scores(
    cfg: &PqConfig,
    inputs: &PqInputs,
    codes: &[i64],
    n_codes: usize,
    b: usize,
    h: usize,
    count: usize,
) -> Vec<f64> {
    assert!(
        count <= n_codes,
        "scores: count {count} > n_codes {n_codes}"
    );
    let (hkv, mm, k) = (inputs.shape.h_kv, cfg.pq_group_factor, cfg.k_centroids());
    let g = h / inputs.shape.group();
    let table = lut(cfg, inputs, b, h);
    (0..count)
        .map(|j| {
            let base = ((b * n_codes + j) * hkv + g) * mm;
            (0..mm)
                .map(|m| {
                    let c = codes[base + m];
                    assert!((0..k as i64).contains(&c), "code {c} outside 0..{k}");
                    table[m * k + c as usize]
                })
                .sum::<f64>()
        })
        .collect()
}

/// Indices of the `k` largest `scores` (ties towards the lower index), unordered. A NaN
/// ranks below every other score, `-inf` included; among NaNs the lowest index wins (the
/// spec's "Non-finite inputs"). Uses a partial selection (`select_nth_unstable_by`), not a
/// full sort.
pub fn top_k(scores: &[f64], k: usize) -> Vec<u32> {
    let mut idx: Vec<u32> = (0..scores.len() as u32).collect();
    if k == 0 {
        return Vec::new();
    }
    if k < idx.len() {
        idx.select_nth_unstable_by(k - 1, |&a, &b| {
            let (sa, sb) = (scores[a as usize], scores[b as usize]);
            match (sa.is_nan(), sb.is_nan()) {
                (false, false) => sb.total_cmp(&sa),
                (na, nb) => na.cmp(&nb),
            }
            .then(a.cmp(&b))
        });
        idx.truncate(k);
    }
    idx
}

/// One decode step of the indexer on the CPU (spec steps 0-5), with f64 scores.
///
/// Returns `sparse_list [B, H, total]`, `sparse_len [B, H]`, `weight_list [B, H, S]`
/// (0/1) and the updated codes `[B, n, H_kv, M]`. The inputs are not modified.
/// Errors: invalid config or inputs ([`PqInputs::validate`]).
pub fn step(cfg: &PqConfig, inputs: &PqInputs) -> Result<PqOutput> {
    inputs.validate(cfg)?;
    let sh = inputs.shape;
    let (bb, hh, s) = (sh.b, sh.h, sh.s);
    let total = cfg.total(s);
    let mut out = PqOutput {
        b: bb,
        h: hh,
        h_kv: sh.h_kv,
        m: cfg.pq_group_factor,
        s,
        total,
        sparse_list: vec![0; bb * hh * total],
        sparse_len: vec![total as i64; bb * hh],
        weight_list: vec![0.0; bb * hh * s],
        codes: Vec::new(),
        n_cached: 0,
    };

    if cfg.is_short(s) {
        // Step 0: everyone attends to everything; nothing is quantized.
        par_chunks_mut(&mut out.sparse_list, total, |_, row| {
            for (p, v) in row.iter_mut().enumerate() {
                *v = p as i64;
            }
        });
        par_chunks_mut(&mut out.weight_list, s, |_, row| row.fill(1.0));
        out.codes = inputs.codes.clone();
        out.n_cached = inputs.n_cached;
        return Ok(out);
    }

    // Step 1.
    let (codes, n) = updated_codes(cfg, inputs)?;
    // Steps 2-5, one work item per (b, g): its G query heads share the codes.
    let group = sh.group();
    let (hkv, mm, k_cent) = (sh.h_kv, cfg.pq_group_factor, cfg.k_centroids());
    let w0 = cfg.window_start(s).min(n);
    let k = cfg.heavy_k(s);
    let fixed = fixed_positions(cfg, s);
    let items: Vec<(usize, &mut [i64], &mut [f32])> = out
        .sparse_list
        .chunks_mut(group * total)
        .zip(out.weight_list.chunks_mut(group * s))
        .enumerate()
        .map(|(i, (a, w))| (i, a, w))
        .collect();
    let codes_ref = &codes;
    par_items(items, |(bg, lists, weights)| {
        let (b, g) = (bg / hkv, bg % hkv);
        // Candidate codes of this KV head, compact [w0, M].
        let mut cand: Vec<u16> = Vec::with_capacity(if w0 > k { w0 * mm } else { 0 });
        if w0 > k {
            for j in 0..w0 {
                let base = ((b * n + j) * hkv + g) * mm;
                cand.extend(codes_ref[base..base + mm].iter().map(|&c| c as u16));
            }
        }
        let mut row: Vec<i64> = Vec::with_capacity(total);
        let mut sc = vec![0f64; if w0 > k { w0 } else { 0 }];
        for (t, (list, wrow)) in lists
            .chunks_mut(total)
            .zip(weights.chunks_mut(s))
            .enumerate()
        {
            let h = g * group + t;
            row.clear();
            row.extend_from_slice(&fixed);
            if w0 > k {
                let table = lut(cfg, inputs, b, h);
                for (j, cj) in cand.chunks_exact(mm).enumerate() {
                    sc[j] = cj
                        .iter()
                        .enumerate()
                        .map(|(m, &c)| table[m * k_cent + c as usize])
                        .sum();
                }
                row.extend(
                    top_k(&sc, k)
                        .into_iter()
                        .map(|j| (j as usize + cfg.init_offset) as i64),
                );
            } else {
                // All w0 candidates, then the lowest masked j (w0..k) as filler.
                row.extend((0..k).map(|j| (j + cfg.init_offset) as i64));
            }
            row.sort_unstable();
            list.copy_from_slice(&row);
            for &p in &row {
                wrow[p as usize] = 1.0;
            }
        }
    });
    out.codes = codes;
    out.n_cached = n;
    Ok(out)
}
