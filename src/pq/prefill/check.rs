//! The spec's "what counts as the same answer" for a prefill: judge a candidate
//! [`PrefillOutput`] (from the GPU, or anything else) against the inputs and the CPU
//! reference's [`RefPrefill`] for them.
//!
//! A candidate passes ([`PrefillCheckMode::Spec`]) when:
//! - its sizes are right (`n`, `centroids`, `codes`, `iterations`, and `phi` under ip),
//!   every centroid and `phi` is finite, every code is in `0..K`, and every group's
//!   iteration count is in `1..=kmeans_iter`;
//! - (a) every code is an argmin for the candidate's own centroids (and, under ip, its
//!   own `phi` for the augmentation), distances recomputed in f64
//!   ([`super::reference::dist2`]): `d(code) <= min_k d(k) + 1e-5 * (1 + d_c)`
//!   ([`CODE_TOL`]);
//! - (b) per group, the candidate's inertia `sum_j min_k d(k)` (recomputed in f64 from
//!   its centroids and `phi`, each key at its min distance, whatever its code) is within
//!   0.1% ([`INERTIA_TOL`]) of the reference's:
//!   `|I_cand - I_ref| <= 1e-3 * max(I_ref, 1e-7 * E)` with `E = sum_j ||x_j||^2` (the
//!   augmented keys under ip). The floor keeps a zero-inertia group (`n = K`) checkable:
//!   fp32 centroids of f64 means move each distance by about `1e-14 * ||x||^2`, far
//!   below it, while a misplaced centroid costs far more;
//! - (d) metric ip: `|phi_cand - phi_ref| <= 1e-5 * |phi_ref|` ([`PHI_TOL`]; fp32 sums in
//!   another order differ in the last bits).
//!
//! [`PrefillCheckMode::Exact`] (rule (c), for well-separated inputs such as
//! [`PrefillInputs::separated`]) also requires the codes, the iteration counts and the
//! centroids to equal the reference's, centroids compared after rounding the reference to
//! f32 (`0.0 == -0.0`).
//!
//! The argmin check costs `n * K * d_c` per group. The minimum over `k` is found by an
//! f32 screening pass with a proven error bound followed by f64 distances for the few
//! centroids it cannot rule out, which gives exactly the f64 minimum of a full f64
//! search (see the reference's module docs). It runs over (group, key chunk) items on
//! [`crate::pq::host_threads`] threads, and the report does not depend on their number.

use std::collections::BTreeMap;
use std::fmt;

use super::super::par_items;
use super::reference::{augment, dist2, subvector, RefPrefill, Screen};
use super::{PrefillConfig, PrefillInputs, PrefillOutput};
use crate::pq::config::Metric;

/// Argmin slack: a code's distance may exceed the best by `CODE_TOL * (1 + d_c)` (spec).
pub const CODE_TOL: f64 = 1e-5;
/// Relative inertia tolerance per group, 0.1% (spec).
pub const INERTIA_TOL: f64 = 1e-3;
/// The inertia floor: relative differences are taken to `max(I_ref, INERTIA_FLOOR * E)`
/// (see the module docs).
pub const INERTIA_FLOOR: f64 = 1e-7;
/// Relative tolerance on `phi` (ip).
pub const PHI_TOL: f64 = 1e-5;
/// Violations listed per kind in a report by default (all are counted; `Display` shows
/// 5, taking the kinds in turn).
pub const DEFAULT_MAX_LISTED: usize = 12;
/// Violations `Display` prints.
const DISPLAYED: usize = 5;
/// Keys per work item of the argmin pass.
const CHECK_CHUNK: usize = 2048;

/// How strict the check is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrefillCheckMode {
    /// Rules (a), (b) and (d) of the spec.
    Spec,
    /// The spec's rules plus (c): codes, iteration counts and f32 centroids equal to the
    /// reference's.
    Exact,
}

