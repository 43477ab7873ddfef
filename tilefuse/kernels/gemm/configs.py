"""GEMM launch configurations: the config type, the per-vendor spaces (as data), pruning, the default.

A :class:`GemmProblem` describes a GEMM without its tensors (shapes, dtypes, layouts, epilogue): it is what
the tuner keys on and what a child process needs to compile a candidate. :func:`candidates` turns a problem
into an ordered list of configs: the space of its shape class for its vendor, pruned by shared memory and
by shape, split-K filled in from the SM count. The first candidate is the heuristic default, used when
tuning is off, under the interpreter, or before a tuning decision exists.

Shape classes (M is the row count after folding a broadcast batch into the rows):

- ``decode``  M <= 64: reading B is the whole cost (N=K=8192 bf16 is 128 MiB, 31.7 us at 4.23 TB/s, while
  the MMA work is under 5 us), so small BLOCK_M, long BLOCK_K, deep pipelines and split-K until every SM
  streams its share of B.
- ``skinny``  64 < M <= 256: 128-row tiles leave SMs idle (M=128, N=8192: 64 tiles of 128x128 on 132 SMs,
  the 0.76x tutorial case), so split-K or narrower tiles bring the CTA count to about one wave.
- ``small``   fewer tiles of 128x256 than twice the SMs (1024^3, 2048^3): narrower tiles / split-K for fill.
- ``large``   everything else: 128x256 tiles with two consumer warpgroups, TMA, persistent grid (with a
  stream-K tail where the last round of tiles is nearly empty: :func:`stream_k_worth_it`).
"""
from __future__ import annotations

import dataclasses
import functools
import math
import re
from typing import Any, Iterable, Sequence

# --------------------------------------------------------------------------------------------- config
KERNELS = ("tiled", "persistent")


@dataclasses.dataclass(frozen=True)
class GemmConfig:
    """One launch configuration of the GEMM family."""
    kernel: str = "tiled"  # "tiled" (one tile a program, optional split-K) | "persistent" (one program an SM)
    block_m: int = 64
    block_n: int = 64
    block_k: int = 32
    group_m: int = 8  # row-tiles per L2 group: they share B's column panels while those are in L2
    split_k: int = 1  # tiled only: K cut into this many ranges, the last program of a tile reduces them
    num_warps: int = 4
    num_stages: int = 3
    tma: bool = False  # loads (and the persistent kernel's store) through TMA tensor descriptors
    flatten: bool = False  # persistent: flatten the tile and K loops into one pipelined loop
    epi_subtile: int = 1  # persistent: the epilogue runs on this many column slices of the tile
    warp_specialize: bool = False  # Hopper, TMA, num_warps=4: a producer warp group + two consumers (see WS_*)
    stream_k: bool = False  # persistent, not warp-specialised: the last partial round's K steps shared by all SMs
    b_stream: bool = False  # tiled pointer kernel at num_stages=1: B read with an L2 evict-first hint (see B_STREAM)
    b_evict_first: bool = False  # TMA with host descriptors (NVIDIA): B's TMA loads evict-first in L2 (ptx_hints)
    waves_per_eu: int = 0  # AMD only
    matrix_instr_nonkdim: int = 0  # AMD only (16: 16x16 MFMA)
    kpack: int = 0  # AMD only

    def label(self) -> str:
        s = f"{self.kernel[0].upper()}{self.block_m}x{self.block_n}x{self.block_k}-w{self.num_warps}-s{self.num_stages}"
        if self.group_m != 8:
            s += f"-g{self.group_m}"
        if self.split_k > 1:
            s += f"-k{self.split_k}"
        if self.tma:
            s += "-tma"
        if self.flatten:
            s += "-flat"
        if self.epi_subtile > 1:
            s += f"-sub{self.epi_subtile}"
        if self.warp_specialize:
            s += "-ws"
        if self.stream_k:
            s += "-sk"
        if self.b_stream:
            s += "-bs"
        if self.b_evict_first:
            s += "-ef"
        if self.waves_per_eu or self.matrix_instr_nonkdim or self.kpack:
            s += f"-wpe{self.waves_per_eu}-nk{self.matrix_instr_nonkdim}-kp{self.kpack}"
        return s

    @classmethod
    def from_label(cls, label: str) -> "GemmConfig":
        """The config a :meth:`label` names (``P128x256x64-w8-s3-tma-flat``), for timing configs outside the
        spaces (``gemm_suite --sweep --extra``). Raises ValueError naming the label and the accepted form."""
        m = _LABEL_RE.fullmatch(label.strip())
        if m is None:
            raise ValueError(f"config label {label!r}: expected {{T|P}}<BM>x<BN>x<BK>-w<warps>-s<stages> then any of "
                             "-g<group_m> -k<split_k> -tma -flat -sub<n> -ws -sk -bs -ef -wpe<n>-nk<n>-kp<n>, in that "
                             "order (as GemmConfig.label writes them)")
        g = m.groupdict()
        return cls("tiled" if g["kernel"] == "T" else "persistent", int(g["bm"]), int(g["bn"]), int(g["bk"]),
                   group_m=int(g["g"] or 8), split_k=int(g["k"] or 1), num_warps=int(g["w"]), num_stages=int(g["s"]),
                   tma=bool(g["tma"]), flatten=bool(g["flat"]), epi_subtile=int(g["sub"] or 1),
                   warp_specialize=bool(g["ws"]), stream_k=bool(g["sk"]), b_stream=bool(g["bs"]),
                   b_evict_first=bool(g["ef"]),
                   waves_per_eu=int(g["wpe"] or 0), matrix_instr_nonkdim=int(g["nk"] or 0), kpack=int(g["kp"] or 0))

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "GemmConfig":
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in fields})

    def launch_options(self, vendor: str) -> dict[str, Any]:
        from ...targets import launch_options

        return launch_options(vendor, self.num_warps, self.num_stages, waves_per_eu=self.waves_per_eu,
                              matrix_instr_nonkdim=self.matrix_instr_nonkdim, kpack=self.kpack)


_LABEL_RE = re.compile(r"(?P<kernel>[TP])(?P<bm>\d+)x(?P<bn>\d+)x(?P<bk>\d+)-w(?P<w>\d+)-s(?P<s>\d+)"
                       r"(?:-g(?P<g>\d+))?(?:-k(?P<k>\d+))?(?P<tma>-tma)?(?P<flat>-flat)?(?:-sub(?P<sub>\d+))?"
                       r"(?P<ws>-ws)?(?P<sk>-sk)?(?P<bs>-bs)?(?P<ef>-ef)?(?:-wpe(?P<wpe>\d+)-nk(?P<nk>\d+)-kp(?P<kp>\d+))?")

