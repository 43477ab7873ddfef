"""Shared checking helpers: one tolerance table, relative error against a high-precision reference (norm-wise
and element-wise), poisoned outputs and non-contiguous operands (DESIGN.md, Tests)."""
from __future__ import annotations

import pytest
import torch

import tilefuse.device as tf_device

# What only Triton's interpreter runs: tilefuse over CPU tensors (a bench's --smoke run, the stand-in for a CUDA
# graph capture, the real-model suite's cpu cases). A process running Triton on a GPU runs CPU tensors in ATen or
# refuses them; its own tests there are the cuda and `gpu` ones.
ON_THE_INTERPRETER = "tilefuse over CPU tensors, which only Triton's interpreter runs; this process runs Triton " \
    "on the GPU (its own cases here are the cuda and gpu ones)"
interpreter_only = pytest.mark.skipif(not tf_device.interpreting(), reason=ON_THE_INTERPRETER)


def skip_unless_interpreting() -> None:
    """:data:`interpreter_only` from inside a test or helper."""
    if not tf_device.interpreting():
        pytest.skip(ON_THE_INTERPRETER)

# ‖out − ref‖ / ‖ref‖ allowed, by the dtype of the inputs (the reference is float64, or float32 for half).
TOLERANCE = {
    torch.float64: 1e-12,
    torch.float32: 1e-5,  # ieee fp32 math; tf32 matmuls use TF32_TOLERANCE
    torch.float16: 3e-3,
    torch.bfloat16: 2e-2,
    torch.float8_e4m3fn: 8e-2,
    torch.float8_e5m2: 1.5e-1,
    torch.int8: 0.0,
    torch.int32: 0.0,
}
TF32_TOLERANCE = 2e-3

# Element-wise, beside the norm-wise rule: max |out − ref| / max |ref| may be at most ELEMENT_FACTOR × the
# norm-wise tolerance. A norm hides a concentrated error: one zeroed row of a 4096² bf16 output is a norm-wise
# error of 1/64 ≈ 1.6e-2 (under bf16's 2e-2) but an element-wise error of about 0.6 (the row's largest element
# against the output's largest). Legitimate rounding is spread over the elements and stays below a few ulps of
# the largest element, far under this limit (fp32 4e-5, fp16 1.2e-2, bf16 8e-2, TF32 8e-3).
ELEMENT_FACTOR = 4.0


def _finite_pair(out: torch.Tensor, ref: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(out, ref) in float64 on the CPU at ref's finite elements, or None if ``out`` is not finite at one."""
    out64 = out.detach().to("cpu", torch.float64)
    ref64 = ref.detach().to("cpu", torch.float64)
    if out64.shape != ref64.shape:
        raise AssertionError(f"shape {tuple(out64.shape)} != reference shape {tuple(ref64.shape)}")
    keep = torch.isfinite(ref64)
    out64, ref64 = out64[keep], ref64[keep]
    if not torch.isfinite(out64).all():
        return None
    return out64, ref64


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """‖out − ref‖ / ‖ref‖ in float64; NaN or Inf anywhere in ``out`` (where ref is finite) is infinite error."""
    pair = _finite_pair(out, ref)
    if pair is None:
        return float("inf")
    out64, ref64 = pair
    denom = ref64.norm().item()
    diff = (out64 - ref64).norm().item()
    if denom == 0.0:
        return diff
    return diff / denom


def elem_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """max |out − ref| / max |ref| in float64 over ref's finite elements (the absolute error if ref is all
    zero); NaN or Inf in ``out`` where ref is finite is infinite error."""
    pair = _finite_pair(out, ref)
    if pair is None:
        return float("inf")
    out64, ref64 = pair
    if out64.numel() == 0:
        return 0.0
    diff = (out64 - ref64).abs().max().item()
    scale = ref64.abs().max().item()
    return diff / scale if scale else diff


def assert_close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype | None = None, tol: float | None = None,
                 what: str = "output") -> float:
    """Norm-wise ``rel_error ≤ tol`` (TOLERANCE[dtype] unless given) and element-wise
    ``elem_error ≤ ELEMENT_FACTOR · tol``; returns the norm-wise error."""
    dtype = dtype or out.dtype
    tol = TOLERANCE[dtype] if tol is None else tol
    err = rel_error(out, ref)
    assert err <= tol, f"{what}: relative error {err:.3g} > {tol:.3g} ({dtype}, shape {tuple(out.shape)})"
    elem = elem_error(out, ref)
    assert elem <= ELEMENT_FACTOR * tol, f"{what}: element-wise error max|out - ref|/max|ref| = {elem:.3g} > " \
        f"{ELEMENT_FACTOR * tol:.3g} ({dtype}, shape {tuple(out.shape)}; norm-wise {err:.3g})"
    return err


