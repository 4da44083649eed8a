//! `tritonrt run`: one decode step of the PQCache indexer on a chosen backend, checked
//! against the CPU reference by the spec's rule.
//!
//! Inputs are either generated (a named workload, seeded, every value overridable by a
//! flag) or read from a safetensors file (`--input`). The step runs on the GPU backend
//! when one is available (see [`run_gpu`]), else on the CPU reference, which says so.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;

use super::{EXIT_CHECK_FAILED, EXIT_OK};
use tritonrt::pq::check::{check_with, CheckMode, CheckOptions};
use tritonrt::pq::{
    self, DType, Metric, PqConfig, PqConfigOverrides, PqInputs, PqOutput, Shape, Size, Workload,
};

/// `println!` that ignores a closed stdout (`tritonrt run | head` must not panic).
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout().lock(), $($arg)*);
    }};
}

/// Which implementation runs the step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Backend {
    /// The GPU pipeline if one is available, else the CPU reference (with a message).
    Auto,
    /// The GPU pipeline; an error if none is available.
    Gpu,
    /// The CPU reference (f64 scores).
    Cpu,
}

/// How generated inputs are drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Values {
    /// Standard-normal query, keys and centroids, uniform codes (the spec's workloads);
    /// checked by the spec's tolerance rule.
    Normal,
    /// Small integers with a well-separated heavy set; checked exactly (heavy sets must
    /// equal the CPU reference's).
    SmallInt,
}

/// Arguments of `tritonrt run`.
///
/// With no arguments: the spec's reference workload (B=1, H=H_kv=32, S=32000, D=128,
/// M=2, bits=6, sink=window=heavy=init_offset=128, euclidean, fp32, seeded
/// standard-normal inputs, codes cached for S-1-init_offset keys) on the GPU if present.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Examples:
  tritonrt run                                   reference workload, GPU if present
  tritonrt run --workload large --backend cpu    B=4, S=131072 on the CPU reference
  tritonrt run --metric ip --dtype bf16 --kv-heads 8 --seq-len 4096
  tritonrt run --heavy-size 0.1 --seq-len 32768  heavy = floor(0.1 * S) = 3276 keys
  tritonrt run --input in.safetensors --output out.safetensors
  tritonrt run --seq-lens 4096,32768,700,1 --kv-heads 8   a ragged batch, rows at their own S_b

