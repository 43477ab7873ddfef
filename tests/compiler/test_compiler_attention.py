"""The compiler's attention pass (tilefuse/compiler/patterns/attention.py): attention written in plain PyTorch or
with ``F.scaled_dot_product_attention``, compiled with the tilefuse backend, runs the flash family.

Each module is compiled in float32 and compared, forward and backward (input and parameter gradients), with a
float64 eager copy of itself; ``tilefuse.explain`` must show the match, the library calls
``tilefuse.attention_fwd`` (forward graph) and ``tilefuse.attention_bwd`` (backward graph), and none of the
ops of the attention it replaced (bmm, softmax or its decomposition). What is not matched keeps eager's
results and names its reason. Sizes: S = 33 (not a multiple of a block), head dim 16.
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

from tests.support import assert_close, record_instances

B, S, C = 2, 33, 32
TOL = 2e-5  # float32 against float64: norm-wise, the family's own fp32 tolerance scale
# ATen ops that only the attention's bmm/softmax (forward or backward) would leave in these modules' graphs
ATTENTION_LEFTOVERS = ("aten.bmm", "aten.amax", "aten.exp", "aten._softmax", "aten.expand")


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """A fresh Dynamo, and tensors made where tilefuse runs kernels (cuda on a GPU machine, else the CPU)."""
    from tilefuse import device

    torch._dynamo.reset()
    with torch.device(device.torch_device()):
        yield
    torch._dynamo.reset()


def x_device():
    from tilefuse import device

    return device.torch_device()


def _heads(x, H):
    b, s, c = x.shape
    return x.view(b, s, H, c // H).transpose(1, 2)


def _merge(y):
    b, h, s, d = y.shape
    return y.transpose(1, 2).reshape(b, s, h * d)


class Projections(nn.Module):
    def __init__(self, H=2, H_kv=None, bias=True):
        super().__init__()
        self.H, self.H_kv = H, H_kv or H
        d = C // H
        self.q = nn.Linear(C, C, bias=bias)
        self.kv = nn.Linear(C, 2 * d * self.H_kv)

    def qkv(self, x):
        k, v = self.kv(x).chunk(2, dim=-1)
        return _heads(self.q(x), self.H), _heads(k, self.H_kv), _heads(v, self.H_kv)


# ------------------------------------------------------------------------------------ the attentions
class MinGPT(Projections):
    """minGPT's CausalSelfAttention: a registered tril buffer, masked_fill with -inf."""
    def __init__(self):
        super().__init__()
        self.register_buffer("bias", torch.tril(torch.ones(64, 64)).view(1, 1, 64, 64))

    def forward(self, x):
        T = x.shape[1]
        q, k, v = self.qkv(x)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        return _merge(att @ v)


class ManualALiBi(Projections):
    """ALiBi written out: per-head slopes times the distance, subtracted from the scaled scores; causal."""
    def __init__(self):
        super().__init__(H=4)
        self.register_buffer("slopes", torch.tensor([2.0 ** (-8 * (h + 1) / 4) for h in range(4)]))

    def forward(self, x):
        T = x.shape[1]
        q, k, v = self.qkv(x)
        i = torch.arange(T, device=x.device).view(T, 1)
        j = torch.arange(T, device=x.device).view(1, T)
        bias = -self.slopes.view(-1, 1, 1) * (i - j).abs()
        att = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(q.shape[-1]) + bias
        att = att.masked_fill(j > i, float("-inf"))
        return _merge(att.softmax(dim=-1) @ v)


class Gemma2Softcap(Projections):
    """Gemma 2's eager attention: GQA through repeat_kv's expand/reshape, scaling, tanh softcap, an additive
    causal mask of finfo.min, softmax in float32 cast back, dropout (off in eval)."""
    def __init__(self, cap=5.0):
        super().__init__(H=4, H_kv=2)
        self.cap = cap

    @staticmethod
    def repeat_kv(x, n):
        b, h, s, d = x.shape
        return x[:, :, None, :, :].expand(b, h, n, s, d).reshape(b, h * n, s, d)

    def forward(self, x):
        T = x.shape[1]
        q, k, v = self.qkv(x)
        k, v = self.repeat_kv(k, 2), self.repeat_kv(v, 2)
        att = torch.matmul(q, k.transpose(2, 3)) * q.shape[-1] ** -0.5
        att = att / self.cap
        att = torch.tanh(att)
        att = att * self.cap
        mask = torch.full((T, T), torch.finfo(x.dtype).min, dtype=x.dtype, device=x.device).triu(1)
        att = att + mask[None, None]
        att = F.softmax(att, dim=-1, dtype=torch.float32).to(q.dtype)
        att = F.dropout(att, p=0.1, training=self.training)
        return _merge(torch.matmul(att, v))


