"""float8 values in compiled graphs: which ops may touch them, and the Triton text of their casts, loads and
stores (torch's semantics, bit for bit, on the interpreter and on a GPU).

What a graph does with float8 is quantise and dequantise (``(y / scale).clamp(-448, 448).to(float8_e4m3fn)``,
``q.float() * scale``); eager has no arithmetic on float8 tensors on the CPU. So the lowering compiles float8
tensors only in casts, copies and views (:data:`FP8_OPS`); any other op that reads or makes one runs in ATen
with the reason shown by ``explain``. Only ``float8_e4m3fn`` and ``float8_e5m2`` (:data:`FP8_FORMATS`): the
``fnuz`` formats (AMD's) and the scale formats (``e8m0fnu``) stay in ATen.

In registers a float8 value is a float32 that lies on the format's grid, as a half value is a float32
rounded to the half type. The three conversions are written from bits and float32 arithmetic, never from
Triton's float8 casts:

- **cast to float8** (``_tf_to_<fmt>``): the library epilogue's ``round_to_fp8_grid`` (round to nearest,
  ties to even, subnormals included; :mod:`tilefuse.kernels.gemm.epilogue`, whose source is reused here),
  then torch's overflow rule: ``float8_e4m3fn`` *saturates* (anything above 448, inf included, becomes
  448: torch 2.13's CPU and CUDA conversions), ``float8_e5m2`` overflows to inf; NaN stays NaN, and a zero
  keeps its sign. Triton's own fp32 -> fp8 cast is not used: on the interpreter (triton 3.6) it drops the
  carry when rounding crosses a power of two (125.7 -> 64 in e4m3) and turns 500 into 256 and 465 into NaN;
  on NVIDIA it is ``cvt.rn.satfinite``, which saturates e5m2's inf to 57344 where torch gives inf.
- **store** (``_tf_<fmt>_bits``): the on-grid value's bits (sign, exponent, three mantissa bits for e4m3;
  e5m2 is float16's top byte) bitcast to the float8 type, exact on every backend.
- **load** (``_tf_from_<fmt>``): e5m2 through float16 (its top byte), e4m3 from its sign, exponent and
  mantissa bits (0x7f is NaN): Triton's cast reads e4m3's NaN as 480 on the interpreter, and e5m2's inf and
  NaN as 65536 and 98304.

The GEMM epilogue hook writes the same text (codegen/gemm_epilogue.py), so a quantising tail fused into the
library's GEMM stores exactly what eager's ``.to(float8)`` stores.
"""
from __future__ import annotations

import inspect
import re
import textwrap

import torch

# dtype -> (name used in helper names, mantissa bits, smallest normal exponent, largest finite value,
#           Triton type, overflow saturates (True) or goes to inf (False))
FP8_FORMATS: dict[torch.dtype, tuple] = {
    torch.float8_e4m3fn: ("e4m3fn", 3, -6, 448.0, "tl.float8e4nv", True),
    torch.float8_e5m2: ("e5m2", 2, -14, 57344.0, "tl.float8e5", False),
}
FP8_DTYPES = frozenset(FP8_FORMATS)

# ATen ops (overload packet names) compiled with float8 operands or results: casts, copies and views move
# on-grid values without arithmetic, so a value read, moved and stored keeps its bits.
FP8_OPS = frozenset({
    "_to_copy", "convert_element_type", "clone", "copy", "copy_", "view", "_unsafe_view", "reshape",
    "permute", "transpose", "t", "expand", "slice", "select", "squeeze", "unsqueeze", "alias", "as_strided",
    "unbind", "split", "split_with_sizes", "cat", "contiguous", "view_of", "lift_fresh_copy", "detach",
})


def op_allowed(op_name: str) -> bool:
    return op_name in FP8_OPS


def _library_source(fn, new_name: str, renames: dict[str, str]) -> str:
    """The source of a library ``@triton.jit`` function (interpreted or not), def line first, renamed."""
    src = textwrap.dedent(inspect.getsource(getattr(fn, "fn", fn)))
    src = src[re.search(r"^def\s", src, re.MULTILINE).start():]
    for old, new in renames.items():
        src = re.sub(rf"\b{old}\b", new, src)
    return re.sub(r"^def\s+\w+", f"def {new_name}", src, count=1)


