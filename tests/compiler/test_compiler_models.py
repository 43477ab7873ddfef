"""Whole models through ``torch.compile(..., backend="tilefuse")``, compared with eager forward and backward.

Each compiled result is held to eager fp32 and a float64 copy of the same model (tests/compiler_checks.py's
rule). Strict mode everywhere the graph is in scope, so a fallback to ATen raises rather than passing; the
out-of-scope cases (complex, unusual mutation) run non-strict and must fall back *with a reason* and still give
eager's answer. Also here: dynamic shapes without recompiles, input mutation, returned views, non-contiguous
inputs, the disk cache across processes, TILEFUSE_DEBUG=1 output, explain(), and the entry point in a fresh
process. CPU budget: ≤ 3 minutes (Triton's interpreter).
"""
from __future__ import annotations

import copy
import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from tilefuse import config

from tests import compiler_checks as cc
from tests.support import TOLERANCE, noncontiguous, transposed_copy

REPO = Path(__file__).resolve().parents[2]
SUBPROCESS_TIMEOUT_S = 240


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


# ------------------------------------------------------------------------------------------ helpers
def _leaves(inputs):
    return [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]


def forward_backward(fn, params, inputs, cotangent_seed: int):
    """Output and the gradients of <output, random cotangent> w.r.t. params and grad-requiring inputs."""
    out = fn(*inputs)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    gen = torch.Generator().manual_seed(cotangent_seed)
    cots = [torch.randn(o.shape, generator=gen, dtype=torch.float64).to(device=o.device, dtype=o.dtype) for o in outs]
    wrt = list(params) + _leaves(inputs)
    grads = torch.autograd.grad(outs, wrt, cots, allow_unused=True)
    return out, grads


def check_model(model: nn.Module, inputs: list, *, what: str, strict: bool = True, seed: int = 7):
    """Compiled vs eager vs float64: output and every gradient (parameters and inputs)."""
    ref_model = copy.deepcopy(model).double()
    ref_inputs = cc.upcast(inputs, torch.float64)
    eager_out, eager_grads = forward_backward(model, list(model.parameters()), inputs, seed)
    ref_out, ref_grads = forward_backward(ref_model, list(ref_model.parameters()), ref_inputs, seed)
    cc.reset()
    compiled = cc.compiled(model)
    ctx = cc.strict() if strict else cc.lenient()
    with ctx:
        out, grads = forward_backward(compiled, list(model.parameters()), inputs, seed)
    s = cc.stats()
    assert int(s["graphs"]) >= 1, f"{what}: tilefuse compiled no graph"
    assert cc.Run(s, 1).work >= 1, f"{what}: no kernel and no extern ran"
    cc.assert_matches(f"{what} output", out, eager_out, ref_out)
    names = [n for n, _ in model.named_parameters()] + [f"input{i}" for i, t in enumerate(inputs)
                                                         if isinstance(t, torch.Tensor) and t.requires_grad]
    problems = []
    for name, g, e, r in zip(names, grads, eager_grads, ref_grads):
        assert (g is None) == (e is None), f"{what}: grad of {name}: compiled {g is None=} eager {e is None=}"
        if e is not None:
            p = cc.tensor_problem(f"{what} grad {name}", g, e, r)
            if p:
                problems.append(p)
    assert not problems, "; ".join(problems)
    return s


# -------------------------------------------------------------------------------------------- models
class MLP(nn.Module):
    def __init__(self, d_in=129, hidden=257, d_out=7):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d_in, hidden), nn.Linear(hidden, d_out)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class RMSNorm(nn.Module):
    """Written out (not nn.RMSNorm) so the decomposition seen is pow/mean/rsqrt/mul."""

    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.randn(d) * 0.1 + 1), eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class NormActChain(nn.Module):
    """norm → activation → scale + residual: the memory-bound block the scheduler should fuse."""

    def __init__(self, d, norm: str, act: str):
        super().__init__()
        if norm == "layer_norm":
            self.norm = nn.LayerNorm(d)
            with torch.no_grad():
                self.norm.weight.normal_(1, 0.1)
                self.norm.bias.normal_(0, 0.1)
        elif norm == "rms_norm_module":
            self.norm = nn.RMSNorm(d, eps=1e-6)
            with torch.no_grad():
                self.norm.weight.normal_(1, 0.1)
        else:
            self.norm = RMSNorm(d)
        self.act = {"gelu": nn.GELU(), "gelu_tanh": nn.GELU(approximate="tanh"), "silu": nn.SiLU()}[act]
        self.scale = nn.Parameter(torch.randn(d))

    def forward(self, x):
        return self.act(self.norm(x)) * self.scale + x


