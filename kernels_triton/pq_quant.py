"""Bulk quantization of a decode step's new keys (spec step 1), any number of them.

Kernels (launch contract: README.md in this directory): ``pq_quant``, built as two logical
kernels per key dtype ``qt``: ``pq_quant.k_<qt>`` for any key layout and
``pq_quant.a16.k_<qt>``, whose key pointer (16 bytes), key strides and ``d_s`` (16
elements) are declared multiples of 16 so a key tile loads as 16-byte vectors; the runtime
takes the second where the keys allow (``Kernels::quant_for`` in src/pq/kernels.rs). And
``pq_cprep``, launched once when an indexer is made: what every ``pq_quant`` CTA would
otherwise derive again from the constant centroids.

* ``pq_cprep_kernel``: the centroids' squared norms ``cn f32 [B*H_kv*M, K]`` and their
  three-term bf16 split ``prep bf16 [B*H_kv*M, 3, K, d_s]`` (see its docstring).

* ``pq_quant_kernel``: ``codes[b, g, m, t0 + t] = argmin_c ||x - centroids[b, g, m, c]||^2``
  for the new keys ``t < n_new`` at positions ``pos0 + t`` of KV head ``(b, g)``,
  subvector ``m`` (metric ip: ``x`` extended by ``sqrt(max(0, phi - ||x||^2))``).
  Grid ``(P, B*H_kv*M)``, any ``P >= 1``: program ``(i, row)``, ``row = (b*H_kv + g)*M +
  m``, owns the key tiles ``i, i + P, ..`` (``BLOCK_N`` keys each) of that subvector.
  Keys: ``[B, H_kv, S_alloc, D]`` of the key dtype (fp32 / bf16 / fp16) with element
  strides ``k_sb, k_sh, k_ss`` (``D`` contiguous); centroids f32 ``[B, H_kv, M, K, d_c]``;
  phi f32 ``[B*H_kv*M]`` (ip only); ``prep`` and ``cn`` as ``pq_cprep_kernel`` wrote them
  for these centroids; codes u8 ``[B, H_kv, M, cap]``.

How: one pass over the keys' bytes. A tile of ``BLOCK_N`` keys x ``BLOCK_C`` centroids
scores ``||c||^2 - 2 <x, c>`` (the distance less the key's own ``||x||^2``, which does not
move the argmin) with the tensor cores, then a running argmin over the centroid blocks,
lowest ``c`` on ties. ``<x, c>``: with ``SPLIT16`` (bf16 keys, which are exact in bf16)
against the f32 centroids split into three bf16 terms ``c1 + c2 + c3`` (``prep``: 24
mantissa bits, f32's exponent range), the three bf16 products exact, accumulated in f32; else
``tl.dot`` in ``tf32x3`` (each f32 operand split in a tf32 high and low part, three
products: about 2^-21 relative per product, f32 accumulation).
The expanded form differs from the direct ``sum (x - c)^2`` (``_nearest`` in
pq_select.py, the CPU reference) only by rounding, a few 1e-7 of ``||x||^2 + ||c||^2``
for ``d_s <= 128``: far inside the spec's code check (a code is right when its f64
distance is within ``1e-5 * (||x||^2 + max ||c||^2)`` of the minimum; ``CODE_TOL`` in
src/pq/check.rs). Exact ties (equal centroids) give equal expanded scores: lowest ``c``.

Speed (NOTES.md, "multi-token steps (issue 21, item 1)" and "the centroids' split made
once"): the kernel is bound by each CTA's latency chain, not by bandwidth, so what counts
is CTAs resident per SM and the per-CTA work that does not scale with its keys. The
vector-load bf16 default takes 128 keys per tile with the bf16 split, 8 warps held to 128
registers (``MAXNREG``: two CTAs per SM); the runtime launches one round of resident
CTAs (``P`` per row, from the driver's occupancy), each looping over its tiles, the
centroid norms and split read ready-made (``pq_cprep``) instead of derived again by
every CTA.

Where every centroid and coordinate fits one block (``SPLIT16`` builds, ``BLOCK_D`` 64:
``K <= 64``, ``d_s <= 64``, PQCache's (2, 6) at D = 128) the split and norms are loaded
once per CTA and the key tiles run in a loop of their own (``_quant_one_block``: a load,
three products and the argmin a tile). H100, 4096 new keys, ``do_bench_cudagraph``
(NOTES.md, "one block of centroids, one loop of tiles"): 10.7 -> 7.2-7.4 us. Where the
coordinates fit one block but the centroids take several (``K > 64``: bits 7-8) each key
tile is loaded once and the centroid blocks run over it (``_quant_key_once``); only
``d_s > BLOCK_D`` (and the tf32x3 builds) take the general loop (``_quant_tiles``), which
loads the tile's coordinate blocks again for every centroid block.

Chained after ``pq_wfill`` (sm_90, ``PDL=1``; the indexed step with many new keys,
``src/pq/launch.rs``): ``pq_wfill`` (a plain launch) -> ``pq_quant`` (its programmatic
dependent: the weights and the codes are independent, so the quantizing starts while the
weights are written) -> ``pq_index`` (``pq_quant``'s programmatic dependent, which waits
for it before it reads any code). ``pq_quant`` triggers its dependent at once and waits
for ``pq_wfill`` before it exits, so ``pq_index``'s one wait covers both. Launched
plainly (every other step) the wait returns at once and the trigger has no effect.

Keys the expanded form cannot answer exactly: a subvector with ``||x||^2`` not below
``SAFE`` (NaN, inf, or so large that products could overflow), or any centroid of the
block with ``||c||^2`` not below ``SAFE``, or metric ip with ``phi`` not below ``SAFE``
(the one-block loop flags a key by its smallest expanded distance instead: not finite
where a coordinate is NaN or infinite or a product overflows; a finite one is within the
code rule at any magnitude, the expanded form's error being relative).
Those keys (none on finite data of sane size) are redone one by one with the direct
differences under the spec's non-finite rule by ``_nearest`` (pq_select.py, the
quantizer of every other kernel): each distance ``d`` becomes ``+inf`` where NaN and
``FLT_MAX`` where ``+inf``, then the argmin starting from ``(+inf, 0)``, lowest ``c`` on
ties: the lowest ``c`` whose distance is not NaN, code 0 where all are.
"""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from kspec import Kernel, Variant, i32, i64, ptr, single
from pq_select import _mul_rn, _nearest

