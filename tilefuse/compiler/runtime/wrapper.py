"""Runtime: a compiled graph as one generated Python function that allocates, launches and calls ATen.

:func:`build_plan` runs the stages (lower -> schedule -> codegen -> cache) and writes a wrapper like::

    def call(args):
        primals_1, primals_2 = args
        args.clear()
        buf_div = alloc((32768, 4096), (4096, 1), torch.bfloat16)
        launch_0(primals_1, buf_div, 32768, 4096)       # tfk_red_amax_sub_exp_sum_...
        return (buf_div,)

so the per-call cost is the launches themselves (launch closures with grid, block sizes and warps bound once)
and the allocations (``alloc``: ATen's allocation for the device without the dispatcher,
:func:`tilefuse.kernels.launcher.strided_allocator`; a CUDA graph's body runs with its device made the current
one, which that allocation uses).
Outputs that are views (eager returns a view) are strided views of the buffer they alias (``view``);
an input mutation (``copy_`` into an input) is a kernel writing into the input's storage; intermediates are
freed after their last use.

:class:`CompiledGraph` is what AOTAutograd calls (boxed calling convention). A graph with symbolic sizes
(Dynamo's automatic dynamic shapes) is planned once per concrete shape seen; kernels take sizes as
arguments, so a new shape re-plans in Python (milliseconds) and reuses the compiled kernels.
"""
from __future__ import annotations

import contextlib
import itertools
import math
import time
from typing import Any, Callable

import torch

from ... import config, device as tf_device
from ...kernels.launcher import SiteLauncher, strided_allocator
from .. import cache, codegen, ir, lowering, records, scheduler
from . import gemm as runtime_gemm
from . import launch_inline

_ids = itertools.count()


class PlanError(RuntimeError):
    """The graph cannot run as planned (a view that is not strided, a kernel Triton rejects, ...)."""


def _literal(value, consts: dict) -> str:
    if value is None or isinstance(value, (bool, int, str)):
        return repr(value)
    if isinstance(value, float):
        return f"float({str(value)!r})" if value != value or value in (float("inf"), float("-inf")) else repr(value)
    if isinstance(value, (list, tuple)):
        inner = ", ".join(_literal(v, consts) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner}{',' if len(value) == 1 else ''})"
    name = f"c{len(consts)}"
    consts[name] = value
    return name


