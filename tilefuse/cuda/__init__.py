"""The CUDA C++ GEMM ladder, called from Python: ``tilefuse.cuda.gemm(a, b, rung=9)``.

One ``.cu`` file a rung (``tilefuse/cuda/ladder/rung*.cu``), from a naive kernel (1) to a persistent, warp-specialised
Hopper kernel with TMA multicast (9), plus ``5s``, a split-K rung whose warp code is written portably for 32-
and 64-lane warps. Shared headers: ``common.cuh`` (the C ABI of rungs 1-6 and 5s), ``mma_sm80.cuh`` (rung 6's
tensor-core helpers), ``hopper.cuh`` (the TMA, mbarrier and wgmma helpers of rungs 7-9) and ``gelu_erfc.cuh``
(the epilogues' GeLU). :func:`rungs` lists them with their metadata. Each rung is built on first use by nvcc into a
shared library exporting a C launcher (``build.py``; cached on disk), loaded with ctypes and called with the
tensors' pointers and the current stream (``launch.py``). On CPU tensors, the rungs with an emulator build
(1-6 and 5s) run on a host-side SIMT emulator of the same source (``emulator.h``): slow, for tests.

``tilefuse targets`` shows every rung beside the Triton kernels (registered here as the ``cuda-ladder``
provider): the NVIDIA build with its registers, spills, shared memory and SASS instruction, the HIP
translation of the portable rungs compiled for AMD, and "n/a" with the reason for the rest.
"""
from __future__ import annotations

from typing import Optional

import torch

from .. import config, targets
from . import build as _build
from . import launch as _launch
from .build import BuildError, Rung
from .launch import CudaError

__all__ = ["gemm", "rungs", "BuildError", "CudaError", "Rung", "DTYPES", "ACTIVATIONS"]

DTYPES = (torch.bfloat16, torch.float16)
ACTIVATIONS = (None, "gelu")
ALIGNMENT_BYTES = 16  # the vectorised rungs (4-9) read 16-byte chunks; TMA needs 16-byte aligned rows
ALIGNED_LD_MULTIPLE = 8  # 8 bf16/fp16 elements = 16 bytes


def rungs() -> list[Rung]:
    """Every rung, in ladder order, with its metadata: ``name``, ``path``, ``arch`` (sm_80 / sm_90a),
    ``portable`` (translated to HIP) and ``reason`` (why not), ``claims`` (the SASS instruction its kernels
    contain), ``emulate`` (runs on CPU tensors), ``title``, ``lines_of_code()``."""
    return list(_build._rungs_cached(str(_build.LADDER_DIR)))


def _names() -> str:
    return ", ".join(_build.repr_rung(r.name) for r in rungs())


