"""Timing and tidy CSV rows, shared by every benchmark suite.

Rules (DESIGN.md): time on the GPU with ``triton.testing.do_bench`` (median, with warm-up), inputs rotated
so they do not sit in L2, random normal data, and the peer timed in the same process on the same inputs.
A case that could not run is written as a row whose ``status`` says why, never dropped.
"""
from __future__ import annotations

import csv
import dataclasses
import datetime as _dt
import functools
import math
import subprocess
import traceback
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

FIELDS = ["suite", "case", "impl", "dtype", "shape", "ms_p50", "tflops", "gbps", "vs_baseline", "baseline",
          "pct_ceiling", "ms_p20", "ms_p80", "status", "note", "gpu", "torch", "triton", "git_sha", "date"]

ROTATE_L2_FACTOR = 3  # rotate through enough input sets to cover 3x the L2, so no set is still cached
ROTATE_MAX_SETS = 8  # and no more than this many (memory): do_bench also clears L2 between repeats


@dataclasses.dataclass
class Row:
    suite: str
    case: str
    impl: str
    dtype: str
    shape: str
    ms_p50: float | None = None
    tflops: float | None = None
    gbps: float | None = None
    vs_baseline: float | None = None
    baseline: str = ""
    pct_ceiling: float | None = None  # of the measured matmul ceiling (compute-bound) or copy bandwidth
    ms_p20: float | None = None
    ms_p80: float | None = None
    status: str = "ok"  # "ok", "not run: <why>", "error: <what>", "wrong: <error norm>"
    note: str = ""
    gpu: str = ""
    torch: str = ""
    triton: str = ""
    git_sha: str = ""
    date: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.ms_p50 is not None


@functools.lru_cache(maxsize=1)
def _git_sha() -> str:
    """HEAD of the checkout holding this file (+dirty with uncommitted changes), or "" without git."""
    here = Path(__file__).resolve().parent
    try:
        sha = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True,
                             cwd=here, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, cwd=here, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return sha + ("+dirty" if dirty and sha else "")


def environment() -> dict[str, str]:
    import torch
    import triton

    from .. import config, device

    # an explicit TILEFUSE_GIT_SHA wins: a snapshot (git archive) unpacked inside another checkout would
    # otherwise record that checkout's HEAD (a snapshot's rows once recorded the enclosing checkout's sha +dirty)
    sha = config.get().git_sha or _git_sha()
    return {"gpu": device.current().name, "torch": torch.__version__, "triton": triton.__version__,
            "git_sha": sha or "unknown", "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d")}


SMOKE_REPEATS = 3  # a smoke run (interpreter, no GPU) only proves the suite's code path runs


def bench(fn: Callable[[], Any], *, warmup_ms: int = 25, rep_ms: int = 100, smoke: bool = False
          ) -> tuple[float, float, float]:
    """(median, 20th, 80th percentile) milliseconds of ``fn``: on the GPU with ``do_bench`` (CUDA events,
    warm-up, L2 cleared between repeats); in a smoke run, a few wall-clock calls."""
    if smoke:
        import statistics
        import time

        fn()
        times = []
        for _ in range(SMOKE_REPEATS):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
        return statistics.median(times), min(times), max(times)
    from triton.testing import do_bench

    p50, p20, p80 = do_bench(fn, warmup=warmup_ms, rep=rep_ms, quantiles=[0.5, 0.2, 0.8])
    return float(p50), float(p20), float(p80)


def flushed_call_ms(fn: Callable[[], Any], flush: Callable[[], Any]) -> float:
    """Device milliseconds of one call of ``fn`` (CUDA events) right after ``flush()``, for timing under an L2
    state of the caller's choosing (``do_bench`` always zeroes a 256 MB buffer first, which leaves L2 dirty)."""
    import torch

    flush()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def interleaved_medians(entries: Sequence[tuple[str, Callable[[], Any]]], rounds: int, rep_ms: int,
                        warmup_ms: int = 5) -> dict[str, list[float]]:
    """Each entry's ``do_bench`` medians over ``rounds`` rounds, the order rotated by one each round (A B C,
    B C A, ...), so a drift of the GPU's clocks lands on every entry alike (as :meth:`Recorder.time_interleaved`
    does for the suites' rows). ``rep_ms`` a do_bench each."""
    from triton.testing import do_bench

    samples: dict[str, list[float]] = {name: [] for name, _ in entries}
    for r in range(rounds):
        k = r % len(entries) if entries else 0
        for name, fn in list(entries[k:]) + list(entries[:k]):
            samples[name].append(do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))
    return samples


