#!/usr/bin/env python3
"""Mutation check: does the compiler's test suite catch deliberate bugs? (run by hand, not in CI)

Each mutation replaces one exact piece of text in one compiler source file by a plausible bug (an operand
swapped, an index off by one, a mask bound off by one, a fusion made legal that is not). For each, the
repository is copied into a temporary directory (the working tree is never edited), the mutation is applied
there, and the chosen tests run in that copy with ``-x -q -p no:randomly`` (the copy is first on the path, so
its ``tilefuse`` is the one imported). A mutation is *caught* when a test fails, *survived* when every test
passes. Tests run in stages, the fast focused files first: a caught mutation stops at its first failing
stage, a survivor runs them all. Every run uses one fixed TILEFUSE_TEST_SEED so results can be replayed.

Usage (from the repository root, with the project's Python)::

    python tools/mutation_check.py                      # every mutation, the default stages
    python tools/mutation_check.py --list               # the mutations, one a line
    python tools/mutation_check.py --only alpha_on_left permute_inverse
    python tools/mutation_check.py --stage "tests/compiler/test_compiler_operands.py" \\
        --stage "tests/compiler/test_compiler_opinfo.py -k 'add or sub'"   # own stages (each a pytest argument string)
    python tools/mutation_check.py --csv build/mutations.csv --timeout 600 --seed 1234
    nohup python tools/mutation_check.py --csv build/mutations.csv > build/mutations.log 2>&1 &

Options: ``--stage`` (repeatable) replaces the default stages; ``--timeout`` is per stage in seconds (a stage
that runs out counts as *timeout*, reported apart); ``--no-baseline`` skips the unmutated run that first
checks the selection passes; ``--keep`` keeps the temporary copies; ``--python`` picks the interpreter.
Mutations marked ``equivalent`` (no test can catch them: unreachable code, or no value changes; each says
why) are skipped unless ``--equivalent`` or ``--only`` names them. The table is printed at the end (mutation,
result, the first failing test, seconds) and written as CSV with ``--csv``. tests/tools/test_mutation_check.py
checks that every mutation's text is still found exactly once, so the list does not rot while the compiler
changes.

The default stages: the focused files (operands, mutants, indexing, dynamic backward, bf16, extern backward),
then the OpInfo suite, then the models, online-softmax, split and reduction-form files. For a quicker run of
about 2 minutes a caught mutation (a survivor runs every stage: ~8 minutes on 2 shared cores), the run
recorded in the report used the first two stages and the split and online-softmax files.
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COMPILER = "tilefuse/compiler/"


@dataclasses.dataclass(frozen=True)
class Mutation:
    name: str
    file: str  # relative to the repository root
    old: str  # exact text, found exactly once in the file
    new: str
    description: str
    # why no test can catch it, when it cannot (the mutated code is unreachable, or the change has no effect on
    # any value): such mutations are skipped unless --equivalent, and reported as "equivalent"
    equivalent: str = ""


M = Mutation
LP, LV, LR, LW = (COMPILER + f for f in ("lowering/pointwise.py", "lowering/views.py", "lowering/reductions.py",
                                          "lowering/core.py"))
SCHED, IR, CODEGEN, PRIMS = (COMPILER + f for f in ("scheduler.py", "ir/__init__.py", "codegen/kernel_writer.py",
                                                    "ir/primitives.py"))

MUTATIONS: tuple[Mutation, ...] = (
    # ---- the ones the issue names
    M("alpha_on_left", LP,
      '            y = P.build("mul", y, low.scalar(alpha, dt))\n        return P.build("add", x, y)',
      '            x = P.build("mul", x, low.scalar(alpha, dt))\n        return P.build("add", x, y)',
      "add(x, y, alpha) scales x instead of y"),
    M("index_select_off_by_one", LV,
      "    idx[dim] = _indirect(low, index, at, src[dim], wrap=False)\n",
      "    idx[dim] = ir.add_const(_indirect(low, index, at, src[dim], wrap=False), 1)\n",
      "index_select reads the row after the selected one"),
    M("embedding_off_by_one", LV,
      "    row = _indirect(low, indices, vars_[:nidx], rows, wrap=False)\n",
      "    row = ir.add_const(_indirect(low, indices, vars_[:nidx], rows, wrap=False), 1)\n",
      "embedding reads the row after the looked-up one"),
    M("advanced_index_off_by_one", LV,
      "[_indirect(low, it, at, src[d], wrap=True)]",
      "[ir.add_const(_indirect(low, it, at, src[d], wrap=True), 1)]",
      "x[idx] reads the element after the indexed one"),
    M("illegal_reduction_fusion", SCHED,
      "            return ir.replace_loads(value, resolve)\n        raise _Illegal()\n",
      "            return ir.replace_loads(value, resolve)\n        return Local.make(ld.buffer, ld.dtype)\n",
      "a reduction read at another position is fused as if read at its own (the register value of this row)"),
    M("permute_inverse", LV,
      "            src[d] = v[p]\n",
      "            src[p] = v[d]\n",
      "permute applies the inverse permutation"),
    # ---- pointwise lowering
    M("sub_swapped", LP,
      '        return P.build("sub", x, y)\n',
      '        return P.build("sub", y, x)\n',
      "sub computes y - x"),
    M("div_swapped", LP,
      'return _binary(low, a, b, lambda x, y, dt: P.build("truediv", x, y))',
      'return _binary(low, a, b, lambda x, y, dt: P.build("truediv", y, x))',
      "div computes y / x"),
    M("rsub_not_reversed", LP,
      "    return _sub(low, b, a, alpha)\n",
      "    return _sub(low, a, b, alpha)\n",
      "rsub(x, y) computes x - alpha * y instead of y - alpha * x",
      "unreachable: aten.rsub is in the decomposition table (sub with the operands swapped) before lowering"),
    M("where_branches_swapped", LP,
      "low.scalar(x, dt),\n                                                 low.scalar(y, dt)), cond, a, b)",
      "low.scalar(y, dt),\n                                                 low.scalar(x, dt)), cond, a, b)",
      "where(c, x, y) takes y where c holds"),
    M("clamp_max_inverted", LP,
      'P.where(P.build("gt", x, hv), hv, x)',
      'P.where(P.build("lt", x, hv), hv, x)',
      "clamp's upper bound replaces the values below it"),
    M("threshold_boundary", LP,
      'P.where(P.build("le", x, low.scalar(threshold, dt))',
      'P.where(P.build("lt", x, low.scalar(threshold, dt))',
      "threshold keeps x == threshold (le -> lt)",
      "unreachable: aten.threshold is in the decomposition table (a where) before lowering"),
    M("pow_minus_two", LP,
      '-2.0: lambda: P.build("reciprocal", P.build("mul", x, x)),',
      '-2.0: lambda: P.build("reciprocal", x),',
      "x ** -2 computed as 1 / x"),
    # ---- views and indexing
    M("negative_index_wrap_off_by_one", CODEGEN,
      'f"tl.where({raw} < 0, {raw} + {size}, {raw})"',
      'f"tl.where({raw} < 0, {raw} + {size} - 1, {raw})"',
      "a negative index wraps to size - 1 + i instead of size + i"),
    M("gather_off_by_one", LV,
      "    idx[dim] = _indirect(low, index, vars_, src[dim] if src else 1, wrap=False)\n",
      "    idx[dim] = ir.add_const(_indirect(low, index, vars_, src[dim] if src else 1, wrap=False), 1)\n",
      "gather reads the element after the indexed one"),
    M("slice_step_ignored", LV,
      "        out[dim] = ir.add_const(ir.scale(v[dim], step), start)\n",
      "        out[dim] = ir.add_const(v[dim], start)\n",
      "a strided slice (x[::2]) reads with stride 1"),
    M("flip_off_by_one", LV,
      "ir.add_const(ir.scale(v[d], -1), src[d] - 1) if d in flips",
      "ir.add_const(ir.scale(v[d], -1), src[d]) if d in flips",
      "flip reads one past the end"),
    M("expand_wrong_broadcast", LV,
      "return [ir.const_index(0) if src[d] == 1 and meta.shape[n - r + d] != 1 else v[n - r + d] for d in range(r)]",
      "return [ir.const_index(0) if src[d] == 1 and meta.shape[n - r + d] != 1 else v[d] for d in range(r)]",
      "expand aligns a lower-rank source's dims on the left instead of the right"),
    M("cat_boundary", LV,
      '        mask = and_(index_cond(v, "ge", lo), index_cond(v, "lt", hi))\n',
      '        mask = and_(index_cond(v, "ge", lo), index_cond(v, "le", hi))\n',
      "cat: each part's mask reaches one element into the next part"),
    M("pad_mask_off_by_one", LV,
      'and_(index_cond(idx[d], "ge", 0), index_cond(idx[d], "lt", src[d]))',
      'and_(index_cond(idx[d], "ge", 0), index_cond(idx[d], "le", src[d]))',
      "constant_pad_nd reads one element past the source instead of the pad value"),
    M("unsqueeze_wrong_dim", LV,
      "        out = list(v)\n        del out[dim]\n        return out\n",
      "        out = list(v)\n        del out[dim - 1]\n        return out\n",
      "unsqueeze drops the variable of the dim before the new one"),
    M("norm_dim_abs", LW,
      "    return d % r\n",
      "    return abs(d) % r\n",
      "a negative dim -k means dim k (right only for rank 2 and dim -1)"),
    # ---- reductions
    M("keepdim_runs_over_dim0", LR,
      "        return tuple(None if d in reduced else d for d in range(len(space)))\n",
      "        return tuple(0 if d in reduced else d for d in range(len(space)))\n",
      "a keepdim output's size-1 dims index the reduction's dim 0"),
    M("var_ignores_correction", LR,
      "    denom = max(n - corr, 0.0)\n",
      "    denom = max(n - 0.0, 0.0)\n",
      "var/std divide by n whatever the correction"),
    M("mean_divides_by_kept_size", LR,
      '    n = math.prod(space[d] for d in dims) if space else 1\n    total = reduce(low, a, dims, "sum", meta=meta,',
      '    n = math.prod(space[d] for d in range(len(space)) if d not in dims) if space else 1\n'
      '    total = reduce(low, a, dims, "sum", meta=meta,',
      "mean divides by the kept dims' size instead of the reduced dims' (right for squares)"),
    M("scan_exclusive", LR,
      'keep = P.build("le", ir.IndexValue.make(vars_[d + 1], torch.int64)',
      'keep = P.build("lt", ir.IndexValue.make(vars_[d + 1], torch.int64)',
      "cumsum/cumprod become exclusive scans"),
    M("split_prod_identity", LR,
      '_IDENTITY = {"sum": 0, "prod": 1,',
      '_IDENTITY = {"sum": 0, "prod": 0,',
      "a split product's padded tail contributes 0 instead of 1"),
    # ---- code generation
    M("sum_identity_one", CODEGEN,
      '        if kind in ("sum", "any"):\n            return "0"\n',
      '        if kind in ("sum", "any"):\n            return "1"\n',
      "a sum's masked lanes contribute 1"),
    M("max_min_identity_swapped", CODEGEN,
      """            return 'float("inf")' if big else '-float("inf")'\n""",
      """            return '-float("inf")' if big else 'float("inf")'\n""",
      "max's masked lanes are +inf, min's -inf"),
    M("masked_lanes_not_reset", CODEGEN,
      'return self.emit(scope, f"tl.where(mask, {text}, {ident})", reg, prefix="rv")',
      'return self.emit(scope, f"{text}", reg, prefix="rv")',
      "a reduction's input is not reset to the identity in masked lanes (their loads give 0, exp(0) = 1)"),
    M("looped_prod_adds", CODEGEN,
      '        if k == "prod":\n            return f"{a} = {a} * {v}"\n',
      '        if k == "prod":\n            return f"{a} = {a} + {v}"\n',
      "a looped product accumulates by addition"),
    M("half_loads_not_widened", CODEGEN,
      '        text = f"tl.load({args})"\n        if e.dtype in P.HALF:\n            text += ".to(tl.float32)"\n',
      '        text = f"tl.load({args})"\n        if e.dtype in P.HALF:\n            text += ""\n',
      "fp16/bf16 loads stay in half precision in registers"),
    M("argmax_ties_to_higher_index", PRIMS,
      "    take = (v1 > v0) | ((v1 == v0) & (i1 < i0))",
      "    take = (v1 > v0) | ((v1 == v0) & (i1 > i0))",
      "argmax's ties go to the higher index (torch: the lower)"),
    # ---- index arithmetic
    M("divmod_drops_needed_mod", IR,
      "        if mod is not None and hi // div < mod:\n",
      "        if mod is not None and hi // div <= mod:\n",
      "(i // d) % m simplified to i // d when the quotient reaches m"),
    M("mod_index_bound", IR,
      "    lo, hi = ix.bounds()\n    if lo >= 0 and hi < mod:\n        return ix\n",
      "    lo, hi = ix.bounds()\n    if lo >= 0 and hi <= mod:\n        return ix\n",
      "i % m simplified to i when i reaches m"),
    M("bounds_negative_coef", IR,
      "                    lo += coef * ahi\n                    hi += coef * alo\n",
      "                    lo += coef * alo\n                    hi += coef * ahi\n",
      "an index's bounds with a negative coefficient (a flip) come out reversed"),
    # ---- scheduling
    M("pointwise_read_elsewhere_fused", SCHED,
      "        if tuple(ld.index) == tuple(positions[ld.buffer]):\n",
      "        if tuple(ld.index) == tuple(positions[ld.buffer]) or isinstance(root, ir.Pointwise):\n",
      "a pointwise root read at another position uses this position's register value"),
    M("fusion_compares_first_dim_only", SCHED,
      "        if tuple(ld.index) == tuple(positions[ld.buffer]):\n",
      "        if tuple(ld.index)[:1] == tuple(positions[ld.buffer])[:1]:\n",
      "a root read in the same row but another column counts as read at its own position"),
    M("inlined_load_loses_mask", SCHED,
      "        value = ir.substitute_expr(body, mapping)\n        if mask is not None:\n",
      "        value = ir.substitute_expr(body, mapping)\n        if False:\n",
      "an inlined producer's loads lose the consumer's mask (cat/pad of a computed value)",
      "no value changes: every masked consumer (cat, pad, slice/select_scatter, a split's tail) discards the "
      "masked lanes with a where; only the addresses of those lanes go out of bounds, which a memory checker "
      "would see (DESIGN.md's interpreter checking mode does not exist)"),
    M("fp16_intermediate_not_rounded", SCHED,
      'value.name == "round_fp16"):\n        return P.build("round_fp16", value)\n',
      'value.name == "round_fp16"):\n        return value\n',
      "an inlined fp16 intermediate is not rounded to fp16 (no overflow to inf past 65504)"),
    M("row_value_reads_full_row", SCHED,
      "            if _covers_reduced(lpos, space, reduced) and not isinstance(s.table[loc.name], ir.Reduction):\n",
      "            if False:\n",
      "a row-level root may read a full-row value of the group (which it has no reduced position for)",
      "unreachable guard: a load resolves to a full-row root's register only at that root's position, which "
      "names a reduced variable, and a root without a reduced position has none in its body"),
)

FOCUSED = ("tests/compiler/test_compiler_operands.py tests/compiler/test_compiler_mutants.py tests/compiler/test_compiler_indexing.py "
           "tests/compiler/test_compiler_dynamic_backward.py tests/compiler/test_compiler_bf16.py tests/compiler/test_compiler_extern_backward.py")
DEFAULT_STAGES = (
    FOCUSED,
    "tests/compiler/test_compiler_opinfo.py",
    "tests/compiler/test_compiler_models.py tests/compiler/test_compiler_online_softmax.py tests/compiler/test_compiler_split.py "
    "tests/compiler/test_compiler_reductions_perf.py",
)
SKIP_DIRS = ("benchmarks/results/",)  # large and not read by the compiler's tests


@dataclasses.dataclass
class Outcome:
    mutation: str
    result: str  # caught | survived | timeout | not-applied | baseline
    stage: str
    killer: str
    seconds: float
    description: str = ""


# ------------------------------------------------------------------------------------------ mechanics
def occurrences(m: Mutation, root: Path = REPO) -> int:
    return (root / m.file).read_text().count(m.old)


def apply(m: Mutation, root: Path) -> None:
    """Apply ``m`` to the copy at ``root`` (its text must be there exactly once)."""
    path = root / m.file
    text = path.read_text()
    n = text.count(m.old)
    if n != 1:
        raise ValueError(f"{m.name}: the text to mutate occurs {n} times in {m.file} (expected once)")
    path.write_text(text.replace(m.old, m.new))


def tracked_files(repo: Path = REPO) -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=repo,
                         check=True, capture_output=True).stdout.decode()
    return [f for f in out.split("\0") if f and not f.startswith(SKIP_DIRS) and (repo / f).is_file()]


def copy_tree(dest: Path, repo: Path = REPO) -> None:
    for rel in tracked_files(repo):
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(repo / rel, target)


# the -rfE summary: "FAILED <node id> - <message>"
_FAILED = re.compile(r"^(FAILED|ERROR) (.+?)(?: - .*)?$", re.M)


def run_stage(root: Path, stage: str, python: str, seed: int, timeout: float) -> tuple[str, str, float]:
    """(result, first failing test, seconds) of one stage's pytest run in the copy at ``root``."""
    env = dict(os.environ, PYTHONPATH=str(root), OMP_NUM_THREADS="1", TILEFUSE_TEST_SEED=str(seed),
               PYTHONDONTWRITEBYTECODE="1")
    env.pop("TILEFUSE_OPINFO_FULL", None)
    env["TILEFUSE_OPINFO_REPORT"] = str(root / "build" / "opinfo-report.json")
    cmd = [python, "-m", "pytest", "-x", "-q", "-p", "no:randomly", "-p", "no:cacheprovider", "-rfE",
           *shlex.split(stage)]
    start = time.time()
    try:
        proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timeout", "", time.time() - start
    seconds = time.time() - start
    if proc.returncode == 0:
        return "passed", "", seconds
    found = _FAILED.search(proc.stdout)
    if proc.returncode == 5:  # nothing collected: a bad selection, not a catch
        return "error", f"no tests collected by {stage!r}", seconds
    if found:
        return "failed", found.group(2), seconds
    # no test reported failing: the run itself died (a crash in a kernel, a collection error)
    if proc.returncode < 0:  # killed by a signal: faulthandler's traceback names the test function
        frames = re.findall(r'File "[^"]*/(tests/test_\w+\.py)", line \d+ in (test_\w+)', proc.stderr)
        where = f" in {frames[-1][0]}::{frames[-1][1]}" if frames else ""
        return "failed", f"(crashed: signal {-proc.returncode}{where})", seconds
    tail = (proc.stdout.strip().splitlines() + proc.stderr.strip().splitlines() or ["(no output)"])[-1][:160]
    return "failed", f"(pytest exit {proc.returncode}: {tail})", seconds


