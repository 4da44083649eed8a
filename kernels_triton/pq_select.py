"""The PQCache decode step's fast path, in the runtime's own state layout.

Kernels (launch contract: README.md in this directory):

* ``pq_select_kernel``: one launch does the whole step after the short-path test.
  Grid ``(cdiv(n, CHUNK), B*H)``; program (c, r) owns keys ``c*CHUNK .. c*CHUNK+CHUNK``
  of row ``r = b*H + h``. It
    1. builds its head's lookup table ``lut[m, c] = <q_m, centroids[b,g,m,c,:d_s]>``
       (M*K dot products, recomputed per program: cheaper than another launch);
    2. quantizes the new keys ``n_old <= j < n`` that fall in its chunk (argmin over the
       centroids, metric euclidean or ip), uses those codes and, for the first head of each
       KV group, appends them to the u8 code state;
    3. scores its chunk from the u8 codes (``score = sum_m lut[m, code_m]``), masks the
       window (``j >= w0``), packs each key as the int64
       ``(order_preserving(score) << 32) | (0xFFFFFFFF - j)`` (ties -> lowest j; a NaN
       score ranks below -inf; masked keys rank below every candidate, lowest j first,
       which is the spec's fill rule; padding ``j >= n`` is INT64_MIN) and keeps the chunk's top K_PAD
       keys (bitonic top-k in registers) in a scratch buffer;
    4. zero-fills its slice of ``weight_list``;
    5. bumps the row's counter; the last program of the row to finish merges the row's
       candidates into the final top-k, adds sink and window, writes ``sparse_list``
       (ascending), ``sparse_len`` and the ones of ``weight_list``, and resets the counter.
* ``pq_short_kernel``: the short-sequence answer (``S <= heavy + init_offset + 1 + K``).
* ``pq_codes_import_kernel`` / ``pq_codes_export_kernel``: upstream int64
  ``[B, N, H_kv, M]`` codes <-> the u8 ``[B, H_kv, M, cap]`` state, on the device.
"""

import os

import triton
import triton.language as tl
from triton.language.extra import libdevice

from kspec import Kernel, Variant, grid, i32, i64, ptr, single

#: under Triton's CPU interpreter (``TRITON_INTERPRET=1``, interp_check.py), which has no
#: libdevice: there numpy rounds every product anyway
INTERPRETED = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") == "1")

# Order-preserving int32 image of -inf (0xFF800000 ^ 0x7FFFFFFF); below it the image of a
# NaN score (ranks below -inf, spec "Non-finite inputs"), then the masked keys (j >= w0:
# every candidate ranks above them, NaN included); the padding key.
NEG_INF_KEY = tl.constexpr(-2139095041)
NAN_KEY = tl.constexpr(-2139095042)
MASKED_KEY = tl.constexpr(-2139095043)
MIN_KEY = tl.constexpr(-(2**63))

# The select kernels' rank of a score (``_rank_score``): finite scores up to RANK_LIN in
# magnitude as they are; beyond it the order-preserving bits of |score| above those of
# RANK_LIN (0x46800000), scaled by 2^-16, so every finite score lies within +-30976;
# +-inf at +-RANK_INF, NaN at RANK_NAN, below -inf.
RANK_LIN = tl.constexpr(16384.0)
RANK_INF = tl.constexpr(30984.0)
RANK_NAN = tl.constexpr(-32768.0)

# ----------------------------------------------------------------------------------
# bitonic networks on a "hypercube" view: a tensor of 2^n elements reshaped to [2]*n.
# Flat index bit i lives on axis n-1-i. Every network below compares and exchanges
# elements whose flat indices differ in one bit.


@triton.constexpr_function
def _log2(x):
    """log2 of a power of two (a compile-time value)."""
    if x <= 0 or x & (x - 1):
        raise ValueError(f"{x} is not a power of two")
    return x.bit_length() - 1


@triton.jit
def _xor(a, b):
    return a ^ b


@triton.jit
def _bit(n_dims: tl.constexpr, axis: tl.constexpr):
    """0/1 along hypercube axis ``axis`` (the flat index's bit n_dims-1-axis)."""
    return tl.reshape(tl.arange(0, 2), [1] * axis + [2] + [1] * (n_dims - axis - 1))


