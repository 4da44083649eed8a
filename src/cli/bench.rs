//! `tritonrt bench`: time the decode step on the GPU, plain launches vs CUDA-graph
//! replay, wall-clock and GPU time, against the memory floor measured in the same run.
//!
//! The Python baselines (PyTorch eager, our kernels through Triton's launcher, and that
//! under a torch CUDA graph) are timed by `benches/compare.py`, which runs this command
//! with `--json` and `--save-inputs` so every implementation sees the same inputs.

use std::collections::HashMap;
use std::path::PathBuf;

use anyhow::Context;
use safetensors::tensor::{Dtype as StDtype, TensorView};

use tritonrt::pq::gpu::{self, BenchResult, KernelChoice};
use tritonrt::pq::{PqConfig, PqInputs, Shape, Workload};

macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout().lock(), $($arg)*);
    }};
}

/// Arguments of `tritonrt bench`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Examples:
  tritonrt bench                                  reference workload (B=1, H=32, S=32000)
  tritonrt bench --workload large                 B=4, S=131072
  tritonrt bench --sweep --json out.json          S = 4k .. 128k, machine-readable
  tritonrt bench --matrix --json matrix.json      the workload matrix: practical, reference, large, heavy sweep
  tritonrt bench --decode-loop --steps 200        ragged batch of 8 (2k..64k) from one graph vs uniform
Every step quantizes one new key by default (codes cached for S - 1 - init_offset keys), as the
upstream benchmark does; --new-keys N makes it N. Timings are medians after a warm-up.")]
pub struct BenchArgs {
    /// The workload: `reference`, `large` or `B,H,H_kv,S,D[,M[,bits[,heavy]]]` (heavy a
    /// count, or a ratio of S written with a decimal point, resolved per S); its S is
    /// replaced by --seq-lens / --sweep.
    #[arg(
        long,
        value_enum,
        default_value = "reference",
        env = "TRITONRT_WORKLOAD"
    )]
    pub workload: Workload,
    /// Sequence lengths to time, comma-separated (default: the workload's S).
    #[arg(long, value_delimiter = ',', value_name = "S,...")]
    pub seq_lens: Vec<usize>,
    /// Time S = 4096, 8192, 16384, 32768, 65536, 131072.
    #[arg(long, conflicts_with = "seq_lens")]
    pub sweep: bool,
    /// New keys each timed step quantizes (codes cached for S - init_offset - N keys);
    /// e.g. 4096 for a chunked-prefill or catch-up step.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub new_keys: usize,
    /// Timed steps per mode and shape.
    #[arg(long, default_value_t = 500)]
    pub steps: usize,
    /// Bytes of the device-to-device copy that measures the bandwidth for the floor.
    #[arg(long, default_value_t = 1 << 30)]
    pub copy_bytes: usize,
    /// Seed of the standard-normal inputs.
    #[arg(long, default_value_t = 0, env = "TRITONRT_SEED")]
    pub seed: u64,
    /// Write the results as JSON to this file (one object per shape).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Write each shape's inputs to DIR/bench_S<S>.safetensors (query, key_tail = the key
    /// rows a step reads, pq_centroids, pq_codebook; config in the metadata) for the
    /// Python baselines.
    #[arg(long, value_name = "DIR")]
    pub save_inputs: Option<PathBuf>,
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0, env = "TRITONRT_DEVICE")]
    pub device: usize,
    /// Soak test instead of timing: N decode steps in a row from one captured graph (S
    /// grows by one key per step from 4097, B=1 H=8 H_kv=2), reporting device memory
    /// after the first 100 steps and at the end, any error, and the last step checked
    /// against the CPU reference. Fails if device memory grew.
    #[arg(long, value_name = "N")]
    pub soak: Option<usize>,
    /// Time the prefill (k-means codebook) instead of the decode step: the spec's prefill
    /// shapes (bf16 keys, kmeans_iter 10, M/bits (2,6) (2,8) (4,8) at B=1 H_kv=8
    /// S=32768; H_kv=32; B=4 S=131072), wall and GPU medians of --steps runs against the
    /// floor of reading the keys once per iteration, and the updates each group ran.
    #[arg(long, conflicts_with_all = ["soak", "sweep", "seq_lens"])]
    pub prefill: bool,
    /// Shard the heads over these CUDA devices (`0,1`, `0-3`), as a tensor-parallel
    /// engine does: device d of G runs query heads [d H/G, (d+1) H/G) and their KV heads
    /// (H_kv must be a multiple of G). Checks the stitched step against the CPU
    /// reference, then times each device's shard alone and the sharded step (every
    /// device's step issued, then all synchronized): medians of wall-clock and of each
    /// device's GPU time (CUDA events), with plain launches and with graph replay.
    #[arg(long, value_name = "LIST", conflicts_with_all = ["soak", "prefill", "save_inputs"])]
    pub devices: Option<String>,
    /// Time the workload matrix in one run (`tritonrt::pq::matrix`): the spec's
    /// practical workloads ((M, bits) (2,6) (2,8) (4,8) at B=1 H=32 H_kv=8 S=32768 bf16,
    /// heavy 3020), the large practical one (B=4 S=131072, heavy 12851 and 12083), the
    /// reference and large workloads, and heavy 128/512/2048/8192 on the practical shape.
    /// One row each: graph wall and GPU time (medians, us), memory floor, wall/floor, the
    /// indexer's device bytes, the step path, and the last timed step checked against the
    /// CPU reference (spec rule, every row B*H). A row the GPU refuses prints its reason.
    /// --workload, --seq-lens and --sweep do not apply; --save-inputs writes
    /// DIR/<row>.safetensors.
    #[arg(long, conflicts_with_all = ["soak", "prefill", "sweep", "seq_lens", "devices"])]
    pub matrix: bool,
    /// With --matrix: only these rows, by name (e.g. `practical-m2b6,practical-large`).
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "NAME,...",
        requires = "matrix"
    )]
    pub matrix_rows: Vec<String>,
    /// Time a ragged batch's decode loop: B = 8 sequences of different lengths
    /// (--seq-lens gives them; default 2048, 4096, 8192, 12288, 16384, 24576, 32768,
    /// 65536) on the workload's config and heads, each step appending one key per
    /// sequence and every 8th step 4 to one of them, replayed from one captured graph
    /// whose seq_lens live in a device buffer updated between replays; medians of wall
    /// and GPU time per step over --steps on the config's ragged path and its other
    /// paths, beside a uniform batch of the same total length (the fixed-S step, and the
    /// ragged kernels at equal lengths).
    #[arg(long, conflicts_with_all = ["soak", "prefill", "sweep", "devices", "matrix"])]
    pub decode_loop: bool,
    /// Run this kernel variant in place of the tuned or default one in the timed steps
    /// (an id that `tritonrt inspect` lists; repeatable, one per kernel).
    #[arg(
        long = "variant",
        value_name = "ID",
        conflicts_with_all = ["soak", "prefill", "devices"]
    )]
    pub variants: Vec<String>,
    #[command(flatten)]
    pub ptx: super::core_cmds::PtxCacheArg,
}

