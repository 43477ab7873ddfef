"""``tilefuse bench ladder``: the CUDA C++ GEMM ladder rung by rung, the Triton GEMM and cuBLAS, one run.

Cases, bf16, every output checked against a float32 reference before it is timed:

- ``mm/bfloat16/4096x4096x4096``, ``.../8192x8192x8192`` (the issue's bar: the best rung >= 1.00x cuBLAS at
  both) and ``.../16384x4096x4096`` (an LLM projection: 16k tokens, hidden 4096);
- ``mm/bfloat16/16x8192x8192``: a decode-time projection (small M, long K), the split-K rung 5s's case.

Implementations: ``cublas`` (``torch.matmul(a, b)``, B row-major [K, N]: the baseline of rungs 1-6 and of
the Triton GEMM), ``cublas_nt`` (``torch.matmul(a, w.t())``: B as the transposed view of a row-major [N, K]
weight, the layout rungs 7-9 read (K-major), their baseline), ``triton`` (``tilefuse.linalg.gemm``) and
``rung1`` ... ``rung9``, ``rung5s`` (``tilefuse.cuda.gemm``; rungs 1-6 and 5s get the row-major B, 7-9 the
K-major view, so no rung pays for a copy). ``vs_baseline`` is cuBLAS time / rung time on the same operands,
``pct_ceiling`` the share of the measured bf16 matmul ceiling (``tilefuse info --measure``).

Slow rungs are not timed where one call would take seconds: rungs 1-3 (no tensor cores, little reuse) at
4096^3 and the decode shape only, with a short repetition; rung 5s (split-K: no reuse of B across row groups)
at the decode shape only. Their other rows say so. The note of each rung row gives what it adds and its lines
of code (the rung's file, and the shared headers it includes).

Builds come first, all rungs in parallel for the GPU found (nvcc on the GPU machine; cached, so a second run
starts at once). ``opts.smoke`` (CI, no GPU): every GPU row is written as "not run: no GPU", and the emulated
rungs (1-6, 5s) are run and timed on the CPU emulator at a tiny size to prove the code path (times mean
nothing).
"""
from __future__ import annotations

import time
from typing import Callable

import torch

from . import harness
from .runner import SuiteOptions

SHAPES = ((4096, 4096, 4096), (8192, 8192, 8192), (16384, 4096, 4096), (16, 8192, 8192))
QUICK_SHAPES = SHAPES[:2]
SMOKE_SHAPE = (16, 64, 64)
DTYPE = torch.bfloat16
SLOW_RUNGS = {"1": (4096, 4096, 4096), "2": (4096, 4096, 4096), "3": (4096, 4096, 4096)}  # largest timed shape
SKINNY_ONLY = {"5s"}
DECODE = (16, 8192, 8192)
SLOW_REP_MS = 20  # a rung-1 call at 4096^3 takes ~0.1-0.3 s: do_bench then runs a handful of calls
CHECK_TOLERANCE = 3e-2  # a sanity bound for bf16 (garbage, poison, a wrong layout); tests hold the tight ones
LADDER_TUNING_BUDGET_S = 40.0  # the Triton GEMM's first-use tuning, of the suite's 3 minutes


def _shape(m, n, k) -> str:
    return f"{m}x{n}x{k}"


def _checker(fn: Callable[[], torch.Tensor], ref: torch.Tensor, tol: float = CHECK_TOLERANCE):
    def check():
        err = harness.rel_error(fn(), ref)
        return None if err <= tol else f"relative error {err:.3g} > {tol:g}"
    return check


def _rung_note(r) -> str:
    own = r.lines_of_code()
    shared = r.lines_of_code(with_headers=True) - own
    return f"{r.title}; {own} lines of code" + (f" (+{shared} in shared headers)" if shared else "")


def _kmajor(r) -> bool:
    """Rungs 7-9 (sm_90a) read B K-major: they get the transposed view of the (N, K) weight."""
    return r.arch == "sm_90a"


def baseline(r) -> str:
    """The cuBLAS row rung ``r`` is timed against: ``cublas_nt`` (the same K-major B) for a K-major rung."""
    return "cublas_nt" if _kmajor(r) else "cublas"


