"""Input mutations written in place: ``copy_(x, index_put(x, ...))`` becomes ``index_put_(x, ...)``.

AOTAutograd functionalises a graph's writes into its inputs: a KV cache update ``cache[:, :, pos] = kv`` reaches the
backend as an out-of-place ``index_put`` (a new tensor the size of the whole cache, the old one copied in) and,
at the end of the graph, ``copy_(cache, that)`` (``keep_inference_input_mutations``). A decode step then reads
and writes each layer's cache three times over to write one row: the copy inside ``index_put``, the new
tensor, the copy back. Written in place, the step writes the row alone.

The rewrite is a pure function of the graph, applied before lowering. It fires only where it cannot change
what the graph computes:

- the op is in :data:`IN_PLACE` (its in-place form takes the same arguments and writes exactly the elements the
  out-of-place form changes), its first argument is a graph input ``x``, and a ``copy_(x, op)`` writes its result
  back into that same input;
- ``x`` has no other reader (a reader of the old value could be ordered after the write), is not among the op's
  other arguments (the indices or values), and the copy's result is unused;
- the op's result is not a graph output (the caller would get an alias of its own input where it got a new
  tensor);
- the result has the input's shape, strides and dtype, so every later reader sees the same layout.

The in-place op runs as an ATen extern (it is a fallback like ``index_put`` was, reported as one).
"""
from __future__ import annotations

import torch

aten = torch.ops.aten

# out-of-place op -> its in-place form with the same arguments
IN_PLACE = {
    aten.index_put.default: aten.index_put_.default,
    aten.index_copy.default: aten.index_copy_.default,
}


def _same_layout(a, b) -> bool:
    return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
            and a.stride() == b.stride() and a.dtype == b.dtype and a.device == b.device)


def _reads(args, node: torch.fx.Node) -> bool:
    found: list = []
    torch.fx.node.map_arg(args, found.append)
    return any(n is node for n in found)


def write_mutations_in_place(gm: torch.fx.GraphModule) -> list[str]:
    """Rewrite ``gm`` in place (see the module docs); returns the names of the ops it made in-place."""
    graph = gm.graph
    done = []
    for copy in [n for n in graph.nodes if n.op == "call_function" and n.target is aten.copy_.default]:
        if len(copy.args) < 2 or copy.users:
            continue
        dst, src = copy.args[0], copy.args[1]
        if not isinstance(dst, torch.fx.Node) or dst.op != "placeholder" or not isinstance(src, torch.fx.Node):
            continue
        if src.op != "call_function" or src.target not in IN_PLACE or not src.args or src.args[0] is not dst:
            continue
        if set(dst.users) != {src, copy} or any(u.op == "output" for u in src.users):
            continue
        if _reads((src.args[1:], src.kwargs), dst):
            continue
        if not _same_layout(dst.meta.get("val"), src.meta.get("val")):
            continue
        with graph.inserting_before(src):
            written = graph.call_function(IN_PLACE[src.target], src.args, src.kwargs)
        written.meta = dict(src.meta)
        src.replace_all_uses_with(written)
        graph.erase_node(copy)
        graph.erase_node(src)
        done.append(f"{written.name} ({dst.name})")
    if done:
        graph.lint()
        gm.recompile()
    return done
