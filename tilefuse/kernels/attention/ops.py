"""The family as two PyTorch custom ops, ``tilefuse::attention_fwd`` and ``tilefuse::attention_bwd``: what the
compiler puts in place of the attention it finds (tilefuse/compiler/patterns/attention.py).

An op, not :class:`AttentionFunction`: AOTAutograd traces through an autograd.Function (and a Triton launch
cannot run on fake tensors), while a custom op stays one opaque node with a fake (shape) function. Its
registered autograd formula calls ``attention_bwd``, so the backward graph AOTAutograd derives holds the
family's backward kernels as one node too, and the lowering calls both as library kernels.

Arguments are plain numbers (a custom op's schema takes no Python objects): ``causal`` 0/1 (SDPA's top-left
convention), ``window_left``/``window_right`` -1 for unbounded, ``softcap`` 0.0 for none, ``mask`` a bool
(True = attend) or float (added) tensor broadcasting to (B, H, Sq, Sk), ``alibi`` slopes (H,) or (B, H) that
need no gradient. The forward returns
``(out, lse2, seed)``: ``lse2`` the (B*H, Sq) float32 log2 logsumexp the backward recomputes from, ``seed``
a 0-d int64 CPU tensor holding the dropout seed it drew (0 without dropout), which the backward reuses to
regenerate the same dropout mask.
"""
from __future__ import annotations

from typing import Optional

import torch

from .checks import Params, alibi_view, check_arguments, mask_view
from .launch import backward, forward

__all__ = ["attention_fwd", "attention_bwd"]


_checked: dict[tuple, Params] = {}
CHECKED_CACHE_MAX = 256


def _meta(t: Optional[torch.Tensor]):
    return None if t is None else (t.shape, t.stride(), t.dtype, t.device, t.requires_grad)


def _params(q, k, v, mask, alibi, scale, softcap, causal, window_left, window_right, dropout_p, seed):
    """(Params, the mask's view, the slopes' view) of a call, its arguments checked. A call without dropout that
    passed the checks is kept by everything they read (each tensor's metadata, the numbers, whether grad mode is
    on): a repeat call only makes the two views again. The checks cost ~25 us a call at GPT-2's decode shape,
    12 calls a step."""
    memo = None
    if dropout_p == 0 and not seed:
        memo = (_meta(q), _meta(k), _meta(v), _meta(mask), _meta(alibi), scale, softcap, causal, window_left,
                window_right, torch.is_grad_enabled())
        params = _checked.get(memo)
        if params is not None:
            return (params, None if mask is None else mask_view(mask, params.B, params.H, params.Sq, params.Sk),
                    None if alibi is None else alibi_view(alibi, params.B, params.H))
    window = None if window_left < 0 and window_right < 0 else (window_left, window_right)
    found = check_arguments(q, k, v, causal=bool(causal), window=window, softcap=softcap if softcap > 0 else None,
                            alibi=alibi, mask=mask, score_mod=None, score_mod_grad=None, dropout_p=dropout_p,
                            dropout_seed=seed, scale=scale, deterministic=False, needs_grad=False)
    if memo is not None:
        if len(_checked) >= CHECKED_CACHE_MAX:
            _checked.clear()
        _checked[memo] = found[0]
    return found


def _attention_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor],
                   alibi: Optional[torch.Tensor], scale: float, softcap: float, causal: int, window_left: int,
                   window_right: int, dropout_p: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    seed = int(torch.randint(0, 2 ** 31 - 1, (1,)).item()) if dropout_p > 0 else 0
    params, mask_view, alibi_view = _params(q, k, v, mask, alibi, scale, softcap, causal, window_left, window_right,
                                            dropout_p, seed)
    out, lse2 = forward(q, k, v, params, mask_view, alibi_view)
    return out, lse2, torch.tensor(seed, dtype=torch.int64)


attention_fwd = torch.library.custom_op("tilefuse::attention_fwd", mutates_args=())(_attention_fwd)


@attention_fwd.register_fake
def _(q, k, v, mask, alibi, scale, softcap, causal, window_left, window_right, dropout_p):
    B, H, Sq, _ = q.shape
    out = torch.empty_like(q)  # the kernel's output is laid out like q (launch.forward)
    lse2 = q.new_empty((B * H, Sq), dtype=torch.float32)
    return out, lse2, torch.empty((), dtype=torch.int64, device="cpu")


