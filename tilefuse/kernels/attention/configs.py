"""Attention launch configurations as data: per vendor (and NVIDIA generation), per kernel, per head-dim class.

A config is the tile shape (BLOCK_M query rows x BLOCK_N keys), ``num_warps``, ``num_stages`` and, on AMD
only, ``waves_per_eu`` (occupancy hint) and ``matrix_instr_nonkdim`` (16: 16x16 MFMA tiles), which reach the
compiler as launch options (never as kernel arguments: a cross-compile must not read the runtime driver).

Why these shapes (each space's comments give the register/spill figures that chose it):

- NVIDIA Hopper / Blackwell forward: 128-row tiles at 8 warps (two warpgroups): wgmma wants 64+ rows a
  warpgroup, and 4 warps on 128 rows spill at d=128. d=256 halves BLOCK_N (K and V tiles of 64 KiB each).
- NVIDIA Ampere forward: 128 x 64 (mma.sync 16x8x16 tiles; the FA2 choice for d=64/128).
- Backward: a dK/dV program holds K, V and the fp32 dK, dV of BLOCK_N keys across its loop, so BLOCK_N is
  128 at d=64 and the tile area shrinks as d grows (32 x 128 / 64 x 64 at d=128, 16 x 64 at d=256).
- Blackwell's accumulators live in tensor memory (512 columns): the dK/dV tiles are sized to fit it.
- AMD CDNA (gfx90a/gfx942/gfx950, 64-wide waves, 64 KiB LDS on gfx90a/gfx942, 160 KiB on gfx950):
  4 waves, one stage (the AMD backend pipelines through registers), ``waves_per_eu=2`` in the forward so two
  workgroups share a CU, 16x16 MFMA.
- Decode (split-KV, rows = GQA group x a few queries): 16-row tiles (mma.sync on NVIDIA, below wgmma's
  64), 4 warps, the kernel streams K/V once; on Hopper 64-key tiles up to d=64 (more splits for a short cache),
  128 elsewhere.

The interpreter runs a program at a time with numpy on whole blocks: :data:`INTERPRETER` keeps blocks small
enough (32) that the tests' sequence lengths (33, 65) cross tile borders and exercise every masked path.
"""
from __future__ import annotations

import dataclasses
from typing import Any

KERNELS = ("fwd", "bwd_dkdv", "bwd_dq", "decode")


@dataclasses.dataclass(frozen=True)
class AttentionConfig:
    block_m: int
    block_n: int
    num_warps: int = 4
    num_stages: int = 2
    waves_per_eu: int = 0  # AMD only
    matrix_instr_nonkdim: int = 0  # AMD only

    def label(self) -> str:
        s = f"{self.block_m}x{self.block_n}-w{self.num_warps}-s{self.num_stages}"
        if self.waves_per_eu or self.matrix_instr_nonkdim:
            s += f"-wpe{self.waves_per_eu}-nk{self.matrix_instr_nonkdim}"
        return s

    def launch_options(self, vendor: str) -> dict[str, Any]:
        """``num_warps``/``num_stages``, and the AMD options only when the target is AMD."""
        from ...targets import launch_options

        return launch_options(vendor, self.num_warps, self.num_stages, waves_per_eu=self.waves_per_eu,
                              matrix_instr_nonkdim=self.matrix_instr_nonkdim)


C = AttentionConfig
# head-dim classes: a config applies to padded head dims (BLOCK_D) up to the key
HEAD_DIM_CLASSES = (64, 128, 256)

