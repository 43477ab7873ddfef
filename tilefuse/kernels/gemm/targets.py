"""The GEMM family's rows in the target matrix (``tilefuse targets``).

Each registered kernel is compiled ahead of time for sm_80, sm_90a, sm_100a, gfx90a, gfx942 and gfx950 with
the examples below (bf16/fp16 with fused epilogues, the hook, TMA, fp8 where the target has fp8 MMA, int8),
and the matrix-instruction family in the assembly is checked: the GEMM must reach the tensor cores or
matrix cores on every target (a fallback to FMA is a failure).
"""
from __future__ import annotations

import dataclasses
from typing import Any

from ... import targets
from .kernels import gemm_persistent_kernel, gemm_tiled_kernel, quantize_rows_kernel, relayout_kernel
from .configs import PART_BY_TARGET, STREAM_K_MIN_STEPS, WS_CAPABILITY, GemmConfig, split_in_registers, ws_possible
from .epilogue import ACTIVATIONS, QUANT_DIRECT, QUANT_TWO_PASS, example_silu_plus_e0
from . import launching as gemm_launching

# The target matrix (``tilefuse targets``) compiles these examples for every target and checks the MMA
# family in the assembly: the GEMM must reach the tensor cores / matrix cores everywhere.
EXPECT_MMA = {"sm_80": "mma.sync", "sm_90a": "wgmma", "sm_100a": "tcgen05",
              "gfx90a": "v_mfma", "gfx942": "v_mfma", "gfx950": "v_mfma"}
_POINTER_ROLES = {"a_ptr": "in", "b_ptr": "in", "c_ptr": "out", "scale_a_ptr": "fp32", "scale_b_ptr": "fp32",
                  "bias_ptr": "epi", "res_ptr": "epi", "pre_ptr": "fp32", "amax_ptr": "fp32", "ws_ptr": "acc",
                  "lock_ptr": "i32", "e0_ptr": "fp32", "e1_ptr": "fp32", "e2_ptr": "fp32", "e3_ptr": "fp32"}
_UNIT_STRIDES = ("stride_ak", "stride_bn", "stride_cn")  # what a row-major launch specialises to 1


