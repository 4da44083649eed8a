"""Ragged batches (spec "Ragged batches"): one decode step over ``B`` sequences of different
lengths ``S_b <= S_alloc``, each with its own ``N_cached[b]``, in two launches whose every
length-dependent quantity is read on the device, so one captured CUDA graph serves any
lengths the caller writes into the ``seq_lens`` buffer between replays.

Each row resolves its own sizes (``_rg_sizes``): a size given as a ratio is ``floor(ratio
* S_b)``, the f64 product truncated, as the host's ``Size::resolve`` computes it (the host
passes every size as a count ``*_c`` and a ratio ``*_r``, ``*_r < 0`` meaning "a count");
``heavy``, the short-path test ``S_b <= heavy + init_offset + 1 + K``, ``n = S_b -
init_offset``, ``sink' = min(sink, S_b)``, ``window' = min(window, S_b)``, ``w0 = max(0,
S_b - window' - init_offset)``, ``k = min(heavy, n)`` and ``total_b``.

``pq_rgq_kernel`` (ragged quantize), grid ``(B*H_kv*M, NCH)``: CTA ``(row, c)`` with ``row
= (b*H_kv + g)*M + m`` assigns subvector ``m`` of KV head ``g``'s new keys ``n_cached[b] +
c, + NCH, .. < n`` of a long row their codes (``_nearest``: lowest ``c`` on ties, the
spec's non-finite rule), written into ``codes u8 [B, H_kv, M, cap]``. A short row
quantizes nothing. CTA ``(b*H_kv*M, 0)`` copies ``S_b`` to ``seen i64 [B]`` (the lengths
the step ran with, for the host to read back) and checks the row (``1 <= S_b <= S_alloc``, ``0
<= n_cached[b] <= max(0, S_b - init_offset)``), writes ``stat i32 [B]`` (1 valid, 0 not)
and, for a bad row, adds 1 to ``err[0]`` and lowers ``err[1]`` to ``b`` (``err i32 [2]``,
kept by the host: a count and the first bad row).

``pq_rgsel_kernel`` (ragged select), grid ``(B*H,)``, one CTA per row ``r = b*H + h``:

1. a short row lists ``0 .. S_b``; a bad row (``stat[b] == 0``) lists nothing
   (``sparse_len = -1``, ``sparse_list`` all ``-1``, weights 0);
2. a long row builds its head's lookup table ``lut[m, c] = <q_m, centroids[b, g, m, c,
   :d_s]>`` into ``lut f32 [B*H, M, K]`` (scratch), and ranks each candidate ``j < w0`` by
   ``u = _ukey(_rank_score(sum_m lut[m, code_m]))`` (an order-preserving 32-bit key; NaN
   lowest, spec "Non-finite inputs");
3. the exact ``min(k, w0)``-th largest ``u`` by up to 4 rounds of a 256-bin histogram
   (``tl.histogram``) over 8 bits of ``u`` each, among the keys that share the bits fixed
   so far; a round whose kept bin holds exactly the keys still needed ends early. Keys
   above the threshold are taken, keys equal to it lowest ``j`` first;
4. one pass over the positions ``p < S_alloc`` in tiles: ``p``'s multiplicity in the list
   is ``[p < sink'] + [p heavy] + [S_b - window' <= p < S_b]`` (a heavy pick is ``p =
   j + init_offset`` with ``j`` taken, or ``w0 <= j < k``: the spec's fill rule); its
   first copy goes to the exclusive prefix sum of the multiplicities (``tl.cumsum`` within
   the tile plus the running count), so ``sparse_list[r, :total_b]`` is ascending with
   duplicates kept; ``weight_list[r, p] = (multiplicity > 0)`` up to ``S_alloc`` (0 past
   ``S_b``), then ``sparse_list[r, total_b : T] = -1`` and ``sparse_len[r] = total_b``;
5. the row's first head (``h == 0``) of a long row sets ``n_cached[b] = n``: no CTA of
   this launch reads ``n_cached`` (``pq_rgq`` read it, in the launch before).

``T`` is the row length of ``sparse_list`` (at least every row's ``total_b``: the host
passes the largest total any ``S_b <= S_alloc`` can have, so that it does not depend on
the lengths). Launch contract: README.md in this directory.
"""

import triton
import triton.language as tl

from kspec import Arg, Kernel, i32, i64, ptr, single
from pq_select import _nearest, _rank_score, _store_lut
from pq_range import _ukey