@triton.jit
def _cas(h, desc, axis: tl.constexpr, n_dims: tl.constexpr):
    """Compare-exchange partners along ``axis``: in a pair, the lower position keeps the
    smaller key where ``desc`` is 0 and the larger where it is 1."""
    partner = h ^ tl.reduce(h, axis, _xor, keep_dims=True)
    take_max = _bit(n_dims, axis) ^ desc
    return tl.where((h > partner) == (take_max != 0), h, partner)


@triton.jit
def _merge(h, k: tl.constexpr, n_dims: tl.constexpr, desc):
    """Bitonic merge: every aligned block of 2^k that holds a bitonic sequence ends up
    sorted (descending where ``desc`` is 1)."""
    for t in tl.static_range(k):
        h = _cas(h, desc, n_dims - k + t, n_dims)
    return h


@triton.jit
def _sort_blocks(h, k: tl.constexpr, n_dims: tl.constexpr, desc_last):
    """Bitonic sort of every aligned block of 2^k; the final direction is ``desc_last``."""
    for s in tl.static_range(1, k + 1):
        if s < k:
            h = _merge(h, s, n_dims, 1 - _bit(n_dims, n_dims - 1 - s))
        else:
            h = _merge(h, s, n_dims, desc_last)
    return h


@triton.jit
def _halve_rounds(h, n_dims: tl.constexpr, k: tl.constexpr, rounds: tl.constexpr):
    """Blocks of 2^k sorted descending (even block index) / ascending (odd): each round
    pairs neighbouring blocks, keeps the elementwise max (a bitonic block holding the
    pair's top 2^k) and merges it, alternating directions again; the last round leaves
    one block sorted descending."""
    for r in tl.static_range(rounds):
        # the hypercube has n_dims - r axes at the start of round r
        h = tl.max(h, axis=n_dims - r - 1 - k)
        if r < rounds - 1:
            h = _merge(h, k, n_dims - r - 1, 1 - _bit(n_dims - r - 1, n_dims - r - 2 - k))
        else:
            h = _merge(h, k, n_dims - r - 1, 1)
    return h


@triton.jit
def _topk_desc(x, LOG_N: tl.constexpr, LOG_K: tl.constexpr):
    """The 2^LOG_K largest of the 2^LOG_N int64 keys ``x``, sorted descending."""
    h = tl.reshape(x, [2] * LOG_N)
    if LOG_K == LOG_N:
        h = _sort_blocks(h, LOG_K, LOG_N, 1)
    else:
        h = _sort_blocks(h, LOG_K, LOG_N, 1 - _bit(LOG_N, LOG_N - 1 - LOG_K))
        h = _halve_rounds(h, LOG_N, LOG_K, LOG_N - LOG_K)
    return tl.reshape(h, [2**LOG_K])


# ----------------------------------------------------------------------------------
# PQ pieces


@triton.jit
def _nearest(k_ptr, kbase, cent_ptr, cbase, phi, d_s, d_c, K, metric_ip, BLOCK_C: tl.constexpr,
             BLOCK_DS: tl.constexpr):
    """argmin_c ||x - centroid_c||^2 for one key subvector (``d_s`` values at
    ``k_ptr + kbase``; centroids ``[K, d_c]`` at ``cent_ptr + cbase``); lowest c on ties;
    a NaN distance is never taken, code 0 where every distance is NaN (``_rank_distance``).
    metric_ip != 0: x gets the extra coordinate sqrt(max(0, phi - ||x||^2)), compared
    with each centroid's coordinate d_s."""
    aug = _ip_aug(k_ptr, kbase, phi, d_s, BLOCK_DS)
    best_d = float("inf")
    best_c = 0
    for cb in range(0, K, BLOCK_C):
        dmin, cmin = _block_dist(k_ptr, kbase, cent_ptr, cbase, aug, d_s, d_c, K, metric_ip, cb, BLOCK_C, BLOCK_DS)
        # strict <: on a tie the earlier block (lower c) stays
        take = dmin < best_d
        best_c = tl.where(take, cmin, best_c)
        best_d = tl.where(take, dmin, best_d)
    return best_c