class EncoderLayer(nn.Module):
    """A post-norm transformer encoder layer with attention written from primitives (matmul, softmax, ...)."""

    def __init__(self, d=64, heads=4, ff=129):
        super().__init__()
        self.heads = heads
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.ff1, self.ff2 = nn.Linear(d, ff), nn.Linear(ff, d)

    def forward(self, x, pad_mask):
        B, T, D = x.shape
        H = self.heads
        q, k, v = self.qkv(x).split(D, dim=-1)
        q, k, v = (t.reshape(B, T, H, D // H).transpose(1, 2) for t in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(D // H)
        scores = scores.masked_fill(pad_mask[:, None, None, :], float("-inf"))
        attn = scores.softmax(dim=-1)
        y = (attn @ v).transpose(1, 2).reshape(B, T, D)
        x = self.ln1(x + self.proj(y))
        return self.ln2(x + self.ff2(F.gelu(self.ff1(x))))


# --------------------------------------------------------------------------------------------- tests
def test_mlp_forward_backward():
    model = MLP()
    x = torch.randn(33, 129, requires_grad=True)
    check_model(model, [x], what="MLP")


@pytest.mark.parametrize("norm,act", [("layer_norm", "gelu"), ("layer_norm", "silu"), ("rms_norm", "silu"),
                                      ("rms_norm", "gelu_tanh"), ("rms_norm_module", "gelu")])
def test_norm_activation_chain(norm, act):
    d = 1000  # a row longer than one block: the looped reduction form
    model = NormActChain(d, norm, act)
    x = noncontiguous(torch.randn(7, d)).requires_grad_()
    s = check_model(model, [x], what=f"{norm}+{act}")
    assert int(s["kernels"]) + int(s["cache_hits"]) >= 1, f"{norm}+{act}: no tilefuse kernel: {s}"


def test_transformer_encoder_layer():
    model = EncoderLayer()
    x = torch.randn(3, 7, 64, requires_grad=True)
    pad = torch.zeros(3, 7, dtype=torch.bool)
    pad[1, 5:] = True  # one padded sequence: -inf scores that softmax must turn into zero weights
    check_model(model, [x, pad], what="encoder layer")


def test_training_loop_losses_match_eager():
    """A few AdamW steps on a compiled model: every loss and the final weights match eager's."""
    base = nn.Sequential(nn.Linear(33, 65), nn.LayerNorm(65), nn.SiLU(), nn.Linear(65, 5))
    models = {"eager": base, "compiled": copy.deepcopy(base), "ref": copy.deepcopy(base).double()}
    opts = {k: torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.01) for k, m in models.items()}
    data = [(torch.randn(17, 33), torch.randint(0, 5, (17,))) for _ in range(4)]
    cc.reset()
    step_fns = {"eager": models["eager"], "compiled": cc.compiled(models["compiled"]), "ref": models["ref"]}
    losses = {k: [] for k in models}
    for x, y in data:
        for k, fn in step_fns.items():
            xx = x.double() if k == "ref" else x
            with (cc.strict() if k == "compiled" else config.override()):
                loss = F.cross_entropy(fn(xx), y)
                opts[k].zero_grad(set_to_none=True)
                loss.backward()
            opts[k].step()
            losses[k].append(loss.detach())
    assert int(cc.stats()["graphs"]) >= 1, "tilefuse compiled no graph"
    cc.assert_matches("losses", torch.stack(losses["compiled"]), torch.stack(losses["eager"]),
                      torch.stack(losses["ref"]))
    for (name, p), pe, pr in zip(models["compiled"].named_parameters(), models["eager"].parameters(),
                                 models["ref"].parameters()):
        cc.assert_matches(f"weight {name} after {len(data)} steps", p.detach(), pe.detach(), pr.detach())


def _softmax_norm(x, w):
    return F.layer_norm(torch.softmax(x * 2.0, dim=-1), x.shape[-1:], w) + x


def test_dynamic_shapes_marked_dynamic_do_not_recompile():
    """A batch dimension marked dynamic: one graph and one set of kernels serve every batch size."""
    w = torch.randn(129)
    cc.reset()
    fn = cc.compiled(_softmax_norm)
    seen = []
    with cc.strict():
        for rows in (7, 33, 129):  # not 1: Dynamo specializes size-1 dimensions by design
            x = torch.randn(rows, 129)
            torch._dynamo.mark_dynamic(x, 0)
            out = fn(x, w)
            cc.assert_matches(f"rows={rows}", out, _softmax_norm(x, w), _softmax_norm(x.double(), w.double()))
            s = cc.stats()
            seen.append((cc.dynamo_graphs(), int(s["graphs"]), int(s["kernels_compiled"])))
    assert seen[0][1] >= 1, "tilefuse compiled no graph"
    assert seen[1] == seen[0] and seen[2] == seen[0], \
        f"(dynamo graphs, tilefuse graphs, kernels compiled) after rows 7, 33, 129: {seen}: a new size recompiled"


def test_dynamic_shapes_automatic_dynamic():
    """Without marks Dynamo recompiles once on the second size, as dynamic; a third size compiles nothing."""
    w = torch.randn(1000)
    cc.reset()
    fn = cc.compiled(_softmax_norm)
    seen = []
    with cc.strict():
        for rows in (7, 33, 129):
            x = torch.randn(rows, 1000)
            out = fn(x, w)
            cc.assert_matches(f"rows={rows}", out, _softmax_norm(x, w), _softmax_norm(x.double(), w.double()))
            s = cc.stats()
            seen.append((cc.dynamo_graphs(), int(s["graphs"]), int(s["kernels_compiled"])))
    assert seen[2] == seen[1], f"(dynamo graphs, tilefuse graphs, kernels compiled) per size: {seen}: the third " \
                               "size recompiled although the second compiled a dynamic graph"


def test_dynamic_row_length():
    """A dynamic reduction length (the softmax row) gives right answers at every length without a new graph."""
    cc.reset()
    fn = cc.compiled(lambda x: torch.log_softmax(x, -1).sum(-1))
    with cc.strict():
        counts = []
        for cols in (129, 1000, 7):
            x = torch.randn(5, cols)
            torch._dynamo.mark_dynamic(x, 1)
            cc.assert_matches(f"cols={cols}", fn(x), torch.log_softmax(x, -1).sum(-1),
                              torch.log_softmax(x.double(), -1).sum(-1))
            counts.append((cc.dynamo_graphs(), int(cc.stats()["graphs"])))
    assert counts[0] == counts[1] == counts[2], f"(dynamo graphs, tilefuse graphs) per row length: {counts}"


# ------------------------------------------------------------------------------------------ mutation
def _mutation_cases():
    def add_into(x, buf):
        buf.add_(x)
        return (buf * 2).sum(-1)

    def copy_into(x, y):
        x.copy_(y.sin())
        return x + 1

    def mutate_slice(x, y):
        x[:, 1:4].mul_(2)
        return (x * y).sum(-1)  # row sums: one sum of all 903 products can cancel to ~1e-4, where float32's own
        # rounding is ~1 % of it and no tolerance tells a right answer from a wrong one

    def mutate_twice(x, y):
        x.mul_(y)
        x.add_(1)
        return x.sum(0)

    # The write into x must wait for every step that reads the old x, not only those of the kernel it joins:
    # a GEMM and an extern that read x between the kernel that could take the write and the write itself (both
    # failed before the scheduler kept that order); a column sum whose kernel may take the write, as it reads
    # each element where the write stores it.
    def mutate_after_a_matmul(x, y):
        a = x * 2
        p = x @ y.t()
        x.add_(1)
        return a, p

    def mutate_after_a_column_sum(x, y):
        a = x * y
        s = x.sum(0)
        x.mul_(3)
        return a, s

    def mutate_after_an_extern(x, y):
        a = x + y
        v = torch.cdist(x, y)  # an ATen call by design (an extern step)
        x.sub_(2)
        return a, v

    return {"add_into": add_into, "copy_into": copy_into, "mutate_slice": mutate_slice, "mutate_twice": mutate_twice,
            "mutate_after_a_matmul": mutate_after_a_matmul, "mutate_after_a_column_sum": mutate_after_a_column_sum,
            "mutate_after_an_extern": mutate_after_an_extern}


@pytest.mark.parametrize("layout", ["contiguous", "noncontiguous", "transposed"])
@pytest.mark.parametrize("case", list(_mutation_cases()))
def test_input_mutation_written_back(case, layout):
    fn = _mutation_cases()[case]
    make = {"contiguous": lambda t: t, "noncontiguous": noncontiguous, "transposed": transposed_copy}[layout]
    x, y = torch.randn(7, 129), torch.randn(7, 129)
    if case == "add_into":
        x = torch.randn(129)  # broadcast into the mutated buffer
    lay = lambda t: make(t) if t.dim() == 2 else t  # noqa: E731  (the broadcast 1-D operand stays as it is)
    eager_args = [lay(x.clone()), lay(y.clone())]
    args = [lay(x.clone()), lay(y.clone())]
    ref_args = [lay(x.double()), lay(y.double())]
    expected = fn(*eager_args)
    ref = fn(*ref_args)
    cc.reset()
    with cc.strict():
        out = cc.compiled(fn)(*args)
    assert int(cc.stats()["graphs"]) >= 1, "tilefuse compiled no graph"
    cc.assert_matches(f"{case} output", out, expected, ref)
    for i, (a, e, r) in enumerate(zip(args, eager_args, ref_args)):
        cc.assert_matches(f"{case} input {i} after the call", a, e, r)
        assert a.stride() == e.stride(), f"{case}: input {i} strides changed: {a.stride()} vs {e.stride()}"


def test_buffer_mutation_in_training():
    """A module that updates a running statistic in forward (BatchNorm-style) while training through it."""

    class Running(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(129, 129)
            self.register_buffer("running_mean", torch.zeros(129))

        def forward(self, x):
            h = self.lin(x)
            with torch.no_grad():
                self.running_mean.mul_(0.9).add_(h.mean(0) * 0.1)
            return F.silu(h - self.running_mean)

    eager = Running()
    model = copy.deepcopy(eager)
    ref_model = copy.deepcopy(eager).double()
    x = torch.randn(7, 129, requires_grad=True)
    x_ref = x.detach().double().requires_grad_()
    cc.reset()
    compiled = cc.compiled(model)
    for step in range(2):
        e_out, e_grads = forward_backward(eager, list(eager.parameters()), [x], step)
        r_out, r_grads = forward_backward(ref_model, list(ref_model.parameters()), [x_ref], step)
        with cc.strict():
            out, grads = forward_backward(compiled, list(model.parameters()), [x], step)
        cc.assert_matches(f"step {step} output", out, e_out, r_out)
        cc.assert_matches(f"step {step} running_mean", model.running_mean, eager.running_mean,
                          ref_model.running_mean)
        for i, (g, e, r) in enumerate(zip(grads, e_grads, r_grads)):
            cc.assert_matches(f"step {step} grad {i}", g, e, r)


def _unusual_mutations():
    def aliased_inputs(a, b):  # a and b overlap in one storage; mutating a changes b
        a.add_(1)
        return b * 2

    def metadata_mutation(x):
        x.t_()
        return x + 1

    def mutate_then_view(x):
        v = x.view(-1)
        v[::3].zero_()
        return x.sum(-1), v

    return {"aliased_inputs": aliased_inputs, "metadata_mutation": metadata_mutation,
            "mutate_then_view": mutate_then_view}


@pytest.mark.parametrize("case", list(_unusual_mutations()))
def test_unusual_mutation_is_right_or_falls_back_with_reason(case):
    """Mutation patterns a backend may not handle: outside strict mode the answer (outputs and inputs after the
    call) must be eager's, and any fallback must carry a reason."""
    fn = _unusual_mutations()[case]

    data = torch.randn(12) if case == "aliased_inputs" else torch.randn(7, 9)

    def make():
        base = data.clone()
        return ([base[0:8], base[4:12]] if case == "aliased_inputs" else [base]), base

    (eager_args, eager_base), (args, base) = make(), make()
    expected = fn(*eager_args)
    data = data.double()
    ref_args, ref_base = make()
    ref = fn(*ref_args)
    cc.reset()
    with cc.lenient():
        out = cc.compiled(fn)(*args)
    cc.assert_matches(f"{case} output", out, expected, ref)
    cc.assert_matches(f"{case} storage after the call", base, eager_base, ref_base)
    for i, (a, e) in enumerate(zip(args, eager_args)):
        assert a.shape == e.shape and a.stride() == e.stride(), \
            f"{case}: input {i} is {tuple(a.shape)}/{a.stride()} after the call, eager's {tuple(e.shape)}/{e.stride()}"
    for node, reason in cc.stats()["fallbacks"]:
        assert str(reason).strip(), f"{case}: fallback of {node} without a reason"


def test_returned_views_and_aliases():
    """Outputs that are views of inputs stay views of them (writes show through); outputs that alias each other
    (a view of an intermediate) still share storage; fresh outputs are fresh."""

    def fn(x):
        y = x * 2
        return x.view(-1), x.t(), x[1:, 2:], y, y.view(-1)[3:10], x.unsqueeze(0).expand(3, -1, -1)

    x_e = torch.randn(7, 9)
    x_c = x_e.clone()
    expected = fn(x_e)
    cc.reset()
    with cc.strict():
        out = cc.compiled(fn)(x_c)
    assert int(cc.stats()["graphs"]) >= 1, "tilefuse compiled no graph"
    cc.assert_matches("outputs", out, expected)
    problems = cc.alias_problems("out", out, expected, [x_c], eager_inputs=[x_e])
    assert not problems, "; ".join(problems)
    assert cc.storage_ptr(out[4]) == cc.storage_ptr(out[3]), "y.view(...) no longer shares y's storage"
    assert cc.storage_ptr(out[3]) != cc.storage_ptr(x_c), "y = x * 2 aliases x"
    out[0][0] = 123.0
    assert x_c[0, 0] == 123.0, "writing into the returned view did not reach the input"
    out[3][0, 0] = -5.0
    assert out[4].storage_offset() == expected[4].storage_offset()
    assert out[3].view(-1)[3] == out[4][0], "the two aliased outputs diverged"


@pytest.mark.parametrize("layout", ["transposed", "noncontiguous", "expanded", "offset_slice"])
def test_noncontiguous_inputs(layout):
    """A pointwise + reduction graph on strided operands, forward and backward."""

    def fn(x, b):
        h = torch.tanh(x * 1.5 + b)
        return h - h.mean(-1, keepdim=True), (h * h).sum(0)

    base = torch.randn(129, 33)
    x = {"transposed": lambda: transposed_copy(base),
         "noncontiguous": lambda: noncontiguous(base),
         "expanded": lambda: torch.randn(1, 33).expand(129, 33),
         "offset_slice": lambda: torch.randn(131, 40)[1:130, 3:36]}[layout]()
    assert not x.is_contiguous()
    x = x.detach().requires_grad_() if layout != "expanded" else x
    b = torch.randn(33, requires_grad=True)
    inputs = [x, b]
    eager_out, eager_grads = forward_backward(fn, [], inputs, 3)
    ref_out, ref_grads = forward_backward(fn, [], cc.upcast(inputs, torch.float64), 3)
    cc.reset()
    with cc.strict():
        out, grads = forward_backward(cc.compiled(fn), [], inputs, 3)
    cc.assert_matches(f"{layout} output", out, eager_out, ref_out)
    for i, (g, e, r) in enumerate(zip(grads, eager_grads, ref_grads)):
        cc.assert_matches(f"{layout} grad {i}", g, e, r)


# ------------------------------------------------------------------------------- fallbacks and debug
def _mixed_complex(x):
    z = torch.polar(x.abs() + 1, x)  # complex64
    return (z * z).real + torch.softmax(x, -1)


def test_fallback_reported_at_debug_1(capfd):
    """A complex sub-graph falls back (non-strict), is counted with its reason and printed at TILEFUSE_DEBUG=1,
    while the real part still runs as tilefuse kernels; the answer is eager's."""
    x = torch.randn(7, 129)
    expected = _mixed_complex(x)
    cc.reset()
    with cc.lenient(), config.override(debug=1):
        out = cc.compiled(_mixed_complex)(x)
    cc.assert_matches("mixed complex output", out, expected, _mixed_complex(x.double()))
    s = cc.stats()
    assert s["fallbacks"], f"complex ops ran without a recorded fallback: {s}"
    assert all(str(r).strip() for _n, r in s["fallbacks"]), f"a fallback has no reason: {s['fallbacks']}"
    assert int(s["kernels"]) + int(s["cache_hits"]) >= 1, f"the real (softmax) part ran no tilefuse kernel: {s}"
    err = capfd.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("[tilefuse]")]
    assert any("fallback" in ln.lower() for ln in lines), f"TILEFUSE_DEBUG=1 printed no fallback line: {lines}"


def test_debug_0_is_quiet(capfd):
    x = torch.randn(7, 129)
    cc.reset()
    with cc.strict(), config.override(debug=0):
        cc.compiled(lambda t: torch.softmax(t, -1) * 2)(x)
    err = capfd.readouterr().err
    assert "[tilefuse]" not in err, f"TILEFUSE_DEBUG=0 printed: {err[:500]!r}"


def test_explain_shows_breaks_groups_kernels_fallbacks():
    import tilefuse

    def fn(x):
        y = torch.softmax(x, -1) * 2
        torch._dynamo.graph_break()
        return _mixed_complex(y)

    with cc.lenient():
        text = str(tilefuse.explain(fn, torch.randn(7, 129)))
    low = text.lower()
    for word in ("graph break", "kernel", "fallback"):
        assert word in low, f"explain() does not mention {word!r}:\n{text[:3000]}"
    assert "fusion" in low or "group" in low, f"explain() shows no fusion groups:\n{text[:3000]}"
    assert "complex" in low, f"explain() does not say why the complex part fell back:\n{text[:3000]}"


def test_compiler_explain_stays_the_function_after_a_call():
    """``tilefuse.compiler.explain`` is a function and its module's name: a second call must still be the call."""
    import tilefuse.compiler as compiler
    from tilefuse.compiler.explain import Explanation

    for k in range(2):
        assert callable(compiler.explain), f"call {k}: tilefuse.compiler.explain is {compiler.explain!r}"
        got = compiler.explain(lambda x: torch.relu(x) * 2, torch.randn(5, 3))
        assert isinstance(got, Explanation) and len(got.kernels) == 1, f"call {k}: {got}"


# --------------------------------------------------------------------------------------- processes
_CACHE_SCRIPT = textwrap.dedent("""
    import json, sys, torch, torch.nn.functional as F
    import tilefuse, tilefuse.compiler as compiler
    from tilefuse import config
    torch.manual_seed(0)
    x, w, b = torch.randn(7, 1000), torch.randn(1000), torch.randn(1000)
    def f(x, w, b):
        return F.gelu(F.layer_norm(x, (1000,), w, b)), torch.softmax(x * 0.5, -1)
    compiler.reset_stats()
    with config.override(strict=True):
        out = torch.compile(f, backend="tilefuse")(x, w, b)
    ref = f(x.double(), w.double(), b.double())
    err = max(float((o.double() - r).norm() / r.norm()) for o, r in zip(out, ref))
    s = compiler.stats()
    print("STATS " + json.dumps({k: (len(v) if isinstance(v, list) else v) for k, v in s.items()
                                 if k in ("graphs", "kernels", "kernels_compiled", "cache_hits", "fallbacks", "externs")}
                                | {"err": err}))
""")


def _run_python(code: str, *, env_extra: dict, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, **env_extra}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=cwd,
                          timeout=SUBPROCESS_TIMEOUT_S)


