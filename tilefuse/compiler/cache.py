"""The kernel cache: one standalone ``.py`` a kernel under ``TILEFUSE_CACHE_DIR/compiler/kernels``.

A kernel's key is the hash of its source, the Triton version, the target (vendor, arch, warp size, or the
interpreter) and the code generator's version. The file name is the kernel's stable name plus that key, so a
second process that generates the same kernel finds the file, imports it and compiles nothing of its own; on
a GPU, Triton's cache (keyed by the same source) then skips Triton's compile too. Within a process a loaded
kernel is reused by every graph that generates the same source.
"""
from __future__ import annotations

import importlib.util
import sys
import threading
from pathlib import Path

from .. import diskcache
from . import records
from .codegen import CODEGEN_VERSION, KernelSource

_loaded: dict[str, object] = {}
_lock = threading.Lock()


def target_id() -> str:
    from .. import device

    d = device.current()
    return "interpreter" if d.interpreter else f"{d.vendor}:{d.arch}:w{d.warp_size}"


def kernel_key(source: str) -> str:
    import triton

    return diskcache.digest(source, triton.__version__, target_id(), CODEGEN_VERSION)


def kernel_path(ks: KernelSource) -> Path:
    return diskcache.folder("compiler", "kernels") / f"{ks.name}-{kernel_key(ks.source)[:8]}.py"


def load(ks: KernelSource):
    """The ``@triton.jit`` function of ``ks`` (from this process, the disk cache, or newly written)."""
    key = kernel_key(ks.source)
    with _lock:
        fn = _loaded.get(key)
        if fn is not None:
            return fn, "memory"
        path = kernel_path(ks)
        origin = "disk"
        try:
            on_disk = path.read_text()
        except OSError:
            on_disk = None
        if on_disk != ks.source:
            diskcache.write_text(path, ks.source)
            origin = "new"
            records.bump("kernels_compiled")
        else:
            records.bump("cache_hits")
        module_name = f"tilefuse_kernel_{ks.name}_{key[:8]}"
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module  # Triton finds the source of a jit function through its module
        spec.loader.exec_module(module)
        fn = getattr(module, ks.name)
        _loaded[key] = fn
        return fn, origin


def clear_memory() -> None:
    """Forget the kernels loaded in this process (tests: the next load goes to disk)."""
    with _lock:
        _loaded.clear()
