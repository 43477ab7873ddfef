#!/usr/bin/env python3
"""Rung 9 (and 7, 8) against cuBLAS at the issue's sizes, with every run-time setting rung 9 exposes.

Issue 4: the ladder's best rung must reach >= 1.00x cuBLAS at 4096^3 and 8192^3 bf16 on the H200. Device run 3
measured rung 9 at 0.52x at 4096^3 but 0.95x at 8192^3 and 1.04x at 16384x4096x4096; this script tells the
causes apart (docs/lab-log.md, "Notebook: the CUDA C++ ladder", has the predictions it tests):

* host time: every impl is timed three ways. ``ms`` is triton's do_bench (L2 flushed before each call, as
  ``tilefuse bench ladder`` does), ``graph_ms`` replays the calls from a CUDA graph (no host time at all; L2
  not flushed between calls), ``host_us`` is the host time of one call (enqueue only). A do_bench time well
  above graph_ms with host_us above ~80 us (do_bench's flush hides that much) is a host-bound number.
* ``tilefuse.cuda.gemm`` (what the ladder suite times: argument checks, the build lookup, the launcher) against
  the launcher called directly through ctypes with a preallocated C (``.direct``);
* rung 9's settings: debug flags (1 no multicast, 2 not persistent, 4 direct stores) and the run-time
  schedule (``tilefuse_rung9_set_schedule``: clusters in the persistent grid, GROUP_M, tile order, cluster
  size 1 or 2), the ping-pong consumers (``tilefuse_rung9_set_pingpong``: each consumer warpgroup its own
  64x256 tile, one's epilogue under the other's mainloop; opt-in until measured), the per-warp C stores
  (``tilefuse_rung9_set_stores``: no warpgroup barrier in the epilogue), stream-K (``tilefuse_rung9_set_streamk``,
  on by default: the ``no-streamk`` setting turns it off), the balanced last round (``tilefuse_rung9_set_balance``,
  on by default where stream-K does not split: ``no-balance``), the L2 policies of its TMA loads and stores
  (``tilefuse_rung9_set_l2``: evict-first on C's stores by default; the ``l2-*`` settings), plus the occupancy facts they depend on
  (cudaOccupancyMaxActiveClusters, tiles, rounds).
* ``--ab SETTING[,SETTING...]``: instead of the sweep, rung 9's default against one or more settings in
  interleaved rounds (cuBLAS, then default and the settings in an order that rotates each round), for a
  difference smaller than the clock's drift between two sequential timings (the H200 runs at its power limit in
  these GEMMs). ``--flush read`` times them after a flush that only reads (a clean L2) instead of do_bench's
  zeroing one (an L2 full of dirty lines, as the ladder suite times).

Every impl's output is checked against a float32 reference (output poisoned with NaN first) before it is
timed. Rung 9's non-default settings are first run in a child process on a small ragged problem: a setting
that traps (a deadlock ends in a trap after 5 s and kills the process's CUDA context) or is wrong is dropped
there, so the sweep itself goes on. A watchdog ends the whole run after --budget-s.

GPU machine:   python3 tools/ladder_sweep.py            (PYTHONPATH = the checkout; ~30-45 s, builds cached)
               python3 tools/ladder_sweep.py --ab no-streamk[,l2-c-first] [--rounds 8] [--shapes ...]
                   [--flush write|read] [--csv PATH]
CPU (no GPU):  python3 tools/ladder_sweep.py --list | --build-only
"""
from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import datetime as _dt
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SHAPES = {"4096": (4096, 4096, 4096), "8192": (8192, 8192, 8192), "16384x4096": (16384, 4096, 4096)}
DEFAULT_SHAPES = "4096,8192,16384x4096"
PROBE_SHAPE = (1800, 2312, 328)   # 8 x 10 cluster tiles (15 x 10 for clusters of one), ragged in M, N and K
CHECK_TOLERANCE = 1e-2            # relative Frobenius error; bf16 rounding of a K-long dot is ~3e-3
PROBE_TIMEOUT_S = 45              # one child: torch import + CUDA init (~5 s) + ~14 small GEMMs (+5 s per trap)
PROBE_RELAUNCHES = 2              # after a crash, the settings not yet probed get another child, at most twice
DEFAULT_BUDGET_S = 120            # the watchdog: the whole run, builds included (expected: 40-70 s)
WARMUP_MS, REP_MS = 10, 50        # do_bench per impl (~57 impls at 3 shapes)
GRAPH_CALLS, GRAPH_REPLAYS = 10, 3
HOST_CALLS = 30
AB_ROUNDS, AB_REP_MS = 8, 10      # --ab: rounds, and do_bench's rep per impl and round
DEFAULT_L2 = (0, 0, 1)            # rung 9's default L2 policies (A, B, C): evict-normal, evict-normal, evict-first
FLUSH_BYTES = 256 * 1024 * 1024   # --flush read: the buffer read before each call (do_bench zeroes 256 MB)
DEBUG_NO_MULTICAST, DEBUG_NOT_PERSISTENT, DEBUG_DIRECT_STORE = 1, 2, 4


