"""The compiler's GEMMs: matmuls lowered to ir.Gemm, run by the library GEMM with the graph's pointwise tail
fused into its epilogue as a generated hook (scheduler.fuse_epilogues, codegen/gemm_epilogue.py).

Every case runs compiled against eager and a float64 reference (tests/compiler_checks.check_function: outputs
and, for training cases, every input's gradient), then checks what the compiler made of it from the graph
reports: which GEMM kernels fused which ATen nodes, and that no matmul stayed an ATen call where a kernel was
chosen. CPU interpreter, float32 and float16 (and bfloat16 for Linear + GeLU: tilefuse.kernels._interpreter
widens the interpreter's bf16 dot to float32), sizes <= 129."""
from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F

from tilefuse.compiler import records
from tilefuse.compiler.lowering import gemm as lowering_gemm

from tests import compiler_checks as cc
from tests.support import noncontiguous, record_instances, transposed_copy

MATMUL_OPS = ("aten.mm", "aten.addmm", "aten.bmm", "aten.baddbmm")


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _reports():
    return list(records.REPORTS)


def gemm_kernels(kind: str | None = None) -> list:
    return [k for g in _reports() if kind is None or g.kind == kind for k in g.kernels if k.form.startswith("gemm")]


def matmul_externs() -> list:
    return [(node, op, note) for g in _reports() for node, op, _reason, note in g.externs
            if any(op.startswith(m) for m in MATMUL_OPS)]


def assert_fused(what: str, *ops: str, kind: str | None = None) -> None:
    """A GEMM kernel with an epilogue fuses every one of ``ops`` (ATen op names) in graphs of ``kind``, and no
    matmul ran as an ATen call."""
    fused = [k for k in gemm_kernels(kind) if k.form == "gemm+epilogue"]
    assert fused, f"{what}: no GEMM with a fused epilogue; kernels {[k.name for g in _reports() for k in g.kernels]}"
    names = " ".join(f for k in fused for f in k.fuses)
    missing = [op for op in ops if op not in names]
    assert not missing, f"{what}: the GEMM epilogues fuse {names}, not {missing}"
    assert not matmul_externs(), f"{what}: matmuls ran in ATen: {matmul_externs()}"


def t(*shape, dtype=torch.float32, grad=False):
    x = torch.randn(*shape, dtype=dtype)
    return x.requires_grad_() if grad else x


def gelu_tanh(x):
    return F.gelu(x, approximate="tanh")


