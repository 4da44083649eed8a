"""The split path's threshold for any number of code combinations (``K^M > 4096``, M <= 4):
a select over the keys' scores by rounds of histograms, in place of ``pq_thresh``'s
combination histogram.

``pq_thresh`` finds the top-k threshold on the ``K^M`` code combinations, which needs
``K^M <= 4096`` (PQCache's (M, bits) = (2, 6)). With (2, 8) or (4, 8) there are 65536 or
2^32 combinations, so here the threshold is found on the keys themselves. Each key's
score is the rank ``x = _rank_score(sum_m lut[m, code_m])``, computed exactly as
``pq_emit`` computes it (``_part_scores``). Rounds of an ``NB``-bin histogram narrow a
range ``[a, b)`` of ranks that holds the ``need``-th largest candidate still to place:

* value rounds: ``NB`` bins of equal width ``w = (b - a) / NB`` with edges ``e_i = a +
  i*w`` (rounded once each, clamped to ``b``): a key's bin is the number of edges at or
  below it (a first guess from ``(x - a) / w``, corrected against the two edges), so a
  bin holds exactly the ranks ``e_d <= x < e_{d+1}`` and ``pq_emit``'s comparisons
  against two edges select the same keys. Used while a bin stays at least 2^13 ulps
  wide, where one correction suffices.
* integer rounds, once the range is narrower: the ranks as ordered 32-bit integers
  (``_ukey``), bins of ``2^sh`` integers, 12 bits a round, exact down to one value.

The row's last CTA of a round keeps the bin holding the ``need``-th largest candidate
(``need`` less the keys in the bins above it). The row is resolved when that bin is one
value, or no wider than ``1e-5 (1 + |x|)`` (a tenth of the spec's tolerance ``1e-4 (1 +
|score|)``: keys in it are near-ties, taken in position order). Then ``pq_emit`` gets
the split path's class bounds: ``t_sure`` = the bin's upper edge (every candidate at or
above it is taken), ``t_maybe`` = its lower edge, ``need`` (candidates in ``[t_maybe,
t_sure)`` taken in position order while fewer than ``need`` are). The first round has
``NB0 = 256`` bins, counted per CTA (``tl.histogram``) before its global atomics: with
4096 bins every key's atomic met the few bins where most keys fall (measured: the first
round then cost more than the other three together). Ranks span at most 2^16, so four
rounds always resolve: value rounds leave at most 2^16 / 256 = 256, then 2^-4, 2^-16
(under the tolerance) or, where the range turned narrower than 2^13 ulps first, integer
rounds finish it in two (a range that narrow lies within two binades: under 2^14 keys).

``pq_rlut_kernel``, grid ``(B*H, M, cdiv(K, BLOCK_C) + 1)``: CTA ``(r, m, i)`` writes
entries ``i*BLOCK_C ..`` of row ``m`` of head ``r``'s lookup table ``lut f32 [B*H, M,
K]`` (one tile of centroids each: the table's latency chain spread over many CTAs); the
last CTA of each ``(r, m)`` quantizes subvector ``m`` of the step's new keys for the KV
group of ``r`` (its first head only; the host routes a step here only when the new keys
are not candidates). CTA ``(r, 0, 0)`` also zeroes the emit's part flags ``flag i64 [B*H, NP]`` and (row 0) its
ticket counter ``ctr i32 [1]``.

``pq_rround_kernel``, grid ``(LP, B*H)``, ``LP = cdiv(w0, TILE)``, launched four times
(``ROUND`` 0 .. 3): CTA ``(c, r)`` scores candidates ``c*TILE ..`` of row
``r`` and adds those in the range to the row's histogram ``rhist i32 [B*H, NB]``
(global atomics), then takes a ticket on the row's counter ``rtick i32 [B*H]``; the
row's last CTA to arrive (no CTA waits for another) closes the round and leaves the
histogram and the counter zero. Round 0 starts every row from its lookup table: ``[a,
b)`` = the ranks of ``lo = sum_m min_c lut[m, c]`` and just above ``hi`` (maxima), added
in the keys' order, so by the monotonicity of rounding every key lies in it; the full
rank range where the table holds a non-finite entry; ``need = min(k, w0)``. Later rounds
read the row's state ``rst i64 [B*H, 8]`` (mode, ``a``, ``b`` as f32 bits, integer range,
shift, ``need``, done) and exit at once on a resolved row. The closing CTA writes ``bnd
f32 [B*H, 2]`` = ``(t_sure, t_maybe)`` and ``need i32 [B*H]`` when the row resolves (``k
= 0``: nothing is taken).

Launch contract: README.md in this directory. Host preconditions: those of the split
emit (``init_offset >= sink'``, ``S - window' >= init_offset``, ``w0 >= k``) and no new
key among the candidates (``w0 <= n_old``).
"""

