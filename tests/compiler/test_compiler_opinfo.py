"""The compiler's op coverage, driven by PyTorch's OpInfo database (``op_db``), for every op in issue 5's scope.

For each op variant and dtype, samples from OpInfo (plus an odd-size, non-contiguous sample of our own for the
op families where one can be built generically) are run through ``torch.compile(..., backend="tilefuse",
fullgraph=True)`` in strict mode (a fallback to ATen raises, so it cannot make a sample pass), forward and,
where the op has a gradient, backward; the results are compared with eager PyTorch and a float64 reference
(float32 for fp16 inputs) by the rules in tests/compiler_checks.py. A sample also fails if tilefuse never saw
the graph, or if a fresh non-empty output was produced with no kernel and no extern call.

Default run (CI: ≤ 4 minutes on 2 cores with -n 2): per op, in fp32 the largest sample forward + backward,
one other sample chosen at random (seeded: replay with TILEFUSE_TEST_SEED) in inference mode, and the odd-size
extra or the non-contiguous form of the largest sample; in fp16 the largest sample forward + backward.
Full run (every sample, fp32 + fp16 + int64, each also non-contiguous): ``--opinfo-full`` (with
``-p tests.opinfo_report``) or ``TILEFUSE_OPINFO_FULL=1``. Either way the per-op pass counts are written as
JSON (tests/opinfo_report.py says where) and printed at the end of the session.

Out of scope and checked for falling back *with a reason*: complex dtypes. Dropout is random, so it is checked
for its law (values 0 or x/(1-p), the drop rate, reproducibility under a seed), not against eager's values.
"""
from __future__ import annotations

import dataclasses
import math
import random
import sys
import traceback
import types
import unittest
from typing import Any, Callable

import pytest
import torch
from torch.utils import _pytree as pytree

from tests import compiler_checks as cc
from tests import opinfo_report
from tests.support import TOLERANCE, noncontiguous

pytest_plugins = ("tests.opinfo_report",)


def _load_op_db():
    # torch.testing._internal.common_utils imports `expecttest` (a test-only PyPI package) for a TestCase base
    # class that OpInfo never uses; the venv does not install it, so a stand-in is enough to import op_db.
    try:
        import expecttest  # noqa: F401
    except ImportError:
        shim = types.ModuleType("expecttest")
        shim.TestCase = unittest.TestCase
        sys.modules["expecttest"] = shim
    from torch.testing._internal.common_methods_invocations import op_db
    from torch.testing._internal.opinfo import core

    return op_db, core


OP_DB, OPINFO = _load_op_db()

