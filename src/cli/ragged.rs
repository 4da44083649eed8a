//! Ragged batches in the CLI: `tritonrt run --seq-lens ...` (or an `--input` file with a
//! `seq_lens` tensor) runs one ragged step on the GPU or the CPU reference and checks it by
//! the ragged checker; `tritonrt bench --decode-loop` times a decode loop of a ragged batch
//! replayed from one captured graph against a uniform batch of the same total length.

use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;

use super::run::{Backend, RunArgs};
use super::{EXIT_CHECK_FAILED, EXIT_OK};
use tritonrt::driver::DeviceBuf;
use tritonrt::pq::check::CheckOptions;
use tritonrt::pq::gpu::{
    self, DeviceInputs, DeviceTensorRef, GpuIndexer, KernelChoice, LaunchMode, StepTiming,
};
use tritonrt::pq::ragged::{
    check_ragged, plan_ragged, reference_step, RaggedInputs, RaggedOutput, RaggedPath,
};
use tritonrt::pq::{DType, PqConfig, PqInputs, Shape};
use tritonrt::runtime::Runtime;

macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout().lock(), $($arg)*);
    }};
}

/// `tritonrt run` on a ragged batch: `lens` (`S_b` per row) and `n_cached` (per row; None:
/// every row holds the codes tensor's `N`) over `inputs` at `S_alloc = inputs.shape.s`.
/// Returns the exit code (0 ok, 1 the check failed).
pub fn run_ragged(
    a: &RunArgs,
    cfg: &PqConfig,
    inputs: PqInputs,
    lens: &[i64],
    n_cached: Option<&[i64]>,
) -> anyhow::Result<i32> {
    let rx = RaggedInputs::new(cfg, inputs, lens, n_cached).context("the ragged batch")?;
    let sh = rx.inputs.shape;
    let plan = plan_ragged(cfg, sh.s, &rx.seq_lens, &rx.n_cached)?;
    say!(
        "ragged:  B={} rows at their own lengths, S_alloc={}, {} short, {} new keys in all, \
         sparse_list [B, H, {}] (max total_b)",
        sh.b,
        sh.s,
        plan.short_rows(),
        plan.new_keys(),
        plan.total
    );
    for (b, r) in plan.rows.iter().enumerate().take(16) {
        say!(
            "  row {b}: S_b={} {:<5} N_cached {} -> {} ({} new), total_b {}",
            r.s,
            if r.short { "short" } else { "long" },
            r.n_old,
            r.n,
            r.new_keys,
            r.total
        );
    }
    if let Some(path) = &a.save_input {
        tritonrt::pq::io::write_ragged_inputs(path, cfg, &rx)
            .with_context(|| format!("writing the inputs to {}", path.display()))?;
        say!("inputs written to {}", path.display());
    }
    let cpu = |rx: &RaggedInputs| -> anyhow::Result<(RaggedOutput, f64)> {
        let t = Instant::now();
        let out = reference_step(cfg, rx).context("CPU reference step")?;
        Ok((out, t.elapsed().as_secs_f64() * 1e6))
    };
    let (out, us, is_reference, detail) = match a.backend {
        Backend::Cpu => {
            let (o, us) = cpu(&rx)?;
            (o, us, true, "CPU reference, one call".to_string())
        }
        Backend::Gpu | Backend::Auto => match run_ragged_gpu(a, cfg, &rx)? {
            Some((o, us, d)) => (o, us, false, d),
            None if a.backend == Backend::Gpu => anyhow::bail!(
                "no GPU backend available (--backend gpu, device {}); use --backend cpu or auto",
                a.device
            ),
            None => {
                say!("no GPU backend available: running the CPU reference");
                let (o, us) = cpu(&rx)?;
                (o, us, true, "CPU reference, one call".to_string())
            }
        },
    };
    let passed = if is_reference {
        say!("check:   skipped (cpu backend is the reference)");
        true
    } else {
        let t = Instant::now();
        let mode = a.check_mode();
        let report = check_ragged(
            cfg,
            &rx,
            &out,
            &CheckOptions {
                mode,
                ..CheckOptions::default()
            },
        );
        say!(
            "check:   {report}  [ragged checker: every row at its own S_b against the CPU \
             reference, plus the padding; {:.0} ms]",
            t.elapsed().as_secs_f64() * 1e3
        );
        report.passed()
    };
    say!("time:    {us:.1} us per step ({detail})");
    let row: Vec<String> = out.sparse_list[..out.total.min(16)]
        .iter()
        .map(|v| v.to_string())
        .collect();
    say!("sparse_list[0, 0, :] = [{}]", row.join(", "));
    if let Some(path) = &a.output {
        tritonrt::pq::io::write_ragged_outputs(path, cfg, &out)
            .with_context(|| format!("writing the outputs to {}", path.display()))?;
        say!("outputs written to {}", path.display());
    }
    Ok(if passed { EXIT_OK } else { EXIT_CHECK_FAILED })
}