class WrapperWriter:
    """Writes the ``call(args)`` function of one planned graph."""

    def __init__(self, sched: scheduler.Schedule, kernels: list, fns: list, constants: list, dev: torch.device):
        self.sched = sched
        self.graph = sched.graph
        self.table = self.graph.by_name()
        self.kernels = dict(zip((k.group for k in kernels), zip(kernels, fns)))
        self.constants = constants
        self.device = dev
        self.globals: dict[str, Any] = {"torch": torch, "alloc": strided_allocator(dev), "device": dev, "view": view_of}
        self.vars: dict[str, str] = {}
        self.lines: list[str] = []
        self.hooks: dict = {}  # GEMM step -> its epilogue hook (runtime/gemm.py prepare)
        self.bound: list[str] = []  # launch sites bound since the plan last wrote its launches in (Plan.rebind)

    def var(self, name: str) -> str:
        v = self.vars.get(name)
        if v is None:
            node = self.table[name]
            if isinstance(node, ir.Pointwise) and node.into:
                return self.var(node.into)
            v = "v_" + "".join(ch if ch.isalnum() else "_" for ch in name)
            while v in self.vars.values():
                v += "_"
            self.vars[name] = v
        return v

    def view_expr(self, name: str) -> str:
        """A tensor for node ``name``: a View becomes a strided view of the buffer it aliases (:func:`view_of`)."""
        node = self.table[name]
        if not isinstance(node, ir.View):
            return self.var(name)
        base, size, stride, offset = view_params(self.table, name)
        return f"view({self.var(base)}, {tuple(size)!r}, {tuple(stride)!r}, {offset})"

    def arg_text(self, value) -> str:
        if isinstance(value, ir.Ref):
            return self.view_expr(value.name)
        if isinstance(value, (list, tuple)) and any(isinstance(v, ir.Ref) for v in _flatten(value)):
            inner = ", ".join(self.arg_text(v) for v in value)
            return f"[{inner}]" if isinstance(value, list) else f"({inner}{',' if len(value) == 1 else ''})"
        return _literal(value, self.globals_consts)

    def write(self) -> tuple[str, dict]:
        self.globals_consts: dict[str, Any] = {}
        g = self.graph
        inputs = [n for n in g.nodes if isinstance(n, ir.InputNode)]
        lines = ["def call(args):"]
        arg_vars = ["_"] * g.num_args
        for n in inputs:
            if n.position < g.num_args:
                arg_vars[n.position] = self.var(n.name)
            else:
                cname = f"const_{n.position - g.num_args}"
                self.globals[cname] = self.constants[n.position - g.num_args].to(self.device)
                lines.append(f"    {self.var(n.name)} = {cname}")
        if g.num_args:
            lines.insert(1, f"    {', '.join(arg_vars)}{',' if len(arg_vars) == 1 else ''} = args")
            lines.insert(2, "    args.clear()")
        if g.seeds:
            lines.append(f"    seeds = torch.randint(0, 2147483647, ({g.seeds},), dtype=torch.int64, device=device)")
        body: list[tuple[list[str], set[str]]] = []  # (lines, names used)
        for step in self.sched.steps:
            body.append(self.step(step))
        outputs = []
        out_names = set()
        for out in g.outputs:
            if out.name is None:
                outputs.append(_literal(out.value, self.globals_consts))
            else:
                outputs.append(self.view_expr(out.name))
                out_names.add(self._base_var(out.name))
        # free intermediates after their last use
        last: dict[str, int] = {}
        for k, (_, used) in enumerate(body):
            for v in used:
                last[v] = k
        keep = out_names
        for k, (step_lines, used) in enumerate(body):
            lines.extend(step_lines)
            dead = sorted(v for v in used if last.get(v) == k and v not in keep)
            if dead:
                lines.append(f"    del {', '.join(dead)}")
        lines.append(f"    return ({', '.join(outputs)}{',' if len(outputs) == 1 else ''})")
        self.globals.update(self.globals_consts)
        return "\n".join(lines) + "\n", self.globals

    def _base_var(self, name: str) -> str:
        node = self.table[name]
        while isinstance(node, ir.View):
            name = node.source
            node = self.table[name]
        return self.var(name)

    def step(self, step) -> tuple[list[str], set[str]]:
        lines: list[str] = []
        used: set[str] = set()
        if isinstance(step, scheduler.GemmStep):
            return runtime_gemm.step_lines(self, step, self.hooks)
        if isinstance(step, scheduler.ExternStep):
            ext = self.table[step.name]
            op_name = f"op_{len(self.globals)}"
            self.globals[op_name] = lowering.DIRECT_CALLS.get(ext.op, ext.op)
            args = ", ".join(self.arg_text(a) for a in ext.args)
            kwargs = ", ".join(f"{k}={self.arg_text(v)}" for k, v in ext.kwargs)
            call = f"{op_name}({args}{', ' if args and kwargs else ''}{kwargs})"
            for ref in scheduler._refs(ext.args) + scheduler._refs(tuple(v for _, v in ext.kwargs)):
                used.add(self._base_var(ref.name))
            self.globals.setdefault("extern_layout", extern_layout)
            if ext.tuple_output:
                tmp = self.var(ext.name) + "_out"
                lines.append(f"    {tmp} = {call}  # extern {ext.name}")
                for k, meta in enumerate(ext.outputs):
                    if meta is not None:
                        v = self.var(ext.output_name(k))
                        lines.append(f"    {v} = extern_layout({tmp}[{k}], {meta.shape!r}, {meta.stride!r}, "
                                     f"{ext.output_name(k)!r})")
                        used.add(v)
                lines.append(f"    del {tmp}")
            else:
                v = self.var(ext.name)
                meta = ext.outputs[0]
                lines.append(f"    {v} = extern_layout({call}, {meta.shape!r}, {meta.stride!r}, {ext.name!r})"
                             f"  # extern")
                used.add(v)
            return lines, used
        ks, fn = self.kernels[step.name]
        for name in ks.stores:
            node = self.table[name]
            if isinstance(node, ir.Pointwise) and node.into:
                continue
            if isinstance(node, ir.InputNode):
                continue
            meta = ir.node_meta(node, name)
            lines.append(f"    {self.var(name)} = alloc({tuple(meta.shape)!r}, {tuple(meta.stride)!r}, {meta.dtype})")
        args = []
        for a in ks.args:
            if a[0] == "buf":
                v = self.var(a[1])
                args.append(v)
                used.add(v)
            elif a[0] == "seed":
                args.append("seeds")
            else:
                args.append(repr(a[1]))
        for name in ks.stores:
            used.add(self.var(name))
        # nothing to write: no launch (a reduction over an empty dim still writes its identity)
        if all(math.prod(ir.node_meta(self.table[n], n).shape) == 0 for n in ks.stores):
            return lines, used
        launcher = f"launch_{step.name}"
        constexprs = dict(ks.constexprs)
        self.globals[launcher] = _bind_launch(fn, ks.grid, constexprs, ks.num_warps, ks.num_stages, ks.options,
                                              on_bound=_rebinder(self.globals, launcher, self.bound))
        self.globals.setdefault("_kernel_names", {})[launcher] = ks.name
        lines.append(f"    {launcher}({', '.join(args)})  # {ks.name}")
        return lines, used


