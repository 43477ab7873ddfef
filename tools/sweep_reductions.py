"""Sweep the code generator's reduction choices (the compiler's tuning table) on the bench graphs' forward + backward.

GPU (an H200 image: system python, PYTHONPATH=checkout, nothing installed):

    python tools/sweep_reductions.py [--graphs layer_norm,rms_norm,...] [--settings default,run5,...]
                                       [--budget-s 70] [--json out.json]

compiles the given compiler-suite graphs (default: layer_norm / rms_norm / gelu_chain / residual_layer_norm
fwd+bwd; any case of tilefuse.bench.compiler_suite, forward-only or ``*_fwd_bwd``) at 32768 x 4096 bf16 under each
setting (and Inductor once), checks every output and gradient against float32 eager (the bench's rule), and
prints per setting the step time (CUDA events, median of 3 rounds of 10 steps) and each kernel's CUDA time
(torch.profiler, 5 steps). Settings run in the order given (a setting only on the graphs it can change),
each in a try block: a failing one is reported and the sweep goes on. Past ``--budget-s`` seconds from the
start no new measurement starts (the rest are reported as skipped); a watchdog ends the process (exit 3)
20 s later, whatever hangs. Nothing depends on caches being
warm or cold (TILEFUSE_CACHE_DIR is whatever the caller set).

CPU (no GPU needed):

    python tools/sweep_reductions.py --inspect [--graphs ...] [--settings ...] [--source] [--rows N]

plans the same graphs for an H200-like target from fake tensors (nothing runs), prints each forward and
backward kernel's form, grid, blocks and warps, and cross-compiles it for sm_90 (registers and spills from
cuobjdump); ``--source`` prints the kernels.
"""
from __future__ import annotations

import argparse
import faulthandler
import json
import os
import sys
import threading
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

START = time.monotonic()
# graphs are the compiler suite's cases (tilefuse.bench.compiler_suite.GRAPHS): a forward-only case or a
# "<name>_fwd_bwd" one; the default is the four fwd+bwd graphs whose backward reduces columns
GRAPHS = ("layer_norm_fwd_bwd", "rms_norm_fwd_bwd", "gelu_chain_fwd_bwd", "residual_layer_norm_fwd_bwd")

# name -> (tuning(**overrides), the graphs it can change or None for all). Inductor runs right after
# the first setting. DEFAULT_SETTINGS (run with no --settings, ~45 s) are the default, its run 7 predecessor
# and the two load-order alternatives; the rest are reachable with --settings.
NORMS = ("layer_norm_fwd_bwd", "rms_norm_fwd_bwd", "residual_layer_norm_fwd_bwd", "layer_norm_gelu_fwd_bwd")
GELU = ("gelu_chain_fwd_bwd",)
# graphs whose kernels include a row reduction in the persistent form (rows of <= PERSISTENT_MAX_R), and the
# looped form (cross-entropy's 32000-wide rows)
ROWS = ("softmax", "log_softmax", "layer_norm", "rms_norm", "softmax_layer_norm", "residual_layer_norm",
        "softmax_fwd_bwd", "log_softmax_fwd_bwd", "layer_norm_fwd_bwd", "rms_norm_fwd_bwd",
        "residual_layer_norm_fwd_bwd", "layer_norm_gelu_fwd_bwd")
