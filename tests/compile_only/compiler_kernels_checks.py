"""Every kernel the compiler writes for the bench graphs (scripts/sweep_reductions.plan_backward_kernels, at
the suite's 32768 x 4096 from fake tensors) builds for sm_90 without local memory and for gfx942, planned for
each vendor's warp size; the helpers' libdevice (GPU) texts are the ones written, and use the approximate exp
there. Run in a child process with TILEFUSE_INTERPRET=0 by tests/test_compiler_cross_compile.py:
cross-compiling in an interpreting process fails with triton 3.6."""
import sys
from pathlib import Path

import pytest
from triton.backends.compiler import GPUTarget

from tilefuse import targets
from tilefuse.bench import compiler_suite as suite
from tilefuse.compiler import codegen
from tilefuse.compiler import primitives as P

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import sweep_reductions as sr  # noqa: E402

ARCHS = {"sm_90": (GPUTarget("cuda", 90, 32), codegen.LaunchTarget(32, False, 132)),
         "gfx942": (GPUTarget("hip", "gfx942", 64), codegen.LaunchTarget(64, False, 304))}
GPU_TEXT_HELPERS = ("_tf_erfc_f32", "_tf_exp_neg_abs", "_tf_gelu_grad_f32", "_tf_gauss_pdf_f32")


@pytest.mark.parametrize("arch", sorted(ARCHS))
@pytest.mark.parametrize("case", [g.case for g in suite.GRAPHS])
def test_bench_graph_kernels_build(arch, case):
    gpu_target, launch_target = ARCHS[arch]
    _, kernels = sr.plan_backward_kernels(case, 32768, 4096, target=launch_target, kinds=("forward", "backward"))
    assert kernels
    for ks, dtypes in kernels:
        compiled = sr.compile_kernel(ks, dtypes, gpu_target)
        used = [h for h in GPU_TEXT_HELPERS if h + "(" in ks.source]
        uses_gpu_text = bool(used)
        for h in used:
            assert P.GPU_HELPERS[h] in ks.source, (ks.name, h)
        if "libdevice." in ks.source:
            assert "from triton.language.extra import libdevice" in ks.source
        if arch == "sm_90":
            res = targets.cubin_resources(compiled.asm["cubin"])
            assert not res.get("LOCAL") and not res.get("STACK"), (ks.name, res)
            if uses_gpu_text:
                assert "ex2.approx.ftz.f32" in compiled.asm["ptx"], ks.name
        elif uses_gpu_text:
            assert "v_exp_f32" in compiled.asm["amdgcn"], ks.name