#: bins of one threshold round (8 bits of the 32-bit key)
RG_BINS = tl.constexpr(256)
#: the key bound of a row with nothing to take: above every key (keys are < 2^32)
NO_TAKE = tl.constexpr(1 << 33)


@triton.jit
def _resolve(S, cnt, ratio):
    """A size at sequence length ``S`` (i64): ``floor(ratio * S)`` in f64 (the product
    truncated, at most ``S``) where ``ratio >= 0``, else the count ``cnt``."""
    x = (S.to(tl.float64) * ratio).to(tl.int64)
    x = tl.minimum(tl.maximum(x, 0), S)
    return tl.where(ratio >= 0.0, x, cnt)


@triton.jit
def _rg_sizes(S, init_offset, K, sink_c, sink_r, win_c, win_r, hv_c, hv_r):
    """Row sizes at ``S`` (i64): ``(short, n, w0, k, sink', window', total)``."""
    heavy = _resolve(S, hv_c, hv_r)
    short = S <= heavy + init_offset + 1 + K
    n = S - init_offset
    s_sink = tl.minimum(_resolve(S, sink_c, sink_r), S)
    s_win = tl.minimum(_resolve(S, win_c, win_r), S)
    w0 = tl.maximum(S - s_win - init_offset, 0)
    k = tl.minimum(heavy, n)
    total = tl.where(short, S, s_sink + k + s_win)
    return short, n, w0, k, s_sink, s_win, total


@triton.jit
def _row_ok(S, nc, S_alloc, init_offset):
    """Whether a row's length and cached-code count are valid (i64 scalars)."""
    return (S >= 1) & (S <= S_alloc) & (nc >= 0) & (nc <= tl.maximum(S - init_offset, 0))


@triton.jit
def pq_rgq_kernel(
    k_ptr, cent_ptr, phi_ptr, codes_ptr, lens_ptr, seen_ptr, nc_ptr, stat_ptr, err_ptr,  #
    k_sb, k_sh, k_ss,  #
    H_kv, M, K, d_s, cap, S_alloc, init_offset, metric_ip, hv_c, hv_r, NCH,  #
    BLOCK_C: tl.constexpr, BLOCK_DS: tl.constexpr,
):
    """See the module docstring and README.md (launch contract)."""
    row = tl.program_id(0)
    c = tl.program_id(1)
    m = row % M
    bg = row // M
    b = bg // H_kv
    g = bg % H_kv
    S = tl.load(lens_ptr + b)
    nc = tl.load(nc_ptr + b)
    ok = _row_ok(S, nc, S_alloc, init_offset)
    if (row % (H_kv * M) == 0) & (c == 0):
        tl.store(stat_ptr + b, ok.to(tl.int32))
        tl.store(seen_ptr + b, S)
        if not ok:
            tl.atomic_add(err_ptr, 1, sem="relaxed")
            tl.atomic_min(err_ptr + 1, b, sem="relaxed")
    heavy = _resolve(S, hv_c, hv_r)
    n = S - init_offset
    if ok & (S > heavy + init_offset + 1 + K):
        d_c = d_s + metric_ip
        cbase = (bg.to(tl.int64) * M + m) * K * d_c
        krow = b.to(tl.int64) * k_sb + g.to(tl.int64) * k_sh
        phi = tl.load(phi_ptr + (bg * M + m) * metric_ip)  # euclidean: phi_ptr[0], unused
        for t in range(nc + c, n, NCH):
            ct = _nearest(k_ptr, krow + (init_offset + t) * k_ss + m * d_s, cent_ptr, cbase, phi, d_s, d_c, K,
                          metric_ip, BLOCK_C, BLOCK_DS)
            tl.store(codes_ptr + (bg.to(tl.int64) * M + m) * cap + t, ct.to(tl.uint8))


@triton.jit
def _keys(codes_ptr, lut_row, bg, M, K, cap, j, cand):
    """The rank keys ``_ukey(_rank_score(score))`` (int64 in ``[0, 2^32)``) of KV head
    ``bg``'s keys ``j`` (``cand``: loaded; 0 elsewhere), the score summed over ``m = 0, 1,
    ..`` in order."""
    sc = tl.zeros(j.shape, tl.float32)
    for m in range(M):
        cd = tl.load(codes_ptr + (bg * M + m) * cap + j, mask=cand, other=0).to(tl.int32) & (K - 1)
        sc += tl.load(lut_row + m * K + cd, mask=cand, other=0.0)
    return tl.where(cand, _ukey(_rank_score(sc)), 0)


