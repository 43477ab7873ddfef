"""The attention family's library API: :func:`attention` with autograd, :func:`attention_with_lse`,
:func:`attention_varlen` (packed variable-length sequences), :func:`supports` (the package docstring,
:mod:`tilefuse.kernels.attention`, describes the arguments)."""
from __future__ import annotations

import math

import torch

from ..compile_boundary import eager_under_compile
from . import ops
from .checks import DTYPES, MAX_HEAD_DIM, Params, check_arguments, normalize_causal, normalize_window
from .kernels import LN2
from .launch import Plan, backward, forward, lse_natural, plan_forward
from .varlen import VarlenParams, backward_varlen, check_varlen_arguments, forward_varlen


class AttentionFunction(torch.autograd.Function):
    """Autograd over the forward/backward kernels. Saves q, k, v, the output and its log2 logsumexp."""

    @staticmethod
    def forward(ctx, q, k, v, mask, alibi, params: Params, plan: Plan | None):
        out, lse2 = forward(q, k, v, params, mask, alibi, plan)
        ctx.save_for_backward(q, k, v, out, lse2, mask, alibi)
        ctx.params = params
        ctx.mark_non_differentiable(lse2)
        return out, lse2

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse2, mask, alibi = ctx.saved_tensors
        dq, dk, dv = backward(dout, q, k, v, out, lse2, ctx.params, mask, alibi)
        return dq, dk, dv, None, None, None, None


def _run(q, k, v, causal, window, softcap, alibi, mask, score_mod, score_mod_grad, dropout_p, dropout_seed,
         scale, deterministic, plan_options):
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)
                                                 if isinstance(t, torch.Tensor))
    params, mask_view, alibi_view = check_arguments(
        q, k, v, causal=causal, window=window, softcap=softcap, alibi=alibi, mask=mask, score_mod=score_mod,
        score_mod_grad=score_mod_grad, dropout_p=dropout_p, dropout_seed=dropout_seed, scale=scale,
        deterministic=deterministic, needs_grad=needs_grad)
    plan = plan_forward(params, q.dtype, **plan_options) if plan_options else None
    out, lse2 = AttentionFunction.apply(q, k, v, mask_view, alibi_view, params, plan)
    return out, lse2, params


def _as_op_call(q, k, v, causal, window, softcap, alibi, mask, dropout_p, scale):
    """The call as ``tilefuse::attention_fwd``'s arguments (the custom op the compiler also uses: one node in the
    compiled graph, no break), or None where the op cannot express it (bottom-right causal)."""
    kind = normalize_causal(causal)
    if kind == "bottom_right":
        return None
    left, right = normalize_window(window) or (-1, -1)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    return (q, k, v, mask, alibi, float(scale), float(softcap) if softcap is not None else 0.0,
            int(kind == "top_left"), left, right, float(dropout_p))


def attention(q, k, v, *, causal=False, window=None, softcap=None, alibi=None, mask=None, score_mod=None,
              dropout_p=0.0, scale=None, deterministic=False, score_mod_grad=None, dropout_seed=None,
              num_splits=None, pack_gqa=None):
    """Flash attention: softmax(mods(q k^T * scale)) @ v, (B, H, Sq, D) out. See the package docstring.

    ``num_splits`` / ``pack_gqa`` override the forward's plan (KV splits of the decode form; GQA rows packed
    a KV head); None lets :func:`plan_forward` decide. Under ``torch.compile`` a call the family's custom op
    expresses (no ``score_mod``, seed, plan override or ``deterministic``; top-left causal) is that op, one node
    of the compiled graph; any other call is a graph break that runs as in eager."""
    if torch.compiler.is_compiling():
        plain = score_mod is None and score_mod_grad is None and dropout_seed is None and not deterministic \
            and num_splits is None and pack_gqa is None
        args = _as_op_call(q, k, v, causal, window, softcap, alibi, mask, dropout_p, scale) if plain else None
        if args is not None:
            return torch.ops.tilefuse.attention_fwd(*args)[0]
        return _attention_eager(q, k, v, causal=causal, window=window, softcap=softcap, alibi=alibi, mask=mask,
                                score_mod=score_mod, dropout_p=dropout_p, scale=scale, deterministic=deterministic,
                                score_mod_grad=score_mod_grad, dropout_seed=dropout_seed, num_splits=num_splits,
                                pack_gqa=pack_gqa)
    opts = {k_: v_ for k_, v_ in (("num_splits", num_splits), ("pack_gqa", pack_gqa)) if v_ is not None}
    out, _, _ = _run(q, k, v, causal, window, softcap, alibi, mask, score_mod, score_mod_grad, dropout_p,
                     dropout_seed, scale, deterministic, opts)
    return out


_attention_eager = eager_under_compile(attention).eager


