"""The Triton GEMM library on the interpreter: shapes, layouts, kernels, epilogues, batches, dtypes, errors.

fp16/fp32 only for float inputs: the interpreter's bf16 dot is broken in triton 3.6 (bf16 runs in the
gpu tests). References in float64 (float32 inputs) or float32 (half inputs), compared with ‖·‖ relative
error against tests.support.TOLERANCE; outputs are poisoned first.
"""
from __future__ import annotations

import pytest
import torch

import tilefuse
from tests.support import TOLERANCE, assert_close, noncontiguous, poisoned_empty, rel_error, transposed_copy
from tilefuse.kernels import gemm as G
from tilefuse.kernels.gemm.configs import GemmConfig
from tilefuse.kernels.gemm.epilogue import example_silu_plus_e0

F = torch.nn.functional
ACT = {None: lambda x: x, "relu": torch.relu, "gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
       "silu": F.silu, "sigmoid": torch.sigmoid, "tanh": torch.tanh}
# one config of each kernel variant, small enough for the interpreter
VARIANTS = {
    "tiled": GemmConfig("tiled", 32, 32, 16),
    "splitk": GemmConfig("tiled", 16, 32, 16, split_k=3),
    "persistent": GemmConfig("persistent", 32, 32, 16),
    "persistent_sub2": GemmConfig("persistent", 32, 64, 16, epi_subtile=2),
    "tiled_tma": GemmConfig("tiled", 32, 32, 16, tma=True),
    "splitk_tma": GemmConfig("tiled", 16, 32, 32, split_k=2, tma=True),
    "persistent_tma": GemmConfig("persistent", 32, 32, 16, tma=True, epi_subtile=2),
    # tile and K loops flattened (the interpreter runs the same loops; the GPU pipelines them as one)
    "persistent_flat": GemmConfig("persistent", 32, 32, 16, tma=True, flatten=True),
    # B streamed into registers a step ahead (the L2 hint itself is a no-op here), whole K and split-K
    "b_stream": GemmConfig("tiled", 16, 32, 16, num_stages=1, b_stream=True),
    "b_stream_splitk": GemmConfig("tiled", 16, 32, 16, split_k=3, num_stages=1, b_stream=True),
}


def ref_mm(a, b):
    wide = torch.float64 if a.dtype == torch.float32 else torch.float32
    return a.to(wide) @ b.to(wide)


def rand(*shape, dtype=torch.float32):
    return torch.randn(*shape).to(dtype)


# ------------------------------------------------------------------------------------- shapes, layouts
@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (7, 13, 29), (129, 7, 33), (33, 130, 1), (1, 65, 100)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_odd_sizes(m, n, k, dtype):
    a, b = rand(m, k, dtype=dtype), rand(k, n, dtype=dtype)
    out = poisoned_empty(m, n, dtype=dtype, device="cpu")
    got = tilefuse.gemm(a, b, out=out)
    assert got is out
    assert_close(out, ref_mm(a, b), dtype)


@pytest.mark.parametrize("layout", ["tt", "nt", "tn", "strided_a", "strided_b", "sliced"])
def test_layouts(layout):
    m, n, k = 37, 50, 45
    a, b = rand(m, k), rand(k, n)
    if layout[0] == "t" and len(layout) == 2:
        a = transposed_copy(a)
    if layout[1:] == "t" and len(layout) == 2:
        b = transposed_copy(b)
    if layout == "strided_a":
        a = noncontiguous(a)
    if layout == "strided_b":
        b = noncontiguous(b)
    if layout == "sliced":
        a = rand(m + 3, k + 5)[2:2 + m, 1:1 + k]
        b = rand(n, k).t()
    assert_close(tilefuse.gemm(a, b), ref_mm(a, b), torch.float32)


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("layout", ["nn", "tt"])
def test_kernel_variants(variant, layout):
    # 64x96x80 fp16: every stride 16-byte aligned, so the TMA variants use descriptors
    m, n, k = 64, 96, 80
    a, b = rand(m, k, dtype=torch.float16), rand(k, n, dtype=torch.float16)
    if layout == "tt":
        a, b = transposed_copy(a), transposed_copy(b)
    ops = G.prepare(a, b)
    assert ops.problem.tma_ok
    res = G.gemm_raw(a, b, config=VARIANTS[variant])
    assert_close(res.out[0], ref_mm(a, b), torch.float16)


@pytest.mark.parametrize("variant", ["tiled", "splitk", "persistent_sub2", "b_stream", "b_stream_splitk",
                                     "persistent_flat"])
