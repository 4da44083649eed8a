//! Import one entry of Triton's own cache directory (`~/.triton/cache/<hash>/`) into a
//! ptx_cache.
//!
//! Triton's `<name>.json` metadata has no argument signature. The parameter list comes
//! from the PTX `.entry` (authoritative for count and widths; its last two `.u64`
//! parameters are `global_scratch` and `profile_scratch`). When Triton also left its
//! TTIR (`<name>.ttir`, or the `<name>.source` it writes first), the names, pointer
//! element types and `tt.divisibility` are read from the `tt.func` there and checked
//! against the PTX widths. Without TTIR, pointers get element type `*` (unknown) and
//! divisibility 16 (Triton specializes aligned pointers by default, so assuming 16 refuses
//! what the kernel may have been compiled to reject, never the other way round), and
//! integers get divisibility 1 (note: an integer specialized for divisibility 16 cannot be
//! seen in PTX; such an entry should be imported with its TTIR).

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::types::{
    ptx_header, Arg, ArgType, DescType, Dtype, FileRef, Manifest, TmaMeta, Variant, SCHEMA_VERSION,
};
use super::{manifest_to_bytes, parse_manifest, sha256_hex, write_atomic, MANIFEST_FILE};
use crate::abi::{expand_arg, ParamKind};
use crate::error::{Error, Result};

/// Where an imported variant's signature came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignatureSource {
    /// Triton's TTIR (`tt.func`): names, element types and divisibility are exact.
    Ttir,
    /// The PTX `.entry` only: names are `arg<i>`, pointer element types unknown, ints
    /// typed by width (`i32`/`i64`), divisibility assumed as described in the module doc.
    Ptx,
}

/// What [`import_triton_cache_entry`] did.
#[derive(Debug, Clone)]
pub struct ImportReport {
    /// The variant as written into the manifest.
    pub variant: Variant,
    /// False when an identical variant was already there (nothing changed).
    pub added: bool,
    /// Where the signature came from.
    pub signature_source: SignatureSource,
    /// The manifest written.
    pub manifest: PathBuf,
}

/// The fields of Triton 3.6's `<name>.json` we use (it has many more).
#[derive(Debug, Deserialize)]
struct TritonMetadata {
    name: String,
    hash: String,
    target: TritonTarget,
    num_warps: u32,
    num_stages: u32,
    #[serde(default = "one")]
    num_ctas: u32,
    #[serde(default)]
    cluster_dims: Option<[u32; 3]>,
    #[serde(default)]
    shared: u32,
    #[serde(default)]
    global_scratch_size: u32,
    #[serde(default = "one")]
    global_scratch_align: u32,
    #[serde(default)]
    profile_scratch_size: u32,
    #[serde(default = "one")]
    profile_scratch_align: u32,
    #[serde(default)]
    launch_pdl: bool,
    #[serde(default)]
    launch_cooperative_grid: bool,
    #[serde(default)]
    tensordesc_meta: Option<Vec<TmaMeta>>,
    triton_version: String,
}

fn one() -> u32 {
    1
}

#[derive(Debug, Deserialize)]
struct TritonTarget {
    backend: String,
    arch: serde_json::Value,
}

