"""The attention pass beyond the kernel's parameters: score chains compiled into a generated ``score_mod``
(tilefuse/compiler/patterns/score_mod.py, codegen/score_mod.py, decision record 032) and ``nn.MultiheadAttention`` opened up
(tilefuse/compiler/patterns/mha.py).

Every compiled module is compared, forward and backward (q, k, v and every parameter, including the tensors a
generated mod reads), with a float64 eager copy of itself, on fresh random inputs read through the strides of a
(B, S, H, D) buffer (not contiguous), at odd lengths, with ``torch.empty`` poisoned (NaN) by deterministic mode.
``explain`` must show the one flash call and none of the attention's bmm / softmax; refused forms keep eager's
results and name their reason.
"""
from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import tilefuse
from tilefuse.compiler.patterns import attention as patterns_attention
from tilefuse.compiler.explain import collecting
from tilefuse.kernels.attention import ops_score_mod

from tests.support import assert_close

B, H, S, D = 2, 4, 33, 16
F32, F16 = torch.float32, torch.float16
TOL = {F32: 2e-5, F16: 3e-3}
GRAD_TOL = {F32: 2e-5, F16: 3e-3}
LEFTOVERS = ("aten.bmm", "aten.amax", "aten.exp", "aten._softmax", "aten._scaled_dot_product", "aten.sin")
MOD_CALLS = ("tilefuse.attention_mod_fwd.default", "tilefuse.attention_mod_bwd.default")
FLASH_CALLS = ("tilefuse.attention_fwd.default", "tilefuse.attention_bwd.default")


@pytest.fixture(autouse=True)
def _fresh_dynamo_poisoned_empty():
    """A fresh Dynamo; torch.empty filled with NaN (deterministic mode) so an unwritten element shows up;
    tensors made where tilefuse runs kernels."""
    from tilefuse import device

    torch._dynamo.reset()
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    torch.use_deterministic_algorithms(True, warn_only=True)
    with torch.device(device.torch_device()):
        yield
    torch.use_deterministic_algorithms(before[0], warn_only=before[1])
    torch._dynamo.reset()


def bshd(Bn, Sn, Hn, Dn, dtype):
    """(B, H, S, D) values viewed from a (B, S, H, D) buffer (the layout models pass)."""
    return torch.randn(Bn, Sn, Hn, Dn).to(dtype).transpose(1, 2)


def rel_index(Sq, Sk, device):
    i = torch.arange(Sq, device=device)[:, None]
    j = torch.arange(Sk, device=device)[None, :]
    return i, j


# ------------------------------------------------------------------------------------ score chains
class PerHeadScale(nn.Module):
    """A learned per-head temperature on the scaled scores, then a causal -inf fill from arange (a band)."""
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.rand(H) + 0.5)

    def forward(self, q, k, v):
        s = (q @ k.transpose(-2, -1)) * D ** -0.5
        s = s * self.w.view(1, -1, 1, 1)
        i, j = rel_index(q.shape[2], k.shape[2], q.device)
        s = s.masked_fill(j > i, float("-inf"))
        return s.softmax(-1) @ v


class SinResidual(nn.Module):
    """The scores used twice: ``s + sin(s)`` (no kernel parameter combines the scores with themselves)."""
    def forward(self, q, k, v):
        s = (q @ k.transpose(-2, -1)) / 4.0
        s = s + torch.sin(s)
        return F.softmax(s, dim=-1) @ v


class BucketBias(nn.Module):
    """T5's log-spaced relative-position buckets (``bucket(j - i)``: exact below 4, logarithmic to 16, a
    direction bit) looking up a learned (buckets, heads) table, then a threshold ``where``."""
    def __init__(self):
        super().__init__()
        self.table = nn.Parameter(torch.randn(16, H) * 0.5)

    def forward(self, q, k, v):
        i, j = rel_index(q.shape[2], k.shape[2], q.device)
        rel = j - i
        dist = rel.abs()
        far = 4 + (torch.log(dist.float().clamp(min=1) / 4) / math.log(16 / 4) * 4).long()
        bucket = torch.where(dist < 4, dist, far.clamp(max=7)) + (rel > 0).long() * 8
        bias = self.table[bucket].permute(2, 0, 1)
        s = q @ k.transpose(-2, -1) * 0.25 + bias
        s = torch.where(s > 0.5, s, s * 0.5)
        return s.softmax(-1) @ v