Exit status: 0 ok, 1 the check failed, 2 error (bad input, I/O, no GPU with --backend gpu).")]
pub struct RunArgs {
    /// The workload giving the default shape and config: `reference` (B=1, H=H_kv=32,
    /// S=32000, D=128), `large` (B=4, S=131072), or `B,H,H_kv,S,D[,M[,bits[,heavy]]]`
    /// (the rest as the reference workload; heavy a count or a ratio of S such as 0.1).
    /// The shape and config flags override it.
    #[arg(
        long,
        env = "TRITONRT_WORKLOAD",
        default_value = "reference",
        help_heading = "Inputs"
    )]
    pub workload: Workload,
    /// Shape flags (override the workload's shape).
    #[command(flatten)]
    pub shape: Box<ShapeFlags>,
    /// Config flags (override the reference config or the file's __metadata__).
    #[command(flatten)]
    pub config: Box<ConfigFlags>,
    /// Seed of the generated inputs.
    #[arg(
        long,
        env = "TRITONRT_SEED",
        default_value_t = 0,
        help_heading = "Inputs"
    )]
    pub seed: u64,
    /// Keys already quantized before the step [default: S - 1 - init_offset, so the step
    /// quantizes one new key].
    #[arg(long, help_heading = "Inputs")]
    pub n_cached: Option<usize>,
    /// How generated inputs are drawn.
    #[arg(long, value_enum, default_value = "normal", help_heading = "Inputs")]
    pub values: Values,
    /// A ragged batch (spec "Ragged batches"): each sequence's length S_b, comma-separated
    /// (B = their count; S_alloc = --seq-len, default the largest). Each row holds codes
    /// for S_b - 1 - init_offset keys (one new key; the short path's rows quantize
    /// nothing). Runs a ragged step (--ragged-path) on the GPU (or the CPU reference)
    /// and checks every row at its own length with the ragged checker. An --input file with a `seq_lens`
    /// tensor (and optionally `n_cached`) runs the same way.
    #[arg(long, value_delimiter = ',', value_name = "S_b,...", help_heading = "Inputs",
          conflicts_with_all = ["input", "batch", "n_cached", "prefill"])]
    pub seq_lens: Vec<usize>,
    /// Read the inputs and config from this safetensors file (tensors query, key,
    /// pq_centroids, pq_codebook, optional pq_ip2l2_phi; config from __metadata__,
    /// overridable by the config flags) instead of generating them.
    #[arg(short = 'i', long, help_heading = "Inputs",
          conflicts_with_all = ["batch", "heads", "kv_heads", "seq_len", "head_dim", "n_cached"])]
    pub input: Option<PathBuf>,
    /// Run an `--input` file whose query, keys, centroids or phi hold NaN or infinity
    /// (refused by default, naming the tensor and the first flat index).
    #[arg(long, help_heading = "Inputs", requires = "input")]
    pub allow_nonfinite: bool,
    /// Also write the (generated or read) inputs to this safetensors file, in the
    /// --input format (e.g. for kernels_triton/reference.py).
    #[arg(long, help_heading = "Output")]
    pub save_input: Option<PathBuf>,
    /// Write sparse_list, sparse_len, weight_list and the updated pq_codebook to this
    /// safetensors file (atomically).
    #[arg(short = 'o', long, help_heading = "Output")]
    pub output: Option<PathBuf>,
    /// Which implementation runs the step.
    #[arg(
        long,
        value_enum,
        env = "TRITONRT_BACKEND",
        default_value = "auto",
        help_heading = "Backend"
    )]
    pub backend: Backend,
    /// CUDA device ordinal for the GPU backend.
    #[arg(
        long,
        env = "TRITONRT_DEVICE",
        default_value_t = 0,
        help_heading = "Backend"
    )]
    pub device: usize,
    /// Timed steps per launch mode on the GPU (median wall-clock of step + synchronize,
    /// after a warm-up); 0 times nothing.
    #[arg(long, default_value_t = 200, help_heading = "Backend")]
    pub steps: usize,
    /// Run this kernel variant in place of the tuned or default one (an id that
    /// `tritonrt inspect` lists; repeatable, one per kernel). An id of
    /// `pq_quant.k_<qt>` alone also serves the keys that allow vector loads.
    #[arg(long = "variant", value_name = "ID", help_heading = "Backend")]
    pub variants: Vec<String>,
    /// Select kernels of a step (the values name the kernels; `auto` picks per shape).
    #[arg(long, value_enum, default_value_t = SelectPathArg::Auto, help_heading = "Backend")]
    pub select_path: SelectPathArg,
    /// Kernels of a ragged step (--seq-lens or an input with seq_lens; `auto`: the
    /// config's, as the library chooses).
    #[arg(long, value_enum, default_value_t = RaggedPathArg::Auto, help_heading = "Backend")]
    pub ragged_path: RaggedPathArg,
    /// Quantize the step's new keys with `pq_quant` before the select kernel when there
    /// are more than this many [default: 1]; 0: always (to measure the threshold).
    #[arg(long, value_name = "N", help_heading = "Backend")]
    pub bulk_min: Option<usize>,
    /// Build the codebook first: the prefill (k-means on the GPU) clusters the prompt
    /// (positions 0 .. init_offset + N_cached) and the step runs on its centroids and
    /// codes, taken over on the device; both are checked against the CPU reference.
    #[arg(long, help_heading = "Prefill", conflicts_with = "input")]
    pub prefill: bool,
    /// Lloyd iterations at most of --prefill.
    #[arg(long, default_value_t = 10, help_heading = "Prefill")]
    pub kmeans_iter: usize,
    /// Initial centroids of --prefill: strided or random:SEED.
    #[arg(long, default_value = "strided", help_heading = "Prefill")]
    pub kmeans_init: tritonrt::pq::prefill::KmeansInit,
    #[command(flatten)]
    pub ptx: super::core_cmds::PtxCacheArg,
}

