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
``cudagraphs`` True / False: record compiled graphs into CUDA  ``TILEFUSE_CUDAGRAPHS``
               graphs and replay them (what ``mode=
               "reduce-overhead"`` turns on; :mod:`.cudagraphs`)
=============  ==============================================  ===============================

Modes (``torch.compile(..., mode=)``; torch.compile refuses ``mode`` and ``options`` together):
``None``/``"default"`` compiles with the settings above; ``"reduce-overhead"`` is ``{"cudagraphs": True}``;
``"max-autotune"`` and ``"max-autotune-no-cudagraphs"`` compile the default with a warning (tilefuse does not
autotune its generated kernels); any other mode is a ``ValueError`` naming the accepted ones.

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
    "cudagraphs": (_flag, "True or False"),
}

# mode -> the options it stands for (None: the default, with a warning that tilefuse has nothing more for it)
MODES: dict[str, dict[str, Any] | None] = {
    "default": {},
    "reduce-overhead": {"cudagraphs": True},
    "max-autotune": None,
    "max-autotune-no-cudagraphs": None,
}


def mode_options(mode: str | None) -> tuple[dict[str, Any], str | None]:
    """(the options ``mode`` stands for, a warning to give or None); ``ValueError`` for an unknown mode."""
    if mode is None:
        return {}, None
    if not isinstance(mode, str) or mode not in MODES:
        raise ValueError(f"tilefuse backend: mode={mode!r} is not a mode; accepted modes are "
                         f"{', '.join(repr(m) for m in MODES)} (tilefuse.compiler.options)")
    opts = MODES[mode]
    if opts is None:
        return {}, (f"tilefuse backend: mode={mode!r} compiles tilefuse's default (tilefuse does not autotune "
                    f"its generated kernels)")
    return dict(opts), None


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
