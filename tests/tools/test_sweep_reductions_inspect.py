"""tools/sweep_reductions.py --inspect plans the bench graphs' kernels for an H100 under tuning settings and lists
each kernel's form, grid and launch settings, without a GPU (--no-compile: no sm_90 build). Run as a child
process, as a user runs it: it plans with TILEFUSE_INTERPRET=0, which this process must not take on."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

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


@pytest.mark.slow
def test_inspect_plans_a_models_sequences_as_their_rows(tmp_path):
    """--seq 64 views the inputs as 16 sequences of 64 tokens, a model's activations, whose weight and bias
    gradients sum over two dims: the backward is the same row loop of 128 programs as over 1024 rows of one dim,
    not a column kernel of its own. A --seq that does not divide the rows, or a graph not over the last dim, is
    refused with the reason."""
    env = dict(os.environ, TILEFUSE_CACHE_DIR=str(tmp_path), PYTHONPATH=str(ROOT))
    tool = [sys.executable, str(ROOT / "tools" / "sweep_reductions.py"), "--inspect", "--no-compile", "--rows", "1024",
            "--cols", "4096"]
    proc = subprocess.run(tool + ["--seq", "64", "--graphs", "layer_norm_fwd_bwd,gelu_chain_fwd_bwd",
                                  "--settings", "default"], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert "planning FAILED" not in out, out
    forms = re.findall(r"^\s+tfk_\w+\s+(\w+)\s+grid \((\d+),(?: \d+)?\)", out, re.M)
    assert sorted(forms) == sorted([("persistent", "1024"), ("rowloop", "128"), ("persistent", "128"),
                                    ("tiled", "4"), ("rowloop", "128"), ("persistent", "128")]), out
    bad = subprocess.run(tool + ["--seq", "100"], capture_output=True, text=True, env=env, timeout=300)
    assert bad.returncode != 0 and "--seq 100: must be a positive divisor of --rows (1024)" in bad.stderr, bad.stderr
    bad = subprocess.run(tool + ["--seq", "64", "--graphs", "cross_entropy_fwd_bwd"], capture_output=True, text=True,
                         env=env, timeout=300)
    assert bad.returncode != 0 and "not to ['cross_entropy_fwd_bwd']" in bad.stderr, bad.stderr


def test_inspect_cross_compiles_a_row_loop_with_a_short_last_chunk(tmp_path):
    """--inspect without --no-compile builds every kernel for sm_90 (it must not take on Triton's interpreter, which
    a machine without a GPU selects when tilefuse is imported). 1037 rows, a prime's multiple, split into 130 chunks
    of 8 rows and a short last one of 5: the backward is still one row loop, one program a chunk."""
    env = dict(os.environ, TILEFUSE_CACHE_DIR=str(tmp_path), PYTHONPATH=str(ROOT))
    env.pop("TILEFUSE_INTERPRET", None)
    env.pop("TRITON_INTERPRET", None)
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "sweep_reductions.py"), "--inspect", "--rows", "1037",
                           "--cols", "4096", "--graphs", "rms_norm_fwd_bwd", "--settings", "default"],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    kernels = re.findall(r"^\s+(tfk_\w+)\s+(\w+)\s+grid \((\d+),\).*\s(regs \d+, stack \d+.*)$", proc.stdout, re.M)
    assert len(kernels) == 3 and "FAILED" not in proc.stdout, proc.stdout
    assert sorted((form, int(grid)) for _, form, grid, _ in kernels) == \
        [("persistent", 128), ("persistent", 1037), ("rowloop", 130)], proc.stdout