def _example(fn, label: str, target: str, cfg: GemmConfig, *, a="bf16", out="bf16", b_t=False, split_k=1,
             use_tma=False, epilogue: dict | None = None) -> targets.Example:
    part = PART_BY_TARGET[target]
    acc = "i32" if a == "i8" else "fp32"
    unit = set(_UNIT_STRIDES) - ({"stride_bn"} if b_t else set()) | ({"stride_bk"} if b_t else set())
    epi = dict(EPILOGUE=None, ACTIVATION=0, BIAS_MODE=0, HAS_RESIDUAL=False, SCALE_A_MODE=0, SCALE_B_MODE=0,
               HAS_ALPHA=False, STORE_PRE=False, QUANT=0, QMAX=1.0, Q_INT=False, Q_GRID_MANT=0, Q_GRID_EMIN=0,
               RAW_INT=out == "i32", ACC_INT=a == "i8", INPUT_PRECISION="ieee", EVEN_K=True,
               USE_TMA=use_tma, A_T=False, B_T=b_t, STORE_C=True)
    epi.update(epilogue or {})
    ws = bool(cfg.warp_specialize and use_tma and ws_possible(cfg, part, epi["EPILOGUE"] is not None))
    constexprs: dict[str, Any] = dict(epi, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
                                      GROUP_M=cfg.group_m)
    # TMA descriptors made on the host, as the launches make them on NVIDIA (gemm_launching.host_descriptors)
    host = bool(use_tma and part.vendor == "nvidia" and gemm_launching.HOST_DESCRIPTORS and not ws)
    constexprs["HOST_DESC"] = host
    constexprs["B_HINT"] = bool(cfg.b_evict_first and host)  # compiled through ptx_hints' stage hook
    if fn is gemm_tiled_kernel:
        constexprs["SPLIT_K"] = split_k
        constexprs["WARP_SPECIALIZE"] = ws and split_k == 1
        constexprs["B_STREAM"] = cfg.b_stream and not use_tma
        constexprs["SPLIT_IN_REGS"] = split_in_registers(dataclasses.replace(cfg, split_k=split_k))
    else:
        constexprs.update(NUM_PROGRAMS=part.multiprocessors, C_TMA=use_tma and out != "i32",
                          EPI_SUBTILE=cfg.epi_subtile, FLATTEN=cfg.flatten, WARP_SPECIALIZE=ws,
                          STREAM_K=cfg.stream_k and not ws, SK_MIN_STEPS=STREAM_K_MIN_STEPS)
    descs = {}
    if host:
        a_block, b_block, c_block = gemm_launching.descriptor_blocks(cfg, epi["A_T"], b_t)
        descs["a_desc_h"] = f"tensordesc<{a}[{a_block[0]}, {a_block[1]}]>"
        descs["b_desc_h"] = f"tensordesc<{a}[{b_block[0]}, {b_block[1]}]>"
        if constexprs.get("C_TMA"):
            descs["c_desc_h"] = f"tensordesc<{out}[{c_block[0]}, {c_block[1]}]>"
    signature: dict[str, str] = {}
    for name in fn.arg_names:
        if name in descs:
            signature[name] = descs[name]
        elif name.endswith("_desc_h"):
            signature[name] = "*fp32"  # unused: no descriptor made on the host for it
        elif name in constexprs:
            signature[name] = "constexpr"
        elif name in unit:
            signature[name] = "constexpr"
            constexprs[name] = 1
        elif name in _POINTER_ROLES:
            role = _POINTER_ROLES[name]
            signature[name] = "*" + {"in": a, "out": out, "epi": "bf16" if out not in ("fp32", "i32") else "fp32",
                                     "acc": acc}.get(role, role)
        elif name in ("alpha", "beta"):
            signature[name] = "fp32"
        else:
            signature[name] = "i32"
    # what the JIT sees for 16-aligned sizes and strides (0, the folded batch stride, counts as divisible)
    divisible = tuple(n for n in signature if signature[n] == "i32" and (n in ("M", "N", "K") or n.startswith("stride_")))
    return targets.Example(label, signature, constexprs, cfg.launch_options(part.vendor), divisible)


def _fp8_name(target: str) -> str | None:
    # OCP e4m3 on Hopper, Blackwell and gfx950; gfx942 has the fnuz variant; no fp8 MMA on sm_80 / gfx90a
    return {"sm_90a": "fp8e4nv", "sm_100a": "fp8e4nv", "gfx950": "fp8e4nv", "gfx942": "fp8e4b8"}.get(target)


def _tiled_examples(target: str) -> list[targets.Example]:
    amd = PART_BY_TARGET[target].vendor == "amd"
    tma = PART_BY_TARGET[target].has_tma
    if amd:
        big = GemmConfig("tiled", 256, 128, 64, 8, num_warps=8, num_stages=2, waves_per_eu=2,
                         matrix_instr_nonkdim=16, kpack=_kpack(target))
    else:
        # 8 warps, as the NVIDIA spaces run 128x128 tiles with an epilogue: at 4 warps (128 fp32 accumulators a
        # thread) the bias+GeLU, hook and quantising epilogues spilled 32-1032 B on sm_80/sm_90a/sm_100a; at 8
        # they spill nothing (140-254 registers)
        big = GemmConfig("tiled", 128, 128, 64, 8, num_warps=8, num_stages=3)
    gelu = {"ACTIVATION": ACTIVATIONS["gelu"], "BIAS_MODE": 1}
    out = [_example(gemm_tiled_kernel, "bf16 bias+gelu", target, big, epilogue=gelu),
           _example(gemm_tiled_kernel, "fp16 hook silu+e0, B^T", target, big, a="fp16", out="fp16", b_t=True,
                    epilogue={"EPILOGUE": example_silu_plus_e0, "HAS_RESIDUAL": True, "HAS_ALPHA": True})]
    if tma:
        out.append(_example(gemm_tiled_kernel, "bf16 tma quant->fp8 2-pass", target, big, use_tma=True,
                            epilogue={"QUANT": QUANT_TWO_PASS, **gelu}))
    int8_cfg = dataclasses.replace(big, block_k=128 if not amd else 64)
    fp8 = _fp8_name(target)
    if fp8:
        out.append(_example(gemm_tiled_kernel, f"{fp8} row scales->bf16", target, int8_cfg, a=fp8, out="bf16",
                            b_t=True, use_tma=tma, epilogue={"SCALE_A_MODE": 2, "SCALE_B_MODE": 2}))
    return out


