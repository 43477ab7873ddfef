"""Bounds safety of generated kernels (DESIGN.md, Tests): an out-of-range data-dependent index is an error as in
eager, never a read of garbage; an integer division by zero raises as eager's CPU kernels do; and the
interpreter's bounds-checking mode (``config.override(check_bounds=True)``, tilefuse.compiler.runtime.interpreter_check)
catches a stray load or store at its source."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tilefuse import config
from tilefuse.compiler import codegen
from tilefuse.compiler.codegen import kernel_writer
from tilefuse.compiler.runtime import interpreter_check

from tests.compiler_checks import assert_matches, collect_kernels, compiled, reset, strict

W = 10  # rows of the indexed tensor


def _cases():
    """name -> (fn(x, idx), make(v): an index tensor holding v, the size of the dim it indexes); x is (W, 3)."""
    return {
        "embedding": (lambda x, i: F.embedding(i, x), lambda v: torch.tensor([1, v, 0]), W),
        "gather": (lambda x, i: torch.gather(x, 0, i), lambda v: torch.tensor([[1, v, 0]]), W),
        "index_select": (lambda x, i: torch.index_select(x, 0, i), lambda v: torch.tensor([1, v]), W),
        "x[idx]": (lambda x, i: x[i], lambda v: torch.tensor([[1, v], [2, 3]]), W),
        "x[:, idx]": (lambda x, i: x.t()[:, i], lambda v: torch.tensor([1, v]), W),
        "take": (lambda x, i: torch.take(x, i), lambda v: torch.tensor([1, v]), 3 * W),
        "index_put": (lambda x, i: x.index_put((i,), torch.ones(2, 3)), lambda v: torch.tensor([1, v]), W),
        "scatter": (lambda x, i: x.scatter(0, i, 2.0), lambda v: torch.tensor([[1, v, 0]]), W),
        "scatter_rows": (lambda x, i: x.t().scatter(1, i, 2.0), lambda v: torch.tensor([[1], [v], [0]]), W),
        "scatter_add": (lambda x, i: x.scatter_add(0, i, torch.ones(1, 3)), lambda v: torch.tensor([[1, v, 0]]), W),
    }


WRAPPING = {"x[idx]", "x[:, idx]", "take", "index_put"}  # a negative index counts from the end


def _eager_error(fn, *args):
    try:
        fn(*args)
    except Exception as exc:  # noqa: BLE001 (the type eager raises is what the compiled call must raise)
        return exc
    return None


@pytest.mark.parametrize("bad", ["past_end", "negative"])
@pytest.mark.parametrize("case", sorted(_cases()))
def test_out_of_range_index_raises_like_eager(case, bad):
    fn, make, size = _cases()[case]
    x = torch.randn(W, 3)
    value = {"past_end": size, "negative": -size - 1}[bad]
    idx = make(value)
    expected = _eager_error(fn, x, idx)
    assert expected is not None, f"eager accepted {case} with index {value}"
    reset()
    with pytest.raises(type(expected)) as info:
        compiled(fn)(x, idx)
    if isinstance(info.value, interpreter_check.KernelIndexError):
        # the offending index, the dim's size and the ATen op are named
        assert f"index {value} is out of bounds for a dim of size {size} in aten." in str(info.value), str(info.value)


@pytest.mark.parametrize("case", sorted(_cases()))
def test_in_range_indices_match_eager(case):
    fn, make, size = _cases()[case]
    x = torch.randn(W, 3)
    for v in (2, size - 1) + ((-1, -size) if case in WRAPPING else ()):  # negatives count from the end
        idx = make(v)
        reset()
        assert_matches(f"{case} at {v}", compiled(fn)(x, idx), fn(x, idx))
    if case not in WRAPPING:  # embedding, gather, index_select, scatter: a negative index is an error
        assert _eager_error(fn, x, make(-1)) is not None
        reset()
        with pytest.raises((IndexError, RuntimeError)):
            compiled(fn)(x, make(-1))


def test_out_of_range_index_in_a_fused_kernel():
    """The index check holds inside a fusion (embedding + scale + residual, with its backward)."""
    emb = torch.randn(W, 4, requires_grad=True)
    fn = lambda w, i, r: (F.embedding(i, w) * 2 + r).sum(-1)
    idx = torch.tensor([[0, 9], [3, 4]])
    r = torch.randn(2, 2, 4)
    reset()
    out = compiled(fn)(emb, idx, r)
    assert_matches("embedding fused", out, fn(emb, idx, r), fn(emb.double(), idx, r.double()))
    with pytest.raises(IndexError, match="aten.embedding"):
        compiled(fn)(emb, torch.tensor([[0, 9], [3, 10]]), r)


def test_proven_indices_are_not_checked(monkeypatch):
    """An index whose range is known (an arange, a clamp) reads without an assert; a loaded one has one, and
    its kernel carries the compile options that keep it on a GPU."""
    kernels = collect_kernels(monkeypatch)
    x = torch.randn(W, 3)
    reset()
    with strict():
        compiled(lambda t: t[torch.arange(W, device=t.device).flip(0).clamp(max=W - 1)] * 2)(x)
    assert kernels and all("tl.device_assert" not in k.source for k in kernels), [k.source for k in kernels]
    assert all(k.options == () for k in kernels)
    kernels.clear()
    reset()
    with strict():
        compiled(lambda t, i: t[i] * 2)(x, torch.tensor([1, 2]))
    assert any("tl.device_assert" in k.source for k in kernels)
    assert all(k.options == codegen.ASSERT_OPTIONS for k in kernels if "tl.device_assert" in k.source)


# ------------------------------------------------------------------------------- integer division by zero
DIVISIONS = {
    "floor_divide": lambda a, b: a // b,
    "remainder": lambda a, b: a % b,
    "fmod": lambda a, b: torch.fmod(a, b),
    "div_trunc": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    "div_floor": lambda a, b: torch.div(a, b, rounding_mode="floor"),
}


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16])
@pytest.mark.parametrize("op", sorted(DIVISIONS))
def test_integer_division_by_zero_matches_eager(op, dtype):
    fn = DIVISIONS[op]
    a = torch.tensor([7, -7, 5, 0, 3], dtype=dtype)
    b = torch.tensor([2, 3, -4, 5, 0], dtype=dtype)
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        fn(a, b)
    reset()
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        compiled(fn)(a, b)
    reset()
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        compiled(lambda t: fn(t, 0))(a)
    good = torch.tensor([2, 3, -4, 5, 1], dtype=dtype)
    reset()
    assert_matches(op, compiled(fn)(a, good), fn(a, good))


def test_zero_divisors_eager_accepts_do_not_raise():
    """lcm's guarded division, float division by zero (inf), and masked-off lanes (a pad's border, where
    the divisor's load reads nothing) raise nothing."""
    a = torch.tensor([4, 0, 6, -3])
    b = torch.tensor([6, 5, 0, 2])
    for fn in (lambda x, y: torch.lcm(x, y), lambda x, y: x.float() // y.float(),
               lambda x, y: F.pad((x // y.clamp(min=1)).view(2, 2), (1, 1, 2, 0)),
               lambda x, y: torch.cat([x // (y + 1), x]) ):
        reset()
        assert_matches("no error", compiled(fn)(a, b), fn(a, b))


# --------------------------------------------------------------------------------- bounds-checking mode
def _off_by_one_stores(monkeypatch):
    """Generated stores one element past where they belong (a deliberately broken code generator)."""
    store = kernel_writer.KernelWriter.store_root

    def broken(self, r, value, scope, level_mask):
        store(self, r, value, scope, level_mask)
        scope.lines[-1] = scope.lines[-1].replace("tl.store(out_ptr0 + (", "tl.store(out_ptr0 + (1 + ")

    monkeypatch.setattr(kernel_writer.KernelWriter, "store_root", broken)


def test_check_mode_catches_a_stray_store(monkeypatch):
    _off_by_one_stores(monkeypatch)
    x = torch.randn(7, 5)
    reset()
    with config.override(check_bounds=True), pytest.raises(interpreter_check.OutOfBoundsAccess) as info:
        compiled(lambda t: t * 2 + 1)(x)
    msg = str(info.value)
    assert "store out of bounds in kernel tfk_" in msg and "out_ptr0 (shape [7, 5]" in msg, msg
    assert "element offset 35" in msg and "[0, 35)" in msg, msg


def test_check_mode_catches_a_stray_load_through_a_view(monkeypatch):
    """A load past its input's storage: a view of a bigger buffer may be read anywhere in that buffer, not
    past it."""
    module = kernel_writer.KernelWriter.module

    def broken(self, body_lines, *rest):
        body_lines = [line.replace("tl.load(in_ptr0 + (", "tl.load(in_ptr0 + (30 + ") for line in body_lines]
        return module(self, body_lines, *rest)

    monkeypatch.setattr(kernel_writer.KernelWriter, "module", broken)
    base = torch.randn(6, 8)
    view = base[1:, 2:5]  # storage offset 10 of a storage of 48 elements: offsets -10 .. 37 are inside it
    reset()
    with config.override(check_bounds=True), pytest.raises(interpreter_check.OutOfBoundsAccess) as info:
        compiled(lambda t: t.exp())(view)
    msg = str(info.value)
    assert "load out of bounds" in msg and "in_ptr0 (shape [5, 3], stride [8, 1]" in msg, msg
    assert "element offset 38" in msg and "[-10, 38)" in msg, msg


def test_check_mode_passes_correct_kernels():
    """No false alarm: views with storage offsets, transposes, indirect loads, reductions, a backward."""
    w = torch.randn(W, 6, requires_grad=True)
    base = torch.randn(5, 12)
    x = base[1:, 3:9].t()  # (6, 4), strided, storage offset 15

    def fn(w, i, x):
        e = F.embedding(i, w)  # (2, 3, 6)
        h = torch.softmax(e @ x, -1)
        return (h.sum(0) * x[:3]).sum() + torch.gather(w, 1, i.t()[:, 1:].expand(3, 2)).mean()

    i = torch.tensor([[0, 3, 9], [1, 1, 2]])
    reset()
    with config.override(check_bounds=True):
        out = compiled(fn)(w, i, x)
        (g,) = torch.autograd.grad(out, w)
    eager = fn(w, i, x)
    (geager,) = torch.autograd.grad(eager, w)
    w64 = w.detach().double().requires_grad_()
    ref = fn(w64, i, x.double())
    (gref,) = torch.autograd.grad(ref, w64)
    assert_matches("check mode forward", out, eager, ref)
    assert_matches("check mode backward", g, geager, gref)


def test_config_reads_the_check_bounds_variable():
    assert config.load({"TILEFUSE_CHECK_BOUNDS": "1"}).check_bounds is True
    assert config.load({}).check_bounds is False
    with pytest.raises(ValueError, match="TILEFUSE_CHECK_BOUNDS"):
        config.load({"TILEFUSE_CHECK_BOUNDS": "maybe"})
