"""Ragged batches (spec "Ragged batches"): one decode step over ``B`` sequences of different
lengths ``S_b <= S_alloc``, each with its own ``N_cached[b]``, in launches whose every
length-dependent quantity is read on the device (grids depend only on ``S_alloc`` and the
shapes), so one captured CUDA graph serves any lengths the caller writes into the
``seq_lens`` buffer between replays.

Each row resolves its own sizes (``_rg_sizes``): a size given as a ratio is ``floor(ratio
* S_b)``, the f64 product truncated, as the host's ``Size::resolve`` computes it (the host
passes every size as a count ``*_c`` and a ratio ``*_r``, ``*_r < 0`` meaning "a count");
``heavy``, the short-path test ``S_b <= heavy + init_offset + 1 + K``, ``n = S_b -
init_offset``, ``sink' = min(sink, S_b)``, ``window' = min(window, S_b)``, ``w0 = max(0,
S_b - window' - init_offset)``, ``k = min(heavy, n)`` and ``total_b``. A refused row
(``stat[b] == 0``) is taken as ``S_b = 0``: it lists nothing.

``pq_rgq_kernel`` (ragged quantize), grid ``(B*H_kv*M, NCH)``: CTA ``(row, c)`` with ``row
= (b*H_kv + g)*M + m`` assigns subvector ``m`` of KV head ``g``'s new keys ``n_cached[b] +
c, + NCH, .. < n`` of a long row their codes (``_nearest``: lowest ``c`` on ties, the
spec's non-finite rule), written into ``codes u8 [B, H_kv, M, cap]``. A short row
quantizes nothing. CTA ``(b*H_kv*M, 0)`` copies ``S_b`` to ``seen i64 [B]`` (the lengths
the step ran with, for the host to read back) and ``n_cached[b]`` to ``nc0 i64 [B]`` (the
count the step began from, for a selection launch that also writes ``n_cached``) and checks the row (``1 <= S_b <= S_alloc``, ``0
<= n_cached[b] <= max(0, S_b - init_offset)``), writes ``stat i32 [B]`` (1 valid, 0 not)
and, for a bad row, adds 1 to ``err[0]`` and lowers ``err[1]`` to ``b`` (``err i32 [2]``,
kept by the host: a count and the first bad row).

The selection of row ``r = b*H + h`` is spread over many CTAs per row; a CTA past its own
row's parts exits at once, so rows of any length share one grid:

1. ``pq_rglut_kernel``, grid ``(B*H, M, cdiv(K, BLOCK_C))``: CTA ``(r, m, i)`` of a long
   row writes entries ``i*BLOCK_C ..`` of row ``m`` of the head's lookup table ``lut f32
   [B*H, M, K]`` (``lut[m, c] = <q_m, centroids[b, g, m, c, :d_s]>``, as ``_store_lut``
   computes it); CTA ``(r, 0, 0)`` zeroes the row's round histogram ``rhist i32 [B*H,
   256]`` and ticket ``rtick i32 [B*H]``.
2. ``pq_rground_kernel``, grid ``(B*H, P)``, ``P = max(1, cdiv(S_alloc - init_offset,
   TILE))``, launched four times (``ROUND`` 0..3): the exact ``need = min(k, w0)``-th
   largest rank key ``u = _ukey(_rank_score(sum_m lut[m, code_m]))`` (an order-preserving
   32-bit key, NaN lowest: spec "Non-finite inputs") among the candidates ``j < w0``, one
   8-bit digit a round from the top. CTA ``(r, c)``, ``c < cdiv(w0, TILE)`` (the row's
   own part count), counts the digit of its keys ``j = c*TILE ..`` that share the digits
   fixed so far (``tl.histogram``, then global atomics into the row's histogram) and takes
   a ticket; the row's last CTA to arrive (no CTA waits for another) closes the round
   (``_rg_close``): keeps the digit ``d`` whose bin holds the ``need``-th largest key,
   less the keys above it from ``need``; the row is resolved when that bin is taken whole
   or after the last digit, and the closer leaves the histogram and ticket zero. The row
   state ``rst i64 [B*H, 8]`` holds ``(prefix, need, resolved, t_sure, t_maybe,
   need_eq)``: every candidate with ``u >= t_sure`` is taken and the first ``need_eq`` in
   ``[t_maybe, t_sure)`` by position (``need = 0``: ``t_sure = t_maybe = 2^33``, nothing).
   Later rounds skip resolved rows.
3. ``pq_rgcnt_kernel``, grid ``(B*H, NP)``, ``NP = cdiv(S_alloc, TILE)``: CTA ``(r, c)``
   of a long row with ``c*TILE < S_b`` writes its part's counts of sure candidates (``u >=
   t_sure``) and ties (``t_maybe <= u < t_sure``) into ``pcnt i32 [B*H, 2, NP]``.
4. ``pq_rgemit_kernel``, the same grid: CTA ``(r, c)`` lists positions ``p = c*TILE ..``.
   ``p``'s multiplicity in the list is ``[p < sink'] + [p heavy] + [S_b - window' <= p <
   S_b]`` (a heavy pick is ``p = j + init_offset`` with ``j`` taken, or ``w0 <= j < k``:
   the spec's fill rule); its first copy goes to the exclusive prefix sum of the
   multiplicities, which starts from the entries of the positions before the part: sink,
   window and fill counted in closed form, the earlier parts' sure counts, and ``min(need_eq,
   ties before)`` (ties are taken lowest ``j`` first, so the tie ranks start there too). So
   ``sparse_list[r, :total_b]`` is ascending with duplicates kept (a short row: ``0 ..
   S_b``). ``weight_list[r, p] = (multiplicity > 0)`` for the part's ``p < S_alloc`` (0 past
   ``S_b``); the part also writes ``-1`` over its share ``[c*PW, (c+1)*PW)``, ``PW =
   cdiv(T, NP)``, of the ranks ``total_b .. T``; part 0 writes ``sparse_len[r] =
   total_b`` (``-1`` for a refused row) and, at the row's first head (``h == 0``) of a
   long row, ``n_cached[b] = n``: no CTA of the selection reads ``n_cached`` (``pq_rgq``
   read it, in the launch before).

``T`` is the row length of ``sparse_list`` (at least every row's ``total_b``: the host
passes the largest total any ``S_b <= S_alloc`` can have, so that it does not depend on
the lengths). Launch contract: README.md in this directory.
"""