# ------------------------------------------------------------------------------ epilogue forms
OTHER = {torch.float32: torch.float16, torch.float16: torch.float32, torch.float64: torch.float16}  # float64: the reference
EPILOGUES = {
    "bias": (lambda x, w, b, r: F.linear(x, w, b), ("addmm",)),
    "gelu": (lambda x, w, b, r: F.gelu(F.linear(x, w, b)), ("erf",)),
    "gelu_tanh": (lambda x, w, b, r: gelu_tanh(x @ w.t() + b), ("tanh",)),
    "silu": (lambda x, w, b, r: F.silu(x @ w.t()), ("sigmoid",)),
    "relu": (lambda x, w, b, r: torch.relu(F.linear(x, w, b)), ("relu",)),
    "relu_squared": (lambda x, w, b, r: torch.relu(x @ w.t()).square(), ("relu", "pow")),
    "residual": (lambda x, w, b, r: F.linear(x, w, b) + r, ("add",)),
    "scale_residual": (lambda x, w, b, r: (x @ w.t()) * 0.125 + 2.0 * r, ("mul", "add")),
    "sigmoid_gate": (lambda x, w, b, r: torch.sigmoid(x @ w.t()) * r, ("sigmoid", "mul")),
    "scalar_and_column": (lambda x, w, b, r: torch.relu(x @ w.t()) * r[0, 0] + r[:, :1], ("relu", "mul", "add")),
    "cast": (lambda x, w, b, r: F.linear(x, w, b).to(OTHER[x.dtype]).to(x.dtype) * 1.5, ("_to_copy",)),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("form", sorted(EPILOGUES))
def test_epilogue_forms(form, dtype):
    fn, ops = EPILOGUES[form]
    M, K, N = 7, 33, 19
    args = (t(M, K, dtype=dtype), t(N, K, dtype=dtype), t(N, dtype=dtype), t(M, N, dtype=dtype))
    cc.check_function(fn, *args, what=form, backward=False)
    assert_fused(form, *ops)


def test_several_outputs_from_one_epilogue():
    """The pre-activation (returned too) and the activation from one GEMM epilogue: the hook stores the extra
    output through a slot, the GEMM stores the other."""
    def fn(x, w, b):
        h = F.linear(x, w, b)
        return h, F.gelu(h), torch.tanh(h) * 3.0
    cc.check_function(fn, t(9, 17), t(13, 17), t(13), what="three outputs", backward=False)
    fused = [k for k in gemm_kernels() if k.form == "gemm+epilogue"]
    assert fused and len(fused[0].stores) == 3, f"stores {[k.stores for k in fused]}"
    assert not matmul_externs()


# ------------------------------------------------------------------------------ sizes and layouts
@pytest.mark.parametrize("M,K,N", [(1, 7, 129), (129, 1, 7), (7, 129, 1), (129, 7, 129)])
def test_odd_sizes(M, K, N):
    fn = lambda x, w, b: F.silu(F.linear(x, w, b))  # noqa: E731
    cc.check_function(fn, t(M, K), t(N, K), t(N), what=f"{M}x{K}x{N}", backward=False)
    assert_fused(f"{M}x{K}x{N}", "sigmoid")


LAYOUTS = {
    "a transposed": (lambda a, b: torch.relu(a.t() @ b), lambda: (transposed_copy(torch.randn(7, 33)), t(7, 19))),
    "b transposed": (lambda a, b: torch.relu(a @ b.t()), lambda: (t(7, 33), t(19, 33))),
    "both transposed": (lambda a, b: torch.relu(a.t() @ b.t()), lambda: (t(33, 7), t(19, 33))),
    "sliced columns": (lambda a, b: torch.relu(a[:, 1:34] @ b[2:]), lambda: (t(7, 40), t(35, 19))),
    "every other row": (lambda a, b: torch.relu(a[::2] @ b), lambda: (t(13, 33), t(33, 19))),
    "noncontiguous": (lambda a, b: torch.relu(a @ b), lambda: (noncontiguous(torch.randn(7, 33)), t(33, 19))),
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_transposed_and_sliced_operands(layout):
    fn, make = LAYOUTS[layout]
    cc.check_function(fn, *make(), what=layout, backward=False)
    assert_fused(layout, "relu")


def test_bmm_and_baddbmm():
    def fn(a, b, c):
        return torch.softmax(torch.baddbmm(c, a, b, beta=0.5, alpha=2.0), -1) @ b.transpose(1, 2)
    cc.check_function(fn, t(3, 7, 16, grad=True), t(3, 16, 9, grad=True), t(3, 7, 9, grad=True), what="bmm")
    assert gemm_kernels("forward") and not matmul_externs(), matmul_externs()


def test_dynamic_m():
    """Batch x sequence changes: one compiled graph, planned per size; every size is right."""
    w, b = t(19, 33), t(19)
    fn = lambda x, w, b: F.gelu(F.linear(x, w, b))  # noqa: E731
    cfn = cc.compiled(fn, dynamic=True)
    cc.reset()
    for m in (5, 9, 17):
        x = t(m, 33)
        cc.assert_matches(f"M={m}", cfn(x, w, b), fn(x, w, b), fn(x.double(), w.double(), b.double()))
    assert_fused("dynamic M", "erf")


# ------------------------------------------------------------------------------ models: forward and backward
# bf16 too: the interpreter's bf16 dot is widened to fp32 (tilefuse.kernels._interpreter), so the library GEMM
# is right there as well
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"])
def test_linear_bias_gelu_training(dtype):
    def fn(x, w, b):
        return F.gelu(F.linear(x, w, b))
    cc.check_function(fn, t(9, 33, dtype=dtype, grad=True), t(17, 33, dtype=dtype, grad=True),
                      t(17, dtype=dtype, grad=True), what="linear+gelu")
    assert_fused("linear+gelu forward", "addmm", "erf", kind="forward")
    # the backward's grad @ W and x^T @ grad run on the library GEMM, read through strides
    assert len(gemm_kernels("backward")) >= 2, [k.name for k in gemm_kernels("backward")]


def swiglu(x, w1, w3, w2):
    return (F.silu(x @ w1.t()) * (x @ w3.t())) @ w2.t()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_swiglu_ffn(dtype):
    args = (t(7, 16, dtype=dtype, grad=True), t(24, 16, dtype=dtype, grad=True), t(24, 16, dtype=dtype, grad=True),
            t(16, 24, dtype=dtype, grad=True))
    cc.check_function(swiglu, *args, what="swiglu")
    assert_fused("swiglu forward", "sigmoid", "mul", kind="forward")


class Block(torch.nn.Module):
    """A transformer block's projections: q, k, v and o around attention, and an MLP, with residuals."""

    def __init__(self, d=32, heads=4):
        super().__init__()
        self.heads = heads
        # no bias on k: softmax is invariant to it, so its gradient is 0 and has no relative error to check
        self.q, self.k, self.v, self.o = (torch.nn.Linear(d, d, bias=(n != "k")) for n in "qkvo")
        self.norm = torch.nn.LayerNorm(d)
        self.up, self.down = torch.nn.Linear(d, 2 * d), torch.nn.Linear(2 * d, d)

    def forward(self, x):
        B, S, D = x.shape
        h = self.norm(x)
        q, k, v = (p(h).view(B, S, self.heads, -1).transpose(1, 2) for p in (self.q, self.k, self.v))
        att = torch.softmax(q @ k.transpose(-1, -2) * (q.shape[-1] ** -0.5), -1) @ v
        x = x + self.o(att.transpose(1, 2).reshape(B, S, D))
        return x + self.down(F.gelu(self.up(x)))


def test_transformer_block_projections():
    torch.manual_seed(0)
    block = Block()
    x = t(2, 7, 32, grad=True)
    params = dict(block.named_parameters())

    def fn(x, *ps):
        return torch.func.functional_call(block, dict(zip(params, ps)), (x,))
    cc.check_function(fn, x, *[p.detach().clone().requires_grad_() for p in params.values()], what="block")
    assert_fused("block forward", "add", kind="forward")


# ------------------------------------------------------------------------------ explain and fallbacks
def test_explain_shows_gemm_kernels_and_the_reason_for_an_aten_matmul():
    def fn(x, w, y, v):
        return F.gelu(x @ w) + 1.0, (y @ v) * 2.0
    x, w = t(7, 9), t(9, 5)
    y, v = torch.randn(7, 9, dtype=torch.float64), torch.randn(9, 5, dtype=torch.float64)
    import tilefuse

    text = str(tilefuse.explain(fn, x, w, y, v))
    assert "gemm+epilogue" in text and "aten.mm" in text, text
    assert "the library GEMM takes float16/bfloat16/float32" in text, text  # the float64 matmul's reason
    assert text.count("\n  extern ") == 1, text


def test_switch_off_keeps_matmuls_in_aten(monkeypatch):
    monkeypatch.setitem(lowering_gemm.GEMM, "enabled", False)
    fn = lambda x, w: torch.relu(x @ w)  # noqa: E731
    cc.check_function(fn, t(7, 9), t(9, 5), what="off", backward=False)
    assert not gemm_kernels() and matmul_externs() and "GEMM lowering is off" in matmul_externs()[0][2]


@pytest.mark.parametrize("k", [1, 3])
def test_a_one_element_output_of_a_one_by_one_product(k):
    """(1, k) @ (k, 1) and its amax, a 0-d output read at the tile's one element, fused into the GEMM's epilogue:
    the hook stores it at a tile of addresses (a scalar address failed in Triton), forward and backward against
    float64 (found by the fuzzer)."""
    a, b = torch.randn(1, k, requires_grad=True), torch.randn(k, 1)
    a64 = a.detach().double().requires_grad_()
    ref = (a64 @ b.double()).amax()
    ref.backward()
    cc.reset()
    with cc.strict():
        out = cc.compiled(lambda a, b: (a @ b).amax())(a, b)
        out.backward()
    cc.assert_matches("amax", out, ref.float(), ref)
    cc.assert_matches("a.grad", a.grad, a64.grad.float(), a64.grad)


def test_a_one_row_product_viewed_with_a_unit_dim_fuses_its_tail():
    """GPT-2's decode step: Conv1D's addmm on one token ((1, 768) @ (768, 3072)) viewed as (1, 1, 3072) and read by
    the tanh GeLU spelled out. The view's unit dimension makes the tail read the product at (0, k1), the tile's own
    element since k0 is always 0: the tail runs in the GEMM's epilogue (it was a kernel of its own, and the GEMM
    a cuBLAS call). At two rows it fuses as before; a one-row product read at another column (flipped) still
    does not."""
    def mlp_in(x, w, b):
        h = torch.addmm(b, x.view(-1, x.shape[-1]), w).view(*x.shape[:-1], w.shape[-1])
        return 0.5 * h * (1 + torch.tanh(0.7978845608 * (h + 0.044715 * torch.pow(h, 3))))

    for rows in (1, 2):
        cc.check_function(mlp_in, t(1, rows, 9), t(9, 13), t(13),
                          what=f"decode mlp {rows} row(s)", backward=False)
        assert_fused(f"{rows} row(s)", "aten.addmm", "aten.tanh", "aten.pow", kind="inference")
    cc.check_function(lambda x, w: torch.relu(torch.flip(x @ w, [-1])) + 1.0, t(1, 1, 9), t(9, 3),
                      what="a one-row product flipped", backward=False)
    assert gemm_kernels() and not [k for k in gemm_kernels() if k.form == "gemm+epilogue"]


def test_epilogue_legality_declines_a_transposed_read():
    """A consumer that reads the product transposed cannot run in the tile's epilogue: the GEMM stores its
    output and the consumer is its own kernel (and the result is still right)."""
    fn = lambda x, w: torch.relu(x @ w).t() + torch.ones(5, 7)  # noqa: E731
    cc.check_function(fn, t(7, 9), t(9, 5), what="transposed read", backward=False)
    assert gemm_kernels() and not matmul_externs()


def test_epilogue_choice_is_the_fused_template_on_the_interpreter():
    from tilefuse.kernels.gemm import fusion_choice

    assert fusion_choice.epilogue_choice((7, 9), (9, 1), (9, 5), (5, 1), torch.float32, 0) == "fused"
    assert [fusion_choice.m_class(m) for m in (1, 16, 17, 8192, 8193)] == [16, 16, 32, 8192, 16384]


def test_a_split_must_save_a_launch_of_gpu_time():
    """cuBLAS + a separate epilogue kernel is chosen only when it saves more GPU time than the tie and at least the
    host time of the launch it adds; anything closer, and a tie, goes to the fused template."""
    from tilefuse.kernels.gemm import fusion_choice as fc
    from tilefuse.kernels.gemm.tuning import TUNE_TIE

    assert not fc.split_wins(9.3, 9.3)
    assert not fc.split_wins(9.3, 9.1)  # GPT-2 decode's QKV projection: 0.2 us is not worth a launch
    assert not fc.split_wins(9.3, 9.3 - fc.SPLIT_MIN_SAVING_US + 0.1)
    assert fc.split_wins(9.3 + fc.SPLIT_MIN_SAVING_US, 9.3)
    assert not fc.split_wins(2000.0, 2000.0 / TUNE_TIE + 0.5)  # within the tie, though 10 us faster
    assert fc.split_wins(2000.0, 1900.0)


class _FakeClock:
    """The GPU's clock for _gpu_ms on the CPU: a sleep advances it by its cycles at 2 GHz, a queued call by
    ``call_ms``, and the host spends ``host_ms`` queuing each call (a perf_counter that the calls move)."""

    def __init__(self, call_ms, host_ms):
        self.gpu, self.host, self.call_ms, self.host_ms = 0.0, 0.0, call_ms, host_ms

    def call(self):
        self.gpu += self.call_ms
        self.host += self.host_ms / 1e3

    def event(self, **_):
        clock = self

        class Event:
            def record(self, stream=None):
                self.at = clock.gpu

            def synchronize(self):
                pass

            def elapsed_time(self, other):
                return other.at - self.at

        return Event()


@pytest.mark.parametrize("host_ms", [0.01, 0.5], ids=["queued_in_time", "host_slower_than_the_sleep"])
def test_gpu_time_is_a_queued_calls_time_unless_the_host_lags(monkeypatch, host_ms):
    """_gpu_ms divides the GPU time of calls queued behind a sleep by their count; when queuing them took the
    host longer than the sleep lasted, the GPU waited for the host, and it times with do_bench instead."""
    import time

    from tilefuse.kernels.gemm import fusion_choice as fc

    clock = _FakeClock(call_ms=0.004, host_ms=host_ms)
    sleep_ms = fc.QUEUE_SLEEP_CYCLES / 2e9 * 1e3  # 4 ms
    stream = type("S", (), {"synchronize": lambda self: None, "device": torch.device("cuda", 0)})()
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: stream)
    monkeypatch.setattr(torch.cuda, "device", lambda dev: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "Event", clock.event)
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: setattr(clock, "gpu", clock.gpu + cycles / 2e6))
    monkeypatch.setattr(time, "perf_counter", lambda: clock.host)
    monkeypatch.setattr(fc, "_time", lambda fn, best: 0.123)
    ms, how = fc._gpu_ms(clock.call)
    if host_ms * fc.QUEUED_CALLS < sleep_ms:
        assert (how, round(ms, 9)) == ("queued behind a sleep", 0.004)
    else:
        assert (how, ms) == ("do_bench", 0.123)


