//! The persisted tuning table: schema, lookup at launch, and storage on disk.
//!
//! # File format (`schema_version` 1)
//!
//! ```json
//! {
//!   "schema_version": 1,
//!   "entries": [
//!     {
//!       "gpu": "NVIDIA H100 80GB HBM3", "arch": 90, "driver_version": 12080,
//!       "kernel": "pq_score_kernel_v6",
//!       "kernel_hash": "<the variants' source_hash>",
//!       "candidate_checksum": "<sha256 of sorted variant ids + artifact hashes>",
//!       "bucket": "b1:pq_score_kernel_v6:fp32:sm90:rows<=32:n<=32768:align1:ds64:K64:heavy<=128",
//!       "winner": "<variant id>", "default_variant": "<variant id>",
//!       "timings": [{"id": "...", "median_us": 9.8, "min_us": 9.5, "max_us": 12.1, "count": 100}],
//!       "excluded": [{"id": "...", "reason": "wrong_output", "detail": "..."}],
//!       "workload": "...", "method": "...", "tritonrt_version": "0.1.0", "tuned_at_unix_s": 0
//!     }
//!   ]
//! }
//! ```
//!
//! An entry is keyed by GPU name + arch + driver version + kernel hash + candidate
//! checksum + bucket: a driver update, an edited kernel or a recompiled/changed variant
//! set all make the entry stale, and a stale entry is never used. Fields added later are
//! `#[serde(default)]` and unknown fields are ignored, so older and newer builds of the
//! same schema version read each other's tables.
//!
//! # Storage
//!
//! Default path: [`cache_dir`]`()/tuning.json`, i.e. `dirs::cache_dir()/tritonrt/` or
//! `$TRITONRT_CACHE_DIR` (the same directory as the JIT cubin cache). Writes go to a
//! temporary file in the same directory, then rename, so a reader sees the old or the new
//! table, never a torn one. [`TuningTable::save_merged`] holds an exclusive lock on a
//! sibling `tuning.json.lock` while it loads, merges and writes, so two tuning processes
//! do not lose each other's entries.
//!
//! A corrupt, unreadable or unknown-schema table is never fatal at run time: it is
//! ignored with one warning on stderr ([`TuningTable::open`]) and the manifest defaults
//! are used. Import ([`TuningTable::load`]) is strict instead and says what is wrong.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use super::bucket::ShapeBucket;
use super::candidate::CandidateSet;
use crate::error::{Error, Result};

/// The table schema version this build reads and writes. Bump it when a field changes
/// meaning or a required field is added (optional fields are `#[serde(default)]`).
pub const SCHEMA_VERSION: u32 = 1;

/// File name of the table inside the cache directory.
pub const TABLE_FILE_NAME: &str = "tuning.json";

pub use crate::jit::{cache_dir_from, CACHE_DIR_ENV};

/// Identifies the GPU a measurement was taken on.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct DeviceKey {
    /// The device name as the driver reports it (`cuDeviceGetName`), e.g.
    /// `NVIDIA H100 80GB HBM3`.
    pub gpu: String,
    /// Compute capability `major * 10 + minor` (90 for H100).
    pub arch: u32,
    /// CUDA driver version as `cuDriverGetVersion` reports it (e.g. 12080 for 12.8).
    pub driver_version: u32,
}

impl DeviceKey {
    /// Shorthand constructor.
    pub fn new(gpu: impl Into<String>, arch: u32, driver_version: u32) -> Self {
        DeviceKey {
            gpu: gpu.into(),
            arch,
            driver_version,
        }
    }
}

/// The timing of one valid candidate: statistics over `count` samples, each sample the
/// mean time of one launch over a batch of launches, in microseconds (rounded to whole
/// nanoseconds by the tuner, so they survive a JSON round trip exactly).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CandidateTiming {
    /// The variant id.
    pub id: String,
    /// Median over the samples (us per launch).
    pub median_us: f64,
    /// Fastest sample (us per launch).
    pub min_us: f64,
    /// Slowest sample (us per launch).
    pub max_us: f64,
    /// Number of samples.
    pub count: usize,
}

/// Why a candidate was excluded from winning.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExclusionReason {
    /// Loading or launching the variant failed (e.g. too much shared memory, JIT error,
    /// a launch-time argument check).
    LaunchFailed,
    /// The variant ran but its output differs from the default variant's.
    WrongOutput,
    /// Reading back or comparing the output failed.
    CheckFailed,
    /// The variant passed the check but failed while being timed, or returned unusable
    /// timings.
    TimingFailed,
    /// A reason written by a newer build.
    #[serde(other)]
    Other,
}

