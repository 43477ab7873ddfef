"""Every indirect-indexing rule, forward and backward, against eager and a float64 reference.

The lowering builds data-dependent loads (``ir.Indirect``) for ``embedding``, ``index_select``, ``gather``,
advanced indexing with one or several index tensors (``x[idx]``, ``x[:, idx]``, ``x[a, b]``, ``x[a, :, b]``, with
torch's rule for where the broadcast index shape goes; ``take`` reaches it through a flatten) and the one-hot
``scatter``. ``index_put`` with accumulate at one run of adjacent dimensions (the backward of an embedding, of
``x[a, b]``, of ``x[:, a, b]``) is the library's deterministic kernel, an extern by design. The rest
(``scatter_add``, boolean masks, ``scatter_reduce``, ``index_add``, ``index_put`` without accumulate or at
dimensions that are not adjacent) run as ATen externs.
So the forward of a lowered op is checked in strict mode (a fallback raises), and forward + backward run
non-strict with the forward's op required not to have fallen back, or strict where the backward has a kernel too.
Sizes 1, 7 and 129 (the index count and the indexed dimension), non-contiguous NaN-poisoned sources
(``support.noncontiguous``: a read of the gap shows), negative in-range indices where the op wraps them, repeated indices (the backward accumulates), int32
and int64 indices. A consumer fused after the gather (``* 2 + 1``) puts the indirect load inside a larger
kernel, where its index expression is composed with the consumer's.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests import compiler_checks as cc
from tests.support import noncontiguous

SIZES = (1, 7, 129)
# the ATen overloads with lowering rules (as tilefuse names them in its fallback records)
EMB, ISEL, INDEX, GATHER = "aten.embedding.default", "aten.index_select.default", "aten.index.Tensor", \
    "aten.gather.default"
SCATTER = "aten.scatter."
INDEX_DTYPES = (torch.int64, torch.int32)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def source(*shape, noncontig=False, grad=True):
    t = torch.randn(*shape)
    if noncontig:
        t = noncontiguous(t)
    return t.requires_grad_(grad)


def indices(n: int, size: int, dtype=torch.int64, *, repeat=True, negative=False, shape=None) -> torch.Tensor:
    """``n`` indices into a dimension of ``size``: repeated (the first index again at the end), and, with
    ``negative``, every other one written as its negative equivalent ``i - size``."""
    idx = torch.randint(0, size, (n,))
    if repeat and n > 1:
        idx[-1] = idx[0]
    if n >= 3:
        idx[1] = size - 1  # the last row: an off-by-one past it reads out of bounds
    if negative:
        idx[::2] -= size
    idx = idx.to(dtype)
    return idx.reshape(shape) if shape is not None else idx


def check(fn, *inputs, what, lowered: tuple[str, ...], backward=True, strict_backward=False):
    """Forward in strict mode; then forward + backward with ``lowered`` required not to have fallen back (nothing
    may fall back with ``strict_backward``)."""
    fwd_inputs = [t.detach() if isinstance(t, torch.Tensor) else t for t in inputs]
    cc.check_function(fn, *fwd_inputs, what=f"{what} (forward, strict)", backward=False)
    if backward:
        cc.check_function(fn, *inputs, what=f"{what} (forward + backward)", strict_mode=strict_backward,
                          not_fallen_back=lowered)


def fused(fn):
    """``fn`` with a pointwise consumer, so the indirect load sits inside a larger kernel."""
    return lambda *a: fn(*a) * 2.0 + 1.0


# ------------------------------------------------------------------------------------------- embedding
@pytest.mark.parametrize("rows", SIZES)
@pytest.mark.parametrize("idx_dtype", INDEX_DTYPES)
def test_embedding(rows, idx_dtype):
    w = source(rows, 129)
    idx = indices(7, rows, idx_dtype, shape=None)
    check(fused(lambda w, i: F.embedding(i, w)), w, idx, what=f"embedding {rows} rows", lowered=(EMB,),
          strict_backward=True)


@pytest.mark.parametrize("padding_idx", [0, 3, -1])
def test_embedding_padding_idx(padding_idx):
    """The padding row's gradient is zero (its uses are dropped from the accumulation), the others sum."""
    w = source(7, 33, noncontig=True)
    idx = torch.tensor([[3, 0, 6, 3], [1, 6, 0, 3]])
    check(lambda w, i: F.embedding(i, w, padding_idx=padding_idx), w, idx, what=f"embedding padding_idx={padding_idx}",
          lowered=(EMB,), strict_backward=True)


