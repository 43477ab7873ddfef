"""Training through the compiler: the contracts between ops that op-by-op tests never see.

Each test here failed before its fix: SDPA's backward fed by a decomposed forward (gradients off by ~1e3), a
head reshape judged "not a strided view" (MultiheadAttention's graphs ran in ATen), Dynamo tracing into the
runtime when a compiled step calls ``backward()`` (a crash), Dynamo's restart request swallowed as a
fallback, an extern result read through strides it does not have.
"""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import tilefuse
import tilefuse.compiler as compiler
from tilefuse.compiler import ir, runtime

from tests import compiler_checks as cc


@pytest.fixture(autouse=True)
def _fresh():
    cc.reset()
    yield
    torch._dynamo.reset()


def _grads(fn, inputs, cot):
    out = fn(*inputs)
    grads = torch.autograd.grad(out, [t for t in inputs if t.requires_grad], cot)
    return out, grads


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def test_sdpa_gradients_through_a_projection():
    def f(q, k, v, w):
        q = q @ w
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return o.transpose(1, 2).sum(-1)

    q, k, v = [torch.randn(2, 9, 2, 16, dtype=torch.float64, requires_grad=True) for _ in range(3)]
    w = torch.randn(16, 16, dtype=torch.float64, requires_grad=True)
    ref_in = [q, k, v, w]
    inputs = [t.detach().float().requires_grad_() for t in ref_in]
    cot = torch.randn(2, 9, 2, dtype=torch.float64)
    ref_out, ref_grads = _grads(f, ref_in, cot)
    with cc.strict():
        out, grads = _grads(cc.compiled(f), inputs, cot.float())
    assert _rel(out, ref_out) < 1e-5
    for name, g, r in zip("qkvw", grads, ref_grads):
        assert _rel(g, r) < 1e-5, f"grad of {name}: relative error {_rel(g, r):.3g}"


def test_multihead_attention_compiles_whole_and_trains():
    torch.manual_seed(0)
    attn = nn.MultiheadAttention(32, 4, batch_first=True)
    x = torch.randn(2, 7, 32, requires_grad=True)
    ref = copy.deepcopy(attn).double()
    x64 = x.detach().double().requires_grad_()
    cot = torch.randn(2, 7, 32, dtype=torch.float64)
    ref_out = ref(x64, x64, x64)[0]
    ref_grads = torch.autograd.grad(ref_out, [x64] + list(ref.parameters()), cot)
    compiled = cc.compiled(attn)
    with cc.strict():  # a whole-graph fallback ("not a strided view") raises here
        out = compiled(x, x, x)[0]
        grads = torch.autograd.grad(out, [x] + list(attn.parameters()), cot.float())
    assert _rel(out, ref_out) < 1e-5
    for g, r in zip(grads, ref_grads):
        assert _rel(g, r) < 1e-4
    assert compiler.stats()["graph_fallbacks"] == 0


def test_head_split_of_a_reshape_is_one_strided_index():
    # (8*i1 + i2) % 32 over i2 < 8 is 8*(i1 % 4) + i2, which merges with 32*(i1 // 4) into 8*i1
    i1, i2 = ir.var_index("i1", 8), ir.var_index("i2", 8)
    x = ir.add(ir.scale(i1, 8), i2)
    offset = ir.add(ir.scale(ir.divmod_index(x, 32, None), 32), ir.mod_index(x, 32))
    assert offset == x, offset
    assert all(isinstance(a, ir.Var) for a, _ in offset.terms)


def _train_step(m, o, x):
    loss = m(x).pow(2).mean()
    loss.backward()
    o.step()
    o.zero_grad()
    return loss


def test_compiled_training_step_with_backward_and_optimizer_inside():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
    twin = copy.deepcopy(model)
    opt, opt2 = (torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (model, twin))
    x = torch.randn(5, 8)

    compiled = cc.compiled(_train_step)
    for _ in range(2):
        want = _train_step(model, opt, x)
        got = compiled(twin, opt2, x)
        assert abs(got.item() - want.item()) <= 1e-5 * abs(want.item())
    for p, q in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-6)
    s = compiler.stats()
    assert s["graphs"] >= 2
    # Dynamo's restart requests are not fallbacks, and AdamW's fma is lowered
    assert not s["fallbacks"], s["fallbacks"]