class SlidingWindow(Projections):
    """A causal sliding window of 8 keys from arange comparisons, applied with torch.where; GQA through
    repeat_interleave."""
    def __init__(self, window=8):
        super().__init__(H=4, H_kv=1)
        self.window = window

    def forward(self, x):
        T = x.shape[1]
        q, k, v = self.qkv(x)
        k, v = k.repeat_interleave(4, dim=1), v.repeat_interleave(4, dim=1)
        i = torch.arange(T, device=x.device)[:, None]
        j = torch.arange(T, device=x.device)[None, :]
        visible = (j <= i) & (j > i - self.window)
        att = (q @ k.transpose(-1, -2)) * 0.25
        att = torch.where(visible, att, float("-inf"))
        return _merge(att.softmax(-1) @ v)


class T5RelativeBias(Projections):
    """T5's attention: no scaling, a learned relative position bias (an embedding of clamped distances)
    added to the scores; a padding mask on the keys (finfo.min) added as well."""
    def __init__(self, max_distance=6):
        super().__init__(H=4)
        self.max_distance = max_distance
        self.relative_attention_bias = nn.Embedding(2 * max_distance + 1, 4)

    def forward(self, x, key_padding):
        T = x.shape[1]
        q, k, v = self.qkv(x)
        ctx = torch.arange(T, device=x.device)[:, None]
        mem = torch.arange(T, device=x.device)[None, :]
        buckets = (mem - ctx).clamp(-self.max_distance, self.max_distance) + self.max_distance
        bias = self.relative_attention_bias(buckets).permute(2, 0, 1).unsqueeze(0)
        pad = key_padding[:, None, None, :].to(x.dtype) * torch.finfo(x.dtype).min
        scores = torch.matmul(q, k.transpose(3, 2)) + (bias + pad)
        weights = F.softmax(scores.float(), dim=-1).type_as(scores)
        return _merge(torch.matmul(weights, v))


class HandSoftmax(Projections):
    """The softmax written out: exp(s - max) / sum, with the max as torch.max's values."""
    def forward(self, x):
        q, k, v = self.qkv(x)
        s = (q @ k.transpose(-2, -1)) / 4.0
        e = torch.exp(s - s.max(dim=-1, keepdim=True)[0])
        return _merge((e / e.sum(dim=-1, keepdim=True)) @ v)


class Sdpa(Projections):
    """F.scaled_dot_product_attention as transformers' "sdpa" attention calls it."""
    def __init__(self, H_kv=2, **kw):
        super().__init__(H=4, H_kv=H_kv)
        self.kw = kw

    def forward(self, x, mask=None):
        q, k, v = self.qkv(x)
        return _merge(F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=self.H_kv != self.H,
                                                     **self.kw))


# ------------------------------------------------------------------------------------ harness
def compile_and_compare(model: nn.Module, *args, grad: bool = True, train: bool = False):
    """Compile ``model`` (float32), run forward (and backward), compare with a float64 eager copy; returns the
    explanation."""
    model = model.train(train)
    ref = copy.deepcopy(model).double()
    x = args[0].clone().requires_grad_(grad)
    x64 = args[0].double().clone().requires_grad_(grad)
    rest = args[1:]
    rest64 = tuple(a.double() if a.is_floating_point() else a for a in rest)
    expected = ref(x64, *rest64)
    g = torch.randn_like(expected)
    if grad:
        expected.backward(g)

    explanation = tilefuse.explain(model, x, *rest)  # (runs the model twice: eager by Dynamo's explain, compiled)
    if grad:
        x.grad = None
        model.zero_grad()
        with collecting(explanation.attention) as graphs:  # the backward graph's report joins the explanation
            explanation.result.backward(g.to(explanation.result.dtype))
        explanation.graphs.extend(graphs)
    assert_close(explanation.result, expected, tol=TOL, what="output")
    if grad:
        assert_close(x.grad, x64.grad, tol=TOL, what="input gradient")
        for (name, p), (_, p64) in zip(model.named_parameters(), ref.named_parameters()):
            assert_close(p.grad, p64.grad, tol=TOL, what=f"gradient of {name}")
    return explanation


