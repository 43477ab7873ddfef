"""The GEMM call path: check -> allocate -> launch once per call *signature*, then replay.

A call's signature is everything the checks, the config choice and the compiled kernel depend on: each
tensor's dtype, shape, strides, device and 16-byte alignment, the epilogue's options, ``out_dtype``,
``quantize``, the hook, an explicit config and (fp32) the tf32 setting. The first call of a signature runs the
full path (:func:`~tilefuse.kernels.gemm.checks.prepare`, the tuner, :func:`~tilefuse.kernels.gemm.launching.launches`)
and keeps a :class:`Plan`: the launches with the role of each pointer, and how to allocate the outputs.
A repeat call builds the signature (a tuple), finds the plan, allocates the outputs, fills the pointer slots
and calls the compiled launchers: no validation, no torch ops besides the output allocation, no JIT dispatch.

Plans are dropped when the settings (:func:`tilefuse.config.get`) or the tuner's decisions
(:func:`tilefuse.kernels.gemm.tuning.forget`) change. A call whose kernels would not see its own tensors
(a scale vector copied to make it contiguous, a strided quantised ``out=``) or that launches nothing (a
zero-size dimension, K = 0) runs the full path every time.
"""
from __future__ import annotations

import threading
from typing import Sequence

import torch
import triton

from ... import config as tf_config
from ... import device
from . import launching as L
from . import tuning as gemm_tuning
from .checks import GemmOutputs, MNOperand, Operands, check_out_overlap, prepare, qmax
from .checks import scratch_operands  # noqa: F401  (the package and the tests reach it here)
from .configs import SAFE_CONFIG, GemmConfig
from .epilogue import QUANT_EPS
from ..launcher import SiteLauncher, empty

Tensor = torch.Tensor


def _sig(t: Tensor) -> tuple:
    # the whole device (type and index): a meta or other-device tensor of a planned shape must not replay a
    # plan checked for CPU or CUDA tensors (get_device() is -1 for CPU and meta alike)
    return (t.dtype, t.shape, t.stride(), t.data_ptr() & 15, t.device)


class Plan:
    """How to repeat one signature's call: output recipes and the compiled launches."""

    __slots__ = ("launches", "device", "device_index", "out_shape", "out_dtype", "scale_shape", "pre_shape",
                 "pre_dtype", "temps", "ws", "lock", "dummy", "config", "hook", "more", "copies")

    def __init__(self, ops: Operands, launches: list[L.Launch], cfg: GemmConfig, value_shape, scale_shape, pre_shape,
                 hook, copies: tuple[bool, bool] = (False, False)):
        self.config, self.hook = cfg, hook
        self.copies = copies if any(copies) else None  # (a, b) copied K-major first (see wgmma_copies)
        self.launches = tuple(L.CompiledLaunch(x) for x in launches)
        self.device = ops.a.device
        self.device_index = ops.a.get_device()
        self.out_shape, self.out_dtype = tuple(value_shape), ops.c.dtype if ops.q is None else ops.q.dtype
        self.scale_shape = tuple(scale_shape) if ops.q_scale is not None else None
        self.pre_shape = tuple(pre_shape) if ops.pre is not None else None  # (Z, M, N), unfolded
        self.pre_dtype = ops.pre.t.dtype if ops.pre is not None else None
        self.temps: list[tuple[int, tuple, torch.dtype]] = []  # (role index, shape, dtype) made a call
        self.ws = self.lock = None
        seen = set()
        for x in launches:
            for name, role in x.roles.items():
                t = x.args[name]
                if role in ("wide", "amax", "wide_q") and role not in seen:
                    self.temps.append((L.ROLE_INDEX[role], tuple(t.shape), t.dtype))
                elif role == "ws":  # kept a stream: split-K's or stream-K's partial tiles
                    self.ws = (t.dtype, x.kept["ws"][0])
                elif role == "lock":  # their counters
                    self.lock = x.kept["lock"][0]
                seen.add(role)
        self.dummy = L.dummy(self.device)
        # anything besides the output to make a call (scales, pre-activation, temporaries, split-K buffers)
        self.more = bool(self.scale_shape or self.pre_shape or self.temps or self.ws)

    def run(self, a, b, bias, residual, scale_a, scale_b, extras, out, alpha, beta):
        if self.copies is not None:
            a, b = k_major(a, b, self.copies)
        o = out if out is not None else empty(self.out_shape, self.out_dtype, a)
        values = [a, b, bias, residual, scale_a, scale_b, None, None, None, None, o, None, None, None, None, None,
                  None, self.dummy, None]
        if extras:
            for i, e in enumerate(extras):
                values[6 + i] = e
        stream = L.current_stream(self.device_index)
        scale = pre = None
        if self.more:
            scale, pre = self._more(a, values, stream)
        floats = (float(alpha), float(beta))  # an int alpha would re-specialise a JIT launch
        for c in self.launches:
            c.run(values, floats, stream)
        return o, scale, pre

    def _more(self, a, values, stream):
        scale = pre = None
        if self.scale_shape is not None:
            scale = values[11] = empty(self.scale_shape, torch.float32, a)
        if self.pre_shape is not None:
            pre = values[12] = empty(self.pre_shape, self.pre_dtype, a)
        for role, shape, dtype in self.temps:
            values[role] = empty(shape, dtype, a)
        if self.ws is not None:
            values[15] = L.stream_buffer("ws", self.device, stream, self.ws[1], self.ws[0])
            values[16] = L.stream_buffer("lock", self.device, stream, self.lock, torch.int32)
        return scale, pre


