"""The fp32 (tf32 / exact) GEMM config spaces: what survives pruning, their order, that every candidate runs
correctly (interpreter: the tiling, masks, TMA and split-K paths at these block sizes; GPU: tf32 numerics),
and that they cross-compile for sm_90a with wgmma and no spills (slow, in a compile-only child)."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest
import torch

from tests.support import assert_close
from tilefuse.kernels import gemm as G
from tilefuse.kernels.gemm import configs as C

H200 = C.Part("nvidia", "sm_90", 132, C.SMEM_BY_ARCH["sm_90"])
SHAPES = {"decode": (1, 8192, 8192), "skinny": (128, 8192, 8192), "small": (1024, 1024, 1024),
          "large": (4096, 4096, 4096)}


def fp32(m, n, k, *, a_t=False, b_t=False, epilogue="plain", tma=True):
    return C.GemmProblem(m, n, k, 1, "float32", "float32", "float32", a_t, b_t, tma, epilogue)


@pytest.mark.parametrize("cls", list(SHAPES))
def test_tf32_space_has_real_choices(cls):
    prob = fp32(*SHAPES[cls])
    assert prob.shape_class() == cls
    cands = C.candidates(prob, H200, precision="tf32")
    assert C.SAFE_CONFIG not in cands
    assert len(cands) >= 4, [c.label() for c in cands]
    for cfg in cands:
        assert C.smem_estimate(cfg, prob) <= H200.smem_bytes
        assert cfg.block_k * 4 <= 512, "a 4-byte stage sized like a 2-byte one"
    if cls == "large":
        # the 2-byte space kept one config here (T64x64x32, 0.14x cuBLAS in three suites,
        # docs/decisions/012-gemm-config-space.md)
        assert len(cands) == 11
        assert any(c.block_m * c.block_n >= 128 * 256 for c in cands)
        assert any(c.kernel == "persistent" and c.tma for c in cands)


def test_tf32_order_follows_the_layout():
    nn = C.candidates(fp32(4096, 4096, 4096), H200, precision="tf32")
    nt = C.candidates(fp32(4096, 4096, 4096, b_t=True), H200, precision="tf32")
    tn = C.candidates(fp32(4096, 4096, 4096, a_t=True), H200, precision="tf32")
    # N-major B (or M-major A): the pointer kernels first (their cp.async transposes B for tf32 wgmma)
    for cands in (nn, tn):
        first_tma = next(i for i, c in enumerate(cands) if c.tma)
        assert not any(c.tma for c in cands[:first_tma]) and all(c.tma for c in cands[first_tma:])
    assert nt[0].tma and nt[-1].tma is False
    # warp specialisation only for K-major operands (an N-major tf32 B fails to compile in triton 3.6)
    assert any(c.warp_specialize for c in nt)
    assert not any(c.warp_specialize for c in nn + tn)
    assert set(nn) <= set(nt)


def test_no_warp_specialisation_for_an_n_major_8_bit_b():
    """Triton 3.6 fails to compile the warp-specialised persistent kernel for an N-major fp8 or int8 B on
    sm_90a (PassManager, ConvertNVGPUToLLVM; the tuner hit it on the H200,
    docs/decisions/018-gemm-k-major-copy.md), as for tf32: offered K-major only."""
    for dtype in ("float8_e4m3fn", "int8"):
        out = "int32" if dtype == "int8" else "bfloat16"
        for shape in ((4096, 4096, 4096), (256, 4096, 4096)):
            nn = C.GemmProblem(*shape, 1, dtype, dtype, out, False, False, True, "plain")
            nt = C.GemmProblem(*shape, 1, dtype, dtype, out, False, True, True, "plain")
            assert not any(c.warp_specialize for c in C.candidates(nn, H200)), (dtype, shape)
            assert any(c.warp_specialize for c in C.candidates(nt, H200)), (dtype, shape)


def test_exact_fp32_keeps_fma_sized_tiles():
    for cls, shape in SHAPES.items():
        for a_t, b_t in ((False, False), (False, True), (True, False)):
            prob = fp32(*shape, a_t=a_t, b_t=b_t)
            cands = C.candidates(prob, H200, precision="ieee")
            assert cands and C.SAFE_CONFIG not in cands, (cls, a_t, b_t)
            for cfg in cands:
                assert C.fma_fits(cfg, prob), cfg.label()
                assert not (cfg.tma and (a_t or b_t))
    assert C.default_config(fp32(4096, 4096, 4096), H200, precision="ieee") == \
        C.GemmConfig("tiled", 128, 128, 32, num_warps=8, num_stages=4)
    # without an explicit precision, torch's setting decides (as at launch)
    saved = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = True
        assert C.fp32_precision(H200) == "tf32"
        assert len(C.candidates(fp32(4096, 4096, 4096), H200)) == 11
        torch.backends.cuda.matmul.allow_tf32 = False
        assert C.fp32_precision(H200) == "ieee"
        assert C.candidates(fp32(4096, 4096, 4096), H200) == C.candidates(fp32(4096, 4096, 4096), H200,
                                                                           precision="ieee")
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved
    assert C.fp32_precision(C.PART_BY_TARGET["gfx942"]) == "ieee"


@pytest.mark.parametrize("target", ["gfx90a", "gfx942", "gfx950", "sm_80"])
def test_fp32_spaces_fit_other_parts(target):
    part = C.PART_BY_TARGET[target]
    for shape in SHAPES.values():
        prob = fp32(*shape)
        cands = C.candidates(prob, part, precision="tf32")
        assert cands and C.SAFE_CONFIG not in cands, (target, shape)
        for cfg in cands:
            assert C.smem_estimate(cfg, prob) <= part.smem_bytes
            if part.vendor == "amd":
                assert cfg.kpack == 1 and cfg.num_stages == 2 and not cfg.tma


def test_two_byte_spaces_unchanged():
    bf16 = C.GemmProblem(4096, 4096, 4096, 1, "bfloat16", "bfloat16", "bfloat16", False, False, True, "plain")
    assert C.space_of(bf16, H200) is C.NVIDIA_SPACE["large"]
    assert C.default_config(bf16, H200) == C.NVIDIA_SPACE["large"][0]


def _interpreter_cases():
    """Each distinct fp32 candidate (tf32 and exact, every class, NN and NT), on a small problem that still
    spans several tiles (and K steps), so masks, split-K and the persistent loop all run."""
    seen = {}
    for cls, shape in SHAPES.items():
        for precision in ("tf32", "ieee"):
            for b_t in (False, True):
                for cfg in C.candidates(fp32(*shape, b_t=b_t), H200, precision=precision):
                    key = (cfg, b_t)
                    if key not in seen:
                        seen[key] = pytest.param(cfg, b_t, id=f"{cfg.label()}-{'NT' if b_t else 'NN'}")
    return list(seen.values())


@pytest.mark.parametrize("cfg,b_t", _interpreter_cases())
def test_every_fp32_candidate_is_correct_on_the_interpreter(cfg, b_t):
    m = min(cfg.block_m + 3, 70) if cfg.block_m <= 16 else cfg.block_m + 5
    n, k = cfg.block_n + 9, 2 * cfg.block_k * max(1, cfg.split_k) + 7
    a = torch.randn(m, k)
    b = torch.randn(n, k).t() if b_t else torch.randn(k, n)
    bias = torch.randn(n)
    res = G.gemm_raw(a, b, bias=bias, activation="gelu", config=cfg)
    ref = torch.nn.functional.gelu(a.double() @ b.double() + bias.double())
    assert_close(res.out[0], ref, torch.float32, what=cfg.label())


_COMPILE_CHILD = r"""
import json, sys
from tilefuse import targets
from tilefuse.kernels.gemm import configs as C, targets as gemm_targets
rows = []
for b_t in (False, True):
    prob = C.GemmProblem(4096, 4096, 4096, 1, "float32", "float32", "float32", False, b_t, True, "plain")
    for cfg in C.candidates(prob, C.PART_BY_TARGET["sm_90a"], precision="tf32"):
        fn, ex = gemm_targets.example_for(cfg, "sm_90a", a="fp32", out="fp32", b_t=b_t,
                                          epilogue={"INPUT_PRECISION": "tf32"})
        r = targets.compile_example(targets.KernelSpec("gemm_" + cfg.kernel, "gemm", fn, lambda t: [ex]), ex, "sm_90a")
        rows.append({"label": cfg.label(), "b_t": b_t, "ok": r.ok, "error": r.error, "mma": r.mma,
                     "spills": r.spills, "shared": r.shared_bytes, "estimate": C.smem_estimate(cfg, prob)})
