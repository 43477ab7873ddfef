"""Allocate and launch: the forward (one pass, or split over the KV length and combined), the backward.

Everything here takes already-checked arguments (:mod:`.checks`). Outputs are allocated in the memory
layout of their input (``empty_like``): a ``q`` that is a (B, S, H, D) buffer viewed as (B, H, S, D) gets an
output laid out the same way, so a model's ``out.transpose(1, 2).reshape(B, S, H * D)`` is free.
"""
from __future__ import annotations

import dataclasses

import torch
import triton

from ... import device
from . import configs, tuning
from .checks import Params
from .kernels import (LN2, attn_bwd_dkdv_kernel, attn_bwd_dq_kernel, attn_bwd_preprocess_kernel,
                      attn_combine_kernel, attn_fwd_kernel, dropout_keep_kernel)

# Decode form: at most this many query rows (after packing the GQA group) use the split-KV kernel.
DECODE_MAX_ROWS = 64
# Split the KV length until about this many programs per SM/CU are in flight, keeping at least
# MIN_TILES_PER_SPLIT tiles a split (a split's fixed cost is the combine's read of its partial rows).
DECODE_PROGRAMS_PER_SM = 2
MIN_TILES_PER_SPLIT = 4
COMBINE_ROWS = 16


@dataclasses.dataclass(frozen=True)
class Plan:
    """How a forward runs: config, PACK_GQA, number of KV splits."""
    config: configs.AttentionConfig
    pack_gqa: bool
    num_splits: int


def _part():
    dev = device.current()
    return dev.interpreter, dev.vendor, dev.capability, dev.multiprocessors


def block_d(D: int) -> int:
    return max(16, triton.next_power_of_2(D))


def kernel_space(kernel: str, D: int, dtype: torch.dtype) -> tuple[configs.AttentionConfig, ...]:
    interp, vendor, cap, _ = _part()
    return configs.space(kernel, block_d(D), interpreter=interp, vendor=vendor if vendor != "cpu" else "nvidia",
                         capability=cap, fp32=dtype == torch.float32)


def kernel_config(kernel: str, D: int, dtype: torch.dtype) -> configs.AttentionConfig:
    return kernel_space(kernel, D, dtype)[0]


