//! Ragged batches (spec "Ragged batches"): one step over `B` sequences of different
//! lengths. Entry `b` is at its own length `S_b <= S_alloc` with its own `N_cached[b]`,
//! and every rule of the fixed-`S` step applies to it (the short path too). Outputs keep
//! fixed shapes: `sparse_list [B, H, max_b total_b]` with each row's tail past `total_b`
//! set to `-1`, `sparse_len [B, H]`, `weight_list [B, H, S_alloc]` with zeros past `S_b`,
//! and codes `[B, max_b n_b, H_kv, M]` with `n_cached [B]` saying how many of each
//! entry's are valid. With equal lengths this is exactly the fixed-`S` step.
//!
//! The CPU reference and the checker are built from the fixed-`S` ones: entry `b` is a
//! batch of one ([`RaggedInputs::entry`], [`RaggedOutput::entry`]) that
//! [`crate::pq::reference::step`] answers and [`crate::pq::check::check_with`] judges;
//! the checker adds the padding rules.

use crate::error::{Error, Result};
use crate::pq::check::{check_with, CheckOptions, CheckReport, Violation, ViolationKind};
use crate::pq::config::{PqConfig, Shape};
use crate::pq::reference::{step, PqOutput};
use crate::pq::workload::PqInputs;

/// The inputs of a ragged step: the fixed-shape tensors plus each entry's length and
/// cached-code count.
#[derive(Debug, Clone, PartialEq)]
pub struct RaggedInputs {
    /// The tensors at the allocated length: `shape.s = S_alloc`, `key [B, H_kv, S_alloc,
    /// D]` (entry `b` reads positions `init_offset + n_cached[b] .. S_b`), `codes [B, N,
    /// H_kv, M]` with `N = inputs.n_cached >= max_b n_cached[b]` (entry `b`'s codes past
    /// `n_cached[b]` are ignored).
    pub inputs: PqInputs,
    /// `S_b` per entry, each in `1..=S_alloc`.
    pub seq_lens: Vec<usize>,
    /// `N_cached[b]` per entry, each `<= N` and `<= max(0, S_b - init_offset)`.
    pub n_cached: Vec<usize>,
}

impl RaggedInputs {
    /// Build and validate ragged inputs from signed lengths (as files hold them, i64).
    /// `n_cached` None: every entry has `inputs.n_cached` codes.
    ///
    /// Errors: [`Error::Invalid`] naming the entry and the values: `seq_lens` not of
    /// length `B`, an entry negative, zero or above `S_alloc`; an `n_cached` entry
    /// negative, above the `N` codes held, or above `S_b - init_offset` (more codes than
    /// the entry has keys); any error of [`PqInputs::validate`].
    pub fn new(
        cfg: &PqConfig,
        inputs: PqInputs,
        seq_lens: &[i64],
        n_cached: Option<&[i64]>,
    ) -> Result<Self> {
        inputs.validate(cfg)?;
        let sh = inputs.shape;
        let count = |name: &str, v: &[i64]| -> Result<()> {
            if v.len() != sh.b {
                return Err(Error::invalid(
                    name,
                    format!(
                        "expected one entry per batch row, [B={}], got {}",
                        sh.b,
                        v.len()
                    ),
                ));
            }
            Ok(())
        };
        count("seq_lens", seq_lens)?;
        let mut lens = Vec::with_capacity(sh.b);
        for (b, &s) in seq_lens.iter().enumerate() {
            if s < 1 || s as u64 > sh.s as u64 {
                return Err(Error::invalid(
                    "seq_lens",
                    format!(
                        "row {b}: S_b = {s}, expected 1..=S_alloc = {} (the key tensor's length)",
                        sh.s
                    ),
                ));
            }
            lens.push(s as usize);
        }
        let cached: Vec<usize> = match n_cached {
            None => vec![inputs.n_cached; sh.b],
            Some(v) => {
                count("n_cached", v)?;
                let mut out = Vec::with_capacity(sh.b);
                for (b, &n) in v.iter().enumerate() {
                    if n < 0 || n as u64 > inputs.n_cached as u64 {
                        return Err(Error::invalid(
                            "n_cached",
                            format!(
                                "row {b}: n_cached = {n}, expected 0..={} (the codes tensor holds {} keys per row)",
                                inputs.n_cached, inputs.n_cached
                            ),
                        ));
                    }
                    out.push(n as usize);
                }
                out
            }
        };
        let x = RaggedInputs {
            inputs,
            seq_lens: lens,
            n_cached: cached,
        };
        for b in 0..sh.b {
            let most = cfg.n_quantized(x.seq_lens[b]);
            if x.n_cached[b] > most {
                return Err(Error::invalid(
                    "n_cached",
                    format!(
                        "row {b}: {} cached codes but S_b - init_offset = {} - {} = {most} keys \
                         (more codes than the row has keys)",
                        x.n_cached[b], x.seq_lens[b], cfg.init_offset
                    ),
                ));
            }
        }
        Ok(x)
    }