@triton.jit
def _block_nearest(k_ptr, kbase, cent_ptr, cbase, phi, d_s, d_c, K, metric_ip, cb, BLOCK_C: tl.constexpr,
                   BLOCK_DS: tl.constexpr):
    """One block of ``_nearest``'s loop on its own (``pq_range``'s table CTAs each take one):
    over centroids ``cb .. cb + BLOCK_C``, the least ranked distance and its lowest ``c``;
    ``_nearest``'s result is the first block's pair with the strictly least distance,
    starting from ``(+inf, 0)``."""
    aug = _ip_aug(k_ptr, kbase, phi, d_s, BLOCK_DS)
    return _block_dist(k_ptr, kbase, cent_ptr, cbase, aug, d_s, d_c, K, metric_ip, cb, BLOCK_C, BLOCK_DS)


@triton.jit
def _ip_aug(k_ptr, kbase, phi, d_s, BLOCK_DS: tl.constexpr):
    """The ip-to-l2 coordinate of a key subvector, ``sqrt(max(0, phi - ||x||^2))`` (unused
    for euclidean)."""
    xx = tl.zeros([BLOCK_DS], tl.float32)
    for d0 in range(0, d_s, BLOCK_DS):
        offs_d = d0 + tl.arange(0, BLOCK_DS)
        x = tl.load(k_ptr + kbase + offs_d, mask=offs_d < d_s, other=0.0).to(tl.float32)
        xx += x * x
    return tl.sqrt(tl.maximum(phi - tl.sum(xx, axis=0), 0.0))


@triton.jit
def _block_dist(k_ptr, kbase, cent_ptr, cbase, aug, d_s, d_c, K, metric_ip, cb, BLOCK_C: tl.constexpr,
                BLOCK_DS: tl.constexpr):
    """``(dmin, cmin)``: the least ranked distance (``_rank_distance``: NaN never taken) of
    the key subvector to centroids ``cb .. cb + BLOCK_C`` and its lowest ``c`` (``aug``:
    ``_ip_aug``'s coordinate, for metric ip)."""
    offs_c = cb + tl.arange(0, BLOCK_C)
    cmask = offs_c < K
    dist = tl.zeros([BLOCK_C], tl.float32)
    for d0 in range(0, d_s, BLOCK_DS):
        offs_d = d0 + tl.arange(0, BLOCK_DS)
        dmask = offs_d < d_s
        x = tl.load(k_ptr + kbase + offs_d, mask=dmask, other=0.0).to(tl.float32)
        c = tl.load(cent_ptr + cbase + offs_c[:, None] * d_c + offs_d[None, :],
                    mask=cmask[:, None] & dmask[None, :], other=0.0)
        diff = x[None, :] - c
        dist += tl.sum(_mul_rn(diff, diff), axis=1)  # rounded products: see _row_dots
    if metric_ip != 0:
        dd = aug - tl.load(cent_ptr + cbase + offs_c * d_c + d_s, mask=cmask, other=0.0)
        dist += dd * dd
    dist = tl.where(cmask, _rank_distance(dist), float("inf"))
    dmin = tl.min(dist, axis=0)
    cmin = tl.argmin(dist, axis=0, tie_break_left=True).to(tl.int32) + cb
    return dmin, cmin


@triton.jit
def _rank_distance(dist):
    """A distance as the argmin ranks it (spec "Non-finite inputs": a new key gets the
    lowest code whose distance is not NaN, code 0 if all are): NaN -> +inf (never taken:
    the running best starts at +inf with code 0, and only a strictly smaller distance
    replaces it), +inf -> the largest finite float (taken over a NaN)."""
    dist = tl.where(dist == float("inf"), 3.4028234663852886e38, dist)
    return tl.where(dist != dist, float("inf"), dist)


@triton.jit
def _rank_score(s):
    """A score (f32, any shape) as the histogram-family kernels rank it: the same order as
    the scores, NaN last (below -inf, spec "Non-finite inputs"), and every value finite
    and within +-32768, so the cuts and the threshold rounds, which work on the values
    (bins over a score range), never see an infinity or a NaN. Finite scores up to
    RANK_LIN = 16384 in magnitude are kept as they are (the usual case: nothing changes);
    beyond, ``RANK_LIN + (bits(|s|) - bits(RANK_LIN)) * 2^-16`` with the sign, whose
    float rounding merges scores within a relative 2^-16 (about 128 ulps, 1.5e-5), inside
    the spec's tolerance 1e-4 * (1 + |score|). +-inf rank at +-RANK_INF (above every
    finite score), NaN at RANK_NAN. The span of ranks stays below 2^16, so after the
    rounds' 2^30 bins one bin is narrower than the tolerance even with outliers."""
    a = tl.abs(s)
    far = RANK_LIN + (a.to(tl.int32, bitcast=True) - 0x46800000).to(tl.float32) * (1.0 / 65536.0)
    far = tl.where(a == float("inf"), RANK_INF, far)
    u = tl.where(a <= RANK_LIN, s, tl.where(s < 0.0, -far, far))
    return tl.where(s != s, RANK_NAN, u)


