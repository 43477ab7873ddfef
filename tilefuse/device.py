"""What tilefuse runs on, decided in one place.

Three cases: an NVIDIA GPU through CUDA, an AMD GPU through ROCm/HIP (``torch.version.hip``), or no GPU,
in which case Triton kernels run on Triton's interpreter over CPU tensors. The interpreter is switched on
here, at import, before any ``@triton.jit`` in tilefuse runs: ``tilefuse/__init__`` imports this module
first and imports kernel modules lazily.

Also here: datasheet peaks as data (leads, never used as a measured figure) and measured ceilings (device
copy bandwidth, dense bf16/fp16 matmul rate through the vendor BLAS) measured on request and cached on
disk per device.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import functools
import os
import re
from typing import Optional

import torch

from . import config, diskcache


# --------------------------------------------------------------------------------------------- the device
@dataclasses.dataclass(frozen=True)
class Device:
    vendor: str  # "nvidia" | "amd" | "cpu"
    name: str  # as the driver reports it, or "cpu (Triton interpreter)"
    arch: str  # "sm_90", "gfx942", or "cpu"
    multiprocessors: int  # SMs (NVIDIA) or CUs (AMD); CPU cores on the interpreter
    warp_size: int  # 32 on NVIDIA, 64 on AMD CDNA; 32 on the interpreter (Triton's default)
    interpreter: bool  # Triton kernels run on Triton's interpreter
    torch_device: str  # where tilefuse puts tensors: "cuda" (also ROCm) or "cpu"
    memory_bytes: int = 0
    l2_bytes: int = 0

    @property
    def is_gpu(self) -> bool:
        return self.vendor in ("nvidia", "amd")

    @property
    def capability(self) -> tuple[int, int] | None:
        m = re.fullmatch(r"sm_(\d+)(\d)a?", self.arch)
        return (int(m.group(1)), int(m.group(2))) if m else None

    def describe(self) -> str:
        if not self.is_gpu:
            if not self.interpreter:
                return "no GPU and the interpreter is off (TILEFUSE_INTERPRET=0): kernels can only be cross-compiled"
            return f"no GPU: Triton kernels run on Triton's interpreter over CPU tensors ({self.multiprocessors} CPU cores)"
        extra = " (forced onto the interpreter by TILEFUSE_INTERPRET=1)" if self.interpreter else ""
        unit = "SMs" if self.vendor == "nvidia" else "CUs"
        return f"{self.name}, {self.arch}, {self.multiprocessors} {unit}, warp size {self.warp_size}{extra}"


def _gpu_present() -> bool:
    try:
        return torch.cuda.is_available()
    except Exception:  # a broken driver install is "no GPU" for us, not a crash at import
        return False


def _detect(interpret: bool) -> Device:
    if not _gpu_present():
        name = "cpu (Triton interpreter)" if interpret else "cpu (compile-only: TILEFUSE_INTERPRET=0)"
        return Device("cpu", name, "cpu", os.cpu_count() or 1, 32, interpret, "cpu")
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    mem = int(getattr(props, "total_memory", 0))
    l2 = int(getattr(props, "L2_cache_size", 0))
    torch_device = "cpu" if interpret else "cuda"
    if torch.version.hip:
        arch = str(getattr(props, "gcnArchName", "gfx000")).split(":")[0]
        warp = int(getattr(props, "warp_size", 64) or 64)
        return Device("amd", props.name, arch, props.multi_processor_count, warp, interpret, torch_device, mem, l2)
    major, minor = props.major, props.minor
    warp = int(getattr(props, "warp_size", 32) or 32)
    return Device("nvidia", props.name, f"sm_{major}{minor}", props.multi_processor_count, warp, interpret,
                  torch_device, mem, l2)


def _wants_interpreter() -> bool:
    choice = config.get().interpret
    if choice == "1":
        return True
    if choice == "0":
        return False
    return not _gpu_present()


_INTERPRET = _wants_interpreter()
if _INTERPRET:
    # Triton reads this when a function is decorated, so it must be set before any kernel module imports.
    os.environ["TRITON_INTERPRET"] = "1"


@functools.lru_cache(maxsize=1)
def current() -> Device:
    """The device tilefuse runs on in this process."""
    return _detect(_INTERPRET)


def interpreting() -> bool:
    """True when Triton kernels run on the interpreter (no GPU, or TILEFUSE_INTERPRET=1)."""
    return _INTERPRET


def torch_device() -> torch.device:
    return torch.device(current().torch_device)


def queued_behind_a_sleep(call, stream=None, sleep_cycles: int = 0, calls: int = 1):
    """``calls`` calls of ``call()`` timed on the GPU's clock: ``(the last call's result, host us the calls took,
    GPU us they took, or None)``. The CUDA ``stream``'s queue is drained (a launch waiting for room in a full
    queue would count GPU time as host time), the GPU sleeps ``sleep_cycles`` (``torch.cuda._sleep``) while the
    host queues the calls, and events around them time their work run back to back, with no host time in it.
    That time counts only if the sleep outlasted the queuing; otherwise the GPU waited for the host, and it is
    None. ``stream=None``: host time only, nothing synced. The garbage collector waits until the calls are
    queued. One helper for every caller that times this way (the epilogue choice, a runner's timed call)."""
    import gc
    import time

    if stream is not None:
        stream.synchronize()
        with torch.cuda.device(stream.device):
            slept, start, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
            slept.record(stream)
            torch.cuda._sleep(sleep_cycles)  # on the current device: the stream's, inside this block
            start.record(stream)
    collecting = gc.isenabled()
    gc.disable()
    try:
        t0 = time.perf_counter()
        for _ in range(calls):
            out = call()
        host_us = (time.perf_counter() - t0) * 1e6
    finally:
        if collecting:
            gc.enable()
    if stream is None:
        return out, host_us, None
    end.record(stream)
    end.synchronize()
    gpu_us = start.elapsed_time(end) * 1e3
    return out, host_us, (gpu_us if host_us < slept.elapsed_time(start) * 1e3 else None)


# ----------------------------------------------------------------------------------- datasheet peaks (data)
@dataclasses.dataclass(frozen=True)
class Datasheet:
    """Vendor datasheet figures: dense (no sparsity) TFLOP/s and HBM TB/s. Leads, not measurements."""
    part: str
    bf16: float
    fp16: float
    fp8: float | None
    int8: float | None  # TOP/s
    tf32: float | None
    fp32: float
    hbm_tbps: float


# Match order matters: the first entry whose pattern is found in the device name wins.
DATASHEETS: tuple[tuple[str, Datasheet], ...] = (
    ("H200", Datasheet("NVIDIA H200 SXM", 989.4, 989.4, 1978.9, 1978.9, 494.7, 66.9, 4.8)),
    ("H100 PCIe", Datasheet("NVIDIA H100 PCIe", 756.5, 756.5, 1513.0, 1513.0, 378.0, 51.2, 2.0)),
    ("H100", Datasheet("NVIDIA H100 SXM", 989.4, 989.4, 1978.9, 1978.9, 494.7, 66.9, 3.35)),
    ("A100", Datasheet("NVIDIA A100 SXM 80GB", 312.0, 312.0, None, 624.0, 156.0, 19.5, 2.039)),
    ("B200", Datasheet("NVIDIA HGX B200", 2250.0, 2250.0, 4500.0, 4500.0, 1100.0, 75.0, 8.0)),
    ("MI325X", Datasheet("AMD Instinct MI325X", 1307.4, 1307.4, 2614.9, 2614.9, 653.7, 163.4, 6.0)),
    ("MI300X", Datasheet("AMD Instinct MI300X", 1307.4, 1307.4, 2614.9, 2614.9, 653.7, 163.4, 5.3)),
)


def datasheet(device: Device | None = None) -> Optional[Datasheet]:
    return datasheet_named((device or current()).name)


def datasheet_named(name: str) -> Optional[Datasheet]:
    """The datasheet of the part whose driver name is ``name`` (None for a part not in :data:`DATASHEETS`)."""
    for pattern, sheet in DATASHEETS:
        if pattern.lower() in name.lower():
            return sheet
    return None


# ------------------------------------------------------------------------------------- measured ceilings
@dataclasses.dataclass(frozen=True)
class Ceilings:
    device: str
    copy_gbps: float  # device-to-device copy, bytes read + bytes written
    bf16_tflops: float  # torch.matmul at CEILING_MATMUL_N³, random normal inputs
    fp16_tflops: float
    matmul_n: int
    torch: str
    triton: str
    measured_at: str


CEILING_COPY_BYTES = 2 << 30  # 2 GiB each way: 34x the H200's 60 MiB L2, so the copy cannot sit in cache
CEILING_MATMUL_N = 8192  # large enough to fill 132 SMs with 128x256 tiles many times over


def _ceilings_path(device: Device):
    slug = re.sub(r"[^A-Za-z0-9]+", "-", f"{device.name}-{device.arch}").strip("-")
    return diskcache.folder("ceilings") / f"{slug}.json"


def ceilings(device: Device | None = None) -> Optional[Ceilings]:
    """The ceilings measured earlier on this device (from the disk cache), or None."""
    device = device or current()
    if not device.is_gpu:
        return None
    data = diskcache.read_json(_ceilings_path(device))
    if not data:
        return None
    try:
        return Ceilings(**data)
    except TypeError:  # an entry from an older layout is a miss
        return None


def measure_ceilings() -> Ceilings:
    """Measure the copy bandwidth and the dense bf16/fp16 matmul rate on this GPU, and cache them."""
    import triton
    from triton.testing import do_bench

    device = current()
    if not device.is_gpu or device.interpreter:
        raise RuntimeError("measure_ceilings needs a GPU (this process runs on Triton's interpreter)")
    n = CEILING_COPY_BYTES // 2
    src = torch.randn(n, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), warmup=50, rep=300, return_mode="median")
    copy_gbps = 2 * CEILING_COPY_BYTES / (ms * 1e-3) / 1e9
    del src, dst
    rates = {}
    N = CEILING_MATMUL_N
    for dtype in (torch.bfloat16, torch.float16):
        a = torch.randn(N, N, dtype=dtype, device="cuda")
        b = torch.randn(N, N, dtype=dtype, device="cuda")
        ms = do_bench(lambda: torch.matmul(a, b), warmup=100, rep=500, return_mode="median")
        rates[dtype] = 2 * N**3 / (ms * 1e-3) / 1e12
        del a, b
    torch.cuda.empty_cache()
    result = Ceilings(device.name, round(copy_gbps, 1), round(rates[torch.bfloat16], 1),
                      round(rates[torch.float16], 1), N, torch.__version__, triton.__version__,
                      _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))
    diskcache.write_json(_ceilings_path(device), dataclasses.asdict(result))
    return result