def poison(t: torch.Tensor) -> torch.Tensor:
    """Fill ``t`` with NaN (floats) or an unlikely value (integers) so unwritten elements show up."""
    if t.dtype.is_floating_point:
        return t.fill_(float("nan"))
    return t.fill_(-123 if t.dtype.is_signed else 123)


def poisoned_empty(*shape, dtype, device) -> torch.Tensor:
    return poison(torch.empty(*shape, dtype=dtype, device=device))


def noncontiguous(t: torch.Tensor) -> torch.Tensor:
    """The same values as ``t`` in a non-contiguous view (every other column of a wider buffer)."""
    wide = torch.empty(*t.shape[:-1], t.shape[-1] * 2, dtype=t.dtype, device=t.device)
    poison(wide)
    view = wide[..., ::2]
    view.copy_(t)
    assert not view.is_contiguous() or t.numel() <= 1
    return view


def moved_to(value, device: torch.device):
    """``value`` on ``device`` when it is a tensor elsewhere (a meta tensor stays: it is a case of its own), other
    values as they are. An expanded view moves its stored elements only and is expanded again there, so a huge
    expand costs nothing. For argument cases made at import on the CPU, run where the kernels run."""
    if not isinstance(value, torch.Tensor) or value.is_meta or value.device == torch.device(device):
        return value
    if 0 in value.stride():
        stored = [1 if st == 0 else n for n, st in zip(value.shape, value.stride())]
        return value.as_strided(stored, value.stride()).to(device).expand(value.shape)
    return value.to(device)


def transposed_copy(t: torch.Tensor) -> torch.Tensor:
    """The same values as ``t`` (2-D or batched) stored column-major: a transposed view of a contiguous tensor."""
    return t.transpose(-1, -2).contiguous().transpose(-1, -2)


class CudaLauncher:
    """Triton's C launcher of one kept kernel, faked (kernels/launcher.Direct takes the direct form by this class
    name): each launch goes into a log, with the name of the site or kernel it launched."""

    def __init__(self, log: list, name: str):
        self.log, self.name = log, name
        self.launch_cooperative_grid, self.launch_pdl = False, False
        self.global_scratch_size, self.global_scratch_align = 0, 1
        self.profile_scratch_size, self.num_ctas = 0, 1

    def launch(self, *args):
        self.log.append((self.name, args))


class FakeKernel:
    """What a kept launch site reads of a compiled kernel: its C launcher (faked, logging), function and metadata.
    Our own launcher (kernels/fast_launch.py) refuses it (no signature, no metadata), so Triton's form is used."""

    def __init__(self, log: list, name: str, function: int):
        self.run, self.function, self.packed_metadata = CudaLauncher(log, name), function, ("meta", name)


def record_instances(monkeypatch, cls) -> list:
    """Every instance of ``cls`` made from now on (``__init__`` patched through ``monkeypatch``), in order."""
    made = []
    real = cls.__init__

    def init(self, *a, **k):
        real(self, *a, **k)
        made.append(self)

    monkeypatch.setattr(cls, "__init__", init)
    return made


def load_tool(name: str, module_name: str | None = None):
    """``tools/<name>.py`` imported as a module (the tools are scripts, not a package)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "tools" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(module_name or name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
