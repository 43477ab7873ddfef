"""``tilefuse bench compiler``: the tilefuse backend vs eager PyTorch and Inductor on memory-bound graphs.

Every graph is timed three ways in this process on the same inputs: eager, ``torch.compile(backend="inductor")``
(default mode) and ``torch.compile(backend="tilefuse")``; each compiled output (and gradient) is first checked
against a float32 eager reference. ``bytes_moved`` is the minimum a graph must move (each input read once, each
output written once; for forward + backward the inputs include the incoming gradient, the outputs the
gradients, and the backward pass re-reads what it needs of the forward's tensors: :func:`minimal_bytes`), so
``pct_ceiling`` is the share of the measured copy bandwidth. ``baseline`` is Inductor; the
note says the ratio to eager.

Each compiled impl also gets an ``<impl>-kernels`` row (``inductor-kernels`` its baseline): the step's GPU time
alone, from torch.profiler, and in its note the step's host time (:func:`host_us`; after the graph's impls are
timed, in rounds that alternate them, :func:`note_host_times`). A step row is the time
of the whole call, what a user's loop sees; where the host takes longer to queue a step than its kernels take
to run (a forward + backward through Dynamo, AOTAutograd and the autograd engine on a slow host CPU), the
step row measures the host and the kernels row says what the generated code does.

Compile time: one child process per backend with fresh TILEFUSE_CACHE_DIR / TORCHINDUCTOR_CACHE_DIR /
TRITON_CACHE_DIR compiles every graph cold (after a throw-away graph, so one-time imports are not charged to the
first case), and a third child compiles with tilefuse's now-warm cache. Those rows (impl ``*-compile-cold`` /
``tilefuse-compile-warm``) put seconds × 1000 in ``ms_p50``.

``--smoke`` (CI, no GPU): tiny shapes on Triton's interpreter, Inductor not run (it would build C++ for the
CPU), compile time measured for two graphs: it proves the code path, the times mean nothing.

GEMM-bound rows (``gemm=True`` graphs): LLM shapes, M = GEMM_TOKENS tokens of hidden GEMM_HIDDEN with an FFN of
GEMM_FFN, in bf16: Linear + bias + GeLU, a SwiGLU FFN and the attention projections (q, k, v, o), each forward
and forward + backward. They report TFLOP/s (2·M·N·K a GEMM, the backward twice the forward) and are also timed
against Inductor's ``max-autotune`` mode (impl ``inductor-max-autotune``) in the same run; the baseline stays
Inductor default. ``--rows`` sets their M too. ``attention_projections_params_fwd_bwd`` is the projections'
forward + backward with the weights held as a module's parameters, as a model holds them: every backend uses
them in place (under ``--reduce-overhead`` the plain row copies its rotating weights into the CUDA graph's
buffers at each replay), and only the tokens and the incoming gradients rotate.

``--reduce-overhead``: each forward + backward graph is also timed under ``mode="reduce-overhead"``, Inductor's
CUDA graph trees (impl ``inductor-reduce-overhead``) and tilefuse's CUDA graphs (``tilefuse-reduce-overhead``),
each with its ``-kernels`` row and host time; a step starts with ``torch.compiler.cudagraph_mark_step_begin()``
(what Inductor asks of a loop; tilefuse's runner needs no mark). At the suite's size the steps are kernel-bound;
small ``--rows`` (e.g. 1024) make them host-bound, where a graph's launch savings can show.
"""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F

from . import harness, runner

SUITE = "compiler"
ROWS, COLS = 32768, 4096  # the issue's size: 256 MiB of bf16, 4x the H200's 60 MiB L2
VOCAB = 32000  # cross-entropy rows are vocabulary-long (a Llama-sized vocabulary, not a power of two)
SMOKE_ROWS, SMOKE_COLS, SMOKE_VOCAB = 13, 257, 1000
DTYPE = torch.bfloat16
SMOKE_DTYPE = torch.float32  # numpy (the interpreter) has no bfloat16

# Compiled results are checked against float32 eager at tests/support.py's bf16 tolerance, or at this many
# times eager bf16's own error when that is larger (the same rule the tests use).
CHECK_TOLERANCE = {torch.bfloat16: 2e-2, torch.float16: 3e-3, torch.float32: 1e-5}
EAGER_ERROR_FACTOR = 4.0

QUICK_CASES = ("softmax", "layer_norm", "rms_norm", "softmax_layer_norm", "layer_norm_gelu_fwd_bwd")
SMOKE_COMPILE_CASES = ("softmax", "layer_norm_gelu_fwd_bwd")
COMPILE_CHILD_TIMEOUT_S = 600
IMPLS = ("eager", "inductor", "tilefuse")
GEMM_IMPLS = ("eager", "inductor", "inductor-max-autotune", "tilefuse")
REDUCE_OVERHEAD_IMPLS = ("inductor-reduce-overhead", "tilefuse-reduce-overhead")
COMPILED_IMPLS = ("inductor", "inductor-max-autotune", "inductor-reduce-overhead", "tilefuse",
                  "tilefuse-reduce-overhead")