# ------------------------------------------------------------------------------------- issue 5's scope
# Every variant of each name is in scope unless listed in OUT_OF_SCOPE_VARIANTS.
SCOPE: dict[str, tuple[str, ...]] = {
    "unary": tuple("""
        abs acos acosh asin asinh atan atanh ceil cos cosh deg2rad erf erfc erfinv exp exp2 expm1 floor frac
        isfinite isinf isnan isneginf isposinf lgamma digamma i0 log log10 log1p log2 logit logical_not bitwise_not
        nan_to_num neg positive rad2deg reciprocal round rsqrt sigmoid sign sgn signbit sin sinc sinh sqrt square
        tan tanh trunc special.entr special.erfcx special.i0e special.i1 special.i1e special.log_ndtr special.ndtr
        special.ndtri""".split()),
    "activation": tuple("""
        nn.functional.relu nn.functional.relu6 nn.functional.gelu nn.functional.silu nn.functional.elu
        nn.functional.celu nn.functional.selu nn.functional.leaky_relu nn.functional.hardtanh
        nn.functional.hardsigmoid nn.functional.hardswish nn.functional.softplus nn.functional.mish
        nn.functional.logsigmoid nn.functional.softsign nn.functional.tanhshrink nn.functional.hardshrink
        nn.functional.softshrink nn.functional.threshold nn.functional.glu""".split()),
    "binary": tuple("""
        add sub mul div true_divide floor_divide remainder fmod pow float_power atan2 maximum minimum fmax fmin
        hypot copysign nextafter logaddexp logaddexp2 rsub xlogy special.xlog1py bitwise_and bitwise_or
        bitwise_xor bitwise_left_shift bitwise_right_shift logical_and logical_or logical_xor lerp addcmul addcdiv
        heaviside ldexp gcd lcm masked_fill where clamp clamp_min clamp_max native_dropout_backward""".split()),
    "comparison": tuple("eq ne lt le gt ge isclose".split()),
    "cast": tuple("bool byte char double float half int long short bfloat16 to".split()),
    "reduction": tuple("""
        sum mean prod amax amin argmax argmin var std var_mean std_mean any all logsumexp nansum max min""".split()),
    "norm": tuple("""
        softmax log_softmax nn.functional.softmin nn.functional.layer_norm native_layer_norm nn.functional.rms_norm
        _softmax_backward_data""".split()),
    "dropout": ("nn.functional.dropout",),
    "view": tuple("""
        view view_as reshape reshape_as flatten unflatten permute transpose t movedim expand expand_as broadcast_to
        narrow select slice squeeze unsqueeze split split_with_sizes chunk unbind cat stack hstack vstack
        contiguous clone""".split()),
}
# max/min: the binary variant is pointwise, the reduction variants reductions.
CATEGORY_OF_VARIANT = {("max", "binary"): "binary", ("min", "binary"): "binary"}
OUT_OF_SCOPE_VARIANTS = {("nn.functional.silu", "complex")}  # complex: test_complex_falls_back_with_reason
OPTIONAL_NAMES = {"nn.functional.rms_norm"}  # only in op_db from torch 2.4 on
EXACT_CATEGORIES = {"cast", "view", "comparison"}  # results must equal eager's bit for bit
# Categories whose ops return views of their input in eager as part of their contract (a view op, or a cast to
# the input's own dtype), so the compiled output must be the same view. Elsewhere an eager alias is an
# implementation detail (dropout with training=False returns its input; torch's own AOTAutograd returns a copy).
VIEW_CATEGORIES = {"cast", "view"}

CATEGORY_OF_NAME = {name: cat for cat, names in SCOPE.items() for name in names}


# Samples whose eager result is so far from the float64 reference that the capped eager-error allowance
# (compiler_checks.EAGER_ERROR_CAP) is too tight for any implementation: (op key, dtype, sample label) ->
# (cap, why). Each entry names its numbers; nothing else may exceed the cap. None is needed today: the one
# sample that exceeded it (prod of 125 float32 factors below 1, 9.5e-57 in float64) underflows to 0, which the
# reference rounded to float32 also is (compiler_checks.tensor_problem).
EAGER_CAP_EXEMPTIONS: dict[tuple[str, str, str], tuple[float, str]] = {}

# OpInfo wraps dropout in wrapper_set_seed (it reseeds the generator before each call, for its own tests):
# Dynamo cannot trace that, and a reseed would hide a compiler that ignores the generator's state.
CALLABLE_OVERRIDES = {"nn.functional.dropout": torch.nn.functional.dropout}


def op_callable(op):
    return CALLABLE_OVERRIDES.get(op.name, op.op)


def op_key(op) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def _scope_ops() -> dict[str, tuple[Any, str]]:
    found = {}
    for op in OP_DB:
        if op.name in CATEGORY_OF_NAME and (op.name, op.variant_test_name) not in OUT_OF_SCOPE_VARIANTS:
            cat = CATEGORY_OF_VARIANT.get((op.name, op.variant_test_name), CATEGORY_OF_NAME[op.name])
            found[op_key(op)] = (op, cat)
    return found


OPS = _scope_ops()

# Samples per op in the default run (see the module docstring); the full run takes all of them.
DEFAULT_RANDOM_INFERENCE_SAMPLES = 1
ODD_ROWS, ODD_COLS, LONG_ROW = 7, 129, 1000  # odd sizes: not a multiple of any block, one row longer than a block

DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.int64: "int64", torch.int32: "int32",
               torch.bool: "bool", torch.uint8: "uint8"}


