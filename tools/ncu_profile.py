#!/usr/bin/env python3
"""Hardware counters of the kernels behind a gap: run one launch of each case under Nsight Compute.

The GEMM and ladder suites say *how much* slower a kernel is than cuBLAS; this script is for *why*: the SM
clock during the kernel, the tensor pipe's active share, the warps' stall reasons, L2 hit rate and DRAM
traffic, side by side with cuBLAS on the same inputs. Each case is warmed up (builds, tuning, first-launch
module loads), then launched once between ``cudaProfilerStart``/``Stop``, so ``ncu --profile-from-start off``
profiles exactly those launches.

GPU machine (the image's ncu; leave the clocks alone, as METHOD.md asks)::

    ncu --profile-from-start off --clock-control none --set full -o OUT/gemm \
        python3 tools/ncu_profile.py gemm4096 skinny256 ...
    ncu --import OUT/gemm.ncu-rep --page details --csv > OUT/gemm.csv
    python3 tools/ncu_profile.py --summary OUT/gemm.csv      # the few numbers worth reading first

Cases (``--list``): GEMMs at the issue's weak shapes, each as cuBLAS, the Triton library and (K-major B)
the ladder's rung 9; the compiler's layer_norm_gelu forward + backward. Without ncu the script still runs
(each case once, outputs checked against a float32 reference) and prints its launch count.
"""
from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

CHECK_TOLERANCE = 1e-2  # relative Frobenius error of a bf16 GEMM against float32 (bf16 rounding ~3e-3)
WARMUP_CALLS = 3

# (M, N, K) of the GEMM cases: the ladder's weak 4096^3 and the library's weak skinny and small rows
GEMM_SHAPES = {"gemm4096": (4096, 4096, 4096), "gemm8192": (8192, 8192, 8192), "skinny256": (256, 8192, 8192),
               "skinny128": (128, 8192, 8192), "small1024": (1024, 1024, 1024), "small2048": (2048, 2048, 2048)}
COMPILER_CASES = ("layer_norm_gelu_fwd_bwd",)

# The metrics --summary prints a row each for (ncu's "details" page: section, metric name)
SUMMARY = (
    ("GPU Speed Of Light Throughput", "Duration"),
    ("GPU Speed Of Light Throughput", "SM Frequency"),
    ("GPU Speed Of Light Throughput", "Compute (SM) Throughput"),
    ("GPU Speed Of Light Throughput", "Memory Throughput"),
    ("GPU Speed Of Light Throughput", "DRAM Throughput"),
    ("Compute Workload Analysis", "Issue Slots Busy"),
    ("Memory Workload Analysis", "L2 Hit Rate"),
    ("Memory Workload Analysis", "Mem Busy"),
    ("Scheduler Statistics", "No Eligible"),
    ("Scheduler Statistics", "Active Warps Per Scheduler"),
    ("Scheduler Statistics", "Eligible Warps Per Scheduler"),
    ("Warp State Statistics", "Warp Cycles Per Issued Instruction"),
    ("Launch Statistics", "Registers Per Thread"),
    ("Launch Statistics", "Grid Size"),
    ("Launch Statistics", "Cluster Size"),
    ("Occupancy", "Achieved Occupancy"),
)


def gemm_impls(shape, configs=()):
    """(label, fn) of each implementation of C = A @ B at ``shape``, with its float32 reference check.
    ``configs``: labels of Triton GEMM configs (``GemmConfig.from_label``), each one more NN impl."""
    import torch

    import tilefuse
    from tilefuse import cuda as tcuda

    m, n, k = shape
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)  # K-major B (an nn.Linear weight)
    b_nn = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    ref_nt = a.float() @ w.float().t()
    ref_nn = a.float() @ b_nn.float()
    impls = [
        ("cublas_nn", lambda: torch.matmul(a, b_nn), ref_nn),
        ("tilefuse_nn", lambda: tilefuse.gemm(a, b_nn), ref_nn),
        ("cublas_nt", lambda: torch.matmul(a, w.t()), ref_nt),
        ("tilefuse_nt", lambda: tilefuse.gemm(a, w.t()), ref_nt),
    ]
    if k % 8 == 0 and n % 8 == 0:
        impls.append(("rung9_nt", lambda: tcuda.gemm(a, w.t(), rung=9), ref_nt))
    from tilefuse.kernels.gemm import plan as gemm_plan
    from tilefuse.kernels.gemm.configs import GemmConfig
    for label in configs:
        cfg = GemmConfig.from_label(label)
        impls.append((f"nn[{label}]", lambda c=cfg: gemm_plan.gemm_raw(a, b_nn, config=c).out[0], ref_nn))
    return impls


