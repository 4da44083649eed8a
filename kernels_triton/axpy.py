"""fp32 ``out = a * x + y``: the smallest kernel that proves the AOT path end to end
(build -> manifest -> artifact store -> JIT -> launch from Rust)."""

import triton
import triton.language as tl

from kspec import Kernel, f32, grid, i32, ptr


@triton.jit
def axpy_kernel(x_ptr, y_ptr, out_ptr, a, n, BLOCK: tl.constexpr):
    """out[i] = a * x[i] + y[i] for i < n. Grid: (cdiv(n, BLOCK),)."""
    pid = tl.program_id(0).to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, a * x + y, mask=mask)


KERNELS = [
    Kernel(
        name="axpy_kernel",
        fn=axpy_kernel,
        args=(ptr("x_ptr", "fp32"), ptr("y_ptr", "fp32"), ptr("out_ptr", "fp32"), f32("a"), i32("n")),
        variants={
            80: grid({"BLOCK": 1024}, 4, 1, BLOCK=(1024, )),
            90: grid({"BLOCK": 1024}, 4, 1, BLOCK=(256, 1024, 4096), num_warps=(4, 8)),
        },
    ),
]
