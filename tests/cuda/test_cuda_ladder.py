"""The CUDA C++ GEMM ladder: build, SASS claims, emulator correctness, HIP port, warp-size lint, Python API.

CPU (CI, no GPU):
  * every rung compiles with nvcc for its own target (sm_80: 1-6 and 5s; sm_90a: 7-9) through build.py, its
    ptxas report is parsed per kernel, its SASS holds what it claims (FFMA, HMMA with LDSM and LDGSTS for
    rung 6, HGMMA for 7-9) and rungs 6-9 have no stack, spills or local-memory instructions; a second build
    is a cache hit; a compile error raises with nvcc's message;
  * rungs 1-6 and 5s run on the CPU SIMT emulator (host builds of the same source) against a float64
    reference on odd sizes, both dtypes, every epilogue, outputs poisoned with NaN and strided (padding must
    stay NaN); rung 6 with cp.async completing eagerly and lazily, no ldmatrix bank conflict, and two planted
    mutations (no swizzle, one cp.async group too few waited for) that the emulator must catch;
  * the C ABI's checks (layout, requirements, rejected arguments) and CudaError's message;
  * the HIP translation of the portable rungs compiles for gfx90a and gfx942 with clang-19;
  * the warp-size lint on planted fixtures (each rule fires where planted, the portable forms pass) and on
    the package's own sources (clean; NVIDIA-only files skipped by the declared rule); `tilefuse port` exit
    codes and its -o output;
  * tilefuse.cuda.gemm's argument errors, its layouts (transposed and strided operands), and the
    `tilefuse targets` rows.
GPU (marked gpu; the H200): rungs 1-6 and 5s against a float32 reference at several sizes with poisoned,
strided outputs; tilefuse.cuda.gemm for every rung including 7-9 (B as a transposed weight view and as a
row-major copy); compute-sanitizer memcheck on a small size for rungs 6-9 when it is on the PATH.
"""
from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import tilefuse.cuda as tcuda
from tilefuse import cli
from tilefuse.cuda import build, launch, port, target_rows

from tests.support import TOLERANCE, assert_close, poison, poisoned_empty, rel_error, transposed_copy

ROOT = Path(__file__).resolve().parents[2]
CUDA_DIR = ROOT / "tilefuse" / "cuda" / "ladder"
ALL_RUNGS = ["1", "2", "3", "4", "5", "5s", "6", "7", "8", "9"]
EMULATED = ["1", "2", "3", "4", "5", "5s", "6"]
PORTABLE = ["1", "2", "3", "4", "5", "5s"]
NVIDIA_ONLY_FILES = {"rung6_mma_sync.cu", "rung7_tma_wgmma.cu", "rung8_warpspec.cu", "rung9_persistent.cu",
                     "mma_sm80.cuh", "hopper.cuh", "emulator.h"}
INVALID_VALUE = 1  # cudaErrorInvalidValue
DTYPES = [torch.bfloat16, torch.float16]

needs_nvcc = pytest.mark.skipif(not build.have_nvcc(), reason="nvcc is not on the PATH (TILEFUSE_NVCC)")
needs_cxx = pytest.mark.skipif(build.host_compiler() is None, reason="no host C++ compiler for the emulator")
needs_clang = pytest.mark.skipif(port.hip_compiler() is None, reason="clang-19 is not installed (TILEFUSE_HIP_CLANG)")


def _ref(a, b, bias=None, epilogue=0):
    out = a.double() @ b.double()
    if epilogue >= 1:
        out = out + bias.double()
    if epilogue == 2:
        out = torch.nn.functional.gelu(out)
    return out


# ------------------------------------------------------------------------------------------- metadata
def test_discovery_finds_every_rung_with_its_metadata():
    rungs = tcuda.rungs()
    assert [r.name for r in rungs] == ALL_RUNGS
    by = {r.name: r for r in rungs}
    assert {n for n, r in by.items() if r.arch == "sm_80"} == set(EMULATED)
    assert {n for n, r in by.items() if r.arch == "sm_90a"} == {"7", "8", "9"}
    assert {n for n, r in by.items() if r.portable} == set(PORTABLE)
    assert all(r.reason for r in rungs if not r.portable)
    assert {n for n, r in by.items() if r.emulate} == set(EMULATED)
    assert by["6"].claims == "HMMA" and all(by[n].claims == "HGMMA" for n in "789")
    assert by["6"].dynamic_smem == 147456
    for r in rungs:
        header = r.path.read_text().split("#include")[0]
        assert "TFLOP/s" in header and "not measured yet" not in header, \
            f"{r.path.name}: the header must carry the measured result"
        if r.order < (7, ""):
            assert "Adds" in header and "Layouts" in header, r.path.name
        assert r.lines_of_code() > 20


