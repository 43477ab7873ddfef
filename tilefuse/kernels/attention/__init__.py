"""The Triton flash-attention family: one kernel source for the library API, the compiler and every vendor.

    out = tilefuse.attention(q, k, v, causal=True)          # q (B, H, Sq, D), k/v (B, H_kv, Sk, D)

Semantics are ``F.scaled_dot_product_attention``'s, with these choices (each tested against a float64
reference in tests/kernels/attention/test_attention.py):

- **Layout**: q/k/v are read through their strides: a model's (B, S, H, D) projection viewed with
  ``.transpose(1, 2)`` is read with no copy, and the output is laid out like ``q``.
- **causal**: ``True`` / ``"top_left"`` is SDPA's ``is_causal`` (query ``i`` sees keys ``j <= i``, also when
  Sq != Sk); ``"bottom_right"`` is FlashAttention's (``j <= i + Sk - Sq``: the queries are the last Sq
  positions of the keys, what a KV cache needs).
- **window=(left, right)**: query ``i`` sees keys ``i + d - left .. i + d + right`` (``d`` the diagonal of
  the causal alignment, 0 by default); ``None`` or ``-1`` on a side is unbounded; with causal the right side
  is 0. Tiles with no visible key are skipped.
- **Score order**: ``s = q k^T * scale``, then ``softcap * tanh(s / softcap)``, then the ALiBi bias
  ``-slope[b, h] * |i + d - j|`` (slopes of shape (H,) or (B, H)), then a float ``mask`` (added), then
  ``score_mod(s, b, h, q_idx, k_idx)``, then a bool ``mask`` (True = attend) and causal/window: the mod never
  sees the -inf of a bool mask or the band (it sees whatever an additive mask holds).
- **score_mod**: a ``@triton.jit`` elementwise function of the score tile (fp32) and index tensors that
  broadcast against it (``b`` a scalar; ``h`` a scalar, or a column in the decode form; ``q_idx``/``k_idx``
  a column and a row, or transposed in the backward). It runs on padded positions too (indices past the
  sequence, results discarded): mask any load in it. The backward needs ``score_mod_grad`` with the same
  arguments returning ``d score_mod / d score`` (1.0 for a bias); without it, inputs that require grad are
  refused up front. The compiler fills this seam with generated code.
- **Fully masked rows** (no visible key) give 0 output and 0 gradients, where
  ``F.scaled_dot_product_attention`` gives NaN with a boolean mask (and eager softmax with a finite
  ``finfo.min`` mask averages the values uniformly). Their logsumexp is -inf.
- **dropout_p**: a counter-based Philox mask (``tl.rand``), regenerated in the backward from the seed;
  ``dropout_seed`` pins it (else drawn from torch's generator, so ``torch.manual_seed`` reproduces a run).
  :func:`dropout_mask` returns the mask a seed gives.
- **GQA/MQA**: ``k``/``v`` with H_kv heads dividing H; query head ``h`` reads KV head ``h // (H // H_kv)``;
  dK/dV are summed over the group inside one program (no atomics).
- **deterministic**: the backward computes dQ in its own pass instead of fp32 atomics: bitwise equal runs.
- Gradients flow to q, k and v; ``mask`` and ``alibi`` get none (a mask that requires grad is refused).
- **Packed variable-length sequences** (:mod:`.varlen`, FlashAttention's ``varlen`` form)::

      out = tilefuse.attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=True)

  q (total_q, H, D), k/v (total_k, H_kv, D), int32 cumulative lengths (batch + 1,). Each sequence attends
  within itself, every option above applying per sequence with indices counted from its start (``causal=True``
  top-left per sequence as above, ``"bottom_right"`` aligns each sequence's last query with its last key;
  ALiBi slopes (H,) or (batch, H); dropout streams per (sequence, head)); no ``mask``. Zero-length sequences
  give nothing (no query) or zero rows (no key). ``check_seqlens=True`` reads the lengths on the host once (a
  sync on a GPU) to check them; False trusts them. The same kernels with a constexpr VARLEN switch, prefill
  form only (no split-KV decode form).

dtypes float16 / bfloat16 / float32 (fp32 accumulation; fp32 matmuls are tf32 when
``torch.backends.cuda.matmul.allow_tf32`` is set), head dims 1..256 (padded to a power of two, masked).
Few query rows (decode) run a split-KV form: the GQA group's rows packed into one program a KV head, the KV
length split across programs, a second kernel combining the partial results by their logsumexp.
"""
from __future__ import annotations

from . import configs, targets  # noqa: F401  (targets: registers the kernels with tilefuse.targets)
from .api import (AttentionFunction, AttentionVarlenFunction, attention, attention_varlen,  # noqa: F401
                  attention_varlen_with_lse, attention_with_lse, supports)
from .checks import DTYPES, MAX_HEAD_DIM, Params, check_arguments  # noqa: F401
from .launch import Plan, backward, dropout_mask, forward, lse_natural, plan_forward  # noqa: F401

from .varlen import dropout_mask_varlen  # noqa: F401

__all__ = ["attention", "attention_with_lse", "attention_varlen", "attention_varlen_with_lse", "AttentionFunction",
           "AttentionVarlenFunction", "supports", "dropout_mask", "dropout_mask_varlen", "register_transformers"]


def register_transformers(name: str = "tilefuse") -> str:
    """Register ``attn_implementation=name`` with Hugging Face transformers (see :mod:`.transformers_adapter`)."""
    from .transformers_adapter import register

    return register(name)
