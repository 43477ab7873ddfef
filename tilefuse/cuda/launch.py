"""Load a rung's shared library with ctypes and call its C launcher on tensors' pointers.

No torch extension is built: each library exports plain C functions (common.cuh, "the C ABI"), called with
``data_ptr()`` values, leading dimensions and the current stream's handle (``cuda_stream``). Every call's
return code is checked; a non-zero code raises :class:`CudaError` with the CUDA error string, taken from
the library (``tilefuse_error_string``, rungs on common.cuh), else from the libcudart this process has
loaded (torch's), else a table of the codes the launchers return.

Emulator libraries (host builds, ``build(..., emulate=True)``) run on CPU tensors; their state is
process-wide (the emulator's scheduler is one static), so calls into them are serialised.
"""
from __future__ import annotations

import ctypes
import dataclasses
import threading
from pathlib import Path
from typing import Any

from .. import config
from . import build as _build

DTYPE_CODES = {"bfloat16": 0, "float16": 1}
EPILOGUES = {None: 0, "bias": 1, "bias_gelu": 2}
B_LAYOUTS = {0: "B [K,N] row-major", 1: "B given as [N,K] row-major (K-major)"}
# What the launchers return, for when no library can name a code (cudaError_t values of CUDA 12/13).
KNOWN_ERRORS = {0: "no error", 1: "invalid argument", 2: "out of memory", 9: "invalid configuration argument",
                98: "invalid device function", 209: "no kernel image is available for execution on the device",
                222: "the provided PTX was compiled with an unsupported toolchain", 700: "an illegal memory access was encountered",
                719: "unspecified launch failure", 801: "operation not supported"}
CUDA_ERROR_NAMES = {1: "cudaErrorInvalidValue", 2: "cudaErrorMemoryAllocation", 9: "cudaErrorInvalidConfiguration",
                    98: "cudaErrorInvalidDeviceFunction", 209: "cudaErrorNoKernelImageForDevice",
                    700: "cudaErrorIllegalAddress", 719: "cudaErrorLaunchFailure", 801: "cudaErrorNotSupported"}

_EMULATOR_LOCK = threading.Lock()


class CudaError(RuntimeError):
    """A launcher returned a cudaError_t other than cudaSuccess."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


@dataclasses.dataclass
class RungLibrary:
    """One loaded rung library: ``__call__`` launches, ``b_layout`` and ``requirements`` describe it."""
    rung: str
    build: _build.Build
    lib: Any
    b_layout: int
    requirements: tuple[int, int, int]  # multiples of M, N, K
    lock: threading.Lock | None  # the emulator's (None on the GPU)

    @property
    def emulated(self) -> bool:
        return self.build.emulated

    def __call__(self, a_ptr: int, b_ptr: int, c_ptr: int, bias_ptr: int | None, m: int, n: int, k: int,
                 lda: int, ldb: int, ldc: int, dtype: str, epilogue: int, stream: int | None) -> None:
        fn = getattr(self.lib, f"tilefuse_rung{self.rung}")
        args = (a_ptr, b_ptr, c_ptr, bias_ptr, m, n, k, lda, ldb, ldc, DTYPE_CODES[dtype], epilogue, stream)
        if self.lock is not None:
            with self.lock:
                code = fn(*args)
        else:
            code = fn(*args)
        if code != 0:
            raise CudaError(f"tilefuse_rung{self.rung} ({self.build.target}) returned {error_name(code)} "
                            f"({code}): {error_string(code, self.lib)}"
                            + (f" [M={m} N={n} K={k} lda={lda} ldb={ldb} ldc={ldc}]" if code == 1 else ""), code)

    # ------------------------------------------------------------------------------- emulator counters
    def stat(self, name: str) -> int:
        """An emulator counter (launches, mma_ops, ldmatrix_conflicts, bad_addresses, deadlocks, ...)."""
        if not self.emulated:
            raise ValueError(f"rung {self.rung} is a GPU build: counters exist in emulator builds only")
        return int(self.lib.tilefuse_emu_stat(name.encode()))

    def set(self, name: str, value: int) -> None:
        """Emulator settings: ``lazy_copies`` (0/1: cp.async completes at issue / at wait), ``reset``."""
        if not self.emulated:
            raise ValueError(f"rung {self.rung} is a GPU build: settings exist in emulator builds only")
        if self.lib.tilefuse_emu_set(name.encode(), int(value)) != 0:
            raise ValueError(f"unknown emulator setting {name!r}: accepted values are 'lazy_copies', 'reset'")


def error_name(code: int) -> str:
    return CUDA_ERROR_NAMES.get(code, "cudaError")


def error_string(code: int, lib: Any = None) -> str:
    """The CUDA runtime's description of ``code``."""
    for source in (lib, _process_cudart()):
        fn = getattr(source, "tilefuse_error_string", None) or getattr(source, "cudaGetErrorString", None)
        if fn is None:
            continue
        try:
            fn.restype = ctypes.c_char_p
            fn.argtypes = [ctypes.c_int]
            text = fn(int(code))
        except (OSError, ctypes.ArgumentError):
            continue
        if text:
            return text.decode(errors="replace")
    return KNOWN_ERRORS.get(code, f"CUDA error {code}")


