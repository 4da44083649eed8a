//! `tritonrt prefill`: build the PQ codebook of a prompt by k-means (spec
//! `pqcache-prefill.md`) on the GPU, checked against the CPU reference, and
//! `tritonrt bench --prefill`: the spec's prefill shapes timed against the memory floor.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;

use super::run::Backend;
use super::{EXIT_CHECK_FAILED, EXIT_OK};
use tritonrt::pq::gpu as pqgpu;
use tritonrt::pq::gpu::KernelChoice;
use tritonrt::pq::prefill::{
    check as pcheck, reference, DeviceKeys, GpuPrefill, KmeansInit, PrefillCheckMode,
    PrefillConfig, PrefillInputs, PrefillOutput, PrefillShape, PrefillTiming,
};
use tritonrt::pq::{DType, Metric, PqInputs, Shape, Size};
use tritonrt::runtime::Runtime;

macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout().lock(), $($arg)*);
    }};
}

/// How generated keys are drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum KeyValues {
    /// Standard-normal keys; checked by the spec's tolerance rule.
    Normal,
    /// Well-separated small-integer clusters; codes and centroids checked exactly.
    Separated,
}

/// Arguments of `tritonrt prefill`.
///
/// With no arguments: the spec's first prefill shape (B=1, H_kv=8, S=32768, D=128, M=2,
/// bits=6, init_offset=128, 10 k-means iterations, strided init, bf16 standard-normal
/// keys) on the GPU if present, checked against the CPU reference.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Examples:
  tritonrt prefill                                     B=1 H_kv=8 S=32768, GPU if present
  tritonrt prefill --pq-group-factor 4 --pq-bits 8     the M=4 bits=8 codebook
  tritonrt prefill --metric ip --values separated      exact check on separated clusters
  tritonrt prefill --input keys.safetensors --output codebook.safetensors
  tritonrt run --input codebook.safetensors            decode steps on that codebook

The output file holds query (generated), key, pq_centroids, pq_codebook (i64
[B, n, H_kv, M]) and pq_ip2l2_phi (ip) with the config in its metadata: the input
format of `tritonrt run --input`.

