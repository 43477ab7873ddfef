"""tilefuse: fused, portable GEMMs, a CUDA C++ GEMM ladder, and a torch.compile backend that writes Triton.

``import tilefuse`` is cheap: it decides the device (and switches Triton's interpreter on when there is no
GPU, before any kernel is defined), registers the ``"tilefuse"`` backend name with TorchDynamo, and loads
everything else on first use:

    tilefuse.gemm(a, b, bias=..., activation="gelu")     # Triton GEMM with a fused epilogue
    tilefuse.nn.Linear(...)                               # drop-in for torch.nn.Linear
    torch.compile(model, backend="tilefuse")              # the compiler
    tilefuse.explain(fn, *args)                           # graph breaks, fusion groups, kernels, fallbacks
    tilefuse.cuda.gemm(a, b, rung=9)                      # the CUDA C++ ladder
"""
from __future__ import annotations

import importlib

from . import config, device  # device first: it switches the interpreter on before any @triton.jit runs
from .config import (TilefuseCacheWarning, TilefuseConfigWarning, TilefuseFallbackWarning,  # noqa: F401
                     TilefuseWarning)

__version__ = "0.1.0"

BACKEND_NAME = "tilefuse"
BACKEND_ENTRY_POINT = "tilefuse.compiler.backend:tilefuse_backend"

# attribute -> (module, attribute in it or None for the module itself)
_LAZY = {
    "gemm": ("tilefuse.linalg", "gemm"),
    "attention": ("tilefuse.kernels.attention", "attention"),
    "attention_varlen": ("tilefuse.kernels.attention", "attention_varlen"),
    "linalg": ("tilefuse.linalg", None),
    "nn": ("tilefuse.nn", None),
    "explain": ("tilefuse.compiler.explain", "explain"),
    "compiler": ("tilefuse.compiler", None),
    "cuda": ("tilefuse.cuda", None),
    "kernels": ("tilefuse.kernels", None),
    "targets": ("tilefuse.targets", None),
    "bench": ("tilefuse.bench", None),
}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'tilefuse' has no attribute {name!r}")
    module_name, attr = _LAZY[name]
    module = importlib.import_module(module_name)
    value = module if attr is None else getattr(module, attr)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


def _register_backend_name() -> None:
    """Make ``backend="tilefuse"`` resolve without importing the compiler until it is used.

    The name goes into Dynamo's registry as an entry point, exactly as the installed package's
    ``torch_dynamo_backends`` entry point would put it, so the compiler loads on first use and is
    registered once whichever way Dynamo found it first.
    """
    try:
        from importlib.metadata import EntryPoint

        from torch._dynamo.backends import registry
    except Exception:  # a torch without Dynamo: the library still works, only torch.compile does not
        return
    if BACKEND_NAME not in registry._COMPILER_FNS and registry._BACKENDS.get(BACKEND_NAME) is None:
        registry._BACKENDS[BACKEND_NAME] = EntryPoint(BACKEND_NAME, BACKEND_ENTRY_POINT, "torch_dynamo_backends")


_register_backend_name()