def helper_texts() -> dict[str, tuple[str, tuple[str, ...]]]:
    """name -> (``def`` text without the decorator, helpers it calls), for primitives.HELPERS."""
    from ...kernels.gemm import epilogue as lib

    renames = {"round_half_even": "_tf_round_half_even", "round_to_fp8_grid": "_tf_round_to_fp8_grid"}
    out = {
        "_tf_round_half_even": (_library_source(lib.round_half_even, "_tf_round_half_even", renames), ()),
        "_tf_round_to_fp8_grid": (_library_source(lib.round_to_fp8_grid, "_tf_round_to_fp8_grid", renames),
                                  ("_tf_round_half_even",)),
    }
    for dtype, (fmt, mant, emin, fmax, _tl, saturate) in FP8_FORMATS.items():
        overflow = (f"    q = tl.minimum(tl.maximum(q, -{fmax!r}), {fmax!r})  # torch saturates e4m3fn\n"
                    if saturate else
                    f"    q = tl.where(tl.abs(q) > {fmax!r}, q * float(\"inf\"), q)  # torch overflows to inf\n")
        out[f"_tf_to_{fmt}"] = (
            f"def _tf_to_{fmt}(x):\n"
            f"    # torch's .to({dtype}): round to nearest even on the grid, then its overflow rule\n"
            f"    x = x.to(tl.float32)\n"
            f"    q = _tf_round_to_fp8_grid(x, {mant}, {emin})\n"
            + overflow +
            f"    q = tl.where(q == 0.0, x * 0.0, q)  # -0.0 and small negatives keep the sign\n"
            f"    return tl.where(x != x, x, q)\n", ("_tf_round_to_fp8_grid",))
    out["_tf_e4m3fn_bits"] = (
        "def _tf_e4m3fn_bits(v):\n"
        "    # v: float32 on the e4m3fn grid (|v| <= 448) or NaN -> the float8 code\n"
        "    b = v.to(tl.int32, bitcast=True)\n"
        "    sign = (b >> 24) & 0x80\n"
        "    e = ((b >> 23) & 0xFF) - 120\n"
        "    code = tl.where(e >= 1, (e << 3) | ((b >> 20) & 7), (tl.abs(v) * 512.0).to(tl.int32))\n"
        "    code = tl.where(v != v, 0x7F, code) | sign\n"
        "    return code.to(tl.uint8).to(tl.float8e4nv, bitcast=True)\n", ())
    out["_tf_e5m2_bits"] = (
        "def _tf_e5m2_bits(v):\n"
        "    # v: float32 on the e5m2 grid, inf or NaN -> the float8 code (float16's top byte)\n"
        "    h = v.to(tl.float16).to(tl.int16, bitcast=True) >> 8\n"
        "    h = tl.where(v != v, (h & 0x80) | 0x7F, h)  # torch's NaN code (float16's top byte is 0x7e)\n"
        "    return h.to(tl.uint8).to(tl.float8e5, bitcast=True)\n", ())
    out["_tf_from_e4m3fn"] = (
        "def _tf_from_e4m3fn(x):\n"
        "    # the code's value from its bits: (8 + m) * 2^(e - 10), subnormals m * 2^-9, 0x7f NaN\n"
        "    b = x.to(tl.uint8, bitcast=True).to(tl.int32)\n"
        "    e = (b >> 3) & 0xF\n"
        "    m = (b & 7).to(tl.float32)\n"
        "    pow2 = ((e + 117) << 23).to(tl.float32, bitcast=True)\n"
        "    mag = tl.where(e == 0, m * 0.001953125, (8.0 + m) * pow2)\n"
        "    mag = tl.where((b & 0x7F) == 0x7F, float(\"nan\"), mag)\n"
        "    return tl.where((b & 0x80) != 0, -mag, mag)\n", ())
    out["_tf_from_e5m2"] = (
        "def _tf_from_e5m2(x):\n"
        "    bits = x.to(tl.uint8, bitcast=True).to(tl.uint16) << 8\n"
        "    return bits.to(tl.float16, bitcast=True).to(tl.float32)\n", ())
    return out


def _fmt(dtype) -> str:
    return FP8_FORMATS[dtype][0]


def cast_text(text: str, dtype) -> tuple[str, str]:
    """(text of the float32 register value of ``text`` cast to float8 ``dtype``, the helper it calls)."""
    name = f"_tf_to_{_fmt(dtype)}"
    return f"{name}({text})", name


def store_text(text: str, dtype) -> tuple[str, str]:
    """(text of the float8 ``dtype`` value to store for the on-grid float32 ``text``, the helper)."""
    name = f"_tf_{_fmt(dtype)}_bits"
    return f"{name}({text})", name


def load_text(text: str, dtype) -> tuple[str, str]:
    """(text of the float32 value of a loaded float8 ``text``, the helper)."""
    name = f"_tf_from_{_fmt(dtype)}"
    return f"{name}({text})", name
