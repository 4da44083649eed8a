//! `tritonrt build FILE.py`: AOT-compile a user's Triton source into a ptx_cache, from a
//! variant spec (a JSON file, or flags for one variant). The compile runs the pinned
//! Triton 3.6.0 through `kernels_triton/build.py --user` (Python at build time only; no
//! GPU); the result is then opened and every file verified, as at run time.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{bail, Context};

use crate::cli::EXIT_OK;
use tritonrt::artifact::ArtifactStore;

/// `kernels_triton/build.py` of this checkout (the default of `--build-script`).
const DEFAULT_BUILD_SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/kernels_triton/build.py");

/// Arguments of `tritonrt build`.
///
/// The variants come from `--spec SPEC.json` (several kernels and variants; the format is
/// printed by `python kernels_triton/build.py --help`), or from `--kernel` and
/// `--signature` (one variant per `--arch`). A signature lists every parameter of the
/// function in order, as Triton's `tools/compile.py` does: a type (`*fp16`, `i32`,
/// `fp16`, `u64`, `i1`, `tensordesc<fp16[64, 64]>`), optionally `:16` (the pointer or
/// integer is a multiple of 16, and launches are checked for it) or `:1` (the integer is
/// specialized to 1), or a constexpr value (`1024`, `0.5`, `True`, `None`). Example:
///
///   tritonrt build add.py --kernel add_kernel --signature "*fp32:16, *fp32:16, *fp32:16, i32, 1024" --out my_cache
///
/// Output: a ptx_cache (manifest.json + content-addressed PTX and, for sm_90, cubin) that
/// `inspect`, `verify`, `launch` and the library's `Runtime` read. Two builds of the same
/// inputs are byte-identical.
#[derive(Debug, clap::Args)]
pub struct BuildArgs {
    /// The Triton source file (executed by Python to find the `@triton.jit` function).
    #[arg(value_name = "FILE.py")]
    pub file: PathBuf,
    /// The ptx_cache directory to write (created; hashed files no variant needs are
    /// removed).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// A JSON variant spec: {"kernels": [{"kernel": ..., "signature": ..., "num_warps":
    /// ..., "num_stages": ..., "archs": [80, 90], ...}, ...]}.
    #[arg(long, value_name = "SPEC.json", conflicts_with_all = ["kernel", "signature"])]
    pub spec: Option<PathBuf>,
    /// The `@triton.jit` function to compile (with --signature).
    #[arg(long, value_name = "NAME", requires = "signature")]
    pub kernel: Option<String>,
    /// Its signature, one item per parameter, comma-separated: a type with an optional
    /// `:16` / `:1` hint, or a constexpr value.
    #[arg(long, value_name = "SIG", requires = "kernel")]
    pub signature: Option<String>,
    /// The logical kernel name in the manifest (default: the function's name).
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// Warps per program.
    #[arg(long, default_value_t = 4)]
    pub num_warps: u32,
    /// Software pipelining stages.
    #[arg(long, default_value_t = 3)]
    pub num_stages: u32,
    /// CTAs per cluster (> 1: a cluster launch; sm_90).
    #[arg(long, default_value_t = 1)]
    pub num_ctas: u32,
    /// Compile for programmatic dependent launch (the runtime launches it with PDL).
    #[arg(long)]
    pub pdl: bool,
    /// Launch as a cooperative grid (every program resident at once).
    #[arg(long)]
    pub cooperative: bool,
    /// Target archs: 80 (portable sm_80 PTX, JIT-compiled on any newer GPU) and/or 90
    /// (sm_90a PTX + cubin).
    #[arg(long, value_name = "ARCH", value_delimiter = ',', default_values_t = [80, 90])]
    pub arch: Vec<u32>,
    /// Compile workers.
    #[arg(long, default_value_t = 2)]
    pub jobs: usize,
    /// The Python interpreter that has triton==3.6.0.
    #[arg(
        long,
        value_name = "PYTHON",
        env = "TRITONRT_PYTHON",
        default_value = "python3"
    )]
    pub python: PathBuf,
    /// The AOT build script.
    #[arg(long, value_name = "FILE", env = "TRITONRT_BUILD_SCRIPT", default_value = DEFAULT_BUILD_SCRIPT)]
    pub build_script: PathBuf,
}

