"""``torch.compile(model, backend="tilefuse", options={...})``: the settings a user passes per model.

Each key is a setting of :mod:`tilefuse.config` (whose environment variables stay the defaults); a key given
here applies while this model's graphs are compiled (its forward, backward and inference graphs, also those
compiled later for a new shape or at the first backward):

=============  ==============================================  ===============================
key            accepted values                                 environment default
=============  ==============================================  ===============================
``debug``      0, 1, 2, 3 (see ``TILEFUSE_DEBUG``)              ``TILEFUSE_DEBUG``
``strict``     True / False: raise where ATen would run        ``TILEFUSE_STRICT``
``cache_dir``  a folder (str or Path) for kernels and tuning   ``TILEFUSE_CACHE_DIR``
``autotune``   True / False: tune GEMM configs on a GPU        ``TILEFUSE_AUTOTUNE``
=============  ==============================================  ===============================

An unknown key or a value outside these is a ``ValueError`` naming it and what is accepted, raised by
``torch.compile``'s first call, before anything is compiled.
"""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping


def _debug(v):
    if isinstance(v, bool) or not isinstance(v, int) or v not in range(4):
        raise ValueError
    return v


def _flag(v):
    if not isinstance(v, bool):
        raise ValueError
    return v


def _folder(v):
    if not isinstance(v, (str, Path)) or not str(v).strip():
        raise ValueError
    return Path(v).expanduser()


# key -> (check returning the config value, what is accepted)
OPTIONS: dict[str, tuple[Callable[[Any], Any], str]] = {
    "debug": (_debug, "an int 0-3"),
    "strict": (_flag, "True or False"),
    "cache_dir": (_folder, "a folder path (str or pathlib.Path)"),
    "autotune": (_flag, "True or False"),
}


def validate(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """The config overrides ``options`` asks for; ``ValueError`` for an unknown key or a bad value."""
    if not options:
        return {}
    if not isinstance(options, Mapping):
        raise TypeError(f"tilefuse backend: options must be a dict, got {type(options).__name__}")
    unknown = sorted(str(k) for k in options if k not in OPTIONS)
    if unknown:
        raise ValueError(f"tilefuse backend: unknown option(s) {', '.join(map(repr, unknown))}; accepted keys are "
                         f"{', '.join(OPTIONS)} (tilefuse.compiler.options)")
    out = {}
    for key, value in options.items():
        check, accepted = OPTIONS[key]
        try:
            out[key] = check(value)
        except (ValueError, TypeError):
            raise ValueError(f"tilefuse backend: options[{key!r}]={value!r}: accepted values are {accepted}") from None
    return out


@contextlib.contextmanager
def applied(overrides: Mapping[str, Any]) -> Iterator[None]:
    """The settings of one model's ``options`` in force (nothing changes for an empty dict)."""
    if not overrides:
        yield
        return
    from .. import config

    with config.override(**overrides):
        yield
