"""tools/ncu_profile.py without a GPU: its case list, argument checks and the summary of an ncu report."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "ncu_profile.py"


def _module():
    spec = importlib.util.spec_from_file_location("ncu_profile", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)  # imports nothing heavy at module level: torch only inside the cases
    return mod


def test_list_and_unknown_cases(capsys):
    mod = _module()
    assert mod.main(["--list"]) == 0
    listed = capsys.readouterr().out.split()
    assert "gemm4096" in listed and "skinny256" in listed and "layer_norm_gelu_fwd_bwd" in listed
    with pytest.raises(SystemExit, match="unknown cases"):
        mod.main(["gemm4096", "nope"])
    with pytest.raises(SystemExit, match="--config: config label 'T64x64'"):
        mod.main(["small1024", "--config", "T64x128x128-w4-s4,T64x64"])


DETAILS = '''"ID","Kernel Name","Section Name","Metric Name","Metric Unit","Metric Value"
"0","nvjet_128x256","GPU Speed Of Light Throughput","Duration","us","178.56"
"0","nvjet_128x256","GPU Speed Of Light Throughput","SM Frequency","Ghz","1.58"
"0","nvjet_128x256","Launch Statistics","Registers Per Thread","register/thread","168"
"1","rung9_kernel","GPU Speed Of Light Throughput","Duration","us","181.18"
"1","rung9_kernel","Memory Workload Analysis","L2 Hit Rate","%","78.2"
"1","rung9_kernel","Some Other Section","Not Printed","x","1"
'''
RAW = '''"ID","Kernel Name","gpu__time_duration.sum","smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio","smsp__average_warps_issue_stalled_wait_per_issue_active.ratio","sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active","unrelated__metric"
"","","us","inst","inst","%","x"
"0","nvjet","178.56","6.02","0.01","95.0","7"
"1","rung9","181.18","13.08","1.5","94.0","7"
'''


def test_summary_reads_details_and_raw_pages(tmp_path, capsys):
    mod = _module()
    (tmp_path / "d.csv").write_text(DETAILS)
    (tmp_path / "r.csv").write_text(RAW)
    assert mod.main(["--summary", str(tmp_path / "d.csv"), "--raw", str(tmp_path / "r.csv")]) == 0
    out = capsys.readouterr().out
    first, second = out.split("-- launch 1")
    assert "nvjet_128x256" in first and "178.56 us" in first and "1.58 Ghz" in first and "168" in first
    assert "6.02" in first and "95.0" in first
    assert "0.01" not in first  # a stall under RAW_MIN_STALL is left out
    assert "rung9_kernel" in second and "181.18 us" in second and "78.2 %" in second and "13.08" in second
    assert "1.5 inst" in second and "Not Printed" not in out and "unrelated" not in out
