// Typed launchers for the kernels of examples/own_kernel/ptx_cache/manifest.json (Triton 3.6.0), written by
// tritonrt's bindgen: regenerate instead of editing.

/// The logical name of kernel `axpby` (variants: axpby.BLOCK=1024.w4.s3.sm80, axpby.BLOCK=1024.w4.s3.sm90).
#[allow(dead_code)]
pub const AXPBY: &str = "axpby";

/// Launch kernel `axpby` (the runtime's default variant for its device) on `stream`
/// with Triton's program grid `grid`. Arguments:
/// - `x_ptr`: `*fp32`, device memory of `f32`, address (a multiple of 16, checked at launch)
/// - `y_ptr`: `*fp32`, device memory of `f32`, address (a multiple of 16, checked at launch)
/// - `out_ptr`: `*fp32`, device memory of `f32`, address (a multiple of 16, checked at launch)
/// - `a`: `fp32`
/// - `b`: `fp32`
/// - `n`: `i32`
///
/// Errors: the variant cannot be loaded; an argument breaks what the variant was
/// compiled to assume (divisibility, descriptor shape); the manifest's signature
/// changed since this was generated; the driver refuses the launch.
#[allow(clippy::too_many_arguments, dead_code)]
pub fn axpby(
    rt: &tritonrt::runtime::Runtime,
    stream: &std::sync::Arc<tritonrt::cudarc::driver::CudaStream>,
    grid: [u32; 3],
    x_ptr: &impl tritonrt::cudarc::driver::DevicePtr<f32>,
    y_ptr: &impl tritonrt::cudarc::driver::DevicePtr<f32>,
    out_ptr: &impl tritonrt::cudarc::driver::DevicePtr<f32>,
    a: f32,
    b: f32,
    n: i32,
) -> tritonrt::Result<()> {
    let kernel = rt.default_kernel("axpby")?;
    axpby_on(&kernel, stream, grid, x_ptr, y_ptr, out_ptr, a, b, n)
}

/// [`axpby`] on a given loaded variant of `axpby` (a tuned one, say).
///
/// Errors: as [`axpby`]; [`tritonrt::Error::Launch`] when `kernel` is a variant of
/// another kernel.
#[allow(clippy::too_many_arguments, dead_code)]
pub fn axpby_on(
    kernel: &tritonrt::driver::Kernel,
    stream: &std::sync::Arc<tritonrt::cudarc::driver::CudaStream>,
    grid: [u32; 3],
    x_ptr: &impl tritonrt::cudarc::driver::DevicePtr<f32>,
    y_ptr: &impl tritonrt::cudarc::driver::DevicePtr<f32>,
    out_ptr: &impl tritonrt::cudarc::driver::DevicePtr<f32>,
    a: f32,
    b: f32,
    n: i32,
) -> tritonrt::Result<()> {
    if kernel.variant().kernel != "axpby" {
        return Err(tritonrt::Error::Launch {
            kernel: kernel.id().to_string(),
            msg: format!("a launcher of axpby was given a variant of {}", kernel.variant().kernel),
        });
    }
    kernel.launch(stream, grid, &[
        tritonrt::abi::KernelArg::Buf(tritonrt::driver::DeviceBuf::of(x_ptr, stream)),
        tritonrt::abi::KernelArg::Buf(tritonrt::driver::DeviceBuf::of(y_ptr, stream)),
        tritonrt::abi::KernelArg::Buf(tritonrt::driver::DeviceBuf::of(out_ptr, stream)),
        tritonrt::abi::KernelArg::F32(a),
        tritonrt::abi::KernelArg::F32(b),
        tritonrt::abi::KernelArg::I32(n),
    ])
}

/// The logical name of kernel `tile_scale` (variants: tile_scale.BM=64.BN=64.w4.s3.sm80, tile_scale.BM=64.BN=64.w4.s3.sm90).
#[allow(dead_code)]
pub const TILE_SCALE: &str = "tile_scale";

/// Launch kernel `tile_scale` (the runtime's default variant for its device) on `stream`
/// with Triton's program grid `grid`. Arguments:
/// - `in_desc`: `tensordesc<fp16[64, 64]>`: a descriptor of a 2-dimensional fp16 tensor (innermost stride 1; for TMA, 16-byte aligned with 16-byte row strides; checked)
/// - `out_desc`: `tensordesc<fp16[64, 64]>`: a descriptor of a 2-dimensional fp16 tensor (innermost stride 1; for TMA, 16-byte aligned with 16-byte row strides; checked)
/// - `scale`: `fp16`
///
/// Errors: the variant cannot be loaded; an argument breaks what the variant was
/// compiled to assume (divisibility, descriptor shape); the manifest's signature
/// changed since this was generated; the driver refuses the launch.
#[allow(clippy::too_many_arguments, dead_code)]
pub fn tile_scale(
    rt: &tritonrt::runtime::Runtime,
    stream: &std::sync::Arc<tritonrt::cudarc::driver::CudaStream>,
    grid: [u32; 3],
    in_desc: tritonrt::abi::TensorDescArg,
    out_desc: tritonrt::abi::TensorDescArg,
    scale: tritonrt::half::f16,
) -> tritonrt::Result<()> {
    let kernel = rt.default_kernel("tile_scale")?;
    tile_scale_on(&kernel, stream, grid, in_desc, out_desc, scale)
}

/// [`tile_scale`] on a given loaded variant of `tile_scale` (a tuned one, say).
///
/// Errors: as [`tile_scale`]; [`tritonrt::Error::Launch`] when `kernel` is a variant of
/// another kernel.
#[allow(clippy::too_many_arguments, dead_code)]
pub fn tile_scale_on(
    kernel: &tritonrt::driver::Kernel,
    stream: &std::sync::Arc<tritonrt::cudarc::driver::CudaStream>,
    grid: [u32; 3],
    in_desc: tritonrt::abi::TensorDescArg,
    out_desc: tritonrt::abi::TensorDescArg,
    scale: tritonrt::half::f16,
) -> tritonrt::Result<()> {
    if kernel.variant().kernel != "tile_scale" {
        return Err(tritonrt::Error::Launch {
            kernel: kernel.id().to_string(),
            msg: format!("a launcher of tile_scale was given a variant of {}", kernel.variant().kernel),
        });
    }
    kernel.launch(stream, grid, &[
        tritonrt::abi::KernelArg::TensorDesc(in_desc),
        tritonrt::abi::KernelArg::TensorDesc(out_desc),
        tritonrt::abi::KernelArg::F16(scale),
    ])
}