print(json.dumps(rows))
"""


def _compile_child(code: str) -> list[dict]:
    """Run ``code`` in a child off the interpreter (cross-compiling needs the real JIT) and return the JSON
    rows it prints last."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TILEFUSE_INTERPRET"] = "0"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_tf32_large_candidates_cross_compile_for_sm90a():
    """wgmma (tf32), no spills, and shared memory within the part and the estimate pruning relies on."""
    rows = _compile_child(_COMPILE_CHILD)
    assert len(rows) == 23  # 11 candidates with an N-major B, 12 with a K-major one (warp-specialised too)
    for r in rows:
        assert r["ok"] and r["mma"] == "wgmma", r
        assert (r["spills"] or 0) <= 8, r  # 8 B: the stack frame every kernel of this family has
        assert r["shared"] <= H200.smem_bytes and r["shared"] <= r["estimate"], r


_CLUSTER_CHILD = r"""
import json, re, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from tilefuse import targets
from tilefuse.kernels.gemm import configs as C, targets as gemm_targets
rows = []
for label in ("P128x256x64-w8-s3-tma-flat", "T128x256x64-w8-s3-tma"):
    cfg = next(c for cls in C.NVIDIA_SPACE.values() for c in cls if c.label() == label)
    fn, ex = gemm_targets.example_for(cfg, "sm_90a")
    for ctas in (1, 2):
        src = ASTSource(fn, ex.signature, constexprs=ex.constexprs, attrs=targets._attrs_for(fn, ex))
        k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={**ex.options, "num_ctas": ctas})
        ptx = k.asm["ptx"]
        rows.append({"label": label, "ctas": ctas, "shared": k.metadata.shared,
                     "multicast": len(re.findall(r"multicast::cluster", ptx)), "tma": ptx.count("cp.async.bulk.tensor")})
print(json.dumps(rows))
"""