LONG_ROWS = ("cross_entropy", "cross_entropy_fwd_bwd")
# graphs that work on a tensor's last dim only, so that --seq may view their (rows, cols) inputs as a model's
# (batch, sequence, hidden) activations
SEQUENCE_GRAPHS = ROWS + ("gelu_chain", "silu_chain", "gelu_chain_fwd_bwd", "silu_chain_fwd_bwd")
SETTINGS = {
    "default": ({}, None),
    # run 7's defaults (benchmarks/results/run7/sweep_reductions.json "default"): column steps 256 x 16 at
    # warps() (16), a first stage of <= 256 rows persistent whatever its programs, row-loop loads where first
    # used (after a tl.sum), 8 x 128 pointwise tiles
    "run7_default": (dict(outer_xblock=256, outer_rblock=16, outer_warps=0, outer_persistent_max_waves=1 << 30,
                          rowloop_loads_first=False, tile_contiguous_xblock=128), None),
    "no_loads_first": (dict(rowloop_loads_first=False), ("layer_norm", "residual_layer_norm")),
    "loads_first_all": (dict(persistent_loads_first=True), NORMS),
    # run 5's choices: 64 chunks of 512 rows, first stages as separate persistent kernels (8 columns x 512
    # rows), no fusion of a first stage into a sibling: reproduced run 5's profile in run 7
    "run5": (dict(columns_into_rows=False, split_siblings=False, split_outer_chunks=1, outer_persistent_max_r=8192,
                  outer_persistent_max_waves=1 << 30, outer_run_bytes=1), None),
    # separate first-stage kernels in the column forms (what the fusions alone are worth)
    "no_fusion": (dict(columns_into_rows=False, split_siblings=False), None),
    # gelu's fused column kernel: persistent (run 7: 744 us), 256 x 16 steps (547), 8 warps a 64 x 8 step
    "cols_persistent": (dict(outer_persistent_max_waves=1 << 30), GELU),
    "cols_256x16": (dict(outer_xblock=256, outer_rblock=16, outer_warps=0), GELU),
    "cols_w8": (dict(outer_warps=8), GELU),
    "cols_64x16": (dict(outer_rblock=16), GELU),
    "tiles_8x128": (dict(tile_contiguous_xblock=128), GELU),
    "rowloop_8warps": (dict(rowloop_warps=8), NORMS),
    "rowloop_2rows": (dict(rowloop_rows=2), NORMS),
    "rowloop_1row": (dict(rowloop_heavy_cost=1 << 30), NORMS),  # one row a step whatever the cost (run 20)
    "rowloop_prefetch": (dict(rowloop_prefetch=True), NORMS),  # the next step's row loads a step ahead
    "rowloop_prefetch_8warps": (dict(rowloop_prefetch=True, rowloop_warps=8), NORMS),
    "rowloop_prefetch_1row": (dict(rowloop_prefetch=True, rowloop_heavy_cost=1 << 30), NORMS),
    # after run 21 (prefetch on by default): the prefetch off, and fewer warps a row (more elements and column
    # partial sums a thread, fewer cross-warp exchanges a row sum), alone and with the paired row sums
    "no_prefetch": (dict(rowloop_prefetch=False), NORMS + GELU),
    "rowloop_4warps": (dict(rowloop_warps=4), NORMS),
    # a 1024-thread program (64 registers a thread at most): layer_norm_gelu's two-row step at 8 elements a
    # thread, 32 warps an SM instead of 16 (its backward is latency-bound at 16: run 43), with and without
    # the prefetch (whose registers then spill: 32 bytes of stack with it, 8 without; sm_90a)
    "rowloop_32warps": (dict(rowloop_warps=32, rowloop_prefetch=False), NORMS),
    "rowloop_32warps_prefetch": (dict(rowloop_warps=32), NORMS),
    "rowloop_t8": (dict(rowloop_thread_elems=8), NORMS),  # 8 elements a thread (16 warps a row: before run 22)
    "rowloop_wide3": (dict(rowloop_wide_max_loads=3), NORMS),  # 16 a thread with three row operands too
    "pair_8warps": (dict(pair_row_sums=True, rowloop_warps=8), NORMS),
    "pair_4warps": (dict(pair_row_sums=True, rowloop_warps=4), NORMS),
    "looped_stages2": (dict(num_stages=2), LONG_ROWS),
    "no_one_hot": (dict(one_hot_sums=False), LONG_ROWS),
    # gelu_chain's backward as the looped column form (before run 21) instead of a row loop without row sums
    "no_stages_rows": (dict(stages_as_rows=False), GELU),
    "pair_sums": (dict(pair_row_sums=True), NORMS + ("layer_norm", "softmax_layer_norm")),
    "stages_rows_2rows": (dict(rowloop_rows=2), GELU),  # cross-entropy backward's one-hot sum as a loop
    "chunks_512": (dict(split_outer_chunks=512), None),
    # for --rows 1024, column sums as before decision 058: unsplit (from 8192 rows, SPLIT_MIN_R), 128 programs over
    # every row; or split into 32 chunks of 32 rows in a column kernel of its own (the default since: chunks of 8
    # rows in the row kernel that reads the same rows)
    "cols_unsplit_1024": (dict(split_outer_min_r=None, split_outer_min_rows=32, rowloop_min_programs=256),
                          NORMS + GELU),
    "cols_split_1024": (dict(split_outer_min_rows=32, rowloop_min_programs=256), NORMS + GELU),
    "chunks_128": (dict(split_outer_chunks=128, rowloop_min_programs=128), None),
    "rowloop_stages2": (dict(num_stages=2), NORMS),
    "no_rowloop": (dict(columns_into_rows=False), NORMS),
    # row reductions, persistent form: elements a thread (default 8: 16 warps for a 4096-wide row) and
    # elements a program (default 4096: one such row a program)
    "rows_t16": (dict(persistent_thread_elems=16), ROWS),                          # 8 warps a row
    "rows_t32": (dict(persistent_thread_elems=32), ROWS),                          # 4 warps a row
    "rows_t32_x2": (dict(persistent_thread_elems=32, persistent_elems=8192), ROWS),  # 2 rows, 8 warps
    "rows_t16_x2": (dict(persistent_thread_elems=16, persistent_elems=8192), ROWS),  # 2 rows, 16 warps
    "rows_t64_x2": (dict(persistent_thread_elems=64, persistent_elems=8192), ROWS),  # 2 rows, 4 warps
    # looped form: elements a step (default 2048 at 8 a thread: 8 warps)
    "looped_4096": (dict(looped_rblock=4096), LONG_ROWS),                           # 16 warps
    "looped_4096_t16": (dict(looped_rblock=4096, looped_thread_elems=16), LONG_ROWS),  # 8 warps
    "looped_8192_t32": (dict(looped_rblock=8192, looped_thread_elems=32), LONG_ROWS),  # 8 warps
    "looped_2048_t16": (dict(looped_thread_elems=16), LONG_ROWS),                   # 4 warps
    "looped_1024": (dict(looped_rblock=1024), LONG_ROWS),                           # 4 warps
    "no_online": (dict(online_softmax=False), LONG_ROWS),  # the max and the sum of exp in two loops
    # the two changes after run 18, off (A/B against default in one run)
    "no_fold_masks": (dict(fold_even_masks=False), None),
    "no_softmax_rcp": (dict(softmax_reciprocal=False), None),
    # after run 19: the tiled pointwise form's 2-D grid off (the program id divided by the column blocks), and
    # 16 elements a thread (2 rows of 1024 at 4 warps); the looped form's partial last step not peeled
    "tiles_1d": (dict(tile_grid_2d=False), GELU + ("gelu_chain",)),
    "tiles_2048_t16": (dict(tile_elems=2048, tile_thread_elems=16), GELU + ("gelu_chain",)),  # default after run 20
    "tiles_1024_t8": (dict(tile_elems=1024, tile_thread_elems=8), GELU + ("gelu_chain",)),
    "no_peel": (dict(peel_loop_tail=False), LONG_ROWS),
    "no_half_helpers": (dict(half_helpers=False), GELU + ("gelu_chain", "layer_norm_gelu_fwd_bwd")),
}
DEFAULT_SETTINGS = ("default", "run7_default", "no_loads_first", "loads_first_all")
# (rowloop_rows=4 spills on sm_90: 128 registers and 232 bytes of stack, --inspect)