#: squared norms below this take the tensor-core form: every term of it and of the direct
#: distance stays below ~4e18, far from f32 overflow (3.4e38)
SAFE = tl.constexpr(1e18)


@triton.jit
def pq_cprep_kernel(cent_ptr, prep_ptr, cn_ptr, K, d_s, metric_ip, split, BLOCK_C: tl.constexpr,
                    BLOCK_D: tl.constexpr):
    """What ``pq_quant_kernel`` needs of the constant centroids, made once per indexer.
    Grid ``(cdiv(K, BLOCK_C), rows)``, ``rows = B*H_kv*M``: ``cn[row, c] = ||c||^2`` over
    its ``d_c = d_s + metric_ip`` coordinates (f32 products rounded, ``_mul_rn``; NaN /
    inf stay, for ``pq_quant_kernel``'s test against ``SAFE``) and, where ``split`` (bf16
    keys: only the ``SPLIT16`` builds read it), ``prep[row, i, c, :]`` (bf16 ``[rows, 3, K,
    d_s]``) the three-term bf16 split of its first ``d_s`` coordinates: ``c = c1 + c2 +
    c3`` exactly where finite (24 mantissa bits, f32's exponent range). With ``split = 0``
    ``prep`` is not written (any pointer)."""
    cb = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    d_c = d_s + metric_ip
    offs_c = cb * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = offs_c < K
    cn = tl.zeros([BLOCK_C], tl.float32)
    for d0 in range(0, d_c, BLOCK_D):
        offs_d = d0 + tl.arange(0, BLOCK_D)
        c = tl.load(cent_ptr + row * K * d_c + offs_c[:, None] * d_c + offs_d[None, :],
                    mask=cmask[:, None] & (offs_d < d_c)[None, :], other=0.0)
        cn += tl.sum(_mul_rn(c, c), axis=1)
        c1 = c.to(tl.bfloat16)
        r1 = c - c1.to(tl.float32)
        c2 = r1.to(tl.bfloat16)
        c3 = (r1 - c2.to(tl.float32)).to(tl.bfloat16)
        pm = cmask[:, None] & (offs_d < d_s)[None, :] & (split != 0)
        pb = prep_ptr + (row * 3 * K + offs_c[:, None]) * d_s + offs_d[None, :]
        tl.store(pb, c1, mask=pm)
        tl.store(pb + K * d_s, c2, mask=pm)
        tl.store(pb + 2 * K * d_s, c3, mask=pm)
    tl.store(cn_ptr + row * K + offs_c, cn, mask=cmask)


