"""Ahead-of-time compilation of registered Triton kernels for named targets, with no GPU.

Every Triton kernel family registers itself here (:func:`register`) with example signatures and launch
configs. :func:`compile_matrix` compiles each example for each target through
``triton.compile(ASTSource(...), target=GPUTarget(...))``, with pointer arguments marked divisible by 16 as
the JIT marks them for a real launch (torch allocations are 16-byte aligned), so the code inspected is the
code a launch runs. For each kernel x target it records: compiled or the error, the matrix-instruction
family in the assembly, registers, spills and shared memory where the backend reports them, and the
launch config.

Other builders (the CUDA C++ ladder) add their own rows through :func:`register_provider`.

Kernels are compiled, never launched, so this needs the real ``JITFunction`` objects: in a process that
runs on Triton's interpreter (where ``@triton.jit`` gives interpreter objects) :func:`compile_matrix`
re-runs itself in a child process with the interpreter off.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import multiprocessing
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from . import config, device, diskcache

# name -> (backend, arch, warp size). Triton names sm_90 / sm_100 code "sm_90a" / "sm_100a" itself.
TARGETS: dict[str, tuple[str, Any, int]] = {
    "sm_80": ("cuda", 80, 32),
    "sm_90a": ("cuda", 90, 32),
    "sm_100a": ("cuda", 100, 32),
    "gfx90a": ("hip", "gfx90a", 64),
    "gfx942": ("hip", "gfx942", 64),
    "gfx950": ("hip", "gfx950", 64),
}
ALL_TARGETS: tuple[str, ...] = tuple(TARGETS)
NVIDIA_TARGETS = tuple(t for t in TARGETS if TARGETS[t][0] == "cuda")
AMD_TARGETS = tuple(t for t in TARGETS if TARGETS[t][0] == "hip")

# Matrix-instruction families, most capable first: the first one found in the assembly is reported.
MMA_PATTERNS: tuple[tuple[str, str], ...] = (
    ("tcgen05", r"\btcgen05\.mma"),
    ("wgmma", r"\bwgmma\.mma_async"),
    ("mma.sync", r"\bmma\.sync"),
    ("v_wmma", r"\bv_wmma_"),
    ("v_mfma", r"\bv_mfma_"),
)
POINTER_DIVISIBILITY = 16  # what the JIT specialises 16-byte-aligned pointers (every torch allocation) to


def vendor_of(target: str) -> str:
    return "nvidia" if TARGETS[target][0] == "cuda" else "amd"


def launch_options(vendor: str, num_warps: int, num_stages: int, **amd_options) -> dict[str, Any]:
    """A config's Triton launch options for ``vendor``: warps and stages everywhere; the AMD-only options
    (``waves_per_eu``, ``matrix_instr_nonkdim``, ``kpack``, ...) only for AMD and only when set (the NVIDIA
    backend rejects them, and 0 means "the compiler's default")."""
    opts: dict[str, Any] = {"num_warps": num_warps, "num_stages": num_stages}
    if vendor == "amd":
        opts.update((k, v) for k, v in amd_options.items() if v)
    return opts


def check_target_names(names: Iterable[str], what: str = "target") -> list[str]:
    names = list(names)
    for name in names:
        if name not in TARGETS:
            raise ValueError(f"unknown {what} {name!r}: accepted values are {', '.join(ALL_TARGETS)}")
    return names


# ------------------------------------------------------------------------------------------- registry
@dataclasses.dataclass(frozen=True)
class Example:
    """One compilation of a kernel: argument types, constexpr values and launch options.

    ``signature`` maps every parameter, in order, to a Triton type (``"*fp16"``, ``"i32"``, ``"fp32"``,
    ``"constexpr"``); ``constexprs`` gives the constexpr values (a ``@triton.jit`` function is allowed);
    ``options`` holds ``num_warps``, ``num_stages`` and, on AMD, ``waves_per_eu``, ``matrix_instr_nonkdim``,
    ``kpack``. ``divisible`` names integer parameters the JIT would see as multiples of 16.
    """
    label: str
    signature: dict[str, str]
    constexprs: dict[str, Any]
    options: dict[str, Any]
    divisible: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class KernelSpec:
    """A registered Triton kernel: its ``@triton.jit`` function and how to compile examples of it.

    ``examples(target)`` returns the examples for a target name (configs differ per vendor).
    ``expect_mma`` maps target -> the matrix-instruction family its assembly must contain (a matmul kernel
    that falls back to FMA is a failure, not a pass).
    """
    name: str
    family: str
    fn: Any
    examples: Callable[[str], Sequence[Example]]
    targets: tuple[str, ...] = ALL_TARGETS
    expect_mma: dict[str, str] = dataclasses.field(default_factory=dict)
    description: str = ""


_KERNELS: dict[str, KernelSpec] = {}
_PROVIDERS: dict[str, Callable[[Sequence[str]], list["Result"]]] = {}


def register(spec: KernelSpec) -> KernelSpec:
    if spec.name in _KERNELS and _KERNELS[spec.name].fn is not spec.fn:
        raise ValueError(f"kernel name {spec.name!r} is registered twice")
    check_target_names(spec.targets)
    _KERNELS[spec.name] = spec
    return spec


def register_provider(name: str, provider: Callable[[Sequence[str]], list["Result"]]) -> None:
    """Add a builder of non-Triton rows (e.g. the CUDA C++ ladder); called with the target names."""
    _PROVIDERS[name] = provider


def kernels() -> dict[str, KernelSpec]:
    return dict(_KERNELS)


def providers() -> dict[str, Callable]:
    return dict(_PROVIDERS)


# -------------------------------------------------------------------------------------------- results
@dataclasses.dataclass
class Result:
    kernel: str
    example: str
    target: str
    ok: bool
    claimed: bool = True  # the kernel claims this target: a failure here is an error
    error: str = ""
    mma: str = "none"
    registers: int | None = None  # NVIDIA: per thread; AMD: VGPRs
    spills: int | None = None  # NVIDIA: stack frame bytes (spills + local arrays); AMD: VGPR+SGPR spill count
    shared_bytes: int | None = None
    launch: dict[str, Any] = dataclasses.field(default_factory=dict)
    compile_s: float = 0.0
    kind: str = "triton"
    note: str = ""

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def _find_mma(asm: str) -> str:
    for family, pattern in MMA_PATTERNS:
        if re.search(pattern, asm):
            return family
    return "none"


def _tool(name: str) -> str | None:
    import triton

    bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name
    if bundled.exists():
        return str(bundled)
    return shutil.which(name)


def cubin_resources(cubin: bytes) -> dict[str, int]:
    """REG / STACK / SHARED / LOCAL of the (first) function in a cubin, read with cuobjdump."""
    tool = _tool("cuobjdump")
    if tool is None:
        return {}
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    return {k: int(v) for k, v in re.findall(r"\b(REG|STACK|SHARED|LOCAL):(\d+)", out)}


def _amd_resources(asm: str) -> dict[str, int]:
    def grab(pattern):
        found = re.findall(pattern, asm)
        return sum(int(x) for x in found) if found else None

    return {"vgprs": grab(r";\s*NumVgprs:\s*(\d+)"),
            "spills": (grab(r"\.vgpr_spill_count:\s*(\d+)") or 0) + (grab(r"\.sgpr_spill_count:\s*(\d+)") or 0)}


def _attrs_for(spec_fn, example: Example) -> dict:
    names = list(example.signature)
    attrs = {}
    for index, name in enumerate(names):
        ty = example.signature[name]
        if ty.startswith("*") or name in example.divisible:
            attrs[(index,)] = [["tt.divisibility", POINTER_DIVISIBILITY]]
    return attrs


def _short_error(exc: BaseException) -> str:
    """First and last lines of a compiler error: Triton's say where (``at 7:28:``) and then what."""
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip() and ln.strip() != "^"]
    text = lines[0] if len(lines) <= 1 else f"{lines[0]} ... {lines[-1]}"
    return f"{type(exc).__name__}: {text}"[:400]