@triton.jit
def _row_dots(c, q):
    """``sum_d c[:, d] * q[d]`` (f32 ``[rows]``). Each product is rounded before the sum
    (``mul.rn``: never fused into the reduction's adds). Where a row's sum is held by
    several threads (a replicated layout), a fused multiply-add would round the own
    product and the partner's differently in each thread of a butterfly, so the copies
    would differ in the last bits and whichever copy reaches memory last would win (a
    write-write race under compute-sanitizer racecheck); with rounded products every copy
    is the same bits."""
    return tl.sum(_mul_rn(c, q[None, :]), axis=1)


@triton.jit
def _mul_rn(a, b):
    """``a * b`` rounded (``mul.rn.f32``), never contracted into a fused multiply-add."""
    if INTERPRETED:
        return a * b
    else:
        return libdevice.mul_rn(a, b)


@triton.jit
def _lut_tile(q_ptr, qbase, cent_ptr, cbase, offs_c, offs_d, d_s, d_c, K, on):
    """A tile of one subvector's query part (f32, ``offs_d < d_s``) and centroids (f32
    ``[len(offs_c), len(offs_d)]``, rows ``offs_c < K`` at ``cbase + c * d_c``), loaded
    only where ``on``; its table part is ``_row_dots(cen, q)``."""
    cmask = offs_c < K
    dmask = on & (offs_d < d_s)
    q = tl.load(q_ptr + qbase + offs_d, mask=dmask, other=0.0).to(tl.float32)
    cen = tl.load(cent_ptr + cbase + offs_c[:, None] * d_c + offs_d[None, :], mask=cmask[:, None] & dmask[None, :],
                  other=0.0)
    return q, cen


@triton.jit
def _store_lut(q_ptr, qbase, cent_ptr, cbase, d_s, d_c, K, out_ptr, BLOCK_C: tl.constexpr, BLOCK_DS: tl.constexpr):
    """out[c] = <q_m, centroids[c, :d_s]> for c < K."""
    for cb in range(0, K, BLOCK_C):
        offs_c = cb + tl.arange(0, BLOCK_C)
        acc = tl.zeros([BLOCK_C], tl.float32)
        for d0 in range(0, d_s, BLOCK_DS):
            q, c = _lut_tile(q_ptr, qbase, cent_ptr, cbase, offs_c, d0 + tl.arange(0, BLOCK_DS), d_s, d_c, K, True)
            acc += _row_dots(c, q)
        tl.store(out_ptr + offs_c, acc, mask=offs_c < K)


@triton.jit
def _key32(score, j, w0):
    """Order-preserving int32 image of the score; a NaN score ranks below -inf
    (NAN_KEY), and keys at or past the window start (j >= w0) below every candidate
    (MASKED_KEY)."""
    score = tl.where(score == 0.0, 0.0, score)  # -0.0 ranks as +0.0
    bits = score.to(tl.int32, bitcast=True)
    k32 = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    k32 = tl.where(score != score, NAN_KEY, k32)
    return tl.where(j < w0, k32, MASKED_KEY)


@triton.jit
def _flush(stg, fill, best, STAGE: tl.constexpr, K_PAD: tl.constexpr):
    """Merge the first ``fill`` keys of the staging buffer into ``best`` (the running
    top K_PAD, ascending) and return the new ``best``."""
    LOG_S: tl.constexpr = _log2(STAGE)
    LOG_K: tl.constexpr = _log2(K_PAD)
    tl.debug_barrier()  # every thread's staged stores are visible to the whole program
    offs = tl.arange(0, STAGE)
    x = tl.load(stg + offs, mask=offs < fill, other=MIN_KEY)
    top = _topk_desc(x, LOG_S, LOG_K)
    m = tl.reshape(tl.maximum(best, top), [2] * LOG_K)
    best = tl.reshape(_merge(m, LOG_K, LOG_K, 0), [K_PAD])
    tl.debug_barrier()  # every thread has read the buffer before it is refilled
    return best


