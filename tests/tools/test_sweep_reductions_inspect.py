"""tools/sweep_reductions.py --inspect plans the bench graphs' kernels for an H100 under tuning settings and lists
each kernel's form, grid and launch settings, without a GPU (--no-compile: no sm_90 build). Run as a child
process, as a user runs it: it plans with TILEFUSE_INTERPRET=0, which this process must not take on."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_inspect_lists_the_kernels_of_a_graph_under_each_setting(tmp_path):
    env = dict(os.environ, TILEFUSE_CACHE_DIR=str(tmp_path), PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "sweep_reductions.py"), "--inspect", "--no-compile",
                           "--graphs", "layer_norm_fwd_bwd", "--settings", "default,cols_unsplit_1024,cols_split_1024",
                           "--rows", "1024", "--cols", "4096"], capture_output=True, text=True, env=env, timeout=300)
    out = proc.stdout
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "planning FAILED" not in out, out
    plans = {}
    for block in out.split("== layer_norm_fwd_bwd ")[1:]:
        label, _, rest = block.partition("\n")
        plans[label] = [(form, int(grid)) for form, grid in re.findall(r"^\s+tfk_\w+\s+(\w+)\s+grid \((\d+),\)", rest,
                                                                       re.M)]
    # default: the forward's row kernel (one program a row); the backward's row loop, 128 programs of 8 rows that
    # also sum the weight and bias gradients' columns over their rows; the partials' sum
    assert sorted(plans["default"]) == [("persistent", 128), ("persistent", 1024), ("rowloop", 128)], out
    # before decision 058: the backward's row kernel, and the column sums unsplit over the 1024 rows, 128 programs
    assert sorted(plans["cols_unsplit_1024"]) == [("looped", 128), ("persistent", 1024), ("persistent", 1024)], out
    # or split into 32 chunks of 32 rows: 2048 column programs, then the partials' sum
    assert sorted(plans["cols_split_1024"]) == [("looped", 2048), ("persistent", 32), ("persistent", 1024),
                                                ("persistent", 1024)], out
