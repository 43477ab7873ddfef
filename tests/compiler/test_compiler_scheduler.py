"""The fusion scheduler on its own: hand-built loop-IR graphs -> fusion groups.

Each case checks the grouping the legality rules call for (which roots share a kernel, what is stored, what
stays in registers, where an extern cuts the order) and then runs the schedule -- generated kernels on
Triton's interpreter, externs in ATen -- against a float64 reference on fresh random inputs of odd sizes, so
a grouping that looks right but computes the wrong thing fails too.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tilefuse.compiler import cache, codegen, ir, runtime, scheduler
from tilefuse.compiler.ir import primitives as P

from .test_compiler_ir import F32, graph, load, pointwise, reduction, verify

SIZES = [(7, 13), (1, 129), (33, 1)]


def groups(sched):
    return [st for st in sched.steps if isinstance(st, scheduler.KernelGroup)]


def run_schedule(sched: scheduler.Schedule, *args: torch.Tensor) -> tuple:
    """Generate, load and launch every group in the schedule's order, with the runtime's wrapper."""
    kernels = [codegen.generate(g, sched) for g in groups(sched)]
    fns = [cache.load(k)[0] for k in kernels]
    source, glb = runtime.WrapperWriter(sched, kernels, fns, [], torch.device("cpu")).write()
    exec(compile(source, "<scheduler test wrapper>", "exec"), glb)
    with np.errstate(all="ignore"):  # masked-off lanes of the interpreter's numpy compute 0/0 and discard it
        return glb["call"](list(args))


def close(out, ref):
    assert out.shape == ref.shape
    err = (out.double() - ref).norm() / ref.norm().clamp(min=1e-30)
    assert err < 1e-5, f"relative error {err:.2e}"


# -------------------------------------------------------------------------------------- pointwise chains
@pytest.mark.parametrize("R, C", SIZES)
def test_a_pointwise_chain_is_one_kernel_with_the_chain_inlined(R, C):
    x = ir.InputNode("x", (R, C), (C, 1), F32, 0)
    a = pointwise("a", (R, C), P.build("sin", load("x", (R, C))))
    b = pointwise("b", (R, C), P.build("mul", load("a", (R, C)), P.const(3.0, F32)))
    c = pointwise("c", (R, C), P.build("add", load("b", (R, C)), load("x", (R, C))))
    g = graph(x, a, b, c, outputs=("c",))
    assert verify(g) == []
    sched = scheduler.schedule(g)
    (only,) = sched.steps
    assert only.kind == "pointwise" and only.roots == ("c",) and only.stores == ("c",)
    assert {ld.buffer for ld in ir.loads(only.body("c"))} == {"x"}  # a and b never touch memory
    assert set(only.origins) == {"a", "b", "c"}
    X = torch.randn(R, C)
    (out,) = run_schedule(sched, X)
    close(out, torch.sin(X.double()) * 3 + X.double())


def test_an_intermediate_that_is_an_output_is_stored_by_the_same_kernel():
    R, C = 7, 13
    x = ir.InputNode("x", (R, C), (C, 1), F32, 0)
    a = pointwise("a", (R, C), P.build("exp", load("x", (R, C))))
    c = pointwise("c", (R, C), P.build("mul", load("a", (R, C)), load("a", (R, C))))
    sched = scheduler.schedule(graph(x, a, c, outputs=("a", "c")))
    (only,) = sched.steps
    assert set(only.roots) == {"a", "c"} and set(only.stores) == {"a", "c"}
    # c reads a where the kernel computes it: from registers, not from the buffer it stores
    assert any(isinstance(e, ir.Local) and e.name == "a" for e in ir.walk(only.body("c")))
    X = torch.randn(R, C)
    out_a, out_c = run_schedule(sched, X)
    close(out_a, X.double().exp())
    close(out_c, X.double().exp() ** 2)


def test_different_iteration_spaces_are_different_kernels():
    x = ir.InputNode("x", (7, 13), (13, 1), F32, 0)
    y = ir.InputNode("y", (5,), (1,), F32, 1)
    a = pointwise("a", (7, 13), P.build("neg", load("x", (7, 13))))
    b = pointwise("b", (5,), P.build("abs", load("y", (5,))))
    sched = scheduler.schedule(graph(x, y, a, b, outputs=("a", "b")))
    assert sorted(tuple(g.space) for g in groups(sched)) == [(5,), (7, 13)]
    X, Y = torch.randn(7, 13), torch.randn(5)
    out_a, out_b = run_schedule(sched, X, Y)
    close(out_a, -X.double())
    close(out_b, Y.double().abs())


# ------------------------------------------------------------------------------------------- reductions
def _softmax_parts(R, C, shift_rows=False):
    x = ir.InputNode("x", (R, C), (C, 1), F32, 0)
    e = pointwise("e", (R, C), P.build("exp", load("x", (R, C))))
    s = reduction("s", "sum", (R, C), (1,), load("e", (R, C)))
    i0, _ = ir.loop_vars((R, C))
    row = ir.mod_index(ir.add_const(i0, 1), R) if shift_rows else i0
    out = pointwise("out", (R, C), P.build("truediv", load("e", (R, C)), load("s", (row, ir.const_index(0)))))
    return graph(x, e, s, out, outputs=("out",))


@pytest.mark.parametrize("R, C", SIZES)
def test_a_row_reduction_and_its_consumer_at_the_same_row_fuse(R, C):
    sched = scheduler.schedule(_softmax_parts(R, C))
    (only,) = sched.steps
    assert only.kind == "reduction" and only.reduced == (1,)
    assert set(only.roots) == {"s", "out"}
    assert only.stores == ("out",)  # the row sum never leaves registers
    X = torch.randn(R, C)
    (out,) = run_schedule(sched, X)
    close(out, torch.softmax(X.double(), dim=1))


def test_a_consumer_of_another_rows_reduction_does_not_fuse():
    # row i needs the sum of row i+1: a value the kernel computing row i does not have
    R, C = 7, 13
    sched = scheduler.schedule(_softmax_parts(R, C, shift_rows=True))
    red, pw = sched.steps
    assert red.kind == "reduction" and red.roots == ("s",) and red.stores == ("s",)
    assert pw.kind == "pointwise" and pw.roots == ("out",)
    X = torch.randn(R, C)
    (out,) = run_schedule(sched, X)
    e = X.double().exp()
    close(out, e / e.sum(1, keepdim=True).roll(-1, 0))


def test_a_column_reduction_and_its_consumer_fuse_over_columns():
    R, C = 9, 5
    x = ir.InputNode("x", (R, C), (C, 1), F32, 0)
    cs = reduction("cs", "max", (R, C), (0,), load("x", (R, C)))
    _, i1 = ir.loop_vars((R, C))
    out = pointwise("out", (R, C), P.build("sub", load("x", (R, C)), load("cs", (ir.const_index(0), i1))))
    sched = scheduler.schedule(graph(x, cs, out, outputs=("out", "cs")))
    (only,) = sched.steps
    assert only.reduced == (0,) and set(only.roots) == {"cs", "out"} and set(only.stores) == {"cs", "out"}
    X = torch.randn(R, C)
    out_t, cs_t = run_schedule(sched, X)
    ref_cs = X.double().amax(0, keepdim=True)
    close(cs_t, ref_cs)
    close(out_t, X.double() - ref_cs)


def test_two_reductions_over_the_same_rows_share_a_kernel():
    # layer norm's statistics: the mean, then the mean of squares around it
    R, C = 7, 129
    x = ir.InputNode("x", (R, C), (C, 1), F32, 0)
    mean = pointwise("mean", (R, 1), P.build("truediv", load("s1", (R, 1)), P.const(float(C), F32)))
    s1 = reduction("s1", "sum", (R, C), (1,), load("x", (R, C)))
    i0, _ = ir.loop_vars((R, C))
    centred = P.build("sub", load("x", (R, C)), load("mean", (i0, ir.const_index(0))))
    s2 = reduction("s2", "sum", (R, C), (1,), P.build("mul", centred, centred))
    g = graph(x, s1, mean, s2, outputs=("s2",))
    assert verify(g) == []
    sched = scheduler.schedule(g)
    (only,) = sched.steps
    assert {"s1", "s2"} <= set(only.roots) and only.stores == ("s2",)
    X = torch.randn(R, C)
    (out,) = run_schedule(sched, X)
    close(out, ((X.double() - X.double().mean(1, keepdim=True)) ** 2).sum(1, keepdim=True))


# ---------------------------------------------------------------------------------------------- externs
def test_an_extern_splits_the_groups_and_keeps_the_order():
    R, C, N = 7, 13, 5
    x = ir.InputNode("x", (R, C), (C, 1), F32, 0)
    w = ir.InputNode("w", (C, N), (N, 1), F32, 1)
    a = pointwise("a", (R, C), P.build("sin", load("x", (R, C))))
    mm = ir.Extern("mm", torch.ops.aten.mm.default, (ir.Ref("a"), ir.Ref("w")), (),
                   (ir.TensorMeta((R, N), (N, 1), F32),), False, ("mm",))
    b = pointwise("b", (R, N), P.build("mul", load("mm", (R, N)), P.const(2.0, F32)))
    g = graph(x, w, a, mm, b, outputs=("b",))
    assert verify(g) == []
    sched = scheduler.schedule(g)
    before, call, after = sched.steps
    assert isinstance(call, scheduler.ExternStep) and call.name == "mm"
    assert before.stores == ("a",)  # the extern's argument must be in memory
    assert after.roots == ("b",)
    assert "a" in sched.materialized and "mm" in sched.materialized
    # an extern (an ATen call) takes no epilogue: only the IR's Gemm steps do (test_compiler_gemm.py)
    assert not any(isinstance(st, scheduler.GemmStep) for st in sched.steps)
    X, W = torch.randn(R, C), torch.randn(C, N)
    (out,) = run_schedule(sched, X, W)
    close(out, (torch.sin(X.double()) @ W.double()) * 2)


def test_format_schedule_names_groups_roots_and_stores():
    text = scheduler.format_schedule(scheduler.schedule(_softmax_parts(7, 13)))
    first, *bodies = text.splitlines()
    assert first.endswith("reduction over [7, 13] reduce dims [1]; roots ['s', 'out']; stores ['out']")
    assert any(line.strip().startswith("out = truediv(exp(x[k0, k1]), $s)") for line in bodies)


# ---------------------------------------------------------------------------- small independent roots
def _decode_counters(x, cache0, cache1, c0, c1, w):
    """Two layers of a static-cache decode step as transformers' StaticCache writes it: each layer's position
    (one element) from its own counter (a 0-d tensor), its row written into its cache at that position, the
    counters incremented last."""
    h = x
    for cache, c in ((cache0, c0), (cache1, c1)):
        pos = c + torch.arange(1)
        cache.index_copy_(0, pos, h)
        h = torch.tanh(cache.sum(0, keepdim=True) @ w)
    c0.add_(1)
    c1.add_(1)
    return h


@pytest.mark.parametrize("join", [True, False])
def test_independent_one_element_roots_share_a_kernel(monkeypatch, join):
    """The layers' positions are independent one-element roots over one space (1,), and the counters'
    increments over another, (): nothing to save in bytes, a launch each to save. Joined, one kernel computes
    both positions and one both increments; with join_small_pointwise off, each has its own. Against float64:
    the output, the caches and the counters (an increment that ran before a position was read would move the
    row)."""
    from tilefuse.compiler.tuning import tuning

    from tests import compiler_checks as cc

    kernels = cc.collect_kernels(monkeypatch)
    C = 9
    args = [torch.randn(1, C), torch.randn(5, C), torch.randn(5, C), torch.tensor(2), torch.tensor(3),
            torch.randn(C, C)]
    eager_args = [a.clone() for a in args]
    ref_args = [a.double() if a.is_floating_point() else a.clone() for a in args]
    expected, ref = _decode_counters(*eager_args), _decode_counters(*ref_args)
    cc.reset()
    with cc.strict(), tuning(join_small_pointwise=join):
        out = cc.compiled(_decode_counters)(*args)
    cc.assert_matches("output", out, expected, ref)
    for name, a, e, r in zip(("x", "cache0", "cache1", "c0", "c1"), args, eager_args, ref_args):
        cc.assert_matches(f"{name} after the call", a, e, r)
    small = [k for k in kernels if "arange" in k.name or "copy" in k.name]
    assert len(small) == (2 if join else 4), [k.name for k in kernels]


def test_a_write_reading_its_input_elsewhere_with_nothing_to_materialize_is_a_graph_fallback():
    """x[i, j] = x[j, i] + 1 as one write node (no pointwise value between to compute into a buffer first) would
    race between programs: the schedule refuses with the reason, and the graph runs in ATen."""
    import dataclasses

    from tilefuse.compiler.lowering import GraphFallback

    x = ir.InputNode("x", (6, 6), (6, 1), F32, 0)
    i0, i1 = ir.loop_vars((6, 6))
    body = P.build("add", load("x", (i1, i0)), P.const(1.0, F32))
    w = dataclasses.replace(pointwise("w", (6, 6), body), into="x")
    with pytest.raises(GraphFallback, match="reads that input at other elements"):
        scheduler.schedule(graph(x, w, outputs=()))
    shifted = pointwise("s", (6, 6), body)  # the same value as a node of its own: materialized, then written
    w2 = dataclasses.replace(pointwise("w", (6, 6), load("s", (6, 6))), into="x")
    sched = scheduler.schedule(graph(x, shifted, w2, outputs=()))
    assert [g.roots for g in groups(sched)] == [("s",), ("w",)]


# ---------------------------------------------------------------------------- writes into inputs, in order
def _two_writes(n: int):
    """``x.mul_(2); y.add_(x.t())`` as a functional graph gives it: the write into x first, then y's write,
    which reads the old x (transposed) and doubles it."""
    import dataclasses

    x = ir.InputNode("x", (n, n), (n, 1), F32, 0)
    y = ir.InputNode("y", (n, n), (n, 1), F32, 1)
    i0, i1 = ir.loop_vars((n, n))
    two = P.const(2.0, F32)
    wx = dataclasses.replace(pointwise("wx", (n, n), P.build("mul", load("x", (i0, i1)), two)), into="x")
    wy = dataclasses.replace(pointwise("wy", (n, n), P.build("add", load("y", (i0, i1)),
                                                             P.build("mul", load("x", (i1, i0)), two))), into="y")
    return graph(x, y, wx, wy, outputs=())


def test_a_write_into_an_input_runs_after_the_steps_that_read_its_old_value():
    """The write into x comes first in the graph, but y's write reads the old x at other elements: scheduled in
    graph order, y read the doubled x (4x where 2x is right). The write into x now runs after its last reader,
    in a kernel of its own (in y's kernel it would race with y's reads)."""
    n = 7
    sched = scheduler.schedule(_two_writes(n))
    assert [g.roots for g in groups(sched)] == [("wy",), ("wx",)]
    X, Y = torch.randn(n, n), torch.randn(n, n)
    Xr, Yr = X.double(), Y.double()
    run_schedule(sched, X, Y)
    close(X, Xr * 2)
    close(Y, Yr + 2 * Xr.t())


def test_a_schedule_that_reads_an_input_after_writing_it_is_a_graph_fallback(monkeypatch):
    """The finished schedule's check: with the reordering undone, the step after the write into x reads x's old
    value, and the graph runs in ATen with that reason instead of computing a wrong y."""
    from tilefuse.compiler.lowering import GraphFallback

    monkeypatch.setattr(scheduler.Scheduler, "_writes_after_readers", lambda self: list(self.graph.nodes))
    with pytest.raises(GraphFallback, match="after the write into input x .* reads its old value"):
        scheduler.schedule(_two_writes(7))


def test_a_node_reading_an_input_elsewhere_may_not_join_the_group_that_writes_it():
    """fusion_legality both ways round: a reader of x at transposed elements may not join a group that already
    writes x (one program would read what another wrote), a reader at the written elements may."""
    n = 5
    g = _two_writes(n)
    s = scheduler.Scheduler(g)
    s.roots = s.forced_roots()
    wx = s.table["wx"]
    group = s.new_group(wx)
    i0, i1 = ir.loop_vars((n, n))
    for index, legal in (((i1, i0), False), ((i0, i1), True)):
        reader = pointwise("r", (n, n), P.build("neg", load("x", index)))
        s.table["r"] = reader
        s.roots.add("r")
        s.inline_memo = {}
        ok, _ = scheduler.fusion_legality(s, group, reader)
        assert ok is legal, index


def test_a_node_reading_both_an_inputs_old_value_and_its_write_is_a_graph_fallback():
    """A node that needs the old x and the write into x cannot be ordered around the write: ATen runs it."""
    import dataclasses

    from tilefuse.compiler.lowering import GraphFallback

    n = 5
    x = ir.InputNode("x", (n, n), (n, 1), F32, 0)
    i0, i1 = ir.loop_vars((n, n))
    wx = dataclasses.replace(pointwise("wx", (n, n), P.build("mul", load("x", (i0, i1)), P.const(2.0, F32))),
                             into="x")
    both = pointwise("both", (n, n), P.build("add", load("x", (i1, i0)), load("wx", (i0, i1))))
    with pytest.raises(GraphFallback, match="both reads both the old value of input x and its write wx"):
        scheduler.schedule(graph(x, wx, both, outputs=("both",)))


@pytest.mark.parametrize("form", ["interpreter", "small_blocks", "planned_for_a_gpu"])
def test_writes_into_inputs_that_read_each_other_match_float64(form):
    """Through torch.compile, against float64, planned as the interpreter, with small blocks (many programs: a
    race between them shows) and as for a GPU: writes into two inputs where one reads the other's old value at
    other elements, and where it reads the new value."""
    from tests import compiler_checks as cc

    from .compiler_fuzz_programs import planned

    def old_transposed(x, y):
        y.add_(x.t() + 1)
        x.mul_(2)
        return y.sum()

    def new_transposed(x, y):
        x.mul_(2)
        y.add_(x.t())
        return x.sum()

    plan = {"interpreter": (), "small_blocks": (("form", "small_blocks"),),
            "planned_for_a_gpu": (("form", "gpu"),)}[form]
    for fn in (old_transposed, new_transposed):
        for n in (5, 37):
            args = [torch.randn(n, n), torch.randn(n, n)]
            eager_args = [a.clone() for a in args]
            ref_args = [a.double() for a in args]
            expected, ref = fn(*eager_args), fn(*ref_args)
            cc.reset()
            with cc.strict(), planned(plan):
                out = cc.compiled(fn)(*args)
            cc.assert_matches(f"{fn.__name__} output", out, expected, ref)
            for name, a, e, r in zip(("x", "y"), args, eager_args, ref_args):
                cc.assert_matches(f"{fn.__name__}: {name} after the call", a, e, r)
