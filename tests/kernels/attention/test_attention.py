"""The flash-attention family (tilefuse.kernels.attention) against a float64 reference of plain attention.

Every case runs forward and backward (torch.autograd.grad) with every output poisoned (torch's deterministic
mode fills ``torch.empty`` with NaN, so an element a kernel fails to write shows up) and q/k/v read through
the strides of a (B, S, H, D) buffer viewed as (B, H, S, D), as models pass them.
"""
from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

import tilefuse
from tilefuse.kernels import attention as attn
from tilefuse.kernels.attention import configs

from tests.support import assert_close, interpreter_only, moved_to

HERE = Path(__file__).resolve().parents[2]  # tests/
# the backward of half inputs rounds P and dS to the input dtype before its matmuls, as every flash kernel does
GRAD_TOLERANCE = {torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}


@pytest.fixture(autouse=True)
def poisoned_outputs_on_the_device():
    """torch.empty / empty_like return NaN-filled tensors while deterministic algorithms are on; tensors are
    made where tilefuse runs kernels (cuda on a GPU machine, the CPU on the interpreter)."""
    from tilefuse import device

    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    torch.use_deterministic_algorithms(True, warn_only=True)  # warn_only: cuBLAS needs no workspace setting
    assert torch.utils.deterministic.fill_uninitialized_memory
    with torch.device(device.torch_device()):
        yield
    torch.use_deterministic_algorithms(before[0], warn_only=before[1])


