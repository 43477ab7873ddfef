"""Choosing a GEMM config: the heuristic default, or disk-cached autotuning on a GPU.

Decision order for a problem (see :class:`~tilefuse.kernels.gemm.configs.GemmProblem`):

1. this process already decided its key: reuse (a dict lookup; the launch path stays cheap);
2. tuning is off (``TILEFUSE_AUTOTUNE=0``), or kernels run on the interpreter (which cannot time, and
   where @triton.autotune with several configs cannot run): the heuristic default;
3. a decision stored on disk under ``TILEFUSE_CACHE_DIR/tuning/gemm/`` for this key: reuse it (a new
   process does not tune again);
4. otherwise tune: compile the candidates (concurrently), time each on the call's own inputs with
   ``triton.testing.do_bench`` (median, L2 cleared before each run, as ``tilefuse.bench.harness`` times
   the suite; a quick look of a few flushed launches first skips clearly slow ones), then time the
   candidates within :data:`TUNE_CLOSE` of the best again in interleaved rounds and keep the lowest median,
   a tie within :data:`TUNE_TIE` going to the candidate the space lists first (:func:`finalists`,
   :func:`run_final`, :func:`settle_ties`); store the winner with every candidate's time, use it.
   Under torchrun only local rank 0 tunes; the other ranks wait for its decision on disk
   (:func:`tuning_role`, :func:`wait_for_decision`).

Candidates: the space of the problem's shape class (:func:`~tilefuse.kernels.gemm.configs.candidates`,
at most :data:`TUNE_MAX_CANDIDATES`). When a *related* key was tuned already (the same bucket and layout
with the plain epilogue, or the other 16-bit dtype), its :data:`RELATED_TOP` fastest configs are the
candidates instead: the main loop decides the time and the epilogue rarely reorders configs, so a fused
variant costs two compilations, not six (this is what keeps ``tilefuse bench gemm`` from an empty cache
within its budget).

The key is (device name and arch, triton version, dtypes, layout, shape bucket, epilogue signature).
Progress goes to stderr once tuning has taken more than :data:`PROGRESS_AFTER_S` (``TILEFUSE_PROGRESS``).
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import sys
import threading
import time
from statistics import median
from typing import Callable, Sequence

from ... import config as tf_config
from ... import device, diskcache
from .configs import (GemmConfig, GemmProblem, INTERPRETER_CONFIG, candidates, current_part, default_config,
                           fp32_precision)

TUNE_MAX_CANDIDATES = 6  # configs timed a key: the space's order is a strong prior, the tail rarely wins
# fp32 keys time more: their space is new (no device sweep behind its order yet) and the pointer and TMA
# kernels trade places with the layout (gemm_configs.NVIDIA_SPACE_4B); one tf32 key in the suite, whose
# 10 candidates compile in parallel and time in ~1 s
TUNE_MAX_CANDIDATES_4B = 10
RELATED_TOP = 2  # candidates taken from a related key's measured ranking
RELATED_CLEAR_WIN = 1.10  # a related winner this much faster than its runner-up is inherited without timing
TUNE_WARMUP_MS = 5
TUNE_REP_MS = 25  # do_bench repetition time a candidate; a 12 ms GEMM still gets 2+ timed runs
# The quick look that decides the early stop: QUICK_LOOK_RUNS launches, each behind an L2 flush (as do_bench
# times them), the fastest counts. One launch timed on an idle stream, which counts the launcher's host time and reads
# 0.14-0.15 ms for decode kernels whose steady time is 0.05 ms: four of six bf16 M=1 candidates (the first sweep's
# 0.96x one among them) were dropped unmeasured, the winner was whichever slipped under the bar. Behind the flush (a
# ~80 us memset of 256 MB) the launch is queued before the GPU reaches it.
QUICK_LOOK_RUNS = 3
QUICK_LOOK_ENOUGH_MS = 2.0  # a launch this long is its own measurement: no second quick run
TUNE_EARLY_STOP = 1.5  # a candidate whose quick look is slower than this x the best so far is not timed
# The final: candidates within TUNE_CLOSE of the best after the first pass (at most TUNE_FINAL_MAX) are
# timed again in TUNE_FINAL_ROUNDS interleaved rounds (each a full do_bench, the order rotated each round,
# so drift in clocks or temperature hits every finalist alike); each is scored by the median of its first
# pass and its rounds. Decode candidates sit within a few % of each other (bandwidth-bound: the first sweep's M=1 best
# three 0.98-1.02x cuBLAS), where one 25 ms measurement a candidate decided by noise.
TUNE_CLOSE = 1.06
TUNE_FINAL_MAX = 3
TUNE_FINAL_ROUNDS = 2
# Candidates whose scores are within TUNE_TIE of the best are a tie, which the candidates' order settles: the
# spaces are ordered by interleaved sweeps of 6 rounds and more, a firmer measurement than the final's three
# samples. Measured (docs/decisions/019-gemm-tuner-timing.md): at 128x8192x8192 the final scored the space's first
# config 0.0457 ms and its second 0.0456, and kept the second, which two interleaved sweeps had timed 1.1-1.2 %
# slower. (In the next suite the same final had the first 1.1 % behind: outside the tie, so the second was kept
# again.)
TUNE_TIE = 1.005
PROGRESS_AFTER_S = 1.0
COMPILE_THREADS = min(16, max(2, (os.cpu_count() or 2)))
CACHE_VERSION = 2  # bump when the kernels change in a way that invalidates stored decisions
# (2: the -ef configs, B's TMA loads evict-first, lead at M = 128 and 256 where version 1's picks trail cuBLAS)

_memo: dict[str, GemmConfig] = {}
# what this process's decisions came from (train_distributed.py reports them per rank)
counters = {"tuned": 0, "from_disk": 0, "from_rank0": 0, "untuned": 0}
_memo_lock = threading.Lock()
generation = 0  # bumped by forget(): the call path's plans (gemm_plan) hold configs chosen here


def tuning_enabled() -> bool:
    dev = device.current()
    if dev.interpreter or not dev.is_gpu:
        return False
    setting = tf_config.get().autotune
    return True if setting is None else bool(setting)


def precision_tag(problem: GemmProblem) -> str:
    """fp32 inputs: "tf32" or "ieee", as the launch will run them (gemm_launching._input_precision: tf32 on
    NVIDIA when torch allows it). The two are different kernels with different winners, so different keys;
    "" for every other dtype (their keys are unchanged)."""
    if problem.a_dtype != "float32":
        return ""
    if device.current().interpreter:
        return "ieee"
    return fp32_precision(current_part())


def key_of(problem: GemmProblem) -> str:
    import triton

    dev = device.current()
    bucket = problem.bucket()
    precision = precision_tag(problem)
    return "|".join([f"v{CACHE_VERSION}", dev.name, dev.arch, triton.__version__,
                     f"{problem.a_dtype}x{problem.b_dtype}->{problem.c_dtype}" + (f":{precision}" if precision else ""),
                     ("T" if problem.a_t else "N") + ("T" if problem.b_t else "N") + ("tma" if problem.tma_ok else ""),
                     "x".join(map(str, bucket)), problem.epilogue])


def _related_problems(problem: GemmProblem) -> list[GemmProblem]:
    """Keys whose measured ranking is a good prior for ``problem``, nearest first."""
    import dataclasses as dc

    out = []
    if ",quant=" in problem.epilogue or problem.epilogue.startswith("quant="):
        # the same epilogue without the quantised store (its main loop and tile are the same)
        unq = ",".join(p for p in problem.epilogue.split(",") if not p.startswith("quant=")) or "plain"
        if unq != "plain":
            c = problem.a_dtype if problem.a_dtype in ("float16", "bfloat16", "float32") else "bfloat16"
            out.append(dc.replace(problem, epilogue=unq, c_dtype=c))
    if problem.epilogue != "plain":
        plain_c = problem.c_dtype
        if problem.c_dtype.startswith(("float8", "int8")) and problem.a_dtype in ("float16", "bfloat16"):
            plain_c = problem.a_dtype  # a quantised output: the plain GEMM stored the input dtype
        out.append(dc.replace(problem, epilogue="plain", c_dtype=plain_c))
    swap = {"float16": "bfloat16", "bfloat16": "float16"}
    if problem.a_dtype in swap and problem.b_dtype == problem.a_dtype:
        other = swap[problem.a_dtype]
        c = other if problem.c_dtype == problem.a_dtype else problem.c_dtype
        out.append(dc.replace(problem, a_dtype=other, b_dtype=other, c_dtype=c))
        if problem.epilogue != "plain":
            out.append(dc.replace(problem, a_dtype=other, b_dtype=other, c_dtype=other, epilogue="plain"))
    return out


def related_ranking(problem: GemmProblem) -> list[tuple[GemmConfig, float]]:
    """The measured (config, ms) ranking of the nearest related key tuned already, or []."""
    for rel in _related_problems(problem):
        data = diskcache.read_json(_path(key_of(rel)), check=_entry_check(key_of(rel)))
        if not data or not data.get("ranking"):
            continue
        ranked = [(GemmConfig.from_json(r["config"]), r["ms"]) for r in data["ranking"] if r.get("ms") is not None]
        if ranked:
            return ranked
    return []


def related_candidates(problem: GemmProblem) -> list[GemmConfig]:
    """What tuning ``problem`` times: the related key's winner alone when it won clearly
    (RELATED_CLEAR_WIN), else its RELATED_TOP best; [] when no related key was tuned."""
    ranked = related_ranking(problem)
    if not ranked:
        return []
    if len(ranked) == 1 or ranked[1][1] > RELATED_CLEAR_WIN * ranked[0][1]:
        return [ranked[0][0]]
    return [cfg for cfg, _ in ranked[:RELATED_TOP]]


# A bound on this process's tuning time (None: none). ``tilefuse bench gemm`` sets one so that a run from
# an empty cache ends in time; past it, keys get the related winner or the heuristic default, untimed and
# not stored (a later process tunes them).
_budget_s: float | None = None
_spent_s = 0.0


def set_budget(seconds: float | None) -> None:
    global _budget_s, _spent_s
    _budget_s, _spent_s = seconds, 0.0


def budget_left() -> bool:
    return _budget_s is None or _spent_s < _budget_s


def _path(key: str):
    return diskcache.folder("tuning", "gemm") / f"{diskcache.digest(key)}.json"


def _entry_check(key: str):
    """The check a stored decision must pass to be used (a torn or foreign entry is discarded, then retuned):
    a dict for this very key (the file is named by its digest), a winner and a ranking of configs."""
    def check(data) -> bool:
        GemmConfig.from_json(data["winner"])
        for row in data.get("ranking") or ():
            GemmConfig.from_json(row["config"])
            if row.get("ms") is not None:
                float(row["ms"])
        return data["key"] == key
    return check


def stored(problem: GemmProblem) -> GemmConfig | None:
    data = diskcache.read_json(_path(key_of(problem)), check=_entry_check(key_of(problem)))
    return GemmConfig.from_json(data["winner"]) if data else None


def choose(ops) -> GemmConfig:
    """The config to run ``ops`` (a :class:`tilefuse.kernels.gemm._Operands`) with."""
    problem = ops.problem
    if not tuning_enabled():
        if device.current().interpreter:
            return INTERPRETER_CONFIG
        return default_config(problem)
    key = key_of(problem)
    hit = _memo.get(key)
    if hit is not None:
        return hit
    with _memo_lock:
        hit = _memo.get(key)
        if hit is not None:
            return hit
        cfg = stored(problem)
        if cfg is not None:
            counters["from_disk"] += 1
        else:
            if budget_left() and tuning_role() == "waiter":
                cfg = wait_for_decision(problem)
            elif budget_left():
                cfg = tune(ops)
                counters["tuned"] += 1
            else:
                related = related_candidates(problem)
                cfg = related[0] if related else default_config(problem)
                counters["untuned"] += 1
                tf_config.log(1, f"gemm tuning budget spent: {problem.describe()} runs {cfg.label()} untuned")
        _memo[key] = cfg
        return cfg


WAIT_POLL_S = 0.1
WAIT_SAY_EVERY_S = 10.0


def tuning_role() -> str:
    """``"tuner"``, or ``"waiter"`` for a torchrun rank other than local rank 0: tuning the same key on every
    GPU of a host would cost each rank the same minutes and could pick different winners on different ranks
    (timing noise), so local rank 0 tunes and the others take its decision from the shared disk cache. (One
    decision per host: a node-local cache dir is what each node's local rank 0 fills; a restart finds it.)"""
    cfg = tf_config.get()
    if cfg.local_world_size > 1 and cfg.local_rank not in (None, 0):
        return "waiter"
    return "tuner"


def wait_for_decision(problem: GemmProblem) -> GemmConfig:
    """Poll the disk cache for local rank 0's decision on ``problem`` for up to ``TILEFUSE_TUNE_WAIT_S``.
    If none arrives (rank 0 never met this shape), the related winner or the heuristic default runs,
    untuned and not stored, and the rank says so."""
    limit = tf_config.get().tune_wait_s
    rank = tf_config.get().local_rank
    progress = Progress(problem.describe())
    t0 = time.perf_counter()
    said = -WAIT_SAY_EVERY_S
    while True:
        cfg = stored(problem)
        if cfg is not None:
            progress.done(f"local rank {rank} took local rank 0's decision {cfg.label()} after "
                          f"{time.perf_counter() - t0:.1f} s")
            counters["from_rank0"] += 1
            return cfg
        waited = time.perf_counter() - t0
        if waited >= limit:
            break
        if waited - said >= WAIT_SAY_EVERY_S:  # a line every few seconds, not every poll
            progress.update(f"local rank {rank} waiting for local rank 0's decision ({waited:.0f} s of {limit:.0f})")
            said = waited
        time.sleep(min(WAIT_POLL_S, max(limit - waited, 0.0)))
    related = related_candidates(problem)
    cfg = related[0] if related else default_config(problem)
    counters["untuned"] += 1
    print(f"[tilefuse] local rank {rank}: no tuning decision from local rank 0 for {problem.describe()} within "
          f"TILEFUSE_TUNE_WAIT_S={limit:g} s; running {cfg.label()} untuned", file=sys.stderr, flush=True)
    return cfg


class Progress:
    """Prints to stderr only once the work has taken more than PROGRESS_AFTER_S (and TILEFUSE_PROGRESS=1)."""

    def __init__(self, what: str):
        self.what, self.start, self.shown = what, time.perf_counter(), False

    def update(self, message: str) -> None:
        if not tf_config.get().progress:
            return
        if not self.shown and time.perf_counter() - self.start < PROGRESS_AFTER_S:
            return
        self.shown = True
        print(f"[tilefuse] tuning {self.what}: {message}", file=sys.stderr, flush=True)

    def done(self, message: str) -> None:
        if self.shown:
            self.update(message)
        tf_config.log(1, f"tuned {self.what}: {message}")


def _time(fn: Callable[[], None], best_ms: float | None) -> float:
    """Milliseconds of ``fn`` as the bench times it (do_bench: L2 flushed before each run, median). With
    ``best_ms`` (the best so far), a quick look first: slower than TUNE_EARLY_STOP x best, that is the
    answer and the full measurement is skipped. ``best_ms=None``: always the full measurement."""
    import torch
    from triton.testing import do_bench

    # one untimed call: the first launch of a freshly compiled kernel loads its module (up to hundreds of ms
    # seen on the H200), which must not count against it in the quick look below
    fn()
    torch.cuda.synchronize()
    if best_ms is not None:
        first = _quick_look(fn)
        if early_stop(first, best_ms):
            return first
    return float(do_bench(fn, warmup=TUNE_WARMUP_MS, rep=TUNE_REP_MS, return_mode="median"))


def _quick_look(fn: Callable[[], None]) -> float:
    """The fastest of QUICK_LOOK_RUNS launches, each behind an L2 flush (see QUICK_LOOK_RUNS)."""
    import torch
    import triton

    driver = triton.runtime.driver.active
    cache = driver.get_empty_cache_for_benchmark()
    best = float("inf")
    for _ in range(QUICK_LOOK_RUNS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        driver.clear_cache(cache)
        start.record()
        fn()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end))
        if best >= QUICK_LOOK_ENOUGH_MS:
            break
    return best


