"""The transposing copy gemm_plan.wgmma_copies asks for: torch's own against tilefuse's tiled relayout kernel.

GPU (an H200 image: system python, PYTHONPATH=checkout)::

    python tools/relayout_probe.py [--shape KxN ...] [--rounds 4] [--csv PATH]
    python tools/relayout_probe.py --crossover [--m 128,256,...] [--nk 4096] [--csv PATH]
    python tools/relayout_probe.py --tiles [--csv PATH]

For each (K, N) it times, in interleaved rounds (do_bench median, the L2 flushed before each call):
``torch``: ``b.mT.contiguous()`` of a row-major (K, N) fp32 tensor; ``relayout``:
``gemm_plan.relayout`` into an (N, K) row-major buffer; ``copy``: a plain contiguous copy of the same bytes
(the bandwidth ceiling a transposing copy can approach). Prints ms and GB/s (bytes read + written); both
transposed results are checked against each other first.

``--crossover``: where the copy starts to pay. For each M (N = K = ``--nk``, B row-major, i.e. N-major;
``--dtype`` tf32, fp8 or int8), interleaved: the vendor peer, ``tilefuse.gemm`` as shipped (B copied
K-major when M >= ``gemm_plan.K_MAJOR_MIN``) and forced each way (``copy``: threshold 1; ``as-is``: no
copy, B read N-major by the transposing kernels), and the copy's two parts apart (``relayout-only``,
``gemm-kmajor-only``: our GEMM on a K-major B made beforehand). Each variant is tuned on its first call,
outside the timing.

``--tiles``: the relayout kernel's tile side and warps (32-256, 4/8/16 warps) for 4096 x 4096 int8 and fp32,
launched directly, interleaved, against a plain copy of the same bytes.
"""
from __future__ import annotations

import argparse
import csv
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", action="append", default=[], metavar="KxN")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--csv", default=None)
    p.add_argument("--crossover", action="store_true")
    p.add_argument("--m", default="128,256,384,512,768,1024,2048")
    p.add_argument("--nk", type=int, default=4096)
    p.add_argument("--dtype", default="tf32", choices=("tf32", "fp8", "int8"),
                   help="--crossover: tf32 (peer cuBLAS), fp8 e4m3 with row/column scales (peer torch._scaled_mm "
                        "on a K-major copy of B, which it requires), int8 (peer torch._int_mm, likewise)")
    p.add_argument("--tiles", action="store_true")
    args = p.parse_args(argv)
    if args.tiles:
        return tiles(args.rounds, args.csv)
    if args.crossover:
        return crossover([int(m) for m in args.m.split(",")], args.nk, args.rounds, args.csv, args.dtype)
    import torch
    from tilefuse.bench.harness import interleaved_medians

    from tilefuse.kernels.gemm.plan import relayout

    if not torch.cuda.is_available():
        raise SystemExit("relayout_probe needs a GPU")
    shapes = [tuple(int(v) for v in s.lower().split("x")) for s in args.shape] or [(4096, 4096), (8192, 8192),
                                                                                    (4096, 14336)]
    rows = []
    for k, n in shapes:
        b = torch.randn(k, n, device="cuda")
        out = torch.empty(n, k, device="cuda")
        flat = torch.empty_like(b)
        relayout(b, out.mT)
        if not torch.equal(out, b.mT.contiguous()):
            raise SystemExit(f"{k}x{n}: relayout differs from torch's copy")
        entries = [("torch", lambda: b.mT.contiguous()), ("relayout", lambda: relayout(b, out.mT)),
                   ("copy", lambda: flat.copy_(b))]
        samples = interleaved_medians(entries, args.rounds, 40)
        moved = 2 * b.numel() * b.element_size()
        for name, _ in entries:
            ms = statistics.median(samples[name])
            rows.append({"shape": f"{k}x{n}", "impl": name, "ms": round(ms, 5), "gbps": round(moved / ms / 1e6, 1)})
            print(f"{k}x{n:<6} {name:<9} {ms:.4f} ms {moved / ms / 1e6:8.1f} GB/s", flush=True)
    _write_csv(rows, args.csv)
    return 0


def _write_csv(rows: list[dict], path) -> None:
    if path and rows:
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)


