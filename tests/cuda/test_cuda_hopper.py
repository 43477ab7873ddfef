"""The Hopper rungs of the CUDA C++ GEMM ladder: 7 (TMA + mbarrier pipeline + wgmma), 8 (warp-specialised
producer/consumer warpgroups with setmaxnreg, 128x256 tiles) and 9 (persistent, L2-grouped, cluster-of-2 TMA
multicast, TMA-store epilogue with bias + GeLU).

CPU (no GPU needed, the CI runs these):
  * every rung compiles for sm_90a with `-gencode=arch=compute_90a,code=sm_90a`; the SASS contains HGMMA (and
    the TMA instructions), no local memory (ptxas: 0 bytes stack frame, 0 spill stores/loads; no LDL/STL);
    wgmma is never serialised by ptxas; setmaxnreg took effect in rungs 8 and 9 (no warning C7508);
  * the C ABI: b_layout, requirements and argument rejection called through ctypes (host code only);
  * models of what cannot be tested without the hardware: the 128B swizzle TMA writes vs the addresses the
    wgmma descriptor reads, the accumulator fragment -> (row, col) map, the TMA-store staging layout (and its
    bank-conflict freedom), the grouped tile order, and a random-interleaving simulation of each rung's
    mbarrier protocol (no deadlock, no stage overwritten while read, every k-tile delivered).
GPU (marked gpu, run on the H200): results against a float32 reference at several sizes including 4096^3,
outputs poisoned with NaN first (and padding outside C checked untouched), bf16 and fp16, bias and
bias+GeLU epilogues, and rung 9's debug variants (which feature a wrong result comes from).
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import random
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tilefuse import config, diskcache
from tilefuse.cuda import build as ladder_build

from tests.support import assert_close, poison, poisoned_empty

pytestmark = pytest.mark.xdist_group("cuda_hopper")  # one worker builds the three libraries once

ROOT = Path(__file__).resolve().parents[2]
CUDA_DIR = ROOT / "tilefuse" / "cuda" / "ladder"
RUNGS = {7: "rung7_tma_wgmma.cu", 8: "rung8_warpspec.cu", 9: "rung9_persistent.cu"}
CUDA_ERROR_INVALID_VALUE = 1


# ------------------------------------------------------------------------------------------------- build
@dataclass
class Built:
    rung: int
    library: Path
    log: str   # nvcc + ptxas -v output
    sass: str  # cuobjdump -sass of the library ("" when cuobjdump is missing)


_BUILDS: dict[int, Built] = {}
PARENT_CACHE_ENV = "TILEFUSE_HOPPER_PARENT_CACHE"  # the GPU child process reuses its parent's builds


def build(rung: int) -> Built:
    """The library of a rung for sm_90a, from the ladder's own build (:mod:`tilefuse.cuda.build`: nvcc, cached on
    disk by the source and every header it includes); the three rungs build in parallel on first use. The GPU
    child process (test_gpu_checks_in_a_child_process) looks them up in its parent's cache folder."""
    if rung not in _BUILDS:
        parent_cache = os.environ.get(PARENT_CACHE_ENV)
        with config.override(cache_dir=parent_cache) if parent_cache else contextlib.nullcontext():
            results = ladder_build.build_many([(ladder_build.rung(r), "sm_90a") for r in RUNGS], jobs=len(RUNGS))
        for r, built in zip(RUNGS, results):
            if isinstance(built, ladder_build.BuildError):
                raise AssertionError(f"rung {r} did not build for sm_90a:\n{built}")
            assert built.target == "sm_90a" and "-gencode=arch=compute_90a,code=sm_90a" in built.command
            sass = built.sass_path.read_text() if built.sass_path else ""
            _BUILDS[r] = Built(r, built.library, built.log, sass)
    return _BUILDS[rung]


def _have_nvcc() -> bool:
    return ladder_build.have_nvcc()


needs_nvcc = pytest.mark.skipif(not _have_nvcc(), reason="nvcc is not on the PATH (TILEFUSE_NVCC)")


# ---------------------------------------------------------------------------------------- compile checks
def _kernel_reports(log: str) -> dict[str, str]:
    """ptxas -v: the 'Function properties' and 'Used N registers' lines, by kernel (entry) name."""
    reports: dict[str, str] = {}
    current = None
    for line in log.splitlines():
        m = re.search(r"Function properties for (\S+)", line)
        if m:
            current = m.group(1)
            reports[current] = ""
            continue
        if current is not None and ("stack frame" in line or "Used" in line):
            reports[current] += line.strip() + "\n"
    return {k: v for k, v in reports.items() if "rung" in k}


@needs_nvcc
@pytest.mark.parametrize("rung", sorted(RUNGS))
def test_compiles_for_sm90a_without_local_memory(rung):
    built = build(rung)
    reports = _kernel_reports(built.log)
    # a bf16 and an fp16 kernel for each epilogue (none, bias, GeLU)
    kernels = 6
    assert len(reports) == kernels, f"expected {kernels} kernels (bf16 and fp16) in the ptxas report:\n{built.log}"
    for name, report in reports.items():
        assert "0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads" in report, f"{name}:\n{report}"
    assert "error" not in built.log.lower(), built.log


@needs_nvcc
@pytest.mark.parametrize("rung", sorted(RUNGS))
def test_wgmma_is_not_serialised_and_there_are_no_warnings(rung):
    """ptxas says 'wgmma.mma_async instructions are serialized' (C7510..C7520) when it cannot pipeline them
    (accumulators touched between wgmma and wait, a call in between, too few registers)."""
    log = build(rung).log
    assert "serialized" not in log, log
    assert "warning" not in log.lower(), log


@needs_nvcc
@pytest.mark.parametrize("rung", sorted(RUNGS))
def test_sass_has_hgmma_and_tma(rung):
    sass = build(rung).sass
    if not sass:
        pytest.skip("cuobjdump (triton wheel) is not installed")
    assert "HGMMA.64x" in sass, "no HGMMA: the kernel is not on the wgmma path"
    assert "UTMALDG" in sass, "no TMA loads (UTMALDG)"
    assert not re.search(r"\b(LDL|STL)\b", sass), "local-memory loads/stores in the SASS"
    hgmma = re.findall(r"HGMMA\.(\d+x\d+x\d+)", sass)
    # rung 9's balanced schedule adds m64n240k16 for its narrow tiles
    assert set(hgmma) == {7: {"64x128x16"}, 8: {"64x256x16"}, 9: {"64x256x16", "64x240x16"}}[rung], set(hgmma)
    if rung == 9:
        assert "UTMALDG.2D.MULTICAST" in sass, "rung 9 must multicast B across its cluster"
        assert "UTMASTG" in sass, "rung 9's epilogue must store with TMA"
        # tilefuse_rung9_set_l2: every TMA access carries its L2 policy (the `desc[UR]` operand) in one form, so
        # the policies cost no second copy of the unrolled store loops (a build with one was +36 % SASS and 1.1 %
        # slower: docs/decisions/006-rung9-l2-policies.md)
        forms = {re.sub(r"UR\d+", "UR", f) for f in re.findall(r"UTMA(?:LDG|STG)[^;]*;", sass)}
        assert forms == {"UTMALDG.2D [UR], [UR], desc[UR] ;", "UTMALDG.2D.MULTICAST [UR], [UR], UR, desc[UR] ;",
                         "UTMASTG.2D [UR], [UR], desc[UR] ;"}, sorted(forms)


def _hgmma_loops(sass: str) -> list[list[str]]:
    """The innermost loop around each group of HGMMAs in cuobjdump -sass text: from the target of the first
    predicated backward branch after the group to that branch, one instruction text a row."""
    loops: list[list[str]] = []
    for function in re.split(r"\n\s*Function : ", sass)[1:]:
        ins = [(int(a, 16), t.strip()) for a, t in re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;\n]*);", function)]
        index = {a: i for i, (a, _) in enumerate(ins)}
        hgmma = [i for i, (_, t) in enumerate(ins) if "HGMMA" in t]
        groups: list[list[int]] = []
        for i in hgmma:
            if groups and i - groups[-1][-1] <= 40:
                groups[-1].append(i)
            else:
                groups.append([i])
        for group in groups:
            for j in range(group[-1], len(ins)):
                m = re.match(r"@!?U?P\w+\s+BRA\s+(0x[0-9a-f]+)", ins[j][1])
                if m and int(m.group(1), 16) <= ins[group[0]][0]:
                    loops.append([t for _, t in ins[index[int(m.group(1), 16)]:j + 1]])
                    break
    return loops


# Static instructions of a rung-9 consumer k-loop, the timeout spin of the barrier wait included (63 for the
# cooperative loop, 61 for ping-pong since the mainloop review; 224 and 210 before it:
# docs/decisions/004-rung9-consumer-k-loop.md).
RUNG9_KLOOP_MAX_INSTRUCTIONS = 72
BK_STEPS_RUNG9 = 4  # BK / WGMMA_K = 64 / 16 HGMMAs a k-tile


@needs_nvcc
def test_rung9_consumer_kloop_has_no_per_iteration_overhead():
    """The k-loop of each consumer (both dtypes and epilogues, cooperative and ping-pong): descriptors in uniform registers
    (no R2UR moves before each HGMMA, no S2R/S2UR re-reading the thread index or the CTA's shared window), one
    predicated arrive a lane for the stage release (no loop over cluster ranks, no divergent branch)."""
    sass = build(9).sass
    if not sass:
        pytest.skip("cuobjdump (triton wheel) is not installed")
    loops = _hgmma_loops(sass)
    assert len(loops) == 18, ("expected 2 dtypes x 3 epilogues x (cooperative whole and narrow tiles, ping-pong) "
                              f"k-loops, found {len(loops)}")
    widths = sorted(re.search(r"HGMMA\.64x(\d+)x16", next(t for t in body if "HGMMA" in t)).group(1) for body in loops)
    assert widths == ["240"] * 6 + ["256"] * 12, widths  # the balanced schedule's narrow tiles: m64n240k16
    for body in loops:
        text = "\n".join(body)
        assert sum("HGMMA" in t for t in body) == BK_STEPS_RUNG9, text
        for opcode in ("R2UR", "S2R", "S2UR", "BSSY"):
            assert not any(re.search(rf"(^|\s){opcode}\b", t) for t in body), f"{opcode} in the k-loop:\n{text}"
        assert sum("SYNCS.ARRIVE.TRANS64.RED" in t for t in body) == 1, f"the stage release:\n{text}"
        assert len(body) <= RUNG9_KLOOP_MAX_INSTRUCTIONS, f"{len(body)} instructions:\n{text}"


@needs_nvcc
@pytest.mark.parametrize("rung", [8, 9])
def test_setmaxnreg_took_effect(rung):
    built = build(rung)
    assert "C7508" not in built.log, built.log  # "setmaxnreg ignored": no register cap at entry, or misplaced
    if built.sass:
        assert "USETMAXREG.DEALLOC" in built.sass and "USETMAXREG.TRY_ALLOC" in built.sass
    for name, report in _kernel_reports(built.log).items():
        regs = int(re.search(r"Used (\d+) registers", report).group(1))
        assert regs <= 168, f"{name}: {regs} registers at entry; 384 threads x 168 is an SM's 64K registers"


def compiled_source(rung: int) -> str:
    """The text nvcc compiles for a rung: its file and every local header it includes."""
    r = ladder_build.rung(rung)
    return "\n".join(p.read_text() for p in [r.path, *r.includes()])


# each shared helper of hopper.cuh, as the start of its definition
SHARED_HELPERS = ("constexpr uint64_t make_desc_sw128(", "void mbar_wait(", "bool mbar_try_wait(",
                  "void mbar_arrive_expect_tx(", "void tma_load_2d(uint32_t dst, const CUtensorMap* map, int c0, int c1, "
                  "uint32_t bar) {", "void wgmma_fence()", "void fence_accumulators(", "void regs_release()",
                  "#define TF_WGMMA_M64N256K16(", "#define TF_WGMMA_M64N128K16(", "void store_fragment(",
                  "cudaError_t encode_2d(", "tensor_map_encoder() {", "bool aligned16(")


@pytest.mark.parametrize("rung", sorted(RUNGS))
def test_hopper_rungs_share_one_header(rung):
    """Rungs 7-9 take their TMA / mbarrier / wgmma helpers from hopper.cuh and define none of them again."""
    r = ladder_build.rung(rung)
    assert CUDA_DIR / "hopper.cuh" in r.includes()
    own = r.path.read_text()
    header = (CUDA_DIR / "hopper.cuh").read_text()
    for helper in SHARED_HELPERS:
        assert header.count(helper) == 1, helper
        assert helper not in own, f"{r.path.name} defines {helper!r} again (it is in hopper.cuh)"
    # a helper only one rung uses stays in that rung: rung 9's L2-hinted TMA load is an overload, not a copy
    assert ("void tma_load_2d(" in own) == (rung == 9)


def test_the_reports_lines_of_code_count_the_shared_header_with_each_rung():
    """A Hopper rung's figure in the report is still the code it takes to write it: its file and hopper.cuh."""
    from tilefuse.bench import report_html

    header = report_html.code_lines_cpp((CUDA_DIR / "hopper.cuh").read_text())
    for rung, name in RUNGS.items():
        own = report_html.code_lines_cpp((CUDA_DIR / name).read_text())
        assert report_html.rung_source_lines(str(rung)) == own + header
    assert report_html.rung_source_lines("6") == report_html.code_lines_cpp(
        next(CUDA_DIR.glob("rung6_*.cu")).read_text())  # a rung without it: its file alone


def test_the_build_cache_key_covers_the_shared_header(tmp_path):
    """Editing hopper.cuh rebuilds every Hopper rung (the key hashes each header a rung includes)."""
    for f in CUDA_DIR.iterdir():
        if f.suffix in (".cu", ".cuh", ".h"):
            (tmp_path / f.name).write_bytes(f.read_bytes())
    rungs = [ladder_build._rung_from(tmp_path / RUNGS[r]) for r in sorted(RUNGS)]
    portable = ladder_build._rung_from(tmp_path / "rung5_warp_tiling.cu")
    before = [ladder_build.cache_key(r, "sm_90a") for r in rungs] + [ladder_build.cache_key(portable, "sm_80")]
    header = tmp_path / "hopper.cuh"
    header.write_text(header.read_text() + "\n// an edit\n")
    after = [ladder_build.cache_key(r, "sm_90a") for r in rungs] + [ladder_build.cache_key(portable, "sm_80")]
    assert all(b != a for b, a in zip(before[:3], after[:3]))  # every Hopper rung's key moved
    assert before[3] == after[3]  # a rung that does not include it did not