def _dtypes(op, full: bool) -> list[torch.dtype]:
    supported = op.supported_dtypes("cpu")
    chosen = []
    if torch.float32 in supported:
        chosen.append(torch.float32)
        if torch.float16 in supported:
            chosen.append(torch.float16)
        if full and torch.int64 in supported:
            chosen.append(torch.int64)
    else:  # integer-only ops (bitwise, gcd/lcm)
        chosen.extend([d for d in (torch.int64, torch.int32, torch.bool) if d in supported][:1])
    return chosen


def pytest_generate_tests(metafunc):
    if "opinfo_case" not in metafunc.fixturenames:
        return
    full = opinfo_report.full_mode(metafunc.config)
    params, ids = [], []
    for key, (op, _cat) in sorted(OPS.items()):
        for dtype in _dtypes(op, full):
            params.append((key, dtype))
            ids.append(f"{key}-{DTYPE_NAMES[dtype]}")
    metafunc.parametrize("opinfo_case", params, ids=ids)


# --------------------------------------------------------------------------------------- the report
_RESULTS: dict[str, dict] = {}


@pytest.fixture(scope="session")
def opinfo_results(request):
    yield _RESULTS
    if not _RESULTS:
        return
    import triton

    meta = {"mode": "full" if opinfo_report.full_mode(request.config) else "default", "torch": torch.__version__,
            "triton": triton.__version__, "scope": {c: len(n) for c, n in SCOPE.items()}}
    opinfo_report.write(request.config, _RESULTS, meta)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


# ------------------------------------------------------------------------------------------ samples
@dataclasses.dataclass
class Case:
    label: str  # "opinfo#3", "opinfo#3 noncontiguous", "odd (7, 129) noncontiguous"
    source: str  # "opinfo" | "extra"
    sample: Any  # an OpInfo SampleInput
    train: bool  # forward + backward (else inference: no input requires grad)


def _numel(sample) -> int:
    return sum(t.numel() for t in cc.tensors((sample.input, sample.args, sample.kwargs)))


def _differentiable(op, dtype) -> bool:
    return bool(op.supports_autograd) and dtype.is_floating_point


def _make(shape, dtype, *, low=None, high=None, exclude_zero=False, grad=False, noncontig=True, **_ignored):
    t = torch.testing.make_tensor(shape, dtype=dtype, device="cpu", low=low, high=high, exclude_zero=exclude_zero)
    if noncontig and len(shape) >= 1 and t.numel() > 1:
        t = noncontiguous(t)  # every other column of a NaN-poisoned buffer: a read of the gap shows up
    return t.requires_grad_(grad) if dtype.is_floating_point else t


def _domain_kwargs(op, dtype) -> dict:
    low, high = getattr(op, "domain", (None, None))
    if not dtype.is_floating_point:
        return {}
    return {"low": low, "high": high}