# role index -> the user argument it must equal (checked when a plan is made)
assert L.ROLES[:10] == ("a", "b", "bias", "residual", "scale_a", "scale_b", "e0", "e1", "e2", "e3")
assert L.ROLES[10:] == ("out", "q_scale", "pre", "wide", "amax", "ws", "lock", "dummy", "wide_q")

_plans: dict[tuple, Plan] = {}
_plans_lock = threading.Lock()
_owner: list = [None, None]  # the settings and tuner generation the plans were made under
MAX_PLANS = 4096  # a process cycling through more signatures than this starts again (memory bound)


def forget_plans() -> None:
    with _plans_lock:
        _plans.clear()


def plan_count() -> int:
    return len(_plans)


def _check_owner() -> None:
    """Drop the plans when the settings or the tuner's decisions changed since they were made."""
    if _owner[0] is not tf_config.get() or _owner[1] != gemm_tuning.generation:
        with _plans_lock:
            _plans.clear()
            _owner[0], _owner[1] = tf_config.get(), gemm_tuning.generation


def _key(a, b, out_dtype, bias, activation, residual, alpha, beta, scale_a, scale_b, quantize, epilogue_fn,
         extra_operands, out, store_pre, config, store_out) -> tuple:
    return (_sig(a), _sig(b), out_dtype, None if bias is None else _sig(bias), activation,
            None if residual is None else _sig(residual), alpha == 1.0, type(alpha) in _NUMBERS, type(beta) in _NUMBERS,
            None if scale_a is None else _sig(scale_a), None if scale_b is None else _sig(scale_b), quantize,
            id(epilogue_fn), tuple(map(_sig, extra_operands)) if extra_operands else (),
            None if out is None else _sig(out), store_pre, config, store_out,
            torch.backends.cuda.matmul.allow_tf32 if a.dtype is torch.float32 else None,
            K_MAJOR_MIN)  # (the plan keeps the copy decision it implies; a probe may change it)


def epilogue_plan(a: Tensor, b: Tensor, epilogue_fn, extra_operands: Sequence[Tensor], out: Tensor,
                  store_out: bool = True) -> tuple[Plan | None, tuple]:
    """The plan :func:`gemm_with_epilogue` replays for these arguments (no other options, ``out`` given, its
    dtype the output's), if one is kept, and what it was made under (:func:`plan_current` compares): a caller
    whose later calls have the same signature but for the addresses (a compiled graph's GEMM step) replays it
    itself."""
    _check_owner()
    try:
        plan = _plans.get(_key(a, b, out.dtype, None, "none", None, 1.0, 1.0, None, None, None, epilogue_fn,
                               extra_operands, out, False, None, store_out))
    except Exception:
        plan = None
    return plan, (_owner[0], _owner[1], torch.backends.cuda.matmul.allow_tf32, K_MAJOR_MIN)


def plan_current(made_under: tuple) -> bool:
    """Whether a plan :func:`epilogue_plan` returned still holds: the settings, the tuner's decisions, tf32 and
    the K-major threshold are those it was made under."""
    return (made_under[0] is tf_config.get() and made_under[1] == gemm_tuning.generation
            and made_under[2] == torch.backends.cuda.matmul.allow_tf32 and made_under[3] == K_MAJOR_MIN)


