"""A launcher of our own for compiled Triton kernels on NVIDIA: the driver call plus one conversion an argument.

Triton 3.6 launches a compiled kernel through a C launcher built per signature, called with ~13 header values
and every argument (constexprs too) and parsing them with ``PyArg_ParseTuple``; with its context check, hook
checks and GIL release that costs ~4.5 us of host time a launch on an H100 host, most of the 5 us a launch we
allow a compiled graph's wrapper. ``fast_launch.c`` is one C extension for every signature: :func:`prepare`
fixes what does not change between launches of a bound kernel (function, grid, block, shared memory, launch
attributes, the kinds of its runtime arguments), and the launch converts the arguments and calls the driver::

    prepared = fast_launch.prepare(compiled, grid, device_index)   # None: use Triton's launcher
    fast_launch.module().launch(prepared, stream, *runtime_args)

``runtime_args`` are the kernel's arguments **without its constexprs** (Triton's launcher takes and skips them),
in signature order (:func:`runtime_positions` says which of the JIT's arguments those are): a pointer as its
device address (an int: ``t.data_ptr()``), an integer or float as a Python number. A value that does not fit its
kind raises TypeError or OverflowError naming the argument; nothing is truncated. The launch calls no profiler
hooks and does not check the pointers are device memory, so a caller uses it only where it would have called
Triton's launcher directly (``launcher.hooks_installed()`` false, addresses from CUDA tensors).

:func:`prepare` refuses (returns None, and :func:`refusal` says why):
- when the extension cannot be built here (no C compiler or Python headers; :func:`unavailable_reason`);
- a Triton other than 3.6 or a backend other than CUDA: the parameter ABI is read from Triton 3.6's NVIDIA
  launcher (the two trailing scratch pointers in particular);
- a kernel that needs global scratch or profile scratch: those are allocated a launch, by Triton's allocators;
- tensor descriptors (``tensordesc<...>``, ``nvTmaDesc``): a descriptor is encoded on the host into a 128-byte
  tensor map (or expanded into several arguments), which is ``launcher.Direct``'s business;
- tuple arguments and any scalar type Triton's launcher has no packing for (fp8 scalars, ...);
- a kernel with more than ``MAX_ARGS`` runtime arguments, or a function not loaded.

The extension is built once a machine with Triton's own ``compile_module_from_src`` (cached by source hash in
Triton's cache directory) against the ``cuda.h`` Triton ships, and finds ``cuLaunchKernelEx`` with dlopen on the
first real launch, so building needs neither a GPU nor the driver library.
"""
from __future__ import annotations

import threading
import weakref
from pathlib import Path

import triton

from .. import config

ABI_TRITON = ("3.6.",)  # the parameter layout (two trailing scratch pointers) read from this version's driver.py
_SOURCE = Path(__file__).with_name("fast_launch.c")
_NAME = "tilefuse_fast_launch"  # the module name the C source's PyInit_ function is named for

_guard = threading.Lock()
_built: dict = {}  # "module", "reason": the first build's outcome, kept for the process
_refusals: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # compiled kernel -> why prepare refused it


def _cuda_include_dir() -> str:
    """The directory of the ``cuda.h`` Triton compiles its own launchers against."""
    try:
        from triton.backends.nvidia import driver as nvidia_driver

        return nvidia_driver.include_dirs[0]
    except Exception:  # (a Triton without the NVIDIA backend module: the same place by path)
        return str(Path(triton.__file__).parent / "backends" / "nvidia" / "include")


def module():
    """The extension module, built on first use; None where it cannot be built (see :func:`unavailable_reason`)."""
    if "reason" in _built:
        return _built["module"]
    with _guard:
        if "reason" not in _built:
            mod, reason = None, None
            try:
                include = _cuda_include_dir()
                if not (Path(include) / "cuda.h").is_file():
                    raise FileNotFoundError(f"no cuda.h under {include}")
                from triton.runtime.build import compile_module_from_src

                # (no libraries: the driver's symbols come from dlopen, so the build needs no libcuda)
                mod = compile_module_from_src(src=_SOURCE.read_text(), name=_NAME, include_dirs=[include])
            except Exception as e:  # a failed build must leave callers on Triton's launcher, never raise
                reason = f"fast_launch could not be built: {type(e).__name__}: {e}"
                config.log(1, f"{reason}; compiled kernels launch through Triton's launcher")
            _built["module"], _built["reason"] = mod, reason
    return _built["module"]