def extra_samples(op, category: str, dtype, grad: bool) -> list[tuple[str, Any]]:
    """Odd-size, non-contiguous samples for op families whose calling convention we know generically."""
    SI = OPINFO.SampleInput
    R, C, L = ODD_ROWS, ODD_COLS, LONG_ROW
    name = op.name
    out = []
    if isinstance(op, OPINFO.UnaryUfuncInfo):
        x = _make((R, C), dtype, grad=grad, **_domain_kwargs(op, dtype))
        kwargs = op.sample_kwargs("cpu", dtype, x)[0] if hasattr(op, "sample_kwargs") else {}
        out.append((f"odd ({R}, {C}) noncontiguous", SI(x, kwargs=kwargs)))
    elif isinstance(op, OPINFO.BinaryUfuncInfo) and name != "native_dropout_backward":
        lhs_kw = dict(getattr(op, "lhs_make_tensor_kwargs", {}) or {})
        rhs_kw = dict(getattr(op, "rhs_make_tensor_kwargs", {}) or {})
        a = _make((R, C), dtype, grad=grad, **lhs_kw)
        b = _make((C,), dtype, grad=grad, noncontig=False, **rhs_kw)
        out.append((f"odd ({R}, {C}) noncontiguous op ({C},) broadcast", SI(a, args=(b,))))
    elif category == "activation":
        shape = (R, C + 1) if name == "nn.functional.glu" else (R, C)
        x = _make(shape, dtype, grad=grad)
        args = (0.5, -1.0) if name == "nn.functional.threshold" else ()
        out.append((f"odd {shape} noncontiguous", SI(x, args=args)))
    elif category == "reduction" and dtype.is_floating_point:
        x = _make((R, L), dtype, grad=grad, low=0.9 if name == "prod" else None, high=1.1 if name == "prod" else None)
        if name in ("any", "all"):
            with torch.no_grad():
                x.masked_fill_(x.abs() < 3, 0.0)
                x[0].fill_(1.0)  # one row all non-zero, so all() is not False everywhere
        if name == "nansum":
            with torch.no_grad():
                x[:, ::7] = float("nan")
        label = f"odd ({R}, {L}) noncontiguous, dim=-1"
        if name == "logsumexp":
            out.append((label, SI(x, args=((-1,), False))))
        elif op.variant_test_name == "reduction_no_dim":
            out.append((f"odd ({R}, {L}) noncontiguous, all dims", SI(x)))
        elif op.variant_test_name == "unbiased":
            out.append((label, SI(x, args=(True,))))
        else:
            out.append((label, SI(x, kwargs={"dim": -1})))
    elif category == "norm" and dtype.is_floating_point:
        x = _make((R, L), dtype, grad=grad)
        w = _make((L,), dtype, grad=grad, noncontig=False)
        b = _make((L,), dtype, grad=grad, noncontig=False)
        label = f"odd ({R}, {L}) noncontiguous, last dim"
        if name in ("softmax", "log_softmax", "nn.functional.softmin"):
            kwargs = {"dtype": torch.float64} if op.variant_test_name == "with_dtype" else {}
            out.append((label, SI(x, args=(-1,), kwargs=kwargs)))
        elif name == "nn.functional.layer_norm":
            out.append((label, SI(x, args=((L,), w, b), kwargs={"eps": 1e-5})))
        elif name == "nn.functional.rms_norm":
            out.append((label, SI(x, args=((L,), w), kwargs={"eps": 1e-6})))
        elif name == "native_layer_norm":
            out.append((label, SI(x, args=([L], w, b, 1e-5))))
    elif category == "view":
        x = _make((R, C), dtype, grad=grad)
        builders: dict[str, Callable[[], Any]] = {
            "cat": lambda: SI([x, _make((R, 1), dtype, grad=grad)], args=(-1,)),
            "transpose": lambda: SI(x, args=(0, 1)),
            "permute": lambda: SI(x, args=((1, 0),)),
            "reshape": lambda: SI(x, args=((C, R),)),  # non-contiguous: a copy, not a view
            "expand": lambda: SI(_make((1, C), dtype, grad=grad), args=((R, C),)),
            "select": lambda: SI(x, args=(1, C - 1)),
            "narrow": lambda: SI(x, args=(1, 3, C - 3)),
            "clone": lambda: SI(x),
            "contiguous": lambda: SI(x),
        }
        if name in builders:
            out.append((f"odd ({R}, {C}) noncontiguous", builders[name]()))
    return out