/// Shape flags of `tritonrt run`; each replaces the workload's value.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ShapeFlags {
    /// Batch size B.
    #[arg(short = 'b', long, help_heading = "Shape")]
    pub batch: Option<usize>,
    /// Query heads H.
    #[arg(long, help_heading = "Shape")]
    pub heads: Option<usize>,
    /// KV heads H_kv (must divide H; default: H).
    #[arg(long, help_heading = "Shape")]
    pub kv_heads: Option<usize>,
    /// Sequence length S, the new token included.
    #[arg(long, help_heading = "Shape")]
    pub seq_len: Option<usize>,
    /// Head dimension D.
    #[arg(long, help_heading = "Shape")]
    pub head_dim: Option<usize>,
}

/// Config flags of `tritonrt run`; each replaces the reference config's value, or the
/// input file's `__metadata__` value.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ConfigFlags {
    /// Attention sinks: positions 0..sink_size are always attended. A count, or a ratio
    /// of S written with a decimal point (0.01: floor(0.01 * S) at each step)
    /// [default: 128].
    #[arg(long, value_name = "N|RATIO", value_parser = parse_sink, help_heading = "Config")]
    pub sink_size: Option<Size>,
    /// Local window: the last window_size positions are always attended. A count, or a
    /// ratio of S written with a decimal point (0.05: floor(0.05 * S) at each step)
    /// [default: 128].
    #[arg(long, value_name = "N|RATIO", value_parser = parse_window, help_heading = "Config")]
    pub window_size: Option<Size>,
    /// Heavy hitters chosen through PQ scores. A count, or a ratio of S written with a
    /// decimal point (0.1: floor(0.1 * S) at each step, as upstream; 1.0 is all of S,
    /// 1 is one key) [default: 128].
    #[arg(long, value_name = "N|RATIO", value_parser = parse_heavy, help_heading = "Config")]
    pub heavy_size: Option<Size>,
    /// Quantized key j is the token at position init_offset + j [default: 128].
    #[arg(long, help_heading = "Config")]
    pub init_offset: Option<usize>,
    /// M, subvectors per key (must divide D) [default: 2].
    #[arg(long, help_heading = "Config")]
    pub pq_group_factor: Option<usize>,
    /// Bits per code, 1..=8 (K = 2^bits centroids) [default: 6].
    #[arg(long, help_heading = "Config")]
    pub pq_bits: Option<u32>,
    /// How new keys are quantized: euclidean or ip [default: euclidean].
    #[arg(long, help_heading = "Config")]
    pub metric: Option<Metric>,
    /// dtype of query and key: fp32, bf16 or fp16 [default: fp32; with --input: the
    /// file's, which this must match].
    #[arg(long, help_heading = "Config")]
    pub dtype: Option<DType>,
    /// dtype of weight_list: fp32, bf16 or fp16 [default: the input dtype].
    #[arg(long, help_heading = "Config")]
    pub weight_dtype: Option<DType>,
}

/// `--sink-size`: a count or a ratio of S ([`Size::parse_field`], naming `sink_size`).
impl RunArgs {
    /// How the GPU's outputs are checked against the CPU reference: exactly where the
    /// inputs are generated small integers (well-separated scores), else by the spec's
    /// tolerance rule.
    pub(crate) fn check_mode(&self) -> CheckMode {
        match self.values {
            Values::SmallInt if self.input.is_none() => CheckMode::Exact,
            _ => CheckMode::Spec,
        }
    }
}

pub(crate) fn parse_sink(s: &str) -> Result<Size, String> {
    Size::parse_field("sink_size", s).map_err(|e| e.to_string())
}

/// `--window-size`: a count or a ratio of S ([`Size::parse_field`], naming `window_size`).
pub(crate) fn parse_window(s: &str) -> Result<Size, String> {
    Size::parse_field("window_size", s).map_err(|e| e.to_string())
}

/// `--heavy-size`: a count or a ratio of S ([`Size::parse_field`], naming `heavy_size`).
pub(crate) fn parse_heavy(s: &str) -> Result<Size, String> {
    Size::parse_field("heavy_size", s).map_err(|e| e.to_string())
}

/// The result of running the step on some backend.
#[derive(Debug)]
pub struct BackendRun {
    /// The step's output, copied to the host.
    pub output: PqOutput,
    /// Wall-clock time of one step in microseconds (the backend says how it measured).
    pub step_us: f64,
    /// What ran and how it was timed, for the report line.
    pub detail: String,
}

