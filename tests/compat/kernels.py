"""Kernels of the compatibility suite (tests/compat/run.py), written the way people write
Triton kernels: each is compiled by Triton's own JIT and launched by Triton's launcher, and
also imported into (and AOT-built for) tritonrt and launched by `tritonrt launch` on the
same inputs. No `from __future__ import annotations`: the scalar annotations
(`a: tl.float16`) must stay dtype objects for the JIT to read them."""
import triton
import triton.language as tl


@triton.jit
def cp_vadd(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """out = x + y (fp32)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=m) + tl.load(y_ptr + offs, mask=m), mask=m)


@triton.jit
def cp_softmax(out_ptr, in_ptr, in_stride, out_stride, n_cols, BLOCK: tl.constexpr):
    """Row softmax of an fp32 matrix, one program per row."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    m = cols < n_cols
    x = tl.load(in_ptr + row * in_stride + cols, mask=m, other=-float("inf"))
    x = x - tl.max(x, axis=0)
    e = tl.exp(x)
    tl.store(out_ptr + row * out_stride + cols, e / tl.sum(e, axis=0), mask=m)


@triton.jit
def cp_matmul(a_ptr, b_ptr, c_ptr, M, N, K, sam, sak, sbk, sbn, scm, scn, BM: tl.constexpr, BN: tl.constexpr,
              BK: tl.constexpr):
    """C (fp32) = A @ B (fp16) with tl.dot: wgmma on sm_90, > 48 KB of shared memory."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, K, BK):
        a = tl.load(a_ptr + rm[:, None] * sam + (k + rk)[None, :] * sak)
        b = tl.load(b_ptr + (k + rk)[:, None] * sbk + rn[None, :] * sbn)
        acc += tl.dot(a, b)
    tl.store(c_ptr + rm[:, None] * scm + rn[None, :] * scn, acc)


@triton.jit
def cp_layernorm(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, stride, N, eps, BLOCK: tl.constexpr):
    """Layer norm over rows with three outputs (y, mean, rstd)."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    m = cols < N
    x = tl.load(x_ptr + row * stride + cols, mask=m, other=0.).to(tl.float32)
    mean = tl.sum(x, axis=0) / N
    d = tl.where(m, x - mean, 0.)
    var = tl.sum(d * d, axis=0) / N
    rstd = 1 / tl.sqrt(var + eps)
    w = tl.load(w_ptr + cols, mask=m)
    b = tl.load(b_ptr + cols, mask=m)
    tl.store(y_ptr + row * stride + cols, d * rstd * w + b, mask=m)
    tl.store(mean_ptr + row, mean)
    tl.store(rstd_ptr + row, rstd)


@triton.jit
def cp_devdesc(in_ptr, out_ptr, M, N, BM: tl.constexpr, BN: tl.constexpr):
    """out = 2 * in (fp16) through device-side tensor descriptors (global scratch)."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    i = tl.make_tensor_descriptor(in_ptr, shape=[M, N], strides=[N, 1], block_shape=[BM, BN])
    o = tl.make_tensor_descriptor(out_ptr, shape=[M, N], strides=[N, 1], block_shape=[BM, BN])
    o.store([pid_m * BM, pid_n * BN], i.load([pid_m * BM, pid_n * BN]) * 2)


@triton.jit
def cp_hostdesc(in_desc, out_desc, scale: tl.float16, M_BLOCK: tl.constexpr, N_BLOCK: tl.constexpr):
    """out = in * scale (fp16) through host TensorDescriptor arguments."""
    pm = tl.program_id(0)
    pn = tl.program_id(1)
    x = in_desc.load([pm * M_BLOCK, pn * N_BLOCK])
    out_desc.store([pm * M_BLOCK, pn * N_BLOCK], (x * scale).to(tl.float16))


@triton.jit
def cp_atomics(out_f32_ptr, out_i64_ptr, x_ptr, n, a: tl.float16, b: tl.bfloat16, flag, big, BLOCK: tl.constexpr):
    """Atomic sums into 16 bins with fp16 / bf16 / i1 / i64 scalar arguments."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m, other=0.)
    v = x * a.to(tl.float32) + b.to(tl.float32)
    if flag:
        v = -v
    tl.atomic_add(out_f32_ptr + (offs % 16), v, mask=m)
    tl.atomic_add(out_i64_ptr + (offs % 16), offs.to(tl.int64) + big, mask=m)


@triton.jit
def cp_cluster(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """out = 3 * x, compiled for 2-CTA clusters (num_ctas=2)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=m) * 3, mask=m)


@triton.jit
def cp_pdl(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """out = x + 1 with programmatic dependent launch (griddepcontrol)."""
    tl.extra.cuda.gdc_wait()
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=m) + 1, mask=m)
    tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def cp_coop(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """out = x - 2, launched as a cooperative grid (launch_cooperative_grid)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=m) - 2, mask=m)
