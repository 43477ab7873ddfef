"""The library's boundary with ``torch.compile``: a library call that Dynamo meets runs as eager code behind a graph
break. Dynamo cannot trace the launch path (Triton's launcher, and on the CPU its interpreter, which fails inside
Dynamo); the compiled graphs around the call are unaffected."""
from __future__ import annotations

import functools

import torch


def eager_under_compile(fn):
    """``fn`` as it is for eager callers (the disable wrapper costs host time on every call), and behind
    ``torch.compiler.disable`` while Dynamo traces."""
    disabled = torch.compiler.disable(fn, reason="a tilefuse library call runs as one opaque eager call")

    @functools.wraps(fn)
    def call(*args, **kwargs):
        if torch.compiler.is_compiling():
            return disabled(*args, **kwargs)
        return fn(*args, **kwargs)
    call.eager = disabled
    return call
