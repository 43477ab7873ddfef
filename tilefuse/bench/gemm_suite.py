"""``tilefuse bench gemm``: the Triton GEMM library against cuBLAS, torch._scaled_mm and the eager chain.

Cases (every implementation's output is checked against a float32 reference before it is timed):

- ``mm/<dtype>/MxNxK``: ``tilefuse.gemm(a, b)`` vs cuBLAS (``torch.matmul``), bf16 and fp16, on square
  1024..8192, LLM prefill (M = 16384) and decode/skinny (M in 1..256, N = K = 8192) shapes.
- ``bias_gelu/bf16/...``: GEMM + bias + exact GeLU fused vs the unfused eager chain
  ``gelu(matmul(a, b) + bias)`` (baseline), with ``gelu(addmm(bias, a, b))`` as a second peer.
- ``bias_gelu_fp8q/bf16/...``: the same + per-row fp8 e4m3 quantisation of the output (codes and scales)
  vs the eager chain ending in ``abs().amax(1)``, ``/ scale``, ``clamp``, ``.to(float8_e4m3fn)``.
- ``fp8_rowwise/e4m3/...``: fp8 x fp8 -> bf16 with per-row/per-column scales vs ``torch._scaled_mm``
  (baseline: its default accumulation; its ``use_fast_accum=True`` is timed too: Triton's fp8 dot on
  sm_90 accumulates like that).
- ``int8/...``: int8 x int8 -> int32 vs ``torch._int_mm``; ``tf32/...``: fp32 with tf32 allowed vs cuBLAS
  (``tf32_nt/...``: B K-major).

``opts.quick``: the headline shapes; ``opts.smoke``: tiny shapes on the interpreter (fp16, since the
interpreter's bf16 dot is broken), proving the code path only.

Run as a module for the tuning sweep the lead uses to inform the config spaces (one device call)::

    python -m tilefuse.bench.gemm_suite --sweep [--shape 4096x4096x4096 ...] [--dtype bfloat16] [--all]
        [--config P128x256x64-w8-s3-tma,P128x256x64-w8-s3-tma-sk] [--rounds 4]
    python -m tilefuse.bench.gemm_suite --resources      # no GPU: registers/spills/smem of each candidate
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Callable

import torch

from . import harness
from .runner import SuiteOptions

SQUARES = (1024, 2048, 4096, 8192)
SWEEP_ROUNDS = 4
PREFILL_M = 16384
PREFILL_NK = ((4096, 4096), (14336, 4096), (4096, 14336), (28672, 8192), (8192, 28672))
DECODE_MS = (1, 16, 64, 128, 256)
DECODE_NK = 8192
FUSED_HEADLINE = ((8192, 8192, 1024), (16384, 4096, 1024))  # the fusion bars
FP8_SHAPES = ((4096, 4096, 4096), (8192, 8192, 8192), (2048, 2048, 2048), (PREFILL_M, 4096, 4096))
INT8_SHAPES = ((4096, 4096, 4096), (8192, 8192, 8192))
TF32_SHAPES = ((4096, 4096, 4096),)
QUICK_GEMM = ((4096, 4096, 4096), (8192, 8192, 8192), (PREFILL_M, 4096, 4096), (1, 8192, 8192), (128, 8192, 8192))
SMOKE_SHAPES = ((64, 48, 40), (1, 33, 24), (37, 70, 19))
# a sanity bound (garbage, poison, a wrong layout), not a precision test: tests/ hold the tight bounds
CHECK_TOLERANCE = {torch.float16: 5e-3, torch.bfloat16: 3e-2, torch.float32: 5e-3, "fp8": 8e-2, "int": 0.0}
FP8_MAX = 448.0  # float8_e4m3fn


def gemm_shapes(opts: SuiteOptions) -> list[tuple[int, int, int]]:
    if opts.smoke:
        return list(SMOKE_SHAPES)
    if opts.quick:
        return list(QUICK_GEMM)
    return ([(n, n, n) for n in SQUARES] + [(PREFILL_M, n, k) for n, k in PREFILL_NK]
            + [(m, DECODE_NK, DECODE_NK) for m in DECODE_MS])


def fused_shapes(opts: SuiteOptions) -> list[tuple[int, int, int]]:
    if opts.smoke:
        return list(SMOKE_SHAPES[:2])
    if opts.quick:
        return list(FUSED_HEADLINE) + [(1, 8192, 8192)]
    return list(FUSED_HEADLINE) + [s for s in gemm_shapes(opts) if s not in FUSED_HEADLINE]


def _shape(m, n, k) -> str:
    return f"{m}x{n}x{k}"


def _checker(fn: Callable, ref: torch.Tensor, tol: float) -> Callable[[], str | None]:
    def check():
        err = harness.rel_error(fn(), ref)
        return None if err <= tol else f"relative error {err:.3g} > {tol:g}"
    return check


def _sets(bytes_per_set: int, smoke: bool) -> int:
    if smoke:
        return 1
    from .. import device

    return harness.rotation_sets(bytes_per_set, device.current().l2_bytes or (60 << 20))


def _free() -> None:
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# -------------------------------------------------------------------------------------------- cases
def run_mm(rec: harness.Recorder, opts: SuiteOptions, dev, dtype: torch.dtype) -> None:
    import tilefuse

    name = str(dtype).replace("torch.", "")
    for m, n, k in gemm_shapes(opts):
        case = f"mm/{name}/{_shape(m, n, k)}"
        if not opts.wants(case):
            continue
        nsets = _sets((m * k + k * n + m * n) * dtype.itemsize, opts.smoke)
        sets = [(torch.randn(m, k, device=dev, dtype=dtype), torch.randn(k, n, device=dev, dtype=dtype))
                for _ in range(nsets)]
        a, b = sets[0]
        ref = a.float() @ b.float()
        tol = CHECK_TOLERANCE[dtype]
        flops, moved = 2.0 * m * n * k, (m * k + k * n + m * n) * dtype.itemsize
        # interleaved rounds: a clock drift over the case (power limit) falls on both alike
        rec.time_interleaved(case, [
            ("cublas", harness.Rotating(torch.matmul, sets),
             dict(flops=flops, bytes_moved=moved, check=_checker(lambda: torch.matmul(a, b), ref, tol))),
            ("tilefuse", harness.Rotating(tilefuse.gemm, sets),
             dict(flops=flops, bytes_moved=moved, baseline="cublas", check=_checker(lambda: tilefuse.gemm(a, b), ref, tol))),
        ], dtype=dtype, shape=_shape(m, n, k))
        del sets, ref
        _free()


def _eager_bias_gelu(a, b, bias):
    return torch.nn.functional.gelu(torch.matmul(a, b) + bias)


def _addmm_gelu(a, b, bias):
    return torch.nn.functional.gelu(torch.addmm(bias, a, b))


def _eager_fp8_quant(a, b, bias):
    y = torch.nn.functional.gelu(torch.matmul(a, b) + bias).float()
    scale = y.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / FP8_MAX
    return (y / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), scale


def _quant_checker(fn, ref_value: torch.Tensor) -> Callable[[], str | None]:
    ref_scale = ref_value.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / FP8_MAX

    def check():
        q, s = fn()
        err = harness.rel_error(q.float() * s.float(), ref_value)
        serr = ((s.float().reshape(ref_scale.shape) - ref_scale).abs() / ref_scale).max().item()
        if err > CHECK_TOLERANCE["fp8"] or serr > 2e-2:
            return f"dequantised error {err:.3g}, scale error {serr:.3g}"
        return None
    return check


def run_fused(rec: harness.Recorder, opts: SuiteOptions, dev, dtype: torch.dtype) -> None:
    import tilefuse

    name = str(dtype).replace("torch.", "")
    for m, n, k in fused_shapes(opts):
        shape = _shape(m, n, k)
        want_gelu, want_q = opts.wants(f"bias_gelu/{name}/{shape}"), opts.wants(f"bias_gelu_fp8q/{name}/{shape}")
        if not (want_gelu or want_q):
            continue
        nsets = _sets((m * k + k * n + m * n) * dtype.itemsize, opts.smoke)
        sets = [(torch.randn(m, k, device=dev, dtype=dtype), torch.randn(k, n, device=dev, dtype=dtype),
                 torch.randn(n, device=dev, dtype=dtype)) for _ in range(nsets)]
        a, b, bias = sets[0]
        ref = torch.nn.functional.gelu(a.float() @ b.float() + bias.float())
        flops = 2.0 * m * n * k
        tol = CHECK_TOLERANCE[dtype]
        if want_gelu:
            case = f"bias_gelu/{name}/{shape}"
            moved = (m * k + k * n + m * n) * dtype.itemsize

            def ours(a, b, bias):
                return tilefuse.gemm(a, b, bias=bias, activation="gelu")
            # interleaved rounds, as the plain rows: a clock drift over the case falls on all three alike
            rec.time_interleaved(case, [
                ("eager", harness.Rotating(_eager_bias_gelu, sets),
                 dict(flops=flops, bytes_moved=moved, check=_checker(lambda: _eager_bias_gelu(a, b, bias), ref, tol))),
                ("addmm+gelu", harness.Rotating(_addmm_gelu, sets),
                 dict(flops=flops, bytes_moved=moved, baseline="eager",
                      check=_checker(lambda: _addmm_gelu(a, b, bias), ref, tol))),
                ("tilefuse", harness.Rotating(ours, sets),
                 dict(flops=flops, bytes_moved=moved, baseline="eager",
                      check=_checker(lambda: ours(a, b, bias), ref, tol))),
            ], dtype=dtype, shape=shape)
        if want_q:
            case = f"bias_gelu_fp8q/{name}/{shape}"
            moved = (m * k + k * n) * dtype.itemsize + m * n

            def ours_q(a, b, bias):
                return tilefuse.gemm(a, b, bias=bias, activation="gelu", quantize="fp8_e4m3")
            rec.time_interleaved(case, [
                ("eager", harness.Rotating(_eager_fp8_quant, sets),
                 dict(flops=flops, bytes_moved=moved, check=_quant_checker(lambda: _eager_fp8_quant(a, b, bias), ref))),
                ("tilefuse", harness.Rotating(ours_q, sets),
                 dict(flops=flops, bytes_moved=moved, baseline="eager",
                      check=_quant_checker(lambda: ours_q(a, b, bias), ref), note="fp8 e4m3 codes + per-row scales")),
            ], dtype=dtype, shape=shape)
        del sets, ref
        _free()


def _has_scaled_mm(dev) -> bool:
    return dev.type == "cuda" and hasattr(torch, "_scaled_mm")


def run_fp8(rec: harness.Recorder, opts: SuiteOptions, dev) -> None:
    import tilefuse

    shapes = SMOKE_SHAPES[:1] if opts.smoke else (FP8_SHAPES[:2] if opts.quick else FP8_SHAPES)
    f8 = torch.float8_e4m3fn
    for m, n, k in shapes:
        shape = _shape(m, n, k)
        case = f"fp8_rowwise/e4m3/{shape}"
        if not opts.wants(case):
            continue
        nsets = _sets(m * k + k * n + 2 * m * n, opts.smoke)
        sets = []
        for _ in range(nsets):
            a = torch.randn(m, k, device=dev).to(f8)
            b = torch.randn(n, k, device=dev).to(f8).t()  # column-major, as torch._scaled_mm wants
            sa = torch.rand(m, 1, device=dev) * 0.1 + 0.01
            sb = torch.rand(1, n, device=dev) * 0.1 + 0.01
            sets.append((a, b, sa, sb))
        a, b, sa, sb = sets[0]
        ref = (a.float() * sa) @ (b.float() * sb)
        flops, moved = 2.0 * m * n * k, m * k + k * n + 2 * m * n
        tol = CHECK_TOLERANCE[torch.bfloat16]

        def ours(a, b, sa, sb):
            return tilefuse.gemm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
        if _has_scaled_mm(dev):
            def peer(a, b, sa, sb, fast=False):
                return torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16, use_fast_accum=fast)
            rec.time(case, "scaled_mm", harness.Rotating(peer, sets), dtype="float8_e4m3fn", shape=shape, flops=flops,
                     bytes_moved=moved, check=_checker(lambda: peer(a, b, sa, sb), ref, tol))
            rec.time(case, "scaled_mm_fast_accum", harness.Rotating(lambda *s: peer(*s, fast=True), sets),
                     dtype="float8_e4m3fn", shape=shape, flops=flops, bytes_moved=moved, baseline="scaled_mm",
                     check=_checker(lambda: peer(a, b, sa, sb, True), ref, tol))
        else:
            rec.skip(case, "scaled_mm", "torch._scaled_mm needs a CUDA fp8 GPU", dtype="float8_e4m3fn", shape=shape)
        rec.time(case, "tilefuse", harness.Rotating(ours, sets), dtype="float8_e4m3fn", shape=shape, flops=flops,
                 bytes_moved=moved, baseline="scaled_mm", check=_checker(lambda: ours(a, b, sa, sb), ref, tol),
                 note="triton's sm_90 fp8 dot accumulates like use_fast_accum=True")
        del sets, ref
        _free()


def run_int8(rec: harness.Recorder, opts: SuiteOptions, dev) -> None:
    import tilefuse

    shapes = ((64, 48, 64),) if opts.smoke else (INT8_SHAPES[:1] if opts.quick else INT8_SHAPES)
    for m, n, k in shapes:
        shape = _shape(m, n, k)
        case = f"int8/{shape}"
        if not opts.wants(case):
            continue
        a = torch.randint(-8, 8, (m, k), device=dev, dtype=torch.int8)
        b = torch.randint(-8, 8, (n, k), device=dev, dtype=torch.int8).t()
        ref = (a.double() @ b.double())
        flops, moved = 2.0 * m * n * k, m * k + k * n + 4 * m * n

        def exact(fn):
            def check():
                out = fn()
                return None if torch.equal(out.double(), ref) else "int32 result differs from the exact product"
            return check
        if dev.type == "cuda":
            rec.time(case, "int_mm", lambda: torch._int_mm(a, b), dtype="int8", shape=shape, flops=flops,
                     bytes_moved=moved, check=exact(lambda: torch._int_mm(a, b)))
        else:
            rec.skip(case, "int_mm", "torch._int_mm timed on CUDA only", dtype="int8", shape=shape)
        rec.time(case, "tilefuse", lambda: tilefuse.gemm(a, b), dtype="int8", shape=shape, flops=flops,
                 bytes_moved=moved, baseline="int_mm", check=exact(lambda: tilefuse.gemm(a, b)))
        _free()


def run_tf32(rec: harness.Recorder, opts: SuiteOptions, dev) -> None:
    import tilefuse

    if opts.smoke:
        return
    for (m, n, k), layout in ((shape, layout) for shape in TF32_SHAPES for layout in ("nn", "nt")):
        shape = _shape(m, n, k)
        case = f"tf32/{shape}" if layout == "nn" else f"tf32_nt/{shape}"
        if not opts.wants(case):
            continue
        a = torch.randn(m, k, device=dev)
        # nt: B K-major, as nn.Linear's weight.T (tf32 wgmma reads it as it is; an N-major B is copied first)
        b = torch.randn(n, k, device=dev).t() if layout == "nt" else torch.randn(k, n, device=dev)
        ref = (a.double() @ b.double()).float()
        saved = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = True
        try:
            flops, moved = 2.0 * m * n * k, 4 * (m * k + k * n + m * n)
            rec.time(case, "cublas", lambda: torch.matmul(a, b), dtype="tf32", shape=shape, flops=flops,
                     bytes_moved=moved, check=_checker(lambda: torch.matmul(a, b), ref, 5e-3))
            rec.time(case, "tilefuse", lambda: tilefuse.gemm(a, b), dtype="tf32", shape=shape, flops=flops,
                     bytes_moved=moved, baseline="cublas", check=_checker(lambda: tilefuse.gemm(a, b), ref, 5e-3))
        finally:
            torch.backends.cuda.matmul.allow_tf32 = saved
        del ref
        _free()


SUITE_TUNING_BUDGET_S = 170.0  # of the 5-minute budget for the whole suite from an empty cache; ~70 s of it
# is timing the 150 rows and ~20 s start-up and references. Past it, keys run untuned (logged).


def run(opts: SuiteOptions) -> list[harness.Row]:
    from .. import device
    from ..kernels.gemm import tuning as gemm_tuning

    rec = opts.recorder("gemm", compute_bound=True)
    dev = device.torch_device()
    start = time.perf_counter()
    # The interpreter's bf16 dot is broken (triton 3.6): a smoke run uses fp16 for every 16-bit case.
    first, second = (torch.float16, None) if opts.smoke else (torch.bfloat16, torch.float16)
    gemm_tuning.set_budget(None if opts.smoke else SUITE_TUNING_BUDGET_S)
    try:
        # Order matters from an empty cache: the plain bf16 GEMM of each bucket is tuned over the space,
        # then fp16 and the fused variants reuse its ranking (gemm_tuning.related_candidates). fp8 comes
        # early: it has a bar of its own and no related key to learn from.
        run_mm(rec, opts, dev, first)
        opts.log(f"  [gemm] mm {first} done at {time.perf_counter() - start:.0f} s")
        run_fp8(rec, opts, dev)
        if second is not None:
            run_mm(rec, opts, dev, second)
            opts.log(f"  [gemm] mm {second} done at {time.perf_counter() - start:.0f} s")
        run_fused(rec, opts, dev, first)
        opts.log(f"  [gemm] fused done at {time.perf_counter() - start:.0f} s")
        run_int8(rec, opts, dev)
        run_tf32(rec, opts, dev)
        opts.log(f"  [gemm] all cases done at {time.perf_counter() - start:.0f} s "
                 f"(tuning {gemm_tuning._spent_s:.0f} s{'' if gemm_tuning.budget_left() else ', budget spent'})")
    finally:
        gemm_tuning.set_budget(None)
    return rec.finish()


# ------------------------------------------------------------------------------------ sweep (GPU)
SWEEP_SHAPES = ((4096, 4096, 4096), (8192, 8192, 8192), (PREFILL_M, 4096, 4096), (1024, 1024, 1024),
                (1, 8192, 8192), (16, 8192, 8192), (128, 8192, 8192), (256, 8192, 8192))


def _parse_shape(text: str) -> tuple[int, int, int]:
    try:
        m, n, k = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise SystemExit(f"--shape {text!r}: expected MxNxK, e.g. 4096x4096x4096") from None
    return m, n, k


def sweep(shapes, dtype: torch.dtype, all_classes: bool, out: Path | None, rep_ms: int,
          labels: list[str] | None = None, rounds: int = SWEEP_ROUNDS, layout: str = "nn",
          extra: list[str] | None = None) -> list[dict]:
    """Time every candidate config (of the shape's class, or of every class; or those named in ``labels``)
    against cuBLAS. cuBLAS and the configs are timed in ``rounds`` interleaved rounds, each round a
    do_bench of ``rep_ms / rounds`` per entry in an order rotated by one, and each entry scored by the
    median of its rounds' medians: on a GPU at its power limit the clocks drift through a sweep, and a
    config timed a minute after cuBLAS would carry that drift in its ratio. ``layout``: "nn" (A and B
    row-major), "nt" (B K-major, nn.Linear's ``weight.T``), "tn" (A M-major), "tt". ``extra``: labels of
    configs outside the spaces (``GemmConfig.from_label``), timed beside the others where they fit."""
    import dataclasses
    import statistics

    from .. import device
    from ..kernels import gemm
    from ..kernels.gemm import configs as gemm_configs, launching as gemm_launching, tuning as gemm_tuning

    dev = device.current()
    if not dev.is_gpu or dev.interpreter:
        raise SystemExit(f"--sweep needs a GPU ({dev.describe()}); --resources runs without one")
    part = gemm_configs.current_part()
    extra_cfgs = [gemm_configs.GemmConfig.from_label(x) for x in extra or ()]  # a bad label fails before any work
    results = []
    for m, n, k in shapes:
        a = torch.randn(k, m, device="cuda", dtype=dtype).t() if layout[0] == "t" else \
            torch.randn(m, k, device="cuda", dtype=dtype)
        b = torch.randn(n, k, device="cuda", dtype=dtype).t() if layout[1] == "t" else \
            torch.randn(k, n, device="cuda", dtype=dtype)
        ops = gemm.prepare(a, b)
        cfgs = gemm_configs.candidates(ops.problem, part)
        if all_classes or labels:
            spaces = gemm_configs.SPACES_4B if ops.problem.in_bytes == 4 else gemm_configs.SPACES
            for cls in spaces[part.vendor].values():
                probe = dataclasses.replace(ops.problem)
                for c in cls:
                    c = gemm_configs.fill_split_k(gemm_configs.fill_block_m(c, probe), probe, part)
                    if c.tma and not gemm_configs.tma_allowed(part):
                        continue
                    if gemm_configs.fits_shape(c, probe) and gemm_configs.smem_estimate(c, probe) <= part.smem_bytes:
                        cfgs.append(c)
            cfgs = gemm_configs.unique(cfgs)
        if labels:
            known = {c.label(): c for c in cfgs}
            missing = [x for x in labels if x not in known]
            if missing:
                raise SystemExit(f"--config {', '.join(missing)}: not a config of {_shape(m, n, k)} here; "
                                 f"its configs: {', '.join(known)}")
            cfgs = [known[x] for x in labels]
        for c in extra_cfgs:
            if not gemm_configs.fits_shape(c, ops.problem) or gemm_configs.smem_estimate(c, ops.problem) > part.smem_bytes:
                print(f"--extra {c.label()}: does not fit {_shape(m, n, k)} on this part (shape or shared memory); "
                      "not timed", flush=True)
            elif c not in cfgs:
                cfgs.append(c)
        t0 = time.perf_counter()
        failed = gemm_tuning.compile_all(ops, cfgs)
        compile_s = time.perf_counter() - t0
        ref = a.float() @ b.float()
        rows, entries = [], [("cuBLAS", lambda: torch.matmul(a, b))]
        for cfg in cfgs:
            if cfg in failed:
                rows.append({"config": cfg.label(), "ms": None, "error": failed[cfg]})
                continue
            try:
                scratch = gemm.scratch_operands(ops)
                run = gemm_launching.bound(scratch, cfg)  # the kept launcher, as a plan replays it (no JIT a call)
                run()
                rows.append({"config": cfg.label(), "rel_error": harness.rel_error(scratch.c[0], ref), "json": cfg.to_json()})
                entries.append((cfg.label(), run))
            except Exception as exc:  # report and go on: the sweep is for information
                rows.append({"config": cfg.label(), "ms": None, "error": f"{type(exc).__name__}: {exc}"[:200]})
        samples = harness.interleaved_medians(entries, rounds, max(1, rep_ms // rounds))
        cublas = statistics.median(samples["cuBLAS"])
        for row in rows:
            if row["config"] in samples and "error" not in row:
                ms = statistics.median(samples[row["config"]])
                row.update(ms=ms, tflops=2 * m * n * k / ms / 1e9, vs_cublas=cublas / ms,
                           rounds_ms=samples[row["config"]])
        rows.sort(key=lambda r: r["ms"] if r.get("ms") else float("inf"))
        print(f"\n== {m}x{n}x{k} {layout.upper()} {dtype} class={ops.problem.shape_class(part.multiprocessors)}: cuBLAS {cublas:.4f} ms "
              f"({2 * m * n * k / cublas / 1e9:.1f} TFLOP/s); {len(cfgs)} configs compiled in {compile_s:.0f} s; "
              f"{rounds} interleaved rounds", flush=True)
        for r in rows:
            if r.get("ms"):
                spread = max(r["rounds_ms"]) / min(r["rounds_ms"]) - 1
                print(f"  {r['config']:<44} {r['ms']:9.4f} ms {r['tflops']:8.1f} TFLOP/s {r['vs_cublas']:6.3f}x  "
                      f"err {r['rel_error']:.1e}  rounds spread {spread:.1%}")
            else:
                print(f"  {r['config']:<44} FAILED {r.get('error', '')}")
        results.append({"shape": [m, n, k], "layout": layout, "dtype": str(dtype), "cublas_ms": cublas,
                        "cublas_rounds_ms": samples["cuBLAS"], "configs": rows})
        del ref, ops
        torch.cuda.empty_cache()
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        path = out / "gemm-sweep.json"
        path.write_text(json.dumps(results, indent=1, default=str))
        print(f"\nwrote {path}")
    return results


# -------------------------------------------------------------------------------- resources (CPU)
def resources(target: str = "sm_90a") -> int:
    """Cross-compile each candidate of the suite's problems for ``target``: registers, spills, smem."""
    import os
    import subprocess

    from .. import device

    if device.interpreting():  # the real JITFunctions are needed: run again with the interpreter off
        env = dict(os.environ, TILEFUSE_INTERPRET="0")
        env.pop("TRITON_INTERPRET", None)
        return subprocess.call([sys.executable, "-m", "tilefuse.bench.gemm_suite", "--resources", "--target", target],
                               env=env)
    from .. import targets
    from ..kernels.gemm import configs as gemm_configs, targets as gemm_targets

    part = gemm_configs.PART_BY_TARGET[target]
    problems = []
    shapes = [(n, n, n) for n in SQUARES] + [(PREFILL_M, 4096, 4096), (PREFILL_M, 28672, 8192)] + \
             [(m, DECODE_NK, DECODE_NK) for m in DECODE_MS]
    for m, n, k in shapes:
        problems.append(((m, n, k), "plain", {}))
    problems.append(((8192, 8192, 1024), "bias+gelu", {"ACTIVATION": 2, "BIAS_MODE": 1}))
    problems.append(((8192, 8192, 1024), "bias+gelu+quant", {"ACTIVATION": 2, "BIAS_MODE": 1, "QUANT": 1}))
    seen = {}
    print(f"{'problem':<28} {'config':<44} {'regs':>5} {'spill':>6} {'smem':>7} {'mma':<8}")
    for (m, n, k), label, epi in problems:
        prob = gemm_configs.GemmProblem(m, n, k, 1, "bfloat16", "bfloat16", "bfloat16", False, False, True, label)
        for cfg in gemm_configs.candidates(prob, part):
            key = (cfg, label)
            if key not in seen:
                fn, ex = gemm_targets.example_for(cfg, target, epilogue=epi)
                spec = targets.KernelSpec(f"gemm_{cfg.kernel}", "gemm", fn, lambda t: [ex])
                seen[key] = targets.compile_example(spec, ex, target)
            r = seen[key]
            status = "" if r.ok else f"FAIL {r.error[:60]}"
            print(f"{_shape(m, n, k) + ' ' + label:<28} {cfg.label():<44} {r.registers or '':>5} {r.spills or 0:>6} "
                  f"{r.shared_bytes or '':>7} {r.mma:<8} {status}", flush=True)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tilefuse.bench.gemm_suite", description=__doc__.splitlines()[0])
    p.add_argument("--sweep", action="store_true", help="GPU: time every candidate config for a few shapes")
    p.add_argument("--resources", action="store_true", help="no GPU: registers/spills/smem of each candidate")
    p.add_argument("--target", default="sm_90a", help="--resources target (default sm_90a)")
    p.add_argument("--shape", action="append", default=[], metavar="MxNxK", help="sweep these shapes")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    p.add_argument("--layout", default="nn", choices=("nn", "nt", "tn", "tt"),
                   help="--sweep operand layout: n = row-major, t = the transpose of a contiguous tensor "
                        "(nt: B K-major, as nn.Linear's weight.T)")
    p.add_argument("--ieee", action="store_true",
                   help="--sweep --dtype float32: exact fp32 (default: tf32 allowed, for cuBLAS and tilefuse alike)")
    p.add_argument("--all", action="store_true", help="sweep the configs of every shape class, not only the shape's own")
    p.add_argument("--out", default=None, help="folder for gemm-sweep.json")
    p.add_argument("--config", action="append", default=[], metavar="LABEL",
                   help="sweep only these configs (labels as the sweep prints them), with cuBLAS")
    p.add_argument("--extra", action="append", default=[], metavar="LABEL",
                   help="also time these configs, named as GemmConfig.label writes them, even outside the spaces "
                        "(comma-separated or repeated; e.g. T128x128x64-w8-s6-k2-tma)")
    p.add_argument("--rounds", type=int, default=SWEEP_ROUNDS, help="interleaved timing rounds (default 4)")
    p.add_argument("--rep-ms", type=int, default=60)
    args = p.parse_args(argv)
    if args.resources:
        return resources(args.target)
    if args.sweep:
        shapes = [_parse_shape(s) for s in args.shape] or list(SWEEP_SHAPES)
        if args.dtype == "float32":
            torch.backends.cuda.matmul.allow_tf32 = not args.ieee
        sweep(shapes, getattr(torch, args.dtype), args.all, Path(args.out) if args.out else None, args.rep_ms,
              [c for x in args.config for c in x.split(",") if c], max(1, args.rounds), args.layout,
              [c for x in args.extra for c in x.split(",") if c])
        return 0
    p.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
