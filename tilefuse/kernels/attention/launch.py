"""Allocate and launch: the forward (one pass, or split over the KV length and combined), the backward.

Everything here takes already-checked arguments (:mod:`.checks`). Outputs are allocated in the memory
layout of their input (``empty_like``): a ``q`` that is a (B, S, H, D) buffer viewed as (B, H, S, D) gets an
output laid out the same way, so a model's ``out.transpose(1, 2).reshape(B, S, H * D)`` is free.

Each launch goes through a kept launch site (:func:`site`): the first call of a site compiles through Triton's
JIT, later calls go to the kept kernel's C launcher (:class:`tilefuse.kernels.launcher.SiteLauncher`).
"""
from __future__ import annotations

import dataclasses

import torch

from ... import device
from ..launcher import SiteLauncher, empty, empty_like, kept_site
from . import configs, tuning
from .checks import Params
from .kernels import (LN2, attn_bwd_dkdv_kernel, attn_bwd_dq_kernel, attn_bwd_preprocess_kernel,
                      attn_combine_kernel, attn_fwd_kernel, dropout_keep_kernel)

# Decode form: at most this many query rows (after packing the GQA group) use the split-KV kernel.
DECODE_MAX_ROWS = 64
# Split the KV length until about this many programs per SM/CU are in flight, keeping at least
# MIN_TILES_PER_SPLIT tiles a split (a split's fixed cost is the combine's read of its partial rows: one row of
# head_dim floats). One tile: at GPT-2's decode shape (12 heads, 520 keys, five 128-key tiles) four tiles a split
# gave one split, 12 programs on an H100's 132 SMs and 17 us a call, against ~7 for cuDNN's (decision 041).
DECODE_PROGRAMS_PER_SM = 2
MIN_TILES_PER_SPLIT = 1
COMBINE_ROWS = 16
# The combine's split count as a constant (its loops unrolled) up to COMBINE_UNROLL_MAX splits and this many
# partial elements a row (splits x BLOCK_D), else a loop over a run-time count. In sm_90 SASS the loop converts
# each split's weights through shared memory (two barriers a split) and issues a split's loads only after the
# one before is used; unrolled, every load is issued first and the barriers are gone
# (docs/decisions/051-decode-combine-unrolled.md).
# Registers, sm_90: 198 at 16 splits of D=128, 168 at 8 of D=256, no spills (16 of D=256 spill); the code grows
# with the count (768 SASS instructions at 16 of D=64, 336 for the loop).
COMBINE_UNROLL_ELEMS = 2048
COMBINE_UNROLL_MAX = 16
# Plans kept for calls without overrides (plan_forward): one a distinct call shape, then start again. A model
# has a handful (a decode loop over a growing cache one a key length); the bound only caps a long-running
# process that sees ever new shapes.
PLAN_CACHE_MAX = 256
# Launch sites kept (site): a site holds one compiled kernel for one grid and its constexprs. GPT-2's decode
# on an H100 uses one forward site a split count (1 to 22: 2 programs a SM over 12 heads) and one combine
# site, a prefill one a row-block count: 256 is ~10x a decode loop's sites, and bounds a process that sees ever
# new grids. A clear costs each site one JIT launch again (~40 us), not a compile (Triton keeps its kernels).
SITE_CACHE_MAX = 256
# The forward's and backward's trailing varlen parameters, switched off (``varlen`` passes its own): given with
# the constexprs, so that the constexprs are a kernel's trailing parameters, as a SiteLauncher binds them. None
# is a constexpr to Triton, so the C launcher skips these as it skips the constexprs.
NO_VARLEN = {"cu_q_ptr": None, "cu_k_ptr": None, "VARLEN": 0}


@dataclasses.dataclass(frozen=True)
class Plan:
    """How a forward runs: config, PACK_GQA, number of KV splits."""
    config: configs.AttentionConfig
    pack_gqa: bool
    num_splits: int


_part_of: list = [None, None]  # [device, its facts]: Device.capability parses the arch name (~0.5 us)


