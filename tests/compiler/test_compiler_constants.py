"""Tensor constants of a graph (``get_attr``: a ``torch.tensor`` built inside ``forward``, T5's buckets) become
real tensors of the graph's device in the plan, also though AOTAutograd calls the backend under its fake mode.

On a GPU a CPU constant moved under that mode became a FakeTensor, and the first launch failed reading its data
pointer (every T5 forward on CUDA); on the CPU the move is a no-op, so the check here is on the plan's state."""
from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from tilefuse.compiler import runtime

from tests import compiler_checks as cc


class WithConstant(torch.nn.Module):
    def forward(self, x):
        c = torch.tensor([0.5, -1.0, 2.0, 3.0, 0.25])  # lifted by AOTAutograd as a get_attr constant
        return torch.relu(x * c + 1.0)


def test_plan_is_built_without_fake_mode_and_holds_real_constants(monkeypatch):
    seen = []
    original = runtime.WrapperWriter.write

    def spy(self):
        modes = [type(m).__name__ for m in _get_current_dispatch_mode_stack()]
        source, glb = original(self)
        consts = {k: v for k, v in glb.items() if k.startswith("const_")}
        seen.append((modes, consts))
        return source, glb

    monkeypatch.setattr(runtime.WrapperWriter, "write", spy)
    cc.reset()
    m = WithConstant()
    x = torch.randn(3, 5)
    out = torch.compile(m, backend="tilefuse")(x)
    torch.testing.assert_close(out, m(x))
    assert seen, "the graph was not planned by tilefuse"
    modes, consts = seen[0]
    assert "FakeTensorMode" not in modes, modes
    assert consts, "the graph's constant was not passed to the wrapper"
    for name, value in consts.items():
        assert not isinstance(value, FakeTensor), name