@dataclasses.dataclass(frozen=True)
class Setting:
    """One rung-9 configuration: debug flags, tilefuse_rung9_set_schedule(clusters, group_m, order,
    cluster_size) (0 = the default of a field), tilefuse_rung9_set_pingpong(pingpong),
    tilefuse_rung9_set_stores(warp_stores), tilefuse_rung9_set_streamk(streamk) (1, the library's default: the
    last round's tiles split by k-tiles where that pays), tilefuse_rung9_set_balance(balance) (1, the default: where
    stream-K does not split, narrow 240-column tiles even out the last round) and tilefuse_rung9_set_l2(*l2) (A's, B's and C's L2
    policy: 0 evict-normal, 1 evict-first, 2 evict-last; the library's default DEFAULT_L2)."""
    name: str
    debug: int = 0
    clusters: int = 0
    group_m: int = 0
    order: int = 0
    cluster_size: int = 0
    pingpong: int = 0
    warp_stores: int = 0
    streamk: int = 1
    balance: int = 1
    l2: tuple[int, int, int] = (0, 0, 1)   # DEFAULT_L2 (defined below the class)
    why: str = ""

    @property
    def schedule(self) -> tuple[int, int, int, int]:
        return (self.clusters, self.group_m, self.order, self.cluster_size)

    @property
    def is_default(self) -> bool:
        return (self.debug == 0 and self.schedule == (0, 0, 0, 0) and self.pingpong == 0 and self.warp_stores == 0
                and self.streamk == 1 and self.balance == 1 and self.l2 == DEFAULT_L2)


# Run 7 (benchmarks/results/run7/ladder_sweep.log) decided, and dropped from here: clusters-60 (66 clusters are
# resident: 60 were 8-20 % slower), not-persistent, cluster-1-128, group-2, group-16, column-groups-2 (slower
# everywhere or within noise of a setting kept). Kept: those that won or tied at one shape at least, as controls.
SETTINGS = (
    Setting("default", why="66 clusters of 2 (if resident), GROUP_M 8, row groups, multicast, TMA store, stream-K tail"),
    Setting("no-streamk", streamk=0, why="no stream-K split: the last round balanced with narrow tiles instead"),
    Setting("no-balance", balance=0, why="the last round's tiles whole where stream-K does not split (before run 99)"),
    Setting("no-streamk-no-balance", streamk=0, balance=0, why="the last round's tiles whole (runs 7-40)"),
    Setting("warp-stores", warp_stores=1, why="each warp stores its own C rows: no warpgroup barrier in the epilogue"),
    Setting("pingpong", pingpong=1, why="each consumer its own 64x256 tile; one's epilogue under the other's MMA"),
    Setting("pingpong-group-16", pingpong=1, group_m=16, why="ping-pong, 16 cluster-rows of 128: default's A span"),
    Setting("pingpong-column-groups-8", pingpong=1, group_m=8, order=1, why="ping-pong, groups of 8 tile-columns"),
    Setting("pingpong-cluster-1", pingpong=1, cluster_size=1, why="ping-pong without a cluster (no multicast)"),
    Setting("no-multicast", debug=DEBUG_NO_MULTICAST, why="each CTA loads its whole B tile (L2->SM +50%)"),
    Setting("direct-store", debug=DEBUG_DIRECT_STORE, why="register stores instead of the TMA-store epilogue"),
    Setting("cluster-1", cluster_size=1, why="no cluster: 132 independent CTAs, no lockstep with a peer"),
    Setting("clusters-64", clusters=64, why="256 cluster tiles = exactly 4 rounds of 64"),
    Setting("group-1", group_m=1, why="plain row-major tile order (no L2 grouping)"),
    Setting("group-4", group_m=4),
    Setting("column-groups-8", group_m=8, order=1, why="groups of 8 tile-columns, row-major inside"),
    # L2 policies (A, B, C; 0 normal, 1 first, 2 last). Runs 79-80: evict-first on C gained 0.6 % at 4096^3 in both
    # (the default since); evict-last on A and B gained in one run and lost in the other; evict-first on A alone or
    # B alone lost at 4096^3 and gained nowhere (dropped).
    Setting("l2-normal", l2=(0, 0, 0), why="every TMA access at normal priority (as without a hint: up to run 80)"),
    Setting("l2-ab-last", l2=(2, 2, 1), why="A's and B's loads evict-last too: their panels outlive other lines"),
    Setting("l2-a-last", l2=(2, 0, 1), why="A's loads evict-last too"),
    Setting("l2-b-last", l2=(0, 2, 1), why="B's loads evict-last too"),
)
BY_NAME = {s.name: s for s in SETTINGS}


# ---------------------------------------------------------------------------------------------- watchdog
class Watchdog:
    """Ends the process (exit 124) when the budget is spent, whatever the main thread is blocked in."""

    def __init__(self, budget_s: float):
        self.deadline = time.monotonic() + budget_s
        self.step = "start"
        self.child: subprocess.Popen | None = None
        threading.Thread(target=self._run, daemon=True).start()

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def _run(self) -> None:
        while self.left() > 0:
            time.sleep(0.5)
        print(f"\nWATCHDOG: the budget is spent, stuck in: {self.step}; exiting", flush=True)
        if self.child is not None and self.child.poll() is None:
            self.child.kill()
        os._exit(124)


def log(msg: str = "") -> None:
    print(msg, flush=True)


