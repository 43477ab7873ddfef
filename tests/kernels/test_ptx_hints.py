"""The evict-first hint on B's TMA loads (tilefuse.kernels.ptx_hints): the PTX rewrite on its own, and, in a
child that compiles, on the GEMM kernels for sm_90a and sm_100a."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tilefuse.kernels import ptx_hints

HERE = Path(__file__).resolve().parents[1]  # tests/

# the shape of Triton 3.6's PTX around two tensor-map parameters and their TMA loads
PTX = """.visible .entry k(
	.param .align 64 .b8 k_param_0[128],
	.param .u32 k_param_1,
	.param .align 64 .b8 k_param_2[128],
	.param .u64 .ptr .global .align 1 k_param_3
)
{
	.reg .pred 	%p<4>;
	.reg .b64 	%rd<9>;

	mov.b64 	%rd4, k_param_0;
	mov.b64 	%rd5, k_param_2;
	cvta.param.u64 	%rd3, %rd5;
	cvta.param.u64 	%rd2, %rd4;
	@%p2 cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%r16], [%rd2, {%r3, %r17}], [%r8];
	@%p3 cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%r18], [%rd3, {%r9, %r3}], [%r8];
	ret;
}
"""


def test_add_hints_rewrites_the_chosen_maps_loads_only():
    assert ptx_hints.descriptor_registers(PTX) == {"%rd3": 1, "%rd2": 0}
    out, n = ptx_hints.add_hints(PTX, {1: "evict_first"})
    assert n == 1
    lines = out.splitlines()
    b_load = next(x for x in lines if "[%rd3," in x)
    a_load = next(x for x in lines if "[%rd2," in x)
    assert b_load.strip() == ("@%p3 cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
                              ".L2::cache_hint [%r18], [%rd3, {%r9, %r3}], [%r8], %tfpol1;")
    assert "cache_hint" not in a_load
    # the policy is declared and made after the register declarations, before the first instruction
    i_decl = next(i for i, x in enumerate(lines) if "%tfpol<2>" in x)
    i_make = next(i for i, x in enumerate(lines) if "createpolicy.fractional.L2::evict_first.b64" in x)
    i_first = next(i for i, x in enumerate(lines) if "mov.b64" in x)
    assert lines[i_decl - 1].strip().startswith(".reg .b64") and i_decl < i_make < i_first
    both, n = ptx_hints.add_hints(PTX, {0: "evict_last", 1: "evict_first"})
    assert n == 2 and "L2::evict_last.b64 \t%tfpol0" in both
    same, n = ptx_hints.add_hints(PTX, {2: "evict_first"})  # no third map: nothing changes
    assert n == 0 and same == PTX
    with pytest.raises(ValueError, match="evict_sometimes"):
        ptx_hints.add_hints(PTX, {1: "evict_sometimes"})


def test_only_marked_kernels_are_rewritten_and_a_marked_one_without_b_loads_is_an_error():
    assert ptx_hints.hint_marked(PTX) == PTX
    marked = PTX.replace("\tret;", f"\t// {ptx_hints.MARKER}\n\tret;")
    assert "%tfpol1;" in ptx_hints.hint_marked(marked)
    one_map = marked.replace("\t.param .align 64 .b8 k_param_2[128],\n", "\t.param .u64 k_param_2,\n")
    with pytest.raises(RuntimeError, match="B_HINT"):
        ptx_hints.hint_marked(one_map)


def test_the_hook_is_installed_once_and_keeps_an_earlier_hook():
    from triton import knobs

    import tilefuse.kernels.gemm  # noqa: F401  (installs the hook)
    assert ptx_hints._installed and knobs.runtime.add_stages_inspection_hook is not None
    hook = knobs.runtime.add_stages_inspection_hook
    ptx_hints.install()
    assert knobs.runtime.add_stages_inspection_hook is hook
    stages = {"ptx": lambda src, md: src}
    hook(None, stages, None, None, 90)
    assert "%tfpol1;" in stages["ptx"](PTX.replace("\tret;", f"\t// {ptx_hints.MARKER}\n\tret;"), {})
    amd = {"amdgcn": lambda src, md: src}
    hook(None, amd, None, None, None)  # another backend's pipeline: left alone
    assert set(amd) == {"amdgcn"} and amd["amdgcn"]("x", {}) == "x"


def test_gemm_kernels_hint_b_when_cross_compiled():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TILEFUSE_INTERPRET"] = "0"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(HERE / "compile_only" / "ptx_hints_checks.py")],
                          capture_output=True, text=True, env=env, cwd=HERE.parent, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "5 passed" in proc.stdout


def test_the_probe_writes_each_variants_policies():
    """tools/tma_hint_probe.py --ptx: what the H200 timed (docs/decisions/014), cross-compiled here: the unhinted
    variant has no hinted load, b_first and a_last hint one operand's loads (half), both hint all, and ptxas takes each."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TILEFUSE_INTERPRET"] = "0"
    proc = subprocess.run([sys.executable, str(HERE.parent / "tools" / "tma_hint_probe.py"), "--ptx"],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    counts = dict(re.findall(r"^(\w+): 16 TMA loads, (\d+) hinted", proc.stdout, flags=re.M))
    assert counts == {"none": "0", "b_first": "8", "a_last": "8", "both": "16"}, proc.stdout
    assert proc.stdout.count("evict_first") == 2 and proc.stdout.count("evict_last") == 2
