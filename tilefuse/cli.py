"""The ``tilefuse`` command: demo | info | targets | bench | report | explain | port.

Each subcommand's work lives in the module that owns it; this file only parses arguments and turns a bad
argument into a one-line error naming the accepted values (exit 2), never a traceback.
"""
from __future__ import annotations

import argparse
import json
import sys


class UsageError(Exception):
    """A bad command-line argument: printed as one line, exit status 2."""


def _split(values: list[str] | None) -> list[str]:
    out: list[str] = []
    for v in values or []:
        out.extend(x.strip() for x in v.split(",") if x.strip())
    return out


# ----------------------------------------------------------------------------------------------- info
def cmd_info(args) -> int:
    import torch
    import triton

    from . import config, device, diskcache

    dev = device.current()
    cache_in_use = diskcache.root()
    cache_line = str(config.get().cache_dir) + (f" (unusable: this process uses {cache_in_use})"
                                                if cache_in_use != config.get().cache_dir else "")
    lines = [f"tilefuse {__import__('tilefuse').__version__}",
             f"device:    {dev.describe()}",
             f"torch:     {torch.__version__}" + (f" (HIP {torch.version.hip})" if torch.version.hip else
                                                 f" (CUDA {torch.version.cuda})" if torch.version.cuda else ""),
             f"triton:    {triton.__version__}",
             f"python:    {sys.version.split()[0]}",
             f"cache dir: {cache_line}",
             f"debug:     TILEFUSE_DEBUG={config.get().debug} ({config.DEBUG_LEVELS[config.get().debug]})"]
    sheet = device.datasheet(dev)
    if sheet:
        lines.append(f"datasheet: {sheet.part}: bf16 {sheet.bf16:g} TFLOP/s dense, HBM {sheet.hbm_tbps:g} TB/s (leads, not measurements)")
    info = {"tilefuse": __import__("tilefuse").__version__, "device": dev.__dict__, "torch": torch.__version__,
            "triton": triton.__version__, "python": sys.version.split()[0],
            "cache_dir": str(cache_in_use), "cache_dir_configured": str(config.get().cache_dir),
            "debug": config.get().debug, "debug_meaning": config.DEBUG_LEVELS[config.get().debug]}
    if dev.is_gpu and not dev.interpreter:
        ceil = device.measure_ceilings() if args.measure else device.ceilings(dev)
        if ceil is None:
            lines.append("ceilings:  not measured yet on this device (run `tilefuse info --measure`)")
        else:
            lines.append(f"ceilings:  copy {ceil.copy_gbps / 1000:.2f} TB/s, bf16 matmul {ceil.bf16_tflops:.0f} TFLOP/s, "
                         f"fp16 matmul {ceil.fp16_tflops:.0f} TFLOP/s at {ceil.matmul_n}^3 (measured {ceil.measured_at})")
            info["ceilings"] = ceil.__dict__
    else:
        lines.append("ceilings:  none: there is no GPU to measure; kernels run on Triton's interpreter, which is "
                     "for correctness, not speed")
        if args.measure:
            lines.append("           (--measure needs a GPU)")
    if args.json:
        print(json.dumps(info, indent=1, default=str))
    else:
        print("\n".join(lines))
    return 0


# -------------------------------------------------------------------------------------------- targets
def cmd_targets(args) -> int:
    from . import targets

    wanted_targets = _split(args.target) or list(targets.ALL_TARGETS)
    targets.check_target_names(wanted_targets)
    from . import kernels

    kernels.load_all()
    progress = _progress_printer()
    if not args.triton_only:
        try:
            import tilefuse.cuda  # noqa: F401  (registers the C++ ladder's rows, if built)
        except ImportError:
            pass
    results = targets.compile_matrix(wanted_targets, _split(args.kernel) or None, jobs=args.jobs,
                                     include_providers=not args.triton_only, progress=progress)
    if progress.tty:
        sys.stderr.write("\n")
    bad = targets.failures(results)
    if not results:
        print("tilefuse targets: no kernel is registered (tilefuse.kernels has no kernel family)", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"targets": wanted_targets, "results": [r.to_json() for r in results],
                          "failures": len(bad)}, indent=1, default=str))
    else:
        print(targets.format_matrix(results, wanted_targets))
        if args.details:
            print()
            print(targets.format_details(results))
        print(f"\n{len(results)} compilations, {len(bad)} failed on a claimed target"
              + ("" if args.details else "  (--details for registers, spills, shared memory, launch configs)"))
        for r in bad:
            print(f"FAIL {r.kernel} [{r.example}] on {r.target}: {r.error}")
    return 1 if bad else 0