impl std::fmt::Display for ExclusionReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ExclusionReason::LaunchFailed => "launch failed",
            ExclusionReason::WrongOutput => "wrong output",
            ExclusionReason::CheckFailed => "output check failed",
            ExclusionReason::TimingFailed => "timing failed",
            ExclusionReason::Other => "excluded",
        })
    }
}

/// A candidate that was excluded, and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Exclusion {
    /// The variant id.
    pub id: String,
    /// The reason class.
    pub reason: ExclusionReason,
    /// The backend's message (driver error, first mismatching element, ...).
    pub detail: String,
}

/// One tuning result: the winner of one kernel for one bucket on one device, with the
/// evidence.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TuningEntry {
    /// GPU name (see [`DeviceKey::gpu`]).
    pub gpu: String,
    /// Compute capability (see [`DeviceKey::arch`]).
    pub arch: u32,
    /// Driver version (see [`DeviceKey::driver_version`]).
    pub driver_version: u32,
    /// The logical kernel name.
    pub kernel: String,
    /// The kernel content hash ([`CandidateSet::kernel_hash`]).
    pub kernel_hash: String,
    /// The candidate-set checksum ([`CandidateSet::checksum`]).
    pub candidate_checksum: String,
    /// The shape bucket's string form ([`ShapeBucket`]'s `Display`).
    pub bucket: String,
    /// The winning variant id (one of `timings`).
    pub winner: String,
    /// The default variant id at tuning time (one of `timings`).
    pub default_variant: String,
    /// Every valid candidate's timing, the default's included.
    pub timings: Vec<CandidateTiming>,
    /// Every excluded candidate with its reason.
    #[serde(default)]
    pub excluded: Vec<Exclusion>,
    /// The workload the bucket was tuned on (free text).
    #[serde(default)]
    pub workload: String,
    /// How it was measured (free text: timer, warm-up, samples, input sets).
    #[serde(default)]
    pub method: String,
    /// The tritonrt version that wrote the entry.
    #[serde(default)]
    pub tritonrt_version: String,
    /// When it was tuned, seconds since the Unix epoch (0: unknown).
    #[serde(default)]
    pub tuned_at_unix_s: u64,
}

impl TuningEntry {
    /// The device this entry was measured on.
    pub fn device(&self) -> DeviceKey {
        DeviceKey::new(self.gpu.clone(), self.arch, self.driver_version)
    }

    /// The timing of variant `id`, if it was timed.
    pub fn timing(&self, id: &str) -> Option<&CandidateTiming> {
        self.timings.iter().find(|t| t.id == id)
    }

    /// Default median / winner median: how much faster the winner is (1.0 when the
    /// default won; `None` when a timing is missing or zero).
    pub fn speedup(&self) -> Option<f64> {
        let d = self.timing(&self.default_variant)?.median_us;
        let w = self.timing(&self.winner)?.median_us;
        (w > 0.0).then(|| d / w)
    }

    /// `None` when the entry is self-consistent, else what is wrong. Checked on insert
    /// and by strict loads; an inconsistent entry read leniently is kept but never used.
    pub fn problem(&self) -> Option<String> {
        for (name, v) in [
            ("gpu", &self.gpu),
            ("kernel", &self.kernel),
            ("kernel_hash", &self.kernel_hash),
            ("candidate_checksum", &self.candidate_checksum),
            ("winner", &self.winner),
            ("default_variant", &self.default_variant),
        ] {
            if v.is_empty() {
                return Some(format!("field {name} is empty"));
            }
        }
        match self.bucket.parse::<ShapeBucket>() {
            Err(e) => return Some(e.to_string()),
            Ok(b) if b.kernel != self.kernel => {
                return Some(format!(
                    "bucket is for kernel {}, expected {}",
                    b.kernel, self.kernel
                ))
            }
            // Lookups key on the bucket's string form: a bucket written another way
            // (`heavy<=064`, `rows<=+32`) would be accepted but never found.
            Ok(b) if b.to_string() != self.bucket => {
                return Some(format!(
                    "bucket {:?} is not in its canonical form {:?}",
                    self.bucket,
                    b.to_string()
                ))
            }
            Ok(_) => {}
        }
        if self.timings.is_empty() {
            return Some("no timings (expected at least the default variant's)".into());
        }
        let mut timed = HashSet::new();
        for t in &self.timings {
            if t.id.is_empty() || !timed.insert(t.id.as_str()) {
                return Some(format!("timing id {:?} is empty or repeated", t.id));
            }
            let finite = [t.min_us, t.median_us, t.max_us]
                .iter()
                .all(|v| v.is_finite() && *v >= 0.0);
            if !finite || t.min_us > t.median_us || t.median_us > t.max_us || t.count == 0 {
                return Some(format!(
                    "timing of {} is not 0 <= min <= median <= max with count >= 1: min {} \
                     median {} max {} count {}",
                    t.id, t.min_us, t.median_us, t.max_us, t.count
                ));
            }
        }
        if !timed.contains(self.winner.as_str()) {
            return Some(format!("winner {} has no timing", self.winner));
        }
        if !timed.contains(self.default_variant.as_str()) {
            return Some(format!(
                "default variant {} has no timing",
                self.default_variant
            ));
        }
        for x in &self.excluded {
            if timed.contains(x.id.as_str()) {
                return Some(format!("variant {} is both timed and excluded", x.id));
            }
        }
        None
    }
}