# GEMM-bound graphs: a Llama-3-8B-sized layer (hidden 4096, FFN 14336) over 8192 tokens
GEMM_TOKENS, GEMM_HIDDEN, GEMM_FFN = 8192, 4096, 14336
SMOKE_GEMM_TOKENS, SMOKE_GEMM_HIDDEN, SMOKE_GEMM_FFN = 13, 32, 48


# ------------------------------------------------------------------------------------------- graphs
def softmax(x):
    return torch.softmax(x, dim=-1)


def log_softmax(x):
    return torch.log_softmax(x, dim=-1)


def layer_norm(x, w, b):
    return F.layer_norm(x, x.shape[-1:], w, b, 1e-5)


def rms_norm(x, w):
    return F.rms_norm(x, x.shape[-1:], w, 1e-6)


def gelu_chain(x, b, s):
    return F.gelu(x + b) * s


def silu_chain(a, g):  # the SwiGLU gate
    return F.silu(a) * g


def residual_layer_norm(x, r, w, b):  # pre-norm transformer: the sum is the next residual, the norm the input
    h = x + r
    return h, F.layer_norm(h, h.shape[-1:], w, b, 1e-5)


def cross_entropy(logits, target):
    return F.cross_entropy(logits, target)


def softmax_layer_norm(x, w, b):
    return F.layer_norm(torch.softmax(x, dim=-1), x.shape[-1:], w, b, 1e-5)


def layer_norm_gelu(x, w, b):
    return F.gelu(F.layer_norm(x, x.shape[-1:], w, b, 1e-5))


@dataclasses.dataclass(frozen=True)
class Graph:
    case: str
    fn: Callable
    inputs: Callable[[int, int, int, torch.dtype, str], list]  # (rows, cols, vocab, dtype, device) -> tensors
    backward: bool = False
    # forward + backward: tensors the size of the first input that the backward must read from the forward
    # pass (softmax's output, a norm's input, both of SwiGLU's operands): see minimal_bytes
    saved: int = 1
    # a GEMM-bound graph: inputs (tokens, hidden, ffn, dtype, device); ``flops`` its forward's (tokens, hidden, ffn)
    gemm: bool = False
    flops: Callable[[int, int, int], float] | None = None
    # the inputs after the first are a module's parameters, as a model holds its weights (step_of): every
    # backend uses them in place, and only the first input and the incoming gradients rotate
    params: bool = False

    def shape(self, rows, cols, vocab) -> str:
        if self.gemm:
            return f"{rows}x{cols}x{vocab}"
        return f"{rows}x{vocab if self.fn is cross_entropy else cols}"


def _mats(matrices: int, vectors: int):
    """Inputs: ``matrices`` random (rows x cols) tensors, then ``vectors`` of length cols: the first
    weight-like (1 + 0.1·N(0,1)), the rest bias-like (0.1·N(0,1))."""

    def make(rows, cols, vocab, dtype, device):
        xs = [torch.randn(rows, cols, dtype=dtype, device=device) for _ in range(matrices)]
        vs = [torch.randn(cols, dtype=dtype, device=device) * 0.1 + (1.0 if i == 0 else 0.0) for i in range(vectors)]
        return xs + vs

    return make


def _ce_inputs(rows, cols, vocab, dtype, device):
    return [torch.randn(rows, vocab, dtype=dtype, device=device) * 2,
            torch.randint(0, vocab, (rows,), device=device)]


_FORWARD = [
    Graph("softmax", softmax, _mats(1, 0)),
    Graph("log_softmax", log_softmax, _mats(1, 0)),
    Graph("layer_norm", layer_norm, _mats(1, 2)),
    Graph("rms_norm", rms_norm, _mats(1, 1)),
    Graph("gelu_chain", gelu_chain, _mats(1, 2)),
    Graph("silu_chain", silu_chain, _mats(2, 0), saved=2),
    Graph("residual_layer_norm", residual_layer_norm, _mats(2, 2)),
    Graph("cross_entropy", cross_entropy, _ce_inputs),
    Graph("softmax_layer_norm", softmax_layer_norm, _mats(1, 2)),
]
GRAPHS: list[Graph] = _FORWARD + [dataclasses.replace(g, case=f"{g.case}_fwd_bwd", backward=True)
                                  for g in _FORWARD if g.case != "softmax_layer_norm"] + \
    [Graph("layer_norm_gelu_fwd_bwd", layer_norm_gelu, _mats(1, 2), backward=True)]


def linear_bias_gelu(x, w, b):
    return F.gelu(F.linear(x, w, b))


def swiglu_ffn(x, w1, w3, w2):
    return F.linear(F.silu(F.linear(x, w1)) * F.linear(x, w3), w2)