def test_variants_odd_edges(variant):
    a, b = rand(45, 27), rand(27, 71)  # no TMA (odd strides): pointer loads with every mask live
    res = G.gemm_raw(a, b, config=VARIANTS[variant])
    assert_close(res.out[0], ref_mm(a, b), torch.float32)


@pytest.mark.parametrize("k", [16, 40, 64])
def test_b_stream_split_ranges_empty_short_and_ragged(k):
    # split-K 5 over 1, 3 and 4 K tiles: empty splits (nothing prefetched, nothing added), one-step splits
    # (the prefetch past the split's end is masked off) and a ragged last tile (K % 16 != 0), with B
    # K-contiguous (nn.Linear's weight) and a bias + GeLU epilogue
    a, w, bias = rand(7, k), rand(37, k), rand(37)
    res = G.gemm_raw(a, w.t(), bias=bias, activation="gelu",
                     config=GemmConfig("tiled", 16, 16, 16, split_k=5, num_stages=1, b_stream=True))
    ref = torch.nn.functional.gelu(ref_mm(a, w.t()) + bias.double())
    assert_close(res.out[0], ref, torch.float32)


def test_splitk_more_splits_than_k_tiles():
    a, b = rand(20, 16), rand(16, 24)  # one K tile, five splits: four splits have nothing to add
    res = G.gemm_raw(a, b, config=GemmConfig("tiled", 16, 16, 16, split_k=5))
    assert_close(res.out[0], ref_mm(a, b), torch.float32)
    # the counters were reset: the next launch reduces correctly too
    res = G.gemm_raw(a, b, config=GemmConfig("tiled", 16, 16, 16, split_k=5))
    assert_close(res.out[0], ref_mm(a, b), torch.float32)


# stream-K: the interpreter launches 3 programs (gemm_launching.num_programs), so a tile count that is not a multiple
# of 3 leaves a tail of 1 or 2 tiles dealt out as K steps
SK_CASES = [  # m, n, k, config: the tail's tiles, their K steps
    (150, 20, 200, GemmConfig("persistent", 32, 32, 16, stream_k=True)),  # 5 tiles: tail 2, 13 steps
    (40, 50, 390, GemmConfig("persistent", 32, 32, 16, stream_k=True)),  # 4 tiles: tail 1, 25 steps, odd K
    (64, 200, 480, GemmConfig("persistent", 32, 64, 16, tma=True, epi_subtile=2, stream_k=True)),  # TMA, halves
]


