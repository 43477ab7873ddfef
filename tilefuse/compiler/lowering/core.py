"""The lowering's framework: the rule registry, the walk over the graph, loads through views, broadcasting,
type promotion, and the extern fallback (the rules live beside it: pointwise.py, views.py, reductions.py,
gemm.py; :func:`tilefuse.compiler.lowering.lower` is the stage's entry).

What a rule cannot lower (no rule, an unsupported dtype, a pattern the rule declines with
:class:`LoweringError`) becomes an :class:`ir.Extern` that calls ATen, with the reason recorded; in strict
mode that raises :class:`FallbackError` instead. Convolutions and attention are externs by design
(:data:`EXTERN_OPS`), not fallbacks; matmuls lower to :class:`ir.Gemm` (gemm.py), or to an extern by
design with a note where the library GEMM does not take their operands.
"""
from __future__ import annotations

import dataclasses
import math
import operator
from typing import Any, Callable, Optional, Sequence

import torch
import torch.fx

from .. import ir
from ..ir import float8
from ..ir import primitives as P

aten = torch.ops.aten


class LoweringError(Exception):
    """A rule declines this node: it runs as an ATen extern (the message is the recorded reason)."""


class ByDesign(LoweringError):
    """A rule sends this node to ATen by design, not as a fallback (a matmul whose operands the library GEMM does
    not take): the message becomes the extern's note (explain shows it; not counted, not warned about)."""


class FallbackError(RuntimeError):
    """Strict mode (``TILEFUSE_STRICT=1``): tilefuse would have fallen back to ATen; the message says why."""


class GraphFallback(Exception):
    """The whole graph runs in ATen (the message is the reason)."""


# (float8_e4m3fn / float8_e5m2 are compiled in casts, copies and views only: _check_dtype, compiler/ir/float8.py)
SUPPORTED_DTYPES = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8,
                              torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool})

# A library op's plain implementation, by op (filled by the lowering modules of tilefuse's own custom ops): the
# wrapper calls it for such an extern instead of the op, without the dispatcher's Python around the call.
DIRECT_CALLS: dict = {}

# Calls into ATen by design (not counted as fallbacks): convolutions, attention, and the matmul forms that
# nothing decomposes to the library GEMM's (mm, bmm, addmm, baddbmm lower to ir.Gemm: lowering/gemm.py).
EXTERN_OPS = frozenset(filter(None, [
    getattr(aten, n, None) for n in (
        "addbmm", "addmv", "mv", "dot", "vdot", "_scaled_mm", "convolution",
        "convolution_backward", "_convolution", "cudnn_convolution", "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_flash_attention_backward", "_scaled_dot_product_efficient_attention_backward",
        "_scaled_dot_product_cudnn_attention_backward", "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_flash_attention_for_cpu_backward", "multilabel_margin_loss_forward",
        "multilabel_margin_loss_backward", "_flash_attention_forward", "_flash_attention_backward",
        "_efficient_attention_forward", "_efficient_attention_backward", "_cdist_forward", "_cdist_backward",
        "_int_mm", "_weight_int8pack_mm")]))

RULES: dict[Any, Callable] = {}


def register(*ops):
    """Register a lowering rule for ATen ops (an OpOverloadPacket covers all its overloads)."""
    def deco(fn):
        for op in ops:
            if op is None:
                continue
            RULES[op] = fn
        return fn
    return deco


def rule_for(target):
    rule = RULES.get(target)
    if rule is None and hasattr(target, "overloadpacket"):
        rule = RULES.get(target.overloadpacket)
    return rule


def op_name(target) -> str:
    return str(target).replace("torch.ops.", "") if not isinstance(target, str) else target


# ----------------------------------------------------------------------------------------------- values
@dataclasses.dataclass(frozen=True)
class TV:
    """A tensor value during lowering: the IR node (or extern output) named ``name``."""
    name: str


@dataclasses.dataclass(frozen=True)
class Sym:
    """A Python number that came from a (possibly dynamic) size: kernels take it as an argument."""
    value: Any


def plain(v):
    """A Python number from a number or Sym (lists and tuples mapped)."""
    if isinstance(v, Sym):
        return v.value
    if isinstance(v, (list, tuple)):
        return type(v)(plain(x) for x in v)
    return v


