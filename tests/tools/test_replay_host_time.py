"""tools/replay_host_time.py runs the runner's bookkeeping of a training step as autograd drives it: the step
start finds no backward pending, the backward's replay finds none of its outputs in use, and nothing handed out
is invalidated (nothing is kept across steps)."""
from __future__ import annotations

import math

from tilefuse.compiler.runtime import cudagraphs

from tests.support import load_tool


def _tool():
    return load_tool("replay_host_time")


def test_replay_host_time_drives_a_step_with_nothing_invalidated(monkeypatch):
    marked = []
    monkeypatch.setattr(cudagraphs, "_set_error", lambda s: marked.append(s))
    us = _tool().step_us(saved=6, grads=4, steps=3)
    assert math.isfinite(us) and us > 0
    assert marked == [], "a step of the tool invalidated an output: it kept one across steps"
