"""The GEMM call path's plans: a repeat call of a signature skips the checks and replays the recorded launches
with the new call's tensors. On the interpreter the replay goes through the same slot filling as on a GPU
(only the final launcher differs), so a wrong slot shows up here as a wrong result.
"""
from __future__ import annotations

import pytest
import torch

import tilefuse
from tests.support import assert_close, poisoned_empty
from tilefuse import config
from tilefuse.kernels.gemm import checks as gemm_checks, plan as gemm_plan, tuning as gemm_tuning
from tilefuse.kernels.gemm.configs import GemmConfig
from tilefuse.kernels.gemm.epilogue import example_silu_plus_e0

F = torch.nn.functional
SPLIT = GemmConfig("tiled", 16, 32, 16, split_k=3)
PERSISTENT_SUB2 = GemmConfig("persistent", 32, 64, 16, epi_subtile=2)


def rand(*shape, dtype=torch.float32):
    return torch.randn(*shape).to(dtype)


def ref(a, b):
    return a.double() @ b.double()


@pytest.fixture(autouse=True)
def fresh_plans():
    gemm_plan.forget_plans()
    yield
    gemm_plan.forget_plans()


@pytest.fixture
def no_checks(monkeypatch):
    """After this, a call that runs the checks fails: proves a repeat call skips them."""
    def armed():
        def refuse(*args, **kwargs):
            raise AssertionError("prepare() ran on a planned signature")
        monkeypatch.setattr(gemm_plan, "prepare", refuse)
    return armed


def test_repeat_call_reuses_the_plan_with_new_tensors(no_checks):
    a1, b1 = rand(37, 45), rand(45, 50)
    assert_close(tilefuse.gemm(a1, b1), ref(a1, b1), torch.float32)
    assert gemm_plan.plan_count() == 1
    no_checks()
    for _ in range(3):
        a, b = rand(37, 45), rand(45, 50)
        got = tilefuse.gemm(a, b)
        assert got.shape == (37, 50)
        assert_close(got, ref(a, b), torch.float32)
    assert gemm_plan.plan_count() == 1


def test_signature_changes_make_new_plans():
    a, b = rand(20, 24), rand(24, 18)
    tilefuse.gemm(a, b)
    tilefuse.gemm(a.t().contiguous().t(), b)  # strides
    tilefuse.gemm(a.half(), b.half())  # dtype
    wide = rand(20, 25)
    off = wide[:, 1:]  # 4-byte offset: not 16-byte aligned
    assert_close(tilefuse.gemm(off, b), ref(off, b), torch.float32)
    tilefuse.gemm(a, b, bias=rand(18))  # epilogue
    assert gemm_plan.plan_count() == 5


def test_float_values_change_without_a_new_plan(no_checks):
    a, b, r = rand(33, 21), rand(21, 40), rand(33, 40)
    tilefuse.gemm(a, b, residual=r, alpha=0.5, beta=2.0)
    no_checks()
    for alpha, beta in ((3.0, -1.0), (0.25, 0.0), (2, 1)):
        got = tilefuse.gemm(a, b, residual=r, alpha=alpha, beta=beta)
        assert_close(got, alpha * ref(a, b) + beta * r.double(), torch.float32)
    assert gemm_plan.plan_count() == 1


def test_alpha_one_and_not_one_are_different_plans():
    a, b = rand(9, 10), rand(10, 11)
    tilefuse.gemm(a, b)
    assert_close(tilefuse.gemm(a, b, alpha=2.0), 2 * ref(a, b), torch.float32)
    assert gemm_plan.plan_count() == 2


def test_out_is_the_new_calls_own(no_checks):
    a, b = rand(17, 19), rand(19, 23)
    tilefuse.gemm(a, b, out=torch.empty(17, 23))
    no_checks()
    out = poisoned_empty(17, 23, dtype=torch.float32, device="cpu")
    assert tilefuse.gemm(a, b, out=out) is out
    assert_close(out, ref(a, b), torch.float32)


def test_split_k_buffers_are_reused_correctly(no_checks):
    a, b = rand(20, 70), rand(70, 40)
    G = gemm_plan
    assert_close(G.gemm_raw(a, b, config=SPLIT).out[0], ref(a, b), torch.float32)
    no_checks()
    for _ in range(2):
        a, b = rand(20, 70), rand(70, 40)
        assert_close(G.gemm_raw(a, b, config=SPLIT).out[0], ref(a, b), torch.float32)


@pytest.mark.parametrize("cfg", [None, PERSISTENT_SUB2], ids=["direct", "two-pass"])
def test_quantised_output_replayed(cfg, no_checks):
    m, n, k = 24, 70, 30
    def call(a, b, bias):
        return gemm_plan.gemm_with_epilogue(a, b, None, (), None, bias=bias, activation="gelu", quantize="int8",
                                            config=cfg or GemmConfig("tiled", 32, 128, 16))
    call(rand(m, k), rand(k, n), rand(n))
    no_checks()
    a, b, bias = rand(m, k), rand(k, n), rand(n)
    q, s = call(a, b, bias)
    want = F.gelu(ref(a, b) + bias.double())
    assert s.shape == (m, 1)
    assert_close(q.double() * s.double(), want, tol=2e-2)


