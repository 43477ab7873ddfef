"""Counters of what the compiler did in this process, and the per-graph reports ``explain`` shows.

``graphs``: graphs compiled (each forward, backward or inference graph AOTAutograd hands over);
``kernels``: kernels generated for them (a kernel reused by a second graph counts again);
``kernels_compiled``: kernels that were new to the disk cache (written, then compiled by Triton);
``cache_hits``: kernels served from the disk cache (Triton's own cache then skips its compile on a GPU);
``fallbacks``: ``(node or graph, reason)`` for everything that ran in ATen instead of a tilefuse kernel;
``externs``: extern nodes (ATen calls) in the compiled graphs, by design (matmul) or by fallback.

With CUDA graphs (``mode="reduce-overhead"``, :mod:`.cudagraphs`): ``cudagraph_recordings`` (graphs recorded),
``cudagraph_rerecordings`` (of those, recorded again for a graph already recorded: a new shape or moved
parameters), ``cudagraph_replays``, ``cudagraph_uncaptured_calls`` (calls of a graph in that mode that ran
uncaptured), ``cudagraph_step_trials`` (pools' step trials decided: captured steps timed against uncaptured ones,
each graph's ``step_trial`` says how it came out), ``cudagraphs`` (one dict a graph: recordings, replays, rerecordings, the shapes recorded, the
uncaptured reasons with their counts, the bytes its recordings hold) and ``cudagraph_pool_bytes`` (the bytes
the live pools' recordings hold: outputs and input buffers).

A fallback is never silent: :func:`add_fallback` (a whole graph, or a graph at one shape, runs in ATen) warns
once for it with :class:`tilefuse.TilefuseFallbackWarning` and its reason, at every debug level;
:func:`add_op_fallbacks` (ops of a compiled graph that run in ATen) warns one summary a graph.
"""
from __future__ import annotations

import collections
import dataclasses
import threading
import warnings
from typing import Any

from .. import config

_lock = threading.Lock()
_counters: dict[str, Any] = {}
REPORTS: "collections.deque[GraphReport]" = collections.deque(maxlen=512)
_listeners: list[list] = []  # explain() collects the reports made while it runs
CUDAGRAPHS: "dict[int, CudaGraphReport]" = {}  # graph id -> what mode="reduce-overhead" did with it


_generation = 0  # reset() counts up: what a CUDA-graph runner keeps of its report is stale after one


def reset() -> None:
    global _generation
    with _lock:
        _generation += 1
        _counters.clear()
        _counters.update(graphs=0, kernels=0, kernels_compiled=0, cache_hits=0, fallbacks=[], externs=0,
                         graph_fallbacks=0, replans=0, compile_seconds=0.0, cudagraph_recordings=0,
                         cudagraph_rerecordings=0, cudagraph_step_trials=0)
        REPORTS.clear()
        CUDAGRAPHS.clear()


reset()


def bump(key: str, n=1) -> None:
    with _lock:
        _counters[key] = _counters.get(key, 0) + n


REASON_CHARS = 300  # a reason longer than this is cut in the warning (explain and stats keep it whole)
SUMMARY_OPS = 5  # per-op fallbacks named in a graph's one warning
_summarised: set = set()  # graph ids whose per-op fallbacks were warned about (a dynamic graph plans per shape)


def _short(reason: str, chars: int = REASON_CHARS) -> str:
    reason = " ".join(str(reason).split())
    return reason if len(reason) <= chars else reason[:chars - 3] + "..."


def add_fallback(where: str, reason: str) -> None:
    """``where`` (a whole graph) runs in ATen: counted, and one warning with the reason."""
    with _lock:
        _counters["fallbacks"].append((where, reason))
    warnings.warn(f"tilefuse: {where} runs in ATen, not on tilefuse's kernels: {_short(reason)} "
                  f"(TILEFUSE_STRICT=1 raises instead)", config.TilefuseFallbackWarning, stacklevel=3)