def _timed_here(name: str, shape) -> str | None:
    """None when rung ``name`` is timed at ``shape``, else why not."""
    m, n, k = shape
    if name in SKINNY_ONLY and shape != DECODE:
        return f"rung {name} (split-K over one warp's lanes, no reuse of B across row groups) is timed at the " \
               f"decode shape {_shape(*DECODE)} only"
    if name in SLOW_RUNGS and shape != DECODE and m * n * k > _volume(SLOW_RUNGS[name]):
        return f"slow rung (no tensor cores, little reuse): timed at {_shape(*SLOW_RUNGS[name])} and the decode " \
               "shape only"
    return None


def _raise(exc: BaseException):
    raise exc


def _volume(shape) -> int:
    m, n, k = shape
    return m * n * k


def _build_all(opts: SuiteOptions, cap) -> dict:
    """Every rung's library for this GPU, built in parallel: name -> Build or the error."""
    from ..cuda import build, rungs

    reqs, out = [], {}
    for r in rungs():
        try:
            reqs.append((r, build.device_target(r, cap)))
        except ValueError as exc:
            out[r.name] = exc
    start = time.perf_counter()
    for (r, _), res in zip(reqs, build.build_many(reqs)):
        out[r.name] = res
    fresh = sum(1 for v in out.values() if isinstance(v, build.Build) and not v.cached)
    opts.log(f"  [ladder] {len(reqs)} rung libraries ready in {time.perf_counter() - start:.1f} s "
             f"({fresh} built, the rest from the cache)")
    return out


def run_gpu(rec: harness.Recorder, opts: SuiteOptions) -> None:
    from .. import device
    from ..cuda import build, gemm as ladder_gemm, rungs
    from ..linalg import gemm as triton_gemm

    dev = device.torch_device()
    cap = torch.cuda.get_device_capability(dev)
    libs = _build_all(opts, cap)
    shapes = QUICK_SHAPES if opts.quick else SHAPES
    for m, n, k in shapes:
        shape = _shape(m, n, k)
        case = f"mm/bfloat16/{shape}"
        if not opts.wants(case):
            continue
        per_set = (m * k + 2 * k * n + m * n) * DTYPE.itemsize
        nsets = harness.rotation_sets(per_set, device.current().l2_bytes or (60 << 20))
        sets = []
        for _ in range(nsets):
            a = torch.randn(m, k, device=dev, dtype=DTYPE)
            w = torch.randn(n, k, device=dev, dtype=DTYPE)  # the (N, K) weight; B = w.t()
            sets.append((a, w.t().contiguous(), w))
        a, b, w = sets[0]
        ref = a.float() @ b.float()
        flops, moved = 2.0 * m * n * k, (m * k + k * n + m * n) * DTYPE.itemsize
        timing = dict(flops=flops, bytes_moved=moved)
        common = dict(dtype=DTYPE, shape=shape, **timing)
        # cuBLAS, the Triton GEMM and the fast rungs in interleaved rounds (a clock drift at the power limit falls on
        # all of them alike: timed one after another, cuBLAS at 8192^3 read 686 TFLOP/s in the suite and 793 in a
        # sweep of the same session; docs/decisions/011-interleaved-timing.md); the slow rungs after them, alone, with
        # a short repetition
        entries = [
            ("cublas", harness.Rotating(lambda a, b, w: torch.matmul(a, b), sets),
             dict(check=_checker(lambda: torch.matmul(a, b), ref), note="torch.matmul, B [K,N] row-major", **timing)),
            ("cublas_nt", harness.Rotating(lambda a, b, w: torch.matmul(a, w.t()), sets),
             dict(check=_checker(lambda: torch.matmul(a, w.t()), ref),
                  note="torch.matmul(a, w.t()), B K-major as rungs 7-9 read it", **timing)),
            ("triton", harness.Rotating(lambda a, b, w: triton_gemm(a, b), sets),
             dict(baseline="cublas", check=_checker(lambda: triton_gemm(a, b), ref),
                  note="tilefuse.linalg.gemm (Triton)", **timing)),
        ]
        slow_entries = []
        for r in rungs():
            impl = f"rung{r.name}"
            built = libs.get(r.name)
            if isinstance(built, Exception):
                if isinstance(built, build.BuildError):  # an error row that carries the compiler's message
                    rec.time(case, impl, lambda exc=built: _raise(exc), note=_rung_note(r), **common)
                else:
                    rec.skip(case, impl, str(built).splitlines()[0][:200], dtype=DTYPE, shape=shape)
                continue
            why = _timed_here(r.name, (m, n, k))
            if why:
                rec.skip(case, impl, why, dtype=DTYPE, shape=shape)
                continue
            kmajor = _kmajor(r)

            def call(a, b, w, name=r.name, kmajor=kmajor):
                return ladder_gemm(a, w.t() if kmajor else b, rung=name)
            slow = r.name in SLOW_RUNGS
            entry = (impl, harness.Rotating(call, sets),
                     dict(baseline=baseline(r), check=_checker(lambda c=call: c(a, b, w), ref),
                          note=_rung_note(r) + ("; slow rung: short repetition" if slow else ""), **timing))
            (slow_entries if slow else entries).append(entry)
        rec.time_interleaved(case, entries, dtype=DTYPE, shape=shape)
        saved = rec.rep_ms
        rec.rep_ms = SLOW_REP_MS
        try:
            for impl, fn, kw in slow_entries:
                rec.time(case, impl, fn, dtype=DTYPE, shape=shape, **kw)
        finally:
            rec.rep_ms = saved
        del sets, ref, a, b, w
        torch.cuda.empty_cache()