# The interpreter runs a program at a time with numpy on whole blocks: big blocks mean few programs and
# fast tests, and it never tunes. 64x64x32 keeps a 300^3 fp32 GEMM near a second on one core.
INTERPRETER_CONFIG = GemmConfig("tiled", 64, 64, 32, group_m=8, split_k=1, num_warps=4, num_stages=1)
# What a launch falls back to when a config runs out of resources on an unknown part.
SAFE_CONFIG = GemmConfig("tiled", 64, 64, 32, group_m=8, split_k=1, num_warps=4, num_stages=2)


# -------------------------------------------------------------------------------------------- problem
@dataclasses.dataclass(frozen=True)
class GemmProblem:
    """A GEMM without its tensors: C[z] (M x N) = epilogue(A[z] (M x K) @ B[z] (K x N)), z < Z."""
    M: int
    N: int
    K: int
    Z: int
    a_dtype: str  # torch dtype names without "torch."
    b_dtype: str
    c_dtype: str
    a_t: bool  # A is column-major (stride_am == 1)
    b_t: bool  # B is K-contiguous (stride_bk == 1), e.g. nn.Linear's weight.T
    tma_ok: bool  # base pointers and strides meet TMA's 16-byte rules, unit inner stride, Z == 1, K >= 1
    epilogue: str  # the epilogue's signature (see gemm.Epilogue.signature)

    @property
    def in_bytes(self) -> int:
        return dtype_bytes(self.a_dtype)

    def shape_class(self, multiprocessors: int = 132) -> str:
        if self.M * self.Z <= DECODE_MAX_M:
            return "decode"
        if self.M * self.Z <= SKINNY_MAX_M:
            return "skinny"
        if math.ceil(self.M / 128) * math.ceil(self.N / 256) * self.Z < SMALL_MAX_TILES_PER_SM * multiprocessors:
            return "small"
        return "large"

    def bucket(self) -> tuple[int, int, int, int]:
        """Shapes that share a tuning decision: M, N, K rounded up to a power of two (M and N at least 16),
        and whether the problem is batched."""
        return (_pow2_at_least(self.M, 16), _pow2_at_least(self.N, 16), _pow2_at_least(self.K, 16),
                1 if self.Z == 1 else 2)

    def describe(self) -> str:
        z = f"{self.Z}x" if self.Z > 1 else ""
        lay = ("T" if self.a_t else "N") + ("T" if self.b_t else "N")
        return f"{z}{self.M}x{self.N}x{self.K} {self.a_dtype}->{self.c_dtype} {lay} [{self.epilogue}]"


DECODE_MAX_M = 64
SKINNY_MAX_M = 256
SMALL_MAX_TILES_PER_SM = 2  # fewer 128x256 tiles than 2 per SM: fill matters more than tile efficiency


def _pow2_at_least(x: int, floor: int) -> int:
    return max(floor, 1 << max(0, (max(1, x) - 1).bit_length()))


_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1,
                "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1, "int8": 1, "int32": 4, "float64": 8}


def dtype_bytes(name: str) -> int:
    return _DTYPE_BYTES[name]


# ------------------------------------------------------------------------------------------ the parts
@dataclasses.dataclass(frozen=True)
class Part:
    """What the config space needs to know of a GPU (or a cross-compilation target)."""
    vendor: str  # "nvidia" | "amd"
    arch: str  # "sm_90", "gfx942", ...
    multiprocessors: int
    smem_bytes: int  # per block, opt-in maximum

    @property
    def capability(self) -> int:
        if self.vendor != "nvidia":
            return 0
        return int(self.arch.split("_")[1].rstrip("a"))

    @property
    def has_tma(self) -> bool:
        return self.vendor == "nvidia" and self.capability >= 90


# Opt-in shared memory per block, by architecture (CUDA programming guide, CDNA ISA guides). Used when
# the driver cannot be asked (cross-compilation) and as a check on what it says.
SMEM_BY_ARCH = {"sm_80": 166912, "sm_86": 101376, "sm_87": 166912, "sm_89": 101376, "sm_90": 232448,
                "sm_90a": 232448, "sm_100": 232448, "sm_100a": 232448, "sm_120": 101376,
                "gfx90a": 65536, "gfx942": 65536, "gfx950": 163840}
SMEM_SLACK = 1024  # barriers and Triton's own scratch

PART_BY_TARGET = {
    "sm_80": Part("nvidia", "sm_80", 108, SMEM_BY_ARCH["sm_80"]),
    "sm_90a": Part("nvidia", "sm_90", 132, SMEM_BY_ARCH["sm_90"]),
    "sm_100a": Part("nvidia", "sm_100", 148, SMEM_BY_ARCH["sm_100"]),
    "gfx90a": Part("amd", "gfx90a", 104, SMEM_BY_ARCH["gfx90a"]),
    "gfx942": Part("amd", "gfx942", 304, SMEM_BY_ARCH["gfx942"]),
    "gfx950": Part("amd", "gfx950", 256, SMEM_BY_ARCH["gfx950"]),
}


@functools.lru_cache(maxsize=1)
def current_part() -> Part:
    """The part this process runs on (the interpreter is reported as an H100-like part: configs chosen for
    it are never timed, only checked for correctness)."""
    from ... import device

    dev = device.current()
    if not dev.is_gpu or dev.interpreter:
        return Part("nvidia", "sm_90", dev.multiprocessors, SMEM_BY_ARCH["sm_90"])
    smem = SMEM_BY_ARCH.get(dev.arch, 0)
    try:
        import torch

        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        smem = int(getattr(props, "shared_memory_per_block_optin", 0) or smem)
    except Exception:  # an unusual driver: the table's number stands
        pass
    return Part(dev.vendor, dev.arch, dev.multiprocessors, smem or 65536)


# ------------------------------------------------------------------------------------ spaces as data
def C(kernel, bm, bn, bk, w, s, **kw) -> GemmConfig:
    return GemmConfig(kernel, bm, bn, bk, num_warps=w, num_stages=s, **kw)


# stream-K (persistent kernel): a program's share of the last round's K steps is at least this many, so
# that a piece's partial store and pipeline fill stay small against its main loop
STREAM_K_MIN_STEPS = 8

# docs/decisions/016-gemm-stream-k-tail.md: the stream-K tail costs about 20 us beyond its main loop (4096^3: 0.216 ms
# against 0.199 without it, where it saves 8 of a round's 64 steps), so it pays only where the last round is nearly
# empty and long: 16384x8192x28672 (4 tiles of 448 steps in the last round) +1.8 %.
STREAM_K_MAX_TAIL = 0.25  # the last round at most this full
STREAM_K_MIN_TILE_STEPS = 128  # and its tiles at least this many K steps


def stream_k_worth_it(cfg: GemmConfig, problem: "GemmProblem", part: "Part") -> bool:
    """Whether a stream-K config is worth offering for ``problem``: its tiles leave a last round at most
    STREAM_K_MAX_TAIL full of at least STREAM_K_MIN_TILE_STEPS K steps a tile (the round stream-K shortens)."""
    tiles = math.ceil(problem.M / cfg.block_m) * math.ceil(problem.N / cfg.block_n) * problem.Z
    rem = tiles % part.multiprocessors
    return (tiles > part.multiprocessors and 0 < rem <= STREAM_K_MAX_TAIL * part.multiprocessors
            and k_tiles(problem, cfg) >= STREAM_K_MIN_TILE_STEPS)


