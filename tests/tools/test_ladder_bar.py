"""tools/ladder_bar.py: issue 4's bar read from ladder suites (CSV or log), and its --run driver, on the CPU."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
RUN100_CSV, RUN100_LOG = RESULTS / "run100" / "ladder.csv", RESULTS / "run100" / "ladder.log"
RUN101_LOGS = [RESULTS / "run101" / "ladder1.log", RESULTS / "run101" / "ladder2.log"]


def _bar():
    spec = importlib.util.spec_from_file_location("ladder_bar", ROOT / "tools" / "ladder_bar.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def test_csv_and_log_of_one_suite_agree():
    """One committed suite kept both its CSV and its log: the two readings are the same suite's, so their times
    agree to the log's 4 decimals (and the ratios to a few parts in 10^4)."""
    bar = _bar()
    from_csv = {g.shape: g for g in bar.readings([RUN100_CSV], "9")[0]}
    from_log = {g.shape: g for g in bar.readings([RUN100_LOG], "9")[0]}
    assert set(from_csv) == set(from_log) == set(bar.BAR_SHAPES)
    for shape in bar.BAR_SHAPES:
        assert from_csv[shape].rung_ms == pytest.approx(from_log[shape].rung_ms, abs=6e-5)
        assert from_csv[shape].peer_ms == pytest.approx(from_log[shape].peer_ms, abs=6e-5)
        assert from_csv[shape].ratio == pytest.approx(from_log[shape].ratio, abs=1e-3)


def test_committed_suites_read_as_the_docs_say():
    """The three suites of the balanced round (README, docs/decisions/010-ladder-bar.md): 1.024, 1.010, 0.992 at
    4096^3 and 1.020, 1.010, 1.017 at 8192^3, three suites of the five a verdict needs."""
    bar = _bar()
    got, missing = bar.readings([RUN100_CSV] + RUN101_LOGS, "9")
    assert missing == []
    by_shape = {s: [g.ratio for g in got if g.shape == s] for s in bar.BAR_SHAPES}
    assert by_shape["4096x4096x4096"] == pytest.approx([1.024, 1.010, 0.992], abs=1e-3)  # the docs' 3 decimals
    assert by_shape["8192x8192x8192"] == pytest.approx([1.020, 1.010, 1.017], abs=1e-3)
    text, status = bar.report([RUN100_CSV] + RUN101_LOGS, "9")
    assert status == 2 and "3 suite(s) of the 5 a verdict needs" in text
    text, status = bar.report([RUN100_CSV] + RUN101_LOGS, "9", min_suites=3)
    assert status == 0 and "4096x4096x4096: median 1.0096 over 3 suites, 1 below 1.00: met" in text


def test_verdict_rules():
    bar = _bar()
    R = bar.Reading

    def suites(shape, ratios):
        return [R(f"s{i}", shape, 1.0, r) for i, r in enumerate(ratios)]

    a, b = bar.BAR_SHAPES
    met = suites(a, [1.01, 0.99, 1.02]) + suites(b, [1.0, 1.03, 0.97])
    assert bar.verdict(met, min_suites=3) == ({a: 1.01, b: 1.0}, 0)
    missed = suites(a, [1.01, 0.99, 0.995]) + suites(b, [1.03, 1.03, 1.03])
    assert bar.verdict(missed, min_suites=3)[1] == 1
    assert bar.verdict(suites(a, [1.05] * 5), min_suites=3) == ({a: 1.05, b: None}, 2)  # 8192^3 never timed
    assert bar.verdict(met, min_suites=4)[1] == 2  # too few suites: no verdict, whatever the median


def test_missing_rows_and_bad_files(tmp_path):
    bar = _bar()
    log = tmp_path / "cut.log"
    log.write_text("  mm/bfloat16/4096x4096x4096   cublas_nt    0.1995 ms    688.8 TFLOP/s\n"
                   "  mm/bfloat16/4096x4096x4096   rung9        not run: cut off\n")
    got, missing = bar.readings([log], "9")
    assert got == [] and len(missing) == 2 and all("not run" in m for m in missing)
    other = tmp_path / "gemm.csv"
    other.write_text(RUN100_CSV.read_text().replace("\nladder,", "\ngemm,"))
    with pytest.raises(ValueError, match="not a ladder suite's CSV"):
        bar.suite_times(other)
    for argv in ([], ["--run", "2"], ["--out", str(tmp_path)], [str(tmp_path / "none.csv")],
                 [str(ROOT / "README.md")], ["--run", "-1", "--out", str(tmp_path)],
                 ["--min-suites", "0", str(RUN100_CSV)], ["--rung", "10", str(RUN100_CSV)], ["--run", "1", "--out", str(tmp_path), "--timeout-s", "0"]):
        with pytest.raises(SystemExit):
            bar.parse_args(argv)


def test_run_counts_finished_suites_only(tmp_path, monkeypatch):
    """--run: a suite that wrote its CSV (exit 0, or 1 for a failed row elsewhere) has it copied to OUT/ladderK.csv
    and counted with the files named; one cut off or dead before its CSV is reported and left out; ladder_bar.log
    holds every suite's log and the summary."""
    bar = _bar()
    calls = []

    def fake_run(cmd, **kw):
        calls.append(cmd)
        out = Path(cmd[cmd.index("--out") + 1])
        if len(calls) == 2:
            raise subprocess.TimeoutExpired(cmd, kw["timeout"], output=b"== bench ladder\n")
        if len(calls) == 3:  # died before its CSV
            return subprocess.CompletedProcess(cmd, 1, "== bench ladder\n", "boom\n")
        if len(calls) == 4:  # a row of another rung wrong: exit 1, the CSV written, its rung-9 rows count
            (out / "ladder.csv").write_text(RUN100_CSV.read_text())
            return subprocess.CompletedProcess(cmd, 1, "== ladder: 52 rows (1 error/wrong)\n", "")
        (out / "ladder.csv").write_text(RUN100_CSV.read_text())
        return subprocess.CompletedProcess(cmd, 0, "== bench ladder\n", "")

    monkeypatch.setattr(bar.subprocess, "run", fake_run)
    status = bar.main(["--run", "4", "--out", str(tmp_path / "out"), "--min-suites", "3", *map(str, RUN101_LOGS)])
    assert [c[-4:-2] for c in calls] == [["bench", "ladder"]] * 4
    out = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert out == ["ladder1.csv", "ladder4.csv", "ladder_bar.log"]  # nothing else under OUT
    log = (tmp_path / "out" / "ladder_bar.log").read_text()
    assert "suite 2: rc 124" in log and "NOT RUN to the end" in log and "suite 3: rc 1" in log and "boom" in log
    assert "2 of 4 suites did not finish: not counted" in log
    # the two suites of the logs and the CSV's twice: 4096^3 ratios 0.992, 1.010, 1.024, 1.024
    assert "4096x4096x4096: median 1.0170 over 4 suites, 1 below 1.00: met" in log and status == 0


def test_run_without_a_gpu_gives_no_verdict(tmp_path):
    """The real thing on this machine: `tilefuse bench ladder` refuses to time without a GPU, so no suite is
    counted and the exit status says there is no verdict."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the suite would time for minutes (this test is for machines without one)")
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "ladder_bar.py"), "--run", "1", "--out",
                           str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    log = (tmp_path / "ladder_bar.log").read_text()
    assert "suite 1: rc 1" in log and "timings need a GPU" in log and "no verdict" in log
