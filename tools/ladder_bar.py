#!/usr/bin/env python3
"""Issue 4's bar, read from ladder suites: a rung's time against its cuBLAS peer at 4096^3 and 8192^3, suite by
suite, and the median over the suites.

The bar: the best rung >= 1.00x cuBLAS at 4096^3 and at 8192^3 (bf16). One suite's ratio spreads by ~1 % from
the next (docs/decisions/010-ladder-bar.md), so the verdict is the median of several suites of the same build,
each a whole ``tilefuse bench ladder`` run (its own process, builds from the cache after the first).

Summarise committed suites (a suite's CSV, or its log where the CSV did not come back from the device: the log's
time lines carry the same p50 times):

    python3 tools/ladder_bar.py benchmarks/results/run100/ladder.csv benchmarks/results/run101/ladder1.log ...

Run N suites on the GPU machine, then summarise them together with the earlier suites named (of the same build):

    python3 tools/ladder_bar.py --run 4 --out $OUT [--timeout-s 120] [FILE ...]

``--run`` writes ``ladder1.csv`` .. ``ladderN.csv`` and one ``ladder_bar.log`` (every suite's log, then the
summary) at the top of OUT, where the device tool brings files back. A suite cut off or ended before it wrote
its CSV is reported and left out of the median; one whose CSV has an error or wrong row elsewhere (exit 1) counts,
since only its ok rung and cuBLAS rows are read.

Exit status: 0 when the median meets the bar at every shape, 1 when it misses at one, 2 when a shape has fewer
than --min-suites suites (default 5: one suite spreads by ~1 %, about the margin) or on bad arguments.
"""
from __future__ import annotations

import argparse
import csv
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

BAR_SHAPES = ("4096x4096x4096", "8192x8192x8192")
BAR = 1.00
MIN_SUITES = 5  # one suite spreads ~1 % (docs/decisions/010-ladder-bar.md): a median of fewer decides nothing
DTYPE = "bfloat16"
# a time line of a suite's log: "  mm/bfloat16/4096x4096x4096   rung9     0.1976 ms    695.5 TFLOP/s"
LOG_LINE = re.compile(r"^\s*mm/(?P<dtype>\w+)/(?P<shape>\d+x\d+x\d+)\s+(?P<impl>\S+)\s+(?P<ms>[0-9.]+) ms\b")


@dataclass
class Reading:
    source: str     # the file it came from
    shape: str
    rung_ms: float
    peer_ms: float

    @property
    def ratio(self) -> float:
        """Peer time / rung time: above 1 the rung is faster."""
        return self.peer_ms / self.rung_ms


def peer_of(rung: str) -> str:
    """The cuBLAS row the ladder suite times rung ``rung`` against (its ``baseline`` column)."""
    from tilefuse.bench.ladder_suite import baseline
    from tilefuse.cuda import build

    return baseline(build.rung(rung))


def suite_times(path: Path) -> dict[tuple[str, str], float]:
    """{(shape, impl): p50 ms} of the bf16 mm rows of one suite, from its CSV (rows with status ok) or its log."""
    out: dict[tuple[str, str], float] = {}
    if path.suffix == ".csv":
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                if row.get("suite") != "ladder":
                    raise ValueError(f"{path}: not a ladder suite's CSV (a row of suite {row.get('suite')!r})")
                if row["dtype"] == DTYPE and row["case"].startswith("mm/") and row["status"] == "ok":
                    out[(row["shape"], row["impl"])] = float(row["ms_p50"])
    elif path.suffix == ".log":
        with open(path) as f:
            for line in f:
                m = LOG_LINE.match(line)
                if m and m["dtype"] == DTYPE:
                    out[(m["shape"], m["impl"])] = float(m["ms"])
    else:
        raise ValueError(f"{path}: a suite's .csv or .log is accepted, not {path.suffix or 'a file without suffix'}")
    return out


def readings(paths: list[Path], rung: str, shapes=BAR_SHAPES) -> tuple[list[Reading], list[str]]:
    """Every (suite, shape) where both the rung and its peer were timed, and a line for each where not."""
    got, missing, peer = [], [], peer_of(rung)
    for path in paths:
        times = suite_times(path)
        for shape in shapes:
            r, p = times.get((shape, f"rung{rung}")), times.get((shape, peer))
            if r is None or p is None:
                missing.append(f"{path}: {shape}: not run (no timed rung{rung} and {peer} rows)")
            else:
                got.append(Reading(str(path), shape, r, p))
    return got, missing


def verdict(got: list[Reading], shapes=BAR_SHAPES, bar: float = BAR,
            min_suites: int = MIN_SUITES) -> tuple[dict[str, float | None], int]:
    """{shape: median ratio, None where fewer than min_suites suites timed it} and the exit status (0 met at every
    shape, 1 missed at one, 2 a shape without enough suites)."""
    medians: dict[str, float | None] = {}
    for shape in shapes:
        ratios = [g.ratio for g in got if g.shape == shape]
        medians[shape] = statistics.median(ratios) if ratios and len(ratios) >= min_suites else None
    if any(v is None for v in medians.values()):
        return medians, 2
    return medians, 0 if all(v >= bar for v in medians.values()) else 1