@pytest.mark.slow
def test_triton_clusters_do_not_multicast():
    """Why the README's 1024³–4096³ rows trail cuBLAS by 1–3 %: triton 3.6 compiles num_ctas=2 into a cluster that
    splits the tile (less shared memory a CTA) with no multicast TMA load, where cuBLAS multicasts one
    operand across a 2-CTA cluster. If a Triton upgrade makes this fail, clustered configs are worth a sweep."""
    rows = _compile_child(_CLUSTER_CHILD)
    for one, two in zip(rows[::2], rows[1::2]):
        assert one["ctas"] == 1 and two["ctas"] == 2 and one["tma"] > 0 and two["tma"] > 0, (one, two)
        assert one["multicast"] == 0 and two["multicast"] == 0, two
        assert two["shared"] < one["shared"], (one, two)  # the tile split between the cluster's CTAs


# ------------------------------------------------------------------------- tf32: operands copied K-major
def _dev(vendor="nvidia", arch="sm_90", interpreter=False):
    from tilefuse import device
    return device.Device(vendor, "test part", arch, 132, 32 if vendor == "nvidia" else 64, interpreter, "cuda")


def test_k_major_copies_an_n_major_b_and_an_m_major_a_on_hopper_only():
    from tilefuse.kernels.gemm.plan import K_MAJOR_MIN as MIN, k_major_copies

    m = n = k = MIN
    a, a_t = torch.empty(m, k), torch.empty(k, m).t()
    b, b_t = torch.empty(k, n), torch.empty(n, k).t()
    hopper = _dev()
    assert k_major_copies(a, b, hopper) == (False, True)  # the plain A @ B: B is N-major
    assert k_major_copies(a, b_t, hopper) == (False, False)  # nn.Linear's weight.T is K-major already
    assert k_major_copies(a_t, b_t, hopper) == (True, False)
    assert k_major_copies(a_t, b, hopper) == (True, True)
    # batched, and one batch of a broadcast operand (a copy would materialise every repeat)
    assert k_major_copies(torch.empty(3, m, k), torch.empty(3, k, n), hopper) == (False, True)
    assert k_major_copies(a, torch.empty(k, n).expand(3, k, n), hopper) == (False, False)
    # below the size where the copy pays: rows for B, columns for A
    assert k_major_copies(torch.empty(MIN - 1, k), b, hopper) == (False, False)
    assert k_major_copies(a_t, torch.empty(MIN - 1, k).t(), hopper) == (False, False)
    # elsewhere the kernels read the operands as they are
    for other in (_dev(arch="sm_80"), _dev(arch="sm_100a"), _dev("amd", "gfx942"), _dev(interpreter=True),
                  _dev("cpu", "cpu", True)):
        assert k_major_copies(a_t, b, other) == (False, False), other


