"""The pointwise primitives the lowering builds expressions from, and the Triton text each becomes.

A primitive is named (``Op.name``), takes operands of the dtype the lowering gives it, and is written in
Triton from core ``tl`` math: ``tl.extra.libdevice`` does not run on Triton's interpreter, so functions
without a core op (tanh, log1p, atan, lgamma, erfinv, ...) are small ``@triton.jit`` helpers below, written
out into each kernel file that uses them (a kernel file stands alone) and tested on the interpreter. The same
text runs on NVIDIA and AMD. Two hot helpers (the float32 erfc, the online softmax's exp) have a second,
GPU text (:data:`GPU_HELPERS`) with the approximate reciprocal and exp (libdevice's fast reciprocal, which
both vendors' libdevice provide, and ``tl.exp2``); codegen writes it into kernels that run on a GPU. Helpers
that need more precision than float32 gives compute in float64 (special functions only: none of them is on a
hot path).

:func:`peephole` rewrites fused expressions at code generation (``1 + erf(u)`` is ``erfc(-u)``).

``build(name, *args, dtype)`` makes an ``Op`` and folds constants where that is trivially right.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, Optional

import torch

from ...kernels import special
from .. import ir
from . import float8

HALF = (torch.float16, torch.bfloat16)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a value is held in registers: half and float8 types compute in float32 (a float8 value is
    a float32 on its grid: compiler/ir/float8.py)."""
    return torch.float32 if dtype in HALF or dtype in float8.FP8_DTYPES else dtype


@dataclasses.dataclass(frozen=True)
class Primitive:
    arity: int
    template: str  # str.format with the operands' text as {0}, {1}, ...
    helpers: tuple[str, ...] = ()
    floats_only: bool = False  # operands must be floating (integer variants have other names)


