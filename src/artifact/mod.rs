//! The verified artifact store: `ptx_cache/manifest.json` plus the content-addressed
//! PTX / cubin files it names (schema: `kernels_triton/MANIFEST.md`).
//!
//! Every file is checked (size, then sha256) before its bytes are returned: a missing,
//! truncated or altered file is an error naming the file and the expected and actual
//! size and hash, and is never loaded. The store also imports one entry of Triton's own
//! cache directory ([`import_triton_cache_entry`]).

use std::collections::{BTreeMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

mod import;
mod ptx;
mod types;

pub use import::{import_triton_cache_entry, ImportReport, SignatureSource};
pub use ptx::{check_ptx_version, cuda_version_of, ptx_isa_max_for_cuda};
pub use types::{
    is_arch_specific_target, ptx_header, Arg, ArgType, DescType, Dtype, FileRef, Manifest,
    PtxHeader, PtxVersion, TmaMeta, Variant, SCHEMA_VERSION,
};

/// File name of the manifest inside a ptx_cache directory.
pub const MANIFEST_FILE: &str = "manifest.json";

/// sha256 of `bytes` as 64 lowercase hex digits.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Write `bytes` to `path` atomically: a temporary file in the same directory, flushed
/// and synced, then renamed over `path` (on Unix with the replaced file's permissions,
/// else `rw-r--r--`). On any failure the temporary file is removed
/// and `path` is untouched: readers see the old file or the new one, never a partial one.
/// Errors: [`Error::Io`] naming the path and the operation.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let mut builder = tempfile::Builder::new();
    builder.prefix(".tritonrt-").suffix(".tmp");
    // A temporary file is private (0600); the result should look like any other output
    // file: keep the permissions of the file it replaces, else rw-r--r--.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let perms = std::fs::metadata(path)
            .ok()
            .filter(|m| m.is_file())
            .map(|m| m.permissions())
            .unwrap_or_else(|| std::fs::Permissions::from_mode(0o644));
        builder.permissions(perms);
    }
    let mut tmp = builder
        .tempfile_in(&dir)
        .map_err(|e| Error::io("creating a temporary file in", &dir, e))?;
    tmp.write_all(bytes)
        .and_then(|_| tmp.flush())
        .and_then(|_| tmp.as_file().sync_all())
        .map_err(|e| Error::io("writing", tmp.path().to_path_buf(), e))?;
    tmp.persist(path)
        .map_err(|e| Error::io("renaming the temporary file onto", path, e.error))?;
    Ok(())
}

/// Read `dir/file_ref.file` and check its size and sha256 against the record. Returns
/// the bytes only when both match.
///
/// Errors: [`Error::ArtifactMissing`] (file absent or unreadable),
/// [`Error::ArtifactCorrupt`] (size or hash differs: names expected and actual of both).
pub fn read_verified(dir: &Path, file_ref: &FileRef) -> Result<Vec<u8>> {
    let path = dir.join(&file_ref.file);
    let missing = |source| Error::ArtifactMissing {
        file: path.clone(),
        expected_size: file_ref.size,
        expected_sha256: file_ref.sha256.clone(),
        cause: source,
    };
    let bytes = std::fs::read(&path).map_err(missing)?;
    let actual_size = bytes.len() as u64;
    let actual_sha256 = sha256_hex(&bytes);
    if actual_size != file_ref.size || actual_sha256 != file_ref.sha256 {
        return Err(Error::ArtifactCorrupt {
            file: path,
            expected_size: file_ref.size,
            actual_size,
            expected_sha256: file_ref.sha256.clone(),
            actual_sha256,
        });
    }
    Ok(bytes)
}

/// A ptx_cache directory with its validated manifest.
#[derive(Debug, Clone)]
pub struct ArtifactStore {
    dir: PathBuf,
    manifest: Manifest,
}

impl ArtifactStore {
    /// Open `dir/manifest.json` and validate it: the schema version, unique ids, exactly
    /// one default per (kernel, arch), one signature per kernel, known argument types,
    /// plain file names, well-formed hashes. Files are verified when read, not here
    /// ([`ArtifactStore::verify_all`] checks them all).
    ///
    /// Errors: [`Error::Io`] (no manifest), [`Error::Json`], [`Error::ManifestSchema`],
    /// [`Error::ManifestInvalid`].
    pub fn open(dir: impl AsRef<Path>) -> Result<ArtifactStore> {
        let dir = dir.as_ref().to_path_buf();
        let path = dir.join(MANIFEST_FILE);
        let text = std::fs::read(&path).map_err(|e| Error::io("reading", &path, e))?;
        let manifest = parse_manifest(&path, &text)?;
        Ok(ArtifactStore { dir, manifest })
    }

