"""Build the CUDA C++ ladder: one shared library a rung, compiled by nvcc (or by the host compiler for the CPU
emulator), cached on disk, with its resource report and SASS inspected.

Each ``tilefuse/cuda/ladder/rung<K>_<name>.cu`` carries one metadata line near its top::

    // tilefuse: rung=6 arch=sm_80 portable=no reason="..." claims=HMMA emulate=yes dynamic_smem=147456

=============  ====================================================================================
key            meaning
=============  ====================================================================================
``rung``       the rung's name, "1".."9" or "5s"; the library exports ``tilefuse_rung<rung>``
``arch``       the target it is written for: ``sm_80`` (runs on sm_80 and newer) or ``sm_90a``
``portable``   ``yes``: no NVIDIA-only PTX, translated to HIP and compiled for AMD; ``no``: NVIDIA-only
``reason``     why it is NVIDIA-only (quoted; with ``portable=no``)
``claims``     the SASS instruction its kernels must contain (``HMMA``, ``HGMMA``, ``FFMA``)
``emulate``    ``yes``: also builds as host C++ on the SIMT emulator (emulator.h) for CPU tests
``dynamic_smem``  bytes of dynamic shared memory a block asks for at launch (ptxas reports static only)
=============  ====================================================================================

Builds (:func:`build`):

- ``target`` = the rung's own arch (default): what CI checks. nvcc ``-shared -Xcompiler -fPIC -O3 -std=c++17
  -Xptxas -v`` with ``-gencode=arch=compute_80,code=sm_80`` or ``-gencode=arch=compute_90a,code=sm_90a``.
- ``target`` = another NVIDIA arch (``sm_90``, ``sm_100``): an sm_80 rung's code compiled for that GPU
  (``arch=compute_80,code=sm_90``): what a launch on that GPU loads (SASS is not portable across major
  architectures, so the sm_80 cubin would not load on an H200). :func:`device_target` picks it.
- ``target="host"``: the emulator build (``g++ -x c++ -DTILEFUSE_CPU_EMULATION``), for CPU tensors.

A build's cache key is a hash of the rung's source, every local header it includes (recursively), the
compiler command and the compiler's version, so editing any of them rebuilds and nothing else does. Entries
live under ``diskcache.folder("cuda")``; a file lock per entry makes concurrent processes (pytest workers,
ranks) wait for one build instead of repeating it. A failed compile raises :class:`BuildError` with the
compiler's own message.

An entry records its library's size and sha256; a library that no longer matches them (truncated, emptied,
overwritten: :func:`library_problem`) is never handed to ``dlopen``, where a truncated ELF file dies of
SIGBUS with no message: the entry is reported once with its path, deleted and rebuilt.
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from .. import config, diskcache

LADDER_DIR = Path(__file__).resolve().parent / "ladder"  # one .cu a rung, and the headers they share
BUILD_FORMAT = "2"  # bump when the report's content or the parsing changes: old entries become misses

NVCC_FLAGS = ("-shared", "-Xcompiler", "-fPIC", "-O3", "-std=c++17", "-Xptxas", "-v")
GENCODE = {"sm_80": "-gencode=arch=compute_80,code=sm_80", "sm_90a": "-gencode=arch=compute_90a,code=sm_90a"}
HOST_TARGET = "host"
HOST_COMPILERS = ("g++", "c++", "clang++")
# -O1: the emulator runs every thread as a context, so optimisation buys little at test sizes (-O2 took
# 2.6 s a rung to compile against 2.1 s, for no measurable gain at 129x136x200).
HOST_FLAGS = ("-x", "c++", "-std=c++17", "-O1", "-shared", "-fPIC", "-DTILEFUSE_CPU_EMULATION")
NVCC_TIMEOUT_S = 900  # rung 9 takes ~14 s on a 2-core machine; a hung compiler must not hang CI
RUNG_KEYS = {"rung", "arch", "portable", "reason", "claims", "emulate", "dynamic_smem"}
KNOWN_ARCHES = tuple(GENCODE)
SASS_LOCAL_MEMORY = ("LDL", "STL")
EMULATOR_HEADERS = ("emulator.h",)  # included only under TILEFUSE_CPU_EMULATION  # local-memory loads/stores: spills or stack arrays


class BuildError(RuntimeError):
    """A rung did not compile (the message carries the compiler's output) or a tool is missing."""


# ------------------------------------------------------------------------------------------ the rungs
@dataclasses.dataclass(frozen=True)
class Rung:
    name: str  # "1".."9", "5s"
    path: Path
    arch: str  # "sm_80" | "sm_90a"
    portable: bool
    reason: str  # why NVIDIA-only ("" when portable)
    claims: str  # SASS instruction the kernels must contain
    emulate: bool
    dynamic_smem: int | None

    @property
    def symbol(self) -> str:
        return f"tilefuse_rung{self.name}"

    @property
    def order(self) -> tuple[int, str]:
        m = re.match(r"(\d+)(.*)", self.name)
        return (int(m.group(1)), m.group(2)) if m else (10 ** 6, self.name)

    @property
    def title(self) -> str:
        """The header's first sentence after 'Rung K, ': e.g. 'naive' or 'tensor cores'."""
        text = self.path.read_text()
        m = re.search(rf"//\s*Rung {re.escape(self.name)}[,:]\s*([^:.\n]+)", text)
        return m.group(1).strip() if m else self.path.stem.split("_", 1)[-1].replace("_", " ")

    def includes(self) -> list[Path]:
        return local_includes(self.path)

    def lines_of_code(self, with_headers: bool = False) -> int:
        """Lines of code of the rung's file (with ``with_headers``, also of the headers it includes for the
        GPU: the CPU emulator's header is not part of the kernel)."""
        paths = [self.path] + ([h for h in self.includes() if h.name not in EMULATOR_HEADERS] if with_headers else [])
        return sum(count_code_lines(p.read_text()) for p in paths)


_META_LINE = re.compile(r"^\s*//\s*tilefuse:\s*(.*)$")
_META_PAIR = re.compile(r'(\w+)=("([^"]*)"|\S+)')


def parse_metadata(text: str) -> dict[str, str] | None:
    """The key=value pairs of the first ``// tilefuse:`` line in the first 20 lines, or None."""
    for line in text.splitlines()[:20]:
        m = _META_LINE.match(line)
        if m:
            return {k: (quoted if quoted is not None and raw.startswith('"') else raw)
                    for k, raw, quoted in _META_PAIR.findall(m.group(1))}
    return None


def _rung_from(path: Path) -> Rung:
    meta = parse_metadata(path.read_text())
    if meta is None or "rung" not in meta:
        raise BuildError(f"{path.name}: no '// tilefuse: rung=... arch=... portable=...' metadata line")
    unknown = set(meta) - RUNG_KEYS
    if unknown:
        raise BuildError(f"{path.name}: unknown metadata key(s) {sorted(unknown)}: known keys are {sorted(RUNG_KEYS)}")
    arch = meta.get("arch", "")
    if arch not in KNOWN_ARCHES:
        raise BuildError(f"{path.name}: arch={arch!r}: accepted values are {', '.join(KNOWN_ARCHES)}")
    portable = meta.get("portable", "no") == "yes"
    if not portable and not meta.get("reason"):
        raise BuildError(f"{path.name}: portable=no needs a reason=\"...\"")
    smem = meta.get("dynamic_smem")
    return Rung(name=meta["rung"], path=path, arch=arch, portable=portable, reason=meta.get("reason", ""),
                claims=meta.get("claims", ""), emulate=meta.get("emulate", "no") == "yes",
                dynamic_smem=int(smem) if smem else None)


def discover(folder: Path = LADDER_DIR) -> list[Rung]:
    """Every ``rung*.cu`` in ``folder``, in ladder order (1, 2, ..., 5, 5s, 6, ...)."""
    found = [_rung_from(p) for p in sorted(folder.glob("rung*.cu"))]
    names = [r.name for r in found]
    dupes = {n for n in names if names.count(n) > 1}
    if dupes:
        raise BuildError(f"rung name(s) {sorted(dupes)} declared by more than one file in {folder}")
    return sorted(found, key=lambda r: r.order)


@functools.lru_cache(maxsize=None)
def _rungs_cached(folder: str) -> tuple[Rung, ...]:
    return tuple(discover(Path(folder)))


def rung(name: str | int) -> Rung:
    """The rung called ``name`` (``6``, ``"6"``, ``"5s"``)."""
    by_name = {r.name: r for r in _rungs_cached(str(LADDER_DIR))}
    key = str(name)
    if key not in by_name:
        raise ValueError(f"rung={name!r}: accepted values are {', '.join(repr_rung(n) for n in by_name)}")
    return by_name[key]


def repr_rung(name: str) -> str:
    return name if name.isdigit() else repr(name)


_INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)


