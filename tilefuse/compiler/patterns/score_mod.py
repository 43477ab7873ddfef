"""A generated ``score_mod`` from the part of an attention's score chain that the kernel's parameters do not
cover (decision record 032).

The attention pass (patterns/attention.py) maps what it can of the chain between ``q @ kᵀ`` and the softmax
onto the family's parameters: constant factors before anything else into ``scale``, ``-inf`` / ``finfo.min``
fills at the end into the boolean mask or the band (which let the kernel skip tiles). What lies between, from
``s_in`` to ``s_out`` (``s * w[h]``, ``s + sin(s)``, ``table[bucket(j - i), h]``, ``where(s > t, s, s / 2)``,
an expression in ``arange`` indices), arrives here as Dynamo nodes and leaves as one generated mod:

1. **The chain as a function.** The nodes between are copied into a new graph ``chain(s, operands)``: ``s``
   stands for ``s_in``; nodes computed from sizes only (``arange``, their arithmetic) are copied with it, so
   they become index arithmetic; every other tensor the chain reads (a parameter, a buffer, a tensor the model
   computed) is a *captured* operand, read from ``operands``, one float32 vector that the graph packs (``cat``
   of the flattened captures) and passes to the kernel: its gradient flows back to the captures through the
   graph's own ops.
2. **ATen, lowered.** ``make_fx`` traces ``chain`` with the compiler's decomposition table at the graph's static
   shapes, and the compiler's lowering turns it into loop IR; producers are inlined into one expression over
   (b, h, q_idx, k_idx). The expression must read the score only at its own position (elementwise in the
   score: no reduction over it) and read nothing but the score and the operands.
3. **The derivatives, by torch.** ``d chain / d s`` is traced the same way: ``torch.autograd.grad`` of the
   chain with a cotangent of ones (the chain is elementwise in ``s``, so this is the elementwise derivative),
   lowered, and written as ``score_mod_grad``. The operands' vector-Jacobian product is traced too (ATen
   ops, run by the backward op in torch, where the flash kernels never form the score gradient).
4. **Written, registered** by the backend's chain compiler (``codegen/score_mod.py``, a later stage, passed in:
   this pass imports no stage after it): :class:`ScoreModWriter` writes both functions;
   :func:`tilefuse.kernels.attention.ops_score_mod.register` keeps the module under the digest of its source,
   the key that the graph's ``tilefuse::attention_mod_fwd`` call names.

What cannot be generated raises :class:`Refused` with the reason, which the pass shows in ``explain``.
"""
from __future__ import annotations

import dataclasses

import torch
import torch.fx

from ..decompositions import decomposition_table

__all__ = ["Refused", "Generated", "generate"]

# Tensors a chain reads are copied into the operand vector every call; beyond this many elements (a
# (B, H, Sq, Sk) bias at long sequences) the copy costs more than the attention saves, and int32 offsets end.
MAX_OPERAND_ELEMENTS = 1 << 26
# How many nodes a chain may hold (the pass's chains are a few ops; this bounds the walk).
MAX_CHAIN_NODES = 200
OPERAND_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.bool)


class Refused(Exception):
    """The chain cannot be a generated score_mod (the message is the reason)."""


@dataclasses.dataclass(frozen=True)
class Generated:
    """A registered mod: its ``key``, the Dynamo nodes whose values it reads (packed in this order), and the
    text of its two functions (for explain and tests)."""
    key: str
    captures: tuple
    source: str
    summary: str


def _val(x):
    return x.meta.get("example_value") if isinstance(x, torch.fx.Node) else x


def _from_sizes(node, memo: dict) -> bool:
    """Computed from literals and sizes only (no graph input above): the same value at every call."""
    if node in memo:
        return memo[node]
    memo[node] = False
    ok = node.op in ("call_function", "call_method") and all(_from_sizes(a, memo) for a in node.all_input_nodes)
    memo[node] = ok
    return ok


def _worth_generating(node, sizes_memo: dict) -> bool:
    """A tensor the chain reads that is cheaper to compute in the mod than to copy: an op (a lookup
    ``table[bucket]``, a ``view``/``permute`` of a parameter, a broadcast product) whose tensor inputs that are
    not computed from sizes hold no more elements than its result."""
    if node.op not in ("call_function", "call_method") or (node.op == "call_method" and node.target.endswith("_")):
        return False
    v = _val(node)
    if not isinstance(v, torch.Tensor):
        return False
    read = 0
    for a in node.all_input_nodes:
        av = _val(a)
        if isinstance(av, torch.Tensor) and not _from_sizes(a, sizes_memo):
            read += av.numel()
    return read <= v.numel()


