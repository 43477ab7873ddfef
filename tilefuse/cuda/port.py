"""CUDA C++ -> AMD: a warp-size lint, the HIP translation, and a compile-only check with clang.

``tilefuse port PATH... [-o DIR]`` (``main``) lints every ``.cu``/``.cuh``/``.h`` file given (folders are
searched), prints each finding as ``file:line: what assumes 32 lanes; portable: the portable form``, writes
the HIP translation of the files under ``DIR`` with ``-o``, and exits 1 when it found a 32-lane assumption, 0
when clean.

The lint (:func:`lint_text`) flags code that is right for NVIDIA's 32-lane warps and silently wrong on AMD
CDNA's 64-lane wavefronts, which neither hipify-perl nor PyTorch's hipify warn about:

=================  ===============================================================================
rule               what it flags
=================  ===============================================================================
lane-mask          ``0xffffffff`` as a lane mask (in a warp intrinsic's statement, or a ``*mask*`` variable)
lane-index         ``& 31``, ``% 32``, ``/ 32``, ``>> 5`` on thread indices (``threadIdx`` and what is
                   computed from it)
shuffle-reduction  shuffle loops or unrolled shuffles starting at offset 16 (16, 8, 4, 2, 1: five steps)
ballot-32          a ``__ballot`` result kept in a 32-bit integer, or counted with ``__popc``/``__ffs``
shuffle-width      a literal ``32`` as the width argument of ``__shfl*``
warp-size-const    a warp-size constant (``WARP_SIZE``, ``kWarpSize``, ``lanes_per_warp``...) set to 32
=================  ===============================================================================

Two explicit rules keep the lint honest rather than noisy, and each is printed when it applies:

* code inside a preprocessor branch on a vendor macro (``#if defined(__HIP__)`` ... ``#else`` ...
  ``#endif``, also ``__HIP_PLATFORM_AMD__``, ``__AMDGCN_WAVEFRONT_SIZE``, ``USE_ROCM``) is vendor-specific
  by construction and not linted: that is how portable code spells per-vendor choices;
* a file that declares itself NVIDIA-only with a ``// tilefuse: ... portable=no reason="..."`` line (the
  ladder's mma.sync and Hopper rungs, the emulator) is reported as NVIDIA-only with its reason, and neither
  linted nor translated.

Translation uses ``torch.utils.hipify`` (its CUDA -> HIP name tables, out of place) on a private copy of
the files; :func:`compile_hip` compiles a translation for ``gfx90a``/``gfx942`` with clang
(``TILEFUSE_HIP_CLANG``, default clang-19): ``-x hip --offload-arch=... --cuda-device-only -nogpulib -S``.
With no ROCm install, ``tilefuse/cuda/hip_min`` stands in for ROCm's headers (clang's own HIP wrapper
header supplies the attributes and device math declarations); device libraries are not linked, so a call to
ROCm's math library (``erff``) stays an external call in the assembly.
"""
from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Iterable, Sequence

from .. import config, diskcache
from . import build as _build

SOURCE_SUFFIXES = (".cu", ".cuh", ".h", ".hpp", ".cuh.inc")
HIP_MIN = Path(__file__).resolve().parent / "hip_min"
ROCM_CANDIDATES = ("/opt/rocm",)
HIP_FLAGS = ("-x", "hip", "--cuda-device-only", "-nogpulib", "-O3", "-std=c++17", "-S")
HIP_FLAGS_NO_ROCM = ("-nogpuinc", "-include", "__clang_hip_runtime_wrapper.h")
HIP_TIMEOUT_S = 600
HIP_FORMAT = "1"  # bump when the HIP report's content or parsing changes
AMD_ARCHES = ("gfx90a", "gfx942")  # what clang-19 and the CI check; gfx950 needs LLVM 20

VENDOR_MACROS = re.compile(r"__HIP__|__HIPCC__|__HIP_PLATFORM_\w+|__HIP_DEVICE_COMPILE__|__AMDGCN\w*|__gfx\w+|"
                           r"USE_ROCM|__HIP_ARCH\w*")
THREAD_INDEX_SEEDS = re.compile(r"\bthreadIdx\b|\b__lane_id\s*\(|%laneid")
THREAD_INDEX_NAMES = {"tid", "lane", "lane_id", "laneid", "laneId", "thread_id", "threadId", "thread_idx",
                      "warp_id", "warpid", "warpId"}