/// Why [`TuningTable::select`] fell back to the manifest default.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DefaultReason {
    /// No entry for this device and bucket.
    NoEntry,
    /// Entries exist for this device and bucket, but for another kernel hash or
    /// candidate set (the kernel or its variants changed since tuning).
    Stale,
    /// The entry's winner is not among the current candidates.
    WinnerNotACandidate(String),
    /// The tuned winner is the default variant.
    TunedDefault,
}

/// Where a [`Selection`] came from.
#[derive(Debug, Clone, PartialEq)]
pub enum SelectionSource {
    /// A tuning table entry; `speedup` is default median / winner median (> 1 faster).
    Tuned {
        /// Measured speedup of the winner over the default when tuned.
        speedup: f64,
    },
    /// The manifest default, and why.
    Default(DefaultReason),
}

/// The variant the runtime should launch for one kernel and bucket.
#[derive(Debug, Clone, PartialEq)]
pub struct Selection {
    /// The variant id (always a member of the candidate set it was selected from).
    pub variant: String,
    /// Tuned, or the default and why.
    pub source: SelectionSource,
}

/// How a merge changed a table.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MergeStats {
    /// Entries whose key was new.
    pub added: usize,
    /// Entries that replaced one with the same key.
    pub replaced: usize,
    /// Inconsistent entries not merged.
    pub skipped: usize,
}

#[derive(Serialize, Deserialize)]
struct TableFile {
    schema_version: u32,
    #[serde(default)]
    entries: Vec<TuningEntry>,
}

/// The tuning table: entries plus an index for O(1) lookup. See the module docs.
#[derive(Debug, Clone, Default)]
pub struct TuningTable {
    entries: Vec<TuningEntry>,
    /// Full key -> position, for usable (self-consistent) entries only.
    by_key: HashMap<String, usize>,
    /// (device, bucket) -> positions, to tell a stale entry from a missing one.
    by_bucket: HashMap<String, Vec<usize>>,
}

const SEP: char = '\u{1f}';

fn bucket_key(gpu: &str, arch: u32, driver: u32, bucket: &str) -> String {
    format!("{gpu}{SEP}{arch}{SEP}{driver}{SEP}{bucket}")
}

fn full_key(
    gpu: &str,
    arch: u32,
    driver: u32,
    kernel_hash: &str,
    checksum: &str,
    bucket: &str,
) -> String {
    format!("{gpu}{SEP}{arch}{SEP}{driver}{SEP}{bucket}{SEP}{kernel_hash}{SEP}{checksum}")
}

fn entry_key(e: &TuningEntry) -> String {
    full_key(
        &e.gpu,
        e.arch,
        e.driver_version,
        &e.kernel_hash,
        &e.candidate_checksum,
        &e.bucket,
    )
}

