"""tools/decode_attention_sweep.py: its float64 reference (what each config's output is checked against), its
``--sass`` counts on the CPU, and its argument errors. The timing needs a GPU and is not run here."""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "decode_attention_sweep.py"


def _tool():
    spec = importlib.util.spec_from_file_location("decode_attention_sweep", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(*args, timeout=240):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # (the tool leaves the interpreter itself for --sass)
    return subprocess.run([sys.executable, str(TOOL), *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


@pytest.mark.parametrize("shape", [(1, 4, 4, 1, 37, 16, True), (2, 6, 2, 3, 29, 32, False)],
                         ids=["masked slots", "gqa, three rows"])
def test_the_reference_is_attention_in_float64(shape):
    tool = _tool()
    q, k, v, mask = tool._inputs(shape, "cpu", torch.float32)
    if mask is not None:
        assert not mask[..., -7:].any() and mask[..., :-7].all()  # the unwritten slots of a static cache
    group = shape[1] // shape[2]
    want = F.scaled_dot_product_attention(q.double(), k.double().repeat_interleave(group, 1),
                                          v.double().repeat_interleave(group, 1), attn_mask=mask)
    got = tool._reference(q, k, v, mask)
    assert got.dtype == torch.float64 and torch.allclose(got, want, rtol=1e-10, atol=1e-12)


def test_sass_counts_one_warp_against_four():
    from tilefuse.cuda import build

    if build.cuobjdump() is None:
        pytest.skip("no cuobjdump (neither the triton wheel's nor one on the PATH)")
    done = _run("--sass", "--shapes", "gpt2", "--configs", "16x64-w4-s3,16x64-w1-s3")
    assert done.returncode == 0, done.stderr[-2000:]
    rows = dict(re.findall(r"^\s+(16x64-w\d-s3): (.*)$", done.stdout, re.M))
    assert set(rows) == {"16x64-w4-s3", "16x64-w1-s3"}, done.stdout
    bars = {label: int(re.search(r"(\d+) BAR,", row).group(1)) for label, row in rows.items()}
    mmas = {label: int(re.search(r"(\d+) HMMA", row).group(1)) for label, row in rows.items()}
    assert 0 < bars["16x64-w1-s3"] < bars["16x64-w4-s3"], rows  # four warps share a tile's rows through barriers
    assert mmas["16x64-w1-s3"] > mmas["16x64-w4-s3"] > 0, rows  # one warp issues the four warps' MMAs
    assert all("spills 0" in row for row in rows.values()), rows


@pytest.mark.parametrize("args, said", [(["--configs", "16x64"], "accepted labels look like 16x64-w4-s3"),
                                        (["--shapes", "gpt3"], "unknown ['gpt3']")])
def test_bad_arguments_are_errors_that_say_what_is_accepted(args, said):
    done = _run("--sass", *args, timeout=120)
    assert done.returncode == 2 and said in done.stderr, done.stderr