Exit status: 0 ok, 1 the check failed, 2 error (bad input, I/O, no GPU with --backend gpu).")]
pub struct PrefillArgs {
    /// Batch size B.
    #[arg(short = 'b', long, default_value_t = 1, help_heading = "Shape")]
    pub batch: usize,
    /// KV heads H_kv.
    #[arg(long, default_value_t = 8, help_heading = "Shape")]
    pub kv_heads: usize,
    /// Prompt length S (keys init_offset..S are clustered).
    #[arg(long, default_value_t = 32768, help_heading = "Shape")]
    pub seq_len: usize,
    /// Head dimension D.
    #[arg(long, default_value_t = 128, help_heading = "Shape")]
    pub head_dim: usize,
    /// M, subvectors per key (must divide D; D/M <= 256).
    #[arg(long, default_value_t = 2, help_heading = "Config")]
    pub pq_group_factor: usize,
    /// Bits per code, 1..=8 (K = 2^bits centroids).
    #[arg(long, default_value_t = 6, help_heading = "Config")]
    pub pq_bits: u32,
    /// euclidean or ip (keys extended by the ip-to-l2 coordinate).
    #[arg(long, default_value = "euclidean", help_heading = "Config")]
    pub metric: Metric,
    /// dtype of the keys: fp32, bf16 or fp16 [with --input: the file's].
    #[arg(long, help_heading = "Config")]
    pub dtype: Option<DType>,
    /// Key j of each group is the token at init_offset + j.
    #[arg(long, default_value_t = 128, help_heading = "Config")]
    pub init_offset: usize,
    /// Lloyd iterations at most (a group stops early once no assignment changes).
    #[arg(long, default_value_t = 10, help_heading = "Config")]
    pub kmeans_iter: usize,
    /// Initial centroids: strided (key floor(k*n/K)), random:SEED (K distinct keys per
    /// group), or given (pq_centroids from --input).
    #[arg(long, default_value = "strided", help_heading = "Config")]
    pub init: KmeansInit,
    /// Query heads H of the decode config written with --output (a multiple of H_kv)
    /// [default: 4 x H_kv].
    #[arg(long, help_heading = "Decode config (--output)")]
    pub heads: Option<usize>,
    /// sink_size of the decode config written with --output: a count, or a ratio of S
    /// written with a decimal point (0.01: floor(0.01 * S) at each step).
    #[arg(long, default_value = "128", value_name = "N|RATIO",
          value_parser = super::run::parse_sink, help_heading = "Decode config (--output)")]
    pub sink_size: Size,
    /// window_size of the decode config written with --output: a count, or a ratio of
    /// S written with a decimal point.
    #[arg(long, default_value = "128", value_name = "N|RATIO",
          value_parser = super::run::parse_window, help_heading = "Decode config (--output)")]
    pub window_size: Size,
    /// heavy_size of the decode config written with --output: a count, or a ratio of S
    /// written with a decimal point (0.1: floor(0.1 * S) at each step, as upstream).
    #[arg(long, default_value = "128", value_name = "N|RATIO",
          value_parser = super::run::parse_heavy, help_heading = "Decode config (--output)")]
    pub heavy_size: Size,
    /// Seed of the generated keys (and of the query written with --output).
    #[arg(
        long,
        default_value_t = 0,
        env = "TRITONRT_SEED",
        help_heading = "Inputs"
    )]
    pub seed: u64,
    /// How generated keys are drawn.
    #[arg(long, value_enum, default_value = "normal", help_heading = "Inputs")]
    pub values: KeyValues,
    /// Read the keys (tensor `key`, [B, H_kv, S, D], fp32/bf16/fp16) and, for --init
    /// given, `pq_centroids` from this safetensors file; the shape comes from the file.
    #[arg(short = 'i', long, help_heading = "Inputs")]
    pub input: Option<PathBuf>,
    /// Write the codebook (and a decode step's inputs around it) to this safetensors file.
    #[arg(short = 'o', long, help_heading = "Output")]
    pub output: Option<PathBuf>,
    /// Which implementation runs the prefill.
    #[arg(
        long,
        value_enum,
        default_value = "auto",
        env = "TRITONRT_BACKEND",
        help_heading = "Backend"
    )]
    pub backend: Backend,
    /// Skip the check against the CPU reference (slow on large shapes).
    #[arg(long, help_heading = "Backend")]
    pub no_check: bool,
    /// Timed GPU runs (medians after a warm-up); 0 times nothing.
    #[arg(long, default_value_t = 20, help_heading = "Backend")]
    pub repeat: usize,
    /// CUDA device ordinal.
    #[arg(
        long,
        default_value_t = 0,
        env = "TRITONRT_DEVICE",
        help_heading = "Backend"
    )]
    pub device: usize,
    #[command(flatten)]
    pub ptx: super::core_cmds::PtxCacheArg,
}

/// A spinner with elapsed time on stderr for work that may take seconds.
fn spinner(msg: &str) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new_spinner();
    bar.set_style(
        indicatif::ProgressStyle::with_template("{spinner} {msg} ({elapsed})")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
    );
    bar.set_message(msg.to_string());
    bar.enable_steady_tick(std::time::Duration::from_millis(200));
    bar
}

/// Read `key` (and `pq_centroids` when present) from a safetensors file.
fn read_keys(path: &std::path::Path) -> anyhow::Result<(DType, PrefillInputs)> {
    use safetensors::{Dtype as St, SafeTensors};
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let st = SafeTensors::deserialize(&bytes)
        .map_err(|e| anyhow::anyhow!("{}: not a valid safetensors file: {e}", path.display()))?;
    let key = st.tensor("key").map_err(|_| {
        anyhow::anyhow!(
            "{}: no tensor `key` (expected [B, H_kv, S, D])",
            path.display()
        )
    })?;
    let shape = key.shape();
    anyhow::ensure!(
        shape.len() == 4,
        "{}: tensor `key`: expected 4 dimensions [B, H_kv, S, D], got {shape:?}",
        path.display()
    );
    let to_f32 = |t: &safetensors::tensor::TensorView<'_>,
                  name: &str|
     -> anyhow::Result<(DType, Vec<f32>)> {
        let d = t.data();
        Ok(match t.dtype() {
            St::F32 => (
                DType::F32,
                d.chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
            ),
            St::BF16 => (
                DType::BF16,
                d.chunks_exact(2)
                    .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
                    .collect(),
            ),
            St::F16 => (
                DType::F16,
                d.chunks_exact(2)
                    .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                    .collect(),
            ),
            other => anyhow::bail!(
                "{}: tensor `{name}`: expected fp32, bf16 or fp16, got {other:?}",
                path.display()
            ),
        })
    };
    let (dtype, values) = to_f32(&key, "key")?;
    let cents = match st.tensor("pq_centroids") {
        Ok(c) => {
            anyhow::ensure!(
                c.dtype() == St::F32,
                "{}: tensor `pq_centroids`: expected fp32, got {:?}",
                path.display(),
                c.dtype()
            );
            Some(to_f32(&c, "pq_centroids")?.1)
        }
        Err(_) => None,
    };
    let shape = PrefillShape {
        b: shape[0],
        h_kv: shape[1],
        s: shape[2],
        d: shape[3],
    };
    Ok((
        dtype,
        PrefillInputs {
            shape,
            key: values,
            centroids: cents,
        },
    ))
}