impl TuningTable {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// The entries, in insertion / file order.
    pub fn entries(&self) -> &[TuningEntry] {
        &self.entries
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when there are no entries.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn from_entries(entries: Vec<TuningEntry>) -> Self {
        let mut t = TuningTable::new();
        for e in entries {
            t.put(e);
        }
        t
    }

    /// Insert or replace by full key, indexing only consistent entries. Returns true
    /// when an entry was replaced.
    fn put(&mut self, e: TuningEntry) -> bool {
        let key = entry_key(&e);
        if let Some(pos) = self.entries.iter().position(|x| entry_key(x) == key) {
            self.entries[pos] = e;
            self.reindex();
            return true;
        }
        self.entries.push(e);
        let i = self.entries.len() - 1;
        self.index_one(i);
        false
    }

    fn index_one(&mut self, i: usize) {
        let e = &self.entries[i];
        if e.problem().is_some() {
            return;
        }
        self.by_key.insert(entry_key(e), i);
        self.by_bucket
            .entry(bucket_key(&e.gpu, e.arch, e.driver_version, &e.bucket))
            .or_default()
            .push(i);
    }

    fn reindex(&mut self) {
        self.by_key.clear();
        self.by_bucket.clear();
        for i in 0..self.entries.len() {
            self.index_one(i);
        }
    }

    /// Insert `entry`, replacing an entry with the same key (device, kernel hash,
    /// candidate checksum, bucket). Returns true when one was replaced.
    ///
    /// # Errors
    ///
    /// [`Error::TuneEntry`] (path `<memory>`) when the entry is inconsistent
    /// ([`TuningEntry::problem`]): the table never holds an entry it could not use.
    pub fn insert(&mut self, entry: TuningEntry) -> Result<bool> {
        if let Some(msg) = entry.problem() {
            return Err(Error::TuneEntry {
                path: PathBuf::from("<memory>"),
                index: self.entries.len(),
                kernel: entry.kernel.clone(),
                bucket: entry.bucket.clone(),
                msg,
            });
        }
        Ok(self.put(entry))
    }

    /// Merge `other` into `self`; `other`'s entries win on equal keys. Inconsistent
    /// entries of `other` are skipped and counted.
    pub fn merge(&mut self, other: &TuningTable) -> MergeStats {
        let mut stats = MergeStats::default();
        for e in &other.entries {
            if e.problem().is_some() {
                stats.skipped += 1;
            } else if self.put(e.clone()) {
                stats.replaced += 1;
            } else {
                stats.added += 1;
            }
        }
        stats
    }

    /// The tuned winner for this device, kernel hash, candidate checksum and bucket, or
    /// `None`. Entries whose kernel hash or candidate checksum differ (stale) never
    /// match; an inconsistent entry (e.g. its winner has no timing) is never used. The
    /// caller must still check that the id is among its current candidates
    /// ([`TuningTable::select`] does). Cost: one hash lookup.
    pub fn winner(
        &self,
        device: &DeviceKey,
        kernel_hash: &str,
        candidate_checksum: &str,
        bucket: &ShapeBucket,
    ) -> Option<&str> {
        self.winner_by_str(device, kernel_hash, candidate_checksum, &bucket.to_string())
    }

    fn winner_by_str(
        &self,
        device: &DeviceKey,
        kernel_hash: &str,
        candidate_checksum: &str,
        bucket: &str,
    ) -> Option<&str> {
        let key = full_key(
            &device.gpu,
            device.arch,
            device.driver_version,
            kernel_hash,
            candidate_checksum,
            bucket,
        );
        self.by_key
            .get(&key)
            .map(|&i| self.entries[i].winner.as_str())
    }

    /// The entry [`TuningTable::winner`] would use, if any.
    pub fn entry_for(
        &self,
        device: &DeviceKey,
        kernel_hash: &str,
        candidate_checksum: &str,
        bucket: &ShapeBucket,
    ) -> Option<&TuningEntry> {
        let key = full_key(
            &device.gpu,
            device.arch,
            device.driver_version,
            kernel_hash,
            candidate_checksum,
            &bucket.to_string(),
        );
        self.by_key.get(&key).map(|&i| &self.entries[i])
    }

    /// The variant to launch for kernel `set.kernel()` in `bucket` on `device`: the
    /// tuned winner when a current entry exists and its winner is one of `set`'s
    /// candidates, else `set`'s default variant with the reason. Never fails.
    pub fn select(
        &self,
        device: &DeviceKey,
        set: &CandidateSet,
        bucket: &ShapeBucket,
    ) -> Selection {
        let default = set.default_candidate().id.clone();
        let fallback = |reason| Selection {
            variant: default.clone(),
            source: SelectionSource::Default(reason),
        };
        if bucket.kernel != set.kernel() {
            return fallback(DefaultReason::NoEntry);
        }
        let b = bucket.to_string();
        match self.winner_by_str(device, set.kernel_hash(), set.checksum(), &b) {
            Some(w) if !set.contains(w) => {
                fallback(DefaultReason::WinnerNotACandidate(w.to_string()))
            }
            Some(w) if w == default => fallback(DefaultReason::TunedDefault),
            Some(w) => {
                let speedup = self
                    .entry_for(device, set.kernel_hash(), set.checksum(), bucket)
                    .and_then(TuningEntry::speedup)
                    .unwrap_or(1.0);
                Selection {
                    variant: w.to_string(),
                    source: SelectionSource::Tuned { speedup },
                }
            }
            None => {
                let bk = bucket_key(&device.gpu, device.arch, device.driver_version, &b);
                if self.by_bucket.get(&bk).is_some_and(|v| !v.is_empty()) {
                    fallback(DefaultReason::Stale)
                } else {
                    fallback(DefaultReason::NoEntry)
                }
            }
        }
    }

    /// Serialize: pretty JSON, entries sorted by (gpu, arch, driver, kernel, bucket,
    /// hashes) so equal tables give equal bytes, ending with a newline.
    pub fn to_json_string(&self) -> String {
        let mut entries = self.entries.clone();
        entries.sort_by(|a, b| {
            (
                &a.gpu,
                a.arch,
                a.driver_version,
                &a.kernel,
                &a.bucket,
                &a.kernel_hash,
                &a.candidate_checksum,
            )
                .cmp(&(
                    &b.gpu,
                    b.arch,
                    b.driver_version,
                    &b.kernel,
                    &b.bucket,
                    &b.kernel_hash,
                    &b.candidate_checksum,
                ))
        });
        let file = TableFile {
            schema_version: SCHEMA_VERSION,
            entries,
        };
        // Serializing plain structs of strings and finite numbers cannot fail (insert
        // rejects non-finite timings); fall back to an empty table rather than panic.
        let mut s = serde_json::to_string_pretty(&file).unwrap_or_else(|_| {
            format!("{{\"schema_version\": {SCHEMA_VERSION}, \"entries\": []}}")
        });
        s.push('\n');
        s
    }

    /// Parse a table from bytes. `path` only names the source in errors. `strict`:
    /// also reject inconsistent entries (import); otherwise they are kept but never used.
    ///
    /// # Errors
    ///
    /// [`Error::Json`] for bytes that are not JSON of the expected shape,
    /// [`Error::TuneSchema`] for a missing or unknown `schema_version`,
    /// [`Error::TuneEntry`] (strict only) for an inconsistent entry.
    pub fn from_json_bytes(bytes: &[u8], path: &Path, strict: bool) -> Result<Self> {
        let json_err = |source| Error::Json {
            path: path.to_path_buf(),
            what: "tuning table",
            cause: source,
        };
        let value: serde_json::Value = serde_json::from_slice(bytes).map_err(json_err)?;
        let found = match value.get("schema_version") {
            None => Some("missing".to_string()),
            Some(v) if v.as_u64() == Some(SCHEMA_VERSION as u64) => None,
            Some(v) => Some(v.to_string()),
        };
        if let Some(found) = found {
            return Err(Error::TuneSchema {
                path: path.to_path_buf(),
                found,
                expected: SCHEMA_VERSION,
            });
        }
        let file: TableFile = serde_json::from_value(value).map_err(json_err)?;
        if strict {
            for (index, e) in file.entries.iter().enumerate() {
                if let Some(msg) = e.problem() {
                    return Err(Error::TuneEntry {
                        path: path.to_path_buf(),
                        index,
                        kernel: e.kernel.clone(),
                        bucket: e.bucket.clone(),
                        msg,
                    });
                }
            }
        }
        Ok(Self::from_entries(file.entries))
    }

    /// Read and strictly validate the table at `path` (used by `--import` and
    /// `--export`).
    ///
    /// # Errors
    ///
    /// [`Error::Io`] when the file cannot be read, otherwise as
    /// [`TuningTable::from_json_bytes`] with `strict`.
    pub fn load(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|e| Error::io("reading", path, e))?;
        Self::from_json_bytes(&bytes, path, true)
    }

