#!/usr/bin/env python3
"""CPU check of the histogram kernels under Triton's interpreter (no GPU, no torch):
``pq_hist_kernel``, the split pair (``pq_thresh_kernel`` + ``pq_emit_kernel``) and the
indexed path (``pq_wfill_kernel`` + ``pq_index_kernel``, PDL off, or ``pq_index_kernel``
alone with companion fill), in turn on one state.

    TRITON_INTERPRET=1 python3 kernels_triton/interp_check.py [--quick]

Runs the kernels on small random shapes with numpy arrays (through a minimal stand-in
for the torch tensor API the interpreter calls), then checks every row against the spec
(spec/pqcache-indexer.md, "What counts as the same answer"): sink and window exact,
``sparse_list`` ascending with the right length, ``weight_list`` its indicator, the new
keys' codes equal to a float64 argmin, and the heavy set by the 1e-4 rule (exact on
small-integer inputs) with scores recomputed in float64 from the codes. Decode loops check
the persistent combination histogram: several steps in a row, a replay of the same step,
and a reset (``histn = 0``, as after a code import). Outputs are poisoned before each
launch. Exit status 1 on the first mismatch, with what differed.
"""

import argparse
import contextlib
import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from pq_hist import FIXED, pq_hist_kernel  # noqa: E402
from pq_index import INDEX_FIXED, pq_index_kernel, pq_wfill_kernel  # noqa: E402
from pq_split import EMIT_FIXED, THRESH_FIXED, pq_emit_kernel, pq_thresh_kernel  # noqa: E402
from triton.runtime import interpreter  # noqa: E402

#: what each ``run_index`` mode is called in the messages
INDEX_MODES = ("", ", companion fill", ", companion fill, CTAs in reverse order")


class _Dtype:
    """What the interpreter reads off a tensor's dtype: its torch spelling."""

    def __init__(self, name):
        self.name = name

    def __str__(self):
        return "torch." + self.name


_DTYPES = {}  # one object per name: Triton caches type lookups by the dtype object


def _dtype(name):
    return _DTYPES.setdefault(name, _Dtype(name))


_NAMES = {np.float32: "float32", np.float64: "float64", np.int32: "int32", np.int64: "int64", np.uint8: "uint8",
          np.int8: "int8", np.uint16: "bfloat16", np.float16: "float16", np.uint32: "uint32"}