/// The spec JSON for one variant given by flags.
pub fn spec_from_flags(a: &BuildArgs) -> anyhow::Result<serde_json::Value> {
    let (Some(kernel), Some(sig)) = (&a.kernel, &a.signature) else {
        bail!("give the variants with --spec SPEC.json, or --kernel NAME and --signature SIG");
    };
    if a.arch.is_empty() || a.arch.iter().any(|x| *x != 80 && *x != 90) {
        bail!("--arch {:?}: each must be 80 or 90", a.arch);
    }
    Ok(serde_json::json!({"kernels": [{
        "kernel": kernel,
        "name": a.name.clone().unwrap_or_else(|| kernel.clone()),
        "signature": sig,
        "num_warps": a.num_warps,
        "num_stages": a.num_stages,
        "num_ctas": a.num_ctas,
        "launch_pdl": a.pdl,
        "launch_cooperative_grid": a.cooperative,
        "archs": a.arch,
    }]}))
}

/// `tritonrt build`.
pub fn build(a: BuildArgs) -> anyhow::Result<i32> {
    if !a.file.is_file() {
        bail!(
            "{} is not a file (expected a Triton source file)",
            a.file.display()
        );
    }
    if !a.build_script.is_file() {
        bail!(
            "the build script {} does not exist (pass --build-script or TRITONRT_BUILD_SCRIPT: \
             kernels_triton/build.py of a tritonrt checkout)",
            a.build_script.display()
        );
    }
    // A spec from flags goes through a temporary file next to nothing the user owns.
    let tmp = tempfile::Builder::new()
        .prefix("tritonrt-spec-")
        .suffix(".json")
        .tempfile()
        .context("creating a temporary spec file")?;
    let spec = match &a.spec {
        Some(p) => p.clone(),
        None => {
            let json = spec_from_flags(&a)?;
            std::fs::write(tmp.path(), serde_json::to_vec_pretty(&json)?)
                .with_context(|| format!("writing {}", tmp.path().display()))?;
            tmp.path().to_path_buf()
        }
    };
    let status = Command::new(&a.python)
        .arg(&a.build_script)
        .arg("--user")
        .arg(&a.file)
        .arg("--spec")
        .arg(&spec)
        .arg("--out")
        .arg(&a.out)
        .arg("--jobs")
        .arg(a.jobs.max(1).to_string())
        .status()
        .with_context(|| {
            format!(
                "running {} (the Python with triton==3.6.0; set --python or TRITONRT_PYTHON)",
                a.python.display()
            )
        })?;
    if !status.success() {
        bail!(
            "the AOT build failed ({}; its message is above)",
            status
                .code()
                .map_or("killed".to_string(), |c| format!("exit {c}"))
        );
    }
    let store = ArtifactStore::open(&a.out)
        .with_context(|| format!("opening the built ptx_cache {}", a.out.display()))?;
    let bad = store.verify_all();
    if let Some((p, e)) = bad.first() {
        bail!("the built file {} is bad: {e}", p.display());
    }
    for v in store.all_variants() {
        println!(
            "{}{}: {} ({} bytes shared{})",
            v.id,
            if v.default { " (default)" } else { "" },
            v.signature_string(),
            v.shared,
            if v.cubin.is_some() { ", cubin" } else { "" }
        );
    }
    Ok(EXIT_OK)
}

/// Arguments of `tritonrt bindgen`: write typed Rust launchers for the kernels of a
/// ptx_cache, one function per logical kernel whose parameters carry the signature's
/// types (`&impl DevicePtr<f16>` for `*fp16`, `i32`, `half::bf16`, `TensorDescArg`,
/// ...); divisibility and descriptor checks happen at launch. The text can be
/// `include!`d or written to a module; a `build.rs` calls
/// `tritonrt::bindgen::write_bindings` instead.
#[derive(Debug, clap::Args)]
pub struct BindgenArgs {
    #[command(flatten)]
    pub ptx: crate::cli::core_cmds::PtxCacheArg,
    /// The Rust file to write (rewritten only when its text changes); default: stdout.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
}

/// `tritonrt bindgen`.
pub fn bindgen(a: BindgenArgs) -> anyhow::Result<i32> {
    match &a.out {
        Some(out) => {
            tritonrt::bindgen::write_bindings(&a.ptx.ptx_cache, out)?;
            eprintln!("wrote {}", out.display());
        }
        None => {
            let store = ArtifactStore::open(&a.ptx.ptx_cache)
                .with_context(|| format!("opening ptx_cache {}", a.ptx.ptx_cache.display()))?;
            let text = tritonrt::bindgen::generate(
                store.manifest(),
                &store.manifest_path().display().to_string(),
            )
            .map_err(anyhow::Error::msg)?;
            print!("{text}");
        }
    }
    Ok(EXIT_OK)
}