// ---------------------------------------------------------------------------------
// GPU BACKEND: the Triton kernels launched from Rust (`pq::gpu`, src/pq/).
// ---------------------------------------------------------------------------------
/// Run one step on the GPU pipeline (device `a.device`), check that a CUDA-graph replay
/// gives the same bytes, and time `a.steps` steps of each launch mode.
///
/// Returns `Ok(None)` when no GPU backend is available (no driver or no such device;
/// the reason is printed), `Ok(Some(run))` with the output copied to the host and the
/// median graph-replay step time, or an error when a GPU is present but the step failed.
pub fn run_gpu(
    cfg: &PqConfig,
    inputs: &PqInputs,
    a: &RunArgs,
) -> anyhow::Result<Option<BackendRun>> {
    let rt = match pq::gpu::open_runtime(a.device, &a.ptx.ptx_cache)
        .context("opening the GPU runtime")?
    {
        Ok(rt) => rt,
        Err(why) => {
            say!("gpu:     not available: {why}");
            return Ok(None);
        }
    };
    let choice = kernel_choice(rt.store(), &a.variants)?;
    let ex = pq::gpu::execute_with_path(
        &rt,
        cfg,
        inputs,
        &choice,
        a.select_path.into(),
        a.bulk_min,
        a.steps,
        false,
    )
    .context("GPU indexer step")?;
    say!(
        "gpu:     {} ({}), select kernel {}{}",
        ex.device_name,
        rt.device().arch(),
        ex.select_kernel(),
        if ex.bulk_quantize {
            ", new keys quantized by pq_quant first"
        } else {
            ""
        }
    );
    for line in kernel_lines(&ex.kernels) {
        say!("kernel:  {line}");
    }
    anyhow::ensure!(
        ex.graph_matches,
        "the CUDA-graph step's outputs differ from the plain-launch step's"
    );
    say!("graph:   CUDA-graph replay output identical to plain launches");
    let fmt = |t: &Option<pq::gpu::StepTiming>| match t {
        Some(t) => format!(
            "{:.1} us (p10 {:.1}, p90 {:.1}, n={})",
            t.median_us, t.p10_us, t.p90_us, t.samples
        ),
        None => "not timed".to_string(),
    };
    say!(
        "launch:  {} per step, plain launches + synchronize",
        fmt(&ex.launch_timing)
    );
    let step_us = ex.graph_timing.map_or(f64::NAN, |t| t.median_us);
    Ok(Some(BackendRun {
        output: ex.output,
        step_us,
        detail: format!(
            "median wall-clock of CUDA-graph replay + synchronize, {}",
            fmt(&ex.graph_timing)
        ),
    }))
}

/// The indexer's variant choice for `--variant` ids: each id overrides its kernel (read
/// from the manifest); the other kernels take the tuning table's winner, else the
/// manifest default.
///
/// Errors: an id the manifest does not have, two ids of one kernel.
pub(crate) fn kernel_choice(
    store: &tritonrt::artifact::ArtifactStore,
    ids: &[String],
) -> anyhow::Result<pq::gpu::KernelChoice> {
    let mut choice = pq::gpu::KernelChoice::new();
    for id in ids {
        let next = choice
            .clone()
            .with_variant_id(store, id)
            .with_context(|| format!("--variant {id}"))?;
        if next.overrides().len() == choice.overrides().len() {
            let kernel = &store.variant(id)?.kernel;
            anyhow::bail!(
                "--variant {id}: kernel {kernel} already has --variant {} (one per kernel)",
                choice.variant_for(kernel).unwrap_or_default()
            );
        }
        choice = next;
    }
    Ok(choice)
}

/// One line per kernel a step launched: `<variant id> (<origin>)`, origin `override`,
/// `table` (the tuning table's winner) or `default` (the manifest's).
pub(crate) fn kernel_lines(kernels: &[pq::gpu::VariantChoice]) -> Vec<String> {
    kernels.iter().map(|k| k.to_string()).collect()
}

/// Run the CPU reference once and time it.
fn run_cpu(cfg: &PqConfig, inputs: &PqInputs) -> anyhow::Result<BackendRun> {
    let t = Instant::now();
    let output = pq::step(cfg, inputs).context("CPU reference step")?;
    let step_us = t.elapsed().as_secs_f64() * 1e6;
    Ok(BackendRun {
        output,
        step_us,
        detail: format!("CPU reference, {} threads, one call", pq::host_threads()),
    })
}

