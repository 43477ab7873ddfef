"""PYTEST_DONT_REWRITE (imported by the test module before pytest could rewrite it; it has no asserts)

The OpInfo coverage report: how many of PyTorch's OpInfo samples the compiler gets right, per op.

Written by tests/compiler/test_compiler_opinfo.py. Each pytest process (each xdist worker, or the one process) writes
its own shard, ``<report>.parts/<run id>/<worker>.json``, when its session ends, then merges every shard of
the run into ``<report>`` under a lock: the last worker to finish leaves the complete report.

Where the report goes, first match: ``--opinfo-report PATH``; ``TILEFUSE_OPINFO_REPORT=PATH``;
``build/opinfo-report.json`` under the repository root.

As a pytest plugin this module also adds the options ``--opinfo-report`` and ``--opinfo-full`` and prints the
summary at the end of the session. test_compiler_opinfo.py loads it (``pytest_plugins``), which is enough in a
single-process run. Under xdist the controlling process never imports test modules, so for the printed summary
(and for the two options) load it at start-up too:

    .venv/bin/python -m pytest tests/compiler/test_compiler_opinfo.py -n 2 -p tests.opinfo_report [--opinfo-full] \
        [--opinfo-report PATH]

(``PYTEST_PLUGINS=tests.opinfo_report`` does the same). Without it the JSON is still written.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import time
import uuid
from pathlib import Path

REPORT_ENV = "TILEFUSE_OPINFO_REPORT"
FULL_ENV = "TILEFUSE_OPINFO_FULL"
DEFAULT_REPORT = Path("build") / "opinfo-report.json"
SUMMARY_WORST = 25  # ops listed by name in the printed summary (those with the most failing samples)

_RUN_ID = os.environ.get("PYTEST_XDIST_TESTRUNUID") or f"single-{uuid.uuid4().hex[:12]}"
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "main")
_SESSION_START = time.time()


# ------------------------------------------------------------------------------------------- options
def pytest_addoption(parser):
    group = parser.getgroup("tilefuse-opinfo", "tilefuse compiler OpInfo coverage")
    group.addoption("--opinfo-report", default=None, metavar="PATH",
                    help=f"where to write the OpInfo coverage JSON (default ${REPORT_ENV} or {DEFAULT_REPORT})")
    group.addoption("--opinfo-full", action="store_true", default=False,
                    help=f"run every OpInfo sample, fp32 + fp16 + int64 (default: a few per op; also ${FULL_ENV}=1)")


def full_mode(config) -> bool:
    return bool(config.getoption("opinfo_full", default=False)) or os.environ.get(FULL_ENV, "") in ("1", "true", "yes")


def report_path(config) -> Path:
    chosen = config.getoption("opinfo_report", default=None) or os.environ.get(REPORT_ENV)
    if chosen:
        return Path(chosen).expanduser().resolve()
    return Path(config.rootpath) / DEFAULT_REPORT


# ----------------------------------------------------------------------------------- shards and merge
@contextlib.contextmanager
def _locked(path: Path):
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(str(path) + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _count(entries: list[dict]) -> dict:
    outcomes = [e["outcome"] for e in entries]
    return {"run": len(outcomes), "passed": outcomes.count("pass"), "failed": outcomes.count("fail"),
            "untested": outcomes.count("untested"), "eager_error": outcomes.count("eager-error")}


def merge(shards: list[dict], meta: dict) -> dict:
    """One report from the shards: per op and dtype, the samples run and their outcomes, and totals."""
    ops: dict[str, dict] = {}
    for shard in shards:
        for key, per_op in shard.get("ops", {}).items():
            entry = ops.setdefault(key, {"category": per_op["category"], "dtypes": {}})
            entry["dtypes"].update(per_op["dtypes"])
    totals = {"ops": len(ops), "ops_all_pass": 0, "samples_run": 0, "passed": 0, "failed": 0, "untested": 0,
              "opinfo_samples_run": 0, "opinfo_samples_passed": 0}
    by_category: dict[str, dict] = {}
    for key, entry in sorted(ops.items()):
        all_pass = True
        for dt, d in entry["dtypes"].items():
            d.update(_count(d["samples"]))
            opinfo = [s for s in d["samples"] if s["source"] == "opinfo" and s["outcome"] in ("pass", "fail")]
            totals["opinfo_samples_run"] += len(opinfo)
            totals["opinfo_samples_passed"] += sum(s["outcome"] == "pass" for s in opinfo)
            for k in ("passed", "failed", "untested"):
                totals[k] += d[k]
            totals["samples_run"] += d["passed"] + d["failed"]
            all_pass &= d["failed"] == 0 and d["passed"] > 0
            cat = by_category.setdefault(entry["category"], {"ops": 0, "samples": 0, "passed": 0})
            cat["samples"] += d["passed"] + d["failed"]
            cat["passed"] += d["passed"]
        entry["all_pass"] = all_pass
        totals["ops_all_pass"] += all_pass
        by_category.setdefault(entry["category"], {"ops": 0, "samples": 0, "passed": 0})["ops"] += 1
    return {**meta, "totals": totals, "by_category": by_category, "ops": dict(sorted(ops.items()))}


def write(config, ops: dict, meta: dict) -> Path:
    """Write this process's shard, then the merged report of every shard of this run so far."""
    path = report_path(config)
    parts = Path(str(path) + ".parts")
    with _locked(path):
        run_dir = parts / _RUN_ID
        run_dir.mkdir(parents=True, exist_ok=True)
        for stale in parts.iterdir():  # shards of earlier runs would be merged into this one
            if stale.is_dir() and stale.name != _RUN_ID:
                for f in stale.glob("*.json"):
                    f.unlink(missing_ok=True)
                with contextlib.suppress(OSError):
                    stale.rmdir()
        (run_dir / f"{_WORKER}.json").write_text(json.dumps({"ops": ops}))
        shards = [json.loads(f.read_text()) for f in sorted(run_dir.glob("*.json"))]
        report = merge(shards, {**meta, "run": _RUN_ID, "shards": len(shards),
                                "written": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")})
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(report, indent=1))
        tmp.replace(path)
    return path


# ----------------------------------------------------------------------------------------- summary
def summarize(report: dict) -> str:
    t = report["totals"]
    lines = [f"tilefuse OpInfo coverage ({report.get('mode', '?')} mode, torch {report.get('torch', '?')}, "
             f"triton {report.get('triton', '?')}):",
             f"  OpInfo samples passing: {t['opinfo_samples_passed']}/{t['opinfo_samples_run']}; "
             f"all samples (with odd-size/non-contiguous extras): {t['passed']}/{t['samples_run']}"
             + (f" ({t['untested']} untested: Dynamo made no graph)" if t["untested"] else ""),
             f"  ops with every sample passing: {t['ops_all_pass']}/{t['ops']}"]
    for cat, c in sorted(report.get("by_category", {}).items()):
        lines.append(f"    {cat:<11} {c['ops']:4d} ops  {c['passed']:5d}/{c['samples']:<5d} samples pass")
    failing = []
    for key, entry in report["ops"].items():
        for dt, d in entry["dtypes"].items():
            if d["failed"]:
                first = next(s for s in d["samples"] if s["outcome"] == "fail")
                failing.append((d["failed"], key, dt, d["passed"], first["why"]))
    failing.sort(key=lambda f: (-f[0], f[1]))
    if failing:
        lines.append(f"  failing (op, dtype, passed/run, first reason), {len(failing)} in all:")
        for n, key, dt, passed, why in failing[:SUMMARY_WORST]:
            lines.append(f"    {key} {dt}: {passed}/{passed + n}: {why[:160]}")
        if len(failing) > SUMMARY_WORST:
            lines.append(f"    ... {len(failing) - SUMMARY_WORST} more in the JSON")
    return "\n".join(lines)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    path = report_path(config)
    try:
        if path.stat().st_mtime < _SESSION_START - 1:
            return  # not written by this session (the OpInfo tests did not run)
        report = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    terminalreporter.write_sep("=", "tilefuse OpInfo coverage")
    terminalreporter.write_line(summarize(report))
    terminalreporter.write_line(f"  report: {path}")