def gemm_call(a: Tensor, b: Tensor, *, out_dtype=None, bias=None, activation="none", residual=None,
              alpha: float = 1.0, beta: float = 1.0, scale_a=None, scale_b=None, quantize=None, epilogue_fn=None,
              extra_operands: Sequence[Tensor] = (), out=None, store_pre: bool = False,
              config: GemmConfig | None = None, store_out: bool = True) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """C = epilogue(A @ B); returns ``(value, scale, pre)``: the result (2-D for 2-D operands, else 3-D;
    ``out`` itself when given), the per-row scales ((M, 1) or (Z, M, 1)) when quantising, the pre-activation
    values (Z, M, N) when ``store_pre``. Arguments as :func:`tilefuse.linalg.gemm`."""
    _check_owner()
    try:
        key = _key(a, b, out_dtype, bias, activation, residual, alpha, beta, scale_a, scale_b, quantize, epilogue_fn,
                   extra_operands, out, store_pre, config, store_out)
        plan = _plans.get(key)
    except Exception:  # not tensors, an unhashable argument, a tensor without storage: the full path says
        key, plan = None, None
    if plan is not None:
        if out is not None:  # a signature has no addresses: out='s overlap is checked every call
            check_out_overlap(out, a, b, bias, residual, scale_a, scale_b, extra_operands)
        return plan.run(a, b, bias, residual, scale_a, scale_b, extra_operands, out, alpha, beta)
    return _first_call(key, a, b, out_dtype=out_dtype, bias=bias, activation=activation, residual=residual,
                       alpha=alpha, beta=beta, scale_a=scale_a, scale_b=scale_b, quantize=quantize,
                       epilogue_fn=epilogue_fn, extra_operands=extra_operands, out=out, store_pre=store_pre,
                       config=config, store_out=store_out)


# Hopper's wgmma transposes 16-bit operands itself, but reads tf32, fp8 and int8 operands from shared memory
# K-major only. An N-major B (a row-major (K, N) tensor, the plain A @ B) is transposed on its way in: by
# the pointer kernels' cp.async, or through registers each K step after a TMA load. For tf32 the best of
# those ran 0.35x cuBLAS at 4096^3, while the K-major candidates reached 0.96x
# (docs/decisions/018-gemm-k-major-copy.md). So an N-major B (an M-major A) is copied K-major first (:func:`relayout`:
# 38 us for 4096^2 fp32; tf32 NN end to
# end 0.91x cuBLAS at 4096^3), when the other dimension is at least K_MAJOR_MIN. Measured for
# tf32 at N = K = 4096 (tools/relayout_probe.py --crossover), copy against no copy: M = 128
# 0.0722 / 0.0719 ms (a tie), 256 0.079 / 0.122, 384 0.098 / 0.205, 512 0.098 / 0.205, 1024 0.145 / 0.400
# ms. Both grow with N x K, so the crossover is a row count. fp8 and int8 (N = K = 4096, copy
# against no copy): M = 256 0.045 / 0.061 and 0.027 / 0.060 ms, M = 4096 0.115 / 0.813 and 0.125 / 0.792 ms.
K_MAJOR_MIN = 256
K_MAJOR_DTYPES = frozenset((torch.float32, torch.float8_e4m3fn, torch.float8_e5m2, torch.int8))


def k_major_copies(a: Tensor, b: Tensor, dev: device.Device) -> tuple[bool, bool]:
    """(copy ``a``, copy ``b``): which operands :func:`wgmma_copies` has copied K-major on ``dev``, from the
    shapes and strides alone (the dtype and, for fp32, tf32 being allowed are the caller's checks)."""
    if dev.vendor != "nvidia" or dev.interpreter or (dev.capability or (0, 0))[0] != 9:
        return False, False
    if a.dim() not in (2, 3) or b.dim() not in (2, 3) or 0 in a.stride() or 0 in b.stride():
        return False, False  # a broadcast operand: the copy would materialise every repeat
    copy_b = a.shape[-2] >= K_MAJOR_MIN and b.stride(-1) == 1 and b.stride(-2) != 1 and b.shape[-1] > 1
    copy_a = b.shape[-1] >= K_MAJOR_MIN and a.stride(-2) == 1 and a.stride(-1) != 1 and a.shape[-2] > 1
    return copy_a, copy_b


