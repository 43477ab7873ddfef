"""Register the attention kernels with :mod:`tilefuse.targets`: ``tilefuse targets`` cross-compiles every
config of the family's spaces (:mod:`.configs`) for every target and checks the matrix instructions.

Each config of a kernel's space (the target's arch class, every head-dim class) is one example, compiled with
a rotating set of score options so that each option reaches every target's code generator: bf16 causal,
fp16 with a boolean mask + ALiBi + soft cap + a ``score_mod`` hook (no band), bf16 sliding window (both
band edges) with dropout, fp16 causal with a ``score_mod`` that reads an operand vector (``ALIBI == 2``), and
head dims that are not powers of two (80, 96). Pointer arguments and the non-unit strides are marked
16-divisible and the head-dim strides are the constant 1, as the JIT specialises a contiguous-D launch.
The ``*_varlen`` kernels are the same configs and options with the VARLEN switch on (packed variable-length
sequences, top-left and bottom-right diagonals in turn; the mask option becomes no mask).
"""
from __future__ import annotations

import triton
import triton.language as tl

from ... import targets
from . import configs
from .kernels import (attn_bwd_dkdv_kernel, attn_bwd_dq_kernel, attn_bwd_preprocess_kernel, attn_combine_kernel,
                      attn_fwd_kernel)

EXPECT_PREFILL = {"sm_80": "mma.sync", "sm_90a": "wgmma", "sm_100a": "tcgen05",
                  "gfx90a": "v_mfma", "gfx942": "v_mfma", "gfx950": "v_mfma"}
# d=256 dK/dV on Blackwell: 32-key tiles, mma.sync (dK + dV alone fill tensor memory's 512 columns)
EXPECT_D256_DKDV = {**EXPECT_PREFILL, "sm_100a": "mma.sync"}
# decode's 16-row tiles are below wgmma's and tcgen05's 64: mma.sync on every NVIDIA target (memory-bound)
EXPECT_DECODE = {"sm_80": "mma.sync", "sm_90a": "mma.sync", "sm_100a": "mma.sync",
                 "gfx90a": "v_mfma", "gfx942": "v_mfma", "gfx950": "v_mfma"}


@triton.jit
def example_relative_bias(score, b, h, q_idx, k_idx):
    """A score_mod of the kind the compiler generates: a relative-position bias per head."""
    return score + 0.01 * (h + 1) * (k_idx - q_idx).to(tl.float32)


@triton.jit
def example_relative_bias_grad(score, b, h, q_idx, k_idx):
    return 1.0


@triton.jit
def example_operand_bias(score, b, h, q_idx, k_idx, operands):
    """A generated mod reading tensors (ALIBI == 2: the operand vector in the slopes' slot): a per-head scale
    and a relative-position table, loads masked past the sequence as a generated mod masks them."""
    rel = tl.minimum(tl.abs(k_idx - q_idx), 7)
    bias = tl.load(operands + 16 + rel * 16 + h, mask=(rel >= 0) & (q_idx < 4096), other=0.0)
    return score * tl.load(operands + h) + bias


@triton.jit
def example_operand_bias_grad(score, b, h, q_idx, k_idx, operands):
    return tl.load(operands + h) + 0.0 * score


# options: (label, dtype, head_dim, constexpr overrides)
_OPTION_SETS = (
    ("bf16 causal", "bf16", None, {"BAND_HI": True}),
    ("fp16 bool mask+alibi+softcap+score_mod", "fp16", None,
     {"MASK_KIND": 2, "ALIBI": True, "SOFTCAP": True, "SCORE_MOD": example_relative_bias}),
    ("bf16 window+dropout", "bf16", None, {"BAND_LO": True, "BAND_HI": True, "DROPOUT": True}),
    ("fp16 causal+generated score_mod with operands", "fp16", None,
     {"BAND_HI": True, "ALIBI": 2, "SCORE_MOD": example_operand_bias, "SCORE_MOD_GRAD": example_operand_bias_grad}),
)
_ODD_HEAD_DIM = {64: 48, 128: 80, 256: 192}  # non-power-of-two head dims: padded block, masked loads


