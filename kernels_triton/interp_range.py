#!/usr/bin/env python3
"""CPU check of the radix-select threshold (``pq_range.py``: ``pq_rsel_kernel``, then
``pq_emit_kernel``) under Triton's interpreter (no GPU, no torch).

    TRITON_INTERPRET=1 python3 kernels_triton/interp_range.py [--case NAME] [--seed N]

Configs with more code combinations than the combination histogram takes (``K^M >
4096``: (M, bits) = (2, 8), (4, 8), (3, 5), (8, 4), (5, 3)), and some it does take (the
radix select works for any: (8, 1)), rows whose heavy picks reach into the sink or the
window (``pq_emit``'s generic placement), on small random shapes, every row checked against the spec as
``interp_check.py`` checks it (heavy set by the 1e-4 rule with float64 scores, exact on
small-integer inputs; sink, window, order, weights, new keys' codes). Each case runs
several decode steps, a replay of the last one, and the same step with the CTAs run in
reverse order. Steps alternate one CTA a row and a cluster of 2 (the interpreter runs no
distributed shared memory: there every CTA of a cluster counts the whole row, so this
checks that one CTA writes the bounds and one the new code, whatever the order). Outputs
are poisoned before each launch. Exit status 1 on the first mismatch.
"""

import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from interp_check import Arr, case_args, check, make_state, poison_nonfinite, poisoned_outputs, reversed_grid  # noqa: E402,E501
from pq_range import RSEL_FIXED, pq_rsel_kernel  # noqa: E402
from pq_split import EMIT_FIXED, pq_emit_kernel  # noqa: E402



