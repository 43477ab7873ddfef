"""``tilefuse bench SUITE...``: run suites and write ``<out>/<suite>.csv``.

Suites: see :data:`SUITES`. Each is a module ``tilefuse.bench.<name>_suite`` exposing
``run(opts: SuiteOptions) -> list[Row]``; it builds a :class:`~tilefuse.bench.harness.Recorder` with
:meth:`SuiteOptions.recorder` and returns ``recorder.finish()``.

On a machine with no GPU a suite does not run (its time would be the interpreter's) unless ``--smoke`` is
given: then it runs tiny shapes on the interpreter to prove the code path, and every row says so.
"""
from __future__ import annotations

import dataclasses
import importlib
import sys
import time
from pathlib import Path
from typing import Callable

from . import harness

SUITES = {
    "gemm": "Triton GEMM library vs cuBLAS / torch._scaled_mm / the unfused eager chain",
    "ladder": "CUDA C++ GEMM ladder, rung by rung, vs the Triton GEMM and cuBLAS",
    "compiler": "tilefuse backend vs eager and Inductor on memory-bound graphs, with compile times",
    "models": "whole models (Hugging Face, vision), training and inference, vs eager and each Inductor mode",
    "attention": "Triton flash attention (fwd, bwd, GQA prefill, decode) vs SDPA's backends, FlexAttention, Inductor",
}
DEFAULT_OUT = Path("benchmarks/results")
TIME_LIMITED = {"models", "attention"}  # suites that take --time-limit


@dataclasses.dataclass
class SuiteOptions:
    quick: bool = False  # fewer shapes (the README's headline cases only)
    smoke: bool = False  # interpreter run on tiny shapes: proves the code path, times mean nothing
    only: tuple[str, ...] = ()  # keep cases whose name contains one of these
    warmup_ms: int = 25
    rep_ms: int = 100
    rows: int = 0  # compiler suite: rows of its 2-D graphs (0: the suite's own, 32768)
    mode: str = ""  # models suite: "train" or "infer" ("": both)
    dtype: str = ""  # models suite: "bf16", "fp16" or "fp32" ("": bf16 on a GPU, fp32 in a smoke run)
    batch: int = 0  # models suite: batch size (0: each model's own)
    backends: tuple[str, ...] = ()  # models suite: backends to run (eager is always added)
    time_limit: float = 0.0  # models / attention: wall seconds a row may take over its phases (0: the suite's own)
    warm: bool = True  # models suite: also time a warm compile (a second compile after a Dynamo reset)
    budget_s: float = 0.0  # attention suite: wall seconds for the whole suite (0: the suite's own)
    reduce_overhead: bool = False  # compiler suite: also time the forward + backward graphs under CUDA graphs
    log: Callable[[str], None] = print

    def __post_init__(self) -> None:
        from .. import device

        if self.smoke and not device.interpreting():
            # the smoke forms build CPU tensors for the interpreter, which a process running Triton on a GPU
            # refuses (or runs in ATen): every tilefuse row would be an error
            raise ValueError(f"--smoke: the suites' interpreter run (tiny shapes on CPU tensors); this process runs "
                             f"Triton on {device.current().describe()}: set TILEFUSE_INTERPRET=1 to run it here, or "
                             f"leave out --smoke to time the suites on the GPU")

    def wants(self, case: str) -> bool:
        """``--only``: a case whose name contains one of the texts, or is one given as ``=NAME``."""
        return not self.only or any(case == o[1:] if o.startswith("=") else o in case for o in self.only)

    def recorder(self, suite: str, *, compute_bound: bool) -> harness.Recorder:
        from .. import device

        ceil = device.ceilings()
        dev = device.current()
        if ceil is None and not self.smoke and dev.is_gpu and not dev.interpreter:
            # the CSV's pct_ceiling column needs them; a fresh machine (or cache dir) has none yet
            self.log(f"[bench] no measured ceilings for {dev.name} in the cache: measuring copy bandwidth and "
                     f"dense matmul rate (a few seconds) ...")
            ceil = device.measure_ceilings()
            self.log(f"[bench] ceilings: copy {ceil.copy_gbps / 1000:.2f} TB/s, bf16 matmul {ceil.bf16_tflops:.0f} "
                     f"TFLOP/s")
        return harness.Recorder(suite, ceiling_tflops=ceil.bf16_tflops if (ceil and compute_bound) else None,
                                ceiling_gbps=ceil.copy_gbps if (ceil and not compute_bound) else None,
                                warmup_ms=self.warmup_ms, rep_ms=self.rep_ms, smoke=self.smoke, log=self.log)


