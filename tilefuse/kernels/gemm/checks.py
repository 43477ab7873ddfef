"""Argument checking and operand preparation for the GEMM family (the "check" and "allocate" of
check -> allocate -> launch).

:func:`prepare` validates every argument of a GEMM call (types, dtypes, shapes, devices, unsupported
combinations), raising ``TypeError``/``ValueError`` naming the argument and the accepted values before
anything is launched, then allocates the outputs and returns :class:`Operands`: 3-D views of A, B and C
with their strides, the epilogue's tensors broadcast to (Z, M, N) with their strides, and the
:class:`~tilefuse.kernels.gemm.configs.GemmProblem` the tuner keys on. A batch of B of 1 is folded into
A's rows where the strides allow (the nn.Linear case), so a 3-D input runs as one 2-D GEMM.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import torch

from ... import device
from .configs import GemmProblem
from .epilogue import ACTIVATIONS, NUM_EXTRA_OPERANDS

FLOAT_INPUTS = (torch.float16, torch.bfloat16, torch.float32)
FP8_INPUTS = tuple(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
                   if hasattr(torch, n))
FLOAT_OUTPUTS = (torch.float16, torch.bfloat16, torch.float32)
# quantize= accepts these names, or the torch dtypes themselves
QUANT_NAMES = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2, "int8": torch.int8}
QUANT_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2, torch.int8) + tuple(
    getattr(torch, n) for n in ("float8_e4m3fnuz", "float8_e5m2fnuz") if hasattr(torch, n))
INT8_QMAX = 127.0  # symmetric: -128 is never produced, so q * scale is the same range either side
MAX_INDEX = 2**31 - 1  # offsets inside one operand are 32-bit in the kernels
TMA_ALIGN = 16  # bytes: base address and every non-unit stride of a TMA descriptor


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def tl_dtype_name(dtype: torch.dtype) -> str:
    return {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32", torch.int8: "i8",
            torch.int32: "i32", torch.float8_e4m3fn: "fp8e4nv", torch.float8_e5m2: "fp8e5",
            getattr(torch, "float8_e4m3fnuz", None): "fp8e4b8", getattr(torch, "float8_e5m2fnuz", None): "fp8e5b16",
            }[dtype]


def _hook_id(fn) -> str:
    if fn is None:
        return ""
    key = getattr(fn, "cache_key", None)
    if not isinstance(key, str):
        import inspect

        from ... import diskcache

        inner = getattr(fn, "fn", fn)
        try:
            key = diskcache.digest(inspect.getsource(inner))
        except (OSError, TypeError):
            key = "unknown"
    return f"{getattr(fn, '__name__', getattr(getattr(fn, 'fn', None), '__name__', 'hook'))}:{key[:12]}"


@dataclasses.dataclass(frozen=True)
class Epilogue:
    """What the epilogue does, without its tensors: the tuner's key and the kernel's constexprs."""
    activation: str = "none"
    bias: str = "none"  # none | col | row
    residual: bool = False
    scale_a: str = "none"  # none | tensor | row
    scale_b: str = "none"  # none | tensor | col
    alpha: bool = False  # alpha != 1
    store_pre: bool = False  # also store the pre-activation value (autograd)
    quantize: str = "none"  # none | a torch dtype name (float8_e4m3fn, float8_e5m2, int8, ...)
    hook: Any = None
    store_out: bool = True  # False: the hook stores every output through its slots; the value is not stored

    def signature(self) -> str:
        parts = []
        if self.scale_a != "none" or self.scale_b != "none":
            parts.append(f"scale={self.scale_a}/{self.scale_b}")
        if self.alpha:
            parts.append("alpha")
        if self.bias != "none":
            parts.append(f"bias={self.bias}")
        if self.activation != "none":
            parts.append(self.activation)
        if self.store_pre:
            parts.append("pre")
        if self.residual:
            parts.append("residual")
        if self.hook is not None:
            parts.append(f"hook={_hook_id(self.hook)}")
        if self.quantize != "none":
            parts.append(f"quant={self.quantize}")
        if not self.store_out:
            parts.append("no-store")
        return ",".join(parts) or "plain"


@dataclasses.dataclass
class GemmOutputs:
    out: torch.Tensor  # (Z, M, N): the result, or its quantised codes
    scale: torch.Tensor | None = None  # (Z, M, 1) float32 per-row scales when quantising: out * scale ~ value
    pre: torch.Tensor | None = None  # (Z, M, N) pre-activation values when asked for


@dataclasses.dataclass
class MNOperand:
    """An epilogue operand broadcast to (Z, M, N): the tensor and its three strides."""
    t: torch.Tensor
    sz: int
    sm: int
    sn: int


@dataclasses.dataclass
class Operands:
    a: torch.Tensor
    b: torch.Tensor
    c: torch.Tensor  # the kernel's store target: the output, or the wide temporary when quantising
    M: int
    N: int
    K: int
    Z: int
    sa: tuple[int, int, int]
    sb: tuple[int, int, int]
    sc: tuple[int, int, int]
    epi: Epilogue
    alpha: float
    beta: float
    scale_a: torch.Tensor | None
    scale_b: torch.Tensor | None
    bias: MNOperand | None
    residual: MNOperand | None
    pre: MNOperand | None
    extras: list[MNOperand]
    q: torch.Tensor | None  # quantised output (Z, M, N) and its scales (Z * M,)
    q_scale: torch.Tensor | None
    problem: GemmProblem


def _fail(exc, message):
    raise exc(message)


def _check_device(name: str, t: torch.Tensor, where: torch.device) -> None:
    if t.device.type != where.type or (where.index is not None and t.device.index not in (None, where.index)):
        _fail(ValueError, f"{name} is on {t.device}; tilefuse runs its kernels on {where} here "
                          f"({device.current().describe()}): move it with .to('{where}')")


def _extent(t: torch.Tensor) -> tuple[int, int]:
    """[first, last] byte address ``t``'s elements can touch (a superset of them for gapped strides)."""
    lo = hi = 0
    for size, stride in zip(t.shape, t.stride()):
        reach = (size - 1) * stride
        lo, hi = (lo + reach, hi) if reach < 0 else (lo, hi + reach)
    e = t.element_size()
    return t.data_ptr() + lo * e, t.data_ptr() + hi * e + e - 1