def local_includes(path: Path) -> list[Path]:
    """Headers included with quotes that exist beside the file (recursively), in first-seen order."""
    seen: list[Path] = []

    def walk(p: Path) -> None:
        for name in _INCLUDE.findall(p.read_text()):
            dep = (p.parent / name).resolve()
            if dep.exists() and dep not in seen:
                seen.append(dep)
                walk(dep)
    walk(path)
    return seen


def strip_comments(text: str) -> str:
    """C/C++ source with comments and string/char literal contents blanked, line structure kept."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("".join(ch if ch == "\n" else " " for ch in text[i:j]))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(c + " " * max(0, j - i - 2) + (c if j - i >= 2 else ""))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def count_code_lines(text: str) -> int:
    """Lines with code on them: not blank, not only a comment."""
    return sum(1 for line in strip_comments(text).splitlines() if line.strip())


# ------------------------------------------------------------------------------------------ the report
@dataclasses.dataclass
class Kernel:
    """One kernel's ptxas -v report."""
    name: str  # demangled, without the parameter list
    registers: int
    stack_bytes: int
    spill_stores: int
    spill_loads: int
    static_smem: int
    barriers: int

    @property
    def spills(self) -> int:
        return self.stack_bytes + self.spill_stores + self.spill_loads


@dataclasses.dataclass
class Build:
    rung: str
    target: str  # "sm_80", "sm_90", "sm_90a", ..., or "host"
    library: Path
    command: list[str]
    log: str  # compiler output (ptxas -v report included)
    kernels: list[Kernel]
    sass_counts: dict[str, int]  # opcode -> occurrences (empty for host builds or without cuobjdump)
    sass_path: Path | None
    seconds: float
    cached: bool = False
    library_bytes: int = 0  # the library's size and sha256 when it was built (checked before each load)
    library_sha256: str = ""

    @property
    def emulated(self) -> bool:
        return self.target == HOST_TARGET

    @property
    def registers(self) -> int | None:
        return max((k.registers for k in self.kernels), default=None)

    @property
    def spills(self) -> int | None:
        """Stack + spill bytes over every kernel (0 is what rungs 6-9 must have)."""
        return sum(k.spills for k in self.kernels) if self.kernels else None

    @property
    def static_smem(self) -> int | None:
        return max((k.static_smem for k in self.kernels), default=None)

    @property
    def local_memory_ops(self) -> int:
        return sum(self.sass_counts.get(op, 0) for op in SASS_LOCAL_MEMORY)

    @property
    def warnings(self) -> list[str]:
        return [ln.strip() for ln in self.log.splitlines() if "warning" in ln.lower()]

    def has(self, opcode: str) -> bool | None:
        """Whether the SASS contains ``opcode`` (None when there is no SASS to look at)."""
        if not self.sass_counts:
            return None
        return self.sass_counts.get(opcode, 0) > 0

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["library"] = str(self.library)
        d["sass_path"] = str(self.sass_path) if self.sass_path else None
        return d

    @classmethod
    def from_json(cls, d: dict) -> "Build":
        d = dict(d)
        d["library"] = Path(d["library"])
        d["sass_path"] = Path(d["sass_path"]) if d.get("sass_path") else None
        d["kernels"] = [Kernel(**k) for k in d["kernels"]]
        return cls(**d)


