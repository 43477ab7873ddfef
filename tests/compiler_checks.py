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

from .support import ELEMENT_FACTOR, TOLERANCE, elem_error, rel_error

BACKEND = "tilefuse"
STATS_KEYS = ("graphs", "kernels", "kernels_compiled", "cache_hits", "fallbacks", "externs")

# The compiled result may be this many times further from the float64 reference than eager's own result is
# (eager's rounding error sets the scale for ops that are ill-conditioned on a sample, e.g. floor division at a
# near-integer quotient, or tan near a pole). Below TOLERANCE[dtype] nothing is compared against eager.
EAGER_ERROR_FACTOR = 4.0
# ... but never beyond this cap (norm-wise; element-wise ELEMENT_FACTOR times it), whatever eager's own error:
# without one a prod sample whose eager result was 100 % off let a compiled result 400 % off pass. A test that
# needs more passes ``eager_cap=`` with ``eager_cap_reason=`` (the sample and why it is ill-conditioned).
EAGER_ERROR_CAP = {
    torch.float64: 1e-6,
    torch.float32: 1e-2,
    torch.float16: 3e-2,
    torch.bfloat16: 1e-1,
    torch.float8_e4m3fn: 2.5e-1,
    torch.float8_e5m2: 4e-1,
}

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


def fake_schedules(fn, make_args) -> list:
    """The schedules of ``fn``'s forward graphs traced from fake tensors, nothing run: ``make_args()`` builds the
    call's arguments inside the fake mode (a suite-sized shape costs no memory). Fails on a graph with a
    fallback to ATen."""
    from torch._functorch.aot_autograd import aot_module_simplified
    from torch._subclasses.fake_tensor import FakeTensorMode

    from tilefuse.compiler import lowering, scheduler
    from tilefuse.compiler.decompositions import decomposition_table

    graphs = []

    def keep(gm, example_inputs):
        graphs.append(gm)
        return gm

    def backend(gm, example_inputs):
        return aot_module_simplified(gm, example_inputs, fw_compiler=keep, decompositions=decomposition_table())

    torch._dynamo.reset()
    with FakeTensorMode(allow_non_fake_inputs=False), torch.no_grad():
        torch.compile(fn, backend=backend)(*make_args())
    torch._dynamo.reset()
    schedules = []
    for gm in graphs:
        g, fallbacks, _ = lowering.lower(gm, lambda n: n.meta.get("val"))
        assert not fallbacks, fallbacks
        schedules.append(scheduler.schedule(g))
    return schedules


def collect_kernels(monkeypatch, target=None) -> list:
    """Patch (for the calling test) ``codegen.generate`` to keep every KernelSource it makes; the list fills
    as graphs compile. ``target``: plan every kernel for this LaunchTarget instead of the one asked for."""
    from tilefuse.compiler import codegen

    kernels: list = []
    planned = codegen.generate

    def generate(group, sched, target_asked=None):
        ks = planned(group, sched, target if target is not None else target_asked)
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


def cap_for(*dtypes: torch.dtype) -> float:
    """The looser cap on the eager-error allowance among the floating dtypes given (as :func:`tol_for`)."""
    floats = [d for d in dtypes if d is not None and d.is_floating_point]
    return max((EAGER_ERROR_CAP.get(d, EAGER_ERROR_CAP[torch.float32]) for d in floats), default=0.0)


@dataclasses.dataclass(frozen=True)
class Errors:
    """How far ``out`` and eager are from the reference: norm-wise (‖·‖/‖ref‖) and element-wise
    (max|·|/max|ref|), and the limits they were held to."""
    err: float
    eager_err: float
    limit: float
    elem: float
    eager_elem: float
    elem_limit: float
    bounded: bool = False  # within tol of the magnitude bound (errors(bound=...)): right for its conditioning

    def problem(self, what: str) -> str | None:
        if self.bounded:
            return None
        if not self.err <= self.limit:  # also catches NaN
            return f"{what}: relative error {self.err:.3g} > {self.limit:.3g} (eager's own error {self.eager_err:.3g})"
        if not self.elem <= self.elem_limit:
            return (f"{what}: element-wise error max|out - ref|/max|ref| = {self.elem:.3g} > {self.elem_limit:.3g} "
                    f"(eager's own {self.eager_elem:.3g}; norm-wise {self.err:.3g})")
        return None


