"""Lowering rules for pointwise ATen ops: arithmetic, math, comparisons, casts, where/clamp, creation, random.

Type promotion follows torch: operands are cast to the promoted dtype (``Lowerer.promote``), the primitive
runs in it (code generation holds half types in float32), the result is cast to the node's dtype. Python
scalars become constants of the computation dtype, so ``bf16_tensor * 0.1`` multiplies by float32 0.1 as
eager's opmath does.
"""
from __future__ import annotations

import math

import torch

from .. import ir
from ..ir import primitives as P
from .core import TV, LoweringError, Sym, aten, ints, plain, register

prims = torch.ops.prims


def _is_float(dtype):
    return dtype.is_floating_point


def _args_dtype(low):
    """The node's output dtype (the computation dtype for ops whose result dtype is the promoted one)."""
    return low.out_meta().dtype


def _binary(low, a, b, fn, dtype=None):
    dtype = dtype or _args_dtype(low)
    return low.pointwise(lambda x, y: fn(low.scalar(x, dtype), low.scalar(y, dtype), dtype), a, b)


# ------------------------------------------------------------------------------------- arithmetic
@register(aten.add.Tensor, aten.add.Scalar)
def _add(low, a, b, alpha=1):
    def fn(x, y, dt):
        if dt == torch.bool:
            return P.build("or", x, y)
        if plain(alpha) != 1:
            y = P.build("mul", y, low.scalar(alpha, dt))
        return P.build("add", x, y)
    return _binary(low, a, b, fn)


@register(aten.sub.Tensor, aten.sub.Scalar)
def _sub(low, a, b, alpha=1):
    def fn(x, y, dt):
        if plain(alpha) != 1:
            y = P.build("mul", y, low.scalar(alpha, dt))
        return P.build("sub", x, y)
    return _binary(low, a, b, fn)


@register(aten.rsub.Scalar, aten.rsub.Tensor)
def _rsub(low, a, b, alpha=1):
    return _sub(low, b, a, alpha)


@register(aten.mul.Tensor, aten.mul.Scalar)
def _mul(low, a, b):
    return _binary(low, a, b, lambda x, y, dt: P.build("and" if dt == torch.bool else "mul", x, y))


@register(prims.fma.default)
def _fma(low, a, b, c):
    """``a * b + c`` rounded once (torch's lerp and AdamW's updates decompose to it)."""
    dt = _args_dtype(low)
    if not _is_float(dt):
        raise LoweringError(f"prims.fma of {dt}")
    return low.pointwise(lambda x, y, z: P.build("fma", low.scalar(x, dt), low.scalar(y, dt), low.scalar(z, dt)),
                         a, b, c)


@register(aten.div.Tensor, aten.div.Scalar, aten.true_divide.Tensor)
def _div(low, a, b):
    return _binary(low, a, b, lambda x, y, dt: P.build("truediv", x, y))


@register(aten.div.Tensor_mode, aten.div.Scalar_mode)
def _div_mode(low, a, b, rounding_mode=None):
    dt = _args_dtype(low)
    if rounding_mode is None:
        return _div(low, a, b)
    if _is_float(dt):
        if rounding_mode == "trunc":
            return _binary(low, a, b, lambda x, y, d: P.build("trunc", P.build("truediv", x, y)))
        return _binary(low, a, b, lambda x, y, d: P.build("floordiv", x, y))
    name = "truncdiv_int" if rounding_mode == "trunc" else "floordiv_int"
    return _binary(low, a, b, lambda x, y, d: P.build(name, x, y))


@register(aten.floor_divide.default, aten.floor_divide.Scalar)
def _floor_divide(low, a, b):
    return _div_mode(low, a, b, rounding_mode="floor")


@register(aten.remainder.Tensor, aten.remainder.Scalar, aten.remainder.Scalar_Tensor)
def _remainder(low, a, b):
    return _binary(low, a, b, lambda x, y, d: P.build("remainder", x, y))


@register(aten.fmod.Tensor, aten.fmod.Scalar)
def _fmod(low, a, b):
    return _binary(low, a, b, lambda x, y, d: P.build("fmod", x, y))


