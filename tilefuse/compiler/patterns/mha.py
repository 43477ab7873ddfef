"""``nn.MultiheadAttention`` opened up for the attention pass (patterns/attention.py).

Dynamo keeps ``F.multi_head_attention_forward`` as one call in its graph (training, ``need_weights`` either
way, and inference, where ``nn.MultiheadAttention`` under Dynamo does not take its fast path), and the
inference fast path, where taken, is one ``torch._native_multi_head_attention`` call. The pass cannot see the
attention inside either. :func:`inline` replaces such a call by torch's own implementation, traced at the
graph's shapes with ``make_fx(pre_dispatch=True)``: the in-projection, the masks merged as torch merges
them, ``aten.scaled_dot_product_attention`` (which the pass then replaces with the flash kernel, as it does
``F.scaled_dot_product_attention``), the out-projection. Every branch of torch's code (packed or separate
projection weights, ``bias_k``/``bias_v``, ``add_zero_attn``, boolean or float masks, ``is_causal``) is the
one torch takes for these arguments, because it is torch's code that runs.

``need_weights=True`` computes the averaged attention weights by bmm / softmax / bmm: when the model uses them
(an output of the model, or read by another op) the call stays as it is, with the reason, since a flash kernel
never forms the weights; when nothing reads them, the call is traced with ``need_weights=False`` (the same
output).
"""
from __future__ import annotations

import inspect
import operator

import torch
import torch.fx
import torch.nn.functional as F

__all__ = ["Refused", "is_mha", "inline"]

NATIVE = getattr(torch, "_native_multi_head_attention", None)
TARGETS = tuple(t for t in (F.multi_head_attention_forward, NATIVE) if t is not None)


class Refused(Exception):
    """The call stays as written (the message is the reason)."""


def is_mha(node) -> bool:
    return node.op == "call_function" and node.target in TARGETS


def _val(x):
    return x.meta.get("example_value") if isinstance(x, torch.fx.Node) else x


def _weights_used(node) -> bool:
    for u in node.users:
        if u.op != "call_function" or u.target is not operator.getitem or u.args[1] not in (0, 1):
            return True  # the whole tuple escapes
        if u.args[1] == 1 and u.users:
            return True
    return False


def _as_functional(node) -> dict:
    """The call's arguments as ``F.multi_head_attention_forward``'s (a native fast-path call converted: its
    inputs are batch-first)."""
    if node.target is F.multi_head_attention_forward:
        bound = inspect.signature(F.multi_head_attention_forward).bind(*node.args, **node.kwargs)
        bound.apply_defaults()
        return dict(bound.arguments), False
    names = ("query", "key", "value", "embed_dim", "num_head", "qkv_weight", "qkv_bias", "proj_weight", "proj_bias",
             "mask", "need_weights", "average_attn_weights", "mask_type")
    a = dict(zip(names, node.args))
    a.update(node.kwargs)
    mask, mask_type = a.get("mask"), a.get("mask_type")
    if mask is not None and mask_type not in (0, 1):
        raise Refused(f"_native_multi_head_attention with mask_type {mask_type} (a merged mask)")
    return dict(query=a["query"], key=a["key"], value=a["value"], embed_dim_to_check=a["embed_dim"],
                num_heads=a["num_head"], in_proj_weight=a["qkv_weight"], in_proj_bias=a["qkv_bias"], bias_k=None,
                bias_v=None, add_zero_attn=False, dropout_p=0.0, out_proj_weight=a["proj_weight"],
                out_proj_bias=a["proj_bias"], training=False,
                key_padding_mask=mask if mask_type == 1 else None, need_weights=a.get("need_weights", True),
                attn_mask=mask if mask_type == 0 else None, average_attn_weights=a.get("average_attn_weights", True),
                is_causal=False), True


def inline(gm: torch.fx.GraphModule, node) -> None:
    """Replace ``node`` (see :func:`is_mha`) by torch's implementation, traced; raises :class:`Refused`."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.fx.experimental.proxy_tensor import make_fx

    args, batch_first = _as_functional(node)
    if args["need_weights"] and _weights_used(node):
        raise Refused("need_weights=True and the averaged attention weights are used (an output of the model): "
                      "a flash kernel never forms the weights; pass need_weights=False")
    names = [k for k, v in args.items() if isinstance(v, torch.fx.Node)]
    values = [_val(args[k]) for k in names]
    if not all(isinstance(v, torch.Tensor) for v in values):
        raise Refused("an argument without a fake tensor value")
    if values[0].dim() != 3:
        raise Refused(f"query of rank {values[0].dim()} (unbatched input)")

    def implementation(*tensors):
        a = {**args, **dict(zip(names, tensors)), "need_weights": False}
        if batch_first:
            for k in ("query", "key", "value"):
                a[k] = a[k].transpose(0, 1)
        out = F.multi_head_attention_forward(**a)[0]
        return out.transpose(0, 1) if batch_first else out

    with unset_fake_temporarily():
        try:
            traced = make_fx(implementation, pre_dispatch=True)(*values)
        except Exception as exc:  # torch's own checks (a shape, is_causal without a mask): eager raises too
            raise Refused(f"tracing multi_head_attention_forward failed: {type(exc).__name__}: {exc}") from None
    odd = [n for n in traced.graph.nodes if n.op not in ("placeholder", "call_function", "output")]
    if odd:
        raise Refused(f"the traced implementation holds a {odd[0].op} node ({odd[0].name})")
    graph = gm.graph
    env = {}
    placeholders = [n for n in traced.graph.nodes if n.op == "placeholder"]
    for p, k in zip(placeholders, names):
        env[p] = args[k]
    result = None
    with graph.inserting_before(node):
        for n in traced.graph.nodes:
            if n.op == "placeholder":
                continue
            if n.op == "output":
                result = env[n.args[0]] if isinstance(n.args[0], torch.fx.Node) else env[n.args[0][0]]
                continue
            new = graph.node_copy(n, lambda a: env[a])
            new.meta = {"example_value": n.meta.get("val")}
            env[n] = new
    for u in list(node.users):
        if u.args[1] == 0:
            u.replace_all_uses_with(result)
        graph.erase_node(u)
    graph.erase_node(node)
