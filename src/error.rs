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
    // ---- autotuner (src/tune) ----
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
