"""Latency-bound kernels: fewer programs than SMs (a decode step's one-row layer norm, its GeLU over 3072).

Planned for an H100-like target (132 SMs) and run on Triton's interpreter against float64:

* a persistent row reduction over fewer rows than SMs issues every load that needs no reduction before the
  first row sum (the weight and bias too) and takes 8 elements a thread (TUNING latency_rows_*): 4 warps for a
  row of 768, one pass, no loop;
* a flat pointwise kernel with fewer programs than SMs at POINTWISE_BLOCK takes the same 4 warps over blocks
  down to SMALL_POINTWISE_BLOCK (12 programs of 256 for 3072 elements);
* the compiler suite's 32768 x 4096 kernels (planned from fake tensors, nothing runs) and rows at least as
  many as the SMs keep their launch: 4 warps a 4096-wide row at 32 elements a thread, the weight loaded after
  the sums, pointwise blocks of 1024.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tilefuse.compiler import codegen
from tilefuse.compiler.codegen import kernel_writer
from tilefuse.compiler.tuning import TUNING, tuning

from tests.compiler_checks import collect_kernels, fake_schedules, reset, strict
from tests.support import assert_close, noncontiguous

GPU = codegen.LaunchTarget(warp_size=32, interpreter=False, multiprocessors=132)


@pytest.fixture
def gpu_kernels(monkeypatch):
    """Every kernel planned for the GPU target (and run on the interpreter), in order."""
    kernels = collect_kernels(monkeypatch, GPU)
    reset()
    yield kernels
    torch._dynamo.reset()


def residual_layer_norm(x, r, w, b):
    h = x + r
    return h, F.layer_norm(h, h.shape[-1:], w, b, 1e-5)


def tanh_gelu(x, bias):  # GPT-2's MLP activation after its first projection's bias
    x = x + bias
    return 0.5 * x * (1.0 + torch.tanh(0.7978845608028654 * (x + 0.044715 * torch.pow(x, 3.0))))


def _inputs(shapes, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g).to(dtype) for s in shapes]


def _run(fn, inputs, dtype):
    """fn compiled (strict: no fallback) against float64 eager (float32 for half inputs)."""
    with torch.no_grad(), strict():
        got = torch.compile(fn, backend="tilefuse")(*inputs)
    ref_dtype = torch.float32 if dtype in (torch.float16, torch.bfloat16) else torch.float64
    want = fn(*[t.to(ref_dtype) for t in inputs])
    got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
    for k, (a, b) in enumerate(zip(got, want)):
        assert a.dtype == dtype
        assert_close(a, b, dtype, what=f"output {k}")


def _loads_before_first_sum(source: str) -> bool:
    lines = source.splitlines()
    first_sum = next(k for k, line in enumerate(lines) if "tl.sum(" in line)
    return all(k < first_sum for k, line in enumerate(lines) if "tl.load(" in line)


@pytest.mark.parametrize("rows,cols,dtype", [(1, 768, torch.bfloat16), (1, 768, torch.float32),
                                             (7, 1000, torch.float32), (1, 129, torch.float32),
                                             (131, 67, torch.float32)])
def test_rows_fewer_than_the_sms_load_first_with_8_elements_a_thread(gpu_kernels, rows, cols, dtype):
    """The decode step's residual add + layer norm: (1, 1, 768) bf16. One pass over the row in registers
    (a sum, then the centred sum: no Welford, no loop), every load before the first sum, RBLOCK // 256
    warps (4 for 768: 192 sm_90 SASS instructions a thread against 541 at one warp)."""
    x, r = _inputs([(1, rows, cols)] * 2, dtype, seed=rows * 7 + cols)
    w, b = _inputs([(cols,)] * 2, dtype, seed=cols)
    _run(residual_layer_norm, [x, r, w, b], dtype)
    [ks] = gpu_kernels
    rb = kernel_writer.next_pow2(cols)
    assert ks.form == "persistent" and ks.grid == (rows,), (ks.form, ks.grid)
    assert dict(ks.constexprs) == {"XBLOCK": 1, "RBLOCK": rb}, ks.constexprs
    assert ks.num_warps == max(1, rb // (32 * TUNING["latency_rows_thread_elems"])), ks.num_warps
    assert ks.source.count("tl.sum(") == 2 and "for " not in ks.source, ks.source
    assert _loads_before_first_sum(ks.source), ks.source
    if cols == 768:
        assert ks.num_warps == 4


def test_rows_as_many_as_the_sms_keep_their_launch(gpu_kernels):
    """132 rows of 67 (one program a row, one an SM): the throughput form, 32 elements a thread (one warp for
    a 128-wide block), the weight and bias loaded after the row sums; a non-contiguous x."""
    x, r = _inputs([(132, 67)] * 2, torch.float32, seed=5)
    w, b = _inputs([(67,)] * 2, torch.float32, seed=6)
    _run(residual_layer_norm, [noncontiguous(x), r, w, b], torch.float32)
    [ks] = gpu_kernels
    assert ks.grid == (132,) and dict(ks.constexprs) == {"XBLOCK": 1, "RBLOCK": 128}, (ks.grid, ks.constexprs)
    assert ks.num_warps == 1 and not _loads_before_first_sum(ks.source)


def test_latency_rows_switches(gpu_kernels):
    """latency_rows_loads_first=False and latency_rows_thread_elems=32 give the throughput form's kernel."""
    x, r = _inputs([(1, 1, 768)] * 2, torch.float32, seed=1)
    w, b = _inputs([(768,)] * 2, torch.float32, seed=2)
    with tuning(latency_rows_loads_first=False, latency_rows_thread_elems=TUNING["persistent_thread_elems"]):
        _run(residual_layer_norm, [x, r, w, b], torch.float32)
    [ks] = gpu_kernels
    assert ks.num_warps == 1 and not _loads_before_first_sum(ks.source)


