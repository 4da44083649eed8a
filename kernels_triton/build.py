#!/usr/bin/env python3
"""AOT build: compile every kernel variant declared in kernels_triton/ into ptx_cache/.

    python kernels_triton/build.py            # (re)build ptx_cache/ next to kernels_triton/
    python kernels_triton/build.py --check    # build into a temp dir, compare, exit 1 if stale
    python kernels_triton/build.py --out DIR  # build somewhere else
    python kernels_triton/build.py --user FILE.py --spec SPEC.json --out DIR
                                              # AOT-compile a user's own Triton file
                                              # (what `tritonrt build` runs; see USER_SPEC)
    python kernels_triton/build.py --only pq_kmeans   # recompile one module's kernels,
                                              # keep the others' entries and files

Needs triton==3.6.0 (exactly) and no GPU or driver: it calls the compiler API
(``triton.compile(ASTSource(...), target=GPUTarget("cuda", arch, 32))``) directly,
where Triton's own tools/compile.py would ask a live driver for the target.

For every logical kernel (``KERNELS`` in each kernel module, see kspec.py) and every
variant: arch 80 -> ``.target sm_80`` PTX (portable: JITs on any cc >= 8.0);
arch 90 -> ``.target sm_90a`` PTX plus its cubin. Output, per MANIFEST.md:
``<sha256>.ptx`` / ``<sha256>.cubin`` (named by the sha256 of their own bytes) and
``manifest.json``. Files no variant references are removed.

Deterministic: every worker compiles with a fresh TRITON_CACHE_DIR, with every
TRITON_* / MLIR_* / LLVM_* variable of the caller's environment dropped and
TRITON_DISABLE_LINE_INFO=1 (line info embeds the absolute source path in the PTX and
cubin, which would make the output depend on where the checkout lives). The manifest
has sorted keys and no timestamps or paths. Two builds are byte-identical.
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures as cf
import contextlib
import hashlib
import io
import json
import multiprocessing
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE.parent / "ptx_cache"
TRITON_VERSION = "3.6.0"
SCHEMA_VERSION = 1
HASHED_NAME = re.compile(r"^[0-9a-f]{64}\.(ptx|cubin)$")

# PTX parameter spelling of each Triton type (after `.param`).
PTX_PARAM = {
    "i1": ".u8", "i8": ".u8", "i16": ".u16", "i32": ".u32", "u32": ".u32", "i64": ".u64", "u64": ".u64",
    "fp16": ".b16", "bf16": ".b16", "fp32": ".f32", "fp64": ".f64",
}


# ----------------------------------------------------------------------------------
# discovery


def kernel_modules() -> list[str]:
    """Names of the modules in kernels_triton/ that declare ``KERNELS`` (found by
    reading the text, so modules that need torch are never imported)."""
    mods = []
    for p in sorted(HERE.glob("*.py")):
        if p.name in ("build.py", "kspec.py"):
            continue
        if re.search(r"^KERNELS\s*[:=]", p.read_text(), re.MULTILINE):
            mods.append(p.stem)
    return mods


def local_imports(mod: str) -> set[str]:
    """The modules of kernels_triton/ that ``mod`` imports, directly or through each other
    (read from the source with ``ast``, never imported), ``mod`` included."""
    seen, todo = set(), [mod]
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        for node in ast.walk(ast.parse((HERE / f"{m}.py").read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            todo += [n for n in names if (HERE / f"{n}.py").is_file()]
    return seen


def source_hash(mod: str) -> str:
    """A module's ``source_hash``: the sha256 over its source and that of every module of
    kernels_triton/ it imports (``local_imports``, in name order), so that a change to a
    shared helper makes every kernel built from it stale (``--only``, the tuning table's
    kernel hash), not only the kernels of the module that defines it."""
    h = hashlib.sha256()
    for m in sorted(local_imports(mod)):
        data = (HERE / f"{m}.py").read_bytes()
        h.update(f"{m}.py {len(data)}\n".encode())
        h.update(data)
    return h.hexdigest()


def load_kernels(mods: list[str]):
    """Import the modules and return ``[(module, Kernel), ...]`` after validating each."""
    import importlib
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    out = []
    names = set()
    for m in mods:
        module = importlib.import_module(m)
        for k in module.KERNELS:
            k.validate()
            if k.name in names:
                raise SystemExit(f"error: logical kernel {k.name} declared twice")
            names.add(k.name)
            out.append((m, k))
    return out


def variant_id(kernel, variant, arch) -> str:
    ce = dict(kernel.fixed)
    ce.update(dict(variant.constexprs))
    parts = [kernel.name] + [f"{k}={_fmt(v)}" for k, v in sorted(ce.items())]
    return ".".join(parts) + f".w{variant.num_warps}.s{variant.num_stages}.sm{arch}"


def _fmt(v):
    if isinstance(v, bool):
        return str(int(v))
    return str(v)


def jobs_for(kernels):
    jobs = []
    for mod, k in kernels:
        for arch in sorted(k.variants):
            for vi, v in enumerate(k.variants[arch]):
                jobs.append((mod, k.name, arch, vi, variant_id(k, v, arch)))
    ids = [j[4] for j in jobs]
    if len(set(ids)) != len(ids):
        dup = sorted({i for i in ids if ids.count(i) > 1})
        raise SystemExit(f"error: duplicate variant ids: {dup[:5]}")
    return jobs


# ----------------------------------------------------------------------------------
# worker (runs in a spawned process)

_WORKER_CACHE = {}


def _worker_init(cache_dir: str):
    for key in list(os.environ):
        if key.startswith(("TRITON_", "MLIR_", "LLVM_")):
            del os.environ[key]
    os.environ["TRITON_CACHE_DIR"] = cache_dir
    os.environ["TRITON_DISABLE_LINE_INFO"] = "1"
    os.environ["TRITON_DUMP_PTXAS_LOG"] = "1"
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))


def _find_kernel(mod: str, name: str):
    key = (mod, name)
    if key not in _WORKER_CACHE:
        import importlib
        module = importlib.import_module(mod)
        for k in module.KERNELS:
            _WORKER_CACHE[(mod, k.name)] = k
    return _WORKER_CACHE[key]


def compile_job(job):
    """Compile one (kernel, variant, arch); return what the manifest and files need."""
    mod, name, arch, vi, vid = job
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    k = _find_kernel(mod, name)
    v = k.variants[arch][vi]
    constexprs = dict(k.fixed)
    constexprs.update(dict(v.constexprs))
    # constexprs left out take the signature's default (kspec.Kernel.validate); they are
    # not part of the variant's id or manifest entry
    compiled = dict(constexprs)
    for p in k.fn.params:
        if p.is_constexpr and p.name not in compiled and p.has_default:
            compiled[p.name] = p.default
    arg_types = {a.name: a.type for a in k.args}
    signature = {}
    attrs = {}
    for idx, p in enumerate(k.fn.params):
        if p.is_constexpr:
            signature[p.name] = "constexpr"
        else:
            signature[p.name] = arg_types[p.name]
    for a in k.args:
        if a.div16:
            attrs[(k.fn.arg_names.index(a.name), )] = [["tt.divisibility", 16]]
    src = ASTSource(k.fn, signature, compiled, attrs)
    t0 = time.time()
    log = io.StringIO()
    with contextlib.redirect_stdout(log):
        # a kernel built with the constexpr PDL=1 takes part in a programmatic dependent
        # launch (griddepcontrol): the runtime launches it with that attribute (metadata
        # launch_pdl); one built with the constexpr CLUSTER = c > 1 runs its CTAs in clusters
        # of (c, 1, 1) (distributed shared memory, cluster barriers): the runtime launches it
        # with that cluster (metadata cluster_dims; Triton's own num_ctas stays 1)
        options = {"num_warps": v.num_warps, "num_stages": v.num_stages, "num_ctas": 1,
                   "launch_pdl": compiled.get("PDL") == 1}
        if k.maxnreg:
            options["maxnreg"] = k.maxnreg
        ck = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)
    dt = time.time() - t0
    md = ck.metadata._asdict()
    ptx = ck.asm["ptx"]
    cubin = ck.asm["cubin"] if arch >= 90 else None
    regs = re.findall(r"Used (\d+) registers", log.getvalue())
    spill = re.findall(r"(\d+) bytes spill stores", log.getvalue())
    stack = re.findall(r"(\d+) bytes stack frame", log.getvalue())
    return {
        "job": job,
        "seconds": dt,
        "ptx": ptx,
        "cubin": cubin,
        "entry": md["name"],
        "shared": int(md["shared"] or 0),
        "num_warps": int(md["num_warps"]),
        "num_stages": int(md["num_stages"]),
        "num_ctas": int(md["num_ctas"]),
        "global_scratch_size": int(md["global_scratch_size"] or 0),
        "global_scratch_align": int(md["global_scratch_align"] or 1),
        "profile_scratch_size": int(md["profile_scratch_size"] or 0),
        "profile_scratch_align": int(md["profile_scratch_align"] or 1),
        "launch_pdl": bool(md["launch_pdl"]),
        "launch_cooperative_grid": bool(md["launch_cooperative_grid"]),
        "cluster": int(compiled.get("CLUSTER", 1)),
        "triton_version": md["triton_version"],
        "registers": int(regs[-1]) if regs else None,
        "spill_bytes": int(spill[-1]) if spill else None,
        "stack_bytes": int(stack[-1]) if stack else None,
    }


# ----------------------------------------------------------------------------------
# PTX checks


def ptx_facts(ptx: str, entry: str):
    """(ptx_version, target, [param type strings]) read off the PTX text."""
    ver = re.search(r"^\.version\s+(\d+\.\d+)", ptx, re.MULTILINE)
    tgt = re.search(r"^\.target\s+(\w+)", ptx, re.MULTILINE)
    ent = re.search(r"\.visible\s+\.entry\s+" + re.escape(entry) + r"\s*\(([^)]*)\)", ptx)
    if not (ver and tgt and ent):
        raise RuntimeError(f"cannot read .version/.target/.entry {entry} from the PTX")
    params = [p.strip() for p in ent.group(1).split(",") if p.strip()]
    return ver.group(1), tgt.group(1), params


def check_abi(kernel, params, vid):
    """Triton 3.6 launch ABI: the non-constexpr args in order, then global_scratch and
    profile_scratch (two global pointers). Verified against the PTX `.entry`."""
    want = len(kernel.args) + 2
    if len(params) != want:
        raise RuntimeError(f"{vid}: PTX .entry has {len(params)} params, expected {want} "
                           f"({len(kernel.args)} args + global_scratch + profile_scratch)")
    for a, p in zip(kernel.args, params):
        if a.type.startswith("*"):
            ok = p.startswith(".param .u64 .ptr .global")
        else:
            ok = p.startswith(".param " + PTX_PARAM[a.type] + " ")
        if not ok:
            raise RuntimeError(f"{vid}: argument {a.name} ({a.type}) has PTX param {p!r}")
    for p, what in zip(params[-2:], ("global_scratch", "profile_scratch")):
        if not p.startswith(".param .u64 .ptr .global"):
            raise RuntimeError(f"{vid}: trailing {what} param is {p!r}, expected a global pointer")


# ----------------------------------------------------------------------------------
# build


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def atomic_write(path: Path, data: bytes):
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_cache(out: Path, variants: list, files: dict):
    """Write ``files`` (name -> bytes; unchanged ones are left alone) and the manifest of
    ``variants`` (sorted by id) into ``out``, atomically each, then remove the hashed files
    no variant references. Returns (manifest, its text, the removed paths)."""
    variants.sort(key=lambda e: e["id"])
    manifest = {"schema_version": SCHEMA_VERSION, "triton_version": TRITON_VERSION, "variants": variants}
    for fname, data in sorted(files.items()):
        p = out / fname
        if not (p.exists() and p.read_bytes() == data):
            atomic_write(p, data)
    text = json.dumps(manifest, indent=1, sort_keys=True) + "\n"
    atomic_write(out / "manifest.json", text.encode())
    stale = [p for p in out.iterdir() if HASHED_NAME.match(p.name) and p.name not in files]
    for p in stale:
        p.unlink()
    return manifest, text, stale


def kept_entries(out: Path, only: set, mods: list, src_hash: dict, files: dict) -> list:
    """``--only``: the manifest entries (and their files, into ``files``) of the modules
    not rebuilt, from the existing build in ``out``. Every kept module's source must be
    unchanged since (its ``source_hash``), else this is no longer the same build."""
    unknown = sorted(only - set(mods))
    if unknown:
        raise SystemExit(f"error: --only {', '.join(unknown)}: no such kernel module (have {', '.join(mods)})")
    try:
        old = json.loads((out / "manifest.json").read_text())
    except (OSError, ValueError) as e:
        raise SystemExit(f"error: --only needs an existing build in {out}: {e}")
    kept = []
    for v in old.get("variants", []):
        mod = v["source"][:-3]
        if mod in only or mod not in src_hash:
            continue
        if v["source_hash"] != src_hash[mod]:
            raise SystemExit(f"error: --only: {mod}.py or a module it imports changed since {out} was built; "
                             f"rebuild it too (--only {','.join(sorted(only | {mod}))}) or rebuild everything")
        for kind in ("ptx", "cubin"):
            if kind in v:
                data = (out / v[kind]["file"]).read_bytes()
                if sha256(data) != v[kind]["sha256"]:
                    raise SystemExit(f"error: --only: {out / v[kind]['file']} is corrupt; rebuild everything")
                files[v[kind]["file"]] = data
        kept.append(v)
    return kept


def build(out: Path, jobs: int, quiet: bool = False, only: set | None = None) -> dict:
    mods = kernel_modules()
    kernels = load_kernels(mods)
    by_name = {k.name: (m, k) for m, k in kernels}
    src_hash = {m: source_hash(m) for m in mods}
    files = {}
    variants = []
    if only:
        variants = kept_entries(out, only, mods, src_hash, files)
        kernels = [(m, k) for m, k in kernels if m in only]
    todo = jobs_for(kernels)
    if not quiet:
        print(f"build: triton {TRITON_VERSION}, {len(kernels)} logical kernels, {len(todo)} variants, "
              f"{jobs} worker(s) -> {out}", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="tritonrt-build-") as tmp:
        ctx = multiprocessing.get_context("spawn")
        caches = [os.path.join(tmp, f"cache{i}") for i in range(jobs)]
        # one fresh Triton cache per worker process; the initializer picks one by pid order
        counter = ctx.Value("i", 0)
        with cf.ProcessPoolExecutor(max_workers=jobs, mp_context=ctx, initializer=_init_indexed,
                                    initargs=(counter, caches)) as pool:
            futs = {pool.submit(compile_job, j): j for j in todo}
            done = 0
            for fut in cf.as_completed(futs):
                job = futs[fut]
                try:
                    r = fut.result()
                except Exception as e:  # noqa: BLE001 - report which variant failed
                    for f in futs:
                        f.cancel()
                    raise SystemExit(f"error: compiling {job[4]} failed: {type(e).__name__}: {e}")
                done += 1
                results.append(r)
                if not quiet:
                    print(f"[{done}/{len(todo)}] {job[4]} ({r['seconds']:.1f} s, {r['registers']} regs)",
                          flush=True)
    for r in results:
        mod, name, arch, vi, vid = r["job"]
        _, k = by_name[name]
        v = k.variants[arch][vi]
        ptx_bytes = r["ptx"].encode()
        ver, tgt, params = ptx_facts(r["ptx"], r["entry"])
        want_tgt = "sm_90a" if arch == 90 else f"sm_{arch}"
        if tgt != want_tgt:
            raise SystemExit(f"error: {vid}: PTX .target {tgt}, expected {want_tgt}")
        check_abi(k, params, vid)
        if r["triton_version"] != TRITON_VERSION:
            raise SystemExit(f"error: {vid}: compiled by triton {r['triton_version']}")
        ce = dict(k.fixed)
        ce.update(dict(v.constexprs))
        entry = {
            "id": vid,
            "kernel": k.name,
            "entry": r["entry"],
            "source": f"{mod}.py",
            "source_hash": src_hash[mod],
            "signature": [{"name": a.name, "type": a.type, "divisibility": 16 if a.div16 else 1} for a in k.args],
            "constexprs": ce,
            "num_warps": r["num_warps"],
            "num_stages": r["num_stages"],
            "num_ctas": r["num_ctas"],
            "cluster_dims": [r["num_ctas"] * r["cluster"], 1, 1],
            "shared": r["shared"],
            "global_scratch_size": r["global_scratch_size"],
            "global_scratch_align": r["global_scratch_align"],
            "profile_scratch_size": r["profile_scratch_size"],
            "profile_scratch_align": r["profile_scratch_align"],
            "launch_pdl": r["launch_pdl"],
            "launch_cooperative_grid": r["launch_cooperative_grid"],
            "arch": arch,
            "ptx_target": tgt,
            "ptx_version": ver,
            "default": bool(v.default),
            "registers": r["registers"],
            "spill_bytes": r["spill_bytes"],
            "ptx": _file_ref(ptx_bytes, "ptx", files),
        }
        if r["cubin"] is not None:
            entry["cubin"] = _file_ref(r["cubin"], "cubin", files)
        variants.append(entry)
    manifest, text, stale = write_cache(out, variants, files)
    size = sum((out / f).stat().st_size for f in files) + len(text)
    if not quiet:
        print(f"build: wrote {len(variants)} variants, {len(files)} files ({size / 1e6:.1f} MB), "
              f"removed {len(stale)} stale, {time.time() - t0:.0f} s", flush=True)
    return manifest


_CACHES = None


def _init_indexed(counter, caches):
    with counter.get_lock():
        i = counter.value
        counter.value += 1
    _worker_init(caches[i % len(caches)] + f"-{os.getpid()}")


def _file_ref(data: bytes, ext: str, files: dict) -> dict:
    h = sha256(data)
    name = f"{h}.{ext}"
    files[name] = data
    return {"file": name, "sha256": h, "size": len(data)}


# ----------------------------------------------------------------------------------
# --check


def check(repo_out: Path, jobs: int) -> int:
    with tempfile.TemporaryDirectory(prefix="tritonrt-check-") as tmp:
        fresh = Path(tmp)
        build(fresh, jobs)
        problems = []
        want = {p.name: p for p in fresh.iterdir()}
        have = {p.name: p for p in repo_out.iterdir()} if repo_out.is_dir() else {}
        have = {n: p for n, p in have.items() if HASHED_NAME.match(n) or n == "manifest.json"}
        owners = {}
        try:
            fresh_manifest = json.loads((fresh / "manifest.json").read_text())
        except (OSError, ValueError) as e:
            print(f"error: the fresh build's manifest is unreadable: {e}")
            return 1
        for v in fresh_manifest["variants"]:
            for kind in ("ptx", "cubin"):
                if kind in v:
                    owners.setdefault(v[kind]["file"], []).append(v["id"])
        for n in sorted(set(want) | set(have)):
            if n not in have:
                problems.append(f"missing: {repo_out / n} (needed by {', '.join(owners.get(n, ['the manifest']))})")
            elif n not in want:
                problems.append(f"extra: {repo_out / n} (no variant references it)")
            elif want[n].read_bytes() != have[n].read_bytes():
                problems.append(f"differs: {repo_out / n}")
        if "manifest.json" in have and "manifest.json" in want:
            try:
                old = json.loads(have["manifest.json"].read_text())
                old_v = {v["id"]: v for v in old.get("variants", [])}
            except (OSError, ValueError) as e:
                problems.append(f"manifest.json unreadable: {e}")
                old_v = {}
            new_v = {v["id"]: v for v in fresh_manifest["variants"]}
            for vid in sorted(set(old_v) | set(new_v)):
                if vid not in old_v:
                    problems.append(f"variant missing from the committed manifest: {vid}")
                elif vid not in new_v:
                    problems.append(f"variant no longer declared: {vid}")
                elif old_v[vid] != new_v[vid]:
                    keys = sorted(k for k in set(old_v[vid]) | set(new_v[vid]) if old_v[vid].get(k) != new_v[vid].get(k))
                    problems.append(f"variant differs: {vid} (fields: {', '.join(keys)})")
        if problems:
            print(f"build.py --check: {repo_out} is stale ({len(problems)} problem(s)); rebuild with "
                  f"`python kernels_triton/build.py`:")
            for p in problems:
                print("  " + p)
            return 1
        print(f"build.py --check: {repo_out} is up to date")
        return 0


# ----------------------------------------------------------------------------------
# --user: any Triton source file, from a variant spec

USER_SPEC = """\
A spec is JSON: {"kernels": [ENTRY, ...]}, each ENTRY one compiled variant per arch:
  "kernel":     the @triton.jit function's name in FILE.py (required)
  "name":       the logical kernel name in the manifest (default: "kernel"); variants of
                one name must share one launch signature
  "signature":  one item per parameter of the function, in order, as Triton's
                tools/compile.py spells them: a type ("*fp16", "i32", "fp32", "u64", "i1",
                "tensordesc<fp16[64, 64]>") optionally with ":16" (assume the pointer or
                integer is a multiple of 16) or ":1" (specialize the integer to 1: it
                becomes a constexpr); or a constexpr value (1024, 0.5, True, None). Either a
                comma-separated string or a list.
  "num_warps" (4), "num_stages" (3), "num_ctas" (1), "maxnreg" (none),
  "launch_pdl" (false: true compiles for programmatic dependent launch),
  "launch_cooperative_grid" (false: true launches as a cooperative grid),
  "archs" ([80, 90]): 80 -> portable sm_80 PTX; 90 -> sm_90a PTX + cubin,
  "default" (the first variant of each (name, arch) unless one says true).