WARP_INTRINSIC = re.compile(r"\b__\w+_sync\s*\(|\b__ballot\w*\s*\(|\b__activemask\s*\(|\b__syncwarp\s*\(")
WARP_SIZE_NAME = re.compile(r"(?i)^(k?_?warp_?size|warp_?sz|k?_?warp_?lanes|k?_?lanes_?per_?warp|"
                            r"k?_?threads_?per_?warp|kwarp|warp_?width)$")

PORTABLE_MASK = ("a lane mask as wide as the wavefront: ~lanemask_t(0) with lanemask_t = unsigned long long "
                 "under __HIP__ (tilefuse/cuda/ladder/common.cuh), or __activemask()")


@dataclasses.dataclass(frozen=True)
class Finding:
    path: str
    line: int
    rule: str
    what: str  # what assumes 32 lanes
    portable: str  # the portable form

    def format(self) -> str:
        return f"{self.path}:{self.line}: {self.what}; portable: {self.portable}"


# ------------------------------------------------------------------------------------------------ lint
def _vendor_lines(code: str) -> set[int]:
    """1-based lines inside a preprocessor branch conditioned on a vendor macro (or the directives)."""
    lines, stack = set(), []  # stack of bools: this #if group tests a vendor macro
    for no, line in enumerate(code.splitlines(), 1):
        d = re.match(r"\s*#\s*(if|ifdef|ifndef|elif|else|endif)\b(.*)", line)
        if d:
            kind, cond = d.group(1), d.group(2)
            if kind in ("if", "ifdef", "ifndef"):
                stack.append(bool(VENDOR_MACROS.search(cond)))
            elif kind == "elif" and stack:
                stack[-1] = stack[-1] or bool(VENDOR_MACROS.search(cond))
            elif kind == "endif" and stack:
                lines.add(no)
                stack.pop()
                continue
        if any(stack):
            lines.add(no)
    return lines


def _statements(code: str) -> list[tuple[int, str]]:
    """(start offset, text) of each statement-ish piece: split at ';', '{' and '}'."""
    out, start = [], 0
    for m in re.finditer(r"[;{}]", code):
        out.append((start, code[start:m.start()]))
        start = m.end()
    out.append((start, code[start:]))
    return out


def _split_top(text: str, sep: str = ",") -> list[str]:
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch in "([{<":
            depth += 1 if ch != "<" else 0
        if ch in ")]}":
            depth -= 1
        if ch == sep and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return parts


_SUBSCRIPT = re.compile(r"\[[^\[\]]*\]")
_ASSIGN = re.compile(r"\b([A-Za-z_]\w*)\s*(\[[^\]]*\])?\s*(?<![=!<>+\-*/%&|^])=(?!=)")


def _thread_index_names(code: str) -> set[str]:
    """Identifiers holding thread indices: the usual names, plus anything assigned from threadIdx or from
    one of them (file-wide, to a fixpoint)."""
    tainted = set(THREAD_INDEX_NAMES)
    assignments = []
    for _, stmt in _statements(code):
        for piece in _split_top(stmt):
            m = _ASSIGN.search(piece)
            if m and not m.group(2):  # a[i] = ... stores a value: it does not make a an index
                assignments.append((m.group(1), piece[m.end():]))
    for _ in range(10):
        grew = False
        for name, rhs in assignments:
            if name in tainted:
                continue
            rhs = _SUBSCRIPT.sub("", rhs)  # a[tid] is a value, not an index
            if THREAD_INDEX_SEEDS.search(rhs) or any(re.search(rf"\b{re.escape(t)}\b", rhs) for t in tainted):
                tainted.add(name)
                grew = True
        if not grew:
            break
    return tainted


def _left_operand(code: str, end: int) -> str:
    """The operand just left of ``code[end]``: an identifier chain (a.b[i]) or a parenthesised group."""
    i = end - 1
    while i >= 0 and code[i] in " \t":
        i -= 1
    if i >= 0 and code[i] == ")":
        depth = 0
        j = i
        while j >= 0:
            if code[j] == ")":
                depth += 1
            elif code[j] == "(":
                depth -= 1
                if depth == 0:
                    break
            j -= 1
        k = j - 1
        while k >= 0 and (code[k].isalnum() or code[k] in "_."):
            k -= 1
        return code[k + 1:i + 1]
    j, depth = i, 0
    while j >= 0:
        ch = code[j]
        if ch == "]":
            depth += 1
        elif ch == "[":
            if depth == 0:
                break
            depth -= 1
        elif not (ch.isalnum() or ch in "_." or depth > 0):
            break
        j -= 1
    return code[j + 1:i + 1]


