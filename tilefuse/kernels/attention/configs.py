"""Attention launch configurations as data: per vendor (and NVIDIA generation), per kernel, per head-dim class.

A config is the tile shape (BLOCK_M query rows x BLOCK_N keys), ``num_warps``, ``num_stages`` and, on AMD
only, ``waves_per_eu`` (occupancy hint) and ``matrix_instr_nonkdim`` (16: 16x16 MFMA tiles), which reach the
compiler as launch options (never as kernel arguments: a cross-compile must not read the runtime driver).

Why these shapes:

- NVIDIA Hopper / Blackwell forward: 128-row tiles, two warpgroups (8 warps) for ``d <= 128``: wgmma wants
  64+ rows a warpgroup and the fp32 accumulator of 128 x 128 is 64 registers a thread at 8 warps. ``d=256``
  halves BLOCK_N (the K and V tiles are 64 KiB each at 128 keys).
- NVIDIA Ampere forward: 128 x 64 at 4 warps (mma.sync 16x8x16 tiles; the FA2 choice for d=64/128).
- Backward (dK/dV program holds K, V, dK, dV for BLOCK_N keys): BLOCK_N = 128 and BLOCK_M = 64 for
  ``d <= 64``, 64 x 64 at larger d, 32 x 64 at d=256 where 4 tiles of 64 x 256 fp32 already fill 256 KiB
  of registers.
- AMD CDNA (gfx90a/gfx942/gfx950, 64-wide waves, 64 KiB LDS on gfx90a/gfx942, 160 KiB on gfx950):
  128 x 64 at 4 waves, one stage (the AMD backend pipelines through registers; a second LDS stage of K
  and V at d=128 is 32 KiB more), ``waves_per_eu=2`` so two workgroups share a CU, 16x16 MFMA.
- Decode (split-KV, rows = GQA group x a few queries): 16-row tiles (mma.sync on NVIDIA, below wgmma's
  64), long BLOCK_N, 4 warps: the kernel streams K/V once.

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
        opts: dict[str, Any] = {"num_warps": self.num_warps, "num_stages": self.num_stages}
        if vendor == "amd":
            if self.waves_per_eu:
                opts["waves_per_eu"] = self.waves_per_eu
            if self.matrix_instr_nonkdim:
                opts["matrix_instr_nonkdim"] = self.matrix_instr_nonkdim
        return opts


C = AttentionConfig
# head-dim classes: a config applies to padded head dims (BLOCK_D) up to the key
HEAD_DIM_CLASSES = (64, 128, 256)

# (arch class, kernel) -> {head-dim class: ordered candidates, the first is the default}
SPACES: dict[tuple[str, str], dict[int, tuple[AttentionConfig, ...]]] = {
    ("hopper", "fwd"): {
        64: (C(128, 128, 8, 3), C(128, 64, 4, 3), C(64, 64, 4, 4)),
        128: (C(128, 128, 8, 2), C(128, 64, 8, 3), C(128, 64, 4, 3)),
        256: (C(128, 64, 8, 2), C(64, 64, 4, 2), C(64, 32, 4, 2)),
    },
    ("hopper", "bwd_dkdv"): {
        64: (C(64, 128, 8, 2), C(32, 128, 4, 2), C(64, 64, 4, 2)),
        128: (C(64, 128, 8, 2), C(32, 128, 8, 2), C(64, 64, 4, 2)),
        256: (C(32, 64, 4, 1), C(16, 64, 4, 1)),
    },
    ("hopper", "bwd_dq"): {
        64: (C(128, 64, 8, 2), C(64, 64, 4, 2)),
        128: (C(128, 64, 8, 2), C(64, 64, 4, 2)),
        256: (C(64, 32, 4, 1), C(64, 16, 4, 1)),
    },
    ("ampere", "fwd"): {
        64: (C(128, 64, 4, 3), C(64, 64, 4, 3)),
        128: (C(128, 64, 8, 2), C(64, 64, 4, 3), C(128, 32, 4, 3)),
        256: (C(64, 32, 4, 2), C(32, 32, 4, 2)),
    },
    ("ampere", "bwd_dkdv"): {
        64: (C(64, 64, 4, 2), C(32, 128, 4, 2)),
        128: (C(64, 64, 8, 2), C(32, 64, 4, 2)),
        256: (C(32, 32, 4, 1), C(16, 32, 4, 1)),
    },
    ("ampere", "bwd_dq"): {
        64: (C(64, 64, 4, 2), C(128, 32, 4, 2)),
        128: (C(64, 64, 8, 2), C(64, 32, 4, 2)),
        256: (C(32, 32, 4, 1), C(16, 32, 4, 1)),
    },
    ("cdna", "fwd"): {
        64: (C(128, 64, 4, 1, 2, 16), C(64, 64, 4, 1, 2, 16)),
        128: (C(128, 64, 4, 1, 2, 16), C(128, 32, 4, 1, 2, 16), C(64, 64, 4, 1, 2, 16)),
        256: (C(64, 32, 4, 1, 2, 16), C(32, 32, 4, 1, 1, 16)),
    },
    ("cdna", "bwd_dkdv"): {
        64: (C(64, 64, 4, 1, 1, 16), C(32, 64, 4, 1, 1, 16)),
        128: (C(32, 64, 4, 1, 1, 16), C(64, 64, 8, 1, 1, 16)),
        256: (C(16, 32, 4, 1, 1, 16),),
    },
    ("cdna", "bwd_dq"): {
        64: (C(64, 64, 4, 1, 1, 16), C(64, 32, 4, 1, 1, 16)),
        128: (C(64, 32, 4, 1, 1, 16), C(64, 64, 8, 1, 1, 16)),
        256: (C(32, 16, 4, 1, 1, 16),),
    },
}
# decode is the same on every part: few rows, stream K/V (BLOCK_N shrinks as d grows to bound registers)
for _arch in ("hopper", "ampere", "cdna"):
    _amd = _arch == "cdna"
    SPACES[(_arch, "decode")] = {
        64: (C(16, 128, 4, 1 if _amd else 3, 1 if _amd else 0, 16 if _amd else 0),),
        128: (C(16, 64, 4, 1 if _amd else 3, 1 if _amd else 0, 16 if _amd else 0),),
        256: (C(16, 32, 4, 1 if _amd else 2, 1 if _amd else 0, 16 if _amd else 0),),
    }

# the interpreter's config for every kernel (see the module docstring)
INTERPRETER = AttentionConfig(32, 32, 4, 1)

# target name (tilefuse.targets) -> arch class; gfx950's 160 KiB LDS would take 128-key tiles, kept at the
# gfx942 space until measured
ARCH_OF_TARGET = {"sm_80": "ampere", "sm_90a": "hopper", "sm_100a": "hopper",
                  "gfx90a": "cdna", "gfx942": "cdna", "gfx950": "cdna"}


def arch_class(vendor: str, capability: tuple[int, int] | None) -> str:
    if vendor == "amd":
        return "cdna"
    if capability is not None and capability[0] >= 9:
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


def select(kernel: str, block_d: int, *, interpreter: bool, vendor: str = "nvidia",
           capability: tuple[int, int] | None = None, fp32: bool = False) -> AttentionConfig:
    """The default config of a kernel on this part. fp32 inputs take twice the shared memory a tile: their
    BLOCK_N is halved (and d=256 fp32 halves BLOCK_M too)."""
    if interpreter:
        return INTERPRETER
    cfg = candidates(arch_class(vendor, capability), kernel, block_d)[0]
    if fp32:
        cfg = dataclasses.replace(cfg, block_n=max(16, cfg.block_n // 2), num_stages=min(cfg.num_stages, 2))
        if block_d > 128:
            cfg = dataclasses.replace(cfg, block_m=max(16, cfg.block_m // 2))
    return cfg
