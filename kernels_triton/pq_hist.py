"""The decode step in one launch, by counting code combinations (``K^M <= 4096``).

A key's score ``sum_m lut[m, code_m]`` depends only on its code *combination*
``(code_0, .., code_{M-1})``: ``K^M`` of them (4096 on the reference workload, M=2,
bits=6), against tens of thousands of keys per row. So the top-k threshold is found on
the combinations, weighted by how many candidate keys carry each, and the keys are read
once, to emit.

``pq_hist_kernel`` (launch contract: README.md in this directory). Grid ``(B*H, 2)``:
CTA ``(r, 0)`` works on row ``r = b*H + h`` (steps 1-4), CTA ``(r, 1)`` quantizes the
new keys when ``h`` is the first head of its KV group (step 5) and exits otherwise.

1. Moves the row's combination histogram ``hist[r, :]`` (i32 ``[B*H, NC]``, persistent
   across steps) from the keys ``j < histn[r]`` it counts to the candidates ``j < w0``,
   adding or removing the keys in between with atomics (one key per decode step; every
   key on the first step after an import, when ``histn`` is 0), and sets
   ``histn[r] = w0``. Replaying the same step changes nothing.
2. Computes the head's lookup table ``lut[m, c] = <q_m, centroids[b,g,m,c,:d_s]>`` into
   scratch and the score of every combination from it.
3. Finds the threshold: first a cut by comparison (one eight-way reduction: the keys
   in four top slices of the score range and each slice's lowest score, no atomics) to
   the narrowest top slice (1/4 .. 1/256 of the range) that holds k keys,
   then up to LEVELS rounds of an NB-bin histogram (shared-memory atomics, weighted by
   the counts) over the score range of the combinations still in play; each round keeps the
   bin holding the k-th largest key. A round is skipped once the
   remaining combinations share one score. Result, per combination: ``2`` = every key
   is taken, ``1`` = keys are taken in position order until ``need`` more are taken,
   ``0`` = none, kept as score bounds (every class lies above the next).
4. Streams the row once, positions ``0 .. S`` (TILE at a time, the next tile's codes
   prefetched), classifying each candidate by its score against those bounds. Rows
   whose heavy picks all lie between the sink and the window (``init_offset >= sink``,
   ``w0 >= k``: the usual case) keep per 32 keys a bit mask of the taken keys and rank
   each by its mask's prefix count (``_emit_masks``); other rows rank every key by a
   prefix sum and merge sink, heavy and window entries with duplicates
   (``_emit_generic``). Writes ``sparse_list`` (ascending), ``weight_list`` and
   ``sparse_len``. When fewer than k keys are candidates, the lowest masked keys fill
   in (spec step 4).
5. Quantizes the step's new keys (``n_old <= j < n``) and appends their codes, in
   CTAs of their own, beside the rows. The host routes a step here only when those
   keys are not candidates (``w0 <= n_old``), so no row reads a code written in this
   launch for anything it uses.

The rounds' bins are ``LEVELS * NB`` i32 of the CTA's static shared memory (declared by
inline PTX, ``_lvl_smem``). The host zero-fills ``hist`` and ``histn`` once and
``histn`` again after replacing the codes.
"""


import triton
import triton.language as tl

from kspec import Kernel, grid, i32, i64, ptr, single
from pq_select import INTERPRETED, RANK_LIN, _nearest, _rank_score, _store_lut

#: the threshold rounds' bins per level and levels (``FIXED``'s ``NB``, ``LEVELS``)
ROUND_BINS = 1024
ROUND_LEVELS = 3
#: words of the rounds' bins (``pq_range``'s select keeps its bins and cluster totals there too)
LVL_WORDS = tl.constexpr(ROUND_LEVELS * ROUND_BINS)
#: ``_lvl_smem``: declares the rounds' bins, ``i32 [LVL_WORDS]`` of the CTA's shared memory
#: (static: the launch adds it to the kernel's dynamic shared memory), and gives their
#: shared-window address; ``${:uid}`` names each copy of the asm apart
LVL_SMEM_ASM = tl.constexpr(".shared .align 16 .b32 pq_lvl${:uid}[%d];\n\tmov.u32 $0, pq_lvl${:uid};" %
                            LVL_WORDS.value)


@triton.jit
def _now():
    """The SM's nanosecond global timer (phase timing builds only, TIMER=1)."""
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def _code_row(cbase, cap, i: tl.constexpr, M, j):
    """Codes of subvector ``i`` for keys ``j`` (0 where i >= M or j >= cap)."""
    return tl.load(cbase + i * cap + j, mask=(j < cap) & (i < M), other=0)


@triton.jit
def _codes(cbase, cap, M, MP: tl.constexpr, j):
    """Codes of keys ``j`` for subvectors 0..3 (the last two only when MP > 2; else
    copies of the first, never read)."""
    c0 = _code_row(cbase, cap, 0, M, j)
    c1 = _code_row(cbase, cap, 1, M, j)
    if MP > 2:
        c2 = _code_row(cbase, cap, 2, M, j)
        c3 = _code_row(cbase, cap, 3, M, j)
    else:
        c2 = c0
        c3 = c0
    return c0, c1, c2, c3


