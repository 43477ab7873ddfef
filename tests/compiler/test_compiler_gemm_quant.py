"""Quantised GEMM outputs: ``(y / scale).clamp(...).to(float8)`` and ``(y / scale).round().clamp(...).to(int8)``
with the scale computed in the graph, fused into the library GEMM's epilogue (compiler/ir/float8.py writes the
float8 casts and stores; docs/decisions/033-compiler-gemm-quantised-outputs.md).

A quantised output is checked against a float64 reference band: the pre-quantisation value ``v`` is computed
in float64 and quantised at ``v - d`` and ``v + d``, where ``d`` bounds what eager's and the kernel's own
roundings (the product's accumulation order, float16 intermediates) may move ``v``. Quantisation is monotone,
so a right answer lies between the two codes: exactly the reference where they agree (the unambiguous
elements, most of them: the tests check that), within one quantum where ``v`` is that close to a rounding
boundary. Eager must lie in the band too (that checks the band). CPU interpreter, float32 and float16."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from tilefuse.compiler import records

from tests import compiler_checks as cc
from tests.support import transposed_copy
from .test_compiler_gemm import gemm_kernels, matmul_externs

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
# share of elements allowed near a rounding boundary (a band wider than that checks little); float16's: an int8
# code of a value near 100 computed in float16 (ulp 0.06) is ambiguous that often in eager too
AMBIGUOUS_MAX = {torch.float32: 0.12, torch.float16: 0.25}


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def fp8(dtype, clamp=True):
    fmax = torch.finfo(dtype).max
    return (lambda v: v.clamp(-fmax, fmax).to(dtype)) if clamp else (lambda v: v.to(dtype))


def int8(v):
    return v.round().clamp(-128, 127).to(torch.int8)


def t(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype)


def linear(x, w, b):
    return F.linear(x, w, b)


def mm_bias(x, w, b):
    return x @ w.t() + b


def mm(x, w, b):
    return x @ w.t()


# name -> (product(x, w, b) -> y, tail(y, s) -> the value to quantise, quantise, scale maker(M, dtype),
#          ATen ops the GEMM epilogue fuses)
FORMS = {
    # per-tensor scale from an amax history, computed in the graph (a reduction before the GEMM)
    "e4m3_history": (mm_bias, lambda y, s: torch.relu(y) / (s.max() / 448), fp8(E4M3),
                     lambda M, dt: torch.rand(16) * 4 + 1, ("clamp", "_to_copy", "relu")),
    # a scalar parameter (0-d) scale, e5m2
    "e5m2_scalar": (mm, lambda y, s: y / s, fp8(E5M2), lambda M, dt: torch.tensor(0.01), ("div", "_to_copy")),
    # per-row scale, a graph tensor of shape (M, 1)
    "e4m3_row": (linear, lambda y, s: y / (s.abs() + 0.05), fp8(E4M3),
                 lambda M, dt: torch.rand(M, 1, dtype=dt) * 0.1, ("abs", "_to_copy")),
    "int8_row": (mm, lambda y, s: F.gelu(y) / (s.abs() + 0.02), int8,
                 lambda M, dt: torch.rand(M, 1, dtype=dt) * 0.1, ("round", "_to_copy")),
    # per-tensor int8 through the inverse scale
    "int8_inverse": (mm_bias, lambda y, s: y * (127.0 / s), int8, lambda M, dt: torch.tensor(24.0),
                     ("mul", "round", "_to_copy")),
    # no clamp: values past the largest finite code take torch's overflow rule (e4m3fn saturates, e5m2
    # overflows to inf)
    "e4m3_saturates": (mm, lambda y, s: y * s, fp8(E4M3, clamp=False), lambda M, dt: torch.tensor(150.0),
                       ("mul", "_to_copy")),
    "e5m2_overflows": (mm, lambda y, s: y * s, fp8(E5M2, clamp=False), lambda M, dt: torch.tensor(20000.0),
                       ("mul", "_to_copy")),
}


# eager's float32 GeLU (ATen's vectorised erf) is off by up to 5.8 * 2^-24 * |y| absolutely, measured over
# y in [-12, 12] on 2M points; for y << 0, 1 + erf(y / sqrt 2) cancels, so relatively that is far more than an
# ulp (7e-4 of gelu(-3.47)). Eager's float16 GeLU computes in float32 too.
GELU_ABS_ERR = 8 * 2.0 ** -24


class _GeluOff(torch.overrides.TorchFunctionMode):
    """F.gelu moved by its float32 error bound, ``sign`` * GELU_ABS_ERR * |y|, in a float64 tail."""

    def __init__(self, sign):
        super().__init__()
        self.sign = sign

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is F.gelu:
            out = out + self.sign * GELU_ABS_ERR * args[0].abs()
        return out


def band(product, tail, quant, args, dtype, K):
    """(low, high) codes of the float64 reference's band (see the module docstring): the product moved by
    its worst-case float32 accumulation error (and float16 rounding), GeLU moved by its float32 error, both
    through the tail, plus the tail's own roundings."""
    x, w, b, s = [a.detach().double() for a in args]
    y = product(x, w, b)
    # (every product form is bilinear plus a bias: product(|x|, |w|, |b|) bounds the terms' sum)
    err = (K + 4) * 2.0 ** -24 * product(x.abs(), w.abs(), b.abs())
    if dtype == torch.float16:  # y rounded to float16; addmm's product also rounded before the bias is added
        err = err + 2.0 ** -11 * (y.abs() + product(x, w, b * 0).abs())
    v = tail(y, s)
    ends = [v]
    for product_sign in (-1, 1):
        for gelu_sign in (-1, 1):
            with _GeluOff(gelu_sign):
                ends.append(tail(y + product_sign * err, s))
    # the tail's other roundings: float16 rounds the product's scale and v (half an ulp, 2^-12, each); float32's
    # scale, division and amax round by a few ulps (64, with room)
    rel = 1.25 * 2.0 ** -10 if dtype == torch.float16 else 64 * 2.0 ** -24
    slack = rel * v.abs()
    low = torch.stack(ends).amin(0) - slack
    high = torch.stack(ends).amax(0) + slack
    return quant(low), quant(high)