def _stats_line(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, f"child failed ({proc.returncode}):\n{proc.stderr[-4000:]}"
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("STATS ")]
    assert lines, f"child printed no STATS line:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    return json.loads(lines[-1][len("STATS "):])


def test_warm_cache_second_process_compiles_nothing(tmp_path):
    cache = tmp_path / "cache"
    env = {"TILEFUSE_CACHE_DIR": str(cache), "TILEFUSE_DEBUG": "0"}
    cold = _stats_line(_run_python(_CACHE_SCRIPT, env_extra=env, cwd=REPO))
    assert cold["err"] <= TOLERANCE[torch.float32], f"cold process answer off: {cold}"
    assert cold["kernels_compiled"] >= 1, f"the first process compiled no kernel: {cold}"
    warm_proc = _run_python(_CACHE_SCRIPT, env_extra={**env, "TILEFUSE_DEBUG": "1"}, cwd=REPO)
    warm = _stats_line(warm_proc)
    assert warm["err"] <= TOLERANCE[torch.float32], f"warm process answer off: {warm}"
    assert warm["kernels_compiled"] == 0, f"the second process compiled kernels despite a warm cache: {warm}"
    assert warm["cache_hits"] >= 1, f"the second process reports no cache hit: {warm}"
    assert warm["kernels"] == cold["kernels"], f"kernel counts differ between processes: {cold} vs {warm}"
    assert "[tilefuse]" in warm_proc.stderr, "TILEFUSE_DEBUG=1 printed nothing in the warm process"


