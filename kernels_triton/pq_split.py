"""The histogram path's decode step in two launches: threshold per row, then the emit
spread over many CTAs per row (``K^M <= 4096``).

``pq_hist`` (one launch) gives each row one CTA for the whole step, so the pass over the
row (tens of thousands of keys, ~55 instructions each) runs on B*H SMs only. Here:

``pq_thresh_kernel``, grid ``(B*H, 2)``: steps 1-3 of ``pq_hist`` (combination
histogram moved to the candidates, lookup table, threshold rounds) and the new keys'
quantization, then per row the class bounds ``bnd f32 [B*H, 2]`` = ``(t_sure,
t_maybe)`` (every candidate scoring >= t_sure is taken, those scoring in [t_maybe,
t_sure) in position order while fewer than ``need[r]`` are), ``need i32 [B*H]`` and each
code combination's class by those bounds, ``cls u8 [B*H, NC]`` (bit 1: its score ranks
``>= t_sure``; bit 0: ``>= t_maybe``; combination ``sum_m code_m K^(M-1-m)``); the head's
lookup table stays in ``lut f32 [B*H, M, K]``. It also zeroes the emit's part flags
``flag i64 [B*H, NP]`` and its ticket counter ``ctr i32 [1]``.

``pq_emit_kernel``, grid ``(B*H*NP,)`` with ``NP = cdiv(n, TILE)``, ``n = S -
init_offset``: each CTA takes a ticket (atomic counter) naming its row and part ``c``,
covering keys ``j = c*TILE ..`` (positions ``j + init_offset``). With ``by_class = 1``
(the split path) it copies the row's class table ``cls`` (4 KB) into shared memory and
classifies each key by one shared u8 load of its combination's class (the threshold's own
comparisons); with ``by_class = 0`` (the radix-select path,
``K^M > 4096``: no table) it scores each key from the lookup table (one f32 gather per
key and subvector from a ``K``-entry row, unmasked; added in the order the threshold's
kernels add them, so the classes agree bit for bit). It keeps per 32 keys a bit mask of
the sure and of the maybe keys (candidates ``j < w0`` selected per
group, not per key), publishes its two counts in its part's flag word, adds up the
counts of the row's earlier parts (spinning until each has published), ranks each taken
key by its mask's prefix count and its bit (as ``pq_hist``'s ``_emit_masks``), then
writes its slice of ``weight_list`` in 16-byte stores (``w_ptr`` 16-byte aligned; the
slice shifted onto 16-byte boundaries, see ``_store_weights``) and its ``sparse_list``
entries: in the usual row (every heavy pick between sink and window) heavy keys at
``sink' + rank`` (a part's heavy entries staged in shared memory, then written in order:
``_store_heavy_staged``) and window positions ``p`` at ``sink' + k + (p - ws)``; in any
other row (``init_offset < sink'``, a window reaching before the first key, or fewer
candidates than ``k``, the lowest masked keys filling in) every key's sink, heavy and
window copies in one ascending list, as ``pq_hist`` does. Part 0 also writes the positions
before the first key and ``sparse_len``. Tickets are handed out in launch order of the
CTAs that run, so every earlier part of a row belongs to a CTA that is already running:
the spin always ends.

Host precondition: the step's new keys are not candidates (``w0 <= n_old``; else
``pq_quant`` quantizes them first).
"""

import triton
import triton.language as tl

from kspec import Kernel, grid, i32, i64, ptr, single
from pq_select import INTERPRETED, _rank_score
from pq_hist import (FIXED as HIST_FIXED, _code_row, _lvl_read, _lvl_store, _popc, _quantize_cta, _row_ids, _row_sizes,
                     _row_threshold, _stamp, _store_stamps, _take_masks)

#: flag word of a part that has published: READY | sure << 20 | maybe (each < 2^20)
READY = tl.constexpr(1 << 62)
#: ``_ready_words``' per-thread wait: $0 = the word at address $1 once it is >= READY
#: (0 without a load where $2 == 0)
WAIT_READY_ASM = tl.constexpr("""{
            .reg .pred %p<2>;
            setp.ne.s32 %p0, $2, 0;
            mov.b64 $0, 0;
            @!%p0 bra DONE${:uid};
            WAIT${:uid}:
            ld.relaxed.gpu.global.b64 $0, [$1];
            setp.lt.s64 %p1, $0, READY;
            @%p1 bra WAIT${:uid};
            DONE${:uid}:
            }""".replace("READY", str(READY.value)))


