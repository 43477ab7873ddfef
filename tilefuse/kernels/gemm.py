"""The Triton GEMM family: C = epilogue(A @ B), one source for the library API and the compiler.

Kernels
-------
- :func:`gemm_tiled_kernel`: one output tile a program, tiles in grouped (L2-aware) order, batched on grid
  axis 1. ``SPLIT_K > 1`` cuts K into ranges run by separate programs (the split-K variant, for
  M <= 256 where the tiles alone leave SMs idle): each writes its fp32 partial tile to a workspace, and
  the last to arrive at the tile's counter (an atomic) sums the partials in a fixed order, runs the
  epilogue, stores and resets the counter. No second launch, deterministic.
- :func:`gemm_persistent_kernel`: one program an SM looping over tiles; on Hopper/Blackwell the loads and
  the store go through TMA tensor descriptors made in the kernel (``tl.make_tensor_descriptor``, which
  needs :func:`triton.set_allocator`; detected, with a clean fallback to pointer loads).
- :func:`quantize_rows_kernel`: the second pass of output quantisation when a row spans several tiles.

Both GEMM kernels take the same arguments in the same order and end in
:func:`tilefuse.kernels.gemm_epilogue.apply_epilogue` (bias, activation, residual, alpha/beta, fp8/int8
dequant scales, the ``EPILOGUE`` hook; see that module for the hook's contract), then cast and store, or
quantise to fp8/int8 with a per-row scale from the row amax.

Host side: :func:`gemm_raw` (check -> allocate -> launch on 3-D operands) and
:func:`gemm_with_epilogue`, the entry the compiler calls with a generated hook. Configs come from
:mod:`tilefuse.kernels.gemm_tuning` (disk-cached autotuning on a GPU, the heuristic default otherwise).
"""
from __future__ import annotations

import dataclasses
import math
import threading
from typing import Any, Sequence

import torch
import triton
import triton.language as tl

from .. import config as tf_config
from .. import device
from .gemm_checks import (FLOAT_INPUTS, TMA_ALIGN, Epilogue, GemmOutputs, MNOperand, Operands, fp8_grid,  # noqa: F401
                          prepare, qmax)
from .gemm_configs import SAFE_CONFIG, GemmConfig
from .gemm_epilogue import (ACTIVATIONS, BIAS_MODES, NUM_EXTRA_OPERANDS, QUANT_DIRECT, QUANT_EPS, QUANT_NONE,
                            QUANT_TWO_PASS, SCALE_MODES_A, SCALE_MODES_B, apply_epilogue, quantize_values)


# ============================================================================================ kernels
@triton.jit
def tile_coords(tile, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """Grouped order: GROUP_M consecutive row-tiles walk the columns together, so the B panels they share
    are read from HBM once and then hit in L2 (and A's rows stay hot across the group)."""
    in_group = GROUP_M * num_pid_n
    group = tile // in_group
    first_m = group * GROUP_M
    size_m = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (tile % in_group) % size_m
    pid_n = (tile % in_group) // size_m
    return pid_m, pid_n


@triton.jit
def mainloop_pointers(a_ptr, b_ptr, offs_m, offs_n, mask_m, mask_n, kt0, kt1, K,
                      stride_am, stride_ak, stride_bk, stride_bn,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      ACC_INT: tl.constexpr, INPUT_PRECISION: tl.constexpr, EVEN_K: tl.constexpr):
    """K steps kt0 .. kt1-1 with masked pointer loads (cp.async pipelining on NVIDIA)."""
    offs_k = kt0 * BLOCK_K + tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    if ACC_INT:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kt in range(kt0, kt1):
        if EVEN_K:
            a = tl.load(a_ptrs, mask=mask_m[:, None], other=0.0)
            b = tl.load(b_ptrs, mask=mask_n[None, :], other=0.0)
        else:
            k_ok = tl.arange(0, BLOCK_K) < K - kt * BLOCK_K
            a = tl.load(a_ptrs, mask=mask_m[:, None] & k_ok[None, :], other=0.0)
            b = tl.load(b_ptrs, mask=k_ok[:, None] & mask_n[None, :], other=0.0)
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION, out_dtype=acc.dtype)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    return acc


@triton.jit
def load_a_tile(a_desc, m0, k0, A_T: tl.constexpr):
    if A_T:
        return a_desc.load([k0, m0]).T
    else:
        return a_desc.load([m0, k0])


@triton.jit
def load_b_tile(b_desc, k0, n0, B_T: tl.constexpr):
    if B_T:
        return b_desc.load([n0, k0]).T
    else:
        return b_desc.load([k0, n0])


@triton.jit
def make_ab_descriptors(a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                        A_T: tl.constexpr, B_T: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    # A column-major / B K-contiguous are described transposed, so the unit stride is always last (TMA's
    # rule) and the tile is transposed in shared memory for free by the MMA's operand layout.
    if A_T:
        a_desc = tl.make_tensor_descriptor(a_ptr, [K, M], [stride_ak, 1], [BLOCK_K, BLOCK_M])
    else:
        a_desc = tl.make_tensor_descriptor(a_ptr, [M, K], [stride_am, 1], [BLOCK_M, BLOCK_K])
    if B_T:
        b_desc = tl.make_tensor_descriptor(b_ptr, [N, K], [stride_bn, 1], [BLOCK_N, BLOCK_K])
    else:
        b_desc = tl.make_tensor_descriptor(b_ptr, [K, N], [stride_bk, 1], [BLOCK_K, BLOCK_N])
    return a_desc, b_desc


@triton.jit
def mainloop_tma(a_desc, b_desc, m0, n0, kt0, kt1,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 A_T: tl.constexpr, B_T: tl.constexpr, ACC_INT: tl.constexpr, INPUT_PRECISION: tl.constexpr):
    """K steps kt0 .. kt1-1 through TMA descriptors: no masks, out-of-bounds reads are zero."""
    if ACC_INT:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kt in range(kt0, kt1):
        a = load_a_tile(a_desc, m0, kt * BLOCK_K, A_T)
        b = load_b_tile(b_desc, kt * BLOCK_K, n0, B_T)
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION, out_dtype=acc.dtype)
    return acc