    /// The ptx_cache directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Path of the manifest file.
    pub fn manifest_path(&self) -> PathBuf {
        self.dir.join(MANIFEST_FILE)
    }

    /// The parsed manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// All variants in manifest order.
    pub fn all_variants(&self) -> &[Variant] {
        &self.manifest.variants
    }

    /// The PTX of a variant, verified (size then sha256) before it is returned.
    pub fn read_ptx(&self, v: &Variant) -> Result<Vec<u8>> {
        read_verified(&self.dir, &v.ptx)
    }

    /// The cubin of a variant, verified; `Ok(None)` when the variant carries no cubin.
    pub fn read_cubin(&self, v: &Variant) -> Result<Option<Vec<u8>>> {
        v.cubin
            .as_ref()
            .map(|c| read_verified(&self.dir, c))
            .transpose()
    }

    /// Path of a file named by the manifest.
    pub fn path_of(&self, f: &FileRef) -> PathBuf {
        self.dir.join(&f.file)
    }

    /// Every distinct file the manifest names, in manifest order.
    pub fn files(&self) -> Vec<&FileRef> {
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        for v in &self.manifest.variants {
            for f in std::iter::once(&v.ptx).chain(v.cubin.as_ref()) {
                if seen.insert(f.file.as_str()) {
                    out.push(f);
                }
            }
        }
        out
    }

    /// Check every file's size and sha256; returns each bad file with its error (empty:
    /// all good).
    pub fn verify_all(&self) -> Vec<(PathBuf, Error)> {
        self.files()
            .into_iter()
            .filter_map(|f| {
                read_verified(&self.dir, f)
                    .err()
                    .map(|e| (self.path_of(f), e))
            })
            .collect()
    }

    /// The variants of a logical kernel, in manifest order.
    pub fn variants(&self, kernel: &str) -> Vec<&Variant> {
        self.manifest
            .variants
            .iter()
            .filter(|v| v.kernel == kernel)
            .collect()
    }

    /// The variant with this id. Errors: [`Error::UnknownVariant`].
    pub fn variant(&self, id: &str) -> Result<&Variant> {
        self.manifest
            .variants
            .iter()
            .find(|v| v.id == id)
            .ok_or_else(|| Error::UnknownVariant {
                id: id.to_string(),
                manifest: self.manifest_path(),
                known: self.list_ids(|_| true),
            })
    }

    /// The default variant of (kernel, arch), if any.
    pub fn default_for(&self, kernel: &str, arch: u32) -> Option<&Variant> {
        self.manifest
            .variants
            .iter()
            .find(|v| v.kernel == kernel && v.arch == arch && v.default)
    }

    /// The best default variant of `kernel` for a device of compute capability `cc`:
    /// the arch-specific one of exactly that arch if present (sm_90a on cc 9.0, with its
    /// cubin), else the portable PTX of the highest arch <= the device's (sm_80 PTX,
    /// which any cc >= 8.0 can JIT).
    ///
    /// Errors: [`Error::NoVariantForDevice`] listing the variants that exist.
    pub fn select_for_device(&self, kernel: &str, cc: (u32, u32)) -> Result<&Variant> {
        self.manifest
            .variants
            .iter()
            .filter(|v| v.kernel == kernel && v.default && v.usable_on(cc))
            .max_by_key(|v| (v.arch, is_arch_specific_target(&v.ptx_target)))
            .ok_or_else(|| Error::NoVariantForDevice {
                kernel: kernel.to_string(),
                cc_major: cc.0,
                cc_minor: cc.1,
                available: {
                    let s: Vec<String> = self
                        .variants(kernel)
                        .iter()
                        .map(|v| format!("{} ({})", v.id, v.ptx_target))
                        .collect();
                    if s.is_empty() {
                        "none".to_string()
                    } else {
                        s.join(", ")
                    }
                },
            })
    }

    fn list_ids(&self, keep: impl Fn(&Variant) -> bool) -> String {
        let ids: Vec<&str> = self
            .manifest
            .variants
            .iter()
            .filter(|v| keep(v))
            .map(|v| v.id.as_str())
            .collect();
        if ids.is_empty() {
            "none".to_string()
        } else {
            ids.join(", ")
        }
    }
}