def early_stop(quick_ms: float, best_ms: float | None) -> bool:
    return best_ms is not None and quick_ms > TUNE_EARLY_STOP * best_ms


def finalists(times: dict[GemmConfig, float]) -> list[GemmConfig]:
    """The candidates worth a second look: within TUNE_CLOSE of the best, fastest first, at most
    TUNE_FINAL_MAX; [] when the best is clear (nothing else within TUNE_CLOSE)."""
    ranked = sorted((ms, i, c) for i, (c, ms) in enumerate(times.items()) if ms != float("inf"))
    if len(ranked) < 2:
        return []
    best = ranked[0][0]
    close = [c for ms, _, c in ranked if ms <= TUNE_CLOSE * best][:TUNE_FINAL_MAX]
    return close if len(close) > 1 else []


def settle_ties(times: dict[GemmConfig, float], order: Sequence[GemmConfig]) -> tuple[float, GemmConfig] | None:
    """(score, config) of the winner: of the candidates within TUNE_TIE of the best score, the one earliest
    in ``order`` (the space's preference); None when nothing ran."""
    ran = {c: ms for c, ms in times.items() if ms != float("inf")}
    if not ran:
        return None
    top = min(ran.values())
    rank = {c: i for i, c in enumerate(order)}  # a candidate missing from order goes after, by its score
    winner = min((c for c in ran if ran[c] <= top * TUNE_TIE), key=lambda c: (rank.get(c, len(rank)), ran[c]))
    return ran[winner], winner


