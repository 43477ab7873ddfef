"""Code generation: one fusion group -> the text of one standalone Triton kernel module.

Kernel shapes:

* **pointwise, flat**: one program = ``XBLOCK`` consecutive elements of the collapsed space (when every
  access is affine in the linear index: contiguous or broadcast-by-prefix operands), 16-byte vector loads;
  a kernel with fewer programs than SMs takes smaller blocks (``small_pointwise_block``) at the same warps.
* **pointwise, tiled**: ``YBLOCK x XBLOCK`` tiles (rows x last dim) when the flat form would divide and take
  the modulo of every element's index (broadcast along the last dim, transposes): index arithmetic per row.
* **reduction, persistent**: ``XBLOCK`` rows x the whole reduced extent in registers (``RBLOCK >= rnumel``):
  the input is read once; the reduction's prologue, full-row epilogue (softmax's output) and row epilogue
  (layer norm's rstd) are computed from registers. Used up to :data:`PERSISTENT_MAX_R` elements a row.
  Fewer rows than SMs (a decode step's one row) are latency-bound: every load first, 8 elements a thread.
* **reduction, looped**: longer rows loop over ``RBLOCK`` chunks, one loop per dependent reduction stage
  (e.g. max, then sum of exp(x - max), then the output), recomputing cheap pointwise values per loop.
  A reduction over a non-contiguous dim (column sums, a split's first stage) steps over
  ``outer_xblock`` contiguous columns x ``outer_rblock`` rows with ``outer_warps``; a short one with few
  programs (up to ``outer_persistent_max_r`` rows and ``outer_persistent_max_waves`` programs an SM: a
  split's second stage) is persistent with at least ``outer_run_bytes`` of each row a program.
* **reduction, row loop**: a row reduction group that also computes column roots (a split column
  reduction's first stage, scheduler ``columns_into_rows``: a norm backward's weight and bias gradients):
  one program a chunk of rows, the persistent form in a loop over the chunk, column partials accumulated
  in registers and written once per program.

Performance choices of these forms are settings of the compiler's one tuning table (:mod:`..tuning`).

Sizes and strides are kernel arguments (``xnumel``, ``rnumel``, ``ks0``...), never literals, so one kernel
serves every size with the same structure (Dynamo's dynamic shapes do not recompile it; Triton specialises
arguments equal to 1 and divisible by 16 itself). Block sizes are ``tl.constexpr`` arguments and the warp
count a launch option, both chosen on the host from :mod:`tilefuse.device` (warp size 32 or 64): nothing in a
kernel asks which vendor it runs on. Indices are int64 where any offset reaches 2**31.
"""
from __future__ import annotations

import dataclasses
import hashlib
import math
import re
from typing import Optional

import torch

from ... import device
from .. import ir
from ..ir import float8
from ..ir import primitives as P
from ..ir.ranges import nonzero, value_range
from ..scheduler import KernelGroup, Schedule
from ..tuning import (ELEMS_PER_THREAD, LOOPED_RBLOCK, OUTER_RBLOCK, OUTER_SPLIT_XBLOCK, OUTER_WARPS,  # noqa: F401
                      OUTER_XBLOCK, PERSISTENT_ELEMS, POINTWISE_BLOCK, TILE_ELEMS, TUNING)

CODEGEN_VERSION = "1"  # part of every cache key: bump when generated code changes meaning

# Device asserts of generated kernels start with this (the interpreter checks exactly these, see
# interpreter_check); a kernel with one is compiled with Triton's debug option on a GPU (without it Triton
# drops them) and without its integer-overflow sanitizer (the asserts it adds to every int32 add would fire on
# integer tensors' wrapping arithmetic, which eager does too).
ASSERT_PREFIX = "tilefuse: "
ASSERT_OPTIONS = (("debug", True), ("sanitize_overflow", False))
# Integer primitives that divide by their second operand (eager on the CPU raises for a zero divisor).
INT_DIVISIONS = frozenset({"floordiv_int", "truncdiv_int", "remainder", "fmod"})
# Primitives whose result jumps where their operand crosses a value: a half-typed operand computed in float32
# registers (an inlined producer, a reduction's row value: the scheduler keeps bfloat16 intermediates
# unrounded) is rounded to its type first, as eager reads it from memory (KernelWriter.as_stored). Else a
# recomputed bfloat16 value is compared with its stored, rounded maximum (amax's backward: eq(amax, x))
# and never equals it. A cast out of a half type reads the rounded value too (KernelWriter.cast).
DISCONTINUOUS = frozenset({"eq", "ne", "lt", "le", "gt", "ge", "floor", "ceil", "trunc", "round", "floordiv",
                           "remainder", "fmod"})

# Launch heuristics (host side); the ones the tuning table starts from live with it (tuning.py).
FLOAT32_MAX = 3.4028234663852886e38
MAX_GRID_Y = 65535  # CUDA's (and HIP's) limit on a launch grid's second dimension
PERSISTENT_MAX_R = 8192  # a row of 8192 fp32 values in 16 warps is 16 registers a thread per live tensor
MAX_WARPS = 16
# The interpreter runs each program in Python over numpy blocks: fewer, larger programs run faster.
INTERP_BLOCK = 16384
INTERP_PERSISTENT_MAX_R = 65536
INTERP_OUTER_XBLOCK = 256
TL_DTYPE = {
    torch.float16: "tl.float16", torch.bfloat16: "tl.bfloat16", torch.float32: "tl.float32",
    torch.float64: "tl.float64", torch.int8: "tl.int8", torch.int16: "tl.int16", torch.int32: "tl.int32",
    torch.int64: "tl.int64", torch.uint8: "tl.uint8", torch.bool: "tl.int1",
    **{dt: fmt[4] for dt, fmt in float8.FP8_FORMATS.items()},
}


