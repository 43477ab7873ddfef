"""Split reductions (lowering/reductions.py, split_factor): a reduction with few outputs and long rows becomes two
kernels, partials over row chunks then the partials' reduction. On the GPU this is what makes a layer norm's
backward (its weight and bias gradients are column sums over every row) use the whole machine; here the
thresholds are lowered so the interpreter's small shapes take the same path, and every result is held to a
float64 reference."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from tilefuse.compiler.lowering import reductions as LR
from tilefuse.compiler.tuning import tuning

from tests.compiler_checks import reset, stats, strict
from tests.support import assert_close, noncontiguous


@pytest.fixture
def small_split(monkeypatch):
    """Thresholds for interpreter-sized shapes: rows of 64 and more split, into chunks of at least 16."""
    monkeypatch.setattr(LR, "SPLIT_MIN_R", 64)
    monkeypatch.setattr(LR, "SPLIT_MIN_CHUNK", 16)
    monkeypatch.setattr(LR, "SPLIT_TARGET_PROGRAMS", 8)
    reset()
    yield
    torch._dynamo.reset()


def _norm_operands(seed: int, rows: int = 301, cols: int = 67):
    """A norm's input (non-contiguous), weight and bias (all requiring grad) and an output gradient."""
    g = torch.Generator().manual_seed(seed)
    x = noncontiguous(torch.randn(rows, cols, generator=g)).requires_grad_()
    w = torch.randn(cols, generator=g).requires_grad_()
    b = torch.randn(cols, generator=g).requires_grad_()
    return x, w, b, torch.randn(rows, cols, generator=g)


def _assert_grads_are_float64s(f, inputs, dy, grads, what: str = "") -> None:
    """``grads`` (of x, weight, bias) are those of ``f`` at ``inputs`` in float64, within float32's tolerance."""
    ref_inputs = [t.detach().double().requires_grad_() for t in inputs]
    ref_grads = torch.autograd.grad(f(*ref_inputs), ref_inputs, dy.double())
    for name, got, want in zip(("x", "weight", "bias"), grads, ref_grads):
        assert_close(got, want, torch.float32, what=f"grad {name}{what}")


def test_split_factor_of_the_benchmark_shapes():
    # layer norm's weight gradient at 32768 x 4096: 256 chunks of 128 rows (the tuning table's
    # split_outer_chunks: enough programs when the first stage runs in the row kernel, one per chunk)
    assert LR.split_factor((32768, 4096), (0,), "sum") == 256
    # a row reduction with many rows, or a short reduction, is left alone
    assert LR.split_factor((32768, 4096), (1,), "sum") == 1
    assert LR.split_factor((64, 4096), (0,), "sum") == 1
    # a full reduction of a large tensor: one program would read it all
    assert LR.split_factor((32768, 4096), (0, 1), "sum") == 1024
    # argmax keeps its (value, index) pairs in one pass
    assert LR.split_factor((32768, 4096), (0,), "argmax") == 1
    # from split_outer_min_r (1024) rows a column sum at most split_outer_short_max_cols wide splits into chunks
    # of split_outer_min_rows (8): 128 of them; a wider one (a bias gradient over a vocabulary), one over fewer rows
    # and a row reduction keep SPLIT_MIN_R
    assert LR.split_factor((1024, 4096), (0,), "sum") == 128
    assert LR.split_factor((2048, 8192), (0,), "sum") == 256
    assert LR.split_factor((1024, 32000), (0,), "sum") == 1
    assert LR.split_factor((512, 4096), (0,), "sum") == 1
    assert LR.split_factor((4096, 1024), (1,), "sum") == 1
    # rows over several dimensions (a (batch, sequence, hidden) activation) split as the same rows over one do
    assert LR.split_factor((8, 128, 4096), (0, 1), "sum") == 128
    assert LR.split_factor((8, 4096, 4096), (0, 1), "sum") == 256
    # the settings before decision 058: unsplit below SPLIT_MIN_R, or 32 chunks of 32 rows from 1024 rows
    with tuning(split_outer_min_r=None):
        assert LR.split_factor((1024, 4096), (0,), "sum") == 1
        assert LR.split_factor((32768, 4096), (0,), "sum") == 256
    with tuning(split_outer_min_rows=32):
        assert LR.split_factor((1024, 4096), (0,), "sum") == 32


