"""The decode step with the codes also kept as buckets per combination (``K^M <=
4096``): the heavy keys are gathered, not searched for.

``pq_hist`` finds the threshold on the row's combination histogram, then reads every
code of the row again to find the keys above it. Here each row also keeps, per
combination, the candidate keys that carry it (``bkt i32 [B*H, NC, CAPC]``, filled by
the same atomics that move the histogram: the count an atomic returns is the key's
slot), so the row gathers the keys of the few combinations near the top (a few hundred
entries), picks the heavy ones among them and writes them.

Who writes ``weight_list``'s zeros and sink / window ones (``fill``, a runtime
argument): with ``fill = 0``, ``pq_wfill_kernel`` (sm_90: TRIGGER=1) over every SM, letting
``pq_index_kernel``, launched as its programmatic dependent, start at once (the row CTAs
write their heavy ones after ``griddepcontrol.wait``), or on sm_80 (PDL=0, no
``pq_wfill``) each row CTA its own row first; with ``fill = 1`` (one launch, no PDL
attribute, or as ``pq_quant``'s dependent: below) each row's companion CTA. Then the row
CTA and its companion each arrive once
on ``ready[r]`` (an acq_rel counter) when done, and the second to arrive writes the ones
of ``sparse_list[r]`` over the companion's zeros (``_ones_if_last``). No CTA ever waits
for another CTA of the launch: the step is correct under any CTA schedule.

``pq_index_kernel``, grid ``(B*H, 2)``. The companion CTA (``(r, 1)``, or ``(r, 0)``
with ``fill``): with ``fill``, row ``r``'s weights and its arrival; then the new keys'
codes as in ``pq_hist``. The row CTA:

1. (PDL=0 without ``fill``) writes row ``r``'s ``weight_list`` (1 in the sink and the
   window, else 0);
2. moves the combination histogram ``hist[r]`` from the keys ``j < histn[r]`` it counts
   to the candidates ``j < w0`` (keys only join: when ``w0 < histn[r]`` it recounts from
   zero), each joining key stored at ``bkt[r, combo, slot]`` where ``slot`` is the count
   its atomic returned (kept only while ``slot < CAPC``);
3. the lookup table and the combination scores as ``pq_hist`` (with ``M = 2``, a table
   of one tile: its loads and the histogram's issued before step 2, the table kept in
   registers, each combination's entries gathered on chip), then up to CUTS
   eight-way cuts of the score range (one reduction each) to a bound ``lo`` above which
   at least ``need = min(k, w0)`` and at most ``TP`` candidate keys lie;
4. when every heavy pick lies between sink and window (``init_offset >= sink'``, ``w0 >=
   k``) and no combination holds more than ``CAPC`` keys: gathers the keys scoring ``>=
   lo`` (slots from one prefix sum over the combinations, each slot's combination from a
   running max over start marks in ``mark i32 [B*H, TP]``, left zero), takes the
   ``need`` best by (score descending, position ascending) (a bitonic top-k of TP/2 when
   ``need <= TP/2``, else a sort of all TP), orders them by position with a second sort,
   and writes them to ``sparse_list`` (with sink and window) and their weights. Other
   rows find the threshold as ``pq_hist`` (level rounds) and gather the taken
   combinations' keys when they fit (``_gather_emit``), else run ``pq_hist``'s emit (one
   pass over their codes).

``after_quant`` (a runtime argument, 0 or 1): 1 where ``pq_quant`` wrote this step's new
keys' codes and the kernel is its programmatic dependent (sm_90; after ``pq_wfill`` ->
``pq_quant`` with ``fill = 0``, after ``pq_quant`` alone with ``fill = 1``): each row CTA
waits for it (``griddepcontrol.wait``) once the table's and histogram's loads are issued,
before the first code is read; ``pq_quant`` waits for its own primary before it exits, so
that wait also covers ``pq_wfill``'s zeros. 0 otherwise (the row CTA reads codes at
once).

Host preconditions as ``pq_hist`` (the step's new keys are not candidates: ``w0 <=
n_old``); ``hist``, ``histn``, ``mark``, ``ready`` zero-filled once, ``hist`` and
``histn`` again after the codes are replaced or ``CAPC`` changes (``bkt`` needs no
initial value).
"""
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from kspec import Kernel, grid, i32, i64, ptr, single
from pq_select import _lut_tile, _rank_score, _row_dots
from pq_hist import (DTYPES, FIXED as HIST_FIXED, INTERPRETED, _combo_scores, _combos, _head_lut, _quantize_cta,
                     _red_add_max, _rounds, _row_ids, _row_pass, _row_sizes, _stamp, _store_stamps)


