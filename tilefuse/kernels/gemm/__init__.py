"""The Triton GEMM family: C = epilogue(A @ B), one source for the library API and the compiler.

Kernels
-------
- :func:`gemm_tiled_kernel`: one output tile a program, tiles in grouped (L2-aware) order, batched on grid
  axis 1. ``SPLIT_K > 1`` cuts K into ranges run by separate programs (the split-K variant, for
  M <= 256 where the tiles alone leave SMs idle): each writes its fp32 partial tile to a workspace, and
  the last to arrive at the tile's counter (an atomic) sums the partials in a fixed order, runs the
  epilogue, stores and resets the counter. No second launch, deterministic.
- :func:`gemm_persistent_kernel`: one program an SM looping over tiles; on Hopper/Blackwell the loads and
  the store go through TMA tensor descriptors, made on the host and passed in (``HOST_DESC``, the default
  on NVIDIA) or made in the kernel (``tl.make_tensor_descriptor``, which needs :func:`triton.set_allocator`;
  detected, with a clean fallback to pointer loads). ``STREAM_K``
  deals the last, partial round of tiles out to every program as K steps (stream-K), reduced like split-K.
  ``FLATTEN`` has triton pipeline the tile loop and the K loop as one, so a program's next tile loads
  while this tile's epilogue runs (``gemm_configs.FLATTEN_NOTE``).
- ``B_HINT`` (both kernels, host descriptors on NVIDIA): B's TMA loads carry an L2 evict-first policy, written
  into the PTX by :mod:`.ptx_hints` (Triton 3.6 has no way to ask for it); for shapes that read B once.
- :func:`quantize_rows_kernel`: the second pass of output quantisation when a row spans several tiles.
- :func:`relayout_kernel`: a transposing copy (an operand made K-major for Hopper's tf32/fp8/int8 wgmma).

Both GEMM kernels take the same arguments in the same order and end in
:func:`tilefuse.kernels.gemm.epilogue.apply_epilogue` (bias, activation, residual, alpha/beta, fp8/int8
dequant scales, the ``EPILOGUE`` hook; see that module for the hook's contract), then cast and store, or
quantise to fp8/int8 with a per-row scale from the row amax.

Host side (:mod:`.plan`, :mod:`.launching`, reachable from here by name): :func:`gemm_call` /
:func:`gemm_raw` (check -> allocate -> launch, planned once a call signature and then replayed through the
compiled launchers) and :func:`gemm_with_epilogue`, the entry the compiler calls with a generated hook.
Configs come from :mod:`.tuning` (disk-cached autotuning on a GPU, the heuristic
default otherwise).
"""
from __future__ import annotations

# The kernels and the names the family always exported from its one module (checks, configs, epilogue constants)
from .kernels import *  # noqa: F401,F403
from .kernels import (FLOAT_INPUTS, TMA_ALIGN, Epilogue, GemmOutputs, MNOperand, Operands, fp8_grid,  # noqa: F401
                      prepare, qmax, SAFE_CONFIG, GemmConfig, ACTIVATIONS, BIAS_MODES, NUM_EXTRA_OPERANDS, QUANT_DIRECT,
                      QUANT_EPS, QUANT_NONE, QUANT_TWO_PASS, SCALE_MODES_A, SCALE_MODES_B, apply_epilogue, quantize_values,
                      mark_b_hint)

_HOST_NAMES = {
    "launch": "launching", "launches": "launching", "warmup": "launching", "bound": "launching",
    "gemm_call": "plan", "gemm_raw": "plan", "gemm_with_epilogue": "plan", "supports": "plan",
    "scratch_operands": "plan", "run_with_config": "plan", "choose_config": "plan",
}


def __getattr__(name: str):
    """The host functions, imported on first use (plan and launch import the kernels module)."""
    module = _HOST_NAMES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{module}", __package__), name)
    globals()[name] = value
    return value


from . import targets  # noqa: E402,F401  (registers the kernels with the target matrix)
