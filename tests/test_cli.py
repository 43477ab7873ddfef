import subprocess
import sys

import pytest

from tilefuse import cli

SUBCOMMANDS = ["demo", "info", "targets", "bench", "report", "explain", "port"]


def _run(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "tilefuse", *args], capture_output=True, text=True, timeout=timeout)


def test_help_lists_every_subcommand():
    proc = _run("--help")
    assert proc.returncode == 0
    for name in SUBCOMMANDS:
        assert name in proc.stdout


@pytest.mark.parametrize("name", SUBCOMMANDS)
def test_each_subcommand_has_help(name, capsys):
    with pytest.raises(SystemExit) as info:
        cli.main([name, "--help"])
    assert info.value.code == 0
    assert "usage: tilefuse " + name in capsys.readouterr().out


def test_info_on_cpu_says_it_runs_on_the_interpreter(capsys):
    from tilefuse import device

    if device.current().is_gpu:
        pytest.skip("this machine has a GPU")
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    assert "Triton's interpreter" in out and "ceilings:  none" in out


def test_bench_without_gpu_is_reported_as_not_run(capsys):
    from tilefuse import device

    if device.current().is_gpu:
        pytest.skip("this machine has a GPU")
    assert cli.main(["bench", "gemm", "--out", "/nonexistent-not-written"]) == 1
    assert "not run" in capsys.readouterr().err


def test_unknown_suite_is_a_one_line_error(capsys):
    assert cli.main(["bench", "nosuch", "--smoke"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "tilefuse bench: error: unknown suite 'nosuch': accepted values are gemm, ladder, compiler, models, attention"


def test_report_of_missing_file_is_a_one_line_error(capsys):
    assert cli.main(["report", "/no/such.csv"]) == 2
    assert capsys.readouterr().err.strip() == "tilefuse report: error: no such CSV file: /no/such.csv"
