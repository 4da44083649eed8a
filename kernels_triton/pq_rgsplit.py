"""Ragged batches on the split histogram path (``K^M <= 4096``, ``M <= 4``): one decode
step over ``B`` sequences of lengths ``S_b <= S_alloc`` (each with its own ``N_cached[b]``),
the uniform split path's threshold (``pq_thresh``: the persistent per-row combination
histogram, one read of the row's codes in all) and emit (``pq_emit``: each row's pass over
many CTAs) with every length-dependent quantity read on the device, so one captured graph
serves any lengths written into the ``seq_lens`` buffer between replays.

The step is ``pq_rgq`` (``pq_ragged.py``: each long row's new keys quantized first, any
number of them; the rows checked into ``stat``), then:

``pq_rgthresh_kernel``, grid ``(B*H,)``: CTA ``r`` (row ``r = b*H + h``) resolves its
row's sizes at ``S_b`` (``pq_ragged._rg_row``: ratios per row, the short-path test, a
refused row as ``S_b = 0``) and

- zeroes its emit part flags ``flag i64 [B*H, NP]`` (and CTA 0 the ticket counter ``ctr
  i32 [1]``);
- the weights' extent: ``wext i64 [B*H]`` bounds the positions of the row's
  ``weight_list`` that may be non-zero (the host sets it to ``S_alloc`` where it does not
  know, e.g. after poisoning the outputs). The row writes ``wz[r] = (lo, wext[r])``,
  ``lo = S_b`` (0 for a refused row), for the emit to zero ``[lo, wext)``, and sets
  ``wext[r] = lo``: a decode loop whose lengths grow writes each weight row up to its
  ``S_b`` only, never the ``S_alloc - S_b`` zeros behind it again;
- a long row only: the combination histogram ``hist[r]`` (``i32 [B*H, NC]``, persistent:
  it counts the current codes of the keys ``j < histn[r]``) is reset (zeroed, ``histn[r]
  = 0``) when ``histn[r] > n_cached[b]``: the row's count was lowered
  (``set_row_n_cached``: a row replaced or rewound), so ``pq_rgq`` may just have
  rewritten codes the histogram counts. Codes ``j < n_cached[b]`` are never rewritten, and
  ``histn`` only ever holds an earlier step's ``w0 <= n``, so otherwise the histogram is
  exact. Then ``pq_hist._row_threshold`` at the row's own ``w0`` and ``k`` (the histogram
  moved to the candidates, up or down, the head's lookup table into ``lut f32 [B*H, M,
  K]``, the threshold rounds) and the class bounds ``bnd f32 [B*H, 2]``, ``need i32
  [B*H]`` and the combinations' classes ``cls u8 [B*H, NC]``, as ``pq_thresh``.

``pq_rgsemit_kernel``, grid ``(B*H*NP,)``, ``NP = max(1, cdiv(S_alloc - init_offset,
TILE))``: each CTA takes a ticket ``t`` (atomic counter), row ``r = t // NP``, part ``c =
t % NP``. Every CTA first zeroes its share of the row's stale weights (``[lo, wext)`` of
``wz`` within its positions: part 0 ``[0, init_offset + TILE)``, part ``c``
``init_offset + [c*TILE, (c+1)*TILE)``, the last part up to ``S_alloc``) and writes ``-1``
over its share ``[c*PW, (c+1)*PW)``, ``PW = cdiv(T, NP)``, of the ranks ``total_b .. T``
of ``sparse_list`` (row stride ``T``). Then the row's own parts, ``c < NP_b = max(1,
cdiv(S_b - init_offset, TILE))`` (a CTA past them is done):

- a long row: ``pq_split``'s part emit at ``S_b`` (``_emit_part``: keys ``j = c*TILE ..``
  classified by one gather of their combination's class (``_class_bits``), counts published in the
  part's flag word, the earlier parts' counts added up (spinning on each), ranked and
  written; usual rows and any other row placed as ``pq_emit`` places them), weights in
  rows of stride ``S_alloc``; part 0 also ``sparse_len`` and, at the first head
  (``h == 0``), ``n_cached[b] = n``;
- a short row: its positions ``p`` of the part: ``sparse_list[r, p] = p``, weight 1;
  part 0 ``sparse_len = S_b``;
- a refused row: part 0 ``sparse_len = -1`` (its list is all padding, its weights all
  stale).

A part waits only on earlier parts of its own row; tickets are handed out in the order
CTAs run, so those belong to CTAs already running: the spin always ends, and CTAs past
their row's parts (which publish nothing) are never waited on.

Launch contract: README.md in this directory.
"""