def check_imports_copy(root: Path, python: str) -> None:
    """The copy's tilefuse is the one the tests import (not an installed or editable one)."""
    env = dict(os.environ, PYTHONPATH=str(root))
    out = subprocess.run([python, "-c", "import tilefuse.compiler.scheduler as s; print(s.__file__)"], cwd=root,
                         env=env, capture_output=True, text=True, check=True).stdout.strip()
    if not Path(out).resolve().is_relative_to(root.resolve()):
        raise SystemExit(f"the copy's tests would import {out}, not the copy under {root}")


def run_one(m: Mutation | None, stages: list[str], python: str, seed: int, timeout: float, keep: bool) -> Outcome:
    name = m.name if m else "(baseline: no mutation)"
    tmp = Path(tempfile.mkdtemp(prefix=f"mutation-{m.name if m else 'baseline'}-"))
    total = 0.0
    try:
        copy_tree(tmp)
        if m is not None:
            try:
                apply(m, tmp)
            except ValueError as exc:
                return Outcome(name, "not-applied", "", str(exc), 0.0, m.description)
        check_imports_copy(tmp, python)
        for k, stage in enumerate(stages):
            result, killer, seconds = run_stage(tmp, stage, python, seed, timeout)
            total += seconds
            label = f"{k + 1}: {stage[:60]}"
            if result == "timeout":
                return Outcome(name, "timeout", label, "", total, m.description if m else "")
            if result in ("failed", "error"):
                return Outcome(name, "caught" if m else "baseline-failed", label, killer, total,
                               m.description if m else "")
        return Outcome(name, "survived" if m else "baseline-ok", "", "", total, m.description if m else "")
    finally:
        if keep:
            print(f"  (kept {tmp})", flush=True)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


