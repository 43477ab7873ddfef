#!/usr/bin/env python3
"""Interleaved A/B of builds of one CUDA ladder rung: the package's source against other versions of the file.

A change that should cost a kernel nothing (a run-time switch left at its old behaviour, a refactor) can still move
its SASS: run 79's build of rung 9, with a plain and an L2-hinted copy of every TMA access, was 36 % longer than
run 78's. ``ladder_sweep.py --ab`` compares settings inside one build; this compares builds. Each version is built
for sm_90a through the package's build cache (beside copies of the package's headers), checked against a float32
reference with C poisoned, then timed with cuBLAS (K-major B) in interleaved rounds whose order rotates, by
do_bench (its zeroing L2 flush, as ``tilefuse bench ladder`` times) or after a reading flush (``--flush read``).
Every version runs at its own defaults, bf16, epilogue none.

    git show REV:tilefuse/cuda/ladder/rung9_persistent.cu > /tmp/rung9-REV.cu
    python3 tools/rung_ab.py --rung 9 /tmp/rung9-REV.cu [more.cu ...] [--shapes 4096,8192] [--rounds 12]
                               [--rep-ms 20] [--flush write|read] [--csv PATH]

A version is named after its file's stem; the package's own source is ``current``. Needs a GPU for the timing;
``--build-only`` builds every version and prints its library and first kernel's resource report (no GPU).
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for p in (str(ROOT), str(HERE)):
    if p not in sys.path:
        sys.path.insert(0, p)

import ladder_sweep as sweep  # noqa: E402  (the timers, the check's tolerance, nvidia-smi)

TARGET = "sm_90a"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("versions", nargs="+", type=Path, help="other versions of the rung's .cu file")
    p.add_argument("--rung", default="9", help="the rung (default 9): the package's source of it is 'current'")
    p.add_argument("--shapes", default="4096,8192", help="comma-separated MxNxK or 4096 / 8192 / 16384x4096")
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--rep-ms", type=int, default=20, help="each version's timing a round (default 20)")
    p.add_argument("--flush", choices=("write", "read"), default="write")
    p.add_argument("--csv", type=Path, default=None)
    p.add_argument("--build-only", action="store_true", help="build every version and exit (no GPU needed)")
    args = p.parse_args(argv)
    for v in args.versions:
        if not v.is_file():
            p.error(f"{v}: no such file")
    stems = ["current"] + [v.stem for v in args.versions]
    if len(set(stems)) != len(stems):
        p.error(f"versions need distinct file names (the stem names a version; 'current' is the package's): {stems}")
    if args.rounds < 1:
        p.error("--rounds: at least 1")
    # the same shape names as ladder_sweep
    args.shape_list = sweep.parse_args(["--shapes", args.shapes]).shape_list
    return args


def build_versions(rung_name: str, paths: list[Path]) -> dict:
    """{name: Build}: the package's rung as 'current', and each path built from a folder that holds it under the
    package file's name beside copies of the package's headers."""
    from tilefuse.cuda import build

    current = build.rung(rung_name)
    out = {"current": build.build(current, TARGET)}
    work = Path(tempfile.mkdtemp(prefix="rung_ab-"))
    for path in paths:
        folder = work / path.stem
        folder.mkdir()
        for header in list(current.path.parent.glob("*.cuh")) + list(current.path.parent.glob("*.h")):
            shutil.copy(header, folder / header.name)
        shutil.copy(path, folder / current.path.name)
        out[path.stem] = build.build(build._rung_from(folder / current.path.name), TARGET)
    for name, b in out.items():
        k = b.kernels[0] if b.kernels else None
        sweep.log(f"{name:>16}: {b.library}  [{k}]")
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    builds = build_versions(args.rung, args.versions)
    if args.build_only:
        return 0
    import torch

    from tilefuse.bench import harness
    from tilefuse.cuda import launch

    if not torch.cuda.is_available():
        sweep.log("no CUDA GPU here: nothing to time (--build-only runs without one)")
        return 2
    libs = {name: launch.load(b) for name, b in builds.items()}
    names = list(libs)
    timer, _ = sweep.ab_timer(args.flush, args.rep_ms)
    sweep.log(f"rung {args.rung}: {', '.join(names)}; {args.rounds} rounds, flush {args.flush}, rep {args.rep_ms} ms; "
              f"nvidia-smi: {sweep.smi()}")
    rows, status = [], 0
    for m, n, k in args.shape_list:
        shape = f"{m}x{n}x{k}"
        torch.manual_seed(0)
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        ref = a.float() @ w.float().t()

        def call(rl):
            return lambda: rl(a.data_ptr(), w.data_ptr(), c.data_ptr(), None, m, n, k, k, k, n, "bfloat16", 0,
                              torch.cuda.current_stream().cuda_stream)

        for name in names:  # every version checked before any timing
            c.fill_(float("nan"))
            call(libs[name])()
            torch.cuda.synchronize()
            err = harness.rel_error(c, ref)
            if err > sweep.CHECK_TOLERANCE:
                sweep.log(f"{shape} {name}: WRONG, relative error {err:.3g}")
                status = 1
        def measure(rl):
            fn = call(rl)
            return lambda: timer(fn)[0]

        times = sweep.ab_rounds(shape, lambda: timer(lambda: torch.matmul(a, w.t()))[0],
                                {nm: measure(libs[nm]) for nm in names}, args.rounds)
        rows += sweep.ab_report(shape, times, "version", "current", args.flush)
    if args.csv is not None:
        sweep.write_rows(args.csv, rows)
    sweep.log(f"nvidia-smi after: {sweep.smi()}")
    return status


if __name__ == "__main__":
    sys.exit(main())