def _attention_bwd(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                   lse2: torch.Tensor, seed: torch.Tensor, mask: Optional[torch.Tensor], alibi: Optional[torch.Tensor],
                   scale: float, softcap: float,
                   causal: int, window_left: int, window_right: int, dropout_p: float,
                   mask_grad: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    params, mask_view, alibi_view = _params(q, k, v, mask, alibi, scale, softcap, causal, window_left, window_right,
                                            dropout_p, int(seed.item()))
    dq, dk, dv = backward(dout, q, k, v, out, lse2, params, mask_view, alibi_view)
    dmask = _mask_gradient(dout, q, k, v, out, lse2, mask, alibi_view, params) if mask_grad else q.new_empty(0)
    return dq, dk, dv, dmask


attention_bwd = torch.library.custom_op("tilefuse::attention_bwd", mutates_args=())(_attention_bwd)


@attention_bwd.register_fake
def _(dout, q, k, v, out, lse2, seed, mask, alibi, scale, softcap, causal, window_left, window_right, dropout_p,
      mask_grad):
    dmask = torch.empty_like(mask) if mask_grad else q.new_empty(0)
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), dmask


def _mask_gradient(dout, q, k, v, out, lse2, mask, alibi, p):
    """d loss / d (additive mask): the score gradient dS = P * (dP - rowsum(dO * O)), summed over the mask's
    broadcast dims. A learned bias (T5's relative position bias) needs it; the flash backward never forms dS,
    so it is computed here in float32 from the saved logsumexp, with (B, H, Sq, Sk) memory as eager uses."""
    from .kernels import LN2
    from .launch import dropout_mask

    f32 = torch.float32
    kk = k.to(f32).repeat_interleave(p.group, 1)
    vv = v.to(f32).repeat_interleave(p.group, 1)
    s = q.to(f32) @ kk.transpose(-1, -2) * p.scale
    if p.softcap is not None:
        s = p.softcap * torch.tanh(s / p.softcap)
    i = torch.arange(p.Sq, device=q.device).view(-1, 1)
    j = torch.arange(p.Sk, device=q.device).view(1, -1)
    if alibi is not None:
        s = s - alibi.view(p.B, p.H, 1, 1) * (i + p.diag - j).abs()
    s = s + mask.to(f32)
    visible = torch.ones(p.Sq, p.Sk, dtype=torch.bool, device=q.device)
    if p.band_lo:
        visible &= j >= i + p.lo_off
    if p.band_hi:
        visible &= j <= i + p.hi_off
    lse = (lse2 * LN2).view(p.B, p.H, p.Sq, 1)
    prob = torch.where(visible & (lse > -torch.inf), torch.exp(s - lse), 0.0)
    dp = dout.to(f32) @ vv.transpose(-1, -2)
    if p.dropout_p > 0:
        keep = dropout_mask(p.seed, p.B, p.H, p.Sq, p.Sk, p.dropout_p, q.device)
        dp = torch.where(keep, dp / (1.0 - p.dropout_p), 0.0)
    delta = (dout.to(f32) * out.to(f32)).sum(-1, keepdim=True)
    ds = prob * (dp - delta)
    lead = ds.dim() - mask.dim()
    dims = [d for d in range(ds.dim()) if d < lead or mask.shape[d - lead] == 1]
    if dims:
        ds = ds.sum(dims, keepdim=True)
    return ds.reshape(mask.shape).to(mask.dtype)


def _setup_context(ctx, inputs, output):
    q, k, v, mask, alibi, scale, softcap, causal, window_left, window_right, dropout_p = inputs
    out, lse2, seed = output
    ctx.save_for_backward(q, k, v, out, lse2, seed, mask, alibi)
    ctx.options = (scale, softcap, causal, window_left, window_right, dropout_p)


def _backward(ctx, dout, _dlse, _dseed):
    q, k, v, out, lse2, seed, mask, alibi = ctx.saved_tensors
    mask_grad = bool(ctx.needs_input_grad[3]) and mask is not None and mask.dtype.is_floating_point
    dq, dk, dv, dmask = attention_bwd(dout, q, k, v, out, lse2, seed, mask, alibi, *ctx.options, mask_grad)
    return dq, dk, dv, dmask if mask_grad else None, None, None, None, None, None, None, None


attention_fwd.register_autograd(_backward, setup_context=_setup_context)


# Each op's computation as a plain function: the compiled graph's wrapper calls it without the op dispatcher
# (216 us less a GPT-2 decode step of 12 attention calls on an H100's host, decision 038). Graphs hold the op.
IMPLEMENTATIONS = {"tilefuse::attention_fwd": _attention_fwd, "tilefuse::attention_bwd": _attention_bwd}
