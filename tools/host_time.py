"""Host time a call, and where it goes: tilefuse.gemm against torch.matmul, and compiled graphs (tilefuse
against Inductor and eager), on shapes small enough that the host, not the GPU, sets the time.

    python tools/host_time.py            (GPU only; prints a report, ~30 s)

Sections:
  gemm: wall time a call (3000 back-to-back calls, synchronised at the end) at 64^3 and 1024^3 bf16 and the
        decode shape 1 x 8192 x 8192; then the parts of a repeat call: the plan path with launches stubbed
        out (gemm_plan.host_path_us), the kept launcher alone, an output allocation; then cProfile's top
        entries for 2000 calls.
  compiler: wall time a call of small graphs (softmax, layer_norm fwd, layer_norm fwd+bwd at 64 x 256) under
        tilefuse, Inductor and eager, and how many launches went through the direct path.
  launch: one generated wrapper (two kernels, six allocations) taken apart: its call, each launch site, the
        kept C launcher alone with prepared arguments, an allocation; cProfile of the wrapper.
  graphs: a host-bound fwd+bwd step (softmax at 1024 x 4096 bf16) under both backends with and without
        mode="reduce-overhead": host time with the GPU kept busy (the bench's measure) and with it idle, the
        replay alone, and cProfile of the captured step.
  captured (captured_32768: at the suite's own 32768 rows): the compiler suite's fwd+bwd graphs at 1024 rows
        under both backends' mode="reduce-overhead": host time a step in alternated rounds (tilefuse also with its
        inputs copied one by one, as before decision 053), then host time by op. The replay-cost rule (decisions
        054-057) is off, so every graph is recorded. Each graph is also timed without the mode (rows
        "... uncaptured"), in the same alternated rounds, to say what capture adds to a step's host time and where
        (the by-op tables).
        captured_softmax, captured_softmax_32768: softmax_fwd_bwd alone.
  replay_parts: softmax fwd+bwd at 1024 and 32768 rows under tilefuse, uncaptured and captured: host time a step
        with timers around each compiled graph's call and a replay's copies, graph launch and hand-out (no
        profiler); what lies outside the graphs' calls is Dynamo's, AOTAutograd's and autograd's.
  floor: softmax fwd+bwd at 1024 rows, host time a step under eager, a backend whose compiled graphs launch
        nothing (Dynamo, AOTAutograd and autograd only), tilefuse and Inductor, each also with
        mode="reduce-overhead" (tilefuse under its replay-cost rule, which it reports graph by graph), in
        alternated rounds, beside each one's GPU time a step and wall time a step: the host time no backend's
        per-graph capture removes, and what capture does to the step.
        floor_gemm: the same for attention_projections fwd+bwd (four 4096 x 4096 projections); floor_rms: for
        rms_norm fwd+bwd (three kernels, whose backward the rule may record).
  copies: a replay's input copies alone, one copy_ an input against one _foreach_copy_ (decision 053).
  pool: a small training loop (MLP 1024-2048-1024, AdamW) uncaptured and captured: memory allocated after
        each phase of a step and the peak within it, and whether .grad is the pool's memory.
  decode: one GPT-2 124M decode step (batch 1, static KV cache) as the models suite times it, under eager,
        Inductor and tilefuse with and without mode="reduce-overhead": wall, host and GPU time a step, and for
        tilefuse its CUDA-graph report and cProfile of the step; before it, host us a call of the pieces the
        uncaptured step makes many of (the attention forward, a GEMM, the KV-cache write, a view, an allocation).
  train: one GPT-2 124M training step (batch 1, 512 tokens, bf16 autocast, AdamW) as the models suite times it,
        under Inductor and tilefuse with mode="reduce-overhead": wall and GPU time a step and the GPU's time by
        kernel, to say where a captured step's time goes; cProfile of the step.
  train-tilefuse: the same, tilefuse alone.
  latency_rows: the captured tilefuse decode step with latency_rows_thread_elems 8 and 4, loads first off, and 8
        again, GPU time a step and the generated kernels (decision 049's A/B).
  direct_calls: that decode step uncaptured under tilefuse with the attention ops' functions called directly and
        through the ops (decision 038), alternated in one process.

    python tools/host_time.py launch graphs pool   (some sections only)
"""
from __future__ import annotations

import contextlib
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import tilefuse  # noqa: E402
from tilefuse.kernels.gemm import launching as L# noqa: E402
from tilefuse.kernels.gemm import plan as P# noqa: E402

CALLS = 3000


def per_call_us(fn, calls=CALLS) -> float:
    for _ in range(100):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / calls * 1e6)
    return best


def gpu_us(fn) -> float:
    """GPU time a call (CUDA events over 200 calls, after a warm-up)."""
    for _ in range(20):
        fn()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    s.record()
    for _ in range(200):
        fn()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) / 200 * 1e3


def gemm_section() -> None:
    print("== gemm: wall time a call (us), best of 3 rounds of", CALLS)
    for m, n, k in ((64, 64, 64), (1024, 1024, 1024), (1, 8192, 8192), (2048, 2048, 2048)):
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        calls = CALLS if m * n * k < 2 ** 31 else 500
        t_mm = per_call_us(lambda: torch.matmul(a, b), calls)
        t_tf = per_call_us(lambda: tilefuse.gemm(a, b), calls)
        t_raw = per_call_us(lambda: P.gemm_call(a, b), calls)
        print(f"  {m}x{n}x{k}: torch.matmul {t_mm:7.1f}  tilefuse.gemm {t_tf:7.1f}  gemm_call {t_raw:7.1f}  "
              f"| GPU time: matmul {gpu_us(lambda: torch.matmul(a, b)):7.1f} tilefuse {gpu_us(lambda: tilefuse.gemm(a, b)):7.1f}")
    a = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
    tilefuse.gemm(a, b)
    print(f"  plans kept: {P.plan_count()}")
    print(f"  plan path with launches stubbed: {P.host_path_us(a, b):.2f} us")
    plan = next(iter(P._plans.values()))
    c = plan.launches[0]
    print(f"  launch kept: direct={c.direct is not None}, via_run={getattr(c.direct, 'via_run', None)}")
    values = [a, b] + [None] * (len(L.ROLES) - 2)
    values[L.ROLE_INDEX["out"]] = torch.empty(64, 64, device="cuda", dtype=torch.bfloat16)
    values[L.ROLE_INDEX["dummy"]] = plan.dummy
    stream = L.current_stream(0)
    print(f"  kept launcher alone: {per_call_us(lambda: c.run(values, (1.0, 1.0), stream)):.2f} us")
    print(f"  new_empty(64, 64): {per_call_us(lambda: a.new_empty((64, 64))):.2f} us")
    print(f"  current_stream: {per_call_us(lambda: L.current_stream(0)):.2f} us")
    print(f"  torch.compiler.is_compiling: {per_call_us(torch.compiler.is_compiling):.2f} us")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(2000):
        tilefuse.gemm(a, b)
    prof.disable()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(14)
    print("  cProfile, 2000 calls of tilefuse.gemm at 64^3 (tottime):")
    print("\n".join("    " + line for line in s.getvalue().splitlines() if line.strip())[:4000])


