"""The attention tests run their kernels with each kernel's first (default) config, as on the interpreter.

On a GPU every new shape would otherwise be tuned: a case's forward and backward compile and time up to 13
configs (forward 3, dK/dV 3 and dQ 2 for each of the backward's two dQ forms), ~12 s a test on an H100 host
and some 27 minutes for the directory (docs/lab-log.md). The tuner has its own tests (``tuning_enabled``
patched on); the tests marked ``gpu`` keep tuning on, so one end-to-end path a kernel is still tuned where it
runs.
"""
from __future__ import annotations

import pytest

from tilefuse import config


@pytest.fixture(autouse=True)
def default_configs_unless_a_gpu_test(request):
    if "gpu" in request.keywords:
        yield
        return
    with config.override(autotune=False):
        yield
