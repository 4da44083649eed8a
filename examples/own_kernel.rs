//! Your own Triton kernels from Rust, with no Python at run time: `own_kernel/kernels.py`
//! (an fp32 `axpby` with pointer and scalar arguments, and an fp16 `tile_scale` that takes
//! host tensor descriptors, moved by TMA on sm_90) was compiled ahead of time into
//! `own_kernel/ptx_cache` by `tritonrt build`, and `tritonrt bindgen` wrote the typed
//! launchers in `own_kernel/kernels.rs` (a `build.rs` can call
//! `tritonrt::bindgen::write_bindings` instead). Both kernels run on the GPU and are
//! checked against exact host values.
//!
//! ```sh
//! cargo run --release --example own_kernel [-- PTX_CACHE_DIR]
//! ```
//!
//! Without a GPU it says so and exits 0.

use tritonrt::abi::TensorDescArg;
use tritonrt::artifact::Dtype;
use tritonrt::driver::{Device, DeviceBuf};
use tritonrt::half::f16;
use tritonrt::runtime::Runtime;

/// The generated launchers: `kernels::axpby(&rt, &stream, grid, &x, &y, &out, a, b, n)`,
/// `kernels::tile_scale(&rt, &stream, grid, in_desc, out_desc, scale)`.
mod kernels {
    include!("own_kernel/kernels.rs");
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if let Err(e) = tritonrt::driver::probe_driver() {
        println!("no GPU here ({e}); nothing to run");
        return Ok(());
    }
    let device = Device::new(0)?;
    // The example's ptx_cache, or the directory given as the first argument (a copy of it
    // on another machine).
    let ptx_cache = std::env::args().nth(1).unwrap_or_else(|| {
        concat!(env!("CARGO_MANIFEST_DIR"), "/examples/own_kernel/ptx_cache").to_string()
    });
    let rt = Runtime::open(device.clone(), ptx_cache)?;
    let stream = device.new_stream()?;

    // out = 2 x - y over n fp32 values (small integers: exact).
    let n = 10_000usize;
    let x: Vec<f32> = (0..n).map(|i| (i % 17) as f32).collect();
    let y: Vec<f32> = (0..n).map(|i| (i % 5) as f32).collect();
    let (xd, yd) = (stream.clone_htod(&x)?, stream.clone_htod(&y)?);
    let out = stream.alloc_zeros::<f32>(n)?;
    let blocks = n.div_ceil(1024) as u32;
    kernels::axpby(
        &rt,
        &stream,
        [blocks, 1, 1],
        &xd,
        &yd,
        &out,
        2.0,
        -1.0,
        n as i32,
    )?;
    let got = stream.clone_dtoh(&out)?;
    let bad = (0..n).filter(|&i| got[i] != 2.0 * x[i] - y[i]).count();
    println!("axpby: {n} values, {bad} wrong");

    // out = in * 0.5 over a 256 x 192 fp16 matrix in 64 x 64 tiles. fp16 buffers are u16
    // bit patterns; a descriptor is the buffer, its shape and (here contiguous) strides.
    let (rows, cols) = (256usize, 192usize);
    let host: Vec<u16> = (0..rows * cols)
        .map(|i| f16::from_f32((i % 251) as f32).to_bits())
        .collect();
    let src = stream.clone_htod(&host)?;
    let dst = stream.alloc_zeros::<u16>(rows * cols)?;
    let desc = |buf: DeviceBuf| {
        TensorDescArg::contiguous(buf.as_dtype(Dtype::Fp16), &[rows as i64, cols as i64])
    };
    let (i, o) = (
        desc(DeviceBuf::of(&src, &stream))?,
        desc(DeviceBuf::of(&dst, &stream))?,
    );
    let grid = [(rows / 64) as u32, (cols / 64) as u32, 1];
    kernels::tile_scale(&rt, &stream, grid, i, o, f16::from_f32(0.5))?;
    let got = stream.clone_dtoh(&dst)?;
    let bad2 = (0..rows * cols)
        .filter(|&k| f16::from_bits(got[k]).to_f32() != 0.5 * (k % 251) as f32)
        .count();
    println!(
        "tile_scale ({}): {} values, {bad2} wrong",
        rt.default_kernel("tile_scale")?.id(),
        rows * cols
    );
    if bad + bad2 > 0 {
        return Err("wrong results".into());
    }
    println!("ok");
    Ok(())
}