_LANE_OPS = [  # (operator and literal, what the expression computes, the portable form)
    (re.compile(r"(?<![&])&(?![&=])\s*(31|0x1[fF])\b(?![.\w])"), "&", "the lane index of a 32-lane warp",
     "% warpSize (or & (warpSize - 1))"),
    (re.compile(r"%(?!=)\s*(32|0x20)\b(?![.\w])"), "%", "the lane index of a 32-lane warp", "% warpSize"),
    (re.compile(r"(?<![/*])/(?![/*=])\s*(32|0x20)\b(?![.\w])"), "/", "the warp index for 32-lane warps",
     "/ warpSize"),
    (re.compile(r"(?<![>])>>(?!=)\s*(5)\b(?![.\w])"), ">>", "the warp index for 32-lane warps", "/ warpSize"),
]
_SHFL_CALL = re.compile(r"\b(__shfl(?:_up|_down|_xor)?)(_sync)?\s*\(")
_BALLOT32 = re.compile(r"\b(unsigned\s+int|unsigned|uint32_t|int|int32_t|unsigned\s+long(?!\s+long))\s+"
                       r"([A-Za-z_]\w*)\s*=\s*__ballot\w*\s*\(")
_BALLOT_VAR = re.compile(r"\b([A-Za-z_]\w*)\s*=\s*__ballot\w*\s*\(")
_POPC = re.compile(r"\b(__popc|__ffs|__clz|__brev)\s*\(")
_MASK_LITERAL = re.compile(r"\b0[xX][fF]{8}(?:[uU][lL]{0,2}|[lL]{1,2}[uU]?)?\b")
_WARP_CONST = [re.compile(r"^\s*#\s*define\s+([A-Za-z_]\w*)\s+\(?\s*32[uU]?\s*\)?\s*$", re.M),
               re.compile(r"\b(?:constexpr|const)\s+(?:static\s+)?(?:unsigned\s+int|unsigned|int|size_t|uint32_t|auto)\s+"
                          r"([A-Za-z_]\w*)\s*=\s*32[uU]?\s*[;,]")]


def _call_args(code: str, open_paren: int) -> tuple[list[str], int]:
    """Top-level arguments of the call whose '(' is at ``open_paren``, and the offset after its ')'."""
    depth, i = 0, open_paren
    while i < len(code):
        if code[i] == "(":
            depth += 1
        elif code[i] == ")":
            depth -= 1
            if depth == 0:
                return [a.strip() for a in _split_top(code[open_paren + 1:i])], i + 1
        i += 1
    return [a.strip() for a in _split_top(code[open_paren + 1:])], len(code)


