#!/usr/bin/env python3
"""CPU check of the ragged step (``pq_ragged.py``: ``pq_rgq_kernel``, ``pq_rglut_kernel``,
four ``pq_rground_kernel`` rounds, ``pq_rgcnt_kernel``, ``pq_rgemit_kernel``) under Triton's
interpreter (no GPU, no torch).

    TRITON_INTERPRET=1 python3 kernels_triton/interp_ragged.py [--case NAME] [--seed N]

Each case is a batch of rows of different lengths ``S_b <= S_alloc`` (1, a short-path row
beside long ones, ``S_alloc`` itself) with different ``n_cached[b]`` (one new key, several,
none), over GQA heads, M in {1, 2, 4}, bits in {4, 8}, ties (small-integer inputs, few
codes), non-finite inputs and sizes given as ratios. Every row is checked against the spec
at its own length (``interp_check.check``'s rule: sink and window exact, ascending list,
weights its indicator, the heavy set by the 1e-4 rule with float64 scores, exact on small
integers; ties and NaN taken lowest ``j`` first), plus the padding (``-1`` past
``total_b``, zero weights past ``S_b``), the new keys' codes (float64 argmin) and the
device ``n_cached``. Outputs are poisoned before each launch. Each case runs a step, a
decode step with every row one key longer (several for some), a replay of that step
(nothing new to quantize), the same with the grid reversed, and a step with a bad row
(refused on the device: its row lists nothing, ``err`` counts it). The selection kernels
run with small tiles (each case's ``TILE`` / 2 keys a round CTA, / 4 positions an emit
CTA), so long rows span many parts; the rounds must leave their histograms and tickets
zero and every long row resolved after four rounds. Exit status 1 on the first mismatch.
"""

import contextlib
import math
import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from interp_check import Arr, case_args, _rank, head_lut64, nearest, reversed_grid  # noqa: E402
from pq_ragged import (RGLUT_FIXED, RGQ_FIXED, pq_rgcnt_kernel, pq_rgemit_kernel, pq_rglut_kernel,  # noqa: E402
                       pq_rground_kernel, pq_rgq_kernel)

I32_MAX = 2**31 - 1


def resolve(v, S):
    """A size at S: a float is a ratio (floor of the f64 product, at most S), an int a count."""
    if isinstance(v, float):
        return min(int(math.floor(v * S)), S)
    return v


def sizes(cfg, K, S):
    """(short, n, w0, k, sink', window', total) of a row at S (the spec's, per row)."""
    io = cfg["init_offset"]
    heavy = resolve(cfg["heavy"], S)
    short = S <= heavy + io + 1 + K
    n = S - io
    s_sink = min(resolve(cfg["sink"], S), S)
    s_win = min(resolve(cfg["window"], S), S)
    w0 = max(0, S - s_win - io)
    k = min(heavy, n)
    return short, n, w0, k, s_sink, s_win, (S if short else s_sink + k + s_win)


def size_args(v):
    """A size as the kernels take it: (count, ratio), ratio < 0 for a count."""
    return (0, float(v)) if isinstance(v, float) else (v, -1.0)


def row_len(cfg, K, s_alloc):
    """The row length T of sparse_list: the largest total any S <= S_alloc has."""
    return max(sizes(cfg, K, s)[6] for s in range(1, s_alloc + 1))


def make_state(rng, B, H, H_kv, D, M, bits, s_alloc, small, ip):
    K = 1 << bits
    d_s = D // M
    d_c = d_s + int(ip)
    if small:
        q = rng.integers(-3, 4, (B, H, 1, D)).astype(np.float32)
        key = rng.integers(-3, 4, (B, H_kv, s_alloc, D)).astype(np.float32)
        cent = rng.integers(-3, 4, (B, H_kv, M, K, d_c)).astype(np.float32)
    else:
        q = rng.standard_normal((B, H, 1, D)).astype(np.float32)
        key = rng.standard_normal((B, H_kv, s_alloc, D)).astype(np.float32)
        cent = rng.standard_normal((B, H_kv, M, K, d_c)).astype(np.float32)
    cap = (s_alloc + 15) // 16 * 16
    # codes past each row's count are stale: random, and never read
    codes = rng.integers(0, 256, (B, H_kv, M, cap)).astype(np.uint8)
    codes &= np.uint8(K - 1)
    phi = (rng.random(B * H_kv * M) * 2 * d_s).astype(np.float32) if ip else np.zeros(1, np.float32)
    return dict(B=B, H=H, H_kv=H_kv, D=D, M=M, bits=bits, q=Arr(q), key=Arr(key), cent=Arr(cent), phi=Arr(phi),
                codes=Arr(codes), cap=cap, metric_ip=int(ip), small=small, s_alloc=s_alloc,
                lut=Arr(np.zeros(B * H * M * K, np.float32)))


