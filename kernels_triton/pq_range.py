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
* every CTA of the row keeps the bin ``d`` holding the ``need``-th largest candidate
  (``need`` less the keys in the bins above it) and finds its exact rank bounds by a
  search over the floats (``_edge``: the lowest rank in bin ``d`` and the lowest in
  ``d + 1``, galloping from an estimate), so the bin is exactly the keys ``lo <= x <
  hi`` and ``pq_emit``'s comparisons select the same keys;
* the row is resolved when that bin holds one value, or when its keys' scores are within
  half the spec's tolerance ``1e-4 (1 + |score|)`` of each other (``_near_tie``: the
  keys in it are near-ties, taken in position order); else the next round bins ``[lo,
  hi)``. Ranks are the scores up to ``RANK_LIN`` in magnitude, so there the bin may be
  ``5e-5 (1 + |x|)`` wide; past it one rank is ``2^16`` ulps of the score
  (``_rank_score``), a relative ``1 / 128`` at most, so there it may be ``128 * 5e-5``
  ranks wide.

Then ``pq_emit`` gets the split path's class bounds: ``t_sure = hi`` (every candidate at
or above it is taken), ``t_maybe = lo``, ``need`` (candidates in ``[lo, hi)`` taken in
position order while fewer than ``need`` are). Rounds have ``NB = 2048`` bins; two narrow
a range by 2^22, which resolves every row whose scores span less than about ``200 (1 +
|x|)`` (the usual case), and ranks span at most 2^17, so the third always resolves
(2^-16 ranks, under ``128 * 5e-5``).

``pq_rsel_kernel``, grid ``(CLUSTER, B*H)``, launched in clusters of ``CLUSTER`` CTAs (8 on
sm_90; sm_80 has no clusters and runs one CTA a row): row ``r``'s cluster writes the
row's lookup table and runs every round of its select in one launch. The table first:
CTA ``c`` writes tiles ``c, c + CLUSTER, ..`` of the row's ``M x cdiv(K, BLOCK_C)``
(subvector, centroid block) tiles of ``lut f32 [B*H, M, K]`` (``_table_tile``) and,
where ``h`` is the first head of its KV group and the step has a new key (at most one:
the host runs ``pq_quant`` first for more), that key's nearest centroid of the block
(``_block_nearest``, one block of ``_nearest``'s loop) into ``qd f32 / qc i32 [B*H_kv,
M, cdiv(K, BLOCK_C)]``; CTA 0 zeroes the emit's part flags ``flag i64 [B*H, NP]`` and
(row 0) its ticket counter ``ctr i32 [1]``; a cluster barrier (release / acquire) makes
the table every CTA's. The last CTA combines the new key's blocks into its code as
``_nearest`` does (``_store_code``). Each CTA copies the row's table into its shared
memory and scores keys from there (``_part_scores`` with ``KP``); the first round keeps the ranks of
each CTA's first ``RANK_WORDS`` candidates in its shared memory too, and the later rounds
read them back instead of scoring those keys again. A round (``_round_bin``): CTA
``c`` scores candidate tiles ``c, c + CLUSTER, ..`` of ``TILE`` keys and counts those in
the range into its own ``NB`` bins of shared memory (shared atomics); after a cluster
barrier CTA ``c`` sums segment ``c`` (``NB / CLUSTER`` bins) over every CTA of the
cluster (distributed shared memory) as counts from the segment's top; after a second,
every CTA reads the segments' totals, then the chosen segment's counts, so every CTA
takes the same bin and bounds and needs no other message. The first round starts from
the lookup table: ``[a, b)`` = the ranks of ``lo = sum_m min_c lut[m, c]`` and just
above ``hi`` (maxima), added in the keys' order, so by the monotonicity of rounding
every key lies in it; the full rank range where the table holds a non-finite entry;
``need = min(k, w0)``. CTA 0 writes ``bnd f32 [B*H, 2]`` = ``(t_sure, t_maybe)`` and
``need i32 [B*H]`` (``k = 0``: nothing is taken). Correct under any schedule: a
cluster's CTAs run together (the hardware places them at once), and no CTA waits on
another cluster. Measured (NOTES.md, "the select's rounds: segments, the table in shared
memory"): one launch of every round replaced a launch per round (~11 us a round at (2,
8) heavy 3020); the segmented pick, the galloping bounds and the shared-memory table
took a round from ~6-7 us to ~5; the rank cache (NOTES.md, "the select's rank cache") took
the later rounds' scoring off the chain (``pq_rsel`` alone, B*H = 32, S = 32768, heavy
3020: (2, 8) 17.5 -> 15.7 us, (4, 8) 20.6 -> 18.1, (8, 4) 25.6 -> 20.8).