def lint_text(text: str, path: str = "<source>") -> list[Finding]:
    """Every 32-lane assumption in one CUDA C++ source text (see the module docstring for the rules)."""
    code = _build.strip_comments(text)
    skip = _vendor_lines(code)
    line_of = _line_index(code)
    tainted = _thread_index_names(code)
    found: dict[tuple[int, str], Finding] = {}

    def add(offset: int, rule: str, what: str, portable: str) -> None:
        line = line_of(offset)
        if line in skip or (line, rule) in found:
            return
        found[(line, rule)] = Finding(path, line, rule, what, portable)

    # lane-mask: 0xffffffff in a statement with a warp intrinsic, or assigned to a *mask* variable
    for start, stmt in _statements(code):
        for m in _MASK_LITERAL.finditer(stmt):
            before = stmt[:m.start()]
            assigned = re.search(r"\b(\w*[mM]ask\w*)\s*(?:=|\()\s*$", before) or \
                re.search(r"\b\w*[mM]ask\w*\s*=", before)
            if WARP_INTRINSIC.search(stmt) or assigned:
                add(start + m.start(), "lane-mask", f"lane mask {m.group(0)} covers 32 lanes (a 64-lane wavefront "
                    "leaves lanes 32-63 out)", PORTABLE_MASK)
    # lane-index: & 31, % 32, / 32, >> 5 on a thread index
    for regex, op, what, portable in _LANE_OPS:
        for m in regex.finditer(code):
            operand = " ".join(_left_operand(code, m.start()).split())
            value = _SUBSCRIPT.sub("", operand)  # a[tid] is a value, not an index
            if set(re.findall(r"[A-Za-z_]\w*", value)) & tainted or THREAD_INDEX_SEEDS.search(value):
                add(m.start(), "lane-index", f"'{operand} {op} {m.group(1)}' computes {what}",
                    f"{operand} {portable}")
    # shuffles: reductions starting at 16, hard widths of 32
    for m in _SHFL_CALL.finditer(code):
        args, _ = _call_args(code, code.index("(", m.end() - 1))
        sync = bool(m.group(2))
        width_at = 3 if sync else 2
        if len(args) > width_at and re.fullmatch(r"32[uU]?", args[width_at]):
            add(m.start(), "shuffle-width", f"width 32 in {m.group(1)}{m.group(2) or ''}(...) shuffles within "
                "32-lane groups", "warpSize as the width (or leave it out: it defaults to warpSize)")
        offset_at = 2 if sync else 1
        if m.group(1) != "__shfl" and len(args) > offset_at and re.fullmatch(r"16[uU]?", args[offset_at]):
            add(m.start(), "shuffle-reduction", "unrolled shuffle steps starting at offset 16 (16, 8, 4, 2, 1) "
                "reduce over 32 lanes only", "a loop for (int offset = warpSize / 2; offset > 0; offset /= 2)")
    for m in re.finditer(r"\bfor\s*\(", code):
        header, after = _call_args(code, code.index("(", m.start()))
        init = ",".join(header).split(";")[0] if header else ""
        body = code[after:after + 600]
        if re.search(r"=\s*16[uU]?\s*$", init.strip()) or re.search(r"=\s*16[uU]?\b", init):
            depth_body = _loop_body(code, after)
            if _SHFL_CALL.search(depth_body or body):
                add(m.start(), "shuffle-reduction", "a shuffle loop starting at offset 16 (16, 8, 4, 2, 1: five "
                    "steps) reduces over 32 lanes only", "for (int offset = warpSize / 2; offset > 0; offset /= 2)")
    # ballot results in 32 bits, and 32-bit bit counts of them
    ballot_vars = set()
    for m in _BALLOT32.finditer(code):
        ballot_vars.add(m.group(2))
        add(m.start(), "ballot-32", f"the __ballot result is kept in a 32-bit '{' '.join(m.group(1).split())}' (on "
            "64 lanes the ballot has 64 bits: lanes 32-63 are lost)",
            "unsigned long long (or auto / lanemask_t), counted with __popcll, found with __ffsll")
    ballot_vars |= {m.group(1) for m in _BALLOT_VAR.finditer(code)}
    for m in _POPC.finditer(code):
        args, _ = _call_args(code, code.index("(", m.end() - 1))
        arg = args[0] if args else ""
        if "__ballot" in arg or set(re.findall(r"[A-Za-z_]\w*", arg)) & ballot_vars:
            add(m.start(), "ballot-32", f"{m.group(1)}() of a ballot looks at 32 lanes",
                f"{m.group(1)}ll() on the 64-bit ballot")
    # warp-size constants set to 32
    for regex in _WARP_CONST:
        for m in regex.finditer(code):
            if WARP_SIZE_NAME.match(m.group(1)):
                add(m.start(), "warp-size-const", f"warp-size constant {m.group(1)} = 32",
                    "warpSize (a run-time value: 64 on AMD CDNA), or a per-vendor constant chosen under "
                    "#if defined(__HIP__) (__AMDGCN_WAVEFRONT_SIZE)")
    return sorted(found.values(), key=lambda f: (f.line, f.rule))


def _loop_body(code: str, after: int) -> str:
    """The body of a loop whose header ended at ``after``: a {...} block or one statement."""
    i = after
    while i < len(code) and code[i] in " \t\n":
        i += 1
    if i < len(code) and code[i] == "{":
        depth = 0
        for j in range(i, len(code)):
            if code[j] == "{":
                depth += 1
            elif code[j] == "}":
                depth -= 1
                if depth == 0:
                    return code[i:j + 1]
        return code[i:]
    j = code.find(";", i)
    return code[i:j + 1 if j >= 0 else len(code)]


def _line_index(code: str):
    starts = [0] + [m.end() for m in re.finditer("\n", code)]

    def line_of(offset: int) -> int:
        lo, hi = 0, len(starts)
        while lo + 1 < hi:
            mid = (lo + hi) // 2
            if starts[mid] <= offset:
                lo = mid
            else:
                hi = mid
        return lo + 1
    return line_of