def ints(v) -> list[int]:
    v = plain(v)
    if isinstance(v, (int,)):
        return [int(v)]
    return [int(x) for x in v]


def contiguous_stride(shape: Sequence[int]) -> tuple[int, ...]:
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= max(int(s), 1)
    return tuple(reversed(out))


def is_dense(shape: Sequence[int], stride: Sequence[int]) -> bool:
    """Non-overlapping and dense: some permutation of the dims is contiguous."""
    dims = sorted((st, sz) for st, sz in zip(stride, shape) if sz != 1)
    expected = 1
    for st, sz in dims:
        if st != expected:
            return False
        expected *= sz
    return True


def is_non_overlapping(shape: Sequence[int], stride: Sequence[int]) -> bool:
    """No two elements share memory (dense or with gaps, e.g. every other column)."""
    dims = sorted((abs(st), sz) for st, sz in zip(stride, shape) if sz != 1)
    reach = 0  # the largest offset the smaller-stride dims reach
    for st, sz in dims:
        if st <= reach:
            return False
        reach += (sz - 1) * st
    return True


def _tensor_meta(value) -> Optional[ir.TensorMeta]:
    if not isinstance(value, torch.Tensor):
        return None
    return ir.TensorMeta(tuple(int(s) for s in value.shape), tuple(int(s) for s in value.stride()), value.dtype,
                         int(value.storage_offset()))