import triton
import triton.language as tl

from kspec import Arg, Kernel, i32, i64, ptr, single
from pq_select import _lut_tile, _nearest, _rank_score, _row_dots
from pq_hist import _row_ids
from pq_range import _ukey

#: bins of one threshold round (8 bits of the 32-bit key)
RG_BINS = tl.constexpr(256)
#: the key bound of a row with nothing to take: above every key (keys are < 2^32)
NO_TAKE = tl.constexpr(1 << 33)
#: the row state ``rst i64 [B*H, RS_LEN]`` of the threshold rounds
RS_LEN = tl.constexpr(8)
RS_PREFIX = tl.constexpr(0)  # the digits fixed so far
RS_NEED = tl.constexpr(1)  # keys still to take among those sharing them
RS_DONE = tl.constexpr(2)  # resolved
RS_SURE = tl.constexpr(3)  # t_sure
RS_MAYBE = tl.constexpr(4)  # t_maybe
RS_EQ = tl.constexpr(5)  # need_eq


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
    k_ptr, cent_ptr, phi_ptr, codes_ptr, lens_ptr, seen_ptr, nc_ptr, nc0_ptr, stat_ptr, err_ptr,  #
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
        tl.store(nc0_ptr + b, nc)
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
def _rg_row(lens_ptr, stat_ptr, b, S_alloc, init_offset, K, sink_c, sink_r, win_c, win_r, hv_c, hv_r):
    """Row ``b``'s sizes as the selection sees them: ``(ok, long, S, n, w0, k, sink',
    window', total)``; a refused row (``stat[b] == 0``) as ``S = 0`` (nothing listed)."""
    S = tl.load(lens_ptr + b)
    ok = (tl.load(stat_ptr + b) != 0) & (S >= 1) & (S <= S_alloc)
    S = tl.where(ok, S, 0)
    short, n, w0, k, s_sink, s_win, total = _rg_sizes(S, init_offset, K, sink_c, sink_r, win_c, win_r, hv_c, hv_r)
    return ok, ok & (short == 0), S, n, w0, k, s_sink, s_win, total