@pytest.mark.parametrize("numel,block,programs,warps", [
    (3072, 256, 12, 4),       # the decode step's GeLU: 3 programs of 1024 before
    (3071, 256, 12, 4),
    (1000, 256, 4, 4),
    (300, 256, 2, 2),         # 2 warps (a 512 block's) over 256
    (200, 256, 1, 1),         # already one block of at most SMALL_POINTWISE_BLOCK: as before
    (7, 8, 1, 1),
    (132 * 256 + 1, 512, 67, 4),
], ids=lambda v: str(v))
def test_small_pointwise_spreads_over_the_sms(gpu_kernels, numel, block, programs, warps):
    x, bias = _inputs([(1, 1, numel), (numel,)], torch.float32, seed=numel)
    _run(tanh_gelu, [x, bias], torch.float32)
    [ks] = gpu_kernels
    assert ks.form == "pointwise"
    assert dict(ks.constexprs) == {"XBLOCK": block} and ks.grid == (programs,) and ks.num_warps == warps, \
        (ks.constexprs, ks.grid, ks.num_warps)


def test_small_pointwise_bf16_and_off_switch(gpu_kernels):
    x, bias = _inputs([(1, 1, 3072), (3072,)], torch.bfloat16, seed=11)
    _run(tanh_gelu, [x, bias], torch.bfloat16)
    with tuning(small_pointwise_block=0):
        torch._dynamo.reset()
        _run(tanh_gelu, [x, bias], torch.bfloat16)
    assert [(dict(k.constexprs)["XBLOCK"], k.grid, k.num_warps) for k in gpu_kernels] == \
        [(256, (12,), 4), (kernel_writer.POINTWISE_BLOCK, (3,), 4)]


# ------------------------------------------------------------------ the suite's shapes, planned only
def _plan(fn, shapes, dtype=torch.bfloat16):
    """KernelSources of fn's forward graph at ``shapes``, planned for GPU from fake tensors (nothing runs)."""
    from tilefuse.compiler import scheduler

    return [codegen.generate(st, sched, GPU) for sched in fake_schedules(fn, lambda: [torch.randn(*s, dtype=dtype)
                                                                                       for s in shapes])
            for st in sched.steps if isinstance(st, scheduler.KernelGroup)]


def test_suite_rows_keep_their_launch():
    """32768 rows of 4096 bf16 (the compiler suite's residual layer norm): one row a program, 4 warps (32
    elements a thread), the weight and bias loaded after the row sums; a flat pointwise kernel over them keeps
    blocks of 1024 at 4 warps."""
    rows, cols = 32768, 4096
    [norm] = _plan(residual_layer_norm, [(rows, cols), (rows, cols), (cols,), (cols,)])
    assert norm.form == "persistent" and norm.grid == (rows,), (norm.form, norm.grid)
    assert dict(norm.constexprs) == {"XBLOCK": 1, "RBLOCK": cols} and norm.num_warps == 4
    assert not _loads_before_first_sum(norm.source)
    [pw] = _plan(lambda a, c: torch.tanh(a) * c, [(rows, cols), (rows, cols)])
    assert pw.form == "pointwise" and dict(pw.constexprs) == {"XBLOCK": kernel_writer.POINTWISE_BLOCK}
    assert pw.grid == (rows * cols // kernel_writer.POINTWISE_BLOCK,) and pw.num_warps == 4