def report(paths: list[Path], rung: str, shapes=BAR_SHAPES, min_suites: int = MIN_SUITES) -> tuple[str, int]:
    got, missing = readings(paths, rung, shapes)
    peer = peer_of(rung)
    lines = [f"rung {rung} against {peer} (peer ms / rung ms; above 1 the rung is faster), bar {BAR:.2f}"]
    for g in got:
        lines.append(f"  {g.source}  {g.shape:>16}  rung {g.rung_ms:.4f} ms  {peer} {g.peer_ms:.4f} ms  "
                     f"{g.ratio:.4f}")
    lines += [f"  {m}" for m in missing]
    medians, status = verdict(got, shapes, min_suites=min_suites)
    for shape, med in medians.items():
        ratios = [g.ratio for g in got if g.shape == shape]
        lows = sum(1 for r in ratios if r < BAR)
        if med is None:
            seen = f", median {statistics.median(ratios):.4f} so far" if ratios else ""
            lines.append(f"{shape}: {len(ratios)} suite(s) of the {min_suites} a verdict needs{seen}: no verdict")
        else:
            lines.append(f"{shape}: median {med:.4f} over {len(ratios)} suites, {lows} below {BAR:.2f}: "
                         f"{'met' if med >= BAR else 'NOT met'}")
    return "\n".join(lines), status


def run_suites(n: int, out: Path, timeout_s: float) -> tuple[list[Path], str]:
    """N ladder suites, each ``python3 -m tilefuse bench ladder`` in its own process (the builds cached between
    them): their CSVs copied to OUT/ladderK.csv, their logs returned as one text."""
    scratch = Path(tempfile.mkdtemp(prefix="ladder_bar-"))  # not under OUT: few files come back from the device
    env = dict(os.environ)
    env.setdefault("TILEFUSE_CACHE_DIR", str(scratch / "cache"))
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    csvs, logs = [], []
    for i in range(1, n + 1):
        work = scratch / f"suite{i}"
        work.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        cmd = [sys.executable, "-m", "tilefuse", "bench", "ladder", "--out", str(work)]
        try:
            proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
            text, rc = proc.stdout + proc.stderr, proc.returncode
        except subprocess.TimeoutExpired as exc:
            text = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            text += f"\n== cut off after {timeout_s:g} s: NOT RUN to the end\n"
            rc = 124
        took = time.perf_counter() - start
        logs.append(f"== suite {i}: rc {rc}, {took:.0f} s\n{text}")
        print(f"suite {i}: rc {rc}, {took:.0f} s", flush=True)
        produced = work / "ladder.csv"
        if produced.is_file():  # the suite ran to its end (rc 1 if some other row failed: its rows still count)
            dest = out / f"ladder{i}.csv"
            dest.write_bytes(produced.read_bytes())
            csvs.append(dest)
    return csvs, "\n".join(logs)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="*", type=Path,
                   help="suites to summarise (ladder CSVs, or logs); with --run, earlier suites counted in")
    p.add_argument("--run", type=int, default=0, metavar="N", help="first run N ladder suites here (GPU machine)")
    p.add_argument("--out", type=Path, default=None, help="with --run: where ladderK.csv and ladder_bar.log go")
    p.add_argument("--timeout-s", type=float, default=120.0, help="with --run: a suite's time limit (default 120)")
    p.add_argument("--rung", default="9", help="the rung read against cuBLAS (default 9, the best)")
    p.add_argument("--min-suites", type=int, default=MIN_SUITES,
                   help=f"suites a shape needs for a verdict (default {MIN_SUITES})")
    args = p.parse_args(argv)
    try:
        peer_of(args.rung)
    except ValueError as exc:
        p.error(f"--rung: {exc}")
    if args.min_suites < 1:
        p.error(f"--min-suites {args.min_suites}: 1 or more")
    if args.run < 0:
        p.error(f"--run {args.run}: a number of suites, 1 or more")
    if args.run and args.out is None:
        p.error("--run needs --out DIR")
    if not args.run and args.out is not None:
        p.error("--out goes with --run")
    if not args.run and not args.files:
        p.error("name suites to summarise (CSV or log files), or --run N --out DIR")
    if args.timeout_s <= 0:
        p.error(f"--timeout-s {args.timeout_s:g}: seconds, above 0")
    for f in args.files:
        if not f.is_file():
            p.error(f"{f}: no such file")
        if f.suffix not in (".csv", ".log"):
            p.error(f"{f}: a suite's .csv or .log is accepted")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    paths = list(args.files)
    log = ""
    if args.run:
        args.out.mkdir(parents=True, exist_ok=True)
        csvs, log = run_suites(args.run, args.out, args.timeout_s)
        paths += csvs
        if len(csvs) < args.run:
            log += f"\n== {args.run - len(csvs)} of {args.run} suites did not finish: not counted\n"
    text, status = report(paths, args.rung, min_suites=args.min_suites)
    print(text)
    if args.run:
        (args.out / "ladder_bar.log").write_text(log + "\n== summary\n" + text + "\n")
    return status


if __name__ == "__main__":
    sys.exit(main())
