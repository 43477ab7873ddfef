"""Lowering: an ATen FX graph (after AOTAutograd and decomposition) -> the loop IR (:class:`ir.Graph`).

One registered rule per ATen op (``@register(aten.add)``) builds the IR node(s) for one FX node from the
values of its arguments. :mod:`.core` is the framework (registry, walk, views, promotion, extern fallback);
the rules live in :mod:`.pointwise`, :mod:`.views`, :mod:`.reductions`, :mod:`.gemm`, :mod:`.attention` and
:mod:`.index_put`,
which import the registry from the core and register themselves on the first :func:`lower`.
"""
from __future__ import annotations

from typing import Any, Callable

import torch.fx

from .. import ir
from .core import (DIRECT_CALLS, EXTERN_OPS, SUPPORTED_DTYPES, ByDesign, FallbackError, GraphFallback, Lowerer,
                   LoweringError, op_name, register)

__all__ = ["lower", "register", "op_name", "GraphFallback", "ByDesign", "FallbackError", "LoweringError",
           "EXTERN_OPS", "SUPPORTED_DTYPES", "DIRECT_CALLS"]


def lower(gm: torch.fx.GraphModule, meta: Callable[[torch.fx.Node], Any],
          strict: bool = False) -> tuple[ir.Graph, list, list]:
    """Lower ``gm``: returns (graph, fallbacks [(node, reason)], constants)."""
    # The rule modules register on first use, not at import: some rules name ops that torch defines only once
    # torch.compile has loaded Inductor's prims (prims.fma), and importing those eagerly costs ~1.5 s a process.
    from . import attention, gemm, index_put, pointwise, reductions, views  # noqa: F401  (each registers its rules)

    low = Lowerer(gm, meta, strict)
    graph = low.run()
    return graph, low.fallbacks, low.constants