@triton.jit
def _bucket_move(codes_ptr, hist_row, histn_ptr, bkt_row, r, hn, bg, M, bits, cap, w0, CAPC, MP: tl.constexpr,
                 DT: tl.constexpr, NC: tl.constexpr):
    """Move row ``r``'s histogram from the keys ``j < hn`` it counts to the candidates ``j <
    w0`` and file each joining key in its combination's bucket (slot = the count before it
    joined); recount from zero when keys would leave (``w0 < hn``: never in a decode loop).
    ``hn`` is ``histn[r]`` as every thread read it before a CTA barrier: a thread that
    re-read it here could see the ``w0`` a faster warp already stored and skip its keys."""
    if hn > w0:
        tl.store(hist_row + tl.arange(0, NC), tl.zeros([NC], tl.int32))
        tl.debug_barrier()
        hn = 0
    for j0 in range(hn, w0, DT):
        jd = j0 + tl.arange(0, DT)
        jm = jd < w0
        combo = _combos(codes_ptr, bg, M, bits, cap, jd, jm, MP)
        slot = tl.atomic_add(hist_row + combo, tl.full([DT], 1, tl.int32), mask=jm, sem="relaxed")
        tl.store(bkt_row + combo.to(tl.int64) * CAPC + slot, jd, mask=jm & (slot < CAPC))
    tl.store(histn_ptr + r, w0)


@triton.jit
def _combo_scores_m2(q0, cen0, q1, cen1, cnt, lut_row, K, bits, NC: tl.constexpr):
    """``_head_lut`` then ``_combo_scores`` (ranks of the scores) for ``M = 2`` from one loaded ``_lut_tile`` per
    subvector, the table kept in registers (each combination's two entries gathered on
    chip, ``tl.gather``, not read back from ``lut_row``; still written, for the fallback
    pass over the codes). The table is reduced as ``_head_lut`` reduces it and the entries are
    added as ``_combo_scores`` adds them, so the scores are the same bits. ``cnt``: the
    row's histogram (``hist_row``'s first NC entries). H100, JIT harness, companion fill
    (NOTES.md, "the lookup table in registers, its loads under the histogram move"): reference 11.5-11.7 -> 10.9-11.1 us GPU per step, S=65536
    16.1-16.5 -> 12.8."""
    lut0 = _row_dots(cen0, q0)
    lut1 = _row_dots(cen1, q1)
    c = tl.arange(0, lut0.shape[0])
    tl.store(lut_row + c, lut0, mask=c < K)
    tl.store(lut_row + K + c, lut1, mask=c < K)
    cc = tl.arange(0, NC)
    cvalid = cc < (1 << (2 * bits))
    s = tl.zeros([NC], tl.float32)
    s += tl.where(cvalid, tl.gather(lut0, (cc >> bits) & (K - 1), 0), 0.0)
    s += tl.where(cvalid, tl.gather(lut1, cc & (K - 1), 0), 0.0)
    return tl.where(cvalid, cnt, 0), _rank_score(s)


@triton.jit
def _min_max_max(a0, b0, c0, a1, b1, c1):
    return tl.minimum(a0, a1), tl.maximum(b0, b1), tl.maximum(c0, c1)


@triton.jit
def _red_min_max_max(a, b, c):
    """``(min(a), max(b), max(c))`` over axis 0 in one reduction."""
    if INTERPRETED:
        return tl.min(a, axis=0), tl.max(b, axis=0), tl.max(c, axis=0)
    else:
        return tl.reduce((a, b, c), 0, _min_max_max)


@triton.jit
def _add8(a0, b0, c0, d0, e0, f0, g0, h0, a1, b1, c1, d1, e1, f1, g1, h1):
    return a0 + a1, b0 + b1, c0 + c1, d0 + d1, e0 + e1, f0 + f1, g0 + g1, h0 + h1


@triton.jit
def _keys_at(w, s, p0, p1, p2, p3, p4, p5, p6, p7):
    """The keys scoring ``>= p_i`` for eight bounds (``w``: each combination's candidate
    keys, 0 where out of play), in one reduction."""
    a0 = tl.where(s >= p0, w, 0)
    a1 = tl.where(s >= p1, w, 0)
    a2 = tl.where(s >= p2, w, 0)
    a3 = tl.where(s >= p3, w, 0)
    a4 = tl.where(s >= p4, w, 0)
    a5 = tl.where(s >= p5, w, 0)
    a6 = tl.where(s >= p6, w, 0)
    a7 = tl.where(s >= p7, w, 0)
    if INTERPRETED:
        return (tl.sum(a0, axis=0), tl.sum(a1, axis=0), tl.sum(a2, axis=0), tl.sum(a3, axis=0), tl.sum(a4, axis=0),
                tl.sum(a5, axis=0), tl.sum(a6, axis=0), tl.sum(a7, axis=0))
    else:
        return tl.reduce((a0, a1, a2, a3, a4, a5, a6, a7), 0, _add8)


