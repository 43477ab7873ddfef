"""Special functions in float32 for the GEMM epilogue and for the compiler's generated kernels.

``erfc_f32`` is the complementary error function in float32 from one reciprocal, one exp and a degree-8
polynomial, with no branch and no table. Its use is the exact GeLU, ``x * Phi(x)`` with
``Phi(x) = erfc(-x / sqrt(2)) / 2``: written as ``0.5 * x * (1 + erf(x / sqrt(2)))`` (torch's formula) the
``1 + erf`` loses every digit below ``erf``'s rounding when ``x`` is negative (``1 + erf(-3.5)`` is quantised
to multiples of 6e-8; below ``x = -5.5`` float32 torch returns 0), and libdevice's ``erff`` costs about 33
instructions an element on sm_90 (coefficient selects between two polynomials), which made a GeLU chain
instruction-bound at 55 % of the copy bandwidth.

The form: for ``z = |x|``, ``erfc(z) = exp(-z^2) * Q(t)`` with ``t = 1 / (1 + 0.4 z)`` and ``Q`` of degree 8
in ``t``, fitted for relative error on ``z`` in [0, 10] (our own Lawson-weighted least-squares fit,
``tools/fit_erfc.py``; the fit's error is 1.2e-7); ``erfc(-z) = 2 - erfc(z)``. A degree-6 fit (6.2e-6,
:func:`erfc_poly_half`) serves kernels that round every value computed from it to float16 or bfloat16
before an output. Evaluated in float32 on the interpreter the relative error is
at most 6e-7 for ``|x| <= 2``, 9e-7 for ``|x| <= 4`` and 5e-6 down to the underflow at ``x = 9.2``, where the
rounding of ``-z^2`` inside the exp dominates; a GPU's approximate reciprocal and exp add about 2 ulp each
(tests/kernels/test_special.py holds both to 1.5e-6 / 4e-6 / 3e-5 against float64 ``math.erfc``). ``erfc(+inf) = 0``,
``erfc(-inf) = 2``, NaN gives NaN.

Two texts of the one function: :func:`erfc_f32_portable` (core ops; the interpreter) and :func:`erfc_f32_fast`
(libdevice's approximate reciprocal, exp2, NVIDIA and AMD). On sm_90 the compiler's kernel for the bench's
GeLU chain (``gelu(x + b) * s``, bf16) issued 36 instructions an element with it, 45 with the portable text
and 47 with libdevice's erff (SASS counts); with the exp2, the half polynomial and the tiled form's 2-D grid,
27.6. :func:`gelu_grad_f32_portable` / ``_fast`` are the GeLU's derivative from the same parts, one exp.
:func:`erfc_f32_source` gives the compiler either text, which it writes into the kernel files that use it
(a generated kernel file stands alone). The compiler's kernels take two variants that receive their exp as
an argument, so that a kernel needing the same exp elsewhere computes it once: :func:`erfc_e_f32_portable`
(and its ``_fast`` text), ``erfc(x)`` with ``exp(-x^2)`` (:func:`exp_neg_sq_portable`), or the GeLU's
``erfc(y / sqrt 2)`` straight from ``y`` with the normal density's ``exp(-y^2 / 2)``
(:func:`exp_neg_half_sq_portable`), chosen by a constexpr scale; a second constexpr, ``H``, scales the
result by 0.5 through the polynomial's coefficients (the normal cdf ``erfc(-y / sqrt 2) / 2`` of a GeLU in the
instructions of the erfc, bit for bit half of it down to float32's normal range).
"""
from __future__ import annotations

import inspect
import textwrap

import triton
import triton.language as tl
from triton.language.extra import libdevice

from .. import device


