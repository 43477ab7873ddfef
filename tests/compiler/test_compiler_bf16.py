"""bfloat16 graphs compiled on the CPU (Triton's interpreter): pointwise chains and reductions, forward and
backward, against eager bf16 and a float64 reference at bf16's tolerance (norm-wise and element-wise:
compiler_checks). Code generation holds half types in float32 registers and rounds where eager stores, so the
compiled result is at least as close to the reference as eager's; what can go wrong is a dropped or misplaced
cast (a bf16 value read as float32 bits, a reduction accumulated in bf16, an fp16 rounding applied to bf16)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests import compiler_checks as cc
from tests.support import noncontiguous

BF16 = torch.bfloat16


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def bf16(*shape, noncontig=False, scale=1.0):
    t = (torch.randn(*shape) * scale).to(BF16)
    if noncontig:
        t = noncontiguous(t)
    return t.requires_grad_()


GRAPHS = {
    "gelu chain": (lambda x, b: F.gelu(x * 1.5 + b) * torch.sigmoid(x),
                   lambda: (bf16(7, 129, noncontig=True), bf16(129))),
    "silu tanh exp": (lambda x: F.silu(x) + torch.tanh(x) * torch.exp(-x * x), lambda: (bf16(33, 65),)),
    "div sqrt": (lambda x, y: x / (y.abs() + 1.0) + torch.sqrt(x * x + 1.0), lambda: (bf16(7, 129), bf16(7, 129))),
    "sum mean amax": (lambda x: x.sum(-1) + x.mean(0).sum() + x.amax(-1) * 0.5, lambda: (bf16(31, 1000),)),
    "var std": (lambda x: x.var(-1) + x.std(0).mean(), lambda: (bf16(17, 257, noncontig=True),)),
    "softmax": (lambda x: torch.softmax(x, -1), lambda: (bf16(7, 1000, scale=3.0),)),
    "log_softmax": (lambda x: torch.log_softmax(x, 0), lambda: (bf16(129, 7),)),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (257,), w, b), lambda: (bf16(9, 257), bf16(257), bf16(257))),
    "rms_norm": (lambda x, w: x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(BF16) * w,
                 lambda: (bf16(9, 513), bf16(513))),
    "cross_entropy": (lambda x, t: F.cross_entropy(x, t), lambda: (bf16(16, 129), torch.randint(0, 129, (16,)))),
    "long row sum": (lambda x: (x * x).sum(), lambda: (bf16(4099),)),
    "float32 output of bf16": (lambda x: x.float().sum(-1) + x.to(torch.float32).amax(-1), lambda: (bf16(7, 129),)),
    "bf16 output of float32": (lambda x: torch.softmax(x, -1).to(BF16) * 2,
                               lambda: (torch.randn(7, 129, requires_grad=True),)),
}


@pytest.mark.parametrize("graph", sorted(GRAPHS))
def test_bf16_graph_forward_backward(graph):
    fn, make = GRAPHS[graph]
    cc.check_function(fn, *make(), what=f"bf16 {graph}", ref_dtype=torch.float64)


def test_bf16_large_values_keep_their_range():
    """bf16 has float32's exponent range: 3e38-scale values must not overflow where eager's do not (a kernel
    that rounded through float16 would give inf above 65504)."""
    x = (torch.rand(7, 129) * 1e5 + 7e4).to(BF16).requires_grad_()
    cc.check_function(lambda x: (x * 2.0).sum(-1, keepdim=True) + x * 3.0, x, what="bf16 beyond fp16's range",
                      ref_dtype=torch.float64)