def test_metadata_parser_and_code_line_count():
    meta = build.parse_metadata('// x\n// tilefuse: rung=5s arch=sm_80 portable=no reason="a b=c" claims=FFMA\n')
    assert meta == {"rung": "5s", "arch": "sm_80", "portable": "no", "reason": "a b=c", "claims": "FFMA"}
    assert build.parse_metadata("int x;\n") is None
    assert build.count_code_lines('// c\n\nint a; /* x\n y */ int b;\n  // d\nchar* s = "//";\n') == 3


def test_ptxas_report_parser():
    log = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z3fooPf' for 'sm_80'
ptxas info    : Function properties for _Z3fooPf
    8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 242 registers, used 1 barriers, 8448 bytes smem, 428 bytes cmem[0]
ptxas info    : Function properties for __internal_helper
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function '_Z3barv' for 'sm_80'
ptxas info    : Function properties for _Z3barv
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 32 registers, used 0 barriers, 428 bytes cmem[0]
"""
    k = build.parse_ptxas(log)
    assert [(x.registers, x.stack_bytes, x.spill_stores, x.spill_loads, x.static_smem, x.barriers) for x in k] == \
        [(242, 8, 4, 12, 8448, 1), (32, 0, 0, 0, 0, 0)]
    assert k[0].spills == 24 and k[0].name.startswith("foo")
    sass = "        /*0a10*/                   HMMA.16816.F32.BF16 R4, R8, R12, R4 ;\n" \
           "        /*0a20*/              @!P0 LDL.64 R2, [R1] ;\n        /*0a30*/   HMMA.16816.F32.BF16 R4, R8, R12, R4 ;\n"
    assert build.sass_opcodes(sass) == {"HMMA": 2, "LDL": 1}


# ---------------------------------------------------------------------------------------- nvcc builds
@needs_nvcc
@pytest.mark.parametrize("name", ALL_RUNGS)
def test_rung_compiles_for_its_target_with_what_it_claims(name):
    r = build.rung(name)
    built = build.build(name)
    assert built.target == r.arch and built.library.exists()
    assert f"-gencode=arch=compute_{r.arch[3:]},code={r.arch}" in built.command
    # a bf16 and an fp16 kernel; the Hopper rungs one of each for every epilogue (none, bias, GeLU: a template
    # argument, see rung9_persistent.cu)
    kernels = 6 if name in ("7", "8", "9") else 2
    assert len(built.kernels) == kernels, f"{kernels} kernels expected in the ptxas report:\n{built.log}"
    assert all(k.registers > 0 for k in built.kernels)
    assert "error" not in built.log.lower(), built.log
    if built.has(r.claims) is None:
        pytest.skip("cuobjdump (triton wheel) is not installed: SASS not inspected")
    assert built.has(r.claims), f"rung {name}: no {r.claims} in the SASS"
    assert build.check(built, r) == []
    if name == "6":
        assert built.has("LDSM") and built.has("LDGSTS"), "rung 6 must use ldmatrix and cp.async"
        assert not built.has("HGMMA")
    if r.order < (6, ""):
        assert not built.has("HMMA") and not built.has("HGMMA"), "the FFMA rungs must not use tensor cores"


@needs_nvcc
@pytest.mark.parametrize("name", ["6", "7", "8", "9"])
def test_tensor_core_rungs_have_no_spills_or_local_memory(name):
    built = build.build(name)
    for k in built.kernels:
        assert (k.stack_bytes, k.spill_stores, k.spill_loads) == (0, 0, 0), f"{k.name}: {k}"
    if built.sass_counts:
        assert built.local_memory_ops == 0, "LDL/STL in the SASS"
    if name == "6":  # the register budget the header states: one 256-thread block an SM, ~200-255 registers
        assert all(k.registers <= 255 for k in built.kernels)


@needs_nvcc
def test_second_build_is_a_cache_hit():
    first = build.build("1")
    again = build.build("1")
    assert again.cached and again.library == first.library


@needs_nvcc
def test_device_builds_target_the_gpu_found():
    assert build.device_target(build.rung("6"), (9, 0)) == "sm_90"
    assert build.device_target(build.rung("6"), (8, 0)) == "sm_80"
    assert build.device_target(build.rung("9"), (9, 0)) == "sm_90a"
    with pytest.raises(ValueError, match="compute capability 9.0"):
        build.device_target(build.rung("7"), (10, 0))
    with pytest.raises(ValueError, match="8.0 or newer"):
        build.device_target(build.rung("1"), (7, 5))
    assert build.nvcc_target(build.rung("6"), "sm_90") == ["-gencode=arch=compute_80,code=sm_90"]


@needs_nvcc
def test_a_compile_error_raises_with_nvccs_message(tmp_cache, tmp_path):
    src = tmp_path / "rung42_broken.cu"
    src.write_text('// tilefuse: rung=42 arch=sm_80 portable=yes claims=FFMA\n'
                   '__global__ void k(float* x) { x[0] = undefined_thing; }\n')
    r = build._rung_from(src)
    with pytest.raises(build.BuildError) as info:
        build.build(r)
    text = str(info.value)
    assert "rung42_broken.cu" in text and "undefined_thing" in text and "undefined" in text


def test_bad_metadata_is_refused(tmp_path):
    src = tmp_path / "rung43_x.cu"
    src.write_text('// tilefuse: rung=43 arch=sm_75 portable=yes\n')
    with pytest.raises(build.BuildError, match="arch='sm_75': accepted values are sm_80, sm_90a"):
        build._rung_from(src)
    src.write_text('// tilefuse: rung=43 arch=sm_80 portable=no\n')
    with pytest.raises(build.BuildError, match="needs a reason"):
        build._rung_from(src)


# ------------------------------------------------------------------------------------------- emulator
def _emu(name: str) -> launch.RungLibrary:
    return launch.load(build.build(name, emulate=True))


def _call(lib, a, b, c, bias=None, epilogue=0, m=None, n=None, k=None, lda=None, ldb=None, ldc=None, dtype=None):
    m = a.shape[0] if m is None else m
    k = a.shape[1] if k is None else k
    n = c.shape[1] if n is None else n
    lib(a.data_ptr(), b.data_ptr(), c.data_ptr(), None if bias is None else bias.data_ptr(), m, n, k,
        a.stride(0) if lda is None else lda, b.stride(0) if ldb is None else ldb, c.stride(0) if ldc is None else ldc,
        dtype or str(a.dtype).replace("torch.", ""), epilogue, None)


ANY_SHAPES = [(1, 1, 1), (7, 13, 29), (129, 65, 130), (33, 7, 1000)]
MULT8_SHAPES = [(1, 8, 8), (7, 136, 200), (129, 264, 72)]
# The emulator switches context at every barrier and warp collective: rung 6 costs ~0.3 s a block and
# k-tile, the split-K rung's shuffles ~0.1 s a row group. Shapes are chosen to cover the edges (partial M, N
# and K tiles, several blocks both ways) at that price; rung 6's 4-k-tile pipeline wrap is covered below.
SHAPES = {"1": ANY_SHAPES, "2": ANY_SHAPES, "3": ANY_SHAPES, "4": MULT8_SHAPES, "5": MULT8_SHAPES,
          "5s": [(1, 8, 8), (7, 136, 200), (13, 24, 1000)], "6": MULT8_SHAPES}


@needs_cxx
@pytest.mark.parametrize("name", EMULATED)
def test_emulated_rung_matches_float64_reference(name):
    lib = _emu(name)
    assert lib.b_layout == 0
    for i, (m, n, k) in enumerate(SHAPES[name]):
        for dtype in DTYPES:
            epilogue = (i + DTYPES.index(dtype)) % 3  # every epilogue over the shapes
            a = torch.randn(m, k, dtype=dtype)
            b = torch.randn(k, n, dtype=dtype) / k ** 0.5
            bias = torch.randn(n, dtype=dtype)
            c = poisoned_empty(m, n, dtype=dtype, device="cpu")
            _call(lib, a, b, c, bias if epilogue else None, epilogue)
            assert_close(c, _ref(a, b, bias, epilogue), dtype=dtype, what=f"rung {name} {m}x{n}x{k} epilogue {epilogue}")


@needs_cxx
@pytest.mark.parametrize("name", EMULATED)
def test_emulated_rung_writes_only_inside_c_and_reads_strided_operands(name):
    """C a view of a bigger NaN buffer (ldc > N, rows below M), A and B with leading dimensions > K, N."""
    lib = _emu(name)
    m, n, k = (37, 48, 40) if name != "5s" else (9, 48, 40)
    dtype = torch.float16
    a = torch.randn(m, k + 24, dtype=dtype)[:, :k]
    b = torch.randn(k, n + 16, dtype=dtype)[:, :n]
    buf = poison(torch.empty(m + 5, n + 40, dtype=dtype))
    c = buf[:m, :n]
    _call(lib, a, b, c)
    assert_close(c, _ref(a, b), dtype=dtype, what=f"rung {name} strided")
    assert torch.isnan(buf[:m, n:]).all() and torch.isnan(buf[m:]).all(), "wrote outside C"


@needs_cxx
@pytest.mark.parametrize("lazy", [0, 1], ids=["cp.async-eager", "cp.async-lazy"])
def test_rung6_pipeline_and_swizzle_on_the_emulator(lazy):
    lib = _emu("6")
    lib.set("reset", 1)
    lib.set("lazy_copies", lazy)
    try:
        m, n, k = 70, 136, 200  # one block, 4 k-tiles through the 3-stage ring, partial M, N and K tiles
        a = torch.randn(m, k, dtype=torch.bfloat16)
        b = torch.randn(k, n, dtype=torch.bfloat16)
        c = poisoned_empty(m, n, dtype=torch.bfloat16, device="cpu")
        _call(lib, a, b, c)
        assert_close(c, _ref(a, b), dtype=torch.bfloat16, what=f"rung 6 lazy={lazy}")
        assert lib.stat("mma_ops") > 0 and lib.stat("ldmatrix_ops") > 0 and lib.stat("cp_async_ops") > 0
        assert lib.stat("ldmatrix_conflicts") == 0, "the XOR swizzle should leave ldmatrix conflict-free"
        assert lib.stat("bad_addresses") == 0 and lib.stat("deadlocks") == 0
    finally:
        lib.set("lazy_copies", 0)


MUTATIONS = (("((chunk ^ (row & 7)) * kChunk)", "(chunk * kChunk)"),                  # no XOR swizzle
             ("cp_async_wait<kStages - 2>();", "cp_async_wait<kStages - 1>();"))   # one group too few waited for


@needs_cxx
def test_emulator_catches_planted_rung6_mutations(tmp_path, tmp_cache):
    """What the emulator is for. Rung 6 with two planted bugs (one build): with eagerly completing copies the
    result is still right but the missing swizzle shows as ldmatrix bank conflicts; with lazily completing
    copies, waiting for one cp.async group too few reads a stage before it landed: a wrong result."""
    for f in ("common.cuh", "emulator.h", "mma_sm80.cuh"):
        shutil.copyfile(CUDA_DIR / f, tmp_path / f)
    text = (CUDA_DIR / "rung6_mma_sync.cu").read_text()
    for old, new in MUTATIONS:
        assert old in text, old
        text = text.replace(old, new)
    (tmp_path / "rung6_mma_sync.cu").write_text(text)
    mutant = launch.load(build.build(build._rung_from(tmp_path / "rung6_mma_sync.cu"), emulate=True))
    m, n, k = 64, 256, 256
    a = torch.randn(m, k, dtype=torch.float16)
    b = torch.randn(k, n, dtype=torch.float16)
    ref = _ref(a, b)
    mutant.set("reset", 1)
    c = poisoned_empty(m, n, dtype=torch.float16, device="cpu")
    _call(mutant, a, b, c)
    assert_close(c, ref, dtype=torch.float16, what="eager copies hide the early read")
    assert mutant.stat("ldmatrix_conflicts") > 0, "a missing swizzle went unseen"
    mutant.set("lazy_copies", 1)
    try:
        c = poisoned_empty(m, n, dtype=torch.float16, device="cpu")
        _call(mutant, a, b, c)
        assert rel_error(c, ref) > TOLERANCE[torch.float16], "reading a stage before its copies landed went unseen"
    finally:
        mutant.set("lazy_copies", 0)


@needs_cxx
@pytest.mark.parametrize("name", EMULATED)
def test_abi_layout_requirements_and_rejected_arguments(name):
    lib = _emu(name)
    mult = (1, 1, 1) if name in ("1", "2", "3") else (1, 8, 8)
    assert lib.requirements == mult
    p = ctypes.c_void_p(0x1000).value  # never dereferenced: each call fails its checks first

    def call(**kw):
        args = dict(A=p, B=p, C=p, bias=None, M=16, N=64, K=64, lda=64, ldb=64, ldc=64, dtype="bfloat16",
                    epilogue=0)
        args.update(kw)
        fn = getattr(lib.lib, f"tilefuse_rung{name}")
        return fn(args["A"], args["B"], args["C"], args["bias"], args["M"], args["N"], args["K"], args["lda"],
                  args["ldb"], args["ldc"], launch.DTYPE_CODES.get(args["dtype"], 7), args["epilogue"], None)

    assert call(dtype="float32") == INVALID_VALUE
    assert call(epilogue=3) == INVALID_VALUE
    assert call(epilogue=1, bias=None) == INVALID_VALUE
    assert call(lda=32) == INVALID_VALUE and call(ldb=32) == INVALID_VALUE and call(ldc=32) == INVALID_VALUE
    assert call(M=-1) == INVALID_VALUE
    assert call(A=None) == INVALID_VALUE
    assert call(M=0) == 0 and call(N=0) == 0
    if mult[2] == 8:
        assert call(K=60, lda=60, ldb=64) == INVALID_VALUE
        assert call(N=60, ldb=60, ldc=60) == INVALID_VALUE


@needs_cxx
def test_a_failing_launcher_raises_cuda_error_with_its_string():
    lib = _emu("4")
    a = torch.randn(8, 16, dtype=torch.bfloat16)
    b = torch.randn(16, 8, dtype=torch.bfloat16)
    c = torch.empty(8, 8, dtype=torch.bfloat16)
    with pytest.raises(launch.CudaError, match=r"cudaErrorInvalidValue \(1\): invalid argument") as info:
        _call(lib, a, b, c, lda=4)
    assert info.value.code == 1
    assert launch.error_string(700) == "an illegal memory access was encountered"


# --------------------------------------------------------------------------------- tilefuse.cuda.gemm
@needs_cxx
def test_gemm_on_cpu_tensors_runs_the_emulator_with_any_operand_layout():
    m, n, k = 7, 24, 40
    a = torch.randn(m, k, dtype=torch.bfloat16)
    b = torch.randn(k, n, dtype=torch.bfloat16)
    bias = torch.randn(n, dtype=torch.float32)  # converted to a's dtype
    ref = torch.nn.functional.gelu(_ref(a, b) + bias.bfloat16().double())
    for name in ("2", "4"):
        for aa, bb in ((a, b), (transposed_copy(a), transposed_copy(b)), (a[:, :], b.t().contiguous().t())):
            out = tcuda.gemm(aa, bb, rung=name, bias=bias, activation="gelu")
            assert out.shape == (m, n) and out.dtype == torch.bfloat16 and out.is_contiguous()
            assert_close(out, ref, dtype=torch.bfloat16, what=f"gemm rung {name}")
    out = tcuda.gemm(a, b, rung=5, activation="gelu")  # gelu without a bias: a zero bias
    assert_close(out, torch.nn.functional.gelu(_ref(a, b)), dtype=torch.bfloat16)
    z = tcuda.gemm(torch.randn(5, 0, dtype=torch.float16), torch.randn(0, 8, dtype=torch.float16), rung=4,
                   bias=torch.ones(8, dtype=torch.float16))
    assert torch.equal(z, torch.ones(5, 8, dtype=torch.float16))
    assert tcuda.gemm(torch.randn(0, 8, dtype=torch.float16), torch.randn(8, 8, dtype=torch.float16), rung=1).shape == (0, 8)


def test_gemm_argument_errors_name_the_argument_and_accepted_values():
    a = torch.randn(8, 16, dtype=torch.bfloat16)
    b = torch.randn(16, 8, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"rung=10: accepted values are 1, 2, 3, 4, 5, '5s', 6, 7, 8, 9"):
        tcuda.gemm(a, b, rung=10)
    with pytest.raises(TypeError, match="rung=True"):
        tcuda.gemm(a, b, rung=True)
    with pytest.raises(TypeError, match=r"a.dtype=torch.float32: accepted dtypes are torch.bfloat16, torch.float16"):
        tcuda.gemm(a.float(), b, rung=1)
    with pytest.raises(TypeError, match="b.dtype=torch.float16 differs from a.dtype=torch.bfloat16"):
        tcuda.gemm(a, b.half(), rung=1)
    with pytest.raises(ValueError, match=r"a must be 2-D \(M, K\), got shape \(1, 8, 16\)"):
        tcuda.gemm(a[None], b, rung=1)
    with pytest.raises(ValueError, match=r"a.shape\[1\] \(K\) must equal b.shape\[0\]"):
        tcuda.gemm(a, b[:8], rung=1)
    with pytest.raises(ValueError, match="same device"):
        tcuda.gemm(a, b.to("meta"), rung=1)
    with pytest.raises(ValueError, match=r"activation='relu': accepted values are None, 'gelu'"):
        tcuda.gemm(a, b, rung=1, activation="relu")
    with pytest.raises(ValueError, match=r"bias has shape \(16,\): accepted shapes are \(8,\) and \(1, 8\)"):
        tcuda.gemm(a, b, rung=1, bias=torch.randn(16))
    with pytest.raises(TypeError, match="b must be a torch.Tensor"):
        tcuda.gemm(a, [[1.0]], rung=1)
    with pytest.raises(ValueError, match=r"rung 7 runs on a CUDA GPU only \(sm_90a.*emulated rungs are 1, 2, 3, 4, 5, '5s', 6"):
        tcuda.gemm(a, b, rung=7)


@needs_cxx
def test_gemm_checks_the_rungs_shape_multiples_before_launching():
    a = torch.randn(8, 16, dtype=torch.float16)
    with pytest.raises(ValueError, match=r"rung 4 needs N % 8 == 0: got \(M, N, K\) = \(8, 7, 16\).*rung 1, 2 or 3"):
        tcuda.gemm(a, torch.randn(16, 7, dtype=torch.float16), rung=4)
    with pytest.raises(ValueError, match=r"rung 6 needs K % 8 == 0"):
        tcuda.gemm(torch.randn(8, 12, dtype=torch.float16), torch.randn(12, 8, dtype=torch.float16), rung=6)


# ------------------------------------------------------------------------------------------ HIP / AMD
@needs_clang
@pytest.mark.parametrize("arch", port.AMD_ARCHES)
@pytest.mark.parametrize("name", PORTABLE)
def test_portable_rung_translates_to_hip_and_compiles_for_amd(name, arch):
    r = build.rung(name)
    built = target_rows.hip_build(r, arch)
    assert built.ok, built.error
    assert len(built.kernels) == 2 and all(k.wavefront_size == 64 for k in built.kernels), built.kernels
    source = Path(built.source).read_text()
    common = Path(built.source).with_name("common.cuh").read_text()
    assert "hip/hip_runtime.h" in source and "cudaGetLastError" not in source and "hipGetLastError" in source
    assert "__hip_bfloat16" in common and "hipGetErrorString" in common
    if name == "5s":  # the portable warp code: reductions sized by warpSize, 64-bit lane mask on HIP
        assert "warp_allsum" in source and "warpSize" in source


@needs_clang
def test_nvidia_only_rung_is_not_claimed_for_amd():
    rows = target_rows.rows(["gfx942"])
    by = {r.kernel: r for r in rows}
    assert by["cuda-rung6"].error.startswith("n/a: NVIDIA-only (mma.sync") and not by["cuda-rung6"].claimed
    assert by["cuda-rung9"].error.startswith("n/a: NVIDIA-only") and not by["cuda-rung9"].claimed
    assert by["cuda-rung5s"].ok and by["cuda-rung5s"].kind == "hip"


# ----------------------------------------------------------------------------------------------- lint
PLANTED = {  # rule -> (snippet, line of the finding within it)
    "lane-mask": ("__device__ float f(float v) {\n  return __shfl_down_sync(0xffffffff, v, 1);\n}\n", 2),
    "lane-index": ("__global__ void k(int* o) {\n  int t = threadIdx.x + 1;\n  int lane = t & 31;\n  o[t] = lane;\n}\n", 3),
    "lane-index/": ("__global__ void k(int* o) {\n  int w = threadIdx.x / 32;\n  o[0] = w;\n}\n", 2),
    "lane-index>>": ("__global__ void k(int* o) {\n  const int tid = threadIdx.y * 8 + threadIdx.x;\n  o[tid >> 5] = 1;\n}\n", 3),
    "lane-index%": ("__global__ void k(int* o) {\n  int i = blockIdx.x * blockDim.x + threadIdx.x;\n  o[i] = i % 32;\n}\n", 3),
    "shuffle-reduction": ("__device__ float s(float v) {\n  for (int o = 16; o > 0; o >>= 1)\n"
                          "    v += __shfl_xor_sync(__activemask(), v, o);\n  return v;\n}\n", 2),
    "shuffle-reduction-unrolled": ("__device__ float s(float v, unsigned m) {\n  v += __shfl_down_sync(m, v, 16);\n"
                                   "  v += __shfl_down_sync(m, v, 8);\n  return v;\n}\n", 2),
    "ballot-32": ("__device__ int c(bool p) {\n  unsigned int b = __ballot_sync(__activemask(), p);\n  return 0;\n}\n", 2),
    "ballot-popc": ("__device__ int c(bool p) {\n  auto b = __ballot_sync(__activemask(), p);\n  return __popc(b);\n}\n", 3),
    "shuffle-width": ("__device__ float g(float v, unsigned m) {\n  return __shfl_sync(m, v, 0, 32);\n}\n", 2),
    "warp-size-const": ("#define WARP_SIZE 32\n__device__ int w() { return WARP_SIZE; }\n", 1),
    "warp-size-const-constexpr": ("constexpr int kWarpSize = 32;\n", 1),
}
PORTABLE_FORMS = [
    "__device__ float f(float v) {\n  for (int o = warpSize / 2; o > 0; o /= 2) v += __shfl_xor(v, o);\n  return v;\n}\n",
    "__global__ void k(int* o, int n) {\n  int lane = threadIdx.x % warpSize, w = threadIdx.x / warpSize;\n"
    "  o[lane] = w + n / 32 + (n & 31) + o[threadIdx.x] / 32;  // n is not a thread index\n}\n",
    "#if defined(__HIP__)\ntypedef unsigned long long mask_t;\n#define W 64\n#else\ntypedef unsigned mask_t;\n"
    "#define WARP_SIZE 32\n#define FULL 0xffffffffu\n#endif\n",
    "__device__ long long c(bool p) {\n  unsigned long long b = __ballot(p);\n  return __popcll(b);\n}\n",
    "__device__ unsigned h(unsigned x) { return x * 2654435761u ^ 0xffffffffu; }\n",  # not a lane mask
    "__device__ float g(float v) { return __shfl(v, 0, warpSize) + 1.0f / 32; }\n",
    "// comment: tid & 31, 0xffffffff, for (int o = 16; ...) __shfl_down_sync\n"
    "const char* s = \"threadIdx.x % 32\";\n",
]


@pytest.mark.parametrize("rule", sorted(PLANTED))
def test_lint_flags_each_planted_32_lane_assumption(rule):
    snippet, line = PLANTED[rule]
    found = port.lint_text(snippet, "planted.cu")
    base = rule.split("/")[0].split(">")[0].split("%")[0]
    base = {"shuffle-reduction-unrolled": "shuffle-reduction", "ballot-popc": "ballot-32",
            "warp-size-const-constexpr": "warp-size-const"}.get(base, base)
    hits = [f for f in found if f.rule == base]
    assert hits, f"{rule}: nothing found in\n{snippet}\n(found: {found})"
    assert hits[0].line == line, hits
    text = hits[0].format()
    assert text.startswith(f"planted.cu:{line}: ") and "; portable: " in text


def test_lint_passes_the_portable_forms():
    for text in PORTABLE_FORMS:
        assert port.lint_text(text, "ok.cu") == [], text


def test_lint_suggests_the_portable_form():
    (f,) = [x for x in port.lint_text(PLANTED["lane-index"][0], "k.cu") if x.rule == "lane-index"]
    assert f.what == "'t & 31' computes the lane index of a 32-lane warp" and f.portable.startswith("t % warpSize")


def test_the_packages_cuda_sources_are_lint_clean():
    reports = port.lint_files([CUDA_DIR.parent])  # the whole cuda/ folder: hip_min is skipped
    names = {r.path.name for r in reports}
    assert {"rung5s_splitk_portable.cu", "common.cuh"} <= names
    assert not any(r.path.parts.count("hip_min") for r in reports)
    findings = [f.format() for r in reports for f in r.findings]
    assert findings == [], "\n".join(findings)
    assert {r.path.name for r in reports if r.nvidia_only} == NVIDIA_ONLY_FILES
    # The rule is not an escape hatch for the portable rungs: they are linted, and the split-K rung's warp
    # code really is written in terms of warpSize.
    linted = {r.path.name for r in reports if not r.nvidia_only}
    assert {f"{r.path.name}" for r in tcuda.rungs() if r.portable} <= linted
    text = (CUDA_DIR / "rung5s_splitk_portable.cu").read_text() + (CUDA_DIR / "common.cuh").read_text()
    assert "warpSize / 2" in text and "% warpSize" in text and "~lanemask_t(0)" in text


def test_tilefuse_port_prints_findings_and_exits_1(tmp_path, capsys):
    """Through the CLI's own entry point (`python -m tilefuse` exits with what cli.main returns)."""
    bad = tmp_path / "bad.cu"
    bad.write_text(PLANTED["lane-mask"][0] + PLANTED["lane-index"][0].replace("void k", "void k2"))
    good = tmp_path / "good.cu"
    good.write_text(PORTABLE_FORMS[1])
    assert cli.main(["port", str(bad)]) == 1
    out = capsys.readouterr().out
    assert re.search(rf"^{re.escape(str(bad))}:2: lane mask 0xffffffff .*; portable: .*~lanemask_t\(0\)", out, re.M)
    assert re.search(rf"^{re.escape(str(bad))}:6: 't & 31' .*; portable: t % warpSize", out, re.M)
    assert cli.main(["port", str(good), "-o", str(tmp_path / "hip")]) == 0
    out = capsys.readouterr().out
    hip = tmp_path / "hip" / "good.hip"
    assert hip.exists() and "wrote" in out and "hip/hip_runtime.h" in hip.read_text()
    assert cli.main(["port", str(tmp_path / "missing.cu")]) == 2