@triton.jit
def _table_entries(lut_row, lbase, m, cm, K, KP: tl.constexpr):
    """Entries ``(m, cm)`` of a head's lookup table: from ``lut_row`` (f32 ``[M, K]``) where
    ``KP = 0``, else from a copy in this CTA's shared memory at shared-window address
    ``lbase`` (entry ``(m, c)`` at word ``m * KP + c``)."""
    if KP == 0:
        e = tl.load(lut_row + m * K + cm)
    else:
        e = _lvl_read(lbase, m * KP + cm).to(tl.float32, bitcast=True)
    return e


@triton.jit
def _part_scores(codes_ptr, lut_row, bg, M, K, cap, j, MP: tl.constexpr, lbase, KP: tl.constexpr):
    """Ranks (``_rank_score``) of the scores of keys ``j`` (i32, any shape: one part's or
    one round tile's keys) of KV head ``bg`` from the head's lookup table (``lut_row``, or
    its copy in shared memory at ``lbase`` where ``KP > 0``: ``_table_entries``): the
    entries added in pq_thresh's order (m = 0, 1, ..; + 0.0 for ``M <= m < MP``), so every
    kernel that classifies by them agrees bit for bit, wherever it gathers them from.
    Every key is scored, candidate or not (the gathers stay inside the table: codes
    masked to ``K - 1``, rows m >= M read row M - 1 and add 0.0); the caller masks the
    classes. Code loads masked by ``j < cap`` only (cap % 16 == 0, parts start at
    multiples of TILE): vector loads."""
    cbase = codes_ptr + bg * M * cap
    sc = _table_entries(lut_row, lbase, 0, _code_row(cbase, cap, 0, M, j).to(tl.int32) & (K - 1), K, KP)
    for mi in tl.static_range(1, MP):
        cm = _code_row(cbase, cap, mi, M, j).to(tl.int32) & (K - 1)
        sc += tl.where(M > mi, _table_entries(lut_row, lbase, tl.minimum(M - 1, mi), cm, K, KP), 0.0)
    return _rank_score(sc)


@triton.jit
def _score_bits(sc, t_sure, t_maybe, lane):
    """Per 32-key group (rows of the ranks ``sc``, ``[NW, 32]``): the bit masks (uint32
    ``[NW]``) of the keys ranking ``>= t_sure`` and of those ranking ``>= t_maybe``."""
    lane_u = lane.to(tl.uint32)
    ge_s = tl.sum((sc >= t_sure).to(tl.uint32) << lane_u[None, :], axis=1)  # distinct bits: sum = or
    ge_m = tl.sum((sc >= t_maybe).to(tl.uint32) << lane_u[None, :], axis=1)
    return ge_s, ge_m


#: ``_cls_smem``: declares the class table's copy, ``u8 [NC]`` of the CTA's static shared
#: memory, and gives its shared-window address; ``${:uid}`` names each copy of the asm apart
CLS_NC = tl.constexpr(HIST_FIXED["NC"])
CLS_SMEM_ASM = tl.constexpr(".shared .align 16 .b8 pq_cls${:uid}[%d];\n\tmov.u32 $0, pq_cls${:uid};" % CLS_NC.value)


