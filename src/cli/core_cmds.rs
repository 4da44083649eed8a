//! `tritonrt warmup`, `inspect`, `verify`, `import`: the artifact and runtime-core
//! subcommands.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::cli::{EXIT_CHECK_FAILED, EXIT_OK};
use tritonrt::artifact::{
    import_triton_cache_entry, partition_for_device, ArtifactStore, SignatureSource, Variant,
};
use tritonrt::driver::Device;
use tritonrt::driver::Kernel;
use tritonrt::driver::{BuiltCubin, CacheOutcome};
use tritonrt::jit::CubinCache;

/// The crate's own `ptx_cache/` (the default of `--ptx-cache`).
pub const DEFAULT_PTX_CACHE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/ptx_cache");

/// `--ptx-cache DIR`, shared by the subcommands.
#[derive(Debug, Clone, clap::Args)]
pub struct PtxCacheArg {
    /// The ptx_cache directory (manifest.json + content-addressed PTX/cubin files).
    #[arg(long, value_name = "DIR", env = "TRITONRT_PTX_CACHE", default_value = DEFAULT_PTX_CACHE)]
    pub ptx_cache: PathBuf,
}

/// Arguments of `tritonrt warmup`: load every variant the runtime can choose on the
/// present GPU (for each kernel, the variants of the newest arch this GPU runs: native
/// cubins where the ptx_cache has them, else PTX JIT-compiled into the user cubin cache,
/// `$TRITONRT_CACHE_DIR` or `~/.cache/tritonrt`), on all CPU cores, printing each one's
/// cold (JIT) and warm (cached cubin) load time.
#[derive(Debug, clap::Args)]
pub struct WarmupArgs {
    #[command(flatten)]
    ptx: PtxCacheArg,
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    device: usize,
    /// Load every variant usable on this GPU, also those of older archs that the runtime
    /// never picks here (an sm_80 PTX on an sm_90 GPU that has its own variant).
    #[arg(long)]
    all: bool,
    /// Also time a cold PTX JIT for variants that are already cached or have a cubin
    /// (the extra JIT output is discarded).
    #[arg(long)]
    cold: bool,
    /// Worker threads for the loads and JIT compilations (default: every CPU core).
    #[arg(long, value_name = "N")]
    jobs: Option<usize>,
}

/// Arguments of `tritonrt inspect`: list the variants of a ptx_cache with their launch
/// metadata (nothing is loaded; no GPU needed), or with `--devices` the CUDA devices of
/// this machine.
#[derive(Debug, clap::Args)]
pub struct InspectArgs {
    #[command(flatten)]
    ptx: PtxCacheArg,
    /// List the CUDA devices instead (ordinal, name, compute capability, SMs, memory,
    /// driver): the ordinals that `--device N` and `bench --devices LIST` take.
    #[arg(long)]
    devices: bool,
    /// With --devices: list only this device (opens no other).
    #[arg(long, requires = "devices")]
    device: Option<usize>,
}

/// Arguments of `tritonrt verify`: check size and sha256 of every file the manifest
/// names. Exit 0 when all are good, 1 naming each bad file.
#[derive(Debug, clap::Args)]
pub struct VerifyArgs {
    #[command(flatten)]
    ptx: PtxCacheArg,
}

/// Arguments of `tritonrt import`: add one entry of Triton's cache
/// (`~/.triton/cache/<hash>/`, holding `<name>.json` + `.ptx` [+ `.cubin`, `.ttir`]) to a
/// ptx_cache, writing its files content-addressed and merging the manifest atomically.
#[derive(Debug, clap::Args)]
pub struct ImportArgs {
    /// The Triton cache entry directory.
    #[arg(value_name = "DIR")]
    entry: PathBuf,
    #[command(flatten)]
    ptx: PtxCacheArg,
}

fn ms(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1e3)
}