/// One ragged step on the GPU (plain launches; then `a.steps` graph replays timed at the
/// same lengths, nothing left to quantize). `Ok(None)`: no GPU.
fn run_ragged_gpu(
    a: &RunArgs,
    cfg: &PqConfig,
    rx: &RaggedInputs,
) -> anyhow::Result<Option<(RaggedOutput, f64, String)>> {
    let rt =
        match gpu::open_runtime(a.device, &a.ptx.ptx_cache).context("opening the GPU runtime")? {
            Ok(rt) => rt,
            Err(why) => {
                say!("gpu:     not available: {why}");
                return Ok(None);
            }
        };
    let stream = rt.device().new_stream()?;
    let mut ix =
        GpuIndexer::for_ragged(rt.clone(), stream.clone(), *cfg, rx, &KernelChoice::new())?;
    if let Some(p) = a.ragged_path.forced() {
        ix.set_ragged_path(Some(p))
            .context("--ragged-path on this config")?;
    }
    ix.poison_outputs()?;
    let dev = DeviceInputs::upload_ragged(&stream, rx, cfg)?;
    let info = ix
        .step_ragged(dev.query(), dev.key(), &rx.seq_lens, LaunchMode::Launch)
        .context("GPU ragged step")?;
    let out = ix
        .download_ragged()
        .context("downloading the ragged step")?;
    say!(
        "gpu:     {} ({}), {:?} path: kernels {} ({} launches), sparse_list rows of T = {} on the device",
        rt.device().name(),
        rt.device().arch(),
        info.path,
        ragged_kernels(info.path),
        info.launches,
        info.row_len
    );
    if a.steps == 0 {
        return Ok(Some((out, f64::NAN, "not timed".into())));
    }
    let mut samples = Vec::with_capacity(a.steps);
    for i in 0..a.steps + 5 {
        let t = Instant::now();
        ix.step_ragged(dev.query(), dev.key(), &rx.seq_lens, LaunchMode::Graph)?;
        ix.synchronize()?;
        if i >= 5 {
            samples.push(t.elapsed().as_secs_f64() * 1e6);
        }
    }
    let again = ix.download_ragged()?;
    anyhow::ensure!(
        again.sparse_list == out.sparse_list && again.weight_list == out.weight_list,
        "the graph-replayed ragged step's outputs differ from the plain launches'"
    );
    let t = StepTiming::from_samples(&mut samples);
    Ok(Some((
        out,
        t.median_us,
        format!(
            "median wall of lengths upload + CUDA-graph replay + synchronize, p10 {:.1}, p90 {:.1}, n={}",
            t.p10_us, t.p90_us, t.samples
        ),
    )))
}

/// The kernels a ragged step on `path` launches, for messages.
fn ragged_kernels(path: RaggedPath) -> &'static str {
    match path {
        RaggedPath::Split => "pq_rgq, pq_rgthresh, pq_rgsemit",
        RaggedPath::Radix => "pq_rgq, pq_rglut, pq_rground x4, pq_rgcnt, pq_rgemit",
        RaggedPath::Index => "pq_rgq, pq_rgwfill, pq_rgindex",
    }
}

