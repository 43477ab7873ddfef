"""Code generation of an attention score modification: one lowered expression -> a ``@triton.jit`` function
with the flash-attention family's ``score_mod`` contract (tilefuse/kernels/attention/kernels.py)::

    def NAME(score, b, h, q_idx, k_idx[, operands]):   # -> the modified score tile (float32)

The expression is the loop IR that the compiler's lowering makes of the matched score chain (a pointwise node
over (B, H, Sq, Sk), producers inlined), written by the same :class:`KernelWriter` that writes pointwise
kernels: the loop variables are the kernel's ``b``, ``h``, ``q_idx`` and ``k_idx``; a load of the chain's
input is the ``score`` argument; a load of the operand vector (the tensors the chain reads, packed into one
float32 vector by the pass) reads ``operands`` at its flat offset. The function runs on padded positions too
(``q_idx >= Sq`` or ``k_idx >= Sk``): every load whose address depends on them is masked (``qmask`` /
``kmask``), as the kernel's contract asks. Sizes are literals: the chain is traced at the graph's static shapes.
"""
from __future__ import annotations

import torch

from ... import config, device
from ...kernels.attention import ops_score_mod
from .. import ir, lowering
from ..ir import primitives as P
from ..patterns.score_mod import Refused
from ..scheduler import KernelGroup, Schedule, Scheduler
from .kernel_writer import ASSERT_OPTIONS, TL_DTYPE, KernelWriter, LaunchTarget, _Scope

VARS = ("b", "h", "q_idx", "k_idx")


class ScoreModWriter(KernelWriter):
    """Writes ``body`` (an expression over ``i0..i3`` of ``graph``'s lowered chain) as a score_mod function.
    ``score``: the input node whose load is the score; ``operands``: the input node of the packed operands
    (None when the chain reads no tensor)."""

    def __init__(self, graph: ir.Graph, body: ir.Expr, shape, score: str, operands: str | None,
                 target: LaunchTarget | None = None):
        group = KernelGroup("score_mod", "pointwise", tuple(shape), (), ("score_mod",), (),
                            (("score_mod", body),), (), ())
        super().__init__(group, Schedule(graph, (), frozenset()), target or LaunchTarget.current())
        self.body = body
        self.shape = tuple(int(s) for s in shape)
        self.score = score
        self.operands = operands

    def size(self, value: int) -> str:
        return str(int(value))

    def symbolic_const(self, c) -> str:
        is_float = isinstance(c.value, float) or P.compute_dtype(c.dtype).is_floating_point
        return repr(float(c.value)) if is_float else str(int(c.value))

    def pointer(self, kind: str, buffer: str) -> str:
        if kind != "load" or buffer != self.operands:
            raise AssertionError(f"score_mod: no pointer for {kind} {buffer}")
        return "operands"

    def load(self, e: ir.Load, scope: _Scope):
        if e.buffer == self.score:
            return "score", torch.float32
        return super().load(e, scope)

    def write_function(self, name: str) -> str:
        """The function's text (no imports; helpers in :attr:`helpers`)."""
        self.uses_cache = {}
        self.bodies = {"score_mod": self.body}
        self.positions = {}
        self.local_values = {}
        self.macro_roots = set()
        self.local_uses = {}
        self.form = "score_mod"
        self.pvars, self.masks = ("q_idx", "k_idx"), ("qmask", "kmask")
        B, H, Sq, Sk = self.shape
        self.kmap = {f"i{d}": ir.var_index(v, n) for d, (v, n) in enumerate(zip(VARS, self.shape))}
        top = _Scope(None, "    ", True)
        top.lines += [f"    qmask = q_idx < {Sq}", f"    kmask = k_idx < {Sk}", "    mask = qmask & kmask"]
        text, reg = self.expr(self.body, top)
        if reg != torch.float32:
            text = f"{self.tensor_text(text, reg, top)}.to(tl.float32)"
        top.lines.append(f"    return {text}")
        args = "score, b, h, q_idx, k_idx" + (", operands" if self.operands else "")
        return f"@triton.jit\ndef {name}({args}):\n" + "\n".join(top.lines) + "\n"


