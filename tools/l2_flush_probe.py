"""Decode GEMMs under three L2 states: what the benchmark's L2 flush costs a kernel that streams B once.

GPU (an H200 image: system python, PYTHONPATH=checkout)::

    python tools/l2_flush_probe.py [--m 1,16,64,128] [--nk 8192] [--config LABEL ...] [--reps 60]

``triton.testing.do_bench`` (the suites' timer) clears L2 before every timed call by zeroing a 256 MB buffer,
which leaves L2 full of dirty lines. A decode GEMM (M <= 128, N = K = 8192 bf16) reads 128 MiB of B once; if
its loads evict those dirty lines, it pays for writing them back (up to the L2's size) inside its own time.
This times cuBLAS and the given tilefuse configs (default: the decode class's first candidate and every
``b_stream`` candidate, whose B loads carry an L2 evict-first hint) after three flushes, interleaved, CUDA
events around each call, median of ``--reps``:

- ``write``: zero a 256 MB buffer, as do_bench does (dirty L2);
- ``read``: sum the same buffer (L2 full of clean lines);
- ``none``: no flush (B is larger than L2, so it still comes from HBM; A and the outputs stay hot).

It prints each time and its read rate of B (GB/s). One table a shape; nothing is written unless ``--csv``.

``--window`` adds each implementation a second time (``+win``) with a streaming L2 access-policy window over B
set on the stream for its launch (``CU_STREAM_ATTRIBUTE_ACCESS_POLICY_WINDOW``, hitProp = missProp =
STREAMING, through the driver API; the stream's own window is put back after): B's lines become the likeliest
to be evicted, as with the evict-first hint, for every kernel, cuBLAS's too. ``--side-stream`` runs it all on a
stream of its own instead of the default stream. Device run 72 (``benchmarks/results/run72/l2_window.*``): the
window is set and takes effect (without a flush every windowed call gets slower, B's lines no longer staying
for the next call) but saves nothing after the zeroing flush, so the library does not use it
(docs/decisions/014-gemm-l2-evict-first-on-b.md).
"""
from __future__ import annotations

import argparse
import csv
import ctypes
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

FLUSHES = ("write", "read", "none")

# ---- the access-policy window (cuda.h: CUaccessPolicyWindow inside the 64-byte CUstreamAttrValue union)
ACCESS_POLICY_WINDOW = 1  # CU_STREAM_ATTRIBUTE_ACCESS_POLICY_WINDOW
MAX_WINDOW_SIZE = 109  # CU_DEVICE_ATTRIBUTE_MAX_ACCESS_POLICY_WINDOW_SIZE
STREAMING = 1  # CU_ACCESS_PROPERTY_STREAMING


class _Window(ctypes.Structure):
    _fields_ = [("base_ptr", ctypes.c_void_p), ("num_bytes", ctypes.c_size_t), ("hitRatio", ctypes.c_float),
                ("hitProp", ctypes.c_int), ("missProp", ctypes.c_int)]


class _AttrValue(ctypes.Union):
    _fields_ = [("window", _Window), ("pad", ctypes.c_char * 64)]


def _windowed(torch, fn, b):
    """``fn`` with a streaming window over ``b`` on the current stream for its launch, and a dict whose "on"
    says whether the driver took the window."""
    cu = ctypes.CDLL("libcuda.so.1")
    for f in (cu.cuStreamSetAttribute, cu.cuStreamGetAttribute):
        f.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(_AttrValue)]
    limit = ctypes.c_int(0)
    cu.cuDeviceGetAttribute(ctypes.byref(limit), MAX_WINDOW_SIZE, b.device.index)
    new = _AttrValue()
    new.window.base_ptr, new.window.num_bytes = b.data_ptr(), min(b.numel() * b.element_size(), limit.value)
    new.window.hitRatio, new.window.hitProp, new.window.missProp = 1.0, STREAMING, STREAMING
    state = {"limit": limit.value}

    def run():
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        old = _AttrValue()
        ok = cu.cuStreamGetAttribute(stream, ACCESS_POLICY_WINDOW, ctypes.byref(old)) == 0
        ok = ok and cu.cuStreamSetAttribute(stream, ACCESS_POLICY_WINDOW, ctypes.byref(new)) == 0
        state["on"] = ok
        try:
            fn()
        finally:
            if ok:
                cu.cuStreamSetAttribute(stream, ACCESS_POLICY_WINDOW, ctypes.byref(old))
    return run, state


