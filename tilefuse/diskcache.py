"""The on-disk cache under ``TILEFUSE_CACHE_DIR``: one folder a kind of entry; it heals and tells.

- **Atomic writes.** Writers rename a finished temporary file (unique to the writer) into place, so a reader
  in another process (another rank, a pytest worker, a second Python) sees either the whole old entry or the
  whole new one, and two writers of one entry leave one whole entry.
- **Validated reads.** Every read is checked before use: JSON is parsed under a guard and then checked by
  the caller's ``check`` (:func:`read_json`); a kernel file is compared with the source it is named for;
  a shared library against its recorded size, ELF header and checksum (``cuda/build.py``). An entry that
  fails is reported once with its path (:class:`~tilefuse.config.TilefuseCacheWarning`), deleted
  (:func:`discard`) and rebuilt by the caller, which sees a miss. It is never used, never left behind.
- **An unusable folder.** When ``TILEFUSE_CACHE_DIR`` cannot be created or written (read-only, a file, no
  permission, a read-only filesystem), this process caches in a private temporary folder instead, with one
  warning that names both: everything still runs on tilefuse's kernels, it is only not kept after exit.
"""
from __future__ import annotations

import atexit
import hashlib
import json
import os
import shutil
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Any, Callable

from . import config

def _read_umask() -> int:
    """The process's umask, read without changing it (os.umask sets as it reads: a race with other threads)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


# Entries get the mode a plain open() would give them (mkstemp makes 0600): a cache folder shared by several
# users (a team's TILEFUSE_CACHE_DIR) stays readable by all of them.
FILE_MODE = 0o666 & ~_read_umask()

_lock = threading.Lock()
_roots: dict[Path, Path] = {}  # configured folder -> the folder in use for it (itself, or a private one)
_reported: set[str] = set()  # bad entries already reported in this process (once each)


def root() -> Path:
    """The cache folder in use: ``TILEFUSE_CACHE_DIR``, or this process's private replacement when that
    folder cannot be written (see the module's note)."""
    configured = config.get().cache_dir
    used = _roots.get(configured)
    if used is None:
        with _lock:
            used = _roots.get(configured)
            if used is None:
                used = _roots[configured] = _usable_or_private(configured)
    return used


def _probe(folder: Path) -> None:
    """Raise OSError unless ``folder`` exists (or can be made) and a file can be created in it."""
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".probe-")
    os.close(fd)
    os.unlink(tmp)


def _usable_or_private(configured: Path, why: BaseException | None = None) -> Path:
    if why is None:
        try:
            _probe(configured)
            return configured
        except OSError as exc:
            why = exc
    private = Path(tempfile.mkdtemp(prefix="tilefuse-cache-"))
    atexit.register(shutil.rmtree, private, ignore_errors=True)
    warnings.warn(f"tilefuse: the cache folder {configured} cannot be used ({type(why).__name__}: {why}); this "
                  f"process caches in the private folder {private} instead (removed at exit, so compiled kernels "
                  f"and tuning are not kept). Set TILEFUSE_CACHE_DIR to a writable folder.",
                  config.TilefuseCacheWarning, stacklevel=4)
    return private


def _give_up_on(used: Path, why: BaseException) -> Path:
    """``used`` failed a write after it was probed: switch the configured folder to a private one (once)."""
    configured = config.get().cache_dir
    with _lock:
        if _roots.get(configured) == used:
            _roots[configured] = _usable_or_private(configured, why)
        return _roots[configured]


def folder(*parts: str) -> Path:
    """``<cache root>/<parts...>``, created if missing."""
    used = root()
    path = used.joinpath(*parts)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        path = _give_up_on(used, exc).joinpath(*parts)
        path.mkdir(parents=True, exist_ok=True)
    return path


def digest(*pieces: str | bytes, length: int = 20) -> str:
    """A stable hex key for cache entries (sha256 of the pieces, in order)."""
    h = hashlib.sha256()
    for piece in pieces:
        data = piece.encode() if isinstance(piece, str) else piece
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()[:length]


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# ------------------------------------------------------------------------------------------------ writes
def _write_once(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), FILE_MODE)
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_bytes(path: Path, data: bytes) -> Path:
    """Write ``data`` at ``path`` atomically; returns the path written. A path inside the cache whose write
    fails (the folder turned read-only or full) is written at the same place in this process's private
    folder instead, which later :func:`folder` calls return."""
    path = Path(path)
    try:
        _write_once(path, data)
        return path
    except OSError as exc:
        used = root()
        try:
            relative = path.relative_to(used)
        except ValueError:  # not a cache path: the caller's error
            raise exc from None
        moved = _give_up_on(used, exc) / relative
        if moved == path:
            raise
        _write_once(moved, data)
        return moved


def write_text(path: Path, text: str) -> Path:
    return write_bytes(path, text.encode())


def write_json(path: Path, value: Any) -> Path:
    return write_text(path, json.dumps(value, indent=1, sort_keys=True) + "\n")


# ------------------------------------------------------------------------------------------------- reads
def _stamp(st: os.stat_result) -> tuple:
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def read_bytes(path: Path) -> tuple[bytes, tuple] | None:
    """``(content, stamp)`` of the entry at ``path``, or None if there is none. The stamp identifies this
    version of the file for :func:`discard` (which leaves a newer version, written meanwhile, alone)."""
    try:
        with open(path, "rb") as f:
            stamp = _stamp(os.fstat(f.fileno()))
            return f.read(), stamp
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        discard(path, "a folder where a file belongs")
        return None
    except OSError as exc:  # unreadable (another user's 0600 file, an I/O error): a miss, said once
        discard(path, f"it cannot be read: {type(exc).__name__}: {exc}")
        return None


def read_json(path: Path, check: Callable[[Any], Any] | None = None) -> Any | None:
    """The JSON value at ``path``, or None for a miss. A missing entry is a miss; so is an entry that does
    not parse or that ``check(value)`` rejects (returns false or raises), which is reported once, deleted and
    so rebuilt by the caller."""
    got = read_bytes(path)
    if got is None:
        return None
    raw, stamp = got
    try:
        value = json.loads(raw)
    except ValueError as exc:  # torn, truncated, non-UTF-8, garbage
        discard(path, f"not valid JSON: {exc}", stamp)
        return None
    if check is not None:
        try:
            ok, why = bool(check(value)), "its content fails the reader's check"
        except Exception as exc:  # noqa: BLE001  (a malformed value makes the check raise: that is its verdict)
            ok, why = False, f"its content fails the reader's check: {type(exc).__name__}: {exc}"
        if not ok:
            discard(path, why, stamp)
            return None
    return value


def discard(path: Path, reason: str, stamp: tuple | None = None) -> None:
    """Delete a bad cache entry (a file or a folder) so that its reader rebuilds it; report it once with its
    path and ``reason``. With ``stamp`` (from :func:`read_bytes`), a file another process has replaced
    since it was read (with a good entry) is left alone."""
    path = Path(path)
    with _lock:
        first = str(path) not in _reported
        _reported.add(str(path))
    if first:
        warnings.warn(f"tilefuse: bad cache entry {path} ({reason}): deleted; it is rebuilt",
                      config.TilefuseCacheWarning, stacklevel=3)
    config.log(1, f"cache: discarding {path}: {reason}")
    try:
        if stamp is not None and _stamp(os.stat(path)) != stamp:
            return  # replaced meanwhile (atomically, by a writer): not the entry that was bad
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    except FileNotFoundError:
        pass
    except OSError as exc:  # cannot delete (a read-only folder): it is still never used
        config.log(1, f"cache: could not delete {path}: {exc}")