    /// Batch entries `B`.
    pub fn batch(&self) -> usize {
        self.inputs.shape.b
    }

    /// Entry `b` as a batch of one at its own length: `query [1, H, 1, D]`, `key [1,
    /// H_kv, S_b, D]`, its centroids and phi, and its first `n_cached[b]` codes.
    ///
    /// # Panics
    /// If `b >= B`.
    pub fn entry(&self, b: usize) -> PqInputs {
        let x = &self.inputs;
        let sh = x.shape;
        let s_b = self.seq_lens[b];
        let n_b = self.n_cached[b];
        let per_key = sh.d;
        let mut key = Vec::with_capacity(sh.h_kv * s_b * per_key);
        for g in 0..sh.h_kv {
            let off = x.key_offset(b, g, 0);
            key.extend_from_slice(&x.key[off..off + s_b * per_key]);
        }
        let q = sh.h * sh.d;
        let cents = x.centroids.len() / sh.b;
        // codes [B, N, H_kv, M]: one key's codes are H_kv * M values
        let codes = match x.codes.len().checked_div(sh.b * x.n_cached) {
            None | Some(0) => Vec::new(),
            Some(row) => {
                let start = b * x.n_cached * row;
                x.codes[start..start + n_b * row].to_vec()
            }
        };
        PqInputs {
            shape: Shape { b: 1, s: s_b, ..sh },
            query: x.query[b * q..(b + 1) * q].to_vec(),
            key,
            centroids: x.centroids[b * cents..(b + 1) * cents].to_vec(),
            codes,
            n_cached: n_b,
            phi: x.phi.as_ref().map(|p| {
                let per = p.len() / sh.b;
                p[b * per..(b + 1) * per].to_vec()
            }),
        }
    }
}

/// The outputs of a ragged step (fixed shapes, padded; see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct RaggedOutput {
    /// Batch `B`.
    pub b: usize,
    /// Query heads `H`.
    pub h: usize,
    /// KV heads `H_kv`.
    pub h_kv: usize,
    /// Subvectors `M`.
    pub m: usize,
    /// `S_alloc`: the row length of `weight_list`.
    pub s_alloc: usize,
    /// `S_b` per entry.
    pub seq_lens: Vec<usize>,
    /// `max_b total_b`: the row length of `sparse_list`.
    pub total: usize,
    /// `[B, H, total]` i64: each row's `total_b` positions ascending, then `-1`.
    pub sparse_list: Vec<i64>,
    /// `[B, H]` i64: `total_b` of the row's entry.
    pub sparse_len: Vec<i64>,
    /// `[B, H, S_alloc]`: 1.0 at the row's listed positions, 0.0 elsewhere (all of `S_b
    /// .. S_alloc` included).
    pub weight_list: Vec<f32>,
    /// `max_b n_b`: the second dimension of `codes`.
    pub n_max: usize,
    /// `[B, n_max, H_kv, M]` i64 codes; entry `b`'s rows past `n_cached[b]` are 0.
    pub codes: Vec<i64>,
    /// `n_b` per entry: its valid codes after the step.
    pub n_cached: Vec<usize>,
}

