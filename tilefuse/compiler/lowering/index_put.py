"""Lowering of ``index_put_`` along one dimension (a KV cache's row written in place: ``compiler/reinplace.py``
makes it from AOTAutograd's ``index_put`` + ``copy_``): a call of the library's kernel
(:mod:`tilefuse.kernels.indexing`), an extern by design. Any other form of ``index_put_`` stays ATen's, reported
as a fallback with the reason."""
from __future__ import annotations

import torch

from ...kernels import indexing
from .core import DIRECT_CALLS, ByDesign, LoweringError, register

aten = torch.ops.aten

# the wrapper calls the library's function (which takes ATen's kernel itself for any other form)
DIRECT_CALLS[aten.index_put_.default] = indexing.index_put_


@register(aten.index_put_.default)
def _index_put_(low, dst, indices, values, accumulate=False):
    node = low.current
    def meta(a):
        return low.meta(a) if isinstance(a, torch.fx.Node) else a

    why = indexing.supported(meta(node.args[0]), [meta(i) for i in node.args[1]], meta(node.args[2]),
                             bool(accumulate))
    if why is not None:
        raise LoweringError(f"index_put_ with {why}: tilefuse's kernel takes one 1-D index at one dimension")
    raise ByDesign("the library's index_put_ kernel (one index dimension, tilefuse.kernels.indexing)")