@pytest.mark.parametrize("min_steps", [1, 8])
@pytest.mark.parametrize("case", range(len(SK_CASES)))
def test_stream_k_tail(monkeypatch, min_steps, case):
    from tilefuse.kernels.gemm import launching as gemm_launching, plan as gemm_plan
    from tilefuse.kernels.gemm.configs import stream_k_pieces
    from tilefuse.kernels.launcher import stream_buffer

    m, n, k, cfg = SK_CASES[case]
    monkeypatch.setattr(gemm_launching, "STREAM_K_MIN_STEPS", min_steps)
    gemm_plan.forget_plans()  # the minimum is compiled into the kernel
    programs = gemm_launching.num_programs()
    tiles = -(-m // cfg.block_m) * -(-n // cfg.block_n)
    pieces = stream_k_pieces(tiles, -(-k // cfg.block_k), programs, min_steps)
    per_tile = [sum(1 for ps in pieces for p in ps if p[0] == t) for t in range(tiles % programs)]
    assert max(per_tile) >= 2, "the case does not reduce pieces of a tile"
    dtype = torch.float16 if cfg.tma else torch.float32
    a, b, bias, res = rand(m, k, dtype=dtype), rand(k, n, dtype=dtype), rand(n), noncontiguous(rand(m, n))
    a_tma = a if cfg.tma else noncontiguous(a)
    out = poisoned_empty(m, n, dtype=torch.float32, device="cpu")
    got = G.gemm_raw(a_tma, b, bias=bias, activation="gelu", residual=res, out=out, out_dtype=torch.float32,
                     config=cfg).out[0]
    assert got.data_ptr() == out.data_ptr()
    ref = F.gelu(ref_mm(a, b) + bias.double()) + res.double()
    assert_close(out, ref, dtype)
    lock = stream_buffer("lock", torch.device("cpu"), 0, 1, torch.int32)
    assert int(lock.abs().sum()) == 0, "a tail tile's counter was left non-zero"
    again = G.gemm_raw(a_tma, b, bias=bias, activation="gelu", residual=res, out_dtype=torch.float32,
                       config=cfg).out[0]
    assert torch.equal(again, out), "the tail's reduction is not deterministic"


def test_stream_k_with_k_zero_still_writes_every_tile():
    # K = 0 with an epilogue runs the kernel (the output is the epilogue of zeros): no K steps to deal out, so
    # the tail tiles go through the whole-tile loop
    cfg = GemmConfig("persistent", 32, 32, 16, stream_k=True)
    bias = rand(20)
    out = poisoned_empty(150, 20, dtype=torch.float32, device="cpu")
    G.gemm_raw(rand(150, 0), rand(0, 20), bias=bias, activation="sigmoid", out=out, config=cfg)
    assert_close(out, torch.sigmoid(bias).expand(150, 20), torch.float32)


def test_stream_k_pieces_cover_the_tail_once():
    from tilefuse.kernels.gemm.configs import stream_k_pieces

    for tiles, steps, programs, least in [(512, 64, 132, 8), (2048, 128, 132, 8), (32, 128, 132, 8), (1, 64, 132, 8),
                                          (5, 13, 3, 1), (131, 3, 132, 8), (7, 1, 3, 8)]:
        pieces = stream_k_pieces(tiles, steps, programs, least)
        rem = tiles % programs
        covered = sorted((t, s) for ps in pieces for t, k0, k1, _ in ps for s in range(k0, k1))
        assert covered == [(t, s) for t in range(rem) for s in range(steps)]
        assert all(len(ps) <= 2 for ps in pieces)  # a share is at most a tile long
        slots = [slot for ps in pieces for *_, slot in ps]
        assert len(set(slots)) == len(slots) and max(slots, default=0) < 2 * programs


def test_stream_k_batched_and_quantised():
    from tilefuse.kernels.gemm import plan as gemm_plan

    gemm_plan.forget_plans()
    cfg = GemmConfig("persistent", 32, 32, 16, stream_k=True)
    a, b = rand(2, 40, 130), rand(2, 130, 50)  # 2 x 4 tiles on 3 programs: a tail of 2 tiles of 9 steps
    assert_close(G.gemm_raw(a, b, config=cfg).out, torch.matmul(a.double(), b.double()), torch.float32)
    sub2 = GemmConfig("persistent", 32, 64, 16, epi_subtile=2, stream_k=True)
    a, b = rand(37, 300), rand(300, 100)  # 2 x 2 tiles: a tail of 1 tile, its row amax in column halves
    q, scale = G.gemm_with_epilogue(a, b, None, (), None, quantize="int8", config=sub2)
    ref_q, ref_s = _ref_quant(ref_mm(a, b), torch.int8)
    assert_close(scale, ref_s, torch.float32, tol=1e-5)
    assert (q.float() - ref_q.float()).abs().max() <= 1


def test_zero_size():
    assert tilefuse.gemm(rand(0, 5), rand(5, 3)).shape == (0, 3)
    assert tilefuse.gemm(rand(4, 5), rand(5, 0)).shape == (4, 0)
    out = tilefuse.gemm(rand(4, 0), rand(0, 3))
    assert torch.equal(out, torch.zeros(4, 3))
    bias = rand(3)
    out = tilefuse.gemm(rand(4, 0), rand(0, 3), bias=bias, activation="sigmoid")
    assert_close(out, torch.sigmoid(bias).expand(4, 3), torch.float32)
    assert tilefuse.gemm(rand(0, 4, 5), rand(5, 3)).shape == (0, 4, 3)
    q, s = tilefuse.gemm(rand(0, 5), rand(5, 3), quantize="int8")
    assert q.shape == (0, 3) and s.shape == (0, 1)


# ----------------------------------------------------------------------------------------- epilogues
@pytest.mark.parametrize("activation", list(ACT))
def test_activations(activation):
    a, b, bias = rand(33, 40), rand(40, 50), rand(50)
    got = tilefuse.gemm(a, b, bias=bias, activation=activation)
    ref = ACT[activation](ref_mm(a, b) + bias.double())
    assert_close(got, ref, torch.float32, tol=2e-6 if activation in ("gelu_tanh", "tanh") else None)


@pytest.mark.parametrize("variant", ["tiled", "splitk", "persistent_sub2"])
def test_full_epilogue(variant):
    m, n, k = 40, 70, 36
    a, b = rand(m, k, dtype=torch.float16), rand(k, n, dtype=torch.float16)
    bias, res = rand(m, 1), noncontiguous(rand(m, n))
    got = G.gemm_raw(a, b, bias=bias, activation="silu", residual=res, alpha=0.5, beta=-2.0, out_dtype=torch.float32,
                     config=VARIANTS[variant]).out[0]
    ref = F.silu(0.5 * ref_mm(a, b) + bias.float()) - 2.0 * res
    assert_close(got, ref, torch.float16)


def test_bias_and_residual_shapes():
    a, b = rand(9, 12), rand(12, 10)
    ref = ref_mm(a, b)
    for bias in (rand(10), rand(1, 10)):
        assert_close(tilefuse.gemm(a, b, bias=bias), ref + bias.double(), torch.float32)
    row = rand(9, 1)
    assert_close(tilefuse.gemm(a, b, bias=row), ref + row.double(), torch.float32)
    for res in (rand(10), rand(9, 1), rand(9, 10), rand(1, 10)):
        assert_close(tilefuse.gemm(a, b, residual=res, beta=3.0), ref + 3.0 * res.double(), torch.float32)


def test_out_dtype_cast():
    a, b = rand(20, 30, dtype=torch.float16), rand(30, 17, dtype=torch.float16)
    got = tilefuse.gemm(a, b, out_dtype=torch.float32)
    assert got.dtype == torch.float32
    assert_close(got, ref_mm(a, b), torch.float16)


def test_hook_gemm_with_epilogue():
    m, n, k = 30, 45, 26
    a, b = rand(m, k, dtype=torch.float16), rand(k, n, dtype=torch.float16)
    for e0 in (rand(m, n), rand(n), rand(m, 1), transposed_copy(rand(m, n))):
        got = G.gemm_with_epilogue(a, b, example_silu_plus_e0, [e0], torch.float32, bias=rand(n) * 0)
        x = ref_mm(a, b)
        assert_close(got, F.silu(x) + e0.float(), torch.float16)


import triton  # noqa: E402
import triton.language as tl  # noqa: E402


@triton.jit
def _hook_two_operands(acc, offs_m, offs_n, mask_m, mask_n,
                       e0, e0_sm, e0_sn, e1, e1_sm, e1_sn, e2, e2_sm, e2_sn, e3, e3_sm, e3_sn):
    mask = mask_m[:, None] & mask_n[None, :]
    x = tl.load(e0 + offs_m[:, None] * e0_sm + offs_n[None, :] * e0_sn, mask=mask, other=0.0)
    y = tl.load(e1 + offs_m[:, None] * e1_sm + offs_n[None, :] * e1_sn, mask=mask, other=0.0)
    return tl.maximum(acc * x, y)


@pytest.mark.parametrize("variant", ["tiled", "splitk", "persistent_sub2"])
def test_hook_two_operands_after_builtins(variant):
    m, n, k = 35, 66, 20
    a, b = rand(m, k), rand(k, n)
    e0, e1, bias = rand(m, n), rand(n), rand(n)
    got = G.gemm_with_epilogue(a, b, _hook_two_operands, [e0, e1], torch.float32, bias=bias, activation="relu",
                               config=VARIANTS[variant])
    ref = torch.maximum(torch.relu(ref_mm(a, b) + bias.double()) * e0.double(), e1.double())
    assert_close(got, ref, torch.float32)


def test_hook_batched():
    a, b, e0 = rand(3, 20, 24), rand(3, 24, 18), rand(3, 20, 18)
    got = G.gemm_with_epilogue(a, b, example_silu_plus_e0, [e0], torch.float32)
    assert_close(got, F.silu(ref_mm(a, b)) + e0.double(), torch.float32)


# --------------------------------------------------------------------------------------------- batches
@pytest.mark.parametrize("shapes", [((3, 17, 20), (3, 20, 9)), ((3, 17, 20), (20, 9)), ((17, 20), (3, 20, 9)),
                                    ((1, 17, 20), (4, 20, 9)), ((4, 17, 20), (1, 20, 9))])
def test_batched_broadcast(shapes):
    a, b = rand(*shapes[0]), rand(*shapes[1])
    got = tilefuse.gemm(a, b, bias=rand(9) * 0 + 1.0, activation="relu")
    ref = torch.relu(torch.matmul(a.double(), b.double()) + 1.0)
    assert got.shape == ref.shape
    assert_close(got, ref, torch.float32)


def test_batched_non_foldable_layouts():
    a = transposed_copy(rand(3, 17, 20))  # column-major matrices: the batch cannot fold into rows
    b = rand(20, 9)
    res = rand(3, 17, 9)
    got = tilefuse.gemm(a, b, residual=res)
    assert_close(got, torch.matmul(a.double(), b.double()) + res.double(), torch.float32)
    a = rand(17, 3, 20).transpose(0, 1)  # batch stride 20, row stride 60
    assert_close(tilefuse.gemm(a, b), torch.matmul(a.double(), b.double()), torch.float32)


def test_batched_persistent_and_splitk():
    a, b = rand(3, 33, 40), rand(3, 40, 21)
    for v in ("persistent", "splitk"):
        res = G.gemm_raw(a, b, bias=rand(3, 1, 21), config=VARIANTS[v])
        assert res.out.shape == (3, 33, 21)


def test_batched_per_batch_bias():
    a, b, bias = rand(3, 11, 12), rand(3, 12, 8), rand(3, 1, 8)
    assert_close(tilefuse.gemm(a, b, bias=bias), torch.matmul(a.double(), b.double()) + bias.double(), torch.float32)


# ----------------------------------------------------------------------------------- quantised outputs
def _ref_quant(y: torch.Tensor, qdtype):
    qmax = 127.0 if qdtype == torch.int8 else torch.finfo(qdtype).max
    scale = y.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12) / qmax
    v = (y / scale).clamp(-qmax, qmax)
    return (v.round() if qdtype == torch.int8 else v).to(qdtype), scale


@pytest.mark.parametrize("quantize", ["fp8_e4m3", "fp8_e5m2", "int8"])
@pytest.mark.parametrize("config", [GemmConfig("tiled", 32, 32, 16), GemmConfig("tiled", 32, 128, 16),
                                    GemmConfig("persistent", 32, 64, 16, epi_subtile=2),
                                    GemmConfig("tiled", 16, 32, 16, split_k=2)], ids=["2pass", "direct", "persist", "splitk"])
def test_quantised_output(quantize, config):
    a, b, bias = rand(37, 48), rand(48, 100), rand(100)
    q, scale = G.gemm_with_epilogue(a, b, None, (), None, bias=bias, activation="gelu", quantize=quantize, config=config)
    # the GeLU in float64: float32's 0.5 x (1 + erf(x / sqrt2)) is 0 below x = -5.5, where the kernel's
    # erfc form keeps the value (e5m2's range reaches codes for them)
    y = F.gelu(ref_mm(a, b) + bias.double())
    ref_q, ref_s = _ref_quant(y, q.dtype)
    assert q.shape == (37, 100) and scale.shape == (37, 1) and scale.dtype == torch.float32
    assert_close(scale, ref_s, torch.float32, tol=1e-5)
    # codes: the same as torch's quantisation of the (float64) reference, but for values within a rounding
    # of a tie between two codes
    same = (q.float() == ref_q.float()).float().mean().item()
    assert same > 0.99, f"{1 - same:.3%} of the codes differ"
    assert_close(q.float() * scale, y, q.dtype, tol=1e-2 if q.dtype == torch.int8 else None)


def test_quantised_batched_and_out():
    a, b = rand(2, 19, 24), rand(24, 40)
    out = poisoned_empty(2, 19, 40, dtype=torch.int8, device="cpu")
    q, s = tilefuse.gemm(a, b, quantize=torch.int8, out=out)
    assert q is out and s.shape == (2, 19, 1)
    ref = torch.matmul(a.double(), b.double()).float()
    assert_close(q.float() * s, ref, torch.int8, tol=1e-2)


def test_quantise_all_zero_row():
    a = rand(4, 8)
    a[1] = 0
    q, s = tilefuse.gemm(a, rand(8, 6), quantize="fp8_e4m3")
    assert torch.isfinite(s).all() and (s > 0).all()
    assert torch.equal(q[1].float(), torch.zeros(6))


# ------------------------------------------------------------------------------------- fp8 and int8 in
@pytest.mark.parametrize("modes", [("tensor", "tensor"), ("row", "col"), ("row", "tensor"), (None, None)])
def test_fp8_inputs_scaled(modes):
    m, n, k = 40, 48, 64
    a = rand(m, k).to(torch.float8_e4m3fn)
    b = rand(n, k).to(torch.float8_e5m2).t()  # column-major, as torch._scaled_mm wants; mixed formats
    shapes = {"tensor": (1,), "row": (m, 1), "col": (1, n)}
    sa = torch.rand(*shapes[modes[0]]) + 0.5 if modes[0] else None
    sb = torch.rand(*shapes[modes[1]]) + 0.5 if modes[1] else None
    bias = rand(n)
    got = tilefuse.gemm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.float32, bias=bias)
    ref = (a.double() * (sa.double() if sa is not None else 1)) @ (b.double() * (sb.double() if sb is not None else 1))
    # the scales multiply the fp32 accumulator before the bias is added (torch._scaled_mm's order)
    assert_close(got, ref + bias.double(), torch.float32)
    assert tilefuse.gemm(a, b, scale_a=sa, scale_b=sb).dtype == torch.bfloat16


def test_int8_exact():
    a = torch.randint(-128, 128, (33, 70), dtype=torch.int8)
    b = torch.randint(-128, 128, (70, 41), dtype=torch.int8)
    got = tilefuse.gemm(a, b)
    assert got.dtype == torch.int32
    assert torch.equal(got, (a.long() @ b.long()).int())
    split = G.gemm_raw(a, b, config=GemmConfig("tiled", 16, 32, 16, split_k=3)).out[0]
    assert torch.equal(split, got)


def test_int8_scaled_float_out():
    a = torch.randint(-100, 100, (20, 32), dtype=torch.int8)
    b = torch.randint(-100, 100, (32, 24), dtype=torch.int8)
    sa, sb = torch.rand(20, 1), torch.rand(1, 24)
    got = tilefuse.gemm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.float32, activation="relu")
    ref = torch.relu((a.double() @ b.double()) * sa.double() * sb.double())
    assert_close(got, ref, torch.float32)


