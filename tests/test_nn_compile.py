"""tilefuse.nn.Linear inside torch.compile: the library's GEMM is a graph break (Dynamo cannot trace the
Triton launcher), the rest of the model compiles, and forward and backward match eager."""
from __future__ import annotations

import torch

import tilefuse.nn

from .support import assert_close


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(24)
        self.up = tilefuse.nn.Linear(24, 40, activation="gelu")
        self.down = tilefuse.nn.Linear(40, 24)

    def forward(self, x):
        return x + self.down(self.up(self.norm(x)))


def test_compiled_model_with_tilefuse_linear_matches_eager():
    torch.manual_seed(3)
    net = _Net()
    x = torch.randn(2, 7, 24, requires_grad=True)
    ref = net(x)
    ref_grads = torch.autograd.grad(ref.square().sum(), [x, *net.parameters()])
    torch._dynamo.reset()
    out = torch.compile(net, backend="tilefuse")(x)
    grads = torch.autograd.grad(out.square().sum(), [x, *net.parameters()])
    assert_close(out, ref, torch.float32)
    for got, want in zip(grads, ref_grads):
        assert_close(got, want, torch.float32, what="gradient")
    torch._dynamo.reset()