def assert_matched(explanation, n: int = 1, backward: bool = True, unrelated_fallbacks: tuple = ()):
    matched = [o for o in explanation.attention if o.reason is None]
    assert len(matched) == n, f"expected {n} matched attention(s):\n{explanation}"
    ops = [op for _, op in explanation.library_calls]
    assert ops.count("tilefuse.attention_fwd.default") == n, str(explanation)
    if backward:
        assert ops.count("tilefuse.attention_bwd.default") == n, str(explanation)
    leftovers = [origin for k in explanation.kernels for origin in k.fuses
                 if any(origin.split(":")[-1].startswith(op) for op in ATTENTION_LEFTOVERS)]
    leftovers += [op for g in explanation.graphs for _, op, *_ in g.externs
                  if any(op.startswith(x) for x in ATTENTION_LEFTOVERS)]
    assert not leftovers, f"ops of the attention remain: {leftovers}\n{explanation}"
    fallbacks = [f for f in explanation.fallbacks if not any(op in f[0] for op in unrelated_fallbacks)]
    assert not fallbacks, str(explanation)


# ------------------------------------------------------------------------------------ tests
@pytest.mark.parametrize("make,detail", [
    (MinGPT, "scale 0.25, boolean mask"),  # (a registered buffer: its values may change, so it stays a mask)
    (ManualALiBi, "scale 0.3536, window (-1, 0), alibi"),  # (the causal fill from arange: a band; the bias: ALiBi)
    (Gemma2Softcap, "scale 0.3536, softcap 5, window (-1, 0), GQA group 2"),  # (the finfo.min triu: causal)
    (SlidingWindow, "scale 0.25, window (7, 0), GQA group 4"),
    (HandSoftmax, "scale 0.25"),
], ids=["mingpt", "alibi", "gemma2-softcap", "sliding-window", "hand-written-softmax"])
def test_plain_pytorch_attention_is_found(make, detail):
    """Found, forward and backward as float64 eager, with the chain mapped to these kernel parameters (masks
    computed from sizes only become the kernel's window: no mask tensor, tiles outside the band skipped)."""
    x = torch.randn(B, S, C)
    explanation = compile_and_compare(make(), x)
    assert_matched(explanation)
    assert [o.detail for o in explanation.attention] == [detail], str(explanation)


def test_t5_relative_position_bias_is_found():
    """The learned bias gets its gradient (the custom op's backward returns the score gradient for a mask
    that requires grad); a key-padding mask of finfo.min is summed into the same additive mask."""
    x = torch.randn(B, S, C)
    key_padding = torch.zeros(B, S, dtype=torch.bool)
    key_padding[1, -5:] = True
    model = T5RelativeBias()
    explanation = compile_and_compare(model, x, key_padding)
    assert_matched(explanation, unrelated_fallbacks=("index_put",))  # (the embedding's backward)
    assert model.relative_attention_bias.weight.grad.abs().sum() > 0


def test_fully_masked_rows_match_eager():
    """Query rows with no visible key: with a finfo.min fill eager averages v uniformly, and so does the
    compiled model (s + finfo.min == finfo.min in float32): no NaN, eager's numbers."""
    class RowMasked(Projections):
        fill = torch.finfo(torch.float32).min

        def forward(self, x, hidden):
            q, k, v = self.qkv(x)
            att = (q @ k.transpose(-2, -1)) * 0.25
            att = att.masked_fill(hidden, self.fill)
            return _merge(att.softmax(-1) @ v)

    hidden = torch.rand(B, 1, S, S) < 0.3
    hidden[0, 0, 3] = True
    hidden[1, 0, 10:12] = True
    x = torch.randn(B, S, C)
    for fill in (torch.finfo(torch.float32).min, -1e9):
        torch._dynamo.reset()
        model = RowMasked()
        model.fill = fill
        explanation = compile_and_compare(model, x, hidden)
        assert_matched(explanation)
        assert torch.isfinite(explanation.result).all()