Launch contract: README.md in this directory. A row whose candidates are at most ``k``
(``w0 <= k``) takes them all: it is resolved at once (``t_sure`` below every rank, ``need
= 0``), ``pq_emit`` adding the lowest masked keys up to ``k``. Host preconditions: no new
key among the candidates (``w0 <= n_old``) and at most one new key.
"""

import triton
import triton.language as tl

from kspec import Kernel, grid, i32, i64, ptr, single
from pq_select import INTERPRETED, RANK_INF, RANK_NAN, _block_nearest, _lut_tile, _rank_score, _row_dots
from pq_hist import (LVL_WORDS, _lvl_add, _lvl_read, _lvl_smem, _lvl_store, _near_tie, _red_max_max, _row_ids,
                     _row_sizes)
from pq_split import _part_scores

#: the class bounds of a row with nothing to pick: above every rank (|rank| <= 32768)
NO_PICK = tl.constexpr(65536.0)
#: words of the row's lookup table in each CTA's shared memory (``_lut_smem``): ``MP x KP``
#: entries at most (8 x 256)
LUT_WORDS = tl.constexpr(2048)
#: ``_lut_smem``: declares them (static shared memory, as ``pq_hist``'s ``LVL_SMEM_ASM``)
LUT_SMEM_ASM = tl.constexpr(".shared .align 16 .b32 pq_lut${:uid}[%d];\n\tmov.u32 $0, pq_lut${:uid};" %
                            LUT_WORDS.value)
#: words of each CTA's cache of its candidates' ranks (``_rank_smem``): the first round
#: stores the ranks of its first ``RANK_WORDS`` keys, the later rounds read them back
#: (24 KB: with the rounds' 12 KB and the table's 8 KB, under the 48 KB of static shared
#: memory a kernel may declare)
RANK_WORDS = tl.constexpr(6144)
#: ``_rank_smem``: declares them
RANK_SMEM_ASM = tl.constexpr(".shared .align 16 .b32 pq_rank${:uid}[%d];\n\tmov.u32 $0, pq_rank${:uid};" %
                             RANK_WORDS.value)


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
def _rank_bounds(lut_row, lbase, M, K, MP: tl.constexpr, KP: tl.constexpr):
    """``[a, b)``: a rank range holding every key's rank, from the head's table (f32
    ``[M, K]``): the ranks of the sums of the per-subvector minima and (just above) maxima;
    ``[RANK_NAN, RANK_INF]`` where an entry is not finite. On the GPU the table also goes
    into this CTA's shared memory at ``lbase`` (entry ``(m, c)`` at word ``m * KP + c``,
    for ``_part_scores``; visible after the next barrier)."""
    mm = tl.arange(0, MP)
    cc = tl.arange(0, KP)
    on = (mm[:, None] < M) & (cc[None, :] < K)
    t = tl.load(lut_row + mm[:, None] * K + cc[None, :], mask=on, other=0.0)
    if not INTERPRETED:
        tl.static_assert(MP * KP <= LUT_WORDS)
        _lvl_store(lbase, mm[:, None] * KP + cc[None, :], t.to(tl.int32, bitcast=True))
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
def _edge(a, b, sc, t, NB: tl.constexpr):
    """The lowest rank ``x`` in ``[a, b]`` with ``_vbin(x) >= t`` (``1 <= t < NB``,
    ``sc = NB / (b - a)``): a galloping search over the ordered integers of the floats
    (``_ukey``) from the estimate ``a + t / sc``: steps of 1, 2, 4, .. away from it until
    a float on the other side of the bin's edge brackets the answer, then a bisection of
    the bracket. Scalar code, no CTA-wide reduction; about ``2 log2(d) + 2`` evaluations
    for an estimate ``d`` floats off: a few usually, up to ~60 where the range spans zero
    and the bound lies near it (the estimate is only as fine as ``a``'s rounding, and
    floats crowd near zero). Exact because the bin never decreases with ``x``, ``a`` is
    in bin 0 and ``b`` in bin ``NB - 1``."""
    ua = _ukey(a)
    ub = _ukey(b)
    u = tl.minimum(tl.maximum(_ukey(a + t.to(tl.float32) / sc), ua), ub)
    # a bracket (lo, hi]: _vbin(lo) < t <= _vbin(hi)
    step = u - u + 1
    if _vbin(_from_ukey(u), a, sc, NB) < t:
        lo = u
        hi = tl.minimum(u + 1, ub)
        while _vbin(_from_ukey(hi), a, sc, NB) < t:
            lo = hi
            step *= 2
            hi = tl.minimum(lo + step, ub)
    else:
        hi = u
        lo = tl.maximum(u - 1, ua)
        while _vbin(_from_ukey(lo), a, sc, NB) >= t:
            hi = lo
            step *= 2
            lo = tl.maximum(hi - step, ua)
    while hi - lo > 1:
        mid = lo + (hi - lo) // 2
        if _vbin(_from_ukey(mid), a, sc, NB) >= t:
            hi = mid
        else:
            lo = mid
    return _from_ukey(hi)


@triton.jit
def _resolve(bnd_ptr, need_ptr, r, r64, t_sure, t_maybe, need):
    """The row's class bounds for ``pq_emit``."""
    tl.store(bnd_ptr + 2 * r64, t_sure)
    tl.store(bnd_ptr + 2 * r64 + 1, t_maybe)
    tl.store(need_ptr + r, need.to(tl.int32))