@triton.jit
def erfc_poly(t, H: tl.constexpr):
    # H * Q(t), t = 1 / (1 + 0.4 |x|): erfc(|x|) = exp(-x^2) * Q(t). H = 0.5 gives erfc / 2 in the same
    # instructions (coefficients halved at compile time: every step exactly half, so the same bits halved
    # wherever the result is a normal float32)
    q = 0.0706699788570404 * H
    q = q * t - 0.38097816705703735 * H
    q = q * t + 0.6661408543586731 * H
    q = q * t - 0.3663370907306671 * H
    q = q * t + 0.4144163131713867 * H
    q = q * t + 0.13168321549892426 * H
    q = q * t + 0.2402118444442749 * H
    q = q * t + 0.2241220921278 * H
    return q * t + 7.086526602506638e-05 * H


@triton.jit
def erfc_poly_half(t, H: tl.constexpr):
    # Q(t) of degree 6 (relative error 6.2e-6; 1.8e-5 evaluated in float32 out to the underflow), for
    # kernels that round every value computed from it to float16 or bfloat16: 80 times below their rounding
    q = -0.18153536319732666 * H
    q = q * t + 0.6511033773422241 * H
    q = q * t - 0.3056814968585968 * H
    q = q * t + 0.43909844756126404 * H
    q = q * t + 0.16296277940273285 * H
    q = q * t + 0.23457090556621552 * H
    return q * t - 0.0005124799790792167 * H


@triton.jit
def erfc_f32_portable(x):
    t = 1.0 / (1.0 + 0.4 * tl.abs(x))
    e = erfc_poly(t, 1.0) * tl.exp(-x * x)
    return tl.where(x < 0, 2.0 - e, e)


@triton.jit
def erfc_f32_fast(x):
    # the same on a GPU, with the approximate reciprocal and exp (div.approx / ex2.approx.ftz on NVIDIA):
    # the divisor is in [1, inf] and the exp's argument <= 0, so the range fix-ups '/' and tl.exp carry
    # (8 and 3 instructions an element on sm_90) have nothing to fix; an underflow below 1.2e-38 flushes to 0.
    # exp(-x^2) as exp2(x * x * -log2(e)): the sign rides on the multiply (one instruction fewer than a
    # negation, a multiply and libdevice's fast_expf's own multiply by log2(e))
    t = libdevice.fast_dividef(1.0, 1.0 + 0.4 * tl.abs(x))
    e = erfc_poly(t, 1.0) * tl.exp2(x * x * -1.4426950408889634)
    return tl.where(x < 0, 2.0 - e, e)


@triton.jit
def exp_neg_sq_portable(x):
    return tl.exp(-x * x)


@triton.jit
def exp_neg_sq_fast(x):
    # exp(-x^2) as exp2(x * x * -log2(e)), approximate (see erfc_f32_fast)
    return tl.exp2(x * x * -1.4426950408889634)


@triton.jit
def erfc_e_f32_portable(x, e, K: tl.constexpr, H: tl.constexpr):
    # H * erfc(x * K / 0.4) with its exp e = exp(-(x * K / 0.4)^2) given, so that a kernel needing that exp
    # elsewhere computes it once: K = 0.4 is erfc(x) (e = exp_neg_sq(x)); K = 0.4 / sqrt(2) the GeLU's
    # erfc(x / sqrt(2)) straight from x, no multiply by 1/sqrt(2) first (e = exp_neg_half_sq(x), the normal
    # density's exp). H = 1, or 0.5 for the normal cdf Phi(-x) = erfc(x / sqrt 2) / 2 without a multiply
    t = 1.0 / (1.0 + K * tl.abs(x))
    r = erfc_poly(t, H) * e
    return tl.where(x < 0, 2.0 * H - r, r)


@triton.jit
def erfc_e_f32_fast(x, e, K: tl.constexpr, H: tl.constexpr):
    t = libdevice.fast_dividef(1.0, 1.0 + K * tl.abs(x))
    r = erfc_poly(t, H) * e
    return tl.where(x < 0, 2.0 * H - r, r)


@triton.jit
def exp_neg_half_sq_portable(x):
    return tl.exp(x * x * -0.5)


@triton.jit
def exp_neg_half_sq_fast(x):
    # exp(-x^2 / 2) as exp2(x * x * -log2(e) / 2), approximate (see erfc_f32_fast)
    return tl.exp2(x * x * -0.7213475204444817)


