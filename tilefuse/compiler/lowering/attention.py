"""Lowering of the attention family's custom ops (``tilefuse::attention_fwd`` / ``attention_bwd`` and their
generated-score_mod forms ``attention_mod_fwd`` / ``attention_mod_bwd``, which the attention pattern pass puts in
the graph): a call of the library's flash kernels, an extern by design (not a
fallback: ``explain`` lists it as a tilefuse library kernel)."""
from __future__ import annotations

import torch

from ...kernels.attention import ops as attention_ops  # noqa: F401  (defines the tilefuse:: custom ops)
from ...kernels.attention import ops_score_mod  # noqa: F401  (defines tilefuse::attention_mod_*)
from .core import DIRECT_CALLS, register

LIBRARY_OPS = (torch.ops.tilefuse.attention_fwd.default, torch.ops.tilefuse.attention_bwd.default,
               torch.ops.tilefuse.attention_mod_fwd.default, torch.ops.tilefuse.attention_mod_bwd.default)

# the wrapper calls each op's function itself, without the dispatcher's Python (autograd's, the backend's and the
# aliasing check's layers): 216 us less a GPT-2 decode step of 12 attention calls on an H100's host (decision 038)
for _op in LIBRARY_OPS:
    DIRECT_CALLS[_op] = {**attention_ops.IMPLEMENTATIONS, **ops_score_mod.IMPLEMENTATIONS}[_op._schema.name]


@register(*LIBRARY_OPS)
def lower_library_call(low, *args, **kwargs):
    return low.extern(low.current, args, kwargs, reason=None)