impl RaggedOutput {
    /// The padded outputs of `entries` (entry `b`'s fixed-`S` output, a batch of one at
    /// `S_b`), for rows of `s_alloc` weights.
    ///
    /// Errors: [`Error::Invalid`] when `entries` is empty, an entry is not a batch of
    /// one, the entries disagree on `H`, `H_kv` or `M`, or an entry is longer than
    /// `s_alloc`.
    pub fn assemble(entries: &[PqOutput], s_alloc: usize) -> Result<Self> {
        let first = entries
            .first()
            .ok_or_else(|| Error::invalid("entries", "a ragged batch needs at least one entry"))?;
        let (h, h_kv, m) = (first.h, first.h_kv, first.m);
        for (b, e) in entries.iter().enumerate() {
            if e.b != 1 || e.h != h || e.h_kv != h_kv || e.m != m || e.s > s_alloc {
                return Err(Error::invalid(
                    "entries",
                    format!(
                        "entry {b}: B={} H={} H_kv={} M={} S={}, expected B=1 H={h} H_kv={h_kv} M={m} S<={s_alloc}",
                        e.b, e.h, e.h_kv, e.m, e.s
                    ),
                ));
            }
        }
        let bb = entries.len();
        let total = entries.iter().map(|e| e.total).max().unwrap_or(0);
        let n_max = entries.iter().map(|e| e.n_cached).max().unwrap_or(0);
        let mut out = RaggedOutput {
            b: bb,
            h,
            h_kv,
            m,
            s_alloc,
            seq_lens: entries.iter().map(|e| e.s).collect(),
            total,
            sparse_list: vec![-1; bb * h * total],
            sparse_len: Vec::with_capacity(bb * h),
            weight_list: vec![0.0; bb * h * s_alloc],
            n_max,
            codes: vec![0; bb * n_max * h_kv * m],
            n_cached: entries.iter().map(|e| e.n_cached).collect(),
        };
        for (b, e) in entries.iter().enumerate() {
            for hh in 0..h {
                let r = b * h + hh;
                out.sparse_list[r * total..r * total + e.total]
                    .copy_from_slice(&e.sparse_list[hh * e.total..(hh + 1) * e.total]);
                out.weight_list[r * s_alloc..r * s_alloc + e.s]
                    .copy_from_slice(&e.weight_list[hh * e.s..(hh + 1) * e.s]);
            }
            out.sparse_len.extend_from_slice(&e.sparse_len);
            let row = h_kv * m;
            out.codes[b * n_max * row..b * n_max * row + e.n_cached * row]
                .copy_from_slice(&e.codes[..e.n_cached * row]);
        }
        Ok(out)
    }

    /// Entry `b` as the fixed-`S` output of a batch of one at `S_b`, its `total_b` taken
    /// from `sparse_len[b, 0]` (clamped into `0..=total`; the checker reports a row whose
    /// length disagrees).
    ///
    /// # Panics
    /// If `b >= B` or the vectors are shorter than the shape says.
    pub fn entry(&self, b: usize) -> PqOutput {
        let (h, total, sa) = (self.h, self.total, self.s_alloc);
        let s_b = self.seq_lens[b];
        let t_b = (self.sparse_len[b * h].max(0) as usize).min(total);
        let mut sparse_list = Vec::with_capacity(h * t_b);
        let mut weight_list = Vec::with_capacity(h * s_b);
        for hh in 0..h {
            let r = b * h + hh;
            sparse_list.extend_from_slice(&self.sparse_list[r * total..r * total + t_b]);
            weight_list.extend_from_slice(&self.weight_list[r * sa..r * sa + s_b]);
        }
        let row = self.h_kv * self.m;
        let n_b = self.n_cached[b].min(self.n_max);
        let start = b * self.n_max * row;
        PqOutput {
            b: 1,
            h,
            h_kv: self.h_kv,
            m: self.m,
            s: s_b,
            total: t_b,
            sparse_list,
            sparse_len: self.sparse_len[b * h..(b + 1) * h].to_vec(),
            weight_list,
            codes: self.codes[start..start + n_b * row].to_vec(),
            n_cached: n_b,
        }
    }
}

/// One ragged step on the CPU: [`step`] on each entry at its own length, assembled with
/// the padding rules.
///
/// Errors: those of [`step`] on an entry's inputs.
pub fn reference_step(cfg: &PqConfig, x: &RaggedInputs) -> Result<RaggedOutput> {
    let entries = (0..x.batch())
        .map(|b| step(cfg, &x.entry(b)))
        .collect::<Result<Vec<_>>>()?;
    RaggedOutput::assemble(&entries, x.inputs.shape.s)
}

