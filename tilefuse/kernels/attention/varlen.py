"""Packed variable-length sequences (FlashAttention's ``varlen`` form): checks, plans and launches.

``q`` is ``(total_q, H, D)``, ``k``/``v`` ``(total_k, H_kv, D)``: the batch's sequences back to back, sequence
``b`` holding query rows ``cu_seqlens_q[b] .. cu_seqlens_q[b+1]-1`` and key rows ``cu_seqlens_k[b] ..
cu_seqlens_k[b+1]-1``. Each sequence attends only within itself; every score option of the family applies
per sequence, with query and key indices counted from the sequence's start (ALiBi distances, the band,
``score_mod``'s ``q_idx``/``k_idx``; its ``b`` is the sequence index).

The kernels are the family's own with the constexpr VARLEN switch (:mod:`.kernels`; decision 031): the grid's batch axis
runs over the sequences and its row axis over ``max_seqlen_q`` (``max_seqlen_k`` for dK/dV); a program past
its sequence's end returns at once. The prefill form only: no split-KV decode form and no packed GQA rows.

``check_seqlens=True`` (the default) reads both ``cu_seqlens`` on the host to check them (a device-to-host
copy of ``batch + 1`` ints: one synchronisation on a GPU, refused inside a CUDA graph capture):
they start at 0, never decrease, end at the packed totals, and no sequence is longer than its ``max_seqlen``.
``check_seqlens=False`` skips that read: lengths that break those rules then give undefined results, as in
FlashAttention.
"""
from __future__ import annotations

import dataclasses

import torch
import triton

from ... import device
from . import tuning
from .checks import (MAX_DROPOUT_SCORES, MAX_HEAD_DIM, MASK_NONE, Params, check_alibi, check_qkv, check_score_options,
                     normalize_causal, normalize_window)
from .kernels import attn_bwd_dkdv_kernel, attn_bwd_dq_kernel, attn_bwd_preprocess_kernel, attn_fwd_kernel
from .launch import _common_constexprs, _score_args, block_d, dropout_mask, kernel_space

# the kernels' VARLEN constexpr: where each sequence's diagonal lies
VARLEN_TOP_LEFT, VARLEN_BOTTOM_RIGHT = 1, 2
# positions, totals and band offsets are int32 in the kernels: an unbounded side is total_q + total_k + 1,
# and a position plus that offset plus a diagonal shift must stay below 2^31
MAX_TOTAL = 2 ** 29
PREPROCESS_ROWS = 64


@dataclasses.dataclass(frozen=True)
class VarlenParams:
    """``params``: the call's options with ``B`` the number of sequences, ``Sq``/``Sk`` the max lengths and
    ``diag``/``lo_off``/``hi_off`` relative to each sequence's diagonal (the kernels add ``Sk_b - Sq_b`` with
    VARLEN_BOTTOM_RIGHT). ``varlen``: the kernels' VARLEN value."""
    params: Params
    total_q: int
    total_k: int
    varlen: int


# --------------------------------------------------------------------------------------------- checks
def check_packed_tensors(q, k, v) -> None:
    check_qkv(q, k, v, 3, "(total_tokens, heads, head_dim) for packed sequences")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have one shape (total_k, kv_heads, head_dim), got k {tuple(k.shape)} and "
                         f"v {tuple(v.shape)}")
    _, H, D = q.shape
    if k.shape[2] != D:
        raise ValueError(f"head dims differ: q has {D}, k and v have {k.shape[2]}; they must be equal")
    if not 1 <= D <= MAX_HEAD_DIM:
        raise ValueError(f"head dim {D} is not supported: accepted values are 1 to {MAX_HEAD_DIM}")
    H_kv = k.shape[1]
    if H < 1 or H_kv < 1 or H % H_kv:
        raise ValueError(f"q has {H} heads and k/v have {H_kv}: the kv heads must divide the query heads "
                         f"(GQA/MQA groups of H // H_kv query heads)")
    for name, t in (("q", q), ("k", k)):
        if t.shape[0] >= MAX_TOTAL:
            raise ValueError(f"{name} packs {t.shape[0]} tokens: accepted totals are below 2^29 (int32 positions and "
                             f"band offsets in the kernels)")