import triton
import triton.language as tl

from kspec import Kernel, i32, i64, ptr, single
from pq_select import RANK_INF, RANK_NAN, _lut_tile, _mul_rn, _nearest, _rank_score, _row_dots
from pq_hist import _row_ids, _row_sizes
from pq_split import _part_scores

#: bins of one round (a power of two): 12 bits of the 32-bit key a round
NB_BITS = tl.constexpr(12)
#: the class bounds of a row with nothing to pick: above every rank (|rank| <= 32768)
NO_PICK = tl.constexpr(65536.0)


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
    s += tl.where(M > 1, _pick(ext, mm, 1), 0.0)
    if MP > 2:
        s += tl.where(M > 2, _pick(ext, mm, 2), 0.0)
        s += tl.where(M > 3, _pick(ext, mm, 3), 0.0)
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
def _edge(a, b, w, i):
    """Lower edge of value bin ``i`` of ``[a, b)`` (bins of width ``w``): ``a`` for ``i <= 0``,
    else ``a + i*w`` (the product rounded on its own, never fused) clamped to ``b``."""
    e = tl.minimum(a + _mul_rn(i.to(tl.float32), w), b)
    return tl.where(i <= 0, a, e)


@triton.jit
def _value_bin(x, a, b, NB: tl.constexpr):
    """Value bin of ranks ``x`` in ``[a, b)``: the number of edges ``e_1 .. e_{NB-1}`` at or
    below ``x`` (a guess from ``(x - a) / w``, corrected against its two edges)."""
    w = (b - a) * (1.0 / NB)
    d = ((x - a) * (NB / (b - a))).to(tl.int32)
    d = tl.minimum(tl.maximum(d, 0), NB - 1)
    d = tl.where(x < _edge(a, b, w, d), d - 1, d)
    d = tl.where((d < NB - 1) & (x >= _edge(a, b, w, d + 1)), d + 1, d)
    return tl.minimum(tl.maximum(d, 0), NB - 1)


@triton.jit
def _int_range(a, b, NB: tl.constexpr):
    """The integer form of ``[a, b)``: ``(base, top, sh)``, keys ``_ukey(a) <= u <
    _ukey(b)`` in bins of ``2^sh`` with ``NB`` bins covering them."""
    base = _ukey(a)
    top = _ukey(b)
    sh = (base * 0).to(tl.int64)
    while (top - base) > (NB << sh):
        sh += 1
    return base, top, sh


@triton.jit
def _narrow(a, b):
    """Whether ``[a, b)`` is too narrow for value bins (under 2^13 ulps of its larger end:
    a bin under 2 ulps, where a correction by one bin might not reach the exact bin)."""
    return (b - a) < tl.maximum(tl.abs(a), tl.abs(b)) * (1.0 / 1024.0)


@triton.jit
def _store_state(rs, mode, a, b, base, top, sh, need, done):
    tl.store(rs + 0, mode)
    tl.store(rs + 1, a.to(tl.int32, bitcast=True).to(tl.int64))
    tl.store(rs + 2, b.to(tl.int32, bitcast=True).to(tl.int64))
    tl.store(rs + 3, base)
    tl.store(rs + 4, top)
    tl.store(rs + 5, sh)
    tl.store(rs + 6, need)
    tl.store(rs + 7, done)


