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
  search over the floats (``_bin_edges``: the lowest rank in bin ``d`` and the lowest in
  ``d + 1``, tested 32 floats at a time), so the bin is exactly the keys ``lo <= x <
  hi`` and ``pq_emit``'s comparisons select the same keys;
* the row is resolved when that bin holds one value, or is no wider than ``5e-5 (1 +
  |x|)`` (half the spec's tolerance ``1e-4 (1 + |score|)``: the keys in it are near-ties,
  taken in position order); else the next round bins ``[lo, hi)``.

Then ``pq_emit`` gets the split path's class bounds: ``t_sure = hi`` (every candidate at
or above it is taken), ``t_maybe = lo``, ``need`` (candidates in ``[lo, hi)`` taken in
position order while fewer than ``need`` are). Rounds have ``NB = 2048`` bins; two narrow
a range by 2^22, which resolves every row whose scores span less than about ``200 (1 +
|x|)`` (the usual case), and ranks span at most 2^17, so the third always resolves
(2^-16, under ``5e-5``).

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
``_nearest`` does (``_store_code``). A round: CTA ``c`` scores candidate tiles ``c, c +
CLUSTER, ..`` of ``TILE`` keys and counts those in the range into its own ``NB`` bins of
shared memory (shared atomics); after a cluster barrier CTA ``c`` sums its ``NB /
CLUSTER`` bins' counts over every CTA of the cluster (distributed shared memory) and,
after a second, every CTA reads all the sums, so every CTA takes the same bin and bounds
and needs no other message. The first round starts from the lookup table: ``[a, b)`` =
the ranks of ``lo = sum_m min_c lut[m, c]`` and just above ``hi`` (maxima), added in the
keys' order, so by the monotonicity of rounding every key lies in it; the full rank
range where the table holds a non-finite entry; ``need = min(k, w0)``. CTA 0 writes
``bnd f32 [B*H, 2]`` = ``(t_sure, t_maybe)`` and ``need i32 [B*H]`` (``k = 0``: nothing
is taken). Correct under any schedule: a cluster's CTAs run together (the hardware
places them at once), and no CTA waits on another cluster. This replaced launches of a
round kernel each (the row's CTAs adding to global counts and the last to arrive closing
the round), which cost ~11 us a round at (2, 8) heavy 3020 (NOTES.md, "the radix
select in one cluster a row"), and a table launch before it (``pq_rlut``, one CTA per
(row, subvector, centroid block)).

Launch contract: README.md in this directory. A row whose candidates are at most ``k``
(``w0 <= k``) takes them all: it is resolved at once (``t_sure`` below every rank, ``need
= 0``), ``pq_emit`` adding the lowest masked keys up to ``k``. Host preconditions: no new
key among the candidates (``w0 <= n_old``) and at most one new key.
"""

import triton
import triton.language as tl

from kspec import Kernel, grid, i32, i64, ptr, single
from pq_select import RANK_INF, RANK_NAN, _block_nearest, _lut_tile, _rank_score, _row_dots
from pq_hist import LVL_WORDS, _lvl_add, _lvl_read, _lvl_smem, _lvl_zero, _row_ids, _row_sizes
from pq_select import INTERPRETED
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
def _resolve(bnd_ptr, need_ptr, r, r64, t_sure, t_maybe, need):
    """The row's class bounds for ``pq_emit``."""
    tl.store(bnd_ptr + 2 * r64, t_sure)
    tl.store(bnd_ptr + 2 * r64 + 1, t_maybe)
    tl.store(need_ptr + r, need.to(tl.int32))