@triton.jit
def _threshold(codes_ptr, lut_row, bg, M, K, cap, w0, need, TILE: tl.constexpr):
    """The bounds that take the ``need`` largest keys of the candidates ``j < w0`` (ties
    lowest ``j`` first): ``(t_sure, t_maybe, need_eq)``: every key ``>= t_sure`` is taken,
    and the first ``need_eq`` keys in ``[t_maybe, t_sure)`` by position. Rounds of a
    256-bin histogram over 8 bits of the keys sharing the bits fixed so far."""
    bins = tl.arange(0, RG_BINS)
    t_sure = (w0 * 0 + NO_TAKE).to(tl.int64)
    t_maybe = t_sure
    need_eq = w0 * 0
    prefix = w0 * 0
    done = (need <= 0).to(tl.int64)
    for rd in tl.static_range(4):
        shift = 24 - 8 * rd
        if done == 0:
            cnt = tl.zeros([RG_BINS], tl.int32)
            for j0 in range(0, w0, TILE):
                j = j0 + tl.arange(0, TILE)
                cand = j < w0
                u = _keys(codes_ptr, lut_row, bg, M, K, cap, j, cand)
                hit = cand & ((u >> (shift + 8)) == prefix)
                cnt += tl.histogram(((u >> shift) & 255).to(tl.int32), RG_BINS, mask=hit)
            ge = tl.cumsum(cnt, axis=0, reverse=True)  # keys in bins >= d
            d = tl.maximum(tl.max(tl.where(ge >= need, bins, -1), axis=0), 0)
            above = tl.sum(tl.where(bins == d, ge - cnt, 0), axis=0)
            in_d = tl.sum(tl.where(bins == d, cnt, 0), axis=0)
            need = need - above
            prefix = prefix * 256 + d
            if need == in_d:  # every key of the bin is taken: no tie to break
                t_sure = prefix << shift
                t_maybe = t_sure
                need_eq = need * 0
                done = need * 0 + 1
            elif shift == 0:
                t_sure = prefix + 1
                t_maybe = prefix
                need_eq = need
                done = need * 0 + 1
    return t_sure, t_maybe, need_eq


