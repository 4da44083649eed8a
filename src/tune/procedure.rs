//! The tuning procedure, generic over a timing backend ([`TuneTarget`]).
//!
//! For one kernel and one shape bucket:
//!
//! 1. **Oracle.** The default variant runs on the check input sets (the first and the
//!    last input set); its outputs are the oracle. It runs twice per set and must agree
//!    with itself, which also proves the backend's comparison works. If the default
//!    cannot run, nothing is tuned ([`Error::TuneDefaultFailed`]).
//! 2. **Check.** Every other candidate runs on the same sets and is compared with the
//!    default's output. One that fails to launch, cannot be checked, or differs is
//!    excluded with its reason, and never timed or chosen.
//! 3. **Time.** The default and every valid candidate are timed in `rounds` interleaved
//!    rounds (the order rotates each round, so clock and thermal drift hit all
//!    candidates alike). Each call warms up, then returns samples; a sample is the mean
//!    time of one launch over `launches_per_sample` back-to-back launches rotating over
//!    input sets larger than L2 together, so every launch reads cold memory, as in a
//!    decode step.
//! 4. **Choose.** The winner is the valid candidate with the lowest median. A
//!    non-default winner must beat the default's median by at least
//!    [`TuneSettings::min_speedup`]; otherwise the default stays (re-tuning on a noisy
//!    machine should not flip winners for nothing).

use std::collections::HashMap;
use std::fmt::Write as _;

#[cfg(feature = "cli")]
use indicatif::{ProgressBar, ProgressStyle};

use super::bucket::ShapeBucket;
use super::candidate::{Candidate, CandidateSet};
use super::table::{CandidateTiming, DeviceKey, Exclusion, ExclusionReason, TuningEntry};
use crate::error::{Error, Result};

/// Most input sets [`input_sets_for`] asks for.
pub const MAX_INPUT_SETS: usize = 64;

/// Knobs of the tuning procedure.
#[derive(Debug, Clone, PartialEq)]
pub struct TuneSettings {
    /// Launches before each timing call, not measured (caches, clocks, lazy loading).
    pub warmup: usize,
    /// Samples per candidate in total, split over `rounds`. At least 1.
    pub repeats: usize,
    /// Launches per sample (one timer pair around them). At least 1.
    pub launches_per_sample: usize,
    /// Interleaved timing rounds (clamped to `repeats`). At least 1.
    pub rounds: usize,
    /// Relative margin a non-default winner must beat the default's median by
    /// (0.01 = 1 %). In `0.0..1.0`.
    pub min_speedup: f64,
    /// Draw a progress bar on stderr (hidden anyway when stderr is not a terminal).
    pub progress: bool,
    /// Upper bound on the timed launches of one candidate, in seconds of GPU time
    /// estimated from the default's first samples: `repeats` shrinks (to no fewer than
    /// `rounds` samples) so that slow kernels on large workloads finish in bounded time.
    /// 0 disables the bound.
    pub budget_s_per_candidate: f64,
}

impl Default for TuneSettings {
    /// warm-up 10, 100 samples of 10 launches in 4 rounds, 1 % margin, progress bar.
    fn default() -> Self {
        TuneSettings {
            warmup: 10,
            repeats: 100,
            launches_per_sample: 10,
            rounds: 4,
            min_speedup: 0.01,
            progress: true,
            budget_s_per_candidate: 0.5,
        }
    }
}

impl TuneSettings {
    /// Check the ranges documented on the fields.
    ///
    /// # Errors
    ///
    /// [`Error::Invalid`] naming the setting and its accepted range.
    pub fn validate(&self) -> Result<()> {
        if self.repeats == 0 {
            return Err(Error::invalid(
                "repeats",
                "expected at least 1 sample, got 0",
            ));
        }
        if self.launches_per_sample == 0 {
            return Err(Error::invalid(
                "launches per sample",
                "expected at least 1, got 0",
            ));
        }
        if self.rounds == 0 {
            return Err(Error::invalid("rounds", "expected at least 1, got 0"));
        }
        if !(0.0..1.0).contains(&self.min_speedup) {
            return Err(Error::invalid(
                "min_speedup",
                format!("expected a fraction in [0, 1), got {}", self.min_speedup),
            ));
        }
        Ok(())
    }
}