@triton.jit
def _cluster_sync():
    """Barrier of every thread of the CTA's cluster; shared and global writes before it are
    seen after it (release / acquire at cluster scope)."""
    tl.inline_asm_elementwise("barrier.cluster.arrive.release;\n\tbarrier.cluster.wait.acquire;\n\tmov.b32 $0, 0;",
                              "=r", [], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _smem_store(base, i, v):
    """Stores ``v`` into words ``i`` of the shared memory at ``base``."""
    tl.inline_asm_elementwise("st.shared.b32 [$1], $2;\n\tmov.b32 $0, 0;", "=r,r,r", [base + 4 * i, v], dtype=tl.int32,
                              is_pure=False, pack=1)


@triton.jit
def _cluster_read(addr, rank):
    """Words at shared-window addresses ``addr`` (i32 tensor) of the cluster's CTA ``rank``
    (distributed shared memory: ``mapa`` then ``ld.shared::cluster``)."""
    return tl.inline_asm_elementwise(
        "{ .reg .b32 %ra; mapa.shared::cluster.u32 %ra, $1, $2; ld.shared::cluster.b32 $0, [%ra]; }", "=r,r,r",
        [addr, rank + tl.zeros_like(addr)], dtype=tl.int32, is_pure=False, pack=1)


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


@triton.jit
def _round_counts(codes_ptr, lut_row, base, bg, M, K, cap, w0, c, a, b, MP: tl.constexpr, TILE: tl.constexpr,
                  NB: tl.constexpr, CLUSTER: tl.constexpr):
    """The row's candidates (``j < w0``) of ranks in ``[a, b)`` per bin of ``NB`` bins
    (``_vbin``), i32 ``[NB]``, the same in every CTA of the row's cluster. CTA ``c`` scores
    tiles ``c, c + CLUSTER, ..`` of ``TILE`` candidates into its own bins (the rounds'
    shared memory at ``base``: shared atomics); after a cluster barrier CTA ``c`` sums bins
    ``c * NB / CLUSTER ..`` of every CTA (distributed shared memory) into its totals (the
    words after its bins) and, after a second, every CTA reads every CTA's totals. A CTA
    writes its bins again only after the second barrier of the round before, and its
    totals after the first of this one, when every read of them is done. (Adding each
    key's count straight into the owning CTA's totals, one barrier a round, was 6-8x
    slower: a distributed shared memory atomic is a round trip.) Under Triton's
    interpreter (no PTX, no distributed shared memory) every CTA counts the whole row
    itself, by ``tl.histogram`` s: the same counts."""
    bins = tl.arange(0, NB)
    sc = NB / (b - a)
    if INTERPRETED:
        cnt = tl.zeros([NB], tl.int32)
        for t0 in range(0, w0, TILE):
            j = t0 + tl.arange(0, TILE)
            x = _part_scores(codes_ptr, lut_row, bg, M, K, cap, j, MP)
            cnt += tl.histogram(_vbin(x, a, sc, NB), NB, mask=(j < w0) & (x >= a) & (x < b))
    else:
        tl.debug_barrier()  # this CTA's reads of its bins (the round before) are done
        _lvl_zero(base, bins)
        tl.debug_barrier()
        for t0 in range(c * TILE, w0, CLUSTER * TILE):
            j = t0 + tl.arange(0, TILE)
            x = _part_scores(codes_ptr, lut_row, bg, M, K, cap, j, MP)
            _lvl_add(base, _vbin(x, a, sc, NB), tl.full([TILE], 1, tl.int32), (j < w0) & (x >= a) & (x < b))
        if CLUSTER > 1:
            NBC: tl.constexpr = NB // CLUSTER
            i = tl.arange(0, NBC)
            _cluster_sync()  # every CTA's bins complete
            tot = tl.zeros([NBC], tl.int32)
            for q in tl.static_range(CLUSTER):
                tot += _cluster_read(base + 4 * (c * NBC + i), q)
            _smem_store(base, NB + i, tot)
            _cluster_sync()  # every CTA's totals complete
            cnt = _cluster_read(base + 4 * (NB + bins % NBC), bins // NBC)
        else:
            tl.debug_barrier()
            cnt = _lvl_read(base, bins)
    return cnt


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
        if not INTERPRETED:
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
        if not INTERPRETED:
            base = _lvl_smem()
        a, b = _rank_bounds(lut_row, M, K, MP, KP)
        lo = a
        hi = b
        done = a > b  # false
        for lv in tl.static_range(ROUNDS):
            if not done:  # the same in every CTA of the cluster: the same counts
                cnt = _round_counts(codes_ptr, lut_row, base, bg, M, K, cap, w0, c, lo, hi, MP, TILE, NB, CLUSTER)
                lo, hi, need, done = _bin_bounds(cnt, lo, hi, need, NB)
        if CLUSTER > 1:
            if not INTERPRETED:
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