_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_PROPS = re.compile(r"Function properties for (\S+)")
_STACK = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers(?:, used (\d+) barriers)?(?:, (\d+) bytes smem)?")


def parse_ptxas(log: str) -> list[Kernel]:
    """Per-kernel registers, stack, spills, static shared memory and barriers from ``ptxas -v``.

    ptxas prints, per entry: "Compiling entry function 'X'", "Function properties for X" (then its stack
    line) and "Used N registers, ...". Properties of non-entry functions are ignored.
    """
    entries: dict[str, dict] = {}
    current = None
    props_for = None
    for line in log.splitlines():
        m = _ENTRY.search(line)
        if m:
            current = m.group(1)
            entries.setdefault(current, {})
            continue
        m = _PROPS.search(line)
        if m:
            props_for = m.group(1)
            continue
        m = _STACK.search(line)
        if m and props_for in entries:
            entries[props_for].update(stack=int(m.group(1)), stores=int(m.group(2)), loads=int(m.group(3)))
            continue
        m = _USED.search(line)
        if m and current in entries:
            entries[current].update(regs=int(m.group(1)), barriers=int(m.group(2) or 0), smem=int(m.group(3) or 0))
    names = _demangle(list(entries))
    return [Kernel(name=names[i], registers=e.get("regs", 0), stack_bytes=e.get("stack", 0),
                   spill_stores=e.get("stores", 0), spill_loads=e.get("loads", 0), static_smem=e.get("smem", 0),
                   barriers=e.get("barriers", 0)) for i, e in enumerate(entries.values())]