def test_wgmma_copies_only_on_a_gpu_and_for_the_k_major_only_dtypes():
    from tilefuse.kernels.gemm.plan import K_MAJOR_DTYPES, wgmma_copies

    assert torch.float16 not in K_MAJOR_DTYPES and torch.bfloat16 not in K_MAJOR_DTYPES  # wgmma transposes these
    saved = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = True
        for dtype in (torch.float32, torch.float16):
            a, b = torch.randn(600, 70).to(dtype), torch.randn(70, 600).to(dtype)
            assert wgmma_copies(a, b) == (False, False)  # CPU tensors (the interpreter): read as they are
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved


@pytest.mark.parametrize("dtype", [torch.float32, torch.int8])
@pytest.mark.parametrize("shape", [(70, 131), (3, 65, 129), (1, 1)])
def test_relayout_copies_both_ways(shape, dtype):
    """The transposing copy behind wgmma_copies, on the interpreter: ragged tiles, batched, both directions
    (row-major into column-major and back), the output poisoned first."""
    from tilefuse.kernels.gemm.plan import relayout

    x = torch.randn(shape).to(dtype) if dtype.is_floating_point else torch.randint(-100, 100, shape, dtype=dtype)
    poison = float("nan") if dtype.is_floating_point else -128
    col = torch.full(shape[:-2] + shape[::-1][:2], poison, dtype=dtype).mT  # same shape, column-major
    assert relayout(x, col) is col and col.stride(-2) == 1
    assert torch.equal(col, x)
    back = torch.full(shape, poison, dtype=dtype)
    relayout(col, back)
    assert torch.equal(back, x)
    with pytest.raises(ValueError, match="same 2-D or 3-D shape"):
        relayout(x, torch.empty(shape[:-1] + (shape[-1] + 1,)))


# ------------------------------------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["nn", "nt"])
@pytest.mark.parametrize("cls", list(SHAPES))
def test_every_tf32_candidate_is_correct_on_the_gpu(cls, layout):
    from tests.support import TF32_TOLERANCE, TOLERANCE
    from tilefuse.kernels.gemm import tuning as T

    m, n, k = {"decode": (16, 4096, 4096), "skinny": (128, 4096, 4096), "small": (1024, 1024, 1024),
               "large": (4096, 4096, 1024)}[cls]
    a = torch.randn(m, k, device="cuda")
    b = torch.randn(n, k, device="cuda").t() if layout == "nt" else torch.randn(k, n, device="cuda")
    ref = a.double() @ b.double()
    saved = torch.backends.cuda.matmul.allow_tf32
    try:
        for precision in ("tf32", "ieee"):
            torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
            ops = G.prepare(a, b)
            assert ops.problem.shape_class() == cls
            cfgs = C.candidates(ops.problem, precision=precision)
            failed = T.compile_all(ops, cfgs)
            assert not failed, failed
            for cfg in cfgs:
                out = torch.full((m, n), float("nan"), device="cuda")
                G.launch(G.prepare(a, b, out=out), cfg)  # no fallback: a config that cannot launch fails here
                tol = TF32_TOLERANCE if precision == "tf32" else TOLERANCE[torch.float32]
                assert_close(out, ref, torch.float32, tol=tol, what=f"{precision} {cfg.label()}")
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved


@pytest.mark.gpu
def test_wgmma_k_major_copies_are_right_and_taken():
    """Ragged sizes past K_MAJOR_MIN with an N-major B and an M-major A: the call copies them K-major
    (k_major_copies says so) and the result matches float64 within tf32's tolerance, output poisoned first, on
    the first call and on a repeat (the copy's kept launch site, the GEMM's plan)."""
    from tests.support import TF32_TOLERANCE
    from tilefuse import device
    from tilefuse.kernels.gemm import plan as gemm_plan
    from tilefuse.kernels.gemm.plan import k_major_copies
    import tilefuse

    m, n, k = 1037, 777, 523
    saved = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = True
        for a, b in ((torch.randn(m, k, device="cuda"), torch.randn(k, n, device="cuda")),
                     (torch.randn(k, m, device="cuda").t(), torch.randn(k, n, device="cuda")),
                     (torch.randn(2, k, m, device="cuda").mT, torch.randn(2, k, n, device="cuda"))):
            if device.current().capability[0] == 9:
                assert any(k_major_copies(a, b, device.current()))
            for call in ("first (JIT launches)", "repeat (kept launchers)"):
                out = torch.full(a.shape[:-2] + (m, n), float("nan"), device="cuda")
                tilefuse.gemm(a, b, out=out)
                assert_close(out, a.double() @ b.double(), torch.float32, tol=TF32_TOLERANCE,
                             what=f"tf32 K-major copy, {call}")
        # bad input raises before the copy would launch
        sites = len(gemm_plan._relayout_sites)
        with pytest.raises(ValueError, match="K"):
            tilefuse.gemm(torch.randn(m + 1, k, device="cuda"), torch.randn(k + 1, n, device="cuda"))
        assert len(gemm_plan._relayout_sites) == sites
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved


@pytest.mark.gpu
def test_wgmma_k_major_copies_of_8_bit_operands():
    """fp8 (per-row / per-column scales) and int8 with an N-major B past K_MAJOR_MIN: copied K-major on sm_90,
    right on the first call and on the plan's repeat (int8 exactly)."""
    from tests.support import TOLERANCE
    from tilefuse import device
    from tilefuse.kernels.gemm.plan import wgmma_copies
    import tilefuse

    m, n, k = 1037, 776, 528
    a8 = torch.randint(-8, 8, (m, k), device="cuda", dtype=torch.int8)
    b8 = torch.randint(-8, 8, (k, n), device="cuda", dtype=torch.int8)
    af = (torch.randn(m, k, device="cuda") * 2).to(torch.float8_e4m3fn)
    bf = (torch.randn(k, n, device="cuda") * 2).to(torch.float8_e4m3fn)
    sa, sb = torch.rand(m, 1, device="cuda") + 0.5, torch.rand(1, n, device="cuda") + 0.5
    if device.current().capability[0] == 9:
        assert wgmma_copies(a8, b8) == (False, True) and wgmma_copies(af, bf) == (False, True)
    ref8 = (a8.double() @ b8.double())
    reff = (af.double() * sa.double()) @ (bf.double() * sb.double())
    for call in ("first", "repeat"):
        out = torch.full((m, n), -1, device="cuda", dtype=torch.int32)
        tilefuse.gemm(a8, b8, out=out)
        assert torch.equal(out.double(), ref8), call
        got = tilefuse.gemm(af, bf, scale_a=sa, scale_b=sb, out_dtype=torch.float32)
        assert_close(got, reff, torch.float32, tol=TOLERANCE[torch.bfloat16], what=f"fp8 K-major copy, {call}")


# ------------------------------------------------------------------------------------ b_stream (decode)
def test_b_stream_configs_only_where_the_hint_survives():
    """The evict-first hint reaches the hardware only from triton 3.6's loads into registers: b_stream
    configs are offered on NVIDIA parts as the tiled pointer kernel at one stage with 16-row tiles, never
    on AMD."""
    prob = C.GemmProblem(16, 8192, 8192, 1, "bfloat16", "bfloat16", "bfloat16", False, True, True, "plain")
    streamed = [c for c in C.candidates(prob, H200) if c.b_stream]
    assert streamed, "the decode class offers no b_stream config"
    for c in streamed:
        assert c.kernel == "tiled" and not c.tma and c.num_stages == 1 and c.label().endswith("-bs")
        assert c.split_k >= 1
    assert not any(c.b_stream for c in C.candidates(prob, C.PART_BY_TARGET["gfx942"]))
    # only the decode class holds them (a b_stream entry elsewhere would be pruned: dead data)
    assert {cls for cls, cfgs in C.NVIDIA_SPACE.items() if any(c.b_stream for c in cfgs)} == {"decode"}
    # 64-row tiles and more lost to the pipelined configs on the H200
    # (docs/decisions/013-gemm-decode-and-skinny-tiles.md): not offered from M = 17 on
    for m in (17, 64, 128, 256):
        wide = C.GemmProblem(m, 8192, 8192, 1, "bfloat16", "bfloat16", "bfloat16", False, True, True, "plain")
        assert not any(c.b_stream for c in C.candidates(wide, H200)), m
    pipelined = C.GemmConfig("tiled", 16, 64, 128, num_stages=3, b_stream=True)
    assert not C.b_stream_possible(pipelined, H200)
    assert not C.b_stream_possible(C.GemmConfig("tiled", 16, 64, 128, num_stages=1, tma=True, b_stream=True), H200)


