"""Where a compiled forward + backward step's time goes: the host's share against the GPU's, for the noisy
fwd+bwd rows of the compiler bench (GPU only).

    python tools/step_time.py [CASE ...] [--backends tilefuse,inductor] [--profile]

For each case (default: the bench's fwd+bwd graphs at 32768 x 4096 bf16) and backend it prints:
  host_us   host time a step: the GPU is held busy by a sleep kernel while STEPS steps are queued, so the
            wall time of the queuing is the host's alone (launches, wrappers, autograd, allocation)
  gpu_us    the step's kernels' CUDA time (torch.profiler)
  b2b_us    CUDA-event time a step over STEPS back-to-back steps (what the sweep calls step)
  bench_us  triton.testing.do_bench with its L2 flush between calls (what the bench's rows time), median
            and p20-p80; bench_gcoff_us the same with Python's garbage collector off
  mallocs   cudaMalloc calls of the caching allocator during the timed steps (0 in a steady state)
  gc runs   Python garbage collections, per generation, during the (gc on) bench
With --profile, cProfile's top entries by own time for 200 steps of each (case, backend).
"""
from __future__ import annotations

import argparse
import cProfile
import functools
import gc
import io
import pstats
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import tilefuse  # noqa: E402,F401  (registers the backend)
from tilefuse.bench import compiler_suite as suite  # noqa: E402

STEPS = suite.HOST_STEPS


def b2b_us(step, args) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(STEPS):
        step(*args)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / STEPS * 1e3


_GC_RUNS = [0, 0, 0]


def _count_gc(phase, info):
    if phase == "start":
        _GC_RUNS[info["generation"]] += 1


def bench_us(step, args, gc_off: bool = False) -> tuple[float, float, float, list]:
    """do_bench's (p50, p20, p80) in us and the garbage collections (per generation) it ran into."""
    from triton.testing import do_bench

    was = gc.isenabled()
    if gc_off:
        gc.disable()
    _GC_RUNS[:] = [0, 0, 0]
    gc.callbacks.append(_count_gc)
    try:
        p50, p20, p80 = do_bench(lambda: step(*args), warmup=25, rep=100, quantiles=[0.5, 0.2, 0.8])
    finally:
        gc.callbacks.remove(_count_gc)
        if was:
            gc.enable()
    return p50 * 1e3, p20 * 1e3, p80 * 1e3, list(_GC_RUNS)


def mallocs(step, args) -> int:
    before = torch.cuda.memory_stats().get("num_device_alloc", 0)
    for _ in range(STEPS):
        step(*args)
    torch.cuda.synchronize()
    return torch.cuda.memory_stats().get("num_device_alloc", 0) - before


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("cases", nargs="*")
    p.add_argument("--backends", default="tilefuse,inductor")
    p.add_argument("--profile", action="store_true")
    opts = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("step_time.py needs a GPU")
    graphs = {g.case: g for g in suite.GRAPHS}
    cases = opts.cases or [g.case for g in suite.GRAPHS if g.backward]
    unknown = [c for c in cases if c not in graphs]
    if unknown:
        raise SystemExit(f"unknown case(s) {', '.join(unknown)}; the cases are {', '.join(graphs)}")
    print(f"{'case':30} {'backend':9} {'host_us':>8} {'gpu_us':>8} {'b2b_us':>8} {'bench_us (p20-p80)':>26} "
          f"{'gcoff_us':>9} {'mallocs':>7}  gc runs (gen 0/1/2) in the bench", flush=True)
    for case in cases:
        graph = graphs[case]
        args = suite.prepare(graph, graph.inputs(suite.ROWS, suite.COLS, suite.VOCAB, torch.bfloat16, "cuda"))
        for backend in ["eager"] + opts.backends.split(","):
            if backend == "eager":
                step = suite.make_step(graph, graph.fn)
            else:
                torch._dynamo.reset()
                step = suite.make_step(graph, torch.compile(graph.fn, backend=backend))
            for _ in range(3):
                step(*args)
            torch.cuda.synchronize()
            call = functools.partial(step, *args)
            h = suite.host_us(call)
            g = suite.kernel_ms(call, steps=5, rounds=1)[0] * 1e3
            b = b2b_us(step, args)
            m50, m20, m80, runs = bench_us(step, args)
            off50, _, _, _ = bench_us(step, args, gc_off=True)
            n = mallocs(step, args)
            print(f"{case:30} {backend:9} {h:8.1f} {g:8.1f} {b:8.1f} {m50:8.1f} ({m20:7.1f}-{m80:7.1f}) "
                  f"{off50:9.1f} {n:7d}  {'/'.join(map(str, runs))}", flush=True)
            if opts.profile and backend != "eager":
                pr = cProfile.Profile()
                pr.enable()
                for _ in range(200):
                    step(*args)
                torch.cuda.synchronize()
                pr.disable()
                s = io.StringIO()
                pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(18)
                print("\n".join(s.getvalue().splitlines()[:40]), flush=True)
        del args
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
