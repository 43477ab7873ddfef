"""tilefuse's torch.compile backend: TorchDynamo -> AOTAutograd -> decomposition -> loop IR -> fusion
scheduler -> generated Triton kernels -> disk cache -> runtime.

Stages (each a module, each testable alone): ``decompositions`` (the table), ``lowering`` (+ the rule files
``lowering_pointwise``, ``lowering_views``, ``lowering_reductions``) into ``ir``, ``verify`` (IR checks),
``scheduler`` (fusion groups), ``codegen`` (Triton text, helpers in ``primitives``), ``cache`` (kernel files),
``runtime`` (the per-graph wrapper), ``backend`` (Dynamo + AOTAutograd), ``explain``.

    torch.compile(model, backend="tilefuse")
    torch.compile(model, backend="tilefuse", mode="reduce-overhead")   # CUDA graphs (cudagraphs.py)
    tilefuse.compiler.stats()        # graphs, kernels, kernels_compiled, cache_hits, fallbacks, externs,
                                     # cudagraph_recordings, cudagraph_replays, cudagraphs (per graph), ...
    tilefuse.compiler.reset_stats()
    tilefuse.explain(fn, *args)      # graph breaks, fusion groups, kernels, fallbacks
"""
from __future__ import annotations

from .lowering import FallbackError
from .records import reset as reset_stats

__all__ = ["stats", "reset_stats", "FallbackError", "explain"]


def stats() -> dict:
    """What the compiler did in this process (see tilefuse.compiler.stats module docs for each key)."""
    from . import cudagraphs as _cudagraphs, records as _records

    out = _records.snapshot()
    out["cudagraph_pool_bytes"] = _cudagraphs.pools_held_bytes()
    return out


def explain(fn, *args, **kwargs):
    from .explain import explain as _explain

    return _explain(fn, *args, **kwargs)
