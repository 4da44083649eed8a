//! Typed Rust launchers generated from a ptx_cache manifest (pure text generation; no
//! GPU): one function per logical kernel whose parameters carry the signature's types, so
//! the compiler checks element types and scalar kinds, and the launch checks the rest at
//! run time (each pointer's and integer's divisibility, each tensor descriptor's shape,
//! strides and alignment, and that the loaded variant still has this signature).
//!
//! For kernel `add_kernel(x_ptr: *fp32, out_ptr: *fp32, n: i32)` it writes
//!
//! ```text
//! pub const ADD_KERNEL: &str = "add_kernel";
//! pub fn add_kernel(rt: &Runtime, stream: &Arc<CudaStream>, grid: [u32; 3],
//!     x_ptr: &impl DevicePtr<f32>, out_ptr: &impl DevicePtr<f32>, n: i32) -> Result<()>
//! pub fn add_kernel_on(kernel: &Kernel, stream: &Arc<CudaStream>, grid: [u32; 3], ...)
//! ```
//!
//! (`add_kernel` launches the runtime's default variant for the device, `add_kernel_on`
//! a given loaded variant, e.g. a tuned one.) The text names types through
//! `tritonrt::cudarc` and `tritonrt::half`, so it compiles with no other dependency; it
//! has no inner attributes, so it can be `include!`d. A `build.rs` calls
//! [`write_bindings`]; the `tritonrt bindgen` subcommand writes the same text.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use crate::artifact::{Arg, ArgType, ArtifactStore, Dtype, Manifest};
use crate::error::Result;

/// The Rust element type a `*dtype` pointer argument takes (`CudaSlice` / `CudaView` of
/// it), and the dtype to view it as when that differs (`*i1` and fp8 take bytes, fp16 and
/// bf16 their `u16` bits).
fn elem_type(d: Dtype) -> (&'static str, Option<&'static str>) {
    match d {
        Dtype::I1 => ("u8", Some("I1")),
        Dtype::I8 => ("i8", None),
        Dtype::I16 => ("i16", None),
        Dtype::I32 => ("i32", None),
        Dtype::I64 => ("i64", None),
        Dtype::U8 => ("u8", None),
        Dtype::U16 => ("u16", None),
        Dtype::U32 => ("u32", None),
        Dtype::U64 => ("u64", None),
        // fp16 / bf16 buffers are `u16` bit patterns: this crate builds cudarc without its
        // `f16` feature (it would pull rand into the library), so no `CudaSlice<f16>`.
        Dtype::Fp16 => ("u16", Some("Fp16")),
        Dtype::Bf16 => ("u16", Some("Bf16")),
        Dtype::Fp32 => ("f32", None),
        Dtype::Fp64 => ("f64", None),
        Dtype::Fp8E4Nv => ("u8", Some("Fp8E4Nv")),
        Dtype::Fp8E5 => ("u8", Some("Fp8E5")),
    }
}

/// A scalar's Rust type and `KernelArg` variant.
fn scalar_type(d: Dtype) -> (&'static str, &'static str) {
    match d {
        Dtype::I1 => ("bool", "Bool"),
        Dtype::I8 => ("i8", "I8"),
        Dtype::I16 => ("i16", "I16"),
        Dtype::I32 => ("i32", "I32"),
        Dtype::I64 => ("i64", "I64"),
        Dtype::U8 => ("u8", "U8"),
        Dtype::U16 => ("u16", "U16"),
        Dtype::U32 => ("u32", "U32"),
        Dtype::U64 => ("u64", "U64"),
        Dtype::Fp16 => ("tritonrt::half::f16", "F16"),
        Dtype::Bf16 => ("tritonrt::half::bf16", "Bf16"),
        Dtype::Fp32 => ("f32", "F32"),
        // fp8 scalars do not exist (ArgType::parse refuses them); fp64 as the fallback.
        Dtype::Fp64 | Dtype::Fp8E4Nv | Dtype::Fp8E5 => ("f64", "F64"),
    }
}

const KEYWORDS: &[&str] = &[
    "as", "break", "const", "continue", "crate", "else", "enum", "extern", "false", "fn", "for",
    "if", "impl", "in", "let", "loop", "match", "mod", "move", "mut", "pub", "ref", "return",
    "self", "Self", "static", "struct", "super", "trait", "true", "type", "unsafe", "use", "where",
    "while", "async", "await", "dyn", "abstract", "become", "box", "do", "final", "macro",
    "override", "priv", "typeof", "unsized", "virtual", "yield", "try", "gen",
];