/// What one [`TuneTarget::time`] call must measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimingPlan {
    /// Unmeasured launches first.
    pub warmup: usize,
    /// Samples to return.
    pub samples: usize,
    /// Launches per sample; a sample is their mean time per launch.
    pub launches_per_sample: usize,
    /// Input sets to rotate over ([`TuneTarget::input_sets`]).
    pub input_sets: usize,
}

/// The result of comparing a candidate's output with the default's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutputCheck {
    /// Same output (exactly, or within the target's tolerance for float outputs).
    Matches,
    /// Different output; the text says where and by how much.
    Differs(String),
}

/// A timing backend for one kernel and one shape bucket: the GPU implementation loads
/// variants through the runtime and times them with CUDA events; tests use a CPU dummy.
///
/// Errors are strings because they are recorded in the table as the exclusion's
/// detail; they should name what failed (driver error, resource limit).
pub trait TuneTarget {
    /// The competing variants (exactly one default).
    fn candidates(&self) -> &CandidateSet;

    /// The bucket the measurements stand for. The target's shape must have the
    /// bucket's properties, in particular its `n_align`: when timing an `n` whose
    /// alignment is larger than the bucket's (a decode bucket has alignment 1), the
    /// target must also run its check on an `n` with exactly the bucket's alignment (e.g.
    /// `n + 1`), so that a variant valid only for aligned `n` fails the check.
    fn bucket(&self) -> &ShapeBucket;

    /// Free-text description of the workload (recorded in the entry).
    fn workload(&self) -> String {
        String::new()
    }

    /// Free-text description of the timer (recorded in the entry), e.g. `CUDA events`.
    fn timer(&self) -> String {
        String::new()
    }

    /// Number of distinct input sets the target rotates over when timing, chosen so that
    /// together they exceed the L2 cache ([`input_sets_for`]). At least 1.
    fn input_sets(&self) -> usize;

    /// Run candidate `c` once on input set `input_set` and wait for it to finish,
    /// poisoning the output buffers first (NaN / out-of-range indices) so a variant
    /// that writes nothing cannot pass. The first run of the default variant on a set
    /// records that output as the oracle for the set.
    ///
    /// # Errors
    ///
    /// Load, JIT or launch failures, with the driver's message.
    fn run(&mut self, c: &Candidate, input_set: usize) -> Result<(), String>;

    /// Compare the output of the latest [`TuneTarget::run`] of `c` on `input_set` with
    /// the default variant's oracle for that set (integers exactly, floats within a
    /// tolerance that different summation orders need).
    ///
    /// # Errors
    ///
    /// When the output cannot be read back or compared.
    fn output_matches_default(
        &mut self,
        c: &Candidate,
        input_set: usize,
    ) -> Result<OutputCheck, String>;

    /// Time candidate `c` as `plan` says: `plan.warmup` launches, then `plan.samples`
    /// samples, each the mean time per launch (microseconds) of
    /// `plan.launches_per_sample` launches rotating over the input sets. Returns exactly
    /// `plan.samples` finite non-negative values.
    ///
    /// # Errors
    ///
    /// Launch or timer failures.
    fn time(&mut self, c: &Candidate, plan: &TimingPlan) -> Result<Vec<f64>, String>;
}

/// Summary statistics of timing samples (microseconds).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TimingStats {
    /// Median (mean of the two middle samples when the count is even).
    pub median_us: f64,
    /// Smallest sample.
    pub min_us: f64,
    /// Largest sample.
    pub max_us: f64,
    /// Number of samples.
    pub count: usize,
}

impl TimingStats {
    /// Statistics of `samples`; `None` when it is empty or holds a non-finite or
    /// negative value.
    pub fn from_samples(samples: &[f64]) -> Option<Self> {
        if samples.is_empty() || samples.iter().any(|v| !v.is_finite() || *v < 0.0) {
            return None;
        }
        let mut s = samples.to_vec();
        s.sort_by(f64::total_cmp);
        let n = s.len();
        let median = if n % 2 == 1 {
            s[n / 2]
        } else {
            (s[n / 2 - 1] + s[n / 2]) / 2.0
        };
        Some(TimingStats {
            median_us: median,
            min_us: s[0],
            max_us: s[n - 1],
            count: n,
        })
    }
}

