"""Lowering of the attention family's custom ops (``tilefuse::attention_fwd`` / ``attention_bwd`` and their
generated-score_mod forms ``attention_mod_fwd`` / ``attention_mod_bwd``, which the attention pattern pass puts in
the graph): a call of the library's flash kernels, an extern by design (not a
fallback: ``explain`` lists it as a tilefuse library kernel)."""
from __future__ import annotations

import torch

from ...kernels.attention import ops as attention_ops  # noqa: F401  (defines the tilefuse:: custom ops)
from ...kernels.attention import ops_score_mod  # noqa: F401  (defines tilefuse::attention_mod_*)
from .core import register

LIBRARY_OPS = (torch.ops.tilefuse.attention_fwd.default, torch.ops.tilefuse.attention_bwd.default,
               torch.ops.tilefuse.attention_mod_fwd.default, torch.ops.tilefuse.attention_mod_bwd.default)


@register(*LIBRARY_OPS)
def lower_library_call(low, *args, **kwargs):
    return low.extern(low.current, args, kwargs, reason=None)