/// What a violation is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PrefillViolationKind {
    /// The inputs or config are invalid, or the reference does not fit them: nothing
    /// could be checked.
    Inputs,
    /// A length is wrong (`n`, `centroids`, `codes`, `phi`, `iterations`).
    Shape,
    /// A code outside `0..K`.
    CodeRange,
    /// A non-finite centroid or `phi` (the group's argmin and inertia are not checked).
    Nonfinite,
    /// (a) A code is not an argmin of its key's distances, beyond [`CODE_TOL`].
    Argmin,
    /// (b) A group's inertia differs from the reference's beyond [`INERTIA_TOL`].
    Inertia,
    /// (d) `phi` differs from the reference's beyond [`PHI_TOL`].
    Phi,
    /// An iteration count outside `1..=kmeans_iter` (exact mode: not the reference's).
    Iterations,
    /// (c) A code differs from the reference's.
    ExactCodes,
    /// (c) A centroid value differs from the reference's rounded to f32.
    ExactCentroids,
}

impl PrefillViolationKind {
    /// Short name used in reports.
    pub fn name(self) -> &'static str {
        match self {
            PrefillViolationKind::Inputs => "inputs",
            PrefillViolationKind::Shape => "shape",
            PrefillViolationKind::CodeRange => "code-range",
            PrefillViolationKind::Nonfinite => "nonfinite",
            PrefillViolationKind::Argmin => "argmin",
            PrefillViolationKind::Inertia => "inertia",
            PrefillViolationKind::Phi => "phi",
            PrefillViolationKind::Iterations => "iterations",
            PrefillViolationKind::ExactCodes => "exact-codes",
            PrefillViolationKind::ExactCentroids => "exact-centroids",
        }
    }
}

/// One violation: where (group `(b, g, m)`, key `j`) and what.
#[derive(Debug, Clone, PartialEq)]
pub struct PrefillViolation {
    /// The group index `(b * H_kv + g) * M + m` and its `(b, g, m)`, if any.
    pub group: Option<(usize, (usize, usize, usize))>,
    /// The key `j` (token `init_offset + j`), if any.
    pub key: Option<usize>,
    /// The rule broken.
    pub kind: PrefillViolationKind,
    /// Human-readable detail with the values involved.
    pub detail: String,
}

impl fmt::Display for PrefillViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some((gi, (b, g, m))) = self.group {
            write!(f, "group {gi} (b={b} g={g} m={m})")?;
            if let Some(j) = self.key {
                write!(f, " key {j}")?;
            }
            f.write_str(": ")?;
        }
        write!(f, "{}: {}", self.kind.name(), self.detail)
    }
}

/// The largest relative inertia difference over the groups.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct InertiaDiff {
    /// The group index.
    pub group: usize,
    /// The reference's inertia.
    pub reference: f64,
    /// The candidate's inertia.
    pub candidate: f64,
    /// `(candidate - reference) / max(reference, INERTIA_FLOOR * E)`.
    pub rel: f64,
}

/// The verdict of a prefill check: every violation counted, the first few listed.
#[derive(Debug, Clone)]
pub struct PrefillCheckReport {
    /// The mode checked.
    pub mode: PrefillCheckMode,
    /// Groups examined (`B * H_kv * M`).
    pub groups: usize,
    /// Keys per group.
    pub n: usize,
    /// Centroids per group.
    pub k: usize,
    /// Centroid dimension.
    pub d_c: usize,
    /// The first violations of each kind (at most `max_listed` per kind), in the order
    /// found: iteration counts, `phi` and finiteness, then per group the codes (by key),
    /// then inertia, then exact centroids.
    pub listed: Vec<PrefillViolation>,
    /// Number of violations per kind.
    pub counts: BTreeMap<PrefillViolationKind, usize>,
    /// The largest relative inertia difference (None if no group was compared).
    pub worst_inertia: Option<InertiaDiff>,
    /// The largest relative `phi` difference (ip; None otherwise).
    pub worst_phi_rel: Option<f64>,
    /// Codes in range that differ from the reference's (accepted in spec mode when they
    /// pass (a) and (b)).
    pub codes_differing: usize,
    max_listed: usize,
}

