"""The Triton GEMM library on a GPU: bf16/fp8/int8/tf32, large and skinny shapes, every candidate config of
each shape class, the fused epilogues and quantised outputs, the tuner end to end.

Run by ``tools/gpu-run`` (``pytest -m gpu``). Tuning is off in this module (the heuristic config, or an
explicit one) except in the tuner's own test, so the whole file stays well under two minutes; the
kernels it compiles land in Triton's cache, where the benchmark run that follows finds them.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import tilefuse
from tests.support import TF32_TOLERANCE, TOLERANCE, assert_close, poisoned_empty, rel_error, transposed_copy
from tilefuse import config
from tilefuse.kernels import gemm as G
from tilefuse.kernels.gemm import configs as C
from tilefuse.kernels.gemm import plan as gemm_plan
from tilefuse.kernels.gemm import tuning as T
from tilefuse.kernels.gemm.epilogue import example_silu_plus_e0

pytestmark = pytest.mark.gpu
F = torch.nn.functional


@pytest.fixture(autouse=True)
def no_tuning():
    with config.override(autotune=False):
        yield


def ref_mm(a, b):
    return a.float() @ b.float()


def rand(*shape, dtype=torch.bfloat16):
    return torch.randn(*shape, device="cuda", dtype=torch.float32).to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(1000, 1000, 1000), (2048, 2048, 2048), (1, 4096, 4096), (128, 8192, 4096),
                                   (4096, 1024, 4096), (37, 129, 7)])
def test_default_config_large_and_skinny(dtype, shape):
    m, n, k = shape
    a, b = rand(m, k, dtype=dtype), rand(k, n, dtype=dtype)
    out = poisoned_empty(m, n, dtype=dtype, device="cuda")
    tilefuse.gemm(a, b, out=out)
    assert_close(out, ref_mm(a, b), dtype)


@pytest.mark.parametrize("shape", [(16, 4096, 4096), (128, 4096, 4096), (1024, 1024, 1024), (4096, 4096, 1024)],
                         ids=["decode", "skinny", "small", "large"])
def test_every_candidate_config_is_correct(shape):
    m, n, k = shape
    a, b = rand(m, k), rand(k, n)
    bias = rand(n)
    ops = G.prepare(a, b, bias=bias, activation="gelu")
    cfgs = C.candidates(ops.problem)
    failed = T.compile_all(ops, cfgs)
    assert not failed, failed
    assert ops.problem.shape_class() == request_class(shape)
    ref = F.gelu(ref_mm(a, b) + bias.float())
    for cfg in cfgs:
        out = poisoned_empty(m, n, dtype=torch.bfloat16, device="cuda")
        run = G.prepare(a, b, bias=bias, activation="gelu", out=out)
        G.launch(run, cfg)  # no fallback: a config that cannot launch here fails the test
        assert_close(out, ref, torch.bfloat16, what=cfg.label())


@pytest.mark.parametrize("shape", [(1000, 1234, 70), (4096, 4096, 64), (777, 3000, 4096), (256, 8192, 333),
                                   (8192, 8192, 1024)])
def test_flattened_persistent_configs_are_correct(shape):
    """Each flattened persistent config of the space (its next tile's loads issued during this tile's
    epilogue) on ragged tiles, a K of one step, a K shorter than the pipeline and several tiles a program:
    plain and with bias + GeLU, against float32, output poisoned."""
    m, n, k = shape
    a, b = rand(m, k), rand(k, n)
    bias = rand(n)
    flat = [c for cls in C.NVIDIA_SPACE.values() for c in cls if c.flatten]
    assert flat
    for cfg in flat:
        for act in (None, "gelu"):
            out = poisoned_empty(m, n, dtype=torch.bfloat16, device="cuda")
            run = G.prepare(a, b, bias=bias if act else None, activation=act, out=out)
            G.launch(run, cfg)
            ref = ref_mm(a, b)
            ref = F.gelu(ref + bias.float()) if act else ref
            assert_close(out, ref, torch.bfloat16, what=f"{cfg.label()} {act} {shape}")


def request_class(shape):
    return {16: "decode", 128: "skinny", 1024: "small", 4096: "large"}[shape[0]]


@pytest.mark.parametrize("layout", ["nt", "tn", "tt"])
def test_layouts_tma_and_pointer_paths(layout):
    m, n, k = 512, 768, 640
    a, b = rand(m, k), rand(k, n)
    if layout[0] == "t":
        a = transposed_copy(a)
    if layout[1] == "t":
        b = transposed_copy(b)
    ref = ref_mm(a, b)
    for cfg in (C.GemmConfig("persistent", 128, 256, 64, num_warps=8, num_stages=3, tma=True),
                C.GemmConfig("tiled", 128, 128, 64, num_warps=4, num_stages=4, split_k=2, tma=True),
                C.GemmConfig("tiled", 128, 128, 64, num_warps=8, num_stages=3)):
        assert_close(G.gemm_raw(a, b, config=cfg).out[0], ref, torch.bfloat16, what=f"{layout} {cfg.label()}")


def test_fused_epilogues_and_hook():
    m, n, k = 1024, 1536, 512
    a, b, bias, res, e0 = rand(m, k), rand(k, n), rand(n), rand(m, n), rand(m, n)
    x = ref_mm(a, b)
    for act, fn in (("gelu", F.gelu), ("gelu_tanh", lambda t: F.gelu(t, approximate="tanh")), ("silu", F.silu),
                    ("relu", torch.relu), ("sigmoid", torch.sigmoid), ("tanh", torch.tanh)):
        got = tilefuse.gemm(a, b, bias=bias, activation=act, residual=res, alpha=0.5, beta=2.0)
        assert_close(got, fn(0.5 * x + bias.float()) + 2.0 * res.float(), torch.bfloat16, what=act)
    got = G.gemm_with_epilogue(a, b, example_silu_plus_e0, [e0], torch.float32)
    assert_close(got, F.silu(x) + e0.float(), torch.bfloat16)


DIRECT = C.GemmConfig("tiled", 64, 256, 64, num_warps=8, num_stages=3)  # whole rows in one tile


@pytest.mark.parametrize("quantize", ["fp8_e4m3", "int8"])
@pytest.mark.parametrize("shape,cfg", [((512, 4096, 1024), None), ((64, 256, 512), DIRECT)], ids=["two_pass", "direct"])
def test_quantised_output(quantize, shape, cfg):
    m, n, k = shape
    a, b, bias = rand(m, k), rand(k, n), rand(n)
    q, s = G.gemm_with_epilogue(a, b, None, (), None, bias=bias, activation="gelu", quantize=quantize, config=cfg)
    y = F.gelu(ref_mm(a, b) + bias.float())
    qmax = 127.0 if q.dtype == torch.int8 else 448.0
    ref_s = y.abs().amax(1, keepdim=True) / qmax
    assert_close(s, ref_s, torch.float32, tol=1e-2)
    tol = 1e-2 if q.dtype == torch.int8 else TOLERANCE[torch.float8_e4m3fn]
    assert_close(q.float() * s, y, q.dtype, tol=tol)


def test_fp8_rowwise_matches_scaled_mm():
    m, n, k = 1024, 2048, 1024
    a = rand(m, k, dtype=torch.float32).to(torch.float8_e4m3fn)
    b = rand(n, k, dtype=torch.float32).to(torch.float8_e4m3fn).t()
    sa = torch.rand(m, 1, device="cuda") * 0.1 + 0.01
    sb = torch.rand(1, n, device="cuda") * 0.1 + 0.01
    ref = (a.float() * sa) @ (b.float() * sb)
    out = poisoned_empty(m, n, dtype=torch.bfloat16, device="cuda")
    tilefuse.gemm(a, b, scale_a=sa, scale_b=sb, out=out)
    assert_close(out, ref, torch.bfloat16)
    peer = torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
    assert rel_error(out, peer) < 1e-2
    one = torch.tensor(0.5, device="cuda")
    assert_close(tilefuse.gemm(a, b, scale_a=one, scale_b=one), (a.float() @ b.float()) * 0.25, torch.bfloat16)


def test_int8_exact_and_scaled():
    a = torch.randint(-128, 128, (1024, 2048), device="cuda", dtype=torch.int8)
    b = torch.randint(-128, 128, (1536, 2048), device="cuda", dtype=torch.int8).t()
    exact = (a.double() @ b.double())
    out = poisoned_empty(1024, 1536, dtype=torch.int32, device="cuda")
    tilefuse.gemm(a, b, out=out)
    assert torch.equal(out.double(), exact)
    assert torch.equal(tilefuse.gemm(a, b), torch._int_mm(a, b))
    sa, sb = torch.rand(1024, 1, device="cuda"), torch.rand(1, 1536, device="cuda")
    assert_close(tilefuse.gemm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.float32), exact * sa * sb, torch.float32)


def test_tf32_follows_torch_setting():
    a, b = rand(1024, 1024, dtype=torch.float32), rand(1024, 1024, dtype=torch.float32)
    ref = a.double() @ b.double()
    saved = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        assert_close(tilefuse.gemm(a, b), ref, torch.float32)
        torch.backends.cuda.matmul.allow_tf32 = True
        err = assert_close(tilefuse.gemm(a, b), ref, torch.float32, tol=TF32_TOLERANCE)
        assert err > TOLERANCE[torch.float32], "allow_tf32=True should use tf32 tensor cores"
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved


def test_batched_and_linear_and_autograd():
    a, b = rand(4, 256, 512), rand(512, 384)
    assert_close(tilefuse.gemm(a, b), torch.matmul(a.float(), b.float()), torch.bfloat16)
    b3 = rand(4, 512, 384)
    assert_close(tilefuse.gemm(a, b3), torch.matmul(a.float(), b3.float()), torch.bfloat16)
    lin = tilefuse.nn.Linear(512, 384, device="cuda", dtype=torch.bfloat16, activation="gelu")
    ref_lin = torch.nn.Linear(512, 384, device="cuda", dtype=torch.float32)
    ref_lin.load_state_dict({k: v.float() for k, v in lin.state_dict().items()})
    x = rand(2, 100, 512).requires_grad_()
    y = lin(x)
    assert_close(y, F.gelu(ref_lin(x.float())).detach(), torch.bfloat16)
    y.float().square().sum().backward()
    x2 = x.detach().float().requires_grad_()
    F.gelu(ref_lin(x2)).square().sum().backward()
    assert_close(x.grad, x2.grad, torch.bfloat16, tol=3e-2)
    assert_close(lin.weight.grad, ref_lin.weight.grad, torch.bfloat16, tol=3e-2)


def test_split_k_counters_reset_across_launches_and_streams():
    a, b = rand(16, 4096), rand(4096, 2048)
    ref = ref_mm(a, b)
    cfg = C.GemmConfig("tiled", 16, 64, 128, group_m=1, split_k=8, num_warps=4, num_stages=4)
    side = torch.cuda.Stream()
    for _ in range(3):
        assert_close(G.gemm_raw(a, b, config=cfg).out[0], ref, torch.bfloat16)
        with torch.cuda.stream(side):
            out = G.gemm_raw(a, b, config=cfg).out[0]
        side.synchronize()
        assert_close(out, ref, torch.bfloat16)


@pytest.mark.parametrize("cfg", [C.GemmConfig("tiled", 128, 128, 64, num_warps=8, num_stages=6, split_k=2, tma=True),
                                 C.GemmConfig("tiled", 64, 128, 128, num_warps=4, num_stages=4, split_k=2)],
                         ids=lambda c: c.label())
def test_two_way_split_in_registers_matches_the_strip_path(monkeypatch, cfg):
    """The register fix-up of a 2-way split gives the strip path's bits, with an epilogue, on a ragged shape,
    launch after launch (the counters go back to zero)."""
    assert C.split_in_registers(cfg)
    a, b, bias = rand(200, 4000), rand(4000, 1000), rand(1000)
    ref = F.gelu(ref_mm(a, b) + bias.float())
    outs = []
    for _ in range(3):
        out = G.gemm_raw(a, b, bias=bias, activation="gelu", config=cfg).out[0]
        assert_close(out, ref, torch.bfloat16, what=cfg.label())
        outs.append(out.clone())
    monkeypatch.setattr(C, "SPLIT_REG_ACC", 0)
    gemm_plan.forget_plans()
    strips = G.gemm_raw(a, b, bias=bias, activation="gelu", config=cfg).out[0]
    assert all(torch.equal(o, strips) for o in outs)


def test_tuner_end_to_end(tmp_cache):
    T.forget()
    a, b = rand(256, 2048), rand(2048, 2048)
    with config.override(autotune=True):
        out = tilefuse.gemm(a, b, activation="relu")
    assert_close(out, torch.relu(ref_mm(a, b)), torch.bfloat16)
    ops = G.prepare(a, b, activation="relu")
    winner = T.stored(ops.problem)
    assert winner is not None
    entry = json.loads(T._path(T.key_of(ops.problem)).read_text())
    assert len([r for r in entry["ranking"] if r["ms"] is not None]) >= 2
    code = ("import torch; from tilefuse.kernels import gemm as G; from tilefuse.kernels.gemm import tuning as T;"
            "a=torch.randn(256, 2048, device='cuda', dtype=torch.bfloat16); b=torch.randn(2048, 2048, device='cuda', dtype=torch.bfloat16);"
            "print(T.stored(G.prepare(a, b, activation='relu').problem).label())")
    env = dict(os.environ, TILEFUSE_CACHE_DIR=str(tmp_cache))
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert got.stdout.strip().splitlines()[-1] == winner.label()
    T.forget()


STREAM_K_CONFIGS = [
    C.GemmConfig("persistent", 128, 256, 64, num_warps=8, num_stages=3, tma=True, stream_k=True),
    C.GemmConfig("persistent", 128, 256, 64, num_warps=8, num_stages=4, tma=True, epi_subtile=2, stream_k=True),
    C.GemmConfig("persistent", 128, 128, 64, num_warps=8, num_stages=3, stream_k=True),  # pointer loads
]


@pytest.mark.parametrize("cfg", STREAM_K_CONFIGS, ids=lambda c: c.label())
@pytest.mark.parametrize("shape", [(4096, 4096, 1024), (256, 8192, 2048), (1000, 3000, 1000), (129, 1000, 777)],
                         ids=["rounds+tail", "tail-only", "odd", "odd-K"])
def test_stream_k_tail(cfg, shape):
    from tilefuse.kernels.launcher import stream_buffer

    m, n, k = shape
    tiles = -(-m // cfg.block_m) * -(-n // cfg.block_n)
    assert tiles % torch.cuda.get_device_properties(0).multi_processor_count, "no tail to deal out"
    a, b, bias, res = rand(m, k), rand(k, n), rand(n), rand(m, n)
    ref = F.gelu(ref_mm(a, b) + bias.float()) + res.float()
    out = poisoned_empty(m, n, dtype=torch.bfloat16, device="cuda")
    G.launch(G.prepare(a, b, bias=bias, activation="gelu", residual=res, out=out), cfg)
    assert_close(out, ref, torch.bfloat16, what=cfg.label())
    again = poisoned_empty(m, n, dtype=torch.bfloat16, device="cuda")
    G.launch(G.prepare(a, b, bias=bias, activation="gelu", residual=res, out=again), cfg)
    assert torch.equal(out, again), "the tail's reduction is not deterministic"
    lock = stream_buffer("lock", a.device, torch.cuda.current_stream().cuda_stream, 1, torch.int32)
    assert int(lock.abs().sum()) == 0, "a tail tile's counter was left non-zero"


def test_stream_k_int8_and_quantised():
    cfg = C.GemmConfig("persistent", 128, 256, 128, num_warps=8, num_stages=3, tma=True, epi_subtile=2,
                       stream_k=True)  # int32 out: the column halves keep the TMA store buffer at 64 KB
    a = torch.randint(-128, 128, (1024, 4096), device="cuda", dtype=torch.int8)
    b = torch.randint(-128, 128, (3072, 4096), device="cuda", dtype=torch.int8).t()  # 96 tiles: tail only
    out = poisoned_empty(1024, 3072, dtype=torch.int32, device="cuda")
    G.launch(G.prepare(a, b, out=out), cfg)
    assert torch.equal(out, torch._int_mm(a, b))
    sub2 = C.GemmConfig("persistent", 128, 256, 64, num_warps=8, num_stages=4, tma=True, epi_subtile=2, stream_k=True)
    x, w, bias = rand(2048, 1024), rand(1024, 4096), rand(4096)  # 256 tiles: 1 round + a tail of 124
    q, s = G.gemm_with_epilogue(x, w, None, (), None, bias=bias, activation="gelu", quantize="fp8_e4m3", config=sub2)
    y = F.gelu(ref_mm(x, w) + bias.float())
    assert_close(s, y.abs().amax(1, keepdim=True) / 448.0, torch.float32, tol=1e-2)
    assert_close(q.float() * s, y, torch.float8_e4m3fn)


REPLAY_CONFIGS = [
    C.GemmConfig("tiled", 128, 128, 64, num_warps=8, num_stages=4),
    C.GemmConfig("tiled", 64, 128, 128, num_warps=4, num_stages=4, split_k=4, tma=True),
    C.GemmConfig("persistent", 128, 256, 64, num_warps=8, num_stages=3, tma=True),
    C.GemmConfig("persistent", 128, 256, 64, num_warps=4, num_stages=3, tma=True, warp_specialize=True),
    C.GemmConfig("persistent", 128, 256, 64, num_warps=8, num_stages=3, tma=True, stream_k=True),
]


@pytest.mark.parametrize("cfg", REPLAY_CONFIGS, ids=lambda c: c.label())
def test_plan_replays_through_the_compiled_launcher(cfg):
    from tilefuse.kernels.gemm import plan as P

    P.forget_plans()
    m, n, k = 384, 1024, 1024
    for i in range(3):  # the first call plans, the others replay with new tensors
        a, b, bias = rand(m, k), rand(k, n), rand(n)
        got = G.gemm_raw(a, b, bias=bias, activation="gelu", config=cfg).out[0]
        assert_close(got, F.gelu(ref_mm(a, b) + bias.float()), torch.bfloat16, what=f"call {i}")
    plans = list(P._plans.values())
    assert len(plans) == 1 and all(c.direct is not None for c in plans[0].launches), "a launch kept no kernel"
    import triton
    if triton.__version__.startswith("3.6."):
        assert not any(c.direct.via_run for c in plans[0].launches), "expected the direct launcher path on triton 3.6"
    side = torch.cuda.Stream()
    a, b, bias = rand(m, k), rand(k, n), rand(n)
    with torch.cuda.stream(side):
        out = G.gemm_raw(a, b, bias=bias, activation="gelu", config=cfg).out[0]
    side.synchronize()
    assert_close(out, F.gelu(ref_mm(a, b) + bias.float()), torch.bfloat16, what="side stream")


def test_plan_replays_quantised_and_strided_outputs():
    from tilefuse.kernels.gemm import plan as P

    P.forget_plans()
    m, n, k = 256, 4096, 512
    for _ in range(2):
        a, b, bias = rand(m, k), rand(k, n), rand(n)
        q, s = tilefuse.gemm(a, b, bias=bias, activation="gelu", quantize="fp8_e4m3")
        y = F.gelu(ref_mm(a, b) + bias.float())
        assert_close(q.float() * s, y, torch.float8_e4m3fn)
    for _ in range(2):
        a, b = rand(m, k), rand(k, n)
        out = poisoned_empty(n, m, dtype=torch.bfloat16, device="cuda").t()  # column-major out=
        assert tilefuse.gemm(a, b, out=out) is out
        assert_close(out, ref_mm(a, b), torch.bfloat16)


def test_host_overhead_a_call():
    """Wall time a call of a tiny GEMM (host-bound): tilefuse against torch.matmul, printed for the notes."""
    import time

    a, b = rand(64, 64), rand(64, 64)
    for fn in (torch.matmul, tilefuse.gemm):
        for _ in range(200):
            fn(a, b)
    torch.cuda.synchronize()
    per_call = {}
    for name, fn in (("torch.matmul", torch.matmul), ("tilefuse.gemm", tilefuse.gemm)):
        t0 = time.perf_counter()
        for _ in range(3000):
            fn(a, b)
        torch.cuda.synchronize()
        per_call[name] = (time.perf_counter() - t0) / 3000 * 1e6
    print(f"\nhost time a call (64^3 bf16): {per_call}")
    assert per_call["tilefuse.gemm"] < max(3 * per_call["torch.matmul"], 25.0), per_call
