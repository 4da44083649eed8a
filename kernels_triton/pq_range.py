"""The split path's threshold for any number of code combinations (``K^M > 4096``, or M > 4):
a select over the keys' scores by rounds of histograms, in place of ``pq_thresh``'s
combination histogram.

``pq_thresh`` finds the top-k threshold on the ``K^M`` code combinations, which needs
``K^M <= 4096`` (PQCache's (M, bits) = (2, 6)). With (2, 8) or (4, 8) there are 65536 or
2^32 combinations, so here the threshold is found on the keys themselves. Each key's
score is the rank ``x = _rank_score(sum_m lut[m, code_m])``, computed exactly as
``pq_emit`` computes it (``_part_scores``). Rounds of a histogram narrow a range ``[a,
b)`` of ranks that holds the ``need``-th largest candidate still to place:

* a key's bin is ``floor((x - a) * NB / (b - a))`` clamped to ``0 .. NB - 1``
  (``_vbin``): each operation rounded once, so the bin never decreases as ``x`` grows;
* the row's last CTA of a round keeps the bin ``d`` holding the ``need``-th largest
  candidate (``need`` less the keys in the bins above it) and finds its exact rank
  bounds by a search over the floats (``_bin_edges``: the lowest rank in bin ``d`` and
  the lowest in ``d + 1``, tested 32 floats at a time), so the bin is exactly the keys ``lo <= x < hi`` and
  ``pq_emit``'s comparisons select the same keys;
* the row is resolved when that bin holds one value, or is no wider than ``5e-5 (1 +
  |x|)`` (half the spec's tolerance ``1e-4 (1 + |score|)``: the keys in it are near-ties,
  taken in position order); else the next round bins ``[lo, hi)``.

Then ``pq_emit`` gets the split path's class bounds: ``t_sure = hi`` (every candidate at
or above it is taken), ``t_maybe = lo``, ``need`` (candidates in ``[lo, hi)`` taken in
position order while fewer than ``need`` are). The first round has ``NB0 = 256`` bins,
counted per CTA (``tl.histogram``) before its global atomics: with 4096 bins every key's
atomic met the few bins where most keys fall (measured: that round then cost more than
the others together); later rounds have 4096 bins and only the few keys in the range
reach an atomic. Two rounds are launched: after them a row's bin is at most ``(b - a) /
2^20`` wide, which resolves every row whose scores span less than about ``50 (1 + |x|)``
(the usual case). Ranks span at most 2^16, so one more round of 4096 bins always
resolves (2^-16, under ``5e-5``): the closing CTA of the last launched round runs it alone
over its row for the rare row still open (huge scores), instead of a third launch every
step.

``pq_rlut_kernel``, grid ``(B*H, M, cdiv(K, BLOCK_C))``: CTA ``(r, m, i)`` writes entries
``i*BLOCK_C ..`` of row ``m`` of head ``r``'s lookup table ``lut f32 [B*H, M, K]`` (one
tile of centroids each: the table's latency chain spread over many CTAs). Where ``h`` is
the first head of its KV group and the step has a new key (at most one: the host runs
``pq_quant`` first for more), the same CTA also finds that key's nearest centroid of its
block (``_block_nearest``, one block of ``_nearest``'s loop) into ``qd f32 / qc i32
[B*H_kv, M, cdiv(K, BLOCK_C)]``; the last round combines the blocks into the code as
``_nearest`` does (``_store_code``), off the first round's path. CTA ``(r, 0, 0)`` also
zeroes the emit's part flags ``flag i64 [B*H, NP]`` and (row 0) its ticket counter ``ctr
i32 [1]``.

``pq_rround_kernel``, grid ``(LP, B*H)``, ``LP = cdiv(w0, TILE)``, launched twice
(``ROUND`` 0, 1): CTA ``(c, r)`` scores candidates ``c*TILE ..`` of row ``r`` and adds
those in the range to the row's histogram ``rhist i32 [B*H, NB]`` (global atomics), then
takes a ticket on the row's counter ``rtick i32 [B*H]``; the row's last CTA to arrive (no
CTA waits for another) closes the round and leaves the histogram and the counter zero.
Round 0 starts every row from its lookup table: ``[a, b)`` = the ranks of ``lo = sum_m
min_c lut[m, c]`` and just above ``hi`` (maxima), added in the keys' order, so by the
monotonicity of rounding every key lies in it; the full rank range where the table holds
a non-finite entry; ``need = min(k, w0)``. Later rounds read the row's state ``rst i64
[B*H, 4]`` (``a``, ``b`` as f32 bits, ``need``, resolved) and exit at once on a resolved
row. The closing CTA writes ``bnd f32 [B*H, 2]`` = ``(t_sure, t_maybe)`` and ``need i32
[B*H]`` when the row resolves (``k = 0``: nothing is taken).

Launch contract: README.md in this directory. A row whose candidates are at most ``k``
(``w0 <= k``) takes them all: round 0 resolves it at once (``t_sure`` below every rank,
``need = 0``), ``pq_emit`` adding the lowest masked keys up to ``k``. Host
preconditions: no new key among the candidates (``w0 <= n_old``) and at most one new
key.
"""

