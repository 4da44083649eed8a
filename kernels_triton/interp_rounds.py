#!/usr/bin/env python3
"""CPU check of the histogram path's threshold rounds (``_rounds`` in pq_hist.py) under
Triton's interpreter: every kernel of the histogram family (``pq_hist``, ``pq_thresh``,
``pq_index``'s fallback, the ragged ``pq_rgthresh``) finds its class bounds with it.

    TRITON_INTERPRET=1 python3 kernels_triton/interp_rounds.py [--cases N]

A probe kernel runs ``_rounds`` on one row of combinations (counts ``cnt``, scores
``s``) with a small ``NB`` (16 bins), so that the rounds, not the first cut, decide. The
cases: random distinct scores, a crowded bin (many distinct scores within one first-round
bin), tied scores, spans below 2^-100 (subnormal differences), near-ties (scores within
half the spec's tolerance of each other), scores past ``RANK_LIN`` (16384) about 0.01
apart (not near-ties there, where a rank is 2^16 ulps of a score), ``need``
equal to every key (callers pass ``need <= keys``), LEVELS 2 and 3. Each result
``(t_sure, t_maybe, need')`` is checked against float64 arithmetic on the same scores:
the keys scoring ``>= t_sure`` plus ``need'`` make ``need``; the combination holding the
``need``-th largest key scores in ``[t_maybe, t_sure)``, which holds at least ``need'``
keys; where that range holds one score the bounds are exact; and three rounds must leave
one score or near-ties only (by ``_near_tie``'s rule: ``5e-5 (1 + |score|)`` apart at
most up to ``RANK_LIN``, ``128 * 5e-5`` past it) on the random, tied, subnormal, near-tie
and past-``RANK_LIN`` cases. Exit status 1 on the first mismatch.
"""

import argparse
import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from interp_check import Arr  # noqa: E402
from pq_hist import _rounds  # noqa: E402
from pq_select import RANK_LIN as _RANK_LIN  # noqa: E402

NC = 64
NB = 16
RANK_LIN = float(getattr(_RANK_LIN, "value", _RANK_LIN))


@triton.jit
def rounds_probe(cnt_ptr, s_ptr, out_ptr, need, NC: tl.constexpr, NB: tl.constexpr, LEVELS: tl.constexpr):
    i = tl.arange(0, NC)
    t_sure, t_maybe, left = _rounds(tl.load(cnt_ptr + i), tl.load(s_ptr + i), need, NC, NB, LEVELS)
    tl.store(out_ptr, t_sure)
    tl.store(out_ptr + 1, t_maybe)
    tl.store(out_ptr + 2, left.to(tl.float32))


def run(cnt, s, need, levels):
    out = Arr(np.full(3, np.nan, np.float32))
    rounds_probe[(1,)](Arr(cnt.astype(np.int32)), Arr(s.astype(np.float32)), out, need, NC, NB, levels)
    return float(out.a[0]), float(out.a[1]), int(out.a[2])


def check(name, cnt, s, need, levels, must_resolve):
    t_sure, t_maybe, left = run(cnt, s, need, levels)
    s64 = s.astype(np.float32).astype(np.float64)
    want = need
    sure = int(cnt[s64 >= t_sure].sum())
    maybe_mask = (s64 >= t_maybe) & (s64 < t_sure) & (cnt > 0)
    maybe = int(cnt[maybe_mask].sum())
    msg = f"{name} (LEVELS {levels}, need {need}): t_sure {t_sure!r} t_maybe {t_maybe!r} need' {left}"
    if sure + left != want:
        raise AssertionError(f"{msg}: {sure} sure keys + need' != {want}")
    if want > sure and not 0 < left <= maybe:
        raise AssertionError(f"{msg}: need' outside (0, {maybe}] keys in [t_maybe, t_sure)")
    if want == 0:
        return
    order = np.argsort(-s64, kind="stable")
    cum = np.cumsum(cnt[order])
    sk = s64[order][np.searchsorted(cum, want)]  # the combination holding the want-th key
    if not t_maybe <= sk < t_sure:
        raise AssertionError(f"{msg}: the {want}-th key's score {sk!r} outside [t_maybe, t_sure)")
    in_play = np.unique(s64[maybe_mask])
    resolved = len(in_play) <= 1
    # _near_tie's rule on the range in play
    near = resolved or (in_play.max() - in_play.min() <= (
        5e-5 * (1.0 + np.abs(in_play).min()) if np.abs(in_play).max() <= RANK_LIN else 128 * 5e-5))
    if must_resolve and not near:
        raise AssertionError(f"{msg}: {len(in_play)} scores still in play, {in_play.max() - in_play.min()!r} apart")
    if resolved:
        above = s64[(s64 > sk) & (cnt > 0)]
        exact = (above.min() if above.size else np.inf, sk, want - int(cnt[s64 > sk].sum()))
        if (t_sure, t_maybe, left) != exact:
            raise AssertionError(f"{msg}: resolved, but the exact bounds are {exact}")


