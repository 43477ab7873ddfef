"""The CUDA C++ ladder's rows in ``tilefuse targets`` (registered as the ``cuda-ladder`` provider).

Per rung and target:

- the rung's own NVIDIA arch (sm_80 for 1-6 and 5s, sm_90a for 7-9): built with nvcc (cached), claimed; the
  row carries registers, stack/spill bytes and shared memory (static from ptxas + the dynamic bytes the
  metadata declares) and the SASS instruction the rung claims (``mma`` column: HMMA, HGMMA, FFMA). It fails
  when the claim is missing from the SASS or, for rungs 6-9, when there are spills or local-memory
  instructions.
- other NVIDIA targets: an sm_80 rung runs on newer GPUs from its compute_80 code, built on the GPU machine
  for the GPU it finds (build.device_target); not compiled ahead here, so reported unclaimed with that note.
  The sm_90a rungs are n/a elsewhere (wgmma and setmaxnreg exist on sm_90a only).
- AMD targets: the portable rungs' HIP translation (port.translate) compiled by clang-19 for gfx90a and
  gfx942 (claimed), with VGPRs, spills and LDS from the assembly's metadata; targets clang-19 does not know
  (gfx950) are unclaimed. NVIDIA-only rungs are "n/a: NVIDIA-only (reason)".
"""
from __future__ import annotations

import os
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Sequence

from .. import diskcache, targets
from . import build as _build
from . import port as _port

KIND_NVIDIA = "cuda c++"
KIND_HIP = "hip"


def kernel_name(r: _build.Rung) -> str:
    return f"cuda-rung{r.name}"


def hip_translation(r: _build.Rung) -> Path:
    """The HIP translation of a portable rung (and its headers), cached by their content."""
    files = [r.path] + [h for h in r.includes() if _port.nvidia_only_reason(h.read_text()) is None]
    import torch

    key = diskcache.digest("hip-translation-1", torch.__version__, *[f.name.encode() + b"\0" + f.read_bytes() for f in files])
    parent = diskcache.folder("cuda", "hip-src")
    folder = parent / f"rung{r.name}-{key}"
    out = folder / (r.path.stem + ".hip")
    if out.exists():
        return out
    with _build._locked(parent / f".{folder.name}.lock"):  # one translation, even from several processes
        if not out.exists():
            with tempfile.TemporaryDirectory(dir=parent, prefix=".tmp-") as tmp:
                _port.translate([r.path], Path(tmp) / "t")
                os.replace(Path(tmp) / "t", folder)  # the folder appears complete or not at all
    return out


def hip_build(r: _build.Rung, arch: str) -> _port.HipBuild:
    source = hip_translation(r)
    headers = sorted(p for p in source.parent.iterdir() if p.suffix in (".cuh", ".h", ".hpp"))
    return _port.compile_hip(source, arch, headers)


def _nvidia_row(r: _build.Rung, target: str, built) -> targets.Result:
    example = r.path.stem
    if isinstance(built, Exception):
        return targets.Result(kernel_name(r), example, target, ok=False, error=str(built)[:600], kind=KIND_NVIDIA)
    problems = _build.check(built, r)
    found = built.has(r.claims) if r.claims else None
    shared = (built.static_smem or 0) + (r.dynamic_smem or 0)
    note = f"{r.title}; {len(built.kernels)} kernels; {r.lines_of_code()} lines"
    if found is None and r.claims:
        note += "; SASS not inspected (no cuobjdump)"
    if built.warnings:
        note += f"; {len(built.warnings)} compiler warning(s)"
    return targets.Result(kernel_name(r), example, target, ok=not problems, error="; ".join(problems),
                          mma=r.claims if found else "none", registers=built.registers, spills=built.spills,
                          shared_bytes=shared or None, launch={"dynamic_smem": r.dynamic_smem} if r.dynamic_smem else {},
                          compile_s=built.seconds, kind=KIND_NVIDIA, note=note)


def _hip_row(r: _build.Rung, target: str, built: _port.HipBuild) -> targets.Result:
    example = r.path.stem
    unknown_arch = not built.ok and "invalid target ID" in built.error
    note = f"HIP translation (torch.utils.hipify) compiled with clang, device code only"
    if built.external_calls:
        note += f"; calls into ROCm's device library, not linked here: {', '.join(built.external_calls)}"
    if unknown_arch:
        return targets.Result(kernel_name(r), example, target, ok=False, claimed=False, kind=KIND_HIP,
                              error=f"n/a: the HIP compiler does not know {target} (clang-19; LLVM 20 does)")
    return targets.Result(kernel_name(r), example, target, ok=built.ok, error=built.error, mma="none",
                          registers=built.vgprs, spills=built.spills, shared_bytes=built.lds_bytes,
                          compile_s=built.seconds, kind=KIND_HIP, note=note)


def _not_here(r: _build.Rung, target: str, why: str, kind: str) -> targets.Result:
    return targets.Result(kernel_name(r), r.path.stem, target, ok=False, claimed=False, error=why, kind=kind)


def rows(target_names: Sequence[str]) -> list[targets.Result]:
    """One row per rung and requested target (builds run in parallel, each cached on disk)."""
    ladder = _build.discover()
    jobs: list[tuple] = []
    for r in ladder:
        for t in target_names:
            vendor = targets.vendor_of(t)
            if vendor == "nvidia" and t == r.arch:
                jobs.append((r, t, "nvcc"))
            elif vendor == "amd" and r.portable:
                jobs.append((r, t, "hip"))

    def run(job):
        r, t, how = job
        if how == "nvcc":
            try:
                return _build.build(r, t)
            except (_build.BuildError, ValueError) as exc:
                return exc
        try:
            return hip_build(r, t)
        except Exception as exc:  # a translation failure is this cell's result
            return _port.HipBuild(str(r.path), t, False, f"{type(exc).__name__}: {exc}"[:600], None, [], [], [], 0.0)

    with ThreadPoolExecutor(max(1, min(len(jobs), 8))) as pool:
        done = dict(zip([(j[0].name, j[1]) for j in jobs], pool.map(run, jobs)))

    out: list[targets.Result] = []
    for r in ladder:
        for t in target_names:
            vendor = targets.vendor_of(t)
            key = (r.name, t)
            if vendor == "nvidia":
                if key in done:
                    out.append(_nvidia_row(r, t, done[key]))
                elif r.arch == "sm_80":
                    out.append(_not_here(r, t, f"not compiled ahead: built on the GPU machine for its GPU from the "
                                         f"compute_80 code (SASS of {r.arch} does not load on {t})", KIND_NVIDIA))
                else:
                    out.append(_not_here(r, t, f"n/a: {r.arch} only ({r.reason})", KIND_NVIDIA))
            else:
                if key in done:
                    out.append(_hip_row(r, t, done[key]))
                else:
                    out.append(_not_here(r, t, f"n/a: NVIDIA-only ({r.reason})", KIND_HIP))
    return out
