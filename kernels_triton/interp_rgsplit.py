#!/usr/bin/env python3
"""CPU check of the ragged step on the histogram paths under Triton's interpreter (no GPU,
no torch): ``pq_rgq`` from ``pq_ragged.py``, then the split path (``pq_rgthresh_kernel``
and ``pq_rgsemit_kernel`` from ``pq_rgsplit.py``) and, for the cases with ``M <= 2``, the
indexed path (``pq_rgwfill_kernel`` and ``pq_rgindex_kernel`` from ``pq_rgindex.py``).

    TRITON_INTERPRET=1 python3 kernels_triton/interp_rgsplit.py [--case NAME] [--seed N]

Each case is a batch of rows of different lengths ``S_b <= S_alloc`` (1, ``K``, short rows
beside long ones, the short threshold and one past it, ``S_alloc``) with their own
``n_cached[b]``, run as a decode loop on one persistent state (codes, the per-row
combination histograms ``hist`` / ``histn``, the weights' extents ``wext``, the rows'
counts): a step with one or several new keys per row (some of them candidates: a
catch-up), a decode step, a replay, a step where some rows' counts are lowered and their
keys replaced (``set_row_n_cached``: the histogram must be reset) while other rows'
lengths shrink (the histogram moved down) or grow by many keys, and a step with refused
rows. Every step runs twice from the same state: with the CTAs in launch order and with
every launch's grid reversed (``reversed_grid``); both must pass and agree bit for bit.

Checked per step: every row against the spec at its own length (``interp_ragged.check``:
sink and window exact, ascending list, weights its indicator, the heavy set by the 1e-4
rule in float64, exact on small integers, ties and NaN lowest ``j`` first; the padding;
the new keys' codes; the device ``n_cached``), each long row's histogram equal to a
recount of its codes ``j < w0``, ``wext[r] = S_b``, the emit's flags published and every
ticket taken; on the indexed path the weights ``pq_rgwfill`` writes (checked before
``pq_rgindex`` runs: the interpreter runs it with PDL off, so each row CTA also writes
its own row's weights, as on sm_80), the bucket marks left zero and the histogram as
above (the buckets are what the gathers read). ``sparse_list`` and ``sparse_len`` are poisoned before each step,
``weight_list`` up to each row's ``wext`` (beyond it the kernels may rely on zeros; the
first step starts from ``wext = S_alloc`` and everything poisoned). Emit parts are
``TILE`` keys (128 or 256), so long rows span many parts. Exit status 1 on the first
mismatch.
"""

import contextlib
import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from interp_check import Arr, case_args, reversed_grid  # noqa: E402
from interp_ragged import I32_MAX, check, make_state, poison_nonfinite, row_len, size_args, sizes  # noqa: E402
from pq_hist import FIXED  # noqa: E402
from pq_ragged import RGQ_FIXED, pq_rgq_kernel  # noqa: E402
from pq_rgsplit import RGSEMIT_FIXED, RGTHRESH_FIXED, pq_rgsemit_kernel, pq_rgthresh_kernel  # noqa: E402
from pq_rgindex import RGWFILL_CH, pq_rgindex_kernel, pq_rgwfill_kernel  # noqa: E402
from pq_index import INDEX_FIXED  # noqa: E402

#: the state a step changes (restored between the two CTA orders of one step)
PERSISTENT = ("codes", "hist", "histn", "lut", "wext", "nc", "w", "bkt", "mark")