P = Primitive
PRIMITIVES: dict[str, Primitive] = {
    # arithmetic (any numeric dtype unless noted)
    "add": P(2, "({0} + {1})"),
    "sub": P(2, "({0} - {1})"),
    "mul": P(2, "({0} * {1})"),
    "truediv": P(2, "({0} / {1})", floats_only=True),
    "fma": P(3, "tl.fma({0}, {1}, {2})", floats_only=True),  # prims.fma: one rounding, as eager's
    "neg": P(1, "(-{0})"),
    "abs": P(1, "tl.abs({0})"),
    "reciprocal": P(1, "(1.0 / {0})", floats_only=True),
    "fmod": P(2, "({0} % {1})"),  # C semantics on the GPU and the interpreter alike
    "remainder": P(2, "_tf_remainder({0}, {1})", ("_tf_remainder",)),
    "floordiv_int": P(2, "_tf_floordiv_int({0}, {1})", ("_tf_floordiv_int",)),
    "truncdiv_int": P(2, "({0} // {1})"),  # Triton's integer division truncates
    "floordiv": P(2, "_tf_floordiv({0}, {1})", ("_tf_floordiv",), floats_only=True),
    "pow": P(2, "_tf_pow({0}, {1})", ("_tf_pow",), floats_only=True),
    "pow_int": P(2, "_tf_pow_int({0}, {1})", ("_tf_pow_int",)),
    # NaN propagates, as in torch: one max.NaN / min.NaN instruction on NVIDIA (FMNMX.NAN), where a compare-
    # and-select costs three
    "maximum": P(2, "tl.maximum({0}, {1}, propagate_nan=tl.PropagateNan.ALL)"),
    "minimum": P(2, "tl.minimum({0}, {1}, propagate_nan=tl.PropagateNan.ALL)"),
    "fmax": P(2, "tl.where(({0} >= {1}) | ({1} != {1}), {0}, {1})"),  # NaN ignored
    "fmin": P(2, "tl.where(({0} <= {1}) | ({1} != {1}), {0}, {1})"),
    "maximum_int": P(2, "tl.maximum({0}, {1})"),
    "minimum_int": P(2, "tl.minimum({0}, {1})"),
    # float math
    "exp": P(1, "tl.exp({0})", floats_only=True),
    "exp2": P(1, "tl.exp2({0})", floats_only=True),
    "expm1": P(1, "_tf_expm1({0})", ("_tf_expm1",), floats_only=True),
    "log": P(1, "tl.log({0})", floats_only=True),
    "log2": P(1, "tl.log2({0})", floats_only=True),
    "log1p": P(1, "_tf_log1p({0})", ("_tf_log1p",), floats_only=True),
    "sqrt": P(1, "tl.sqrt({0})", floats_only=True),
    "rsqrt": P(1, "tl.rsqrt({0})", floats_only=True),
    "sin": P(1, "tl.sin({0})", floats_only=True),
    "cos": P(1, "tl.cos({0})", floats_only=True),
    "tan": P(1, "(tl.sin({0}) / tl.cos({0}))", floats_only=True),
    "asin": P(1, "_tf_asin({0})", ("_tf_asin",), floats_only=True),
    "acos": P(1, "_tf_acos({0})", ("_tf_acos",), floats_only=True),
    "atan": P(1, "_tf_atan({0})", ("_tf_atan",), floats_only=True),
    "atan2": P(2, "_tf_atan2({0}, {1})", ("_tf_atan2",), floats_only=True),
    "sinh": P(1, "_tf_sinh({0})", ("_tf_sinh",), floats_only=True),
    "cosh": P(1, "_tf_cosh({0})", ("_tf_cosh",), floats_only=True),
    "tanh": P(1, "_tf_tanh({0})", ("_tf_tanh",), floats_only=True),
    "asinh": P(1, "_tf_asinh({0})", ("_tf_asinh",), floats_only=True),
    "acosh": P(1, "_tf_acosh({0})", ("_tf_acosh",), floats_only=True),
    "atanh": P(1, "_tf_atanh({0})", ("_tf_atanh",), floats_only=True),
    "sigmoid": P(1, "tl.sigmoid({0})", floats_only=True),
    "erf": P(1, "tl.erf({0})", floats_only=True),
    "erfc": P(1, "_tf_erfc({0})", ("_tf_erfc",), floats_only=True),
    # float32 erfc (what "erfc" and "1 + erf(u)" become in float32): one exp, one reciprocal, no cancellation;
    # its exp(-x^2) is the second operand (an exp_neg_sq_f32), so a density of the same argument shares it
    "erfc_f32": P(2, "_tf_erfc_f32({0}, {1}, 0.4, 1.0)", ("_tf_erfc_f32",), floats_only=True),
    # erfc / 2 in the same instructions (the polynomial's coefficients halved: the same bits, halved), for a
    # kernel that multiplies the erfc by 0.5 (the normal cdf Phi(x) = erfc(-x / sqrt 2) / 2)
    "erfc_half_f32": P(2, "_tf_erfc_f32({0}, {1}, 0.4, 0.5)", ("_tf_erfc_f32",), floats_only=True),
    "exp_neg_sq_f32": P(1, "_tf_exp_neg_sq({0})", ("_tf_exp_neg_sq",), floats_only=True),
    # the same helper for erfc(y / sqrt 2), the GeLU's, from y itself (its scale 0.4 / sqrt 2 a constexpr);
    # its exp(-y^2 / 2) is the normal density's
    "erfc_rsqrt2_f32": P(2, "_tf_erfc_f32({0}, {1}, 0.28284271247461906, 1.0)", ("_tf_erfc_f32",),
                         floats_only=True),
    "erfc_rsqrt2_half_f32": P(2, "_tf_erfc_f32({0}, {1}, 0.28284271247461906, 0.5)", ("_tf_erfc_f32",),
                              floats_only=True),
    "exp_neg_half_sq_f32": P(1, "_tf_exp_neg_half_sq({0})", ("_tf_exp_neg_half_sq",), floats_only=True),
    # float32 d/dx gelu(x) = Phi(x) + x phi(x) (what torch's gelu_backward decomposition becomes): one exp
    "gelu_grad_f32": P(1, "_tf_gelu_grad_f32({0})", ("_tf_gelu_grad_f32",), floats_only=True),
    "erfcx": P(1, "_tf_erfcx({0})", ("_tf_erfcx",), floats_only=True),
    "erfinv": P(1, "_tf_erfinv({0})", ("_tf_erfinv",), floats_only=True),
    "lgamma": P(1, "_tf_lgamma({0})", ("_tf_lgamma",), floats_only=True),
    "digamma": P(1, "_tf_digamma({0})", ("_tf_digamma",), floats_only=True),
    "trigamma": P(1, "_tf_trigamma({0})", ("_tf_trigamma",), floats_only=True),
    "i0": P(1, "_tf_bessel_i({0}, 0, False)", ("_tf_bessel_i",), floats_only=True),
    "i0e": P(1, "_tf_bessel_i({0}, 0, True)", ("_tf_bessel_i",), floats_only=True),
    "i1": P(1, "_tf_bessel_i({0}, 1, False)", ("_tf_bessel_i",), floats_only=True),
    "i1e": P(1, "_tf_bessel_i({0}, 1, True)", ("_tf_bessel_i",), floats_only=True),
    "ndtri": P(1, "_tf_ndtri({0})", ("_tf_ndtri",), floats_only=True),
    "log_ndtr": P(1, "_tf_log_ndtr({0})", ("_tf_log_ndtr",), floats_only=True),
    "floor": P(1, "tl.floor({0})", floats_only=True),
    "ceil": P(1, "tl.ceil({0})", floats_only=True),
    "trunc": P(1, "_tf_trunc({0})", ("_tf_trunc",), floats_only=True),
    "round": P(1, "_tf_round({0})", ("_tf_round",), floats_only=True),
    "sign": P(1, "_tf_sign({0})", ("_tf_sign",)),
    "signbit": P(1, "_tf_signbit({0})", ("_tf_signbit",), floats_only=True),
    "copysign": P(2, "_tf_copysign({0}, {1})", ("_tf_copysign",), floats_only=True),
    "hypot": P(2, "_tf_hypot({0}, {1})", ("_tf_hypot",), floats_only=True),
    "logaddexp": P(2, "_tf_logaddexp({0}, {1})", ("_tf_logaddexp",), floats_only=True),
    "logaddexp2": P(2, "_tf_logaddexp2({0}, {1})", ("_tf_logaddexp2",), floats_only=True),
    "nextafter": P(2, "_tf_nextafter({0}, {1})", ("_tf_nextafter",), floats_only=True),
    "isnan": P(1, "({0} != {0})"),
    "isinf": P(1, "(tl.abs({0}) == float(\"inf\"))"),
    "gcd": P(2, "_tf_gcd({0}, {1})", ("_tf_gcd",)),
    # comparisons and logic (result bool)
    "eq": P(2, "({0} == {1})"),
    "ne": P(2, "({0} != {1})"),
    "lt": P(2, "({0} < {1})"),
    "le": P(2, "({0} <= {1})"),
    "gt": P(2, "({0} > {1})"),
    "ge": P(2, "({0} >= {1})"),
    "and": P(2, "({0} & {1})"),
    "or": P(2, "({0} | {1})"),
    "xor": P(2, "({0} ^ {1})"),
    "not": P(1, "({0} == 0)"),
    # the value a float16 intermediate has in eager (float16's range ends at 65504: eager gives inf above)
    "round_fp16": P(1, "{0}.to(tl.float16).to(tl.float32)", floats_only=True),
    "bitwise_not": P(1, "(~{0})"),
    "lshift": P(2, "_tf_lshift({0}, {1})", ("_tf_lshift",)),
    "rshift": P(2, "_tf_rshift({0}, {1})", ("_tf_rshift",)),
    "where": P(3, "tl.where({0}, {1}, {2})"),
}

BOOL_RESULT = {"eq", "ne", "lt", "le", "gt", "ge", "and", "or", "xor", "not", "isnan", "isinf", "signbit"}


# ------------------------------------------------------------------------------------------- builders
def const(value, dtype: torch.dtype, from_size: bool = False) -> ir.Const:
    if dtype == torch.bool:
        value = bool(value)
    elif dtype.is_floating_point:
        value = float(value)
    else:
        value = int(value)
    return ir.Const.make(value, dtype, from_size)


def cast(e: ir.Expr, dtype: torch.dtype) -> ir.Expr:
    if e.dtype == dtype:
        return e
    if isinstance(e, ir.Const) and not e.from_size and not (dtype in HALF or dtype in float8.FP8_DTYPES):
        if dtype == torch.bool:
            return const(bool(e.value), dtype)
        if dtype.is_floating_point:
            return const(float(e.value), dtype)
        if not (isinstance(e.value, float) and not math.isfinite(e.value)):
            return const(int(e.value), dtype)
    if isinstance(e, ir.Const) and (dtype in HALF or dtype in float8.FP8_DTYPES) and e.dtype.is_floating_point \
            and not e.from_size:
        # a constant cast to a half or float8 type: round it now (exactly what the kernel would do)
        return const(float(torch.tensor(e.value, dtype=dtype).item()), dtype)
    return ir.Cast.make(e, dtype)