@triton.jit
def _finalize_row(r, n_chunks, cand_ptr, sl_ptr, len_ptr, w_ptr, S, n, sink, window, heavy, init_offset,
                  K_PAD: tl.constexpr, NCB: tl.constexpr, BLK: tl.constexpr):
    """Merge row r's per-chunk candidates into the top-k, add sink and window, write
    sparse_list (ascending), sparse_len and the ones of weight_list."""
    LOG_K: tl.constexpr = _log2(K_PAD)
    LOG_R: tl.constexpr = _log2(NCB)
    r64 = r.to(tl.int64)
    offs_k = tl.arange(0, K_PAD)
    rows = tl.arange(0, NCB)
    best = tl.full([K_PAD], MIN_KEY, tl.int64)  # ascending
    cbase = cand_ptr + r64 * n_chunks * K_PAD
    for c0 in range(0, n_chunks, NCB):
        cr = c0 + rows
        blk = tl.load(cbase + cr[:, None].to(tl.int64) * K_PAD + offs_k[None, :], mask=(cr < n_chunks)[:, None],
                      other=MIN_KEY, cache_modifier=".cg")
        h = _halve_rounds(tl.reshape(blk, [2] * (LOG_R + LOG_K)), LOG_R + LOG_K, LOG_K, LOG_R)
        top = tl.reshape(h, [K_PAD])  # descending
        m = tl.reshape(tl.maximum(best, top), [2] * LOG_K)
        best = tl.reshape(_merge(m, LOG_K, LOG_K, 0), [K_PAD])

    s_sink = tl.minimum(sink, S)
    s_win = tl.minimum(window, S)
    ws = S - s_win
    k = tl.minimum(heavy, n)
    total = s_sink + k + s_win
    ok = heavy <= K_PAD
    sl_row = sl_ptr + r64 * total
    w_row = w_ptr + r64 * S

    # heavy: the k largest keys sit at the top of the ascending `best`; sort their
    # positions ascending (unused slots sort last)
    sel = (offs_k >= K_PAD - k) & ok
    hp = (0xFFFFFFFF - (best & 0xFFFFFFFF)) + init_offset
    hp = tl.where(sel, hp, 0x7FFFFFFFFFFFFFFF)
    hs = tl.reshape(_sort_blocks(tl.reshape(hp, [2] * LOG_K), LOG_K, LOG_K, 0), [K_PAD])
    hvalid = (offs_k < k) & ok
    rank = tl.minimum(hs + 1, s_sink) + offs_k + tl.minimum(tl.maximum(hs - ws, 0), s_win)
    tl.store(sl_row + rank, hs, mask=hvalid)
    tl.store(w_row + hs, tl.full([K_PAD], 1.0, tl.float32).to(w_ptr.dtype.element_ty), mask=hvalid)

    one = tl.full([BLK], 1.0, tl.float32).to(w_ptr.dtype.element_ty)
    # sink: values 0 .. s_sink-1, each preceded by the heavy and window values below it
    for s0 in range(0, s_sink, BLK):
        sv = s0 + tl.arange(0, BLK)
        smask = (sv < s_sink) & ok
        hl = tl.sum(((hs[None, :] < sv[:, None]) & hvalid[None, :]).to(tl.int32), axis=1)
        rs = sv + hl + tl.minimum(tl.maximum(sv - ws, 0), s_win)
        tl.store(sl_row + rs, sv.to(tl.int64), mask=smask)
        tl.store(w_row + sv, one, mask=smask)
    # window: values ws .. S-1, each preceded by the sink and heavy values <= it
    for t0 in range(0, s_win, BLK):
        t = t0 + tl.arange(0, BLK)
        wv = ws + t
        wmask = (t < s_win) & ok
        hl = tl.sum(((hs[None, :] <= wv[:, None]) & hvalid[None, :]).to(tl.int32), axis=1)
        rw = tl.minimum(wv + 1, s_sink) + hl + t
        tl.store(sl_row + rw, wv.to(tl.int64), mask=wmask)
        tl.store(w_row + wv, one, mask=wmask)

    tl.store(len_ptr + r64, tl.where(ok, total, -1).to(tl.int64))


