"""``tilefuse.gemm``: a Triton GEMM with the epilogue fused into its single store.

    out = activation(alpha * (a @ b) [* scale_a * scale_b] + bias) + beta * residual

then cast to ``out_dtype``, or quantised (``quantize=``) to fp8/int8 with one scale a row. The whole
epilogue runs in fp32 registers of the GEMM kernel: no intermediate ever reaches memory.

Operands: ``a`` (M, K) or (Z, M, K), ``b`` (K, N) or (Z, K, N), any strides (row- or column-major,
transposed views, slices); a batch of 1 broadcasts against the other operand's batch. Any M, N, K >= 1;
a zero-size dimension gives the right empty (or, for K = 0, the epilogue of a zero) result.

dtypes: fp16, bf16, fp32 (tf32 tensor cores only when ``torch.backends.cuda.matmul.allow_tf32`` is
set), fp8 e4m3/e5m2 with ``scale_a`` (one scale, or one a row of a) and ``scale_b`` (one, or one a
column of b) as in ``torch._scaled_mm`` (default output bf16), int8 x int8 -> int32 (or a float output
with an epilogue).

Autograd: differentiable in a, b, bias and residual for float inputs; the backward's two GEMMs run on
this library too (dA = dP @ B^T, dB = A^T @ dP with dP the gradient through the activation).
"""
from __future__ import annotations

from typing import Optional, Union

import torch

from .kernels import gemm as _gemm
from .kernels.compile_boundary import eager_under_compile
from .kernels.gemm import plan as _plan

Tensor = torch.Tensor
_TORCH_ACTIVATIONS = {
    "relu": torch.relu,
    "gelu": lambda x: torch.nn.functional.gelu(x),
    "gelu_tanh": lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
    "silu": torch.nn.functional.silu,
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
}
ACTIVATIONS = (None,) + tuple(_TORCH_ACTIVATIONS)


@eager_under_compile  # under torch.compile: a graph break, run as in eager (kernels/compile_boundary.py)
def gemm(a: Tensor, b: Tensor, *, bias: Optional[Tensor] = None, activation: Optional[str] = None,
         residual: Optional[Tensor] = None, alpha: float = 1.0, beta: float = 1.0,
         out_dtype: Optional[torch.dtype] = None, quantize: Union[None, str, torch.dtype] = None,
         out: Optional[Tensor] = None, scale_a: Optional[Tensor] = None,
         scale_b: Optional[Tensor] = None) -> Union[Tensor, tuple[Tensor, Tensor]]:
    """``activation(alpha * (a @ b) + bias) + beta * residual`` in one Triton kernel.

    Args:
        a: (M, K) or (Z, M, K); fp16, bf16, fp32, fp8 (e4m3fn/e5m2) or int8.
        b: (K, N) or (Z, K, N), the same dtype family as ``a``. A batch of 1 broadcasts. Any strides. On
            Hopper, fp32 (as tf32), fp8 and int8 are read fastest K-major (``w.t()`` of a contiguous (N, K)
            ``w``, as nn.Linear keeps its weight); a row-major B is copied K-major first when M >= 256, one
            extra pass over B (``tilefuse.kernels.gemm.plan.wgmma_copies``), and an M-major ``a`` likewise.
        bias: (N,) or (1, N): one a column (the nn.Linear bias); (M, 1): one a row. Float dtype.
        activation: None, "relu", "gelu" (exact, erf), "gelu_tanh", "silu", "sigmoid" or "tanh".
        residual: added after the activation, times ``beta``; any tensor broadcasting to the output.
        alpha, beta: Python floats.
        out_dtype: the result's dtype: fp16/bf16/fp32 (default: the inputs' dtype; bf16 for fp8 inputs;
            int32 for int8 inputs, which then take no epilogue).
        quantize: "fp8_e4m3", "fp8_e5m2", "int8" (or those torch dtypes): the result is quantised with one
            scale a row, ``scale = row_amax / dtype_max``, and ``(codes, scales)`` is returned with scales of
            shape (M, 1) (or (Z, M, 1)) in float32, so ``codes * scales`` approximates the result and
            ``(codes, scales)`` can feed the next fp8 GEMM as ``a, scale_a``.
        out: write the result here (shape and dtype of the result; any strides).
        scale_a, scale_b: float32 dequantisation scales of fp8/int8 inputs (``torch._scaled_mm``'s
            meaning): a single value, or (M, 1) for ``a`` / (1, N) for ``b``.

    Returns the result, of shape (M, N), or (Z, M, N) if either operand is 3-D; ``(codes, scales)`` with
    ``quantize``. Raises TypeError/ValueError naming the argument before anything runs.
    """
    if activation is not None and activation not in _TORCH_ACTIVATIONS:
        raise ValueError(f"activation={activation!r}: accepted values are None, "
                         + ", ".join(repr(k) for k in _TORCH_ACTIVATIONS))
    if torch.is_grad_enabled() and (getattr(a, "requires_grad", False) or getattr(b, "requires_grad", False)
                                    or getattr(bias, "requires_grad", False)
                                    or getattr(residual, "requires_grad", False)):
        _check_differentiable(a, b, quantize, out, scale_a, scale_b, out_dtype)
        return _GemmFunction.apply(a, b, bias, residual, activation, float(alpha), float(beta), out_dtype)
    value, scale, _ = _plan.gemm_call(a, b, out_dtype=out_dtype, bias=bias, activation=activation or "none",
                                      residual=residual, alpha=alpha, beta=beta, scale_a=scale_a, scale_b=scale_b,
                                      quantize=quantize, out=out)
    if scale is not None:
        return value, scale
    return value


