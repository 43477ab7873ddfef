"""Semantics that symmetric test data hides: which operand an ``alpha`` scales, a permutation versus its inverse,
and a reduction's value read at a position other than the one it is computed at.

* ``add``/``sub``/``rsub`` with ``alpha`` scale the *right* operand: ``x + alpha * y``. With alpha = 1, or with
  x and y drawn alike and compared norm-wise, scaling x instead goes unseen; here alpha is far from 1 and x and
  y have different scales, forward and backward (dy = alpha * g).
* ``permute`` with dims that are not their own inverse ((2, 0, 1), (1, 3, 0, 2)): a view that applied the
  inverse would give the right shape only for cubes, so the shapes are all different and the result is read by
  a kernel (``* y``) rather than returned as a view.
* A reduction and a consumer that reads it at another row (``flip``, ``roll``, a gather by index, a shifted
  slice): the scheduler may fuse a consumer into the reduction's kernel only where it reads the value at the
  position the kernel holds it (scheduler.fusion_legality); reading it elsewhere needs the reduction finished.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests import compiler_checks as cc
from tests.support import noncontiguous


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def g(*shape, scale=1.0, noncontig=False):
    t = torch.randn(*shape) * scale
    if noncontig:
        t = noncontiguous(t)
    return t.requires_grad_()


# ------------------------------------------------------------------------------------------------ alpha
ALPHA_CASES = {
    "add tensor alpha=3": (lambda x, y: torch.add(x, y, alpha=3.0), lambda: (g(7, 129), g(7, 129, scale=10.0))),
    "add broadcast alpha=-0.5": (lambda x, y: torch.add(x, y, alpha=-0.5) * 1.0,
                                 lambda: (g(7, 129, scale=0.1), g(129, scale=7.0))),
    "add broadcast left alpha=2.5": (lambda x, y: torch.add(y, x, alpha=2.5) * 1.0,
                                     lambda: (g(7, 129, scale=0.1), g(129, scale=7.0))),
    "sub tensor alpha=2": (lambda x, y: torch.sub(x, y, alpha=2.0) * 1.0, lambda: (g(7, 129), g(7, 129, scale=5.0))),
    "sub scalar alpha=4": (lambda x: torch.sub(x, 1.5, alpha=4.0) * 1.0, lambda: (g(7, 129),)),
    "add scalar alpha=4": (lambda x: torch.add(x, 1.5, alpha=4.0) * 1.0, lambda: (g(7, 129),)),
    "rsub tensor alpha=3": (lambda x, y: torch.rsub(x, y, alpha=3.0) * 1.0, lambda: (g(7, 129), g(7, 129, scale=5.0))),
    "rsub scalar alpha=2": (lambda x: torch.rsub(x, 0.5, alpha=2.0) * 1.0, lambda: (g(7, 129, scale=3.0),)),
    "add_ method alpha": (lambda x, y: x.clone().add_(y, alpha=-2.0), lambda: (g(7, 33), g(7, 33, scale=3.0))),
}


@pytest.mark.parametrize("case", sorted(ALPHA_CASES))
def test_alpha_scales_the_right_operand(case):
    fn, make = ALPHA_CASES[case]
    cc.check_function(fn, *make(), what=case)


@pytest.mark.parametrize("op", ["add", "sub"])
def test_integer_alpha(op):
    x = torch.randint(-50, 50, (7, 129))
    y = torch.randint(-50, 50, (129,)) * 7
    fn = (lambda x, y: torch.add(x, y, alpha=3) + 1) if op == "add" else (lambda x, y: torch.sub(x, y, alpha=3) + 1)
    cc.check_function(fn, x, y, what=f"int {op} alpha=3", backward=False)


# ---------------------------------------------------------------------------------------------- permute
PERMS = [(2, 0, 1), (1, 2, 0), (-1, 0, 1), (0, 2, 1)]


@pytest.mark.parametrize("dims", PERMS, ids=str)
@pytest.mark.parametrize("noncontig", [False, True])
def test_permute_3d(dims, noncontig):
    x = g(3, 5, 7, noncontig=noncontig)
    out_shape = x.permute(dims).shape
    y = g(*out_shape)
    cc.check_function(lambda x, y: x.permute(dims) * y + 1.0, x, y, what=f"permute {dims}")


def test_permute_4d_and_reshape():
    dims = (1, 3, 0, 2)
    x = g(2, 3, 5, 7)
    y = g(3, 7, 2, 5)
    cc.check_function(lambda x, y: (x.permute(dims) * y).reshape(21, 10).cumsum(0) * 1.0, x, y,
                      what="permute (1, 3, 0, 2) then reshape")


def test_permute_of_a_permute_and_contiguous():
    x = g(3, 5, 7)
    cc.check_function(lambda x: x.permute(2, 0, 1).permute(2, 0, 1).contiguous() * 2.0  # (5, 7, 3)
                      + x.permute(1, 2, 0).sum(-1, keepdim=True), x, what="permute twice")


def test_permute_feeds_a_reduction():
    x = g(3, 5, 7)
    cc.check_function(lambda x: torch.softmax(x.permute(2, 0, 1), -1).sum(1) + x.permute(1, 2, 0).amax(-1).t(),
                      x, what="permute into softmax and amax")


# -------------------------------------------------------------------------------- reductions, elsewhere
ELSEWHERE = {
    "row sum read flipped": lambda x: x * x.sum(-1, keepdim=True).flip(0),
    "row max read rolled": lambda x: x - x.amax(-1).roll(1, 0)[:, None],
    "column sum read flipped": lambda x: x + x.sum(0).flip(0),
    "row mean read by index": lambda x: x * x.mean(-1)[torch.tensor([3, 0, 6, 6, 1, 2, 5])][:, None],
    "row sums shifted": lambda x: x.sum(-1)[1:] - x.sum(-1)[:-1] * 0.5,
    "norm stats read at other rows": lambda x: (x - x.mean(-1, keepdim=True).flip(0))
    * (x.var(-1, keepdim=True).roll(1, 0) + 1.0).rsqrt(),
    "softmax read transposed": lambda x: torch.softmax(x[:, :7], -1) + torch.softmax(x[:, :7], -1).t(),
    "total read by every element": lambda x: x / x.abs().sum() + x.sum(-1, keepdim=True),
}


@pytest.mark.parametrize("case", sorted(ELSEWHERE))
def test_reduction_read_at_another_position(case):
    x = g(7, 129) if case != "softmax read transposed" else g(7, 33)
    if "index" in case:  # x[idx]'s backward is an index_put: an ATen extern
        cc.check_function(ELSEWHERE[case], x, what=case, strict_mode=False, not_fallen_back=("aten.index.Tensor",))
    else:
        cc.check_function(ELSEWHERE[case], x, what=case)


def test_reduction_read_elsewhere_at_long_rows():
    """Rows longer than one block (the looped reduction form): the value is complete only after the loop."""
    x = g(5, 3000)
    cc.check_function(lambda x: x * torch.softmax(x, -1).amax(-1, keepdim=True).flip(0) + F.layer_norm(x, (3000,)),
                      x, what="long rows, read flipped")
