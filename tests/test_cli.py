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


def test_version_prints_the_package_version():
    import tilefuse

    proc = _run("--version", timeout=120)
    assert proc.returncode == 0
    assert proc.stdout.strip() == f"tilefuse {tilefuse.__version__}"


def test_info_json_has_cache_dir_and_debug_level(tmp_path):
    import json
    import os

    from tilefuse import config

    env = dict(os.environ, TILEFUSE_DEBUG="2", TILEFUSE_CACHE_DIR=str(tmp_path / "cache"))
    proc = subprocess.run([sys.executable, "-m", "tilefuse", "info", "--json"], capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["debug"] == 2 and info["debug_meaning"] == config.DEBUG_LEVELS[2]
    assert info["cache_dir_configured"] == str(tmp_path / "cache")
    assert info["cache_dir"] == str(tmp_path / "cache")  # writable here, so it is the folder in use
    assert info["tilefuse"] == __import__("tilefuse").__version__


# -------------------------------------------------------------------------------------- explain SCRIPT
EXPLAIN_SCRIPT = '''
import sys
import torch

def f(x):
    y = torch.sin(x) * 2
    print("in the middle", file=sys.stderr)  # Dynamo cannot trace print: one graph break
    return torch.relu(y) + 1

x = torch.randn(37)
out = torch.compile(f)(x)
err = float((out.double() - (torch.relu(torch.sin(x.double()) * 2) + 1)).abs().max())
print(f"script says hello {sys.argv[1:]} err={err:.1e}")
assert err < 1e-5
if "--fail" in sys.argv:
    raise RuntimeError("the script's own error")
'''


def _explain(tmp_path, capsys, *extra):
    script = tmp_path / "model_script.py"
    script.write_text(EXPLAIN_SCRIPT)
    status = cli.main(["explain", str(script), *extra])
    out, err = capsys.readouterr()
    return status, out, err


def test_explain_runs_the_script_with_the_backend_and_counts_breaks(tmp_path, capsys):
    import tilefuse

    status, out, err = _explain(tmp_path, capsys, "one", "two")
    assert status == 0, err
    assert "script says hello ['one', 'two']" in out          # the script's stdout, kept
    assert out.count("script says hello") == 1                 # run once
    assert "in the middle" in err                              # and its stderr
    assert out.index("script says hello") < out.index("== tilefuse explain")
    # the count tilefuse.explain() gives for the same function
    ns: dict = {}
    exec(compile(EXPLAIN_SCRIPT.split("x = torch.randn")[0], "f", "exec"), ns)
    import torch

    expected = tilefuse.explain(ns["f"], torch.randn(37))
    assert expected.graph_break_count == 1
    assert f"Dynamo: {expected.graph_count} graphs, {expected.graph_break_count} graph breaks" in out
    assert "tilefuse: 2 compiled graphs" in out                # torch.compile(f) got the tilefuse backend
    assert "kernel tfk_pw_" in out


def test_explain_keeps_output_and_explains_when_the_script_raises(tmp_path, capsys):
    status, out, err = _explain(tmp_path, capsys, "--fail")
    assert status == 1
    assert "script says hello ['--fail']" in out
    assert "RuntimeError: the script's own error" in err
    assert "model_script.py" in err and "runpy" not in err     # the traceback starts in the script
    assert "(the script failed, exit status 1)" in out
    assert "1 graph breaks" in out and "tilefuse: 2 compiled graphs" in out


def test_explain_calls_main_of_a_script_without_a_main_block(tmp_path, capsys):
    script = tmp_path / "has_main.py"
    script.write_text("import torch\n\ndef main():\n    print('main ran')\n"
                      "    return torch.compile(lambda x: x.exp() + 1)(torch.ones(5))\n")
    assert cli.main(["explain", str(script)]) == 0
    out = capsys.readouterr().out
    assert out.count("main ran") == 1 and "tilefuse: 1 compiled graphs" in out


def test_explain_leaves_a_named_backend_alone(tmp_path, capsys):
    script = tmp_path / "eager_backend.py"
    script.write_text("import torch\nprint(torch.compile(lambda x: x + 1, backend='eager')(torch.ones(3)).sum().item())\n")
    assert cli.main(["explain", str(script)]) == 0
    out = capsys.readouterr().out
    assert "6.0" in out.split("== tilefuse explain")[0]  # the script ran: sum of (ones(3) + 1)
    assert "6.0" in out and "tilefuse: 0 compiled graphs" in out and "named another backend" in out and "eager" in out


def test_explain_of_a_missing_script_is_a_one_line_error(capsys):
    assert cli.main(["explain", "/no/such/script.py"]) == 2
    assert capsys.readouterr().err.strip() == "tilefuse explain: error: no such script: /no/such/script.py"


# ------------------------------------------------------------------------------------------ targets
def test_targets_shows_progress_on_stderr():
    import json
    import re

    proc = _run("targets", "--kernel", "gemm_quantize_rows,attention_combine", "--target", "sm_90a,gfx942",
                "--triton-only", "--json", timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads(proc.stdout)["results"]  # stdout stays pure JSON
    assert len(results) == 6  # (attention_combine has two examples: its split loop and its unrolled form)
    lines = [l for l in proc.stderr.splitlines() if re.match(r"^\[\d+/\d+\] ", l)]
    assert [l.split("]")[0] for l in lines] == [f"[{k}/6" for k in range(1, 7)]
    named = {tuple(l.split()[1:3]) for l in lines}
    assert named == {(t, k) for t in ("sm_90a", "gfx942") for k in ("gemm_quantize_rows", "attention_combine")}
