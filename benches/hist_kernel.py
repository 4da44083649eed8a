"""Kernel-level check and timing of `pq_hist_kernel` through Triton's JIT (GPU, torch).

For each shape: random inputs, one step (the first after an import: the combination
histogram is counted from scratch), checked against kernels_triton/reference.py by the
spec's rule (sink/window exact, weight_list = indicator of sparse_list, heavy set by the
1e-4 rule, exact scores on small-integer inputs, codes equal), then a second step (S + 1,
one new key: the steady state) checked the same way and timed: median GPU time per
launch over a CUDA graph of --reps launches of that step (CUDA events), and the median
wall time of one graph replay holding one launch + synchronize (host timer).

    python3 benches/hist_kernel.py [--tiles 2048,4096,8192] [--warps 8,16,32]

Used while developing the kernel; the Rust tests and `tritonrt bench` are the contract.
"""

import argparse
import ctypes
import os
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
# TRITONRT_KERNELS_DIR: another copy of kernels_triton/ (an A/B run of two versions)
sys.path.insert(0, os.environ.get("TRITONRT_KERNELS_DIR", os.path.join(HERE, "..", "kernels_triton")))

import reference  # noqa: E402
from compare_outputs import heavy_chosen  # noqa: E402
from pq_hist import FIXED, pq_hist_kernel  # noqa: E402
from pq_index import INDEX_FIXED, INDEX_MAXNREG, pq_index_kernel, pq_wfill_kernel  # noqa: E402
from pq_split import EMIT_FIXED, THRESH_FIXED, pq_emit_kernel, pq_thresh_kernel  # noqa: E402

SHAPES = {  # name: (B, H, H_kv, S, D, M, bits, sink, window, heavy, init_offset, small_int)
    "reference": (1, 32, 32, 32000, 128, 2, 6, 128, 128, 128, 128, False),
    "practical": (1, 32, 8, 32768, 128, 2, 6, 128, 128, 3020, 128, False),
    "large": (4, 32, 32, 131072, 128, 2, 6, 128, 128, 128, 128, False),
    "plarge": (4, 32, 8, 131072, 128, 2, 6, 128, 128, 12851, 128, False),
    "ties_int_gqa": (1, 8, 2, 20000, 64, 2, 6, 64, 64, 128, 32, True),
    "S65536": (1, 32, 32, 65536, 128, 2, 6, 128, 128, 128, 128, False),
    "S8192": (1, 32, 32, 8192, 128, 2, 6, 128, 128, 128, 128, False),
}


#: CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT (cuda.h)
CARVEOUT_ATTRIBUTE = 9


def prefer_shared_carveout(ck):
    """Ask for the most shared memory (100 %) in the L1 / shared split of the SMs that run
    the compiled kernel ``ck``, as the runtime does for ``pq_wfill``
    (``Kernel::prefer_shared_carveout``): room for ``pq_index``'s CTAs (32 KB of shared
    memory) beside it (NOTES.md, "the indexed histogram path (`pq_wfill` + `pq_index`)")."""
    ck._init_handles()
    ctypes.CDLL("libcuda.so.1").cuFuncSetAttribute(ctypes.c_void_p(ck.function), CARVEOUT_ATTRIBUTE, 100)