# ------------------------------------------------------------------------------------------- reporting
def table(outcomes: list[Outcome]) -> str:
    rows = [("mutation", "result", "stage", "first failing test", "s")]
    rows += [(o.mutation, o.result, o.stage[:3].strip(": "), o.killer, f"{o.seconds:.0f}") for o in outcomes]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    caught = sum(o.result == "caught" for o in outcomes)
    counted = sum(o.result in ("caught", "survived") for o in outcomes)
    count = {r: sum(o.result == r for o in outcomes) for r in ("survived", "timeout", "not-applied", "equivalent")}
    lines.append(f"\ncaught {caught} of {counted}; survived {count['survived']}; timeout {count['timeout']}; "
                 f"not applied {count['not-applied']}; equivalent {count['equivalent']}")
    return "\n".join(lines)


def write_csv(path: Path, outcomes: list[Outcome]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["mutation", "result", "stage", "first_failing_test", "seconds", "description"])
        for o in outcomes:
            w.writerow([o.mutation, o.result, o.stage, o.killer, f"{o.seconds:.1f}", o.description])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--only", nargs="+", metavar="NAME", help="run these mutations only")
    ap.add_argument("--stage", action="append", metavar="PYTEST_ARGS",
                    help="a stage of tests (pytest arguments as one string); repeatable; replaces the defaults")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per stage (default 900)")
    ap.add_argument("--seed", type=int, default=1234, help="TILEFUSE_TEST_SEED for every run (default 1234)")
    ap.add_argument("--csv", type=Path, help="write the table as CSV here")
    ap.add_argument("--no-baseline", action="store_true", help="skip the unmutated run")
    ap.add_argument("--keep", action="store_true", help="keep the temporary copies")
    ap.add_argument("--list", action="store_true", help="list the mutations and exit")
    ap.add_argument("--equivalent", action="store_true", help="also run the mutations marked equivalent")
    ap.add_argument("--python", default=sys.executable, help="the interpreter that runs pytest")
    args = ap.parse_args(argv)

    chosen = list(MUTATIONS)
    if args.only:
        unknown = set(args.only) - {m.name for m in MUTATIONS}
        if unknown:
            ap.error(f"unknown mutations: {sorted(unknown)}")
        chosen = [m for m in MUTATIONS if m.name in args.only]
    if args.list:
        for m in chosen:
            print(f"{m.name:34} {m.file:36} {m.description}" + (" [equivalent]" if m.equivalent else ""))
        return 0
    skipped = [] if args.equivalent or args.only else [m for m in chosen if m.equivalent]
    chosen = [m for m in chosen if m not in skipped]
    stages = args.stage or list(DEFAULT_STAGES)
    print(f"{len(chosen)} mutations; stages: {stages}; seed {args.seed}", flush=True)
    outcomes: list[Outcome] = []
    if not args.no_baseline:
        base = run_one(None, stages, args.python, args.seed, args.timeout, args.keep)
        print(f"baseline: {base.result} ({base.seconds:.0f} s) {base.killer}", flush=True)
        if base.result != "baseline-ok":
            print("the unmutated tree does not pass the selection: fix that first", flush=True)
            return 2
    outcomes += [Outcome(m.name, "equivalent", "", "(skipped: " + m.equivalent[:80] + ")", 0.0, m.description)
                 for m in skipped]
    for m in chosen:
        o = run_one(m, stages, args.python, args.seed, args.timeout, args.keep)
        if o.result == "survived" and m.equivalent:
            o.result = "equivalent"
        outcomes.append(o)
        print(f"{o.mutation}: {o.result} ({o.seconds:.0f} s) {o.stage} {o.killer}", flush=True)
        if args.csv:
            write_csv(args.csv, outcomes)
    print("\n" + table(outcomes), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
