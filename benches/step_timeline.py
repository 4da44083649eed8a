"""Where one replayed split step's time goes on the GPU (torch + Triton JIT, GPU only).

Graphs of the split step (``pq_thresh`` + ``pq_emit``, reference workload by default) with
a one-CTA stamp kernel (``%globaltimer``, ns) before, between and after the two launches:

- ``single``: one step per graph, replayed and synchronized ``--reps`` times (the
  decode loop's case), each replay's stamps read back;
- ``chained``: ``--chain`` steps in one graph, replayed once per sample (the
  per-step time of a graph of many steps, as ``hist_kernel.py`` reports).

Prints, per case, medians of: stamp -> stamp spans (``thresh`` = from the stamp before
pq_thresh to the one after it, ``emit`` likewise) and the host wall time of a replay +
synchronize; and the same for graphs of stamp kernels only (the launch floor). The
stamp kernels add their own launch gaps; compare the cases with each other, not with
the step's time without stamps.

    python3 benches/step_timeline.py [--shape reference] [--reps 300] [--chain 20]
"""

import argparse
import statistics
import time

import torch
import triton
import triton.language as tl

from hist_kernel import SHAPES, Step, capture, check


@triton.jit
def stamp_kernel(buf_ptr, i):
    t = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)
    tl.store(buf_ptr + i, t)


def med(xs):
    return statistics.median(xs)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="reference")
    ap.add_argument("--tile", type=int, default=4096)
    ap.add_argument("--warps", type=int, default=4)
    ap.add_argument("--reps", type=int, default=300)
    ap.add_argument("--chain", type=int, default=20)
    a = ap.parse_args()
    st = Step(SHAPES[a.shape], 1234, a.tile, a.warps, split=True)
    st.prepare(st.S)
    st()
    torch.cuda.synchronize()
    errs, cb = check(st, st.cb)
    st.n_old = cb.shape[1]
    st.prepare(st.S + 1)
    st()
    torch.cuda.synchronize()
    errs += check(st, cb)[0]
    print("check:", "ok" if not errs else "FAIL " + "; ".join(errs), flush=True)

    n_st = 3 * a.chain + 1
    buf = torch.zeros(n_st, dtype=torch.int64, device="cuda")

    def stamp(i):
        stamp_kernel[(1, )](buf, i, num_warps=1)

    steps = {
        "step (thresh + emit)": lambda i: (stamp(3 * i), st(), stamp(3 * i + 1)),
        "step, stamp between": lambda i: (stamp(3 * i), st.thresh(), stamp(3 * i + 1), st.emit(), stamp(3 * i + 2)),
        "stamps only": lambda i: (stamp(3 * i), stamp(3 * i + 1), stamp(3 * i + 2)),
    }

    rows = []
    for name, body in steps.items():
        def one():
            body(0)
            stamp(n_st - 1)

        def chain():
            for i in range(a.chain):
                body(i)
            stamp(n_st - 1)

        g1, gc = capture(one, warmup=one), capture(chain, warmup=chain)
        spans, walls = [], []
        for r in range(a.reps + 20):
            buf.zero_()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            g1.replay()
            torch.cuda.synchronize()
            w = (time.perf_counter() - t0) * 1e6
            if r >= 20:
                walls.append(w)
                spans.append(buf[:3].tolist() + [buf[n_st - 1].item()])
        # single: s0 -> s1 -> s2 (or end)
        def seg(sp, i, j):
            return [(x[j] - x[i]) / 1e3 for x in sp if x[j] and x[i]]

        d01 = seg(spans, 0, 1)
        d12 = seg(spans, 1, 2)
        d0e = seg(spans, 0, 3)
        chained = []
        for _ in range(15):
            buf.zero_()
            gc.replay()
            torch.cuda.synchronize()
            chained.append((buf[n_st - 1].item() - buf[0].item()) / 1e3 / a.chain)
        rows.append((name, med(walls), med(d01), med(d12) if d12 else float("nan"), med(d0e), med(chained)))
        print(rows[-1], flush=True)
    # the step without stamps, timed as `tritonrt bench` times it: wall = host timer
    # around replay + synchronize; GPU = CUDA events recorded around the replay
    g = capture(st, warmup=st)
    for where, stream in (("default stream", torch.cuda.current_stream()), ("side stream", torch.cuda.Stream())):
        walls, gpus = [], []
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(stream):
            for r in range(a.reps + 20):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                g.replay()
                stream.synchronize()
                w = (time.perf_counter() - t0) * 1e6
                e0.record()
                g.replay()
                e1.record()
                torch.cuda.synchronize()
                if r >= 20:
                    walls.append(w)
                    gpus.append(e0.elapsed_time(e1) * 1e3)
        print(f"\n{a.shape}, step without stamps, {where}: wall {med(walls):.2f} us (replay + synchronize), "
              f"GPU {med(gpus):.2f} us (events around the replay)")
    print(f"\n{a.shape}: medians, us (globaltimer spans inside one replay; wall = replay + synchronize)")
    print(f"{'graph':<24} {'wall 1-step':>11} {'s0->s1':>8} {'s1->s2':>8} {'s0->end':>8} {'chained/step':>13}")
    for name, w, d01, d12, d0e, ch in rows:
        print(f"{name:<24} {w:>11.2f} {d01:>8.2f} {d12:>8.2f} {d0e:>8.2f} {ch:>13.2f}")


if __name__ == "__main__":
    main()
