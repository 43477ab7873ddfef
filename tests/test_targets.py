"""The cross-compilation machinery and the `tilefuse targets` command."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tilefuse import device, targets

HERE = Path(__file__).resolve().parent


def _compile_only_env():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TILEFUSE_INTERPRET"] = "0"
    return env


def test_compile_machinery_on_a_small_matmul():
    """tests/compile_only/targets_checks.py, in a child that is not on the interpreter."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(HERE / "compile_only" / "targets_checks.py")],
                          capture_output=True, text=True, env=_compile_only_env(), cwd=HERE.parent, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "failed" not in proc.stdout


def test_compiling_in_an_interpreting_process_is_refused_with_the_reason():
    if not device.interpreting():
        pytest.skip("this process compiles kernels")
    with pytest.raises(RuntimeError, match="re-runs in a child"):
        targets.compile_example(None, None, "sm_90a")


def test_unknown_target_names_the_accepted_values():
    with pytest.raises(ValueError, match="unknown target 'sm_75': accepted values are sm_80, sm_90a"):
        targets.check_target_names(["sm_75"])


def test_matrix_format_marks_failures():
    rows = [targets.Result("k", "e", "sm_80", ok=True, mma="mma.sync"),
            targets.Result("k", "e", "gfx942", ok=False, error="boom"),
            targets.Result("k", "e", "sm_90a", ok=False, claimed=False, error="n/a")]
    table = targets.format_matrix(rows, ["sm_80", "sm_90a", "gfx942"])
    assert "mma.sync" in table and "FAIL" in table and "n/a" in table
    assert targets.failures(rows) == [rows[1]]


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "tilefuse", *args], capture_output=True, text=True, timeout=900)


def test_cli_rejects_unknown_target_and_kernel_in_one_line():
    proc = _cli("targets", "--target", "sm_75")
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0
    assert "unknown target 'sm_75': accepted values are sm_80, sm_90a, sm_100a, gfx90a, gfx942, gfx950" in proc.stderr
    proc = _cli("targets", "--kernel", "no_such_kernel", "--triton-only")
    assert proc.returncode == 2 and "unknown kernel 'no_such_kernel': accepted values are" in proc.stderr
    assert proc.stderr.strip().count("\n") == 0


@pytest.mark.slow
def test_every_registered_kernel_builds_for_every_claimed_target():
    """The portability matrix itself: the package's kernels, all six targets, in a compile-only child."""
    proc = _cli("targets", "--json")
    data = json.loads(proc.stdout)
    results = [targets.Result(**r) for r in data["results"]]
    assert results, "no kernel is registered"
    bad = targets.failures(results)
    # the ladder's HIP cells need clang-19 (`make test` installs it where apt can): without it they are
    # skipped with the reason test_cuda_ladder gives, after every other cell is checked
    no_clang = [r for r in bad if r.kind == "hip" and "not found (TILEFUSE_HIP_CLANG)" in r.error]
    bad = [r for r in bad if r not in no_clang]
    assert not bad, "\n".join(f"{r.kernel} [{r.example}] {r.target}: {r.error}" for r in bad)
    assert proc.returncode == (1 if no_clang else 0)
    gemm = [r for r in results if r.kernel == "gemm_tiled" and r.ok]
    assert {r.target for r in gemm} == set(targets.ALL_TARGETS)
    assert any(r.mma == "wgmma" for r in gemm if r.target == "sm_90a")
    assert any(r.mma == "v_mfma" for r in gemm if r.target == "gfx942")
    if no_clang:
        pytest.skip(f"clang-19 is not installed (TILEFUSE_HIP_CLANG): {len(no_clang)} HIP cells of the CUDA C++ "
                    "ladder not compiled (every other cell passed)")