@triton.jit
def pq_rglut_kernel(
    q_ptr, cent_ptr, lut_ptr, lens_ptr, stat_ptr, rhist_ptr, rtick_ptr,  #
    q_sb, q_sh,  #
    H, G, M, K, d_s, S_alloc, init_offset, metric_ip, hv_c, hv_r,  #
    BLOCK_C: tl.constexpr, BLOCK_DS: tl.constexpr,
):
    """See the module docstring and README.md (launch contract)."""
    r = tl.program_id(0)
    m = tl.program_id(1)
    i = tl.program_id(2)
    r64, b, h, _, bg = _row_ids(r, H, G)
    if (m == 0) & (i == 0):
        # the rounds' histogram and ticket of this row start at zero
        bins = tl.arange(0, RG_BINS)
        tl.store(rhist_ptr + r64 * RG_BINS + bins, tl.zeros([RG_BINS], tl.int32))
        tl.store(rtick_ptr + r, 0)
    S = tl.load(lens_ptr + b)
    ok = (tl.load(stat_ptr + b) != 0) & (S >= 1) & (S <= S_alloc)
    if ok & (S > _resolve(S, hv_c, hv_r) + init_offset + 1 + K):
        # entries c = i*BLOCK_C .. of subvector m, as _store_lut computes them
        d_c = d_s + metric_ip
        qrow = b.to(tl.int64) * q_sb + h.to(tl.int64) * q_sh + m * d_s
        offs_c = i * BLOCK_C + tl.arange(0, BLOCK_C)
        acc = tl.zeros([BLOCK_C], tl.float32)
        for d0 in range(0, d_s, BLOCK_DS):
            qv, cv = _lut_tile(q_ptr, qrow, cent_ptr, (bg * M + m) * K * d_c, offs_c, d0 + tl.arange(0, BLOCK_DS), d_s,
                               d_c, K, True)
            acc += _row_dots(cv, qv)
        tl.store(lut_ptr + (r64 * M + m) * K + offs_c, acc, mask=offs_c < K)


@triton.jit
def _rg_done(rs, t_sure, t_maybe, need_eq):
    """The row's class bounds, and the row marked resolved."""
    tl.store(rs + RS_SURE, t_sure.to(tl.int64))
    tl.store(rs + RS_MAYBE, t_maybe.to(tl.int64))
    tl.store(rs + RS_EQ, need_eq.to(tl.int64))
    tl.store(rs + RS_DONE, 1)


@triton.jit
def _rg_close(rs, hrow, tick, prefix, need, shift):
    """The row's last CTA of a round: keep the bin holding the ``need``-th largest key
    among those sharing ``prefix`` (counting from the top); resolve the row where that bin
    is taken whole or the round was the last (``shift == 0``), else narrow to it; leave
    the histogram and the ticket zero."""
    bins = tl.arange(0, RG_BINS)
    cnt = tl.load(hrow + bins, cache_modifier=".cg")
    ge = tl.cumsum(cnt, axis=0, reverse=True)  # keys in bins >= d
    d = tl.maximum(tl.max(tl.where(ge >= need, bins, -1), axis=0), 0)
    above = tl.sum(tl.where(bins == d, ge - cnt, 0), axis=0)
    in_d = tl.sum(tl.where(bins == d, cnt, 0), axis=0)
    need2 = need - above.to(tl.int64)
    prefix2 = prefix * 256 + d
    if need2 == in_d:  # every key of the bin is taken: no tie to break
        _rg_done(rs, prefix2 << shift, prefix2 << shift, need2 * 0)
    elif shift == 0:
        _rg_done(rs, prefix2 + 1, prefix2, need2)
    else:
        tl.store(rs + RS_PREFIX, prefix2)
        tl.store(rs + RS_NEED, need2)
        tl.store(rs + RS_DONE, 0)
    tl.store(hrow + bins, tl.zeros([RG_BINS], tl.int32))
    tl.store(tick, 0)