# ------------------------------------------------------------------------------------------------ builds
def build_rungs(names=("7", "8", "9")):
    """The Hopper rungs' libraries for sm_90a, in parallel (cached on disk by build.py): name -> Build or error."""
    from tilefuse.cuda import build

    reqs = [(build.rung(n), "sm_90a") for n in names]
    start = time.perf_counter()
    out = dict(zip(names, build.build_many(reqs)))
    fresh = [n for n, b in out.items() if isinstance(b, build.Build) and not b.cached]
    log(f"builds: rungs {', '.join(names)} for sm_90a in {time.perf_counter() - start:.1f} s "
        f"(built: {', '.join(fresh) or 'none'}; the rest from the cache)")
    for n, b in out.items():
        if isinstance(b, Exception):
            log(f"  rung {n}: BUILD FAILED: {str(b)[:2000]}")
        else:
            k = b.kernels[0] if b.kernels else None
            log(f"  rung {n}: {b.library}" + (f"  [{k}]" if k is not None else ""))
    return out


def rung9_abi(lib):
    """Declare rung 9's extra entry points (not part of the ladder ABI) on its ctypes library."""
    lib.tilefuse_rung9_set_debug.restype = ctypes.c_int
    lib.tilefuse_rung9_set_debug.argtypes = [ctypes.c_int]
    lib.tilefuse_rung9_set_schedule.restype = ctypes.c_int
    lib.tilefuse_rung9_set_schedule.argtypes = [ctypes.c_int] * 4
    lib.tilefuse_rung9_get_schedule.restype = ctypes.c_int
    lib.tilefuse_rung9_get_schedule.argtypes = [ctypes.POINTER(ctypes.c_int)]
    lib.tilefuse_rung9_set_pingpong.restype = ctypes.c_int
    lib.tilefuse_rung9_set_pingpong.argtypes = [ctypes.c_int]
    lib.tilefuse_rung9_get_pingpong.restype = ctypes.c_int
    lib.tilefuse_rung9_get_pingpong.argtypes = []
    lib.tilefuse_rung9_set_stores.restype = ctypes.c_int
    lib.tilefuse_rung9_set_stores.argtypes = [ctypes.c_int]
    lib.tilefuse_rung9_get_stores.restype = ctypes.c_int
    lib.tilefuse_rung9_get_stores.argtypes = []
    lib.tilefuse_rung9_set_streamk.restype = ctypes.c_int
    lib.tilefuse_rung9_set_streamk.argtypes = [ctypes.c_int]
    lib.tilefuse_rung9_get_streamk.restype = ctypes.c_int
    lib.tilefuse_rung9_get_streamk.argtypes = []
    lib.tilefuse_rung9_set_balance.restype = ctypes.c_int
    lib.tilefuse_rung9_set_balance.argtypes = [ctypes.c_int]
    lib.tilefuse_rung9_get_balance.restype = ctypes.c_int
    lib.tilefuse_rung9_get_balance.argtypes = []
    lib.tilefuse_rung9_set_l2.restype = ctypes.c_int
    lib.tilefuse_rung9_set_l2.argtypes = [ctypes.c_int] * 3
    lib.tilefuse_rung9_get_l2.restype = ctypes.c_int
    lib.tilefuse_rung9_get_l2.argtypes = [ctypes.POINTER(ctypes.c_int)]
    lib.tilefuse_rung9_occupancy.restype = ctypes.c_int
    lib.tilefuse_rung9_occupancy.argtypes = [ctypes.c_int] + [ctypes.POINTER(ctypes.c_int)] * 4
    return lib


@contextlib.contextmanager
def applied(lib, s: Setting):
    """Rung 9's library state set to ``s`` for the block, the defaults after it (whatever happens)."""
    err = lib.tilefuse_rung9_set_schedule(*s.schedule)
    if err != 0:
        raise ValueError(f"tilefuse_rung9_set_schedule{s.schedule} returned {err}")
    err = lib.tilefuse_rung9_set_pingpong(s.pingpong)
    if err == 0:
        err = lib.tilefuse_rung9_set_stores(s.warp_stores)
    if err == 0:
        err = lib.tilefuse_rung9_set_streamk(s.streamk)
    if err == 0:
        err = lib.tilefuse_rung9_set_balance(s.balance)
    if err == 0:
        err = lib.tilefuse_rung9_set_l2(*s.l2)
    if err != 0:
        lib.tilefuse_rung9_set_schedule(0, 0, 0, 0)
        lib.tilefuse_rung9_set_pingpong(0)
        lib.tilefuse_rung9_set_stores(0)
        lib.tilefuse_rung9_set_streamk(1)
        lib.tilefuse_rung9_set_balance(1)
        lib.tilefuse_rung9_set_l2(*DEFAULT_L2)
        raise ValueError(f"tilefuse_rung9_set_pingpong({s.pingpong}) / set_stores({s.warp_stores}) / "
                         f"set_streamk({s.streamk}) / set_balance({s.balance}) / set_l2{s.l2} returned {err}")
    old = lib.tilefuse_rung9_set_debug(s.debug)
    try:
        yield
    finally:
        lib.tilefuse_rung9_set_debug(old)
        lib.tilefuse_rung9_set_l2(*DEFAULT_L2)
        lib.tilefuse_rung9_set_streamk(1)
        lib.tilefuse_rung9_set_balance(1)
        lib.tilefuse_rung9_set_stores(0)
        lib.tilefuse_rung9_set_pingpong(0)
        lib.tilefuse_rung9_set_schedule(0, 0, 0, 0)


def occupancy(lib, cluster_size: int) -> dict:
    vals = [ctypes.c_int() for _ in range(4)]
    err = lib.tilefuse_rung9_occupancy(cluster_size, *[ctypes.byref(v) for v in vals])
    if err != 0:
        return {"error": err}
    return dict(zip(("max_active_clusters", "sms", "smem_bytes", "threads"), (v.value for v in vals)))