/// Check a ragged step's outputs: each entry by the fixed-`S` rule at its own length
/// ([`check_with`] on [`RaggedInputs::entry`] and [`RaggedOutput::entry`]; violations
/// name the batch row `b`), plus the padding: the shapes, every `sparse_len` of an
/// entry equal, `-1` past `total_b` in every row of `sparse_list`, zeros past `S_b` in
/// `weight_list`, and `n_cached[b]` equal to the entry's count after the step.
pub fn check_ragged(
    cfg: &PqConfig,
    x: &RaggedInputs,
    out: &RaggedOutput,
    opts: &CheckOptions,
) -> CheckReport {
    let sh = x.inputs.shape;
    let mut report = CheckReport::new_for(opts);
    let bad = |report: &mut CheckReport, b: Option<usize>, kind, detail: String| {
        report.add(
            Violation {
                b,
                h: None,
                kind,
                detail,
            },
            opts,
        );
    };
    let (h, total, sa) = (sh.h, out.total, sh.s);
    let shape_ok = out.b == sh.b
        && out.h == h
        && out.s_alloc == sa
        && out.seq_lens == x.seq_lens
        && out.sparse_list.len() == sh.b * h * total
        && out.sparse_len.len() == sh.b * h
        && out.weight_list.len() == sh.b * h * sa
        && out.n_cached.len() == sh.b
        && out.codes.len() == sh.b * out.n_max * sh.h_kv * cfg.m();
    if !shape_ok {
        bad(
            &mut report,
            None,
            ViolationKind::Shape,
            format!(
                "expected B={} H={h} S_alloc={sa} seq_lens {:?}; got B={} H={} S_alloc={} seq_lens {:?} \
                 with {} / {} / {} / {} values (sparse_list / sparse_len / weight_list / codes)",
                sh.b,
                x.seq_lens,
                out.b,
                out.h,
                out.s_alloc,
                out.seq_lens,
                out.sparse_list.len(),
                out.sparse_len.len(),
                out.weight_list.len(),
                out.codes.len()
            ),
        );
        return report;
    }
    for b in 0..sh.b {
        let lens = &out.sparse_len[b * h..(b + 1) * h];
        let want_total = cfg.total(x.seq_lens[b]);
        if lens.iter().any(|&l| l != want_total as i64) || want_total > total {
            bad(
                &mut report,
                Some(b),
                ViolationKind::SparseLen,
                format!(
                    "sparse_len {:?} for S_b = {}, expected {want_total} in every head (row length {total})",
                    &lens[..lens.len().min(8)],
                    x.seq_lens[b]
                ),
            );
            continue;
        }
        for hh in 0..h {
            let r = b * h + hh;
            let tail = &out.sparse_list[r * total + want_total..(r + 1) * total];
            if let Some(i) = tail.iter().position(|&v| v != -1) {
                bad(
                    &mut report,
                    Some(b),
                    ViolationKind::SparseLen,
                    format!(
                        "head {hh}: sparse_list[{}] = {} past total_b = {want_total}, expected -1",
                        want_total + i,
                        tail[i]
                    ),
                );
            }
            let past = &out.weight_list[r * sa + x.seq_lens[b]..(r + 1) * sa];
            if let Some(i) = past.iter().position(|&v| v != 0.0) {
                bad(
                    &mut report,
                    Some(b),
                    ViolationKind::WeightList,
                    format!(
                        "head {hh}: weight_list[{}] = {} past S_b = {}, expected 0",
                        x.seq_lens[b] + i,
                        past[i],
                        x.seq_lens[b]
                    ),
                );
            }
        }
        let entry_in = x.entry(b);
        let want_n = if cfg.is_short(x.seq_lens[b]) {
            x.n_cached[b]
        } else {
            cfg.n_quantized(x.seq_lens[b])
        };
        if out.n_cached[b] != want_n {
            bad(
                &mut report,
                Some(b),
                ViolationKind::Codes,
                format!("n_cached = {}, expected {want_n}", out.n_cached[b]),
            );
            continue;
        }
        // a reference given for the whole batch is not the entry's: each entry's own
        // is computed where the mode needs it
        let entry_opts = CheckOptions {
            mode: opts.mode,
            max_listed: opts.max_listed,
            reference: None,
        };
        let r = check_with(cfg, &entry_in, &out.entry(b), &entry_opts);
        report.absorb(r, b, opts);
    }
    report
}

