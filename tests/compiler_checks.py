"""Checking helpers shared by the compiler's test files (OpInfo, models, GPU).

The compiler is treated as a black box reached only through its public surface:
``torch.compile(fn, backend="tilefuse")``, ``tilefuse.compiler.stats()`` / ``reset_stats()``,
``tilefuse.config.override(strict=True)`` and ``tilefuse.explain``. Everything here is about judging what
comes back against eager PyTorch and a high-precision reference (tests/support.py's rules).
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Iterator

import torch
from torch.utils import _pytree as pytree

from tilefuse import config

from .support import TOLERANCE, rel_error

BACKEND = "tilefuse"
STATS_KEYS = ("graphs", "kernels", "kernels_compiled", "cache_hits", "fallbacks", "externs")

# The compiled result may be this many times further from the float64 reference than eager's own result is
# (eager's rounding error sets the scale for ops that are ill-conditioned on a sample, e.g. floor division at a
# near-integer quotient, or tan near a pole). Below TOLERANCE[dtype] nothing is compared against eager.
EAGER_ERROR_FACTOR = 4.0

HALF_TYPES = (torch.float16, torch.bfloat16)


def compiler_module():
    """``tilefuse.compiler`` (imported here so that a missing compiler fails the test, not the collection)."""
    import tilefuse.compiler as compiler

    return compiler


def reset() -> None:
    """A fresh Dynamo (as in a new process) and zeroed tilefuse counters."""
    torch._dynamo.reset()
    compiler_module().reset_stats()


def stats() -> dict:
    s = dict(compiler_module().stats())
    missing = [k for k in STATS_KEYS if k not in s]
    assert not missing, f"tilefuse.compiler.stats() lacks {missing}: the API promises {STATS_KEYS}"
    return s


def compiled(fn, **kwargs):
    return torch.compile(fn, backend=BACKEND, **kwargs)


@contextlib.contextmanager
def strict() -> Iterator[None]:
    """Strict mode: the backend raises instead of falling back to ATen, so a fallback cannot hide a bug."""
    with config.override(strict=True):
        yield


@contextlib.contextmanager
def lenient() -> Iterator[None]:
    with config.override(strict=False):
        yield


def kernel_sources(explanation) -> list[str]:
    """The text of each kernel file an ``explain()`` result lists (those written to disk)."""
    from pathlib import Path

    return [Path(k.path).read_text() for k in explanation.kernels if k.path]


def collect_kernels(monkeypatch) -> list:
    """Patch (for the calling test) ``codegen.generate`` to keep every KernelSource it makes; the list fills
    as graphs compile."""
    from tilefuse.compiler import codegen

    kernels: list = []
    planned = codegen.generate

    def generate(group, sched, target=None):
        ks = planned(group, sched, target)
        kernels.append(ks)
        return ks

    monkeypatch.setattr(codegen, "generate", generate)
    return kernels


def dynamo_graphs() -> int:
    """Graphs Dynamo has made in this process (a running count: ``torch._dynamo.reset()`` does not zero it)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


# ---------------------------------------------------------------------------------------- references
def upcast_dtype(dtype: torch.dtype) -> torch.dtype:
    """The reference precision for inputs of ``dtype``: float64, or float32 for half types."""
    return torch.float32 if dtype in HALF_TYPES else torch.float64


def upcast(tree: Any, dtype: torch.dtype | None = None, *, keep_grad: bool = True) -> Any:
    """A copy of every floating tensor in ``tree`` at reference precision (leaves, with requires_grad kept)."""

    def up(t):
        if not isinstance(t, torch.Tensor):
            return t
        if t.dtype.is_floating_point:
            target = dtype or upcast_dtype(t.dtype)
            out = t.detach().to(target)
            return out.requires_grad_(t.requires_grad) if keep_grad else out
        return t.detach().clone()

    return pytree.tree_map(up, tree)


def upcast_dtype_args(tree: Any, dtype: torch.dtype) -> Any:
    """``tree`` with every ``torch.dtype`` argument equal to ``dtype`` replaced by its reference precision."""
    if not dtype.is_floating_point:
        return tree
    return pytree.tree_map(lambda v: upcast_dtype(dtype) if isinstance(v, torch.dtype) and v == dtype else v, tree)


def tensors(tree: Any) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves(tree) if isinstance(t, torch.Tensor)]


def tol_for(*dtypes: torch.dtype) -> float:
    """The looser tolerance among the floating dtypes given (an fp32 op with an fp16 output is held to fp16's)."""
    floats = [d for d in dtypes if d is not None and d.is_floating_point]
    return max((TOLERANCE.get(d, TOLERANCE[torch.float32]) for d in floats), default=0.0)


def _exact_problem(what: str, out: torch.Tensor, eager: torch.Tensor) -> str | None:
    if out.dtype.is_floating_point:
        same = torch.equal(torch.nan_to_num(out, nan=0.0), torch.nan_to_num(eager, nan=0.0)) and \
            torch.equal(torch.isnan(out), torch.isnan(eager))
    else:
        same = torch.equal(out, eager)
    if same:
        return None
    diff = (out != eager)
    if out.dtype.is_floating_point:
        diff &= ~(torch.isnan(out) & torch.isnan(eager))
    return f"{what}: {int(diff.sum())} of {out.numel()} elements differ from eager (exact comparison)"