/// Add one Triton cache entry directory to the ptx_cache at `ptx_cache_dir` (created if
/// absent): its PTX (and cubin, if any) are written content-addressed, and a variant is
/// merged into `manifest.json`, which is rewritten atomically. The variant id is
/// `<name>.triton-<first 16 hex of Triton's hash>.w<num_warps>.s<num_stages>.sm<arch>`;
/// it becomes the default of its (kernel, arch) when there is none yet. Importing the
/// same entry twice changes nothing.
///
/// Errors: [`Error::TritonCacheEntry`] (no or several `<name>.json`, not a CUDA entry,
/// malformed PTX, signature mismatch between TTIR and PTX, Triton version differs from
/// the manifest's), I/O and manifest errors.
pub fn import_triton_cache_entry(entry_dir: &Path, ptx_cache_dir: &Path) -> Result<ImportReport> {
    let bad = |msg: String| Error::TritonCacheEntry {
        dir: entry_dir.to_path_buf(),
        msg,
    };
    let (json_path, md) = find_metadata(entry_dir)?;
    // The name picks the files read next to the metadata (`<name>.ptx`, ...): a name with
    // a path separator (`../x`, `/abs/x`) would read files outside the entry directory.
    let plain_name = !md.name.is_empty()
        && !md.name.contains(['/', '\\', '\0'])
        && Path::new(&md.name)
            .file_name()
            .map(|n| n == md.name.as_str())
            == Some(true);
    if !plain_name {
        return Err(bad(format!(
            "{}: kernel name {:?} is not a plain file name (Triton writes <name>.ptx next \
             to <name>.json)",
            json_path.display(),
            md.name
        )));
    }
    if md.target.backend != "cuda" {
        return Err(bad(format!(
            "{}: backend {:?}, expected \"cuda\"",
            json_path.display(),
            md.target.backend
        )));
    }
    let arch = match &md.target.arch {
        serde_json::Value::Number(n) => n.as_u64().map(|a| a as u32),
        serde_json::Value::String(s) => s.trim_start_matches("sm").parse().ok(),
        _ => None,
    }
    .ok_or_else(|| bad(format!("target.arch {} is not a number", md.target.arch)))?;

    let ptx_path = entry_dir.join(format!("{}.ptx", md.name));
    let ptx = std::fs::read(&ptx_path).map_err(|e| {
        bad(format!(
            "reading {}: {e} (Triton writes <name>.ptx next to <name>.json)",
            ptx_path.display()
        ))
    })?;
    let cubin_path = entry_dir.join(format!("{}.cubin", md.name));
    let cubin = match std::fs::read(&cubin_path) {
        Ok(b) => Some(b),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(Error::io("reading", &cubin_path, e)),
    };
    if let Some(c) = &cubin {
        if !c.starts_with(b"\x7fELF") {
            return Err(bad(format!("{} is not an ELF cubin", cubin_path.display())));
        }
    }
    let header = ptx_header(&ptx).map_err(|m| bad(format!("{}: {m}", ptx_path.display())))?;
    let params = parse_ptx_entry_params(&String::from_utf8_lossy(&ptx), &md.name)
        .map_err(|m| bad(format!("{}: {m}", ptx_path.display())))?;
    if params.len() < 2 || params[params.len() - 2..].iter().any(|p| p.bytes != 8) {
        return Err(bad(format!(
            "{}: .entry {} has {} parameters; Triton 3.6 kernels end with two .u64 \
             scratch pointers (global_scratch, profile_scratch)",
            ptx_path.display(),
            md.name,
            params.len()
        )));
    }
    let user_params = &params[..params.len() - 2];

    // `.source` is the frontend's TTIR, before any pass: a host tensor descriptor is still
    // one `!tt.tensordesc` argument there (in `.ttir` an sm_80 compile has already
    // decomposed it into a pointer, shapes and strides).
    let tensordesc_meta = md.tensordesc_meta.clone().unwrap_or_default();
    let ttir = ["source", "ttir"]
        .iter()
        .map(|ext| entry_dir.join(format!("{}.{ext}", md.name)))
        .find_map(|p| std::fs::read_to_string(&p).ok().map(|t| (p, t)));
    let (signature, signature_source) = match ttir {
        Some((path, text)) => {
            let args = parse_ttir_signature(&text, &md.name)
                .map_err(|m| bad(format!("{}: {m}", path.display())))?;
            check_against_ptx(&args, &tensordesc_meta, user_params).map_err(|m| {
                bad(format!(
                    "{} and {} disagree: {m}",
                    path.display(),
                    ptx_path.display()
                ))
            })?;
            (args, SignatureSource::Ttir)
        }
        None => (
            signature_from_ptx(user_params)
                .map_err(|m| bad(format!("{}: {m}", ptx_path.display())))?,
            SignatureSource::Ptx,
        ),
    };
    let n_desc = signature
        .iter()
        .filter(|a| matches!(a.ty, ArgType::TensorDesc(_)))
        .count();
    if !tensordesc_meta.is_empty() && tensordesc_meta.len() != n_desc {
        return Err(bad(format!(
            "{}: tensordesc_meta has {} entries, the signature {} tensor descriptors",
            json_path.display(),
            tensordesc_meta.len(),
            n_desc
        )));
    }

    let hash_prefix: String = md.hash.chars().take(16).collect();
    let ptx_ref = FileRef {
        file: format!("{}.ptx", sha256_hex(&ptx)),
        sha256: sha256_hex(&ptx),
        size: ptx.len() as u64,
    };
    let cubin_ref = cubin.as_ref().map(|c| FileRef {
        file: format!("{}.cubin", sha256_hex(c)),
        sha256: sha256_hex(c),
        size: c.len() as u64,
    });
    let mut variant = Variant {
        id: format!(
            "{}.triton-{hash_prefix}.w{}.s{}.sm{arch}",
            md.name, md.num_warps, md.num_stages
        ),
        kernel: md.name.clone(),
        entry: md.name.clone(),
        source: format!("triton-cache:{}", md.hash),
        source_hash: String::new(),
        signature,
        constexprs: Default::default(),
        num_warps: md.num_warps,
        num_stages: md.num_stages,
        num_ctas: md.num_ctas,
        cluster_dims: md.cluster_dims.unwrap_or([1, 1, 1]),
        shared: md.shared,
        global_scratch_size: md.global_scratch_size,
        global_scratch_align: md.global_scratch_align,
        profile_scratch_size: md.profile_scratch_size,
        profile_scratch_align: md.profile_scratch_align,
        launch_pdl: md.launch_pdl,
        launch_cooperative_grid: md.launch_cooperative_grid,
        tensordesc_meta,
        arch,
        ptx_target: header.target.clone(),
        ptx_version: header.version.to_string(),
        default: false,
        ptx: ptx_ref.clone(),
        cubin: cubin_ref.clone(),
    };

    std::fs::create_dir_all(ptx_cache_dir).map_err(|e| Error::io("creating", ptx_cache_dir, e))?;
    let manifest_path = ptx_cache_dir.join(MANIFEST_FILE);
    let mut manifest = match std::fs::read(&manifest_path) {
        Ok(bytes) => parse_manifest(&manifest_path, &bytes)?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Manifest {
            schema_version: SCHEMA_VERSION,
            triton_version: md.triton_version.clone(),
            variants: Vec::new(),
        },
        Err(e) => return Err(Error::io("reading", &manifest_path, e)),
    };
    if manifest.triton_version != md.triton_version {
        return Err(bad(format!(
            "compiled by Triton {}, but {} holds Triton {} artifacts (the launch ABI \
             depends on the Triton version)",
            md.triton_version,
            manifest_path.display(),
            manifest.triton_version
        )));
    }
    if let Some(other) = manifest
        .variants
        .iter()
        .find(|v| v.kernel == variant.kernel && v.signature != variant.signature)
    {
        return Err(bad(format!(
            "kernel {} already exists in {} with another signature ({}) than this entry ({})",
            variant.kernel,
            manifest_path.display(),
            other.signature_string(),
            variant.signature_string()
        )));
    }

    // Content-addressed files first, so the manifest never names a file not yet there.
    put_file(ptx_cache_dir, &ptx_ref, &ptx)?;
    if let (Some(r), Some(c)) = (&cubin_ref, &cubin) {
        put_file(ptx_cache_dir, r, c)?;
    }

    let existing = manifest.variants.iter().position(|v| v.id == variant.id);
    let has_default = manifest
        .variants
        .iter()
        .any(|v| v.kernel == variant.kernel && v.arch == arch && v.default && v.id != variant.id);
    variant.default = match existing {
        Some(i) => manifest.variants[i].default,
        None => !has_default,
    };
    let added = match existing {
        Some(i) if manifest.variants[i] == variant => false,
        Some(i) => {
            manifest.variants[i] = variant.clone();
            true
        }
        None => {
            manifest.variants.push(variant.clone());
            true
        }
    };
    if added {
        super::validate_manifest(&manifest).map_err(|msg| Error::ManifestInvalid {
            path: manifest_path.clone(),
            msg,
        })?;
        write_atomic(&manifest_path, &manifest_to_bytes(&manifest)?)?;
    }
    Ok(ImportReport {
        variant,
        added,
        signature_source,
        manifest: manifest_path,
    })
}