def build(name: str, *args: ir.Expr, dtype: Optional[torch.dtype] = None) -> ir.Expr:
    """``Op(name, args)``; result dtype: bool for comparisons, else ``dtype`` or the first operand's."""
    prim = PRIMITIVES[name]
    if len(args) != prim.arity:
        raise TypeError(f"primitive {name} takes {prim.arity} operands, got {len(args)}")
    if name in BOOL_RESULT:
        dtype = torch.bool
    elif dtype is None:
        dtype = args[1].dtype if name == "where" else args[0].dtype
    if name == "where" and isinstance(args[0], ir.Const):
        return args[1] if args[0].value else args[2]
    if name in ("add", "sub") and isinstance(args[1], ir.Const) and args[1].value == 0 and not args[1].from_size \
            and args[0].dtype == dtype and not isinstance(args[1].value, bool):
        return args[0]
    if name == "mul" and isinstance(args[1], ir.Const) and args[1].value == 1 and not args[1].from_size \
            and args[0].dtype == dtype and not isinstance(args[1].value, bool):
        return args[0]
    if name == "not" and isinstance(args[0], ir.Op) and args[0].name == "not":
        return args[0].args[0]
    return ir.Op.make(name, tuple(args), dtype)


def peephole(e: ir.Op, user_count: Optional[Callable[[ir.Expr], int]] = None,
             users: Optional[Callable[[ir.Expr], list]] = None) -> ir.Expr:
    """What code generation writes for ``e`` instead, on the fused expression (inlining a producer forms
    patterns no single lowering rule sees): in float32, ``erfc`` and ``1 + erf(u)`` / ``1 - erf(u)`` become
    the float32 erfc of :mod:`tilefuse.kernels.special`, and gelu_backward's ``cdf + x * pdf`` one
    ``gelu_grad_f32(x)`` when ``user_count`` (distinct users of an expression in the kernel) says its cdf is
    used nowhere else (a GeLU forward recomputed in the same kernel shares that erfc; replacing the pair would
    compute it twice); and a GeLU's ``0.5`` goes into its erfc (:func:`_halved_erfc`, which ``users``, the
    expressions using a value, lets see past a shared ``1 + erf``). ``e`` itself when nothing applies."""
    if e.dtype != torch.float32:
        return e
    if e.name == "erfc":
        return erfc_f32(e.args[0])
    if e.name == "mul" and user_count is not None:
        halved = _half_times_shared_half(e, user_count)
        if halved is not None:
            return halved
        halved = _halved_erfc(e, user_count, users)
        if halved is not None:
            return halved
    if e.name == "add" and user_count is not None:
        found = _gelu_grad_operand(e.args)
        if found is not None:
            x, cdf, inner = found
            if all(user_count(v) == 1 for v in inner):
                return build("gelu_grad_f32", x)
            # the cdf is shared: keep it; the pdf exp(-x^2 / 2) / sqrt(2 pi) takes the cdf's own exp (the
            # second operand of its erfc of x / sqrt 2: one exp for both)
            pdf = build("mul", gauss_exp(x), ir.Const(0.3989422804014327, torch.float32))
            return build("add", cdf, build("mul", x, pdf))
    w = _erfc_argument(e)  # 1 + erf(u), 1 - erf(u)
    return e if w is None else erfc_f32(w)


def _half_times_shared_half(e: ir.Op, user_count: Callable[[ir.Expr], int]) -> Optional[ir.Expr]:
    """``x * (y * 0.5)`` for ``e = (x * 0.5) * y``, ``y = 1 + erf(u)``, when the kernel computes ``y * 0.5``
    anyway and ``x * 0.5`` has no other use: one multiply fewer, the same bits (a product by 0.5 is exact).
    The GeLU recomputed in its backward is ``(x * 0.5) * (1 + erf(u))`` beside gelu_backward's cdf
    ``(1 + erf(u)) * 0.5``. (``y`` must be the ``1 + erf``: the rewritten product would match again.)"""
    for half_x, y in (e.args, e.args[::-1]):
        half = _half_operand(half_x, user_count, e.dtype)
        if half is None:
            continue
        if not (isinstance(y, ir.Op) and y.name == "add" and any(_is_one(a) for a in y.args)
                and any(_erf_operand(a) is not None for a in y.args)):
            continue
        x, c = half
        for shared in (ir.Op.make("mul", (y, c), e.dtype), ir.Op.make("mul", (c, y), e.dtype)):
            if user_count(shared) >= 1:
                return build("mul", x, shared)
    return None


def _half_operand(h: ir.Expr, user_count: Callable[[ir.Expr], int], dtype) -> Optional[tuple[ir.Expr, ir.Const]]:
    """``(x, c)`` for ``h = x * c`` (either order), ``c`` the constant 0.5 of ``dtype``, when ``h`` has no other
    use in the kernel; None otherwise."""
    if not (isinstance(h, ir.Op) and h.name == "mul") or user_count(h) != 1:
        return None
    for x, c in (h.args, h.args[::-1]):
        if _is_half(c, dtype):
            return x, c
    return None


def _halved_erfc(e: ir.Op, user_count: Callable[[ir.Expr], int],
                 users: Optional[Callable[[ir.Expr], list]]) -> Optional[ir.Expr]:
    """The 0.5 of a GeLU folded into its erfc's polynomial (``erfc_half_f32``: the same instructions, the
    same bits halved, one multiply an element fewer), for ``e`` either
    - ``y * 0.5``, ``y = 1 + erf(u)`` or ``1 - erf(u)`` (the normal cdf of gelu_backward), where every other
      use of ``y`` is a ``(x * 0.5) * y`` that :func:`_half_times_shared_half` turns into ``x * (y * 0.5)``, or
    - ``(x * 0.5) * y`` (the GeLU), ``x * 0.5`` and ``y`` used nowhere else: ``x * (erfc / 2)``.
    Either way no second erfc of ``u`` is computed beside it. None otherwise."""
    for y, c in (e.args, e.args[::-1]):
        w = _erfc_argument(y)
        if w is None or not _is_half(c, e.dtype):
            continue
        if user_count(y) == 1 or (users is not None and all(
                o is e or _shared_half_user(o, y, user_count) for o in users(y))):
            return erfc_f32(w, half=True)
    for half_x, y in (e.args, e.args[::-1]):
        w = _erfc_argument(y)
        half = _half_operand(half_x, user_count, e.dtype) if w is not None and user_count(y) == 1 else None
        if half is not None:
            return build("mul", half[0], erfc_f32(w, half=True))
    return None