def test_tilefuse_port_skips_nvidia_only_files_by_a_printed_rule(tmp_path, capsys):
    f = tmp_path / "mine.cu"
    f.write_text('// tilefuse: rung=99 arch=sm_90a portable=no reason="uses wgmma" claims=HGMMA\n'
                 "__global__ void k(int* o) { o[threadIdx.x % 32] = 0; }\n")
    assert cli.main(["port", str(f)]) == 0
    out = capsys.readouterr().out
    assert f"{f}: NVIDIA-only (uses wgmma): not linted or translated" in out and "rule: a file declaring" in out


# ---------------------------------------------------------------------------------- tilefuse targets
@needs_nvcc
def test_targets_rows_for_the_ladder():
    rows = target_rows.rows(["sm_80", "sm_90a"])
    by = {(r.kernel, r.target): r for r in rows}
    assert len(rows) == 2 * len(ALL_RUNGS)
    six = by[("cuda-rung6", "sm_80")]
    assert six.ok and six.claimed and six.kind == "cuda c++" and six.registers and six.spills == 0
    assert six.shared_bytes == 147456 and (six.mma == "HMMA" or "no cuobjdump" in six.note)
    nine = by[("cuda-rung9", "sm_90a")]
    assert nine.ok and nine.spills == 0 and (nine.mma == "HGMMA" or "no cuobjdump" in nine.note)
    assert not by[("cuda-rung9", "sm_80")].claimed and "sm_90a only" in by[("cuda-rung9", "sm_80")].error
    assert not by[("cuda-rung1", "sm_90a")].claimed
    from tilefuse import targets

    assert "cuda-ladder" in targets.providers() and targets.failures(rows) == []