fn save_inputs(path: &std::path::Path, cfg: &PqConfig, inputs: &PqInputs) -> anyhow::Result<()> {
    let sh = inputs.shape;
    let first = (cfg.init_offset + inputs.n_cached).min(sh.s);
    let tail = sh.s - first;
    let mut key_tail = Vec::with_capacity(sh.b * sh.h_kv * tail * sh.d);
    for bg in 0..sh.b * sh.h_kv {
        key_tail
            .extend_from_slice(&inputs.key[(bg * sh.s + first) * sh.d..(bg * sh.s + sh.s) * sh.d]);
    }
    let f32b = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let q = f32b(&inputs.query);
    let k = f32b(&key_tail);
    let c = f32b(&inputs.centroids);
    let codes: Vec<u8> = inputs.codes.iter().flat_map(|x| x.to_le_bytes()).collect();
    let (m, kc, dc) = (cfg.m(), cfg.k_centroids(), cfg.d_c(sh.d));
    let tensors = vec![
        (
            "query",
            TensorView::new(StDtype::F32, vec![sh.b, sh.h, 1, sh.d], &q)?,
        ),
        (
            "key_tail",
            TensorView::new(StDtype::F32, vec![sh.b, sh.h_kv, tail, sh.d], &k)?,
        ),
        (
            "pq_centroids",
            TensorView::new(StDtype::F32, vec![sh.b, sh.h_kv, m, kc, dc], &c)?,
        ),
        (
            "pq_codebook",
            TensorView::new(
                StDtype::I64,
                vec![sh.b, inputs.n_cached, sh.h_kv, m],
                &codes,
            )?,
        ),
    ];
    // the sizes as counts at this file's S (a ratio resolved: the baselines read ints)
    let meta: HashMap<String, String> = [
        ("sink_size", cfg.sink_at(sh.s).to_string()),
        ("window_size", cfg.window_at(sh.s).to_string()),
        ("heavy_size", cfg.heavy_at(sh.s).to_string()),
        ("init_offset", cfg.init_offset.to_string()),
        ("pq_group_factor", cfg.pq_group_factor.to_string()),
        ("pq_bits", cfg.pq_bits.to_string()),
        ("metric", cfg.metric.as_str().to_string()),
        ("seq_len", sh.s.to_string()),
        ("key_first", first.to_string()),
        // the tensors are stored as f32 holding values already rounded to these dtypes
        ("input_dtype", cfg.input_dtype.as_str().to_string()),
        ("weight_dtype", cfg.weight_dtype.as_str().to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let bytes = safetensors::serialize(tensors, Some(meta))?;
    tritonrt::artifact::write_atomic(path, &bytes)?;
    Ok(())
}

/// Entry point of `tritonrt bench`; returns the process exit code.
pub fn bench(a: BenchArgs) -> anyhow::Result<i32> {
    if let Some(list) = &a.devices {
        let ordinals = tritonrt::pq::shard_plan::parse_devices(list)?;
        return bench_devices(&a, &ordinals);
    }
    if a.matrix {
        // refuse an unknown row name before opening the GPU
        tritonrt::pq::matrix::select_rows(&a.matrix_rows)?;
    }
    let rt =
        match gpu::open_runtime(a.device, &a.ptx.ptx_cache).context("opening the GPU runtime")? {
            Ok(rt) => rt,
            Err(why) => anyhow::bail!("tritonrt bench needs a CUDA GPU: {why}"),
        };
    let cfg = a.workload.config();
    if a.prefill {
        let stream = rt.device().new_stream()?;
        let bw =
            gpu::copy_bandwidth(&rt, &stream, a.copy_bytes).context("measuring copy bandwidth")?;
        say!(
            "device:  {} (sm_{}), copy bandwidth {:.2} TB/s",
            rt.device().name(),
            rt.device().arch(),
            bw / 1e12
        );
        let rows = super::prefill::bench(&rt, a.steps.min(50), bw, a.seed)?;
        if let Some(path) = &a.json {
            let text = serde_json::to_string_pretty(&rows)?;
            std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
        }
        return Ok(super::EXIT_OK);
    }
    if let Some(n) = a.soak {
        return soak(&rt, &cfg, n);
    }
    if a.matrix {
        return matrix(&a, &rt);
    }
    if a.decode_loop {
        let starts = if a.seq_lens.is_empty() {
            vec![2048, 4096, 8192, 12288, 16384, 24576, 32768, 65536]
        } else {
            a.seq_lens.clone()
        };
        let choice = super::run::kernel_choice(rt.store(), &a.variants)?;
        return super::ragged::decode_loop(
            &rt,
            &cfg,
            a.workload.shape(),
            &starts,
            a.steps,
            a.seed,
            &choice,
        );
    }
    let base: Shape = a.workload.shape();
    let seq_lens: Vec<usize> = if a.sweep {
        vec![4096, 8192, 16384, 32768, 65536, 131072]
    } else if a.seq_lens.is_empty() {
        vec![base.s]
    } else {
        a.seq_lens.clone()
    };
    let choice = super::run::kernel_choice(rt.store(), &a.variants)?;
    let stream = rt.device().new_stream()?;
    let bw = gpu::copy_bandwidth(&rt, &stream, a.copy_bytes).context("measuring copy bandwidth")?;
    say!(
        "device:  {} (sm_{}), copy bandwidth {:.2} TB/s (read + write, {} MiB device-to-device copy)",
        rt.device().name(),
        rt.device().arch(),
        bw / 1e12,
        a.copy_bytes >> 20
    );
    say!("config:  {cfg}");
    let mut results: Vec<BenchResult> = Vec::new();
    let bar = indicatif::ProgressBar::new(seq_lens.len() as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} shapes {msg}")
            .expect("static template"),
    );
    for &s in &seq_lens {
        bar.set_message(format!("S={s}"));
        let shape = Shape { s, ..base };
        let n_cached = cfg.n_quantized(s).saturating_sub(a.new_keys);
        let inputs = PqInputs::random(&cfg, shape, n_cached, a.seed ^ s as u64)
            .with_context(|| format!("generating inputs for S={s}"))?;
        if let Some(dir) = &a.save_inputs {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            let p = dir.join(format!("bench_S{s}.safetensors"));
            save_inputs(&p, &cfg, &inputs).with_context(|| format!("writing {}", p.display()))?;
        }
        let r = gpu::bench_shape(&rt, &cfg, &inputs, &choice, a.steps)
            .with_context(|| format!("benchmarking S={s}"))?;
        results.push(r);
        bar.inc(1);
    }
    bar.finish_and_clear();

    say!(
        "{:>3} {:>5} {:>7} | {:>10} {:>10} | {:>10} {:>10} | {:>9} {:>9} | {:>7} {:>7} | {:>9} {:>9} {:<15}",
        "B",
        "H",
        "S",
        "launch us",
        "graph us",
        "launch gpu",
        "graph gpu",
        "floor MB",
        "floor us",
        "wall/fl",
        "gpu/fl",
        "state MB",
        "w/o out",
        "path"
    );
    let mut json = Vec::new();
    for r in &results {
        let floor_us = r.floor_bytes as f64 / bw * 1e6;
        say!(
            "{:>3} {:>5} {:>7} | {:>10.1} {:>10.1} | {:>10.1} {:>10.1} | {:>9.2} {:>9.1} | {:>7.2} {:>7.2} | {:>9.2} {:>9.2} {:<15}",
            r.shape.b,
            r.shape.h,
            r.shape.s,
            r.launch_wall.median_us,
            r.graph_wall.median_us,
            r.launch_gpu.median_us,
            r.graph_gpu.median_us,
            r.floor_bytes as f64 / 1e6,
            floor_us,
            r.graph_wall.median_us / floor_us,
            r.graph_gpu.median_us / floor_us,
            r.state.total() as f64 / 1e6,
            r.state.state() as f64 / 1e6,
            path_name(r)
        );
        for line in super::run::kernel_lines(&r.kernels) {
            say!("    kernel: {line}");
        }
        json.push(serde_json::json!({
            "device": rt.device().name(),
            "b": r.shape.b, "h": r.shape.h, "h_kv": r.shape.h_kv, "s": r.shape.s, "d": r.shape.d,
            "launch_wall_us": r.launch_wall.median_us,
            "graph_wall_us": r.graph_wall.median_us,
            "launch_gpu_us": r.launch_gpu.median_us,
            "graph_gpu_us": r.graph_gpu.median_us,
            "graph_wall_p10_us": r.graph_wall.p10_us,
            "graph_wall_p90_us": r.graph_wall.p90_us,
            "floor_bytes": r.floor_bytes,
            "floor_us": floor_us,
            "copy_bandwidth_bytes_per_s": bw,
            "select_variant": r.select_variant,
            "kernels": kernels_json(&r.kernels),
            "path": path_name(r),
            "state_bytes": r.state.total(),
            "state_bytes_without_outputs": r.state.state(),
            "state_bytes_detail": r.state,
            "steps": r.graph_wall.samples,
        }));
    }
    say!("(us: medians per step; wall = host timer around step + synchronize; gpu = CUDA events; floor = bytes / copy bandwidth; state = every device byte the indexer allocated, MB = 1e6 bytes; w/o out = without its own output buffers)");
    write_json(a.json.as_deref(), &json)?;
    Ok(super::EXIT_OK)
}

/// The kernels a step launched as JSON: `[{"kernel", "variant", "origin"}, ...]`, origin
/// `override`, `table` or `default`.
fn kernels_json(kernels: &[gpu::VariantChoice]) -> serde_json::Value {
    kernels
        .iter()
        .map(|k| {
            serde_json::json!({
                "kernel": k.kernel,
                "variant": k.variant,
                "origin": k.origin.as_str(),
            })
        })
        .collect()
}

/// The step path a bench result ran: its kind's name, `+quant` when `pq_quant` ran
/// first.
fn path_name(r: &BenchResult) -> String {
    format!(
        "{}{}",
        r.kind.name(),
        if r.bulk_quantize { "+quant" } else { "" }
    )
}

/// One row of `tritonrt bench --matrix`: timed, or refused / failed with the reason.
struct MatrixOutcome {
    row: tritonrt::pq::matrix::MatrixRow,
    result: Result<(BenchResult, tritonrt::pq::CheckReport), String>,
    /// Whether the error was the indexer refusing the row (a config it has no kernel
    /// for), not a failure.
    refused: bool,
    /// [`tritonrt::pq::memory::state_bytes_for`] of the row with the shipped sm_90 facts.
    predicted: tritonrt::pq::memory::StateBytes,
}

/// `tritonrt bench --matrix`: every row of `tritonrt::pq::matrix::bench_matrix()` (or
/// those named by --matrix-rows) timed in one run; see [`BenchArgs::matrix`].
fn matrix(a: &BenchArgs, rt: &std::sync::Arc<tritonrt::runtime::Runtime>) -> anyhow::Result<i32> {
    use tritonrt::pq::matrix::select_rows;
    use tritonrt::pq::memory::{state_bytes_for, SelectSizes};
    use tritonrt::pq::plan::{PlanFacts, SelectPath};
    let rows = select_rows(&a.matrix_rows)?;
    let choice = super::run::kernel_choice(rt.store(), &a.variants)?;
    let stream = rt.device().new_stream()?;
    let bw = gpu::copy_bandwidth(rt, &stream, a.copy_bytes).context("measuring copy bandwidth")?;
    let sms = rt.device().sm_count();
    say!(
        "device:  {} (sm_{}, {} SMs), copy bandwidth {:.2} TB/s (read + write, {} MiB device-to-device copy)",
        rt.device().name(),
        rt.device().arch(),
        sms,
        bw / 1e12,
        a.copy_bytes >> 20
    );
    say!(
        "matrix:  {} rows, {} timed steps per mode each, {} new key(s) per step; check: the last timed step against the CPU reference, spec rule, every row B*H",
        rows.len(),
        a.steps,
        a.new_keys
    );
    let bar = indicatif::ProgressBar::new(rows.len() as u64);
    if let Ok(style) =
        indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} rows {elapsed} {msg}")
    {
        bar.set_style(style);
    }
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        bar.set_message(row.name.clone());
        let (cfg, shape) = (row.cfg, row.shape);
        let predicted = state_bytes_for(
            &cfg,
            &shape,
            shape.s,
            SelectPath::Auto,
            &PlanFacts::shipped_sm90(&cfg, shape.s, sms),
            SelectSizes::shipped(&cfg, shape.s),
        );
        let n_cached = cfg.n_quantized(shape.s).saturating_sub(a.new_keys);
        let inputs = PqInputs::random(&cfg, shape, n_cached, a.seed ^ shape.s as u64)
            .with_context(|| format!("generating inputs for {}", row.name))?;
        if let Some(dir) = &a.save_inputs {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            let p = dir.join(format!("{}.safetensors", row.name));
            save_inputs(&p, &cfg, &inputs).with_context(|| format!("writing {}", p.display()))?;
        }
        let (result, refused) = match gpu::bench_shape(rt, &cfg, &inputs, &choice, a.steps) {
            Ok(r) => {
                bar.set_message(format!("{}: checking", row.name));
                let report = tritonrt::pq::check(&cfg, &inputs, &r.last_output);
                (Ok((r, report)), false)
            }
            // the indexer's refusals (no kernel for the config) are Invalid errors that name
            // the parameter; anything else (a driver error) is a failure
            Err(e) => {
                let refused =
                    matches!(&e, tritonrt::Error::Invalid { what, .. } if what == "heavy_size");
                (Err(e.to_string()), refused)
            }
        };
        out.push(MatrixOutcome {
            row,
            result,
            refused,
            predicted,
        });
        bar.inc(1);
    }
    bar.finish_and_clear();

    say!(
        "{:<22} {:<16} | {:>9} {:>9} | {:>8} {:>7} | {:>8} {:>8} | check",
        "row",
        "path",
        "wall us",
        "gpu us",
        "floor us",
        "wall/fl",
        "state MB",
        "w/o out"
    );
    let mut json = Vec::new();
    let mut failed = false;
    for o in &out {
        let (cfg, sh) = (o.row.cfg, o.row.shape);
        let mut js = serde_json::json!({
            "name": o.row.name,
            "description": o.row.what,
            "device": rt.device().name(),
            "b": sh.b, "h": sh.h, "h_kv": sh.h_kv, "s": sh.s, "d": sh.d,
            "m": cfg.m(), "bits": cfg.pq_bits, "heavy": cfg.heavy_size,
            "sink": cfg.sink_size, "window": cfg.window_size, "init_offset": cfg.init_offset,
            "dtype": cfg.input_dtype.as_str(), "weight_dtype": cfg.weight_dtype.as_str(),
            "metric": cfg.metric.as_str(),
            "copy_bandwidth_bytes_per_s": bw,
            "state_bytes_predicted": o.predicted.total(),
        });
        match &o.result {
            Ok((r, report)) => {
                let floor_us = r.floor_bytes as f64 / bw * 1e6;
                let path = path_name(r);
                say!(
                    "{:<22} {:<16} | {:>9.1} {:>9.1} | {:>8.1} {:>7.2} | {:>8.2} {:>8.2} | {}",
                    o.row.name,
                    path,
                    r.graph_wall.median_us,
                    r.graph_gpu.median_us,
                    floor_us,
                    r.graph_wall.median_us / floor_us,
                    r.state.total() as f64 / 1e6,
                    r.state.state() as f64 / 1e6,
                    report
                );
                for line in super::run::kernel_lines(&r.kernels) {
                    say!("{:<22} kernel: {line}", "");
                }
                if r.state != o.predicted {
                    say!(
                        "{:<22} note: the CPU prediction of the state was {} bytes, the indexer allocated {} ({:?})",
                        "",
                        o.predicted.total(),
                        r.state.total(),
                        r.state
                    );
                }
                failed |= !report.passed();
                let extra = serde_json::json!({
                    "refused": null,
                    "path": path,
                    "select_variant": r.select_variant,
                    "kernels": kernels_json(&r.kernels),
                    "launch_wall_us": r.launch_wall.median_us,
                    "graph_wall_us": r.graph_wall.median_us,
                    "launch_gpu_us": r.launch_gpu.median_us,
                    "graph_gpu_us": r.graph_gpu.median_us,
                    "graph_wall_p10_us": r.graph_wall.p10_us,
                    "graph_wall_p90_us": r.graph_wall.p90_us,
                    "floor_bytes": r.floor_bytes,
                    "floor_us": floor_us,
                    "wall_over_floor": r.graph_wall.median_us / floor_us,
                    "state_bytes": r.state.total(),
                    "state_bytes_without_outputs": r.state.state(),
                    "state_bytes_detail": r.state,
                    "check": report.to_string(),
                    "check_passed": report.passed(),
                    "check_rows": report.rows,
                    "steps": r.graph_wall.samples,
                });
                merge(&mut js, extra);
            }
            Err(why) => {
                let label = if o.refused { "refused" } else { "FAILED" };
                say!("{:<22} {label}: {why}", o.row.name);
                failed |= !o.refused;
                merge(
                    &mut js,
                    serde_json::json!({
                        "refused": if o.refused { Some(why) } else { None },
                        "error": if o.refused { None } else { Some(why) },
                        "path": null, "graph_wall_us": null, "graph_gpu_us": null,
                        "launch_wall_us": null, "launch_gpu_us": null, "floor_us": null,
                        "state_bytes": null, "check": null, "check_passed": null,
                    }),
                );
            }
        }
        json.push(js);
    }
    say!("(us: medians per step; wall = CUDA-graph replay, host timer around step + synchronize; gpu = CUDA events around each replay; floor = bytes the step must move / copy bandwidth; state = every device byte the indexer allocated, MB = 1e6 bytes; w/o out = without its own output buffers; path: the step's kind, +quant where pq_quant ran first)");
    write_json(a.json.as_deref(), &json)?;
    Ok(if failed {
        super::EXIT_CHECK_FAILED
    } else {
        super::EXIT_OK
    })
}

