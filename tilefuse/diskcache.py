"""The on-disk cache under ``TILEFUSE_CACHE_DIR``: one folder a kind of entry, atomic writes.

Writers rename a finished temporary file into place, so a reader in another process (another rank of a
distributed job, a second Python process) sees either the whole old entry or the whole new one.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from . import config


def folder(*parts: str) -> Path:
    """``TILEFUSE_CACHE_DIR/<parts...>``, created if missing."""
    path = config.get().cache_dir.joinpath(*parts)
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


def write_bytes(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def write_text(path: Path, text: str) -> Path:
    return write_bytes(path, text.encode())


def write_json(path: Path, value: Any) -> Path:
    return write_text(path, json.dumps(value, indent=1, sort_keys=True) + "\n")


def read_json(path: Path) -> Any | None:
    """The JSON value at ``path``, or None if it is missing or unreadable (a stale or torn entry is a miss)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