def _shared_half_user(o: ir.Expr, y: ir.Expr, user_count) -> bool:
    """``o`` is ``(x * 0.5) * y`` with ``x * 0.5`` used nowhere else (what :func:`_half_times_shared_half`
    rewrites to use the shared ``y * 0.5``)."""
    if not (isinstance(o, ir.Op) and o.name == "mul" and any(a is y for a in o.args)):
        return False
    half_x = o.args[1] if o.args[0] is y else o.args[0]
    return _half_operand(half_x, user_count, o.dtype) is not None


def _is_half(c: ir.Expr, dtype) -> bool:
    return isinstance(c, ir.Const) and not c.from_size and c.value == 0.5 and c.dtype == dtype


def _erfc_argument(y: ir.Expr) -> Optional[ir.Expr]:
    """``w`` for ``y = 1 + erf(u)`` (``w = -u``) or ``1 - erf(u)`` (``w = u``) in float32: ``y`` is ``erfc(w)``,
    computed as such without the cancellation (the exact GeLU's ``1 + erf(x / sqrt(2))`` for negative x) and in
    fewer instructions than libdevice's erf (tilefuse.kernels.special). None when ``y`` is not of that form."""
    if not (isinstance(y, ir.Op) and y.name in ("add", "sub") and y.dtype == torch.float32):
        return None
    a, b = y.args
    if y.name == "add":
        u = _erf_operand(b) if _is_one(a) else (_erf_operand(a) if _is_one(b) else None)
        return None if u is None else build("neg", u)
    u = _erf_operand(b) if _is_one(a) else None
    return u


def erfc_f32(w: ir.Expr, half: bool = False) -> ir.Expr:
    """The float32 erfc of ``w`` (``erfc(w) / 2`` with ``half``) with its ``exp(-w^2)`` as an operand of its
    own, taken of ``u`` where ``w`` is ``-u`` (the same value), so that the density of gelu_backward (exp of
    ``-u^2``) finds it interned. Where ``u`` is ``y / sqrt 2`` (the GeLU's erfc) it is computed from ``y``,
    one multiply fewer, its exp ``exp(-y^2 / 2)`` (:func:`gauss_exp`)."""
    neg = isinstance(w, ir.Op) and w.name == "neg"
    v = w.args[0] if neg else w
    y = _times_const(v, 0.7071067811865476)
    if y is not None and y.dtype == torch.float32:
        return build("erfc_rsqrt2_half_f32" if half else "erfc_rsqrt2_f32", build("neg", y) if neg else y,
                     gauss_exp(y))
    return build("erfc_half_f32" if half else "erfc_f32", w, build("exp_neg_sq_f32", v))


def gauss_exp(y: ir.Expr) -> ir.Expr:
    """``exp(-y^2 / 2)``, the exp of the normal density and of erfc(y / sqrt 2), one interned value a ``y``."""
    return build("exp_neg_half_sq_f32", y.args[0] if isinstance(y, ir.Op) and y.name == "neg" else y)


def _times_const(e: ir.Expr, value: float) -> Optional[ir.Expr]:
    """``y`` when ``e`` is ``y * value`` or ``value * y`` (a float constant within float32 rounding)."""
    if not (isinstance(e, ir.Op) and e.name == "mul"):
        return None
    a, b = e.args
    for c, y in ((b, a), (a, b)):
        if isinstance(c, ir.Const) and not c.from_size and isinstance(c.value, float) and \
                abs(c.value - value) <= 1e-7 * abs(value):
            return y
    return None


def _gelu_grad_operand(args) -> Optional[tuple[ir.Expr, ir.Expr, tuple[ir.Expr, ...]]]:
    """``(x, cdf, inner values)`` when ``args`` (of an add) are torch's gelu_backward decomposition's ``cdf`` and
    ``x * pdf``: ``0.5 * (1 + erf(x / sqrt 2))`` and ``x * (exp(x * x * -0.5) / sqrt(2 pi))``, in either
    order, float32. The pair is then one ``gelu_grad_f32(x)``: one exp (erfc's exp(-x^2 / 2) is the pdf's)
    instead of an erf and an exp, if the inner values (the cdf, its ``1 + erf``, the pdf) have no other use.
    None otherwise."""
    for cdf, xpdf in (args, args[::-1]):
        one_plus = _times_const(cdf, 0.5)
        if not (isinstance(one_plus, ir.Op) and one_plus.name == "add"):
            continue
        a, b = one_plus.args
        erf = b if _is_one(a) else (a if _is_one(b) else None)
        u = _erf_operand(erf) if erf is not None else None
        x = _times_const(u, 0.7071067811865476) if u is not None else None
        if x is None or x.dtype != torch.float32 or not (isinstance(xpdf, ir.Op) and xpdf.name == "mul"):
            continue
        for xx, pdf in (xpdf.args, xpdf.args[::-1]):
            ex = _times_const(pdf, 0.3989422804014327)
            if xx is not x or not (isinstance(ex, ir.Op) and ex.name == "exp"):
                continue
            sq = _times_const(ex.args[0], -0.5)
            if isinstance(sq, ir.Op) and sq.name == "mul" and sq.args[0] is x and sq.args[1] is x:
                return x, cdf, (cdf, one_plus, erf, xpdf, pdf, ex)
    return None


def _is_one(e: ir.Expr) -> bool:
    return isinstance(e, ir.Const) and not e.from_size and not isinstance(e.value, bool) and e.value == 1


def _erf_operand(e: ir.Expr) -> Optional[ir.Expr]:
    return e.args[0] if isinstance(e, ir.Op) and e.name == "erf" and e.dtype == torch.float32 else None


def where(cond, a, b):
    return build("where", cond, a, b, dtype=a.dtype)


# --------------------------------------------------------------------------------------- Triton helpers
# Each helper is an @triton.jit function; ``HELPER_DEPS`` lists the helpers it calls.
HELPER_DEPS: dict[str, tuple[str, ...]] = {
    "_tf_asin": ("_tf_atan2",), "_tf_acos": ("_tf_atan2",), "_tf_atan2": ("_tf_atan", "_tf_signbit"),
    "_tf_sinh": ("_tf_expm1",), "_tf_asinh": ("_tf_log1p",), "_tf_acosh": ("_tf_log1p",),
    "_tf_atanh": ("_tf_log1p",), "_tf_erfc": ("_tf_erfc_cf",), "_tf_erfc_f32": ("_tf_erfc_poly",),
    "_tf_gelu_grad_f32": ("_tf_erfc_poly",),
    "_tf_erfcx": ("_tf_erfc_cf",),
    "_tf_lgamma": ("_tf_lgamma_pos",), "_tf_digamma": ("_tf_digamma_pos",),
    "_tf_trigamma": ("_tf_trigamma_pos",), "_tf_ndtri": ("_tf_erfinv",),
    "_tf_log_ndtr": ("_tf_erfcx", "_tf_erfc", "_tf_log1p"), "_tf_copysign": ("_tf_signbit",),
    "_tf_logaddexp": ("_tf_log1p",), "_tf_logaddexp2": ("_tf_log1p",), "_tf_floordiv": ("_tf_signbit",),
    "_tf_round": ("_tf_trunc",),
}