fn put_file(dir: &Path, r: &FileRef, bytes: &[u8]) -> Result<()> {
    let path = dir.join(&r.file);
    if let Ok(existing) = std::fs::read(&path) {
        if existing == bytes {
            return Ok(());
        }
    }
    write_atomic(&path, bytes)
}

fn find_metadata(dir: &Path) -> Result<(PathBuf, TritonMetadata)> {
    let bad = |msg: String| Error::TritonCacheEntry {
        dir: dir.to_path_buf(),
        msg,
    };
    let rd = std::fs::read_dir(dir).map_err(|e| Error::io("listing", dir, e))?;
    let mut found = Vec::new();
    for entry in rd {
        let entry = entry.map_err(|e| Error::io("listing", dir, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.ends_with(".json") || name.starts_with("__grp__") {
            continue;
        }
        let path = entry.path();
        let bytes = std::fs::read(&path).map_err(|e| Error::io("reading", &path, e))?;
        let md: TritonMetadata = serde_json::from_slice(&bytes).map_err(|e| Error::Json {
            path: path.clone(),
            what: "Triton kernel metadata",
            cause: e,
        })?;
        found.push((path, md));
    }
    match found.len() {
        1 => Ok(found.pop().expect("one element")),
        0 => Err(bad(
            "no <name>.json metadata file (expected one entry directory of Triton's cache, \
             e.g. ~/.triton/cache/<hash>/)"
                .to_string(),
        )),
        n => Err(bad(format!(
            "{n} metadata files ({}); expected exactly one",
            found
                .iter()
                .map(|(p, _)| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

/// One parameter of a PTX `.entry`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PtxParam {
    /// The PTX type token (`.u64`, `.f32`, ...).
    pub ty: String,
    /// Declared with `.ptr` (Triton marks pointer parameters so).
    pub is_ptr: bool,
    /// Size in bytes.
    pub bytes: usize,
    /// Declared as a byte array (`.param .align A .b8 p[N]`): fp16 / bf16 scalars (N = 2)
    /// and TMA descriptors (N = 128).
    pub aggregate: bool,
}

/// Parse the parameter list of `.entry <name>(...)`.
pub(crate) fn parse_ptx_entry_params(
    ptx: &str,
    name: &str,
) -> std::result::Result<Vec<PtxParam>, String> {
    let start = ptx
        .match_indices(".entry")
        .find_map(|(i, _)| {
            let rest = ptx[i + ".entry".len()..].trim_start();
            let rest = rest.strip_prefix(name)?;
            let rest_trim = rest.trim_start();
            rest_trim
                .starts_with('(')
                .then(|| ptx.len() - rest_trim.len() + 1)
        })
        .ok_or_else(|| format!("no .entry {name}( in the PTX"))?;
    let end = ptx[start..]
        .find(')')
        .ok_or_else(|| format!(".entry {name}: unterminated parameter list"))?;
    let list = &ptx[start..start + end];
    let mut out = Vec::new();
    for (i, decl) in list.split(',').enumerate() {
        let decl = decl.trim();
        if decl.is_empty() {
            continue;
        }
        let toks: Vec<&str> = decl.split_whitespace().collect();
        if toks.first() != Some(&".param") {
            return Err(format!("parameter {i}: {decl:?} is not a .param"));
        }
        if let Some(open) = decl.find('[') {
            // `.param .align A .b8 name[N]`: N bytes passed by value.
            let n = decl[open + 1..]
                .strip_suffix(']')
                .and_then(|n| n.trim().parse::<usize>().ok())
                .filter(|&n| n > 0 && toks.contains(&".b8"))
                .ok_or_else(|| {
                    format!("parameter {i}: {decl:?}: expected .param .align A .b8 name[N]")
                })?;
            out.push(PtxParam {
                ty: ".b8".to_string(),
                is_ptr: false,
                bytes: n,
                aggregate: true,
            });
            continue;
        }
        let ty = toks
            .iter()
            .skip(1)
            .find(|t| {
                matches!(
                    **t,
                    ".u8"
                        | ".u16"
                        | ".u32"
                        | ".u64"
                        | ".s8"
                        | ".s16"
                        | ".s32"
                        | ".s64"
                        | ".b8"
                        | ".b16"
                        | ".b32"
                        | ".b64"
                        | ".f16"
                        | ".f32"
                        | ".f64"
                        | ".pred"
                )
            })
            .ok_or_else(|| format!("parameter {i}: no scalar type in {decl:?}"))?;
        let bytes = match &ty[2..] {
            "8" | "red" => 1,
            "16" => 2,
            "32" => 4,
            _ => 8,
        };
        out.push(PtxParam {
            ty: ty.to_string(),
            is_ptr: toks.contains(&".ptr"),
            bytes,
            aggregate: false,
        });
    }
    Ok(out)
}

fn signature_from_ptx(params: &[PtxParam]) -> std::result::Result<Vec<Arg>, String> {
    params
        .iter()
        .enumerate()
        .map(|(i, p)| {
            if p.aggregate {
                return Err(format!(
                    "parameter {i} is a {}-byte .b8 array ({}); the PTX alone cannot say \
                     which type it holds: import the entry with Triton's <name>.source or \
                     <name>.ttir next to it",
                    p.bytes,
                    match p.bytes {
                        2 => "an fp16 or bf16 scalar",
                        128 => "a TMA descriptor",
                        _ => "an aggregate",
                    }
                ));
            }
            let ty = if p.is_ptr {
                ArgType::Ptr(None)
            } else {
                ArgType::Scalar(match p.ty.as_str() {
                    ".f32" => Dtype::Fp32,
                    ".f64" => Dtype::Fp64,
                    ".f16" => Dtype::Fp16,
                    ".pred" => Dtype::I1,
                    t if t.ends_with("64") => Dtype::I64,
                    t if t.ends_with("32") => Dtype::I32,
                    t if t.ends_with("16") => Dtype::I16,
                    _ => Dtype::I8,
                })
            };
            Ok(Arg {
                name: format!("arg{i}"),
                ty,
                divisibility: if p.is_ptr { 16 } else { 1 },
            })
        })
        .collect()
}

/// Whether PTX parameter `p` can hold kernel parameter `k`.
fn ptx_param_fits(k: ParamKind, p: &PtxParam) -> bool {
    match k {
        ParamKind::Ptr => p.is_ptr && p.bytes == 8,
        ParamKind::TmaDesc => p.aggregate && p.bytes == 128,
        // fp16 / bf16 are declared as 2-byte arrays; every other scalar by its width.
        ParamKind::Scalar(d @ (Dtype::Fp16 | Dtype::Bf16)) => {
            !p.is_ptr && p.bytes == d.size_bytes()
        }
        ParamKind::Scalar(d) => !p.is_ptr && !p.aggregate && p.bytes == d.size_bytes(),
    }
}

fn check_against_ptx(
    args: &[Arg],
    metas: &[TmaMeta],
    params: &[PtxParam],
) -> std::result::Result<(), String> {
    let mut metas = metas.iter();
    let mut expanded = Vec::new();
    for a in args {
        let meta = match a.ty {
            ArgType::TensorDesc(_) => metas.next(),
            _ => None,
        };
        expanded.extend(expand_arg(a.ty, meta).into_iter().map(|k| (a, k)));
    }
    if expanded.len() != params.len() {
        return Err(format!(
            "the TTIR's {} arguments make {} kernel parameters, the PTX .entry has {} \
             (+2 scratch pointers)",
            args.len(),
            expanded.len(),
            params.len()
        ));
    }
    for (i, ((a, k), p)) in expanded.iter().zip(params).enumerate() {
        if !ptx_param_fits(*k, p) {
            return Err(format!(
                "parameter {i} (of argument {}: {}): expected {k:?} ({} bytes) but the PTX \
                 declares {}{} ({} bytes)",
                a.name,
                a.ty,
                k.bytes(),
                if p.aggregate { ".b8 array" } else { &p.ty },
                if p.is_ptr { " .ptr" } else { "" },
                p.bytes
            ));
        }
    }
    Ok(())
}

/// Parse the arguments of `tt.func public @<name>(...)` in Triton's TTIR.
pub(crate) fn parse_ttir_signature(
    text: &str,
    name: &str,
) -> std::result::Result<Vec<Arg>, String> {
    let needle = format!("@{name}(");
    let start = text
        .lines()
        .filter(|l| l.contains("tt.func"))
        .find_map(|l| l.find(&needle).map(|i| (l, i + needle.len())))
        .ok_or_else(|| format!("no tt.func @{name}( in the TTIR"))?;
    let (line, from) = start;
    // Split the argument list at top-level commas; stop at the closing parenthesis.
    let mut depth = 0i32;
    let mut in_str = false;
    let mut args = Vec::new();
    let mut cur = String::new();
    let mut closed = false;
    for c in line[from..].chars() {
        if in_str {
            cur.push(c);
            if c == '"' {
                in_str = false;
            }
            continue;
        }
        match c {
            '"' => {
                in_str = true;
                cur.push(c);
            }
            '(' | '{' | '<' | '[' => {
                depth += 1;
                cur.push(c);
            }
            ')' if depth == 0 => {
                closed = true;
                break;
            }
            ')' | '}' | '>' | ']' => {
                depth -= 1;
                cur.push(c);
            }
            ',' if depth == 0 => args.push(std::mem::take(&mut cur)),
            _ => cur.push(c),
        }
    }
    if !closed {
        return Err(format!("tt.func @{name}: unterminated argument list"));
    }
    if !cur.trim().is_empty() {
        args.push(cur);
    }
    let parsed = args
        .iter()
        .enumerate()
        .map(|(i, a)| parse_ttir_arg(i, a.trim()))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    // Triton's frontend follows each host tensor descriptor with its shape (i32s) and
    // strides (i64s) as extra arguments of the same name: fold them into the descriptor.
    let mut out = Vec::with_capacity(parsed.len());
    let mut it = parsed.into_iter().enumerate();
    while let Some((i, a)) = it.next() {
        if let ArgType::TensorDesc(t) = a.ty {
            let n = t.ndim();
            for j in 0..2 * n {
                let want = if j < n { Dtype::I32 } else { Dtype::I64 };
                match it.next() {
                    Some((_, b)) if b.ty == ArgType::Scalar(want) => {}
                    other => {
                        return Err(format!(
                            "argument {i} ({}: {}) must be followed by {n} i32 shapes and {n} \
                             i64 strides; found {}",
                            a.name,
                            a.ty,
                            other.map_or("the end of the list".to_string(), |(_, b)| format!(
                                "{}: {}",
                                b.name, b.ty
                            ))
                        ))
                    }
                }
            }
        }
        out.push(a);
    }
    Ok(out)
}

fn parse_ttir_arg(i: usize, a: &str) -> std::result::Result<Arg, String> {
    let bad = || format!("argument {i}: cannot parse {a:?}");
    let rest = a.strip_prefix('%').ok_or_else(bad)?;
    let (ssa, rest) = rest.split_once(':').ok_or_else(bad)?;
    let rest = rest.trim_start();
    let ty_end = rest.find([' ', '{']).unwrap_or(rest.len());
    let ty_str = &rest[..ty_end];
    let ty = if let Some(inner) = ty_str.strip_prefix("!tt.tensordesc<tensor<") {
        // `!tt.tensordesc<tensor<64x64xf16>>` (maybe `tensor<64x64xf16, #layout>`)
        let inner = inner.split([',', '>']).next().unwrap_or("");
        let mut dims: Vec<&str> = inner.split('x').collect();
        let elem = dims.pop().unwrap_or("");
        let block = dims
            .iter()
            .map(|d| d.parse::<u32>())
            .collect::<std::result::Result<Vec<_>, _>>()
            .ok();
        let dtype = mlir_dtype(elem);
        match (
            dtype,
            block.and_then(|b| dtype.and_then(|d| DescType::new(d, &b))),
        ) {
            (Some(_), Some(t)) => ArgType::TensorDesc(t),
            _ => {
                return Err(format!(
                    "argument {i} ({ssa}): unsupported tensor descriptor type {ty_str:?}"
                ))
            }
        }
    } else if let Some(inner) = ty_str.strip_prefix("!tt.ptr<") {
        let elem = inner.trim_end_matches('>').split(',').next().unwrap_or("");
        ArgType::Ptr(mlir_dtype(elem.trim()))
    } else {
        ArgType::Scalar(mlir_dtype(ty_str).ok_or_else(|| {
            format!("argument {i} ({ssa}): unsupported TTIR scalar type {ty_str:?}")
        })?)
    };
    let divisibility = a
        .find("tt.divisibility =")
        .and_then(|p| {
            a[p + "tt.divisibility =".len()..]
                .split_whitespace()
                .next()
                .and_then(|n| n.parse().ok())
        })
        .unwrap_or(1);
    // Prefer the Python argument name Triton records as a location (`loc("x_ptr"(...))`).
    let name = a
        .find("loc(\"")
        .and_then(|p| a[p + 5..].split('"').next())
        .filter(|n| !n.is_empty())
        .unwrap_or(ssa.trim())
        .to_string();
    Ok(Arg {
        name,
        ty,
        divisibility,
    })
}

fn mlir_dtype(s: &str) -> Option<Dtype> {
    Some(match s {
        "i1" => Dtype::I1,
        "i8" => Dtype::I8,
        "i16" => Dtype::I16,
        "i32" => Dtype::I32,
        "i64" => Dtype::I64,
        "f16" => Dtype::Fp16,
        "bf16" => Dtype::Bf16,
        "f32" => Dtype::Fp32,
        "f64" => Dtype::Fp64,
        "f8E4M3FN" => Dtype::Fp8E4Nv,
        "f8E5M2" => Dtype::Fp8E5,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttir_args_with_nested_locs_and_attrs() {
        let t = r#"  tt.func public @k(%x_ptr: !tt.ptr<f16> {tt.divisibility = 16 : i32, tt.pointer_range = 32 : i32} loc("x_ptr"(#loc)), %arg1: i64 loc("n"(#loc)), %arg2: f32) attributes {noinline = false} {"#;
        let a = parse_ttir_signature(t, "k").unwrap();
        assert_eq!(a.len(), 3);
        assert_eq!(a[0].name, "x_ptr");
        assert_eq!(a[0].ty, ArgType::Ptr(Some(Dtype::Fp16)));
        assert_eq!(a[0].divisibility, 16);
        assert_eq!(a[1].name, "n");
        assert_eq!(a[1].ty, ArgType::Scalar(Dtype::I64));
        assert_eq!(a[1].divisibility, 1);
        assert_eq!(a[2].name, "arg2");
        assert_eq!(a[2].ty, ArgType::Scalar(Dtype::Fp32));
    }

    #[test]
    fn ptx_params() {
        let p = ".visible .entry k(\n\t.param .u64 .ptr .global .align 1 k_param_0,\n\t.param .f32 k_param_1,\n\t.param .u32 k_param_2\n)\n";
        let v = parse_ptx_entry_params(p, "k").unwrap();
        assert_eq!(v.len(), 3);
        assert!(v[0].is_ptr && v[0].bytes == 8);
        assert!(!v[1].is_ptr && v[1].bytes == 4 && v[1].ty == ".f32");
        assert!(parse_ptx_entry_params(p, "other").is_err());
    }
}
