"""The compiler's kernels for the bench graphs build for NVIDIA and AMD targets (no GPU needed)."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parents[1]  # tests/


@pytest.mark.slow
def test_bench_graph_kernels_cross_compile_for_sm90_and_gfx942():
    """tests/compile_only/compiler_kernels_checks.py in a child that is not on the interpreter: each of the
    18 bench graphs' kernels for both vendors, sm_90 without spills, the GPU texts of the fast helpers, the
    index bounds asserts compiled in."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TILEFUSE_INTERPRET="0", PYTHONPATH=str(HERE.parent))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(HERE / "compile_only" / "compiler_kernels_checks.py")],
                          capture_output=True, text=True, env=env, cwd=HERE.parent, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert re.search(r"\b38 passed", proc.stdout) and "failed" not in proc.stdout, proc.stdout[-2000:]