HELPERS: dict[str, str] = {}
# helpers with another text for a GPU (libdevice, which the interpreter cannot run); these texts need
# ``from triton.language.extra import libdevice`` in the kernel file
GPU_HELPERS: dict[str, str] = {}


def _helper(name: str, text: str, gpu_text: Optional[str] = None) -> None:
    HELPERS[name] = "@triton.jit\n" + text.strip("\n") + "\n"
    if gpu_text is not None:
        GPU_HELPERS[name] = "@triton.jit\n" + gpu_text.strip("\n") + "\n"


def helper_text(name: str, interpreter: bool, half: bool = False) -> str:
    """The text of helper ``name`` for a kernel file that runs on the interpreter or on a GPU; ``half``: the
    kernel rounds every value computed with it to float16 / bfloat16 before an output (:data:`HALF_HELPERS`
    may then serve)."""
    if half and name in HALF_HELPERS:
        return HALF_HELPERS[name]
    return HELPERS[name] if interpreter else GPU_HELPERS.get(name, HELPERS[name])


for _name, (_text, _deps) in float8.helper_texts().items():  # float8 casts, loads, stores
    _helper(_name, _text)
    if _deps:
        HELPER_DEPS[_name] = _deps

_helper("_tf_remainder", '''
def _tf_remainder(a, b):
    # torch.remainder: the sign of the divisor (Triton's % is C's fmod)
    r = a % b
    fix = (r != 0) & ((r < 0) != (b < 0))
    return tl.where(fix, r + b, r)
''')
_helper("_tf_floordiv_int", '''
def _tf_floordiv_int(a, b):
    q = a // b
    fix = ((a % b) != 0) & ((a < 0) != (b < 0))
    return tl.where(fix, q - 1, q)
''')
_helper("_tf_floordiv", '''
def _tf_floordiv(a, b):
    # torch's div_floor for floats: exact where a/b is within rounding of an integer
    mod = a % b
    div = (a - mod) / b
    div = tl.where((mod != 0) & ((b < 0) != (mod < 0)), div - 1.0, div)
    fl = tl.floor(div)
    fl = tl.where(div - fl > 0.5, fl + 1.0, fl)
    q = a / b
    zero = tl.where(_tf_signbit(q), -0.0, 0.0)
    out = tl.where(div != 0, fl, zero)
    return tl.where(b == 0, q, out)
''')
_helper("_tf_pow", '''
def _tf_pow(a0, b0):
    # C pow semantics, computed in float64 (log2/exp2 in float32 lose ~5e-6 at large exponents)
    a = a0.to(tl.float64)
    b = b0.to(tl.float64)
    aa = tl.abs(a)
    r = tl.exp2(b * tl.log2(aa))
    b_int = tl.floor(b) == b
    b_odd = b_int & (tl.floor(b * 0.5) * 2.0 != b)
    r = tl.where(a < 0, tl.where(b_int, tl.where(b_odd, -r, r), float("nan")), r)
    r = tl.where((a == 0) & b_odd & (b < 0) & (a0.to(tl.float32).to(tl.int32, bitcast=True) < 0), -r, r)
    r = tl.where((aa == 1.0) & (tl.abs(b) == float("inf")), 1.0, r)
    r = tl.where((b == 0) | (a == 1.0), 1.0, r)
    return r.to(a0.dtype)
''')
_helper("_tf_pow_int", '''
def _tf_pow_int(a, b):
    # integer power by squaring (b >= 0; torch rejects negative integer exponents)
    result = tl.full(a.shape, 1, a.dtype) + a * 0
    base = a
    e = b + a * 0
    for _ in range(63):
        result = tl.where((e & 1) != 0, result * base, result)
        base = base * base
        e = e >> 1
    return result
''')
_helper("_tf_lshift", '''
def _tf_lshift(a, b):
    return tl.where((b < 0) | (b >= a.dtype.primitive_bitwidth), 0, a << b)
''')
_helper("_tf_rshift", '''
def _tf_rshift(a, b):
    big = (b < 0) | (b >= a.dtype.primitive_bitwidth)
    return tl.where(big, tl.where(a < 0, -1, 0), a >> b)
''')
_helper("_tf_expm1", '''
def _tf_expm1(x):
    # Kahan: (u - 1) * x / log(u) cancels the rounding of u = exp(x)
    u = tl.exp(x)
    d = u - 1.0
    lu = tl.log(u)
    r = d * x / tl.where(lu == 0.0, 1.0, lu)
    r = tl.where(u == 1.0, x, r)
    r = tl.where(d == -1.0, -1.0, r)
    return tl.where(u == float("inf"), u, r)
''')
_helper("_tf_log1p", '''
def _tf_log1p(x):
    # Goldberg: log(u) * x / (u - 1) with u = 1 + x rounded
    u = 1.0 + x
    d = u - 1.0
    r = tl.log(u) * (x / tl.where(d == 0.0, 1.0, d))
    r = tl.where(d == 0.0, x, r)
    return tl.where(u == float("inf"), u, r)
''')
_helper("_tf_tanh", '''
def _tf_tanh(x):
    # |x| < 0.5: odd Taylor series to x^15 (relative error < 2e-8); else (1 - e) / (1 + e), e = exp(-2|x|)
    a = tl.abs(x)
    z = x * x
    p = z * (-0.05396825396825397 + z * (0.021869488536155203 + z * (-0.008863235529902197
            + z * (0.003592128036572481 + z * -0.0014558343870513183))))
    small = x + x * z * (-0.3333333333333333 + z * (0.13333333333333333 + p))
    e = tl.exp(-2.0 * a)
    big = (1.0 - e) / (1.0 + e)
    big = tl.where(x < 0, -big, big)
    return tl.where(a < 0.5, small, big)
''')
_helper("_tf_sinh", '''
def _tf_sinh(x):
    a = tl.abs(x)
    e = _tf_expm1(a)
    r = 0.5 * (e + e / (e + 1.0))
    big = tl.exp(a - 0.6931471805599453)
    r = tl.where(a > 20.0, big, r)
    return tl.where(x < 0, -r, r)
''')
_helper("_tf_cosh", '''
def _tf_cosh(x):
    e = tl.exp(tl.abs(x) - 0.6931471805599453)
    return e + 0.25 / e
''')
_helper("_tf_asinh", '''
def _tf_asinh(x):
    a = tl.abs(x)
    r = _tf_log1p(a + a * a / (1.0 + tl.sqrt(1.0 + a * a)))
    r = tl.where(a > 1e15, tl.log(a) + 0.6931471805599453, r)
    return tl.where(x < 0, -r, r)
''')
_helper("_tf_acosh", '''
def _tf_acosh(x):
    t = x - 1.0
    r = _tf_log1p(t + tl.sqrt(2.0 * t + t * t))
    return tl.where(x > 1e15, tl.log(x) + 0.6931471805599453, r)
''')
_helper("_tf_atanh", '''
def _tf_atanh(x):
    return 0.5 * _tf_log1p(2.0 * x / (1.0 - x))
''')
_helper("_tf_atan", '''
def _tf_atan(x):
    # range reduction to |t| <= tan(pi/8), then the odd series to t^23 (error < 1e-11)
    a = tl.abs(x)
    inv = a > 1.0
    t = tl.where(inv, 1.0 / a, a)
    mid = t > 0.41421356237309503
    t = tl.where(mid, (t - 1.0) / (t + 1.0), t)
    z = t * t
    p = -0.3333333333333333 + z * (0.2 + z * (-0.14285714285714285 + z * (0.1111111111111111 + z * (
        -0.09090909090909091 + z * (0.07692307692307693 + z * (-0.06666666666666667 + z * (
            0.058823529411764705 + z * (-0.05263157894736842 + z * (0.047619047619047616
                                                                   + z * -0.043478260869565216)))))))))
    r = t + t * z * p
    r = tl.where(mid, r + 0.7853981633974483, r)
    r = tl.where(inv, 1.5707963267948966 - r, r)
    return tl.where(x < 0, -r, r)
''')
_helper("_tf_signbit", '''
def _tf_signbit(x):
    if x.dtype == tl.float64:
        s = x.to(tl.int64, bitcast=True) < 0
    else:
        s = x.to(tl.float32).to(tl.int32, bitcast=True) < 0
    return s
''')
_helper("_tf_atan2", '''
def _tf_atan2(y, x):
    ax = tl.abs(x)
    ay = tl.abs(y)
    mx = tl.where(ax > ay, ax, ay)
    mn = tl.where(ax > ay, ay, ax)
    both_inf = (ax == float("inf")) & (ay == float("inf"))
    t = tl.where(both_inf, 1.0, mn / tl.where(mx == 0.0, 1.0, mx))
    a = _tf_atan(t)
    a = tl.where(ay > ax, 1.5707963267948966 - a, a)
    a = tl.where(_tf_signbit(x), 3.141592653589793 - a, a)
    a = tl.where(_tf_signbit(y), -a, a)
    return tl.where((x != x) | (y != y), x + y, a)
''')
_helper("_tf_asin", '''
def _tf_asin(x):
    return _tf_atan2(x, tl.sqrt((1.0 - x) * (1.0 + x)))
''')
_helper("_tf_acos", '''
def _tf_acos(x):
    return _tf_atan2(tl.sqrt((1.0 - x) * (1.0 + x)), x)
''')
_helper("_tf_erfc_cf", '''
def _tf_erfc_cf(x):
    # exp(x^2) * erfc(x) for x >= 2 by the continued fraction 1/sqrt(pi) / (x + (1/2)/(x + 1/(x + (3/2)/...)))
    f = x
    for k in tl.static_range(48, 0, -1):
        f = x + (k * 0.5) / f
    return 0.5641895835477563 / f
''')
_helper("_tf_erfc", '''
def _tf_erfc(x):
    big = tl.exp(-x * x) * _tf_erfc_cf(tl.maximum(x, 2.0))
    return tl.where(x >= 2.0, big, 1.0 - tl.erf(x))
''')
_helper("_tf_erfc_poly", special.erfc_poly_source("_tf_erfc_poly"))
# texts of less precision for kernels that round every value computed with them to a half type (codegen's
# choice, TUNING "half_helpers"): an error far below a float16 or bfloat16 rounding, for fewer instructions
HALF_HELPERS: dict[str, str] = {
    "_tf_erfc_poly": "@triton.jit\n" + special.erfc_poly_source("_tf_erfc_poly", half=True).strip("\n") + "\n"}
