"""tilefuse's torch.compile backend: TorchDynamo -> AOTAutograd -> decomposition -> loop IR -> fusion
scheduler -> generated Triton kernels -> disk cache -> runtime.

Stages in pipeline order, each a module or subpackage testable alone: ``backend`` (Dynamo + AOTAutograd,
with the table of ``decompositions``), ``patterns`` (graph passes before AOTAutograd: attention), ``lowering``
(one rule per ATen op, into the loop ``ir``, whose ``primitives`` and value ``ranges`` live with it),
``scheduler`` (fusion groups), ``codegen`` (Triton text), ``cache`` (kernel files), ``runtime`` (the per-graph
wrapper, GEMM launches, CUDA graphs, interpreter checks); ``tuning`` is the one table of performance settings
those stages read; ``options``, ``records`` and ``explain`` serve all of them.

    torch.compile(model, backend="tilefuse")
    torch.compile(model, backend="tilefuse", mode="reduce-overhead")   # CUDA graphs (runtime/cudagraphs.py)
    tilefuse.compiler.stats()        # graphs, kernels, kernels_compiled, cache_hits, fallbacks, externs,
                                     # cudagraph_recordings, cudagraph_replays, cudagraphs (per graph), ...
    tilefuse.compiler.reset_stats()
    tilefuse.explain(fn, *args)      # graph breaks, fusion groups, kernels, fallbacks
"""
from __future__ import annotations

# imported here, not on first call: importing the submodule ``explain`` binds the package's attribute
# ``explain`` to the module, and a function of that name defined below would be replaced by it on first use
from .explain import explain
from .lowering import FallbackError
from .records import reset as reset_stats

__all__ = ["stats", "reset_stats", "FallbackError", "explain"]


def stats() -> dict:
    """What the compiler did in this process (see tilefuse.compiler.stats module docs for each key)."""
    from . import records as _records
    from .runtime import cudagraphs as _cudagraphs

    out = _records.snapshot()
    out["cudagraph_pool_bytes"] = _cudagraphs.pools_held_bytes()
    return out