def as_float(q):
    return q.float() if q.dtype != torch.int8 else q.to(torch.float64)


def in_band(what, q, low, high):
    qf, lo, hi = as_float(q), as_float(low), as_float(high)
    ok = ((qf >= lo) & (qf <= hi)) | (torch.isnan(qf) & torch.isnan(lo) & torch.isnan(hi))
    bad = (~ok).nonzero()
    assert not bad.numel(), (f"{what}: {bad.shape[0]} of {q.numel()} codes outside the float64 band, e.g. at "
                             f"{bad[0].tolist()}: {qf[tuple(bad[0])]} not in [{lo[tuple(bad[0])]}, {hi[tuple(bad[0])]}]")


def check_quantised(product, tail, quant, args, what, K):
    """Compiled (strict: no fallback) and eager against the float64 band; returns the compiled output."""
    fn = lambda x, w, b, s: quant(tail(product(x, w, b), s))  # noqa: E731
    eager = fn(*args)
    cc.reset()
    with cc.strict():
        out = cc.compiled(fn, fullgraph=True, dynamic=False)(*args)
    assert out.dtype == eager.dtype and out.shape == eager.shape, (out.dtype, out.shape, eager.dtype, eager.shape)
    low, high = band(product, tail, quant, args, args[0].dtype, K)
    ambiguous = (as_float(low) != as_float(high)).sum().item()
    # (two elements of a tiny output, 7 codes, may be near a boundary by chance: a share would flake there)
    assert ambiguous <= max(2, AMBIGUOUS_MAX[args[0].dtype] * low.numel()), (
        f"{what}: {ambiguous} of {low.numel()} codes of the band are ambiguous: the check is too loose")
    in_band(f"{what} eager", eager, low, high)
    in_band(f"{what} compiled", out, low, high)
    return out