class WhereThreshold(nn.Module):
    def forward(self, q, k, v):
        s = torch.matmul(q, k.transpose(2, 3)) * 0.25
        s = torch.where(s > 0.1, s, s * 0.5)
        return torch.softmax(s, -1) @ v


class IndexExpression(nn.Module):
    """A user's expression in the indices multiplying the scores, then a sliding window from arange."""
    def forward(self, q, k, v):
        i, j = rel_index(q.shape[2], k.shape[2], q.device)
        s = (q @ k.transpose(-2, -1)) * 0.25
        s = s * (1.0 + 0.05 * (i - j).abs().float().sqrt())
        s = torch.where((j <= i) & (j > i - 8), s, float("-inf"))
        return s.softmax(-1) @ v


class FiniteFill(nn.Module):
    """A fill with -1e4, which scores can come near: not a mask but a value, computed by the generated mod
    (eager's weights exp(-1e4 - max) exactly, and its uniform rows where every key is filled)."""
    def forward(self, q, k, v):
        s = (q @ k.transpose(-2, -1)) * 0.25
        s = s.masked_fill(torch.ones(q.shape[2], k.shape[2], dtype=torch.bool).triu(1), -1e4)
        return s.softmax(-1) @ v


class QueryGate(nn.Module):
    """The mod reads a tensor computed from q (a gate per query row): q's gradient is the flash kernels' plus
    the one through the operand vector and the graph's own ops."""
    def forward(self, q, k, v):
        s = (q @ k.transpose(-2, -1)) * 0.25
        s = s * torch.sigmoid(q.sum(-1, keepdim=True)) + 0.1 * s * s
        return s.softmax(-1) @ v


class FullyMaskedRows(PerHeadScale):
    """Rows hidden everywhere by a finfo.min fill: eager's softmax averages v uniformly there."""
    def forward(self, q, k, v, hidden):
        s = (q @ k.transpose(-2, -1)) * D ** -0.5
        s = torch.sin(s) + s * self.w.view(1, -1, 1, 1)
        s = s.masked_fill(hidden, torch.finfo(s.dtype).min)
        return s.softmax(-1) @ v


class GroupedPerHeadScale(nn.Module):
    """GQA (two query heads a KV head, through repeat_interleave) with a learned scale per query head."""
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.rand(H) + 0.5)

    def forward(self, q, k, v):
        k, v = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
        s = (q @ k.transpose(-2, -1)) * 0.25
        s = s * self.w.view(1, -1, 1, 1) + 0.1 * torch.cos(s)
        return s.softmax(-1) @ v


class DroppedSin(nn.Module):
    """``s + sin(s)``, softmax, dropout of the probabilities (training); ``keep`` replays a given dropout mask."""
    p = 0.25

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.rand(H) + 0.5)

    def forward(self, q, k, v, keep=None):
        s = (q @ k.transpose(-2, -1)) * 0.25
        s = s * self.w.view(1, -1, 1, 1) + torch.sin(s)
        probs = s.softmax(-1)
        probs = F.dropout(probs, self.p, training=True) if keep is None else probs * keep / (1 - self.p)
        return probs @ v