def test_fresh_process_entry_point_without_import(tmp_path):
    """``torch.compile(..., backend="tilefuse")`` in a process that never imports tilefuse: the installed
    package's torch_dynamo_backends entry point must load it."""
    from importlib import metadata

    try:
        metadata.distribution("tilefuse")
    except metadata.PackageNotFoundError:
        pytest.skip("tilefuse is not pip-installed here, so it has no entry point (make test installs it)")
    code = textwrap.dedent("""
        import json, sys, torch
        assert "tilefuse" not in sys.modules
        x = torch.randn(7, 129)
        f = torch.compile(lambda t: torch.softmax(t * 3, -1) + 1, backend="tilefuse")
        out = f(x)
        ref = torch.softmax(x.double() * 3, -1) + 1
        s = sys.modules["tilefuse.compiler"].stats()
        print("STATS " + json.dumps({"graphs": s["graphs"], "err": float((out.double() - ref).norm() / ref.norm()),
                                     "loaded": "tilefuse" in sys.modules}))
    """)
    env = {"TILEFUSE_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": ""}
    result = _stats_line(_run_python(code, env_extra=env, cwd=tmp_path))  # cwd: not the checkout
    assert result["loaded"] and result["graphs"] >= 1, f"the backend did not run: {result}"
    assert result["err"] <= TOLERANCE[torch.float32], f"wrong answer: {result}"


def test_torch_compile_mode_and_options():
    """torch.compile(mode="max-autotune") compiles tilefuse's default, with a warning that names the mode
    (mode="reduce-overhead": tests/compiler/test_compiler_cudagraphs.py); an unknown options= key is an error naming it and the accepted keys (tests/
    test_compiler_options.py checks the accepted ones); the default mode compiles silently and right."""
    import warnings

    from tilefuse.compiler import backend

    x = torch.randn(5, 7)
    torch._dynamo.reset()
    backend._MODES_WARNED.discard("max-autotune")
    with pytest.warns(UserWarning, match="mode='max-autotune' compiles tilefuse's default"):
        out = torch.compile(lambda t: (t * 2).relu(), backend="tilefuse", mode="max-autotune")(x)
    assert torch.equal(out, (x * 2).relu())
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        backend.check_backend_arguments({"mode": "default"})
        backend.check_backend_arguments({})
    with pytest.raises(Exception, match=r"unknown option\(s\) 'fuse'; accepted keys are debug, strict"):
        torch.compile(lambda t: t + 1, backend="tilefuse", options={"fuse": True})(x)
    torch._dynamo.reset()
    with pytest.raises(TypeError, match="unexpected argument"):
        backend.check_backend_arguments({"dynamic": True})
