"""Launching the GEMM family: what one call launches, and the compiled replay a plan uses.

:func:`launches` turns checked operands (:class:`~tilefuse.kernels.gemm.checks.Operands`) and a config into
:class:`Launch` records: the kernel, its grid, every argument by name and, for each pointer argument, the
*role* of its tensor ("a", "out", "bias", "ws", ...). The roles are what lets a plan
(:mod:`tilefuse.kernels.gemm.plan`) keep a launch and swap in the next call's tensors.

:class:`CompiledLaunch` runs one record. Its first run goes through the JIT (``kernel[grid](...)``), which
compiles or finds the kernel and returns it; later runs call that compiled kernel's launcher directly with
the arguments in order and pointers as integers: no argument binding, no specialisation key, no cache key,
no ``cuPointerGetAttribute`` a pointer. That dispatch is most of the ~20 us a call measured on the H200
(1024^3 at 0.031 ms against cuBLAS's 0.009: docs/decisions/020-gemm-launch-host-time.md).

Scratch memory a launch needs is kept a (device, stream): the split-K counters (zero between launches by
construction), the split-K workspace and the global scratch of in-kernel TMA descriptors. Reusing one buffer
on one stream is safe because launches on a stream run one after the other.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import torch
import triton

from ... import device
from ..launcher import Direct, current_stream, hooks_installed, stream_buffer  # current_stream, stream_buffer: also L.* in gemm_plan
from .kernels import gemm_persistent_kernel, gemm_tiled_kernel, quantize_rows_kernel
from .checks import TMA_ALIGN, Operands, fp8_grid, qmax
from .configs import STREAM_K_MIN_STEPS, GemmConfig, current_part, split_in_registers, ws_possible
from .epilogue import (ACTIVATIONS, BIAS_MODES, NUM_EXTRA_OPERANDS, QUANT_DIRECT, QUANT_NONE, QUANT_TWO_PASS,
                            SCALE_MODES_A, SCALE_MODES_B)

# Roles of pointer arguments. User roles are the call's own tensors; the others are made per call
# ("out", "q_scale", "pre", "wide", "amax"), kept a stream ("ws", "lock") or kept for good ("dummy").
USER_ROLES = ("a", "b", "bias", "residual", "scale_a", "scale_b") + tuple(f"e{i}" for i in range(NUM_EXTRA_OPERANDS))
ROLES = USER_ROLES + ("out", "q_scale", "pre", "wide", "amax", "ws", "lock", "dummy", "wide_q")
ROLE_INDEX = {r: i for i, r in enumerate(ROLES)}
VALUE_ROLES = ("alpha", "beta")  # float arguments that change from call to call


@dataclasses.dataclass
class Launch:
    """One kernel launch: every argument by parameter name (pointers as tensors) and the role of each pointer."""
    kernel: Any
    grid: tuple[int, ...]
    args: dict[str, Any]
    roles: dict[str, str]  # pointer parameter -> role
    options: dict[str, Any]
    values: dict[str, str] = dataclasses.field(default_factory=dict)  # float parameter -> value role
    kept: dict[str, tuple[int, torch.dtype]] = dataclasses.field(default_factory=dict)  # "ws"/"lock" -> numel, dtype
    # TMA descriptor parameter -> (role of the tensor it describes, shape, strides, block shape): made on the
    # host for each launch from that role's tensor (the plan's signature fixes shape and strides)
    descs: dict[str, tuple[str, tuple, tuple, tuple]] = dataclasses.field(default_factory=dict)


# ------------------------------------------------------------------------------------ kept buffers
_dummies: dict[tuple, torch.Tensor] = {}


def _stream_of(dev: torch.device) -> int:
    return torch.cuda.current_stream(dev).cuda_stream if dev.type == "cuda" else 0


def dummy(dev: torch.device) -> torch.Tensor:
    key = (dev.type, dev.index)
    t = _dummies.get(key)
    if t is None:
        t = _dummies[key] = torch.zeros(16, dtype=torch.float32, device=dev)
    return t


def _scratch_allocator(size: int, alignment: int, stream):
    """Triton's global scratch (in-kernel TMA descriptors): one kept buffer a (device, stream), never a fresh
    allocation a launch."""
    dev = device.torch_device()
    t = stream_buffer("scratch", dev, int(stream or 0), size + alignment, torch.int8)
    offset = (-t.data_ptr()) % max(1, alignment)
    return t[offset:offset + size] if offset else t


_allocator_set = False


def ensure_scratch_allocator() -> None:
    """Device-side tensor descriptors live in a global scratch buffer Triton asks the allocator for. The
    allocator is a context variable (per thread): set ours unless someone else set one."""
    global _allocator_set
    try:
        from triton.runtime import _allocation

        current = _allocation._allocator.get()
        if not isinstance(current, _allocation.NullAllocator):
            return
    except (ImportError, AttributeError):
        pass
    triton.set_allocator(_scratch_allocator)
    _allocator_set = True


# TMA descriptors made on the host and passed to the kernel (HOST_DESC), rather than made by every program in the
# kernel: tools/tma_desc_probe.py measured (docs/decisions/015-gemm-host-tma-descriptors.md) the in-kernel ones at
# 1.4-3.6 us a call (1024^3: 8.64 us with host descriptors, 11.06 with in-kernel ones, cuBLAS 9.22). NVIDIA and the
# interpreter; AMD keeps the in-kernel path (its TMA-less parts never take it), and so do warp-specialised kernels
# (triton 3.6's Hopper warp specialisation fails to compile with descriptor parameters). A switch for tests and A/B
# timing.
HOST_DESCRIPTORS = True


def host_descriptors(vendor: str) -> bool:
    return HOST_DESCRIPTORS and (vendor == "nvidia" or device.current().interpreter)


def descriptor_blocks(cfg: GemmConfig, a_t: bool, b_t: bool) -> tuple[tuple, tuple, tuple]:
    """Block shapes of the A, B and C TMA descriptors, as ``gemm.make_ab_descriptors`` and the persistent
    kernel's store describe them: the unit stride last, so a column-major A and a K-contiguous B are described
    transposed; C in column slices of ``epi_subtile``. Shared by the launches and the target matrix's examples."""
    a = (cfg.block_k, cfg.block_m) if a_t else (cfg.block_m, cfg.block_k)
    b = (cfg.block_n, cfg.block_k) if b_t else (cfg.block_k, cfg.block_n)
    return a, b, (cfg.block_m, cfg.block_n // cfg.epi_subtile)


def ab_descriptor_specs(ops: Operands, cfg: GemmConfig) -> tuple[tuple, tuple]:
    """(shape, strides, block) of A's and B's TMA descriptors (see :func:`descriptor_blocks`)."""
    sa, sb = ops.sa, ops.sb
    a_block, b_block, _ = descriptor_blocks(cfg, ops.problem.a_t, ops.problem.b_t)
    a = ((ops.K, ops.M), (sa[2], 1)) if ops.problem.a_t else ((ops.M, ops.K), (sa[1], 1))
    b = ((ops.N, ops.K), (sb[2], 1)) if ops.problem.b_t else ((ops.K, ops.N), (sb[1], 1))
    return (*a, a_block), (*b, b_block)


class HostDescriptor:
    """What Triton's launcher reads of a ``TensorDescriptor`` (base, shape, strides, padding), without the
    dataclass's checks: a plan's replay makes one a descriptor parameter each call, for a tensor whose
    shape, strides and alignment its signature already fixed."""

    __slots__ = ("base", "shape", "strides", "padding")

    def __init__(self, base, shape, strides):
        self.base, self.shape, self.strides, self.padding = base, shape, strides, "zero"


def make_descriptor(t: torch.Tensor, spec: tuple):
    """Triton's ``TensorDescriptor`` over ``t`` with ``spec`` = (shape, strides, block): what the JIT specialises
    a descriptor parameter on (its checks run here; a replay passes a :class:`HostDescriptor` instead)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    shape, strides, block = spec
    return TensorDescriptor(t, list(shape), list(strides), list(block))


# --------------------------------------------------------------------------------- what a call runs
def num_programs() -> int:
    dev = device.current()
    # on the interpreter a handful of programs, so the persistent loop really loops in the tests
    return 3 if dev.interpreter else dev.multiprocessors


def _input_precision(ops: Operands) -> str:
    if ops.a.dtype != torch.float32:
        return "ieee"
    dev = device.current()
    if dev.vendor == "nvidia" and not dev.interpreter and torch.backends.cuda.matmul.allow_tf32:
        return "tf32"
    return "ieee"


def quant_mode(ops: Operands, cfg: GemmConfig) -> int:
    if ops.q is None:
        return QUANT_NONE
    if cfg.kernel == "tiled" and ops.N <= cfg.block_n:
        return QUANT_DIRECT
    return QUANT_TWO_PASS


def launches(ops: Operands, cfg: GemmConfig) -> tuple[list[Launch], Callable[[], None] | None]:
    """The launches of ``cfg`` on ``ops`` (the GEMM, then the quantisation pass when a row spans several
    tiles) and a step to run after them (None, or the copy into a strided quantised ``out=``).

    Allocates what the launches need (the quantisation temporaries; split-K buffers are kept a stream)."""
    dev = ops.a.device
    dz = dummy(dev)
    epi = ops.epi
    qmode = quant_mode(ops, cfg)
    c, c_role = ops.c, "out"
    amax, amax_role = dz, "dummy"
    stride_amax_p = 0
    sc = ops.sc
    if qmode == QUANT_TWO_PASS:
        # bf16 keeps 8 significant bits, 5 more than e4m3: the double rounding moves a code only within
        # 2^-9 of a tie. int8 (7 bits of magnitude) and fp32 inputs keep fp32; so does the interpreter,
        # whose fp32 -> bf16 cast truncates.
        exact = ops.q.dtype == torch.int8 or ops.a.dtype == torch.float32 or device.current().interpreter
        c = torch.empty((ops.Z, ops.M, ops.N), dtype=torch.float32 if exact else torch.bfloat16, device=dev)
        c_role = "wide"
        sc = tuple(c.stride())
        parts = math.ceil(ops.N / cfg.block_n) * (cfg.epi_subtile if cfg.kernel == "persistent" else 1)
        amax, amax_role = torch.empty((parts, ops.Z * ops.M), dtype=torch.float32, device=dev), "amax"
        stride_amax_p = ops.Z * ops.M
    elif qmode == QUANT_DIRECT:
        amax, amax_role = ops.q_scale, "q_scale"
    tiles = math.ceil(ops.M / cfg.block_m) * math.ceil(ops.N / cfg.block_n)
    acc_int = ops.a.dtype == torch.int8
    kept: dict[str, tuple[int, torch.dtype]] = {}
    ws_dtype = torch.int32 if acc_int else torch.float32
    if cfg.kernel == "tiled" and cfg.split_k > 1:
        kept = {"ws": (ops.Z * tiles * cfg.split_k * cfg.block_m * cfg.block_n, ws_dtype),
                "lock": (ops.Z * tiles, torch.int32)}
    use_tma = bool(cfg.tma and ops.problem.tma_ok)
    raw_int = acc_int and c.dtype == torch.int32
    # a config asking for warp specialisation where it cannot compile (see ws_possible) runs without it
    specialise = bool(cfg.warp_specialize and use_tma and ws_possible(cfg, current_part(), epi.hook is not None))

    def opt(mn, role):
        return (mn.t, role) if mn is not None else (dz, "dummy")

    pointers: dict[str, tuple[torch.Tensor, str]] = {
        "a_ptr": (ops.a, "a"), "b_ptr": (ops.b, "b"), "c_ptr": (c, c_role),
        "scale_a_ptr": (ops.scale_a, "scale_a") if ops.scale_a is not None else (dz, "dummy"),
        "scale_b_ptr": (ops.scale_b, "scale_b") if ops.scale_b is not None else (dz, "dummy"),
        "bias_ptr": opt(ops.bias, "bias"), "res_ptr": opt(ops.residual, "residual"), "pre_ptr": opt(ops.pre, "pre"),
        "amax_ptr": (amax, amax_role), "ws_ptr": (dz, "dummy"), "lock_ptr": (dz, "dummy")}
    for i in range(NUM_EXTRA_OPERANDS):
        pointers[f"e{i}_ptr"] = opt(ops.extras[i] if i < len(ops.extras) else None, f"e{i}")
    # (not under warp specialisation: triton 3.6's Hopper pass fails on descriptor parameters)
    host_desc = use_tma and host_descriptors(device.current().vendor) and not specialise
    # B's TMA loads evict-first (ptx_hints writes the policy into the PTX): host descriptors off the interpreter,
    # which host_descriptors allows on NVIDIA only
    b_hint = bool(cfg.b_evict_first and host_desc and not device.current().interpreter)
    descs: dict[str, tuple[str, tuple, tuple, tuple]] = {}
    if host_desc:
        a_spec, b_spec = ab_descriptor_specs(ops, cfg)
        descs = {"a_desc_h": ("a", *a_spec), "b_desc_h": ("b", *b_spec)}
    args: dict[str, Any] = dict(
        M=ops.M, N=ops.N, K=ops.K, Z=ops.Z,
        stride_az=ops.sa[0], stride_am=ops.sa[1], stride_ak=ops.sa[2],
        stride_bz=ops.sb[0], stride_bk=ops.sb[1], stride_bn=ops.sb[2],
        stride_cz=sc[0], stride_cm=sc[1], stride_cn=sc[2],
        stride_bias_z=ops.bias.sz if ops.bias else 0,
        stride_bias=(ops.bias.sn if epi.bias == "col" else ops.bias.sm) if ops.bias else 0,
        stride_rz=ops.residual.sz if ops.residual else 0, stride_rm=ops.residual.sm if ops.residual else 0,
        stride_rn=ops.residual.sn if ops.residual else 0,
        stride_pz=ops.pre.sz if ops.pre else 0, stride_pm=ops.pre.sm if ops.pre else 0,
        stride_pn=ops.pre.sn if ops.pre else 0,
        stride_amax_p=stride_amax_p, alpha=ops.alpha, beta=ops.beta)
    for i in range(NUM_EXTRA_OPERANDS):
        x = ops.extras[i] if i < len(ops.extras) else None
        args[f"e{i}_sz"] = x.sz if x else 0
        args[f"e{i}_sm"] = x.sm if x else 0
        args[f"e{i}_sn"] = x.sn if x else 0
    qdtype = ops.q.dtype if ops.q is not None else None
    args.update(
        EPILOGUE=epi.hook, ACTIVATION=ACTIVATIONS[epi.activation], BIAS_MODE=BIAS_MODES[epi.bias],
        HAS_RESIDUAL=epi.residual, SCALE_A_MODE=SCALE_MODES_A[epi.scale_a], SCALE_B_MODE=SCALE_MODES_B[epi.scale_b],
        HAS_ALPHA=epi.alpha, STORE_PRE=epi.store_pre, QUANT=qmode, QMAX=qmax(qdtype) if qdtype else 1.0,
        Q_INT=qdtype == torch.int8, Q_GRID_MANT=fp8_grid(qdtype)[0], Q_GRID_EMIN=fp8_grid(qdtype)[1],
        RAW_INT=raw_int, ACC_INT=acc_int, INPUT_PRECISION=_input_precision(ops),
        EVEN_K=ops.K % cfg.block_k == 0, USE_TMA=use_tma, A_T=ops.problem.a_t, B_T=ops.problem.b_t,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m)
    args["STORE_C"] = epi.store_out  # False: the hook stores every output (checks.prepare's store_out)
    if cfg.kernel == "tiled":
        kernel = gemm_tiled_kernel
        args["SPLIT_K"] = cfg.split_k
        args["WARP_SPECIALIZE"] = specialise and cfg.split_k == 1
        args["B_STREAM"] = cfg.b_stream and not use_tma
        args["SPLIT_IN_REGS"] = split_in_registers(cfg)
        args["HOST_DESC"] = host_desc
        args["B_HINT"] = b_hint
        grid: tuple[int, ...] = (tiles * cfg.split_k, ops.Z)
    else:
        kernel = gemm_persistent_kernel
        nprog = num_programs()
        c_tma = (use_tma and qmode != QUANT_DIRECT and sc[2] == 1 and (sc[1] * c.element_size()) % TMA_ALIGN == 0
                 and c.data_ptr() % TMA_ALIGN == 0 and ops.Z == 1)
        # stream-K only where the tiles leave a partial last round; its pieces' partials take two tile slots
        # a program (fp32, or int32 for int8), its counters one a tail tile (< nprog)
        # (K = 0: no steps to deal out; the whole-tile loop writes the epilogue of every tile)
        stream_k = bool(cfg.stream_k and not specialise and (tiles * ops.Z) % nprog and ops.K > 0)
        if stream_k:
            kept = {"ws": (2 * nprog * cfg.block_m * cfg.block_n, ws_dtype), "lock": (nprog, torch.int32)}
        args.update(NUM_PROGRAMS=nprog, C_TMA=c_tma, EPI_SUBTILE=cfg.epi_subtile, FLATTEN=cfg.flatten,
                    WARP_SPECIALIZE=specialise, STREAM_K=stream_k, SK_MIN_STEPS=STREAM_K_MIN_STEPS,
                    HOST_DESC=host_desc, B_HINT=b_hint)
        if host_desc and c_tma:
            descs["c_desc_h"] = (c_role, (ops.M, ops.N), (sc[1], 1), descriptor_blocks(cfg, False, False)[2])
        grid = (nprog,) if stream_k else (max(1, min(nprog, tiles * ops.Z)),)
    if kept:
        stream = _stream_of(dev)
        pointers["ws_ptr"] = (stream_buffer("ws", dev, stream, *kept["ws"]), "ws")
        pointers["lock_ptr"] = (stream_buffer("lock", dev, stream, *kept["lock"]), "lock")
    for name in ("a_desc_h", "b_desc_h", "c_desc_h"):
        if name not in descs:
            pointers[name] = (dz, "dummy")  # unused: HOST_DESC is off, or the store is not TMA's
    for name, (t, _) in pointers.items():
        args[name] = t
    by_role = {r: t for t, r in pointers.values()}
    for name, (role, *spec) in descs.items():
        args[name] = make_descriptor(by_role[role], tuple(spec))
    out = [Launch(kernel, grid, args, {n: r for n, (_, r) in pointers.items()},
                  cfg.launch_options(device.current().vendor), {"alpha": "alpha", "beta": "beta"}, kept, descs)]
    post = None
    if qmode == QUANT_TWO_PASS:
        quant, post = _quantize_launch(ops, c, amax)
        out.append(quant)
    return out, post


def _quantize_launch(ops: Operands, y: torch.Tensor, amax: torch.Tensor) -> tuple[Launch, Callable[[], None] | None]:
    """The second pass of per-row quantisation: row amax from the tile partials, then the codes."""
    R, N = ops.Z * ops.M, ops.N
    q = ops.q
    post = None
    if q.is_contiguous():
        target, role = q.reshape(R, N), "out"
    else:  # a strided out=: write through a contiguous buffer, then copy
        target, role = torch.empty((R, N), dtype=q.dtype, device=q.device), "wide_q"

        def post():
            q.copy_(target.view(q.shape))
    interp = device.current().interpreter
    block_n = min(64 if interp else 512, triton.next_power_of_2(max(N, 1)))
    block_p = min(64, triton.next_power_of_2(max(amax.shape[0], 1)))
    args = dict(y_ptr=y, q_ptr=target, scale_ptr=ops.q_scale, amax_ptr=amax, R=R, N=N, n_parts=amax.shape[0],
                stride_yr=y.stride(1), stride_yn=y.stride(2), stride_qr=target.stride(0), stride_qn=target.stride(1),
                stride_amax_p=amax.stride(0), QMAX=qmax(q.dtype), Q_INT=q.dtype == torch.int8,
                Q_GRID_MANT=fp8_grid(q.dtype)[0], Q_GRID_EMIN=fp8_grid(q.dtype)[1],
                BLOCK_R=QUANT_BLOCK_R, BLOCK_N=block_n, BLOCK_P=block_p)
    roles = {"y_ptr": "wide", "q_ptr": role, "scale_ptr": "q_scale", "amax_ptr": "amax"}
    return Launch(quantize_rows_kernel, (triton.cdiv(R, QUANT_BLOCK_R),), args, roles, {"num_warps": 4}), post


QUANT_BLOCK_R = 16  # rows a program of the quantisation pass


def uses_tma(ls: list[Launch]) -> bool:
    return any(L.args.get("USE_TMA") or L.args.get("C_TMA") for L in ls)


# --------------------------------------------------------------------------------- compiled replay
class CompiledLaunch:
    """One :class:`Launch` kept for replay with new tensors.

    ``run(values, stream)`` takes the tensors by role index (:data:`ROLE_INDEX`) and the float values
    (alpha, beta). The first run on a GPU goes through the JIT and keeps the compiled kernel's launcher
    (:class:`~tilefuse.kernels.launcher.Direct`); later runs call it with the recorded arguments, pointers as
    integers (the plan's signature fixed every tensor's dtype and alignment). On the interpreter every run
    goes through the JIT (there is nothing compiled to keep)."""

    __slots__ = ("kernel", "grid", "options", "jit_args", "direct_args", "ptr_slots", "value_slots", "desc_slots",
                 "names", "direct", "interpret", "device_index")

    def __init__(self, launch: Launch):
        self.kernel, self.grid, self.options = launch.kernel, launch.grid, launch.options
        names = list(launch.kernel.arg_names)
        self.names = names
        self.jit_args = [launch.args[n] for n in names]
        self.direct_args = list(self.jit_args)
        self.ptr_slots: list[tuple[int, int]] = []
        for n, role in launch.roles.items():
            i = names.index(n)
            if role == "dummy":
                self.direct_args[i] = launch.args[n].data_ptr()
            elif role in ROLE_INDEX:
                self.ptr_slots.append((i, ROLE_INDEX[role]))
            else:
                raise ValueError(f"role {role!r} of {n} cannot be replayed")
        self.value_slots = [(names.index(n), VALUE_ROLES.index(r)) for n, r in launch.values.items()]
        # host-made TMA descriptors: made again each run over that run's tensor of the role
        self.desc_slots = [(names.index(n), ROLE_INDEX[role], tuple(spec)) for n, (role, *spec) in launch.descs.items()]
        self.direct: Direct | None = None
        self.interpret = device.current().interpreter
        self.device_index = launch.args[names[0]].get_device() if hasattr(launch.args[names[0]], "get_device") else -1

    def _jit(self, values, floats) -> None:
        args = list(self.jit_args)
        for i, r in self.ptr_slots:
            args[i] = values[r]
        for i, r in self.value_slots:
            args[i] = floats[r]
        for i, r, spec in self.desc_slots:
            args[i] = make_descriptor(values[r], spec)
        compiled = self.kernel[self.grid](*args, **self.options)
        if self.interpret or compiled is None:
            return
        self.direct = Direct(compiled, self.grid, self.device_index)

    def run(self, values: list, floats: tuple, stream: int) -> None:
        if self.direct is None or hooks_installed():
            self._jit(values, floats)
            return
        args = list(self.direct_args)
        for i, r in self.ptr_slots:
            args[i] = values[r].data_ptr()
        for i, r in self.value_slots:
            args[i] = floats[r]
        for i, r, (shape, strides, _) in self.desc_slots:
            args[i] = HostDescriptor(values[r], shape, strides)
        self.direct.launch(stream, args)


def role_values(ops: Operands, ls: list[Launch]) -> list:
    """The tensors of ``ops`` (and of the launches' temporaries) by role index."""
    values: list = [None] * len(ROLES)
    for L in ls:
        for n, role in L.roles.items():
            if role in ROLE_INDEX and values[ROLE_INDEX[role]] is None:
                values[ROLE_INDEX[role]] = L.args[n]
    return values


def bound(ops: Operands, cfg: GemmConfig) -> Callable[[], None]:
    """A callable that runs ``cfg`` on ``ops``'s tensors with the least host work: what the tuner and the sweep
    time (their candidates must not be ranked by launch overhead), and what :func:`launch` runs once."""
    ls, post = launches(ops, cfg)
    if uses_tma(ls):
        ensure_scratch_allocator()
    compiled = [CompiledLaunch(L) for L in ls]
    values = role_values(ops, ls)
    floats = (ops.alpha, ops.beta)
    index = compiled[0].device_index

    def run() -> None:
        stream = current_stream(index)
        for c in compiled:
            c.run(values, floats, stream)
        if post is not None:
            post()
    return run


def launch(ops: Operands, cfg: GemmConfig) -> None:
    """Run ``cfg`` on ``ops`` once (the quantisation pass included)."""
    if ops.M == 0 or ops.N == 0 or ops.Z == 0:
        return
    bound(ops, cfg)()


def warmup(ops: Operands, cfg: GemmConfig) -> None:
    """Compile ``cfg`` for ``ops`` without running it (the tuner compiles candidates ahead, in threads)."""
    ls, _ = launches(ops, cfg)
    if uses_tma(ls):
        ensure_scratch_allocator()
    for L in ls:
        L.kernel.warmup(**L.args, grid=L.grid, **L.options)