def tensor_problem(what: str, out: Any, eager: torch.Tensor, ref: torch.Tensor | None, *,
                   tol: float | None = None, exact: bool = False) -> str | None:
    """None if ``out`` is eager's answer, else what is wrong.

    Shape and dtype must be eager's. Integer and bool results (and ``exact=True``) must equal eager's.
    Floating results: NaN/Inf exactly where eager has them, and on the finite rest
    ``‖out − ref‖/‖ref‖ ≤ max(tol, EAGER_ERROR_FACTOR · ‖eager − ref‖/‖ref‖)`` with ``ref`` at higher precision.
    """
    if not isinstance(out, torch.Tensor):
        return f"{what}: got {type(out).__name__}, eager gave a tensor"
    if out.shape != eager.shape:
        return f"{what}: shape {tuple(out.shape)} != eager's {tuple(eager.shape)}"
    if out.dtype != eager.dtype:
        return f"{what}: dtype {out.dtype} != eager's {eager.dtype}"
    if out.device != eager.device:
        return f"{what}: device {out.device} != eager's {eager.device}"
    out, eager = out.detach(), eager.detach()
    if exact or not eager.dtype.is_floating_point or ref is None:
        return _exact_problem(what, out, eager)
    ref = ref.detach().to(eager.device)
    eager_bad = ~torch.isfinite(eager)
    if eager_bad.any():
        if not torch.equal(torch.isnan(out), torch.isnan(eager)):
            return f"{what}: NaN pattern differs from eager's ({int(torch.isnan(out).sum())} vs {int(torch.isnan(eager).sum())} NaNs)"
        infs = torch.isinf(eager)
        if not torch.equal(out[infs], eager[infs]):
            return f"{what}: Inf elements differ from eager's"
    keep = torch.isfinite(eager) & torch.isfinite(ref)
    if not keep.any():
        return None
    err = rel_error(out[keep], ref[keep])
    eager_err = rel_error(eager[keep], ref[keep])
    limit = max(tol if tol is not None else tol_for(eager.dtype), EAGER_ERROR_FACTOR * eager_err)
    if not err <= limit:  # also catches NaN
        return f"{what}: relative error {err:.3g} > {limit:.3g} (eager's own error {eager_err:.3g})"
    return None


def tree_problems(what: str, out: Any, eager: Any, ref: Any, *, tol: float | None = None,
                  exact: bool = False) -> list[str]:
    """Compare two output structures leaf by leaf (tuples, lists, tensors, Python numbers)."""
    out_leaves, out_spec = pytree.tree_flatten(out)
    eager_leaves, eager_spec = pytree.tree_flatten(eager)
    if out_spec != eager_spec:
        return [f"{what}: output structure {out_spec} != eager's {eager_spec}"]
    ref_leaves = pytree.tree_leaves(ref) if ref is not None else [None] * len(eager_leaves)
    if len(ref_leaves) != len(eager_leaves):
        ref_leaves = [None] * len(eager_leaves)
    problems = []
    for i, (o, e, r) in enumerate(zip(out_leaves, eager_leaves, ref_leaves)):
        name = what if len(eager_leaves) == 1 else f"{what}[{i}]"
        if isinstance(e, torch.Tensor):
            p = tensor_problem(name, o, e, r if isinstance(r, torch.Tensor) else None, tol=tol, exact=exact)
        elif e is None:
            p = None if o is None else f"{name}: got {type(o).__name__}, eager gave None"
        else:
            p = None if o == e else f"{name}: {o!r} != eager's {e!r}"
        if p:
            problems.append(p)
    return problems


def assert_matches(what: str, out: Any, eager: Any, ref: Any = None, **kw) -> None:
    problems = tree_problems(what, out, eager, ref, **kw)
    assert not problems, "; ".join(problems)


# ------------------------------------------------------------------------------------------- aliasing
def storage_ptr(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def aliases(t: torch.Tensor, others: list[torch.Tensor]) -> int | None:
    """Index of the first tensor in ``others`` whose storage ``t`` shares, or None."""
    if not isinstance(t, torch.Tensor) or t.numel() == 0:
        return None
    for i, o in enumerate(others):
        if isinstance(o, torch.Tensor) and o.numel() > 0 and storage_ptr(o) == storage_ptr(t):
            return i
    return None


def alias_problems(what: str, out: Any, eager: Any, inputs: list[torch.Tensor], *, require_views: bool = True,
                   eager_inputs: list[torch.Tensor] | None = None) -> list[str]:
    """Outputs that do not alias an input in eager must not alias one when compiled (writing to one would change
    the other). With ``require_views``, outputs that alias an input in eager (view ops) must alias the same input
    as the same view: sizes, strides and offset."""
    problems = []
    outs, eags = pytree.tree_leaves(out), pytree.tree_leaves(eager)
    for i, (o, e) in enumerate(zip(outs, eags)):
        if not isinstance(e, torch.Tensor) or not isinstance(o, torch.Tensor):
            continue
        ea, oa = aliases(e, inputs if eager_inputs is None else eager_inputs), aliases(o, inputs)
        name = f"{what}[{i}]"
        if ea is not None and not require_views:
            continue
        if ea is not None and oa != ea:
            problems.append(f"{name}: eager returns a view of input {ea}; compiled returns "
                            + ("a fresh tensor" if oa is None else f"a view of input {oa}"))
        elif ea is None and oa is not None:
            problems.append(f"{name}: eager returns a fresh tensor; compiled returns a view of input {oa}")
        elif ea is not None and (o.stride() != e.stride() or o.storage_offset() != e.storage_offset()):
            problems.append(f"{name}: view strides/offset {o.stride()}+{o.storage_offset()} != eager's "
                            f"{e.stride()}+{e.storage_offset()}")
    return problems


@dataclasses.dataclass
class Run:
    """What one compiled call did, from tilefuse's counters."""
    stats: dict
    dynamo_graphs: int

    @property
    def work(self) -> int:
        s = self.stats
        return int(s["kernels"]) + int(s["kernels_compiled"]) + int(s["cache_hits"]) + int(s["externs"])