import triton
import triton.language as tl

from kspec import Kernel, i32, i64, ptr, single
from pq_hist import FIXED as HIST_FIXED, _row_ids, _row_threshold
from pq_ragged import _rg_row, f64
from pq_split import _class_bits, _emit_part


@triton.jit
def _rg_sizes32(lens_ptr, stat_ptr, b, S_alloc, init_offset, K, sink_c, sink_r, win_c, win_r, hv_c, hv_r):
    """``pq_ragged._rg_row`` with the row's sizes as i32 (as ``pq_thresh`` / ``pq_emit``
    take them; ``S_alloc < 2^31``): ``(ok, long, S, n, w0, k, sink', window', total)``."""
    ok, long, S, n, w0, k, s_sink, s_win, total = _rg_row(lens_ptr, stat_ptr, b, S_alloc, init_offset, K, sink_c,
                                                          sink_r, win_c, win_r, hv_c, hv_r)
    return (ok, long, S.to(tl.int32), n.to(tl.int32), w0.to(tl.int32), k.to(tl.int32), s_sink.to(tl.int32),
            s_win.to(tl.int32), total.to(tl.int32))


@triton.jit
def pq_rgthresh_kernel(
    q_ptr, cent_ptr, codes_ptr, hist_ptr, histn_ptr, lut_ptr, bnd_ptr, need_ptr, flag_ptr, ctr_ptr,
    cls_ptr, lens_ptr, stat_ptr, nc_ptr, wext_ptr, wz_ptr,  #
    q_sb, q_sh,  #
    H, G, M, K, bits, d_s, cap, S_alloc, init_offset, metric_ip,  #
    sink_c, sink_r, win_c, win_r, hv_c, hv_r, NP,  #
    MP: tl.constexpr, NC: tl.constexpr, NB: tl.constexpr, LEVELS: tl.constexpr, DT: tl.constexpr,
    BLOCK_C: tl.constexpr, BLOCK_DS: tl.constexpr,
):
    """See the module docstring and README.md (launch contract)."""
    r = tl.program_id(0)
    r64, b, h, g, bg = _row_ids(r, H, G)
    ok, long, S, n, w0, k, s_sink, s_win, total = _rg_sizes32(lens_ptr, stat_ptr, b, S_alloc, init_offset, K, sink_c,
                                                              sink_r, win_c, win_r, hv_c, hv_r)
    # the emit's part flags of this row (and its ticket counter) start at zero
    for q0 in range(0, NP, 1024):
        qq = q0 + tl.arange(0, 1024)
        tl.store(flag_ptr + r64 * NP + qq, tl.zeros([1024], tl.int64), mask=qq < NP)
    if r == 0:
        tl.store(ctr_ptr, 0)
    # the stale weights the emit zeroes: [lo, wext), then the row's extent is lo
    lo = tl.where(ok, S, 0).to(tl.int64)
    we = tl.load(wext_ptr + r64)
    tl.store(wz_ptr + 2 * r64, lo)
    tl.store(wz_ptr + 2 * r64 + 1, we)
    tl.store(wext_ptr + r64, lo)
    if long:
        # a lowered count: pq_rgq may have rewritten codes the histogram counts
        nc_old = tl.load(nc_ptr + b)
        hn = tl.load(histn_ptr + r)
        if hn > nc_old:
            cc = tl.arange(0, NC)
            tl.store(hist_ptr + r64 * NC + cc, tl.zeros([NC], tl.int32))
            tl.store(histn_ptr + r, 0)
        tl.debug_barrier()  # the reset, for every thread, before _hist_move reads histn
        d_c = d_s + metric_ip
        s, t_sure, t_maybe, need, t1, t2, t3, t4 = _row_threshold(
            q_ptr, cent_ptr, codes_ptr, hist_ptr, histn_ptr, lut_ptr + r64 * M * K, r, r64, b, h, bg, q_sb,
            q_sh, M, K, bits, d_s, d_c, cap, w0, k, MP, NC, NB, LEVELS, DT, BLOCK_C, BLOCK_DS, 0)
        # the combinations' classes, which pq_rgsemit gathers (as pq_thresh's)
        cls = (s >= t_sure).to(tl.uint8) * 2 + (s >= t_maybe).to(tl.uint8)
        tl.store(cls_ptr + r64 * NC + tl.arange(0, NC), cls)
        tl.store(bnd_ptr + 2 * r64, t_sure)
        tl.store(bnd_ptr + 2 * r64 + 1, t_maybe)
        tl.store(need_ptr + r, need)