def attention_projections(x, wq, wk, wv, wo):
    """q, k and v of the input, and the output projection of v (attention itself left out: this row is the
    four projection GEMMs) added to the residual."""
    q, k, v = F.linear(x, wq), F.linear(x, wk), F.linear(x, wv)
    return q, k, x + F.linear(v, wo)


def _weights(shapes_of):
    """GEMM inputs: x (tokens, hidden) ~ N(0, 1) and weights ~ N(0, 1/fan_in) of the shapes ``shapes_of(h, f)``
    gives ((out, in) matrices, (out,) biases at 0.1 N(0, 1)), so every activation stays O(1) in bf16."""
    def make(tokens, hidden, ffn, dtype, device):
        out = [torch.randn(tokens, hidden, dtype=dtype, device=device)]
        for shape in shapes_of(hidden, ffn):
            t = torch.randn(*shape, dtype=dtype, device=device)
            out.append(t * (shape[-1] ** -0.5) if len(shape) == 2 else t * 0.1)
        return out
    return make


_GEMM_FORWARD = [
    Graph("linear_bias_gelu", linear_bias_gelu, _weights(lambda h, f: [(f, h), (f,)]), gemm=True,
          flops=lambda m, h, f: 2.0 * m * h * f),
    Graph("swiglu_ffn", swiglu_ffn, _weights(lambda h, f: [(f, h), (f, h), (h, f)]), gemm=True,
          flops=lambda m, h, f: 6.0 * m * h * f),
    Graph("attention_projections", attention_projections, _weights(lambda h, f: [(h, h)] * 4), gemm=True,
          flops=lambda m, h, f: 8.0 * m * h * h),
]
_N_GEMM_OUTPUTS = {attention_projections: 3}
GEMM_GRAPHS: list[Graph] = _GEMM_FORWARD + [dataclasses.replace(g, case=f"{g.case}_fwd_bwd", backward=True)
                                            for g in _GEMM_FORWARD]
# The projections' weights as a module's parameters: the row a training step's layers are like. Under
# --reduce-overhead the row above copies its four rotating weights into the CUDA graph's buffers at every replay
# (decision 059); here they are used in place, as in a model.
GEMM_GRAPHS.append(dataclasses.replace(GEMM_GRAPHS[-1], case="attention_projections_params_fwd_bwd", params=True))
GRAPHS = GRAPHS + GEMM_GRAPHS


def graph_flops(graph: Graph, tokens: int, hidden: int, ffn: int) -> float | None:
    """A GEMM graph's matmul FLOPs: the forward's, three times that with the backward (two GEMMs a GEMM)."""
    if graph.flops is None:
        return None
    return graph.flops(tokens, hidden, ffn) * (3 if graph.backward else 1)


