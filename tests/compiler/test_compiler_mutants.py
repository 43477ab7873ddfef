"""Tests for the gaps tools/mutation_check.py found: each deliberate bug below survived every other compiler test
of its run (the mutation's name is in the test's docstring). Held to eager and float64 like the rest
(compiler_checks.check_function)."""
from __future__ import annotations

import pytest
import torch

from tests import compiler_checks as cc
from tests.support import noncontiguous


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("exponent", [-2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0, 3.0, 1.7, -2])
def test_pow_special_exponents(exponent):
    """pow_minus_two: the exponents lowered to multiplications and roots (x ** -2 as 1 / (x * x)), forward and
    backward (whose x ** (e - 1) is another such exponent). Inputs away from 0 so every exponent is tame."""
    x = (torch.rand(7, 129) + 0.5).requires_grad_()
    cc.check_function(lambda x: x ** exponent * 1.0, x, what=f"x ** {exponent!r}")


@pytest.mark.parametrize("case", ["x[:, ::2]", "x[1::3]", "x[::-1] via flip",
                                  "x[:, 3:120:7] (2-d)"])
def test_strided_slices_read_by_a_kernel(case):
    """slice_step_ignored: a slice with a step read by a kernel (OpInfo's slice returns the view itself, so no
    kernel ever indexed one), forward and backward (slice_scatter with the same step)."""
    fns = {
        "x[:, ::2]": lambda x: x[:, :128:2] * 2.0 + x[:, 1::2],
        "x[1::3]": lambda x: torch.tanh(x[1::3]) + x[::3].sum(0),
        "x[::-1] via flip": lambda x: x.flip(0)[::2] * x[::2],
        "x[:, 3:120:7] (2-d)": lambda x: torch.softmax(x[2::2, 3:120:7], -1),
    }
    x = torch.randn(13, 129).requires_grad_()
    cc.check_function(fns[case], x, what=case)


@pytest.mark.parametrize("pad", [(1, 2), (3, 0, 2, 1), (0, 5), (2, 2, 0, 0)], ids=str)
def test_constant_pad(pad):
    """pad_mask_off_by_one: the pad value right after the source's last element (OpInfo's scope has no pad).
    The source is non-contiguous and NaN-poisoned between its elements, so a read past a row's end shows."""
    x = noncontiguous(torch.randn(7, 129)).requires_grad_()
    cc.check_function(lambda x: torch.nn.functional.pad(torch.tanh(x), pad, value=-3.0) * 2.0, x, what=f"pad {pad}")


LOOPED_REDUCTIONS = {
    "sum": lambda x: x.sum(-1),
    "prod": lambda x: (1.0 + x * 1e-2).prod(-1),
    "amax amin": lambda x: x.amax(-1) - x.amin(-1),
    "mean var": lambda x: x.mean(-1) + x.var(-1),
    "argmax argmin": lambda x: x.argmax(-1) * 1000 + x.argmin(-1),
    "any all": lambda x: (x > 2.5).any(-1) ^ (x > -2.5).all(-1),
    "logsumexp": lambda x: torch.logsumexp(x, -1),
}


@pytest.mark.parametrize("case", sorted(LOOPED_REDUCTIONS))
@pytest.mark.parametrize("form", ["persistent", "looped"])
def test_reductions_in_both_row_forms(case, form, monkeypatch):
    """looped_prod_adds: every reduction kind in the looped form (rows longer than a block, here 300 over steps
    of 64: four whole steps and a partial one) as well as the persistent one; argmax/argmin over rows with
    ties (ties go to the lowest index, as in torch)."""
    if form == "looped":
        from tilefuse.compiler import codegen
        from tilefuse.compiler.codegen import kernel_writer

        monkeypatch.setattr(kernel_writer, "INTERP_PERSISTENT_MAX_R", 64)
        monkeypatch.setattr(kernel_writer, "INTERP_BLOCK", 64)
    x = torch.randn(9, 300)
    if case.startswith("argmax"):
        x = x.round()  # ties everywhere: the first of several maxima and minima
        x[0] = 1.0  # the whole row tied
    # (prod's backward is a cumprod: the quadratic scan takes minutes in the looped form on the interpreter)
    grad = not case.startswith(("argmax", "any")) and not (form == "looped" and case == "prod")
    cc.check_function(LOOPED_REDUCTIONS[case], x.requires_grad_(grad), what=f"{case} ({form})", backward=grad)


INDEX_ARITHMETIC = {
    # mod_index_bound, divmod_drops_needed_mod: the backward's slice_scatter tests (v % 12 == 0) at v = 12
    "x[::12] of 13 rows": lambda x: x[::12] * 2.0,
    "x[1::3]": lambda x: x[1::3] * 2.0 + x[::4].sum(),
    # bounds_negative_coef: a flipped view of a reshape, whose div/mod simplification reads the flip's bounds
    "reshape then flip": lambda x: x[:12, :8].reshape(24, 4).flip(0) * 2.0,
    "reshape then flip both dims": lambda x: x[:12, :8].reshape(6, 16).flip(0, 1) + 1.0,
    "3-d reshape, flip the middle": lambda x: x[:12, :8].reshape(3, 8, 4).flip(1) + 1.0,
    "expand then reshape": lambda x: x[:1].expand(5, 129).reshape(3, 215) * 2.0,
    "unfold": lambda x: x.unfold(1, 5, 3).sum(-1) * 1.0,
    "roll": lambda x: x.roll(3, 1) * 2.0 + x.roll(-1, 0),
    "pixel-shuffle-like": lambda x: x[:12, :128].reshape(3, 4, 8, 16).permute(0, 2, 1, 3).reshape(24, 64) * 2.0,
    "repeat": lambda x: x[:2, :5].repeat(3, 2) * 2.0,
    "transpose, reshape, flip": lambda x: x.t().reshape(129, 13).flip(1) * 2.0,
    "as_strided": lambda x: torch.as_strided(x, (5, 7), (3, 2), 4) * 2.0,
}


@pytest.mark.parametrize("case", sorted(INDEX_ARITHMETIC))
def test_index_arithmetic_of_views(case):
    """The div/mod simplifications of ir.py at their edges: a quotient that reaches the modulus, an index with
    negative coefficients (a flip) under a reshape's div/mod. Non-strict: some backwards (unfold's, roll's,
    as_strided's) run in ATen."""
    x = torch.randn(13, 129).requires_grad_()
    cc.check_function(INDEX_ARITHMETIC[case], x, what=case, strict_mode=False)