/// The length `T` of a ragged step's `sparse_list` rows on the device: the largest
/// `total` any length `1..=s_alloc` has (sizes resolved at each length), so that the
/// layout `[B, H, T]` does not depend on the lengths and one captured graph serves them
/// all. Every row's `total_b <= T`; its tail up to `T` is `-1`.
pub fn ragged_row_len(cfg: &PqConfig, s_alloc: usize) -> usize {
    (1..=s_alloc).map(|s| cfg.total(s)).max().unwrap_or(0)
}

/// One entry of a [`RaggedPlan`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RaggedRowPlan {
    /// `S_b`.
    pub s: usize,
    /// Whether the entry takes the short path (`S_b <= heavy + init_offset + 1 + K`,
    /// `heavy` resolved at `S_b`): every position listed, nothing quantized.
    pub short: bool,
    /// `N_cached[b]` before the step.
    pub n_old: usize,
    /// `N_cached[b]` after it (`S_b - init_offset` on the long path, else `n_old`).
    pub n: usize,
    /// Keys the step quantizes for the entry (`n - n_old`).
    pub new_keys: usize,
    /// `total_b`: its list length (`S_b` on the short path, else `sink' + k + window'`).
    pub total: usize,
}

/// What a ragged step does for each entry, as data (pure: the GPU indexer validates its
/// host-side lengths with it, `tritonrt run --seq-lens` prints it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RaggedPlan {
    /// `S_alloc`.
    pub s_alloc: usize,
    /// `max_b total_b`: the row length of the downloaded `sparse_list`.
    pub total: usize,
    /// Each entry's plan, in batch order.
    pub rows: Vec<RaggedRowPlan>,
}

impl RaggedPlan {
    /// Entries on the short path.
    pub fn short_rows(&self) -> usize {
        self.rows.iter().filter(|r| r.short).count()
    }

    /// Keys quantized over the batch.
    pub fn new_keys(&self) -> usize {
        self.rows.iter().map(|r| r.new_keys).sum()
    }
}

/// Plan a ragged step of entries at `seq_lens` holding `n_cached` codes each, for key
/// tensors of `s_alloc` positions.
///
/// Errors: [`Error::Invalid`] naming the row and the values: `seq_lens` and `n_cached`
/// of different lengths or empty, `S_b` zero or above `S_alloc`, `n_cached[b]` above
/// `S_b - init_offset` (more codes than the entry has keys: the state is ahead of the
/// sequence).
pub fn plan_ragged(
    cfg: &PqConfig,
    s_alloc: usize,
    seq_lens: &[usize],
    n_cached: &[usize],
) -> Result<RaggedPlan> {
    if seq_lens.is_empty() || seq_lens.len() != n_cached.len() {
        return Err(Error::invalid(
            "seq_lens",
            format!(
                "{} lengths for {} rows of cached-code counts (one per batch row, B >= 1)",
                seq_lens.len(),
                n_cached.len()
            ),
        ));
    }
    let mut rows = Vec::with_capacity(seq_lens.len());
    for (b, (&s, &n_old)) in seq_lens.iter().zip(n_cached).enumerate() {
        if s == 0 || s > s_alloc {
            return Err(Error::invalid(
                "seq_lens",
                format!("row {b}: S_b = {s}, expected 1..=S_alloc = {s_alloc}"),
            ));
        }
        let most = cfg.n_quantized(s);
        if n_old > most {
            return Err(Error::invalid(
                "n_cached",
                format!(
                    "row {b}: {n_old} cached codes but S_b - init_offset = {s} - {} = {most} keys \
                     (the row's state is ahead of its sequence)",
                    cfg.init_offset
                ),
            ));
        }
        let short = cfg.is_short(s);
        let n = if short { n_old } else { most };
        rows.push(RaggedRowPlan {
            s,
            short,
            n_old,
            n,
            new_keys: n - n_old,
            total: cfg.total(s),
        });
    }
    Ok(RaggedPlan {
        s_alloc,
        total: rows.iter().map(|r| r.total).max().unwrap_or(0),
        rows,
    })
}