import triton
import triton.language as tl

from kspec import Kernel, grid, i32, i64, ptr, single
from pq_select import RANK_INF, RANK_NAN, _block_nearest, _lut_tile, _rank_score, _row_dots
from pq_hist import _row_ids, _row_sizes
from pq_split import _part_scores

#: the class bounds of a row with nothing to pick: above every rank (|rank| <= 32768)
NO_PICK = tl.constexpr(65536.0)
#: floats tested at once by the closing CTA's search for a bin's exact bounds (``_bin_edges``)
SEARCH = tl.constexpr(32)


@triton.jit
def _ukey(sc):
    """A rank (finite f32, any shape) as an unsigned key in the same order (int64 in ``[0,
    2^32)``): the float's bits with the sign bit flipped for positives and every bit for
    negatives; ``-0.0`` as ``+0.0``, so equal ranks have equal keys."""
    b = sc.to(tl.uint32, bitcast=True)
    b = tl.where(b == 0x80000000, 0, b)
    u = tl.where((b >> 31) != 0, b ^ 0xFFFFFFFF, b | 0x80000000)
    return u.to(tl.int64)


@triton.jit
def _from_ukey(u):
    """The rank (f32) whose key (``_ukey``) is ``u`` (int64 scalar in ``[0, 2^32)``)."""
    w = u.to(tl.uint32)
    b = tl.where((w >> 31) != 0, w & 0x7FFFFFFF, w ^ 0xFFFFFFFF)
    return b.to(tl.float32, bitcast=True)


@triton.jit
def _pick(sc, mm, m: tl.constexpr):
    """Entry ``m`` of the per-subvector vector ``sc`` (f32 ``[MP]``)."""
    return tl.sum(tl.where(mm == m, sc, 0.0), axis=0)


@triton.jit
def _score_bound(ext, mm, M, MP: tl.constexpr):
    """``sum_m ext[m]`` over ``m < M``, added as ``_part_scores`` adds a key's entries
    (m = 0, 1, ..; + 0.0 for m >= M), so a key's score is at least (at most) this sum of
    the per-subvector minima (maxima)."""
    s = _pick(ext, mm, 0)
    for mi in tl.static_range(1, MP):
        s += tl.where(M > mi, _pick(ext, mm, mi), 0.0)
    return s


@triton.jit
def _rank_bounds(lut_row, M, K, MP: tl.constexpr, KP: tl.constexpr):
    """``[a, b)``: a rank range holding every key's rank, from the head's table (f32
    ``[M, K]``): the ranks of the sums of the per-subvector minima and (just above) maxima;
    ``[RANK_NAN, RANK_INF]`` where an entry is not finite."""
    mm = tl.arange(0, MP)
    cc = tl.arange(0, KP)
    on = (mm[:, None] < M) & (cc[None, :] < K)
    t = tl.load(lut_row + mm[:, None] * K + cc[None, :], mask=on, other=0.0)
    bad = on & ((t != t) | (tl.abs(t) == float("inf")))
    finite = tl.sum(bad.to(tl.int32)) == 0
    lo = _score_bound(tl.min(tl.where(on, t, float("inf")), axis=1), mm, M, MP)
    hi = _score_bound(tl.max(tl.where(on, t, -float("inf")), axis=1), mm, M, MP)
    a = tl.where(finite, _rank_score(lo), RANK_NAN)
    top = tl.where(finite, _rank_score(hi), RANK_INF)
    return a, _next_up(top)


