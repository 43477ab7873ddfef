"""Attention with a *generated* score modification, as two custom ops: ``tilefuse::attention_mod_fwd`` and
``tilefuse::attention_mod_bwd`` (the compiler's counterpart of :mod:`.ops` for a score chain that the family's
parameters do not cover; tilefuse/compiler/patterns/score_mod.py and codegen/score_mod.py write the code).

A custom op's schema takes no Python function, so a mod is named by a string key: :func:`register` loads a
module source (a ``@triton.jit`` ``score_mod`` and ``score_mod_grad``, written to a file under the disk cache
because Triton reads a jit function's source from its module) and keeps it under ``key``, which is the digest
of that source: the same chain compiled twice gets the same key, and a graph that AOTAutograd copies, saves or
re-traces keeps a plain string. Beside the Triton functions the entry holds the same modification as torch
functions of ATen ops that the compiler traced: ``chain(s, operands) -> s'`` and its vector-Jacobian product
``operands_vjp(s, operands, ds) -> d operands`` (traced through autograd at compile time: a custom op's body
runs below autograd, so it cannot differentiate there), which the backward uses for the gradient of the
tensors the mod reads.

Tensors the mod reads (a per-head scale, a bias table) arrive packed in one float32 vector, ``operands``; the
kernel passes its pointer as the mod's sixth argument (``ALIBI == 2`` in :func:`.kernels.score_tile`: the slot
of the ALiBi slopes, which a generated mod never uses together with ALiBi). Gradients: dq, dk, dv from the
flash kernels (``score_mod_grad`` is d mod / d score); d operands from ``chain`` by autograd, with the score
gradient dS = P * (dP - rowsum(dO * O)) recomputed in float32 with (B, H, Sq, Sk) memory, as eager's
attention holds (only when an operand requires grad).

Order of the score: ``s = q k^T * scale``, ``s = score_mod(s, b, h, i, j[, operands])``, then the boolean
``mask`` (True = attend) and the band (``causal``, ``window_left``/``window_right``, -1 unbounded).
"""
from __future__ import annotations

import dataclasses
import importlib.util
import sys
import threading
from typing import Callable, Optional

import torch

from ... import diskcache
from .checks import check_arguments
from .launch import backward, forward

__all__ = ["ScoreMod", "register", "lookup", "attention_mod_fwd", "attention_mod_bwd"]


@dataclasses.dataclass(frozen=True)
class ScoreMod:
    """A registered generated mod: its two jit functions, whether they take the operand pointer, the torch chain."""
    key: str
    score_mod: object
    score_mod_grad: object
    reads_operands: bool
    chain: Callable
    operands_vjp: Callable | None
    source: str
    launch_options: tuple = ()  # compile options of the kernels that call it (Params.launch_options)


_MODS: dict[str, ScoreMod] = {}
_lock = threading.Lock()


def register(source: str, chain: Callable, operands_vjp: Callable | None, launch_options: tuple = ()) -> ScoreMod:
    """Load ``source`` (defining ``score_mod`` and ``score_mod_grad``) and keep it under its digest.
    ``launch_options``: compile options the attention kernels need with it (debug, where it has device asserts)."""
    key = "tfsm_" + diskcache.digest(source, length=16)
    with _lock:
        found = _MODS.get(key)
        if found is not None:
            return found
        path = diskcache.folder("attention", "score_mods") / f"{key}.py"
        want = source.encode()
        got = diskcache.read_bytes(path)
        if got is None or got[0] != want:
            path = diskcache.write_bytes(path, want)
        spec = importlib.util.spec_from_file_location(key, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module  # Triton finds a jit function's source through its module
        exec(compile(want, str(path), "exec"), module.__dict__)
        mod = ScoreMod(key, module.score_mod, module.score_mod_grad, operands_vjp is not None, chain, operands_vjp,
                       source, tuple(launch_options))
        _MODS[key] = mod
        return mod


def lookup(key: str) -> ScoreMod:
    mod = _MODS.get(key)
    if mod is None:
        raise ValueError(f"score mod {key!r} is not registered in this process: the compiler registers a mod when it "
                         f"matches the attention that uses it (tilefuse/compiler/patterns/score_mod.py)")
    return mod


def _params(q, k, v, mask, operands, scale, causal, window_left, window_right, dropout_p, seed, mod: ScoreMod):
    if (operands is not None) != mod.reads_operands:
        raise ValueError(f"score mod {mod.key} {'reads' if mod.reads_operands else 'reads no'} operands, got "
                         f"operands={'None' if operands is None else tuple(operands.shape)}")
    if mask is not None and mask.dtype != torch.bool:
        raise TypeError(f"mask has dtype {mask.dtype}: attention_mod takes a bool mask (True = attend) or None")
    if operands is not None and (operands.dim() != 1 or operands.dtype != torch.float32):
        raise ValueError(f"operands must be a 1-d float32 tensor, got {tuple(operands.shape)} {operands.dtype}")
    window = None if window_left < 0 and window_right < 0 else (window_left, window_right)
    params, mask_view, _ = check_arguments(
        q, k, v, causal=bool(causal), window=window, softcap=None, alibi=None, mask=mask, score_mod=mod.score_mod,
        score_mod_grad=mod.score_mod_grad, dropout_p=dropout_p, dropout_seed=seed, scale=scale, deterministic=False,
        needs_grad=False)
    params = dataclasses.replace(params, launch_options=mod.launch_options)
    aux = None
    if operands is not None:
        # the slopes' slot (ALIBI == 2 in kernels.score_tile): a (1, N) view for the launch's two alibi strides
        params = dataclasses.replace(params, has_alibi=2)
        aux = operands.view(1, -1)
    return params, mask_view, aux


def _attention_mod_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor],
                       operands: Optional[torch.Tensor], scale: float, causal: int, window_left: int,
                       window_right: int, dropout_p: float,
                       mod: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    seed = int(torch.randint(0, 2 ** 31 - 1, (1,)).item()) if dropout_p > 0 else 0
    params, mask_view, aux = _params(q, k, v, mask, operands, scale, causal, window_left, window_right, dropout_p,
                                     seed, lookup(mod))
    out, lse2 = forward(q, k, v, params, mask_view, aux)
    return out, lse2, torch.tensor(seed, dtype=torch.int64)