def _pow_expr(low, x, e, dt):
    """``x ** e`` for a constant exponent: multiplications and roots where exact, else the general pow."""
    if _is_float(dt):
        special = {2.0: lambda: P.build("mul", x, x), 1.0: lambda: x, 0.5: lambda: P.build("sqrt", x),
                   -0.5: lambda: P.build("rsqrt", x), -1.0: lambda: P.build("reciprocal", x),
                   3.0: lambda: P.build("mul", P.build("mul", x, x), x),
                   -2.0: lambda: P.build("reciprocal", P.build("mul", x, x)),
                   0.0: lambda: P.const(1.0, dt)}
        if e in special:
            return special[e]()
        return P.build("pow", x, P.const(e, dt))
    if e == 2:
        return P.build("mul", x, x)
    if e == 1:
        return x
    if e == 0:
        return P.const(1, dt)
    if e < 0:
        raise LoweringError("integer tensors to negative integer powers")
    return P.build("pow_int", x, P.const(int(e), dt))


@register(aten.pow.Tensor_Scalar)
def _pow_ts(low, a, e):
    dt = _args_dtype(low)
    if isinstance(e, Sym):
        return _binary(low, a, e, lambda x, y, d: P.build("pow", x, y) if _is_float(d) else P.build("pow_int", x, y))
    e = float(e) if _is_float(dt) else e
    if isinstance(e, bool):
        e = int(e)
    return low.pointwise(lambda x: _pow_expr(low, P.cast(x, dt), e, dt), a)


@register(aten.pow.Tensor_Tensor, aten.pow.Scalar)
def _pow(low, a, b):
    dt = _args_dtype(low)
    return _binary(low, a, b, lambda x, y, d: P.build("pow" if _is_float(d) else "pow_int", x, y))


@register(aten.float_power.Tensor_Tensor, aten.float_power.Tensor_Scalar, aten.float_power.Scalar)
def _float_power(low, a, b):
    return _pow(low, a, b)


def _minmax(name):
    def rule(low, a, b):
        def fn(x, y, dt):
            if _is_float(dt):
                return P.build(name, x, y)
            if dt == torch.bool:
                return P.build("or" if name in ("maximum", "fmax") else "and", x, y)
            return P.build("maximum_int" if name in ("maximum", "fmax") else "minimum_int", x, y)
        return _binary(low, a, b, fn)
    return rule


register(aten.maximum.default, aten.max.other)(_minmax("maximum"))
register(aten.minimum.default, aten.min.other)(_minmax("minimum"))
register(aten.fmax.default)(_minmax("fmax"))
register(aten.fmin.default)(_minmax("fmin"))


def _float_binary(name):
    def rule(low, a, b):
        return _binary(low, a, b, lambda x, y, d: P.build(name, x, y))
    return rule


for _op, _name in ((aten.atan2, "atan2"), (aten.hypot, "hypot"), (aten.copysign, "copysign"),
                   (aten.logaddexp, "logaddexp"), (aten.logaddexp2, "logaddexp2"), (aten.nextafter, "nextafter")):
    register(_op)(_float_binary(_name))


@register(aten.gcd.default)
def _gcd(low, a, b):
    return _binary(low, a, b, lambda x, y, d: P.build("gcd", x, y))


@register(aten.lcm.default)
def _lcm(low, a, b):
    def fn(x, y, d):
        g = P.build("gcd", x, y)
        safe = P.where(P.build("eq", g, P.const(0, d)), P.const(1, d), g)
        return P.build("abs", P.build("mul", P.build("truncdiv_int", x, safe), y))
    return _binary(low, a, b, fn)


@register(aten.heaviside.default)
def _heaviside(low, a, b):
    def fn(x, v, d):
        one, zero = P.const(1, d), P.const(0, d)
        out = P.where(P.build("eq", x, zero), v, P.where(P.build("gt", x, zero), one, zero))
        return P.where(P.build("isnan", x), x, out) if _is_float(d) else out
    return _binary(low, a, b, fn)


@register(aten.ldexp.Tensor)
def _ldexp(low, a, b):
    return _binary(low, a, b, lambda x, e, d: P.build("mul", x, P.build("exp2", e)))


# ----------------------------------------------------------------------------------------- bit ops
def _bitwise(name, bool_name):
    def rule(low, a, b):
        return _binary(low, a, b, lambda x, y, d: P.build(bool_name if d == torch.bool else name, x, y))
    return rule


