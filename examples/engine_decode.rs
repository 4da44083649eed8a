//! What an inference engine writes to run the PQCache indexer inside its own decode loop:
//! its own CUDA context and stream, its own device buffers (query, keys, codebook, codes
//! and the indexer's outputs), and a graph-replayed step per token.
//!
//! ```sh
//! cargo run --release --example engine_decode            # 100 steps, checked
//! TRITONRT_PTX_CACHE=path/to/ptx_cache cargo run --release --example engine_decode
//! ```
//!
//! Each step is also run by a second indexer that owns its outputs and got its inputs
//! from the host; the engine's buffers must hold exactly the same bytes after every step.
//! Without a GPU it says so and exits 0.

use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use tritonrt::driver::{Device, DeviceBuf};
use tritonrt::pq::gpu::{DeviceTensorRef, GpuIndexer, KernelChoice, LaunchMode, StepOutputs};
use tritonrt::pq::{DType, PqConfig, Shape};
use tritonrt::runtime::Runtime;

const STEPS: usize = 100;

/// The engine's tensors: standard-ish normal values from a fixed seed (xorshift +
/// Box-Muller), so the run is the same every time.
struct Gen(u64);

impl Gen {
    fn next_f32(&mut self) -> f32 {
        let mut u = || {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            ((self.0 >> 11) as f64 + 0.5) / (1u64 << 53) as f64
        };
        let (a, b) = (u(), u());
        ((-2.0 * a.ln()).sqrt() * (std::f64::consts::TAU * b).cos()) as f32
    }
    fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.next_f32()).collect()
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // --- the engine's side: its context, stream and buffers (cudarc, as candle holds them)
    if tritonrt::driver::probe_driver().is_err() || CudaContext::device_count().unwrap_or(0) < 1 {
        println!("SKIP: engine_decode needs a CUDA GPU and driver");
        return Ok(());
    }
    let ctx = CudaContext::new(0)?;
    let stream: Arc<CudaStream> = ctx.new_stream()?;

    let cfg = PqConfig {
        input_dtype: DType::F32,
        weight_dtype: DType::F32,
        ..PqConfig::reference_workload()
    };
    let s0 = 8192;
    let shape = Shape {
        b: 1,
        h: 32,
        h_kv: 8,
        s: s0 + STEPS,
        d: 128,
    };
    let (b, h, h_kv, d, s_max) = (shape.b, shape.h, shape.h_kv, shape.d, shape.s);
    let (m, k) = (cfg.m(), cfg.k_centroids());
    let d_c = cfg.d_c(d);
    let n0 = cfg.n_quantized(s0) - 1; // codes cached before the first step
    let mut g = Gen(0x9E37_79B9_7F4A_7C15);
    let centroids_h = g.vec(b * h_kv * m * k * d_c);
    let codes_h: Vec<i64> = (0..b * n0 * h_kv * m)
        .map(|_| (g.next_f32().abs() * 1e6) as i64 % k as i64)
        .collect();
    let keys_h = g.vec(b * h_kv * s_max * d);
    let queries_h: Vec<Vec<f32>> = (0..STEPS).map(|_| g.vec(b * h * d)).collect();

    let centroids: CudaSlice<f32> = stream.clone_htod(&centroids_h)?;
    let codes: CudaSlice<i64> = stream.clone_htod(&codes_h)?;
    let keys: CudaSlice<f32> = stream.clone_htod(&keys_h)?; // the KV cache's keys
    let mut query: CudaSlice<f32> = stream.alloc_zeros(b * h * d)?;
    let rows = b * h;
    let total = cfg.total(s_max);
    let sparse_list: CudaSlice<i64> = stream.alloc_zeros(rows * total)?;
    let sparse_len: CudaSlice<i64> = stream.alloc_zeros(rows)?;
    let weight_list: CudaSlice<f32> = stream.alloc_zeros(rows * s_max)?;

    // --- tritonrt on the engine's context: runtime, indexer from device buffers
    let ptx = std::env::var("TRITONRT_PTX_CACHE")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/ptx_cache").to_string());
    let rt = Runtime::open(Device::from_context(ctx.clone())?, &ptx)?;
    let mut ix = GpuIndexer::new_on_device(
        rt.clone(),
        stream.clone(),
        cfg,
        shape,
        &centroids,
        None::<&CudaSlice<f32>>,
        &KernelChoice::new(),
    )?;
    ix.import_codes_on_device(&codes, n0)?;
    let q_ref = DeviceTensorRef::new(
        DeviceBuf::of(&query, &stream),
        DType::F32,
        [(h * d) as i64, d as i64, 0],
    )?;
    let k_ref = DeviceTensorRef::new(
        DeviceBuf::of(&keys, &stream),
        DType::F32,
        [(h_kv * s_max * d) as i64, (s_max * d) as i64, d as i64],
    )?;
    let outputs = StepOutputs {
        sparse_list: DeviceBuf::of(&sparse_list, &stream),
        sparse_len: DeviceBuf::of(&sparse_len, &stream),
        weight_list: DeviceBuf::of(&weight_list, &stream),
    };

    // --- the reference: an indexer that owns its outputs, inputs from the host
    let ref_stream = ctx.new_stream()?;
    let mut reference = GpuIndexer::new(
        rt.clone(),
        ref_stream.clone(),
        cfg,
        shape,
        &centroids_h,
        None,
        &KernelChoice::new(),
    )?;
    reference.import_codes(&codes_h, n0)?;
    let ref_keys = ref_stream.clone_htod(&keys_h)?;
    let mut ref_query: CudaSlice<f32> = ref_stream.alloc_zeros(b * h * d)?;
    let rq_ref = DeviceTensorRef::new(
        DeviceBuf::of(&ref_query, &ref_stream),
        DType::F32,
        q_ref.strides(),
    )?;
    let rk_ref = DeviceTensorRef::new(
        DeviceBuf::of(&ref_keys, &ref_stream),
        DType::F32,
        k_ref.strides(),
    )?;

    // --- the decode loop: one new token (query, key already in the cache) per step
    let (mut captures, mut mismatches, mut wall_us) = (0, 0, Vec::with_capacity(STEPS));
    for (i, q) in queries_h.iter().enumerate() {
        let s = s0 + i;
        stream.memcpy_htod(q, &mut query)?;
        stream.synchronize()?;
        let t = Instant::now();
        let info = ix.step_into(&q_ref, &k_ref, s, LaunchMode::Graph, outputs)?;
        ix.synchronize()?;
        wall_us.push(t.elapsed().as_secs_f64() * 1e6);
        captures += usize::from(info.captured);

        ref_stream.memcpy_htod(q, &mut ref_query)?;
        reference.step(&rq_ref, &rk_ref, s, LaunchMode::Launch)?;
        let want = reference.download()?;
        let tot = info.total;
        let got_sl = stream.clone_dtoh(&sparse_list)?;
        let got_len = stream.clone_dtoh(&sparse_len)?;
        let got_w = stream.clone_dtoh(&weight_list)?;
        let same = got_sl[..rows * tot] == want.sparse_list[..]
            && got_len == want.sparse_len
            && got_w[..rows * s] == want.weight_list[..];
        if !same {
            mismatches += 1;
            eprintln!("step {i} (S={s}): the engine's buffers differ from the reference indexer's outputs");
        }
    }
    // the last step again, as is: a replay with no node update (what a loop at a fixed S
    // would pay), beside the loop's steps, each of which moves S and so updates the graph
    let s_last = s0 + STEPS - 1;
    let mut replay_us: Vec<f64> = (0..STEPS)
        .map(|_| {
            let t = Instant::now();
            ix.rewind(cfg.n_quantized(s_last) - 1);
            let r = ix.step_into(&q_ref, &k_ref, s_last, LaunchMode::Graph, outputs);
            let r = r.and_then(|_| ix.synchronize());
            r.map(|_| t.elapsed().as_secs_f64() * 1e6)
        })
        .collect::<tritonrt::Result<_>>()?;
    replay_us.sort_by(f64::total_cmp);
    wall_us.sort_by(f64::total_cmp);
    println!(
        "engine_decode: {STEPS} decode steps (B={b}, H={h}, H_kv={h_kv}, S={s0}..{}), graph captured {captures} time(s), \
         median step {:.1} us wall (node update + replay + synchronize; {:.1} us replaying one step as is); \
         engine-owned outputs vs indexer-owned: {}",
        s0 + STEPS - 1,
        wall_us[STEPS / 2],
        replay_us[STEPS / 2],
        if mismatches == 0 {
            "identical at every step".to_string()
        } else {
            format!("{mismatches} steps DIFFER")
        }
    );
    if mismatches > 0 {
        std::process::exit(1);
    }
    Ok(())
}