@pytest.mark.gpu
def test_epilogue_choice_on_a_gpu_is_timed_and_cached(tmp_path):
    """On a GPU the tuner times the fused template against cuBLAS + a separate epilogue pass once per
    (shape class, dtype, layout, epilogue size), on the GPU's clock (calls queued behind a sleep), and stores the
    decision on disk; the decision follows ``split_wins`` on the times it stored. At a decode shape (one row),
    where the GEMM takes ~9 us, no split can save a launch's worth: the template."""
    import json

    from tilefuse import config
    from tilefuse.kernels.gemm import fusion_choice

    with config.override(cache_dir=tmp_path, autotune=True):
        fusion_choice._epilogue_memo.clear()
        shape = ((4096, 4096), (4096, 1), (4096, 4096), (4096, 1))
        first = fusion_choice.epilogue_choice(*shape, torch.bfloat16, 4096 * 2)
        files = list((tmp_path / "tuning" / "gemm_epilogue").glob("*.json"))
        assert len(files) == 1
        data = json.loads(files[0].read_text())
        assert data["timed_by"] == {"fused": "queued behind a sleep", "split": "queued behind a sleep"}
        fused_us, split_us = (data["ms"][k] * 1e3 for k in ("fused", "split"))
        assert first == ("split" if fusion_choice.split_wins(fused_us, split_us) else "fused")
        assert 0 < fused_us < 5e3 and 0 < split_us < 5e3  # a 4096^3 bf16 GEMM: ~0.2-0.3 ms on an H100
        fusion_choice._epilogue_memo.clear()
        assert fusion_choice.epilogue_choice(*shape, torch.bfloat16, 4096 * 2) == first  # from disk
        decode = ((1, 768), (768, 1), (768, 2304), (2304, 1))
        assert fusion_choice.epilogue_choice(*decode, torch.bfloat16, 2304 * 2) == "fused"