impl PrefillCheckReport {
    fn push(&mut self, v: PrefillViolation) {
        *self.counts.entry(v.kind).or_default() += 1;
        self.list(v);
    }

    /// Keep `v` in `listed` if its kind has room (it is already counted).
    fn list(&mut self, v: PrefillViolation) {
        if self.listed.iter().filter(|l| l.kind == v.kind).count() < self.max_listed {
            self.listed.push(v);
        }
    }

    /// Up to `count` listed violations, taking the kinds in turn (the first of each kind,
    /// then the second of each, ...).
    pub fn sample(&self, count: usize) -> Vec<&PrefillViolation> {
        let per_kind: Vec<Vec<&PrefillViolation>> = self
            .counts
            .keys()
            .map(|k| self.listed.iter().filter(|v| v.kind == *k).collect())
            .collect();
        let mut out = Vec::new();
        for round in 0.. {
            let before = out.len();
            for list in &per_kind {
                if out.len() == count {
                    return out;
                }
                if let Some(v) = list.get(round) {
                    out.push(*v);
                }
            }
            if out.len() == before {
                break;
            }
        }
        out
    }

    /// True when no violation was found.
    pub fn passed(&self) -> bool {
        self.counts.is_empty()
    }

    /// Total number of violations.
    pub fn total_violations(&self) -> usize {
        self.counts.values().sum()
    }

    /// Number of violations of one kind.
    pub fn count(&self, kind: PrefillViolationKind) -> usize {
        self.counts.get(&kind).copied().unwrap_or(0)
    }
}

impl fmt::Display for PrefillCheckReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mode = match self.mode {
            PrefillCheckMode::Spec => "spec rule",
            PrefillCheckMode::Exact => "exact",
        };
        let mut what = format!(
            "{mode}, {} groups of n={} keys, K={}, d_c={}",
            self.groups, self.n, self.k, self.d_c
        );
        if let Some(w) = self.worst_inertia {
            what.push_str(&format!(
                "; worst inertia difference {:+.2e} (group {})",
                w.rel, w.group
            ));
        }
        if let Some(p) = self.worst_phi_rel {
            what.push_str(&format!("; worst phi difference {p:.2e}"));
        }
        if self.codes_differing > 0 {
            what.push_str(&format!(
                "; {} codes differ from the reference",
                self.codes_differing
            ));
        }
        if self.passed() {
            return write!(f, "PASSED ({what})");
        }
        let per_kind: Vec<String> = self
            .counts
            .iter()
            .map(|(k, n)| format!("{} {n}", k.name()))
            .collect();
        write!(
            f,
            "FAILED ({what}): {} violations [{}]",
            self.total_violations(),
            per_kind.join(", ")
        )?;
        let shown = self.sample(DISPLAYED);
        for v in &shown {
            write!(f, "\n  {v}")?;
        }
        let hidden = self.total_violations() - shown.len();
        if hidden > 0 {
            write!(f, "\n  ... and {hidden} more")?;
        }
        Ok(())
    }
}

/// Options of [`check_with`].
#[derive(Debug, Clone, Copy)]
pub struct PrefillCheckOptions {
    /// Spec rule or exact.
    pub mode: PrefillCheckMode,
    /// How many violations of each kind to keep in [`PrefillCheckReport::listed`] (all
    /// are counted).
    pub max_listed: usize,
}

impl Default for PrefillCheckOptions {
    fn default() -> Self {
        PrefillCheckOptions {
            mode: PrefillCheckMode::Spec,
            max_listed: DEFAULT_MAX_LISTED,
        }
    }
}

/// Check `candidate` by the spec's rule against `reference`
/// ([`super::reference::prefill`] of the same config and inputs).
pub fn check(
    cfg: &PrefillConfig,
    inputs: &PrefillInputs,
    reference: &RefPrefill,
    candidate: &PrefillOutput,
) -> PrefillCheckReport {
    check_with(
        cfg,
        inputs,
        reference,
        candidate,
        &PrefillCheckOptions::default(),
    )
}