def test_dynamo_never_traces_the_compiler_when_backward_runs_inside_a_compiled_frame(monkeypatch):
    """loss.backward() inside a compiled step makes AOTAutograd compile the backward graph while Dynamo is
    converting frames: tilefuse's compiler must run untraced (a step once had 97 frames converted, the compiler's
    among them, and Dynamo's walks over their globals raced the compiler's imports: "dictionary changed size")."""
    from torch._dynamo import convert_frame

    converted = []
    real = convert_frame._compile

    def spy(code, *args, **kwargs):
        converted.append(code.co_filename)
        return real(code, *args, **kwargs)

    monkeypatch.setattr(convert_frame, "_compile", spy)
    torch._dynamo.reset()
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    compiled = cc.compiled(_train_step)
    for _ in range(2):
        compiled(model, opt, torch.randn(5, 8))
    assert converted, "the spy saw no frame: Dynamo's conversion entry point moved"
    package = str(Path(tilefuse.__file__).parent)
    ours = [f for f in converted if f.startswith(package)]
    assert not ours, f"Dynamo converted tilefuse's own frames: {sorted(set(ours))}"


def test_extern_result_in_another_layout_is_copied_into_the_graphs_strides():
    t = torch.arange(12.0).reshape(3, 4).t()  # shape (4, 3), strides (1, 4)
    before = compiler.stats().get("extern_relayouts", 0)
    fixed = runtime.extern_layout(t, (4, 3), (3, 1), "mm")
    assert fixed.stride() == (3, 1)
    torch.testing.assert_close(fixed, t)
    assert compiler.stats()["extern_relayouts"] == before + 1
    same = torch.empty(4, 3)
    assert runtime.extern_layout(same, (4, 3), (3, 1), "mm") is same
    ones = torch.empty(4, 1)  # strides of size-1 dims do not matter
    assert runtime.extern_layout(ones, (4, 1), (1, 7), "mm") is ones
    assert runtime.extern_layout(None, (0,), (1,), "mkldnn_rnn_layer.3") is None  # ATen's undefined output
    with pytest.raises(runtime.PlanError, match="shape"):
        runtime.extern_layout(same, (3, 4), (4, 1), "mm")


class _Counted(nn.Module):
    """A module that increments a buffer and scales by it (a step count, a warm-up factor), and keeps a running
    mean of a detached activation, as BatchNorm's running statistics are kept."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(7, 7)
        self.register_buffer("count", torch.zeros(()))
        self.register_buffer("ema", torch.zeros(7))

    def forward(self, x):
        self.count.add_(1)
        y = torch.tanh(self.lin(x))
        self.ema.mul_(0.9).add_(y.detach().mean(0) * 0.1)
        return (y * self.count).sum() + (x * self.ema).sum()


def test_a_buffer_written_in_the_forward_is_not_read_again_by_the_backward():
    """``count.add_(1); y * count``: the min-cut partitioner recomputed ``count + 1`` in the backward from the
    buffer the forward had already incremented, a gradient twice eager's at the first step (torch 2.13; its
    aot_eager backend too). The backend marks such reads as values to save. Three steps against a float64
    eager copy: the gradients, the loss and both buffers."""
    torch.manual_seed(0)
    model = _Counted()
    ref = copy.deepcopy(model).double()
    compiled = torch.compile(model, backend="tilefuse")
    for step in range(3):
        x = torch.randn(5, 7)
        with cc.strict():
            loss = compiled(x)
        loss.backward()
        ref_loss = ref(x.double())
        ref_loss.backward()
        assert _rel(loss, ref_loss) < 1e-5, step
        for (name, p), r in zip(model.named_parameters(), ref.parameters()):
            err = _rel(p.grad, r.grad)
            assert err < 1e-5, f"step {step}: grad of {name}: relative error {err:.3g}"
        assert model.count.item() == ref.count.item() == step + 1
        assert _rel(model.ema, ref.ema) < 1e-5, step


def test_reads_of_a_written_input_are_marked_to_save_and_views_are_followed():
    """The marking on a joint graph of its own: the reads of a written placeholder, through a view, are marked
    MUST_SAVE; the write itself, the view and what reads only other inputs are not."""
    from torch.utils.checkpoint import CheckpointPolicy

    from tilefuse.compiler import backend

    aten = torch.ops.aten
    g = torch.fx.Graph()
    buf, x = g.placeholder("buf"), g.placeholder("x")
    new = g.call_function(aten.add.Tensor, (buf, 1))
    view = g.call_function(aten.view.default, (buf, [-1]))
    through_view = g.call_function(aten.mul.Tensor, (view, 2))
    other = g.call_function(aten.mul.Tensor, (x, 3))
    write = g.call_function(aten.copy_.default, (buf, new))
    g.output((through_view, other, write))
    pinned = backend.save_reads_of_written_inputs(g)
    assert set(pinned) == {new, through_view}
    for n in (new, through_view):
        assert n.meta["recompute"] == CheckpointPolicy.MUST_SAVE
    for n in (view, other, write):
        assert "recompute" not in n.meta