/// How many input sets of `bytes_per_set` bytes (everything one launch reads and
/// writes) are needed so that together they are at least twice `l2_bytes`: at least 2,
/// at most [`MAX_INPUT_SETS`].
pub fn input_sets_for(bytes_per_set: u64, l2_bytes: u64) -> usize {
    if bytes_per_set == 0 {
        return 2;
    }
    let need = (2 * l2_bytes).div_ceil(bytes_per_set);
    (need as usize).clamp(2, MAX_INPUT_SETS)
}

/// Compare float outputs: element `i` matches when `|got - expected| <= atol + rtol *
/// |expected|` (NaN matches only NaN, so a poisoned, unwritten output never matches).
pub fn compare_f32(expected: &[f32], got: &[f32], rtol: f32, atol: f32) -> OutputCheck {
    if expected.len() != got.len() {
        return OutputCheck::Differs(format!(
            "output has {} elements, expected {}",
            got.len(),
            expected.len()
        ));
    }
    let mut first = None;
    let mut bad = 0usize;
    for (i, (&e, &g)) in expected.iter().zip(got).enumerate() {
        let ok = if e.is_nan() || g.is_nan() {
            e.is_nan() && g.is_nan()
        } else {
            (g - e).abs() <= atol + rtol * e.abs()
        };
        if !ok {
            bad += 1;
            first.get_or_insert((i, e, g));
        }
    }
    match first {
        None => OutputCheck::Matches,
        Some((i, e, g)) => OutputCheck::Differs(format!(
            "{bad} of {} elements differ beyond rtol {rtol} atol {atol}; first at index \
             {i}: expected {e}, got {g}",
            expected.len()
        )),
    }
}

/// Compare outputs exactly (indices, lengths, integer codes).
pub fn compare_exact<T: PartialEq + std::fmt::Debug>(expected: &[T], got: &[T]) -> OutputCheck {
    if expected.len() != got.len() {
        return OutputCheck::Differs(format!(
            "output has {} elements, expected {}",
            got.len(),
            expected.len()
        ));
    }
    let mut it = expected
        .iter()
        .zip(got)
        .enumerate()
        .filter(|(_, (e, g))| e != g);
    match it.next() {
        None => OutputCheck::Matches,
        Some((i, (e, g))) => OutputCheck::Differs(format!(
            "{} of {} elements differ; first at index {i}: expected {e:?}, got {g:?}",
            1 + it.count(),
            expected.len()
        )),
    }
}

/// Without the `cli` feature (no indicatif) the procedure shows no progress bar.
#[cfg(not(feature = "cli"))]
struct ProgressBar;

#[cfg(not(feature = "cli"))]
impl ProgressBar {
    fn inc(&self, _: u64) {}
    fn set_message(&self, _: String) {}
    fn println(&self, _: String) {}
    fn finish_and_clear(&self) {}
}

#[cfg(not(feature = "cli"))]
fn progress_bar(_len: usize, _show: bool, _prefix: String) -> ProgressBar {
    ProgressBar
}

#[cfg(feature = "cli")]
fn progress_bar(len: usize, show: bool, prefix: String) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(len as u64);
    if let Ok(style) = ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {wide_msg}") {
        pb.set_style(style.progress_chars("=> "));
    }
    pb.set_prefix(prefix);
    pb
}

/// Split `total` into `parts` counts that differ by at most one and sum to `total`.
fn split_even(total: usize, parts: usize) -> Vec<usize> {
    (0..parts)
        .map(|i| total / parts + usize::from(i < total % parts))
        .collect()
}

