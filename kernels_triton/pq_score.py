"""PQ scoring kernels that write the scores out (the fast path, pq_select.py, never
materializes them).

* ``pq_score_kernel_v6``: the upstream scoring kernel's contract. fp32 query
  ``[B, H, M, d_s]``, fp32 centroids ``[B, H, M, K, >= d_s]`` (only the first d_s
  coordinates count, so the ip layout with d_s + 1 works as is), int64 codes seen as
  ``[B, H, M, N]``, fp32 scores ``[B, H, N]``; every tensor through element strides, so
  a GQA expansion is a stride-0 view (kv head h // G) and the upstream code layout
  ``[B, N, H_kv, M]`` needs no copy. ``score[b,h,j] = sum_m <q[b,h,m], centroids[b,h,m,code]>``.
* ``pq_score_lut_kernel``: the same scores from the runtime's u8 code state
  ``[B, H_kv, M, cap]`` through a per-head lookup table ``lut[m, c] = <q_m, c_{m,c}>``.
"""

import triton
import triton.language as tl

from kspec import Kernel, Variant, grid, i32, i64, ptr, single


@triton.jit
def pq_score_kernel_v6(
    queries_ptr, centroids_ptr, codebook_ptr, scores_ptr,  #
    b, h, n_subvec, subvec_d, n_clustered,  #
    q_stride_b, q_stride_h, q_stride_subvec, q_stride_d,  #
    c_stride_b, c_stride_h, c_stride_subvec, c_stride_cent, c_stride_d,  #
    cb_stride_b, cb_stride_h, cb_stride_subvec, cb_stride_clustered,  #
    s_stride_b, s_stride_h, s_stride_clustered,  #
    BLOCK_KEYS: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """Grid: (b * h * cdiv(n_clustered, BLOCK_KEYS),); program p scores keys
    ``(p % nb) * BLOCK_KEYS ..`` of row ``p // nb`` (``nb = cdiv(n_clustered, BLOCK_KEYS)``)."""
    pid = tl.program_id(0)
    nb = tl.cdiv(n_clustered, BLOCK_KEYS)
    row = pid // nb
    kb = pid % nb
    bi = (row // h).to(tl.int64)
    hi = (row % h).to(tl.int64)
    keys = kb * BLOCK_KEYS + tl.arange(0, BLOCK_KEYS)
    kmask = keys < n_clustered
    keys64 = keys.to(tl.int64)
    acc = tl.zeros([BLOCK_KEYS], tl.float32)
    for m in range(n_subvec):
        code = tl.load(codebook_ptr + bi * cb_stride_b + hi * cb_stride_h + m * cb_stride_subvec +
                       keys64 * cb_stride_clustered, mask=kmask, other=0)
        qbase = queries_ptr + bi * q_stride_b + hi * q_stride_h + m * q_stride_subvec
        cbase = centroids_ptr + bi * c_stride_b + hi * c_stride_h + m * c_stride_subvec
        crow = cbase + code * c_stride_cent
        for d0 in range(0, subvec_d, BLOCK_D):
            d = d0 + tl.arange(0, BLOCK_D)
            dmask = d < subvec_d
            qv = tl.load(qbase + d * q_stride_d, mask=dmask, other=0.0)
            cv = tl.load(crow[:, None] + d[None, :] * c_stride_d, mask=kmask[:, None] & dmask[None, :], other=0.0)
            acc += tl.sum(cv * qv[None, :], axis=1)
    tl.store(scores_ptr + bi * s_stride_b + hi * s_stride_h + keys64 * s_stride_clustered, acc, mask=kmask)


@triton.jit
def pq_score_lut_kernel(q_ptr, cent_ptr, codes_ptr, scores_ptr, q_sb, q_sh, H, G, M, K, d_s, d_c, n, cap,
                        BLOCK: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_DS: tl.constexpr):
    """scores[r, j] (fp32, [B*H, n] contiguous) for keys j < n of row r = b*H + h, from
    u8 codes [B, H_kv, M, cap] and fp32 centroids [B, H_kv, M, K, d_c] (contiguous).
    Grid: (cdiv(n, BLOCK), B*H)."""
    c = tl.program_id(0)
    r = tl.program_id(1)
    b = (r // H).to(tl.int64)
    h = (r % H).to(tl.int64)
    bg = b * (H // G) + h // G
    j = c * BLOCK + tl.arange(0, BLOCK)
    offs_c = tl.arange(0, BLOCK_K)
    cmask = offs_c < K
    score = tl.zeros([BLOCK], tl.float32)
    for m in range(M):
        lut = tl.zeros([BLOCK_K], tl.float32)
        cbase = cent_ptr + ((bg * M + m) * K) * d_c
        for d0 in range(0, d_s, BLOCK_DS):
            d = d0 + tl.arange(0, BLOCK_DS)
            dmask = d < d_s
            qv = tl.load(q_ptr + b * q_sb + h * q_sh + m * d_s + d, mask=dmask, other=0.0).to(tl.float32)
            cv = tl.load(cbase + offs_c[:, None] * d_c + d[None, :], mask=cmask[:, None] & dmask[None, :], other=0.0)
            lut += tl.sum(cv * qv[None, :], axis=1)
        code = tl.load(codes_ptr + (bg * M + m) * cap + j, mask=j < cap, other=0).to(tl.int32) & (K - 1)
        score += tl.gather(lut, code, 0)
    tl.store(scores_ptr + r.to(tl.int64) * n + j, score, mask=j < n)


def _v6_args():
    names = ["b", "h", "n_subvec", "subvec_d", "n_clustered"]
    strides = ["q_stride_b", "q_stride_h", "q_stride_subvec", "q_stride_d", "c_stride_b", "c_stride_h",
               "c_stride_subvec", "c_stride_cent", "c_stride_d", "cb_stride_b", "cb_stride_h", "cb_stride_subvec",
               "cb_stride_clustered", "s_stride_b", "s_stride_h", "s_stride_clustered"]
    return ((ptr("queries_ptr", "fp32", False), ptr("centroids_ptr", "fp32", False),
             ptr("codebook_ptr", "i64", False), ptr("scores_ptr", "fp32", False)) + tuple(i32(x) for x in names) +
            tuple(i64(x) for x in strides))


KERNELS = [
    Kernel(
        name="pq_score_kernel_v6",
        fn=pq_score_kernel_v6,
        args=_v6_args(),
        variants={
            80: single({"BLOCK_KEYS": 256, "BLOCK_D": 64}, 4, 1),
            # the default and 4 candidates: the full 72-point grid (BLOCK_KEYS 64..512,
            # 2/4/8 warps, 1-3 stages) gained at most 1.02x on the H100, and both winners
            # (BK=128 BD=64 w2 s2, BK=256 BD=32 w2 s2) are among these (NOTES.md,
            # "Autotuner (issue 4): tuned vs default, measured side by side in one run")
            90: (single({"BLOCK_KEYS": 256, "BLOCK_D": 64}, 4, 1) +
                 tuple(Variant.make({"BLOCK_KEYS": bk, "BLOCK_D": bd}, 2, 2, False) for bk in (128, 256)
                       for bd in (32, 64))),
        },
    ),
]
for _qt in ("fp32", "bf16", "fp16"):
    KERNELS.append(
        Kernel(
            name=f"pq_score_lut.q_{_qt}",
            fn=pq_score_lut_kernel,
            args=(ptr("q_ptr", _qt, False), ptr("cent_ptr", "fp32"), ptr("codes_ptr", "u8"), ptr("scores_ptr", "fp32"),
                  i64("q_sb"), i64("q_sh"), i32("H"), i32("G"), i32("M"), i32("K"), i32("d_s"), i32("d_c"), i32("n"),
                  i32("cap", div16=True)),
            fixed={"BLOCK_K": 256, "BLOCK_DS": 32},
            variants={
                80: single({"BLOCK": 1024}, 4, 1),
                # the winner on the H100 was BLOCK=2048 w8 at both workloads (1.9x over the
                # default; NOTES.md, "Autotuner (issue 4)"): BLOCK 512 is not kept
                90: grid({"BLOCK": 1024}, 4, 1, BLOCK=(1024, 2048), num_warps=(4, 8)),
            },
        ))