# (arch class, kernel) -> {head-dim class: ordered candidates, the first is the default}. Every config here
# compiles without spilling (registers from `tilefuse targets`, triton 3.6) unless its comment says otherwise.
SPACES: dict[tuple[str, str], dict[int, tuple[AttentionConfig, ...]]] = {
    # Hopper: 4 warps on 128-row tiles spilled 216 B at d=128 (fwd); 8 warps hold them in 241 registers
    ("hopper", "fwd"): {
        64: (C(128, 128, 8, 3), C(128, 64, 8, 3), C(64, 64, 4, 4)),
        128: (C(128, 128, 8, 2), C(128, 64, 8, 3), C(64, 64, 4, 3)),
        256: (C(128, 64, 8, 2), C(128, 32, 8, 2)),
    },
    # dK/dV at d=128: 32 x 128 and 64 x 64 at 8 warps spill nothing; 64 x 128 spilled 48-88 B, 4 warps 80-968 B
    ("hopper", "bwd_dkdv"): {
        64: (C(64, 128, 8, 2), C(32, 128, 8, 3), C(64, 64, 4, 2)),
        128: (C(32, 128, 8, 2), C(64, 64, 8, 2)),
        256: (C(16, 64, 8, 2),),  # spills 48-56 B; every other wgmma-sized tile spilled 660+ B
    },
    ("hopper", "bwd_dq"): {
        64: (C(128, 64, 8, 2), C(64, 64, 4, 2)),
        128: (C(128, 64, 8, 2), C(128, 32, 8, 2), C(64, 64, 8, 2)),
        256: (C(64, 32, 8, 2),),
    },
    # Blackwell (tcgen05, accumulators in tensor memory: 512 columns a CTA). dK + dV + S^T + dP^T + the atomic
    # dQ tile of 64 x 128 keys at d=128 need 640: triton 3.6 then emits a kernel that only traps. At d=256 dK
    # and dV alone fill the 512, so its dK/dV tiles are 32 keys (mma.sync, registers).
    ("blackwell", "fwd"): {
        64: (C(128, 128, 8, 3), C(128, 64, 8, 3)),
        128: (C(128, 128, 8, 2), C(128, 64, 8, 3)),
        256: (C(128, 64, 8, 2), C(128, 32, 8, 2)),
    },
    ("blackwell", "bwd_dkdv"): {
        64: (C(64, 128, 8, 2), C(32, 128, 8, 3), C(64, 64, 4, 2)),
        128: (C(64, 64, 8, 2), C(32, 128, 8, 2)),
        256: (C(16, 32, 4, 1),),
    },
    ("blackwell", "bwd_dq"): {
        64: (C(128, 64, 8, 2), C(64, 64, 4, 2)),
        128: (C(128, 64, 8, 2), C(64, 64, 8, 2)),
        256: (C(64, 32, 8, 2),),
    },
    # Ampere (mma.sync): 128 x 64 at 4 warps spilled 256 B at d=128 with 2 stages
    ("ampere", "fwd"): {
        64: (C(128, 64, 4, 3), C(128, 64, 8, 3), C(64, 64, 4, 3)),
        128: (C(128, 64, 8, 2), C(64, 64, 4, 3), C(128, 32, 4, 3)),
        256: (C(64, 32, 4, 2), C(32, 32, 4, 2)),
    },
    ("ampere", "bwd_dkdv"): {
        64: (C(32, 128, 8, 2), C(64, 64, 4, 2)),
        128: (C(64, 64, 8, 2), C(32, 64, 8, 2)),
        256: (C(16, 32, 4, 1),),
    },
    ("ampere", "bwd_dq"): {
        64: (C(64, 64, 4, 2), C(64, 64, 8, 2)),
        128: (C(64, 64, 8, 2), C(64, 32, 4, 2)),
        256: (C(32, 32, 4, 1),),
    },
    # AMD CDNA: one LDS stage (the AMD backend streams through registers); the spill counts the AMD
    # backend reports here (10-30) are SGPRs; 64 x 64 at 8 waves spilled 200-500 VGPRs in dK/dV
    ("cdna", "fwd"): {
        64: (C(128, 64, 4, 1, 2, 16), C(64, 64, 4, 1, 2, 16)),
        128: (C(128, 32, 4, 1, 2, 16), C(128, 64, 4, 1, 2, 16)),
        256: (C(64, 32, 4, 1, 2, 16),),
    },
    ("cdna", "bwd_dkdv"): {
        64: (C(32, 64, 4, 1, 1, 16), C(64, 64, 4, 1, 1, 16)),
        128: (C(16, 64, 4, 1, 1, 16), C(32, 64, 4, 1, 1, 16)),
        256: (C(16, 32, 4, 1, 1, 16),),
    },
    ("cdna", "bwd_dq"): {
        64: (C(64, 64, 4, 1, 1, 16), C(64, 32, 4, 1, 1, 16)),
        128: (C(64, 32, 4, 1, 1, 16), C(32, 64, 4, 1, 1, 16)),
        256: (C(32, 16, 4, 1, 1, 16),),
    },
}
# decode is the same on every part: few rows, stream K/V (BLOCK_N shrinks as d grows to bound registers)
for _arch in ("hopper", "blackwell", "ampere", "cdna"):
    _amd = _arch == "cdna"
    SPACES[(_arch, "decode")] = {
        64: (C(16, 128, 4, 1 if _amd else 3, 1 if _amd else 0, 16 if _amd else 0),),
        128: (C(16, 64, 4, 1 if _amd else 3, 1 if _amd else 0, 16 if _amd else 0),),
        256: (C(16, 32, 4, 1 if _amd else 2, 1 if _amd else 0, 16 if _amd else 0),),
    }