@triton.jit
def pq_rgsemit_kernel(
    codes_ptr, cls_ptr, need_ptr, flag_ptr, ctr_ptr, lens_ptr, stat_ptr, nc_ptr, wz_ptr, sl_ptr, len_ptr,
    w_ptr,  #
    H, G, M, K, cap, S_alloc, T, init_offset,  #
    sink_c, sink_r, win_c, win_r, hv_c, hv_r, NP,  #
    MP: tl.constexpr, TILE: tl.constexpr, QB: tl.constexpr, NC: tl.constexpr,
):
    """See the module docstring and README.md (launch contract)."""
    tl.static_assert(TILE < 65536)  # two 16-bit counts per int32 in the scan (and < 2^20 per flag field)
    t = tl.atomic_add(ctr_ptr, 1, sem="relaxed")  # ticket: lower ones are running or done
    r = t // NP
    c = t - r * NP
    r64, b, h, g, bg = _row_ids(r, H, G)
    ok, long, S, n, w0, k, s_sink, s_win, total = _rg_sizes32(lens_ptr, stat_ptr, b, S_alloc, init_offset, K, sink_c,
                                                              sink_r, win_c, win_r, hv_c, hv_r)
    io = init_offset.to(tl.int32)
    sa = S_alloc.to(tl.int32)
    wty = w_ptr.dtype.element_ty
    w_row = w_ptr + r64 * S_alloc
    sl_row = sl_ptr + r64 * T
    # this CTA's positions: part 0 from 0, the last part up to S_alloc
    p_lo = tl.where(c == 0, 0, io + c * TILE)
    p_hi = tl.where(c == NP - 1, sa, io + (c + 1) * TILE)
    # stale weights [lo, wext) of the row within them
    z_lo = tl.maximum(tl.load(wz_ptr + 2 * r64).to(tl.int32), p_lo)
    z_hi = tl.minimum(tl.load(wz_ptr + 2 * r64 + 1).to(tl.int32), p_hi)
    for z0 in range(z_lo, z_hi, 1024):
        z = z0 + tl.arange(0, 1024)
        tl.store(w_row + z, tl.zeros([1024], tl.float32).to(wty), mask=z < z_hi)
    # -1 over this CTA's share of the ranks total_b .. T
    PW = tl.cdiv(T, NP)
    t_lo = tl.maximum(c * PW, tl.where(ok, total, 0))
    t_hi = tl.minimum((c + 1) * PW, T)
    for t0 in range(t_lo, t_hi, 1024):
        tt = t0 + tl.arange(0, 1024)
        tl.store(sl_row + tt, tl.full([1024], -1, tl.int64), mask=tt < t_hi)
    NPB = tl.maximum(tl.cdiv(S - io, TILE), 1)  # the row's own parts
    if c < NPB:
        if long:
            NW: tl.constexpr = TILE // 32
            wd = tl.arange(0, NW)
            lane = tl.arange(0, 32)
            j0 = c * TILE
            j = j0 + wd[:, None] * 32 + lane[None, :]
            ge_s, ge_m = _class_bits(codes_ptr, cls_ptr + r64 * NC, bg, M, K, cap, j0, NW, MP, NC)
            need = tl.load(need_ptr + r)
            _emit_part(ge_s, ge_m, need, flag_ptr + r64 * NP, sl_row, w_ptr, len_ptr, r64, c, j0, j, wd, lane,
                       S, sa, n, w0, k, s_sink, s_win, io, NW, TILE, QB)
            if (c == 0) & (h == 0):
                tl.store(nc_ptr + b, n.to(tl.int64))
        elif ok:
            # a short row: every position, weight 1
            s_hi = tl.minimum(p_hi, S)
            for p0 in range(p_lo, s_hi, 1024):
                p = p0 + tl.arange(0, 1024)
                pm = p < s_hi
                tl.store(sl_row + p, p.to(tl.int64), mask=pm)
                tl.store(w_row + p, tl.full([1024], 1.0, tl.float32).to(wty), mask=pm)
            if c == 0:
                tl.store(len_ptr + r64, S.to(tl.int64))
        else:
            if c == 0:
                tl.store(len_ptr + r64, -1)