def test_column_sums_split_from_their_own_threshold_match_float64():
    """A layer norm's weight and bias gradients split by split_outer_min_r alone (SPLIT_MIN_R as it is): the
    backward gets a second stage, and every gradient is a float64 reference's."""
    x, w, b, dy = _norm_operands(13)
    rows, cols = x.shape

    def f(x, w, b):
        return F.layer_norm(x, (cols,), w, b, 1e-5)

    assert LR.split_factor((rows, cols), (0,), "sum") == 1
    counts = []
    for setting in ({}, {"split_outer_min_r": 64}):
        reset()
        torch._dynamo.reset()
        with tuning(**setting), strict():
            # (32 chunks by the thresholds, of 301 // 32 = 9 rows: 34 of them, the last of 4 rows)
            assert LR.split_factor((rows, cols), (0,), "sum") == (34 if setting else 1)
            out = torch.compile(f, backend="tilefuse")(x, w, b)
            grads = torch.autograd.grad(out, (x, w, b), dy)
        counts.append(int(stats()["kernels"]))
        _assert_grads_are_float64s(f, (x, w, b), dy, grads, f" {setting}")
    assert counts[1] > counts[0], f"kernels unsplit / split: {counts}"
    torch._dynamo.reset()


@pytest.mark.parametrize("case", ["sum_all", "sum_cols_keepdim", "amax_cols", "any_cols", "sum_two_dims", "var_cols",
                                  "prod_cols", "sum_transposed"])
def test_split_reductions_match_float64(small_split, case):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(301, 67, generator=g)
    fns = {
        "sum_all": (lambda t: t.sum(), x),
        "sum_cols_keepdim": (lambda t: t.sum(0, keepdim=True), x),
        "amax_cols": (lambda t: t.amax(0), x),
        "any_cols": (lambda t: (t > 2.5).any(0), x),
        "sum_two_dims": (lambda t: t.sum((0, 1)), torch.randn(13, 11, 7, generator=g)),
        "var_cols": (lambda t: t.var(0), x),
        "prod_cols": (lambda t: (1 + t * 1e-2).prod(0), x),
        "sum_transposed": (lambda t: t.t().sum(1), noncontiguous(x)[:, :3]),
    }
    fn, arg = fns[case]
    with strict():
        out = torch.compile(fn, backend="tilefuse")(arg)
    ref = fn(arg.double())
    assert out.shape == ref.shape
    if out.dtype == torch.bool:
        assert torch.equal(out, ref)
    else:
        assert_close(out, ref, torch.float32)
    assert int(stats()["kernels"]) >= 2, "the reduction was not split into two kernels"


def test_layer_norm_gelu_backward_with_split_column_sums(small_split):
    x, w, b, dy = _norm_operands(11)
    cols = x.shape[1]

    def f(x, w, b):
        return F.gelu(F.layer_norm(x, (cols,), w, b, 1e-5))

    with strict():
        out = torch.compile(f, backend="tilefuse")(x, w, b)
        grads = torch.autograd.grad(out, (x, w, b), dy)
    assert_close(out, f(*(t.detach().double() for t in (x, w, b))), torch.float32)
    _assert_grads_are_float64s(f, (x, w, b), dy, grads)


@pytest.mark.parametrize("looped", [False, True], ids=["persistent", "looped"])
def test_residual_sum_output_and_its_norm_in_one_kernel(monkeypatch, looped):
    """h = x + r is an output and the layer norm's input: one kernel writes both (Inductor's fusion)."""
    from tilefuse.compiler import codegen
    from tilefuse.compiler.codegen import kernel_writer

    if looped:
        monkeypatch.setattr(kernel_writer, "INTERP_PERSISTENT_MAX_R", 64)
    reset()
    g = torch.Generator().manual_seed(5)
    x, r = torch.randn(33, 257, generator=g), noncontiguous(torch.randn(33, 257, generator=g))
    w, b = torch.randn(257, generator=g), torch.randn(257, generator=g)

    def f(x, r, w, b):
        h = x + r
        return h, F.layer_norm(h, (257,), w, b, 1e-5)

    with strict():
        h, y = torch.compile(f, backend="tilefuse")(x, r, w, b)
    h64, y64 = f(x.double(), r.double(), w.double(), b.double())
    assert_close(h, h64, torch.float32, what="h")
    assert_close(y, y64, torch.float32, what="norm")
    assert int(stats()["kernels"]) == 1
    reset()