def _signature(fn, dtype: str, mask_kind: int, constexprs: dict) -> tuple[dict, tuple]:
    ptr = {"q_ptr": dtype, "k_ptr": dtype, "v_ptr": dtype, "o_ptr": dtype, "do_ptr": dtype, "dk_ptr": dtype,
           "dv_ptr": dtype, "lse_ptr": "fp32", "delta_ptr": "fp32", "alibi_ptr": "fp32", "part_ptr": "fp32",
           "part_lse_ptr": "fp32", "mask_ptr": "u8" if mask_kind == 2 else dtype, "cu_q_ptr": "i32",
           "cu_k_ptr": "i32"}
    sig, divisible = {}, []
    for name in fn.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name == "dq_ptr":
            sig[name] = "*fp32" if constexprs.get("ATOMIC_DQ") else "*" + dtype
        elif name in ptr:
            sig[name] = "*" + ptr[name]
        elif name in ("sm_scale", "softcap", "dropout_p"):
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
            if name.startswith("stride_"):
                divisible.append(name)
    return sig, tuple(divisible)


def _unit_strides(fn) -> dict:
    # the head-dim strides of contiguous-D tensors are 1: the JIT passes them as constexpr
    return {n: 1 for n in fn.arg_names if n.startswith("stride_") and n.endswith("d")}


def _score_constexprs(overrides: dict) -> dict:
    base = {"BAND_LO": False, "BAND_HI": False, "SOFTCAP": False, "ALIBI": False, "MASK_KIND": 0, "SCORE_MOD": None, "DROPOUT": False,
            "DOT_F32": False, "INPUT_PRECISION": "tf32", "VARLEN": 0, "cu_q_ptr": None, "cu_k_ptr": None}
    return {**base, **overrides}


def _examples_of(kernel: str, fn, target: str, extra: dict, head_dims=(64, 128, 256)) -> list[targets.Example]:
    vendor = targets.vendor_of(target)
    arch = configs.ARCH_OF_TARGET[target]
    out = []
    i = 0
    for hd_class, space in configs.SPACES[(arch, kernel)].items():
        if hd_class not in head_dims:
            i += len(space)
            continue
        for cfg in space:
            label, dtype, _, overrides = _OPTION_SETS[i % len(_OPTION_SETS)]
            head_dim = _ODD_HEAD_DIM[hd_class] if i % 2 else hd_class
            i += 1
            consts = {**_unit_strides(fn), **_score_constexprs(overrides),
                      "INPUT_PRECISION": "ieee" if vendor == "amd" else "tf32",
                      "HEAD_DIM": head_dim, "BLOCK_D": hd_class, "BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n,
                      "GROUP": 2 if "dropout" not in label else 1, **extra}
            if "SCORE_MOD_GRAD" in fn.arg_names:
                consts["SCORE_MOD_GRAD"] = overrides.get("SCORE_MOD_GRAD", example_relative_bias_grad) \
                    if overrides.get("SCORE_MOD") else None
            consts = {k: v for k, v in consts.items() if k in fn.arg_names}
            sig, div = _signature(fn, dtype, consts.get("MASK_KIND", 0), consts)
            out.append(targets.Example(f"{cfg.label()} d{head_dim} {label}", sig, consts,
                                       cfg.launch_options(vendor), div))
    return out


def _fwd_examples(target):
    return _examples_of("fwd", attn_fwd_kernel, target, {"PACK_GQA": False})


def _decode_examples(target):
    return _examples_of("decode", attn_fwd_kernel, target, {"PACK_GQA": True, "DROPOUT": False})


def _dkdv_examples(target):
    return (_examples_of("bwd_dkdv", attn_bwd_dkdv_kernel, target, {"ATOMIC_DQ": True}, (64, 128))
            + _examples_of("bwd_dkdv", attn_bwd_dkdv_kernel, target, {"ATOMIC_DQ": False}, (64, 128))[:1])


def _dkdv_d256_examples(target):
    return _examples_of("bwd_dkdv", attn_bwd_dkdv_kernel, target, {"ATOMIC_DQ": True}, (256,))


def _dq_examples(target):
    return _examples_of("bwd_dq", attn_bwd_dq_kernel, target, {})


def _varlen(fn, examples: list[targets.Example]) -> list[targets.Example]:
    """The same configs and score options with the VARLEN switch on (top-left and bottom-right diagonals in
    turn) and int32 cumulative lengths; no mask tensor (packed sequences take none)."""
    out = []
    for i, ex in enumerate(examples):
        consts = {k: v for k, v in ex.constexprs.items() if k not in ("cu_q_ptr", "cu_k_ptr")}
        consts["VARLEN"] = 1 + i % 2
        if "MASK_KIND" in consts:
            consts["MASK_KIND"] = 0
        sig, div = _signature(fn, ex.signature["q_ptr"][1:], 0, consts)
        label = ex.label.replace("bool mask+", "") + (" varlen" if i % 2 == 0 else " varlen bottom-right")
        out.append(targets.Example(label, sig, consts, ex.options, div))
    return out


def _fwd_varlen_examples(target):
    return _varlen(attn_fwd_kernel, _fwd_examples(target))