@triton.jit
def finish_tile(acc, m0, n0, offs_m, offs_n, z, part, M, N, c_ptr, c_desc, stride_cz, stride_cm, stride_cn,
                scale_a_ptr, scale_b_ptr, bias_ptr, stride_bias_z, stride_bias,
                res_ptr, stride_rz, stride_rm, stride_rn, pre_ptr, stride_pz, stride_pm, stride_pn,
                amax_ptr, stride_amax_p, alpha, beta,
                e0_ptr, e0_sz, e0_sm, e0_sn, e1_ptr, e1_sz, e1_sm, e1_sn,
                e2_ptr, e2_sz, e2_sm, e2_sn, e3_ptr, e3_sz, e3_sm, e3_sn,
                EPILOGUE: tl.constexpr, ACTIVATION: tl.constexpr, BIAS_MODE: tl.constexpr,
                HAS_RESIDUAL: tl.constexpr, SCALE_A_MODE: tl.constexpr, SCALE_B_MODE: tl.constexpr,
                HAS_ALPHA: tl.constexpr, STORE_PRE: tl.constexpr, QUANT: tl.constexpr, QMAX: tl.constexpr,
                Q_INT: tl.constexpr, Q_GRID_MANT: tl.constexpr, Q_GRID_EMIN: tl.constexpr, RAW_INT: tl.constexpr,
                C_TMA: tl.constexpr):
    """Epilogue in fp32 registers, then the tile's one store (or its quantised store)."""
    mask_m = offs_m < M
    mask_n = offs_n < N
    mask = mask_m[:, None] & mask_n[None, :]
    z64 = z.to(tl.int64)
    c_ptrs = c_ptr + z64 * stride_cz + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    if RAW_INT:
        value = acc
    else:
        value = apply_epilogue(acc, offs_m, offs_n, mask_m, mask_n, scale_a_ptr, scale_b_ptr,
                               bias_ptr + z64 * stride_bias_z, stride_bias,
                               res_ptr + z64 * stride_rz, stride_rm, stride_rn,
                               pre_ptr + z64 * stride_pz, stride_pm, stride_pn, alpha, beta,
                               e0_ptr + z64 * e0_sz, e0_sm, e0_sn, e1_ptr + z64 * e1_sz, e1_sm, e1_sn,
                               e2_ptr + z64 * e2_sz, e2_sm, e2_sn, e3_ptr + z64 * e3_sz, e3_sm, e3_sn,
                               EPILOGUE, ACTIVATION, BIAS_MODE, HAS_RESIDUAL, SCALE_A_MODE, SCALE_B_MODE,
                               HAS_ALPHA, STORE_PRE)
    if QUANT == 2:
        # the tile holds whole rows (N <= BLOCK_N): quantise here
        row_amax = tl.max(tl.where(mask, tl.abs(value), 0.0), axis=1)
        scale = tl.maximum(row_amax, 1e-12) / QMAX
        q = quantize_values(value, scale[:, None], QMAX, Q_INT, Q_GRID_MANT, Q_GRID_EMIN)
        tl.store(c_ptrs, q.to(c_ptr.dtype.element_ty), mask=mask)
        tl.store(amax_ptr + z64 * M + offs_m, scale, mask=mask_m)
    else:
        if C_TMA:
            c_desc.store([m0, n0], value.to(c_desc.dtype))
        else:
            tl.store(c_ptrs, value.to(c_ptr.dtype.element_ty), mask=mask)
        if QUANT == 1:
            # a row spans several tiles: the value went to a wide temporary; keep this tile's row amax
            row_amax = tl.max(tl.where(mask, tl.abs(value), 0.0), axis=1)
            tl.store(amax_ptr + part * stride_amax_p + z64 * M + offs_m, row_amax, mask=mask_m)