PROFILE_STEPS = 5
TIMED_STEPS = 10
ROUNDS = 3


def _setting(name: str) -> dict:
    if name not in SETTINGS:
        raise SystemExit(f"unknown setting {name!r}; the settings are {', '.join(SETTINGS)}")
    return SETTINGS[name][0]


def _applies(name: str, graph: str) -> bool:
    graphs = SETTINGS[name][1] if name in SETTINGS else None
    return graphs is None or graph in graphs


# --------------------------------------------------------------------------------------------- GPU run
def _kernel_times(prof, steps: int) -> list[tuple[str, float, int]]:
    rows = [(e.key, e.device_time_total / steps, e.count // steps) for e in prof.key_averages()
            if e.device_time_total > 0]
    rows.sort(key=lambda r: -r[1])
    return rows


def _step_ms(torch, step, args) -> float:
    times = []
    if not torch.cuda.is_available():  # --smoke on the CPU: wall time, for the code path only
        for _ in range(ROUNDS):
            t0 = time.perf_counter()
            step(*args)
            times.append((time.perf_counter() - t0) * 1e3)
        return sorted(times)[len(times) // 2]
    for _ in range(ROUNDS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(TIMED_STEPS):
            step(*args)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / TIMED_STEPS)
    return sorted(times)[len(times) // 2]


def measure(torch, suite, graph, args, ref, eager, backend: str, overrides: dict) -> dict:
    from torch.profiler import ProfilerActivity, profile

    from tilefuse.compiler import codegen
    from tilefuse.compiler.tuning import TUNING, tuning

    torch._dynamo.reset()
    t0 = time.perf_counter()
    with tuning(**overrides):
        step = suite.make_step(graph, torch.compile(graph.fn, backend=backend))
        result = step(*args)  # compiles (plans are made under the setting)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    compile_s = time.perf_counter() - t0
    problem = suite.check_against(result, ref, eager, args[0].dtype)
    del result
    for _ in range(2):
        step(*args)
    ms = _step_ms(torch, step, args)
    gpu = torch.cuda.is_available()
    with profile(activities=[ProfilerActivity.CUDA if gpu else ProfilerActivity.CPU]) as prof:
        for _ in range(PROFILE_STEPS if gpu else 1):
            step(*args)
        if gpu:
            torch.cuda.synchronize()
    kernels = _kernel_times(prof, PROFILE_STEPS) if gpu else []
    return {"ok": problem is None, "problem": problem, "step_ms": ms, "compile_s": compile_s,
            "kernel_ms": sum(k[1] for k in kernels) / 1000, "kernels": kernels}


def as_sequences(inputs: list, rows: int, seq) -> list:
    """The graph's inputs with each (rows, ...) tensor viewed as (rows / seq, seq, ...): a model's (batch,
    sequence, hidden) activations, whose column sums reduce two dims (a norm's weight gradient). ``seq`` None:
    the inputs as they are."""
    if not seq:
        return inputs
    return [t.unflatten(0, (rows // seq, seq)) if t.dim() >= 2 and t.shape[0] == rows else t for t in inputs]


def run_gpu(opts) -> int:
    import torch

    import tilefuse  # noqa: F401  (registers the backend)
    from tilefuse.bench import compiler_suite as suite

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    if dev == "cpu" and not opts.smoke:
        print("no GPU: run with --inspect (plans and sm_90 builds) or --smoke (the code path, tiny sizes)")
        return 2
    if opts.smoke:
        opts.inductor = False  # it would build C++ for the CPU
    deadline = START + opts.budget_s
    left = deadline - time.monotonic()
    faulthandler.dump_traceback_later(left + 15, exit=False)
    watchdog = threading.Timer(left + 20, lambda: (print("watchdog: past the budget, exiting", flush=True),
                                                   os._exit(3)))
    watchdog.daemon = True
    watchdog.start()
    name = torch.cuda.get_device_name() if dev == "cuda" else "cpu"
    shape = f"{opts.rows} x {opts.cols}" + (f" as sequences of {opts.seq}" if opts.seq else "")
    print(f"device {name}, torch {torch.__version__}; graphs {opts.graphs} at {shape}; "
          f"settings {opts.settings}; budget {opts.budget_s:.0f} s", flush=True)
    by_case = {g.case: g for g in suite.GRAPHS}
    results: dict = {}
    graphs = []
    for name in opts.graphs:
        graph = by_case[name]
        dtype = torch.float32 if opts.smoke else torch.bfloat16
        args = suite.prepare(graph, as_sequences(graph.inputs(opts.rows, opts.cols, suite.VOCAB, dtype, dev),
                                                 opts.rows, opts.seq))
        ref = suite.reference(graph, args)
        eager = [t.detach() for t in suite._flat(suite.make_step(graph, graph.fn)(*args))]
        graphs.append((name, graph, args, ref, eager))
        moved = suite.minimal_bytes(graph, args)
        results[name] = {"ideal_ms": moved / 4.2e12 * 1e3}
    runs = [("inductor", "inductor", {})] if opts.inductor else []
    runs = [(s, "tilefuse", _setting(s)) for s in opts.settings[:1]] + runs + \
        [(s, "tilefuse", _setting(s)) for s in opts.settings[1:]]
    for label, backend, overrides in runs:
        for name, graph, args, ref, eager in graphs:
            if not _applies(label, name):
                continue
            if time.monotonic() > deadline:
                print(f"== {name} {label}: skipped (past the {opts.budget_s:.0f} s budget)", flush=True)
                results[name][label] = {"ok": False, "problem": "skipped: budget"}
                continue
            try:
                r = measure(torch, suite, graph, args, ref, eager, backend, overrides)
            except Exception as exc:  # the sweep goes on
                msg = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
                print(f"== {name} {label}: FAILED {msg}", flush=True)
                traceback.print_exc(limit=3)
                results[name][label] = {"ok": False, "problem": msg}
                continue
            results[name][label] = r
            check = "ok" if r["ok"] else f"WRONG ({r['problem']})"
            print(f"== {name} {label}: step {r['step_ms']:.3f} ms, kernels {r['kernel_ms']:.3f} ms "
                  f"(ideal {results[name]['ideal_ms']:.3f}), compile {r['compile_s']:.1f} s, {check}", flush=True)
            for kname, us, count in r["kernels"][:8]:
                print(f"   {us:8.1f} us  x{count}  {kname[:100]}", flush=True)
    print("\n== summary: step ms (kernel ms) per graph and setting", flush=True)
    labels = [label for label, _, _ in runs]
    print(f"{'setting':24s}" + "".join(f"{n:>26s}" for n in opts.graphs))
    for label in labels:
        cells = []
        for name in opts.graphs:
            r = results[name].get(label, {"problem": "-"})
            if "step_ms" in r:
                cells.append(f"{r['step_ms']:.3f} ({r['kernel_ms']:.3f}){'' if r['ok'] else ' X'}")
            else:
                cells.append(str(r.get("problem", "-"))[:24])
        print(f"{label:24s}" + "".join(f"{c:>26s}" for c in cells))
    print(f"{'ideal (4.2 TB/s)':24s}" + "".join(f"{results[n]['ideal_ms']:26.3f}" for n in opts.graphs))
    if opts.json:
        Path(opts.json).write_text(json.dumps({"settings": {k: SETTINGS[k][0] if k in SETTINGS else {} for k in labels},
                                               "rows": opts.rows, "cols": opts.cols, "seq": opts.seq,
                                               "results": results}, indent=1, default=str))
    watchdog.cancel()
    faulthandler.cancel_dump_traceback_later()
    return 0


# ------------------------------------------------------------------------------------------ CPU inspect
def plan_backward_kernels(case: str, rows: int, cols: int, target=None, kinds=("backward",), seq=None):
    """(schedule text, [(KernelSource, {buffer: dtype})]) of a bench graph's graphs of ``kinds``, planned for
    ``target`` (an H200-like codegen.LaunchTarget by default) from fake tensors: no kernel runs. ``seq``: the
    inputs as (rows / seq, seq, cols) (:func:`as_sequences`)."""
    import torch
    from torch._functorch.aot_autograd import aot_module_simplified
    from torch._functorch.partitioners import min_cut_rematerialization_partition
    from torch._subclasses.fake_tensor import FakeTensorMode

    from tilefuse.bench import compiler_suite as suite
    from tilefuse.compiler import codegen, ir, lowering, scheduler
    from tilefuse.compiler.decompositions import decomposition_table

    target = target or codegen.LaunchTarget(32, False, 132)
    captured = []

    def keep(kind):
        def compile_graph(gm, example_inputs):
            captured.append((kind, gm))
            return gm
        return compile_graph

    def backend(gm, example_inputs):
        return aot_module_simplified(gm, example_inputs, fw_compiler=keep("forward"), bw_compiler=keep("backward"),
                                     decompositions=decomposition_table(),
                                     partition_fn=min_cut_rematerialization_partition,
                                     keep_inference_input_mutations=True)

    graph = {g.case: g for g in suite.GRAPHS}[case]
    torch._dynamo.reset()
    with FakeTensorMode(allow_non_fake_inputs=False):
        args = suite.prepare(graph, as_sequences(graph.inputs(rows, cols, suite.VOCAB, torch.bfloat16, "cpu"),
                                                 rows, seq))
        suite.make_step(graph, torch.compile(graph.fn, backend=backend))(*args)
    texts, kernels = [], []
    for kind, gm in captured:
        if kind not in kinds:
            continue
        g, _, _ = lowering.lower(gm, lambda n: n.meta.get("val"))
        sched = scheduler.schedule(g)
        texts.append(f"{case} {kind}:\n{scheduler.format_schedule(sched)}")
        table = sched.graph.by_name()
        for st in sched.steps:
            if isinstance(st, scheduler.KernelGroup):
                ks = codegen.generate(st, sched, target)
                dtypes = {a[1]: ir.node_meta(table[a[1]], a[1]).dtype for a in ks.args if a[0] == "buf"}
                kernels.append((ks, dtypes))
    return "\n".join(texts), kernels


_TRITON_TYPES = {"torch.bfloat16": "bf16", "torch.float16": "fp16", "torch.float32": "fp32", "torch.float64": "fp64",
                 "torch.int64": "i64", "torch.int32": "i32", "torch.int8": "i8", "torch.uint8": "u8",
                 "torch.bool": "i1", "torch.float8_e4m3fn": "fp8e4nv", "torch.float8_e5m2": "fp8e5"}


def compile_kernel(ks, dtypes, target=None, with_options=False):
    """``ks`` compiled (not launched) for ``target`` (a triton GPUTarget; default sm_90), in a
    non-interpreting process only; ``with_options``: also with the kernel's own compile options
    (``ks.options``: Triton's debug option for a kernel with device asserts, as the runtime launches it)."""
    import importlib.util
    import tempfile

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    path = Path(tempfile.mkdtemp()) / f"{ks.name}.py"
    path.write_text(ks.source)
    spec = importlib.util.spec_from_file_location(ks.name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[ks.name] = module
    spec.loader.exec_module(module)
    fn = getattr(module, ks.name)
    names = list(fn.arg_names)
    sig, attrs = {}, {}
    for k, a in enumerate(ks.args):
        if a[0] == "buf":
            sig[names[k]] = "*" + _TRITON_TYPES.get(str(dtypes.get(a[1])), "fp32")
            attrs[(k,)] = [["tt.divisibility", 16]]
        elif a[0] == "seed":
            sig[names[k]] = "*i64"
        elif a[0] == "float":
            sig[names[k]] = "fp32"
        else:
            sig[names[k]] = "i32" if abs(a[1]) < 2**31 else "i64"
            if a[1] % 16 == 0:
                attrs[(k,)] = [["tt.divisibility", 16]]
    consts = dict(ks.constexprs)
    for c in consts:
        sig[c] = "constexpr"
    src = ASTSource(fn, sig, constexprs=consts, attrs=attrs)
    return triton.compile(src, target=target or GPUTarget("cuda", 90, 32),
                          options={"num_warps": ks.num_warps, "num_stages": ks.num_stages,
                                   **(dict(getattr(ks, "options", ())) if with_options else {})})


def cross_compile(ks, dtypes) -> str:
    """Registers and spills of ``ks`` compiled for sm_90 (a non-interpreting process only)."""
    from tilefuse import targets

    compiled = compile_kernel(ks, dtypes)
    res = targets.cubin_resources(compiled.asm["cubin"])
    return f"regs {res.get('REG')}, stack {res.get('STACK')}, local {res.get('LOCAL')}, " \
           f"shared {getattr(compiled.metadata, 'shared', 0)}"


def run_inspect(opts) -> int:
    os.environ.setdefault("TILEFUSE_INTERPRET", "0")  # cross-compiling fails in an interpreting process
    from tilefuse.compiler.tuning import tuning

    for label in opts.settings:
        for name in opts.graphs:
            try:
                with tuning(**_setting(label)):
                    text, kernels = plan_backward_kernels(name, opts.rows, opts.cols,
                                                          kinds=("forward", "backward"), seq=opts.seq)
            except Exception as exc:
                print(f"== {name} {label}: planning FAILED {type(exc).__name__}: {exc}")
                continue
            if not _applies(label, name):
                continue
            print(f"== {name} {label}")
            if opts.source:
                print(text)
            for ks, dtypes in kernels:
                try:
                    res = cross_compile(ks, dtypes) if opts.compile else ""
                except Exception as exc:
                    res = f"sm_90 compile FAILED: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                print(f"   {ks.name:48s} {ks.form:10s} grid {ks.grid} {dict(ks.constexprs)} warps {ks.num_warps} "
                      f"stages {ks.num_stages}  {res}")
                if opts.source:
                    print(ks.source)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--graphs", default=",".join(GRAPHS))
    p.add_argument("--settings", default=",".join(DEFAULT_SETTINGS), help=f"of {', '.join(SETTINGS)}")
    p.add_argument("--budget-s", type=float, default=70.0,
                   help="seconds from the start after which no new measurement starts (watchdog: +20 s)")
    p.add_argument("--rows", type=int, default=32768)
    p.add_argument("--cols", type=int, default=4096)
    p.add_argument("--seq", type=int, default=None,
                   help="view each (rows, cols) input as (rows / SEQ, SEQ, cols), a model's (batch, sequence, "
                        "hidden) activations (graphs over the last dim only)")
    p.add_argument("--smoke", action="store_true", help="CPU: run the sweep's code path on the interpreter")
    p.add_argument("--no-inductor", dest="inductor", action="store_false")
    p.add_argument("--json", default=None)
    p.add_argument("--inspect", action="store_true", help="CPU: plan for an H200-like target, cross-compile")
    p.add_argument("--no-compile", dest="compile", action="store_false", help="--inspect without sm_90 builds")
    p.add_argument("--source", action="store_true")
    opts = p.parse_args(argv)
    opts.graphs = [g for g in opts.graphs.split(",") if g]
    opts.settings = [s for s in opts.settings.split(",") if s]
    if opts.inspect:  # before tilefuse is imported: without a GPU it would make Triton interpret, not compile
        os.environ.setdefault("TILEFUSE_INTERPRET", "0")
    from tilefuse.bench import compiler_suite
    cases = [g.case for g in compiler_suite.GRAPHS]
    bad = [g for g in opts.graphs if g not in cases]
    if bad:
        raise SystemExit(f"unknown graphs {bad}; the graphs are the compiler suite's cases: {', '.join(cases)}")
    if opts.seq is not None:
        if opts.seq < 1 or opts.rows % opts.seq:
            raise SystemExit(f"--seq {opts.seq}: must be a positive divisor of --rows ({opts.rows})")
        bad = [g for g in opts.graphs if g not in SEQUENCE_GRAPHS]
        if bad:
            raise SystemExit(f"--seq applies to graphs over the last dim only ({', '.join(SEQUENCE_GRAPHS)}), "
                             f"not to {bad}")
    for s in opts.settings:
        _setting(s)
    return run_inspect(opts) if opts.inspect else run_gpu(opts)


if __name__ == "__main__":
    raise SystemExit(main())