def _view_of() -> Callable:
    """``view(base, size, stride, offset)``: a tensor over ``base``'s storage with that size and stride, starting
    ``offset`` elements after ``base``'s own start. torch's C helper (what Inductor's wrappers call as
    ``reinterpret_tensor``) makes it without the dispatcher: 1.09 against 2.29 us for ``as_strided`` on the CPU
    (timeit, torch 2.13); a decode step of GPT-2 makes ~165 such views. The view is not recorded as a view for
    autograd, which the wrapper does not need: it runs under AOTAutograd with gradients off, and AOTAutograd
    rebuilds the outputs that alias an input or each other from their sizes and strides."""
    guards = getattr(getattr(torch._C, "_dynamo", None), "guards", None)
    direct = getattr(guards, "_reinterpret_tensor", None)
    if direct is not None:
        return direct

    def view(base, size, stride, offset):
        return base.as_strided(size, stride, base.storage_offset() + offset)

    return view


view_of = _view_of()


def extern_layout(t: torch.Tensor, shape: tuple, stride: tuple, name: str) -> torch.Tensor:
    """An extern's result in the layout the graph's metadata gives it, which the kernels after it index by.

    An ATen kernel may return another layout than its meta function promised (a CPU kernel's choice of
    memory format, a fused op's transposed output); such a result is copied into the promised strides, once a
    call, and counted (``stats()["extern_relayouts"]``), rather than read through the wrong strides."""
    if t is None:  # an undefined output (mkldnn_rnn_layer's workspace in inference), which nothing reads
        return t
    got = t.stride()
    if got == stride and t.shape == shape:
        return t
    if tuple(t.shape) != tuple(shape):
        raise PlanError(f"extern {name} returned shape {tuple(t.shape)} where the graph says {tuple(shape)}")
    if all(g == s for g, s, n in zip(got, stride, shape) if n > 1):
        return t
    fixed = torch.empty_strided(shape, stride, dtype=t.dtype, device=t.device)
    fixed.copy_(t)
    records.bump("extern_relayouts")
    config.log(1, f"extern {name} returned strides {tuple(got)} where the graph says {tuple(stride)}: copied")
    return fixed


