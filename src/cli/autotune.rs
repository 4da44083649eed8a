//! `tritonrt autotune`: time every compiled variant of each kernel on this GPU, persist
//! the winners in the tuning table, and import / export / show tables.

use std::path::PathBuf;

use anyhow::Context;

use super::{EXIT_ERROR, EXIT_OK};
use tritonrt::pq::tune::{default_workloads, GpuRequest, StepWorkload};
use tritonrt::tune::{self, TuneSettings, TuningTable};

/// Arguments of `tritonrt autotune`.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Time every compiled variant of each kernel on this GPU for the shape \
buckets of the given workloads, and persist the winners in the tuning table.\n\n\
With no --kernel, each workload tunes the kernels its decode step launches that have more \
than one variant (selection, quantize, weight fill), one after the other: each variant is \
timed as a whole decode step (CUDA-graph replay) with the other kernels at their current \
choice, so a kernel tuned later runs beside the winners found before it. With no \
--workload, the practical workloads (practical-m2b6, practical-m2b8, practical-m4b8) and \
the reference workload are tuned.\n\n\
For each kernel and bucket the manifest's default variant is timed and is the correctness \
oracle: a variant that fails to launch or whose output differs from the default's is \
reported and excluded, never chosen. The winner is the lowest median time (CUDA events, \
warm-up first, input sets rotated to exceed L2), and must beat the default by 1%.\n\n\
The table lives in $TRITONRT_CACHE_DIR/tuning.json (default: the user cache dir, e.g. \
~/.cache/tritonrt/tuning.json) and is written atomically, merged with what is there. \
At launch the runtime takes the tuned variant for the shape's bucket, else the manifest \
default; stale entries (kernel, variants or driver changed) are ignored.\n\n\
Table operations need no GPU: with --import and/or --export (or --show) nothing is tuned \
unless --tune is also given. Order: import, tune, export, show.\n\n\
Examples:\n  \
tritonrt autotune                                     # the practical and reference steps\n  \
tritonrt autotune --workload practical-m2b8           # one practical step's kernels\n  \
tritonrt autotune --workload practical-m2b6 --new-keys 4096   # pq_quant too\n  \
tritonrt autotune --kernel pq_score_kernel_v6 --workload 2,32,8,65536,128\n  \
tritonrt autotune --kernel pq_select --workload large --repeats 40\n  \
tritonrt autotune --tune --export deploy/tuning.json  # tune, then ship the table\n  \
tritonrt autotune --import deploy/tuning.json --show  # on the target machine"
)]
pub struct AutotuneArgs {
    /// Logical kernel to tune (repeatable): a kernel of the workload's decode step
    /// (`pq_emit.m2.w_bf16`, `pq_rsel.m2.q_bf16`, `pq_index.m2.q_fp32.w_fp32`,
    /// `pq_quant.a16.k_bf16`, `pq_select.h<K_PAD>.q_<qt>.w_<wt>`, ...; timed under the
    /// select path that launches it), `pq_score_kernel_v6` or `pq_score_lut.q_<qt>`;
    /// shorthands `pq_select` (the workload's select kernel) and `pq_score_lut`
    /// (`q_fp32`). Default: every kernel of each workload's step with more than one
    /// variant.
    #[arg(long = "kernel", value_name = "NAME")]
    pub kernels: Vec<String>,

    /// Workload whose shape buckets to tune (repeatable): a row of the bench matrix
    /// (`practical-m2b6`, `practical-m2b8`, `practical-m4b8`: bf16, heavy 0.0921875 S;
    /// `practical-large`, `heavy-512`, ...), `reference`, `large`, or
    /// `B,H,H_kv,S,D[,M[,bits[,heavy]]]` (fp32, the rest as in the reference workload;
    /// heavy a count, or a ratio of S written with a decimal point: 0.1 is floor(0.1 * S)).
    /// Default: practical-m2b6, practical-m2b8, practical-m4b8 and reference.
    #[arg(long = "workload", value_name = "SPEC")]
    pub workloads: Vec<StepWorkload>,