def test_split_half_sum_rounds_only_its_result(small_split):
    """Fuzzer finding: stage 2 rounded each float32 partial to the output's bfloat16 before summing them, so a
    split bfloat16 column sum was up to 13 ulps off (eager accumulates in float32 and rounds once). Every
    output is now within one bfloat16 rounding of the exact sum."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(301, 67, generator=g).to(torch.bfloat16)
    fn = lambda t: (t * 3).sum(0)  # noqa: E731
    with strict():
        out = torch.compile(fn, backend="tilefuse")(x)
    exact = (x * 3).double().sum(0)  # of eager's bfloat16 products
    assert ((out.double() - exact).abs() <= exact.abs() * 2.0**-8 + 1e-6).all(), (out.double() - exact).abs().max()


_COLUMN_SUM_GRAPHS = {
    "layer_norm": lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b, 1e-5),
    "rms_norm": lambda x, w, b: F.rms_norm(x, (x.shape[-1],), w, 1e-6) + b,
    "gelu_bias": lambda x, w, b: F.gelu(x * w + b),
}


@pytest.mark.parametrize("shape", [(1024, 67), (1037, 67), (16, 64, 67), (20, 64, 67), (4, 5, 64, 67), (17, 61, 67)],
                         ids=["1024", "1037", "16x64", "20x64", "4x5x64", "17x61"])
@pytest.mark.parametrize("graph", sorted(_COLUMN_SUM_GRAPHS))
def test_default_column_split_from_1024_rows_matches_float64(graph, shape):
    """Decision 058's default plan, thresholds as they are: from 1024 rows the weight and bias gradients are
    summed in chunks of 8 rows inside the backward's row kernel (the row-loop form, ``tfk_redc_*``), one program
    a chunk, then the partials, whether the rows are one dimension or two (16 sequences of 64 tokens, a model's
    activations; 20 x 64 rows make chunks of 10 that straddle sequences, 4 x 5 x 64 rows are three dimensions).
    1037 rows (also as 17 x 61) are 129 chunks of 8 and a last one of 5, in the row kernel too: for a norm, and for
    the GeLU chain, whose input gradient (no row reduction to loop over) takes its scale's and bias's first stages
    into a row loop of its own (as where the chunks tile the rows: two kernels in all).
    Every gradient is a float64 reference's."""
    from tilefuse.compiler import records

    f = _COLUMN_SUM_GRAPHS[graph]
    g = torch.Generator().manual_seed(17)
    cols = shape[-1]
    x = noncontiguous(torch.randn(*shape, generator=g)).requires_grad_()
    w = torch.randn(cols, generator=g).requires_grad_()
    b = torch.randn(cols, generator=g).requires_grad_()
    dy = torch.randn(*shape, generator=g)
    reduced = tuple(range(len(shape) - 1))
    rows = math.prod(shape[:-1])
    factor = LR.split_factor(shape, reduced, "sum")
    assert factor == (130 if rows == 1037 else 128), factor
    reset()
    torch._dynamo.reset()
    with strict():
        out = torch.compile(f, backend="tilefuse")(x, w, b)
        grads = torch.autograd.grad(out, (x, w, b), dy)
    _assert_grads_are_float64s(f, (x, w, b), dy, grads, f" ({graph}, {shape})")
    backward, = [r for r in records.REPORTS if r.kind == "backward"]
    names = [k.name for k in backward.kernels]
    assert any(n.startswith("tfk_redc_") for n in names), names
    assert len(names) >= 2, names  # (at least the first stage and the partials' sum)
    if graph == "gelu_bias":  # the row loop (dx and both first stages) and the partials' sums
        assert len(names) == 2, names
    torch._dynamo.reset()
