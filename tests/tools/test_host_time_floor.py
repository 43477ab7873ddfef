"""tools/host_time.py's floor section measures a step whose compiled graphs launch nothing: its backend must run
the real graph once (so Dynamo and AOTAutograd see real outputs), then hand out tensors laid out as the graph's
outputs without computing anything, forward and backward."""
from __future__ import annotations

import torch
from torch.profiler import ProfilerActivity, profile

from tests.support import load_tool


def _tool():
    return load_tool("host_time", "host_time_for_test")


def test_launchless_backend_hands_out_the_graphs_layouts_and_computes_nothing_after_the_first_call():
    torch._dynamo.reset()
    fn = torch.compile(lambda x: torch.softmax(x * 2.0, -1).t(), backend=_tool()._launchless_backend())
    x = torch.randn(37, 19, requires_grad=True)
    cot = torch.randn(19, 37)
    out = fn(x)
    (grad,) = torch.autograd.grad(out, [x], cot)
    ref = torch.softmax(x.detach().double() * 2.0, -1).t()
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-6)  # the first call is the real graph
    assert grad.shape == x.shape
    with profile(activities=[ProfilerActivity.CPU]) as prof:  # (a dispatch mode would change Dynamo's guards)
        again = fn(x)
        (grad2,) = torch.autograd.grad(again, [x], cot)
    names = [e.name for e in prof.events()]
    assert "aten::empty_strided" in names
    assert (again.shape, again.stride(), again.dtype) == (out.shape, out.stride(), out.dtype)
    assert (grad2.shape, grad2.stride(), grad2.dtype) == (grad.shape, grad.stride(), grad.dtype)
    computed = [n for n in names
                if n.startswith("aten::") and any(w in n for w in ("softmax", "mul", "exp", "sum", "sub", "div"))]
    assert computed == [], f"the launchless backend computed {computed}"
    torch._dynamo.reset()


def test_floor_section_times_eager_and_the_launchless_step_on_cpu(capsys):
    torch._dynamo.reset()
    _tool().floor_section(rows=8, rounds=2, device="cpu")
    text = capsys.readouterr().out
    lines = {line.split()[0]: line for line in text.splitlines()[1:] if line.strip()}
    assert set(lines) == {"eager", "launchless"}
    for line in lines.values():
        assert float(line.split()[1]) > 0
    torch._dynamo.reset()


def test_sites_section_takes_each_gemm_site_of_both_graphs_apart_on_cpu(capsys):
    """The sites section on the interpreter's sizes: the step, each graph's wrapper, and each of the attention
    projections' 12 GEMM sites (4 forward, 8 backward) with its kept plan and the ATen calls beside it."""
    torch._dynamo.reset()
    _tool().sites_section(device="cpu", calls=1, rounds=1, profiled=1)
    text = capsys.readouterr().out
    assert "== sites: attention_projections_fwd_bwd" in text and "the step: " in text, text
    assert "graph" in text and "(forward), 4 launch sites: wrapper call" in text, text
    assert "(backward), 8 launch sites: wrapper call" in text, text
    sites = [line for line in text.splitlines() if "(GemmSite):" in line]
    assert len(sites) == 12, text
    for line in sites:
        assert "kept plan True" in line and "torch.matmul(out=)" in line and "the kept plan's run" in line, line
    assert text.count("cProfile, 1 calls of graph") == 2, text
    torch._dynamo.reset()