def add_op_fallbacks(graph_id: int, kind: str, fallbacks: list) -> None:
    """Ops of graph ``graph_id`` that run in ATen: each counted; one warning a graph names them."""
    if not fallbacks:
        return
    with _lock:
        _counters["fallbacks"].extend(fallbacks)
        first = graph_id not in _summarised
        _summarised.add(graph_id)
    if first:
        shown = "; ".join(f"{where}: {_short(why, 200)}" for where, why in fallbacks[:SUMMARY_OPS])
        more = f"; and {len(fallbacks) - SUMMARY_OPS} more" if len(fallbacks) > SUMMARY_OPS else ""
        warnings.warn(f"tilefuse: graph {graph_id} ({kind}): {len(fallbacks)} op(s) run in ATen, not on tilefuse's "
                      f"kernels: {shown}{more} (tilefuse.explain shows them all)", config.TilefuseFallbackWarning,
                      stacklevel=3)


def snapshot() -> dict:
    with _lock:
        out = dict(_counters)
        out["fallbacks"] = list(out["fallbacks"])
        out["cudagraphs"] = [r.as_dict() for r in CUDAGRAPHS.values()]
        # counted on the graphs' reports alone (a call's bump of a shared counter took a lock a call)
        out["cudagraph_replays"] = sum(r.replays for r in CUDAGRAPHS.values())
        out["cudagraph_uncaptured_calls"] = sum(sum(r.uncaptured.values()) for r in CUDAGRAPHS.values())
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


@dataclasses.dataclass
class CudaGraphReport:
    """What ``mode="reduce-overhead"`` did with one compiled graph (updated as it runs)."""
    graph_id: int
    kind: str
    recordings: int = 0
    rerecordings: int = 0
    replays: int = 0
    invalidated: int = 0  # outputs still referenced when a replay overwrote them (reading one raises)
    held_bytes: int = 0
    # the last recording's inputs: used at their address (parameters, buffers, a backward's saved tensors that
    # live in the pool) and copied into buffers it owns (their bytes are part of held_bytes)
    inputs_in_place: int = 0
    inputs_copied: int = 0
    copied_bytes: int = 0
    shapes: list = dataclasses.field(default_factory=list)  # the input shapes of each recording
    uncaptured: dict = dataclasses.field(default_factory=dict)  # reason -> calls
    call_us: float | None = None  # the host time of the uncaptured call the replay-cost rule timed (None: none was)
    call_gpu_us: float | None = None  # ... and its GPU time (None: not measured)
    step_trial: str = ""  # what its pool's step trial found, where one decided for it

    @property
    def captured(self) -> bool:
        return self.recordings > 0

    def as_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out["captured"] = self.captured
        out["uncaptured"] = dict(self.uncaptured)
        return out

    def describe(self) -> str:
        if self.captured:
            head = (f"cuda graph: captured ({self.recordings} recordings, {self.rerecordings} re-recordings, "
                    f"{self.replays} replays, {self.held_bytes / 2**20:.1f} MiB held)\n"
                    f"    inputs of the last recording: {self.inputs_in_place} used in place, {self.inputs_copied} "
                    f"copied ({self.copied_bytes / 2**20:.1f} MiB)")
        elif self.uncaptured:
            head = "cuda graph: not captured"
        else:
            head = ("cuda graph: not captured yet (the first call of each shape is the warm-up, and the second may be "
                    "timed)")
        lines = [head] + [f"    uncaptured ({n} calls): {why}" for why, n in self.uncaptured.items()]
        if self.call_us is not None:
            gpu = "" if self.call_gpu_us is None else f", {self.call_gpu_us:.0f} us of GPU time"
            lines.append(f"    uncaptured call timed for the replay-cost rule: {self.call_us:.0f} us of host time{gpu}")
        if self.step_trial:
            lines.append(f"    {self.step_trial}")
        return "\n".join(lines)


def cudagraph_report(graph_id: int, kind: str) -> CudaGraphReport:
    with _lock:
        report = CUDAGRAPHS.get(graph_id)
        if report is None:
            report = CUDAGRAPHS[graph_id] = CudaGraphReport(graph_id, kind)
        return report
