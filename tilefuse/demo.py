"""``tilefuse demo`` (and ``make demo``): the main job, end to end, on whatever this machine has.

1. the device (or Triton's interpreter when there is no GPU);
2. the compiler: a LayerNorm -> Linear -> GELU -> Linear block with a residual, compiled with
   ``torch.compile(backend="tilefuse")``, checked against eager forward and backward, with one generated
   kernel shown;
3. the GEMM library: ``tilefuse.gemm`` with a fused bias + GELU epilogue, checked against float64;
4. the portability matrix: the GEMM kernels cross-compiled for NVIDIA and AMD targets.

On a GPU each step also prints a timing against its peer (eager, cuBLAS). A step whose work ran in ATen
instead of tilefuse's kernels (a fallback) is marked FALLBACK, not ok, even when its numbers are right: the
demo is about tilefuse's kernels. Exit status 1 if a check fails or a step fell back.
"""
from __future__ import annotations

import time
import traceback

import torch

from . import device


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.detach().double().cpu(), ref.detach().double().cpu()
    return ((out - ref).norm() / ref.norm().clamp_min(1e-300)).item()


def _time_ms(fn, gpu: bool) -> float:
    if gpu:
        from triton.testing import do_bench

        return do_bench(fn, warmup=25, rep=100, return_mode="median")
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


class Block(torch.nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.up = torch.nn.Linear(width, 4 * width)
        self.down = torch.nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


OK, FALLBACK, FAILED = "ok", "fallback", "failed"  # a step's outcome


def compiler_step(dev, quick: bool) -> str:
    import tilefuse.compiler as tc

    rows, width = (64, 32) if (quick or not dev.is_gpu) else (8192, 1024)
    torch_device = device.torch_device()
    dtype = torch.float32 if not dev.is_gpu else torch.bfloat16
    model = Block(width).to(torch_device, dtype)
    x = torch.randn(rows, width, device=torch_device, dtype=dtype, requires_grad=True)
    tc.reset_stats()
    compiled = torch.compile(model, backend="tilefuse")
    start = time.perf_counter()
    out = compiled(x)
    out.sum().backward()
    first_call = time.perf_counter() - start
    grad = x.grad.clone()
    x.grad = None
    ref = model(x)
    ref.sum().backward()
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    err_fwd, err_bwd = _rel(out, ref), _rel(grad, x.grad)
    stats = tc.stats()
    ok = err_fwd < tol and err_bwd < tol
    fell_back = len(stats["fallbacks"])
    verdict = "WRONG" if not ok else f"FALLBACK: right, but {fell_back} part(s) ran in ATen" if fell_back else "ok"
    print(f"  forward rel. error {err_fwd:.2e}, input-gradient rel. error {err_bwd:.2e}  ({verdict})")
    print(f"  {stats['graphs']} graphs, {stats['kernels']} Triton kernels, {stats['externs']} ATen externs, "
          f"{fell_back} fallbacks; first call (compile + run) {first_call:.1f} s")
    for op, reason in stats["fallbacks"][:5]:
        print(f"    fallback: {op}: {reason}")
    source = tc.last_kernel_source() if hasattr(tc, "last_kernel_source") else None
    if source:
        print("  one generated kernel:")
        print("\n".join("    " + line for line in source.strip().splitlines()[:40]))
    if dev.is_gpu and not dev.interpreter:
        with torch.no_grad():
            eager_ms = _time_ms(lambda: model(x), True)
            ours_ms = _time_ms(lambda: compiled(x), True)
        print(f"  forward: eager {eager_ms:.3f} ms, tilefuse {ours_ms:.3f} ms ({eager_ms / ours_ms:.2f}x eager)")
    return FAILED if not ok else FALLBACK if fell_back else OK


def gemm_step(dev, quick: bool) -> bool:
    import tilefuse

    m, n, k = (129, 96, 80) if (quick or not dev.is_gpu) else (8192, 8192, 1024)
    dtype = torch.bfloat16  # (on the interpreter too: tilefuse widens its bf16 dots, kernels/_interpreter.py)
    torch_device = device.torch_device()
    a = torch.randn(m, k, device=torch_device, dtype=dtype)
    b = torch.randn(k, n, device=torch_device, dtype=dtype)
    bias = torch.randn(n, device=torch_device, dtype=dtype)
    out = tilefuse.gemm(a, b, bias=bias, activation="gelu")
    ref = torch.nn.functional.gelu(a.double() @ b.double() + bias.double())
    err = _rel(out, ref)
    ok = err < (3e-3 if dtype == torch.float16 else 2e-2)
    print(f"  gemm {m}x{n}x{k} {str(dtype).replace('torch.', '')} + bias + gelu: rel. error {err:.2e} ({'ok' if ok else 'WRONG'})")
    if dev.is_gpu and not dev.interpreter:
        ours = _time_ms(lambda: tilefuse.gemm(a, b, bias=bias, activation="gelu"), True)
        eager = _time_ms(lambda: torch.nn.functional.gelu(torch.addmm(bias, a, b)), True)
        print(f"  fused {ours:.3f} ms vs cuBLAS addmm + eager GELU {eager:.3f} ms ({eager / ours:.2f}x)")
    return ok


def targets_step(dev, quick: bool) -> bool:
    from . import kernels, targets

    kernels.load_all()
    names = [name for name, spec in targets.kernels().items() if spec.family == "gemm"][:2 if quick else None]
    results = targets.compile_matrix(None, names or None, include_providers=False)
    print("\n".join("  " + line for line in targets.format_matrix(results, targets.ALL_TARGETS).splitlines()))
    bad = targets.failures(results)
    for r in bad:
        print(f"  FAIL {r.kernel} on {r.target}: {r.error}")
    return not bad


STEPS = (("the compiler: torch.compile(block, backend='tilefuse')", compiler_step),
         ("the GEMM library: tilefuse.gemm with a fused epilogue", gemm_step),
         ("portability: GEMM kernels cross-compiled for NVIDIA and AMD (no GPU needed)", targets_step))


def main(args) -> int:
    dev = device.current()
    quick = bool(getattr(args, "quick", False)) or not dev.is_gpu
    print(f"tilefuse demo on {dev.describe()}")
    if dev.interpreter:
        print("(no GPU: every Triton kernel below runs on Triton's interpreter; sizes are small and times mean nothing)")
    failed, fell_back = [], []
    for number, (title, step) in enumerate(STEPS, 1):
        print(f"\n[{number}/{len(STEPS)}] {title}")
        try:
            outcome = step(dev, quick)
        except Exception as exc:
            traceback.print_exc()
            print(f"  FAILED: {type(exc).__name__}: {exc}")
            outcome = FAILED
        if outcome in (False, FAILED):
            failed.append(title)
        elif outcome == FALLBACK:
            fell_back.append(title)
    if not failed and not fell_back:
        print("\ndemo finished: every check passed")
        return 0
    print("\ndemo finished: " + ", ".join(part for part in (
        f"{len(failed)} step(s) failed" if failed else "",
        f"{len(fell_back)} step(s) ran (partly) in ATen instead of tilefuse's kernels: {'; '.join(fell_back)}"
        if fell_back else "") if part))
    return 1
