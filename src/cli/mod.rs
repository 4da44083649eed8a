//! Command-line interface of the `tritonrt` binary. Parsing lives here; each
//! subcommand is one function in its own file. Errors are printed as `error:` followed
//! by each `caused by:`, and the process exits with a distinct code per failure class.

use clap::{Parser, Subcommand};

mod autotune;
mod bench;
mod build;
mod core_cmds;
mod launch;
mod prefill;
mod ragged;
mod run;

/// Exit code: success.
pub const EXIT_OK: i32 = 0;
/// Exit code: a check failed (`verify` found a bad artifact, `run` found a wrong answer).
pub const EXIT_CHECK_FAILED: i32 = 1;
/// Exit code: an error (bad input, missing driver, I/O).
pub const EXIT_ERROR: i32 = 2;

/// Run Triton-compiled GPU kernels with no Python at run time, and the PQCache
/// decode-step indexer built on them.
#[derive(Debug, Parser)]
#[command(name = "tritonrt", version, about, long_about = None)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the PQCache decode-step indexer (default: the reference workload on the GPU,
    /// checked against the CPU reference).
    Run(run::RunArgs),
    /// Build the PQ codebook of a prompt by k-means on the GPU (default: B=1, H_kv=8,
    /// S=32768, bf16 keys), checked against the CPU reference.
    Prefill(prefill::PrefillArgs),
    /// Time the indexer step: launches, CUDA graph replay, and the memory floor.
    Bench(bench::BenchArgs),
    /// Time every compiled variant of each kernel on this GPU and persist the winners.
    Autotune(autotune::AutotuneArgs),
    /// Load and JIT every artifact for the present GPU into the user cubin cache.
    Warmup(core_cmds::WarmupArgs),
    /// List the kernel variants in a ptx_cache with their launch metadata.
    Inspect(core_cmds::InspectArgs),
    /// Check size and sha256 of every file in a ptx_cache; exit 1 naming each bad one.
    Verify(core_cmds::VerifyArgs),
    /// Add one entry of Triton's own cache directory (`~/.triton/cache/<hash>/`) to a
    /// ptx_cache.
    Import(core_cmds::ImportArgs),
    /// Launch one kernel variant of a ptx_cache: tensors from a safetensors file by
    /// argument name, scalars and the grid from flags, named outputs written to a
    /// safetensors file; `--repeat N` prints the median GPU time.
    ///
    /// Each argument of the kernel's signature is bound by name: a pointer (`*fp16`) or
    /// tensor descriptor (`tensordesc<fp16[64, 64]>`) argument takes the tensor of that
    /// name from --inputs (or a zero-filled one from --zeros), whose dtype must be the
    /// argument's element type (a descriptor sees the tensor as contiguous row-major, with
    /// its shape); a scalar takes --arg NAME=VALUE, or a one-element tensor of its exact
    /// dtype from --inputs. Every argument is checked before the GPU is opened. Example:
    ///
    ///   tritonrt launch add_kernel --ptx-cache my_cache --inputs in.safetensors --arg n=4096
    ///   --grid 4 --outputs out_ptr --out out.safetensors --repeat 100
    Launch(launch::LaunchArgs),
    /// AOT-compile a Triton source file into a ptx_cache from a variant spec (kernel,
    /// signature with specializations, constexprs, warps, stages, archs); no GPU needed.
    ///
    /// The variants come from --spec SPEC.json (several kernels and variants; the format
    /// is printed by `python kernels_triton/build.py --help`), or from --kernel and
    /// --signature (one variant per --arch). A signature lists every parameter of the
    /// function in order, as Triton's tools/compile.py does: a type (`*fp16`, `i32`,
    /// `fp16`, `u64`, `i1`, `tensordesc<fp16[64, 64]>`), optionally `:16` (the pointer or
    /// integer is a multiple of 16; launches are checked for it) or `:1` (the integer is
    /// specialized to 1), or a constexpr value (`1024`, `0.5`, `True`, `None`). The compile
    /// runs the pinned Triton 3.6.0 through kernels_triton/build.py (Python at build time
    /// only); two builds of the same inputs are byte-identical. Example:
    ///
    ///   tritonrt build add.py --kernel add_kernel --signature "*fp32:16, *fp32:16, *fp32:16,
    ///   i32, 1024" --out my_cache
    Build(build::BuildArgs),
    /// Write typed Rust launchers (one function per kernel) for the kernels of a
    /// ptx_cache.
    Bindgen(build::BindgenArgs),
}

/// Parse the command line, run the subcommand, print errors, and return the exit code.
pub fn main() -> i32 {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(a) => run::run(a),
        Command::Prefill(a) => prefill::prefill(a),
        Command::Bench(a) => bench::bench(a),
        Command::Autotune(a) => autotune::autotune(a),
        Command::Warmup(a) => core_cmds::warmup(a),
        Command::Inspect(a) => core_cmds::inspect(a),
        Command::Verify(a) => core_cmds::verify(a),
        Command::Import(a) => core_cmds::import(a),
        Command::Launch(a) => launch::launch(a),
        Command::Build(a) => build::build(a),
        Command::Bindgen(a) => build::bindgen(a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            for cause in e.chain().skip(1) {
                eprintln!("  caused by: {cause}");
            }
            EXIT_ERROR
        }
    }
}