@triton.jit
def pq_select_kernel(
    q_ptr, k_ptr, cent_ptr, phi_ptr, codes_ptr, lut_ptr, stage_ptr, cand_ptr, count_ptr, sl_ptr, len_ptr, w_ptr,  #
    q_sb, q_sh, k_sb, k_sh, k_ss,  #
    H, G, M, K, d_s, S, n_old, cap, sink, window, heavy, init_offset, metric_ip,  #
    CHUNK: tl.constexpr, K_PAD: tl.constexpr, NCB: tl.constexpr,
    BLOCK_C: tl.constexpr, BLOCK_DS: tl.constexpr, BLK: tl.constexpr,
):
    """See the module docstring and README.md (launch contract)."""
    P: tl.constexpr = 2 * K_PAD  # groups; the K_PAD-th largest group maximum is the threshold
    GSZ: tl.constexpr = CHUNK // P  # keys per group (held by one thread)
    STAGE: tl.constexpr = 2 * K_PAD  # staging buffer, in keys
    LOG_P: tl.constexpr = _log2(P)
    LOG_K: tl.constexpr = _log2(K_PAD)
    tl.static_assert(CHUNK % P == 0)
    c = tl.program_id(0)
    r = tl.program_id(1)
    b = r // H
    h = r % H
    g = h // G
    H_kv = H // G
    n = S - init_offset
    n_chunks = tl.cdiv(n, CHUNK)
    cta = r.to(tl.int64) * n_chunks + c
    d_c = d_s + metric_ip
    w0 = tl.maximum(S - tl.minimum(window, S) - init_offset, 0)
    c0 = c * CHUNK
    bg = b.to(tl.int64) * H_kv + g
    qrow = b.to(tl.int64) * q_sb + h.to(tl.int64) * q_sh
    krow = b.to(tl.int64) * k_sb + g.to(tl.int64) * k_sh
    writer = (h % G) == 0

    # this head's lookup table lut[m, c] into this program's scratch
    lutb = lut_ptr + cta * M * K
    for m in range(M):
        _store_lut(q_ptr, qrow + m * d_s, cent_ptr, ((bg * M + m) * K) * d_c, d_s, d_c, K, lutb + m * K, BLOCK_C,
                   BLOCK_DS)
    tl.debug_barrier()

    # the chunk as a [P, GSZ] tile: one group of GSZ consecutive keys per row
    jj = tl.arange(0, P)[:, None] * GSZ + tl.arange(0, GSZ)[None, :]
    j = c0 + jj
    w_row = w_ptr + r.to(tl.int64) * S
    tl.store(w_row + j, tl.zeros([P, GSZ], tl.float32).to(w_ptr.dtype.element_ty), mask=j < S)
    score = tl.zeros([P, GSZ], tl.float32)
    t_lo = tl.maximum(n_old, c0)
    t_hi = tl.minimum(n, c0 + CHUNK)
    for m in range(M):
        code_row = codes_ptr + (bg * M + m) * cap
        # codes at n_old <= j < cap are stale or uninitialized: clamp them into 0..K-1
        # (they are replaced below or belong to keys past n, which are never chosen)
        code = tl.load(code_row + j, mask=j < cap, other=0).to(tl.int32) & (K - 1)
        for t in range(t_lo, t_hi):  # new keys in this chunk: quantize them here
            cbase = ((bg * M + m) * K) * d_c
            phi = tl.load(phi_ptr + (bg * M + m) * metric_ip)  # euclidean: phi_ptr[0], unused
            ct = _nearest(k_ptr, krow + (init_offset + t) * k_ss + m * d_s, cent_ptr, cbase, phi, d_s, d_c, K,
                          metric_ip, BLOCK_C, BLOCK_DS)
            code = tl.where(j == t, ct, code)
            tl.store(code_row + t, ct.to(tl.uint8), mask=writer)
        score += tl.load(lutb + m * K + code)
    # masked keys rank by lowest j, so only the first K_PAD of them can ever be chosen
    valid = (j < n) & (j < w0 + K_PAD)
    k32 = tl.where(valid, _key32(score, j, w0), -2147483648)
    # any K_PAD distinct groups have K_PAD keys >= the K_PAD-th largest group maximum,
    # so the chunk's top K_PAD are all >= it
    gmax = tl.max(k32, axis=1)
    thr = tl.min(_topk_desc(gmax, LOG_P, LOG_K), axis=0)
    sel = valid & (k32 >= thr)
    key = (k32.to(tl.int64) << 32) | (0xFFFFFFFF - j.to(tl.int64))
    # compact the selected keys: group offsets (a scan over P) + ranks inside the group
    sel32 = sel.to(tl.int32)
    gcnt = tl.sum(sel32, axis=1)
    slot = (tl.cumsum(gcnt, axis=0) - gcnt)[:, None] + tl.cumsum(sel32, axis=1) - 1
    cnt = tl.sum(gcnt, axis=0)
    stg = stage_ptr + cta * STAGE
    best = tl.full([K_PAD], MIN_KEY, tl.int64)  # the chunk's top K_PAD, ascending
    for base in range(0, cnt, STAGE):
        rk = slot - base
        tl.store(stg + rk, key, mask=sel & (rk >= 0) & (rk < STAGE))
        best = _flush(stg, tl.minimum(cnt - base, STAGE), best, STAGE, K_PAD)

    # even chunks store their top K_PAD descending, odd ones ascending
    offs_k = tl.arange(0, K_PAD)
    pos = tl.where(c % 2 == 0, K_PAD - 1 - offs_k, offs_k)
    tl.store(cand_ptr + cta * K_PAD + pos, best)
    if c == n_chunks - 1:  # the weight_list tail past the last chunk
        zero = tl.zeros([BLK], tl.float32).to(w_ptr.dtype.element_ty)
        for p0 in range(c0 + CHUNK, S, BLK):
            p = p0 + tl.arange(0, BLK)
            tl.store(w_row + p, zero, mask=p < S)

    # the row's last CTA to arrive merges the row (no CTA waits for another)
    tl.debug_barrier()
    done = tl.atomic_add(count_ptr + r, 1, sem="acq_rel", scope="gpu")
    if done == n_chunks - 1:
        _finalize_row(r, n_chunks, cand_ptr, sl_ptr, len_ptr, w_ptr, S, n, sink, window, heavy, init_offset,
                      K_PAD, NCB, BLK)
        tl.store(count_ptr + r, 0)