def assert_quant_fused(what, *ops):
    fused = [k for k in gemm_kernels() if k.form == "gemm+epilogue"]
    assert fused, f"{what}: no GEMM with a fused epilogue: {[k.name for k in gemm_kernels()]}"
    names = " ".join(f for k in fused for f in k.fuses)
    missing = [op for op in ops if op not in names]
    assert any(m in names for m in ("aten.mm", "aten.addmm", "aten.bmm")), f"{what}: the GEMM epilogue fuses {names}"
    assert not missing, f"{what}: the GEMM epilogue fuses {names}, not {missing}"
    assert not matmul_externs(), f"{what}: matmuls ran in ATen: {matmul_externs()}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("form", sorted(FORMS))
def test_quantised_forms(form, dtype):
    product, tail, quant, scale, ops = FORMS[form]
    M, K, N = 7, 33, 19
    args = (t(M, K, dtype=dtype), t(N, K, dtype=dtype), t(N, dtype=dtype), scale(M, dtype))
    out = check_quantised(product, tail, quant, args, form, K)
    assert_quant_fused(form, *ops)
    if form == "e4m3_saturates":
        assert (out.float().abs() == 448).any(), "no value saturated: the case tests nothing"
    if form == "e5m2_overflows":
        assert torch.isinf(out.float()).any(), "no value overflowed: the case tests nothing"


@pytest.mark.parametrize("M,K,N", [(1, 7, 129), (129, 1, 7), (7, 129, 1), (129, 7, 129)])
@pytest.mark.parametrize("form", ["e4m3_history", "int8_row"])
def test_odd_sizes(form, M, K, N):
    product, tail, quant, scale, ops = FORMS[form]
    args = (t(M, K), t(N, K), t(N), scale(M, torch.float32))
    check_quantised(product, tail, quant, args, f"{form} {M}x{K}x{N}", K)
    assert_quant_fused(form, *ops)


def test_batched_and_3d_operands():
    """bmm with a per-(batch, row) scale, and a Linear on (B, S, K) activations: one fused quantising GEMM
    each, with no product stored."""
    cases = {
        "bmm e4m3": (lambda x, w, b: torch.bmm(x, w), lambda y, s: y / s, fp8(E4M3),
                     (t(3, 7, 33), t(3, 33, 19), torch.zeros(19), torch.rand(3, 7, 1) * 0.1 + 0.01)),
        "linear 3-D int8": (linear, lambda y, s: y / s, int8,
                            (t(2, 5, 33), t(19, 33), t(19), torch.rand(2, 5, 1) * 0.1 + 0.05)),
    }
    for what, (product, tail, quant, args) in cases.items():
        check_quantised(product, tail, quant, args, what, 33)
        assert_quant_fused(what, "_to_copy")
        assert any("(the product is not stored)" in k.name for k in gemm_kernels()), [k.name for k in gemm_kernels()]


