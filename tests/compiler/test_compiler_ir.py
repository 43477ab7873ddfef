"""The loop IR on its own: index arithmetic, interning, expressions, graph nodes and their printing.

Indices are checked by *evaluating* them: every simplification (``divmod_index``, ``mod_index``,
``make_index``'s digit merging, ``substitute``) must give, at every point of its variables' ranges, the value
of the plain integer formula it stands for. Graphs are built by hand with the node constructors, as a pass
would build them, and checked by :func:`verify` (the structural rules every pass must keep).
"""
from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tilefuse.compiler import ir
from tilefuse.compiler.ir import primitives as P

F32 = torch.float32


# ------------------------------------------------------------------------------------- helpers (shared)
def eval_index(ix: ir.Index, env: dict[str, int]) -> int:
    """The integer value of an index at the loop-variable values ``env`` (floor division, as for
    non-negative operands on every target)."""
    total = ix.offset
    for atom, coef in ix.terms:
        if isinstance(atom, ir.Var):
            value = env[atom.name]
        elif isinstance(atom, ir.DivMod):
            value = eval_index(atom.inner, env) // atom.div
            if atom.mod is not None:
                value %= atom.mod
        else:
            raise NotImplementedError("data-dependent atoms have no value without data")
        total += coef * value
    return total


def points(*variables: ir.Var):
    """Every assignment of the variables over their ranges."""
    for values in itertools.product(*(range(v.size) for v in variables)):
        yield dict(zip((v.name for v in variables), values))


def contiguous(shape):
    stride, out = 1, []
    for size in reversed(shape):
        out.append(stride)
        stride *= max(size, 1)
    return tuple(reversed(out))


def load(name, shape_or_index, dtype=F32, mask=None):
    index = shape_or_index if shape_or_index and isinstance(shape_or_index[0], ir.Index) else ir.loop_vars(shape_or_index)
    return ir.Load.make(name, tuple(index), dtype, mask)


def pointwise(name, shape, body, origins=None):
    return ir.Pointwise(name, tuple(shape), contiguous(shape), body.dtype, body, tuple(origins or (name,)))


def reduction(name, kind, space, reduced, body, keepdim=True, dtype=F32):
    kept = [d for d in range(len(space)) if d not in reduced]
    if keepdim:
        shape = tuple(1 if d in reduced else space[d] for d in range(len(space)))
        out_dims = tuple(None if d in reduced else d for d in range(len(space)))
    else:
        shape = tuple(space[d] for d in kept)
        out_dims = tuple(kept)
    return ir.Reduction(name, shape, contiguous(shape), dtype, kind, tuple(space), tuple(reduced), out_dims, body,
                        (kind,))


def graph(*nodes, outputs):
    num_args = sum(isinstance(n, ir.InputNode) for n in nodes)
    return ir.Graph(tuple(nodes), tuple(ir.Output(o) for o in outputs), num_args, torch.device("cpu"), 0)


def verify(g: ir.Graph) -> list[str]:
    """The rules every pass keeps: names are unique; a node reads only nodes before it; a load has one index
    per dimension of the buffer it reads, each within that dimension (by the index's bounds) or masked; a
    pointwise body is over its own shape's variables and a reduction's over its space; every output exists."""
    problems: list[str] = []
    seen: dict[str, object] = {}
    for node in g.nodes:
        if node.name in seen:
            problems.append(f"{node.name}: defined twice")
        if isinstance(node, (ir.Pointwise, ir.Reduction)):
            space = node.shape if isinstance(node, ir.Pointwise) else node.space
            allowed = {f"i{d}" for d in range(len(space))}
            sizes = {f"i{d}": s for d, s in enumerate(space)}
            for e in ir.walk(node.body):
                if isinstance(e, ir.Load):
                    src = seen.get(e.buffer)
                    if src is None:
                        problems.append(f"{node.name}: reads {e.buffer}, which is not defined before it")
                        continue
                    meta = ir.node_meta(src, e.buffer)
                    if len(e.index) != len(meta.shape):
                        problems.append(f"{node.name}: {len(e.index)} indices into {e.buffer} of rank "
                                        f"{len(meta.shape)}")
                        continue
                    for d, (ix, size) in enumerate(zip(e.index, meta.shape)):
                        lo, hi = ix.bounds()
                        if e.mask is None and (lo < 0 or hi >= size):
                            problems.append(f"{node.name}: index {ix!r} of {e.buffer} dim {d} spans "
                                            f"[{lo}, {hi}] outside [0, {size - 1}]")
                for ix in getattr(e, "index", ()) if isinstance(e, ir.Load) else ():
                    for atom in ix.atoms():
                        if isinstance(atom, ir.Var) and (atom.name not in allowed or atom.size != sizes[atom.name]):
                            problems.append(f"{node.name}: variable {atom.name} of size {atom.size} is not one "
                                            f"of its loop variables {sorted(allowed)}")
        seen[node.name] = node
        if isinstance(node, ir.Extern):
            for k in range(len(node.outputs)):
                seen[node.output_name(k)] = node
    for out in g.outputs:
        if out.name is not None and out.name not in seen:
            problems.append(f"output {out.name} is not a node")
    return problems