@triton.jit
def _resolve(bnd_ptr, need_ptr, rs, r, r64, t_sure, t_maybe, need):
    """The row's class bounds for ``pq_emit``, and the row marked resolved."""
    tl.store(bnd_ptr + 2 * r64, t_sure)
    tl.store(bnd_ptr + 2 * r64 + 1, t_maybe)
    tl.store(need_ptr + r, need.to(tl.int32))
    tl.store(rs + 7, 1)


@triton.jit
def _quantize_new(k_ptr, cent_ptr, phi_ptr, codes_ptr, b, g, bg, k_sb, k_sh, k_ss, m0, m1, M, K, d_s, d_c, n_old, n,
                  cap, init_offset, metric_ip, BLOCK_C: tl.constexpr, BLOCK_DS: tl.constexpr):
    """Codes of KV head ``(b, g)``'s new keys ``n_old <= j < n``, subvectors ``m0 <= m <
    m1`` (spec step 1)."""
    krow = b.to(tl.int64) * k_sb + g.to(tl.int64) * k_sh
    for m in range(m0, m1):
        cbase = ((bg * M + m) * K) * d_c
        phi = tl.load(phi_ptr + (bg * M + m) * metric_ip)  # euclidean: phi_ptr[0], unused
        for tq in range(n_old, n):
            ct = _nearest(k_ptr, krow + (init_offset + tq) * k_ss + m * d_s, cent_ptr, cbase, phi, d_s, d_c, K,
                          metric_ip, BLOCK_C, BLOCK_DS)
            tl.store(codes_ptr + (bg * M + m) * cap + tq, ct.to(tl.uint8))


@triton.jit
def pq_rlut_kernel(
    q_ptr, k_ptr, cent_ptr, phi_ptr, codes_ptr, lut_ptr, flag_ptr, ctr_ptr,  #
    q_sb, q_sh, k_sb, k_sh, k_ss,  #
    H, G, M, K, d_s, S, n_old, cap, init_offset, metric_ip, NP,  #
    BLOCK_C: tl.constexpr, BLOCK_DS: tl.constexpr,
):
    """See the module docstring and README.md (launch contract)."""
    r = tl.program_id(0)
    m = tl.program_id(1)
    i = tl.program_id(2)
    r64, b, h, g, bg = _row_ids(r, H, G)
    d_c = d_s + metric_ip
    if i == tl.cdiv(K, BLOCK_C):
        # subvector m of the new keys' codes, once per KV group (its first head's row)
        if h % G == 0:
            _quantize_new(k_ptr, cent_ptr, phi_ptr, codes_ptr, b, g, bg, k_sb, k_sh, k_ss, m, m + 1, M, K, d_s, d_c,
                          n_old, S - init_offset, cap, init_offset, metric_ip, BLOCK_C, BLOCK_DS)
        return
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
        qv, cv = _lut_tile(q_ptr, qrow, cent_ptr, ((bg * M + m) * K) * d_c, offs_c, d0 + tl.arange(0, BLOCK_DS), d_s,
                           d_c, K, True)
        acc += _row_dots(cv, qv)
    tl.store(lut_ptr + (r64 * M + m) * K + offs_c, acc, mask=offs_c < K)


