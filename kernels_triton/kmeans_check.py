#!/usr/bin/env python3
"""CPU check of the prefill kernels (``pq_kmeans.py``) under Triton's interpreter.

    TRITON_INTERPRET=1 python3 kernels_triton/kmeans_check.py [--quick]

Runs the launch sequence of ``src/pq/prefill/gpu.rs`` (prep, init, then per iteration
assign + sums + update, then the final assign) on small shapes with numpy arrays, and
checks it against a float64 numpy k-means with the same iteration rule
(spec/pqcache-prefill.md): every code an argmin of the returned centroids within
``1e-5 * (1 + d_c)``, the inertia per group within 0.1% of the reference's, on
well-separated small-integer inputs codes and centroids exactly equal, phi the maximum
squared norm, the iteration counts equal on those inputs, and the non-finite count.
Strided and given (random) init, euclidean and ip, parts that split a group, K below
and above the kernels' cluster tile, several partial tiles, keys sharing a large
component. Exit status 1 on the first mismatch.
"""

import argparse
import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from interp_check import Arr  # noqa: E402

#: the assign variant's member-sums tile (pq_kmeans.py's declaration)
ASSIGN_SUM_D = 64
from pq_kmeans import (BLOCKS, pq_km_assign_kernel, pq_km_init_kernel, pq_km_pack_kernel,  # noqa: E402
                       pq_km_prep_kernel,
                       pq_km_sums_kernel, pq_km_update_kernel)


