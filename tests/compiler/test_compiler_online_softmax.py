"""The looped reduction form's online softmax (codegen/kernel_writer.py online_pairs): ``m = max(x)`` and ``s = sum(exp(x - m))``
in one loop with a running maximum, so a cross-entropy or a softmax over rows too long for registers reads each
row once fewer. Here the interpreter's limits are lowered so rows of a few hundred take the looped form in
several steps, with inputs whose maximum grows from step to step, -inf runs (masked scores), whole -inf rows,
NaN and +inf; each result is held to eager (float64 for the values; NaN where eager has NaN)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from tilefuse.compiler import codegen
from tilefuse.compiler.codegen import kernel_writer
from tilefuse.compiler.tuning import TUNING, tuning
from tilefuse.compiler.explain import explain

from tests.compiler_checks import kernel_sources, reset, stats, strict
from tests.support import assert_close, noncontiguous

ROWS, COLS = 9, 300  # 5 loop steps of 64


@pytest.fixture
def looped(monkeypatch):
    monkeypatch.setattr(kernel_writer, "INTERP_PERSISTENT_MAX_R", 64)
    monkeypatch.setattr(kernel_writer, "INTERP_BLOCK", 64)
    reset()
    yield
    torch._dynamo.reset()


def _rows(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(ROWS, COLS, generator=g) * 3
    x[0] = torch.linspace(-20, 20, COLS)  # the maximum grows at every step: every rescale is exercised
    x[1] = torch.linspace(20, -20, COLS)  # the maximum is in the first step
    x[2, :150] = -float("inf")            # a row that starts with masked scores
    x[3] = -float("inf")                  # a whole masked row (eager: NaN for softmax)
    x[4, 200] = float("nan")
    x[5, 10] = float("inf")
    x[6, 299] = 1e4                       # the last element dominates
    x[7, :100] = -float("inf")            # -inf, then the lowest finite float32 (the value the running
    x[7, 100:] = -3.4028234663852886e38   # maximum is clamped to in the step's difference)
    return x


def _check(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan), f"{what}: NaN where eager has none or the other way round " \
                                               f"(got {torch.isnan(got).nonzero().tolist()[:6]}, " \
                                               f"want {nan.nonzero().tolist()[:6]})"
    inf = torch.isinf(want)
    assert torch.equal(got[inf], want[inf]), f"{what}: infinities differ"
    fin = ~(nan | inf)
    assert_close(got[fin].double(), want[fin], torch.float32, what=what)


def _loops(ex) -> list[int]:
    """Loops over the row in each looped kernel the explanation lists (a peeled partial step, the loop
    ``range(rfull, rnumel, RBLOCK)`` after its loop's full steps, is part of that loop)."""
    out = []
    for k in ex.kernels:
        if k.form == "looped" and k.path:
            text = Path(k.path).read_text()
            out.append(text.count("for roffset in range") - text.count("for roffset in range(rfull, "))
    return out


@pytest.mark.parametrize("fn", [lambda x: torch.softmax(x, -1), lambda x: torch.log_softmax(x, -1)],
                         ids=["softmax", "log_softmax"])
def test_long_row_softmax_matches_eager(looped, fn):
    x = noncontiguous(_rows(1))
    with strict():
        got = torch.compile(fn, backend="tilefuse")(x)
    _check(got, fn(x.double()), "compiled")
    assert int(stats()["kernels"]) >= 1


def test_cross_entropy_forward_backward(looped):
    g = torch.Generator().manual_seed(2)
    x = _rows(3)[[0, 1, 2, 6, 7, 8]].clone().requires_grad_()  # finite losses only: the gradient is compared
    target = torch.randint(0, COLS, (x.shape[0],), generator=g)
    target[2] = 250  # a target among the real scores of the row that starts with -inf

    def f(x, t):
        return F.cross_entropy(x, t)

    with strict():
        loss = torch.compile(f, backend="tilefuse")(x, target)
        (gx,) = torch.autograd.grad(loss, x)
    x64 = x.detach().double().requires_grad_()
    ref = f(x64, target)
    (gref,) = torch.autograd.grad(ref, x64)
    assert_close(loss.detach().double(), ref.detach(), torch.float32, what="loss")
    _check(gx, gref, "grad")


@pytest.mark.parametrize("case", ["log_softmax", "cross_entropy"])
def test_one_loop_fewer_and_the_same_result_as_two_passes(looped, case):
    """The pair is one loop; with the switch off the same graph has the max's loop and the sum's loop.
    (A logsumexp does not pair: torch's decomposition subtracts where(|max| == inf, 0, max), not the max.)"""
    x = _rows(4)
    target = torch.randint(0, COLS, (ROWS,), generator=torch.Generator().manual_seed(5))

    def f(x):
        if case == "log_softmax":
            return torch.log_softmax(x, -1)
        return F.cross_entropy(x, target, reduction="none")

    results, loops = {}, {}
    for online in (True, False):
        reset()
        with tuning(online_softmax=online), strict():
            ex = explain(f, x)
        results[online], loops[online] = ex.result, _loops(ex)
    assert sum(loops[True]) == sum(loops[False]) - 1, loops
    _check(results[True], results[False].double(), "online against two passes")
    _check(results[True], f(x.double()), "online against eager")


def test_the_pair_max_is_an_output_too(looped):
    """The running maximum is the row max the graph returns: NaN rows give NaN, -inf rows -inf."""
    x = _rows(6)

    def f(x):
        m = x.amax(-1, keepdim=True)
        return m, torch.exp(x - m).sum(-1)

    reset()
    with strict():
        ex = explain(f, x)
    assert sum(_loops(ex)) == 1, _loops(ex)  # the max and the sum in one loop
    for got, want, what in zip(ex.result, f(x.double()), ("max", "sum")):
        _check(got, want, what)


@pytest.mark.parametrize("form", ["persistent", "looped"])
def test_softmax_divides_by_its_sum_once_a_row(monkeypatch, form):
    """softmax's exp(x - max) / sum is written as a product by 1 / sum (the sum is >= 1 or NaN, so the
    reciprocal cannot overflow): no division an element, the same values as eager's float64 (NaN rows, -inf
    runs and whole -inf rows included)."""
    import re
    if form == "looped":
        monkeypatch.setattr(kernel_writer, "INTERP_PERSISTENT_MAX_R", 64)
        monkeypatch.setattr(kernel_writer, "INTERP_BLOCK", 64)
    reset()
    x = noncontiguous(_rows(7))
    with strict():
        ex = explain(lambda t: torch.softmax(t, -1), x)
    text = "\n".join(kernel_sources(ex))
    assert re.search(r"\(1\.0 / red\d+\)", text), text
    assert not re.search(r"[^0.] / red\d+\)", text.replace("(1.0 / red", "")), text
    _check(ex.result, torch.softmax(x.double(), -1), "softmax")
    torch._dynamo.reset()


def test_a_division_by_another_row_sum_stays_a_division():
    """x / sum(|x|) may have a sum below 2^-126, whose reciprocal would overflow: left a division."""
    import re
    reset()
    x = torch.randn(ROWS, COLS) * 1e-41  # float32 subnormals: the row sums are too
    x[0] = torch.linspace(-1, 1, COLS)
    with strict():
        ex = explain(lambda t: t / t.abs().sum(-1, keepdim=True), x)
    text = "\n".join(kernel_sources(ex))
    assert re.search(r"/ red\d+\)", text) and not re.search(r"\(1\.0 / red\d+\)", text), text
    want = x.double() / x.double().abs().sum(-1, keepdim=True)
    assert torch.isfinite(ex.result).all()
    assert_close(ex.result.double(), want, torch.float32)
    torch._dynamo.reset()


@pytest.mark.parametrize("cols,peel", [(300, True), (300, False), (320, True)])
def test_the_partial_last_step_runs_apart(looped, cols, peel):
    """300 columns in steps of 64: four full steps with the row mask folded to a constant, then the partial
    step with the test (TUNING peel_loop_tail; off: one loop, every step tested); 320 = 5 x 64 has no
    partial step and one loop with the constant mask. Each gives eager's softmax and log_softmax."""
    x = _rows(7)
    x = torch.cat([x, x[:, : cols - COLS]], 1) if cols > COLS else x[:, :cols]

    def f(x):
        return torch.softmax(x, -1), torch.log_softmax(x, -1)

    with tuning(peel_loop_tail=peel), strict():
        ex = explain(f, x)
    text = "\n".join(Path(k.path).read_text() for k in ex.kernels if k.form == "looped" and k.path)
    assert text
    folded = "rmask = tl.full([1, RBLOCK], 1, tl.int1)" in text
    tail = "for roffset in range(rfull, rnumel, RBLOCK)" in text
    assert (folded, tail) == ((True, True) if cols % 64 and peel else (False, False) if cols % 64 else
                              (True, False)), (cols, peel)
    want = f(x.double())
    for got, w, what in zip(ex.result, want, ("softmax", "log_softmax")):
        _check(got, w, f"{what} at {cols} columns")


def test_a_one_hot_sum_is_its_one_term(looped):
    """sum_i where(i == t, v, 0) * c over a long row (the looped form) is where(0 <= t < n, v * c, 0), no
    loop: targets in range, at both ends, and out of it on both sides (-1, n, n + 5: no term, 0)."""
    n = COLS
    t = torch.tensor([0, 5, n - 1, -1, n, n + 5, 150, 299, 42])
    v = torch.linspace(-2, 3, ROWS)
    c = torch.linspace(0.5, 1.5, ROWS)

    def f(t, v, c):
        hot = torch.arange(n)[None, :] == t[:, None]
        return (torch.where(hot, v[:, None], 0.0) * c[:, None]).sum(-1)

    with strict():
        ex = explain(f, t, v, c)
    texts = kernel_sources(ex)
    assert texts and not any("for roffset" in s for s in texts), texts
    want = f(t, v.double(), c.double())
    assert torch.allclose(ex.result.double(), want), (ex.result, want)
    assert ex.result[3:6].abs().max().item() == 0.0
    with tuning(one_hot_sums=False), strict():
        reset()
        ex = explain(f, t, v, c)
    assert any("for roffset" in s for s in kernel_sources(ex))
    assert torch.allclose(ex.result.double(), want)