@triton.jit
def _cluster_sync():
    """Barrier of every thread of the CTA's cluster; shared and global writes before it are
    seen after it (release / acquire at cluster scope). Nothing under Triton's interpreter
    (no PTX; it runs the CTAs one after another)."""
    if not INTERPRETED:
        tl.inline_asm_elementwise("barrier.cluster.arrive.release;\n\tbarrier.cluster.wait.acquire;\n\tmov.b32 $0, 0;",
                              "=r", [], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _cluster_read(addr, rank):
    """Words at shared-window addresses ``addr`` (i32 tensor) of the cluster's CTA ``rank``
    (distributed shared memory: ``mapa`` then ``ld.shared::cluster``)."""
    return tl.inline_asm_elementwise(
        "{ .reg .b32 %ra; mapa.shared::cluster.u32 %ra, $1, $2; ld.shared::cluster.b32 $0, [%ra]; }", "=r,r,r",
        [addr, rank + tl.zeros_like(addr)], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _lut_smem():
    """The shared-window address (i32) of this CTA's copy of the row's lookup table
    (``LUT_SMEM_ASM``; written by ``_rank_bounds``)."""
    return tl.inline_asm_elementwise(LUT_SMEM_ASM, "=r", [], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _rank_smem():
    """The shared-window address (i32) of this CTA's cache of its candidates' ranks
    (``RANK_SMEM_ASM``)."""
    return tl.inline_asm_elementwise(RANK_SMEM_ASM, "=r", [], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _table_tile(q_ptr, k_ptr, cent_ptr, phi_ptr, qd_ptr, qc_ptr, lut_ptr, q_sb, q_sh, k_sb, k_sh, k_ss, M, K, d_s,
                S, n_old, init_offset, metric_ip, r64, b, h, g, bg, G, t, BLOCK_C: tl.constexpr,
                BLOCK_DS: tl.constexpr):
    """Tile ``t`` of row ``r``'s lookup table (subvector ``m = t // cdiv(K, BLOCK_C)``,
    centroids ``i * BLOCK_C ..`` with ``i = t % cdiv(K, BLOCK_C)``): writes those entries of
    ``lut f32 [B*H, M, K]``, and where ``h`` is its KV group's first head and the step has
    its new key, the key's nearest centroid of the block (``_block_nearest``: one block of
    ``_nearest``'s loop) into ``qd f32 / qc i32 [B*H_kv, M, cdiv(K, BLOCK_C)]``."""
    nch = tl.cdiv(K, BLOCK_C)
    m = t // nch
    i = t % nch
    d_c = d_s + metric_ip
    cbase = ((bg * M + m) * K) * d_c
    qrow = b.to(tl.int64) * q_sb + h.to(tl.int64) * q_sh + m * d_s
    offs_c = i * BLOCK_C + tl.arange(0, BLOCK_C)
    acc = tl.zeros([BLOCK_C], tl.float32)
    for d0 in range(0, d_s, BLOCK_DS):
        qv, cv = _lut_tile(q_ptr, qrow, cent_ptr, cbase, offs_c, d0 + tl.arange(0, BLOCK_DS), d_s, d_c, K, True)
        acc += _row_dots(cv, qv)
    tl.store(lut_ptr + (r64 * M + m) * K + offs_c, acc, mask=offs_c < K)
    if (h % G == 0) & (S - init_offset > n_old):
        krow = b.to(tl.int64) * k_sb + g.to(tl.int64) * k_sh + (init_offset + n_old) * k_ss + m * d_s
        phi = tl.load(phi_ptr + (bg * M + m) * metric_ip)  # euclidean: phi_ptr[0], unused
        dmin, cmin = _block_nearest(k_ptr, krow, cent_ptr, cbase, phi, d_s, d_c, K, metric_ip, i * BLOCK_C, BLOCK_C,
                                    BLOCK_DS)
        tl.store(qd_ptr + (bg * M + m) * nch + i, dmin)
        tl.store(qc_ptr + (bg * M + m) * nch + i, cmin)


@triton.jit
def _store_code(qd_ptr, qc_ptr, codes_ptr, bg, M, K, n_old, cap, MP: tl.constexpr, NCH: tl.constexpr,
                BLOCK_C: tl.constexpr):
    """The new key's codes from ``_table_tile``'s partial argmins: per subvector, the first
    block with the strictly least distance from ``(+inf, 0)``, as ``_nearest`` (a NaN
    distance never taken; code 0 where none is finite). All ``M x cdiv(K, BLOCK_C) <= MP x
    NCH`` partials are loaded at once."""
    nch = tl.cdiv(K, BLOCK_C)
    mm = tl.arange(0, MP)
    ii = tl.arange(0, NCH)
    on = (mm[:, None] < M) & (ii[None, :] < nch)
    off = (bg * M + mm[:, None]) * nch + ii[None, :]
    dmin = tl.load(qd_ptr + off, mask=on, other=float("inf"))
    cmin = tl.load(qc_ptr + off, mask=on, other=0)
    dmin = tl.where(dmin == dmin, dmin, float("inf"))
    best = tl.min(dmin, axis=1)
    first = tl.min(tl.where(dmin == best[:, None], ii[None, :], NCH), axis=1)
    code = tl.sum(tl.where(ii[None, :] == first[:, None], cmin, 0), axis=1)
    code = tl.where(best < float("inf"), code, 0)
    tl.store(codes_ptr + (bg * M + mm) * cap + n_old, code.to(tl.uint8), mask=mm < M)


@triton.jit
def _top_of(ge, base, above_0, need, N: tl.constexpr):
    """The last of ``N`` consecutive bins (or cluster segments) whose count from the top,
    ``ge[i] + above_0`` (``ge``: i32 ``[N]``, the counts in entries ``>= i``, not increasing;
    ``above_0``: the count above entry ``N - 1``), is at least ``need``, as ``base + i``,
    and the count above it: ``ge[i + 1] + above_0``, the largest count still below
    ``need``. The select keeps ``need <= ge[0] + above_0`` (the wanted candidate is in
    the range), so such an entry exists (``base + 0`` were none). One CTA-wide reduction
    of both."""
    i = tl.arange(0, N)
    g = ge.to(tl.int64) + above_0
    top, above = _red_max_max(tl.where(g >= need, i, -1), tl.where(g < need, g, above_0))
    return base + tl.maximum(top, 0), above


@triton.jit
def _bin_bounds(d, above, a, b, need, NB: tl.constexpr):
    """For the bin ``d`` of ``NB`` bins of ``[a, b)`` that holds the ``need``-th largest
    candidate (counting from the top; ``above`` of them in the bins above it): its exact
    rank bounds ``lo <= x < hi`` (the lowest ranks in bins ``>= d`` and ``>= d + 1``,
    ``_edge``), the candidates still wanted from it, and whether the row is resolved there
    (the bin one value, or its keys near-ties: ``_near_tie``)."""
    sc = NB / (b - a)
    x0 = _edge(a, b, sc, tl.maximum(d, 1), NB)
    x1 = _edge(a, b, sc, tl.minimum(d + 1, NB - 1), NB)
    lo = tl.where(d == 0, a, x0)
    hi = tl.where(d == NB - 1, b, x1)
    done = (_next_up(lo) >= hi) | _near_tie(lo, hi)
    return lo, hi, need - above, done


@triton.jit
def _tile_ranks(codes_ptr, lut_row, lbase, xbase, bg, M, K, cap, j, slot, kept, MP: tl.constexpr,
                KP: tl.constexpr, FIRST: tl.constexpr):
    """Ranks of a tile of the CTA's keys ``j`` (i32 ``[TILE]``) whose words in its rank
    cache (``xbase``) are ``slot``, ``kept`` where the whole tile has words there: read
    back from the cache after the first round (a shared load a key in place of ``M`` code
    loads from L2 and ``M`` table gathers), else scored from the codes and the table
    (``_part_scores``), and kept in the first round (``FIRST``)."""
    reuse = kept
    if FIRST:
        reuse = False
    if reuse:
        x = _lvl_read(xbase, slot).to(tl.float32, bitcast=True)
    else:
        x = _part_scores(codes_ptr, lut_row, bg, M, K, cap, j, MP, lbase, KP)
        if FIRST:
            if kept:
                _lvl_store(xbase, slot, x.to(tl.int32, bitcast=True))
    return x


@triton.jit
def _round_bin(codes_ptr, lut_row, lbase, base, xbase, bg, M, K, cap, w0, c, a, b, need, MP: tl.constexpr,
               KP: tl.constexpr, TILE: tl.constexpr, NB: tl.constexpr, CLUSTER: tl.constexpr,
               FIRST: tl.constexpr):
    """A round over the row's candidates (``j < w0``) of ranks in ``[a, b)``, binned into
    ``NB`` bins (``_vbin``): the bin ``d`` holding the ``need``-th largest and the count in
    the bins above it, the same in every CTA of the row's cluster. CTA ``c`` scores tiles
    ``c, c + CLUSTER, ..`` of ``TILE`` candidates into its own bins (the rounds' shared
    memory at ``base``: shared atomics). The cluster's bins are split into ``CLUSTER``
    segments of ``NBC = NB / CLUSTER``: after a cluster barrier CTA ``c`` sums segment
    ``c``'s bins over every CTA (distributed shared memory) and keeps their counts from
    the segment's top (a suffix sum) in the ``NBC`` words after its bins; after a second,
    every CTA reads the ``CLUSTER`` segment totals (each segment's first suffix sum), picks
    the segment ``s`` holding the ``need``-th largest, reads segment ``s``'s suffix sums
    and picks the bin in it (``_top_of`` twice): ``CLUSTER + NBC`` remote words a CTA, and
    scans over ``NBC`` bins, where reading every total (``NB`` words) and scanning them
    took ~2.5-3 us a round at (2, 8) heavy 3020 (NOTES.md). A CTA writes its bins again
    only after the second barrier of the round before, and its sums after the first of
    this one, when every read of them is done. (Adding each key's count straight into the
    owning CTA's bins, one barrier a round, was 6-8x slower: a distributed shared memory
    atomic is a round trip.) Under Triton's interpreter (no PTX, no distributed shared
    memory) every CTA counts the whole row itself by ``tl.histogram`` and picks by the
    same segments; with ``CLUSTER = 1`` (sm_80) the CTA counts the whole row in its own
    bins and its one segment is the row.

    The CTA's ``l``-th tile's ranks: ``_tile_ranks``, at words ``l * TILE ..`` of the
    CTA's rank cache (``xbase``; kept where the whole tile fits in its ``RANK_WORDS``)."""
    NBC: tl.constexpr = NB // CLUSTER
    i = tl.arange(0, NBC)
    sc = NB / (b - a)
    if INTERPRETED:
        cnt = tl.zeros([NB], tl.int32)
        for t0 in range(0, w0, TILE):
            j = t0 + tl.arange(0, TILE)
            x = _part_scores(codes_ptr, lut_row, bg, M, K, cap, j, MP, 0, 0)
            cnt += tl.histogram(_vbin(x, a, sc, NB), NB, mask=(j < w0) & (x >= a) & (x < b))
        if CLUSTER > 1:
            # the segments' totals, then segment s's suffix sums, from the whole row's counts
            qq = tl.arange(0, CLUSTER)
            seg = tl.reshape(cnt, [CLUSTER, NBC])
            s, above_s = _top_of(tl.cumsum(tl.sum(seg, axis=1), axis=0, reverse=True), 0, 0, need, CLUSTER)
            in_s = tl.sum(tl.where(qq[:, None] == s, seg, 0), axis=0)
            d, above = _top_of(tl.cumsum(in_s, axis=0, reverse=True), s * NBC, above_s, need, NBC)
        else:
            d, above = _top_of(tl.cumsum(cnt, axis=0, reverse=True), 0, 0, need, NB)
    else:
        tl.debug_barrier()  # this CTA's reads of its bins (the round before) done; its table copy written
        _lvl_store(base, tl.arange(0, NB), tl.zeros([NB], tl.int32))
        tl.debug_barrier()
        x0 = 0  # the tile's first word in the rank cache
        for t0 in range(c * TILE, w0, CLUSTER * TILE):
            j = t0 + tl.arange(0, TILE)
            x = _tile_ranks(codes_ptr, lut_row, lbase, xbase, bg, M, K, cap, j, x0 + tl.arange(0, TILE),
                            x0 + TILE <= RANK_WORDS, MP, KP, FIRST)
            _lvl_add(base, _vbin(x, a, sc, NB), tl.full([TILE], 1, tl.int32), (j < w0) & (x >= a) & (x < b))
            x0 += TILE
        if CLUSTER > 1:
            _cluster_sync()  # every CTA's bins complete
            tot = tl.zeros([NBC], tl.int32)
            for q in tl.static_range(CLUSTER):
                tot += _cluster_read(base + 4 * (c * NBC + i), q)
            _lvl_store(base, NB + i, tl.cumsum(tot, axis=0, reverse=True))
            _cluster_sync()  # every CTA's suffix sums complete
            qq = tl.arange(0, CLUSTER)
            s, above_s = _top_of(tl.cumsum(_cluster_read(base + 4 * NB + 0 * qq, qq), axis=0, reverse=True), 0, 0,
                                 need, CLUSTER)
            d, above = _top_of(_cluster_read(base + 4 * (NB + i), s), s * NBC, above_s, need, NBC)
        else:
            tl.debug_barrier()
            d, above = _top_of(tl.cumsum(_lvl_read(base, i), axis=0, reverse=True), 0, 0, need, NB)
    return d, above


@triton.jit
def pq_rsel_kernel(
    q_ptr, k_ptr, cent_ptr, phi_ptr, codes_ptr, lut_ptr, qd_ptr, qc_ptr, bnd_ptr, need_ptr, flag_ptr, ctr_ptr,  #
    q_sb, q_sh, k_sb, k_sh, k_ss,  #
    H, G, M, K, d_s, S, n_old, cap, heavy, init_offset, window, metric_ip, NP,  #
    MP: tl.constexpr, KP: tl.constexpr, TILE: tl.constexpr, NB: tl.constexpr, ROUNDS: tl.constexpr,
    CLUSTER: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_DS: tl.constexpr,
):
    """See the module docstring and README.md (launch contract)."""
    c = tl.program_id(0)  # the CTA's rank in its row's cluster
    r = tl.program_id(1)
    r64, b_, h, g, bg = _row_ids(r, H, G)
    lut_row = lut_ptr + r64 * M * K
    n, w0, k, _ = _row_sizes(S, init_offset, window, heavy, 0, 0)
    need = tl.minimum(k, w0).to(tl.int64)
    # the row's lookup table: CTA c takes tiles c, c + CLUSTER, .. (under the interpreter,
    # which runs the CTAs one after another, each CTA writes every tile: the same values)
    t0 = c
    dt = CLUSTER
    if INTERPRETED:
        t0 = 0
        dt = 1
    for t in range(t0, M * tl.cdiv(K, BLOCK_C), dt):
        _table_tile(q_ptr, k_ptr, cent_ptr, phi_ptr, qd_ptr, qc_ptr, lut_ptr, q_sb, q_sh, k_sb, k_sh, k_ss, M, K, d_s,
                    S, n_old, init_offset, metric_ip, r64, b_, h, g, bg, G, t, BLOCK_C, BLOCK_DS)
    if c == 0:
        # the emit's part flags of this row (and its ticket counter) start at zero
        for q0 in range(0, NP, 1024):
            qq = q0 + tl.arange(0, 1024)
            tl.store(flag_ptr + r64 * NP + qq, tl.zeros([1024], tl.int64), mask=qq < NP)
        if r == 0:
            tl.store(ctr_ptr, 0)
    if CLUSTER > 1:
        _cluster_sync()  # every CTA's table tiles written (and seen: release / acquire)
    else:
        tl.debug_barrier()
    if w0 <= k:
        # every candidate is taken (pq_emit adds the lowest masked keys up to k)
        if c == 0:
            _resolve(bnd_ptr, need_ptr, r, r64, -NO_PICK, -NO_PICK, need - need)
    elif need <= 0:
        if c == 0:
            _resolve(bnd_ptr, need_ptr, r, r64, NO_PICK, NO_PICK, need)
    else:
        tl.static_assert(NB <= LVL_WORDS)  # the CTA's bins
        if CLUSTER > 1:
            tl.static_assert(NB + NB // CLUSTER <= LVL_WORDS)  # and its totals
        base = 0
        lbase = 0
        xbase = 0
        if not INTERPRETED:
            base = _lvl_smem()
            lbase = _lut_smem()
            xbase = _rank_smem()
        a, b = _rank_bounds(lut_row, lbase, M, K, MP, KP)
        lo = a
        hi = b
        done = a > b  # false
        for lv in tl.static_range(ROUNDS):
            if not done:  # the same in every CTA of the cluster: the same counts
                d, above = _round_bin(codes_ptr, lut_row, lbase, base, xbase, bg, M, K, cap, w0, c, lo, hi, need, MP,
                                      KP, TILE, NB, CLUSTER, lv == 0)
                lo, hi, need, done = _bin_bounds(d, above, lo, hi, need, NB)
        if CLUSTER > 1:
            _cluster_sync()  # no CTA leaves while another may read its counts
        if c == 0:
            _resolve(bnd_ptr, need_ptr, r, r64, hi, lo, need)
    if (c == CLUSTER - 1) & (h % G == 0) & (n > n_old):
        _store_code(qd_ptr, qc_ptr, codes_ptr, bg, M, K, n_old, cap, MP, KP // BLOCK_C, BLOCK_C)


# ----------------------------------------------------------------------------------
# declarations for the build

DTYPES = ("fp32", "bf16", "fp16")
MPS = (2, 4, 8)  # code rows per key: M <= MP
#: CTAs per row's cluster on sm_90 (the portable cluster size); sm_80 has no clusters: one CTA a row
CLUSTER = 8
RSEL_FIXED = {"KP": 256, "NB": 2048, "ROUNDS": 3, "BLOCK_C": 64, "BLOCK_DS": 32}


def _rsel_args(qt):
    return (
        ptr("q_ptr", qt, False), ptr("k_ptr", qt, False), ptr("cent_ptr", "fp32"), ptr("phi_ptr", "fp32", False),
        ptr("codes_ptr", "u8"), ptr("lut_ptr", "fp32"), ptr("qd_ptr", "fp32"), ptr("qc_ptr", "i32"),
        ptr("bnd_ptr", "fp32"), ptr("need_ptr", "i32"), ptr("flag_ptr", "i64"), ptr("ctr_ptr", "i32"),
        i64("q_sb"), i64("q_sh"), i64("k_sb"), i64("k_sh"), i64("k_ss"), i32("H"), i32("G"), i32("M"), i32("K"),
        i32("d_s"), i32("S"), i32("n_old"), i32("cap", div16=True), i32("heavy"), i32("init_offset"),
        i32("window"), i32("metric_ip"), i32("NP"),
    )


KERNELS = []
for _mp in MPS:
    for _qt in DTYPES:
        KERNELS.append(
            Kernel(name=f"pq_rsel.m{_mp}.q_{_qt}", fn=pq_rsel_kernel, args=_rsel_args(_qt),
                   fixed=dict(RSEL_FIXED, MP=_mp),
                   variants={80: single({"TILE": 4096, "CLUSTER": 1}, 8, 1),
                             90: grid({"TILE": 2048, "CLUSTER": CLUSTER}, 4, 1, num_warps=(4, 8), TILE=(2048, 4096),
                                      CLUSTER=(CLUSTER, ))}))