# ---------------------------------------------------------------------------------------------- autograd
@pytest.mark.parametrize("activation", [None, "relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh"])
def test_autograd_matches_torch(activation):
    a = rand(2, 9, 20).requires_grad_()
    b = rand(20, 13).requires_grad_()
    bias, res = rand(13).requires_grad_(), rand(9, 13).requires_grad_()
    y = tilefuse.gemm(a, b, bias=bias, activation=activation, residual=res, alpha=0.7, beta=1.3)
    g = torch.randn_like(y)
    y.backward(g)
    ours = [t.grad.clone() for t in (a, b, bias, res)]
    for t in (a, b, bias, res):
        t.grad = None
    ref = ACT[activation](0.7 * (a @ b) + bias) + 1.3 * res
    ref.backward(g)
    assert_close(y, ref.detach(), torch.float32)
    for name, got, t in zip("a b bias residual".split(), ours, (a, b, bias, res)):
        assert_close(got, t.grad, torch.float32, tol=1e-5, what=f"grad {name}")


def test_autograd_batched_both_and_fp16():
    a = rand(3, 10, 12, dtype=torch.float16).requires_grad_()
    b = rand(1, 12, 7, dtype=torch.float16).requires_grad_()
    y = tilefuse.gemm(a, b)
    y.float().sum().backward()
    a2, b2 = a.detach().float().requires_grad_(), b.detach().float().requires_grad_()
    torch.matmul(a2, b2).sum().backward()
    assert_close(a.grad, a2.grad, torch.float16)
    assert_close(b.grad, b2.grad, torch.float16)