/// One row of the warmup table.
struct WarmRow {
    id: String,
    outcome: CacheOutcome,
    cold: Option<Duration>,
    warm: Duration,
    regs: i32,
}

/// `tritonrt warmup`.
pub fn warmup(a: WarmupArgs) -> anyhow::Result<i32> {
    let store = ArtifactStore::open(&a.ptx.ptx_cache)
        .with_context(|| format!("opening ptx_cache {}", a.ptx.ptx_cache.display()))?;
    let device = Device::new(a.device)?;
    let cache = CubinCache::from_env()?;
    let cc = device.cc();
    println!(
        "device {}: {} (sm_{}, driver {} = CUDA {}.{}, PTX ISA <= {}); cubin cache {}",
        device.ordinal(),
        device.name(),
        device.arch(),
        device.driver_version(),
        device.driver_cuda_version().0,
        device.driver_cuda_version().1,
        device.ptx_isa_max(),
        cache.dir().display()
    );
    let (usable, skipped) = partition_for_device(store.all_variants(), cc, a.all);
    let jobs = a
        .jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .clamp(1, usable.len().max(1));
    let pb = indicatif::ProgressBar::new(usable.len() as u64);
    if let Ok(style) = indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} {wide_msg}") {
        pb.set_style(style);
    }
    // a queue of variants shared by `jobs` workers; each result keeps its variant's index
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results = std::sync::Mutex::new(Vec::with_capacity(usable.len()));
    std::thread::scope(|scope| {
        for _ in 0..jobs {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(v) = usable.get(i) else { break };
                pb.set_message(v.id.clone());
                let r = warm_one(&device, &store, &cache, v, a.cold);
                results
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push((i, r));
                pb.inc(1);
            });
        }
    });
    pb.finish_and_clear();
    let mut results = results.into_inner().unwrap_or_else(|p| p.into_inner());
    results.sort_by_key(|(i, _)| *i);
    let mut rows = Vec::new();
    let mut failures = Vec::new();
    for (i, r) in results {
        match r {
            Ok(r) => rows.push(r),
            Err(e) => failures.push((usable[i].id.clone(), e)),
        }
    }

    let w = rows.iter().map(|r| r.id.len()).max().unwrap_or(2).max(2);
    println!(
        "{:<w$}  {:<14}  {:>12}  {:>12}  {:>5}",
        "id", "source", "cold ms", "warm ms", "regs"
    );
    let (mut cold_total, mut warm_total) = (Duration::ZERO, Duration::ZERO);
    for r in &rows {
        cold_total += r.cold.unwrap_or_default();
        warm_total += r.warm;
        println!(
            "{:<w$}  {:<14}  {:>12}  {:>12}  {:>5}",
            r.id,
            r.outcome.label(),
            r.cold.map(ms).unwrap_or_else(|| "-".to_string()),
            ms(r.warm),
            r.regs
        );
    }
    println!(
        "{} loaded ({jobs} threads), {} failed, {} skipped ({}); total cold {} ms, warm {} ms",
        rows.len(),
        failures.len(),
        skipped.len(),
        if a.all {
            "not usable on this GPU"
        } else {
            "not chosen on this GPU; --all loads the usable ones too"
        },
        ms(cold_total),
        ms(warm_total)
    );
    println!(
        "cold = PTX JIT by the driver + module load; warm = cached/manifest cubin read + \
         verify + module load"
    );
    for (id, e) in &failures {
        eprintln!("FAILED {id}: {e}");
    }
    Ok(if failures.is_empty() {
        EXIT_OK
    } else {
        EXIT_CHECK_FAILED
    })
}