@triton.jit
def _close_round(rs, hrow, tick, bnd_ptr, need_ptr, r, r64, mode, a, b, base, top, sh, need, NB: tl.constexpr):
    """The row's last CTA of a round of ``NB`` bins: keep the bin holding the ``need``-th
    largest candidate of the range (counting from the top), then resolve the row or
    narrow its range to that bin (for rounds of 4096 bins); leave the histogram (its
    first ``NB`` bins, the only ones this round used) and counter zero."""
    bins = tl.arange(0, NB)
    cnt = tl.load(hrow + bins, cache_modifier=".cg")
    ge = tl.cumsum(cnt, axis=0, reverse=True)  # candidates in bins >= d
    d = tl.maximum(tl.max(tl.where(ge >= need, bins, -1), axis=0), 0)
    above = tl.sum(tl.where(bins == d, ge - cnt, 0), axis=0)  # in the bins above d
    need2 = need - above.to(tl.int64)
    if mode == 0:
        w = (b - a) * (1.0 / NB)
        lo = _edge(a, b, w, d)
        hi = tl.where(d == NB - 1, b, _edge(a, b, w, d + 1))
        if (hi - lo) <= 1e-5 * (1.0 + tl.minimum(tl.abs(lo), tl.abs(hi))):
            _resolve(bnd_ptr, need_ptr, rs, r, r64, hi, lo, need2)
        elif _narrow(lo, hi):
            nbase, ntop, nsh = _int_range(lo, hi, 4096)  # the next rounds' NB
            _store_state(rs, 1, lo, hi, nbase, ntop, nsh, need2, 0)
        else:
            _store_state(rs, 0, lo, hi, base, top, sh, need2, 0)
    else:
        nb = base + (d.to(tl.int64) << sh)
        if sh == 0:
            # one value per bin: nb is the rank; its ties are taken in position order
            _resolve(bnd_ptr, need_ptr, rs, r, r64, _from_ukey(nb + 1), _from_ukey(nb), need2)
        else:
            ntop = tl.minimum(nb + (1 << sh), top)
            _store_state(rs, 1, a, b, nb, ntop, tl.maximum(sh - NB_BITS, 0), need2, 0)
    tl.store(hrow + bins, tl.zeros([NB], tl.int32))
    tl.store(tick + r, 0)


@triton.jit
def _round_bins(x, cand, mode, a, b, base, top, sh, NBR: tl.constexpr):
    """The candidates in the row's range and their bins (of ``NBR``) for this round."""
    if mode == 0:
        hit = cand & (x >= a) & (x < b)
        d = _value_bin(x, a, b, NBR)
    else:
        u = _ukey(x)
        hit = cand & (u >= base) & (u < top)
        d = ((u - base) >> sh).to(tl.int32)
    return hit, tl.minimum(tl.maximum(d, 0), NBR - 1)


@triton.jit
def pq_rround_kernel(
    codes_ptr, lut_ptr, rst_ptr, rhist_ptr, rtick_ptr, bnd_ptr, need_ptr,  #
    H, G, M, K, S, cap, heavy, init_offset, window, LP, ROUND,  #
    MP: tl.constexpr, KP: tl.constexpr, TILE: tl.constexpr, NB0: tl.constexpr, NB: tl.constexpr,
):
    """See the module docstring and README.md (launch contract)."""
    tl.static_assert(NB == 4096)  # 2^NB_BITS
    c = tl.program_id(0)
    r = tl.program_id(1)
    r64, b_, h, g, bg = _row_ids(r, H, G)
    rs = rst_ptr + r64 * 8
    lut_row = lut_ptr + r64 * M * K
    _, w0, k, _ = _row_sizes(S, init_offset, window, heavy, 0, 0)
    j = c * TILE + tl.arange(0, TILE)
    cand = j < w0
    if ROUND == 0:
        need = tl.minimum(k, w0).to(tl.int64)
        if need <= 0:
            if c == 0:
                _resolve(bnd_ptr, need_ptr, rs, r, r64, NO_PICK, NO_PICK, need)
        else:
            # the first round: NB0 bins, counted per CTA (tl.histogram) before the
            # atomics, which would otherwise meet on the few bins most keys fall in
            a, b = _rank_bounds(lut_row, M, K, MP, KP)
            mode = _narrow(a, b).to(tl.int32)
            base, top, sh = _int_range(a, b, NB0)
            x = _part_scores(codes_ptr, lut_row, bg, M, K, cap, j, MP)
            hit, d = _round_bins(x, cand, mode, a, b, base, top, sh, NB0)
            cnt = tl.histogram(d, NB0, mask=hit)
            hrow = rhist_ptr + r64 * NB
            bins = tl.arange(0, NB0)
            tl.atomic_add(hrow + bins, cnt, mask=cnt > 0, sem="relaxed")
            # the row's last CTA to arrive closes the round (no CTA waits for another)
            tl.debug_barrier()
            arrived = tl.atomic_add(rtick_ptr + r, 1, sem="acq_rel", scope="gpu")
            if arrived == LP - 1:
                _close_round(rs, hrow, rtick_ptr, bnd_ptr, need_ptr, r, r64, mode, a, b, base, top, sh, need, NB0)
    else:
        if tl.load(rs + 7) == 0:
            mode = tl.load(rs + 0).to(tl.int32)
            a = tl.load(rs + 1).to(tl.int32).to(tl.float32, bitcast=True)
            b = tl.load(rs + 2).to(tl.int32).to(tl.float32, bitcast=True)
            base = tl.load(rs + 3)
            top = tl.load(rs + 4)
            sh = tl.load(rs + 5)
            need = tl.load(rs + 6)
            x = _part_scores(codes_ptr, lut_row, bg, M, K, cap, j, MP)
            hit, d = _round_bins(x, cand, mode, a, b, base, top, sh, NB)
            hrow = rhist_ptr + r64 * NB
            tl.atomic_add(hrow + d, tl.full([TILE], 1, tl.int32), mask=hit, sem="relaxed")
            tl.debug_barrier()
            arrived = tl.atomic_add(rtick_ptr + r, 1, sem="acq_rel", scope="gpu")
            if arrived == LP - 1:
                _close_round(rs, hrow, rtick_ptr, bnd_ptr, need_ptr, r, r64, mode, a, b, base, top, sh, need, NB)