def compile_example(spec: KernelSpec, example: Example, target: str) -> Result:
    """Compile one example of a kernel for one target and inspect the result.

    Only in a process that is not on Triton's interpreter: with triton 3.6, code generation in an
    interpreting process picks up the interpreter's builder on a cache miss and fails
    (``'ir.value' object has no attribute 'data'``). :func:`compile_matrix` re-runs itself in a child.
    """
    if device.interpreting():
        raise RuntimeError("cross-compiling in a process that runs on Triton's interpreter fails with triton 3.6; "
                           "use targets.compile_matrix (it re-runs in a child) or set TILEFUSE_INTERPRET=0")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    backend, arch, warp = TARGETS[target]
    launch = {**example.options, **{k: (v.__name__ if callable(v) else v) for k, v in example.constexprs.items()}}
    result = Result(spec.name, example.label, target, ok=False, claimed=target in spec.targets, launch=launch)
    start = time.perf_counter()
    try:
        src = ASTSource(spec.fn, example.signature, constexprs=example.constexprs, attrs=_attrs_for(spec.fn, example))
        compiled = triton.compile(src, target=GPUTarget(backend, arch, warp), options=dict(example.options))
    except Exception as exc:  # the error is the result: reported per cell, never raised
        result.error = _short_error(exc)
        result.compile_s = time.perf_counter() - start
        return result
    result.compile_s = round(time.perf_counter() - start, 3)
    result.ok = True
    result.shared_bytes = int(getattr(compiled.metadata, "shared", 0) or 0)
    if backend == "cuda":
        result.mma = _find_mma(compiled.asm.get("ptx", ""))
        res = cubin_resources(compiled.asm["cubin"])
        result.registers = res.get("REG")
        result.spills = (res.get("STACK", 0) + res.get("LOCAL", 0)) if res else None
    else:
        asm = compiled.asm.get("amdgcn", "")
        result.mma = _find_mma(asm)
        res = _amd_resources(asm)
        result.registers = res["vgprs"]
        result.spills = res["spills"]
    wanted = spec.expect_mma.get(target)
    if wanted and result.mma != wanted:
        result.ok = False
        result.error = f"expected {wanted} instructions in the assembly, found {result.mma}"
    return result


