"""Code generation: a fusion group -> the text of one standalone Triton kernel module; a GEMM's fused epilogue
-> a ``@triton.jit`` hook for the library's GEMM template (:mod:`.gemm_epilogue`); an attention score chain -> a
``score_mod`` (:mod:`.score_mod`). The writer and its kernel forms are in
:mod:`.kernel_writer`; their performance settings are the compiler's tuning table (:mod:`..tuning`)."""
from .gemm_epilogue import generate_epilogue
from .kernel_writer import ASSERT_OPTIONS, ASSERT_PREFIX, CODEGEN_VERSION, KernelSource, LaunchTarget, generate

__all__ = ["ASSERT_OPTIONS", "ASSERT_PREFIX", "CODEGEN_VERSION", "KernelSource", "LaunchTarget", "generate",
           "generate_epilogue"]