    /// Read the table at `path` leniently: a missing file is an empty table and no
    /// warning; an unreadable, corrupt or unknown-schema file is an empty table and the
    /// warning text to print. Never fails.
    pub fn load_or_empty(path: &Path) -> (Self, Option<String>) {
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return (Self::new(), None),
            Err(e) => {
                return (
                    Self::new(),
                    Some(ignore_warning(path, &Error::io("reading", path, e))),
                )
            }
        };
        match Self::from_json_bytes(&bytes, path, false) {
            Ok(t) => (t, None),
            Err(e) => (Self::new(), Some(ignore_warning(path, &e))),
        }
    }

    /// What the runtime calls at setup: [`TuningTable::load_or_empty`], printing its
    /// warning on stderr at most once per path per process.
    pub fn open(path: &Path) -> Self {
        Self::open_with(path, &mut |w| eprintln!("{w}"))
    }

    /// [`TuningTable::open`] with the warning sent to `warn` instead of stderr (at most
    /// once per path per process, shared with `open`).
    pub fn open_with(path: &Path, warn: &mut dyn FnMut(&str)) -> Self {
        let (t, warning) = Self::load_or_empty(path);
        if let Some(w) = warning {
            if warn_once(path) {
                warn(&w);
            }
        }
        t
    }

    /// [`TuningTable::open`] on [`default_path`]; an empty table (with one warning)
    /// when no cache directory can be determined.
    pub fn open_default() -> Self {
        match default_path() {
            Ok(p) => Self::open(&p),
            Err(e) => {
                if warn_once(Path::new("<default tuning table>")) {
                    eprintln!(
                        "warning: no tuning table: {e}; using the manifest's default variants"
                    );
                }
                Self::new()
            }
        }
    }

    /// Write the table to `path` atomically (temporary file in the same directory,
    /// fsync, rename), replacing what is there. Creates the directory if needed.
    ///
    /// # Errors
    ///
    /// [`Error::Io`] naming the directory, temporary file or target.
    pub fn save(&self, path: &Path) -> Result<()> {
        let dir = parent_dir(path);
        std::fs::create_dir_all(&dir).map_err(|e| Error::io("creating directory", &dir, e))?;
        crate::artifact::write_atomic(path, self.to_json_string().as_bytes())
    }

    /// Merge this table into the one at `path` and write the result atomically: load
    /// (leniently: a corrupt file is replaced, with one warning), insert this table's
    /// entries (they win on equal keys), write. An exclusive lock on
    /// `<path>.lock` serializes concurrent savers.
    ///
    /// # Errors
    ///
    /// [`Error::Io`] for the lock file or the write.
    pub fn save_merged(&self, path: &Path) -> Result<MergeStats> {
        let dir = parent_dir(path);
        std::fs::create_dir_all(&dir).map_err(|e| Error::io("creating directory", &dir, e))?;
        let lock_path = lock_path(path);
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| Error::io("opening lock file", &lock_path, e))?;
        lock.lock()
            .map_err(|e| Error::io("locking", &lock_path, e))?;
        let (mut base, warning) = Self::load_or_empty(path);
        if let Some(w) = warning {
            if warn_once(path) {
                eprintln!("{w} (it will be replaced)");
            }
        }
        let stats = base.merge(self);
        let result = base.save(path);
        // Dropping `lock` closes the file and releases the lock.
        drop(lock);
        result.map(|_| stats)
    }
}

