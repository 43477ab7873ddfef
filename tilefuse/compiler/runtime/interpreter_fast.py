"""Vectorised reductions for Triton's interpreter (CPU only; never used on a GPU).

The interpreter (triton 3.6) runs ``tl.reduce`` with a user combine function element by element in Python
(``ReduceOps.generic_reduce``): a softmax row max over 7 x 1000 values takes ~0.3 s, and a quadratic scan of
7 x 1000 x 1000 a minute. Only Triton's own ``tl.sum``/``tl.max`` have numpy fast paths, and its ``tl.max``
ignores NaN (``np.nanmax``) where torch propagates it, which is why the generated kernels reduce with the
combine helpers of ir/primitives.py. :func:`install` adds numpy fast paths for exactly those helpers (found by
name; each kernel file carries its own copy), computing what the combine function computes:

* ``_tf_max_combine`` / ``_tf_min_combine``: NaN-propagating max/min (``np.max``/``np.min``);
* ``_tf_prod_combine``: ``np.prod``;
* ``_tf_argmax_combine`` / ``_tf_argmin_combine`` over ``(value, index)``: the extreme value (NaN counts as
  the largest, and for argmin as the smallest, as torch does) and the lowest index among the positions that
  hold it.

It gives comparison results the type ``int1``: the interpreter builds them with ``binary_op``, which types the
result as the *operand's* dtype (``float32`` for ``x != 0.0``). Blocks keep numpy's bool data, but a 0-d
comparison (of a scalar load) is splatted to a block by that recorded dtype and becomes float32 0.0/1.0, so
``block_bool ^ (scalar != 0)`` fails in numpy ("ufunc 'bitwise_xor' not supported") where the GPU, whose
comparisons are ``i1``, is fine.

It also makes conversions to bfloat16 round to nearest even, as the GPU's ``cvt.rn.bf16.f32`` and eager do:
the interpreter truncates (``_convert_float`` with no rounding mode), so a tensor cast to bfloat16 would
differ from eager in the last bit, and a float64 source would be converted as an integer.

The generated source is the same text the GPU compiles; only the interpreter's evaluation changes.
"""
from __future__ import annotations

import numpy as np

_installed = False

_FAST = ("_tf_max_combine", "_tf_min_combine", "_tf_prod_combine", "_tf_argmax_combine", "_tf_argmin_combine")


def _name(combine_fn) -> str:
    fn = getattr(combine_fn, "fn", combine_fn)
    return getattr(fn, "__name__", "")


def _arg_extreme(values: np.ndarray, index: np.ndarray, axis: int, largest: bool):
    isnan = np.isnan(values) if values.dtype.kind == "f" else np.zeros(values.shape, bool)
    any_nan = isnan.any(axis=axis, keepdims=True)
    finite = np.where(isnan, (-np.inf if largest else np.inf), values) if values.dtype.kind == "f" else values
    best = finite.max(axis=axis, keepdims=True) if largest else finite.min(axis=axis, keepdims=True)
    cand = np.where(any_nan, isnan, (finite == best) & ~isnan)
    big = np.iinfo(index.dtype).max
    chosen = np.where(cand, index, big).min(axis=axis, keepdims=True)
    value = np.where(any_nan, np.nan, best) if values.dtype.kind == "f" else best
    return value.astype(values.dtype), chosen.astype(index.dtype)


def install() -> None:
    """Patch the interpreter's reduction (idempotent)."""
    global _installed
    if _installed:
        return
    from triton.runtime import interpreter

    ops = interpreter.ReduceOps
    original = ops.apply_impl

    def apply_impl(self, input):
        name = _name(self.combine_fn)
        if name not in _FAST or self.axis is None:
            return original(self, input)
        axis = self.axis
        keep = self.keep_dims
        if name in ("_tf_argmax_combine", "_tf_argmin_combine"):
            values, index = input[0], input[1]
            v, i = _arg_extreme(values.handle.data, index.handle.data, axis, name == "_tf_argmax_combine")
            if not keep:
                v, i = np.squeeze(v, axis), np.squeeze(i, axis)
            return self.to_tensor(v, values.dtype), self.to_tensor(i, index.dtype)
        data = input[0].handle.data
        with np.errstate(all="ignore"):
            fn = {"_tf_max_combine": np.max, "_tf_min_combine": np.min, "_tf_prod_combine": np.prod}[name]
            out = fn(data, axis=axis, keepdims=keep).astype(data.dtype)
        return self.to_tensor(out, input[0].dtype)

    ops.apply_impl = apply_impl
    _patch_bf16_casts(interpreter)
    _patch_comparisons(interpreter)
    from . import interpreter_check

    interpreter_check.install()  # tilefuse's device asserts, and the bounds-checking mode
    _installed = True


def float_to_bf16_bits(data: np.ndarray) -> np.ndarray:
    """Round float32/float64 values to bfloat16 (nearest even), as uint16 bit patterns."""
    bits = np.ascontiguousarray(data, dtype=np.float32).view(np.uint32)
    rounded = ((bits.astype(np.uint64) + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    nan = (bits & 0x7FFFFFFF) > 0x7F800000
    return np.where(nan, ((bits >> 16) | 0x0040).astype(np.uint16), rounded)


def _patch_bf16_casts(interpreter) -> None:
    import triton.language as tl

    builder = interpreter.InterpreterBuilder
    original = builder.cast_impl

    def cast_impl(self, src, dst_type):
        src_t, dst_t = src.dtype.scalar, dst_type.scalar
        if dst_t == tl.bfloat16 and src_t in (tl.float32, tl.float64, tl.float16):
            data = src.data.astype(np.float32)
            return interpreter.TensorHandle(float_to_bf16_bits(data), dst_t)
        if src_t == tl.bfloat16 and dst_t in (tl.float64, tl.float16):
            wide = (src.data.astype(np.uint32) << 16).view(np.float32)
            return interpreter.TensorHandle(wide.astype(interpreter._get_np_dtype(dst_t)), dst_t)
        return original(self, src, dst_type)

    builder.cast_impl = cast_impl
    for name in ("create_fp_ext", "create_fp_trunc", "create_si_to_fp", "create_ui_to_fp"):
        setattr(builder, name, lambda self, src, dst_type: self.cast_impl(src, dst_type))


def _patch_comparisons(interpreter) -> None:
    import triton.language as tl

    builder = interpreter.InterpreterBuilder
    for name in list(vars(builder)):
        if not name.startswith(("create_icmp", "create_fcmp")):
            continue
        original = getattr(builder, name)

        def compare(self, lhs, rhs, _original=original):
            out = _original(self, lhs, rhs)
            return interpreter.TensorHandle(np.asarray(out.data).astype(np.bool_), tl.int1)

        setattr(builder, name, compare)