def _exact_alias(out: torch.Tensor, t: torch.Tensor) -> bool:
    """``t`` is read element for element where ``out`` is written (same address, dtype and, broadcast to the
    output, same strides): each element is read before the store that overwrites it, in the same program."""
    if t.data_ptr() != out.data_ptr() or t.dtype != out.dtype:
        return False
    try:
        return t.expand(out.shape).stride() == out.stride() and 0 not in out.stride()
    except RuntimeError:
        return False


def check_out_overlap(out, a, b, bias=None, residual=None, scale_a=None, scale_b=None, extra_operands=()) -> None:
    """``out=`` must not share memory with an input: the kernel writes tiles of ``out`` while other tiles
    still read the inputs, so an overlap gives a silently wrong result. The one exception is ``out`` being
    exactly ``residual`` (or an extra epilogue operand) element for element, an in-place residual add: each
    element is read in the same program, before the store that overwrites it."""
    if not isinstance(out, torch.Tensor) or out.numel() == 0:
        return
    storage = out.untyped_storage().data_ptr()
    lo, hi = _extent(out)
    named = [("a", a), ("b", b), ("bias", bias), ("residual", residual), ("scale_a", scale_a), ("scale_b", scale_b)]
    named += [(f"extra_operands[{i}]", t) for i, t in enumerate(extra_operands or ())]
    for name, t in named:
        if not isinstance(t, torch.Tensor) or t.numel() == 0 or t.device != out.device:
            continue
        if t.untyped_storage().data_ptr() != storage:
            continue
        t_lo, t_hi = _extent(t)
        if t_lo > hi or lo > t_hi:
            continue
        if name in ("residual",) or name.startswith("extra_operands"):
            if _exact_alias(out, t):
                continue
        _fail(ValueError, f"out shares memory with {name}: the GEMM writes out while it still reads {name}, which "
                          f"would give a wrong result; pass a separate out= tensor (or none). Only residual (or an "
                          f"extra epilogue operand) may be out= itself, element for element")


