"""Launching a compiled Triton kernel without the JIT's per-call dispatch.

``kernel[grid](*args)`` costs ~20-40 us of host time a launch in Triton 3.6 (binding the arguments,
computing the specialisation key of every argument, looking up the cache, ``cuPointerGetAttribute`` a
pointer). A caller that launches the same kernel with arguments of the same kinds again and again (a GEMM
plan, a compiled graph's wrapper) can instead keep what the first JIT launch returned and call its C
launcher directly: :class:`Direct` does that, :class:`SiteLauncher` wraps it for one launch site whose
non-tensor arguments never change, and falls back to the JIT whenever a call would need another
specialisation (a tensor that is not 16-byte aligned where the first one was, an integer of another
specialisation class) or a profiler has launch hooks installed.

Also here: buffers kept a (device, stream) (split-K workspaces, Triton's global scratch) and the raw
current stream. The direct launch order is read from Triton 3.6's NVIDIA driver; other versions and other
vendors take the launcher's own ``__call__`` (which still skips the JIT's dispatch).
"""
from __future__ import annotations

import math
import threading
from typing import Callable

import torch
import triton
from triton import knobs as _knobs
from triton.knobs import HookChain

from .. import device

RUNTIME = _knobs.runtime
DESC_CACHE_MAX = 256  # encoded TMA tensor maps a launcher keeps (then starts again)
DIRECT_TRITON = ("3.6.",)  # launcher argument order read from these versions' nvidia driver.py

# ------------------------------------------------------------------------------------ kept buffers
_guard = threading.Lock()
_kept: dict[tuple, torch.Tensor] = {}


