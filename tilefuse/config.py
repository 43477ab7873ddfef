"""Every environment variable tilefuse reads, read once, typed and documented.

No other module of tilefuse reads ``os.environ``: they call :func:`get` and read a field. Tests change
settings with :func:`override`, which needs no environment at all.

=========================  =========================================================================
variable                   meaning
=========================  =========================================================================
``TILEFUSE_DEBUG``         0 (default) quiet; 1 kernel names, fallbacks, timings; 2 also the generated
                           and selected kernel sources; 3 also the IR after each compiler pass.
``TILEFUSE_CACHE_DIR``     where compiled kernels, tuning decisions, CUDA builds and measured ceilings
                           are kept. Default ``$XDG_CACHE_HOME/tilefuse`` (``~/.cache/tilefuse``).
``TILEFUSE_AUTOTUNE``      1: tune GEMM configs on a GPU on first use of a shape bucket (the winner is
                           stored on disk); 0: use the heuristic default config. Default 1 on a GPU.
                           The interpreter never tunes (autotune with several configs cannot run there).
``TILEFUSE_INTERPRET``     ``auto`` (default): Triton's interpreter on CPU tensors when no GPU is
                           present; ``1``: force the interpreter even with a GPU; ``0``: never (kernels
                           are compiled, which on a machine with no GPU is only good for cross-compiling).
``TILEFUSE_STRICT``        1: the compiler raises where it would otherwise fall back to ATen (tests use
                           it so a fallback cannot hide a lowering bug). Default 0.
``TILEFUSE_CHECK_BOUNDS``  1: on Triton's interpreter, every load and store of every kernel is checked
                           against its pointer argument's storage (a stray access raises, naming the
                           kernel, the argument and the offset: tilefuse.compiler.runtime.interpreter_check).
                           Default 0. Slow: for debugging and the fuzzer.
``TILEFUSE_CUDAGRAPHS``    1: compiled graphs are recorded into CUDA graphs and replayed, as with
                           ``torch.compile(..., mode="reduce-overhead")`` (tilefuse.compiler.cudagraphs).
                           Default 0.
``TILEFUSE_NVCC``          the nvcc used to build the CUDA C++ ladder (default ``nvcc``).
``TILEFUSE_HIP_CLANG``     the clang used to compile the HIP translation (default ``clang-19``).
``TILEFUSE_GIT_SHA``       the commit recorded in benchmark rows (for a snapshot of a commit run on a device
                           machine, whose tree has no ``.git`` of its own); default: asked of git.
``TILEFUSE_PROGRESS``      1 (default): show progress while tuning or building takes more than a moment;
                           0: never.
``TILEFUSE_TUNE_WAIT_S``   under torchrun, how long a rank other than local rank 0 waits for local rank
                           0's tuning decision to reach the disk cache (default 300); past it, that
                           rank runs the heuristic default for the key, untuned and not stored.
``LOCAL_RANK``,            set by torchrun (read, never set, by tilefuse): only local rank 0 of a host
``LOCAL_WORLD_SIZE``       tunes GEMM configs; the others read its decisions from the shared disk cache.
=========================  =========================================================================

A value tilefuse cannot use never stops ``import tilefuse``: the settings read at import warn
(:class:`TilefuseConfigWarning`, naming the variable and the accepted values) and use the default for that
variable. :func:`load` called directly raises ``ValueError`` instead.

The warning categories tilefuse emits live here (the floor every layer may import) and are exported as
``tilefuse.TilefuseWarning`` and its subclasses, so a user can filter them:
``warnings.simplefilter("error", tilefuse.TilefuseFallbackWarning)``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import warnings
from pathlib import Path
from typing import Iterator, Mapping

class TilefuseWarning(UserWarning):
    """Base of every warning tilefuse emits."""


class TilefuseFallbackWarning(TilefuseWarning):
    """Work ran in ATen (or torch) instead of a tilefuse kernel: correct results, not tilefuse's code."""


class TilefuseCacheWarning(TilefuseWarning):
    """The disk cache healed itself: a bad entry was deleted and rebuilt, or an unusable cache folder was
    replaced by a private temporary one."""


class TilefuseConfigWarning(TilefuseWarning):
    """A ``TILEFUSE_*`` value could not be used; its default is in force."""


DEBUG_LEVELS = {0: "quiet", 1: "kernel names, fallbacks, timings", 2: "+ kernel sources", 3: "+ IR after each pass"}
INTERPRET_CHOICES = ("auto", "0", "1")


@dataclasses.dataclass(frozen=True)
class Config:
    debug: int
    cache_dir: Path
    autotune: bool | None  # None: decided by the device (on for a GPU)
    interpret: str  # one of INTERPRET_CHOICES
    strict: bool
    nvcc: str
    hip_clang: str
    progress: bool
    git_sha: str = ""
    tune_wait_s: float = 300.0
    local_rank: int | None = None  # torchrun's LOCAL_RANK; None outside a distributed launch
    local_world_size: int = 1  # torchrun's LOCAL_WORLD_SIZE
    check_bounds: bool = False  # interpreter: every load and store checked against its buffer
    cudagraphs: bool = False  # compiled graphs recorded into CUDA graphs (mode="reduce-overhead")