def check_cu_seqlens(cu_q, cu_k, dev) -> int:
    """The number of sequences; dtype, device and shape checks only (nothing read)."""
    for name, cu in (("cu_seqlens_q", cu_q), ("cu_seqlens_k", cu_k)):
        if not isinstance(cu, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor of int32 cumulative lengths (batch + 1,), got "
                            f"{type(cu).__name__}")
        if cu.dtype != torch.int32:
            raise TypeError(f"{name} has dtype {cu.dtype}: accepted dtype is torch.int32 (cumulative lengths, as "
                            f"FlashAttention takes them)")
        if cu.device != dev:
            raise ValueError(f"{name} is on {cu.device}, q on {dev}: they must be on one device")
        if cu.dim() != 1 or cu.shape[0] < 2:
            raise ValueError(f"{name} has shape {tuple(cu.shape)}: accepted shape is (batch + 1,) with batch >= 1")
    if cu_q.shape != cu_k.shape:
        raise ValueError(f"cu_seqlens_q has {cu_q.shape[0]} entries and cu_seqlens_k {cu_k.shape[0]}: both must be "
                         f"(batch + 1,) for one batch")
    return cu_q.shape[0] - 1


def check_max_seqlen(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name}={value!r}: accepted values are ints >= 0 (the longest sequence's length)")
    return value


def check_seqlens_values(cu_q, cu_k, total_q, total_k, max_q, max_k) -> None:
    """The documented host read (one synchronisation on a GPU): starts at 0, non-decreasing, ends at the
    totals, no sequence longer than its max_seqlen."""
    if cu_q.is_cuda and torch.cuda.is_current_stream_capturing():
        raise ValueError("check_seqlens=True reads cu_seqlens on the host, which a CUDA graph capture forbids: "
                         "pass check_seqlens=False (lengths are then trusted)")
    both = torch.stack((cu_q, cu_k)).cpu().tolist()
    for name, cu, total, longest, max_name in (("cu_seqlens_q", both[0], total_q, max_q, "max_seqlen_q"),
                                               ("cu_seqlens_k", both[1], total_k, max_k, "max_seqlen_k")):
        if cu[0] != 0:
            raise ValueError(f"{name}[0] is {cu[0]}: cumulative lengths start at 0")
        lengths = [b - a for a, b in zip(cu, cu[1:])]
        bad = next((i for i, n in enumerate(lengths) if n < 0), None)
        if bad is not None:
            raise ValueError(f"{name} decreases at index {bad + 1} ({cu[bad]} -> {cu[bad + 1]}): cumulative lengths "
                             f"must be non-decreasing")
        if cu[-1] != total:
            raise ValueError(f"{name}[-1] is {cu[-1]} but the packed tensor has {total} tokens: they must be equal")
        if max(lengths) > longest:
            raise ValueError(f"{max_name}={longest} but sequence {lengths.index(max(lengths))} of {name} has length "
                             f"{max(lengths)}: {max_name} must be at least the longest sequence")


def varlen_band(causal: str, window, total_q: int, total_k: int) -> tuple[int, int, bool, bool]:
    """(lo_off, hi_off, band_lo, band_hi) relative to each sequence's diagonal: key ``j`` is visible to query
    ``i`` iff ``i + diag_b + lo_off <= j <= i + diag_b + hi_off``. An unbounded side is an offset past every key
    of every sequence; a bounded side is an edge (the kernels' masked loops are correct with or without one)."""
    unbounded = total_q + total_k + 1
    left, right = window if window is not None else (-1, -1)
    if causal != "none":
        right = 0
    band_lo, band_hi = left >= 0, right >= 0
    left = unbounded if left < 0 else min(left, unbounded)
    right = unbounded if right < 0 else min(right, unbounded)
    return -left, right, band_lo, band_hi


def check_varlen_arguments(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal, window,
                           softcap, alibi, score_mod, score_mod_grad, dropout_p, dropout_seed, scale, deterministic,
                           check_seqlens, needs_grad):
    """(VarlenParams, alibi view, cu_seqlens_q, cu_seqlens_k): every argument checked, in the order of the
    signature, before any launch; the cumulative lengths contiguous (the kernels index them densely)."""
    check_packed_tensors(q, k, v)
    B = check_cu_seqlens(cu_seqlens_q, cu_seqlens_k, q.device)
    max_q = check_max_seqlen("max_seqlen_q", max_seqlen_q)
    max_k = check_max_seqlen("max_seqlen_k", max_seqlen_k)
    total_q, H, D = q.shape
    total_k, H_kv = k.shape[0], k.shape[1]
    if max_q > total_q or max_k > total_k:
        name, m, t = ("max_seqlen_q", max_q, total_q) if max_q > total_q else ("max_seqlen_k", max_k, total_k)
        raise ValueError(f"{name}={m} is longer than the {t} packed tokens")
    causal_kind = normalize_causal(causal)
    win = normalize_window(window)
    softcap, scale, dropout_p = check_score_options(
        D, softcap=softcap, scale=scale, dropout_p=dropout_p, dropout_seed=dropout_seed, deterministic=deterministic,
        score_mod=score_mod, score_mod_grad=score_mod_grad, needs_grad=needs_grad)
    if dropout_p > 0 and max_q * max_k >= MAX_DROPOUT_SCORES:
        raise ValueError(f"dropout_p > 0 with max_seqlen_q * max_seqlen_k = {max_q * max_k}: the dropout counters "
                         f"are int32 (one stream a sequence and head), accepted sizes are below 2^31")
    alibi_view = check_alibi(alibi, B, H, q.device)
    if not isinstance(check_seqlens, bool):
        raise TypeError(f"check_seqlens must be a bool, got {type(check_seqlens).__name__}")
    if check_seqlens:
        check_seqlens_values(cu_seqlens_q, cu_seqlens_k, total_q, total_k, max_q, max_k)
    lo_off, hi_off, band_lo, band_hi = varlen_band(causal_kind, win, total_q, total_k)
    if dropout_p > 0 and dropout_seed is None:
        dropout_seed = int(torch.randint(0, 2 ** 31 - 1, (1,)).item())  # from torch's generator: manual_seed works
    params = Params(B, H, H_kv, max_q, max_k, D, float(scale), 0, lo_off, hi_off, band_lo, band_hi, softcap,
                    alibi_view is not None, MASK_NONE, score_mod, score_mod_grad, dropout_p, int(dropout_seed or 0),
                    deterministic)
    kind = VARLEN_BOTTOM_RIGHT if causal_kind == "bottom_right" else VARLEN_TOP_LEFT
    return VarlenParams(params, total_q, total_k, kind), alibi_view, cu_seqlens_q.contiguous(), \
        cu_seqlens_k.contiguous()


# --------------------------------------------------------------------------------------------- launch
def packed_strides(t: torch.Tensor) -> tuple[int, int, int, int]:
    """A packed (total, H, D) tensor's strides in the kernels' (batch, head, row, dim) order, batch 0: the
    kernels move to a sequence's first row through cu_seqlens."""
    return 0, t.stride(1), t.stride(0), t.stride(2)


def _alibi_args(q, alibi):
    return (alibi, alibi.stride()) if alibi is not None else (q, (0, 0))


def forward_varlen(q, k, v, cu_q, cu_k, vp: VarlenParams, alibi=None, config=None):
    """(out, lse2): ``out`` like ``q`` (total_q, H, D); ``lse2`` (H, total_q) fp32 in log2 units (-inf for
    rows with nothing visible). Without a ``config``, tuned on a GPU as the non-varlen forward is."""
    p = vp.params
    out = torch.empty_like(q)
    lse2 = torch.empty((p.H, vp.total_q), dtype=torch.float32, device=q.device)
    if vp.total_q == 0 or p.Sq == 0:
        return out, lse2
    if config is None:
        config = tuning.choose(tuning.key_of("fwd_varlen", p, q.dtype, block_d(p.D)), kernel_space("fwd", p.D, q.dtype),
                               lambda c: forward_varlen(q, k, v, cu_q, cu_k, vp, alibi, c))
    a, as_ = _alibi_args(q, alibi)
    tiles = triton.cdiv(vp.total_k, config.block_n) + 1  # one split: more than any sequence's key tiles
    attn_fwd_kernel[(triton.cdiv(p.Sq, config.block_m), p.B * p.H, 1)](
        q, k, v, out, lse2, q, a,
        *packed_strides(q), *packed_strides(k), *packed_strides(v), *packed_strides(out), 0, 0,
        0, 0, 0, 0, *as_,
        p.H, vp.total_q, vp.total_k, tiles, *_score_args(p),
        BLOCK_M=config.block_m, BLOCK_N=config.block_n, PACK_GQA=False, **_common_constexprs(p, q.dtype),
        **config.launch_options(device.current().vendor), cu_q_ptr=cu_q, cu_k_ptr=cu_k, VARLEN=vp.varlen)
    return out, lse2


def backward_varlen(do, q, k, v, out, lse2, cu_q, cu_k, vp: VarlenParams, alibi=None, *, dkdv_config=None,
                    dq_config=None, atomic_dq: bool | None = None):
    """(dq, dk, dv), each like its input: the dQ forms and their choice are :func:`launch.backward`'s."""
    p = vp.params
    if atomic_dq and p.deterministic:
        raise ValueError("atomic_dq=True contradicts deterministic=True (atomics make the sum order vary)")
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    if vp.total_q == 0 or vp.total_k == 0 or p.Sq == 0 or p.Sk == 0:
        return dq.zero_(), dk.zero_(), dv.zero_()
    if atomic_dq is None:
        atomic_dq = False if p.deterministic else tuning.choose_form(
            tuning.key_of("bwd_form_varlen", p, q.dtype, block_d(p.D)),
            lambda atomic: backward_varlen(do, q, k, v, out, lse2, cu_q, cu_k, vp, alibi, atomic_dq=atomic))
    if dkdv_config is None or (not atomic_dq and dq_config is None):
        dkdv_config, dq_config = _tuned_backward_configs(do, q, k, v, out, lse2, cu_q, cu_k, vp, alibi, dkdv_config,
                                                         dq_config, atomic_dq)
    bd = block_d(p.D)
    vendor = device.current().vendor
    delta = torch.empty((p.H, vp.total_q), dtype=torch.float32, device=q.device)
    # (H, total_q) rows: the preprocess kernel sees one "batch" of total_q rows
    attn_bwd_preprocess_kernel[(triton.cdiv(vp.total_q, PREPROCESS_ROWS), p.H)](
        out, do, delta, p.H, vp.total_q, *packed_strides(out), *packed_strides(do), HEAD_DIM=p.D, BLOCK_D=bd,
        BLOCK_M=PREPROCESS_ROWS, num_warps=4)
    a, as_ = _alibi_args(q, alibi)
    common = _common_constexprs(p, q.dtype)
    dq_acc = torch.zeros((vp.total_q, p.H, p.D), dtype=torch.float32, device=q.device) if atomic_dq else dq
    attn_bwd_dkdv_kernel[(triton.cdiv(p.Sk, dkdv_config.block_n), p.B * p.H_kv)](
        q, k, v, do, dk, dv, dq_acc, lse2, delta, q, a,
        *packed_strides(q), *packed_strides(k), *packed_strides(v), *packed_strides(do), *packed_strides(dk),
        *packed_strides(dv), *packed_strides(dq_acc), 0, 0, 0, 0, *as_,
        p.H, vp.total_q, vp.total_k, *_score_args(p),
        BLOCK_M=dkdv_config.block_m, BLOCK_N=dkdv_config.block_n, SCORE_MOD_GRAD=p.score_mod_grad,
        ATOMIC_DQ=atomic_dq, **common, **dkdv_config.launch_options(vendor),
        cu_q_ptr=cu_q, cu_k_ptr=cu_k, VARLEN=vp.varlen)
    if atomic_dq:
        dq.copy_(dq_acc)
    else:
        attn_bwd_dq_kernel[(triton.cdiv(p.Sq, dq_config.block_m), p.B * p.H)](
            q, k, v, do, dq, lse2, delta, q, a,
            *packed_strides(q), *packed_strides(k), *packed_strides(v), *packed_strides(do), *packed_strides(dq),
            0, 0, 0, 0, *as_, p.H, vp.total_q, vp.total_k, *_score_args(p),
            BLOCK_M=dq_config.block_m, BLOCK_N=dq_config.block_n, SCORE_MOD_GRAD=p.score_mod_grad,
            **common, **dq_config.launch_options(vendor), cu_q_ptr=cu_q, cu_k_ptr=cu_k, VARLEN=vp.varlen)
    return dq, dk, dv


def _tuned_backward_configs(do, q, k, v, out, lse2, cu_q, cu_k, vp, alibi, dkdv_config, dq_config, atomic: bool):
    """As :func:`launch._tuned_backward_configs`, under varlen keys (the grid and the tile counts differ)."""
    p = vp.params
    bd = block_d(p.D)
    dq_space = kernel_space("bwd_dq", p.D, q.dtype)
    form = "atomic" if atomic else "two_pass"
    if dkdv_config is None:
        dkdv_config = tuning.choose(
            tuning.key_of(f"bwd_dkdv_{form}_varlen", p, q.dtype, bd), kernel_space("bwd_dkdv", p.D, q.dtype),
            lambda c: backward_varlen(do, q, k, v, out, lse2, cu_q, cu_k, vp, alibi, dkdv_config=c,
                                      dq_config=dq_space[0], atomic_dq=atomic))
    if not atomic and dq_config is None:
        dq_config = tuning.choose(
            tuning.key_of("bwd_dq_varlen", p, q.dtype, bd), dq_space,
            lambda c: backward_varlen(do, q, k, v, out, lse2, cu_q, cu_k, vp, alibi, dkdv_config=dkdv_config,
                                      dq_config=c, atomic_dq=False))
    return dkdv_config, dq_config


def dropout_mask_varlen(seed: int, cu_q: torch.Tensor, cu_k: torch.Tensor, H: int, dropout_p: float) -> list:
    """The keep masks a call with ``dropout_seed=seed`` applies: one (H, Sq_b, Sk_b) bool a sequence. Sequence
    ``b`` draws from the streams of (batch ``b``, head ``h``) with its own lengths, so it is the ``b``-th batch
    of :func:`dropout_mask` at those lengths (computed that way: for tests and debugging, not for speed)."""
    qs, ks = cu_q.cpu().tolist(), cu_k.cpu().tolist()
    out = []
    for b in range(len(qs) - 1):
        sq, sk = qs[b + 1] - qs[b], ks[b + 1] - ks[b]
        if sq * sk == 0:
            out.append(torch.zeros((H, sq, sk), dtype=torch.bool, device=cu_q.device))
            continue
        out.append(dropout_mask(seed, b + 1, H, sq, sk, dropout_p, cu_q.device)[b])
    return out


__all__ = ["VarlenParams", "check_varlen_arguments", "forward_varlen", "backward_varlen", "dropout_mask_varlen",
           "VARLEN_TOP_LEFT", "VARLEN_BOTTOM_RIGHT"]