def run_final(close: Sequence[GemmConfig], first: dict[GemmConfig, float],
              measure: Callable[[GemmConfig], float]) -> dict[GemmConfig, list[float]]:
    """TUNE_FINAL_ROUNDS interleaved rounds over ``close``: round r times them in the order rotated by r
    (so none is always first after the previous candidate's launches). Returns every finalist's samples,
    its first-pass time first; a finalist whose measurement fails leaves the final (no samples added)."""
    samples = {c: [first[c]] for c in close}
    order = list(close)
    for r in range(TUNE_FINAL_ROUNDS):
        rotated = order[r % len(order):] + order[:r % len(order)]
        for cfg in rotated:
            if cfg not in samples:
                continue
            try:
                samples[cfg].append(measure(cfg))
            except Exception:  # it ran in the first pass; a failure now takes it out of the final
                del samples[cfg]
    return samples


def compile_all(ops, configs: Sequence[GemmConfig]) -> dict[GemmConfig, str]:
    """Compile every config (threads: Triton's C++ passes and ptxas run without the GIL). Returns the
    configs that failed to compile, with the error."""
    from . import launching as gemm_launching

    failed: dict[GemmConfig, str] = {}
    if device.interpreting():
        return failed  # nothing to compile: the interpreter runs the Python source

    def one(cfg):
        try:
            gemm_launching.warmup(ops, cfg)
        except Exception as exc:  # a config the compiler rejects is dropped, with its reason
            failed[cfg] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200]

    if len(configs) <= 1:
        for cfg in configs:
            one(cfg)
        return failed
    with concurrent.futures.ThreadPoolExecutor(min(COMPILE_THREADS, len(configs))) as pool:
        list(pool.map(one, configs))
    return failed