def errors(out: torch.Tensor, eager: torch.Tensor, ref: torch.Tensor, *, tol: float, cap: float,
           bound: torch.Tensor | None = None) -> Errors:
    """The errors of ``out`` and ``eager`` against ``ref`` (same shapes, finite ``ref``) and the limits:
    norm-wise ``max(tol, min(EAGER_ERROR_FACTOR · eager's, cap))``, element-wise
    ``max(ELEMENT_FACTOR · tol, min(EAGER_ERROR_FACTOR · eager's, ELEMENT_FACTOR · cap))``.

    ``bound``: the magnitude of each result's terms (for a multilinear function, the function of the inputs'
    absolute values, ``|A| @ |B|``), the scale of any implementation's rounding error on it: a sum whose terms
    cancel is ill-conditioned, and its relative error grows by ``‖bound‖ / ‖ref‖`` for eager and a kernel alike,
    by how each one orders the sum. Within ``tol`` of ``bound`` (norm-wise, and ``ELEMENT_FACTOR · tol``
    element-wise) the result is right for its conditioning, whatever eager's own error happened to be."""
    err, eager_err = rel_error(out, ref), rel_error(eager, ref)
    elem, eager_elem = elem_error(out, ref), elem_error(eager, ref)
    limit = max(tol, min(EAGER_ERROR_FACTOR * eager_err, cap))
    elem_limit = max(ELEMENT_FACTOR * tol, min(EAGER_ERROR_FACTOR * eager_elem, ELEMENT_FACTOR * cap))
    bounded = False
    if bound is not None:
        diff = (out.double() - ref.double()).abs()
        scale, peak = bound.double().norm(), bound.double().abs().max()
        bounded = bool(scale > 0 and diff.norm() <= tol * scale and diff.max() <= ELEMENT_FACTOR * tol * peak)
    return Errors(err, eager_err, limit, elem, eager_elem, elem_limit, bounded)


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
                   tol: float | None = None, exact: bool = False, dtypes: tuple = (),
                   eager_cap: float | None = None, eager_cap_reason: str | None = None,
                   bound: torch.Tensor | None = None) -> str | None:
    """None if ``out`` is eager's answer, else what is wrong.

    Shape and dtype must be eager's. Integer and bool results (and ``exact=True``) must equal eager's.
    Floating results: NaN/Inf exactly where eager has them, and on the finite rest, against ``ref`` (higher
    precision, rounded to eager's dtype), norm-wise
    ``‖out − ref‖/‖ref‖ ≤ max(tol, min(EAGER_ERROR_FACTOR · eager's, cap))`` and element-wise
    ``max|out − ref|/max|ref| ≤ max(ELEMENT_FACTOR · tol, min(EAGER_ERROR_FACTOR · eager's,
    ELEMENT_FACTOR · cap))``.
    ``tol`` defaults to :func:`tol_for` and ``cap`` to :func:`cap_for` of eager's dtype and ``dtypes`` (the
    inputs'). A larger ``eager_cap`` needs ``eager_cap_reason``. ``bound``: the magnitude of each element's terms
    (:func:`errors`).
    """
    if eager_cap is not None and not eager_cap_reason:
        raise ValueError(f"{what}: eager_cap={eager_cap} given without eager_cap_reason")
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
    # The reference rounded to the output dtype: the correctly rounded answer, the best any implementation can
    # give. It differs from the unrounded one by half an ulp, except out of the dtype's range: a float32 prod of
    # 125 factors below 1 is 9.5e-57 in float64 and 0 in float32, for eager and for any kernel alike.
    ref = ref.detach().to(eager.device)
    ref = ref.to(eager.dtype).to(ref.dtype)
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
    tol = tol if tol is not None else tol_for(eager.dtype, *dtypes)
    cap = eager_cap if eager_cap is not None else cap_for(eager.dtype, *dtypes)
    if bound is not None:
        bound = bound.detach().to(eager.device)[keep]
    return errors(out[keep], eager[keep], ref[keep], tol=tol, cap=cap, bound=bound).problem(what)


def tree_problems(what: str, out: Any, eager: Any, ref: Any, *, tol: float | None = None,
                  exact: bool = False, **limits) -> list[str]:
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
            p = tensor_problem(name, o, e, r if isinstance(r, torch.Tensor) else None, tol=tol, exact=exact,
                               **limits)
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


# ------------------------------------------------------------------------------------- one function
def _differentiable_outputs(out) -> list[torch.Tensor]:
    return [t for t in tensors(out) if t.dtype.is_floating_point and t.requires_grad]


