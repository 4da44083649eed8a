//! The spec's "what counts as the same answer" rule: judge a candidate step output (from
//! the GPU pipeline, `reference.py`, or anything else) against the inputs it was computed
//! from.
//!
//! A candidate passes ([`CheckMode::Spec`]) when, for every row `(b, h)`:
//! - the sink part `0..sink'` and the window part `S - window' .. S` are present exactly;
//! - `sparse_len == total`, the row is sorted ascending, and `weight_list` is 1 exactly at
//!   the row's positions and 0 elsewhere;
//! - the heavy part (the row minus the sink and window parts) has `k` distinct quantized
//!   keys; when there are at most `k` candidates it is exactly `j in 0..k` (all
//!   candidates, then the lowest masked `j`); otherwise every chosen `j` is a candidate
//!   (`j < w0`) and, with scores recomputed in f64 from the candidate's own returned
//!   codes, `min(chosen) >= max(unchosen) - 1e-4 * (1 + |max(unchosen)|)` (checking the
//!   worst pair checks every pair, since `u - 1e-4 (1 + |u|)` grows with `u`);
//! - the returned codes keep the old codes exactly and give each new key the reference's
//!   code, or another code whose f64 distance is within a relative 1e-5 of the minimum.
//!   Why the slack: a GPU computes distances in fp32 (possibly as `|x|^2 - 2 x.c + |c|^2`),
//!   so two centroids whose distances differ by less than fp32 rounding of the terms can
//!   swap places; "relative" is to the magnitude the distance is computed from,
//!   `max(d_ref, d_cand, |x|^2 + |c|^2)` (augmented vectors under ip).
//!
//! [`CheckMode::Exact`] also requires each row's heavy set to equal the reference's (for
//! well-separated inputs such as [`super::PqInputs::small_integer`]), the reference run on
//! the candidate's own codes where it took another code at a near-tie (its heavy set
//! follows the codes it scores with: under metric ip, or new keys halfway between two
//! centroids, a new key's code may differ without error).

use std::collections::BTreeMap;
use std::fmt;

use super::config::PqConfig;
use super::par_items;
use super::reference::{
    fixed_positions, key_code_distance, multiset_difference, scores, step, updated_codes, PqOutput,
};
use super::workload::PqInputs;

/// Relative tolerance on heavy-set scores: `1e-4 * (1 + |score|)` (spec).
pub const SCORE_TOL: f64 = 1e-4;
/// Relative tolerance on new-key quantization distances (near-ties in the argmin).
pub const CODE_TOL: f64 = 1e-5;
/// Violations listed in a report by default (all are counted).
pub const DEFAULT_MAX_LISTED: usize = 12;

/// How strict the heavy-set comparison is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckMode {
    /// The spec's rule: heavy scores within tolerance of the best unchosen candidate.
    Spec,
    /// The spec's rule plus heavy sets identical to the CPU reference's.
    Exact,
}

/// What a violation is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ViolationKind {
    /// The inputs or config are invalid: nothing could be checked.
    Inputs,
    /// The candidate's sizes (`b`, `h`, `s`, `total`, vector lengths) are wrong.
    Shape,
    /// `sparse_len[b, h] != total`.
    SparseLen,
    /// A position outside `0..S`.
    Range,
    /// The row is not sorted ascending.
    SortOrder,
    /// Short path: the row is not `0..S`.
    ShortPath,
    /// A sink position `0..sink'` is missing.
    Sink,
    /// A window position `S - window' .. S` is missing.
    Window,
    /// Wrong number of heavy positions, a duplicate, or a position that is no quantized
    /// key.
    HeavyCount,
    /// A heavy member is masked (`j >= w0`) while there were more than `k` candidates.
    HeavyMasked,
    /// At most `k` candidates, but the heavy set is not `0..k`.
    HeavyFill,
    /// An unchosen candidate scores more than a chosen one, beyond the tolerance.
    HeavyScore,
    /// Exact mode: the heavy set differs from the reference's.
    HeavyExact,
    /// `weight_list` disagrees with `sparse_list`.
    WeightList,
    /// Returned codes: wrong count, out of range, old codes changed, or a new key's code
    /// is not (near-)optimal.
    Codes,
}