/// Run the tuning procedure (module docs) on `target`, measured on `device`, and
/// return the table entry: winner, every valid candidate's timing (the default's
/// included) and every exclusion with its reason.
///
/// # Errors
///
/// [`Error::Invalid`] for bad settings, a target with no input set, or a bucket of
/// another kernel; [`Error::TuneDefaultFailed`] when the default variant cannot be run,
/// is not reproducible, or cannot be timed.
pub fn tune(
    target: &mut dyn TuneTarget,
    device: &DeviceKey,
    settings: &TuneSettings,
) -> Result<TuningEntry> {
    settings.validate()?;
    let set = target.candidates().clone();
    let bucket = target.bucket().clone();
    let kernel = set.kernel().to_string();
    if bucket.kernel != kernel {
        return Err(Error::invalid(
            "tuning target",
            format!(
                "bucket {bucket} is for kernel {}, candidates are for {kernel}",
                bucket.kernel
            ),
        ));
    }
    let n_sets = target.input_sets();
    if n_sets == 0 {
        return Err(Error::invalid(
            "tuning target",
            format!("kernel {kernel}: input_sets() returned 0, expected at least 1"),
        ));
    }
    let check_sets: Vec<usize> = if n_sets > 1 {
        vec![0, n_sets - 1]
    } else {
        vec![0]
    };
    let default = set.default_candidate().clone();
    let default_failed = |stage: &'static str, reason: String| Error::TuneDefaultFailed {
        kernel: kernel.clone(),
        variant: default.id.clone(),
        stage,
        reason,
    };

    let rounds = settings.rounds.min(settings.repeats);
    let pb = progress_bar(
        set.candidates().len(),
        settings.progress,
        format!("check {kernel}"),
    );

    // 1. The oracle: the default, twice per check set, must agree with itself.
    pb.set_message(default.id.clone());
    for &s in &check_sets {
        target
            .run(&default, s)
            .map_err(|r| default_failed("launch", format!("input set {s}: {r}")))?;
        target
            .run(&default, s)
            .map_err(|r| default_failed("launch", format!("input set {s}: {r}")))?;
        match target.output_matches_default(&default, s) {
            Ok(OutputCheck::Matches) => {}
            Ok(OutputCheck::Differs(d)) => {
                return Err(default_failed(
                    "determinism check",
                    format!("two runs on input set {s} differ: {d}"),
                ))
            }
            Err(r) => {
                return Err(default_failed(
                    "output check",
                    format!("input set {s}: {r}"),
                ))
            }
        }
    }
    pb.inc(1);

    // 2. Check every other candidate against the oracle.
    let mut excluded: Vec<Exclusion> = Vec::new();
    let mut valid: Vec<Candidate> = vec![default.clone()];
    for c in set.candidates().iter().filter(|c| !c.is_default) {
        pb.set_message(c.id.clone());
        match check_candidate(target, c, &check_sets) {
            Ok(()) => valid.push(c.clone()),
            Err(x) => {
                pb.println(format!("  excluded {}: {}: {}", x.id, x.reason, x.detail));
                excluded.push(x);
            }
        }
        pb.inc(1);
    }
    pb.finish_and_clear();

    // 3. Time, interleaved in rounds. Estimate one launch from a few samples of the
    //    default first, and shrink the sample count to the per-candidate budget.
    let mut repeats = settings.repeats;
    if settings.budget_s_per_candidate > 0.0 {
        let probe = TimingPlan {
            warmup: settings.warmup,
            samples: 3,
            launches_per_sample: settings.launches_per_sample,
            input_sets: n_sets,
        };
        if let Ok(v) = target.time(&default, &probe) {
            if let Some(st) = TimingStats::from_samples(&v) {
                let per_sample_s =
                    st.median_us.max(1e-3) * 1e-6 * settings.launches_per_sample as f64;
                let fit = (settings.budget_s_per_candidate / per_sample_s).floor() as usize;
                repeats = fit.clamp(rounds, settings.repeats);
            }
        }
    }
    let per_round = split_even(repeats, rounds);
    let pb = progress_bar(
        rounds * valid.len(),
        settings.progress,
        format!("time  {kernel}"),
    );
    let mut samples: HashMap<String, Vec<f64>> = HashMap::new();
    let mut dropped: Vec<String> = Vec::new();
    for (r, &count) in per_round.iter().enumerate() {
        for k in 0..valid.len() {
            let c = &valid[(k + r) % valid.len()];
            pb.inc(1);
            if dropped.contains(&c.id) {
                continue;
            }
            pb.set_message(c.id.clone());
            let plan = TimingPlan {
                warmup: settings.warmup,
                samples: count,
                launches_per_sample: settings.launches_per_sample,
                input_sets: n_sets,
            };
            let problem = match target.time(c, &plan) {
                Ok(v) if v.len() == count && TimingStats::from_samples(&v).is_some() => {
                    samples.entry(c.id.clone()).or_default().extend(v);
                    None
                }
                Ok(v) => Some(format!(
                    "expected {count} finite non-negative samples (us), got {} ({:?}...)",
                    v.len(),
                    &v[..v.len().min(4)]
                )),
                Err(e) => Some(e),
            };
            if let Some(detail) = problem {
                if c.is_default {
                    return Err(default_failed("timing", detail));
                }
                pb.println(format!("  excluded {}: timing failed: {detail}", c.id));
                samples.remove(&c.id);
                dropped.push(c.id.clone());
                excluded.push(Exclusion {
                    id: c.id.clone(),
                    reason: ExclusionReason::TimingFailed,
                    detail,
                });
            }
        }
    }
    pb.finish_and_clear();

    // 4. Statistics and the winner.
    let mut timings: Vec<CandidateTiming> = Vec::new();
    for c in &valid {
        if let Some(st) = samples
            .get(&c.id)
            .and_then(|v| TimingStats::from_samples(v))
        {
            timings.push(CandidateTiming {
                id: c.id.clone(),
                median_us: round_ns(st.median_us),
                min_us: round_ns(st.min_us),
                max_us: round_ns(st.max_us),
                count: st.count,
            });
        }
    }
    let default_median = timings
        .iter()
        .find(|t| t.id == default.id)
        .map(|t| t.median_us)
        .ok_or_else(|| default_failed("timing", "no samples recorded".into()))?;
    let best = timings
        .iter()
        .min_by(|a, b| {
            a.median_us
                .total_cmp(&b.median_us)
                .then_with(|| (a.id != default.id).cmp(&(b.id != default.id)))
                .then_with(|| a.id.cmp(&b.id))
        })
        .map(|t| (t.id.clone(), t.median_us))
        .unwrap_or((default.id.clone(), default_median));
    let winner = if best.0 != default.id && best.1 > default_median * (1.0 - settings.min_speedup) {
        default.id.clone()
    } else {
        best.0
    };

    let timer = target.timer();
    let method = format!(
        "{}warm-up {} launches per call; {} samples x {} launches in {} interleaved rounds; \
         {} rotating input sets; outputs checked on input sets {:?}; winner must beat the \
         default by {:.1}%",
        if timer.is_empty() {
            String::new()
        } else {
            format!("{timer}; ")
        },
        settings.warmup,
        settings.repeats,
        settings.launches_per_sample,
        rounds,
        n_sets,
        check_sets,
        settings.min_speedup * 100.0
    );
    Ok(TuningEntry {
        gpu: device.gpu.clone(),
        arch: device.arch,
        driver_version: device.driver_version,
        kernel: kernel.clone(),
        kernel_hash: set.kernel_hash().to_string(),
        candidate_checksum: set.checksum().to_string(),
        bucket: bucket.to_string(),
        winner,
        default_variant: default.id.clone(),
        timings,
        excluded,
        workload: target.workload(),
        method,
        tritonrt_version: env!("CARGO_PKG_VERSION").to_string(),
        tuned_at_unix_s: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
    })
}