def wgmma_copies(a: Tensor, b: Tensor) -> tuple[bool, bool]:
    """(copy ``a``, copy ``b``) K-major before the GEMM: where wgmma reads them K-major only (NVIDIA sm_90:
    tf32 when ``torch.backends.cuda.matmul.allow_tf32``, fp8, int8: K_MAJOR_DTYPES) and the copy pays (see
    K_MAJOR_MIN). Checked operands only (a call's first run decides; its plan repeats the decision)."""
    if not a.is_cuda or a.dtype not in K_MAJOR_DTYPES or b.dtype not in K_MAJOR_DTYPES \
            or (a.dtype is torch.float32 and not torch.backends.cuda.matmul.allow_tf32):
        return False, False
    return k_major_copies(a, b, device.current())


def k_major(a: Tensor, b: Tensor, copies: tuple[bool, bool]) -> tuple[Tensor, Tensor]:
    """``(a, b)`` with the operands ``copies`` names copied K-major (same values, other strides): A into
    (M, K) rows, B into (K, N) with strides (1, K)."""
    if copies[0]:
        a = relayout(a, torch.empty_like(a, memory_format=torch.contiguous_format))
    if copies[1]:
        b = relayout(b, torch.empty(b.shape[:-2] + b.shape[-1:] + b.shape[-2:-1], dtype=b.dtype,
                                    device=b.device).mT)
    return a, b


RELAYOUT_BLOCK = {4: 64, 2: 128, 1: 128}  # tile side by element size: 64 x 64 x 4 B, 128 x 128 x 1 B = 16 KB


def relayout(x: Tensor, out: Tensor) -> Tensor:
    """``out[...] = x`` through :func:`~tilefuse.kernels.gemm.relayout_kernel` (2-D or 3-D, same shape and
    dtype; out must not overlap x). On the H200 (``tools/relayout_probe.py``,
    docs/decisions/018-gemm-k-major-copy.md) it moved 4096 x 4096 fp32 in 38 us (3.5 TB/s, 97 % of a plain
    copy) where torch's own transposing copy took 128 us (1.05 TB/s)."""
    from .kernels import relayout_kernel

    if x.shape != out.shape or x.dtype != out.dtype or x.dim() not in (2, 3):
        raise ValueError(f"relayout: x {tuple(x.shape)} {x.dtype} and out {tuple(out.shape)} {out.dtype} must have "
                         "the same 2-D or 3-D shape and dtype")
    x3 = x if x.dim() == 3 else x.unsqueeze(0)
    o3 = out if out.dim() == 3 else out.unsqueeze(0)
    Z, R, C = x3.shape
    if Z and R and C:
        # a kept launch site a layout (the JIT's dispatch costs ~20-40 us of host time a launch)
        key = (x3.shape, x3.stride(), o3.stride(), x.dtype, x.device)
        site = _relayout_sites.get(key)
        if site is None:
            if len(_relayout_sites) >= MAX_PLANS:
                _relayout_sites.clear()
            block = RELAYOUT_BLOCK.get(x.element_size(), 64)
            grid = (triton.cdiv(R, block), triton.cdiv(C, block), Z)
            site = _relayout_sites[key] = SiteLauncher(relayout_kernel, grid, {"num_warps": 4},
                                                       {"BLOCK_R": block, "BLOCK_C": block})
        site(x3, o3, R, C, *x3.stride(), *o3.stride())
    return out


_relayout_sites: dict[tuple, SiteLauncher] = {}


_NUMBERS = frozenset((float, int))  # alpha/beta types the checks accept as they are (bool is not one)
_bad_configs: set[tuple] = set()


def choose_config(ops: Operands) -> GemmConfig:
    return gemm_tuning.choose(ops)