impl ViolationKind {
    /// Short name used in reports.
    pub fn name(self) -> &'static str {
        match self {
            ViolationKind::Inputs => "inputs",
            ViolationKind::Shape => "shape",
            ViolationKind::SparseLen => "sparse_len",
            ViolationKind::Range => "range",
            ViolationKind::SortOrder => "sort-order",
            ViolationKind::ShortPath => "short-path",
            ViolationKind::Sink => "sink",
            ViolationKind::Window => "window",
            ViolationKind::HeavyCount => "heavy-count",
            ViolationKind::HeavyMasked => "heavy-masked",
            ViolationKind::HeavyFill => "heavy-fill",
            ViolationKind::HeavyScore => "heavy-score",
            ViolationKind::HeavyExact => "heavy-exact",
            ViolationKind::WeightList => "weight_list",
            ViolationKind::Codes => "codes",
        }
    }
}

/// One violation: where (row `b, h` when it belongs to a row) and what.
#[derive(Debug, Clone, PartialEq)]
pub struct Violation {
    /// Batch index of the row, if any.
    pub b: Option<usize>,
    /// Query head of the row (or KV head for codes), if any.
    pub h: Option<usize>,
    /// The rule broken.
    pub kind: ViolationKind,
    /// Human-readable detail with the values involved.
    pub detail: String,
}

impl Violation {
    /// A violation not tied to a row: the inputs themselves are invalid.
    fn inputs(e: impl fmt::Display) -> Self {
        Violation {
            b: None,
            h: None,
            kind: ViolationKind::Inputs,
            detail: e.to_string(),
        }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.b, self.h) {
            (Some(b), Some(h)) => write!(f, "row b={b} h={h}: ")?,
            (Some(b), None) => write!(f, "b={b}: ")?,
            _ => {}
        }
        write!(f, "{}: {}", self.kind.name(), self.detail)
    }
}

/// The verdict of a check: every violation counted, the first few listed.
#[derive(Debug, Clone)]
pub struct CheckReport {
    /// The mode checked.
    pub mode: CheckMode,
    /// Rows `(b, h)` examined.
    pub rows: usize,
    /// The first `max_listed` violations in row order.
    pub listed: Vec<Violation>,
    /// Number of violations per kind.
    pub counts: BTreeMap<ViolationKind, usize>,
    /// New-key codes that differ from the reference but were accepted as near-ties.
    pub near_tie_codes: usize,
    /// Smallest `min(chosen) - max(unchosen)` score gap over the rows with more
    /// candidates than `k` (negative: a tolerated near-tie); None if no such row.
    pub min_heavy_gap: Option<f64>,
}

impl CheckReport {
    fn new(mode: CheckMode) -> Self {
        CheckReport {
            mode,
            rows: 0,
            listed: Vec::new(),
            counts: BTreeMap::new(),
            near_tie_codes: 0,
            min_heavy_gap: None,
        }
    }

    fn push(&mut self, v: Violation, max_listed: usize) {
        *self.counts.entry(v.kind).or_default() += 1;
        if self.listed.len() < max_listed {
            self.listed.push(v);
        }
    }

    /// An empty report in `opts`' mode.
    pub(crate) fn new_for(opts: &CheckOptions<'_>) -> Self {
        Self::new(opts.mode)
    }

    /// Count `v` (and list it while fewer than `opts.max_listed` are).
    pub(crate) fn add(&mut self, v: Violation, opts: &CheckOptions<'_>) {
        self.push(v, opts.max_listed);
    }