@eager_under_compile
def attention_with_lse(q, k, v, **kwargs):
    """(out, lse): ``lse`` (B, H, Sq) float32, the natural-log logsumexp of each row's scores (-inf where
    nothing is visible), not differentiable."""
    opts = {k_: kwargs.pop(k_) for k_ in ("num_splits", "pack_gqa") if kwargs.get(k_) is not None}
    kwargs.pop("num_splits", None), kwargs.pop("pack_gqa", None)
    defaults = dict(causal=False, window=None, softcap=None, alibi=None, mask=None, score_mod=None,
                    score_mod_grad=None, dropout_p=0.0, dropout_seed=None, scale=None, deterministic=False)
    unknown = set(kwargs) - set(defaults)
    if unknown:
        raise TypeError(f"attention_with_lse got unexpected arguments {sorted(unknown)}")
    a = {**defaults, **kwargs}
    out, lse2, params = _run(q, k, v, a["causal"], a["window"], a["softcap"], a["alibi"], a["mask"], a["score_mod"],
                             a["score_mod_grad"], a["dropout_p"], a["dropout_seed"], a["scale"], a["deterministic"],
                             opts)
    return out, lse_natural(lse2, params.B, params.H)


def supports(q_shape, k_shape, dtype, *, mask_shape=None) -> tuple[bool, str]:
    """Whether the family runs a call of these shapes/dtype, and if not why (for the compiler's matcher)."""
    if dtype not in DTYPES:
        return False, f"dtype {dtype} (accepted: float16, bfloat16, float32)"
    if len(q_shape) != 4 or len(k_shape) != 4:
        return False, "q and k must be rank 4"
    B, H, Sq, D = q_shape
    if k_shape[0] != B or k_shape[3] != D:
        return False, "batch or head dim differ between q and k"
    if not 1 <= D <= MAX_HEAD_DIM:
        return False, f"head dim {D} above {MAX_HEAD_DIM}"
    if k_shape[1] < 1 or H % k_shape[1]:
        return False, "kv heads do not divide the query heads"
    if mask_shape is not None:
        Sk = k_shape[2]
        if len(mask_shape) > 4 or any(m not in (1, t) for m, t in zip(tuple(mask_shape)[::-1], (Sk, Sq, H, B))):
            return False, f"mask shape {tuple(mask_shape)} does not broadcast to {(B, H, Sq, Sk)}"
    return True, ""


# ----------------------------------------------------------------------------- packed variable-length sequences
class AttentionVarlenFunction(torch.autograd.Function):
    """Autograd over the VARLEN kernels. Saves q, k, v, the output, its (H, total_q) log2 logsumexp and the
    cumulative lengths."""

    @staticmethod
    def forward(ctx, q, k, v, cu_q, cu_k, alibi, vp: VarlenParams):
        out, lse2 = forward_varlen(q, k, v, cu_q, cu_k, vp, alibi)
        ctx.save_for_backward(q, k, v, out, lse2, cu_q, cu_k, alibi)
        ctx.vp = vp
        ctx.mark_non_differentiable(lse2)
        return out, lse2

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse2, cu_q, cu_k, alibi = ctx.saved_tensors
        dq, dk, dv = backward_varlen(dout, q, k, v, out, lse2, cu_q, cu_k, ctx.vp, alibi)
        return dq, dk, dv, None, None, None, None


def _run_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, options):
    needs_grad = torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in (q, k, v))
    vp, alibi_view, cu_q, cu_k = check_varlen_arguments(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                                        max_seqlen_k, needs_grad=needs_grad, **options)
    return AttentionVarlenFunction.apply(q, k, v, cu_q, cu_k, alibi_view, vp)


@eager_under_compile
def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False, window=None,
                     softcap=None, alibi=None, score_mod=None, dropout_p=0.0, scale=None, deterministic=False,
                     score_mod_grad=None, dropout_seed=None, check_seqlens=True):
    """Flash attention over packed variable-length sequences (FlashAttention's ``varlen`` form):
    ``q`` (total_q, H, D), ``k``/``v`` (total_k, H_kv, D), int32 ``cu_seqlens_q``/``cu_seqlens_k`` (batch + 1
    cumulative lengths), ``max_seqlen_q``/``max_seqlen_k`` the longest sequences; (total_q, H, D) out, laid out
    like ``q``. Each sequence attends within itself, with the options of :func:`attention` applied per sequence
    (``alibi`` slopes (H,) or (batch, H); no ``mask``). ``check_seqlens``: see :mod:`.varlen` (one host read)."""
    out, _ = _run_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dict(
        causal=causal, window=window, softcap=softcap, alibi=alibi, score_mod=score_mod, score_mod_grad=score_mod_grad,
        dropout_p=dropout_p, dropout_seed=dropout_seed, scale=scale, deterministic=deterministic,
        check_seqlens=check_seqlens))
    return out


@eager_under_compile
def attention_varlen_with_lse(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, **kwargs):
    """(out, lse): ``lse`` (H, total_q) float32, the natural-log logsumexp of each row's scores (-inf where
    nothing is visible), not differentiable. Keywords as :func:`attention_varlen`."""
    defaults = dict(causal=False, window=None, softcap=None, alibi=None, score_mod=None, score_mod_grad=None,
                    dropout_p=0.0, dropout_seed=None, scale=None, deterministic=False, check_seqlens=True)
    unknown = set(kwargs) - set(defaults)
    if unknown:
        raise TypeError(f"attention_varlen_with_lse got unexpected arguments {sorted(unknown)}")
    out, lse2 = _run_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, {**defaults, **kwargs})
    return out, lse2 * LN2