def _collect(s_in, s_out, expand: bool):
    """(the chain's nodes in graph order, captured nodes): the nodes between ``s_in`` and ``s_out`` that depend
    on ``s_in``, the size-only nodes they read, with ``expand`` the nodes worth generating
    (:func:`_worth_generating`), and the other nodes they read (the captures)."""
    chain, captured, sizes_memo, seen = set(), [], {}, set()
    stack = [s_out]
    while stack:
        n = stack.pop()
        if n in seen or n is s_in:
            continue
        seen.add(n)
        if len(seen) > MAX_CHAIN_NODES:
            raise Refused(f"more than {MAX_CHAIN_NODES} ops in the score chain")
        if n is s_out or reaches(n, s_in) or _from_sizes(n, sizes_memo) or \
                (expand and _worth_generating(n, sizes_memo)):
            if n.op not in ("call_function", "call_method"):
                raise Refused(f"{n.name}: a {n.op} node inside the score chain")
            chain.add(n)
            stack.extend(n.all_input_nodes)
        else:
            captured.append(n)
    for n in [s_in, *chain]:  # the scores (and values computed from them) stay inside the chain
        if n is s_out or not (n is s_in or reaches(n, s_in)):
            continue
        for u in n.users:
            if u not in chain and not (u.op == "call_method" and u.target == "type_as" and u.args[1] is n
                                       and u.args[0] is not n):
                raise Refused(f"{n.name}: the scores are also used outside the attention (by {u.name})")
    order = {n: k for k, n in enumerate(s_out.graph.nodes)}
    return sorted(chain, key=order.__getitem__), sorted(set(captured), key=order.__getitem__)


def reaches(node, target, limit: int = 64) -> bool:
    """Whether ``target`` is among ``node``'s inputs, at most ``limit`` steps up."""
    seen, stack = set(), [(node, 0)]
    while stack:
        n, d = stack.pop()
        if n is target:
            return True
        if d >= limit or n in seen:
            continue
        seen.add(n)
        stack.extend((a, d + 1) for a in n.all_input_nodes)
    return False


def _chain_module(chain_nodes, captured, s_in, s_out):
    """``chain(s, operands)`` as an fx GraphModule of the Dynamo graph's own (torch-level) ops."""
    g = torch.fx.Graph()
    s = g.placeholder("s")
    env = {s_in: s}
    if captured:
        ops = g.placeholder("operands")
        offset = 0
        for c in captured:
            v = _val(c)
            n = v.numel()
            piece = g.call_method("view", (g.call_function(_slice, (ops, offset, offset + n)), tuple(v.shape)))
            if v.dtype == torch.bool:
                piece = g.call_function(torch.ne, (piece, 0))
            env[c] = piece
            offset += n
    for node in chain_nodes:
        env[node] = g.node_copy(node, lambda a: env[a])
    g.output(env[s_out])
    return torch.fx.GraphModule(torch.nn.Module(), g)


def _slice(t, start: int, stop: int):
    return t[start:stop]


def _check_captures(captured, score_shape):
    total = 0
    for c in captured:
        v = _val(c)
        if not isinstance(v, torch.Tensor):
            raise Refused(f"{c.name}: the score chain reads a {type(v).__name__} that is not a tensor")
        if v.dtype not in OPERAND_DTYPES:
            raise Refused(f"{c.name}: the score chain reads a {str(v.dtype).replace('torch.', '')} tensor (float16, "
                          f"bfloat16, float32 and bool operands are packed into the kernel's float32 operands)")
        if any(not isinstance(d, int) for d in v.shape):
            raise Refused(f"{c.name}: an operand of symbolic shape {tuple(v.shape)}")
        total += v.numel()
    if total > MAX_OPERAND_ELEMENTS:
        raise Refused(f"the score chain reads {total} tensor elements (at most {MAX_OPERAND_ELEMENTS} are copied "
                      f"into the kernel's operands)")
    return total


def _trace(fn, score_shape, n_operands, dev, cotangent: bool = False):
    """``fn(s, [operands][, ds])`` traced to ATen with fake inputs of the graph's shapes: an fx GraphModule whose
    nodes carry ``meta["val"]``."""
    from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily
    from torch.fx.experimental.proxy_tensor import make_fx

    with unset_fake_temporarily():
        mode = FakeTensorMode()
        with mode:
            args = [torch.empty(score_shape, dtype=torch.float32, device=dev)]
            if n_operands:
                args.append(torch.empty(n_operands, dtype=torch.float32, device=dev))
            if cotangent:
                args.append(torch.empty(score_shape, dtype=torch.float32, device=dev))
        return make_fx(fn, decomposition_table=decomposition_table(), tracing_mode="fake")(*args)