LAYOUTS = {
    "x sliced": lambda: (t(7, 40)[:, 3:36], t(19, 33)),
    "w transposed in memory": lambda: (t(7, 33), transposed_copy(torch.randn(19, 33))),
    "every other row": lambda: (t(13, 33)[::2], t(19, 33)),
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_transposed_and_sliced_operands(layout):
    x, w = LAYOUTS[layout]()
    product, tail, quant, scale, ops = FORMS["e4m3_row"]
    check_quantised(product, tail, quant, (x, w, t(19), scale(x.shape[0], torch.float32)), layout, 33)
    assert_quant_fused(layout, *ops)


def test_float8_codes_are_bit_exact_on_edge_values():
    """Zeros of both signs, subnormals, ties, the largest finite code, past it, inf and NaN: the compiled
    cast stores eager's bits (the interpreter's own fp32 -> fp8 cast gets several of these wrong)."""
    edge = torch.tensor([0.0, -0.0, 2.0 ** -9, -2.0 ** -10, 2.0 ** -9 * 1.5, 2.0 ** -17, 125.7, 448, 464, 465,
                         500, 57344, 61439, 61440, 1e6, float("inf"), -float("inf"), float("nan"), -1e-30, 3.0])
    for dtype in (E4M3, E5M2):
        fn = lambda v, d=dtype: (v * 1.0).to(d)  # noqa: E731
        cc.reset()
        with cc.strict():
            out = cc.compiled(fn, fullgraph=True, dynamic=False)(edge)
        want = fn(edge)
        assert torch.equal(out.view(torch.uint8), want.view(torch.uint8)), (dtype, out.view(torch.uint8),
                                                                             want.view(torch.uint8))


def test_float8_round_trip_reads_codes_exactly():
    """A float8 input read by a kernel (dequantisation ``q.float() * s``), every code including inf and NaN."""
    for dtype in (E4M3, E5M2):
        codes = torch.arange(256, dtype=torch.uint8).view(dtype).reshape(16, 16)
        fn = lambda q, s: q.to(torch.float32) * s  # noqa: E731
        s = torch.rand(16, 1) + 0.5
        cc.reset()
        with cc.strict():
            out = cc.compiled(fn, fullgraph=True, dynamic=False)(codes, s)
        want = fn(codes, s)
        same = (out == want) | (torch.isnan(out) & torch.isnan(want))
        assert same.all(), (dtype, out[~same], want[~same])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_training_graph_with_a_quantised_branch(dtype):
    """Forward and backward: the activation (high precision, differentiated) and its fp8 codes (not
    differentiated) from one GEMM epilogue, which also saves the product for GeLU's backward; gradients
    against float64. (With a bias as well the epilogue would need five operands, one more than the hook's
    four slots: the quantising tail then runs as its own kernel, and explain says so.)"""
    def fn(x, w, b, s):
        h = F.gelu(x @ w.t())
        q = (h / s).clamp(-448, 448).to(E4M3)
        return h, q

    x, w = t(9, 17, dtype=dtype).requires_grad_(), t(13, 17, dtype=dtype).requires_grad_()
    b, s = torch.zeros(13, dtype=dtype), torch.tensor(0.01)
    h_eager, q_eager = fn(x, w, b, s)
    cot = torch.randn(h_eager.shape, dtype=torch.float64)
    g_eager = torch.autograd.grad(h_eager, (x, w), cot.to(dtype))
    ref_in = [a.detach().double().requires_grad_() for a in (x, w)]
    h_ref, _ = fn(*ref_in, b.double(), s.double())
    g_ref = torch.autograd.grad(h_ref, ref_in, cot)
    cc.reset()
    with cc.strict():
        h, q = cc.compiled(fn, fullgraph=True, dynamic=False)(x, w, b, s)
        grads = torch.autograd.grad(h, (x, w), cot.to(dtype))
    cc.assert_matches("h", h, h_eager, h_ref, dtypes=(dtype,))
    for i, (g, e, r) in enumerate(zip(grads, g_eager, g_ref)):
        cc.assert_matches(f"grad {i}", g, e, r, dtypes=(dtype,))
    low, high = band(mm, lambda y, s: F.gelu(y) / s, fp8(E4M3), [x, w, b, s], dtype, 17)
    in_band("q", q, low, high)
    fused = [k for g in records.REPORTS if g.kind == "forward" for k in g.kernels if k.form == "gemm+epilogue"]
    assert fused and any("_to_copy" in " ".join(k.fuses) for k in fused), [k.name for k in gemm_kernels()]
    assert gemm_kernels("backward") and not matmul_externs(), matmul_externs()


def test_scale_from_the_product_amax_is_right_and_explained():
    """The scale is the product's own amax: a reduction over every tile must finish before any element is
    quantised, so the GEMM stores its product and the reduction and the quantising pass follow (explain says
    so). Per tensor (fp8) and per row (int8, the reduction and the quantisation in one row kernel)."""
    import tilefuse

    def per_tensor(x, w, b):
        y = F.gelu(x @ w.t() + b)
        return (y / (y.abs().amax() / 448)).clamp(-448, 448).to(E4M3)

    def per_row(x, w, b):
        y = x @ w.t() + b
        return int8(y / (y.abs().amax(dim=-1, keepdim=True) / 127))

    for fn, M, N in ((per_tensor, 7, 19), (per_tensor, 129, 65), (per_row, 33, 129)):
        x, w, b = t(M, 17), t(N, 17), t(N)
        if fn is per_tensor:
            tail, quant = (lambda y, s: (lambda h: h / (h.abs().amax() / 448))(F.gelu(y))), fp8(E4M3)
        else:
            tail, quant = (lambda y, s: y / (y.abs().amax(-1, keepdim=True) / 127)), int8
        check_quantised(mm_bias, tail, quant, (x, w, b, torch.tensor(1.0)), f"{fn.__name__} {M}x{N}", 17)
        assert gemm_kernels() and not matmul_externs()
        text = str(tilefuse.explain(fn, x, w, b))
        assert "reduces over the product" in text, text


def test_explain_shows_the_quantising_gemm_and_no_matmul_extern():
    import tilefuse

    product, tail, quant, scale, _ = FORMS["e4m3_history"]
    fn = lambda x, w, b, s: quant(tail(product(x, w, b), s))  # noqa: E731
    text = str(tilefuse.explain(fn, t(7, 33), t(19, 33), t(19), scale(7, torch.float32)))
    gemm_lines = [ln for ln in text.splitlines() if "gemm mm + epilogue" in ln]
    assert gemm_lines and "[gemm+epilogue]" in gemm_lines[0], text
    fuses = text.split(gemm_lines[0], 1)[1].splitlines()[1]
    assert "aten.mm" in fuses and "aten._to_copy" in fuses and "aten.clamp" in fuses, fuses
    assert "\n  extern " not in text and "no fallback to ATen" in text, text
    # the codes are the only output: the library GEMM does not store the product (store_out=False)
    assert "(the product is not stored)" in gemm_lines[0], gemm_lines[0]
    writes = text.split(gemm_lines[0], 1)[1].splitlines()[2]
    assert writes.strip() == "writes _to_copy", writes


@triton.jit
def twice_into_e0(acc, offs_m, offs_n, mask_m, mask_n, e0, e0_sm, e0_sn, e1, e1_sm, e1_sn, e2, e2_sm, e2_sn,
                  e3, e3_sm, e3_sn):
    mask = mask_m[:, None] & mask_n[None, :]
    tl.store(e0 + offs_m[:, None] * e0_sm + offs_n[None, :] * e0_sn, acc * 2.0, mask)
    return acc


def test_library_gemm_without_its_own_store():
    """``store_out=False``: the hook's slot store is the only write; ``out`` (a one-element stand-in with zero
    strides) is untouched; a call that would store nothing is refused before any launch."""
    from tilefuse.kernels.gemm import plan

    for M, K, N in ((37, 29, 41), (1, 7, 129)):
        a, b = t(M, K), t(N, K).t()  # b read transposed through its strides
        side = torch.full((M, N), float("nan"))
        stand_in = torch.full((1,), 7.0).as_strided((M, N), (0, 0))
        plan.gemm_with_epilogue(a, b, twice_into_e0, [side], torch.float32, out=stand_in, store_out=False)
        ref = 2 * (a.double() @ b.double())
        assert cc.rel_error(side, ref) < 1e-5 and stand_in[0, 0].item() == 7.0
    with pytest.raises(ValueError, match="store_out=False needs an epilogue_fn"):
        plan.gemm_with_epilogue(a, b, None, [], torch.float32, store_out=False)


def test_unsupported_float8_format_falls_back_with_its_reason():
    """float8_e4m3fnuz (AMD's format, other NaN and bias rules) is not compiled: the cast runs in ATen, the
    answer is eager's, and explain gives the reason; the GEMM and the rest still run on tilefuse's kernels."""
    import tilefuse

    fnuz = torch.float8_e4m3fnuz
    fn = lambda x, w: (torch.relu(x @ w.t()) * 16).clamp(-240, 240).to(fnuz)  # noqa: E731
    x, w = t(7, 33), t(19, 33)
    cc.reset()
    with cc.lenient():
        out = cc.compiled(fn, fullgraph=True, dynamic=False)(x, w)
    want = fn(x, w)
    # the product is the library GEMM's: compare the dequantised codes within one e4m3fnuz quantum
    assert out.dtype == fnuz and ((out.float() - want.float()).abs() <= want.float().abs() / 8 + 2 ** -10).all()
    text = str(tilefuse.explain(fn, x, w))
    assert "float8_e4m3fnuz" in text and "fallback" in text, text
    assert not matmul_externs() and gemm_kernels()


def test_float8_arithmetic_stays_in_aten_with_its_reason():
    """An op other than a cast, copy or view on float8 values is not compiled (eager has none on the CPU
    either; a float8 register is a float32 on the grid only between casts): it falls back, visibly."""
    import tilefuse

    fn = lambda q: torch.cat([q, q]).to(torch.float32) + torch.where(q.to(torch.float32) > 0, 1.0, 0.0).sum()  # noqa: E731
    q = torch.randn(5, 3).to(E4M3)
    text = str(tilefuse.explain(fn, q))
    assert "no fallback to ATen" in text, text  # cat, casts and views of float8 are compiled
    fn2 = lambda q: q.abs().to(torch.float32)  # noqa: E731  (eager has abs on float8; tilefuse does not compile it)
    text = str(tilefuse.explain(fn2, q))
    assert "compiles float8 tensors in casts, copies and views only" in text, text
    cc.reset()
    with cc.lenient():
        out = cc.compiled(fn2, fullgraph=True, dynamic=False)(q)
    assert torch.equal(out, fn2(q))


def test_quantising_hooks_cross_compile_for_sm90a_and_gfx942():
    """tests/compile_only/gemm_quant_hook_checks.py in a child that is not on the interpreter: the quantising
    hooks (float8 codes from bits, int8) build inside the library GEMM for both vendors."""
    import os
    import re
    import subprocess
    import sys
    from pathlib import Path

    here = Path(__file__).resolve().parents[1]  # tests/
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TILEFUSE_INTERPRET="0", PYTHONPATH=str(here.parent))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(here / "compile_only" / "gemm_quant_hook_checks.py")],
                          capture_output=True, text=True, env=env, cwd=here.parent, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert re.search(r"\b8 passed", proc.stdout) and "failed" not in proc.stdout, proc.stdout[-2000:]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_operand_producers_stay_their_own_kernel_and_explain_says_so(dtype):
    """A cast or a scale of a GEMM operand is not fused into the GEMM's loads (no prologue: decision 034): the
    producer is its own kernel, the answer is eager's, and explain names the producer and the reason."""
    import tilefuse

    other = torch.float16 if dtype == torch.float32 else torch.float32
    cases = {
        "cast of the activations": (lambda x, w: F.gelu(x.to(w.dtype) @ w.t()), (t(7, 33, dtype=other), t(19, 33, dtype=dtype))),
        "scale of the weight": (lambda x, w: x @ (w * 0.5).t(), (t(7, 33, dtype=dtype), t(19, 33, dtype=dtype))),
    }
    for what, (fn, args) in cases.items():
        args = tuple(a.requires_grad_() for a in args)
        cc.check_function(fn, *args, what=what)
        assert gemm_kernels() and not matmul_externs(), matmul_externs()
        text = str(tilefuse.explain(fn, *[a.detach() for a in args]))
        assert "no prologue fusion (decision 034)" in text, text