/// The variants to load ahead (`tritonrt warmup`) on a GPU of compute capability `cc`, and those it
/// skips: with `all`, every variant usable there; else, per kernel, only the variants of
/// the newest arch usable there (the runtime's default and every tuning candidate come
/// from that arch, so an older arch's PTX is never loaded where a native variant exists).
pub fn partition_for_device(
    variants: &[Variant],
    cc: (u32, u32),
    all: bool,
) -> (Vec<&Variant>, Vec<&Variant>) {
    let mut best: std::collections::HashMap<&str, u32> = std::collections::HashMap::new();
    for v in variants.iter().filter(|v| v.usable_on(cc)) {
        let b = best.entry(v.kernel.as_str()).or_insert(v.arch);
        *b = (*b).max(v.arch);
    }
    variants
        .iter()
        .partition(|v| v.usable_on(cc) && (all || best.get(v.kernel.as_str()) == Some(&v.arch)))
}

/// Parse and validate manifest bytes (see [`ArtifactStore::open`]); `path` is only used
/// in messages.
pub fn parse_manifest(path: &Path, bytes: &[u8]) -> Result<Manifest> {
    // Read the schema version first, so a future schema gets a version error rather
    // than a confusing field error.
    let value: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| Error::Json {
        path: path.to_path_buf(),
        what: "ptx_cache manifest",
        cause: e,
    })?;
    let found = value.get("schema_version").and_then(|v| v.as_u64());
    match found {
        Some(v) if v == SCHEMA_VERSION as u64 => {}
        Some(v) => {
            return Err(Error::ManifestSchema {
                path: path.to_path_buf(),
                found: v.min(u32::MAX as u64) as u32,
                expected: SCHEMA_VERSION,
            })
        }
        None => {
            return Err(Error::ManifestInvalid {
                path: path.to_path_buf(),
                msg: "no integer schema_version field".to_string(),
            })
        }
    }
    let manifest: Manifest = serde_json::from_value(value).map_err(|e| Error::Json {
        path: path.to_path_buf(),
        what: "ptx_cache manifest",
        cause: e,
    })?;
    validate_manifest(&manifest).map_err(|msg| Error::ManifestInvalid {
        path: path.to_path_buf(),
        msg,
    })?;
    Ok(manifest)
}