def _int8_examples(target: str) -> list[targets.Example]:
    amd = PART_BY_TARGET[target].vendor == "amd"
    if amd:
        cfg = GemmConfig("tiled", 256, 128, 64, 8, num_warps=8, num_stages=2, waves_per_eu=2, matrix_instr_nonkdim=16,
                         kpack=_kpack(target))
    else:
        cfg = GemmConfig("tiled", 128, 128, 128, 8, num_warps=4, num_stages=3)
    return [_example(gemm_tiled_kernel, "int8->int32", target, cfg, a="i8", out="i32", b_t=True),
            _example(gemm_tiled_kernel, "int8 row scales->bf16", target, cfg, a="i8", out="bf16", b_t=True,
                     epilogue={"SCALE_A_MODE": 2, "SCALE_B_MODE": 2, "BIAS_MODE": 1})]


def _kpack(target: str) -> int:
    return 1 if target == "gfx950" else 2  # kpack is deprecated (forced to 1) from gfx950 on


def _splitk_examples(target: str) -> list[targets.Example]:
    amd = PART_BY_TARGET[target].vendor == "amd"
    if amd:
        cfg = GemmConfig("tiled", 64, 64, 256, 1, split_k=4, num_warps=4, num_stages=2, matrix_instr_nonkdim=16,
                         kpack=_kpack(target))
    else:
        # BLOCK_M 128: tcgen05 and wgmma both want 64+ rows a warpgroup (decode's BLOCK_M=16 runs mma.sync,
        # as memory-bound code may: its own row in the matrix would read mma.sync on sm_90a)
        cfg = GemmConfig("tiled", 128, 64, 128, 1, split_k=4, num_warps=4, num_stages=4)
    tma = PART_BY_TARGET[target].has_tma
    return [_example(gemm_tiled_kernel, "bf16 split-K 4 bias", target, cfg, split_k=4, use_tma=tma,
                     epilogue={"BIAS_MODE": 1}),
            _example(gemm_tiled_kernel, "fp16 split-K 4 quant->int8", target, cfg, a="fp16", out="i8", split_k=4,
                     epilogue={"QUANT": QUANT_DIRECT, "QMAX": 127.0, "Q_INT": True})]


def _decode_stream_examples(target: str) -> list[targets.Example]:
    # decode (M <= 16): the decode class's b_stream config (16-row tiles, B streamed into registers with the L2
    # evict-first hint), K-major B as nn.Linear's weight gives it; split-K 3 (its H200 split) with a bias epilogue
    cfg = GemmConfig("tiled", 16, 64, 128, 1, split_k=3, num_warps=4, num_stages=1, b_stream=True)
    return [_example(gemm_tiled_kernel, "bf16 B streamed, split-K 3 bias", target, cfg, b_t=True, split_k=3,
                     epilogue={"BIAS_MODE": 1})]


def _skinny_hint_examples(target: str) -> list[targets.Example]:
    # skinny (64 < M <= 256): the skinny class's first config, B's TMA loads evict-first in L2 (B_HINT: the
    # policy is written into the PTX by ptx_hints), plain and with bias + GeLU
    cfg = GemmConfig("tiled", 64, 128, 64, 8, num_warps=4, num_stages=8, tma=True, b_evict_first=True)
    return [_example(gemm_tiled_kernel, "bf16 B evict-first", target, cfg, use_tma=True),
            _example(gemm_tiled_kernel, "bf16 B evict-first bias+gelu", target, cfg, use_tma=True,
                     epilogue={"ACTIVATION": ACTIVATIONS["gelu"], "BIAS_MODE": 1})]