/// [`check`] plus rule (c): codes, iteration counts and centroids equal to the
/// reference's (for well-separated inputs).
pub fn check_exact(
    cfg: &PrefillConfig,
    inputs: &PrefillInputs,
    reference: &RefPrefill,
    candidate: &PrefillOutput,
) -> PrefillCheckReport {
    check_with(
        cfg,
        inputs,
        reference,
        candidate,
        &PrefillCheckOptions {
            mode: PrefillCheckMode::Exact,
            ..PrefillCheckOptions::default()
        },
    )
}

/// What one (group, key chunk) item found.
#[derive(Default)]
struct ChunkResult {
    inertia: f64,
    energy: f64,
    violations: Vec<PrefillViolation>,
    counts: BTreeMap<PrefillViolationKind, usize>,
    differing: usize,
}

impl ChunkResult {
    /// Count a violation of `kind`; build its detail only while the list has room.
    fn push(
        &mut self,
        kind: PrefillViolationKind,
        max_listed: usize,
        make: impl FnOnce() -> PrefillViolation,
    ) {
        let c = self.counts.entry(kind).or_default();
        *c += 1;
        if *c <= max_listed {
            self.violations.push(make());
        }
    }
}

/// The general form of [`check`] / [`check_exact`].
pub fn check_with(
    cfg: &PrefillConfig,
    inputs: &PrefillInputs,
    reference: &RefPrefill,
    candidate: &PrefillOutput,
    opts: &PrefillCheckOptions,
) -> PrefillCheckReport {
    let sh = inputs.shape;
    let (n, k, dc) = (cfg.n(sh.s), cfg.k_centroids(), cfg.d_c(sh.d));
    let groups = cfg.groups(&sh);
    let exact = opts.mode == PrefillCheckMode::Exact;
    let ip = cfg.metric == Metric::Ip;
    let mut report = PrefillCheckReport {
        mode: opts.mode,
        groups,
        n,
        k,
        d_c: dc,
        listed: Vec::new(),
        counts: BTreeMap::new(),
        worst_inertia: None,
        worst_phi_rel: None,
        codes_differing: 0,
        max_listed: opts.max_listed,
    };
    let plain = |kind, detail: String| PrefillViolation {
        group: None,
        key: None,
        kind,
        detail,
    };
    let at = |gi: usize| Some((gi, cfg.group_coords(&sh, gi)));

    if let Err(e) = inputs.validate(cfg) {
        report.push(plain(PrefillViolationKind::Inputs, e.to_string()));
        return report;
    }
    // The reference must fit the inputs.
    let ref_ok = reference.n == n
        && reference.centroids.len() == groups * k * dc
        && reference.codes.len() == cfg.codes_len(&sh)
        && reference.inertia.len() == groups
        && reference.iterations.len() == groups
        && (!ip || reference.phi.as_ref().map(Vec::len) == Some(groups));
    if !ref_ok {
        report.push(plain(
            PrefillViolationKind::Inputs,
            format!(
                "the reference does not fit the inputs (n={}, {} centroids, {} codes, {} \
                 inertias, {} iteration counts; expected n={n}, {}, {}, {groups}, {groups})",
                reference.n,
                reference.centroids.len(),
                reference.codes.len(),
                reference.inertia.len(),
                reference.iterations.len(),
                groups * k * dc,
                cfg.codes_len(&sh)
            ),
        ));
        return report;
    }

    // Sizes.
    let mut shape_errors = Vec::new();
    for (what, got, want) in [
        ("n", candidate.n, n),
        (
            "centroids length",
            candidate.centroids.len(),
            groups * k * dc,
        ),
        ("codes length", candidate.codes.len(), cfg.codes_len(&sh)),
        ("iterations length", candidate.iterations.len(), groups),
    ] {
        if got != want {
            shape_errors.push(format!("{what}: expected {want}, got {got}"));
        }
    }
    if ip {
        match &candidate.phi {
            None => shape_errors.push(format!(
                "phi: expected {groups} values [B*H_kv*M] for metric ip, got none"
            )),
            Some(p) if p.len() != groups => shape_errors.push(format!(
                "phi length: expected {groups} [B*H_kv*M], got {}",
                p.len()
            )),
            Some(_) => {}
        }
    }
    if !shape_errors.is_empty() {
        for e in shape_errors {
            report.push(plain(PrefillViolationKind::Shape, e));
        }
        return report;
    }

    // Iteration counts.
    for gi in 0..groups {
        let (it, rit) = (candidate.iterations[gi], reference.iterations[gi]);
        if it == 0 || it as usize > cfg.kmeans_iter {
            report.push(PrefillViolation {
                group: at(gi),
                key: None,
                kind: PrefillViolationKind::Iterations,
                detail: format!("{it} iterations, expected 1..={}", cfg.kmeans_iter),
            });
        } else if exact && it != rit {
            report.push(PrefillViolation {
                group: at(gi),
                key: None,
                kind: PrefillViolationKind::Iterations,
                detail: format!("{it} iterations, the reference ran {rit}"),
            });
        }
    }

    // phi (d) and finiteness; groups with non-finite values skip (a) and (b).
    let mut usable = vec![true; groups];
    for (gi, ok) in usable.iter_mut().enumerate() {
        let cents = &candidate.centroids[gi * k * dc..(gi + 1) * k * dc];
        if let Some(i) = cents.iter().position(|c| !c.is_finite()) {
            *ok = false;
            report.push(PrefillViolation {
                group: at(gi),
                key: None,
                kind: PrefillViolationKind::Nonfinite,
                detail: format!("centroid {} coordinate {} is {}", i / dc, i % dc, cents[i]),
            });
        }
        if let (Some(p), Some(rp)) = (&candidate.phi, &reference.phi) {
            if !ip {
                continue;
            }
            let (c, r) = (p[gi], rp[gi]);
            if !c.is_finite() {
                *ok = false;
                report.push(PrefillViolation {
                    group: at(gi),
                    key: None,
                    kind: PrefillViolationKind::Nonfinite,
                    detail: format!("phi is {c}"),
                });
                continue;
            }
            let diff = (c as f64 - r as f64).abs();
            let rel = diff / (r as f64).abs().max(f32::MIN_POSITIVE as f64);
            report.worst_phi_rel = Some(report.worst_phi_rel.map_or(rel, |w: f64| w.max(rel)));
            if diff > PHI_TOL * (r as f64).abs() {
                report.push(PrefillViolation {
                    group: at(gi),
                    key: None,
                    kind: PrefillViolationKind::Phi,
                    detail: format!(
                        "phi {c} vs the reference's {r} (relative difference {rel:.2e} > \
                         {PHI_TOL:e})"
                    ),
                });
            }
        }
    }

    // (a), (b) inputs and the exact codes, per (group, key chunk).
    let cents64: Vec<f64> = candidate.centroids.iter().map(|&c| c as f64).collect();
    let chunks = n.div_ceil(CHECK_CHUNK);
    let mut results: Vec<ChunkResult> = (0..groups * chunks)
        .map(|_| ChunkResult::default())
        .collect();
    {
        let items: Vec<(usize, &mut ChunkResult)> = results
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| usable[i / chunks])
            .collect();
        let (cents64, max_listed) = (&cents64, opts.max_listed);
        let tol = CODE_TOL * (1.0 + dc as f64);
        par_items(items, |(item, out)| {
            let (gi, c) = (item / chunks, item % chunks);
            let (b, g, m) = cfg.group_coords(&sh, gi);
            let cents = &cents64[gi * k * dc..(gi + 1) * k * dc];
            let phi = candidate.phi.as_ref().filter(|_| ip).map(|p| p[gi]);
            let mut x = vec![0f64; dc];
            let screen = Screen::new(cents, dc);
            let mut scratch = screen.scratch();
            for j in c * CHECK_CHUNK..((c + 1) * CHECK_CHUNK).min(n) {
                augment(subvector(cfg, inputs, gi, j), phi, &mut x);
                out.energy += x.iter().map(|v| v * v).sum::<f64>();
                let best = screen.nearest(&x, &mut scratch);
                out.inertia += best.1;
                let idx = cfg.code_index(&sh, b, j, g, m);
                let code = candidate.codes[idx];
                let viol = |kind, detail| PrefillViolation {
                    group: Some((gi, (b, g, m))),
                    key: Some(j),
                    kind,
                    detail,
                };
                if code < 0 || code >= k as i64 {
                    out.push(PrefillViolationKind::CodeRange, max_listed, || {
                        viol(
                            PrefillViolationKind::CodeRange,
                            format!("code {code} outside 0..K = 0..{k}"),
                        )
                    });
                    continue;
                }
                let rc = reference.codes[idx];
                if code != rc {
                    out.differing += 1;
                    if exact {
                        out.push(PrefillViolationKind::ExactCodes, max_listed, || {
                            viol(
                                PrefillViolationKind::ExactCodes,
                                format!("code {code}, the reference's {rc}"),
                            )
                        });
                    }
                }
                let cu = code as usize;
                let d = dist2(&x, &cents[cu * dc..(cu + 1) * dc]);
                if d > best.1 + tol {
                    out.push(PrefillViolationKind::Argmin, max_listed, || {
                        viol(
                            PrefillViolationKind::Argmin,
                            format!(
                                "code {code} at squared distance {d:.6e}, but centroid {} is \
                                 at {:.6e} (difference {:.3e} > tolerance {tol:.3e})",
                                best.0,
                                best.1,
                                d - best.1
                            ),
                        )
                    });
                }
            }
        });
    }

    // Merge in (group, chunk) order; (b) per group.
    let mut inertia_violations = Vec::new();
    for gi in 0..groups {
        if !usable[gi] {
            continue;
        }
        let (mut inertia, mut energy) = (0f64, 0f64);
        for r in &mut results[gi * chunks..(gi + 1) * chunks] {
            inertia += r.inertia;
            energy += r.energy;
            report.codes_differing += r.differing;
            for (kind, cnt) in &r.counts {
                *report.counts.entry(*kind).or_default() += cnt;
            }
            for v in r.violations.drain(..) {
                report.list(v);
            }
        }
        let r = reference.inertia[gi];
        let scale = r.max(INERTIA_FLOOR * energy).max(f64::MIN_POSITIVE);
        let rel = (inertia - r) / scale;
        if report.worst_inertia.is_none_or(|w| rel.abs() > w.rel.abs()) {
            report.worst_inertia = Some(InertiaDiff {
                group: gi,
                reference: r,
                candidate: inertia,
                rel,
            });
        }
        if rel.abs() > INERTIA_TOL || rel.is_nan() {
            inertia_violations.push(PrefillViolation {
                group: at(gi),
                key: None,
                kind: PrefillViolationKind::Inertia,
                detail: format!(
                    "inertia {inertia:.9e} vs the reference's {r:.9e} (relative difference \
                     {rel:+.3e}, allowed {INERTIA_TOL:e})"
                ),
            });
        }
    }
    for v in inertia_violations {
        report.push(v);
    }

    // (c) centroids.
    if exact {
        for gi in 0..groups {
            let range = gi * k * dc..(gi + 1) * k * dc;
            let (cand, refc) = (
                &candidate.centroids[range.clone()],
                &reference.centroids[range],
            );
            let mut first = None;
            let mut count = 0usize;
            for (i, (&c, &r)) in cand.iter().zip(refc).enumerate() {
                let r = r as f32;
                if c != r {
                    count += 1;
                    first.get_or_insert((i, c, r));
                }
            }
            if let Some((i, c, r)) = first {
                // Count every differing value, list the group once.
                *report
                    .counts
                    .entry(PrefillViolationKind::ExactCentroids)
                    .or_default() += count - 1;
                report.push(PrefillViolation {
                    group: at(gi),
                    key: None,
                    kind: PrefillViolationKind::ExactCentroids,
                    detail: format!(
                        "{count} centroid values differ; first: centroid {} coordinate {}: \
                         {c:e} vs the reference's {r:e}",
                        i / dc,
                        i % dc
                    ),
                });
            }
        }
    }
    report
}