def run_smoke(rec: harness.Recorder, opts: SuiteOptions) -> None:
    """No GPU: the GPU rows as not run, and the emulated rungs timed on the CPU at a tiny size."""
    from ..cuda import build, gemm as ladder_gemm, rungs

    for shape in SHAPES:
        case = f"mm/bfloat16/{_shape(*shape)}"
        if not opts.wants(case):
            continue
        for impl in ["cublas", "cublas_nt", "triton"] + [f"rung{r.name}" for r in rungs()]:
            rec.skip(case, impl, "no GPU", dtype=DTYPE, shape=_shape(*shape))
    m, n, k = SMOKE_SHAPE
    case = f"emulated/bfloat16/{_shape(m, n, k)}"
    if not opts.wants(case):
        return
    a = torch.randn(m, k, dtype=DTYPE)
    b = torch.randn(k, n, dtype=DTYPE)
    ref = a.float() @ b.float()
    common = dict(dtype=DTYPE, shape=_shape(m, n, k), flops=2.0 * m * n * k)
    rec.time(case, "torch_cpu", lambda: torch.matmul(a, b), check=_checker(lambda: torch.matmul(a, b), ref),
             note="torch.matmul on the CPU", **common)
    usable = [r for r in rungs() if r.emulate] if build.host_compiler() else []
    for r in rungs():
        if r not in usable:
            rec.skip(case, f"rung{r.name}", f"needs a GPU ({r.arch})" if not r.emulate else "no host C++ compiler",
                     dtype=DTYPE, shape=_shape(m, n, k))
            continue

        def call(name=r.name):
            return ladder_gemm(a, b, rung=name)
        rec.time(case, f"rung{r.name}", call, baseline="torch_cpu", check=_checker(call, ref),
                 note=f"CPU SIMT emulator (host build of the same source); {_rung_note(r)}", **common)


def run(opts: SuiteOptions) -> list[harness.Row]:
    from .. import device

    rec = opts.recorder("ladder", compute_bound=True)
    dev = device.current()
    if opts.smoke or not (dev.is_gpu and dev.vendor == "nvidia") or dev.interpreter:
        if not opts.smoke:
            opts.log(f"  [ladder] not on an NVIDIA GPU ({dev.describe()}): GPU rows not run")
        run_smoke(rec, opts)
        return rec.finish()
    from ..kernels.gemm import tuning as gemm_tuning

    start = time.perf_counter()
    gemm_tuning.set_budget(LADDER_TUNING_BUDGET_S)
    try:
        run_gpu(rec, opts)
    finally:
        gemm_tuning.set_budget(None)
    opts.log(f"  [ladder] done in {time.perf_counter() - start:.0f} s")
    return rec.finish()