def _outputs(out) -> list[torch.Tensor]:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def differentiable(inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return [t for t in inputs if t.dtype.is_floating_point]


def prepare(graph: Graph, inputs: list[torch.Tensor]) -> list:
    """The call's arguments: for forward + backward the float inputs require grad and the incoming gradients
    (fixed random tensors, one per output) are appended."""
    if not graph.backward:
        return inputs
    inputs = [t.requires_grad_() if t.dtype.is_floating_point else t for t in inputs]
    with torch.no_grad():
        outs = _outputs(graph.fn(*inputs))
    return inputs + [torch.randn_like(o) for o in outs]


def make_step(graph: Graph, fn: Callable, bound: bool = False) -> Callable:
    """A callable over prepare()'s arguments: the forward, or the forward and the gradients of every float input.
    ``bound``: ``fn`` takes the first input alone, the rest being its module's parameters (:func:`step_of`)."""
    forward = (lambda *inputs: fn(*inputs[:1])) if bound else fn
    if not graph.backward:
        return forward

    def step(*args):
        n_in = len(args) - _n_outputs(graph)
        inputs, cots = args[:n_in], args[n_in:]
        outs = _outputs(forward(*inputs))
        grads = torch.autograd.grad(outs, differentiable(inputs), cots)
        return outs, grads

    return step


class Parameters(torch.nn.Module):
    """A ``params`` graph's weights held as a model holds them: ``forward(x)`` is ``fn(x, *weights)``."""

    def __init__(self, fn: Callable, weights: Sequence[torch.nn.Parameter]):
        super().__init__()
        self.fn = fn
        self.weights = torch.nn.ParameterList(weights)

    def forward(self, x):
        return self.fn(x, *self.weights)


def as_parameters(graph: Graph, inputs: list) -> list:
    """A ``params`` graph's inputs with the weights (all but the first) made ``nn.Parameter``s; others unchanged."""
    if not graph.params:
        return inputs
    return inputs[:1] + [torch.nn.Parameter(t.detach(), requires_grad=graph.backward) for t in inputs[1:]]


def weights_of(graph: Graph, args: Sequence) -> list:
    """The weights among prepare()'s arguments: the inputs after the first (the incoming gradients left out)."""
    n_in = len(args) - _n_outputs(graph) if graph.backward else len(args)
    return list(args[1:n_in])


def step_of(graph: Graph, args: Sequence, wrap: Callable[[Callable], Callable] = lambda f: f) -> Callable:
    """The step over ``args`` (prepare()'s arguments) with ``wrap`` (torch.compile, or nothing for eager) applied
    to the graph's function; a ``params`` graph's function is a :class:`Parameters` module of ``args``' weights,
    so every backend sees them as a model's parameters (static inputs in AOTAutograd) and the step's
    gradients include theirs."""
    if not graph.params:
        return make_step(graph, wrap(graph.fn))
    return make_step(graph, wrap(Parameters(graph.fn, weights_of(graph, args))), bound=True)


def rotating_sets(graph: Graph, first: list, n_sets: int, make_inputs: Callable[[], list]) -> list[list]:
    """``n_sets`` argument lists, ``first`` among them; a ``params`` graph's share ``first``'s weights."""
    weights = weights_of(graph, first) if graph.params else None
    sets = [first]
    for _ in range(n_sets - 1):
        inputs = make_inputs()
        sets.append(prepare(graph, inputs if weights is None else inputs[:1] + weights))
    return sets


def rotating_bytes(graph: Graph, args: Sequence[torch.Tensor]) -> int:
    """Bytes of one rotating set: every argument, a ``params`` graph's weights left out."""
    weights = {id(t) for t in weights_of(graph, args)} if graph.params else set()
    return sum(t.numel() * t.element_size() for t in args if id(t) not in weights)


_N_OUTPUTS = {residual_layer_norm: 2, attention_projections: 3}


def _n_outputs(graph: Graph) -> int:
    return _N_OUTPUTS.get(graph.fn, 1)


def minimal_bytes(graph: Graph, args: Sequence[torch.Tensor], two_pass: bool = True) -> int:
    """Each input read once and each output written once. Forward + backward: the forward reads the inputs
    and writes the outputs; the backward, a second pass that cannot start before the incoming gradients
    exist, reads them and writes the gradients, and must also read what it needs from the forward:
    ``graph.saved`` tensors the size of the first input (softmax's backward reads its output or its input;
    a norm's, its input; SwiGLU's, both operands). ``two_pass=False`` leaves that read out (the count
    the bench used first: no implementation of separate passes can move that little)."""
    def nbytes(ts):
        return sum(t.numel() * t.element_size() for t in ts)

    if not graph.backward:
        with torch.no_grad():
            outs = _outputs(graph.fn(*args))
        return nbytes(args) + nbytes(outs)
    n_in = len(args) - _n_outputs(graph)
    inputs, cots = args[:n_in], args[n_in:]
    one_pass = nbytes(inputs) + nbytes(cots) + nbytes(cots) + nbytes(differentiable(inputs))  # outputs = cots'
    return one_pass + (graph.saved * nbytes(inputs[:1]) if two_pass else 0)


# ------------------------------------------------------------------------------------------- checks
def _flat(result) -> list[torch.Tensor]:
    flat = []
    for r in (result if isinstance(result, (tuple, list)) else [result]):
        flat.extend(_flat(r) if isinstance(r, (tuple, list)) else [r])
    return flat


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    out32, ref32 = out.detach().float(), ref.detach().float()
    if not bool(torch.isfinite(out32).all()):
        return float("inf")
    denom = float(ref32.norm())
    diff = float((out32 - ref32).norm())
    return diff / denom if denom else diff


def upcast_args(args: Sequence[torch.Tensor]) -> list:
    out = []
    for t in args:
        if t.dtype.is_floating_point:
            out.append(t.detach().float().requires_grad_(t.requires_grad))
        else:
            out.append(t)
    return out


def reference(graph: Graph, args) -> list[torch.Tensor]:
    """Float32 eager on upcast inputs: outputs (and gradients; a ``params`` graph's weights passed as inputs)."""
    return [t.detach() for t in _flat(make_step(graph, graph.fn)(*upcast_args(args)))]


def check_against(result, ref: list[torch.Tensor], eager: list[torch.Tensor], dtype) -> str | None:
    """None when every output is within tolerance of the float32 reference, else what is wrong."""
    outs = [t.detach() for t in _flat(result)]
    if len(outs) != len(ref):
        return f"{len(outs)} outputs, expected {len(ref)}"
    for i, (o, r, e) in enumerate(zip(outs, ref, eager)):
        if o.shape != r.shape or o.dtype != e.dtype:
            return f"output {i}: {tuple(o.shape)} {o.dtype}, expected {tuple(r.shape)} {e.dtype}"
        err, eager_err = _rel(o, r), _rel(e, r)
        limit = max(CHECK_TOLERANCE.get(dtype, 2e-2), EAGER_ERROR_FACTOR * eager_err)
        if not err <= limit:
            return f"output {i}: relative error {err:.3g} > {limit:.3g}"
    return None


# ----------------------------------------------------------------------------------------- running
def _compile(backend: str, fn: Callable) -> Callable:
    torch._dynamo.reset()
    if backend == "inductor-max-autotune":
        return torch.compile(fn, backend="inductor", mode="max-autotune")
    if backend.endswith("-reduce-overhead"):
        return torch.compile(fn, backend=backend.removesuffix("-reduce-overhead"), mode="reduce-overhead")
    return torch.compile(fn, backend=backend)


def impls(graph: Graph, opts: runner.SuiteOptions) -> tuple[str, ...]:
    """What a graph is timed as: eager, Inductor (and max-autotune for a GEMM graph), tilefuse; with
    ``--reduce-overhead`` a forward + backward graph also under both backends' CUDA graphs."""
    base = GEMM_IMPLS if graph.gemm else IMPLS
    return base + REDUCE_OVERHEAD_IMPLS if opts.reduce_overhead and graph.backward else base


def _marking_steps(step: Callable) -> Callable:
    """``step`` with a new CUDA-graph generation begun before each call (Inductor's trees keep the previous
    step's outputs alive otherwise and re-record instead of replaying)."""
    def marked(*args):
        torch.compiler.cudagraph_mark_step_begin()
        return step(*args)

    return marked


def _tilefuse_stats() -> dict | None:
    try:
        from .. import compiler

        return dict(compiler.stats())
    except Exception:
        return None


def cuda_graph_summary(s: dict) -> str:
    """What tilefuse's CUDA graphs did over a row (its stats after the timing): recordings, replays, calls
    that ran uncaptured, the host (and GPU) time of the calls the replay-cost rule timed, what a step trial found
    and the first reason given."""
    text = (f"cuda graphs: {s.get('cudagraph_recordings', 0)} recorded, {s.get('cudagraph_replays', 0)} "
            f"replays, {s.get('cudagraph_uncaptured_calls', 0)} uncaptured calls")
    timed = [f"{g['call_us']:.0f}" + ("" if g.get("call_gpu_us") is None else f" (GPU {g['call_gpu_us']:.0f})")
             for g in s.get("cudagraphs", []) if g.get("call_us") is not None]
    if timed:
        text += f", calls timed at {' / '.join(timed)} us of host time"
    trials = [g["step_trial"] for g in s.get("cudagraphs", []) if g.get("step_trial")]
    if trials:
        text += f"; {trials[0]}"
    reasons = [why for g in s.get("cudagraphs", []) for why in g.get("uncaptured", {})]
    return f"{text} ({reasons[0]})" if reasons else text


def _reset_tilefuse_stats() -> None:
    try:
        from .. import compiler

        compiler.reset_stats()
    except Exception:
        pass


def _l2_bytes() -> int:
    from .. import device as tf_device

    return tf_device.current().l2_bytes


def _sizes(opts: runner.SuiteOptions, graph: Graph | None = None) -> tuple[int, int, int, torch.dtype]:
    """(rows, cols, vocab, dtype) of a memory-bound graph; (tokens, hidden, ffn, dtype) of a GEMM graph."""
    if graph is not None and graph.gemm:
        if opts.smoke:
            return SMOKE_GEMM_TOKENS, SMOKE_GEMM_HIDDEN, SMOKE_GEMM_FFN, SMOKE_DTYPE
        return opts.rows or GEMM_TOKENS, GEMM_HIDDEN, GEMM_FFN, DTYPE
    if opts.smoke:
        return SMOKE_ROWS, SMOKE_COLS, SMOKE_VOCAB, SMOKE_DTYPE
    return opts.rows or ROWS, COLS, VOCAB, DTYPE


def selected(opts: runner.SuiteOptions) -> list[Graph]:
    graphs = [g for g in GRAPHS if opts.wants(g.case)]
    if opts.quick:
        graphs = [g for g in graphs if g.case in QUICK_CASES]
    return graphs


def time_graph(rec: harness.Recorder, graph: Graph, opts: runner.SuiteOptions, device: str) -> None:
    rows, cols, vocab, dtype = _sizes(opts, graph)
    shape = graph.shape(rows, cols, vocab)
    flops = graph_flops(graph, rows, cols, vocab)
    first = prepare(graph, as_parameters(graph, graph.inputs(rows, cols, vocab, dtype, device)))
    n_sets = 1 if opts.smoke else harness.rotation_sets(rotating_bytes(graph, first), _l2_bytes())
    sets = rotating_sets(graph, first, n_sets, lambda: graph.inputs(rows, cols, vocab, dtype, device))
    args = first
    ref = reference(graph, args)
    eager_step = step_of(graph, args)
    eager = [t.detach() for t in _flat(eager_step(*args))]
    moved = minimal_bytes(graph, args)
    times: dict[str, harness.Row] = {}
    kernel_rows: dict[str, harness.Row] = {}  # compiled impl -> its -kernels row, whose note gets the host time
    host_calls: dict[str, harness.Rotating] = {}
    for impl in impls(graph, opts):
        if impl.startswith("inductor") and opts.smoke:
            rec.skip(graph.case, impl, "smoke run on the interpreter: Inductor would build C++ for the CPU",
                     dtype=dtype, shape=shape)
            continue
        if impl == "eager":
            step = eager_step
        else:
            if impl.startswith("tilefuse"):
                _reset_tilefuse_stats()
            step = step_of(graph, args, lambda fn: _compile(impl, fn))
            if impl.endswith("-reduce-overhead"):
                step = _marking_steps(step)

        def check(step=step):
            return check_against(step(*args), ref, eager, dtype)

        row = rec.time(graph.case, impl, harness.Rotating(step, sets), dtype=dtype, shape=shape,
                       bytes_moved=moved, flops=flops, baseline="inductor", check=check)
        if graph.backward and row.ok:
            one = minimal_bytes(graph, args, two_pass=False)
            extra = f"one-pass count {one / 1e9:.3f} GB: {one / 1e9 / (row.ms_p50 * 1e-3):.0f} GB/s"
            row.note = f"{row.note}; {extra}" if row.note else extra
        if impl.startswith("tilefuse"):
            s = _tilefuse_stats()
            if s is not None:
                extra = f"{len(s.get('fallbacks', []))} fallbacks, {s.get('kernels', '?')} kernels, " \
                        f"{s.get('externs', '?')} externs"
                if impl.endswith("-reduce-overhead"):
                    extra += f", {cuda_graph_summary(s)}"
                row.note = f"{row.note}; {extra}" if row.note else extra
        times[impl] = row
        if impl != "eager" and row.ok:
            krow = record_kernel_time(rec, graph, impl, step, sets, opts, dtype=dtype, shape=shape,
                                      bytes_moved=moved)
            if krow is not None:
                kernel_rows[impl], host_calls[impl] = krow, harness.Rotating(step, sets)
    if kernel_rows:
        note_host_times(kernel_rows, host_calls)
    del host_calls
    base = times.get("eager")
    for impl in COMPILED_IMPLS:
        row = times.get(impl)
        if row is not None and row.ok and base is not None and base.ok:
            vs = f"{base.ms_p50 / row.ms_p50:.2f}x eager"
            row.note = f"{vs}; {row.note}" if row.note else vs
    del sets, args, first, ref, eager
    if device == "cuda":
        torch.cuda.empty_cache()


# ------------------------------------------------------------------------------- the GPU's share
KERNEL_STEPS, KERNEL_ROUNDS, HOST_STEPS = 5, 3, 20
# One round of 20 queued steps moved by more than the backends differ by (the captured softmax step read 373 and
# 253 us in two harnesses of one run on an H100's host, the backends 3-9 % apart): the note gives a median
HOST_ROUNDS = 5
HOST_SLEEP_CYCLES = 200_000_000  # ~0.1 s: longer than HOST_STEPS steps take to queue


def kernel_ms(call: Callable[[], Any], steps: int = KERNEL_STEPS, rounds: int = KERNEL_ROUNDS) -> list[float]:
    """Milliseconds of GPU time a call, from torch.profiler's CUDA activity (the kernels', copies' and
    fills' device time, summed; no host time): one value per round of ``steps`` calls."""
    from torch.profiler import ProfilerActivity, profile

    out = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                call()
            torch.cuda.synchronize()
        us = sum(e.device_time_total for e in prof.key_averages() if e.device_time_total > 0)
        out.append(us / steps / 1e3)
    return out


def host_us(call: Callable[[], Any], steps: int = HOST_STEPS) -> float:
    """Host microseconds a call: the GPU is kept busy by a sleep kernel while ``steps`` calls are queued, so
    the wall time of the queuing is the host's alone (wrappers, autograd, allocation, launches)."""
    torch.cuda.synchronize()
    torch.cuda._sleep(HOST_SLEEP_CYCLES)
    start = time.perf_counter()
    for _ in range(steps):
        call()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / steps * 1e6


def record_kernel_time(rec: harness.Recorder, graph: Graph, impl: str, step: Callable, sets: list,
                       opts: runner.SuiteOptions, *, dtype, shape, bytes_moved: float) -> harness.Row | None:
    """A ``<impl>-kernels`` row beside a compiled impl's step row: the step's GPU time alone (kernel_ms), so
    a step that the host sets (a forward + backward through Dynamo, AOTAutograd and the autograd engine can
    take longer to queue than its kernels take to run) still shows what the kernels move. Returns the row
    (None when it was not measured), whose note :func:`note_host_times` completes with the step's host time."""
    name = f"{impl}-kernels"
    if opts.smoke:
        rec.skip(graph.case, name, "smoke run on the interpreter: no CUDA time to profile", dtype=dtype, shape=shape)
        return None
    import statistics

    try:
        rounds = kernel_ms(harness.Rotating(step, sets))
    except Exception as exc:
        rec._error_row(graph.case, name, dtype, shape, exc, dict(baseline="inductor-kernels"))
        return None
    note = f"GPU time of the step (torch.profiler, {KERNEL_ROUNDS} rounds of {KERNEL_STEPS} steps)"
    rec._timed_row(graph.case, name, dtype, shape, statistics.median(rounds), min(rounds), max(rounds),
                   dict(bytes_moved=bytes_moved, baseline="inductor-kernels", note=note))
    return rec.rows[-1]


def alternated(calls: dict[str, Callable[[], Any]], measure: Callable | None = None,
               rounds: int = HOST_ROUNDS) -> dict[str, list[float]]:
    """``measure(call)`` (default: :func:`host_us`, host µs a step) of each call, in ``rounds`` rounds that measure
    every call once, each round starting one call later: drift of the host (it moved the same uncaptured path's
    median by up to 1.7x between two impls timed one after the other; the lab log's "host times, alternated")
    falls on every impl alike."""
    measure = measure or host_us
    names = list(calls)
    out: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        k = r % len(names)
        for n in names[k:] + names[:k]:
            out[n].append(measure(calls[n]))
    return out


def note_host_times(rows: dict[str, harness.Row], calls: dict[str, Callable[[], Any]]) -> None:
    """Each compiled impl's host time a step, timed in alternated rounds (:func:`alternated`), added to its
    ``-kernels`` row's note; if the timing fails, the notes say so."""
    import statistics

    try:
        hosts = alternated(calls)
    except Exception as exc:
        for row in rows.values():
            row.note += f"; host time not measured: {type(exc).__name__}: {exc}".splitlines()[0][:300]
        return
    for impl, row in rows.items():
        h = hosts[impl]
        row.note += (f"; host {statistics.median(h):.0f} us a step (median of {len(h)} rounds of {HOST_STEPS} steps, "
                     f"alternated with the graph's other {len(rows) - 1} compiled impls: {min(h):.0f}-{max(h):.0f})")


# ------------------------------------------------------------------------------------ compile time
def compile_times(backend: str, cases: Sequence[str], smoke: bool,
                  n_rows: int = 0) -> tuple[dict[str, float | str], dict[str, tuple[int, int]]]:
    """Seconds from torch.compile to the end of the first call (forward, or forward + backward) per case, in
    this process; a throw-away graph first pays the backend's one-time imports and initialisation. Also, for
    tilefuse, (kernel sources written, kernels read from the disk cache) per case: a warm cache writes none
    (the issue's "a second process with a warm cache compiles nothing", shown in each row's note)."""
    device = "cpu" if smoke else "cuda"
    rows, cols, vocab, dtype = (SMOKE_ROWS, SMOKE_COLS, SMOKE_VOCAB, SMOKE_DTYPE) if smoke else \
        (n_rows or ROWS, COLS, VOCAB, DTYPE)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    warm = torch.compile(lambda t: (t.cos() * 3).sum(-1), backend=backend)
    warm(torch.randn(8, 8, device=device))
    sync()
    from ..compiler import records

    results: dict[str, float | str] = {}
    counts: dict[str, tuple[int, int]] = {}
    by_case = {g.case: g for g in GRAPHS}
    for case in cases:
        graph = by_case[case]
        if graph.gemm:
            dims = (SMOKE_GEMM_TOKENS, SMOKE_GEMM_HIDDEN, SMOKE_GEMM_FFN) if smoke else \
                (n_rows or GEMM_TOKENS, GEMM_HIDDEN, GEMM_FFN)
            args = prepare(graph, as_parameters(graph, graph.inputs(*dims, dtype, device)))
        else:
            args = prepare(graph, graph.inputs(rows, cols, vocab, dtype, device))
        sync()
        before = records.snapshot()
        try:
            torch._dynamo.reset()
            start = time.perf_counter()
            step = step_of(graph, args, lambda fn: torch.compile(fn, backend=backend))
            step(*args)
            sync()
            results[case] = time.perf_counter() - start
        except Exception as exc:
            results[case] = f"error: {type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"[:300]
        after = records.snapshot()
        if backend == "tilefuse":
            counts[case] = (after["kernels_compiled"] - before["kernels_compiled"],
                            after["cache_hits"] - before["cache_hits"])
        del args
    return results, counts


def _child(backend: str, cases: Sequence[str], smoke: bool, dirs: dict[str, Path], log,
           rows: int = 0) -> tuple[dict, dict]:
    """Run compile_times in a fresh process whose caches are ``dirs``: its (results, kernel counts). The
    variables go in through ``env`` on the command line (config.py is the only module that reads os.environ)."""
    assign = [f"{k}={v}" for k, v in dirs.items()]
    cmd = ["env", *assign, sys.executable, "-m", "tilefuse.bench.compiler_suite", "--compile-child", backend,
           ",".join(cases)] + (["--smoke"] if smoke else []) + (["--rows", str(rows)] if rows else [])
    root = Path(__file__).resolve().parents[2]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=COMPILE_CHILD_TIMEOUT_S, cwd=root)
    except subprocess.TimeoutExpired:
        return {c: f"error: compile child timed out after {COMPILE_CHILD_TIMEOUT_S} s" for c in cases}, {}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("COMPILE_TIMES ")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1][:250]
        log(f"  compile child ({backend}) failed: {proc.stderr[-2000:]}")
        return {c: f"error: compile child exit {proc.returncode}: {tail}" for c in cases}, {}
    found = [ln for ln in proc.stdout.splitlines() if ln.startswith("KERNEL_COUNTS ")]
    kernels = {c: tuple(v) for c, v in json.loads(found[-1][len("KERNEL_COUNTS "):]).items()} if found else {}
    return json.loads(lines[-1][len("COMPILE_TIMES "):]), kernels


