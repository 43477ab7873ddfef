"""The judging rule itself (tests/support.py, tests/compiler_checks.py): what it must catch and what it must let
through. No compiler runs here: each case builds an "output", eager's answer and a reference by hand."""
from __future__ import annotations

import pytest
import torch

from tests import compiler_checks as cc
from tests.support import TOLERANCE, assert_close, elem_error, rel_error


def _gauss(*shape, dtype=torch.float32, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)


def test_a_zeroed_row_of_a_4096_row_bf16_output_fails():
    """Norm-wise a zeroed row of 4096 is an error of 1/64 (under bf16's 2e-2); element-wise it is ~0.6."""
    ref = _gauss(4096, 64, dtype=torch.float32)
    out = ref.to(torch.bfloat16)
    out[1234] = 0
    assert rel_error(out, ref) < TOLERANCE[torch.bfloat16], "the premise: a norm alone misses it"
    assert elem_error(out, ref) > 0.3
    with pytest.raises(AssertionError, match="element-wise"):
        assert_close(out, ref, torch.bfloat16)
    problem = cc.tensor_problem("out", out, out.clone().copy_(ref), ref)
    assert problem and "element-wise" in problem, problem


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_a_single_wrong_element_fails(dtype):
    """One element read from its neighbour (an off-by-one at a boundary) in an otherwise exact output."""
    ref = _gauss(257, 129, dtype=torch.float32 if dtype != torch.float32 else torch.float64, seed=1)
    eager = ref.to(dtype)
    out = eager.clone()
    k = int(ref.abs().argmax())
    out.view(-1)[k] = out.view(-1)[k - 1]
    assert cc.tensor_problem("out", out, eager, ref) is not None


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_rounding_to_the_dtype_passes(dtype):
    ref = _gauss(64, 1000, dtype=torch.float64, seed=2)
    if dtype != torch.float32:
        ref = ref.float()
    out = (ref * (1 + 2 * torch.finfo(dtype).eps * torch.rand(ref.shape, dtype=ref.dtype))).to(dtype)
    assert cc.tensor_problem("out", out, ref.to(dtype), ref) is None
    assert_close(out, ref, dtype)


def test_eager_error_allowance_is_capped():
    """An ill-conditioned sample: eager itself is 100 % off. Before the cap a compiled result 400 % off passed."""
    ref = _gauss(7, 33, dtype=torch.float64, seed=3)
    eager = (ref * 2).float()  # eager's own error: 100 %
    out = (ref * 5).float()  # 400 %
    p = cc.tensor_problem("out", out, eager, ref)
    assert p is not None and "relative error" in p, p
    # eager's error still scales the limit below the cap: 4 x a 0.1 % error
    eager_small = (ref * 1.001).float()
    assert cc.tensor_problem("out", (ref * 1.003).float(), eager_small, ref) is None
    assert cc.tensor_problem("out", (ref * 1.005).float(), eager_small, ref) is not None


def test_a_looser_cap_needs_a_reason():
    ref = _gauss(7, 33, dtype=torch.float64, seed=4)
    eager, out = (ref * 2).float(), (ref * 5).float()
    with pytest.raises(ValueError, match="eager_cap_reason"):
        cc.tensor_problem("out", out, eager, ref, eager_cap=10.0)
    assert cc.tensor_problem("out", out, eager, ref, eager_cap=10.0, eager_cap_reason="a test of the opt-in") is None


def test_underflow_to_zero_is_the_right_answer():
    """A float32 product of 125 factors below 1: 9.5e-57 in float64, 0 in float32 (for eager and any kernel)."""
    ref = torch.tensor([-9.4942e-57, 1.5], dtype=torch.float64)
    out = torch.tensor([-0.0, 1.5])
    assert cc.tensor_problem("prod", out, out.clone(), ref) is None


def test_nan_where_eager_is_finite_fails():
    ref = _gauss(7, 33, dtype=torch.float64, seed=5)
    eager = ref.float()
    out = eager.clone()
    out[3, 4] = float("nan")
    assert cc.tensor_problem("out", out, eager, ref) is not None
    with pytest.raises(AssertionError):
        assert_close(out, ref, torch.float32)


def test_a_sum_whose_terms_cancel_is_held_to_its_magnitude_bound_and_a_missing_term_still_fails():
    """A float32 sum of 4096 terms that cancel to ~1e-3 of their magnitudes: an error of ~1e-5 of the magnitudes
    (what any summation order may give) is ~1e-2 of the result. Against eager's lucky error it fails; with the
    magnitude bound (the sum of the terms' absolute values) it passes. A term left out fails either way."""
    gen = torch.Generator().manual_seed(0)
    terms = torch.randn(4096, generator=gen, dtype=torch.float64)
    terms[-1] -= terms.sum() - 1e-3 * terms.abs().sum()  # the sum is 1e-3 of the magnitudes
    ref, bound = terms.sum().reshape(1), terms.abs().sum().reshape(1)
    eager = ref.float()  # eager's error: rounding alone
    off = (ref + 5e-6 * bound).float()  # 5e-6 of the magnitudes: ~5e-3 of the result
    assert cc.tensor_problem("sum", off, eager, ref) is not None
    assert cc.tensor_problem("sum", off, eager, ref, bound=bound) is None
    missing = (ref - terms[0]).float()  # a term of size ~1 left out: ~1e-3 of the magnitudes
    assert cc.tensor_problem("sum", missing, eager, ref, bound=bound) is not None
