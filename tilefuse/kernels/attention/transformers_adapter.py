"""``attn_implementation="tilefuse"`` for Hugging Face transformers models (Llama, Mistral, Qwen2, GPT-2, ...).

    tilefuse.kernels.attention.register_transformers()      # once; then
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="tilefuse")

:func:`register` puts :func:`tilefuse_attention_forward` into ``transformers.AttentionInterface`` and SDPA's mask
builder (``sdpa_mask``: None when ``is_causal`` suffices, else a bool mask, True = attend) into
``AttentionMaskInterface`` under the same name: an implementation without a mask builder receives no mask
at all, and padding would be ignored.

The attention function follows ``transformers.integrations.sdpa_attention.sdpa_attention_forward``'s contract
(query/key/value (B, H, S, D), key/value with the model's KV heads: GQA runs natively, no ``repeat_kv``;
returns ``(attn_output (B, S, H, D), None)``) and its causal rule: ``is_causal`` only without a mask and
with more than one query; SDPA's top-left alignment (keys past the queries are never visible, so no crop is
needed). ``softcap`` (Gemma 2) is passed through. A ``position_bias`` (T5-style learned bias) or
``output_attentions`` goes to transformers' own SDPA path, with a one-time warning.
"""
from __future__ import annotations

import warnings

_warned: set[str] = set()


def _warn_once(key: str, text: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(text, stacklevel=3)


def tilefuse_attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0,
                               scaling: float | None = None, is_causal: bool | None = None, **kwargs):
    from .api import attention

    if kwargs.get("position_bias") is not None or kwargs.get("output_attentions", False):
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        _warn_once("fallback", "tilefuse attention: position_bias / output_attentions are not supported; this layer "
                               "runs transformers' SDPA path")
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    is_causal = bool(query.shape[2] > 1 and attention_mask is None and is_causal)
    out = attention(query, key, value, causal=is_causal, mask=attention_mask, dropout_p=float(dropout or 0.0),
                    scale=scaling, softcap=kwargs.get("softcap"))
    return out.transpose(1, 2).contiguous(), None


def register(name: str = "tilefuse") -> str:
    """Register the attention function and its mask builder under ``name``; idempotent. Returns the name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(name, tilefuse_attention_forward)
    AttentionMaskInterface.register(name, sdpa_mask)
    return name