fn build(a: &PrefillArgs) -> anyhow::Result<(PrefillConfig, PrefillInputs, String)> {
    let mut cfg = PrefillConfig {
        pq_group_factor: a.pq_group_factor,
        pq_bits: a.pq_bits,
        metric: a.metric,
        init_offset: a.init_offset,
        kmeans_iter: a.kmeans_iter,
        init: a.init,
        input_dtype: a.dtype.unwrap_or(DType::BF16),
    };
    if let Some(path) = &a.input {
        let t = Instant::now();
        let (dtype, inputs) = read_keys(path)?;
        if let Some(want) = a.dtype {
            anyhow::ensure!(
                want == dtype,
                "{}: tensor `key` is {dtype} but --dtype says {want}",
                path.display()
            );
        }
        cfg.input_dtype = dtype;
        inputs
            .validate(&cfg)
            .with_context(|| format!("checking {}", path.display()))?;
        let how = format!(
            "read from {} in {:.0} ms",
            path.display(),
            t.elapsed().as_secs_f64() * 1e3
        );
        return Ok((cfg, inputs, how));
    }
    anyhow::ensure!(
        cfg.init != KmeansInit::Given,
        "--init given needs the centroids: pass --input with a `pq_centroids` tensor"
    );
    let shape = PrefillShape {
        b: a.batch,
        h_kv: a.kv_heads,
        s: a.seq_len,
        d: a.head_dim,
    };
    cfg.validate(&shape)
        .context("checking the config and shape")?;
    let t = Instant::now();
    let inputs = match a.values {
        KeyValues::Normal => PrefillInputs::random(&cfg, shape, a.seed),
        KeyValues::Separated => PrefillInputs::separated(&cfg, shape, a.seed),
    }
    .context("generating the keys")?;
    let how = format!(
        "generated ({}, seed {}) in {:.0} ms",
        match a.values {
            KeyValues::Normal => "standard normal",
            KeyValues::Separated => "separated small-integer clusters",
        },
        a.seed,
        t.elapsed().as_secs_f64() * 1e3
    );
    Ok((cfg, inputs, how))
}

/// The GPU prefill: upload, run (timed `repeat` times), copy the result to the host.
fn run_gpu(
    rt: &std::sync::Arc<Runtime>,
    cfg: &PrefillConfig,
    inputs: &PrefillInputs,
    repeat: usize,
) -> anyhow::Result<(PrefillOutput, Option<PrefillTiming>)> {
    let stream = rt.device().new_stream()?;
    let keys = DeviceKeys::upload(&stream, inputs, cfg.input_dtype)?;
    let given = match (&inputs.centroids, cfg.init) {
        (Some(c), KmeansInit::Given) => Some(
            stream
                .clone_htod(c)
                .context("uploading the given centroids")?,
        ),
        _ => None,
    };
    let pf = GpuPrefill::new(rt.clone(), cfg).context("loading the prefill kernels")?;
    let (timing, result) = if repeat > 0 {
        let (t, r) = pf.time(
            &stream,
            cfg,
            &inputs.shape,
            keys.view(),
            given.as_ref(),
            repeat,
        )?;
        (Some(t), r)
    } else {
        (
            None,
            pf.run(&stream, cfg, &inputs.shape, keys.view(), given.as_ref())?,
        )
    };
    result.check_finite()?;
    let out = result.to_host().context("copying the prefill's result")?;
    Ok((out, timing))
}