/// A Rust identifier for `name`: non-identifier characters become `_`, a leading digit
/// gets a `_`, keywords get `r#`.
pub fn rust_ident(name: &str) -> String {
    let mut s: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if s.is_empty() || s.starts_with(|c: char| c.is_ascii_digit()) {
        s.insert(0, '_');
    }
    if KEYWORDS.contains(&s.as_str()) {
        s.insert_str(0, "r#");
    }
    s
}

/// The generated text for every logical kernel of `manifest` (in name order). `origin`
/// is named in the header comment (e.g. the manifest's path).
///
/// Errors: a message when two kernel names map to one Rust identifier.
pub fn generate(manifest: &Manifest, origin: &str) -> std::result::Result<String, String> {
    let mut kernels: BTreeMap<&str, (&[Arg], Vec<String>)> = BTreeMap::new();
    for v in &manifest.variants {
        let e = kernels
            .entry(v.kernel.as_str())
            .or_insert((&v.signature, Vec::new()));
        e.1.push(v.id.clone());
    }
    let mut idents: BTreeMap<String, &str> = BTreeMap::new();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "// Typed launchers for the kernels of {origin} (Triton {}), written by\n\
         // tritonrt's bindgen: regenerate instead of editing.\n",
        manifest.triton_version
    );
    for (name, (sig, ids)) in &kernels {
        let f = rust_ident(name);
        if let Some(other) = idents.insert(f.clone(), name) {
            return Err(format!(
                "kernels {other} and {name} both become the Rust function {f}"
            ));
        }
        write_kernel(&mut out, name, &f, sig, ids);
    }
    Ok(out)
}

