"""``tilefuse.explain(fn, *args)`` and ``tilefuse explain SCRIPT``: what the compiler made of a program.

For every graph: graph breaks and their reasons (from ``torch._dynamo.explain``), the fusion groups (which
ATen nodes each generated kernel fuses, what it writes), extern calls into ATen, and fallbacks with their
reasons. ``explain`` resets Dynamo (as ``torch._dynamo.explain`` does) and runs ``fn`` once compiled with the
tilefuse backend; backward graphs appear when the program runs a backward pass itself.

With CUDA graphs on (``TILEFUSE_CUDAGRAPHS=1`` or ``tilefuse.config.override(cudagraphs=True)``: what
``mode="reduce-overhead"`` turns on), each graph also says whether it is captured (recordings, re-recordings,
replays, the memory its recordings hold) or why it runs uncaptured. The lines are read from the live records
each time the explanation is printed: the first call of a shape is the warm-up, so call ``fn`` again and print
the explanation again to see the captures.
"""
from __future__ import annotations

import dataclasses
from contextlib import contextmanager
from typing import Any

import torch

from . import records


@dataclasses.dataclass
class Explanation:
    graph_count: int
    graph_break_count: int
    break_reasons: list  # str
    graphs: list  # records.GraphReport
    result: Any = None
    attention: list = dataclasses.field(default_factory=list)  # patterns_attention.Outcome, one a candidate

    @property
    def kernels(self) -> list:
        return [k for g in self.graphs for k in g.kernels]

    @property
    def library_calls(self) -> list:
        """(node, op) of the calls into tilefuse's kernel families (the flash attention of a matched attention)."""
        return [(node, op) for g in self.graphs for node, op, *_ in g.externs if _is_library(op)]

    @property
    def fallbacks(self) -> list:
        out = []
        for g in self.graphs:
            out.extend(g.fallbacks)
            if g.whole_graph_fallback:
                out.append((f"{g.kind} graph", g.whole_graph_fallback))
        return out

    def __str__(self) -> str:
        lines = [f"Dynamo: {self.graph_count} graphs, {self.graph_break_count} graph breaks"]
        for k, reason in enumerate(self.break_reasons):
            lines.append(f"  graph break {k + 1}: {reason}")
        lines.append(f"tilefuse: {len(self.graphs)} compiled graphs, {len(self.kernels)} kernels "
                     f"(one per fusion group), {sum(len(g.externs) for g in self.graphs)} extern calls, "
                     f"{len(self.fallbacks)} fallbacks")
        for outcome in self.attention:
            lines.append(f"  {outcome}")
        for g in self.graphs:
            lines.append("")
            lines.append(_format_graph(g))
        if not self.fallbacks:
            lines.append("\nno fallback to ATen")
        return "\n".join(lines)

    __repr__ = __str__


def _is_library(op: str) -> bool:
    return op.startswith("tilefuse.")


def _format_graph(g: records.GraphReport) -> str:
    head = f"graph {g.graph_id} ({g.kind}): {g.aten_nodes} ATen nodes -> {len(g.kernels)} fusion groups"
    lines = [head]
    if g.whole_graph_fallback:
        lines.append(f"  fallback: the whole graph runs in ATen: {g.whole_graph_fallback}")
    for k, kern in enumerate(g.kernels):
        lines.append(f"  group {k}: kernel {kern.name} [{kern.form}]")
        lines.append(f"    fuses {len(kern.fuses)} ATen nodes: {', '.join(kern.fuses)}")
        lines.append(f"    writes {', '.join(kern.stores) if kern.stores else 'nothing (values stay in registers)'}")
        if kern.path:
            lines.append(f"    source {kern.path}")
    for node, op, reason, *note in g.externs:
        if reason:
            why = f"(fallback: {reason})"
        elif _is_library(op):
            why = "(tilefuse library kernel)"
        else:
            why = f"(ATen: {note[0]})" if note and note[0] else "(ATen by design)"
        lines.append(f"  extern {node}: {op} {why}")
    for where, reason in g.fallbacks:
        lines.append(f"  fallback {where}: {reason}")
    cuda_graph = records.CUDAGRAPHS.get(g.graph_id)
    if cuda_graph is not None:
        lines.append("  " + cuda_graph.describe())
    if g.seconds:
        lines.append("  compile times: " + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in g.seconds.items()))
    return "\n".join(lines)


@contextmanager
def collecting(attention: list | None = None):
    """Collect the graph reports (and into ``attention`` the attention pass's outcomes) made while it runs."""
    from .patterns import attention as patterns_attention

    sink: list = []
    records._listeners.append(sink)
    if attention is not None:
        patterns_attention._sinks.append(attention)
    try:
        yield sink
    finally:
        records._listeners.remove(sink)
        if attention is not None:
            patterns_attention._sinks.remove(attention)


def _break_reasons(dyn) -> list[str]:
    out = []
    for r in getattr(dyn, "break_reasons", []) or []:
        text = getattr(r, "reason", str(r))
        stack = getattr(r, "user_stack", None)
        if stack:
            frame = stack[-1]
            text += f" (at {getattr(frame, 'filename', '?')}:{getattr(frame, 'lineno', '?')})"
        out.append(text)
    return out


def explain(fn, *args, **kwargs) -> Explanation:
    """Compile ``fn`` with the tilefuse backend, run it on ``args``, and report what became of it."""
    dyn = torch._dynamo.explain(fn)(*args, **kwargs)
    torch._dynamo.reset()
    attention: list = []
    with collecting(attention) as sink:
        result = torch.compile(fn, backend="tilefuse")(*args, **kwargs)
    return Explanation(int(dyn.graph_count), int(dyn.graph_break_count), _break_reasons(dyn), list(sink), result,
                       attention)