# ------------------------------------------------------------------------------------ harness
def compile_and_compare(model: nn.Module, q, k, v, *rest, dtype=F32):
    """Compile ``model`` (in ``dtype``), run forward and backward, compare with a float64 eager copy (every
    gradient); returns the explanation with the backward graph's report joined."""
    model = model.to(dtype)
    ref = copy.deepcopy(model).double()
    leaves = [t.to(dtype).requires_grad_() for t in (q, k, v)]
    leaves64 = [t.detach().double().requires_grad_() for t in leaves]
    expected = ref(*leaves64, *rest)
    g = torch.randn_like(expected)
    expected.backward(g)
    explanation = tilefuse.explain(model, *leaves, *rest)
    for t in leaves:
        t.grad = None
    model.zero_grad()
    with collecting(explanation.attention) as graphs:
        explanation.result.backward(g.to(dtype))
    explanation.graphs.extend(graphs)
    assert explanation.result.dtype == dtype
    assert_close(explanation.result, expected, tol=TOL[dtype], what="output")
    for name, t, t64 in zip("qkv", leaves, leaves64):
        assert_close(t.grad, t64.grad, tol=GRAD_TOL[dtype], what=f"d{name}")
    for (name, p), (_, p64) in zip(model.named_parameters(), ref.named_parameters()):
        assert p.grad is not None and p.grad.abs().sum() > 0, f"no gradient for {name}"
        assert_close(p.grad, p64.grad, tol=GRAD_TOL[dtype], what=f"gradient of {name}")
    return explanation


def assert_one_attention_kernel(explanation, calls=MOD_CALLS, backward=True):
    matched = [o for o in explanation.attention if o.reason is None]
    assert len(matched) == 1, str(explanation)
    ops = [op for _, op in explanation.library_calls]
    assert ops == (list(calls) if backward else [calls[0]]), str(explanation)
    leftovers = [origin for kern in explanation.kernels for origin in kern.fuses
                 if any(origin.split(":")[-1].startswith(op) for op in LEFTOVERS)]
    leftovers += [op for g in explanation.graphs for _, op, *_ in g.externs if op.startswith(LEFTOVERS)]
    assert not leftovers, f"ops of the attention remain: {leftovers}\n{explanation}"
    assert not explanation.fallbacks, str(explanation)
    return matched[0]


# ------------------------------------------------------------------------------------ generated score_mods
@pytest.mark.parametrize("make,dtype,detail", [
    (PerHeadScale, F32, "scale 0.25, window (-1, 0)"),
    (PerHeadScale, F16, "scale 0.25, window (-1, 0)"),
    (SinResidual, F32, "scale 0.25"),
    (BucketBias, F32, "scale 0.25"),
    (BucketBias, F16, "scale 0.25"),
    (WhereThreshold, F32, "scale 0.25"),
    (IndexExpression, F32, "scale 0.25, window (7, 0)"),
    (FiniteFill, F32, "scale 0.25"),
    (QueryGate, F32, "scale 0.25"),
], ids=["per-head-scale", "per-head-scale-fp16", "sin-residual", "bucket-bias", "bucket-bias-fp16",
        "where-threshold", "index-expression", "finite-fill", "query-gate"])
def test_generated_score_mod(make, dtype, detail):
    """Forward and backward as float64 eager (the learned tensors the mod reads get their gradients); the
    parameter forms still apply around the generated code (the scale, the band)."""
    explanation = compile_and_compare(make(), bshd(B, S, H, D, dtype), bshd(B, S, H, D, dtype),
                                      bshd(B, S, H, D, dtype), dtype=dtype)
    outcome = assert_one_attention_kernel(explanation)
    assert outcome.detail.startswith(detail + ", generated score_mod tfsm_"), str(explanation)


def test_generated_score_mod_with_unequal_lengths():
    """Sq != Sk (7 queries, 33 keys; neither a block multiple) with a mod in the indices: padded rows and keys
    of both tiles."""
    explanation = compile_and_compare(IndexExpression(), bshd(1, 7, H, D, F32), bshd(1, S, H, D, F32),
                                      bshd(1, S, H, D, F32))
    assert_one_attention_kernel(explanation)