    /// Fold in the report of batch entry `b` checked as a batch of one: its counts,
    /// rows, near-tie codes and gap, and its listed violations renamed to row `b`.
    pub(crate) fn absorb(&mut self, other: CheckReport, b: usize, opts: &CheckOptions<'_>) {
        self.rows += other.rows;
        self.near_tie_codes += other.near_tie_codes;
        if let Some(g) = other.min_heavy_gap {
            self.min_heavy_gap = Some(self.min_heavy_gap.map_or(g, |m| m.min(g)));
        }
        for (k, c) in other.counts {
            *self.counts.entry(k).or_default() += c;
        }
        for mut v in other.listed {
            if self.listed.len() >= opts.max_listed {
                break;
            }
            v.b = Some(b);
            self.listed.push(v);
        }
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
    pub fn count(&self, kind: ViolationKind) -> usize {
        self.counts.get(&kind).copied().unwrap_or(0)
    }
}

impl fmt::Display for CheckReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mode = match self.mode {
            CheckMode::Spec => "spec rule",
            CheckMode::Exact => "exact heavy sets",
        };
        let mut extra = Vec::new();
        if let Some(g) = self.min_heavy_gap {
            extra.push(format!("min heavy score gap {g:.3e}"));
        }
        if self.near_tie_codes > 0 {
            extra.push(format!("{} near-tie codes accepted", self.near_tie_codes));
        }
        let extra = if extra.is_empty() {
            String::new()
        } else {
            format!("; {}", extra.join("; "))
        };
        if self.passed() {
            return write!(f, "PASSED ({mode}, {} rows{extra})", self.rows);
        }
        let per_kind: Vec<String> = self
            .counts
            .iter()
            .map(|(k, n)| format!("{} {n}", k.name()))
            .collect();
        write!(
            f,
            "FAILED ({mode}, {} rows{extra}): {} violations [{}]",
            self.rows,
            self.total_violations(),
            per_kind.join(", ")
        )?;
        for v in &self.listed {
            write!(f, "\n  {v}")?;
        }
        let hidden = self.total_violations() - self.listed.len();
        if hidden > 0 {
            write!(f, "\n  ... and {hidden} more")?;
        }
        Ok(())
    }
}

/// Options of [`check_with`].
#[derive(Debug, Clone, Copy)]
pub struct CheckOptions<'a> {
    /// Spec rule or exact heavy sets.
    pub mode: CheckMode,
    /// How many violations to list (all are counted).
    pub max_listed: usize,
    /// The CPU reference's output for these inputs, if already computed (exact mode
    /// computes it otherwise; spec mode does not need it).
    pub reference: Option<&'a PqOutput>,
}

impl Default for CheckOptions<'_> {
    fn default() -> Self {
        CheckOptions {
            mode: CheckMode::Spec,
            max_listed: DEFAULT_MAX_LISTED,
            reference: None,
        }
    }
}

/// Check `candidate` against the spec's rule, given the inputs as they were before the
/// step. Invalid inputs are reported as an [`ViolationKind::Inputs`] violation.
pub fn check(cfg: &PqConfig, inputs: &PqInputs, candidate: &PqOutput) -> CheckReport {
    check_with(cfg, inputs, candidate, &CheckOptions::default())
}

/// [`check`] plus identical heavy sets to the CPU reference (computes the reference).
pub fn check_exact(cfg: &PqConfig, inputs: &PqInputs, candidate: &PqOutput) -> CheckReport {
    check_with(
        cfg,
        inputs,
        candidate,
        &CheckOptions {
            mode: CheckMode::Exact,
            ..CheckOptions::default()
        },
    )
}

/// Per-row findings, merged in row order.
struct RowResult {
    violations: Vec<Violation>,
    gap: Option<f64>,
}

