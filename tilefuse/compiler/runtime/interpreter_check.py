"""Checks on Triton's interpreter (CPU only): generated kernels' device asserts, and the bounds-checking mode.

**Device asserts.** Generated kernels assert that a data-dependent index is inside its dim (embedding,
gather, index_select, ``x[idx]``, a one-hot scatter) and, in a CPU graph, that an integer divisor is not 0
(codegen's ``check_indirect`` / ``check_divisor``). Triton 3.6's interpreter drops every ``tl.device_assert``
(its builder's ``debug`` option is off and no launch option turns it on), so :func:`install` makes the
interpreter evaluate the asserts whose message starts with ``codegen.ASSERT_PREFIX`` (tilefuse's own, and
only those). A failed one raises, out of the kernel launch (the interpreter's ``InterpreterError`` wrapper
taken off), :class:`KernelIndexError` (an ``IndexError`` and a ``RuntimeError``: eager raises either, by op)
with the offending index, the dim's size, the ATen op and the kernel, or :class:`KernelZeroDivisionError`
(a ``RuntimeError`` saying ``ZeroDivisionError``, as eager's). On a GPU the same asserts are compiled in
(``KernelSource.options``: Triton's debug option) and fail as a device-side assert.

**Bounds-checking mode** (``TILEFUSE_CHECK_BOUNDS=1`` or ``config.override(check_bounds=True)``): every load
and store of every kernel launched on the interpreter (generated or library, read while the mode is on) is
verified before it touches memory: for each lane the mask lets through, the element offset from the pointer
argument it was computed from must lie inside that argument's storage, ``[-storage_offset, storage elements
- storage_offset)`` of the tensor passed. A pointer is traced to its argument through pointer arithmetic and
the shape ops (splat, broadcast, expand_dims, reshape, trans); a pointer that cannot be traced must still land
inside some argument's storage. A stray access raises :class:`OutOfBoundsAccess` at its source, naming the
kernel, the pointer argument (and its tensor's shape, stride and dtype), the offending element offset and how
many lanes are outside. Without the mode the memory operations run unchanged. The checks cost numpy work per
memory operation: a debugging and testing mode (the differential fuzzer runs with it), not a default.
"""
from __future__ import annotations

import dataclasses
import re
import sys
import threading

import numpy as np

from ... import config

_installed = False
_state = threading.local()  # .launch: the _Launch of the kernel running in this thread (check mode), or None

_INDEX_MSG = re.compile(r"index (\w+) out of bounds for a dim of size (\w+)(.*) in (\S+)$")


class KernelCheckError(RuntimeError):
    """A check in a kernel failed (base of the errors below)."""


class KernelIndexError(IndexError, KernelCheckError):
    """A data-dependent index outside its dim (eager raises IndexError or RuntimeError, by op)."""


class KernelZeroDivisionError(KernelCheckError):
    """An integer division or remainder by zero (eager's CPU kernels raise ``RuntimeError: ZeroDivisionError``)."""


class OutOfBoundsAccess(IndexError, KernelCheckError):
    """Bounds-checking mode: a load or store outside its buffer."""