def _demangle(names: list[str]) -> list[str]:
    """``(anonymous namespace)::rung6_kernel<__half>`` style names (parameter lists dropped)."""
    if not names:
        return []
    tool = shutil.which("c++filt")
    if tool is None:
        return names
    try:
        out = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return names
    lines = out.splitlines()
    if len(lines) != len(names):
        return names
    short = []
    for full in lines:
        depth, cut = 0, len(full)
        for i, ch in enumerate(full):  # drop the parameter list: the first '(' outside template brackets
            if ch == "<":
                depth += 1
            elif ch == ">":
                depth -= 1
            elif ch == "(" and depth == 0 and not full.startswith("(anonymous", i):
                cut = i
                break
        short.append(full[:cut].replace("(anonymous namespace)::", ""))
    return short


_SASS_OP = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T\d]+\s+)?([A-Z][A-Z0-9_]*)")


def sass_opcodes(sass: str) -> dict[str, int]:
    """Opcode (without modifiers: ``HMMA``, ``HGMMA``, ``LDL``) -> count, from ``cuobjdump -sass``."""
    counts: dict[str, int] = {}
    for op in _SASS_OP.findall(sass):
        counts[op] = counts.get(op, 0) + 1
    return counts


def cuobjdump() -> str | None:
    """cuobjdump from the triton wheel (the dev and CI machines have no CUDA toolkit's), else the PATH."""
    try:
        from .. import targets

        return targets._tool("cuobjdump")
    except ImportError:  # no triton: the toolkit's, if any
        return shutil.which("cuobjdump")


# --------------------------------------------------------------------------------------------- building
def _progress(message: str) -> None:
    if config.get().progress:
        print(f"[tilefuse] {message}", file=sys.stderr, flush=True)