def test_b_stream_split_counts_register_limited_programs():
    # 16x64x128 at 4 warps: ~160 registers a thread -> 3 programs an SM, so 128 column tiles split 3 ways fill
    # one wave of 396; at 8 warps and 64x256 one program an SM, so no split
    prob = C.GemmProblem(1, 8192, 8192, 1, "bfloat16", "bfloat16", "bfloat16", False, False, True, "plain")
    small = C.GemmConfig("tiled", 16, 64, 128, num_warps=4, num_stages=1, split_k=C.AUTO_SPLIT, b_stream=True)
    wide = C.GemmConfig("tiled", 16, 64, 256, num_warps=8, num_stages=1, split_k=C.AUTO_SPLIT, b_stream=True)
    assert C.b_stream_ctas_per_sm(small, prob) == 3 and C.fill_split_k(small, prob, H200).split_k == 3
    assert C.b_stream_ctas_per_sm(wide, prob) == 1 and C.fill_split_k(wide, prob, H200).split_k == 1


_HINT_CHILD = r"""
import json
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from tilefuse import targets
from tilefuse.kernels.gemm import targets as gemm_targets
spec = targets.kernels()["gemm_decode_stream"]
ex = spec.examples("sm_90a")[0]
out = {}
for stream in (True, False):
    consts = dict(ex.constexprs, B_STREAM=stream)
    src = ASTSource(spec.fn, ex.signature, constexprs=consts, attrs=targets._attrs_for(spec.fn, ex))
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(ex.options)).asm["ptx"]
    out[str(stream)] = {"hinted_loads": sum("ld.global" in l and "L2::cache_hint" in l for l in ptx.splitlines()),
                        "evict_first_policy": "createpolicy.fractional.L2::evict_first" in ptx}
res = targets.compile_example(spec, ex, "sm_90a")
out["resources"] = {"ok": res.ok, "mma": res.mma, "spills": res.spills, "registers": res.registers}
print(json.dumps(out))
"""


@pytest.mark.slow
def test_b_stream_loads_carry_the_l2_evict_first_hint_on_sm90a():
    """What b_stream claims, read from the PTX: B's loads are ld.global with an L2 cache-hint operand made by
    createpolicy evict_first; the same kernel without B_STREAM has neither (a triton that drops the hint
    from loads into registers too fails here)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TILEFUSE_INTERPRET"] = "0"
    proc = subprocess.run([sys.executable, "-c", _HINT_CHILD], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["True"]["evict_first_policy"] and got["True"]["hinted_loads"] >= 1, got
    assert not got["False"]["evict_first_policy"] and got["False"]["hinted_loads"] == 0, got
    # the example is the decode class's b_stream config: mma.sync on 16-row tiles, and nothing spilled
    assert got["resources"]["ok"] and got["resources"]["mma"] == "mma.sync" and got["resources"]["spills"] == 0, got


# ------------------------------------------------------------------ flattened persistent loops (FLATTEN_NOTE)
def test_flattened_configs_only_where_offered():
    """``flatten`` configs reach the candidates only as NVIDIA persistent kernels without warp
    specialisation or a stream-K tail; a flattened form of anything else is pruned, and AMD gets none."""
    offered = []
    for m, n, k in ((4096, 4096, 4096), (256, 8192, 8192), (16384, 8192, 28672), (8192, 8192, 1024)):
        prob = C.GemmProblem(m, n, k, 1, "bfloat16", "bfloat16", "bfloat16", False, True, True, "plain")
        flat = [c for c in C.candidates(prob, H200) if c.flatten]
        offered += flat
        for c in flat:
            assert c.kernel == "persistent" and not c.warp_specialize and not c.stream_k and "-flat" in c.label()
        assert not any(c.flatten for c in C.candidates(prob, C.PART_BY_TARGET["gfx942"]))
    assert offered, "no flattened config offered for the large and skinny shapes"
    space = (C.NVIDIA_SPACE["large"][0],)
    for bad in (C.GemmConfig("tiled", 128, 128, 64, flatten=True),
                C.GemmConfig("persistent", 128, 256, 64, num_warps=4, tma=True, warp_specialize=True, flatten=True),
                C.GemmConfig("persistent", 128, 256, 64, num_warps=8, tma=True, stream_k=True, flatten=True)):
        prob = C.GemmProblem(16384, 8192, 28672, 1, "bfloat16", "bfloat16", "bfloat16", False, True, True, "plain")
        orig = C.space_of
        try:
            C.space_of = lambda problem, part, _bad=bad: space + (_bad,)
            assert bad not in C.candidates(prob, H200)
        finally:
            C.space_of = orig


_FLAT_CHILD = r"""
import dataclasses, json, re
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from tilefuse import targets
from tilefuse.kernels.gemm import configs as C, targets as gemm_targets

