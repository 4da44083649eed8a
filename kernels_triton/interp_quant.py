#!/usr/bin/env python3
"""CPU check of ``pq_cprep_kernel`` + ``pq_quant_kernel`` under Triton's interpreter (no GPU, no torch).

    TRITON_INTERPRET=1 python3 kernels_triton/interp_quant.py

Quantizes the new keys of a small random state (B=1, H_kv=2, M=2, D=64: d_s=32, K=64,
euclidean, 70 new keys: a full and a masked tile of 64) with each form of the
product (bf16 keys with ``SPLIT16`` 1 and 0, fp32 keys with tf32x3), with one CTA per
row looping over both tiles or one CTA per tile, then ``SPLIT16`` at K=128 (two centroid
blocks) with d_s=32 (each key tile loaded once) and d=160, d_s=80 (the general loop over
coordinate blocks), and checks every code
against a float64 argmin by the spec's code rule (``CODE_TOL`` in src/pq/check.rs: the
chosen centroid's distance within ``1e-5 * (||x||^2 + max ||c||^2)`` of the minimum);
keys with a NaN or infinite coordinate (a few planted) must get exactly the reference's
code under the non-finite rule (code 0 here: every distance is NaN or +inf). Codes outside
the new keys' range must keep their poison. ``pq_cprep``'s output, which ``pq_quant``
reads, is checked first: the norms against float64 (relative 1e-6), the three bf16 terms
summing to each centroid exactly. Exit status 1 on the first mismatch.

Triton's interpreter stores bf16 as uint16 and its ``tl.dot`` multiplies those bit
patterns (triton-lang/triton#11584, not supported upstream), so this script converts
bf16 ``tl.dot`` operands to f32 first (``_bf16_dot``): the ``SPLIT16`` check covers the
split and the three products' sum, the GPU's bf16 tensor-core products are covered by
``tests/multi_token_gpu.rs``. Metric ip is left to those tests too: the interpreter
fails on the kernel's scalar ``bad | ~(phi < SAFE)`` (a numpy ``bitwise_or`` type error),
which compiles and runs on the GPU.
"""

import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from interp_check import Arr, nearest  # noqa: E402
from pq_quant import FIXED, KERNELS, pq_cprep_kernel, pq_quant_kernel  # noqa: E402
from triton.runtime import interpreter  # noqa: E402
import triton.language as tl  # noqa: E402

CODE_TOL = 1e-5
POISON = 201

_dot = interpreter.InterpreterBuilder.create_dot


def _bf16_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
    """The interpreter's ``create_dot`` with bf16 operands widened to f32 first (exact)."""

    def wide(x):
        if x.dtype.scalar == tl.bfloat16:
            return interpreter.TensorHandle(
                interpreter._convert_float(x.data, tl.bfloat16, tl.float32, None).view(np.float32).reshape(x.data.shape),
                tl.float32)
        return x

    return _dot(self, wide(a), wide(b), d, input_precision, max_num_imprecise_acc)


interpreter.InterpreterBuilder.create_dot = _bf16_dot


def to_bf16(x):
    """float32 -> bf16 bits (round to nearest even) as uint16, and the values they hold."""
    b = np.ascontiguousarray(x, np.float32).view(np.uint32)
    r = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    r[nan] = 0x7FC0
    return r, (r.astype(np.uint32) << 16).view(np.float32)