/// Copy `extra`'s fields into the JSON object `into`.
fn merge(into: &mut serde_json::Value, extra: serde_json::Value) {
    if let (Some(o), serde_json::Value::Object(e)) = (into.as_object_mut(), extra) {
        o.extend(e);
    }
}

/// `tritonrt bench --soak N`: a decode loop of `n` graph-replayed steps on one indexer.
fn soak(
    rt: &std::sync::Arc<tritonrt::runtime::Runtime>,
    cfg: &PqConfig,
    n: usize,
) -> anyhow::Result<i32> {
    use gpu::{DeviceInputs, GpuIndexer, LaunchMode};
    anyhow::ensure!(n >= 1, "--soak needs at least one step");
    let s0 = 4096;
    let shape = Shape {
        b: 1,
        h: 8,
        h_kv: 2,
        s: s0 + n,
        d: 128,
    };
    let n0 = cfg.n_quantized(s0) - 1;
    let inputs = PqInputs::random(cfg, shape, n0, 1).context("generating inputs")?;
    let stream = rt.device().new_stream()?;
    let mut ix = GpuIndexer::new(
        rt.clone(),
        stream.clone(),
        *cfg,
        shape,
        &inputs.centroids,
        None,
        &KernelChoice::new(),
    )?;
    ix.import_codes(&inputs.codes, n0)?;
    // every key the loop will quantize, uploaded once (DeviceInputs uploads from N_cached on)
    let dev = DeviceInputs::upload(&stream, &inputs, cfg)?;
    ix.prepare(shape.s)?;
    let bar = indicatif::ProgressBar::new(n as u64);
    if let Ok(style) = indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} steps {msg}") {
        bar.set_style(style);
    }
    let t0 = std::time::Instant::now();
    let (mut captures, mut warm_free) = (0usize, None);
    for (i, s) in (s0 + 1..=s0 + n).enumerate() {
        let info = ix
            .step(dev.query(), dev.key(), s, LaunchMode::Graph)
            .with_context(|| format!("step {i} (S={s})"))?;
        captures += usize::from(info.captured);
        if i == 99.min(n - 1) {
            ix.synchronize()?;
            warm_free = Some(rt.device().mem_info()?.0);
        }
        if i % 1000 == 999 {
            ix.synchronize()
                .with_context(|| format!("steps up to {i} (S={s})"))?;
            bar.set_position(i as u64 + 1);
        }
    }
    ix.synchronize().context("the last steps")?;
    bar.finish_and_clear();
    let secs = t0.elapsed().as_secs_f64();
    let end_free = rt.device().mem_info()?.0;
    let out = ix.download()?;
    let report = tritonrt::pq::check(cfg, &inputs, &out);
    let start_free = warm_free.unwrap_or(end_free);
    let grew = start_free.saturating_sub(end_free);
    say!(
        "soak:    {n} decode steps, S = {}..={} (B=1, H=8, H_kv=2), graph captured {captures} time(s), {:.1} us per step (wall, steps queued back to back)",
        s0 + 1,
        s0 + n,
        secs * 1e6 / n as f64
    );
    say!(
        "memory:  device free {:.1} MiB after 100 steps, {:.1} MiB at the end: {} ({} bytes)",
        start_free as f64 / 1048576.0,
        end_free as f64 / 1048576.0,
        if grew == 0 { "no growth" } else { "GREW" },
        grew
    );
    say!("check:   last step {report}");
    Ok(if grew == 0 && report.passed() {
        super::EXIT_OK
    } else {
        super::EXIT_CHECK_FAILED
    })
}