def test_autograd_rejects_quantize():
    a = rand(4, 5).requires_grad_()
    with pytest.raises(ValueError, match="quantize"):
        tilefuse.gemm(a, rand(5, 3), quantize="int8")
    with torch.no_grad():
        tilefuse.gemm(a, rand(5, 3), quantize="int8")


# ------------------------------------------------------------------------------------------ nn.Linear
def test_linear_drop_in():
    torch_lin = torch.nn.Linear(20, 7)
    lin = tilefuse.nn.Linear(20, 7)
    lin.load_state_dict(torch_lin.state_dict())
    assert set(lin.state_dict()) == set(torch_lin.state_dict())
    x = rand(3, 4, 20)
    assert_close(lin(x), torch_lin(x).detach(), torch.float32)
    act = tilefuse.nn.Linear(20, 7, bias=False, activation="gelu")
    torch_nb = torch.nn.Linear(20, 7, bias=False)
    act.load_state_dict(torch_nb.state_dict())
    y = act(x)
    assert_close(y, F.gelu(torch_nb(x)).detach(), torch.float32)
    y.sum().backward()
    assert act.weight.grad is not None and act.weight.grad.shape == (7, 20)
    assert "activation='gelu'" in repr(act)


def test_linear_from_torch_and_fallback():
    torch_lin = torch.nn.Linear(6, 5).double()
    lin = tilefuse.nn.Linear.from_torch(torch_lin, activation="relu")
    x = torch.randn(2, 6, dtype=torch.float64)  # float64: not a tilefuse dtype, falls back to torch
    assert torch.allclose(lin(x), torch.relu(torch_lin(x)))
    with pytest.raises(ValueError, match="activation"):
        tilefuse.nn.Linear(3, 4, activation="swish")