@triton.jit
def _next_up(x):
    """The next float above finite ``x`` (f32; the smallest normal above a zero)."""
    bits = x.to(tl.int32, bitcast=True)
    up = tl.where(x > 0.0, bits + 1, bits - 1).to(tl.float32, bitcast=True)
    return tl.where(x == 0.0, 1.1754943508222875e-38, up)


@triton.jit
def _vbin(x, a, sc, NB: tl.constexpr):
    """Bin of ranks ``x`` among ``NB`` bins of ``[a, b)``, ``sc = NB / (b - a)``:
    ``floor((x - a) * sc)`` clamped to ``0 .. NB - 1`` (each operation rounded once, so the
    bin never decreases as ``x`` grows)."""
    d = tl.minimum(tl.maximum((x - a) * sc, 0.0), NB - 1.0)
    return d.to(tl.int32)


@triton.jit
def _first_in(a, b, sc, t, NB: tl.constexpr, W: tl.constexpr):
    """The lowest rank ``x`` in ``[a, b]`` with ``_vbin(x) >= t`` (``1 <= t < NB``): a
    ``W``-ary search over the ordered integers of the floats (``_ukey``; ``W`` of them
    tested at once, so about 4 steps cover 2^32 where a bisection takes 32 dependent
    ones), exact because the bin never decreases with ``x`` and ``b`` is in bin ``NB -
    1``; so keys in bins ``>= t`` are exactly those ``>=`` it."""
    lo = _ukey(a)
    hi = _ukey(b)
    idx = tl.arange(0, W).to(tl.int64)
    while lo < hi:
        step = (hi - lo + W - 1) // W
        p = _vbin(_from_ukey(tl.minimum(lo + idx * step, hi)), a, sc, NB) >= t
        i = tl.min(tl.where(p, idx, W), axis=0)
        # the answer is in (lo + (i - 1) step, lo + i step]
        nhi = tl.minimum(lo + i * step, hi)
        lo = tl.minimum(tl.where(i == 0, lo, lo + (i - 1) * step + 1), nhi)
        hi = nhi
    return _from_ukey(lo)