@triton.jit
def pq_quant_kernel(k_ptr, cent_ptr, phi_ptr, prep_ptr, cn_ptr, codes_ptr, k_sb, k_sh, k_ss, H_kv, M, K, d_s, pos0,
                    t0, n_new, cap, metric_ip, BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_D: tl.constexpr,
                    SPLIT16: tl.constexpr, PDL: tl.constexpr = 0):
    """See the module docstring. Grid ``(P, B*H_kv*M)``, any ``P >= 1``: CTA ``(i, row)``
    takes the key tiles ``i, i + P, ..`` of ``cdiv(n_new, BLOCK_N)``.

    With ``PDL`` (sm_90) the kernel can sit in a chain of programmatic dependent launches
    (see "Chained after ``pq_wfill``" in the module docstring): it lets its dependent
    start at once, and before exiting it waits for its own primary (if it was launched
    as a dependent; otherwise the wait returns at once)."""
    tl.static_assert(SPLIT16 == 0 or k_ptr.dtype.element_ty == tl.bfloat16, "SPLIT16: bf16 keys only")
    if PDL:
        gdc_launch_dependents()
    row = tl.program_id(1).to(tl.int64)  # (b*H_kv + g)*M + m
    m = row % M
    bg = row // M
    b = bg // H_kv
    g = bg % H_kv
    d_c = d_s + metric_ip
    cbase = row * K * d_c
    pbase = row * 3 * K * d_s
    phi = tl.load(phi_ptr + row * metric_ip)  # euclidean: phi_ptr[0], unused
    ntiles = tl.cdiv(n_new, BLOCK_N)
    if SPLIT16:
        if (K <= BLOCK_C) & (d_s <= BLOCK_D):
            # the metric's branch outside the loop: two loops, neither branching per tile
            if metric_ip != 0:
                any_bad = _quant_one_block(k_ptr, cent_ptr, prep_ptr, cn_ptr, codes_ptr, row, b, g, m, k_sb, k_sh,
                                           k_ss, K, d_s, d_c, cbase, pbase, phi, pos0, t0, n_new, cap, True, BLOCK_N,
                                           BLOCK_C, BLOCK_D)
            else:
                any_bad = _quant_one_block(k_ptr, cent_ptr, prep_ptr, cn_ptr, codes_ptr, row, b, g, m, k_sb, k_sh,
                                           k_ss, K, d_s, d_c, cbase, pbase, phi, pos0, t0, n_new, cap, False, BLOCK_N,
                                           BLOCK_C, BLOCK_D)
        elif d_s <= BLOCK_D:
            if metric_ip != 0:
                any_bad = _quant_key_once(k_ptr, cent_ptr, prep_ptr, cn_ptr, codes_ptr, row, b, g, m, k_sb, k_sh,
                                          k_ss, K, d_s, d_c, cbase, pbase, phi, pos0, t0, n_new, cap, True, BLOCK_N,
                                          BLOCK_C, BLOCK_D)
            else:
                any_bad = _quant_key_once(k_ptr, cent_ptr, prep_ptr, cn_ptr, codes_ptr, row, b, g, m, k_sb, k_sh,
                                          k_ss, K, d_s, d_c, cbase, pbase, phi, pos0, t0, n_new, cap, False, BLOCK_N,
                                          BLOCK_C, BLOCK_D)
        else:
            any_bad = _quant_tiles(k_ptr, cent_ptr, prep_ptr, cn_ptr, codes_ptr, row, b, g, m, k_sb, k_sh, k_ss, K, d_s,
                                   d_c, cbase, pbase, phi, pos0, t0, n_new, cap, metric_ip, BLOCK_N, BLOCK_C, BLOCK_D,
                                   SPLIT16)
    else:
        any_bad = _quant_tiles(k_ptr, cent_ptr, prep_ptr, cn_ptr, codes_ptr, row, b, g, m, k_sb, k_sh, k_ss, K, d_s,
                               d_c, cbase, pbase, phi, pos0, t0, n_new, cap, metric_ip, BLOCK_N, BLOCK_C, BLOCK_D,
                               SPLIT16)
    # the keys the expanded form cannot answer (none on finite data of sane size): one by
    # one, direct differences, each code stored again after a barrier (so the later store
    # is the one that stays); outside the tile loop, which stays lean
    if any_bad != 0:
        tl.debug_barrier()
        cbad = 0
        for cb in range(0, K, BLOCK_C):
            offs_c = cb + tl.arange(0, BLOCK_C)
            cn = tl.load(cn_ptr + row * K + offs_c, mask=offs_c < K, other=0.0)
            cbad = tl.maximum(cbad, tl.max(((offs_c < K) & ~(cn < SAFE)).to(tl.int32), axis=0))
        code_row = codes_ptr + row * cap + t0
        for tile in range(tl.program_id(0), ntiles, tl.num_programs(0)):
            for i in range(0, BLOCK_N):
                ti = tile * BLOCK_N + i
                if ti < n_new:
                    kb = b * k_sb + g * k_sh + (pos0 + ti).to(tl.int64) * k_ss + m * d_s
                    # this key's test again (its rounding may differ from the tile's at
                    # the edge; either answer is then a finite key's code)
                    offs_d = tl.arange(0, BLOCK_D)
                    xs = tl.zeros([BLOCK_D], tl.float32)
                    for d0 in range(0, d_s, BLOCK_D):
                        xv = tl.load(k_ptr + kb + d0 + offs_d, mask=d0 + offs_d < d_s, other=0.0).to(tl.float32)
                        xs += _mul_rn(xv, xv)
                    bad_i = ~(tl.sum(xs, axis=0) < SAFE) | (cbad != 0)
                    if metric_ip != 0:
                        bad_i = bad_i | ~(phi < SAFE)
                    if bad_i:
                        ci = _nearest(k_ptr, kb, cent_ptr, cbase, phi, d_s, d_c, K, metric_ip, BLOCK_C, BLOCK_D)
                        tl.store(code_row + ti, ci.to(tl.uint8))
    if PDL:
        # this grid completes only after its primary has: a dependent that waits for this
        # grid (griddepcontrol.wait) has then seen the primary's stores too
        gdc_wait()


