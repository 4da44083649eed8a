//! The crate's one error type. Every variant carries what a user needs to act: which
//! file, which kernel, which argument, what was expected and what was found.

use std::path::PathBuf;

/// Result alias used across the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in tritonrt.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An I/O operation on `path` failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What we were doing ("reading", "writing", "renaming", ...).
        op: &'static str,
        /// The file or directory involved.
        path: PathBuf,
        /// The underlying OS error.
        #[source]
        source: std::io::Error,
    },

    /// A JSON document (manifest, tuning table, Triton metadata) could not be parsed.
    #[error("parsing {path} as {what}: {source}")]
    Json {
        /// The file.
        path: PathBuf,
        /// What the file was supposed to be ("ptx_cache manifest", ...).
        what: &'static str,
        /// The parser's error (line and column).
        #[source]
        source: serde_json::Error,
    },

    // ---- artifact store (src/artifact) ----
    // ---- driver and device (src/device) ----
    // ---- JIT and cubin cache (src/jit) ----
    // ---- kernel launch (src/kernel) ----
    // ---- PQ indexer (src/pq) ----
    /// A PQ indexer configuration value is out of range or inconsistent with the shape
    /// (`D % M != 0`, `pq_bits` outside 1..=8, `H % H_kv != 0`, `S == 0`, ...).
    #[error("invalid PQ config: {field} = {value}: expected {expected}")]
    PqConfig {
        /// The config or shape field at fault (`pq_group_factor`, `seq_len`, ...).
        field: &'static str,
        /// The value that was given.
        value: String,
        /// What would have been acceptable, naming the other values it depends on.
        expected: String,
    },

    /// A PQ input or output tensor has the wrong dtype, shape, length or values.
    /// `file` is the safetensors file it came from, if any.
    #[error(
        "{}tensor `{tensor}`: expected {expected}, got {got}",
        .file.as_ref().map(|p| format!("{}: ", p.display())).unwrap_or_default()
    )]
    PqTensor {
        /// The safetensors file the tensor was read from (None: in-memory inputs).
        file: Option<PathBuf>,
        /// The tensor's name (`query`, `key`, `pq_centroids`, `pq_codebook`,
        /// `pq_ip2l2_phi`, `sparse_list`, ...).
        tensor: String,
        /// Expected dtype / shape / length / value range.
        expected: String,
        /// What was found.
        got: String,
    },

    /// A file is not a readable safetensors file (too short, truncated, bad header).
    #[error("{path}: not a valid safetensors file: {msg}")]
    SafetensorsFile {
        /// The file.
        path: PathBuf,
        /// What is wrong with it (sizes in bytes).
        msg: String,
    },

    /// A PQ config value is neither in the input file's `__metadata__` nor given by its
    /// command-line flag.
    #[error(
        "{path}: missing config value `{key}`: not in the file's __metadata__ and no \
         --{flag} flag given"
    )]
    PqMissingConfig {
        /// The input file.
        path: PathBuf,
        /// The `__metadata__` key (`sink_size`, ...).
        key: &'static str,
        /// The flag that could set it, without the leading dashes (`sink-size`, ...).
        flag: &'static str,
    },
    // ---- autotuner (src/tune) ----
    /// A tuning table's `schema_version` is missing or is not the one this build reads.
    /// At run time such a table is ignored with one warning (manifest defaults are used);
    /// `tritonrt autotune --import` refuses it with this error.
    #[error(
        "tuning table {path}: schema_version {found} is not supported (this build reads \
         schema_version {expected}); re-run `tritonrt autotune` or import a table written \
         by a matching tritonrt"
    )]
    TuneSchema {
        /// The table file.
        path: PathBuf,
        /// What the file holds (`missing`, a number, or the JSON value found).
        found: String,
        /// The schema version this build reads ([`crate::tune::SCHEMA_VERSION`]).
        expected: u32,
    },

    /// One entry of a tuning table is inconsistent (checked by `--import`; at run time
    /// such an entry is simply never used).
    #[error("tuning table {path}: entry {index} (kernel {kernel}, bucket {bucket}): {msg}")]
    TuneEntry {
        /// The table file.
        path: PathBuf,
        /// 0-based position of the entry in the file's `entries` array.
        index: usize,
        /// The entry's logical kernel name.
        kernel: String,
        /// The entry's shape bucket (string form).
        bucket: String,
        /// What is wrong, with expected vs got.
        msg: String,
    },

    /// The candidate variants of a kernel cannot be tuned (no default, two defaults,
    /// a duplicate id, a variant of another kernel, ...).
    #[error("kernel {kernel}: candidate variants: {msg}")]
    TuneCandidates {
        /// The logical kernel name.
        kernel: String,
        /// What is wrong with the set, naming the variant ids involved.
        msg: String,
    },

    /// The default variant could not be run, checked or timed. It is the correctness
    /// oracle and the baseline, so without it nothing can be tuned for this kernel.
    #[error(
        "kernel {kernel}: default variant {variant}: {stage} failed, so there is no \
         correctness oracle and nothing can be tuned: {reason}"
    )]
    TuneDefaultFailed {
        /// The logical kernel name.
        kernel: String,
        /// The default variant's id.
        variant: String,
        /// What failed: `launch`, `determinism check`, `timing`.
        stage: &'static str,
        /// The backend's message.
        reason: String,
    },

    /// `tritonrt autotune` was asked to time kernels but no GPU timing backend is
    /// available (no CUDA driver or device).
    #[error("tritonrt autotune needs a CUDA device: {reason}")]
    TuneNoDevice {
        /// Why no device could be used.
        reason: String,
    },

    /// A value given by the user is not acceptable.
    #[error("invalid {what}: {msg}")]
    Invalid {
        /// The parameter, flag or tensor at fault.
        what: String,
        /// What was wrong and what was expected.
        msg: String,
    },
}

impl Error {
    /// Shorthand for [`Error::Io`].
    pub fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            op,
            path: path.into(),
            source,
        }
    }

    /// Shorthand for [`Error::Invalid`].
    pub fn invalid(what: impl Into<String>, msg: impl Into<String>) -> Self {
        Error::Invalid {
            what: what.into(),
            msg: msg.into(),
        }
    }
}
