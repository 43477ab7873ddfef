"""The GEMM epilogue: what happens to the fp32 accumulator tile between the last MMA and the single store.

Every GEMM kernel of :mod:`tilefuse.kernels.gemm` calls :func:`apply_epilogue` on its fp32 accumulator tile
(an int32 accumulator is converted first), in this fixed order::

    acc = acc * scale_a * scale_b          # fp8/int8 dequantisation, torch._scaled_mm semantics
    acc = alpha * acc + bias               # bias per column (shape (N,)) or per row (shape (M, 1))
    acc = activation(acc)                  # none | relu | gelu | gelu_tanh | silu | sigmoid | tanh
    (pre-activation value stored here when autograd needs it)
    acc = acc + beta * residual            # residual of shape (M, N), any strides
    acc = EPILOGUE(acc, offs_m, offs_n, mask_m, mask_n,
                   e0_ptr, e0_sm, e0_sn, e1_ptr, e1_sm, e1_sn,
                   e2_ptr, e2_sm, e2_sn, e3_ptr, e3_sm, e3_sn)   # the hook, if any

and the kernel then casts and stores it, or quantises it (fp8 / int8 with a per-row scale from the row amax),
or stores nothing when the caller passed ``store_out=False`` (the hook stored every output through its slots:
the compiler's quantising tail with a scale of its own, docs/decisions/033-compiler-gemm-quantised-outputs.md).

The hook (the compiler's fused pointwise tail)
----------------------------------------------
``EPILOGUE`` is a ``tl.constexpr`` kernel argument holding a ``@triton.jit`` function, or None. It receives
the fp32 tile ``acc`` of shape ``[BLOCK_M, BLOCK_N]``, the tile's global row and column indices ``offs_m``
(``[BLOCK_M]``) and ``offs_n`` (``[BLOCK_N]``), their in-bounds masks ``mask_m`` and ``mask_n``, and four
extra operands as ``(pointer, row stride, column stride)`` triples, pointers already advanced to the batch
of the tile. An operand of shape (M, N), (N,) or (M, 1) is passed with stride 0 on its broadcast dimension,
so ``tl.load(e0_ptr + offs_m[:, None] * e0_sm + offs_n[None, :] * e0_sn, mask=...)`` reads it whatever
its shape. Unused triples point at a dummy one-element tensor with zero strides. The hook returns the new
fp32 tile (same shape). It must not store to the output. It may store to an extra operand that is a buffer
of its own (not overlapping the GEMM's inputs, its output or the other operands), with ``mask``: that is how
the compiler gets several outputs from one epilogue (the pre-activation the backward saves, and the
activation); each tile is written by exactly one program, after its K loop, so such a store is as final as
the output's (docs/decisions/026-compiler-gemm-epilogues.md). Example::

    @triton.jit
    def silu_plus_e0(acc, offs_m, offs_n, mask_m, mask_n,
                     e0, e0_sm, e0_sn, e1, e1_sm, e1_sn, e2, e2_sm, e2_sn, e3, e3_sm, e3_sn):
        mask = mask_m[:, None] & mask_n[None, :]
        x = tl.load(e0 + offs_m[:, None] * e0_sm + offs_n[None, :] * e0_sn, mask=mask, other=0.0)
        return acc * tl.sigmoid(acc) + x.to(tl.float32)

    tilefuse.kernels.gemm.gemm_with_epilogue(a, b, silu_plus_e0, [e0], torch.float16)

This signature is the stable contract between the GEMM library and generated code: the number of extra
operands (:data:`NUM_EXTRA_OPERANDS`) and the argument order do not change.

Under the interpreter, ``tl.extra.libdevice`` does not run (triton 3.6), so tanh is written from
``tl.exp`` here; the exact GeLU is ``0.5 * x * erfc(-x / sqrt(2))`` with the float32 erfc of
:mod:`tilefuse.kernels.special` (core ops on the interpreter, libdevice's fast reciprocal and exp on a GPU);
``tl.sigmoid`` is a core op.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..special import erfc_f32

NUM_EXTRA_OPERANDS = 4  # (ptr, stride_m, stride_n) triples handed to the hook

# name -> code passed to the kernels as the ACTIVATION constexpr
ACTIVATIONS: dict[str, int] = {"none": 0, "relu": 1, "gelu": 2, "gelu_tanh": 3, "silu": 4, "sigmoid": 5, "tanh": 6}
BIAS_MODES: dict[str, int] = {"none": 0, "col": 1, "row": 2}
SCALE_MODES_A: dict[str, int] = {"none": 0, "tensor": 1, "row": 2}
SCALE_MODES_B: dict[str, int] = {"none": 0, "tensor": 1, "col": 2}
# QUANT constexpr: 0 plain cast and store; 1 store the fp32-epilogue value in a wide temporary and the
# per-(row, column tile) amax, then a second kernel quantises (a row spans many tiles); 2 the tile holds
# whole rows (N <= BLOCK_N), so the kernel quantises directly.
QUANT_NONE, QUANT_TWO_PASS, QUANT_DIRECT = 0, 1, 2
QUANT_EPS = 1e-12  # amax floor: an all-zero row gets a tiny positive scale (and zero codes), never 0/0

SQRT_HALF = 0.7071067811865476
SQRT_2_OVER_PI = 0.7978845608028654
GELU_TANH_C = 0.044715


@triton.jit
def tanh_f32(x):
    # tanh(x) = 1 - 2 / (exp(2x) + 1): exp overflows to inf for x > 44, giving exactly 1; for x < -44 exp
    # underflows to 0, giving -1. Absolute error ~1e-7 near 0 (cancellation), fine for an fp32 epilogue.
    return 1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)


@triton.jit
def activate(x, ACTIVATION: tl.constexpr):
    if ACTIVATION == 1:
        x = tl.maximum(x, 0.0)
    elif ACTIVATION == 2:
        x = 0.5 * x * erfc_f32(x * -0.7071067811865476)  # x * Phi(x); 1 + erf(x/sqrt2) cancels for x < 0
    elif ACTIVATION == 3:
        inner = 0.7978845608028654 * (x + 0.044715 * x * x * x)
        x = 0.5 * x * (1.0 + tanh_f32(inner))
    elif ACTIVATION == 4:
        x = x * tl.sigmoid(x)
    elif ACTIVATION == 5:
        x = tl.sigmoid(x)
    elif ACTIVATION == 6:
        x = tanh_f32(x)
    return x


@triton.jit
def apply_epilogue(acc, offs_m, offs_n, mask_m, mask_n,
                   scale_a_ptr, scale_b_ptr, bias_ptr, stride_bias, res_ptr, stride_rm, stride_rn,
                   pre_ptr, stride_pm, stride_pn, alpha, beta,
                   e0_ptr, e0_sm, e0_sn, e1_ptr, e1_sm, e1_sn, e2_ptr, e2_sm, e2_sn, e3_ptr, e3_sm, e3_sn,
                   EPILOGUE: tl.constexpr, ACTIVATION: tl.constexpr, BIAS_MODE: tl.constexpr,
                   HAS_RESIDUAL: tl.constexpr, SCALE_A_MODE: tl.constexpr, SCALE_B_MODE: tl.constexpr,
                   HAS_ALPHA: tl.constexpr, STORE_PRE: tl.constexpr):
    """The built-in epilogue steps, then the hook; pointers are already at the tile's batch."""
    acc = acc.to(tl.float32)
    if SCALE_A_MODE == 1:
        acc = acc * tl.load(scale_a_ptr).to(tl.float32)
    elif SCALE_A_MODE == 2:
        sa = tl.load(scale_a_ptr + offs_m, mask=mask_m, other=0.0).to(tl.float32)
        acc = acc * sa[:, None]
    if SCALE_B_MODE == 1:
        acc = acc * tl.load(scale_b_ptr).to(tl.float32)
    elif SCALE_B_MODE == 2:
        sb = tl.load(scale_b_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)
        acc = acc * sb[None, :]
    if HAS_ALPHA:
        acc = acc * alpha
    if BIAS_MODE == 1:
        bias = tl.load(bias_ptr + offs_n * stride_bias, mask=mask_n, other=0.0).to(tl.float32)
        acc = acc + bias[None, :]
    elif BIAS_MODE == 2:
        bias = tl.load(bias_ptr + offs_m * stride_bias, mask=mask_m, other=0.0).to(tl.float32)
        acc = acc + bias[:, None]
    mask = mask_m[:, None] & mask_n[None, :]
    if STORE_PRE:
        tl.store(pre_ptr + offs_m[:, None] * stride_pm + offs_n[None, :] * stride_pn,
                 acc.to(pre_ptr.dtype.element_ty), mask=mask)
    acc = activate(acc, ACTIVATION)
    if HAS_RESIDUAL:
        res = tl.load(res_ptr + offs_m[:, None] * stride_rm + offs_n[None, :] * stride_rn, mask=mask, other=0.0)
        acc = acc + beta * res.to(tl.float32)
    if EPILOGUE is not None:
        acc = EPILOGUE(acc, offs_m, offs_n, mask_m, mask_n, e0_ptr, e0_sm, e0_sn, e1_ptr, e1_sm, e1_sn,
                       e2_ptr, e2_sm, e2_sn, e3_ptr, e3_sm, e3_sn)
    return acc