@triton.jit
def _score(lut_row, K, M, MP: tl.constexpr, c0, c1, c2, c3, cand):
    """Ranks (``_rank_score``) of the scores of keys with codes c0..c3 (0 where not cand),
    the entries added in the order the combination scores were (m = 0, 1, ..), so both
    compare bit for bit."""
    sc = tl.load(lut_row + (c0.to(tl.int32) & (K - 1)), mask=cand, other=0.0)
    sc += tl.load(lut_row + K + (c1.to(tl.int32) & (K - 1)), mask=cand & (M > 1), other=0.0)
    if MP > 2:
        sc += tl.load(lut_row + 2 * K + (c2.to(tl.int32) & (K - 1)), mask=cand & (M > 2), other=0.0)
        sc += tl.load(lut_row + 3 * K + (c3.to(tl.int32) & (K - 1)), mask=cand & (M > 3), other=0.0)
    return _rank_score(sc)


@triton.jit
def _popc(x):
    """Set bits of each uint32 (SWAR)."""
    x = x - ((x >> 1) & 0x55555555)
    x = (x & 0x33333333) + ((x >> 2) & 0x33333333)
    x = (x + (x >> 4)) & 0x0F0F0F0F
    return ((x * 0x01010101) >> 24).to(tl.int32)


@triton.jit
def _group_masks(sc, cand, t_sure, t_maybe, lane_u):
    """Per 32-key group (rows of ``sc``, f32 ``[NW, 32]``): bit masks of the sure (``sc >=
    t_sure``) and maybe (``t_maybe <= sc < t_sure``) candidates (uint32 ``[NW]``), their
    popcounts and both packed, ``ps + (pm << 16)`` (one prefix sum for both counts: 16
    bits each, so TILE < 65536)."""
    sflag = cand & (sc >= t_sure)
    mflag = cand & (sc >= t_maybe) & (sc < t_sure)
    bs = tl.sum(sflag.to(tl.uint32) << lane_u[None, :], axis=1)  # distinct bits: sum = or
    bm = tl.sum(mflag.to(tl.uint32) << lane_u[None, :], axis=1)
    ps = _popc(bs)
    pm = _popc(bm)
    return bs, bm, ps, pm, ps + (pm << 16)


@triton.jit
def _take_masks(bs, bm, ps, pm, packed, carry_s, carry_m, need, NW: tl.constexpr):
    """The taken keys of [NW] 32-key groups from their sure / maybe bit masks ``bs``,
    ``bm`` (uint32), popcounts ``ps``, ``pm``, ``packed = ps + (pm << 16)`` and the row's
    sure / maybe keys before the first group: maybe keys are taken in position order
    while fewer than ``need`` are (cut inside at most one group per row). Returns (taken
    bits per group, taken keys of the row before each group, a loop bound >= every
    group's taken keys)."""
    excl = tl.cumsum(packed, axis=0) - packed
    es = carry_s + (excl & 0xFFFF)  # sure keys before each group
    em = carry_m + (excl >> 16)  # maybe keys before each group
    ex_t = es + tl.minimum(em, need)  # taken keys before each group
    xm = need - em  # maybe keys still wanted at each group
    tm = tl.where(xm >= pm, bm, 0)
    part = (xm > 0) & (xm < pm)  # at most one group per row: its lowest xm bits
    # one reduction for the loop bound (the most keys one group takes: its sure keys and
    # the maybe keys still wanted; not all its maybe keys, which fill whole groups where
    # one combination holds many keys tied at the threshold) and `part`
    got_m = tl.minimum(tl.maximum(xm, 0), pm)
    mx = tl.max((ps + got_m) | (part.to(tl.int32) << 8), axis=0)
    if mx > 255:
        rem = bm
        sel = tl.zeros([NW], tl.uint32)
        got = tl.zeros([NW], tl.int32)
        for _ in range(32):
            low = rem & (0 - rem)
            sel = tl.where(got < xm, sel | low, sel)
            got += (low != 0).to(tl.int32)
            rem = rem ^ low
        tm = tl.where(part, sel, tm)
    return bs | tm, ex_t, tl.where(mx > 255, 32, mx)


@triton.jit
def _store_heavy(slot0, ex_t, take, bound, base, wd):
    """Heavy entries: group ``g``'s taken bits, lowest first, at slots ``slot0 + ex_t[g] +
    i`` (i64 positions ``base + 32 g + bit``); ``bound`` >= every group's taken bits."""
    rem = take
    for it in range(0, bound):
        low = rem & (0 - rem)
        bit = _popc(low - 1)
        tl.store(slot0 + ex_t + it, (base + wd * 32 + bit).to(tl.int64), mask=rem != 0)
        rem = rem ^ low


