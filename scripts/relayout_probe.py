"""The transposing copy tf32_k_major makes: torch's own against tilefuse's tiled relayout kernel.

GPU (an H200 image: system python, PYTHONPATH=checkout)::

    python scripts/relayout_probe.py [--shape KxN ...] [--rounds 4] [--csv PATH]

For each (K, N) it times, in interleaved rounds (do_bench median, the L2 flushed before each call):
``torch``: ``b.mT.contiguous()`` of a row-major (K, N) fp32 tensor; ``relayout``:
``gemm_plan.relayout`` into an (N, K) row-major buffer; ``copy``: a plain contiguous copy of the same bytes
(the bandwidth ceiling a transposing copy can approach). Prints ms and GB/s (bytes read + written); both
transposed results are checked against each other first.
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
    args = p.parse_args(argv)
    import torch
    from triton.testing import do_bench

    from tilefuse.kernels.gemm_plan import relayout

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
        samples = {name: [] for name, _ in entries}
        for r in range(args.rounds):
            for name, fn in entries[r % 3:] + entries[:r % 3]:
                samples[name].append(do_bench(fn, warmup=5, rep=40, return_mode="median"))
        moved = 2 * b.numel() * b.element_size()
        for name, _ in entries:
            ms = statistics.median(samples[name])
            rows.append({"shape": f"{k}x{n}", "impl": name, "ms": round(ms, 5), "gbps": round(moved / ms / 1e6, 1)})
            print(f"{k}x{n:<6} {name:<9} {ms:.4f} ms {moved / ms / 1e6:8.1f} GB/s", flush=True)
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