def stream_k_pieces(tiles: int, k_steps: int, programs: int, min_steps: int = STREAM_K_MIN_STEPS) -> list[list[tuple]]:
    """The persistent kernel's stream-K tail, as the kernel computes it (a model for tests and for reading):
    for each program, its pieces ``(tail tile, first K step, end K step, workspace slot)``. The whole rounds
    (``tiles // programs * programs`` tiles) run a tile a program and are not listed."""
    rem = tiles % programs
    work = rem * k_steps
    if work == 0:
        return [[] for _ in range(programs)]
    shares = min(programs, max(rem, work // min_steps))
    out: list[list[tuple]] = []
    for p in range(programs):
        w0, w1 = p * work // shares, (p + 1) * work // shares
        pieces, w = [], w0
        while p < shares and w < w1:
            t = w // k_steps
            kt0 = w - t * k_steps
            kt1 = min(k_steps, kt0 + (w1 - w))
            pieces.append((t, kt0, kt1, 2 * p + (w0 < t * k_steps)))
            w += kt1 - kt0
        out.append(pieces)
    return out


# FLATTEN_NOTE: ``flatten=True`` (the persistent kernel's ``tl.range(..., flatten=True)``) has triton's pipeliner
# treat the tile loop and the K loop as one, so the loads of the next tile's first K steps are issued before
# this tile's epilogue (ttgir on sm_90a: one loop, the epilogue under an scf.if at a tile's last step) instead
# of after it: without it every tile starts with an exposed pipeline fill. Offered on NVIDIA for the persistent
# kernel without warp specialisation or a stream-K tail (triton's tutorial 09 flattens only those on Hopper).
AUTO_SPLIT = -1  # split_k filled in from the SM count (see fill_split_k)
DECODE_M = -1  # block_m filled in from M (16, 32 or 64)

# NVIDIA, in order of preference within a class (the first that survives pruning is the default; the tuner times the
# first TUNE_MAX_CANDIDATES of the class). A figure after a config is its ratio to cuBLAS (H200, bf16) in the sweep
# that placed it: docs/decisions/012-gemm-config-space.md names each sweep and its CSV; 013 covers the decode/skinny
# tiles, 014 the -ef hint, 016 stream-K, 017 the flattened loop.
# Hopper numbers: 227 KB smem; a 128x256x64 bf16 stage is 48 KB, so 3 stages + a 64 KB TMA store buffer
# fit (211 KB), 4 stages fit only with the store split in two 32 KB column halves (epi_subtile=2).
# ws=True (Hopper): triton 3.6's automatic warp specialisation at num_warps=4 gives one producer warp group (TMA
# loads, 40 registers) and two consumer groups (wgmma + epilogue, 232 registers) splitting BLOCK_M: the recipe that
# closes the gap to cuBLAS on large shapes (the first sweep's best non-specialised kernel: 0.944x at 4096^3).
NVIDIA_SPACE: dict[str, tuple[GemmConfig, ...]] = {
    "decode": (
        # B dominates: BLOCK_N x BLOCK_K x 2 bytes a stage; 3-4 stages in flight keep ~100 KB a SM moving.
        C("tiled", DECODE_M, 64, 256, 4, 4, group_m=1, split_k=AUTO_SPLIT),  # M=1: 1.018x
        # after do_bench's zeroing flush (tools/l2_flush_probe.py,
        # docs/decisions/013-gemm-decode-and-skinny-tiles.md): M=1 0.0417 ms against cuBLAS 0.0429 and the config
        # above 0.0430; M=16 0.0423 against 0.0424 / 0.0435 (M <= 16 only: see b_stream_possible)
        C("tiled", DECODE_M, 64, 128, 4, 1, group_m=1, split_k=AUTO_SPLIT, b_stream=True),
        # two sweeps of 6 interleaved rounds (docs/decisions/013-gemm-decode-and-skinny-tiles.md): M=64 1.009x /
        # 0.999x through TMA with the descriptors made on the host (6 stages 1.008x) against 0.985x / 0.983x for the
        # pointer tile below, the pick of every suite before; the two configs above do not fit M=64 (shared memory;
        # b_stream is for 16-row tiles), so this one is M=64's first. B_HINT (-ef): its TMA loads of B evict-first in
        # L2 (docs/decisions/014-gemm-l2-evict-first-on-b.md, tools/tma_hint_probe.py: at M=128/256 2.4-4.2 us faster
        # after do_bench's dirty flush; a sweep at M=64: 1.116x cuBLAS hinted against 1.008x plain), first, and the
        # tuner times both
        C("tiled", DECODE_M, 64, 128, 4, 7, group_m=1, split_k=AUTO_SPLIT, tma=True, b_evict_first=True),
        C("tiled", DECODE_M, 64, 128, 4, 7, group_m=1, split_k=AUTO_SPLIT, tma=True),
        C("tiled", DECODE_M, 64, 128, 4, 6, group_m=1, split_k=AUTO_SPLIT),  # M=16: 0.961x
        C("tiled", DECODE_M, 128, 256, 8, 3, group_m=1, split_k=AUTO_SPLIT),  # M=16: 0.947x
        C("tiled", DECODE_M, 128, 128, 8, 5, group_m=1, split_k=AUTO_SPLIT),
        C("tiled", DECODE_M, 32, 256, 4, 4, group_m=1, split_k=AUTO_SPLIT),  # 2 CTAs a SM, 256 tiles
        C("tiled", DECODE_M, 64, 128, 4, 8, group_m=1, split_k=AUTO_SPLIT),
        C("tiled", DECODE_M, 64, 256, 8, 4, group_m=1, split_k=AUTO_SPLIT),
        C("tiled", DECODE_M, 128, 128, 4, 4, group_m=1, split_k=AUTO_SPLIT),  # M=1: 0.981x, M=16: 0.411x
        C("tiled", DECODE_M, 128, 128, 8, 1, group_m=1, split_k=AUTO_SPLIT, b_stream=True),  # M=1: 0.0425 ms
        # (b_stream, M=1/16 ms: 16x64x64 w4 0.0442/0.0448, 16x64x256 w8 0.0456/0.0550, 16x32x256 w4 0.0473/0.0634; at
        # M=64 every b_stream config lost 25-190 %, at M=128/256 45-200 %:
        # docs/decisions/013-gemm-decode-and-skinny-tiles.md)
        # (256/128-column strips split along K, and TMA-loaded B, swept: all slower at M = 1/16/64, 0.81-0.98x cuBLAS
        # against the leaders' 0.96-1.00x; docs/decisions/013-gemm-decode-and-skinny-tiles.md)
    ),
    "skinny": (
        # two interleaved sweeps (docs/decisions/013-gemm-decode-and-skinny-tiles.md): M=128 0.991x / 0.983x with host
        # descriptors, against 0.980x / 0.971x for the 64x128x128 at 4 stages below (in an earlier sweep, with
        # descriptors made in the kernel, 0.928-0.952x: tied); the suites' tuner finals had the two within 0.2-1.1 %,
        # either way round.
        # tools/tma_hint_probe.py (docs/decisions/014-gemm-l2-evict-first-on-b.md, interleaved with cuBLAS after
        # do_bench's flush): with B's TMA loads evict-first in L2 (-ef, ptx_hints) the 64x128x64 ran 44.38 -> 40.19 us
        # at M=128 (0.999x -> 1.104x) and the 128x128x64 at 7 stages 51.17 -> 48.78 us at M=256 (1.018x -> 1.067x);
        # sweeps: M=128 1.093x against 0.983x, M=256 1.133x against 1.055x. Each tile hinted, then plain
        C("tiled", 64, 128, 64, 4, 8, group_m=8, split_k=AUTO_SPLIT, tma=True, b_evict_first=True),
        C("tiled", 64, 128, 64, 4, 8, group_m=8, split_k=AUTO_SPLIT, tma=True),
        C("tiled", 64, 128, 128, 4, 4, group_m=8, split_k=AUTO_SPLIT, tma=True, b_evict_first=True),
        C("tiled", 64, 128, 128, 4, 4, group_m=8, split_k=AUTO_SPLIT, tma=True),  # M=128: 0.951x
        # three interleaved sweeps (docs/decisions/013-gemm-decode-and-skinny-tiles.md): the tiled kernel has no TMA
        # store buffer, so a 128x128x64 tile takes a seventh 32 KB stage (230 KB): M=256 bf16 1.018x / 1.010x cuBLAS,
        # fp16 1.015x, where the persistent 6-stage configs below read 0.958-0.967x in the same sweeps (8 warps:
        # 1.017x / 1.005x, fp16 0.993x / 1.003x). At M=128 (64 tiles) they leave half the SMs idle: the 64x128 leads.
        C("tiled", 128, 128, 64, 4, 7, group_m=8, tma=True, b_evict_first=True),
        C("tiled", 128, 128, 64, 4, 7, group_m=8, tma=True),
        C("tiled", 128, 128, 64, 8, 7, group_m=8, tma=True, b_evict_first=True),
        C("tiled", 128, 128, 64, 8, 7, group_m=8, tma=True),
        # cuBLAS's pick at 256x8192x8192 (ncu) is 128x128x64 tiles with 6 stages; ours at 6 stages
        # (229 KB of shared memory): M=256 0.965x against 0.934x at 5 stages (M=128 0.830x: the 64x128 leads)
        C("persistent", 128, 128, 64, 4, 6, group_m=8, tma=True),
        C("persistent", 128, 128, 64, 4, 6, group_m=8, tma=True, flatten=True),  # M=256: 0.976x against 0.973x
        C("persistent", 128, 128, 64, 4, 5, group_m=8, tma=True),  # M=256: 0.922x (next best 0.876x)
        C("tiled", 64, 128, 128, 4, 4, group_m=8, tma=True, warp_specialize=True),  # M=128: 128 tiles, no split
        C("persistent", 128, 128, 64, 4, 4, group_m=8, tma=True, warp_specialize=True),  # M=256: 128 tiles
        C("tiled", 128, 128, 128, 8, 3, group_m=8, split_k=AUTO_SPLIT),  # M=256: 0.772x
        C("tiled", 64, 256, 64, 4, 4, group_m=8, split_k=AUTO_SPLIT, tma=True),  # M=256: 128 tiles
        C("tiled", 128, 128, 64, 4, 4, group_m=8, tma=True, warp_specialize=True),
        C("tiled", 128, 64, 128, 4, 4, group_m=8, split_k=AUTO_SPLIT),  # M=128: 0.909x
        C("tiled", 128, 128, 64, 8, 4, group_m=8, split_k=AUTO_SPLIT),  # M=256: 0.757x
        # (four b_stream configs, 64- and 128-row tiles, lost 45-200 % at M = 128 and 256: not offered)
        # (at M = 128, none better than the 64x128 leader's 0.942-0.947x: 64x128x64 at 7-9 stages and 4 or
        # 8 warps 0.928-0.952x, 128x64x64 at 7-9 stages 0.907-0.920x, and every 2-way split of 128x128 tiles
        # 0.83-0.88x, with the register fix-up or without, at 4, 6 or 7 stages, TMA or pointer loads)
        # (P128x128x64-w4-s6-tma-ws, the warp-specialised form of the second config here, returned inf on the H200 in
        # test_every_candidate_config_is_correct[skinny] (docs/decisions/012-gemm-config-space.md): triton 3.6's warp
        # specialisation at 6 stages is wrong; 4 stages are right. Not offered.)
    ),
    "small": (
        # 128x128 at num_warps=8 (64 accumulator registers a thread): at 4 warps bias+GeLU needs 255 + 64 B of stack
        # on sm_90a. The sweep of every class's configs at 1024^3 and 2048^3
        # (docs/decisions/012-gemm-config-space.md): the 1024^3 leaders first, then 2048^3's (the tiled 128x256 with
        # TMA led there at 0.910x bf16 / 0.927x fp16; the tuner's pick, P128x256 ws, 0.889x / 0.903x)
        # tools/tma_desc_probe.py (docs/decisions/015-gemm-host-tma-descriptors.md): the same tile through TMA with
        # descriptors made on the host, 8.64 us at 1024^3 against 9.55 with pointer loads and 11.06 with descriptors
        # made in the kernel (cuBLAS 9.22)
        C("tiled", 64, 128, 128, 4, 4, group_m=1, tma=True),
        C("tiled", 64, 128, 128, 4, 4, group_m=1),  # 1024^3: 0.907x (the split-K 64x128x64 0.643x)
        C("tiled", 128, 64, 128, 4, 4, group_m=8),  # 1024^3: 0.899x
        C("tiled", 128, 256, 64, 8, 3, group_m=8, split_k=AUTO_SPLIT, tma=True),  # 2048^3: 0.910x
        C("persistent", 128, 256, 64, 4, 3, group_m=8, tma=True, warp_specialize=True),  # 2048^3: 0.889x
        C("persistent", 128, 128, 64, 4, 5, group_m=8, tma=True),  # 2048^3: 0.848x
        C("tiled", 128, 128, 64, 8, 4, group_m=8, split_k=AUTO_SPLIT, tma=True),
        C("persistent", 128, 128, 64, 4, 4, group_m=8, tma=True, warp_specialize=True),
        C("tiled", 128, 128, 64, 4, 4, group_m=8, tma=True, warp_specialize=True),
        C("tiled", 64, 128, 64, 4, 4, group_m=8, split_k=AUTO_SPLIT),
        C("persistent", 128, 128, 64, 8, 4, group_m=8, tma=True),
    ),
    "large": (
        # the tile and K loops flattened into one pipelined loop: the next tile's first stages load during this tile's
        # epilogue instead of after it (a pipeline fill a tile; see FLATTEN_NOTE). An interleaved sweep of 6 rounds
        # (docs/decisions/017-gemm-flattened-persistent-loop.md): 4096^3 0.972x against 0.944x unflattened, 8192^3
        # 1.019x against 1.023x
        C("persistent", 128, 256, 64, 8, 3, group_m=8, tma=True, flatten=True),
        C("persistent", 128, 256, 64, 8, 3, group_m=8, tma=True),  # 4096^3: 0.944x
        # stream-K, offered where the last round is nearly empty (stream_k_worth_it): 16384x8192x28672
        # (docs/decisions/016-gemm-stream-k-tail.md) 1.039x against 1.021x without it; where it is not offered it lost
        # (4096^3 0.873x against 0.948x)
        C("persistent", 128, 256, 64, 8, 3, group_m=8, tma=True, stream_k=True),
        C("persistent", 128, 256, 64, 4, 3, group_m=8, tma=True, warp_specialize=True),
        # 8192^3: 1.042x flattened against 1.024x (4096^3 0.970x against 0.957x)
        C("persistent", 128, 256, 64, 8, 4, group_m=8, tma=True, epi_subtile=2, flatten=True),
        C("persistent", 128, 256, 64, 8, 4, group_m=8, tma=True, epi_subtile=2),  # 8192^3: 0.979x
        C("persistent", 128, 256, 64, 8, 4, group_m=8, tma=True, epi_subtile=2, stream_k=True),  # 1.035x
        C("persistent", 128, 128, 64, 4, 4, group_m=8, tma=True, warp_specialize=True),
        C("tiled", 128, 256, 64, 4, 3, group_m=8, tma=True, warp_specialize=True),
        C("tiled", 128, 256, 64, 8, 3, group_m=8, tma=True),  # 8192^3: 0.961x
        C("persistent", 128, 128, 64, 4, 5, group_m=8, tma=True),
        C("tiled", 128, 256, 64, 8, 3, group_m=8),
        C("tiled", 256, 128, 64, 8, 3, group_m=8),
    ),
}

# AMD CDNA (ROCm tuning guidance: num_stages=2 for GEMMs, matrix_instr_nonkdim=16, kpack=2 for 16-bit
# inputs, waves_per_eu 2 to leave room for two waves a SIMD). 64 KB LDS on gfx90a/gfx942.
def A(kernel, bm, bn, bk, w, kpack=2, **kw) -> GemmConfig:
    kw.setdefault("waves_per_eu", 2)
    return GemmConfig(kernel, bm, bn, bk, num_warps=w, num_stages=2, matrix_instr_nonkdim=16, kpack=kpack, **kw)


AMD_SPACE: dict[str, tuple[GemmConfig, ...]] = {
    "decode": (
        A("tiled", DECODE_M, 64, 256, 4, group_m=1, split_k=AUTO_SPLIT, waves_per_eu=0),
        A("tiled", DECODE_M, 128, 128, 4, group_m=1, split_k=AUTO_SPLIT, waves_per_eu=0),
        A("tiled", DECODE_M, 64, 128, 4, group_m=1, split_k=AUTO_SPLIT),
    ),
    "skinny": (
        A("tiled", 128, 128, 64, 4, group_m=8, split_k=AUTO_SPLIT),
        A("tiled", 64, 128, 64, 4, group_m=8, split_k=AUTO_SPLIT),
        A("tiled", 128, 64, 64, 4, group_m=8, split_k=AUTO_SPLIT),
    ),
    "small": (
        A("tiled", 128, 128, 64, 4, group_m=8, split_k=AUTO_SPLIT),
        A("tiled", 64, 128, 64, 4, group_m=8, split_k=AUTO_SPLIT),
        A("persistent", 128, 128, 64, 4, group_m=8),
    ),
    "large": (
        A("tiled", 256, 256, 64, 8, group_m=8),
        A("tiled", 256, 128, 64, 8, group_m=8),
        A("persistent", 256, 256, 64, 8, group_m=8),
        A("tiled", 128, 128, 64, 4, group_m=8),
    ),
}

SPACES = {"nvidia": NVIDIA_SPACE, "amd": AMD_SPACE}

# 4-byte inputs (fp32: tf32 tensor cores when torch.backends.cuda.matmul.allow_tf32, exact fp32 otherwise;
# gemm_launching._input_precision decides, the space serves both). The 2-byte spaces pruned to one config here
# (T64x64x32, the SAFE_CONFIG: 0.14x cuBLAS tf32 at 4096^3 in three suites, docs/decisions/012-gemm-config-space.md):
# their BLOCK_K=64 stages double in bytes. Sized for 4 bytes: BLOCK_K 32 keeps a 128x256 stage at 48 KB (the bf16
# 128x256x64 stage), so 3 stages fit in 227 KB, 4 with the persistent kernel's fp32 TMA store buffer halved (sub2).
# Cross-compiled for sm_90a (tf32, NN and NT, plain and bias+gelu): no spills, wgmma m64nNk8 tf32;
# tests/kernels/gemm/test_gemm_configs.py keeps that true. Layout matters more than for 2-byte types: tf32 wgmma reads
# B K-major only, so with an N-major B (the plain NN case) the pointer kernels' cp.async writes B
# transposed into shared memory (4-byte copies) while a TMA-loaded B tile goes through registers to be
# transposed each K step and the wgmma waits for it (ttgir: local_load + local_alloc, pendings=0);
# :func:`candidates` puts the pointer configs first there and the TMA ones first for a K-major B. Measured
# (docs/decisions/018-gemm-k-major-copy.md) at 4096^3: K-major, the flattened persistent 128x256 TMA config 0.96x
# cuBLAS, the pointer kernels 0.53-0.80x; N-major, every config 0.18-0.35x. That is why gemm_plan.wgmma_copies has an
# N-major B copied K-major on sm_90 before the GEMM (the N-major order below serves what it leaves: small M, other
# parts). The warp-specialised persistent kernel fails to compile for an N-major tf32 B (PassManager,
# ConvertNVGPUToLLVM) and is offered for a K-major B only.
NVIDIA_SPACE_4B: dict[str, tuple[GemmConfig, ...]] = {
    "decode": (
        # B is the cost (N=K=8192 fp32: 256 MiB, 63 us at 4.23 TB/s); mma.sync at BLOCK_M 16-64
        C("tiled", DECODE_M, 64, 64, 4, 6, group_m=1, split_k=AUTO_SPLIT),  # 20 KB a stage at M=1
        C("tiled", DECODE_M, 64, 128, 4, 4, group_m=1, split_k=AUTO_SPLIT),  # 40 KB (64 at M=64: pruned)
        C("tiled", DECODE_M, 128, 64, 4, 4, group_m=1, split_k=AUTO_SPLIT),
        C("tiled", DECODE_M, 32, 128, 4, 4, group_m=1, split_k=AUTO_SPLIT),
        C("tiled", DECODE_M, 64, 128, 4, 3, group_m=1, split_k=AUTO_SPLIT),  # what fits at M=64
        C("tiled", DECODE_M, 128, 128, 8, 3, group_m=1, split_k=AUTO_SPLIT),
        # what M=64 keeps on 163 KB parts (sm_80) and with exact fp32 (see fma_fits)
        C("tiled", DECODE_M, 64, 64, 4, 4, group_m=1, split_k=AUTO_SPLIT),
        C("tiled", DECODE_M, 64, 32, 4, 6, group_m=1, split_k=AUTO_SPLIT),
        C("tiled", DECODE_M, 128, 32, 4, 4, group_m=1, split_k=AUTO_SPLIT),
    ),
    "skinny": (
        C("tiled", 64, 128, 32, 4, 4, group_m=8, split_k=AUTO_SPLIT),
        C("tiled", 128, 128, 32, 8, 4, group_m=8, split_k=AUTO_SPLIT),
        C("tiled", 64, 256, 32, 4, 4, group_m=8, split_k=AUTO_SPLIT),
        C("tiled", 64, 128, 64, 4, 3, group_m=8, split_k=AUTO_SPLIT),
        C("tiled", 64, 128, 32, 4, 4, group_m=8, split_k=AUTO_SPLIT, tma=True),
        C("persistent", 128, 128, 32, 8, 4, group_m=8, tma=True),
    ),
    "small": (
        C("tiled", 128, 128, 32, 8, 4, group_m=8, split_k=AUTO_SPLIT),
        C("tiled", 64, 128, 32, 4, 4, group_m=8, split_k=AUTO_SPLIT),
        C("tiled", 128, 256, 32, 8, 3, group_m=8, split_k=AUTO_SPLIT),
        C("tiled", 128, 64, 32, 4, 4, group_m=8, split_k=AUTO_SPLIT),
        C("tiled", 128, 128, 32, 8, 4, group_m=8, split_k=AUTO_SPLIT, tma=True),
        C("persistent", 128, 128, 32, 8, 4, group_m=8, tma=True),
    ),
    "large": (
        C("tiled", 128, 256, 32, 8, 3, group_m=8),  # 144 KB
        C("tiled", 128, 128, 32, 8, 4, group_m=8),  # 128 KB
        C("persistent", 128, 256, 32, 8, 3, group_m=8),
        C("tiled", 128, 256, 32, 8, 4, group_m=8),  # 192 KB
        C("tiled", 256, 128, 32, 8, 3, group_m=8),
        C("persistent", 128, 256, 32, 8, 3, group_m=8, tma=True, epi_subtile=2),  # 144 + 64 KB store buffer
        C("persistent", 128, 256, 32, 8, 3, group_m=8, tma=True, epi_subtile=2, flatten=True),
        C("persistent", 128, 128, 32, 8, 4, group_m=8, tma=True),  # 128 + 64 KB
        C("tiled", 128, 256, 32, 8, 3, group_m=8, tma=True),
        C("persistent", 128, 128, 32, 4, 4, group_m=8, tma=True, warp_specialize=True),  # K-major B only
        # FMA-sized (exact fp32 with a transposed operand keeps no TMA config)
        C("persistent", 128, 128, 32, 8, 4, group_m=8),
        C("tiled", 128, 64, 32, 4, 4, group_m=8),
    ),
}


# AMD CDNA, 4-byte inputs: exact fp32 MFMA (v_mfma_f32_*_f32; Triton asks for no xf32 here). 64 KB LDS
# holds one stage (num_stages=2): BLOCK_K 32 keeps 256x128 at 48 KB, 128x128 at 32 KB. kpack=1: packing
# two K steps a lane is for 16-bit inputs. Cross-compiled for gfx90a/gfx942/gfx950: v_mfma, no spills
# except the split-K 128x128 tile's bias+gelu epilogue on gfx950 (35).
def A4(kernel, bm, bn, bk, w, **kw) -> GemmConfig:
    return A(kernel, bm, bn, bk, w, kpack=1, **kw)


AMD_SPACE_4B: dict[str, tuple[GemmConfig, ...]] = {
    "decode": (
        A4("tiled", DECODE_M, 64, 128, 4, group_m=1, split_k=AUTO_SPLIT, waves_per_eu=0),
        A4("tiled", DECODE_M, 128, 64, 4, group_m=1, split_k=AUTO_SPLIT, waves_per_eu=0),
        A4("tiled", DECODE_M, 64, 64, 4, group_m=1, split_k=AUTO_SPLIT),
    ),
    "skinny": (
        A4("tiled", 128, 128, 32, 4, group_m=8, split_k=AUTO_SPLIT),
        A4("tiled", 64, 128, 32, 4, group_m=8, split_k=AUTO_SPLIT),
        A4("tiled", 128, 64, 32, 4, group_m=8, split_k=AUTO_SPLIT),
    ),
    "small": (
        A4("tiled", 128, 128, 32, 4, group_m=8, split_k=AUTO_SPLIT),
        A4("tiled", 64, 128, 32, 4, group_m=8, split_k=AUTO_SPLIT),
        A4("persistent", 128, 128, 32, 4, group_m=8),
    ),
    "large": (
        A4("tiled", 256, 128, 32, 8, group_m=8),
        A4("tiled", 128, 128, 32, 4, group_m=8),
        A4("tiled", 128, 256, 32, 8, group_m=8),  # (256x256x16 spilled ~236 VGPRs with bias+gelu on gfx942)
        A4("persistent", 256, 128, 32, 8, group_m=8),
    ),
}

SPACES_4B = {"nvidia": NVIDIA_SPACE_4B, "amd": AMD_SPACE_4B}


def space_of(problem: "GemmProblem", part: "Part") -> tuple[GemmConfig, ...]:
    """The configs of ``problem``'s shape class for ``part``'s vendor, sized for its input element size."""
    spaces = SPACES_4B if problem.in_bytes == 4 else SPACES
    return spaces[part.vendor][problem.shape_class(part.multiprocessors)]


def k_major_operands(problem: "GemmProblem") -> bool:
    """A row-major and B K-contiguous: what tf32 (and 8-bit) wgmma reads from shared memory untransposed."""
    return not problem.a_t and problem.b_t


def fp32_precision(part: "Part") -> str:
    """How fp32 inputs run on ``part``: "tf32" on NVIDIA when torch allows it
    (``torch.backends.cuda.matmul.allow_tf32``, the rule of gemm_launching._input_precision), else "ieee"."""
    if part.vendor != "nvidia":
        return "ieee"
    import torch

    return "tf32" if torch.backends.cuda.matmul.allow_tf32 else "ieee"


# Exact fp32 on NVIDIA is not a tensor-core dot: Triton lowers an ieee tl.dot to FMAs on operand slices held
# in registers, so the tile must leave room for them. Cross-compiled for sm_90a (NN/NT/TN, plain and
# bias+gelu): (BLOCK_M + BLOCK_N) x BLOCK_K / threads <= 48 and an accumulator of <= 64 registers a thread
# compile without spills (T128x128x32-w8: 186-254 registers, T64x128x32-w4: 166); 128x256 tiles spill
# 120-600 B, T64x64x128-w4 with bias+gelu 7.6 KB, and TMA tiles of a transposed operand 5-12 KB.
FMA_MAX_OPERAND_REGS = 48
FMA_MAX_ACC_REGS = 64


def fma_fits(cfg: GemmConfig, problem: "GemmProblem") -> bool:
    threads = 32 * cfg.num_warps
    if cfg.tma and (problem.a_t or problem.b_t):
        return False
    return ((cfg.block_m + cfg.block_n) * cfg.block_k <= FMA_MAX_OPERAND_REGS * threads
            and cfg.block_m * cfg.block_n <= FMA_MAX_ACC_REGS * threads)

MAX_SPLIT_K = 16
SPLIT_REG_ACC = 64  # fp32 accumulator registers a thread up to which a 2-way split sums in registers


def split_in_registers(cfg: GemmConfig) -> bool:
    """A 2-way split whose accumulator is small enough to hold a second copy (the other split's partial)
    without spilling: its last split sums in registers (``gemm_tiled_kernel``'s SPLIT_IN_REGS)."""
    return cfg.kernel == "tiled" and cfg.split_k == 2 and \
        cfg.block_m * cfg.block_n <= SPLIT_REG_ACC * 32 * cfg.num_warps
MIN_K_TILES_PER_SPLIT = 4  # fewer K steps a split than this and the pipeline never fills
SPLIT_TARGET_WAVES = 1.0  # aim at about one wave of programs: more waves add tail, fewer leave SMs idle


# ------------------------------------------------------------------------------------------- pruning
def smem_estimate(cfg: GemmConfig, problem: GemmProblem) -> int:
    """Shared memory a config needs: one A and one B tile a pipeline stage (AMD: stages - 1 in LDS, the
    last in registers), plus the TMA store buffer of the persistent kernel."""
    ea, eb = dtype_bytes(problem.a_dtype), dtype_bytes(problem.b_dtype)
    stage = cfg.block_m * cfg.block_k * ea + cfg.block_k * cfg.block_n * eb
    stages = max(1, cfg.num_stages - 1) if cfg.waves_per_eu or cfg.kpack or cfg.matrix_instr_nonkdim else cfg.num_stages
    total = stages * stage
    if cfg.kernel == "persistent" and cfg.tma:
        total += cfg.block_m * (cfg.block_n // cfg.epi_subtile) * max(dtype_bytes(problem.c_dtype), 2)
    return total + SMEM_SLACK


def k_tiles(problem: GemmProblem, cfg: GemmConfig) -> int:
    return max(1, math.ceil(problem.K / cfg.block_k))


def output_tiles(cfg: GemmConfig, problem: GemmProblem) -> int:
    return math.ceil(problem.M / cfg.block_m) * math.ceil(problem.N / cfg.block_n) * problem.Z


def program_slots(cfg: GemmConfig, problem: GemmProblem, part: Part) -> int:
    """Programs of ``cfg`` that ``part`` runs at once: its SMs times the programs an SM holds by shared memory
    (and, for ``b_stream``, by registers)."""
    per_sm = part.smem_bytes // max(1, smem_estimate(cfg, problem))
    if cfg.b_stream:
        per_sm = min(per_sm, b_stream_ctas_per_sm(cfg, problem))
    return part.multiprocessors * max(1, per_sm)


def waves(cfg: GemmConfig, problem: GemmProblem, part: Part) -> int:
    """Rounds of programs ``cfg`` runs on ``part`` (tiles x split over :func:`program_slots`; a persistent
    grid's rounds of tiles are the same count)."""
    return math.ceil(output_tiles(cfg, problem) * max(1, cfg.split_k) / program_slots(cfg, problem, part))


def fill_split_k(cfg: GemmConfig, problem: GemmProblem, part: Part) -> GemmConfig:
    """Choose split_k so that tiles x split is about one wave of programs, keeping at least
    MIN_K_TILES_PER_SPLIT K steps a split."""
    if cfg.split_k != AUTO_SPLIT:
        return cfg
    want = max(1, int(SPLIT_TARGET_WAVES * program_slots(cfg, problem, part) // output_tiles(cfg, problem)))
    most = max(1, k_tiles(problem, cfg) // MIN_K_TILES_PER_SPLIT)
    split = max(1, min(want, most, MAX_SPLIT_K))
    return dataclasses.replace(cfg, split_k=split)


REGISTERS_PER_SM = 65536  # every NVIDIA part since sm_50


def b_stream_ctas_per_sm(cfg: GemmConfig, problem: GemmProblem) -> int:
    """Programs an SM holds of a b_stream config, which registers limit rather than shared memory: the B
    tile and the next one live in registers (2 x BLOCK_N x BLOCK_K elements over the program's threads) on
    top of ~96 a thread for the rest (sm_90a builds of the decode configs: 96-183 registers, estimate within
    ~15 %)."""
    threads = 32 * cfg.num_warps
    b_regs = 2 * cfg.block_n * cfg.block_k * dtype_bytes(problem.b_dtype) // (4 * threads)
    return max(1, REGISTERS_PER_SM // (threads * min(255, 96 + b_regs)))


def fill_block_m(cfg: GemmConfig, problem: GemmProblem) -> GemmConfig:
    if cfg.block_m != DECODE_M:
        return cfg
    return dataclasses.replace(cfg, block_m=min(64, _pow2_at_least(problem.M, 16)))


def fits_shape(cfg: GemmConfig, problem: GemmProblem) -> bool:
    """No block wider than twice the (power-of-two) problem in that dimension; TMA only where allowed."""
    if cfg.tma and not problem.tma_ok:
        return False
    if cfg.block_n > 2 * _pow2_at_least(problem.N, 16) or cfg.block_k > 2 * _pow2_at_least(problem.K, 16):
        return False
    if cfg.block_m > 2 * _pow2_at_least(problem.M, 16):
        return False
    if cfg.kernel == "persistent" and problem.Z > 1 and cfg.tma:
        return False
    return True


WS_CAPABILITY = 90  # triton 3.6's Hopper warp specialisation; on sm_100a its persistent + epilogue fails to compile
WS_NUM_WARPS = 4  # at num_warps=8 the Hopper pass leaves the kernel as it is (no setmaxnreg in the PTX)


def ws_possible(cfg: GemmConfig, part: Part, hooked: bool) -> bool:
    """Whether ``cfg`` may run warp-specialised on ``part``. Every exclusion is a compile failure seen with
    triton 3.6 on sm_90a, two of them aborts (UNREACHABLE in WSDataPartition.cpp, which kills the process):
    the epilogue's column halves (reshape/permute/split), and the split-K atomics after the loop. Pointer
    loads fail (the pass wants TMA). A generated hook could hold any op, so hooked epilogues stay
    unspecialised."""
    # The tiled kernel is never specialised: on the H200 (docs/decisions/012-gemm-config-space.md) its
    # warp-specialised form compiles and runs but returns wrong results (inf/garbage at 128x4096, 1024^2 and 4096^2,
    # every such candidate); the persistent kernel's specialised form passed the same checks.
    return (part.vendor == "nvidia" and part.capability == WS_CAPABILITY and cfg.tma and tma_allowed(part)
            and cfg.num_warps == WS_NUM_WARPS and cfg.epi_subtile == 1 and not hooked
            and cfg.kernel == "persistent")


def b_stream_possible(cfg: GemmConfig, part: Part) -> bool:
    """B_STREAM's evict-first hint reaches the hardware only on NVIDIA and only from loads into registers:
    triton 3.6 drops it from its cp.async and TMA pipelines, so the config must be the tiled pointer kernel at
    num_stages=1 (its own one-step register lead replaces the pipeline)."""
    return (part.vendor == "nvidia" and cfg.kernel == "tiled" and not cfg.tma and cfg.num_stages == 1
            and cfg.block_m <= B_STREAM_MAX_BLOCK_M)


def b_evict_first_possible(cfg: GemmConfig, part: Part, hooked: bool) -> bool:
    """The evict-first policy is written into the PTX of B's TMA loads through host-made descriptors
    (``ptx_hints``): NVIDIA, TMA, not warp-specialised (those configs make their descriptors in the kernel).
    Only where the config still loads through TMA here (on sm_80 a TMA config falls back to pointer loads)."""
    return (part.vendor == "nvidia" and cfg.tma and tma_allowed(part)
            and not (cfg.warp_specialize and ws_possible(cfg, part, hooked)))


# Measured (docs/decisions/013-gemm-decode-and-skinny-tiles.md): with 16-row tiles the register-fed dot is cheap and
# b_stream led at M = 1 and 16; with 64 rows and more (M = 64 ... 256) every b_stream config lost to the pipelined
# ones by 25-200 %.
B_STREAM_MAX_BLOCK_M = 16


def tma_allowed(part: Part) -> bool:
    return part.has_tma and tma_supported()


@functools.lru_cache(maxsize=1)
def tma_supported() -> bool:
    """This Triton has in-kernel tensor descriptors and an allocator hook (triton >= 3.4)."""
    try:
        import triton
        import triton.language as tl

        return hasattr(tl, "make_tensor_descriptor") and hasattr(triton, "set_allocator")
    except Exception:
        return False


def candidates(problem: GemmProblem, part: Part | None = None, limit: int | None = None,
               precision: str | None = None) -> list[GemmConfig]:
    """The configs worth timing for ``problem`` on ``part``, best guess first. ``precision`` ("tf32" or
    "ieee") matters for fp32 inputs on NVIDIA only; None: torch's current setting (:func:`fp32_precision`)."""
    part = part or current_part()
    space = space_of(problem, part)
    out: list[GemmConfig] = []
    one_byte = problem.a_dtype.startswith("float8") or problem.a_dtype == "int8"
    four_byte = problem.in_bytes == 4
    fma = four_byte and part.vendor == "nvidia" and (precision or fp32_precision(part)) == "ieee"
    hooked = "hook=" in problem.epilogue
    for cfg in space:
        if cfg.tma and not tma_allowed(part):
            cfg = dataclasses.replace(cfg, tma=False)
        if cfg.warp_specialize and not ws_possible(cfg, part, hooked):
            continue
        if cfg.stream_k and (cfg.kernel != "persistent" or cfg.warp_specialize):
            continue  # the tail's atomics abort triton 3.6's warp specialisation, as split-K's do
        if cfg.flatten and (cfg.kernel != "persistent" or cfg.warp_specialize or cfg.stream_k
                            or part.vendor != "nvidia"):
            continue  # see FLATTEN_NOTE
        if cfg.stream_k and not stream_k_worth_it(cfg, problem, part):
            continue
        if cfg.warp_specialize and (four_byte or one_byte) and not k_major_operands(problem):
            continue  # triton 3.6 cannot compile it (NVIDIA_SPACE_4B; fp8 too: docs/decisions/018-gemm-k-major-copy.md)
        if cfg.kpack > 1 and part.arch == "gfx950":
            cfg = dataclasses.replace(cfg, kpack=1)  # deprecated from gfx950 on (the compiler forces 1)
        cfg = fill_block_m(cfg, problem)
        if cfg.b_stream and not b_stream_possible(cfg, part):
            continue
        if cfg.b_evict_first and not b_evict_first_possible(cfg, part, hooked):
            continue
        if one_byte:
            # 1-byte inputs: twice the K a stage for the same bytes (wgmma's K step is 32 for 8-bit types)
            wide = dataclasses.replace(cfg, block_k=cfg.block_k * 2)
            if smem_estimate(wide, problem) <= part.smem_bytes and fits_shape(wide, problem):
                cfg = wide
        cfg = fill_split_k(cfg, problem, part)
        if cfg.warp_specialize and cfg.split_k > 1:
            continue
        if not fits_shape(cfg, problem) or smem_estimate(cfg, problem) > part.smem_bytes:
            continue
        if fma and not fma_fits(cfg, problem):
            continue
        if cfg not in out:
            out.append(cfg)
    if problem.shape_class(part.multiprocessors) == "skinny":
        # 64 < M <= 256: a config that needs a second wave of programs where another runs in one is timed after
        # it (M = 256 x 8192: 64-row tiles are 256 programs at one a SM, 128-row tiles 128), and the space's
        # order decides among configs of the same wave count
        out.sort(key=lambda c: waves(c, problem, part))
    if four_byte and part.vendor == "nvidia" and not fma:
        # tf32 wgmma wants its operands K-major: a TMA tile of an N-major B (or M-major A) is transposed
        # through registers each K step (see NVIDIA_SPACE_4B), so the pointer kernels lead there and the TMA
        # kernels lead for K-major operands; the order within each group stays the space's
        tma_first = k_major_operands(problem)
        out = [c for c in out if c.tma == tma_first] + [c for c in out if c.tma != tma_first]
    if not out:
        out.append(SAFE_CONFIG)
    return out[:limit] if limit else out


def default_config(problem: GemmProblem, part: Part | None = None, precision: str | None = None) -> GemmConfig:
    """The heuristic choice: the first candidate (used when not tuning)."""
    return candidates(problem, part, limit=1, precision=precision)[0]


def describe_space(problem: GemmProblem, part: Part | None = None) -> str:
    return "\n".join(c.label() for c in candidates(problem, part))


def unique(configs: Iterable[GemmConfig]) -> list[GemmConfig]:
    seen: list[GemmConfig] = []
    for c in configs:
        if c not in seen:
            seen.append(c)
    return seen


def configs_from_json(rows: Sequence[dict]) -> list[GemmConfig]:
    return [GemmConfig.from_json(r) for r in rows]