@triton.jit
def pq_rground_kernel(
    codes_ptr, lut_ptr, lens_ptr, stat_ptr, rst_ptr, rhist_ptr, rtick_ptr,  #
    H, G, M, K, cap, S_alloc, init_offset,  #
    sink_c, sink_r, win_c, win_r, hv_c, hv_r, ROUND,  #
    TILE: tl.constexpr,
):
    """See the module docstring and README.md (launch contract)."""
    r = tl.program_id(0)
    c = tl.program_id(1)
    r64, b, _, _, bg = _row_ids(r, H, G)
    ok, long, S, n, w0, k, s_sink, s_win, total = _rg_row(lens_ptr, stat_ptr, b, S_alloc, init_offset, K, sink_c,
                                                          sink_r, win_c, win_r, hv_c, hv_r)
    rs = rst_ptr + r64 * RS_LEN
    LP = tl.cdiv(w0, TILE)  # this row's parts (CTAs past them exit at once; CTA 0 of a
    if long & ((c < LP) | (c == 0)):  # row without candidates resolves it)
        if ROUND == 0:
            need = tl.minimum(k, w0)
            prefix = need * 0
            live = need > 0
            if (need <= 0) & (c == 0):
                _rg_done(rs, need * 0 + NO_TAKE, need * 0 + NO_TAKE, need * 0)
        else:
            need = tl.load(rs + RS_NEED)
            prefix = tl.load(rs + RS_PREFIX)
            live = tl.load(rs + RS_DONE) == 0
        if live & (c < LP):
            shift = 24 - 8 * ROUND
            j = c * TILE + tl.arange(0, TILE)
            cand = j < w0
            u = _keys(codes_ptr, lut_ptr + r64 * M * K, bg, M, K, cap, j, cand)
            hit = cand & ((u >> (shift + 8)) == prefix)
            cnt = tl.histogram(((u >> shift) & 255).to(tl.int32), RG_BINS, mask=hit)
            hrow = rhist_ptr + r64 * RG_BINS
            tl.atomic_add(hrow + tl.arange(0, RG_BINS), cnt, mask=cnt > 0, sem="relaxed")
            # the row's last CTA to arrive closes the round (no CTA waits for another)
            tl.debug_barrier()
            arrived = tl.atomic_add(rtick_ptr + r, 1, sem="acq_rel", scope="gpu")
            if arrived == LP - 1:
                _rg_close(rs, hrow, rtick_ptr + r, prefix, need, shift)


@triton.jit
def _rg_part(codes_ptr, lut_row, bg, M, K, cap, j, cand, rs):
    """The keys ``j`` of a part and the row's class bounds: ``(u, t_sure, t_maybe,
    need_eq)``."""
    u = _keys(codes_ptr, lut_row, bg, M, K, cap, j, cand)
    return u, tl.load(rs + RS_SURE), tl.load(rs + RS_MAYBE), tl.load(rs + RS_EQ)


@triton.jit
def pq_rgcnt_kernel(
    codes_ptr, lut_ptr, lens_ptr, stat_ptr, rst_ptr, pcnt_ptr,  #
    H, G, M, K, cap, S_alloc, init_offset,  #
    sink_c, sink_r, win_c, win_r, hv_c, hv_r, NP,  #
    TILE: tl.constexpr,
):
    """See the module docstring and README.md (launch contract)."""
    r = tl.program_id(0)
    c = tl.program_id(1)
    r64, b, _, _, bg = _row_ids(r, H, G)
    ok, long, S, n, w0, k, s_sink, s_win, total = _rg_row(lens_ptr, stat_ptr, b, S_alloc, init_offset, K, sink_c,
                                                          sink_r, win_c, win_r, hv_c, hv_r)
    p0 = c * TILE
    if long & (p0 < S):
        sure = c * 0
        ties = c * 0
        if (p0 < init_offset + w0) & (p0 + TILE > init_offset):
            j = p0 + tl.arange(0, TILE) - init_offset
            cand = (j >= 0) & (j < w0)
            u, t_sure, t_maybe, need_eq = _rg_part(codes_ptr, lut_ptr + r64 * M * K, bg, M, K, cap, j, cand,
                                                   rst_ptr + r64 * RS_LEN)
            sure = tl.sum((cand & (u >= t_sure)).to(tl.int32), axis=0)
            ties = tl.sum((cand & (u >= t_maybe) & (u < t_sure)).to(tl.int32), axis=0)
        tl.store(pcnt_ptr + r64 * 2 * NP + c, sure)
        tl.store(pcnt_ptr + (r64 * 2 + 1) * NP + c, ties)


