//! The cubin for this GPU: the manifest's own cubin when its arch matches the device,
//! otherwise PTX JIT-compiled by the driver and kept in an on-disk cache.
//!
//! Cache layout: `<dir>/<key>.cubin`, `dir` = `$TRITONRT_CACHE_DIR` or
//! `dirs::cache_dir()/tritonrt` (`~/.cache/tritonrt` on Linux). `key` = sha256 over
//! [`CACHE_VERSION`], sha256(PTX), device arch, driver version and the JIT options, so
//! anything that changes the cubin changes the key (entries are immutable; no locks).
//! Each entry is a 48-byte header (magic, payload size, payload sha256) followed by the
//! cubin; a read checks both, and a mismatch is a miss that is rebuilt with one warning
//! on stderr. Writes go to a temp file in the same directory, then a rename, so
//! concurrent writers of one key never leave a torn file.

use std::path::{Path, PathBuf};
use std::time::Instant;

use sha2::{Digest, Sha256};

use crate::artifact::{
    is_arch_specific_target, ptx_header, sha256_hex, write_atomic, ArtifactStore, Variant,
};
use crate::driver::device::Device;
use crate::driver::{BuiltCubin, CacheOutcome};
use crate::error::{CodeOrigin, Error, Result};

/// Version of the cache key and entry format. Bump when the key's inputs change (or the
/// entry layout does): old entries then simply stop being found.
pub const CACHE_VERSION: u32 = 1;

/// Environment variable that overrides the cubin cache directory.
pub const CACHE_DIR_ENV: &str = "TRITONRT_CACHE_DIR";

const MAGIC: &[u8; 8] = b"TRTCUBN1";
const HEADER: usize = 8 + 8 + 32;

/// The cache directory from its inputs (testable without touching the environment): `env`
/// is the value of `TRITONRT_CACHE_DIR` (used when set and non-empty), `user_cache` the
/// platform's user cache directory (then `<user_cache>/tritonrt`). The cubin cache and the
/// tuning table both live there.
///
/// Errors: [`Error::NoCacheDir`] (neither is available).
pub fn cache_dir_from(
    env: Option<std::ffi::OsString>,
    user_cache: Option<PathBuf>,
) -> Result<PathBuf> {
    match env {
        Some(v) if !v.is_empty() => Ok(PathBuf::from(v)),
        _ => user_cache
            .map(|d| d.join("tritonrt"))
            .ok_or(Error::NoCacheDir),
    }
}

/// Options passed to the driver's JIT; part of the cache key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct JitOptions {
    /// `CU_JIT_OPTIMIZATION_LEVEL` 0..=4; `None`: the driver's default (4).
    pub opt_level: Option<u32>,
}

impl JitOptions {
    /// Canonical text of the options, hashed into the cache key.
    pub fn key_text(&self) -> String {
        match self.opt_level {
            Some(o) => format!("opt_level={o}"),
            None => "opt_level=default".to_string(),
        }
    }
}

/// The cache key (64 hex digits) for PTX with sha256 `ptx_sha256` JIT-compiled for
/// `arch` (e.g. 90) by a driver of version `driver_version` (e.g. 13000) with `opts`.
pub fn cache_key(ptx_sha256: &str, arch: u32, driver_version: i32, opts: &JitOptions) -> String {
    let text = format!(
        "tritonrt-cubin-cache\nversion={CACHE_VERSION}\nptx_sha256={ptx_sha256}\narch={arch}\n\
         driver={driver_version}\n{}\n",
        opts.key_text()
    );
    sha256_hex(text.as_bytes())
}

/// The result of reading one cache entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// The entry exists and its size and sha256 match: the cubin bytes.
    Hit(Vec<u8>),
    /// No entry.
    Miss,
    /// An entry exists but fails verification (why).
    Corrupt(String),
}

/// The on-disk cubin cache.
#[derive(Debug, Clone)]
pub struct CubinCache {
    dir: PathBuf,
    opts: JitOptions,
}