/// Entry point of `tritonrt prefill`; returns the exit code (0 ok, 1 check failed).
pub fn prefill(a: PrefillArgs) -> anyhow::Result<i32> {
    let (cfg, inputs, how) = build(&a)?;
    let sh = inputs.shape;
    let (k, dc, n) = (cfg.k_centroids(), cfg.d_c(sh.d), cfg.n(sh.s));
    say!(
        "config:  M={} bits={} (K={k}) metric={} init_offset={} kmeans_iter={} init={} keys {}",
        cfg.pq_group_factor,
        cfg.pq_bits,
        cfg.metric,
        cfg.init_offset,
        cfg.kmeans_iter,
        cfg.init,
        cfg.input_dtype
    );
    say!("inputs:  {sh}, {how}");
    say!(
        "outputs: pq_centroids [{}, {}, {}, {k}, {dc}] fp32, pq_codebook [{}, {n}, {}, {}] i64{}",
        sh.b,
        sh.h_kv,
        cfg.pq_group_factor,
        sh.b,
        sh.h_kv,
        cfg.pq_group_factor,
        if cfg.metric == Metric::Ip {
            format!(", pq_ip2l2_phi [{}] fp32", cfg.groups(&sh))
        } else {
            String::new()
        }
    );
    let rt = match a.backend {
        Backend::Cpu => None,
        _ => match pqgpu::open_runtime(a.device, &a.ptx.ptx_cache)
            .context("opening the GPU runtime")?
        {
            Ok(rt) => Some(rt),
            Err(why) if a.backend == Backend::Gpu => {
                anyhow::bail!(
                    "no GPU backend available (--backend gpu, device {}): {why}",
                    a.device
                )
            }
            Err(why) => {
                say!("gpu:     not available ({why}): running the CPU reference");
                None
            }
        },
    };
    let mut reference_run = None;
    let out = match &rt {
        Some(rt) => {
            let (out, timing) = run_gpu(rt, &cfg, &inputs, a.repeat)?;
            say!(
                "gpu:     {} (sm_{})",
                rt.device().name(),
                rt.device().arch()
            );
            if let Some(t) = timing {
                say!(
                    "time:    {:.3} ms wall, {:.3} ms GPU (medians of {}, launches + synchronize)",
                    t.wall_us / 1e3,
                    t.gpu_us / 1e3,
                    t.samples
                );
            }
            out
        }
        None => {
            let bar = spinner("CPU reference prefill");
            let t = Instant::now();
            let r = reference::prefill(&cfg, &inputs).context("CPU reference prefill")?;
            bar.finish_and_clear();
            say!(
                "cpu:     reference prefill (f64, {} threads) in {:.1} s",
                tritonrt::pq::host_threads(),
                t.elapsed().as_secs_f64()
            );
            let out = r.to_output();
            reference_run = Some(r);
            out
        }
    };
    let (lo, hi) = (
        out.iterations.iter().min().copied().unwrap_or(0),
        out.iterations.iter().max().copied().unwrap_or(0),
    );
    say!(
        "k-means: {lo}..{hi} centroid updates per group (of at most {})",
        cfg.kmeans_iter
    );
    let passed = if reference_run.is_some() {
        say!("check:   skipped (cpu backend is the reference)");
        true
    } else if a.no_check {
        say!("check:   skipped (--no-check)");
        true
    } else {
        let bar = spinner("CPU reference prefill for the check");
        let t = Instant::now();
        let r = reference::prefill(&cfg, &inputs).context("CPU reference prefill")?;
        let mode = match (a.values, &a.input) {
            (KeyValues::Separated, None) => PrefillCheckMode::Exact,
            _ => PrefillCheckMode::Spec,
        };
        let report = pcheck::check_with(
            &cfg,
            &inputs,
            &r,
            &out,
            &pcheck::PrefillCheckOptions {
                mode,
                ..Default::default()
            },
        );
        bar.finish_and_clear();
        say!(
            "check:   {report}  [against the CPU reference, {:.1} s]",
            t.elapsed().as_secs_f64()
        );
        report.passed()
    };
    if let Some(path) = &a.output {
        write_output(path, &a, &cfg, &inputs, &out)?;
        say!("codebook written to {}", path.display());
    }
    Ok(if passed { EXIT_OK } else { EXIT_CHECK_FAILED })
}

/// `len` standard-normal values from `seed`, rounded to `dtype` (the decode query written
/// with `--output`).
fn random_query(len: usize, seed: u64, dtype: DType) -> Vec<f32> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed ^ 0x5155_4552_595f_5146);
    (0..len)
        .map(|_| dtype.round(rng.sample::<f32, _>(rand_distr::StandardNormal)))
        .collect()
}