def _int_var(env: Mapping[str, str], name: str, default: int, allowed: range) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: expected an integer in {allowed.start}..{allowed.stop - 1}") from None
    if value not in allowed:
        raise ValueError(f"{name}={raw!r}: expected an integer in {allowed.start}..{allowed.stop - 1}")
    return value


def _launcher_int(env: Mapping[str, str], name: str, default: int | None, minimum: int) -> int | None:
    """A variable a launcher (torchrun) sets, not tilefuse's: a value tilefuse cannot use is ignored rather than
    refused, so an odd launcher never stops ``import tilefuse``."""
    try:
        value = int(env.get(name, "").strip())
    except ValueError:
        return default
    return value if value >= minimum else default


def _float_var(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: expected a number of seconds >= 0") from None
    if not value >= 0:
        raise ValueError(f"{name}={raw!r}: expected a number of seconds >= 0")
    return value


def _bool_var(env: Mapping[str, str], name: str, default: bool | None) -> bool | None:
    raw = env.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{name}={raw!r}: expected 0 or 1")


def _default_cache_dir(env: Mapping[str, str]) -> Path:
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tilefuse"


def _interpret_var(env: Mapping[str, str], name: str, default: str) -> str:
    value = env.get(name, default).strip().lower() or default
    if value not in INTERPRET_CHOICES:
        raise ValueError(f"{name}={value!r}: expected one of {', '.join(INTERPRET_CHOICES)}")
    return value


def load(env: Mapping[str, str] | None = None, *, strict: bool = True) -> Config:
    """Read the settings from ``env`` (default: the process environment).

    ``strict`` (default): a value that cannot be used raises ``ValueError`` naming the variable and the
    accepted values. ``strict=False`` (the import of tilefuse): it warns the same message
    (:class:`TilefuseConfigWarning`) and that variable takes its default."""
    env = os.environ if env is None else env

    def parsed(read, name, default):
        try:
            return read(env, name, default)
        except ValueError as exc:
            if strict:
                raise
            warnings.warn(f"{exc}; using the default ({default!r}) instead", TilefuseConfigWarning, stacklevel=3)
            return default

    cache_dir = env.get("TILEFUSE_CACHE_DIR", "").strip()
    return Config(
        debug=parsed(lambda e, n, d: _int_var(e, n, d, range(0, 4)), "TILEFUSE_DEBUG", 0),
        cache_dir=Path(cache_dir).expanduser() if cache_dir else _default_cache_dir(env),
        autotune=parsed(_bool_var, "TILEFUSE_AUTOTUNE", None),
        interpret=parsed(_interpret_var, "TILEFUSE_INTERPRET", "auto"),
        strict=bool(parsed(_bool_var, "TILEFUSE_STRICT", False)),
        nvcc=env.get("TILEFUSE_NVCC", "").strip() or "nvcc",
        hip_clang=env.get("TILEFUSE_HIP_CLANG", "").strip() or "clang-19",
        progress=bool(parsed(_bool_var, "TILEFUSE_PROGRESS", True)),
        git_sha=env.get("TILEFUSE_GIT_SHA", "").strip(),
        tune_wait_s=parsed(_float_var, "TILEFUSE_TUNE_WAIT_S", 300.0),
        local_rank=_launcher_int(env, "LOCAL_RANK", None, minimum=0),
        local_world_size=_launcher_int(env, "LOCAL_WORLD_SIZE", 1, minimum=1) or 1,
        check_bounds=bool(_bool_var(env, "TILEFUSE_CHECK_BOUNDS", False)),
        cudagraphs=bool(parsed(_bool_var, "TILEFUSE_CUDAGRAPHS", False)),
    )


# At import a bad value warns and takes its default: `import tilefuse` never fails on the environment.
_current: Config = load(strict=False)


def get() -> Config:
    """The settings in force."""
    return _current


@contextlib.contextmanager
def override(**changes) -> Iterator[Config]:
    """Change settings for the duration of a ``with`` block (tests, and the CLI's flags)."""
    global _current
    saved = _current
    if "cache_dir" in changes:
        changes["cache_dir"] = Path(changes["cache_dir"])
    _current = dataclasses.replace(saved, **changes)
    try:
        yield _current
    finally:
        _current = saved


def set_for_process(**changes) -> Config:
    """Change settings for the rest of the process (the CLI uses it for its global flags)."""
    global _current
    if "cache_dir" in changes:
        changes["cache_dir"] = Path(changes["cache_dir"])
    _current = dataclasses.replace(_current, **changes)
    return _current


def log(level: int, message: str) -> None:
    """Print ``message`` to stderr when ``TILEFUSE_DEBUG`` is at least ``level``."""
    if _current.debug >= level:
        print(f"[tilefuse] {message}", file=sys.stderr, flush=True)