# ----------------------------------------------------------------------------------------- interning
def test_building_the_same_structure_twice_gives_the_same_object():
    a = ir.add(ir.scale(ir.var_index("i0", 7), 13), ir.var_index("i1", 13))
    b = ir.make_index([(ir.Var.make("i1", 13), 1), (ir.Var.make("i0", 7), 13)])
    assert a is b
    x = P.build("mul", load("x", (7, 13)), P.const(2.0, F32))
    y = P.build("mul", load("x", (7, 13)), P.const(2.0, F32))
    assert x is y and hash(x) == hash(y)


def test_interning_keeps_values_that_compare_equal_apart():
    # True == 1 and -0.0 == 0.0 in Python: merging them would change a kernel's meaning
    assert ir.Const.make(True, torch.bool) is not ir.Const.make(1, torch.bool)
    assert ir.Const.make(-0.0, F32) is not ir.Const.make(0.0, F32)
    assert ir.Const.make(float("nan"), F32) is ir.Const.make(float("nan"), F32)
    assert ir.Var.make("i0", 7) is not ir.Var.make("i0", 8)


def test_ir_values_are_immutable():
    v = ir.Var.make("i0", 7)
    with pytest.raises(dataclasses.FrozenInstanceError):
        v.size = 9
    node = pointwise("a", (3,), load("x", (3,)))
    with pytest.raises(dataclasses.FrozenInstanceError):
        node.name = "b"


# --------------------------------------------------------------------------------- index arithmetic
def test_make_index_adds_like_terms_drops_zeros_and_sorts():
    i0, i1 = ir.Var.make("i0", 5), ir.Var.make("i1", 6)
    ix = ir.make_index([(i1, 2), (i0, 3), (i1, -2), (i0, 4)], offset=7)
    assert ix.terms == ((i0, 7),) and ix.offset == 7
    assert repr(ix) == "7*i0 + 7"
    assert repr(ir.make_index([(i1, 1), (i0, 6)])) == "6*i0 + i1"  # sorted by atom, not by insertion
    assert repr(ir.const_index(0)) == "0" and ir.const_index(4).is_constant


def test_bounds_enclose_every_value():
    i0, i1 = ir.Var.make("i0", 5), ir.Var.make("i1", 6)
    ix = ir.make_index([(i0, 3), (i1, -2)], offset=4)
    values = [eval_index(ix, env) for env in points(i0, i1)]
    assert ix.bounds() == (min(values), max(values)) == (4 - 10, 4 + 12)