def test_generated_score_mod_with_gqa():
    """K/V with half the heads: the kernel reads KV head h // 2, the mod's per-head scale is the query head's."""
    explanation = compile_and_compare(GroupedPerHeadScale(), bshd(B, S, H, D, F32), bshd(B, S, H // 2, D, F32),
                                      bshd(B, S, H // 2, D, F32))
    outcome = assert_one_attention_kernel(explanation)
    assert "GQA group 2" in outcome.detail


def test_dropout_after_a_generated_score_mod():
    """The kernel's counter-based dropout with a generated mod, forward and backward (the operand gradient
    regenerates the same mask): against float64 eager with the kernel's keep mask for the seed the op drew."""
    from tilefuse.kernels.attention import dropout_mask

    model = DroppedSin()
    ref = copy.deepcopy(model).double()
    q, k, v = (bshd(B, S, H, D, F32).requires_grad_() for _ in range(3))
    compiled = torch.compile(model, backend="tilefuse")
    torch.manual_seed(1234)
    out = compiled(q, k, v)
    torch.manual_seed(1234)
    seed = int(torch.randint(0, 2 ** 31 - 1, (1,)).item())
    keep = dropout_mask(seed, B, H, S, S, DroppedSin.p)
    leaves64 = [t.detach().double().requires_grad_() for t in (q, k, v)]
    expected = ref(*leaves64, keep)
    assert_close(out, expected, tol=TOL[F32], what="output")
    g = torch.randn_like(out)
    out.backward(g)
    expected.backward(g.double())
    for name, t, t64 in zip("qkv", (q, k, v), leaves64):
        assert_close(t.grad, t64.grad, tol=GRAD_TOL[F32], what=f"d{name}")
    assert_close(model.w.grad, ref.w.grad, tol=GRAD_TOL[F32], what="gradient of w")
    assert (keep == 0).any()


def test_fully_masked_rows_match_eager():
    """Rows whose every key is filled with finfo.min: eager's uniform average (and no NaN), the mod's tensors
    still get eager's gradient."""
    hidden = torch.rand(B, 1, S, S) < 0.3
    hidden[0, :, 3] = True
    hidden[1, :, 10:12] = True
    explanation = compile_and_compare(FullyMaskedRows(), bshd(B, S, H, D, F32), bshd(B, S, H, D, F32),
                                      bshd(B, S, H, D, F32), hidden)
    outcome = assert_one_attention_kernel(explanation)
    assert "boolean mask" in outcome.detail
    assert torch.isfinite(explanation.result).all()


def test_generated_source_comes_from_the_lowering():
    """The bucket lookup is generated code: index arithmetic on q_idx / k_idx, a log, an indirect load of the
    table from the operand vector; the derivative reads the same operands; the same chain compiled again (its
    module read back from the disk cache) gets the same key (the digest of its source)."""
    model = BucketBias()
    q, k, v = (bshd(B, S, H, D, F32) for _ in range(3))
    first = tilefuse.explain(model, q, k, v).attention[0]
    key = first.detail.split("generated score_mod ")[1].split(" ")[0]
    source = ops_score_mod.lookup(key).source
    fwd, bwd = source.split("def score_mod(")[1].split("def score_mod_grad(")
    assert "score, b, h, q_idx, k_idx, operands" in fwd
    assert "k_idx" in fwd and "q_idx" in fwd and "tl.log(" in fwd and "tl.load(operands" in fwd
    assert "tl.where(" in bwd  # d/ds of where(s > 0.5, s, s / 2)
    from tilefuse import diskcache

    path = diskcache.folder("attention", "score_mods") / f"{key}.py"
    assert path.read_text() == source
    ops_score_mod._MODS.clear()  # as in a new process: the module is found on disk under the same key
    torch._dynamo.reset()
    again = tilefuse.explain(model, q, k, v)
    assert again.attention[0].detail == first.detail
    assert_close(again.result, model(q, k, v), tol=1e-5)


class ReadsRowMean(nn.Module):
    def forward(self, q, k, v):
        s = q @ k.transpose(-2, -1) * 0.25
        s = s * torch.sigmoid(s.mean(-1, keepdim=True))
        return s.softmax(-1) @ v


class ReadsTranspose(nn.Module):
    def forward(self, q, k, v):
        s = q @ k.transpose(-2, -1) * 0.25
        s = s + 0.1 * torch.sin(s.transpose(-1, -2))
        return s.softmax(-1) @ v


class IntegerOperand(nn.Module):
    def forward(self, q, k, v, offsets):
        s = q @ k.transpose(-2, -1) * 0.25
        s = s * (1 + offsets)
        return s.softmax(-1) @ v


class RandomInChain(nn.Module):
    def forward(self, q, k, v):
        s = q @ k.transpose(-2, -1) * 0.25
        s = s * (1 + 0.01 * torch.rand_like(s))
        return s.softmax(-1) @ v


@pytest.mark.parametrize("make,extra,reason", [
    (ReadsRowMean, (), "the score chain computes a reduction"),
    (ReadsTranspose, (), "reads the scores at other positions"),
    (IntegerOperand, (torch.randint(0, 3, (1, H, 1, 1)),), "int64 tensor"),
    (RandomInChain, (), "random numbers in the score chain"),
], ids=["row-mean", "transpose", "integer-operand", "random"])
def test_refused_chains_keep_eager_results_and_say_why(make, extra, reason):
    model = make()
    q, k, v = (bshd(B, S, H, D, F32) for _ in range(3))
    explanation = tilefuse.explain(model, q, k, v, *extra)
    [outcome] = explanation.attention
    assert outcome.reason is not None and "nor as a generated score_mod" in outcome.reason \
        and reason in outcome.reason, str(explanation)
    assert reason in str(explanation)
    assert not explanation.library_calls
    if make is not RandomInChain:
        assert_close(explanation.result, model(q, k, v, *extra), tol=1e-5)


def test_an_unregistered_mod_is_a_clear_error():
    q = bshd(1, 5, 2, 8, F32)
    with pytest.raises(ValueError, match="is not registered in this process"):
        torch.ops.tilefuse.attention_mod_fwd(q, q, q, None, None, 1.0, 0, -1, -1, 0.0, "tfsm_0000")


# ------------------------------------------------------------------------------------ nn.MultiheadAttention
class Encoder(nn.Module):
    """An nn.MultiheadAttention self-attention with a key-padding mask (the model's output is the attention
    output only)."""
    def __init__(self, batch_first=True, need_weights=False, **kw):
        super().__init__()
        self.mha = nn.MultiheadAttention(4 * D, H, batch_first=batch_first, **kw)
        self.need_weights = need_weights

    def forward(self, x, key_padding_mask=None, attn_mask=None):
        out, _ = self.mha(x, x, x, key_padding_mask=key_padding_mask, attn_mask=attn_mask,
                          need_weights=self.need_weights)
        return out


def compare_mha(model, x, *rest, train=True, grad=True):
    model = model.train(train)
    ref = copy.deepcopy(model).double()
    x = x.clone().requires_grad_(grad)
    x64 = x.detach().double().requires_grad_(grad)
    rest64 = tuple(r.double() if isinstance(r, torch.Tensor) and r.is_floating_point() else r for r in rest)
    expected = ref(x64, *rest64)
    explanation = tilefuse.explain(model, x, *rest)
    assert_close(explanation.result, expected, tol=2e-5, what="output")
    if grad:
        g = torch.randn_like(expected)
        expected.backward(g)
        with collecting(explanation.attention) as graphs:
            explanation.result.backward(g.float())
        explanation.graphs.extend(graphs)
        assert_close(x.grad, x64.grad, tol=2e-5, what="input gradient")
        for (name, p), (_, p64) in zip(model.named_parameters(), ref.named_parameters()):
            assert_close(p.grad, p64.grad, tol=2e-5, what=f"gradient of {name}")
    return explanation


def test_multihead_attention_training_with_key_padding():
    """Training (need_weights=False: SDPA inside F.multi_head_attention_forward), batch-first, a key-padding
    mask, odd length: one flash call forward and backward."""
    x = torch.randn(B, S, 4 * D)
    pad = torch.zeros(B, S, dtype=torch.bool)
    pad[1, -6:] = True
    explanation = compare_mha(Encoder(), x, pad)
    outcome = assert_one_attention_kernel(explanation, FLASH_CALLS)
    assert outcome.form == "sdpa"


def test_multihead_attention_sequence_first_with_a_causal_mask_and_separate_projections():
    """batch_first=False, kdim/vdim (separate projection weights), a boolean causal attn_mask."""
    x = torch.randn(S, B, 4 * D)
    causal = torch.ones(S, S, dtype=torch.bool).triu(1)
    model = Encoder(batch_first=False, kdim=4 * D, vdim=4 * D)
    model.mha._qkv_same_embed_dim = False  # separate q/k/v weights (what kdim != embed_dim gives)
    model.mha.q_proj_weight = nn.Parameter(torch.randn(4 * D, 4 * D) * 0.1)
    model.mha.k_proj_weight = nn.Parameter(torch.randn(4 * D, 4 * D) * 0.1)
    model.mha.v_proj_weight = nn.Parameter(torch.randn(4 * D, 4 * D) * 0.1)
    model.mha.in_proj_weight = None
    explanation = compare_mha(model, x, None, causal)
    assert_one_attention_kernel(explanation, FLASH_CALLS)


def test_multihead_attention_weights_not_read_are_no_obstacle():
    """need_weights=True whose averaged weights the model drops: the same output, matched."""
    explanation = compare_mha(Encoder(need_weights=True), torch.randn(B, S, 4 * D))
    assert_one_attention_kernel(explanation, FLASH_CALLS)


def test_multihead_attention_inference():
    """eval() under no_grad (the inference path): one flash call."""
    with torch.no_grad():
        explanation = compare_mha(Encoder(), torch.randn(B, S, 4 * D), train=False, grad=False)
    assert_one_attention_kernel(explanation, FLASH_CALLS, backward=False)


def test_multihead_attention_float16_inference():
    """A float16 model against its float64 eager copy (float16 tolerance)."""
    model = Encoder().half().eval()
    ref = copy.deepcopy(model).double()
    x = torch.randn(B, S, 4 * D)
    pad = torch.zeros(B, S, dtype=torch.bool)
    pad[0, -3:] = True
    with torch.no_grad():
        explanation = tilefuse.explain(model, x.half(), pad)
        expected = ref(x.double(), pad)
    assert_one_attention_kernel(explanation, FLASH_CALLS, backward=False)
    assert explanation.result.dtype == F16
    assert_close(explanation.result, expected, tol=TOL[F16], what="fp16 output")


def test_multihead_attention_fully_padded_sequence_matches_eager():
    """A batch row whose every key is padded (torch's float mask is -inf on all of it): eager's SDPA gives that
    row zeros (then the out-projection's bias), and so does the kernel; forward and backward as float64 eager."""
    pad = torch.zeros(B, S, dtype=torch.bool)
    pad[1] = True
    pad[0, -4:] = True
    model = Encoder()
    with torch.no_grad():
        model.mha.out_proj.bias.normal_()
    explanation = compare_mha(model, torch.randn(B, S, 4 * D), pad)
    assert_one_attention_kernel(explanation, FLASH_CALLS)
    assert torch.isfinite(explanation.result).all()


def test_multihead_attention_returned_weights_are_a_reason_not_to_match():
    class Weights(Encoder):
        def forward(self, x):
            out, weights = self.mha(x, x, x, need_weights=True)
            return out + weights.mean()

    model = Weights()
    x = torch.randn(B, S, 4 * D)
    explanation = tilefuse.explain(model, x)
    [outcome] = explanation.attention
    assert outcome.form == "multi_head_attention" and "weights are used" in outcome.reason, str(explanation)
    assert "weights are used" in str(explanation)
    assert not explanation.library_calls
    assert_close(explanation.result, model(x), tol=1e-6)


def test_native_fast_path_call_is_matched():
    """torch._native_multi_head_attention (the inference fast path's one op), called as nn.MultiheadAttention
    calls it: its traced implementation's SDPA becomes the flash kernel."""
    mha = nn.MultiheadAttention(4 * D, H, batch_first=True).eval()
    x = torch.randn(B, S, 4 * D)

    def fast(t):
        return torch._native_multi_head_attention(t, t, t, 4 * D, H, mha.in_proj_weight, mha.in_proj_bias,
                                                  mha.out_proj.weight, mha.out_proj.bias, None, False)[0]

    with torch.no_grad():
        expected = fast(x)
        explanation = tilefuse.explain(fast, x)
    assert_one_attention_kernel(explanation, FLASH_CALLS, backward=False)
    assert_close(explanation.result, expected, tol=2e-5)


def test_pass_switched_off_leaves_the_call():
    with patterns_attention.switched_off(), torch.no_grad():
        explanation = tilefuse.explain(Encoder().eval(), torch.randn(B, S, 4 * D))
    assert not explanation.attention and not explanation.library_calls


class TooSmallTable(nn.Module):
    """A relative-position table with fewer rows than the distances the chain indexes it with (|j - i| up to
    S - 1 = 32 against 16 rows): eager raises; the generated mod's bounds assert must too, never read past it."""
    def __init__(self):
        super().__init__()
        self.table = nn.Parameter(torch.randn(16, H))

    def forward(self, q, k, v):
        i, j = rel_index(q.shape[2], k.shape[2], q.device)
        bias = self.table[(j - i).abs()].permute(2, 0, 1)
        s = q @ k.transpose(-2, -1) * 0.25 + bias
        s = torch.where(s > 0.5, s, s * 0.5)
        return s.softmax(-1) @ v


def test_a_bounds_assert_in_a_generated_mod_is_compiled_with_the_debug_option(monkeypatch):
    """A mod with a table lookup carries a device assert; the attention kernels that call it are launched with
    Triton's debug option (without it a GPU build drops the assert and an out-of-range index reads past the
    table). A mod without one adds no option."""
    from tilefuse.compiler.codegen import ASSERT_OPTIONS
    from tilefuse.kernels.attention import launch

    seen = []
    real_site = launch.site

    def spy(kernel, grid, tensors, constexprs, options, real=()):  # every launch goes through a kept site
        if getattr(kernel, "__name__", "") in ("attn_fwd_kernel", "attn_bwd_dkdv_kernel", "attn_bwd_dq_kernel"):
            seen.append({k: options[k] for k, _ in ASSERT_OPTIONS if k in options})
        return real_site(kernel, grid, tensors, constexprs, options, real)

    monkeypatch.setattr(launch, "site", spy)
    monkeypatch.setattr(launch, "_forward_launches", {})  # (a forward's sites are kept by its call: asked once)
    q, k, v = (bshd(B, S, H, D, F32).requires_grad_() for _ in range(3))
    checked = tilefuse.explain(BucketBias(), q, k, v).attention[0]
    mod = ops_score_mod.lookup(checked.detail.split("generated score_mod ")[1].split(" ")[0])
    assert "tl.device_assert(" in mod.source and mod.launch_options == ASSERT_OPTIONS
    seen.clear()  # explain ran the forward once
    launch._forward_launches.clear()
    out = torch.compile(BucketBias(), backend="tilefuse")(q, k, v)
    out.sum().backward()
    assert len(seen) == 3 and all(s == dict(ASSERT_OPTIONS) for s in seen), seen  # forward, dK/dV, dQ
    seen.clear()
    torch._dynamo.reset()
    plain = tilefuse.explain(SinResidual(), q, k, v).attention[0]
    plain_mod = ops_score_mod.lookup(plain.detail.split("generated score_mod ")[1].split(" ")[0])
    assert "tl.device_assert(" not in plain_mod.source and plain_mod.launch_options == ()
    assert seen and all(s == {} for s in seen), seen


def test_an_out_of_range_lookup_in_a_generated_mod_raises_as_eager_does():
    model = TooSmallTable()
    q, k, v = (bshd(B, S, H, D, F32) for _ in range(3))
    with pytest.raises(IndexError):
        model(q, k, v)
    with pytest.raises(Exception, match="out of bounds"):
        torch.compile(model, backend="tilefuse")(q, k, v)
