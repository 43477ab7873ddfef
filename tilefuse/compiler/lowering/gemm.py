"""Lowering rules for matmuls: ``mm``, ``bmm``, ``addmm``, ``baddbmm`` -> an :class:`ir.Gemm` node (plus, for
the ``add`` forms, a Pointwise node ``beta * input + alpha * (a @ b)`` that the scheduler fuses into the
GEMM's epilogue like any other pointwise consumer). ``linear``, ``matmul`` and ``einsum`` reach the
compiler decomposed into these.

The GEMM runs on the library's kernel (:mod:`tilefuse.kernels.gemm.plan`): operands are read through their
strides (a transposed weight, the backward's ``x.T @ grad``), never copied, unless an operand is a view the
runtime cannot express as a strided tensor (then it is materialised once by a pointwise copy).

What the library does not take stays an ATen call *by design*, with the reason as the extern's note (shown
by ``explain``, not counted as a fallback): dtypes other than float16 / bfloat16 / float32, an empty
dimension, or whatever :func:`tilefuse.kernels.gemm.plan.supports` rejects. ``GEMM["enabled"]`` False sends
every matmul to ATen (the switch to isolate a problem in a model).
"""
from __future__ import annotations

import torch

from .. import ir
from ..ir import primitives as P
from .core import TV, ByDesign, LoweringError, Lowerer, contiguous_stride, plain, register

aten = torch.ops.aten

# Switches of the GEMM lowering (a test or a user isolating a model's problem sets "enabled" False).
GEMM = {"enabled": True}
GEMM_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _fake(low: Lowerer, k: int):
    """The value (fake tensor with concrete sizes) of the current FX node's ``k``-th argument."""
    arg = low.current.args[k]
    return low.meta(arg) if hasattr(arg, "op") else arg


def _strided(low: Lowerer, tv: TV) -> TV:
    """``tv`` itself when the runtime can hand it to the GEMM as a strided tensor (a node, or a view whose
    element offsets are affine in its indices); else a pointwise copy of it (one pass, then read densely)."""
    node = low.table[tv.name]
    if not isinstance(node, ir.View):
        return tv
    index = tuple(ir.loop_vars(node.shape))
    cur, base = node, tv.name
    while isinstance(cur, ir.View):
        mapping = {f"i{d}": index[d] for d in range(len(cur.shape))}
        index = tuple(ir.substitute(ix, mapping) for ix in cur.index)
        base = cur.source
        cur = low.table[base]
    phys = ir.strided_offset(index, low.tensor_meta[base].stride)
    if all(isinstance(atom, ir.Var) for atom, _ in phys.terms):
        return tv
    meta = low.tensor_meta[tv.name]
    dense = ir.TensorMeta(meta.shape, contiguous_stride(meta.shape), meta.dtype)
    return low.pointwise(lambda x: x, tv, name=low.new_name("operand"), meta=dense)


def _check(low: Lowerer, a: TV, b: TV, ka: int, kb: int) -> None:
    """Raise :class:`ByDesign` (the matmul stays an ATen call, with this note) where the library GEMM does not
    take these operands."""
    if not GEMM["enabled"]:
        raise ByDesign("GEMM lowering is off (lowering.gemm.GEMM['enabled'])")
    ma, mb = low.tensor_meta[a.name], low.tensor_meta[b.name]
    if ma.dtype not in GEMM_DTYPES or mb.dtype != ma.dtype:
        raise ByDesign(f"the library GEMM takes float16/bfloat16/float32 operands of one dtype, not "
                       f"{ma.dtype} @ {mb.dtype}")
    if 0 in ma.shape or 0 in mb.shape:
        raise ByDesign(f"an empty dimension ({list(ma.shape)} @ {list(mb.shape)}): nothing for a kernel to do")
    from ...kernels.gemm import plan as gemm_plan

    fa, fb = _fake(low, ka), _fake(low, kb)
    if isinstance(fa, torch.Tensor) and isinstance(fb, torch.Tensor):
        ok, why = gemm_plan.supports(fa, fb)
        if not ok:
            raise ByDesign(f"the library GEMM does not take these operands: {why}")


def _gemm(low: Lowerer, a: TV, b: TV, name: str, meta: ir.TensorMeta) -> TV:
    a, b = _strided(low, a), _strided(low, b)
    node = ir.Gemm(name, meta.shape, low.buffer_stride(meta), meta.dtype, a.name, b.name, low.origin())
    return low.add(node)


@register(aten.mm, aten.bmm)
def _mm(low: Lowerer, a, b):
    if not isinstance(a, TV) or not isinstance(b, TV):
        raise LoweringError("matmul of a non-tensor")
    _check(low, a, b, 0, 1)
    return _gemm(low, a, b, low.current.name, low.out_meta())


@register(aten.addmm, aten.baddbmm)
def _addmm(low: Lowerer, inp, a, b, beta=1, alpha=1):
    if not all(isinstance(x, TV) for x in (inp, a, b)):
        raise LoweringError("addmm of a non-tensor")
    _check(low, a, b, 1, 2)
    meta = low.out_meta()
    if low.tensor_meta[inp.name].dtype != meta.dtype:
        raise ByDesign(f"addmm input of dtype {low.tensor_meta[inp.name].dtype} with {meta.dtype} operands")
    g = _gemm(low, a, b, low.new_name("mm"), ir.TensorMeta(meta.shape, meta.stride, meta.dtype))
    beta, alpha = plain(beta), plain(alpha)
    f32 = torch.float32

    def fn(x, y):
        y = P.cast(y, f32)
        if alpha != 1:
            y = P.build("mul", y, P.const(alpha, f32))
        if beta == 0:  # eager ignores the input then (a NaN in it does not propagate)
            return y
        x = P.cast(x, f32)
        if beta != 1:
            x = P.build("mul", x, P.const(beta, f32))
        return P.build("add", x, y)

    return low.pointwise(fn, inp, g, meta=meta)