def _first_call(key, a, b, *, out_dtype, bias, activation, residual, alpha, beta, scale_a, scale_b, quantize,
                epilogue_fn, extra_operands, out, store_pre, config, store_out=True):
    checked = dict(out_dtype=out_dtype, bias=bias, activation=activation or "none", residual=residual, alpha=alpha,
                   beta=beta, scale_a=scale_a, scale_b=scale_b, quantize=quantize, epilogue_fn=epilogue_fn,
                   extra_operands=extra_operands, out=out, store_pre=store_pre, store_out=store_out)
    copies = (False, False)
    if getattr(a, "dtype", None) in K_MAJOR_DTYPES:
        prepare(a, b, allocate=False, **checked)  # bad input raises here, before the copy's launch
        copies = wgmma_copies(a, b)
        if any(copies):
            a, b = k_major(a, b, copies)
    ops = prepare(a, b, **checked)
    two_d = a.dim() == 2 and b.dim() == 2
    a3 = a if a.dim() == 3 else a.unsqueeze(0)
    b3 = b if b.dim() == 3 else b.unsqueeze(0)
    Z = max(a3.shape[0], b3.shape[0]) if min(a3.shape[0], b3.shape[0]) > 0 else 0
    M, N = a3.shape[1], b3.shape[2]
    value_shape = (M, N) if two_d else (Z, M, N)
    scale_shape = (M, 1) if two_d else (Z, M, 1)
    stored = ops.q if ops.q is not None else ops.c
    value = out if out is not None else stored.view(value_shape)
    scale = ops.q_scale.view(scale_shape) if ops.q_scale is not None else None
    pre = None
    if ops.pre is not None:
        pre = ops.pre.t.reshape(Z, M, N) if ops.Z != Z else ops.pre.t
    if not (ops.M and ops.N and Z):
        if ops.q_scale is not None:
            ops.q_scale.fill_(QUANT_EPS / qmax(ops.q.dtype))
        return value, scale, pre
    if ops.K == 0 and ops.q is None and not ops.epi.hook and ops.epi.bias == "none" and not ops.epi.residual \
            and ops.epi.activation in ("none", "relu", "gelu", "gelu_tanh", "silu", "tanh"):
        ops.c.zero_()  # every activation above maps 0 to 0: nothing to launch
        if ops.pre is not None:
            ops.pre.t.zero_()
        return value, scale, pre
    cfg = config or choose_config(ops)
    if (ops.problem, cfg) in _bad_configs:
        cfg = SAFE_CONFIG
    while True:
        ls, post = L.launches(ops, cfg)
        try:
            if post is not None or not _sees_user_tensors(ops, ls, a, b, bias, residual, scale_a, scale_b,
                                                          extra_operands, out):
                L.bound(ops, cfg)()  # runs the full path every call (see the module's note)
                tf_config.log(2, f"gemm {ops.problem.describe()}: {cfg.label()} (unplanned)")
                break
            if L.uses_tma(ls):
                L.ensure_scratch_allocator()
            plan = Plan(ops, ls, cfg, value_shape, scale_shape, (Z, M, N), epilogue_fn, copies)
            values = L.role_values(ops, ls)
            stream = L.current_stream(plan.device_index)
            for c in plan.launches:
                c.run(values, (ops.alpha, ops.beta), stream)
            if key is not None:
                with _plans_lock:
                    if len(_plans) >= MAX_PLANS:
                        _plans.clear()
                    _plans[key] = plan
            tf_config.log(2, f"gemm {ops.problem.describe()}: {cfg.label()}")
            break
        except triton.runtime.errors.OutOfResources as exc:
            # a config the device rejects (out of shared memory or registers on a part the space did not foresee)
            if cfg == SAFE_CONFIG:
                raise
            tf_config.log(1, f"gemm: {cfg.label()} does not fit ({exc}); falling back to {SAFE_CONFIG.label()}")
            _bad_configs.add((ops.problem, cfg))
            cfg = SAFE_CONFIG
    return value, scale, pre


def _sees_user_tensors(ops: Operands, ls: list[L.Launch], a, b, bias, residual, scale_a, scale_b, extras, out) -> bool:
    """Every pointer of a user role is that user tensor's own address (a view, not a copy), so a later call
    with the same signature can pass its tensors straight in; ``out=`` likewise for the store target."""
    user = {"a": a, "b": b, "bias": bias, "residual": residual, "scale_a": scale_a, "scale_b": scale_b}
    for i, e in enumerate(extras):
        user[f"e{i}"] = e
    for x in ls:
        for name, role in x.roles.items():
            t = x.args[name]
            if role in user and (user[role] is None or t.data_ptr() != user[role].data_ptr()):
                return False
            if role == "out" and out is not None and t.data_ptr() != out.data_ptr():
                return False
    return True


