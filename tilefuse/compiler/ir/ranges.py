"""Value ranges of IR expressions: what code generation may leave unchecked.

A data-dependent index (:class:`ir.Indirect`) is checked in the kernel (a device assert) unless its value is
proven inside the dim, and an integer division's divisor unless it is proven non-zero (codegen's
``check_indirect`` and ``check_divisor``). :func:`value_range` gives a sound interval ``(lo, hi)`` of an
expression's value, or None where nothing is known (a loaded value): positions (:class:`ir.IndexValue`, e.g.
an arange), constants, and what integer arithmetic, clamps, selects and casts make of them. Float
intermediates (the ``floor(i * scale)`` of a nearest upsampling) are widened by a relative margin far larger
than float32's rounding, so a rounded product cannot leave the interval.
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from .. import ir

Range = Optional[tuple]  # (lo, hi), inclusive; ints for integer expressions, floats for floating ones

FLOAT_MARGIN = 1e-5  # relative widening of float intervals (float32's rounding is 6e-8 an operation)
_INT_LIMITS = {torch.int8: (-2**7, 2**7 - 1), torch.uint8: (0, 2**8 - 1), torch.int16: (-2**15, 2**15 - 1),
               torch.int32: (-2**31, 2**31 - 1), torch.int64: (-2**63, 2**63 - 1), torch.bool: (0, 1)}


def _fits(r: Range, dtype: torch.dtype) -> Range:
    """``r`` for a value of ``dtype``: None where an integer result could wrap, widened for floats."""
    if r is None:
        return None
    lo, hi = r
    if dtype.is_floating_point:
        if not (math.isfinite(lo) and math.isfinite(hi)):
            return None
        pad = FLOAT_MARGIN * max(abs(lo), abs(hi), 1e-30)
        return (float(lo) - pad, float(hi) + pad)
    limits = _INT_LIMITS.get(dtype)
    if limits is None or lo < limits[0] or hi > limits[1]:
        return None
    return (int(lo), int(hi))


def value_range(e: ir.Expr) -> Range:
    """A sound ``(lo, hi)`` of ``e``'s value over every position where it is computed, or None."""
    found = e.__dict__.get("_range", False)
    if found is not False:
        return found
    r = _fits(_compute(e), e.dtype)
    object.__setattr__(e, "_range", r)
    return r


def _compute(e: ir.Expr) -> Range:
    if isinstance(e, ir.Const):
        if e.from_size:
            return None  # a size argument: its value differs between the shapes one kernel serves
        v = e.value
        if isinstance(v, bool):
            return (int(v), int(v))
        return (v, v) if isinstance(v, int) or math.isfinite(v) else None
    if isinstance(e, ir.IndexValue):
        return e.index.bounds()
    if isinstance(e, ir.Cast):
        r = value_range(e.arg)
        if r is None:
            return None
        if e.dtype == torch.bool:
            return (0, 1)
        if e.arg.dtype.is_floating_point and not e.dtype.is_floating_point:
            return (math.trunc(r[0]), math.trunc(r[1]))  # float -> int truncates
        return r
    if not isinstance(e, ir.Op):
        return None
    name = e.name
    if e.dtype == torch.bool:
        return (0, 1)
    args = [value_range(a) for a in e.args]
    if name == "where":
        a, b = args[1], args[2]
        return None if a is None or b is None else (min(a[0], b[0]), max(a[1], b[1]))
    if any(a is None for a in args):
        return None
    if name == "add":
        return (args[0][0] + args[1][0], args[0][1] + args[1][1])
    if name == "sub":
        return (args[0][0] - args[1][1], args[0][1] - args[1][0])
    if name == "neg":
        return (-args[0][1], -args[0][0])
    if name == "mul":
        products = [x * y for x in args[0] for y in args[1]]
        return (min(products), max(products))
    if name in ("maximum", "maximum_int", "fmax"):
        return (max(args[0][0], args[1][0]), max(args[0][1], args[1][1]))
    if name in ("minimum", "minimum_int", "fmin"):
        return (min(args[0][0], args[1][0]), min(args[0][1], args[1][1]))
    if name in ("floor", "ceil", "trunc"):
        fn = {"floor": math.floor, "ceil": math.ceil, "trunc": math.trunc}[name]
        return (float(fn(args[0][0])), float(fn(args[0][1])))
    if name == "abs":
        lo, hi = args[0]
        return (0 if lo <= 0 <= hi else min(abs(lo), abs(hi)), max(abs(lo), abs(hi)))
    if name in ("floordiv_int", "remainder") and not e.dtype.is_floating_point:
        c = args[1]
        if c[0] != c[1] or c[0] <= 0:
            return None
        c = c[0]
        if name == "remainder":
            return (0, c - 1)
        return (args[0][0] // c, args[0][1] // c)
    return None


def nonzero(e: ir.Expr) -> bool:
    """True where ``e`` is proven never 0 (a divisor that needs no check)."""
    r = value_range(e)
    if r is not None and (r[0] > 0 or r[1] < 0):
        return True
    if isinstance(e, ir.Op) and e.name == "where":
        cond, a, b = e.args
        # where(x == 0, a, x) (lcm's guarded divisor): b is 0 only where the other branch is taken
        guarded = isinstance(cond, ir.Op) and cond.name == "eq" and b in cond.args and \
            any(isinstance(c, ir.Const) and c.value == 0 and not c.from_size for c in cond.args)
        return nonzero(a) and (guarded or nonzero(b))
    return False