fn warm_one(
    device: &std::sync::Arc<Device>,
    store: &ArtifactStore,
    cache: &CubinCache,
    v: &Variant,
    force_cold: bool,
) -> tritonrt::Result<WarmRow> {
    let built = cache.get_or_build(device, store, v)?;
    let first = Kernel::load(device, v, &built)?;
    let first_total = first.load_info().total();
    let mut cold = built.outcome.jitted().then_some(first_total);
    drop(first);
    // Warm: the same load again, now from the cache (or the manifest cubin).
    let warm_built = cache.get_or_build(device, store, v)?;
    let warm = Kernel::load(device, v, &warm_built)?;
    if cold.is_none() && force_cold {
        let t0 = Instant::now();
        let ptx = store.read_ptx(v)?;
        let out = device
            .jit_ptx(&ptx, &v.ptx.file, cache.options().opt_level)
            .map_err(|f| {
                tritonrt::Error::invalid(
                    format!("JIT of {}", v.id),
                    format!("{}: {}", f.code, f.log),
                )
            })?;
        let jit_built = BuiltCubin {
            cubin: out.cubin,
            outcome: CacheOutcome::Built,
            origin: (store.path_of(&v.ptx), v.ptx.sha256.clone()),
            elapsed: t0.elapsed(),
            jit_log: Some(out.log),
        };
        let k = Kernel::load(device, v, &jit_built)?;
        cold = Some(k.load_info().total());
    }
    Ok(WarmRow {
        id: v.id.clone(),
        outcome: built.outcome,
        cold,
        warm: warm.load_info().total(),
        regs: warm.num_regs(),
    })
}

/// `tritonrt inspect --devices`.
fn inspect_devices(only: Option<usize>) -> anyhow::Result<i32> {
    let all = match only {
        Some(o) => {
            let d = Device::new(o)?;
            let (free_bytes, total_bytes) = d.mem_info()?;
            vec![tritonrt::driver::DeviceSummary {
                ordinal: o,
                name: d.name().to_string(),
                cc: d.cc(),
                sm_count: d.sm_count(),
                total_bytes,
                free_bytes,
                driver_version: d.driver_version(),
            }]
        }
        None => Device::list()?,
    };
    let gib = |b: usize| b as f64 / (1u64 << 30) as f64;
    println!(
        "{:>7}  {:<28} {:>5} {:>5} {:>10} {:>10} {:>8}",
        "ordinal", "name", "cc", "SMs", "mem GiB", "free GiB", "driver"
    );
    for d in &all {
        println!(
            "{:>7}  {:<28} {:>5} {:>5} {:>10.1} {:>10.1} {:>8}",
            d.ordinal,
            d.name,
            format!("{}.{}", d.cc.0, d.cc.1),
            d.sm_count,
            gib(d.total_bytes),
            gib(d.free_bytes),
            format!(
                "{}.{}",
                d.driver_version / 1000,
                (d.driver_version % 1000) / 10
            )
        );
    }
    println!(
        "{} CUDA device(s); driver = the CUDA version the driver supports",
        all.len()
    );
    Ok(EXIT_OK)
}