def _progress_printer():
    """Progress on stderr, so that stdout stays the table or the JSON: one ``[n/N] target kernel [example]``
    line per compilation (the format :data:`tilefuse.targets.PROGRESS_LINE` reads back from a child), or one
    line rewritten in place on a terminal."""
    tty = sys.stderr.isatty()

    def show(done: int, total: int, what: str) -> None:
        line = f"[{done}/{total}] {what}"
        sys.stderr.write(f"\r{line:<79}" if tty else line + "\n")
        sys.stderr.flush()

    show.tty = tty
    return show


# ----------------------------------------------------------------------------------------- delegates
def cmd_demo(args) -> int:
    from .demo import main as demo_main

    return demo_main(args)


def cmd_bench(args) -> int:
    from .bench.runner import main as bench_main

    return bench_main(args)


def cmd_report(args) -> int:
    from .bench.report import main as report_main

    return report_main(args)


def cmd_explain(args) -> int:
    return explain_script(args.script, args.script_args)


class _ExplainBackend:
    """The backend a script's ``torch.compile`` calls get under ``tilefuse explain``: it notes each graph
    Dynamo hands over (and why Dynamo cut it there) and passes it, with the call's ``mode``/``options``, to
    the tilefuse backend. Graph breaks are counted from those reasons, as ``tilefuse.explain()`` counts them
    through ``torch._dynamo.explain``."""

    def __init__(self):
        self.graph_count = 0
        self.break_reasons: list[str] = []

    def __call__(self, gm, example_inputs, **kwargs):
        from torch._dynamo.backends.registry import lookup_backend

        self.graph_count += 1
        reason = getattr(gm, "compile_subgraph_reason", None)
        if reason is not None and reason.graph_break:
            text = reason.reason
            stack = getattr(reason, "user_stack", None)
            if stack:
                text += f" (at {stack[-1].filename}:{stack[-1].lineno})"
            self.break_reasons.append(text)
        return lookup_backend("tilefuse")(gm, example_inputs, **kwargs)


def explain_script(path: str, script_args: list[str] | None = None) -> int:
    """Run the script once as ``__main__`` with the tilefuse backend set, then print what was compiled.

    Every ``torch.compile`` call the script makes without a backend, or with ``backend="tilefuse"``, gets the
    tilefuse backend; a call that names another backend keeps it (and is listed). A script that defines
    ``main()`` and has no ``if __name__ == "__main__":`` block gets ``main()`` called. The script's output goes
    where it always goes, as it runs; if the script raises, its traceback is printed and the explanation
    still follows (exit status 1)."""
    import ast
    import os
    import runpy
    import traceback

    import torch

    from .compiler.explain import Explanation, collecting

    if not os.path.isfile(path):
        raise FileNotFoundError(f"no such script: {path}")
    with open(path) as f:
        tree = ast.parse(f.read(), filename=path)
    runs_itself = any(isinstance(n, ast.If) and "__name__" in ast.unparse(n.test) for n in tree.body)

    recorder = _ExplainBackend()
    other_backends: list[str] = []
    original_compile = torch.compile
    unset = object()

    def compile_with_tilefuse(model=None, *, backend=unset, **kwargs):
        if backend is unset or backend == "tilefuse":
            backend = recorder
        else:
            other_backends.append(backend if isinstance(backend, str) else getattr(backend, "__name__", repr(backend)))
        return original_compile(model, backend=backend, **kwargs)

    argv, path0 = sys.argv, sys.path[0] if sys.path else None
    sys.argv = [path] + list(script_args or [])
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    status = 0
    torch._dynamo.reset()  # code compiled earlier in this process would hide its graphs
    torch.compile = compile_with_tilefuse
    try:
        with collecting() as sink:
            try:
                namespace = runpy.run_path(path, run_name="__main__")
                if not runs_itself and callable(namespace.get("main")):
                    namespace["main"]()
            except SystemExit as exc:
                status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            except Exception as exc:  # the script's own failure: show it, then explain what ran before it
                tb = exc.__traceback__
                while tb is not None and tb.tb_frame.f_code.co_filename != path:
                    tb = tb.tb_next  # from the script's first frame: runpy's and this function's are noise
                traceback.print_exception(type(exc), exc, tb or exc.__traceback__)
                status = 1
    finally:
        torch.compile = original_compile
        sys.argv = argv
        if sys.path and sys.path[0] != path0:
            sys.path.pop(0)
    sys.stdout.flush()
    sys.stderr.flush()
    exp = Explanation(recorder.graph_count, len(recorder.break_reasons), recorder.break_reasons, list(sink))
    print(f"\n== tilefuse explain {path}" + (f" (the script failed, exit status {status})" if status else ""))
    print(exp)
    if other_backends:
        print(f"\n{len(other_backends)} torch.compile calls named another backend and were left to it: "
              + ", ".join(sorted(set(other_backends))))
    return status