attention_mod_fwd = torch.library.custom_op("tilefuse::attention_mod_fwd", mutates_args=())(_attention_mod_fwd)


@attention_mod_fwd.register_fake
def _(q, k, v, mask, operands, scale, causal, window_left, window_right, dropout_p, mod):
    B, H, Sq, _ = q.shape
    return torch.empty_like(q), q.new_empty((B * H, Sq), dtype=torch.float32), \
        torch.empty((), dtype=torch.int64, device="cpu")


def _attention_mod_bwd(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                       lse2: torch.Tensor, seed: torch.Tensor, mask: Optional[torch.Tensor],
                       operands: Optional[torch.Tensor], scale: float, causal: int, window_left: int,
                       window_right: int, dropout_p: float, mod: str,
                       operands_grad: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    entry = lookup(mod)
    params, mask_view, aux = _params(q, k, v, mask, operands, scale, causal, window_left, window_right, dropout_p,
                                     int(seed.item()), entry)
    dq, dk, dv = backward(dout, q, k, v, out, lse2, params, mask_view, aux)
    if operands_grad and operands is not None:
        doperands = _operands_gradient(dout, q, k, v, out, lse2, mask, operands, params, entry)
    else:
        doperands = q.new_empty(0, dtype=torch.float32)
    return dq, dk, dv, doperands


attention_mod_bwd = torch.library.custom_op("tilefuse::attention_mod_bwd", mutates_args=())(_attention_mod_bwd)


@attention_mod_bwd.register_fake
def _(dout, q, k, v, out, lse2, seed, mask, operands, scale, causal, window_left, window_right, dropout_p, mod,
      operands_grad):
    d = torch.empty_like(operands) if operands_grad and operands is not None else q.new_empty(0, dtype=torch.float32)
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), d


def _operands_gradient(dout, q, k, v, out, lse2, mask, operands, p, entry: ScoreMod):
    """d loss / d operands: the score gradient dS (recomputed in float32 from the saved logsumexp) pulled back
    through the chain by its traced vector-Jacobian product."""
    from .kernels import LN2
    from .launch import dropout_mask

    f32 = torch.float32
    kk = k.to(f32).repeat_interleave(p.group, 1)
    vv = v.to(f32).repeat_interleave(p.group, 1)
    pre = q.to(f32) @ kk.transpose(-1, -2) * p.scale
    data = operands.to(f32)
    s = entry.chain(pre, data)
    i = torch.arange(p.Sq, device=q.device).view(-1, 1)
    j = torch.arange(p.Sk, device=q.device).view(1, -1)
    visible = torch.ones(p.Sq, p.Sk, dtype=torch.bool, device=q.device)
    if p.band_lo:
        visible = visible & (j >= i + p.lo_off)
    if p.band_hi:
        visible = visible & (j <= i + p.hi_off)
    if mask is not None:
        visible = visible & mask
    lse = (lse2 * LN2).view(p.B, p.H, p.Sq, 1)
    live = visible & (lse > -torch.inf)
    prob = torch.where(live, torch.exp(s - lse), 0.0)
    dp = dout.to(f32) @ vv.transpose(-1, -2)
    if p.dropout_p > 0:
        keep = dropout_mask(p.seed, p.B, p.H, p.Sq, p.Sk, p.dropout_p, q.device)
        dp = torch.where(keep, dp / (1.0 - p.dropout_p), 0.0)
    delta = (dout.to(f32) * out.to(f32)).sum(-1, keepdim=True)
    ds = torch.where(live, prob * (dp - delta), 0.0)
    return entry.operands_vjp(pre, data, ds).to(operands.dtype)


def _setup_context(ctx, inputs, output):
    q, k, v, mask, operands, scale, causal, window_left, window_right, dropout_p, mod = inputs
    out, lse2, seed = output
    ctx.save_for_backward(q, k, v, out, lse2, seed, mask, operands)
    ctx.options = (scale, causal, window_left, window_right, dropout_p, mod)


def _backward(ctx, dout, _dlse, _dseed):
    q, k, v, out, lse2, seed, mask, operands = ctx.saved_tensors
    operands_grad = bool(ctx.needs_input_grad[4]) and operands is not None
    dq, dk, dv, doperands = attention_mod_bwd(dout, q, k, v, out, lse2, seed, mask, operands, *ctx.options,
                                              operands_grad)
    return dq, dk, dv, None, doperands if operands_grad else None, None, None, None, None, None, None


attention_mod_fwd.register_autograd(_backward, setup_context=_setup_context)


# Each op's computation as a plain function: the compiled graph's wrapper calls it without the op dispatcher
# (216 us less a GPT-2 decode step of 12 attention calls on an H100's host, decision 038). Graphs hold the op.
IMPLEMENTATIONS = {"tilefuse::attention_mod_fwd": _attention_mod_fwd, "tilefuse::attention_mod_bwd": _attention_mod_bwd}