/// `tritonrt inspect`.
pub fn inspect(a: InspectArgs) -> anyhow::Result<i32> {
    if a.devices {
        return inspect_devices(a.device);
    }
    let store = ArtifactStore::open(&a.ptx.ptx_cache)
        .with_context(|| format!("opening ptx_cache {}", a.ptx.ptx_cache.display()))?;
    let m = store.manifest();
    println!(
        "{}: schema {}, Triton {}, {} variants",
        store.manifest_path().display(),
        m.schema_version,
        m.triton_version,
        m.variants.len()
    );
    let header = [
        "id", "target", "ptx", "warps", "stages", "ctas", "shared", "gscratch", "pdl/coop",
        "default", "cubin",
    ];
    let rows: Vec<[String; 11]> = m
        .variants
        .iter()
        .map(|v| {
            [
                v.id.clone(),
                v.ptx_target.clone(),
                v.ptx_version.clone(),
                v.num_warps.to_string(),
                v.num_stages.to_string(),
                v.num_ctas.to_string(),
                v.shared.to_string(),
                format!("{}/{}", v.global_scratch_size, v.global_scratch_align),
                format!(
                    "{}/{}",
                    if v.launch_pdl { "y" } else { "n" },
                    if v.launch_cooperative_grid { "y" } else { "n" }
                ),
                if v.default { "yes" } else { "" }.to_string(),
                if v.cubin.is_some() { "yes" } else { "" }.to_string(),
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.len());
        }
    }
    let line = |cells: Vec<&str>| {
        cells
            .iter()
            .zip(widths)
            .enumerate()
            .map(|(i, (c, w))| {
                if i == 0 {
                    format!("{c:<w$}")
                } else {
                    format!("{c:>w$}")
                }
            })
            .collect::<Vec<_>>()
            .join("  ")
    };
    println!("{}", line(header.to_vec()));
    for r in &rows {
        println!("{}", line(r.iter().map(String::as_str).collect()));
    }
    println!("shared and scratch in bytes per CTA; block = 32 x warps threads");
    let mut kernels: Vec<&str> = m.variants.iter().map(|v| v.kernel.as_str()).collect();
    kernels.dedup();
    kernels.sort();
    kernels.dedup();
    for k in kernels {
        let v = store.variants(k)[0];
        let sig: Vec<String> = v
            .signature
            .iter()
            .map(|a| {
                if a.divisibility > 1 {
                    format!("{}: {} (div {})", a.name, a.ty, a.divisibility)
                } else {
                    format!("{}: {}", a.name, a.ty)
                }
            })
            .collect();
        println!("kernel {k} (entry {}): {}", v.entry, sig.join(", "));
    }
    Ok(EXIT_OK)
}

/// `tritonrt verify`.
pub fn verify(a: VerifyArgs) -> anyhow::Result<i32> {
    let store = match ArtifactStore::open(&a.ptx.ptx_cache) {
        Ok(s) => s,
        Err(e) => {
            println!(
                "BAD {}: {e}",
                a.ptx.ptx_cache.join("manifest.json").display()
            );
            return Ok(EXIT_CHECK_FAILED);
        }
    };
    let files = store.files().len();
    let bad = store.verify_all();
    for (path, e) in &bad {
        println!("BAD {}: {e}", path.display());
    }
    if bad.is_empty() {
        println!(
            "OK: {} variants, all {files} files match their size and sha256 ({})",
            store.all_variants().len(),
            store.manifest_path().display()
        );
        Ok(EXIT_OK)
    } else {
        println!("{} of {files} files bad", bad.len());
        Ok(EXIT_CHECK_FAILED)
    }
}

/// `tritonrt import`.
pub fn import(a: ImportArgs) -> anyhow::Result<i32> {
    let r = import_triton_cache_entry(&a.entry, &a.ptx.ptx_cache)?;
    let v = &r.variant;
    println!(
        "{} {} ({} {}, PTX {}{}) into {}",
        if r.added {
            "imported"
        } else {
            "already present:"
        },
        v.id,
        v.kernel,
        v.ptx_target,
        v.ptx_version,
        if v.cubin.is_some() {
            ", with cubin"
        } else {
            ""
        },
        r.manifest.display()
    );
    println!("signature: {}", v.signature_string());
    let descs: Vec<&str> = v
        .signature
        .iter()
        .filter(|a| matches!(a.ty, tritonrt::artifact::ArgType::TensorDesc(_)))
        .map(|a| a.name.as_str())
        .collect();
    if !descs.is_empty() {
        println!(
            "tensor descriptors {}: {}",
            descs.join(", "),
            if v.tensordesc_meta.is_empty() {
                "passed decomposed (base pointer, shape, strides)"
            } else {
                "lowered to TMA (a CUtensorMap the launcher encodes from a buffer, its shape and strides)"
            }
        );
    }
    if r.signature_source == SignatureSource::Ptx {
        println!(
            "note: no TTIR in the entry; argument names and pointer element types are unknown \
             (read from the PTX .entry), pointers assumed 16-byte aligned"
        );
    }
    Ok(EXIT_OK)
}
