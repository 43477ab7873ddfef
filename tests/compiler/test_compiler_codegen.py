"""Code generation on its own: a fusion group built by hand -> Triton source that compiles and runs.

The groups here are written directly with :class:`scheduler.KernelGroup` (bodies over the kernel variables
``k0, k1, ...``), the way the scheduler hands them over; one check confirms the scheduler would have made the
same group from the same graph, so the hand-made groups are realistic. Each generated kernel is launched
exactly as :class:`codegen.KernelSource` says (argument list, grid, constexprs) on Triton's interpreter,
against a float64 reference on fresh random inputs of odd sizes, with strided (transposed) inputs and
outputs poisoned with NaN.
"""
from __future__ import annotations

import ast

import numpy as np
import pytest
import torch

from tilefuse.compiler import cache, codegen, ir, scheduler
from tilefuse.compiler.ir import primitives as P

from .test_compiler_ir import F32, contiguous, graph, load, pointwise, reduction

SIZES = [(7, 13), (1, 129), (129, 1), (33, 64)]


def launch(ks: codegen.KernelSource, buffers: dict[str, torch.Tensor]) -> None:
    """Call the generated kernel with the arguments ``ks.args`` names, on ``ks.grid`` with ``ks.constexprs``."""
    fn, _ = cache.load(ks)
    args = []
    for a in ks.args:
        if a[0] == "buf":
            args.append(buffers[a[1]])
        elif a[0] in ("int", "float"):
            args.append(a[1])
        else:
            raise AssertionError(f"unexpected kernel argument {a}")
    with np.errstate(all="ignore"):  # masked-off lanes of the interpreter's numpy compute 0/0 and discard it
        fn[tuple(ks.grid)](*args, **dict(ks.constexprs))


def close(out, ref):
    assert not torch.isnan(out).any(), "an output element was never written (NaN poison left)"
    err = (out.double() - ref).norm() / ref.norm().clamp(min=1e-30)
    assert err < 1e-5, f"relative error {err:.2e}"


def pointwise_case(R, C):
    """x (a transposed view: strides (1, R)) -> out = sin(x) * 2 + x, as a group over (R, C)."""
    x = ir.InputNode("x", (R, C), (1, R), F32, 0)
    a = pointwise("a", (R, C), P.build("mul", P.build("sin", load("x", (R, C))), P.const(2.0, F32)), ("sin", "mul"))
    out = pointwise("out", (R, C), P.build("add", load("a", (R, C)), load("x", (R, C))), ("add",))
    g = graph(x, a, out, outputs=("out",))
    k = scheduler.kernel_vars((R, C))
    xk = ir.Load.make("x", k, F32)
    body = P.build("add", P.build("mul", P.build("sin", xk), P.const(2.0, F32)), xk)
    group = scheduler.KernelGroup(name="g0", kind="pointwise", space=(R, C), reduced=(), roots=("out",),
                                  stores=("out",), bodies=(("out", body),), positions=(("out", k),),
                                  origins=("sin", "mul", "add"))
    sched = scheduler.Schedule(g, (group,), frozenset({"x", "out"}))
    return g, group, sched


def softmax_case(R, C):
    """out = exp(x) / sum(exp(x), dim=1): a row reduction with its consumer in one group."""
    x = ir.InputNode("x", (R, C), contiguous((R, C)), F32, 0)
    s = reduction("s", "sum", (R, C), (1,), P.build("exp", load("x", (R, C))))
    i0, _ = ir.loop_vars((R, C))
    out = pointwise("out", (R, C), P.build("truediv", P.build("exp", load("x", (R, C))),
                                           load("s", (i0, ir.const_index(0)))), ("exp", "div"))
    g = graph(x, s, out, outputs=("out",))
    k = scheduler.kernel_vars((R, C))
    ex = P.build("exp", ir.Load.make("x", k, F32))
    group = scheduler.KernelGroup(
        name="g0", kind="reduction", space=(R, C), reduced=(1,), roots=("s", "out"), stores=("out",),
        bodies=(("s", ex), ("out", P.build("truediv", ex, ir.Local.make("s", F32)))),
        positions=(("s", (k[0], ir.const_index(0))), ("out", k)), origins=("sum", "exp", "div"))
    sched = scheduler.Schedule(g, (group,), frozenset({"x", "out"}))
    return g, group, sched