@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_gemm_graphs_on_the_gpu(dtype):
    """Linear + bias + GeLU and a SwiGLU FFN, forward and backward, at a GPU size: right against float32, and
    every matmul on a tilefuse GEMM (the fused template or, where the tuner chose it, cuBLAS + the tail's own
    kernel)."""
    dev = "cuda"

    def g(*shape):
        return (torch.randn(*shape, device=dev, dtype=dtype) * shape[-1] ** -0.5).requires_grad_()
    cc.check_function(lambda x, w, b: F.gelu(F.linear(x, w, b)), g(1000, 512), g(1536, 512), g(1536),
                      what="linear+gelu gpu")
    assert gemm_kernels("forward") and not matmul_externs(), matmul_externs()
    cc.check_function(swiglu, g(1000, 512), g(1536, 512), g(1536, 512), g(512, 1536), what="swiglu gpu")
    assert gemm_kernels("backward") and not matmul_externs(), matmul_externs()


@pytest.mark.gpu
def test_gpu_a_language_model_head_with_an_odd_vocabulary_runs_its_gemms_on_aligned_copies(monkeypatch):
    """GPT-2's head at batch 1 (512 tokens, 768 wide, a vocabulary of 50257: rows 100514 bytes apart) and its
    loss, forward and backward in bf16: right against float32, and each of its GEMMs (the logits, their two
    gradients) a site that decision 048 routes to the library (at least one with an aligned copy)."""
    from tilefuse.compiler.runtime import gemm as runtime_gemm

    sites = record_instances(monkeypatch, runtime_gemm.GemmSite)

    def g(*shape):
        return (torch.randn(*shape, device="cuda", dtype=torch.bfloat16) * shape[-1] ** -0.5).requires_grad_()

    def head(h, w, target):
        return F.cross_entropy((h @ w.t()).float(), target)

    cc.check_function(head, g(512, 768), g(50257, 768), torch.randint(0, 50257, (512,), device="cuda"),
                      what="odd-vocabulary head gpu")
    routed = [s.pad for s in sites if s.pad not in (False, None)]
    assert len(routed) >= 3 and any(any(p) for p in routed), [s.pad for s in sites]