_CUDART: list[Any] = []


def _process_cudart() -> Any:
    """The libcudart already mapped into this process (torch's), found through /proc/self/maps."""
    if _CUDART:
        return _CUDART[0]
    lib = None
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "libcudart.so" in line}
        for path in sorted(paths):
            try:
                lib = ctypes.CDLL(path)
                break
            except OSError:
                continue
    except OSError:
        pass
    if lib is not None:
        _CUDART.append(lib)
    return lib


_LOADED: dict[Path, RungLibrary] = {}
_LOAD_LOCK = threading.Lock()


def load(built: _build.Build) -> RungLibrary:
    """ctypes-load a build (once per library file) and read its layout and requirements. The library is
    checked first (:func:`tilefuse.cuda.build.library_problem`): one that is not what was built (truncated,
    emptied, overwritten since) is rebuilt rather than handed to dlopen, which dies of SIGBUS on a truncated
    ELF file."""
    with _LOAD_LOCK:
        if built.library in _LOADED:
            return _LOADED[built.library]
        problem = _build.library_problem(built)
        if problem is not None:
            built = _build.rebuild(built, problem)
            problem = _build.library_problem(built)
            if problem is not None:
                raise _build.BuildError(f"rung {built.rung} ({built.target}): the library just built at "
                                        f"{built.library} fails its check: {problem}")
        lib = ctypes.CDLL(str(built.library))
        name = built.rung
        fn = getattr(lib, f"tilefuse_rung{name}")
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int] * 3 + [ctypes.c_longlong] * 3 + \
                      [ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
        layout = getattr(lib, f"tilefuse_rung{name}_b_layout")
        layout.restype = ctypes.c_int
        layout.argtypes = []
        req = getattr(lib, f"tilefuse_rung{name}_requirements")
        req.restype = ctypes.c_int
        req.argtypes = [ctypes.POINTER(ctypes.c_int)] * 3
        m, n, k = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
        if req(ctypes.byref(m), ctypes.byref(n), ctypes.byref(k)) != 0:
            raise _build.BuildError(f"tilefuse_rung{name}_requirements failed in {built.library}")
        if built.emulated:
            lib.tilefuse_emu_stat.restype = ctypes.c_longlong
            lib.tilefuse_emu_stat.argtypes = [ctypes.c_char_p]
            lib.tilefuse_emu_set.restype = ctypes.c_int
            lib.tilefuse_emu_set.argtypes = [ctypes.c_char_p, ctypes.c_longlong]
        loaded = RungLibrary(rung=name, build=built, lib=lib, b_layout=int(layout()),
                             requirements=(m.value, n.value, k.value),
                             lock=_EMULATOR_LOCK if built.emulated else None)
        if loaded.b_layout not in B_LAYOUTS:
            raise _build.BuildError(f"tilefuse_rung{name}_b_layout returned {loaded.b_layout}: expected 0 or 1")
        config.log(1, f"cuda ladder: loaded rung {name} ({built.target}) from {built.library}")
        _LOADED[built.library] = loaded
        return loaded
