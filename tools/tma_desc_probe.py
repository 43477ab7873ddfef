"""What a TMA descriptor made inside the kernel costs a short GEMM, against one made on the host.

The library's kernels build their TMA descriptors in the kernel (``tl.make_tensor_descriptor``: each program
writes a 128-byte tensor map to global scratch and fences it before the first load). A descriptor made on the
host (``triton.tools.tensor_descriptor.TensorDescriptor``) arrives as a kernel parameter instead. At 1024^3
(a ~10 us GEMM of 128 programs) a fixed cost at each program's start is a visible share of the time.

Three kernels with the same tile loop (grouped order, ``tl.range`` pipelined over K, the same store), one
difference each: ``in_kernel`` (descriptors made in the kernel, as the library does), ``host`` (descriptors
passed in), ``pointers`` (no TMA: pointer loads). Timed in interleaved rounds with cuBLAS (do_bench median,
L2 flushed before each call) at each shape and tile; every output is checked against cuBLAS first.

GPU (an H200 image: system python, PYTHONPATH=checkout)::

    python tools/tma_desc_probe.py [--shape MxNxK ...] [--rounds 6] [--csv PATH]

CPU: ``--check`` runs the three kernels on Triton's interpreter at a small ragged shape.
"""
from __future__ import annotations

import argparse
import csv
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

SHAPES = ("1024x1024x1024", "2048x2048x2048", "128x8192x8192")
# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages, GROUP_M): the library's 1024^3 and M = 128 leaders' tiles
TILES = ((64, 128, 128, 4, 4, 1), (64, 128, 128, 4, 4, 8), (128, 128, 64, 4, 4, 8))