def run(rng, dtype, split16, metric_ip, ctas, bits=6, D=64):
    """One state of head dimension ``D`` (``d_s = D / 2``), pq_cprep then one pq_quant
    launch of ``ctas`` CTAs per row (each looping over its key tiles) with the build's
    ``BLOCK_D`` (64 with ``SPLIT16``: at ``K <= 64`` and ``d_s <= 64`` every centroid and
    coordinate in one block, the one-block loop; 32 without); returns the number of codes
    checked."""
    B, H_kv, M, S_alloc = 1, 2, 2, 160
    K, d_s = 1 << bits, D // M
    d_c = d_s + metric_ip
    pos0, t0, n_new, cap = 20, 5, 70, 96
    key = rng.standard_normal((B, H_kv, S_alloc, D)).astype(np.float32)
    # non-finite keys: subvector 0 of key 3 (g 0), subvector 1 of key 66 (g 1)
    key[0, 0, pos0 + 3, 7] = np.nan
    key[0, 1, pos0 + 66, d_s + 1] = np.inf
    if dtype == "bf16":
        bits16, key = to_bf16(key)
        k_arr = Arr(bits16, "bfloat16")
    else:
        k_arr = Arr(key)
    cent = rng.standard_normal((B, H_kv, M, K, d_c)).astype(np.float32)
    cent[0, 1, 0, 9] = cent[0, 1, 0, 4]  # an exact tie (either code passes the rule)
    phi = np.full(B * H_kv * M, float(d_s) * 3.0, np.float32)
    codes = np.full((B, H_kv, M, cap), POISON, np.uint8)
    c_arr = Arr(codes)
    rows = B * H_kv * M
    prep = Arr(np.full(rows * 3 * K * d_s, 0x7FC0, np.uint16), "bfloat16")  # NaN where not written
    cn = Arr(np.full(rows * K, np.nan, np.float32))
    cprep = next(k for k in KERNELS if k.name == "pq_cprep")
    pq_cprep_kernel[((K + 63) // 64, rows)](Arr(cent), prep, cn, K, d_s, metric_ip, 1, num_warps=4, **cprep.fixed)
    want_cn = (cent.astype(np.float64)**2).sum(-1).reshape(-1)
    if not np.allclose(cn.a, want_cn, rtol=1e-6):
        sys.exit(f"pq_cprep: norms differ from float64 by up to {np.abs(cn.a - want_cn).max()}")
    parts = (prep.a.astype(np.uint32) << 16).view(np.float32).reshape(rows, 3, K, d_s)
    if not np.array_equal(parts.sum(1, dtype=np.float64), cent.reshape(rows, K, d_c)[:, :, :d_s].astype(np.float64)):
        sys.exit("pq_cprep: the three bf16 terms do not sum to the centroids exactly")
    # split = 0 (keys other than bf16): the norms alone, the split untouched
    prep0 = Arr(np.full(rows * 3 * K * d_s, 0x7FC0, np.uint16), "bfloat16")
    cn0 = Arr(np.full(rows * K, np.nan, np.float32))
    pq_cprep_kernel[((K + 63) // 64, rows)](Arr(cent), prep0, cn0, K, d_s, metric_ip, 0, num_warps=4, **cprep.fixed)
    if not np.array_equal(cn0.a, cn.a) or not np.all(prep0.a == 0x7FC0):
        sys.exit("pq_cprep with split = 0: norms differ or the split was written")
    pq_quant_kernel[(ctas, rows)](k_arr, Arr(cent), Arr(phi), prep, cn, c_arr, H_kv * S_alloc * D, S_alloc * D, D,
                                  H_kv, M, K, d_s, pos0, t0, n_new, cap, metric_ip, BLOCK_N=64, SPLIT16=split16,
                                  BLOCK_D=64 if split16 else 32, num_warps=8, **FIXED)
    got = c_arr.a
    what = f"{dtype} SPLIT16={split16} metric_ip={metric_ip} K={K} d_s={d_s} {ctas} CTA(s) per row"
    checked = 0
    for g in range(H_kv):
        for m in range(M):
            row = (g * M + m)
            out = got[0, g, m]
            if (out[:t0] != POISON).any() or (out[t0 + n_new:] != POISON).any():
                sys.exit(f"{what}: codes outside t0 .. t0 + n_new written (g={g} m={m})")
            c = cent[0, g, m]
            for t in range(n_new):
                x = key[0, g, pos0 + t, m * d_s:(m + 1) * d_s]
                code = int(out[t0 + t])
                want = nearest(x, c, phi[row], metric_ip)
                if not np.isfinite(x).all():
                    if code != want:
                        sys.exit(f"{what}: non-finite key g={g} m={m} t={t}: code {code}, reference {want}")
                else:
                    xe = x.astype(np.float64)
                    ce = c.astype(np.float64)
                    if metric_ip:
                        xe = np.append(xe, np.sqrt(max(0.0, float(phi[row]) - float(xe @ xe))))
                    else:
                        ce = ce[:, :d_s]
                    d = ((ce - xe[None, :])**2).sum(1)
                    tol = CODE_TOL * (float(xe @ xe) + float((ce * ce).sum(1).max()))
                    if not (0 <= code < K) or d[code] > d.min() + tol:
                        sys.exit(f"{what}: g={g} m={m} t={t}: code {code} ({d[code] if code < K else 'out of range'})"
                                 f", reference {want} ({d[want]}), tolerance {tol}")
                checked += 1
    print(f"ok   {what}: {checked} codes")
    return checked


def main():
    rng = np.random.default_rng(21)
    total = 0
    # n_new = 70 keys are two tiles of 64: one CTA per row loops over both, two take one each
    for dtype, split16, ctas in (("bf16", 1, 1), ("bf16", 1, 2), ("bf16", 0, 1), ("fp32", 0, 2)):
        total += run(rng, dtype, split16, 0, ctas)
    # K = 128 > BLOCK_C: the split's loop over centroid blocks, each key tile loaded once
    # (d_s = 32 <= BLOCK_D), and the general loop (d_s = 80: two coordinate blocks)
    total += run(rng, "bf16", 1, 0, 2, bits=7)
    total += run(rng, "bf16", 1, 0, 1, bits=7, D=160)
    print(f"pq_quant interpreter check passed ({total} codes)")


if __name__ == "__main__":
    main()