def _part():
    dev = device.current()
    if _part_of[0] is not dev:
        _part_of[:] = dev, (dev.interpreter, dev.vendor, dev.capability, dev.multiprocessors)
    return _part_of[1]


def _cdiv(a: int, b: int) -> int:
    # triton.cdiv and triton.next_power_of_2 are ConstexprFunctions in Triton 3.6: ~2 us a call on the host,
    # ~10 of them a forward call
    return -(a // -b)


def block_d(D: int) -> int:
    return max(16, 1 << (D - 1).bit_length())


def kernel_space(kernel: str, D: int, dtype: torch.dtype) -> tuple[configs.AttentionConfig, ...]:
    interp, vendor, cap, _ = _part()
    return configs.space(kernel, block_d(D), interpreter=interp, vendor=vendor if vendor != "cpu" else "nvidia",
                         capability=cap, fp32=dtype == torch.float32)


def kernel_config(kernel: str, D: int, dtype: torch.dtype) -> configs.AttentionConfig:
    return kernel_space(kernel, D, dtype)[0]


_plans: dict[tuple, Plan] = {}


def plan_forward(p: Params, dtype: torch.dtype, *, num_splits: int | None = None, pack_gqa: bool | None = None,
                 config: configs.AttentionConfig | None = None) -> Plan:
    """Prefill: one program a (row block, batch, head). Decode (few rows, no dropout): the GQA group's rows
    packed into one program per KV head, the KV length split over enough programs to fill the part.

    Without overrides the plan is kept under (Params, dtype, the part's facts): a decode step's 12 calls of one
    shape compute it once (~15 us of host time each otherwise). Not with dropout: its seed, drawn every call, is
    a field of Params, so no key would come again."""
    if num_splits is not None or pack_gqa is not None or config is not None or p.dropout_p > 0:
        return _plan(p, dtype, num_splits, pack_gqa, config)
    key = (p, dtype, _part())
    plan = _plans.get(key)
    if plan is None:
        plan = _plan(p, dtype, None, None, None)
        if len(_plans) >= PLAN_CACHE_MAX:
            _plans.clear()
        _plans[key] = plan
    return plan


def _plan(p: Params, dtype: torch.dtype, num_splits, pack_gqa, config) -> Plan:
    rows_packed = p.Sq * p.group
    decode = p.dropout_p == 0.0 and rows_packed <= DECODE_MAX_ROWS
    if pack_gqa is None:
        pack_gqa = decode and p.group > 1
    if pack_gqa and p.dropout_p > 0:
        raise ValueError("pack_gqa=True with dropout: the dropout streams are per (batch, head); use pack_gqa=False")
    if config is None:
        config = kernel_config("decode" if decode else "fwd", p.D, dtype)
    rows = rows_packed if pack_gqa else p.Sq
    tiles = _cdiv(p.Sk, config.block_n)
    if num_splits is None:
        num_splits = 1
        if decode:
            _, _, _, sms = _part()
            programs = _cdiv(rows, config.block_m) * p.B * (p.H_kv if pack_gqa else p.H)
            want = _cdiv(DECODE_PROGRAMS_PER_SM * sms, programs)
            num_splits = max(1, min(want, tiles // MIN_TILES_PER_SPLIT, _unrolled_combine_splits(p.D)))
    if num_splits < 1:
        raise ValueError(f"num_splits={num_splits}: accepted values are ints >= 1")
    return Plan(config, bool(pack_gqa), int(num_splits))


def _unrolled_combine_splits(D: int) -> int:
    """The most splits whose combine is unrolled (COMBINE_UNROLL_MAX, COMBINE_UNROLL_ELEMS): a plan splits no further.
    On an H100 at a Llama-3-8B-like decode (32 heads on 8 KV heads, 4096 keys, d=128) 33 splits and their looped
    combine took 25.8 us a call cold, 16 splits 16.5 (decision 052)."""
    return max(1, min(COMBINE_UNROLL_MAX, COMBINE_UNROLL_ELEMS // block_d(D)))


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


# ------------------------------------------------------------------------------------------ launch sites
_sites: dict[tuple, SiteLauncher] = {}


def site_key(kernel, grid: tuple, tensors: tuple, constexprs: dict, options: dict, real: tuple = ()) -> tuple:
    """What the kernel a site keeps was compiled for, beyond what the site checks at each call itself (each
    tensor's 16-byte alignment, each integer's specialisation class): the kernel, the grid, every constexpr and
    launch option (names and values), the dtype of every tensor argument, which optional tensors are real
    (``real``: the mask and the ALiBi slopes, where ``q`` stands in for an absent one) and the device index."""
    return (kernel, grid, tuple(constexprs.items()), tuple(options.items()), tuple(t.dtype for t in tensors),
            real, tensors[0].get_device())


def site(kernel, grid: tuple, tensors: tuple, constexprs: dict, options: dict, real: tuple = ()) -> SiteLauncher:
    """The kept launch site of a launch (:func:`site_key`); call it with the kernel's runtime arguments, in
    order, ``tensors`` first. A site takes the JIT path itself where it must (interpreter, profiler hooks, an
    argument of another specialisation)."""
    return kept_site(_sites, SITE_CACHE_MAX, site_key(kernel, grid, tensors, constexprs, options, real), kernel, grid,
                     options, constexprs)


def _options(cfg: configs.AttentionConfig, p: Params, vendor: str) -> dict:
    return dict(**cfg.launch_options(vendor), **dict(p.launch_options))


# ------------------------------------------------------------------------------------------------ forward
_tuning_inputs: dict[tuple, tuple] = {}


def _call_plan(q, k, v, p: Params, mask, alibi) -> Plan:
    """The plan of a call that gives none: :func:`plan_forward`'s, with a prefill's config tuned on a GPU
    (:func:`tuning.choose`, which remembers its decisions). The tuning key and space are kept a (Params, dtype,
    device): building them cost ~15 us of host time a call, and a decode of one split (GPT-2's 520-key cache on
    an H100) takes this path too."""
    plan = plan_forward(p, q.dtype)
    if plan.num_splits == 1 and not plan.pack_gqa and tuning.tuning_enabled():
        memo = (p, q.dtype, device.current())
        found = _tuning_inputs.get(memo)
        if found is None:
            found = (tuning.key_of("fwd", p, q.dtype, block_d(p.D)), kernel_space("fwd", p.D, q.dtype))
            if p.dropout_p == 0:  # (a dropout seed, drawn every call, is a field of Params: no key comes again)
                if len(_tuning_inputs) >= PLAN_CACHE_MAX:
                    _tuning_inputs.clear()
                _tuning_inputs[memo] = found
        cfg = tuning.choose(found[0], found[1], lambda c: forward(q, k, v, p, mask, alibi, Plan(c, False, 1)))
        plan = Plan(cfg, False, 1)
    return plan


_forward_launches: dict[tuple, tuple] = {}


def _forward_launch(q, k, v, p: Params, mask, alibi, plan: Plan) -> tuple:
    """(forward site, combine site or None, splits, tiles a split) of a forward call: kept by what they depend on
    (the call's Params and plan, every tensor's dtype, the device), as building the sites' keys cost ~20 us of
    host time a call (their constexpr and option dicts). A call with dropout draws a new seed, a field of Params,
    so its launch is built each time and not kept."""
    memo = (p, plan, q.dtype, k.dtype, v.dtype, None if mask is None else mask.dtype,
            None if alibi is None else alibi.dtype, q.get_device(), device.current())
    found = _forward_launches.get(memo)
    if found is not None:
        return found
    cfg = plan.config
    rows = p.Sq * p.group if plan.pack_gqa else p.Sq
    grid_bh = p.B * (p.H_kv if plan.pack_gqa else p.H)
    visible_tiles = max(1, _cdiv(p.Sk, cfg.block_n))
    tiles_per_split = _cdiv(visible_tiles, plan.num_splits)
    splits = _cdiv(visible_tiles, tiles_per_split)
    m, _, a, _ = _aux(q, mask, alibi)
    f32 = torch.empty((), dtype=torch.float32, device="meta")  # (the fp32 buffers' dtype, for the sites' keys)
    part, lse = (f32 if splits > 1 else q), f32
    tensors = (q, k, v, part, lse, m, a)
    constexprs = dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, PACK_GQA=plan.pack_gqa,
                      **_common_constexprs(p, q.dtype), **NO_VARLEN)
    fwd = site(attn_fwd_kernel, (_cdiv(rows, cfg.block_m), grid_bh, splits), tensors, constexprs,
               _options(cfg, p, device.current().vendor), (mask is not None, alibi is not None))
    combine = None
    if splits > 1:
        unrolled = splits <= COMBINE_UNROLL_MAX and splits * block_d(p.D) <= COMBINE_UNROLL_ELEMS
        combine = site(attn_combine_kernel, (_cdiv(p.B * p.H * p.Sq, COMBINE_ROWS),), (part, part, q, lse),
                       dict(HEAD_DIM=p.D, BLOCK_D=block_d(p.D), BLOCK_R=COMBINE_ROWS,
                            SPLITS=splits if unrolled else 0), {"num_warps": 4})
    found = (fwd, combine, splits, tiles_per_split)
    if p.dropout_p == 0:
        if len(_forward_launches) >= PLAN_CACHE_MAX:
            _forward_launches.clear()
        _forward_launches[memo] = found
    return found


def forward(q, k, v, p: Params, mask=None, alibi=None, plan: Plan | None = None):
    """(out, lse2): ``out`` like ``q``; ``lse2`` (B*H, Sq) fp32 in log2 units (-inf for rows with nothing
    visible). Without a ``plan``, the config of a prefill is tuned on a GPU (:mod:`.tuning`)."""
    if plan is None:
        plan = _call_plan(q, k, v, p, mask, alibi)
    out = empty_like(q)
    lse2 = empty((p.B * p.H, p.Sq), torch.float32, q)
    if p.Sq == 0:
        return out, lse2
    fwd, combine, splits, tiles_per_split = _forward_launch(q, k, v, p, mask, alibi, plan)
    m, ms, a, as_ = _aux(q, mask, alibi)
    if splits > 1:
        o_buf = empty((splits, p.B, p.H, p.Sq, p.D), torch.float32, q)
        l_buf = empty((splits, p.B * p.H, p.Sq), torch.float32, q)
        o_strides = o_buf.stride()[1:] + (o_buf.stride(0),)
        l_stride = l_buf.stride(0)
    else:
        o_buf, l_buf = out, lse2
        o_strides = out.stride() + (0,)
        l_stride = 0
    fwd(q, k, v, o_buf, l_buf, m, a, *q.stride(), *k.stride(), *v.stride(), *o_strides, l_stride, *ms, *as_,
        p.H, p.Sq, p.Sk, tiles_per_split, *_score_args(p))
    if splits > 1:
        combine(o_buf, l_buf, out, lse2, p.B * p.H, p.H, p.Sq, splits, *out.stride())
    return out, lse2


# The backward's choices (the dQ form, the dK/dV and dQ configs) of a call that gives none, kept by what they were
# made from: finding them again builds up to three tuning keys, ~15 us each on a CPU host (tuning.choose remembers
# its decisions, so the kept choice is the one it would give). Not for a call with dropout (a new seed each call).
_backward_choices: dict[tuple, tuple] = {}


def backward(do, q, k, v, out, lse2, p: Params, mask=None, alibi=None, *, dkdv_config=None, dq_config=None,
             atomic_dq: bool | None = None):
    """(dq, dk, dv), each like its input. dQ is computed either by its own pass (no atomics: bitwise
    reproducible) or accumulated with fp32 atomics inside the dK/dV pass. ``p.deterministic`` forces the
    first; otherwise ``atomic_dq`` picks, and None lets :func:`tuning.choose_form` time both on a GPU
    (decision 030: on an H100 the separate pass was 1.2-1.35x faster at 4k-16k tokens, so it is the
    untuned default too)."""
    memo = kept = None
    if atomic_dq is None and dkdv_config is None and dq_config is None and p.dropout_p == 0:
        memo = (p, q.dtype, k.dtype, v.dtype, do.dtype, None if mask is None else mask.dtype,
                None if alibi is None else alibi.dtype, q.get_device(), device.current(), tuning.tuning_enabled())
        kept = _backward_choices.get(memo)
        if kept is not None:
            atomic_dq, dkdv_config, dq_config = kept
    if atomic_dq is None:
        atomic_dq = False if p.deterministic else _tuned_form(do, q, k, v, out, lse2, p, mask, alibi)
    elif atomic_dq and p.deterministic:
        raise ValueError("atomic_dq=True contradicts deterministic=True (atomics make the sum order vary)")
    dq = empty_like(q)
    dk = empty_like(k)
    dv = empty_like(v)
    if p.Sq == 0 or p.Sk == 0:
        return dq.zero_(), dk.zero_(), dv.zero_()
    m, ms, a, as_ = _aux(q, mask, alibi)
    bd = block_d(p.D)
    vendor = device.current().vendor
    real = (mask is not None, alibi is not None)
    delta = empty((p.B * p.H, p.Sq), torch.float32, q)
    pre_rows = 64
    pre = (out, do, delta)
    site(attn_bwd_preprocess_kernel, (_cdiv(p.Sq, pre_rows), p.B * p.H), pre,
         dict(HEAD_DIM=p.D, BLOCK_D=bd, BLOCK_M=pre_rows), {"num_warps": 4})(
        *pre, p.H, p.Sq, *out.stride(), *do.stride())
    atomic = atomic_dq
    if dkdv_config is None or (not atomic and dq_config is None):
        dkdv_config, dq_config = _tuned_backward_configs(do, q, k, v, out, lse2, p, mask, alibi, dkdv_config,
                                                         dq_config, atomic)
    if memo is not None and kept is None:
        if len(_backward_choices) >= PLAN_CACHE_MAX:
            _backward_choices.clear()
        _backward_choices[memo] = (atomic, dkdv_config, dq_config)
    common = _common_constexprs(p, q.dtype)
    kv_cfg = dkdv_config
    dq_acc = torch.zeros((p.B, p.H, p.Sq, p.D), dtype=torch.float32, device=q.device) if atomic else dq
    tensors = (q, k, v, do, dk, dv, dq_acc, lse2, delta, m, a)
    constexprs = dict(BLOCK_M=kv_cfg.block_m, BLOCK_N=kv_cfg.block_n, SCORE_MOD_GRAD=p.score_mod_grad,
                      ATOMIC_DQ=atomic, **common, **NO_VARLEN)
    site(attn_bwd_dkdv_kernel, (_cdiv(p.Sk, kv_cfg.block_n), p.B * p.H_kv), tensors, constexprs,
         _options(kv_cfg, p, vendor), real)(
        *tensors, *q.stride(), *k.stride(), *v.stride(), *do.stride(), *dk.stride(), *dv.stride(),
        *dq_acc.stride(), *ms, *as_, p.H, p.Sq, p.Sk, *_score_args(p))
    if atomic:
        dq.copy_(dq_acc)
    else:
        q_cfg = dq_config or kernel_config("bwd_dq", p.D, q.dtype)
        tensors = (q, k, v, do, dq, lse2, delta, m, a)
        constexprs = dict(BLOCK_M=q_cfg.block_m, BLOCK_N=q_cfg.block_n, SCORE_MOD_GRAD=p.score_mod_grad,
                          **common, **NO_VARLEN)
        site(attn_bwd_dq_kernel, (_cdiv(p.Sq, q_cfg.block_m), p.B * p.H), tensors, constexprs,
             _options(q_cfg, p, vendor), real)(
            *tensors, *q.stride(), *k.stride(), *v.stride(), *do.stride(), *dq.stride(), *ms, *as_,
            p.H, p.Sq, p.Sk, *_score_args(p))
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
    dropout_keep_kernel[(_cdiv(Sq * Sk, block), B * H)](out, H, Sq, Sk, float(dropout_p), int(seed), BLOCK=block)
    return out.bool()