def select_cases(op, category: str, dtype, full: bool, rng: random.Random) -> tuple[list[Case], int]:
    """The samples to run, and how many OpInfo samples there are for this op and dtype."""
    grad = _differentiable(op, dtype)
    train_samples = list(op.sample_inputs("cpu", dtype, requires_grad=grad))
    n = len(train_samples)
    if n == 0:
        return [], 0
    extras = extra_samples(op, category, dtype, grad)
    if full:
        cases = [Case(f"opinfo#{i}", "opinfo", s, grad) for i, s in enumerate(train_samples)]
        cases += [Case(f"opinfo#{i} noncontiguous", "opinfo", s.noncontiguous(), grad)
                  for i, s in enumerate(train_samples)]
        if grad:
            inference = list(op.sample_inputs("cpu", dtype, requires_grad=False))
            cases += [Case(f"opinfo#{i} inference", "opinfo", s, False) for i, s in enumerate(inference)]
        cases += [Case(label, "extra", s, grad) for label, s in extras]
        return cases, n
    largest = max(range(n), key=lambda i: (_numel(train_samples[i]), -i))
    cases = [Case(f"opinfo#{largest}", "opinfo", train_samples[largest], grad)]
    if dtype in cc.HALF_TYPES:
        return cases, n
    others = [i for i in range(n) if i != largest]
    if others:
        inference = list(op.sample_inputs("cpu", dtype, requires_grad=False))
        for i in rng.sample(others, min(DEFAULT_RANDOM_INFERENCE_SAMPLES, len(others))):
            if i < len(inference):
                cases.append(Case(f"opinfo#{i} inference", "opinfo", inference[i], False))
    if extras:
        label, s = extras[0]
        cases.append(Case(label, "extra", s, grad))
    else:
        cases.append(Case(f"opinfo#{largest} noncontiguous", "opinfo", train_samples[largest].noncontiguous(), grad))
    return cases, n


# ------------------------------------------------------------------------------------------ running
def _call(fn):
    def call(inp, args, kwargs):
        return fn(inp, *args, **kwargs)

    return call


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    # Dynamo wraps backend errors; the backend's own message is the interesting part.
    cause = exc.__cause__ or exc.__context__
    if cause is not None and type(exc).__name__ in ("BackendCompilerFailed", "InternalTorchDynamoError"):
        return _first_line(cause)
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"[:300]


def _grad_targets(outputs, sample) -> list[torch.Tensor]:
    processed = sample.output_process_fn_grad(outputs) if sample.output_process_fn_grad else outputs
    return [t for t in cc.tensors(processed) if t.dtype.is_floating_point and t.requires_grad]


def _grads(outputs, inputs, sample, cotangents):
    targets = _grad_targets(outputs, sample)
    if not targets or not inputs:
        return None
    return torch.autograd.grad(targets, inputs, cotangents[:len(targets)], allow_unused=True)


def _grad_problems(got, eager, ref, tol, **limits) -> list[str]:
    problems = []
    for i, (g, e, r) in enumerate(zip(got, eager, ref)):
        if e is None:
            if g is not None and g.count_nonzero() != 0:
                problems.append(f"grad[{i}]: eager has no gradient, compiled gives a non-zero one")
            continue
        if g is None:
            problems.append(f"grad[{i}]: compiled gives no gradient, eager does")
            continue
        p = cc.tensor_problem(f"grad[{i}]", g, e, r, tol=tol, **limits)
        if p:
            problems.append(p)
    return problems


def _fresh_outputs(eager_out, inputs) -> bool:
    """Some output is a new, non-empty tensor (not a view of an input), made from non-empty inputs."""
    if not any(t.numel() > 0 for t in inputs):
        return False
    return any(t.numel() > 0 and cc.aliases(t, inputs) is None for t in cc.tensors(eager_out))


def _reference(fn, sample, tree, dtype, with_grads: bool, cotangents):
    """(output, grads) at reference precision, or (None, None) where the op cannot run there (then the check is
    against eager alone, exactly). Ops that take the input's dtype as an argument (``_softmax_backward_data``'s
    ``input_dtype``) reject upcast tensors with the original dtype, so that dtype is upcast with them: the
    reference is the same computation at higher precision, not no reference at all. (Without it fp16
    ``_softmax_backward_data`` was compared bit for bit with eager's CPU kernel, which no other implementation
    reproduces: it computes ``out * (g - sum(g * out))`` with a vectorised sum whose order depends on the
    vector ISA, where torch's decomposition and eager CUDA compute ``g * out - out * sum(g * out)``; both in
    fp32 with one rounding to fp16, as the compiled kernel does, and 2 of 250 fp16 results differ by an ulp.)"""
    for ref_tree in (cc.upcast(tree), cc.upcast_dtype_args(cc.upcast(tree), dtype)):
        try:
            ref_out = fn(*ref_tree)
            ref_grads = None
            if with_grads:
                r_inputs = [t for t in cc.tensors(ref_tree) if t.requires_grad]
                r_cot = [c.to(r.dtype) for c, r in zip(cotangents, _grad_targets(ref_out, sample))]
                ref_grads = _grads(ref_out, r_inputs, sample, r_cot)
            return ref_out, ref_grads
        except Exception:
            continue
    return None, None