def tiles(rounds: int, csv_path) -> int:
    import torch
    import triton
    from tilefuse.bench.harness import interleaved_medians

    from tilefuse.kernels.gemm import relayout_kernel

    rows = []
    for dtype in (torch.int8, torch.float32):
        x = torch.randint(-100, 100, (4096, 4096), device="cuda", dtype=torch.int8).to(dtype)
        y = torch.empty(4096, 4096, device="cuda", dtype=dtype)
        flat = torch.empty_like(x)
        ref = x.t().contiguous()
        entries = [("copy", lambda: flat.copy_(x))]
        for block in (32, 64, 128, 256):
            for warps in (4, 8, 16):
                if block * block * x.element_size() > 64 * 1024 or (block == 32 and warps > 4):
                    continue
                grid = (triton.cdiv(4096, block), triton.cdiv(4096, block), 1)

                def run(block=block, warps=warps, grid=grid):
                    relayout_kernel[grid](x, y, 4096, 4096, 0, 4096, 1, 0, 1, 4096, BLOCK_R=block, BLOCK_C=block,
                                          num_warps=warps)
                y.zero_()
                run()
                if not torch.equal(y.t(), x) or not torch.equal(y, ref):
                    raise SystemExit(f"{dtype} block {block} warps {warps}: wrong")
                entries.append((f"b{block}-w{warps}", run))
        samples = interleaved_medians(entries, rounds, 30)
        moved = 2 * x.numel() * x.element_size()
        for name, _ in entries:
            ms = statistics.median(samples[name])
            rows.append({"dtype": str(dtype).split(".")[-1], "impl": name, "ms": round(ms, 5),
                         "gbps": round(moved / ms / 1e6, 1)})
            print(f"{rows[-1]['dtype']:<8} {name:<10} {ms:.4f} ms {moved / ms / 1e6:8.1f} GB/s", flush=True)
    _write_csv(rows, csv_path)
    return 0


def crossover(ms, nk: int, rounds: int, csv_path, dtype: str = "tf32") -> int:
    import torch
    from tilefuse.bench.harness import interleaved_medians

    import tilefuse
    from tilefuse.kernels.gemm import plan as gemm_plan
    from tilefuse.kernels.gemm.plan import relayout

    if not torch.cuda.is_available():
        raise SystemExit("relayout_probe needs a GPU")
    torch.backends.cuda.matmul.allow_tf32 = True
    shipped = gemm_plan.K_MAJOR_MIN
    rows = []

    def with_min(value, fn):
        def run():
            gemm_plan.K_MAJOR_MIN = value
            try:
                return fn()
            finally:
                gemm_plan.K_MAJOR_MIN = shipped
        return run

    for m in ms:
        if dtype == "tf32":
            a, b = torch.randn(m, nk, device="cuda"), torch.randn(nk, nk, device="cuda")
            ours = lambda: tilefuse.gemm(a, b)  # noqa: E731
            # the peer: cuBLAS on the same (N-major) operands
            peer_name, peer = "cublas", (lambda: torch.matmul(a, b))
            ref = a.double() @ b.double()
        elif dtype == "fp8":
            a = torch.randn(m, nk, device="cuda").to(torch.float8_e4m3fn)
            b = torch.randn(nk, nk, device="cuda").to(torch.float8_e4m3fn)
            sa, sb = torch.rand(m, 1, device="cuda") + 0.5, torch.rand(1, nk, device="cuda") + 0.5
            ours = lambda: tilefuse.gemm(a, b, scale_a=sa, scale_b=sb)  # noqa: E731
            bk = b.t().contiguous().t()  # torch._scaled_mm takes a K-major B only: its time is a bound, no copy
            peer_name = "scaled_mm_kmajor"
            peer = lambda: torch._scaled_mm(a, bk, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)  # noqa: E731
            ref = (a.double() * sa.double()) @ (b.double() * sb.double())
        else:
            a = torch.randint(-8, 8, (m, nk), device="cuda", dtype=torch.int8)
            b = torch.randint(-8, 8, (nk, nk), device="cuda", dtype=torch.int8)
            ours = lambda: tilefuse.gemm(a, b)  # noqa: E731
            bk = b.t().contiguous().t()
            peer_name, peer = "int_mm_kmajor", (lambda: torch._int_mm(a, bk))
            ref = a.double() @ b.double()
        # the copy's two parts apart: the relayout alone, and our GEMM on a K-major B made beforehand
        b_kmaj = torch.empty(b.shape[::-1], dtype=b.dtype, device="cuda").t()
        relayout(b, b_kmaj)
        if dtype == "fp8":
            parts_gemm = lambda: tilefuse.gemm(a, b_kmaj, scale_a=sa, scale_b=sb)  # noqa: E731
        else:
            parts_gemm = lambda: tilefuse.gemm(a, b_kmaj)  # noqa: E731
        entries = [(peer_name, peer), ("shipped", ours), ("copy", with_min(1, ours)),
                   ("as-is", with_min(1 << 62, ours)), ("relayout-only", lambda: relayout(b, b_kmaj)),
                   ("gemm-kmajor-only", parts_gemm)]
        for name, fn in entries:  # tune (and check) outside the timing
            if name == "relayout-only":
                continue
            err = ((fn().double() - ref).norm() / ref.norm()).item()
            if err > 2e-2:
                raise SystemExit(f"M={m} {name}: relative error {err:.1e}")
        samples = interleaved_medians(entries, rounds, 40)
        base = statistics.median(samples[peer_name])
        for name, _ in entries:
            ms_ = statistics.median(samples[name])
            rows.append({"dtype": dtype, "m": m, "nk": nk, "impl": name, "ms": round(ms_, 5),
                         "vs_peer": round(base / ms_, 3), "peer": peer_name})
            print(f"{dtype} M={m:<5} {name:<16} {ms_:.4f} ms {base / ms_:6.3f}x {peer_name}", flush=True)
        del a, b, ref
    _write_csv(rows, csv_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