def cdiv(a, b):
    return -(-a // b)


def run_gpu_sequence(key, B, H_kv, S, D, M, bits, init_offset, iters, metric_ip, idx, parts):
    """The kernels in launch order (the member sums fused into the assignment where one
    tile holds every cluster and coordinate, as src/pq/prefill/gpu.rs does); returns
    (centroids, codes [G, n], phi, iters, bad)."""
    K = 1 << bits
    d_s = D // M
    d_c = d_s + metric_ip
    n = S - init_offset
    G = B * H_kv * M
    bn = BLOCKS["BLOCK_N"]
    per = cdiv(cdiv(n, parts), bn) * bn
    P = cdiv(n, per)
    cap = cdiv(n, 16) * 16
    k = Arr(key)
    cent = Arr(np.full((G, K, d_c), np.nan, np.float32))
    phi = Arr(np.zeros(G, np.float32))
    bad = Arr(np.zeros(1, np.int32))
    codes = Arr(np.full((G, cap), 0xAB, np.uint8))
    part = Arr(np.full((G, P, K, d_c), np.nan, np.float32))
    cnt = Arr(np.full((G, P, K), -5, np.int32))
    chg = Arr(np.zeros(2 * G, np.int32))
    done = Arr(np.zeros(G, np.int32))
    it_out = Arr(np.zeros(G, np.int32))
    rng_words = Arr(np.zeros((G, 2, d_s), np.uint32))
    idxa = Arr(np.zeros((G, K), np.int32) if idx is None else idx.astype(np.int32))
    strides = (H_kv * S * D, S * D, D, d_s)
    pos0 = init_offset
    if d_s % 16:
        # keys the kernels cannot take as they are: packed, each subvector zero-padded to
        # a multiple of 16 (as src/pq/prefill/gpu.rs does)
        d_pad = cdiv(d_s, 16) * 16
        packed = Arr(np.full((B, H_kv, n, M, d_pad), 77, key.dtype))
        pq_km_pack_kernel[(cdiv(n, 64), B * H_kv)](k, packed, H_kv * S * D, S * D, D, H_kv, M, d_s, d_pad, n,
                                                   init_offset, BLOCK_N=64, BLOCK_D=32)
        k = packed
        strides = (H_kv * n * M * d_pad, n * M * d_pad, M * d_pad, d_pad)
        pos0 = 0
    init_offset = pos0
    pq_km_prep_kernel[(P, G)](k, phi, bad, rng_words, *strides, H_kv, M, d_s, n, init_offset, per, metric_ip, BLOCK_N=64,
                              BLOCK_D=32)
    pq_km_init_kernel[(cdiv(K, 64), G)](k, cent, phi, idxa, *strides, H_kv, M, K, d_s, n, init_offset,
                                        int(idx is not None), metric_ip, BLOCK_K=64, BLOCK_D=32)
    ablocks = dict(BLOCKS, SUM_D=ASSIGN_SUM_D)
    fused = K <= ablocks["BLOCK_K"] and d_s <= ablocks["SUM_D"]
    for it in range(iters):
        pq_km_assign_kernel[(P, G)](k, cent, phi, codes, part, cnt, chg, done, rng_words, *strides, H_kv, M, K, d_s, n, init_offset,
                                    per, cap, P, it, 0, metric_ip, **ablocks)
        if not fused:
            pq_km_sums_kernel[(P, cdiv(K, BLOCKS["BLOCK_K"]), G)](k, phi, codes, part, cnt, done, *strides, H_kv, M, K,
                                                                 d_s, n, init_offset, per, cap, P, metric_ip,
                                                                 **dict(BLOCKS, BLOCK_D=64))
        pq_km_update_kernel[(cdiv(K * d_c, 128), G)](cent, part, cnt, chg, done, it_out, K, d_s, P, it, metric_ip,
                                                     BLOCK_E=128)
    pq_km_assign_kernel[(P, G)](k, cent, phi, codes, part, cnt, chg, done, rng_words, *strides, H_kv, M, K, d_s, n, init_offset,
                                per, cap, P, iters, 1, metric_ip, **ablocks)
    return cent.a, codes.a[:, :n], phi.a, it_out.a, int(bad.a[0])


def subvectors(key, b, g, m, d_s, init_offset):
    return key[b, g, init_offset:, m * d_s:(m + 1) * d_s].astype(np.float64)


def augment(x, phi):
    return np.concatenate([x, np.sqrt(np.maximum(phi - (x * x).sum(1), 0.0))[:, None]], axis=1)


def dists(x, c):
    return ((x[:, None, :] - c[None, :, :])**2).sum(2)


def ref_group(x, init, iters):
    """float64 k-means: assign (lowest k on ties), stop when nothing changed, update
    (empty clusters keep theirs); then the final codes. Returns (c, codes, updates)."""
    c = init.copy()
    prev = None
    updates = 0
    for _ in range(iters):
        a = np.argmin(dists(x, c), axis=1)
        if prev is not None and np.array_equal(a, prev):
            break
        for k in range(c.shape[0]):
            sel = a == k
            if sel.any():
                c[k] = x[sel].mean(0)
        updates += 1
        prev = a
    return c, np.argmin(dists(x, c), axis=1), updates


def check_case(name, rng, B, H_kv, S, D, M, bits, init_offset, iters, metric_ip, separated, random_init, parts,
               dtype=np.float32, offset=0.0, offset_subvectors=None):
    K = 1 << bits
    d_s = D // M
    n = S - init_offset
    G = B * H_kv * M
    if separated:
        # K centers far apart on a small-integer grid; key j of a group belongs to cluster
        # floor(j * K / n) (so strided init seeds each cluster once), noise +-1 in pairs
        key = np.zeros((B, H_kv, S, D), np.float32)
        for b in range(B):
            for g in range(H_kv):
                for m in range(M):
                    centers = rng.integers(-6, 7, size=(K, d_s)) * 8
                    centers[:, 0] = np.arange(K) * 8 - 4 * K  # distinct
                    cl = (np.arange(n) * K) // n
                    x = centers[cl].astype(np.float32)
                    for k in range(K):
                        members = np.nonzero(cl == k)[0]
                        for i in range(0, len(members) - 1, 2):
                            e = rng.integers(-1, 2, size=d_s)
                            x[members[i]] += e
                            x[members[i + 1]] -= e
                    key[b, g, init_offset:, m * d_s:(m + 1) * d_s] = x
    else:
        key = rng.standard_normal((B, H_kv, S, D)).astype(np.float32)
        # every key shares a large component (LLM keys' outlier channels): coordinate 0 of
        # each subvector (of the first offset_subvectors) offset, and one more by a
        # negative half of it
        end = D if offset_subvectors is None else offset_subvectors * d_s
        key[..., 0:end:d_s] += offset
        key[..., 1:end:d_s] -= offset / 2
    if dtype == np.float16:
        key = key.astype(np.float16)
    idx = None
    if random_init:
        idx = np.stack([rng.choice(n, size=K, replace=False) for _ in range(G)]).astype(np.int32)
    cent, codes, phi, its, bad = run_gpu_sequence(key, B, H_kv, S, D, M, bits, init_offset, iters, metric_ip, idx,
                                                  parts)
    if bad != 0:
        return f"{name}: {bad} non-finite values counted in finite keys"
    d_c = d_s + metric_ip
    for b in range(B):
        for g in range(H_kv):
            for m in range(M):
                gi = (b * H_kv + g) * M + m
                x = subvectors(key.astype(np.float32), b, g, m, d_s, init_offset)
                if metric_ip:
                    want_phi = np.max((x.astype(np.float32)**2).sum(1, dtype=np.float32))
                    if abs(phi[gi] - want_phi) > 1e-5 * want_phi:
                        return f"{name}: group {gi}: phi {phi[gi]} != {want_phi}"
                    x = augment(x, float(phi[gi]))
                rows = idx[gi] if idx is not None else (np.arange(K) * n) // K
                rc, rcodes, rup = ref_group(x, x[rows].copy(), iters)
                c = cent[gi].astype(np.float64)
                dd = dists(x, c)
                best = dd.min(1)
                got = dd[np.arange(n), codes[gi]]
                tol = 1e-5 * (1 + d_c)
                if np.any(got > best + tol):
                    j = int(np.argmax(got - best))
                    return f"{name}: group {gi} key {j}: code {codes[gi][j]} at {got[j]} > best {best[j]} + {tol}"
                inertia = best.sum()
                rin = dists(x, rc).min(1).sum()
                if abs(inertia - rin) > 1e-3 * max(rin, 1e-12) and rin > 0:
                    return f"{name}: group {gi}: inertia {inertia} vs reference {rin}"
                if separated:
                    if not np.array_equal(codes[gi].astype(np.int64), rcodes):
                        return f"{name}: group {gi}: codes differ from the reference on separated inputs"
                    # the ip augmentation (a square root) is not a small integer: its mean
                    # depends on the order of the sum, so only the key coordinates are exact
                    rc32 = rc.astype(np.float32)
                    if not np.array_equal(cent[gi][:, :d_s], rc32[:, :d_s]):
                        return f"{name}: group {gi}: centroids differ from the reference on separated inputs"
                    if metric_ip and np.any(np.abs(cent[gi][:, d_s] - rc32[:, d_s]) > 1e-5 * (1 + np.abs(rc32[:, d_s]))):
                        return f"{name}: group {gi}: augmented coordinates differ from the reference beyond 1e-5"
                    if its[gi] != rup:
                        return f"{name}: group {gi}: {its[gi]} updates, reference {rup}"
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer cases")
    args = ap.parse_args()
    rng = np.random.default_rng(7)
    cases = [
        # name, B, H_kv, S, D, M, bits, init_offset, iters, ip, separated, random init, parts
        ("separated euclidean M2 b3", 1, 2, 300, 16, 2, 3, 4, 6, 0, True, False, 2),
        ("separated ip M1 b2", 1, 1, 200, 8, 1, 2, 0, 6, 1, True, False, 3),
        ("random euclidean M2 b4", 2, 1, 400, 32, 2, 4, 8, 4, 0, False, False, 3),
        ("random ip M4 b3 random init", 1, 2, 333, 32, 4, 3, 5, 3, 1, False, True, 2),
        ("random euclidean K=128 (two cluster tiles), n=K", 1, 1, 64 + 128, 16, 1, 7, 64, 3, 0, False, False, 1),
        ("random euclidean d_s=48 (two d tiles)", 1, 1, 260, 96, 2, 7, 2, 3, 0, False, False, 2),
        ("fp16 keys ip M2 b5", 1, 1, 300, 16, 2, 5, 0, 3, 1, False, False, 2),
        ("random ip d_s=96 bits5 (member sums not fused)", 1, 1, 300, 96, 1, 5, 0, 3, 1, False, False, 2),
        ("random ip D=40 M=2 (d_s=20: packed keys)", 1, 2, 290, 40, 2, 4, 9, 3, 1, False, False, 2),
        ("separated euclidean D=24 M=1 (packed keys)", 1, 1, 260, 24, 1, 3, 4, 4, 0, True, False, 2),
        # keys sharing a large component: uncentered distances miss rule (a) by up to 0.05
        ("offset 300 euclidean M2 b6", 1, 2, 2000, 32, 2, 6, 8, 4, 0, False, False, 2, 300.0),
        ("offset 300 ip M2 b5", 1, 1, 700, 32, 2, 5, 0, 3, 1, False, False, 2, 300.0),
        ("fp16 offset 300 euclidean M2 b6", 1, 2, 2000, 32, 2, 6, 8, 4, 0, False, False, 2, 300.0),
        # only subvector 0 offset: its groups take the centered loop, the others not
        ("fp16 offset 300 subvector 0 only, ip M2 b5", 1, 2, 1500, 32, 2, 5, 0, 3, 1, False, False, 2, 300.0, 1),
    ]
    if args.quick:
        cases = cases[:3]
    failures = 0
    for c in cases:
        dtype = np.float16 if c[0].startswith("fp16") else np.float32
        msg = check_case(c[0], rng, *c[1:13], dtype=dtype, offset=c[13] if len(c) > 13 else 0.0,
                         offset_subvectors=c[14] if len(c) > 14 else None)
        print(("FAIL " + msg) if msg else f"ok   {c[0]}")
        failures += msg is not None
    if failures:
        sys.exit(1)
    print(f"kmeans_check: {len(cases)} passed, 0 failed")


if __name__ == "__main__":
    main()
