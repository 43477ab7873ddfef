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

Then :func:`pair_row_writes`: two such ``index_put_`` writes with the same indices (a KV cache's key and value rows
at one position, one pair a layer) become one ``tilefuse::index_put_pair_`` call, one launch where there were
two, at the second write's place. Only where that cannot reorder anything: each destination is a graph input
that the write alone reads, the two destinations differ, every reader of the first write comes after the second
(so nothing between them sees the first cache, and the second's values do not depend on it), and both writes
have the library kernel's form with one launch plan (``kernels.indexing.pairable``).
"""
from __future__ import annotations

import operator

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
    return _rewritten(gm, done)


def _rewritten(gm: torch.fx.GraphModule, done: list[str]) -> list[str]:
    """A pass's end: the graph checked and its code made again when the pass changed it; ``done`` returned."""
    if done:
        gm.graph.lint()
        gm.recompile()
    return done


def _row_write(node: torch.fx.Node) -> bool:
    """An ``index_put_`` (no accumulation) into a graph input that nothing else reads."""
    if node.op != "call_function" or node.target is not aten.index_put_.default or len(node.args) < 3:
        return False
    accumulate = node.args[3] if len(node.args) > 3 else node.kwargs.get("accumulate", False)
    dst = node.args[0]
    return (accumulate is False and isinstance(dst, torch.fx.Node) and dst.op == "placeholder"
            and set(dst.users) == {node} and isinstance(node.args[1], (list, tuple)))


def _pairable(a: torch.fx.Node, b: torch.fx.Node, order: dict) -> bool:
    from ..kernels import indexing

    if a.args[0] is b.args[0] or list(a.args[1]) != list(b.args[1]):
        return False
    if any(order[u] <= order[b] for u in a.users):
        return False

    def val(x):
        return x.meta.get("val") if isinstance(x, torch.fx.Node) else x

    index = [val(i) for i in a.args[1]]
    tensors = [val(a.args[0]), val(b.args[0]), val(a.args[2]), val(b.args[2])]
    return all(isinstance(t, torch.Tensor) for t in tensors) and \
        indexing.pairable(tensors[0], tensors[1], index, tensors[2], tensors[3])


def pair_row_writes(gm: torch.fx.GraphModule) -> list[str]:
    """Rewrite ``gm`` in place (see the module docs): pairs of row writes with one index become one
    ``tilefuse::index_put_pair_`` call; returns a description of each pair made."""
    from ..kernels import indexing  # noqa: F401  (registers tilefuse::index_put_pair_)

    graph = gm.graph
    order = {n: k for k, n in enumerate(graph.nodes)}
    waiting: list[torch.fx.Node] = []
    done = []
    for b in [n for n in graph.nodes if _row_write(n)]:
        a = next((w for w in waiting if _pairable(w, b, order)), None)
        if a is None:
            waiting.append(b)
            continue
        waiting.remove(a)
        with graph.inserting_before(b):
            pair = graph.call_function(torch.ops.tilefuse.index_put_pair_.default,
                                       (a.args[0], b.args[0], a.args[1], a.args[2], b.args[2]))
            first = graph.call_function(operator.getitem, (pair, 0))
            second = graph.call_function(operator.getitem, (pair, 1))
        pair.meta = {**b.meta, "val": (a.meta.get("val"), b.meta.get("val"))}
        first.meta, second.meta = dict(a.meta), dict(b.meta)
        a.replace_all_uses_with(first)
        b.replace_all_uses_with(second)
        graph.erase_node(a)
        graph.erase_node(b)
        done.append(f"{pair.name} ({pair.args[0].name}, {pair.args[1].name})")
    return _rewritten(gm, done)