def test_explain_says_why_a_consumer_was_not_fused():
    import tilefuse

    fn = lambda x, w: torch.relu(x @ w).t() + torch.ones(5, 7)  # noqa: E731
    text = str(tilefuse.explain(fn, t(7, 9), t(9, 5)))
    assert "not fused: " in text and "at another element" in text, text


def test_generated_hooks_cross_compile_for_sm90a_and_gfx942():
    """tests/compile_only/gemm_hook_checks.py in a child that is not on the interpreter: the hooks the compiler
    writes for the bench's Linear+GeLU and SwiGLU graphs build inside the library GEMM for both vendors."""
    import os
    import re
    import subprocess
    import sys
    from pathlib import Path

    here = Path(__file__).resolve().parents[1]  # tests/
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TILEFUSE_INTERPRET="0", PYTHONPATH=str(here.parent))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(here / "compile_only" / "gemm_hook_checks.py")],
                          capture_output=True, text=True, env=env, cwd=here.parent, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert re.search(r"\b4 passed", proc.stdout) and "failed" not in proc.stdout, proc.stdout[-2000:]


def test_split_choice_leaves_the_tail_to_its_own_kernel(monkeypatch):
    """Where the tuner chooses cuBLAS + a separate epilogue kernel (a GPU decision, forced here), the GEMM runs
    alone and its tail is an ordinary generated kernel; the result is the same and explain says why."""
    from tilefuse.kernels.gemm import fusion_choice

    monkeypatch.setattr(fusion_choice, "epilogue_choice", lambda *a, **k: "split")
    fn = lambda x, w, b: F.gelu(F.linear(x, w, b))  # noqa: E731
    cc.check_function(fn, t(7, 33, grad=True), t(19, 33, grad=True), t(19, grad=True), what="split")
    assert gemm_kernels() and not [k for k in gemm_kernels() if k.form == "gemm+epilogue"]
    assert any("tuner chose cuBLAS" in k.name for k in gemm_kernels()), [k.name for k in gemm_kernels()]