/// `tritonrt bench --devices LIST`: the step with its heads sharded over several GPUs.
fn bench_devices(a: &BenchArgs, ordinals: &[usize]) -> anyhow::Result<i32> {
    use tritonrt::pq::sharded::{bench_sharded, ShardedBench, ShardedIndexer};
    let cfg = a.workload.config();
    let base: Shape = a.workload.shape();
    // refuse a bad split before opening any device or generating any input
    tritonrt::pq::shard_plan::ShardPlan::new(base, ordinals.len())?;
    let mut rts = Vec::with_capacity(ordinals.len());
    for &o in ordinals {
        match gpu::open_runtime(o, &a.ptx.ptx_cache)
            .with_context(|| format!("opening the GPU runtime on device {o}"))?
        {
            Ok(rt) => rts.push(rt),
            Err(why) => anyhow::bail!("tritonrt bench --devices needs CUDA device {o}: {why}"),
        }
    }
    for rt in &rts {
        let d = rt.device();
        say!(
            "device {}: {} (sm_{}, {} SMs)",
            d.ordinal(),
            d.name(),
            d.arch(),
            d.sm_count()
        );
    }
    say!("config:  {cfg}");
    let seq_lens: Vec<usize> = if a.sweep {
        vec![4096, 8192, 16384, 32768, 65536, 131072]
    } else if a.seq_lens.is_empty() {
        vec![base.s]
    } else {
        a.seq_lens.clone()
    };
    let mut json = Vec::new();
    let mut failed = false;
    for &s in &seq_lens {
        let shape = Shape { s, ..base };
        let n_cached = PqInputs::default_n_cached(&cfg, s);
        let inputs = PqInputs::random(&cfg, shape, n_cached, a.seed ^ s as u64)
            .with_context(|| format!("generating inputs for S={s}"))?;
        let mut ix = ShardedIndexer::new(
            &rts,
            cfg,
            shape,
            &inputs.centroids,
            inputs.phi.as_deref(),
            &KernelChoice::new(),
        )?;
        ix.import_codes(&inputs.codes, n_cached)?;
        let up = ix.upload(&inputs)?;
        let shard_in = ShardedIndexer::inputs_of(&up);
        ix.prepare(s)?;
        ix.poison_outputs()?;
        ix.step(&shard_in, s, gpu::LaunchMode::Launch)?;
        ix.synchronize()?;
        let out = ix.download_stitched()?;
        let report = tritonrt::pq::check(&cfg, &inputs, &out);
        let plan = *ix.plan();
        say!(
            "{shape} over {} devices ({} per device): stitched step vs CPU reference: {}",
            plan.devices(),
            plan.shard_shape(),
            if report.passed() { "PASS" } else { "FAIL" }
        );
        if !report.passed() {
            say!("{report}");
            failed = true;
            continue;
        }
        let steps = a.steps.max(1);
        let launch = bench_sharded(
            &mut ix,
            &shard_in,
            s,
            n_cached,
            steps,
            gpu::LaunchMode::Launch,
        )
        .with_context(|| format!("timing S={s} with plain launches"))?;
        let graph = bench_sharded(
            &mut ix,
            &shard_in,
            s,
            n_cached,
            steps,
            gpu::LaunchMode::Graph,
        )
        .with_context(|| format!("timing S={s} with graph replay"))?;
        say!(
            "{:>6} {:>7} {:>8} | {:>10} {:>10} {:>12} | {:>10} {:>10} {:>12}",
            "device",
            "heads",
            "kv heads",
            "alone wall",
            "alone gpu",
            "sharded gpu",
            "alone wall",
            "alone gpu",
            "sharded gpu"
        );
        say!(
            "{:>25} | {:^34} | {:^34}",
            "",
            "plain launches (us)",
            "graph replay (us)"
        );
        for (d, &o) in launch.ordinals.iter().enumerate() {
            let (q, kv) = (plan.q_heads(d), plan.kv_heads(d));
            say!(
                "{:>6} {:>7} {:>8} | {:>10.1} {:>10.1} {:>12.1} | {:>10.1} {:>10.1} {:>12.1}",
                o,
                format!("{}-{}", q.start, q.end - 1),
                format!("{}-{}", kv.start, kv.end - 1),
                launch.alone_wall[d].median_us,
                launch.alone_gpu[d].median_us,
                launch.sharded_gpu[d].median_us,
                graph.alone_wall[d].median_us,
                graph.alone_gpu[d].median_us,
                graph.sharded_gpu[d].median_us,
            );
        }
        say!(
            "sharded step, wall (all issued, then all synchronized): {:.1} us plain launches, {:.1} us graph replay (p10 {:.1}, p90 {:.1})",
            launch.sharded_wall.median_us,
            graph.sharded_wall.median_us,
            graph.sharded_wall.p10_us,
            graph.sharded_wall.p90_us
        );
        let js = |b: &ShardedBench| {
            serde_json::json!({
                "alone_wall_us": b.alone_wall.iter().map(|t| t.median_us).collect::<Vec<_>>(),
                "alone_gpu_us": b.alone_gpu.iter().map(|t| t.median_us).collect::<Vec<_>>(),
                "sharded_gpu_us": b.sharded_gpu.iter().map(|t| t.median_us).collect::<Vec<_>>(),
                "sharded_wall_us": b.sharded_wall.median_us,
                "sharded_wall_p10_us": b.sharded_wall.p10_us,
                "sharded_wall_p90_us": b.sharded_wall.p90_us,
                "steps": b.sharded_wall.samples,
            })
        };
        json.push(serde_json::json!({
            "devices": launch.ordinals,
            "names": rts.iter().map(|r| r.device().name().to_string()).collect::<Vec<_>>(),
            "b": shape.b, "h": shape.h, "h_kv": shape.h_kv, "s": shape.s, "d": shape.d,
            "launch": js(&launch),
            "graph": js(&graph),
        }));
    }
    say!("(us: medians per step; wall = host timer around step(s) + synchronize; gpu = CUDA events on each device's stream)");
    write_json(a.json.as_deref(), &json)?;
    Ok(if failed {
        super::EXIT_CHECK_FAILED
    } else {
        super::EXIT_OK
    })
}

/// Write `json` (pretty, one trailing newline) to `path` where given, atomically (nothing
/// half-written), and say where.
///
/// Errors: serialization or I/O, naming the file.
fn write_json(path: Option<&std::path::Path>, json: &[serde_json::Value]) -> anyhow::Result<()> {
    if let Some(path) = path {
        let text = serde_json::to_string_pretty(json)? + "\n";
        tritonrt::artifact::write_atomic(path, text.as_bytes())
            .with_context(|| format!("writing {}", path.display()))?;
        say!("results written to {}", path.display());
    }
    Ok(())
}