def _bind_launch(fn, grid, constexprs, num_warps, num_stages, extra=(), on_bound=None):
    """The launch closure of one kernel call site: the JIT's dispatch on the first call, then the compiled
    kernel's own launcher (:class:`tilefuse.kernels.launcher.SiteLauncher`: ~20-40 us less host time a launch
    on Triton 3.6; it returns to the JIT whenever an argument would need another specialisation). ``extra``:
    the kernel's own compile options (KernelSource.options: debug for a kernel with device asserts).
    ``on_bound(fast)``: called once the site has written its bound launch function."""
    options = {} if tf_device.interpreting() else {"num_warps": num_warps, "num_stages": num_stages, **dict(extra)}
    return SiteLauncher(fn, tuple(grid), options, constexprs, on_bound=on_bound)


def _rebinder(glb: dict, name: str, bound: list):
    """Puts a site's bound launch function in the wrapper's globals under the site's name, so the wrapper's
    launch statement calls it with no site object between (one Python call a launch, not two), and notes the
    site in ``bound``: after the call, the plan writes that launch into its wrapper (:meth:`Plan.rebind`)."""
    def rebind(fast) -> None:
        glb[name] = fast
        bound.append(name)

    return rebind


def _flatten(value):
    for v in value:
        if isinstance(v, (list, tuple)):
            yield from _flatten(v)
        else:
            yield v


def view_params(table, name):
    """(base node, size, stride, element offset from the base's storage offset) of a strided view."""
    node = table[name]
    index = tuple(ir.loop_vars(node.shape))
    cur = node
    while isinstance(cur, ir.View):
        mapping = {f"i{d}": index[d] for d in range(len(cur.shape))}
        index = tuple(ir.substitute(ix, mapping) for ix in cur.index)
        base = cur.source
        cur = table[base]
    meta = ir.node_meta(cur, base)
    phys = ir.strided_offset(index, meta.stride)
    strides = {}
    for atom, coef in phys.terms:
        if not isinstance(atom, ir.Var):
            raise PlanError(f"view {name} of {base} is not a strided view of it")
        strides[atom.name] = coef
    stride = []
    for d, size in enumerate(node.shape):
        computed = strides.get(f"i{d}", 0)
        stride.append(node.stride[d] if size == 1 or node.stride[d] == computed else computed)
    return base, tuple(node.shape), tuple(stride), phys.offset


# ------------------------------------------------------------------------------------------------ plans
class Plan:
    """One planned graph: ``call`` its wrapper, ``source`` the wrapper as written (what ``explain`` and the logs
    show). Once launch sites have bound their kernels (``bound`` names them), :meth:`rebind` replaces ``call``
    by the wrapper with those launches written in (:mod:`.launch_inline`; ``inlined_source``); the first wrapper
    stays as ``generic``, the path for a profiler's hooks and unaligned inputs."""

    def __init__(self, call, source, kernels, report, raw: str = "", finish: Callable | None = None,
                 bound: list | None = None):
        self.call = self.generic = call
        self.source = source
        self.kernels = kernels
        self.report = report
        self.inlined_source: str | None = None
        self.bound = bound if bound is not None else []
        self._raw, self._finish = raw, finish

    def rebind(self) -> None:
        """Write the bound sites' launches into the wrapper (after a call: sites bind during their first one)."""
        self.bound.clear()
        glb = self.generic.__globals__
        source = launch_inline.inline_source(self._raw, glb) if self._finish is not None else None
        if source is None:
            return
        source = self._finish(source)
        glb["_generic"] = self.generic
        space: dict = {}
        exec(compile(source, f"<tilefuse graph {self.report.graph_id} {self.report.kind} bound>", "exec"), glb, space)
        self.call, self.inlined_source = space["call"], source
        config.log(3, f"graph {self.report.graph_id} ({self.report.kind}) wrapper with its launches bound:\n{source}")


