"""Lowering rules for views and indexing: every view is index arithmetic over its source.

A view rule builds an :class:`ir.View` whose ``index`` maps the view's variables to the source's per-dimension
indices; loads through it compose (``Lowerer.load``), so a chain of views costs nothing. cat, pad,
slice_scatter, select_scatter, gather, index_select, embedding and a one-hot scatter are pointwise nodes with
masked or data-dependent loads.
"""
from __future__ import annotations

import torch

from .. import ir
from ..ir import primitives as P
from .core import (TV, LoweringError, aten, and_, index_cond, index_value, ints, is_dense, norm_dim, op_name,
                       plain, register)

prims = torch.ops.prims


def make_view(low, src: TV, index_fn, name: str | None = None, meta=None) -> TV:
    meta = meta or low.out_meta()
    vars_ = ir.loop_vars(meta.shape)
    index = tuple(index_fn(vars_))
    return low.add(ir.View(name or low.current.name, meta.shape, meta.stride, meta.storage_offset, meta.dtype,
                           src.name, index, low.origin()))


def identity_view(low, a: TV) -> TV:
    return make_view(low, a, lambda v: v)


@register(aten.view.default, aten._unsafe_view.default, aten.reshape.default, prims.reshape.default,
          aten.view_copy.default)
def _view(low, a, size):
    meta = low.out_meta()
    src_shape = low.shape_of(a)
    if meta.dtype != low.tensor_meta[a.name].dtype:
        raise LoweringError("a view that reinterprets the dtype")

    def index_fn(v):
        lin = ir.linearize(v, meta.shape)
        return ir.unravel(lin, src_shape)
    return make_view(low, a, index_fn)


@register(aten.permute.default, prims.transpose.default)
def _permute(low, a, dims):
    dims = [norm_dim(d, len(low.shape_of(a))) for d in ints(dims)]

    def index_fn(v):
        src = [None] * len(dims)
        for p, d in enumerate(dims):
            src[d] = v[p]
        return src
    return make_view(low, a, index_fn)


@register(aten.t.default)
def _t(low, a):
    return _permute(low, a, [1, 0] if len(low.shape_of(a)) == 2 else [0])


@register(aten.transpose.int)
def _transpose(low, a, d0, d1):
    r = len(low.shape_of(a))
    dims = list(range(r))
    d0, d1 = norm_dim(d0, r), norm_dim(d1, r)
    dims[d0], dims[d1] = dims[d1], dims[d0]
    return _permute(low, a, dims)


@register(aten.expand.default, aten.expand_copy.default)
def _expand(low, a, size, implicit=False):
    src = low.shape_of(a)
    meta = low.out_meta()

    def index_fn(v):
        n, r = len(meta.shape), len(src)
        return [ir.const_index(0) if src[d] == 1 and meta.shape[n - r + d] != 1 else v[n - r + d] for d in range(r)]
    return make_view(low, a, index_fn)


@register(prims.broadcast_in_dim.default)
def _broadcast_in_dim(low, a, shape, broadcast_dims):
    src = low.shape_of(a)
    dims = ints(broadcast_dims)
    meta = low.out_meta()

    def index_fn(v):
        return [ir.const_index(0) if src[k] == 1 and meta.shape[d] != 1 else v[d] for k, d in enumerate(dims)]
    # prims.broadcast_in_dim is not a view in eager: a pointwise copy of an expanded view
    view_meta = ir.TensorMeta(meta.shape, _expanded_stride(src, dims, meta.shape), meta.dtype)
    return low.pointwise(lambda x: x, make_view(low, a, index_fn, name=low.new_name("bcast"), meta=view_meta))


def _expanded_stride(src, dims, shape):
    out = [0] * len(shape)
    acc = 1
    for k in reversed(range(len(src))):
        if src[k] != 1:
            out[dims[k]] = acc
        acc *= src[k]
    return tuple(out)