@triton.jit
def pq_rgemit_kernel(
    codes_ptr, lut_ptr, lens_ptr, stat_ptr, rst_ptr, pcnt_ptr, nc_ptr, sl_ptr, len_ptr, w_ptr,  #
    H, G, M, K, cap, S_alloc, T, init_offset,  #
    sink_c, sink_r, win_c, win_r, hv_c, hv_r, NP,  #
    TILE: tl.constexpr,
):
    """See the module docstring and README.md (launch contract)."""
    r = tl.program_id(0)
    c = tl.program_id(1)
    r64, b, h, _, bg = _row_ids(r, H, G)
    ok, long, S, n, w0, k, s_sink, s_win, total = _rg_row(lens_ptr, stat_ptr, b, S_alloc, init_offset, K, sink_c,
                                                          sink_r, win_c, win_r, hv_c, hv_r)
    ws = S - s_win
    p0 = c * TILE
    p = p0 + tl.arange(0, TILE)
    inseq = p < S
    carry = tl.minimum(S, p0)  # list entries before this part (a short row: one per position)
    if long & (p0 < S):
        # the earlier parts' taken candidates (their counts), sink, window and fill entries
        sure_b = S * 0
        ties_b = S * 0
        for q0 in range(0, c, 256):
            q = q0 + tl.arange(0, 256)
            sure_b += tl.sum(tl.load(pcnt_ptr + r64 * 2 * NP + q, mask=q < c, other=0), axis=0).to(tl.int64)
            ties_b += tl.sum(tl.load(pcnt_ptr + (r64 * 2 + 1) * NP + q, mask=q < c, other=0), axis=0).to(tl.int64)
        j = p - init_offset
        cand = (j >= 0) & (j < w0)
        u, t_sure, t_maybe, need_eq = _rg_part(codes_ptr, lut_ptr + r64 * M * K, bg, M, K, cap, j, cand,
                                               rst_ptr + r64 * RS_LEN)
        carry = (tl.minimum(s_sink, p0) + tl.maximum(tl.minimum(S, p0) - ws, 0) +
                 tl.maximum(tl.minimum(k, p0 - init_offset) - w0, 0) + sure_b + tl.minimum(need_eq, ties_b))
        tie = cand & (u >= t_maybe) & (u < t_sure)
        tie32 = tie.to(tl.int32)
        trank = ties_b + tl.cumsum(tie32, axis=0) - tie32
        take = (cand & (u >= t_sure)) | (tie & (trank < need_eq))
        heavy = take | ((j >= w0) & (j < k))
        mult = (p < s_sink).to(tl.int32) + heavy.to(tl.int32) + (inseq & (p >= ws)).to(tl.int32)
    else:
        mult = inseq.to(tl.int32)
    excl = carry + tl.cumsum(mult, axis=0) - mult
    pv = p.to(tl.int64)
    sl_row = sl_ptr + r64 * T
    tl.store(sl_row + excl, pv, mask=(mult >= 1) & (excl < T))
    tl.store(sl_row + excl + 1, pv, mask=(mult >= 2) & (excl + 1 < T))
    tl.store(sl_row + excl + 2, pv, mask=(mult >= 3) & (excl + 2 < T))
    wt = w_ptr.dtype.element_ty
    tl.store(w_ptr + r64 * S_alloc + p, (mult > 0).to(tl.float32).to(wt), mask=p < S_alloc)
    # this part's share of the -1 padding: ranks [c*PW, (c+1)*PW) at or past total_b
    PW = tl.cdiv(T, NP)
    t_lo = tl.maximum(c * PW, tl.where(ok, total, 0))
    t_hi = tl.minimum((c + 1) * PW, T)
    for t0 in range(t_lo, t_hi, TILE):
        t = t0 + tl.arange(0, TILE)
        tl.store(sl_row + t, tl.full([TILE], -1, tl.int64), mask=t < t_hi)
    if c == 0:
        tl.store(len_ptr + r64, tl.where(ok, total, -1).to(tl.int64))
        if long & (h == 0):
            tl.store(nc_ptr + b, n)


# ----------------------------------------------------------------------------------
# declarations for the build

DTYPES = ("fp32", "bf16", "fp16")
RGQ_FIXED = {"BLOCK_C": 64, "BLOCK_DS": 32}
RGLUT_FIXED = {"BLOCK_C": 64, "BLOCK_DS": 32}
#: keys per CTA of a threshold round (``pq_rground``)
RGROUND_TILE = 4096
#: positions per CTA of the emit (``pq_rgcnt`` and ``pq_rgemit``: the same parts)
RGEMIT_TILE = 2048


def f64(name):
    return Arg(name, "fp64")


def _sizes():
    return (i64("sink_c"), f64("sink_r"), i64("win_c"), f64("win_r"), i64("hv_c"), f64("hv_r"))