@triton.jit
def _bin_edges(a, b, sc, d, NB: tl.constexpr, W: tl.constexpr):
    """The exact rank bounds of bin ``d`` of ``[a, b)`` (``sc = NB / (b - a)``): the lowest
    ranks with ``_vbin >= max(d, 1)`` and ``>= min(d + 1, NB - 1)`` (``_first_in``'s
    answers). Both are looked for at once in a window of ``W`` consecutive floats around
    the estimate ``a + t / sc``, which holds the answer whenever the window's last float
    is in the bin or above and its first is below or is ``a`` (the usual case: the
    estimate is off by a few ulps); otherwise (ranges far wider than the bound's own
    scale) ``_first_in`` searches the whole range. Measured (32 CTAs of 8 warps, one
    closing each, H200; NOTES.md "the closing CTA's bin bounds"): at most 0.5 us per
    closing against 3.4-4.9 us with two bisections, the same bounds; ``W = 32`` keeps the
    round kernel at its registers (80 at M = 2; 128 floats: 108)."""
    two = tl.arange(0, 2)
    t = tl.minimum(tl.maximum(d + two, 1), NB - 1)
    ua = _ukey(a)
    ub = _ukey(b)
    idx = tl.arange(0, W).to(tl.int64)
    u = tl.minimum(tl.maximum(_ukey(a + t.to(tl.float32) / sc)[:, None] - W // 2 + idx[None, :], ua), ub)
    p = _vbin(_from_ukey(u), a, sc, NB) >= t[:, None]
    first = tl.min(tl.where(p, idx[None, :], W), axis=1)
    p_first = tl.sum(tl.where(idx[None, :] == 0, p.to(tl.int32), 0), axis=1) != 0
    p_last = tl.sum(tl.where(idx[None, :] == W - 1, p.to(tl.int32), 0), axis=1) != 0
    ok = (p_last & ((p_first == 0) | (tl.min(u, axis=1) == ua))).to(tl.int32)
    found = tl.min(tl.where(idx[None, :] == first[:, None], u, ub), axis=1)
    x0 = _from_ukey(tl.sum(tl.where(two == 0, found, 0), axis=0))
    x1 = _from_ukey(tl.sum(tl.where(two == 1, found, 0), axis=0))
    if tl.sum(tl.where(two == 0, ok, 0), axis=0) == 0:
        x0 = _first_in(a, b, sc, tl.maximum(d, 1), NB, W)
    if tl.sum(tl.where(two == 1, ok, 0), axis=0) == 0:
        x1 = _first_in(a, b, sc, tl.minimum(d + 1, NB - 1), NB, W)
    return x0, x1


@triton.jit
def _resolve(bnd_ptr, need_ptr, rs, r, r64, t_sure, t_maybe, need):
    """The row's class bounds for ``pq_emit``, and the row marked resolved."""
    tl.store(bnd_ptr + 2 * r64, t_sure)
    tl.store(bnd_ptr + 2 * r64 + 1, t_maybe)
    tl.store(need_ptr + r, need.to(tl.int32))
    tl.store(rs + 3, 1)


@triton.jit
def pq_rlut_kernel(
    q_ptr, k_ptr, cent_ptr, phi_ptr, qd_ptr, qc_ptr, lut_ptr, flag_ptr, ctr_ptr,  #
    q_sb, q_sh, k_sb, k_sh, k_ss,  #
    H, G, M, K, d_s, S, n_old, init_offset, metric_ip, NP,  #
    BLOCK_C: tl.constexpr, BLOCK_DS: tl.constexpr,
):
    """See the module docstring and README.md (launch contract)."""
    r = tl.program_id(0)
    m = tl.program_id(1)
    i = tl.program_id(2)
    r64, b, h, g, bg = _row_ids(r, H, G)
    d_c = d_s + metric_ip
    cbase = ((bg * M + m) * K) * d_c
    nch = tl.cdiv(K, BLOCK_C)
    if (m == 0) & (i == 0):
        # the emit's part flags of this row (and its ticket counter) start at zero
        for q0 in range(0, NP, 1024):
            qq = q0 + tl.arange(0, 1024)
            tl.store(flag_ptr + r64 * NP + qq, tl.zeros([1024], tl.int64), mask=qq < NP)
        if r == 0:
            tl.store(ctr_ptr, 0)
    # table entries c = i*BLOCK_C .. of subvector m
    qrow = b.to(tl.int64) * q_sb + h.to(tl.int64) * q_sh + m * d_s
    offs_c = i * BLOCK_C + tl.arange(0, BLOCK_C)
    acc = tl.zeros([BLOCK_C], tl.float32)
    for d0 in range(0, d_s, BLOCK_DS):
        qv, cv = _lut_tile(q_ptr, qrow, cent_ptr, cbase, offs_c, d0 + tl.arange(0, BLOCK_DS), d_s, d_c, K, True)
        acc += _row_dots(cv, qv)
    tl.store(lut_ptr + (r64 * M + m) * K + offs_c, acc, mask=offs_c < K)
    # the step's new key (at most one here), centroids of this block, once per KV group:
    # a partial argmin, combined by the last round
    if (h % G == 0) & (S - init_offset > n_old):
        krow = b.to(tl.int64) * k_sb + g.to(tl.int64) * k_sh + (init_offset + n_old) * k_ss + m * d_s
        phi = tl.load(phi_ptr + (bg * M + m) * metric_ip)  # euclidean: phi_ptr[0], unused
        dmin, cmin = _block_nearest(k_ptr, krow, cent_ptr, cbase, phi, d_s, d_c, K, metric_ip, i * BLOCK_C, BLOCK_C,
                                    BLOCK_DS)
        tl.store(qd_ptr + (bg * M + m) * nch + i, dmin)
        tl.store(qc_ptr + (bg * M + m) * nch + i, cmin)


@triton.jit
def _store_code(qd_ptr, qc_ptr, codes_ptr, bg, M, K, n_old, cap, BLOCK_C: tl.constexpr):
    """The new key's codes from ``pq_rlut``'s partial argmins: per subvector, the first
    block with the strictly least distance from ``(+inf, 0)``, as ``_nearest``."""
    nch = tl.cdiv(K, BLOCK_C)
    for m in range(M):
        best_d = float("inf")
        best_c = 0
        for i in range(nch):
            dmin = tl.load(qd_ptr + (bg * M + m) * nch + i)
            cmin = tl.load(qc_ptr + (bg * M + m) * nch + i)
            take = dmin < best_d
            best_c = tl.where(take, cmin, best_c)
            best_d = tl.where(take, dmin, best_d)
        tl.store(codes_ptr + (bg * M + m) * cap + n_old, best_c.to(tl.uint8))


@triton.jit
def _bin_bounds(cnt, a, b, need, NB: tl.constexpr):
    """The bin ``d`` of ``NB`` bins of ``[a, b)`` (counts ``cnt``) that holds the
    ``need``-th largest candidate (counting from the top), its exact rank bounds ``lo <= x
    < hi`` (``_bin_edges``), the candidates still wanted from it, and whether the row is
    resolved there (the bin one value, or no wider than ``5e-5 (1 + |x|)``)."""
    bins = tl.arange(0, NB)
    ge = tl.cumsum(cnt, axis=0, reverse=True)  # candidates in bins >= d
    d = tl.maximum(tl.max(tl.where(ge >= need, bins, -1), axis=0), 0)
    above = tl.sum(tl.where(bins == d, ge - cnt, 0), axis=0)  # in the bins above d
    need2 = need - above.to(tl.int64)
    x0, x1 = _bin_edges(a, b, NB / (b - a), d, NB, SEARCH)
    lo = tl.where(d == 0, a, x0)
    hi = tl.where(d == NB - 1, b, x1)
    done = (_next_up(lo) >= hi) | ((hi - lo) <= 5e-5 * (1.0 + tl.minimum(tl.abs(lo), tl.abs(hi))))
    return lo, hi, need2, done


@triton.jit(noinline=True)
def _finish_row(rs, hrow, bnd_ptr, need_ptr, codes_ptr, lut_row, bg, M, K, cap, w0, r, r64, lo, hi, need2,
                MP: tl.constexpr, TILE: tl.constexpr, NB: tl.constexpr):
    """The last launched round's closing CTA finishing a row still open (see
    ``_close_round``): one more pass over the row's candidates into the row's histogram of
    ``NB`` bins of ``[lo, hi)`` by this CTA alone (global atomics), and the row resolved.
    Not inlined, 1024 keys at a time: so the round CTAs keep their registers (M = 2, TILE
    4096, 8 warps: 80, as with no finishing pass; inlined: 112; inlined over TILE keys at
    a time: 128 and spills)."""
    bins = tl.arange(0, NB)
    # the row's histogram again (global atomics: a CTA-local histogram of NB bins would
    # raise every round CTA's registers)
    sc = NB / (hi - lo)
    tl.store(hrow + bins, tl.zeros([NB], tl.int32))
    tl.debug_barrier()
    for j0 in range(0, w0, 1024):  # 1024 keys at a time: few registers
        j = j0 + tl.arange(0, 1024)
        x = _part_scores(codes_ptr, lut_row, bg, M, K, cap, j, MP)
        tl.atomic_add(hrow + _vbin(x, lo, sc, NB), tl.full([1024], 1, tl.int32),
                      mask=(j < w0) & (x >= lo) & (x < hi), sem="relaxed")
    tl.debug_barrier()
    c2 = tl.load(hrow + bins, cache_modifier=".cg")
    lo2, hi2, need3, _ = _bin_bounds(c2, lo, hi, need2, NB)
    _resolve(bnd_ptr, need_ptr, rs, r, r64, hi2, lo2, need3)


@triton.jit
def _close_round(rs, hrow, tick, bnd_ptr, need_ptr, codes_ptr, lut_row, bg, M, K, cap, w0, r, r64, a, b, need, LAST,
                 MP: tl.constexpr, TILE: tl.constexpr, NB: tl.constexpr):
    """The row's last CTA of a round of ``NB`` bins: keep the bin holding the ``need``-th
    largest candidate of ``[a, b)`` and its exact rank bounds (``_bin_bounds``), then
    resolve the row there if it can, else narrow the range to it; after the last
    launched round an unresolved row (a range over ``5e-5 (1 + |x|) * 2^20`` wide, rare)
    is finished by this CTA alone: one more pass over the row's candidates into the row's
    histogram of ``NB`` bins of ``[lo, hi)``, whose bin is at most ``2^-16``
    wide (ranks span at most ``2^16``; 256 x 4096 x 4096 bins), and the row resolved.
    Leaves the histogram and the counter zero."""
    bins = tl.arange(0, NB)
    cnt = tl.load(hrow + bins, cache_modifier=".cg")
    lo, hi, need2, done = _bin_bounds(cnt, a, b, need, NB)
    if done:
        _resolve(bnd_ptr, need_ptr, rs, r, r64, hi, lo, need2)
    elif LAST:
        _finish_row(rs, hrow, bnd_ptr, need_ptr, codes_ptr, lut_row, bg, M, K, cap, w0, r, r64, lo, hi, need2, MP,
                    TILE, NB)
    else:
        tl.store(rs + 0, lo.to(tl.int32, bitcast=True).to(tl.int64))
        tl.store(rs + 1, hi.to(tl.int32, bitcast=True).to(tl.int64))
        tl.store(rs + 2, need2)
    tl.store(hrow + bins, tl.zeros([NB], tl.int32))
    tl.store(tick + r, 0)


@triton.jit
def pq_rround_kernel(
    codes_ptr, lut_ptr, qd_ptr, qc_ptr, rst_ptr, rhist_ptr, rtick_ptr, bnd_ptr, need_ptr,  #
    H, G, M, K, S, n_old, cap, heavy, init_offset, window, LP, ROUND,  #
    MP: tl.constexpr, KP: tl.constexpr, TILE: tl.constexpr, NB0: tl.constexpr, NB: tl.constexpr,
    LEVELS: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """See the module docstring and README.md (launch contract)."""
    c = tl.program_id(0)
    r = tl.program_id(1)
    r64, b_, h, g, bg = _row_ids(r, H, G)
    rs = rst_ptr + r64 * 4
    lut_row = lut_ptr + r64 * M * K
    n, w0, k, _ = _row_sizes(S, init_offset, window, heavy, 0, 0)
    last = ROUND == LEVELS - 1
    if last & (c == 0) & (h % G == 0) & (n > n_old):
        _store_code(qd_ptr, qc_ptr, codes_ptr, bg, M, K, n_old, cap, BLOCK_C)
    j = c * TILE + tl.arange(0, TILE)
    cand = j < w0
    if ROUND == 0:
        need = tl.minimum(k, w0).to(tl.int64)
        if w0 <= k:
            # every candidate is taken (pq_emit adds the lowest masked keys up to k)
            if c == 0:
                _resolve(bnd_ptr, need_ptr, rs, r, r64, -NO_PICK, -NO_PICK, need - need)
        elif need <= 0:
            if c == 0:
                _resolve(bnd_ptr, need_ptr, rs, r, r64, NO_PICK, NO_PICK, need)
        else:
            # the first round: NB0 bins, counted per CTA (tl.histogram) before the
            # atomics, which would otherwise meet on the few bins most keys fall in
            a, b = _rank_bounds(lut_row, M, K, MP, KP)
            x = _part_scores(codes_ptr, lut_row, bg, M, K, cap, j, MP)
            hit = cand & (x >= a) & (x < b)
            cnt = tl.histogram(_vbin(x, a, NB0 / (b - a), NB0), NB0, mask=hit)
            hrow = rhist_ptr + r64 * NB
            bins = tl.arange(0, NB0)
            tl.atomic_add(hrow + bins, cnt, mask=cnt > 0, sem="relaxed")
            # the row's last CTA to arrive closes the round (no CTA waits for another)
            tl.debug_barrier()
            arrived = tl.atomic_add(rtick_ptr + r, 1, sem="acq_rel", scope="gpu")
            if arrived == LP - 1:
                tl.store(rs + 3, 0)
                _close_round(rs, hrow, rtick_ptr, bnd_ptr, need_ptr, codes_ptr, lut_row, bg, M, K, cap, w0, r, r64, a,
                             b, need, last, MP, TILE, NB0)
    else:
        if tl.load(rs + 3) == 0:
            a = tl.load(rs + 0).to(tl.int32).to(tl.float32, bitcast=True)
            b = tl.load(rs + 1).to(tl.int32).to(tl.float32, bitcast=True)
            need = tl.load(rs + 2)
            x = _part_scores(codes_ptr, lut_row, bg, M, K, cap, j, MP)
            hit = cand & (x >= a) & (x < b)
            hrow = rhist_ptr + r64 * NB
            tl.atomic_add(hrow + _vbin(x, a, NB / (b - a), NB), tl.full([TILE], 1, tl.int32), mask=hit,
                          sem="relaxed")
            tl.debug_barrier()
            arrived = tl.atomic_add(rtick_ptr + r, 1, sem="acq_rel", scope="gpu")
            if arrived == LP - 1:
                _close_round(rs, hrow, rtick_ptr, bnd_ptr, need_ptr, codes_ptr, lut_row, bg, M, K, cap, w0, r, r64, a,
                             b, need, last, MP, TILE, NB)


# ----------------------------------------------------------------------------------
# declarations for the build

DTYPES = ("fp32", "bf16", "fp16")
MPS = (2, 4, 8)  # code rows per key: M <= MP
LEVELS = 2  # rounds launched per step (see the module docstring: a row unresolved after them is finished in-CTA)
RLUT_FIXED = {"BLOCK_C": 64, "BLOCK_DS": 64}
RROUND_FIXED = {"KP": 256, "NB0": 256, "NB": 4096, "LEVELS": LEVELS, "BLOCK_C": RLUT_FIXED["BLOCK_C"]}


def _rlut_args(qt):
    return (
        ptr("q_ptr", qt, False), ptr("k_ptr", qt, False), ptr("cent_ptr", "fp32"), ptr("phi_ptr", "fp32", False),
        ptr("qd_ptr", "fp32"), ptr("qc_ptr", "i32"), ptr("lut_ptr", "fp32"), ptr("flag_ptr", "i64"),
        ptr("ctr_ptr", "i32"), i64("q_sb"), i64("q_sh"), i64("k_sb"), i64("k_sh"), i64("k_ss"),
        i32("H"), i32("G"), i32("M"), i32("K"), i32("d_s"), i32("S"), i32("n_old"), i32("init_offset"),
        i32("metric_ip"), i32("NP"),
    )


def _rround_args():
    return (
        ptr("codes_ptr", "u8"), ptr("lut_ptr", "fp32"), ptr("qd_ptr", "fp32"), ptr("qc_ptr", "i32"),
        ptr("rst_ptr", "i64"), ptr("rhist_ptr", "i32"), ptr("rtick_ptr", "i32"), ptr("bnd_ptr", "fp32"),
        ptr("need_ptr", "i32"), i32("H"), i32("G"), i32("M"), i32("K"), i32("S"), i32("n_old"),
        i32("cap", div16=True), i32("heavy"), i32("init_offset"), i32("window"), i32("LP"), i32("ROUND"),
    )


KERNELS = []
for _qt in DTYPES:
    KERNELS.append(
        Kernel(name=f"pq_rlut.q_{_qt}", fn=pq_rlut_kernel, args=_rlut_args(_qt), fixed=RLUT_FIXED,
               variants={80: single({}, 8, 1), 90: grid({}, 8, 1, num_warps=(4, 8))}))
for _mp in MPS:
    KERNELS.append(
        Kernel(name=f"pq_rround.m{_mp}", fn=pq_rround_kernel, args=_rround_args(), fixed=dict(RROUND_FIXED, MP=_mp),
               variants={80: single({"TILE": 4096}, 8, 1),
                         90: grid({"TILE": 4096}, 8, 1, num_warps=(4, 8), TILE=(2048, 4096, 8192))}))