@triton.jit
def _cls_smem(cls_row, NC: tl.constexpr):
    """Copies a row's class table (``cls_row``: u8 ``[NC]``, 4-byte aligned) into this CTA's
    static shared memory (``CLS_SMEM_ASM``) and returns its shared-window address (i32),
    after a barrier. A warp's 32 gathers of random classes from global memory touch ~20
    of the table's 32 L1 lines, one L1 wavefront each; from shared memory they cost the
    most words one bank holds (~3-4)."""
    tl.static_assert(NC == CLS_NC)
    base = tl.inline_asm_elementwise(CLS_SMEM_ASM, "=r", [], dtype=tl.int32, is_pure=False, pack=1)
    i = tl.arange(0, NC // 4)
    _lvl_store(base, i, tl.load(cls_row.to(tl.pointer_type(tl.int32)) + i))
    tl.debug_barrier()
    return base


@triton.jit
def _smem_u8(base, i):
    """Bytes ``i`` (i32, any shape) of the static shared memory at shared-window address
    ``base``, zero-extended to i32."""
    return tl.inline_asm_elementwise("ld.shared.u8 $0, [$1];", "=r,r", [base + i], dtype=tl.int32, is_pure=False,
                                     pack=1)


@triton.jit
def _class_bits(codes_ptr, cls_row, bg, M, K, cap, j0, NW: tl.constexpr, MP: tl.constexpr, NC: tl.constexpr):
    """As ``_score_bits`` for the part's keys ``j0 .. j0 + 32 NW``, from the classes
    ``pq_thresh`` gave the row's code combinations (``cls_row``: u8 per combination
    ``sum_m code_m K^(M-1-m)``, bit 1 = its score ranks ``>= t_sure``, bit 0 = ``>=
    t_maybe``): one gather per key in place of ``M`` table entries, their sum and its
    rank, and the classes are the very comparisons the threshold made. The gathers read
    the table's copy in shared memory (``_cls_smem``; global memory under the
    interpreter). The keys are
    indexed ``[2, NW, 16]`` (half, group, key): each 16-byte code load is one half-group,
    so a thread holds both halves of its group and builds its bit masks without moving
    codes between threads. Code loads masked by ``j < cap`` only (``cap % 16 == 0``,
    ``j0 % 16 == 0``: vector loads); the combination masked to ``NC - 1``, so even a
    corrupt code's gather stays inside the row's table."""
    half = tl.arange(0, 2)
    l16 = tl.arange(0, 16)
    jj = j0 + tl.arange(0, NW)[None, :, None] * 32 + half[:, None, None] * 16 + l16[None, None, :]
    cbase = codes_ptr + bg * M * cap
    cc = _code_row(cbase, cap, 0, M, jj).to(tl.int32)
    for mi in tl.static_range(1, MP):
        cc = tl.where(M > mi, cc * K + _code_row(cbase, cap, mi, M, jj).to(tl.int32), cc)
    if INTERPRETED:
        cls = tl.load(cls_row + (cc & (NC - 1))).to(tl.uint32)
    else:
        # the row's table copied into shared memory (the code loads above are in flight
        # meanwhile), then one shared byte load a key
        tbase = _cls_smem(cls_row, NC)
        cls = _smem_u8(tbase, cc & (NC - 1)).to(tl.uint32)
    # per half-group both classes' bits interleaved (key i at bits 2i, 2i + 1), then
    # each class's bits gathered into the low 16
    both = tl.sum(cls << (2 * l16.to(tl.uint32))[None, None, :], axis=2)  # distinct bits: sum = or
    hs = _even_bits(both >> 1) << (16 * half.to(tl.uint32))[:, None]
    hm = _even_bits(both) << (16 * half.to(tl.uint32))[:, None]
    return tl.sum(hs, axis=0), tl.sum(hm, axis=0)


#: ``_hvy_smem``: the part's heavy entries staged in the CTA's static shared memory, ``u16
#: [TILE]`` (each a key's index in the part), one declaration per ``TILE``
HVY_SMEM_ASM_1024 = tl.constexpr(".shared .align 16 .b8 pq_hvy${:uid}[2048];\n\tmov.u32 $0, pq_hvy${:uid};")
HVY_SMEM_ASM_2048 = tl.constexpr(".shared .align 16 .b8 pq_hvy${:uid}[4096];\n\tmov.u32 $0, pq_hvy${:uid};")
HVY_SMEM_ASM_4096 = tl.constexpr(".shared .align 16 .b8 pq_hvy${:uid}[8192];\n\tmov.u32 $0, pq_hvy${:uid};")
HVY_SMEM_ASM_8192 = tl.constexpr(".shared .align 16 .b8 pq_hvy${:uid}[16384];\n\tmov.u32 $0, pq_hvy${:uid};")


@triton.jit
def _hvy_smem(TILE: tl.constexpr):
    """The shared-window address (i32) of ``u16 [TILE]`` of this CTA's static shared memory
    (``HVY_SMEM_ASM_*``; TILE in 1024, 2048, 4096, 8192)."""
    if TILE == 1024:
        base = tl.inline_asm_elementwise(HVY_SMEM_ASM_1024, "=r", [], dtype=tl.int32, is_pure=False, pack=1)
    elif TILE == 2048:
        base = tl.inline_asm_elementwise(HVY_SMEM_ASM_2048, "=r", [], dtype=tl.int32, is_pure=False, pack=1)
    elif TILE == 4096:
        base = tl.inline_asm_elementwise(HVY_SMEM_ASM_4096, "=r", [], dtype=tl.int32, is_pure=False, pack=1)
    else:
        tl.static_assert(TILE == 8192)
        base = tl.inline_asm_elementwise(HVY_SMEM_ASM_8192, "=r", [], dtype=tl.int32, is_pure=False, pack=1)
    return base


@triton.jit
def _store_heavy_staged(slot0, ex_t, take, bound, base, wd, t_lo, T, TILE: tl.constexpr):
    """``pq_hist._store_heavy`` for one part whose taken keys fill the contiguous slots
    ``slot0 + t_lo .. + T`` (``t_lo = ex_t[0]``, ``T`` the part's taken keys): each group's
    taken bits, lowest first, go to shared memory (``_hvy_smem``: u16 key indices) at the
    group's slots less ``t_lo``, then the CTA writes the ``T`` entries in order, so each
    warp's global stores cover consecutive slots. Stored straight from the groups, a
    warp's store of one taken bit per group touches a sector per group, and every sector
    is written once per bit. Under the interpreter (no shared memory) the part's own
    slots of ``sparse_list`` hold the staged key indices, and the second pass rewrites
    them as positions: a wrong ``t_lo`` or ``T`` leaves indices in the list."""
    if not INTERPRETED:
        hb = _hvy_smem(TILE)
    rem = take
    for it in range(0, bound):
        low = rem & (0 - rem)
        kidx = wd * 32 + _popc(low - 1)
        if INTERPRETED:
            tl.store(slot0 + ex_t + it, kidx.to(tl.int64), mask=rem != 0)
        else:
            tl.inline_asm_elementwise(
                "{\n\t.reg .pred p;\n\tsetp.ne.b32 p, $3, 0;\n\t@p st.shared.u16 [$1], $2;\n\tmov.b32 $0, 0;\n\t}",
                "=r,r,r,r", [hb + 2 * (ex_t - t_lo + it), kidx, (rem != 0).to(tl.int32)], dtype=tl.int32,
                is_pure=False, pack=1)
        rem = rem ^ low
    if not INTERPRETED:
        tl.debug_barrier()
    CQ: tl.constexpr = TILE // 8
    for q0 in range(0, T, CQ):
        q = q0 + tl.arange(0, CQ)
        qm = q < T
        if INTERPRETED:
            v = tl.load(slot0 + t_lo + q, mask=qm, other=0).to(tl.int32)
        else:
            v = tl.inline_asm_elementwise("ld.shared.u16 $0, [$1];", "=r,r", [hb + 2 * tl.where(qm, q, 0)],
                                          dtype=tl.int32, is_pure=False, pack=1)
        tl.store(slot0 + t_lo + q, (base + v).to(tl.int64), mask=qm)


@triton.jit
def _even_bits(x):
    """Bits 0, 2, .., 30 of each uint32 moved to bits 0..15 (the rest zero)."""
    x = x & 0x55555555
    x = (x | (x >> 1)) & 0x33333333
    x = (x | (x >> 2)) & 0x0F0F0F0F
    x = (x | (x >> 4)) & 0x00FF00FF
    return (x | (x >> 8)) & 0x0000FFFF


@triton.jit
def _flag_counts(v):
    """A part's flag words as ``sure << 32 | maybe`` (i64; each count < 2^20, so the sum
    of up to 2^12 words keeps the two fields apart)."""
    return (((v >> 20) & 0xFFFFF) << 32) | (v & 0xFFFFF)


@triton.jit
def _ready_words(ptr, valid):
    """The flag words at ``ptr`` (i64, any shape) once each has ``READY`` set: every thread
    spins on its own words (a relaxed GPU-scope load in a loop), so the block waits on
    no reduction and re-reads nothing; 0 where ``valid`` is false (not read). Under the
    interpreter, which runs the CTAs one after another in ticket order, one load."""
    if INTERPRETED:
        v = tl.load(ptr, mask=valid, other=0, volatile=True)
    else:
        v = tl.inline_asm_elementwise(WAIT_READY_ASM, "=l,l,r", [ptr.to(tl.int64), valid.to(tl.int32)],
                                      dtype=tl.int64, is_pure=False, pack=1)
    return v


@triton.jit
def _low_bits(g0, lim):
    """Per 32-key group starting at key ``g0`` (i32 ``[NW]``): the bits of its keys ``j <
    lim`` (uint32)."""
    nv = tl.minimum(tl.maximum(lim - g0, 0), 32)
    return tl.where(nv >= 32, 0xFFFFFFFF, (1 << tl.minimum(nv, 31).to(tl.uint32)) - 1).to(tl.uint32)


@triton.jit
def _store_weights(w_ptr, wb, r64, S, init_offset, j0, j, wd, lane, lane_u, n, TILE: tl.constexpr,
                   NW: tl.constexpr):
    """A part's weights (keys ``j0 .. j0 + TILE``; ``wb``: uint32 bits per 32-key group) in
    16-byte stores: the part's flat range starts ``dl = (r*S + init_offset + j0) % VEC``
    elements past a 16-byte boundary (S is any length), so the groups are stored shifted
    back by ``dl`` keys (each group's bits moved up by ``dl``, the previous group's top
    ``dl`` bits below them): groups 1.. of that view whole, group 0 from lane ``dl`` on, the
    part's last ``dl`` keys apart. The row's last part (keys past ``n``) stores key by
    key."""
    wty = w_ptr.dtype.element_ty
    VEC: tl.constexpr = 16 // (wty.primitive_bitwidth // 8)
    base = r64 * S + init_offset + j0
    dl = (base % VEC).to(tl.int32)
    if j0 + TILE <= n:
        off = tl.multiple_of(base - dl, VEC)
        dlu = dl.to(tl.uint32)
        prev = tl.gather(wb, tl.maximum(wd - 1, 0), 0)
        wsh = (wb << dlu) | tl.where((wd > 0) & (dl > 0), prev >> (32 - dlu), 0)
        wv = tl.where(((wsh[:, None] >> lane_u[None, :]) & 1) != 0, 1.0, 0.0).to(wty)
        tl.store(w_ptr + off + (wd * 32)[:, None] + lane[None, :], wv, mask=(wd > 0)[:, None])
        first = tl.sum(tl.where(wd == 0, wsh, 0), axis=0)
        tl.store(w_ptr + off + lane, tl.where(((first >> lane_u) & 1) != 0, 1.0, 0.0).to(wty), mask=lane >= dl)
        last = tl.sum(tl.where(wd == NW - 1, wb, 0), axis=0)
        tv = tl.arange(0, VEC)
        tb = (last >> (32 - dlu + tv.to(tl.uint32))) & 1
        tl.store(w_ptr + off + TILE + tv, tl.where(tb != 0, 1.0, 0.0).to(wty), mask=tv < dl)
    else:
        wv = tl.where(((wb[:, None] >> lane_u[None, :]) & 1) != 0, 1.0, 0.0).to(wty)
        tl.store(w_ptr + r64 * S + init_offset + j, wv, mask=j < n)


@triton.jit
def _emit_part(ge_s, ge_m, need, frow, sl_row, w_ptr, len_ptr, r64, c, j0, j, wd, lane, S, WS, n, w0, k,
               s_sink, s_win, init_offset, NW: tl.constexpr, TILE: tl.constexpr, QB: tl.constexpr):
    """One part's emit of a row of ``S`` keys whose weights lie in rows of stride ``WS``
    (``S`` on the fixed-``S`` path; ``S_alloc`` for a ragged row, ``pq_rgsplit.py``)
    (keys ``j = j0 ..``, ``[NW, 32]``; per 32-key group the bits ``ge_s`` of the keys
    ranking ``>= t_sure`` and ``ge_m`` of those ranking ``>= t_maybe``, from
    ``_score_bits`` or ``_class_bits``): classify per group (sure: ``>= t_sure``, maybe:
    ``t_maybe <= rank < t_sure``, candidates ``j < w0`` only; where fewer than ``k`` keys are candidates the
    lowest masked keys ``w0 <= j < k`` are sure too, spec step 4), publish the part's sure
    / maybe counts in its flag word ``frow[c]``, add up the earlier parts' (spinning
    until each has published), rank the taken keys and write the part's weights, sink,
    heavy and window entries; part 0 also the positions before the first key and
    ``sparse_len``.

    Rows whose heavy picks all lie between the sink and the window (``init_offset >=
    sink'``, ``ws >= init_offset``, ``w0 >= k``: the usual case) write heavy keys at
    ``sink' + rank`` and window keys at ``sink' + k + (j - w0)``. Any other row places
    each key's sink, heavy and window copies in one ascending list as ``pq_hist``'s
    ``_emit_generic`` does (equal values sort sink, heavy, window), each key's rank being
    its group's taken keys before it plus the lower taken bits of its mask."""
    lane_u = lane.to(tl.uint32)
    g0 = j0 + wd * 32
    ws = S - s_win  # first window position
    cand = _low_bits(g0, w0)
    fill = _low_bits(g0, k) & (cand ^ 0xFFFFFFFF)  # none unless w0 < k
    bs = (ge_s & cand) | fill
    bm = ge_m & cand & (bs ^ 0xFFFFFFFF)
    ps = _popc(bs)
    pm = _popc(bm)
    packed = ps + (pm << 16)
    tot = tl.sum(packed, axis=0)
    # publish this part's counts, then add up those of the row's earlier parts
    word = READY | ((tot & 0xFFFF).to(tl.int64) << 20) | (tot >> 16).to(tl.int64)
    tl.atomic_xchg(frow + c, word, sem="relaxed")
    carry_s = 0
    carry_m = 0
    if c > 0:
        # each thread waits for its own earlier parts' words, then one sum per QB parts
        for q0 in range(0, c, QB):
            qq = q0 + tl.arange(0, QB)
            both = tl.sum(_flag_counts(_ready_words(frow + qq, qq < c)), axis=0)
            carry_s += (both >> 32).to(tl.int32)
            carry_m += (both & 0xFFFFFFFF).to(tl.int32)
    take, ex_t, bound = _take_masks(bs, bm, ps, pm, packed, carry_s, carry_m, need, NW)

    # weights: taken keys, window keys (w0 <= j < n) and sink keys (j + init_offset < sink')
    wbits = take | (_low_bits(g0, n) & (cand ^ 0xFFFFFFFF)) | _low_bits(g0, s_sink - init_offset)
    _store_weights(w_ptr, wbits, r64, WS, init_offset, j0, j, wd, lane, lane_u, n, TILE, NW)
    total = s_sink + k + s_win
    if (init_offset >= s_sink) & (ws >= init_offset) & (w0 >= k):
        if j0 + TILE > w0:  # window keys in this part
            tl.store(sl_row + s_sink + k + (j - w0), (j + init_offset).to(tl.int64), mask=(j >= w0) & (j < n))
        # the part's taken keys: sure ones, and maybe ones while fewer than need are
        tot_s = tot & 0xFFFF
        tot_m = tot >> 16
        t_lo = carry_s + tl.minimum(carry_m, need)
        t_n = tot_s + tl.minimum(carry_m + tot_m, need) - tl.minimum(carry_m, need)
        _store_heavy_staged(sl_row + s_sink, ex_t, take, bound, j0 + init_offset, wd, t_lo, t_n, TILE)
    else:
        # four 32-key groups at a time (the whole part's positions at once would hold
        # i64 addresses for TILE keys and raise every row's register count)
        for s0 in range(0, tl.minimum(NW, tl.cdiv(n - j0, 32)), 4):  # groups holding keys
            gi = s0 + tl.arange(0, 4)
            tg = tl.gather(take, gi, 0)
            # taken keys of the row before each key, and whether it is taken
            tk = ((tg[:, None] >> lane_u[None, :]) & 1) != 0
            tb = tl.gather(ex_t, gi, 0)[:, None] + _popc(tg[:, None] & ((1 << lane_u[None, :]) - 1))
            p = j0 + init_offset + gi[:, None] * 32 + lane[None, :]
            pv = p.to(tl.int64)
            in_n = p < S
            sh = tl.maximum(p - ws, 0)  # window positions before p
            hs = tl.minimum(p + 1, s_sink)  # sink positions at or before p
            tl.store(sl_row + hs + tb + sh, pv, mask=tk)
            tl.store(sl_row + p + tb + sh, pv, mask=(p < s_sink) & in_n)
            tl.store(sl_row + hs + tb + tk.to(tl.int32) + (p - ws), pv, mask=(p >= ws) & in_n)
    if c == 0:
        # positions before the first key: sink and window entries (no heavy pick below
        # them) and their weights
        wty = w_ptr.dtype.element_ty
        w_row = w_ptr + r64 * WS
        for p0 in range(0, init_offset, 1024):  # 1024 at a time: few registers
            q = p0 + tl.arange(0, 1024)
            qm = q < init_offset
            is_sink = q < s_sink
            is_win = q >= ws
            tl.store(w_row + q, (is_sink | is_win).to(tl.float32).to(wty), mask=qm)
            tl.store(sl_row + q + tl.maximum(q - ws, 0), q.to(tl.int64), mask=qm & is_sink)
            tl.store(sl_row + tl.minimum(q + 1, s_sink) + (q - ws), q.to(tl.int64), mask=qm & is_win)
        tl.store(len_ptr + r64, total.to(tl.int64))


@triton.jit
def pq_thresh_kernel(
    q_ptr, k_ptr, cent_ptr, phi_ptr, codes_ptr, hist_ptr, histn_ptr, lut_ptr, bnd_ptr, need_ptr, flag_ptr,
    ctr_ptr, cls_ptr,  #
    q_sb, q_sh, k_sb, k_sh, k_ss,  #
    H, G, M, K, bits, d_s, S, n_old, cap, heavy, init_offset, window, metric_ip, NP,  #
    MP: tl.constexpr, NC: tl.constexpr, NB: tl.constexpr, LEVELS: tl.constexpr, DT: tl.constexpr,
    BLOCK_C: tl.constexpr, BLOCK_DS: tl.constexpr, TIMER: tl.constexpr = 0,
):
    """See the module docstring and README.md (launch contract)."""
    r = tl.program_id(0)
    r64, b, h, g, bg = _row_ids(r, H, G)
    n, w0, k, d_c = _row_sizes(S, init_offset, window, heavy, d_s, metric_ip)
    if tl.program_id(1) == 1:
        _quantize_cta(k_ptr, cent_ptr, phi_ptr, codes_ptr, b, h, g, bg, G, k_sb, k_sh, k_ss, M, K, d_s, d_c, n_old, n,
                      cap, init_offset, metric_ip, BLOCK_C, BLOCK_DS)
    else:
        t0 = _stamp(TIMER)
        # the emit's part flags of this row (and its ticket counter) start at zero
        for q0 in range(0, NP, 1024):
            qq = q0 + tl.arange(0, 1024)
            tl.store(flag_ptr + r64 * NP + qq, tl.zeros([1024], tl.int64), mask=qq < NP)
        if r == 0:
            tl.store(ctr_ptr, 0)
        s, t_sure, t_maybe, need, t1, t2, t3, t4 = _row_threshold(
            q_ptr, cent_ptr, codes_ptr, hist_ptr, histn_ptr, lut_ptr + r64 * M * K, r, r64, b, h, bg, q_sb,
            q_sh, M, K, bits, d_s, d_c, cap, w0, k, MP, NC, NB, LEVELS, DT, BLOCK_C, BLOCK_DS, TIMER)
        # the class bounds: candidates scoring >= t_sure are taken, >= t_maybe in order;
        # and each combination's class by them, for pq_emit (one gather per key)
        cls = (s >= t_sure).to(tl.uint8) * 2 + (s >= t_maybe).to(tl.uint8)
        tl.store(cls_ptr + r64 * NC + tl.arange(0, NC), cls)
        tl.store(bnd_ptr + 2 * r64, t_sure)
        tl.store(bnd_ptr + 2 * r64 + 1, t_maybe)
        tl.store(need_ptr + r, need)
        t5 = _stamp(TIMER)
        if TIMER:
            _store_stamps(lut_ptr, r64, M, K, t0, t1, t2, t3, t4, t5)


@triton.jit
def pq_emit_kernel(
    codes_ptr, lut_ptr, bnd_ptr, need_ptr, flag_ptr, ctr_ptr, sl_ptr, len_ptr, w_ptr, cls_ptr,  #
    H, G, M, K, S, cap, sink, window, heavy, init_offset, NP, by_class,  #
    MP: tl.constexpr, TILE: tl.constexpr, QB: tl.constexpr, NC: tl.constexpr,
):
    """See the module docstring and README.md (launch contract)."""
    tl.static_assert(TILE < 65536)  # two 16-bit counts per int32 in the scan (and < 2^20 per flag field)
    t = tl.atomic_add(ctr_ptr, 1, sem="relaxed")  # ticket: lower ones are running or done
    r = t // NP
    c = t - r * NP
    r64, b, h, g, bg = _row_ids(r, H, G)
    n, w0, k, _ = _row_sizes(S, init_offset, window, heavy, 0, 0)
    s_win = tl.minimum(window, S)
    # this part's keys j0 .. j0 + TILE as [TILE/32, 32]: one 32-key group per row
    NW: tl.constexpr = TILE // 32
    wd = tl.arange(0, NW)
    lane = tl.arange(0, 32)
    j0 = c * TILE
    j = j0 + wd[:, None] * 32 + lane[None, :]
    if by_class != 0:
        ge_s, ge_m = _class_bits(codes_ptr, cls_ptr + r64 * NC, bg, M, K, cap, j0, NW, MP, NC)
    else:
        sc = _part_scores(codes_ptr, lut_ptr + r64 * M * K, bg, M, K, cap, j, MP, 0, 0)
        ge_s, ge_m = _score_bits(sc, tl.load(bnd_ptr + 2 * r64), tl.load(bnd_ptr + 2 * r64 + 1), lane)
    s_sink = tl.minimum(sink, S)
    need = tl.load(need_ptr + r)
    _emit_part(ge_s, ge_m, need, flag_ptr + r64 * NP, sl_ptr + r64 * (s_sink + k + s_win), w_ptr, len_ptr,
               r64, c, j0, j, wd, lane, S, S, n, w0, k, s_sink, s_win, init_offset, NW, TILE, QB)


# ----------------------------------------------------------------------------------
# declarations for the build

DTYPES = ("fp32", "bf16", "fp16")
MPS = (2, 4)  # pq_thresh: code rows loaded per key, M <= MP (the combination histogram takes M <= 4)
EMIT_MPS = (2, 4, 8)  # pq_emit: also M <= 8 (the radix-select path)
THRESH_FIXED = {k: HIST_FIXED[k] for k in ("NC", "NB", "LEVELS", "DT", "BLOCK_C", "BLOCK_DS")}
EMIT_FIXED = {"QB": 64, "NC": HIST_FIXED["NC"]}
TUNED = {"fp32", "bf16", "fp16"}


def _thresh_args(qt):
    return (
        ptr("q_ptr", qt, False), ptr("k_ptr", qt, False), ptr("cent_ptr", "fp32"), ptr("phi_ptr", "fp32", False),
        ptr("codes_ptr", "u8"), ptr("hist_ptr", "i32"), ptr("histn_ptr", "i32"),
        ptr("lut_ptr", "fp32"), ptr("bnd_ptr", "fp32"), ptr("need_ptr", "i32"), ptr("flag_ptr", "i64"),
        ptr("ctr_ptr", "i32"), ptr("cls_ptr", "u8"),
        i64("q_sb"), i64("q_sh"), i64("k_sb"), i64("k_sh"), i64("k_ss"),
        i32("H"), i32("G"), i32("M"), i32("K"), i32("bits"), i32("d_s"), i32("S"), i32("n_old"),
        i32("cap", div16=True), i32("heavy"), i32("init_offset"), i32("window"), i32("metric_ip"), i32("NP"),
    )


def _emit_args(wt):
    return (
        ptr("codes_ptr", "u8"), ptr("lut_ptr", "fp32"), ptr("bnd_ptr", "fp32"), ptr("need_ptr", "i32"),
        ptr("flag_ptr", "i64"), ptr("ctr_ptr", "i32"), ptr("sl_ptr", "i64"), ptr("len_ptr", "i64"),
        ptr("w_ptr", wt), ptr("cls_ptr", "u8"), i32("H"), i32("G"), i32("M"), i32("K"), i32("S"), i32("cap", div16=True),
        i32("sink"), i32("window"), i32("heavy"), i32("init_offset"), i32("NP"), i32("by_class"),
    )


def _emit_variants(wt):
    # measured on the H100 (NOTES.md, "the histogram path split in two launches (`pq_thresh` + `pq_emit`)", JIT harness, GPU us of pq_thresh +
    # pq_emit): TILE 4096 w4 reference 24.0 / large 83.3; w8 23.0 / 88.8; TILE 2048 w4
    # 24.2 / 86.3; TILE 1024 slower (108 us large). TILE 8192 spills with 4 warps.
    d = {"TILE": 4096}
    v90 = grid(d, 4, 1, num_warps=(4, 8), TILE=(1024, 2048, 4096, 8192)) if wt in TUNED else single(d, 4, 1)
    return {80: single(d, 4, 1), 90: v90}


KERNELS = []
for _mp in MPS:
    for _qt in DTYPES:
        KERNELS.append(
            Kernel(name=f"pq_thresh.m{_mp}.q_{_qt}", fn=pq_thresh_kernel, args=_thresh_args(_qt),
                   fixed=dict(THRESH_FIXED, MP=_mp), variants={80: single({}, 8, 1),
                                                                90: grid({}, 8, 1, num_warps=(4, 8))}))
for _mp in EMIT_MPS:
    for _wt in DTYPES:
        KERNELS.append(
            Kernel(name=f"pq_emit.m{_mp}.w_{_wt}", fn=pq_emit_kernel, args=_emit_args(_wt),
                   fixed=dict(EMIT_FIXED, MP=_mp), variants=_emit_variants(_wt)))
