"""The PQCache prefill: the PQ codebook by k-means (spec: pqcache-prefill.md).

Every ``(b, g, m)`` is an independent clustering problem, its *group*
``gi = (b * H_kv + g) * M + m`` (``G = B * H_kv * M`` groups). Group ``gi`` clusters the
``n`` subvectors ``x_j = key[b, g, pos0 + j, m*d_s : (m+1)*d_s]`` (``j < n``), read as f32
from a strided key tensor (last dimension contiguous). Metric ip extends each ``x_j`` by
``a_j = sqrt(max(0, phi - ||x_j||^2))`` (``phi = max_j ||x_j||^2``), so centroids have
``d_c = d_s + 1`` coordinates; euclidean: ``d_c = d_s``.

Layouts (the upstream ones where upstream has one):
centroids f32 ``[G, K, d_c]`` (= ``[B, H_kv, M, K, d_c]``), phi f32 ``[G]``, codes u8
``[G, cap]`` (the decode indexer's own state layout ``[B, H_kv, M, cap]``), partial sums
f32 ``[G, P, K, d_c]`` and counts i32 ``[G, P, K]`` (P: parts per group, one CTA each),
the key coordinates' ranges u32 ``[G, 2, d_s]`` (``_ord`` keys of ``max_j x_jd`` and of
``max_j -x_jd``; zeroed by the host).

The key kernels are compiled assuming the key view's address, its strides, the
subvector stride ``k_sm`` and ``d_s`` are multiples of 16 elements (vector loads); keys
that are not are first copied by ``pq_km_pack`` into ``[B, H_kv, n, M, d_pad]`` with
``d_pad = roundup(d_s, 16)``, zero-padded.

Kernels, launched in this order by ``src/pq/prefill/gpu.rs`` on one stream:

* ``pq_km_prep``: grid ``(P', G)``, its own parts (``per`` keys each, as many CTAs as
  are resident at once: a short loop of dependent loads per CTA). One pass over the
  keys counts non-finite values (``bad``, i32, added to) and takes the range of every
  key coordinate (atomic max of ``_ord`` keys); metric ip, a second pass: ``phi[gi] =
  max ||x_j||^2`` (atomic max of non-negative floats; the host zeroes ``phi`` first).
* ``pq_km_init``: grid ``(cdiv(K, BLOCK_K), G)``. ``c_k = x_{idx_k}`` with
  ``idx_k = floor(k * n / K)`` (strided init) or ``idx[gi, k]`` (``use_idx``: random
  init drawn on the host); ip: coordinate ``d_s`` is ``a_{idx_k}``.
* ``pq_km_assign``: grid ``(P, G)``; CTA ``p`` owns keys ``p*per .. min(n, (p+1)*per)``.
  Assigns each key to its nearest centroid (lowest k on ties), writes the codes and,
  unless ``final``, counts the keys whose code changed (``chg[it % 2, gi]``; every key
  on iteration 0). A group whose ``done`` flag is set returns at once (unless ``final``).
  Where ``K <= BLOCK_K`` and ``d_s <= BLOCK_D`` it also writes the part's member sums
  (as ``pq_km_sums`` would, from the codes and keys it already holds), and the host
  skips ``pq_km_sums``.
* ``pq_km_sums``: grid ``(P, cdiv(K, BLOCK_K), G)``: part ``p``'s member counts and
  sums for one tile of clusters (``onehot^T @ x`` over the part's keys), and the ip
  augmentation's sums.
* ``pq_km_update``: grid ``(cdiv(K, BLOCK_K), G)``. Where no code changed this
  iteration the group has converged: ``done[gi] = 1`` and the centroids stay.
  Otherwise every centroid becomes the mean of its members (sums of the P parts added
  in part order: deterministic), and a cluster with no member keeps its centroid;
  ``iters[gi] = it + 1``. Zeroes ``chg[(it + 1) % 2, gi]`` for the next iteration.
* ``pq_km_assign`` once more with ``final = 1``: the codes against the final centroids.

Distances: ``||x - c||^2 = ||x||^2 - 2 <x, c> + ||c||^2``; the argmin drops ``||x||^2``
and takes ``<x, c>`` on the tensor cores at about f32 accuracy (``_dot_keys_cent``). The
expanded form rounds at the scale of ``||x||^2`` while the spec's rule (a) is absolute
(``1e-5 (1 + d_c)``), so keys sharing a large component (a coordinate far from 0 in
every key, as LLM keys' outlier channels are) can get codes off the best distance by
more than that (on an H100 uncentered f32 keys offset by 300 did, and bf16 keys offset
by 1000). So keys are centered: ``x' = x - mu``, ``c' = c - mu`` (``_center``), per group
and coordinate a value of the key type inside the coordinate's range ``[lo, hi]`` (from
``pq_km_prep``) with ``mu / 2 <= lo`` and ``hi <= 2 mu`` (or the same for negative
values), so ``x - mu`` is exact in the key type (Sterbenz); 0 where none is (values of
both signs, or spanning more than a factor of 4). f32 keys (TF32x3, through registers
either way) always take the centered loop. 16-bit keys go from the load straight into
exact products (``c`` split into three terms of the key type) where nothing is
centered, and a centered tile goes through registers (19-33 % slower on an H100), so a
group takes the centered loop only where ``_center`` centers one of its coordinates
(``_any_center``, the same for every tile of the group; NOTES.md, "16-bit prefill keys
centered where they need it"). The member sums are ``onehot^T @ x`` by the same dot (the one-hot
matrix is exact; 16-bit keys are exact in TF32, so there one TF32 product suffices).
Squared norms use rounded products (``_mul_rn``), so every thread holding a copy of a
reduced value holds the same bits (ARCHITECTURE.md, "Correct under any CTA schedule",
(g)).
"""