@pytest.mark.parametrize("kw,mask", [({"is_causal": True}, None), ({"scale": 0.3}, "bool"), ({}, "additive")],
                         ids=["causal", "bool-mask-scale", "additive-mask"])
@pytest.mark.parametrize("H_kv", [4, 2])
def test_sdpa_is_replaced(kw, mask, H_kv):
    x = torch.randn(B, S, C)
    args = (x,)
    if mask == "bool":
        m = torch.rand(B, 1, S, S) < 0.7
        m[..., 0] = True  # every row sees a key (SDPA's fully masked rows: see test_fully_masked_rows_match_eager)
        args = (x, m)
    elif mask == "additive":
        args = (x, torch.randn(1, 4, S, S))
    assert_matched(compile_and_compare(Sdpa(H_kv, **kw), *args))


def test_the_wrapper_calls_the_ops_functions_without_the_dispatcher(monkeypatch):
    """The compiled graph holds the custom ops (explain lists them), but its wrapper calls each op's own function
    (decision 038: the dispatcher's Python cost 57 us of the forward's 230 a call on an H100's host); the results
    are the op's, forward and backward (compile_and_compare)."""
    from tilefuse.compiler import runtime
    from tilefuse.kernels.attention import ops as attention_ops

    made = record_instances(monkeypatch, runtime.CompiledGraph)
    assert_matched(compile_and_compare(Sdpa(4, is_causal=True), torch.randn(B, S, C)))
    called = [v for g in made if g.plan is not None for k, v in g.plan.generic.__globals__.items()
              if k.startswith("op_")]
    for name in ("tilefuse::attention_fwd", "tilefuse::attention_bwd"):
        assert attention_ops.IMPLEMENTATIONS[name] in called, (name, called)
    assert not any(isinstance(v, torch._ops.OpOverload) and v._schema.name.startswith("tilefuse::") for v in called)


def test_inference_graph():
    x = torch.randn(B, S, C)
    with torch.no_grad():
        explanation = compile_and_compare(MinGPT(), x, grad=False)
    assert_matched(explanation, backward=False)


class NotLastDim(Projections):
    def __init__(self):
        super().__init__(bias=False)  # (a bias of q does not change a softmax over the queries: zero gradient)

    def forward(self, x):
        q, k, v = self.qkv(x)
        att = (q @ k.transpose(-2, -1)) * 0.25
        return _merge(att.softmax(dim=-2) @ v)


class WeightsReturned(Projections):
    def forward(self, x):
        q, k, v = self.qkv(x)
        att = ((q @ k.transpose(-2, -1)) * 0.25).softmax(-1)
        return _merge(att @ v) + att.mean()


@pytest.mark.parametrize("make,reason", [
    (NotLastDim, "softmax over dim -2, not the last"),
    (WeightsReturned, "users"),
], ids=["softmax-dim", "weights-used"])  # (a finite fill such as -1e4: test_compiler_attention_mods matches it)
def test_unmatched_attention_keeps_eager_results_and_says_why(make, reason):
    explanation = compile_and_compare(make(), torch.randn(B, S, C))
    outcomes = explanation.attention
    assert len(outcomes) == 1 and outcomes[0].reason is not None and reason in outcomes[0].reason, \
        str(explanation)
    assert reason in str(explanation)
    assert not explanation.library_calls