def add_split_state(st, io):
    """The split path's persistent buffers: histograms (empty, as after an import), level
    bins, the weights' extents (unknown: S_alloc) and the weights themselves."""
    rows = st["B"] * st["H"]
    sa = st["s_alloc"]
    st["hist"] = Arr(np.zeros((rows, FIXED["NC"]), np.int32))
    st["histn"] = Arr(np.zeros(rows, np.int32))
    st["wext"] = Arr(np.full(rows, sa, np.int64))
    st["w"] = Arr(np.full((rows, sa), 7.0, np.float32))
    # the indexed path's buckets, sized as the indexer sizes them (2 x a uniform share +
    # 16 per combination: rows whose taken combinations hold more fall back to a pass)
    st["capc"] = 2 * -(-st["cap"] // FIXED["NC"]) + 16
    st["bkt"] = Arr(np.full((rows, FIXED["NC"], st["capc"]), -1, np.int32))
    st["mark"] = Arr(np.zeros((rows, INDEX_FIXED["TP"]), np.int32))


def expected_fill(lens, stat, cfg, K, H, wext, sa):
    """The weights ``pq_rgwfill`` writes: each row's sink / window ones (every position of a
    short row) below ``S_b``, zeros from there to the old ``wext``; ``None`` past both."""
    out = []
    for r, we in enumerate(wext):
        b = r // H
        ok = stat[b] == 1
        S = lens[b] if ok else 0
        row = np.full(sa, np.nan, np.float32)
        row[:max(S, we)] = 0.0
        if ok:
            short, n, w0, k, s_sink, s_win = sizes(cfg, K, S)[:6]
            if short:
                row[:S] = 1.0
            else:
                row[:s_sink] = 1.0
                row[S - s_win:S] = 1.0
        out.append(row)
    return np.array(out)


def run(st, lens, cfg, nch, tile, reverse=False, index=False):
    """pq_rgq, then pq_rgthresh and pq_rgsemit (TILE ``tile``), or with ``index``
    pq_rgwfill and pq_rgindex, on ``st`` at ``lens``; returns (sparse_list, sparse_len,
    weight_list, stat, err) and checks each path's bookkeeping."""
    B, H, H_kv, D, M, bits = st["B"], st["H"], st["H_kv"], st["D"], st["M"], st["bits"]
    K = 1 << bits
    G = H // H_kv
    rows = B * H
    sa = st["s_alloc"]
    io = cfg["init_offset"]
    T = row_len(cfg, K, sa)
    NP = max(1, -(-(sa - io) // tile))
    sl = Arr(np.full((rows, T), -7, np.int64))
    ln = Arr(np.full(rows, -7, np.int64))
    w = st["w"]
    for r in range(rows):  # poison what the kernels must rewrite; zeros past wext stay
        w.a[r, :st["wext"].a[r]] = 7.0
    stat = Arr(np.full(B, -5, np.int32))
    err = Arr(np.array([0, I32_MAX], np.int32))
    lens_a = Arr(np.asarray(lens, np.int64))
    seen = Arr(np.full(B, -3, np.int64))
    sizes_a = (*size_args(cfg["sink"]), *size_args(cfg["window"]), *size_args(cfg["heavy"]))
    hv_c, hv_r = size_args(cfg["heavy"])
    bnd = Arr(np.full((rows, 2), np.nan, np.float32))
    need = Arr(np.full(rows, -7, np.int32))
    flag = Arr(np.full((rows, NP), -1, np.int64))  # poisoned: pq_rgthresh zeroes them
    ctr = Arr(np.full(1, 12345, np.int32))
    wz = Arr(np.full((rows, 2), -9, np.int64))
    # the combinations' classes, poisoned: a class pq_rgthresh did not write reads as sure
    cls = Arr(np.full((rows, RGTHRESH_FIXED["NC"]), 255, np.uint8))
    nc = st["nc"]
    nc0 = Arr(np.full(B, -9, np.int64))
    ctx = reversed_grid if reverse else contextlib.nullcontext
    with ctx():
        pq_rgq_kernel[(B * H_kv * M, nch)](
            st["key"], st["cent"], st["phi"], st["codes"], lens_a, seen, nc, nc0, stat, err,
            H_kv * sa * D, sa * D, D,
            H_kv, M, K, D // M, st["cap"], sa, io, st["metric_ip"], hv_c, hv_r, nch, **RGQ_FIXED, num_warps=4)
    assert np.array_equal(nc0.a, nc.a), "pq_rgq did not copy the rows' counts"
    if index:
        return run_index(st, lens, cfg, tile, sizes_a, lens_a, stat, err, nc0, sl, ln, T, reverse)
    with ctx():
        mp = 2 if M <= 2 else 4
        pq_rgthresh_kernel[(rows, )](
            st["q"], st["cent"], st["codes"], st["hist"], st["histn"], st["lut"], bnd, need, flag, ctr,
            cls, lens_a, stat, nc, st["wext"], wz, H * D, D,
            H, G, M, K, bits, D // M, st["cap"], sa, io, st["metric_ip"], *sizes_a, NP,
            MP=mp, **RGTHRESH_FIXED, num_warps=4)
        assert not flag.a.any() and ctr.a[0] == 0, "pq_rgthresh left the emit's flags or counter non-zero"
        pq_rgsemit_kernel[(rows * NP, )](
            st["codes"], cls, need, flag, ctr, lens_a, stat, nc, wz, sl, ln, w,
            H, G, M, K, st["cap"], sa, T, io, *sizes_a, NP, MP=mp, TILE=tile, **RGSEMIT_FIXED, num_warps=4)
    assert ctr.a[0] == rows * NP, f"emit tickets {ctr.a[0]} != {rows * NP} CTAs"
    for b in range(B):
        ok = stat.a[b] == 1
        S = lens[b] if ok else 0
        short, n = sizes(cfg, K, S)[:2] if ok else (True, 0)
        parts = -(-n // tile) if ok and not short else 0
        for h in range(H):
            r = b * H + h
            assert np.all(flag.a[r, :parts] >= (1 << 62)), f"row b={b} h={h}: an emit part did not publish"
            assert np.all(flag.a[r, parts:] == 0), f"row b={b} h={h}: a part past the row's published"
            assert st["wext"].a[r] == S, f"row b={b} h={h}: wext {st['wext'].a[r]}, want {S}"
    return sl.a.copy(), ln.a.copy(), w.a.copy(), stat.a.copy(), err.a.copy()


def run_index(st, lens, cfg, tile, sizes_a, lens_a, stat, err, nc0, sl, ln, T, reverse):
    """The indexed path after pq_rgq: pq_rgwfill (its weights checked), pq_rgindex (PDL
    off); the outputs as ``run``'s."""
    B, H, H_kv, D, M, bits = st["B"], st["H"], st["H_kv"], st["D"], st["M"], st["bits"]
    K = 1 << bits
    rows = B * H
    sa = st["s_alloc"]
    io = cfg["init_offset"]
    w = st["w"]
    wext_old = st["wext"].a.copy()
    ctx = reversed_grid if reverse else contextlib.nullcontext
    with ctx():
        pq_rgwfill_kernel[(rows, max(1, -(-sa // RGWFILL_CH)))](
            w, lens_a, stat, st["wext"], H, K, sa, io, *sizes_a, CH=RGWFILL_CH, FT=INDEX_FIXED["FT"], TRIGGER=0,
            num_warps=4)
    want = expected_fill(lens, stat.a, cfg, K, H, wext_old, sa)
    got = np.where(np.isnan(want), np.nan, w.a)
    assert np.array_equal(np.isnan(want), np.isnan(got)) and np.array_equal(want[~np.isnan(want)],
                                                                           got[~np.isnan(want)]), \
        "pq_rgwfill's weights differ from the sink / window / short-row fill"
    assert np.array_equal(st["wext"].a, wext_old), "pq_rgwfill changed wext (pq_rgindex's to set)"
    with ctx():
        pq_rgindex_kernel[(rows, )](
            st["q"], st["cent"], st["codes"], st["hist"], st["histn"], st["lut"], st["bkt"], st["mark"],
            lens_a, stat, st["nc"], nc0, st["wext"], sl, ln, w, H * D, D,
            H, H // H_kv, M, K, bits, D // M, st["cap"], st["capc"], sa, T, io, st["metric_ip"], *sizes_a,
            MP=2, TILE=tile, PDL=0, **INDEX_FIXED, num_warps=4)
    assert not st["mark"].a.any(), "pq_rgindex left its start marks non-zero"
    for b in range(B):
        S = lens[b] if stat.a[b] == 1 else 0
        for h in range(H):
            r = b * H + h
            assert st["wext"].a[r] == S, f"row b={b} h={h}: wext {st['wext'].a[r]}, want {S}"
    return sl.a.copy(), ln.a.copy(), w.a.copy(), stat.a.copy(), err.a.copy()


def check_hist(st, lens, cfg, stat, what):
    """Each long row's histogram equals a recount of its codes ``j < w0`` (histn = w0)."""
    B, H, H_kv, M, bits = st["B"], st["H"], st["H_kv"], st["M"], st["bits"]
    K = 1 << bits
    G = H // H_kv
    for b in range(B):
        short, _, w0 = sizes(cfg, K, lens[b])[:3]
        if stat[b] != 1 or short:
            continue
        for h in range(H):
            r = b * H + h
            g = h // G
            assert st["histn"].a[r] == w0, f"{what}: row b={b} h={h}: histn {st['histn'].a[r]} != w0 {w0}"
            cd = st["codes"].a[b, g, :, :w0].astype(np.int64)
            combo = sum(cd[m] << ((M - 1 - m) * bits) for m in range(M))
            want = np.bincount(combo, minlength=FIXED["NC"])
            assert np.array_equal(st["hist"].a[r], want), f"{what}: row b={b} h={h}: histogram != recount"


def step_both_orders(st, lens, cfg, nch, tile, what, bad=(), index=False):
    """One step with the CTAs in order, then (from the same state) every launch's grid
    reversed; both checked, and their outputs and state equal (``index``: the indexed
    path)."""
    snap = {k: st[k].a.copy() for k in PERSISTENT}
    results = []
    for rev in (False, True):
        for k in PERSISTENT:
            st[k].a[...] = snap[k]
        before = st["nc"].a.copy()
        out = run(st, lens, cfg, nch, tile, rev, index)
        tag = what + (", CTAs in reverse order" if rev else "")
        check(st, lens, before.tolist(), st["nc"].a.tolist(), cfg, out, tag, bad)
        check_hist(st, lens, cfg, out[3], tag)
        results.append((out, {k: st[k].a.copy() for k in PERSISTENT}))
    (o1, s1), (o2, s2) = results
    for i, name in enumerate(("sparse_list", "sparse_len", "weight_list")):
        assert np.array_equal(o1[i], o2[i]), f"{what}: {name} differs between the two CTA orders"
    for k in PERSISTENT:
        if k not in ("lut", "bkt"):  # scratch; bucket slots past a row's count may differ
            assert np.array_equal(s1[k], s2[k]), f"{what}: state {k} differs between the two CTA orders"


def replace_rows(st, rng, rows, nc_new, io):
    """Rows ``rows`` start over (an engine replacing the sequence, or rewinding it):
    their count lowered to ``nc_new[b]`` and their keys from there on new."""
    key = st["key"].a
    for b in rows:
        st["nc"].a[b] = nc_new[b]
        tail = key[b, :, io + nc_new[b]:]
        if st["small"]:
            tail[...] = rng.integers(-3, 4, tail.shape).astype(np.float32)
        else:
            tail[...] = rng.standard_normal(tail.shape).astype(np.float32)


CASES = [
    # name, (B, H, H_kv, D, M, bits), S_alloc, lens, new keys per row, cfg, small, ip, NCH, TILE
    # short rows beside long ones: 1, K (16), the short threshold (24 + 8 + 1 + 16 = 49)
    # and one past it, S_alloc; one, several and no new keys; GQA (G = 2)
    ("mixed_m2_b4", (6, 2, 1, 32, 2, 4), 600, [1, 16, 49, 50, 455, 600], [0, 0, 0, 5, 1, 1],
     dict(sink=8, window=16, heavy=24, init_offset=8), False, False, 2, 128),
    # ties: small integers, exact top-k, lowest j first; rows over several emit parts
    ("ties_m1_b4", (2, 2, 2, 16, 1, 4), 700, [700, 300], [1, 3],
     dict(sink=4, window=8, heavy=50, init_offset=4), True, False, 1, 128),
    # M = 4 (MP 4), metric ip, every query head of one KV head (G = 4)
    ("m4_b2_ip_gqa", (2, 4, 1, 32, 4, 2), 600, [600, 400], [2, 1],
     dict(sink=8, window=24, heavy=40, init_offset=8), False, True, 3, 256),
    ("m2_b6_small", (2, 2, 2, 32, 2, 6), 800, [800, 290], [1, 4],
     dict(sink=16, window=16, heavy=100, init_offset=16), True, False, 2, 256),
    # init_offset < sink (duplicates in the list; the sink reaches past the first key),
    # few candidates (the fill rule)
    ("io_lt_sink_fill", (3, 2, 2, 32, 2, 4), 400, [400, 120, 90], [1, 2, 1],
     dict(sink=40, window=60, heavy=30, init_offset=8), False, False, 2, 128),
    # a window over the whole row: no candidates (w0 = 0), every heavy pick by the fill rule
    ("window_all", (2, 2, 2, 16, 2, 4), 300, [300, 200], [1, 1],
     dict(sink=4, window=1.0, heavy=20, init_offset=4), False, False, 1, 128),
    # sizes as ratios of each row's S_b
    ("ratios", (3, 2, 2, 32, 2, 4), 800, [800, 640, 21], [1, 2, 0],
     dict(sink=0.01, window=0.02, heavy=0.1, init_offset=8), False, False, 2, 128),
    # NaN and infinities in the query, centroids and new keys
    ("nonfinite", (2, 2, 1, 32, 2, 4), 500, [500, 300], [2, 2],
     dict(sink=8, window=16, heavy=40, init_offset=8), False, False, 2, 128),
    # two codes per subvector: hundreds of keys per score, ties at the threshold
    ("dense_ties", (2, 2, 2, 16, 2, 4), 700, [700, 500], [1, 1],
     dict(sink=4, window=8, heavy=200, init_offset=4), True, False, 1, 256),
]


#: what CI runs (``--quick``, CI's time budget): short rows beside long ones over several
#: parts, the sink past the first key with the fill rule, non-finite inputs (ratios per
#: row: tests/ragged_gpu.rs on the GPU); the full list runs without ``--quick``
QUICK = ("mixed_m2_b4", "io_lt_sink_fill", "nonfinite")


def run_case(rng, name, B, H, H_kv, D, M, bits, sa, lens0, new, cfg, small, ip, nch, tile, index):
    """One case's decode loop on one path (``index``: the indexed path)."""
    K = 1 << bits
    io = cfg["init_offset"]
    st = make_state(rng, B, H, H_kv, D, M, bits, sa, small, ip)
    add_split_state(st, io)
    # first step: row b at lens0[b] - 1 with new[b] + 1 keys to quantize (a catch-up on
    # the first row: half its keys new, many of them candidates)
    l1 = [max(1, s - 1) for s in lens0]
    nc0 = [max(0, min(s - io, s - io - nw - 1)) for s, nw in zip(l1, new)]
    nc0[0] = max(0, (l1[0] - io) // 2)
    if name == "dense_ties":
        st["codes"].a[...] %= 2
    if name == "nonfinite":
        poison_nonfinite(st, l1, nc0, io)
    st["nc"] = Arr(np.asarray(nc0, np.int64))
    path = "index" if index else "split"
    steps = 0
    for i, lens in enumerate((l1, lens0, lens0)):  # catch-up, decode step, replay
        step_both_orders(st, lens, cfg, nch, tile, f"{name} ({path}) step {i} lens={lens}", index=index)
        steps += 1
    # row 0 replaced (count lowered to a third, new keys from there, a shorter length),
    # the last row rewound by a few keys; the others shrink (histograms moved down: their
    # counts stay at or below the new lengths' keys) or grow
    nc_now = st["nc"].a.tolist()
    l3 = list(lens0)
    l3[0] = max(1, (lens0[0] * 2) // 3)
    cut = {0: max(0, min(nc_now[0], l3[0] - io) // 3)}
    if B > 1:
        cut[B - 1] = max(0, nc_now[B - 1] - 5)
    for b in range(1, B - 1):
        l3[b] = max(1, lens0[b] - (3 if b % 2 else -0))
        if max(0, l3[b] - io) < nc_now[b]:
            l3[b] = lens0[b]  # a long row's count bounds how far it may shrink
    replace_rows(st, rng, cut, {**{b: nc_now[b] for b in range(B)}, **cut}, io)
    step_both_orders(st, l3, cfg, nch, tile, f"{name} ({path}) step 3 (rows {sorted(cut)} replaced) lens={l3}",
                     index=index)
    # then every row one or more keys longer (several new keys in some rows)
    l4 = [min(sa, s + 1 + 3 * (b % 2)) for b, s in enumerate(l3)]
    step_both_orders(st, l4, cfg, nch, tile, f"{name} ({path}) step 4 lens={l4}", index=index)
    steps += 2
    # bad rows: one longer than S_alloc, one whose cached codes exceed its keys
    bad_lens = list(l4)
    bad_lens[-1] = sa + 1
    if B > 1:
        st["nc"].a[0] = max(0, l4[0] - io) + 3
    bad = (0, B - 1) if B > 1 else (B - 1, )
    step_both_orders(st, bad_lens, cfg, nch, tile, f"{name} ({path}) bad rows", bad, index=index)
    steps += 1
    T = row_len(cfg, K, sa)
    shorts = sum(sizes(cfg, K, s)[0] for s in lens0)
    print(f"  {name} ({path} path): {steps} steps ok in both CTA orders (B={B}, {shorts} short rows, "
          f"S_alloc={sa}, T={T}, TILE={tile})")


def main():
    rng, cases = case_args("interp_rgsplit", __doc__, CASES, quick=QUICK)
    for name, (B, H, H_kv, D, M, bits), sa, lens0, new, cfg, small, ip, nch, tile in cases:
        assert (1 << bits)**M <= FIXED["NC"] and M <= 4, name  # the combination histogram's configs
        seed = int(rng.integers(1 << 62))
        # the indexed path where pq_index applies (M <= 2), from the same inputs
        for index in ((False, True) if M <= 2 else (False, )):
            run_case(np.random.default_rng(seed), name, B, H, H_kv, D, M, bits, sa, lens0, new, cfg, small, ip,
                     nch, tile, index)
    print("interp_rgsplit: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
