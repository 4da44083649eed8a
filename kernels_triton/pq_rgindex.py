"""Ragged batches on the indexed path (``K^M <= 4096``, ``M <= 2``, query dtype = weight
dtype, as ``pq_index``): one decode step over ``B`` sequences of lengths ``S_b <=
S_alloc`` (each with its own ``N_cached[b]``), each long row gathering its heavy keys from
its combination buckets as ``pq_index`` does at a fixed ``S``, with every length-dependent
quantity read on the device, so one captured graph serves any lengths written into the
``seq_lens`` buffer between replays.

The step is ``pq_rgq`` (``pq_ragged.py``: each long row's new keys quantized, the rows
checked into ``stat``, the counts the step began from copied into ``nc0``), then:

``pq_rgwfill_kernel``, grid ``(B*H, cdiv(S_alloc, CH))``: CTA ``(r, c)`` writes row ``r``'s
weights at the positions ``[c*CH, (c+1)*CH)`` below ``max(S_b, wext[r])``: 1 in the sink
and the window of a long row and at every position of a short row below ``S_b``, 0
elsewhere (a refused row counts as ``S_b = 0``: zeros up to ``wext[r]``). ``wext i64
[B*H]`` bounds the positions of each weight row that may be non-zero (``S_alloc`` where
the host does not know), so a decode loop whose lengths grow never rewrites the zeros
behind ``S_b``. With TRIGGER=1 it lets its programmatic dependent start at once
(``griddepcontrol.launch_dependents``); it is itself launched without the programmatic
attribute, after ``pq_rgq`` has completed.

``pq_rgindex_kernel``, grid ``(B*H,)``, launched as ``pq_rgwfill``'s programmatic
dependent (PDL=1; sm_80 has none: PDL=0, each CTA writes its own row's weights first and
no ``pq_rgwfill`` runs): CTA ``r`` resolves its row's sizes at ``S_b``
(``pq_ragged._rg_row``) and

- a long row: ``pq_index``'s row CTA at the row's own sizes (``pq_index._index_row``: the
  combination histogram and buckets ``ihist`` / ``ihistn`` / ``bkt`` moved to the
  candidates, recounted when they count more keys than ``nc0[b]``: a lowered count may
  have had codes rewritten by ``pq_rgq``; the lookup table, the cuts, the gather, or the
  fallback pass over the codes), writing ``sparse_list[r, :total_b]`` and the heavy ones
  after ``griddepcontrol.wait``; at the first head (``h == 0``) ``n_cached[b] = n`` (no
  CTA of this launch reads ``n_cached``: the reset test reads ``nc0``);
- a short row: ``sparse_list[r, p] = p`` for ``p < S_b`` (its weights are ``pq_rgwfill``'s
  ones);
- every row: ``-1`` over the ranks ``total_b .. T`` of ``sparse_list`` (row stride ``T``;
  all of them for a refused row), ``sparse_len[r] = total_b`` (``-1`` for a refused row),
  and after ``griddepcontrol.wait`` (``pq_rgwfill`` has read ``wext``) ``wext[r] = S_b``
  (0 for a refused row).

No CTA waits for another CTA of its launch: the step is correct under any CTA schedule.
Launch contract: README.md in this directory.
"""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents

from kspec import Kernel, i32, i64, ptr, single
from pq_hist import _row_ids
from pq_index import INDEX_FIXED, INDEX_MAXNREG, _index_row, _zeros_written
from pq_rgsplit import _rg_sizes32, _sizes


@triton.jit
def _rg_fill(w_row, p_lo, p_hi, S, short, s_sink, ws, FT: tl.constexpr):
    """Weights ``w_row[p]`` for ``p_lo <= p < p_hi``: 1 below ``S`` in the sink (``p <
    s_sink``), the window (``p >= ws``) or anywhere on a short row, else 0."""
    wty = w_row.dtype.element_ty
    for p0 in range(p_lo, p_hi, FT):
        p = p0 + tl.arange(0, FT)
        one = (p < S) & ((short != 0) | (p < s_sink) | (p >= ws))
        tl.store(w_row + p, one.to(tl.float32).to(wty), mask=p < p_hi)


@triton.jit
def pq_rgwfill_kernel(w_ptr, lens_ptr, stat_ptr, wext_ptr, H, K, S_alloc, init_offset, sink_c, sink_r, win_c, win_r,
                      hv_c, hv_r, CH: tl.constexpr, FT: tl.constexpr, TRIGGER: tl.constexpr = 1):
    """See the module docstring and README.md (launch contract)."""
    if TRIGGER:
        gdc_launch_dependents()
    r = tl.program_id(0)
    c = tl.program_id(1)
    r64 = r.to(tl.int64)
    b = r // H
    ok, long, S, n, w0, k, s_sink, s_win, total = _rg_sizes32(lens_ptr, stat_ptr, b, S_alloc, init_offset, K, sink_c,
                                                              sink_r, win_c, win_r, hv_c, hv_r)
    hi = tl.maximum(S, tl.load(wext_ptr + r64).to(tl.int32))
    p_lo = c * CH
    _rg_fill(w_ptr + r64 * S_alloc, p_lo, tl.minimum(p_lo + CH, hi), S, ok & (long == 0), s_sink, S - s_win, FT)


