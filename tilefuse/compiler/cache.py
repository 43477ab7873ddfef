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
    """The ``@triton.jit`` function of ``ks`` (from this process, the disk cache, or newly written).

    The file on disk is used only when its bytes are exactly ``ks.source`` (the name carries the source's
    hash, so anything else is a corrupt or torn entry: reported once with its path, replaced)."""
    key = kernel_key(ks.source)
    with _lock:
        fn = _loaded.get(key)
        if fn is not None:
            return fn, "memory"
        path = kernel_path(ks)
        want = ks.source.encode()
        got = diskcache.read_bytes(path)
        if got is not None and got[0] == want:
            origin = "disk"
            records.bump("cache_hits")
        else:
            if got is not None:
                diskcache.discard(path, "its text is not the kernel source it is named for (corrupt or torn)",
                                  got[1])
            path = diskcache.write_bytes(path, want)
            origin = "new"
            records.bump("kernels_compiled")
        module_name = f"tilefuse_kernel_{ks.name}_{key[:8]}"
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module  # Triton finds the source of a jit function through its module
        # run the bytes checked above (not a re-read of the file, nor a .pyc beside it that nothing checks)
        exec(compile(want, str(path), "exec"), module.__dict__)
        fn = getattr(module, ks.name)
        _loaded[key] = fn
        return fn, origin


def clear_memory() -> None:
    """Forget the kernels loaded in this process (tests: the next load goes to disk)."""
    with _lock:
        _loaded.clear()