fn write_kernel(out: &mut String, name: &str, f: &str, sig: &[Arg], ids: &[String]) {
    // Argument identifiers, distinct from the launcher's own parameters.
    let fixed = ["rt", "kernel", "stream", "grid"];
    let mut used: Vec<String> = fixed.iter().map(|s| s.to_string()).collect();
    let names: Vec<String> = sig
        .iter()
        .map(|a| {
            let mut n = rust_ident(&a.name);
            while used.contains(&n) {
                n.push('_');
            }
            used.push(n.clone());
            n
        })
        .collect();
    let mut params = String::new();
    let mut docs = String::new();
    let mut args = String::new();
    for (a, n) in sig.iter().zip(&names) {
        let div = if a.divisibility > 1 && a.ty.divisibility_applies() {
            format!(" (a multiple of {}, checked at launch)", a.divisibility)
        } else {
            String::new()
        };
        match a.ty {
            ArgType::Ptr(Some(d)) => {
                let (t, view) = elem_type(d);
                let _ = write!(
                    params,
                    ",\n    {n}: &impl tritonrt::cudarc::driver::DevicePtr<{t}>"
                );
                let _ = writeln!(
                    docs,
                    "/// - `{n}`: `{}`, device memory of `{t}`{}{}",
                    a.ty,
                    if view.is_some() && t == "u16" {
                        " (the values' bits)"
                    } else {
                        ""
                    },
                    if div.is_empty() {
                        String::new()
                    } else {
                        format!(", address{div}")
                    }
                );
                let buf = format!("tritonrt::driver::DeviceBuf::of({n}, stream)");
                let _ = write!(
                    args,
                    "\n        tritonrt::abi::KernelArg::Buf({}),",
                    match view {
                        Some(v) => format!("{buf}.as_dtype(tritonrt::artifact::Dtype::{v})"),
                        None => buf,
                    }
                );
            }
            ArgType::Ptr(None) => {
                let _ = write!(params, ",\n    {n}: tritonrt::driver::DeviceBuf");
                let _ = writeln!(
                    docs,
                    "/// - `{n}`: `*` (element type unknown: any buffer){}",
                    if div.is_empty() {
                        String::new()
                    } else {
                        format!(", address{div}")
                    }
                );
                let _ = write!(args, "\n        tritonrt::abi::KernelArg::Buf({n}),");
            }
            ArgType::Scalar(d) => {
                let (t, k) = scalar_type(d);
                let _ = write!(params, ",\n    {n}: {t}");
                let _ = writeln!(docs, "/// - `{n}`: `{}`{div}", a.ty);
                let _ = write!(args, "\n        tritonrt::abi::KernelArg::{k}({n}),");
            }
            ArgType::TensorDesc(t) => {
                let _ = write!(params, ",\n    {n}: tritonrt::abi::TensorDescArg");
                let _ = writeln!(
                    docs,
                    "/// - `{n}`: `{}`: a descriptor of a {}-dimensional {} tensor (innermost \
                     stride 1; for TMA, 16-byte aligned with 16-byte row strides; checked)",
                    a.ty,
                    t.ndim(),
                    t.dtype.name()
                );
                let _ = write!(args, "\n        tritonrt::abi::KernelArg::TensorDesc({n}),");
            }
        }
    }
    let konst = rust_ident(name)
        .trim_start_matches("r#")
        .to_ascii_uppercase();
    let variants = ids.join(", ");
    let _ = write!(
        out,
        "/// The logical name of kernel `{name}` (variants: {variants}).\n\
         #[allow(dead_code)]\n\
         pub const {konst}: &str = {name:?};\n\n\
         /// Launch kernel `{name}` (the runtime's default variant for its device) on `stream`\n\
         /// with Triton's program grid `grid`. Arguments:\n\
         {docs}\
         ///\n\
         /// Errors: the variant cannot be loaded; an argument breaks what the variant was\n\
         /// compiled to assume (divisibility, descriptor shape); the manifest's signature\n\
         /// changed since this was generated; the driver refuses the launch.\n\
         #[allow(clippy::too_many_arguments, dead_code)]\n\
         pub fn {f}(\n    rt: &tritonrt::runtime::Runtime,\n    \
         stream: &std::sync::Arc<tritonrt::cudarc::driver::CudaStream>,\n    \
         grid: [u32; 3]{params},\n) -> tritonrt::Result<()> {{\n    \
         let kernel = rt.default_kernel({name:?})?;\n    \
         {f_on}(&kernel, stream, grid{call})\n}}\n\n\
         /// [`{f}`] on a given loaded variant of `{name}` (a tuned one, say).\n\
         ///\n\
         /// Errors: as [`{f}`]; [`tritonrt::Error::Launch`] when `kernel` is a variant of\n\
         /// another kernel.\n\
         #[allow(clippy::too_many_arguments, dead_code)]\n\
         pub fn {f_on}(\n    kernel: &tritonrt::driver::Kernel,\n    \
         stream: &std::sync::Arc<tritonrt::cudarc::driver::CudaStream>,\n    \
         grid: [u32; 3]{params},\n) -> tritonrt::Result<()> {{\n    \
         if kernel.variant().kernel != {name:?} {{\n        \
         return Err(tritonrt::Error::Launch {{\n            \
         kernel: kernel.id().to_string(),\n            \
         msg: format!(\"a launcher of {name} was given a variant of {{}}\", kernel.variant().kernel),\n        \
         }});\n    }}\n    \
         kernel.launch(stream, grid, &[{args}\n    ])\n}}\n\n",
        f_on = format!("{}_on", f.trim_start_matches("r#")),
        call = names
            .iter()
            .map(|n| format!(", {n}"))
            .collect::<String>(),
    );
}

/// Generate the launchers of the ptx_cache at `ptx_cache` (its manifest, validated) into
/// `out_file`, rewriting it only when the text changed (so a `build.rs` does not trigger
/// needless rebuilds). For a `build.rs`:
///
/// ```no_run
/// let out = std::path::Path::new(&std::env::var("OUT_DIR").unwrap()).join("kernels.rs");
/// tritonrt::bindgen::write_bindings("my_ptx_cache".as_ref(), &out).unwrap();
/// println!("cargo:rerun-if-changed=my_ptx_cache/manifest.json");
/// // then, in the crate: include!(concat!(env!("OUT_DIR"), "/kernels.rs"));
/// ```
///
/// Errors: the manifest cannot be read or is invalid; two kernels map to one Rust name
/// ([`crate::Error::Invalid`]); writing the file fails.
pub fn write_bindings(ptx_cache: &Path, out_file: &Path) -> Result<()> {
    let store = ArtifactStore::open(ptx_cache)?;
    let text = generate(
        store.manifest(),
        &store.manifest_path().display().to_string(),
    )
    .map_err(|m| crate::Error::invalid("bindgen", m))?;
    if std::fs::read(out_file).ok().as_deref() == Some(text.as_bytes()) {
        return Ok(());
    }
    crate::artifact::write_atomic(out_file, text.as_bytes())
}
