"""Lowering rules for reductions: sum, prod, amax/amin, argmax/argmin, any/all, mean, var/std (two passes),
max/min with indices.

A Reduction node iterates over its input's shape (``space``) and reduces the ``reduced`` dimensions; the
body reads its operand at the space position, so a pointwise producer is inlined into it by the scheduler
(the prologue). ``mean`` and ``var`` are a reduction plus a pointwise node; ``var`` is the two-pass form
(sum of squared deviations from the mean): exact, and free when the row is in registers.
"""
from __future__ import annotations

import math

import torch

from .. import ir
from ..ir import primitives as P
from ..tuning import OUTER_SPLIT_XBLOCK, TUNING
from .core import TV, LoweringError, aten, ints, norm_dim, plain, register

prims = torch.ops.prims


def _dims(low, a, dims) -> tuple[int, ...]:
    rank = len(low.shape_of(a))
    if dims is None:
        return tuple(range(rank))
    dims = ints(dims)
    if not dims:
        return tuple(range(rank))
    return tuple(sorted({norm_dim(d, rank) for d in dims})) if rank else ()


def out_dims_for(space, reduced, out_shape) -> tuple:
    """For each output dimension, the space dimension it runs over (None for a kept size-1 dimension)."""
    if len(out_shape) == len(space) and len(reduced) > 0:
        return tuple(None if d in reduced else d for d in range(len(space)))
    kept = [d for d in range(len(space)) if d not in reduced]
    if len(kept) != len(out_shape):
        raise LoweringError(f"reduction output shape {list(out_shape)} does not match the input {list(space)}")
    return tuple(kept)


def row_index(vars_, out_dims) -> tuple[ir.Index, ...]:
    """The index of a reduction's output at space position ``vars_``."""
    return tuple(ir.const_index(0) if d is None else vars_[d] for d in out_dims)


# Split reductions. A reduction with few outputs and long rows leaves most of the GPU idle: the column sums of a
# layer norm's backward (4096 outputs over 32768 rows) are 16 programs of 256 columns, each looping over every
# row. Such a reduction is written as two: stage 1 reduces ``S`` chunks of the rows into an fp32 [S, outputs]
# buffer (S x more programs), stage 2 reduces the S partials (and takes the epilogue). "Programs" counts what
# the code generator launches: one a row for an innermost reduction, one per OUTER_SPLIT_XBLOCK
# outputs for an outer one (256: the 16-warp column program these thresholds were set with; the 4-warp
# 64-column program (decision 021) is a quarter of one).
SPLIT_MIN_R = 8192  # rows shorter than this are not split
SPLIT_MAX_PROGRAMS = 256  # a reduction with at least this many programs (about 2 per SM) is not split
SPLIT_TARGET_PROGRAMS = 1024  # stage 1 aims at this many programs
SPLIT_MIN_CHUNK = 256  # each stage-1 program reduces at least this many elements
SPLIT_KINDS = ("sum", "prod", "max", "min", "any", "all")
# An outer (column) split cuts the rows into at least this many chunks (of at least that many rows): the
# first stage can then run inside the row kernel that reads the same rows (scheduler's columns_into_rows),
# one program per chunk, and 256 chunks are about two programs per SM of a 132-SM H200. 64 chunks (decision 021)
# were enough for the 16 x 64 column programs of a separate kernel, not for a program per chunk.