@triton.jit
def _quant_tiles(k_ptr, cent_ptr, prep_ptr, cn_ptr, codes_ptr, row, b, g, m, k_sb, k_sh, k_ss, K, d_s, d_c, cbase,
                 pbase, phi, pos0, t0, n_new, cap, metric_ip, BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr,
                 BLOCK_D: tl.constexpr, SPLIT16: tl.constexpr):
    """``pq_quant_kernel``'s key tiles ``program_id(0), + P, ..`` by ``_quant_tile`` (any
    ``K`` and ``d_s``: blocks of centroids and coordinates); returns whether a key may
    need the direct form. With ``SPLIT16`` the metric's branch is taken once, outside two
    loops specialized on it; the tf32x3 form keeps one loop that reads the metric per
    centroid block: specialized, its loop measured slower (H200, NOTES.md "``pq_quant``'s
    general loop": the fp32 reference step with 4096 new keys 136 -> 138 us euclidean,
    141 -> 149 ip; one loop 131-133 and 136)."""
    any_bad = 0
    if SPLIT16:
        if metric_ip != 0:
            for tile in range(tl.program_id(0), tl.cdiv(n_new, BLOCK_N), tl.num_programs(0)):
                bad = _quant_tile(k_ptr, cent_ptr, prep_ptr, cn_ptr, codes_ptr, tile, row, b, g, m, k_sb, k_sh, k_ss,
                                  K, d_s, d_c, cbase, pbase, phi, pos0, t0, n_new, cap, metric_ip, 1, BLOCK_N, BLOCK_C,
                                  BLOCK_D, SPLIT16)
                any_bad = tl.maximum(any_bad, bad)
        else:
            for tile in range(tl.program_id(0), tl.cdiv(n_new, BLOCK_N), tl.num_programs(0)):
                bad = _quant_tile(k_ptr, cent_ptr, prep_ptr, cn_ptr, codes_ptr, tile, row, b, g, m, k_sb, k_sh, k_ss,
                                  K, d_s, d_c, cbase, pbase, phi, pos0, t0, n_new, cap, metric_ip, 0, BLOCK_N, BLOCK_C,
                                  BLOCK_D, SPLIT16)
                any_bad = tl.maximum(any_bad, bad)
    else:
        for tile in range(tl.program_id(0), tl.cdiv(n_new, BLOCK_N), tl.num_programs(0)):
            bad = _quant_tile(k_ptr, cent_ptr, prep_ptr, cn_ptr, codes_ptr, tile, row, b, g, m, k_sb, k_sh, k_ss, K,
                              d_s, d_c, cbase, pbase, phi, pos0, t0, n_new, cap, metric_ip, 2, BLOCK_N, BLOCK_C, BLOCK_D,
                              SPLIT16)
            any_bad = tl.maximum(any_bad, bad)
    return any_bad