_helper("_tf_erfc_f32", special.erfc_e_f32_source("_tf_erfc_f32", "_tf_erfc_poly", interpreter=True),
        special.erfc_e_f32_source("_tf_erfc_f32", "_tf_erfc_poly", interpreter=False))
_helper("_tf_exp_neg_sq", special.exp_neg_sq_source("_tf_exp_neg_sq", interpreter=True),
        special.exp_neg_sq_source("_tf_exp_neg_sq", interpreter=False))
_helper("_tf_exp_neg_half_sq", special.exp_neg_half_sq_source("_tf_exp_neg_half_sq", interpreter=True),
        special.exp_neg_half_sq_source("_tf_exp_neg_half_sq", interpreter=False))
_helper("_tf_gelu_grad_f32", special.gelu_grad_f32_source("_tf_gelu_grad_f32", "_tf_erfc_poly", interpreter=True),
        special.gelu_grad_f32_source("_tf_gelu_grad_f32", "_tf_erfc_poly", interpreter=False))
# exp(-|x|), the online softmax step's one exp: on a GPU exp2 of |x| times -log2(e) (the abs and the sign
# ride on the multiply: one instruction fewer than exp(-tl.abs(x))), approximate, without the denormal
# fix-up (a term below 1.2e-38 added to a sum of at least 1 changes nothing)
_helper("_tf_exp_neg_abs", '''
def _tf_exp_neg_abs(x):
    return tl.exp(-tl.abs(x))
''', '''
def _tf_exp_neg_abs(x):
    if x.dtype == tl.float32:
        y = tl.exp2(tl.abs(x) * -1.4426950408889634)
    else:
        y = tl.exp(-tl.abs(x))
    return y
''')
_helper("_tf_erfcx", '''
def _tf_erfcx(x):
    big = _tf_erfc_cf(tl.maximum(x, 2.0))
    small = tl.exp(x * x) * (1.0 - tl.erf(x))
    return tl.where(x >= 2.0, big, small)
''')
_helper("_tf_erfinv", '''
def _tf_erfinv(y0):
    # Winitzki's closed form (a = 0.147) polished by three Newton steps on erf, in float64
    y = y0.to(tl.float64)
    w = -tl.log((1.0 - y) * (1.0 + y))
    t = 4.330746750799873 - 0.5 * w
    x = tl.sqrt(tl.sqrt(t * t + w * 6.802721088435374) - t)
    x = tl.where(y < 0, -x, x)
    for _ in tl.static_range(3):
        x = x - (tl.erf(x) - y) / (1.1283791670955126 * tl.exp(-x * x))
    x = tl.where(tl.abs(y) == 1.0, y * float("inf"), x)
    x = tl.where(y == 0.0, y, x)
    return tl.where(tl.abs(y) > 1.0, float("nan"), x).to(y0.dtype)
''')
_helper("_tf_ndtri", '''
def _tf_ndtri(p):
    return 1.4142135623730951 * _tf_erfinv(2.0 * p - 1.0)
''')
_helper("_tf_log_ndtr", '''
def _tf_log_ndtr(x):
    # log(Phi(x)): in the left tail log(erfcx(-x/sqrt2) / 2) - x^2/2, elsewhere log1p(-Phi(-x))
    t = -x * 0.7071067811865476
    left = tl.log(0.5 * _tf_erfcx(tl.maximum(t, 0.0))) - 0.5 * x * x
    right = _tf_log1p(-0.5 * _tf_erfc(-t))
    return tl.where(x < -1.0, left, right)
''')
_helper("_tf_lgamma_pos", '''
def _tf_lgamma_pos(x):
    # x > 0 (float64): shift to z >= 8, then Stirling's series to 1/z^9
    shift = x < 8.0
    p = x * (x + 1.0) * (x + 2.0) * (x + 3.0) * (x + 4.0) * (x + 5.0) * (x + 6.0) * (x + 7.0)
    z = tl.where(shift, x + 8.0, x)
    iz = 1.0 / z
    iz2 = iz * iz
    s = (z - 0.5) * tl.log(z) - z + 0.9189385332046727 + iz * (0.08333333333333333 + iz2 * (
        -0.002777777777777778 + iz2 * (0.0007936507936507937 + iz2 * (-0.0005952380952380953
                                                                      + iz2 * 0.0008417508417508417))))
    return tl.where(shift, s - tl.log(p), s)
''')
_helper("_tf_lgamma", '''
def _tf_lgamma(x0):
    x = x0.to(tl.float64)
    neg = x <= 0.0
    lg = _tf_lgamma_pos(tl.where(neg, 1.0 - x, x))
    r = x - tl.floor(x + 0.5)
    s = tl.abs(tl.sin(3.141592653589793 * r))
    out = tl.where(neg, tl.log(3.141592653589793 / s) - lg, lg)
    out = tl.where(tl.abs(x) == float("inf"), float("inf"), out)
    return out.to(x0.dtype)
''')
_helper("_tf_digamma_pos", '''
def _tf_digamma_pos(x):
    # x > 0 (float64): psi(x) = psi(x + 6) - sum 1/(x + k), then the asymptotic series to 1/z^10
    shift = x < 6.0
    acc = 1.0 / x + 1.0 / (x + 1.0) + 1.0 / (x + 2.0) + 1.0 / (x + 3.0) + 1.0 / (x + 4.0) + 1.0 / (x + 5.0)
    z = tl.where(shift, x + 6.0, x)
    iz = 1.0 / z
    iz2 = iz * iz
    s = tl.log(z) - 0.5 * iz - iz2 * (0.08333333333333333 - iz2 * (0.008333333333333333 - iz2 * (
        0.003968253968253968 - iz2 * (0.004166666666666667 - iz2 * 0.007575757575757576))))
    return tl.where(shift, s - acc, s)
''')
_helper("_tf_digamma", '''
def _tf_digamma(x0):
    x = x0.to(tl.float64)
    neg = x <= 0.0
    ps = _tf_digamma_pos(tl.where(neg, 1.0 - x, x))
    r = x - tl.floor(x + 0.5)
    refl = ps - 3.141592653589793 * tl.cos(3.141592653589793 * r) / tl.sin(3.141592653589793 * r)
    out = tl.where(neg, refl, ps)
    out = tl.where(x == 0.0, -float("inf"), out)
    out = tl.where(neg & (r == 0.0) & (x != 0.0), float("nan"), out)
    out = tl.where(x == float("inf"), x, out)
    out = tl.where(x == -float("inf"), float("nan"), out)
    return out.to(x0.dtype)
''')
_helper("_tf_trigamma_pos", '''
def _tf_trigamma_pos(x):
    # x > 0 (float64): psi1(x) = sum_{k<6} 1/(x+k)^2 + psi1(x + 6), then the asymptotic series to 1/z^11
    # (the next term, 691/(2730 z^13), is below 2e-11 at z >= 6)
    shift = x < 6.0
    acc = 1.0 / (x * x) + 1.0 / ((x + 1.0) * (x + 1.0)) + 1.0 / ((x + 2.0) * (x + 2.0)) + \
        1.0 / ((x + 3.0) * (x + 3.0)) + 1.0 / ((x + 4.0) * (x + 4.0)) + 1.0 / ((x + 5.0) * (x + 5.0))
    z = tl.where(shift, x + 6.0, x)
    iz = 1.0 / z
    iz2 = iz * iz
    s = iz + 0.5 * iz2 + iz * iz2 * (0.16666666666666666 - iz2 * (0.03333333333333333 - iz2 * (
        0.023809523809523808 - iz2 * (0.03333333333333333 - iz2 * 0.07575757575757576))))
    return tl.where(shift, s + acc, s)
''')
_helper("_tf_trigamma", '''
def _tf_trigamma(x0):
    # x <= 0 by reflection: psi1(x) = pi^2 / sin^2(pi x) - psi1(1 - x); a pole at each non-positive integer
    x = x0.to(tl.float64)
    neg = x <= 0.0
    ps = _tf_trigamma_pos(tl.where(neg, 1.0 - x, x))
    r = x - tl.floor(x + 0.5)
    sn = tl.sin(3.141592653589793 * r)
    out = tl.where(neg, 9.869604401089358 / (sn * sn) - ps, ps)
    out = tl.where(neg & (r == 0.0), float("inf"), out)
    out = tl.where(x == float("inf"), 0.0, out)
    out = tl.where(x == -float("inf"), float("nan"), out)
    return out.to(x0.dtype)
''')
_helper("_tf_bessel_i", '''
def _tf_bessel_i(x0, ORDER: tl.constexpr, SCALED: tl.constexpr):
    # modified Bessel I0/I1 (SCALED: times exp(-|x|)), float64: power series below 30, asymptotic above
    x = x0.to(tl.float64)
    a = tl.abs(x)
    q = a * a * 0.25
    term = tl.where(a == a, 1.0, a)
    if ORDER == 1:
        term = a * 0.5
    s = term
    for k in tl.static_range(1, 64):
        term = term * q / (k * (k + ORDER))
        s = s + term
    if SCALED:
        s = s * tl.exp(-a)
    ia = 1.0 / tl.where(a == 0.0, 1.0, a)
    c = tl.where(a == a, 1.0, a)
    asym = c
    for k in tl.static_range(1, 10):
        c = c * -(4.0 * ORDER * ORDER - (2.0 * k - 1.0) * (2.0 * k - 1.0)) * ia / (8.0 * k)
        asym = asym + c
    asym = asym / tl.sqrt(6.283185307179586 * a)
    if not SCALED:
        asym = asym * tl.exp(a)
    out = tl.where(a > 30.0, asym, s)
    if ORDER == 1:
        out = tl.where(x < 0, -out, out)
    return out.to(x0.dtype)
''')
_helper("_tf_trunc", '''
def _tf_trunc(x):
    return tl.where(x < 0, tl.ceil(x), tl.floor(x))
''')
_helper("_tf_round", '''
def _tf_round(x):
    # round half to even; values this large are integers already
    r = tl.floor(x + 0.5)
    tie = (r - x) == 0.5
    odd = (r * 0.5) != tl.floor(r * 0.5)
    r = tl.where(tie & odd, r - 1.0, r)
    if x.dtype == tl.float64:
        big = tl.abs(x) >= 4503599627370496.0
    else:
        big = tl.abs(x) >= 8388608.0
    return tl.where(big | (x != x), x, r)
''')
_helper("_tf_sign", '''
def _tf_sign(x):
    one = x * 0 + 1
    s = tl.where(x > 0, one, tl.where(x < 0, -one, x * 0))
    return tl.where(x != x, x, s)
''')
_helper("_tf_copysign", '''
def _tf_copysign(a, b):
    return tl.where(_tf_signbit(b), -tl.abs(a), tl.abs(a))
''')
_helper("_tf_hypot", '''
def _tf_hypot(a, b):
    ax = tl.abs(a)
    ay = tl.abs(b)
    m = tl.where(ax > ay, ax, ay)
    n = tl.where(ax > ay, ay, ax)
    r = n / tl.where(m == 0.0, 1.0, m)
    h = m * tl.sqrt(1.0 + r * r)
    h = tl.where((a != a) | (b != b), a + b, h)
    return tl.where((ax == float("inf")) | (ay == float("inf")), float("inf"), h)
''')
_helper("_tf_logaddexp", '''
def _tf_logaddexp(a, b):
    m = tl.where(a > b, a, b)
    r = m + _tf_log1p(tl.exp(-tl.abs(a - b)))
    r = tl.where((a == b) & (tl.abs(a) == float("inf")), a, r)
    return tl.where((a != a) | (b != b), a + b, r)
''')
_helper("_tf_logaddexp2", '''
def _tf_logaddexp2(a, b):
    m = tl.where(a > b, a, b)
    r = m + _tf_log1p(tl.exp2(-tl.abs(a - b))) * 1.4426950408889634
    r = tl.where((a == b) & (tl.abs(a) == float("inf")), a, r)
    return tl.where((a != a) | (b != b), a + b, r)
''')
_helper("_tf_nextafter", '''
def _tf_nextafter(x, y):
    # one ulp of x's own dtype towards y, on the bits
    if x.dtype == tl.float64:
        bits = x.to(tl.int64, bitcast=True)
        tiny = tl.where(y > 0, 1, -9223372036854775807).to(tl.int64)
    elif x.dtype == tl.float32:
        bits = x.to(tl.int32, bitcast=True)
        tiny = tl.where(y > 0, 1, -2147483647)
    else:
        bits = x.to(tl.int16, bitcast=True)
        tiny = tl.where(y > 0, 1, -32767).to(tl.int16)
    up = (y > x) == (x >= 0)
    nb = tl.where(up, bits + 1, bits - 1)
    nb = tl.where(x == 0, tiny, nb)
    r = nb.to(x.dtype, bitcast=True)
    r = tl.where(x == y, y, r)
    return tl.where((x != x) | (y != y), x + y, r)
''')
_helper("_tf_gcd", '''
def _tf_gcd(a0, b0):
    a = tl.abs(a0)
    b = tl.abs(b0)
    for _ in range(96):  # Euclid needs at most ~92 steps for 64-bit operands (Fibonacci worst case)
        nz = b != 0
        t = tl.where(nz, a % tl.where(nz, b, 1), 0)
        a = tl.where(nz, b, a)
        b = t
    return a
''')