def rotation_sets(bytes_per_set: int, l2_bytes: int, budget_bytes: int = 8 << 30) -> int:
    """How many input sets to rotate through so that the working set is several times the L2."""
    want = math.ceil(ROTATE_L2_FACTOR * max(l2_bytes, 1) / max(bytes_per_set, 1))
    fit = max(1, budget_bytes // max(bytes_per_set, 1))
    return int(max(1, min(want, ROTATE_MAX_SETS, fit)))


class Rotating:
    """Calls ``fn(*inputs[i])`` with i cycling, so successive timed calls touch different memory."""

    def __init__(self, fn: Callable[..., Any], input_sets: Sequence[Sequence[Any]]):
        self.fn, self.sets, self.i = fn, list(input_sets), 0

    def __call__(self):
        inputs = self.sets[self.i]
        self.i = (self.i + 1) % len(self.sets)
        return self.fn(*inputs)


# When set (``tilefuse bench`` sets ``<out>/<suite>.partial.csv``), every row is also appended here as it is
# recorded, so a suite cut off by a time limit still leaves what it measured (without the vs_baseline column,
# which is filled in at the end).
PARTIAL_PATH: Path | None = None


class Recorder:
    """Collects the rows of one suite; computes ``vs_baseline`` against the baseline impl of each case."""

    def __init__(self, suite: str, *, ceiling_tflops: float | None = None, ceiling_gbps: float | None = None,
                 warmup_ms: int = 25, rep_ms: int = 100, smoke: bool = False,
                 log: Callable[[str], None] = print):
        self.suite, self.rows, self.smoke = suite, [], smoke
        self.ceiling_tflops, self.ceiling_gbps = ceiling_tflops, ceiling_gbps
        self.warmup_ms, self.rep_ms, self.log = warmup_ms, rep_ms, log

    def _row(self, case, impl, dtype, shape, **kw) -> Row:
        if self.smoke:
            kw["note"] = ("interpreter smoke run, times mean nothing; " + kw.get("note", "")).rstrip("; ")
        row = Row(self.suite, case, impl, str(dtype).replace("torch.", ""), str(shape), **kw, **environment())
        self.rows.append(row)
        if PARTIAL_PATH is not None:
            write_csv([row], PARTIAL_PATH, append=True)
        return row

    def time(self, case: str, impl: str, fn: Callable[[], Any], *, dtype: Any, shape: Any,
             flops: float | None = None, bytes_moved: float | None = None, baseline: str = "",
             check: Callable[[], str | None] | None = None, note: str = "") -> Row:
        """Time ``fn``; ``check()`` (run first) returns None if the output is right, else what is wrong."""
        try:
            if check is not None:
                wrong = check()
                if wrong:
                    row = self._row(case, impl, dtype, shape, status=f"wrong: {wrong}", baseline=baseline, note=note)
                    self.log(f"  {case:<28} {impl:<20} WRONG {wrong}")
                    return row
            p50, p20, p80 = bench(fn, warmup_ms=self.warmup_ms, rep_ms=self.rep_ms, smoke=self.smoke)
        except Exception as exc:  # one failing impl must not end the suite; the row says what happened
            return self._error_row(case, impl, dtype, shape, exc, dict(baseline=baseline, note=note))
        return self._timed_row(case, impl, dtype, shape, p50, p20, p80,
                               dict(flops=flops, bytes_moved=bytes_moved, baseline=baseline, note=note))

    def time_interleaved(self, case: str, entries: Sequence[tuple[str, Callable[[], Any], dict]], *,
                         dtype: Any, shape: Any, rounds: int = 4) -> list[Row]:
        """Time several impls of one case in ``rounds`` alternating rounds (order rotated each round: A B, B A,
        A B, B A for two), each round a ``do_bench`` of ``rep_ms / rounds``: a drift of the GPU's clocks over
        the case (an H200 at its power limit) then lands on every impl alike instead of on whichever ran last. ``entries``: (impl, fn,
        keywords of :meth:`time` except dtype/shape). p50 = the median of the rounds' medians; p20/p80 = the
        lowest p20 and highest p80 of the rounds. A smoke run, or one round, is :meth:`time` per impl."""
        if self.smoke or rounds <= 1:
            return [self.time(case, impl, fn, dtype=dtype, shape=shape, **kw) for impl, fn, kw in entries]
        import statistics

        samples: dict[str, list[tuple[float, float, float]]] = {}
        failed: dict[str, Row] = {}
        for impl, fn, kw in entries:
            check = kw.get("check")
            try:
                wrong = check() if check is not None else None
            except Exception as exc:
                wrong = None
                failed[impl] = self._error_row(case, impl, dtype, shape, exc, kw)
                continue
            if wrong:
                self.log(f"  {case:<28} {impl:<20} WRONG {wrong}")
                failed[impl] = self._row(case, impl, dtype, shape, status=f"wrong: {wrong}",
                                         baseline=kw.get("baseline", ""), note=kw.get("note", ""))
        live = [e for e in entries if e[0] not in failed]
        rep = max(1, self.rep_ms // rounds)
        for r in range(rounds):
            for impl, fn, kw in live[r % len(live):] + live[:r % len(live)] if live else []:
                if impl in failed:
                    continue
                try:
                    samples.setdefault(impl, []).append(bench(fn, warmup_ms=self.warmup_ms, rep_ms=rep))
                except Exception as exc:
                    failed[impl] = self._error_row(case, impl, dtype, shape, exc, kw)
        rows = []
        for impl, fn, kw in entries:
            if impl in failed:
                rows.append(failed[impl])
                continue
            got = samples[impl]
            p50 = statistics.median(t[0] for t in got)
            p20, p80 = min(t[1] for t in got), max(t[2] for t in got)
            rows.append(self._timed_row(case, impl, dtype, shape, p50, p20, p80, kw))
        return rows

    def _error_row(self, case, impl, dtype, shape, exc: Exception, kw: dict) -> Row:
        msg = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"[:300]
        self.log(f"  {case:<28} {impl:<20} ERROR {msg}")
        self.log("".join(traceback.format_exception(exc)[-3:]))
        return self._row(case, impl, dtype, shape, status=f"error: {msg}", baseline=kw.get("baseline", ""),
                         note=kw.get("note", ""))

    def _timed_row(self, case, impl, dtype, shape, p50, p20, p80, kw: dict) -> Row:
        flops, bytes_moved = kw.get("flops"), kw.get("bytes_moved")
        tflops = flops / (p50 * 1e-3) / 1e12 if flops else None
        gbps = bytes_moved / (p50 * 1e-3) / 1e9 if bytes_moved else None
        pct = None
        if tflops is not None and self.ceiling_tflops:
            pct = 100 * tflops / self.ceiling_tflops
        elif gbps is not None and self.ceiling_gbps:
            pct = 100 * gbps / self.ceiling_gbps
        row = self._row(case, impl, dtype, shape, ms_p50=p50, ms_p20=p20, ms_p80=p80, tflops=tflops, gbps=gbps,
                        pct_ceiling=pct, baseline=kw.get("baseline", ""), note=kw.get("note", ""))
        rate = f"{tflops:8.1f} TFLOP/s" if tflops is not None else (f"{gbps:8.1f} GB/s" if gbps is not None else "")
        self.log(f"  {case:<28} {impl:<20} {p50:9.4f} ms {rate}")
        return row

    def skip(self, case: str, impl: str, reason: str, *, dtype: Any = "", shape: Any = "") -> Row:
        self.log(f"  {case:<28} {impl:<20} not run: {reason}")
        return self._row(case, impl, dtype, shape, status=f"not run: {reason}")

    def finish(self) -> list[Row]:
        """Fill ``vs_baseline`` = baseline time / this time, the baseline being the row of the same case
        (and dtype) whose impl is named in ``row.baseline``."""
        for row in self.rows:
            if not row.baseline or not row.ok:
                continue
            peer = next((r for r in self.rows if r.case == row.case and r.dtype == row.dtype
                         and r.impl == row.baseline and r.ok), None)
            if peer is not None:
                row.vs_baseline = peer.ms_p50 / row.ms_p50
        return self.rows


def _fmt(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def write_csv(rows: Iterable[Row], path: str | Path, append: bool = False) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    new = not (append and path.exists() and path.stat().st_size > 0)
    with open(path, "a" if append else "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        if new:
            writer.writeheader()
        for row in rows:
            writer.writerow({k: _fmt(v) for k, v in dataclasses.asdict(row).items()})
    return path


def read_csv(path: str | Path) -> list[Row]:
    rows = []
    with open(path, newline="") as f:
        for raw in csv.DictReader(f):
            values: dict[str, Any] = {}
            for field in dataclasses.fields(Row):
                text = raw.get(field.name, "")
                if field.type in ("float | None",):
                    values[field.name] = float(text) if text not in ("", None) else None
                else:
                    values[field.name] = text or ""
            rows.append(Row(**values))
    return rows


def geomean(values: Iterable[float]) -> float | None:
    values = [v for v in values if v and v > 0]
    if not values:
        return None
    return math.exp(sum(math.log(v) for v in values) / len(values))


def rel_error(out, ref) -> float:
    """||out - ref|| / ||ref|| in float32 (||out - ref|| where ref is all zeros), inf where out holds a NaN or an
    inf: how the suites and sweeps check a result against its reference before they time it."""
    out, ref = out.float(), ref.float()
    if not bool(out.isfinite().all()):
        return float("inf")
    return (out - ref).norm().item() / (ref.norm().item() or 1.0)


# ----------------------------------------------------------------------------------------- time limits
class TimeLimitExceeded(BaseException):
    """A :class:`Deadline` ran out. A ``BaseException``, as ``KeyboardInterrupt`` is: Dynamo wraps an
    ``Exception`` raised while it compiles, and a backend that falls back to eager on an error would swallow one,
    so the watchdog could not stop a slow compile."""

    def __init__(self, seconds: float, phase: str):
        super().__init__(f"exceeded {seconds:g} s in phase {phase}")
        self.seconds, self.phase = seconds, phase


REARM_S = 0.25  # a time limit's signal repeats this often until its exception reaches the phase


class Deadline:
    """A wall-clock budget shared by the phases of one row (compile, accuracy, timing, ...): the time spent
    inside its phases counts, not the time other rows' phases take in between (the models suite interleaves
    its backends' timing rounds).

    ``with deadline.phase("compile-cold"):`` checks the budget before the phase and, in the main thread, arms a
    ``SIGALRM`` timer for what is left, whose handler raises :class:`TimeLimitExceeded` inside the phase: a
    check between phases alone cannot stop one compile that runs for minutes. ``phases`` holds each phase's
    wall seconds. ``seconds=None``: no limit (the phases are still timed). ``wall=True``: all wall time from now
    counts (a whole suite's budget, read with :meth:`remaining`; such a budget is never armed)."""

    def __init__(self, seconds: float | None, *, wall: bool = False):
        import time

        self.seconds = seconds if seconds and seconds > 0 else None
        self.phases: dict[str, float] = {}
        self._since: float | None = time.perf_counter() if wall else None  # start of the phase under way
        self.wall = wall

    def spent(self) -> float:
        import time

        now = time.perf_counter()
        return sum(self.phases.values()) + (now - self._since if self._since is not None else 0.0)

    def remaining(self) -> float | None:
        return None if self.seconds is None else self.seconds - self.spent()

    def check(self, phase: str) -> None:
        left = self.remaining()
        if left is not None and left <= 0:
            raise TimeLimitExceeded(self.seconds, phase)

    def phase(self, name: str):
        import contextlib
        import signal
        import threading
        import time

        if self.wall:
            raise TypeError("Deadline(wall=True) is a budget to read with remaining(), not to arm with phase()")

        @contextlib.contextmanager
        def guarded():
            self.check(name)
            left = self.remaining()
            armed = left is not None and threading.current_thread() is threading.main_thread() \
                and hasattr(signal, "setitimer")
            previous = None
            if armed:
                def expire(signum, frame):
                    # raised inside a finaliser or a weakref callback, the exception is printed and dropped
                    # ("unraisable"): fire again shortly until it lands in the phase's own code
                    signal.setitimer(signal.ITIMER_REAL, REARM_S)
                    raise TimeLimitExceeded(self.seconds, name)

                previous = signal.signal(signal.SIGALRM, expire)
                signal.setitimer(signal.ITIMER_REAL, max(left, 1e-3))
            self._since = time.perf_counter()
            try:
                yield
            finally:
                if armed:
                    signal.setitimer(signal.ITIMER_REAL, 0)
                    signal.signal(signal.SIGALRM, previous)
                self.phases[name] = self.phases.get(name, 0.0) + time.perf_counter() - self._since
                self._since = None
        return guarded()