def build_plan(gm: torch.fx.GraphModule, meta: Callable, kind: str, graph_id: int, strict: bool) -> Plan:
    """The plan of ``gm``. AOTAutograd calls the backend with its FakeTensorMode active; the plan holds real
    tensors (constants moved to the graph's device, precompile's arguments), so it is built with that mode
    unset: under it, a CPU constant moved to a GPU became a fake tensor that the first launch could not read."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():
        return _build_plan(gm, meta, kind, graph_id, strict)


def _build_plan(gm: torch.fx.GraphModule, meta: Callable, kind: str, graph_id: int, strict: bool) -> Plan:
    times = {}
    t0 = time.perf_counter()
    graph, fallbacks, constants = lowering.lower(gm, meta, strict=strict)
    t1 = time.perf_counter()
    times["lower"] = t1 - t0
    config.log(3, f"graph {graph_id} ({kind}) IR after lowering:\n{ir.format_graph(graph)}")
    sched = scheduler.schedule(graph)
    t2 = time.perf_counter()
    times["schedule"] = t2 - t1
    config.log(3, f"graph {graph_id} ({kind}) fusion groups:\n{scheduler.format_schedule(sched)}")
    if graph.device.type == "cpu" and not tf_device.interpreting():
        raise lowering.GraphFallback("CPU tensors need Triton's interpreter (this process compiles for a GPU)")
    groups = [st for st in sched.steps if isinstance(st, scheduler.KernelGroup)]
    if tf_device.interpreting():
        from . import interpreter_fast

        interpreter_fast.install()
    target = codegen.LaunchTarget.current()
    kernels = [codegen.generate(g, sched, target) for g in groups]
    t3 = time.perf_counter()
    times["codegen"] = t3 - t2
    fns, origins = [], []
    for ks in kernels:
        fn, origin = cache.load(ks)
        fns.append(fn)
        origins.append(origin)
        config.log(2, f"kernel {ks.name} ({origin}) -> {cache.kernel_path(ks)}\n{ks.source}")
    t4 = time.perf_counter()
    times["load"] = t4 - t3
    hooks, hook_sources = runtime_gemm.prepare(sched, target)
    writer = WrapperWriter(sched, kernels, fns, constants, graph.device)
    writer.hooks = hooks
    raw, glb = writer.write()
    finish = None
    if tf_device.interpreting():
        glb["_errstate"] = _np_quiet
        finish = lambda src: _wrap_body(src, ["with _errstate():"], [])  # noqa: E731
    elif graph.device.type == "cuda":
        # what torch.cuda._DeviceGuard's enter and exit call, without the context manager's own Python
        # (its __init__, __enter__ and __exit__: 3.7 us a wrapper call under cProfile on an H100's host,
        # decision 035)
        glb["_to_device"], glb["_back_to_device"] = torch.cuda._exchange_device, torch.cuda._maybe_exchange_device
        index = graph.device.index if graph.device.index is not None else torch.cuda.current_device()
        finish = lambda src: _wrap_body(src, *_on_device(index))  # noqa: E731
    source = finish(raw) if finish is not None else raw
    code = compile(source, f"<tilefuse graph {graph_id} {kind}>", "exec")
    exec(code, glb)
    call = glb["call"]
    config.log(2, f"graph {graph_id} ({kind}) wrapper:\n{source}")
    if not tf_device.interpreting():
        precompile(kernels, fns, graph)
        times["triton"] = time.perf_counter() - t4
    report = records.GraphReport(graph_id, kind, sum(1 for n in gm.graph.nodes if n.op == "call_function"))
    for ks, g in zip(kernels, groups):
        report.kernels.append(records.KernelReport(ks.name, ks.form, [o for o in g.origins], list(g.stores),
                                                 str(cache.kernel_path(ks))))
    report.kernels.extend(runtime_gemm.report(sched, hook_sources))
    for n in graph.nodes:
        if isinstance(n, ir.Extern):
            report.externs.append((n.name, lowering.op_name(n.op), n.reason, n.note))
    report.fallbacks = list(fallbacks)
    report.seconds = times
    return Plan(call, source, kernels, report, raw, finish, writer.bound)


def precompile(kernels, fns, graph) -> None:
    """Compile every kernel now (GPU): a kernel Triton rejects fails the plan, not the middle of a call."""
    for ks, fn in zip(kernels, fns):
        args = []
        for a in ks.args:
            if a[0] == "buf":
                node = graph.by_name()[a[1]]
                args.append(ir.node_meta(node, a[1]).dtype)
            elif a[0] == "seed":
                args.append(torch.int64)
            else:
                args.append(a[1])
        try:
            fn.warmup(*args, grid=tuple(ks.grid), num_warps=ks.num_warps, num_stages=ks.num_stages,
                      **dict(ks.options), **dict(ks.constexprs))
        except Exception as exc:
            raise PlanError(f"Triton could not compile {ks.name}: {type(exc).__name__}: {exc}") from exc


@contextlib.contextmanager
def _np_quiet():
    import numpy as np

    with np.errstate(all="ignore"):
        yield


def _on_device(index: int) -> tuple[list[str], list[str]]:
    """The lines around a CUDA wrapper's body: device ``index`` made current, the caller's restored after, also
    when the body raises."""
    return [f"_previous_device = _to_device({index})", "try:"], ["finally:", "    _back_to_device(_previous_device)"]


def _wrap_body(source: str, opening: list[str], closing: list[str]) -> str:
    """The wrapper's body one level deeper, between ``opening`` and ``closing`` lines. On the interpreter, under
    numpy's errstate (it warns about inf/nan arithmetic that the GPU does silently); on CUDA, with the graph's
    device made current and the caller's restored after (its allocations use the current device, and Triton
    launches on it)."""
    lines = source.splitlines()
    out = [lines[0]] + ["    " + ln for ln in opening] + ["    " + ln for ln in lines[1:]]
    out += ["    " + ln for ln in closing]
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------------------------------ the callable
def is_symbolic(value) -> bool:
    """A node's value has a symbolic size, stride or offset, or is a symbolic scalar (dynamic shapes)."""
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return True
    if isinstance(value, torch.Tensor):
        return any(isinstance(s, torch.SymInt) for s in value.shape) or \
            any(isinstance(s, torch.SymInt) for s in value.stride()) or \
            isinstance(value.storage_offset(), torch.SymInt)
    return False