def next_pow2(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


@dataclasses.dataclass(frozen=True)
class LaunchTarget:
    """What the host knows about the device when it picks block sizes."""
    warp_size: int = 32
    interpreter: bool = False
    multiprocessors: int = 132

    @staticmethod
    def current() -> "LaunchTarget":
        d = device.current()
        return LaunchTarget(d.warp_size, d.interpreter, d.multiprocessors)


@dataclasses.dataclass(frozen=True)
class KernelSource:
    """A generated kernel: its module text and how to launch it."""
    name: str
    source: str
    args: tuple  # ("buf", name) | ("seed",) | ("int", value) | ("float", value), in signature order
    constexprs: tuple  # ((name, value), ...)
    grid: tuple
    num_warps: int
    num_stages: int
    form: str  # "pointwise" | "tiled" | "persistent" | "looped" | "rowloop"
    group: str
    stores: tuple  # names of buffers written
    options: tuple = ()  # ((name, value), ...): compile options beyond warps and stages (ASSERT_OPTIONS)


# ----------------------------------------------------------------------------------------- emitter
class _Scope:
    def __init__(self, parent: Optional["_Scope"], indent: str, row_level: bool):
        self.parent = parent
        self.indent = indent
        self.lines: list[str] = []
        # keyed by the IR objects themselves (identity: they are interned), never by id(): code generation
        # makes temporary expressions (a kernel's own index substitutions, peephole rewrites) that die while
        # the writer runs, and a later object at the same address would find their text
        self.cache: dict = {}
        self.row_level = row_level

    def lookup(self, key):
        s = self
        while s is not None:
            if key in s.cache:
                return s.cache[key]
            s = s.parent
        return None


class KernelWriter:
    def __init__(self, group: KernelGroup, sched: Schedule, target: LaunchTarget):
        self.g = group
        self.sched = sched
        self.target = target
        self.table = sched.graph.by_name()
        self.helpers: set[str] = set()
        self.peepholes: dict[ir.Expr, ir.Expr] = {}  # Op -> what P.peephole writes for it
        self._users: Optional[dict] = None  # user_count(), users_of(): {expr: {user: user}}
        self.sizes: dict[int, str] = {}  # value -> argument name
        self.size_order: list[tuple[str, int]] = []
        self.buffers: dict[tuple[str, str], str] = {}  # (kind, buffer) -> pointer arg
        self.buffer_order: list[tuple[str, str]] = []
        self.tmp = 0
        self.uses_seed = False
        self.named: list[str] = []
        self.sym_consts: dict[int, str] = {}
        self.asserts = 0  # device asserts written (bounds of data-dependent indices, integer divisors)

    # -------------------------------------------------------------------------------- naming
    def size(self, value: int) -> str:
        """An index constant as a kernel argument (``ks0``...), shared between equal values. Numels are
        their own arguments (:meth:`named_size`) so that a size equal to another by coincidence for one
        shape does not change the kernel's text."""
        value = int(value)
        if value in (0, 1):
            return str(value)
        name = self.sizes.get(value)
        if name is None:
            name = f"ks{len(self.sizes)}"
            self.sizes[value] = name
            self.size_order.append((name, value))
        return name

    def named_size(self, name: str, value: int) -> str:
        self.size_order.insert(len(self.named), (name, int(value)))
        self.named.append(name)
        return name

    def symbolic_const(self, c) -> str:
        """A constant that came from a size (the divisor of a mean over a dynamic dim): its own argument."""
        key = c
        if key not in self.sym_consts:
            is_float = isinstance(c.value, float) or P.compute_dtype(c.dtype).is_floating_point
            name = f"{'kf' if is_float else 'ki'}{len(self.sym_consts)}"
            self.sym_consts[key] = name
            self.size_order.append((name, float(c.value) if is_float else int(c.value)))
        return self.sym_consts[key]

    def pointer(self, kind: str, buffer: str) -> str:
        key = (kind, buffer)
        if key not in self.buffers:
            n = sum(1 for k, _ in self.buffer_order if k == kind)
            self.buffers[key] = f"{'in' if kind == 'load' else 'out'}_ptr{n}"
            self.buffer_order.append(key)
        return self.buffers[key]

    def fresh(self, prefix="tmp") -> str:
        self.tmp += 1
        return f"{prefix}{self.tmp - 1}"

    # ----------------------------------------------------------------------------- index text
    def index_text(self, ix: ir.Index, scope: _Scope) -> str:
        parts = []
        for atom, coef in ix.terms:
            a = self.atom_text(atom, scope)
            mag = abs(coef)
            term = a if mag == 1 else f"{self.size(mag)} * {a}"
            parts.append(("- " if coef < 0 else "+ ") + term)
        if ix.offset:
            parts.append(("- " if ix.offset < 0 else "+ ") + self.size(abs(ix.offset)))
        if not parts:
            return "0"
        text = " ".join(parts)
        return text[2:] if text.startswith("+ ") else "-" + text[2:]

    def atom_text(self, atom, scope: _Scope) -> str:
        if isinstance(atom, ir.Var):
            return atom.name
        key = ("atom", atom)
        found = scope.lookup(key)
        if found:
            return found[0]
        target = self.scope_for(atom_uses_r(atom), scope)
        if isinstance(atom, ir.DivMod):
            inner = self.index_text(atom.inner, target)
            text = f"({inner})" if len(atom.inner.terms) > 1 or atom.inner.offset else inner
            if atom.div != 1:
                text = f"{text} // {self.size(atom.div)}"
            if atom.mod is not None:
                text = f"({text}) % {self.size(atom.mod)}" if atom.div != 1 else f"{text} % {self.size(atom.mod)}"
            prefix = "r" if atom_uses_r(atom) else "x"
        else:
            return self.indirect_text(atom, target, key)
        name = self.fresh(prefix + "_")
        target.lines.append(f"{target.indent}{name} = {text}")
        target.cache[key] = (name, torch.int64)
        return name

    def indirect_text(self, atom: ir.Indirect, target: _Scope, key) -> str:
        """A data-dependent index: its value (``raw``, kept for :meth:`check_indirect`), then, for an op that
        counts negative indices from the end, the value wrapped into ``0 .. size-1`` (unless its range is
        proven non-negative)."""
        raw = self.emit(target, self.expr(atom.expr, target)[0], torch.int64, ("raw", atom), prefix="idx_")[0]
        name = raw
        rng = value_range(atom.expr)
        if atom.wrap and (rng is None or rng[0] < 0):
            size = self.size(atom.size)
            name = self.emit(target, f"tl.where({raw} < 0, {raw} + {size}, {raw})", torch.int64, prefix="idx_")[0]
        target.cache[key] = (name, torch.int64)
        return name

    def check_indirect(self, ix: ir.Index, scope: _Scope, mask: Optional[str]) -> None:
        """A device assert that each checked data-dependent index of ``ix`` is in the range its ATen op
        accepts, on the lanes ``mask`` selects (a lane masked off reads nothing: its index may be anything) and
        where the index's own loads read something (a masked-off load gives 0, which is no index of the
        graph's). Skipped where the index's range is proven (an arange's position, a clamped value)."""
        for atom in ir._indirect_atoms(ix):
            if not atom.op:
                continue
            lo = -atom.size if atom.wrap else 0
            rng = value_range(atom.expr)
            if rng is not None and lo <= rng[0] and rng[1] < atom.size:
                continue
            self.atom_text(atom, scope)
            raw = scope.lookup(("raw", atom))[0]
            valid = self.validity_mask(atom.expr, scope, mask)
            key = ("check", atom, valid)
            if scope.lookup(key):
                continue
            size = self.size(atom.size)
            low = f"-{size}" if atom.wrap else "0"
            cond = f"({low} <= {raw}) & ({raw} < {size})"
            ends = " (negative counts from the end)" if atom.wrap else ""
            msg = f"{ASSERT_PREFIX}index {raw} out of bounds for a dim of size {size}{ends} in {atom.op}"
            self.assert_line(scope, cond, msg, valid)
            scope.cache[key] = ("", torch.bool)

    def validity_mask(self, e: ir.Expr, scope: _Scope, mask: Optional[str]) -> Optional[str]:
        """``mask`` and the masks of the loads ``e`` reads (where a load is masked off, ``e``'s value is made
        up: such a lane's index or divisor must not fail a check)."""
        parts = [mask] if mask else []
        for ld in ir.loads(e):
            if ld.mask is not None:
                text = self.expr(ld.mask, scope)[0]
                if text not in parts:
                    parts.append(text)
        return " & ".join(f"({p})" if " " in p else p for p in parts) or None

    def assert_line(self, scope: _Scope, cond: str, msg: str, mask: Optional[str]) -> None:
        self.asserts += 1
        where = f", mask={mask}" if mask else ""
        scope.lines.append(f"{scope.indent}tl.device_assert({cond}, {msg!r}{where})")

    def check_divisor(self, e: ir.Op, divisor: str, scope: _Scope) -> None:
        """Integer division or remainder by zero raises in eager on the CPU (``ZeroDivisionError``, where the GPU
        gives an unspecified value without an error): a CPU graph's kernel asserts that the divisor is not 0
        where it is not proven so."""
        if self.sched.graph.device.type != "cpu" or e.dtype.is_floating_point or e.dtype == torch.bool or \
                e.name not in INT_DIVISIONS or nonzero(e.args[1]):
            return
        key = ("divisor", e.args[1])
        if scope.lookup(key):
            return
        ux, ur = self.expr_uses(e.args[1])
        valid = self.validity_mask(e.args[1], scope, self.level_mask(ux, ur))
        self.assert_line(scope, f"{divisor} != 0", f"{ASSERT_PREFIX}ZeroDivisionError: integer {e.name} by zero",
                         valid)
        scope.cache[key] = ("", torch.bool)

    def scope_for(self, uses_r: bool, scope: _Scope) -> _Scope:
        """Row-level values go to the outermost row scope (hoisted out of reduction loops)."""
        if uses_r:
            return scope
        s = scope
        while not s.row_level and s.parent is not None:
            s = s.parent
        return s

    # ------------------------------------------------------------------------------ expressions
    def emit(self, scope: _Scope, text: str, dtype: torch.dtype, key=None, prefix="tmp") -> tuple[str, torch.dtype]:
        name = self.fresh(prefix)
        scope.lines.append(f"{scope.indent}{name} = {text}")
        if key is not None:
            scope.cache[key] = (name, dtype)
        return name, dtype

    def expr(self, e: ir.Expr, scope: _Scope) -> tuple[str, torch.dtype]:
        """Text naming ``e``'s value (emitting lines as needed) and its register dtype."""
        key = e
        found = scope.lookup(key)
        if found:
            return found
        if isinstance(e, ir.Const):
            return self.const_text(e), P.compute_dtype(e.dtype)
        target = self.scope_for(self.uses_r(e), scope)
        if self.form == "rowloop" and not self.expr_uses(e)[0] and not isinstance(e, ir.Local):
            target = self.rowloop_top  # the same for every row (a norm's weight): loaded once, before the loop
        found = target.lookup(key)
        if found:
            return found
        reg = P.compute_dtype(e.dtype)
        if isinstance(e, ir.Load):
            return self.load(e, target)
        if isinstance(e, ir.Local):
            return self.local(e, scope)
        if isinstance(e, ir.IndexValue):
            kix = self.kernel_index(e.index)
            text = self.index_text(kix, target)
            self.check_indirect(kix, target, self.level_mask(*self.index_uses(kix)))
            if text.lstrip("-").isdigit() or re.fullmatch(r"ks\d+|xnumel|rnumel", text):
                return self.emit(target, f"tl.full([], {text}, {TL_DTYPE[e.dtype]})", e.dtype, key)
            return self.emit(target, f"({text}).to({TL_DTYPE[e.dtype]})", e.dtype, key)
        if isinstance(e, ir.Rand):
            self.uses_seed = True
            off = self.index_text(self.kernel_index(e.offset), target)
            fn = "tl.randn" if e.normal else "tl.rand"
            off = f"tl.full([], {off}, tl.uint32)" if re.fullmatch(r"-?\w+", off) and not off.startswith(("x", "r", "y")) \
                else f"({off}).to(tl.uint32)"
            return self.emit(target, f"{fn}(tl.load(seed_ptr + {e.seed}), {off})", torch.float32, key)
        if isinstance(e, ir.Cast):
            return self.cast(e, target, key)
        if isinstance(e, ir.Op):
            better = self.peepholes.get(key)
            if better is None:
                better = P.peephole(e, self.user_count, self.users_of)
                if better is e:
                    better = self.softmax_reciprocal(e)
                self.peepholes[key] = better
            if better is not e:
                return self.expr(better, scope)
            prim = P.PRIMITIVES[e.name]
            self.helpers.update(prim.helpers)
            # a helper (or a template calling a method) may call ``.to()`` or read ``.dtype`` of an operand:
            # a Python literal there (``_tf_pow(2.0, x)``) has neither, so it goes in as a typed 0-d tensor
            typed = bool(prim.helpers) or ".to(" in prim.template or e.name == "nextafter"
            args = []
            for a in e.args:
                text, dt = self.expr(a, target)
                if e.name in DISCONTINUOUS:
                    text = self.as_stored(a, text, target)
                args.append(self.tensor_text(text, dt, target) if typed else text)
            if e.name in INT_DIVISIONS:
                self.check_divisor(e, args[1], target)
            if e.name == "nextafter" and e.args[0].dtype in P.HALF:
                half = TL_DTYPE[e.args[0].dtype]
                args = [f"{a}.to({half})" for a in args]
                return self.emit(target, prim.template.format(*args) + ".to(tl.float32)", reg, key)
            return self.emit(target, prim.template.format(*args), reg, key)
        raise TypeError(f"cannot generate code for {type(e).__name__}")

    # element_cost's weights: a primitive's rough instruction count an element beyond 1 (the float32 erf's
    # polynomial, an exp's range reduction); any other op counts 1
    ELEMENT_COST = {"erf": 20, "erfc": 20, "tanh": 12, "exp": 4, "exp2": 3, "log": 4, "sigmoid": 6, "pow": 8}

    def element_cost(self) -> int:
        """A rough size of the work an element of the kernel's bodies (distinct ops, weighted by
        ELEMENT_COST). A norm's backward row loop is 11-13; with a GeLU's backward in it, 50."""
        seen: set[int] = set()
        cost = 0
        for body in self.bodies.values():
            for node in ir.walk(body):
                if id(node) in seen or not isinstance(node, ir.Op):
                    continue
                seen.add(id(node))
                cost += self.ELEMENT_COST.get(node.name, 1)
        return cost

    def user_count(self, e: ir.Expr) -> int:
        """How many distinct expressions of the kernel's bodies use ``e`` (expressions are interned: one
        object a value), so a peephole can tell a value shared with another use from one it may replace."""
        return len(self._user_map().get(e, ()))

    def users_of(self, e: ir.Expr) -> list:
        """The distinct expressions of the kernel's bodies that use ``e``."""
        return list(self._user_map().get(e, {}).values())

    def _user_map(self) -> dict:
        if self._users is None:
            users: dict = {}
            for body in self.bodies.values():
                for node in ir.walk(body):
                    for c in ir.children(node):
                        users.setdefault(c, {})[node] = node
            self._users = users
        return self._users

    def softmax_reciprocal(self, e: ir.Op) -> ir.Expr:
        """``a / s`` by a softmax denominator of this kernel, ``s = sum(exp(x - max(x)))``, as ``a * (1 / s)``:
        the reciprocal once a row instead of a division an element (Triton's float32 ``/`` is div.full: the
        divisor's range fix-ups, a reciprocal and multiplies an element; softmax_layer_norm's kernel goes 1072
        -> 1016 SASS instructions a thread on sm_90). Safe because such an ``s`` is at least 1
        (its largest term is exp(0)) or NaN, so ``1 / s`` cannot overflow; a product differs from the
        quotient by an ulp or two of float32. ``e`` itself for any other division."""
        if e.name != "truediv" or e.dtype != torch.float32 or not isinstance(e.args[1], ir.Local) \
                or not TUNING["softmax_reciprocal"]:
            return e
        a, s = e.args
        node, body = self.table.get(s.name), self.bodies.get(s.name)
        if not (isinstance(node, ir.Reduction) and node.kind == "sum" and self.uses_r(a)
                and isinstance(body, ir.Op) and body.name == "exp"
                and isinstance(body.args[0], ir.Op) and body.args[0].name == "sub"):
            return e
        x, m = body.args[0].args
        top = self.table.get(m.name) if isinstance(m, ir.Local) else None
        if not (isinstance(top, ir.Reduction) and top.kind == "max" and self.bodies.get(m.name) is x):
            return e
        return P.build("mul", a, P.build("reciprocal", s))

    def const_text(self, c: ir.Const) -> str:
        dt = P.compute_dtype(c.dtype)
        if c.from_size:
            return self.symbolic_const(c)
        v = c.value
        if dt == torch.bool:
            return f"tl.full([], {1 if v else 0}, tl.int1)"
        if dt.is_floating_point:
            v = float(v)
            if math.isnan(v):
                text = 'float("nan")'
            elif math.isinf(v):
                text = 'float("inf")' if v > 0 else '-float("inf")'
            else:
                text = repr(v)
            return text if dt == torch.float32 else f"tl.full([], {text}, {TL_DTYPE[dt]})"
        v = int(v)
        if dt == torch.int32 and -2**31 <= v < 2**31:
            return str(v) if v >= 0 else f"({v})"
        return f"tl.full([], {v}, {TL_DTYPE[dt]})"

    def tensor_text(self, text: str, reg: torch.dtype, scope: _Scope) -> str:
        """``text`` as something ``.to()`` can be called on: a Python literal (``0.0``, ``(-3)``,
        ``float("inf")``) or a scalar kernel argument (``ks0``, ``kf0``) becomes a typed 0-d tensor."""
        if re.fullmatch(r"[A-Za-z_]\w*", text) and not re.fullmatch(r"k[sfi]\d+", text) and \
                text not in ("xnumel", "rnumel", "ynumel"):
            return text
        if text.startswith("tl."):  # tl.full(...) and other tl calls are tensors already
            return f"({text})"
        return self.emit(scope, f"tl.full([], {text}, {TL_DTYPE[reg]})", reg)[0]

    def as_stored(self, e: ir.Expr, text: str, scope: _Scope) -> str:
        """``text`` (the register value of ``e``) rounded to ``e``'s half type when it was computed in float32
        and not rounded since (see DISCONTINUOUS); a loaded, constant or cast value already is."""
        if e.dtype not in P.HALF or isinstance(e, (ir.Load, ir.Const, ir.Cast)) or \
                (isinstance(e, ir.Op) and e.name == "round_fp16"):
            return text
        key = ("stored", e)
        found = scope.lookup(key)
        if found:
            return found[0]
        return self.emit(scope, f"{text}.to({TL_DTYPE[e.dtype]}).to(tl.float32)", torch.float32, key)[0]

    def cast(self, e: ir.Cast, scope, key):
        text, src_reg = self.expr(e.arg, scope)
        dst, src = e.dtype, e.arg.dtype
        if src in P.HALF and dst != src:
            # out of a half type (an upcast, an integer or bool cast): eager converts the stored, rounded
            # value. An unrounded one differs from the same value rounded elsewhere (layer norm's float32 x
            # minus its mean saved in bfloat16: not 0 over one element, then times rsqrt(eps)), and at jumps
            text = self.as_stored(e.arg, text, scope)
        text = self.tensor_text(text, src_reg, scope)
        reg = P.compute_dtype(dst)
        if dst in float8.FP8_DTYPES:
            if src == dst:
                return text, reg
            # torch's rounding and overflow rule from float32 arithmetic (compiler/ir/float8.py says why not
            # Triton's cast); a float8 register is the float32 on its grid
            base = text if src_reg == torch.float32 else f"{text}.to(tl.float32)"
            call, helper = float8.cast_text(base, dst)
            self.helpers.add(helper)
            return self.emit(scope, call, reg, key)
        if dst in P.HALF:
            if src in P.HALF and src == dst:
                return text, reg
            base = text if src_reg.is_floating_point else f"{text}.to(tl.float32)"
            return self.emit(scope, f"{base}.to({TL_DTYPE[dst]}).to(tl.float32)", reg, key)
        if reg == src_reg:
            return text, reg
        if dst == torch.bool:
            return self.emit(scope, f"({text} != 0)", reg, key)
        if src_reg.is_floating_point and not dst.is_floating_point and dst in (torch.int8, torch.int16, torch.uint8):
            # float -> narrow int: through int64, wrapping as torch's CPU conversion does
            return self.emit(scope, f"{text}.to(tl.int64).to({TL_DTYPE[dst]})", reg, key)
        return self.emit(scope, f"{text}.to({TL_DTYPE[reg]})", reg, key)

    # --------------------------------------------------------------------------- memory access
    def kernel_index(self, ix: ir.Index) -> ir.Index:
        return ir.substitute(ix, self.kmap)

    def physical(self, buffer: str, index) -> ir.Index:
        meta = ir.node_meta(self.table[buffer], buffer)
        return self.kernel_index(ir.strided_offset(index, meta.stride))

    def level_mask(self, uses_x: bool, uses_r: bool) -> Optional[str]:
        outer_mask, inner_mask = self.masks
        if uses_x and uses_r:
            return "mask"
        if uses_x:
            return outer_mask
        if uses_r:
            return inner_mask
        return None

    def load(self, e: ir.Load, scope: _Scope):
        key = e
        off = self.physical(e.buffer, e.index)
        empty = math.prod(ir.node_meta(self.table[e.buffer], e.buffer).shape) == 0
        if empty and not any(a.op for a in ir._indirect_atoms(off)):
            # a buffer with no elements (a reduction over an empty dim: prod of a (0,) tensor is 1) is never
            # read: every position that would use the value is masked off, and its index need not be in bounds
            reg = P.compute_dtype(e.dtype)
            return self.emit(scope, f"tl.full([], 0, {TL_DTYPE[reg]})", reg, key)
        ptr = None if empty else self.pointer("load", e.buffer)
        offtext = self.index_text(off, scope)
        ux, ur = self.index_uses(off)
        mask = self.level_mask(ux, ur)
        if e.mask is not None:
            mtext, _ = self.expr(e.mask, scope)
            mux, mur = self.expr_uses(e.mask)
            mask = self.level_mask(ux or mux, ur or mur) if (mux or mur) else mask
            mask = f"{mask} & {mtext}" if mask else mtext
            if not (ux or ur):  # a scalar address under a tensor mask: broadcast the address
                offtext = f"{offtext} + 0 * {self.zero_shape(mux, mur)}"
        self.check_indirect(off, scope, mask)
        if empty:
            # a data-dependent index into a buffer with no elements: checked above (every index is out of
            # bounds), nothing to read
            reg = P.compute_dtype(e.dtype)
            return self.emit(scope, f"tl.full([], 0, {TL_DTYPE[reg]})", reg, key)
        args = f"{ptr} + ({offtext})"
        if mask:
            other = "0.0" if e.dtype in float8.FP8_DTYPES else "0"  # the interpreter casts no int to float8
            args += f", {mask}, other={other}"
        text = f"tl.load({args})"
        if e.dtype in P.HALF:
            text += ".to(tl.float32)"
        text = self.fp8_loaded(text, e.dtype)
        return self.emit(scope, text, P.compute_dtype(e.dtype), key)

    def fp8_loaded(self, text: str, dtype) -> str:
        """A loaded value of ``dtype`` as its register value: float8 decoded from its bits (compiler/ir/float8.py)."""
        if dtype not in float8.FP8_DTYPES:
            return text
        call, helper = float8.load_text(text, dtype)
        self.helpers.add(helper)
        return call

    def stored_text(self, value: str, reg, dtype) -> str:
        """``value`` (a register of dtype ``reg``) converted for a store into a buffer of ``dtype``."""
        if dtype in float8.FP8_DTYPES:
            call, helper = float8.store_text(value if reg == torch.float32 else f"{value}.to(tl.float32)", dtype)
            self.helpers.add(helper)
            return call
        return f"{value}.to({TL_DTYPE[dtype]})"

    def zero_shape(self, ux: bool, ur: bool) -> str:
        outer, inner = self.pvars
        if inner is None:
            return outer
        if ux and ur:
            return f"({outer} + {inner})"
        return outer if ux or not ur else inner

    def index_uses(self, ix: ir.Index) -> tuple[bool, bool]:
        names = ix.free_vars()
        ux = self.pvars[0] in names
        ur = self.pvars[1] in names if self.pvars[1] else False
        for atom in ir._indirect_atoms(ix):
            ax, ar = self.expr_uses(atom.expr)
            ux, ur = ux or ax, ur or ar
        return ux, ur

    def expr_uses(self, e: ir.Expr) -> tuple[bool, bool]:
        key = ("uses", e)
        found = self.uses_cache.get(key)
        if found is not None:
            return found
        if isinstance(e, ir.Local):
            r = self.local_uses[e.name]
        elif isinstance(e, ir.Load):
            r = self.index_uses(self.physical(e.buffer, e.index))
            if e.mask is not None:
                m = self.expr_uses(e.mask)
                r = (r[0] or m[0], r[1] or m[1])
        elif isinstance(e, ir.IndexValue):
            r = self.index_uses(self.kernel_index(e.index))
        elif isinstance(e, ir.Rand):
            r = self.index_uses(self.kernel_index(e.offset))
        else:
            ux = ur = False
            for c in ir.children(e):
                cx, cr = self.expr_uses(c)
                ux, ur = ux or cx, ur or cr
            r = (ux, ur)
        self.uses_cache[key] = r
        return r

    def uses_r(self, e: ir.Expr) -> bool:
        return self.expr_uses(e)[1] if self.form in ("persistent", "looped", "rowloop") else False

    def local(self, e: ir.Local, scope: _Scope):
        if e.name in self.local_values:
            return self.local_values[e.name]
        if e.name in self.macro_roots:  # looped form: a full-row root is recomputed in each loop
            return self.expr(self.bodies[e.name], scope)
        raise AssertionError(f"value of {e.name} used before it is computed")

    # ------------------------------------------------------------------------------------ kernel
    def write(self) -> KernelSource:
        g = self.g
        self.uses_cache: dict = {}
        self.bodies = dict(g.bodies)
        self.positions = dict(g.positions)
        self.local_values: dict[str, tuple[str, torch.dtype]] = {}
        self.macro_roots: set[str] = set()
        space, reduced = g.space, g.reduced
        numel = math.prod(space) if space else 1
        kept = [d for d in range(len(space)) if d not in reduced]
        xnumel = math.prod(space[d] for d in kept) if kept else 1
        rnumel = math.prod(space[d] for d in reduced) if reduced else 1
        need64 = self.needs_int64(numel)
        itype = "tl.int64" if need64 else "tl.int32"

        if g.kind == "reduction":
            self.pvars, self.masks = ("xindex", "rindex"), ("xmask", "rmask")
            xvar = ir.var_index("xindex", xnumel)
            rvar = ir.var_index("rindex", rnumel)
            xs = ir.unravel(xvar, [space[d] for d in kept])
            rs = ir.unravel(rvar, [space[d] for d in reduced])
            self.kmap = {}
            for k, d in enumerate(kept):
                self.kmap[f"k{d}"] = xs[k]
            for k, d in enumerate(reduced):
                self.kmap[f"k{d}"] = rs[k]
            persistent_max = INTERP_PERSISTENT_MAX_R if self.target.interpreter else PERSISTENT_MAX_R
            self.form = "persistent" if rnumel <= persistent_max else "looped"
            if g.columns:
                self.form = "rowloop"
            elif self.form == "persistent" and not self.target.interpreter and \
                    self.r_is_outer() and (next_pow2(rnumel) > TUNING["outer_persistent_max_r"] or
                                           -(-xnumel // TUNING["outer_xblock"]) >
                                           TUNING["outer_persistent_max_waves"] * self.target.multiprocessors):
                # a persistent column reduction holds few columns of many rows: short runs of memory; with
                # many column programs the looped form's small programs keep more loads in flight
                self.form = "looped"
        else:
            self.form = "pointwise"
            self.pvars, self.masks = ("xindex", None), ("xmask", None)
            flat = ir.unravel(ir.var_index("xindex", numel), space)
            self.kmap = {f"k{d}": flat[d] for d in range(len(space))}
            if len(space) >= 2 and self.divmod_count() > 0:
                tiled = self.tiled_map(space)
                flat_cost = self.divmod_count()
                saved = self.kmap
                self.kmap = tiled
                self.form = "tiled"
                self.pvars, self.masks = ("yindex", "xindex"), ("ymask", "xmask")
                if self.divmod_count(inner_only=True) >= flat_cost:
                    self.kmap, self.form = saved, "pointwise"
                    self.pvars, self.masks = ("xindex", None), ("xmask", None)
        self.local_uses = {}
        for r in g.roots:
            self.local_uses[r] = self.root_uses(r)
        body_lines, constexprs, grid, warps = self.body(space, reduced, xnumel, rnumel, numel, itype)
        return self.module(body_lines, constexprs, grid, warps, xnumel, rnumel, numel)

    def root_uses(self, r) -> tuple[bool, bool]:
        """(row level, element level) of a root's value: in a reduction kernel a root whose position runs
        over the reduced dims is per element, a reduction's or a row root's value is per row."""
        if self.form in ("persistent", "looped", "rowloop") and not isinstance(self.table[r], ir.Reduction):
            return (True, _covers(self.positions[r], self.g.reduced))
        return (True, False)

    def divmod_count(self, inner_only: bool = False) -> int:
        """DivMod atoms in the group's memory offsets (each costs a division a element in the flat form)."""
        count = 0
        for off in self.memory_offsets():
            for atom, _ in off.terms:
                if isinstance(atom, ir.DivMod) and (not inner_only or "xindex" in atom.inner.free_vars()):
                    count += 1
        return count

    def memory_offsets(self):
        """The physical offset of every load and store of the group."""
        for r, body in self.g.bodies:
            for ld in ir.loads(body):
                yield self.physical(ld.buffer, ld.index)
            if r in self.g.stores:
                yield self.physical(r, self.positions[r])

    def x_contiguous_tile(self) -> bool:
        """Tiled form: True when each load's and store's offset steps by 0 or 1 element along the last dim
        (no transposed operand, which wants a tile of several rows to read its columns in runs)."""
        for off in self.memory_offsets():
            for atom, coef in off.terms:
                if isinstance(atom, ir.Var):
                    if atom.name == "xindex" and coef != 1:
                        return False
                elif not isinstance(atom, ir.DivMod) or "xindex" in atom.inner.free_vars():
                    return False  # a gather, or a division of the column index
        return True

    def tiled_map(self, space) -> dict:
        outer = space[:-1]
        ys = ir.unravel(ir.var_index("yindex", math.prod(outer)), outer)
        m = {f"k{d}": ys[d] for d in range(len(outer))}
        m[f"k{len(space) - 1}"] = ir.var_index("xindex", space[-1])
        return m

    def needs_int64(self, numel) -> bool:
        if numel >= 2**31 - 1:
            return True
        names = {ld.buffer for _, b in self.g.bodies for ld in ir.loads(b)} | set(self.g.stores)
        for name in names:
            meta = ir.node_meta(self.table[name], name)
            extent = sum((s - 1) * abs(st) for s, st in zip(meta.shape, meta.stride)) + 1
            if extent >= 2**31 - 1:
                return True
        return False

    # ---------------------------------------------------------------------------------- bodies
    def body(self, space, reduced, xnumel, rnumel, numel, itype):
        t = self.target
        lines: list[str] = []
        top = _Scope(None, "    ", True)
        cast64 = ".to(tl.int64)" if itype == "tl.int64" else ""
        if self.form == "pointwise":
            self.named_size("xnumel", numel)
            block = min(next_pow2(numel), INTERP_BLOCK if t.interpreter else POINTWISE_BLOCK)
            block = max(block, 1)
            warps = self.warps(block)
            small = int(TUNING["small_pointwise_block"])
            if not t.interpreter and small and small < block and -(-numel // block) < t.multiprocessors:
                # fewer programs than SMs (tuning.SMALL_POINTWISE_BLOCK): latency-bound; the same warps over
                # smaller blocks, about one program an SM
                block = max(small, min(block, next_pow2(-(-numel // t.multiprocessors))))
            top.lines += ["    xoffset = tl.program_id(0)" + cast64 + " * XBLOCK",
                          "    xindex = xoffset + tl.arange(0, XBLOCK)",
                          "    xmask = xindex < xnumel"]
            self.emit_roots(top, stores_level=("xmask",))
            return top.lines, (("XBLOCK", block),), (-(-numel // block),), warps
        if self.form == "tiled":
            inner = space[-1]
            outer = math.prod(space[:-1])
            self.named_size("xnumel", inner)
            self.named_size("ynumel", outer)
            cap = INTERP_BLOCK if t.interpreter else TILE_ELEMS
            per_thread = ELEMS_PER_THREAD
            if t.interpreter:
                xb = min(next_pow2(inner), cap)
            elif self.x_contiguous_tile():
                # decision 022: 2048 elements at 16 a thread (two rows of 1024 at 4 warps: a broadcast operand's
                # conversion and the program's setup shared by twice the elements) 0.138 ms on gelu_chain
                # against 0.147 at 1024 / 8
                cap, per_thread = int(TUNING["tile_elems"]), int(TUNING["tile_thread_elems"])
                # every operand is contiguous or broadcast along the last dim (a bias, a scale): rows of up to
                # TILE_ELEMS columns, so a broadcast [1, XBLOCK] operand is laid out like the tile (8
                # contiguous elements a thread, one 16-byte load) instead of 1 a thread and a shared-memory
                # layout conversion (an 8 x 128 tile: 2048 bytes of shared memory and barriers in gelu_chain's
                # forward, 0.245 ms vs Inductor's flat 0.224)
                xb = min(next_pow2(inner), int(TUNING["tile_contiguous_xblock"]))
            else:
                xb = min(next_pow2(inner), 128)
            yb = max(1, min(next_pow2(outer), cap // xb))
            xblocks, yblocks = -(-inner // xb), -(-outer // yb)
            if TUNING["tile_grid_2d"] and yblocks <= MAX_GRID_Y:
                # column blocks on the grid's x axis, row blocks on its y axis: no division of the program id
                # (a division by the runtime block count is ~30 instructions a thread: 4 an element of
                # gelu_chain's forward at 8 elements a thread, of ~35)
                top.lines += ["    xindex = tl.program_id(0)" + cast64 + " * XBLOCK + tl.arange(0, XBLOCK)[None, :]",
                              "    yindex = tl.program_id(1)" + cast64 + " * YBLOCK + tl.arange(0, YBLOCK)[:, None]"]
                grid = (xblocks, yblocks)
            else:
                top.lines += ["    pid = tl.program_id(0)" + cast64,
                              "    xblocks = tl.cdiv(xnumel, XBLOCK)",
                              "    yindex = (pid // xblocks) * YBLOCK + tl.arange(0, YBLOCK)[:, None]",
                              "    xindex = (pid % xblocks) * XBLOCK + tl.arange(0, XBLOCK)[None, :]"]
                grid = (yblocks * xblocks,)
            top.lines += ["    ymask = yindex < ynumel",
                          "    xmask = xindex < xnumel",
                          "    mask = ymask & xmask"]
            self.emit_roots(top, stores_level=("mask",))
            warps = self.warps(xb * yb, per_thread)
            return top.lines, (("YBLOCK", yb), ("XBLOCK", xb)), grid, warps
        # reductions
        self.named_size("xnumel", xnumel)
        self.named_size("rnumel", rnumel)
        if self.form == "persistent":
            rb = next_pow2(rnumel)
            outer = not t.interpreter and self.r_is_outer()
            # the row knobs apply to row reductions; a column reduction's persistent form keeps its own sizes
            per_prog = INTERP_BLOCK * 4 if t.interpreter else \
                PERSISTENT_ELEMS if outer else int(TUNING["persistent_elems"])
            per_thread = ELEMS_PER_THREAD if outer else int(TUNING["persistent_thread_elems"])
            xb = max(1, min(next_pow2(xnumel), per_prog // rb))
            # few rows (a split reduction's second stage: cross-entropy's 128 partial rows of its loss): no
            # fewer programs than SMs while a program has rows to give (decision 022: 8 programs of 16 rows took
            # 18 us of cross_entropy's 578)
            while not outer and not t.interpreter and xb > 1 and -(-xnumel // xb) < t.multiprocessors:
                xb //= 2
            if outer:
                # columns are the contiguous dim: at least outer_run_bytes of each row a program
                xb = max(1, min(next_pow2(xnumel), max(xb, TUNING["outer_run_bytes"] // self.biggest_itemsize())))
            # fewer rows than SMs (then one row a program, above): a latency-bound chain a program, see TUNING
            # latency_rows_thread_elems
            latency_bound = not outer and not t.interpreter and xnumel < t.multiprocessors
            if latency_bound:
                per_thread = int(TUNING["latency_rows_thread_elems"])
            top.lines += ["    xoffset = tl.program_id(0)" + cast64 + " * XBLOCK",
                          "    xindex = xoffset + tl.arange(0, XBLOCK)[:, None]",
                          "    xmask = " + _even_mask("xindex < xnumel", xnumel % xb == 0, "[XBLOCK, 1]"),
                          "    rindex = tl.arange(0, RBLOCK)[None, :]" + (cast64 and ""),
                          "    rmask = " + _even_mask("rindex < rnumel", rnumel == rb, "[1, RBLOCK]"),
                          "    mask = xmask & rmask"]
            self.emit_reduction_persistent(top, loads_first=TUNING["persistent_loads_first"] or
                                           (latency_bound and TUNING["latency_rows_loads_first"]))
            warps = self.warps(xb * rb, per_thread)
            return top.lines, (("XBLOCK", xb), ("RBLOCK", rb)), (-(-xnumel // xb),), warps
        if self.form == "rowloop":
            return self.body_rowloop(top, xnumel, rnumel, itype)
        outer = self.r_is_outer()
        warps = 0
        per_thread = ELEMS_PER_THREAD
        if outer and t.interpreter:
            rb = max(1, min(next_pow2(rnumel), INTERP_BLOCK // INTERP_OUTER_XBLOCK))
            xb = min(next_pow2(xnumel), INTERP_OUTER_XBLOCK)
        elif outer:
            rb = min(next_pow2(rnumel), TUNING["outer_rblock"])
            xb = min(next_pow2(xnumel), TUNING["outer_xblock"])
            # a split's second stage (4096 columns of 256 partials) would be 16 programs on 132 SMs
            while xb > TUNING["outer_min_xblock"] and -(-xnumel // xb) < t.multiprocessors:
                xb //= 2
            warps = TUNING["outer_warps"]
        else:
            rb = min(next_pow2(rnumel), INTERP_BLOCK if t.interpreter else int(TUNING["looped_rblock"]))
            xb = 1
            per_thread = int(TUNING["looped_thread_elems"])
        top.lines += ["    xoffset = tl.program_id(0)" + cast64 + " * XBLOCK",
                      "    xindex = xoffset + tl.arange(0, XBLOCK)[:, None]",
                      "    xmask = " + _even_mask("xindex < xnumel", xnumel % xb == 0, "[XBLOCK, 1]"),
                      "    rbase = tl.arange(0, RBLOCK)[None, :]"]
        self.emit_reduction_looped(top, itype, rnumel % rb == 0)
        warps = self.warps(xb * rb, per_thread) if not warps or t.interpreter else int(warps)
        return top.lines, (("XBLOCK", xb), ("RBLOCK", rb)), (-(-xnumel // xb),), warps

    def body_rowloop(self, top: _Scope, xnumel: int, rnumel: int, itype: str):
        """Rows x whole reduced rows (the persistent form) in a loop over a program's chunk of rows, with the
        group's column roots (a split column reduction's first stage: a norm backward's weight and bias
        gradients) accumulated over the chunk and written as one partial row per program. The row kernel
        already reads every operand the column sums need: one pass over memory instead of two."""
        t = self.target
        chunk = self.g.columns[0][1]
        programs = -(-xnumel // chunk)
        self.named_size("xchunk", chunk)
        rb = next_pow2(rnumel)
        row_sums = any(isinstance(self.table[r], ir.Reduction) and r not in dict(self.g.columns)
                       for r in self.g.roots)
        if t.interpreter:
            xb = max(1, min(next_pow2(chunk), INTERP_BLOCK * 4 // rb))
        else:
            rows = int(TUNING["rowloop_rows"])
            if rows == 1 and row_sums and self.element_cost() >= TUNING["rowloop_heavy_cost"]:
                rows = 2  # (two rows share each step's row sums and their barriers)
            xb = max(1, min(next_pow2(chunk), rows))
        cast64 = ".to(tl.int64)" if itype == "tl.int64" else ""
        top.lines += ["    pid = tl.program_id(0)" + cast64,
                      "    xstart = pid * xchunk",
                      "    rindex = tl.arange(0, RBLOCK)[None, :]",
                      "    rmask = " + _even_mask("rindex < rnumel", rnumel == rb, "[1, RBLOCK]")]
        columns = {r: self.accumulator(top, self.table[r]) for r, _ in self.g.columns}
        self.rowloop_top = top
        # the loop is the row level (row values are per step); a value the same for every row (a norm's
        # weight) goes before the loop (expr())
        loop = _Scope(top, "        ", True)
        if TUNING["rowloop_exact_rows"] and (xb == 1 or (xnumel % xb == 0 and chunk % xb == 0)):
            # every step's rows are in range (the chunk's rows below xnumel; with XBLOCK > 1, when the rows and
            # the chunk are whole steps): no row mask (Triton folds it). The kernel text then depends on that
            # evenness, as the row mask's does on RBLOCK == rnumel.
            loop.lines += ["    for xoffset in range(0, tl.minimum(xchunk, xnumel - xstart), XBLOCK):",
                           "        xindex = xstart + xoffset + tl.arange(0, XBLOCK)[:, None]",
                           "        xmask = tl.full([XBLOCK, 1], 1, tl.int1)",
                           "        mask = xmask & rmask"]
        else:
            loop.lines += ["    for xoffset in range(0, xchunk, XBLOCK):",
                           "        xindex = xstart + xoffset + tl.arange(0, XBLOCK)[:, None]",
                           "        xmask = (xindex < xnumel) & (xindex < xstart + xchunk)",
                           "        mask = xmask & rmask"]
        self.emit_reduction_persistent(loop, columns)
        prefetch = TUNING["rowloop_prefetch"] and row_sums
        top.lines.extend(self.prefetched_rows(loop.lines) if prefetch else loop.lines)
        for r, _ in self.g.columns:
            node = self.table[r]
            a, reg = columns[r]
            red = self.emit(top, self.reduce_block(node.kind, a, reg, top, axis=0), reg, prefix="red")[0]
            self.local_values[r] = (red, P.compute_dtype(node.dtype))
            if r not in self.g.stores:
                continue
            meta = ir.node_meta(node, r)
            off = ir.strided_offset((ir.var_index("pid", programs), ir.var_index("rindex", rnumel)), meta.stride)
            cast = f".to({TL_DTYPE[node.dtype]})" if node.dtype != torch.bool and node.dtype != reg else ""
            top.lines.append(f"    tl.store({self.pointer('store', r)} + ({self.index_text(off, top)}), "
                             f"{red}{cast}, rmask)")
        row_loads = sum(1 for line in loop.lines if (m := self._ROW_LOAD.match(line)) and
                        re.search(r"\bxindex\b", m.group("ptr")) and re.search(r"\brindex\b", m.group("ptr")))
        wide = row_sums and row_loads <= TUNING["rowloop_wide_max_loads"]
        per_thread = int(TUNING["rowloop_thread_elems"]) if wide else ELEMS_PER_THREAD
        warps = TUNING["rowloop_warps"] if TUNING["rowloop_warps"] and not t.interpreter else \
            self.warps(xb * rb, per_thread)
        return top.lines, (("XBLOCK", xb), ("RBLOCK", rb)), (programs,), int(warps)

    _ROW_LOAD = re.compile(r"^        (?P<name>\w+) = tl\.load\((?P<ptr>.+), (?P<mask>x?mask), other=(?P<other>[\w.]+)\)"
                           r"(?P<rest>(\.to\(tl\.\w+\))*)$")
    _PREFETCHABLE = re.compile(r"in_ptr\d+|ks\d+|xindex|rindex|xnumel|rnumel|xchunk")

    @classmethod
    def prefetched_rows(cls, lines: list[str]) -> list[str]:
        """The row loop's text (four header lines, then the body) with each load of a row's own operands
        issued one step ahead: before the loop for the first step, then at the top of each step for the
        next, into a loop-carried ``pf_`` value the next step reads (TUNING rowloop_prefetch). The loads
        then run under the step's row sums and stores. Only loads at the body's top level whose address
        uses nothing but the pointers, sizes and indices; the next step's rows are masked like the step's
        (past the chunk's end the load is off)."""
        header, body = lines[:4], lines[4:]
        moved, kept = [], []
        for line in body:
            m = cls._ROW_LOAD.match(line)
            names = set(re.findall(r"[A-Za-z_]\w*", m.group("ptr"))) if m else set()
            if m and "xindex" in names and all(cls._PREFETCHABLE.fullmatch(n) for n in names):
                moved.append(m)
            else:
                kept.append(line)
        if not moved:
            return lines

        def load(m, ind):
            ptr = re.sub(r"\bxindex\b", "xnext", m.group("ptr"))
            mask = "nmask" if m.group("mask") == "mask" else "nxmask"
            return f"{ind}pf_{m.group('name')} = tl.load({ptr}, {mask}, other={m.group('other')})"

        def next_rows(ind, start):
            return [f"{ind}xnext = {start}",
                    f"{ind}nxmask = (xnext < xnumel) & (xnext < xstart + xchunk)",
                    f"{ind}nmask = nxmask & rmask"]
        out = next_rows("    ", "xstart + tl.arange(0, XBLOCK)[:, None]") + [load(m, "    ") for m in moved]
        out += header + [f"        {m.group('name')} = pf_{m.group('name')}{m.group('rest')}" for m in moved]
        out += next_rows("        ", "xindex + XBLOCK") + [load(m, "        ") for m in moved]
        return out + kept

    def erf_outputs_are_half(self) -> bool:
        """Every value the kernel computes from an erf (or erfc) is rounded to float16 or bfloat16 before it
        reaches an output, and there is one: then the erfc polynomial's half-precision text
        (primitives.HALF_HELPERS) serves, its error far below what those roundings take away. The rounding is
        a half-typed store, or a cast to a half type inside the kernel: a float32 partial column sum of a
        GeLU's gradient adds values that were each rounded to bf16 first (as eager's gradient is), so the
        polynomial's error moves a summand only where it sits within that error of a rounding boundary. An
        output that does not depend on an erf (a norm's float32 mean and rstd saved beside its GeLU'd bf16
        output) does not matter; a float32 output that takes an erf's value unrounded keeps the full text."""
        memo: dict[str, tuple[bool, bool]] = {}

        def erf_of(r: str) -> tuple[bool, bool]:
            """(an erf feeds root r's value at all, one feeds it without a rounding to half between), from
            its body's nodes in ir.walk's order (operands first), a local root's pair memoised by name."""
            if r not in memo:
                memo[r] = (False, False)
                used: dict[int, bool] = {}
                raw: dict[int, bool] = {}
                for n in ir.walk(self.bodies[r]):
                    if isinstance(n, ir.Local):
                        used[id(n)], raw[id(n)] = erf_of(n.name) if n.name in self.bodies else (False, False)
                        continue
                    erf = isinstance(n, ir.Op) and n.name in ("erf", "erfc")
                    kids = ir.children(n)
                    used[id(n)] = erf or any(used[id(c)] for c in kids)
                    rounds = isinstance(n, ir.Cast) and n.dtype in (torch.float16, torch.bfloat16)
                    raw[id(n)] = not rounds and (erf or any(raw[id(c)] for c in kids))
                root = id(self.bodies[r])
                memo[r] = (used[root], raw[root])
            return memo[r]

        with_erf = [r for r in self.g.stores if r in self.bodies and erf_of(r)[0]]
        return bool(with_erf) and all(
            ir.node_meta(self.table[r], r).dtype in (torch.float16, torch.bfloat16) or not erf_of(r)[1]
            for r in with_erf)

    def warps(self, elems: int, per_thread: int = ELEMS_PER_THREAD) -> int:
        if self.target.interpreter:
            return 1
        w = elems // (self.target.warp_size * per_thread)
        return int(min(max(next_pow2(max(w, 1)), 1), MAX_WARPS if self.target.warp_size == 32 else MAX_WARPS // 2))

    def biggest_load(self):
        """The load of the group's biggest input (the first of equals), or None when it loads nothing."""
        best, best_bytes = None, -1
        for _, body in self.g.bodies:
            for ld in ir.loads(body):
                meta = ir.node_meta(self.table[ld.buffer], ld.buffer)
                b = math.prod(meta.shape) * meta.dtype.itemsize if meta.shape else 0
                if b > best_bytes:
                    best, best_bytes = ld, b
        return best

    def biggest_itemsize(self) -> int:
        ld = self.biggest_load()
        return 4 if ld is None else ir.node_meta(self.table[ld.buffer], ld.buffer).dtype.itemsize

    def r_is_outer(self) -> bool:
        """True when the reduced dims are not the contiguous ones of the biggest input (column sums)."""
        best = self.biggest_load()
        if best is None:
            return False
        off = self.physical(best.buffer, best.index)
        for atom, coef in off.terms:
            if abs(coef) != 1:
                continue
            if isinstance(atom, ir.Var) and atom.name == "xindex":
                return True
            # the last kept dim of several (a split's first stage over (chunks, columns)): xindex % columns
            if isinstance(atom, ir.DivMod) and atom.div == 1 and atom.inner.free_vars() == {"xindex"} and \
                    len(atom.inner.terms) == 1 and atom.inner.terms[0][1] == 1:
                return True
        return False

    def store_root(self, r: str, value: str, scope: _Scope, level_mask: str):
        node = self.table[r]
        ptr = self.pointer("store", r)
        off = self.physical(r, self.positions[r])
        offtext = self.index_text(off, scope)
        ux, ur = self.index_uses(off)
        if not ux and not ur:
            offtext = f"{offtext} + 0 * {self.pvars[0]}"
        dtype = node.dtype
        if dtype != torch.bool and dtype != self.value_dtype(r):
            value = self.stored_text(self.tensor_text(value, self.value_dtype(r), scope), self.value_dtype(r), dtype)
        scope.lines.append(f"{scope.indent}tl.store({ptr} + ({offtext}), {value}, {level_mask})")

    def value_dtype(self, r: str) -> torch.dtype:
        """The register dtype of root ``r``'s value (the dtype the store converts from)."""
        v = self.local_values.get(r)
        return v[1] if v else P.compute_dtype(self.table[r].dtype)

    def emit_roots(self, scope: _Scope, stores_level):
        for r in self.g.roots:
            text, _ = self.expr(self.bodies[r], scope)
            self.local_values[r] = (text, P.compute_dtype(self.table[r].dtype))
            if r in self.g.stores:
                self.store_root(r, text, scope, stores_level[0])

    # ------------------------------------------------------------------------------ reductions
    def identity(self, kind: str, dtype: torch.dtype) -> str:
        reg = P.compute_dtype(dtype)
        if kind in ("sum", "any"):
            return "0"
        if kind in ("prod", "all"):
            return "1"
        big = kind in ("min", "argmin")
        if reg.is_floating_point:
            return 'float("inf")' if big else '-float("inf")'
        if reg == torch.bool:
            return "1" if big else "0"
        info = torch.iinfo(reg)
        return str(info.max if big else info.min)

    def reduce_block(self, kind, value, vdtype, scope, acc=None, axis: int = 1):
        """tl.* reduction of a [XBLOCK, RBLOCK] block over ``axis`` (1: kept as [XBLOCK, 1]; 0: [1, RBLOCK])."""
        fl = vdtype.is_floating_point
        if kind == "sum":
            return f"tl.sum({value}, {axis}, keep_dims=True)"
        if kind in ("any", "all"):
            fn = "tl.max" if kind == "any" else "tl.min"
            return f"({fn}({value}.to(tl.int32), {axis}, keep_dims=True) != 0)"
        if kind in ("max", "min"):
            if fl:
                self.helpers.add(f"_tf_{kind}_combine")
                return f"tl.reduce({value}, {axis}, _tf_{kind}_combine, keep_dims=True)"
            return f"tl.{kind}({value}, {axis}, keep_dims=True)"
        if kind == "prod":
            self.helpers.add("_tf_prod_combine")
            return f"tl.reduce({value}, {axis}, _tf_prod_combine, keep_dims=True)"
        raise ValueError(kind)

    def accumulate(self, k: str, a: str, v: str, reg: torch.dtype) -> str:
        """The statement folding block ``v`` into the elementwise accumulator ``a`` (a loop's step)."""
        if k == "sum":
            return f"{a} = {a} + {v}"
        if k == "prod":
            return f"{a} = {a} * {v}"
        if k == "any":
            return f"{a} = {a} | {v}"
        if k == "all":
            return f"{a} = {a} & {v}"
        if k in ("max", "min"):
            if reg.is_floating_point:
                self.helpers.add(f"_tf_{k}_combine")
                return f"{a} = _tf_{k}_combine({a}, {v})"
            return f"{a} = tl.{'maximum' if k == 'max' else 'minimum'}({a}, {v})"
        self.helpers.add(f"_tf_{k}_combine")
        return f"{a}, {a}_idx = _tf_{k}_combine({a}, {a}_idx, {v}, tl.broadcast_to(rindex, [XBLOCK, RBLOCK]))"

    def accumulator(self, scope: _Scope, node) -> tuple[str, torch.dtype]:
        """A [XBLOCK, RBLOCK] accumulator of reduction ``node``, initialised to its identity in ``scope``."""
        reg = P.compute_dtype(node.body.dtype) if node.kind not in ("any", "all") else torch.bool
        init_dt = TL_DTYPE[reg] if reg != torch.bool else "tl.int1"
        a = self.fresh("acc")
        ident = self.identity(node.kind, node.body.dtype)
        scope.lines.append(f"{scope.indent}{a} = tl.full([XBLOCK, RBLOCK], {ident}, {init_dt})")
        if node.kind in ("argmax", "argmin"):
            scope.lines.append(f"{scope.indent}{a}_idx = tl.full([XBLOCK, RBLOCK], 2147483647, tl.int32)")
        return a, reg

    def reduction_input(self, r: str, scope: _Scope) -> tuple[str, torch.dtype]:
        node = self.table[r]
        text, reg = self.expr(self.bodies[r], scope)
        if node.kind in ("argmax", "argmin"):  # which of two values that round alike comes first is eager's
            text = self.as_stored(self.bodies[r], text, scope)
        if node.kind in ("any", "all") and reg != torch.bool:
            text = f"({text} != 0)"
            reg = torch.bool
        ident = self.identity(node.kind, node.body.dtype)
        return self.emit(scope, f"tl.where(mask, {text}, {ident})", reg, prefix="rv")

    def emit_reduction_persistent(self, top: _Scope, columns: Optional[dict] = None, loads_first: bool = False):
        """Whole rows in registers; ``columns`` (row-loop form): column roots' accumulators, added to here;
        ``loads_first`` (persistent form): every load that needs no reduction's value before the first one."""
        if (TUNING["rowloop_loads_first"] if columns is not None else loads_first):
            # every load that needs no reduction's value is issued before the first reduction: a load
            # written after a tl.sum waits for it (its barriers), so its memory latency was not overlapped
            # with the first loads' (a residual norm backward's dh, a norm's mean and rstd)
            for r in self.g.roots:
                for ld in ir.loads(self.bodies[r]):
                    if not _locals(ld):
                        self.expr(ld, top)
        partner = self.paired_sums(columns) if TUNING["pair_row_sums"] else {}
        for r in self.g.roots:
            node = self.table[r]
            if columns and r in columns:
                v, _ = self.reduction_input(r, top)
                a, reg = columns[r]
                top.lines.append(top.indent + self.accumulate(node.kind, a, v, reg))
                continue
            if r in self.local_values:
                continue  # the second of a pair of sums, done with the first
            if r in partner:
                s_ = partner[r]
                (v, reg), (v2, _) = self.reduction_input(r, top), self.reduction_input(s_, top)
                a, b = self.fresh("red"), self.fresh("red")
                self.helpers.add("_tf_sum2_combine")
                top.lines.append(f"{top.indent}{a}, {b} = tl.reduce(({v}, {v2}), 1, _tf_sum2_combine, "
                                 "keep_dims=True)")
                for name, text in ((r, a), (s_, b)):
                    self.local_values[name] = (text, P.compute_dtype(self.table[name].dtype))
                    if name in self.g.stores:
                        self.store_root(name, text, top, "xmask")
                continue
            if isinstance(node, ir.Reduction):
                (v, reg) = self.reduction_input(r, top)
                if node.kind in ("argmax", "argmin"):
                    self.helpers.add(f"_tf_{node.kind}_combine")
                    idx = self.emit(top, "tl.broadcast_to(rindex, [XBLOCK, RBLOCK])", torch.int32, prefix="ri")[0]
                    pair = self.fresh("am")
                    top.lines.append(f"{top.indent}_, {pair} = tl.reduce(({v}, {idx}), 1, _tf_{node.kind}_combine, "
                                     "keep_dims=True)")
                    text = pair
                else:
                    text = self.emit(top, self.reduce_block(node.kind, v, reg, top), reg, prefix="red")[0]
                self.local_values[r] = (text, P.compute_dtype(node.dtype))
                if r in self.g.stores:
                    self.store_root(r, text, top, "xmask")
            else:
                text, _ = self.expr(self.bodies[r], top)
                self.local_values[r] = (text, P.compute_dtype(node.dtype))
                if r in self.g.stores:
                    self.store_root(r, text, top, "mask" if self.local_uses[r][1] else "xmask")

    def paired_sums(self, columns: Optional[dict]) -> dict[str, str]:
        """{first: second} of row sums (persistent and row-loop forms) that one tl.reduce over a pair can do
        together: float32 sums over the row, the second not reading the first (nor any root after the
        first); each pair's shared-memory exchange and barriers happen once (a norm backward's two sums a
        row, TUNING pair_row_sums)."""
        sums = [r for r in self.g.roots if isinstance(self.table[r], ir.Reduction) and self.table[r].kind == "sum"
                and not (columns and r in columns)
                and P.compute_dtype(self.table[r].dtype) == torch.float32]
        order = {r: k for k, r in enumerate(self.g.roots)}
        pairs, used = {}, set()
        for i, r in enumerate(sums):
            if r in used:
                continue
            for s_ in sums[i + 1:]:
                if s_ in used:
                    continue
                # what s_ reads among the roots must all come before r (computed by the time r's pair runs)
                deps = {l.name for l in _locals(self.bodies[s_]) if l.name in order}
                if all(order[d] < order[r] for d in deps):
                    pairs[r] = s_
                    used.update((r, s_))
                    break
        return pairs

    def stage_of(self) -> dict[str, int]:
        """Loop index of each root: a reduction runs in the loop after the reductions it needs; a full-row
        value in the loop after its reductions; a row value right after its last reduction's loop."""
        stage: dict[str, int] = {}
        for r in self.g.roots:
            node = self.table[r]
            deps = [stage[l.name] + (1 if isinstance(self.table[l.name], ir.Reduction) else 0)
                    for l in _locals(self.bodies[r]) if l.name in stage]
            s = max(deps, default=0)
            stage[r] = s
            del node
        return stage

    def online_pairs(self, stage: dict[str, int], full: set) -> dict[str, str]:
        """{sum root: max root} of the looped form's online-softmax pairs: ``m = max(e)`` and ``s = sum(exp(e -
        m))`` over the same float expression ``e``, where the sum's loop would have nothing else to do. Both then
        run in the max's loop with a running maximum (the sum rescaled by ``exp(m_old - m_new)`` when the
        maximum grows): a cross-entropy or a long-row softmax reads its rows once fewer."""
        if not TUNING["online_softmax"]:
            return {}
        pairs = {}
        for r in self.g.roots:
            node = self.table[r]
            if not isinstance(node, ir.Reduction) or node.kind != "sum":
                continue
            body = self.bodies[r]
            if not (isinstance(body, ir.Op) and body.name == "exp" and isinstance(body.args[0], ir.Op)
                    and body.args[0].name == "sub" and isinstance(body.args[0].args[1], ir.Local)):
                continue
            e, m = body.args[0].args
            mnode = self.table.get(m.name)
            if not (isinstance(mnode, ir.Reduction) and mnode.kind == "max" and m.name in self.bodies
                    and self.bodies[m.name] == e and e.dtype in (torch.float32, torch.float64)
                    and not _locals(e)):
                continue
            # the sum's loop must hold nothing else (else it runs anyway and the pair saves nothing)
            others = [o for o in self.g.roots if o != r and stage[o] == stage[r]
                      and (isinstance(self.table[o], ir.Reduction) or o in full)]
            if others or stage[m.name] + 1 != stage[r]:
                continue
            pairs[r] = m.name
        return pairs

    def one_hot_sum(self, r: str) -> Optional[ir.Expr]:
        """The row value of a sum over one dim of ``where(i == t, v, 0) * c`` (either order, either side of
        the ==), ``i`` the summed dim's position and ``t``, ``v``, ``c`` the same all along it:
        ``where(0 <= t < n, v * c, 0)``, the one term that is not 0. A one-hot's sum: cross-entropy's
        backward sums its scattered -1 over the vocabulary (32 loop steps of compares and selects a row
        with nothing loaded). None for any other reduction."""
        node, body = self.table[r], self.bodies.get(r)
        if not (isinstance(node, ir.Reduction) and node.kind == "sum" and len(node.reduced) == 1):
            return None
        d = node.reduced[0]
        cast = body.dtype if isinstance(body, ir.Cast) else None
        e = body.arg if isinstance(body, ir.Cast) else body
        scale = None
        if isinstance(e, ir.Op) and e.name == "mul":
            a, b = e.args
            e, scale = (a, b) if isinstance(a, ir.Op) and a.name == "where" else (b, a)
        if not (isinstance(e, ir.Op) and e.name == "where"):
            return None
        cond, v, zero = e.args
        if not (isinstance(zero, ir.Const) and not zero.from_size and zero.value == 0 and
                isinstance(cond, ir.Op) and cond.name == "eq"):
            return None

        def position(x) -> bool:
            return isinstance(x, ir.IndexValue) and x.index.offset == 0 and len(x.index.terms) == 1 and \
                isinstance(x.index.terms[0][0], ir.Var) and x.index.terms[0][0].name == f"k{d}" and \
                x.index.terms[0][1] == 1
        lhs, rhs = cond.args
        t = rhs if position(lhs) else (lhs if position(rhs) else None)
        if t is None or any(self.expr_uses(x)[1] for x in (t, v) + ((scale,) if scale is not None else ())):
            return None
        n = P.const(node.space[d], t.dtype, from_size=True)
        inside = P.build("and", P.build("ge", t, P.const(0, t.dtype)), P.build("lt", t, n))
        term = v if scale is None else P.build("mul", v, scale)
        out = P.where(inside, term, P.const(0, term.dtype))
        return P.cast(out, cast) if cast is not None else out

    @staticmethod
    def peeled_loops(lines: list[str], even: bool) -> list[str]:
        """A row loop's text (its four header lines, then the body) with the row mask folded (``even``), or
        as a loop over the full steps with the folded mask and a loop of at most one step, the partial
        tail, with the test (the body's text twice: it names only the header's variables)."""
        header, body = lines[:4], lines[4:]
        assert header[0].strip().startswith("for roffset in range(0, rnumel, RBLOCK)") and \
            header[2].strip() == "rmask = rindex < rnumel", header
        folded = [header[0], header[1], header[2].replace("rindex < rnumel", "tl.full([1, RBLOCK], 1, tl.int1)"),
                  header[3]]
        if even and TUNING["fold_even_masks"]:
            return folded + body
        if not TUNING["peel_loop_tail"]:
            return lines
        full = header[0].replace("range(0, rnumel, RBLOCK)", "range(0, rfull, RBLOCK)")
        tail = header[0].replace("range(0, rnumel, RBLOCK)", "range(rfull, rnumel, RBLOCK)")
        return ["    rfull = rnumel - rnumel % RBLOCK", full] + folded[1:] + body + [tail] + header[1:] + body

    def accumulate_online(self, loop: _Scope, s_acc: str, m_acc: str, v: str) -> None:
        """One step of an online (max, sum-of-exp) pair, per lane, with one exp an element: for d = v - m,
        exp(-|d|) is the new term when v <= m and the old sum's rescale exp(m - v) when v > m (then the term is
        exp(0) = 1). ``v`` is the masked max input (-inf off the row): -inf terms add nothing (masked scores,
        the first step's -inf maximum); NaN sticks in both the maximum and the sum; +inf gives NaN later, as
        the two-loop form's exp(inf - inf) does. (Two exps an element made the loop MUFU-bound, no
        faster than two passes over the row.) The exp is the helper ``_tf_exp_neg_abs``, on a GPU an exp2
        with the abs and the sign on its multiply and without the denormal range fix-up (3 of the loop's
        instructions an element on sm_90): a term below 1.2e-38 added to a sum of at least 1 changes nothing.
        On sm_90 cross-entropy's loop over bf16 rows issues 13.1 instructions an element with the tail
        peeled, the clamp and exp2 (17.9 before; SASS counts)."""
        d, e, up = self.fresh("d"), self.fresh("e"), self.fresh("up")
        self.helpers.add("_tf_exp_neg_abs")
        ind = loop.indent
        # the running maximum is clamped to the lowest finite value for the difference, so a -inf v against
        # the -inf of no value yet gives d = -inf (a 0 term) instead of NaN: one max an element where a
        # test of v and a select were. The clamp changes nothing else: while the maximum is -inf the sum is 0
        # (and v > m sets it to 1 for any larger v); a NaN maximum has a NaN sum already.
        loop.lines += [f"{ind}{d} = {v} - tl.maximum({m_acc}, {-FLOAT32_MAX!r})",
                       f"{ind}{e} = _tf_exp_neg_abs({d})",
                       f"{ind}{up} = {v} > {m_acc}",
                       f"{ind}{s_acc} = tl.where({up}, {s_acc} * {e} + 1.0, {s_acc} + {e})",
                       f"{ind}{m_acc} = tl.where({up} | ({v} != {v}), {v}, {m_acc})"]

    def emit_reduction_looped(self, top: _Scope, itype: str, even: bool = False):
        """The looped form's loops over the row, one a stage. ``even``: the plan's row length is a multiple of
        RBLOCK, so no step is partial and the row mask is a constant (folded). Otherwise (TUNING
        ``peel_loop_tail``) each loop runs its full steps with the constant mask and the last, partial step
        after them with the test: cross-entropy's 32000-long rows are 31 full steps of 1024 and a tail of
        256, and the full steps drop a select and the load predicates an element."""
        stage = self.stage_of()
        full = {r for r in self.g.roots if not isinstance(self.table[r], ir.Reduction) and self.local_uses[r][1]}
        self.macro_roots = set(full)
        online = self.online_pairs(stage, full)
        paired = {m: s_ for s_, m in online.items()}
        for r in online:  # the sum runs in its max's loop; what needs only the pair is unchanged
            stage[r] = stage[online[r]]
        last = max(stage.values(), default=0)
        # a write into an input is stored in the last reduction's loop (or later), after that step's loads: the
        # loops before it read the row again (var's mean, then its squares), and a write stored in the first loop
        # changed what the second one read (var(x + 0.5) with x.copy_(x + 0.5) came out var + 0.25)
        writes = {r for r in full if isinstance(self.table[r], ir.Pointwise) and self.table[r].into}
        last_reduction = max((stage[r] for r in self.g.roots if isinstance(self.table[r], ir.Reduction)), default=0)
        for r in writes:
            stage[r] = max(stage[r], last_reduction)
        for s in range(last + 1):
            reds = [r for r in self.g.roots if isinstance(self.table[r], ir.Reduction) and stage[r] == s]
            for r in list(reds):
                value = self.one_hot_sum(r) if TUNING["one_hot_sums"] else None
                if value is not None:  # a row value, no loop
                    reds.remove(r)
                    text, _ = self.expr(value, top)
                    self.local_values[r] = (text, P.compute_dtype(self.table[r].dtype))
                    if r in self.g.stores:
                        self.store_root(r, text, top, "xmask")
            fulls = [r for r in self.g.roots if r in full and stage[r] == s]
            if reds or fulls:
                accs = {r: self.accumulator(top, self.table[r]) for r in reds}
                loop = _Scope(top, "        ", False)
                # the loop header goes with the loop's lines: row-level values its body needs are hoisted into
                # ``top`` while the body is written, and must come before the loop
                loop.lines += ["    for roffset in range(0, rnumel, RBLOCK):",
                               "        rindex = roffset + rbase",
                               "        rmask = rindex < rnumel",
                               "        mask = xmask & rmask"]
                for r in fulls:
                    if r in self.g.stores and r not in writes:
                        text, _ = self.expr(self.bodies[r], loop)
                        self.store_root(r, text, loop, "mask")
                for r in reds:
                    if r in online:
                        continue  # with its max, below
                    node = self.table[r]
                    a, reg = accs[r]
                    v, vreg = self.reduction_input(r, loop)
                    if r in paired:
                        self.accumulate_online(loop, accs[paired[r]][0], a, v)
                        continue
                    loop.lines.append("        " + self.accumulate(node.kind, a, v, reg))
                for r in fulls:
                    if r in self.g.stores and r in writes:
                        text, _ = self.expr(self.bodies[r], loop)
                        self.store_root(r, text, loop, "mask")
                top.lines.extend(self.peeled_loops(loop.lines, even))
                for r in sorted(reds, key=lambda r: r in online):  # an online sum after its max
                    node = self.table[r]
                    a, reg = accs[r]
                    if r in online:
                        # the lanes' partial sums, each rescaled to the row's maximum (computed just before:
                        # the max comes first in ``reds``, as the sum's body reads it)
                        m_acc = accs[online[r]][0]
                        m_row = self.local_values[online[r]][0]
                        # a row of -inf only: exp(-inf - -inf) is NaN in the two-loop form, and so here
                        name = self.emit(top, f"tl.where({m_row} == -float(\"inf\"), float(\"nan\"), "
                                              f"tl.sum({a} * tl.where({m_acc} == -float(\"inf\"), 0.0, "
                                              f"tl.exp({m_acc} - {m_row})), 1, keep_dims=True))", reg,
                                         prefix="red")[0]
                        self.local_values[r] = (name, P.compute_dtype(node.dtype))
                        if r in self.g.stores:
                            self.store_root(r, name, top, "xmask")
                        continue
                    if node.kind in ("argmax", "argmin"):
                        name = self.fresh("am")
                        top.lines.append(f"    _, {name} = tl.reduce(({a}, {a}_idx), 1, _tf_{node.kind}_combine, keep_dims=True)")
                    else:
                        name = self.emit(top, self.reduce_block(node.kind, a, reg, top), reg, prefix="red")[0]
                    self.local_values[r] = (name, P.compute_dtype(node.dtype))
                    if r in self.g.stores:
                        self.store_root(r, name, top, "xmask")
            # row-level roots whose reductions are done
            for r in self.g.roots:
                if r in full or isinstance(self.table[r], ir.Reduction) or r in self.local_values:
                    continue
                if all(l.name in self.local_values or l.name in full for l in _locals(self.bodies[r])) and \
                        all(stage.get(l.name, 0) <= s for l in _locals(self.bodies[r])):
                    text, _ = self.expr(self.bodies[r], top)
                    self.local_values[r] = (text, P.compute_dtype(self.table[r].dtype))
                    if r in self.g.stores:
                        self.store_root(r, text, top, "xmask")

    # ---------------------------------------------------------------------------------- module
    def module(self, body_lines, constexprs, grid, warps, xnumel, rnumel, numel) -> KernelSource:
        g = self.g
        params, args = [], []
        for kind, buf in self.buffer_order:
            params.append(self.buffers[(kind, buf)])
            args.append(("buf", self.table[buf].into if kind == "store" and isinstance(self.table[buf], ir.Pointwise)
                         and self.table[buf].into else buf))
        if self.uses_seed:
            params.append("seed_ptr")
            args.append(("seed",))
        for name, value in self.size_order:
            params.append(name)
            args.append(("float" if isinstance(value, float) else "int", value))
        params += [f"{c}: tl.constexpr" for c, _ in constexprs]
        tag = {"pointwise": "pw", "tiled": "pwt", "persistent": "red", "looped": "redl", "rowloop": "redc"}[self.form]
        ops = []
        for o in g.origins:
            short = o.split(":", 1)[1].split(".")[1] if ":" in o and "." in o.split(":", 1)[1] else o
            if short not in ops:
                ops.append(short)
        summary = "_".join(re.sub(r"[^a-z0-9]", "", s.lower()) for s in ops[:4]) or "copy"
        body = "\n".join(body_lines)
        helpers = P.helpers_closure(self.helpers)
        # the text that runs where this process runs kernels (a test may plan for a GPU on the interpreter)
        on_interpreter = self.target.interpreter or device.interpreting()
        half = bool(TUNING["half_helpers"]) and self.erf_outputs_are_half()
        helper_text = "\n\n".join(P.helper_text(h, on_interpreter, half) for h in helpers)
        imports = "import triton\nimport triton.language as tl\n"
        if not on_interpreter and any(h in P.GPU_HELPERS for h in helpers):
            imports += "from triton.language.extra import libdevice\n"
        describe = {"pointwise": "pointwise, blocked over elements", "tiled": "pointwise, rows x last-dim tiles",
                    "persistent": "reduction, persistent (whole rows in registers)",
                    "looped": "reduction, looped over row chunks",
                    "rowloop": "reduction, whole rows looped over a chunk of rows, column partial sums"}[self.form]
        targets = [o.split(":", 1)[1] if ":" in o else o for o in g.origins]
        header = [f"# {describe}", f"# iteration space {len(g.space)}-d, reduced dims {list(g.reduced)}",
                  f"# fuses {len(targets)} ATen nodes:"]
        header += [f"#   {t}" for t in targets]
        header.append(f"# writes {len(g.stores)} buffers, reads {sum(1 for k, _ in self.buffer_order if k == 'load')}")
        sig = ", ".join(params)
        draft = "\n".join(header) + "\n" + helper_text + f"\n@triton.jit\ndef KERNEL({sig}):\n{body}\n"
        digest = hashlib.sha256(draft.encode()).hexdigest()[:10]
        name = f"tfk_{tag}_{summary}_{digest}"[:80]
        source = ("# tilefuse generated kernel: " + name + "\n" + "\n".join(header) + "\n"
                  + imports + "\n\n" + (helper_text + "\n\n" if helper_text else "")
                  + f"@triton.jit\ndef {name}({sig}):\n{body}\n")
        stores = tuple(a[1] for a, (k, _) in zip(args, self.buffer_order) if k == "store")
        stages = 1 if self.form in ("pointwise", "tiled", "persistent") or self.target.interpreter \
            else int(TUNING["num_stages"])
        return KernelSource(name, source, tuple(args), tuple(constexprs), tuple(int(x) for x in grid), warps, stages,
                            self.form, g.name, stores, ASSERT_OPTIONS if self.asserts else ())


def _even_mask(test: str, even: bool, shape: str) -> str:
    """A block mask's text: ``test``, or a constant all-true mask when the plan's concrete size fills the
    block exactly (a row of 4096 in an RBLOCK of 4096; rows a multiple of XBLOCK). Triton then folds every
    select and load predicate on it away: softmax_layer_norm's kernel drops from 1016 to 840 SASS
    instructions a thread on sm_90 (856 with the row mask alone). Each concrete shape is planned (and its
    text written) on its own, so a shape that does not fill the block gets the test back."""
    return f"tl.full({shape}, 1, tl.int1)" if even and TUNING["fold_even_masks"] else test


def _locals(e: ir.Expr) -> list:
    return [x for x in ir.walk(e) if isinstance(x, ir.Local)]


def _covers(pos, reduced) -> bool:
    names = set()
    for ix in pos:
        names |= ix.free_vars()
    return any(f"k{d}" in names for d in reduced)


def atom_uses_r(atom) -> bool:
    if isinstance(atom, ir.Var):
        return atom.name == "rindex"
    if isinstance(atom, ir.DivMod):
        return "rindex" in atom.inner.free_vars()
    return "rindex" in ir.expr_vars(atom.expr)


def generate(group: KernelGroup, sched: Schedule, target: LaunchTarget | None = None) -> KernelSource:
    return KernelWriter(group, sched, target or LaunchTarget.current()).write()