def generate(s_in, s_out, score_shape, compile_chain) -> Generated:
    """Generate and register the mod computing ``s_out`` from ``s_in`` (Dynamo nodes; see the module doc).
    First with the tensors the chain reads computed in the mod where that is cheaper (a table lookup), then,
    if that part cannot be generated, with those tensors captured as the graph computes them.
    ``compile_chain`` lowers and writes the traced chain (:func:`tilefuse.compiler.codegen.score_mod.compile_chain`,
    passed in by the backend: a later stage of the pipeline than this pass)."""
    if compile_chain is None:
        raise Refused("no score_mod compiler was given to the attention pass (the backend passes one)")
    try:
        return _generate(s_in, s_out, score_shape, compile_chain, expand=True)
    except Refused:
        return _generate(s_in, s_out, score_shape, compile_chain, expand=False)


def _generate(s_in, s_out, score_shape, compile_chain, expand: bool) -> Generated:
    if not all(isinstance(d, int) for d in score_shape):
        raise Refused(f"symbolic sizes {tuple(score_shape)} (the chain is generated at static shapes)")
    score_shape = tuple(score_shape)
    chain_nodes, captured = _collect(s_in, s_out, expand)
    n_operands = _check_captures(captured, score_shape)
    chain = _chain_module(chain_nodes, captured, s_in, s_out)
    vq = _val(s_in)
    dev = vq.device
    try:
        fwd = _trace(chain, score_shape, n_operands, dev)
    except Exception as exc:  # an op fake tensors or make_fx cannot run: the attention stays as written
        raise Refused(f"tracing the score chain failed: {type(exc).__name__}: {exc}") from None
    out_val = [n for n in fwd.graph.nodes if n.op == "output"][0].args[0]
    out_val = out_val.meta.get("val") if isinstance(out_val, torch.fx.Node) else None
    if not isinstance(out_val, torch.Tensor) or tuple(out_val.shape) != score_shape \
            or not out_val.dtype.is_floating_point:
        raise Refused(f"the score chain gives {getattr(out_val, 'shape', None)} "
                      f"{getattr(out_val, 'dtype', '')}, not float scores of shape {score_shape}")

    def derivative(s, *operands):
        with torch.enable_grad():
            x = s.detach().requires_grad_()
            y = chain(x, *operands)
            (g,) = torch.autograd.grad(y, x, torch.ones_like(y), allow_unused=True)
        return torch.zeros_like(s) if g is None else g

    try:
        bwd = _trace(derivative, score_shape, n_operands, dev)
    except Exception as exc:
        raise Refused(f"tracing the score chain's derivative failed: {type(exc).__name__}: {exc}") from None
    operands_vjp = None
    if captured:
        def vjp(s, operands, ds):
            with torch.enable_grad():
                data = operands.detach().requires_grad_()
                y = chain(s, data)
                g = torch.autograd.grad(y, data, ds, allow_unused=True)[0] if y.requires_grad else None
            return torch.zeros_like(operands) if g is None else g

        try:
            operands_vjp = _trace(vjp, score_shape, n_operands, dev, cotangent=True)
        except Exception as exc:
            raise Refused(f"tracing the gradient of the score chain's operands failed: {type(exc).__name__}: "
                          f"{exc}") from None
    ops = [f"{n.name}: {_describe(n)}" for n in chain_nodes]
    header = ["tilefuse generated attention score_mod (tilefuse.kernels.attention contract)",
              f"scores {list(score_shape)}; the chain's ops:"] + [f"  {o}" for o in ops] + \
             [f"operands: {', '.join(c.name for c in captured) or 'none'}"]
    key, source = compile_chain(fwd, bwd, operands_vjp, score_shape, bool(captured), header)
    summary = ", ".join(_describe(n) for n in chain_nodes if not _is_index(n))
    return Generated(key, tuple(captured), source, summary)


def _describe(node) -> str:
    t = node.target
    return t if isinstance(t, str) else getattr(t, "__name__", str(t))


def _is_index(node) -> bool:
    v = _val(node)
    return not (isinstance(v, torch.Tensor) and v.dtype.is_floating_point and v.dim() == 4)


def pack_operands(graph: torch.fx.Graph, captured) -> torch.fx.Node | None:
    """Graph nodes (inserted at the current point) computing the operand vector: the captures flattened,
    converted to float32 and concatenated, so their gradients flow back through the graph's own ops."""
    if not captured:
        return None
    pieces = []
    for c in captured:
        flat = graph.call_function(torch.reshape, (c, (-1,)))
        pieces.append(graph.call_method("to", (flat, torch.float32)))
    return pieces[0] if len(pieces) == 1 else graph.call_function(torch.cat, (pieces,))