# Ops whose value is read from a tensor's data (``t.item()``, a tensor ``start`` of narrow): the graph's sizes
# or offsets then depend on data (unbacked symbols), which fake tensors cannot know.
DATA_DEPENDENT_OPS = frozenset({torch.ops.aten._local_scalar_dense.default})


def data_dependent_nodes(gm: torch.fx.GraphModule) -> tuple[list, list]:
    """(the nodes reading a scalar from data, every node they depend on in graph order). Raises PlanError where
    computing them ahead of the plan would change what the graph does (a mutation or a random op among them)."""
    scalars = [n for n in gm.graph.nodes if n.op == "call_function" and n.target in DATA_DEPENDENT_OPS]
    if not scalars:
        return [], []
    needed: set = set()
    stack = list(scalars)
    while stack:
        n = stack.pop()
        if n in needed:
            continue
        needed.add(n)
        stack.extend(n.all_input_nodes)
    for n in needed:
        if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload):
            schema, tags = n.target._schema, getattr(n.target, "tags", ())
            if schema.is_mutable or torch.Tag.nondeterministic_seeded in tags:
                raise PlanError(f"{n.name} ({n.target}) feeds a value read from tensor data ({scalars[0].name}) "
                                "and cannot be run ahead of the plan")
        elif n.op not in ("placeholder", "get_attr", "call_function"):
            raise PlanError(f"{n.name} ({n.op}) feeds a value read from tensor data")
    return scalars, [n for n in gm.graph.nodes if n in needed]


def data_dependent_values(gm: torch.fx.GraphModule, needed: list, args) -> dict:
    """The real values of the data-read scalars for these ``args``: the nodes they need, run in ATen."""
    env: dict = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for n, a in zip(placeholders, args):
        env[n] = a
    for n in needed:
        if n.op == "placeholder":
            continue
        if n.op == "get_attr":
            env[n] = getattr(gm, n.target)
            continue
        a = torch.fx.node.map_arg(n.args, env.__getitem__)
        kw = torch.fx.node.map_arg(n.kwargs, env.__getitem__)
        env[n] = n.target(*a, **kw)
    return {n: env[n] for n in needed if n.op == "call_function" and n.target in DATA_DEPENDENT_OPS}


