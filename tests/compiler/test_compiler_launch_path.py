"""The host's work a compiled graph does a call: the launches, the buffers they write, the ATen calls, nothing more.

A step that is host-bound pays every statement of the generated ``call`` each time, so:
- the wrapper's statements are checked by kind (unpack, allocate, launch, extern, free, return): a new kind of
  per-call work fails here until it is allowed on purpose;
- with Triton's launchers replaced by no-op stubs, a call costs at most :data:`OVERHEAD_FACTOR` times what its
  allocations and stub calls cost on this machine (a bound relative to the machine, not in microseconds);
- on a GPU (``gpu``), the real launch path costs at most :data:`GPU_US_PER_LAUNCH` µs of host time a kernel.
"""
from __future__ import annotations

import ast
import gc
import re
import time

import pytest
import torch
import torch.nn.functional as F
import triton

from tilefuse import device
from tilefuse.compiler import runtime

from tests import compiler_checks as cc
from tests.support import FakeKernel, record_instances

OVERHEAD_FACTOR = 3.0
GPU_US_PER_LAUNCH = 5.0  # the bar; Triton's generic launch path is ~9 us, a pre-bound launcher ~4.5

ALLOWED_CALLS = {"alloc", "extern_layout", "_errstate"}


@pytest.fixture(autouse=True)
def _on_the_kernels_device(request):
    """Every tensor these tests make is on the device the compiler runs its kernels on (a CPU tensor on a GPU
    machine is not compiled there). A ``gpu`` test makes its own: the device mode the context sets costs every
    torch call of the timed loops ~1.5 us."""
    if request.node.get_closest_marker("gpu"):
        yield
        return
    with torch.device(device.torch_device()):
        yield


# Emulations of the GPU's launch binding on Triton's interpreter (stub and fake C launchers put in place of the
# kept kernels'): on a GPU the wrapper calls the real launchers itself, which test_gpu_launch_path_host_time_a_kernel
# times.
interpreter_only = pytest.mark.skipif(not device.interpreting(), reason="an emulation on Triton's interpreter; on a "
                                      "GPU, test_gpu_launch_path_host_time_a_kernel tests the real launch path")


def _timed(fn, n: int) -> float:
    """Seconds a call of ``fn`` over ``n`` calls, with the garbage collector off (as timeit does): a long test
    process's heap makes its collections, not the code timed, a share of each call."""
    gc.collect()
    gc.disable()
    try:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - t0) / n
    finally:
        gc.enable()


def _graph(x, w):
    y = torch.softmax(x, -1) * w
    z = F.layer_norm(y + 1, y.shape[-1:])
    return (F.gelu(z) + y.sum(-1, keepdim=True)).tanh(), z.amax(0)


def _compiled_graphs(fn, *args, backward=False):
    cc.reset()
    with pytest.MonkeyPatch.context() as mp:
        made = record_instances(mp, runtime.CompiledGraph)
        out = cc.compiled(fn)(*args)
        if backward:
            sum(o.sum() for o in out).backward()
    return made


def _statements(source: str):
    fn = ast.parse(source).body[0]
    body = fn.body
    if len(body) == 1 and isinstance(body[0], ast.With):  # numpy's errstate (the interpreter)
        body = body[0].body
    elif len(body) == 2 and isinstance(body[1], ast.Try):  # the graph's device made current, then restored (CUDA)
        body = body[1].body
    return body


def _kind(stmt) -> str:
    if isinstance(stmt, ast.If):  # (the bound wrapper's checks: hooks, alignment) each branch a launch or fallback
        test = ast.unparse(stmt.test)
        branches = {_kind(s) for s in stmt.body + stmt.orelse}
        if (test == "_hooks()" or test.endswith(" & 15")) and branches <= {"launch", "fallback"}:
            return "check"
        return f"statement if {test[:60]}"
    if isinstance(stmt, ast.Return) and ast.unparse(stmt) == "return _generic(args)":
        return "fallback"
    if isinstance(stmt, ast.Return):
        return "return"
    if isinstance(stmt, ast.Delete):
        return "free"
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        call = stmt.value
        name = ast.unparse(call.func)
        if name == "args.clear":
            return "unpack"
        if name.startswith(("launch_", "_launch_")):
            return "launch"
        if name.startswith("_jit_"):
            return "fallback"
        return f"call {name}"
    if isinstance(stmt, ast.Assign):
        value = stmt.value
        if isinstance(value, ast.Name) and value.id == "args":
            return "unpack"
        if isinstance(value, ast.Name) and value.id.startswith("const_"):
            return "constant"
        if isinstance(value, ast.Subscript):
            return "extern output"
        if isinstance(value, ast.Call):
            name = ast.unparse(value.func)
            if isinstance(value.func, ast.Attribute) and value.func.attr == "data_ptr" and not value.args:
                return "address"
            if name == "_stream":
                return "stream"
            if name in ALLOWED_CALLS:
                return "allocate" if name == "alloc" else "extern"
            if name.startswith("op_"):
                return "extern"
            if name == "torch.randint":
                return "seeds"
            return f"call {name}"
    return f"statement {ast.unparse(stmt)[:60]}"