def unavailable_reason() -> str | None:
    """Why :func:`module` returned None (it builds first if it has not tried), else None."""
    module()
    return _built["reason"]


def _refuse(compiled, why: str) -> None:
    try:
        _refusals[compiled] = why
    except TypeError:  # (an object without weak references: its reason is not kept)
        pass
    return None


def refusal(compiled) -> str | None:
    """Why the last :func:`prepare` of ``compiled`` returned None (None if it did not, or was not asked)."""
    try:
        return _refusals.get(compiled)
    except TypeError:
        return None


def _signature(compiled) -> dict:
    return dict(getattr(getattr(compiled, "src", None), "signature", None) or {})


def runtime_positions(compiled) -> tuple[int, ...]:
    """The positions, among all the kernel's arguments as the JIT takes them, of those :func:`prepare`'s launch
    takes (the signature's non-constexprs), in order."""
    return tuple(i for i, ty in enumerate(_signature(compiled).values()) if ty != "constexpr")


def _kind_refusal(ty, mod) -> str | None:
    if isinstance(ty, tuple):
        return "tuple arguments (Triton's launcher flattens them)"
    if not isinstance(ty, str) or not ty:
        return f"a signature entry {ty!r}"
    if ty.startswith("tensordesc") or ty == "nvTmaDesc":
        return f"tensor descriptors ({ty}: encoded on the host a launch)"
    if ty[0] == "*" or ty == "f32" or ty in mod.KINDS:
        return None
    return f"a {ty} argument (no packing for it)"


def prepare(compiled, grid, device_index: int):
    """A prepared launch of ``compiled`` (a Triton 3.6 ``CompiledKernel`` that the JIT has launched in this
    process) on ``grid`` (1 to 3 sizes, in programs) for CUDA device ``device_index``; None where this launcher
    does not apply (see the module's docstring; :func:`refusal` says why). Never raises."""
    mod = module()
    if mod is None:
        return _refuse(compiled, _built["reason"])
    if not triton.__version__.startswith(ABI_TRITON):
        return _refuse(compiled, f"Triton {triton.__version__}: the parameter layout is read from {ABI_TRITON}")
    meta = getattr(compiled, "metadata", None)
    backend = getattr(getattr(meta, "target", None), "backend", None)
    if backend != "cuda":
        return _refuse(compiled, f"backend {backend!r}: this launcher calls the CUDA driver")
    try:
        scratch = (meta.global_scratch_size, meta.profile_scratch_size)
    except AttributeError:
        return _refuse(compiled, "metadata without global/profile scratch sizes (not a Triton 3.6 kernel)")
    if any(scratch):
        return _refuse(compiled, f"needs global scratch {scratch[0]} B / profile scratch {scratch[1]} B a program")
    signature = _signature(compiled)
    if not signature and getattr(getattr(compiled, "src", None), "signature", None) is None:
        return _refuse(compiled, "no signature on compiled.src")
    kinds = []
    for name, ty in signature.items():
        if ty == "constexpr":
            continue
        why = _kind_refusal(ty, mod)
        if why is not None:
            return _refuse(compiled, f"argument {name!r}: {why}")
        kinds.append(ty)
    if len(kinds) > mod.MAX_ARGS:
        return _refuse(compiled, f"{len(kinds)} runtime arguments (at most {mod.MAX_ARGS})")
    try:
        function = compiled.function
        if not function:
            compiled.run  # loads the module and the function (Triton's _init_handles), once
            function = compiled.function
        prepared = mod.make(function, tuple(grid), meta.num_warps, getattr(meta, "num_ctas", 1), meta.shared,
                            bool(getattr(meta, "launch_cooperative_grid", False)),
                            bool(getattr(meta, "launch_pdl", False)), kinds,
                            name=str(getattr(compiled, "name", "?")), device=int(device_index))
    except Exception as e:  # an unloadable function or a grid that is no launch: Triton's path says it better
        return _refuse(compiled, f"{type(e).__name__}: {e}")
    try:
        _refusals.pop(compiled, None)
    except TypeError:
        pass
    return prepared
