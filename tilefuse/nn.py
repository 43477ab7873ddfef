"""``tilefuse.nn.Linear``: a drop-in for ``torch.nn.Linear`` whose forward (and backward) run on the
tilefuse GEMM, with an optional activation fused into the GEMM's epilogue.

Same constructor, same parameters (``weight`` of shape (out_features, in_features), ``bias``), same
initialisation and the same ``state_dict`` keys as ``torch.nn.Linear``: weights load either way.
``activation=`` (None, "relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh") is applied in the same
kernel, i.e. ``Linear(..., activation="gelu")(x) == gelu(torch.nn.Linear(...)(x))``.

Inputs of any leading shape (..., in_features), zero-size ones included (``Linear(0, 4)`` gives the bias,
as torch does). Input torch would refuse (a last dimension other than ``in_features``, a 0-d tensor, a dtype
other than the weight's) is refused before any launch with torch's own error: the call goes to
``torch.nn.functional.linear``, which raises it. Where the tilefuse kernels cannot take a valid input (a
tensor on another device than the one tilefuse runs on, or a dtype outside fp16/bf16/fp32) the module runs
``torch.nn.functional.linear`` instead, with one :class:`tilefuse.TilefuseFallbackWarning` a (dtype,
device) so it is never silent; swapping the class never breaks a model.
"""
from __future__ import annotations

import math
import warnings
from typing import Optional

import torch

from . import config, device
from . import linalg

__all__ = ["Linear"]


class Linear(torch.nn.Linear):
    """``torch.nn.Linear`` on the tilefuse GEMM, with an optional fused activation."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None,
                 activation: Optional[str] = None) -> None:
        if activation not in linalg.ACTIVATIONS:
            raise ValueError(f"activation={activation!r}: accepted values are "
                             + ", ".join(repr(a) for a in linalg.ACTIVATIONS))
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.activation = activation

    @classmethod
    def from_torch(cls, module: torch.nn.Linear, activation: Optional[str] = None) -> "Linear":
        """A tilefuse Linear sharing ``module``'s parameters (no copy)."""
        new = cls.__new__(cls)
        torch.nn.Module.__init__(new)
        new.in_features, new.out_features = module.in_features, module.out_features
        new.weight = module.weight
        new.bias = module.bias
        if activation not in linalg.ACTIVATIONS:
            raise ValueError(f"activation={activation!r}: accepted values are "
                             + ", ".join(repr(a) for a in linalg.ACTIVATIONS))
        new.activation = activation
        return new

    def _valid(self, x) -> bool:
        """What torch.nn.Linear accepts (else torch's own error is raised, by torch)."""
        return (isinstance(x, torch.Tensor) and x.dim() >= 1 and x.shape[-1] == self.in_features
                and x.dtype == self.weight.dtype and x.device == self.weight.device
                and (self.bias is None or (self.bias.dtype == x.dtype and self.bias.device == x.device)))

    def _runs_here(self, x: torch.Tensor) -> bool:
        where = device.torch_device()
        return x.device.type == where.type and x.dtype in (torch.float16, torch.bfloat16, torch.float32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self._valid(x) or not self._runs_here(x):
            if self._valid(x) and x.device.type != "meta":  # (meta tensors carry shapes only: nothing runs)
                _warn_fallback(x)
            y = torch.nn.functional.linear(x, self.weight, self.bias)  # torch's error for input torch refuses
            return linalg._TORCH_ACTIVATIONS[self.activation](y) if self.activation else y
        lead = x.shape[:-1]
        x2 = x.reshape(math.prod(lead), self.in_features)  # (not -1: ambiguous for zero-size input)
        y = linalg.gemm(x2, self.weight.t(), bias=self.bias, activation=self.activation)
        return y.reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        return super().extra_repr() + (f", activation={self.activation!r}" if self.activation else "")


_WARNED: set = set()


def _warn_fallback(x: torch.Tensor) -> None:
    key = (x.dtype, x.device.type)
    if key in _WARNED:
        return
    _WARNED.add(key)
    where = device.torch_device()
    warnings.warn(f"tilefuse.nn.Linear: a {x.dtype} input on {x.device} runs torch.nn.functional.linear, not "
                  f"tilefuse's GEMM (which takes float16, bfloat16 and float32 on {where.type}); "
                  f"shown once for {x.dtype} on {x.device.type}", config.TilefuseFallbackWarning, stacklevel=3)