# ----------------------------------------------------------------------------------
# declarations for the build

DTYPES = ("fp32", "bf16", "fp16")
MPS = (2, 4)  # code rows per key: M <= MP
LEVELS = 4  # rounds launched per step (see the module docstring: four always resolve)
RLUT_FIXED = {"BLOCK_C": 64, "BLOCK_DS": 64}
RROUND_FIXED = {"KP": 256, "NB0": 256, "NB": 4096}


def _rlut_args(qt):
    return (
        ptr("q_ptr", qt, False), ptr("k_ptr", qt, False), ptr("cent_ptr", "fp32"), ptr("phi_ptr", "fp32", False),
        ptr("codes_ptr", "u8"), ptr("lut_ptr", "fp32"), ptr("flag_ptr", "i64"), ptr("ctr_ptr", "i32"),
        i64("q_sb"), i64("q_sh"), i64("k_sb"), i64("k_sh"), i64("k_ss"),
        i32("H"), i32("G"), i32("M"), i32("K"), i32("d_s"), i32("S"), i32("n_old"), i32("cap", div16=True),
        i32("init_offset"), i32("metric_ip"), i32("NP"),
    )


def _rround_args():
    return (
        ptr("codes_ptr", "u8"), ptr("lut_ptr", "fp32"), ptr("rst_ptr", "i64"), ptr("rhist_ptr", "i32"),
        ptr("rtick_ptr", "i32"), ptr("bnd_ptr", "fp32"), ptr("need_ptr", "i32"),
        i32("H"), i32("G"), i32("M"), i32("K"), i32("S"), i32("cap", div16=True), i32("heavy"), i32("init_offset"),
        i32("window"), i32("LP"), i32("ROUND"),
    )


KERNELS = []
for _qt in DTYPES:
    KERNELS.append(
        Kernel(name=f"pq_rlut.q_{_qt}", fn=pq_rlut_kernel, args=_rlut_args(_qt), fixed=RLUT_FIXED,
               variants={80: single({}, 8, 1), 90: single({}, 8, 1)}))
for _mp in MPS:
    KERNELS.append(
        Kernel(name=f"pq_rround.m{_mp}", fn=pq_rround_kernel, args=_rround_args(), fixed=dict(RROUND_FIXED, MP=_mp),
               variants={80: single({"TILE": 4096}, 8, 1), 90: single({"TILE": 4096}, 8, 1)}))