@triton.jit
def _emit_masks(crow, lut_row, sl_row, w_row, cap, M, K, n, w0, k, s_sink, init_offset, t_sure, t_maybe, need,
                MP: tl.constexpr, TILE: tl.constexpr):
    """Emit for rows whose heavy picks all lie between the sink and the window
    (``init_offset >= s_sink``, ``w0 >= k``): list slots ``s_sink + rank`` (heavy),
    ``s_sink + k + (j - w0)`` (window). Keys as [TILE/32, 32]: per 32 keys a bit mask of
    the sure and of the maybe keys, the maybe ones taken in position order while fewer
    than ``need`` are, each taken key's rank from its mask's prefix count and its bit."""
    NW: tl.constexpr = TILE // 32
    wd = tl.arange(0, NW)
    lane = tl.arange(0, 32)
    lane_u = lane.to(tl.uint32)
    jt = wd[:, None] * 32 + lane[None, :]
    wty = w_row.dtype.element_ty
    n0, n1, n2, n3 = _codes(crow, cap, M, MP, jt)
    carry_s = 0  # sure keys before the tile
    carry_m = 0  # maybe keys before the tile
    for j0 in range(0, n, TILE):
        c0, c1, c2, c3 = n0, n1, n2, n3
        j = j0 + jt
        n0, n1, n2, n3 = _codes(crow, cap, M, MP, j + TILE)  # the next tile's, prefetched
        cand = j < w0
        sc = _score(lut_row, K, M, MP, c0, c1, c2, c3, cand)
        bs, bm, ps, pm, packed = _group_masks(sc, cand, t_sure, t_maybe, lane_u)
        tot = tl.sum(packed, axis=0)
        take, ex_t, bound = _take_masks(bs, bm, ps, pm, packed, carry_s, carry_m, need, NW)
        # weights: taken candidates and window keys
        wv = ((take[:, None] >> lane_u[None, :]) & 1) | (j >= w0).to(tl.uint32)
        tl.store(w_row + init_offset + j, wv.to(tl.float32).to(wty), mask=j < n)
        if j0 + TILE > w0:  # window keys in this tile
            wk = (j >= w0) & (j < n)
            tl.store(sl_row + s_sink + k + (j - w0), (j + init_offset).to(tl.int64), mask=wk)
        _store_heavy(sl_row + s_sink, ex_t, take, bound, j0 + init_offset, wd)
        carry_s += tot & 0xFFFF
        carry_m += tot >> 16


@triton.jit
def _emit_generic(crow, lut_row, sl_row, w_row, cap, M, K, n, w0, k, s_sink, ws, init_offset, t_sure, t_maybe, need,
                  MP: tl.constexpr, TILE: tl.constexpr):
    """Emit for any row: one prefix sum over each tile ranks the taken keys and places
    sink, heavy (incl. the lowest masked keys filling in for missing candidates) and
    window entries in one ascending list; equal values sort sink, heavy, window."""
    offs = tl.arange(0, TILE)
    wty = w_row.dtype.element_ty
    n0, n1, n2, n3 = _codes(crow, cap, M, MP, offs)
    carry_s = 0
    carry_m = 0
    for j0 in range(0, n, TILE):
        c0, c1, c2, c3 = n0, n1, n2, n3
        j = j0 + offs
        n0, n1, n2, n3 = _codes(crow, cap, M, MP, j + TILE)  # the next tile's, prefetched
        cand = j < w0
        sc = _score(lut_row, K, M, MP, c0, c1, c2, c3, cand)
        p = j + init_offset
        in_n = j < n
        fill = (j >= w0) & (j < k)  # fewer candidates than k: the lowest masked keys
        sflag = (cand & (sc >= t_sure)) | fill
        mflag = cand & (sc >= t_maybe) & (sc < t_sure)
        packed = sflag.to(tl.int32) + (mflag.to(tl.int32) << 16)
        excl = tl.cumsum(packed, axis=0) - packed
        sb = carry_s + (excl & 0xFFFF)
        mb = carry_m + (excl >> 16)
        take = sflag | (mflag & (mb < need))
        tb = sb + tl.minimum(mb, need)  # heavy entries before p
        tot = tl.sum(packed, axis=0)
        carry_s += tot & 0xFFFF
        carry_m += tot >> 16
        is_sink = p < s_sink
        is_win = (p >= ws) & in_n
        pv = p.to(tl.int64)
        # equal values sort sink copy, heavy copy, window copy
        tl.store(sl_row + tl.minimum(p + 1, s_sink) + tb + tl.maximum(p - ws, 0), pv, mask=take)
        if j0 + init_offset < s_sink:  # this tile holds sink positions
            tl.store(sl_row + p + tb + tl.maximum(p - ws, 0), pv, mask=is_sink)
        if j0 + init_offset + TILE > ws:  # this tile holds window positions
            tl.store(sl_row + tl.minimum(p + 1, s_sink) + tb + take.to(tl.int32) + (p - ws), pv, mask=is_win)
        tl.store(w_row + p, (is_sink | take | is_win).to(tl.float32).to(wty), mask=in_n)


@triton.jit
def _quantize_group(k_ptr, cent_ptr, phi_ptr, codes_ptr, b, g, bg, k_sb, k_sh, k_ss, M, K, d_s, d_c, n_old, n, cap,
                    init_offset, metric_ip, BLOCK_C: tl.constexpr, BLOCK_DS: tl.constexpr):
    """Codes of KV head ``(b, g)``'s new keys ``n_old <= j < n`` (spec step 1)."""
    krow = b.to(tl.int64) * k_sb + g.to(tl.int64) * k_sh
    for tq in range(n_old, n):
        for m in range(M):
            cbase = ((bg * M + m) * K) * d_c
            phi = tl.load(phi_ptr + (bg * M + m) * metric_ip)  # euclidean: phi_ptr[0], unused
            ct = _nearest(k_ptr, krow + (init_offset + tq) * k_ss + m * d_s, cent_ptr, cbase, phi, d_s, d_c, K,
                          metric_ip, BLOCK_C, BLOCK_DS)
            tl.store(codes_ptr + (bg * M + m) * cap + tq, ct.to(tl.uint8))