/// The general form of [`check`] / [`check_exact`].
pub fn check_with(
    cfg: &PqConfig,
    inputs: &PqInputs,
    candidate: &PqOutput,
    opts: &CheckOptions<'_>,
) -> CheckReport {
    let mut report = CheckReport::new(opts.mode);
    let max_listed = opts.max_listed;
    if let Err(e) = inputs.validate(cfg) {
        report.push(Violation::inputs(e), max_listed);
        return report;
    }
    let sh = inputs.shape;
    let (bb, hh, s) = (sh.b, sh.h, sh.s);
    let total = cfg.total(s);
    let long = !cfg.is_short(s);

    // Sizes first: rows cannot be read from a mis-sized candidate.
    let mut shape_errors = Vec::new();
    for (what, got, want) in [
        ("b", candidate.b, bb),
        ("h", candidate.h, hh),
        ("s", candidate.s, s),
        ("total", candidate.total, total),
        (
            "sparse_list length",
            candidate.sparse_list.len(),
            bb * hh * total,
        ),
        ("sparse_len length", candidate.sparse_len.len(), bb * hh),
        (
            "weight_list length",
            candidate.weight_list.len(),
            bb * hh * s,
        ),
    ] {
        if got != want {
            shape_errors.push(format!("{what}: expected {want}, got {got}"));
        }
    }
    if !shape_errors.is_empty() {
        for detail in shape_errors {
            report.push(
                Violation {
                    b: None,
                    h: None,
                    kind: ViolationKind::Shape,
                    detail,
                },
                max_listed,
            );
        }
        return report;
    }

    // Codes: the reference's, then the candidate's compared with them.
    let (ref_codes, n) = match updated_codes(cfg, inputs) {
        Ok(x) => x,
        Err(e) => {
            report.push(Violation::inputs(e), max_listed);
            return report;
        }
    };
    let codes_usable = check_codes(
        cfg,
        inputs,
        candidate,
        &ref_codes,
        n,
        &mut report,
        max_listed,
    );
    let score_codes: &[i64] = if codes_usable {
        &candidate.codes
    } else {
        &ref_codes
    };

    // Exact mode needs the reference's heavy sets, on the codes the scores come from:
    // where the candidate quantized a new key to another code at a near-tie (accepted
    // above), the heavy sets follow its codes, so the reference runs again on them (its
    // own step, or the one given, would score that key by another code).
    let computed_ref;
    let codes_differ = codes_usable && report.near_tie_codes > 0;
    let reference = match (opts.mode, opts.reference) {
        (CheckMode::Exact, r) if long && (r.is_none() || codes_differ) => {
            let on_codes;
            let base = if codes_differ {
                on_codes = PqInputs {
                    codes: candidate.codes.clone(),
                    n_cached: n,
                    ..inputs.clone()
                };
                &on_codes
            } else {
                inputs
            };
            match step(cfg, base) {
                Ok(r) => {
                    computed_ref = r;
                    Some(&computed_ref)
                }
                Err(e) => {
                    report.push(Violation::inputs(e), max_listed);
                    return report;
                }
            }
        }
        (CheckMode::Exact, r) => r,
        (CheckMode::Spec, _) => None,
    };

    // Rows, in parallel; results merged in row order.
    let mut results: Vec<Option<RowResult>> = (0..bb * hh).map(|_| None).collect();
    let items: Vec<(usize, &mut Option<RowResult>)> = results.iter_mut().enumerate().collect();
    par_items(items, |(r, slot)| {
        let (b, h) = (r / hh, r % hh);
        *slot = Some(check_row(
            cfg,
            inputs,
            candidate,
            score_codes,
            n,
            reference,
            b,
            h,
        ));
    });
    report.rows = bb * hh;
    for r in results.into_iter().flatten() {
        for v in r.violations {
            report.push(v, max_listed);
        }
        if let Some(g) = r.gap {
            report.min_heavy_gap = Some(report.min_heavy_gap.map_or(g, |m: f64| m.min(g)));
        }
    }
    report
}