def test_training_dropout_runs_the_kernels_dropout():
    """Dropout of the probabilities (training) becomes the kernel's counter-based dropout: eager's random
    stream cannot be reproduced, so the check is the kernel's own: with the seed the op drew, the output is
    that of the family's attention with the same dropout_seed."""
    from tilefuse.kernels.attention import attention

    model = Sdpa(4, dropout_p=0.25).train()
    x = torch.randn(B, S, C)
    explanation = tilefuse.explain(lambda t: model(t), x)
    assert_matched(explanation, backward=False)
    torch.manual_seed(1234)
    out = torch.compile(model, backend="tilefuse")(x)
    torch.manual_seed(1234)
    seed = int(torch.randint(0, 2 ** 31 - 1, (1,)).item())
    q, k, v = model.qkv(x)
    expected = _merge(attention(q, k, v, dropout_p=0.25, dropout_seed=seed))
    assert_close(out, expected, tol=1e-6)
    no_drop = _merge(attention(q, k, v))
    assert (out - no_drop).abs().max() > 1e-3  # dropout did drop something


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt2-sdpa", "gpt2-eager", "llama-sdpa", "llama-eager"])
def test_transformers_attention_is_found(name):
    """Each layer's attention of the real-model suite's transformers models (two layers), with transformers'
    "sdpa" attention and its eager one (matmul, additive finfo.min mask, softmax, matmul; llama's GQA through
    repeat_kv): one flash call a layer, the logits as eager's (tests/test_real_models.py checks training)."""
    pytest.importorskip("transformers")
    from tests import real_models as rm

    case = rm.CASES[name]
    model = case.build().eval()
    ref = copy.deepcopy(model).double()
    batch = case.batch(str(x_device()))
    kwargs = {k: v for k, v in rm.forward_kwargs(case, batch, inference=False).items() if k != "labels"}
    with torch.no_grad():
        expected = ref(**kwargs).logits
        explanation = tilefuse.explain(lambda **kw: model(**kw).logits, **kwargs)
        with patterns_attention.switched_off():
            before = tilefuse.explain(lambda **kw: model(**kw).logits, **kwargs)
    assert_close(explanation.result, expected, tol=1e-4, what="logits")
    matched = [o for o in explanation.attention if o.reason is None]
    assert len(matched) == 2 and not before.attention, str(explanation)
    assert [op for _, op in explanation.library_calls] == ["tilefuse.attention_fwd.default"] * 2

    def count(exp, prefixes):
        return sum(1 for g in exp.graphs for _, op, *_ in g.externs if op.startswith(prefixes)) + \
            sum(1 for k in exp.kernels for origin in k.fuses if origin.split(":")[-1].startswith(prefixes))

    # the two matmuls of each attention (bmm, or SDPA's op) are gone; the model's other bmm (llama's rotary
    # frequencies) stays
    gone = count(before, ("aten.bmm", "aten._scaled_dot_product")) - count(explanation, ("aten.bmm",
                                                                                        "aten._scaled_dot"))
    assert gone == (4 if "eager" in name else 2), str(explanation)
    assert count(explanation, ("aten.amax", "aten.exp", "aten._softmax")) == 0, str(explanation)


@pytest.mark.gpu
@pytest.mark.parametrize("make", [MinGPT, Gemma2Softcap, lambda: Sdpa(2, is_causal=True)],
                         ids=["mingpt", "gemma2-softcap", "sdpa-gqa-causal"])
def test_bfloat16_on_the_gpu(make):
    """The compiled bf16 model on the GPU's compiled kernels, against the float64 eager copy (bf16 tolerance).
    In eval mode: Gemma 2's dropout would make the two outputs differ by design."""
    model = make().eval().to(torch.bfloat16)
    ref = copy.deepcopy(model).double()
    x = torch.randn(B, 63, C)
    explanation = tilefuse.explain(model, x.to(torch.bfloat16))
    assert [o.reason for o in explanation.attention] == [None], str(explanation)
    assert_close(explanation.result, ref(x.double()), tol=2e-2, what="bf16 output")


def test_dropout_of_the_probabilities_in_training_becomes_the_kernels():
    """Gemma 2's F.dropout(p=0.1, training=True) after the softmax: the kernel's dropout (forward and backward
    graphs both call the family), finite, and different from the eval-mode output (eager's random stream is
    not reproducible: test_training_dropout_runs_the_kernels_dropout checks the values against the library)."""
    model = Gemma2Softcap().train()
    x = torch.randn(B, S, C, requires_grad=True)
    explanation = tilefuse.explain(model, x)
    assert [o.detail for o in explanation.attention] == ["scale 0.3536, softcap 5, window (-1, 0), GQA group 2, "
                                                         "dropout 0.1"], str(explanation)
    out = explanation.result
    with collecting() as graphs:
        out.sum().backward()
    assert any(op == "tilefuse.attention_bwd.default" for g in graphs for _, op, *_ in g.externs)
    assert torch.isfinite(out).all() and torch.isfinite(x.grad).all()
    assert (out - model.eval()(x)).abs().max() > 1e-4  # something was dropped
