"""Lowering of ``index_put_`` along one dimension (a KV cache's row written in place: ``compiler/reinplace.py``
makes it from AOTAutograd's ``index_put`` + ``copy_``, and pairs two with one index into ``index_put_pair_``) and
of ``index_put`` with ``accumulate=True`` at one run of adjacent dimensions (the backward of an embedding, of
``x[a, b]``, of a nearest upsampling): calls of the library's kernels (:mod:`tilefuse.kernels.indexing`), externs
by design. Any other form stays ATen's, reported as a fallback with the reason."""
from __future__ import annotations

import torch

from ...kernels import indexing
from .core import DIRECT_CALLS, ByDesign, LoweringError, register

aten = torch.ops.aten

# the wrapper calls the library's function (which takes ATen's kernel itself for any other form)
DIRECT_CALLS[aten.index_put_.default] = indexing.index_put_
DIRECT_CALLS[aten.index_put.default] = indexing.index_put
DIRECT_CALLS[torch.ops.tilefuse.index_put_pair_.default] = indexing.index_put_pair_


def _meta_of(low):
    def meta(a):
        return low.meta(a) if isinstance(a, torch.fx.Node) else a
    return meta


@register(aten.index_put_.default)
def _index_put_(low, dst, indices, values, accumulate=False):
    node = low.current
    meta = _meta_of(low)
    why = indexing.supported(meta(node.args[0]), [meta(i) for i in node.args[1]], meta(node.args[2]),
                             bool(accumulate))
    if why is not None:
        raise LoweringError(f"index_put_ with {why}: tilefuse's kernel takes one 1-D index at one dimension")
    raise ByDesign("the library's index_put_ kernel (one index dimension, tilefuse.kernels.indexing)")


@register(aten.index_put.default)
def _index_put(low, base, indices, values, accumulate=False):
    node = low.current
    meta = _meta_of(low)
    if not accumulate:
        raise LoweringError("index_put without accumulate (out of place): no kernel of tilefuse's takes it")
    b, v = meta(node.args[0]), meta(node.args[2])
    index = [None if i is None else meta(i) for i in node.args[1]]
    if not all(i is None or isinstance(i, torch.Tensor) for i in index):
        raise LoweringError("index_put with an index that is not a tensor")
    why = indexing.accumulate_form(tuple(b.shape), b.dtype,
                                   [None if i is None else (tuple(i.shape), tuple(i.stride()), i.dtype) for i in index],
                                   tuple(v.shape), v.dtype)
    if why is not None:
        raise LoweringError(f"index_put with accumulate=True and {why}: tilefuse's kernel takes index tensors "
                            f"for one run of adjacent dimensions")
    raise ByDesign("the library's deterministic index_put with accumulate=True (tilefuse.kernels.indexing)")


@register(torch.ops.tilefuse.index_put_pair_.default)
def _index_put_pair_(low, dst_a, dst_b, indices, values_a, values_b):
    node = low.current
    meta = _meta_of(low)
    index = [meta(i) for i in node.args[2]]
    for dst, values in ((node.args[0], node.args[3]), (node.args[1], node.args[4])):
        why = indexing.supported(meta(dst), index, meta(values))
        if why is not None:  # (compiler/reinplace.py pairs only writes of the kernel's form)
            raise LoweringError(f"index_put_pair_ with {why}: tilefuse's kernel takes one 1-D index at one dimension")
    raise ByDesign("the library's index_put_ kernel, two writes with one index in one launch "
                   "(tilefuse.kernels.indexing)")