def _as_mn(name: str, t: torch.Tensor, Z: int, M: int, N: int, dev: torch.device, *, batched_out: bool) -> MNOperand:
    if not isinstance(t, torch.Tensor):
        _fail(TypeError, f"{name} must be a torch.Tensor, got {type(t).__name__}")
    _check_device(name, t, dev)
    target = (Z, M, N)
    try:
        view = t.expand(target) if t.dim() == 3 else t.expand(target[1:]).unsqueeze(0).expand(target)
    except RuntimeError:
        shape = "(Z, M, N), (M, N), (N,) or (M, 1)" if batched_out else "(M, N), (N,) or (M, 1)"
        _fail(ValueError, f"{name} of shape {tuple(t.shape)} does not broadcast to the output {target if batched_out else target[1:]}; "
                          f"accepted shapes: {shape}")
    if t.dim() > 3:
        _fail(ValueError, f"{name} has {t.dim()} dimensions; accepted: 1 to 3")
    return MNOperand(view, view.stride(0), view.stride(1), view.stride(2))


def _resolve_quantize(quantize) -> torch.dtype | None:
    if quantize is None or quantize is False:
        return None
    if isinstance(quantize, torch.dtype):
        if quantize in QUANT_DTYPES:
            return quantize
    elif isinstance(quantize, str) and quantize in QUANT_NAMES:
        return QUANT_NAMES[quantize]
    accepted = ", ".join(list(QUANT_NAMES) + [str(d) for d in QUANT_DTYPES])
    _fail(ValueError, f"quantize={quantize!r}: accepted values are None, {accepted}")


# fp8 formats: (mantissa bits, smallest normal exponent), for the interpreter's exact rounding
FP8_GRID = {torch.float8_e4m3fn: (3, -6), torch.float8_e5m2: (2, -14)}
FP8_GRID.update({getattr(torch, n): g for n, g in (("float8_e4m3fnuz", (3, -7)), ("float8_e5m2fnuz", (2, -15)))
                 if hasattr(torch, n)})


def fp8_grid(dtype) -> tuple[int, int]:
    """(0, 0) on a GPU, whose cast rounds correctly; the fp8 grid of ``dtype`` under the interpreter."""
    if dtype is None or dtype not in FP8_GRID or not device.current().interpreter:
        return (0, 0)
    return FP8_GRID[dtype]


def qmax(dtype: torch.dtype) -> float:
    return INT8_QMAX if dtype == torch.int8 else float(torch.finfo(dtype).max)


def _scale_vector(name: str, s, length: int, per: str, dev) -> tuple[torch.Tensor, str]:
    if not isinstance(s, torch.Tensor):
        _fail(TypeError, f"{name} must be a float32 torch.Tensor, got {type(s).__name__}")
    _check_device(name, s, dev)
    if s.dtype != torch.float32:
        _fail(TypeError, f"{name} has dtype {s.dtype}; accepted: torch.float32 (torch._scaled_mm's rule)")
    if s.numel() == 1:
        return s.reshape(1).contiguous(), "tensor"
    if s.numel() == length:
        ok = (s.dim() == 1 or (per == "row" and s.shape[-1] == 1) or (per == "col" and s.dim() >= 2 and
                                                                          s.shape[-1] == length))
        if ok:
            return s.reshape(length).contiguous(), per
    want = "(M, 1) or (M,)" if per == "row" else "(1, N) or (N,)"
    _fail(ValueError, f"{name} of shape {tuple(s.shape)}: accepted shapes are () or (1,) for one scale, {want} "
                      f"for one a {per}")


def _foldable(mn: MNOperand | None, M: int) -> bool:
    return mn is None or M == 1 or mn.sz == M * mn.sm or (mn.sz == 0 and mn.sm == 0)


def _fold(mn: MNOperand | None, Z: int, M: int, N: int) -> MNOperand | None:
    if mn is None:
        return None
    sm = mn.sz if M == 1 else mn.sm
    view = torch.as_strided(mn.t, (1, Z * M, N), (0, sm, mn.sn))
    return MNOperand(view, 0, sm, mn.sn)


def _tma_operand_ok(t: torch.Tensor, s_outer: int, s_inner: int) -> bool:
    e = t.element_size()
    return s_inner == 1 and (s_outer * e) % TMA_ALIGN == 0 and t.data_ptr() % TMA_ALIGN == 0