fn overrides(a: &ConfigFlags) -> PqConfigOverrides {
    PqConfigOverrides {
        sink_size: a.sink_size,
        window_size: a.window_size,
        heavy_size: a.heavy_size,
        init_offset: a.init_offset,
        pq_group_factor: a.pq_group_factor,
        pq_bits: a.pq_bits,
        metric: a.metric,
        input_dtype: a.dtype,
        weight_dtype: a.weight_dtype,
    }
}

/// Build the config and inputs from the file or the generator.
fn build_inputs(a: &RunArgs) -> anyhow::Result<(PqConfig, PqInputs, String)> {
    let over = overrides(&a.config);
    if let Some(path) = &a.input {
        let t = Instant::now();
        let (cfg, inputs) = pq::io::read_inputs(path, &over)
            .with_context(|| format!("reading the inputs from {}", path.display()))?;
        if let (Some((tensor, index, v)), false) = (inputs.first_nonfinite(), a.allow_nonfinite) {
            anyhow::bail!(
                "{}: tensor {tensor} holds {v} at flat index {index}: non-finite inputs are refused \
                 (--allow-nonfinite runs them anyway)",
                path.display()
            );
        }
        let how = format!(
            "read from {} in {:.0} ms",
            path.display(),
            t.elapsed().as_secs_f64() * 1e3
        );
        return Ok((cfg, inputs, how));
    }
    let mut cfg = over.apply(a.workload.config());
    if a.config.weight_dtype.is_none() {
        cfg.weight_dtype = cfg.input_dtype;
    }
    let base = a.workload.shape();
    let h = a.shape.heads.unwrap_or(base.h);
    let ragged = !a.seq_lens.is_empty();
    let shape = Shape {
        b: if ragged {
            a.seq_lens.len()
        } else {
            a.shape.batch.unwrap_or(base.b)
        },
        h,
        h_kv: a.shape.kv_heads.unwrap_or(if a.shape.heads.is_some() {
            h
        } else {
            base.h_kv
        }),
        s: a.shape.seq_len.unwrap_or(if ragged {
            a.seq_lens.iter().copied().max().unwrap_or(base.s)
        } else {
            base.s
        }),
        d: a.shape.head_dim.unwrap_or(base.d),
    };
    cfg.validate(&shape)
        .context("checking the config and shape")?;
    let n_cached = if ragged {
        // the codes tensor holds the most any row has (rows past their own count ignore it)
        a.seq_lens
            .iter()
            .map(|&s| PqInputs::default_n_cached(&cfg, s))
            .max()
            .unwrap_or(0)
    } else {
        a.n_cached
            .unwrap_or_else(|| PqInputs::default_n_cached(&cfg, shape.s))
    };
    let t = Instant::now();
    let inputs = match a.values {
        Values::Normal => PqInputs::random(&cfg, shape, n_cached, a.seed),
        Values::SmallInt => PqInputs::small_integer(&cfg, shape, n_cached, a.seed),
    }
    .context("generating the inputs")?;
    let how = format!(
        "generated ({}, seed {}) in {:.0} ms",
        match a.values {
            Values::Normal => "standard normal",
            Values::SmallInt => "small integers, well separated",
        },
        a.seed,
        t.elapsed().as_secs_f64() * 1e3
    );
    Ok((cfg, inputs, how))
}

fn dims(v: &[usize]) -> String {
    let s: Vec<String> = v.iter().map(|x| x.to_string()).collect();
    format!("[{}]", s.join(", "))
}

/// Print the first entries of a list.
fn head(v: &[i64], n: usize) -> String {
    let s: Vec<String> = v.iter().take(n).map(|x| x.to_string()).collect();
    if v.len() > n {
        format!("[{}, ...] ({} entries)", s.join(", "), v.len())
    } else {
        format!("[{}]", s.join(", "))
    }
}

