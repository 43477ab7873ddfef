"""The compiler on the GPU: the benchmark's memory-bound graphs in bf16 at real sizes (32768 x 4096, and
vocabulary-long cross-entropy rows), forward and forward + backward, against float32 eager; and int64
indexing past 2**31 elements. Strict mode: a fallback to ATen raises. Run by `make gpu-test` on the H200
(about 2 minutes: one real Triton compile per graph).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tilefuse.bench import compiler_suite as suite

from tests import compiler_checks as cc

pytestmark = pytest.mark.gpu

INT32_LIMIT = 2**31


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
    torch.cuda.empty_cache()


def _check(graph, result, eager, ref):
    outs, eags, refs = (suite._flat(r) for r in (result, eager, ref))
    assert len(outs) == len(eags), f"{graph.case}: {len(outs)} outputs, eager gives {len(eags)}"
    problems = [p for i, (o, e, r) in enumerate(zip(outs, eags, refs))
                if (p := cc.tensor_problem(f"{graph.case} result {i}", o, e, r))]
    assert not problems, "; ".join(problems)


@pytest.mark.parametrize("graph", suite.GRAPHS, ids=[g.case for g in suite.GRAPHS])
def test_memory_bound_graph_bf16_at_size(graph):
    args = suite.prepare(graph, suite.as_parameters(
        graph, graph.inputs(suite.ROWS, suite.COLS, suite.VOCAB, torch.bfloat16, "cuda")))
    ref = suite.reference(graph, args)
    eager = [t.detach() for t in suite._flat(suite.step_of(graph, args)(*args))]
    cc.reset()
    with cc.strict():
        step = suite.step_of(graph, args, cc.compiled)
        result = step(*args)
        torch.cuda.synchronize()
        again = step(*args)  # the second call runs the cached kernels, no compile: same answer
    s = cc.stats()
    assert int(s["graphs"]) >= 1, f"{graph.case}: tilefuse compiled no graph"
    assert int(s["kernels"]) + int(s["cache_hits"]) >= 1, f"{graph.case}: no tilefuse kernel ran: {s}"
    assert not s["fallbacks"], f"{graph.case}: fell back: {s['fallbacks']}"
    _check(graph, result, eager, ref)
    for a, b in zip(suite._flat(result), suite._flat(again)):
        assert torch.equal(a, b), f"{graph.case}: a second call gave a different answer"


def test_int64_indexing_softmax_past_2_31_elements():
    """Rows × cols > 2**31: offsets in the last rows overflow int32; those rows must still be right."""
    cols = 32768
    rows = INT32_LIMIT // cols + 3
    x = torch.randn(rows, cols, dtype=torch.bfloat16, device="cuda")
    assert x.numel() > INT32_LIMIT
    cc.reset()
    with cc.strict():
        out = cc.compiled(lambda t: torch.softmax(t * 1.5, -1))(x)
    assert int(cc.stats()["graphs"]) >= 1
    for part in (slice(0, 3), slice(rows - 5, rows)):
        ref = torch.softmax(x[part].float() * 1.5, -1)
        eager = torch.softmax(x[part] * 1.5, -1)
        cc.assert_matches(f"rows {part.start}:{part.stop}", out[part], eager, ref)


def test_int64_indexing_pointwise_past_2_31_elements():
    n = INT32_LIMIT + 4099  # odd tail past the int32 limit
    x = torch.randn(n, dtype=torch.bfloat16, device="cuda")
    cc.reset()
    with cc.strict():
        out = cc.compiled(lambda t: F.gelu(t) * 2 + 1)(x)
    for part in (slice(0, 4096), slice(n - 8192, n)):
        ref = F.gelu(x[part].float()) * 2 + 1
        eager = F.gelu(x[part]) * 2 + 1
        cc.assert_matches(f"elements {part.start}:{part.stop}", out[part], eager, ref)


def test_encoder_layer_bf16():
    """The models test's encoder layer at a GPU size in bf16 (matmuls on the library GEMM), forward and backward."""
    from .test_compiler_models import EncoderLayer, forward_backward

    model_bf16 = EncoderLayer(d=1024, heads=16, ff=4096).cuda().bfloat16()
    ref_model = EncoderLayer(d=1024, heads=16, ff=4096).cuda()  # float32, holding the same bf16 weights
    ref_model.load_state_dict({k: v.float() for k, v in model_bf16.state_dict().items()})
    x = torch.randn(8, 1023, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    pad = torch.zeros(8, 1023, dtype=torch.bool, device="cuda")
    pad[3, 700:] = True
    x_ref = x.detach().float().requires_grad_()
    ref_out, ref_grads = forward_backward(ref_model, list(ref_model.parameters()), [x_ref, pad], 11)
    eager_out, eager_grads = forward_backward(model_bf16, list(model_bf16.parameters()), [x, pad], 11)
    cc.reset()
    with cc.strict():
        out, grads = forward_backward(cc.compiled(model_bf16), list(model_bf16.parameters()), [x, pad], 11)
    cc.assert_matches("encoder output", out, eager_out, ref_out)
    names = [n for n, _ in model_bf16.named_parameters()] + ["x"]
    problems = [p for n, g, e, r in zip(names, grads, eager_grads, ref_grads)
                if (p := cc.tensor_problem(f"grad {n}", g, e, r))]
    assert not problems, "; ".join(problems)


def test_launches_take_the_direct_path_and_stay_right():
    """After its first call a compiled graph's launch site calls the kept kernel's launcher (no JIT dispatch);
    new inputs of the same kinds give eager's result through it, and an input at an unaligned address (which
    the kept kernel was not specialised for) goes back to the JIT and is still right."""
    import gc

    from tilefuse.kernels.launcher import SiteLauncher

    def fn(x, w):
        return torch.softmax(x * w, dim=-1) + 1.0

    f = torch.compile(fn, backend="tilefuse")
    w = torch.randn(1000, device="cuda")
    with cc.strict():
        for _ in range(3):
            x = torch.randn(37, 1000, device="cuda")
            out = torch.full_like(x, float("nan"))
            out.copy_(f(x, w))
            torch.testing.assert_close(out, fn(x, w))
        sites = [o for o in gc.get_objects() if type(o) is SiteLauncher and o.direct is not None]
        assert sites, "no launch site kept its compiled kernel"
        assert all(s.fast is not None for s in sites), "a kept kernel without its bound launch function"
        storage = torch.randn(37 * 1000 + 1, device="cuda")
        x_odd = storage[1:].view(37, 1000)  # 4 bytes past a 16-byte boundary
        assert x_odd.data_ptr() % 16 != 0
        torch.testing.assert_close(f(x_odd, w), fn(x_odd, w))