def _cache_key(spec: KernelSpec, example: Example, target: str) -> str:
    import triton

    constexprs = {k: (getattr(v, "cache_key", None) or repr(v)) for k, v in example.constexprs.items()}
    return diskcache.digest(spec.name, getattr(spec.fn, "cache_key", ""), json.dumps(example.signature),
                            json.dumps(constexprs, sort_keys=True, default=str),
                            json.dumps(example.options, sort_keys=True), ",".join(example.divisible),
                            target, json.dumps(spec.expect_mma, sort_keys=True), triton.__version__)


def _compile_cached(task: tuple[str, int, str]) -> dict:
    name, index, target = task
    spec = _KERNELS[name]
    example = list(spec.examples(target))[index]
    path = diskcache.folder("targets") / f"{_cache_key(spec, example, target)}.json"
    hit = diskcache.read_json(path, check=lambda row: Result(**row).kernel == name and row["target"] == target)
    if hit is not None:
        return hit
    row = compile_example(spec, example, target).to_json()
    if row["ok"] or "expected" in row["error"]:
        diskcache.write_json(path, row)  # a crash can be environmental; a real compile result is stable
    return row


def _selected(kernel_names: Sequence[str] | None) -> list[KernelSpec]:
    if not kernel_names:
        return list(_KERNELS.values())
    known = sorted(set(_KERNELS) | set(_PROVIDERS))
    unknown = [k for k in kernel_names if k not in _KERNELS and k not in _PROVIDERS]
    if unknown:
        raise ValueError(f"unknown kernel {unknown[0]!r}: accepted values are {', '.join(known)}")
    return [_KERNELS[k] for k in kernel_names if k in _KERNELS]


def compile_matrix(target_names: Sequence[str] | None = None, kernel_names: Sequence[str] | None = None,
                   jobs: int | None = None, include_providers: bool = True,
                   progress: Callable[[int, int, str], None] | None = None) -> list[Result]:
    """Compile every registered kernel (or those named) for every target (or those named).

    ``progress(done, total, what)`` is called after each compilation (``what``: "target kernel [example]")
    and once before each provider's rows (``what``: the provider's name, ``total`` unchanged)."""
    target_names = check_target_names(target_names or ALL_TARGETS)
    specs = _selected(kernel_names)
    if device.interpreting() and specs:
        return _compile_in_child(target_names, kernel_names, include_providers, progress, jobs)
    tasks = [(spec.name, i, t) for spec in specs for t in target_names for i in range(len(spec.examples(t)))]
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(tasks) or 1))

    def done(k: int, task) -> None:
        if progress is not None:
            name, index, target = task
            progress(k, len(tasks), f"{target} {name} [{index}]")

    if jobs == 1 or len(tasks) <= 1:
        rows = []
        for task in tasks:
            rows.append(_compile_cached(task))
            done(len(rows), task)
    else:
        ctx = multiprocessing.get_context("fork")  # children inherit the registry; nothing touches a GPU
        with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=ctx) as pool:
            futures = {pool.submit(_compile_cached, task): k for k, task in enumerate(tasks)}
            rows = [None] * len(tasks)
            for finished, future in enumerate(concurrent.futures.as_completed(futures), 1):
                rows[futures[future]] = future.result()
                done(finished, tasks[futures[future]])
    results = [Result(**row) for row in rows]
    if include_providers:
        wanted = set(kernel_names or ())
        for name, provider in _PROVIDERS.items():
            if not wanted or name in wanted:
                if progress is not None:
                    progress(len(tasks), len(tasks), name)
                results.extend(provider(target_names))
    return results