def split_factor(space, reduced, kind: str) -> int:
    """How many chunks stage 1 cuts the reduced elements into (1: no split). A pure function of the shape, so
    the kernels' text (and the cache) does not depend on the GPU."""
    if kind not in SPLIT_KINDS or not reduced:
        return 1
    rsize = math.prod(space[d] for d in reduced)
    xnumel = math.prod(space[d] for d in range(len(space)) if d not in reduced)
    inner = (len(space) - 1) in reduced
    outer_min_r = TUNING["split_outer_min_r"]
    if rsize < (SPLIT_MIN_R if inner or outer_min_r is None else min(outer_min_r, SPLIT_MIN_R)):
        return 1
    if not inner and rsize < SPLIT_MIN_R and xnumel > TUNING["split_outer_short_max_cols"]:
        return 1
    programs = xnumel if inner else -(-xnumel // OUTER_SPLIT_XBLOCK)
    if programs >= SPLIT_MAX_PROGRAMS:
        return 1
    limit = min(SPLIT_TARGET_PROGRAMS // max(programs, 1), rsize // SPLIT_MIN_CHUNK)
    if not inner:
        limit = min(max(limit, TUNING["split_outer_chunks"]), rsize // TUNING["split_outer_min_rows"])
    factor = 1
    while factor * 2 <= limit:
        factor *= 2
    if factor < 2:
        return 1
    if not inner:
        # whole chunks of rsize // factor rows and a short last one (1037 rows: 130 chunks of 8, not 128 of 9 with
        # the last 12 empty), so that the row kernel over the same rows computes every chunk's partial, with at
        # least as many programs (scheduler._column_join)
        factor = -(-rsize // (rsize // factor))
    return factor


_IDENTITY = {"sum": 0, "prod": 1, "max": float("-inf"), "min": float("inf"), "any": False, "all": True}


def _split_reduce(low, a: TV, reduced, kind: str, meta, body_fn, name, acc_dtype, factor: int) -> TV:
    """``reduce`` as two stages (see SPLIT_MIN_R). Stage 1 runs over ``(S, C, kept...)`` and reduces C; the
    reduced elements are taken in row-major order of the reduced dims, element ``s * C + c``."""
    space = low.shape_of(a)
    kept = [d for d in range(len(space)) if d not in reduced]
    rshape = [space[d] for d in reduced]
    rsize = math.prod(rshape)
    chunk = -(-rsize // factor)
    space1 = (factor, chunk) + tuple(space[d] for d in kept)
    v1 = ir.loop_vars(space1)
    linear = ir.add(ir.scale(v1[0], chunk), v1[1])
    parts = ir.unravel(linear, rshape)
    pos = [None] * len(space)
    for k, d in enumerate(reduced):
        pos[d] = parts[k]
    for k, d in enumerate(kept):
        pos[d] = v1[2 + k]
    inside = None
    if factor * chunk != rsize:  # the last chunk runs past the end: those elements are the identity
        inside = P.build("lt", ir.IndexValue.make(linear, torch.int64), P.const(rsize, torch.int64, from_size=True))
    value = low.load(a, pos, mask=inside)
    if body_fn is not None:
        value = body_fn(value, tuple(pos))
    if kind in ("any", "all"):
        part_dtype = torch.bool
        value = value if value.dtype == torch.bool else P.build("ne", value, P.const(0, value.dtype))
    else:
        part_dtype = acc_dtype or P.compute_dtype(meta.dtype)
        value = P.cast(value, part_dtype)
    if inside is not None:
        value = P.where(inside, value, P.const(_IDENTITY[kind], part_dtype))
    shape1 = (factor,) + tuple(space[d] for d in kept)
    meta1 = ir.TensorMeta(shape1, _contig(shape1), part_dtype)
    out1 = (0,) + tuple(range(2, len(space1)))
    partial = low.add(ir.Reduction(low.new_name(f"{kind}_split"), shape1, meta1.stride, part_dtype, kind, space1,
                                   (1,), out1, value, low.origin()))
    # stage 2 over (S, kept...): the output dims map back through the kept dims
    v2 = ir.loop_vars(shape1)
    # the partials are reduced in their own (accumulation) precision; only the result is rounded to the
    # output's dtype (its store), as one reduction would be: a bfloat16 column sum over 256 partials rounded
    # each to bfloat16 first was 13 ulps off
    second = low.load(partial, v2)
    if len(meta.shape) == len(space):  # keepdim
        out2 = tuple(None if d in reduced else 1 + kept.index(d) for d in range(len(space)))
    else:
        out2 = tuple(1 + k for k in range(len(kept)))
    return low.add(ir.Reduction(name, meta.shape, low.buffer_stride(meta),
                                meta.dtype if kind not in ("any", "all") else torch.bool, kind, shape1, (0,), out2,
                                second, low.origin()))


def reduce(low, a: TV, dims, kind: str, meta=None, body_fn=None, name=None, acc_dtype=None) -> TV:
    """A Reduction of ``a`` (or of ``body_fn(load of a)``) over ``dims`` with the output ``meta``."""
    meta = meta or low.out_meta()
    space = low.shape_of(a)
    reduced = tuple(d for d in dims if d < len(space))
    factor = split_factor(space, reduced, kind)
    if factor > 1:
        return _split_reduce(low, a, reduced, kind, meta, body_fn, name or low.current.name, acc_dtype, factor)
    vars_ = ir.loop_vars(space)
    value = low.load(a, vars_)
    if body_fn is not None:
        value = body_fn(value, vars_)
    dtype = meta.dtype
    if kind in ("sum", "prod", "max", "min"):
        value = P.cast(value, acc_dtype or dtype)
    elif kind in ("any", "all"):
        value = value if value.dtype == torch.bool else P.build("ne", value, P.const(0, value.dtype))
    name = name or low.current.name
    rsize = math.prod(space[d] for d in reduced)
    if not reduced or rsize == 1:
        # nothing to reduce: a pointwise node (the position of the only element is 0)
        if kind in ("argmax", "argmin"):
            return low.add(ir.Pointwise(name, meta.shape, low.buffer_stride(meta), dtype, P.const(0, dtype),
                                        low.origin()))
        out_dims = out_dims_for(space, reduced, meta.shape) if reduced else tuple(range(len(space)))
        ov = ir.loop_vars(meta.shape)
        mapping = {f"i{d}": ov[k] for k, d in enumerate(out_dims) if d is not None}
        for d in reduced:
            mapping[f"i{d}"] = ir.const_index(0)
        body = ir.substitute_expr(value, mapping)
        return low.add(ir.Pointwise(name, meta.shape, low.buffer_stride(meta), dtype, P.cast(body, dtype),
                                    low.origin()))
    out_dims = out_dims_for(space, reduced, meta.shape)
    return low.add(ir.Reduction(name, meta.shape, low.buffer_stride(meta), dtype if kind not in ("any", "all")
                                else torch.bool, kind, space, reduced, out_dims, value, low.origin()))


def _cast_result(low, tv, meta):
    if low.tensor_meta[tv.name].dtype == meta.dtype:
        return tv
    return low.pointwise(lambda x: P.cast(x, meta.dtype), tv, meta=meta, name=low.new_name("cast"))


@register(aten.sum.dim_IntList, aten.sum.default, prims.sum.default)
def _sum(low, a, dims=None, keepdim=False, dtype=None, **kwargs):
    return reduce(low, a, _dims(low, a, dims), "sum")


@register(aten.prod.dim_int, aten.prod.default)
def _prod(low, a, dim=None, keepdim=False, dtype=None):
    return reduce(low, a, _dims(low, a, dim), "prod")


@register(aten.amax.default, prims.amax.default)
def _amax(low, a, dims=(), keepdim=False):
    return reduce(low, a, _dims(low, a, dims), "max")


@register(aten.amin.default, prims.amin.default)
def _amin(low, a, dims=(), keepdim=False):
    return reduce(low, a, _dims(low, a, dims), "min")


@register(aten.max.default)
def _max_all(low, a):
    return reduce(low, a, _dims(low, a, None), "max")


@register(aten.min.default)
def _min_all(low, a):
    return reduce(low, a, _dims(low, a, None), "min")


@register(aten.argmax.default)
def _argmax(low, a, dim=None, keepdim=False):
    return reduce(low, a, _dims(low, a, dim), "argmax")


@register(aten.argmin.default)
def _argmin(low, a, dim=None, keepdim=False):
    return reduce(low, a, _dims(low, a, dim), "argmin")


@register(aten.max.dim)
def _max_dim(low, a, dim, keepdim=False):
    dims = _dims(low, a, dim)
    values = reduce(low, a, dims, "max", meta=low.out_meta(k=0), name=f"{low.current.name}_values")
    indices = reduce(low, a, dims, "argmax", meta=low.out_meta(k=1), name=f"{low.current.name}_indices")
    return values, indices


@register(aten.min.dim)
def _min_dim(low, a, dim, keepdim=False):
    dims = _dims(low, a, dim)
    values = reduce(low, a, dims, "min", meta=low.out_meta(k=0), name=f"{low.current.name}_values")
    indices = reduce(low, a, dims, "argmin", meta=low.out_meta(k=1), name=f"{low.current.name}_indices")
    return values, indices


@register(aten.any.dim, aten.any.dims, aten.any.default)
def _any(low, a, dim=None, keepdim=False):
    return reduce(low, a, _dims(low, a, dim), "any")


@register(aten.all.dim, aten.all.dims, aten.all.default)
def _all(low, a, dim=None, keepdim=False):
    return reduce(low, a, _dims(low, a, dim), "all")


@register(aten.mean.dim, aten.mean.default)
def _mean(low, a, dims=None, keepdim=False, dtype=None):
    meta = low.out_meta()
    dims = _dims(low, a, dims)
    space = low.shape_of(a)
    n = math.prod(space[d] for d in dims) if space else 1
    total = reduce(low, a, dims, "sum", meta=meta, name=low.new_name("sum"))
    # the count is a size: a kernel argument, so a dynamic reduced dim does not change the kernel's text
    return low.pointwise(lambda s: P.build("truediv", s, P.const(float(n), meta.dtype, from_size=True)), total)


def _var(low, a, dims, correction, keepdim, var_meta, mean_meta=None):
    """(var, mean) with the two-pass formula; ``mean_meta`` None: the mean is internal (keepdim layout)."""
    space = low.shape_of(a)
    n = math.prod(space[d] for d in dims) if space else 1
    dtype = var_meta.dtype
    acc = P.compute_dtype(dtype)
    kd_shape = tuple(1 if d in dims else s for d, s in enumerate(space))
    mean_internal = ir.TensorMeta(kd_shape, _contig(kd_shape), dtype)
    total = reduce(low, a, dims, "sum", meta=mean_internal, name=low.new_name("sum"))
    mean = low.pointwise(lambda s: P.build("truediv", s, P.const(float(n), dtype, from_size=True)), total,
                         meta=mean_internal,
                         name=low.new_name("mean"))
    corr = float(plain(correction)) if correction is not None else 1.0
    denom = max(n - corr, 0.0)

    def sq_dev(x, vars_):
        m = low.load(mean, tuple(ir.const_index(0) if d in dims else vars_[d] for d in range(len(space))))
        d = P.build("sub", P.cast(x, acc), P.cast(m, acc))
        return P.build("mul", d, d)
    ss = reduce(low, a, dims, "sum", meta=ir.TensorMeta(var_meta.shape, var_meta.stride, acc),
                body_fn=sq_dev, name=low.new_name("sumsq"), acc_dtype=acc)
    var = low.pointwise(lambda s: P.build("truediv", s, P.const(denom, acc, from_size=True)), ss, meta=var_meta,
                        name=low.current.name if mean_meta is None else low.new_name("var"))
    if mean_meta is None:
        return var, None
    mean_out = low.pointwise(lambda m: m, _reshape_like(low, mean, mean_meta, dims, space), meta=mean_meta,
                             name=low.new_name("mean_out"))
    return var, mean_out


def _contig(shape):
    from .core import contiguous_stride
    return contiguous_stride(shape)


def _reshape_like(low, keepdim_tv, meta, dims, space):
    """``keepdim_tv`` (size-1 at the reduced dims) seen with the output's (possibly squeezed) shape."""
    if tuple(meta.shape) == tuple(low.shape_of(keepdim_tv)):
        return keepdim_tv
    out_dims = out_dims_for(space, dims, meta.shape)
    vmeta = ir.TensorMeta(meta.shape, meta.stride, low.tensor_meta[keepdim_tv.name].dtype)

    def index_fn(v):
        src = [ir.const_index(0)] * len(space)
        for k, d in enumerate(out_dims):
            if d is not None:
                src[d] = v[k]
        return src
    from .views import make_view
    return make_view(low, keepdim_tv, index_fn, name=low.new_name("mean_view"), meta=vmeta)


@register(aten.var.correction, prims.var.default)
def _var_rule(low, a, dims=None, correction=None, keepdim=False, **kwargs):
    if low.current.target is prims.var.default:
        correction = kwargs.get("correction", correction)
    var, _ = _var(low, a, _dims(low, a, dims), correction, keepdim, low.out_meta())
    return var


@register(aten.var_mean.correction)
def _var_mean(low, a, dims=None, correction=None, keepdim=False):
    return _var(low, a, _dims(low, a, dims), correction, keepdim, low.out_meta(k=0), low.out_meta(k=1))


# Scans as a reduction over a triangle: out[..., i, ...] = reduce_{j <= i} x[..., j, ...]. Quadratic in the
# scanned length, so only short scans (prod's backward uses cumprod over the reduced dim) get a kernel.
SCAN_MAX_LENGTH = 2048


def _scan(low, a, dim, kind: str):
    space_in = low.shape_of(a)
    meta = low.out_meta()
    rank = len(space_in)
    if rank == 0:
        return low.pointwise(lambda x: x, a)
    d = norm_dim(plain(dim), rank)
    n = space_in[d]
    if n > SCAN_MAX_LENGTH:
        raise LoweringError(f"a scan over {n} elements (the quadratic form stops at {SCAN_MAX_LENGTH})")
    space = tuple(space_in[:d + 1]) + (n,) + tuple(space_in[d + 1:])
    vars_ = ir.loop_vars(space)
    src = [vars_[k] if k < d else vars_[k + 1] for k in range(rank)]
    acc = P.compute_dtype(meta.dtype)
    x = P.cast(low.load(a, src), meta.dtype)
    x = P.cast(x, acc) if acc != meta.dtype else x
    keep = P.build("le", ir.IndexValue.make(vars_[d + 1], torch.int64), ir.IndexValue.make(vars_[d], torch.int64))
    ident = P.const(0 if kind == "sum" else 1, x.dtype)
    body = P.where(keep, x, ident)
    out_dims = tuple(k if k <= d else k + 1 for k in range(rank))
    return low.add(ir.Reduction(low.current.name, meta.shape, low.buffer_stride(meta), meta.dtype, kind, space,
                                (d + 1,), out_dims, body, low.origin()))


@register(aten.cumsum.default)
def _cumsum(low, a, dim, dtype=None):
    return _scan(low, a, dim, "sum")


@register(aten.cumprod.default)
def _cumprod(low, a, dim, dtype=None):
    return _scan(low, a, dim, "prod")