/// Round microseconds to whole nanoseconds (far below CUDA event resolution). A value
/// `k / 1000` with an integer `k` survives a JSON round trip bit for bit (one exact
/// division either way), which arbitrary f64 values do not with serde_json's default
/// float parser, and a table that reloads equal is what merge and export rely on.
fn round_ns(us: f64) -> f64 {
    (us * 1000.0).round() / 1000.0
}

fn check_candidate(
    target: &mut dyn TuneTarget,
    c: &Candidate,
    check_sets: &[usize],
) -> std::result::Result<(), Exclusion> {
    let exclude = |reason, detail| Exclusion {
        id: c.id.clone(),
        reason,
        detail,
    };
    for &s in check_sets {
        if let Err(e) = target.run(c, s) {
            return Err(exclude(
                ExclusionReason::LaunchFailed,
                format!("input set {s}: {e}"),
            ));
        }
        match target.output_matches_default(c, s) {
            Ok(OutputCheck::Matches) => {}
            Ok(OutputCheck::Differs(d)) => {
                return Err(exclude(
                    ExclusionReason::WrongOutput,
                    format!("input set {s}: {d}"),
                ))
            }
            Err(e) => {
                return Err(exclude(
                    ExclusionReason::CheckFailed,
                    format!("input set {s}: {e}"),
                ))
            }
        }
    }
    Ok(())
}