def gemm(a: torch.Tensor, b: torch.Tensor, rung: int | str = 9, bias: Optional[torch.Tensor] = None,
         activation: Optional[str] = None) -> torch.Tensor:
    """``activation(a @ b + bias)`` computed by one rung of the CUDA C++ ladder.

    Args:
        a: (M, K), bf16 or fp16, on a CUDA GPU (or the CPU: emulated rungs only, slow).
        b: (K, N), the same dtype and device as ``a``.
        rung: 1-9 or "5s" (see :func:`rungs`). Rungs 7-9 need an sm_90 GPU (H100/H200); 1-6 and 5s sm_80+.
        bias: (N,) or (1, N), any float dtype (it is converted to ``a``'s dtype, as the kernels read it).
        activation: None or "gelu" (exact, erf form); "gelu" without a bias adds a zero bias.

    Layouts: the result is a new row-major (M, N) tensor of ``a``'s dtype, fp32 accumulation. ``a`` is used
    as is when it is row-major (unit column stride) with a suitable leading dimension, else copied. What each
    rung wants of ``b``: rungs 1-6 and 5s read B as [K, N] row-major (a row-major ``b`` is used as is; any
    other is copied to row-major); rungs 7-9 read B K-major, i.e. as [N, K] row-major, so pass
    ``b = w.t()`` for a row-major (N, K) weight ``w`` (an ``nn.Linear`` weight) and it is used without a copy;
    a row-major (K, N) ``b`` is transposed into a K-major copy first (an extra read and write of B). Rungs 4-9
    also need 16-byte aligned operands with leading dimensions a multiple of 8 elements; other views are
    copied. Shape multiples (e.g. N and K % 8 for rungs 4-6) are checked, not padded.

    Rung 9 splits the tiles of a mostly empty last round of its persistent grid by k-tiles (stream-K, where the
    round shrinks by more than 16 k-tiles: 8192^3 and 16384x4096x4096 on an H200, not 4096^3; never with GeLU or
    under CUDA-graph capture). Split results are deterministic but may differ in the last bits from an unsplit
    run's (fp32 partial sums added in another order). The first split call on a device allocates a ~17 MB
    workspace with cudaMalloc, outside torch's allocator, kept for the process. Where it does not split, a last
    round that leaves clusters idle is evened out with narrow tiles instead (240 columns: 4 of the 16 cluster-rows
    at 4096^3 on an H200), with no workspace and no fix-up.

    Raises TypeError/ValueError naming the argument and the accepted values before anything is launched;
    :class:`BuildError` when a rung does not compile; :class:`CudaError` with the CUDA error string when a
    launcher fails.
    """
    r = _rung_arg(rung)
    epilogue = _check_operands(a, b, bias, activation)
    m, k = a.shape
    n = b.shape[1]
    lib = _library_for(r, a.device)
    _check_requirements(r, lib, m, n, k)
    dtype = a.dtype
    if m == 0 or n == 0:
        return torch.empty((m, n), dtype=dtype, device=a.device)
    bias_vec = None
    if epilogue:
        bias_vec = (bias.reshape(n) if bias is not None else torch.zeros(n, device=a.device)).to(dtype).contiguous()
    if k == 0:  # nothing to multiply: the epilogue of zeros (rungs 7-9 need K >= 8, so no launch at all)
        out = torch.zeros((m, n), dtype=torch.float32, device=a.device)
        if bias_vec is not None:
            out = out + bias_vec.float()
        return (torch.nn.functional.gelu(out) if epilogue == 2 else out).to(dtype)
    aligned = lib.requirements[2] % ALIGNED_LD_MULTIPLE == 0 or lib.requirements[1] % ALIGNED_LD_MULTIPLE == 0
    a_rm, lda = _row_major(a, aligned)
    if lib.b_layout == 1:
        b_rm, ldb = _row_major(b.t(), aligned)  # [N, K] row-major: a transposed row-major (N, K) is free
    else:
        b_rm, ldb = _row_major(b, aligned)
    c = torch.empty((m, n), dtype=dtype, device=a.device)
    stream = torch.cuda.current_stream(a.device).cuda_stream if a.device.type == "cuda" else None
    lib(a_rm.data_ptr(), b_rm.data_ptr(), c.data_ptr(), None if bias_vec is None else bias_vec.data_ptr(),
        m, n, k, lda, ldb, n, str(dtype).replace("torch.", ""), epilogue, stream)
    if a.device.type == "cuda" and config.get().debug >= 1:
        torch.cuda.synchronize(a.device)  # TILEFUSE_DEBUG=1: a fault shows up at this call, not a later one
    return c


# ------------------------------------------------------------------------------------------ validation
def _rung_arg(rung) -> Rung:
    if isinstance(rung, bool) or not isinstance(rung, (int, str)):
        raise TypeError(f"rung={rung!r}: accepted values are {_names()}")
    try:
        return _build.rung(rung)
    except ValueError:
        raise ValueError(f"rung={rung!r}: accepted values are {_names()}") from None


def _check_operands(a, b, bias, activation) -> int:
    """Type, dtype, shape and device checks; returns the ABI's epilogue code."""
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 2:
            raise ValueError(f"{name} must be 2-D ({'M, K' if name == 'a' else 'K, N'}), got shape {tuple(t.shape)}")
        if t.dtype not in DTYPES:
            raise TypeError(f"{name}.dtype={t.dtype}: accepted dtypes are torch.bfloat16, torch.float16")
    if b.dtype != a.dtype:
        raise TypeError(f"b.dtype={b.dtype} differs from a.dtype={a.dtype}: both must be torch.bfloat16 or both "
                        "torch.float16")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"a is {tuple(a.shape)} and b is {tuple(b.shape)}: a.shape[1] (K) must equal b.shape[0]")
    if a.device != b.device:
        raise ValueError(f"a is on {a.device} and b on {b.device}: both must be on the same device")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation={activation!r}: accepted values are None, 'gelu'")
    if bias is not None:
        n = b.shape[1]
        if not isinstance(bias, torch.Tensor):
            raise TypeError(f"bias must be a torch.Tensor or None, got {type(bias).__name__}")
        if tuple(bias.shape) not in ((n,), (1, n)):
            raise ValueError(f"bias has shape {tuple(bias.shape)}: accepted shapes are ({n},) and (1, {n})")
        if not bias.dtype.is_floating_point:
            raise TypeError(f"bias.dtype={bias.dtype}: accepted dtypes are floating-point ones")
        if bias.device != a.device:
            raise ValueError(f"bias is on {bias.device} and a on {a.device}: both must be on the same device")
    if activation == "gelu":
        return 2
    return 1 if bias is not None else 0


