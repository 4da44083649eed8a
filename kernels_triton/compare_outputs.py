"""Compare two indexer output files (safetensors: sparse_list, sparse_len, weight_list,
pq_codebook) produced from the same input file, e.g. `tritonrt run --input in --output a`
and `python3 kernels_triton/reference.py in b`.

    python3 kernels_triton/compare_outputs.py in.safetensors a.safetensors b.safetensors [--exact]

Checks, per the spec's "what counts as the same answer": equal shapes, sparse_len and
updated codes; sink and window parts exact; sparse_list ascending and weight_list equal to
the indicator of sparse_list; and the heavy sets: identical with --exact (well-separated
inputs), otherwise every chosen score >= every unchosen candidate's minus
1e-4 * (1 + |score|), scores recomputed in float64 from the codes. Exit 0 when both pass.
"""

import sys

import torch
from safetensors import safe_open


def load(path):
    with safe_open(path, "pt", device="cpu") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, (f.metadata() or {})


def scores_f64(inp, meta, codes):
    q = inp["query"].double()
    c = inp["pq_centroids"].double()
    B, H, _, D = q.shape
    H_kv, M = c.shape[1], c.shape[2]
    d_s = D // M
    G = H // H_kv
    lut = torch.einsum("bgmkd,bgimd->bgimk", c[..., :d_s], q.reshape(B, H_kv, G, M, d_s))
    n = codes.shape[1]
    idx = codes.permute(0, 2, 3, 1)[:, :, None].expand(B, H_kv, G, M, n)
    return torch.gather(lut, 4, idx).sum(3).reshape(B, H, n)


def check(inp, meta, out, exact):
    errs = []
    S = inp["key"].shape[2]
    sink, win, heavy, io = (int(meta[k]) for k in ("sink_size", "window_size", "heavy_size", "init_offset"))
    sl, w = out["sparse_list"], out["weight_list"].float()
    if not bool((sl[..., 1:] >= sl[..., :-1]).all()):
        errs.append("sparse_list not ascending")
    ind = torch.zeros_like(w)
    ind.scatter_(2, sl, 1.0)
    if not torch.equal(ind, w):
        errs.append("weight_list is not the indicator of sparse_list")
    K = inp["pq_centroids"].shape[3]
    if S <= heavy + io + 1 + K:
        return errs, None
    n = S - io
    s_, w_ = min(sink, S), min(win, S)
    w0 = max(0, S - w_ - io)
    k = min(heavy, n)
    if not bool((ind[..., :s_] == 1).all()):
        errs.append("a sink position is missing")
    if not bool((ind[..., S - w_:] == 1).all()):
        errs.append("a window position is missing")
    if sl.shape[-1] != s_ + k + w_:
        errs.append(f"total {sl.shape[-1]} != sink {s_} + k {k} + window {w_}")
    return errs, (n, w0, k)


def heavy_chosen(sl, S, io, w0, sink, window):
    """bool [B, H, w0]: which candidates j < w0 a sparse_list [B, H, total] chose as heavy
    hitters. Positions are counted, and the one occurrence the sink (p < sink') and the
    window (p >= S - window') each contribute is taken off, so a heavy hitter that
    duplicates a sink position (init_offset < sink) still counts, and a sink position
    that is no heavy hitter does not."""
    s_, w_ = min(sink, S), min(window, S)
    counts = torch.zeros(*sl.shape[:2], S, dtype=torch.int64, device=sl.device)
    counts.scatter_add_(2, sl, torch.ones_like(sl))
    p = torch.arange(S, device=sl.device)
    counts -= (p < s_).to(torch.int64) + (p >= S - w_).to(torch.int64)
    return counts[:, :, io:io + w0] > 0


def heavy_sets(out, meta, S, w0):
    io = int(meta["init_offset"])
    return heavy_chosen(out["sparse_list"], S, io, w0, int(meta["sink_size"]), int(meta["window_size"]))


def main(argv):
    exact = "--exact" in argv
    args = [a for a in argv[1:] if a != "--exact"]
    if len(args) != 3:
        print(__doc__)
        return 2
    inp, meta = load(args[0])
    a, _ = load(args[1])
    b, _ = load(args[2])
    errs = []
    for name in ("sparse_list", "sparse_len", "weight_list", "pq_codebook"):
        if a[name].shape != b[name].shape:
            errs.append(f"{name}: shapes {list(a[name].shape)} vs {list(b[name].shape)}")
    if errs:
        print("FAIL:", "; ".join(errs))
        return 1
    for name in ("sparse_len", "pq_codebook"):
        if not torch.equal(a[name], b[name]):
            errs.append(f"{name} differs ({int((a[name] != b[name]).sum())} entries)")
    info = None
    for tag, out in (("a", a), ("b", b)):
        e, info = check(inp, meta, out, exact)
        errs += [f"{tag}: {x}" for x in e]
    if info is not None:
        n, w0, k = info
        S = inp["key"].shape[2]
        sc = scores_f64(inp, meta, a["pq_codebook"])[:, :, :w0]
        for tag, out in (("a", a), ("b", b)):
            ch = heavy_sets(out, meta, S, w0)
            lo = torch.where(ch, sc, torch.inf).amin(-1)
            hi = torch.where(ch, -torch.inf, sc).amax(-1)
            bad = int((lo < hi - 1e-4 * (1 + hi.abs())).sum())
            if bad:
                errs.append(f"{tag}: {bad} rows choose a heavy set below an unchosen candidate")
        if exact and not torch.equal(heavy_sets(a, meta, S, w0), heavy_sets(b, meta, S, w0)):
            errs.append("heavy sets differ (--exact)")
        if exact and not torch.equal(a["sparse_list"], b["sparse_list"]):
            errs.append("sparse_list differs (--exact)")
    if errs:
        print("FAIL:", "; ".join(errs))
        return 1
    B, H, total = a["sparse_list"].shape
    print(f"OK: {args[1]} and {args[2]} agree ({'exact' if exact else 'spec rule'}; B={B} H={H} total={total})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