@triton.jit
def _quant_one_block(k_ptr, cent_ptr, prep_ptr, cn_ptr, codes_ptr, row, b, g, m, k_sb, k_sh, k_ss, K, d_s, d_c, cbase,
                     pbase, phi, pos0, t0, n_new, cap, IP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr,
                     BLOCK_D: tl.constexpr):
    """``pq_quant_kernel``'s tiles where every centroid and coordinate fits one block
    (``SPLIT16``, ``K <= BLOCK_C``, ``d_s <= BLOCK_D``): the centroids' split and norms
    loaded once, then the CTA's key tiles ``program_id(0), + P, ..`` in a loop of their
    own (each tile one load, three bf16 products, the argmin). Returns 1 where a key may
    need the direct form, else 0: any of the CTA's keys whose smallest expanded distance
    is not finite (a NaN or infinite coordinate gives every distance NaN or +-inf;
    products past f32's range give inf), or a centroid norm or (ip) phi not below ``SAFE``.
    A finite key whose distances are finite needs no test of its own norm: the expanded
    form's error is relative (f32 sums of exact products, within the code rule at any
    magnitude), and the direct form's sweep re-tests each key by its norm. ``IP``: metric
    ip (a constexpr, so the loop carries no per-tile branch on the metric). Centroids past
    ``K`` get norm ``+inf`` (their products are 0), so they never win the argmin.

    Measured (H200, Triton JIT, ``do_bench_cudagraph``, 4096 new keys at (2, 6): NOTES.md,
    "``pq_quant``'s one-block loop without a branch"): the metric's runtime branch inside
    the loop cost 0.75 us of 8.3 even untaken; ``tl.min`` with its index in one reduction
    0.4 us against ``tl.min`` then ``tl.argmin``."""
    offs_c = tl.arange(0, BLOCK_C)
    cmask = offs_c < K
    offs_d = tl.arange(0, BLOCK_D)
    dmask = offs_d < d_s
    cm = dmask[:, None] & cmask[None, :]
    pb = prep_ptr + pbase + offs_c[None, :] * d_s + offs_d[:, None]
    c1 = tl.load(pb, mask=cm, other=0.0)
    c2 = tl.load(pb + K * d_s, mask=cm, other=0.0)
    c3 = tl.load(pb + 2 * K * d_s, mask=cm, other=0.0)
    cn = tl.load(cn_ptr + row * K + offs_c, mask=cmask, other=float("inf"))
    bad = tl.max((cmask & ~(cn < SAFE)).to(tl.int32), axis=0)
    if IP:
        bad = tl.maximum(bad, (~(phi < SAFE)).to(tl.int32))
        cl = tl.load(cent_ptr + cbase + offs_c * d_c + d_s, mask=cmask, other=0.0)
    kb0 = b * k_sb + g * k_sh + m * d_s
    rbad = tl.zeros([BLOCK_N], tl.int32)
    for tile in range(tl.program_id(0), tl.cdiv(n_new, BLOCK_N), tl.num_programs(0)):
        t = tile * BLOCK_N + tl.arange(0, BLOCK_N)
        tmask = t < n_new
        xk = tl.load(k_ptr + kb0 + (pos0 + t).to(tl.int64)[:, None] * k_ss + offs_d[None, :],
                     mask=tmask[:, None] & dmask[None, :], other=0.0)
        acc = tl.dot(xk, c1)
        acc = tl.dot(xk, c2, acc)
        acc = tl.dot(xk, c3, acc)
        if IP:
            x = xk.to(tl.float32)
            aug = tl.sqrt(tl.maximum(phi - tl.sum(_mul_rn(x, x), axis=1), 0.0))
            acc += aug[:, None] * cl[None, :]
        dmin, cmin = tl.min(cn[None, :] - 2.0 * acc, axis=1, return_indices=True, return_indices_tie_break_left=True)
        rbad = tl.maximum(rbad, (tmask & ~(tl.abs(dmin) < float("inf"))).to(tl.int32))
        tl.store(codes_ptr + row * cap + t0 + t, cmin.to(tl.uint8), mask=tmask)
    return tl.maximum(bad, tl.max(rbad, axis=0))