@triton.jit
def _pick(lo, tot, hi, need, p, n_p):
    """One bound of a cut, highest last: ``(lo, tot, hi)`` moves up to ``p`` when at
    least ``need`` keys score ``>= p`` (``n_p`` of them), else ``hi`` comes down to it."""
    up = n_p >= need
    return tl.where(up, p, lo), tl.where(up, n_p, tot), tl.where(up, hi, tl.minimum(hi, p))


@triton.jit
def _select_cut(cnt, s, w0, need, TP: tl.constexpr, CUTS: tl.constexpr):
    """A score bound ``lo`` above which the candidates hold at least ``need`` and, where
    it can be found, at most ``TP`` keys: up to CUTS eight-way cuts by comparison (one
    reduction each, no atomics); the first cuts the top 1/2 .. 1/256 of the live score
    range, each later one the interval between the last bound that holds ``need`` keys
    and the first that does not into nine. Returns ``(lo, tot, big)``: ``tot`` keys
    score ``>= lo`` (more than TP where the cuts could not separate them: ties), ``big``
    the most keys any combination holds."""
    alive = cnt > 0
    w = tl.where(alive, cnt, 0)
    slo, shi, big = _red_min_max_max(tl.where(alive, s, float("inf")), tl.where(alive, s, -float("inf")), w)
    lo = slo
    tot = w0
    hi = shi
    span = shi - slo
    for cut in tl.static_range(CUTS):
        if tot > TP:
            if cut == 0:
                p0 = shi - span * 0.5
                p1 = shi - span * 0.25
                p2 = shi - span * 0.125
                p3 = shi - span * 0.0625
                p4 = shi - span * 0.03125
                p5 = shi - span * 0.015625
                p6 = shi - span * 0.0078125
                p7 = shi - span * 0.00390625
            else:
                d = (hi - lo) * (1.0 / 9.0)
                p0 = lo + d
                p1 = lo + d * 2.0
                p2 = lo + d * 3.0
                p3 = lo + d * 4.0
                p4 = lo + d * 5.0
                p5 = lo + d * 6.0
                p6 = lo + d * 7.0
                p7 = lo + d * 8.0
            n0, n1, n2, n3, n4, n5, n6, n7 = _keys_at(w, s, p0, p1, p2, p3, p4, p5, p6, p7)
            lo, tot, hi = _pick(lo, tot, hi, need, p0, n0)
            lo, tot, hi = _pick(lo, tot, hi, need, p1, n1)
            lo, tot, hi = _pick(lo, tot, hi, need, p2, n2)
            lo, tot, hi = _pick(lo, tot, hi, need, p3, n3)
            lo, tot, hi = _pick(lo, tot, hi, need, p4, n4)
            lo, tot, hi = _pick(lo, tot, hi, need, p5, n5)
            lo, tot, hi = _pick(lo, tot, hi, need, p6, n6)
            lo, tot, hi = _pick(lo, tot, hi, need, p7, n7)
    return lo, tot, big


@triton.jit
def _zeros_written(PDL: tl.constexpr):
    """With PDL=1, wait until ``pq_wfill`` (launched as this grid's primary) has written
    every weight, before the row's heavy ones go over them (``griddepcontrol.wait``: the
    primary grid has completed and its stores are visible; every primary CTA was running
    before this grid started, so the wait always ends). Without PDL nothing to wait for:
    the row CTA wrote its own zeros (before a CTA barrier), or its companion CTA writes them
    and ``_ones_if_last`` repairs the ones."""
    if PDL:
        gdc_wait()


@triton.jit
def _ones_if_last(ready_ptr, r, sl_row, w_row, total, FT: tl.constexpr):
    """Companion fill (``fill = 1``): the row CTA (``sparse_list`` row written) and its
    companion CTA (zeros and sink / window ones written) each arrive here once; the second
    to arrive writes a one at every position of ``sparse_list[r, :total]``, over whatever
    zero the companion wrote at a heavy position, and resets ``ready[r]``. No CTA waits
    for another, so the answer holds under any CTA schedule (the arrival is acq_rel at
    GPU scope, after a CTA barrier: the first CTA's stores are visible to the second)."""
    tl.debug_barrier()  # every thread's stores before the arrival
    arrived = tl.atomic_add(ready_ptr + r, 1, sem="acq_rel", scope="gpu")
    if arrived == 1:
        q = tl.arange(0, FT)
        one = tl.full([FT], 1.0, tl.float32).to(w_row.dtype.element_ty)
        for p0 in range(0, total, FT):
            p = p0 + q
            pos = tl.load(sl_row + p, mask=p < total, other=0, cache_modifier=".cg")
            tl.store(w_row + pos, one, mask=p < total)
        tl.store(ready_ptr + r, 0)  # left zero for the next launch


