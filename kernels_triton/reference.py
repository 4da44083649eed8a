"""The PQCache decode-step indexer in plain PyTorch, following spec/pqcache-indexer.md.

Upstream layouts in and out: query [B, H, 1, D], key [B, H_kv, S, D] (same dtype),
centroids [B, H_kv, M, K, d_c] fp32, codebook int64 [B, N_cached, H_kv, M], phi fp32
[B * H_kv * M] (metric ip only). Returns sparse_list int64 [B, H, total], sparse_len
int64 [B, H], weight_list [B, H, S] (weight dtype, default the query's) and the updated
codebook [B, n, H_kv, M].

Used as the oracle of `compare_outputs.py`, as the PyTorch-eager baseline of
`benches/compare.py`, and from the command line:

    python3 kernels_triton/reference.py in.safetensors out.safetensors

(tensors `query`, `key`, `pq_centroids`, `pq_codebook`, optional `pq_ip2l2_phi`; the
config from `__metadata__`: sink_size, window_size, heavy_size, init_offset,
pq_group_factor, pq_bits, metric, optional weight_dtype). sink_size, window_size and
heavy_size may be ratios of S, written with a decimal point ("0.1": int(0.1 * S), as
upstream; spec "Sizes given as ratios").
"""

import sys

import torch


def quantize(x, centroids, phi_bg, metric):
    """Codes (int64 [B, H_kv, T, M]) of keys x [B, H_kv, T, D]: argmin over the K
    centroids of each subvector, lowest index on ties (torch.argmin returns the first)."""
    B, H_kv, T, D = x.shape
    M, K, d_c = centroids.shape[2], centroids.shape[3], centroids.shape[4]
    d_s = D // M
    xs = x.float().reshape(B, H_kv, T, M, d_s)
    c = centroids.float()
    if metric == "ip":
        # extend each subvector by sqrt(max(0, phi - |x_m|^2)) and use all d_s + 1 coords
        aug = torch.sqrt(torch.clamp(phi_bg.view(B, H_kv, 1, M) - (xs * xs).sum(-1), min=0.0))
        xs = torch.cat([xs, aug[..., None]], dim=-1)
    else:
        c = c[..., :d_s]
    diff = xs[:, :, :, :, None, :] - c[:, :, None, :, :, :]  # [B, H_kv, T, M, K, d]
    dist = (diff * diff).sum(-1)
    return dist.argmin(dim=-1)


def indexer_step(query, key, centroids, codebook, phi=None, *, sink_size, window_size, heavy_size,
                 init_offset, metric="euclidean", weight_dtype=None):
    """One decode step of the indexer (spec steps 0-5). See the module docstring."""
    B, H, _, D = query.shape
    H_kv, S = key.shape[1], key.shape[2]
    M, K = centroids.shape[2], centroids.shape[3]
    d_s = D // M
    G = H // H_kv
    dev = query.device
    wdt = weight_dtype or query.dtype
    n_cached = codebook.shape[1]

    # sizes given as ratios of S (floats) resolve at this S, as upstream: int(value * S)
    sink_size, window_size, heavy_size = (
        int(v * S) if isinstance(v, float) else int(v) for v in (sink_size, window_size, heavy_size))

    # 0. short sequences: everything
    if S <= heavy_size + init_offset + 1 + K:
        sl = torch.arange(S, device=dev, dtype=torch.int64).expand(B, H, S).contiguous()
        return (sl, torch.full((B, H), S, dtype=torch.int64, device=dev),
                torch.ones(B, H, S, dtype=wdt, device=dev), codebook)

    # 1. quantize the new keys
    n = S - init_offset
    if n > n_cached:
        x = key[:, :, init_offset + n_cached:S, :]
        new = quantize(x, centroids, phi, metric)  # [B, H_kv, T, M]
        codebook = torch.cat([codebook, new.permute(0, 2, 1, 3).to(torch.int64)], dim=1)

    # 2. score through the lookup table lut[b, g, i, m, c] = <q_m, centroids[b,g,m,c,:d_s]>
    q = query.float().reshape(B, H_kv, G, M, d_s)
    lut = torch.einsum("bgmkd,bgimd->bgimk", centroids[..., :d_s].float(), q)  # [B, H_kv, G, M, K]
    codes = codebook[:, :n].permute(0, 2, 3, 1)  # [B, H_kv, M, n]
    idx = codes[:, :, None, :, :].expand(B, H_kv, G, M, n)
    scores = torch.gather(lut, 4, idx).sum(3).reshape(B, H, n)  # [B, H, n]

    # 3. mask, 4. select
    sink = min(sink_size, S)
    win = min(window_size, S)
    w0 = max(0, S - win - init_offset)
    k = min(heavy_size, n)
    if w0 >= k:
        heavy = torch.topk(scores[:, :, :w0], k, dim=-1).indices
    else:  # every candidate, then the lowest masked j
        heavy = torch.arange(k, device=dev, dtype=torch.int64).expand(B, H, k)
    heavy = heavy.to(torch.int64) + init_offset

    # 5. emit
    sinks = torch.arange(sink, device=dev, dtype=torch.int64).expand(B, H, sink)
    window = torch.arange(S - win, S, device=dev, dtype=torch.int64).expand(B, H, win)
    sl = torch.sort(torch.cat([sinks, heavy, window], dim=-1), dim=-1).values
    total = sl.shape[-1]
    weight = torch.zeros(B, H, S, dtype=wdt, device=dev)
    weight.scatter_(2, sl, 1.0)
    sparse_len = torch.full((B, H), total, dtype=torch.int64, device=dev)
    return sl, sparse_len, weight, codebook


_DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16,
           "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16}


def main(argv):
    from safetensors import safe_open
    from safetensors.torch import save_file

    if len(argv) != 3:
        print(__doc__)
        return 2
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    with safe_open(argv[1], "pt", device=dev) as f:
        meta = f.metadata() or {}
        t = {k: f.get_tensor(k) for k in f.keys()}
    def size(v):  # "0.1" (a decimal point or an exponent) is a ratio of S, "128" a count
        return float(v) if any(c in v for c in ".eE") else int(v)

    cfg = {k: size(meta[k]) for k in ("sink_size", "window_size", "heavy_size")}
    cfg["init_offset"] = int(meta["init_offset"])
    wd = _DTYPES.get(meta.get("weight_dtype", ""), None)
    sl, ln, w, cb = indexer_step(t["query"], t["key"], t["pq_centroids"], t["pq_codebook"],
                                 t.get("pq_ip2l2_phi"), metric=meta.get("metric", "euclidean"),
                                 weight_dtype=wd, **cfg)
    save_file({"sparse_list": sl.contiguous(), "sparse_len": ln.contiguous(), "weight_list": w.contiguous(),
               "pq_codebook": cb.contiguous()}, argv[2])
    print(f"wrote {argv[2]}: sparse_list {list(sl.shape)}, weight_list {list(w.shape)} {w.dtype}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