def record_compile_times(rec: harness.Recorder, graphs: Sequence[Graph], opts: runner.SuiteOptions) -> None:
    rows, cols, vocab, dtype = _sizes(opts)
    cases = [g.case for g in graphs]
    if opts.smoke:
        cases = [c for c in cases if c in SMOKE_COMPILE_CASES] or cases[:1]
    shapes = {g.case: g.shape(*_sizes(opts, g)[:3]) for g in graphs}
    note = "ms_p50 = seconds x 1000 from torch.compile to the end of the first call, in a fresh process"
    with tempfile.TemporaryDirectory(prefix="tilefuse-compile-bench-") as tmp:
        tmp = Path(tmp)
        tf_dirs = {"TILEFUSE_CACHE_DIR": tmp / "tilefuse", "TRITON_CACHE_DIR": tmp / "triton-tilefuse",
                   "TORCHINDUCTOR_CACHE_DIR": tmp / "inductor-unused"}
        ind_dirs = {"TILEFUSE_CACHE_DIR": tmp / "tilefuse-unused", "TRITON_CACHE_DIR": tmp / "triton-inductor",
                    "TORCHINDUCTOR_CACHE_DIR": tmp / "inductor"}
        runs = [("tilefuse-compile-cold", "tilefuse", tf_dirs, "inductor-compile-cold", "cold caches"),
                ("inductor-compile-cold", "inductor", ind_dirs, "", "cold caches"),
                ("tilefuse-compile-warm", "tilefuse", tf_dirs, "", "tilefuse's cache warm from the cold run; target <= 500 ms")]
        for impl, backend, dirs, baseline, what in runs:
            if backend == "inductor" and opts.smoke:
                for c in cases:
                    rec.skip(c, impl, "smoke run on the interpreter: Inductor would build C++ for the CPU",
                             dtype=dtype, shape=shapes[c])
                continue
            rec.log(f"  compile time: {impl} ({len(cases)} graphs in a child process)")
            results, counts = _child(backend, cases, opts.smoke, dirs, rec.log, 0 if opts.smoke else rows)
            for c in cases:
                value = results.get(c, "error: no result")
                if isinstance(value, str):
                    rec._row(c, impl, dtype, shapes[c], status=value, baseline=baseline, note=note)
                    rec.log(f"  {c:<28} {impl:<20} {value}")
                else:
                    kernels = ""
                    if c in counts:
                        written, cached = counts[c]
                        kernels = f"; kernel sources written {written}, read from the disk cache {cached}"
                    rec._row(c, impl, dtype, shapes[c], ms_p50=value * 1e3, baseline=baseline,
                             note=f"{note}; {what}{kernels}")
                    rec.log(f"  {c:<28} {impl:<20} {value:9.3f} s{kernels}")


# ------------------------------------------------------------------------------------------- entry
def run(opts: runner.SuiteOptions) -> list[harness.Row]:
    from .. import device as tf_device

    rec = opts.recorder(SUITE, compute_bound=False)
    device = "cpu" if opts.smoke else tf_device.current().torch_device
    graphs = selected(opts)
    torch.manual_seed(0)
    for graph in graphs:
        time_graph(rec, graph, opts, device)
    record_compile_times(rec, graphs, opts)
    return rec.finish()


def _main(argv: Sequence[str]) -> int:
    import argparse

    p = argparse.ArgumentParser(description="compile-time child of `tilefuse bench compiler` (internal)")
    p.add_argument("--compile-child", nargs=2, metavar=("BACKEND", "CASES"), required=True)
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--rows", type=int, default=0)
    args = p.parse_args(argv)
    backend, cases = args.compile_child
    import tilefuse  # noqa: F401  (the backend name; device.py decides the interpreter first)

    results, counts = compile_times(backend, cases.split(","), args.smoke, args.rows)
    print("KERNEL_COUNTS " + json.dumps(counts), flush=True)
    print("COMPILE_TIMES " + json.dumps(results), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