# ------------------------------------------------------------------------------------- files and policy
@dataclasses.dataclass(frozen=True)
class FileReport:
    path: Path
    nvidia_only: str | None  # the declared reason when the file says portable=no
    findings: tuple[Finding, ...]


def nvidia_only_reason(text: str) -> str | None:
    """The reason of a ``// tilefuse: ... portable=no reason="..."`` declaration, or None."""
    meta = _build.parse_metadata(text)
    if meta and meta.get("portable") == "no":
        return meta.get("reason") or "declared portable=no"
    return None


def collect(paths: Iterable[str | Path]) -> list[Path]:
    """The source files named, folders searched recursively for .cu/.cuh/.h/.hpp files."""
    files: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if not p.exists():
            raise FileNotFoundError(f"{raw}: no such file or folder")
        if p.is_dir():
            files += sorted(f for f in p.rglob("*") if f.is_file() and f.name.endswith(SOURCE_SUFFIXES)
                            and "hip_min" not in f.parts)
        else:
            files.append(p)
    seen, out = set(), []
    for f in files:
        key = f.resolve()
        if key not in seen:
            seen.add(key)
            out.append(f)
    return out


def lint_files(paths: Iterable[str | Path]) -> list[FileReport]:
    reports = []
    for f in collect(paths):
        text = f.read_text(errors="replace")
        reason = nvidia_only_reason(text)
        findings = () if reason else tuple(lint_text(text, str(f)))
        reports.append(FileReport(f, reason, findings))
    return reports


# ---------------------------------------------------------------------------------------- translation
_HIPIFY_LOCK = threading.Lock()  # hipify keeps its results in a module-level dict
HIP_HEADER = "// HIP translation of {name} by `tilefuse port` (torch.utils.hipify); do not edit: edit {name}.\n"


def translate(sources: Sequence[Path], out_dir: Path, *, with_headers: bool = True) -> dict[Path, Path]:
    """Write the HIP translation of ``sources`` (and, with ``with_headers``, the local headers they include,
    except headers declared NVIDIA-only) under ``out_dir``, keeping their layout relative to their common
    folder; ``.cu`` files become ``.hip``. Returns source -> translation."""
    files = [Path(s).resolve() for s in sources]
    if with_headers:
        for s in list(files):
            for h in _build.local_includes(s):
                if h not in files and nvidia_only_reason(h.read_text(errors="replace")) is None:
                    files.append(h)
    if not files:
        return {}
    root = Path(os.path.commonpath([str(f.parent) for f in files]))
    try:
        from torch.utils.hipify import hipify_python
    except ImportError as exc:  # torch is a dependency; a broken install should say what is missing
        raise RuntimeError(f"torch.utils.hipify is needed for the HIP translation: {exc}") from None
    out_dir = Path(out_dir)
    result: dict[Path, Path] = {}
    with tempfile.TemporaryDirectory(prefix="tilefuse-port-") as tmp, _HIPIFY_LOCK:
        src_root, work = Path(tmp) / "src", Path(tmp) / "out"
        for f in files:
            dst = src_root / f.relative_to(root)
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(f, dst)
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            done = hipify_python.hipify(project_directory=str(src_root), output_directory=str(work),
                                        includes=["*"], show_progress=False, show_detailed=False,
                                        is_pytorch_extension=False, hip_clang_launch=True,
                                        extensions=(".cu", ".cuh", ".c", ".cc", ".cpp", ".h", ".hpp"),
                                        header_extensions=(".cuh", ".h", ".hpp"))
        by_rel = {}
        for key, res in done.items():
            rel = Path(os.path.relpath(key, work))
            hip_path = getattr(res, "hipified_path", None)
            by_rel[rel] = Path(hip_path) if hip_path and Path(hip_path).exists() else Path(key)
        for f in files:
            rel = f.relative_to(root)
            translated = by_rel.get(rel, work / rel)
            text = translated.read_text() if translated.exists() else f.read_text()
            text = re.sub(r"^// !!! This is a file automatically generated by hipify!!!\n", "", text)
            name = translated.name if translated.suffix == ".hip" else rel.name
            if f.suffix == ".cu" and not name.endswith(".hip"):
                name = rel.stem + ".hip"
            target = out_dir / rel.parent / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(HIP_HEADER.format(name=f.name) + text)
            result[f] = target
        HIPIFY_RESULTS_CLEAR(hipify_python)
    return result