# ----------------------------------------------------------------------------------------------- lowerer
class Lowerer:
    """Walks one FX graph and builds its IR. ``meta(node)`` gives each node's value as a (fake) tensor or
    number with concrete sizes."""

    def __init__(self, gm: torch.fx.GraphModule, meta: Callable[[torch.fx.Node], Any], strict: bool = False):
        self.gm = gm
        self.meta = meta
        self.strict = strict
        self.nodes: list = []
        self.table: dict[str, Any] = {}  # name -> ir node (extern outputs map to their Extern)
        self.tensor_meta: dict[str, ir.TensorMeta] = {}  # name -> meta of every tensor value
        self.fake: dict[str, Any] = {}  # name -> fake tensor (for type promotion)
        self.env: dict[torch.fx.Node, Any] = {}
        self.fallbacks: list[tuple[str, str]] = []
        self.constants: list[torch.Tensor] = []
        self.seeds = 0
        self.device: Optional[torch.device] = None
        self._device_from_scalar = False
        self.current: Optional[torch.fx.Node] = None
        self.num_args = 0

    # ------------------------------------------------------------------------------------ building
    def add(self, node) -> TV:
        if node.name in self.table:
            raise AssertionError(f"duplicate IR node name {node.name}")
        self.nodes.append(node)
        self.table[node.name] = node
        self.tensor_meta[node.name] = ir.node_meta(node)
        return TV(node.name)

    def origin(self) -> tuple[str, ...]:
        n = self.current
        return (f"{n.name}:{op_name(n.target)}",) if n is not None else ()

    def out_meta(self, node: torch.fx.Node | None = None, k: int | None = None) -> ir.TensorMeta:
        value = self.meta(node or self.current)
        if k is not None:
            value = value[k]
        meta = _tensor_meta(value)
        if meta is None:
            raise LoweringError(f"output is {type(value).__name__}, not a tensor")
        return meta

    def buffer_stride(self, meta: ir.TensorMeta) -> tuple[int, ...]:
        """Layout of a buffer tilefuse allocates: eager's when dense (so outputs match eager's strides)."""
        return meta.stride if is_dense(meta.shape, meta.stride) else contiguous_stride(meta.shape)

    def new_name(self, suffix: str) -> str:
        base = f"{self.current.name}_{suffix}"
        name, k = base, 1
        while name in self.table:
            name, k = f"{base}{k}", k + 1
        return name

    def pointwise(self, fn: Callable, *inputs, name: str | None = None, meta: ir.TensorMeta | None = None,
                  dtype: torch.dtype | None = None, into: str | None = None) -> TV:
        """A Pointwise node over the output's shape: ``fn(*operands)`` with tensor inputs loaded (broadcast)
        at the output position, other inputs passed through; the result is cast to the output dtype."""
        meta = meta or self.out_meta()
        dtype = dtype or meta.dtype
        shape = meta.shape
        vars_ = ir.loop_vars(shape)
        operands = [self.load_broadcast(x, vars_, shape) if isinstance(x, TV) else x for x in inputs]
        body = P.cast(fn(*operands), dtype)
        stride = meta.stride if into else self.buffer_stride(meta)
        return self.add(ir.Pointwise(name or self.current.name, shape, stride, dtype, body, self.origin(), into))

    def pointwise_from(self, meta: ir.TensorMeta, body: ir.Expr) -> TV:
        """A Pointwise node for the current FX node with a body built by hand (over ``loop_vars(shape)``)."""
        return self.add(ir.Pointwise(self.current.name, meta.shape, self.buffer_stride(meta), meta.dtype,
                                     P.cast(body, meta.dtype), self.origin()))

    def load(self, tv: TV, index: Sequence[ir.Index], mask: ir.Expr | None = None) -> ir.Expr:
        """The element of ``tv`` at ``index``, composed through views down to a real node."""
        node = self.table[tv.name]
        index = tuple(index)
        name = tv.name
        while isinstance(node, ir.View):
            mapping = {f"i{d}": index[d] for d in range(len(node.shape))}
            index = tuple(ir.substitute(ix, mapping) for ix in node.index)
            name = node.source
            node = self.table[name]
        meta = self.tensor_meta[name]
        if len(index) != len(meta.shape):
            raise AssertionError(f"load of {name}: {len(index)} indices for rank {len(meta.shape)}")
        return ir.Load.make(name, index, meta.dtype, mask)

    def load_broadcast(self, tv: TV, vars_: Sequence[ir.Index], shape: Sequence[int],
                       mask: ir.Expr | None = None) -> ir.Expr:
        src = self.tensor_meta[tv.name].shape
        n, r = len(shape), len(src)
        if r > n:
            raise LoweringError(f"cannot broadcast shape {list(src)} to {list(shape)}")
        index = []
        for d in range(r):
            od = n - r + d
            if src[d] == 1 and shape[od] != 1:
                index.append(ir.const_index(0))
            elif src[d] == shape[od]:
                index.append(vars_[od])
            else:
                raise LoweringError(f"cannot broadcast shape {list(src)} to {list(shape)}")
        return self.load(tv, index, mask)

    def shape_of(self, tv: TV) -> tuple[int, ...]:
        return self.tensor_meta[tv.name].shape

    def dtype_of(self, v) -> torch.dtype:
        if isinstance(v, TV):
            return self.tensor_meta[v.name].dtype
        if isinstance(v, ir.Expr):
            return v.dtype
        v = plain(v)
        return torch.bool if isinstance(v, bool) else torch.int64 if isinstance(v, int) else torch.float32

    def scalar(self, v, dtype: torch.dtype) -> ir.Expr:
        """An operand as an expression of ``dtype`` (Python numbers become constants)."""
        if isinstance(v, ir.Expr):
            return P.cast(v, dtype)
        if isinstance(v, Sym):
            return P.cast(P.const(v.value, P.compute_dtype(self.dtype_of(v)) if not isinstance(v.value, bool)
                                  else torch.bool, from_size=True), dtype)
        if isinstance(v, TV):
            raise AssertionError("scalar() of a tensor")
        return P.const(v, dtype)

    def promote(self, *args, kind: str = "DEFAULT") -> tuple[torch.dtype, torch.dtype]:
        """(computation-agnostic common dtype, result dtype) by torch's elementwise promotion rules."""
        from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes

        def arg(v):
            if isinstance(v, TV):
                f = self.fake.get(v.name)
                if f is not None:
                    return f
                m = self.tensor_meta[v.name]
                return torch.empty(m.shape if len(m.shape) == 0 else [1] * len(m.shape), dtype=m.dtype,
                                   device="meta")
            return plain(v)

        values = [arg(a) for a in args if a is not None]
        common = elementwise_dtypes(*values, type_promotion_kind=ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT)[1]
        result = elementwise_dtypes(*values, type_promotion_kind=getattr(ELEMENTWISE_TYPE_PROMOTION_KIND, kind))[1]
        return common, result

    def new_seed(self) -> int:
        self.seeds += 1
        return self.seeds - 1

    # ------------------------------------------------------------------------------------ the walk
    def run(self) -> ir.Graph:
        outputs = None
        position = 0
        for node in self.gm.graph.nodes:
            self.current = node
            if node.op == "placeholder":
                self.env[node] = self._placeholder(node, position)
                position += 1
            elif node.op == "get_attr":
                self.env[node] = self._constant(node)
            elif node.op == "call_function":
                self.env[node] = self._call(node)
            elif node.op == "output":
                outputs = self._outputs(node.args[0])
            else:
                raise GraphFallback(f"FX node kind {node.op!r} ({node.name}) is not supported")
        self.current = None
        self.num_args = position
        # constants are appended after the arguments: renumber their inputs now that the count is known
        nodes = tuple(dataclasses.replace(n, position=position + (-n.position - 1))
                      if isinstance(n, ir.InputNode) and n.position < 0 else n for n in self.nodes)
        return ir.Graph(nodes, tuple(outputs or ()), position, self.device or torch.device("cpu"), self.seeds)

    def _note_device(self, value) -> None:
        """The graph's device is that of its tensors with dims; a 0-d CPU tensor (a scalar constant, which eager
        lets take part in GPU ops) decides it only when nothing else does."""
        if isinstance(value, torch.Tensor):
            dev = value.device
            scalar = value.dim() == 0 and dev.type == "cpu"
            if self.device is None or (self._device_from_scalar and not scalar):
                self.device = dev
                self._device_from_scalar = scalar
            elif dev != self.device and not scalar:
                raise GraphFallback(f"tensors on several devices ({self.device}, {dev})")

    def _placeholder(self, node, position):
        value = self.meta(node)
        if isinstance(value, torch.Tensor):
            self._note_device(value)
            meta = _tensor_meta(value)
            self.fake[node.name] = value
            return self.add(ir.InputNode(node.name, meta.shape, meta.stride, meta.dtype, position))
        if isinstance(value, (int, float, bool)) or value is None:
            return Sym(value) if value is not None else None
        if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            raise AssertionError("lowering needs concrete sizes (plan per shape)")
        return value

    def _constant(self, node):
        value = getattr(self.gm, node.target)
        if not isinstance(value, torch.Tensor):
            return value
        self._note_device(value)
        self.constants.append(value)
        meta = _tensor_meta(value)
        self.fake[node.name] = value
        return self.add(ir.InputNode(node.name, meta.shape, meta.stride, meta.dtype, -len(self.constants)))

    def _check_dtype(self, dtype, what, whole_graph=False, target=None):
        if dtype in float8.FP8_DTYPES:
            packet = getattr(getattr(target, "overloadpacket", None), "__name__", "")
            if float8.op_allowed(packet):
                return
            msg = (f"{what} has dtype {dtype}: tilefuse compiles float8 tensors in casts, copies and views "
                   f"only (compiler/ir/float8.py)")
            if whole_graph:
                raise GraphFallback(msg)
            raise LoweringError(msg)
        if dtype not in SUPPORTED_DTYPES:
            kind = "complex" if dtype.is_complex else str(dtype).replace("torch.", "")
            msg = f"{what} has dtype {dtype}: {kind} tensors are not supported by tilefuse"
            if whole_graph:
                raise GraphFallback(msg)
            raise LoweringError(msg)

    def _map(self, a):
        if isinstance(a, torch.fx.Node):
            return self.env[a]
        if isinstance(a, (list, tuple)):
            return type(a)(self._map(x) for x in a)
        if isinstance(a, dict):
            return {k: self._map(v) for k, v in a.items()}
        return a

    def _call(self, node):
        target = node.target
        value = self.meta(node)
        if target is operator.getitem:
            seq = self.env[node.args[0]]
            return seq[node.args[1]]
        if isinstance(value, (int, float, bool)) and not isinstance(target, torch._ops.OpOverload):
            return Sym(value)  # size arithmetic on (concrete) symbolic ints
        if not isinstance(target, torch._ops.OpOverload):
            raise GraphFallback(f"{op_name(target)} ({node.name}) is not an ATen op")
        if isinstance(value, (int, float, bool)):
            return Sym(value)  # aten.sym_size and friends
        args = self._map(node.args)
        kwargs = self._map(node.kwargs)
        if target in EXTERN_OPS or getattr(target, "overloadpacket", None) in EXTERN_OPS:
            return self.extern(node, args, kwargs, reason=None)
        try:
            for v in (value if isinstance(value, (tuple, list)) else (value,)):
                if isinstance(v, torch.Tensor):
                    self._note_device(v)
                    self._check_dtype(v.dtype, f"{node.name} ({op_name(target)})", target=target)
            for a in node.all_input_nodes:
                m = self.meta(a)
                if isinstance(m, torch.Tensor):
                    self._check_dtype(m.dtype, f"input {a.name} of {node.name} ({op_name(target)})", target=target)
            rule = rule_for(target)
            if rule is None:
                raise LoweringError(f"no lowering rule for {op_name(target)}")
            out = rule(self, *args, **kwargs)
        except ByDesign as exc:
            return self.extern(node, args, kwargs, reason=None, note=str(exc))
        except LoweringError as exc:
            return self.extern(node, args, kwargs, reason=str(exc))
        if isinstance(value, torch.Tensor):
            self.fake.setdefault(out.name if isinstance(out, TV) else node.name, value)
        return out

    def extern(self, node, args, kwargs, reason: str | None, note: str | None = None):
        """An ATen call for ``node`` (``reason`` None: by design; ``note``: why, when the design is a choice)."""
        if reason is not None:
            where = f"{node.name} ({op_name(node.target)})"
            if self.strict:
                raise FallbackError(f"tilefuse strict mode: {where} would fall back to ATen: {reason}")
            self.fallbacks.append((where, reason))
        # drop IR nodes a rule built before it declined
        value = self.meta(node)
        values = value if isinstance(value, (tuple, list)) else (value,)
        metas = tuple(_tensor_meta(v) for v in values)
        tuple_output = isinstance(value, (tuple, list))

        def ref(a):
            if isinstance(a, TV):
                return ir.Ref(a.name)
            if isinstance(a, Sym):
                return a.value
            if isinstance(a, (list, tuple)):
                return type(a)(ref(x) for x in a)
            return a

        ext = ir.Extern(node.name, node.target, ref(tuple(args)), tuple((k, ref(v)) for k, v in kwargs.items()),
                        metas, tuple_output, self.origin(), reason, note)
        self.nodes.append(ext)
        for k, meta in enumerate(metas):
            if meta is not None:
                name = ext.output_name(k)
                self.table[name] = ext
                self.tensor_meta[name] = meta
                self.fake[name] = values[k]
        if tuple_output:
            return tuple(TV(ext.output_name(k)) if m is not None else values[k] for k, m in enumerate(metas))
        return TV(ext.name) if metas[0] is not None else value

    def _outputs(self, values) -> list[ir.Output]:
        out = []
        for v in (values if isinstance(values, (list, tuple)) else (values,)):
            if isinstance(v, torch.fx.Node):
                val = self.env[v]
                if isinstance(val, TV):
                    out.append(ir.Output(val.name))
                else:
                    out.append(ir.Output(None, plain(val)))
            else:
                out.append(ir.Output(None, v))
        return out