def innermost_dot_loop(ttgir):
    # the body of the innermost scf.for holding the wgmma, by brace depth
    lines = ttgir.splitlines()
    dot = next(i for i, l in enumerate(lines) if "ttng.warp_group_dot " in l)
    start = max(i for i in range(dot) if "scf.for" in lines[i])
    depth, body = 0, []
    for l in lines[start:]:
        depth += l.count("{") - l.count("}")
        body.append(l)
        if depth <= 0:
            break
    return "\n".join(body)

out = {}
flat = [c for cls in C.NVIDIA_SPACE.values() for c in cls if c.flatten]
for cfg in flat:
    for name, epi in (("plain", {}), ("bias+gelu", {"ACTIVATION": 2, "BIAS_MODE": 1})):
        for f in (True, False):
            c = dataclasses.replace(cfg, flatten=f)
            fn, ex = gemm_targets.example_for(c, "sm_90a", epilogue=epi)
            src = ASTSource(fn, ex.signature, constexprs=ex.constexprs, attrs=targets._attrs_for(fn, ex))
            compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(ex.options))
            loop = innermost_dot_loop(compiled.asm["ttgir"])
            res = targets.cubin_resources(compiled.asm["cubin"])
            out[f"{c.label()} {name}"] = {
                "store_in_dot_loop": "async_tma_copy_local_to_global" in loop or "tt.store" in loop,
                "loads_in_dot_loop": loop.count("async_tma_copy_global_to_local"),
                "spills": res.get("STACK", 0) + res.get("LOCAL", 0)}