import triton
import triton.language as tl

from kspec import Kernel, i32, i64, ptr, single
from pq_select import INTERPRETED, _mul_rn
from triton.language.extra import libdevice


@triton.jit
def _group(gi, H_kv, M):
    """(b, g, m) of group ``gi``."""
    m = gi % M
    bg = gi // M
    return bg // H_kv, bg % H_kv, m


@triton.jit
def _load_raw(k_ptr, kbase, offs_j, jmask, k_ss, d0, width, BLOCK_D: tl.constexpr):
    """Keys ``offs_j`` (positions relative to ``kbase``), coordinates ``d0 .. d0+BLOCK_D``
    of the subvector, in the keys' dtype ``[len(offs_j), BLOCK_D]``; 0 outside ``jmask`` /
    ``width``. The kernels pass ``width = k_sm`` (a multiple of 16, so the loads are
    vectors): ``d_s`` itself, or the zero-padded width of packed keys."""
    offs_d = d0 + tl.arange(0, BLOCK_D)
    return tl.load(k_ptr + kbase + offs_j[:, None] * k_ss + offs_d[None, :],
                   mask=jmask[:, None] & (offs_d < width)[None, :], other=0.0)


@triton.jit
def _load_sub(k_ptr, kbase, offs_j, jmask, k_ss, d0, width, BLOCK_D: tl.constexpr):
    """:func:`_load_raw` as f32."""
    return _load_raw(k_ptr, kbase, offs_j, jmask, k_ss, d0, width, BLOCK_D).to(tl.float32)


@triton.jit
def _sq_norms(k_ptr, kbase, offs_j, jmask, k_ss, width, BLOCK_D: tl.constexpr):
    """``||x_j||^2`` (f32, rounded products) of keys ``offs_j`` (coordinates past ``d_s``
    up to ``width`` are zero)."""
    acc = tl.zeros([offs_j.shape[0], BLOCK_D], tl.float32)
    for d0 in range(0, width, BLOCK_D):
        x = _load_sub(k_ptr, kbase, offs_j, jmask, k_ss, d0, width, BLOCK_D)
        acc += _mul_rn(x, x)
    return tl.sum(acc, axis=1)


@triton.jit
def _aug(k_ptr, kbase, offs_j, jmask, k_ss, width, phi, metric_ip, BLOCK_D: tl.constexpr):
    """The ip augmentation ``sqrt(max(0, phi - ||x_j||^2))`` (0 for euclidean)."""
    a = tl.zeros([offs_j.shape[0]], tl.float32)
    if metric_ip != 0:
        a = tl.sqrt_rn(tl.maximum(phi - _sq_norms(k_ptr, kbase, offs_j, jmask, k_ss, width, BLOCK_D), 0.0))
    return a


@triton.jit
def pq_km_pack_kernel(src_ptr, dst_ptr, k_sb, k_sh, k_ss, H_kv, M, d_s, d_pad, n, pos0, BLOCK_N: tl.constexpr,
                      BLOCK_D: tl.constexpr):
    """``dst[b, g, j, m, :d_pad] = src[b, g, pos0 + j, m*d_s : (m+1)*d_s]``, zero-padded:
    keys whose view the other kernels cannot take as it is (an address, a stride or
    ``d_s`` not a multiple of 16 elements) in an aligned layout. Grid
    ``(cdiv(n, BLOCK_N), B*H_kv)``."""
    t = tl.program_id(0)
    bg = tl.program_id(1)
    b = bg // H_kv
    g = bg % H_kv
    offs_j = t * BLOCK_N + tl.arange(0, BLOCK_N)
    jmask = offs_j < n
    src = src_ptr + b.to(tl.int64) * k_sb + g.to(tl.int64) * k_sh + (pos0 + offs_j).to(tl.int64)[:, None] * k_ss
    dst = dst_ptr + (bg.to(tl.int64) * n + offs_j.to(tl.int64))[:, None] * (M * d_pad)
    for m in range(M):
        for d0 in range(0, d_pad, BLOCK_D):
            offs_d = d0 + tl.arange(0, BLOCK_D)
            v = tl.load(src + m * d_s + offs_d[None, :], mask=jmask[:, None] & (offs_d < d_s)[None, :], other=0.0)
            tl.store(dst + m * d_pad + offs_d[None, :], v, mask=jmask[:, None] & (offs_d < d_pad)[None, :])