def _rgq_args(qt):
    return (
        ptr("k_ptr", qt, False), ptr("cent_ptr", "fp32"), ptr("phi_ptr", "fp32", False), ptr("codes_ptr", "u8"),
        ptr("lens_ptr", "i64", False), ptr("seen_ptr", "i64", False), ptr("nc_ptr", "i64", False),
        ptr("nc0_ptr", "i64", False), ptr("stat_ptr", "i32", False), ptr("err_ptr", "i32", False),
        i64("k_sb"), i64("k_sh"), i64("k_ss"),
        i32("H_kv"), i32("M"), i32("K"), i32("d_s"), i32("cap", div16=True), i64("S_alloc"), i64("init_offset"),
        i32("metric_ip"), i64("hv_c"), f64("hv_r"), i32("NCH"),
    )


def _rglut_args(qt):
    return (
        ptr("q_ptr", qt, False), ptr("cent_ptr", "fp32"), ptr("lut_ptr", "fp32"), ptr("lens_ptr", "i64", False),
        ptr("stat_ptr", "i32", False), ptr("rhist_ptr", "i32"), ptr("rtick_ptr", "i32", False),
        i64("q_sb"), i64("q_sh"),
        i32("H"), i32("G"), i32("M"), i32("K"), i32("d_s"), i64("S_alloc"), i64("init_offset"), i32("metric_ip"),
        i64("hv_c"), f64("hv_r"),
    )


def _rground_args():
    return (
        ptr("codes_ptr", "u8"), ptr("lut_ptr", "fp32"), ptr("lens_ptr", "i64", False), ptr("stat_ptr", "i32", False),
        ptr("rst_ptr", "i64", False), ptr("rhist_ptr", "i32"), ptr("rtick_ptr", "i32", False),
        i32("H"), i32("G"), i32("M"), i32("K"), i32("cap", div16=True), i64("S_alloc"), i64("init_offset"),
        *_sizes(), i32("ROUND"),
    )


def _rgcnt_args():
    return (
        ptr("codes_ptr", "u8"), ptr("lut_ptr", "fp32"), ptr("lens_ptr", "i64", False), ptr("stat_ptr", "i32", False),
        ptr("rst_ptr", "i64", False), ptr("pcnt_ptr", "i32", False),
        i32("H"), i32("G"), i32("M"), i32("K"), i32("cap", div16=True), i64("S_alloc"), i64("init_offset"),
        *_sizes(), i32("NP"),
    )


def _rgemit_args(wt):
    return (
        ptr("codes_ptr", "u8"), ptr("lut_ptr", "fp32"), ptr("lens_ptr", "i64", False), ptr("stat_ptr", "i32", False),
        ptr("rst_ptr", "i64", False), ptr("pcnt_ptr", "i32", False), ptr("nc_ptr", "i64", False),
        ptr("sl_ptr", "i64"), ptr("len_ptr", "i64"), ptr("w_ptr", wt, False),
        i32("H"), i32("G"), i32("M"), i32("K"), i32("cap", div16=True), i64("S_alloc"), i64("T"), i64("init_offset"),
        *_sizes(), i32("NP"),
    )


KERNELS = []
for _qt in DTYPES:
    KERNELS.append(
        Kernel(name=f"pq_rgq.k_{_qt}", fn=pq_rgq_kernel, args=_rgq_args(_qt), fixed=RGQ_FIXED,
               variants={80: single({}, 4, 1), 90: single({}, 4, 1)}))
    KERNELS.append(
        Kernel(name=f"pq_rglut.q_{_qt}", fn=pq_rglut_kernel, args=_rglut_args(_qt), fixed=RGLUT_FIXED,
               variants={80: single({}, 8, 1), 90: single({}, 8, 1)}))
KERNELS.append(
    Kernel(name="pq_rground", fn=pq_rground_kernel, args=_rground_args(), fixed={},
           variants={80: single({"TILE": RGROUND_TILE}, 8, 1), 90: single({"TILE": RGROUND_TILE}, 8, 1)}))
KERNELS.append(
    Kernel(name="pq_rgcnt", fn=pq_rgcnt_kernel, args=_rgcnt_args(), fixed={},
           variants={80: single({"TILE": RGEMIT_TILE}, 8, 1), 90: single({"TILE": RGEMIT_TILE}, 8, 1)}))
for _wt in DTYPES:
    KERNELS.append(
        Kernel(name=f"pq_rgemit.w_{_wt}", fn=pq_rgemit_kernel, args=_rgemit_args(_wt), fixed={},
               variants={80: single({"TILE": RGEMIT_TILE}, 8, 1), 90: single({"TILE": RGEMIT_TILE}, 8, 1)}))
