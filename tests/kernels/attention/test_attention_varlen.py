"""Packed variable-length sequences (tilefuse.attention_varlen) against a float64 reference that runs plain
attention on each sequence alone.

Every case runs forward and backward with outputs poisoned (torch's deterministic mode fills ``torch.empty``
with NaN) and q/k/v read through the strides of slices of wider packed buffers (a fused qkv projection), as
models pass them. Sequence lengths include 0, 1, 7 and 129 (not a multiple of the interpreter's 32-row tiles).
"""
from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import tilefuse
from tilefuse.kernels import attention as attn

from tests.support import assert_close, moved_to
from .test_attention import quadratic_bias, quadratic_bias_grad, quadratic_bias_ref, reference

HERE = Path(__file__).resolve().parents[2]  # tests/
GRAD_TOLERANCE = {torch.float32: 1e-5, torch.float16: 3e-3}
F32, F16 = torch.float32, torch.float16


@pytest.fixture(autouse=True)
def poisoned_outputs_on_the_device():
    """torch.empty / empty_like return NaN-filled tensors while deterministic algorithms are on."""
    from tilefuse import device

    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    torch.use_deterministic_algorithms(True, warn_only=True)
    assert torch.utils.deterministic.fill_uninitialized_memory
    with torch.device(device.torch_device()):
        yield
    torch.use_deterministic_algorithms(before[0], warn_only=before[1])


def cumulative(lengths) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths, dtype=torch.int64).cumsum(0).tolist()], dtype=torch.int32)


def packed_qkv(lens_q, lens_k, H, H_kv, D, dtype):
    """q a slice of a packed (total_q, H + 2 H_kv, D) qkv buffer, k/v slices of a (total_k, 2, H_kv, D) one."""
    tq, tk = sum(lens_q), sum(lens_k)
    qkv = torch.randn(tq, H + 2 * H_kv, D).to(dtype)
    kv = torch.randn(tk, 2, H_kv, D).to(dtype)
    q = qkv[:, :H].requires_grad_()
    k, v = kv[:, 0].requires_grad_(), kv[:, 1].requires_grad_()
    assert not (q.is_contiguous() or k.is_contiguous() or v.is_contiguous()) or tq * tk == 0
    return q, k, v


def reference_varlen(q, k, v, lens_q, lens_k, *, alibi=None, score_mod=None, keeps=None, **kwargs):
    """Plain attention on each sequence alone (float64, autograd-able), packed back: (total_q, H, D)."""
    outs, sq0, sk0 = [], 0, 0
    for b, (sq, sk) in enumerate(zip(lens_q, lens_k)):
        qs = q[sq0:sq0 + sq].transpose(0, 1)[None].double()
        ks = k[sk0:sk0 + sk].transpose(0, 1)[None].double()
        vs = v[sk0:sk0 + sk].transpose(0, 1)[None].double()
        sq0, sk0 = sq0 + sq, sk0 + sk
        if sq == 0:
            continue
        if sk == 0:  # no key at all: the kernel's fully masked rows, 0
            outs.append(qs[0].transpose(0, 1) * 0)
            continue
        extra = {}
        if alibi is not None:
            extra["alibi"] = alibi if alibi.dim() == 1 else alibi[b]
        if score_mod is not None:
            extra["score_mod"] = lambda s, _b, h, i, j, b=b: score_mod(s, torch.tensor(b), h, i, j)
        if keeps is not None:
            extra["keep"] = keeps[b][None]
        outs.append(reference(qs, ks, vs, **kwargs, **extra)[0].transpose(0, 1))
    return torch.cat(outs) if outs else q.double() * 0


def run_case(lens_q, lens_k, H, H_kv, D, dtype, ref_kwargs=None, **kwargs):
    q, k, v = packed_qkv(lens_q, lens_k, H, H_kv, D, dtype)
    cu_q, cu_k = cumulative(lens_q), cumulative(lens_k)
    out = tilefuse.attention_varlen(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), **kwargs)
    assert out.shape == q.shape and out.dtype == dtype
    assert torch.isfinite(out).all()
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    rk = {n: kwargs[n] for n in ("causal", "window", "softcap", "alibi", "dropout_p", "scale") if n in kwargs}
    rk.update(ref_kwargs or {})
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref = reference_varlen(*leaves, lens_q, lens_k, **rk)
    ref_grads = torch.autograd.grad(ref, leaves, dout.double(), allow_unused=True)
    assert_close(out, ref, dtype, what="out")
    for name, g, r, leaf in zip(("dq", "dk", "dv"), grads, ref_grads, leaves):
        r = torch.zeros_like(leaf) if r is None else r
        assert g.shape == r.shape and g.dtype == dtype and torch.isfinite(g).all(), name
        assert_close(g, r, dtype, tol=GRAD_TOLERANCE[dtype], what=name)
    return out, grads