def compiler_section() -> None:
    from tilefuse.kernels import launcher

    print("== compiler: wall time a call (us) of small graphs, host-bound")
    x = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(256, device="cuda", dtype=torch.bfloat16)
    bb = torch.randn(256, device="cuda", dtype=torch.bfloat16)
    graphs = {
        "softmax": (lambda x: torch.softmax(x, -1), (x,), False),
        "layer_norm": (lambda x, w, b: F.layer_norm(x, (256,), w, b), (x, w, bb), False),
        "gelu_chain": (lambda x, w, b: F.gelu(x * w + b) * 0.5, (x, w, bb), False),
        "layer_norm_fwd_bwd": (lambda x, w, b: F.layer_norm(x, (256,), w, b), (x, w, bb), True),
    }
    for name, (fn, args, bwd) in graphs.items():
        row = []
        for backend in ("eager", "inductor", "tilefuse"):
            torch._dynamo.reset()
            f = fn if backend == "eager" else torch.compile(fn, backend=backend)
            if bwd:
                leaves = [a.detach().requires_grad_(True) for a in args]
                g = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16)

                def step(f=f, leaves=leaves, g=g):
                    f(*leaves).backward(g)
            else:
                def step(f=f, args=args):
                    f(*args)
            try:
                row.append(f"{backend} {per_call_us(step, 1000):7.1f}")
            except Exception as exc:  # noqa: BLE001 - a report line, the next backend still runs
                row.append(f"{backend} failed ({type(exc).__name__}: {str(exc)[:80]})")
        print(f"  {name}: " + "  ".join(row))
    # how the tilefuse launches went
    sites = [o for o in __import__("gc").get_objects() if type(o) is launcher.SiteLauncher]
    print(f"  tilefuse launch sites: {len(sites)}, direct: {sum(s.direct is not None for s in sites)}")


def _profile(fn, calls: int, lines: int = 16, order: str = "tottime") -> str:
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats(order).print_stats(lines)
    return "\n".join("    " + line for line in s.getvalue().splitlines() if line.strip())[:9000]