# reduction combine functions (tl.reduce), also helpers
# two row sums in one reduction (their shared-memory exchange and barriers once): codegen's paired sums
_helper("_tf_sum2_combine", '''
def _tf_sum2_combine(a0, b0, a1, b1):
    return a0 + a1, b0 + b1
''')
_helper("_tf_max_combine", '''
def _tf_max_combine(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)  # integers: propagate_nan has no effect
''')
_helper("_tf_min_combine", '''
def _tf_min_combine(a, b):
    return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)
''')
_helper("_tf_prod_combine", '''
def _tf_prod_combine(a, b):
    return a * b
''')
_helper("_tf_argmax_combine", '''
def _tf_argmax_combine(v0, i0, v1, i1):
    # NaN counts as the largest value; ties go to the lower index (torch.argmax's rule)
    take = (v1 > v0) | ((v1 == v0) & (i1 < i0)) | ((v1 != v1) & (v0 == v0)) | ((v1 != v1) & (v0 != v0) & (i1 < i0))
    return tl.where(take, v1, v0), tl.where(take, i1, i0)
''')
_helper("_tf_argmin_combine", '''
def _tf_argmin_combine(v0, i0, v1, i1):
    take = (v1 < v0) | ((v1 == v0) & (i1 < i0)) | ((v1 != v1) & (v0 == v0)) | ((v1 != v1) & (v0 != v0) & (i1 < i0))
    return tl.where(take, v1, v0), tl.where(take, i1, i0)
''')


def helpers_closure(names) -> list[str]:
    """The helpers ``names`` need, dependencies first, in a stable order."""
    out: list[str] = []

    def visit(n):
        if n in out:
            return
        for d in HELPER_DEPS.get(n, ()):
            visit(d)
        out.append(n)

    for n in sorted(names):
        visit(n)
    return out
