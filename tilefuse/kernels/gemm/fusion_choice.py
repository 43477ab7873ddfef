"""Fused epilogue or cuBLAS + a kernel: the choice the compiler asks of the library for a GEMM with a pointwise tail.

Above the tuner and the plan (it times :func:`.plan.gemm_raw` against ``torch.matmul``), so neither imports the
other for it. Decision 026 says why and how it is keyed, decision 060 how it is timed.
"""
from __future__ import annotations

from ... import config as tf_config
from ... import device, diskcache
from .plan import gemm_raw
from .tuning import TUNE_TIE, Progress, _time, tuning_enabled

# The compiler asks, per GEMM with a fusable pointwise tail, whether to run the tail in the library template's
# epilogue or to run cuBLAS (torch.matmul) and the tail as its own kernel. Keyed by (device, triton, dtype,
# layout, M size class, N, K, epilogue-operand bytes class): a dynamic M (batch x sequence) lands in a power-of-
# two class instead of one timing a size. Timed once on the GPU with stand-ins for the tail (the library's
# built-in GeLU and a residual read the size of the tail's operands; the split side runs torch.matmul and one
# elementwise pass reading the product and the operands, writing the result), cached on disk for every process.
EPILOGUE_CHOICE_VERSION = 3  # bump when the timing or the rule changes: the stored choices are made again
EPILOGUE_MIN_M_CLASS = 16
# A split adds a launch, and its cuBLAS call costs more host time than the template's launch (decision 059's
# table: a cuBLAS call 15-27 us, the template's 5-16, a Triton launch 5), so it must save a launch's worth of GPU
# time a call. Timed a call at a time, the host decided GPT-2 decode's choice: 52 us for 9 us of kernel (060).
SPLIT_MIN_SAVING_US = 5.0
# Timing (_gpu_ms): rounds of calls queued behind a GPU sleep long enough for the host to queue them (~4 ms on an
# H100's clock; 20 calls of a cold split, cuBLAS and an elementwise kernel, queue in ~1 ms)
QUEUED_CALLS = 20
QUEUED_ROUNDS = 5
QUEUE_SLEEP_CYCLES = 8_000_000
_epilogue_memo: dict[str, str] = {}


def m_class(m: int) -> int:
    """The size class of a GEMM's M: the next power of two, at least EPILOGUE_MIN_M_CLASS."""
    return max(EPILOGUE_MIN_M_CLASS, 1 << max(int(m) - 1, 0).bit_length())


def _layout(shape, stride) -> str:
    return "T" if len(shape) >= 2 and stride[-2] == 1 and shape[-2] > 1 and stride[-1] != 1 else "N"


def epilogue_choice(a_shape, a_stride, b_shape, b_stride, dtype, extra_bytes: int) -> str:
    """``"fused"`` (the library template with the compiler's epilogue hook) or ``"split"`` (cuBLAS, then the
    epilogue as a separate kernel) for a GEMM of these operand shapes/strides and ``dtype`` whose epilogue reads
    or writes ``extra_bytes`` besides the product. On the interpreter, or with tuning off, always "fused": the
    deterministic CPU rule (the tests exercise the template), and the template's heuristic config on a GPU."""
    if not tuning_enabled():
        return "fused"
    import triton

    dev = device.current()
    M, K, N = int(a_shape[-2]), int(a_shape[-1]), int(b_shape[-1])
    Z = int(a_shape[0]) if len(a_shape) == 3 else 1
    extra_class = 0 if not extra_bytes else 1 << max(int(extra_bytes) - 1, 0).bit_length()
    key = "|".join([f"epi{EPILOGUE_CHOICE_VERSION}", dev.name, dev.arch, triton.__version__, str(dtype),
                    _layout(a_shape, a_stride) + _layout(b_shape, b_stride), f"Z{Z}", f"M{m_class(M)}", f"N{N}",
                    f"K{K}", f"E{extra_class}"])
    hit = _epilogue_memo.get(key)
    if hit is not None:
        return hit
    path = diskcache.folder("tuning", "gemm_epilogue") / f"{diskcache.digest(key)}.json"
    data = diskcache.read_json(path, check=lambda d: d["key"] == key and d["choice"] in ("fused", "split"))
    if data is None:
        data = _time_epilogue_choice(key, Z, m_class(M), N, K, a_shape, a_stride, b_stride, dtype, extra_bytes)
        diskcache.write_json(path, data)
    _epilogue_memo[key] = data["choice"]
    return data["choice"]