def tune(ops, configs: Sequence[GemmConfig] | None = None, *, store: bool = True,
         timer: Callable[[Callable[[], None], float | None], float] | None = None) -> GemmConfig:
    """Time the candidates on ``ops``'s inputs (outputs go to scratch buffers) and store the winner.

    ``timer(fn, best_ms_so_far) -> ms`` defaults to :func:`_time` (CUDA events, ``do_bench``; tests pass a
    wall clock or canned times to run the tuner on the interpreter). The final's rounds call
    ``timer(fn, None)``: a full measurement, no early stop."""
    timer = timer or _time
    from . import launching as gemm_launching
    from .checks import scratch_operands

    problem = ops.problem
    seeded = False
    if configs is None:
        configs = related_candidates(problem)
        seeded = bool(configs)
        if not configs:
            limit = TUNE_MAX_CANDIDATES_4B if problem.in_bytes == 4 else TUNE_MAX_CANDIDATES
            configs = candidates(problem, current_part(), limit=limit)
    configs = list(configs)
    progress = Progress(problem.describe())
    t0 = time.perf_counter()
    if seeded and len(configs) == 1:
        # the related key's clear winner: nothing to time (its launch compiles it)
        winner = configs[0]
        if store:
            diskcache.write_json(_path(key_of(problem)), {
                "key": key_of(problem), "problem": dataclasses.asdict(problem), "winner": winner.to_json(),
                "winner_label": winner.label(), "winner_ms": None, "seeded_from_related": True,
                "ranking": [{"label": winner.label(), "ms": None, "config": winner.to_json()}], "failed": {},
                "tuned_s": 0.0})
        tf_config.log(1, f"tuned {problem.describe()}: {winner.label()} (inherited from a related key)")
        return winner
    progress.update(f"compiling {len(configs)} configs")
    failed = compile_all(ops, configs)
    scratch = scratch_operands(ops)
    bound: dict[GemmConfig, Callable[[], None]] = {}
    times: dict[GemmConfig, float] = {}
    best: tuple[float, GemmConfig] | None = None
    for i, cfg in enumerate(configs):
        if cfg in failed:
            times[cfg] = float("inf")
            continue
        try:
            # timed through the compiled launcher: host dispatch must not rank small-shape candidates
            bound[cfg] = gemm_launching.bound(scratch, cfg)
            ms = timer(bound[cfg], best[0] if best else None)
        except Exception as exc:  # out of resources at launch, an illegal config on this part
            failed[cfg] = f"{type(exc).__name__}: {exc}"[:200]
            times[cfg] = float("inf")
            continue
        times[cfg] = ms
        if best is None or ms < best[0]:
            best = (ms, cfg)
        progress.update(f"{i + 1}/{len(configs)} {cfg.label()} {ms:.3f} ms")
    # the final between close candidates: interleaved full measurements, scored by the median
    rounds: dict[GemmConfig, list[float]] = {}
    close = finalists(times)
    if close:
        rounds = run_final(close, times, lambda cfg: timer(bound[cfg], None))
        for cfg, samples in rounds.items():
            times[cfg] = median(samples)
        for cfg in close:
            if cfg not in rounds:  # failed in the final: last
                times[cfg] = float("inf")
        progress.update("final: " + ", ".join(f"{c.label()} {' '.join(f'{x:.4f}' for x in rounds[c])}"
                                              for c in close if c in rounds))
    best = settle_ties(times, configs)
    if best is None:
        winner = default_config(problem)
        tf_config.log(1, f"gemm tuning: every candidate failed for {problem.describe()}: {failed}")
    else:
        winner = best[1]
    if store and best is not None:
        diskcache.write_json(_path(key_of(problem)), {
            "key": key_of(problem), "problem": dataclasses.asdict(problem), "winner": winner.to_json(),
            "winner_label": winner.label(), "winner_ms": best[0], "seeded_from_related": seeded,
            "ranking": [{"label": c.label(), "ms": None if ms == float("inf") else round(ms, 5), "config": c.to_json()}
                        for c, ms in sorted(times.items(), key=lambda kv: kv[1])],
            "final": {c.label(): [round(x, 5) for x in v] for c, v in rounds.items()},
            "failed": {c.label(): why for c, why in failed.items()}, "tuned_s": round(time.perf_counter() - t0, 2)})
    global _spent_s
    _spent_s += time.perf_counter() - t0
    progress.done(f"{winner.label()} ({best[0]:.3f} ms) of {len(configs)} in {time.perf_counter() - t0:.1f} s"
                  if best else "no candidate ran; using the default")
    return winner


def forget() -> None:
    """Drop this process's decisions (tests; the disk entries stay)."""
    global generation
    with _memo_lock:
        _memo.clear()
        generation += 1
