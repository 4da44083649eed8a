"""Declarations shared by the kernel modules and the AOT build script.

A kernel module (``axpy.py``, ``pq_select.py``, ...) defines a module-level list
``KERNELS`` of :class:`Kernel`. Each entry is one *logical* kernel: one Triton function
with a fixed launch signature and fixed semantics (dtype specializations and functional
constexprs such as the heavy-set capacity are part of the logical name). Its
:class:`Variant` list holds the performance-only knobs (block sizes, num_warps,
num_stages) that the build compiles and the autotuner may choose between.

This module imports nothing but the standard library, so it loads anywhere.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

#: Triton's spelling of the types the build accepts in a signature.
POINTER_TYPES = ("*fp32", "*fp16", "*bf16", "*fp64", "*i8", "*u8", "*i16", "*i32", "*i64", "*u32", "*u64")
SCALAR_TYPES = ("i1", "i8", "i16", "i32", "i64", "u32", "u64", "fp16", "bf16", "fp32", "fp64")

#: Arches the build compiles for: 80 -> portable PTX only; 90 -> sm_90a PTX + cubin.
ARCHES = (80, 90)


@dataclass(frozen=True)
class Arg:
    """One launch argument (constexprs are never listed here).

    ``div16``: compile assuming the value (a pointer's address, or an integer) is a
    multiple of 16 (``tt.divisibility = 16``); the launcher must refuse other values.
    """

    name: str
    type: str
    div16: bool = False

    def __post_init__(self):
        if self.type not in POINTER_TYPES + SCALAR_TYPES:
            raise ValueError(f"argument {self.name}: unknown Triton type {self.type!r}")
        if self.div16 and self.type not in POINTER_TYPES and self.type not in ("i32", "i64", "u32", "u64"):
            raise ValueError(f"argument {self.name}: divisibility 16 only applies to pointers and integers")


def ptr(name: str, ty: str, div16: bool = True) -> Arg:
    """A pointer argument; ``ty`` is the element type (``fp32``, ``u8``, ...)."""
    return Arg(name, "*" + ty, div16)


def i32(name: str, div16: bool = False) -> Arg:
    """A 32-bit signed integer argument (never specialized to 1)."""
    return Arg(name, "i32", div16)


def i64(name: str, div16: bool = False) -> Arg:
    """A 64-bit signed integer argument (strides in elements)."""
    return Arg(name, "i64", div16)


def f32(name: str) -> Arg:
    """A 32-bit float argument."""
    return Arg(name, "fp32")


@dataclass(frozen=True)
class Variant:
    """One compiled configuration of a logical kernel on one arch."""

    constexprs: tuple  # sorted ((name, value), ...) of the tunable constexprs
    num_warps: int
    num_stages: int
    default: bool = False

    @staticmethod
    def make(constexprs: dict, num_warps: int, num_stages: int, default: bool = False) -> "Variant":
        return Variant(tuple(sorted(constexprs.items())), num_warps, num_stages, default)


@dataclass(frozen=True)
class Kernel:
    """A logical kernel: what the runtime looks variants up by (manifest ``kernel``)."""

    name: str
    fn: object  # triton.runtime.jit.JITFunction
    args: tuple  # tuple[Arg, ...] in declaration order, constexprs removed
    fixed: dict = field(default_factory=dict)  # constexprs fixed for every variant
    variants: dict = field(default_factory=dict)  # arch -> tuple[Variant, ...]
    maxnreg: int = 0  # registers per thread at most (PTX .maxnreg) for every variant; 0: the compiler's choice

    def validate(self):
        """Check the declaration against the Triton function; raise ValueError if off."""
        params = list(self.fn.params)
        runtime = [p.name for p in params if not p.is_constexpr]
        consts = [p.name for p in params if p.is_constexpr]
        # a constexpr with a default in the signature (TIMER: phase stamps for benches) may
        # be left out: built variants take the default
        required = {p.name for p in params if p.is_constexpr and not p.has_default}
        declared = [a.name for a in self.args]
        if runtime != declared:
            raise ValueError(f"{self.name}: declared args {declared} != the function's non-constexpr "
                             f"parameters {runtime}")
        for arch in ARCHES:
            vs = self.variants.get(arch, ())
            if not vs:
                raise ValueError(f"{self.name}: no variants for arch {arch}")
            if sum(v.default for v in vs) != 1:
                raise ValueError(f"{self.name}: arch {arch} needs exactly one default variant")
            for v in vs:
                names = set(self.fixed) | {k for k, _ in v.constexprs}
                if set(self.fixed) & {k for k, _ in v.constexprs}:
                    raise ValueError(f"{self.name}: a constexpr is both fixed and tuned")
                if not required <= names <= set(consts):
                    raise ValueError(f"{self.name}: constexprs {sorted(names)}: the function's are "
                                     f"{sorted(consts)}, of which {sorted(required)} have no default")
            if len(set(vs)) != len(vs):
                raise ValueError(f"{self.name}: duplicate variants for arch {arch}")


def grid(default: dict, num_warps_default: int, num_stages_default: int, *, num_warps=(), num_stages=(),
         **axes) -> tuple:
    """The cross product of ``axes`` (name -> values) x num_warps x num_stages as
    variants, with the one matching ``default`` / ``*_default`` flagged."""
    names = sorted(axes)
    nws = tuple(num_warps) or (num_warps_default, )
    nss = tuple(num_stages) or (num_stages_default, )
    out = []
    for values in itertools.product(*(axes[n] for n in names)):
        ce = dict(zip(names, values))
        for nw in nws:
            for ns in nss:
                is_default = ce == default and nw == num_warps_default and ns == num_stages_default
                out.append(Variant.make(ce, nw, ns, is_default))
    if sum(v.default for v in out) != 1:
        raise ValueError(f"default {default} w{num_warps_default} s{num_stages_default} is not in the grid")
    return tuple(out)


def single(constexprs: dict, num_warps: int, num_stages: int) -> tuple:
    """Just the one (default) variant."""
    return (Variant.make(constexprs, num_warps, num_stages, True), )