def _check_differentiable(a, b, quantize, out, scale_a, scale_b, out_dtype) -> None:
    if quantize is not None:
        raise ValueError("quantize= has no gradient: call tilefuse.gemm under torch.no_grad() (or detach the inputs)")
    if out is not None:
        raise ValueError("out= with inputs that require grad: autograd needs its own output tensor")
    if scale_a is not None or scale_b is not None:
        raise ValueError("scale_a/scale_b (fp8/int8 inputs) have no gradient here; detach the inputs")
    for name, t in (("a", a), ("b", b)):
        if isinstance(t, Tensor) and t.dtype not in _gemm.FLOAT_INPUTS:
            raise TypeError(f"{name} has dtype {t.dtype}: autograd needs float inputs (float16, bfloat16, float32)")
    if out_dtype is not None and isinstance(a, Tensor) and out_dtype != a.dtype:
        raise ValueError(f"out_dtype={out_dtype} differs from the inputs' {a.dtype}: under autograd the result keeps "
                         "the inputs' dtype")


def _sum_to(grad: Tensor, shape: torch.Size) -> Tensor:
    """Sum a gradient down to the shape of a broadcast input."""
    if tuple(grad.shape) == tuple(shape):
        return grad
    lead = grad.dim() - len(shape)
    if lead < 0:
        grad = grad.reshape((1,) * -lead + tuple(grad.shape))
        lead = 0
    if lead > 0:
        grad = grad.sum(dim=tuple(range(lead)))
    dims = tuple(i for i, s in enumerate(shape) if s == 1 and grad.shape[i] != 1)
    if dims:
        grad = grad.sum(dim=dims, keepdim=True)
    return grad.reshape(shape)


class _GemmFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b, bias, residual, activation, alpha, beta, out_dtype):
        value, _, pre = _plan.gemm_call(a, b, out_dtype=out_dtype, bias=bias, activation=activation or "none",
                                        residual=residual, alpha=alpha, beta=beta, store_pre=activation is not None)
        ctx.activation, ctx.alpha, ctx.beta = activation, alpha, beta
        ctx.a_shape, ctx.b_shape = a.shape, b.shape
        ctx.bias_shape = bias.shape if bias is not None else None
        ctx.bias_dtype = bias.dtype if bias is not None else None
        ctx.res_shape = residual.shape if residual is not None else None
        ctx.res_dtype = residual.dtype if residual is not None else None
        ctx.two_d = a.dim() == 2 and b.dim() == 2
        ctx.save_for_backward(a, b, pre)
        return value

    @staticmethod
    def backward(ctx, grad):
        a, b, pre = ctx.saved_tensors
        g = grad if grad.dim() == 3 else grad.unsqueeze(0)
        if ctx.activation is not None:
            with torch.enable_grad():
                x = pre.detach().float().requires_grad_(True)
                y = _TORCH_ACTIVATIONS[ctx.activation](x)
                (dpre,) = torch.autograd.grad(y, x, g.float())
            dpre = dpre.to(a.dtype)
        else:
            dpre = g.to(a.dtype)
        a3 = a if a.dim() == 3 else a.unsqueeze(0)
        b3 = b if b.dim() == 3 else b.unsqueeze(0)
        Z = dpre.shape[0]
        ga = gb = gbias = gres = None
        if ctx.needs_input_grad[0]:
            # dA = alpha dP @ B^T: B^T is a transposed view, which the kernel reads as is
            ga = _gemm.gemm_raw(dpre, b3.transpose(-1, -2), alpha=ctx.alpha).out
            ga = _sum_to(ga if len(ctx.a_shape) == 3 else ga.sum(0), ctx.a_shape)
        if ctx.needs_input_grad[1]:
            if b3.shape[0] == 1 and Z > 1:
                # B shared across the batch: one GEMM over all rows, A^T (K x ZM) @ dP (ZM x N)
                aa = a3.expand(Z, *a3.shape[1:]).reshape(Z * a3.shape[1], a3.shape[2])
                gb = _gemm.gemm_raw(aa.transpose(0, 1), dpre.reshape(-1, dpre.shape[-1]), alpha=ctx.alpha).out[0]
            else:
                gb = _gemm.gemm_raw(a3.transpose(-1, -2), dpre, alpha=ctx.alpha).out
                if len(ctx.b_shape) == 2:
                    gb = gb.sum(0)
            gb = _sum_to(gb, ctx.b_shape)
        if ctx.bias_shape is not None and ctx.needs_input_grad[2]:
            gbias = _sum_to(dpre.float(), ctx.bias_shape).to(ctx.bias_dtype)
        if ctx.res_shape is not None and ctx.needs_input_grad[3]:
            gres = _sum_to(g.float() * ctx.beta, ctx.res_shape).to(ctx.res_dtype)
        return ga, gb, gbias, gres, None, None, None, None


def matmul(a: Tensor, b: Tensor) -> Tensor:
    """``a @ b`` on the library's kernels (2-D or 3-D operands)."""
    return gemm(a, b)