/// Check the rules of `MANIFEST.md` that serde cannot; returns the first violation.
pub fn validate_manifest(m: &Manifest) -> std::result::Result<(), String> {
    let mut ids = HashSet::new();
    let mut defaults: BTreeMap<(&str, u32), Vec<&str>> = BTreeMap::new();
    let mut signatures: BTreeMap<&str, (&str, &Vec<Arg>)> = BTreeMap::new();
    let mut files: BTreeMap<&str, &FileRef> = BTreeMap::new();
    for v in &m.variants {
        let id = v.id.as_str();
        if id.is_empty() || v.kernel.is_empty() || v.entry.is_empty() {
            return Err(format!(
                "variant {id:?}: id, kernel and entry must be non-empty"
            ));
        }
        if !ids.insert(id) {
            return Err(format!("duplicate variant id {id:?}"));
        }
        if v.num_warps == 0 || v.num_warps > 32 {
            return Err(format!(
                "variant {id}: num_warps {} outside 1..=32",
                v.num_warps
            ));
        }
        if v.num_ctas == 0 || v.num_ctas > 16 {
            return Err(format!(
                "variant {id}: num_ctas {} outside 1..=16",
                v.num_ctas
            ));
        }
        let cl = v.cluster_dims;
        if v.num_ctas > 1 && cl != [v.num_ctas, 1, 1] && cl != [1, 1, 1] {
            return Err(format!(
                "variant {id}: cluster_dims {cl:?} with num_ctas {}: expected [{}, 1, 1]",
                v.num_ctas, v.num_ctas
            ));
        }
        if cl.contains(&0) || cl.iter().product::<u32>() > 16 {
            return Err(format!(
                "variant {id}: cluster_dims {cl:?}: each at least 1, at most 16 CTAs in all"
            ));
        }
        for (what, align) in [
            ("global_scratch_align", v.global_scratch_align),
            ("profile_scratch_align", v.profile_scratch_align),
        ] {
            if align == 0 || !align.is_power_of_two() {
                return Err(format!(
                    "variant {id}: {what} {align} is not a power of two"
                ));
            }
        }
        if PtxVersion::parse(&v.ptx_version).is_none() {
            return Err(format!(
                "variant {id}: ptx_version {:?} is not major.minor",
                v.ptx_version
            ));
        }
        if !v.ptx_target.starts_with("sm_") {
            return Err(format!(
                "variant {id}: ptx_target {:?} is not sm_XX[a]",
                v.ptx_target
            ));
        }
        for (i, a) in v.signature.iter().enumerate() {
            if a.divisibility == 0 || !a.divisibility.is_power_of_two() {
                return Err(format!(
                    "variant {id}: argument {i} ({}) divisibility {} is not a power of two",
                    a.name, a.divisibility
                ));
            }
        }
        let descs: Vec<&Arg> = v
            .signature
            .iter()
            .filter(|a| matches!(a.ty, ArgType::TensorDesc(_)))
            .collect();
        if !v.tensordesc_meta.is_empty() && v.tensordesc_meta.len() != descs.len() {
            return Err(format!(
                "variant {id}: {} tensordesc_meta entries for {} tensor descriptor arguments \
                 (expected one per descriptor, or none)",
                v.tensordesc_meta.len(),
                descs.len()
            ));
        }
        for (a, m) in descs.iter().zip(&v.tensordesc_meta) {
            if let ArgType::TensorDesc(t) = a.ty {
                if m.block_size.len() != t.ndim() || m.block_size.contains(&0) {
                    return Err(format!(
                        "variant {id}: argument {} ({}): tensordesc_meta block_size {:?} \
                         does not have its {} dimensions",
                        a.name,
                        a.ty,
                        m.block_size,
                        t.ndim()
                    ));
                }
            }
        }
        for f in std::iter::once(&v.ptx).chain(v.cubin.as_ref()) {
            check_file_ref(id, f)?;
            if let Some(prev) = files.insert(&f.file, f) {
                if prev != f {
                    return Err(format!(
                        "variant {id}: file {} recorded twice with different sha256/size",
                        f.file
                    ));
                }
            }
        }
        if v.default {
            defaults.entry((&v.kernel, v.arch)).or_default().push(id);
        }
        match signatures.get(v.kernel.as_str()) {
            Some((first, sig)) if *sig != &v.signature => {
                return Err(format!(
                    "kernel {}: variants {first} and {id} have different signatures \
                     (all variants of one kernel must share it)",
                    v.kernel
                ));
            }
            Some(_) => {}
            None => {
                signatures.insert(&v.kernel, (id, &v.signature));
            }
        }
    }
    let mut pairs: BTreeMap<(&str, u32), ()> = BTreeMap::new();
    for v in &m.variants {
        pairs.insert((&v.kernel, v.arch), ());
    }
    for (kernel, arch) in pairs.keys() {
        match defaults.get(&(*kernel, *arch)).map(Vec::as_slice) {
            Some([_]) => {}
            None | Some([]) => {
                return Err(format!(
                    "kernel {kernel} arch {arch}: no default variant (expected exactly one \"default\": true)"
                ))
            }
            Some(many) => {
                return Err(format!(
                    "kernel {kernel} arch {arch}: {} default variants ({}), expected exactly one",
                    many.len(),
                    many.join(", ")
                ))
            }
        }
    }
    Ok(())
}

fn check_file_ref(id: &str, f: &FileRef) -> std::result::Result<(), String> {
    let plain = !f.file.is_empty()
        && !f.file.starts_with('.')
        && !f.file.contains(['/', '\\'])
        && Path::new(&f.file).file_name().map(|n| n == f.file.as_str()) == Some(true);
    if !plain {
        return Err(format!(
            "variant {id}: file {:?} is not a plain file name inside the ptx_cache",
            f.file
        ));
    }
    if f.sha256.len() != 64
        || !f
            .sha256
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return Err(format!(
            "variant {id}: file {}: sha256 {:?} is not 64 lowercase hex digits",
            f.file, f.sha256
        ));
    }
    Ok(())
}

/// Serialize a manifest the way `build.py` does: keys sorted, 2-space indent, trailing
/// newline (so rewriting an unchanged manifest is byte-identical).
pub fn manifest_to_bytes(m: &Manifest) -> Result<Vec<u8>> {
    // serde_json::Value's map is a BTreeMap (no preserve_order feature): sorted keys.
    let value = serde_json::to_value(m).map_err(|e| Error::invalid("manifest", e.to_string()))?;
    let mut out =
        serde_json::to_vec_pretty(&value).map_err(|e| Error::invalid("manifest", e.to_string()))?;
    out.push(b'\n');
    Ok(out)
}