"""

_SCALARS = ("i1", "i8", "i16", "i32", "i64", "u1", "u8", "u16", "u32", "u64", "fp16", "bf16", "fp32", "fp64")


def _split_top(sig: str) -> list:
    """Split a signature string at commas outside <...> and [...]."""
    out, cur, depth = [], "", 0
    for c in sig:
        if c in "<[":
            depth += 1
        elif c in ">]":
            depth -= 1
        if c == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += c
    if cur.strip():
        out.append(cur.strip())
    return out


def _constexpr_value(s: str):
    """(True, value) when `s` spells a constexpr value, else (False, None)."""
    if s in ("None", "none", "null"):
        return True, None
    if s in ("True", "true"):
        return True, True
    if s in ("False", "false"):
        return True, False
    for conv in (int, float):
        try:
            return True, conv(s)
        except ValueError:
            pass
    return False, None


def _is_type(t: str) -> bool:
    if t.startswith("*"):
        return t[1:] in _SCALARS + ("fp8e4nv", "fp8e5") or t == "*"
    if t.startswith("tensordesc<"):
        return re.fullmatch(r"tensordesc<\w+\[\s*\d+(\s*,\s*\d+)*\s*\]>", t) is not None
    return t in _SCALARS


def _norm_type(t: str) -> str:
    """Triton's signature spelling, normalized as the manifest writes it (`u1`, Triton's
    canonical bool, as `i1`)."""
    if t in ("u1", "*u1"):
        return t.replace("u1", "i1")
    m = re.fullmatch(r"tensordesc<(\w+)\[([^\]]*)\]>", t)
    if m:
        dims = [d.strip() for d in m.group(2).split(",")]
        return f"tensordesc<{m.group(1)}[{', '.join(dims)}]>"
    return t


def _load_user_fn(path: str, name: str):
    """The triton.JITFunction `name` of the file at `path` (unwrapping autotune /
    heuristics decorators)."""
    import importlib.util
    import triton
    p = Path(path).resolve()
    key = ("user", str(p), name)
    if key in _WORKER_CACHE:
        return _WORKER_CACHE[key]
    if str(p.parent) not in sys.path:
        sys.path.insert(0, str(p.parent))
    spec = importlib.util.spec_from_file_location(p.stem, p)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    if not hasattr(mod, name):
        raise SystemExit(f"error: {p.name} has no function {name!r}")
    fn = getattr(mod, name)
    while not isinstance(fn, triton.runtime.jit.JITFunction) and hasattr(fn, "fn"):
        fn = fn.fn
    if not isinstance(fn, triton.runtime.jit.JITFunction):
        raise SystemExit(f"error: {p.name}: {name} is not a @triton.jit function")
    _WORKER_CACHE[key] = fn
    return fn


def plan_user(path: Path, spec: dict) -> list:
    """Validate a spec against the file (parameter names) and return one job per
    (entry, arch): a dict the worker compiles and the manifest entry is made from."""
    if not isinstance(spec, dict) or not isinstance(spec.get("kernels"), list) or not spec["kernels"]:
        raise SystemExit("error: the spec must be {\"kernels\": [ENTRY, ...]} with at least one entry\n" + USER_SPEC)
    jobs = []
    for ei, e in enumerate(spec["kernels"]):
        where = f"spec entry {ei}"
        unknown = set(e) - {"kernel", "name", "signature", "num_warps", "num_stages", "num_ctas", "maxnreg",
                            "launch_pdl", "launch_cooperative_grid", "archs", "default"}
        if unknown:
            raise SystemExit(f"error: {where}: unknown keys {sorted(unknown)}\n" + USER_SPEC)
        if "kernel" not in e or "signature" not in e:
            raise SystemExit(f"error: {where}: needs \"kernel\" and \"signature\"\n" + USER_SPEC)
        fn = _load_user_fn(str(path), e["kernel"])
        where = f"spec entry {ei} ({e['kernel']})"
        items = e["signature"]
        if isinstance(items, str):
            items = _split_top(items)
        items = [str(x).strip() if not isinstance(x, (int, float, bool)) or isinstance(x, str) else x for x in items]
        params = list(fn.arg_names)
        if len(items) != len(params):
            raise SystemExit(f"error: {where}: the signature has {len(items)} items, the function {len(params)} "
                             f"parameters ({', '.join(params)})")
        sig, args, constexprs, attrs = {}, [], {}, {}
        for i, (pname, item) in enumerate(zip(params, items)):
            p = fn.params[i]
            if not isinstance(item, str):
                is_const, val = True, item
            else:
                ty, _, hint = item.partition(":")
                ty = ty.strip()
                is_const, val = _constexpr_value(ty)
            if is_const:
                sig[pname] = "constexpr"
                constexprs[pname] = val
                continue
            if p.is_constexpr:
                raise SystemExit(f"error: {where}: parameter {pname} is tl.constexpr: give its value, not {item!r}")
            if not _is_type(ty):
                raise SystemExit(f"error: {where}: parameter {pname}: {item!r} is neither a Triton type (*fp16, "
                                 f"i32, fp32, tensordesc<fp16[64, 64]>, ...) nor a constexpr value")
            hint = hint.strip()
            if hint not in ("", "1", "16"):
                raise SystemExit(f"error: {where}: parameter {pname}: hint :{hint} (only :16 and :1 exist)")
            if hint == "1":
                if ty not in ("i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64"):
                    raise SystemExit(f"error: {where}: parameter {pname}: :1 specializes integers only")
                sig[pname] = "constexpr"
                constexprs[pname] = 1
                continue
            if hint == "16":
                if not (ty.startswith("*") or ty in ("i32", "i64", "u32", "u64")):
                    raise SystemExit(f"error: {where}: parameter {pname}: :16 applies to pointers and integers")
                attrs[(i, )] = [["tt.divisibility", 16]]
            sig[pname] = ty
            args.append({"name": pname, "type": _norm_type(ty), "divisibility": 16 if hint == "16" else 1})
        name = e.get("name", e["kernel"])
        archs = e.get("archs", [80, 90])
        if not archs or any(a not in (80, 90) for a in archs):
            raise SystemExit(f"error: {where}: archs {archs}: each must be 80 or 90")
        for arch in archs:
            nw, ns = int(e.get("num_warps", 4)), int(e.get("num_stages", 3))
            ce_id = ".".join(f"{k}={_fmt(v)}" for k, v in sorted(constexprs.items()))
            vid = f"{name}." + (ce_id + "." if ce_id else "") + f"w{nw}.s{ns}.sm{arch}"
            jobs.append({
                "path": str(path), "fn": e["kernel"], "name": name, "sig": sig, "args": args,
                "constexprs": constexprs, "attrs": {str(k[0]): v for k, v in attrs.items()}, "arch": arch,
                "num_warps": nw, "num_stages": ns, "num_ctas": int(e.get("num_ctas", 1)),
                "maxnreg": e.get("maxnreg"), "launch_pdl": bool(e.get("launch_pdl", False)),
                "launch_cooperative_grid": bool(e.get("launch_cooperative_grid", False)),
                "default": e.get("default"), "id": vid,
            })
    ids = [j["id"] for j in jobs]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise SystemExit(f"error: the spec makes duplicate variant ids: {dup}")
    by_name = {}
    for j in jobs:
        by_name.setdefault(j["name"], j["args"])
        if by_name[j["name"]] != j["args"]:
            raise SystemExit(f"error: variants of {j['name']} have different launch signatures; give them "
                             f"different \"name\"s")
    return jobs


def compile_user_job(job):
    """Compile one user (entry, arch) job; return what the manifest and files need."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    fn = _load_user_fn(job["path"], job["fn"])
    attrs = {(int(k), ): v for k, v in job["attrs"].items()}
    src = ASTSource(fn, dict(job["sig"]), dict(job["constexprs"]), attrs)
    options = {"num_warps": job["num_warps"], "num_stages": job["num_stages"], "num_ctas": job["num_ctas"],
               "launch_pdl": job["launch_pdl"], "launch_cooperative_grid": job["launch_cooperative_grid"]}
    if job["maxnreg"]:
        options["maxnreg"] = int(job["maxnreg"])
    t0 = time.time()
    log = io.StringIO()
    with contextlib.redirect_stdout(log):
        ck = triton.compile(src, target=GPUTarget("cuda", job["arch"], 32), options=options)
    md = ck.metadata._asdict()
    return {
        "job": job,
        "seconds": time.time() - t0,
        "ptx": ck.asm["ptx"],
        "cubin": ck.asm["cubin"] if job["arch"] >= 90 else None,
        "md": {k: md[k] for k in ("name", "shared", "num_warps", "num_stages", "num_ctas", "global_scratch_size",
                                  "global_scratch_align", "profile_scratch_size", "profile_scratch_align",
                                  "launch_pdl", "launch_cooperative_grid", "triton_version")},
        "tensordesc_meta": [dict(m) for m in (md.get("tensordesc_meta") or [])],
    }