CASES = [
    # id, lengths of q, lengths of k, (H, H_kv, D), dtype, attention_varlen kwargs
    ("plain-odd-lengths", [1, 7, 129, 0, 33], None, (2, 2, 32), F32, {}),
    ("plain-fp16-d80", [7, 129, 1], None, (3, 3, 80), F16, {}),
    ("causal-gqa-sq!=sk", [7, 0, 40, 33], [20, 5, 33, 65], (4, 2, 32), F16, {"causal": True}),
    ("causal-bottom-right-sq>sk", [7, 33, 1, 9], [40, 10, 1, 0], (2, 1, 32), F32, {"causal": "bottom_right"}),
    ("window", [129, 7, 0, 1], None, (2, 2, 64), F16, {"window": (8, 4)}),
    ("window-bottom-right", [20, 7, 1, 9], [40, 7, 30, 3], (2, 1, 32), F16,
     {"window": (6, None), "causal": "bottom_right"}),
    ("window-causal-softcap-alibi-mqa", [65, 1, 30], [65, 9, 40], (4, 1, 32), F32,
     {"window": (20, None), "causal": True, "softcap": 3.0, "alibi": "BH", "scale": 0.3}),
    ("alibi-bottom-right-fp16", [33, 5], [70, 5], (2, 2, 32), F16, {"alibi": "H", "causal": "bottom_right"}),
    ("score-mod", [40, 3], [33, 7], (2, 2, 32), F32, {"score_mod": True}),
    ("deterministic-fp16", [65, 0, 7], [65, 3, 0], (4, 2, 32), F16, {"deterministic": True, "causal": True}),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_varlen_forward_and_backward_match_per_sequence_reference(case):
    _, lens_q, lens_k, (H, H_kv, D), dtype, kwargs = case
    lens_k = lens_q if lens_k is None else lens_k
    kwargs = dict(kwargs)
    ref_kwargs = {}
    if kwargs.get("alibi") == "H":
        kwargs["alibi"] = torch.rand(H) * 0.5 + 0.1
    elif kwargs.get("alibi") == "BH":
        kwargs["alibi"] = torch.rand(len(lens_q), H) * 0.5 + 0.1
    if kwargs.pop("score_mod", False):
        kwargs.update(score_mod=quadratic_bias, score_mod_grad=quadratic_bias_grad)
        ref_kwargs["score_mod"] = quadratic_bias_ref
    run_case(lens_q, lens_k, H, H_kv, D, dtype, ref_kwargs, **kwargs)


def test_fully_masked_rows_and_empty_key_sequences_give_zeros_not_nan():
    """Bottom-right with Sq > Sk leaves a sequence's first rows no key; a sequence with no keys at all leaves
    every row none: 0 output, 0 gradient, -inf logsumexp, never NaN."""
    lens_q, lens_k = [33, 5, 7], [10, 0, 7]
    out, grads = run_case(lens_q, lens_k, 2, 2, 32, F32, causal="bottom_right")
    assert (out[:23] == 0).all() and (out[33:38] == 0).all() and (out[38:] != 0).any()
    assert (grads[0][:23] == 0).all() and (grads[0][33:38] == 0).all()
    q, k, v = (t.detach() for t in packed_qkv(lens_q, lens_k, 2, 2, 32, F32))
    _, lse = attn.attention_varlen_with_lse(q, k, v, cumulative(lens_q), cumulative(lens_k), 33, 10,
                                            causal="bottom_right")
    assert lse.shape == (2, 45)
    assert torch.isneginf(lse[:, :23]).all() and torch.isneginf(lse[:, 33:38]).all()
    assert torch.isfinite(lse[:, 23:33]).all() and torch.isfinite(lse[:, 38:]).all()


def test_lse_matches_per_sequence_logsumexp():
    lens_q, lens_k = [7, 40], [33, 9]
    q, k, v = (t.detach() for t in packed_qkv(lens_q, lens_k, 4, 2, 32, F32))
    out, lse = attn.attention_varlen_with_lse(q, k, v, cumulative(lens_q), cumulative(lens_k), 40, 33, causal=True)
    want, s0, k0 = [], 0, 0
    for sq, sk in zip(lens_q, lens_k):
        qs = q[s0:s0 + sq].double().transpose(0, 1)
        ks = k[k0:k0 + sk].double().transpose(0, 1).repeat_interleave(2, 0)
        s = qs @ ks.transpose(-1, -2) / math.sqrt(32)
        s = s.masked_fill(torch.arange(sk)[None, :] > torch.arange(sq)[:, None], float("-inf"))
        want.append(torch.logsumexp(s, -1))
        s0, k0 = s0 + sq, k0 + sk
    assert_close(lse, torch.cat(want, 1), F32, what="lse")


@pytest.mark.parametrize("dtype, causal", [(F32, False), (F16, "bottom_right")])
def test_dropout_streams_per_sequence_and_backward_regenerates_them(dtype, causal):
    lens_q, lens_k, H, p, seed = [33, 0, 7], [40, 5, 7], 4, 0.3, 4321
    cu_q, cu_k = cumulative(lens_q), cumulative(lens_k)
    keeps = attn.dropout_mask_varlen(seed, cu_q, cu_k, H, p)
    assert [tuple(m.shape) for m in keeps] == [(H, 33, 40), (H, 0, 5), (H, 7, 7)]
    assert abs(torch.cat([m.flatten() for m in keeps]).float().mean().item() - (1 - p)) < 0.05
    run_case(lens_q, lens_k, H, 2, 32, dtype, {"keeps": keeps}, dropout_p=p, dropout_seed=seed, causal=causal)


def test_deterministic_is_bitwise_reproducible_and_matches_the_atomic_form(monkeypatch):
    from tilefuse.kernels.attention import tuning as attn_tuning

    lens = [65, 7, 0, 33]
    q, k, v = packed_qkv(lens, lens, 4, 2, 32, F16)
    cu = cumulative(lens)
    dout = torch.randn(q.shape, dtype=F16)

    def grads(det):
        out = tilefuse.attention_varlen(q, k, v, cu, cu, 65, 65, causal=True, deterministic=det)
        return torch.autograd.grad(out, (q, k, v), dout)

    first, second = grads(True), grads(True)
    monkeypatch.setattr(attn_tuning, "DEFAULT_ATOMIC_DQ", True)
    attn_tuning.forget()
    atomic = grads(False)
    attn_tuning.forget()
    for a, b, c in zip(first, second, atomic):
        assert torch.equal(a, b)
        assert_close(a, c.float(), F16)


def test_varlen_equals_padded_batch_attention_with_strided_head_dim():
    """Equal lengths: the packed call is the batched call; q read with a head-dim stride of 2."""
    B, S, H, D = 3, 33, 2, 32
    wide = torch.randn(B * S, H, 2 * D)
    q = wide[..., ::2]
    k, v = torch.randn(B * S, H, D), torch.randn(B * S, H, D)
    cu = cumulative([S] * B)
    out = tilefuse.attention_varlen(q, k, v, cu, cu, S, S, window=(5, 5))
    batched = attn.attention(*(t.view(B, S, H, D).transpose(1, 2) for t in (q, k, v)), window=(5, 5))
    if tilefuse.device.interpreting():
        assert torch.equal(out.view(B, S, H, D), batched.transpose(1, 2))
    else:  # two kernels compiled for other strides: the same sums, not always in one order of instructions
        assert_close(out.view(B, S, H, D), batched.transpose(1, 2), torch.float32, what="varlen vs batched")


def test_cu_seqlens_read_through_a_strided_view():
    lens = [7, 40, 1]
    q, k, v = (t.detach() for t in packed_qkv(lens, lens, 2, 2, 32, F32))
    cu = cumulative(lens)
    strided = torch.stack((cu, torch.full_like(cu, -5)), 1)[:, 0]  # every other int32 of a wider buffer
    assert strided.stride() == (2,)
    assert torch.equal(tilefuse.attention_varlen(q, k, v, strided, strided, 40, 40, causal=True),
                       tilefuse.attention_varlen(q, k, v, cu, cu, 40, 40, causal=True))


def test_no_tokens_at_all():
    q, k, v = (torch.randn(0, 2, 32, requires_grad=True) for _ in range(3))
    cu = torch.zeros(3, dtype=torch.int32)
    out = tilefuse.attention_varlen(q, k, v, cu, cu, 0, 0, causal=True)
    assert out.shape == (0, 2, 32)
    assert all(g.shape == (0, 2, 32) for g in torch.autograd.grad(out.sum(), (q, k, v)))


def _args(**over):
    a = dict(q=torch.randn(10, 2, 32), k=torch.randn(12, 2, 32), v=torch.randn(12, 2, 32),
             cu_seqlens_q=torch.tensor([0, 3, 10], dtype=torch.int32),
             cu_seqlens_k=torch.tensor([0, 5, 12], dtype=torch.int32), max_seqlen_q=7, max_seqlen_k=7)
    a.update(over)
    return a


BAD = [
    (dict(q=torch.randn(1, 10, 2, 32)), ValueError, "q must have rank 3 \\(total_tokens, heads, head_dim\\)"),
    (dict(k=torch.randn(12, 2, 32, dtype=F16)), TypeError, "share one dtype"),
    (dict(k=torch.randn(12, 2, 16), v=torch.randn(12, 2, 16)), ValueError, "head dims differ"),
    (dict(k=torch.randn(12, 3, 32), v=torch.randn(12, 3, 32)), ValueError, "kv heads must divide"),
    (dict(v=torch.randn(11, 2, 32)), ValueError, "k and v must have one shape"),
    (dict(q=torch.randn(1, 2, 32).expand(2 ** 29, 2, 32)), ValueError,
     "q packs 536870912 tokens: accepted totals are below 2\\^29"),
    (dict(cu_seqlens_q=torch.tensor([0, 3, 10])), TypeError, "cu_seqlens_q has dtype torch.int64: accepted dtype is "
                                                             "torch.int32"),
    (dict(cu_seqlens_k=[0, 5, 12]), TypeError, "cu_seqlens_k must be a torch.Tensor"),
    (dict(cu_seqlens_q=torch.tensor([[0, 3, 10]], dtype=torch.int32)), ValueError, "cu_seqlens_q has shape \\(1, 3\\)"),
    (dict(cu_seqlens_q=torch.tensor([0], dtype=torch.int32)), ValueError, "batch >= 1"),
    (dict(cu_seqlens_k=torch.tensor([0, 5, 9, 12], dtype=torch.int32)), ValueError,
     "cu_seqlens_q has 3 entries and cu_seqlens_k 4"),
    (dict(max_seqlen_q=-1), ValueError, "max_seqlen_q=-1: accepted values are ints >= 0"),
    (dict(max_seqlen_k=7.0), ValueError, "max_seqlen_k=7.0"),
    (dict(max_seqlen_q=11), ValueError, "max_seqlen_q=11 is longer than the 10 packed tokens"),
    (dict(cu_seqlens_q=torch.tensor([1, 3, 10], dtype=torch.int32)), ValueError, "cu_seqlens_q\\[0\\] is 1"),
    (dict(cu_seqlens_k=torch.tensor([0, 8, 7], dtype=torch.int32)), ValueError,
     "cu_seqlens_k decreases at index 2 \\(8 -> 7\\)"),
    (dict(cu_seqlens_q=torch.tensor([0, 3, 9], dtype=torch.int32)), ValueError,
     "cu_seqlens_q\\[-1\\] is 9 but the packed tensor has 10 tokens"),
    (dict(max_seqlen_q=6), ValueError, "max_seqlen_q=6 but sequence 1 of cu_seqlens_q has length 7"),
    (dict(causal="yes"), ValueError, "causal='yes': accepted values"),
    (dict(window=(-3, 1)), ValueError, "window left=-3"),
    (dict(alibi=torch.ones(3, 2)), ValueError, "alibi has shape \\(3, 2\\): accepted shapes are \\(2,\\) and "
                                               "\\(2, 2\\)"),
    (dict(dropout_p=1.5), ValueError, "dropout_p=1.5"),
    (dict(softcap=0), ValueError, "softcap=0"),
    (dict(score_mod=quadratic_bias, q=torch.randn(10, 2, 32, requires_grad=True)), ValueError,
     "needs score_mod_grad"),
    (dict(check_seqlens=1), TypeError, "check_seqlens must be a bool"),
    (dict(mask=torch.ones(10, 12, dtype=torch.bool)), TypeError, "unexpected keyword argument 'mask'"),
]


@pytest.mark.parametrize("bad, exc, match", BAD, ids=[m[:28] for _, _, m in BAD])
def test_argument_errors_name_the_argument_before_any_launch(bad, exc, match, monkeypatch):
    from tilefuse.kernels.attention import api

    monkeypatch.setattr(api, "forward_varlen", lambda *a, **k: pytest.fail("launched"))
    a = _args()
    # (the cases' tensors were made at import on the CPU: they go where the kernels run, beside the others)
    a.update({name: moved_to(val, a["q"].device) for name, val in bad.items()})
    with pytest.raises(exc, match=match):
        tilefuse.attention_varlen(a.pop("q"), a.pop("k"), a.pop("v"), a.pop("cu_seqlens_q"), a.pop("cu_seqlens_k"),
                                  a.pop("max_seqlen_q"), a.pop("max_seqlen_k"), **a)


def test_check_seqlens_false_reads_nothing_on_the_host(monkeypatch):
    """The documented sync is the only host read: skipped with check_seqlens=False (CUDA graphs)."""
    from tilefuse.kernels.attention import varlen

    monkeypatch.setattr(varlen, "check_seqlens_values", lambda *a: pytest.fail("read cu_seqlens"))
    a = _args()
    out = tilefuse.attention_varlen(*(a[n] for n in ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q",
                                                      "max_seqlen_k")), check_seqlens=False)
    assert torch.isfinite(out).all()