@functools.lru_cache(maxsize=None)
def compiler_version(compiler: str) -> str:
    """``compiler --version`` output ("" when it cannot be run)."""
    try:
        proc = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return proc.stdout.strip() if proc.returncode == 0 else ""


def have_nvcc() -> bool:
    return bool(compiler_version(config.get().nvcc))


def host_compiler() -> str | None:
    for name in HOST_COMPILERS:
        if shutil.which(name):
            return name
    return None


def nvcc_target(r: Rung, target: str) -> list[str]:
    """The -gencode flag that builds rung ``r`` for ``target``."""
    if target == r.arch:
        return [GENCODE[r.arch]]
    m = re.fullmatch(r"sm_(\d+)a?", target)
    if not m or r.arch != "sm_80" or int(m.group(1)) < 80:
        raise ValueError(f"rung {r.name} ({r.arch}) cannot be built for target={target!r}: accepted values are "
                         f"{r.arch}" + (" or sm_XY with XY >= 80" if r.arch == "sm_80" else ""))
    return [f"-gencode=arch=compute_80,code=sm_{m.group(1)}"]


def device_target(r: Rung, capability: tuple[int, int]) -> str:
    """The target to build rung ``r`` for so that it loads on a GPU of compute ``capability``."""
    major, minor = capability
    if r.arch == "sm_90a":
        if (major, minor) != (9, 0):
            raise ValueError(f"rung {r.name} is built for sm_90a (Hopper: {r.reason or 'wgmma, TMA'}), which runs "
                             f"only on compute capability 9.0; this GPU is {major}.{minor}")
        return "sm_90a"
    if (major, minor) < (8, 0):
        raise ValueError(f"rung {r.name} needs compute capability 8.0 or newer (cp.async, bf16); this GPU is "
                         f"{major}.{minor}")
    return "sm_80" if (major, minor) == (8, 0) else f"sm_{major}{minor}"


def command(r: Rung, target: str, output: Path) -> list[str]:
    if target == HOST_TARGET:
        cxx = host_compiler()
        if cxx is None:
            raise BuildError(f"no host C++ compiler ({', '.join(HOST_COMPILERS)}) for the emulator build")
        return [cxx, *HOST_FLAGS, "-o", str(output), str(r.path)]
    return [config.get().nvcc, *NVCC_FLAGS, *nvcc_target(r, target), "-o", str(output), str(r.path)]


def cache_key(r: Rung, target: str) -> str:
    tool = command(r, target, Path("OUT"))[0]
    pieces = [BUILD_FORMAT, target, " ".join(command(r, target, Path("OUT"))[1:-3]), compiler_version(tool),
              r.path.name, r.path.read_bytes()]
    for header in r.includes():
        pieces += [header.name, header.read_bytes()]
    return diskcache.digest(*pieces)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def build(name: str | int | Rung, target: str | None = None, *, emulate: bool = False) -> Build:
    """Build (or fetch from the cache) rung ``name`` for ``target`` (default: its own arch); ``emulate=True``
    builds the CPU emulator's host library instead. Raises :class:`BuildError` with the compiler's message."""
    r = name if isinstance(name, Rung) else rung(name)
    target = HOST_TARGET if emulate else (target or r.arch)
    if target == HOST_TARGET and not r.emulate:
        raise ValueError(f"rung {r.name} has no emulator build (emulate=yes is not in its metadata): "
                         f"{r.reason or 'it needs a GPU'}")
    if target != HOST_TARGET and not have_nvcc():
        raise BuildError(f"nvcc not found: TILEFUSE_NVCC={config.get().nvcc!r} cannot be run "
                         "(install the CUDA toolkit or point TILEFUSE_NVCC at nvcc)")
    key = cache_key(r, target)
    root = diskcache.folder("cuda")
    entry = root / f"rung{r.name}-{target}-{key}"
    report = entry / "report.json"
    hit = _read_report(report)
    if hit is not None:
        return hit
    with _locked(root / f".rung{r.name}-{target}-{key}.lock"):
        # another process may have built it while this one waited; a bad entry is removed here, under the
        # lock, so no other process is writing it meanwhile
        hit = _read_report(report, heal=True)
        if hit is not None:
            return hit
        return _compile(r, target, entry, report)