# ================================================================================================= GPU
GPU_SHAPES = [(128, 256, 64), (1, 8, 8), (129, 136, 200), (1000, 1000, 1000), (640, 2048, 4096)]
SLOW_RUNGS = {"1", "2", "3", "5s"}  # no tensor cores and little reuse: the 4096^3 case is for the fast ones


@pytest.fixture(scope="module")
def gpu_builds():
    """Every rung built for this GPU, in parallel (the first time only: the cache makes it instant)."""
    cap = torch.cuda.get_device_capability()
    reqs = []
    for r in tcuda.rungs():
        try:
            reqs.append((r, build.device_target(r, cap)))
        except ValueError:
            pass
    results = build.build_many(reqs)
    bad = [f"{r.name}: {res}" for (r, _), res in zip(reqs, results) if isinstance(res, Exception)]
    assert not bad, "\n".join(bad)
    return {r.name: launch.load(res) for (r, _), res in zip(reqs, results)}


@pytest.mark.gpu
@pytest.mark.parametrize("name", EMULATED)
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
def test_gpu_rung_matches_float32_reference(gpu_builds, name, dtype):
    lib = gpu_builds[name]
    shapes = GPU_SHAPES + ([] if name in SLOW_RUNGS else [(4096, 4096, 4096)])
    for i, (m, n, k) in enumerate(shapes):
        epilogue = i % 3
        a = torch.randn(m, k, device="cuda", dtype=dtype)
        b = torch.randn(k, n, device="cuda", dtype=dtype) / k ** 0.5
        bias = torch.randn(n, device="cuda", dtype=dtype)
        c = poisoned_empty(m, n, dtype=dtype, device="cuda")
        _gpu_call(lib, a, b, c, bias if epilogue else None, epilogue)
        ref = (a.float() @ b.float() + (bias.float() if epilogue else 0))
        ref = torch.nn.functional.gelu(ref) if epilogue == 2 else ref
        assert_close(c, ref, dtype=dtype, what=f"rung {name} {m}x{n}x{k} epilogue {epilogue}")


