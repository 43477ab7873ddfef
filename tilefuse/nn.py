"""``tilefuse.nn.Linear``: a drop-in for ``torch.nn.Linear`` whose forward (and backward) run on the
tilefuse GEMM, with an optional activation fused into the GEMM's epilogue.

Same constructor, same parameters (``weight`` of shape (out_features, in_features), ``bias``), same
initialisation and the same ``state_dict`` keys as ``torch.nn.Linear``: weights load either way.
``activation=`` (None, "relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh") is applied in the same
kernel, i.e. ``Linear(..., activation="gelu")(x) == gelu(torch.nn.Linear(...)(x))``.

Inputs of any leading shape (..., in_features). Where the tilefuse kernels cannot take the input (a tensor
on another device than the one tilefuse runs on, or a dtype outside fp16/bf16/fp32) the module falls back
to ``torch.nn.functional.linear`` (logged at ``TILEFUSE_DEBUG=1``), so swapping the class never breaks a
model.
"""
from __future__ import annotations

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

    def _runs_here(self, x: torch.Tensor) -> bool:
        where = device.torch_device()
        return (x.device.type == where.type and x.dtype in (torch.float16, torch.bfloat16, torch.float32)
                and self.weight.dtype == x.dtype and self.weight.device == x.device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self._runs_here(x):
            config.log(1, f"tilefuse.nn.Linear: {x.dtype} input on {x.device} (weight {self.weight.dtype} on "
                          f"{self.weight.device}) falls back to torch.nn.functional.linear")
            y = torch.nn.functional.linear(x, self.weight, self.bias)
            return linalg._TORCH_ACTIVATIONS[self.activation](y) if self.activation else y
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)
        y = linalg.gemm(x2, self.weight.t(), bias=self.bias, activation=self.activation)
        return y.reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        return super().extra_repr() + (f", activation={self.activation!r}" if self.activation else "")