ELF_MAGIC = b"\x7fELF"


def library_problem(built: Build) -> str | None:
    """Why ``built.library`` must not be loaded (missing, no ELF header, another size or checksum than when
    it was built), or None when it is the library that was built. Checked before every ``dlopen``: a
    truncated shared library kills the process with SIGBUS inside the loader."""
    path = built.library
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(len(ELF_MAGIC))
    except FileNotFoundError:
        return "its library is missing"
    except OSError as exc:
        return f"its library cannot be read: {exc}"
    if head != ELF_MAGIC:
        return f"{path.name} is not an ELF shared library ({size} bytes, no ELF header)"
    if not built.library_sha256:
        return "no checksum was recorded for its library"
    if size != built.library_bytes:
        return f"{path.name} has {size} bytes where {built.library_bytes} were built (truncated or overwritten)"
    if diskcache.file_sha256(path) != built.library_sha256:
        return f"{path.name} does not match the checksum recorded when it was built"
    return None


def _read_report(report: Path, heal: bool = False) -> Build | None:
    """The cached build of an entry, or None. With ``heal``, an entry whose library fails
    :func:`library_problem` is reported and deleted (a torn or foreign report, always)."""
    data = diskcache.read_json(report, check=Build.from_json)
    if data is None:
        return None
    built = Build.from_json(data)
    problem = library_problem(built)
    if problem is not None:
        if heal:
            diskcache.discard(report.parent, problem)
        return None
    built.cached = True
    return built


def rebuild(built: Build, problem: str) -> Build:
    """A fresh build of the entry ``built`` came from, after its library failed a check (``problem``)."""
    diskcache.discard(built.library.parent, problem)
    if built.emulated:
        return build(built.rung, emulate=True)
    return build(built.rung, built.target)


def _compile(r: Rung, target: str, entry: Path, report: Path) -> Build:
    entry.mkdir(parents=True, exist_ok=True)
    library = entry / f"rung{r.name}.so"
    what = "host C++ (emulator)" if target == HOST_TARGET else f"nvcc {target}"
    _progress(f"building CUDA ladder rung {r.name} ({r.path.name}, {what}) ...")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=entry, prefix=".build-") as tmp:
        out = Path(tmp) / library.name
        cmd = command(r, target, out)
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, cwd=r.path.parent, timeout=NVCC_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise BuildError(f"{cmd[0]} timed out after {NVCC_TIMEOUT_S} s on {r.path.name} ({target})") from None
        except OSError as exc:
            raise BuildError(f"{cmd[0]} could not be run for {r.path.name}: {exc}") from None
        log = (proc.stdout + proc.stderr).strip()
        if proc.returncode != 0:
            raise BuildError(f"{Path(cmd[0]).name} failed on {r.path.name} ({target}), exit {proc.returncode}:\n"
                             f"{_compiler_errors(log)}")
        library_bytes, library_sha256 = out.stat().st_size, diskcache.file_sha256(out)
        os.replace(out, library)
    seconds = round(time.perf_counter() - start, 2)
    sass_counts, sass_path = {}, None
    if target != HOST_TARGET:
        tool = cuobjdump()
        if tool is not None:
            proc = subprocess.run([tool, "-sass", str(library)], capture_output=True, text=True, timeout=600)
            if proc.returncode == 0:
                sass_path = diskcache.write_text(entry / "sass.txt", proc.stdout)
                sass_counts = sass_opcodes(proc.stdout)
    built = Build(rung=r.name, target=target, library=library, command=cmd[:-3] + ["-o", str(library), str(r.path)],
                  log=log, kernels=parse_ptxas(log) if target != HOST_TARGET else [], sass_counts=sass_counts,
                  sass_path=sass_path, seconds=seconds, library_bytes=library_bytes, library_sha256=library_sha256)
    diskcache.write_json(report, built.to_json())  # written last: its presence means the entry is complete
    _progress(f"built rung {r.name} ({target}) in {seconds:.1f} s")
    return built


