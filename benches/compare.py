"""Side-by-side benchmark of the PQCache decode step, one run, one device, same inputs.

Implementations timed (median per step over --steps steps after a warm-up; wall-clock =
host timer around step + torch.cuda.synchronize(); GPU time = CUDA events around the step):

1. tritonrt, plain kernel launches from Rust           (`tritonrt bench`)
2. tritonrt, CUDA graph replay from Rust               (`tritonrt bench`)
3. kernels_triton/reference.py in PyTorch eager
4. PyTorch calling our Triton kernels through Triton's Python launcher: the kernels
   tritonrt runs here (`pq_index`, after `pq_wfill` where tritonrt launches it), and
   the fused `pq_select` (the chunked path) for comparison
5. each of those under a torch CUDA graph

`tritonrt bench --save-inputs` writes each shape's inputs (the key rows a step reads,
query, centroids, codebook) so the Python implementations see the same bytes; the rest of
the key cache is zero and never read. Every step quantizes one new key, as the upstream
benchmark does. Prints a table with each one's ratio to the memory floor (bytes the step
must move / copy bandwidth measured by `tritonrt bench` in the same run) and writes a PNG
plot of wall-clock per step vs S.

The spec's practical workloads (bf16 query, keys and weights; B=1 H=32 H_kv=8 S=32768
heavy 3020 with (M, bits) (2,6) (2,8) (4,8); B=4 S=131072 heavy 12851) come from
`tritonrt bench --matrix --matrix-rows ...` (`--no-practical` skips them). For those,
tritonrt (which refuses (2,8) and (4,8): K^M > 4096 with heavy above 512) is compared with
reference.py eager and under a torch CUDA graph, on the same bf16 inputs; the Triton
launcher rows are left out there (pq_select is built for heavy <= 512, and tritonrt runs
the split path, not pq_index, with 3020 heavy picks). A second PNG shows those rows.

Usage (on a GPU machine with torch + triton):
    python3 benches/compare.py --tritonrt target/release/tritonrt --out bench_out
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch
from safetensors import safe_open

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "kernels_triton"))

import reference  # noqa: E402
from compare_outputs import heavy_chosen  # noqa: E402
from hist_kernel import prefer_shared_carveout  # noqa: E402
from pq_hist import FIXED as HIST_FIXED  # noqa: E402
from pq_index import INDEX_FIXED, INDEX_MAXNREG, pq_index_kernel, pq_wfill_kernel  # noqa: E402
from pq_select import pq_select_kernel  # noqa: E402


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

# the practical rows of `tritonrt bench --matrix` (src/pq/matrix.rs)
PRACTICAL_ROWS = "practical-m2b6,practical-m2b8,practical-m4b8,practical-large"


def load_inputs(path):
    with safe_open(path, "pt", device="cuda") as f:
        meta = f.metadata()
        t = {k: f.get_tensor(k) for k in f.keys()}
    S, first = int(meta["seq_len"]), int(meta["key_first"])
    B, H_kv, _, D = t["key_tail"].shape
    key = torch.zeros(B, H_kv, S, D, dtype=t["key_tail"].dtype, device="cuda")
    key[:, :, first:, :] = t["key_tail"]
    cfg = {k: int(meta[k]) for k in ("sink_size", "window_size", "heavy_size", "init_offset")}
    # stored as f32 holding values already rounded to the input dtype: the cast is exact
    dt = DTYPES[meta.get("input_dtype", "fp32")]
    return t["query"].to(dt), key.to(dt), t["pq_centroids"], t["pq_codebook"], meta["metric"], cfg


class TritonStep:
    """Our fused select kernel launched through Triton's Python launcher, on the
    runtime's state layout (u8 codes [B, H_kv, M, cap]); the same default variant
    tritonrt uses."""

    CHUNK, K_PAD, NCB, NUM_WARPS = 8192, 128, 8, 8

    def __init__(self, query, key, centroids, codebook, metric, cfg):
        B, H, _, D = query.shape
        H_kv, S = key.shape[1], key.shape[2]
        M, K = centroids.shape[2], centroids.shape[3]
        self.n_old = codebook.shape[1]
        n = S - cfg["init_offset"]
        cap = (n + 15) // 16 * 16
        self.codes = torch.zeros(B, H_kv, M, cap, dtype=torch.uint8, device="cuda")
        self.codes[..., : self.n_old] = codebook.permute(0, 2, 3, 1).to(torch.uint8)
        n_chunks = (n + self.CHUNK - 1) // self.CHUNK
        ctas = B * H * n_chunks
        self.lut = torch.empty(ctas * M * K, dtype=torch.float32, device="cuda")
        self.stage = torch.empty(ctas * 2 * self.K_PAD, dtype=torch.int64, device="cuda")
        self.cand = torch.empty(ctas * self.K_PAD, dtype=torch.int64, device="cuda")
        self.count = torch.zeros(B * H, dtype=torch.int32, device="cuda")
        total = min(cfg["sink_size"], S) + min(cfg["heavy_size"], n) + min(cfg["window_size"], S)
        self.sl = torch.empty(B, H, total, dtype=torch.int64, device="cuda")
        self.len = torch.empty(B, H, dtype=torch.int64, device="cuda")
        self.w = torch.empty(B, H, S, dtype=query.dtype, device="cuda")
        self.phi = torch.zeros(1, dtype=torch.float32, device="cuda")
        self.args = (query, key, centroids, self.phi, self.codes, self.lut, self.stage, self.cand, self.count,
                     self.sl, self.len, self.w, H * D, D, H_kv * S * D, S * D, D, H, H // H_kv, M, K, D // M, S,
                     self.n_old, cap, cfg["sink_size"], cfg["window_size"], cfg["heavy_size"], cfg["init_offset"],
                     int(metric == "ip"))
        self.grid = (n_chunks, B * H)

    def __call__(self):
        pq_select_kernel[self.grid](*self.args, CHUNK=self.CHUNK, K_PAD=self.K_PAD, NCB=self.NCB,
                                    BLOCK_C=64, BLOCK_DS=32, BLK=32, num_warps=self.NUM_WARPS, num_stages=1)
        return self.sl, self.len, self.w


class IndexStep:
    """The kernels tritonrt's indexed step runs (``pq_index``, and ``pq_wfill`` before it
    as its programmatic dependent where tritonrt launches one), through Triton's Python
    launcher, on the runtime's state layout; the fill choice and bucket capacity are the
    Rust indexer's (src/pq/plan.rs: companion fill when every CTA has an SM of its own
    and a row's weights are at most 128 KiB; src/pq/state.rs: ``capc = 2 cdiv(cap,
    4096) + 16``). Query dtype = weight dtype and M <= 2 only (where tritonrt builds
    ``pq_index``)."""

    COMPANION_FILL_MAX_BYTES = 128 * 1024

    def __init__(self, query, key, centroids, codebook, metric, cfg):
        B, H, _, D = query.shape
        H_kv, S = key.shape[1], key.shape[2]
        M, K = centroids.shape[2], centroids.shape[3]
        assert M <= 2, "pq_index is built for M <= 2"
        self.n_old = codebook.shape[1]
        n = S - cfg["init_offset"]
        cap = (n + 15) // 16 * 16
        rows = B * H
        nc = HIST_FIXED["NC"]
        capc = 2 * -(-cap // nc) + 16
        self.codes = torch.zeros(B, H_kv, M, cap, dtype=torch.uint8, device="cuda")
        self.codes[..., : self.n_old] = codebook.permute(0, 2, 3, 1).to(torch.uint8)
        z32 = lambda *shape: torch.zeros(*shape, dtype=torch.int32, device="cuda")  # noqa: E731
        self.hist, self.histn = z32(rows, nc), z32(rows)
        self.bkt, self.mark, self.ready = z32(rows, nc, capc), z32(rows, INDEX_FIXED["TP"]), z32(rows)
        self.lut = torch.zeros(rows * M * K, dtype=torch.float32, device="cuda")
        total = min(cfg["sink_size"], S) + min(cfg["heavy_size"], n) + min(cfg["window_size"], S)
        self.sl = torch.empty(B, H, total, dtype=torch.int64, device="cuda")
        self.len = torch.empty(B, H, dtype=torch.int64, device="cuda")
        self.w = torch.empty(B, H, S, dtype=query.dtype, device="cuda")
        self.phi = torch.zeros(1, dtype=torch.float32, device="cuda")
        props = torch.cuda.get_device_properties(0)
        self.sms = props.multi_processor_count
        self.companion = 2 * rows <= self.sms and S * self.w.element_size() <= self.COMPANION_FILL_MAX_BYTES
        self.fill_args = (self.w, rows, S, cfg["sink_size"], cfg["window_size"])
        self.args = (query, key, centroids, self.phi, self.codes, self.hist, self.histn, self.lut, self.bkt,
                     self.mark, self.ready, self.sl, self.len, self.w, H * D, D, H_kv * S * D, S * D, D, H,
                     H // H_kv, M, K, K.bit_length() - 1, D // M, S, self.n_old, cap, capc, cfg["sink_size"],
                     cfg["window_size"], cfg["heavy_size"], cfg["init_offset"], int(metric == "ip"),
                     int(self.companion))
        self.grid = (rows, 2)
        self.carved = False

    def __call__(self):
        extra = {}
        if not self.companion:
            fk = pq_wfill_kernel[(self.sms, )](*self.fill_args, FT=2048, TRIGGER=1, num_warps=4)
            if not self.carved:
                prefer_shared_carveout(fk)
                self.carved = True
            extra["launch_pdl"] = True
        pq_index_kernel[self.grid](*self.args, MP=2, TILE=4096, **dict(INDEX_FIXED, PDL=1), num_warps=8,
                                   num_stages=1, maxnreg=INDEX_MAXNREG, **extra)
        return self.sl, self.len, self.w


def time_fn(fn, steps):
    """(median wall us, median GPU us) per step, as `tritonrt bench` times its own: a
    wall-clock loop (host timer around step + synchronize, no events in it), then a loop
    with CUDA events around each step."""
    for _ in range(max(3, steps // 10)):
        fn()
    torch.cuda.synchronize()
    wall, gpu = [], []
    for _ in range(steps):
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        wall.append((time.perf_counter() - t) * 1e6)
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(steps):
        e0.record()
        fn()
        e1.record()
        torch.cuda.synchronize()
        gpu.append(e0.elapsed_time(e1) * 1e3)
    return statistics.median(wall), statistics.median(gpu)


def heavy_ok(ref_scores, sl, cfg, S):
    """The spec's rule on the heavy part: every chosen score >= every unchosen candidate's
    minus 1e-4 (1 + |score|); ref_scores [B, H, n] fp32 recomputed by the reference."""
    io, win = cfg["init_offset"], min(cfg["window_size"], S)
    w0 = max(0, S - win - io)
    cand = ref_scores[:, :, :w0]
    chosen = heavy_chosen(sl, S, io, w0, cfg["sink_size"], cfg["window_size"])
    lo = torch.where(chosen, cand, torch.inf).amin(-1)
    hi = torch.where(chosen, -torch.inf, cand).amax(-1)
    return bool((lo >= hi - 1e-4 * (1 + hi.abs())).all())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tritonrt", default=os.path.join(HERE, "..", "target", "release", "tritonrt"))
    ap.add_argument("--out", default="bench_out")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--seq-lens", default="4096,8192,16384,32000,65536,131072")
    ap.add_argument("--no-large", action="store_true", help="skip the large workload (B=4, S=131072)")
    ap.add_argument("--no-practical", action="store_true",
                    help="skip the spec's practical workloads (tritonrt bench --matrix rows " + PRACTICAL_ROWS + ")")
    ap.add_argument("--inputs-dir", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "tritonrt_bench_inputs"),
                    help="where tritonrt bench writes each shape's inputs (large: ~0.3 GB)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    inputs_dir = a.inputs_dir

    runs = [("reference", a.seq_lens)] + ([] if a.no_large else [("large", "131072")])
    rust = []
    for workload, lens in runs:
        js = os.path.join(inputs_dir, f"rust_{workload}.json")
        cmd = [a.tritonrt, "bench", "--workload", workload, "--seq-lens", lens, "--steps", str(a.steps),
               "--json", js, "--save-inputs", os.path.join(inputs_dir, workload)]
        print("$", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)
        rust += [dict(r, workload=workload) for r in json.load(open(js))]

    practical = []
    if not a.no_practical:
        js = os.path.join(inputs_dir, "rust_practical.json")
        cmd = [a.tritonrt, "bench", "--matrix", "--matrix-rows", PRACTICAL_ROWS, "--steps", str(a.steps),
               "--json", js, "--save-inputs", os.path.join(inputs_dir, "practical")]
        print("$", " ".join(cmd), flush=True)
        # exit code 1: a row failed its check (printed above); the rows still come back
        subprocess.run(cmd, check=False)
        practical = json.load(open(js))

    rows = []
    for r in practical:
        name, S = r["name"], r["s"]
        path = os.path.join(inputs_dir, "practical", f"{name}.safetensors")
        q, k, c, cb, metric, cfg = load_inputs(path)
        eager = lambda: reference.indexer_step(q, k, c, cb, None, metric=metric, **cfg)  # noqa: E731
        impls = {}
        if r.get("refused") or r.get("error"):
            why = r.get("refused") or r.get("error")
            print(f"{name}: tritonrt {'refused' if r.get('refused') else 'FAILED'}: {why}")
        else:
            impls["tritonrt launch (Rust)"] = (r["launch_wall_us"], r["launch_gpu_us"], r["check_passed"])
            impls["tritonrt graph (Rust)"] = (r["graph_wall_us"], r["graph_gpu_us"], r["check_passed"])
        impls["reference.py eager"] = time_fn(eager, a.steps) + (None, )
        try:
            eager()
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                eager()
            impls["reference.py + torch graph"] = time_fn(g.replay, a.steps) + (None, )
            del g
        except Exception as e:  # noqa: BLE001 (report and go on: the eager row stands)
            print(f"{name}: reference.py not capturable in a CUDA graph: {e}")
        torch.cuda.empty_cache()
        for label, (wall, gpu, ok) in impls.items():
            rows.append(dict(workload=name, b=r["b"], s=S, impl=label, wall_us=wall, gpu_us=gpu,
                             floor_us=r.get("floor_us"), check=ok, m=r["m"], bits=r["bits"], heavy=r["heavy"],
                             state_bytes=r.get("state_bytes")))

    for r in rust:
        S = r["s"]
        path = os.path.join(inputs_dir, r["workload"], f"bench_S{S}.safetensors")
        q, k, c, cb, metric, cfg = load_inputs(path)
        eager = lambda: reference.indexer_step(q, k, c, cb, None, metric=metric, **cfg)  # noqa: E731
        sl_ref, _, w_ref, cb_new = eager()
        B, H, _, D = q.shape
        M = c.shape[2]
        n = S - cfg["init_offset"]
        lut = torch.einsum("bgmkd,bgimd->bgimk", c[..., : D // M].float(),
                           q.float().reshape(B, k.shape[1], H // k.shape[1], M, D // M))
        codes = cb_new.permute(0, 2, 3, 1)
        sc = torch.gather(lut, 4, codes[:, :, None].expand(-1, -1, H // k.shape[1], -1, -1)).sum(3).reshape(B, H, n)
        impls = {
            "tritonrt launch (Rust)": (r["launch_wall_us"], r["launch_gpu_us"], None),
            "tritonrt graph (Rust)": (r["graph_wall_us"], r["graph_gpu_us"], None),
            "reference.py eager": time_fn(eager, a.steps) + (None, ),
        }
        for label, cls in (("pq_index", IndexStep), ("pq_select", TritonStep)):
            ts = cls(q, k, c, cb, metric, cfg)
            # correctness of the Triton-launcher step against the reference's scores (poisoned first)
            ts.sl.fill_(-7)
            ts.w.fill_(7)
            sl, ln, w = ts()
            torch.cuda.synchronize()
            ok = heavy_ok(sc, sl, cfg, S) and bool((ln == sl_ref.shape[-1]).all()) and \
                bool((w.float().sum(-1) == w_ref.float().sum(-1)).all())
            g = torch.cuda.CUDAGraph()
            torch.cuda.synchronize()
            with torch.cuda.graph(g):
                ts()
            impls[f"Triton launcher, {label} (Python)"] = time_fn(ts, a.steps) + (ok, )
            impls[f"Triton launcher, {label} + torch graph"] = time_fn(g.replay, a.steps) + (ok, )
            del g, ts
            torch.cuda.empty_cache()
        for name, (wall, gpu, ok) in impls.items():
            rows.append(dict(workload=r["workload"], b=r["b"], s=S, impl=name, wall_us=wall, gpu_us=gpu,
                             floor_us=r["floor_us"], check=ok))

    dev = torch.cuda.get_device_name()
    json.dump(rows, open(os.path.join(a.out, "compare.json"), "w"), indent=1)
    bw = (rust or practical)[0]["copy_bandwidth_bytes_per_s"]
    print(f"\n{dev}; copy bandwidth {bw / 1e12:.2f} TB/s; "
          f"medians of {a.steps} steps; wall = host timer around step + sync; gpu = CUDA events")
    print(f"{'workload':<16} {'B':>2} {'S':>7} {'implementation':<40} {'wall us':>9} {'gpu us':>9} {'floor us':>8} "
          f"{'wall/floor':>10} {'gpu/floor':>9}")
    num = lambda v, w, p: f"{v:>{w}.{p}f}" if v is not None else f"{'-':>{w}}"  # noqa: E731
    for x in rows:
        chk = "" if x["check"] is None else ("  check ok" if x["check"] else "  CHECK FAILED")
        fl = x["floor_us"]
        print(f"{x['workload']:<16} {x['b']:>2} {x['s']:>7} {x['impl']:<40} {num(x['wall_us'], 9, 1)} "
              f"{num(x['gpu_us'], 9, 1)} {num(fl, 8, 1)} {num(fl and x['wall_us'] / fl, 10, 1)} "
              f"{num(fl and x['gpu_us'] / fl, 9, 1)}{chk}")
    for r in practical:
        if r.get("refused") or r.get("error"):
            print(f"{r['name']}: tritonrt {'refused' if r.get('refused') else 'FAILED'}: "
                  f"{r.get('refused') or r.get('error')}")

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 5))
    ref_rows = [x for x in rows if x["workload"] == "reference"]
    for name in dict.fromkeys(x["impl"] for x in ref_rows):
        pts = sorted((x["s"], x["wall_us"]) for x in ref_rows if x["impl"] == name)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
    pts = sorted((x["s"], x["floor_us"]) for x in ref_rows if x["impl"] == "tritonrt graph (Rust)")
    ax.plot([p[0] for p in pts], [p[1] for p in pts], "k--", label="memory floor")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length S (B=1, H=32, D=128, M=2, bits=6, heavy=sink=window=128)")
    ax.set_ylabel("wall-clock per step (us, median)")
    ax.set_title(f"PQCache decode step, {dev}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    png = os.path.join(a.out, "step_vs_seqlen.png")
    fig.savefig(png, dpi=120, bbox_inches="tight")
    print("plot written to", png)

    prac = [x for x in rows if x["workload"].startswith("practical")]
    if prac:
        names = list(dict.fromkeys(x["workload"] for x in prac))
        impls = list(dict.fromkeys(x["impl"] for x in prac))
        fig, ax = plt.subplots(figsize=(9, 5))
        width = 0.8 / len(impls)
        for i, impl in enumerate(impls):
            vals = [next((x["wall_us"] for x in prac if x["workload"] == n and x["impl"] == impl), 0) for n in names]
            ax.bar([j + i * width for j in range(len(names))], vals, width, label=impl)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(names))])
        ax.set_xticklabels(names, fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("wall-clock per step (us, median; no bar: refused)")
        ax.set_title(f"PQCache decode step, practical workloads (bf16), {dev}")
        ax.grid(True, axis="y", which="both", alpha=0.3)
        ax.legend(fontsize=8)
        png = os.path.join(a.out, "practical.png")
        fig.savefig(png, dpi=120, bbox_inches="tight")
        print("plot written to", png)
    return 0 if all(x["check"] in (None, True) for x in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