def prepare(a: torch.Tensor, b: torch.Tensor, *, out_dtype=None, bias=None, activation="none", residual=None,
            alpha: float = 1.0, beta: float = 1.0, scale_a=None, scale_b=None, quantize=None, epilogue_fn=None,
            extra_operands: Sequence[torch.Tensor] = (), out=None, store_pre: bool = False,
            allocate: bool = True, store_out: bool = True) -> Operands | None:
    """Check every argument and allocate the outputs; raises TypeError/ValueError before any launch.
    With ``allocate=False`` only the checks run (and None is returned). ``store_out=False`` (the compiler's
    quantising epilogue, whose hook stores the codes itself): the epilogue's value is not stored; ``out`` is
    then written by nothing (pass a one-element buffer with zero strides)."""
    dev = device.torch_device()
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            _fail(TypeError, f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() not in (2, 3):
            _fail(ValueError, f"{name} has {t.dim()} dimensions (shape {tuple(t.shape)}); accepted: 2 (matrix) or 3 (batch of matrices)")
        _check_device(name, t, dev)
    if a.shape[-1] != b.shape[-2]:
        _fail(ValueError, f"a of shape {tuple(a.shape)} and b of shape {tuple(b.shape)}: a's last dimension (K={a.shape[-1]}) "
                          f"must equal b's second-to-last ({b.shape[-2]})")
    a3 = a if a.dim() == 3 else a.unsqueeze(0)
    b3 = b if b.dim() == 3 else b.unsqueeze(0)
    Za, Zb = a3.shape[0], b3.shape[0]
    if Za != Zb and 1 not in (Za, Zb):
        _fail(ValueError, f"batch sizes of a ({Za}) and b ({Zb}) differ; accepted: equal, or one of them 1 (broadcast)")
    Z = max(Za, Zb) if min(Za, Zb) > 0 else 0
    batched_out = a.dim() == 3 or b.dim() == 3
    M, K, N = a3.shape[1], a3.shape[2], b3.shape[2]

    # dtypes
    if a.dtype in FLOAT_INPUTS:
        kind = "float"
        if b.dtype != a.dtype:
            _fail(TypeError, f"a is {a.dtype} but b is {b.dtype}: float inputs must have the same dtype "
                             f"(one of {', '.join(map(str, FLOAT_INPUTS))})")
    elif a.dtype in FP8_INPUTS:
        kind = "fp8"
        if b.dtype not in FP8_INPUTS:
            _fail(TypeError, f"a is {a.dtype} but b is {b.dtype}: with an fp8 a, b must be fp8 too ({', '.join(map(str, FP8_INPUTS))})")
    elif a.dtype == torch.int8:
        kind = "int8"
        if b.dtype != torch.int8:
            _fail(TypeError, f"a is int8 but b is {b.dtype}: int8 GEMMs take int8 x int8")
    else:
        _fail(TypeError, f"a has dtype {a.dtype}; accepted: {', '.join(map(str, FLOAT_INPUTS + FP8_INPUTS + (torch.int8,)))}")
    if out_dtype is None:
        out_dtype = {"float": a.dtype, "fp8": torch.bfloat16, "int8": torch.int32}[kind]
    if not isinstance(out_dtype, torch.dtype):
        _fail(TypeError, f"out_dtype must be a torch.dtype, got {out_dtype!r}")
    allowed_out = FLOAT_OUTPUTS + ((torch.int32,) if kind == "int8" else ())
    if out_dtype not in allowed_out:
        _fail(ValueError, f"out_dtype={out_dtype} for {a.dtype} inputs; accepted: {', '.join(map(str, allowed_out))}")

    if activation is None:
        activation = "none"
    if activation not in ACTIVATIONS:
        _fail(ValueError, f"activation={activation!r}: accepted values are None, {', '.join(repr(k) for k in ACTIVATIONS if k != 'none')}")
    qdtype = _resolve_quantize(quantize)
    if epilogue_fn is not None and not hasattr(epilogue_fn, "fn") and not hasattr(epilogue_fn, "run"):
        _fail(TypeError, f"epilogue_fn must be a @triton.jit function, got {type(epilogue_fn).__name__}")
    extra_operands = list(extra_operands or ())
    if len(extra_operands) > NUM_EXTRA_OPERANDS:
        _fail(ValueError, f"extra_operands has {len(extra_operands)} tensors; accepted: at most {NUM_EXTRA_OPERANDS}")
    if extra_operands and epilogue_fn is None:
        _fail(ValueError, "extra_operands were given without an epilogue_fn to read them")
    if not store_out and (epilogue_fn is None or qdtype is not None):
        _fail(ValueError, "store_out=False needs an epilogue_fn that stores the outputs itself, and no quantize=")
    for name, v in (("alpha", alpha), ("beta", beta)):
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            _fail(TypeError, f"{name} must be a Python float, got {type(v).__name__}")

    raw_int = kind == "int8" and out_dtype == torch.int32
    if raw_int:
        extras_used = [n for n, v in (("bias", bias), ("residual", residual), ("quantize", qdtype), ("epilogue_fn", epilogue_fn),
                                      ("scale_a", scale_a), ("scale_b", scale_b)) if v is not None]
        if activation != "none":
            extras_used.append("activation")
        if alpha != 1.0:
            extras_used.append("alpha")
        if extras_used:
            _fail(ValueError, f"{', '.join(extras_used)} with int8 inputs and out_dtype=torch.int32: the int32 result "
                              "is stored as accumulated; pass out_dtype=torch.float32 (or bfloat16/float16) for an epilogue")
    if (scale_a is not None or scale_b is not None) and kind == "float":
        _fail(ValueError, f"scale_a/scale_b apply to fp8 or int8 inputs; a is {a.dtype} (fold the scale into alpha)")

    # epilogue operands
    bias_mn = res_mn = None
    bias_mode = "none"
    if bias is not None:
        if not isinstance(bias, torch.Tensor):
            _fail(TypeError, f"bias must be a torch.Tensor, got {type(bias).__name__}")
        if bias.dtype not in FLOAT_OUTPUTS:
            _fail(TypeError, f"bias has dtype {bias.dtype}; accepted: {', '.join(map(str, FLOAT_OUTPUTS))}")
        if bias.dim() == 1 or (bias.dim() >= 2 and bias.shape[-2] == 1 and bias.shape[-1] != 1) or (N == 1 and bias.dim() >= 2 and bias.shape[-2] == 1):
            bias_mode = "col"
        elif bias.dim() >= 2 and bias.shape[-1] == 1:
            bias_mode = "row"
        else:
            _fail(ValueError, f"bias of shape {tuple(bias.shape)}: accepted shapes are (N,) or (1, N) for one a column, "
                              "(M, 1) for one a row (with a leading batch dimension for batched operands); a full (M, N) "
                              "tensor is residual=")
        bias_mn = _as_mn("bias", bias, Z, M, N, dev, batched_out=batched_out)
    if residual is not None:
        if not isinstance(residual, torch.Tensor) or residual.dtype not in FLOAT_OUTPUTS:
            _fail(TypeError, f"residual must be a float tensor ({', '.join(map(str, FLOAT_OUTPUTS))}), got "
                             f"{getattr(residual, 'dtype', type(residual).__name__)}")
        res_mn = _as_mn("residual", residual, Z, M, N, dev, batched_out=batched_out)
    extras = []
    for i, t in enumerate(extra_operands):
        extras.append(_as_mn(f"extra_operands[{i}]", t, Z, M, N, dev, batched_out=batched_out))

    sa_mode = sb_mode = "none"
    sa_vec = sb_vec = None
    if scale_a is not None:
        sa_vec, sa_mode = _scale_vector("scale_a", scale_a, Z * M if batched_out else M, "row", dev)
    if scale_b is not None:
        sb_vec, sb_mode = _scale_vector("scale_b", scale_b, N, "col", dev)

    # output
    out_shape = (Z, M, N)
    final_dtype = qdtype if qdtype is not None else out_dtype
    if out is not None:
        if not isinstance(out, torch.Tensor):
            _fail(TypeError, f"out must be a torch.Tensor, got {type(out).__name__}")
        _check_device("out", out, dev)
        want = out_shape if batched_out else out_shape[1:]
        if tuple(out.shape) != tuple(want):
            _fail(ValueError, f"out has shape {tuple(out.shape)}; the result has shape {tuple(want)}")
        if out.dtype != final_dtype:
            _fail(TypeError, f"out has dtype {out.dtype}; the result is {final_dtype}")
        out3 = out if out.dim() == 3 else out.unsqueeze(0)
    spans = [("a", a3), ("b", b3)] + ([("out", out3)] if out is not None else [])
    for name, t in spans:
        if t.numel() and sum((sz - 1) * abs(st) for sz, st in zip(t.shape[1:], t.stride()[1:])) > MAX_INDEX:
            _fail(ValueError, f"{name} spans more than 2**31 elements in one matrix; split the problem")
    if out is None and M * N > MAX_INDEX:
        _fail(ValueError, f"the result has {M} x {N} > 2**31 elements a matrix; split the problem")
    if out is not None:
        check_out_overlap(out, a, b, bias, residual, scale_a, scale_b, extra_operands)
    if not allocate:
        return None
    if out is None:
        out3 = torch.empty(out_shape, dtype=final_dtype, device=dev)

    epi = Epilogue(activation=activation, bias=bias_mode, residual=res_mn is not None, scale_a=sa_mode, scale_b=sb_mode,
                   alpha=float(alpha) != 1.0, store_pre=bool(store_pre),
                   quantize=dtype_name(qdtype) if qdtype is not None else "none", hook=epilogue_fn,
                   store_out=bool(store_out))
    pre_mn = None
    if store_pre:
        pre_t = torch.empty(out_shape, dtype=out_dtype if out_dtype in FLOAT_OUTPUTS else torch.float32, device=dev)
        pre_mn = MNOperand(pre_t, *pre_t.stride())

    # fold a broadcast batch of B into A's rows: one 2-D GEMM (the nn.Linear case) runs on every kernel
    sa = tuple(a3.stride()) if Za == Z else (0,) + tuple(a3.stride()[1:])
    sb = tuple(b3.stride()) if Zb == Z else (0,) + tuple(b3.stride()[1:])
    a_k, b_k, c_k = a3, b3, out3
    q = q_scale = None
    Mk, Zk = M, Z
    c_mn = MNOperand(out3, *out3.stride())
    a_mn = MNOperand(a3, sa[0], sa[1], sa[2])
    if Z > 1 and sb[0] == 0 and all(_foldable(x, M) for x in [a_mn, c_mn, bias_mn, res_mn, pre_mn] + extras):
        Mk, Zk = Z * M, 1
        a_f = _fold(a_mn, Z, M, K)
        a_k, sa = a_f.t, (0, a_f.sm, a_f.sn)
        c_f = _fold(c_mn, Z, M, N)
        c_k = c_f.t
        bias_mn, res_mn, pre_mn = _fold(bias_mn, Z, M, N), _fold(res_mn, Z, M, N), _fold(pre_mn, Z, M, N)
        extras = [_fold(x, Z, M, N) for x in extras]
    elif Z > 1 and (sa_vec is not None and sa_mode == "row"):
        _fail(ValueError, "a per-row scale_a with batched operands needs b shared across the batch (batch 1) "
                          "and a foldable a; reshape a to (batch * M, K)")
    if qdtype is not None:
        q = c_k
        q_scale = torch.empty(Zk * Mk, dtype=torch.float32, device=dev)
    sc = tuple(c_k.stride())

    a_t = sa[1] == 1 and sa[2] != 1
    b_t = sb[1] == 1 and sb[2] != 1
    tma_ok = (Zk == 1 and K >= 1 and Mk >= 1 and N >= 1
              and (_tma_operand_ok(a_k, sa[2], sa[1]) if a_t else _tma_operand_ok(a_k, sa[1], sa[2]))
              and (_tma_operand_ok(b_k, sb[2], sb[1]) if b_t else _tma_operand_ok(b_k, sb[1], sb[2])))
    problem = GemmProblem(Mk, N, K, Zk, dtype_name(a.dtype), dtype_name(b.dtype), dtype_name(final_dtype),
                          a_t, b_t, tma_ok, epi.signature())
    return Operands(a_k, b_k, c_k, Mk, N, K, Zk, sa, sb, sc, epi, float(alpha), float(beta), sa_vec, sb_vec,
                     bias_mn, res_mn, pre_mn, extras, q, q_scale, problem)


def scratch_operands(ops: Operands) -> Operands:
    """The same inputs with fresh output buffers (the tuner times candidates without touching the caller's
    ``out=``, which may even alias the residual)."""

    def like(t):
        return None if t is None else torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)

    c = like(ops.c)
    q = c if ops.q is not None else None
    pre = MNOperand(like(ops.pre.t), ops.pre.sz, ops.pre.sm, ops.pre.sn) if ops.pre is not None else None
    return dataclasses.replace(ops, c=c, q=q, q_scale=like(ops.q_scale), pre=pre)
