"""Launch + synchronize latency of the fp32 axpy kernel through Triton's own Python
launcher (the counterpart of benches/launch_latency.rs). Needs a GPU, torch and
triton==3.6.0.

    python3 benches/launch_latency_triton.py [--iters 2000] [--json FILE]

Two paths: the @triton.jit call (`kernel[grid](...)`: argument specialization + cache
lookup + launcher), and the CompiledKernel handle it returns (`compiled[grid](...)`:
launcher only). Median (p10, p90) over --iters launches, each followed by
torch.cuda.synchronize(); plus back-to-back launches per second.
"""
import argparse
import json
import statistics
import time

import torch
import triton
import triton.language as tl


@triton.jit
def axpy_kernel(x_ptr, y_ptr, out_ptr, a, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, a * x + y, mask=mask)


BLOCK = 1024


def stats(ts):
    ts = sorted(ts)
    q = lambda p: ts[round((len(ts) - 1) * p)] * 1e6
    return q(0.5), q(0.1), q(0.9), statistics.fmean(ts) * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--json")
    o = ap.parse_args()
    dev = torch.cuda.get_device_name()
    print(f"device: {dev}; torch {torch.__version__}; triton {triton.__version__}")
    rows = []
    print(f"{'path':<28} {'n':>9} {'median':>9} {'p10':>9} {'p90':>9} {'mean':>9} {'b2b us/launch':>14}")
    for n in (4096, 1 << 20):
        x = torch.arange(n, device="cuda", dtype=torch.float32) % 977 * 0.25 - 100.0
        y = torch.arange(n, device="cuda", dtype=torch.float32) % 313 * -0.5 + 7.0
        out = torch.full((n,), float("nan"), device="cuda")
        a = 1.75
        grid = (triton.cdiv(n, BLOCK),)
        compiled = axpy_kernel[grid](x, y, out, a, n, BLOCK=BLOCK, num_warps=4, num_stages=1)
        torch.cuda.synchronize()
        ref = (a * x.double() + y.double()).float()
        assert torch.equal(out, ref), "axpy result differs from the fp64-rounded reference"

        def jit_call():
            axpy_kernel[grid](x, y, out, a, n, BLOCK=BLOCK, num_warps=4, num_stages=1)

        grid3 = (grid[0], 1, 1)  # CompiledKernel.__getitem__ reads grid[0..3]

        def compiled_call():
            # The launcher takes every argument, constexprs included (it skips them).
            compiled[grid3](x, y, out, a, n, BLOCK)

        for name, fn in (("triton @jit kernel[grid]", jit_call), ("triton CompiledKernel[grid]", compiled_call)):
            try:
                for _ in range(200):
                    fn()
                torch.cuda.synchronize()
            except Exception as e:  # report, keep going
                print(f"{name:<28} {n:>9} failed: {type(e).__name__}: {e}")
                continue
            ts = []
            for _ in range(o.iters):
                t0 = time.perf_counter()
                fn()
                torch.cuda.synchronize()
                ts.append(time.perf_counter() - t0)
            b2b_n = 10000
            t0 = time.perf_counter()
            for _ in range(b2b_n):
                fn()
            torch.cuda.synchronize()
            b2b = (time.perf_counter() - t0) * 1e6 / b2b_n
            med, p10, p90, mean = stats(ts)
            print(f"{name:<28} {n:>9} {med:>9.2f} {p10:>9.2f} {p90:>9.2f} {mean:>9.2f} {b2b:>14.2f}")
            rows.append(dict(what="launch_sync", impl=name, n=n, iters=o.iters, median_us=med, p10_us=p10,
                             p90_us=p90, mean_us=mean, b2b_us_per_launch=b2b))
    if o.json:
        with open(o.json, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