def test_embedding_repeated_indices_accumulate():
    """Every use of row 2 adds to its gradient: 5 uses of the same row."""
    w = source(7, 129)
    idx = torch.tensor([2, 2, 5, 2, 2, 2, 0])
    check(lambda w, i: F.embedding(i, w).sum(0), w, idx, what="embedding, one row used 5 times",
          lowered=(EMB,), strict_backward=True)


# ---------------------------------------------------------------------------------------- index_select
@pytest.mark.parametrize("dim", [0, 1, 2, -1])
@pytest.mark.parametrize("idx_dtype", INDEX_DTYPES)
def test_index_select_each_dim(dim, idx_dtype):
    x = source(7, 9, 129, noncontig=True)
    idx = indices(7, x.shape[dim], idx_dtype)
    check(fused(lambda x, i: x.index_select(dim, i)), x, idx, what=f"index_select dim={dim}",
          lowered=(ISEL,))


@pytest.mark.parametrize("size", SIZES)
def test_index_select_sizes(size):
    x = source(size, 33)
    idx = indices(size, size)
    check(lambda x, i: x.index_select(0, i), x, idx, what=f"index_select {size} of {size}", lowered=(ISEL,))


def test_index_select_0d_index_forward():
    x = source(7, 33, grad=False)
    cc.check_function(lambda x, i: x.index_select(1, i), x, torch.tensor(32), what="index_select 0-d index")


@pytest.mark.xfail(strict=True, raises=RuntimeError,
                   reason="finding: the backward of index_select with a 0-d index raises 'shape mismatch: value tensor "
                          "of shape [7, 1] cannot be broadcast to indexing result of shape [7]' in the index_put "
                          "extern; torch's own decomposition (tilefuse's table under aot_eager) fails the same way; "
                          "eager is fine")
def test_index_select_0d_index_backward():
    x = source(7, 33)
    cc.check_function(lambda x, i: x.index_select(1, i), x, torch.tensor(32), what="index_select 0-d index",
                      strict_mode=False, not_fallen_back=(ISEL,))


# ----------------------------------------------------------------------------------- advanced indexing
@pytest.mark.parametrize("negative", [False, True])
@pytest.mark.parametrize("idx_dtype", INDEX_DTYPES)
def test_advanced_index_first_dim(negative, idx_dtype):
    x = source(129, 7, noncontig=True)
    idx = indices(7, 129, idx_dtype, negative=negative)
    check(fused(lambda x, i: x[i]), x, idx, what=f"x[idx] negative={negative}", lowered=(INDEX,))


@pytest.mark.parametrize("negative", [False, True])
def test_advanced_index_second_dim(negative):
    x = source(7, 129)
    idx = indices(12, 129, negative=negative, shape=(3, 4))  # a 2-D index: its dims replace dim 1
    check(fused(lambda x, i: x[:, i]), x, idx, what=f"x[:, idx2d] negative={negative}", lowered=(INDEX,))


def test_advanced_index_last_dim_of_3d():
    x = source(3, 7, 9, noncontig=True)
    idx = indices(5, 9, negative=True)
    check(lambda x, i: x[..., i], x, idx, what="x[..., idx]", lowered=(INDEX,))


@pytest.mark.parametrize("size", SIZES)
def test_advanced_index_sizes(size):
    x = source(size, 7)
    idx = indices(size, size)
    check(lambda x, i: x[i], x, idx, what=f"x[idx] {size} of {size}", lowered=(INDEX,))


@pytest.mark.parametrize("idx_dtype", INDEX_DTYPES)
def test_advanced_index_two_index_tensors(idx_dtype):
    """x[idx1, idx2]: a gather at two data-dependent positions, and its backward an index_put with accumulate at
    the two dimensions (the library kernel's, flattened): both strict, negative and repeated pairs."""
    x = source(7, 129, noncontig=True)
    i1, i2 = indices(9, 7, idx_dtype, negative=True), indices(9, 129, idx_dtype)
    check(fused(lambda x, a, b: x[a, b]), x, i1, i2, what="x[idx1, idx2]", lowered=(INDEX,), strict_backward=True)


