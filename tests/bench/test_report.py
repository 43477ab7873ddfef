"""``tilefuse report``: the Markdown tables and the self-contained HTML results page, rendered from the committed
CSVs that the README quotes (docs/report-sources.txt) and checked in headless Chromium where it is installed."""
import base64
import io
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tilefuse.bench import harness, report, report_html

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ROOT / "docs" / "report-sources.txt"


def committed_inputs() -> list[Path]:
    lines = [line.split("#")[0].strip() for line in SOURCES.read_text().splitlines()]
    return [ROOT / line for line in lines if line]


def _row(suite, case, impl, ms, baseline="", vs=None, **kw):
    return harness.Row(suite=suite, case=case, impl=impl, dtype=kw.pop("dtype", "bfloat16"),
                       shape=kw.pop("shape", case.split("/")[-1]), ms_p50=ms, baseline=baseline, vs_baseline=vs,
                       gpu="NVIDIA H200", torch="2.11", triton="3.6.0", git_sha="abc", date="2026-12-04", **kw)


@pytest.fixture(scope="module")
def page() -> str:
    sources, targets, targets_path = report.read_inputs([str(p) for p in committed_inputs()])
    return report_html.render(sources, targets, targets_path)


def test_the_committed_sources_exist_and_cover_the_suites():
    paths = committed_inputs()
    missing = [str(p) for p in paths if not p.exists()]
    assert not missing, f"docs/report-sources.txt names files that are not committed: {missing}"
    suites = {r.suite for p in paths if p.suffix == ".csv" for r in harness.read_csv(p)}
    assert {"ladder", "gemm", "compiler"} <= suites
    assert (ROOT / "docs" / "report.html").exists(), "render it: sh docs/make-report.sh"


def test_markdown_ratio_heading_says_which_time_is_divided_by_which():
    rows = [_row("unit", "mm/bfloat16/8x8x8", "cublas", 2.0), _row("unit", "mm/bfloat16/8x8x8", "tilefuse", 1.0,
                                                                    baseline="cublas", vs=2.0)]
    text = report.render(rows)
    assert "× cublas (cublas time / tilefuse time)" in text and "2.00×" in text and "÷" not in text


def test_page_sections_in_the_articles_order(page):
    heads = re.findall(r'<h2 id="([\w-]+)">', page)
    assert heads == ["ladder", "triton-vs-cuda", "gemm", "compiler", "compile-times", "targets"]
    assert page.count("Not run: no CSV of the") == 0  # every suite has a committed GPU run
    for suite in ("attention", "models"):  # each section names its CSV
        named = [ln.split()[0] for ln in SOURCES.read_text().splitlines() if suite in ln.split("#")[0]]
        assert named and all(src.split("results/")[1] in page for src in named), suite
    assert "× Inductor (Inductor time / tilefuse time)" in page and "÷" not in page
    assert "rung9" in page and "lines of code" in page


def test_page_is_self_contained(page):
    assert not re.search(r'(src|href)\s*=\s*"(https?:|//)', page), "the page must load nothing from elsewhere"
    assert "<link" not in page and "<script" not in page and "@import" not in page
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert len(images) >= 6
    from PIL import Image

    for data in images:
        img = Image.open(io.BytesIO(base64.b64decode(data))).convert("L")
        assert img.size[0] > 300 and img.getextrema()[0] < 128, "a plot is blank"


def test_every_plot_is_titled_with_labelled_axes(monkeypatch, tmp_path):
    seen = []
    real = report_html.figure_png

    def checked(fig):
        for ax in fig.axes:
            seen.append(ax.get_title())
            assert ax.get_title() and ax.get_xlabel() and ax.get_ylabel(), (ax.get_title(), ax.get_xlabel())
        return real(fig)

    monkeypatch.setattr(report_html, "figure_png", checked)
    sources, targets, path = report.read_inputs([str(p) for p in committed_inputs()])
    extra = [_row("models", "gpt2-train-b8", "eager", 10.0, baseline="eager", vs=1.0),
             _row("models", "gpt2-train-b8", "tilefuse", 8.0, baseline="eager", vs=1.25,
                  note="compile_cold_s=12.5 compile_warm_s=2.1 graphs=1 breaks=0 fallbacks=3"),
             _row("attention", "fwd/bfloat16/b4h16s4096d128", "sdpa", 1.0),
             _row("attention", "fwd/bfloat16/b4h16s4096d128", "tilefuse", 0.9, baseline="sdpa", vs=1.11, tflops=500.0)]
    csv = harness.write_csv(extra, tmp_path / "extra.csv")
    sources.append((str(csv), harness.read_csv(csv)))
    html = report_html.render(sources, targets, path)
    assert len(seen) >= 8
    assert "Not run: no CSV of the" not in html and "gpt2-train-b8" in html and "fallbacks=3" in html
    assert "b4h16s4096d128" in html and "12.5" in html  # the model's cold compile time


def test_target_matrix_from_a_targets_json(tmp_path):
    targets = {"targets": ["sm_90a", "gfx942"], "failures": 0, "results": [
        {"kernel": "gemm_tiled", "example": "bf16", "target": "sm_90a", "ok": True, "mma": "wgmma", "registers": 168},
        {"kernel": "gemm_tiled", "example": "bf16", "target": "gfx942", "ok": True, "mma": "mfma", "registers": 128},
        {"kernel": "rung9", "example": "bf16", "target": "gfx942", "ok": False, "claimed": False, "error": "n/a"}]}
    html = report_html.render([], targets, "t.json")
    assert "wgmma, 168 regs" in html and "mfma" in html and "not claimed" in html
    assert html.count("Not run") >= 4  # no CSV at all: every measured section says so


def test_cli_writes_html_and_refuses_a_bad_json(tmp_path, capsys):
    from tilefuse import cli

    out = tmp_path / "r.html"
    csvs = [str(p) for p in committed_inputs() if p.suffix == ".csv"][:1]
    assert cli.main(["report", *csvs, "-o", str(out)]) == 0
    assert out.read_text().startswith("<!DOCTYPE html>")
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    assert cli.main(["report", *csvs, str(bad)]) == 2
    assert "not the output of `tilefuse targets --json`" in capsys.readouterr().err


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--enable-logging=stderr", "--v=0"]


def _chromium(args: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run([CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
                              capture_output=True, text=True, timeout=timeout)


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed (Debian: apt-get install chromium)")
def test_page_renders_in_headless_chromium(page, tmp_path):
    from PIL import Image

    path = tmp_path / "report.html"
    path.write_text(page)
    shot = tmp_path / "shot.png"
    proc = _chromium(["--window-size=1200,3000", f"--screenshot={shot}", path.as_uri()])
    console = [line for line in proc.stderr.splitlines() if ":CONSOLE" in line or "Uncaught" in line]
    assert not console, console
    assert shot.exists(), proc.stderr[-2000:]
    img = Image.open(shot).convert("L")
    lo, hi = img.getextrema()
    assert img.size == (1200, 3000) and hi - lo > 100 and len(img.getcolors(1 << 16) or []) > 20, "blank screenshot"
    dom = _chromium(["--dump-dom", path.as_uri()])
    assert "1. The CUDA C++ ladder, rung by rung, against cuBLAS" in dom.stdout
    assert dom.stdout.count("<img") == page.count("<img")
    assert not [line for line in dom.stderr.splitlines() if ":CONSOLE" in line or "Uncaught" in line]