# Hopper, head dims up to 64: 64-key tiles, so twice the splits a short cache fills the part with. On an H100 at GPT-2's
# decode shape (12 heads, 520 keys) a call with its combine took 9.8 us cold at 16 x 64 (9 splits) against 12.1 at
# 16 x 128 (5 splits), and 15.8 against 21.3 at batch 8 (decision 052)
SPACES[("hopper", "decode")][64] = (C(16, 64, 4, 3),)

# the interpreter's config for every kernel (see the module docstring)
INTERPRETER = AttentionConfig(32, 32, 4, 1)

# target name (tilefuse.targets) -> arch class; gfx950's 160 KiB LDS would take 128-key tiles, kept at the
# gfx942 space until measured
ARCH_OF_TARGET = {"sm_80": "ampere", "sm_90a": "hopper", "sm_100a": "blackwell",
                  "gfx90a": "cdna", "gfx942": "cdna", "gfx950": "cdna"}


def arch_class(vendor: str, capability: tuple[int, int] | None) -> str:
    if vendor == "amd":
        return "cdna"
    if capability is not None and capability[0] >= 10:
        return "blackwell"
    if capability is not None and capability[0] == 9:
        return "hopper"
    return "ampere"


def head_dim_class(block_d: int) -> int:
    for c in HEAD_DIM_CLASSES:
        if block_d <= c:
            return c
    raise ValueError(f"head dim block {block_d} is above the largest supported ({HEAD_DIM_CLASSES[-1]})")


def candidates(arch: str, kernel: str, block_d: int) -> tuple[AttentionConfig, ...]:
    if kernel not in KERNELS:
        raise ValueError(f"unknown attention kernel {kernel!r}: accepted values are {', '.join(KERNELS)}")
    return SPACES[(arch, kernel)][head_dim_class(block_d)]


def space(kernel: str, block_d: int, *, interpreter: bool, vendor: str = "nvidia",
          capability: tuple[int, int] | None = None, fp32: bool = False) -> tuple[AttentionConfig, ...]:
    """The candidates of a kernel on this part, the default first. fp32 inputs take twice the shared memory
    a tile: their BLOCK_N is halved (and at d=256 BLOCK_M too), at most 2 stages."""
    if interpreter:
        return (INTERPRETER,)
    out = []
    for cfg in candidates(arch_class(vendor, capability), kernel, block_d):
        if fp32:
            cfg = dataclasses.replace(cfg, block_n=max(16, cfg.block_n // 2), num_stages=min(cfg.num_stages, 2))
            if block_d > 128:
                cfg = dataclasses.replace(cfg, block_m=max(16, cfg.block_m // 2))
        if cfg not in out:
            out.append(cfg)
    return tuple(out)


def select(kernel: str, block_d: int, **part) -> AttentionConfig:
    """The default config of a kernel on this part (the first of :func:`space`)."""
    return space(kernel, block_d, **part)[0]