@pytest.mark.parametrize("form", ["broadcast", "three", "gap", "trailing"])
def test_advanced_index_several_index_tensors(form):
    """torch's rule for where the broadcast index shape goes: in place of adjacent indexed dimensions, first
    when a full slice separates them. The forward is lowered in every form; the backward of the gap form (index
    tensors not adjacent) is an ATen extern, the others the library's kernel."""
    x = source(5, 6, 7, noncontig=True)
    if form == "broadcast":  # (3, 1) with (4,): a (3, 4) grid of pairs, then the 7 columns
        fn, a, b = (lambda x, a, b: x[a, b]), indices(3, 5, negative=True, shape=(3, 1)), indices(4, 6)
    elif form == "three":
        c = indices(4, 7, negative=True)
        fn, a, b = (lambda x, a, b: x[a, b, c]), indices(4, 5), indices(4, 6)
    elif form == "gap":  # x[a, :, b]: the index shape first, then the sliced dim
        fn, a, b = (lambda x, a, b: x[a, :, b]), indices(3, 5), indices(3, 7, negative=True)
    else:  # x[:, a, b]: adjacent, not leading
        fn, a, b = (lambda x, a, b: x[:, a, b]), indices(2, 6, shape=(2, 1)), indices(3, 7)
    check(fused(fn), x, a, b, what=f"several index tensors ({form})", lowered=(INDEX,),
          strict_backward=form != "gap")


def test_boolean_mask():
    """x[mask] has a data-dependent shape (Dynamo breaks the graph at nonzero): right answers either way."""
    x = source(7, 129)
    mask = torch.rand(7, 129) > 0.5

    def fn(x, m):
        return x[m] * 2.0

    cc.check_function(fn, x, mask, what="x[mask]", strict_mode=False, compiled_fn=cc.compiled(fn, dynamic=False))


def test_masked_fill_and_where_with_a_mask():
    x = source(7, 129, noncontig=True)
    mask = torch.rand(7, 129) > 0.5
    cc.check_function(lambda x, m: x.masked_fill(m, 0.0) + torch.where(m, x, -x), x, mask, what="mask pointwise")


@pytest.mark.parametrize("negative", [False, True])
def test_take(negative):
    x = source(7, 9, noncontig=True)
    idx = indices(12, x.numel(), negative=negative, shape=(3, 4))
    check(lambda x, i: torch.take(x, i), x, idx, what=f"take negative={negative}", lowered=(INDEX,))


# ---------------------------------------------------------------------------------------------- gather
@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("idx_dtype", INDEX_DTYPES)
def test_gather(dim, idx_dtype):
    x = source(7, 129, noncontig=True)
    shape = [5, 33]  # smaller than the source along both dims: the index's own strides, not the source's
    shape[dim] = 9
    idx = torch.randint(0, x.shape[dim], tuple(shape)).to(idx_dtype)
    idx.view(-1)[0] = x.shape[dim] - 1
    check(fused(lambda x, i: x.gather(dim, i)), x, idx, what=f"gather dim={dim}", lowered=(GATHER,))


def test_gather_3d_middle_dim_repeated():
    x = source(3, 7, 5)
    idx = torch.randint(0, 7, (3, 11, 5))
    idx[:, 0] = 6
    idx[:, 1] = 6  # repeated: the backward sums both uses
    check(lambda x, i: x.gather(1, i), x, idx, what="gather 3-d dim=1", lowered=(GATHER,))


# ---------------------------------------------------------------------------------------------- scatter
@pytest.mark.parametrize("src_kind", ["value", "tensor"])
def test_scatter_one_hot(src_kind):
    """One index per row along dim (the form the lowering has a kernel for): a one-hot write."""
    x = source(7, 129)
    idx = torch.randint(0, 129, (7, 1))
    idx[0, 0] = 128
    if src_kind == "value":
        check(lambda x, i: x.scatter(1, i, 3.5), x, idx, what="scatter value one-hot", lowered=(SCATTER,))
    else:
        src = source(7, 1)
        check(lambda x, i, s: x.scatter(1, i, s), x, idx, src, what="scatter src one-hot", lowered=(SCATTER,))


def test_scatter_general():
    """Several (unique) indices per row: an extern, right answers and gradients."""
    x = source(7, 33)
    idx = torch.stack([torch.randperm(33)[:5] for _ in range(7)])
    src = source(7, 5)
    cc.check_function(lambda x, i, s: x.scatter(1, i, s) * 2.0, x, idx, src, what="scatter general",
                      strict_mode=False)


@pytest.mark.parametrize("dim", [0, 1])
def test_scatter_add_repeated(dim):
    x = source(7, 33)
    shape = (11, 33) if dim == 0 else (7, 40)
    idx = torch.randint(0, x.shape[dim], shape)
    src = source(*shape)
    cc.check_function(lambda x, i, s: x.scatter_add(dim, i, s) * 2.0, x, idx, src, what=f"scatter_add dim={dim}",
                      strict_mode=False)


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce(reduce, include_self):
    x = source(7, 33)
    idx = torch.randint(0, 33, (7, 40))
    src = torch.rand(7, 40).add_(0.5).requires_grad_()  # positive, away from 0: prod's gradient is tame
    fn = lambda x, i, s: x.scatter_reduce(1, i, s, reduce=reduce, include_self=include_self) + 1.0  # noqa: E731
    # amax/amin's backward splits ties evenly: random floats have none
    cc.check_function(fn, x, idx, src, what=f"scatter_reduce {reduce} include_self={include_self}",
                      strict_mode=False)


