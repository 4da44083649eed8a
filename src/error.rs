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
    #[error("{op} {path}: {cause}")]
    Io {
        /// What we were doing ("reading", "writing", "renaming", ...).
        op: &'static str,
        /// The file or directory involved.
        path: PathBuf,
        /// The underlying OS error.
        cause: std::io::Error,
    },

    /// A JSON document (manifest, tuning table, Triton metadata) could not be parsed.
    #[error("parsing {path} as {what}: {cause}")]
    Json {
        /// The file.
        path: PathBuf,
        /// What the file was supposed to be ("ptx_cache manifest", ...).
        what: &'static str,
        /// The parser's error (line and column).
        cause: serde_json::Error,
    },

    // ---- artifact store (src/artifact) ----
    /// The manifest's `schema_version` is not one this build reads.
    #[error("{path}: manifest schema_version {found} is not supported (expected {expected}); rebuild the ptx_cache with kernels_triton/build.py")]
    ManifestSchema {
        /// The manifest file.
        path: PathBuf,
        /// The version found in the file.
        found: u32,
        /// The version this build reads.
        expected: u32,
    },

    /// The manifest parsed but breaks a rule of `kernels_triton/MANIFEST.md`.
    #[error("{path}: invalid manifest: {msg}")]
    ManifestInvalid {
        /// The manifest file.
        path: PathBuf,
        /// Which rule, which variant, what was expected and what was found.
        msg: String,
    },

    /// An artifact file named by the manifest does not exist or cannot be read.
    #[error("artifact {file} is missing or unreadable (expected {expected_size} bytes, sha256 {expected_sha256}): {cause}")]
    ArtifactMissing {
        /// The file.
        file: PathBuf,
        /// Size in bytes the manifest records.
        expected_size: u64,
        /// sha256 (hex) the manifest records.
        expected_sha256: String,
        /// The OS error.
        cause: std::io::Error,
    },

    /// An artifact file's size or sha256 differs from the manifest: truncated, altered or
    /// replaced. Its bytes are never used.
    #[error("artifact {file} is corrupt: expected {expected_size} bytes with sha256 {expected_sha256}, found {actual_size} bytes with sha256 {actual_sha256}")]
    ArtifactCorrupt {
        /// The file.
        file: PathBuf,
        /// Size in bytes the manifest records.
        expected_size: u64,
        /// Size in bytes on disk.
        actual_size: u64,
        /// sha256 (hex) the manifest records.
        expected_sha256: String,
        /// sha256 (hex) of the bytes on disk.
        actual_sha256: String,
    },

    /// No variant with this id in the manifest.
    #[error("no kernel variant with id {id:?} in {manifest} (known ids: {known})")]
    UnknownVariant {
        /// The id asked for.
        id: String,
        /// The manifest searched.
        manifest: PathBuf,
        /// The ids the manifest does hold, comma-separated.
        known: String,
    },

    /// No variant of this kernel can run on the device's compute capability.
    #[error("no variant of kernel {kernel:?} can run on compute capability {cc_major}.{cc_minor} (variants: {available})")]
    NoVariantForDevice {
        /// The logical kernel name.
        kernel: String,
        /// Device compute capability, major.
        cc_major: u32,
        /// Device compute capability, minor.
        cc_minor: u32,
        /// The variants that exist, with their arch and PTX target, or "none".
        available: String,
    },

    /// A directory given to `import` is not a usable Triton cache entry.
    #[error("Triton cache entry {dir}: {msg}")]
    TritonCacheEntry {
        /// The entry directory.
        dir: PathBuf,
        /// What is missing or malformed, and what was expected.
        msg: String,
    },

    // ---- driver and device (src/device) ----
    /// The CUDA driver library could not be loaded.
    #[error("no CUDA driver found ({lib}): {reason}")]
    NoDriver {
        /// The library looked for.
        lib: &'static str,
        /// The dynamic loader's message.
        reason: String,
    },

    /// A CUDA driver call failed.
    #[error("CUDA driver call failed while {op}: {code}: {msg}")]
    Driver {
        /// What we were doing ("creating a context on device 0", ...).
        op: String,
        /// The CUresult name (`CUDA_ERROR_...`).
        code: String,
        /// The driver's description of the error.
        msg: String,
    },

    /// A PTX file declares a `.version` newer than the installed driver can JIT.
    #[error("{what}: PTX ISA version {ptx} is newer than this driver accepts (CUDA {driver_cuda} driver: PTX ISA <= {driver_max}); update the NVIDIA driver or rebuild the PTX for an older ISA")]
    PtxTooNew {
        /// The kernel variant and file.
        what: String,
        /// The PTX's `.version`.
        ptx: String,
        /// The highest PTX ISA the driver accepts.
        driver_max: String,
        /// The driver's CUDA version (major.minor).
        driver_cuda: String,
    },

    /// A variant's code was built for an architecture the device cannot run.
    #[error("kernel variant {variant}: {target} code cannot run on {device} (compute capability {cc_major}.{cc_minor}); sm_XXa PTX/cubin runs only on exactly that arch, plain sm_XX PTX on cc >= XX")]
    ArchMismatch {
        /// The variant id.
        variant: String,
        /// The PTX target (`sm_90a`, ...).
        target: String,
        /// The device name.
        device: String,
        /// Device compute capability, major.
        cc_major: u32,
        /// Device compute capability, minor.
        cc_minor: u32,
    },

    // ---- JIT and cubin cache (src/jit) ----
    /// The driver failed to JIT a PTX file to a cubin.
    #[error("JIT of {origin} failed: {code}\ndriver log:\n{log}")]
    JitFailed {
        /// Which kernel, file, hash, arch and PTX version.
        origin: Box<CodeOrigin>,
        /// The CUresult name.
        code: String,
        /// The driver's error + info log.
        log: String,
    },

    /// No user cache directory could be determined.
    #[error("no cache directory: set TRITONRT_CACHE_DIR (the platform has no user cache dir)")]
    NoCacheDir,

    // ---- kernel launch (src/kernel) ----
    /// A cubin could not be loaded as a module, or its entry function was not found
    /// (often an arch mismatch, so the message names the arch and PTX version).
    #[error("loading {origin} failed: {code}: {msg}")]
    LoadFailed {
        /// Which kernel, entry, file, hash, arch and PTX version.
        origin: Box<CodeOrigin>,
        /// The CUresult name.
        code: String,
        /// The driver's description.
        msg: String,
    },

    /// Wrong number of launch arguments.
    #[error("kernel {kernel}: expected {expected} arguments ({signature}), got {got}")]
    ArgCount {
        /// The variant id.
        kernel: String,
        /// Arguments in the signature.
        expected: usize,
        /// Arguments given.
        got: usize,
        /// The signature, `name: type` comma-separated.
        signature: String,
    },

    /// A launch argument's type differs from the signature.
    #[error("kernel {kernel}: argument {index} ({name}) expects {expected}, got {got}")]
    ArgType {
        /// The variant id.
        kernel: String,
        /// 0-based position in the signature.
        index: usize,
        /// The argument's name.
        name: String,
        /// The Triton type in the signature (`*fp32`, `i32`, ...).
        expected: String,
        /// What was passed (`I64`, `F32`, `Ptr`, ...).
        got: String,
    },

    /// A launch argument breaks the divisibility the variant was compiled for.
    #[error("kernel {kernel}: argument {index} ({name}) = {value:#x} is not a multiple of {divisibility}, which this variant was compiled to assume (tt.divisibility)")]
    ArgDivisibility {
        /// The variant id.
        kernel: String,
        /// 0-based position in the signature.
        index: usize,
        /// The argument's name.
        name: String,
        /// The value passed (address or integer).
        value: u64,
        /// The required divisor.
        divisibility: u32,
    },

    /// A tensor descriptor argument cannot describe its buffer as the variant needs
    /// (rank, dtype, alignment, strides, extent beyond the buffer, encoding refused).
    #[error("kernel {kernel}: argument {index} ({name}: {ty}): {msg}")]
    ArgDesc {
        /// The variant id.
        kernel: String,
        /// 0-based position in the signature.
        index: usize,
        /// The argument's name.
        name: String,
        /// The descriptor type in the signature (`tensordesc<fp16[64, 64]>`).
        ty: String,
        /// What is wrong and what was expected.
        msg: String,
    },

    /// A kernel needs more shared memory per block than the device offers.
    #[error("kernel {kernel}: needs {requested} bytes of shared memory per block, the device allows at most {max} bytes")]
    SharedMemory {
        /// The variant id.
        kernel: String,
        /// Bytes requested (dynamic + static).
        requested: u64,
        /// Bytes the device allows per block (opt-in maximum).
        max: u64,
    },

    /// A launch was refused before reaching the driver, or the driver refused it.
    #[error("kernel {kernel}: launch failed: {msg}")]
    Launch {
        /// The variant id.
        kernel: String,
        /// Why (grid too large, stream of another context, driver error, ...).
        msg: String,
    },
    /// A device object (a stream, a buffer) was used with an object of another CUDA
    /// device: each device has its own context, kernels and streams, and a launch never
    /// crosses devices.
    #[error(
        "device mismatch: {what} belongs to CUDA device {what_device}, but {with} is on \
         device {with_device}"
    )]
    DeviceMismatch {
        /// The object handed over (`stream`, `query buffer`, ...).
        what: String,
        /// The ordinal of the device `what` belongs to.
        what_device: usize,
        /// What it was used with (`kernel pq_index...`, `the indexer's runtime`, ...).
        with: String,
        /// The ordinal of the device `with` lives on.
        with_device: usize,
    },
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
    pub fn io(op: &'static str, path: impl Into<PathBuf>, cause: std::io::Error) -> Self {
        Error::Io {
            op,
            path: path.into(),
            cause,
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

/// The code a JIT or module load was about, for error messages: the kernel, its entry,
/// the file the bytes came from, their sha256, the device arch and the PTX version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodeOrigin {
    /// The variant id.
    pub kernel: String,
    /// The entry symbol.
    pub entry: String,
    /// The file (manifest cubin, cache entry or PTX).
    pub file: PathBuf,
    /// sha256 of the file's content.
    pub sha256: String,
    /// The device arch compiled / loaded for (e.g. 90).
    pub arch: u32,
    /// The variant's PTX `.version`.
    pub ptx_version: String,
    /// The variant's PTX `.target`.
    pub target: String,
}

impl std::fmt::Display for CodeOrigin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "kernel {} (entry {:?}) from {} (sha256 {}, PTX {} {}) on sm_{}",
            self.kernel,
            self.entry,
            self.file.display(),
            self.sha256,
            self.ptx_version,
            self.target,
            self.arch
        )
    }
}
