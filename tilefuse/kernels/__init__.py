"""Hand-written Triton kernel families, one module a family.

Each module holds the ``@triton.jit`` kernel, its config space as data (per vendor), a ``supports(...)``
predicate, a check -> allocate -> launch host function, and registers its kernels with
:mod:`tilefuse.targets`. Kernels know nothing of the compiler.
"""
from __future__ import annotations

import importlib
import pkgutil

from .. import device

if device.interpreting():
    # before any kernel runs: numpy 2.4+, threads and bf16 dots on Triton's interpreter (see _interpreter)
    from . import _interpreter

    _interpreter.install()

_loaded = False


def load_all() -> list[str]:
    """Import every kernel family in this package, so that each registers with :mod:`tilefuse.targets`."""
    global _loaded
    names = [m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_")]
    for name in names:
        importlib.import_module(f"{__name__}.{name}")
    _loaded = True
    return names