@triton.jit
def _quantize_cta(k_ptr, cent_ptr, phi_ptr, codes_ptr, b, h, g, bg, G, k_sb, k_sh, k_ss, M, K, d_s, d_c, n_old, n, cap,
                  init_offset, metric_ip, BLOCK_C: tl.constexpr, BLOCK_DS: tl.constexpr):
    """The work of a row's second CTA (``program_id(1) == 1``, in ``pq_hist`` and
    ``pq_thresh``): the new keys' codes, one CTA per KV group (its first head's row);
    the rows never read them this step (the new keys are not candidates)."""
    if h % G == 0:
        _quantize_group(k_ptr, cent_ptr, phi_ptr, codes_ptr, b, g, bg, k_sb, k_sh, k_ss, M, K, d_s, d_c, n_old, n,
                        cap, init_offset, metric_ip, BLOCK_C, BLOCK_DS)


@triton.jit
def _row_sizes(S, init_offset, window, heavy, d_s, metric_ip):
    """A row's quantized keys ``n = S - init_offset``, its candidates' end ``w0 = max(S -
    window' - init_offset, 0)`` (candidates are ``j < w0``), ``k = min(heavy, n)`` and the
    centroid row length ``d_c = d_s + metric_ip``."""
    n = S - init_offset
    return n, tl.maximum(S - tl.minimum(window, S) - init_offset, 0), tl.minimum(heavy, n), d_s + metric_ip


@triton.jit
def _combos(codes_ptr, bg, M, bits, cap, jd, jm, MP: tl.constexpr):
    """The code combination ``sum_m code_m << ((M - 1 - m) * bits)`` of KV head ``bg``'s
    keys ``jd`` (i32 ``[DT]``, those with ``jm``; 0 elsewhere)."""
    mm = tl.arange(0, MP)
    mvalid = mm < M
    mrow = (bg * M + mm) * cap
    shift = tl.where(mvalid, (M - 1 - mm) * bits, 0)
    cd = tl.load(codes_ptr + mrow[:, None] + jd[None, :], mask=mvalid[:, None] & jm[None, :], other=0)
    return tl.sum(cd.to(tl.int32) << shift[:, None], axis=0)


@triton.jit
def _hist_move(codes_ptr, hist_row, histn_ptr, r, bg, M, bits, cap, w0, MP: tl.constexpr, DT: tl.constexpr):
    """Move row ``r``'s combination histogram from the keys ``j < histn[r]`` it counts
    to the candidates ``j < w0`` (atomics), and set ``histn[r] = w0``. A CTA barrier
    orders every thread's read of ``histn[r]`` before the store: without it a warp that
    finished its share of the move could set ``histn[r] = w0`` before a slower warp read
    it, and that warp would skip its keys (a miscount that depends on warp timing)."""
    hn = tl.load(histn_ptr + r)
    tl.debug_barrier()
    lo = tl.minimum(hn, w0)
    hi = tl.maximum(hn, w0)
    sign = tl.where(hn < w0, 1, -1)
    for j0 in range(lo, hi, DT):
        jd = j0 + tl.arange(0, DT)
        jm = jd < hi
        combo = _combos(codes_ptr, bg, M, bits, cap, jd, jm, MP)
        tl.atomic_add(hist_row + combo, tl.full([DT], 1, tl.int32) * sign, mask=jm, sem="relaxed")
    tl.store(histn_ptr + r, w0)


@triton.jit
def _head_lut(q_ptr, cent_ptr, lut_row, q_sb, q_sh, b, h, bg, M, K, d_s, d_c, BLOCK_C: tl.constexpr,
              BLOCK_DS: tl.constexpr):
    """Head ``(b, h)``'s lookup table ``lut[m, c] = <q_m, centroids[b,g,m,c,:d_s]>`` into
    ``lut_row`` (f32 ``[M, K]``)."""
    qrow = b.to(tl.int64) * q_sb + h.to(tl.int64) * q_sh
    for m in range(M):
        _store_lut(q_ptr, qrow + m * d_s, cent_ptr, ((bg * M + m) * K) * d_c, d_s, d_c, K, lut_row + m * K, BLOCK_C,
                   BLOCK_DS)


@triton.jit
def _combo_scores(hist_row, lut_row, M, K, bits, NC: tl.constexpr):
    """Per combination ``cc`` (0..NC): candidate keys carrying it and the rank of its score
    (``_rank_score``: the order of the scores, NaN last, always finite), the lookup-table
    entries added in the order m = 0, 1, .. (as ``_score`` adds them)."""
    cc = tl.arange(0, NC)
    cvalid = cc < (1 << (M * bits))
    cnt = tl.load(hist_row + cc, mask=cvalid, other=0, cache_modifier=".cg")
    s = tl.zeros([NC], tl.float32)
    for m in range(M):
        dig = (cc >> ((M - 1 - m) * bits)) & (K - 1)
        s += tl.load(lut_row + m * K + dig, mask=cvalid, other=0.0)
    return cnt, _rank_score(s)


# INTERPRETED (from pq_select): Triton's interpreter reduces tuples one element at a time
# in Python (minutes per check), so there the 2-, 3- and 8-way tuple reductions below take
# one one-operand reduction each (same results)


@triton.jit
def _min_max(a0, b0, a1, b1):
    return tl.minimum(a0, a1), tl.maximum(b0, b1)


@triton.jit
def _add_max(a0, b0, a1, b1):
    return a0 + a1, tl.maximum(b0, b1)


@triton.jit
def _red_min_max(a, b):
    """``(min(a), max(b))`` over axis 0 in one reduction (one barrier sequence)."""
    if INTERPRETED:
        return tl.min(a, axis=0), tl.max(b, axis=0)
    else:
        return tl.reduce((a, b), 0, _min_max)