# ------------------------------------------------------------------------------------ entry points
def gemm_raw(a: Tensor, b: Tensor, *, out_dtype=None, bias=None, activation="none", residual=None,
             alpha: float = 1.0, beta: float = 1.0, scale_a=None, scale_b=None, quantize=None, epilogue_fn=None,
             extra_operands: Sequence[Tensor] = (), out=None, store_pre: bool = False,
             config: GemmConfig | None = None) -> GemmOutputs:
    """C = epilogue(A @ B) on 2-D or 3-D operands (batch of 1 broadcasts).

    Returns :class:`GemmOutputs` with 3-D ``out`` (Z, M, N) (a view of ``out=`` when given), the per-row
    ``scale`` (Z, M, 1) when quantising and the pre-activation values when ``store_pre``.
    """
    value, scale, pre = gemm_call(a, b, out_dtype=out_dtype, bias=bias, activation=activation, residual=residual,
                                  alpha=alpha, beta=beta, scale_a=scale_a, scale_b=scale_b, quantize=quantize,
                                  epilogue_fn=epilogue_fn, extra_operands=extra_operands, out=out,
                                  store_pre=store_pre, config=config)
    return GemmOutputs(value if value.dim() == 3 else value.unsqueeze(0),
                       None if scale is None else (scale if scale.dim() == 3 else scale.unsqueeze(0)), pre)


def gemm_with_epilogue(a: Tensor, b: Tensor, epilogue_fn, extra_operands: Sequence[Tensor] = (),
                       out_dtype: torch.dtype | None = None, *, bias=None, activation=None, residual=None,
                       alpha: float = 1.0, beta: float = 1.0, scale_a=None, scale_b=None, quantize=None, out=None,
                       config: GemmConfig | None = None, store_out: bool = True):
    """The compiler's entry: ``epilogue_fn`` (a ``@triton.jit`` hook, see :mod:`.gemm_epilogue`) runs on the
    fp32 tile after the built-in steps, reading up to four ``extra_operands`` broadcast to the output.
    ``store_out=False``: the hook stores every output itself (through its slots) and the tile it returns is
    not stored (a quantising tail whose only output is a float8 or int8 code: the product's 2-4 bytes an
    element are never written); ``out`` may then be a one-element buffer with zero strides.

    Returns the output with the operands' batch shape (2-D for 2-D operands), or ``(codes, scales)`` when
    ``quantize`` is given. No autograd: the compiler differentiates its graphs itself.
    """
    value, scale, _ = gemm_call(a, b, out_dtype=out_dtype, bias=bias, activation=activation or "none",
                                residual=residual, alpha=alpha, beta=beta, scale_a=scale_a, scale_b=scale_b,
                                quantize=quantize, epilogue_fn=epilogue_fn, extra_operands=extra_operands, out=out,
                                config=config, store_out=store_out)
    if scale is not None:
        return value, scale
    return value


def supports(a: Tensor, b: Tensor, **epilogue) -> tuple[bool, str]:
    """(True, "") when :func:`gemm_raw` accepts these operands and epilogue keywords, else (False, why).
    Runs the checks only: nothing is allocated or launched."""
    try:
        prepare(a, b, allocate=False, **epilogue)
    except (TypeError, ValueError) as exc:
        return False, str(exc)
    return True, ""


def run_with_config(ops: Operands, cfg: GemmConfig) -> GemmConfig:
    """Launch, falling back to SAFE_CONFIG when the device rejects ``cfg``. Returns the config that ran."""
    key = (ops.problem, cfg)
    if key in _bad_configs:
        cfg = SAFE_CONFIG
    try:
        L.launch(ops, cfg)
        return cfg
    except triton.runtime.errors.OutOfResources as exc:
        if cfg == SAFE_CONFIG:
            raise
        tf_config.log(1, f"gemm: {cfg.label()} does not fit ({exc}); falling back to {SAFE_CONFIG.label()}")
        _bad_configs.add(key)
        L.launch(ops, SAFE_CONFIG)
        return SAFE_CONFIG


def host_path_us(a: Tensor, b: Tensor, calls: int = 2000, rounds: int = 5, **kw) -> float:
    """Microseconds a repeat call spends on the host with the kernel launches stubbed out: the plan lookup,
    output allocation and argument filling between ``tilefuse.gemm`` and the launcher (the best of
    ``rounds``). Runs on any machine; the launcher's own C cost (argument parsing, cuLaunchKernelEx) is not
    included."""
    import time

    gemm_call(a, b, **kw)  # makes the plan
    saved = L.CompiledLaunch.run
    L.CompiledLaunch.run = lambda self, values, floats, stream: None
    try:
        best = float("inf")
        for _ in range(rounds):
            t0 = time.perf_counter()
            for _ in range(calls):
                gemm_call(a, b, **kw)
            best = min(best, (time.perf_counter() - t0) / calls * 1e6)
        return best
    finally:
        L.CompiledLaunch.run = saved