def split_wins(fused_us: float, split_us: float) -> bool:
    """Whether cuBLAS + a separate epilogue kernel beats the fused template, given each one's GPU time a call
    (us): faster beyond :data:`.tuning.TUNE_TIE`, and by at least :data:`SPLIT_MIN_SAVING_US`, the host time
    of the launch it adds. Anything closer goes to the template: one launch fewer, no product in memory."""
    return split_us * TUNE_TIE < fused_us and fused_us - split_us >= SPLIT_MIN_SAVING_US


def _gpu_ms(fn) -> tuple[float, str]:
    """``fn``'s GPU time a call (ms) and how it was timed: :data:`QUEUED_CALLS` calls queued behind a sleeping GPU
    (``torch.cuda._sleep``), so that they run back to back and the events around them leave the host's cost of a
    call out (a tiny GEMM's time would otherwise be that cost); the median of :data:`QUEUED_ROUNDS` rounds. A
    round whose queuing outlasted the sleep (the GPU waited for the host) makes it do_bench's time instead,
    host time included, and the log says so.

    Not a CUDA graph: triton's do_bench_cudagraph captures on the capture stream every capture shares, and a
    matmul in it left cuBLAS's workspace for that stream in the timing graph's pool; a compiled graph recorded
    later used it, and replays read freed memory (decision 060, amended)."""
    import statistics

    import torch

    stream = torch.cuda.current_stream()
    per_call = []
    for _ in range(QUEUED_ROUNDS):
        _, host_us, gpu_us = device.queued_behind_a_sleep(fn, stream, QUEUE_SLEEP_CYCLES, QUEUED_CALLS)
        if gpu_us is None:
            tf_config.log(1, f"gemm epilogue choice: queuing {QUEUED_CALLS} calls took {host_us / 1e3:.2f} ms, longer "
                             f"than the GPU's sleep; timing with do_bench, host time included")
            return _time(fn, None), "do_bench"
        per_call.append(gpu_us / 1e3 / QUEUED_CALLS)
    return float(statistics.median(per_call)), "queued behind a sleep"


def _time_epilogue_choice(key, Z, M, N, K, a_shape, a_stride, b_stride, dtype, extra_bytes) -> dict:
    import torch
    import torch.nn.functional as F

    dev = device.torch_device()
    a_t, b_t = _layout(a_shape, a_stride) == "T", _layout((K, N), b_stride) == "T"
    shape_a = (Z, M, K) if Z > 1 else (M, K)
    a = torch.randn(shape_a[:-2] + ((K, M) if a_t else (M, K)), device=dev, dtype=dtype)
    a = a.mT if a_t else a
    b = torch.randn(((Z,) if Z > 1 else ()) + ((N, K) if b_t else (K, N)), device=dev, dtype=dtype)
    b = b.mT if b_t else b
    out_shape = shape_a[:-1] + (N,)
    res = torch.randn(out_shape, device=dev, dtype=dtype) if extra_bytes else None
    progress = Progress(f"the epilogue of a {Z}x{M}x{N}x{K} {dtype} GEMM (fused template or cuBLAS + a kernel)")

    def fused():
        gemm_raw(a, b, activation="gelu", residual=res)

    def split():
        c = torch.matmul(a, b)
        F.gelu(c + res if res is not None else c)

    times, how = {}, {}
    for name, fn in (("fused", fused), ("split", split)):
        progress.update(f"timing {name} on the GPU ({2 - len(times)} candidates left)")
        fn()  # the template's first call tunes its config, outside the graph
        torch.cuda.synchronize()
        times[name], how[name] = _gpu_ms(fn)
    choice = "split" if split_wins(times["fused"] * 1e3, times["split"] * 1e3) else "fused"
    progress.done(f"{choice} (GPU time a call: fused {times['fused'] * 1e3:.1f} us, split "
                  f"{times['split'] * 1e3:.1f} us; a split must save {SPLIT_MIN_SAVING_US:g} us)")
    return {"key": key, "choice": choice, "ms": times, "timed_by": how}