@triton.jit
def pq_rgindex_kernel(
    q_ptr, cent_ptr, codes_ptr, hist_ptr, histn_ptr, lut_ptr, bkt_ptr, mark_ptr, lens_ptr, stat_ptr, nc_ptr,
    nc0_ptr, wext_ptr, sl_ptr, len_ptr, w_ptr,  #
    q_sb, q_sh,  #
    H, G, M, K, bits, d_s, cap, CAPC, S_alloc, T, init_offset, metric_ip,  #
    sink_c, sink_r, win_c, win_r, hv_c, hv_r,  #
    MP: tl.constexpr, NC: tl.constexpr, NB: tl.constexpr, LEVELS: tl.constexpr, TILE: tl.constexpr,
    DT: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_DS: tl.constexpr, TP: tl.constexpr, FT: tl.constexpr,
    CUTS: tl.constexpr, PDL: tl.constexpr = 0,
):
    """See the module docstring and README.md (launch contract)."""
    r = tl.program_id(0)
    r64, b, h, g, bg = _row_ids(r, H, G)
    ok, long, S, n, w0, k, s_sink, s_win, total = _rg_sizes32(lens_ptr, stat_ptr, b, S_alloc, init_offset, K, sink_c,
                                                              sink_r, win_c, win_r, hv_c, hv_r)
    io = init_offset.to(tl.int32)
    ws = S - s_win
    w_row = w_ptr + r64 * S_alloc
    sl_row = sl_ptr + r64 * T
    if not PDL:
        # no pq_rgwfill (sm_80): the row's own weights first, before a CTA barrier
        hi = tl.maximum(S, tl.load(wext_ptr + r64).to(tl.int32))
        _rg_fill(w_row, 0, hi, S, ok & (long == 0), s_sink, ws, FT)
        tl.debug_barrier()
    q = tl.arange(0, FT)
    if long:
        nc_old = tl.load(nc0_ptr + b).to(tl.int32)
        _index_row(q_ptr, cent_ptr, codes_ptr, hist_ptr, histn_ptr, lut_ptr, bkt_ptr, mark_ptr, sl_row, w_row,
                   r, r64, b, h, bg, q_sb, q_sh, M, K, bits, d_s, d_s + metric_ip, cap, CAPC, n, w0, k, s_sink, s_win,
                   ws, io, nc_old, 0, MP, NC, NB, LEVELS, TILE, DT, BLOCK_C, BLOCK_DS, TP, FT, CUTS, PDL, 0, True)
        if h == 0:
            tl.store(nc_ptr + b, n.to(tl.int64))
    elif ok:
        # a short row: every position (weight 1 from the fill)
        for p0 in range(0, S, FT):
            p = p0 + q
            tl.store(sl_row + p, p.to(tl.int64), mask=p < S)
    # -1 past the row's entries (all of them for a refused row), its length
    t_lo = tl.where(ok, total, 0).to(tl.int64)
    for t0 in range(t_lo, T, FT):
        tt = t0 + q
        tl.store(sl_row + tt, tl.full([FT], -1, tl.int64), mask=tt < T)
    tl.store(len_ptr + r64, tl.where(ok, total, -1).to(tl.int64))
    # the row's weight extent, once pq_rgwfill (which reads it) has completed
    _zeros_written(PDL)
    tl.store(wext_ptr + r64, tl.where(ok, S, 0).to(tl.int64))


# ----------------------------------------------------------------------------------
# declarations for the build

DTYPES = ("fp32", "bf16", "fp16")
#: weight positions per ``pq_rgwfill`` CTA (a loop of FT-element stores)
RGWFILL_CH = 8192


def _index_args(t):
    return (
        ptr("q_ptr", t, False), ptr("cent_ptr", "fp32"), ptr("codes_ptr", "u8"), ptr("hist_ptr", "i32"),
        ptr("histn_ptr", "i32"), ptr("lut_ptr", "fp32"), ptr("bkt_ptr", "i32"),
        ptr("mark_ptr", "i32"), ptr("lens_ptr", "i64", False), ptr("stat_ptr", "i32", False),
        ptr("nc_ptr", "i64", False), ptr("nc0_ptr", "i64", False), ptr("wext_ptr", "i64", False),
        ptr("sl_ptr", "i64"), ptr("len_ptr", "i64"), ptr("w_ptr", t, False),
        i64("q_sb"), i64("q_sh"),
        i32("H"), i32("G"), i32("M"), i32("K"), i32("bits"), i32("d_s"), i32("cap", div16=True), i32("CAPC"),
        i64("S_alloc"), i64("T"), i64("init_offset"), i32("metric_ip"), *_sizes(),
    )


def _wfill_args(t):
    return (
        ptr("w_ptr", t, False), ptr("lens_ptr", "i64", False), ptr("stat_ptr", "i32", False),
        ptr("wext_ptr", "i64", False), i32("H"), i32("K"), i64("S_alloc"), i64("init_offset"), *_sizes(),
    )


# Built as pq_index is (M <= 2, query dtype = weight dtype, 8 warps at <= 224 registers so
# a pq_rgwfill CTA fits beside); sm_80 without programmatic dependent launch (PDL=0: each
# row CTA writes its own weights, no pq_rgwfill).
KERNELS = []
for _t in DTYPES:
    KERNELS.append(
        Kernel(name=f"pq_rgindex.m2.q_{_t}.w_{_t}", fn=pq_rgindex_kernel, args=_index_args(_t),
               fixed=dict(INDEX_FIXED, MP=2),
               variants={80: single({"TILE": 4096, "PDL": 0}, 8, 1), 90: single({"TILE": 4096, "PDL": 1}, 8, 1)},
               maxnreg=INDEX_MAXNREG))
    KERNELS.append(
        Kernel(name=f"pq_rgwfill.w_{_t}", fn=pq_rgwfill_kernel, args=_wfill_args(_t),
               fixed={"CH": RGWFILL_CH, "FT": 2048},
               variants={80: single({"TRIGGER": 0}, 4, 1), 90: single({"TRIGGER": 1}, 4, 1)}))
