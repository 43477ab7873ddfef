"""tools/sweep_reductions.py --inspect plans the bench graphs' kernels for an H100 under a tuning setting and lists
each kernel's form, grid and launch settings, without a GPU (--no-compile: no sm_90 build). Run as a child
process, as a user runs it: it plans with TILEFUSE_INTERPRET=0, which this process must not take on."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_inspect_lists_the_kernels_of_a_graph_under_a_setting(tmp_path):
    env = dict(os.environ, TILEFUSE_CACHE_DIR=str(tmp_path), PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "sweep_reductions.py"), "--inspect", "--no-compile",
                           "--graphs", "layer_norm_fwd_bwd", "--settings", "default", "--rows", "1024",
                           "--cols", "4096"], capture_output=True, text=True, env=env, timeout=300)
    out = proc.stdout
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "== layer_norm_fwd_bwd default" in out and "planning FAILED" not in out, out
    kernels = re.findall(r"^\s+(tfk_\w+)\s+(\w+)\s+grid \((\d+),\)", out, re.M)
    # the forward's row kernel and the backward's dx row kernel (one program a row), and the weight and bias
    # gradients' column sums over the 1024 rows
    assert len(kernels) >= 3 and sum(grid == "1024" for _, _, grid in kernels) >= 2, out
