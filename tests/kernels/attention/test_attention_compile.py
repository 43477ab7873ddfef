"""The attention family's library API inside ``torch.compile``: a call the family's custom op expresses is that op
(one node of the compiled graph, no graph break, the compiler runs it as a library kernel); any other call is a
graph break that runs as in eager. Before, Dynamo traced into the launch path and failed on the CPU (Triton's
interpreter cannot be traced). Judged against a float64 reference, forward and backward."""
from __future__ import annotations

import pytest
import torch

import tilefuse
from tilefuse import device
from tilefuse.kernels.attention import attention_varlen, attention_with_lse

from tests.support import assert_close, moved_to
from tests.kernels.attention.test_attention import reference

B, H, S, D = 2, 2, 17, 16


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


pytestmark = pytest.mark.usefixtures("on_the_kernels_device")


def _inputs():
    # (B, S, H, D) buffers seen as (B, H, S, D): the layout models pass
    return [torch.randn(B, S, H, D).transpose(1, 2).requires_grad_() for _ in range(3)]


@pytest.mark.parametrize("options", [dict(causal=True), dict(window=(4, 0), softcap=20.0),
                                     dict(alibi=torch.linspace(0.25, 0.75, H)), dict(mask="bool")], ids=str)
def test_a_call_the_op_expresses_is_one_library_call_in_the_compiled_graph(options):
    options = {key: moved_to(val, device.torch_device()) for key, val in options.items()}
    if options.get("mask") == "bool":
        options["mask"] = torch.rand(B, 1, S, S) > 0.3
        options["mask"][..., 0] = True

    def f(q, k, v):
        return tilefuse.attention(q * 2, k, v, **options)

    q, k, v = _inputs()
    explanation = tilefuse.explain(f, q, k, v)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert [op for _, op in explanation.library_calls].count("tilefuse.attention_fwd.default") == 1, explanation
    out = torch.compile(f, backend="tilefuse")(q, k, v)
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref_options = {key: (val.double() if isinstance(val, torch.Tensor) and val.is_floating_point() else val)
                   for key, val in options.items()}
    expected = reference(leaves[0] * 2, leaves[1], leaves[2], **ref_options)
    assert_close(out, expected, tol=2e-5, what="output")
    g = torch.randn_like(out)
    out.backward(g)
    expected.backward(g.double())
    for name, t, t64 in zip("qkv", (q, k, v), leaves):
        assert_close(t.grad, t64.grad, tol=2e-5, what=f"d{name}")


def test_a_call_the_op_cannot_express_is_a_graph_break_that_runs_as_in_eager():
    def f(q, k, v):
        return tilefuse.attention(q * 2, k, v, causal="bottom_right", deterministic=True) + 1

    q, k, v = _inputs()
    explanation = tilefuse.explain(f, q, k, v)
    assert explanation.graph_break_count == 1 and explanation.graph_count == 2, explanation
    assert not explanation.library_calls  # the call ran outside the compiled graphs
    out = torch.compile(f, backend="tilefuse")(q, k, v)
    assert_close(out, tilefuse.attention(q * 2, k, v, causal="bottom_right", deterministic=True) + 1, tol=0.0)
    assert_close(out, reference(q * 2, k, v, causal="bottom_right") + 1, tol=2e-5)


def test_with_lse_and_varlen_run_as_in_eager_behind_a_graph_break():
    q, k, v = _inputs()

    def lse(q, k, v):
        return attention_with_lse(q, k, v, causal=True)

    out, l = torch.compile(lse, backend="tilefuse")(q, k, v)
    want, want_l = attention_with_lse(q, k, v, causal=True)
    assert torch.equal(out, want) and torch.equal(l, want_l)
    packed = [torch.randn(20, H, D, requires_grad=True) for _ in range(3)]
    cu = torch.tensor([0, 7, 20], dtype=torch.int32)

    def varlen(q, k, v):
        return attention_varlen(q, k, v, cu, cu, 13, 13, causal=True)

    got = torch.compile(varlen, backend="tilefuse")(*packed)
    assert torch.equal(got, varlen(*packed))
    got.sum().backward()
    grads = [t.grad.clone() for t in packed]
    for t in packed:
        t.grad = None
    varlen(*packed).sum().backward()
    assert all(torch.equal(a, t.grad) for a, t in zip(grads, packed))


@pytest.mark.slow
def test_a_transformers_model_with_the_tilefuse_attention_compiles_without_a_break():
    """``attn_implementation="tilefuse"`` under ``torch.compile``: each layer's attention is the family's op inside
    the compiled graph (no graph break), logits and a gradient as the eager model's."""
    transformers = pytest.importorskip("transformers")
    from tilefuse.kernels import attention as attn

    attn.register_transformers()
    cfg = transformers.GPT2Config(vocab_size=97, n_positions=32, n_embd=64, n_layer=2, n_head=4)
    models = []
    for impl in ("eager", "tilefuse"):
        torch.manual_seed(0)
        models.append(transformers.GPT2LMHeadModel._from_config(cfg, attn_implementation=impl).eval())
    models[1].load_state_dict(models[0].state_dict())
    ids = torch.randint(0, 97, (2, 11))

    def logits(ids):
        return models[1](input_ids=ids).logits

    explanation = tilefuse.explain(logits, ids)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert [op for _, op in explanation.library_calls].count("tilefuse.attention_fwd.default") == cfg.n_layer
    torch._dynamo.reset()
    got = torch.compile(logits, backend="tilefuse")(ids)
    want = models[0](input_ids=ids).logits
    assert_close(got, want, tol=2e-5, what="gpt2 logits")
    weight = models[1].transformer.h[0].attn.c_attn.weight
    g = torch.autograd.grad(got.square().mean(), weight)[0]
    g_ref = torch.autograd.grad(want.square().mean(), models[0].transformer.h[0].attn.c_attn.weight)[0]
    assert_close(g, g_ref, tol=1e-4, what="gpt2 c_attn gradient")