@triton.jit
def _max_op(a, b):
    return tl.maximum(a, b)


@triton.jit
def _gather_slots(selc, tot, s, bkt_row, mark_row, CAPC, NC: tl.constexpr, TP: tl.constexpr):
    """The keys of the combinations with ``selc > 0`` (``selc[c]`` of combination ``c``'s,
    ``tot`` in all, ``<= TP``) gathered from the buckets: slots from one prefix sum over
    the combinations, each slot's combination from a running max over start marks in
    ``mark_row`` (left as they are: the caller zeroes them). Returns ``(t, valid, jj,
    sc)``: slot ids, slots in use, key ids and scores (each its combination's score in
    ``s``, gathered on chip: ``tl.gather``)."""
    cc = tl.arange(0, NC)
    off = tl.cumsum(selc, axis=0) - selc
    # start marks: slot off[c] holds (off[c] * NC + c) + 1 for each taken combination
    tl.store(mark_row + off, off * NC + cc + 1, mask=selc > 0)
    tl.debug_barrier()
    t = tl.arange(0, TP)
    mk = tl.load(mark_row + t, cache_modifier=".cg")
    pk = tl.associative_scan(mk, 0, _max_op) - 1
    valid = t < tot
    c = tl.where(valid, pk % NC, 0)
    jj = tl.load(bkt_row + c.to(tl.int64) * CAPC + (t - pk // NC), mask=valid, other=0)
    sc = tl.gather(s, c, 0)
    return t, valid, jj, sc


@triton.jit
def _gather_emit(common, cnt, s, t_sure, t_maybe, need, bkt_row, mark_row, sl_row, w_row, k,
                 s_sink, init_offset, CAPC, NC: tl.constexpr, TP: tl.constexpr, PDL: tl.constexpr):
    """Step 4's gather (see the module docstring) where ``common``; returns whether it ran
    (not when the taken combinations do not fit: a bucket over CAPC, more than TP keys)."""
    selc = tl.where((s >= t_maybe) & (cnt > 0), cnt, 0)
    tot, big = _red_add_max(selc, selc)
    fits = common & (big <= CAPC) & (tot <= TP)
    if fits:
        t, valid, jj, sc = _gather_slots(selc, tot, s, bkt_row, mark_row, CAPC, NC, TP)
        # sorted by position, the maybe flag (score below t_sure) in bit 0; maybe keys are
        # taken in position order while fewer than need are
        key = tl.sort(tl.where(valid, jj * 2 + (sc < t_sure).to(tl.int32), 0x7FFFFFFF))
        mb = key & 1
        mrank = tl.cumsum(mb, axis=0) - mb
        kk = ((key != 0x7FFFFFFF) & ((mb == 0) | (mrank < need))).to(tl.int32)
        rank = tl.cumsum(kk, axis=0) - kk
        pos = (key >> 1) + init_offset
        tl.store(sl_row + s_sink + rank, pos.to(tl.int64), mask=kk != 0)
        _zeros_written(PDL)
        tl.store(w_row + pos, tl.full([TP], 1.0, tl.float32).to(w_row.dtype.element_ty), mask=kk != 0)
        tl.store(mark_row + t, tl.zeros([TP], tl.int32))
    return fits


@triton.jit
def _emit_best(best, i, need, init_offset, sl_row, s_sink, w_row, PDL: tl.constexpr):
    """The first ``need`` of ``best`` (keys best first, the position in the low 32 bits;
    ``i``: their indices) sorted by position into ``sparse_list[s_sink ..]``, and their
    ones into ``weight_list`` (after the row's zeros are written)."""
    take = i < need
    pos = tl.sort(tl.where(take, (best & 0xFFFFFFFF).to(tl.int32), 0x7FFFFFFF)) + init_offset
    tl.store(sl_row + s_sink + i, pos.to(tl.int64), mask=take)
    _zeros_written(PDL)
    tl.store(w_row + pos, tl.full(pos.shape, 1.0, tl.float32).to(w_row.dtype.element_ty), mask=take)


@triton.jit
def _gather_select(cnt, s, lo, tot, need, bkt_row, mark_row, sl_row, w_row, s_sink, init_offset,
                   CAPC, NC: tl.constexpr, TP: tl.constexpr, PDL: tl.constexpr):
    """The heavy keys when the candidates scoring ``>= lo`` are ``tot`` (``need <= tot <=
    TP``) and no bucket overflowed: gathers them all (slots from one prefix sum over the
    combinations, each slot's combination from a running max over start marks in
    ``mark_row``, left zero), takes the ``need`` best by (score descending, position
    ascending), orders those by position with a second sort and writes them to
    ``sparse_list[s_sink ..]`` and their weights. With ``need <= TP/2`` the best TP/2 come
    from a bitonic top-k (``tl.topk``) and the position sort is of TP/2 keys: 0.3-0.5 us
    less per step than two sorts of TP (H100, NOTES.md, "a top-k of half the gathered keys")."""
    selc = tl.where((s >= lo) & (cnt > 0), cnt, 0)
    t, valid, jj, sc = _gather_slots(selc, tot, s, bkt_row, mark_row, CAPC, NC, TP)
    # (score descending, position ascending) as one i64: the negated score's bits made
    # to order as signed integers (0 - sc: no -0.0), the position below
    nb = (0.0 - sc).to(tl.int32, bitcast=True)
    nb = nb ^ ((nb >> 31) & 0x7FFFFFFF)
    key = tl.where(valid, (nb.to(tl.int64) << 32) | jj.to(tl.int64), 0x7FFFFFFFFFFFFFFF)
    if need <= TP // 2:
        # the TP/2 smallest keys by a bitonic top-k of the complements (largest first)
        _emit_best(~tl.topk(~key, TP // 2), tl.arange(0, TP // 2), need, init_offset, sl_row, s_sink, w_row, PDL)
    else:
        _emit_best(tl.sort(key), t, need, init_offset, sl_row, s_sink, w_row, PDL)
    tl.store(mark_row + t, tl.zeros([TP], tl.int32))


@triton.jit
def _fill_row(w_ptr, w_row, r64, S, s_sink, ws, FT: tl.constexpr):
    """Row ``r``'s weights: 1 in the sink (``p < s_sink``) and the window (``p >= ws``), 0
    elsewhere; the row's flat range ``[r*S, r*S + S)`` in 16-byte stores from its first
    element on a 16-byte boundary."""
    wty = w_ptr.dtype.element_ty
    VEC: tl.constexpr = 128 // wty.primitive_bitwidth
    base = r64 * S
    a0 = ((base + VEC - 1) // VEC * VEC - base).to(tl.int32)  # first row offset on a 16-byte boundary
    qv = tl.arange(0, VEC)
    tl.store(w_row + qv, ((qv < s_sink) | (qv >= ws)).to(tl.float32).to(wty), mask=qv < tl.minimum(a0, S))
    for p0 in range(a0, S, FT):
        p = p0 + tl.arange(0, FT)
        wp = tl.multiple_of(w_ptr + (base + p0), 16) + tl.arange(0, FT)
        tl.store(wp, ((p < s_sink) | (p >= ws)).to(tl.float32).to(wty), mask=p < S)


@triton.jit
def pq_wfill_kernel(w_ptr, rows, S, sink, window, FT: tl.constexpr, TRIGGER: tl.constexpr = 1):
    """``weight_list`` (``rows * S < 2^31`` elements, flat) before ``pq_index``: 1 in each
    row's sink and window, else 0; a persistent grid (CTA ``i`` of ``n`` takes every
    ``n``-th block of FT elements, 16-byte stores). With TRIGGER=1 it lets its dependent
    launch start at once (``griddepcontrol.launch_dependents``): ``pq_index``, launched as
    its programmatic dependent, waits for this grid only before its heavy ones. This
    kernel itself is launched without the programmatic attribute (manifest
    ``launch_pdl`` false): it waits for nothing, so it must start only after the work
    before it on the stream has completed and its stores are visible."""
    if TRIGGER:
        gdc_launch_dependents()
    wty = w_ptr.dtype.element_ty
    s_sink = tl.minimum(sink, S)
    ws = S - tl.minimum(window, S)
    total = rows * S
    i = tl.program_id(0)
    n = tl.num_programs(0)
    for blk in range(i, tl.cdiv(total, FT), n):
        f0 = blk * FT
        p = f0 - (f0 // S) * S + tl.arange(0, FT)  # row position, past S where the block crosses a row
        if S >= FT:
            p = tl.where(p >= S, p - S, p)
        else:
            p = p % S
        tl.store(tl.multiple_of(w_ptr + f0.to(tl.int64), 16) + tl.arange(0, FT),
                 ((p < s_sink) | (p >= ws)).to(tl.float32).to(wty), mask=f0 + tl.arange(0, FT) < total)


@triton.jit
def _index_row(q_ptr, cent_ptr, codes_ptr, hist_ptr, histn_ptr, lut_ptr, bkt_ptr, mark_ptr, sl_row, w_row, r,
               r64, b, h, bg, q_sb, q_sh, M, K, bits, d_s, d_c, cap, CAPC, n, w0, k, s_sink, s_win, ws, init_offset,
               nc_old, after_quant, MP: tl.constexpr, NC: tl.constexpr, NB: tl.constexpr, LEVELS: tl.constexpr,
               TILE: tl.constexpr, DT: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_DS: tl.constexpr, TP: tl.constexpr,
               FT: tl.constexpr, CUTS: tl.constexpr, PDL: tl.constexpr, TIMER: tl.constexpr, RESET: tl.constexpr):
    """Steps 2-4 of a row CTA (see the module docstring) at the row's own sizes: ``n``
    quantized keys, candidates ``j < w0``, ``k`` heavy picks, ``sink'`` / ``window'``
    (``ws = S - window'``); ``sparse_list`` row ``sl_row`` written in full (sink, heavy,
    window), its heavy weights into ``w_row`` (after ``_zeros_written``). With ``RESET``
    (ragged steps) the histogram is recounted when it counts more keys than ``nc_old``
    (codes past a lowered count may have been rewritten). With ``PDL`` and ``after_quant
    != 0`` the primary grid writes the new keys' codes (``pq_quant``): wait for it before
    the first code is read, after the table's and the histogram's loads are issued.
    Returns the phase stamps ``(t1, t2, t3, t4)``."""
    hist_row = hist_ptr + r64 * NC
    bkt_row = bkt_ptr + r64 * NC * CAPC
    lut_row = lut_ptr + r64 * M * K
    # M = 2 with a table that fits one tile: the table's and the histogram's loads are
    # issued before the move, their latency under its atomics (the row's histogram
    # changes only here: where exactly one key joins, its combination is added in
    # registers), and the table stays in registers
    fast = (M == 2) & (K <= BLOCK_C) & (d_s <= BLOCK_DS)
    qrow = b.to(tl.int64) * q_sb + h.to(tl.int64) * q_sh
    oc = tl.arange(0, BLOCK_C)
    od = tl.arange(0, BLOCK_DS)
    q0, cen0 = _lut_tile(q_ptr, qrow, cent_ptr, (bg * 2 * K) * d_c, oc, od, d_s, d_c, K, fast)
    q1, cen1 = _lut_tile(q_ptr, qrow + d_s, cent_ptr, ((bg * 2 + 1) * K) * d_c, oc, od, d_s, d_c, K, fast)
    cc = tl.arange(0, NC)
    cnt = tl.load(hist_row + cc, mask=fast & (cc < (1 << (2 * bits))), other=0, cache_modifier=".cg")
    hn = tl.load(histn_ptr + r)
    if PDL:
        if after_quant != 0:
            gdc_wait()
    if RESET:
        # codes the histogram counts may have been rewritten (a row's count lowered below
        # them): count the candidates anew (_bucket_move recounts when hn > w0)
        hn = tl.where(hn > nc_old, 0x3FFFFFFF, hn)
    one = fast & (w0 == hn + 1)
    cmb = (tl.load(codes_ptr + (bg * 2) * cap + hn, mask=one, other=0).to(tl.int32) << bits) | tl.load(
        codes_ptr + (bg * 2 + 1) * cap + hn, mask=one, other=0).to(tl.int32)
    # ordered before the move's atomics (a CTA barrier: the prefetched counts must not
    # see them)
    tl.debug_barrier()
    # 2-3. histogram and buckets, lookup table, threshold
    _bucket_move(codes_ptr, hist_row, histn_ptr, bkt_row, r, hn, bg, M, bits, cap, w0, CAPC, MP, DT, NC)
    t1 = _stamp(TIMER)
    if fast:
        if one:
            cnt += (cc == cmb).to(tl.int32)
        elif w0 != hn:
            tl.debug_barrier()  # every thread's atomics
            cnt = tl.load(hist_row + cc, cache_modifier=".cg")
        cnt, s = _combo_scores_m2(q0, cen0, q1, cen1, cnt, lut_row, K, bits, NC)
        tl.debug_barrier()  # the buckets, the table, the weights' zeros: before any read or heavy one
        t2 = _stamp(TIMER)
    else:
        _head_lut(q_ptr, cent_ptr, lut_row, q_sb, q_sh, b, h, bg, M, K, d_s, d_c, BLOCK_C, BLOCK_DS)
        tl.debug_barrier()  # the atomics, the table, the weights' zeros: before any read or heavy one
        t2 = _stamp(TIMER)
        cnt, s = _combo_scores(hist_row, lut_row, M, K, bits, NC)
    t3 = _stamp(TIMER)
    common = (init_offset >= s_sink) & (w0 >= k)
    need = tl.minimum(k, w0)
    lo, tot, big = _select_cut(cnt, s, w0, need, TP, CUTS)
    t4 = _stamp(TIMER)
    if common & (tot <= TP) & (big <= CAPC):
        _gather_select(cnt, s, lo, tot, need, bkt_row, mark_ptr + r64 * TP, sl_row, w_row,
                       s_sink, init_offset, CAPC, NC, TP, PDL)
        done = tot <= TP
        t_sure = lo  # unused: the pass over the codes below runs only in the other branch
        t_maybe = lo
    else:
        t_sure, t_maybe, need = _rounds(cnt, s, need, NC, NB, LEVELS)
        done = _gather_emit(common, cnt, s, t_sure, t_maybe, need, bkt_row, mark_ptr + r64 * TP, sl_row,
                            w_row, k, s_sink, init_offset, CAPC, NC, TP, PDL)
    if done:
        q = tl.arange(0, FT)
        for p0 in range(0, s_sink, FT):
            p = p0 + q
            tl.store(sl_row + p, p.to(tl.int64), mask=p < s_sink)
        for p0 in range(0, s_win, FT):
            p = p0 + q
            tl.store(sl_row + s_sink + k + p, (ws + p).to(tl.int64), mask=p < s_win)
    else:
        # pq_hist's emit: one pass over the row's codes
        _zeros_written(PDL)
        _row_pass(codes_ptr + bg * M * cap, lut_row, sl_row, w_row, cap, M, K, n, w0, k, s_sink, ws, init_offset,
                  t_sure, t_maybe, need, MP, TILE)
    return t1, t2, t3, t4


@triton.jit
def pq_index_kernel(
    q_ptr, k_ptr, cent_ptr, phi_ptr, codes_ptr, hist_ptr, histn_ptr, lut_ptr, bkt_ptr, mark_ptr, ready_ptr,
    sl_ptr, len_ptr, w_ptr,  #
    q_sb, q_sh, k_sb, k_sh, k_ss,  #
    H, G, M, K, bits, d_s, S, n_old, cap, CAPC, sink, window, heavy, init_offset, metric_ip, fill, after_quant,  #
    MP: tl.constexpr, NC: tl.constexpr, NB: tl.constexpr, LEVELS: tl.constexpr, TILE: tl.constexpr,
    DT: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_DS: tl.constexpr, TP: tl.constexpr, FT: tl.constexpr,
    CUTS: tl.constexpr, PDL: tl.constexpr = 0, TIMER: tl.constexpr = 0,
):
    """See the module docstring."""
    r = tl.program_id(0)
    r64, b, h, g, bg = _row_ids(r, H, G)
    n, w0, k, d_c = _row_sizes(S, init_offset, window, heavy, d_s, metric_ip)
    s_sink = tl.minimum(sink, S)
    s_win = tl.minimum(window, S)
    ws = S - s_win
    w_row = w_ptr + r64 * S
    total = s_sink + k + s_win
    sl_row = sl_ptr + r64 * total
    if tl.program_id(1) == 1 - fill:
        # the row's companion: (fill) its weights, then the KV group's new keys
        if fill != 0:
            _fill_row(w_ptr, w_row, r64, S, s_sink, ws, FT)
            _ones_if_last(ready_ptr, r, sl_row, w_row, total, FT)
        _quantize_cta(k_ptr, cent_ptr, phi_ptr, codes_ptr, b, h, g, bg, G, k_sb, k_sh, k_ss, M, K, d_s, d_c, n_old, n,
                      cap, init_offset, metric_ip, BLOCK_C, BLOCK_DS)
    else:
        t0 = _stamp(TIMER)
        if not PDL:
            if fill == 0:
                _fill_row(w_ptr, w_row, r64, S, s_sink, ws, FT)
        t1, t2, t3, t4 = _index_row(q_ptr, cent_ptr, codes_ptr, hist_ptr, histn_ptr, lut_ptr, bkt_ptr,
                                    mark_ptr, sl_row, w_row, r, r64, b, h, bg, q_sb, q_sh, M, K, bits, d_s, d_c, cap,
                                    CAPC, n, w0, k, s_sink, s_win, ws, init_offset, 0, after_quant, MP, NC, NB, LEVELS,
                                    TILE, DT,
                                    BLOCK_C, BLOCK_DS, TP, FT, CUTS, PDL, TIMER, False)
        tl.store(len_ptr + r64, total.to(tl.int64))
        if fill != 0:
            _ones_if_last(ready_ptr, r, sl_row, w_row, total, FT)
        t5 = _stamp(TIMER)
        if TIMER:
            _store_stamps(lut_ptr, r64, M, K, t0, t1, t2, t3, t4, t5)


# ----------------------------------------------------------------------------------
# declarations for the build

INDEX_FIXED = dict({k: HIST_FIXED[k] for k in ("NC", "NB", "LEVELS", "DT", "BLOCK_C", "BLOCK_DS")},
                   TP=256, FT=2048, CUTS=3)


def _args(t):
    return (
        ptr("q_ptr", t, False), ptr("k_ptr", t, False), ptr("cent_ptr", "fp32"), ptr("phi_ptr", "fp32", False),
        ptr("codes_ptr", "u8"), ptr("hist_ptr", "i32"), ptr("histn_ptr", "i32"),
        ptr("lut_ptr", "fp32"), ptr("bkt_ptr", "i32"), ptr("mark_ptr", "i32"), ptr("ready_ptr", "i32"),
        ptr("sl_ptr", "i64"), ptr("len_ptr", "i64"), ptr("w_ptr", t),
        i64("q_sb"), i64("q_sh"), i64("k_sb"), i64("k_sh"), i64("k_ss"),
        i32("H"), i32("G"), i32("M"), i32("K"), i32("bits"), i32("d_s"), i32("S"), i32("n_old"),
        i32("cap", div16=True), i32("CAPC"), i32("sink"), i32("window"), i32("heavy"), i32("init_offset"),
        i32("metric_ip"), i32("fill"), i32("after_quant"),
    )


# Built for M <= 2 (MP=2) and query dtype = weight dtype only (each variant is ~0.45 MB of
# PTX + cubin); the indexer takes pq_hist / split elsewhere. One variant per arch:
# measured on the H100 (NOTES.md, "the indexed histogram path (`pq_wfill` + `pq_index`)", JIT harness) TILE 4096 w8 (no spills, 220
# registers, so a pq_wfill CTA fits beside it) against w16 / TILE 2048. sm_80 has no
# programmatic dependent launch: there PDL=0, each row CTA writes its own weights first
# and the runtime launches no pq_wfill.
#: registers per thread at most: a pq_index CTA (8 warps) and a pq_wfill CTA (4 warps x
#: 56 registers) share an SM's 65536 only at <= 224 (unbounded, the build chose 246 and
#: the large workload's step went from 46-47 to 51-52 us: NOTES.md, "`pq_index` selects by cuts and sorts")
INDEX_MAXNREG = 224
#: dtypes whose sm_90 pq_index also gets a TILE=8192 variant for the autotuner (TILE is the
#: fallback pass's tile, `_row_pass`: pq_hist's fastest with M <= 2 was 8192): fp32 (the
#: reference workload's step is pq_index alone) and bf16
TUNED_INDEX = ("fp32", "bf16")


def _index_variants(t):
    d90 = {"TILE": 4096, "PDL": 1}
    v90 = grid(d90, 8, 1, TILE=(4096, 8192), PDL=(1, )) if t in TUNED_INDEX else single(d90, 8, 1)
    return {80: single({"TILE": 4096, "PDL": 0}, 8, 1), 90: v90}


KERNELS = []
for _t in DTYPES:
    KERNELS.append(
        Kernel(name=f"pq_index.m2.q_{_t}.w_{_t}", fn=pq_index_kernel, args=_args(_t), fixed=dict(INDEX_FIXED, MP=2),
               variants=_index_variants(_t), maxnreg=INDEX_MAXNREG))
    # sm_90: 4 warps (default) and 8 warps per fill CTA for the autotuner (8 warps may leave
    # no room for a pq_index CTA beside it: the tuner times that)
    KERNELS.append(
        Kernel(name=f"pq_wfill.w_{_t}", fn=pq_wfill_kernel,
               args=(ptr("w_ptr", _t), i32("rows"), i32("S"), i32("sink"), i32("window")),
               fixed={"FT": 2048}, variants={80: single({"TRIGGER": 0}, 4, 1),
                                             90: grid({"TRIGGER": 1}, 4, 1, num_warps=(4, 8), TRIGGER=(1, ))}))