PROGRESS_LINE = re.compile(r"^\[(\d+)/(\d+)\] (.*)$")  # what `tilefuse targets` prints on stderr, per compilation


def _compile_in_child(target_names, kernel_names, include_providers, progress=None, jobs=None) -> list[Result]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TILEFUSE_INTERPRET"] = "0"
    cmd = [sys.executable, "-m", "tilefuse", "targets", "--json", "--target", ",".join(target_names)]
    if kernel_names:
        cmd += ["--kernel", ",".join(kernel_names)]
    if not include_providers:
        cmd += ["--triton-only"]
    if jobs:
        cmd += ["--jobs", str(jobs)]
    env["TILEFUSE_CACHE_DIR"] = str(diskcache.root())  # the folder in use (a private one if the configured one is not)
    # stdout (the JSON, can be large) goes to a file so that stderr can be read line by line for progress
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.PIPE, text=True, env=env)
        errors = []
        for line in proc.stderr:
            match = PROGRESS_LINE.match(line.rstrip("\n"))
            if match and progress is not None:
                progress(int(match[1]), int(match[2]), match[3])
            elif not match:
                errors.append(line)
        proc.wait()
        out.seek(0)
        stdout = out.read()
    try:
        rows = json.loads(stdout)["results"]
    except (ValueError, KeyError):
        raise RuntimeError(f"cross-compilation child failed (exit {proc.returncode}):\n{''.join(errors)[-2000:]}") from None
    return [Result(**row) for row in rows]


def failures(results: Iterable[Result]) -> list[Result]:
    """Rows that fail on a target their kernel claims."""
    return [r for r in results if r.claimed and not r.ok]


# ------------------------------------------------------------------------------------------- printing
def _cell(rows: list[Result]) -> str:
    if not rows:
        return "-"
    if any(not r.ok and r.claimed for r in rows):
        return "FAIL"
    if all(not r.ok for r in rows):
        return "n/a"
    ok = [r for r in rows if r.ok]
    families = sorted({r.mma for r in ok})
    cell = "/".join(f for f in families if f != "none") or "ok"
    spilled = any((r.spills or 0) > 0 and r.kind == "triton" for r in ok)
    return cell + (" spill" if spilled else "")


def format_matrix(results: Sequence[Result], target_names: Sequence[str]) -> str:
    """Kernel x target: the matrix family found (or ok / FAIL / n/a for a target not claimed)."""
    names = list(dict.fromkeys(r.kernel for r in results))
    width = max([len(n) for n in names] + [6])
    head = f"{'kernel':<{width}}  " + "  ".join(f"{t:<12}" for t in target_names)
    lines = [head, "-" * len(head)]
    for name in names:
        cells = [_cell([r for r in results if r.kernel == name and r.target == t]) for t in target_names]
        lines.append(f"{name:<{width}}  " + "  ".join(f"{c:<12}" for c in cells))
    return "\n".join(lines)


def format_details(results: Sequence[Result]) -> str:
    head = f"{'kernel':<24} {'example':<28} {'target':<8} {'status':<6} {'mma':<9} {'regs':>5} {'spill':>6} {'smem':>7}  launch"
    lines = [head, "-" * len(head)]
    for r in results:
        status = "ok" if r.ok else ("FAIL" if r.claimed else "n/a")
        launch = " ".join(f"{k}={v}" for k, v in r.launch.items())
        regs = "" if r.registers is None else str(r.registers)
        spill = "" if r.spills is None else str(r.spills)
        smem = "" if r.shared_bytes is None else str(r.shared_bytes)
        lines.append(f"{r.kernel:<24} {r.example[:28]:<28} {r.target:<8} {status:<6} {r.mma:<9} {regs:>5} {spill:>6} {smem:>7}  {launch}")
        if r.error:
            lines.append(f"{'':<24} ^ {r.error}")
    return "\n".join(lines)