/// Check the candidate's codes; returns whether they can be used for scoring (right
/// count, all in range).
fn check_codes(
    cfg: &PqConfig,
    inputs: &PqInputs,
    cand: &PqOutput,
    ref_codes: &[i64],
    n: usize,
    report: &mut CheckReport,
    max_listed: usize,
) -> bool {
    let sh = inputs.shape;
    let (hkv, mm, k) = (sh.h_kv, cfg.pq_group_factor, cfg.k_centroids() as i64);
    let bad = |b: Option<usize>, g: Option<usize>, detail: String, report: &mut CheckReport| {
        report.push(
            Violation {
                b,
                h: g,
                kind: ViolationKind::Codes,
                detail,
            },
            max_listed,
        )
    };
    if cand.n_cached != n
        || cand.codes.len() != sh.b * n * hkv * mm
        || cand.h_kv != hkv
        || cand.m != mm
    {
        bad(
            None,
            None,
            format!(
                "expected {} codes [B={}, N={n}, H_kv={hkv}, M={mm}], got {} codes with \
                 n_cached={} h_kv={} m={}",
                sh.b * n * hkv * mm,
                sh.b,
                cand.codes.len(),
                cand.n_cached,
                cand.h_kv,
                cand.m
            ),
            report,
        );
        return false;
    }
    let mut usable = true;
    let n_old = inputs.n_cached;
    for b in 0..sh.b {
        for j in 0..n {
            for g in 0..hkv {
                for m in 0..mm {
                    let i = ((b * n + j) * hkv + g) * mm + m;
                    let (got, want) = (cand.codes[i], ref_codes[i]);
                    if got == want {
                        continue;
                    }
                    if !(0..k).contains(&got) {
                        usable = false;
                        bad(
                            Some(b),
                            Some(g),
                            format!("code of j={j} m={m} is {got}, outside 0..{k}"),
                            report,
                        );
                    } else if j < n_old {
                        bad(
                            Some(b),
                            Some(g),
                            format!("cached code of j={j} m={m} changed from {want} to {got}"),
                            report,
                        );
                    } else {
                        let pos = cfg.init_offset + j;
                        let dr = key_code_distance(cfg, inputs, b, g, pos, m, want as usize);
                        let dc = key_code_distance(cfg, inputs, b, g, pos, m, got as usize);
                        let scale =
                            magnitude(cfg, inputs, b, g, pos, m, want as usize, got as usize)
                                .max(dr)
                                .max(dc);
                        if dc - dr <= CODE_TOL * scale {
                            report.near_tie_codes += 1;
                        } else {
                            bad(
                                Some(b),
                                Some(g),
                                format!(
                                    "new key j={j} (position {pos}) m={m}: code {got} at \
                                     distance {dc:.6e}, the reference's code {want} at \
                                     {dr:.6e} (beyond relative {CODE_TOL:e} of {scale:.3e})"
                                ),
                                report,
                            );
                        }
                    }
                }
            }
        }
    }
    usable
}

/// `|x|^2 + max(|c_a|^2, |c_b|^2)` in f64 for the (augmented, under ip) key subvector and
/// two centroids: the size of the terms a distance is computed from.
#[allow(clippy::too_many_arguments)]
fn magnitude(
    cfg: &PqConfig,
    inputs: &PqInputs,
    b: usize,
    g: usize,
    pos: usize,
    m: usize,
    ca: usize,
    cb: usize,
) -> f64 {
    let d = inputs.shape.d;
    let (ds, dc) = (cfg.d_sub(d), cfg.d_c(d));
    let x = &inputs.key[inputs.key_offset(b, g, pos) + m * ds..][..ds];
    let xn: f64 = x.iter().map(|&v| v as f64 * v as f64).sum();
    // Under ip the augmented |x|^2 is max(phi, |x|^2).
    let xn = match (&inputs.phi, cfg.metric) {
        (Some(p), super::Metric::Ip) => {
            xn.max(p[(b * inputs.shape.h_kv + g) * cfg.pq_group_factor + m] as f64)
        }
        _ => xn,
    };
    let cn = |c: usize| -> f64 {
        let off = inputs.centroid_offset(cfg, b, g, m) + c * dc;
        inputs.centroids[off..off + dc]
            .iter()
            .map(|&v| v as f64 * v as f64)
            .sum()
    };
    xn + cn(ca).max(cn(cb))
}