def stream_buffer(kind: str, dev: torch.device, stream: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """A buffer of at least ``numel`` elements kept for (kind, device, stream). "lock" buffers are zeroed when
    made (the split-K kernel leaves its counters zero again); the others are uninitialised. Reusing one buffer
    on one stream is safe because launches on a stream run one after the other."""
    key = (kind, dev.type, dev.index, stream, dtype)
    t = _kept.get(key)
    if t is None or t.numel() < numel:
        with _guard:
            t = _kept.get(key)
            if t is None or t.numel() < numel:
                size = max(numel, 2 * (t.numel() if t is not None else 0), 1024)
                make = torch.zeros if kind == "lock" else torch.empty
                t = _kept[key] = make(size, dtype=dtype, device=dev)
    return t


_guards = getattr(getattr(torch._C, "_dynamo", None), "guards", None)
_EMPTY_CUDA = getattr(_guards, "_empty_strided_cuda", None)  # ATen's CUDA allocation without the dispatcher
_CUDA_DEVICE = getattr(torch._C, "_cuda_getDevice", None)


def strided_allocator(dev: torch.device) -> Callable:
    """``alloc(size, stride, dtype)`` on ``dev``. CUDA (and ROCm) and the CPU: ATen's allocation called directly
    (what Inductor's wrappers call too), without ``torch.empty_strided``'s argument parsing and dispatch: 4.8 us
    an allocation of host time on an H100's host through the dispatcher (decision 035), 0.54 against 1.33 us on
    the CPU. The CUDA one allocates on the current device."""
    direct = getattr(_guards, {"cuda": "_empty_strided_cuda", "cpu": "_empty_strided_cpu"}.get(dev.type, ""), None)
    if direct is not None:
        return direct

    def alloc(size, stride, dtype):
        return torch.empty_strided(size, stride, dtype=dtype, device=dev)

    return alloc


def _direct_cuda(t: torch.Tensor) -> bool:
    """Whether ATen's direct CUDA allocation (which allocates on the current device) may make a tensor for ``t``'s
    device."""
    return _EMPTY_CUDA is not None and t.is_cuda and t.get_device() == _CUDA_DEVICE()


def empty(shape: tuple, dtype: torch.dtype, like: torch.Tensor) -> torch.Tensor:
    """A new contiguous tensor of ``shape`` and ``dtype`` on ``like``'s device. On the current CUDA device, ATen's
    allocation called directly (what compiled wrappers call): 1.03 against 3.32 us of host time for
    ``torch.empty`` on an H100's host, where an attention call makes four."""
    if _direct_cuda(like):
        return _EMPTY_CUDA(tuple(shape), contiguous_strides(shape), dtype)
    return torch.empty(shape, dtype=dtype, device=like.device)


def contiguous_strides(shape) -> tuple:
    """The strides torch gives a new contiguous tensor of ``shape`` (a size-0 dimension counts as 1)."""
    stride, n = [], 1
    for size in reversed(shape):
        stride.append(n)
        n *= max(size, 1)
    return tuple(reversed(stride))


def empty_like(t: torch.Tensor) -> torch.Tensor:
    """``torch.empty_like(t)``: for a contiguous ``t`` on the current CUDA device, ATen's allocation called
    directly with ``t``'s own strides (which ``empty_like`` keeps for a dense tensor, size-1 dimensions'
    included)."""
    if t.is_contiguous() and _direct_cuda(t):
        return _EMPTY_CUDA(tuple(t.shape), t.stride(), t.dtype)
    return torch.empty_like(t)


def scratch_pointer(device_index: int, stream: int, size: int, align: int) -> int:
    """An address of ``size`` bytes of Triton global scratch, aligned to ``align``, kept a (device, stream)."""
    dev = torch.device("cuda", device_index) if device_index >= 0 else device.torch_device()
    t = stream_buffer("scratch", dev, stream, size + align, torch.int8)
    p = t.data_ptr()
    return p + ((-p) % max(1, align))


def current_stream(device_index: int) -> int:
    """The raw current CUDA/HIP stream of a device index (0 for the CPU)."""
    if device_index < 0:
        return 0
    return torch._C._cuda_getCurrentRawStream(device_index)


def _hook_on(hook) -> bool:
    # Triton 3.6 keeps a HookChain in each knob, empty unless a profiler added to it; older ones kept None
    return hook is not None and (bool(hook.calls) if isinstance(hook, HookChain) else True)


def hooks_installed() -> bool:
    """A profiler's launch hooks (proton's, say) need the JIT's launch path."""
    return _hook_on(RUNTIME.launch_enter_hook) or _hook_on(RUNTIME.launch_exit_hook)


# ------------------------------------------------------------------------------------ direct launch
class Direct:
    """The C launcher of one compiled kernel, for a fixed grid. ``launch(stream, args)`` takes every kernel
    argument in signature order (constexprs included, as the JIT passes them; the launcher skips them) with
    pointers as integers."""

    __slots__ = ("function", "packed", "fn", "via_run", "coop", "pdl", "scratch_bytes", "scratch_align",
                 "g0", "g1", "g2", "device_index", "desc_pos", "desc_cache", "own", "own_fn", "runtime")

    def __init__(self, compiled, grid: tuple, device_index: int):
        run = compiled.run  # loads the module (and checks resources) once
        self.function, self.packed = compiled.function, compiled.packed_metadata
        self.fn, self.via_run = run, True
        self.coop = self.pdl = 0
        self.scratch_bytes = self.scratch_align = 0
        self.g0, self.g1, self.g2 = grid[0], (grid[1] if len(grid) > 1 else 1), (grid[2] if len(grid) > 2 else 1)
        self.device_index = device_index
        self.desc_pos: tuple = ()
        self.desc_cache: dict = {}
        self.own = self.own_fn = None  # our own launcher's prepared launch (use_own_launcher), and its launch
        self.runtime: tuple = ()  # the positions of the runtime arguments among the JIT's (constexprs skipped)
        if (type(run).__name__ == "CudaLauncher" and triton.__version__.startswith(DIRECT_TRITON)
                and not getattr(run, "profile_scratch_size", 0) and hasattr(run, "launch")):
            self.fn, self.via_run = run.launch, False
            self.coop, self.pdl = int(run.launch_cooperative_grid), int(run.launch_pdl)
            self.scratch_bytes = run.global_scratch_size * math.prod(grid) * run.num_ctas
            self.scratch_align = run.global_scratch_align
            self._unwrap_descriptors(run.launch)

    def use_own_launcher(self, compiled) -> bool:
        """Launch through :mod:`.fast_launch` (the driver call plus a conversion an argument: ~1 us a launch less
        than Triton's launcher on an H100 host) where it applies to this kernel; else keep Triton's launcher."""
        from . import fast_launch

        prepared = fast_launch.prepare(compiled, (self.g0, self.g1, self.g2), self.device_index)
        if prepared is None:
            return False
        self.own, self.own_fn = prepared, fast_launch.module().launch
        self.runtime = fast_launch.runtime_positions(compiled)
        return True

    def _unwrap_descriptors(self, launch) -> None:
        """A kernel with tensor-descriptor parameters gets a launcher wrapped by Triton
        (``wrap_handle_tensordesc``), which encodes each descriptor's tensor map on the host at every launch
        (~4 us a descriptor, docs/decisions/015-gemm-host-tma-descriptors.md). Keep the C launcher under it
        and the descriptors' positions: :meth:`launch` expands them itself, keeping the encoded tensor map for
        a (position, address, shape, strides) it has seen (the map holds only those)."""
        code = getattr(launch, "__code__", None)
        if code is None or code.co_freevars != ("launcher", "tensordesc_indices", "tensordesc_meta"):
            return
        cells = dict(zip(code.co_freevars, (c.cell_contents for c in launch.__closure__)))
        metas = cells["tensordesc_meta"]
        if not metas or any(m is None for m in metas):
            return  # descriptors not lowered to tensor maps: the wrapper passes tensors, nothing to keep
        self.desc_pos = tuple(zip(sorted(cells["tensordesc_indices"]), metas))
        self.fn = cells["launcher"]

    def _expand(self, pos: int, desc, meta) -> list:
        key = (pos, desc.base.data_ptr(), tuple(desc.shape), tuple(desc.strides))
        got = self.desc_cache.get(key)
        if got is None:
            from triton.backends.nvidia.driver import make_tensordesc_arg

            if len(self.desc_cache) >= DESC_CACHE_MAX:
                self.desc_cache.clear()
            got = self.desc_cache[key] = make_tensordesc_arg(desc, meta)
        return got

    def launch(self, stream: int, args) -> None:
        if self.via_run:
            self.fn(self.g0, self.g1, self.g2, stream, self.function, self.packed, None, None, None, *args)
            return
        scratch = None
        if self.scratch_bytes:
            scratch = scratch_pointer(self.device_index, stream, self.scratch_bytes, self.scratch_align)
        if self.desc_pos:
            flat, prev = [], 0
            for pos, meta in self.desc_pos:
                flat += args[prev:pos]
                flat += self._expand(pos, args[pos], meta)
                prev = pos + 1
            flat += args[prev:]
            args = flat
        self.fn(self.g0, self.g1, self.g2, stream, self.function, self.coop, self.pdl, scratch, None, self.packed,
                None, None, None, *args)


def _int_class(v: int) -> tuple:
    """What Triton specialises an integer argument on: 1, divisibility by 16, and 32- vs 64-bit."""
    return (v == 1, v % 16 == 0, -2 ** 31 <= v < 2 ** 31)


class SiteLauncher:
    """``launch(*args)`` for one launch site: a JIT function, its grid, warps/stages and constexprs fixed.

    The first call goes through the JIT and keeps the compiled kernel (:class:`Direct`). Later calls pass the
    tensors' addresses straight to the C launcher, after checking that each argument still matches what the
    kept kernel was specialised for: every tensor 16-byte aligned (a site whose first call had an unaligned
    tensor keeps the JIT path), every integer of the same specialisation class (:func:`_int_class`). Any
    mismatch, a profiler hook, or the interpreter: the JIT path, which is always right.

    Once a kernel is kept (and it needs neither global scratch nor tensor descriptors), the site writes
    :attr:`fast`: a function of exactly the site's arguments, with the grid, stream lookup, metadata and
    constexprs bound and the checks unrolled, that calls the C launcher itself (:func:`_fast_launch`). Calls
    to the site go through it, and ``on_bound(fast)`` lets a caller put it where the site was (the compiled
    graph's wrapper does: its launches then cost the C launcher and the checks, no Python call layer between).
    """

    __slots__ = ("jit", "grid", "options", "tail", "direct", "aligned", "ints", "device_index", "interpret",
                 "fast", "on_bound")

    def __init__(self, fn, grid: tuple, options: dict, constexprs: dict, on_bound: Callable | None = None):
        self.grid = tuple(grid)
        self.jit = fn[self.grid]
        self.options = dict(options, **constexprs)
        names = list(fn.arg_names)
        n_runtime = len(names) - len(constexprs)
        if set(names[n_runtime:]) != set(constexprs):
            raise ValueError(f"{fn.__name__}: constexprs {sorted(constexprs)} are not its trailing parameters "
                             f"{names[n_runtime:]}")
        self.tail = tuple(constexprs[n] for n in names[n_runtime:])
        self.direct: Direct | None = None
        self.aligned: tuple = ()
        self.ints: tuple = ()
        self.device_index = -1
        self.interpret = device.interpreting()
        self.fast: Callable | None = None
        self.on_bound = on_bound

    def __call__(self, *args) -> None:
        if self.fast is not None:
            self.fast(*args)
            return
        d = self.direct
        if d is None or hooks_installed():
            self._jit(args)
            return
        direct = list(args)
        for i in self.aligned:
            p = args[i].data_ptr()
            if p & 15:
                self._jit(args)
                return
            direct[i] = p
        for i, cls in self.ints:
            if _int_class(args[i]) != cls:
                self._jit(args)
                return
        d.launch(torch._C._cuda_getCurrentRawStream(self.device_index), direct + list(self.tail))

    def _jit(self, args) -> None:
        compiled = self.jit(*args, **self.options)
        if self.interpret or compiled is None or self.direct is not None:
            return  # the kept kernel stays the one of the first call's specialisation
        tensors = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        if not tensors or any(args[i].device.type != "cuda" for i in tensors):
            return
        if any(a is None or not isinstance(a, (torch.Tensor, int, float)) for a in args):
            return  # (an argument of another kind: keep the JIT path rather than guess its launch form)
        if any(args[i].data_ptr() & 15 for i in tensors):
            return  # rare (a view at an odd offset): the JIT path, with its own checks, every call
        self._keep(compiled, args, args[tensors[0]].get_device())

    def _keep(self, compiled, args, device_index: int) -> None:
        """Keep the kernel the JIT compiled for ``args`` (all on one GPU, tensors aligned) and bind its launch."""
        tensors = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        self.device_index = device_index
        self.aligned = tuple(tensors)
        self.ints = tuple((i, _int_class(a)) for i, a in enumerate(args)
                          if isinstance(a, int) and not isinstance(a, bool))
        self.direct = Direct(compiled, self.grid, self.device_index)
        d = self.direct
        if d.via_run or d.desc_pos or d.scratch_bytes:
            return  # (the generic path: Direct.launch handles those)
        d.use_own_launcher(compiled)
        self.fast = _fast_launch(self, args)
        if self.on_bound is not None:
            self.on_bound(self.fast)


def kept_site(sites: dict, limit: int, key, fn, grid: tuple, options: dict, constexprs: dict) -> SiteLauncher:
    """The launch site kept in ``sites`` under ``key`` (a family's cache: the key holds what the compiled kernel
    depends on beyond what a site checks itself), made on first use; the cache starts again past ``limit``."""
    site = sites.get(key)
    if site is None:
        if len(sites) >= limit:
            sites.clear()
        site = sites[key] = SiteLauncher(fn, grid, options, constexprs)
    return site


def _fast_launch(site: SiteLauncher, first: tuple) -> Callable:
    """The launch function of a site whose kernel is kept: ``fast(a0, ..., aN)`` reads each tensor's address,
    checks it and each integer against the kept specialisation (an integer equal to the first call's value
    passes at once, another of the same class too), and calls the C launcher; any mismatch or a profiler hook
    goes to the site's JIT path. Written as source so that each check is one expression and the launcher's
    argument list is spelled out (a loop and a list per call cost ~2x the checks on a slow host)."""
    d = site.direct
    n = len(first)
    names = [f"a{i}" for i in range(n)]
    env: dict = {"_stream": torch._C._cuda_getCurrentRawStream, "_hooks": hooks_installed,
                 "_int_class": _int_class, "_jit": site._jit}
    body = [f"    p{i} = a{i}.data_ptr()" for i in site.aligned]
    checks = []
    if site.aligned:
        checks.append(f"({' | '.join(f'p{i}' for i in site.aligned)}) & 15")
    for i, cls in site.ints:
        env[f"_v{i}"], env[f"_c{i}"] = first[i], cls
        checks.append(f"not (a{i} == _v{i} or _int_class(a{i}) == _c{i})")
    checks.append("_hooks()")
    body.append(f"    if {' or '.join(checks)}:")
    body.append(f"        return _jit(({', '.join(names)},))")
    passed = [f"p{i}" if i in site.aligned else f"a{i}" for i in range(n)]
    body.append(f"    {launch_call(site, passed, f'_stream({site.device_index})', env, '')}")
    source = f"def fast({', '.join(names)}):\n" + "\n".join(body) + "\n"
    exec(compile(source, "<tilefuse launch site>", "exec"), env)
    fast = env["fast"]
    fast.site = site
    fast.source = source
    return fast


def launch_call(site: SiteLauncher, passed: list[str], stream: str, env: dict, tag: str) -> str:
    """The call of a bound site's C launcher as source text, the one place its argument order is written:
    ``passed`` the expressions of the site's arguments in order (tensors as addresses), ``stream`` the
    stream's. The launcher, metadata and constexprs it names go into ``env`` under names ending in ``tag``
    (distinct tags let one function launch several sites)."""
    d = site.direct
    tails = []
    for k, value in enumerate(site.tail):
        env[f"_t{tag}_{k}"] = value
        tails.append(f"_t{tag}_{k}")
    if d.own is not None:  # our own launcher: the prepared launch, the stream, the runtime arguments alone
        env[f"_launch{tag}"], env[f"_prepared{tag}"] = d.own_fn, d.own
        every = list(passed) + tails
        return f"_launch{tag}(_prepared{tag}, {stream}, {', '.join(every[i] for i in d.runtime)})"
    env[f"_launch{tag}"], env[f"_function{tag}"], env[f"_packed{tag}"] = d.fn, d.function, d.packed
    return (f"_launch{tag}({d.g0!r}, {d.g1!r}, {d.g2!r}, {stream}, _function{tag}, {d.coop}, {d.pdl}, None, None, "
            f"_packed{tag}, None, None, None, {', '.join(list(passed) + tails)})")