/// Which kernels a ragged step runs on the GPU (after `pq_rgq`, which quantizes each long
/// row's new keys and checks the rows, on every path).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RaggedPath {
    /// The split histogram path (`kernels_triton/pq_rgsplit.py`: `pq_rgthresh` +
    /// `pq_rgsemit`, three launches with `pq_rgq`): each row's persistent combination
    /// histogram moved to its candidates and the threshold found on it (the row's codes
    /// read once, by the emit), as the fixed-`S` split path. Where the combination
    /// histogram applies ([`crate::pq::plan::hist_built_for`]: `K^M <= 4096`, `M <= 4`).
    Split,
    /// The radix-select path (`kernels_triton/pq_ragged.py`: `pq_rglut`, four
    /// `pq_rground` rounds, `pq_rgcnt`, `pq_rgemit`, eight launches with `pq_rgq`): the
    /// exact threshold on the keys' 32-bit rank keys, one 8-bit digit a round, each round
    /// scoring every candidate again. Serves every config, so it is the path of those the
    /// histogram does not take (`K^M > 4096` or `M > 4`).
    Radix,
    /// The indexed path (`kernels_triton/pq_rgindex.py`: `pq_rgwfill` + `pq_rgindex`,
    /// three launches with `pq_rgq`; two on sm_80, where each row CTA writes its own
    /// weights): each long row's heavy keys gathered from its combination buckets, as the
    /// fixed-`S` indexed path (`pq_index`). Where that path applies
    /// ([`crate::pq::plan::index_built_for`]: `M <= 2`, `K^M <= 4096`, query dtype =
    /// weight dtype), `heavy_size` at `S_alloc` is at most half of what a row gathers
    /// (`TP / 2`) and the buckets fit the indexer's budget, as the fixed-`S` `Auto` rule.
    Index,
}

impl RaggedPath {
    /// Kernel launches of one step on this path (`pq_rgq` included) on sm_90.
    pub fn launches(self) -> usize {
        match self {
            RaggedPath::Split | RaggedPath::Index => 3,
            RaggedPath::Radix => 8,
        }
    }
}

/// The path of a ragged step for `cfg`: `forced` where given (for measurements and
/// tests), else [`RaggedPath::Index`] where `index` is `Ok(true)` (`Ok`: its kernels are
/// built; `true`: the heavy size and bucket conditions of [`RaggedPath::Index`] hold),
/// else [`RaggedPath::Split`] where the
/// combination histogram applies and its ragged kernels are built (`split_built`), else
/// [`RaggedPath::Radix`].
///
/// Errors: [`Error::Invalid`] when [`RaggedPath::Split`] is forced where the histogram
/// does not apply to `cfg` (naming `K^M` and `M`) or its kernels are not built; `index`'s
/// error when [`RaggedPath::Index`] is forced where its kernels are not built (forced, it
/// ignores the heavy size and bucket conditions).
pub fn ragged_path(
    cfg: &PqConfig,
    split_built: bool,
    index: Result<bool>,
    forced: Option<RaggedPath>,
) -> Result<RaggedPath> {
    let hist = crate::pq::plan::hist_built_for(cfg);
    match forced {
        Some(RaggedPath::Split) if !hist => Err(Error::invalid(
            "ragged path",
            format!(
                "the split histogram path needs K^M <= {} and M <= 4; this config has K = {}, M = {}",
                crate::pq::kernels::HIST_COMBOS,
                cfg.k_centroids(),
                cfg.m()
            ),
        )),
        Some(RaggedPath::Split) if !split_built => Err(Error::invalid(
            "ragged path",
            "pq_rgthresh / pq_rgsemit are not in this ptx_cache (kernels_triton/pq_rgsplit.py; \
             rebuild with kernels_triton/build.py)",
        )),
        Some(RaggedPath::Index) => index.map(|_| RaggedPath::Index),
        Some(p) => Ok(p),
        None if matches!(index, Ok(true)) => Ok(RaggedPath::Index),
        None if hist && split_built => Ok(RaggedPath::Split),
        None => Ok(RaggedPath::Radix),
    }
}

/// Emit parts per row of the ragged split path (its grid is `B*H` times this): the parts
/// of the longest row any length up to `s_alloc` has, `max(1, cdiv(s_alloc -
/// init_offset, tile))` (a row of `S_b` keys uses `max(1, cdiv(S_b - init_offset,
/// tile))` of them; the rest of its CTAs only zero stale weights and pad).
pub fn ragged_split_parts(s_alloc: usize, init_offset: usize, tile: usize) -> usize {
    s_alloc
        .saturating_sub(init_offset)
        .div_ceil(tile.max(1))
        .max(1)
}
