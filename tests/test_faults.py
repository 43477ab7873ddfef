"""Fault injection (issue 28, "nothing silent, nothing lost"; issue 27's bf16 and out= faults).

Each test injects one fault a new user met and asserts the outcome: a correct result, one clear message
naming what was wrong, and nothing lost (a bad cache entry is deleted and rebuilt, never used and never
left behind). The faults: bad TILEFUSE_* values; a corrupt (non-UTF-8), torn or garbage cache entry; a
truncated, empty or random CUDA emulator library; a read-only or unusable cache folder; several threads and
several processes using the library and the caches at once; bad input that a cached plan would otherwise
let through; nn.Linear's errors and zero-size edge cases; numpy 2.4's removal of the array-to-scalar
conversion the interpreter relied on; bf16 dots on the interpreter; ``out=`` aliasing an input.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import tilefuse
from tilefuse import config, diskcache

from .support import assert_close, poison, poisoned_empty

REPO = Path(__file__).resolve().parents[1]


def _python(code: str, env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter with the repository on the path (and ``env`` added)."""
    full = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
                OMP_NUM_THREADS="1")
    full.update(env or {})
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full, timeout=timeout,
                          cwd=str(REPO))


# ------------------------------------------------------------------------------------------- settings
@pytest.mark.parametrize("name, value", [("TILEFUSE_DEBUG", "yes"), ("TILEFUSE_STRICT", "sometimes"),
                                         ("TILEFUSE_INTERPRET", "cpu"), ("TILEFUSE_TUNE_WAIT_S", "soon")])
def test_a_bad_setting_warns_at_import_and_takes_its_default(name, value):
    proc = _python("import warnings; warnings.simplefilter('always')\n"
                   "import tilefuse, torch\n"
                   "print('DEBUG', tilefuse.config.get().debug)\n"
                   "print('GEMM', float((tilefuse.gemm(torch.ones(2, 3), torch.ones(3, 2)) - 3).abs().max()))",
                   {name: value})
    assert proc.returncode == 0, proc.stderr
    assert "DEBUG 0" in proc.stdout and "GEMM 0.0" in proc.stdout
    assert f"{name}={value.lower()!r}" in proc.stderr or f"{name}={value!r}" in proc.stderr
    assert "TilefuseConfigWarning" in proc.stderr and "using the default" in proc.stderr


def test_a_bad_setting_is_a_clear_error_when_loaded_strictly():
    with pytest.raises(ValueError, match=r"TILEFUSE_DEBUG='yes': expected an integer in 0\.\.3"):
        config.load({"TILEFUSE_DEBUG": "yes"})
    with pytest.warns(tilefuse.TilefuseConfigWarning, match="TILEFUSE_DEBUG='yes'"):
        assert config.load({"TILEFUSE_DEBUG": "yes"}, strict=False).debug == 0


def test_warning_categories_are_exported_and_filterable():
    for cls in (tilefuse.TilefuseFallbackWarning, tilefuse.TilefuseCacheWarning, tilefuse.TilefuseConfigWarning):
        assert issubclass(cls, tilefuse.TilefuseWarning) and issubclass(cls, UserWarning)
    with warnings.catch_warnings():
        warnings.simplefilter("error", tilefuse.TilefuseWarning)
        with pytest.raises(tilefuse.TilefuseConfigWarning):
            config.load({"TILEFUSE_STRICT": "x"}, strict=False)