@triton.jit
def _max_max(a0, b0, a1, b1):
    return tl.maximum(a0, a1), tl.maximum(b0, b1)


@triton.jit
def _red_max_max(a, b):
    """``(max(a), max(b))`` over axis 0 in one reduction."""
    if INTERPRETED:
        return tl.max(a, axis=0), tl.max(b, axis=0)
    else:
        return tl.reduce((a, b), 0, _max_max)


@triton.jit
def _red_add_max(a, b):
    """``(sum(a), max(b))`` over axis 0 in one reduction."""
    if INTERPRETED:
        return tl.sum(a, axis=0), tl.max(b, axis=0)
    else:
        return tl.reduce((a, b), 0, _add_max)


@triton.jit
def _add4_min4(a0, b0, c0, d0, e0, f0, g0, h0, a1, b1, c1, d1, e1, f1, g1, h1):
    return (a0 + a1, b0 + b1, c0 + c1, d0 + d1, tl.minimum(e0, e1), tl.minimum(f0, f1), tl.minimum(g0, g1),
            tl.minimum(h0, h1))


@triton.jit
def _red_add4_min4(a, b, c, d, e, f, g, h):
    """The sums of a, b, c, d and the minima of e, f, g, h over axis 0 in one reduction."""
    if INTERPRETED:
        return (tl.sum(a, axis=0), tl.sum(b, axis=0), tl.sum(c, axis=0), tl.sum(d, axis=0), tl.min(e, axis=0),
                tl.min(f, axis=0), tl.min(g, axis=0), tl.min(h, axis=0))
    else:
        return tl.reduce((a, b, c, d, e, f, g, h), 0, _add4_min4)


@triton.jit
def _min_max_min(a0, b0, c0, a1, b1, c1):
    return tl.minimum(a0, a1), tl.maximum(b0, b1), tl.minimum(c0, c1)


@triton.jit
def _red_min_max_min(a, b, c):
    """``(min(a), max(b), min(c))`` over axis 0 in one reduction."""
    if INTERPRETED:
        return tl.min(a, axis=0), tl.max(b, axis=0), tl.min(c, axis=0)
    else:
        return tl.reduce((a, b, c), 0, _min_max_min)


@triton.jit
def _top_cut(cnt, s, alive, need):
    """The cut before the rounds: ``(lo, slo, shi)`` with at least ``need`` keys scoring
    ``>= lo`` (so the threshold is ``>= lo``): ``lo`` is the bottom of the narrowest of
    the top 1/4, 1/16, 1/64, 1/256 of the live score range that holds that many, else the
    range's bottom; ``slo``, ``shi`` are the min and max score of the live combinations
    scoring ``>= lo`` (the max is the range's, the top lies in every slice; each slice's
    min comes from the reduction that counts it). One two-way and one eight-way
    reduction, no atomics: the rounds then count only the few combinations near the
    top."""
    slo, shi = _red_min_max(tl.where(alive, s, float("inf")), tl.where(alive, s, -float("inf")))
    span = shi - slo
    c1 = shi - span * 0.25
    c2 = shi - span * 0.0625
    c3 = shi - span * 0.015625
    c4 = shi - span * 0.00390625
    w = tl.where(alive, cnt, 0)
    i1 = alive & (s >= c1)
    i2 = alive & (s >= c2)
    i3 = alive & (s >= c3)
    i4 = alive & (s >= c4)
    inf = float("inf")
    n1, n2, n3, n4, m1, m2, m3, m4 = _red_add4_min4(
        tl.where(i1, w, 0), tl.where(i2, w, 0), tl.where(i3, w, 0), tl.where(i4, w, 0), tl.where(i1, s, inf),
        tl.where(i2, s, inf), tl.where(i3, s, inf), tl.where(i4, s, inf))
    lo = tl.where(n4 >= need, c4, tl.where(n3 >= need, c3, tl.where(n2 >= need, c2, tl.where(n1 >= need, c1, slo))))
    slo = tl.where(n4 >= need, m4, tl.where(n3 >= need, m3, tl.where(n2 >= need, m2, tl.where(n1 >= need, m1, slo))))
    return lo, slo, shi