def run_case(op, category: str, case: Case, dtype) -> tuple[str, str]:
    """(outcome, why): outcome is pass | fail | untested | eager-error."""
    sample, fn = case.sample, _call(op_callable(op))
    inp, args, kwargs = sample.input, tuple(sample.args), dict(sample.kwargs)
    inputs = cc.tensors((inp, args, kwargs))
    grad_inputs = [t for t in inputs if t.requires_grad] if case.train else []
    try:
        eager_out = fn(inp, args, kwargs)
    except Exception as exc:  # an invalid sample for this dtype: not the compiler's business
        return "eager-error", _first_line(exc)
    exact = category in EXACT_CATEGORIES
    ref_out = ref_grads = eager_grads = None
    cotangents = [torch.randn_like(t) for t in _grad_targets(eager_out, sample)] if grad_inputs else []
    if grad_inputs and cotangents:
        try:
            eager_grads = _grads(eager_out, grad_inputs, sample, cotangents)
        except Exception:  # eager has no backward for this dtype (e.g. i1e in fp16): check the forward only
            detached = sample.transform(lambda t: t.detach() if isinstance(t, torch.Tensor) else t)
            return run_case(op, category, Case(case.label + " (eager has no backward: fwd only)", case.source,
                                               detached, False), dtype)
    ref_out, ref_grads = _reference(fn, sample, (inp, args, kwargs), dtype, eager_grads is not None, cotangents)
    tol = cc.tol_for(dtype, *[t.dtype for t in cc.tensors(eager_out)])
    limits = {"dtypes": (dtype, *[t.dtype for t in cc.tensors(eager_out)])}
    exemption = EAGER_CAP_EXEMPTIONS.get((op_key(op), DTYPE_NAMES.get(dtype), case.label))
    if exemption is not None:
        limits.update(eager_cap=exemption[0], eager_cap_reason=exemption[1])

    cc.reset()
    graphs_before = cc.dynamo_graphs()
    try:
        with cc.strict():
            compiled_fn = cc.compiled(fn, fullgraph=True, dynamic=False)
            out = compiled_fn(inp, args, kwargs)
            got_grads = _grads(out, grad_inputs, sample, cotangents) if eager_grads is not None else None
    except Exception as exc:
        return "fail", _first_line(exc)
    run = cc.Run(cc.stats(), cc.dynamo_graphs() - graphs_before)
    if run.dynamo_graphs == 0:
        return "untested", "Dynamo produced no graph for this sample"
    problems = []
    if int(run.stats["graphs"]) == 0:
        problems.append(f"tilefuse compiled no graph although Dynamo made {run.dynamo_graphs}")
    if run.stats["fallbacks"]:
        problems.append(f"fell back to ATen in strict mode: {run.stats['fallbacks']}")
    if run.work == 0 and _fresh_outputs(eager_out, inputs):
        problems.append("a fresh output appeared with no kernel and no extern call (is the graph run eagerly?)")
    problems += cc.tree_problems("out", out, eager_out, None if exact else ref_out, tol=tol, exact=exact, **limits)
    problems += cc.alias_problems("out", out, eager_out, inputs, require_views=category in VIEW_CATEGORIES)
    if eager_grads is not None and got_grads is None:
        problems.append("compiled outputs carry no gradient (eager's do)")
    elif eager_grads is not None:
        ref_g = ref_grads if ref_grads is not None else [None] * len(eager_grads)
        problems += _grad_problems(got_grads, eager_grads, ref_g, cc.tol_for(dtype), **limits)
    return ("fail", "; ".join(problems)) if problems else ("pass", "")