# --------------------------------------------------------------------------------------------- the probe
def probe_child(names: list[str]) -> int:
    """Child process: each setting on PROBE_SHAPE (both epilogue paths) against a float32 reference. Prints
    START/OK/WRONG/ERROR lines as it goes, so the parent knows which one a crash happened in."""
    import torch
    from tilefuse.bench import harness
    from tilefuse.cuda import build, launch

    rl = launch.load(build.build(build.rung(9), "sm_90a"))
    lib = rung9_abi(rl.lib)
    m, n, k = PROBE_SHAPE
    torch.manual_seed(0)
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    ref0 = a.float() @ w.float().t()
    stream = torch.cuda.current_stream().cuda_stream
    for name in names:
        s = BY_NAME[name]
        print(f"START {name}", flush=True)
        try:
            errs = []
            with applied(lib, s):
                for epilogue in (0, 1):
                    c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
                    rl(a.data_ptr(), w.data_ptr(), c.data_ptr(), bias.data_ptr() if epilogue else None, m, n, k,
                       k, k, n, "bfloat16", epilogue, stream)
                    torch.cuda.synchronize()
                    errs.append(harness.rel_error(c, ref0 + bias.float() if epilogue else ref0))
            bad = max(errs)
            print(f"{'OK' if bad <= CHECK_TOLERANCE else 'WRONG'} {name} {bad:.3g}", flush=True)
        except Exception as exc:  # a launcher error: the context may still be fine
            print(f"ERROR {name} {type(exc).__name__}: {str(exc).splitlines()[0][:200]}", flush=True)
            try:
                torch.cuda.synchronize()
            except Exception:
                return 3  # the context is gone: the parent relaunches for the rest
    return 0


def run_probe(names: list[str], dog: Watchdog) -> dict[str, str]:
    """name -> "ok" or what went wrong, from child processes (relaunched after a crash for the rest)."""
    verdict: dict[str, str] = {}
    todo = list(names)
    for attempt in range(1 + PROBE_RELAUNCHES):
        if not todo:
            break
        timeout = min(PROBE_TIMEOUT_S, max(5.0, dog.left() - 30))
        cmd = [sys.executable, str(Path(__file__).resolve()), "--probe-child", ",".join(todo)]
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])})
        dog.child = proc
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
        reader.start()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        reader.join(timeout=5)
        dog.child = None
        current = None
        for line in lines:
            parts = line.split(maxsplit=2)
            if len(parts) >= 2 and parts[1] in BY_NAME:
                if parts[0] == "START":
                    current = parts[1]
                elif parts[0] == "OK":
                    verdict[parts[1]] = "ok"
                    current = None
                elif parts[0] in ("WRONG", "ERROR"):
                    verdict[parts[1]] = f"{parts[0].lower()}: {parts[2].strip() if len(parts) > 2 else ''}"
                    current = None
        if current is not None:
            tail = " | ".join(ln.strip() for ln in lines[-3:])[:300]
            verdict[current] = f"crashed the probe process (rc {proc.returncode}): {tail}"
        elif proc.returncode not in (0, None) and not verdict:
            tail = " | ".join(ln.strip() for ln in lines[-5:])[:500]
            log(f"  probe process failed before any setting (rc {proc.returncode}): {tail}")
            break
        todo = [n for n in todo if n not in verdict]
    for n in todo:
        verdict[n] = "not probed (the probe ran out of time or relaunches)"
    return verdict


# ---------------------------------------------------------------------------------------------- timing
def do_bench_ms(fn, warmup: int, rep: int) -> tuple[float, float, float]:
    from triton.testing import do_bench

    p50, p20, p80 = do_bench(fn, warmup=warmup, rep=rep, quantiles=[0.5, 0.2, 0.8])
    return float(p50), float(p20), float(p80)


def read_flush_ms(fn, rep: int, buf) -> tuple[float, float, float]:
    """Median, p20 and p80 of ``fn``'s device time (CUDA events) over calls for ~``rep`` ms, each after reading
    ``buf`` (a flush that leaves L2 clean: nothing for a load to write back first)."""
    import statistics

    from tilefuse.bench import harness

    times: list[float] = []
    spent = 0.0
    while len(times) < 5 or spent < rep:
        times.append(harness.flushed_call_ms(fn, buf.sum))
        spent += times[-1]
    q = statistics.quantiles(times, n=10)
    return float(statistics.median(times)), float(q[1]), float(q[7])