/// Write the codebook with a decode step's inputs around it (`tritonrt run --input`).
fn write_output(
    path: &std::path::Path,
    a: &PrefillArgs,
    cfg: &PrefillConfig,
    inputs: &PrefillInputs,
    out: &PrefillOutput,
) -> anyhow::Result<()> {
    let sh = inputs.shape;
    let h = a.heads.unwrap_or(4 * sh.h_kv);
    let pq_cfg = cfg.pq_config(a.sink_size, a.window_size, a.heavy_size, cfg.input_dtype);
    let shape = Shape {
        b: sh.b,
        h,
        h_kv: sh.h_kv,
        s: sh.s,
        d: sh.d,
    };
    pq_cfg
        .validate(&shape)
        .context("checking the decode config written with --output")?;
    let query = random_query(sh.b * h * sh.d, a.seed, cfg.input_dtype);
    let dec = PqInputs {
        shape,
        query,
        key: inputs.key.clone(),
        centroids: out.centroids.clone(),
        codes: out.codes.clone(),
        n_cached: out.n,
        phi: out.phi.clone(),
    };
    tritonrt::pq::io::write_inputs(path, &pq_cfg, &dec)
        .with_context(|| format!("writing {}", path.display()))
}

/// One row of `tritonrt bench --prefill`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PrefillBenchRow {
    /// The shape.
    pub shape: String,
    /// `M`, bits.
    pub m: usize,
    /// Bits per code.
    pub bits: u32,
    /// Median wall time, ms.
    pub wall_ms: f64,
    /// Median GPU time, ms.
    pub gpu_ms: f64,
    /// Keys read once per iteration at the measured copy bandwidth, ms.
    pub floor_ms: f64,
    /// Centroid updates per group, least and most.
    pub iterations: (u32, u32),
    /// Device bytes of the result.
    pub result_bytes: usize,
}

/// `tritonrt bench --prefill`: the spec's prefill shapes (bf16 keys, kmeans_iter 10).
pub fn bench(
    rt: &std::sync::Arc<Runtime>,
    repeat: usize,
    bandwidth: f64,
    seed: u64,
) -> anyhow::Result<Vec<PrefillBenchRow>> {
    let shapes: [(usize, usize, usize, usize, u32); 5] = [
        (1, 8, 32768, 2, 6),
        (1, 8, 32768, 2, 8),
        (1, 8, 32768, 4, 8),
        (1, 32, 32768, 2, 6),
        (4, 8, 131072, 2, 6),
    ];
    say!(
        "{:<28} {:>5} {:>10} {:>10} {:>10} {:>7} {:>9}",
        "prefill shape (bf16, 10 it)",
        "M,b",
        "wall ms",
        "GPU ms",
        "floor ms",
        "x floor",
        "updates"
    );
    let mut rows = Vec::new();
    for (b, h_kv, s, m, bits) in shapes {
        let cfg = PrefillConfig {
            pq_group_factor: m,
            pq_bits: bits,
            metric: Metric::Euclidean,
            init_offset: 128,
            kmeans_iter: 10,
            init: KmeansInit::Strided,
            input_dtype: DType::BF16,
        };
        let shape = PrefillShape { b, h_kv, s, d: 128 };
        let inputs = PrefillInputs::random(&cfg, shape, seed)?;
        let stream = rt.device().new_stream()?;
        let keys = DeviceKeys::upload(&stream, &inputs, cfg.input_dtype)?;
        drop(inputs);
        let pf = GpuPrefill::new(rt.clone(), &cfg)?;
        let (t, r) = pf.time(&stream, &cfg, &shape, keys.view(), None, repeat)?;
        let its = r.iterations()?;
        let iters = (
            its.iter().min().copied().unwrap_or(0),
            its.iter().max().copied().unwrap_or(0),
        );
        let key_bytes = (b * h_kv * cfg.n(s) * 128 * 2) as f64;
        let floor_ms = key_bytes * cfg.kmeans_iter as f64 / bandwidth * 1e3;
        let row = PrefillBenchRow {
            shape: format!("B={b} H_kv={h_kv} S={s}"),
            m,
            bits,
            wall_ms: t.wall_us / 1e3,
            gpu_ms: t.gpu_us / 1e3,
            floor_ms,
            iterations: iters,
            result_bytes: r.bytes(),
        };
        say!(
            "{:<28} {:>5} {:>10.3} {:>10.3} {:>10.3} {:>7.1} {:>4}..{:<4}",
            row.shape,
            format!("{m},{bits}"),
            row.wall_ms,
            row.gpu_ms,
            row.floor_ms,
            row.wall_ms / row.floor_ms,
            iters.0,
            iters.1
        );
        rows.push(row);
    }
    Ok(rows)
}