def _persistent_examples(target: str) -> list[targets.Example]:
    part = PART_BY_TARGET[target]
    if part.vendor == "amd":
        cfg = GemmConfig("persistent", 256, 128, 64, 8, num_warps=8, num_stages=2, waves_per_eu=2,
                         matrix_instr_nonkdim=16, kpack=_kpack(target))
    elif part.has_tma:
        cfg = GemmConfig("persistent", 128, 256, 64, 8, num_warps=8, num_stages=3, tma=True)
    else:
        cfg = GemmConfig("persistent", 128, 128, 64, 8, num_warps=4, num_stages=3)
    gelu = {"ACTIVATION": ACTIVATIONS["gelu_tanh"], "BIAS_MODE": 1, "HAS_RESIDUAL": True}
    out = [_example(gemm_persistent_kernel, "bf16 bias+gelu_tanh+res", target, cfg, use_tma=part.has_tma,
                    epilogue=gelu),
           _example(gemm_persistent_kernel, "fp16 sub2 silu", target, dataclasses.replace(cfg, epi_subtile=2),
                    a="fp16", out="fp16", use_tma=part.has_tma,
                    epilogue={"ACTIVATION": ACTIVATIONS["silu"]})]
    # stream-K tail (atomics, a dynamic piece loop) with the epilogue's column halves
    out.append(_example(gemm_persistent_kernel, "bf16 stream-K sub2 bias+gelu", target,
                        dataclasses.replace(cfg, stream_k=True, epi_subtile=2), use_tma=part.has_tma,
                        epilogue={"ACTIVATION": ACTIVATIONS["gelu"], "BIAS_MODE": 1}))
    if part.capability == WS_CAPABILITY:
        ws = GemmConfig("persistent", 128, 256, 64, 8, num_warps=4, num_stages=3, tma=True, warp_specialize=True)
        out.append(_example(gemm_persistent_kernel, "bf16 warp-specialised bias+gelu", target, ws, use_tma=True,
                            epilogue={"ACTIVATION": ACTIVATIONS["gelu"], "BIAS_MODE": 1}))
    fp8 = _fp8_name(target)
    if fp8:
        wide = dataclasses.replace(cfg, block_k=128 if part.vendor == "nvidia" else 64)
        out.append(_example(gemm_persistent_kernel, f"{fp8} row scales", target, wide, a=fp8, out="bf16",
                            b_t=True, use_tma=part.has_tma, epilogue={"SCALE_A_MODE": 2, "SCALE_B_MODE": 2}))
    return out


def _quantize_examples(target: str) -> list[targets.Example]:
    sig = {n: "i32" for n in quantize_rows_kernel.arg_names}
    q = {"sm_80": "i8", "gfx90a": "i8", "gfx942": "fp8e4b8"}.get(target, "fp8e4nv")  # no e4m3 on sm_80 / gfx90a
    sig.update(y_ptr="*bf16", q_ptr="*" + q, scale_ptr="*fp32",
               amax_ptr="*fp32", stride_yn="constexpr", stride_qn="constexpr", QMAX="constexpr", Q_INT="constexpr",
               Q_GRID_MANT="constexpr", Q_GRID_EMIN="constexpr", BLOCK_R="constexpr", BLOCK_N="constexpr",
               BLOCK_P="constexpr")
    consts = dict(stride_yn=1, stride_qn=1, QMAX={"i8": 127.0, "fp8e4b8": 240.0}.get(q, 448.0), Q_INT=q == "i8",
                  Q_GRID_MANT=0,
                  Q_GRID_EMIN=0, BLOCK_R=16, BLOCK_N=512, BLOCK_P=64)
    return [targets.Example("bf16->fp8 rows", sig, consts, {"num_warps": 4}, ("N", "stride_yr", "stride_qr"))]


def _relayout_examples(target: str) -> list[targets.Example]:
    sig = {n: "i32" for n in relayout_kernel.arg_names}
    # an N-major (K, N) fp32 B copied into (N, K) rows: unit strides along c on the load side, r on the store
    sig.update(x_ptr="*fp32", y_ptr="*fp32", stride_xc="constexpr", stride_yr="constexpr", BLOCK_R="constexpr",
               BLOCK_C="constexpr")
    consts = dict(stride_xc=1, stride_yr=1, BLOCK_R=64, BLOCK_C=64)
    divisible = ("R", "C", "stride_xz", "stride_xr", "stride_yz", "stride_yc")
    one_byte = dict(sig, x_ptr="*i8", y_ptr="*i8")  # fp8 / int8 operands: 128 x 128 tiles
    return [targets.Example("fp32 N-major -> K-major", sig, consts, {"num_warps": 4}, divisible),
            targets.Example("1-byte N-major -> K-major", one_byte, dict(consts, BLOCK_R=128, BLOCK_C=128),
                            {"num_warps": 4}, divisible)]