register(aten.bitwise_and.Tensor, aten.bitwise_and.Scalar)(_bitwise("and", "and"))
register(aten.bitwise_or.Tensor, aten.bitwise_or.Scalar)(_bitwise("or", "or"))
register(aten.bitwise_xor.Tensor, aten.bitwise_xor.Scalar)(_bitwise("xor", "xor"))
register(aten.bitwise_left_shift.Tensor, aten.bitwise_left_shift.Tensor_Scalar, aten.__lshift__.Tensor,
         aten.__lshift__.Scalar)(_bitwise("lshift", "lshift"))
register(aten.bitwise_right_shift.Tensor, aten.bitwise_right_shift.Tensor_Scalar, aten.__rshift__.Tensor,
         aten.__rshift__.Scalar)(_bitwise("rshift", "rshift"))


@register(aten.bitwise_not.default)
def _bitwise_not(low, a):
    dt = _args_dtype(low)
    return low.pointwise(lambda x: P.build("not" if dt == torch.bool else "bitwise_not", x), a)


# ---------------------------------------------------------------------------------------- logical
def _logical(name):
    def rule(low, a, b):
        def fn(x, y):
            bx = _truth(x)
            by = _truth(y)
            return P.build(name, bx, by)
        return low.pointwise(lambda x, y: fn(low.scalar(x, low.dtype_of(x)), low.scalar(y, low.dtype_of(y))), a, b)
    return rule


def _truth(e: ir.Expr) -> ir.Expr:
    if e.dtype == torch.bool:
        return e
    return P.build("ne", e, P.const(0, e.dtype))


register(aten.logical_and.default)(_logical("and"))
register(aten.logical_or.default)(_logical("or"))
register(aten.logical_xor.default)(_logical("xor"))


@register(aten.logical_not.default)
def _logical_not(low, a):
    return low.pointwise(lambda x: P.build("not", _truth(x)), a)


# ------------------------------------------------------------------------------------- comparisons
def _compare(name):
    def rule(low, a, b):
        common, _ = low.promote(a, b)
        return low.pointwise(lambda x, y: P.build(name, low.scalar(x, common), low.scalar(y, common)), a, b)
    return rule


for _op, _name in ((aten.eq, "eq"), (aten.ne, "ne"), (aten.lt, "lt"), (aten.le, "le"), (aten.gt, "gt"),
                   (aten.ge, "ge")):
    register(_op.Tensor, _op.Scalar)(_compare(_name))