# -------------------------------------------------------------------------------- index_put, index_add
@pytest.mark.parametrize("accumulate", [True, False])
def test_index_put(accumulate):
    x = source(129, 7)
    if accumulate:
        idx = indices(11, 129, negative=True)  # repeated: the values add up
    else:
        idx = torch.randperm(129)[:11] - 64  # unique (which of two writes wins is unspecified), some negative
    v = source(11, 7)
    cc.check_function(lambda x, i, v: torch.index_put(x, (i,), v, accumulate=accumulate) * 2.0, x, idx, v,
                      what=f"index_put accumulate={accumulate}", strict_mode=accumulate)  # (accumulate: a kernel)


@pytest.mark.parametrize("dim", [0, 1])
def test_index_add(dim):
    x = source(7, 33)
    n = 11
    idx = indices(n, x.shape[dim])
    v = source(n, 33) if dim == 0 else source(7, n)
    cc.check_function(lambda x, i, v: x.index_add(dim, i, v, alpha=2.0) + 1.0, x, idx, v,
                      what=f"index_add dim={dim}", strict_mode=False)


def test_index_copy_and_index_fill():
    x = source(7, 33)
    idx = torch.tensor([6, 0, 3])
    v = source(3, 33)
    cc.check_function(lambda x, i, v: x.index_copy(0, i, v) + x.index_fill(0, i, -1.0), x, idx, v,
                      what="index_copy + index_fill", strict_mode=False)


# ----------------------------------------------------------------------------------- mixed and chained
def test_embedding_then_gather_then_index_select():
    """Indirect loads composed through each other: an index read through an indirect index."""
    w = source(129, 33)
    tok = torch.tensor([[5, 128, 5], [0, 7, 64]])
    pick = torch.randint(0, 33, (2, 3, 4))
    cols = torch.tensor([3, 0, 3])

    def fn(w, t, p, c):
        e = F.embedding(t, w)  # (2, 3, 33)
        g = e.gather(2, p)  # (2, 3, 4)
        return g.index_select(2, c[:2]).sum(-1) + e.mean(-1)

    check(fn, w, tok, pick, cols, what="embedding -> gather -> index_select",
          lowered=(EMB, GATHER, ISEL))


def test_index_by_an_index_computed_in_the_graph():
    """The index tensor is itself a kernel's output (argmax): the indirect load reads a fresh buffer."""
    x = source(7, 129)

    def fn(x):
        i = x.detach().argmax(-1)
        return x.index_select(1, i) * 3.0 + x[:, i].sum(0)

    check(fn, x, what="index from argmax", lowered=(ISEL, INDEX))


# --------------------------------------------------------------------------------------- out of range
OOB_CASES = {
    "index_select": (lambda x, i: x.index_select(0, i) * 2.0, torch.tensor([0, 7])),
    "index_select negative": (lambda x, i: x.index_select(0, i) * 2.0, torch.tensor([0, -1])),
    "gather": (lambda x, i: x.gather(0, i) * 2.0, torch.tensor([[0, 7, 0]])),
    "embedding": (lambda x, i: F.embedding(i, x) * 2.0, torch.tensor([7])),
    "x[idx]": (lambda x, i: x[i] * 2.0, torch.tensor([0, 7])),
    "x[idx] negative": (lambda x, i: x[i] * 2.0, torch.tensor([0, -8])),
}


@pytest.mark.parametrize("case", sorted(OOB_CASES))
def test_out_of_range_index_is_an_error(case):
    fn, idx = OOB_CASES[case]
    x = torch.randn(7, 3)
    with pytest.raises(Exception):
        fn(x, idx)  # eager refuses it
    with cc.strict(), pytest.raises(Exception):
        cc.compiled(fn, fullgraph=True, dynamic=False)(x, idx)


def test_nearest_upsampling_forward_and_backward_on_tilefuses_kernels():
    """A 2x nearest upsampling of an image (its backward: index_put with accumulate at the last two dimensions,
    each source pixel summing four gradients), strict: nothing falls back."""
    x = source(2, 3, 5, 7, noncontig=True)
    cc.check_function(lambda x: F.interpolate(x, scale_factor=2, mode="nearest") * 2.0, x, what="nearest 2x upsampling")
