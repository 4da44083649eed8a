#!/usr/bin/env python3
"""Compatibility suite (needs an NVIDIA GPU, torch and triton==3.6.0): every kernel of
kernels.py is compiled by Triton's JIT and run by Triton's launcher on seeded inputs; then
its Triton cache entry is given to `tritonrt import` and launched by `tritonrt launch` on the
same inputs (bit-identical outputs expected where the kernel is deterministic), and the
variant `tritonrt build` made of the same source (spec.json, no JIT involved) is launched
too. Prints one line per (case, path) and writes a JSON table.

    python3 tests/compat/run.py --tritonrt target/release/tritonrt \\
        --build-cache BUILT_PTX_CACHE --work /tmp/compat [--json results.json]

BUILT_PTX_CACHE comes from `tritonrt build tests/compat/kernels.py --spec
tests/compat/spec.json --out BUILT_PTX_CACHE` (no GPU needed).
"""
import argparse
import json
import os
import re
import statistics
import struct
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))

ST_NAMES = None  # filled in main (needs torch)


def st_save(path, tensors):
    """Write a safetensors file of CPU copies of `tensors` (name -> torch tensor)."""
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        raw = t.reshape(-1).view(__import__("torch").uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": ST_NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def st_load(path):
    import torch
    inv = {v: k for k, v in ST_NAMES.items()}
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        s, t = e["data_offsets"]
        raw = bytearray(data[8 + n + s:8 + n + t])
        u8 = torch.frombuffer(raw, dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
        out[name] = u8.view(inv[e["dtype"]]).reshape(e["shape"])
    return out


def sh(cmd, log):
    """Run a command; return (rc, stdout+stderr)."""
    p = subprocess.run(cmd, capture_output=True, text=True)
    text = p.stdout + p.stderr
    log.write("$ " + " ".join(cmd) + "\n" + text + "\n")
    log.flush()
    return p.returncode, text


def make_cases():
    import torch
    import kernels as K
    from triton.tools.tensor_descriptor import TensorDescriptor

    dev = "cuda"
    cases = []

    def case(name, fn, grid, jit_args, jit_kw, named, outputs, exact=True, timing=False, extra_build_ids=()):
        cases.append(dict(name=name, fn=fn, grid=grid, jit_args=jit_args, jit_kw=jit_kw, named=named,
                          outputs=outputs, exact=exact, timing=timing, extra_build_ids=extra_build_ids))

    i32 = lambda v: torch.tensor(v, dtype=torch.int32)  # noqa: E731
    g = torch.Generator(device=dev).manual_seed(0)

    n = 1 << 20
    x, y = torch.randn(n, device=dev, generator=g), torch.randn(n, device=dev, generator=g)
    out = torch.zeros(n, device=dev)
    case("vector add", K.cp_vadd, (n // 1024, 1, 1), [x, y, out, n], dict(BLOCK=1024),
         dict(x_ptr=x, y_ptr=y, out_ptr=out, n=i32(n)), ["out_ptr"], timing=True,
         extra_build_ids=("cp_vadd.BLOCK=1024.w4.s3.sm80", ))

    rows, cols = 512, 1000
    a = torch.randn(rows, cols, device=dev, generator=g)
    o = torch.zeros(rows, cols, device=dev)
    case("row softmax", K.cp_softmax, (rows, 1, 1), [o, a, a.stride(0), o.stride(0), cols], dict(BLOCK=1024),
         dict(out_ptr=o, in_ptr=a, in_stride=i32(a.stride(0)), out_stride=i32(o.stride(0)), n_cols=i32(cols)),
         ["out_ptr"])

    M = N = K_ = 1024
    A = torch.randn(M, K_, device=dev, generator=g).half()
    B = torch.randn(K_, N, device=dev, generator=g).half()
    C = torch.zeros(M, N, device=dev)
    case("matmul tl.dot (wgmma, 96 KB smem)", K.cp_matmul, (M // 128, N // 128, 1),
         [A, B, C, M, N, K_, A.stride(0), A.stride(1), B.stride(0), B.stride(1), C.stride(0), C.stride(1)],
         dict(BM=128, BN=128, BK=64, num_warps=8, num_stages=3),
         dict(a_ptr=A, b_ptr=B, c_ptr=C, M=i32(M), N=i32(N), K=i32(K_), sam=i32(A.stride(0)), sbk=i32(B.stride(0)),
              scm=i32(C.stride(0))), ["c_ptr"], timing=True)

    R, Nc = 256, 1000
    xl = torch.randn(R, Nc, device=dev, generator=g)
    w, b = torch.randn(Nc, device=dev, generator=g), torch.randn(Nc, device=dev, generator=g)
    yl, mean, rstd = torch.zeros(R, Nc, device=dev), torch.zeros(R, device=dev), torch.zeros(R, device=dev)
    case("layer norm, 3 outputs", K.cp_layernorm, (R, 1, 1), [xl, w, b, yl, mean, rstd, xl.stride(0), Nc, 1e-5],
         dict(BLOCK=1024),
         dict(x_ptr=xl, w_ptr=w, b_ptr=b, y_ptr=yl, mean_ptr=mean, rstd_ptr=rstd, stride=i32(xl.stride(0)),
              N=i32(Nc), eps=torch.tensor(1e-5, dtype=torch.float32)), ["y_ptr", "mean_ptr", "rstd_ptr"])

    Md, Nd = 512, 256
    src = torch.randn(Md, Nd, device=dev, generator=g).half()
    dst = torch.zeros(Md, Nd, device=dev, dtype=torch.float16)
    case("device-side tensor descriptors", K.cp_devdesc, (Md // 64, Nd // 64, 1), [src, dst, Md, Nd],
         dict(BM=64, BN=64), dict(in_ptr=src, out_ptr=dst, M=i32(Md), N=i32(Nd)), ["out_ptr"])

    src2 = torch.randn(Md, Nd, device=dev, generator=g).half()
    dst2 = torch.zeros(Md, Nd, device=dev, dtype=torch.float16)
    case("host TensorDescriptor (TMA)", K.cp_hostdesc, (Md // 64, Nd // 64, 1),
         [TensorDescriptor.from_tensor(src2, [64, 64]), TensorDescriptor.from_tensor(dst2, [64, 64]), 1.5],
         dict(M_BLOCK=64, N_BLOCK=64),
         dict(in_desc=src2, out_desc=dst2, scale=torch.tensor(1.5, dtype=torch.float16)), ["out_desc"],
         extra_build_ids=("cp_hostdesc.M_BLOCK=64.N_BLOCK=64.w4.s3.sm80", ))

    na = 100000
    xa = torch.randn(na, device=dev, generator=g)
    of, oi = torch.zeros(16, device=dev), torch.zeros(16, device=dev, dtype=torch.int64)
    big = (1 << 33) + 5
    case("atomics, fp16/bf16/i1/i64 scalars", K.cp_atomics, ((na + 1023) // 1024, 1, 1),
         [of, oi, xa, na, 0.5, -0.25, True, big], dict(BLOCK=1024),
         dict(out_f32_ptr=of, out_i64_ptr=oi, x_ptr=xa, n=i32(na), a=torch.tensor(0.5, dtype=torch.float16),
              b=torch.tensor(-0.25, dtype=torch.bfloat16), flag=torch.tensor(True),
              big=torch.tensor(big, dtype=torch.int64)), ["out_f32_ptr", "out_i64_ptr"], exact=False)

    nc = 1 << 16
    xc, oc = torch.randn(nc, device=dev, generator=g), torch.zeros(nc, device=dev)
    case("2-CTA cluster (num_ctas=2)", K.cp_cluster, (nc // 1024, 1, 1), [xc, oc, nc], dict(BLOCK=1024, num_ctas=2),
         dict(x_ptr=xc, out_ptr=oc, n=i32(nc)), ["out_ptr"])

    xp, op = torch.randn(nc, device=dev, generator=g), torch.zeros(nc, device=dev)
    case("PDL launch (launch_pdl)", K.cp_pdl, (nc // 1024, 1, 1), [xp, op, nc], dict(BLOCK=1024, launch_pdl=True),
         dict(x_ptr=xp, out_ptr=op, n=i32(nc)), ["out_ptr"])

    xk, ok = torch.randn(nc, device=dev, generator=g), torch.zeros(nc, device=dev)
    case("cooperative grid", K.cp_coop, (nc // 1024, 1, 1), [xk, ok, nc],
         dict(BLOCK=1024, launch_cooperative_grid=True), dict(x_ptr=xk, out_ptr=ok, n=i32(nc)), ["out_ptr"])
    return cases


def compare(got, want, exact):
    import torch
    problems = []
    for k, w in want.items():
        if k not in got:
            problems.append(f"{k}: missing")
            continue
        gt = got[k]
        if gt.shape != w.shape or gt.dtype != w.dtype:
            problems.append(f"{k}: {gt.dtype}{list(gt.shape)} vs {w.dtype}{list(w.shape)}")
            continue
        if exact or not w.is_floating_point():
            same = torch.equal(gt.reshape(-1).view(torch.uint8), w.reshape(-1).view(torch.uint8))
            if not same:
                diff = (gt.double() - w.double()).abs().max().item()
                problems.append(f"{k}: not bit-identical (max |diff| {diff:.3g})")
        elif not torch.allclose(gt.double(), w.double(), rtol=1e-5, atol=1e-3):
            problems.append(f"{k}: max |diff| {(gt.double() - w.double()).abs().max().item():.3g}")
    return problems


def jit_median_us(c, reps=50):
    import torch
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn = c["fn"]
    ts = []
    for _ in range(reps):
        s.record()
        fn[c["grid"]](*c["jit_args"], **c["jit_kw"])
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e) * 1e3)
    return statistics.median(ts)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tritonrt", required=True)
    ap.add_argument("--build-cache", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--json", default=None)
    ap.add_argument("--log", default=None)
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    os.environ["TRITON_CACHE_DIR"] = os.path.join(args.work, "triton_cache")
    os.environ["TRITONRT_CACHE_DIR"] = os.path.join(args.work, "cubins")
    sys.path.insert(0, HERE)
    import torch
    import triton
    global ST_NAMES
    ST_NAMES = {torch.float16: "F16", torch.bfloat16: "BF16", torch.float32: "F32", torch.float64: "F64",
                torch.int8: "I8", torch.int16: "I16", torch.int32: "I32", torch.int64: "I64", torch.uint8: "U8",
                torch.bool: "BOOL"}
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    log = open(args.log or os.path.join(args.work, "compat.log"), "w")
    print(f"triton {triton.__version__}, torch {torch.__version__}, {torch.cuda.get_device_name()}", flush=True)
    pc_import = os.path.join(args.work, "pc_import")
    rows = []
    for i, c in enumerate(make_cases()):
        name, fn = c["name"], c["fn"]
        d = os.path.join(args.work, f"case{i}")
        os.makedirs(d, exist_ok=True)
        row = {"case": name, "kernel": fn.__name__}
        rows.append(row)
        try:
            inputs = {k: v.detach().cpu().clone() for k, v in c["named"].items()}
            st_save(os.path.join(d, "in.safetensors"), inputs)
            fn[c["grid"]](*c["jit_args"], **c["jit_kw"])
            torch.cuda.synchronize()
            want = {o: c["named"][o].detach().cpu().clone() for o in c["outputs"]}
            st_save(os.path.join(d, "expected.safetensors"), want)
            row["jit"] = "ok"
        except Exception as e:  # noqa: BLE001 - a case that Triton itself cannot run is reported
            row["jit"] = f"FAILED: {type(e).__name__}: {str(e)[:300]}"
            print(f"{name}: Triton JIT {row['jit']}", flush=True)
            continue
        entries = []
        cache = os.environ["TRITON_CACHE_DIR"]
        for h in os.listdir(cache):
            p = os.path.join(cache, h, fn.__name__ + ".json")
            if os.path.exists(p):
                entries.append((os.path.getmtime(p), os.path.join(cache, h)))
        entry = max(entries)[1]
        grid = ",".join(str(x) for x in c["grid"])
        launch_common = ["--inputs", os.path.join(d, "in.safetensors"), "--grid", grid, "--outputs",
                         ",".join(c["outputs"])]
        rc, text = sh([args.tritonrt, "import", entry, "--ptx-cache", pc_import], log)
        m = re.search(r"(?:imported|already present:) (\S+)", text)
        if rc != 0 or not m:
            row["import"] = "FAILED: " + text.strip().splitlines()[-1][:300] if text.strip() else f"rc {rc}"
        else:
            vid = m.group(1)
            row["import_variant"] = vid
            row["signature"] = next((l[len("signature: "):] for l in text.splitlines() if l.startswith("signature: ")),
                                    "")
            out = os.path.join(d, "out_import.safetensors")
            extra = ["--repeat", "50"] if c["timing"] else []
            rc, text = sh([args.tritonrt, "launch", vid, "--ptx-cache", pc_import, *launch_common, "--out", out,
                           *extra], log)
            if rc != 0:
                row["import"] = "launch FAILED: " + " | ".join(text.strip().splitlines()[-2:])[:400]
            else:
                p = compare(st_load(out), want, c["exact"])
                row["import"] = "identical" if not p and c["exact"] else ("close" if not p else "; ".join(p))
                t = re.search(r"median ([\d.]+) us", text)
                if t:
                    row["tritonrt_us"] = float(t.group(1))
                    row["triton_jit_us"] = round(jit_median_us(c), 2)
        for tag, target in [("build", fn.__name__)] + [(f"build {x.split('.')[-1]}", x) for x in c["extra_build_ids"]]:
            out = os.path.join(d, f"out_{tag.replace(' ', '_')}.safetensors")
            rc, text = sh([args.tritonrt, "launch", target, "--ptx-cache", args.build_cache, *launch_common, "--out",
                           out], log)
            if rc != 0:
                row[tag] = "launch FAILED: " + " | ".join(text.strip().splitlines()[-2:])[:400]
            else:
                p = compare(st_load(out), want, c["exact"])
                row[tag] = "identical" if not p and c["exact"] else ("close" if not p else "; ".join(p))
        print(json.dumps(row), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    def passed(r):
        paths = [k for k in r if k == "import" or k.startswith("build")]
        return r.get("jit") == "ok" and paths and all(r[k] in ("identical", "close") for k in paths)
    bad = [r for r in rows if not passed(r)]
    print(f"compat: {len(rows) - len(bad)}/{len(rows)} cases pass on every path", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    t0 = time.time()
    rc = main()
    print(f"compat: {time.time() - t0:.0f} s")
    sys.exit(rc)