# -------------------------------------------------------------------------------------------- errors
@pytest.mark.parametrize("call,exc,match", [
    (lambda: tilefuse.gemm(rand(3, 4), rand(5, 6)), ValueError, "K=4"),
    (lambda: tilefuse.gemm(rand(3, 4, dtype=torch.float16), rand(4, 6)), TypeError, "same dtype"),
    (lambda: tilefuse.gemm(rand(3, 4).double(), rand(4, 6).double()), TypeError, "accepted"),
    (lambda: tilefuse.gemm(rand(3), rand(3, 6)), ValueError, "dimensions"),
    (lambda: tilefuse.gemm(rand(2, 3, 4), rand(5, 4, 6)), ValueError, "batch"),
    (lambda: tilefuse.gemm(rand(3, 4), rand(4, 6), activation="swish"), ValueError, "activation"),
    (lambda: tilefuse.gemm(rand(3, 4), rand(4, 6), quantize="fp4"), ValueError, "quantize"),
    (lambda: tilefuse.gemm(rand(3, 4), rand(4, 6), bias=rand(3, 6)), ValueError, "residual="),
    (lambda: tilefuse.gemm(rand(3, 4), rand(4, 6), bias=rand(5)), ValueError, "broadcast"),
    (lambda: tilefuse.gemm(rand(3, 4), rand(4, 6), out_dtype=torch.int32), ValueError, "out_dtype"),
    (lambda: tilefuse.gemm(rand(3, 4), rand(4, 6), out=torch.empty(3, 5)), ValueError, "shape"),
    (lambda: tilefuse.gemm(rand(3, 4), rand(4, 6), out=torch.empty(3, 6, dtype=torch.float16)), TypeError, "dtype"),
    (lambda: tilefuse.gemm(rand(3, 4), rand(4, 6), scale_a=torch.ones(1)), ValueError, "fp8 or int8"),
    (lambda: tilefuse.gemm(torch.ones(3, 4, dtype=torch.int8), torch.ones(4, 6, dtype=torch.int8), activation="relu"),
     ValueError, "int32"),
    (lambda: tilefuse.gemm(torch.ones(3, 4).to(torch.float8_e4m3fn), torch.ones(4, 6).to(torch.float8_e4m3fn),
                           scale_a=torch.ones(2)), ValueError, "scale_a"),
    (lambda: tilefuse.gemm(torch.ones(3, 4).to(torch.float8_e4m3fn), torch.ones(4, 6).to(torch.float8_e4m3fn),
                           scale_a=torch.ones(1, dtype=torch.float16)), TypeError, "float32"),
    (lambda: tilefuse.gemm([[1.0]], rand(1, 2)), TypeError, "torch.Tensor"),
    (lambda: tilefuse.gemm(rand(3, 4), rand(4, 6), alpha="2"), TypeError, "alpha"),
    (lambda: G.gemm_with_epilogue(rand(3, 4), rand(4, 6), example_silu_plus_e0, [rand(3, 6)] * 5), ValueError, "at most 4"),
    (lambda: G.gemm_with_epilogue(rand(3, 4), rand(4, 6), lambda x: x, []), TypeError, "triton.jit"),
    (lambda: tilefuse.gemm(torch.ones(3, 4, dtype=torch.int8), rand(4, 6)), TypeError, "int8"),
])
def test_errors_before_launch(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_error_leaves_out_untouched():
    out = poisoned_empty(3, 6, dtype=torch.float32, device="cpu")
    with pytest.raises(ValueError):
        tilefuse.gemm(rand(3, 4), rand(4, 6), out=out, bias=rand(7))
    assert torch.isnan(out).all()


def test_supports_predicate():
    ok, why = G.supports(rand(3, 4), rand(4, 6), activation="gelu")
    assert ok and why == ""
    ok, why = G.supports(rand(3, 4), rand(4, 6), activation="swish")
    assert not ok and "activation" in why


def test_rel_error_helper_sanity():
    # the reference helpers themselves: a poisoned output is infinitely wrong
    x = rand(4, 4)
    assert rel_error(torch.full_like(x, float("nan")), x) == float("inf")
    assert TOLERANCE[torch.float16] > TOLERANCE[torch.float32]


@pytest.mark.parametrize("dtype", [torch.float32, torch.int8])
def test_two_way_split_sums_in_registers_with_the_strip_path_bits(monkeypatch, dtype):
    """A 2-way split with a small accumulator sums in registers (the last split adds the other's partial to
    its own); the result is the same bits as the strip path's partial 0 + partial 1, whichever split
    arrives last, and the counters are reset for the next launch."""
    from tilefuse.kernels.gemm import configs as gemm_configs, plan as gemm_plan
    cfg = GemmConfig("tiled", 16, 32, 16, split_k=2)
    assert gemm_configs.split_in_registers(cfg)
    m, n, k = 37, 70, 90  # ragged in every dimension, odd K tiles: the two splits have 3 and 3 steps
    if dtype == torch.int8:
        a = torch.randint(-128, 128, (m, k), dtype=torch.int8)
        b = torch.randint(-128, 128, (n, k), dtype=torch.int8).t()
    else:
        a, b = rand(k, m).t(), rand(k, n)  # a column-major A
    bias = rand(n) if dtype == torch.float32 else None
    regs = G.gemm_raw(a, b, bias=bias, config=cfg).out[0].clone()
    again = G.gemm_raw(a, b, bias=bias, config=cfg).out[0]
    monkeypatch.setattr(gemm_configs, "SPLIT_REG_ACC", 0)
    assert not gemm_configs.split_in_registers(cfg)
    gemm_plan.forget_plans()  # the kept plans carry the launch's SPLIT_IN_REGS
    strips = G.gemm_raw(a, b, bias=bias, config=cfg).out[0]
    assert torch.equal(regs, strips) and torch.equal(again, regs)
    if dtype == torch.int8:
        assert torch.equal(regs, (a.long() @ b.long()).int())
    else:
        assert_close(regs, ref_mm(a, b) + bias.double(), torch.float32)


@pytest.mark.parametrize("cfg", [GemmConfig("tiled", 32, 32, 16, tma=True),
                                 GemmConfig("tiled", 16, 32, 32, split_k=2, tma=True),
                                 GemmConfig("persistent", 32, 64, 16, tma=True, epi_subtile=2),
                                 GemmConfig("persistent", 32, 32, 16, tma=True, flatten=True)], ids=lambda c: c.label())
@pytest.mark.parametrize("layout", ["nn", "tn", "nt"])
def test_tma_descriptors_made_on_the_host_or_in_the_kernel_agree(monkeypatch, cfg, layout):
    """TMA loads (and the persistent kernel's TMA store) through descriptors made on the host (HOST_DESC, the
    default) and made in the kernel: the same bits, on A or B stored transposed, replayed through the plan."""
    from tilefuse.kernels.gemm import launching as gemm_launching, plan as gemm_plan
    m, n, k = 40, 72, 100
    a = rand(k, m).t() if layout[0] == "t" else rand(m, k)
    b = rand(n, k).t() if layout[1] == "t" else rand(k, n)
    bias = rand(n)
    ops = G.prepare(a, b, bias=bias)
    ls, _ = gemm_launching.launches(ops, cfg)
    assert ls[0].args["USE_TMA"] and ls[0].args["HOST_DESC"]
    assert set(ls[0].descs) == ({"a_desc_h", "b_desc_h", "c_desc_h"} if cfg.kernel == "persistent" else {"a_desc_h", "b_desc_h"})
    gemm_plan.forget_plans()
    host = [G.gemm_raw(a, b, bias=bias, config=cfg).out[0].clone() for _ in range(2)]  # first call, then the replay
    monkeypatch.setattr(gemm_launching, "HOST_DESCRIPTORS", False)
    gemm_plan.forget_plans()
    assert not gemm_launching.launches(ops, cfg)[0][0].args["HOST_DESC"]
    in_kernel = G.gemm_raw(a, b, bias=bias, config=cfg).out[0]
    gemm_plan.forget_plans()
    assert torch.equal(host[0], in_kernel) and torch.equal(host[1], in_kernel)
    assert_close(in_kernel, ref_mm(a, b) + bias.double(), torch.float32)


def test_tma_descriptor_probe_kernels_agree_on_the_interpreter():
    """tools/tma_desc_probe.py's three kernels (descriptors in the kernel, on the host, pointer loads) against
    float64 on a ragged shape: what its device timings compare must compute the same product."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(root))
    got = subprocess.run([sys.executable, str(root / "tools" / "tma_desc_probe.py"), "--check"], env=env,
                         capture_output=True, text=True, timeout=300)
    assert got.returncode == 0, got.stdout + got.stderr
    assert got.stdout.count("rel err") == 6


def test_l2_flush_probe_window_matches_the_driver_struct():
    """tools/l2_flush_probe.py --window hands the driver a CUstreamAttrValue by pointer: its access-policy
    member must have cuda.h's CUaccessPolicyWindow layout (pointer, size_t, float, two enums) at offset 0 of a
    64-byte union, or the driver reads a different window than the one the probe reports."""
    import ctypes
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[3] / "tools" / "l2_flush_probe.py"
    spec = importlib.util.spec_from_file_location("l2_flush_probe", path)
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    w = probe._Window
    assert [(name, getattr(w, name).offset) for name, _ in w._fields_] == \
        [("base_ptr", 0), ("num_bytes", 8), ("hitRatio", 16), ("hitProp", 20), ("missProp", 24)]
    assert ctypes.sizeof(probe._AttrValue) == 64 and probe._AttrValue.window.offset == 0
    assert (probe.ACCESS_POLICY_WINDOW, probe.MAX_WINDOW_SIZE, probe.STREAMING) == (1, 109, 1)  # cuda.h 13.0