    /// New keys per decode step when tuning the step's kernels: 1 is a decode step; more
    /// run `pq_quant` first, which is then tuned too.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub new_keys: usize,

    /// Timed samples per variant (each the mean of --launches-per-sample launches).
    #[arg(long, value_name = "N", default_value_t = 100)]
    pub repeats: usize,

    /// Interleaved timing rounds the samples are split over (the order of the variants
    /// rotates each round, so clock drift hits them alike).
    #[arg(long, value_name = "N", default_value_t = 4)]
    pub rounds: usize,

    /// GPU-time budget per variant in seconds: the samples of a slow kernel are cut
    /// (estimated from the default's first samples, at least one per round) so that
    /// timing one variant takes about this long. 0: no limit.
    #[arg(long, value_name = "SECONDS", default_value_t = 0.5)]
    pub budget_s: f64,

    /// Seed of the generated inputs (standard-normal query, keys and centroids, uniform
    /// codes).
    #[arg(long, value_name = "N", default_value_t = tritonrt::pq::tune::DEFAULT_SEED)]
    pub seed: u64,

    /// Untimed warm-up launches before each timing call.
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub warmup: usize,

    /// Launches per timed sample (one CUDA event pair around them).
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub launches_per_sample: usize,

    /// Merge the entries of this tuning table (validated) into the table first.
    #[arg(long, value_name = "FILE")]
    pub import: Option<PathBuf>,

    /// Write the table (after import and tuning) to this file, e.g. next to ptx_cache/.
    #[arg(long, value_name = "FILE")]
    pub export: Option<PathBuf>,

    /// The tuning table to read and update.
    /// [default: $TRITONRT_CACHE_DIR/tuning.json, else <user cache dir>/tritonrt/tuning.json]
    #[arg(long, value_name = "FILE", env = "TRITONRT_TUNING_TABLE")]
    pub table: Option<PathBuf>,

    /// Print the table's winner per bucket at the end.
    #[arg(long)]
    pub show: bool,

    /// Tune even when --import, --export or --show is given.
    #[arg(long)]
    pub tune: bool,

    /// CUDA device ordinal.
    #[arg(long, value_name = "N", default_value_t = 0, env = "TRITONRT_DEVICE")]
    pub device: usize,

    /// The ptx_cache directory with manifest.json [default: the crate's ptx_cache/].
    #[arg(long, value_name = "DIR", env = "TRITONRT_PTX_CACHE")]
    pub ptx_cache: Option<PathBuf>,
}

/// Entry point of `tritonrt autotune`; returns the process exit code.
pub fn autotune(args: AutotuneArgs) -> anyhow::Result<i32> {
    let table_path = match &args.table {
        Some(p) => p.clone(),
        None => tune::table::default_path().context("locating the tuning table")?,
    };

    if let Some(file) = &args.import {
        let incoming = TuningTable::load(file)
            .with_context(|| format!("importing tuning table {}", file.display()))?;
        let stats = incoming
            .save_merged(&table_path)
            .with_context(|| format!("merging into {}", table_path.display()))?;
        println!(
            "imported {} entries from {} into {} ({} added, {} replaced)",
            incoming.len(),
            file.display(),
            table_path.display(),
            stats.added,
            stats.replaced
        );
    }

    let table_ops = args.import.is_some() || args.export.is_some() || args.show;
    let mut all_tuned = true;
    if args.tune || !table_ops {
        all_tuned = tune_on_gpu(&args, &table_path)?;
    }

    if let Some(file) = &args.export {
        let table = TuningTable::load(&table_path).with_context(|| {
            format!(
                "reading tuning table {} to export it (run `tritonrt autotune` first, or \
                 pass --table FILE)",
                table_path.display()
            )
        })?;
        table
            .save(file)
            .with_context(|| format!("exporting tuning table to {}", file.display()))?;
        println!(
            "exported {} entries from {} to {}",
            table.len(),
            table_path.display(),
            file.display()
        );
    }

    if args.show {
        let table = TuningTable::open(&table_path);
        println!(
            "tuning table {} ({} entries)",
            table_path.display(),
            table.len()
        );
        if !table.is_empty() {
            print!("{}", tune::render_summary(table.entries()));
        }
    }
    Ok(if all_tuned { EXIT_OK } else { EXIT_ERROR })
}