def run_range(st, S, n_old, cfg, tile, rtile, mp, cluster, reverse=False):
    """pq_rsel (TILE = ``rtile``, ``cluster`` CTAs a row), pq_emit (TILE = ``tile``) for the
    state ``st`` at S; returns (sparse_list, sparse_len, weight_list)."""
    B, H, H_kv, D, M, bits = st["B"], st["H"], st["H_kv"], st["D"], st["M"], st["bits"]
    K = 1 << bits
    rows = B * H
    io = cfg["init_offset"]
    NP = -(-(S - io) // tile)
    w0 = max(0, S - min(cfg["window"], S) - io)
    sl, ln, w = poisoned_outputs(rows, S, cfg)
    bnd = Arr(np.full((rows, 2), np.nan, np.float32))
    need = Arr(np.full(rows, -7, np.int32))
    flag = Arr(np.full((rows, NP), -1, np.int64))  # poisoned: pq_rsel zeroes them
    ctr = Arr(np.full(1, 12345, np.int32))
    nch = -(-K // RSEL_FIXED["BLOCK_C"])
    qd = Arr(np.full((B * H_kv, M, nch), np.nan, np.float32))
    qc = Arr(np.full((B * H_kv, M, nch), -1, np.int32))
    q, key, cent = st["q"], st["key"], st["cent"]
    Sk = key.a.shape[2]
    G = H // H_kv
    ctx = reversed_grid if reverse else _nothing
    with ctx():
        st["lut"].a[...] = np.nan  # poisoned: pq_rsel writes every row's table
        pq_rsel_kernel[(cluster, rows)](
            q, key, cent, st["phi"], st["codes"], st["lut"], qd, qc, bnd, need, flag, ctr, H * D, D,
            H_kv * Sk * D, Sk * D, D, H, G, M, K, D // M, S, n_old, st["cap"], cfg["heavy"], io, cfg["window"],
            st["metric_ip"], NP, MP=mp, TILE=rtile, CLUSTER=cluster, **RSEL_FIXED, num_warps=4)
        assert not np.isnan(bnd.a).any() and (need.a >= 0).all(), "pq_rsel left a row without bounds"
        assert not flag.a.any() and ctr.a[0] == 0, "pq_rsel left the emit's flags or counter non-zero"
        pq_emit_kernel[(rows * NP, )](
            # cls_ptr: the codes, never read (by_class = 0: the radix path scores its keys)
            st["codes"], st["lut"], bnd, need, flag, ctr, sl, ln, w, st["codes"], H, G, M, K, S, st["cap"],
            cfg["sink"], cfg["window"], cfg["heavy"], io, NP, 0, MP=mp, TILE=tile, **EMIT_FIXED, num_warps=4)
    assert ctr.a[0] == rows * NP, f"emit tickets {ctr.a[0]} != {rows * NP} CTAs"
    return sl.a, ln.a, w.a


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


CASES = [
    # name, (B, H, H_kv, D, M, bits), S0, steps, cfg, small, metric_ip, emit tile, round tile
    ("m2_bits8", (1, 4, 2, 64, 2, 8), 3000, 2, dict(sink=16, window=32, heavy=300, init_offset=16), False, False, 512,
     1024),
    ("m4_bits8_ip", (2, 2, 1, 32, 4, 8), 2000, 2, dict(sink=8, window=24, heavy=150, init_offset=8), False, True, 256,
     512),
    ("m3_bits5_ties", (1, 4, 4, 48, 3, 5), 2500, 2, dict(sink=8, window=16, heavy=400, init_offset=8), True, False,
     512, 256),
    ("m2_bits6_heavy1", (1, 2, 2, 32, 2, 6), 1500, 2, dict(sink=4, window=8, heavy=1, init_offset=4), False, False,
     256, 512),
    ("m2_bits8_heavy0", (1, 2, 2, 32, 2, 8), 1500, 1, dict(sink=4, window=8, heavy=0, init_offset=4), False, False,
     256, 512),
    # one value of the score for most keys: many ties at the threshold
    ("m2_bits7_dense", (1, 2, 2, 16, 2, 7), 1800, 2, dict(sink=4, window=8, heavy=900, init_offset=4), True, False,
     128, 256),
    # scores in the thousands (ranks compressed past 16384, value bins narrower than 2^13
    # ulps soon: integer rounds) and every score equal (an empty value range)
    ("huge_scores", (1, 4, 2, 64, 2, 8), 1500, 2, dict(sink=8, window=16, heavy=200, init_offset=8), False, False,
     256, 512),
    ("flat", (1, 2, 2, 32, 4, 8), 1200, 1, dict(sink=8, window=16, heavy=100, init_offset=8), False, False, 256, 512),
    # queries and centroids sharing a large component: every score near 4e4 (ranks past
    # 16384, 2^16 ulps a rank) within a few percent, so a bin of the first round is a few
    # hundredths of a rank wide, near-ties by the linear rule but not as scores
    ("offset_scores", (1, 4, 2, 64, 2, 8), 4000, 2, dict(sink=8, window=16, heavy=500, init_offset=8), False, False,
     256, 512),
    ("nonfinite", (1, 4, 2, 32, 2, 8), 1500, 2, dict(sink=8, window=16, heavy=60, init_offset=8), False, False, 256,
     512),
    # rows whose heavy picks do not all lie between sink and window: the sink reaching
    # past the first key (sink and heavy copies of one position), fewer candidates than
    # heavy (the lowest masked keys fill in: heavy and window copies), a window reaching
    # before the first key (no candidate at all)
    ("sink_past_first_key", (1, 4, 2, 64, 2, 8), 3000, 2, dict(sink=700, window=32, heavy=300, init_offset=16), False,
     False, 512, 1024),
    ("fill_from_window", (1, 2, 2, 32, 2, 8), 700, 2, dict(sink=4, window=600, heavy=300, init_offset=4), True, False,
     256, 512),
    ("window_before_first_key", (1, 2, 1, 32, 4, 8), 1000, 2, dict(sink=60, window=2000, heavy=100, init_offset=40),
     False, False, 256, 512),
    # M > 4 (K^M up to 2^32), and M = 8 with K^M = 256 (many ties)
    ("m8_bits4", (1, 4, 2, 64, 8, 4), 1500, 2, dict(sink=8, window=16, heavy=200, init_offset=8), False, False, 256,
     512),
    ("m8_bits1_ties", (1, 2, 2, 32, 8, 1), 1200, 2, dict(sink=8, window=16, heavy=50, init_offset=8), True, False, 256,
     256),
    ("m5_bits3_ip", (2, 2, 1, 40, 5, 3), 1300, 2, dict(sink=8, window=24, heavy=120, init_offset=8), False, True, 256,
     512),
]


#: what CI runs (``--quick``, CI's time budget): every emit placement, M in {2, 4, 8}, ip,
#: ties, huge, offset and non-finite scores; the full list runs without ``--quick``
QUICK = ("m2_bits8", "m4_bits8_ip", "m2_bits7_dense", "huge_scores", "offset_scores", "nonfinite",
         "sink_past_first_key", "fill_from_window", "window_before_first_key", "m8_bits4")


def main():
    rng, cases = case_args("interp_range", __doc__, CASES, quick=QUICK)
    for name, (B, H, H_kv, D, M, bits), S0, steps, cfg, small, ip, tile, rtile in cases:
        mp = 2 if M <= 2 else 4 if M <= 4 else 8
        n0 = S0 - cfg["init_offset"] - 1
        st = make_state(rng, B, H, H_kv, D, M, bits, S0 + steps + 4, n0, small, ip)
        if name == "m2_bits7_dense":
            # two codes per subvector only: few distinct scores, hundreds of keys each
            st["codes"].a[...] = st["codes"].a % 2
        if name == "nonfinite":
            poison_nonfinite(st, cfg["init_offset"], n0)
        if name == "huge_scores":
            st["q"].a[...] *= 700.0
        if name == "flat":
            st["cent"].a[...] = st["cent"].a[..., :1, :, :]
        if name == "offset_scores":
            d_s = D // M
            for m in range(M):
                st["q"].a[..., m * d_s] = 100.0
            st["cent"].a[..., 0] = 200.0 + 20.0 * rng.standard_normal(st["cent"].a[..., 0].shape)
        n_old = n0
        plan = [S0 + i for i in range(steps)] + [S0 + steps - 1]  # decode steps, then a replay
        for i, S in enumerate(plan + [plan[-1]]):
            reverse = i == len(plan)
            cluster = 1 + i % 2
            out = run_range(st, S, n_old, cfg, tile, rtile, mp, cluster, reverse)
            tag = ", CTAs in reverse order" if reverse else ""
            check(st, S, n_old, cfg, out, f"{name} step {i} S={S}, {cluster} CTA(s) a row{tag}")
            n_old = max(n_old, S - cfg["init_offset"])
        print(f"  {name}: {len(plan) + 1} steps ok")
    print("interp_range: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