def compiler_impls(case):
    import torch

    from tilefuse.bench import compiler_suite as cs

    graph = next(g for g in cs.GRAPHS if g.case == case)
    args = cs.prepare(graph, graph.inputs(32768, 4096, cs.VOCAB, torch.bfloat16, "cuda"))
    out = []
    for backend in ("tilefuse", "inductor"):
        torch._dynamo.reset()
        step = cs.make_step(graph, torch.compile(graph.fn, backend=backend))
        out.append((f"{backend}", (lambda s=step: s(*args)), None))
    return out


def run(cases, profile: bool, configs=()) -> int:
    import torch

    from tilefuse.bench import harness

    plan = []
    for case in cases:
        impls = gemm_impls(GEMM_SHAPES[case], configs) if case in GEMM_SHAPES else compiler_impls(case)
        for label, fn, ref in impls:
            for _ in range(WARMUP_CALLS):
                out = fn()
            torch.cuda.synchronize()
            if ref is not None:
                err = harness.rel_error(out, ref)
                status = "ok" if err <= CHECK_TOLERANCE else f"WRONG ({err:.3g})"
                print(f"{case:12s} {label:12s} rel err {err:.2e} {status}", flush=True)
            plan.append((case, label, fn))
    for case, label, fn in plan:
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_push(f"{case}/{label}")
        if profile:
            torch.cuda.profiler.start()
        fn()
        torch.cuda.synchronize()
        if profile:
            torch.cuda.profiler.stop()
        torch.cuda.nvtx.range_pop()
    print(f"profiled {len(plan)} calls: " + ", ".join(f"{c}/{l}" for c, l, _ in plan))
    return 0


# Raw metrics --summary prints when given the raw page: substrings of ncu metric names (the warp stalls a
# issued instruction, the tensor pipe's activity, the clocks, DRAM and L2)
RAW_PATTERNS = ("issue_stalled", "pipe_tensor", "cycles_elapsed.avg.per_second", "gpu__time_duration.sum",
                "dram__bytes_read.sum", "dram__bytes_write.sum", "lts__t_sector_hit_rate.pct",
                "smsp__inst_executed.sum", "launch__grid_size", "launch__cluster")
RAW_MIN_STALL = 0.05  # stall reasons under this many cycles an issued instruction are left out


# --sustained: each impl runs this long back to back (and as long again with do_bench's L2 flush before every
# call) while NVML is read every SAMPLE_S; a GEMM of 0.2 ms draws the H200 to its power limit within ~1 s.
SAMPLE_S = 0.02
FLUSH_BYTES = 256 * 1024 * 1024  # what triton.testing.do_bench zeroes between calls