fn tune_on_gpu(args: &AutotuneArgs, table_path: &std::path::Path) -> anyhow::Result<bool> {
    let settings = TuneSettings {
        warmup: args.warmup,
        repeats: args.repeats,
        launches_per_sample: args.launches_per_sample,
        rounds: args.rounds,
        budget_s_per_candidate: args.budget_s,
        ..TuneSettings::default()
    };
    settings.validate()?;
    anyhow::ensure!(
        args.budget_s.is_finite() && args.budget_s >= 0.0,
        "--budget-s: expected a non-negative number of seconds (0: no limit), got {}",
        args.budget_s
    );
    anyhow::ensure!(
        args.new_keys >= 1,
        "--new-keys: expected at least 1 new key per step, got 0"
    );
    let workloads = if args.workloads.is_empty() {
        default_workloads()
    } else {
        args.workloads.clone()
    };
    let req = GpuRequest {
        device: args.device,
        ptx_cache: args
            .ptx_cache
            .clone()
            .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/ptx_cache"))),
        kernels: args.kernels.clone(),
        workloads,
        seed: args.seed,
        new_keys: args.new_keys,
        table: Some(table_path.to_path_buf()),
    };
    let session = tritonrt::pq::tune::gpu_targets(&req)?;
    let dev = &session.device;
    println!(
        "autotune on {} (sm{}, driver {}): {} target(s); ptx_cache {}; table {}",
        dev.gpu,
        dev.arch,
        dev.driver_version,
        session.targets.len(),
        req.ptx_cache.display(),
        table_path.display()
    );
    println!(
        "per variant: warm-up {} launches per call, {} samples x {} launches in {} rounds \
         (CUDA events), outputs checked against the default variant first",
        settings.warmup, settings.repeats, settings.launches_per_sample, settings.rounds
    );
    for note in &session.notes {
        println!("note: {note}");
    }
    let n = session.targets.len();
    let mut tuned = TuningTable::new();
    let mut failed: Vec<String> = Vec::new();
    // Tune and drop one target at a time: each holds its inputs on the GPU.
    for (i, mut target) in session.targets.into_iter().enumerate() {
        println!(
            "[{}/{n}] {}: {} variants, {} input sets, bucket {}",
            i + 1,
            target.candidates().kernel(),
            target.candidates().candidates().len(),
            target.input_sets(),
            target.bucket()
        );
        let t0 = std::time::Instant::now();
        match tune::tune(target.as_mut(), &session.device, &settings) {
            Ok(entry) => {
                print!("{}", tune::render_report(&entry));
                println!("  ({:.1} s)", t0.elapsed().as_secs_f64());
                let mut one = TuningTable::new();
                one.insert(entry.clone())?;
                // Save after every target, so an interrupted run keeps what it measured.
                one.save_merged(table_path)
                    .with_context(|| format!("saving tuning table {}", table_path.display()))?;
                tuned.insert(entry)?;
            }
            Err(e) => {
                println!("  error: {e}");
                failed.push(format!("{}: {e}", target.candidates().kernel()));
            }
        }
        drop(target);
    }
    println!("winner per bucket (medians measured side by side in this run):");
    print!("{}", tune::render_summary(tuned.entries()));
    println!("saved {} entries to {}", tuned.len(), table_path.display());
    if !failed.is_empty() {
        println!("{} target(s) could not be tuned:", failed.len());
        for f in &failed {
            println!("  {f}");
        }
    }
    Ok(failed.is_empty())
}