ALLOWED = {"unpack", "allocate", "launch", "extern", "extern output", "free", "return", "constant", "seeds"}
ALLOWED_BOUND = ALLOWED | {"check", "address", "stream"}  # the wrapper with its launches bound (launch_inline)


def test_the_wrapper_does_only_launches_allocations_externs_and_frees():
    x, w = torch.randn(16, 33, requires_grad=True), torch.randn(33, requires_grad=True)
    mm = lambda a, b: (a @ b).relu() * 2  # noqa: E731  (a library GEMM with its epilogue: a launch)
    conv = lambda a, b: torch.nn.functional.conv1d(a.tanh(), b).relu() * 2  # noqa: E731  (an extern between kernels)
    graphs = _compiled_graphs(_graph, x, w, backward=True) + \
        _compiled_graphs(mm, torch.randn(8, 5, requires_grad=True), torch.randn(5, 3), backward=True) + \
        _compiled_graphs(conv, torch.randn(2, 3, 9, requires_grad=True), torch.randn(4, 3, 3), backward=True)
    assert len(graphs) >= 4
    kinds = set()
    for g in graphs:
        for stmt in _statements(g.plan.source):
            kind = _kind(stmt)
            assert kind in ALLOWED, f"per-call work of a new kind in graph {g.graph_id} ({g.kind}): {kind}\n" \
                                    f"{g.plan.source}"
            kinds.add(kind)
    assert {"launch", "allocate", "extern", "return"} <= kinds


@interpreter_only
def test_wrapper_overhead_beyond_launches_is_bounded():
    x, w = torch.randn(64, 33), torch.randn(33)
    (g,) = _compiled_graphs(_graph, x, w)
    plan = g.plan
    glb = plan.call.__globals__
    launches = [k for k in glb if k.startswith("launch_")]
    stmts = _statements(plan.source)
    allocs = sum(_kind(s) == "allocate" for s in stmts)
    assert launches and allocs

    def stub(*args):
        return None

    saved = {k: glb[k] for k in launches}
    try:
        for k in launches:
            glb[k] = stub
        n = 3000
        for _ in range(50):
            plan.call([x, w])
        per_call = _timed(lambda: plan.call([x, w]), n)
    finally:
        glb.update(saved)
    # what the same allocations (through the wrapper's own allocation function) and stub calls cost alone
    alloc = glb["alloc"]
    shapes = [((64, 1), (1, 1))] * allocs

    def alone():
        for shape, stride in shapes:
            alloc(shape, stride, torch.float32)
        for _ in launches:
            stub(x, w, x, w, x, w, x, 64, 33, 33, 33.0)
    floor = _timed(alone, n)
    print(f"wrapper {per_call * 1e6:.1f} us a call, {len(launches)} launches, {allocs} allocations; "
          f"those alone {floor * 1e6:.1f} us")
    assert per_call <= OVERHEAD_FACTOR * floor + 5e-6, \
        f"the wrapper costs {per_call * 1e6:.1f} us a call where its allocations and launches cost {floor * 1e6:.1f}"


def test_the_wrappers_allocation_is_atens_own_for_the_device():
    from tilefuse.compiler.runtime import wrapper
    from tilefuse.kernels import launcher

    assert wrapper.strided_allocator is launcher.strided_allocator  # (what WrapperWriter binds as ``alloc``)
    cpu = launcher.strided_allocator(torch.device("cpu"))
    assert cpu is torch._C._dynamo.guards._empty_strided_cpu
    t = cpu((3, 4), (1, 3), torch.bfloat16)
    assert (t.shape, t.stride(), t.dtype, t.device.type) == ((3, 4), (1, 3), torch.bfloat16, "cpu")
    meta = launcher.strided_allocator(torch.device("meta"))((2, 5), (5, 1), torch.float16)  # no direct one
    assert (meta.shape, meta.stride(), meta.dtype, meta.device.type) == ((2, 5), (5, 1), torch.float16, "meta")


