"""The float32 erfc of tilefuse.kernels.special against float64 math.erfc, and what uses it: the exact GeLU
of the GEMM epilogue and the compiler's ``1 + erf(u)`` rewrite."""
import math
import re

import pytest
import torch
import triton
import triton.language as tl

from tilefuse import device
from tilefuse.kernels import special

DEV = device.torch_device()


@triton.jit
def _elementwise_kernel(x_ptr, y_ptr, n, FN: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    tl.store(y_ptr + offs, FN(x), mask=mask)


def _apply(fn, x: torch.Tensor) -> torch.Tensor:
    """The @triton.jit helper ``fn`` over x in one kernel, into a poisoned output."""
    y = torch.full_like(x, float("nan"))
    _elementwise_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), FN=fn, BLOCK=1024)
    return y


def _erfc(x: torch.Tensor) -> torch.Tensor:
    return _apply(special.erfc_f32, x)


def _reference(x: torch.Tensor) -> torch.Tensor:
    return torch.tensor([math.erfc(v) for v in x.double().tolist()], dtype=torch.float64)


@pytest.mark.parametrize("lo, hi, bound", [(0.0, 2.0, 1.5e-6), (2.0, 4.0, 4e-6), (4.0, 9.0, 3e-5)])
def test_erfc_relative_error_on_a_dense_grid(lo, hi, bound):
    """Both signs: erfc(-z) = 2 - erfc(z). The bounds are those the module states, with room for the GPU's
    approximate reciprocal and exp (2 ulp each)."""
    z = torch.linspace(lo, hi, 20001, dtype=torch.float32)
    z = z + (torch.rand_like(z) - 0.5) * (hi - lo) / 20000  # fresh points between the grid's
    x = torch.cat([z, -z]).to(DEV)
    got = _erfc(x).cpu().double()
    ref = _reference(x.cpu())
    rel = ((got - ref).abs() / ref).max().item()
    assert rel <= bound, f"erfc on +-[{lo}, {hi}]: max relative error {rel:.3g} > {bound:.3g}"


def test_erfc_special_values():
    x = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 30.0, -30.0], device=DEV)
    got = _erfc(x).cpu()
    assert abs(got[0].item() - 1.0) <= 2e-7 and abs(got[1].item() - 1.0) <= 2e-7
    assert got[2].item() == 0.0 and got[3].item() == 2.0
    assert math.isnan(got[4].item())
    assert got[5].item() == 0.0 and got[6].item() == 2.0


def test_gelu_negative_tail_has_relative_accuracy():
    """gelu(x) = x * erfc(-x/sqrt2) / 2 keeps its digits where torch's 0.5 x (1 + erf(x/sqrt2)) cancels."""
    x = torch.linspace(-9.0, -3.0, 4001, dtype=torch.float32)
    got = (0.5 * x.double() * _erfc((-x * 0.7071067811865476).to(DEV)).cpu().double())
    ref = torch.tensor([0.5 * v * math.erfc(-v / math.sqrt(2)) for v in x.double().tolist()], dtype=torch.float64)
    rel = ((got - ref).abs() / ref.abs()).max().item()
    assert rel < 3e-5, rel
    eager = torch.nn.functional.gelu(x).double()
    eager_rel = ((eager - ref).abs() / ref.abs()).max().item()
    assert eager_rel > 1e-2  # what the rewrite fixes: eager's tail is off by more than a percent