@triton.jit
def pq_km_prep_kernel(k_ptr, phi_ptr, bad_ptr, rng_ptr, k_sb, k_sh, k_ss, k_sm, H_kv, M, d_s, n, pos0, per,
                      metric_ip, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """Non-finite count, every coordinate's range (``rng``, for ``_center``) and (ip)
    ``phi[gi] = max_j ||x_j||^2``. Grid ``(P, G)``."""
    p = tl.program_id(0)
    gi = tl.program_id(1)
    b, g, m = _group(gi, H_kv, M)
    kbase = b.to(tl.int64) * k_sb + g.to(tl.int64) * k_sh + pos0.to(tl.int64) * k_ss + m * k_sm
    j0 = p * per
    j1 = tl.minimum(n, j0 + per)
    # one pass over the keys for the ranges and the non-finite count; ip: one more for
    # the norms (per key across every coordinate block, so not in the same loop)
    total_bad = _ranges(k_ptr, kbase, rng_ptr, gi, k_ss, k_sm, d_s, j0, j1, BLOCK_N, BLOCK_D)
    if total_bad > 0:
        tl.atomic_add(bad_ptr, total_bad, sem="relaxed")
    if metric_ip != 0:
        mx = tl.zeros([BLOCK_N], tl.float32)
        for t in range(j0, j1, BLOCK_N):
            offs_j = t + tl.arange(0, BLOCK_N)
            jmask = offs_j < j1
            acc = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
            for d0 in range(0, d_s, BLOCK_D):
                x = _load_sub(k_ptr, kbase, offs_j.to(tl.int64), jmask, k_ss, d0, k_sm, BLOCK_D)
                acc += _mul_rn(x, x)
            mx = tl.maximum(mx, tl.where(jmask, tl.sum(acc, axis=1), 0.0))
        tl.atomic_max(phi_ptr + gi, tl.max(mx, axis=0), sem="relaxed")


@triton.jit
def _ranges(k_ptr, kbase, rng_ptr, gi, k_ss, k_sm, d_s, j0, j1, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """Every coordinate's range over keys ``j0 .. j1`` into ``rng`` (``_ord`` keys of the
    maxima of ``x`` and ``-x``): elementwise maxima over the tiles, then one reduction and
    one atomic per coordinate (a maximum is the same in any order). Returns how many of
    the values are non-finite (i32)."""
    rbase = rng_ptr + gi.to(tl.int64) * 2 * d_s
    nbad = tl.zeros([BLOCK_N, BLOCK_D], tl.int32)
    for d0 in range(0, d_s, BLOCK_D):
        offs_d = d0 + tl.arange(0, BLOCK_D)
        hi = tl.full([BLOCK_N, BLOCK_D], -float("inf"), tl.float32)
        nlo = tl.full([BLOCK_N, BLOCK_D], -float("inf"), tl.float32)
        for t in range(j0, j1, BLOCK_N):
            offs_j = t + tl.arange(0, BLOCK_N)
            jmask = offs_j < j1
            x = _load_sub(k_ptr, kbase, offs_j.to(tl.int64), jmask, k_ss, d0, k_sm, BLOCK_D)
            nbad += (tl.abs(x) == float("inf")).to(tl.int32) + (x != x).to(tl.int32)
            hi = tl.maximum(hi, tl.where(jmask[:, None], x, -float("inf")))
            nlo = tl.maximum(nlo, tl.where(jmask[:, None], -x, -float("inf")))
        dmask = offs_d < d_s
        tl.atomic_max(rbase + offs_d, _ord(tl.max(hi, axis=0)), mask=dmask, sem="relaxed")
        tl.atomic_max(rbase + d_s + offs_d, _ord(tl.max(nlo, axis=0)), mask=dmask, sem="relaxed")
    return tl.sum(tl.sum(nbad, axis=1), axis=0)


@triton.jit
def pq_km_init_kernel(k_ptr, cent_ptr, phi_ptr, idx_ptr, k_sb, k_sh, k_ss, k_sm, H_kv, M, K, d_s, n, pos0, use_idx,
                      metric_ip, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr):
    """``c_k = x_{idx_k}`` (strided ``floor(k*n/K)`` or ``idx[gi, k]``), ip: with its
    augmentation. Grid ``(cdiv(K, BLOCK_K), G)``."""
    kt = tl.program_id(0)
    gi = tl.program_id(1)
    b, g, m = _group(gi, H_kv, M)
    kbase = b.to(tl.int64) * k_sb + g.to(tl.int64) * k_sh + pos0.to(tl.int64) * k_ss + m * k_sm
    d_c = d_s + metric_ip
    offs_k = kt * BLOCK_K + tl.arange(0, BLOCK_K)
    kmask = offs_k < K
    if use_idx != 0:
        j = tl.load(idx_ptr + gi.to(tl.int64) * K + offs_k, mask=kmask, other=0).to(tl.int64)
    else:
        j = offs_k.to(tl.int64) * n // K
    cbase = cent_ptr + gi.to(tl.int64) * K * d_c + offs_k[:, None].to(tl.int64) * d_c
    for d0 in range(0, d_s, BLOCK_D):
        x = _load_sub(k_ptr, kbase, j, kmask, k_ss, d0, k_sm, BLOCK_D)
        offs_d = d0 + tl.arange(0, BLOCK_D)
        tl.store(cbase + offs_d[None, :], x, mask=kmask[:, None] & (offs_d < d_s)[None, :])
    if metric_ip != 0:
        phi = tl.load(phi_ptr + gi)
        a = _aug(k_ptr, kbase, j, kmask, k_ss, k_sm, phi, metric_ip, BLOCK_D)
        tl.store(cent_ptr + gi.to(tl.int64) * K * d_c + offs_k.to(tl.int64) * d_c + d_s, a, mask=kmask)


@triton.jit
def _ord(x):
    """An f32's u32 key ordered as the floats (``-inf`` above 0, so a zeroed word is
    below every key): the sign bit set for non-negative values, every bit flipped for
    negative ones."""
    b = x.to(tl.uint32, bitcast=True)
    return tl.where((b >> 31) == 0, b | 0x80000000, b ^ 0xFFFFFFFF)


@triton.jit
def _unord(k):
    """The f32 of an ``_ord`` key (NaN for the zeroed word: no value seen)."""
    b = tl.where((k >> 31) != 0, k & 0x7FFFFFFF, k ^ 0xFFFFFFFF)
    return b.to(tl.float32, bitcast=True)


@triton.jit
def _center(rng_ptr, gi, d_s, offs_d, KEY_DTYPE: tl.constexpr):
    """The centering point ``mu`` (f32 ``[len(offs_d)]``, each a value of the key dtype)
    of coordinates ``offs_d`` of group ``gi``: the coordinate's midpoint rounded to the
    key dtype where ``x - mu`` is exact for every key (Sterbenz: ``mu / 2 <= x <= 2 mu``,
    or the negated condition), else 0 (also past ``d_s``)."""
    base = rng_ptr + gi.to(tl.int64) * 2 * d_s
    dmask = offs_d < d_s
    hi = _unord(tl.load(base + offs_d, mask=dmask, other=0))
    lo = -_unord(tl.load(base + d_s + offs_d, mask=dmask, other=0))
    mid = (0.5 * lo + 0.5 * hi).to(KEY_DTYPE).to(tl.float32)
    pos = (lo > 0.0) & (0.5 * mid <= lo) & (hi <= 2.0 * mid)
    neg = (hi < 0.0) & (0.5 * mid >= hi) & (lo >= 2.0 * mid)
    return tl.where(dmask & (pos | neg), mid, 0.0)


@triton.jit
def _dot_keys_cent(x, c, acc):
    """``acc + x @ c^T`` (f32 ``[rows, clusters]``) for keys ``x`` in their own dtype and
    f32 centroids ``c``, on the tensor cores at about f32 accuracy. 16-bit keys are exact
    in their type, so ``c`` is split into three terms of that type (``c1 + c2 + c3``
    carries 24 mantissa bits) and the three products are exact, accumulated in f32; f32
    keys take ``tf32x3``."""
    if x.dtype == tl.float32:
        return tl.dot(x, tl.trans(c), acc, input_precision="tf32x3")
    else:
        c1 = c.to(x.dtype)
        r1 = c - c1.to(tl.float32)
        c2 = r1.to(x.dtype)
        c3 = (r1 - c2.to(tl.float32)).to(x.dtype)
        acc = tl.dot(x, tl.trans(c1), acc)
        acc = tl.dot(x, tl.trans(c2), acc)
        return tl.dot(x, tl.trans(c3), acc)


@triton.jit
def _dot_members(hit, x, acc):
    """``acc + onehot^T @ x`` (f32 ``[clusters, BLOCK_D]``): the member sums of a tile of
    keys ``x`` (their own dtype) whose cluster indicator is ``hit`` (``[rows, clusters]``).
    The one-hot matrix is exact in every type, so 16-bit keys take one exact product in
    their type; f32 keys ``tf32x3``."""
    if x.dtype == tl.float32:
        return tl.dot(tl.trans(hit.to(tl.float32)), x, acc, input_precision="tf32x3")
    else:
        return tl.dot(tl.trans(hit.to(x.dtype)), x, acc)


@triton.jit
def _nearest(k_ptr, kbase, offs_j, jmask, k_ss, k_sm, cgrp, rng_ptr, gi, K, d_s, d_c, a, metric_ip,
             BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr, CENTER: tl.constexpr):
    """The nearest centroid (lowest k on ties; i32 ``[BLOCK_N]``) of keys ``offs_j``, whose
    ip augmentation is ``a``: every cluster tile's distances, CENTER: about ``_center``'s
    point (the tile computed in registers), else about the origin (the loaded tile goes
    straight into the dot)."""
    best_d = tl.full([BLOCK_N], float("inf"), tl.float32)
    best_k = tl.zeros([BLOCK_N], tl.int32)
    for kb in range(0, K, BLOCK_K):
        offs_k = kb + tl.arange(0, BLOCK_K)
        kmask = offs_k < K
        xc = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
        cn = tl.zeros([BLOCK_K, BLOCK_D], tl.float32)
        for d0 in range(0, d_s, BLOCK_D):
            offs_d = d0 + tl.arange(0, BLOCK_D)
            x = _load_raw(k_ptr, kbase, offs_j.to(tl.int64), jmask, k_ss, d0, k_sm, BLOCK_D)
            c = tl.load(cgrp + offs_k[:, None] * d_c + offs_d[None, :],
                        mask=kmask[:, None] & (offs_d < d_s)[None, :], other=0.0)
            if CENTER:
                mu = _center(rng_ptr, gi, d_s, offs_d, x.dtype)
                x = (x.to(tl.float32) - mu[None, :]).to(x.dtype)  # exact (_center)
                c = c - mu[None, :]
            cn += _mul_rn(c, c)
            xc = _dot_keys_cent(x, c, xc)
        cnorm = tl.sum(cn, axis=1)
        if metric_ip != 0:
            ce = tl.load(cgrp + offs_k * d_c + d_s, mask=kmask, other=0.0)
            cnorm += _mul_rn(ce, ce)
            xc += _mul_rn(a[:, None], ce[None, :])
        dist = cnorm[None, :] - 2.0 * xc
        dist = tl.where(kmask[None, :], dist, float("inf"))
        dmin = tl.min(dist, axis=1)
        kmin = tl.argmin(dist, axis=1, tie_break_left=True).to(tl.int32) + kb
        # strict <: on a tie the earlier tile (lower k) stays; NaN never takes
        take = dmin < best_d
        best_k = tl.where(take, kmin, best_k)
        best_d = tl.where(take, dmin, best_d)
    return best_k


@triton.jit
def _any_center(rng_ptr, gi, d_s, KEY_DTYPE: tl.constexpr, BLOCK_D: tl.constexpr):
    """Whether ``_center`` centers any coordinate of group ``gi`` (scalar)."""
    anyc = tl.zeros([BLOCK_D], tl.int32)
    for d0 in range(0, d_s, BLOCK_D):
        anyc = tl.maximum(anyc, (_center(rng_ptr, gi, d_s, d0 + tl.arange(0, BLOCK_D), KEY_DTYPE) != 0.0).to(tl.int32))
    return tl.max(anyc, axis=0) != 0


@triton.jit
def pq_km_assign_kernel(k_ptr, cent_ptr, phi_ptr, codes_ptr, part_ptr, cnt_ptr, chg_ptr, done_ptr, rng_ptr, k_sb,
                        k_sh, k_ss, k_sm, H_kv, M, K, d_s, n, pos0, per, cap, P, it, final, metric_ip, BLOCK_N: tl.constexpr,
                        BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr, SUM_D: tl.constexpr):
    """Codes of part ``p``'s keys against the current centroids and, unless ``final``,
    how many changed. Where one tile holds every cluster and coordinate (``K <= BLOCK_K``,
    ``d_s <= SUM_D``) it also writes the part's member counts and sums, from the codes
    and keys it holds, in place of ``pq_km_sums``. Distances go over ``BLOCK_D``
    coordinates at a time. Grid ``(P, G)``."""
    p = tl.program_id(0)
    gi = tl.program_id(1)
    G = tl.num_programs(1)
    if final == 0:
        if tl.load(done_ptr + gi) != 0:
            return
    b, g, m = _group(gi, H_kv, M)
    kbase = b.to(tl.int64) * k_sb + g.to(tl.int64) * k_sh + pos0.to(tl.int64) * k_ss + m * k_sm
    d_c = d_s + metric_ip
    cgrp = cent_ptr + gi.to(tl.int64) * K * d_c
    crow = codes_ptr + gi.to(tl.int64) * cap
    phi = tl.load(phi_ptr + gi * metric_ip)  # euclidean: phi_ptr[0], unused
    j0 = p * per
    j1 = tl.minimum(n, j0 + per)
    nchg = tl.zeros([BLOCK_N], tl.int32)
    fuse = (final == 0) & (K <= BLOCK_K) & (d_s <= SUM_D)
    offs_k1 = tl.arange(0, BLOCK_K)
    offs_d1 = tl.arange(0, SUM_D)
    acc = tl.zeros([BLOCK_K, SUM_D], tl.float32)
    cnt = tl.zeros([BLOCK_K], tl.int32)
    asum = tl.zeros([BLOCK_K], tl.float32)
    if k_ptr.dtype.element_ty == tl.float32:
        # f32 keys always take the centered loop (about as fast: TF32x3 goes through
        # registers either way), so their kernel has one loop
        center = True
    else:
        # group-uniform: every tile of the group takes the same loop
        center = _any_center(rng_ptr, gi, d_s, k_ptr.dtype.element_ty, BLOCK_D)
    for t in range(j0, j1, BLOCK_N):
        offs_j = t + tl.arange(0, BLOCK_N)
        jmask = offs_j < j1
        a = _aug(k_ptr, kbase, offs_j.to(tl.int64), jmask, k_ss, k_sm, phi, metric_ip, BLOCK_D)
        if center:
            best_k = _nearest(k_ptr, kbase, offs_j, jmask, k_ss, k_sm, cgrp, rng_ptr, gi, K, d_s, d_c, a, metric_ip,
                              BLOCK_N, BLOCK_K, BLOCK_D, True)
        else:
            best_k = _nearest(k_ptr, kbase, offs_j, jmask, k_ss, k_sm, cgrp, rng_ptr, gi, K, d_s, d_c, a, metric_ip,
                              BLOCK_N, BLOCK_K, BLOCK_D, False)
        if final == 0:
            old = tl.load(crow + offs_j, mask=jmask, other=0).to(tl.int32)
            nchg += (jmask & ((old != best_k) | (it == 0))).to(tl.int32)
        tl.store(crow + offs_j, best_k.to(tl.uint8), mask=jmask)
        if fuse:
            hit = jmask[:, None] & (best_k[:, None] == offs_k1[None, :])
            x = _load_raw(k_ptr, kbase, offs_j.to(tl.int64), jmask, k_ss, 0, k_sm, SUM_D)
            acc = _dot_members(hit, x, acc)
            cnt += tl.sum(hit.to(tl.int32), axis=0)
            if metric_ip != 0:
                asum += tl.sum(tl.where(hit, a[:, None], 0.0), axis=0)
    if final == 0:
        tl.atomic_add(chg_ptr + (it % 2) * G + gi, tl.sum(nchg, axis=0), sem="relaxed")
    if fuse:
        pbase = (gi.to(tl.int64) * P + p) * K
        kmask1 = offs_k1 < K
        tl.store(part_ptr + (pbase + offs_k1[:, None]) * d_c + offs_d1[None, :], acc,
                 mask=kmask1[:, None] & (offs_d1 < d_s)[None, :])
        tl.store(cnt_ptr + pbase + offs_k1, cnt, mask=kmask1)
        if metric_ip != 0:
            tl.store(part_ptr + (pbase + offs_k1) * d_c + d_s, asum, mask=kmask1)


@triton.jit
def pq_km_sums_kernel(k_ptr, phi_ptr, codes_ptr, part_ptr, cnt_ptr, done_ptr, k_sb, k_sh, k_ss, k_sm, H_kv, M, K, d_s,
                      n, pos0, per, cap, P, metric_ip, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      BLOCK_D: tl.constexpr):
    """Part ``p``'s member counts and sums of clusters ``kt*BLOCK_K ..`` from this
    iteration's codes. Grid ``(P, cdiv(K, BLOCK_K), G)``."""
    p = tl.program_id(0)
    kt = tl.program_id(1)
    gi = tl.program_id(2)
    if tl.load(done_ptr + gi) != 0:
        return
    b, g, m = _group(gi, H_kv, M)
    kbase = b.to(tl.int64) * k_sb + g.to(tl.int64) * k_sh + pos0.to(tl.int64) * k_ss + m * k_sm
    d_c = d_s + metric_ip
    crow = codes_ptr + gi.to(tl.int64) * cap
    phi = tl.load(phi_ptr + gi * metric_ip)  # euclidean: phi_ptr[0], unused
    j0 = p * per
    j1 = tl.minimum(n, j0 + per)
    pbase = (gi.to(tl.int64) * P + p) * K
    offs_k = kt * BLOCK_K + tl.arange(0, BLOCK_K)
    kmask = offs_k < K
    cnt = tl.zeros([BLOCK_K], tl.int32)
    asum = tl.zeros([BLOCK_K], tl.float32)
    for t in range(j0, j1, BLOCK_N):
        offs_j = t + tl.arange(0, BLOCK_N)
        jmask = offs_j < j1
        code = tl.load(crow + offs_j, mask=jmask, other=0).to(tl.int32)
        hit = jmask[:, None] & (code[:, None] == offs_k[None, :])
        cnt += tl.sum(hit.to(tl.int32), axis=0)
        if metric_ip != 0:
            a = _aug(k_ptr, kbase, offs_j.to(tl.int64), jmask, k_ss, k_sm, phi, metric_ip, BLOCK_D)
            asum += tl.sum(tl.where(hit, a[:, None], 0.0), axis=0)
    tl.store(cnt_ptr + pbase + offs_k, cnt, mask=kmask)
    if metric_ip != 0:
        tl.store(part_ptr + (pbase + offs_k) * d_c + d_s, asum, mask=kmask)
    for d0 in range(0, d_s, BLOCK_D):
        offs_d = d0 + tl.arange(0, BLOCK_D)
        acc = tl.zeros([BLOCK_K, BLOCK_D], tl.float32)
        for t in range(j0, j1, BLOCK_N):
            offs_j = t + tl.arange(0, BLOCK_N)
            jmask = offs_j < j1
            code = tl.load(crow + offs_j, mask=jmask, other=0).to(tl.int32)
            hit = jmask[:, None] & (code[:, None] == offs_k[None, :])
            x = _load_raw(k_ptr, kbase, offs_j.to(tl.int64), jmask, k_ss, d0, k_sm, BLOCK_D)
            acc = _dot_members(hit, x, acc)
        tl.store(part_ptr + (pbase + offs_k[:, None]) * d_c + offs_d[None, :], acc,
                 mask=kmask[:, None] & (offs_d < d_s)[None, :])


@triton.jit
def _div_rn(a, b):
    """``a / b`` correctly rounded (``div.rn.f32``; Triton's ``/`` is the approximate
    ``div.full.f32``, off by an ulp even where the quotient is exact)."""
    if INTERPRETED:
        return a / b
    else:
        return libdevice.div_rn(a, b)


@triton.jit
def pq_km_update_kernel(cent_ptr, part_ptr, cnt_ptr, chg_ptr, done_ptr, iters_ptr, K, d_s, P, it, metric_ip,
                        BLOCK_E: tl.constexpr):
    """Centroids <- member means (empty clusters keep theirs), or converged. CTA ``e``
    owns the flat centroid values ``e*BLOCK_E ..`` of the group's ``K * d_c`` (contiguous
    in the centroids and in every part's sums). Grid ``(cdiv(K * d_c, BLOCK_E), G)``."""
    e = tl.program_id(0)
    gi = tl.program_id(1)
    G = tl.num_programs(1)
    if tl.load(done_ptr + gi) != 0:
        return
    changed = tl.load(chg_ptr + (it % 2) * G + gi)
    if e == 0:
        # every CTA of this group reads chg[it % 2]; the other slot is read next time
        tl.store(chg_ptr + ((it + 1) % 2) * G + gi, 0)
        if changed == 0:
            tl.store(done_ptr + gi, 1)
        else:
            tl.store(iters_ptr + gi, it + 1)
    if changed == 0:
        return
    d_c = d_s + metric_ip
    offs = e * BLOCK_E + tl.arange(0, BLOCK_E)
    mask = offs < K * d_c
    kk = offs // d_c
    s = tl.zeros([BLOCK_E], tl.float32)
    cnt = tl.zeros([BLOCK_E], tl.int32)
    for p in range(P):
        base = gi.to(tl.int64) * P + p
        s += tl.load(part_ptr + base * K * d_c + offs, mask=mask, other=0.0)
        cnt += tl.load(cnt_ptr + base * K + kk, mask=mask, other=0)
    crow = cent_ptr + gi.to(tl.int64) * K * d_c + offs
    old = tl.load(crow, mask=mask, other=0.0)
    new = tl.where(cnt > 0, _div_rn(s, tl.maximum(cnt, 1).to(tl.float32)), old)
    tl.store(crow, new, mask=mask)


# ----------------------------------------------------------------------------------
# declarations for the build

DTYPES = ("fp32", "bf16", "fp16")
BLOCKS = {"BLOCK_N": 128, "BLOCK_K": 64, "BLOCK_D": 32}


def _key_args(kt):
    return (ptr("k_ptr", kt), )


def _strides():
    return (i64("k_sb", div16=True), i64("k_sh", div16=True), i64("k_ss", div16=True), i32("k_sm", div16=True))


KERNELS = []
for _kt in DTYPES:
    KERNELS.append(
        Kernel(name=f"pq_km_pack.k_{_kt}", fn=pq_km_pack_kernel,
               args=(ptr("src_ptr", _kt, False), ptr("dst_ptr", _kt), i64("k_sb"), i64("k_sh"), i64("k_ss"),
                     i32("H_kv"), i32("M"), i32("d_s"), i32("d_pad", div16=True), i32("n"), i32("pos0")),
               fixed={"BLOCK_N": 64, "BLOCK_D": 32},
               variants={80: single({}, 4, 1), 90: single({}, 4, 1)}))
    KERNELS.append(
        Kernel(name=f"pq_km_prep.k_{_kt}", fn=pq_km_prep_kernel,
               args=_key_args(_kt) + (ptr("phi_ptr", "fp32"), ptr("bad_ptr", "i32"), ptr("rng_ptr", "u32")) +
               _strides() +
               (i32("H_kv"), i32("M"), i32("d_s"), i32("n"), i32("pos0"), i32("per"), i32("metric_ip")),
               fixed={"BLOCK_N": 64, "BLOCK_D": 32},
               variants={80: single({}, 4, 1), 90: single({}, 4, 1)}))
    KERNELS.append(
        Kernel(name=f"pq_km_init.k_{_kt}", fn=pq_km_init_kernel,
               args=_key_args(_kt) + (ptr("cent_ptr", "fp32"), ptr("phi_ptr", "fp32"), ptr("idx_ptr", "i32", False)) +
               _strides() + (i32("H_kv"), i32("M"), i32("K"), i32("d_s"), i32("n"), i32("pos0"), i32("use_idx"),
                             i32("metric_ip")),
               fixed={"BLOCK_K": 64, "BLOCK_D": 32},
               variants={80: single({}, 4, 1), 90: single({}, 4, 1)}))
    KERNELS.append(
        Kernel(name=f"pq_km_assign.k_{_kt}", fn=pq_km_assign_kernel,
               args=_key_args(_kt) + (ptr("cent_ptr", "fp32"), ptr("phi_ptr", "fp32"), ptr("codes_ptr", "u8"),
                                      ptr("part_ptr", "fp32"), ptr("cnt_ptr", "i32"), ptr("chg_ptr", "i32"),
                                      ptr("done_ptr", "i32"), ptr("rng_ptr", "u32")) + _strides() +
               (i32("H_kv"), i32("M"), i32("K"), i32("d_s"), i32("n"), i32("pos0"), i32("per"),
                i32("cap", div16=True), i32("P"), i32("it"), i32("final"), i32("metric_ip")),
               # one tile of 64 clusters x 64 coordinates: the member sums fuse into the
               # assignment for K <= 64, d_s <= 64 (M = 2, bits <= 6 at D = 128)
               fixed=dict(BLOCKS, SUM_D=64),
               variants={80: single({}, 4, 1), 90: single({}, 4, 1)}))
    KERNELS.append(
        Kernel(name=f"pq_km_sums.k_{_kt}", fn=pq_km_sums_kernel,
               args=_key_args(_kt) + (ptr("phi_ptr", "fp32"), ptr("codes_ptr", "u8"), ptr("part_ptr", "fp32"),
                                      ptr("cnt_ptr", "i32"), ptr("done_ptr", "i32")) + _strides() +
               (i32("H_kv"), i32("M"), i32("K"), i32("d_s"), i32("n"), i32("pos0"), i32("per"),
                i32("cap", div16=True), i32("P"), i32("metric_ip")),
               fixed=dict(BLOCKS, BLOCK_D=64),
               # capped at 128 registers (4 CTAs per SM): the fastest of uncapped, 168 and 128
               # in the H100 sweep at K = 256 (NOTES.md, "the prefill on the GPU")
               maxnreg=128,
               variants={80: single({}, 4, 1), 90: single({}, 4, 1)}))
KERNELS.append(
    Kernel(name="pq_km_update", fn=pq_km_update_kernel,
           args=(ptr("cent_ptr", "fp32"), ptr("part_ptr", "fp32"), ptr("cnt_ptr", "i32"), ptr("chg_ptr", "i32"),
                 ptr("done_ptr", "i32"), ptr("iters_ptr", "i32"), i32("K"), i32("d_s"), i32("P"), i32("it"),
                 i32("metric_ip")),
           fixed={"BLOCK_E": 512},
           variants={80: single({}, 4, 1), 90: single({}, 4, 1)}))