@triton.jit
def pq_short_kernel(sl_ptr, len_ptr, w_ptr, S, BLOCK: tl.constexpr):
    """Short sequences: sparse_list[r] = 0..S, sparse_len[r] = S, weight_list[r] = 1.
    Grid: (cdiv(S, BLOCK), B*H)."""
    c = tl.program_id(0)
    r = tl.program_id(1).to(tl.int64)
    p = c.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = p < S
    tl.store(sl_ptr + r * S + p, p, mask=mask)
    tl.store(w_ptr + r * S + p, tl.full([BLOCK], 1.0, tl.float32).to(w_ptr.dtype.element_ty), mask=mask)
    tl.store(len_ptr + r, S.to(tl.int64), mask=c == 0)


@triton.jit
def pq_codes_import_kernel(src_ptr, dst_ptr, bad_ptr, N, H_kv, M, K, cap, BLOCK: tl.constexpr):
    """dst u8 [B, H_kv, M, cap][b, g, m, j] = src i64 [B, N, H_kv, M][b, j, g, m] for j < N;
    a code outside ``0..K`` is counted in ``bad_ptr`` (i32, added to: the host zeroes it
    and refuses the import when it is not 0 after) and stored as ``code & (K - 1)``, so
    no later kernel indexes past its tables whatever the input.
    Grid: (cdiv(N, BLOCK), B*H_kv*M)."""
    j = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    row = tl.program_id(1).to(tl.int64)
    m = row % M
    bg = row // M
    b = bg // H_kv
    g = bg % H_kv
    mask = j < N
    v = tl.load(src_ptr + ((b * N + j) * H_kv + g) * M + m, mask=mask, other=0)
    nbad = tl.sum((mask & ((v < 0) | (v >= K))).to(tl.int32), axis=0)
    if nbad > 0:
        tl.atomic_add(bad_ptr, nbad, sem="relaxed")
    tl.store(dst_ptr + row * cap + j, (v & (K - 1)).to(tl.uint8), mask=mask)