@register(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def _where(low, cond, a, b):
    dt = _args_dtype(low)
    return low.pointwise(lambda c, x, y: P.where(_truth(low.scalar(c, low.dtype_of(c))), low.scalar(x, dt),
                                                 low.scalar(y, dt)), cond, a, b)


@register(aten.clamp.default, aten.clamp.Tensor)
def _clamp(low, a, lo=None, hi=None):
    dt = _args_dtype(low)
    fl = _is_float(dt)

    def fn(x, l, h):
        x = low.scalar(x, dt)
        if l is not None:
            lv = low.scalar(l, dt)
            x = P.build("maximum" if fl else "maximum_int", x, lv) if not fl else \
                P.where(P.build("lt", x, lv), lv, x)
        if h is not None:
            hv = low.scalar(h, dt)
            x = P.build("minimum_int", x, hv) if not fl else P.where(P.build("gt", x, hv), hv, x)
        if fl:  # NaN bounds give NaN, as in torch
            for bound in (l, h):
                if bound is not None:
                    bv = low.scalar(bound, dt)
                    x = P.where(P.build("isnan", bv), bv, x) if not isinstance(bv, ir.Const) or \
                        math.isnan(bv.value) else x
        return x
    return low.pointwise(fn, a, lo, hi)


@register(aten.clamp_min.default, aten.clamp_min.Tensor)
def _clamp_min(low, a, lo):
    return _clamp(low, a, lo, None)


@register(aten.clamp_max.default, aten.clamp_max.Tensor)
def _clamp_max(low, a, hi):
    return _clamp(low, a, None, hi)


# -------------------------------------------------------------------------------------------- unary
UNARY_FLOAT = {
    aten.exp: "exp", aten.exp2: "exp2", aten.expm1: "expm1", aten.log: "log", aten.log2: "log2",
    aten.log1p: "log1p", aten.sqrt: "sqrt", aten.rsqrt: "rsqrt", aten.sin: "sin", aten.cos: "cos",
    aten.tan: "tan", aten.asin: "asin", aten.acos: "acos", aten.atan: "atan", aten.sinh: "sinh",
    aten.cosh: "cosh", aten.tanh: "tanh", aten.asinh: "asinh", aten.acosh: "acosh", aten.atanh: "atanh",
    aten.sigmoid: "sigmoid", aten.erf: "erf", aten.erfc: "erfc", aten.erfinv: "erfinv", aten.lgamma: "lgamma",
    aten.digamma: "digamma", aten.i0: "i0", aten.special_i0e: "i0e", aten.special_i1: "i1",
    aten.special_i1e: "i1e", aten.special_erfcx: "erfcx", aten.special_ndtri: "ndtri",
    aten.special_log_ndtr: "log_ndtr", aten.reciprocal: "reciprocal",
}


def _unary_float(name):
    def rule(low, a):
        dt = _args_dtype(low)
        return low.pointwise(lambda x: P.build(name, P.cast(x, dt)), a)
    return rule


for _op, _name in UNARY_FLOAT.items():
    register(_op)(_unary_float(_name))


@register(aten.polygamma.default)
def _polygamma(low, n, a):
    """polygamma(0) = digamma, polygamma(1) = trigamma (digamma's derivative); higher orders run in ATen."""
    order = int(plain(n))
    if order not in (0, 1):
        raise LoweringError(f"polygamma of order {order}: only orders 0 and 1 have a kernel")
    dt = _args_dtype(low)
    return low.pointwise(lambda x: P.build("digamma" if order == 0 else "trigamma", P.cast(x, dt)), a)


@register(aten.log10.default)
def _log10(low, a):
    dt = _args_dtype(low)
    return low.pointwise(lambda x: P.build("mul", P.build("log", P.cast(x, dt)), P.const(1 / math.log(10), dt)), a)


@register(aten.special_ndtr.default)
def _ndtr(low, a):
    dt = _args_dtype(low)
    return low.pointwise(lambda x: P.build("mul", P.const(0.5, dt), P.build(
        "erfc", P.build("mul", P.cast(x, dt), P.const(-1 / math.sqrt(2), dt)))), a)


@register(aten.sinc.default)
def _sinc(low, a):
    dt = _args_dtype(low)

    def fn(x):
        x = P.cast(x, dt)
        px = P.build("mul", x, P.const(math.pi, dt))
        r = P.build("truediv", P.build("sin", px), px)
        return P.where(P.build("eq", x, P.const(0.0, dt)), P.const(1.0, dt), r)
    return low.pointwise(fn, a)


@register(aten.special_entr.default)
def _entr(low, a):
    dt = _args_dtype(low)

    def fn(x):
        x = P.cast(x, dt)
        zero = P.const(0.0, dt)
        r = P.build("neg", P.build("mul", x, P.build("log", x)))
        r = P.where(P.build("eq", x, zero), zero, r)
        r = P.where(P.build("lt", x, zero), P.const(-math.inf, dt), r)
        return P.where(P.build("isnan", x), x, r)
    return low.pointwise(fn, a)


@register(aten.neg.default)
def _neg(low, a):
    return low.pointwise(lambda x: P.build("neg", x), a)


@register(aten.abs.default)
def _abs(low, a):
    dt = _args_dtype(low)
    return low.pointwise(lambda x: x if dt == torch.bool else P.build("abs", x), a)


def _rounding(name):
    def rule(low, a):
        dt = _args_dtype(low)
        return low.pointwise(lambda x: P.build(name, x) if _is_float(dt) else x, a)
    return rule


register(aten.floor.default)(_rounding("floor"))
register(aten.ceil.default)(_rounding("ceil"))
register(aten.trunc.default, aten.fix.default)(_rounding("trunc"))
register(aten.round.default)(_rounding("round"))


@register(aten.round.decimals)
def _round_decimals(low, a, decimals=0):
    dt = _args_dtype(low)
    k = P.const(10.0 ** int(plain(decimals)), dt)
    return low.pointwise(lambda x: P.build("truediv", P.build("round", P.build("mul", x, k)), k), a)


@register(aten.sign.default)
def _sign(low, a):
    dt = _args_dtype(low)
    return low.pointwise(lambda x: x if dt == torch.bool else P.build("sign", x), a)


@register(aten.signbit.default)
def _signbit(low, a):
    def fn(x):
        if _is_float(x.dtype):
            return P.build("signbit", x)
        if x.dtype in (torch.bool, torch.uint8):
            return P.const(False, torch.bool)
        return P.build("lt", x, P.const(0, x.dtype))
    return low.pointwise(fn, a)


@register(aten.isnan.default)
def _isnan(low, a):
    return low.pointwise(lambda x: P.build("isnan", x) if _is_float(x.dtype) else P.const(False, torch.bool), a)


@register(aten.isinf.default)
def _isinf(low, a):
    return low.pointwise(lambda x: P.build("isinf", x) if _is_float(x.dtype) else P.const(False, torch.bool), a)


@register(aten.isposinf.default, aten.isneginf.default)
def _isposinf(low, a):
    value = math.inf if low.current.target in (aten.isposinf.default,) else -math.inf
    return low.pointwise(lambda x: P.build("eq", x, P.const(value, x.dtype)) if _is_float(x.dtype)
                         else P.const(False, torch.bool), a)


@register(aten.relu.default)
def _relu(low, a):
    dt = _args_dtype(low)
    zero = P.const(0, dt)
    return low.pointwise(lambda x: P.build("maximum" if _is_float(dt) else "maximum_int", x, zero), a)


@register(aten.hardtanh.default)
def _hardtanh(low, a, lo=-1.0, hi=1.0):
    return _clamp(low, a, lo, hi)


@register(aten.leaky_relu.default)
def _leaky_relu(low, a, slope=0.01):
    dt = _args_dtype(low)
    return low.pointwise(lambda x: P.where(P.build("gt", x, P.const(0, dt)), x,
                                           P.build("mul", x, low.scalar(slope, dt))), a)


@register(aten.elu.default)
def _elu(low, a, alpha=1.0, scale=1.0, input_scale=1.0):
    dt = _args_dtype(low)

    def fn(x):
        neg = P.build("mul", P.build("expm1", P.build("mul", x, low.scalar(input_scale, dt))), low.scalar(alpha, dt))
        return P.build("mul", P.where(P.build("gt", x, P.const(0.0, dt)), x, neg), low.scalar(scale, dt))
    return low.pointwise(fn, a)


@register(aten.threshold.default)
def _threshold(low, a, threshold, value):
    dt = _args_dtype(low)
    return low.pointwise(lambda x: P.where(P.build("le", x, low.scalar(threshold, dt)), low.scalar(value, dt), x), a)


# --------------------------------------------------------------------------------------- casts, copies
@register(aten._to_copy.default)
def _to_copy(low, a, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
             memory_format=None):
    src = low.tensor_meta[a.name]
    meta = low.out_meta()
    fake_src = low.fake.get(a.name)
    if device is not None and fake_src is not None and torch.device(device) != fake_src.device:
        raise LoweringError(f"copy between devices ({fake_src.device} -> {device})")
    del src
    return low.pointwise(lambda x: P.cast(x, meta.dtype), a)


@register(prims.convert_element_type.default)
def _convert(low, a, dtype):
    return low.pointwise(lambda x: P.cast(x, dtype), a)


@register(aten.clone.default, aten.lift_fresh_copy.default, aten.contiguous.default, aten.positive.default)
def _clone(low, a, memory_format=None):
    return low.pointwise(lambda x: x, a)


@register(aten.copy.default)
def _copy(low, dst, src, non_blocking=False):
    meta = low.out_meta()
    return low.pointwise(lambda x: P.cast(x, meta.dtype), src)


@register(aten.copy_.default)
def _copy_(low, dst, src, non_blocking=False):
    """An input mutation (``keep_inference_input_mutations``): the kernel writes into the input's storage."""
    from .. import ir as _ir
    target = low.table.get(dst.name)
    if not isinstance(target, _ir.InputNode):
        raise LoweringError("copy_ into a tensor that is not a graph input")
    meta = low.tensor_meta[dst.name]
    from .core import is_non_overlapping
    if not is_non_overlapping(meta.shape, meta.stride):
        raise LoweringError("copy_ into an input whose elements overlap in memory (an expanded tensor)")
    if isinstance(src, TV) and low.fake.get(src.name) is not None and low.fake.get(dst.name) is not None and \
            low.fake[src.name].device != low.fake[dst.name].device:
        raise LoweringError("copy_ between devices")
    return low.pointwise(lambda x: P.cast(x, meta.dtype), src, meta=meta, into=dst.name)


@register(aten.alias.default, aten.detach.default)
def _alias(low, a):
    from .views import identity_view
    return identity_view(low, a)


# --------------------------------------------------------------------------------------------- creation
def _fill(low, value):
    meta = low.out_meta()
    return low.pointwise(lambda: low.scalar(value, meta.dtype))


@register(aten.full.default, aten.full_like.default, aten.new_full.default)
def _full(low, *args, **kwargs):
    value = kwargs.get("fill_value", args[1] if low.current.target is not aten.new_full.default else args[2])
    return _fill(low, value)


@register(aten.scalar_tensor.default)
def _scalar_tensor(low, value, **kwargs):
    return _fill(low, value)


@register(aten.zeros.default, aten.zeros_like.default, aten.new_zeros.default, aten.empty.memory_format,
          aten.empty_like.default, aten.new_empty.default, aten.empty_strided.default, aten.new_empty_strided.default,
          aten.empty_permuted.default, getattr(aten, "_efficientzerotensor", None))
def _zeros(low, *args, **kwargs):
    return _fill(low, 0)


@register(aten.ones.default, aten.ones_like.default, aten.new_ones.default)
def _ones(low, *args, **kwargs):
    return _fill(low, 1)


@register(aten.arange.start_step)
def _arange(low, start, end=None, step=1, **kwargs):
    meta = low.out_meta()
    dt = meta.dtype
    (n,) = meta.shape

    def fn():
        i = ir.var_index("i0", n)
        if _is_float(dt):
            pos = P.cast(ir.IndexValue.make(i, torch.int64), torch.float64)
            return P.build("add", low.scalar(start, torch.float64), P.build("mul", pos, low.scalar(step, torch.float64)))
        if not isinstance(start, Sym) and not isinstance(step, Sym):
            return ir.IndexValue.make(ir.add_const(ir.scale(i, int(step)), int(start)), torch.int64)
        pos = ir.IndexValue.make(i, torch.int64)
        return P.build("add", low.scalar(start, torch.int64), P.build("mul", pos, low.scalar(step, torch.int64)))
    return low.pointwise(lambda: fn())


@register(aten.arange.default, aten.arange.start)
def _arange_short(low, *args, **kwargs):
    if low.current.target is aten.arange.default:
        return _arange(low, 0, args[0], 1)
    return _arange(low, args[0], args[1], 1)


@register(prims.iota.default)
def _iota(low, length, *, start, step, **kwargs):
    return _arange(low, start, None, step)


# ---------------------------------------------------------------------------------------------- random
def _linear_offset(shape):
    return ir.linearize(ir.loop_vars(shape), shape)


@register(aten.rand_like.default, aten.rand.default, aten.rand.generator)
def _rand(low, *args, **kwargs):
    if kwargs.get("generator") is not None:
        raise LoweringError("an explicit torch.Generator")
    meta = low.out_meta()
    seed = low.new_seed()
    return low.pointwise(lambda: ir.Rand.make(seed, _linear_offset(meta.shape), False))


@register(aten.randn_like.default, aten.randn.default, aten.randn.generator)
def _randn(low, *args, **kwargs):
    if kwargs.get("generator") is not None:
        raise LoweringError("an explicit torch.Generator")
    meta = low.out_meta()
    seed = low.new_seed()
    return low.pointwise(lambda: ir.Rand.make(seed, _linear_offset(meta.shape), True))


@register(aten.bernoulli.p, aten.bernoulli.default)
def _bernoulli(low, a, p=None, generator=None):
    if generator is not None:
        raise LoweringError("an explicit torch.Generator")
    meta = low.out_meta()
    seed = low.new_seed()
    offset = _linear_offset(meta.shape)
    if p is None:  # p is the tensor itself
        return low.pointwise(lambda x: P.build("lt", ir.Rand.make(seed, offset, False),
                                               P.cast(x, torch.float32)), a)
    return low.pointwise(lambda: P.build("lt", ir.Rand.make(seed, offset, False), low.scalar(p, torch.float32)))
