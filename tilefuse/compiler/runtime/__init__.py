"""Runtime: a compiled graph as one generated wrapper (:mod:`.wrapper`: allocate, launch, call ATen), the GEMM
kernels it launches through the library's plan (:mod:`.gemm`), CUDA-graph capture and replay in reduce-overhead
mode (:mod:`.cudagraphs`), and the interpreter's runtime checks (:mod:`.interpreter_check`,
:mod:`.interpreter_fast`)."""
from .wrapper import CompiledGraph, Plan, PlanError, WrapperWriter, build_plan, extern_layout

__all__ = ["CompiledGraph", "Plan", "PlanError", "WrapperWriter", "build_plan", "extern_layout"]