def _slice_params(size, start, end, step):
    start = 0 if start is None else plain(start)
    end = size if end is None else plain(end)
    if start < 0:
        start += size
    if end < 0:
        end += size
    start = min(max(start, 0), size)
    end = min(max(end, start), size)
    return start, end, plain(step)


@register(aten.slice.Tensor, aten.slice_copy.Tensor)
def _slice(low, a, dim=0, start=None, end=None, step=1):
    src = low.shape_of(a)
    dim = norm_dim(plain(dim), len(src))
    start, _end, step = _slice_params(src[dim], start, end, step)

    def index_fn(v):
        out = list(v)
        out[dim] = ir.add_const(ir.scale(v[dim], step), start)
        return out
    return make_view(low, a, index_fn)


@register(aten.narrow.default)
def _narrow(low, a, dim, start, length):
    src = low.shape_of(a)
    d = norm_dim(plain(dim), len(src))
    s = plain(start)
    s = s + src[d] if s < 0 else s
    return _slice(low, a, d, s, s + plain(length), 1)


@register(aten.select.int, aten.select_copy.int)
def _select(low, a, dim, index):
    src = low.shape_of(a)
    dim = norm_dim(plain(dim), len(src))
    index = plain(index)
    if index < 0:
        index += src[dim]

    def index_fn(v):
        out = list(v)
        out.insert(dim, ir.const_index(index))
        return out
    return make_view(low, a, index_fn)


@register(aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default, prims.squeeze.default,
          aten.squeeze_copy.dim, aten.squeeze_copy.dims, aten.squeeze_copy.default)
def _squeeze(low, a, dims=None):
    src = low.shape_of(a)
    meta = low.out_meta()
    if dims is None:
        drop = {d for d, s in enumerate(src) if s == 1}
    else:
        drop = {norm_dim(d, len(src)) for d in ints(dims)}
        drop = {d for d in drop if d < len(src) and src[d] == 1}  # a 0-d tensor takes dim 0 or -1: nothing to drop

    def index_fn(v):
        out, k = [], 0
        for d in range(len(src)):
            if d in drop:
                out.append(ir.const_index(0))
            else:
                out.append(v[k])
                k += 1
        return out
    if len(src) - len(drop) != len(meta.shape):
        raise LoweringError("squeeze: shapes do not line up")
    return make_view(low, a, index_fn)


@register(aten.unsqueeze.default, aten.unsqueeze_copy.default)
def _unsqueeze(low, a, dim):
    r = len(low.shape_of(a)) + 1
    dim = norm_dim(plain(dim), r)

    def index_fn(v):
        out = list(v)
        del out[dim]
        return out
    return make_view(low, a, index_fn)


@register(aten.as_strided.default, aten.as_strided_copy.default)
def _as_strided(low, a, size, stride, storage_offset=None):
    """A strided window on the source's storage: the source's own layout must be dense to index it."""
    src = low.tensor_meta[a.name]
    node = low.table[a.name]
    while isinstance(node, ir.View):
        raise LoweringError("as_strided of a view")
    if not is_dense(src.shape, src.stride):
        raise LoweringError("as_strided of a non-dense tensor")
    meta = low.out_meta()
    fake = low.fake.get(a.name)
    base_offset = int(fake.storage_offset()) if fake is not None else 0
    offset = (plain(storage_offset) if storage_offset is not None else base_offset) - base_offset
    stride_ = ints(stride)
    order = sorted(range(len(src.shape)), key=lambda d: -src.stride[d])

    def index_fn(v):
        phys = ir.strided_offset(v, stride_, offset)
        out = [None] * len(src.shape)
        for d in order:
            out[d] = ir.divmod_index(phys, src.stride[d], src.shape[d]) if src.shape[d] != 1 else ir.const_index(0)
        return out
    return make_view(low, a, index_fn)


