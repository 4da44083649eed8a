//! Helpers shared by the integration tests.

/// Say that a test was skipped, and why, on the real stderr (`format!` arguments):
/// libtest captures `eprintln!` of passing tests, and a skip must never look like a
/// silent pass.
macro_rules! skip {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr().lock(), "SKIP: {}", format!($($arg)*));
    }};
}

/// Fresh seed per run, printed so a failure can be replayed with `TRITONRT_TEST_SEED`.
#[allow(dead_code)] // not every test crate that includes this module draws seeds
pub fn test_seed() -> u64 {
    let s = std::env::var("TRITONRT_TEST_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        });
    eprintln!("seed {s} (set TRITONRT_TEST_SEED={s} to replay)");
    s
}

/// The runtime on CUDA device 0 with `TRITONRT_PTX_CACHE` (default: this crate's
/// `ptx_cache/`), or `None` after a visible skip message naming `what` where this machine
/// has no CUDA driver or device.
///
/// One runtime per test process, shared by its tests and never dropped, so each kernel is
/// loaded once per process. (A runtime dropped on one test's thread while another captures
/// would be safe too: its unloads wait for the capture, `tritonrt::driver::CaptureScope`.)
#[allow(dead_code)] // only the GPU test crates open a runtime this way
pub fn gpu_runtime(what: &str) -> Option<std::sync::Arc<tritonrt::runtime::Runtime>> {
    use std::sync::{Arc, OnceLock};
    static SHARED: OnceLock<Result<Arc<tritonrt::runtime::Runtime>, String>> = OnceLock::new();
    let opened = SHARED.get_or_init(|| {
        let ptx = std::env::var("TRITONRT_PTX_CACHE")
            .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/ptx_cache").to_string());
        tritonrt::pq::gpu::open_runtime(0, std::path::Path::new(&ptx)).expect("opening the runtime")
    });
    match opened {
        Ok(rt) => Some(rt.clone()),
        Err(why) => {
            skip!("{what} need a CUDA device: {why}");
            None
        }
    }
}

/// CUDA device 0 and a runtime over the test fixtures' ptx_cache
/// (`TRITONRT_TEST_FIXTURES`, default `tests/fixtures`) with its own cubin cache in the
/// returned temp dir (keep it while the runtime is used), or `None` after a visible skip
/// message naming `test` where this machine has no CUDA driver or device.
#[allow(dead_code)] // only the crates testing the runtime on the axpy fixture use it
pub fn fixture_runtime(
    test: &str,
) -> Option<(
    std::sync::Arc<tritonrt::driver::Device>,
    std::sync::Arc<tritonrt::runtime::Runtime>,
    tempfile::TempDir,
)> {
    let dev = match tritonrt::driver::probe_driver().and_then(|_| tritonrt::driver::Device::new(0))
    {
        Ok(d) => d,
        Err(e) => {
            skip!("{test}: no CUDA device: {e}");
            return None;
        }
    };
    let fixtures = std::env::var_os("TRITONRT_TEST_FIXTURES")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures"));
    let store = tritonrt::artifact::ArtifactStore::open(fixtures.join("ptx_cache")).unwrap();
    let t = tempfile::tempdir().unwrap();
    let cache = tritonrt::jit::CubinCache::new(t.path()).unwrap();
    let rt = tritonrt::runtime::Runtime::new(dev.clone(), store, cache);
    Some((dev, rt, t))
}

/// Run the `tritonrt` binary with `args`, the environment defaults of `run` (backend,
/// workload, seed) removed so the arguments alone decide: `(exit code, stdout, stderr)`.
#[allow(dead_code)] // not every test crate that includes this module runs the CLI
pub fn tritonrt(args: &[&str]) -> (i32, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tritonrt"))
        .args(args)
        .env_remove("TRITONRT_BACKEND")
        .env_remove("TRITONRT_WORKLOAD")
        .env_remove("TRITONRT_SEED")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Inputs of `cfg` at `shape` with `n_cached` codes: well-separated small integers where
/// `exact` (their heavy sets are checked exactly), else standard normal.
#[allow(dead_code)] // only the GPU pipeline tests draw step inputs this way
pub fn inputs_for(
    cfg: &tritonrt::pq::PqConfig,
    shape: tritonrt::pq::Shape,
    n_cached: usize,
    exact: bool,
    seed: u64,
) -> tritonrt::pq::PqInputs {
    use tritonrt::pq::PqInputs;
    if exact {
        PqInputs::small_integer(cfg, shape, n_cached, seed)
    } else {
        PqInputs::random(cfg, shape, n_cached, seed)
    }
    .unwrap_or_else(|e| panic!("inputs of {cfg} at {shape:?}: {e}"))
}

/// An indexer on a new stream of `rt` holding the ragged inputs' codebook and codes, each
/// row at its own count, outputs poisoned, the ragged path forced to `path` where given,
/// and the inputs on the device (keys from the fewest codes any row holds).
#[allow(dead_code)] // only the ragged GPU tests build a ragged indexer this way
pub fn ragged_indexer(
    rt: &std::sync::Arc<tritonrt::runtime::Runtime>,
    c: &tritonrt::pq::PqConfig,
    x: &tritonrt::pq::ragged::RaggedInputs,
    path: Option<tritonrt::pq::ragged::RaggedPath>,
) -> tritonrt::Result<(
    tritonrt::pq::gpu::GpuIndexer,
    tritonrt::pq::gpu::DeviceInputs,
)> {
    use tritonrt::pq::gpu::{DeviceInputs, GpuIndexer, KernelChoice};
    let stream = rt.device().new_stream()?;
    let mut ix = GpuIndexer::for_ragged(
        rt.clone(),
        stream.clone(),
        *c,
        x,
        &KernelChoice::manifest_defaults(),
    )?;
    ix.poison_outputs()?;
    if path.is_some() {
        ix.set_ragged_path(path)?;
    }
    let dev = DeviceInputs::upload_ragged(&stream, x, c)?;
    Ok((ix, dev))
}

/// Check options: exact heavy sets where `exact` (well-separated inputs), else the
/// spec's rule; the other options at their defaults.
#[allow(dead_code)] // only the ragged GPU checks choose their mode this way
pub fn check_options<'a>(exact: bool) -> tritonrt::pq::check::CheckOptions<'a> {
    use tritonrt::pq::check::{CheckMode, CheckOptions};
    CheckOptions {
        mode: if exact {
            CheckMode::Exact
        } else {
            CheckMode::Spec
        },
        ..CheckOptions::default()
    }
}