def _library_for(r: Rung, dev: torch.device) -> _launch.RungLibrary:
    """Build (cached) and load the library that runs rung ``r`` on tensors of device ``dev``."""
    if dev.type == "cpu":
        if not r.emulate:
            emulated = ", ".join(_build.repr_rung(x.name) for x in rungs() if x.emulate)
            raise ValueError(f"rung {r.name} runs on a CUDA GPU only ({r.arch}; {r.reason}); on CPU tensors the "
                             f"emulated rungs are {emulated}")
        return _loaded(r, _build.HOST_TARGET)
    if dev.type != "cuda" or getattr(torch.version, "hip", None):
        raise ValueError(f"tensors on {dev} ({'ROCm' if getattr(torch.version, 'hip', None) else dev.type}): the "
                         "ladder is CUDA C++ for NVIDIA GPUs (or the CPU emulator); on AMD use the Triton GEMM "
                         "(tilefuse.gemm) or `tilefuse port` to translate the portable rungs to HIP")
    return _loaded(r, _build.device_target(r, torch.cuda.get_device_capability(dev)))


# The host time of gemm() is inside every timed call: the build lookup alone (hash the rung's source and
# headers, read its cache report) took 170-240 us a call on the 2-core CI machine, and the H200 timed rungs
# 7-9 at a floor of ~0.26-0.37 ms, 4096^3 and 16x8192x8192 alike (do_bench's L2 flush hides only ~0.08 ms of
# host time; docs/decisions/002-ladder-host-time-floor.md). So a loaded library is remembered for (rung,
# target, cache folder, nvcc) while the stat (mtime, size) of the files it was built from is unchanged: a few
# microseconds a call.
_LIBRARIES: dict[tuple, tuple[tuple, tuple, _launch.RungLibrary]] = {}


def _stamp(paths) -> tuple:
    out = []
    for p in paths:
        try:
            st = p.stat()
            out.append((st.st_mtime_ns, st.st_size))
        except OSError:
            out.append(None)
    return tuple(out)


def _loaded(r: Rung, target: str) -> _launch.RungLibrary:
    cfg = config.get()
    key = (r.name, str(r.path), target, str(cfg.cache_dir), cfg.nvcc)
    hit = _LIBRARIES.get(key)
    if hit is not None and _stamp(hit[0]) == hit[1]:
        return hit[2]
    paths = (r.path, *r.includes())
    stamp = _stamp(paths)  # taken before the build: an edit made meanwhile shows at the next call
    emulate = target == _build.HOST_TARGET
    lib = _launch.load(_build.build(r, emulate=True) if emulate else _build.build(r, target))
    _LIBRARIES[key] = (paths, stamp, lib)
    return lib


def _check_requirements(r: Rung, lib: _launch.RungLibrary, m: int, n: int, k: int) -> None:
    mm, nm, km = lib.requirements
    bad = [f"{what} % {mult} == 0" for what, value, mult in (("M", m, mm), ("N", n, nm), ("K", k, km))
           if mult > 1 and value % mult]
    if bad:
        raise ValueError(f"rung {r.name} needs {' and '.join(bad)}: got (M, N, K) = ({m}, {n}, {k}); pad the "
                         "operands, or use rung 1, 2 or 3, which accept any shape")


def _row_major(t: torch.Tensor, aligned: bool) -> tuple[torch.Tensor, int]:
    """``t`` itself when it is row-major with a usable leading dimension (and, if ``aligned``, a 16-byte
    aligned start and a leading dimension that is a multiple of 8 elements), else a fresh row-major copy;
    with the leading dimension to pass."""
    rows, cols = t.shape
    ld = t.stride(0) if rows > 1 else cols
    ok = (t.stride(1) == 1 or cols <= 1) and ld >= cols
    if ok and aligned:
        ok = ld % ALIGNED_LD_MULTIPLE == 0 and t.data_ptr() % ALIGNMENT_BYTES == 0
    if ok:
        return t, ld
    copy = torch.empty((rows, cols), dtype=t.dtype, device=t.device).copy_(t)
    return copy, cols


# ------------------------------------------------------------------------------ the targets provider
def _provider(target_names):
    from .target_rows import rows

    return rows(target_names)


targets.register_provider("cuda-ladder", _provider)