impl CubinCache {
    /// A cache in `dir` (created if absent). Errors: [`Error::Io`].
    pub fn new(dir: impl Into<PathBuf>) -> Result<CubinCache> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir).map_err(|e| Error::io("creating", &dir, e))?;
        Ok(CubinCache {
            dir,
            opts: JitOptions::default(),
        })
    }

    /// The default directory: `$TRITONRT_CACHE_DIR`, else `dirs::cache_dir()/tritonrt`.
    /// Errors: [`Error::NoCacheDir`].
    pub fn default_dir() -> Result<PathBuf> {
        cache_dir_from(std::env::var_os(CACHE_DIR_ENV), dirs::cache_dir())
    }

    /// A cache in [`CubinCache::default_dir`].
    pub fn from_env() -> Result<CubinCache> {
        CubinCache::new(CubinCache::default_dir()?)
    }

    /// Use these JIT options (they are part of the key).
    pub fn with_options(mut self, opts: JitOptions) -> CubinCache {
        self.opts = opts;
        self
    }

    /// The JIT options in use.
    pub fn options(&self) -> JitOptions {
        self.opts
    }

    /// The cache directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Path of the entry for `key`.
    pub fn entry_path(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{key}.cubin"))
    }

    /// Read and verify the entry for `key`.
    pub fn lookup(&self, key: &str) -> Lookup {
        let path = self.entry_path(key);
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Lookup::Miss,
            Err(e) => return Lookup::Corrupt(format!("unreadable: {e}")),
        };
        decode_entry(&bytes).map_or_else(Lookup::Corrupt, Lookup::Hit)
    }

    /// Store `cubin` under `key` atomically (temp file + rename). Returns the path.
    pub fn store(&self, key: &str, cubin: &[u8]) -> Result<PathBuf> {
        let path = self.entry_path(key);
        write_atomic(&path, &encode_entry(cubin))?;
        Ok(path)
    }

    /// The entry for `key` if it verifies; otherwise `build()` it, store it and return
    /// it. A corrupt entry prints one warning on stderr and is replaced.
    /// This is the whole storage logic, independent of any GPU (tests pass a dummy
    /// `build`).
    pub fn get_or_insert_with(
        &self,
        key: &str,
        build: impl FnOnce() -> Result<Vec<u8>>,
    ) -> Result<(Vec<u8>, CacheOutcome)> {
        let outcome = match self.lookup(key) {
            Lookup::Hit(b) => return Ok((b, CacheOutcome::Hit)),
            Lookup::Miss => CacheOutcome::Built,
            Lookup::Corrupt(why) => {
                eprintln!(
                    "warning: tritonrt cubin cache entry {} is corrupt ({why}); rebuilding it",
                    self.entry_path(key).display()
                );
                CacheOutcome::Rebuilt
            }
        };
        let cubin = build()?;
        self.store(key, &cubin)?;
        Ok((cubin, outcome))
    }

    /// The cubin of `variant` for `device`: the manifest's cubin when the variant's arch
    /// equals the device's; else the cache entry for its PTX; else the PTX JIT-compiled
    /// by the driver and stored. Every file is verified before use. The PTX `.version`
    /// is checked against the driver before any JIT.
    ///
    /// Errors: [`Error::ArchMismatch`] (arch-specific code for another GPU),
    /// artifact errors (missing/corrupt), [`Error::PtxTooNew`], [`Error::JitFailed`]
    /// (with the driver log), I/O errors writing the cache.
    pub fn get_or_build(
        &self,
        device: &Device,
        store: &ArtifactStore,
        variant: &Variant,
    ) -> Result<BuiltCubin> {
        let t0 = Instant::now();
        let cc = device.cc();
        if !variant.usable_on(cc) {
            return Err(Error::ArchMismatch {
                variant: variant.id.clone(),
                target: variant.ptx_target.clone(),
                device: device.name().to_string(),
                cc_major: cc.0,
                cc_minor: cc.1,
            });
        }
        if variant.cubin_matches(cc) {
            if let (Some(cubin), Some(r)) = (store.read_cubin(variant)?, &variant.cubin) {
                return Ok(BuiltCubin {
                    cubin,
                    outcome: CacheOutcome::ManifestCubin,
                    origin: (store.path_of(r), r.sha256.clone()),
                    elapsed: t0.elapsed(),
                    jit_log: None,
                });
            }
        }
        let key = cache_key(
            &variant.ptx.sha256,
            device.arch(),
            device.driver_version(),
            &self.opts,
        );
        let ptx_path = store.path_of(&variant.ptx);
        let mut jit_log = None;
        let (cubin, outcome) = self.get_or_insert_with(&key, || {
            let ptx = store.read_ptx(variant)?;
            let header = ptx_header(&ptx)
                .map_err(|m| Error::invalid(format!("PTX file {}", ptx_path.display()), m))?;
            if is_arch_specific_target(&header.target)
                && header.target != format!("sm_{}a", device.arch())
            {
                return Err(Error::ArchMismatch {
                    variant: variant.id.clone(),
                    target: header.target.clone(),
                    device: device.name().to_string(),
                    cc_major: cc.0,
                    cc_minor: cc.1,
                });
            }
            device.check_ptx(
                &header,
                &format!("kernel {} ({})", variant.id, ptx_path.display()),
            )?;
            let out = device
                .jit_ptx(&ptx, &variant.ptx.file, self.opts.opt_level)
                .map_err(|f| Error::JitFailed {
                    origin: Box::new(CodeOrigin {
                        kernel: variant.id.clone(),
                        entry: variant.entry.clone(),
                        file: ptx_path.clone(),
                        sha256: variant.ptx.sha256.clone(),
                        arch: device.arch(),
                        ptx_version: header.version.to_string(),
                        target: header.target.clone(),
                    }),
                    code: f.code,
                    log: f.log,
                })?;
            jit_log = Some(out.log);
            Ok(out.cubin)
        })?;
        let origin = if outcome == CacheOutcome::Hit {
            (self.entry_path(&key), sha256_hex(&cubin))
        } else {
            (ptx_path, variant.ptx.sha256.clone())
        };
        Ok(BuiltCubin {
            cubin,
            outcome,
            origin,
            elapsed: t0.elapsed(),
            jit_log,
        })
    }
}

/// Encode a cache entry: magic, payload size (u64 LE), payload sha256, payload.
pub fn encode_entry(cubin: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + cubin.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(cubin.len() as u64).to_le_bytes());
    out.extend_from_slice(&Sha256::digest(cubin));
    out.extend_from_slice(cubin);
    out
}

/// Decode and verify a cache entry; `Err` says what is wrong.
pub fn decode_entry(bytes: &[u8]) -> std::result::Result<Vec<u8>, String> {
    if bytes.len() < HEADER {
        return Err(format!(
            "{} bytes, shorter than the {HEADER}-byte header",
            bytes.len()
        ));
    }
    if &bytes[..8] != MAGIC {
        return Err("bad magic (not a tritonrt cubin cache entry of this version)".to_string());
    }
    let size = u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes"));
    let payload = &bytes[HEADER..];
    if payload.len() as u64 != size {
        return Err(format!(
            "payload is {} bytes, header says {size}",
            payload.len()
        ));
    }
    let actual = Sha256::digest(payload);
    if actual.as_slice() != &bytes[16..48] {
        return Err(format!(
            "payload sha256 {} differs from the recorded {}",
            hex::encode(actual),
            hex::encode(&bytes[16..48])
        ));
    }
    Ok(payload.to_vec())
}