@register(aten.split_with_sizes.default, aten.split_with_sizes_copy.default)
def _split_with_sizes(low, a, sizes, dim=0):
    src = low.shape_of(a)
    dim = norm_dim(plain(dim), len(src))
    outs = []
    start = 0
    for k, n in enumerate(ints(sizes)):
        meta = low.out_meta(k=k)

        def index_fn(v, start=start):
            out = list(v)
            out[dim] = ir.add_const(v[dim], start)
            return out
        outs.append(make_view(low, a, index_fn, name=f"{low.current.name}_{k}", meta=meta))
        start += n
    return tuple(outs)


@register(aten.unbind.int)
def _unbind(low, a, dim=0):
    src = low.shape_of(a)
    dim = norm_dim(plain(dim), len(src))
    outs = []
    for k in range(src[dim]):
        def index_fn(v, k=k):
            out = list(v)
            out.insert(dim, ir.const_index(k))
            return out
        outs.append(make_view(low, a, index_fn, name=f"{low.current.name}_{k}", meta=low.out_meta(k=k)))
    return tuple(outs)


@register(aten.flip.default)
def _flip(low, a, dims):
    src = low.shape_of(a)
    flips = {norm_dim(d, len(src)) for d in ints(dims)}
    view_meta = ir.TensorMeta(src, low.tensor_meta[a.name].stride, low.tensor_meta[a.name].dtype)

    def index_fn(v):
        return [ir.add_const(ir.scale(v[d], -1), src[d] - 1) if d in flips else v[d] for d in range(len(src))]
    view = make_view(low, a, index_fn, name=low.new_name("flipped"), meta=view_meta)
    return low.pointwise(lambda x: x, view)


# --------------------------------------------------------------------------------------- cat and pad
@register(aten.cat.default)
def _cat(low, tensors, dim=0):
    meta = low.out_meta()
    parts = [t for t in tensors if not (len(low.shape_of(t)) == 1 and low.shape_of(t)[0] == 0)]
    if not parts:
        return low.pointwise(lambda: P.const(0, meta.dtype))
    dim = norm_dim(plain(dim), len(meta.shape))
    vars_ = ir.loop_vars(meta.shape)
    v = vars_[dim]
    pieces = []
    start = 0
    for t in parts:
        n = low.shape_of(t)[dim]
        if n:
            pieces.append((t, start, start + n))
        start += n
    body = None
    for t, lo, hi in reversed(pieces):
        idx = list(vars_)
        idx[dim] = ir.add_const(v, -lo)
        mask = and_(index_cond(v, "ge", lo), index_cond(v, "lt", hi))
        value = P.cast(low.load(t, idx, mask), meta.dtype)
        body = value if body is None else P.where(mask, value, body)
    if body is None:  # every part is empty along ``dim``: so is the output (stack of (0, 1, 0) tensors)
        body = P.const(0, meta.dtype)
    return low.pointwise_from(meta, body)