@triton.jit
def pq_rgsel_kernel(
    q_ptr, cent_ptr, codes_ptr, lut_ptr, lens_ptr, nc_ptr, stat_ptr, sl_ptr, len_ptr, w_ptr,  #
    q_sb, q_sh,  #
    H, G, M, K, d_s, cap, S_alloc, T, init_offset, metric_ip,  #
    sink_c, sink_r, win_c, win_r, hv_c, hv_r,  #
    TILE: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_DS: tl.constexpr,
):
    """See the module docstring and README.md (launch contract)."""
    r = tl.program_id(0)
    r64 = r.to(tl.int64)
    b = r // H
    h = r % H
    g = h // G
    bg = b.to(tl.int64) * (H // G) + g
    S = tl.load(lens_ptr + b)
    ok = (tl.load(stat_ptr + b) != 0) & (S >= 1) & (S <= S_alloc)
    S = tl.where(ok, S, 0)
    short, n, w0, k, s_sink, s_win, total = _rg_sizes(S, init_offset, K, sink_c, sink_r, win_c, win_r, hv_c, hv_r)
    long = ok & (short == 0)
    lut_row = lut_ptr + r64 * M * K
    t_sure = (S * 0 + NO_TAKE).to(tl.int64)
    t_maybe = t_sure
    need_eq = S * 0
    if long:
        d_c = d_s + metric_ip
        qrow = b.to(tl.int64) * q_sb + h.to(tl.int64) * q_sh
        for m in range(M):
            _store_lut(q_ptr, qrow + m * d_s, cent_ptr, (bg * M + m) * K * d_c, d_s, d_c, K, lut_row + m * K, BLOCK_C,
                       BLOCK_DS)
        tl.debug_barrier()  # every thread's table entries, before any thread reads them
        t_sure, t_maybe, need_eq = _threshold(codes_ptr, lut_row, bg, M, K, cap, w0, tl.minimum(k, w0), TILE)
    ws = S - s_win
    sl_row = sl_ptr + r64 * T
    w_row = w_ptr + r64 * S_alloc
    wt = w_ptr.dtype.element_ty
    carry = S * 0  # list entries written so far
    ties = S * 0  # keys in [t_maybe, t_sure) seen so far
    for p0 in range(0, S_alloc, TILE):
        p = p0 + tl.arange(0, TILE)
        inseq = p < S
        if long & (p0 < S):
            j = p - init_offset
            cand = (j >= 0) & (j < w0)
            u = _keys(codes_ptr, lut_row, bg, M, K, cap, j, cand)
            tie = cand & (u >= t_maybe) & (u < t_sure)
            tie32 = tie.to(tl.int32)
            trank = ties + tl.cumsum(tie32, axis=0) - tie32
            ties += tl.sum(tie32, axis=0)
            take = (cand & (u >= t_sure)) | (tie & (trank < need_eq))
            heavy = take | ((j >= w0) & (j < k))
            mult = (p < s_sink).to(tl.int32) + heavy.to(tl.int32) + (inseq & (p >= ws)).to(tl.int32)
        else:
            mult = inseq.to(tl.int32)
        excl = carry + tl.cumsum(mult, axis=0) - mult
        pv = p.to(tl.int64)
        tl.store(sl_row + excl, pv, mask=(mult >= 1) & (excl < T))
        tl.store(sl_row + excl + 1, pv, mask=(mult >= 2) & (excl + 1 < T))
        tl.store(sl_row + excl + 2, pv, mask=(mult >= 3) & (excl + 2 < T))
        tl.store(w_row + p, (mult > 0).to(tl.float32).to(wt), mask=p < S_alloc)
        carry += tl.sum(mult, axis=0)
    for t0 in range(carry, T, TILE):
        t = t0 + tl.arange(0, TILE)
        tl.store(sl_row + t, tl.full([TILE], -1, tl.int64), mask=t < T)
    tl.store(len_ptr + r64, tl.where(ok, total, -1).to(tl.int64))
    if long & (h == 0):
        tl.store(nc_ptr + b, n)


# ----------------------------------------------------------------------------------
# declarations for the build

DTYPES = ("fp32", "bf16", "fp16")
RGQ_FIXED = {"BLOCK_C": 64, "BLOCK_DS": 32}
RGSEL_FIXED = {"BLOCK_C": 64, "BLOCK_DS": 32}


def f64(name):
    return Arg(name, "fp64")


def _rgq_args(qt):
    return (
        ptr("k_ptr", qt, False), ptr("cent_ptr", "fp32"), ptr("phi_ptr", "fp32", False), ptr("codes_ptr", "u8"),
        ptr("lens_ptr", "i64", False), ptr("seen_ptr", "i64", False), ptr("nc_ptr", "i64", False),
        ptr("stat_ptr", "i32", False), ptr("err_ptr", "i32", False),
        i64("k_sb"), i64("k_sh"), i64("k_ss"),
        i32("H_kv"), i32("M"), i32("K"), i32("d_s"), i32("cap", div16=True), i64("S_alloc"), i64("init_offset"),
        i32("metric_ip"), i64("hv_c"), f64("hv_r"), i32("NCH"),
    )


def _rgsel_args(qt, wt):
    return (
        ptr("q_ptr", qt, False), ptr("cent_ptr", "fp32"), ptr("codes_ptr", "u8"), ptr("lut_ptr", "fp32"),
        ptr("lens_ptr", "i64", False), ptr("nc_ptr", "i64", False), ptr("stat_ptr", "i32", False),
        ptr("sl_ptr", "i64"), ptr("len_ptr", "i64"), ptr("w_ptr", wt, False),
        i64("q_sb"), i64("q_sh"),
        i32("H"), i32("G"), i32("M"), i32("K"), i32("d_s"), i32("cap", div16=True), i64("S_alloc"), i64("T"),
        i64("init_offset"), i32("metric_ip"),
        i64("sink_c"), f64("sink_r"), i64("win_c"), f64("win_r"), i64("hv_c"), f64("hv_r"),
    )


KERNELS = []
for _qt in DTYPES:
    KERNELS.append(
        Kernel(name=f"pq_rgq.k_{_qt}", fn=pq_rgq_kernel, args=_rgq_args(_qt), fixed=RGQ_FIXED,
               variants={80: single({}, 4, 1), 90: single({}, 4, 1)}))
for _qt in DTYPES:
    for _wt in DTYPES:
        KERNELS.append(
            Kernel(name=f"pq_rgsel.q_{_qt}.w_{_wt}", fn=pq_rgsel_kernel, args=_rgsel_args(_qt, _wt),
                   fixed=RGSEL_FIXED, variants={80: single({"TILE": 1024}, 8, 1), 90: single({"TILE": 1024}, 8, 1)}))