def _kernel_table(fn, steps: int = 5, lines: int = 25) -> str:
    """The GPU's time a step by kernel (torch.profiler's CUDA activity over ``steps`` steps): name, launches a
    step, µs a step; the biggest first, then the total."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    per = {e.key: (e.count, e.device_time_total) for e in prof.key_averages() if e.device_time_total > 0}
    rows = sorted(per.items(), key=lambda kv: -kv[1][1])
    total = sum(us for _, us in per.values()) / steps
    out = [f"    {us / steps:8.1f} us {count / steps:6.1f}x  {name[:110]}" for name, (count, us) in rows[:lines]]
    out.append(f"    {total:8.1f} us in all, {sum(c for c, _ in per.values()) / steps:.0f} kernels/copies a step, "
               f"{len(rows)} distinct")
    return "\n".join(out)


def _host_table(fn, steps: int = 5, lines: int = 30) -> str:
    """Host µs a step by op and autograd node (torch.profiler's CPU activity, every thread: a backward runs on
    autograd's device thread, which cProfile does not see): total (with children) and self, the biggest totals
    first."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    rows = sorted((e for e in prof.key_averages() if e.cpu_time_total > 0), key=lambda e: -e.cpu_time_total)
    return "\n".join(f"    {e.cpu_time_total / steps:9.1f} us total {e.self_cpu_time_total / steps:8.1f} self "
                     f"{e.count / steps:6.1f}x  {e.key[:100]}" for e in rows[:lines])


@contextlib.contextmanager
def _collecting_graphs():
    """Yields a list that collects every CompiledGraph made inside the block (Dynamo reset first)."""
    from tilefuse.compiler import runtime

    made = []
    real = runtime.CompiledGraph.__init__

    def init(self, *a, **k):
        real(self, *a, **k)
        made.append(self)

    torch._dynamo.reset()
    runtime.CompiledGraph.__init__ = init
    try:
        yield made
    finally:
        runtime.CompiledGraph.__init__ = real


def _graphs_made(fn, *args):
    """The CompiledGraph objects that compiling and calling ``fn(*args)`` makes."""
    with _collecting_graphs() as made:
        torch.compile(fn, backend="tilefuse")(*args)
    return made


def launch_section() -> None:
    from tilefuse.kernels import launcher

    def graph(x, w):
        y = torch.softmax(x, -1) * w
        z = F.layer_norm(y + 1, y.shape[-1:])
        return (F.gelu(z) + y.sum(-1, keepdim=True)).tanh(), z.amax(0)

    print("== launch: one generated wrapper taken apart (us of host time)")
    x, w = torch.randn(64, 33, device="cuda"), torch.randn(33, device="cuda")
    (g,) = _graphs_made(graph, x, w)
    plan = g.plan
    glb = plan.generic.__globals__
    g.run([x, w])  # (a site that keeps its kernel binds its launch; after the call the plan writes it in)
    sites = {k: getattr(v, "site", v) for k, v in glb.items() if k.startswith("launch_")}
    print(f"  bound launch functions in the wrapper: "
          f"{sum(hasattr(v, 'site') for k, v in glb.items() if k.startswith('launch_'))} of {len(sites)}")
    print(f"  wrapper call, launches written in: {per_call_us(lambda: plan.call([x, w])):.2f} us, "
          f"{len(sites)} launch sites (inlined: {plan.inlined_source is not None})")
    print(f"  wrapper call through the bound functions: {per_call_us(lambda: plan.generic([x, w])):.2f} us")
    seen = {}
    bound = {k: glb[k] for k in sites}
    for k, site in sites.items():
        def spy(*args, k=k, site=site):
            seen[k] = args
            site(*args)
        glb[k] = spy
    plan.generic([x, w])
    glb.update(bound)
    stream = launcher.current_stream(0)
    for k, site in sites.items():
        d = getattr(site, "direct", None)
        args = seen[k]
        print(f"  {k}: {type(site).__name__}, direct={d is not None}, via_run={getattr(d, 'via_run', None)}, "
              f"{len(args)} args, aligned {getattr(site, 'aligned', None)}, ints {getattr(site, 'ints', None)}")
        print(f"    site call: {per_call_us(lambda: site(*args)):.2f} us")
        if getattr(site, "fast", None) is not None:
            print(f"    bound launch function: {per_call_us(lambda: site.fast(*args)):.2f} us")
        _static_launcher_probe(site, args, stream)
        if d is not None:
            direct = [a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args] + list(site.tail)
            print(f"    Direct.launch: {per_call_us(lambda: d.launch(stream, direct)):.2f} us")
            if not d.via_run:
                full = (d.g0, d.g1, d.g2, stream, d.function, d.coop, d.pdl, None, None, d.packed, None, None,
                        None, *direct)
                print(f"    C launcher alone: {per_call_us(lambda: d.fn(*full)):.2f} us")
    print(f"  hooks_installed: {per_call_us(launcher.hooks_installed):.2f} us")
    print(f"  empty_strided((64, 1)): "
          f"{per_call_us(lambda: torch.empty_strided((64, 1), (1, 1), device='cuda')):.2f} us")
    print(f"  torch.add (one ATen launch): {per_call_us(lambda: torch.add(x, x)):.2f} us")
    print("  cProfile, 3000 wrapper calls (tottime):")
    print(_profile(lambda: plan.call([x, w]), 3000))


def _static_launcher_probe(site, args, stream) -> None:
    """What torch's own C++ launcher (Inductor's static launcher, a private API) costs for the same kernel."""
    import tempfile

    try:
        try:
            from torch._inductor.runtime.static_triton_launcher import StaticallyLaunchedCudaKernel
        except ImportError:
            from torch._inductor.runtime.static_cuda_launcher import StaticallyLaunchedCudaKernel
        compiled = site.jit(*args, **site.options)  # the JIT's cache: the kernel the site keeps
        if not hasattr(compiled, "_cubin_path"):
            compiled._cubin_path = None
        k = StaticallyLaunchedCudaKernel(compiled)
        path = tempfile.NamedTemporaryFile(suffix=".cubin", delete=False).name
        k.reload_cubin_from_raw(path)
        k.load_kernel(site.device_index)
        runtime = [a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args]
        g = site.direct
        k.run(g.g0, g.g1, g.g2, stream, *runtime)
        print(f"    torch static launcher run(): {per_call_us(lambda: k.run(g.g0, g.g1, g.g2, stream, *runtime)):.2f} us")
        c, fn, tys, nw, sh = k.C_impl, k.function, k.arg_tys, k.num_warps, k.shared
        tup = tuple(runtime)
        print(f"    torch static launcher _launch_kernel alone: "
              f"{per_call_us(lambda: c._launch_kernel(fn, g.g0, g.g1, g.g2, nw, sh, tys, tup, stream)):.2f} us")
    except Exception as exc:  # noqa: BLE001 - a probe of a private API: report and go on
        print(f"    torch static launcher: not measured ({type(exc).__name__}: {str(exc)[:200]})")


def graphs_section() -> None:
    from tilefuse.bench.compiler_suite import host_us  # (the bench's own measure: calls queued behind a sleep kernel)

    print("== graphs: softmax fwd+bwd at 1024 x 4096 bf16, host us a step (GPU busy / idle wall) and GPU us")
    sets = []
    for _ in range(4):
        x = torch.randn(1024, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        sets.append((x, torch.randn(1024, 4096, device="cuda", dtype=torch.bfloat16)))

    def fn(x):
        return torch.softmax(x, -1)

    for backend in ("inductor", "tilefuse"):
        for mode in (None, "reduce-overhead"):
            torch._dynamo.reset()
            if backend == "tilefuse":
                from tilefuse import compiler

                compiler.reset_stats()
            f = torch.compile(fn, backend=backend, **({"mode": mode} if mode else {}))
            i = [0]

            def step(f=f, i=i, marked=mode is not None):
                if marked:
                    torch.compiler.cudagraph_mark_step_begin()
                x, g = sets[i[0] % 4]
                i[0] += 1
                y = f(x)
                return torch.autograd.grad(y, (x,), g)

            try:
                for _ in range(5):
                    step()
                busy = min(host_us(step) for _ in range(3))
                idle = per_call_us(step, 300)
                gpu = gpu_us(step)
                import gc

                gc.freeze()  # every object made so far out of the collector's way
                frozen = per_call_us(step, 300)
                gc.unfreeze()
                gc.disable()
                no_gc = per_call_us(step, 300)
                gc.enable()
                fwd = per_call_us(lambda: f(sets[0][0]), 300)
                print(f"  {backend} {mode or 'default'}: host (GPU busy) {busy:.1f}  wall (GPU idle) {idle:.1f}  "
                      f"GPU {gpu:.1f}  wall after gc.freeze {frozen:.1f}  gc off {no_gc:.1f}  forward alone {fwd:.1f}")
                if backend == "tilefuse" and not mode:
                    print("    cProfile, 200 steps, GPU idle (tottime):")
                    print(_profile(step, 200))
                if backend == "tilefuse" and mode:
                    from tilefuse import compiler

                    print(f"    stats: { {k: v for k, v in compiler.stats().items() if 'cudagraph' in k} }")
                    print("    cProfile, 200 steps, GPU idle (tottime):")
                    print(_profile(step, 200))
                    torch.cuda._sleep(2_000_000_000)
                    print("    cProfile, 200 steps queued behind a ~1 s sleep kernel (tottime):")
                    print(_profile(step, 200))
                    from tilefuse.compiler.runtime import cudagraphs

                    recs = [r for p in list(cudagraphs._POOLS) for r in p.recordings]
                    for r in recs:
                        print(f"    recording {r.seq}: graph.replay() alone: idle "
                              f"{per_call_us(r.graph.replay, 300):.1f} us, busy {host_us(r.graph.replay):.1f} us")
            except Exception as exc:  # noqa: BLE001 - a report line, the next mode still runs
                print(f"  {backend} {mode}: failed: {type(exc).__name__}: {str(exc)[:300]}")


def captured_section(cases=None, rows: int = 1024, rounds: int = 7) -> None:
    """The compiler suite's fwd+bwd graphs at ``rows`` rows under both backends' mode="reduce-overhead", as the
    suite times them (its inputs rotated over 4 sets, a step begun before each call): host µs a step with the
    GPU busy, the two backends' rounds alternated so that drift of the host falls on both; then each step's
    host time by op (torch.profiler's CPU table) and, for tilefuse, its recordings' inputs copied a replay and
    outputs handed out. The replay-cost rule is off here (every graph recorded, whatever its replay costs), so that
    the captured path is what is timed at every row count."""
    with _every_graph_recorded():
        _captured_rows(cases, rows, rounds)


@contextlib.contextmanager
def _every_graph_recorded():
    """The replay-cost rule off (decisions 054-057), and back as the runtime had it afterwards, so that the sections
    run after one that times the captured path see the rule."""
    from tilefuse.compiler.runtime import cudagraphs

    before = cudagraphs.REPLAY_COST_RULE
    cudagraphs.REPLAY_COST_RULE = False
    try:
        yield
    finally:
        cudagraphs.REPLAY_COST_RULE = before


def _captured_rows(cases, rows: int, rounds: int) -> None:
    from tilefuse import compiler
    from tilefuse.bench import compiler_suite as cs
    from tilefuse.bench import runner
    from tilefuse.bench.compiler_suite import host_us
    from tilefuse.compiler.runtime import cudagraphs

    import statistics

    opts = runner.SuiteOptions(rows=rows, log=lambda s: None)
    by_case = {g.case: g for g in cs.GRAPHS}
    cases = cases or [g.case for g in cs.GRAPHS if g.backward]
    summary = []
    for case in cases:
        graph = by_case[case]
        before = set(map(id, cudagraphs._POOLS))
        dims = cs._sizes(opts, graph)
        sets = [cs.prepare(graph, graph.inputs(*dims[:3], dims[3], "cuda")) for _ in range(4)]
        steps = {}
        for backend in ("inductor", "tilefuse", "inductor uncaptured", "tilefuse uncaptured"):
            name = backend.split()[0]
            if backend == "tilefuse":
                compiler.reset_stats()
            if backend.endswith("uncaptured"):  # the same graph without the mode, to say what capture adds
                step = cs.make_step(graph, cs._compile(name, graph.fn))
            else:
                step = cs._marking_steps(cs.make_step(graph, cs._compile(f"{name}-reduce-overhead", graph.fn)))
            call = cs.harness.Rotating(step, sets)
            for _ in range(10):
                call()
            torch.cuda.synchronize()
            steps[backend] = call
        recs = [r for p in list(cudagraphs._POOLS) if id(p) not in before for r in p.recordings]
        batched = [(r.copy_at, r.copy_into, r.span_copies, r.one_copies) for r in recs]

        def per_input(on: bool) -> None:  # decision 053's A/B: each input copied span to span, as before it
            for r, (at, into, spans, ones) in zip(recs, batched):
                r.copy_at, r.copy_into, r.span_copies, r.one_copies = \
                    ([], [], r.copied, []) if on else (at, into, spans, ones)

        hosts = {b: [] for b in (*steps, "tilefuse per-input copies")}
        for _ in range(rounds):
            for b, call in steps.items():
                hosts[b].append(host_us(call))
            per_input(True)
            hosts["tilefuse per-input copies"].append(host_us(steps["tilefuse"]))
            per_input(False)
        print(f"== captured: {case} at {rows} rows, host us a step (GPU busy), median of {rounds} alternated "
              f"rounds of {cs.HOST_STEPS} steps (least-most)")
        med = {b: statistics.median(h) for b, h in hosts.items()}
        for b, h in hosts.items():
            print(f"  {b:26} {med[b]:7.1f}  ({min(h):.1f}-{max(h):.1f})")
        summary.append((case, med, [len(r.copied) for r in recs]))
        print(f"  tilefuse / inductor {med['tilefuse'] / med['inductor']:.3f}; captured / uncaptured: tilefuse "
              f"{med['tilefuse'] / med['tilefuse uncaptured']:.3f}, inductor "
              f"{med['inductor'] / med['inductor uncaptured']:.3f}; replays "
              f"{compiler.stats().get('cudagraph_replays')}, uncaptured calls "
              f"{compiler.stats().get('cudagraph_uncaptured_calls')}")
        for r in recs:
            print(f"  tilefuse recording {r.seq}: {len(r.copied)} of {len(r.inputs)} inputs copied "
                  f"({len(r.copy_at)} in one call, {len(r.one_copies)} on their own), {len(r.outputs)} outputs")
        for b, call in steps.items():
            print(f"  {b}: host us a step by op (torch.profiler CPU, 10 steps):")
            print(_host_table(call, steps=10, lines=16))
        del steps, sets
        torch._dynamo.reset()
        torch.cuda.empty_cache()
    print("== captured, host us a step (medians): graph, inductor, tilefuse, tilefuse with per-input copies, "
          "tilefuse / inductor, inputs copied by recording")
    for case, med, copied in summary:
        print(f"  {case:32} {med['inductor']:7.1f} {med['tilefuse']:7.1f} {med['tilefuse per-input copies']:7.1f}"
              f"  {med['tilefuse'] / med['inductor']:.3f}  {copied}")


def replay_parts_section(rows_list=(1024, 32768), rounds: int = 5, device: str = "cuda") -> None:
    """Where a captured step's extra host time goes, without a profiler (torch.profiler's CPU table inflates
    every op, the copies' most): softmax fwd+bwd at ``rows`` x 4096 bf16 under tilefuse, uncaptured and captured
    (the replay-cost rule off), with the GPU busy as the bench measures. Timers around each compiled graph's call
    (``CompiledGraph.__call__``, inclusive) and, captured, around a replay's parts: the input copies, the graph
    launch, the hand-out. What the step costs beyond the graphs' calls is Dynamo's, AOTAutograd's and autograd's.
    Then the same copy and replay called alone, outside the step."""
    import statistics

    from tilefuse.bench import compiler_suite as cs
    from tilefuse.bench.compiler_suite import host_us
    from tilefuse.compiler.runtime import cudagraphs, wrapper

    spent: dict = {}

    def timed(name, fn):
        def call(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                n, us = spent.get(name, (0, 0.0))
                spent[name] = (n + 1, us + (time.perf_counter() - t0) * 1e6)
        return call

    real_call, real_copy, real_hand = wrapper.CompiledGraph.__call__, cudagraphs._copy_inputs, \
        cudagraphs.Recording.hand_out

    @torch.compiler.disable
    def graph_call(self, args):
        return timed(f"{self.kind} graph call", real_call)(self, args)

    class TimedGraph:  # a recording's CUDA graph with its launch timed
        def __init__(self, g):
            self.g, self.replay = g, timed("graph.replay()", g.replay)

    graph = {g.case: g for g in cs.GRAPHS}["softmax_fwd_bwd"]
    before_limit = cudagraphs.FOREACH_ONE_LAUNCH
    cudagraphs.FOREACH_ONE_LAUNCH = 1 << 40  # every input through _copy_inputs, where the timer is
    try:
        with _every_graph_recorded():
            for rows in rows_list:
                sets = [cs.prepare(graph, graph.inputs(rows, cs.COLS, cs.VOCAB, cs.DTYPE, device)) for _ in range(4)]
                for captured in (False, True):
                    known = set(map(id, cudagraphs._POOLS))
                    fn = cs._compile("tilefuse-reduce-overhead" if captured else "tilefuse", graph.fn)
                    step = cs.make_step(graph, fn)
                    call = cs.harness.Rotating(cs._marking_steps(step) if captured else step, sets)
                    for _ in range(10):
                        call()
                    torch.cuda.synchronize()
                    recs = [r for p in list(cudagraphs._POOLS) if id(p) not in known for r in p.recordings]
                    for r in recs:
                        r.graph = TimedGraph(r.graph)
                    wrapper.CompiledGraph.__call__ = graph_call
                    cudagraphs._copy_inputs = timed("input copies", real_copy)
                    cudagraphs.Recording.hand_out = timed("hand-out", real_hand)
                    try:
                        spent.clear()
                        hosts = [host_us(call) for _ in range(rounds)]
                        steps = rounds * cs.HOST_STEPS
                    finally:
                        wrapper.CompiledGraph.__call__ = real_call
                        cudagraphs._copy_inputs, cudagraphs.Recording.hand_out = real_copy, real_hand
                    name = "captured" if captured else "uncaptured"
                    print(f"== replay_parts: softmax fwd+bwd at {rows} rows, tilefuse {name}: host "
                          f"{statistics.median(hosts):.1f} us a step (median of {rounds} rounds of "
                          f"{cs.HOST_STEPS}, GPU busy; {min(hosts):.1f}-{max(hosts):.1f}); timers, us a step (calls a "
                          f"step):")
                    for part, (n, us) in spent.items():
                        print(f"    {part:22} {us / steps:8.1f}  ({n / steps:.1f})")
                    inside = sum(us for part, (n, us) in spent.items() if part.endswith("graph call")) / steps
                    print(f"    {'outside the graph calls':22} {statistics.median(hosts) - inside:8.1f}")
                    for r in recs:
                        r.graph = r.graph.g
                        if r.copy_into:
                            srcs = [t.clone() for t in r.copy_into]
                            with torch.no_grad():
                                alone = host_us(lambda r=r, srcs=srcs: real_copy(r.copy_into, srcs))
                            print(f"    recording {r.seq}: its copies alone {alone:.1f} us (GPU busy), graph.replay() "
                                  f"alone {host_us(r.graph.replay):.1f} us")
                    del call, step, fn
                    torch._dynamo.reset()
                del sets
                torch.cuda.empty_cache()
    finally:
        cudagraphs.FOREACH_ONE_LAUNCH = before_limit


def copies_section() -> None:
    """A replay's input copies alone (decision 053): host µs a call with the GPU busy and wall µs with it idle,
    for the inputs of two compiler-suite graphs at 1024 rows: one ``copy_`` an input into the recorded view,
    the same through a 1-d span view of each (the runtime's ``_copy_span``, the form before 053), and the runtime's
    ``_copy_inputs`` (one ``torch._foreach_copy_``)."""
    import statistics

    from tilefuse.bench.compiler_suite import host_us
    from tilefuse.compiler.runtime import cudagraphs

    bf16 = torch.bfloat16
    shapes = {"layer_norm (x, weight, bias)": [(1024, 4096), (4096,), (4096,)],
              "attention_projections (x, 4 weights)": [(1024, 4096)] + [(4096, 4096)] * 4,
              "one small input": [(8, 64)], "six small inputs": [(8, 64)] * 6}
    print("== copies: a replay's input copies, host us a call (GPU busy) / wall us a call (GPU idle)")
    for name, sh in shapes.items():
        srcs = [torch.randn(s, device="cuda", dtype=bf16) for s in sh]
        dsts = [torch.empty_like(t) for t in srcs]
        spans = [d.view(-1) for d in dsts]

        def each():
            for d, t in zip(dsts, srcs):
                d.copy_(t)

        def each_span():
            for sp, t in zip(spans, srcs):
                cudagraphs._copy_span(sp, t)

        def one():
            cudagraphs._copy_inputs(dsts, srcs)

        for label, fn in (("copy_ each", each), ("copy_ each through a span view", each_span),
                          ("one _foreach_copy_", one)):
            busy = statistics.median([host_us(fn, steps=50) for _ in range(5)])
            print(f"  {name:40} {label:32} {busy:7.1f} / {per_call_us(fn, 500):7.1f}")


def pool_section() -> None:
    import gc

    import torch.nn as nn

    print("== pool: MLP 1024-2048-1024 + AdamW, batch 64: MiB allocated after each phase (peak within it)")
    for mode in (None, "reduce-overhead"):
        torch.manual_seed(4)
        torch._dynamo.reset()
        gc.collect()
        torch.cuda.empty_cache()
        model = nn.Sequential(nn.Linear(1024, 2048), nn.GELU(), nn.LayerNorm(2048), nn.Linear(2048, 1024)).cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        compiled = torch.compile(model, backend="tilefuse", **({"mode": mode} if mode else {}))
        x, target = torch.randn(64, 1024, device="cuda"), torch.randn(64, 1024, device="cuda")
        p_mib = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
        print(f"  mode {mode or 'default'} (parameters {p_mib:.1f} MiB)")
        for s in range(4):
            phases = []

            def mark(name):
                torch.cuda.synchronize()
                phases.append(f"{name} {torch.cuda.memory_allocated() / 2**20:.1f} "
                              f"({torch.cuda.max_memory_allocated() / 2**20:.1f})")
                torch.cuda.reset_peak_memory_stats()

            mark("start")
            opt.zero_grad()
            mark("zero_grad")
            loss = nn.functional.mse_loss(compiled(x), target)
            mark("forward")
            loss.backward()
            mark("backward")
            opt.step()
            mark("opt.step")
            grads = [p.grad for p in model.parameters()]
            from tilefuse.compiler.runtime import cudagraphs

            pool_ptrs = set()
            for pool in list(cudagraphs._POOLS):
                for r in pool.recordings:
                    pool_ptrs |= r.owned_ptrs
            in_pool = sum(cudagraphs._storage_key(g) in pool_ptrs for g in grads if g is not None)
            print(f"    step {s}: " + ", ".join(phases) + f"; grads in a recording's memory: {in_pool}/{len(grads)}; "
                  f"pools hold {cudagraphs.pools_held_bytes() / 2**20:.1f} MiB")
            del loss
        from tilefuse import compiler

        for r in compiler.stats().get("cudagraphs", []):
            print(f"    {r}")
        del model, opt, compiled, x, target


def _gpt2_decode(device: str, dtype: torch.dtype, tiny: bool):
    """GPT-2 (124M, or tiny) with random weights, a prompt (512 tokens, 16 tiny) and one decode step's token."""
    from tilefuse.bench import models_suite as ms

    torch.manual_seed(0)
    base = ms._gpt2(tiny).to(device, dtype).eval()
    vocab = base.config.vocab_size
    prompt = torch.randint(0, vocab, (1, 16 if tiny else 512), device=device)
    return base, prompt, {"input_ids": torch.randint(0, vocab, (1, 1), device=device)}


def decode_section(device: str = "cuda", tiny: bool = False) -> None:
    """One decode step of GPT-2 124M as the models suite times it (batch 1 after a 512-token prompt, static KV
    cache, bf16) under each backend: wall a step with the GPU idle, host time with it busy, GPU time; for
    tilefuse, its CUDA-graph report and cProfile of the step. (``device="cpu", tiny=True``: the same on the
    interpreter with a tiny model, to check this function without a GPU.)"""
    import copy

    from tilefuse import compiler
    from tilefuse.bench import models_suite as ms
    from tilefuse.bench.compiler_suite import host_us, kernel_ms

    cuda = device == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    print(f"== decode: GPT-2{' (tiny)' if tiny else ' 124M'}, batch 1, one token after a prompt, static KV cache")
    base, prompt, ids = _gpt2_decode(device, dtype, tiny)
    _attention_call_probe(device)
    if cuda:
        _decode_parts_probe()
    for backend in ("eager", "inductor", "inductor-reduce-overhead", "tilefuse", "tilefuse-reduce-overhead"):
        if backend.startswith("inductor") and not cuda:
            continue
        torch._dynamo.reset()
        compiler.reset_stats()
        try:
            r = ms.Runner(copy.deepcopy(base), backend, "decode", dtype, torch.device(device), prompt=prompt)

            def step(r=r):
                r.step(ids)

            for _ in range(3):
                step()
            line = f"  {backend}: wall (GPU idle) {per_call_us(step, 20) if cuda else float('nan'):.0f} us"
            if cuda:
                gpu = kernel_ms(step, 3, 1)[0] * 1e3
                line += f", host (GPU busy) {host_us(step, steps=3):.0f} us, GPU {gpu:.0f} us"
            print(line)
            if cuda and backend.endswith("reduce-overhead"):
                print("    GPU time by kernel, a step:")
                print(_kernel_table(step))
            if backend.startswith("tilefuse"):
                s = compiler.stats()
                print(f"    kernels {s.get('kernels')}, externs {s.get('externs')}, fallbacks "
                      f"{len(s.get('fallbacks', []))}")
                for g in s.get("cudagraphs", []):
                    print(f"    cuda graph {g}")
                print("    cProfile, 20 steps (tottime):")
                print(_profile(step, 20, 22))
                print("    cProfile, 20 steps (cumtime):")
                print(_profile(step, 20, 30, "cumtime"))
        except Exception as exc:  # noqa: BLE001 - a report line, the next backend still runs
            import traceback

            print(f"  {backend}: failed: {type(exc).__name__}: {str(exc)[:300]}")
            traceback.print_exc(limit=8)


def _launchless_backend():
    """A torch.compile backend through Dynamo and AOTAutograd whose compiled forward and backward launch nothing:
    the first call runs the ATen graph, later calls hand out empty tensors laid out as its outputs were. A step
    under it costs what any backend's step costs beyond its graphs' own work (Dynamo's frame and guards,
    AOTAutograd's runtime wrappers, the autograd engine, the outputs' allocation)."""
    from torch._dynamo.backends.common import aot_autograd

    def compile_graph(gm, example_inputs):
        layout: list = []

        def call(args):
            if not layout:
                outs = gm(*args)
                layout.extend((o.shape, o.stride(), o.dtype, o.device) if isinstance(o, torch.Tensor) else (o,)
                              for o in outs)
                return outs
            return [torch.empty_strided(*m[:2], dtype=m[2], device=m[3]) if len(m) == 4 else m[0] for m in layout]

        call._boxed_call = True  # AOTAutograd's convention: the arguments come as one list
        return call

    return aot_autograd(fw_compiler=compile_graph, bw_compiler=compile_graph)


def _alternated_medians(calls: dict, rounds: int, measure, indent: str) -> dict:
    """``measure(call)`` of each of ``calls`` in ``rounds`` alternated rounds (the compiler bench's
    :func:`alternated`); prints each one's median and range (least-most) and returns the medians by name."""
    import statistics

    from tilefuse.bench import compiler_suite as cs

    samples = cs.alternated(calls, measure, rounds)
    for name, v in samples.items():
        print(f"{indent}{name:12} {statistics.median(v):7.1f}  ({min(v):.1f}-{max(v):.1f})")
    return {name: statistics.median(v) for name, v in samples.items()}


def floor_section(case: str = "softmax_fwd_bwd", rows: int = 1024, rounds: int = 7, device: str = "cuda") -> None:
    """How low a compiled step's host time can go: the compiler suite's ``case`` at ``rows`` rows, host us a step
    (GPU busy, as the suite measures) under eager, a backend whose graphs launch nothing
    (:func:`_launchless_backend`), tilefuse and Inductor, each also with ``mode="reduce-overhead"`` (tilefuse
    under its replay-cost rule), in alternated rounds; beside it each step's GPU time, its wall time (host and GPU
    overlapping: what capture does to the step) and what tilefuse's rule did with each graph (on the CPU: eager
    and the launchless backend, wall time). Where the launchless step's host time exceeds the kernels' GPU time,
    no backend's per-graph capture can make the step reach its kernels' time."""
    import statistics

    from tilefuse import compiler
    from tilefuse.bench import compiler_suite as cs
    from tilefuse.bench import runner

    cuda = device == "cuda"
    opts = runner.SuiteOptions(rows=rows, log=lambda s: None)
    graph = {g.case: g for g in cs.GRAPHS}[case]
    dims = cs._sizes(opts, graph)
    sets = [cs.prepare(graph, graph.inputs(*dims[:3], dims[3], device)) for _ in range(4)]
    torch._dynamo.reset()
    compiler.reset_stats()
    backends = {"eager": (None, None), "launchless": (_launchless_backend(), None)}
    if cuda:
        backends.update({"tilefuse": ("tilefuse", None), "tilefuse-ro": ("tilefuse", "reduce-overhead"),
                         "inductor": ("inductor", None), "inductor-ro": ("inductor", "reduce-overhead")})
    steps = {}
    for name, (backend, mode) in backends.items():
        fn = graph.fn if backend is None else torch.compile(graph.fn, backend=backend, mode=mode)
        steps[name] = cs.harness.Rotating(cs.make_step(graph, fn), sets)
        for _ in range(30):  # (tilefuse-ro: a step trial takes ~15 steps)
            steps[name]()
    if cuda:
        torch.cuda.synchronize()

    measure = cs.host_us if cuda else (lambda call: _cpu_us(call, cs.HOST_STEPS))
    how = "GPU busy" if cuda else "wall, CPU tensors"
    print(f"== floor: {case} at {rows} rows, host us a step ({how}), median of {rounds} alternated rounds of "
          f"{cs.HOST_STEPS} steps (least-most)")
    hosts = _alternated_medians(steps, rounds, measure, "  ")
    if cuda:
        compiled = {name: step for name, step in steps.items() if name != "launchless"}
        gpus = {name: statistics.median(cs.kernel_ms(step)) * 1e3 for name, step in compiled.items()}
        for name, us in gpus.items():
            print(f"  {name}'s GPU time a step: {us:.1f} us")
        print(f"  tilefuse-ro's step host time is {hosts['tilefuse-ro'] / hosts['tilefuse']:.2f}x tilefuse's")
        print(f"  wall us a step (host and GPU overlapping: per_call_us, the best of 3 runs of 50 steps queued, "
              f"then synced), median of {rounds} alternated rounds (least-most):")
        wall = _alternated_medians(compiled, rounds, lambda step: per_call_us(step, 50), "    ")
        print(f"    tilefuse-ro / tilefuse {wall['tilefuse-ro'] / wall['tilefuse']:.3f}, inductor-ro / inductor "
              f"{wall['inductor-ro'] / wall['inductor']:.3f}, tilefuse-ro / inductor-ro "
              f"{wall['tilefuse-ro'] / wall['inductor-ro']:.3f}")
        for r in compiler.stats()["cudagraphs"]:
            print(f"  tilefuse-ro graph {r['graph_id']} ({r['kind']}): captured {r['captured']}, "
                  f"{r['replays']} replays, uncaptured call timed at {r['call_us']} us of host time and "
                  f"{r['call_gpu_us']} us of GPU time; uncaptured {dict(r['uncaptured'])}")
            if r.get("step_trial"):
                print(f"    {r['step_trial']}")
        gpu, floor = gpus["tilefuse"], hosts["launchless"]
        print(f"  tilefuse's kernels: {gpu:.1f} us of GPU time a step; the launchless step's host time is "
              f"{floor / gpu:.2f}x that, so a step whose host time is at that floor runs its kernels at "
              f"{min(1.0, gpu / floor):.0%} of their time at best")


def latency_rows_section(device: str = "cuda", tiny: bool = False) -> None:
    """Decision 049's setting for row reductions over fewer rows than SMs, A/B: the captured tilefuse decode step
    of GPT-2 124M compiled with ``latency_rows_thread_elems`` 8 and 4, loads first off, and 8 again (the drift):
    GPU time a step (the best of three) and the generated kernels' rows of the kernel table. Each variant is
    timed before the next compiles: Dynamo keeps one cache a code object, so a later compile of the same
    ``forward`` would serve every earlier model too (the parameters are graph inputs, not guarded by identity)."""
    import copy

    from tilefuse.bench import models_suite as ms
    from tilefuse.bench.compiler_suite import kernel_ms
    from tilefuse.compiler.tuning import tuning

    cuda = device == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    print("== latency_rows: captured tilefuse decode step, latency_rows_thread_elems / latency_rows_loads_first")
    base, prompt, ids = _gpt2_decode(device, dtype, tiny)
    variants = (("elems 8, loads first", dict(latency_rows_thread_elems=8, latency_rows_loads_first=True)),
                ("elems 4, loads first", dict(latency_rows_thread_elems=4, latency_rows_loads_first=True)),
                ("elems 8, in order", dict(latency_rows_thread_elems=8, latency_rows_loads_first=False)),
                ("elems 8, loads first (again)", dict(latency_rows_thread_elems=8, latency_rows_loads_first=True)))
    for label, settings in variants:
        torch._dynamo.reset()
        with tuning(**settings):  # the graphs compile (and capture) on the first steps, inside the block
            r = ms.Runner(copy.deepcopy(base), "tilefuse-reduce-overhead", "decode", dtype, torch.device(device),
                          prompt=prompt)

            def step(r=r):
                r.step(ids)

            for _ in range(3):
                step()
            best = min(kernel_ms(step, 3, 1)[0] * 1e3 for _ in range(3)) if cuda else float("nan")
            print(f"  {label}: GPU {best:.1f} us a step")
            if cuda:
                rows = [line for line in _kernel_table(step, lines=200).splitlines()
                        if "tfk_" in line or "in all" in line]  # the generated kernels (layer norms: tfk_red_*varmean*)
                print("\n".join(rows))
        del r


def train_section(batch: int = 1, backends: tuple = ("inductor-reduce-overhead", "tilefuse-reduce-overhead")) -> None:
    """One training step of GPT-2 124M as the models suite times it, captured, under Inductor and tilefuse: wall
    a step with the GPU idle, GPU time, the GPU's time by kernel (the 40 biggest) and cProfile of 10 steps."""
    import copy

    from tilefuse import compiler
    from tilefuse.bench import models_suite as ms
    from tilefuse.bench.compiler_suite import kernel_ms

    print(f"== train: GPT-2 124M, batch {batch}, 512 tokens, bf16 autocast, AdamW")
    torch.manual_seed(0)
    base = ms._gpt2(False).train()
    kwargs = ms._tokens(base.config.vocab_size, 512)(base, batch, "cuda")
    for backend in backends:
        torch._dynamo.reset()
        compiler.reset_stats()
        try:
            t0 = time.perf_counter()
            r = ms.Runner(copy.deepcopy(base).cuda(), backend, "train", torch.bfloat16, torch.device("cuda"))

            def step(r=r):
                r.step(kwargs)

            for _ in range(3):
                step()
            torch.cuda.synchronize()
            compile_s = time.perf_counter() - t0
            gpu = kernel_ms(step, 3, 1)[0] * 1e3
            print(f"  {backend}: first 3 steps {compile_s:.0f} s, wall (GPU idle) {per_call_us(step, 10):.0f} us, "
                  f"GPU {gpu:.0f} us")
            print("    GPU time by kernel, a step:")
            print(_kernel_table(step, steps=3, lines=40))
            if backend.startswith("tilefuse"):
                for g in compiler.stats().get("cudagraphs", []):
                    print(f"    cuda graph {g}")
            print("    host time by op and autograd node (torch.profiler's CPU activity, both threads), a step:")
            print(_host_table(step))
            print("    cProfile, 10 steps (tottime; the main thread: a backward runs on autograd's thread):")
            print(_profile(step, 10, 30))
            print("    cProfile, 10 steps (cumtime):")
            print(_profile(step, 10, 45, "cumtime"))
            del r
        except Exception as exc:  # noqa: BLE001 - a report line, the next backend still runs
            import traceback

            print(f"  {backend}: failed: {type(exc).__name__}: {str(exc)[:300]}")
            traceback.print_exc(limit=8)


def direct_calls_section() -> None:
    """Decision 038 measured: GPT-2 124M's uncaptured decode step (batch 1, static KV cache, bf16) compiled with
    the wrapper calling the attention ops' functions, and again with it calling the ops, wall us a step with the
    GPU idle, alternated in one process (the best of each)."""
    import copy

    from tilefuse.bench import models_suite as ms
    from tilefuse.compiler import lowering

    print("== direct_calls: GPT-2 124M decode step, tilefuse default mode, attention ops called directly or not")
    base, prompt, ids = _gpt2_decode("cuda", torch.bfloat16, False)
    saved = dict(lowering.DIRECT_CALLS)
    steps = {}
    torch._dynamo.reset()
    for label, table in (("direct", saved), ("through the op", {})):  # (the wrapper binds its calls when planned)
        lowering.DIRECT_CALLS.clear()
        lowering.DIRECT_CALLS.update(table)
        r = ms.Runner(copy.deepcopy(base), "tilefuse", "decode", torch.bfloat16, torch.device("cuda"), prompt=prompt)
        for _ in range(3):
            r.step(ids)
        steps[label] = r
    lowering.DIRECT_CALLS.clear()
    lowering.DIRECT_CALLS.update(saved)
    best = {label: float("inf") for label in steps}
    for _ in range(3):
        for label, r in steps.items():
            best[label] = min(best[label], per_call_us(lambda r=r: r.step(ids), 20))
    print("  " + ", ".join(f"{label}: {us:.0f} us a step" for label, us in best.items()))


def _attention_call_probe(device: str) -> None:
    """Host us of one attention forward at GPT-2's decode shape (one query row against a 520-slot cache, bf16)
    and of its parts: through the custom op (what the compiled graph calls), the op's Python function without
    the dispatcher, the argument checks, the plan, and the launch with both prepared."""
    from tilefuse.kernels.attention import launch as attn_launch
    from tilefuse.kernels.attention import ops as attn_ops

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    q = torch.randn(1, 12, 1, 64, device=device, dtype=dtype)
    k, v = (torch.randn(1, 12, 520, 64, device=device, dtype=dtype) for _ in range(2))
    mask = torch.ones(1, 1, 1, 520, device=device, dtype=torch.bool)
    args = (q, k, v, mask, None, 0.125, 0.0, 0, -1, -1, 0.0)
    params, mask_view, _ = attn_ops._params(q, k, v, mask, None, 0.125, 0.0, 0, -1, -1, 0.0, 0)
    plan = attn_launch.plan_forward(params, dtype)
    timer = per_call_us if device == "cuda" else (lambda fn, calls=200: _cpu_us(fn, calls))
    print("  attention forward at the decode shape (us a call):")
    print(f"    torch.ops.tilefuse.attention_fwd: {timer(lambda: torch.ops.tilefuse.attention_fwd(*args), 300):.1f}")
    impl = getattr(attn_ops.attention_fwd, "_init_fn", None)
    if impl is not None:
        print(f"    its Python function, no dispatcher: {timer(lambda: impl(*args), 300):.1f}")
    print(f"    argument checks (_params): "
          f"{timer(lambda: attn_ops._params(q, k, v, mask, None, 0.125, 0.0, 0, -1, -1, 0.0, 0), 300):.1f}")
    print(f"    plan_forward: {timer(lambda: attn_launch.plan_forward(params, dtype), 300):.1f}")
    print(f"    forward(plan given), {plan}: "
          f"{timer(lambda: attn_launch.forward(q, k, v, params, mask_view, None, plan), 300):.1f}")


def _decode_parts_probe() -> None:
    """Host us a call of the other pieces an uncaptured decode step makes many of, at GPT-2's shapes (bf16):
    the GEMM without an epilogue (16 a step through torch.matmul with out=) against torch.mm and torch.addmm;
    the library's repeat call; the KV-cache write (24 a step); a view (~165 a step) and an allocation."""
    from tilefuse.compiler.runtime import wrapper as W
    from tilefuse.kernels import indexing

    dt, dev = torch.bfloat16, "cuda"
    a, b = torch.randn(1, 768, device=dev, dtype=dt), torch.randn(768, 2304, device=dev, dtype=dt)
    bias, o = torch.randn(2304, device=dev, dtype=dt), torch.empty(1, 2304, device=dev, dtype=dt)
    a3, o3 = a.view(1, 1, 768), o.view(1, 1, 2304)
    cache = torch.zeros(1, 12, 520, 64, device=dev, dtype=dt)
    pos = torch.tensor([511], device=dev)
    val = torch.randn(1, 12, 1, 64, device=dev, dtype=dt)
    empty = torch._C._dynamo.guards._empty_strided_cuda
    print("  the decode step's other pieces (us a call):")
    for name, fn in (("torch.matmul(a, b, out=) 1x768 @ 768x2304", lambda: torch.matmul(a, b, out=o)),
                     ("the same, a 3-D (1, 1, 768)", lambda: torch.matmul(a3, b, out=o3)),
                     ("torch.mm(a, b, out=)", lambda: torch.mm(a, b, out=o)),
                     ("torch.addmm(bias, a, b, out=)", lambda: torch.addmm(bias, a, b, out=o)),
                     ("tilefuse.gemm(a, b, out=) (library, repeat call)", lambda: tilefuse.gemm(a, b, out=o)),
                     ("indexing.index_put_ (the KV-cache write)",
                      lambda: indexing.index_put_(cache, (None, None, pos), val)),
                     ("aten index_put_ (the same write)",
                      lambda: torch.ops.aten.index_put_.default(cache, (None, None, pos), val)),
                     ("x.as_strided (a view)", lambda: cache.as_strided((12, 520, 64), (33280, 64, 1), 0)),
                     ("wrapper view (_reinterpret_tensor)", lambda: W.view_of(cache, (12, 520, 64), (33280, 64, 1), 0)),
                     ("_empty_strided_cuda (1, 2304) bf16", lambda: empty((1, 2304), (2304, 1), dt)),
                     ("torch.empty (1, 2304) bf16", lambda: torch.empty((1, 2304), device=dev, dtype=dt))):
        try:
            print(f"    {name}: {per_call_us(fn, 2000):.2f}")
        except Exception as exc:  # noqa: BLE001 - a report line
            print(f"    {name}: failed: {type(exc).__name__}: {str(exc)[:200]}")


def sites_section(case: str = "attention_projections_fwd_bwd", rows: int = 1024, device: str = "cuda",
                  calls: int = 20, rounds: int = 5, profiled: int = 50) -> None:
    """Where an uncaptured compiled step's graph calls spend their host time: the compiler suite's ``case`` at
    ``rows`` rows under tilefuse, host us (GPU busy, as the suite measures) of the step, of each compiled graph's
    wrapper call alone, and of each launch site of it called alone with the arguments it had in a step; for a
    GEMM site also what it calls (``torch.matmul`` into ``out``, the kept plan's run, the library's full call)
    and ``torch.mm`` allocating its output, as eager's linear does; then cProfile of the wrapper calls."""
    from tilefuse.bench import compiler_suite as cs
    from tilefuse.bench import runner
    from tilefuse.compiler.runtime import gemm as rt_gemm

    cuda = device == "cuda"
    opts = runner.SuiteOptions(rows=rows, log=lambda s: None, smoke=not cuda)  # (smoke: the interpreter's sizes)
    graph = {g.case: g for g in cs.GRAPHS}[case]
    dims = cs._sizes(opts, graph)
    sets = [cs.prepare(graph, graph.inputs(*dims[:3], dims[3], device)) for _ in range(4)]
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    with _collecting_graphs() as made:
        step = cs.harness.Rotating(cs.make_step(graph, torch.compile(graph.fn, backend="tilefuse")), sets)
        for _ in range(10):
            step()
    sync()

    def host(call) -> float:
        return min((cs.host_us(call, calls) if cuda else _cpu_us(call, calls)) for _ in range(rounds))

    how = "GPU busy" if cuda else "wall, on the CPU"
    print(f"== sites: {case} at {rows} rows under tilefuse, host us ({how}, best of {rounds} rounds of {calls} "
          f"calls)")
    print(f"  the step: {host(step):.1f}")
    for g in made:
        if g.plan is None:
            print(f"  graph {g.graph_id} ({g.kind}): no static plan")
            continue
        glb = g.plan.generic.__globals__
        sites = {k: v for k, v in glb.items() if k.startswith("launch_")}
        seen: dict = {}
        graph_args: list = []
        for k, site in sites.items():
            def spy(*args, k=k, site=site):
                seen[k] = args
                return site(*args)
            glb[k] = spy
        real_call = g.plan.call
        g.plan.call = g.plan.generic  # (the inlined call has the sites written in; the generic one looks them up)
        real_run = g.run

        def run(args, real_run=real_run):
            graph_args.append(list(args))
            return real_run(args)
        g.run = run
        try:
            step()
            sync()
        finally:
            glb.update(sites)
            g.plan.call = real_call
            del g.run
        if not graph_args:
            print(f"  graph {g.graph_id} ({g.kind}): not called in a step")
            continue
        args = graph_args[-1]
        no_grad = torch.no_grad()  # (AOTAutograd calls the graphs with grad mode off)
        no_grad.__enter__()
        print(f"  graph {g.graph_id} ({g.kind}), {len(sites)} launch sites: wrapper call "
              f"{host(lambda: g.plan.call(list(args))):.1f}, through the generic wrapper "
              f"{host(lambda: g.plan.generic(list(args))):.1f}")
        for k, site in sites.items():
            if k not in seen:
                continue
            a = seen[k]
            line = f"    {k} ({type(site).__name__}): {host(lambda: site(*a)):.1f}"
            if isinstance(site, rt_gemm.GemmSite):
                x, w, extras, out = a
                line += f"; pad {site.pad}, hook {site.hook is not None}, kept plan {site.plan is not None}"
                line += f"; torch.matmul(out=) {host(lambda: torch.matmul(x, w, out=out)):.1f}"
                line += f", torch.mm {host(lambda: torch.mm(x, w)):.1f}"
                if site.plan is not None:
                    line += (f", the kept plan's run "
                             f"{host(lambda: site.plan.run(x, w, None, None, None, None, extras, out, 1.0, 1.0)):.1f}")
                    line += _plan_launch_parts(site.plan, x, w, extras, out, host)
                elif cuda and site.hook is None:
                    line += _library_gemm_parts(x, w, out, host)
                line += f"; shapes {tuple(x.shape)}x{tuple(w.shape)} strides {x.stride()} {w.stride()}"
            print(line)
        print(f"  cProfile, {profiled} calls of graph {g.graph_id}'s wrapper (tottime):")
        print(_profile(lambda: g.plan.call(list(args)), profiled, lines=14))
        no_grad.__exit__(None, None, None)
        sync()


def _plan_launch_parts(plan, x, w, extras, out, host) -> str:
    """A kept GEMM plan's launches taken apart: each one's host-made TMA descriptors and its launcher alone with
    the arguments prepared (Triton's C launcher encodes a host descriptor's tensor map each launch)."""
    parts = []
    values = [x, w, None, None, None, None, None, None, None, None, out, None, None, None, None, None, None,
              plan.dummy, None]
    for i, e in enumerate(extras):
        values[6 + i] = e
    stream = L.current_stream(plan.device_index)
    for c in plan.launches:
        if c.direct is None:
            parts.append("not bound")
            continue
        args = list(c.direct_args)
        for i, r in c.ptr_slots:
            args[i] = values[r].data_ptr()
        for i, r in c.value_slots:
            args[i] = 1.0
        for i, r, (shape, strides, _) in c.desc_slots:
            args[i] = L.HostDescriptor(values[r], shape, strides)
        parts.append(f"{len(c.desc_slots)} host descriptors, launcher alone {host(lambda: c.direct.launch(stream, args)):.1f}"
                     f", via_run {getattr(c.direct, 'via_run', None)}")
    return " (" + "; ".join(parts) + ")"


def _library_gemm_parts(x, w, out, host) -> str:
    """What a GEMM site with no epilogue would cost on the library's GEMM instead of cuBLAS, and cuBLAS under
    each of torch's BLAS back ends."""
    text = ""
    try:
        P.gemm_call(x, w, out=out)
        text += f", tilefuse.gemm into out {host(lambda: P.gemm_call(x, w, out=out)):.1f}"
    except Exception as exc:  # noqa: BLE001 - a probe: report and go on
        text += f", tilefuse.gemm: {type(exc).__name__}: {str(exc)[:120]}"
    before = torch.backends.cuda.preferred_blas_library()
    try:
        for lib in ("cublas", "cublaslt"):
            torch.backends.cuda.preferred_blas_library(lib)
            torch.mm(x, w)
            text += f", torch.mm under {lib} {host(lambda: torch.mm(x, w)):.1f}"
    finally:
        torch.backends.cuda.preferred_blas_library(before)
    return text + f" (preferred: {before})"


def _cpu_us(fn, calls: int) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


SECTIONS = {"gemm": gemm_section, "compiler": compiler_section, "launch": launch_section,
            "graphs": graphs_section, "captured": captured_section,
            "captured_32768": lambda: captured_section(rows=32768),
            "captured_softmax": lambda: captured_section(cases=["softmax_fwd_bwd"]),
            "captured_softmax_32768": lambda: captured_section(cases=["softmax_fwd_bwd"], rows=32768),
            "copies": copies_section, "replay_parts": replay_parts_section, "floor": floor_section,
            "floor_gemm": lambda: floor_section(case="attention_projections_fwd_bwd"),
            "floor_rms": lambda: floor_section(case="rms_norm_fwd_bwd"), "sites": sites_section,
            "pool": pool_section, "decode": decode_section,
            "train": train_section, "latency_rows": latency_rows_section,
            "train-tilefuse": lambda: train_section(backends=("tilefuse-reduce-overhead",)), "direct_calls": direct_calls_section}


def main() -> int:
    if not torch.cuda.is_available():
        print("host_time.py needs a GPU")
        return 2
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    wanted = sys.argv[1:] or ["gemm", "compiler"]
    unknown = [w for w in wanted if w not in SECTIONS]
    if unknown:
        print(f"unknown section(s) {unknown}; sections: {sorted(SECTIONS)}")
        return 2
    for section in (SECTIONS[w] for w in wanted):
        try:
            section()
        except Exception as exc:  # noqa: BLE001 - report and go on to the next section
            import traceback

            print(f"== {section.__name__} FAILED: {type(exc).__name__}: {exc}")
            traceback.print_exc()
    return 0


if __name__ == "__main__":
    sys.exit(main())