class Arr:
    """A numpy array dressed as the torch tensor the interpreter expects (host memory:
    the interpreter reads and writes it in place)."""

    def __init__(self, a, name=None):
        self.a = np.ascontiguousarray(a)
        self.dtype = _dtype(name or _NAMES[self.a.dtype.type])

    def data_ptr(self):
        return self.a.ctypes.data

    def untyped_storage(self):
        return self

    def cpu(self):
        return self

    def new_empty(self, *args, **kwargs):
        return self

    def set_(self, *args):
        return self

    def storage_offset(self):
        return 0

    def size(self):
        return self.a.shape

    def stride(self):
        return tuple(s // self.a.itemsize for s in self.a.strides)

    def copy_(self, other):
        return self


def poisoned_outputs(rows, S, cfg):
    """sparse_list, sparse_len, weight_list of one step at S, filled with poison."""
    n = S - cfg["init_offset"]
    total = min(cfg["sink"], S) + min(cfg["heavy"], n) + min(cfg["window"], S)
    return (Arr(np.full((rows, total), -7, np.int64)), Arr(np.full(rows, -7, np.int64)),
            Arr(np.full((rows, S), 7.0, np.float32)))


def run_step(st, S, n_old, cfg, tile, mp=2):
    """One launch of pq_hist_kernel for the state ``st`` at sequence length S; returns
    (sparse_list, sparse_len, weight_list)."""
    B, H, H_kv, D, M, bits = st["B"], st["H"], st["H_kv"], st["D"], st["M"], st["bits"]
    K = 1 << bits
    rows = B * H
    sl, ln, w = poisoned_outputs(rows, S, cfg)
    q, key, cent = st["q"], st["key"], st["cent"]
    Sk = key.a.shape[2]
    pq_hist_kernel[(rows, 2)](
        q, key, cent, st["phi"], st["codes"], st["hist"], st["histn"], st["lut"], sl, ln, w,
        H * D, D, H_kv * Sk * D, Sk * D, D,
        H, H // H_kv, M, K, bits, D // M, S, n_old, st["cap"], cfg["sink"], cfg["window"], cfg["heavy"],
        cfg["init_offset"], st["metric_ip"],
        MP=mp, NC=FIXED["NC"], NB=FIXED["NB"], LEVELS=FIXED["LEVELS"], TILE=tile, DT=FIXED["DT"],
        BLOCK_C=FIXED["BLOCK_C"], BLOCK_DS=FIXED["BLOCK_DS"], num_warps=4)
    return sl.a, ln.a, w.a


def run_split(st, S, n_old, cfg, tile, mp=2):
    """pq_thresh_kernel then pq_emit_kernel (TILE = ``tile``) for the state ``st`` at S;
    returns (sparse_list, sparse_len, weight_list) and checks the emit's flags."""
    B, H, H_kv, D, M, bits = st["B"], st["H"], st["H_kv"], st["D"], st["M"], st["bits"]
    K = 1 << bits
    rows = B * H
    NP = -(-(S - cfg["init_offset"]) // tile)
    sl, ln, w = poisoned_outputs(rows, S, cfg)
    bnd = Arr(np.full((rows, 2), np.nan, np.float32))
    need = Arr(np.full(rows, -7, np.int32))
    flag = Arr(np.full((rows, NP), -1, np.int64))  # poisoned: pq_thresh zeroes them
    ctr = Arr(np.full(1, 12345, np.int32))
    # the combinations' classes, poisoned: a class pq_thresh did not write reads as sure
    cls = Arr(np.full((rows, THRESH_FIXED["NC"]), 255, np.uint8))
    q, key, cent = st["q"], st["key"], st["cent"]
    Sk = key.a.shape[2]
    pq_thresh_kernel[(rows, 2)](
        q, key, cent, st["phi"], st["codes"], st["hist"], st["histn"], st["lut"], bnd, need, flag, ctr, cls,
        H * D, D, H_kv * Sk * D, Sk * D, D,
        H, H // H_kv, M, K, bits, D // M, S, n_old, st["cap"], cfg["heavy"], cfg["init_offset"], cfg["window"],
        st["metric_ip"], NP, MP=mp, **THRESH_FIXED, num_warps=4)
    assert not flag.a.any() and ctr.a[0] == 0, "pq_thresh left the emit's flags or counter non-zero"
    pq_emit_kernel[(rows * NP, )](
        st["codes"], st["lut"], bnd, need, flag, ctr, sl, ln, w, cls, H, H // H_kv, M, K, S, st["cap"], cfg["sink"],
        cfg["window"], cfg["heavy"], cfg["init_offset"], NP, 1, MP=mp, TILE=tile, **EMIT_FIXED, num_warps=4)
    assert ctr.a[0] == rows * NP, f"emit tickets {ctr.a[0]} != {rows * NP} CTAs"
    assert np.all(flag.a >= (1 << 62)), "an emit part did not publish its counts"
    return sl.a, ln.a, w.a


@contextlib.contextmanager
def reversed_grid():
    """Run the interpreter's CTAs in reverse order (last block index first): a kernel whose
    CTAs depend on each other's order gives another answer, or hangs."""
    builder = interpreter.interpreter_builder
    set_idx = builder.set_grid_idx

    def flipped(x, y, z):
        gx, gy, gz = builder.grid_dim
        set_idx(gx - 1 - x, gy - 1 - y, gz - 1 - z)

    builder.set_grid_idx = flipped
    try:
        yield
    finally:
        builder.set_grid_idx = set_idx


def run_index(st, S, n_old, cfg, tile, mp=2, mode=0):
    """``mode`` 0: pq_wfill_kernel then pq_index_kernel (its own histogram and buckets,
    PDL off: the interpreter runs the launches in order); 1: pq_index_kernel alone, each
    row's companion CTA writing its weights (the interpreter runs CTA (r, 0), the
    companion, before (r, 1): the row CTA arrives second and writes the heavy ones); 2: as
    1 with the grid run in reverse (the companion arrives second and rewrites the ones over
    its zeros). For the state ``st`` at S; returns (sparse_list, sparse_len, weight_list)
    and checks that the marks and ready flags are left zero."""
    fill = int(mode != 0)
    B, H, H_kv, D, M, bits = st["B"], st["H"], st["H_kv"], st["D"], st["M"], st["bits"]
    rows = B * H
    sl, ln, w = poisoned_outputs(rows, S, cfg)
    if not fill:
        pq_wfill_kernel[(3, )](w, rows, S, cfg["sink"], cfg["window"], FT=INDEX_FIXED["FT"], TRIGGER=0, num_warps=4)
    q, key, cent = st["q"], st["key"], st["cent"]
    Sk = key.a.shape[2]
    with reversed_grid() if mode == 2 else contextlib.nullcontext():
        pq_index_kernel[(rows, 2)](
            q, key, cent, st["phi"], st["codes"], st["ihist"], st["ihistn"], st["lut"], st["bkt"],
            st["mark"], st["ready"], sl, ln, w, H * D, D, H_kv * Sk * D, Sk * D, D,
            H, H // H_kv, M, 1 << bits, bits, D // M, S, n_old, st["cap"], st["capc"], cfg["sink"], cfg["window"],
            cfg["heavy"], cfg["init_offset"], st["metric_ip"], fill, 0, MP=mp, TILE=tile, PDL=0, **INDEX_FIXED,
            num_warps=4)
    assert not st["mark"].a.any(), "pq_index left its start marks non-zero"
    assert not st["ready"].a.any(), "pq_index left a ready flag non-zero"
    return sl.a, ln.a, w.a


def make_state(rng, B, H, H_kv, D, M, bits, S_max, n_cached, small, metric_ip=False):
    K = 1 << bits
    d_s = D // M
    d_c = d_s + int(metric_ip)
    if small:
        q = rng.integers(-3, 4, (B, H, 1, D)).astype(np.float32)
        key = rng.integers(-3, 4, (B, H_kv, S_max, D)).astype(np.float32)
        cent = rng.integers(-3, 4, (B, H_kv, M, K, d_c)).astype(np.float32)
    else:
        q = rng.standard_normal((B, H, 1, D)).astype(np.float32)
        key = rng.standard_normal((B, H_kv, S_max, D)).astype(np.float32)
        cent = rng.standard_normal((B, H_kv, M, K, d_c)).astype(np.float32)
    cap = (S_max + 15) // 16 * 16
    codes = np.zeros((B, H_kv, M, cap), np.uint8)
    codes[..., :n_cached] = rng.integers(0, K, (B, H_kv, M, n_cached))
    phi = (rng.random(B * H_kv * M) * 2 * d_s).astype(np.float32) if metric_ip else np.zeros(1, np.float32)
    rows = B * H
    # pq_index's bucket capacity as the indexer sizes it (2 x a uniform share + 16); the
    # buckets start as poison (-1): only slots below a combination's count are read
    capc = 2 * -(-cap // FIXED["NC"]) + 16
    return dict(B=B, H=H, H_kv=H_kv, D=D, M=M, bits=bits, q=Arr(q), key=Arr(key), cent=Arr(cent), phi=Arr(phi),
                ihist=Arr(np.zeros((rows, FIXED["NC"]), np.int32)), ihistn=Arr(np.zeros(rows, np.int32)),
                bkt=Arr(np.full((rows, FIXED["NC"], capc), -1, np.int32)), capc=capc,
                mark=Arr(np.zeros((rows, INDEX_FIXED["TP"]), np.int32)), ready=Arr(np.zeros(rows, np.int32)),
                codes=Arr(codes), cap=cap, metric_ip=int(metric_ip),
                hist=Arr(np.zeros((rows, FIXED["NC"]), np.int32)), histn=Arr(np.zeros(rows, np.int32)),
                lut=Arr(np.zeros(rows * M * K, np.float32)),
                small=small)


def nearest(x, cent, phi, metric_ip):
    """float64 argmin over centroids [K, d_c] of subvector x [d_s] (lowest index on ties;
    a NaN distance is never taken, code 0 where all are: spec "Non-finite inputs")."""
    x = x.astype(np.float64)
    c = cent.astype(np.float64)
    if metric_ip:
        xx = float(x @ x)
        x = np.append(x, np.sqrt(max(0.0, float(phi) - xx)) if xx == xx else 0.0)
    else:
        c = c[:, :x.shape[0]]
    with np.errstate(invalid="ignore", over="ignore"):
        d = ((c - x[None, :])**2).sum(1)
    ok = ~np.isnan(d)
    if not ok.any():
        return 0
    return int(np.flatnonzero(ok & (d == d[ok].min()))[0])


def poison_nonfinite(st, io, n_old):
    """Non-finite inputs (spec "Non-finite inputs"): head 0's query NaN in one coordinate
    (every score of the head NaN: its heavy picks are the lowest candidates), centroids
    with +inf, -inf and NaN coordinates (scores of +-inf and NaN beside finite ones), a
    new key with an infinite and one with a NaN coordinate (their codes: the lowest code
    whose distance is not NaN)."""
    q, cent, key = st["q"].a, st["cent"].a, st["key"].a
    q[0, 0, 0, 0] = np.nan
    cent[:, :, 0, 3, 0] = np.inf
    cent[:, :, 0, 5, 1] = -np.inf
    cent[:, :, 0, 6, 0] = np.inf
    cent[:, :, 0, 6, 1] = -np.inf
    cent[:, :, -1, 2, 0] = np.nan
    key[:, :, io + n_old, 1] = np.inf
    key[:, :, io + n_old + 1, 0] = np.nan
    # some cached keys carry the non-finite codes, so they score +-inf or NaN
    codes = st["codes"].a
    codes[:, :, 0, 10:n_old:7] = 3
    codes[:, :, 0, 12:n_old:11] = 5
    codes[:, :, 0, 14:n_old:13] = 6
    codes[:, :, -1, 16:n_old:5] = 2


def _rank(v):
    """Sort key of an f64 score under the spec's order: NaN below everything."""
    return (0, 0.0) if v != v else (1, v)


def head_lut64(st, b, h):
    """Head ``(b, h)``'s lookup table in float64: ``lut[m, c] = <q_m, centroids[b, g, m,
    c, :d_s]>`` (``[M, K]``)."""
    M, d_s = st["M"], st["D"] // st["M"]
    g = h // (st["H"] // st["H_kv"])
    return np.einsum("mkd,md->mk", st["cent"].a[b, g, :, :, :d_s].astype(np.float64),
                     st["q"].a[b, h, 0].astype(np.float64).reshape(M, d_s))


def check(st, S, n_old, cfg, out, what):
    """Compare one step's outputs with the spec; raise AssertionError naming the row."""
    sl, ln, w = out
    B, H, H_kv, D, M = st["B"], st["H"], st["H_kv"], st["D"], st["M"]
    G = H // H_kv
    d_s = D // M
    io = cfg["init_offset"]
    n = S - io
    codes = st["codes"].a
    cent, key = st["cent"].a, st["key"].a
    # the new keys' codes
    for b in range(B):
        for g in range(H_kv):
            for m in range(M):
                phi = st["phi"].a[(b * H_kv + g) * M + m] if st["metric_ip"] else 0.0
                for t in range(n_old, n):
                    want = nearest(key[b, g, io + t, m * d_s:(m + 1) * d_s], cent[b, g, m], phi, st["metric_ip"])
                    got = int(codes[b, g, m, t])
                    assert got == want, f"{what}: code b={b} g={g} m={m} j={t}: {got}, want {want}"
    s_sink, s_win = min(cfg["sink"], S), min(cfg["window"], S)
    w0 = max(0, S - s_win - io)
    k = min(cfg["heavy"], n)
    for b in range(B):
        for h in range(H):
            r = b * H + h
            g = h // G
            row = sl[r]
            assert ln[r] == len(row), f"{what}: row {r}: sparse_len {ln[r]} != {len(row)}"
            assert np.all(np.diff(row) >= 0), f"{what}: row {r}: sparse_list not ascending: {row[:40]}"
            ind = np.zeros(S, np.float32)
            ind[row] = 1.0
            assert np.array_equal(ind, w[r]), f"{what}: row {r}: weight_list is not sparse_list's indicator"
            cnt = np.bincount(row, minlength=S)
            expect = np.zeros(S, np.int64)
            expect[:s_sink] += 1
            expect[S - s_win:] += 1
            heavy = cnt - expect
            assert np.all(heavy >= 0), f"{what}: row {r}: a sink or window position is missing"
            hp = np.nonzero(heavy)[0]
            assert heavy.sum() == k and np.all(heavy <= 1), f"{what}: row {r}: {heavy.sum()} heavy picks, want {k}"
            j = hp - io
            assert np.all(j >= 0) and np.all(j < n), f"{what}: row {r}: heavy position outside the quantized keys"
            lut = head_lut64(st, b, h)
            with np.errstate(invalid="ignore"):
                sc = sum(lut[m][codes[b, g, m, :w0].astype(np.int64)] for m in range(M))
            if w0 < k:
                want = set(range(w0)) | set(range(w0, k))
                assert set(j.tolist()) == want, f"{what}: row {r}: fill rule violated"
                continue
            assert np.all(j < w0), f"{what}: row {r}: a heavy pick is not a candidate"
            chosen = np.zeros(w0, bool)
            chosen[j] = True
            if not chosen.any() or not (~chosen).any():  # heavy 0, or every candidate taken
                continue
            cmin = min(sc[chosen].tolist(), key=_rank)
            umax = max(sc[~chosen].tolist(), key=_rank)
            if cmin != cmin:  # a NaN taken: only over NaNs, and the lowest j first
                nan_j = np.flatnonzero(np.isnan(sc))
                assert umax != umax and nan_j[chosen[nan_j]].max() < nan_j[~chosen[nan_j]].min(), \
                    f"{what}: row {r}: a NaN score chosen over {umax} or over a lower NaN j"
                continue
            tol = 0.0 if st["small"] or not np.isfinite(umax) else 1e-4 * (1 + abs(umax))
            assert umax != umax or cmin >= umax or cmin >= umax - tol, \
                f"{what}: row {r}: chosen min {cmin} < unchosen max {umax}"


CASES = [
    # name, (B, H, H_kv, D, M, bits), S0, steps, cfg, small, metric_ip, tile, mp
    ("normal", (1, 4, 4, 64, 2, 6), 3000, 3, dict(sink=16, window=32, heavy=64, init_offset=16), False, False, 128, 2),
    ("ties_int_gqa", (1, 4, 2, 32, 2, 4), 2500, 2, dict(sink=8, window=16, heavy=100, init_offset=8), True, False, 512,
     2),
    ("io_lt_sink", (1, 2, 2, 32, 2, 5), 1500, 2, dict(sink=64, window=40, heavy=50, init_offset=16), False, False, 512,
     2),
    ("ip_m4", (2, 2, 1, 32, 4, 3), 1200, 2, dict(sink=4, window=24, heavy=30, init_offset=4), False, True, 256, 4),
    # heavy > TP / 2: pq_index's cut path takes the full sort (not the top-k half)
    ("heavy_over_half", (1, 4, 4, 64, 2, 6), 3000, 2, dict(sink=16, window=32, heavy=200, init_offset=16), False, False,
     128, 2),
    ("few_cand", (1, 2, 2, 32, 2, 3), 260, 2, dict(sink=8, window=200, heavy=64, init_offset=8), False, False, 128, 2),
    ("m1_bits8", (1, 2, 2, 16, 1, 8), 1800, 2, dict(sink=4, window=8, heavy=20, init_offset=0), True, False, 512, 2),
    # 4 combinations: the threshold's combination holds hundreds of keys, so the maybe
    # keys fill whole 32-key masks and the last one taken is cut inside a mask
    ("dense_ties", (1, 2, 2, 16, 1, 2), 900, 2, dict(sink=4, window=8, heavy=40, init_offset=4), True, False, 128, 2),
    # NaN and infinities in the query, centroids and new keys (poison_nonfinite)
    ("nonfinite", (1, 4, 2, 32, 2, 4), 1500, 2, dict(sink=8, window=16, heavy=60, init_offset=8), False, False, 256,
     2),
]


def give_best_combination(st, j):
    """Set quantized key ``j``'s codes, in every KV group, to the combination that scores
    highest for the group's first query head (for a key no histogram counts yet)."""
    G = st["H"] // st["H_kv"]
    for b in range(st["B"]):
        for g in range(st["H_kv"]):
            st["codes"].a[b, g, :, j] = np.argmax(head_lut64(st, b, g * G), axis=1)


def check_recount(st, hk, w0, what):
    """The persistent combination histogram ``st[hk]`` (one row per query head) equals a
    recount of the codes of the keys ``j < w0``."""
    B, H, H_kv, M, bits = st["B"], st["H"], st["H_kv"], st["M"], st["bits"]
    G = H // H_kv
    for r in range(B * H):
        b, g = r // H, (r % H) // G
        cd = st["codes"].a[b, g, :, :w0].astype(np.int64)
        combo = sum(cd[m] << ((M - 1 - m) * bits) for m in range(M))
        want = np.bincount(combo, minlength=FIXED["NC"])
        assert np.array_equal(st[hk].a[r], want), f"{what}: row {r}: histogram != recount"


def case_args(prog, doc, cases, quick=False):
    """The command line the interpreter checks share: ``--case NAME`` (one case of
    ``cases``, each a tuple whose first item is its name), ``--seed N`` (else a fresh
    seed, printed as ``<prog>: seed N`` so a failure can be replayed) and, where
    ``quick`` is given, ``--quick``: the cases it names (a tuple of names), or the first
    two (``True``). Returns ``(rng, the cases to run)``."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    if quick:
        names = [c[0] for c in cases[:2]] if quick is True else list(quick)
        unknown = [q for q in names if q not in {c[0] for c in cases}]
        assert not unknown, f"quick cases not in the list: {unknown}"
        ap.add_argument("--quick", action="store_true", help=f"these cases only: {', '.join(names)}")
    ap.add_argument("--case", default=None, help="this case only (by name)")
    ap.add_argument("--seed", type=int, default=None)
    a = ap.parse_args()
    seed = a.seed if a.seed is not None else int.from_bytes(os.urandom(4), "little")
    print(f"{prog}: seed {seed}")
    run = [c for c in cases if c[0] in names] if quick and a.quick else cases
    if a.case:
        run = [c for c in cases if c[0] == a.case]
        if not run:
            ap.error(f"no case named {a.case!r}: {', '.join(c[0] for c in cases)}")
    return np.random.default_rng(seed), run


def main():
    rng, cases = case_args("interp_check", __doc__, CASES, quick=True)
    for name, (B, H, H_kv, D, M, bits), S0, steps, cfg, small, ip, tile, mp in cases:
        K = 1 << bits
        assert S0 > cfg["heavy"] + cfg["init_offset"] + 1 + K, name  # not the short path
        n0 = S0 - cfg["init_offset"] - 1
        st = make_state(rng, B, H, H_kv, D, M, bits, S0 + steps + 4, n0, small, ip)
        if name == "nonfinite":
            poison_nonfinite(st, cfg["init_offset"], n0)
        n_old = n0
        S = S0
        plan = [S0 + i for i in range(steps)] + [S0 + steps - 1]  # decode steps, then a replay
        splits = indexed = 0
        launches = len(plan)
        for i, S in enumerate(plan):
            n = S - cfg["init_offset"]
            w0 = max(0, S - min(cfg["window"], S) - cfg["init_offset"])
            assert w0 <= n_old, name
            # launches rotate over pq_hist, split and the indexed path
            # (M <= 2; its own histogram and buckets); the same persistent codes
            split = i % 3 == 1
            index = i % 3 == 2 and M <= 2
            # indexed launches rotate: pq_wfill + pq_index, pq_index with companion fill
            # (companion first, then the grid reversed: row CTA first)
            mode = indexed % 3
            if index:
                out = run_index(st, S, n_old, cfg, tile, mp, mode)
            else:
                out = (run_split if split else run_step)(st, S, n_old, cfg, tile, mp)
            tag = " (split)" if split else f" (indexed{INDEX_MODES[mode]})" if index else ""
            check(st, S, n_old, cfg, out, f"{name} step {i} S={S}{tag}")
            splits += split
            indexed += index
            hn = st["ihistn"] if index else st["histn"]
            assert np.all(hn.a == w0), f"{name}: histn {hn.a} != w0 {w0}"
            n_old = max(n_old, n)
        # the persistent histogram equals a recount; then a reset recounts from scratch
        check_recount(st, "hist", w0, f"{name}: pq_hist")
        if M <= 2:
            # pq_index on consecutive decode steps (one key joins each row's histogram:
            # added in registers where M = 2), then a replay (none joins); the joining key
            # carries the best combination of its group's first head, so a miscount of
            # it reaches the gather
            for S in (S + 1, S + 2, S + 2):
                w0 = max(0, S - min(cfg["window"], S) - cfg["init_offset"])
                assert w0 <= n_old, name
                if np.all(st["ihistn"].a < w0):  # a key joins (not the replay)
                    give_best_combination(st, w0 - 1)
                check(st, S, n_old, cfg, run_index(st, S, n_old, cfg, tile, mp, indexed % 3),
                      f"{name} decode S={S} (indexed{INDEX_MODES[indexed % 3]})")
                assert np.all(st["ihistn"].a == w0), f"{name}: ihistn {st['ihistn'].a} != w0 {w0}"
                indexed += 1
                launches += 1
                n_old = max(n_old, S - cfg["init_offset"])
            check_recount(st, "ihist", w0, f"{name}: pq_index")
        for hk in ("hist", "histn", "ihist", "ihistn"):
            st[hk].a[:] = 0
        out = run_split(st, S, n_old, cfg, tile, mp)
        check(st, S, n_old, cfg, out, f"{name} after reset (split)")
        splits += 1
        launches += 1
        if M <= 2:  # the indexed path after the reset too: buckets refilled from scratch
            check(st, S, n_old, cfg, run_index(st, S, n_old, cfg, tile, mp, 2),
                  f"{name} after reset (indexed{INDEX_MODES[2]})")
            indexed += 1
            launches += 1
        print(f"  {name}: {launches} launches ok ({splits} split: pq_thresh + pq_emit, {indexed} indexed: "
              "pq_wfill + pq_index or pq_index with companion fill, in both CTA orders)")
    print("interp_check: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