def run(st, lens, nc, cfg, nch, tile, reverse=False):
    """pq_rgq, pq_rglut, 4 x pq_rground (TILE ``tile // 2``), pq_rgcnt and pq_rgemit (TILE
    ``tile // 4``); returns the outputs, stat and err, and updates ``nc`` (an Arr)."""
    B, H, H_kv, D, M, bits = st["B"], st["H"], st["H_kv"], st["D"], st["M"], st["bits"]
    K = 1 << bits
    G = H // H_kv
    rows = B * H
    sa = st["s_alloc"]
    T = row_len(cfg, K, sa)
    sl = Arr(np.full((rows, T), -7, np.int64))
    ln = Arr(np.full(rows, -7, np.int64))
    w = Arr(np.full((rows, sa), 7.0, np.float32))
    stat = Arr(np.full(B, -5, np.int32))
    err = Arr(np.array([0, I32_MAX], np.int32))
    lens_a = Arr(np.asarray(lens, np.int64))
    seen = Arr(np.full(B, -3, np.int64))
    sink_c, sink_r = size_args(cfg["sink"])
    win_c, win_r = size_args(cfg["window"])
    hv_c, hv_r = size_args(cfg["heavy"])
    sizes_a = (sink_c, sink_r, win_c, win_r, hv_c, hv_r)
    io = cfg["init_offset"]
    rtile, etile = tile // 2, tile // 4
    P = max(1, -(-(sa - io) // rtile))
    NP = -(-sa // etile)
    # scratch, poisoned: pq_rglut zeroes the histograms and tickets, round 0 starts every row
    rst = Arr(np.full((rows, 8), -99, np.int64))
    rhist = Arr(np.full((rows, 256), 77, np.int32))
    rtick = Arr(np.full(rows, 55, np.int32))
    pcnt = Arr(np.full((rows, 2, NP), -9, np.int32))
    q, key, cent, codes, lut = st["q"], st["key"], st["cent"], st["codes"], st["lut"]
    ctx = reversed_grid if reverse else contextlib.nullcontext
    with ctx():
        pq_rgq_kernel[(B * H_kv * M, nch)](
            key, cent, st["phi"], codes, lens_a, seen, nc, Arr(np.full(B, -9, np.int64)), stat, err,
            H_kv * sa * D, sa * D, D,
            H_kv, M, K, D // M, st["cap"], sa, io, st["metric_ip"], hv_c, hv_r, nch, **RGQ_FIXED, num_warps=4)
        assert np.all((stat.a == 0) | (stat.a == 1)), f"pq_rgq left stat unwritten: {stat.a}"
        assert np.array_equal(seen.a, lens_a.a), f"pq_rgq: seen {seen.a} != lengths {lens_a.a}"
        pq_rglut_kernel[(rows, M, -(-K // RGLUT_FIXED["BLOCK_C"]))](
            q, cent, lut, lens_a, stat, rhist, rtick, H * D, D,
            H, G, M, K, D // M, sa, io, st["metric_ip"], hv_c, hv_r, **RGLUT_FIXED, num_warps=4)
        assert not rhist.a.any() and not rtick.a.any(), "pq_rglut left a histogram or ticket non-zero"
        for rd in range(4):
            pq_rground_kernel[(rows, P)](
                codes, lut, lens_a, stat, rst, rhist, rtick, H, G, M, K, st["cap"], sa, io, *sizes_a, rd,
                TILE=rtile, num_warps=4)
            assert not rhist.a.any(), f"round {rd} left a histogram non-zero"
            assert not rtick.a.any(), f"round {rd} left a ticket non-zero"
        for b in range(B):
            S = lens[b]
            ok = stat.a[b] == 1
            if ok and not sizes(cfg, K, S)[0]:
                done = rst.a[b * H:(b + 1) * H, 2]
                assert np.all(done == 1), f"row {b} (S_b={S}) not resolved after 4 rounds: {done}"
        pq_rgcnt_kernel[(rows, NP)](
            codes, lut, lens_a, stat, rst, pcnt, H, G, M, K, st["cap"], sa, io, *sizes_a, NP, TILE=etile,
            num_warps=4)
        pq_rgemit_kernel[(rows, NP)](
            codes, lut, lens_a, stat, rst, pcnt, nc, sl, ln, w, H, G, M, K, st["cap"], sa, T, io, *sizes_a, NP,
            TILE=etile, num_warps=4)
    return sl.a, ln.a, w.a, stat.a, err.a


def check(st, lens, nc_old, nc_new, cfg, out, what, bad=()):
    """Every row at its own length against the spec, plus the padding, codes and counts."""
    sl, ln, w, stat, err = out
    B, H, H_kv, D, M = st["B"], st["H"], st["H_kv"], st["D"], st["M"]
    K = 1 << st["bits"]
    G = H // H_kv
    d_s = D // M
    io = cfg["init_offset"]
    sa = st["s_alloc"]
    T = sl.shape[1]
    codes, cent, key = st["codes"].a, st["cent"].a, st["key"].a
    assert err[0] == len(bad) and (not bad or err[1] == min(bad)), f"{what}: err {err}, bad rows {bad}"
    for b in range(B):
        S = lens[b]
        short, n, w0, k, s_sink, s_win, total = sizes(cfg, K, S)
        if b in bad:
            assert stat[b] == 0 and nc_new[b] == nc_old[b], f"{what}: bad row {b}: stat {stat[b]}, n_cached moved"
            for h in range(H):
                r = b * H + h
                assert ln[r] == -1 and np.all(sl[r] == -1) and np.all(w[r] == 0), f"{what}: bad row {b} written"
            continue
        assert stat[b] == 1, f"{what}: row {b}: stat {stat[b]}"
        want_nc = nc_old[b] if short else n
        assert nc_new[b] == want_nc, f"{what}: row {b}: n_cached {nc_new[b]}, want {want_nc}"
        if not short:
            for g in range(H_kv):
                for m in range(M):
                    phi = st["phi"].a[(b * H_kv + g) * M + m] if st["metric_ip"] else 0.0
                    for t in range(nc_old[b], n):
                        want = nearest(key[b, g, io + t, m * d_s:(m + 1) * d_s], cent[b, g, m], phi, st["metric_ip"])
                        got = int(codes[b, g, m, t])
                        assert got == want, f"{what}: row {b}: code g={g} m={m} j={t}: {got}, want {want}"
        for h in range(H):
            r = b * H + h
            g = h // G
            tag = f"{what}: row b={b} h={h} (S_b={S})"
            assert ln[r] == total, f"{tag}: sparse_len {ln[r]}, want {total}"
            assert np.all(sl[r, total:] == -1), f"{tag}: tail past total_b not -1: {sl[r, total:total + 8]}"
            assert np.all(w[r, S:] == 0), f"{tag}: weights past S_b not 0"
            row = sl[r, :total]
            wr = w[r, :S]
            assert np.all((row >= 0) & (row < S)), f"{tag}: position outside 0..S_b: {row[:20]}"
            assert np.all(np.diff(row) >= 0), f"{tag}: sparse_list not ascending: {row[:40]}"
            ind = np.zeros(S, np.float32)
            ind[row] = 1.0
            assert np.array_equal(ind, wr), f"{tag}: weight_list is not sparse_list's indicator"
            if short:
                assert np.array_equal(row, np.arange(S)), f"{tag}: short row is not 0..S_b"
                continue
            cnt = np.bincount(row, minlength=S)
            expect = np.zeros(S, np.int64)
            expect[:s_sink] += 1
            expect[S - s_win:] += 1
            heavy = cnt - expect
            assert np.all(heavy >= 0), f"{tag}: a sink or window position is missing"
            hp = np.nonzero(heavy)[0]
            assert heavy.sum() == k and np.all(heavy <= 1), f"{tag}: {heavy.sum()} heavy picks, want {k}"
            j = hp - io
            assert np.all(j >= 0) and np.all(j < n), f"{tag}: heavy position outside the quantized keys"
            if w0 < k:
                assert set(j.tolist()) == set(range(k)), f"{tag}: fill rule violated"
                continue
            assert np.all(j < w0), f"{tag}: a heavy pick is not a candidate"
            lut = head_lut64(st, b, h)
            with np.errstate(invalid="ignore"):
                sc = sum(lut[m][codes[b, g, m, :w0].astype(np.int64)] for m in range(M))
            chosen = np.zeros(w0, bool)
            chosen[j] = True
            if not chosen.any() or not (~chosen).any():
                continue
            cmin = min(sc[chosen].tolist(), key=_rank)
            umax = max(sc[~chosen].tolist(), key=_rank)
            if cmin != cmin:
                nan_j = np.flatnonzero(np.isnan(sc))
                assert umax != umax and nan_j[chosen[nan_j]].max() < nan_j[~chosen[nan_j]].min(), \
                    f"{tag}: a NaN score chosen over {umax} or over a lower NaN j"
                continue
            if st["small"]:
                # exact: the k best, ties lowest j first
                order = sorted(range(w0), key=lambda x: (-sc[x], x))
                assert set(j.tolist()) == set(order[:k]), f"{tag}: heavy set differs from the exact top-k"
                continue
            tol = 0.0 if not np.isfinite(umax) else 1e-4 * (1 + abs(umax))
            assert umax != umax or cmin >= umax - tol, f"{tag}: chosen min {cmin} < unchosen max {umax}"


def poison_nonfinite(st, lens, nc, io):
    """NaN in one head's query, +-inf and NaN centroid coordinates (and cached keys
    carrying those codes), and new keys with an infinite and a NaN coordinate."""
    q, cent, key, codes = st["q"].a, st["cent"].a, st["key"].a, st["codes"].a
    q[0, 0, 0, 0] = np.nan
    cent[:, :, 0, 3, 0] = np.inf
    cent[:, :, 0, 5, 1] = -np.inf
    cent[:, :, -1, 2, 0] = np.nan
    for b in range(st["B"]):
        lo = nc[b]
        codes[b, :, 0, 10:lo:7] = 3
        codes[b, :, 0, 12:lo:11] = 5
        codes[b, :, -1, 16:lo:5] = 2
        if io + lo + 1 < st["s_alloc"]:
            key[b, :, io + lo, 1] = np.inf
            key[b, :, io + lo + 1, 0] = np.nan


CASES = [
    # name, (B, H, H_kv, D, M, bits), S_alloc, lens, new keys per row, cfg, small, ip, NCH, TILE
    # lengths 1, short, K-ish, long ones, S_alloc; one, several and no new keys; GQA
    ("mixed_m2_b4", (6, 4, 2, 32, 2, 4), 700, [1, 40, 60, 300, 555, 700], [0, 0, 1, 5, 1, 1],
     dict(sink=8, window=16, heavy=24, init_offset=8), False, False, 2, 256),
    ("ties_m1_b4", (3, 4, 4, 16, 1, 4), 900, [900, 400, 33], [1, 3, 0],
     dict(sink=4, window=8, heavy=50, init_offset=4), True, False, 1, 128),
    ("m4_b8_ip_gqa", (2, 4, 1, 32, 4, 8), 1100, [1100, 700], [2, 1],
     dict(sink=8, window=24, heavy=40, init_offset=8), False, True, 3, 256),
    ("m2_b8_small", (3, 2, 2, 32, 2, 8), 1000, [1000, 800, 290], [1, 4, 1],
     dict(sink=16, window=16, heavy=100, init_offset=16), True, False, 2, 256),
    # init_offset < sink (duplicates in the list), few candidates (the fill rule)
    ("io_lt_sink_fill", (3, 2, 2, 32, 2, 4), 500, [500, 120, 90], [1, 2, 1],
     dict(sink=40, window=60, heavy=30, init_offset=8), False, False, 2, 128),
    # a window over the whole row: no candidates (w0 = 0), every heavy pick by the fill rule
    ("window_all", (2, 2, 2, 16, 2, 4), 300, [300, 200], [1, 1],
     dict(sink=4, window=1.0, heavy=20, init_offset=4), False, False, 1, 128),
    # sizes as ratios of each row's S_b
    ("ratios", (3, 4, 2, 32, 2, 4), 1200, [1200, 640, 21], [1, 2, 0],
     dict(sink=0.01, window=0.02, heavy=0.1, init_offset=8), False, False, 2, 256),
    # NaN and infinities in the query, centroids and new keys
    ("nonfinite", (2, 4, 2, 32, 2, 4), 800, [800, 500], [2, 2],
     dict(sink=8, window=16, heavy=40, init_offset=8), False, False, 2, 256),
    # two codes per subvector: hundreds of keys per score, ties at the threshold
    ("dense_ties", (2, 2, 2, 16, 2, 4), 900, [900, 650], [1, 1],
     dict(sink=4, window=8, heavy=200, init_offset=4), True, False, 1, 256),
]


#: what CI runs (``--quick``, CI's time budget): the configs this path serves (K^M >
#: 4096, ip, GQA), short rows beside long ones, the sink past the first key with the fill
#: rule, non-finite inputs; the full list runs without ``--quick``
QUICK = ("m4_b8_ip_gqa", "mixed_m2_b4", "io_lt_sink_fill", "nonfinite")


def main():
    rng, cases = case_args("interp_ragged", __doc__, CASES, quick=QUICK)
    for name, (B, H, H_kv, D, M, bits), sa, lens0, new, cfg, small, ip, nch, tile in cases:
        K = 1 << bits
        io = cfg["init_offset"]
        st = make_state(rng, B, H, H_kv, D, M, bits, sa, small, ip)
        # first step: row b at lens0[b] - 1 with new[b] + 1 keys to quantize; then +1
        l1 = [max(1, s - 1) for s in lens0]
        nc0 = [max(0, min(s - io, s - io - nw - 1)) if s > io else 0 for s, nw in zip(l1, new)]
        nc0 = [max(0, v) for v in nc0]
        if name == "dense_ties":
            st["codes"].a[...] %= 2
        if name == "nonfinite":
            poison_nonfinite(st, l1, nc0, io)
        nc = Arr(np.asarray(nc0, np.int64))
        plan = [(l1, False, ()), (lens0, False, ()), (lens0, False, ()), (lens0, True, ())]
        for i, (lens, rev, bad) in enumerate(plan):
            before = nc.a.copy()
            out = run(st, lens, nc, cfg, nch, tile, rev)
            tag = f"{name} step {i} lens={lens}" + (", CTAs in reverse order" if rev else "")
            check(st, lens, before.tolist(), nc.a.tolist(), cfg, out, tag, bad)
        # a bad row: longer than S_alloc, and one whose cached codes exceed its keys
        bad_lens = list(lens0)
        bad_lens[-1] = sa + 1
        if B > 1:
            nc.a[0] = max(0, lens0[0] - io) + 3
        bad = (0, B - 1) if B > 1 else (B - 1, )
        before = nc.a.copy()
        out = run(st, bad_lens, nc, cfg, nch, tile)
        check(st, bad_lens, before.tolist(), nc.a.tolist(), cfg, out, f"{name} bad rows", bad)
        shorts = sum(sizes(cfg, K, s)[0] for s in lens0)
        print(f"  {name}: {len(plan) + 1} steps ok (B={B}, {shorts} short rows, S_alloc={sa}, T={out[0].shape[1]})")
    print("interp_ragged: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