def add_arguments(p) -> None:
    p.add_argument("suites", nargs="+", metavar="SUITE", help=f"one or more of: {', '.join(SUITES)}")
    p.add_argument("--out", default=str(DEFAULT_OUT), help=f"folder for <suite>.csv (default {DEFAULT_OUT})")
    p.add_argument("--quick", action="store_true", help="headline shapes only")
    p.add_argument("--smoke", action="store_true", help="without a GPU: tiny shapes on the interpreter (times mean nothing)")
    p.add_argument("--only", action="append", default=[], metavar="TEXT", help="only cases whose name contains TEXT (repeatable); =NAME: the case of that name alone (softmax_fwd_bwd "
                        "also selects log_softmax_fwd_bwd, =softmax_fwd_bwd does not)")
    p.add_argument("--rep-ms", type=int, default=100, help="do_bench repetition time per measurement (ms)")
    p.add_argument("--rows", type=int, default=0, metavar="N",
                   help="compiler suite only: rows of its graphs (default 32768; each is N x 4096, cross-entropy N x 32000)")
    p.add_argument("--mode", choices=("train", "infer", "decode"), default="", help="models suite only: training, "
                   "inference, or a batch-1 decode step with a static KV cache (causal LMs); default all three")
    p.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default="", help="models suite only: the models' "
                   "dtype (training: autocast to it); default bf16, fp32 with --smoke")
    p.add_argument("--batch", type=int, default=0, metavar="N", help="models suite only: batch size (default each "
                   "model's own)")
    p.add_argument("--backends", default="", metavar="LIST", help="models suite only: comma-separated, from "
                   "eager,inductor,inductor-max-autotune,inductor-reduce-overhead,tilefuse,tilefuse-reduce-overhead")
    p.add_argument("--time-limit", type=float, default=0.0, metavar="SECONDS", help="models and attention suites: "
                   "wall seconds one row (a model x backend, a case x impl) may spend over its phases (compile, "
                   "accuracy, timing); past it the row is 'not run: exceeded ...' and the suite goes on (default: "
                   "no limit for models, the attention suite's own)")
    p.add_argument("--reduce-overhead", action="store_true", help="compiler suite only: also time each "
                   "forward + backward graph with mode='reduce-overhead' (impls inductor-reduce-overhead and "
                   "tilefuse-reduce-overhead: CUDA graphs), with their host time a step; small --rows make the "
                   "steps host-bound")
    p.add_argument("--no-warm", dest="warm", action="store_false", help="models suite only: skip the warm compile "
                   "(a second compile after a Dynamo reset, disk caches warm): half the compile time")
    p.add_argument("--budget", type=float, default=0.0, metavar="SECONDS", help="attention suite only: wall seconds "
                   "for the whole suite; the rows past it are 'not run' with that reason (default the suite's own)")


def suite_module(name: str):
    """The module of suite ``name``, loaded by name: suites import this runner for :class:`SuiteOptions`, so
    the runner reaches them only through the ``<name>_suite`` convention (no import cycle)."""
    if name not in SUITES:
        raise ValueError(f"unknown suite {name!r}: accepted values are {', '.join(SUITES)}")
    return importlib.import_module(f"tilefuse.bench.{name}_suite")


def run_suite(name: str, opts: SuiteOptions) -> list[harness.Row]:
    return suite_module(name).run(opts)


