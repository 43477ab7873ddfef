"""Backward through ops that run outside the generated kernels (matmuls on the library GEMM, convolutions in ATen
by design: lowering.EXTERN_OPS): their outputs
feed generated kernels and generated kernels feed them, forward and backward, in strict mode (an extern by
design is not a fallback). The seams are where layouts meet: an extern's output read by a kernel (possibly
transposed, as ``mm``'s backward reads ``w.t()``), a kernel's output handed to an extern with the strides
ATen expects, and gradients that come back out of an extern into a kernel's reduction (a bias gradient)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests import compiler_checks as cc
from tests.support import noncontiguous, transposed_copy


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def g(*shape):
    return torch.randn(*shape).requires_grad_()


def _attention(q, k, v):
    s = torch.softmax((q @ k.transpose(-1, -2)) * 0.125, -1)
    return (s @ v).sum(1)


GRAPHS = {
    "linear gelu": (lambda x, w, b: F.gelu(F.linear(x, w, b)).sum(-1), lambda: (g(7, 33), g(65, 33), g(65))),
    "mm into layer_norm": (lambda x, w: F.layer_norm(torch.tanh(x) @ w, (129,)), lambda: (g(9, 17), g(17, 129))),
    "transposed weight": (lambda x, w: torch.relu(x @ w.t() + 1.0) * x.sum(-1, keepdim=True),
                          lambda: (g(7, 33), transposed_copy(torch.randn(33, 33)).requires_grad_())),
    "noncontiguous operand": (lambda x, w: (torch.sigmoid(x) @ w).pow(2).mean(0),
                              lambda: (noncontiguous(torch.randn(7, 33)).requires_grad_(), g(33, 9))),
    "addmm residual": (lambda x, w, b: torch.addmm(b, x, w) * 0.5 + x[:, :1],
                       lambda: (g(7, 33), g(33, 11), g(11))),
    "bmm attention": (_attention, lambda: (g(2, 9, 16), g(2, 9, 16), g(2, 9, 16))),
    "two mms sharing a kernel input": (lambda x, a, b: (torch.exp(-x * x) @ a) * (torch.exp(-x * x) @ b),
                                       lambda: (g(7, 13), g(13, 5), g(13, 5))),
    "conv2d bias relu pool": (lambda x, w, b: F.relu(F.conv2d(x * 2.0, w, b, padding=1)).mean((2, 3)),
                              lambda: (g(2, 3, 9, 7), g(5, 3, 3, 3), g(5))),
    "conv1d layer_norm": (lambda x, w: F.layer_norm(F.conv1d(x, w, stride=2).transpose(1, 2), (4,)).sum(1),
                          lambda: (g(2, 3, 17), g(4, 3, 3))),
}


@pytest.mark.parametrize("graph", sorted(GRAPHS))
def test_extern_backward(graph):
    fn, make = GRAPHS[graph]
    s = cc.check_function(fn, *make(), what=graph)
    # a convolution is an ATen call; a matmul runs on the library GEMM (tests/test_compiler_gemm*.py)
    calls = int(s["externs"]) + int(s.get("gemm_kernels", 0))
    assert calls >= 1, f"{graph}: neither an extern call nor a library GEMM ran (the matmul/convolution should)"
    assert int(s["kernels"]) + int(s["kernels_compiled"]) + int(s["cache_hits"]) >= 1, f"{graph}: no kernel ran"


def test_training_step_through_externs_twice():
    """Two steps of a tiny MLP with SGD: the second step's weights come out of the first step's kernels."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(33, 65), torch.nn.GELU(), torch.nn.LayerNorm(65),
                                torch.nn.Linear(65, 7))
    import copy

    ref = copy.deepcopy(model).double()
    eager = copy.deepcopy(model)
    compiled = cc.compiled(model)
    cc.reset()
    for step in range(2):
        x = torch.randn(9, 33)
        t = torch.randint(0, 7, (9,))
        losses = []
        for m, inp in ((eager, x), (ref, x.double())):
            loss = F.cross_entropy(m(inp), t)
            loss.backward()
            losses.append(loss)
        with cc.strict():
            loss = F.cross_entropy(compiled(x), t)
            loss.backward()
        cc.assert_matches(f"step {step} loss", loss.detach(), losses[0].detach(), losses[1].detach())
        for (name, p), pe, pr in zip(model.named_parameters(), eager.parameters(), ref.parameters()):
            cc.assert_matches(f"step {step} grad {name}", p.grad, pe.grad, pr.grad)
        with torch.no_grad():
            for m in (model, eager, ref):
                for p in m.parameters():
                    p -= 0.1 * p.grad
                    p.grad = None