/// A human-readable report of one entry: every timed variant sorted by median with
/// min / max / count and speed relative to the default (default median / median, so
/// > 1.00x is faster), the exclusions with reasons, and the winner.
pub fn render_report(entry: &TuningEntry) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{} on {} (sm{}, driver {})",
        entry.kernel, entry.gpu, entry.arch, entry.driver_version
    );
    let _ = writeln!(out, "  bucket   {}", entry.bucket);
    if !entry.workload.is_empty() {
        let _ = writeln!(out, "  workload {}", entry.workload);
    }
    let default_median = entry.timing(&entry.default_variant).map(|t| t.median_us);
    let width = entry
        .timings
        .iter()
        .map(|t| t.id.len())
        .chain(std::iter::once("variant".len()))
        .max()
        .unwrap_or(7);
    let _ = writeln!(
        out,
        "    {:<width$}  {:>10}  {:>10}  {:>10}  {:>6}  {:>10}",
        "variant", "median us", "min us", "max us", "n", "vs default"
    );
    let mut rows: Vec<&CandidateTiming> = entry.timings.iter().collect();
    rows.sort_by(|a, b| {
        a.median_us
            .total_cmp(&b.median_us)
            .then_with(|| a.id.cmp(&b.id))
    });
    for t in rows {
        let mark = if t.id == entry.winner { "*" } else { " " };
        let vs = match default_median {
            Some(d) if t.median_us > 0.0 => format!("{:.2}x", d / t.median_us),
            _ => "-".into(),
        };
        let mut tags = Vec::new();
        if t.id == entry.winner {
            tags.push("winner");
        }
        if t.id == entry.default_variant {
            tags.push("default");
        }
        let _ = writeln!(
            out,
            "  {mark} {:<width$}  {:>10.2}  {:>10.2}  {:>10.2}  {:>6}  {:>10}  {}",
            t.id,
            t.median_us,
            t.min_us,
            t.max_us,
            t.count,
            vs,
            tags.join(", ")
        );
    }
    for x in &entry.excluded {
        let _ = writeln!(out, "  x {}: excluded, {}: {}", x.id, x.reason, x.detail);
    }
    let _ = writeln!(
        out,
        "  winner: {} ({})",
        entry.winner,
        match entry.speedup() {
            Some(s) => format!("{s:.2}x vs default"),
            None => "no speedup known".into(),
        }
    );
    out
}

/// A one-line-per-entry summary: bucket, the default's median, the winner, its median
/// and its speedup over the default (both timed side by side in the entry's run), sorted
/// by GPU, kernel, then bucket (the "winner per bucket" table).
pub fn render_summary(entries: &[TuningEntry]) -> String {
    let mut rows: Vec<&TuningEntry> = entries.iter().collect();
    rows.sort_by(|a, b| (&a.gpu, &a.kernel, &a.bucket).cmp(&(&b.gpu, &b.kernel, &b.bucket)));
    let wb = rows
        .iter()
        .map(|e| e.bucket.len())
        .max()
        .unwrap_or(6)
        .max(6);
    let ww = rows
        .iter()
        .map(|e| e.winner.len())
        .max()
        .unwrap_or(6)
        .max(6);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<wb$}  {:>10}  {:<ww$}  {:>10}  {:>10}  gpu",
        "bucket", "default us", "winner", "median us", "vs default"
    );
    for e in rows {
        let median = |id: &str| {
            e.timing(id)
                .map(|t| format!("{:.2}", t.median_us))
                .unwrap_or_else(|| "-".into())
        };
        let vs = e
            .speedup()
            .map(|s| format!("{s:.2}x"))
            .unwrap_or_else(|| "-".into());
        let _ = writeln!(
            out,
            "{:<wb$}  {:>10}  {:<ww$}  {:>10}  {:>10}  {} (sm{}, driver {})",
            e.bucket,
            median(&e.default_variant),
            e.winner,
            median(&e.winner),
            vs,
            e.gpu,
            e.arch,
            e.driver_version
        );
    }
    out
}