def _ptx_kinds(arg: dict, meta) -> list:
    """The PTX parameters one signature argument becomes (see src/abi/desc.rs)."""
    t = arg["type"]
    if t.startswith("tensordesc<"):
        n = t.count(",") + 1
        head = ["desc"] if meta is not None else ["ptr"] + ["i64"] * (2 * n) + ["i1"]
        return head + ["i32"] * n + ["i64"] * n
    return ["ptr" if t.startswith("*") else t]


def _ptx_param_ok(kind: str, p: str) -> bool:
    if kind == "ptr":
        return p.startswith(".param .u64 .ptr .global")
    if kind == "desc":
        return re.match(r"\.param \.align 64 \.b8 \w+\[128\]", p) is not None
    if kind in ("fp16", "bf16"):
        return re.match(r"\.param \.align 2 \.b8 \w+\[2\]", p) is not None
    want = {"i1": ".u8", "u1": ".u8", "i8": ".u8", "u8": ".u8", "i16": ".u16", "u16": ".u16", "i32": ".u32",
            "u32": ".u32", "i64": ".u64", "u64": ".u64", "fp32": ".f32", "fp64": ".f64"}[kind]
    return p.startswith(f".param {want} ")


def build_user(path: Path, spec: dict, out: Path, jobs: int) -> dict:
    """Compile the spec's variants of the user file `path` into the ptx_cache `out`
    (manifest + content-addressed files; stale files removed). Deterministic."""
    todo = plan_user(path, spec)
    src_hash = sha256(path.read_bytes())
    print(f"build: triton {TRITON_VERSION}, {path.name}: {len(todo)} variants, {jobs} worker(s) -> {out}",
          flush=True)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    with tempfile.TemporaryDirectory(prefix="tritonrt-build-") as tmp:
        ctx = multiprocessing.get_context("spawn")
        caches = [os.path.join(tmp, f"cache{i}") for i in range(jobs)]
        counter = ctx.Value("i", 0)
        with cf.ProcessPoolExecutor(max_workers=jobs, mp_context=ctx, initializer=_init_indexed,
                                    initargs=(counter, caches)) as pool:
            futs = {pool.submit(compile_user_job, j): j for j in todo}
            for fut in cf.as_completed(futs):
                job = futs[fut]
                try:
                    r = fut.result()
                except SystemExit:
                    raise
                except Exception as e:  # noqa: BLE001 - report which variant failed
                    raise SystemExit(f"error: compiling {job['id']} failed: {type(e).__name__}: {e}")
                results.append(r)
                print(f"[{len(results)}/{len(todo)}] {job['id']} ({r['seconds']:.1f} s)", flush=True)
    variants, files = [], {}
    defaults = {}
    for r in sorted(results, key=lambda r: todo.index(r["job"])):
        j, md = r["job"], r["md"]
        ver, tgt, params = ptx_facts(r["ptx"], md["name"])
        want_tgt = "sm_90a" if j["arch"] == 90 else f"sm_{j['arch']}"
        if tgt != want_tgt:
            raise SystemExit(f"error: {j['id']}: PTX .target {tgt}, expected {want_tgt}")
        metas = list(r["tensordesc_meta"])
        kinds = []
        mi = iter(metas)
        for a in j["args"]:
            meta = next(mi, None) if a["type"].startswith("tensordesc<") and metas else None
            kinds += _ptx_kinds(a, meta)
        if len(params) != len(kinds) + 2 or not all(_ptx_param_ok(k, p) for k, p in zip(kinds, params)):
            raise SystemExit(f"error: {j['id']}: the PTX .entry parameters {params} do not match the launch "
                             f"signature {[a['type'] for a in j['args']]} (+ 2 scratch pointers)")
        if md["triton_version"] != TRITON_VERSION:
            raise SystemExit(f"error: {j['id']}: compiled by triton {md['triton_version']}")
        key = (j["name"], j["arch"])
        entry = {
            "id": j["id"], "kernel": j["name"], "entry": md["name"], "source": path.name, "source_hash": src_hash,
            "signature": j["args"], "constexprs": j["constexprs"], "num_warps": int(md["num_warps"]),
            "num_stages": int(md["num_stages"]), "num_ctas": int(md["num_ctas"]),
            "cluster_dims": [int(md["num_ctas"]), 1, 1], "shared": int(md["shared"] or 0),
            "global_scratch_size": int(md["global_scratch_size"] or 0),
            "global_scratch_align": int(md["global_scratch_align"] or 1),
            "profile_scratch_size": int(md["profile_scratch_size"] or 0),
            "profile_scratch_align": int(md["profile_scratch_align"] or 1),
            "launch_pdl": bool(md["launch_pdl"]), "launch_cooperative_grid": bool(md["launch_cooperative_grid"]),
            "arch": j["arch"], "ptx_target": tgt, "ptx_version": ver,
            "default": False, "ptx": _file_ref(r["ptx"].encode(), "ptx", files),
        }
        if metas:
            entry["tensordesc_meta"] = metas
        if r["cubin"] is not None:
            entry["cubin"] = _file_ref(r["cubin"], "cubin", files)
        if j["default"] is True or (j["default"] is None and key not in defaults):
            if j["default"] is True and defaults.get(key, {}).get("explicit"):
                raise SystemExit(f"error: two variants of {j['name']} sm{j['arch']} say \"default\": true")
            if key in defaults:
                defaults[key]["entry"]["default"] = False
            entry["default"] = True
            defaults[key] = {"entry": entry, "explicit": j["default"] is True}
        variants.append(entry)
    manifest, _, _ = write_cache(out, variants, files)
    print(f"build: wrote {len(variants)} variants, {len(files)} files to {out}", flush=True)
    return manifest


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="build into a temp dir and compare with --out")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory (default: ptx_cache/)")
    ap.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    ap.add_argument("--list", action="store_true", help="list the variants and exit")
    ap.add_argument("--user", type=Path, metavar="FILE.py",
                    help="compile the variants --spec describes of this Triton source file instead of "
                         "kernels_triton/ (needs --spec and --out)")
    ap.add_argument("--spec", type=Path, metavar="SPEC.json", help="the variant spec of --user:\n" + USER_SPEC)
    ap.add_argument("--only", metavar="MODULE[,MODULE]",
                    help="recompile only these kernel modules (e.g. pq_kmeans); the other modules' "
                         "entries and files are kept from --out, whose sources must be unchanged")
    args = ap.parse_args(argv)
    try:
        import triton
    except ImportError:
        print(f"error: triton is not installed; this build needs triton=={TRITON_VERSION} "
              f"(pip install triton=={TRITON_VERSION})", file=sys.stderr)
        return 2
    if triton.__version__ != TRITON_VERSION:
        print(f"error: this build needs triton=={TRITON_VERSION} exactly (artifacts, the launch ABI and "
              f"the manifest are pinned to it); found triton {triton.__version__} at {triton.__file__}",
              file=sys.stderr)
        return 2
    if args.user is not None:
        if args.spec is None or args.out == DEFAULT_OUT:
            print("error: --user needs --spec SPEC.json and --out DIR", file=sys.stderr)
            return 2
        try:
            spec = json.loads(args.spec.read_text())
        except (OSError, ValueError) as e:
            print(f"error: reading the spec {args.spec}: {e}", file=sys.stderr)
            return 2
        if not args.user.is_file():
            print(f"error: {args.user} is not a file", file=sys.stderr)
            return 2
        build_user(args.user.resolve(), spec, args.out, max(1, args.jobs))
        return 0
    if args.list:
        for j in jobs_for(load_kernels(kernel_modules())):
            print(j[4])
        return 0
    if args.check:
        return check(args.out, args.jobs)
    build(args.out, args.jobs, only=set(args.only.split(",")) if args.only else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
