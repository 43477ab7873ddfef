"""The decomposition table AOTAutograd traces with: torch's own, plus the few entries tilefuse needs on top.

``torch._decomp.core_aten_decompositions()`` lowers ~2,000 operators to core ATen, but core ATen keeps
``_softmax``, ``_log_softmax``, ``native_layer_norm``, ``gelu`` and ``native_dropout`` as single ops (they are
core ops). Those decompose into pointwise + reduction primitives here, from torch's own registry, so that the
scheduler can fuse them. Entries that torch writes with ``prims`` (``var_mean``, ``sigmoid``, ...) are left
out on purpose: the lowering has rules for the ATen ops and prims would only add ops to lower.

What torch gets wrong for a training graph: a decomposition must return every output the op returns, because
AOTAutograd records the op's backward (with the op's outputs as saved values) *before* the decomposition runs
below it. :data:`EXCLUDED` lists the entries of torch's tables whose outputs differ from the op's; those ops stay
in the graph as themselves and run as ATen externs, forward and backward alike.
``tests/compiler/test_compiler_decompositions.py`` compares every multi-output entry of the table with its op.

What torch lacks: on torch builds whose registry has no ``_fused_rms_norm`` decomposition (the op
``F.rms_norm`` reaches on CUDA), :func:`_fused_rms_norm` below supplies one.
"""
from __future__ import annotations

import functools

import torch

aten = torch.ops.aten

# Decompositions taken from torch's registry on top of the core table (name, overload or None for all).
EXTRA_FROM_TORCH = (
    "_softmax", "_log_softmax", "native_layer_norm", "gelu", "native_dropout", "dropout",
    "native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_functional",
    "_native_batch_norm_legit_no_training", "native_group_norm", "_fused_rms_norm", "_fused_rms_norm_backward",
    "native_layer_norm_backward", "_softmax_backward_data", "_log_softmax_backward_data", "gelu_backward",
    "native_dropout_backward", "hardtanh_backward", "elu_backward", "silu", "silu_backward", "narrow",
    "split.Tensor", "unbind", "std", "std_mean", "logsumexp.default", "addcmul", "addcdiv", "lerp",
    "nan_to_num", "logit", "mish", "softplus", "hardswish", "hardsigmoid", "glu",
)


# Entries of torch's tables that do not compute what their op computes (op name -> what differs).
EXCLUDED = {
    # returns (out, attention weights) where the op returns (out, logsumexp): the fused backward op, which the
    # graph keeps, then reads the (B, H, L, S) weights as a (B, H, L) logsumexp (gradients off by ~1e3).
    "_scaled_dot_product_flash_attention_for_cpu": "its second output is the attention weights, not the logsumexp",
    # counts targets after the first -1 of a row, which eager ignores (losses 2-4x eager's).
    "multilabel_margin_loss_forward": "its loss differs from eager's when a target row holds -1",
}


def _registry_entries(names) -> dict:
    from torch._decomp import decomposition_table

    wanted = []
    for name in names:
        base, _, overload = name.partition(".")
        packet = getattr(aten, base, None)
        if packet is None:  # an op this torch does not have
            continue
        overloads = [overload] if overload else packet.overloads()
        for o in overloads:
            op = getattr(packet, o, None)
            if op is not None and op in decomposition_table:
                wanted.append(op)
    return {op: decomposition_table[op] for op in wanted}


def _fused_rms_norm(input, normalized_shape, weight, eps):
    """``aten._fused_rms_norm`` as pointwise + one reduction (used only where torch's registry has none)."""
    dims = list(range(input.dim() - len(normalized_shape), input.dim()))
    compute = torch.float32 if input.dtype in (torch.float16, torch.bfloat16) else input.dtype
    x = input.to(compute)
    if eps is None:
        eps = torch.finfo(compute).eps
    rstd = torch.rsqrt(aten.add.Scalar(torch.pow(x, 2).mean(dim=dims, keepdim=True), eps))
    out = x * rstd
    if weight is not None:
        out = out * weight
    return out.to(input.dtype), rstd


def _has_complex(tree) -> bool:
    from torch.utils import _pytree as pytree

    return any(isinstance(v, torch.Tensor) and v.dtype.is_complex for v in pytree.tree_leaves(tree))


def _real_only(decomposition):
    """``decomposition``, declined (``NotImplemented``: the op stays in the graph as itself) for complex operands.

    Complex tensors are out of scope: their ops run in ATen as externs, and an extern must give eager's
    answer, which is the answer of eager's own kernel for the op. A decomposition computes something else
    (complex silu decomposes to ``x * sigmoid(x)``, eager's kernel computes ``x / (1 + exp(-x))``: 14 of 20
    elements differ), so complex calls are never decomposed.
    """
    @functools.wraps(decomposition)
    def decompose(*args, **kwargs):
        if _has_complex((args, kwargs)):
            return NotImplemented
        return decomposition(*args, **kwargs)

    return decompose


@functools.lru_cache(maxsize=1)
def decomposition_table() -> dict:
    """The table handed to AOTAutograd (built once a process)."""
    from torch._decomp import core_aten_decompositions

    table = dict(core_aten_decompositions())
    table.update(_registry_entries(EXTRA_FROM_TORCH))
    for op in list(table):
        if getattr(op, "_opname", None) in EXCLUDED:
            del table[op]
    fused = getattr(aten, "_fused_rms_norm", None)
    if fused is not None and fused.default not in table:
        table[fused.default] = _fused_rms_norm
    return {op: _real_only(fn) for op, fn in table.items()}