def _forward_backward(fn, inputs, cotangent_seed: int | None, absolute: bool = False):
    """``fn(*inputs)`` and, with a seed, the gradients of the inputs that require grad under random normal
    cotangents (``absolute``: their absolute values)."""
    out = fn(*inputs)
    if cotangent_seed is None:
        return out, None
    outs = _differentiable_outputs(out)
    wrt = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
    if not outs or not wrt:
        return out, None
    gen = torch.Generator().manual_seed(cotangent_seed)
    cots = [torch.randn(o.shape, generator=gen, dtype=torch.float64) for o in outs]
    cots = [(c.abs() if absolute else c).to(device=o.device, dtype=o.dtype) for c, o in zip(cots, outs)]
    return out, torch.autograd.grad(outs, wrt, cots, allow_unused=True)


def _absolute(inputs: list) -> list:
    return [t.detach().abs().requires_grad_(t.requires_grad)
            if isinstance(t, torch.Tensor) and t.dtype.is_floating_point else t for t in inputs]


def check_function(fn, *inputs, what: str = "fn", strict_mode: bool = True, backward: bool = True,
                   compiled_fn=None, fresh: bool = True, ref_dtype: torch.dtype | None = None,
                   not_fallen_back: tuple[str, ...] = (), magnitude_fn=None, **limits) -> dict:
    """``fn(*inputs)`` compiled (fullgraph, static shapes unless ``compiled_fn`` is given) against eager and a
    reference at higher precision (``ref_dtype``, else float64 / float32 for half inputs): outputs and, with
    ``backward``, the gradient of every input that requires grad under one random cotangent. Strict mode
    unless ``strict_mode=False`` (then ``not_fallen_back`` names ATen ops that still must not have fallen back,
    e.g. the forward's indexing op when only its backward runs in ATen). ``magnitude_fn``: for a multilinear ``fn``
    (the matmul family), ``fn`` with its scalar factors' absolute values; run at the reference's precision on the
    inputs' and cotangents' absolute values it gives each result's sum of term magnitudes, and a result within
    tolerance of that is right for its conditioning (:func:`errors`). Returns tilefuse's counters."""
    seed = int(torch.randint(0, 2**31 - 1, ()).item()) if backward else None
    eager_out, eager_grads = _forward_backward(fn, inputs, seed)
    ref_inputs = upcast(list(inputs), ref_dtype)
    ref_out, ref_grads = _forward_backward(fn, ref_inputs, seed)
    mag_out = mag_grads = None
    if magnitude_fn is not None:
        mag_out, mag_grads = _forward_backward(magnitude_fn, _absolute(ref_inputs), seed, absolute=True)
    if fresh:
        reset()
    cfn = compiled_fn or compiled(fn, fullgraph=True, dynamic=False)
    with (strict() if strict_mode else lenient()):
        out, grads = _forward_backward(cfn, inputs, seed)
    s = stats()
    assert int(s["graphs"]) >= 1, f"{what}: tilefuse compiled no graph"
    fell = [f"{node}: {why}" for node, why in s["fallbacks"] if any(op in str(node) for op in not_fallen_back)]
    assert not fell, f"{what}: fell back to ATen: {fell}"
    input_dtypes = tuple(t.dtype for t in inputs if isinstance(t, torch.Tensor) and t.dtype.is_floating_point)
    limits.setdefault("dtypes", input_dtypes)
    if isinstance(mag_out, torch.Tensor) and isinstance(eager_out, torch.Tensor):
        problems = [p for p in [tensor_problem(f"{what} output", out, eager_out, ref_out, bound=mag_out, **limits)]
                    if p]
    else:
        problems = tree_problems(f"{what} output", out, eager_out, ref_out, **limits)
    if eager_grads is not None:
        assert grads is not None, f"{what}: compiled outputs carry no gradient"
        for i, (g, e, r) in enumerate(zip(grads, eager_grads, ref_grads)):
            if e is None:
                if g is not None and g.count_nonzero() != 0:
                    problems.append(f"{what} grad {i}: eager has none, compiled a non-zero one")
                continue
            bound = mag_grads[i] if mag_grads is not None else None
            p = tensor_problem(f"{what} grad {i}", g, e, r, bound=bound, **limits)
            if p:
                problems.append(p)
    assert not problems, "; ".join(problems)
    return s


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