/// Entry point of `tritonrt run`; returns the process exit code (0 ok, 1 check failed).
pub fn run(a: RunArgs) -> anyhow::Result<i32> {
    let (cfg, inputs, how) = build_inputs(&a)?;
    let ragged = if !a.seq_lens.is_empty() {
        let lens: Vec<i64> = a.seq_lens.iter().map(|&s| s as i64).collect();
        let ncs: Vec<i64> = a
            .seq_lens
            .iter()
            .map(|&s| PqInputs::default_n_cached(&cfg, s) as i64)
            .collect();
        Some((lens, Some(ncs)))
    } else if let Some(path) = &a.input {
        pq::io::read_ragged(path)
            .with_context(|| format!("reading seq_lens from {}", path.display()))?
            .map(|r| (r.seq_lens, r.n_cached))
    } else {
        None
    };
    if let Some((lens, ncs)) = ragged {
        say!("config:  {cfg}");
        say!("inputs:  {how}");
        return super::ragged::run_ragged(&a, &cfg, inputs, &lens, ncs.as_deref());
    }
    let sh = inputs.shape;
    let (mm, k, dc) = (cfg.pq_group_factor, cfg.k_centroids(), cfg.d_c(sh.d));
    let total = cfg.total(sh.s);
    say!("config:  {cfg}");
    say!("inputs:  {how}");
    say!(
        "shapes:  query {} {}, key {} {}, pq_centroids {} fp32, pq_codebook {} i64{}",
        dims(&[sh.b, sh.h, 1, sh.d]),
        cfg.input_dtype,
        dims(&[sh.b, sh.h_kv, sh.s, sh.d]),
        cfg.input_dtype,
        dims(&[sh.b, sh.h_kv, mm, k, dc]),
        dims(&[sh.b, inputs.n_cached, sh.h_kv, mm]),
        if cfg.metric == Metric::Ip {
            format!(", pq_ip2l2_phi {} fp32", dims(&[sh.b * sh.h_kv * mm]))
        } else {
            String::new()
        }
    );
    if cfg.is_short(sh.s) {
        say!(
            "step:    short path (S = {} <= heavy + init_offset + 1 + K = {}): every head \
             attends to all {} positions",
            sh.s,
            cfg.short_threshold(sh.s),
            sh.s
        );
    } else {
        let n = cfg.n_quantized(sh.s);
        say!(
            "step:    quantize {} new key(s) (N_cached {} -> {n}), {} candidates, top {} + \
             sink {} + window {} = {total} per row",
            n.saturating_sub(inputs.n_cached),
            inputs.n_cached,
            cfg.window_start(sh.s).min(n),
            cfg.heavy_k(sh.s),
            cfg.sink_eff(sh.s),
            cfg.window_eff(sh.s),
        );
    }
    say!(
        "outputs: sparse_list {} i64, sparse_len {} i64, weight_list {} {}",
        dims(&[sh.b, sh.h, total]),
        dims(&[sh.b, sh.h]),
        dims(&[sh.b, sh.h, sh.s]),
        cfg.weight_dtype
    );
    if a.prefill {
        return super::prefill::run_with_prefill(&cfg, &inputs, a.kmeans_iter, a.kmeans_init, &a);
    }
    if let Some(path) = &a.save_input {
        pq::io::write_inputs(path, &cfg, &inputs)
            .with_context(|| format!("writing the inputs to {}", path.display()))?;
        say!("inputs written to {}", path.display());
    }

    let (run, is_reference) = match a.backend {
        Backend::Cpu => (run_cpu(&cfg, &inputs)?, true),
        Backend::Gpu => match run_gpu(&cfg, &inputs, &a)? {
            Some(r) => (r, false),
            None => anyhow::bail!(
                "no GPU backend available (--backend gpu, device {}): this build has no GPU \
                 pipeline or no CUDA device was found; use --backend cpu or auto",
                a.device
            ),
        },
        Backend::Auto => match run_gpu(&cfg, &inputs, &a)? {
            Some(r) => (r, false),
            None => {
                say!(
                    "no GPU backend available: running the CPU reference (f64 scores, {} \
                     threads)",
                    pq::host_threads()
                );
                (run_cpu(&cfg, &inputs)?, true)
            }
        },
    };

    let passed = if is_reference {
        say!("check:   skipped (cpu backend is the reference)");
        true
    } else {
        let t = Instant::now();
        let mode = a.check_mode();
        let report = check_with(
            &cfg,
            &inputs,
            &run.output,
            &CheckOptions {
                mode,
                ..CheckOptions::default()
            },
        );
        say!(
            "check:   {report}  [against the CPU reference, {:.0} ms]",
            t.elapsed().as_secs_f64() * 1e3
        );
        report.passed()
    };
    say!("time:    {:.1} us per step ({})", run.step_us, run.detail);
    let out = &run.output;
    say!("sparse_list[0, 0, :] = {}", head(out.row(0, 0), 16));
    if !cfg.is_short(sh.s) {
        say!(
            "heavy[0, 0] (sorted) = {}",
            head(&out.heavy_positions(&cfg, 0, 0), 12)
        );
    }
    if let Some(path) = &a.output {
        pq::io::write_outputs(path, &cfg, out)
            .with_context(|| format!("writing the outputs to {}", path.display()))?;
        say!("outputs written to {}", path.display());
    }
    Ok(if passed { EXIT_OK } else { EXIT_CHECK_FAILED })
}

