"""tools/device_run.sh's logic (budgets, timeouts, what comes back), with a stand-in for python that answers
each step at once, or too slowly. The real dry run is ``tools/device_run.sh --smoke OUTDIR`` (~3 minutes)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "device_run.sh"

FAKE_PYTHON = r'''#!/usr/bin/env bash
# a stand-in for python3: records its arguments, writes the CSVs a step would, sleeps where told
echo "$*" >> "$FAKE_CALLS"
if [ "$1" = "-c" ]; then echo "torch 0 triton 0 transformers 0"; exit 0; fi
if [ "$2" = "pytest" ]; then echo "1 passed"; exit 0; fi
out=""; prev=""
for a in "$@"; do [ "$prev" = "--out" ] && out=$a; prev=$a; done
suite=$4
mkdir -p "$out"
echo "suite,case" > "$out/$suite.partial.csv"
var="FAKE_SLEEP_$suite"
sleep "${!var:-0}"
mv "$out/$suite.partial.csv" "$out/$suite.csv"
'''


def _run(tmp_path, env_extra, *pytest_args):
    fake = tmp_path / "fake-python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    calls = tmp_path / "calls.txt"
    env = {**os.environ, "PYTHON": str(fake), "FAKE_CALLS": str(calls), **env_extra}
    out = tmp_path / "out"
    proc = subprocess.run(["bash", str(SCRIPT), str(out), *pytest_args], env=env, capture_output=True, text=True,
                          timeout=120)
    return proc, out, calls.read_text().splitlines()


@pytest.mark.skipif(sys.platform == "win32", reason="bash script")
def test_every_step_runs_with_its_limits_and_at_most_8_files_come_back(tmp_path):
    proc, out, calls = _run(tmp_path, {"MODELS_DECODE_BUDGET_S": "30"}, "tests/test_x.py", "-m", "gpu")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    files = sorted(p.name for p in out.iterdir())
    assert files == ["attention.csv", "compiler.csv", "device_run.log", "device_run.tar.gz", "gpu-tests.log",
                     "models-decode.csv", "models-infer.csv", "models-train.csv"]
    pytest_call = next(c for c in calls if " pytest " in f" {c} ")
    assert "-v -rfE --tb=short" in pytest_call and pytest_call.endswith("tests/test_x.py -m gpu")
    att = next(c for c in calls if "bench attention" in c)
    assert "--quick" in att and "--budget" in att and "--smoke" not in att
    models = [c for c in calls if "bench models" in c]
    assert [c.split("--mode ")[1].split()[0] for c in models] == ["infer", "train", "decode"]
    for c in models:
        assert "--only gpt2" in c and "--time-limit" in c and "--no-warm" in c
        assert "--backends eager,inductor,tilefuse,tilefuse-reduce-overhead" in c
    assert any("bench compiler" in c and "--quick" in c for c in calls)


@pytest.mark.slow
def test_a_step_past_its_timeout_leaves_its_partial_csv_and_the_rest_runs(tmp_path):
    env = {"FAKE_SLEEP_attention": "30", "ATTENTION_BUDGET_S": "16", "TOTAL_BUDGET_S": "86",
           "MODELS_INFER_BUDGET_S": "20", "MODELS_TRAIN_BUDGET_S": "20", "COMPILER_BUDGET_S": "20"}
    proc, out, calls = _run(tmp_path, env)
    assert proc.returncode == 1
    files = sorted(p.name for p in out.iterdir())
    assert "attention.partial.csv" in files and "attention.csv" not in files
    assert {"models-infer.csv", "models-train.csv", "compiler.csv"} <= set(files)
    assert "gpu-tests.log" not in files  # no tests named: the step is skipped
    log = (out / "device_run.log").read_text()
    assert "attention CUT OFF" in log
    # the attention step had its own 16 s plus what the skipped tests step left, never the later steps' share
    timeout = int(log.split("attention: timeout ")[1].split()[0])
    assert 16 <= timeout <= 86 - 60 - 5
