"""The decode step with the codes also kept as buckets per combination (``K^M <=
4096``): the heavy keys are gathered, not searched for.

``pq_hist`` finds the threshold on the row's combination histogram, then reads every
code of the row again to find the keys above it. Here each row also keeps, per
combination, the candidate keys that carry it (``bkt i32 [B*H, NC, CAPC]``, filled by
the same atomics that move the histogram: the count an atomic returns is the key's
slot), so after the threshold the row gathers the keys of the few combinations it
takes (a few hundred entries), sorts them by position and writes them.

``pq_wfill_kernel`` (sm_90: PDL=1) writes ``weight_list``'s zeros and its sink and
window ones over every SM and lets ``pq_index_kernel``, launched as its programmatic
dependent, start at once; the row CTAs write their heavy ones after
``griddepcontrol.wait``. On sm_80 (PDL=0) no ``pq_wfill`` runs: each row CTA writes its
own row's weights first.

``pq_index_kernel``, grid ``(B*H, 2)``: CTA ``(r, 1)`` quantizes the new keys as in
``pq_hist``. CTA ``(r, 0)``:

1. (PDL=0) writes row ``r``'s ``weight_list`` (1 in the sink and the window, else 0);
2. moves the combination histogram ``hist[r]`` from the keys ``j < histn[r]`` it counts
   to the candidates ``j < w0`` (keys only join: when ``w0 < histn[r]`` it recounts from
   zero), each joining key stored at ``bkt[r, combo, slot]`` where ``slot`` is the count
   its atomic returned (kept only while ``slot < CAPC``);
3. the lookup table, the combination scores and the threshold as ``pq_hist``;
4. when every heavy pick lies between sink and window (``init_offset >= sink'``, ``w0 >=
   k``), no taken combination holds more than ``CAPC`` keys and the taken combinations
   hold at most ``TP`` keys: gathers those keys (slots from one prefix sum over the
   combinations, each slot's combination from a running max over start marks in
   ``mark i32 [B*H, TP]``, left zero), sorts them by position, keeps the sure ones and
   the first ``need`` maybe ones, writes them to ``sparse_list`` (with sink and window)
   and their weights. Else the row runs ``pq_hist``'s emit (one pass over its codes).

Host preconditions as ``pq_hist`` (the step's new keys are not candidates: ``w0 <=
n_old``); ``hist``, ``histn``, ``mark`` zero-filled once, ``hist`` and ``histn`` again
after the codes are replaced or ``CAPC`` changes (``bkt`` needs no initial value).
"""
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from kspec import Kernel, i32, i64, ptr, single
from pq_hist import (DTYPES, FIXED as HIST_FIXED, _combo_scores, _combos, _head_lut, _quantize_cta, _red_add_max,
                     _rounds, _row_ids, _row_pass, _row_sizes, _stamp, _store_stamps)


@triton.jit
def _bucket_move(codes_ptr, hist_row, histn_ptr, bkt_row, r, bg, M, bits, cap, w0, CAPC, MP: tl.constexpr,
                 DT: tl.constexpr, NC: tl.constexpr):
    """Move row ``r``'s histogram to the candidates ``j < w0`` and file each joining key in
    its combination's bucket (slot = the count before it joined); recount from zero when
    keys would leave (``w0 < histn[r]``: never in a decode loop)."""
    hn = tl.load(histn_ptr + r)
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
def _max_op(a, b):
    return tl.maximum(a, b)