def graph_ms(fn) -> float:
    """Device time of one call, replayed from a CUDA graph of GRAPH_CALLS calls: no host time in it."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(GRAPH_CALLS):
            fn()
    g.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(GRAPH_REPLAYS):
        g.replay()
    end.record()
    torch.cuda.synchronize()
    ms = start.elapsed_time(end) / (GRAPH_REPLAYS * GRAPH_CALLS)
    del g
    return ms


def host_us(fn) -> float:
    """Host time of one call (the GPU queue does not fill in HOST_CALLS calls, so this is enqueue time)."""
    import torch

    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(HOST_CALLS):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / HOST_CALLS * 1e6


@dataclasses.dataclass
class Result:
    shape: str
    impl: str
    ms: float | None = None
    p20: float | None = None
    p80: float | None = None
    graph: float | None = None
    host: float | None = None
    status: str = "ok"
    note: str = ""


def context_alive() -> bool:
    import torch

    try:
        torch.cuda.synchronize()
        torch.zeros(1, device="cuda").add_(1).item()
        return True
    except Exception:
        return False


def measure(shape: str, impl: str, fn, check, args, dog: Watchdog, note: str = "") -> Result:
    """Check, then time ``fn``: do_bench, CUDA graph, host time. Any failure becomes the row's status."""
    res = Result(shape, impl, note=note)
    dog.step = f"{shape} {impl}"
    try:
        wrong = check()
        if wrong:
            res.status = f"WRONG: {wrong}"
            return res
        res.ms, res.p20, res.p80 = do_bench_ms(fn, args.warmup_ms, args.rep_ms)
        res.host = host_us(fn)
    except Exception as exc:
        res.status = f"ERROR {type(exc).__name__}: {str(exc).strip().splitlines()[0][:240] if str(exc).strip() else ''}"
        return res
    if args.graphs:
        try:
            res.graph = graph_ms(fn)
        except Exception as exc:
            res.note = (res.note + "; " if res.note else "") + f"graph: {type(exc).__name__}: {str(exc)[:120]}"
    return res


# ------------------------------------------------------------------------------------------------- main
def fmt(x, spec: str, width: int) -> str:
    return f"{x:{width}{spec}}" if x is not None else f"{'-':>{width}}"


def print_header() -> None:
    log(f"{'shape':<18} {'impl':<32} {'ms':>8} {'TFLOP/s':>8} {'x_cublas':>8} {'x_nt':>6} {'graph_ms':>8} "
        f"{'g_TF/s':>7} {'host_us':>7}  status / note")


def print_result(r: Result, flops: float, base: dict) -> None:
    tf = flops / (r.ms * 1e-3) / 1e12 if r.ms else None
    gtf = flops / (r.graph * 1e-3) / 1e12 if r.graph else None
    x = base["cublas"] / r.ms if r.ms and base.get("cublas") else None
    xnt = base["cublas_nt"] / r.ms if r.ms and base.get("cublas_nt") else None
    spread = f"p20-p80 {r.p20:.4f}-{r.p80:.4f}" if r.p20 is not None else ""
    tail = "; ".join(t for t in (r.status if r.status != "ok" else "", spread, r.note) if t)
    log(f"{r.shape:<18} {r.impl:<32} {fmt(r.ms, '.4f', 8)} {fmt(tf, '.1f', 8)} {fmt(x, '.3f', 8)} "
        f"{fmt(xnt, '.3f', 6)} {fmt(r.graph, '.4f', 8)} {fmt(gtf, '.1f', 7)} {fmt(r.host, '.0f', 7)}  {tail}")


def write_csv(path: Path, rows: list[tuple[Result, float, dict]], env: dict) -> None:
    import csv

    path.parent.mkdir(parents=True, exist_ok=True)
    cols = ["suite", "case", "impl", "dtype", "shape", "ms_p50", "tflops", "vs_baseline", "baseline", "vs_cublas",
            "ms_p20", "ms_p80", "graph_ms", "host_us", "status", "note", "gpu", "torch", "triton", "git_sha", "date"]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        for r, flops, base in rows:
            w.writerow({"suite": "ladder_sweep", "case": f"mm/bfloat16/{r.shape}", "impl": r.impl, "dtype": "bfloat16",
                        "shape": r.shape, "ms_p50": r.ms, "tflops": flops / (r.ms * 1e-3) / 1e12 if r.ms else None,
                        "vs_baseline": base["cublas_nt"] / r.ms if r.ms and base.get("cublas_nt") else None,
                        "baseline": "cublas_nt",
                        "vs_cublas": base["cublas"] / r.ms if r.ms and base.get("cublas") else None,
                        "ms_p20": r.p20, "ms_p80": r.p80, "graph_ms": r.graph, "host_us": r.host, "status": r.status,
                        "note": r.note, **env})