def HIPIFY_RESULTS_CLEAR(module) -> None:  # noqa: N802  (hipify's own global)
    """hipify accumulates every file it saw in a module-level dict: forget this call's temporary files."""
    results = getattr(module, "HIPIFY_FINAL_RESULT", None)
    if isinstance(results, dict):
        for key in [k for k in results if "tilefuse-port-" in str(k)]:
            del results[key]


# ------------------------------------------------------------------------------------------ HIP compile
@dataclasses.dataclass
class HipKernel:
    name: str
    vgprs: int | None
    sgprs: int | None
    vgpr_spills: int
    sgpr_spills: int
    lds_bytes: int
    scratch_bytes: int
    wavefront_size: int | None


@dataclasses.dataclass
class HipBuild:
    source: str
    arch: str
    ok: bool
    error: str
    asm_path: str | None
    kernels: list[HipKernel]
    external_calls: list[str]  # symbols called but not defined (ROCm device library functions, -nogpulib)
    command: list[str]
    seconds: float
    cached: bool = False

    @property
    def vgprs(self) -> int | None:
        return max((k.vgprs or 0 for k in self.kernels), default=None)

    @property
    def spills(self) -> int | None:
        return sum(k.vgpr_spills + k.sgpr_spills for k in self.kernels) if self.kernels else None

    @property
    def lds_bytes(self) -> int | None:
        return max((k.lds_bytes for k in self.kernels), default=None)


def rocm_path() -> Path | None:
    for cand in ROCM_CANDIDATES:
        if (Path(cand) / "include" / "hip" / "hip_runtime.h").exists():
            return Path(cand)
    return None


def hip_compiler() -> str | None:
    clang = config.get().hip_clang
    return clang if _build.compiler_version(clang) else None


def hip_command(source: Path, arch: str, output: Path) -> list[str]:
    clang = config.get().hip_clang
    rocm = rocm_path()
    extra = [f"--rocm-path={rocm}"] if rocm else [*HIP_FLAGS_NO_ROCM, f"-I{HIP_MIN}"]
    return [clang, *HIP_FLAGS, f"--offload-arch={arch}", *extra, "-o", str(output), str(source)]


_META_FIELD = re.compile(r"^\s+\.(\w+):\s+(\S+)\s*$")


def parse_amdgpu_asm(asm: str) -> tuple[list[HipKernel], list[str]]:
    """Per-kernel VGPRs, SGPRs, spills, LDS and scratch from the amdhsa metadata of clang's ``-S`` output,
    and the external functions it calls."""
    kernels = []
    meta = asm[asm.find("amdhsa.kernels:"):] if "amdhsa.kernels:" in asm else ""
    for block in re.split(r"\n\s+- \.", meta)[1:]:
        fields = {}
        for line in ("  ." + block).splitlines():
            m = _META_FIELD.match(line)
            if m:
                fields.setdefault(m.group(1), m.group(2))
        if "name" not in fields:
            continue

        def num(key):
            try:
                return int(fields[key])
            except (KeyError, ValueError):
                return None
        kernels.append(HipKernel(name=_build._demangle([fields["name"]])[0], vgprs=num("vgpr_count"),
                                 sgprs=num("sgpr_count"), vgpr_spills=num("vgpr_spill_count") or 0,
                                 sgpr_spills=num("sgpr_spill_count") or 0,
                                 lds_bytes=num("group_segment_fixed_size") or 0,
                                 scratch_bytes=num("private_segment_fixed_size") or 0,
                                 wavefront_size=num("wavefront_size")))
    called = set(re.findall(r"\b([A-Za-z_]\w*)@rel32@lo", asm))
    defined = set(re.findall(r"^([A-Za-z_]\w*):", asm, re.M))
    return kernels, sorted(called - defined)