@triton.jit
def gemm_tiled_kernel(
        a_ptr, b_ptr, c_ptr, M, N, K, Z,
        stride_az, stride_am, stride_ak, stride_bz, stride_bk, stride_bn, stride_cz, stride_cm, stride_cn,
        scale_a_ptr, scale_b_ptr, bias_ptr, stride_bias_z, stride_bias,
        res_ptr, stride_rz, stride_rm, stride_rn, pre_ptr, stride_pz, stride_pm, stride_pn,
        amax_ptr, stride_amax_p, ws_ptr, lock_ptr, alpha, beta,
        e0_ptr, e0_sz, e0_sm, e0_sn, e1_ptr, e1_sz, e1_sm, e1_sn,
        e2_ptr, e2_sz, e2_sm, e2_sn, e3_ptr, e3_sz, e3_sm, e3_sn,
        EPILOGUE: tl.constexpr, ACTIVATION: tl.constexpr, BIAS_MODE: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
        SCALE_A_MODE: tl.constexpr, SCALE_B_MODE: tl.constexpr, HAS_ALPHA: tl.constexpr,
        STORE_PRE: tl.constexpr, QUANT: tl.constexpr, QMAX: tl.constexpr, Q_INT: tl.constexpr,
        Q_GRID_MANT: tl.constexpr, Q_GRID_EMIN: tl.constexpr, RAW_INT: tl.constexpr, ACC_INT: tl.constexpr, INPUT_PRECISION: tl.constexpr, EVEN_K: tl.constexpr,
        USE_TMA: tl.constexpr, A_T: tl.constexpr, B_T: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
        SPLIT_K: tl.constexpr):
    """One tile a program (grid: tiles x SPLIT_K, Z); SPLIT_K > 1 is the split-K variant."""
    pid = tl.program_id(0)
    z = tl.program_id(1)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    tile = pid % num_tiles
    pid_k = pid // num_tiles
    pid_m, pid_n = tile_coords(tile, num_pid_m, num_pid_n, GROUP_M)
    k_total = tl.cdiv(K, BLOCK_K)
    k_per_split = tl.cdiv(k_total, SPLIT_K)
    kt0 = pid_k * k_per_split
    kt1 = tl.minimum(kt0 + k_per_split, k_total)
    m0 = pid_m * BLOCK_M
    n0 = pid_n * BLOCK_N
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_n = n0 + tl.arange(0, BLOCK_N)
    if USE_TMA:
        a_desc, b_desc = make_ab_descriptors(a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                                             A_T, B_T, BLOCK_M, BLOCK_N, BLOCK_K)
        acc = mainloop_tma(a_desc, b_desc, m0, n0, kt0, kt1, BLOCK_M, BLOCK_N, BLOCK_K,
                           A_T, B_T, ACC_INT, INPUT_PRECISION)
    else:
        z64 = z.to(tl.int64)
        acc = mainloop_pointers(a_ptr + z64 * stride_az, b_ptr + z64 * stride_bz, offs_m, offs_n,
                                offs_m < M, offs_n < N, kt0, kt1, K, stride_am, stride_ak, stride_bk, stride_bn,
                                BLOCK_M, BLOCK_N, BLOCK_K, ACC_INT, INPUT_PRECISION, EVEN_K)
    if SPLIT_K > 1:
        tile_id = z * num_tiles + tile
        offs_t = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
        ws_tile = ws_ptr + tile_id.to(tl.int64) * (SPLIT_K * BLOCK_M * BLOCK_N)
        tl.store(ws_tile + pid_k * (BLOCK_M * BLOCK_N) + offs_t, acc)
        tl.debug_barrier()  # every thread's share of the partial is written before the counter moves
        arrived = tl.atomic_add(lock_ptr + tile_id, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT_K - 1:
            # The last split of this tile sums every partial in split order (the same result whichever
            # split arrives last), reading through L2 (.cg: other SMs wrote them), FIX_M rows at a time:
            # a whole second tile of partial sums would double the accumulator's registers (a 128x128
            # fp32 tile is 128 registers a thread at 4 warps; two spill).
            FIX_M: tl.constexpr = 32 if BLOCK_M > 32 else BLOCK_M
            offs_r = tl.arange(0, FIX_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
            for r0 in range(0, BLOCK_M, FIX_M):
                part_ptr = ws_tile + r0 * BLOCK_N + offs_r
                acc_r = tl.load(part_ptr, cache_modifier=".cg")
                for s in tl.static_range(1, SPLIT_K):
                    acc_r += tl.load(part_ptr + s * (BLOCK_M * BLOCK_N), cache_modifier=".cg")
                finish_tile(acc_r, m0 + r0, n0, m0 + r0 + tl.arange(0, FIX_M), offs_n, z, pid_n, M, N, c_ptr, c_ptr,
                            stride_cz, stride_cm, stride_cn,
                            scale_a_ptr, scale_b_ptr, bias_ptr, stride_bias_z, stride_bias,
                            res_ptr, stride_rz, stride_rm, stride_rn, pre_ptr, stride_pz, stride_pm, stride_pn,
                            amax_ptr, stride_amax_p, alpha, beta,
                            e0_ptr, e0_sz, e0_sm, e0_sn, e1_ptr, e1_sz, e1_sm, e1_sn,
                            e2_ptr, e2_sz, e2_sm, e2_sn, e3_ptr, e3_sz, e3_sm, e3_sn,
                            EPILOGUE, ACTIVATION, BIAS_MODE, HAS_RESIDUAL, SCALE_A_MODE, SCALE_B_MODE,
                            HAS_ALPHA, STORE_PRE, QUANT, QMAX, Q_INT, Q_GRID_MANT, Q_GRID_EMIN, RAW_INT, False)
            tl.atomic_xchg(lock_ptr + tile_id, 0)  # the counter is zero again for the next launch
    else:
        finish_tile(acc, m0, n0, offs_m, offs_n, z, pid_n, M, N, c_ptr, c_ptr, stride_cz, stride_cm, stride_cn,
                    scale_a_ptr, scale_b_ptr, bias_ptr, stride_bias_z, stride_bias,
                    res_ptr, stride_rz, stride_rm, stride_rn, pre_ptr, stride_pz, stride_pm, stride_pn,
                    amax_ptr, stride_amax_p, alpha, beta,
                    e0_ptr, e0_sz, e0_sm, e0_sn, e1_ptr, e1_sz, e1_sm, e1_sn,
                    e2_ptr, e2_sz, e2_sm, e2_sn, e3_ptr, e3_sz, e3_sm, e3_sn,
                    EPILOGUE, ACTIVATION, BIAS_MODE, HAS_RESIDUAL, SCALE_A_MODE, SCALE_B_MODE,
                    HAS_ALPHA, STORE_PRE, QUANT, QMAX, Q_INT, Q_GRID_MANT, Q_GRID_EMIN, RAW_INT, False)


@triton.jit
def gemm_persistent_kernel(
        a_ptr, b_ptr, c_ptr, M, N, K, Z,
        stride_az, stride_am, stride_ak, stride_bz, stride_bk, stride_bn, stride_cz, stride_cm, stride_cn,
        scale_a_ptr, scale_b_ptr, bias_ptr, stride_bias_z, stride_bias,
        res_ptr, stride_rz, stride_rm, stride_rn, pre_ptr, stride_pz, stride_pm, stride_pn,
        amax_ptr, stride_amax_p, ws_ptr, lock_ptr, alpha, beta,
        e0_ptr, e0_sz, e0_sm, e0_sn, e1_ptr, e1_sz, e1_sm, e1_sn,
        e2_ptr, e2_sz, e2_sm, e2_sn, e3_ptr, e3_sz, e3_sm, e3_sn,
        EPILOGUE: tl.constexpr, ACTIVATION: tl.constexpr, BIAS_MODE: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
        SCALE_A_MODE: tl.constexpr, SCALE_B_MODE: tl.constexpr, HAS_ALPHA: tl.constexpr,
        STORE_PRE: tl.constexpr, QUANT: tl.constexpr, QMAX: tl.constexpr, Q_INT: tl.constexpr,
        Q_GRID_MANT: tl.constexpr, Q_GRID_EMIN: tl.constexpr, RAW_INT: tl.constexpr, ACC_INT: tl.constexpr, INPUT_PRECISION: tl.constexpr, EVEN_K: tl.constexpr,
        USE_TMA: tl.constexpr, A_T: tl.constexpr, B_T: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
        NUM_PROGRAMS: tl.constexpr, C_TMA: tl.constexpr, EPI_SUBTILE: tl.constexpr, FLATTEN: tl.constexpr,
        WARP_SPECIALIZE: tl.constexpr):
    """One program an SM (grid: min(NUM_PROGRAMS, tiles)), looping over the Z x tiles in grouped order."""
    start = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    k_total = tl.cdiv(K, BLOCK_K)
    SUB_N: tl.constexpr = BLOCK_N // EPI_SUBTILE
    if USE_TMA:
        a_desc, b_desc = make_ab_descriptors(a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                                             A_T, B_T, BLOCK_M, BLOCK_N, BLOCK_K)
    if C_TMA:
        c_desc = tl.make_tensor_descriptor(c_ptr, [M, N], [stride_cm, 1], [BLOCK_M, SUB_N])
    else:
        c_desc = c_ptr
    # The epilogue recomputes its tile from a counter of its own: one value live in both the loads'
    # prologue and the epilogue defeats the Blackwell software pipeliner (triton tutorial 09's note).
    tile_c = start - NUM_PROGRAMS
    for tile in tl.range(start, num_tiles * Z, NUM_PROGRAMS, flatten=FLATTEN, warp_specialize=WARP_SPECIALIZE):
        z = tile // num_tiles
        pid_m, pid_n = tile_coords(tile % num_tiles, num_pid_m, num_pid_n, GROUP_M)
        if USE_TMA:
            acc = mainloop_tma(a_desc, b_desc, pid_m * BLOCK_M, pid_n * BLOCK_N, 0, k_total,
                               BLOCK_M, BLOCK_N, BLOCK_K, A_T, B_T, ACC_INT, INPUT_PRECISION)
        else:
            z64 = z.to(tl.int64)
            offs_am = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
            offs_bn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
            acc = mainloop_pointers(a_ptr + z64 * stride_az, b_ptr + z64 * stride_bz, offs_am, offs_bn,
                                    offs_am < M, offs_bn < N, 0, k_total, K, stride_am, stride_ak, stride_bk,
                                    stride_bn, BLOCK_M, BLOCK_N, BLOCK_K, ACC_INT, INPUT_PRECISION, EVEN_K)
        tile_c += NUM_PROGRAMS
        zc = tile_c // num_tiles
        pid_mc, pid_nc = tile_coords(tile_c % num_tiles, num_pid_m, num_pid_n, GROUP_M)
        m0 = pid_mc * BLOCK_M
        offs_m = m0 + tl.arange(0, BLOCK_M)
        if EPI_SUBTILE == 1:
            n0 = pid_nc * BLOCK_N
            finish_tile(acc, m0, n0, offs_m, n0 + tl.arange(0, BLOCK_N), zc, pid_nc, M, N, c_ptr, c_desc,
                        stride_cz, stride_cm, stride_cn, scale_a_ptr, scale_b_ptr, bias_ptr, stride_bias_z,
                        stride_bias, res_ptr, stride_rz, stride_rm, stride_rn, pre_ptr, stride_pz, stride_pm,
                        stride_pn, amax_ptr, stride_amax_p, alpha, beta,
                        e0_ptr, e0_sz, e0_sm, e0_sn, e1_ptr, e1_sz, e1_sm, e1_sn,
                        e2_ptr, e2_sz, e2_sm, e2_sn, e3_ptr, e3_sz, e3_sm, e3_sn,
                        EPILOGUE, ACTIVATION, BIAS_MODE, HAS_RESIDUAL, SCALE_A_MODE, SCALE_B_MODE,
                        HAS_ALPHA, STORE_PRE, QUANT, QMAX, Q_INT, Q_GRID_MANT, Q_GRID_EMIN, RAW_INT, C_TMA)
        else:
            # two column halves: half the registers live in the epilogue and half the store buffer
            halves = tl.split(tl.permute(tl.reshape(acc, (BLOCK_M, 2, SUB_N)), (0, 2, 1)))
            n0 = pid_nc * BLOCK_N
            finish_tile(halves[0], m0, n0, offs_m, n0 + tl.arange(0, SUB_N), zc, 2 * pid_nc, M, N, c_ptr, c_desc,
                        stride_cz, stride_cm, stride_cn, scale_a_ptr, scale_b_ptr, bias_ptr, stride_bias_z,
                        stride_bias, res_ptr, stride_rz, stride_rm, stride_rn, pre_ptr, stride_pz, stride_pm,
                        stride_pn, amax_ptr, stride_amax_p, alpha, beta,
                        e0_ptr, e0_sz, e0_sm, e0_sn, e1_ptr, e1_sz, e1_sm, e1_sn,
                        e2_ptr, e2_sz, e2_sm, e2_sn, e3_ptr, e3_sz, e3_sm, e3_sn,
                        EPILOGUE, ACTIVATION, BIAS_MODE, HAS_RESIDUAL, SCALE_A_MODE, SCALE_B_MODE,
                        HAS_ALPHA, STORE_PRE, QUANT, QMAX, Q_INT, Q_GRID_MANT, Q_GRID_EMIN, RAW_INT, C_TMA)
            n1 = n0 + SUB_N
            finish_tile(halves[1], m0, n1, offs_m, n1 + tl.arange(0, SUB_N), zc, 2 * pid_nc + 1, M, N, c_ptr,
                        c_desc, stride_cz, stride_cm, stride_cn, scale_a_ptr, scale_b_ptr, bias_ptr,
                        stride_bias_z, stride_bias, res_ptr, stride_rz, stride_rm, stride_rn, pre_ptr, stride_pz,
                        stride_pm, stride_pn, amax_ptr, stride_amax_p, alpha, beta,
                        e0_ptr, e0_sz, e0_sm, e0_sn, e1_ptr, e1_sz, e1_sm, e1_sn,
                        e2_ptr, e2_sz, e2_sm, e2_sn, e3_ptr, e3_sz, e3_sm, e3_sn,
                        EPILOGUE, ACTIVATION, BIAS_MODE, HAS_RESIDUAL, SCALE_A_MODE, SCALE_B_MODE,
                        HAS_ALPHA, STORE_PRE, QUANT, QMAX, Q_INT, Q_GRID_MANT, Q_GRID_EMIN, RAW_INT, C_TMA)


@triton.jit
def quantize_rows_kernel(y_ptr, q_ptr, scale_ptr, amax_ptr, R, N, n_parts,
                         stride_yr, stride_yn, stride_qr, stride_qn, stride_amax_p,
                         QMAX: tl.constexpr, Q_INT: tl.constexpr, Q_GRID_MANT: tl.constexpr,
                         Q_GRID_EMIN: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_P: tl.constexpr):
    """Second pass of output quantisation: row amax from the per-tile partials, scale = amax / QMAX, then
    q = clamp(y / scale) row by row (memory-bound: reads the wide temporary once, writes 1 byte a value)."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    rmask = rows < R
    amax = tl.zeros((BLOCK_R,), dtype=tl.float32)
    for p0 in range(0, n_parts, BLOCK_P):
        parts = p0 + tl.arange(0, BLOCK_P)
        v = tl.load(amax_ptr + parts[None, :] * stride_amax_p + rows[:, None],
                    mask=rmask[:, None] & (parts[None, :] < n_parts), other=0.0)
        amax = tl.maximum(amax, tl.max(v, axis=1))
    scale = tl.maximum(amax, 1e-12) / QMAX
    tl.store(scale_ptr + rows, scale, mask=rmask)
    for n0 in range(0, N, BLOCK_N):
        cols = n0 + tl.arange(0, BLOCK_N)
        mask = rmask[:, None] & (cols[None, :] < N)
        y = tl.load(y_ptr + rows[:, None] * stride_yr + cols[None, :] * stride_yn, mask=mask, other=0.0)
        q = quantize_values(y.to(tl.float32), scale[:, None], QMAX, Q_INT, Q_GRID_MANT, Q_GRID_EMIN)
        tl.store(q_ptr + rows[:, None] * stride_qr + cols[None, :] * stride_qn, q.to(q_ptr.dtype.element_ty),
                 mask=mask)


# ----------------------------------------------------------------------------------------- launching
_state = threading.local()
_locks: dict[tuple, torch.Tensor] = {}
_dummies: dict[tuple, torch.Tensor] = {}
_lock_guard = threading.Lock()


def _dummy(dev: torch.device) -> torch.Tensor:
    key = (dev.type, dev.index)
    t = _dummies.get(key)
    if t is None:
        t = _dummies[key] = torch.zeros(16, dtype=torch.float32, device=dev)
    return t


def _lock_buffer(dev: torch.device, n: int) -> torch.Tensor:
    """Zeroed split-K counters, one buffer a (device, stream); each launch leaves them zero again."""
    stream = torch.cuda.current_stream(dev).cuda_stream if dev.type == "cuda" else 0
    key = (dev.type, dev.index, stream)
    with _lock_guard:
        t = _locks.get(key)
        if t is None or t.numel() < n:
            t = _locks[key] = torch.zeros(max(n, 2 * (t.numel() if t is not None else 0), 1024), dtype=torch.int32,
                                          device=dev)
    return t


def _tma_allocator(size: int, alignment: int, stream):
    return torch.empty(size, dtype=torch.int8, device=device.torch_device())


def _ensure_tma_allocator() -> None:
    """Device-side tensor descriptors live in a global scratch buffer Triton asks the allocator for. The
    allocator is a context variable (per thread): set ours unless someone else set one."""
    try:
        from triton.runtime import _allocation

        current = _allocation._allocator.get()
        if not isinstance(current, _allocation.NullAllocator):
            return
    except (ImportError, AttributeError):
        pass
    triton.set_allocator(_tma_allocator)


def _num_programs() -> int:
    dev = device.current()
    # on the interpreter a handful of programs, so the persistent loop really loops in the tests
    return 3 if dev.interpreter else dev.multiprocessors


def _input_precision(ops: Operands) -> str:
    if ops.a.dtype != torch.float32:
        return "ieee"
    dev = device.current()
    if dev.vendor == "nvidia" and not dev.interpreter and torch.backends.cuda.matmul.allow_tf32:
        return "tf32"
    return "ieee"


def _quant_mode(ops: Operands, cfg: GemmConfig) -> int:
    if ops.q is None:
        return QUANT_NONE
    if cfg.kernel == "tiled" and ops.N <= cfg.block_n:
        return QUANT_DIRECT
    return QUANT_TWO_PASS


def kernel_arguments(ops: Operands, cfg: GemmConfig, *, for_warmup: bool = False) -> tuple[Any, tuple, dict, dict]:
    """(kernel, grid, arguments by name, launch options) of one launch of ``cfg`` on ``ops``.

    Allocates what the launch needs (split-K workspace and counters, the quantisation temporary)."""
    dev = ops.a.device
    dummy = _dummy(dev)
    epi = ops.epi
    qmode = _quant_mode(ops, cfg)
    c = ops.c
    amax = dummy
    stride_amax_p = 0
    sc = ops.sc
    if qmode == QUANT_TWO_PASS:
        # bf16 keeps 8 significant bits, 5 more than e4m3: the double rounding moves a code only within
        # 2^-9 of a tie. int8 (7 bits of magnitude) and fp32 inputs keep fp32; so does the interpreter,
        # whose fp32 -> bf16 cast truncates.
        exact = ops.q.dtype == torch.int8 or ops.a.dtype == torch.float32 or device.current().interpreter
        wide = torch.float32 if exact else torch.bfloat16
        c = torch.empty((ops.Z, ops.M, ops.N), dtype=wide, device=dev)
        sc = tuple(c.stride())
        parts = math.ceil(ops.N / cfg.block_n) * (cfg.epi_subtile if cfg.kernel == "persistent" else 1)
        amax = torch.empty((parts, ops.Z * ops.M), dtype=torch.float32, device=dev)
        stride_amax_p = ops.Z * ops.M
    elif qmode == QUANT_DIRECT:
        amax = ops.q_scale
    tiles = math.ceil(ops.M / cfg.block_m) * math.ceil(ops.N / cfg.block_n)
    acc_int = ops.a.dtype == torch.int8
    ws = lock = dummy
    if cfg.kernel == "tiled" and cfg.split_k > 1:
        ws = torch.empty(ops.Z * tiles * cfg.split_k * cfg.block_m * cfg.block_n,
                         dtype=torch.int32 if acc_int else torch.float32, device=dev)
        lock = _lock_buffer(dev, ops.Z * tiles)
    use_tma = bool(cfg.tma and ops.problem.tma_ok)
    raw_int = acc_int and c.dtype == torch.int32
    args: dict[str, Any] = dict(
        a_ptr=ops.a, b_ptr=ops.b, c_ptr=c, M=ops.M, N=ops.N, K=ops.K, Z=ops.Z,
        stride_az=ops.sa[0], stride_am=ops.sa[1], stride_ak=ops.sa[2],
        stride_bz=ops.sb[0], stride_bk=ops.sb[1], stride_bn=ops.sb[2],
        stride_cz=sc[0], stride_cm=sc[1], stride_cn=sc[2],
        scale_a_ptr=ops.scale_a if ops.scale_a is not None else dummy,
        scale_b_ptr=ops.scale_b if ops.scale_b is not None else dummy,
        bias_ptr=ops.bias.t if ops.bias else dummy,
        stride_bias_z=ops.bias.sz if ops.bias else 0,
        stride_bias=(ops.bias.sn if epi.bias == "col" else ops.bias.sm) if ops.bias else 0,
        res_ptr=ops.residual.t if ops.residual else dummy,
        stride_rz=ops.residual.sz if ops.residual else 0, stride_rm=ops.residual.sm if ops.residual else 0,
        stride_rn=ops.residual.sn if ops.residual else 0,
        pre_ptr=ops.pre.t if ops.pre else dummy, stride_pz=ops.pre.sz if ops.pre else 0,
        stride_pm=ops.pre.sm if ops.pre else 0, stride_pn=ops.pre.sn if ops.pre else 0,
        amax_ptr=amax, stride_amax_p=stride_amax_p, ws_ptr=ws, lock_ptr=lock, alpha=ops.alpha, beta=ops.beta)
    for i in range(NUM_EXTRA_OPERANDS):
        x = ops.extras[i] if i < len(ops.extras) else None
        args[f"e{i}_ptr"] = x.t if x else dummy
        args[f"e{i}_sz"] = x.sz if x else 0
        args[f"e{i}_sm"] = x.sm if x else 0
        args[f"e{i}_sn"] = x.sn if x else 0
    qdtype = ops.q.dtype if ops.q is not None else None
    args.update(
        EPILOGUE=epi.hook, ACTIVATION=ACTIVATIONS[epi.activation], BIAS_MODE=BIAS_MODES[epi.bias],
        HAS_RESIDUAL=epi.residual, SCALE_A_MODE=SCALE_MODES_A[epi.scale_a], SCALE_B_MODE=SCALE_MODES_B[epi.scale_b],
        HAS_ALPHA=epi.alpha, STORE_PRE=epi.store_pre, QUANT=qmode, QMAX=qmax(qdtype) if qdtype else 1.0,
        Q_INT=qdtype == torch.int8, Q_GRID_MANT=fp8_grid(qdtype)[0], Q_GRID_EMIN=fp8_grid(qdtype)[1], RAW_INT=raw_int, ACC_INT=acc_int, INPUT_PRECISION=_input_precision(ops),
        EVEN_K=ops.K % cfg.block_k == 0, USE_TMA=use_tma, A_T=ops.problem.a_t, B_T=ops.problem.b_t,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m)
    if cfg.kernel == "tiled":
        kernel = gemm_tiled_kernel
        args["SPLIT_K"] = cfg.split_k
        grid = (tiles * cfg.split_k, ops.Z)
    else:
        kernel = gemm_persistent_kernel
        nprog = _num_programs()
        c_tma = (use_tma and qmode != QUANT_DIRECT and sc[2] == 1 and (sc[1] * c.element_size()) % TMA_ALIGN == 0
                 and c.data_ptr() % TMA_ALIGN == 0 and ops.Z == 1)
        args.update(NUM_PROGRAMS=nprog, C_TMA=c_tma, EPI_SUBTILE=cfg.epi_subtile, FLATTEN=cfg.flatten,
                    WARP_SPECIALIZE=cfg.warp_specialize)
        grid = (max(1, min(nprog, tiles * ops.Z)),)
    extra = {"c": c, "amax": amax, "qmode": qmode, "parts": stride_amax_p and amax.shape[0]}
    return kernel, grid, args, extra


def _run_quantize(ops: Operands, extra: dict) -> None:
    y, amax = extra["c"], extra["amax"]
    R, N = ops.Z * ops.M, ops.N
    q2 = ops.q.reshape(R, N) if ops.q.is_contiguous() else None
    q = ops.q
    interp = device.current().interpreter
    block_n = min(64 if interp else 512, triton.next_power_of_2(max(N, 1)))
    block_p = min(64, triton.next_power_of_2(max(amax.shape[0], 1)))
    block_r = 16
    if q2 is not None:
        sq = (q2.stride(0), q2.stride(1))
        target = q2
    else:  # a strided out=: write through a contiguous buffer
        target = torch.empty((R, N), dtype=q.dtype, device=q.device)
        sq = target.stride()
    quantize_rows_kernel[(triton.cdiv(R, block_r),)](
        y, target, ops.q_scale, amax, R, N, amax.shape[0], y.stride(1), y.stride(2), sq[0], sq[1], amax.stride(0),
        QMAX=qmax(q.dtype), Q_INT=q.dtype == torch.int8, Q_GRID_MANT=fp8_grid(q.dtype)[0], Q_GRID_EMIN=fp8_grid(q.dtype)[1],
        BLOCK_R=block_r, BLOCK_N=block_n, BLOCK_P=block_p,
        num_warps=4)
    if q2 is None:
        q.copy_(target.view(q.shape))


def launch(ops: Operands, cfg: GemmConfig) -> None:
    """Run ``cfg`` on ``ops`` (the quantisation pass included)."""
    if ops.M == 0 or ops.N == 0 or ops.Z == 0:
        return
    kernel, grid, args, extra = kernel_arguments(ops, cfg)
    if args["USE_TMA"] or args.get("C_TMA"):
        _ensure_tma_allocator()
    kernel[grid](**args, **cfg.launch_options(device.current().vendor))
    if extra["qmode"] == QUANT_TWO_PASS:
        _run_quantize(ops, extra)


def warmup(ops: Operands, cfg: GemmConfig) -> None:
    """Compile ``cfg`` for ``ops`` without running it (the tuner compiles candidates ahead)."""
    kernel, grid, args, extra = kernel_arguments(ops, cfg)
    if args["USE_TMA"] or args.get("C_TMA"):
        _ensure_tma_allocator()
    kernel.warmup(**args, grid=grid, **cfg.launch_options(device.current().vendor))


_bad_configs: set[tuple] = set()


def run_with_config(ops: Operands, cfg: GemmConfig) -> GemmConfig:
    """Launch, falling back to SAFE_CONFIG when the device rejects ``cfg`` (out of shared memory or
    registers on a part the space did not foresee). Returns the config that ran."""
    key = (ops.problem, cfg)
    if key in _bad_configs:
        cfg = SAFE_CONFIG
    try:
        launch(ops, cfg)
        return cfg
    except triton.runtime.errors.OutOfResources as exc:
        if cfg == SAFE_CONFIG:
            raise
        tf_config.log(1, f"gemm: {cfg.label()} does not fit ({exc}); falling back to {SAFE_CONFIG.label()}")
        _bad_configs.add(key)
        launch(ops, SAFE_CONFIG)
        return SAFE_CONFIG


def choose_config(ops: Operands) -> GemmConfig:
    from . import gemm_tuning

    return gemm_tuning.choose(ops)


def _finish_outputs(ops: Operands, out3: torch.Tensor, pre: MNOperand | None, Z: int, M: int) -> GemmOutputs:
    scale = ops.q_scale.view(Z, M, 1) if ops.q_scale is not None else None
    pre_t = pre.t if pre is not None else None
    return GemmOutputs(out3, scale, pre_t)


def gemm_raw(a: torch.Tensor, b: torch.Tensor, *, out_dtype=None, bias=None, activation="none", residual=None,
             alpha: float = 1.0, beta: float = 1.0, scale_a=None, scale_b=None, quantize=None, epilogue_fn=None,
             extra_operands: Sequence[torch.Tensor] = (), out=None, store_pre: bool = False,
             config: GemmConfig | None = None) -> GemmOutputs:
    """C = epilogue(A @ B) on 2-D or 3-D operands (batch of 1 broadcasts). Check, allocate, launch.

    Returns :class:`GemmOutputs` with 3-D ``out`` (Z, M, N) (a view of ``out=`` when given), the per-row
    ``scale`` (Z, M, 1) when quantising and the pre-activation values when ``store_pre``.
    """
    ops = prepare(a, b, out_dtype=out_dtype, bias=bias, activation=activation, residual=residual, alpha=alpha,
                  beta=beta, scale_a=scale_a, scale_b=scale_b, quantize=quantize, epilogue_fn=epilogue_fn,
                  extra_operands=extra_operands, out=out, store_pre=store_pre)
    a3 = a if a.dim() == 3 else a.unsqueeze(0)
    b3 = b if b.dim() == 3 else b.unsqueeze(0)
    Z = max(a3.shape[0], b3.shape[0]) if min(a3.shape[0], b3.shape[0]) > 0 else 0
    M, N = a3.shape[1], b3.shape[2]
    out3 = ops.c.view(Z, M, N) if ops.Z != Z else ops.c
    pre = ops.pre
    pre_full = None
    if pre is not None:
        pre_full = MNOperand(pre.t.reshape(Z, M, N) if ops.Z != Z else pre.t, 0, 0, 0)
    if ops.M and ops.N and Z:
        if ops.K == 0 and ops.q is None and not ops.epi.hook and ops.epi.bias == "none" and not ops.epi.residual \
                and ops.epi.activation in ("none", "relu", "gelu", "gelu_tanh", "silu", "tanh"):
            ops.c.zero_()  # every activation above maps 0 to 0: nothing to launch
            if ops.pre is not None:
                ops.pre.t.zero_()
        else:
            cfg = config or choose_config(ops)
            used = run_with_config(ops, cfg)
            tf_config.log(2, f"gemm {ops.problem.describe()}: {used.label()}")
    elif ops.q_scale is not None:
        ops.q_scale.fill_(QUANT_EPS / qmax(ops.q.dtype))
    return _finish_outputs(ops, out3, pre_full, Z, M)


def gemm_with_epilogue(a: torch.Tensor, b: torch.Tensor, epilogue_fn, extra_operands: Sequence[torch.Tensor] = (),
                       out_dtype: torch.dtype | None = None, *, bias=None, activation=None, residual=None,
                       alpha: float = 1.0, beta: float = 1.0, scale_a=None, scale_b=None, quantize=None, out=None,
                       config: GemmConfig | None = None):
    """The compiler's entry: ``epilogue_fn`` (a ``@triton.jit`` hook, see :mod:`.gemm_epilogue`) runs on the
    fp32 tile after the built-in steps, reading up to four ``extra_operands`` broadcast to the output.

    Returns the output with the operands' batch shape (2-D for 2-D operands), or ``(codes, scales)`` when
    ``quantize`` is given. No autograd: the compiler differentiates its graphs itself.
    """
    res = gemm_raw(a, b, out_dtype=out_dtype, bias=bias, activation=activation or "none", residual=residual,
                   alpha=alpha, beta=beta, scale_a=scale_a, scale_b=scale_b, quantize=quantize,
                   epilogue_fn=epilogue_fn, extra_operands=extra_operands, out=out, config=config)
    two_d = a.dim() == 2 and b.dim() == 2
    value = res.out[0] if two_d else res.out
    if res.scale is not None:
        return value, (res.scale[0] if two_d else res.scale)
    return value


def supports(a: torch.Tensor, b: torch.Tensor, **epilogue) -> tuple[bool, str]:
    """(True, "") when :func:`gemm_raw` accepts these operands and epilogue keywords, else (False, why).
    Runs the checks only: nothing is allocated or launched."""
    try:
        prepare(a, b, allocate=False, **epilogue)
    except (TypeError, ValueError) as exc:
        return False, str(exc)
    return True, ""


def scratch_operands(ops: Operands) -> Operands:
    """The same inputs with fresh output buffers (the tuner times candidates without touching the caller's
    ``out=``, which may even alias the residual)."""
    def like(t):
        return None if t is None else torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)

    c = like(ops.c)
    q = c if ops.q is not None else None
    pre = MNOperand(like(ops.pre.t), ops.pre.sz, ops.pre.sm, ops.pre.sn) if ops.pre is not None else None
    return dataclasses.replace(ops, c=c, q=q, q_scale=like(ops.q_scale), pre=pre)


from . import gemm_targets  # noqa: E402,F401  (registers the kernels with the target matrix)