@triton.jit
def _order(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    in_group = GROUP_M * num_n
    first_m = (pid // in_group) * GROUP_M
    size_m = tl.minimum(num_m - first_m, GROUP_M)
    return first_m + (pid % in_group) % size_m, (pid % in_group) // size_m


@triton.jit
def _store(acc, c_ptr, M, N, m0, n0, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rm = m0 + tl.arange(0, BLOCK_M)
    rn = n0 + tl.arange(0, BLOCK_N)
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc.to(c_ptr.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton.jit
def _desc_gemm(a_desc, b_desc, c_ptr, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, STAGES: tl.constexpr):
    """The tile loop of both descriptor kernels (inlined into each: the same code but for the descriptors)."""
    pid_m, pid_n = _order(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in tl.range(0, tl.cdiv(K, BLOCK_K), num_stages=STAGES):
        acc = tl.dot(a_desc.load([pid_m * BLOCK_M, k * BLOCK_K]), b_desc.load([k * BLOCK_K, pid_n * BLOCK_N]), acc)
    _store(acc, c_ptr, M, N, pid_m * BLOCK_M, pid_n * BLOCK_N, BLOCK_M, BLOCK_N)


@triton.jit
def in_kernel(a_ptr, b_ptr, c_ptr, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, STAGES: tl.constexpr):
    a_desc = tl.make_tensor_descriptor(a_ptr, [M, K], [K, 1], [BLOCK_M, BLOCK_K])
    b_desc = tl.make_tensor_descriptor(b_ptr, [K, N], [N, 1], [BLOCK_K, BLOCK_N])
    _desc_gemm(a_desc, b_desc, c_ptr, M, N, K, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, STAGES)


@triton.jit
def host(a_desc, b_desc, c_ptr, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
         BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, STAGES: tl.constexpr):
    _desc_gemm(a_desc, b_desc, c_ptr, M, N, K, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, STAGES)


@triton.jit
def pointers(a_ptr, b_ptr, c_ptr, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
             BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, STAGES: tl.constexpr):
    pid_m, pid_n = _order(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in tl.range(0, tl.cdiv(K, BLOCK_K), num_stages=STAGES):
        kk = k * BLOCK_K + rk
        a = tl.load(a_ptr + rm[:, None] * K + kk[None, :], mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
        b = tl.load(b_ptr + kk[:, None] * N + rn[None, :], mask=(kk[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)
    _store(acc, c_ptr, M, N, pid_m * BLOCK_M, pid_n * BLOCK_N, BLOCK_M, BLOCK_N)


def variants(a, b, c, tile):
    """(name, fn) for each kernel on row-major a (M, K), b (K, N) into c (M, N)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    from tilefuse.kernels.gemm import launching as gemm_launching

    bm, bn, bk, warps, stages, group = tile
    (m, k), n = a.shape, b.shape[1]
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
    meta = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=group, STAGES=stages, num_warps=warps)
    a_desc = TensorDescriptor.from_tensor(a, [bm, bk])
    b_desc = TensorDescriptor.from_tensor(b, [bk, bn])
    gemm_launching.ensure_scratch_allocator()  # in-kernel descriptors live in Triton's global scratch
    return [("in_kernel", lambda: in_kernel[grid](a, b, c, m, n, k, **meta)),
            ("host", lambda: host[grid](a_desc, b_desc, c, m, n, k, **meta)),
            ("pointers", lambda: pointers[grid](a, b, c, m, n, k, **meta))]


def check() -> int:
    """Interpreter: the three kernels agree with a float64 reference on a ragged shape."""
    import torch

    m, n, k = 40, 72, 100
    a, b = torch.randn(m, k), torch.randn(k, n)
    ref = a.double() @ b.double()
    for tile in ((16, 32, 16, 4, 1, 1), (32, 16, 32, 4, 1, 2)):
        for name in ("in_kernel", "host", "pointers"):
            c = torch.full((m, n), float("nan"))  # poisoned: a tile left unwritten fails the check
            dict(variants(a, b, c, tile))[name]()
            err = ((c.double() - ref).norm() / ref.norm()).item()
            print(f"{name:10s} {tile} rel err {err:.1e}")
            if not err < 1e-5:
                return 1
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", action="append", default=[], metavar="MxNxK")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--rep-ms", type=int, default=60, help="do_bench time an entry, over all rounds")
    p.add_argument("--csv", default=None)
    p.add_argument("--check", action="store_true", help="CPU: run the kernels on the interpreter and check them")
    opts = p.parse_args(argv)
    if opts.check:
        return check()
    import torch

    from tilefuse.bench import harness

    rows = []
    for shape in opts.shape or SHAPES:
        m, n, k = (int(x) for x in shape.split("x"))
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        ref = a @ b
        for tile in TILES:
            entries = [("cuBLAS", lambda: torch.matmul(a, b))]
            for name, fn in variants(a, b, torch.empty_like(ref), tile):
                c = torch.full_like(ref, float("nan"))
                dict(variants(a, b, c, tile))[name]()
                err = harness.rel_error(c, ref.float())
                if not err < 1e-2:
                    print(f"{shape} {tile} {name}: WRONG (rel err {err:.2e})", flush=True)
                    continue
                entries.append((name, fn))
            samples = harness.interleaved_medians(entries, opts.rounds, max(1, opts.rep_ms // opts.rounds))
            record(rows, shape, tile, samples)
    write_csv(opts.csv, rows)
    return 0


def record(rows: list, shape: str, tile: tuple, samples: dict, name_width: int = 10) -> None:
    """Each entry's median of its rounds and its ratio to cuBLAS's: appended to ``rows`` and printed."""
    cublas = statistics.median(samples["cuBLAS"])
    for name, xs in samples.items():
        ms = statistics.median(xs)
        rows.append({"shape": shape, "tile": "x".join(map(str, tile)), "impl": name, "ms": ms,
                     "vs_cublas": cublas / ms, "rounds_ms": " ".join(f"{x:.5f}" for x in xs)})
        print(f"{shape:16s} {rows[-1]['tile']:18s} {name:{name_width}s} {ms * 1e3:8.2f} us  {cublas / ms:6.3f}x cuBLAS",
              flush=True)


def write_csv(path: str | None, rows: list) -> None:
    if path and rows:
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)


if __name__ == "__main__":
    sys.exit(main())