# ----------------------------------------------------------------------------------- dropout's law
DROPOUT_REL_TOL = {torch.float32: 1e-6, torch.float16: 1e-3}  # x * (1/(1-p)) vs x / (1-p): a rounding or two


def run_dropout_case(op, case: Case, dtype) -> tuple[str, str]:
    """Dropout: deterministic settings must equal eager; random ones must follow dropout's law and replay
    exactly under the same seed (Philox), and the gradient must use the same mask as the forward."""
    sample = case.sample
    x = sample.input
    p = float(sample.kwargs.get("p", 0.5))
    training = bool(sample.kwargs.get("training", True))
    if not training or p in (0.0, 1.0) or x.numel() == 0:
        return run_case(op, "dropout", case, dtype)
    fn = _call(op_callable(op))
    cc.reset()
    graphs_before = cc.dynamo_graphs()
    seed = random.randrange(1, 2**31)
    try:
        with cc.strict():
            compiled_fn = cc.compiled(fn, fullgraph=True, dynamic=False)
            torch.manual_seed(seed)
            out1 = compiled_fn(x, (), dict(sample.kwargs))
            torch.manual_seed(seed)
            out2 = compiled_fn(x, (), dict(sample.kwargs))
            grad = None
            if case.train and x.requires_grad:
                g = torch.randn_like(out1)
                (grad,) = torch.autograd.grad(out1, [x], [g])
    except Exception as exc:
        return "fail", _first_line(exc)
    run = cc.Run(cc.stats(), cc.dynamo_graphs() - graphs_before)
    problems = []
    if int(run.stats["graphs"]) == 0:
        problems.append("tilefuse compiled no graph")
    if out1.shape != x.shape or out1.dtype != x.dtype:
        problems.append(f"shape/dtype {tuple(out1.shape)}/{out1.dtype} != input's {tuple(x.shape)}/{x.dtype}")
        return "fail", "; ".join(problems)
    if not torch.equal(out1, out2):
        problems.append("two calls after torch.manual_seed(same seed) gave different outputs")
    scaled = x.detach() / (1 - p)
    kept = out1 != 0
    close = torch.isclose(out1.detach(), scaled, rtol=DROPOUT_REL_TOL[dtype], atol=0)
    if not bool((close | ~kept).all()):
        problems.append(f"{int((~close & kept).sum())} kept elements are not x/(1-p)")
    if grad is not None:
        expect = torch.where(kept, g / (1 - p), torch.zeros_like(g))
        known = x.detach() != 0  # where x is 0 the mask cannot be read from the output
        if not torch.allclose(grad[known], expect[known], rtol=DROPOUT_REL_TOL[dtype], atol=0):
            problems.append("gradient does not use the forward's mask and 1/(1-p) scale")
    return ("fail", "; ".join(problems)) if problems else ("pass", "")


# --------------------------------------------------------------------------------------------- tests
def test_scope_is_in_op_db():
    """Every op named in the scope resolves in this torch's op_db, so the suite cannot shrink silently."""
    names = {op.name for op in OP_DB}
    missing = [n for names_ in SCOPE.values() for n in names_ if n not in names and n not in OPTIONAL_NAMES]
    assert not missing, f"scope ops not in torch {torch.__version__}'s op_db: {missing}"
    assert len(OPS) >= 200, f"only {len(OPS)} op variants in scope"


