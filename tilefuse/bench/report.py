"""``tilefuse report``: benchmark CSV rows rendered as Markdown tables, or as one self-contained HTML page.

``tilefuse report CSV... [TARGETS.json] -o report.html`` writes the results page (:mod:`.report_html`: plots
embedded as PNG, nothing loaded from elsewhere); any other ``-o`` (or none) writes Markdown: for each suite one
line a case, one column an implementation (TFLOP/s for compute-bound rows, GB/s for memory-bound ones), and
the ratio of each implementation to the case's baseline peer, headed "× PEER (PEER time / IMPL time)": above
1 is faster. A row that did not run shows its status, never a number. A ``.json`` input is read as the output
of ``tilefuse targets --json`` (the cross-vendor matrix, HTML only).
"""
from __future__ import annotations

import collections
import json
from pathlib import Path
from typing import Iterable, Sequence

from . import harness


def add_arguments(p) -> None:
    p.add_argument("csv", nargs="+", help="benchmark CSV files (as written by `tilefuse bench`), and optionally "
                   "one `tilefuse targets --json` output (.json)")
    p.add_argument("-o", "--output", default=None,
                   help="write here: NAME.html is the self-contained results page, anything else Markdown "
                        "(default: print the Markdown)")
    p.add_argument("--plot", default=None, metavar="PNG", help="also draw a bar chart of the ratios to baseline")
    p.add_argument("--title", default="tilefuse results", help="the HTML page's title")


def _rate(row: harness.Row) -> str:
    if not row.ok:
        return row.status.split(":")[0]
    if row.tflops is not None:
        return f"{row.tflops:.0f} TF/s" if row.tflops >= 10 else f"{row.tflops:.2f} TF/s"
    if row.gbps is not None:
        return f"{row.gbps:.0f} GB/s"
    return f"{row.ms_p50:.3f} ms"


def ratio_label(impl: str, baseline: str) -> str:
    """The heading of a vs_baseline column: the row holds baseline time / impl time."""
    return f"× {baseline} ({baseline} time / {impl} time)"


def suite_table(rows: Sequence[harness.Row]) -> str:
    impls = list(dict.fromkeys(r.impl for r in rows))
    cases = list(dict.fromkeys((r.case, r.dtype) for r in rows))
    by = {(r.case, r.dtype, r.impl): r for r in rows}
    ratio_impls = [i for i in impls if any(r.impl == i and r.vs_baseline is not None for r in rows)]
    head = ["case", "dtype", *impls, *[ratio_label(i, next(r.baseline for r in rows if r.impl == i and r.baseline))
                                       for i in ratio_impls]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for case, dtype in cases:
        cells = [case, dtype]
        for impl in impls:
            row = by.get((case, dtype, impl))
            cells.append(_rate(row) if row else "")
        for impl in ratio_impls:
            row = by.get((case, dtype, impl))
            cells.append(f"{row.vs_baseline:.2f}×" if row and row.vs_baseline is not None else "")
        lines.append("| " + " | ".join(cells) + " |")
    summary = []
    for impl in ratio_impls:
        ratios = [r.vs_baseline for r in rows if r.impl == impl and r.vs_baseline is not None]
        gm = harness.geomean(ratios)
        if gm:
            summary.append(f"- {impl}: geomean {gm:.3f}× over {len(ratios)} cases, min {min(ratios):.2f}×, max {max(ratios):.2f}×")
    not_run = [r for r in rows if not r.ok]
    if not_run:
        summary.append(f"- {len(not_run)} rows did not produce a time: " +
                       "; ".join(f"{r.case}/{r.impl}: {r.status}" for r in not_run[:8]) + (" ..." if len(not_run) > 8 else ""))
    return "\n".join(lines + ([""] + summary if summary else []))


def render(rows: Iterable[harness.Row]) -> str:
    by_suite: dict[str, list[harness.Row]] = collections.defaultdict(list)
    for row in rows:
        by_suite[row.suite].append(row)
    parts = []
    for suite, suite_rows in by_suite.items():
        first = suite_rows[0]
        parts.append(f"### {suite}\n\n{first.gpu}, torch {first.torch}, triton {first.triton}, "
                     f"commit {first.git_sha}, {first.date}\n\n{suite_table(suite_rows)}\n")
    return "\n".join(parts)


def plot(rows: Sequence[harness.Row], path: str | Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rated = [r for r in rows if r.vs_baseline is not None and r.impl != r.baseline]
    labels = [f"{r.case} {r.impl}" for r in rated]
    fig, ax = plt.subplots(figsize=(8, max(2.0, 0.25 * len(rated) + 1)))
    ax.barh(range(len(rated)), [r.vs_baseline for r in rated],
            color=["tab:green" if r.vs_baseline >= 1 else "tab:red" for r in rated])
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_yticks(range(len(rated)), labels, fontsize=7)
    ax.set_xlabel("speed relative to the case's baseline (baseline time / time)")
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def read_inputs(paths: Sequence[str]) -> tuple[list[tuple[str, list[harness.Row]]], dict | None, str | None]:
    """(path, rows) a CSV, and the one targets JSON (its dict and path) if a ``.json`` is among ``paths``."""
    sources, targets, targets_path = [], None, None
    for path in paths:
        if not Path(path).exists():
            raise FileNotFoundError(f"no such {'JSON' if str(path).endswith('.json') else 'CSV'} file: {path}")
        if str(path).endswith(".json"):
            if targets is not None:
                raise ValueError(f"two targets files ({targets_path}, {path}): give at most one .json")
            targets, targets_path = json.loads(Path(path).read_text()), str(path)
            if not isinstance(targets, dict) or "results" not in targets:
                raise ValueError(f"{path}: not the output of `tilefuse targets --json` (no \"results\" key)")
        else:
            sources.append((str(path), harness.read_csv(path)))
    return sources, targets, targets_path


def main(args) -> int:
    sources, targets, targets_path = read_inputs(args.csv)
    rows = [row for _, part in sources for row in part]
    if args.output and str(args.output).endswith((".html", ".htm")):
        from . import report_html

        Path(args.output).write_text(report_html.render(sources, targets, targets_path, title=args.title))
        print(f"wrote {args.output}")
        if args.plot:
            print(f"wrote {plot(rows, args.plot)}")
        return 0
    text = render(rows)
    if args.output:
        Path(args.output).write_text(text)
        print(f"wrote {args.output}")
    else:
        print(text)
    if args.plot:
        print(f"wrote {plot(rows, args.plot)}")
    return 0