def test_a_cuda_wrapper_makes_its_device_current_and_restores_the_callers_even_on_an_error():
    """The CUDA wrapper's body between torch.cuda's device exchange and its restore (what _DeviceGuard calls),
    executed here with recorders for the two calls."""
    from tilefuse.compiler.runtime import wrapper

    src = "def call(args):\n    a, = args\n    if a < 0:\n        raise ValueError(a)\n    return (a * 2,)\n"
    wrapped = wrapper._wrap_body(src, *wrapper._on_device(1))
    events = []
    glb = {"_to_device": lambda i: events.append(("to", i)) or 0,
           "_back_to_device": lambda prev: events.append(("back", prev))}
    exec(compile(wrapped, "<wrapper>", "exec"), glb)
    assert glb["call"]([3]) == (6,)
    assert events == [("to", 1), ("back", 0)]
    with pytest.raises(ValueError):
        glb["call"]([-1])
    assert events[2:] == [("to", 1), ("back", 0)]
    assert [type(st).__name__ for st in _statements(wrapped)] == ["Assign", "If", "Return"]


def _bind_fake_kernels(g, inputs, monkeypatch):
    """What a GPU's first call does to each launch site of ``g``: keep its kernel and bind its launch; here the
    kernels are fakes whose launches are logged. Returns the sites, each one's first arguments, and the log."""
    from tilefuse.kernels.launcher import SiteLauncher

    monkeypatch.setattr(triton, "__version__", "3.6.0")
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda index: 70 + index, raising=False)
    glb = g.plan.generic.__globals__
    sites = {k: v for k, v in glb.items() if k.startswith("launch_") and isinstance(v, SiteLauncher)}
    seen = {}
    for k, site in sites.items():
        glb[k] = lambda *a, k=k, site=site: (seen.setdefault(k, a), site(*a))
    try:
        g.plan.generic(list(inputs))
    finally:
        glb.update(sites)
    log: list = []
    for k, site in sites.items():
        site._keep(FakeKernel(log, k, 1000 + len(k)), seen[k], 0)
    return sites, seen, log


def _launched(log, inputs, sites) -> list:
    """The log with each address named: an input by its position, any other tensor "buffer" (not numbered by
    address: the CPU allocator may hand a freed buffer's address to a later one in one call and not in another)."""
    names = {t.data_ptr(): f"input {i}" for i, t in enumerate(inputs)}
    out = []
    for k, args in log:
        tensor_at = {13 + i for i in sites[k].aligned}
        out.append((k, args[:13], tuple(names.get(a, "buffer") if j in tensor_at else a
                                        for j, a in enumerate(args) if j >= 13)))
    return out


def _conv_graph(a, b):
    return torch.nn.functional.conv1d(a.tanh(), b).relu() * 2  # an ATen extern between two kernels


@interpreter_only
@pytest.mark.parametrize("fn,shapes", [(_graph, [(64, 33), (33,)]), (_conv_graph, [(2, 3, 9), (4, 3, 3)])],
                         ids=["kernels", "extern-between-kernels"])
def test_bound_launches_written_into_the_wrapper_launch_what_the_bound_functions_launch(fn, shapes, monkeypatch):
    """After a call in which its sites kept their kernels, a plan's wrapper calls their C launchers itself
    (launch_inline). Here, with fake kernels that log their launches: the same launches in the same order with the
    same arguments (inputs at the same addresses, one buffer where the bound functions passed one), statements
    only of the allowed kinds, no launch left going through a function. An unaligned input, or a profiler's hook,
    sends the whole call to the first wrapper, whose sites take the JIT where they must."""
    inputs = [torch.randn(s) for s in shapes]
    (g,) = _compiled_graphs(fn, *inputs)
    plan = g.plan
    sites, seen, log = _bind_fake_kernels(g, inputs, monkeypatch)
    assert sites and sorted(plan.bound) == sorted(sites)
    g.run(list(inputs))  # the first wrapper, its statements calling the bound functions; then the plan rebinds
    assert not plan.bound and plan.call is not plan.generic and plan.inlined_source
    through_functions = _launched(log, inputs, sites)
    assert [entry[0] for entry in through_functions] == list(sites)
    log.clear()
    plan.call(list(inputs))
    assert _launched(log, inputs, sites) == through_functions
    src = plan.inlined_source
    kinds = [_kind(st) for st in _statements(src)]
    assert set(kinds) <= ALLOWED_BOUND, src
    assert len(re.findall(r"\b_launch_\w+\(", src)) == len(sites) and re.search(r"(?<!_)launch_", src) is None, src
    if fn is _conv_graph:  # the conv's output comes from ATen: its alignment is checked at the launch reading it
        assert "_jit_" in src, src

    odd = torch.randn(inputs[0].numel() + 1)[1:].view(inputs[0].shape)
    assert odd.data_ptr() & 15
    log.clear()
    plan.call([odd] + inputs[1:])
    reading_input = {k for k, a in seen.items() if any(t is inputs[0] for t in a)}
    assert reading_input and {k for k, _ in log} == set(sites) - reading_input

    from tilefuse.kernels import launcher

    def hook(metadata):
        pass

    chain = launcher.RUNTIME.launch_enter_hook
    chain.add(hook)
    try:
        log.clear()
        out = plan.call(list(inputs))  # every site on the JIT path: Triton's interpreter computes the graph
    finally:
        chain.remove(hook)
    assert log == []
    expected = fn(*inputs)
    torch.testing.assert_close(out[0] if isinstance(out, (tuple, list)) and not isinstance(expected, tuple) else out,
                               expected)


