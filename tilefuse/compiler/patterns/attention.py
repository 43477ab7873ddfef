"""The attention pass: finds attention in the Dynamo graph and replaces it with the flash-attention family.

Runs on the graph Dynamo captured, before AOTAutograd (decision record 027): there attention is still the user's
ops (``F.scaled_dot_product_attention``, ``q @ k.transpose(-2, -1)``, ``softmax(-1)``, ``@ v``), and a match
becomes one call of the custom op ``tilefuse::attention_fwd`` (tilefuse/kernels/attention/ops.py) whose
registered autograd formula calls ``tilefuse::attention_bwd``: the forward *and* the backward graphs that
AOTAutograd derives then hold the family's kernels, which the lowering calls as library kernels
(``lowering/attention.py``), neither a bmm/softmax/bmm chain nor an ATen fallback.

Two forms are found:

- ``F.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)`` (what
  transformers' "sdpa" attention calls): the arguments map one to one.
- The plain-PyTorch form: ``q @ kᵀ`` -> a chain of pointwise ops on the scores -> ``softmax(-1)`` (or written
  by hand: ``exp(s - max) / sum``) -> optional casts and dropout -> ``@ v``, with GQA's ``expand``/``reshape``
  (transformers' ``repeat_kv``) or ``repeat_interleave`` of k and v unwrapped (the kernel reads the KV head
  ``h // group`` itself). The chain is folded into the family's parameters (:class:`_Scores`): multiplications
  and divisions by constants into ``scale``; ``c * tanh(s / c)`` into ``softcap``; tensors added to the scores
  (an additive mask, ALiBi, T5's relative position bias) into one additive ``mask`` that the graph's own ops
  compute (and that gets its gradient when it requires one);
  ``masked_fill`` / ``where`` with -inf into a boolean mask (True = attend); a fill with a finite value at or
  below :data:`ABSORBING_FILL` (``finfo.min``) into the boolean mask too, with the rows it hides entirely
  taken from ``v.mean(-2)`` as eager's uniform softmax gives them. Masks computed from sizes only that are a
  band of diagonals become the kernel's ``window`` (:func:`_bands`), and a per-head slope times ``|i - j|``
  its ``alibi`` (:func:`_alibi`): no (B, H, Sq, Sk) tensor for those.

A chain the parameters do not cover (``s * w[h]``, ``s + sin(s)``, a bucketed relative bias, a finite fill)
keeps the parameters that apply at its ends (a leading constant scale, trailing -inf / finfo.min fills) and
becomes a generated ``score_mod`` in between (:func:`_match_generated`, score_mod.py, decision
record 032). ``nn.MultiheadAttention``'s single call is traced open first (mha.py), so that the SDPA
inside it is found like any other.

What cannot be matched stays as it is, with the reason recorded (:data:`OUTCOMES`, shown by ``explain``).
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import math
import operator

import torch
import torch.fx
import torch.nn.functional as F

from ... import config, device
from ...kernels.attention import ops as attention_ops  # noqa: F401  (registers the tilefuse:: custom ops)
from ...kernels.attention import ops_score_mod  # noqa: F401  (registers tilefuse::attention_mod_*)
from ...kernels.attention import supports
from . import mha as patterns_mha, score_mod as patterns_score_mod

__all__ = ["rewrite", "Outcome", "OUTCOMES"]

# A finite fill at or below this is a mask: eager's softmax gives a filled score exp(fill - row max), which
# underflows to exactly 0 in float32 once the row max is 104 above the fill (any score above -1e9 + 104), and
# gives a row filled everywhere a uniform average. So the fill hides keys (a boolean mask to the kernel), and
# rows hidden entirely take v's mean. Above it (-1e4, which scores of a few thousand reach) the fill is a value.
ABSORBING_FILL = -1e9
# The floor of every float32/bfloat16 additive mask: the kernel works in log2 units (scores times
# log2(e) = 1.4427), where finfo(float32).min overflows to -inf and a row masked everywhere by finfo.min would
# be 0 instead of eager's uniform average; -2^127 times 1.4427 is -2.5e38, finite, and absorbs any score
# below 2^103 as finfo.min does.
ABSORBING_STANDIN = -2.0 ** 127
# How far back from the softmax the scores' matmul is looked for (ops of the score chain).
MAX_CHAIN = 24
# The score_mod compiler of the rewrite in progress (rewrite's argument).
_SCORE_MOD_COMPILER: contextvars.ContextVar = contextvars.ContextVar("score_mod_compiler", default=None)


@dataclasses.dataclass(frozen=True)
class Outcome:
    """One attention candidate: ``node`` (the softmax or SDPA node), ``form``, and None or the reason it stays."""
    node: str
    form: str  # "sdpa" | "decomposed" | "multi_head_attention" (a call left unopened)
    reason: str | None
    detail: str = ""  # the kernel's parameters of a match

    def __str__(self) -> str:
        what = f"attention at {self.node} ({self.form})"
        if self.reason is None:
            return f"{what}: flash kernel" + (f" ({self.detail})" if self.detail else "")
        return f"{what}: not matched: {self.reason}"


OUTCOMES: list = []  # every candidate of this process (bounded), newest last
_sinks: list = []  # explain() collects the outcomes of the graphs it compiles
_MAX_OUTCOMES = 512


def _note(outcome: Outcome) -> None:
    OUTCOMES.append(outcome)
    del OUTCOMES[:-_MAX_OUTCOMES]
    for sink in _sinks:
        sink.append(outcome)
    config.log(1, str(outcome))


class NoMatch(Exception):
    """The candidate stays as written (the message is the reason)."""


# ------------------------------------------------------------------------------------ op spellings
_FUNCTIONS = {
    operator.matmul: "matmul", torch.matmul: "matmul", torch.bmm: "matmul",
    operator.mul: "mul", torch.mul: "mul", operator.truediv: "div", torch.div: "div", torch.true_divide: "div",
    operator.add: "add", torch.add: "add", operator.sub: "sub", torch.sub: "sub",
    torch.tanh: "tanh", F.softmax: "softmax", torch.softmax: "softmax", torch.exp: "exp", torch.amax: "amax",
    torch.sum: "sum", torch.max: "max",
    torch.masked_fill: "masked_fill", torch.where: "where", F.dropout: "dropout", torch.dropout: "dropout",
    torch.transpose: "transpose", torch.swapaxes: "transpose", torch.permute: "permute",
    torch.repeat_interleave: "repeat_interleave", torch.reshape: "reshape", torch.unsqueeze: "unsqueeze",
    operator.getitem: "getitem", operator.invert: "not", torch.logical_not: "not", torch.bitwise_not: "not",
    F.scaled_dot_product_attention: "sdpa",
    # nn.MultiheadAttention's, once patterns_mha has traced it open (same arguments as F.sdpa)
    torch.ops.aten.scaled_dot_product_attention.default: "sdpa",
}
_METHODS = {
    "matmul": "matmul", "bmm": "matmul", "mul": "mul", "div": "div", "add": "add", "sub": "sub", "tanh": "tanh",
    "softmax": "softmax", "masked_fill": "masked_fill", "transpose": "transpose", "permute": "permute",
    "repeat_interleave": "repeat_interleave", "reshape": "reshape", "view": "reshape", "expand": "expand",
    "contiguous": "identity", "to": "cast", "float": "cast", "type": "cast", "type_as": "cast", "half": "cast",
    "bfloat16": "cast", "unsqueeze": "unsqueeze", "logical_not": "not", "bitwise_not": "not", "exp": "exp",
    "amax": "amax", "sum": "sum", "max": "max",
}


def _op(node) -> str | None:
    if not isinstance(node, torch.fx.Node):
        return None
    table = {"call_function": _FUNCTIONS, "call_method": _METHODS}.get(node.op)
    name = table.get(node.target) if table is not None else None
    if name == "div" and node.kwargs.get("rounding_mode") is not None:
        return None
    if name in ("add", "sub") and node.kwargs.get("alpha", 1) != 1:
        return None
    return name


def _val(x):
    return x.meta.get("example_value") if isinstance(x, torch.fx.Node) else x


def _shape(x) -> tuple | None:
    v = _val(x)
    return tuple(v.shape) if isinstance(v, torch.Tensor) else None


def _arg(node, k: int, name: str, default=None):
    if name in node.kwargs:
        return node.kwargs[name]
    return node.args[k] if len(node.args) > k else default


def _known(x) -> int | None:
    """A size as an int, or None while it is symbolic (never adds a guard)."""
    if isinstance(x, int):
        return x
    try:
        from torch.fx.experimental.symbolic_shapes import is_concrete_int

        return int(x) if is_concrete_int(x) else None
    except Exception:
        return None


def _same(a, b) -> bool:
    if a is b:
        return True
    ka, kb = _known(a), _known(b)
    if ka is not None and kb is not None:
        return ka == kb
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    try:
        return bool(statically_known_true(a == b))
    except Exception:
        return False


def _same_shape(a, b) -> bool:
    return a is not None and b is not None and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))


def _constant(x, depth: int = 0):
    """The value of a number, or of a one-element tensor computed from literals only (``torch.full([], c)``,
    as GPT-2's eager attention divides by), else None."""
    if isinstance(x, bool):
        return None
    if isinstance(x, (int, float)):
        return float(x)
    if not isinstance(x, torch.fx.Node) or depth > 4 or x.op != "call_function":
        return None
    v = _val(x)
    if not isinstance(v, torch.Tensor) or v.numel() != 1:
        return None
    literal = True

    def lit(a):
        nonlocal literal
        if isinstance(a, torch.fx.Node):
            c = _constant(a, depth + 1)
            if c is None:
                literal = False
            return c
        return a

    args = torch.fx.node.map_aggregate(x.args, lit)
    kwargs = torch.fx.node.map_aggregate(dict(x.kwargs), lit)
    if not literal:
        return None
    try:
        with torch._subclasses.fake_tensor.unset_fake_temporarily():
            out = x.target(*args, **kwargs)
        return float(out) if isinstance(out, (torch.Tensor, int, float)) else None
    except Exception:
        return None


# ------------------------------------------------------------------------------------ operands
def _kv_source(node):
    """``node`` with GQA's head repetition removed: (source, group) where the source has H / group heads.
    Recognises transformers' ``x[:, :, None].expand(B, Hkv, n, S, D).reshape(B, Hkv * n, S, D)`` and
    ``x.repeat_interleave(n, dim=1)`` (both put query head h on KV head h // n, the kernel's rule)."""
    op = _op(node)
    if op == "repeat_interleave":
        reps, dim = _arg(node, 1, "repeats"), _arg(node, 2, "dim")
        src = node.args[0]
        shape = _shape(src)
        if isinstance(reps, int) and shape is not None and len(shape) == 4 and dim in (1, -3):
            return src, reps
    if op == "reshape":
        inner = node.args[0]
        if _op(inner) == "expand" and len(inner.users) == 1:
            unsq = inner.args[0]
            src = None
            if _op(unsq) == "unsqueeze" and _arg(unsq, 1, "dim") in (2, -3):
                src = unsq.args[0]
            elif _op(unsq) == "getitem" and isinstance(unsq.args[1], tuple) and len(unsq.args[1]) >= 3 \
                    and unsq.args[1][2] is None and all(s == slice(None) for s in unsq.args[1][:2]) \
                    and all(s == slice(None) for s in unsq.args[1][3:]):
                src = unsq.args[0]
            es, ss, out = _shape(inner), _shape(src) if src is not None else None, _shape(node)
            if src is not None and es is not None and ss is not None and out is not None and len(ss) == 4 \
                    and len(es) == 5 and len(out) == 4 and _same(es[1], ss[1]) and _same(out[2], ss[2]) \
                    and _same(out[3], ss[3]) and _known(es[2]) is not None:
                return src, _known(es[2])
    return node, 1


def _transposed_last(node):
    """The tensor whose last two dims ``node`` swaps (rank 4), else None."""
    op = _op(node)
    shape = _shape(node)
    if shape is None or len(shape) != 4:
        return None
    if op == "transpose":
        a, b = _arg(node, 1, "dim0"), _arg(node, 2, "dim1")
        if isinstance(a, int) and isinstance(b, int) and {a % 4, b % 4} == {2, 3}:
            return node.args[0]
    if op == "permute":
        dims = node.args[1:] if node.op == "call_method" else node.args[1:2]
        dims = tuple(dims[0]) if len(dims) == 1 and isinstance(dims[0], (tuple, list)) else tuple(dims)
        if tuple(d % 4 for d in dims) == (0, 1, 3, 2):
            return node.args[0]
    return None


def _check_qkv(q, k, v, where: str):
    vq, vk, vv = _val(q), _val(k), _val(v)
    if not all(isinstance(t, torch.Tensor) for t in (vq, vk, vv)):
        raise NoMatch(f"{where}: q, k or v is not a tensor")
    if not (vq.dim() == vk.dim() == vv.dim() == 4):
        raise NoMatch(f"{where}: q, k, v of ranks {vq.dim()}, {vk.dim()}, {vv.dim()} (the kernel takes "
                      f"(batch, heads, seq, head_dim))")
    if not (vq.dtype == vk.dtype == vv.dtype):
        raise NoMatch(f"{where}: q, k, v dtypes differ ({vq.dtype}, {vk.dtype}, {vv.dtype})")
    want = device.torch_device().type
    if vq.device.type != want:
        raise NoMatch(f"{where}: tensors on {vq.device.type}, tilefuse's kernels run on {want} here")
    if not _same(vv.shape[3], vq.shape[3]):
        raise NoMatch(f"{where}: v's head dim {vv.shape[3]} differs from q's {vq.shape[3]}")
    if not (_same(vk.shape[1], vv.shape[1]) and _same(vk.shape[2], vv.shape[2])):
        raise NoMatch(f"{where}: k and v shapes differ ({tuple(vk.shape)}, {tuple(vv.shape)})")
    if not (_same(vk.shape[0], vq.shape[0]) and _same(vv.shape[0], vq.shape[0])):
        raise NoMatch(f"{where}: batch sizes differ (q {tuple(vq.shape)}, k {tuple(vk.shape)})")
    concrete = [_known(s) for s in (*vq.shape, *vk.shape)]
    q_shape, k_shape = vq.shape, vk.shape
    if all(c is not None for c in concrete):
        q_shape, k_shape = tuple(concrete[:4]), tuple(concrete[4:])
    elif _known(vq.shape[3]) is None or _known(vq.shape[1]) is None or _known(vk.shape[1]) is None:
        raise NoMatch(f"{where}: symbolic heads or head dim")
    else:
        q_shape = (1, _known(vq.shape[1]), 1, _known(vq.shape[3]))
        k_shape = (1, _known(vk.shape[1]), 1, _known(vq.shape[3]))
    ok, why = supports(q_shape, k_shape, vq.dtype)
    if not ok:
        raise NoMatch(f"{where}: {why}")
    return vq


def _check_mask(mask, vq, vk):
    vm = _val(mask)
    if not isinstance(vm, torch.Tensor):
        raise NoMatch(f"the mask {mask} is not a tensor")
    if vm.dtype != torch.bool and not vm.dtype.is_floating_point:
        raise NoMatch(f"mask dtype {vm.dtype} (bool or floating accepted)")
    target = (vq.shape[0], vq.shape[1], vq.shape[2], vk.shape[2])
    if vm.dim() > 4 or any(not (_same(m, 1) or _same(m, t)) for m, t in zip(vm.shape[::-1], target[::-1])):
        raise NoMatch(f"mask of shape {tuple(vm.shape)} does not broadcast to {tuple(target)}")
    if vm.device.type != vq.device.type:
        raise NoMatch(f"mask on {vm.device}, q on {vq.device}")


# ------------------------------------------------------------------------------------ the score chain
@dataclasses.dataclass
class _Scores:
    """What the chain from ``q @ kᵀ`` to the softmax does to the scores, in the kernel's order:
    ``scale``, then ``softcap``, then the sum of ``additive`` terms, then the ``hidden`` boolean masks
    (True = hidden)."""
    scale: float = 1.0
    softcap: float | None = None
    pending_tanh: bool = False  # tanh seen, waiting for the multiplication by the cap
    additive: list = dataclasses.field(default_factory=list)  # (node, sign)
    hidden: list = dataclasses.field(default_factory=list)  # (bool node, True when it marks hidden scores)
    absorbing: list = dataclasses.field(default_factory=list)  # the same, for fills that absorb the score

    def multiply(self, c: float, what: str) -> None:
        if self.pending_tanh:
            if c <= 0:
                raise NoMatch(f"{what}: tanh times {c} (a softcap multiplies by its positive cap)")
            self.softcap, self.pending_tanh = c, False
            self.scale *= c
            return
        if self.additive or self.absorbing:
            raise NoMatch(f"{what}: a scale after a bias or mask was added (the kernel scales first)")
        if self.softcap is not None:
            raise NoMatch(f"{what}: a scale after the softcap")
        if self.hidden and c <= 0:
            raise NoMatch(f"{what}: a non-positive scale after a -inf mask")
        self.scale *= c

    def tanh(self, what: str) -> None:
        if self.pending_tanh or self.softcap is not None:
            raise NoMatch(f"{what}: tanh of a tanh")
        if self.additive or self.hidden or self.absorbing:
            raise NoMatch(f"{what}: tanh after a bias or mask (a softcap must come before them; tanh(-inf) is -1)")
        self.pending_tanh = True

    def check_done(self, what: str) -> None:
        if self.pending_tanh:
            raise NoMatch(f"{what}: tanh not followed by a multiplication by the cap (not a softcap)")


def _fold(chain: list, scores: _Scores, vq, vk) -> None:
    """Fold the chain ops (from the scores' matmul to the softmax input) into ``scores``."""
    for node, operand in chain:
        op = _op(node)
        what = f"{node.name} ({op})"
        if op in ("identity",):
            continue
        if op == "cast":
            v = _val(node)
            if not (isinstance(v, torch.Tensor) and v.dtype.is_floating_point):
                raise NoMatch(f"{what}: a cast to a non-float type in the score chain")
            continue
        others = [a for a in list(node.args) + list(node.kwargs.values()) if a is not operand]
        if op in ("mul", "div"):
            other = others[0] if others else None
            c = _constant(other)
            if c is None:
                raise NoMatch(f"{what}: the scores are {'multiplied' if op == 'mul' else 'divided'} by a tensor "
                              f"that is not a constant")
            if op == "div":
                if node.args[0] is not operand:
                    raise NoMatch(f"{what}: a constant divided by the scores")
                if c == 0:
                    raise NoMatch(f"{what}: division by zero")
                c = 1.0 / c
            scores.multiply(c, what)
        elif op == "tanh":
            scores.tanh(what)
        elif op in ("add", "sub"):
            other = node.args[1] if node.args[0] is operand else node.args[0]
            sign = 1.0
            if op == "sub":
                if node.args[0] is not operand:
                    raise NoMatch(f"{what}: the scores are subtracted from a tensor")
                sign = -1.0
            if scores.pending_tanh:
                raise NoMatch(f"{what}: an addition between tanh and the cap")
            ov = _val(other)
            if not isinstance(ov, torch.Tensor) or ov.numel() == 1:
                c = _constant(other)
                if c is not None and not math.isfinite(c):
                    raise NoMatch(f"{what}: {c} added to every score")
                continue  # one number added to every score: the softmax does not change
            _check_mask(other, vq, vk)
            if _val(other).dtype == torch.bool:
                raise NoMatch(f"{what}: a boolean tensor added to the scores")
            scores.additive.append((other, sign))
        elif op in ("masked_fill", "where"):
            if scores.pending_tanh:
                raise NoMatch(f"{what}: a mask between tanh and the cap")
            if op == "masked_fill":
                if node.args[0] is not operand:
                    raise NoMatch(f"{what}: masked_fill of another tensor")
                cond, fill, hidden_when = _arg(node, 1, "mask"), _arg(node, 2, "value"), True
            else:
                cond = _arg(node, 0, "condition")
                if _arg(node, 1, "input") is operand:
                    fill, hidden_when = _arg(node, 2, "other"), False
                elif _arg(node, 2, "other") is operand:
                    fill, hidden_when = _arg(node, 1, "input"), True
                else:
                    raise NoMatch(f"{what}: where() with the scores as its condition")
            value = _constant(fill)
            if value is None:
                raise NoMatch(f"{what}: the masked value is not a constant (a tensor of scores)")
            _check_mask(cond, vq, vk)
            if _val(cond).dtype != torch.bool:
                raise NoMatch(f"{what}: the mask {cond} is not boolean")
            if value == -math.inf:
                scores.hidden.append((cond, hidden_when))
            elif value <= ABSORBING_FILL:
                scores.absorbing.append((cond, hidden_when))
            else:
                raise NoMatch(f"{what}: masked with the finite value {value:g}, which scores can come near (eager "
                              f"weighs it exp(fill - max): only -inf or fills at or below {ABSORBING_FILL:g} such as "
                              f"finfo.min are matched as masks)")
        else:
            raise NoMatch(f"{what}: {op or node.target} in the score chain has no kernel parameter")
    scores.check_done("the score chain")


def _score_path(start, qk) -> list:
    """(node, the operand that carries the scores) from ``qk``'s user to ``start``, or NoMatch."""
    path = []
    node = start
    for _ in range(MAX_CHAIN):
        if node is qk:
            return list(reversed(path))
        carriers = [a for a in node.all_input_nodes if a is qk or _reaches(a, qk)]
        if len(carriers) != 1:
            raise NoMatch(f"{node.name}: combines the scores with themselves (e.g. a softmax written by hand)")
        if sum(1 for u in carriers[0].users if not _dtype_only_use(u, carriers[0])) != 1:
            raise NoMatch(f"{carriers[0].name}: the scores are also used outside the attention")
        if not any(a is carriers[0] for a in node.args) and carriers[0] not in node.kwargs.values():
            raise NoMatch(f"{node.name}: the scores are nested in a container argument")
        path.append((node, carriers[0]))
        node = carriers[0]
    raise NoMatch(f"more than {MAX_CHAIN} ops between the scores' matmul and the softmax")


def _dtype_only_use(user, node) -> bool:
    """``user`` reads only ``node``'s dtype (``x.type_as(node)``, as T5's attention casts its weights)."""
    return _op(user) == "cast" and user.target == "type_as" and len(user.args) == 2 and user.args[1] is node \
        and user.args[0] is not node


def _reaches(node, target) -> bool:
    return patterns_score_mod.reaches(node, target, MAX_CHAIN)


def _find_qk(start, score_shape):
    """The rank-4 matmul ``q @ kᵀ`` of ``score_shape`` the softmax input descends from (breadth-first)."""
    frontier, seen = [start], set()
    for _ in range(MAX_CHAIN):
        nxt = []
        for n in frontier:
            if n in seen:
                continue
            seen.add(n)
            if _op(n) == "matmul" and _same_shape(_shape(n), score_shape):
                return n
            nxt.extend(a for a in n.all_input_nodes if _shape(a) is not None)
        frontier = nxt
    raise NoMatch("no matmul producing the scores")


# ------------------------------------------------------------------------------------ matchers
def _after_softmax(sm):
    """From the softmax to the ``@ v`` matmul: (matmul, dropout_p)."""
    node, dropout_p = sm, 0.0
    for _ in range(8):
        users = list(node.users)
        if len(users) != 1:
            raise NoMatch(f"{node.name}: the attention probabilities have {len(users)} users (returned or reused "
                          f"as attention weights), not one matmul with v")
        user = users[0]
        op = _op(user)
        if op == "matmul":
            if user.args[0] is not node:
                raise NoMatch(f"{user.name}: the probabilities are the right operand of the matmul")
            return user, dropout_p
        if op in ("identity", "cast"):
            v = _val(user)
            if not (isinstance(v, torch.Tensor) and v.dtype.is_floating_point):
                raise NoMatch(f"{user.name}: a cast of the probabilities to {getattr(v, 'dtype', '?')}")
        elif op == "dropout":
            if user.target is torch.dropout:
                p, training = _arg(user, 1, "p", 0.5), _arg(user, 2, "train", True)
            else:
                p, training = _arg(user, 1, "p", 0.5), _arg(user, 2, "training", True)
            if _arg(user, 3, "inplace", False):
                raise NoMatch(f"{user.name}: in-place dropout")
            if not isinstance(training, bool) or not isinstance(p, (int, float)):
                raise NoMatch(f"{user.name}: dropout with a non-constant p or training flag")
            if training and p > 0:
                if dropout_p:
                    raise NoMatch(f"{user.name}: two dropouts of the probabilities")
                dropout_p = float(p)
        else:
            raise NoMatch(f"{user.name}: {op or user.target} between the softmax and the matmul with v")
        node = user
    raise NoMatch("no matmul with v after the softmax")


def _last_dim_keepdim(node, rank: int) -> bool:
    dim = _arg(node, 1, "dim")
    if isinstance(dim, (tuple, list)) and len(dim) == 1:
        dim = dim[0]
    return isinstance(dim, int) and dim % max(rank, 1) == rank - 1 and _arg(node, 2, "keepdim", False) is True


def hand_softmax(node):
    """The input ``x`` of a softmax written by hand, ``e / e.sum(-1, keepdim=True)`` with ``e = exp(x - m)``
    (``m`` = ``x.amax(-1, keepdim=True)`` or ``x.max(-1, keepdim=True)[0]``) or ``e = exp(x)``; else None."""
    if _op(node) != "div" or len(node.args) != 2:
        return None
    e, total = node.args
    if _op(e) != "exp" or _op(total) != "sum" or total.args[0] is not e or len(e.users) != 2:
        return None
    shape = _shape(e)
    if shape is None or not _last_dim_keepdim(total, len(shape)) or len(total.users) != 1:
        return None
    x = e.args[0]
    if _op(x) == "sub" and len(x.users) == 1:
        base, m = x.args[0], x.args[1]
        if _op(m) == "getitem" and m.args[1] == 0 and _op(m.args[0]) == "max" and len(m.args[0].users) == 1:
            m = m.args[0]
        if _op(m) in ("amax", "max") and m.args[0] is base and _last_dim_keepdim(m, len(shape)) \
                and len(m.users) == 1:
            return base
    return x


def _match_decomposed(gm, sm) -> str:
    x = hand_softmax(sm)
    dim, softmax_uses = (len(_shape(sm)) - 1, 2) if x is not None else (_arg(sm, 1, "dim"), 1)
    if x is None:
        x = sm.args[0] if sm.args else sm.kwargs.get("input")
    elif _op(sm.args[0].args[0]) != "sub":
        softmax_uses = 1  # exp(x) / sum: no max subtracted
    if isinstance(x, torch.fx.Node) and sum(1 for u in x.users if not _dtype_only_use(u, x)) != softmax_uses:
        raise NoMatch(f"{x.name}: the scores are also used outside the attention")
    shape = _shape(x)
    if shape is None:
        raise NoMatch("softmax of a non-tensor")
    rank = len(shape)
    if not isinstance(dim, int) or dim % max(rank, 1) != rank - 1:
        raise NoMatch(f"softmax over dim {dim}, not the last (the keys)")
    if rank != 4:
        raise NoMatch(f"scores of rank {rank} (the kernel takes (batch, heads, q_seq, kv_seq))")
    pv, dropout_p = _after_softmax(sm)
    qk = _find_qk(x, shape)
    kt = qk.args[1]
    k_full = _transposed_last(kt)
    if k_full is None:
        raise NoMatch(f"{qk.name}: the right operand of the scores' matmul is not a transpose of k's last dims")
    q = qk.args[0]
    v_full = pv.args[1]
    k, gk = _kv_source(k_full)
    v, gv = _kv_source(v_full)
    if gk != gv:
        k, v = k_full, v_full
    vq = _check_qkv(q, k, v, "decomposed attention")
    vk = _val(k)
    if not all(_same(a, b) for a, b in zip(_shape(qk), (*vq.shape[:3], vk.shape[2]))):
        raise NoMatch(f"{qk.name}: the scores' matmul broadcasts q and k")
    if not _same_shape(_shape(pv), tuple(vq.shape)) or _val(pv).dtype != vq.dtype:
        raise NoMatch(f"{pv.name}: the output's shape or dtype differs from q's")
    scores = _Scores()
    try:
        _fold(_score_path(x, qk), scores, vq, vk)
    except NoMatch as exc:  # not the kernel's parameters alone: a generated score_mod for the rest
        return _match_generated(gm, x, qk, q, k, v, pv, v_full, vq, vk, dropout_p, str(exc))
    window = _bands(scores, _known(vq.shape[2]), _known(vk.shape[2]))
    alibi = _alibi(scores, vq, window, _known(vq.shape[2]), _known(vk.shape[2]))
    graph = gm.graph
    with graph.inserting_before(pv):
        mask = _build_mask(graph, scores, _mask_dtype(scores))
        slopes = None
        if alibi is not None:
            per_head, factor, heads = alibi
            slopes = graph.call_function(torch.reshape, (per_head, heads))
            if factor != 1.0:
                slopes = graph.call_function(operator.mul, (slopes, factor))
        call = graph.call_function(torch.ops.tilefuse.attention_fwd.default,
                                   (q, k, v, mask, slopes, float(scores.scale), float(scores.softcap or 0.0), 0,
                                    *window, dropout_p))
        out = graph.call_function(operator.getitem, (call, 0))
        if scores.absorbing:
            out = _uniform_empty_rows(graph, out, scores, v_full)
    out.meta["example_value"] = _val(pv)
    pv.replace_all_uses_with(out)
    _erase_dead(graph, pv)
    return describe(call, "additive" if scores.additive else "boolean")


def _match_generated(gm, x, qk, q, k, v, pv, v_full, vq, vk, dropout_p, why_not_parameters: str) -> str:
    """The score chain as parameters where they apply and a generated ``score_mod`` for the rest (decision
    record 032): constant factors straight after the matmul are the kernel's ``scale``; -inf / finfo.min fills
    at the end its boolean mask or band (so it still skips tiles); the ops between become generated code
    (:func:`patterns_score_mod.generate`), reading the tensors they need from one packed operand vector."""
    scores = _Scores()
    s_in = qk
    while s_in is not x:  # leading constant factors and float casts
        users = [u for u in s_in.users if not _dtype_only_use(u, s_in)]
        if len(users) != 1:
            break
        u, op = users[0], _op(users[0])
        if op in ("identity", "cast"):
            uv = _val(u)
            if not (isinstance(uv, torch.Tensor) and uv.dtype.is_floating_point):
                break
        elif op in ("mul", "div") and len(u.args) == 2 and not u.kwargs:
            if op == "div" and u.args[0] is not s_in:
                break
            c = _constant(u.args[1] if u.args[0] is s_in else u.args[0])
            if c is None or c == 0 or not math.isfinite(c):
                break
            scores.multiply(c if op == "mul" else 1.0 / c, u.name)
        else:
            break
        s_in = u
    s_out = x
    while s_out is not s_in:  # trailing fills: the boolean mask (True = attend) and the band
        fill_of = _trailing_fill(s_out, qk, vq, vk)
        if fill_of is None:
            break
        s_out, cond, hidden_when, value = fill_of
        (scores.hidden if value == -math.inf else scores.absorbing).append((cond, hidden_when))
    if s_out is s_in:
        raise NoMatch(why_not_parameters)
    try:
        gen = patterns_score_mod.generate(s_in, s_out, (*vq.shape[:3], vk.shape[2]), _SCORE_MOD_COMPILER.get())
    except patterns_score_mod.Refused as exc:
        raise NoMatch(f"{why_not_parameters}; nor as a generated score_mod: {exc}") from None
    window = _bands(scores, _known(vq.shape[2]), _known(vk.shape[2]))
    graph = gm.graph
    with graph.inserting_before(pv):
        mask = _build_mask(graph, scores, torch.float32)  # no additive term here: None or boolean
        operands = patterns_score_mod.pack_operands(graph, gen.captures)
        call = graph.call_function(torch.ops.tilefuse.attention_mod_fwd.default,
                                   (q, k, v, mask, operands, float(scores.scale), 0, *window, dropout_p, gen.key))
        out = graph.call_function(operator.getitem, (call, 0))
        if scores.absorbing:
            out = _uniform_empty_rows(graph, out, scores, v_full)
    out.meta["example_value"] = _val(pv)
    pv.replace_all_uses_with(out)
    _erase_dead(graph, pv)
    return describe(call, "boolean") + f", generated score_mod {gen.key} ({gen.summary})"


def _trailing_fill(node, qk, vq, vk):
    """``node`` = a fill of the scores with -inf or an absorbing value under a mask that does not depend on the
    scores: (the scores' node, mask, True when the mask marks hidden scores, fill), else None."""
    op = _op(node)
    if op == "masked_fill":
        src, cond, fill, hidden_when = node.args[0], _arg(node, 1, "mask"), _arg(node, 2, "value"), True
    elif op == "where":
        cond, a, b = _arg(node, 0, "condition"), _arg(node, 1, "input"), _arg(node, 2, "other")
        on_a = isinstance(a, torch.fx.Node) and _reaches(a, qk)
        on_b = isinstance(b, torch.fx.Node) and _reaches(b, qk)
        if on_a == on_b:
            return None
        src, fill, hidden_when = (a, b, False) if on_a else (b, a, True)
    else:
        return None
    if not isinstance(src, torch.fx.Node) or not isinstance(cond, torch.fx.Node) or _reaches(cond, qk) \
            or len(src.users) != 1:
        return None
    value = _constant(fill)
    if value is None or not (value == -math.inf or value <= ABSORBING_FILL):
        return None
    try:
        _check_mask(cond, vq, vk)
    except NoMatch:
        return None
    if _val(cond).dtype != torch.bool:
        return None
    return src, cond, hidden_when, value


# Masks evaluated at compile time to look for a band: at most this many (Sq, Sk) elements, and ops above them.
MAX_BAND_ELEMENTS = 1 << 24
MAX_CONSTANT_OPS = 40


def _evaluate(node, budget: list):
    """The value of a tensor computed from literals and sizes only (``arange``, comparisons, ``full``, ``triu``):
    no graph input above it, so it is the same at every call of this graph (static shapes). None otherwise."""
    if not isinstance(node, torch.fx.Node):
        return node
    if node.op not in ("call_function", "call_method") or budget[0] <= 0:
        return None
    budget[0] -= 1
    failed = []

    def value(a):
        if isinstance(a, torch.fx.Node):
            out = _evaluate(a, budget)
            if out is None:
                failed.append(a)
            return out
        return a

    args = torch.fx.node.map_aggregate(node.args, value)
    kwargs = torch.fx.node.map_aggregate(dict(node.kwargs), value)
    from torch.utils import _pytree as pytree

    if failed or any(isinstance(a, (torch.SymInt, torch.SymFloat, torch.SymBool))
                     for a in pytree.tree_leaves((args, kwargs))):
        return None
    try:
        with torch._subclasses.fake_tensor.unset_fake_temporarily():
            if node.op == "call_method":
                return getattr(args[0], node.target)(*args[1:], **kwargs)
            return node.target(*args, **kwargs)
    except Exception:
        return None


def _band_of(visible: torch.Tensor):
    """(lo, hi) when ``visible`` (Sq, Sk) is exactly ``lo <= j - i <= hi``, else None."""
    Sq, Sk = visible.shape
    offset = torch.arange(Sk, device=visible.device).view(1, Sk) - torch.arange(Sq, device=visible.device).view(Sq, 1)
    if not visible.any():
        return None
    lo, hi = int(offset[visible].min()), int(offset[visible].max())
    if lo > 0 or hi < 0 or not torch.equal(visible, (offset >= lo) & (offset <= hi)):
        return None
    return lo, hi


def _visible(value, Sq: int, Sk: int, kind: str):
    """The (Sq, Sk) visibility a constant mask gives (same for every batch and head), else None. ``kind``:
    "attend" / "hidden" (bool) or "additive" (0 visible, a fill at or below ABSORBING_FILL hidden)."""
    if not isinstance(value, torch.Tensor) or not 2 <= value.dim() <= 4 or any(d != 1 for d in value.shape[:-2]):
        return None
    value = value.reshape(value.shape[-2:]).expand(Sq, Sk).cpu()
    if kind == "additive":
        if not value.dtype.is_floating_point or not ((value == 0) | (value <= ABSORBING_FILL)).all():
            return None
        return value == 0
    if value.dtype != torch.bool:
        return None
    return ~value if kind == "hidden" else value


def _bands(scores: _Scores, Sq, Sk) -> tuple[int, int]:
    """Masks that are a band of diagonals (causal, a sliding window), computed from sizes only, become the
    kernel's window (left, right), which skips the tiles outside it and reads no mask; removed from ``scores``.
    Returns (-1, -1) (no window) when none is. A mask that replaces the scores by a finite fill or adds one is
    taken only when every row keeps a visible key (eager averages a row hidden everywhere; the kernel gives 0)."""
    if Sq is None or Sk is None or Sq * Sk > MAX_BAND_ELEMENTS:
        return -1, -1
    lo, hi, found = -(Sq + Sk), Sq + Sk, False

    def take(node, kind, finite):
        nonlocal lo, hi, found
        visible = _visible(_evaluate(node, [MAX_CONSTANT_OPS]), Sq, Sk, kind)
        band = _band_of(visible) if visible is not None else None
        if band is None or (finite and not visible.any(-1).all()):
            return False
        lo, hi, found = max(lo, band[0]), min(hi, band[1]), True
        return True

    scores.hidden = [(c, h) for c, h in scores.hidden if not take(c, "hidden" if h else "attend", False)]
    scores.absorbing = [(c, h) for c, h in scores.absorbing if not take(c, "hidden" if h else "attend", True)]
    scores.additive = [(n, sign) for n, sign in scores.additive if not (sign > 0 and take(n, "additive", True))]
    if not found:
        return -1, -1
    left = -1 if lo <= -(Sq - 1) else -lo  # every key before the diagonal visible: no left edge
    right = -1 if hi >= Sk - 1 else hi
    return left, right


def _alibi(scores: _Scores, vq, window, Sq, Sk):
    """An additive term ``slopes * D`` (either order) with ``D`` computed from sizes only and equal to
    ``c * |i - j|`` on every visible position, and ``slopes`` one number a head ((H, 1, 1), (1, H, 1, 1) or
    (B, H, 1, 1), no gradient): the kernel's ALiBi, ``- slope * |i - j|`` computed in the kernel, no (H, Sq, Sk)
    bias in memory. Returns (per-head node, factor, shape of the slopes): slopes = factor * per-head values; the
    term is removed from ``scores``. None when no term is ALiBi."""
    if Sq is None or Sk is None or Sq * Sk > MAX_BAND_ELEMENTS:
        return None
    B, H = _known(vq.shape[0]), _known(vq.shape[1])
    offset = torch.arange(Sk).view(1, Sk) - torch.arange(Sq).view(Sq, 1)
    visible = torch.ones(Sq, Sk, dtype=torch.bool)
    left, right = window
    if left >= 0:
        visible &= offset >= -left
    if right >= 0:
        visible &= offset <= right
    for n, (node, sign) in enumerate(scores.additive):
        if _op(node) != "mul" or len(node.args) != 2 or not all(isinstance(a, torch.fx.Node) for a in node.args):
            continue
        for per_head, dist in (node.args, node.args[::-1]):
            ph = _val(per_head)
            if not isinstance(ph, torch.Tensor) or ph.requires_grad or not ph.dtype.is_floating_point:
                continue
            shape = tuple(ph.shape)
            if len(shape) < 3 or any(d != 1 for d in shape[-2:]):
                continue
            lead = shape[:-2]
            if lead in ((H,), (1, H)):
                heads = (H,)
            elif lead == (B, H):
                heads = (B, H)
            else:
                continue
            d = _evaluate(dist, [MAX_CONSTANT_OPS])
            if not isinstance(d, torch.Tensor) or d.dtype == torch.bool or d.dtype.is_complex or not 2 <= d.dim() <= 4 \
                    or any(x != 1 for x in d.shape[:-2]):
                continue
            d = d.reshape(d.shape[-2:]).expand(Sq, Sk).cpu().double()
            dist_abs = offset.abs().double()
            nonzero = visible & (dist_abs > 0)
            if not nonzero.any():
                continue
            c = float((d[nonzero] / dist_abs[nonzero]).mean())
            if c == 0 or not torch.allclose(d[visible], c * dist_abs[visible], rtol=1e-6, atol=0):
                continue
            # the term is sign * per_head * c * |i - j| = -slope * |i - j| with slope = -c * sign * per_head
            del scores.additive[n]
            return per_head, -c * sign, heads
    return None


def describe(call, mask_kind: str | None = None) -> str:
    """The parameters of an ``attention_fwd`` (or ``attention_mod_fwd``) call node, for ``explain``."""
    if call.target is torch.ops.tilefuse.attention_mod_fwd.default:
        q, k, v, mask, _operands, scale, causal, left, right, dropout_p, _key = call.args
        alibi, softcap = None, 0.0
    else:
        q, k, v, mask, alibi, scale, softcap, causal, left, right, dropout_p = call.args
    parts = [f"scale {scale:.4g}"]
    if softcap:
        parts.append(f"softcap {softcap:g}")
    if causal:
        parts.append("causal")
    if (left, right) != (-1, -1):
        parts.append(f"window ({left}, {right})")
    if alibi is not None:
        parts.append("alibi")
    if mask is not None:
        parts.append(f"{mask_kind or 'a'} mask")
    group = _val(q).shape[1] // _val(k).shape[1]
    if group > 1:
        parts.append(f"GQA group {group}")
    if dropout_p:
        parts.append(f"dropout {dropout_p:g}")
    return ", ".join(parts)


def _build_mask(graph, scores: _Scores, dtype: torch.dtype):
    """One mask tensor for the kernel (inserted at the current point): the additive terms and absorbing fills
    summed, with the -inf masks applied by ``where``; or one boolean mask (True = attend); or None."""
    additive = None
    for node, sign in scores.additive:
        term = node if sign > 0 else graph.call_function(operator.neg, (node,))
        additive = term if additive is None else graph.call_function(operator.add, (additive, term))
    attend = _combine(graph, scores.hidden + scores.absorbing, hidden=False)
    if additive is not None:
        additive = _floored(graph, additive, dtype)
    if additive is not None and attend is not None:
        return graph.call_function(torch.where, (attend, additive, -math.inf))
    return additive if additive is not None else attend


def _uniform_empty_rows(graph, out, scores: _Scores, v_full):
    """Eager's result for a row whose every key was filled with the same finite value (finfo.min): softmax
    is uniform there, the row is the mean of v over the keys, and the scores get no gradient. The kernel
    (which hides those keys) gives such a row 0, so the row is taken from ``v.mean`` instead."""
    attend = _combine(graph, scores.hidden + scores.absorbing, hidden=False)
    empty = graph.call_function(torch.logical_not, (graph.call_function(torch.any, (attend, -1), {"keepdim": True}),))
    mean = graph.call_function(torch.mean, (v_full, -2), {"keepdim": True})
    return graph.call_function(torch.where, (empty, mean, out))


def _mask_dtype(scores: _Scores):
    dtypes = [_val(n).dtype for n, _ in scores.additive]
    if scores.absorbing:
        dtypes.append(torch.float32)
    return functools.reduce(torch.promote_types, dtypes) if dtypes else torch.float32


def _combine(graph, conds: list, hidden: bool):
    """One boolean tensor from (cond, hidden_when) pairs: True where any hides (``hidden``) or all attend."""
    out = None
    for cond, hidden_when in conds:
        c = cond if hidden_when == hidden else graph.call_function(torch.logical_not, (cond,))
        out = c if out is None else graph.call_function(torch.logical_or if hidden else torch.logical_and, (out, c))
    return out


def _floored(graph, additive, dtype):
    """``additive`` with finite values below :data:`ABSORBING_STANDIN` raised to it (float32/bfloat16/float64
    masks). -inf stays -inf: eager's SDPA gives a row masked everywhere with -inf zeros, as the kernel does (the
    float masks nn.MultiheadAttention makes from boolean ones), where a floored row would average v."""
    if dtype not in (torch.float32, torch.bfloat16, torch.float64):
        return additive
    floored = graph.call_function(torch.clamp, (additive,), {"min": ABSORBING_STANDIN})
    return graph.call_function(torch.where, (graph.call_function(torch.isneginf, (additive,)), additive, floored))


def _erase_dead(graph, start) -> None:
    """Erase ``start`` and the ops above it that only it used (the replaced attention)."""
    stack = [start]
    while stack:
        n = stack.pop()
        if getattr(n, "_erased", False):  # reached twice (an op reading the scores twice, s + sin(s))
            continue
        if n.users or n.op != "call_function" and n.op != "call_method":
            continue
        if n.op == "call_method" and n.target.endswith("_"):
            continue  # an in-place method: never erased
        inputs = list(n.all_input_nodes)
        graph.erase_node(n)
        stack.extend(inputs)


def _match_sdpa(gm, node) -> str:
    q, k, v = (_arg(node, i, name) for i, name in enumerate(("query", "key", "value")))
    mask = _arg(node, 3, "attn_mask")
    dropout_p = _arg(node, 4, "dropout_p", 0.0)
    causal = _arg(node, 5, "is_causal", False)
    scale = _arg(node, 6, "scale", None)
    gqa = node.kwargs.get("enable_gqa", False)
    for name, value in (("dropout_p", dropout_p), ("is_causal", causal), ("scale", scale), ("enable_gqa", gqa)):
        if isinstance(value, torch.fx.Node):
            raise NoMatch(f"{name} is not a constant")
    vq = _check_qkv(q, k, v, "sdpa")
    vk = _val(k)
    out_val = _val(node)
    if not isinstance(out_val, torch.Tensor) or out_val.dtype != vq.dtype:
        raise NoMatch(f"sdpa's output dtype {getattr(out_val, 'dtype', None)} differs from q's {vq.dtype} "
                      f"(autocast)")
    if not _same(vq.shape[1], vk.shape[1]) and not gqa:
        raise NoMatch("k/v heads differ from q's without enable_gqa (eager raises)")
    if mask is not None:
        _check_mask(mask, vq, vk)
        if causal:
            raise NoMatch("is_causal with attn_mask (eager raises)")
    if scale is None:
        scale = 1.0 / math.sqrt(_known(vq.shape[3]))
    mask_kind = None if mask is None else "boolean" if _val(mask).dtype == torch.bool else "additive"
    graph = gm.graph
    with graph.inserting_before(node):
        if mask is not None and _val(mask).dtype != torch.bool:
            mask = _floored(graph, mask, _val(mask).dtype)
        call = graph.call_function(torch.ops.tilefuse.attention_fwd.default,
                                   (q, k, v, mask, None, float(scale), 0.0, int(bool(causal)), -1, -1,
                                    float(dropout_p)))
        out = graph.call_function(operator.getitem, (call, 0))
    out.meta["example_value"] = _val(node)
    node.replace_all_uses_with(out)
    _erase_dead(graph, node)
    return describe(call, mask_kind)


ENABLED = True  # off: attention compiles as the ops it is written with (see :func:`switched_off`)


@contextlib.contextmanager
def switched_off():
    """The pass off while the block runs (graphs compiled in it keep their bmm/softmax attention)."""
    global ENABLED
    before, ENABLED = ENABLED, False
    try:
        yield
    finally:
        ENABLED = before


def rewrite(gm: torch.fx.GraphModule, compile_score_mod=None) -> list[Outcome]:
    """Replace every attention of a Dynamo graph that the family runs; returns the outcomes (also recorded).
    ``compile_score_mod``: what lowers and writes a generated score_mod (the backend passes
    ``codegen.score_mod.compile_chain``, a later stage); without it a chain that needs one stays unmatched, with
    that reason."""
    token = _SCORE_MOD_COMPILER.set(compile_score_mod)
    try:
        return _rewrite(gm)
    finally:
        _SCORE_MOD_COMPILER.reset(token)


def _rewrite(gm: torch.fx.GraphModule) -> list[Outcome]:
    outcomes = []
    if not ENABLED:
        return outcomes
    opened = False
    for node in list(gm.graph.nodes):  # nn.MultiheadAttention's one call, traced open (patterns_mha)
        if not patterns_mha.is_mha(node):
            continue
        try:
            patterns_mha.inline(gm, node)
            opened = True
        except patterns_mha.Refused as exc:
            outcome = Outcome(node.name, "multi_head_attention", str(exc))
            outcomes.append(outcome)
            _note(outcome)
    for node in list(gm.graph.nodes):
        if getattr(node, "_erased", False):  # a node of an attention replaced before it in this loop
            continue
        op = _op(node)
        if op not in ("softmax", "sdpa") and not (op == "div" and hand_softmax(node) is not None):
            continue
        form = "sdpa" if op == "sdpa" else "decomposed"
        try:
            detail = (_match_sdpa if op == "sdpa" else _match_decomposed)(gm, node)
            outcome = Outcome(node.name, form, None, detail)
        except NoMatch as exc:
            outcome = Outcome(node.name, form, str(exc))
        outcomes.append(outcome)
        _note(outcome)
    if opened or any(o.reason is None for o in outcomes):
        gm.graph.lint()
        gm.recompile()
    return outcomes