def test_both_texts_are_one_function():
    """The portable and the GPU text differ only in the reciprocal and the exp."""
    port = special.erfc_f32_source("f", "f_poly", interpreter=True)
    fast = special.erfc_f32_source("f", "f_poly", interpreter=False)
    assert "f_poly(t, 1.0)" in port and "f_poly(t, 1.0)" in fast and "erfc_poly" not in port + fast
    assert port.startswith("def f(x):") and fast.startswith("def f(x):")
    strip = [ln.strip() for ln in port.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    strip_fast = [ln.strip() for ln in fast.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    differ = [(a, b) for a, b in zip(strip, strip_fast) if a != b]
    assert len(strip) == len(strip_fast) and len(differ) == 2, differ
    assert "libdevice.fast_dividef" in differ[0][1] and "tl.exp2(x * x * -1.44269504" in differ[1][1]


def test_the_cuda_ladders_gelu_uses_the_same_fit():
    """tilefuse/cuda/ladder/gelu_erfc.cuh (the Hopper rungs' GeLU) is this module's degree-8 erfc fit written in C++: the
    same nine coefficients, the same 0.4 / sqrt 2 scale and -log2(e) / 2 exponent, and no libdevice erff."""
    import inspect
    from pathlib import Path

    number = r"-?\d+\.\d+(?:e-?\d+)?"
    py_src = inspect.getsource(special.erfc_poly.fn)
    py = [float(c) for c in re.findall(rf"q = ({number}) \* H\n", py_src)]
    py += [float(sign + c) for sign, c in re.findall(rf"q \* t ([-+]) ({number}) \* H", py_src)]
    cu = (Path(special.__file__).parents[1] / "cuda" / "ladder" / "gelu_erfc.cuh").read_text()
    body = cu[cu.index("gelu_erfc(float x)"):]
    coeffs = [float(a or b) for a, b in re.findall(rf"float q = ({number})f;|fmaf\(q, t, ({number})f\)", body)]
    assert len(py) == 9 and coeffs == py, (coeffs, py)
    assert "fmaf(0.28284271247461906f, fabsf(x), 1.0f)" in body and 0.28284271247461906 == pytest.approx(0.4 / math.sqrt(2))
    assert "-0.7213475204444817f" in body and 0.7213475204444817 == pytest.approx(0.5 / math.log(2))
    assert "erff" not in body


# ------------------------------------------------------------------------------ the compiler's rewrite
def _compiled_sources(fn, *args) -> tuple[object, str]:
    from tilefuse.compiler.explain import explain

    from tests.compiler_checks import kernel_sources, reset, strict
    reset()
    with strict():
        ex = explain(fn, *args)
    text = "\n".join(kernel_sources(ex))
    torch._dynamo.reset()
    return ex.result, text


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_gelu_writes_erfc_and_keeps_the_tail(dtype):
    from tests.support import noncontiguous
    x = noncontiguous(torch.linspace(-9, 4, 3000).reshape(30, 100).to(dtype).to(DEV))
    got, text = _compiled_sources(torch.nn.functional.gelu, x)
    got, x = got.cpu(), x.cpu()
    # the GeLU's erfc(-x / sqrt 2) straight from x (no multiply by 1/sqrt 2 first), its 0.5 in the erfc's
    # polynomial (no multiply by 0.5 either)
    assert "_tf_erfc_f32(" in text and ", 0.28284271247461906, 0.5)" in text and "tl.erf(" not in text \
        and "* 0.5)" not in text \
        and "0.7071067811865476" not in text
    ref = torch.tensor([0.5 * v * math.erfc(-v / math.sqrt(2)) for v in x.double().flatten().tolist()],
                       dtype=torch.float64).reshape(x.shape)
    rel = ((got.double() - ref).abs() / ref.abs()).max().item()
    # float32: 3e-5 at worst in the far tail (the module's bound); bfloat16: its own rounding (2^-8)
    assert rel < (3e-5 if dtype == torch.float32 else 2 ** -8), rel


def test_compiled_gelu_backward_and_one_minus_erf():
    x = torch.linspace(-7, 5, 2400, dtype=torch.float32, device=DEV).reshape(24, 100).requires_grad_()

    def fn(t):
        return torch.nn.functional.gelu(t).sum() + (1 - torch.erf(t * 0.5)).sum()
    from tests.compiler_checks import reset, strict
    reset()
    with strict():
        loss = torch.compile(fn, backend="tilefuse")(x)
        loss.backward()
    torch._dynamo.reset()
    xd = x.detach().cpu().double().requires_grad_()
    want = fn(xd)
    want.backward()
    assert abs(loss.item() - want.item()) <= 1e-5 * abs(want.item())
    err = ((x.grad.cpu().double() - xd.grad).abs() / xd.grad.abs().clamp(min=1e-30)).max().item()
    assert err < 1e-4, err  # torch's own float32 gelu backward is off by far more in the negative tail


def test_float64_keeps_libdevice_erf_and_erfc_op_uses_the_fast_form():
    x = torch.linspace(-3, 3, 500, dtype=torch.float64, device=DEV)
    got, text = _compiled_sources(lambda t: torch.nn.functional.gelu(t), x)
    assert "tl.erf(" in text and "_tf_erfc" not in text
    assert torch.allclose(got, torch.nn.functional.gelu(x), rtol=1e-12, atol=1e-15)
    y = torch.linspace(-5, 9, 700, dtype=torch.float32, device=DEV)
    got, text = _compiled_sources(torch.special.erfc, y)
    assert "_tf_erfc_f32(" in text
    ref = _reference(y.cpu())
    rel = ((got.cpu().double() - ref).abs() / ref).max().item()
    assert rel < 3e-5, rel



# ------------------------------------------------------------------ the half-precision polynomial
@triton.jit
def _erfc_half(z):
    return special.erfc_poly_half(1.0 / (1.0 + 0.4 * z), 1.0) * tl.exp(-z * z)


@pytest.mark.parametrize("lo, hi, bound", [(0.0, 4.0, 1e-5), (4.0, 9.0, 4e-5)])
def test_half_polynomial_error_is_far_below_float16_rounding(lo, hi, bound):
    """The degree-6 polynomial (kernels whose outputs computed from it are all half types): about 6e-6
    relative (the fit), against float16's half-ulp of 4.9e-4."""
    z = torch.linspace(lo, hi, 20001, dtype=torch.float32)
    z = (z + (torch.rand_like(z) - 0.5) * (hi - lo) / 20000).clamp(min=0).to(DEV)
    y = _apply(_erfc_half, z)
    rel = ((y.cpu().double() - _reference(z.cpu())).abs() / _reference(z.cpu())).max().item()
    assert rel <= bound, rel


@pytest.mark.parametrize("dtype, out, upcast, degree6", [(torch.float16, None, False, True),
                                                         (torch.float32, None, False, False),
                                                         (torch.float16, torch.float32, False, True),
                                                         (torch.float16, None, True, False),
                                                         (torch.float32, torch.float16, False, True)])
def test_half_kernels_take_the_half_polynomial(dtype, out, upcast, degree6):
    """A kernel whose values computed from the erf are all rounded to a half type before an output writes
    the degree-6 polynomial, whatever its inputs: a float16 GeLU widened to float32 is a float16 value. A
    float32 output that takes the erf's value unrounded (a GeLU of float32 values, or of float16 ones upcast
    first) keeps degree 8. Each result matches float64 to its output's rounding."""
    from tests.support import noncontiguous
    first6 = repr(-0.18153536319732666)
    x = noncontiguous(torch.linspace(-7, 4, 2000).reshape(20, 100).to(dtype).to(DEV))

    def fn(t):
        y = torch.nn.functional.gelu(t.float() if upcast else t)
        return y if out is None else y.to(out)
    got, text = _compiled_sources(fn, x)
    assert "_tf_erfc_f32(" in text and ", 0.28284271247461906, 0.5)" in text
    assert (first6 in text) == degree6, text
    ref = torch.tensor([0.5 * v * math.erfc(-v / math.sqrt(2)) for v in x.cpu().double().flatten().tolist()],
                       dtype=torch.float64).reshape(x.shape)
    # a float16 gelu is rounded to float16 (2^-11) before any cast, as eager's is; float32: the module's
    # bound. Normal range only (a float16 gelu below -5 is subnormal: absolute error)
    normal = ref.abs() > 6.2e-5
    rel = ((got.cpu().double() - ref).abs() / ref.abs())[normal].max().item()
    assert rel < (2 ** -10 if torch.float16 in (dtype, out) and not upcast else 1e-4), rel


def test_float32_statistics_beside_a_half_gelu_keep_the_half_polynomial(monkeypatch):
    """layer_norm then GeLU in float16 with grad: the forward kernel stores the float16 output and the
    float32 mean and rstd for the backward, which do not depend on the erf, so its erfc is the degree-6
    one; a float32 sum of a float32 GeLU of the norm (a loss) takes the erf's value unrounded, so that
    kernel keeps degree 8."""
    x = torch.linspace(-3, 3, 40 * 96).reshape(40, 96).to(torch.float16).to(DEV).requires_grad_()
    w = torch.ones(96, dtype=torch.float16, device=DEV).requires_grad_()
    b = torch.zeros(96, dtype=torch.float16, device=DEV).requires_grad_()
    first6 = repr(-0.18153536319732666)

    def ln_gelu(t):
        return torch.nn.functional.gelu(torch.nn.functional.layer_norm(t, (96,), w, b))

    def ln_gelu_f32(t):
        return torch.nn.functional.gelu(torch.nn.functional.layer_norm(t, (96,), w, b).float())
    from tests.compiler_checks import collect_kernels, reset, strict
    kernels = collect_kernels(monkeypatch)
    for loss, degree6 in ((False, True), (True, False)):
        fn = (lambda t: ln_gelu_f32(t).sum()) if loss else (lambda t: ln_gelu(t) * 3.0)
        kernels.clear()
        reset()
        with strict():
            got = torch.compile(fn, backend="tilefuse")(x)
        torch._dynamo.reset()
        erf = [k.source for k in kernels if "_tf_erfc_poly(" in k.source]
        assert len(erf) == 1, len(erf)
        assert (first6 in erf[0]) == degree6, erf[0]
        xd, wd, bd = (t.detach().cpu().double() for t in (x, w, b))
        want = torch.nn.functional.gelu(torch.nn.functional.layer_norm(xd, (96,), wd, bd))
        want = want.sum() if loss else want * 3.0
        assert torch.allclose(got.detach().cpu().double(), want, rtol=2e-3, atol=2e-3)


# ------------------------------------------------------------------------- the GeLU's derivative
def _gelu_grad_reference(x: torch.Tensor) -> torch.Tensor:
    xs = x.double().tolist()
    return torch.tensor([0.5 * math.erfc(-v / math.sqrt(2)) + v * math.exp(-0.5 * v * v) / math.sqrt(2 * math.pi)
                         for v in xs], dtype=torch.float64)


def test_gelu_grad_one_exp_matches_float64():
    """Phi(x) + x phi(x) from one exp and one reciprocal: within 2e-6 of float64 relative to max(|g|, 0.1)
    (g crosses 0 at x = -0.75, where only an absolute bound means anything), and 0 / 1 at the far ends."""
    x = torch.cat([torch.linspace(-12, 12, 40001), torch.tensor([0.0, -0.7517916, 30.0, -30.0])])
    x = (x + (torch.rand_like(x) - 0.5) * 6e-4).to(DEV)
    y = _apply(special.gelu_grad_f32_portable, x)
    ref = _gelu_grad_reference(x.cpu())
    err = ((y.cpu().double() - ref).abs() / ref.abs().clamp(min=0.1)).max().item()
    assert err < 2e-6, err


def _backward_kernel_sources(monkeypatch, fn, x):
    from tests.compiler_checks import collect_kernels, reset, strict
    kernels = collect_kernels(monkeypatch)
    reset()
    with strict():
        out = torch.compile(fn, backend="tilefuse")(x)
        out.backward()
    torch._dynamo.reset()
    return "\n".join(k.source for k in kernels)


def test_column_sums_of_half_rounded_gelu_gradients_take_the_half_polynomial(monkeypatch):
    """The float16 GeLU chain's backward (d/dx, d/db, d/ds of gelu(x + b) * s): its float32 column partial
    sums add values that are each rounded to float16 first (the GeLU for d/ds, the gradient for d/db), so its
    erfc is the degree-6 one; the gradients match float64 to float16's rounding."""
    first6 = repr(-0.18153536319732666)
    # 1024 rows: the column sums go through float32 partials, a second kernel adds them up
    x = torch.linspace(-6, 4, 1024 * 64).reshape(1024, 64).to(torch.float16).to(DEV).requires_grad_()
    b = (torch.linspace(-0.5, 0.5, 64) * 0.1).to(torch.float16).to(DEV).requires_grad_()
    s = torch.linspace(0.5, 1.5, 64).to(torch.float16).to(DEV).requires_grad_()

    def fn(t):
        return (torch.nn.functional.gelu(t + b) * s).float().sum()
    text = _backward_kernel_sources(monkeypatch, fn, x)
    kernels = [k for k in text.split("# tilefuse generated kernel")[1:] if "_tf_erfc_poly(" in k]
    partials = [k for k in kernels
                if any("tl.store(" in line and ".to(tl.float16)" not in line for line in k.splitlines())]
    assert partials, text  # a kernel with an erf writes float32 (the partial sums)
    assert all(first6 in k for k in kernels), text
    xd, bd, sd = (t.detach().cpu().double().requires_grad_() for t in (x, b, s))
    (torch.nn.functional.gelu(xd + bd) * sd).sum().backward()
    for got, want in ((x.grad, xd.grad), (b.grad, bd.grad), (s.grad, sd.grad)):
        err = ((got.cpu().double() - want).abs() / want.abs().clamp(min=0.1)).max().item()
        assert err < 4e-3, err


@pytest.mark.parametrize("shared", [False, True])
def test_gelu_backward_takes_one_exp(monkeypatch, shared):
    """gelu_backward's cdf + x * pdf is one gelu_grad_f32 (one exp) when nothing else in the kernel uses
    the cdf; when the kernel also recomputes the GeLU itself (d/ds of gelu(x) * s), the erfc is shared and
    the pdf is the erfc's own exp(-x^2 / 2): one exp either way. The gradients match float64 either way."""
    from tests.support import noncontiguous
    x = noncontiguous(torch.linspace(-9, 6, 3000).reshape(30, 100)).to(DEV).requires_grad_()
    s = torch.linspace(0.5, 1.5, 100, device=DEV).requires_grad_()

    def fn(t):
        return (torch.nn.functional.gelu(t) * (s if shared else s.detach())).sum()
    text = _backward_kernel_sources(monkeypatch, fn, x)
    assert ("_tf_gelu_grad_f32(" in text) != shared, text
    # every kernel computes at most one exp an element (the erfc's and the density's are one when they share
    # the argument): its body's exps, and its calls of helpers whose text has one
    for kernel in text.split("# tilefuse generated kernel")[1:]:
        helpers, body = kernel.split("def tfk_")
        with_exp = re.findall(r"def (\w+)\(.*?\):\n((?:    .*\n|\n)*)", helpers)
        exps = body.count("tl.exp(") + body.count("tl.exp2(")
        exps += sum(body.count(name + "(") for name, fn_body in with_exp if "tl.exp" in fn_body)
        assert exps <= 1, kernel
    xd = x.detach().cpu().double().requires_grad_()
    sd = s.detach().cpu().double().requires_grad_()
    (torch.nn.functional.gelu(xd) * sd).sum().backward()
    scale = xd.grad.abs().clamp(min=0.1)
    err = ((x.grad.cpu().double() - xd.grad).abs() / scale).max().item()
    assert err < 1e-5, err
    if shared:
        assert torch.allclose(s.grad.cpu().double(), sd.grad, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ the 0.5 in the erfc's polynomial
@triton.jit
def _halved_pair_kernel(x_ptr, full_ptr, half_ptr, n, FN: tl.constexpr, E: tl.constexpr, K: tl.constexpr,
                        BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    e = E(x)
    tl.store(full_ptr + offs, FN(x, e, K, 1.0), mask=mask)
    tl.store(half_ptr + offs, FN(x, e, K, 0.5), mask=mask)


@pytest.mark.parametrize("k, exp_name", [(0.4, "exp_neg_sq"), (0.28284271247461906, "exp_neg_half_sq")])
def test_halved_erfc_is_the_erfc_halved_bit_for_bit(k, exp_name):
    """H = 0.5 halves the polynomial's coefficients at compile time: every Horner step is exactly half of
    the H = 1 one, so the result is the erfc's bits halved (both signs, the tails, the specials), for the
    text this machine runs (the interpreter's, or the GPU's approximate reciprocal and exp). Only a result
    below float32's normal range (erfc under 2.4e-38, x > 9.15) can round differently, by a subnormal's ulp."""
    gpu = not device.interpreting()
    fn = special.erfc_e_f32_fast if gpu else special.erfc_e_f32_portable
    exp_fn = getattr(special, exp_name + ("_fast" if gpu else "_portable"))
    z = torch.cat([torch.linspace(0, 12, 30001), torch.tensor([float("inf"), float("nan"), 1e-30, 0.0])])
    x = torch.cat([z, -z]).to(DEV)
    full, half = (torch.full_like(x, float("nan")) for _ in range(2))
    _halved_pair_kernel[(triton.cdiv(x.numel(), 1024),)](x, full, half, x.numel(), FN=fn, E=exp_fn, K=k, BLOCK=1024)
    full, half = full.cpu(), half.cpu()
    assert full.isnan().sum().item() == 2 and torch.equal(half.isnan(), full.isnan())  # the two NaN inputs
    ok = ~full.isnan()
    normal = ok & ((full * 0.5).abs() >= torch.finfo(torch.float32).tiny)
    assert torch.equal(half[normal], full[normal] * 0.5)
    assert ((half[ok] - full[ok] * 0.5).abs() <= 2e-45).all()


def _erfc_calls(text: str) -> list[str]:
    return re.findall(r"= _tf_erfc_f32\(.*\)", text)


@pytest.mark.parametrize("case", ["gelu", "gelu_and_grad", "half_x_shared", "one_plus_erf_shared"])
def test_the_gelus_half_goes_into_the_erfc_only_where_nothing_else_needs_it(monkeypatch, case):
    """The GeLU's (x * 0.5) * erfc and gelu_backward's erfc * 0.5 take the halved erfc (no multiply by 0.5).
    Where the kernel needs the unhalved value too (x * 0.5 used elsewhere, or 1 + erf(u) used other than
    halved) it keeps one erfc and the multiply: never two erfcs of one argument. Each result against float64."""
    x = torch.linspace(-8, 5, 2600, dtype=torch.float32).reshape(26, 100).to(DEV).requires_grad_()
    r2 = 0.7071067811865476

    def fn(t):
        if case == "half_x_shared":
            h = t * 0.5
            return (h * (1 + torch.erf(t * r2)) + h).sum()
        if case == "one_plus_erf_shared":
            c = 1 + torch.erf(t * r2)
            return (c * 0.5 + c * c).sum()
        return torch.nn.functional.gelu(t).sum() if case == "gelu" else \
            (torch.nn.functional.gelu(t) * torch.linspace(0.5, 1.5, 100, device=t.device)).sum()
    text = _backward_kernel_sources(monkeypatch, fn, x)
    for kernel in text.split("# tilefuse generated kernel")[1:]:
        calls = _erfc_calls(kernel)
        assert len(calls) <= 1, kernel
        if calls and case in ("gelu", "gelu_and_grad"):
            assert calls[0].endswith(", 0.5)") and "* 0.5)" not in kernel.split("def tfk_")[1], kernel
    if case in ("half_x_shared", "one_plus_erf_shared"):
        forward = [k for k in text.split("# tilefuse generated kernel")[1:] if _erfc_calls(k)][0]
        assert _erfc_calls(forward)[0].endswith(", 1.0)"), forward
    xd = x.detach().cpu().double().requires_grad_()
    want = fn(xd)
    want.backward()
    err = ((x.grad.cpu().double() - xd.grad).abs() / xd.grad.abs().clamp(min=0.1)).max().item()
    assert err < 1e-5, err