fn parent_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// The lock file [`TuningTable::save_merged`] uses for `path`: `<path>.lock`.
pub fn lock_path(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_os_string();
    s.push(".lock");
    PathBuf::from(s)
}

fn ignore_warning(path: &Path, e: &Error) -> String {
    // The crate's error messages already include their source's message.
    format!(
        "warning: ignoring tuning table {}: {e}; using the manifest's default variants",
        path.display()
    )
}

/// Returns true the first time it is called for `path` in this process.
fn warn_once(path: &Path) -> bool {
    static WARNED: OnceLock<Mutex<HashSet<PathBuf>>> = OnceLock::new();
    WARNED
        .get_or_init(|| Mutex::new(HashSet::new()))
        .lock()
        .insert(path.to_path_buf())
}

/// The cache directory: `$TRITONRT_CACHE_DIR` when set and non-empty, else
/// `dirs::cache_dir()/tritonrt`.
///
/// # Errors
///
/// [`Error::Invalid`] when neither is available.
pub fn cache_dir() -> Result<PathBuf> {
    crate::jit::CubinCache::default_dir()
}

/// The default table path: [`cache_dir`]`()/`[`TABLE_FILE_NAME`].
///
/// # Errors
///
/// As [`cache_dir`].
pub fn default_path() -> Result<PathBuf> {
    Ok(cache_dir()?.join(TABLE_FILE_NAME))
}