def _timer(fn, flush, reps: int) -> float:
    from tilefuse.bench import harness

    return statistics.median(harness.flushed_call_ms(fn, flush) for _ in range(reps))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--m", default="1,16,64,128", help="comma-separated M values (default 1,16,64,128)")
    p.add_argument("--nk", type=int, default=8192, help="N = K (default 8192)")
    p.add_argument("--config", action="append", default=[], help="config labels (default: see the module doc)")
    p.add_argument("--reps", type=int, default=60)
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (median of their medians)")
    p.add_argument("--window", action="store_true", help="also time each with a streaming window over B")
    p.add_argument("--side-stream", action="store_true", help="run on a non-default stream")
    p.add_argument("--csv", default=None)
    opts = p.parse_args(argv)
    import torch

    from tilefuse import device

    dev = device.current()
    if not dev.is_gpu or dev.interpreter:
        print(f"needs a GPU ({dev.describe()})")
        return 2
    if opts.side_stream:
        with torch.cuda.stream(torch.cuda.Stream()):
            return _run(opts)
    return _run(opts)


def _run(opts) -> int:
    import torch

    from tilefuse.kernels import gemm
    from tilefuse.kernels.gemm import configs as gemm_configs, launching as gemm_launching, tuning as gemm_tuning

    part = gemm_configs.current_part()
    cache = torch.empty(int(256e6 // 4), dtype=torch.int32, device="cuda")
    flushes = {"write": cache.zero_, "read": lambda: cache.sum(), "none": lambda: None}
    rows = []
    for m in (int(x) for x in opts.m.split(",")):
        n = k = opts.nk
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        ops = gemm.prepare(a, b)
        cands = gemm_configs.candidates(ops.problem, part)
        if opts.config:
            known = {c.label(): c for c in cands}
            cfgs = [known[x] for x in opts.config if x in known]
            missing = [x for x in opts.config if x not in known]
            if missing:
                print(f"M={m}: not configs of this shape here: {', '.join(missing)}")
        else:
            cfgs = [cands[0]] + [c for c in cands if c.b_stream and c != cands[0]]
        failed = gemm_tuning.compile_all(ops, cfgs)
        ref = a.float() @ b.float()
        entries = [("cuBLAS", lambda: torch.matmul(a, b))]
        for cfg in cfgs:
            if cfg in failed:
                print(f"  {cfg.label()}: compile FAILED {failed[cfg]}")
                continue
            scratch = gemm.scratch_operands(ops)
            run = gemm_launching.bound(scratch, cfg)
            run()
            err = float((scratch.c[0].float() - ref).abs().max() / ref.abs().max())
            if not err < 1e-2:
                print(f"  {cfg.label()}: WRONG (max error {err:.2e} of the largest output), not timed")
                continue
            entries.append((cfg.label(), run))
        if opts.window:
            for name, fn in list(entries):
                run, state = _windowed(torch, fn, b)
                run()
                torch.cuda.synchronize()
                print(f"  {name}+win: window set: {state.get('on')} (max window {state['limit']} B)")
                entries.append((name + "+win", run))
        samples = {(name, f): [] for name, _ in entries for f in FLUSHES}
        for r in range(opts.rounds):
            for f in FLUSHES:
                for name, fn in entries[r % len(entries):] + entries[:r % len(entries)]:
                    samples[(name, f)].append(_timer(fn, flushes[f], opts.reps))
        gb = k * n * b.element_size() / 1e9
        print(f"\n== {m}x{n}x{k} bf16: ms (B GB/s) after each flush")
        print(f"  {'impl':<34}" + "".join(f"{f:>20}" for f in FLUSHES))
        for name, _ in entries:
            line = f"  {name:<34}"
            for f in FLUSHES:
                ms = statistics.median(samples[(name, f)])
                line += f"{ms:10.4f} ({gb / ms * 1e3:5.0f})"
                rows.append({"m": m, "n": n, "k": k, "impl": name, "flush": f, "ms": ms, "b_gbps": gb / ms * 1e3})
            print(line, flush=True)
        del ref, ops
        torch.cuda.empty_cache()
    if opts.csv:
        with open(opts.csv, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
        print(f"wrote {opts.csv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