/// A small deterministic generator (xorshift) for the decode loop's values.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// Uniform in [-1, 1).
    fn f32(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// `v` as 16-bit words of `dtype` (fp32: two words each).
fn words(v: &[f32], dtype: DType) -> Vec<u16> {
    match dtype {
        DType::F32 => v
            .iter()
            .flat_map(|x| {
                let b = x.to_bits();
                [b as u16, (b >> 16) as u16]
            })
            .collect(),
        DType::BF16 => v
            .iter()
            .map(|&x| tritonrt::half::bf16::from_f32(x).to_bits())
            .collect(),
        DType::F16 => v
            .iter()
            .map(|&x| tritonrt::half::f16::from_f32(x).to_bits())
            .collect(),
    }
}

/// A decode loop's device data: query, keys (zero but the rows the loop quantizes),
/// centroids and initial codes.
struct LoopData {
    _query: cudarc::driver::CudaSlice<u16>,
    _key: cudarc::driver::CudaSlice<u16>,
    q: DeviceTensorRef,
    k: DeviceTensorRef,
    centroids: Vec<f32>,
    codes: Vec<i64>,
    n: usize,
}

/// Data for `B = starts.len()` rows at `s_alloc` positions: codes for `n0[b]` keys of
/// row `b` (`N = max n0`), random key rows from `init_offset + n0[b]` up to `until[b]`.
fn loop_data(
    stream: &Arc<cudarc::driver::CudaStream>,
    cfg: &PqConfig,
    shape: Shape,
    n0: &[usize],
    until: &[usize],
    seed: u64,
) -> anyhow::Result<LoopData> {
    let mut rng = Rng(seed | 1);
    let dt = cfg.input_dtype;
    let wpe = dt.size_bytes() / 2;
    let (b, h, h_kv, s, d) = (shape.b, shape.h, shape.h_kv, shape.s, shape.d);
    let q: Vec<f32> = (0..b * h * d).map(|_| rng.f32()).collect();
    let query = stream.clone_htod(&words(&q, dt))?;
    let mut key = stream.alloc_zeros::<u16>(b * h_kv * s * d * wpe)?;
    for bi in 0..b {
        let lo = (cfg.init_offset + n0[bi]).min(s);
        let hi = until[bi].min(s);
        if lo >= hi {
            continue;
        }
        for g in 0..h_kv {
            let vals: Vec<f32> = (0..(hi - lo) * d).map(|_| rng.f32()).collect();
            let start = ((bi * h_kv + g) * s + lo) * d * wpe;
            let mut view = key.slice_mut(start..start + vals.len() * wpe);
            stream.memcpy_htod(&words(&vals, dt), &mut view)?;
        }
    }
    let (m, k, dc) = (cfg.m(), cfg.k_centroids(), cfg.d_c(d));
    let centroids: Vec<f32> = (0..b * h_kv * m * k * dc).map(|_| rng.f32()).collect();
    let n = n0.iter().copied().max().unwrap_or(0);
    let codes: Vec<i64> = (0..b * n * h_kv * m)
        .map(|_| (rng.next() % k as u64) as i64)
        .collect();
    let qv = DeviceTensorRef::new(
        DeviceBuf::of(&query, stream),
        dt,
        [(h * d) as i64, d as i64, 0],
    )?;
    let kv = DeviceTensorRef::new(
        DeviceBuf::of(&key, stream),
        dt,
        [(h_kv * s * d) as i64, (s * d) as i64, d as i64],
    )?;
    Ok(LoopData {
        _query: query,
        _key: key,
        q: qv,
        k: kv,
        centroids,
        codes,
        n,
    })
}

/// Wall and GPU medians of a loop's steps.
struct LoopTiming {
    wall: StepTiming,
    gpu: StepTiming,
    captures: usize,
}

impl LoopTiming {
    fn line(&self) -> String {
        format!(
            "wall {:.1} us (p10 {:.1}, p90 {:.1}), GPU {:.1} us (p10 {:.1}, p90 {:.1}), n={}, graph captured {} time(s)",
            self.wall.median_us,
            self.wall.p10_us,
            self.wall.p90_us,
            self.gpu.median_us,
            self.gpu.p10_us,
            self.gpu.p90_us,
            self.wall.samples,
            self.captures
        )
    }
}

/// The lengths of decode step `i` from `start`: every row one key longer per step, and
/// on every 8th step one row (in turn) 3 more (a speculative step accepting 4 tokens).
fn lens_at(start: &[usize], i: usize) -> Vec<usize> {
    let b = start.len();
    (0..b)
        .map(|r| {
            let extra = (0..=i).filter(|&t| t % 8 == 0 && (t / 8) % b == r).count() * 3;
            start[r] + i + extra
        })
        .collect()
}

/// Time `steps` steps of `step(i)` after `warm` untimed ones: wall around step +
/// synchronize, GPU time between events around the step.
fn time_loop(
    rt: &Runtime,
    stream: &Arc<cudarc::driver::CudaStream>,
    warm: usize,
    steps: usize,
    mut before: impl FnMut(usize) -> anyhow::Result<()>,
    mut step: impl FnMut(usize) -> anyhow::Result<bool>,
) -> anyhow::Result<LoopTiming> {
    let (e0, e1) = (rt.device().new_event(true)?, rt.device().new_event(true)?);
    let (mut wall, mut gpu_us, mut captures) = (Vec::new(), Vec::new(), 0);
    for i in 0..warm + steps {
        before(i)?;
        stream.synchronize()?;
        let t = Instant::now();
        e0.record(stream)?;
        captures += usize::from(step(i)?);
        e1.record(stream)?;
        stream.synchronize()?;
        let w = t.elapsed().as_secs_f64() * 1e6;
        if i >= warm {
            wall.push(w);
            gpu_us.push(e0.elapsed_ms(&e1)? as f64 * 1e3);
        }
    }
    Ok(LoopTiming {
        wall: StepTiming::from_samples(&mut wall),
        gpu: StepTiming::from_samples(&mut gpu_us),
        captures,
    })
}

/// [`time_loop`] over ragged steps of `ix` on `data` replayed from one graph, the lengths
/// of step `i` (`lens_of(i)`, i64 `[B]`) copied into a device buffer before it.
fn time_ragged_loop(
    rt: &Runtime,
    stream: &Arc<cudarc::driver::CudaStream>,
    warm: usize,
    steps: usize,
    ix: &mut GpuIndexer,
    data: &LoopData,
    lens_of: impl Fn(usize) -> Vec<i64>,
) -> anyhow::Result<LoopTiming> {
    let b = ix.shape().b;
    let mut dlens = stream.alloc_zeros::<i64>(b)?;
    let cell = std::cell::RefCell::new((&mut dlens, ix));
    time_loop(
        rt,
        stream,
        warm,
        steps,
        |i| {
            let mut c = cell.borrow_mut();
            stream.memcpy_htod(&lens_of(i), &mut *c.0)?;
            Ok(())
        },
        |_| {
            let mut c = cell.borrow_mut();
            let (dl, ixr) = &mut *c;
            let info = ixr.step_ragged_device(&data.q, &data.k, &**dl, LaunchMode::Graph)?;
            Ok(info.captured)
        },
    )
}

/// `tritonrt bench --decode-loop`: a ragged batch's decode loop replayed from one graph
/// whose lengths live in a device buffer, against a uniform batch of the same total length
/// (the fixed-`S` step, and the ragged kernels at equal lengths); every indexer's variants
/// by `choice` (bench's `--variant`, else the tuning table, else the defaults). Returns
/// the exit code.
pub fn decode_loop(
    rt: &Arc<Runtime>,
    cfg: &PqConfig,
    base: Shape,
    starts: &[usize],
    steps: usize,
    seed: u64,
    choice: &KernelChoice,
) -> anyhow::Result<i32> {
    anyhow::ensure!(steps >= 1, "--decode-loop needs --steps >= 1");
    let warm = 10;
    let b = starts.len();
    let last = lens_at(starts, warm + steps - 1);
    let s_alloc = last.iter().copied().max().unwrap_or(1);
    let shape = Shape {
        b,
        s: s_alloc,
        ..base
    };
    cfg.validate(&shape)?;
    let total: usize = starts.iter().sum();
    say!(
        "decode loop: B={b} rows at S_b = {:?} (total L = {total}), H={} H_kv={} D={}, {} \
         timed steps after {warm}: each row +1 key a step, every 8th step one row +4; \
         S_alloc = {s_alloc}",
        starts,
        shape.h,
        shape.h_kv,
        shape.d,
        steps
    );
    say!("config:  {cfg}");
    let stream = rt.device().new_stream()?;

    // ragged: lengths in a device buffer, one captured graph
    let n0: Vec<usize> = starts
        .iter()
        .map(|&s| cfg.n_quantized(s).saturating_sub(1))
        .collect();
    let data = loop_data(&stream, cfg, shape, &n0, &last, seed)?;
    // an indexer on the loop's codes and start counts, on `path` (None: the config's)
    let loop_indexer = |path: Option<RaggedPath>| -> anyhow::Result<GpuIndexer> {
        let mut ix = GpuIndexer::new(
            rt.clone(),
            stream.clone(),
            *cfg,
            shape,
            &data.centroids,
            None,
            choice,
        )?;
        ix.import_codes(&data.codes, data.n)?;
        ix.set_row_n_cached(&n0)?;
        if path.is_some() {
            ix.set_ragged_path(path)?;
        }
        Ok(ix)
    };
    let mut ix = loop_indexer(None)?;
    let path = ix.ragged_path()?;
    let ragged = time_ragged_loop(rt, &stream, warm, steps, &mut ix, &data, |i| {
        lens_at(starts, i).iter().map(|&s| s as i64).collect()
    })?;
    ix.check_ragged_errors()
        .context("the ragged decode loop refused a row")?;
    let final_nc = ix.row_n_cached()?;
    for (r, (&s, &n)) in last.iter().zip(&final_nc).enumerate() {
        // a row long at its last step holds every key up to there
        anyhow::ensure!(
            cfg.is_short(s) || n == cfg.n_quantized(s),
            "after the loop row {r} (S_b = {s}) holds {n} codes, expected {}",
            cfg.n_quantized(s)
        );
    }
    say!(
        "ragged (device lengths, one graph, {path:?} path: {}): {}",
        ragged_kernels(path),
        ragged.line()
    );
    drop(ix);
    // the same loop on the other paths this config has, for comparison
    for alt in [RaggedPath::Split, RaggedPath::Radix] {
        if alt == path {
            continue;
        }
        let Ok(mut rx) = loop_indexer(Some(alt)) else {
            continue; // not built for this config
        };
        let t = time_ragged_loop(rt, &stream, warm, steps, &mut rx, &data, |i| {
            lens_at(starts, i).iter().map(|&s| s as i64).collect()
        })?;
        rx.check_ragged_errors()
            .with_context(|| format!("the ragged decode loop ({alt:?} path) refused a row"))?;
        say!(
            "ragged, {alt:?} path ({}): {}",
            ragged_kernels(alt),
            t.line()
        );
    }
    drop(data);

    // uniform: the same total length, B rows of L / B
    let su = total / b;
    let ulast = su + warm + steps - 1;
    let ushape = Shape { s: ulast, ..shape };
    let un0 = vec![cfg.n_quantized(su).saturating_sub(1); b];
    let udata = loop_data(&stream, cfg, ushape, &un0, &vec![ulast; b], seed ^ 0x5555)?;
    let mut fx = GpuIndexer::new(
        rt.clone(),
        stream.clone(),
        *cfg,
        ushape,
        &udata.centroids,
        None,
        choice,
    )?;
    fx.import_codes(&udata.codes, udata.n)?;
    fx.prepare(ulast)?;
    // each timed step appends one key, starting from one before S = su
    fx.rewind(un0[0]);
    let fixed_kind = fx.plan(su)?.kind;
    let fixed = {
        let cell = std::cell::RefCell::new(&mut fx);
        time_loop(
            rt,
            &stream,
            warm,
            steps,
            |_| Ok(()),
            |i| {
                let info = cell
                    .borrow_mut()
                    .step(&udata.q, &udata.k, su + i, LaunchMode::Graph)?;
                Ok(info.captured)
            },
        )?
    };
    drop(fx);
    say!(
        "uniform, fixed-S step (S = {su}, {fixed_kind:?}): {}",
        fixed.line()
    );
    let mut rx = GpuIndexer::new(
        rt.clone(),
        stream.clone(),
        *cfg,
        ushape,
        &udata.centroids,
        None,
        choice,
    )?;
    rx.import_codes(&udata.codes, udata.n)?;
    rx.set_row_n_cached(&un0)?;
    let uniform_ragged = time_ragged_loop(rt, &stream, warm, steps, &mut rx, &udata, |i| {
        vec![(su + i) as i64; b]
    })?;
    rx.check_ragged_errors()?;
    say!(
        "uniform, ragged kernels (S_b = {su}, {:?} path): {}",
        rx.ragged_path()?,
        uniform_ragged.line()
    );
    let ratio = ragged.gpu.median_us / fixed.gpu.median_us;
    say!(
        "ratio:   ragged / uniform fixed-S = {ratio:.2}x GPU ({:.2}x wall); target <= 1.2x",
        ragged.wall.median_us / fixed.wall.median_us
    );
    Ok(EXIT_OK)
}