def test_exported_where_attention_is():
    assert tilefuse.attention_varlen is attn.attention_varlen
    assert "attention_varlen" in dir(tilefuse)


# --------------------------------------------------------------------------------- cross-compilation
def test_varlen_configs_cross_compile_with_the_matrix_instructions():
    """tests/compile_only/attention_varlen_checks.py in a child that is not on the interpreter: the varlen
    forward, dK/dV and dQ kernels on sm_90a (wgmma), gfx942 (v_mfma) and sm_80 (mma.sync), and the non-varlen
    launch of the same kernel differing from the varlen one only by the switch."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TILEFUSE_INTERPRET"] = "0"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(HERE / "compile_only" / "attention_varlen_checks.py")],
                          capture_output=True, text=True, env=env, cwd=HERE.parent, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


# ---------------------------------------------------------------------------------------------- gpu
@pytest.mark.gpu
def test_gpu_varlen_bf16_matches_sdpa_per_sequence():
    """Realistic packed batch on the GPU (tuned configs, tensor cores): each sequence against SDPA alone in fp32."""
    import torch.nn.functional as F

    lens_q = [1000, 4096, 17, 0, 2500]
    lens_k = [1000, 4096, 300, 64, 2500]
    H, H_kv, D, dtype = 16, 4, 128, torch.bfloat16
    q, k, v = (t.detach().cuda().requires_grad_() for t in packed_qkv(lens_q, lens_k, H, H_kv, D, dtype))
    cu_q, cu_k = cumulative(lens_q).cuda(), cumulative(lens_k).cuda()
    out = tilefuse.attention_varlen(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal="bottom_right")
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    leaves = [t.detach().float().requires_grad_() for t in (q, k, v)]
    refs, s0, k0 = [], 0, 0
    for sq, sk in zip(lens_q, lens_k):
        qs, ks, vs = (t.transpose(0, 1)[None] for t in (leaves[0][s0:s0 + sq], leaves[1][k0:k0 + sk],
                                                         leaves[2][k0:k0 + sk]))
        s0, k0 = s0 + sq, k0 + sk
        if sq:
            mask = torch.ones(sq, sk, dtype=torch.bool, device="cuda").tril(sk - sq)
            refs.append(F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, enable_gqa=True)[0].transpose(0, 1))
    ref = torch.cat(refs)
    ref_grads = torch.autograd.grad(ref, leaves, dout.float())
    assert_close(out, ref, dtype, what="out")
    for name, g, r in zip(("dq", "dk", "dv"), grads, ref_grads):
        assert_close(g, r, dtype, what=name)