def test_opinfo(opinfo_case, opinfo_results, request):
    key, dtype = opinfo_case
    op, category = OPS[key]
    full = opinfo_report.full_mode(request.config)
    cases, available = select_cases(op, category, dtype, full, random.Random(random.getrandbits(32)))
    assert cases, f"{key}: OpInfo gave no {dtype} sample"
    entries = []
    for case in cases:
        try:
            if category == "dropout":
                outcome, why = run_dropout_case(op, case, dtype)
            else:
                outcome, why = run_case(op, category, case, dtype)
        except Exception as exc:  # a bug in checking: still the sample's failure, with where it came from
            outcome, why = "fail", f"checking raised {_first_line(exc)}: " + \
                "".join(traceback.format_exception(exc)[-2:]).strip()[:300]
        entries.append({"sample": case.label, "source": case.source, "train": case.train,
                        "outcome": outcome, "why": why})
    per_op = _RESULTS.setdefault(key, {"category": category, "dtypes": {}})
    per_op["dtypes"][DTYPE_NAMES[dtype]] = {"available_opinfo_samples": available, "samples": entries}
    failed = [e for e in entries if e["outcome"] == "fail"]
    passed = [e for e in entries if e["outcome"] == "pass"]
    assert passed or failed, f"{key} {dtype}: no sample could be run: {entries}"
    assert not failed, f"{key} {dtype}: {len(failed)} of {len(passed) + len(failed)} samples fail:\n" + \
        "\n".join(f"  {e['sample']} ({'fwd+bwd' if e['train'] else 'fwd'}): {e['why']}" for e in failed)


def test_dropout_statistics():
    """On a large tensor the drop rate is p within 6 sigma, different seeds give different masks, successive
    calls advance the generator (as eager does) and the same seed replays the same mask."""
    import torch.nn.functional as F

    n, p = 64 * ODD_COLS, 0.3
    x = torch.randn(64, ODD_COLS).abs_() + 0.5  # no zeros: a zero in the output is a drop
    cc.reset()

    def f(t):
        return F.dropout(t, p=p, training=True)

    with cc.strict():
        g = cc.compiled(f, fullgraph=True, dynamic=False)
        torch.manual_seed(1234)
        a = g(x)
        b = g(x)
        torch.manual_seed(1234)
        a2 = g(x)
        torch.manual_seed(4321)
        c = g(x)
    assert int(cc.stats()["graphs"]) >= 1, "tilefuse compiled no graph"
    rate = float((a == 0).double().mean())
    sigma = math.sqrt(p * (1 - p) / n)
    assert abs(rate - p) <= 6 * sigma, f"drop rate {rate:.4f}, expected {p} ± {6 * sigma:.4f}"
    assert torch.equal(a, a2), "the same seed did not replay the same mask"
    assert not torch.equal(a == 0, b == 0), "a second call without reseeding reused the mask"
    assert not torch.equal(a == 0, c == 0), "a different seed gave the same mask"
    # neighbouring elements are not correlated (a broken Philox offset repeats masks along rows)
    rows_equal = sum(torch.equal(a[i] == 0, a[i + 1] == 0) for i in range(a.shape[0] - 1))
    assert rows_equal == 0, f"{rows_equal} consecutive rows share a dropout mask"


def test_complex_falls_back_with_reason(capfd):
    """Complex is out of scope: outside strict mode the backend falls back to ATen, says why, and the answer is
    eager's; in strict mode it raises instead of answering."""
    from tilefuse import config

    op = next(o for o in OP_DB if o.name == "nn.functional.silu" and o.variant_test_name == "complex")
    samples = [s for s in op.sample_inputs("cpu", torch.complex64) if s.input.numel() > 1]
    assert samples, "OpInfo gave no complex silu sample"
    sample = samples[0]
    fn = _call(op.op)
    expected = fn(sample.input, tuple(sample.args), dict(sample.kwargs))
    cc.reset()
    with cc.lenient(), config.override(debug=1):
        out = cc.compiled(fn, dynamic=False)(sample.input, tuple(sample.args), dict(sample.kwargs))
    cc.assert_matches("complex silu", out, expected)
    s = cc.stats()
    assert s["fallbacks"], "a complex input ran without a recorded fallback"
    reasons = " ".join(str(r) for _node, r in s["fallbacks"])
    assert "complex" in reasons.lower(), f"fallback reason does not name the complex dtype: {s['fallbacks']}"
    err = capfd.readouterr().err
    assert "[tilefuse]" in err and "fallback" in err.lower(), f"TILEFUSE_DEBUG=1 did not report the fallback: {err[-2000:]!r}"

    torch._dynamo.reset()
    with cc.strict(), pytest.raises(Exception, match="(?i)complex"):
        cc.compiled(fn, dynamic=False)(sample.input, tuple(sample.args), dict(sample.kwargs))