@triton.jit
def _gather_emit(common, cnt, s, t_sure, t_maybe, need, bkt_row, mark_row, lut_row, sl_row, w_row, M, K, bits, k,
                 s_sink, init_offset, CAPC, NC: tl.constexpr, TP: tl.constexpr, PDL: tl.constexpr):
    """Step 4's gather (see the module docstring) where ``common``; returns whether it ran
    (not when the taken combinations do not fit: a bucket over CAPC, more than TP keys)."""
    cc = tl.arange(0, NC)
    selc = tl.where((s >= t_maybe) & (cnt > 0), cnt, 0)
    tot, big = _red_add_max(selc, selc)
    fits = common & (big <= CAPC) & (tot <= TP)
    if fits:
        incl = tl.cumsum(selc, axis=0)
        off = incl - selc
        # start marks: slot off[c] holds (off[c] * NC + c) + 1 for each taken combination
        tl.store(mark_row + off, off * NC + cc + 1, mask=selc > 0)
        tl.debug_barrier()
        t = tl.arange(0, TP)
        mk = tl.load(mark_row + t, cache_modifier=".cg")
        pk = tl.associative_scan(mk, 0, _max_op) - 1
        c = pk % NC
        valid = t < tot
        jj = tl.load(bkt_row + c.to(tl.int64) * CAPC + (t - pk // NC), mask=valid, other=0)
        # the slot's score, added as _combo_scores adds it: maybe = below t_sure
        sc = tl.zeros([TP], tl.float32)
        for m in range(M):
            sc += tl.load(lut_row + m * K + ((c >> ((M - 1 - m) * bits)) & (K - 1)))
        # sorted by position (the maybe flag in bit 0); maybe keys are taken in position
        # order while fewer than need are
        key = tl.sort(tl.where(valid, jj * 2 + (sc < t_sure).to(tl.int32), 0x7FFFFFFF))
        mb = key & 1
        mrank = tl.cumsum(mb, axis=0) - mb
        kk = ((key != 0x7FFFFFFF) & ((mb == 0) | (mrank < need))).to(tl.int32)
        rank = tl.cumsum(kk, axis=0) - kk
        pos = (key >> 1) + init_offset
        tl.store(sl_row + s_sink + rank, pos.to(tl.int64), mask=kk != 0)
        if PDL:
            gdc_wait()  # pq_wfill's zeros are written: the ones go over them
        tl.store(w_row + pos, tl.full([TP], 1.0, tl.float32).to(w_row.dtype.element_ty), mask=kk != 0)
        tl.store(mark_row + t, tl.zeros([TP], tl.int32))
    return fits


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
def pq_wfill_kernel(w_ptr, rows, S, sink, window, FT: tl.constexpr, PDL: tl.constexpr = 1):
    """``weight_list`` (``rows * S < 2^31`` elements, flat) before ``pq_index`` (PDL=1):
    1 in each row's sink and window, else 0; a persistent grid (CTA ``i`` of ``n`` takes
    every ``n``-th block of FT elements, 16-byte stores). Lets its dependent launch start
    at once (programmatic dependent launch): ``pq_index`` waits for this grid only
    before its heavy ones."""
    if PDL:
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
def pq_index_kernel(
    q_ptr, k_ptr, cent_ptr, phi_ptr, codes_ptr, hist_ptr, histn_ptr, lvl_ptr, lut_ptr, bkt_ptr, mark_ptr, sl_ptr,
    len_ptr, w_ptr,  #
    q_sb, q_sh, k_sb, k_sh, k_ss,  #
    H, G, M, K, bits, d_s, S, n_old, cap, CAPC, sink, window, heavy, init_offset, metric_ip,  #
    MP: tl.constexpr, NC: tl.constexpr, NB: tl.constexpr, LEVELS: tl.constexpr, TILE: tl.constexpr,
    DT: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_DS: tl.constexpr, TP: tl.constexpr, FT: tl.constexpr,
    PDL: tl.constexpr = 0, TIMER: tl.constexpr = 0,
):
    """See the module docstring."""
    r = tl.program_id(0)
    r64, b, h, g, bg = _row_ids(r, H, G)
    n, w0, k, d_c = _row_sizes(S, init_offset, window, heavy, d_s, metric_ip)
    s_sink = tl.minimum(sink, S)
    s_win = tl.minimum(window, S)
    ws = S - s_win
    if tl.program_id(1) == 1:
        _quantize_cta(k_ptr, cent_ptr, phi_ptr, codes_ptr, b, h, g, bg, G, k_sb, k_sh, k_ss, M, K, d_s, d_c, n_old, n,
                      cap, init_offset, metric_ip, BLOCK_C, BLOCK_DS)
    else:
        t0 = _stamp(TIMER)
        w_row = w_ptr + r64 * S
        if not PDL:
            _fill_row(w_ptr, w_row, r64, S, s_sink, ws, FT)
        # 2-3. histogram and buckets, lookup table, threshold
        hist_row = hist_ptr + r64 * NC
        bkt_row = bkt_ptr + r64 * NC * CAPC
        _bucket_move(codes_ptr, hist_row, histn_ptr, bkt_row, r, bg, M, bits, cap, w0, CAPC, MP, DT, NC)
        t1 = _stamp(TIMER)
        lut_row = lut_ptr + r64 * M * K
        _head_lut(q_ptr, cent_ptr, lut_row, q_sb, q_sh, b, h, bg, M, K, d_s, d_c, BLOCK_C, BLOCK_DS)
        tl.debug_barrier()  # the atomics, the table, the weights' zeros: before any read or heavy one
        t2 = _stamp(TIMER)
        cnt, s = _combo_scores(hist_row, lut_row, M, K, bits, NC)
        t3 = _stamp(TIMER)
        t_sure, t_maybe, need = _rounds(cnt, s, tl.minimum(k, w0), lvl_ptr + r64 * (LEVELS * NB), NC, NB, LEVELS)
        t4 = _stamp(TIMER)
        total = s_sink + k + s_win
        sl_row = sl_ptr + r64 * total
        done = _gather_emit((init_offset >= s_sink) & (w0 >= k), cnt, s, t_sure, t_maybe, need, bkt_row,
                            mark_ptr + r64 * TP, lut_row, sl_row, w_row, M, K, bits, k, s_sink, init_offset, CAPC, NC,
                            TP, PDL)
        if done:
            q = tl.arange(0, FT)
            tl.store(sl_row + q, q.to(tl.int64), mask=q < s_sink)
            for p0 in range(0, s_win, FT):
                p = p0 + q
                tl.store(sl_row + s_sink + k + p, (ws + p).to(tl.int64), mask=p < s_win)
        else:
            # pq_hist's emit: one pass over the row's codes
            if PDL:
                gdc_wait()
            _row_pass(codes_ptr + bg * M * cap, lut_row, sl_row, w_row, cap, M, K, n, w0, k, s_sink, ws, init_offset,
                      t_sure, t_maybe, need, MP, TILE)
        tl.store(len_ptr + r64, total.to(tl.int64))
        t5 = _stamp(TIMER)
        if TIMER:
            _store_stamps(lut_ptr, r64, M, K, t0, t1, t2, t3, t4, t5)


# ----------------------------------------------------------------------------------
# declarations for the build

INDEX_FIXED = dict({k: HIST_FIXED[k] for k in ("NC", "NB", "LEVELS", "DT", "BLOCK_C", "BLOCK_DS", "TIMER")},
                   TP=256, FT=2048)


def _args(t):
    return (
        ptr("q_ptr", t, False), ptr("k_ptr", t, False), ptr("cent_ptr", "fp32"), ptr("phi_ptr", "fp32", False),
        ptr("codes_ptr", "u8"), ptr("hist_ptr", "i32"), ptr("histn_ptr", "i32"), ptr("lvl_ptr", "i32"),
        ptr("lut_ptr", "fp32"), ptr("bkt_ptr", "i32"), ptr("mark_ptr", "i32"), ptr("sl_ptr", "i64"),
        ptr("len_ptr", "i64"), ptr("w_ptr", t),
        i64("q_sb"), i64("q_sh"), i64("k_sb"), i64("k_sh"), i64("k_ss"),
        i32("H"), i32("G"), i32("M"), i32("K"), i32("bits"), i32("d_s"), i32("S"), i32("n_old"),
        i32("cap", div16=True), i32("CAPC"), i32("sink"), i32("window"), i32("heavy"), i32("init_offset"),
        i32("metric_ip"),
    )


# Built for M <= 2 (MP=2) and query dtype = weight dtype only (each variant is ~0.45 MB of
# PTX + cubin); the indexer takes pq_hist / split elsewhere. One variant per arch:
# measured on the H100 (NOTES.md, session 11, JIT harness) TILE 4096 w8 (no spills, 220
# registers, so a pq_wfill CTA fits beside it) against w16 / TILE 2048. sm_80 has no
# programmatic dependent launch: there PDL=0, each row CTA writes its own weights first
# and the runtime launches no pq_wfill.
KERNELS = []
for _t in DTYPES:
    KERNELS.append(
        Kernel(name=f"pq_index.m2.q_{_t}.w_{_t}", fn=pq_index_kernel, args=_args(_t), fixed=dict(INDEX_FIXED, MP=2),
               variants={80: single({"TILE": 4096, "PDL": 0}, 8, 1), 90: single({"TILE": 4096, "PDL": 1}, 8, 1)}))
    KERNELS.append(
        Kernel(name=f"pq_wfill.w_{_t}", fn=pq_wfill_kernel,
               args=(ptr("w_ptr", _t), i32("rows"), i32("S"), i32("sink"), i32("window")),
               fixed={"FT": 2048}, variants={80: single({"PDL": 0}, 4, 1), 90: single({"PDL": 1}, 4, 1)}))