@dataclasses.dataclass(frozen=True)
class _Buffer:
    param: str  # the kernel's parameter name(s) for this tensor
    base: int  # data_ptr
    start: int  # storage's first byte
    end: int  # storage's end byte
    what: str  # shape, stride, dtype

    def elements(self, width: int) -> tuple[int, int]:
        return ((self.start - self.base) // width, (self.end - self.base) // width)


@dataclasses.dataclass
class _Launch:
    kernel: str
    buffers: dict  # base address -> _Buffer


def install() -> None:
    """Patch the interpreter (idempotent): tilefuse's device asserts evaluated, launch errors unwrapped, the
    memory operations checked while the bounds-checking mode is on."""
    global _installed
    if _installed:
        return
    from triton.language import semantic
    from triton.runtime import interpreter

    _patch_asserts(semantic.TritonSemantic, interpreter)
    _patch_launch(interpreter)
    _patch_memory(interpreter)
    _installed = True


# ------------------------------------------------------------------------------------------ asserts
def _patch_asserts(semantic_cls, interpreter) -> None:
    from ..codegen import ASSERT_PREFIX

    original = semantic_cls.device_assert

    def device_assert(self, cond, msg, mask):
        if not (isinstance(msg, str) and msg.startswith(ASSERT_PREFIX)
                and isinstance(self.builder, interpreter.InterpreterBuilder)):
            return original(self, cond, msg, mask)
        ok = np.asarray(cond.handle.data).astype(bool)
        if mask is not None:
            ok = ok | ~np.asarray(mask.handle.data).astype(bool)
        if not ok.all():
            raise _assert_error(msg[len(ASSERT_PREFIX):], ok, sys._getframe(1))
        return None

    semantic_cls.device_assert = device_assert


def _kernel_frame(frame, names):
    """The frame of the interpreted kernel (the first caller that holds ``names`` as locals)."""
    while frame is not None:
        if all(n in frame.f_locals for n in names):
            return frame
        frame = frame.f_back
    return None


def _value(frame, name):
    if re.fullmatch(r"-?\d+", name):
        return np.asarray(int(name))
    v = frame.f_locals[name]
    handle = getattr(v, "handle", v)
    return np.asarray(getattr(handle, "data", handle))


def _assert_error(msg: str, ok: np.ndarray, frame) -> Exception:
    m = _INDEX_MSG.search(msg)
    if m is None:
        kernel = _kernel_name(frame)
        if msg.startswith("ZeroDivisionError"):
            return KernelZeroDivisionError(f"ZeroDivisionError: {msg.split(': ', 1)[-1]} (tilefuse kernel {kernel}, "
                                           f"lanes: {int((~ok).sum())})")
        return KernelCheckError(f"{msg} (tilefuse kernel {kernel})")
    raw, size, ends, op = m.groups()
    names = [n for n in (raw, size) if not re.fullmatch(r"-?\d+", n)]
    kf = _kernel_frame(frame, names)
    kernel = kf.f_code.co_name if kf is not None else _kernel_name(frame)
    if kf is None:
        return KernelIndexError(f"index out of bounds in {op} (tilefuse kernel {kernel})")
    bad = ~ok
    values = np.broadcast_to(_value(kf, raw), bad.shape)[bad] if bad.shape else _value(kf, raw).reshape(1)
    n = int(np.asarray(_value(kf, size)).reshape(-1)[0])
    accepted = f"[{-n}, {n})" if ends else f"[0, {n})"
    return KernelIndexError(f"index {int(values.reshape(-1)[0])} is out of bounds for a dim of size {n} in {op} "
                            f"(accepted: {accepted}; out-of-bounds lanes: {int(bad.sum())}; tilefuse kernel {kernel})")


def _kernel_name(frame) -> str:
    while frame is not None:
        name = frame.f_code.co_name
        if name.startswith("tfk_"):
            return name
        frame = frame.f_back
    return "?"


# ------------------------------------------------------------------------------------------- launch
def _patch_launch(interpreter) -> None:
    executor = interpreter.GridExecutor
    original_call = executor.__call__
    original_args = executor._init_args_hst

    def init_args_hst(self, args_dev, kwargs):
        args_hst, kwargs_hst = original_args(self, args_dev, kwargs)
        if getattr(_state, "pending", False):
            _state.launch = _launch_of(self, args_hst, kwargs_hst)
        return args_hst, kwargs_hst

    def call(self, *args, **kwargs):
        _state.pending = config.get().check_bounds
        try:
            return original_call(self, *args, **kwargs)
        except interpreter.InterpreterError as exc:
            cause = exc.__cause__
            if isinstance(cause, KernelCheckError):
                raise cause from None
            raise
        finally:
            _state.pending = False
            _state.launch = None

    executor._init_args_hst = init_args_hst
    executor.__call__ = call


def _launch_of(executor, args_hst, kwargs_hst) -> _Launch:
    named = dict(zip(executor.arg_names, args_hst))
    named.update(kwargs_hst)
    buffers: dict[int, _Buffer] = {}
    for name, t in named.items():
        if not hasattr(t, "data_ptr") or not hasattr(t, "untyped_storage"):
            continue
        storage = t.untyped_storage()
        base = t.data_ptr()
        if base in buffers:  # one tensor passed twice (a kernel writing into an input it reads)
            buffers[base] = dataclasses.replace(buffers[base], param=f"{buffers[base].param}/{name}")
            continue
        what = f"shape {list(t.shape)}, stride {list(t.stride())}, {str(t.dtype).replace('torch.', '')}"
        buffers[base] = _Buffer(name, base, storage.data_ptr(), storage.data_ptr() + storage.nbytes(), what)
    return _Launch(getattr(executor.fn, "__name__", "?"), buffers)


# ------------------------------------------------------------------------------------------- memory
_TAG = "tilefuse_buffer"


def _patch_memory(interpreter) -> None:
    builder = interpreter.InterpreterBuilder

    original_addptr = builder.create_addptr

    def create_addptr(self, ptr, offset):
        out = original_addptr(self, ptr, offset)
        launch = getattr(_state, "launch", None)
        if launch is not None:
            buf = ptr.attr.get(_TAG)
            if buf is None:
                data = np.asarray(ptr.data).reshape(-1)
                if data.size and (data == data[0]).all():
                    buf = launch.buffers.get(int(data[0]))
            if buf is not None:
                out.attr[_TAG] = buf
        return out

    builder.create_addptr = create_addptr

    def keep_tag(name):
        original = getattr(builder, name)

        def shaped(self, *args, **kwargs):
            out = original(self, *args, **kwargs)
            if getattr(_state, "launch", None) is not None:
                src = next((a for a in args if isinstance(a, interpreter.TensorHandle)), None)
                if src is not None and _TAG in src.attr and isinstance(out, interpreter.TensorHandle):
                    out.attr[_TAG] = src.attr[_TAG]
            return out

        setattr(builder, name, shaped)

    for name in ("create_splat", "create_broadcast", "create_expand_dims", "create_reshape", "create_trans"):
        keep_tag(name)

    original_load = builder.create_masked_load
    original_store = builder.create_masked_store

    def create_masked_load(self, ptrs, mask, other, cache_modifier, eviction_policy, is_volatile):
        launch = getattr(_state, "launch", None)
        if launch is not None:
            _check(launch, "load", ptrs, mask)
        return original_load(self, ptrs, mask, other, cache_modifier, eviction_policy, is_volatile)

    def create_masked_store(self, ptrs, value, mask, cache_modifier, eviction_policy):
        launch = getattr(_state, "launch", None)
        if launch is not None:
            _check(launch, "store", ptrs, mask)
        return original_store(self, ptrs, value, mask, cache_modifier, eviction_policy)

    builder.create_masked_load = create_masked_load
    builder.create_masked_store = create_masked_store


def _width(ptrs) -> int:
    return max(1, ptrs.get_element_ty().primitive_bitwidth // 8)


def _check(launch: _Launch, kind: str, ptrs, mask) -> None:
    addr = np.asarray(ptrs.data, dtype=np.uint64)
    active = np.broadcast_to(np.asarray(mask.data).astype(bool), addr.shape) if mask is not None else \
        np.ones(addr.shape, bool)
    if not active.any():
        return
    width = _width(ptrs)
    buf = ptrs.attr.get(_TAG)
    if buf is not None:
        offsets = (addr.astype(np.int64) - np.int64(buf.base)) // width
        lo, hi = buf.elements(width)
        bad = active & ((offsets < lo) | (offsets >= hi))
        if bad.any():
            first = int(offsets[bad].reshape(-1)[0])
            raise OutOfBoundsAccess(
                f"tilefuse bounds check: {kind} out of bounds in kernel {launch.kernel}: pointer argument "
                f"{buf.param} ({buf.what}) at element offset {first}, outside its storage's elements "
                f"[{lo}, {hi}) ({int(bad.sum())} of {int(active.sum())} active lanes outside)")
        return
    # a pointer not traced to an argument: it must land inside some argument's storage
    a = addr[active].astype(np.int64)
    inside = np.zeros(a.shape, bool)
    for b in launch.buffers.values():
        inside |= (a >= b.start) & (a + width <= b.end)
    if not inside.all():
        stray = int(a[~inside][0])
        near = min(launch.buffers.values(), key=lambda b: min(abs(stray - b.start), abs(stray - b.end)), default=None)
        where = f"; nearest argument {near.param} ({near.what}) at element offset {(stray - near.base) // width}" \
            if near is not None else ""
        raise OutOfBoundsAccess(f"tilefuse bounds check: {kind} out of bounds in kernel {launch.kernel}: address "
                                f"{stray:#x} is inside no argument's storage{where} "
                                f"({int((~inside).sum())} of {int(active.sum())} active lanes outside)")