def _gpu_call(lib, a, b, c, bias=None, epilogue=0):
    m, k = a.shape
    lib(a.data_ptr(), b.data_ptr(), c.data_ptr(), None if bias is None else bias.data_ptr(), m, c.shape[1], k,
        a.stride(0), b.stride(0), c.stride(0), str(a.dtype).replace("torch.", ""), epilogue,
        torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()


@pytest.mark.gpu
@pytest.mark.parametrize("name", EMULATED)
def test_gpu_rung_writes_only_inside_c(gpu_builds, name):
    m, n, k = 300, 328, 200
    dt = torch.float16
    a = torch.randn(m, k + 24, device="cuda", dtype=dt)[:, :k]
    b = torch.randn(k, n + 8, device="cuda", dtype=dt)[:, :n]
    buf = poison(torch.empty(m + 100, n + 72, device="cuda", dtype=dt))
    c = buf[:m, :n]
    _gpu_call(gpu_builds[name], a, b, c)
    assert_close(c, a.float() @ b.float(), dtype=dt, what=f"rung {name} strided")
    assert torch.isnan(buf[:m, n:]).all() and torch.isnan(buf[m:]).all(), "wrote outside C"


@pytest.mark.gpu
@pytest.mark.parametrize("name", ALL_RUNGS)
def test_gpu_gemm_api_every_rung(gpu_builds, name):
    """tilefuse.cuda.gemm: B as the transposed view of an (N, K) weight (free for the K-major rungs 7-9) and
    as a row-major (K, N) tensor (free for 1-6), bias + GeLU."""
    if name not in gpu_builds:
        pytest.skip(f"rung {name} does not run on this GPU")
    m, n, k = 520, 1032, 264
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    ref = torch.nn.functional.gelu(a.float() @ w.float().t() + bias.float())
    for b in (w.t(), w.t().contiguous()):
        out = tcuda.gemm(a, b, rung=name, bias=bias, activation="gelu")
        torch.cuda.synchronize()
        assert_close(out, ref, dtype=torch.bfloat16, what=f"gemm rung {name}")


SANITIZER_SCRIPT = """
import torch, tilefuse.cuda as tc
for rung in (6, 7, 8, 9):
    for m, n, k in ((256, 512, 128), (200, 264, 136)):
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        out = tc.gemm(a, b, rung=rung, bias=bias, activation="gelu")
        torch.cuda.synchronize()
        assert torch.isfinite(out).all(), rung
# rung 9's stream-K split (plain and + bias; not with GeLU): 53 x 2 cluster-tiles, ragged on every side, which
# splits on an H200's 66 clusters (the workspace's writes and reads and the flags under memcheck)
m, n, k = 13468, 504, 4000
a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
for bias_or_none in (None, bias):
    out = tc.gemm(a, w.t(), rung=9, bias=bias_or_none)
    torch.cuda.synchronize()
    ref = a.float() @ w.float().t() + (0 if bias_or_none is None else bias.float())
    assert ((out.float() - ref).norm() / ref.norm()).item() < 1e-2, "rung 9 stream-K"
print("sanitized ok")
"""


@pytest.mark.gpu
@pytest.mark.skipif(shutil.which("compute-sanitizer") is None, reason="compute-sanitizer is not on the PATH")
def test_gpu_memcheck_clean_for_tensor_core_rungs(gpu_builds, tmp_path):
    script = tmp_path / "sanitize.py"
    script.write_text(SANITIZER_SCRIPT)
    proc = subprocess.run(["compute-sanitizer", "--tool", "memcheck", "--error-exitcode", "3",
                           "--target-processes", "all", sys.executable, str(script)], capture_output=True, text=True,
                          timeout=900, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    tail = (proc.stdout + proc.stderr)[-6000:]
    assert proc.returncode == 0 and "sanitized ok" in proc.stdout, tail
    assert "ERROR SUMMARY: 0 errors" in proc.stdout + proc.stderr, tail