def main(args) -> int:
    from .. import device

    for name in args.suites:
        if name not in SUITES:
            raise ValueError(f"unknown suite {name!r}: accepted values are {', '.join(SUITES)}")
    rows = getattr(args, "rows", 0) or 0
    if rows and (rows < 1 or args.smoke or set(args.suites) != {"compiler"}):
        raise ValueError(f"--rows {rows}: accepted for the compiler suite alone, without --smoke, as a positive row "
                         f"count (got suites {', '.join(args.suites)})")
    models_only = {"mode": getattr(args, "mode", ""), "dtype": getattr(args, "dtype", ""),
                   "batch": getattr(args, "batch", 0), "backends": getattr(args, "backends", ""),
                   "no-warm": not getattr(args, "warm", True)}
    given = [f"--{k}" for k, v in models_only.items() if v]
    if given and set(args.suites) != {"models"}:
        raise ValueError(f"{', '.join(given)}: accepted for the models suite alone (got suites {', '.join(args.suites)})")
    time_limit = getattr(args, "time_limit", 0.0) or 0.0
    if time_limit and (time_limit < 0 or not set(args.suites) <= TIME_LIMITED):
        raise ValueError(f"--time-limit {time_limit:g}: accepted as positive seconds for the "
                         f"{' and '.join(sorted(TIME_LIMITED))} suites (got suites {', '.join(args.suites)})")
    reduce_overhead = bool(getattr(args, "reduce_overhead", False))
    if reduce_overhead and set(args.suites) != {"compiler"}:
        raise ValueError(f"--reduce-overhead: accepted for the compiler suite alone (got suites "
                         f"{', '.join(args.suites)})")
    budget = getattr(args, "budget", 0.0) or 0.0
    if budget and (budget < 0 or set(args.suites) != {"attention"}):
        raise ValueError(f"--budget {budget:g}: accepted as positive seconds for the attention suite alone "
                         f"(got suites {', '.join(args.suites)})")
    if models_only["batch"] and models_only["batch"] < 1:
        raise ValueError(f"--batch {models_only['batch']}: accepted values are positive batch sizes")
    backends = tuple(b for b in models_only["backends"].split(",") if b)
    if backends:
        accepted = suite_module("models").BACKENDS
        unknown = [b for b in backends if b not in accepted]
        if unknown:
            raise ValueError(f"--backends: unknown {', '.join(unknown)}; accepted values are {', '.join(accepted)}")
    dev = device.current()
    if (not dev.is_gpu or dev.interpreter) and not args.smoke:
        print(f"tilefuse bench: not run: {dev.describe()}; timings need a GPU "
              "(--smoke runs tiny shapes on the interpreter to check the suites' code, with no timing value)",
              file=sys.stderr)
        return 1
    opts = SuiteOptions(quick=args.quick, smoke=args.smoke, only=tuple(args.only), rep_ms=args.rep_ms, rows=rows,
                        mode=models_only["mode"], dtype=models_only["dtype"], batch=models_only["batch"],
                        backends=backends, time_limit=time_limit, budget_s=budget, warm=not models_only["no-warm"],
                        reduce_overhead=reduce_overhead)
    status = 0
    for name in args.suites:
        print(f"== bench {name}: {SUITES[name]} on {dev.describe()}", flush=True)
        start = time.perf_counter()
        stem = f"{name}{'-smoke' if args.smoke else ''}"
        partial = Path(args.out) / f"{stem}.partial.csv"
        partial.unlink(missing_ok=True)
        harness.PARTIAL_PATH = partial
        try:
            rows = run_suite(name, opts)
        finally:
            harness.PARTIAL_PATH = None
        path = harness.write_csv(rows, Path(args.out) / f"{stem}.csv")
        partial.unlink(missing_ok=True)  # the whole suite ran: its CSV replaces the partial one
        bad = [r for r in rows if r.status.startswith(("error", "wrong"))]
        print(f"== {name}: {len(rows)} rows ({len(bad)} error/wrong) in {time.perf_counter() - start:.0f} s -> {path}",
              flush=True)
        status = status or (1 if bad else 0)
    return status