GEMM_OPINFO = ("mm", "addmm", "bmm", "baddbmm", "matmul", "nn.functional.linear")
OPINFO_PER_OP = 6  # samples an op at most (CI time: ~1 s a sample on the interpreter); all of them pass


def _opinfo_samples():
    from . import test_compiler_opinfo as coverage  # loads op_db (with its expecttest stand-in)

    out = []
    for op in coverage.OP_DB:
        if op.name in GEMM_OPINFO and not op.variant_test_name:
            samples = list(op.sample_inputs("cpu", torch.float32, requires_grad=True))
            step = -(-len(samples) // OPINFO_PER_OP)  # every step-th: matmul's 15 and linear's 18 forms, spread
            for k in range(0, len(samples), step):
                out.append(pytest.param(op, samples[k], id=f"{op.name}-{k}"))
    return out


@pytest.mark.parametrize("op,sample", _opinfo_samples())
def test_opinfo_matmul_samples(op, sample):
    """PyTorch's own OpInfo samples of the matmul ops (broadcast batches, 1-D operands, empty dims, transposed
    strides, alpha/beta), forward and backward in strict mode: a GEMM the library takes, or an ATen call by
    design with a note; never a wrong answer."""
    kwargs = sample.kwargs
    magnitude = {k: abs(v) if isinstance(v, (int, float)) else v for k, v in kwargs.items()}

    def fn(*args):
        return op(*args, **kwargs)

    def magnitude_fn(*args):  # (every matmul op is multilinear: alpha and beta enter as factors)
        return op(*args, **magnitude)
    cc.check_function(fn, sample.input, *sample.args, what=op.name, magnitude_fn=magnitude_fn)


# ------------------------------------------------------------------------------ the GEMM sites' replays
def test_a_gemm_site_replays_its_plan_and_takes_the_library_call_where_the_plan_may_not_hold(monkeypatch):
    """A compiled graph's GEMM step keeps the plan of its first call and replays it (no signature built, no
    overlap check); an input at another alignment, or a change of the settings, goes through the library's call
    again. Every call gives eager's result, with the output poisoned before."""
    from tilefuse import config as tf_config
    from tilefuse.compiler.runtime import gemm as runtime_gemm
    from tilefuse.kernels.gemm import plan as gemm_plan

    calls = []
    real = gemm_plan.gemm_with_epilogue
    monkeypatch.setattr(gemm_plan, "gemm_with_epilogue", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    sites = record_instances(monkeypatch, runtime_gemm.GemmSite)
    fn = lambda x, w, b: F.gelu(F.linear(x, w, b)) * 0.5  # noqa: E731
    compiled = torch.compile(fn, backend="tilefuse")
    w, b = t(33, 19), t(33)

    def check(x):
        want = fn(x.double(), w.double(), b.double())
        got = compiled(x, w, b)
        assert (got - want).abs().max().item() <= 1e-4 * want.abs().max().item() + 1e-5

    base = torch.randn(7 * 19 + 1)
    check(base[:133].view(7, 19))
    (site,) = sites
    assert site.plan is not None and len(calls) == 1, (site.plan, calls)
    for _ in range(3):
        check(torch.randn(7, 19))
    assert len(calls) == 1, "a repeat call went through the library's call"
    check(base[1:].view(7, 19))  # 4 bytes off 16: the kept plan's signature does not hold
    assert len(calls) == 2
    check(torch.randn(7, 19))
    assert len(calls) == 3  # (the site kept the odd call's plan; an aligned input is another signature)
    with tf_config.override(debug=tf_config.get().debug):  # new settings: the plans are dropped
        check(torch.randn(7, 19))
    assert len(calls) == 4


def test_the_same_tail_of_two_gemm_steps_is_one_hook():
    """Two GEMM steps with the same epilogue (bias + tanh), at other widths: one hook, whose source names no node
    of the graph (so one Triton compile and one tuning decision a shape; decision 043); both outputs right."""
    fn = lambda x, w1, b1, w2, b2: (torch.tanh(F.linear(x, w1, b1)), torch.tanh(F.linear(x, w2, b2)))  # noqa: E731
    cc.check_function(fn, t(7, 33), t(19, 33), t(19), t(65, 33), t(65), what="two tails", backward=False)
    fused = [k for k in gemm_kernels() if k.form == "gemm+epilogue"]
    assert len(fused) == 2, [k.name for k in fused]
    hooks = {k.name.split(" + epilogue ")[1].split(" ")[0] for k in fused}
    assert len(hooks) == 1, hooks
    source = open(fused[0].path).read()
    steps = [k.name.split(" ")[1] for k in fused]
    assert not any(step in source for step in steps), source


# ------------------------------------------------------------------------------ misaligned rows: an aligned copy
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("form", ["rows", "columns", "batched", "batched columns"])
def test_aligned_copy_keeps_values_shape_and_order_with_rows_on_16_bytes(dtype, form):
    from tilefuse.compiler.runtime import gemm as runtime_gemm

    src = {"rows": lambda: torch.randn(7, 13), "columns": lambda: torch.randn(13, 7).t(),
           "batched": lambda: torch.randn(3, 5, 13)[:, :, :11],
           "batched columns": lambda: torch.randn(3, 11, 5).transpose(1, 2)}[form]().to(dtype)
    assert runtime_gemm._misaligned(src)
    got = runtime_gemm.aligned_copy(src)
    assert got.shape == src.shape and torch.equal(got, src)
    assert not runtime_gemm._misaligned(got), got.stride()
    order = lambda x: sorted(range(x.dim()), key=lambda d: -x.stride(d))  # noqa: E731
    assert order(got) == order(src), (got.stride(), src.stride())
    assert got.data_ptr() != src.data_ptr()


def test_a_gemm_site_runs_a_big_misaligned_gemm_on_the_library_with_aligned_copies(monkeypatch):
    """A GEMM whose rows are not on 16 bytes (a vocabulary of 50257: a language model's head) runs on the
    library's GEMM with its misaligned operands copied to aligned rows, and the output written in place: the
    float64 product, with the output poisoned before. Below PAD_MIN_VOLUME nothing is copied."""
    from tilefuse.compiler.runtime import gemm as runtime_gemm

    copies = []
    real_copy = runtime_gemm.aligned_copy
    monkeypatch.setattr(runtime_gemm, "aligned_copy", lambda x: (copies.append(tuple(x.shape)), real_copy(x))[1])
    a = torch.randn(9, 14)[:, :13]  # rows 56 bytes apart
    b = torch.randn(11, 13).t()  # columns 52 bytes apart
    want = a.double() @ b.double()

    site = runtime_gemm.GemmSite(None, store_out=True)
    out = torch.full((9, 11), float("nan"))
    site(a, b, (), out)
    assert site.pad is None and copies == []  # 9 x 11 x 13 multiply-adds: too small to copy
    assert (out.double() - want).abs().max().item() <= 1e-4

    monkeypatch.setattr(runtime_gemm, "PAD_MIN_VOLUME", 1)
    for _ in range(2):  # the decision is kept; the copies are made each call
        site = runtime_gemm.GemmSite(None, store_out=True)
        out = torch.full((9, 11), float("nan"))  # rows 44 bytes apart: written in place
        site(a, b, (), out)
        assert site.pad == (True, True), site.pad
        assert (out.double() - want).abs().max().item() <= 1e-4
    assert copies == [(9, 13), (13, 11)] * 2


@pytest.mark.parametrize("case", ["aligned", "misaligned operand", "misaligned output", "small"])
def test_on_a_gpu_a_gemm_site_without_epilogue_takes_cublas_unless_a_big_gemm_is_misaligned(monkeypatch, case):
    """On a GPU an epilogue-free GEMM is cuBLAS's (torch.matmul) when aligned or small; a big one with a
    misaligned operand or output is the library's (cuBLAS would take its align1 kernels), with aligned copies of
    the misaligned operands only. (The interpreter check patched off, both GEMMs recorded on CPU tensors.)"""
    from tilefuse import device as tf_device
    from tilefuse.compiler.runtime import gemm as runtime_gemm
    from tilefuse.kernels.gemm import plan as gemm_plan

    monkeypatch.setattr(tf_device, "interpreting", lambda: False)
    taken = []
    real_matmul = torch.matmul
    monkeypatch.setattr(torch, "matmul", lambda a, b, out=None: (taken.append("cublas"), real_matmul(a, b, out=out))[1])

    def library(a, b, hook, extras, dtype, out, store_out):
        taken.append(("library", runtime_gemm._misaligned(a), runtime_gemm._misaligned(b)))
        out.copy_(real_matmul(a, b))

    monkeypatch.setattr(gemm_plan, "gemm_with_epilogue", library)
    monkeypatch.setattr(gemm_plan, "epilogue_plan", lambda *a, **k: (None, None))
    if case != "small":
        monkeypatch.setattr(runtime_gemm, "PAD_MIN_VOLUME", 1)
    a = torch.randn(9, 14)[:, :13] if case in ("misaligned operand", "small") else torch.randn(9, 16)
    b = torch.randn(a.shape[1], 11 if case in ("misaligned output", "small") else 12)
    out = torch.full((9, b.shape[1]), float("nan"))
    runtime_gemm.GemmSite(None, store_out=True)(a, b, (), out)
    assert (out.double() - a.double() @ b.double()).abs().max().item() <= 1e-4
    want = {"aligned": ["cublas"], "small": ["cublas"], "misaligned operand": [("library", False, False)],
            "misaligned output": [("library", False, False)]}[case]
    assert taken == want, taken


def test_a_compiled_head_with_an_odd_vocabulary_matches_float64_through_aligned_copies(monkeypatch):
    """A language model's head and loss at a vocabulary of 37 (rows of 148 bytes), forward and backward, with
    every GEMM's misaligned operands copied to aligned rows (PAD_MIN_VOLUME 1): outputs and every gradient
    against float64."""
    from tilefuse.compiler.runtime import gemm as runtime_gemm

    monkeypatch.setattr(runtime_gemm, "PAD_MIN_VOLUME", 1)
    sites = record_instances(monkeypatch, runtime_gemm.GemmSite)

    def head(h, w, target):
        return F.cross_entropy(h @ w.t(), target)

    cc.check_function(head, t(24, 16, grad=True), t(37, 16, grad=True), torch.randint(0, 37, (24,)),
                      what="odd-vocabulary head")
    padded = [s for s in sites if s.pad]
    assert padded, [s.pad for s in sites]