def git_sha() -> str:
    if os.environ.get("TILEFUSE_GIT_SHA"):
        return os.environ["TILEFUSE_GIT_SHA"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""


def smi() -> str:
    try:
        p = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu",
                            "--format=csv,noheader"], capture_output=True, text=True, timeout=10)
        return p.stdout.strip() or p.stderr.strip()[:200]
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"nvidia-smi: {exc}"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default=DEFAULT_SHAPES,
                   help=f"comma-separated, of {', '.join(SHAPES)} or MxNxK (default {DEFAULT_SHAPES})")
    p.add_argument("--settings", default="all", help="rung-9 settings to time: 'all' or comma-separated names (--list)")
    p.add_argument("--no-graphs", dest="graphs", action="store_false", help="skip the CUDA-graph timing")
    p.add_argument("--no-probe", dest="probe", action="store_false", help="skip the child-process probe of settings")
    p.add_argument("--warmup-ms", type=int, default=WARMUP_MS)
    p.add_argument("--rep-ms", type=int, default=REP_MS)
    p.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S, help="the watchdog ends the run after this")
    p.add_argument("--csv", type=Path, default=None, help="also write tidy rows here")
    p.add_argument("--list", action="store_true", help="print the rung-9 settings and exit (no GPU needed)")
    p.add_argument("--ab", default=None, metavar="SETTING[,SETTING...]",
                   help="interleaved A/B instead of the sweep: rung 9's default against each SETTING, --rounds rounds "
                        "of cuBLAS (K-major B), default and the settings, each timed --rep-ms (default 10)")
    p.add_argument("--flush", choices=("write", "read"), default="write",
                   help="--ab: the L2 flush before each call: 'write' (do_bench's zeroing, as the ladder suite "
                        "times; the default) or 'read' (a clean L2)")
    p.add_argument("--rounds", type=int, default=AB_ROUNDS, help=f"rounds of --ab (default {AB_ROUNDS})")
    p.add_argument("--build-only", action="store_true", help="build rungs 7-9 for sm_90a and exit (no GPU needed)")
    p.add_argument("--probe-child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.ab_list = []
    if args.ab is not None:
        args.ab_list = [t.strip() for t in args.ab.split(",") if t.strip()]
        bad = [t for t in args.ab_list if t not in BY_NAME or t == "default"]
        if bad or not args.ab_list or len(set(args.ab_list)) != len(args.ab_list):
            p.error(f"--ab: {args.ab!r}: give distinct non-default settings, of: "
                    f"{', '.join(n for n in BY_NAME if n != 'default')}")
        if args.rounds < 1:
            p.error("--rounds: at least 1")
        if "--rep-ms" not in (argv if argv is not None else sys.argv[1:]):
            args.rep_ms = AB_REP_MS
    elif args.flush != "write":
        p.error("--flush: only with --ab (the sweep times with do_bench's flush)")
    args.shape_list = []
    for tok in filter(None, (t.strip() for t in args.shapes.split(","))):
        if tok in SHAPES:
            args.shape_list.append(SHAPES[tok])
            continue
        try:
            m, n, k = (int(v) for v in tok.lower().split("x"))
        except ValueError:
            p.error(f"--shapes: {tok!r} is not one of {', '.join(SHAPES)} or MxNxK")
        if min(m, n, k) < 1 or n % 8 or k % 8:
            p.error(f"--shapes: {tok!r}: rung 9 needs N and K multiples of 8 and all sizes >= 1")
        args.shape_list.append((m, n, k))
    if args.settings == "all":
        args.setting_list = list(SETTINGS)
    else:
        names = [t.strip() for t in args.settings.split(",") if t.strip()]
        unknown = [t for t in names if t not in BY_NAME]
        if unknown:
            p.error(f"--settings: unknown {unknown}; accepted: {', '.join(BY_NAME)}")
        args.setting_list = [BY_NAME["default"]] + [BY_NAME[t] for t in names if t != "default"]
    return args


def ab_main(args, builds, dog: Watchdog) -> int:
    """--ab: rung 9 (the C launcher) under its default and under each other setting given, and cuBLAS with a K-major
    B, in interleaved rounds, so that the clock's drift (the H200 at its power limit) falls on all of them alike; the
    rung-9 settings' order rotates each round. Prints each round's times and, a shape, the medians, each setting's
    median of the rounds' ratios setting / default, and each one's ratio to cuBLAS."""
    import torch

    from tilefuse.bench import harness
    from tilefuse.cuda import launch

    if not torch.cuda.is_available():
        log("no CUDA GPU here: nothing to time")
        return 2
    if isinstance(builds.get("9"), Exception):
        log(f"rung 9 did not build: {builds['9']}")
        return 1
    rl = launch.load(builds["9"])
    lib9 = rung9_abi(rl.lib)
    others = [BY_NAME[n] for n in args.ab_list]
    variants = [BY_NAME["default"]] + others
    timer, how = ab_timer(args.flush, args.rep_ms)
    log(f"A/B: default against " + "; ".join(f"{o.name} ({o.why})" for o in others) +
        f"; {args.rounds} rounds of {how}, rep {args.rep_ms} ms; nvidia-smi: {smi()}")
    rows = []
    status = 0
    for m, n, k in args.shape_list:
        shape = f"{m}x{n}x{k}"
        if dog.left() < 15:
            log(f"{shape}: not run: {dog.left():.0f} s of the budget left")
            continue
        torch.manual_seed(0)
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        ref = a.float() @ w.float().t()

        def r9():
            rl(a.data_ptr(), w.data_ptr(), c.data_ptr(), None, m, n, k, k, k, n, "bfloat16", 0,
               torch.cuda.current_stream().cuda_stream)

        for setting in variants:  # all checked before any timing
            with applied(lib9, setting):
                c.fill_(float("nan"))
                r9()
                torch.cuda.synchronize()
                err = harness.rel_error(c, ref)
            if err > CHECK_TOLERANCE:
                log(f"{shape} {setting.name}: WRONG, relative error {err:.3g}")
                status = 1
        def measure(setting):
            def run():
                with applied(lib9, setting):
                    return timer(r9)[0]
            return run

        times = ab_rounds(shape, lambda: timer(lambda: torch.matmul(a, w.t()))[0],
                          {v.name: measure(v) for v in variants}, args.rounds, dog)
        rows += ab_report(shape, times, "setting", "default", args.flush)
    if args.csv is not None:
        write_rows(args.csv, rows)
    log(f"nvidia-smi after: {smi()}")
    return status


def ab_timer(flush: str, rep_ms: int):
    """An A/B's timer (fn -> (p50, p20, p80) ms) and its description: do_bench with its zeroing flush ('write'),
    or CUDA events after a reading flush ('read': a clean L2)."""
    import torch

    if flush == "read":
        buf = torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
        return (lambda fn: read_flush_ms(fn, rep_ms, buf)), "a reading flush (clean L2) before each call, CUDA events"
    return (lambda fn: do_bench_ms(fn, 5, rep_ms)), "do_bench (zeroing flush)"


def ab_rounds(shape: str, cublas, measures: dict, rounds: int, dog: Watchdog | None = None) -> dict[str, list[float]]:
    """Interleaved rounds: each round cuBLAS (``cublas()`` -> ms) first, then every entry of ``measures`` (name ->
    a callable returning ms) in an order that rotates by one each round. Logs each round; returns name -> times,
    'cublas_nt' first."""
    names = list(measures)
    times: dict[str, list[float]] = {"cublas_nt": [], **{nm: [] for nm in names}}
    for rnd in range(rounds):
        if dog is not None:
            dog.step = f"{shape} round {rnd}"
        times["cublas_nt"].append(cublas())
        shift = rnd % len(names)
        for name in names[shift:] + names[:shift]:
            times[name].append(measures[name]())
        log(f"{shape} round {rnd}: " + ", ".join(f"{key} {v[-1]:.4f}" for key, v in times.items()))
    return times


def ab_report(shape: str, times: dict[str, list[float]], label: str, base: str, flush: str) -> list[dict]:
    """Log an A/B's medians, each entry's median of the rounds' ratios entry / ``base`` and its ratio to cuBLAS;
    return a row an entry (the ratio to base in a ``vs_<base>`` column)."""
    import statistics

    med = {key: statistics.median(v) for key, v in times.items()}
    vs = {key: statistics.median(x / d for x, d in zip(v, times[base])) for key, v in times.items()
          if key not in ("cublas_nt", base)}
    nt = {key: statistics.median(b / t for b, t in zip(times["cublas_nt"], v)) for key, v in times.items()
          if key != "cublas_nt"}
    log(f"{shape}: medians " + ", ".join(f"{key} {v:.4f} ms" for key, v in med.items()))
    log(f"{shape}: {label} / {base} (median of rounds): " + ", ".join(f"{key} {v:.4f}" for key, v in vs.items()) +
        "; x cublas_nt " + ", ".join(f"{key} {v:.4f}" for key, v in nt.items()))
    return [{"shape": shape, "impl": key, "flush": flush, "ms_p50": v, "x_cublas_nt": nt.get(key),
             f"vs_{base}": vs.get(key), "rounds": len(times[key]), "round_ms": " ".join(f"{t:.4f}" for t in times[key])}
            for key, v in med.items()]


def write_rows(path: Path, rows: list[dict]) -> None:
    """An A/B's rows (dicts with the same keys) as CSV, with the git revision in each; nothing when there are none."""
    if not rows:
        return
    import csv

    path.parent.mkdir(parents=True, exist_ok=True)
    sha = git_sha()
    with open(path, "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=list(rows[0]) + ["git_sha"])
        wr.writeheader()
        for row in rows:
            wr.writerow({**row, "git_sha": sha})


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.probe_child is not None:
        return probe_child([t for t in args.probe_child.split(",") if t])
    if args.list:
        for s in SETTINGS:
            log(f"{s.name:<26} debug={s.debug} schedule(clusters, group_m, order, cluster_size)={s.schedule} "
                f"pingpong={s.pingpong} warp_stores={s.warp_stores} streamk={s.streamk} balance={s.balance} l2={s.l2}  "
                f"{s.why}")
        return 0
    dog = Watchdog(args.budget_s)
    t0 = time.monotonic()
    dog.step = "builds"
    builds = build_rungs(("9",) if args.ab else ("7", "8", "9"))
    if args.build_only:
        return 0 if all(not isinstance(b, Exception) for b in builds.values()) else 1
    if args.ab:
        return ab_main(args, builds, dog)

    dog.step = "import torch"
    import torch

    if not torch.cuda.is_available():
        log("no CUDA GPU here: nothing to time (--list and --build-only run without one)")
        return 2
    from tilefuse.bench import harness
    from tilefuse.cuda import gemm as ladder_gemm
    from tilefuse.cuda import launch

    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    env = {"gpu": props.name, "torch": torch.__version__, "triton": __import__("triton").__version__,
           "git_sha": git_sha(), "date": _dt.date.today().isoformat()}
    log(f"device: {props.name}, {props.multi_processor_count} SMs, L2 {getattr(props, 'L2_cache_size', 0) >> 20} MiB, "
        f"torch {env['torch']}, triton {env['triton']}, git {env['git_sha']}")
    log(f"nvidia-smi (clock, max clock, power, limit, temp): {smi()}")

    libs = {n: (launch.load(b) if not isinstance(b, Exception) else b) for n, b in builds.items()}
    r9 = libs.get("9")
    if isinstance(r9, Exception):
        log("rung 9 did not build: only cuBLAS and rungs 7-8 are timed")
        r9 = None
    lib9 = rung9_abi(r9.lib) if r9 is not None else None

    # Probe the non-default settings in a child process while the parent prepares inputs and references.
    wanted = [s for s in args.setting_list if not s.is_default]
    probe_result: dict[str, str] = {}
    probe_thread = None
    if lib9 is not None and wanted and args.probe:
        dog.step = "probe"
        probe_thread = threading.Thread(target=lambda: probe_result.update(run_probe([s.name for s in wanted], dog)),
                                        daemon=True)
        probe_thread.start()

    if lib9 is not None:
        for cs in (2, 1):
            occ = occupancy(lib9, cs)
            log(f"occupancy, clusters of {cs}: {occ}")
        occ2, occ1 = occupancy(lib9, 2), occupancy(lib9, 1)
        res2 = occ2.get("max_active_clusters") or props.multi_processor_count // 2
        res1 = occ1.get("max_active_clusters") or props.multi_processor_count
        for m, n, k in args.shape_list:
            t2 = -(-m // 256) * -(-n // 256)
            t1 = -(-m // 128) * -(-n // 256)
            tp = -(-m // 128) * -(-n // 256)  # ping-pong: 2-CTA cluster tiles of 2 x 64 rows
            for label, tiles, res in (("2-CTA cluster tiles 256x256", t2, res2), ("1-CTA tiles 128x256", t1, res1),
                                      ("ping-pong 2-CTA cluster tiles 128x256", tp, res2)):
                rounds = -(-tiles // res)
                log(f"  {m}x{n}x{k}: {tiles} {label} on {res} resident -> {tiles / res:.2f} tiles each, {rounds} "
                    f"rounds, last round {tiles - (rounds - 1) * res}/{res} busy, efficiency {tiles / (rounds * res):.3f}")

    results: list[tuple[Result, float, dict]] = []
    print_header_done = False
    dead = False
    for m, n, k in args.shape_list:
        shape = f"{m}x{n}x{k}"
        if dog.left() < 15:
            log(f"{shape}: not run: {dog.left():.0f} s of the budget left")
            continue
        dog.step = f"{shape} inputs"
        torch.manual_seed(0)
        a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        w = torch.randn(n, k, device=dev, dtype=torch.bfloat16)  # the (N, K) weight: rungs 7-9's B (K-major)
        b_kn = w.t().contiguous()                                # the same B as a row-major [K, N]
        ref = a.float() @ w.float().t()
        c = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
        flops = 2.0 * m * n * k

        def checker(fn, fresh_output: bool):
            def check():
                if fresh_output:  # the allocator's next block of this size, poisoned: gemm() allocates C itself
                    torch.full((m, n), float("nan"), device=dev, dtype=torch.bfloat16)  # freed at once
                else:
                    c.fill_(float("nan"))
                out = fn()
                torch.cuda.synchronize()
                err = harness.rel_error(c if out is None else out, ref)
                return None if err <= CHECK_TOLERANCE else f"relative error {err:.3g} > {CHECK_TOLERANCE:g}"
            return check

        def direct(rl):  # the stream is read at each call: under graph capture it is the capture stream
            return lambda: rl(a.data_ptr(), w.data_ptr(), c.data_ptr(), None, m, n, k, k, k, n, "bfloat16", 0,
                              torch.cuda.current_stream().cuda_stream)

        base: dict = {}
        plan = [("cublas", lambda: torch.matmul(a, b_kn), True, "torch.matmul(a, b), B [K,N] row-major"),
                ("cublas_nt", lambda: torch.matmul(a, w.t()), True, "torch.matmul(a, w.t()), B K-major as rungs 7-9")]
        for name in ("7", "8", "9"):
            rl = libs.get(name)
            if isinstance(rl, Exception) or rl is None:
                continue
            plan.append((f"rung{name}", (lambda nm=name: ladder_gemm(a, w.t(), rung=int(nm))), True,
                         "tilefuse.cuda.gemm (what the ladder suite times)"))
            plan.append((f"rung{name}.direct", direct(rl), False, "the C launcher through ctypes, C preallocated"))

        if not print_header_done:
            if probe_thread is not None:
                dog.step = "waiting for the probe"
                probe_thread.join(timeout=max(1.0, dog.left() - 20))
                log("probe of rung-9 settings (child process, %dx%dx%d, epilogues none and bias):" % PROBE_SHAPE)
                for s in wanted:
                    log(f"  {s.name:<26} {probe_result.get(s.name, 'no answer')}")
            print_header()
            print_header_done = True

        for impl, fn, fresh, note in plan:
            if dead:
                break
            r = measure(shape, impl, fn, checker(fn, fresh), args, dog, note)
            if r.ms is not None and impl in ("cublas", "cublas_nt"):
                base[impl] = r.ms
            print_result(r, flops, base)
            results.append((r, flops, base))
            if r.status != "ok" and not context_alive():
                dead = True
        if lib9 is not None and not dead:
            for s in wanted:
                if dead:
                    break
                verdict = probe_result.get(s.name, "ok" if not args.probe else "no answer")
                impl = f"rung9.{s.name}"
                if verdict != "ok":
                    r = Result(shape, impl, status=f"not run: probe: {verdict}")
                else:
                    try:
                        with applied(lib9, s):
                            fn = direct(r9)
                            r = measure(shape, impl, fn, checker(fn, False), args, dog, s.why)
                    except Exception as exc:
                        r = Result(shape, impl, status=f"ERROR {type(exc).__name__}: {exc}")
                print_result(r, flops, base)
                results.append((r, flops, base))
                if r.status.startswith(("ERROR", "WRONG")) and not context_alive():
                    dead = True
        if dead:
            log("the CUDA context is gone (a kernel trapped or faulted): the rest of the sweep cannot run")
        a = w = b_kn = ref = c = plan = None  # free this shape's tensors before the next one's
        torch.cuda.empty_cache()
        if dead:
            break

    log(f"nvidia-smi after: {smi()}")
    if args.csv is not None:
        write_csv(args.csv, results, env)
        log(f"rows written to {args.csv}")
    log(f"sweep done in {time.monotonic() - t0:.1f} s")
    return 0 if not dead else 1


if __name__ == "__main__":
    sys.exit(main())