/// Check one row `(b, h)`.
#[allow(clippy::too_many_arguments)]
fn check_row(
    cfg: &PqConfig,
    inputs: &PqInputs,
    cand: &PqOutput,
    codes: &[i64],
    n: usize,
    reference: Option<&PqOutput>,
    b: usize,
    h: usize,
) -> RowResult {
    let s = inputs.shape.s;
    let total = cand.total;
    let mut out = RowResult {
        violations: Vec::new(),
        gap: None,
    };
    let push = |kind: ViolationKind, detail: String, out: &mut RowResult| {
        out.violations.push(Violation {
            b: Some(b),
            h: Some(h),
            kind,
            detail,
        })
    };
    let len = cand.sparse_len[b * cand.h + h];
    if len != total as i64 {
        push(
            ViolationKind::SparseLen,
            format!("expected {total}, got {len}"),
            &mut out,
        );
    }
    let row = cand.row(b, h);
    if let Some((i, &p)) = row
        .iter()
        .enumerate()
        .find(|&(_, &p)| p < 0 || p >= s as i64)
    {
        let n_bad = row.iter().filter(|&&p| p < 0 || p >= s as i64).count();
        push(
            ViolationKind::Range,
            format!("{n_bad} positions outside 0..{s}, first {p} at index {i}"),
            &mut out,
        );
    }
    if let Some(i) = row.windows(2).position(|w| w[0] > w[1]) {
        push(
            ViolationKind::SortOrder,
            format!("not ascending at index {i}: {} then {}", row[i], row[i + 1]),
            &mut out,
        );
    }
    let mut sorted = row.to_vec();
    sorted.sort_unstable();

    // weight_list must be 1 exactly at the row's positions.
    let mut member = vec![false; s];
    for &p in &sorted {
        if (0..s as i64).contains(&p) {
            member[p as usize] = true;
        }
    }
    let wrow = cand.weight_row(b, h);
    let mut wrong = wrow
        .iter()
        .zip(&member)
        .enumerate()
        .filter(|(_, (&w, &m))| w != if m { 1.0 } else { 0.0 });
    if let Some((p, (&w, &m))) = wrong.next() {
        let more = wrong.count();
        push(
            ViolationKind::WeightList,
            format!(
                "{} positions disagree with sparse_list, first p={p}: weight {w}, expected {} \
                 ({})",
                more + 1,
                if m { 1 } else { 0 },
                if m {
                    "in sparse_list"
                } else {
                    "not in sparse_list"
                }
            ),
            &mut out,
        );
    }

    if cfg.is_short(s) {
        if sorted.iter().enumerate().any(|(i, &p)| p != i as i64) {
            let (extra, missing) = multiset_difference(&sorted, &(0..s as i64).collect::<Vec<_>>());
            push(
                ViolationKind::ShortPath,
                format!(
                    "short path (S = {s} <= {}) must list 0..{s}; missing {}, extra {}",
                    cfg.short_threshold(s),
                    preview(&missing),
                    preview(&extra)
                ),
                &mut out,
            );
        }
        return out;
    }

    let sink = cfg.sink_eff(s);
    let (heavy, missing) = multiset_difference(&sorted, &fixed_positions(cfg, s));
    let (miss_sink, miss_win): (Vec<i64>, Vec<i64>) =
        missing.iter().partition(|&&p| p < sink as i64);
    if !miss_sink.is_empty() {
        push(
            ViolationKind::Sink,
            format!("sink positions missing: {}", preview(&miss_sink)),
            &mut out,
        );
    }
    if !miss_win.is_empty() {
        push(
            ViolationKind::Window,
            format!("window positions missing: {}", preview(&miss_win)),
            &mut out,
        );
    }

    let k = cfg.heavy_k(s);
    let w0 = cfg.window_start(s).min(n);
    let io = cfg.init_offset as i64;
    if heavy.len() != k {
        push(
            ViolationKind::HeavyCount,
            format!(
                "expected {k} heavy positions besides sink and window, got {}: {}",
                heavy.len(),
                preview(&heavy)
            ),
            &mut out,
        );
    }
    if let Some(w) = heavy.windows(2).find(|w| w[0] == w[1]) {
        push(
            ViolationKind::HeavyCount,
            format!("heavy position {} chosen twice", w[0]),
            &mut out,
        );
    }
    let not_keys: Vec<i64> = heavy
        .iter()
        .copied()
        .filter(|&p| p < io || p - io >= n as i64)
        .collect();
    if !not_keys.is_empty() {
        push(
            ViolationKind::HeavyCount,
            format!(
                "heavy positions that are no quantized key (not in {io}..{}): {}",
                io + n as i64,
                preview(&not_keys)
            ),
            &mut out,
        );
    }
    let mut js: Vec<usize> = heavy
        .iter()
        .filter(|&&p| p >= io && p - io < n as i64)
        .map(|&p| (p - io) as usize)
        .collect();
    js.dedup();

    if w0 <= k {
        // All candidates, then the lowest masked j: exactly 0..k.
        let want: Vec<i64> = (0..k as i64).collect();
        let got: Vec<i64> = js.iter().map(|&j| j as i64).collect();
        if got != want {
            let (extra, missing) = multiset_difference(&got, &want);
            push(
                ViolationKind::HeavyFill,
                format!(
                    "only {w0} candidates for k = {k}: heavy j must be 0..{k}; missing j {}, \
                     extra j {}",
                    preview(&missing),
                    preview(&extra)
                ),
                &mut out,
            );
        }
    } else {
        let masked: Vec<i64> = js.iter().filter(|&&j| j >= w0).map(|&j| j as i64).collect();
        if !masked.is_empty() {
            push(
                ViolationKind::HeavyMasked,
                format!(
                    "heavy j in the masked window (j >= w0 = {w0}) although {w0} > k = {k} \
                     candidates exist: {}",
                    preview(&masked)
                ),
                &mut out,
            );
        }
        let sc = scores(cfg, inputs, codes, n, b, h, w0);
        let mut chosen = vec![false; w0];
        for &j in js.iter().filter(|&&j| j < w0) {
            chosen[j] = true;
        }
        // The spec's order ("Non-finite inputs"): a NaN ranks below every other score,
        // and among NaNs the lowest j wins. `min_c` is the chosen key that ranks lowest
        // (the highest j among NaNs), `max_u` the unchosen one that ranks highest (the
        // lowest j among NaNs).
        let below = |a: (usize, f64), b: (usize, f64)| match (a.1.is_nan(), b.1.is_nan()) {
            (true, true) => a.0 > b.0,
            (true, false) => true,
            (false, true) => false,
            (false, false) => a.1 < b.1,
        };
        let mut min_c: Option<(usize, f64)> = None;
        let mut max_u: Option<(usize, f64)> = None;
        for (j, &v) in sc.iter().enumerate() {
            if chosen[j] {
                if min_c.is_none_or(|m| below((j, v), m)) {
                    min_c = Some((j, v));
                }
            } else if max_u.is_none_or(|m| below(m, (j, v))) {
                max_u = Some((j, v));
            }
        }
        if let (Some((jc, c)), Some((ju, u))) = (min_c, max_u) {
            out.gap = (c.is_finite() && u.is_finite()).then_some(c - u);
            let tol = SCORE_TOL * (1.0 + u.abs());
            // Equal scores (infinities included) pass; a chosen NaN passes only below
            // an unchosen NaN of higher j; finite scores by the tolerance.
            let ok = if c.is_nan() || u.is_nan() {
                !below((jc, c), (ju, u))
            } else {
                c >= u || (u.is_finite() && c >= u - tol)
            };
            if !ok {
                push(
                    ViolationKind::HeavyScore,
                    format!(
                        "chosen j={jc} (position {}) scores {c:.9e} < unchosen candidate \
                         j={ju} (position {}) at {u:.9e} minus tolerance {tol:.3e}",
                        jc as i64 + io,
                        ju as i64 + io
                    ),
                    &mut out,
                );
            }
        }
        if let Some(r) = reference {
            let want = r.heavy_positions(cfg, b, h);
            if want != heavy {
                let (extra, missing) = multiset_difference(&heavy, &want);
                push(
                    ViolationKind::HeavyExact,
                    format!(
                        "heavy set differs from the reference: missing positions {}, extra {}",
                        preview(&missing),
                        preview(&extra)
                    ),
                    &mut out,
                );
            }
        }
    }
    out
}

/// The first few values of a list, with a count.
fn preview(v: &[i64]) -> String {
    const SHOW: usize = 6;
    if v.is_empty() {
        return "none".into();
    }
    let head: Vec<String> = v.iter().take(SHOW).map(|x| x.to_string()).collect();
    if v.len() > SHOW {
        format!("[{}, ...] ({} in all)", head.join(", "), v.len())
    } else {
        format!("[{}]", head.join(", "))
    }
}