@triton.jit
def gelu_grad_f32_portable(x):
    # d/dx x Phi(x) = Phi(x) + x phi(x) with one exp: erfc(z) = exp(-z^2) Q(t) at z = |x| / sqrt(2), whose
    # exp(-z^2) = exp(-x^2 / 2) is also sqrt(2 pi) phi(x); Phi(-|x|) = erfc(z) / 2, Phi(|x|) = 1 - that
    t = 1.0 / (1.0 + 0.28284271247461906 * tl.abs(x))
    e = tl.exp(x * x * -0.5)
    h = erfc_poly(t, 0.5) * e
    return tl.where(x < 0, h, 1.0 - h) + x * (e * 0.3989422804014327)


@triton.jit
def gelu_grad_f32_fast(x):
    # the same with the approximate reciprocal and exp (see erfc_f32_fast)
    t = libdevice.fast_dividef(1.0, 1.0 + 0.28284271247461906 * tl.abs(x))
    e = tl.exp2(x * x * -0.7213475204444817)
    h = erfc_poly(t, 0.5) * e
    return tl.where(x < 0, h, 1.0 - h) + x * (e * 0.3989422804014327)


# the GEMM epilogue calls this name: the interpreter cannot run libdevice (triton 3.6)
erfc_f32 = erfc_f32_portable if device.interpreting() else erfc_f32_fast


def _source(fn, name: str, poly_name: str = "") -> str:
    """``fn``'s text as a helper called ``name`` (the compiler writes it into the kernel files that use it),
    its call of :func:`erfc_poly` renamed to ``poly_name``."""
    text = textwrap.dedent(inspect.getsource(getattr(fn, "fn", fn)))
    text = text[text.index("def "):]
    text = "def " + name + text[text.index("("):]
    return text.replace("erfc_poly(", poly_name + "(") if poly_name else text


def erfc_f32_source(name: str, poly_name: str, interpreter: bool) -> str:
    """The text of the float32 erfc for a kernel file, named ``name`` and calling the polynomial as
    ``poly_name`` (:func:`erfc_poly_source`); the GPU form (libdevice) unless the file runs on the
    interpreter. The GPU form needs ``from triton.language.extra import libdevice``."""
    return _source(erfc_f32_portable if interpreter else erfc_f32_fast, name, poly_name)


def erfc_e_f32_source(name: str, poly_name: str, interpreter: bool) -> str:
    """The float32 erfc of a scaled argument that takes its exp as a second argument and the scale as a
    constexpr third (:func:`erfc_e_f32_portable`), as :func:`erfc_f32_source` names and chooses it."""
    return _source(erfc_e_f32_portable if interpreter else erfc_e_f32_fast, name, poly_name)


def exp_neg_half_sq_source(name: str, interpreter: bool) -> str:
    """``exp(-x^2 / 2)`` in float32 (approximate on a GPU), named ``name``."""
    return _source(exp_neg_half_sq_portable if interpreter else exp_neg_half_sq_fast, name)


def exp_neg_sq_source(name: str, interpreter: bool) -> str:
    """``exp(-x^2)`` in float32 (approximate on a GPU), named ``name``."""
    return _source(exp_neg_sq_portable if interpreter else exp_neg_sq_fast, name)


def gelu_grad_f32_source(name: str, poly_name: str, interpreter: bool) -> str:
    """The exact GeLU's derivative ``Phi(x) + x phi(x)`` in float32 with one exp and one reciprocal (the
    compiler writes it for torch's gelu_backward, which costs an erf and a second exp), as
    :func:`erfc_f32_source` names and chooses it."""
    return _source(gelu_grad_f32_portable if interpreter else gelu_grad_f32_fast, name, poly_name)


def erfc_poly_source(name: str, half: bool = False) -> str:
    """The polynomial's text named ``name``: degree 8, or degree 6 (:func:`erfc_poly_half`) for a kernel whose
    values computed from it are all rounded to half types before an output (two instructions an element
    fewer)."""
    return _source(erfc_poly_half if half else erfc_poly, name)