def compile_hip(source: Path, arch: str, include_files: Sequence[Path] = ()) -> HipBuild:
    """Compile one HIP translation for ``arch`` (device code only, to assembly), cached by the source, the
    files it includes, the command and clang's version. Compile errors are the result, not raised."""
    clang = hip_compiler()
    source = Path(source)
    if clang is None:
        return HipBuild(str(source), arch, False, f"{config.get().hip_clang} not found (TILEFUSE_HIP_CLANG)", None,
                        [], [], [], 0.0)
    cmd = hip_command(source, arch, Path("OUT.s"))
    pieces = [HIP_FORMAT, arch, " ".join(cmd[1:-3]), _build.compiler_version(clang), source.read_bytes()]
    for inc in list(include_files) + ([] if rocm_path() else sorted((HIP_MIN / "hip").glob("*.h"))):
        pieces += [inc.name, inc.read_bytes()]
    key = diskcache.digest(*pieces)
    folder = diskcache.folder("cuda", "hip")
    report_path = folder / f"{source.stem}-{arch}-{key}.json"
    hit = diskcache.read_json(report_path)
    if hit is not None and (not hit.get("asm_path") or Path(hit["asm_path"]).exists()):
        hit["kernels"] = [HipKernel(**k) for k in hit["kernels"]]
        built = HipBuild(**hit)
        built.cached = True
        return built
    with _build._locked(folder / f".{source.stem}-{arch}-{key}.lock"):  # one compile, even from several processes
        hit = diskcache.read_json(report_path)
        if hit is not None and (not hit.get("asm_path") or Path(hit["asm_path"]).exists()):
            hit["kernels"] = [HipKernel(**k) for k in hit["kernels"]]
            built = HipBuild(**hit)
            built.cached = True
            return built
        return _compile_hip(source, arch, clang, report_path, folder / f"{source.stem}-{arch}-{key}.s")


def _compile_hip(source: Path, arch: str, clang: str, report_path: Path, asm: Path) -> HipBuild:
    cmd = hip_command(source, arch, asm)
    start = time.perf_counter()
    if config.get().progress:
        print(f"[tilefuse] compiling {source.name} for {arch} with {Path(clang).name} ...", file=sys.stderr, flush=True)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=source.parent, timeout=HIP_TIMEOUT_S)
        ok, log = proc.returncode == 0, (proc.stdout + proc.stderr).strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        ok, log = False, str(exc)
    seconds = round(time.perf_counter() - start, 2)
    kernels, external = parse_amdgpu_asm(asm.read_text()) if ok and asm.exists() else ([], [])
    built = HipBuild(str(source), arch, ok, "" if ok else _first_errors(log), str(asm) if ok else None, kernels,
                     external, cmd, seconds)
    if ok or "error:" in log:  # a real compile result is stable; a crash may be environmental
        diskcache.write_json(report_path, {**dataclasses.asdict(built), "cached": False})
    return built


def _first_errors(log: str, limit: int = 1500) -> str:
    errors = [ln for ln in log.splitlines() if "error" in ln]
    text = "\n".join(errors[:8]) or log
    return text[:limit]


# ---------------------------------------------------------------------------------------------- the CLI
SKIP_RULE = ("rule: a file declaring `// tilefuse: ... portable=no reason=\"...\"` is NVIDIA-only by design; it is "
             "reported, not linted or translated")
VENDOR_RULE = ("rule: code under a vendor-macro branch (#if defined(__HIP__) ... #else ... #endif) is per-vendor by "
               "design and not linted")


def main(paths: Sequence[str], out_dir: str | None) -> int:
    """``tilefuse port PATH... [-o DIR]``: lint, print findings, translate with -o; 1 on a finding, else 0."""
    reports = lint_files(paths)
    if not reports:
        print("tilefuse port: no .cu/.cuh/.h files in " + " ".join(map(str, paths)), file=sys.stderr)
        return 2
    findings = [f for r in reports for f in r.findings]
    for f in findings:
        print(f.format())
    skipped = [r for r in reports if r.nvidia_only]
    for r in skipped:
        print(f"{r.path}: NVIDIA-only ({r.nvidia_only}): not linted or translated")
    if skipped:
        print(SKIP_RULE)
    if any(_vendor_lines(_build.strip_comments(r.path.read_text(errors="replace"))) for r in reports if not r.nvidia_only):
        print(VENDOR_RULE)
    if out_dir:
        portable = [r.path for r in reports if not r.nvidia_only]
        written = translate(portable, Path(out_dir))
        for src, dst in written.items():
            print(f"wrote {dst} (from {src.name})")
    linted = len(reports) - len(skipped)
    verdict = f"{len(findings)} finding(s)" if findings else "clean"
    print(f"tilefuse port: {linted} file(s) linted, {len(skipped)} NVIDIA-only skipped: {verdict}",
          file=sys.stderr)
    return 1 if findings else 0