def module_source(functions: list[str], helpers: set, header: list[str], target: LaunchTarget | None = None) -> str:
    """A standalone module holding ``functions`` and the helpers they call."""
    target = target or LaunchTarget.current()
    names = P.helpers_closure(helpers)
    on_interpreter = target.interpreter or device.interpreting()
    imports = "import triton\nimport triton.language as tl\n"
    if not on_interpreter and any(h in P.GPU_HELPERS for h in names):
        imports += "from triton.language.extra import libdevice\n"
    helper_text = "\n\n".join(P.helper_text(h, on_interpreter, False) for h in names)
    parts = ["\n".join(f"# {line}" for line in header), imports]
    if helper_text:
        parts.append(helper_text)
    parts.extend(functions)
    return "\n\n".join(parts)


# ------------------------------------------------------------------ the traced chain -> a registered mod
def _expression(gm, score_shape):
    """The lowered chain as one expression over ``i0..i3`` (producers inlined), and the IR graph."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():
        try:
            graph, fallbacks, constants = lowering.lower(gm, lambda n: n.meta.get("val"))
        except lowering.GraphFallback as exc:
            raise Refused(f"the score chain cannot be lowered: {exc}") from None
    if fallbacks:
        where, why = fallbacks[0]
        raise Refused(f"{where} in the score chain has no generated code ({why})")
    if constants:
        raise Refused("the score chain holds a tensor constant")
    out = graph.outputs[0]
    if out.name is None:
        raise Refused("the score chain returns a constant")
    table = graph.by_name()
    vars_ = ir.loop_vars(score_shape)
    name, index = out.name, tuple(vars_)
    node = table[name]
    while isinstance(node, ir.View):
        mapping = {f"i{d}": index[d] for d in range(len(node.shape))}
        index = tuple(ir.substitute(ix, mapping) for ix in node.index)
        name = node.source
        node = table[name]
    if len(index) != len(node.shape):
        raise Refused("the score chain's output is not the scores' shape")
    if isinstance(node, ir.InputNode):
        body = ir.Load.make(name, index, node.dtype)
    elif isinstance(node, ir.Pointwise):
        body = Scheduler(graph).value_at(name, index, None)
    else:
        raise Refused(f"the score chain ends in a {type(node).__name__.lower()} (not elementwise in the scores)")
    return graph, body


def _check_body(graph, body, score: str, operands: str | None, score_shape):
    identity = tuple(ir.loop_vars(score_shape))
    table = graph.by_name()
    for e in ir.walk(body):
        if isinstance(e, ir.Rand):
            raise Refused("random numbers in the score chain")
        if not isinstance(e, ir.Load):
            continue
        if e.buffer == score:
            if tuple(e.index) != identity or e.mask is not None:
                raise Refused("the chain reads the scores at other positions (not elementwise: a reduction, a "
                              "shift or a transpose of the scores)")
        elif e.buffer != operands:
            node = table[e.buffer]
            kind = type(node).__name__.lower() if not isinstance(node, ir.Extern) else f"call of {node.op}"
            raise Refused(f"the score chain computes a {kind} ({e.buffer}) that generated code cannot inline "
                          f"(a reduction over the scores or an op without a rule)")


def _inputs(graph):
    names = [n.name for n in graph.nodes if isinstance(n, ir.InputNode)]
    return names[0], (names[1] if len(names) > 1 else None)


def compile_chain(fwd, bwd, operands_vjp, score_shape, has_operands: bool, header: list[str]) -> tuple[str, str]:
    """The traced chain (``fwd``), its derivative in the score (``bwd``) and its operands' vector-Jacobian
    product (or None): lowered, inlined into one expression each, written as ``score_mod`` / ``score_mod_grad``
    and registered with the family. Returns (key, source); raises :class:`Refused` with the reason."""
    functions, helpers, asserts = [], set(), 0
    for name, gm in (("score_mod", fwd), ("score_mod_grad", bwd)):
        graph, body = _expression(gm, score_shape)
        score, operands = _inputs(graph)
        _check_body(graph, body, score, operands, score_shape)
        writer = ScoreModWriter(graph, body, score_shape, score, operands if has_operands else None)
        functions.append(writer.write_function(name))
        helpers |= writer.helpers
        asserts += writer.asserts
    source = module_source(functions, helpers, header)
    # a bounds assert (a table lookup whose index range the writer could not prove) lives only where the kernels
    # are compiled with Triton's debug option, as the compiler's own kernels with asserts are
    mod = ops_score_mod.register(source, fwd, operands_vjp, ASSERT_OPTIONS if asserts else ())
    config.log(2, f"generated score_mod {mod.key}:\n{source}")
    return mod.key, source


__all__ = ["ScoreModWriter", "TL_DTYPE", "compile_chain", "module_source"]
