"""tools/replay_host_time.py runs the runner's bookkeeping of a training step as autograd drives it: the step
start finds no backward pending, the backward's replay finds none of its outputs in use, and nothing handed out
is invalidated (nothing is kept across steps)."""
from __future__ import annotations

import importlib.util
import math
from pathlib import Path

from tilefuse.compiler.runtime import cudagraphs


def _tool():
    path = Path(__file__).resolve().parents[2] / "tools" / "replay_host_time.py"
    spec = importlib.util.spec_from_file_location("replay_host_time", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_replay_host_time_drives_a_step_with_nothing_invalidated(monkeypatch):
    marked = []
    monkeypatch.setattr(cudagraphs, "_set_error", lambda s: marked.append(s))
    us = _tool().step_us(saved=6, grads=4, steps=3)
    assert math.isfinite(us) and us > 0
    assert marked == [], "a step of the tool invalidated an output: it kept one across steps"
