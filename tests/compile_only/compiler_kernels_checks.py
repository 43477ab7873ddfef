"""Every kernel the compiler writes for the bench graphs (tools/sweep_reductions.plan_backward_kernels, at
the suite's 32768 x 4096 from fake tensors) builds for sm_90 without local memory and for gfx942, planned for
each vendor's warp size; the helpers' libdevice (GPU) texts are the ones written, and use the approximate exp
there. Run in a child process with TILEFUSE_INTERPRET=0 by tests/compiler/test_compiler_cross_compile.py:
cross-compiling in an interpreting process fails with triton 3.6."""
import re
import sys
from pathlib import Path

import pytest
from triton.backends.compiler import GPUTarget

from tilefuse import targets
from tilefuse.bench import compiler_suite as suite
from tilefuse.compiler import codegen
from tilefuse.compiler.ir import primitives as P

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import sweep_reductions as sr  # noqa: E402

ARCHS = {"sm_90": (GPUTarget("cuda", 90, 32), codegen.LaunchTarget(32, False, 132)),
         "gfx942": (GPUTarget("hip", "gfx942", 64), codegen.LaunchTarget(64, False, 304))}
GPU_TEXT_HELPERS = ("_tf_erfc_f32", "_tf_exp_neg_abs", "_tf_gelu_grad_f32", "_tf_gauss_pdf_f32")


@pytest.mark.parametrize("arch", sorted(ARCHS))
# (the GEMM-bound graphs' matmuls and their fused tails run in the library GEMM, whose targets
# tilefuse.kernels.gemm.targets cross-compiles with an epilogue hook)
@pytest.mark.parametrize("case", [g.case for g in suite.GRAPHS if not g.gemm])
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


def _sass(cubin: bytes) -> str:
    import subprocess
    import tempfile

    tool = targets._tool("cuobjdump")
    assert tool, "cuobjdump (shipped in the triton wheel) not found"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([tool, "-sass", f.name], capture_output=True, text=True, check=True).stdout


def test_two_row_loop_of_whole_steps_has_no_row_selects_on_sm90():
    """layer_norm_gelu's backward row loop (two rows a step, 32768 rows in chunks of 128: whole steps) runs
    without its row mask: no FSEL and no uniform-to-per-thread predicate copies (PLOP3) selecting each row sum's
    and column accumulation's terms (878 -> 786 SASS instructions a step: docs/decisions/024), and its loop stays under
    800 instructions."""
    gpu_target, launch_target = ARCHS["sm_90"]
    _, kernels = sr.plan_backward_kernels("layer_norm_gelu_fwd_bwd", 32768, 4096, target=launch_target)
    rowloops = [(ks, dtypes) for ks, dtypes in kernels if ks.form == "rowloop"]
    assert len(rowloops) == 1 and dict(rowloops[0][0].constexprs)["XBLOCK"] == 2, [k.form for k, _ in kernels]
    ks, dtypes = rowloops[0]
    sass = _sass(sr.compile_kernel(ks, dtypes, gpu_target).asm["cubin"])
    assert " FSEL " not in sass, "row-mask selects in the two-row loop"
    assert sass.count("PLOP3") <= 4, sass.count("PLOP3")
    branches = re.findall(r"/\*([0-9a-f]{4})\*/\s+@!?P\d\s+BRA\s+0x([0-9a-f]+)", sass)
    loops = [(int(a, 16) - int(t, 16)) // 16 + 1 for a, t in branches if int(t, 16) < int(a, 16)]  # backward
    assert loops and max(loops) < 800, loops


def test_index_bounds_asserts_are_compiled_in_for_the_gpu():
    """cross_entropy gathers the target's logit and scatters its one-hot gradient: those kernels assert that
    the target is a class index, carry Triton's debug option (without it Triton drops device asserts), and
    still build for sm_90 without local memory."""
    _, kernels = sr.plan_backward_kernels("cross_entropy_fwd_bwd", 4096, 4096, kinds=("forward", "backward"))
    checked = [(ks, dtypes) for ks, dtypes in kernels if "tl.device_assert" in ks.source]
    assert checked, [ks.name for ks, _ in kernels]
    for ks, dtypes in checked:
        assert ks.options == codegen.ASSERT_OPTIONS, ks.name
        compiled = sr.compile_kernel(ks, dtypes, ARCHS["sm_90"][0], with_options=True)
        assert "__assertfail" in compiled.asm["ptx"], ks.name
        res = targets.cubin_resources(compiled.asm["cubin"])
        assert not res.get("LOCAL"), (ks.name, res)