/// `--select-path`: which select kernels a (non-short) step uses. ARCHITECTURE.md ("The
/// decode step") says what each does and why `auto` picks it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SelectPathArg {
    /// Chosen per shape: the indexed path where it applies, else split or hist, else
    /// chunked.
    Auto,
    /// `pq_select`: the top-k of each chunk of keys, merged by each row's last CTA.
    Chunked,
    /// `pq_hist`: one CTA per row, the threshold from the code-combination histogram,
    /// then one pass over the row's codes (where K^M <= 4096, M <= 4; else the
    /// radix-select split path).
    Hist,
    /// `pq_thresh` + `pq_emit`: the threshold per row, then the emit over many CTAs per
    /// row (where K^M <= 4096, M <= 4; else the radix-select split path).
    Split,
    /// `pq_index`: per-combination buckets of key positions, so the heavy keys are
    /// gathered, not searched for (M <= 2, query dtype = weight dtype; else split); its
    /// weights written as `auto` picks.
    Index,
    /// `pq_index` with each row's weights written by a second CTA of the same launch.
    IndexCompanion,
    /// `pq_wfill` writes the weights over every SM, then `pq_index`.
    IndexWfill,
}

/// `--ragged-path`: which kernels a ragged step runs after `pq_rgq` (ARCHITECTURE.md,
/// "Ragged batches", says what each does and when `auto` takes it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RaggedPathArg {
    /// The config's: indexed where it applies (M <= 2, K^M <= 4096, query dtype = weight
    /// dtype, heavy at most 128 at S_alloc, buckets within budget), else split where the
    /// combination histogram applies (K^M <= 4096, M <= 4), else radix.
    Auto,
    /// `pq_rgwfill` + `pq_rgindex`: each row's heavy keys gathered from per-combination
    /// buckets (M <= 2, K^M <= 4096, query dtype = weight dtype).
    Index,
    /// `pq_rgthresh` + `pq_rgsemit`: each row's threshold from its combination
    /// histogram, then the emit over many CTAs (K^M <= 4096, M <= 4).
    Split,
    /// `pq_rglut`, four `pq_rground`, `pq_rgcnt`, `pq_rgemit`: the exact threshold by
    /// radix select (every config).
    Radix,
}

impl RaggedPathArg {
    /// The path to force, `None` for the config's.
    pub fn forced(self) -> Option<pq::ragged::RaggedPath> {
        use pq::ragged::RaggedPath as P;
        match self {
            RaggedPathArg::Auto => None,
            RaggedPathArg::Index => Some(P::Index),
            RaggedPathArg::Split => Some(P::Split),
            RaggedPathArg::Radix => Some(P::Radix),
        }
    }
}

impl From<SelectPathArg> for pq::gpu::SelectPath {
    fn from(a: SelectPathArg) -> Self {
        use pq::gpu::SelectPath as P;
        match a {
            SelectPathArg::Auto => P::Auto,
            SelectPathArg::Chunked => P::Chunked,
            SelectPathArg::Hist => P::Hist,
            SelectPathArg::Split => P::Split,
            SelectPathArg::Index => P::Index,
            SelectPathArg::IndexCompanion => P::IndexCompanion,
            SelectPathArg::IndexWfill => P::IndexWfill,
        }
    }
}
