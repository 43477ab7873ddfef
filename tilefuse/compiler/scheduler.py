"""Scheduling: the loop IR -> fusion groups, one Triton kernel each, and extern calls, in execution order.

1. **Roots.** A node that must exist in memory (a graph output, an extern's argument, an input mutation) or
   that is a reduction is a *root*. Every other pointwise node is inlined into its consumers: its body is
   substituted at the index the consumer reads it (views compose, masks propagate), so a pointwise chain
   costs one pass over memory.
2. **Groups.** Roots are placed in topological order. A root joins an existing group when that is *legal*
   (:func:`fusion_legality`: the iteration spaces line up, every value it reads from the group is at the
   position the group computes it (else a pointwise value is recomputed, a reduction's cannot be), and no
   step it depends on runs after the group) and *profitable* (:func:`fusion_benefit`: bytes of memory
   traffic it saves, net of what recomputation re-reads). Shapes of groups: a pointwise space, or a
   reduction space (rows x reduced dims) that also carries the reduction's pointwise prologue, full-row
   epilogues (softmax's output) and row epilogues (layer norm's rstd): several outputs from one kernel.
   Two joins cross spaces (:func:`_column_join`, ``TUNING``): a split column reduction's first stage over
   (S, C, cols) joins the row reduction group over the same S*C rows (it becomes a *column root*, computed
   by codegen's row-loop form from the registers the row kernel already holds), and a pointwise root over
   (S*C, cols) joins a first stage's group at (C*s + c, cols) (gelu's input gradient with its bias
   gradient's partials). The rows may be one dim or several (a model's (batch, sequence, hidden)
   activations): the linear row C*s + c is unravelled over them. The first needs the S chunks to cover the
   rows with none past the end (the last may be short), the second S*C to be exactly the rows; the row loop
   also needs ``rowloop_min_programs`` chunks (profitability). A reduction that saves no bytes in any group
   may still join an independent reduction group of the same space and reduced dims when the joined kernel
   moves at most ``join_small_bytes`` (:meth:`Scheduler._small_twin`): a norm backward's weight and bias
   gradients' second stages, one launch instead of two. A pointwise root that saves no bytes likewise joins an
   independent pointwise group of the same space of at most ``join_small_pointwise_elems`` elements
   (:meth:`Scheduler._small_pointwise`): a decode step's per-layer cache positions, and its counter increments.
   A write into an input (``ir.Pointwise.into``) is placed after the input's last reader (a load of an input is
   of its old value; a functional graph writes its inputs back in the inputs' order, not after their readers):
   it never joins a group before a step that reads the input, and in a group it joins, every load of the input
   is at the element it writes, in a root before it. The finished schedule is checked for that contract.
3. **Materialize what is shared.** A non-root pointwise node inlined into several groups is recomputed in
   each; when that re-reads more bytes than writing it once and reading it back, it becomes a root and the
   grouping is redone.

4. **GEMM epilogues.** A matmul (:class:`ir.Gemm`) is a :class:`GemmStep` that runs the library's GEMM. After
   grouping, :func:`fuse_epilogues` moves a pointwise group that reads the GEMM's output element for element
   (bias, activation, residual, scale, cast: any body the pointwise codegen writes) into the GEMM's epilogue:
   codegen writes the group as a ``@triton.jit`` hook (:func:`codegen.generate_epilogue`) that the library's
   one GEMM template calls on its fp32 tile, and the output never goes to memory in between.
   :func:`epilogue_legality` says whether it may (the group's other operands and outputs must be strided
   views of the GEMM's (M, N) tile, at most ``gemm_epilogue.NUM_EXTRA_OPERANDS`` of them, nothing between
   the two steps reads the raw product); :func:`epilogue_benefit` whether it pays (bytes); on a GPU the
   library's tuner may still choose cuBLAS and a separate epilogue kernel for the shape
   (:func:`tilefuse.kernels.gemm.fusion_choice.epilogue_choice`). A tail whose only outputs are codes the
   library does not store (float8, int8: a quantised output) is stored by the hook, and the GEMM stores
   nothing itself (``GemmStep.discard``, docs/decisions/033-compiler-gemm-quantised-outputs.md). Operand
   producers are not fused as prologues (docs/decisions/034-compiler-gemm-prologue.md); explain says why a
   consumer or a producer stayed apart (``GemmStep.note``).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional

import torch

from . import ir
from .ir import primitives as P
from .tuning import TUNING

MAX_GROUP_ROOTS = 48  # beyond this a kernel's compile time and register pressure grow faster than it saves
MAX_INLINE_OPS = 400  # a recomputed body larger than this is materialized instead
REUSE_FACTOR = 1.0  # materialize a shared node when recomputing it re-reads more than (n+1) x its own bytes
# A row kernel that also computes a split column reduction's first stage (codegen's row-loop form) holds whole
# rows in registers: rows up to this long (codegen/kernel_writer.py PERSISTENT_MAX_R, the smallest persistent limit of any target).
ROWLOOP_MAX_R = 8192
COLUMN_KINDS = ("sum", "prod", "max", "min", "any", "all")



@dataclasses.dataclass(frozen=True)
class KernelGroup:
    """One generated kernel: ``roots`` computed over ``space`` (``reduced`` dims reduced), ``stores`` written.
    ``bodies``: each root's expression over the kernel variables ``k0, k1, ...`` (loads of in-group roots at
    their own position are :class:`Local`); ``positions``: the per-dimension index each root's value belongs
    to (its output element)."""
    name: str
    kind: str  # "pointwise" | "reduction"
    space: tuple[int, ...]
    reduced: tuple[int, ...]
    roots: tuple[str, ...]
    stores: tuple[str, ...]
    bodies: tuple  # tuple[(name, Expr)]
    positions: tuple  # tuple[(name, tuple[Index])]
    origins: tuple[str, ...]
    # (name, rows a chunk) of column roots: a split column reduction's first stage computed by this row
    # reduction group, one partial row per chunk of its rows (codegen's row-loop form); bodies over the
    # group's variables
    columns: tuple = ()

    def body(self, name):
        return dict(self.bodies)[name]


@dataclasses.dataclass(frozen=True)
class ExternStep:
    name: str  # the Extern node


@dataclasses.dataclass(frozen=True)
class EpilogueOperand:
    """One extra operand of a fused GEMM epilogue: ``buffer`` (a node) seen as a tensor of the GEMM's output
    shape with ``stride`` and element ``offset`` from the buffer's storage offset. ``kind`` "load": the hook
    reads it; "store": the hook writes root ``buffer`` (or the GEMM's raw product) there."""
    kind: str
    buffer: str
    stride: tuple[int, ...]
    offset: int


@dataclasses.dataclass(frozen=True)
class GemmStep:
    """The library GEMM for :class:`ir.Gemm` ``name``. With ``epilogue`` (a pointwise group whose bodies run over
    the GEMM's output variables ``k0..``; a load of ``name`` at that position is the accumulator): the
    group's roots are computed in the GEMM's epilogue. ``out``: the buffer the GEMM stores its result into
    (``name`` itself, or the epilogue root the hook returns), seen with ``out_stride``/``out_offset``;
    ``operands``: the hook's extra operands in slot order."""
    name: str
    epilogue: Optional[KernelGroup] = None
    operands: tuple = ()  # tuple[EpilogueOperand, ...]
    out: str = ""
    out_stride: tuple = ()
    out_offset: int = 0
    note: str = ""  # why a pointwise consumer of the product was not fused (explain shows it)
    # the GEMM's own store is skipped: nothing reads the product and the epilogue's outputs are all stored by
    # the hook (a quantising tail whose codes are float8 or int8: the library stores only float outputs)
    discard: bool = False

    @property
    def out_buffer(self) -> str:
        return self.out or self.name


@dataclasses.dataclass(frozen=True)
class Schedule:
    graph: ir.Graph
    steps: tuple  # tuple[KernelGroup | ExternStep]
    materialized: frozenset  # names of nodes that live in memory (stored roots, inputs, extern outputs)


Local = ir.Local
OPAQUE_STEPS = (ExternStep, GemmStep)


def kernel_vars(space) -> tuple[ir.Index, ...]:
    return tuple(ir.var_index(f"k{d}", s) for d, s in enumerate(space))


def nbytes(meta) -> int:
    return math.prod(meta.shape) * meta.dtype.itemsize if meta.shape else meta.dtype.itemsize


# ------------------------------------------------------------------------------------------- alignment
def align(node, space, reduced) -> Optional[tuple[ir.Index, ...]]:
    """The position (per output dimension, over kernel vars) of ``node``'s elements in a group with this
    space, or None when its shape does not line up (then it cannot join)."""
    kv = kernel_vars(space)
    if isinstance(node, ir.Reduction):
        if tuple(node.space) != tuple(space) or tuple(node.reduced) != tuple(reduced):
            return None
        return tuple(ir.const_index(0) if d is None else kv[d] for d in node.out_dims)
    shape = tuple(node.shape)
    if shape == tuple(space):
        return kv
    if not reduced:
        return None
    if len(shape) == len(space) and all((shape[d] == 1) if d in reduced else (shape[d] == space[d])
                                        for d in range(len(space))):
        return tuple(ir.const_index(0) if d in reduced else kv[d] for d in range(len(space)))
    kept = [d for d in range(len(space)) if d not in reduced]
    if shape == tuple(space[d] for d in kept):
        return tuple(kv[d] for d in kept)
    rows = _split_row_dims(shape, space) if _split_space(space, reduced) and TUNING["split_siblings"] else None
    if rows is not None:
        # a split first stage's space (S, C, ...) runs over the rows S*C of the tensor it reduces: the element
        # at linear row C*s + c of a pointwise node over those rows (one dim or several) is computed once, at
        # (s, c, ...)
        mapping = _split_rows(space, rows)
        return tuple(mapping[f"k{d}"] for d in range(len(shape)))
    return None


def _split_space(space, reduced) -> bool:
    """The space of a split reduction's first stage: (chunks S, rows a chunk C, kept...), reducing C."""
    return tuple(reduced) == (1,) and len(space) >= 3


def _split_row_dims(shape, split_space) -> Optional[tuple]:
    """The row dims of ``shape`` when it is the tensor over whose rows a split first stage over ``split_space``
    = (S, C, kept...) runs: ``shape`` = (rows..., kept...) with S*C rows in all; else None."""
    kept = tuple(split_space[2:])
    n = len(shape) - len(kept)
    if n < 1 or tuple(shape[n:]) != kept or math.prod(shape[:n]) != split_space[0] * split_space[1]:
        return None
    return tuple(shape[:n])


def own_mapping(node, position) -> dict:
    """Map a node's own loop variables to kernel indices given its position."""
    if isinstance(node, ir.Reduction):
        kv = kernel_vars(node.space)
        return {f"i{d}": kv[d] for d in range(len(node.space))}
    return {f"i{d}": position[d] for d in range(len(node.shape))}


# -------------------------------------------------------------------------------------------- scheduler
class Scheduler:
    def __init__(self, graph: ir.Graph):
        self.graph = graph
        self.table = graph.by_name()
        self.order = {n.name: k for k, n in enumerate(graph.nodes)}
        self.inline_memo: dict[str, ir.Expr] = {}
        self.roots: set[str] = set()

    # ---------------------------------------------------------------------------------------- roots
    def base(self, name: str) -> str:
        node = self.table[name]
        while isinstance(node, ir.View):
            name = node.source
            node = self.table[name]
        return name

    def forced_roots(self) -> set[str]:
        roots = set()
        for n in self.graph.nodes:
            if isinstance(n, ir.Reduction):
                roots.add(n.name)
            elif isinstance(n, ir.Pointwise) and n.into:
                roots.add(n.name)
            elif isinstance(n, ir.Extern):
                for ref in _refs(n.args) + _refs(tuple(v for _, v in n.kwargs)):
                    roots.add(self.base(ref.name))
            elif isinstance(n, ir.Gemm):
                roots.update((self.base(n.a), self.base(n.b)))
        for out in self.graph.outputs:
            if out.name is not None:
                roots.add(self.base(out.name))
        return {r for r in roots if isinstance(self.table[r], (ir.Pointwise, ir.Reduction))}

    def _reads_target_elsewhere(self, node) -> bool:
        """A write into an input whose value (inlined) reads that input at another element than the one it writes:
        in one kernel, a program could read an element another program has already written."""
        pos = align(node, tuple(node.shape), ())
        return any(self.base(ld.buffer) == node.into and tuple(ld.index) != tuple(pos)
                   for ld in ir.loads(self.root_body(node.name, pos)))

    def _materialize_in_place_sources(self) -> None:
        """``x.copy_(f(x[other elements]))`` (a shift, a broadcast of one row): the pointwise values the write reads
        become roots, computed into a buffer of their own before the write, which then reads that buffer element
        for element. A write that reads the input itself elsewhere, with no value between to materialize, runs the
        graph in ATen (a clear fallback, not a race between programs)."""
        hazards = [n for n in self.graph.nodes if isinstance(n, ir.Pointwise) and n.into
                   and self._reads_target_elsewhere(n)]
        if not hazards:
            return
        for n in hazards:
            for ld in ir.loads(n.body):
                producer = self.table.get(ld.buffer)
                if isinstance(producer, ir.Pointwise) and not producer.into:
                    self.roots.add(ld.buffer)
        self.inline_memo = {}
        still = [n.name for n in hazards if self._reads_target_elsewhere(n)]
        if still:
            from .lowering import GraphFallback

            raise GraphFallback(f"the write into input {self.table[still[0]].into} ({still[0]}) reads that input at "
                                "other elements than it writes, with no value between to compute first")

    # -------------------------------------------------------------------------------------- inlining
    def inlined(self, name: str) -> ir.Expr:
        """``name``'s body with every non-root pointwise producer substituted (over its own variables)."""
        found = self.inline_memo.get(name)
        if found is not None:
            return found
        node = self.table[name]
        body = ir.replace_loads(node.body, self._inline_load)
        self.inline_memo[name] = body
        return body

    def _inline_load(self, load: ir.Load) -> ir.Expr:
        node = self.table.get(load.buffer)
        if not isinstance(node, ir.Pointwise) or load.buffer in self.roots or node.into:
            return load
        return self.value_at(load.buffer, load.index, load.mask)

    def value_at(self, name: str, index, mask) -> ir.Expr:
        """The value of pointwise node ``name`` at ``index`` (computed from its inlined body)."""
        node = self.table[name]
        body = self.inlined(name)
        mapping = {f"i{d}": index[d] for d in range(len(node.shape))}
        value = ir.substitute_expr(body, mapping)
        if mask is not None:
            value = ir.replace_loads(value, lambda ld: ir.Load.make(ld.buffer, ld.index, ld.dtype,
                                                                     _and(ld.mask, mask)))
        return _as_stored(value, node.dtype)

    def root_body(self, name: str, position) -> ir.Expr:
        """A root's inlined body over kernel variables."""
        node = self.table[name]
        return ir.substitute_expr(self.inlined(name), own_mapping(node, position))

    # ------------------------------------------------------------------------------------- grouping
    def schedule(self) -> Schedule:
        self.roots = self.forced_roots()
        self._materialize_in_place_sources()
        for _round in range(4):
            self.inline_memo = {}
            steps, where = self._group()
            promoted = self._shared_to_materialize(steps)
            if not promoted:
                break
            self.roots |= promoted
        return self._finish(steps, where)

    def _group(self):
        steps: list = []  # KernelGroup drafts (dicts) and ExternStep
        where: dict[str, int] = {}  # root / extern output -> step index
        for node in self._writes_after_readers():
            if isinstance(node, ir.Extern):
                steps.append(ExternStep(node.name))
                for k in range(len(node.outputs)):
                    where[node.output_name(k)] = len(steps) - 1
                where[node.name] = len(steps) - 1
                continue
            if isinstance(node, ir.Gemm):
                steps.append(GemmStep(node.name))
                where[node.name] = len(steps) - 1
                continue
            if node.name not in self.roots:
                continue
            self._place(node, steps, where)
        return steps, where

    def _writes_after_readers(self) -> list:
        """The graph's nodes in order, each write into an input moved after the last node that reads the input's
        old value. A functional graph's loads of an input are of its old value, and ``copy_`` into it need not
        come after them (``x.mul_(2); y.add_(x.t())`` writes x first, then y reads the old x). ``self.order``
        follows, so a group's roots (and codegen's loads and stores) run readers first. A node between that
        reads the written value too cannot be ordered: the graph runs in ATen."""
        nodes = list(self.graph.nodes)
        writes = [n for n in nodes if isinstance(n, ir.Pointwise) and n.into]
        reads = {n.name: self._old_reads(n) for n in nodes} if writes else {}  # once a node, not once a write
        for w in writes:
            i = nodes.index(w)
            later = nodes[i + 1:]
            last = max((k for k, n in enumerate(later) if w.into in reads[n.name]), default=None)
            if last is None:
                continue
            between = later[:last + 1]
            both = next((n.name for n in between if w.name in reads[n.name]), None)
            if both is not None:
                from .lowering import GraphFallback

                raise GraphFallback(f"{both} reads both the old value of input {w.into} and its write {w.name}")
            nodes = nodes[:i] + between + [w] + later[last + 1:]
        self.order = {n.name: k for k, n in enumerate(nodes)}
        return nodes

    def _old_reads(self, node) -> set[str]:
        """The buffers (base nodes) a step made of ``node`` reads: an extern's or a GEMM's operands, a root's
        inlined loads (a node inlined elsewhere is read by its consumers' roots)."""
        if isinstance(node, ir.Extern):
            return _step_reads(self, ExternStep(node.name))
        if isinstance(node, ir.Gemm):
            return _step_reads(self, GemmStep(node.name))
        if node.name in self.roots and isinstance(node, (ir.Pointwise, ir.Reduction)):
            return {self.base(ld.buffer) for ld in ir.loads(self.inlined(node.name))}
        return set()

    def _deps(self, body: ir.Expr) -> set[str]:
        out = set()
        for ld in ir.loads(body):
            out.add(ld.buffer)
        return out

    def _place(self, node, steps, where):
        if isinstance(node, ir.Reduction):
            space, reduced = tuple(node.space), tuple(node.reduced)
        else:
            space, reduced = tuple(node.shape), ()
        deps = self._deps(self.root_body(node.name, align(node, space, reduced)))
        dep_steps = {where[d] for d in deps if d in where}
        # a write into an input may not move before a step that reads the input's old value
        target = node.into if isinstance(node, ir.Pointwise) else None
        best, best_gain, best_draft = None, 0, None
        small = None  # (idx, draft): the latest legal join of no gain that _small_twin allows
        for idx in range(len(steps) - 1, -1, -1):
            g = steps[idx]
            if any(s > idx for s in dep_steps):
                break  # an earlier group would have to run after a step this node needs
            if not isinstance(g, OPAQUE_STEPS) and (draft := self.try_join(g, node)) is not None:
                gain = fusion_benefit(self, g, draft, node)
                if gain > best_gain:
                    best, best_gain, best_draft = idx, gain, draft
                if best is None and small is None and (self._small_twin(g, node, draft)
                                                       or self._small_pointwise(g, node, draft)):
                    small = (idx, draft)
            if target is not None and target in self._reads(g):
                break  # g may take the write (fusion_legality checks the positions); a group before g may not
        if best is None and small is not None:
            best, best_draft = small
        if best is not None:
            steps[best] = best_draft
            where[node.name] = best
            return
        g = self.new_group(node)
        steps.append(g)
        where[node.name] = len(steps) - 1

    def _reads(self, step) -> set[str]:
        """The buffers (base nodes) a step of the grouping reads: a draft group's loads or an opaque step's operands."""
        if isinstance(step, OPAQUE_STEPS):
            return _step_reads(self, step)
        return {self.base(ld.buffer) for body in step["bodies"].values() for ld in ir.loads(body)}

    def _small_twin(self, g: dict, node, draft: dict) -> bool:
        """A reduction that saves no bytes anywhere may still share a kernel with an earlier, independent
        reduction group over the same space and reduced dims when the joined kernel is small (:data:`TUNING`
        ``join_small_bytes``): one launch instead of two, which for kernels of a few microseconds is most of
        their cost. ``draft`` is the join :func:`fusion_legality` allowed, as for any join."""
        return (TUNING["join_small_reductions"] and isinstance(node, ir.Reduction) and g["kind"] == "reduction"
                and g["space"] == tuple(node.space) and g["reduced"] == tuple(node.reduced) and not g.get("columns")
                and self._group_bytes(draft) <= TUNING["join_small_bytes"])

    def _small_pointwise(self, g: dict, node, draft: dict) -> bool:
        """A pointwise root that saves no bytes anywhere may share a kernel with an earlier, independent
        pointwise group over the same space of at most ``join_small_pointwise_elems`` elements (:data:`TUNING`):
        such a kernel costs its launch alone. Not where the joined group reads a GEMM's product: a root that does
        not read it element for element would keep the group out of the GEMM's epilogue (:func:`epilogue_legality`)."""
        if not (TUNING["join_small_pointwise"] and isinstance(node, ir.Pointwise) and g["kind"] == "pointwise"
                and g["space"] == tuple(node.shape) and math.prod(g["space"]) <= TUNING["join_small_pointwise_elems"]):
            return False
        return not any(isinstance(self.table[self.base(b)], ir.Gemm) for b in self._reads(draft))

    def _group_bytes(self, g: dict) -> int:
        """What a group reads (each buffer once) and writes (each root once): an upper bound of its traffic."""
        reads = {ld.buffer for r in g["roots"] for ld in ir.loads(g["bodies"][r])}
        return sum(nbytes(ir.node_meta(self.table[b], b)) for b in reads | set(g["roots"]))

    def new_group(self, node) -> dict:
        if isinstance(node, ir.Reduction):
            space, reduced, kind = tuple(node.space), tuple(node.reduced), "reduction"
        else:
            space, reduced, kind = tuple(node.shape), (), "pointwise"
        pos = align(node, space, reduced)
        body = self.root_body(node.name, pos)
        return {"kind": kind, "space": space, "reduced": reduced, "roots": [node.name],
                "bodies": {node.name: body}, "positions": {node.name: pos}}

    def try_join(self, g: dict, node) -> Optional[dict]:
        """The group with ``node`` added, or None if that is illegal (:func:`fusion_legality`)."""
        ok, draft = fusion_legality(self, g, node)
        return draft if ok else None

    # ------------------------------------------------------------------------- sharing (step 3)
    def _shared_to_materialize(self, steps) -> set[str]:
        """Non-root pointwise nodes recomputed in several groups where a buffer would be cheaper."""
        used_in: dict[str, set[int]] = {}
        for k, g in enumerate(steps):
            if isinstance(g, OPAQUE_STEPS):
                continue
            for root in g["roots"]:
                for name in self._inlined_nodes(root):
                    used_in.setdefault(name, set()).add(k)
        promote = set()
        for name, groups in used_in.items():
            if len(groups) < 2:
                continue
            node = self.table[name]
            own = nbytes(ir.node_meta(node))
            leaves = self._leaf_bytes(name)
            recompute = (len(groups) - 1) * leaves
            materialize = own * (len(groups) + 1)
            size = len(ir.walk(self.inlined(name)))
            if recompute > REUSE_FACTOR * materialize or size > MAX_INLINE_OPS:
                promote.add(name)
        # keep the outermost: promoting a node makes the nodes it reads irrelevant to recompute
        return promote

    def _inlined_nodes(self, root: str) -> set[str]:
        out, stack = set(), [root]
        while stack:
            n = stack.pop()
            node = self.table[n]
            for ld in ir.loads(node.body):
                b = ld.buffer
                child = self.table.get(b)
                if isinstance(child, ir.Pointwise) and b not in self.roots and not child.into and b not in out:
                    out.add(b)
                    stack.append(b)
        return out

    def _leaf_bytes(self, name: str) -> int:
        total = 0
        seen = set()
        for ld in ir.loads(self.inlined(name)):
            if ld.buffer in seen:
                continue
            seen.add(ld.buffer)
            total += nbytes(ir.node_meta(self.table[ld.buffer], ld.buffer))
        return total

    # ---------------------------------------------------------------------------------- finishing
    def _finish(self, steps, where) -> Schedule:
        out_steps = []
        needed: set[str] = set()
        for out in self.graph.outputs:
            if out.name is not None:
                needed.add(self.base(out.name))
        for n in self.graph.nodes:
            if isinstance(n, ir.Extern):
                for ref in _refs(n.args) + _refs(tuple(v for _, v in n.kwargs)):
                    needed.add(self.base(ref.name))
            if isinstance(n, ir.Pointwise) and n.into:
                needed.add(n.name)
            if isinstance(n, ir.Gemm):
                needed.update((self.base(n.a), self.base(n.b)))
        for g in steps:
            if isinstance(g, OPAQUE_STEPS):
                continue
            for body in g["bodies"].values():
                for ld in ir.loads(body):
                    needed.add(ld.buffer)
        materialized = set()
        for n in self.graph.nodes:
            if isinstance(n, ir.InputNode):
                materialized.add(n.name)
            elif isinstance(n, ir.Extern):
                materialized.update(n.output_name(k) for k in range(len(n.outputs)))
            elif isinstance(n, ir.Gemm):
                materialized.add(n.name)
        steps = [g if isinstance(g, OPAQUE_STEPS) else stages_as_row_loop(self, g) for g in steps]
        for k, g in enumerate(steps):
            if isinstance(g, OPAQUE_STEPS):
                out_steps.append(g)
                continue
            stores = tuple(r for r in g["roots"] if r in needed)
            materialized.update(stores)
            origins = []
            for r in g["roots"]:
                for name in [r] + sorted(self._inlined_nodes(r), key=self.order.get):
                    for o in self.table[name].origins:
                        if o not in origins:
                            origins.append(o)
            roots = tuple(sorted(g["roots"], key=self.order.get))
            cols = g.get("columns", {})
            out_steps.append(KernelGroup(
                f"g{k}", g["kind"], g["space"], g["reduced"], roots, stores,
                tuple((r, g["bodies"][r]) for r in roots), tuple((r, g["positions"][r]) for r in roots),
                tuple(origins), tuple((r, cols[r]) for r in roots if r in cols)))
        out_steps = fuse_epilogues(self, out_steps)
        _check_input_writes(self, out_steps)
        materialized = {m for m in materialized if not _unstored_gemm(self, out_steps, m)}
        return Schedule(self.graph, tuple(out_steps), frozenset(materialized))


def _check_input_writes(s: Scheduler, steps: list) -> None:
    """The schedule's contract with a write into an input, checked on the finished steps (a later pass that broke
    it would otherwise give a silent wrong result): in the writing kernel every load of the input is at the
    written element and in a root ordered before the write (codegen loads and stores in root order); no later
    step reads the input (a load of an input is of its old value)."""
    from .lowering import GraphFallback

    for k, st in enumerate(steps):
        if not isinstance(st, KernelGroup):
            continue
        for r in st.roots:
            target = getattr(s.table[r], "into", None)
            if not target:
                continue
            pos, at = tuple(dict(st.positions)[r]), st.roots.index(r)
            for j, (other, body) in enumerate(st.bodies):
                for ld in ir.loads(body):
                    if s.base(ld.buffer) == target and (tuple(ld.index) != pos or j > at):
                        how = "at other elements" if tuple(ld.index) != pos else "after the write"
                        raise GraphFallback(f"{other} would read input {target} {how} in the kernel that writes "
                                            f"it ({r})")
            late = next((later for later in steps[k + 1:] if target in {s.base(b) for b in _step_reads(s, later)}),
                        None)
            if late is not None:
                raise GraphFallback(f"a step after the write into input {target} ({r}) reads its old value "
                                    f"({getattr(late, 'name', late)})")


def _refs(value) -> tuple:
    out = []
    if isinstance(value, ir.Ref):
        out.append(value)
    elif isinstance(value, (tuple, list)):
        for v in value:
            out.extend(_refs(v))
    return tuple(out)


def _and(a, b):
    if a is None:
        return b
    if b is None or a is b:
        return a
    return P.build("and", a, b)


# ------------------------------------------------------------------------------ legality, profitability
def fusion_legality(s: Scheduler, g: dict, node) -> tuple[bool, Optional[dict]]:
    """Can ``node`` join group ``g``? Returns (legal, the joined group). Legal when: the spaces line up
    (a reduction turns a pointwise group of its full space into a reduction group); every load the node
    makes of a root in ``g`` is at that root's position (a pointwise root read elsewhere is recomputed, a
    reduction's value cannot be); mutations write only where the group reads the old value at the same
    position; and the group stays under MAX_GROUP_ROOTS."""
    if len(g["roots"]) >= MAX_GROUP_ROOTS:
        return False, None
    columns = dict(g.get("columns", {}))
    column = _column_join(s, g, node)
    if column is not None:
        g, chunk = column
        columns = dict(g["columns"])
        if isinstance(node, ir.Reduction) and tuple(node.space) != tuple(g["space"]):
            columns[node.name] = chunk
    elif isinstance(node, ir.Reduction) and g["kind"] == "pointwise" and _split_space(node.space, node.reduced) \
            and TUNING["split_siblings"] and (rows := _split_row_dims(g["space"], node.space)) is not None:
        g = _respace(g, tuple(node.space), tuple(node.reduced), "reduction", _split_rows(tuple(node.space), rows))
    space, reduced, kind = g["space"], g["reduced"], g["kind"]
    if isinstance(node, ir.Reduction) and node.name in columns:
        pass  # a column root: its space is the split's, its body is mapped onto the group's (below)
    elif isinstance(node, ir.Reduction):
        if kind == "pointwise":
            if tuple(node.space) != space:
                return False, None
            reduced, kind = tuple(node.reduced), "reduction"
        elif tuple(node.space) != space or tuple(node.reduced) != reduced:
            return False, None
    if node.name in columns:
        pos, body = _as_column(s, node, space)
    else:
        pos = align(node, space, reduced)
        if pos is None:
            return False, None
        body = s.root_body(node.name, pos)
    members = set(g["roots"])
    positions = g["positions"]

    def resolve(ld: ir.Load):
        if ld.buffer not in members:
            return ld
        if ld.buffer in columns:
            raise _Illegal()  # a column partial is complete only after the loop over the chunk
        root = s.table[ld.buffer]
        if tuple(ld.index) == tuple(positions[ld.buffer]):
            local = Local.make(ld.buffer, ld.dtype)
            if isinstance(root, ir.Pointwise) and root.dtype == torch.float16:
                # read as stored, as a recomputation at another position is (_as_stored): the root's register
                # value is unrounded, and x - x[0] of a stored x must be 0 where x[0] is recomputed (rounded)
                body = s.inlined(ld.buffer)
                if _as_stored(body, root.dtype) is not body:
                    return P.build("round_fp16", local)
            return local
        if isinstance(root, ir.Pointwise) and not root.into:
            value = _recompute(s, ld)
            return ir.replace_loads(value, resolve)
        raise _Illegal()

    try:
        new_body = ir.replace_loads(body, resolve)
    except _Illegal:
        return False, None
    # a row-level node cannot read a full-row value of the group (it has no reduced position)
    # (a reduction's body runs over the whole space, so it may: a norm of a sum that is also an output)
    if kind == "reduction" and not isinstance(node, ir.Reduction) and not _covers_reduced(pos, space, reduced):
        for loc in _locals(new_body):
            lpos = positions[loc.name]
            if _covers_reduced(lpos, space, reduced) and not isinstance(s.table[loc.name], ir.Reduction):
                return False, None
    if isinstance(node, ir.Pointwise) and node.into:
        target = node.into
        for other in g["roots"]:
            for ld in ir.loads(g["bodies"][other]):
                if ld.buffer == target and tuple(ld.index) != tuple(pos):
                    return False, None
        for ld in ir.loads(new_body):
            if ld.buffer == target and tuple(ld.index) != tuple(pos):
                return False, None
    # and the other way round: a node may not read, at other elements, an input the group already writes into
    # (``x.mul_(2); y.add_(x.t())``: one program would read an element another, or itself, has written)
    written = {s.table[r].into: positions[r] for r in g["roots"]
               if isinstance(s.table[r], ir.Pointwise) and s.table[r].into}
    if written:
        for ld in ir.loads(new_body):
            at = written.get(s.base(ld.buffer))
            if at is not None and tuple(ld.index) != tuple(at):
                return False, None
    # the group's existing roots stay legal when the space became a reduction space
    bodies = dict(g["bodies"])
    bodies[node.name] = new_body
    new_positions = dict(positions)
    new_positions[node.name] = pos
    out = {"kind": kind, "space": space, "reduced": reduced, "roots": g["roots"] + [node.name],
           "bodies": bodies, "positions": new_positions}
    if columns:
        out["columns"] = columns
    return True, out


def _split_rows(split_space, rows: tuple) -> dict:
    """Mapping from the variables of a space over (rows..., rest...), S*C rows in all, to a split space's
    (S, C, rest...): the linear row ``C*s + c`` unravelled over ``rows`` (over one dim: ``k0 = C*s + c``)."""
    chunk = split_space[1]
    kv = kernel_vars(split_space)
    parts = ir.unravel(ir.add(ir.scale(kv[0], chunk), kv[1]), rows)
    m = {f"k{d}": parts[d] for d in range(len(rows))}
    for d in range(2, len(split_space)):
        m[f"k{len(rows) + d - 2}"] = kv[d]
    return m


def _rows_split(row_space, chunk: int, split_rank: int) -> dict:
    """Mapping from a split space's variables (s, c, rest...) to a row space's (rows..., rest): the linear
    row ``l`` of the row variables is at chunk ``l // C``, offset ``l % C``."""
    kv = kernel_vars(row_space)
    nrows = len(row_space) - (split_rank - 2)
    linear = ir.linearize(kv[:nrows], row_space[:nrows])
    m = {"k0": ir.divmod_index(linear, chunk, None), "k1": ir.mod_index(linear, chunk)}
    for d in range(2, split_rank):
        m[f"k{d}"] = kv[nrows + d - 2]
    return m


def _respace(g: dict, space, reduced, kind, mapping) -> dict:
    """Group ``g`` with its bodies and positions re-expressed over ``space`` (old variable -> new index)."""
    # (substitution is simultaneous: the old and the new spaces' variables may share names)
    bodies = {r: ir.substitute_expr(b, mapping) for r, b in g["bodies"].items()}
    positions = {r: tuple(ir.substitute(ix, mapping) for ix in p) for r, p in g["positions"].items()}
    out = {"kind": kind, "space": tuple(space), "reduced": tuple(reduced), "roots": list(g["roots"]),
           "bodies": bodies, "positions": positions}
    if g.get("columns"):
        out["columns"] = dict(g["columns"])
    return out


def _is_column_stage(node, C: int) -> bool:
    """A reduction over (S, chunk, C) reducing the chunk, one output per (s, column): a split first stage."""
    return isinstance(node, ir.Reduction) and len(node.space) == 3 and tuple(node.reduced) == (1,) and \
        tuple(node.out_dims) == (0, 2) and node.space[2] == C and node.kind in COLUMN_KINDS


def _chunks_tile(S: int, chunk: int, R: int) -> bool:
    """S chunks of ``chunk`` rows cover R rows with none past the end (the last may be short): the row loop's
    programs, one a chunk over the rows below R, then write every chunk's partial."""
    return (S - 1) * chunk < R <= S * chunk


def _row_space(space, reduced) -> bool:
    """A space of rows (one or more dims) x columns reducing the columns, rows short enough for the row loop."""
    return len(space) >= 2 and tuple(reduced) == (len(space) - 1,) and space[-1] <= ROWLOOP_MAX_R


def _row_group(g: dict) -> bool:
    return g["kind"] == "reduction" and _row_space(g["space"], g["reduced"])


def _column_join(s: Scheduler, g: dict, node):
    """When ``node`` joins ``g`` as (or next to) a column root of a row-loop kernel: (the group over the
    row space, rows a chunk); else None. Either ``g`` is a row reduction group over (rows..., C), R rows in
    all, and ``node`` a split first stage over (S, chunk, C) whose S chunks cover the R rows, or ``g`` holds
    only such first stages (and pointwise roots over their rows) and ``node`` is a row reduction over
    (rows..., C): then ``g`` is re-expressed over (rows..., C)."""
    if not TUNING["columns_into_rows"]:
        return None
    if _row_group(g) and _is_column_stage(node, g["space"][-1]):
        R = math.prod(g["space"][:-1])
        chunk = node.space[1]
        if not _chunks_tile(node.space[0], chunk, R) or any(c != chunk for c in g.get("columns", {}).values()):
            return None
        if not g.get("columns"):
            g = dict(g)
            g["columns"] = {}
        return g, chunk
    if isinstance(node, ir.Reduction) and _row_space(node.space, node.reduced):
        return _stages_over_rows(s, g, tuple(node.space))
    if _joins_stages_as_rows(g, node):
        return _stages_over_rows(s, g, tuple(node.shape))
    return None


def _joins_stages_as_rows(g: dict, node) -> bool:
    """A pointwise node over (rows..., C) meets a group of split first stages whose chunks cover those rows with a
    short last one (TUNING stages_as_rows): the group goes over the rows as a row loop (:func:`_stages_over_rows`)
    and the node joins it. Where the chunks tile the rows exactly the node joins the stages' split space instead
    (``split_siblings``) and :func:`stages_as_row_loop` makes the same row loop of it; a short last chunk has no
    place in that space (the node's elements past the rows would be stored), so without this a GeLU chain's input
    gradient over 1037 rows was a kernel of its own beside its bias and scale gradients' first stages."""
    if isinstance(node, ir.Reduction) or not TUNING["stages_as_rows"] or len(g.get("space", ())) != 3:
        return False
    shape = tuple(node.shape)
    return _row_space(shape, (len(shape) - 1,)) and g["space"][0] >= TUNING["rowloop_min_programs"] and \
        _split_row_dims(shape, g["space"]) is None


def _stages_over_rows(s: Scheduler, g: dict, rows: tuple):
    """(``g`` re-expressed over the row space ``rows`` = (rows..., C), R rows in all, as a row-loop group, rows
    a chunk) when ``g`` holds only split first stages over (S, R/S, C) and pointwise roots over their rows;
    else None."""
    if not (g["kind"] == "reduction" and len(g["space"]) == 3 and tuple(g["reduced"]) == (1,)
            and not g.get("columns")):
        return None
    R, C = math.prod(rows[:-1]), rows[-1]
    S, chunk, C2 = g["space"]
    if C2 != C or not _chunks_tile(S, chunk, R):
        return None
    split = _split_rows(g["space"], tuple(rows[:-1]))
    row_pos = tuple(split[f"k{d}"] for d in range(len(rows)))
    for r in g["roots"]:
        rn = s.table[r]
        if isinstance(rn, ir.Reduction):
            if not _is_column_stage(rn, C):
                return None
        elif tuple(g["positions"][r]) != row_pos:
            return None
    mapping = _rows_split(tuple(rows), chunk, 3)
    new = _respace(g, tuple(rows), (len(rows) - 1,), "reduction", mapping)
    new["columns"] = {r: chunk for r in g["roots"] if isinstance(s.table[r], ir.Reduction)}
    for r in new["columns"]:  # a column root's position: its partial's element (never read in the group)
        new["positions"][r] = (mapping["k0"], kernel_vars(tuple(rows))[-1])
        new["bodies"][r] = _drop_proven_masks(new["bodies"][r], {})
    return new, chunk


def stages_as_row_loop(s: Scheduler, g: dict) -> dict:
    """A group of split first stages (column sums over chunks of rows) with pointwise roots over their rows
    and no row reduction (a GeLU chain's backward: dx, and the partial sums of its scale's and bias's
    gradients), as a row-loop group over (R, C) (TUNING stages_as_rows): whole rows a step in 16-byte
    vectors and column partials in registers, instead of the looped column form's 64 columns x 8 rows a
    step. ``g`` itself when it is not such a group or the rows are too long or too few chunks."""
    if not (TUNING["stages_as_rows"] and TUNING["columns_into_rows"]) or g.get("kind") != "reduction" or \
            len(g.get("space", ())) != 3:
        return g
    S, chunk, C = g["space"]
    if C > ROWLOOP_MAX_R or S < TUNING["rowloop_min_programs"] or \
            not any(isinstance(s.table[r], ir.Reduction) for r in g["roots"]) or \
            not any(not isinstance(s.table[r], ir.Reduction) for r in g["roots"]):
        return g
    # the rows as the pointwise roots index them (one dim, or a model's (batch, sequence))
    first = next(s.table[r] for r in g["roots"] if not isinstance(s.table[r], ir.Reduction))
    rows = _split_row_dims(tuple(first.shape), g["space"])
    joined = None if rows is None else _stages_over_rows(s, g, rows + (C,))
    return g if joined is None else joined[0]


def _as_column(s: Scheduler, node, row_space) -> tuple:
    """(position, body) of first stage ``node`` as a column root of a row group over ``row_space``."""
    mapping = _rows_split(row_space, node.space[1], len(node.space))
    body = _drop_proven_masks(ir.substitute_expr(s.root_body(node.name, None), mapping), {})
    return (mapping["k0"], kernel_vars(row_space)[-1]), body


def _proven(cond: ir.Expr) -> bool:
    """``cond`` is ``index < n`` and the index's bounds put it below n everywhere."""
    if not (isinstance(cond, ir.Op) and cond.name == "lt" and isinstance(cond.args[0], ir.IndexValue)
            and isinstance(cond.args[1], ir.Const)):
        return False
    _, hi = cond.args[0].index.bounds()
    return hi < cond.args[1].value


def _drop_proven_masks(e: ir.Expr, memo: dict) -> ir.Expr:
    """``e`` without the conditions its indices' bounds prove: a split's tail mask (linear row < rows, for the
    chunks past the last row) over a row space, where every row is below the rows. A masked load would be a
    second load of the row the row kernel already holds (1037 rows: 14 against 10 us for layer norm's backward
    row loop, where 1024 rows have no mask)."""
    found = memo.get(id(e))
    if found is not None:
        return found
    if isinstance(e, ir.Load) and e.mask is not None and _proven(e.mask):
        out = ir.Load.make(e.buffer, e.index, e.dtype, None)
    elif isinstance(e, ir.Op) and e.name == "where" and _proven(e.args[0]):
        out = _drop_proven_masks(e.args[1], memo)
    elif isinstance(e, ir.Op):
        args = tuple(_drop_proven_masks(a, memo) for a in e.args)
        out = e if all(a is b for a, b in zip(args, e.args)) else ir.Op.make(e.name, args, e.dtype)
    elif isinstance(e, ir.Cast):
        arg = _drop_proven_masks(e.arg, memo)
        out = e if arg is e.arg else ir.Cast.make(arg, e.dtype)
    else:
        out = e
    memo[id(e)] = out
    return out


class _Illegal(Exception):
    pass


def _recompute(s: Scheduler, ld: ir.Load) -> ir.Expr:
    """A pointwise root's value at a position other than its own: its body, recomputed there."""
    node = s.table[ld.buffer]
    body = ir.replace_loads(node.body, s._inline_load)
    value = ir.substitute_expr(body, {f"i{d}": ld.index[d] for d in range(len(node.shape))})
    if ld.mask is not None:
        value = ir.replace_loads(value, lambda x: ir.Load.make(x.buffer, x.index, x.dtype, _and(x.mask, ld.mask)))
    return _as_stored(value, node.dtype)


def _as_stored(value: ir.Expr, dtype: torch.dtype) -> ir.Expr:
    """An inlined producer's value as its consumer would have read it from memory. Half types compute in
    float32 registers; a float16 value is rounded to float16 (its range ends at 65504, where eager's
    intermediate is inf); a bfloat16 one stays in float32 (bfloat16 has float32's range, so only precision
    differs, and the two conversions would cost on a memory-bound kernel), except where a comparison or a
    rounding reads it: code generation rounds it there (codegen.DISCONTINUOUS)."""
    if value.dtype != dtype:
        return P.cast(value, dtype)
    if dtype == torch.float16 and not isinstance(value, (ir.Load, ir.Const, ir.Cast)) and \
            not (isinstance(value, ir.Op) and value.name == "round_fp16"):
        return P.build("round_fp16", value)
    return value


def _covers_reduced(pos, space, reduced) -> bool:
    names = set()
    for ix in pos:
        names |= ix.free_vars()
    return any(f"k{d}" in names for d in reduced)


def _locals(e: ir.Expr) -> list[Local]:
    return [x for x in ir.walk(e) if isinstance(x, Local)]


def fusion_benefit(s: Scheduler, g: dict, draft: dict, node) -> int:
    """Bytes of memory traffic saved by computing ``node`` in ``g`` rather than in its own kernel: reads the
    group already makes (shared inputs, values in registers), minus buffers the join makes it read that it
    would not read alone (recomputation)."""
    pos = align(node, g["space"], g["reduced"])
    if pos is None and not isinstance(node, ir.Reduction):  # (it joins the group re-expressed over its rows)
        pos = kernel_vars(tuple(node.shape))
    alone = {ld.buffer for ld in ir.loads(s.root_body(node.name, pos))}
    joined_body = draft["bodies"][node.name]
    joined = {ld.buffer for ld in ir.loads(joined_body)}
    group_reads = set()
    for r in g["roots"]:
        group_reads |= {ld.buffer for ld in ir.loads(g["bodies"][r])}
    cols = draft.get("columns")
    if cols and -(-math.prod(draft["space"][:-1]) // next(iter(cols.values()))) < TUNING["rowloop_min_programs"]:
        return 0  # a row-loop kernel with a program per chunk of rows: too few programs to fill the GPU
    saved = 0
    for b in alone:
        if b in g["roots"] or b in group_reads:
            saved += nbytes(ir.node_meta(s.table[b], b))
    extra = 0
    for b in joined - alone:
        if b not in group_reads:
            extra += nbytes(ir.node_meta(s.table[b], b))
    return saved - extra


def schedule(graph: ir.Graph) -> Schedule:
    return Scheduler(graph).schedule()


# ------------------------------------------------------------------------------------- GEMM epilogues
def _step_reads(s: Scheduler, st) -> set[str]:
    """The buffers a final step reads (base nodes)."""
    if isinstance(st, KernelGroup):
        return {ld.buffer for _, b in st.bodies for ld in ir.loads(b)}
    if isinstance(st, ExternStep):
        ext = s.table[st.name]
        return {s.base(r.name) for r in _refs(ext.args) + _refs(tuple(v for _, v in ext.kwargs))}
    gemm = s.table[st.name]
    out = {s.base(gemm.a), s.base(gemm.b)}
    out |= {op.buffer for op in st.operands if op.kind == "load"}
    return out


def _step_writes(s: Scheduler, st) -> set[str]:
    if isinstance(st, KernelGroup):
        return set(st.stores)
    if isinstance(st, ExternStep):
        ext = s.table[st.name]
        return {ext.output_name(k) for k in range(len(ext.outputs))}
    out = {st.out_buffer}
    out |= {op.buffer for op in st.operands if op.kind == "store"}
    return out


def _affine(index, stride, nvars: int) -> Optional[tuple[tuple[int, ...], int]]:
    """(coefficient of each GEMM output variable k0.., offset) of the element offset of ``index`` in a buffer
    with ``stride``, or None when it is not affine in those variables (a division, a gather)."""
    phys = ir.strided_offset(index, stride)
    coefs = [0] * nvars
    for atom, coef in phys.terms:
        if not isinstance(atom, ir.Var) or not atom.name.startswith("k"):
            return None
        coefs[int(atom.name[1:])] += coef
    return tuple(coefs), phys.offset


def _tile_element(index, kv: tuple, shape) -> bool:
    """Whether ``index`` into the GEMM's product is the tile's own element ``kv``. A dimension of size 1 has only
    index 0, which a view before the tail writes as the constant (GPT-2's decode step: a (1, 3072) product read
    as (1, 1, 3072) at (0, k1)), so its variable counts as 0 on both sides."""
    if tuple(index) == kv:
        return True
    zero = {f"k{d}": ir.const_index(0) for d, n in enumerate(shape) if n == 1}
    return bool(zero) and tuple(ir.substitute(ix, zero) for ix in index) == tuple(ir.substitute(ix, zero) for ix in kv)


def epilogue_legality(s: Scheduler, steps: list, gi: int, gemm_name: str) -> tuple[Optional[GemmStep], str]:
    """Can pointwise group ``steps[gi]`` run in the epilogue of the GEMM ``gemm_name``? Returns (the fused
    step, "") or (None, why not). Legal when: the group's space is the GEMM's output elements (in row-major
    order, so a view (B*S, N) -> (B, S, N) between them is fine); it reads the product only at the element
    the tile holds; every other operand and every output is a strided view of the (M, N) tile (the hook gets
    (pointer, row stride, column stride) triples), at most NUM_EXTRA_OPERANDS of them besides the GEMM's own
    output; no random numbers or index values (the hook sees no linear position); and nothing between the
    two steps reads the raw product (else the fused step runs at the GEMM's place, which needs the group's
    other inputs to exist by then)."""
    from ..kernels.gemm.checks import FLOAT_OUTPUTS
    from ..kernels.gemm.epilogue import NUM_EXTRA_OPERANDS

    g = steps[gi]
    gemm = s.table[gemm_name]
    if not isinstance(g, KernelGroup) or g.kind != "pointwise" or g.columns:
        return None, "not a pointwise group"
    if math.prod(g.space) != math.prod(gemm.shape):
        return None, "its space is not the GEMM's output"
    kv = kernel_vars(gemm.shape)
    if tuple(g.space) == tuple(gemm.shape):
        mapping = {}
    else:
        digits = ir.unravel(ir.linearize(kv, gemm.shape), g.space)
        mapping = {f"k{d}": digits[d] for d in range(len(g.space))}
    bodies = {r: ir.substitute_expr(b, mapping) for r, b in g.bodies}
    positions = {r: tuple(ir.substitute(ix, mapping) for ix in p) for r, p in g.positions}
    loads: list[EpilogueOperand] = []
    for r, body in bodies.items():
        node = s.table[r]
        if isinstance(node, ir.Pointwise) and node.into:
            return None, f"{r} writes into an input"
        for e in ir.walk(body):
            if isinstance(e, (ir.IndexValue, ir.Rand)):
                return None, f"{r} uses an element's index or random numbers"
            if not isinstance(e, ir.Load):
                continue
            if e.mask is not None:
                return None, f"{r} reads {e.buffer} under a mask"
            if e.buffer == gemm_name:
                if not _tile_element(e.index, kv, gemm.shape):
                    return None, f"{r} reads the product at another element"
                continue
            aff = _affine(e.index, ir.node_meta(s.table[e.buffer], e.buffer).stride, len(kv))
            if aff is None:
                return None, f"{r} reads {e.buffer} at a position that is not strided in the tile"
            op = EpilogueOperand("load", e.buffer, aff[0], aff[1])
            if op not in loads:
                loads.append(op)
    # who else reads the raw product, and where
    gemm_at = next(k for k, st in enumerate(steps) if isinstance(st, GemmStep) and st.name == gemm_name)
    outputs = {s.base(o.name) for o in s.graph.outputs if o.name is not None}
    between = any(gemm_name in _step_reads(s, steps[k]) for k in range(gemm_at + 1, gi))
    later = any(gemm_name in _step_reads(s, steps[k]) for k in range(gi + 1, len(steps)))
    keep_product = gemm_name in outputs or between or later
    operands_of_gemm = {s.base(gemm.a), s.base(gemm.b)}
    for k in range(gemm_at + 1, gi):
        st = steps[k]
        if isinstance(st, KernelGroup) and any(getattr(s.table[r], "into", None) in operands_of_gemm for r in st.roots):
            return None, "a step between them writes into the GEMM's operand"
    at = gi
    if between:
        produced = set()
        for k in range(gemm_at):
            produced |= _step_writes(s, steps[k])
        inputs = {n.name for n in s.graph.nodes if isinstance(n, ir.InputNode)}
        late = [op.buffer for op in loads if op.buffer not in produced | inputs]
        if late:
            return None, _late_operands_reason(s, steps, gemm_at, gi, gemm_name, late)
        at = gemm_at
    stores: list[tuple[str, tuple, int]] = []
    for r in g.stores:
        aff = _affine(positions[r], ir.node_meta(s.table[r], r).stride, len(kv))
        if aff is None:
            return None, f"{r} is stored at a position that is not strided in the tile"
        stores.append((r, aff[0], aff[1]))
    main = None
    if not keep_product:
        main = next((x for x in stores if s.table[x[0]].dtype in FLOAT_OUTPUTS), None)
    if main is None:
        main = (gemm_name, tuple(gemm.stride), 0)
        extra_stores = stores
    else:
        extra_stores = [x for x in stores if x is not main]
    operands = tuple(loads) + tuple(EpilogueOperand("store", r, st, off) for r, st, off in extra_stores)
    if len(operands) > NUM_EXTRA_OPERANDS:
        return None, f"{len(operands)} extra operands (the hook takes {NUM_EXTRA_OPERANDS})"
    group = dataclasses.replace(g, space=tuple(gemm.shape), bodies=tuple((r, bodies[r]) for r, _ in g.bodies),
                                positions=tuple((r, positions[r]) for r, _ in g.positions),
                                origins=tuple(gemm.origins) + tuple(o for o in g.origins if o not in gemm.origins))
    discard = main[0] == gemm_name and not keep_product and bool(extra_stores)
    step = GemmStep(gemm_name, group, operands, main[0], main[1], main[2], discard=discard)
    return step, ("" if at == gi else "at the GEMM")


def _late_operands_reason(s: Scheduler, steps: list, gemm_at: int, gi: int, gemm_name: str, late: list) -> str:
    """Why a consumer that needs values computed after the GEMM cannot be its epilogue. The usual case is a
    quantisation whose scale is a reduction over the product itself (``amax(|y|) / 448``): every tile must be
    reduced before any element is quantised, so the GEMM stores its product, the reduction runs, and the
    quantising pass reads the product once more (docs/decisions/033-compiler-gemm-quantised-outputs.md)."""
    reductions = [st for st in steps[gemm_at + 1:gi]
                  if isinstance(st, KernelGroup) and st.kind == "reduction" and gemm_name in _step_reads(s, st)]
    if reductions:
        names = ", ".join(sorted({r for st in reductions for r in st.roots}))
        return (f"it needs {', '.join(late)}, computed from the product by a reduction ({names}) that must see "
                f"every tile first: the GEMM stores the product, the reduction and this pass run after it")
    return f"a step between them reads the product and the group needs later values ({', '.join(late)})"


def epilogue_benefit(s: Scheduler, step: GemmStep) -> int:
    """Bytes of memory traffic the fused epilogue saves: the product's read by the group, and its write when
    nothing else needs it (the fused step stores the group's outputs instead)."""
    gemm = s.table[step.name]
    own = nbytes(ir.node_meta(gemm))
    return own + (own if step.out_buffer != step.name else 0)


def fuse_epilogues(s: Scheduler, steps: list) -> list:
    """Move each pointwise group that is a legal and profitable epilogue of a GEMM into that GEMM's step
    (the latest GEMM it reads first: SwiGLU's ``silu(x @ w1) * (x @ w3)`` runs in the second GEMM, reading
    the first one's stored product as an extra operand)."""
    steps = list(steps)
    notes: dict[str, str] = {}
    gi = 0
    while gi < len(steps):
        g = steps[gi]
        if isinstance(g, KernelGroup) and g.kind == "reduction":
            # a reduction over the product (an amax scale, a row norm) needs every tile of it: not an epilogue
            reads = {ld.buffer for _, b in g.bodies for ld in ir.loads(b)}
            for st in steps[:gi]:
                if isinstance(st, GemmStep) and st.epilogue is None and st.name in reads:
                    notes.setdefault(st.name, f"consumer {g.name} reduces over the product ({', '.join(g.roots)}): "
                                              f"it runs after the GEMM as its own kernel")
        if not isinstance(g, KernelGroup) or g.kind != "pointwise":
            gi += 1
            continue
        reads = {ld.buffer for _, b in g.bodies for ld in ir.loads(b)}
        candidates = [(k, st.name) for k, st in enumerate(steps[:gi])
                      if isinstance(st, GemmStep) and st.epilogue is None and st.name in reads]
        fused = False
        for k, name in sorted(candidates, reverse=True):
            step, where = epilogue_legality(s, steps, gi, name)
            if step is None:
                notes.setdefault(name, f"consumer {g.name} not fused: {where}")
                continue
            if epilogue_benefit(s, step) <= 0:
                continue
            if not fused_or_split(s, step):
                notes.setdefault(name, f"consumer {g.name} runs as its own kernel: the tuner chose cuBLAS + a "
                                       f"separate epilogue for this shape")
                continue
            if where:  # at the GEMM's place: a step between the two reads the product
                steps[k] = step
                del steps[gi]
            else:
                steps[gi] = step
                del steps[k]
            fused = True
            break
        if not fused:
            gi += 1
    out = []
    for st in steps:
        if isinstance(st, GemmStep):
            said = [notes[st.name]] if st.epilogue is None and st.name in notes else []
            said += _prologue_notes(s, steps, st)
            if said:
                st = dataclasses.replace(st, note="; ".join(said))
        out.append(st)
    return out


def _prologue_notes(s: Scheduler, steps: list, st: GemmStep) -> list[str]:
    """An operand of the GEMM made by a pointwise kernel (a cast, a scale) stays that kernel's output: the
    library template takes no prologue hook (docs/decisions/034-compiler-gemm-prologue.md); explain says so."""
    gemm = s.table[st.name]
    said = []
    for operand in dict.fromkeys((s.base(gemm.a), s.base(gemm.b))):
        maker = next((g for g in steps if isinstance(g, KernelGroup) and g.kind == "pointwise" and operand in g.stores),
                     None)
        if maker is not None:
            said.append(f"operand {operand} is made by {maker.name}, its own kernel: no prologue fusion (decision 034)")
    return said


def fused_or_split(s: Scheduler, step: GemmStep) -> bool:
    """True: the epilogue runs fused in the library's GEMM template; False: the GEMM runs alone (cuBLAS-class
    main loop) and the group as its own kernel. The choice is the library tuner's, per (shape class, dtype,
    layout, epilogue size) (:func:`tilefuse.kernels.gemm.fusion_choice.epilogue_choice`); on the interpreter it is
    always the fused template (deterministic, and the tests exercise it)."""
    from ..kernels.gemm import fusion_choice

    gemm = s.table[step.name]
    ma, mb = ir.node_meta(s.table[gemm.a], gemm.a), ir.node_meta(s.table[gemm.b], gemm.b)
    extra_bytes = sum(nbytes(ir.node_meta(s.table[op.buffer], op.buffer)) for op in step.operands)
    return fusion_choice.epilogue_choice(ma.shape, ma.stride, mb.shape, mb.stride, gemm.dtype, extra_bytes) == "fused"


def _unstored_gemm(s: Scheduler, steps, name: str) -> bool:
    """A GEMM product that its fused step does not store (only the epilogue's outputs exist)."""
    node = s.table.get(name)
    if not isinstance(node, ir.Gemm):
        return False
    for st in steps:
        if isinstance(st, GemmStep) and st.name == name:
            return st.out_buffer != name and not any(op.buffer == name for op in st.operands)
    return False


def format_schedule(sched: Schedule) -> str:
    lines = []
    for st in sched.steps:
        if isinstance(st, ExternStep):
            lines.append(f"{st.name}: extern")
            continue
        if isinstance(st, GemmStep):
            lines.append(f"{st.name}: gemm -> {st.out_buffer}" + (f"; epilogue roots {list(st.epilogue.roots)}, "
                         f"operands {[(op.kind, op.buffer) for op in st.operands]}" if st.epilogue else ""))
            if st.epilogue:
                for r, b in st.epilogue.bodies:
                    lines.append(f"    {r} = {ir.format_expr(b)}")
            continue
        red = f" reduce dims {list(st.reduced)}" if st.reduced else ""
        lines.append(f"{st.name}: {st.kind} over {list(st.space)}{red}; roots {list(st.roots)}; "
                     f"stores {list(st.stores)}")
        for r, b in st.bodies:
            lines.append(f"    {r} = {ir.format_expr(b)}")
    return "\n".join(lines)