def cmd_port(args) -> int:
    from .cuda.port import main as port_main

    return port_main(args.paths, args.output)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tilefuse", description=__import__("tilefuse").__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"tilefuse {__import__('tilefuse').__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("demo", help="compile a model with the tilefuse backend, run a fused GEMM, show the target matrix")
    p.add_argument("--quick", action="store_true", help="smaller sizes (the default on the interpreter)")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("info", help="device, versions, datasheet peaks and measured ceilings")
    p.add_argument("--measure", action="store_true", help="measure copy bandwidth and matmul rate now (GPU only) and cache them")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("targets", help="cross-compile every registered kernel for NVIDIA and AMD targets (no GPU needed)")
    p.add_argument("--target", action="append", metavar="T[,T]", help="targets (default all: sm_80,sm_90a,sm_100a,gfx90a,gfx942,gfx950)")
    p.add_argument("--kernel", action="append", metavar="K[,K]", help="only these kernels (default all registered)")
    p.add_argument("--details", action="store_true", help="registers, spills, shared memory and launch config of each compilation")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--jobs", type=int, default=None, help="parallel compilations (default: CPU cores)")
    p.add_argument("--triton-only", action="store_true", help="leave out the CUDA C++ ladder's rows")
    p.set_defaults(func=cmd_targets)

    p = sub.add_parser("bench", help="time implementations side by side on the GPU and write CSV rows")
    from .bench.runner import add_arguments as bench_arguments

    bench_arguments(p)
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("report", help="render the tables (and plots) of benchmark CSV files")
    from .bench.report import add_arguments as report_arguments

    report_arguments(p)
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("explain", help="run a script under the tilefuse backend and show graph breaks, fusion groups, kernels and fallbacks")
    p.add_argument("script", help="a Python script that calls torch.compile(..., backend='tilefuse') or defines `main()`")
    p.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments passed to the script")
    p.set_defaults(func=cmd_explain)

    p = sub.add_parser("port", help="lint CUDA C++ for 32-lane warp assumptions and translate it to HIP")
    p.add_argument("paths", nargs="+", help=".cu/.cuh/.h files or folders")
    p.add_argument("-o", "--output", metavar="DIR", default=None, help="write the HIP translation here")
    p.set_defaults(func=cmd_port)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except (UsageError, ValueError, FileNotFoundError) as exc:
        if isinstance(exc, ValueError) and not isinstance(exc, UsageError) and _is_internal(exc):
            raise
        print(f"tilefuse {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _is_internal(exc: BaseException) -> bool:
    """A ValueError raised deep inside torch/triton is a bug to show in full, not a usage error."""
    tb = exc.__traceback__
    while tb and tb.tb_next:
        tb = tb.tb_next
    filename = tb.tb_frame.f_code.co_filename if tb else ""
    return "tilefuse" not in filename


if __name__ == "__main__":
    raise SystemExit(main())