/// `tritonrt run --prefill`: the prefill on the prompt of the generated (or read)
/// sequence (positions `0 .. init_offset + N_cached`), checked against the CPU reference
/// prefill; then the decode step at `S` on the prefill's codebook, taken over on the
/// device with no copy ([`GpuIndexer::from_prefill`]), checked against the CPU reference
/// step run from the prefill's centroids and codes. Returns the exit code.
pub fn run_with_prefill(
    cfg: &tritonrt::pq::PqConfig,
    inputs: &PqInputs,
    kmeans_iter: usize,
    init: KmeansInit,
    a: &super::run::RunArgs,
) -> anyhow::Result<i32> {
    use tritonrt::pq::gpu::{DeviceInputs, GpuIndexer, LaunchMode};
    let sh = inputs.shape;
    let pc = PrefillConfig::from_pq(cfg, kmeans_iter, init);
    let s_p = cfg.init_offset + inputs.n_cached;
    let pin = PrefillInputs::prompt_of(inputs, s_p)?;
    let psh = pin.shape;
    pc.validate(&psh)
        .context("the prompt the prefill clusters (positions 0 .. init_offset + N_cached)")?;
    let rt =
        match pqgpu::open_runtime(a.device, &a.ptx.ptx_cache).context("opening the GPU runtime")? {
            Ok(rt) => rt,
            Err(why) => anyhow::bail!("run --prefill needs a CUDA GPU: {why}"),
        };
    let stream = rt.device().new_stream()?;
    // the whole sequence's keys on the device; the prefill reads its prompt through the
    // same view (positions < S_p), the decode step the new keys after it
    let dev = DeviceInputs::upload(
        &stream,
        &PqInputs {
            n_cached: 0,
            ..inputs.clone()
        },
        cfg,
    )?;
    let pf = GpuPrefill::new(rt.clone(), &pc).context("loading the prefill kernels")?;
    let (t, res) = pf.time(&stream, &pc, &psh, dev.key(), None, a.steps.clamp(1, 20))?;
    res.check_finite()?;
    let pout = res.to_host()?;
    say!(
        "prefill: {} keys per group, {}..{} centroid updates, {:.3} ms wall, {:.3} ms GPU (median of {})",
        pout.n,
        pout.iterations.iter().min().copied().unwrap_or(0),
        pout.iterations.iter().max().copied().unwrap_or(0),
        t.wall_us / 1e3,
        t.gpu_us / 1e3,
        t.samples
    );
    let bar = spinner("CPU reference prefill");
    let r = reference::prefill(&pc, &pin).context("CPU reference prefill")?;
    let report = pcheck::check_with(
        &pc,
        &pin,
        &r,
        &pout,
        &pcheck::PrefillCheckOptions {
            mode: PrefillCheckMode::Spec,
            ..Default::default()
        },
    );
    bar.finish_and_clear();
    say!("check:   prefill {report}");
    let mut ix = GpuIndexer::from_prefill(rt.clone(), *cfg, sh, res, &KernelChoice::new())
        .context("taking over the prefill's codebook")?;
    ix.prepare(sh.s)?;
    ix.poison_outputs()?;
    ix.step(dev.query(), dev.key(), sh.s, LaunchMode::Graph)?;
    let out = ix.download()?;
    let dec_in = PqInputs {
        centroids: pout.centroids.clone(),
        codes: pout.codes.clone(),
        n_cached: pout.n,
        phi: pout.phi.clone(),
        ..inputs.clone()
    };
    let drep = tritonrt::pq::check(cfg, &dec_in, &out);
    say!(
        "check:   decode step at S={} on the prefill's codebook: {drep}",
        sh.s
    );
    let mut wall = Vec::new();
    for i in 0..a.steps + 10 {
        ix.rewind(pout.n);
        let t0 = Instant::now();
        ix.step(dev.query(), dev.key(), sh.s, LaunchMode::Graph)?;
        ix.synchronize()?;
        if i >= 10 {
            wall.push(t0.elapsed().as_secs_f64() * 1e6);
        }
    }
    if !wall.is_empty() {
        wall.sort_by(f64::total_cmp);
        say!(
            "time:    decode step {:.1} us (median wall of {} graph replays + synchronize)",
            wall[wall.len() / 2],
            wall.len()
        );
    }
    Ok(if report.passed() && drep.passed() {
        EXIT_OK
    } else {
        EXIT_CHECK_FAILED
    })
}