@pytest.mark.gpu
def test_gpu_launch_path_host_time_a_kernel():
    x, w = torch.randn(64, 33, device="cuda"), torch.randn(33, device="cuda")
    (g,) = _compiled_graphs(_graph, x, w)
    plan = g.plan
    stmts = _statements(plan.source)
    launches = sum(_kind(s) == "launch" for s in stmts)
    allocs = [s for s in stmts if _kind(s) == "allocate"]
    n = 2000
    for _ in range(50):
        g.run([x, w])  # (the first call keeps the kernels; after it the plan writes their launches in)
    assert plan.inlined_source is not None, plan.source
    torch.cuda.synchronize()
    per_call = _timed(lambda: plan.call([x, w]), n)
    torch.cuda.synchronize()
    generic_call = _timed(lambda: plan.generic([x, w]), n)
    torch.cuda.synchronize()
    alloc = plan.call.__globals__["alloc"]

    def allocations():
        for _ in allocs:
            alloc((64, 1), (1, 1), torch.float32)
    alloc_cost = _timed(allocations, n)
    us = (per_call - alloc_cost) * 1e6 / launches
    floor = _c_launcher_alone_us(plan, x, w, n)
    own = sum(getattr(getattr(plan.generic.__globals__[k], "site", None), "direct", None) is not None and
              plan.generic.__globals__[k].site.direct.own is not None
              for k in plan.generic.__globals__ if k.startswith("launch_"))
    print(f"host time {per_call * 1e6:.1f} us a call, {launches} launches: {us:.2f} us a launch; through the "
          f"bound functions {generic_call * 1e6:.1f} us a call; the C launcher alone, arguments prepared: "
          f"{floor:.2f} us ({own} of {launches} sites on our own launcher, kernels/fast_launch.py)")
    assert us <= GPU_US_PER_LAUNCH, (f"{us:.2f} us of host time a launch (bar {GPU_US_PER_LAUNCH}); the C "
                                     f"launcher alone costs {floor:.2f} us on this host")


def _c_launcher_alone_us(plan, x, w, n: int) -> float:
    """Host us a call of the kept kernels' C launchers alone with their arguments prepared (the floor of a
    launch through Triton's launcher on this host), averaged over the wrapper's sites; nan when no site kept
    its kernel."""
    glb = plan.generic.__globals__
    names = [k for k in glb if k.startswith("launch_")]
    seen = {}
    bound = {k: glb[k] for k in names}
    for k in names:
        def spy(*args, k=k):
            seen[k] = args
            bound[k](*args)
        glb[k] = spy
    try:
        plan.generic([x, w])  # (the wrapper as written: its launch statements call the sites' bound functions)
    finally:
        glb.update(bound)
    costs = []
    stream = torch.cuda.current_stream().cuda_stream
    for k in names:
        site = getattr(bound[k], "site", bound[k])
        d = getattr(site, "direct", None)
        if d is None or d.via_run:
            continue
        ptrs = [a.data_ptr() if isinstance(a, torch.Tensor) else a for a in seen[k]] + list(site.tail)
        if d.own is not None:  # the launcher the site uses: our own (kernels/fast_launch.py)
            fn, full = d.own_fn, (d.own, stream, *[ptrs[i] for i in d.runtime])
        else:
            fn, full = d.fn, (d.g0, d.g1, d.g2, stream, d.function, d.coop, d.pdl, None, None, d.packed, None, None,
                              None, *ptrs)
        for _ in range(50):
            fn(*full)
        t0 = time.perf_counter()
        for _ in range(n):
            fn(*full)
        costs.append((time.perf_counter() - t0) / n * 1e6)
    torch.cuda.synchronize()
    return sum(costs) / len(costs) if costs else float("nan")
