"""Two Triton kernels of an application (not of tritonrt): what examples/own_kernel.rs
compiles ahead of time and launches from Rust.

    tritonrt build examples/own_kernel/kernels.py --spec examples/own_kernel/spec.json \
        --out examples/own_kernel/ptx_cache
    tritonrt bindgen --ptx-cache examples/own_kernel/ptx_cache --out examples/own_kernel/kernels.rs
"""
import triton
import triton.language as tl


@triton.jit
def axpby(x_ptr, y_ptr, out_ptr, a, b, n, BLOCK: tl.constexpr):
    """out = a * x + b * y over n fp32 elements."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    tl.store(out_ptr + i, a * tl.load(x_ptr + i, mask=m) + b * tl.load(y_ptr + i, mask=m), mask=m)


@triton.jit
def tile_scale(in_desc, out_desc, scale, BM: tl.constexpr, BN: tl.constexpr):
    """out = in * scale over an fp16 matrix, one (BM, BN) tile per program (x: rows,
    y: columns), moved by TMA through host tensor descriptors on sm_90."""
    pm = tl.program_id(0)
    pn = tl.program_id(1)
    x = in_desc.load([pm * BM, pn * BN])
    out_desc.store([pm * BM, pn * BN], (x * scale).to(tl.float16))