@register(aten.constant_pad_nd.default)
def _pad(low, a, pad, value=0):
    src = low.shape_of(a)
    meta = low.out_meta()
    pad = ints(pad)
    vars_ = ir.loop_vars(meta.shape)
    idx = list(vars_)
    mask = None
    for k in range(len(pad) // 2):
        d = len(src) - 1 - k
        before = pad[2 * k]
        idx[d] = ir.add_const(vars_[d], -before)
        mask = and_(mask, and_(index_cond(idx[d], "ge", 0), index_cond(idx[d], "lt", src[d])))
    fill = low.scalar(value, meta.dtype)
    loaded = P.cast(low.load(a, idx, mask), meta.dtype)
    body = loaded if mask is None else P.where(mask, loaded, fill)
    return low.pointwise_from(meta, body)


@register(aten.slice_scatter.default)
def _slice_scatter(low, base, src, dim=0, start=None, end=None, step=1):
    meta = low.out_meta()
    dim = norm_dim(plain(dim), len(meta.shape))
    start, end, step = _slice_params(meta.shape[dim], start, end, step)
    vars_ = ir.loop_vars(meta.shape)
    v = vars_[dim]
    rel = ir.add_const(v, -start)
    mask = and_(index_cond(v, "ge", start), index_cond(v, "lt", end))
    idx = list(vars_)
    if step != 1:
        mask = and_(mask, P.build("eq", index_value(ir.mod_index(rel, step) if rel.bounds()[0] >= 0 else
                                                    ir.Index.make(((ir.DivMod.make(rel, 1, step), 1),), 0)),
                                  P.const(0, torch.int64)))
        idx[dim] = ir.divmod_index(rel, step, None) if rel.bounds()[0] >= 0 else \
            ir.Index.make(((ir.DivMod.make(rel, step, None), 1),), 0)
    else:
        idx[dim] = rel
    loaded = P.cast(low.load(src, idx, mask), meta.dtype)
    body = P.where(mask, loaded, P.cast(low.load(base, vars_), meta.dtype)) if mask is not None else loaded
    return low.pointwise_from(meta, body)


@register(aten.select_scatter.default)
def _select_scatter(low, base, src, dim, index):
    meta = low.out_meta()
    dim = norm_dim(plain(dim), len(meta.shape))
    index = plain(index)
    if index < 0:
        index += meta.shape[dim]
    vars_ = ir.loop_vars(meta.shape)
    mask = index_cond(vars_[dim], "eq", index)
    idx = list(vars_)
    del idx[dim]
    body = P.where(mask, P.cast(low.load(src, idx, mask), meta.dtype), P.cast(low.load(base, vars_), meta.dtype))
    return low.pointwise_from(meta, body)


# ---------------------------------------------------------------------------------- data-dependent
def _indirect(low, index_tv: TV, at, size: int, wrap: bool) -> ir.Index:
    """The index tensor's value at ``at`` as an Index atom into a dim of ``size``, checked in the kernel against
    the range the current ATen op accepts (``wrap``: negative values count from the end, as in ``x[idx]``;
    otherwise a negative index is an error, as in embedding, gather and index_select)."""
    value = P.cast(low.load(index_tv, at), torch.int64)
    return ir.Index.make(((ir.Indirect.make(value, size, wrap, op_name(low.current.target)), 1),), 0)


@register(aten.index_select.default)
def _index_select(low, a, dim, index):
    src = low.shape_of(a)
    dim = norm_dim(plain(dim), len(src))
    meta = low.out_meta()
    vars_ = ir.loop_vars(meta.shape)
    at = (vars_[dim],) if len(low.shape_of(index)) == 1 else ()
    idx = list(vars_)
    idx[dim] = _indirect(low, index, at, src[dim], wrap=False)
    return low.pointwise_from(meta, P.cast(low.load(a, idx), meta.dtype))


@register(aten.gather.default)
def _gather(low, a, dim, index, sparse_grad=False):
    src = low.shape_of(a)
    dim = norm_dim(plain(dim), len(src))
    meta = low.out_meta()
    vars_ = ir.loop_vars(meta.shape)
    idx = list(vars_)
    idx[dim] = _indirect(low, index, vars_, src[dim] if src else 1, wrap=False)
    if not src:
        idx = []
    return low.pointwise_from(meta, P.cast(low.load(a, idx), meta.dtype))


@register(aten.embedding.default)
def _embedding(low, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    meta = low.out_meta()
    vars_ = ir.loop_vars(meta.shape)
    nidx = len(low.shape_of(indices))
    rows = low.shape_of(weight)[0]
    row = _indirect(low, indices, vars_[:nidx], rows, wrap=False)
    return low.pointwise_from(meta, P.cast(low.load(weight, [row] + list(vars_[nidx:])), meta.dtype))


def _index_several(low, a, indices, present):
    """``x[i0, i1, ...]`` with several index tensors: they broadcast together to a shape ``I``, which takes the
    place of the indexed dimensions where those are adjacent, and comes first otherwise (torch's rule); each
    indexed dimension's position is its index tensor's value at the output's ``I`` positions (a size-1 dim of an
    index tensor read at 0)."""
    src = low.shape_of(a)
    shapes = [tuple(low.shape_of(indices[k])) for k in present]
    for k in present:
        if low.tensor_meta[indices[k].name].dtype in (torch.bool, torch.uint8):
            raise LoweringError("boolean-mask indexing (data-dependent shape)")
    rank = max(len(sh) for sh in shapes)
    meta = low.out_meta()
    vars_ = ir.loop_vars(meta.shape)
    adjacent = present == list(range(present[0], present[-1] + 1))
    first = present[0] if adjacent else 0
    ivars = vars_[first:first + rank]  # the output's positions of the broadcast index shape
    others = iter(list(vars_[:first]) + list(vars_[first + rank:]))  # the other dims, in order
    zero = ir.Index.make((), 0)
    idx = []
    for d in range(len(src)):
        if d not in present:
            idx.append(next(others))
            continue
        shape = low.shape_of(indices[d])
        at = [zero if size == 1 else ivars[rank - len(shape) + j] for j, size in enumerate(shape)]
        idx.append(_indirect(low, indices[d], at, src[d], wrap=True))
    return low.pointwise_from(meta, P.cast(low.load(a, idx), meta.dtype))


@register(aten.index.Tensor)
def _index(low, a, indices):
    src = low.shape_of(a)
    present = [k for k, t in enumerate(indices) if t is not None]
    if len(present) > 1:
        return _index_several(low, a, indices, present)
    if not present:
        raise LoweringError("indexing with no index tensor")
    d = present[0]
    it = indices[d]
    if low.tensor_meta[it.name].dtype in (torch.bool, torch.uint8):
        raise LoweringError("boolean-mask indexing (data-dependent shape)")
    meta = low.out_meta()
    ishape = low.shape_of(it)
    vars_ = ir.loop_vars(meta.shape)
    at = vars_[d:d + len(ishape)]
    idx = list(vars_[:d]) + [_indirect(low, it, at, src[d], wrap=True)] + list(vars_[d + len(ishape):])
    return low.pointwise_from(meta, P.cast(low.load(a, idx), meta.dtype))


@register(aten.scatter.value, aten.scatter.src)
def _scatter(low, a, dim, index, value):
    """Only the one-hot form (one index per row along ``dim``): ``where(position == index, value, a)``."""
    meta = low.out_meta()
    dim = norm_dim(plain(dim), len(meta.shape))
    ishape = low.shape_of(index)
    if not meta.shape and not ishape and not (isinstance(value, TV) and low.shape_of(value)):
        # 0-d (max(x0d, 0)'s backward): the one index is 0, the result is value
        return low.pointwise_from(meta, P.cast(low.load(value, []) if isinstance(value, TV) else
                                               low.scalar(value, meta.dtype), meta.dtype))
    if len(ishape) != len(meta.shape) or ishape[dim] != 1 or \
            any(ishape[k] != meta.shape[k] for k in range(len(ishape)) if k != dim):
        raise LoweringError("scatter other than one index per row")
    vars_ = ir.loop_vars(meta.shape)
    at = list(vars_)
    at[dim] = ir.const_index(0)
    # the index's value through a checked Indirect atom: an index outside the dim is an error, as in eager
    # (a comparison with the positions would silently scatter nothing)
    target = index_value(_indirect(low, index, at, meta.shape[dim], wrap=False))
    pos = index_value(vars_[dim])
    hit = P.build("eq", pos, target)
    if isinstance(value, TV):
        vshape = low.shape_of(value)
        if any(vshape[k] < ishape[k] for k in range(len(vshape))):
            raise LoweringError("scatter source smaller than the index")
        v = P.cast(low.load(value, at), meta.dtype)
    else:
        v = low.scalar(value, meta.dtype)
    body = P.where(hit, v, P.cast(low.load(a, vars_), meta.dtype))
    return low.pointwise_from(meta, body)