print(json.dumps(out))
"""


@pytest.mark.slow
def test_flattened_persistent_kernel_prefetches_across_tiles_on_sm90a():
    """What ``flatten`` claims, read from the sm_90a ttgir of every flattened config in the space, plain and
    with bias + GeLU: the loop that issues the wgmma also holds the epilogue's store (one loop over every
    tile's K steps, its loads running ahead into the next tile), where the unflattened kernel's K loop ends
    before the store; and the flattened kernels spill nothing."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TILEFUSE_INTERPRET"] = "0"
    proc = subprocess.run([sys.executable, "-c", _FLAT_CHILD], capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got
    for key, r in got.items():
        if "-flat" in key:
            assert r["store_in_dot_loop"] and r["loads_in_dot_loop"] >= 2 and r["spills"] == 0, (key, r)
        else:
            assert not r["store_in_dot_loop"], (key, r)


def test_a_config_label_reads_back_as_the_config():
    every = {c for spaces in (C.SPACES, C.SPACES_4B) for space in spaces.values() for cls in space.values() for c in cls}
    every.add(C.GemmConfig("tiled", 128, 128, 64, group_m=1, split_k=2, num_warps=8, num_stages=6, tma=True))
    every = {c for c in every if c.split_k >= 1 and c.block_m >= 1}  # AUTO_SPLIT / DECODE_M are placeholders
    assert len(every) > 40
    for cfg in every:
        assert C.GemmConfig.from_label(cfg.label()) == cfg, cfg.label()
    for bad in ("T128x128x64", "X64x64x32-w4-s2", "T64x64x32-w4-s2-tma-k2", "T64x64x32-w4-s2-bogus"):
        with pytest.raises(ValueError, match="expected"):
            C.GemmConfig.from_label(bad)


def test_two_way_splits_sum_in_registers_only_with_room_for_a_second_accumulator():
    cfg = C.GemmConfig("tiled", 128, 128, 64, split_k=2, num_warps=8)  # 64 fp32 a thread
    assert C.split_in_registers(cfg)
    assert not C.split_in_registers(C.GemmConfig("tiled", 128, 128, 64, split_k=2, num_warps=4))  # 128 a thread
    assert C.split_in_registers(C.GemmConfig("tiled", 64, 128, 64, split_k=2, num_warps=4))
    assert not C.split_in_registers(C.GemmConfig("tiled", 64, 128, 64, split_k=3, num_warps=4))  # order would vary
    assert not C.split_in_registers(C.GemmConfig("tiled", 64, 128, 64, split_k=1, num_warps=4))


def test_skinny_candidates_that_need_a_second_wave_come_later():
    def first(m, n=8192):
        prob = C.GemmProblem(m, n, 8192, 1, "bfloat16", "bfloat16", "bfloat16", False, False, True, "plain")
        cands = C.candidates(prob, H200)
        assert [C.waves(c, prob, H200) for c in cands] == sorted(C.waves(c, prob, H200) for c in cands)
        return cands[0]
    # M = 128: 64x128 tiles are 128 programs, one wave: the space's first config leads
    assert first(128).label() == "T64x128x64-w4-s8-tma-ef"
    # M = 256 (and 200): 64-row tiles would be 256 programs at one a SM; the 7-stage 128x128 leads
    # (docs/decisions/013-gemm-decode-and-skinny-tiles.md)
    assert first(256).label() == first(200).label() == "T128x128x64-w4-s7-tma-ef"
    # N = 4096: 64x128 tiles are 128 programs again
    assert first(256, 4096).label() == "T64x128x64-w4-s8-tma-ef"
    assert C.waves(C.GemmConfig("tiled", 64, 128, 128, num_stages=4), C.GemmProblem(
        256, 8192, 8192, 1, "bfloat16", "bfloat16", "bfloat16", False, False, True, "plain"), H200) == 2


def test_b_evict_first_is_offered_only_where_b_loads_through_host_descriptors():
    """-ef configs (B's TMA loads evict-first, written into the PTX by ptx_hints): NVIDIA with TMA, not
    warp-specialised; elsewhere dropped, not turned into a copy of the unhinted config."""
    ef = C.GemmConfig("tiled", 64, 128, 64, num_stages=8, tma=True, b_evict_first=True)
    assert C.GemmConfig.from_label(ef.label()) == ef and ef.label().endswith("-tma-ef")
    assert C.b_evict_first_possible(ef, H200, False)
    assert not C.b_evict_first_possible(dataclasses.replace(ef, tma=False), H200, False)
    ws = C.GemmConfig("persistent", 128, 128, 64, num_stages=4, tma=True, warp_specialize=True, b_evict_first=True)
    assert not C.b_evict_first_possible(ws, H200, False)
    prob = C.GemmProblem(128, 8192, 8192, 1, "bfloat16", "bfloat16", "bfloat16", False, False, True, "plain")
    for target in ("sm_80", "gfx942", "gfx90a"):
        assert not any(c.b_evict_first for c in C.candidates(prob, C.PART_BY_TARGET[target])), target
    hopper = C.candidates(prob, H200)
    assert hopper[0].b_evict_first and dataclasses.replace(hopper[0], b_evict_first=False) == hopper[1]
    assert all(c.tma and not c.warp_specialize for c in hopper if c.b_evict_first)
    # not on a batched problem either (no host descriptors: TMA needs Z == 1)
    batched = dataclasses.replace(prob, Z=2, tma_ok=False)
    assert not any(c.b_evict_first for c in C.candidates(batched, H200))
