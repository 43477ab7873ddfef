"""Counters of what the compiler did in this process, and the per-graph reports ``explain`` shows.

``graphs``: graphs compiled (each forward, backward or inference graph AOTAutograd hands over);
``kernels``: kernels generated for them (a kernel reused by a second graph counts again);
``kernels_compiled``: kernels that were new to the disk cache (written, then compiled by Triton);
``cache_hits``: kernels served from the disk cache (Triton's own cache then skips its compile on a GPU);
``fallbacks``: ``(node or graph, reason)`` for everything that ran in ATen instead of a tilefuse kernel;
``externs``: extern nodes (ATen calls) in the compiled graphs, by design (matmul) or by fallback.
"""
from __future__ import annotations

import collections
import dataclasses
import threading
from typing import Any

_lock = threading.Lock()
_counters: dict[str, Any] = {}
REPORTS: "collections.deque[GraphReport]" = collections.deque(maxlen=512)
_listeners: list[list] = []  # explain() collects the reports made while it runs


def reset() -> None:
    with _lock:
        _counters.clear()
        _counters.update(graphs=0, kernels=0, kernels_compiled=0, cache_hits=0, fallbacks=[], externs=0,
                         graph_fallbacks=0, replans=0, compile_seconds=0.0)
        REPORTS.clear()


reset()


def bump(key: str, n=1) -> None:
    with _lock:
        _counters[key] = _counters.get(key, 0) + n


def add_fallback(where: str, reason: str) -> None:
    with _lock:
        _counters["fallbacks"].append((where, reason))


def snapshot() -> dict:
    with _lock:
        out = dict(_counters)
        out["fallbacks"] = list(out["fallbacks"])
        return out


@dataclasses.dataclass
class KernelReport:
    name: str
    form: str
    fuses: list  # FX node names ("name:aten.op")
    stores: list
    path: str = ""


@dataclasses.dataclass
class GraphReport:
    """What one graph became: fusion groups (kernels), externs, fallbacks, timings."""
    graph_id: int
    kind: str  # forward | backward | inference
    aten_nodes: int
    kernels: list = dataclasses.field(default_factory=list)
    externs: list = dataclasses.field(default_factory=list)  # (node, op, reason or None)
    fallbacks: list = dataclasses.field(default_factory=list)
    whole_graph_fallback: str | None = None
    seconds: dict = dataclasses.field(default_factory=dict)


def record(report: GraphReport) -> None:
    with _lock:
        REPORTS.append(report)
        for sink in _listeners:
            sink.append(report)