class Step:
    """The indexer state of one shape plus one launch of the kernel at a given S."""

    def __init__(self, shape, seed, tile, warps, nb=FIXED["NB"], split=False):
        B, H, H_kv, S, D, M, bits, sink, win, heavy, io, small = shape
        g = torch.Generator(device="cuda").manual_seed(seed)
        K = 1 << bits
        d_s = D // M
        S_max = S + 2
        if small:
            self.q = torch.randint(-3, 4, (B, H, 1, D), generator=g, device="cuda").float()
            self.key = torch.randint(-3, 4, (B, H_kv, S_max, D), generator=g, device="cuda").float()
            self.cent = torch.randint(-3, 4, (B, H_kv, M, K, d_s), generator=g, device="cuda").float()
        else:
            self.q = torch.randn(B, H, 1, D, generator=g, device="cuda")
            self.key = torch.randn(B, H_kv, S_max, D, generator=g, device="cuda")
            self.cent = torch.randn(B, H_kv, M, K, d_s, generator=g, device="cuda")
        self.cfg = dict(sink_size=sink, window_size=win, heavy_size=heavy, init_offset=io)
        n_old = S - io - 1
        self.cb = torch.randint(0, K, (B, n_old, H_kv, M), generator=g, device="cuda")
        self.cap = (S_max + 15) // 16 * 16
        self.codes = torch.zeros(B, H_kv, M, self.cap, dtype=torch.uint8, device="cuda")
        self.codes[..., :n_old] = self.cb.permute(0, 2, 3, 1).to(torch.uint8)
        rows = B * H
        self.hist = torch.zeros(rows, FIXED["NC"], dtype=torch.int32, device="cuda")
        self.histn = torch.zeros(rows, dtype=torch.int32, device="cuda")
        self.lut = torch.zeros(rows * M * K, dtype=torch.float32, device="cuda")
        self.phi = torch.zeros(1, dtype=torch.float32, device="cuda")
        self.shape, self.small, self.tile, self.warps, self.nb = shape, small, tile, warps, nb
        self.n_old = n_old
        self.S = S
        self.timer = 0
        self.levels = FIXED["LEVELS"]
        self.split = split  # pq_thresh + pq_emit (TILE, warps: the emit's)
        self.emit_on = True
        self.bnd = torch.zeros(rows, 2, dtype=torch.float32, device="cuda")
        self.need = torch.zeros(rows, dtype=torch.int32, device="cuda")
        self.flag = torch.zeros(rows * (S_max // tile + 2), dtype=torch.int64, device="cuda")
        self.ctr = torch.zeros(1, dtype=torch.int32, device="cuda")
        # split: the combinations' classes (kernels that take them: an A/B run may load an
        # older kernels_triton/ whose pq_thresh and pq_emit do not)
        self.by_class = "cls_ptr" in pq_emit_kernel.arg_names
        self.cls = torch.zeros(rows, FIXED["NC"], dtype=torch.uint8, device="cuda")
        self.twarps = 8  # split: pq_thresh's warps
        self.index = False  # pq_index (TILE, warps: its fallback emit's, its own)
        self.capc = max(16, 4 * -(-n_old // FIXED["NC"]))
        self.tp = INDEX_FIXED["TP"]
        self.ihist = torch.zeros(rows, FIXED["NC"], dtype=torch.int32, device="cuda")
        self.ihistn = torch.zeros(rows, dtype=torch.int32, device="cuda")
        self.bkt = None
        self.pdl = False  # index: weights by pq_wfill, pq_index a programmatic dependent launch
        self.fill_ctas = 132
        self.fill_warps = 4
        self.carved = False
        self.maxnreg = 0
        self.cuts = INDEX_FIXED["CUTS"]

    def prepare(self, S):
        B, H = self.shape[0], self.shape[1]
        s_ = min(self.cfg["sink_size"], S)
        w_ = min(self.cfg["window_size"], S)
        n = S - self.cfg["init_offset"]
        total = s_ + min(self.cfg["heavy_size"], n) + w_
        self.S = S
        self.sl = torch.full((B, H, total), -7, dtype=torch.int64, device="cuda")
        self.len = torch.full((B, H), -7, dtype=torch.int64, device="cuda")
        self.w = torch.full((B, H, S), 7.0, dtype=self.q.dtype, device="cuda")  # poison

    def parts(self):
        """pq_emit's parts per row (split)."""
        return -(-(self.S - self.cfg["init_offset"]) // self.tile)

    def thresh(self):
        """Launch pq_thresh (split)."""
        B, H, H_kv, _, D, M, bits = self.shape[:7]
        Sk = self.key.shape[2]
        c = self.cfg
        return pq_thresh_kernel[(B * H, 2)](
            self.q, self.key, self.cent, self.phi, self.codes, self.hist, self.histn, self.lut, self.bnd,
            self.need, self.flag, self.ctr, *([self.cls] if self.by_class else []), H * D, D, H_kv * Sk * D, Sk * D, D, H, H // H_kv, M, 1 << bits, bits,
            D // M, self.S, self.n_old, self.cap, c["heavy_size"], c["init_offset"], c["window_size"], 0, self.parts(),
            MP=2, **dict(THRESH_FIXED, NB=self.nb, TIMER=self.timer, LEVELS=self.levels),
            num_warps=self.twarps, num_stages=1)

    def emit(self):
        """Launch pq_emit (split; after thresh(), which zeroes its flags and counter)."""
        B, H, H_kv, M, bits = self.shape[0], self.shape[1], self.shape[2], self.shape[5], self.shape[6]
        c = self.cfg
        NP = self.parts()
        cls = [self.cls] if self.by_class else []
        by_class = [1] if self.by_class else []
        return pq_emit_kernel[(B * H * NP, )](
            self.codes, self.lut, self.bnd, self.need, self.flag, self.ctr, self.sl, self.len, self.w, *cls, H,
            H // H_kv, M, 1 << bits, self.S, self.cap, c["sink_size"], c["window_size"], c["heavy_size"], c["init_offset"], NP,
            *by_class, MP=2, TILE=self.tile, **EMIT_FIXED, num_warps=self.warps, num_stages=1)

    def __call__(self):
        B, H, H_kv, _, D, M, bits = self.shape[:7]
        Sk = self.key.shape[2]
        c = self.cfg
        if self.index:
            if self.bkt is None:
                self.bkt = torch.zeros(B * H, FIXED["NC"], self.capc, dtype=torch.int32, device="cuda")
                self.mark = torch.zeros(B * H, self.tp, dtype=torch.int32, device="cuda")
                self.ready = torch.zeros(B * H, dtype=torch.int32, device="cuda")
            extra = {}
            if self.pdl in ("nofill", "companion"):  # nofill: timing only, no weights written (the check fails)
                pass
            elif self.pdl:
                fk = pq_wfill_kernel[(self.fill_ctas, )](self.w, B * H, self.S, c["sink_size"], c["window_size"],
                                                        FT=2048, TRIGGER=1, num_warps=self.fill_warps)
                if not self.carved:
                    prefer_shared_carveout(fk)
                    self.carved = True
                extra["launch_pdl"] = True
            if self.maxnreg:
                extra["maxnreg"] = self.maxnreg
            return pq_index_kernel[(B * H, 2)](
                self.q, self.key, self.cent, self.phi, self.codes, self.ihist, self.ihistn, self.lut,
                self.bkt, self.mark, self.ready, self.sl, self.len, self.w, H * D, D, H_kv * Sk * D, Sk * D, D, H,
                H // H_kv, M, 1 << bits, bits, D // M, self.S, self.n_old, self.cap, self.capc, c["sink_size"],
                c["window_size"], c["heavy_size"], c["init_offset"], 0, int(self.pdl == "companion"), MP=2,
                TILE=self.tile,
                **dict(INDEX_FIXED, NB=self.nb, TIMER=self.timer, LEVELS=self.levels, TP=self.tp, CUTS=self.cuts,
                         PDL=int(bool(self.pdl))),
                num_warps=self.warps, num_stages=1, **extra)
        if self.split:
            ck = self.thresh()
            if self.emit_on:
                ck = self.emit()
            return ck
        return pq_hist_kernel[(B * H, 2)](
            self.q, self.key, self.cent, self.phi, self.codes, self.hist, self.histn, self.lut,
            self.sl, self.len, self.w, H * D, D, H_kv * Sk * D, Sk * D, D, H, H // H_kv, M, 1 << bits, bits, D // M,
            self.S, self.n_old, self.cap, c["sink_size"], c["window_size"], c["heavy_size"], c["init_offset"], 0,
            MP=2, NC=FIXED["NC"], NB=self.nb, LEVELS=self.levels, TILE=self.tile, DT=FIXED["DT"],
            BLOCK_C=FIXED["BLOCK_C"], BLOCK_DS=FIXED["BLOCK_DS"], TIMER=self.timer, num_warps=self.warps,
            num_stages=1)

    def phases(self):
        """Median over rows of each phase's duration (us), from a TIMER=1 launch."""
        self.timer = 1
        self()
        torch.cuda.synchronize()
        self.timer = 0
        B, H, M, bits = self.shape[0], self.shape[1], self.shape[5], self.shape[6]
        t = self.lut.view(torch.int64).view(B * H, M * (1 << bits) // 2)[:, :6].double()
        d = (t[:, 1:] - t[:, :-1]) / 1e3
        # the launch lasts as long as its slowest row: the rows' spread, and when the
        # first and last rows started and ended (us after the first start)
        tot = (t[:, 5] - t[:, 0]) / 1e3
        self.spread = (float(d[:, 3].min()), float(d[:, 3].max()), float(tot.min()), float(tot.max()),
                       float((t[:, 0].max() - t[:, 0].min()) / 1e3), float((t[:, 5].max() - t[:, 0].min()) / 1e3))
        return d.median(0).values.tolist() + [float(tot.median())]


def check(st, cb):
    """Errors of the last launch against reference.py (empty: ok); returns (errs, codebook)."""
    q, key, cent, cfg = st.q, st.key[:, :, :st.S], st.cent, st.cfg
    sl, ln, w, cb2 = reference.indexer_step(q, key, cent, cb, **cfg)
    S = st.S
    errs = []
    B, H = sl.shape[:2]
    n = cb2.shape[1]
    codes = st.codes[..., :n].permute(0, 3, 1, 2).to(torch.int64)
    if not torch.equal(codes, cb2):
        errs.append("codes differ")
    if not torch.equal(st.len, ln):
        errs.append(f"sparse_len {st.len.flatten()[:4].tolist()} vs {ln.flatten()[:4].tolist()}")
        return errs, cb2
    if not bool((st.sl[..., 1:] >= st.sl[..., :-1]).all()):
        errs.append("not ascending")
    ind = torch.zeros(B, H, S, device="cuda")
    ind.scatter_(2, st.sl.clamp(0, S - 1), 1.0)
    if not torch.equal(ind, st.w.float()):
        errs.append("weight_list != indicator")
    io, s_, w_ = cfg["init_offset"], min(cfg["sink_size"], S), min(cfg["window_size"], S)
    w0 = max(0, S - w_ - io)
    if not bool((ind[..., :s_] == 1).all()) or not bool((ind[..., S - w_:] == 1).all()):
        errs.append("sink/window missing")
    qd = q.double().reshape(B, cent.shape[1], -1, cent.shape[2], q.shape[-1] // cent.shape[2])
    d_s = qd.shape[-1]
    lut = torch.einsum("bgmkd,bgimd->bgimk", cent[..., :d_s].double(), qd)
    idx = cb2.permute(0, 2, 3, 1)[:, :, None].expand(-1, -1, lut.shape[2], -1, -1)
    sc = torch.gather(lut, 4, idx).sum(3).reshape(B, H, n)[:, :, :w0]
    ch = heavy_chosen(st.sl, S, io, w0, cfg["sink_size"], cfg["window_size"])
    k = min(cfg["heavy_size"], n)
    if not bool((ch.sum(-1) == k).all()):
        errs.append("heavy count != k")
    lo = torch.where(ch, sc, torch.inf).amin(-1)
    hi = torch.where(ch, -torch.inf, sc).amax(-1)
    bad = int((lo < hi - 1e-4 * (1 + hi.abs())).sum())
    if bad:
        errs.append(f"{bad} rows: heavy set below an unchosen candidate")
    if st.small:
        chr_ = heavy_chosen(sl, S, io, w0, cfg["sink_size"], cfg["window_size"])
        a = torch.sort(torch.where(ch, sc, -1e30), -1).values
        b = torch.sort(torch.where(chr_, sc, -1e30), -1).values
        if not torch.equal(a, b):
            errs.append("small-int heavy scores differ from the reference")
    return errs, cb2


def capture(fn, warmup=None):
    """A CUDA graph of what ``fn`` launches, after ``warmup()`` (if given) on a side
    stream (compiles and caches what the capture must not)."""
    if warmup is not None:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            warmup()
        torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g


def graph_time(fn, reps):
    """(median GPU us per call over 15 replays of a graph of `reps` calls, median wall us of
    one replay of a one-call graph + synchronize)."""
    gr = capture(lambda: [fn() for _ in range(reps)], warmup=lambda: [fn() for _ in range(3)])
    ts = []
    for _ in range(15):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        gr.replay()
        e1.record()
        torch.cuda.synchronize()
        ts.append(e0.elapsed_time(e1) * 1e3 / reps)
    g1 = capture(fn)
    walls = []
    for _ in range(200):
        t0 = time.perf_counter()
        g1.replay()
        torch.cuda.synchronize()
        walls.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(ts), statistics.median(walls[20:])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiles", default="2048,4096,8192")
    ap.add_argument("--warps", default="8,16,32")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--nb", default=str(FIXED["NB"]),
                    help="level-histogram bins, comma-separated (LEVELS x NB at most pq_hist.LVL_WORDS)")
    ap.add_argument("--split", action="store_true", help="pq_thresh + pq_emit (tiles/warps: the emit's)")
    ap.add_argument("--levels", type=int, default=FIXED["LEVELS"],
                    help="threshold rounds (timing experiments: fewer may break the heavy rule)")
    ap.add_argument("--no-quant", action="store_true",
                    help="timed step quantizes nothing (n_old = n): the quantizing CTAs' share of the time")
    ap.add_argument("--twarps", default="8", help="split: pq_thresh's warps, comma-separated")
    ap.add_argument("--index", action="store_true", help="pq_index (one launch; tiles: its fallback emit's)")
    ap.add_argument("--pdl", action="store_true", help="index: pq_wfill, then pq_index as a PDL launch")
    ap.add_argument("--companion", action="store_true",
                    help="index: one launch of the PDL variant (no PDL attribute), each row's companion CTA "
                    "writing its weights")
    ap.add_argument("--no-fill", action="store_true",
                    help="index: PDL variant launched alone, no weights written (timing only: the check fails)")
    ap.add_argument("--maxnreg", type=int, default=INDEX_MAXNREG, help="index: register cap (0: none)")
    ap.add_argument("--fill-ctas", type=int, default=132, help="index --pdl: pq_wfill's CTAs")
    ap.add_argument("--fill-warps", type=int, default=4, help="index --pdl: pq_wfill's warps")
    ap.add_argument("--cuts", default=str(INDEX_FIXED["CUTS"]),
                    help="index: eight-way cuts before the gather, comma-separated (0: the rounds' path only)")
    ap.add_argument("--tp", type=int, default=INDEX_FIXED["TP"], help="index: gathered keys per row at most")
    a = ap.parse_args()
    rows = []
    for name in a.shapes.split(","):
        for tile in map(int, a.tiles.split(",")):
            combos = [(w, b, tw, cu) for w in map(int, a.warps.split(",")) for b in map(int, a.nb.split(","))
                      for tw in map(int, a.twarps.split(",")) for cu in map(int, a.cuts.split(","))]
            for warps, nb, tw, cuts in combos:
                st = Step(SHAPES[name], 1234, tile, warps, nb, a.split)
                st.twarps = tw
                st.index = a.index
                st.tp = a.tp
                st.pdl = "nofill" if a.no_fill else "companion" if a.companion else a.pdl
                st.maxnreg = a.maxnreg
                st.cuts = cuts
                st.fill_ctas = a.fill_ctas
                st.fill_warps = a.fill_warps
                tag = f"{warps}/{nb}/t{tw}" + (f"/c{cuts}" if a.index else "")
                try:
                    st.prepare(st.S)
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    ck = st()
                    torch.cuda.synchronize()
                    first_us = (time.perf_counter() - t0) * 1e6
                    errs, cb = check(st, st.cb)
                    st.n_old = cb.shape[1]
                    st.prepare(st.S + 1)  # one decode step later: one new key, histogram += 1 key
                    st.levels = a.levels
                    st()
                    torch.cuda.synchronize()
                    errs2, _ = check(st, cb)
                    errs += ["step 2: " + e for e in errs2]
                except Exception as e:  # noqa: BLE001
                    rows.append((name, tile, tag, f"ERROR {type(e).__name__}: {str(e)[:300]}", None, "", 0))
                    print(rows[-1], flush=True)
                    continue
                if a.no_quant:
                    st.n_old = st.S - st.cfg["init_offset"]
                gpu, wall = graph_time(st, a.reps)
                ph = st.phases()
                extra = ""
                if a.split:  # the threshold launch alone: the emit is the difference
                    st.emit_on = False
                    g_t, _ = graph_time(st, a.reps)
                    st.emit_on = True
                    extra = f" | pq_thresh alone {g_t:.2f} GPU us, pq_emit {gpu - g_t:.2f}"
                print(f"phases {name} TILE={tile} {tag} (us): delta {ph[0]:.2f} lut {ph[1]:.2f} "
                      f"load {ph[2]:.2f} rounds {ph[3]:.2f} {'classes' if a.split else 'emit'} {ph[4]:.2f} "
                      f"total {ph[5]:.2f}{extra}", flush=True)
                print("  rows: rounds {:.2f}..{:.2f}, total {:.2f}..{:.2f}, starts spread {:.2f}, "
                      "last end {:.2f} us after the first start".format(*st.spread), flush=True)
                res = "ok" if not errs else "FAIL " + "; ".join(errs)
                rows.append((name, tile, tag, res, (gpu, wall), f"{ck.n_regs}r/{ck.n_spills}s", first_us))
                print(rows[-1], flush=True)
    print(f"\n{'shape':<13} {'TILE':>5} {'w/NB/twarps':>14} {'GPU us':>7} {'wall us':>8} {'1st us':>8} {'regs':>8}  check")
    for name, tile, warps, res, t, regs, first in rows:
        if not t:
            print(f"{name:<13} {tile:>5} {warps:>14} {res}")
            continue
        print(f"{name:<13} {tile:>5} {warps:>14} {t[0]:>7.2f} {t[1]:>8.2f} {first:>8.0f} {regs:>8}  {res}")


if __name__ == "__main__":
    main()