@pytest.mark.parametrize("shape", [(7,), (7, 13), (2, 3, 4), (1, 5, 1, 3), (129, 1)])
def test_unravel_then_linearize_is_the_identity_structurally(shape):
    n = math.prod(shape)
    j = ir.var_index("j", n)
    parts = ir.unravel(j, shape)
    for env in points(ir.Var.make("j", n)):
        digits = [eval_index(p, env) for p in parts]
        assert digits == [env["j"] // stride % size for stride, size in zip(contiguous(shape), shape)]
    # the simplifier folds C*((j // C) % N) + (j % C) back into j: a reshape round trip costs nothing
    assert ir.linearize(parts, shape) is j


def test_a_reshape_split_and_merge_simplifies():
    # (7, 16) viewed as (7, 2, 8) and back: i0*16 + i1*8 + i2 over (2, 8) is the row-major j of 16
    i0, i1, i2 = ir.loop_vars((7, 2, 8))
    merged = ir.linearize((i1, i2), (2, 8))
    back = ir.unravel(merged, (16,))
    assert back == (merged,)
    assert repr(ir.divmod_index(merged, 8, None)) == "i1"  # (8*i1 + i2) // 8 with i2 < 8
    assert repr(ir.mod_index(merged, 8)) == "i2"


@settings(max_examples=120, deadline=None)
@given(st.lists(st.integers(-3, 12), min_size=1, max_size=3), st.integers(0, 20),
       st.integers(1, 9), st.one_of(st.none(), st.integers(1, 9)), st.lists(st.integers(1, 6), min_size=3, max_size=3))
def test_divmod_index_equals_floor_div_then_mod_everywhere(coefs, offset, div, mod, sizes):
    variables = [ir.Var.make(f"i{d}", s) for d, s in zip(range(len(coefs)), sizes)]
    inner = ir.make_index([(v, c) for v, c in zip(variables, coefs)], offset)
    if inner.bounds()[0] < 0:
        offset -= inner.bounds()[0]  # the IR's contract: the inner index of a div/mod is non-negative
        inner = ir.make_index([(v, c) for v, c in zip(variables, coefs)], offset)
    simplified = ir.divmod_index(inner, div, mod)
    lo, hi = simplified.bounds()
    for env in points(*variables):
        want = eval_index(inner, env) // div
        if mod is not None:
            want %= mod
        got = eval_index(simplified, env)
        assert got == want, f"({inner!r}) // {div} % {mod} -> {simplified!r} at {env}: {got} != {want}"
        assert lo <= got <= hi


@settings(max_examples=120, deadline=None)
@given(st.lists(st.integers(0, 12), min_size=1, max_size=3), st.integers(0, 20), st.integers(1, 40),
       st.lists(st.integers(1, 6), min_size=3, max_size=3))
def test_mod_index_equals_modulo_everywhere(coefs, offset, mod, sizes):
    variables = [ir.Var.make(f"i{d}", s) for d, s in zip(range(len(coefs)), sizes)]
    ix = ir.make_index([(v, c) for v, c in zip(variables, coefs)], offset)
    simplified = ir.mod_index(ix, mod)
    for env in points(*variables):
        assert eval_index(simplified, env) == eval_index(ix, env) % mod, f"{ix!r} % {mod} -> {simplified!r}"


def test_substitute_composes_views():
    # a permute (i0, i1) -> (i1, i0) of a (3, 5) buffer, then a slice [1:] on the new first dim
    i0, i1 = ir.loop_vars((4, 3))
    mapping = {"i0": i1, "i1": ir.add_const(i0, 1)}
    source_index = ir.strided_offset(ir.loop_vars((3, 5)), (5, 1))  # 5*i0 + i1 over the source
    composed = ir.substitute(source_index, mapping)
    assert repr(composed) == "i0 + 5*i1 + 1"
    for env in points(ir.Var.make("i0", 4), ir.Var.make("i1", 3)):
        assert eval_index(composed, env) == 5 * env["i1"] + env["i0"] + 1
    assert ir.substitute(source_index, {}) is source_index


@pytest.mark.parametrize("div, mod", [(0, None), (-2, 3), (2, 0)])
def test_divmod_index_rejects_non_positive_divisors(div, mod):
    with pytest.raises(ValueError, match="must be positive"):
        ir.divmod_index(ir.var_index("i0", 8), div, mod)


def test_free_vars_look_through_divmod():
    ix = ir.add(ir.divmod_index(ir.add(ir.var_index("a", 9), ir.scale(ir.var_index("b", 3), 9)), 4, 3),
                ir.var_index("c", 2))
    assert ix.free_vars() == {"a", "b", "c"}


# ------------------------------------------------------------------------------------------ expressions
def test_expression_walk_loads_and_vars():
    x = load("x", (4, 6))
    y = load("y", (ir.var_index("i0", 4), ir.const_index(0)))
    e = P.build("add", P.build("mul", x, y), P.build("exp", x))
    assert [ld.buffer for ld in ir.loads(e)] == ["x", "y"]  # each object once (x is shared)
    assert ir.expr_vars(e) == {"i0", "i1"}
    assert sum(1 for n in ir.walk(e) if n is x) == 1


def test_format_expr_reads_like_the_math():
    x = load("x", (4, 6))
    e = P.build("truediv", P.build("sin", x), P.cast(load("s", (ir.var_index("i0", 4), ir.const_index(0)),
                                                            torch.float16), F32))
    assert ir.format_expr(e) == "truediv(sin(x[i0, i1]), to_float32(s[i0, 0]))"
    masked = load("x", (4, 6), mask=P.build("lt", ir.IndexValue.make(ir.var_index("i1", 6), torch.int64),
                                            P.const(3, torch.int64)))
    assert ir.format_expr(masked) == "x[i0, i1 if lt(index(i1), 3)]"


# ---------------------------------------------------------------------------------------- graph nodes
def softmax_like_graph(R=7, C=13):
    x = ir.InputNode("x", (R, C), (C, 1), F32, 0)
    e = pointwise("e", (R, C), P.build("exp", load("x", (R, C))), ("exp",))
    s = reduction("s", "sum", (R, C), (1,), load("e", (R, C)))
    i0, _ = ir.loop_vars((R, C))
    out = pointwise("out", (R, C), P.build("truediv", load("e", (R, C)), load("s", (i0, ir.const_index(0)))),
                    ("div",))
    return graph(x, e, s, out, outputs=("out",))


def test_format_graph_lists_every_node_and_the_outputs():
    text = ir.format_graph(softmax_like_graph())
    assert text.splitlines() == [
        "x = input#0 float32[7, 13] stride [13, 1]",
        "e = pointwise float32[7, 13]: exp(x[i0, i1])",
        "s = sum over dims [1] of [7, 13] -> float32[7, 1]: e[i0, i1]",
        "out = pointwise float32[7, 13]: truediv(e[i0, i1], s[i0, 0])",
        "return out",
    ]


def test_extern_outputs_have_names_and_metadata():
    meta = ir.TensorMeta((3, 4), (4, 1), F32)
    ext = ir.Extern("mm", torch.ops.aten.max.dim, (ir.Ref("x"), 1), (), (meta, None), True, ("max",),
                    reason="not lowered here")
    g = graph(ir.InputNode("x", (3, 4), (4, 1), F32, 0), ext, outputs=("mm.0",))
    assert g.by_name()["mm.0"] is ext and g.by_name()["mm.1"] is ext
    assert ir.node_meta(ext, "mm.0") == meta
    with pytest.raises(ValueError, match="output 1 is not a tensor"):
        ir.node_meta(ext, "mm.1")
    assert "fallback: not lowered here" in ir.format_node(ext)
    assert verify(g) == []


def test_view_metadata_carries_its_storage_offset():
    v = ir.View("v", (3,), (2,), 5, F32, "x", (ir.add_const(ir.scale(ir.var_index("i0", 3), 2), 5),), ("slice",))
    assert ir.node_meta(v) == ir.TensorMeta((3,), (2,), F32, 5)
    assert ir.format_node(v) == "v = view float32[3] of x[2*i0 + 5]"


def test_verifier_accepts_a_well_formed_graph_and_names_each_broken_rule():
    assert verify(softmax_like_graph()) == []
    R, C = 7, 13
    x = ir.InputNode("x", (R, C), (C, 1), F32, 0)
    i0, i1 = ir.loop_vars((R, C))
    reads_later = pointwise("a", (R, C), load("b", (R, C)))
    b = pointwise("b", (R, C), load("x", (R, C)))
    out_of_range = pointwise("c", (R, C), load("x", (i0, ir.add_const(i1, 1))))
    wrong_rank = pointwise("d", (R, C), load("x", (i0,)))
    masked_is_fine = pointwise("e", (R, C), load("x", (i0, ir.add_const(i1, 1)),
                                                 mask=P.build("lt", ir.IndexValue.make(i1, torch.int64),
                                                              P.const(C - 1, torch.int64))))
    problems = verify(graph(x, reads_later, b, out_of_range, wrong_rank, masked_is_fine, b,
                            outputs=("e", "nope")))
    assert problems == [
        "a: reads b, which is not defined before it",
        "c: index i1 + 1 of x dim 1 spans [1, 13] outside [0, 12]",
        "d: 1 indices into x of rank 2",
        "b: defined twice",
        "output nope is not a node",
    ]