class ClockSampler:
    """SM clock (MHz), power (W) and temperature read through NVML in a thread, while ``with`` lasts."""

    def __init__(self):
        import threading

        import pynvml

        pynvml.nvmlInit()
        self.nvml = pynvml
        self.handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        self.samples: list[tuple[float, float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        nv, h = self.nvml, self.handle
        while not self._stop.wait(SAMPLE_S):
            self.samples.append((nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
                                 nv.nvmlDeviceGetPowerUsage(h) / 1000.0,
                                 nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)))

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def means(self) -> tuple[float, float, float]:
        if not self.samples:
            return (float("nan"),) * 3
        n = len(self.samples)
        return tuple(sum(s[i] for s in self.samples) / n for i in range(3))


def sustained(cases, seconds: float) -> int:
    """Each impl for ``seconds`` back to back and ``seconds`` with an L2 flush before each call (do_bench's
    condition): ms a call, TFLOP/s, and the mean SM clock and power NVML saw meanwhile. TFLOP/s per GHz
    separates a kernel that does less per clock from one that runs at a lower clock."""
    import time

    import torch

    from tilefuse.bench import harness

    flush = torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
    print(f"{'case':10s} {'impl':12s} {'mode':8s} {'ms':>8s} {'TFLOP/s':>8s} {'MHz':>6s} {'W':>6s} {'C':>4s} "
          f"{'TF/GHz':>7s}")
    for case in cases:
        if case not in GEMM_SHAPES:
            continue
        m, n, k = GEMM_SHAPES[case]
        for label, fn, ref in gemm_impls((m, n, k)):
            for _ in range(WARMUP_CALLS):
                out = fn()
            torch.cuda.synchronize()
            err = harness.rel_error(out, ref)
            if not err <= CHECK_TOLERANCE:
                print(f"{case:10s} {label:12s} WRONG (rel err {err:.3g}): not timed")
                continue
            for mode in ("b2b", "flushed"):
                time.sleep(1.0)  # each measurement starts from a similar idle state
                events = []
                with ClockSampler() as sampler:
                    t_end = time.monotonic() + seconds
                    while time.monotonic() < t_end:
                        for _ in range(20):
                            if mode == "flushed":
                                flush.zero_()
                            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                            e0.record()
                            fn()
                            e1.record()
                            events.append((e0, e1))
                        torch.cuda.synchronize()
                times = sorted(a.elapsed_time(b) for a, b in events[len(events) // 5:])
                ms = times[len(times) // 2]
                mhz, watts, temp = sampler.means()
                tflops = 2.0 * m * n * k / ms / 1e9
                print(f"{case:10s} {label:12s} {mode:8s} {ms:8.4f} {tflops:8.1f} {mhz:6.0f} {watts:6.0f} {temp:4.0f} "
                      f"{tflops / (mhz / 1000.0):7.1f}", flush=True)
    return 0


def summary(path: Path, raw: Path | None = None) -> int:
    """One block a kernel launch of an ncu details CSV (the SUMMARY metrics) and, given the raw page's CSV,
    the RAW_PATTERNS metrics of the same launch."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    launches: dict[str, dict] = {}
    for r in rows:
        key = r.get("ID", "")
        d = launches.setdefault(key, {"kernel": r.get("Kernel Name", "")[:100]})
        sec, name = r.get("Section Name", ""), r.get("Metric Name", "")
        if (sec, name) in SUMMARY:
            d[name] = f"{r.get('Metric Value', '')} {r.get('Metric Unit', '')}".strip()
    raw_rows: list[dict] = []
    if raw is not None:
        with open(raw, newline="") as f:
            reader = csv.reader(f)
            header = next(reader)
            units = next(reader)
            for vals in reader:
                raw_rows.append({h: (v, u) for h, v, u in zip(header, vals, units)})
    cols = [n for _, n in SUMMARY]
    for i, (key, d) in enumerate(launches.items()):
        print(f"-- launch {key}: {d['kernel']}")
        for c in cols:
            if c in d:
                print(f"   {c:48s} {d[c]}")
        if i < len(raw_rows):
            for name, (v, u) in raw_rows[i].items():
                if not any(p in name for p in RAW_PATTERNS):
                    continue
                if "issue_stalled" in name:
                    if not name.endswith("per_issue_active.ratio"):
                        continue
                    try:
                        if float(v.replace(",", "")) < RAW_MIN_STALL:
                            continue
                    except ValueError:
                        continue
                print(f"   {name:72s} {v} {u}")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("cases", nargs="*", default=["gemm4096"])
    p.add_argument("--list", action="store_true")
    p.add_argument("--no-profile", dest="profile", action="store_false",
                   help="do not call cudaProfilerStart/Stop (a plain run)")
    p.add_argument("--summary", type=Path, default=None, help="print the key metrics of an ncu details CSV")
    p.add_argument("--sustained", type=float, default=0.0,
                   help="seconds a GEMM impl runs under NVML clock/power sampling (no ncu needed)")
    p.add_argument("--raw", type=Path, default=None, help="with --summary: ncu's raw page CSV of the same report")
    p.add_argument("--config", action="append", default=[], metavar="LABEL",
                   help="GEMM cases: also run the Triton GEMM with this config (as GemmConfig.label writes it; "
                        "comma-separated or repeated), e.g. T128x128x64-w8-s4-k2-tma")
    opts = p.parse_args(argv)
    if opts.list:
        print("\n".join(list(GEMM_SHAPES) + list(COMPILER_CASES)))
        return 0
    if opts.summary:
        return summary(opts.summary, opts.raw)
    bad = [c for c in opts.cases if c not in GEMM_SHAPES and c not in COMPILER_CASES]
    if bad:
        raise SystemExit(f"unknown cases {bad}; known: {', '.join(list(GEMM_SHAPES) + list(COMPILER_CASES))}")
    configs = [c for x in opts.config for c in x.split(",") if c]
    if configs:
        from tilefuse.kernels.gemm.configs import GemmConfig
        for label in configs:
            try:
                GemmConfig.from_label(label)
            except ValueError as exc:
                raise SystemExit(f"--config: {exc}") from None
    if opts.sustained > 0:
        return sustained(opts.cases, opts.sustained)
    return run(opts.cases, opts.profile, configs)


if __name__ == "__main__":
    raise SystemExit(main())