def _register() -> None:
    common = dict(family="gemm", expect_mma=EXPECT_MMA)
    targets.register(targets.KernelSpec(
        "gemm_tiled", fn=gemm_tiled_kernel, examples=_tiled_examples,
        description="tiled GEMM, grouped tile order, fused epilogue (bias/act/residual/scales/quant/hook)", **common))
    # triton 3.6 lowers an int8 dot on sm_100a to mma.sync (no tcgen05 kind::i8 path): that is what is checked
    targets.register(targets.KernelSpec(
        "gemm_int8", fn=gemm_tiled_kernel, examples=_int8_examples, family="gemm",
        expect_mma={**EXPECT_MMA, "sm_100a": "mma.sync"},
        description="int8 x int8 -> int32 (or dequantised with scales); mma.sync on sm_100a in triton 3.6"))
    targets.register(targets.KernelSpec(
        "gemm_splitk", fn=gemm_tiled_kernel, examples=_splitk_examples,
        description="split-K GEMM for M <= 256: partials reduced by the last split (atomic counter)", **common))
    # 16-row tiles are below wgmma's and tcgen05's 64: mma.sync on every NVIDIA target (memory-bound code)
    targets.register(targets.KernelSpec(
        "gemm_decode_stream", fn=gemm_tiled_kernel, examples=_decode_stream_examples, family="gemm",
        targets=("sm_80", "sm_90a", "sm_100a"), expect_mma={t: "mma.sync" for t in ("sm_80", "sm_90a", "sm_100a")},
        description="decode GEMM (M <= 64): B streamed once with an L2 evict-first hint, split-K; NVIDIA only"))
    # the hint rides on TMA loads through host-made descriptors: the TMA targets only
    targets.register(targets.KernelSpec(
        "gemm_skinny_hint", fn=gemm_tiled_kernel, examples=_skinny_hint_examples, family="gemm",
        targets=("sm_90a", "sm_100a"), expect_mma={"sm_90a": "wgmma", "sm_100a": "tcgen05"},
        description="skinny GEMM (M <= 256): B's TMA loads evict-first in L2 (PTX rewritten by ptx_hints); "
                    "NVIDIA TMA targets only"))
    targets.register(targets.KernelSpec(
        "gemm_persistent", fn=gemm_persistent_kernel, examples=_persistent_examples,
        description="persistent GEMM, one program an SM; TMA loads and store on sm_90a/sm_100a", **common))
    targets.register(targets.KernelSpec(
        "gemm_quantize_rows", fn=quantize_rows_kernel, examples=_quantize_examples, family="gemm",
        description="second pass of per-row output quantisation (row amax from tile partials)"))
    targets.register(targets.KernelSpec(
        "gemm_relayout", fn=relayout_kernel, examples=_relayout_examples, family="gemm",
        description="transposing copy: an operand made K-major for tf32, fp8 and int8 wgmma (sm_90)"))


_register()


def example_for(cfg: GemmConfig, target: str, *, a: str = "bf16", out: str = "bf16", b_t: bool = False,
                epilogue: dict | None = None, label: str | None = None) -> tuple[Any, targets.Example]:
    """(kernel, example) compiling ``cfg`` for ``target``: how the tuning space is inspected ahead of time
    (registers, spills, shared memory of each candidate) on a machine with no GPU."""
    fn = gemm_tiled_kernel if cfg.kernel == "tiled" else gemm_persistent_kernel
    return fn, _example(fn, label or cfg.label(), target, cfg, a=a, out=out, b_t=b_t, split_k=cfg.split_k,
                        use_tma=cfg.tma, epilogue=epilogue)