@triton.jit
def _quant_key_once(k_ptr, cent_ptr, prep_ptr, cn_ptr, codes_ptr, row, b, g, m, k_sb, k_sh, k_ss, K, d_s, d_c, cbase,
                    pbase, phi, pos0, t0, n_new, cap, IP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr,
                    BLOCK_D: tl.constexpr):
    """``pq_quant_kernel``'s tiles where the coordinates fit one block but the centroids
    take several (``SPLIT16``, ``d_s <= BLOCK_D``, ``K > BLOCK_C``: PQCache's bits 7-8 at
    ``D / M <= 64``): the centroid norms tested once per CTA, then per key tile one load
    of its keys and, per centroid block, three bf16 products against the block's split and
    one reduction (smallest distance and its index), the running argmin keeping the lower
    block on a tie. Returns 1 where a key may need the direct form, as
    ``_quant_one_block``: a key whose smallest expanded distance is not finite, or a
    centroid norm or (ip) phi not below ``SAFE``. ``IP``: metric ip (constexpr).

    Measured (H100, Triton JIT, ``do_bench_cudagraph``, 4096 new keys, B=1 H_kv=8 D=128,
    128 keys a tile; NOTES.md, "``pq_quant`` at bits 7-8: the key tile loaded once"):
    against ``_quant_tile``, which loaded the key tile and summed its squares again for
    every centroid block, (2, 8) 28.2 -> 21.7 us, (4, 8) 54.4 -> 40.7, (2, 7) 16.1 ->
    12.8."""
    offs_d = tl.arange(0, BLOCK_D)
    dmask = offs_d < d_s
    bad = 0
    for cb in range(0, K, BLOCK_C):
        offs_c = cb + tl.arange(0, BLOCK_C)
        cn = tl.load(cn_ptr + row * K + offs_c, mask=offs_c < K, other=0.0)
        bad = tl.maximum(bad, tl.max(((offs_c < K) & ~(cn < SAFE)).to(tl.int32), axis=0))
    if IP:
        bad = tl.maximum(bad, (~(phi < SAFE)).to(tl.int32))
    kb0 = b * k_sb + g * k_sh + m * d_s
    rbad = tl.zeros([BLOCK_N], tl.int32)
    for tile in range(tl.program_id(0), tl.cdiv(n_new, BLOCK_N), tl.num_programs(0)):
        t = tile * BLOCK_N + tl.arange(0, BLOCK_N)
        tmask = t < n_new
        xk = tl.load(k_ptr + kb0 + (pos0 + t).to(tl.int64)[:, None] * k_ss + offs_d[None, :],
                     mask=tmask[:, None] & dmask[None, :], other=0.0)
        if IP:
            x = xk.to(tl.float32)
            aug = tl.sqrt(tl.maximum(phi - tl.sum(_mul_rn(x, x), axis=1), 0.0))
        best_d = tl.full([BLOCK_N], float("inf"), tl.float32)
        best_c = tl.zeros([BLOCK_N], tl.int32)
        for cb in range(0, K, BLOCK_C):
            offs_c = cb + tl.arange(0, BLOCK_C)
            cmask = offs_c < K
            cm = dmask[:, None] & cmask[None, :]
            pb = prep_ptr + pbase + offs_c[None, :] * d_s + offs_d[:, None]
            acc = tl.dot(xk, tl.load(pb, mask=cm, other=0.0))
            acc = tl.dot(xk, tl.load(pb + K * d_s, mask=cm, other=0.0), acc)
            acc = tl.dot(xk, tl.load(pb + 2 * K * d_s, mask=cm, other=0.0), acc)
            if IP:
                cl = tl.load(cent_ptr + cbase + offs_c * d_c + d_s, mask=cmask, other=0.0)
                acc += aug[:, None] * cl[None, :]
            # centroids past K: norm +inf, so they never win
            cn = tl.load(cn_ptr + row * K + offs_c, mask=cmask, other=float("inf"))
            dmin, cmin = tl.min(cn[None, :] - 2.0 * acc, axis=1, return_indices=True,
                                return_indices_tie_break_left=True)
            take = dmin < best_d  # strict: on a tie the earlier block (lower c) stays
            best_c = tl.where(take, cmin.to(tl.int32) + cb, best_c)
            best_d = tl.where(take, dmin, best_d)
        # NaN distances never win: a key whose every distance is NaN keeps +inf, flagged
        rbad = tl.maximum(rbad, (tmask & ~(tl.abs(best_d) < float("inf"))).to(tl.int32))
        tl.store(codes_ptr + row * cap + t0 + t, best_c.to(tl.uint8), mask=tmask)
    return tl.maximum(bad, tl.max(rbad, axis=0))