@triton.jit
def pq_codes_export_kernel(src_ptr, dst_ptr, N, H_kv, M, cap, BLOCK: tl.constexpr):
    """dst i64 [B, N, H_kv, M][b, j, g, m] = src u8 [B, H_kv, M, cap][b, g, m, j] for j < N.
    Grid: (cdiv(N, BLOCK), B*H_kv*M)."""
    j = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    row = tl.program_id(1).to(tl.int64)
    m = row % M
    bg = row // M
    b = bg // H_kv
    g = bg % H_kv
    mask = j < N
    v = tl.load(src_ptr + row * cap + j, mask=mask, other=0)
    tl.store(dst_ptr + ((b * N + j) * H_kv + g) * M + m, v.to(tl.int64), mask=mask)


# ----------------------------------------------------------------------------------
# declarations for the build

DTYPES = ("fp32", "bf16", "fp16")
K_PADS = (128, 256, 512)
FIXED = {"BLOCK_C": 64, "BLOCK_DS": 32, "BLK": 32}


def _select_args(qt, wt):
    return (
        ptr("q_ptr", qt, False), ptr("k_ptr", qt, False), ptr("cent_ptr", "fp32"), ptr("phi_ptr", "fp32", False),
        ptr("codes_ptr", "u8"), ptr("lut_ptr", "fp32"), ptr("stage_ptr", "i64"), ptr("cand_ptr", "i64"),
        ptr("count_ptr", "i32"), ptr("sl_ptr", "i64"),
        ptr("len_ptr", "i64"), ptr("w_ptr", wt, False),
        i64("q_sb"), i64("q_sh"), i64("k_sb"), i64("k_sh"), i64("k_ss"),
        i32("H"), i32("G"), i32("M"), i32("K"), i32("d_s"), i32("S"), i32("n_old"), i32("cap", div16=True),
        i32("sink"), i32("window"), i32("heavy"), i32("init_offset"), i32("metric_ip"),
    )


# Tuning grid (CHUNK x num_warps) only where the autotuner is expected to run: heavy <= 128
# with fp32 or bf16 inputs and weights of the same dtype. Other specializations carry the
# default only, which keeps ptx_cache/ (~0.5 MB per select variant) and the AOT build small.
TUNED = {("fp32", "fp32", 128), ("bf16", "bf16", 128)}


def _select_variants(k_pad, qt, wt):
    default = {"CHUNK": 8192, "NCB": 8}
    v90 = []
    for chunk in (2048, 4096, 8192, 16384):
        if chunk < 4 * k_pad or chunk > 64 * k_pad:
            continue
        for nw in (4, 8):
            ce = {"CHUNK": chunk, "NCB": 8}
            is_default = ce == default and nw == 8
            if is_default or (qt, wt, k_pad) in TUNED:
                v90.append(Variant.make(ce, nw, 1, is_default))
    return {80: single(default, 8, 1), 90: tuple(v90)}


KERNELS = []
for _qt in DTYPES:
    for _wt in DTYPES:
        for _kp in K_PADS:
            KERNELS.append(
                Kernel(name=f"pq_select.h{_kp}.q_{_qt}.w_{_wt}", fn=pq_select_kernel, args=_select_args(_qt, _wt),
                       fixed=dict(FIXED, K_PAD=_kp), variants=_select_variants(_kp, _qt, _wt)))
for _wt in DTYPES:
    KERNELS.append(
        Kernel(name=f"pq_short.w_{_wt}", fn=pq_short_kernel,
               args=(ptr("sl_ptr", "i64"), ptr("len_ptr", "i64"), ptr("w_ptr", _wt, False), i32("S")),
               variants={80: single({"BLOCK": 1024}, 4, 1), 90: single({"BLOCK": 1024}, 4, 1)}))
KERNELS.append(
    Kernel(name="pq_codes_import", fn=pq_codes_import_kernel,
           args=(ptr("src_ptr", "i64"), ptr("dst_ptr", "u8"), ptr("bad_ptr", "i32"), i32("N"), i32("H_kv"),
                 i32("M"), i32("K"), i32("cap", div16=True)),
           variants={80: single({"BLOCK": 1024}, 4, 1), 90: single({"BLOCK": 1024}, 4, 1)}))
KERNELS.append(
    Kernel(name="pq_codes_export", fn=pq_codes_export_kernel,
           args=(ptr("src_ptr", "u8"), ptr("dst_ptr", "i64"), i32("N"), i32("H_kv"), i32("M"),
                 i32("cap", div16=True)),
           variants={80: single({"BLOCK": 1024}, 4, 1), 90: single({"BLOCK": 1024}, 4, 1)}))
