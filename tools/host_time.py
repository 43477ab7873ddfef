"""Host time a call, and where it goes: tilefuse.gemm against torch.matmul, and compiled graphs (tilefuse
against Inductor and eager), on shapes small enough that the host, not the GPU, sets the time.

    python tools/host_time.py            (GPU only; prints a report, ~30 s)

Sections:
  gemm: wall time a call (3000 back-to-back calls, synchronised at the end) at 64^3 and 1024^3 bf16 and the
        decode shape 1 x 8192 x 8192; then the parts of a repeat call: the plan path with launches stubbed
        out (gemm_plan.host_path_us), the kept launcher alone, an output allocation; then cProfile's top
        entries for 2000 calls.
  compiler: wall time a call of small graphs (softmax, layer_norm fwd, layer_norm fwd+bwd at 64 x 256) under
        tilefuse, Inductor and eager, and how many launches went through the direct path.
"""
from __future__ import annotations

import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import tilefuse  # noqa: E402
from tilefuse.kernels.gemm import launching as L# noqa: E402
from tilefuse.kernels.gemm import plan as P# noqa: E402

CALLS = 3000


def per_call_us(fn, calls=CALLS) -> float:
    for _ in range(100):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / calls * 1e6)
    return best


def gpu_us(fn) -> float:
    """GPU time a call (CUDA events over 200 calls, after a warm-up)."""
    for _ in range(20):
        fn()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    s.record()
    for _ in range(200):
        fn()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) / 200 * 1e3


def gemm_section() -> None:
    print("== gemm: wall time a call (us), best of 3 rounds of", CALLS)
    for m, n, k in ((64, 64, 64), (1024, 1024, 1024), (1, 8192, 8192), (2048, 2048, 2048)):
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        calls = CALLS if m * n * k < 2 ** 31 else 500
        t_mm = per_call_us(lambda: torch.matmul(a, b), calls)
        t_tf = per_call_us(lambda: tilefuse.gemm(a, b), calls)
        t_raw = per_call_us(lambda: P.gemm_call(a, b), calls)
        print(f"  {m}x{n}x{k}: torch.matmul {t_mm:7.1f}  tilefuse.gemm {t_tf:7.1f}  gemm_call {t_raw:7.1f}  "
              f"| GPU time: matmul {gpu_us(lambda: torch.matmul(a, b)):7.1f} tilefuse {gpu_us(lambda: tilefuse.gemm(a, b)):7.1f}")
    a = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
    tilefuse.gemm(a, b)
    print(f"  plans kept: {P.plan_count()}")
    print(f"  plan path with launches stubbed: {P.host_path_us(a, b):.2f} us")
    plan = next(iter(P._plans.values()))
    c = plan.launches[0]
    print(f"  launch kept: direct={c.direct is not None}, via_run={getattr(c.direct, 'via_run', None)}")
    values = [a, b] + [None] * (len(L.ROLES) - 2)
    values[L.ROLE_INDEX["out"]] = torch.empty(64, 64, device="cuda", dtype=torch.bfloat16)
    values[L.ROLE_INDEX["dummy"]] = plan.dummy
    stream = L.current_stream(0)
    print(f"  kept launcher alone: {per_call_us(lambda: c.run(values, (1.0, 1.0), stream)):.2f} us")
    print(f"  new_empty(64, 64): {per_call_us(lambda: a.new_empty((64, 64))):.2f} us")
    print(f"  current_stream: {per_call_us(lambda: L.current_stream(0)):.2f} us")
    print(f"  torch.compiler.is_compiling: {per_call_us(torch.compiler.is_compiling):.2f} us")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(2000):
        tilefuse.gemm(a, b)
    prof.disable()
    torch.cuda.synchronize()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(14)
    print("  cProfile, 2000 calls of tilefuse.gemm at 64^3 (tottime):")
    print("\n".join("    " + line for line in s.getvalue().splitlines() if line.strip())[:4000])


def compiler_section() -> None:
    from tilefuse.kernels import launcher

    print("== compiler: wall time a call (us) of small graphs, host-bound")
    x = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(256, device="cuda", dtype=torch.bfloat16)
    bb = torch.randn(256, device="cuda", dtype=torch.bfloat16)
    graphs = {
        "softmax": (lambda x: torch.softmax(x, -1), (x,), False),
        "layer_norm": (lambda x, w, b: F.layer_norm(x, (256,), w, b), (x, w, bb), False),
        "gelu_chain": (lambda x, w, b: F.gelu(x * w + b) * 0.5, (x, w, bb), False),
        "layer_norm_fwd_bwd": (lambda x, w, b: F.layer_norm(x, (256,), w, b), (x, w, bb), True),
    }
    for name, (fn, args, bwd) in graphs.items():
        row = []
        for backend in ("eager", "inductor", "tilefuse"):
            torch._dynamo.reset()
            f = fn if backend == "eager" else torch.compile(fn, backend=backend)
            if bwd:
                leaves = [a.detach().requires_grad_(True) for a in args]
                g = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16)

                def step(f=f, leaves=leaves, g=g):
                    f(*leaves).backward(g)
            else:
                def step(f=f, args=args):
                    f(*args)
            try:
                row.append(f"{backend} {per_call_us(step, 1000):7.1f}")
            except Exception as exc:  # noqa: BLE001 - a report line, the next backend still runs
                row.append(f"{backend} failed ({type(exc).__name__}: {str(exc)[:80]})")
        print(f"  {name}: " + "  ".join(row))
    # how the tilefuse launches went
    sites = [o for o in __import__("gc").get_objects() if type(o) is launcher.SiteLauncher]
    print(f"  tilefuse launch sites: {len(sites)}, direct: {sum(s.direct is not None for s in sites)}")


def main() -> int:
    if not torch.cuda.is_available():
        print("host_time.py needs a GPU")
        return 2
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    for section in (gemm_section, compiler_section):
        try:
            section()
        except Exception as exc:  # noqa: BLE001 - report and go on to the next section
            import traceback

            print(f"== {section.__name__} FAILED: {type(exc).__name__}: {exc}")
            traceback.print_exc()
    return 0


if __name__ == "__main__":
    sys.exit(main())
