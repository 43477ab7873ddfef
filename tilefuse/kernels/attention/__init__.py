"""The Triton flash-attention family: one kernel source for the library API, the compiler and every vendor.

    out = tilefuse.attention(q, k, v, causal=True)          # q (B, H, Sq, D), k/v (B, H_kv, Sk, D)

Semantics are ``F.scaled_dot_product_attention``'s, with these choices (each tested against a float64
reference in tests/test_attention.py):

- **Layout**: q/k/v are read through their strides: a model's (B, S, H, D) projection viewed with
  ``.transpose(1, 2)`` is read with no copy, and the output is laid out like ``q``.
- **causal**: ``True`` / ``"top_left"`` is SDPA's ``is_causal`` (query ``i`` sees keys ``j <= i``, also when
  Sq != Sk); ``"bottom_right"`` is FlashAttention's (``j <= i + Sk - Sq``: the queries are the last Sq
  positions of the keys, what a KV cache needs).
- **window=(left, right)**: query ``i`` sees keys ``i + d - left .. i + d + right`` (``d`` the diagonal of
  the causal alignment, 0 by default); ``None`` or ``-1`` on a side is unbounded; with causal the right side
  is 0. Tiles with no visible key are skipped.
- **Score order**: ``s = q k^T * scale``, then ``softcap * tanh(s / softcap)``, then the ALiBi bias
  ``-slope[b, h] * |i + d - j|`` (slopes of shape (H,) or (B, H)), then a float ``mask`` (added), then
  ``score_mod(s, b, h, q_idx, k_idx)``, then a bool ``mask`` (True = attend) and causal/window: the mod never
  sees the -inf of a bool mask or the band (it sees whatever an additive mask holds).
- **score_mod**: a ``@triton.jit`` elementwise function of the score tile (fp32) and index tensors that
  broadcast against it (``b`` a scalar; ``h`` a scalar, or a column in the decode form; ``q_idx``/``k_idx``
  a column and a row, or transposed in the backward). It runs on padded positions too (indices past the
  sequence, results discarded): mask any load in it. The backward needs ``score_mod_grad`` with the same
  arguments returning ``d score_mod / d score`` (1.0 for a bias); without it, inputs that require grad are
  refused up front. The compiler fills this seam with generated code.
- **Fully masked rows** (no visible key) give 0 output and 0 gradients, where
  ``F.scaled_dot_product_attention`` gives NaN with a boolean mask (and eager softmax with a finite
  ``finfo.min`` mask averages the values uniformly). Their logsumexp is -inf.
- **dropout_p**: a counter-based Philox mask (``tl.rand``), regenerated in the backward from the seed;
  ``dropout_seed`` pins it (else drawn from torch's generator, so ``torch.manual_seed`` reproduces a run).
  :func:`dropout_mask` returns the mask a seed gives.
- **GQA/MQA**: ``k``/``v`` with H_kv heads dividing H; query head ``h`` reads KV head ``h // (H // H_kv)``;
  dK/dV are summed over the group inside one program (no atomics).
- **deterministic**: the backward computes dQ in its own pass instead of fp32 atomics: bitwise equal runs.
- Gradients flow to q, k and v; ``mask`` and ``alibi`` get none (a mask that requires grad is refused).

dtypes float16 / bfloat16 / float32 (fp32 accumulation; fp32 matmuls are tf32 when
``torch.backends.cuda.matmul.allow_tf32`` is set), head dims 1..256 (padded to a power of two, masked).
Few query rows (decode) run a split-KV form: the GQA group's rows packed into one program a KV head, the KV
length split across programs, a second kernel combining the partial results by their logsumexp.
"""
from __future__ import annotations

import torch

from . import configs, targets  # noqa: F401  (targets: registers the kernels with tilefuse.targets)
from .checks import DTYPES, MAX_HEAD_DIM, Params, check_arguments
from .launch import Plan, backward, dropout_mask, forward, lse_natural, plan_forward

__all__ = ["attention", "attention_with_lse", "AttentionFunction", "supports", "dropout_mask",
           "register_transformers"]


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


def attention(q, k, v, *, causal=False, window=None, softcap=None, alibi=None, mask=None, score_mod=None,
              dropout_p=0.0, scale=None, deterministic=False, score_mod_grad=None, dropout_seed=None,
              num_splits=None, pack_gqa=None):
    """Flash attention: softmax(mods(q k^T * scale)) @ v, (B, H, Sq, D) out. See the package docstring.

    ``num_splits`` / ``pack_gqa`` override the forward's plan (KV splits of the decode form; GQA rows packed
    a KV head); None lets :func:`plan_forward` decide."""
    opts = {k_: v_ for k_, v_ in (("num_splits", num_splits), ("pack_gqa", pack_gqa)) if v_ is not None}
    out, _, _ = _run(q, k, v, causal, window, softcap, alibi, mask, score_mod, score_mod_grad, dropout_p,
                     dropout_seed, scale, deterministic, opts)
    return out


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


def register_transformers(name: str = "tilefuse") -> str:
    """Register ``attn_implementation=name`` with Hugging Face transformers (see :mod:`.transformers_adapter`)."""
    from .transformers_adapter import register

    return register(name)