@triton.jit
def _quant_tile(k_ptr, cent_ptr, prep_ptr, cn_ptr, codes_ptr, tile, row, b, g, m, k_sb, k_sh, k_ss, K, d_s, d_c, cbase,
                pbase, phi, pos0, t0, n_new, cap, metric_ip, IP: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_C: tl.constexpr, BLOCK_D: tl.constexpr, SPLIT16: tl.constexpr):
    """Key tile ``tile`` of ``pq_quant_kernel``'s row ``row``: codes ``t0 + t`` for keys
    ``t = tile*BLOCK_N ..`` (``< n_new``) at positions ``pos0 + t`` by the expanded form.
    Returns 1 where a key of the tile needs the direct form (see the module docstring),
    else 0. ``IP``: 0 euclidean, 1 ip (no branch on the metric per centroid block), 2
    the metric ``metric_ip`` read at run time. Per centroid block one reduction gives
    the smallest distance and its index; centroids past ``K`` get norm ``+inf`` (their
    products are 0), so they never win."""
    t = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    tmask = t < n_new
    kbase = b * k_sb + g * k_sh + (pos0 + t).to(tl.int64) * k_ss + m * d_s  # [BLOCK_N]
    best_d = tl.full([BLOCK_N], float("inf"), tl.float32)
    best_c = tl.zeros([BLOCK_N], tl.int32)
    xx = tl.zeros([BLOCK_N], tl.float32)
    cbad = 0
    for cb in range(0, K, BLOCK_C):
        offs_c = cb + tl.arange(0, BLOCK_C)
        cmask = offs_c < K
        acc = tl.zeros([BLOCK_N, BLOCK_C], tl.float32)
        xx = tl.zeros([BLOCK_N], tl.float32)
        for d0 in range(0, d_s, BLOCK_D):
            offs_d = d0 + tl.arange(0, BLOCK_D)
            dmask = offs_d < d_s
            xk = tl.load(k_ptr + kbase[:, None] + offs_d[None, :], mask=tmask[:, None] & dmask[None, :],
                         other=0.0)
            x = xk.to(tl.float32)
            cm = dmask[:, None] & cmask[None, :]
            if SPLIT16:
                # bf16 keys are exact in bf16: three exact bf16 products against the
                # centroids' split (pq_cprep_kernel, [BLOCK_D, BLOCK_C] each), f32 sums
                pb = prep_ptr + pbase + offs_c[None, :] * d_s + offs_d[:, None]
                acc = tl.dot(xk, tl.load(pb, mask=cm, other=0.0), acc)
                acc = tl.dot(xk, tl.load(pb + K * d_s, mask=cm, other=0.0), acc)
                acc = tl.dot(xk, tl.load(pb + 2 * K * d_s, mask=cm, other=0.0), acc)
            else:
                # centroids transposed: [BLOCK_D, BLOCK_C]
                ct = tl.load(cent_ptr + cbase + offs_c[None, :] * d_c + offs_d[:, None], mask=cm, other=0.0)
                acc = tl.dot(x, ct, acc, input_precision="tf32x3")
            xx += tl.sum(_mul_rn(x, x), axis=1)
        cn = tl.load(cn_ptr + row * K + offs_c, mask=cmask, other=float("inf"))
        if (IP == 1) or ((IP == 2) and (metric_ip != 0)):
            aug = tl.sqrt(tl.maximum(phi - xx, 0.0))
            cl = tl.load(cent_ptr + cbase + offs_c * d_c + d_s, mask=cmask, other=0.0)
            acc += aug[:, None] * cl[None, :]
        cbad = tl.maximum(cbad, tl.max((cmask & ~(cn < SAFE)).to(tl.int32), axis=0))
        dmin, cmin = tl.min(cn[None, :] - 2.0 * acc, axis=1, return_indices=True, return_indices_tie_break_left=True)
        cmin = cmin.to(tl.int32) + cb
        take = dmin < best_d  # strict: on a tie the earlier block (lower c) stays
        best_c = tl.where(take, cmin, best_c)
        best_d = tl.where(take, dmin, best_d)
    bad = ~(xx < SAFE) | (cbad != 0)
    if (IP == 1) or ((IP == 2) and (metric_ip != 0)):
        bad = bad | ~(phi < SAFE)
    tl.store(codes_ptr + row * cap + t0 + t, best_c.to(tl.uint8), mask=tmask)
    return tl.max((tmask & bad).to(tl.int32), axis=0)