def concrete_metas(gm: torch.fx.GraphModule, args, known: dict | None = None) -> dict:
    """Every node's value with concrete sizes, by running ``gm`` on fake copies of ``args``; ``known`` gives
    the values of nodes fake tensors cannot compute (scalars read from data)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    values: dict = {}
    known = known or {}
    fakes = [mode.from_tensor(a, static_shapes=True) if isinstance(a, torch.Tensor) else a for a in args]

    class Prop(torch.fx.Interpreter):
        def run_node(self, n):
            r = known[n] if n in known else super().run_node(n)
            values[n] = r
            return r

    with mode:
        Prop(gm).run(*fakes)
    return values


class CompiledGraph:
    """The function AOTAutograd calls for one forward/backward/inference graph (boxed: takes a list)."""
    _boxed_call = True

    def __init__(self, gm: torch.fx.GraphModule, kind: str, strict: bool):
        self.gm = gm
        self.kind = kind
        self.graph_id = next(_ids)
        self.strict = strict
        self.dynamic = any(is_symbolic(n.meta.get("val")) for n in gm.graph.nodes)
        self.scalar_nodes, self.scalar_inputs = data_dependent_nodes(gm)
        self.plans: dict = {}
        self.plan: Plan | None = None
        self.fallback_reason: str | None = None
        self.on_plan = None
        if not self.dynamic:
            self.plan = build_plan(gm, lambda n: n.meta.get("val"), kind, self.graph_id, strict)
            self.report = self.plan.report

    cudagraphs = None  # a cudagraphs.GraphRunner in mode="reduce-overhead": it records, replays, or calls run

    # Never traced by Dynamo: a compiled step that calls ``loss.backward()`` runs this graph's backward from
    # inside Dynamo's frame hook, which would otherwise trace into the wrapper and Triton's launcher.
    @torch.compiler.disable
    def __call__(self, args):
        runner = self.cudagraphs
        return self.run(args) if runner is None else runner(args)

    def run(self, args):
        """One uncaptured call: the plan of these arguments' shapes (or the ATen graph)."""
        if self.fallback_reason is not None:
            return self.gm(*args)
        plan = self.plan
        if plan is None:
            key = tuple((tuple(a.shape), tuple(a.stride()), a.dtype) if isinstance(a, torch.Tensor) else a
                        for a in args)
            known = data_dependent_values(self.gm, self.scalar_inputs, args) if self.scalar_nodes else {}
            if known:  # a plan holds for these values read from data too (they set sizes and offsets)
                key = key + tuple(known.values())
            plan = self.plans.get(key)
            if plan is None:
                plan = self.plan_for(args, known, key)
                self.plans[key] = plan
            if plan is _ATEN:
                return self.gm(*args)
        out = plan.call(args)
        if plan.bound:  # sites kept their kernels in this call: their launches go into the wrapper
            plan.rebind()
        return out

    def plan_for(self, args, known: dict, key):
        """The plan for one concrete shape (and data-read values); where none can be built, the ATen graph
        for this key, with the reason recorded (strict mode raises): a model never fails because of tilefuse."""
        try:
            values = concrete_metas(self.gm, args, known)
            plan = build_plan(self.gm, values.__getitem__, self.kind, self.graph_id, self.strict)
        except lowering.FallbackError:
            raise
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}".splitlines()[0][:500]
            where = f"{self.kind} graph {self.graph_id} at shapes {[k[0] for k in key if isinstance(k, tuple)]}"
            if self.strict:
                raise lowering.FallbackError(f"tilefuse strict mode: {where} would fall back to ATen: "
                                             f"{reason}") from exc
            records.add_fallback(where, reason)
            records.bump("graph_fallbacks")
            config.log(1, f"fallback: {where} runs in ATen: {reason}")
            return _ATEN
        records.bump("replans")
        if self.on_plan is not None:
            self.on_plan(plan.report)
        config.log(1, f"graph {self.graph_id} ({self.kind}): planned for shapes "
                      f"{[k[0] for k in key if isinstance(k, tuple)]}, kernels reused from the cache")
        return plan


_ATEN = object()  # a plans entry: this key runs the ATen graph (its fallback was recorded when it was planned)