def cases(rng):
    """(name, cnt, s, need, must_resolve) for one random draw."""
    cnt = rng.integers(0, 6, NC)
    s = rng.permutation(np.linspace(-3.0, 5.0, NC)).astype(np.float32) + rng.uniform(0, 1e-3, NC).astype(np.float32)
    yield "distinct", cnt, s, int(rng.integers(1, max(2, cnt.sum()))), True
    # a crowded bin: 40 distinct scores within 1e-3 under a few spread ones, need reaching
    # into the crowd, so the first round leaves more in play than the packed slots
    crowd = rng.uniform(0.0, 1e-3, NC).astype(np.float32)
    crowd[:8] = rng.uniform(1.0, 10.0, 8)
    cnt2 = rng.integers(1, 4, NC)
    top = int(cnt2[np.argsort(-crowd)][:8].sum())
    yield "crowded bin", cnt2, crowd, top + int(rng.integers(1, 20)), False
    tied = np.full(NC, 1.5, np.float32)
    tied[: NC // 4] = rng.uniform(2.0, 3.0, NC // 4)
    yield "tied", cnt2, tied, int(rng.integers(1, cnt2.sum())), True
    tiny = (rng.permutation(NC).astype(np.float32) * np.float32(1e-44)).astype(np.float32)
    yield "span below 2^-100", cnt2, tiny, int(rng.integers(1, cnt2.sum())), True
    # near-ties: 64 scores 1e-6 apart near 2 (within 5e-5 (1 + 2) of each other), taken in
    # position order without a round
    near = (np.float32(2.0) + rng.permutation(NC).astype(np.float32) * np.float32(1e-6)).astype(np.float32)
    yield "near-ties", cnt2, near, int(rng.integers(1, cnt2.sum())), True
    # past RANK_LIN: ranks 0.01 apart (5 or 6 ulps at 16500) are scores up to 7.8e-5
    # relative apart, above half the tolerance (5e-5), so the rounds must go on to one
    # score; the linear rule would stop at once (the 64 span 0.63 < 5e-5 (1 + 16500))
    far = (np.float32(16500.0) + rng.permutation(NC).astype(np.float32) * np.float32(0.01)).astype(np.float32)
    yield "past RANK_LIN", cnt2, far, int(rng.integers(1, cnt2.sum())), True
    yield "need = every key", cnt, s, int(cnt.sum()), True


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=6, help="random draws (each runs every case at LEVELS 2 and 3)")
    ap.add_argument("--seed", type=int, default=None)
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else int(np.random.SeedSequence().entropy % 2**31)
    print(f"interp_rounds: seed {seed}")
    rng = np.random.default_rng(seed)
    n = 0
    for _ in range(args.cases):
        for name, cnt, s, need, must in cases(rng):
            for levels in (3, 2):
                check(name, cnt, s, need, levels, must and levels == 3)
                n += 1
    print(f"interp_rounds: ok ({n} rounds runs)")


if __name__ == "__main__":
    try:
        main()
    except AssertionError as e:
        print(f"interp_rounds: FAILED: {e}")
        sys.exit(1)