# ----------------------------------------------------------------------------------- shared rule helpers
def norm_dim(d: int, rank: int) -> int:
    r = max(rank, 1)
    if not -r <= d < r:
        raise LoweringError(f"dim {d} out of range for rank {rank}")
    return d % r


def index_value(ix: ir.Index, dtype=torch.int64) -> ir.Expr:
    return ir.IndexValue.make(ix, dtype)


def index_cond(ix: ir.Index, op: str, bound: int) -> ir.Expr:
    """``ix <op> bound`` as a boolean expression (folded when the bounds of ``ix`` decide it)."""
    lo, hi = ix.bounds()
    decided = {"lt": (hi < bound, lo >= bound), "ge": (lo >= bound, hi < bound),
               "le": (hi <= bound, lo > bound), "gt": (lo > bound, hi <= bound),
               "eq": (ix.is_constant and ix.offset == bound, bound < lo or bound > hi)}[op]
    if decided[0]:
        return P.const(True, torch.bool)
    if decided[1]:
        return P.const(False, torch.bool)
    dtype = torch.int64 if max(abs(lo), abs(hi), abs(bound)) >= 2**31 else torch.int32
    return P.build(op, index_value(ix, dtype), P.const(bound, dtype, from_size=True))


def and_(a: ir.Expr | None, b: ir.Expr | None) -> ir.Expr | None:
    if a is None or (isinstance(a, ir.Const) and a.value is True):
        return b
    if b is None or (isinstance(b, ir.Const) and b.value is True):
        return a
    return P.build("and", a, b)
