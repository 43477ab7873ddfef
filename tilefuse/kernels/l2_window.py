"""L2 access-policy windows: tell the GPU that a kernel streams an operand once.

A decode GEMM (M <= 256, N = K = 8192) reads its 128 MiB weight B exactly once, through an L2 of ~50 MB that
holds whatever ran before. With normal lines each load of B may evict a line something else wrote, and
writing that line back to HBM falls inside the GEMM's time: after ``triton.testing.do_bench``'s L2 flush
(which zeroes 256 MB) that costs every decode row 7-8 us of ~44 (device run 36, benchmarks/notes/gemm.md). An
evict-first hint on B's loads keeps B's lines the first to go, but Triton 3.6 drops the hint from its
cp.async and TMA pipelines (checked in the PTX).

CUDA offers the same thing for an address range rather than a load: a stream's *access-policy window*
(``CU_STREAM_ATTRIBUTE_ACCESS_POLICY_WINDOW``) gives the accesses of the kernels launched into it that fall in
``[base, base + num_bytes)`` a hit property; ``CU_ACCESS_PROPERTY_STREAMING`` lines are the likeliest to be
evicted, as evict-first ones are. :func:`streaming` sets such a window on the launch's stream for one launch
and puts back what the stream had before (a library must not leave its policy on a user's stream).

Driver API through ctypes (``libcuda.so.1``): no build, the same on every CUDA the image has. Where the
driver is missing or refuses (the legacy default stream, a device without windows), the launch runs without
a window and :func:`available` says why.
"""
from __future__ import annotations

import contextlib
import ctypes
import threading

CU_STREAM_ATTRIBUTE_ACCESS_POLICY_WINDOW = 1  # = CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW (cuda.h)
CU_DEVICE_ATTRIBUTE_MAX_ACCESS_POLICY_WINDOW_SIZE = 109
NORMAL, STREAMING, PERSISTING = 0, 1, 2  # CUaccessProperty


class AccessPolicyWindow(ctypes.Structure):
    """CUaccessPolicyWindow (cuda.h)."""
    _fields_ = [("base_ptr", ctypes.c_void_p), ("num_bytes", ctypes.c_size_t), ("hitRatio", ctypes.c_float),
                ("hitProp", ctypes.c_int), ("missProp", ctypes.c_int)]


class StreamAttrValue(ctypes.Union):
    """CUstreamAttrValue = CUlaunchAttributeValue: a 64-byte union whose access-policy member comes first."""
    _fields_ = [("accessPolicyWindow", AccessPolicyWindow), ("pad", ctypes.c_char * 64)]


class _Driver:
    """The three driver calls this needs, bound once (``None`` where libcuda is missing)."""

    def __init__(self, lib):
        self.set_attr = lib.cuStreamSetAttribute
        self.set_attr.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(StreamAttrValue)]
        self.get_attr = lib.cuStreamGetAttribute
        self.get_attr.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(StreamAttrValue)]
        self.dev_attr = lib.cuDeviceGetAttribute
        self.dev_attr.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_int]
        for f in (self.set_attr, self.get_attr, self.dev_attr):
            f.restype = ctypes.c_int


_lock = threading.Lock()
_driver: _Driver | None = None
_driver_error: str | None = None
_max_bytes: dict[int, int] = {}


def driver() -> _Driver | None:
    global _driver, _driver_error
    if _driver is None and _driver_error is None:
        with _lock:
            if _driver is None and _driver_error is None:
                try:
                    _driver = _Driver(ctypes.CDLL("libcuda.so.1"))
                except (OSError, AttributeError) as e:
                    _driver_error = f"libcuda.so.1 not usable: {e}"
    return _driver


def available() -> tuple[bool, str]:
    """(whether windows can be set here, why not)."""
    return (driver() is not None, _driver_error or "")


def max_window_bytes(device_index: int) -> int:
    """The largest window the device takes (0: no windows). An H100/H200 takes just under 128 MiB."""
    got = _max_bytes.get(device_index)
    if got is None:
        drv = driver()
        value = ctypes.c_int(0)
        if drv is None or drv.dev_attr(ctypes.byref(value), CU_DEVICE_ATTRIBUTE_MAX_ACCESS_POLICY_WINDOW_SIZE,
                                       device_index) != 0:
            value.value = 0
        got = _max_bytes[device_index] = max(0, value.value)
    return got


def window(base_ptr: int, num_bytes: int, max_bytes: int, prop: int = STREAMING) -> StreamAttrValue:
    """The attribute value for a window over ``num_bytes`` from ``base_ptr``, cut to ``max_bytes`` (the
    window then covers the operand's first ``max_bytes``: the rest keeps the normal policy)."""
    v = StreamAttrValue()
    w = v.accessPolicyWindow
    w.base_ptr = base_ptr
    w.num_bytes = min(num_bytes, max_bytes)
    w.hitRatio = 1.0
    w.hitProp = prop
    w.missProp = NORMAL if prop == PERSISTING else prop  # missProp may only be NORMAL or STREAMING
    return v


@contextlib.contextmanager
def streaming(stream: int, device_index: int, base_ptr: int, num_bytes: int):
    """Within the block, launches on ``stream`` see ``[base_ptr, base_ptr + num_bytes)`` as streaming. Yields
    whether the window was set; the stream's previous window is restored on the way out."""
    drv = driver()
    limit = max_window_bytes(device_index) if drv is not None else 0
    if drv is None or limit <= 0 or num_bytes <= 0:
        yield False
        return
    old = StreamAttrValue()
    handle = ctypes.c_void_p(stream)
    if drv.get_attr(handle, CU_STREAM_ATTRIBUTE_ACCESS_POLICY_WINDOW, ctypes.byref(old)) != 0:
        yield False
        return
    new = window(base_ptr, num_bytes, limit)
    if drv.set_attr(handle, CU_STREAM_ATTRIBUTE_ACCESS_POLICY_WINDOW, ctypes.byref(new)) != 0:
        yield False
        return
    try:
        yield True
    finally:
        drv.set_attr(handle, CU_STREAM_ATTRIBUTE_ACCESS_POLICY_WINDOW, ctypes.byref(old))