def _dkdv_varlen_examples(target):
    return _varlen(attn_bwd_dkdv_kernel, _dkdv_examples(target))


def _dkdv_d256_varlen_examples(target):
    return _varlen(attn_bwd_dkdv_kernel, _dkdv_d256_examples(target))


def _dq_varlen_examples(target):
    return _varlen(attn_bwd_dq_kernel, _dq_examples(target))


def _aux_examples(target):
    opts = {"num_warps": 4}
    pre_c = {"HEAD_DIM": 128, "BLOCK_D": 128, "BLOCK_M": 64, **_unit_strides(attn_bwd_preprocess_kernel)}
    pre_sig, pre_div = _signature(attn_bwd_preprocess_kernel, "bf16", 0, pre_c)
    comb_c = {"HEAD_DIM": 128, "BLOCK_D": 128, "BLOCK_R": 16, "SPLITS": 0, **_unit_strides(attn_combine_kernel)}
    comb_sig, comb_div = _signature(attn_combine_kernel, "bf16", 0, comb_c)
    return [targets.Example("bwd preprocess bf16 d128", pre_sig, pre_c, opts, pre_div),
            targets.Example("decode combine bf16 d128", comb_sig, comb_c, opts, comb_div),
            targets.Example("decode combine bf16 d128, 5 splits unrolled", comb_sig, dict(comb_c, SPLITS=5), opts,
                            comb_div)]


def _register() -> None:
    targets.register(targets.KernelSpec(
        "attention_fwd", family="attention", fn=attn_fwd_kernel, examples=_fwd_examples, expect_mma=EXPECT_PREFILL,
        description="flash-attention forward, online softmax, every config of the space"))
    targets.register(targets.KernelSpec(
        "attention_decode", family="attention", fn=attn_fwd_kernel, examples=_decode_examples,
        expect_mma=EXPECT_DECODE, description="split-KV decode forward, GQA rows packed (mma.sync on NVIDIA)"))
    targets.register(targets.KernelSpec(
        "attention_bwd_dkdv", family="attention", fn=attn_bwd_dkdv_kernel, examples=_dkdv_examples,
        expect_mma=EXPECT_PREFILL, description="attention backward dK/dV (+ atomic dQ), GQA summed in-program"))
    targets.register(targets.KernelSpec(
        "attention_bwd_dkdv_d256", family="attention", fn=attn_bwd_dkdv_kernel, examples=_dkdv_d256_examples,
        expect_mma=EXPECT_D256_DKDV, description="attention backward dK/dV at head dim 256 (mma.sync on sm_100a)"))
    targets.register(targets.KernelSpec(
        "attention_bwd_dq", family="attention", fn=attn_bwd_dq_kernel, examples=_dq_examples,
        expect_mma=EXPECT_PREFILL, description="attention backward dQ, deterministic pass"))
    targets.register(targets.KernelSpec(
        "attention_aux", family="attention", fn=attn_bwd_preprocess_kernel, examples=lambda t: _aux_examples(t)[:1],
        description="attention backward preprocess (delta = rowsum(dO * O))"))
    targets.register(targets.KernelSpec(
        "attention_combine", family="attention", fn=attn_combine_kernel, examples=lambda t: _aux_examples(t)[1:],
        description="split-KV decode combine by logsumexp"))

    # packed variable-length sequences (:mod:`.varlen`): the same kernels and configs with VARLEN on
    targets.register(targets.KernelSpec(
        "attention_fwd_varlen", family="attention", fn=attn_fwd_kernel, examples=_fwd_varlen_examples,
        expect_mma=EXPECT_PREFILL, description="flash-attention forward over packed variable-length sequences"))
    targets.register(targets.KernelSpec(
        "attention_bwd_dkdv_varlen", family="attention", fn=attn_bwd_dkdv_kernel, examples=_dkdv_varlen_examples,
        expect_mma=EXPECT_PREFILL, description="attention backward dK/dV over packed variable-length sequences"))
    targets.register(targets.KernelSpec(
        "attention_bwd_dkdv_varlen_d256", family="attention", fn=attn_bwd_dkdv_kernel,
        examples=_dkdv_d256_varlen_examples, expect_mma=EXPECT_D256_DKDV,
        description="attention backward dK/dV at head dim 256 over packed variable-length sequences"))
    targets.register(targets.KernelSpec(
        "attention_bwd_dq_varlen", family="attention", fn=attn_bwd_dq_kernel, examples=_dq_varlen_examples,
        expect_mma=EXPECT_PREFILL, description="attention backward dQ over packed variable-length sequences"))


_register()