def plan_forward(p: Params, dtype: torch.dtype, *, num_splits: int | None = None, pack_gqa: bool | None = None,
                 config: configs.AttentionConfig | None = None) -> Plan:
    """Prefill: one program a (row block, batch, head). Decode (few rows, no dropout): the GQA group's rows
    packed into one program per KV head, the KV length split over enough programs to fill the part."""
    rows_packed = p.Sq * p.group
    decode = p.dropout_p == 0.0 and rows_packed <= DECODE_MAX_ROWS
    if pack_gqa is None:
        pack_gqa = decode and p.group > 1
    if pack_gqa and p.dropout_p > 0:
        raise ValueError("pack_gqa=True with dropout: the dropout streams are per (batch, head); use pack_gqa=False")
    if config is None:
        config = kernel_config("decode" if decode else "fwd", p.D, dtype)
    rows = rows_packed if pack_gqa else p.Sq
    tiles = triton.cdiv(p.Sk, config.block_n)
    if num_splits is None:
        num_splits = 1
        if decode:
            _, _, _, sms = _part()
            programs = triton.cdiv(rows, config.block_m) * p.B * (p.H_kv if pack_gqa else p.H)
            want = triton.cdiv(DECODE_PROGRAMS_PER_SM * sms, programs)
            num_splits = max(1, min(want, tiles // MIN_TILES_PER_SPLIT))
    if num_splits < 1:
        raise ValueError(f"num_splits={num_splits}: accepted values are ints >= 1")
    return Plan(config, bool(pack_gqa), int(num_splits))


def _input_precision(dtype: torch.dtype) -> str:
    interp, vendor, _, _ = _part()
    if vendor == "amd":
        return "ieee"  # the AMD backend accepts ieee / bf16x3 / bf16x6 only (tf32 is refused at compile time)
    if dtype != torch.float32:
        return "tf32"  # ignored for half inputs
    if interp or not torch.backends.cuda.matmul.allow_tf32:
        return "ieee"
    return "tf32"


def _common_constexprs(p: Params, dtype: torch.dtype) -> dict:
    interp = device.current().interpreter
    return dict(HEAD_DIM=p.D, BLOCK_D=block_d(p.D), GROUP=p.group, BAND_LO=p.band_lo, BAND_HI=p.band_hi,
                SOFTCAP=p.softcap is not None,
                ALIBI=p.has_alibi, MASK_KIND=p.mask_kind, SCORE_MOD=p.score_mod, DROPOUT=p.dropout_p > 0,
                DOT_F32=interp, INPUT_PRECISION=_input_precision(dtype))


def _score_args(p: Params):
    return (p.scale, p.softcap or 1.0, p.diag, p.lo_off, p.hi_off, p.dropout_p, p.seed)


def _aux(q, mask, alibi):
    m = mask if mask is not None else q
    ms = mask.stride() if mask is not None else (0, 0, 0, 0)
    a = alibi if alibi is not None else q
    as_ = alibi.stride() if alibi is not None else (0, 0)
    return m, ms, a, as_


def forward(q, k, v, p: Params, mask=None, alibi=None, plan: Plan | None = None):
    """(out, lse2): ``out`` like ``q``; ``lse2`` (B*H, Sq) fp32 in log2 units (-inf for rows with nothing
    visible). Without a ``plan``, the config of a prefill is tuned on a GPU (:mod:`.tuning`)."""
    if plan is None:
        plan = plan_forward(p, q.dtype)
        if plan.num_splits == 1 and not plan.pack_gqa and tuning.tuning_enabled():
            cfg = tuning.choose(tuning.key_of("fwd", p, q.dtype, block_d(p.D)), kernel_space("fwd", p.D, q.dtype),
                                lambda c: forward(q, k, v, p, mask, alibi, Plan(c, False, 1)))
            plan = Plan(cfg, False, 1)
    cfg = plan.config
    out = torch.empty_like(q)
    lse2 = torch.empty((p.B * p.H, p.Sq), dtype=torch.float32, device=q.device)
    if p.Sq == 0:
        return out, lse2
    m, ms, a, as_ = _aux(q, mask, alibi)
    rows = p.Sq * p.group if plan.pack_gqa else p.Sq
    grid_bh = p.B * (p.H_kv if plan.pack_gqa else p.H)
    visible_tiles = max(1, triton.cdiv(p.Sk, cfg.block_n))
    tiles_per_split = triton.cdiv(visible_tiles, plan.num_splits)
    splits = triton.cdiv(visible_tiles, tiles_per_split)
    if splits > 1:
        o_buf = torch.empty((splits, p.B, p.H, p.Sq, p.D), dtype=torch.float32, device=q.device)
        l_buf = torch.empty((splits, p.B * p.H, p.Sq), dtype=torch.float32, device=q.device)
        o_strides = o_buf.stride()[1:] + (o_buf.stride(0),)
        l_stride = l_buf.stride(0)
    else:
        o_buf, l_buf = out, lse2
        o_strides = out.stride() + (0,)
        l_stride = 0
    grid = (triton.cdiv(rows, cfg.block_m), grid_bh, splits)
    attn_fwd_kernel[grid](
        q, k, v, o_buf, l_buf, m, a,
        *q.stride(), *k.stride(), *v.stride(), *o_strides, l_stride, *ms, *as_,
        p.H, p.Sq, p.Sk, tiles_per_split, *_score_args(p),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, PACK_GQA=plan.pack_gqa, **_common_constexprs(p, q.dtype),
        **cfg.launch_options(device.current().vendor), **dict(p.launch_options))
    if splits > 1:
        attn_combine_kernel[(triton.cdiv(p.B * p.H * p.Sq, COMBINE_ROWS),)](
            o_buf, l_buf, out, lse2, p.B * p.H, p.H, p.Sq, splits, *out.stride(),
            HEAD_DIM=p.D, BLOCK_D=block_d(p.D), BLOCK_R=COMBINE_ROWS, num_warps=4)
    return out, lse2


def backward(do, q, k, v, out, lse2, p: Params, mask=None, alibi=None, *, dkdv_config=None, dq_config=None,
             atomic_dq: bool | None = None):
    """(dq, dk, dv), each like its input. dQ is computed either by its own pass (no atomics: bitwise
    reproducible) or accumulated with fp32 atomics inside the dK/dV pass. ``p.deterministic`` forces the
    first; otherwise ``atomic_dq`` picks, and None lets :func:`tuning.choose_form` time both on a GPU
    (decision 030: on an H100 the separate pass was 1.2-1.35x faster at 4k-16k tokens, so it is the
    untuned default too)."""
    if atomic_dq is None:
        atomic_dq = False if p.deterministic else _tuned_form(do, q, k, v, out, lse2, p, mask, alibi)
    elif atomic_dq and p.deterministic:
        raise ValueError("atomic_dq=True contradicts deterministic=True (atomics make the sum order vary)")
    dq = torch.empty_like(q)
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    if p.Sq == 0 or p.Sk == 0:
        return dq.zero_(), dk.zero_(), dv.zero_()
    m, ms, a, as_ = _aux(q, mask, alibi)
    bd = block_d(p.D)
    vendor = device.current().vendor
    delta = torch.empty((p.B * p.H, p.Sq), dtype=torch.float32, device=q.device)
    pre_rows = 64
    attn_bwd_preprocess_kernel[(triton.cdiv(p.Sq, pre_rows), p.B * p.H)](
        out, do, delta, p.H, p.Sq, *out.stride(), *do.stride(), HEAD_DIM=p.D, BLOCK_D=bd, BLOCK_M=pre_rows,
        num_warps=4)
    atomic = atomic_dq
    if dkdv_config is None or (not atomic and dq_config is None):
        dkdv_config, dq_config = _tuned_backward_configs(do, q, k, v, out, lse2, p, mask, alibi, dkdv_config,
                                                         dq_config, atomic)
    common = _common_constexprs(p, q.dtype)
    kv_cfg = dkdv_config
    dq_acc = torch.zeros((p.B, p.H, p.Sq, p.D), dtype=torch.float32, device=q.device) if atomic else dq
    attn_bwd_dkdv_kernel[(triton.cdiv(p.Sk, kv_cfg.block_n), p.B * p.H_kv)](
        q, k, v, do, dk, dv, dq_acc, lse2, delta, m, a,
        *q.stride(), *k.stride(), *v.stride(), *do.stride(), *dk.stride(), *dv.stride(), *dq_acc.stride(),
        *ms, *as_, p.H, p.Sq, p.Sk, *_score_args(p),
        BLOCK_M=kv_cfg.block_m, BLOCK_N=kv_cfg.block_n, SCORE_MOD_GRAD=p.score_mod_grad, ATOMIC_DQ=atomic,
        **common, **kv_cfg.launch_options(vendor), **dict(p.launch_options))
    if atomic:
        dq.copy_(dq_acc)
    else:
        q_cfg = dq_config or kernel_config("bwd_dq", p.D, q.dtype)
        attn_bwd_dq_kernel[(triton.cdiv(p.Sq, q_cfg.block_m), p.B * p.H)](
            q, k, v, do, dq, lse2, delta, m, a,
            *q.stride(), *k.stride(), *v.stride(), *do.stride(), *dq.stride(), *ms, *as_,
            p.H, p.Sq, p.Sk, *_score_args(p),
            BLOCK_M=q_cfg.block_m, BLOCK_N=q_cfg.block_n, SCORE_MOD_GRAD=p.score_mod_grad,
            **common, **q_cfg.launch_options(vendor), **dict(p.launch_options))
    return dq, dk, dv


def _tuned_backward_configs(do, q, k, v, out, lse2, p, mask, alibi, dkdv_config, dq_config, atomic: bool):
    """dK/dV config (timed with the default dQ config), then dQ's (separate pass only, timed with that)."""
    bd = block_d(p.D)
    dq_space = kernel_space("bwd_dq", p.D, q.dtype)
    form = "atomic" if atomic else "two_pass"
    if dkdv_config is None:
        dkdv_config = tuning.choose(
            tuning.key_of(f"bwd_dkdv_{form}", p, q.dtype, bd), kernel_space("bwd_dkdv", p.D, q.dtype),
            lambda c: backward(do, q, k, v, out, lse2, p, mask, alibi, dkdv_config=c, dq_config=dq_space[0],
                               atomic_dq=atomic))
    if not atomic and dq_config is None:
        dq_config = tuning.choose(
            tuning.key_of("bwd_dq", p, q.dtype, bd), dq_space,
            lambda c: backward(do, q, k, v, out, lse2, p, mask, alibi, dkdv_config=dkdv_config, dq_config=c,
                               atomic_dq=False))
    return dkdv_config, dq_config


def _tuned_form(do, q, k, v, out, lse2, p, mask, alibi) -> bool:
    """True for the atomic dQ form: the faster of the two, each with its tuned configs (tuning.choose_form)."""
    return tuning.choose_form(
        tuning.key_of("bwd_form", p, q.dtype, block_d(p.D)),
        lambda atomic: backward(do, q, k, v, out, lse2, p, mask, alibi, atomic_dq=atomic))


def lse_natural(lse2: torch.Tensor, B: int, H: int) -> torch.Tensor:
    """The saved log2-unit logsumexp as torch's (B, H, Sq) natural-log logsumexp."""
    return (lse2 * LN2).view(B, H, -1)


def dropout_mask(seed: int, B: int, H: int, Sq: int, Sk: int, dropout_p: float, dev=None) -> torch.Tensor:
    """The keep mask (B, H, Sq, Sk) bool that a call with ``dropout_seed=seed`` applies (the same Philox draw)."""
    dev = dev or device.torch_device()
    out = torch.empty((B, H, Sq, Sk), dtype=torch.uint8, device=dev)
    block = 1024
    dropout_keep_kernel[(triton.cdiv(Sq * Sk, block), B * H)](out, H, Sq, Sk, float(dropout_p), int(seed),
                                                             BLOCK=block)
    return out.bool()