@pytest.mark.parametrize("rung", sorted(RUNGS))
def test_metadata_and_header(rung):
    text = (CUDA_DIR / RUNGS[rung]).read_text()
    first = text.splitlines()[0]
    m = re.fullmatch(r'// tilefuse: rung=(\d+) arch=(\S+) portable=no reason="([^"]+)" claims=HGMMA', first)
    assert m, first
    assert int(m.group(1)) == rung and m.group(2) == "sm_90a" and "Hopper-only" in m.group(3)
    header = text.split("#include")[0]
    assert "What it adds over rung" in header or "Rung 8's" in header
    # the measured result of a device run, not a placeholder
    assert re.search(r"// Measured \(H200.*TFLOP/s", header, re.S) and "not measured yet" not in header, header


# --------------------------------------------------------------------------------------------- the C ABI
def _load(rung: int) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(build(rung).library))
    fn = getattr(lib, f"tilefuse_rung{rung}")
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int] * 3 + [ctypes.c_longlong] * 3 + \
                  [ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
    getattr(lib, f"tilefuse_rung{rung}_b_layout").restype = ctypes.c_int
    req = getattr(lib, f"tilefuse_rung{rung}_requirements")
    req.restype = ctypes.c_int
    req.argtypes = [ctypes.POINTER(ctypes.c_int)] * 3
    return lib


@needs_nvcc
@pytest.mark.parametrize("rung", sorted(RUNGS))
def test_abi_layout_and_requirements(rung):
    lib = _load(rung)
    assert getattr(lib, f"tilefuse_rung{rung}_b_layout")() == 1  # B given as [N, K]: K-major, as wgmma reads it
    m, n, k = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
    assert getattr(lib, f"tilefuse_rung{rung}_requirements")(ctypes.byref(m), ctypes.byref(n), ctypes.byref(k)) == 0
    assert (m.value, n.value, k.value) == ((1, 8, 8) if rung == 9 else (1, 1, 8))


@needs_nvcc
@pytest.mark.parametrize("rung", sorted(RUNGS))
def test_abi_rejects_bad_arguments_before_touching_the_gpu(rung):
    fn = getattr(_load(rung), f"tilefuse_rung{rung}")
    p = ctypes.c_void_p(0x1000)  # never dereferenced: every call below fails its checks first

    def call(**kw):
        a = dict(A=p, B=p, C=p, bias=None, M=128, N=256, K=64, lda=64, ldb=64, ldc=256, dtype=0, epilogue=0)
        a.update(kw)
        return fn(a["A"], a["B"], a["C"], a["bias"], a["M"], a["N"], a["K"], a["lda"], a["ldb"], a["ldc"],
                  a["dtype"], a["epilogue"], None)

    assert call(dtype=2) == CUDA_ERROR_INVALID_VALUE
    assert call(epilogue=3) == CUDA_ERROR_INVALID_VALUE
    assert call(epilogue=1, bias=None) == CUDA_ERROR_INVALID_VALUE
    assert call(K=60, lda=60, ldb=60) == CUDA_ERROR_INVALID_VALUE  # K % 8
    assert call(lda=32) == CUDA_ERROR_INVALID_VALUE                 # lda < K
    assert call(ldb=100) == CUDA_ERROR_INVALID_VALUE                # 200-byte rows: not a TMA stride
    assert call(A=ctypes.c_void_p(0x1008)) == CUDA_ERROR_INVALID_VALUE  # TMA needs 16-byte alignment
    assert call(M=-1) == CUDA_ERROR_INVALID_VALUE
    assert call(M=0) == 0 and call(N=0) == 0  # empty output: nothing to do
    if rung == 9:
        assert call(ldc=260) == CUDA_ERROR_INVALID_VALUE  # C is stored by TMA too
        assert call(N=250) == CUDA_ERROR_INVALID_VALUE    # and its stores clip N to 16-byte units only


def _schedule_abi(lib):
    lib.tilefuse_rung9_set_schedule.restype = ctypes.c_int
    lib.tilefuse_rung9_set_schedule.argtypes = [ctypes.c_int] * 4
    lib.tilefuse_rung9_get_schedule.restype = ctypes.c_int
    lib.tilefuse_rung9_get_schedule.argtypes = [ctypes.POINTER(ctypes.c_int)]
    return lib


RUNG9_SWITCHES = {"pingpong": 0, "stores": 0, "streamk": 1, "balance": 1}  # name -> default


def _switches_abi(lib):
    """Declare rung 9's on/off switches: tilefuse_rung9_set/get_NAME for each of RUNG9_SWITCHES."""
    for switch in RUNG9_SWITCHES:
        getattr(lib, f"tilefuse_rung9_set_{switch}").restype = ctypes.c_int
        getattr(lib, f"tilefuse_rung9_set_{switch}").argtypes = [ctypes.c_int]
        getattr(lib, f"tilefuse_rung9_get_{switch}").restype = ctypes.c_int
        getattr(lib, f"tilefuse_rung9_get_{switch}").argtypes = []
    return lib


def _get_schedule(lib) -> list[int]:
    out = (ctypes.c_int * 7)()
    assert lib.tilefuse_rung9_get_schedule(out) == 0
    return list(out)


@needs_nvcc
def test_rung9_schedule_abi_checks_its_arguments():
    """The run-time schedule (host code only): bad values are refused and change nothing; 0 means default."""
    lib = _schedule_abi(_load(9))
    assert _get_schedule(lib) == [0, 0, 0, 0, 8, 0, 2]  # defaults: GROUP_M 8, row groups, clusters of 2
    for bad in ((-1, 0, 0, 0), (0, -1, 0, 0), (0, 1 << 17, 0, 0), (0, 0, 2, 0), (0, 0, 0, 3), (0, 0, 0, -1)):
        assert lib.tilefuse_rung9_set_schedule(*bad) == CUDA_ERROR_INVALID_VALUE, bad
        assert _get_schedule(lib)[:4] == [0, 0, 0, 0]
    try:
        assert lib.tilefuse_rung9_set_schedule(60, 4, 1, 1) == 0
        assert _get_schedule(lib)[:4] == [60, 4, 1, 1]
    finally:
        assert lib.tilefuse_rung9_set_schedule(0, 0, 0, 0) == 0


@needs_nvcc
@pytest.mark.parametrize("switch", list(RUNG9_SWITCHES))
def test_rung9_on_off_switches(switch):
    """tilefuse_rung9_set_pingpong (cooperative consumers by default) and tilefuse_rung9_set_stores (one store
    thread a warpgroup by default) are off until measured to win; tilefuse_rung9_set_streamk and
    tilefuse_rung9_set_balance are on (measured: docs/decisions/004, 005, 008, 009). Each takes 0 or 1 only, and a
    refused value changes nothing."""
    lib = _switches_abi(_load(9))
    set_, get = getattr(lib, f"tilefuse_rung9_set_{switch}"), getattr(lib, f"tilefuse_rung9_get_{switch}")
    default = RUNG9_SWITCHES[switch]
    assert get() == default
    for bad in (-1, 2, 7):
        assert set_(bad) == CUDA_ERROR_INVALID_VALUE
        assert get() == default
    try:
        assert set_(1 - default) == 0 and get() == 1 - default
    finally:
        assert set_(default) == 0


RUNG9_DEFAULT_L2 = (0, 0, 1)  # A's and B's loads evict-normal, C's stores evict-first


def _l2_abi(lib):
    lib.tilefuse_rung9_set_l2.restype = ctypes.c_int
    lib.tilefuse_rung9_set_l2.argtypes = [ctypes.c_int] * 3
    lib.tilefuse_rung9_get_l2.restype = ctypes.c_int
    lib.tilefuse_rung9_get_l2.argtypes = [ctypes.POINTER(ctypes.c_int)]
    return lib


def _get_l2(lib) -> list[int]:
    out = (ctypes.c_int * 3)()
    assert lib.tilefuse_rung9_get_l2(out) == 0
    return list(out)


@needs_nvcc
def test_rung9_l2_switch():
    """tilefuse_rung9_set_l2(a, b, c): evict-first on C's stores by default (the one policy that never lost:
    docs/decisions/006-rung9-l2-policies.md), each of 0-2, a refused value changes nothing, a null out pointer is
    refused."""
    lib = _l2_abi(_load(9))
    assert _get_l2(lib) == list(RUNG9_DEFAULT_L2) == [0, 0, 1]
    for bad in ((-1, 0, 0), (0, 3, 0), (0, 0, 7), (3, 3, 3)):
        assert lib.tilefuse_rung9_set_l2(*bad) == CUDA_ERROR_INVALID_VALUE, bad
        assert _get_l2(lib) == list(RUNG9_DEFAULT_L2)
    assert lib.tilefuse_rung9_get_l2(None) == CUDA_ERROR_INVALID_VALUE
    try:
        for policies in ((1, 2, 0), (2, 0, 1), (0, 0, 0)):
            assert lib.tilefuse_rung9_set_l2(*policies) == 0 and _get_l2(lib) == list(policies)
    finally:
        assert lib.tilefuse_rung9_set_l2(*RUNG9_DEFAULT_L2) == 0


def _streamk_abi(lib):
    _switches_abi(lib)
    lib.tilefuse_rung9_streamk_launches.restype = ctypes.c_longlong
    lib.tilefuse_rung9_streamk_launches.argtypes = []
    lib.tilefuse_rung9_streamk_plan.restype = ctypes.c_int
    lib.tilefuse_rung9_streamk_plan.argtypes = [ctypes.c_int] * 4 + [ctypes.POINTER(ctypes.c_int)] * 2 + [ctypes.c_int]
    return lib


@needs_nvcc
def test_rung9_streamk_launch_counter():
    """tilefuse_rung9_streamk_launches (the switch itself: test_rung9_on_off_switches) answers without a GPU."""
    lib = _streamk_abi(_load(9))
    assert lib.tilefuse_rung9_streamk_launches() >= 0


def _streamk_items(lib, tiles: int, clusters: int, k_tiles: int):
    """{cluster: [(tile, kb, ke, waits)]} as the kernel walks them (tilefuse_rung9_streamk_plan), and the split."""
    split = lib.tilefuse_rung9_streamk_plan(tiles, clusters, k_tiles, 0, None, None, 0)
    assert split in (0, 1)
    cap = tiles + 4
    out = {}
    for c in range(clusters):
        items, waits = (ctypes.c_int * (3 * cap))(), (ctypes.c_int * (4 * cap))()
        n = lib.tilefuse_rung9_streamk_plan(tiles, clusters, k_tiles, c, items, waits, cap)
        assert n >= 0, (tiles, clusters, k_tiles, c)
        out[c] = [(items[3 * i], items[3 * i + 1], items[3 * i + 2], [w for w in waits[4 * i:4 * i + 4] if w >= 0])
                  for i in range(n)]
    return out, bool(split)


# (cluster-tiles, clusters, k-tiles). Small grids that split, for the protocol simulation too:
STREAMK_SPLITS = [(5, 3, 64), (11, 4, 80), (11, 7, 48), (13, 8, 48), (6, 4, 40)]
# ... and the H200's 66 clusters at 4096^3, 8192^3, 16384x4096x4096 and the GPU test's ragged shape; whole
# rounds; fewer tiles than clusters; the policy's edges; small odd grids that do not split
STREAMK_PLANS = [(256, 66, 64), (1024, 66, 128), (1024, 66, 64), (106, 66, 63), (132, 66, 64), (64, 66, 32),
                 (16, 66, 16), (7, 3, 8), (11, 4, 9), (23, 7, 5), (3, 2, 1), (1, 1, 7)] + STREAMK_SPLITS


@needs_nvcc
@pytest.mark.parametrize("tiles,clusters,k_tiles", STREAMK_PLANS)
def test_rung9_streamk_plan(tiles, clusters, k_tiles):
    """The stream-K plan as the kernel walks it: every k-tile of every tile exactly once; whole tiles round-robin as
    before; where it splits, a cluster leaves at most one partial sum (its first split piece, without the tile's first
    k-tile), every tile in at most 3 pieces, and the piece with a split tile's first k-tile adds exactly the sums of
    the tile's other pieces, each written by the first piece of a later cluster."""
    lib = _streamk_abi(_load(9))
    plan, split = _streamk_items(lib, tiles, clusters, k_tiles)
    seen = {}
    for c, items in plan.items():
        for t, kb, ke, _ in items:
            assert 0 <= t < tiles and 0 <= kb < ke <= k_tiles, (c, t, kb, ke)
            for k in range(kb, ke):
                assert (t, k) not in seen, f"k-tile {k} of tile {t}: clusters {seen[(t, k)]} and {c}"
                seen[(t, k)] = c
    assert len(seen) == tiles * k_tiles
    whole_end = tiles // clusters * clusters if split else tiles
    for c, items in plan.items():
        whole = [it for it in items if it[0] < whole_end]
        assert [it[0] for it in whole] == list(range(c, whole_end, clusters))
        assert all(kb == 0 and ke == k_tiles and not waits for _, kb, ke, waits in whole)
        pieces = items[len(whole):]
        assert split or not pieces
        partial = [i for i, (_, kb, _, _) in enumerate(pieces) if kb > 0]
        assert partial in ([], [0]), f"cluster {c}: partial sums from pieces {partial}"
    if not split:
        return
    # ranges of whole k-tiles laid end to end over the split tiles, each cluster's at least half a tile
    owners = {}
    for c, items in plan.items():
        for t, kb, ke, waits in items:
            if t >= whole_end:
                owners.setdefault(t, []).append((kb, c, ke, waits))
    for t, pieces in owners.items():
        pieces.sort()
        assert len(pieces) <= 3, f"tile {t} in {len(pieces)} pieces"
        head = pieces[0]
        assert head[0] == 0
        if len(pieces) == 1:
            assert head[3] == []
            continue
        assert head[3] == [c for _, c, _, _ in pieces[1:]], f"tile {t}: adds {head[3]}, pieces {pieces}"
        for kb, c, ke, waits in pieces[1:]:
            first_split = plan[c][len([it for it in plan[c] if it[0] < whole_end])]
            assert waits == [] and first_split[:3] == (t, kb, ke), f"tile {t}: cluster {c}'s piece is not its first"


@needs_nvcc
def test_rung9_streamk_plans_cover_every_piece_kind():
    """The plans above reach every case of the kernel's fix-up: a tile in 2 pieces (one partial added), a tile in 3
    (two partials added), and a cluster whose whole range lies inside one tile (a middle piece)."""
    lib = _streamk_abi(_load(9))
    adds, middle = set(), False
    for shape in STREAMK_PLANS:
        plan, split = _streamk_items(lib, *shape)
        for items in plan.values():
            adds.update(len(waits) for _, kb, ke, waits in items if kb == 0 and ke < shape[2])
            split_items = [it for it in items if it[1] > 0 or it[2] < shape[2]]
            middle |= len(split_items) == 1 and split_items[0][1] > 0 and split_items[0][2] < shape[2]
    assert adds == {1, 2} and middle, (adds, middle)


def test_rung9_streamk_policy_cases():
    """streamk_split at the shapes that matter, through the planner: 8192^3 and 16384x4096x4096 split on the H200's
    66 clusters (their last round is half empty); 4096^3 (58 of 66 busy: 2 % slower split, docs/decisions/005), 2048^3,
    whole rounds and tiny grids do not."""
    if not _have_nvcc():
        pytest.skip("nvcc is not on the PATH (TILEFUSE_NVCC)")
    lib = _streamk_abi(_load(9))
    def split(*a):
        return lib.tilefuse_rung9_streamk_plan(*a, 0, None, None, 0)
    assert split(1024, 66, 128) == split(1024, 66, 64) == split(106, 66, 63) == 1
    assert split(256, 66, 64) == split(106, 66, 16) == split(132, 66, 64) == split(64, 66, 32) == split(16, 66, 16) == 0
    assert lib.tilefuse_rung9_streamk_plan(5, 0, 4, 0, None, None, 0) == -1  # bad arguments


# ------------------------------------------------------------------------------- layout models (CPU)
# These restate, in Python, the hardware behaviour the kernels rely on (PTX ISA: tensor-map swizzle modes,
# the wgmma matrix descriptor and canonical K-major layouts, the m64nNk16 accumulator fragment) and the
# kernels' own index formulas, and check that they fit together.
SW128_ROW_BYTES = 128  # a 128B-swizzled row: 64 16-bit elements
SW128_ATOM_BYTES = 1024


def sw128_physical(addr: int) -> int:
    """The 128B swizzle, applied by TMA and by wgmma to a shared-memory byte address: 16-byte unit bits
    4-6 are XORed with bits 7-9 (the row within a 1 KB atom)."""
    return addr ^ (((addr >> 7) & 7) << 4)


def tma_box_address(base: int, row: int, col: int) -> int:
    """Where TMA (SWIZZLE_128B, box inner size 128 bytes) puts element (row, col) of a box at `base`."""
    return sw128_physical(base + row * SW128_ROW_BYTES + col * 2)


def desc_decode(desc: int) -> dict:
    return {"start": (desc & 0x3FFF) << 4, "lbo": ((desc >> 16) & 0x3FFF) << 4,
            "sbo": ((desc >> 32) & 0x3FFF) << 4, "base_offset": (desc >> 49) & 7, "swizzle": desc >> 62}


def wgmma_kmajor_sw128_address(desc: int, row: int, k: int) -> int:
    """The byte a wgmma reads for element (row, k) of a K-major operand slice (k < 16) described by `desc`
    in the 128B swizzle: 8-row core-matrix groups SBO apart, rows 128 B apart, k contiguous; swizzled."""
    d = desc_decode(desc)
    assert d["swizzle"] == 1 and d["base_offset"] == 0
    return sw128_physical(d["start"] + (row // 8) * d["sbo"] + (row % 8) * SW128_ROW_BYTES + k * 2)


def make_desc_sw128(addr: int) -> int:  # the kernels' make_desc_sw128, restated
    return ((addr & 0x3FFFF) >> 4) | ((16 >> 4) << 16) | ((1024 >> 4) << 32) | (1 << 62)


@pytest.mark.parametrize("rung", sorted(RUNGS))
def test_descriptor_encoding_is_pinned_in_the_source(rung):
    text = compiled_source(rung)
    assert "static_assert(make_desc_sw128(0x0400) == (0x40ull | (1ull << 16) | (64ull << 32) | (1ull << 62))" in text
    d = desc_decode(0x40 | (1 << 16) | (64 << 32) | (1 << 62))
    assert d == {"start": 0x400, "lbo": 16, "sbo": 1024, "base_offset": 0, "swizzle": 1}
    assert make_desc_sw128(0x400) == 0x40 | (1 << 16) | (64 << 32) | (1 << 62)


@pytest.mark.parametrize("rows,row_offset", [(64, 0), (64, 64), (256, 0), (128, 0)])
def test_wgmma_reads_what_tma_wrote(rows, row_offset):
    """A tile of R rows x 64 k written by TMA at a 1 KB-aligned base; the wgmma of k-step kk (start address
    + 32*kk, + row_offset*128 for the second m64 half / consumer) reads element (row, k) of its slice: it
    must be tile element (row_offset + row, 16*kk + k), for every row, k and kk."""
    base = 7 * SW128_ATOM_BYTES
    tile_rows = row_offset + rows
    written = {tma_box_address(base, r, c): (r, c) for r in range(tile_rows) for c in range(64)}
    assert len(written) == tile_rows * 64  # the swizzle is a permutation
    for kk in range(4):
        desc = make_desc_sw128(base + row_offset * SW128_ROW_BYTES) + kk * 2  # + DESC_K_STEP
        for row in range(rows):
            for k in range(16):
                assert written[wgmma_kmajor_sw128_address(desc, row, k)] == (row_offset + row, 16 * kk + k)


def fragment_coords(warp: int, lane: int, i: int) -> tuple[int, int]:
    """m64nNk16 fp32 accumulator d[i] of lane `lane` in warp `warp` of the warpgroup (PTX ISA figure
    'WGMMA .m64nNk16 register fragment layout for accumulator matrix D'; CUTLASS's CLayout_64xN:
    m = t1 + 16*t2 + 8*v1, n = 2*t0 + v0 + 8*v2)."""
    g, t = lane // 4, lane % 4
    return 16 * warp + g + 8 * ((i // 2) % 2), 8 * (i // 4) + 2 * t + (i % 2)


@pytest.mark.parametrize("n", [128, 256])
def test_accumulator_fragment_covers_the_tile_once(n):
    seen = {}
    for warp in range(4):
        for lane in range(32):
            for i in range(n // 2):
                rc = fragment_coords(warp, lane, i)
                assert rc not in seen, (rc, seen.get(rc), (warp, lane, i))
                seen[rc] = (warp, lane, i)
                # store_fragment's formulas: j = i // 4, h = (i // 2) % 2, col = 8j + 2t (+1 for odd i)
                j, h = i // 4, (i // 2) % 2
                assert rc == (16 * warp + lane // 4 + 8 * h, 8 * j + 2 * (lane % 4) + (i % 2))
    assert len(seen) == 64 * n and all(0 <= r < 64 and 0 <= c < n for r, c in seen)


def swizzle128_offset(row: int, col: int) -> int:  # rung 9's swizzle128_offset, restated
    return row * 128 + ((((col // 8) ^ (row % 8)) & 7) << 4) + (col % 8) * 2


def test_tma_store_staging_layout_and_banks():
    """Rung 9's epilogue writes d[i], d[i+1] of chunk j (64 columns) as one 32-bit word at
    swizzle128_offset(row, col); the TMA store (SWIZZLE_128B, box 64x64) reads element (r, c) from
    tma_box_address. They must agree, and each warp-wide st.shared must hit 32 different banks."""
    assert all(swizzle128_offset(r, c) == tma_box_address(0, r, c) for r in range(64) for c in range(64))
    for j in range(4):
        cells = {}
        for warp in range(4):
            for jj in range(8):
                for h in range(2):
                    banks = set()
                    for lane in range(32):
                        i = 4 * (8 * j + jj) + 2 * h
                        row, col = fragment_coords(warp, lane, i)
                        assert 64 * j <= col < 64 * j + 64 and fragment_coords(warp, lane, i + 1) == (row, col + 1)
                        local = col - 64 * j
                        off = swizzle128_offset(row, local)
                        assert off % 4 == 0 and swizzle128_offset(row, local + 1) == off + 2
                        cells[off] = (row, local)
                        banks.add((off // 4) % 32)
                    assert len(banks) == 32, f"bank conflict: warp {warp} jj {jj} h {h}"
        assert len(cells) == 64 * 32  # every pair of the 64x64 chunk written once


def grouped_tile(t: int, tiles_m: int, tiles_n: int, group_m: int = 8) -> tuple[int, int]:  # restated
    per_group = group_m * tiles_n
    group = t // per_group
    first = group * group_m
    rows = min(tiles_m - first, group_m)
    r = t - group * per_group
    return first + r % rows, r // rows


@pytest.mark.parametrize("tiles_m,tiles_n", [(1, 1), (1, 32), (16, 16), (32, 32), (3, 4), (13, 7), (9, 1)])
def test_grouped_tile_order_is_a_permutation(tiles_m, tiles_n):
    got = [grouped_tile(t, tiles_m, tiles_n) for t in range(tiles_m * tiles_n)]
    assert sorted(got) == [(m, n) for m in range(tiles_m) for n in range(tiles_n)]
    if tiles_m >= 8 and tiles_n >= 9:
        # The first wave of 66 clusters touches 8 cluster-rows and 9 columns, not 66 columns of one row.
        wave = got[:66]
        assert len({m for m, _ in wave}) == 8 and len({n for _, n in wave}) == 9


def test_grouped_tile_values_match_the_source():
    text = (CUDA_DIR / RUNGS[9]).read_text()
    assert "constexpr int GROUP_M = 8;" in text
    assert grouped_tile(1, 16, 16) == (1, 0) and grouped_tile(8, 16, 16) == (0, 1)
    assert grouped_tile(128, 16, 16) == (8, 0) and grouped_tile(5, 3, 4) == (2, 1)
    for expr in ("grouped_tile(1, 16, 16).row == 1", "grouped_tile(8, 16, 16).col == 1",
                 "grouped_tile(128, 16, 16).row == 8", "grouped_tile(5, 3, 4).col == 1"):
        assert expr in text  # the same values are static_asserted in the kernel source


def tile_at(t: int, tiles_m: int, tiles_n: int, group_m: int, order: int) -> tuple[int, int]:  # restated
    if order == 1:  # the transpose: groups of group_m tile-columns, row-major inside a group
        col, row = grouped_tile(t, tiles_n, tiles_m, group_m)
        return row, col
    return grouped_tile(t, tiles_m, tiles_n, group_m)


@pytest.mark.parametrize("tiles_m,tiles_n", [(1, 1), (1, 32), (16, 16), (32, 16), (3, 4), (13, 7), (9, 1)])
@pytest.mark.parametrize("group_m", [1, 2, 5, 8, 16, 64])
@pytest.mark.parametrize("order", [0, 1])
def test_run_time_tile_orders_are_permutations(tiles_m, tiles_n, group_m, order):
    """tilefuse_rung9_set_schedule's group_m and order: every tile exactly once, whatever the values."""
    got = [tile_at(t, tiles_m, tiles_n, group_m, order) for t in range(tiles_m * tiles_n)]
    assert sorted(got) == [(m, n) for m in range(tiles_m) for n in range(tiles_n)]
    if group_m == 1:  # plain row-major (order 0) and column-major (order 1)
        row_major = [(m, n) for m in range(tiles_m) for n in range(tiles_n)]
        assert got == (row_major if order == 0 else sorted(row_major, key=lambda mn: (mn[1], mn[0])))


def test_tile_at_values_match_the_source():
    text = (CUDA_DIR / RUNGS[9]).read_text()
    assert tile_at(1, 16, 16, 8, 1) == (0, 1) and tile_at(8, 16, 16, 8, 1) == (1, 0)
    assert tile_at(3, 16, 16, 1, 0) == (0, 3) and tile_at(3, 16, 16, 1, 1) == (3, 0)
    for expr in ("tile_at(1, 16, 16, 8, ORDER_COLUMN_GROUPS).col == 1", "tile_at(8, 16, 16, 8, ORDER_COLUMN_GROUPS).row == 1",
                 "tile_at(3, 16, 16, 1, ORDER_ROW_GROUPS).col == 3", "tile_at(3, 16, 16, 1, ORDER_COLUMN_GROUPS).row == 3"):
        assert expr in text


def test_shared_memory_budgets():
    """Stages and staging buffers fit the 227 KB a block may have (rung 7: two CTAs an SM, 228 KB in all)."""
    limit = 227 * 1024
    rung7 = 1024 + 3 * (16384 + 16384) + 2 * 3 * 8
    rung8 = 1024 + 4 * (16384 + 32768) + 2 * 4 * 8
    ring = 4 * (16384 + 32768) + 2 * 2 * 8192           # rung 9 cooperative: 4 stages + 2 C chunks a consumer
    pingpong = 5 * (8192 + 32768) + 2 * 1 * 8192        # rung 9 ping-pong: 5 stages of 64 rows + 1 chunk each
    rung9 = 1024 + ring + (2 * 5 + 2) * 8               # + full/empty for 5 stages, 2 turn barriers
    assert 2 * (rung7 + 1024) <= 228 * 1024 and rung8 <= limit and rung9 <= limit and pingpong <= ring
    for rung, text in ((8, "constexpr int STAGES = 4;"), (9, "constexpr int STAGES = 4;"), (7, "constexpr int STAGES = 3;"),
                       (9, "constexpr int PP_STAGES = 5;"), (9, "constexpr int PP_BM = 64;"),
                       (9, "constexpr int PP_C_BUFFERS = 1;")):
        assert text in (CUDA_DIR / RUNGS[rung]).read_text()


# ------------------------------------------------------------------------- protocol simulation (CPU)
# A model of the rungs' synchronisation, after the PTX ISA's mbarrier semantics: an mbarrier has an arrival
# count, pending arrivals, a transaction (tx) count and a completed-phase counter; a phase completes when
# pending arrivals and tx both reach zero (tx may go negative for a while: a peer's multicast bytes can land
# before the local expect_tx); try_wait.parity(p) succeeds once the phase of parity p has completed (a fresh
# barrier passes parity 1 at once). TMA loads (multicast ones into several CTAs) land after a random delay
# and complete_tx on each destination CTA's barrier at the same offset; a wgmma reads its stage from issue
# until a later wgmma.wait_group lets it go; a TMA store reads its staging chunk until it completes, and
# cp.async.bulk.wait_group.read N waits for all but the N newest committed groups. The actors follow the
# kernels' control flow line by line (comments name the kernel lines); a scheduler runs a random runnable
# actor or lands a random in-flight copy at every step.
class ProtocolError(AssertionError):
    pass


class Mbarrier:
    def __init__(self, count: int):
        self.count = count
        self.pending = count
        self.tx = 0
        self.completed = 0

    def arrive(self, expect_tx: int = 0) -> None:
        self.tx += expect_tx
        if self.pending <= 0:
            raise ProtocolError("an arrival beyond the barrier's count in one phase")
        self.pending -= 1
        self._maybe_complete()

    def complete_tx(self, nbytes: int) -> None:
        self.tx -= nbytes
        self._maybe_complete()

    def _maybe_complete(self) -> None:
        if self.pending == 0 and self.tx == 0:
            self.completed += 1
            self.pending = self.count

    def passed(self, parity: int) -> bool:
        return (self.completed & 1) != parity


@dataclass(eq=False)
class Copy:
    """An in-flight TMA load: writes `tag` into each (cta, key) and completes tx on each barrier."""
    writes: list
    barriers: list
    nbytes_each: int
    tag: tuple


@dataclass(eq=False)
class Store:
    """An in-flight TMA store reading the staging buffer `buf` of CTA `cta`."""
    cta: int
    buf: tuple


@dataclass
class World:
    rng: random.Random
    smem: list = field(default_factory=list)      # per CTA: dict key -> tag
    copies: list = field(default_factory=list)
    stores: list = field(default_factory=list)
    consumed: list = field(default_factory=list)  # (cta, consumer, tile, kt) in order

    def land_one(self) -> None:
        item = self.rng.choice(self.copies + self.stores)
        if isinstance(item, Copy):
            self.copies.remove(item)
            for cta, key in item.writes:
                self.smem[cta][key] = item.tag[:-1] + (key,)
            for bar in item.barriers:
                bar.complete_tx(item.nbytes_each)
        else:
            self.stores.remove(item)


def run(actors, world: World, max_steps: int = 2_000_000) -> None:
    """Interleave generator actors (each yields None or a wait predicate) and in-flight copies at random."""
    waiting = {i: None for i in range(len(actors))}
    live = dict(enumerate(actors))
    for _ in range(max_steps):
        runnable = [i for i in live if waiting[i] is None or waiting[i]()]
        if not runnable and not world.copies and not world.stores:
            if not live:
                return
            raise ProtocolError(f"deadlock: actors {sorted(live)} wait and nothing is in flight")
        if world.copies or world.stores:
            if not runnable or world.rng.random() < 0.3:
                world.land_one()
                continue
        i = world.rng.choice(runnable)
        try:
            waiting[i] = next(live[i])
        except StopIteration:
            del live[i]
            del waiting[i]
    raise ProtocolError("no progress within the step budget")


# ------------------------------------------------------------------------------------------------ rung 8/9
def simulate_warp_specialised(*, seed: int, stages: int, k_tiles: int, tiles: int, clusters: int, cluster: int,
                              persistent: bool, multicast: bool, c_chunks: int = 4, c_buffers: int = 2,
                              release_last: bool = True, remote_release: bool = True, pingpong: bool = False,
                              hand_over: bool = True, warp_stores: bool = False, store_wait: bool = True,
                              items: dict | None = None, flag_wait: bool = True, item_slots: int = 8) -> World:
    """Rung 9 (cluster=2, persistent) or rung 8 (cluster=1, one tile a CTA, release_last irrelevant).
    pingpong: rung 9's tilefuse_rung9_set_pingpong(1): consumer c takes the CTA's tiles j = c, c+2, ... (each a
    whole 64-row tile: 8 KB of A a stage), a stage is released by one consumer's 4 warps of each CTA, and a
    consumer waits on turn[c] (the other consumer's arrivals after its last stage) before each tile's mainloop;
    hand_over=False leaves that wait out. warp_stores: tilefuse_rung9_set_stores(1): each warp stores its own 16
    rows of a chunk after waiting for its own earlier stores only (no warpgroup barrier); store_wait=False leaves
    that wait out. items: stream-K (tilefuse_rung9_set_streamk, cooperative only): cluster -> [(tile, kb, ke, waits)]
    from tilefuse_rung9_streamk_plan instead of whole tiles round-robin; a piece without its tile's first k-tile sets
    its flag (no epilogue), the piece with it waits for the flags of `waits` (flag_wait=False leaves that out) and
    checks that every other piece of the tile had finished. Rung 9's cooperative consumers (persistent, not
    pingpong) take each work item from the producer's record (put_item): item j's record in slot j % item_slots,
    written before the full arrive of its first k-tile, read after that stage's wait and again after the mainloop,
    and after the last item an end record on a stage completed by a plain arrive; every read is checked."""
    rng = random.Random(seed)
    consumers, warps = 2, 4
    world = World(rng=rng)
    ctas = clusters * cluster
    world.smem = [dict() for _ in range(ctas)]
    full = [[Mbarrier(1) for _ in range(stages)] for _ in range(ctas)]
    arrivals = (cluster if remote_release else 1) * (1 if pingpong else consumers) * warps
    empty = [[Mbarrier(arrivals) for _ in range(stages)] for _ in range(ctas)]
    turn = [[Mbarrier(warps) for _ in range(consumers)] for _ in range(ctas)]
    a_bytes, b_part_bytes = (8192 if pingpong else 16384), 32768 // cluster
    records = [dict() for _ in range(ctas)] if persistent and not pingpong else None  # slot -> (t, kb, ke) / "end"

    def my_items(cl):  # (tile, kb, ke, waits)
        if items is not None:
            return items[cl]
        return [(t, 0, k_tiles, []) for t in (range(cl, tiles, clusters) if persistent else [cl])]

    def consumer_tiles(cl, c):  # (j, item): the CTA's j-th work item, for consumer c
        mine = list(enumerate(my_items(cl)))
        return mine[c::2] if pingpong else mine

    flags = set()  # (cluster, rank, consumer) whose partial sum is written
    finished = set()  # (cta, consumer, tile, kb): pieces whose mainloop ended

    def producer(cta):
        cl, rank = divmod(cta, cluster)
        peers = [cl * cluster + r for r in range(cluster)]
        s, phase = 0, 0
        mine = my_items(cl)
        for j, (t, kb, ke, _) in enumerate(mine):
            for kt in range(kb, ke):
                bar_e = empty[cta][s]
                yield (lambda b=bar_e, p=phase ^ 1: b.passed(p))          # mbar_wait(empty, phase ^ 1)
                if records is not None and kt == kb:
                    records[cta][j % item_slots] = (t, kb, ke)              # put_item
                full[cta][s].arrive(expect_tx=a_bytes + cluster * b_part_bytes)  # arrive.expect_tx
                world.copies.append(Copy([(cta, (s, "A"))], [full[cta][s]], a_bytes, (t, kt, rank, None)))
                if multicast:
                    world.copies.append(Copy([(p, (s, ("B", rank))) for p in peers], [full[p][s] for p in peers],
                                             b_part_bytes, (t, kt, rank, None)))
                else:
                    for part in range(cluster):
                        world.copies.append(Copy([(cta, (s, ("B", part)))], [full[cta][s]], b_part_bytes,
                                                 (t, kt, part, None)))
                yield None
                s += 1
                if s == stages:
                    s, phase = 0, phase ^ 1
        if records is not None:                                           # the end record, a plain arrive
            bar_e = empty[cta][s]
            yield (lambda b=bar_e, p=phase ^ 1: b.passed(p))
            records[cta][len(mine) % item_slots] = "end"
            full[cta][s].arrive()

    def check_record(cta, c, j, want, when):
        got = records[cta].get(j % item_slots)
        if got != want:
            raise ProtocolError(f"CTA {cta} consumer {c} reads {got} from record slot {j % item_slots} {when} "
                                f"where item {j} needs {want}")

    def check_stage(cta, s, t, kt, rank):
        got = world.smem[cta]
        want = {(s, "A"): (t, kt, rank, (s, "A"))}
        for part in range(cluster):
            want[(s, ("B", part))] = (t, kt, part, (s, ("B", part)))
        for key, tag in want.items():
            if got.get(key) != tag:
                raise ProtocolError(f"CTA {cta} stage {s} holds {got.get(key)} where tile {t} k-tile {kt} "
                                    f"needs {tag}")

    def consumer(cta, c):
        cl, rank = divmod(cta, cluster)
        peers = [cl * cluster + r for r in range(cluster)]
        s, phase = 0, 0
        committed_by = {w: [] for w in (range(warps) if warp_stores else [None])}  # store groups by committer
        reading = []  # stages whose wgmma may still read: (stage, tile, kt)

        def release(stage):
            for _ in range(warps):                                  # lane 0 of each warp
                for p in (peers if remote_release else [cta]):
                    empty[p][stage].arrive()

        def let_go(keep):
            while len(reading) > keep:                              # wgmma.wait_group keep
                st, t0, k0 = reading.pop(0)
                check_stage(cta, st, t0, k0, rank)                  # nobody overwrote it while it was read

        for j, (t, kb, ke, waits) in consumer_tiles(cl, c):
            if pingpong:                                            # the ring position of tile j's k-tile 0
                s, phase = (j * k_tiles) % stages, ((j * k_tiles) // stages) & 1
                if j > 0 and hand_over:                             # mbar_wait(turn[c], ((j-1)>>1) & 1)
                    yield (lambda b=turn[cta][c], p=((j - 1) >> 1) & 1: b.passed(p))
            if records is not None:                                 # the item's record, once its stage landed
                yield (lambda b=full[cta][s], p=phase: b.passed(p))
                check_record(cta, c, j, (t, kb, ke), "before the mainloop")
            prev = None
            for kt in range(kb, ke):
                bar_f = full[cta][s]
                yield (lambda b=bar_f, p=phase: b.passed(p))        # mbar_wait(full, phase)
                check_stage(cta, s, t, kt, rank)
                reading.append((s, t, kt))                          # 4 x wgmma, commit
                world.consumed.append((cta, c, t, kt))
                if pingpong and kt == ke - 1:
                    for _ in range(warps):                          # lane 0 of each warp: the other's turn
                        turn[cta][1 - c].arrive()
                yield None
                let_go(1)                                           # wgmma_wait<1>
                if kt > kb:
                    release(prev)
                prev = s
                s += 1
                if s == stages:
                    s, phase = 0, phase ^ 1
            let_go(0)                                               # wgmma_wait<0>
            if release_last and persistent:
                release(prev)
            yield None
            if records is not None:                                 # read again after the mainloop
                check_record(cta, c, j, (t, kb, ke), "after the mainloop")
            finished.add((cta, c, t, kb))
            if kb > 0:                                              # stream-K: a later piece's partial sum
                flags.add((cl, rank, c))
                yield None
                continue
            if ke < k_tiles:                                        # the piece with the tile's first k-tile
                for w in waits:
                    if flag_wait:
                        yield (lambda key=(w, rank, c): key in flags)
                for w in waits:
                    later = [(x, y, tt, b) for (x, y, tt, b) in finished if tt == t and x == w * cluster + rank and y == c]
                    if not later:
                        raise ProtocolError(f"CTA {cta} consumer {c} adds tile {t}'s piece from cluster {w} before "
                                            "it was computed")
            # TMA-store epilogue: c_chunks chunks in groups of c_buffers (pairs in the cooperative kernels, one chunk
            # at a time in ping-pong), a group's chunks in the c_buffers staging buffers, its stores one commit; by
            # warpgroup (one committing thread), or with warp_stores by warp (each warp's lane 0 commits the stores
            # of its own rows).
            for _ in range(c_chunks // c_buffers):
                for w in (range(warps) if warp_stores else [None]):
                    mine = committed_by[w]
                    # bulk_wait_read<0> (+ bar.sync) before a group: every store this thread committed has finished
                    # reading its buffer.
                    older = list(mine) if store_wait else []
                    yield (lambda older=older: not any(st in world.stores for st in older))
                    for b in range(c_buffers):
                        buf = (c, b, w)
                        if any(st.cta == cta and st.buf == buf for st in world.stores):
                            raise ProtocolError(f"CTA {cta} consumer {c} rewrites staging buffer {buf} while a "
                                                "store reads it")
                    yield None                                      # st.shared, fence.proxy.async, bar/syncwarp
                    for b in range(c_buffers):
                        store = Store(cta, (c, b, w))
                        world.stores.append(store)                  # tma_store_2d (the group's, then a commit)
                        mine.append(store)
        if records is not None:                                     # the producer's end record
            yield (lambda b=full[cta][s], p=phase: b.passed(p))
            check_record(cta, c, len(consumer_tiles(cl, c)), "end", "at the end")
        committed = [st for mine in committed_by.values() for st in mine]
        yield (lambda: not any(st in world.stores for st in committed))  # bulk_wait<0>

    actors = []
    for cta in range(ctas):
        actors.append(producer(cta))
        for c in range(consumers):
            actors.append(consumer(cta, c))
    run(actors, world)
    # Every consumer of every CTA saw every k-tile of each of its tiles once, in order.
    for cta in range(ctas):
        cl = cta // cluster
        for c in range(consumers):
            seen = [(t, kt) for (x, y, t, kt) in world.consumed if x == cta and y == c]
            want = [(t, kt) for _, (t, kb, ke, _) in consumer_tiles(cl, c) for kt in range(kb, ke)]
            if seen != want:
                raise ProtocolError(f"CTA {cta} consumer {c} consumed {seen[:8]}... instead of {want[:8]}...")
    return world


# ------------------------------------------------------------------------------------------------- rung 7
def simulate_rung7(*, seed: int, stages: int, k_tiles: int) -> World:
    """One warpgroup; thread 0 (in warp 0) is also the producer; wgmma_wait<0> each k-tile."""
    rng = random.Random(seed)
    warps = 4
    world = World(rng=rng)
    world.smem = [dict()]
    full = [Mbarrier(1) for _ in range(stages)]
    empty = [Mbarrier(warps) for _ in range(stages)]
    stage_bytes = 32768

    def issue(kt, s):
        full[s].arrive(expect_tx=stage_bytes)
        world.copies.append(Copy([(0, (s, "AB"))], [full[s]], stage_bytes, (kt, None)))

    def warp(w):
        if w == 0:
            for kt in range(min(stages, k_tiles)):                  # prologue
                issue(kt, kt)
                yield None
        s, phase = 0, 0
        for kt in range(k_tiles):
            yield (lambda b=full[s], p=phase: b.passed(p))          # mbar_wait(full, phase)
            if world.smem[0].get((s, "AB")) != (kt, (s, "AB")):
                raise ProtocolError(f"stage {s} holds {world.smem[0].get((s, 'AB'))} for k-tile {kt}")
            world.consumed.append((0, w, 0, kt))
            yield None                                              # wgmma x 8, commit, wait<0>
            empty[s].arrive()                                       # lane 0 of this warp
            if w == 0 and kt + stages < k_tiles:
                yield (lambda b=empty[s], p=phase: b.passed(p))     # mbar_wait(empty, phase)
                issue(kt + stages, s)
            s += 1
            if s == stages:
                s, phase = 0, phase ^ 1

    run([warp(w) for w in range(warps)], world)
    for w in range(warps):
        seen = [kt for (_, x, _, kt) in world.consumed if x == w]
        if seen != list(range(k_tiles)):
            raise ProtocolError(f"warp {w} consumed {seen}")
    return world


SIM_SEEDS = 25  # random interleavings per configuration (the whole simulation suite runs in ~2 s)


@pytest.mark.parametrize("k_tiles", [1, 2, 3, 4, 7, 13])
def test_rung7_protocol(k_tiles):
    for seed in range(SIM_SEEDS):
        simulate_rung7(seed=seed, stages=3, k_tiles=k_tiles)


@pytest.mark.parametrize("k_tiles", [1, 3, 4, 5, 9])
def test_rung8_protocol(k_tiles):
    for seed in range(SIM_SEEDS):
        simulate_warp_specialised(seed=seed, stages=4, k_tiles=k_tiles, tiles=1, clusters=1, cluster=1,
                                  persistent=False, multicast=False)


@pytest.mark.parametrize("k_tiles,tiles,clusters", [(1, 5, 2), (2, 3, 3), (4, 7, 2), (5, 6, 3), (9, 4, 1), (3, 1, 1)])
@pytest.mark.parametrize("multicast", [True, False])
def test_rung9_protocol(k_tiles, tiles, clusters, multicast):
    for seed in range(SIM_SEEDS):
        simulate_warp_specialised(seed=seed, stages=4, k_tiles=k_tiles, tiles=tiles, clusters=clusters, cluster=2,
                                  persistent=True, multicast=multicast)


def test_rung9_item_records_need_more_slots_than_stages():
    """The work-item records (put_item): with one slot more than the ring's stages a record outlives its item's
    epilogue (the kernel has 8 for 4 stages); with as many slots as stages the producer, 4 one-k-tile items ahead,
    rewrites a record before the consumers read it again after their mainloop, and the model catches it."""
    for seed in range(SIM_SEEDS):
        simulate_warp_specialised(seed=seed, stages=4, k_tiles=1, tiles=24, clusters=1, cluster=2, persistent=True,
                                  multicast=True, item_slots=5)
    failures = 0
    for seed in range(SIM_SEEDS):
        try:
            simulate_warp_specialised(seed=seed, stages=4, k_tiles=1, tiles=24, clusters=1, cluster=2,
                                      persistent=True, multicast=True, item_slots=4)
        except ProtocolError as e:
            assert "record slot" in str(e), e
            failures += 1
    assert failures > 0, "too few record slots went unnoticed"


@pytest.mark.parametrize("k_tiles,tiles,clusters", [(1, 5, 2), (4, 7, 3), (9, 4, 1)])
def test_rung9_protocol_cluster_of_one(k_tiles, tiles, clusters):
    """tilefuse_rung9_set_schedule(cluster_size=1): persistent CTAs without a peer (8 arrivals a stage)."""
    for seed in range(SIM_SEEDS):
        simulate_warp_specialised(seed=seed, stages=4, k_tiles=k_tiles, tiles=tiles, clusters=clusters, cluster=1,
                                  persistent=True, multicast=False)


@pytest.mark.parametrize("k_tiles,tiles,clusters", [(1, 5, 2), (2, 3, 3), (4, 7, 2), (5, 6, 3), (9, 4, 1), (3, 1, 1),
                                                    (6, 9, 2), (11, 5, 1)])
@pytest.mark.parametrize("cluster,multicast", [(2, True), (2, False), (1, False)])
def test_rung9_pingpong_protocol(k_tiles, tiles, clusters, cluster, multicast):
    """tilefuse_rung9_set_pingpong(1): 5 stages, one staging chunk a consumer, consumers alternating tiles."""
    for seed in range(SIM_SEEDS):
        simulate_warp_specialised(seed=seed, stages=5, k_tiles=k_tiles, tiles=tiles, clusters=clusters,
                                  cluster=cluster, persistent=True, multicast=multicast, c_buffers=1, pingpong=True)


@pytest.mark.parametrize("k_tiles,tiles,clusters", [(1, 5, 2), (4, 7, 2), (9, 4, 1), (3, 1, 1)])
@pytest.mark.parametrize("pingpong", [False, True])
def test_rung9_warp_stores_protocol(k_tiles, tiles, clusters, pingpong):
    """tilefuse_rung9_set_stores(1): each warp waits for and stores its own rows of a chunk."""
    for seed in range(SIM_SEEDS):
        simulate_warp_specialised(seed=seed, stages=5 if pingpong else 4, k_tiles=k_tiles, tiles=tiles,
                                  clusters=clusters, cluster=2, persistent=True, multicast=True,
                                  c_buffers=1 if pingpong else 2, pingpong=pingpong, warp_stores=True)


@needs_nvcc
@pytest.mark.parametrize("tiles,clusters,k_tiles", STREAMK_SPLITS)
@pytest.mark.parametrize("warp_stores", [False, True])
def test_rung9_streamk_protocol(tiles, clusters, k_tiles, warp_stores):
    """tilefuse_rung9_set_streamk(1): the planner's work items through the ring (pieces of a tile of any length,
    back to back), partial sums flagged and waited for; no deadlock, no stage overwritten while read."""
    lib = _streamk_abi(_load(9))
    plan, split = _streamk_items(lib, tiles, clusters, k_tiles)
    assert split, (tiles, clusters, k_tiles)
    for seed in range(SIM_SEEDS):
        simulate_warp_specialised(seed=seed, stages=4, k_tiles=k_tiles, tiles=tiles, clusters=clusters, cluster=2,
                                  persistent=True, multicast=True, items=plan, warp_stores=warp_stores)


@needs_nvcc
def test_the_streamk_model_catches_a_missing_flag_wait():
    lib = _streamk_abi(_load(9))
    plan, split = _streamk_items(lib, 5, 3, 64)
    assert split
    with pytest.raises(ProtocolError, match="before it was computed"):
        for seed in range(SIM_SEEDS):
            simulate_warp_specialised(seed=seed, stages=4, k_tiles=64, tiles=5, clusters=3, cluster=2, persistent=True,
                                      multicast=True, items=plan, flag_wait=False)


def test_the_warp_stores_model_catches_a_missing_wait():
    with pytest.raises(ProtocolError, match="rewrites staging buffer"):
        for seed in range(SIM_SEEDS):
            simulate_warp_specialised(seed=seed, stages=4, k_tiles=3, tiles=6, clusters=1, cluster=2,
                                      persistent=True, multicast=True, warp_stores=True, store_wait=False)


@pytest.mark.parametrize("bug,match", [
    (dict(hand_over=False), "holds"),                   # ping-pong without the turn barrier: parity aliasing
])
def test_the_pingpong_model_catches_a_missing_hand_over(bug, match):
    with pytest.raises(ProtocolError, match=match):
        for seed in range(SIM_SEEDS):
            simulate_warp_specialised(seed=seed, stages=5, k_tiles=9, tiles=7, clusters=2, cluster=2,
                                      persistent=True, multicast=True, c_buffers=1, pingpong=True, **bug)


@pytest.mark.parametrize("bug,match", [
    (dict(release_last=False), "deadlock"),             # persistent: the last stage of a tile never released
    (dict(remote_release=False), "holds"),              # multicast: only the local consumers counted
])
def test_the_protocol_model_catches_known_bugs(bug, match):
    """The simulation is only worth something if it fails on the bugs it is meant to catch."""
    with pytest.raises(ProtocolError, match=match):
        for seed in range(SIM_SEEDS):
            simulate_warp_specialised(seed=seed, stages=4, k_tiles=9, tiles=7, clusters=2, cluster=2,
                                      persistent=True, multicast=True, **bug)


# ------------------------------------------------------------------------------------------- GPU checks
# A kernel bug here can end in a trap (every mbarrier wait traps after 5 s instead of hanging), and a trap
# leaves the process's CUDA context unusable for every test after it. So the GPU checks run in a child
# pytest, one a rung: test_gpu_checks_in_a_child_process[<rung>] runs this file with CHILD_ENV set to the
# rung, where the checks below run (and report each failure by name); elsewhere they skip.
CHILD_ENV = "TILEFUSE_HOPPER_GPU_CHILD"
CHILD_RUNG = os.environ.get(CHILD_ENV, "")  # tests may read the environment; the package reads it in config.py
CHILD_TIMEOUT_S = 1200


def _in_child(rung: int) -> None:
    if CHILD_RUNG != str(rung):
        pytest.skip(f"runs in the child process of test_gpu_checks_in_a_child_process[{rung}]")


@pytest.mark.gpu
@pytest.mark.parametrize("rung", sorted(RUNGS))
def test_gpu_checks_in_a_child_process(rung):
    if CHILD_RUNG:
        pytest.skip("already the child")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", "-rfE",
                           "--tb=short", str(Path(__file__))], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, CHILD_ENV: str(rung), PARENT_CACHE_ENV: str(diskcache.root())},
                          timeout=CHILD_TIMEOUT_S)
    summary = proc.stdout[-8000:] + proc.stderr[-2000:]
    assert proc.returncode == 0 and " passed" in proc.stdout, f"rung {rung} GPU checks failed:\n{summary}"


GPU_SHAPES = [  # (M, N, K): tile-aligned, ragged edges, tiny, one tile, K below one k-tile, and the bar's size
    (128, 256, 64),
    (256, 512, 128),
    (200, 264, 136),
    (1000, 1000, 1000),
    (1, 8, 8),
    (129, 136, 8),
    (640, 2048, 4096),
    (4096, 4096, 4096),
]
DTYPE_CODES = {"bfloat16": 0, "float16": 1}


def _torch():
    import torch
    return torch


def _run(rung: int, a, b_nk, c, bias=None, epilogue: int = 0, M=None, N=None):
    """Call tilefuse_rung<K> on torch tensors (A [M,K], B given as [N,K], C [M,N] views with their strides)."""
    torch = _torch()
    fn = getattr(_load(rung), f"tilefuse_rung{rung}")
    M = a.shape[0] if M is None else M
    N = b_nk.shape[0] if N is None else N
    K = a.shape[1]
    err = fn(a.data_ptr(), b_nk.data_ptr(), c.data_ptr(), None if bias is None else bias.data_ptr(), M, N, K,
             a.stride(0), b_nk.stride(0), c.stride(0), DTYPE_CODES[str(a.dtype).split(".")[-1]], epilogue,
             torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()  # a device-side fault (trap on a barrier timeout included) shows up here
    assert err == 0, f"tilefuse_rung{rung} returned cudaError {err}"


def _reference(a, b_nk, bias=None, epilogue: int = 0):
    torch = _torch()
    ref = a.float() @ b_nk.float().t()
    if epilogue >= 1:
        ref = ref + bias.float()
    if epilogue == 2:
        ref = torch.nn.functional.gelu(ref)
    return ref


@pytest.mark.gpu
@pytest.mark.parametrize("rung", sorted(RUNGS))
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_gemm_matches_float32_reference(rung, shape, dtype):
    _in_child(rung)
    torch = _torch()
    M, N, K = shape
    dt = getattr(torch, dtype)
    a = torch.randn(M, K, device="cuda", dtype=dt)
    b_nk = torch.randn(N, K, device="cuda", dtype=dt)
    c = poisoned_empty(M, N, dtype=dt, device="cuda")
    _run(rung, a, b_nk, c)
    assert_close(c, _reference(a, b_nk), dtype=dt, what=f"rung {rung} {M}x{N}x{K}")


@pytest.mark.gpu
@pytest.mark.parametrize("rung", sorted(RUNGS))
@pytest.mark.parametrize("epilogue", [1, 2])
@pytest.mark.parametrize("shape", [(256, 512, 256), (333, 520, 200), (4096, 4096, 4096)],
                         ids=lambda s: "x".join(map(str, s)))
def test_bias_and_gelu_epilogues(rung, epilogue, shape):
    _in_child(rung)
    torch = _torch()
    M, N, K = shape
    dt = torch.bfloat16
    a = torch.randn(M, K, device="cuda", dtype=dt)
    b_nk = torch.randn(N, K, device="cuda", dtype=dt) / K ** 0.5  # keep x + bias around 1, where GeLU bends
    bias = torch.randn(N, device="cuda", dtype=dt)
    c = poisoned_empty(M, N, dtype=dt, device="cuda")
    _run(rung, a, b_nk, c, bias, epilogue)
    assert_close(c, _reference(a, b_nk, bias, epilogue), dtype=dt, what=f"rung {rung} epilogue {epilogue}")


@pytest.mark.gpu
@pytest.mark.parametrize("rung", sorted(RUNGS))
def test_writes_stay_inside_c(rung):
    """C as a view of a larger poisoned buffer (ldc > N, rows below M): the padding must stay NaN, so edge
    tiles are clipped (TMA store in rung 9, predicated stores in 7 and 8); strided A and B (lda, ldb > K)."""
    _in_child(rung)
    torch = _torch()
    M, N, K = 300, 328, 200
    dt = torch.float16
    a = torch.randn(M, K + 24, device="cuda", dtype=dt)[:, :K]
    b_nk = torch.randn(N, K + 8, device="cuda", dtype=dt)[:, :K]
    buf = poison(torch.empty(M + 100, N + 72, device="cuda", dtype=dt))
    c = buf[:M, :N]
    _run(rung, a, b_nk, c)
    assert_close(c, _reference(a, b_nk), dtype=dt, what=f"rung {rung} strided")
    assert torch.isnan(buf[:M, N:]).all() and torch.isnan(buf[M:, :]).all(), "wrote outside C"


@pytest.mark.gpu
@pytest.mark.parametrize("flags", [0, 1, 2, 4, 7], ids=["all-on", "no-multicast", "not-persistent",
                                                         "direct-store", "all-off"])
def test_rung9_debug_variants(flags):
    """Rung 9 with single features switched off: when the default fails, the variants that pass name the
    feature at fault (1 multicast, 2 persistence, 4 the TMA-store epilogue)."""
    _in_child(9)
    torch = _torch()
    lib = _load(9)
    lib.tilefuse_rung9_set_debug.restype = ctypes.c_int
    lib.tilefuse_rung9_set_debug.argtypes = [ctypes.c_int]
    M, N, K = 1536, 2304, 640  # 6 x 9 = 54 cluster tiles: several a cluster when persistent on a 132-SM part
    dt = torch.bfloat16
    a = torch.randn(M, K, device="cuda", dtype=dt)
    b_nk = torch.randn(N, K, device="cuda", dtype=dt)
    bias = torch.randn(N, device="cuda", dtype=dt)
    old = lib.tilefuse_rung9_set_debug(flags)
    try:
        for epilogue in (0, 1):
            c = poisoned_empty(M, N, dtype=dt, device="cuda")
            _run(9, a, b_nk, c, bias if epilogue else None, epilogue)
            assert_close(c, _reference(a, b_nk, bias, epilogue), dtype=dt, what=f"rung 9 debug {flags}")
    finally:
        lib.tilefuse_rung9_set_debug(old)


SCHEDULES = {  # tilefuse_rung9_set_schedule(clusters, group_m, order, cluster_size), as the sweep tries them
    "7-clusters": (7, 0, 0, 0), "more-clusters-than-resident": (500, 0, 0, 0), "group-1": (0, 1, 0, 0),
    "group-3": (0, 3, 0, 0), "column-groups": (0, 8, 1, 0), "cluster-1": (0, 0, 0, 1),
    "cluster-1-13-ctas-column-major": (13, 1, 1, 1),
}


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_rung9_schedules(name):
    """Rung 9 under each run-time schedule: the same result as the float32 reference (ragged edges, several
    tiles a cluster), for both epilogue paths."""
    _in_child(9)
    torch = _torch()
    lib = _schedule_abi(_load(9))
    lib.tilefuse_rung9_set_debug.restype = ctypes.c_int
    lib.tilefuse_rung9_set_debug.argtypes = [ctypes.c_int]
    M, N, K = 1800, 2312, 328  # 8 x 10 cluster tiles (15 x 10 with clusters of one), ragged in M, N and K
    dt = torch.bfloat16
    a = torch.randn(M, K, device="cuda", dtype=dt)
    b_nk = torch.randn(N, K, device="cuda", dtype=dt)
    assert lib.tilefuse_rung9_set_schedule(*SCHEDULES[name]) == 0
    try:
        for debug in (0, 4):
            old = lib.tilefuse_rung9_set_debug(debug)
            try:
                c = poisoned_empty(M, N, dtype=dt, device="cuda")
                _run(9, a, b_nk, c)
            finally:
                lib.tilefuse_rung9_set_debug(old)
            assert_close(c, _reference(a, b_nk), dtype=dt, what=f"rung 9 schedule {name} debug {debug}")
    finally:
        lib.tilefuse_rung9_set_schedule(0, 0, 0, 0)


PINGPONG_VARIANTS = {  # name: (debug flags, tilefuse_rung9_set_schedule arguments), each with ping-pong on
    "default": (0, (0, 0, 0, 0)), "no-multicast": (1, (0, 0, 0, 0)), "not-persistent": (2, (0, 0, 0, 0)),
    "cluster-1": (0, (0, 0, 0, 1)), "7-clusters": (0, (7, 0, 0, 0)), "column-groups-16": (0, (0, 16, 1, 0)),
    "direct-store-flag-ignored": (4, (0, 0, 0, 0)),
}
PINGPONG_SHAPES = [(1800, 2312, 328), (1, 8, 8), (129, 136, 8), (200, 264, 136), (640, 2048, 4096),
                   (4096, 4096, 4096)]


def _check_rung9_at_variant_shapes(what: str) -> None:
    """Rung 9 as the library is set now, at PINGPONG_SHAPES: the float32 reference's result for all three
    epilogues (bf16 and fp16), C poisoned, and the same bits on a second call of the larger plain ones (a race
    between stages or consumers shows up as noise)."""
    torch = _torch()
    for M, N, K in PINGPONG_SHAPES:
        for dt, epilogue in ((torch.bfloat16, 0), (torch.float16, 1), (torch.bfloat16, 2)):
            a = torch.randn(M, K, device="cuda", dtype=dt)
            b_nk = torch.randn(N, K, device="cuda", dtype=dt) / K ** 0.5
            bias = torch.randn(N, device="cuda", dtype=dt)
            c = poisoned_empty(M, N, dtype=dt, device="cuda")
            _run(9, a, b_nk, c, bias if epilogue else None, epilogue)
            assert_close(c, _reference(a, b_nk, bias, epilogue), dtype=dt,
                         what=f"rung 9 {what} {M}x{N}x{K} epilogue {epilogue}")
            if epilogue == 0 and M * N >= 1 << 20:
                again = torch.empty_like(c)
                _run(9, a, b_nk, again)
                assert torch.equal(c, again), f"rung 9 {what} {M}x{N}x{K}: not deterministic"


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(PINGPONG_VARIANTS))
def test_rung9_pingpong(name):
    """tilefuse_rung9_set_pingpong(1) under the debug flags and schedules: the float32 reference's result at
    ragged, tiny, K-below-a-k-tile and the bar's shapes, all three epilogues, bf16 and fp16, C poisoned; the
    same bits on a second call (a consumer reading a stage of the other's tile would show up as noise)."""
    _in_child(9)
    torch = _torch()
    lib = _switches_abi(_schedule_abi(_load(9)))
    lib.tilefuse_rung9_set_debug.restype = ctypes.c_int
    lib.tilefuse_rung9_set_debug.argtypes = [ctypes.c_int]
    debug, schedule = PINGPONG_VARIANTS[name]
    assert lib.tilefuse_rung9_set_schedule(*schedule) == 0 and lib.tilefuse_rung9_set_pingpong(1) == 0
    old = lib.tilefuse_rung9_set_debug(debug)
    try:
        _check_rung9_at_variant_shapes(f"ping-pong {name}")
    finally:
        lib.tilefuse_rung9_set_debug(old)
        lib.tilefuse_rung9_set_pingpong(0)
        lib.tilefuse_rung9_set_schedule(0, 0, 0, 0)


WARP_STORES_VARIANTS = {  # name: (tilefuse_rung9_set_schedule arguments, ping-pong), warp stores on
    "default": ((0, 0, 0, 0), 0), "pingpong": ((0, 0, 0, 0), 1), "cluster-1": ((0, 0, 0, 1), 0),
    "7-clusters": ((7, 0, 0, 0), 0),
}


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(WARP_STORES_VARIANTS))
def test_rung9_warp_stores(name):
    """tilefuse_rung9_set_stores(1) with the consumer schedules: the float32 reference's result at the ping-pong
    test's shapes (ragged edges clipped by the 16-row boxes), all three epilogues, C poisoned, the same bits on a
    second call."""
    _in_child(9)
    torch = _torch()
    lib = _switches_abi(_schedule_abi(_load(9)))
    schedule, pingpong = WARP_STORES_VARIANTS[name]
    assert lib.tilefuse_rung9_set_schedule(*schedule) == 0
    assert lib.tilefuse_rung9_set_pingpong(pingpong) == 0 and lib.tilefuse_rung9_set_stores(1) == 0
    try:
        _check_rung9_at_variant_shapes(f"warp stores {name}")
    finally:
        lib.tilefuse_rung9_set_stores(0)
        lib.tilefuse_rung9_set_pingpong(0)
        lib.tilefuse_rung9_set_schedule(0, 0, 0, 0)


L2_VARIANTS = {  # name: (tilefuse_rung9_set_l2 policies, schedule, pingpong, warp stores); the default's
    # (0, 0, 1) runs in every other rung-9 GPU test
    "all-evict-first": ((1, 1, 1), (0, 0, 0, 0), 0, 0),
    "all-normal": ((0, 0, 0), (0, 0, 0, 0), 0, 0),
    "last-cluster-1": ((2, 2, 2), (0, 0, 0, 1), 0, 0),   # B's loads without multicast
    "pingpong-warp-stores": ((2, 1, 2), (0, 0, 0, 0), 1, 1),
}


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(L2_VARIANTS))
def test_rung9_l2_policies(name):
    """tilefuse_rung9_set_l2: the hinted loads (plain and multicast) and stores give the float32 reference's result
    at the ping-pong test's shapes, all three epilogues, C poisoned, the same bits on a second call."""
    _in_child(9)
    lib = _l2_abi(_switches_abi(_schedule_abi(_load(9))))
    policies, schedule, pingpong, warp_stores = L2_VARIANTS[name]
    assert lib.tilefuse_rung9_set_l2(*policies) == 0 and lib.tilefuse_rung9_set_schedule(*schedule) == 0
    assert lib.tilefuse_rung9_set_pingpong(pingpong) == 0 and lib.tilefuse_rung9_set_stores(warp_stores) == 0
    try:
        _check_rung9_at_variant_shapes(f"L2 policies {name}")
    finally:
        lib.tilefuse_rung9_set_l2(*RUNG9_DEFAULT_L2)
        lib.tilefuse_rung9_set_stores(0)
        lib.tilefuse_rung9_set_pingpong(0)
        lib.tilefuse_rung9_set_schedule(0, 0, 0, 0)


# (M, N, K): ragged on all three sides with 63 k-tiles (53 x 2 cluster-tiles on 66 clusters: 40 tiles split, some in 3
# pieces), and the LLM and square shapes of the ladder suite that split
STREAMK_GPU_SHAPES = [(13468, 504, 4000), (16384, 4096, 4096), (8192, 8192, 8192)]


def _resident_clusters(lib, csize: int = 2) -> int:
    """Clusters of csize CTAs resident at once on this GPU, as tilefuse_rung9 sizes its persistent grid."""
    got = [ctypes.c_int() for _ in range(4)]
    lib.tilefuse_rung9_occupancy.restype = ctypes.c_int
    lib.tilefuse_rung9_occupancy.argtypes = [ctypes.c_int] + [ctypes.POINTER(ctypes.c_int)] * 4
    assert lib.tilefuse_rung9_occupancy(csize, *[ctypes.byref(v) for v in got]) == 0
    return got[0].value or got[1].value // csize


def _rung9_splits(lib, M: int, N: int, K: int) -> bool:
    """Whether tilefuse_rung9 splits this shape on this GPU (the default schedule: clusters of 2, all resident)."""
    resident = _resident_clusters(lib)
    tiles = -(-M // 256) * -(-N // 256)
    return lib.tilefuse_rung9_streamk_plan(tiles, min(resident, tiles), -(-K // 64), 0, None, None, 0) == 1


@pytest.mark.gpu
def test_rung9_streamk():
    """Stream-K (on by default) where it splits: the float32 reference's result with C poisoned, plain and + bias,
    bf16 and fp16; the same bits on a second call (a head adding a partial sum before it was written would show up
    as noise); close to the unsplit kernel's result; and correct when calls alternate between two streams (the
    second waits for the first's use of the workspace)."""
    _in_child(9)
    torch = _torch()
    lib = _streamk_abi(_load(9))
    assert lib.tilefuse_rung9_get_streamk() == 1
    split = [shape for shape in STREAMK_GPU_SHAPES if _rung9_splits(lib, *shape)]
    assert split, f"none of {STREAMK_GPU_SHAPES} splits on this GPU: the test would not exercise stream-K"
    for M, N, K in split:
        for dt, epilogue in ((torch.bfloat16, 0), (torch.float16, 1)):
            a = torch.randn(M, K, device="cuda", dtype=dt)
            b_nk = torch.randn(N, K, device="cuda", dtype=dt) / K ** 0.5
            bias = torch.randn(N, device="cuda", dtype=dt)
            ref = _reference(a, b_nk, bias, epilogue)
            c = poisoned_empty(M, N, dtype=dt, device="cuda")
            launches = lib.tilefuse_rung9_streamk_launches()
            _run(9, a, b_nk, c, bias if epilogue else None, epilogue)
            what = f"rung 9 stream-K {M}x{N}x{K} epilogue {epilogue}"
            assert lib.tilefuse_rung9_streamk_launches() == launches + 1, f"{what}: the launch did not split"
            assert_close(c, ref, dtype=dt, what=what)
            again = poisoned_empty(M, N, dtype=dt, device="cuda")
            _run(9, a, b_nk, again, bias if epilogue else None, epilogue)
            assert torch.equal(c, again), f"{what}: not deterministic"
            assert lib.tilefuse_rung9_set_streamk(0) == 0
            try:
                whole = poisoned_empty(M, N, dtype=dt, device="cuda")
                launches = lib.tilefuse_rung9_streamk_launches()
                _run(9, a, b_nk, whole, bias if epilogue else None, epilogue)
                assert lib.tilefuse_rung9_streamk_launches() == launches, f"{what}: split with stream-K off"
            finally:
                assert lib.tilefuse_rung9_set_streamk(1) == 0
            assert_close(whole, ref, dtype=dt, what=f"{what} with stream-K off")
    # two streams, alternating, no synchronisation between the calls but the library's own
    M, N, K = split[0]
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    b_nk = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / K ** 0.5
    ref = _reference(a, b_nk)
    side = torch.cuda.Stream()
    fn = _load(9).tilefuse_rung9
    outs = []
    for i in range(6):
        stream = side if i % 2 else torch.cuda.current_stream()
        c = poisoned_empty(M, N, dtype=torch.bfloat16, device="cuda")
        side.wait_stream(torch.cuda.current_stream())  # the inputs and the poisoned C exist before the side stream runs
        err = fn(a.data_ptr(), b_nk.data_ptr(), c.data_ptr(), None, M, N, K, K, K, N, 0, 0, stream.cuda_stream)
        assert err == 0
        outs.append(c)
    torch.cuda.synchronize()
    for c in outs:
        assert_close(c, ref, dtype=torch.bfloat16, what=f"rung 9 stream-K {M}x{N}x{K} on alternating streams")
        assert torch.equal(c, outs[0]), "rung 9 stream-K on alternating streams: not deterministic"


def _balance_abi(lib):
    _switches_abi(lib)
    lib.tilefuse_rung9_balance_plan.restype = ctypes.c_int
    lib.tilefuse_rung9_balance_plan.argtypes = [ctypes.c_int] * 4 + [ctypes.POINTER(ctypes.c_int), ctypes.c_int]
    return lib


def _balance_plan(lib, tiles_m: int, tiles_n: int, clusters: int, n: int) -> list[tuple[int, int, int]]:
    """The walk's tiles as (cluster-row, first column, width), from tilefuse_rung9_balance_plan."""
    cap = tiles_m * tiles_n + tiles_m
    spans = (ctypes.c_int * (3 * cap))()
    count = lib.tilefuse_rung9_balance_plan(tiles_m, tiles_n, clusters, n, spans, cap)
    assert count >= tiles_m * tiles_n
    return [tuple(spans[3 * t:3 * t + 3]) for t in range(count)]


@needs_nvcc
def test_rung9_balance_plan_refuses_bad_arguments():
    """tilefuse_rung9_balance_plan (the switch itself: test_rung9_on_off_switches) refuses bad arguments."""
    lib = _balance_abi(_load(9))
    for bad in ((0, 16, 66, 4096), (16, 0, 66, 4096), (16, 16, 0, 4096), (16, 16, 66, 0), (16, 16, 66, 4097)):
        assert lib.tilefuse_rung9_balance_plan(*bad, None, 0) == -1, bad
    assert lib.tilefuse_rung9_balance_plan(16, 16, 66, 4096, (ctypes.c_int * 3)(), 1) == -1  # cap too small


# (tiles_m, tiles_n, clusters, N, narrow rows expected): the bar's 4096^3 and 8192^3 on 66 clusters, a ragged N whose
# last narrow tile ends past it, one whose last narrow tile would be empty (none), whole rounds, N too small, the
# 132 clusters of a cluster of one, and a cluster count that does not divide anything
BALANCE_CASES = [(16, 16, 66, 4096, 4), (32, 32, 66, 8192, 29), (16, 16, 66, 4088, 4), (16, 16, 66, 3856, 0),
                 (12, 22, 66, 5632, 0), (8, 8, 66, 2048, 0), (32, 16, 132, 4096, 8), (7, 40, 13, 10240, None)]


@needs_nvcc
@pytest.mark.parametrize("tiles_m, tiles_n, clusters, n, rows", BALANCE_CASES)
def test_rung9_balance_plan(tiles_m, tiles_n, clusters, n, rows):
    """The balanced walk as the kernel's producer walks it: each cluster-row of C covered exactly once by its tiles,
    whole (256 columns) or narrow (240), the narrow ones in the last rows and after every whole tile of the walk, and
    the busiest cluster (tiles round-robin, a narrow tile 15/16 of a whole one) less busy than without them."""
    lib = _balance_abi(_load(9))
    y = lib.tilefuse_rung9_balance_plan(tiles_m, tiles_n, clusters, n, None, 0)
    if rows is not None:
        assert y == rows
    plan = _balance_plan(lib, tiles_m, tiles_n, clusters, n)
    assert len(plan) == tiles_m * tiles_n + y
    for row in range(tiles_m):
        spans = sorted((n0, w) for r, n0, w in plan if r == row)
        assert len(spans) == tiles_n + (row >= tiles_m - y)
        assert spans[0][0] == 0 and all(a + w == b for (a, w), (b, _) in zip(spans, spans[1:])), (row, spans)
        assert spans[-1][0] < n <= spans[-1][0] + spans[-1][1], (row, spans[-1], n)
        assert {w for _, w in spans} <= ({256, 240} if row >= tiles_m - y else {256})
    widths = [w for _, _, w in plan]
    assert widths == sorted(widths, reverse=True), "narrow tiles after every whole one"
    assert widths.count(240) == 16 * y
    def busiest(ws):
        return max(sum(16 if w == 256 else 15 for w in ws[c::clusters]) for c in range(clusters))
    unbalanced = 16 * -(-tiles_m * tiles_n // clusters)
    assert busiest(widths) < unbalanced if y else busiest(widths) == unbalanced
    if y == 0:  # the plain walk: the grouped order of tile_at
        assert plan == _balance_plan(lib, tiles_m, tiles_n, 10 ** 6, n)


# (M, N, K, ldc): the bar's 4096^3, and ragged M, N (the last narrow tile's 48-column chunk cut after 40, C a view
# of a wider buffer) and K
BALANCE_GPU_SHAPES = [(4096, 4096, 4096, 4096), (4000, 4088, 1000, 4096)]
BALANCE_VARIANTS = {"default": (0, (0, 0, 0, 0), 0), "warp-stores": (0, (0, 0, 0, 0), 1),
                    "direct-store": (4, (0, 0, 0, 0), 0), "cluster-1": (0, (0, 0, 0, 1), 0)}


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(BALANCE_VARIANTS))
def test_rung9_balanced(name):
    """The balanced last round (on by default where stream-K does not split) at shapes where the plan makes narrow
    rows on this GPU: the float32 reference's result for all three epilogues, bf16 and fp16, C poisoned and nothing
    written outside it, the same bits on a second call, and close to the kernel with balance off."""
    _in_child(9)
    torch = _torch()
    lib = _balance_abi(_switches_abi(_schedule_abi(_load(9))))
    lib.tilefuse_rung9_set_debug.restype = ctypes.c_int
    lib.tilefuse_rung9_set_debug.argtypes = [ctypes.c_int]
    debug, schedule, warp_stores = BALANCE_VARIANTS[name]
    csize = schedule[3] or 2
    resident = _resident_clusters(lib, csize)
    assert lib.tilefuse_rung9_get_balance() == 1
    assert lib.tilefuse_rung9_set_schedule(*schedule) == 0 and lib.tilefuse_rung9_set_stores(warp_stores) == 0
    old = lib.tilefuse_rung9_set_debug(debug)
    try:
        for M, N, K, ldc in BALANCE_GPU_SHAPES:
            tiles_m, tiles_n = -(-M // (128 * csize)), -(-N // 256)
            y = lib.tilefuse_rung9_balance_plan(tiles_m, tiles_n, min(resident, tiles_m * tiles_n), N, None, 0)
            assert y > 0, f"{M}x{N} on {resident} clusters of {csize}: no narrow rows, the test would not exercise them"
            for dt, epilogue in ((torch.bfloat16, 0), (torch.float16, 1), (torch.bfloat16, 2)):
                a = torch.randn(M, K, device="cuda", dtype=dt)
                b_nk = torch.randn(N, K, device="cuda", dtype=dt) / K ** 0.5
                bias = torch.randn(N, device="cuda", dtype=dt)
                ref = _reference(a, b_nk, bias, epilogue)
                what = f"rung 9 balanced {name} {M}x{N}x{K} epilogue {epilogue}"
                outs = []
                for _ in range(2):
                    buf = poison(torch.empty(M + 8, ldc + 8, device="cuda", dtype=dt))
                    c = buf[:M, :N]
                    _run(9, a, b_nk, c, bias if epilogue else None, epilogue)
                    assert_close(c, ref, dtype=dt, what=what)
                    assert torch.isnan(buf[:M, N:]).all() and torch.isnan(buf[M:, :]).all(), f"{what}: wrote outside C"
                    outs.append(c.clone())
                assert torch.equal(outs[0], outs[1]), f"{what}: not deterministic"
                assert lib.tilefuse_rung9_set_balance(0) == 0
                try:
                    whole = poison(torch.empty(M, ldc + 8, device="cuda", dtype=dt))[:, :N]
                    _run(9, a, b_nk, whole, bias if epilogue else None, epilogue)
                finally:
                    assert lib.tilefuse_rung9_set_balance(1) == 0
                assert_close(outs[0], whole.float(), dtype=dt, what=f"{what} against balance off")
    finally:
        lib.tilefuse_rung9_set_debug(old)
        lib.tilefuse_rung9_set_stores(0)
        lib.tilefuse_rung9_set_schedule(0, 0, 0, 0)


@pytest.mark.gpu
@pytest.mark.parametrize("rung", sorted(RUNGS))
def test_repeated_calls_are_deterministic(rung):
    """Same inputs, same bits: no race between stages (a premature refill shows up as run-to-run noise)."""
    _in_child(rung)
    torch = _torch()
    M, N, K = 1024, 2048, 1024
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    b_nk = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
    outs = []
    for _ in range(3):
        c = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        _run(rung, a, b_nk, c)
        outs.append(c)
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


# ------------------------------------------------------------------------ tools/ladder_sweep.py (CPU)
SWEEP = ROOT / "tools" / "ladder_sweep.py"


def _sweep_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("ladder_sweep", SWEEP)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)  # imports nothing heavy: torch only inside main() / the probe
    return mod


def test_ladder_sweep_arguments():
    sweep = _sweep_module()
    args = sweep.parse_args([])
    assert args.shape_list == [(4096, 4096, 4096), (8192, 8192, 8192), (16384, 4096, 4096)]
    assert [s.name for s in args.setting_list] == [s.name for s in sweep.SETTINGS] and args.graphs and args.probe
    args = sweep.parse_args(["--shapes", "4096,1000x1024x512", "--settings", "cluster-1,group-1", "--no-graphs"])
    assert args.shape_list == [(4096, 4096, 4096), (1000, 1024, 512)] and not args.graphs
    assert [s.name for s in args.setting_list] == ["default", "cluster-1", "group-1"]
    for bad in (["--shapes", "4096x4096"], ["--shapes", "100x100x100"], ["--settings", "nope"]):
        with pytest.raises(SystemExit):
            sweep.parse_args(bad)
    args = sweep.parse_args(["--ab", "no-streamk", "--rounds", "3"])
    assert args.ab_list == ["no-streamk"] and args.rounds == 3 and args.rep_ms == sweep.AB_REP_MS
    assert args.flush == "write"
    assert sweep.parse_args(["--ab", "no-streamk", "--rep-ms", "20"]).rep_ms == 20
    args = sweep.parse_args(["--ab", "l2-ab-last, l2-normal", "--flush", "read"])
    assert args.ab_list == ["l2-ab-last", "l2-normal"] and args.flush == "read"
    for bad in (["--ab", "default"], ["--ab", "nope"], ["--ab", "no-streamk", "--rounds", "0"],
                ["--ab", "l2-normal,default"], ["--ab", "l2-normal,l2-normal"], ["--ab", ","],
                ["--flush", "read"], ["--ab", "l2-normal", "--flush", "zero"]):
        with pytest.raises(SystemExit):
            sweep.parse_args(bad)
    names = [s.name for s in sweep.SETTINGS]
    assert len(set(names)) == len(names) and sweep.SETTINGS[0].is_default
    assert sum(s.is_default for s in sweep.SETTINGS) == 1  # every other setting changes something


def test_ab_rounds_rotate_and_report():
    """The A/B core both ladder_sweep --ab and rung_ab.py use: cuBLAS first each round, the entries' order rotated by
    one a round; the report's ratios (entry / base, median of rounds) and rows."""
    sweep = _sweep_module()
    order = []

    def measure(name, ms):
        return lambda: order.append(name) or ms

    times = sweep.ab_rounds("8x8x8", measure("cublas_nt", 1.0),
                            {"default": measure("default", 2.0), "x": measure("x", 1.8), "y": measure("y", 2.2)}, 3)
    assert order == ["cublas_nt", "default", "x", "y", "cublas_nt", "x", "y", "default",
                     "cublas_nt", "y", "default", "x"]
    assert list(times) == ["cublas_nt", "default", "x", "y"] and times["x"] == [1.8] * 3
    rows = {r["impl"]: r for r in sweep.ab_report("8x8x8", times, "setting", "default", "read")}
    assert rows["x"]["vs_default"] == pytest.approx(0.9) and rows["y"]["vs_default"] == pytest.approx(1.1)
    assert rows["default"]["vs_default"] is None and rows["cublas_nt"]["x_cublas_nt"] is None
    assert rows["default"]["x_cublas_nt"] == pytest.approx(0.5) and rows["x"]["flush"] == "read"
    assert rows["y"]["round_ms"] == "2.2000 2.2000 2.2000" and rows["y"]["rounds"] == 3


@needs_nvcc
def test_ladder_sweep_settings_are_accepted_by_rung9():
    """Every schedule the sweep sets is one the library takes (host code: no GPU needed)."""
    sweep = _sweep_module()
    lib = _l2_abi(_streamk_abi(_switches_abi(_schedule_abi(_load(9)))))
    try:
        for s in sweep.SETTINGS:
            assert lib.tilefuse_rung9_set_schedule(*s.schedule) == 0, s
            assert _get_schedule(lib)[:4] == list(s.schedule)
            assert lib.tilefuse_rung9_set_pingpong(s.pingpong) == 0, s
            assert lib.tilefuse_rung9_get_pingpong() == s.pingpong
            assert lib.tilefuse_rung9_set_stores(s.warp_stores) == 0, s
            assert lib.tilefuse_rung9_get_stores() == s.warp_stores
            assert lib.tilefuse_rung9_set_streamk(s.streamk) == 0, s
            assert lib.tilefuse_rung9_get_streamk() == s.streamk
            assert lib.tilefuse_rung9_set_l2(*s.l2) == 0, s
            assert _get_l2(lib) == list(s.l2)
    finally:
        lib.tilefuse_rung9_set_schedule(0, 0, 0, 0)
        lib.tilefuse_rung9_set_pingpong(0)
        lib.tilefuse_rung9_set_stores(0)
        lib.tilefuse_rung9_set_streamk(1)
        lib.tilefuse_rung9_set_l2(*RUNG9_DEFAULT_L2)
    assert {"pingpong", "direct-store", "default", "warp-stores", "no-streamk", "l2-normal"} <= {s.name for s in sweep.SETTINGS}
    assert sweep.DEFAULT_L2 == RUNG9_DEFAULT_L2 and sweep.BY_NAME["default"].l2 == RUNG9_DEFAULT_L2


def _rung_ab_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("rung_ab", ROOT / "tools" / "rung_ab.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_rung_ab_arguments(tmp_path):
    ab = _rung_ab_module()
    old = tmp_path / "old.cu"
    old.write_text((CUDA_DIR / RUNGS[9]).read_text())
    args = ab.parse_args([str(old), "--shapes", "4096,1000x1024x512", "--rounds", "3"])
    assert args.versions == [old] and args.rung == "9" and args.rounds == 3 and args.flush == "write"
    assert args.shape_list == [(4096, 4096, 4096), (1000, 1024, 512)]
    (tmp_path / "b").mkdir()
    twin = tmp_path / "b" / "old.cu"
    twin.write_text("")
    for bad in ([str(tmp_path / "missing.cu")], [str(old), str(twin)], [str(old), "--rounds", "0"],
                [str(old), "--flush", "zero"], [str(old), "--shapes", "100x100x100"], []):
        with pytest.raises(SystemExit):
            ab.parse_args(bad)


@needs_nvcc
def test_rung_ab_builds_a_version_beside_the_package_headers(tmp_path, capsys):
    """--build-only: a copy of rung 9 outside the package builds (its #include of gelu_erfc.cuh resolved from the
    copies beside it) and is reported under its file's stem, next to 'current'."""
    ab = _rung_ab_module()
    old = tmp_path / "older.cu"
    old.write_text((CUDA_DIR / RUNGS[9]).read_text())
    assert ab.main(["--build-only", str(old)]) == 0
    out = capsys.readouterr().out
    assert "current:" in out and "older:" in out and "rung9_kernel" in out, out


@needs_nvcc
def test_ladder_sweep_runs_without_a_gpu():
    """--list, and --build-only (rungs 7-9 for sm_90a through the package's build cache); the full run on a
    machine without a GPU stops after the builds with exit 2 and says why."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(SWEEP), "--list"], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0 and "cluster-1" in proc.stdout, proc.stdout + proc.stderr
    proc = subprocess.run([sys.executable, str(SWEEP), "--build-only"], capture_output=True, text=True, timeout=900,
                          env=env)
    assert proc.returncode == 0 and "BUILD FAILED" not in proc.stdout, proc.stdout + proc.stderr
    try:
        import torch
        has_gpu = torch.cuda.is_available()
    except ImportError:
        has_gpu = False
    if not has_gpu:
        proc = subprocess.run([sys.executable, str(SWEEP), "--budget-s", "600"], capture_output=True, text=True,
                              timeout=900, env=env)
        assert proc.returncode == 2 and "no CUDA GPU" in proc.stdout, proc.stdout + proc.stderr


# ------------------------------------------------------------------------------------- the trace script
def _trace_module():
    import importlib.util

    _sweep_module()  # registered as "ladder_sweep", which the script imports
    spec = importlib.util.spec_from_file_location("rung9_trace", ROOT / "tools" / "rung9_trace.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _trace_words(layout, slots, mhz: float = 0.0):
    """A trace buffer as the kernel writes it: slots -> [(tile, kb, k_tiles, piece, start, main_end, step_end,
    epi_end)] with times in ns; entry at 1000 ns before a slot's first start; with 8 words an item, %clock at the
    mainloop's start and end as an SM clock of `mhz` would count them (the kernel's 32-bit %clock, wrapping)."""
    per_slot, max_items, item_words = layout
    words = [0] * (len(slots) * per_slot)
    for s, items in enumerate(slots):
        base = s * per_slot
        words[base] = items[0][4] - 1000
        words[base + 1] = len(items)
        for j, (tile, kb, kt, piece, *times) in enumerate(items):
            at = base + 2 + j * item_words
            words[at:at + 4] = times
            words[at + 4] = tile
            words[at + 5] = kt | (piece << 16) | (kb << 32)
            if item_words >= 8:
                words[at + 6] = (4_294_000_000 + round(times[0] * mhz / 1000)) % (1 << 32)  # 32-bit: wraps
                words[at + 7] = (4_294_000_000 + round(times[1] * mhz / 1000)) % (1 << 32)
    return words


def test_rung9_trace_decode_and_summary():
    """The trace's layout read back, and the phases: a warpgroup with two whole tiles then a stream-K head that
    waits 3 us for its tile's later piece, another with one whole tile then that later piece."""
    tr = _trace_module()
    layout = (2 + 4 * 6, 4, 6)
    t = 10_000_000  # an arbitrary timer origin
    words = _trace_words(layout, [
        [(0, 0, 64, 0, t, t + 64_000, t + 64_000, t + 66_000),
         (1, 0, 64, 0, t + 66_500, t + 130_500, t + 130_500, t + 132_500),
         (2, 0, 32, tr.PIECE_UNFINISHED, t + 133_000, t + 165_000, t + 168_000, t + 170_000)],
        [(3, 0, 64, 0, t, t + 64_000, t + 64_000, t + 66_000),
         (2, 32, 32, tr.PIECE_LATER, t + 66_500, t + 98_500, t + 99_000, t + 99_000)],
    ])
    rows = tr.decode(words, 2, layout)
    assert [(r["slot"], r["item"], r["tile"], r["kb"], r["k_tiles"], r["piece"]) for r in rows] == [
        (0, 0, 0, 0, 64, 0), (0, 1, 1, 0, 64, 0), (0, 2, 2, 0, 32, 2), (1, 0, 3, 0, 64, 0), (1, 1, 2, 32, 32, 1)]
    assert rows[0]["start"] == 1000 and rows[0]["entry"] == 0  # relative to the earliest entry
    s = tr.summarize(rows)
    assert s["span_us"] == pytest.approx(171.0) and s["items"] == 5 and s["pieces"] == 2
    assert s["tail_us"] == pytest.approx((171_000 - (171_000 + 100_000) / 2) / 1000)
    assert s["whole_ns_per_ktile"] == pytest.approx(1000.0) and s["piece_ns_per_ktile"] == pytest.approx(1000.0)
    assert s["fixup_wait_add_us"] == pytest.approx(3.0) and s["partial_write_us"] == pytest.approx(0.5)
    assert s["whole_epi_us"] == pytest.approx(2.0) and s["piece_epi_us"] == pytest.approx(2.0)
    assert s["dp_end_us_min"] == pytest.approx(67.5) and s["dp_end_us_max"] == pytest.approx(134.0)
    assert s["gap_us"] == pytest.approx(0.5)
    assert s["round0_ns_per_ktile"] == pytest.approx(1000.0) and "round0_mhz" not in s  # no clock words


def test_rung9_trace_narrow_tiles():
    """A balanced round's narrow tiles (piece bit 4) count apart from whole tiles and from stream-K pieces: their own
    ns a k-tile and epilogue, and no round or fix-up figures from them."""
    tr = _trace_module()
    layout = (2 + 4 * 6, 4, 6)
    t = 10_000_000
    words = _trace_words(layout, [
        [(0, 0, 64, 0, t, t + 64_000, t + 64_000, t + 66_000),
         (5, 0, 64, tr.PIECE_NARROW, t + 66_500, t + 126_500, t + 126_500, t + 128_000)],
    ])
    s = tr.summarize(tr.decode(words, 1, layout))
    assert s["items"] == 2 and s["narrow"] == 1 and s["pieces"] == 0
    assert s["whole_ns_per_ktile"] == pytest.approx(1000.0) and s["narrow_ns_per_ktile"] == pytest.approx(937.5)
    assert s["narrow_epi_us"] == pytest.approx(1.5) and s["whole_epi_us"] == pytest.approx(2.0)
    assert "round1_ns_per_ktile" not in s and "fixup_wait_add_us" not in s and "dp_end_us_min" not in s


def test_rung9_trace_rounds_and_clock():
    """The kernel's 8-word items: by round (a consumer's j-th whole tile), ns and SM cycles a k-tile and the clock
    they imply; a second round at the same cycles but a slower clock reads as the clock."""
    tr = _trace_module()
    layout = (2 + 4 * 8, 4, 8)
    t = 10_000_000
    fast = _trace_words(layout, [[(0, 0, 64, 0, t, t + 64_000, t + 64_000, t + 66_000)]], mhz=1500.0)
    slow = _trace_words(layout, [[(0, 0, 64, 0, t, t + 64_000, t + 64_000, t + 66_000),
                                  (1, 0, 64, 0, t + 66_500, t + 66_500 + 80_000, t + 146_500, t + 148_500)]],
                        mhz=1200.0)
    s = tr.summarize(tr.decode(fast, 1, layout))
    assert s["round0_ns_per_ktile"] == pytest.approx(1000.0)
    assert s["round0_cycles_per_ktile"] == pytest.approx(1500.0) and s["round0_mhz"] == pytest.approx(1500.0)
    s = tr.summarize(tr.decode(slow, 1, layout))
    assert s["round1_ns_per_ktile"] == pytest.approx(1250.0)
    assert s["round1_cycles_per_ktile"] == pytest.approx(1500.0) and s["round1_mhz"] == pytest.approx(1200.0)


def test_rung9_trace_epilogue_steps():
    """The epilogue's %clock stamps (5 a chunk and the end, from word 8): each step's cycles by chunk, medians over
    whole tiles, across a 32-bit wrap; an item without stamps (no TMA-store epilogue) counts in none of them."""
    tr = _trace_module()
    steps = tr.EPI_CHUNKS * tr.EPI_STEPS
    item_words = tr.EPI_WORDS + steps + 2
    layout = (2 + 4 * item_words, 4, item_words)
    t = 10_000_000
    words = _trace_words(layout, [[(0, 0, 64, 0, t, t + 64_000, t + 64_000, t + 66_000),
                                   (1, 0, 64, 0, t + 66_500, t + 130_500, t + 130_500, t + 132_500)]], mhz=1500.0)
    per_step = {"wait": 10, "write": 200, "fence": 40, "barrier": 30, "issue": 20}  # cycles, chunk c adds c
    for j, origin in ((0, (1 << 32) - 300), (1, 7)):  # the first item's stamps wrap around 2^32
        at, clock = 2 + j * item_words + tr.EPI_WORDS, origin
        for c in range(tr.EPI_CHUNKS):
            for p, name in enumerate(tr.EPI_STEP_NAMES):
                words[at + c * tr.EPI_STEPS + p] = clock % (1 << 32)
                clock += per_step[name] + c
        words[at + steps] = clock % (1 << 32)
    rows = tr.decode(words, 1, layout)
    assert rows[0]["epi0"] == 0 and rows[1]["epi20"] == sum(per_step.values()) * 4 + 5 * (0 + 1 + 2 + 3)
    s = tr.summarize(rows)
    assert s["epi_c0_write_cycles"] == 200 and s["epi_c3_fence_cycles"] == 43 and s["epi_c2_issue_cycles"] == 22
    assert s["epi_cycles"] == sum(per_step.values()) * 4 + 30
    for j in range(2):  # chunks 0 and 2 end no group (pairs): no fence, barrier or stores of their own
        for c in (0, 2):
            for p in (3, 4):
                words[2 + j * item_words + tr.EPI_WORDS + c * tr.EPI_STEPS + p] = 0
    s = tr.summarize(tr.decode(words, 1, layout))
    assert "epi_c0_fence_cycles" not in s and "epi_c0_issue_cycles" not in s and "epi_c2_barrier_cycles" not in s
    assert s["epi_c1_fence_cycles"] == 41 and s["epi_c0_write_cycles"] == 200
    words[2 + 1 * item_words + tr.EPI_WORDS:2 + 2 * item_words] = [0] * (steps + 2)  # item 1: no epilogue stamps
    rows = tr.decode(words, 1, layout)
    assert rows[1]["epi20"] is None and tr.summarize(rows)["epi_c0_write_cycles"] == 200


@needs_nvcc
def test_rung9_trace_builds_are_diagnostic_only(capsys):
    """--build-only builds both diagnostic copies; they export the trace entry points, the library's build does
    not (the instrumentation is compiled only under TILEFUSE_RUNG9_TRACE)."""
    tr = _trace_module()
    assert tr.main(["--build-only"]) == 0
    out = capsys.readouterr().out
    libs = dict(re.findall(r"^\s*([\w-]+): (\S+\.so)", out, re.M))
    assert set(libs) == {"current", "trace", "trace-split"}, out
    assert not hasattr(ctypes.CDLL(libs["current"]), "tilefuse_rung9_set_trace")
    for name in ("trace", "trace-split"):
        assert hasattr(ctypes.CDLL(libs[name]), "tilefuse_rung9_set_trace"), name