def test_hand_made_groups_are_the_groups_the_scheduler_makes():
    for case in (pointwise_case, softmax_case):
        g, group, _ = case(7, 13)
        (made,) = scheduler.schedule(g).steps
        assert (made.kind, made.space, made.reduced, set(made.roots), made.stores) == \
            (group.kind, group.space, group.reduced, set(group.roots), group.stores)
        for name, body in group.bodies:
            assert made.body(name) is body, name  # interned: identical structure is the identical object


def test_the_header_lists_the_aten_nodes_the_kernel_fuses():
    _, group, sched = pointwise_case(7, 13)
    ks = codegen.generate(group, sched)
    head = ks.source.split("import triton")[0].splitlines()
    assert head[0] == f"# tilefuse generated kernel: {ks.name}"
    start = head.index("# fuses 3 ATen nodes:")
    assert head[start + 1:start + 4] == ["#   sin", "#   mul", "#   add"]
    assert ks.name.startswith("tfk_pw") and "sin_mul_add" in ks.name  # a pointwise kind, named for what it fuses


def test_generated_source_is_a_standalone_module_with_one_jit_kernel():
    _, group, sched = softmax_case(7, 13)
    ks = codegen.generate(group, sched)
    tree = ast.parse(ks.source)
    kernels = [n for n in tree.body if isinstance(n, ast.FunctionDef)
               and any("jit" in ast.unparse(d) for d in n.decorator_list)]
    assert ks.name in [k.name for k in kernels]
    imported = {a.name for n in tree.body if isinstance(n, ast.Import) for a in n.names}
    assert {"triton", "triton.language"} <= imported
    assert ks.name.startswith("tfk_red_") and ks.stores == ("out",) and ks.group == "g0"


def test_the_same_group_gives_the_same_text():
    # stable names and byte-identical source: what the disk cache keys on and a layout refactor must keep
    _, group, sched = softmax_case(33, 64)
    first = codegen.generate(group, sched, codegen.LaunchTarget(32, False, 132))
    again = codegen.generate(softmax_case(33, 64)[1], softmax_case(33, 64)[2], codegen.LaunchTarget(32, False, 132))
    assert first.source == again.source and first.name == again.name


@pytest.mark.parametrize("R, C", SIZES)
def test_a_pointwise_group_runs_on_strided_inputs(R, C):
    _, group, sched = pointwise_case(R, C)
    ks = codegen.generate(group, sched)
    assert ks.form in ("pointwise", "tiled")  # tiled: a transposed read coalesced through a 2-D tile
    X = torch.randn(C, R).t()  # the graph's input strides (1, R)
    assert X.stride() == (1, R)
    out = torch.full((R, C), float("nan"))
    launch(ks, {"x": X, "out": out})
    close(out, torch.sin(X.double()) * 2 + X.double())


@pytest.mark.parametrize("R, C", SIZES)
def test_a_reduction_group_runs_and_keeps_the_row_sum_in_registers(R, C):
    _, group, sched = softmax_case(R, C)
    ks = codegen.generate(group, sched)
    assert [a[1] for a in ks.args if a[0] == "buf"] == ["x", "out"]  # s is never a buffer
    X = torch.randn(R, C)
    out = torch.full((R, C), float("nan"))
    launch(ks, {"x": X, "out": out})
    close(out, torch.softmax(X.double(), dim=1))


def test_block_sizes_follow_the_launch_target():
    _, group, sched = softmax_case(33, 4096)
    gpu = codegen.generate(group, sched, codegen.LaunchTarget(32, False, 132))
    amd = codegen.generate(group, sched, codegen.LaunchTarget(64, False, 304))
    assert gpu.num_warps >= 1 and amd.num_warps >= 1
    for ks in (gpu, amd):
        blocks = dict(ks.constexprs)
        assert blocks["RBLOCK"] >= 4096 or ks.form == "looped"  # a whole row, or a loop over it
        assert ks.grid[0] * blocks.get("XBLOCK", 1) >= 33  # every row has a program
