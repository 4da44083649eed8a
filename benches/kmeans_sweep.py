#!/usr/bin/env python3
"""Sweep the prefill kernels' block sizes, warps and stages on the GPU (Triton JIT,
torch tensors): median GPU time of one ``pq_km_assign`` and one ``pq_km_sums`` launch
per configuration, on the spec's prefill shapes (bf16 keys).

    python3 benches/kmeans_sweep.py [--shapes 1,8,32768,2,6 ...] [--quick]

Prints one line per (shape, kernel, config), fastest first per kernel. The chosen
configurations go into ``kernels_triton/pq_kmeans.py`` (the build's variants).
"""

import argparse
import itertools
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "kernels_triton"))

from pq_kmeans import pq_km_assign_kernel, pq_km_sums_kernel  # noqa: E402


def cdiv(a, b):
    return -(-a // b)


def bench(fn, reps=20):
    fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3)
    ts.sort()
    return ts[len(ts) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", nargs="*", default=["1,8,32768,2,6", "1,8,32768,4,8", "1,8,32768,2,8"])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for spec in args.shapes:
        B, H_kv, S, M, bits = map(int, spec.split(","))
        D, init_offset = 128, 128
        K = 1 << bits
        d_s = D // M
        n = S - init_offset
        G = B * H_kv * M
        key = torch.randn(B, H_kv, S, D, device="cuda").to(torch.bfloat16)
        cent = torch.randn(G, K, d_s, device="cuda")
        phi = torch.zeros(G, device="cuda")
        chg = torch.zeros(2 * G, dtype=torch.int32, device="cuda")
        done = torch.zeros(G, dtype=torch.int32, device="cuda")
        cap = cdiv(n, 16) * 16
        codes = torch.randint(0, K, (G, cap), dtype=torch.uint8, device="cuda")
        st = (H_kv * S * D, S * D, D)
        rows = []
        for ctas_per_sm in (1, 2, 4):
            for bn, nw, ns, bd in itertools.product((64, 128), (4, 8), (1, 3), (32, 64)):
                if args.quick and (ns == 3 or bd == 64):
                    continue
                want = max(1, cdiv(ctas_per_sm * sms, G))
                P = min(want, cdiv(n, bn))
                per = cdiv(cdiv(n, P), bn) * bn
                P = cdiv(n, per)
                part = torch.empty(G, P, K, d_s, device="cuda")
                cnt = torch.empty(G, P, K, dtype=torch.int32, device="cuda")

                def assign():
                    pq_km_assign_kernel[(P, G)](key, cent, phi, codes, chg, done, *st, H_kv, M, K, d_s, n, init_offset,
                                                per, cap, 1, 0, 0, BLOCK_N=bn, BLOCK_K=64, BLOCK_D=bd, num_warps=nw,
                                                num_stages=ns)

                def sums():
                    pq_km_sums_kernel[(P, cdiv(K, 64), G)](key, phi, codes, part, cnt, done, *st, H_kv, M, K, d_s, n,
                                                          init_offset, per, cap, P, 0, BLOCK_N=bn, BLOCK_K=64,
                                                          BLOCK_D=bd, num_warps=nw, num_stages=ns)
                try:
                    ta = bench(assign)
                except Exception as e:  # noqa: BLE001
                    ta = float("nan")
                    print(f"assign bn{bn} w{nw} s{ns} d{bd}: {type(e).__name__}")
                try:
                    ts = bench(sums)
                except Exception as e:  # noqa: BLE001
                    ts = float("nan")
                    print(f"sums bn{bn} w{nw} s{ns} d{bd}: {type(e).__name__}")
                rows.append((ta, ts, f"cps{ctas_per_sm} P{P} bn{bn} w{nw} s{ns} d{bd}"))
        print(f"== B={B} H_kv={H_kv} S={S} M={M} bits={bits} (G={G})", flush=True)
        for name, idx in (("assign", 0), ("sums", 1)):
            best = sorted(rows, key=lambda r: r[idx])[:6]
            for r in best:
                print(f"  {name:6s} {r[idx]:8.1f} us  {r[2]}")
            dflt = [r for r in rows if r[2].endswith("bn128 w8 s1 d32") and r[2].startswith("cps2")]
            if dflt:
                print(f"  {name:6s} {dflt[0][idx]:8.1f} us  (current default: {dflt[0][2]})")


if __name__ == "__main__":
    main()