@triton.jit
def round_half_even(x):
    # torch.round semantics without libdevice.rint (which the interpreter cannot run)
    r = tl.floor(x + 0.5)
    tie = (r - x) == 0.5
    odd = (r - 2.0 * tl.floor(r * 0.5)) != 0.0
    return tl.where(tie & odd, r - 1.0, r)


@triton.jit
def round_to_fp8_grid(x, MANT: tl.constexpr, EMIN: tl.constexpr):
    """Round fp32 ``x`` to the nearest value (ties to even) of an fp8 format with MANT mantissa bits and
    smallest normal exponent EMIN, in fp32 arithmetic. The interpreter's fp32 -> fp8 cast (triton 3.6)
    drops the carry when rounding crosses a power of two (125.7 -> 64 in e4m3); after this the cast is
    exact. GPUs round in the cast itself (cvt.rn.satfinite) and skip this."""
    bits = x.to(tl.int32, bitcast=True)
    e = tl.maximum(((bits >> 23) & 0xFF) - 127, EMIN)
    quantum = ((e - MANT + 127) << 23).to(tl.float32, bitcast=True)
    return round_half_even(x / quantum) * quantum


@triton.jit
def quantize_values(y, scale, QMAX: tl.constexpr, Q_INT: tl.constexpr, Q_GRID_MANT: tl.constexpr,
                    Q_GRID_EMIN: tl.constexpr):
    """y / scale, clamped to [-QMAX, QMAX] (fp8 e4m3 has no inf: an overflow would become NaN), rounded to
    the nearest integer for int8 (or to the fp8 grid when Q_GRID_MANT > 0); the caller casts."""
    q = y / scale
    q = tl.minimum(tl.maximum(q, -QMAX), QMAX)
    if Q_INT:
        q = round_half_even(q)
    elif Q_GRID_MANT > 0:
        q = round_to_fp8_grid(q, Q_GRID_MANT, Q_GRID_EMIN)
    return q


@triton.jit
def example_silu_plus_e0(acc, offs_m, offs_n, mask_m, mask_n,
                         e0, e0_sm, e0_sn, e1, e1_sm, e1_sn, e2, e2_sm, e2_sn, e3, e3_sm, e3_sn):
    """A hand-written hook, used by the tests, the target matrix and the docs: silu(acc) + e0."""
    mask = mask_m[:, None] & mask_n[None, :]
    x = tl.load(e0 + offs_m[:, None] * e0_sm + offs_n[None, :] * e0_sn, mask=mask, other=0.0)
    return acc * tl.sigmoid(acc) + x.to(tl.float32)