def test_hook_with_new_extra_operands(no_checks):
    a, b = rand(16, 20, dtype=torch.float16), rand(20, 24, dtype=torch.float16)
    e0 = rand(16, 24)
    gemm_plan.gemm_with_epilogue(a, b, example_silu_plus_e0, [e0], torch.float32)
    no_checks()
    e0 = rand(16, 24)
    got = gemm_plan.gemm_with_epilogue(a, b, example_silu_plus_e0, [e0], torch.float32)
    y = a.float() @ b.float()
    assert_close(got, F.silu(y) + e0, torch.float16)


def test_batched_and_autograd_replayed(no_checks):
    a = rand(3, 10, 12, dtype=torch.float16).requires_grad_(True)
    w = rand(12, 14, dtype=torch.float16).requires_grad_(True)
    tilefuse.gemm(a, w, activation="gelu").float().sum().backward()
    no_checks()
    a2 = rand(3, 10, 12, dtype=torch.float16).requires_grad_(True)
    w2 = rand(12, 14, dtype=torch.float16).requires_grad_(True)
    y = tilefuse.gemm(a2, w2, activation="gelu")
    y.float().sum().backward()
    a3, w3 = a2.detach().float().requires_grad_(True), w2.detach().float().requires_grad_(True)
    F.gelu(a3 @ w3).sum().backward()
    assert_close(y, F.gelu(a3 @ w3), torch.float16)
    assert_close(a2.grad, a3.grad, torch.float16)
    assert_close(w2.grad, w3.grad, torch.float16)


def test_calls_whose_kernels_see_copies_are_not_planned():
    # a non-contiguous per-row scale is copied to a contiguous vector: the kernel does not see the user's
    # tensor, so the signature runs the full path every time (and stays right)
    m, n, k = 12, 16, 32
    a = rand(m, k).to(torch.float8_e4m3fn)
    b = rand(k, n).to(torch.float8_e4m3fn)
    sa = (rand(m, 2).abs() + 0.1)[:, :1]
    sb = torch.tensor(0.5)
    for _ in range(2):
        got = tilefuse.gemm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.float32)
        assert_close(got, (a.double() * sa.double()) @ b.double() * 0.5, tol=1e-5)
    assert gemm_plan.plan_count() == 0


def test_zero_sizes_are_not_planned():
    assert tilefuse.gemm(rand(0, 4), rand(4, 5)).shape == (0, 5)
    assert torch.equal(tilefuse.gemm(rand(3, 0), rand(0, 5)), torch.zeros(3, 5))
    assert gemm_plan.plan_count() == 0


def test_errors_still_raise_after_a_plan_exists():
    a, b = rand(5, 6), rand(6, 7)
    tilefuse.gemm(a, b)
    with pytest.raises(ValueError, match="K="):
        tilefuse.gemm(a, rand(5, 7))
    with pytest.raises(TypeError, match="dtype"):
        tilefuse.gemm(a, b.half())
    with pytest.raises(ValueError, match="quantize"):
        tilefuse.gemm(a, b, quantize=["int8"])  # unhashable: the full path names the argument


def test_settings_and_tuner_changes_drop_plans():
    a, b = rand(5, 6), rand(6, 7)
    tilefuse.gemm(a, b)
    assert gemm_plan.plan_count() == 1
    gemm_tuning.forget()
    tilefuse.gemm(a, b)
    assert gemm_plan.plan_count() == 1  # dropped, then made again
    with config.override(debug=0):
        tilefuse.gemm(a, b)
        assert gemm_plan.plan_count() == 1


def test_host_path_is_cheap():
    # The Python path of a repeat call (launch stubbed): on a loaded 2-core CI box ~15 us, ~3x one empty
    # tensor allocation. The bound is loose (machines vary); the ratio is the regression guard.
    import timeit

    a, b = rand(64, 48, dtype=torch.float16), rand(48, 40, dtype=torch.float16)
    us = gemm_plan.host_path_us(a, b, calls=300, rounds=3)
    empty = min(timeit.repeat(lambda: a.new_empty((64, 40)), number=300, repeat=3)) / 300 * 1e6
    assert us < 8 * empty + 10, f"host path {us:.1f} us against {empty:.1f} us for one allocation"


def test_prepare_is_the_only_checker():
    # the plan key must cover everything prepare() checks: prepare reads no global state but the device
    import inspect

    src = inspect.getsource(gemm_checks.prepare)
    assert "config.get" not in src and "os.environ" not in src