# ----------------------------------------------------------------------------------
# declarations for the build

DTYPES = ("fp32", "bf16", "fp16")
MPS = (2, 4)  # code rows loaded per key, M <= MP (the combination histogram takes M <= 4)
RGTHRESH_FIXED = {k: HIST_FIXED[k] for k in ("NC", "NB", "LEVELS", "DT", "BLOCK_C", "BLOCK_DS")}
RGSEMIT_FIXED = {"QB": 64, "NC": HIST_FIXED["NC"]}
#: registers per thread at most for ``pq_rgthresh.r128`` (8 warps): two CTAs an SM instead
#: of one at the compiler's ~190, for batches of more rows than one CTA an SM holds at once
#: (ragged decode loop of 256 rows, H100: 75.5 -> 67.4 us a step); with fewer rows its
#: spills only cost (B=1..4, H=32: +1.5-4 us), so the runtime takes it only there
#: (NOTES.md, "the ragged threshold at 128 registers")
RGTHRESH_MAXNREG = 128
#: keys per emit CTA: pq_emit's default (NOTES.md, "the histogram path split in two launches")
RGSEMIT_TILE = 4096


def _sizes():
    return (i64("sink_c"), f64("sink_r"), i64("win_c"), f64("win_r"), i64("hv_c"), f64("hv_r"))


def _thresh_args(qt):
    return (
        ptr("q_ptr", qt, False), ptr("cent_ptr", "fp32"), ptr("codes_ptr", "u8"), ptr("hist_ptr", "i32"),
        ptr("histn_ptr", "i32"), ptr("lut_ptr", "fp32"), ptr("bnd_ptr", "fp32"),
        ptr("need_ptr", "i32"), ptr("flag_ptr", "i64"), ptr("ctr_ptr", "i32"), ptr("cls_ptr", "u8"),
        ptr("lens_ptr", "i64", False), ptr("stat_ptr", "i32", False), ptr("nc_ptr", "i64", False),
        ptr("wext_ptr", "i64", False),
        ptr("wz_ptr", "i64", False),
        i64("q_sb"), i64("q_sh"),
        i32("H"), i32("G"), i32("M"), i32("K"), i32("bits"), i32("d_s"), i32("cap", div16=True), i64("S_alloc"),
        i64("init_offset"), i32("metric_ip"), *_sizes(), i32("NP"),
    )


def _emit_args(wt):
    return (
        ptr("codes_ptr", "u8"), ptr("cls_ptr", "u8"), ptr("need_ptr", "i32"),
        ptr("flag_ptr", "i64"), ptr("ctr_ptr", "i32"), ptr("lens_ptr", "i64", False), ptr("stat_ptr", "i32", False),
        ptr("nc_ptr", "i64", False), ptr("wz_ptr", "i64", False), ptr("sl_ptr", "i64"), ptr("len_ptr", "i64"),
        ptr("w_ptr", wt),
        i32("H"), i32("G"), i32("M"), i32("K"), i32("cap", div16=True), i64("S_alloc"), i64("T"),
        i64("init_offset"), *_sizes(), i32("NP"),
    )


KERNELS = []
for _mp in MPS:
    for _qt in DTYPES:
        for _r128 in (False, True):
            KERNELS.append(
                Kernel(name=f"pq_rgthresh{'.r128' if _r128 else ''}.m{_mp}.q_{_qt}", fn=pq_rgthresh_kernel,
                       args=_thresh_args(_qt), fixed=dict(RGTHRESH_FIXED, MP=_mp),
                       variants={80: single({}, 8, 1), 90: single({}, 8, 1)},
                       maxnreg=RGTHRESH_MAXNREG if _r128 else 0))
    for _wt in DTYPES:
        KERNELS.append(
            Kernel(name=f"pq_rgsemit.m{_mp}.w_{_wt}", fn=pq_rgsemit_kernel, args=_emit_args(_wt),
                   fixed=dict(RGSEMIT_FIXED, MP=_mp),
                   variants={80: single({"TILE": RGSEMIT_TILE}, 4, 1), 90: single({"TILE": RGSEMIT_TILE}, 4, 1)}))