def _compiler_errors(log: str, limit: int = 6000) -> str:
    """The compiler's output without ptxas's info lines (the errors are what matters), trimmed."""
    lines = [ln for ln in log.splitlines() if not ln.startswith("ptxas info") and not re.match(r"\s+\d+ bytes stack", ln)]
    text = "\n".join(lines).strip() or log
    return text if len(text) <= limit else text[:limit // 2] + "\n...\n" + text[-limit // 2:]


def build_many(requests: Iterable[tuple[Rung, str]], jobs: int | None = None) -> list[Build | BuildError]:
    """Build several (rung, target) pairs in parallel (compilers are separate processes: threads suffice);
    each result is the Build or the BuildError it raised, in request order."""
    requests = list(requests)
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(requests) or 1))

    def one(req):
        r, target = req
        try:
            return build(r, emulate=True) if target == HOST_TARGET else build(r, target)
        except BuildError as exc:
            return exc
    with ThreadPoolExecutor(jobs) as pool:
        return list(pool.map(one, requests))


def check(built: Build, r: Rung | None = None) -> list[str]:
    """What is wrong with a GPU build against its rung's claims: the claimed SASS instruction missing, and
    (rungs 6 and up, the tensor-core ones) stack, spills or local-memory instructions. [] when all is well."""
    r = r or rung(built.rung)
    problems = []
    if built.emulated:
        return problems
    if r.claims and built.has(r.claims) is False:
        problems.append(f"no {r.claims} in the SASS")
    if r.order >= (6, ""):
        if built.spills:
            problems.append(f"{built.spills} bytes of stack/spills (ptxas)")
        if built.local_memory_ops:
            problems.append(f"{built.local_memory_ops} local-memory instructions (LDL/STL) in the SASS")
    return problems


def summary(built: Build) -> dict:
    """A small dict for logs and JSON: target, registers, spills, shared memory, SASS claim found."""
    r = rung(built.rung)
    return {"rung": built.rung, "target": built.target, "registers": built.registers, "spills": built.spills,
            "static_smem": built.static_smem, "dynamic_smem": r.dynamic_smem, "claims": r.claims,
            "claim_found": built.has(r.claims) if r.claims else None, "seconds": built.seconds,
            "cached": built.cached, "problems": check(built, r)}


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tilefuse.cuda.build [--target T] [--emulate] [RUNG ...]``: build and print the reports."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m tilefuse.cuda.build", description=main.__doc__)
    p.add_argument("rungs", nargs="*", help="rung names (default: all)")
    p.add_argument("--target", default=None, help="NVIDIA target (default: each rung's own arch)")
    p.add_argument("--emulate", action="store_true", help="host (emulator) builds")
    args = p.parse_args(argv)
    chosen = [rung(n) for n in args.rungs] or list(_rungs_cached(str(LADDER_DIR)))
    if args.emulate:
        chosen = [r for r in chosen if r.emulate]
    reqs = [(r, HOST_TARGET if args.emulate else (args.target or r.arch)) for r in chosen]
    status = 0
    for (r, target), res in zip(reqs, build_many(reqs)):
        if isinstance(res, BuildError):
            print(f"rung {r.name} ({target}): FAILED\n{res}")
            status = 1
            continue
        print(json.dumps(summary(res)))
        status = status or (1 if check(res, r) else 0)
    return status


if __name__ == "__main__":
    sys.exit(main())