@triton.jit
def _lvl_smem():
    """The shared-window address (i32) of the rounds' bins in this CTA's shared memory
    (``LVL_SMEM_ASM``; not zeroed)."""
    return tl.inline_asm_elementwise(LVL_SMEM_ASM, "=r", [], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _lvl_add(base, i, v, m):
    """Adds ``v`` to bin ``i`` of the rounds' bins at ``base`` where ``m`` (shared-memory
    atomics)."""
    tl.inline_asm_elementwise("{ .reg .pred %p; setp.ne.s32 %p, $3, 0; @%p red.shared.add.s32 [$1], $2; mov.b32 $0, 0; }",
                              "=r,r,r,r", [base + 4 * i, v, m.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _lvl_read(base, i):
    """Bins ``i`` of the rounds' bins at ``base``."""
    return tl.inline_asm_elementwise("ld.shared.b32 $0, [$1];", "=r,r", [base + 4 * i], dtype=tl.int32, is_pure=False,
                                     pack=1)


@triton.jit
def _lvl_store(base, i, v):
    """Stores ``v`` (i32, the shape of ``i``) into words ``i`` of the static shared memory at
    shared-window address ``base`` (the rounds' bins, or ``pq_range``'s other arrays)."""
    tl.inline_asm_elementwise("st.shared.b32 [$1], $2;\n\tmov.b32 $0, 0;", "=r,r,r", [base + 4 * i, v], dtype=tl.int32,
                              is_pure=False, pack=1)


@triton.jit
def _near_tie(lo, hi):
    """Whether the scores of any two ranks (``_rank_score``) in ``[lo, hi]`` lie within half
    the spec's tolerance, ``5e-5 (1 + |score|)``, of each other: keys of such scores are
    near-ties, which a threshold may take in position order (``_rounds``, ``pq_range``'s
    rounds), the other half of the tolerance left to the f32 scores' rounding. Up to
    ``RANK_LIN`` in magnitude a rank is its score: ``hi - lo <= 5e-5 (1 + min(|lo|,
    |hi|))``. Past it a rank step of ``w`` is ``w * 2^16`` ulps of a score ``|s| >= 2^e``
    whose ulp is ``2^(e - 23)``: a relative change of at most ``w / 128``, so there (and
    for a range reaching past it) ``hi - lo <= 128 * 5e-5``. (The linear rule alone would
    let a range of ranks past ``RANK_LIN`` be 0.82 wide: scores up to 0.6 % apart, where
    queries and centroids share a large component.)"""
    w = hi - lo
    lin = tl.maximum(tl.abs(lo), tl.abs(hi)) <= RANK_LIN
    return tl.where(lin, w <= 5e-5 * (1.0 + tl.minimum(tl.abs(lo), tl.abs(hi))), w <= 128.0 * 5e-5)


@triton.jit
def _rounds(cnt, s, need, NC: tl.constexpr, NB: tl.constexpr, LEVELS: tl.constexpr):
    """The threshold on the combinations (``cnt`` keys of score ``s`` each): up to LEVELS
    rounds of an NB-bin histogram over the score range still in play, each keeping the
    bin that holds the ``need``-th largest key. Returns ``(t_sure, t_maybe, need)``: every
    key scoring ``>= t_sure`` is taken, those in ``[t_maybe, t_sure)`` in position order
    until ``need`` more are (bounds are ``inf`` where a class is empty). The combinations
    below ``_top_cut`` are out of play from the start, and the cut gives the first
    round's range. Per round: the atomics, a barrier, one scan, one two-way reduction for
    the bin and one three-way reduction for the next round's range and the sure bound; a
    round whose range holds one score, or only near-ties (``_near_tie``), is skipped, with
    no reduction (the range is already known). A round costs ~2.5 us of a row's chain,
    and a launch lasts as long as its slowest row: at the practical (2, 6) shape most rows
    resolve in two rounds, and the few whose second round left two combinations of
    near-equal scores took a third (8.7-9.0 us of rounds against 6.1-6.7; NOTES.md, "the
    threshold rounds stop at near-ties"). The bins are ``LEVELS * NB`` i32 of the CTA's
    shared memory (``_lvl_smem``, zeroed first): shared atomics, a barrier and shared
    loads, no global round trip. Triton's interpreter runs no PTX: there each round's bins are 31
    ``tl.histogram`` s of the combinations' bins, one per bit of their counts (the same
    counts)."""
    tl.static_assert(LEVELS * NB <= LVL_WORDS)
    bins = tl.arange(0, NB)
    if not INTERPRETED:
        base = _lvl_smem()
        for lv in tl.static_range(LEVELS):
            _lvl_store(base, lv * NB + bins, tl.zeros_like(bins))
        tl.debug_barrier()  # every bin zero before any round's atomics
    alive = cnt > 0
    sure = cnt < 0
    lo, slo, shi = _top_cut(cnt, s, alive, need)
    alive = alive & (s >= lo)
    t_sure = tl.full([], float("inf"), tl.float32)
    for lv in tl.static_range(LEVELS):
        # else every remaining combination has one score, or their scores are near-ties
        # (taken in position order): done
        if (slo < shi) & (not _near_tie(slo, shi)):
            t = tl.maximum((s - slo) / (shi - slo) * NB, 0.0)
            bn = tl.minimum(t.to(tl.int32), NB - 1)
            if INTERPRETED:
                # weighted by the counts (0 <= cnt < 2^31) one bit plane at a time
                hc = tl.zeros([NB], tl.int32)
                for bit in tl.static_range(31):
                    hc += tl.histogram(bn, NB, mask=alive & (((cnt >> bit) & 1) != 0)).to(tl.int32) << bit
            else:
                _lvl_add(base, lv * NB + bn, cnt, alive)
                tl.debug_barrier()
                hc = _lvl_read(base, lv * NB + bins)
            suffix = tl.cumsum(hc, axis=0, reverse=True)  # keys in bins >= b, non-increasing
            # bins with suffix >= need are 0 .. bstar; above = suffix[bstar + 1] (keys in
            # the bins above bstar), the largest suffix below need
            nb_ge, above = _red_add_max((suffix >= need).to(tl.int32), tl.where(suffix < need, suffix, 0))
            bstar = nb_ge - 1
            sure = sure | (alive & (bn > bstar))
            alive = alive & (bn == bstar)
            need = need - above
            # sure only grows and alive only shrinks in a round: after the last one run,
            # these are the min over every sure combination and the live range
            slo, shi, t_sure = _red_min_max_min(tl.where(alive, s, float("inf")), tl.where(alive, s, -float("inf")),
                                                tl.where(sure, s, float("inf")))
    # the classes are score ranges: every sure combination scores above every one still
    # in play, which score above every other candidate (the bins are monotone in the
    # score), and the emit recomputes each key's score with the very same float
    # additions, so comparing with these bounds reproduces the per-combination classes;
    # t_maybe is the min of the combinations still in play (slo)
    return t_sure, slo, need


@triton.jit
def _stamp(TIMER: tl.constexpr):
    """The global timer where TIMER, else 0."""
    if TIMER:
        t = _now()
    else:
        t = tl.zeros([], tl.int64)
    return t


@triton.jit
def _store_stamps(lut_ptr, r64, M, K, t0, t1, t2, t3, t4, t5):
    """Phase timestamps (ns) over the row's lookup-table scratch (dead by then): start,
    histogram moved, lookup table, combination scores, threshold, end."""
    tb_ptr = lut_ptr.to(tl.pointer_type(tl.int64), bitcast=True) + r64 * (M * K // 2)
    tl.store(tb_ptr + 0, t0)
    tl.store(tb_ptr + 1, t1)
    tl.store(tb_ptr + 2, t2)
    tl.store(tb_ptr + 3, t3)
    tl.store(tb_ptr + 4, t4)
    tl.store(tb_ptr + 5, t5)


@triton.jit
def _row_ids(r, H, G):
    """Row ``r = b*H + h``'s ids: ``(r64, b, h, g, bg)`` with KV head ``g = h // G`` and
    ``bg = b*H_kv + g`` (i64), the index of its codes, centroids and phi."""
    b = r // H
    h = r % H
    g = h // G
    return r.to(tl.int64), b, h, g, b.to(tl.int64) * (H // G) + g


@triton.jit
def _row_threshold(q_ptr, cent_ptr, codes_ptr, hist_ptr, histn_ptr, lut_row, r, r64, b, h, bg, q_sb, q_sh,
                   M, K, bits, d_s, d_c, cap, w0, k, MP: tl.constexpr, NC: tl.constexpr, NB: tl.constexpr,
                   LEVELS: tl.constexpr, DT: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_DS: tl.constexpr,
                   TIMER: tl.constexpr):
    """Row ``r``'s steps 1-3: its combination histogram moved to the candidates ``j <
    w0``, the head's lookup table into ``lut_row`` (f32 ``[M, K]``), the combination
    scores and the threshold rounds over the ``min(k, w0)`` heavy picks among the
    candidates. Returns ``(s, t_sure, t_maybe, need, t1, t2, t3, t4)``: the scores per
    combination (f32 ``[NC]``), ``_rounds``' bounds and ``need``, the phase stamps."""
    hist_row = hist_ptr + r64 * NC
    _hist_move(codes_ptr, hist_row, histn_ptr, r, bg, M, bits, cap, w0, MP, DT)
    t1 = _stamp(TIMER)
    _head_lut(q_ptr, cent_ptr, lut_row, q_sb, q_sh, b, h, bg, M, K, d_s, d_c, BLOCK_C, BLOCK_DS)
    tl.debug_barrier()  # the histogram's atomics and the table's stores, for every thread
    t2 = _stamp(TIMER)
    cnt, s = _combo_scores(hist_row, lut_row, M, K, bits, NC)
    t3 = _stamp(TIMER)
    t_sure, t_maybe, need = _rounds(cnt, s, tl.minimum(k, w0), NC, NB, LEVELS)
    t4 = _stamp(TIMER)
    return s, t_sure, t_maybe, need, t1, t2, t3, t4


@triton.jit
def pq_hist_kernel(
    q_ptr, k_ptr, cent_ptr, phi_ptr, codes_ptr, hist_ptr, histn_ptr, lut_ptr, sl_ptr, len_ptr,
    w_ptr,  #
    q_sb, q_sh, k_sb, k_sh, k_ss,  #
    H, G, M, K, bits, d_s, S, n_old, cap, sink, window, heavy, init_offset, metric_ip,  #
    MP: tl.constexpr, NC: tl.constexpr, NB: tl.constexpr, LEVELS: tl.constexpr, TILE: tl.constexpr,
    DT: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_DS: tl.constexpr, TIMER: tl.constexpr = 0,
):
    """See the module docstring and README.md (launch contract)."""
    tl.static_assert(TILE < 65536)  # two 16-bit counts share one int32 in the scan
    r = tl.program_id(0)
    r64, b, h, g, bg = _row_ids(r, H, G)
    n, w0, k, d_c = _row_sizes(S, init_offset, window, heavy, d_s, metric_ip)
    s_sink = tl.minimum(sink, S)
    s_win = tl.minimum(window, S)
    ws = S - s_win

    if tl.program_id(1) == 1:
        # 5. the new keys' codes, off the rows' critical path
        _quantize_cta(k_ptr, cent_ptr, phi_ptr, codes_ptr, b, h, g, bg, G, k_sb, k_sh, k_ss, M, K, d_s, d_c, n_old, n,
                      cap, init_offset, metric_ip, BLOCK_C, BLOCK_DS)
    else:
        t0 = _stamp(TIMER)
        # 1-3. the combination histogram moved to the candidates j < w0, this head's
        # lookup table (into scratch: the emit scores keys with it), the threshold
        lut_row = lut_ptr + r64 * M * K
        _, t_sure, t_maybe, need, t1, t2, t3, t4 = _row_threshold(
            q_ptr, cent_ptr, codes_ptr, hist_ptr, histn_ptr, lut_row, r, r64, b, h, bg, q_sb, q_sh, M, K,
            bits, d_s, d_c, cap, w0, k, MP, NC, NB, LEVELS, DT, BLOCK_C, BLOCK_DS, TIMER)
        # 4. one pass over the row: classify, rank, emit
        total = s_sink + k + s_win
        sl_row = sl_ptr + r64 * total
        _row_pass(codes_ptr + bg * M * cap, lut_row, sl_row, w_ptr + r64 * S, cap, M, K, n, w0, k, s_sink, ws,
                  init_offset, t_sure, t_maybe, need, MP, TILE)
        tl.store(len_ptr + r64, total.to(tl.int64))
        t5 = _stamp(TIMER)
        if TIMER:
            _store_stamps(lut_ptr, r64, M, K, t0, t1, t2, t3, t4, t5)


@triton.jit
def _row_pass(crow, lut_row, sl_row, w_row, cap, M, K, n, w0, k, s_sink, ws, init_offset, t_sure, t_maybe, need,
              MP: tl.constexpr, TILE: tl.constexpr):
    """Step 4 of ``pq_hist`` (and ``pq_index``'s fallback): one pass over the row's codes
    ``crow`` writing its ``sparse_list`` and ``weight_list`` rows from the class bounds."""
    wty = w_row.dtype.element_ty
    offs = tl.arange(0, TILE)
    # positions before the first quantized key: sink, zeros (and window, on tiny S)
    for p0 in range(0, init_offset, TILE):
        p = p0 + offs
        pm = p < init_offset
        is_sink = p < s_sink
        is_win = p >= ws
        tl.store(sl_row + p + tl.maximum(p - ws, 0), p.to(tl.int64), mask=pm & is_sink)
        tl.store(sl_row + tl.minimum(p + 1, s_sink) + (p - ws), p.to(tl.int64), mask=pm & is_win)
        tl.store(w_row + p, (is_sink | is_win).to(tl.float32).to(wty), mask=pm)
    # the quantized keys j = p - init_offset: heavy picks among the candidates j < w0,
    # window keys j >= w0. Common case (no heavy position among the sink ones, k
    # candidates or more): the taken keys as bit masks per 32 keys, ranked per mask.
    # Else the generic merge (duplicates between sink / heavy / fill / window).
    if (init_offset >= s_sink) & (w0 >= k):
        _emit_masks(crow, lut_row, sl_row, w_row, cap, M, K, n, w0, k, s_sink, init_offset, t_sure, t_maybe, need,
                    MP, TILE)
    else:
        _emit_generic(crow, lut_row, sl_row, w_row, cap, M, K, n, w0, k, s_sink, ws, init_offset, t_sure, t_maybe,
                      need, MP, TILE)


# ----------------------------------------------------------------------------------
# declarations for the build

DTYPES = ("fp32", "bf16", "fp16")
MPS = (2, 4)  # code rows loaded per key: M <= MP
# (TIMER, the phase stamps, stays at its default 0 in built variants: benches/hist_kernel.py
# sets it in its own JIT builds)
FIXED = {"NC": 4096, "NB": ROUND_BINS, "LEVELS": ROUND_LEVELS, "DT": 1024, "BLOCK_C": 64, "BLOCK_DS": 64}
TUNED = {("fp32", "fp32", 2), ("bf16", "bf16", 2)}


def _args(qt, wt):
    return (
        ptr("q_ptr", qt, False), ptr("k_ptr", qt, False), ptr("cent_ptr", "fp32"), ptr("phi_ptr", "fp32", False),
        ptr("codes_ptr", "u8"), ptr("hist_ptr", "i32"), ptr("histn_ptr", "i32"),
        ptr("lut_ptr", "fp32"), ptr("sl_ptr", "i64"), ptr("len_ptr", "i64"),
        ptr("w_ptr", wt, False),
        i64("q_sb"), i64("q_sh"), i64("k_sb"), i64("k_sh"), i64("k_ss"),
        i32("H"), i32("G"), i32("M"), i32("K"), i32("bits"), i32("d_s"), i32("S"), i32("n_old"),
        i32("cap", div16=True), i32("sink"), i32("window"), i32("heavy"), i32("init_offset"), i32("metric_ip"),
    )


def _variants(qt, wt, mp):
    # measured on the H100 (NOTES.md, "a cheaper emit for `pq_hist`", JIT harness): with M <= 2, TILE 8192 and
    # 8 warps was the fastest (reference 30.2 us, large 77.1 us) although it spills (ptxas:
    # 308 bytes of spill stores); TILE 4096 w8 (no spills) 32.9 / 86.9 us. sm_80 and MP=4 (more code rows per
    # key) keep TILE 4096, which does not spill there.
    d90 = {"TILE": 8192 if mp == 2 else 4096}
    d80 = {"TILE": 4096}
    if (qt, wt, mp) in TUNED:
        # (16 warps and TILE 2048 were never faster: dropped to keep ptx_cache small)
        v90 = grid(d90, 8, 1, TILE=(4096, 8192))
    else:
        v90 = single(d90, 8, 1)
    return {80: single(d80, 8, 1), 90: v90}


KERNELS = []
for _qt in DTYPES:
    for _wt in DTYPES:
        for _mp in MPS:
            KERNELS.append(
                Kernel(name=f"pq_hist.m{_mp}.q_{_qt}.w_{_wt}", fn=pq_hist_kernel, args=_args(_qt, _wt),
                       fixed=dict(FIXED, MP=_mp), variants=_variants(_qt, _wt, _mp)))