# ------------------------------------------------------------------------------------------- reference
def reference(q, k, v, *, causal=False, window=None, softcap=None, alibi=None, mask=None, score_mod=None,
              keep=None, dropout_p=0.0, scale=None):
    """Plain attention in float64 (autograd-able). ``keep``: the dropout keep mask (B, H, Sq, Sk)."""
    q, k, v = q.double(), k.double(), v.double()
    B, H, Sq, D = q.shape
    Sk = k.shape[2]
    group = H // k.shape[1]
    k = k.repeat_interleave(group, 1)
    v = v.repeat_interleave(group, 1)
    s = q @ k.transpose(-1, -2) * (scale if scale is not None else 1 / math.sqrt(D))
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(Sq).view(Sq, 1)
    j = torch.arange(Sk).view(1, Sk)
    diag = Sk - Sq if causal == "bottom_right" else 0
    if alibi is not None:
        slopes = alibi.double().expand(B, H).view(B, H, 1, 1)
        s = s - slopes * (i + diag - j).abs()
    if mask is not None and mask.dtype != torch.bool:
        s = s + mask.double()
    if score_mod is not None:
        s = score_mod(s, torch.arange(B).view(B, 1, 1, 1), torch.arange(H).view(1, H, 1, 1), i, j)
    if mask is not None and mask.dtype == torch.bool:
        s = s.masked_fill(~mask, float("-inf"))
    visible = torch.ones(Sq, Sk, dtype=torch.bool)
    if causal:
        visible &= j <= i + diag
    if window is not None:
        left, right = window
        if left is not None and left >= 0:
            visible &= j >= i + diag - left
        if right is not None and right >= 0:
            visible &= j <= i + diag + right
    s = s.masked_fill(~visible, float("-inf"))
    m = s.amax(-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(s - m)
    total = e.sum(-1, keepdim=True)
    p = e / torch.where(total == 0, torch.ones_like(total), total)  # fully masked rows: 0, as the kernel
    if keep is not None:
        p = p * keep / (1 - dropout_p)
    return p @ v


@triton.jit
def quadratic_bias(score, b, h, q_idx, k_idx):
    return score * (1.0 + 0.25 * h) + 0.02 * score * score + 0.05 * (k_idx - q_idx).to(tl.float32)


@triton.jit
def quadratic_bias_grad(score, b, h, q_idx, k_idx):
    return 1.0 + 0.25 * h + 0.04 * score


def quadratic_bias_ref(s, b, h, i, j):
    return s * (1.0 + 0.25 * h) + 0.02 * s * s + 0.05 * (j - i)


def bshd(B, H, S, D, dtype, scale=1.0):
    """(B, H, S, D) values viewed from a (B, S, H, D) buffer: the layout models pass, not contiguous."""
    return (torch.randn(B, S, H, D) * scale).to(dtype).transpose(1, 2).requires_grad_()


def run_case(B, H, H_kv, Sq, Sk, D, dtype, ref_kwargs=None, mask=None, **kwargs):
    q = bshd(B, H, Sq, D, dtype)
    k = bshd(B, H_kv, Sk, D, dtype)
    v = bshd(B, H_kv, Sk, D, dtype)
    out = attn.attention(q, k, v, mask=mask, **kwargs)
    assert out.shape == (B, H, Sq, D) and out.dtype == dtype
    assert out.stride() == q.stride() or Sq <= 1 or H <= 1  # laid out like q (B, S, H, D)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    rk = {n: kwargs[n] for n in ("causal", "window", "softcap", "alibi", "dropout_p", "scale") if n in kwargs}
    rk.update(ref_kwargs or {})
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref = reference(*leaves, mask=mask, **rk)
    ref_grads = torch.autograd.grad(ref, leaves, dout.double())
    assert_close(out, ref, dtype, what="out")
    for name, g, r in zip(("dq", "dk", "dv"), grads, ref_grads):
        assert g.shape == r.shape and g.dtype == dtype
        assert_close(g, r, dtype, tol=GRAD_TOLERANCE[dtype], what=name)
    return out, grads


# ---------------------------------------------------------------------------------- features x dtypes
F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
CASES = [
    # id, (B, H, H_kv, Sq, Sk, D), dtype, attention kwargs
    ("plain", (2, 2, 2, 33, 33, 32), F32, {}),
    ("plain-fp16-d80", (2, 3, 3, 65, 65, 80), F16, {}),
    ("plain-bf16", (1, 2, 2, 33, 65, 64), BF16, {}),
    ("causal-gqa", (2, 4, 2, 65, 65, 64), F16, {"causal": True}),
    ("causal-top-left-sq>sk", (1, 2, 1, 65, 33, 32), F32, {"causal": True}),
    ("causal-bottom-right", (1, 4, 2, 33, 65, 80), F32, {"causal": "bottom_right"}),
    ("causal-bf16", (2, 2, 2, 65, 65, 32), BF16, {"causal": True}),
    ("window", (1, 2, 2, 65, 65, 64), F32, {"window": (16, 8)}),
    ("window-causal-fp16", (2, 2, 1, 65, 65, 32), F16, {"window": (20, None), "causal": True}),
    ("window-left-only", (1, 2, 2, 33, 65, 32), F16, {"window": (5, -1)}),
    ("window-right-only", (1, 2, 2, 7, 33, 32), F16, {"window": (None, 3)}),
    ("softcap", (2, 2, 2, 33, 33, 64), F32, {"softcap": 2.0, "scale": 0.5}),
    ("softcap-fp16-causal", (1, 4, 2, 65, 65, 80), F16, {"softcap": 5.0, "causal": True}),
    ("alibi-per-head", (2, 4, 4, 33, 33, 32), F32, {"alibi": "H", "causal": True}),
    ("alibi-per-batch-fp16", (2, 2, 1, 33, 65, 64), F16, {"alibi": "BH"}),
    ("score-mod", (2, 4, 2, 33, 33, 32), F32, {"score_mod": True}),
    ("score-mod-fp16-causal", (1, 2, 2, 65, 65, 80), F16, {"score_mod": True, "causal": True}),
    ("mqa-bf16", (1, 4, 1, 33, 33, 64), BF16, {"causal": True}),
    ("seq1", (2, 2, 2, 1, 1, 32), F32, {}),
    ("decode-q1", (2, 4, 2, 1, 65, 64), F16, {}),
    ("d256", (1, 2, 2, 7, 33, 256), F32, {"causal": "bottom_right"}),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_forward_and_backward_match_reference(case):
    _, (B, H, H_kv, Sq, Sk, D), dtype, kwargs = case
    kwargs = dict(kwargs)
    ref_kwargs = {}
    if kwargs.get("alibi") == "H":
        kwargs["alibi"] = torch.rand(H) * 0.5 + 0.1
    elif kwargs.get("alibi") == "BH":
        kwargs["alibi"] = torch.rand(B, H) * 0.5 + 0.1
    if kwargs.pop("score_mod", False):
        kwargs.update(score_mod=quadratic_bias, score_mod_grad=quadratic_bias_grad)
        ref_kwargs["score_mod"] = quadratic_bias_ref
    run_case(B, H, H_kv, Sq, Sk, D, dtype, ref_kwargs, **kwargs)


MASK_CASES = [
    ("bool-padding", F16, (2, 1, 1, 65), torch.bool),
    ("bool-full", F32, (2, 2, 33, 65), torch.bool),
    ("additive-2d", F32, (33, 65), torch.float32),
    ("additive-per-head-bf16", BF16, (1, 2, 33, 1), torch.bfloat16),
]


@pytest.mark.parametrize("case", MASK_CASES, ids=[c[0] for c in MASK_CASES])
def test_mask_tensor_broadcast_and_strided(case):
    _, dtype, shape, mdtype = case
    B, H, Sq, Sk, D = 2, 2, 33, 65, 32
    if mdtype == torch.bool:
        mask = torch.rand(*shape[:-2], shape[-1], shape[-2]) > 0.3  # read through transposed strides
        mask = mask.transpose(-1, -2)
        mask[..., 0] = True  # no fully masked row here (they have their own test)
    else:
        mask = (torch.randn(*shape[:-2], shape[-1], shape[-2]) * 2).to(mdtype).transpose(-1, -2)
    run_case(B, H, 1, Sq, Sk, D, dtype, mask=mask, causal=mdtype != torch.bool)


def test_fully_masked_rows_give_zeros():
    B, H, Sq, Sk, D = 1, 2, 33, 33, 32
    mask = torch.rand(B, 1, Sq, Sk) > 0.5
    mask[:, :, 3] = False
    mask[:, :, 20] = False
    out, grads = run_case(B, H, H, Sq, Sk, D, F32, mask=mask)
    assert (out[:, :, [3, 20]] == 0).all() and torch.isfinite(out).all()
    assert (grads[0][:, :, [3, 20]] == 0).all() and all(torch.isfinite(g).all() for g in grads)
    # eager: softmax of an all -inf row is NaN; SDPA's CPU math path (torch 2.5+) gives 0, as this kernel does
    q, k, v = (t.detach() for t in (bshd(B, H, Sq, D, F32), bshd(B, H, Sk, D, F32), bshd(B, H, Sk, D, F32)))
    assert torch.isnan(torch.softmax(torch.full((Sk,), float("-inf")), 0)).all()
    sdpa = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert_close(attn.attention(q, k, v, mask=mask), torch.nan_to_num(sdpa, nan=0.0), F32)
    # a causal alignment that leaves the first rows nothing: bottom-right with Sq > Sk
    run_case(1, 2, 2, 33, 7, 32, F16, causal="bottom_right")


def test_dropout_regenerates_the_same_mask_in_backward():
    B, H, H_kv, Sq, Sk, D, p = 1, 4, 2, 33, 65, 32, 0.3
    keep = attn.dropout_mask(1234, B, H, Sq, Sk, p)
    assert abs(keep.float().mean().item() - (1 - p)) < 0.03
    assert not torch.equal(keep, attn.dropout_mask(1235, B, H, Sq, Sk, p))
    for dtype, causal in ((F32, False), (F16, True)):
        run_case(B, H, H_kv, Sq, Sk, D, dtype, {"keep": keep}, dropout_p=p, dropout_seed=1234, causal=causal)
    # the seed comes from torch's generator: manual_seed reproduces a run
    q = torch.randn(1, 2, 7, 32)
    torch.manual_seed(7)
    a = attn.attention(q, q, q, dropout_p=0.5)
    torch.manual_seed(7)
    assert torch.equal(a, attn.attention(q, q, q, dropout_p=0.5))


@pytest.mark.parametrize("pack_gqa, Sq, causal", [(True, 1, False), (True, 4, "bottom_right"), (False, 3, False)])
def test_decode_split_kv_forms(pack_gqa, Sq, causal):
    """Few rows against a long KV: split over the KV length, combined by logsumexp (and GQA rows packed)."""
    B, H, H_kv, Sk, D = 2, 4, 2, 130, 64
    alibi = torch.rand(H) * 0.3
    mask = torch.rand(B, 1, Sq, Sk) > 0.2
    mask[..., -1] = True
    run_case(B, H, H_kv, Sq, Sk, D, F16, {"score_mod": quadratic_bias_ref}, mask=mask, causal=causal, alibi=alibi,
             score_mod=quadratic_bias, score_mod_grad=quadratic_bias_grad, num_splits=3, pack_gqa=pack_gqa)


@pytest.mark.parametrize("unrolled", [True, False], ids=["split count a constant", "split count at run time"])
def test_decode_combine_unrolled_and_looped(monkeypatch, unrolled):
    """The split combine in both forms (its loops unrolled over a constant split count, or a loop over a run-time
    one) against the reference; the kept combine site says which form ran."""
    from tilefuse.kernels.attention import kernels as attn_kernels
    from tilefuse.kernels.attention import launch

    if not unrolled:
        monkeypatch.setattr(launch, "COMBINE_UNROLL_MAX", 1)
    launch._forward_launches.clear()
    launch._sites.clear()
    run_case(1, 4, 2, 2, 97, 32, F32, num_splits=4)
    splits = [dict(key[2])["SPLITS"] for key in launch._sites if key[0] is attn_kernels.attn_combine_kernel]
    assert len(splits) == 1 and (splits[0] > 1 if unrolled else splits[0] == 0), splits


def test_decode_plan_and_lse():
    p, _, _ = attn.checks.check_arguments(
        torch.empty(1, 8, 1, 64), torch.empty(1, 2, 4096, 64), torch.empty(1, 2, 4096, 64), causal=False,
        window=None, softcap=None, alibi=None, mask=None, score_mod=None, score_mod_grad=None, dropout_p=0.0,
        dropout_seed=None, scale=None, deterministic=False, needs_grad=False)
    plan = attn.plan_forward(p, torch.float16)
    assert plan.pack_gqa and plan.num_splits >= 1
    q, k, v = torch.randn(1, 4, 3, 32), torch.randn(1, 2, 97, 32), torch.randn(1, 2, 97, 32)
    out, lse = attn.attention_with_lse(q, k, v, causal="bottom_right", num_splits=2)
    s = q.double() @ k.double().repeat_interleave(2, 1).transpose(-1, -2) / math.sqrt(32)
    s = s.masked_fill(torch.arange(97)[None, :] > torch.arange(3)[:, None] + 94, float("-inf"))
    assert_close(lse, torch.logsumexp(s, -1), F32, what="lse")


def test_matches_sdpa_conventions():
    """causal=True is SDPA's top-left is_causal, also with Sq != Sk; bottom_right equals its explicit mask."""
    q, k, v = torch.randn(2, 2, 7, 32), torch.randn(2, 2, 33, 32), torch.randn(2, 2, 33, 32)
    assert_close(attn.attention(q, k, v, causal=True), F.scaled_dot_product_attention(q, k, v, is_causal=True), F32)
    br = torch.ones(7, 33, dtype=torch.bool).tril(33 - 7)
    assert_close(attn.attention(q, k, v, causal="bottom_right"), F.scaled_dot_product_attention(q, k, v, attn_mask=br),
                 F32)
    assert tilefuse.attention is attn.attention


def test_deterministic_backward_is_bitwise_reproducible_and_matches_atomic(monkeypatch):
    from tilefuse.kernels.attention import tuning as attn_tuning

    q, k, v = (bshd(1, 4, 65, 32, F16), bshd(1, 2, 65, 32, F16), bshd(1, 2, 65, 32, F16))
    dout = torch.randn(1, 4, 65, 32, dtype=F16)

    def grads(det):
        out = attn.attention(q, k, v, causal=True, deterministic=det)
        return torch.autograd.grad(out, (q, k, v), dout)

    first, second = grads(True), grads(True)
    monkeypatch.setattr(attn_tuning, "DEFAULT_ATOMIC_DQ", True)  # the untuned form of a non-deterministic call
    attn_tuning.forget()
    atomic = grads(False)
    attn_tuning.forget()
    for a, b, c in zip(first, second, atomic):
        assert torch.equal(a, b)
        assert_close(a, c.float(), F16)


def test_backward_form_is_the_faster_one_timed_and_stored(monkeypatch, tmp_path):
    """Not deterministic: both dQ forms are timed once a key (each with its own tuned configs), the faster
    kept in memory and on disk; deterministic=True never asks; atomics with deterministic=True is refused."""
    from tilefuse.kernels.attention import launch as attn_launch
    from tilefuse.kernels.attention import tuning as attn_tuning

    monkeypatch.setenv("TILEFUSE_CACHE_DIR", str(tmp_path))
    attn_tuning.forget()
    monkeypatch.setattr(attn_tuning, "tuning_enabled", lambda: True)
    ran = []

    def run(atomic):
        ran.append(atomic)

    fake_ms = {True: 1.0, False: 2.0}
    pick = attn_tuning.choose_form("k1", run, timer=lambda fn: (fn(), fake_ms[ran[-1]])[1])
    assert pick is True and set(ran) == {True, False}
    ran.clear()
    assert attn_tuning.choose_form("k1", run) is True and ran == []  # remembered
    attn_tuning.forget()
    assert attn_tuning.choose_form("k1", run) is True and ran == []  # read back from disk
    attn_tuning.forget()
    q, k, v = (torch.randn(1, 2, 9, 16) for _ in range(3))
    p, _, _ = attn.checks.check_arguments(
        q, k, v, causal=False, window=None, softcap=None, alibi=None, mask=None, score_mod=None,
        score_mod_grad=None, dropout_p=0.0, dropout_seed=None, scale=None, deterministic=True, needs_grad=True)
    with pytest.raises(ValueError, match="atomic_dq=True contradicts deterministic=True"):
        attn_launch.backward(q, q, k, v, q, torch.zeros(2, 9), p, atomic_dq=True)


def test_any_strides_including_a_strided_head_dim():
    """q with every other element of its head dim (stride 2), k transposed in memory, v contiguous."""
    from tests.support import noncontiguous

    B, H, S, D = 2, 2, 33, 32
    q = noncontiguous(torch.randn(B, H, S, D)).requires_grad_()
    k = torch.randn(B, D, S, H).permute(0, 3, 2, 1).requires_grad_()  # (B, H, S, D) view, head dim outermost
    v = torch.randn(B, H, S, D, requires_grad=True)
    assert q.stride(-1) == 2 and k.stride(-1) == S * H
    out = attn.attention(q, k, v, causal=True)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref = reference(*leaves, causal=True)
    assert_close(out, ref, F32)
    for g, r in zip(grads, torch.autograd.grad(ref, leaves, dout.double())):
        assert_close(g, r, F32)


def test_no_grad_inputs_and_score_mod_without_grad_run_forward_only():
    q = torch.randn(1, 2, 7, 32)
    out = attn.attention(q, q, q, score_mod=quadratic_bias)  # no input requires grad: no score_mod_grad needed
    assert_close(out, reference(q, q, q, score_mod=quadratic_bias_ref), F32)


BAD = [
    (dict(q=torch.randn(2, 7, 32)), ValueError, "q must have rank 4"),
    (dict(q=torch.randn(1, 2, 7, 32, dtype=torch.float64)), TypeError, "accepted dtypes are float16, bfloat16, float32"),
    (dict(k=torch.randn(1, 2, 7, 32, dtype=torch.float16)), TypeError, "share one dtype"),
    (dict(k=torch.randn(1, 2, 7, 16), v=torch.randn(1, 2, 7, 16)), ValueError, "head dims differ"),
    (dict(k=torch.randn(1, 2, 7, 16)), ValueError, "k and v must have one shape"),
    (dict(k=torch.randn(1, 3, 7, 32), v=torch.randn(1, 3, 7, 32)), ValueError, "kv heads must divide"),
    (dict(q=torch.randn(1, 2, 7, 512), k=torch.randn(1, 2, 7, 512), v=torch.randn(1, 2, 7, 512)), ValueError,
     "accepted values are 1 to 256"),
    (dict(causal="yes"), ValueError, "causal='yes': accepted values are False, True"),
    (dict(window=(4,)), ValueError, "window=\\(4,\\): accepted values"),
    (dict(window=(-3, 2)), ValueError, "window left=-3"),
    (dict(mask=torch.ones(3, 7, dtype=torch.bool)), ValueError, "does not broadcast to"),
    (dict(mask=torch.ones(7, 7, dtype=torch.int32)), TypeError, "mask has dtype torch.int32"),
    (dict(mask=torch.zeros(7, 7, requires_grad=True)), ValueError, "mask requires grad"),
    (dict(alibi=torch.ones(3)), ValueError, "alibi has shape \\(3,\\)"),
    (dict(dropout_p=1.0), ValueError, "dropout_p=1.0: accepted values are numbers in \\[0, 1\\)"),
    (dict(softcap=-1.0), ValueError, "softcap=-1.0"),
    (dict(score_mod=lambda s, b, h, i, j: s), TypeError, "score_mod must be a @triton.jit function"),
    (dict(score_mod=quadratic_bias, q=torch.randn(1, 2, 7, 32, requires_grad=True)), ValueError,
     "needs score_mod_grad"),
    (dict(deterministic=1), TypeError, "deterministic must be a bool"),
    (dict(q=torch.empty(1, 2, 7, 32, device="meta"), k=torch.empty(1, 2, 7, 32, device="meta"),
          v=torch.empty(1, 2, 7, 32, device="meta")), ValueError, "q is on meta: tilefuse runs Triton kernels on"),
]


@pytest.mark.parametrize("bad, exc, match", BAD, ids=[m[:24] for _, _, m in BAD])
def test_argument_errors_name_the_argument_before_any_launch(bad, exc, match, monkeypatch):
    from tilefuse.kernels.attention import launch

    monkeypatch.setattr(launch, "forward", lambda *a, **k: pytest.fail("launched"))
    args = dict(q=torch.randn(1, 2, 7, 32), k=torch.randn(1, 2, 7, 32), v=torch.randn(1, 2, 7, 32))
    # (the cases' tensors, made at import on the CPU, go where the kernels run: on a GPU machine a CPU tensor
    # beside a cuda one stops the call at the device check, before the check a case is about)
    args.update({name: moved_to(val, args["q"].device) for name, val in bad.items()})
    q, k, v = args.pop("q"), args.pop("k"), args.pop("v")
    with pytest.raises(exc, match=match):
        attn.attention(q, k, v, **args)


def test_config_spaces_are_well_formed():
    for (arch, kernel), space in configs.SPACES.items():
        assert set(space) == set(configs.HEAD_DIM_CLASSES), (arch, kernel)
        for cfg in (c for cs in space.values() for c in cs):
            assert cfg.block_m >= 16 and cfg.block_n >= 16 and cfg.num_warps in (4, 8)
            opts = cfg.launch_options("nvidia")
            assert "waves_per_eu" not in opts and "matrix_instr_nonkdim" not in opts
            if arch == "cdna":
                assert cfg.launch_options("amd")["waves_per_eu"] == cfg.waves_per_eu >= 1
            if arch == "hopper" and kernel != "decode":
                assert max(cfg.block_m, cfg.block_n) >= 64  # a wgmma-sized dot in every backward/forward
    with pytest.raises(ValueError, match="unknown attention kernel 'fwdx'"):
        configs.candidates("hopper", "fwdx", 64)


# ------------------------------------------------------------------------------------ transformers
def _tiny_llama(impl):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM._from_config(cfg, attn_implementation=impl, torch_dtype=torch.float32)


def test_transformers_llama_matches_eager_logits_and_gradients(monkeypatch):
    calls = []
    kernel_forward = attn.api.forward  # what AttentionFunction launches
    monkeypatch.setattr(attn.api, "forward", lambda *a, **k: calls.append(a[3]) or kernel_forward(*a, **k))
    name = attn.register_transformers()
    assert name == "tilefuse"
    eager, ours = _tiny_llama("eager"), _tiny_llama("tilefuse")
    ours.load_state_dict(eager.state_dict())
    ids = torch.randint(0, 97, (2, 13))
    amask = torch.ones(2, 13, dtype=torch.long)
    amask[1, 10:] = 0  # right padding: a bool mask reaches the kernel
    results = []
    for model in (eager, ours):
        out = model(input_ids=ids, attention_mask=amask)
        logits = out.logits
        loss = (logits[0].sum() + logits[1, :10].sum()) / 100
        grads = torch.autograd.grad(loss, [p for p in model.parameters()])
        results.append((logits.detach(), grads))
    (le, ge), (lt, gt) = results
    assert_close(lt[0], le[0], F32, tol=2e-5, what="logits")
    assert_close(lt[1, :10], le[1, :10], F32, tol=2e-5, what="padded row's logits")
    for a, b in zip(gt, ge):
        assert_close(a, b, F32, tol=1e-4, what="parameter gradient")
    # no padding: attention_mask None, is_causal reaches the kernel
    assert [p.mask_kind for p in calls] == [attn.checks.MASK_BOOL] * 2 and [p.group for p in calls] == [2, 2]
    assert_close(ours(input_ids=ids).logits, eager(input_ids=ids).logits, F32, tol=2e-5, what="causal logits")
    assert [(p.mask_kind, p.hi_off) for p in calls[2:]] == [(0, 0)] * 2  # is_causal, no mask tensor


def test_transformers_gpt2_matches_eager():
    transformers = pytest.importorskip("transformers")
    attn.register_transformers()
    cfg = transformers.GPT2Config(vocab_size=97, n_positions=32, n_embd=64, n_layer=2, n_head=4)
    models = []
    for impl in ("eager", "tilefuse"):
        torch.manual_seed(0)
        models.append(transformers.GPT2LMHeadModel._from_config(cfg, attn_implementation=impl).eval())  # no dropout
    models[1].load_state_dict(models[0].state_dict())
    ids = torch.randint(0, 97, (2, 11))
    outs = [m(input_ids=ids).logits for m in models]
    assert_close(outs[1], outs[0], F32, tol=2e-5, what="gpt2 logits")
    grads = [torch.autograd.grad(o.square().mean(), m.transformer.h[0].attn.c_attn.weight)[0]
             for o, m in zip(outs, models)]
    assert_close(grads[1], grads[0], F32, tol=1e-4, what="gpt2 c_attn gradient")


# --------------------------------------------------------------------------------- cross-compilation
def test_cross_compiles_for_every_vendor_with_the_matrix_instructions():
    """tests/compile_only/attention_checks.py in a child that is not on the interpreter: one forward and one
    backward example on sm_90a (wgmma) and gfx942 (v_mfma)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TILEFUSE_INTERPRET"] = "0"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(HERE / "compile_only" / "attention_checks.py")],
                          capture_output=True, text=True, env=env, cwd=HERE.parent, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


# ---------------------------------------------------------------------------------------------- gpu
@pytest.mark.gpu
def test_gpu_realistic_causal_bf16_matches_sdpa():
    B, H, S, D = 1, 16, 4096, 128
    dev = "cuda"
    q, k, v = (torch.randn(B, S, H, D, device=dev, dtype=BF16).transpose(1, 2).requires_grad_() for _ in range(3))
    dout = torch.randn(B, H, S, D, device=dev, dtype=BF16)
    out = attn.attention(q, k, v, causal=True)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    leaves = [t.detach().float().requires_grad_() for t in (q, k, v)]
    ref = F.scaled_dot_product_attention(*leaves, is_causal=True)
    ref_grads = torch.autograd.grad(ref, leaves, dout.float())
    assert_close(out, ref, BF16, what="out")
    for name, g, r in zip(("dq", "dk", "dv"), grads, ref_grads):
        assert_close(g, r, BF16, what=name)
    det = torch.autograd.grad(attn.attention(q, k, v, causal=True, deterministic=True), (q, k, v), dout)
    for g, r in zip(det, ref_grads):
        assert_close(g, r, BF16)


# ---------------------------------------------------------------------------------------------- bench
@interpreter_only  # (--smoke is refused where Triton runs on a GPU: tests/bench/test_bench_suites.py)
def test_bench_attention_smoke_run_checks_and_times_every_impl(tmp_path):
    """`tilefuse bench attention --smoke`: tilefuse checked against SDPA and timed on the interpreter; the
    GPU-only SDPA backends are "not run" rows, FlexAttention's and the plain form run uncompiled (FlexAttention
    forward only); FLOPs by FlashAttention's convention."""
    from tilefuse.bench import attention_suite, harness, runner

    assert "attention" in runner.SUITES
    rows = attention_suite.run(runner.SuiteOptions(smoke=True, log=lambda s: None, only=("mha", "decode")))
    by = {(r.case, r.impl): r for r in rows}
    assert not [r for r in rows if r.status.startswith(("error", "wrong"))]
    for case in ("mha-smoke-fwd", "mha-smoke-bwd", "decode-smoke-fwd"):
        assert by[(case, "tilefuse")].ok and by[(case, "sdpa-math")].ok
        for impl in ("sdpa-cudnn", "sdpa-flash", "sdpa-efficient"):
            assert by[(case, impl)].status.startswith("not run")
    assert by[("mha-smoke-fwd", "flex")].ok and by[("mha-smoke-bwd", "flex")].status.startswith("not run")
    fwd, bwd = by[("mha-smoke-fwd", "tilefuse")], by[("mha-smoke-bwd", "tilefuse")]
    flops = 4 * 1 * 2 * 65 * 65 * 32 / 2  # causal
    assert fwd.tflops == pytest.approx(flops / (fwd.ms_p50 * 1e-3) / 1e12)
    assert bwd.tflops == pytest.approx(2.5 * flops / (bwd.ms_p50 * 1e-3) / 1e12)
    assert by[("decode-smoke-fwd", "tilefuse")].gbps > 0  # decode reads K/V once: GB/s
    harness.write_csv(rows, tmp_path / "attention-smoke.csv")


def test_tuning_keeps_the_fastest_candidate_and_stores_it(monkeypatch, tmp_cache):
    """On a GPU the first call of a key times the space; here the timer is faked. A failing candidate is
    skipped; the decision is reused from disk by a fresh process (forget())."""
    from tilefuse.kernels.attention import tuning

    monkeypatch.setattr(tuning, "tuning_enabled", lambda: True)
    tuning.forget()
    space = (configs.AttentionConfig(64, 64), configs.AttentionConfig(128, 64), configs.AttentionConfig(32, 32))
    fake_ms = {space[0]: 2.0, space[1]: 1.0}
    ran = []

    def run(cfg):
        ran.append(cfg)
        if cfg not in fake_ms:
            raise RuntimeError("out of resources")

    timer = lambda fn: (fn(), fake_ms[ran[-1]])[1]  # noqa: E731
    assert tuning.choose("k1", space, run, timer) == space[1]
    assert tuning.choose("k1", space, lambda c: pytest.fail("tuned twice")) == space[1]
    tuning.forget()
    before = tuning.counters["from_disk"]
    assert tuning.choose("k1", space, lambda c: pytest.fail("tuned again")) == space[1]
    assert tuning.counters["from_disk"] == before + 1
    tuning.forget()