# ----------------------------------------------------------------------------------
# declarations for the build

DTYPES = ("fp32", "bf16", "fp16")
FIXED = {"BLOCK_C": 64}
#: registers per thread at most for the vector-load family: two 8-warp CTAs per SM
MAXNREG = 128


def _args(qt, aligned):
    """The launch arguments; ``aligned``: the key pointer (16 bytes), the key strides and
    ``d_s`` (16 elements) declared divisible by 16, so key tiles load as vectors."""
    return (ptr("k_ptr", qt, aligned), ptr("cent_ptr", "fp32"), ptr("phi_ptr", "fp32", False),
            ptr("prep_ptr", "bf16"), ptr("cn_ptr", "fp32"), ptr("codes_ptr", "u8"), i64("k_sb", div16=aligned), i64("k_sh", div16=aligned),
            i64("k_ss", div16=aligned), i32("H_kv"), i32("M"), i32("K"), i32("d_s", div16=aligned), i32("pos0"),
            i32("t0"), i32("n_new"), i32("cap", div16=True), i32("metric_ip"))


def _sm90(qt, aligned):
    """sm_90 variants. The any-layout kernel: 64 keys per CTA, 8 warps, tf32x3 (as first
    built). The vector-load kernel: bf16 keys 128 per CTA with the bf16 centroid split
    (the fastest measured, NOTES.md "multi-token steps"), plus 256 keys per CTA and the
    tf32x3 form to compare; fp32 / fp16 keys 64 per CTA, tf32x3. Every sm_90 variant is
    built with ``PDL`` (sm_80 has no programmatic dependent launch)."""
    tf32 = {"BLOCK_N": 64, "BLOCK_D": 32, "SPLIT16": 0, "PDL": 1}
    if not (aligned and qt == "bf16"):
        return (Variant.make(tf32, 8, 1, True), )
    split = {"BLOCK_D": 64, "SPLIT16": 1, "PDL": 1}
    return (Variant.make(dict(split, BLOCK_N=128), 8, 1, True), Variant.make(dict(split, BLOCK_N=256), 8, 1),
            Variant.make(tf32, 8, 1))


KERNELS = [
    Kernel(name="pq_cprep", fn=pq_cprep_kernel,
           args=(ptr("cent_ptr", "fp32"), ptr("prep_ptr", "bf16"), ptr("cn_ptr", "fp32"), i32("K"), i32("d_s"),
                 i32("metric_ip"), i32("split")),
           fixed={"BLOCK_C": 64, "BLOCK_D": 32}, variants={80: single({}, 4, 1), 90: single({}, 4, 1)}),
]
for _qt in DTYPES:
    for _al in (False, True):
        KERNELS.append(
            Kernel(name=f"pq_quant{'.a16' if _al else ''}.k_{_qt}", fn=pq_quant_kernel, args=_args(_qt, _al),
                   fixed=FIXED, variants={80: single({"BLOCK_N": 64, "BLOCK_D": 32, "SPLIT16": 0}, 8, 1),
                                          90: _sm90(_qt, _al)},
                   maxnreg=MAXNREG if _al else 0))
