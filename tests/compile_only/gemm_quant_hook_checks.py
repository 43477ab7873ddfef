"""The compiler's quantising GEMM epilogue hooks (fp8 e4m3fn / e5m2 and int8 outputs with a graph scale; their
float8 casts and stores are written from bits and float32 arithmetic, compiler/ir/float8.py) cross-compile inside
the library's GEMM template for sm_90a and gfx942. Run in a child process with TILEFUSE_INTERPRET=0 by
tests/compiler/test_compiler_gemm_quant.py: cross-compiling in an interpreting process fails with triton 3.6."""
import importlib.util
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from tilefuse import targets
from tilefuse.compiler import codegen, scheduler
from tilefuse.kernels.gemm import gemm_tiled_kernel
from tilefuse.kernels.gemm import targets as gemm_targets
from tilefuse.kernels.gemm.configs import GemmConfig

from tests.compiler_checks import fake_schedules

CONFIGS = {"sm_90a": GemmConfig("tiled", 128, 128, 64, 8, num_warps=8, num_stages=3),
           "gfx942": GemmConfig("tiled", 256, 128, 64, 8, num_warps=8, num_stages=2, waves_per_eu=2,
                                matrix_instr_nonkdim=16, kpack=2)}
LAUNCH = {"sm_90a": codegen.LaunchTarget(32, False, 132), "gfx942": codegen.LaunchTarget(64, False, 304)}


def e4m3_history(x, w, b, s):
    y = torch.relu(x @ w.t() + b)
    return (y / (s.max() / 448)).clamp(-448, 448).to(torch.float8_e4m3fn)


def e5m2_row(x, w, b, s):
    return (x @ w.t() / s[: x.shape[0], :1]).to(torch.float8_e5m2)


def int8_row(x, w, b, s):
    return (torch.nn.functional.gelu(x @ w.t()) / s[: x.shape[0], :1]).round().clamp(-128, 127).to(torch.int8)


def _hooks(fn, target: codegen.LaunchTarget) -> list:
    M, K, N = 256, 128, 384

    def args():
        return (torch.randn(M, K, dtype=torch.bfloat16), torch.randn(N, K, dtype=torch.bfloat16),
                torch.randn(N, dtype=torch.bfloat16), torch.rand(M, 16))

    return [codegen.generate_epilogue(st, sched, target) for sched in fake_schedules(fn, args)
            for st in sched.steps if isinstance(st, scheduler.GemmStep) and st.epilogue is not None]


def _load(ks):
    path = Path(tempfile.mkdtemp(prefix="tilefuse-hook-")) / f"{ks.name}.py"
    path.write_text(ks.source)
    spec = importlib.util.spec_from_file_location(ks.name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[ks.name] = module
    spec.loader.exec_module(module)
    return getattr(module, ks.name)


@pytest.mark.parametrize("target", sorted(CONFIGS))
@pytest.mark.parametrize("fn", [e4m3_history, e5m2_row, int8_row], ids=lambda f: f.__name__)
def test_quantising_hooks_build_in_the_gemm_template(fn, target):
    hooks = _hooks(fn, LAUNCH[target])
    assert hooks, f"{fn.__name__}: no fused GEMM epilogue was planned"
    spec = targets.kernels()["gemm_tiled"]
    for ks in hooks:
        assert "_to_copy" in ks.source, ks.source  # the quantising cast is in the hook
        if fn is not int8_row:  # torch's float8 rounding and the code's bits, not Triton's float8 cast
            assert "_tf_round_to_fp8_grid" in ks.source and "_bits(" in ks.source, ks.source
        # the codes are the only output: the GEMM's own store is off (the compiler's store_out=False)
        assert "the GEMM stores nothing itself" in ks.source, ks.source
        example = gemm_targets._example(gemm_tiled_kernel, ks.name, target, CONFIGS[target],
                                        epilogue={"EPILOGUE": _load(ks), "STORE_C": False})
        result = targets.compile_example(spec, example, target)
        assert result.ok, (ks.name, result.error)


def dequant_requant(q, s, t):
    # a float8 input read (every code), dequantised, and quantised again to the other format
    return (q.to(torch.float32) * s).to(torch.float8_e5m2), (t.to(torch.float32) * s).to(torch.float8_e4m3fn)


@pytest.mark.parametrize("arch", ["sm_90", "gfx942"])
def test_float8_pointwise_kernels_build(arch):
    """The generated pointwise kernels that load and store float8 (decoded and encoded from bits) build for
    sm_90 and gfx942."""
    from triton.backends.compiler import GPUTarget

    from tilefuse.compiler import ir

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
    import sweep_reductions as sr

    gpu_target, launch = {"sm_90": (GPUTarget("cuda", 90, 32), LAUNCH["sm_90a"]),
                          "gfx942": (GPUTarget("hip", "gfx942", 64), LAUNCH["gfx942"])}[arch]
    def args():
        return (torch.empty(256, 128, dtype=torch.float8_e4m3fn), torch.rand(256, 1),
                torch.empty(256, 128, dtype=torch.float8_e5m2))

    built = 0
    for sched in fake_schedules(dequant_requant, args):
        table = sched.graph.by_name()
        for st in sched.steps:
            if isinstance(st, scheduler.KernelGroup):
                ks = codegen.generate(st, sched, launch)
                assert "_tf_from_e4m3fn(" in ks.source and "_tf_e5m2_bits(" in ks.source, ks.source
                dtypes = {a[1]: ir.node_meta(table[a[1]], a[1]).dtype for a in ks.args if a[0] == "buf"}
                sr.compile_kernel(ks, dtypes, gpu_target)
                built += 1
    assert built, "no kernel was planned"
