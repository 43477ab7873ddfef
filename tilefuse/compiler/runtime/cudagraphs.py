"""``mode="reduce-overhead"``: each compiled graph recorded into a CUDA graph and replayed.

A compiled step pays host time a launch and a graph (the generated wrapper, AOTAutograd's runtime wrapper,
Dynamo's guards); a replayed CUDA graph pays one ``cudaGraphLaunch``. Record 028 has the whole story.

What a :class:`GraphRunner` (one per compiled forward, backward or inference graph) does on a call:

1. **Can it be captured at all?** :func:`capture_blockers` (a pure function of the FX graph, the static input
   set and, per call, the arguments) names what stops it: the interpreter, CPU tensors, a value read from
   tensor data (``item()``: a sync and data-dependent sizes), an op that syncs or returns a CPU tensor, an
   attention with dropout, an input that is neither a parameter nor a buffer and is mutated in place. Such a
   graph (or such a call) runs uncaptured; the reason is counted in ``stats()["cudagraphs"]``, shown by
   ``explain`` and logged at ``TILEFUSE_DEBUG=1``.

   One CPU tensor is let through, forward and backward, so that a training step with attention is captured:
   the attention forward's dropout seed (drawn on the host, a 0-d CPU tensor) without dropout. It is then the
   constant 0 and the backward's kernels never read it. A forward may return it (saved for the backward) but
   not read it (:func:`_replayable_cpu_output`); a replay hands out the recording's seed tensor itself
   (:func:`seed_outputs`). A backward may take it as an input read only as the seed of an attention backward
   (:func:`seed_inputs`); the recording passes it as it is, neither copied into a buffer nor static. With
   dropout a replay would reuse the recording's seed, the same mask every step: the graph runs uncaptured
   (decision 037).
2. **Warm-up**: the first call of each input signature (shapes, strides, dtypes, non-tensor values) runs
   uncaptured: Triton compiles, ATen initialises cuBLAS, launchers bind, none of which may happen while
   capturing.
3. **Record** on the second call, or on the third (the rule below): ``torch.cuda.graph`` on the pool of the Dynamo
   graph, shared by its forward, backward and inference graphs, so the backward reuses the blocks the forward
   freed; then replay.
   Static inputs (parameters and buffers, AOTAutograd's ``static_input_indices``; in a backward, parameters
   and the forward's saved tensors that live in this pool) are used in place: a replay needs them at the
   address they were recorded at, and a parameter that moved records again. Every other input (but an
   attention seed, item 1) is copied into a buffer the recording owns. A replay is not free either: its
   copies are GPU work, and it has host work of its own (the copy calls, the graph launch, the checks and the
   hand-out below). The **replay-cost rule** weighs that against the uncaptured call (decisions 054-057).
   Where the graph's launches, at :data:`HOST_US_A_LAUNCH` each (a lower bound: a Triton launch's host time),
   already pay for the replay and its copies are next to free (:data:`UNTIMED_COPY_US`), the signature is
   recorded on its second call. Otherwise that second call runs uncaptured and is timed (:func:`_timed_call`:
   host time, and GPU time with the call queued behind a sleeping GPU), and the third records it only if a replay
   would take at most half as long (:data:`REPLAY_MAX_FRACTION`): host and GPU work overlap, so each costs the
   larger of its host and GPU time, a replay's GPU time being the call's and its copies'
   (:func:`replay_cost_blocker`). If not, the signature runs uncaptured for good, with that reason (a graph of
   static shapes then runs with no per-call check: it has that one signature). A layer fed a 256 MiB activation
   (its copy costs more than any launch saves), a graph of a few kernels (its call costs about what a replay
   does) and a GPU-bound graph with copies to make (the attention projections at 1024 rows with their weights as
   inputs, 1.15-1.21x slower captured) run uncaptured; a host-bound one (a decode step) is recorded.
   :data:`REPLAY_COST_RULE` = False records every capturable graph.

   One graph's timing cannot see a step that is host-bound as a whole (the guards, AOTAutograd and the autograd
   engine around its graphs). So a signature the rule refuses although a replay would save at least half its call's
   host time (refused for the GPU time its copies add, or for being GPU-bound on its own) goes on its pool's **step
   trial** (decision 059, :data:`STEP_TRIAL`): :data:`STEP_PERIODS` periods between step starts are timed on the
   GPU's clock with it uncaptured, then as many with it recorded; the recordings are kept only if the captured
   steps' median period is at most 1 - :data:`STEP_MIN_GAIN` of the uncaptured steps'. Otherwise they are dropped
   (what they handed out raises, as at a step's start) and the signature runs uncaptured for good, with the trial's
   figures as the reason.
4. **Replay**: copy the non-static inputs, ``replay()``, hand out fresh tensors over the recorded outputs.

A new signature (a new shape) records a new graph, up to :data:`MAX_RECORDINGS` a compiled graph; past it,
that signature runs uncaptured.

**Outputs** follow the rule of torch's CUDA-graph trees. A forward or inference call made while no backward
is pending begins a *step*: every output handed out before it is invalidated, and reading one raises
``RuntimeError`` with :data:`OVERWRITTEN` (clone an output to keep it across steps; a ``.grad`` a captured
backward made is such an output, so accumulating gradients across steps needs ``.grad`` set to None first,
as ``optimizer.zero_grad()`` does). Within a step nothing is invalidated: a replay that would overwrite an
output of this step still referenced (its own, or one of a graph recorded after it, which may sit in blocks it
freed while it was recorded: a second forward before the first one's backward, say) runs uncaptured instead.
"""
from __future__ import annotations

import dataclasses
import operator
import sys
import weakref
from typing import Any, Callable, Collection, Sequence

import torch

from ... import config
from .. import records
from .wrapper import is_symbolic

MAX_RECORDINGS = 8  # graphs recorded a compiled graph (one a shape or a moved parameter set): each holds its
# outputs in the pool for good, so a model fed ever-new shapes is bounded at 8 sets of activations.
WARMUP_CALLS = 1  # uncaptured calls of a signature before it is recorded (Triton/cuBLAS initialise on the first)
# The replay-cost rule (decisions 054, 055, 057): a graph whose replay would take longer, with its inputs' copies and
# its own host time, than its uncaptured call takes (host and GPU time) runs uncaptured. The compiler suite's
# fwd+bwd graphs at 32768 x 4096 bf16 copy a 256 MiB input and a 256 MiB cotangent a step: captured, each
# memory-bound one took 1.4-2.3x its uncaptured time, under Inductor's CUDA graphs too. At 1024 rows, where the
# copies are 8 MiB, softmax's one-kernel graphs still took 51-56 us of host time a call captured against 18-21
# uncaptured (an H100's host); the four-GEMM attention projections' uncaptured calls took ~30 us a GEMM launch.
REPLAY_COST_RULE = True  # False: record every graph that can be captured, whatever its replay costs
HOST_US_A_LAUNCH = 5.0  # host time a launch of the uncaptured call takes at least, counted once more for the call:
# a graph whose launches at this figure pay for its replay is recorded without timing its call (a launch from a
# compiled graph costs 4.3-6.2 us on an H100's host, decision 035; a GEMM's ~30, decision 056)
TIMED_CALLS = 1  # uncaptured calls of a signature timed after the warm-up when its launches alone do not decide
# (the fastest counts)
UNTIMED_COPY_US = 2.0  # the most GPU time a replay's copies may take for its launches alone to decide: a graph
# that is GPU-bound gains nothing from a replay's saved host time and pays its copies' GPU time, so larger copies
# are weighed against the call's measured GPU time (the attention projections at 1024 rows, their weights passed
# as inputs: 136 MiB copied a forward, recorded on host time alone, the step took 1.21x its uncaptured time)
SLEEP_CYCLES = 20_000_000  # the GPU is kept busy this long (~10 ms) before a timed call, so that its launches
# queue and its kernels then run back to back: the span between events around them is their GPU time alone
REPLAY_HOST_US = 32.0  # a replay's own host time beyond its copy calls: the runner's checks, cudaGraphLaunch and
# the hand-out, 32 us a call in a softmax step on an H100's host (decision 055)
COPY_CALL_HOST_US = 20.0  # host time a copy call of a replay (the one _foreach_copy_, or one copy_) costs in a
# step: 18.7 us a call for an 8 MiB input on an H100's host, 8-9 us called alone
REPLAY_MAX_FRACTION = 0.5  # a graph is recorded only if its replay costs at most this fraction of its uncaptured
# call. At 1024 rows the compiler suite's memory-bound backwards recorded at 0.66-0.96 of their timed call (rms_norm's
# 52 against 79 us) made their steps 1.01-1.84x slower, and the attention projections' forward, at 0.73 (281 against
# 384 us), made its queued step 1.15x slower; one timed call on a noisy host (that forward: 196 us in one run, 384
# in another) cannot decide closer than this (decision 057)
COPY_TBPS_UNKNOWN = 2.0  # the copies' bandwidth (TB/s) on a part with no datasheet entry, and off the GPU
# The step trial (decision 059): a graph the rule above refuses although a replay would save at least half its call's
# host time (refused for its copies' GPU time, or for being GPU-bound on its own) can still shorten a step that is
# host-bound as a whole (Dynamo's guards, AOTAutograd and the autograd engine around it), which one graph's timing
# cannot see: the attention projections at 1024 rows, their weights passed as inputs, queued a step in 965 us of wall
# time for 570 us of kernels on one H100's host, where Inductor's capture made it 0.87x, and in 661 us on another,
# where it made it 1.18x. Their pool then times its steps uncaptured and captured, on the GPU's clock, and keeps the
# recordings only if the captured steps are shorter.
STEP_TRIAL = True  # False: such a graph runs uncaptured, as the rule alone decides
STEP_PERIODS = 5  # periods between step starts timed each way (the median counts: a host's step times spread 2x)
STEP_MIN_GAIN = 0.1  # the captured steps' median period may be at most (1 - this) of the uncaptured steps'

OVERWRITTEN = ("tilefuse: this tensor is an output of a CUDA graph (mode='reduce-overhead') that has been "
               "replayed since, which overwrote it. Clone an output you keep across steps (out.clone()). "
               "A .grad made by a captured backward is also overwritten: set .grad to None before each "
               "backward (optimizer.zero_grad(), the default set_to_none=True) rather than accumulating into it.")

def _sync_ops() -> frozenset:
    ops = []
    for name, overload in (("_local_scalar_dense", "default"), ("nonzero", "default"), ("masked_select", "default"),
                           ("_unique2", "default"), ("unique_dim", "default"), ("unique_consecutive", "default"),
                           ("equal", "default"), ("is_nonzero", "default"), ("bincount", "default"),
                           ("repeat_interleave", "Tensor")):
        packet = getattr(torch.ops.aten, name, None)
        if packet is not None and hasattr(packet, overload):
            ops.append(getattr(packet, overload))
    return frozenset(ops)


# ATen ops that synchronise with the host or whose output size depends on data: none can run in a capture.
SYNC_OPS = _sync_ops()


def _op_name(target) -> str:
    return str(getattr(target, "__name__", target))


def _mutated_placeholder(node: torch.fx.Node) -> list:
    """The placeholders that ``node`` writes into (through views), for an op with a mutable schema."""
    target = node.target
    schema = getattr(target, "_schema", None)
    if schema is None or not schema.is_mutable:
        return []
    out = []
    for k, arg in enumerate(schema.arguments):
        if arg.alias_info is None or not arg.alias_info.is_write:
            continue
        value = node.args[k] if k < len(node.args) else node.kwargs.get(arg.name)
        while isinstance(value, torch.fx.Node) and value.op == "call_function":
            vschema = getattr(value.target, "_schema", None)
            ret = vschema.returns[0].alias_info if vschema is not None and vschema.returns else None
            if ret is None or ret.is_write or not value.args:  # not a view of its first argument
                break
            value = value.args[0]
        if isinstance(value, torch.fx.Node) and value.op == "placeholder":
            out.append(value)
    return out


def _seed_ops() -> tuple[frozenset, frozenset]:
    try:
        from ...kernels.attention import ops, ops_score_mod  # noqa: F401  (register the tilefuse:: attention ops)
    except Exception:  # noqa: BLE001 - the attention family unavailable: no such node in any graph
        return frozenset(), frozenset()
    t = torch.ops.tilefuse
    return (frozenset({t.attention_fwd.default, t.attention_mod_fwd.default}),
            frozenset({t.attention_bwd.default, t.attention_mod_bwd.default}))


# The attention family's ops that draw a dropout seed on the host and return it as their third output, a 0-d
# CPU tensor (0 without dropout), and the backwards that take it as their ``seed`` argument.
_SEED_FORWARDS, _SEED_BACKWARDS = _seed_ops()
_SEED_OUTPUT = 2


def _arg(n: torch.fx.Node, name: str):
    names = [a.name for a in n.target._schema.arguments]
    k = names.index(name)
    return n.args[k] if k < len(n.args) else n.kwargs.get(name)


def _no_dropout(n: torch.fx.Node) -> bool:
    p = _arg(n, "dropout_p")
    return isinstance(p, (int, float)) and p == 0


def _dropout_reason(n: torch.fx.Node) -> str | None:
    """Why an attention op with dropout keeps its graph uncaptured (None: not such an op)."""
    if (n.target not in _SEED_FORWARDS and n.target not in _SEED_BACKWARDS) or _no_dropout(n):
        return None
    return (f"{n.name} ({_op_name(n.target)}) has dropout (dropout_p={_arg(n, 'dropout_p')}): its seed is drawn on "
            f"the host at each call, and a replay would reuse the recording's, the same dropout mask every step")


def _replayable_cpu_output(n: torch.fx.Node) -> bool:
    """Whether the CPU tensor ``n`` makes is one a replay may hand out as the recording made it: the attention
    forward's seed when there is no dropout, so that it is the constant 0, and no op of the graph reads it (an
    inference graph leaves it unread; a training forward returns it, saved for its backward, whose kernels do
    not read it without dropout)."""
    if n.target not in _SEED_FORWARDS or not _no_dropout(n):
        return False
    if not all(u.target is operator.getitem for u in n.users):
        return False
    return all(u.args[1] != _SEED_OUTPUT or all(w.op == "output" for w in u.users) for u in n.users)


def seed_outputs(gm: torch.fx.GraphModule) -> frozenset:
    """The output positions of ``gm`` that are an attention forward's seed a replay may hand out as recorded
    (:func:`_replayable_cpu_output`): a training forward's seeds, saved for the backward."""
    returned = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    returned = returned if isinstance(returned, (list, tuple)) else [returned]
    return frozenset(j for j, v in enumerate(returned)
                     if isinstance(v, torch.fx.Node) and v.target is operator.getitem and v.args[1] == _SEED_OUTPUT
                     and isinstance(v.args[0], torch.fx.Node) and _replayable_cpu_output(v.args[0]))


def seed_inputs(gm: torch.fx.GraphModule) -> frozenset:
    """The input positions of ``gm`` read only as the ``seed`` of an attention backward without dropout (a
    training backward's seeds, which the forward drew and saved): a CPU tensor there does not stop a capture,
    since those kernels do not read the seed, and a replay leaves it as recorded."""
    def only_as_seed(n: torch.fx.Node, p: torch.fx.Node) -> bool:
        if n.target not in _SEED_BACKWARDS or not _no_dropout(n) or _arg(n, "seed") is not p:
            return False
        return sum(a is p for a in (*n.args, *n.kwargs.values())) == 1

    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    return frozenset(k for k, p in enumerate(placeholders) if p.users and all(only_as_seed(u, p) for u in p.users))


def _has_unbacked(val) -> bool:
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    try:
        return bool(free_unbacked_symbols(val))
    except Exception:  # a value free_unbacked_symbols does not walk (an opaque object): nothing symbolic in it
        return False


def graph_blockers(gm: torch.fx.GraphModule, static: Sequence[int]) -> list[str]:
    """Why the graph ``gm`` cannot be captured whatever its arguments (empty: it can). ``static``: the input
    positions that are parameters or buffers (used in place by a replay)."""
    reasons = []
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    position = {n: k for k, n in enumerate(placeholders)}
    static = set(static)
    for n in gm.graph.nodes:
        if n.op != "call_function":
            continue
        if n.target in SYNC_OPS:
            reasons.append(f"{n.name} ({_op_name(n.target)}) synchronises with the host or has a data-dependent "
                           f"size")
            continue
        dropout = _dropout_reason(n)
        if dropout is not None:
            reasons.append(dropout)
            continue
        val = n.meta.get("val")
        if _has_unbacked(val):
            reasons.append(f"{n.name} ({_op_name(n.target)}) has data-dependent sizes")
        vals = val if isinstance(val, (list, tuple)) else [val]
        if n.target is not operator.getitem and \
                any(isinstance(v, torch.Tensor) and v.device.type == "cpu" for v in vals) and \
                any(isinstance(p.meta.get("val"), torch.Tensor) and p.meta["val"].device.type == "cuda"
                    for p in placeholders) and not _replayable_cpu_output(n):
            reasons.append(f"{n.name} ({_op_name(n.target)}) makes a CPU tensor in a CUDA graph (a copy to the "
                           f"host synchronises)")
        for p in _mutated_placeholder(n):
            if position[p] not in static:
                reasons.append(f"input {position[p]} ({p.name}) is mutated in place ({n.name}: "
                               f"{_op_name(n.target)}) and is not a parameter or buffer: a replay would write the "
                               f"recording's copy of it, not the caller's tensor")
    return list(dict.fromkeys(reasons))


def call_blockers(args: Sequence[Any], *, interpreting: bool, seeds: Collection[int] = ()) -> list[str]:
    """Why a call with these arguments cannot be captured (empty: it can). ``seeds``: the positions of attention
    seeds a replay may leave as recorded (:func:`seed_inputs`), which may be CPU tensors."""
    if interpreting:
        return ["Triton's interpreter runs the kernels (no CUDA device): there is nothing to capture"]
    reasons = []
    tensors = [(k, a) for k, a in enumerate(args) if isinstance(a, torch.Tensor) and k not in seeds]
    for k, a in tensors:
        if a.device.type != "cuda":
            reasons.append(f"input {k} is a {a.device.type.upper()} tensor (a CUDA graph captures CUDA work only)")
            break
    if not tensors and not reasons:
        reasons.append("the graph has no CUDA tensor input")
    if not reasons and not hasattr(torch._C, _STORAGE_ERROR):
        reasons.append(f"this torch build has no torch._C.{_STORAGE_ERROR}: an output a replay overwrote could "
                       f"not be made to raise when read")
    return reasons


def capture_blockers(gm: torch.fx.GraphModule, args: Sequence[Any], static: Sequence[int] = (), *,
                     interpreting: bool) -> list[str]:
    """Every reason the graph ``gm`` called with ``args`` runs uncaptured (empty: it is recorded)."""
    return call_blockers(args, interpreting=interpreting, seeds=seed_inputs(gm)) + graph_blockers(gm, static)


def replay_cost_us(nbytes: int, tbps: float, copy_calls: int) -> tuple[float, float]:
    """What a replay that copies ``nbytes`` of inputs in ``copy_calls`` calls costs beyond the graph's work: the
    copies' GPU time (``nbytes`` read and written at ``tbps``) and its own host time (:data:`REPLAY_HOST_US` and
    :data:`COPY_CALL_HOST_US` a copy call), in microseconds."""
    return 2 * max(nbytes, 0) / (tbps * 1e6), REPLAY_HOST_US + COPY_CALL_HOST_US * copy_calls


def launches_pay_for_replay(nbytes: int, launches: int, tbps: float, copy_calls: int = 0) -> bool:
    """Whether ``launches`` launches, at :data:`HOST_US_A_LAUNCH` each and once more for the call (the least an
    uncaptured call of them costs on the host), pay for a replay (:func:`replay_cost_us`, at most
    :data:`REPLAY_MAX_FRACTION` of them) without timing the call: only where the replay's copies take at most
    :data:`UNTIMED_COPY_US` of GPU time, which a GPU-bound graph would pay for nothing."""
    saved_us = HOST_US_A_LAUNCH * (launches + 1)
    if saved_us == float("inf"):
        return True
    copy_us, host_us = replay_cost_us(nbytes, tbps, copy_calls)
    return copy_us <= UNTIMED_COPY_US and copy_us + host_us <= REPLAY_MAX_FRACTION * saved_us


def replay_cost_blocker(nbytes: int, call_us: float, tbps: float, copy_calls: int = 0,
                        gpu_us: float | None = None) -> str | None:
    """Why a graph whose uncaptured call took ``call_us`` of host time and ``gpu_us`` of GPU time is not worth
    recording, its replay copying ``nbytes`` of inputs in ``copy_calls`` calls (:func:`replay_cost_us`) (None: it
    is). Host and GPU work overlap, so a call costs the larger of the two: uncaptured ``max(call_us, gpu_us)``,
    replayed ``max(replay host time, gpu_us + the copies' GPU time)``, which may be at most
    :data:`REPLAY_MAX_FRACTION` of the first. Without ``gpu_us`` (not measured) the replay's host time and copies
    are added up against ``call_us``, as if the graph's own GPU time were nil."""
    copy_us, host_us = replay_cost_us(nbytes, tbps, copy_calls)
    if gpu_us is None:
        replayed, uncaptured = copy_us + host_us, call_us
    else:
        replayed, uncaptured = max(host_us, gpu_us + copy_us), max(call_us, gpu_us)
    if replayed <= REPLAY_MAX_FRACTION * uncaptured:
        return None
    where = "tilefuse.compiler.runtime.cudagraphs"
    took = f"~{call_us:.0f} us of host time" + ("" if gpu_us is None else f" and ~{gpu_us:.0f} us of GPU time")
    over = (f"more than {where}.REPLAY_MAX_FRACTION = {REPLAY_MAX_FRACTION:g} of its uncaptured call, which took "
            f"{took} (timed after the warm-up; {where}.REPLAY_COST_RULE = False records it anyway)")
    host = (f"~{host_us:.0f} us of host time of its own ({where}.REPLAY_HOST_US = {REPLAY_HOST_US:g} us and "
            f"{copy_calls} copy call{'s' if copy_calls != 1 else ''} at COPY_CALL_HOST_US = {COPY_CALL_HOST_US:g} us)")
    if copy_us > host_us or (gpu_us is not None and gpu_us + copy_us > host_us):
        return (f"the inputs a replay would copy ({nbytes / 2**20:.1f} MiB) take ~{copy_us:.0f} us of GPU time at "
                f"{tbps:g} TB/s, and the replay {host}: {over}")
    return (f"a replay would cost {host}" + (f" and ~{copy_us:.0f} us of GPU time copying {nbytes / 2**20:.1f} MiB "
                                            f"of inputs at {tbps:g} TB/s" if nbytes > 0 else "") + f": {over}")


def _timed_call(run: Callable, args: list) -> tuple[Any, float, float | None]:
    """``run(args)`` uncaptured, the host time it took and its GPU time (us; None where not measured), timed by
    :func:`tilefuse.device.queued_behind_a_sleep` on the one CUDA device of ``args``: its queue drained first (with
    the sync after the call, two syncs a signature), its GPU asleep for :data:`SLEEP_CYCLES` while the call queues.
    Nothing is synced or timed on the GPU while the caller captures a CUDA graph of its own (a sync there is an
    error), or for arguments on several devices. The garbage collector waits until the call is over."""
    from ... import device as tf_device

    devices = {a.device for a in args if isinstance(a, torch.Tensor) and a.device.type == "cuda"}
    stream = None
    if len(devices) == 1 and not torch.cuda.is_current_stream_capturing():
        stream = torch.cuda.current_stream(next(iter(devices)))
    return tf_device.queued_behind_a_sleep(lambda: run(args), stream, SLEEP_CYCLES)


_TBPS: dict[int, float] = {}


def copy_tbps(dev: torch.device) -> float:
    """The HBM bandwidth (TB/s) of the datasheet of ``dev``'s part (:data:`COPY_TBPS_UNKNOWN` without one)."""
    if dev.type != "cuda":
        return COPY_TBPS_UNKNOWN
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    tbps = _TBPS.get(index)
    if tbps is None:
        from ... import device as tf_device

        sheet = tf_device.datasheet_named(torch.cuda.get_device_name(index))
        tbps = _TBPS[index] = sheet.hbm_tbps if sheet is not None else COPY_TBPS_UNKNOWN
    return tbps


def signature(args: Sequence[Any], positions: Sequence[int] | None = None) -> tuple:
    """The key of a recording: each tensor's shape, strides, dtype and device; other values themselves.
    ``positions``: only these arguments (a runner leaves out the parameters, whose shapes Dynamo guards: a
    GPT-2 step has ~150 of them, 0.7 us of host time each to key on this 2-core CPU, 0.07 us to compare an
    address)."""
    picked = args if positions is None else [args[k] for k in positions]
    return tuple((tuple(a.shape), tuple(a.stride()), a.dtype, a.device) if isinstance(a, torch.Tensor) else a
                 for a in picked)


def _extent(t: torch.Tensor) -> int:
    """Elements from a tensor's first to its last addressed element (its span in its storage)."""
    if t.numel() == 0:
        return 0
    return 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))


def _copy_span(span: torch.Tensor, src: torch.Tensor) -> None:
    """Copy the span ``src`` addresses into ``span`` (1-d, same length): an input's copy keeps its strides, and
    a tensor whose elements share memory (an expanded one) cannot be written element by element."""
    if span.numel():
        span.copy_(src.as_strided((span.numel(),), (1,), src.storage_offset()))


def _copy_inputs(dsts: list, srcs: list) -> None:
    """A replay's input copies, each into the recorded tensor over its buffer (same shape and strides: the
    signature), in one foreach call: one launch for the inputs of one dtype. A view and a ``copy_`` an input
    cost 45 us of host time for three inputs on an H100's host, this call 11 (and no more than a ``copy_`` for
    one input: 6.9 against 7.4)."""
    torch._foreach_copy_(dsts, srcs)


# torch's foreach kernels take 65536-element chunks, at most 320 a launch: a larger input costs that call a launch
# every 21 M elements (two 134 M-element inputs a step, the compiler suite's bf16 graphs at 32768 rows, cost 34 us
# more host time a step in one call than with a copy_ each; decision 054)
FOREACH_ONE_LAUNCH = 320 * 65536


def split_copies(inputs: Sequence[tuple[int, torch.Tensor]]) -> tuple[list, list, list]:
    """How a replay copies its ``(position, tensor)`` inputs: the positions copied in the one foreach call, those
    copied with a ``copy_`` each (too large for one launch of that call), and those copied span to span (their
    elements overlap). Empty inputs are not copied."""
    batched, alone, spans = [], [], []
    for k, t in inputs:
        if t.numel():
            (spans if _overlaps(t) else alone if t.numel() > FOREACH_ONE_LAUNCH else batched).append(k)
    return batched, alone, spans


def copy_calls(inputs: Sequence[tuple[int, torch.Tensor]]) -> int:
    """The copy calls a replay of these inputs makes (:func:`split_copies`): one for the batched ones, one each
    for the rest."""
    batched, alone, spans = split_copies(inputs)
    return int(bool(batched)) + len(alone) + len(spans)


def _overlaps(t: torch.Tensor) -> bool:
    """Whether elements of ``t`` share memory (an expanded input), or torch cannot tell: such an input is copied
    span to span, as a copy element by element cannot write it."""
    return torch._debug_has_internal_overlap(t) != 0


def _storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


# ------------------------------------------------------------------------------------------------ step trial
def _cuda_mark(device: torch.device):
    """A step start on the GPU's clock: an event recorded on the device's current stream (~2 us of host time)."""
    event = torch.cuda.Event(enable_timing=True)
    event.record(torch.cuda.current_stream(device))
    return event


def _cuda_periods_us(marks: list) -> list[float]:
    """The periods between consecutive marks, in us (waits for the last one: one sync a side of a trial)."""
    marks[-1].synchronize()
    return [a.elapsed_time(b) * 1e3 for a, b in zip(marks, marks[1:])]


_step_mark, _periods_us = _cuda_mark, _cuda_periods_us


class StepTrial:
    """A pool's A/B of its steps: :data:`STEP_PERIODS` periods between step starts with the candidate signatures
    uncaptured (``phase`` "uncaptured"), then as many with them recorded and replayed ("captured"). Timed on the
    GPU's clock: whether a step's time is set by the host or the GPU, the period between step starts is the step's
    time once steps queue back to back, where a host clock would see only the host's part. A period in which a
    graph of the pool was timed or recorded counts for neither side (``dirty``)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.phase = "uncaptured"
        self.marks: list = []
        self.dirty = False
        self.candidates: list[tuple] = []  # (runner, signature)
        self.uncaptured_us: float | None = None  # the uncaptured side's median period, once timed


# ------------------------------------------------------------------------------------------------ pool
class Pool:
    """One CUDA memory pool for the graphs of one Dynamo graph (its forward, backward, inference graphs).

    Holds the recordings in the order they were made (the invalidation rule above) and the addresses of the
    storages they own (a backward's saved inputs that live here are static)."""

    def __init__(self):
        self.handle = None
        self.recordings: list[Recording] = []
        self.trial: StepTrial | None = None  # the step trial under way
        self.trial_over = False  # a pool runs one step trial
        _POOLS.add(self)

    def propose(self, runner: "GraphRunner", key, device: torch.device) -> bool:
        """Put ``runner``'s signature ``key`` on this pool's step trial, starting it; False when the trial is past
        timing its uncaptured steps (or over), or cannot run (no CUDA device)."""
        if self.trial is None:
            if self.trial_over or device.type != "cuda" and _step_mark is _cuda_mark:
                return False
            self.trial = StepTrial(device)
        if self.trial.phase != "uncaptured":
            return False
        self.trial.candidates.append((runner, key))
        return True

    def trial_step(self) -> None:
        """A step starts (a forward or inference call with no backward pending) while the trial runs: mark it on
        the GPU's clock; after :data:`STEP_PERIODS` periods, go on to the captured steps, or decide."""
        t = self.trial
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            return  # (the caller's own capture: no event may be timed in it)
        if t.dirty:  # the step before timed a call or recorded: its period is neither way's
            t.marks, t.dirty = [], False
        t.marks.append(_step_mark(t.device))
        if len(t.marks) <= STEP_PERIODS:
            return
        periods = _periods_us(t.marks)
        t.marks = []
        period = sorted(periods)[len(periods) // 2]
        if t.phase == "uncaptured":
            t.uncaptured_us, t.phase = period, "captured"
            return
        keep = period <= (1 - STEP_MIN_GAIN) * t.uncaptured_us
        self.trial, self.trial_over = None, True
        graphs = sorted({f"{r.graph_id} ({r.kind})" for r, _ in t.candidates})
        text = (f"step trial: a step took {period:.0f} us with graph{'s' if len(graphs) > 1 else ''} "
                f"{', '.join(graphs)} captured, against {t.uncaptured_us:.0f} us uncaptured (the median of "
                f"{STEP_PERIODS} periods between step starts each way, on the GPU's clock)")
        text += (": kept" if keep else f": more than 1 - STEP_MIN_GAIN = {1 - STEP_MIN_GAIN:g} of it, so "
                 f"{'they run' if len(graphs) > 1 else 'it runs'} uncaptured (tilefuse.compiler.runtime.cudagraphs."
                 f"STEP_TRIAL = False skips the trial)")
        records.bump("cudagraph_step_trials")
        config.log(1, f"cuda graph: {text}")
        for runner, key in t.candidates:
            runner._trial_verdict(key, keep, text)

    def drop(self, rec: "Recording") -> None:
        """Forget a recording: what it handed out and is still referenced raises on access from now on (its memory
        goes back to the pool), and the recordings after it move up (their order is the invalidation rule's)."""
        rec.invalidate()
        self.recordings.remove(rec)
        for k, r in enumerate(self.recordings):
            r.seq = k

    def get_handle(self):
        if self.handle is None:
            self.handle = torch.cuda.graph_pool_handle()
        return self.handle

    def owns(self, t: torch.Tensor) -> bool:
        ptr = _storage_key(t)
        return any(ptr in r.owned_ptrs for r in self.recordings)

    def held_bytes(self) -> int:
        return sum(r.held_bytes for r in self.recordings)

    def pending_backward(self) -> bool:
        """A forward of this pool has saved tensors still alive (its backward has not run)."""
        return any(r.saved_alive() for r in self.recordings)

    def step_state(self) -> list | None:
        """One pass for a forward's replay: None while a backward is pending, else the handed-out storages still
        referenced, (recording, key), which the step's start invalidates. (pending_backward, then start_step,
        checked every storage twice: ~650 checks of GPT-2's ~400 a training step.)"""
        alive = []
        for r in self.recordings:
            for key, storage in r.handed.items():
                if r._alive(key, storage):
                    if key[1]:
                        return None
                    alive.append((r, key))
        return alive

    def start_step(self) -> int:
        """A forward or inference call with no backward pending begins a step: every output handed out before
        is invalidated (reading it raises); returns how many were still referenced."""
        return sum(r.invalidate() for r in self.recordings)

    def in_use(self, start: int) -> bool:
        """Outputs handed out in this step by a recording made at or after ``start`` are still referenced
        (a replay of recording ``start`` may overwrite them: its own outputs, or blocks it freed while it was
        recorded and a later recording took)."""
        return any(r.outputs_alive() for r in self.recordings[start:])


_POOLS: "weakref.WeakSet[Pool]" = weakref.WeakSet()


def pools_held_bytes() -> int:
    """Bytes the recordings of every live pool keep allocated (their outputs and input buffers)."""
    return sum(p.held_bytes() for p in list(_POOLS))


@dataclasses.dataclass
class _Out:
    kind: str  # "const" (``value`` itself: not a tensor, or an attention seed) | "input" (input ``index`` itself) |
    # "input view" (a view of it) | "owned" (a view of owned storage ``index``)
    index: int = 0
    value: Any = None
    size: tuple = ()
    stride: tuple = ()
    offset: int = 0
    dtype: Any = None
    saved: bool = False  # a forward's output saved for its backward


class Recording:
    """One recorded CUDA graph: its static inputs, input buffers and outputs."""

    def __init__(self, graph, inputs: list, spans: list, static: set, outputs, pool: Pool, saved: set,
                 seeds: Collection[int] = ()):
        self.graph = graph
        self.inputs = inputs  # per position: the tensor the graph reads (the caller's, or a buffer of ours)
        self.static = static
        self.static_ptrs = {k: inputs[k].data_ptr() for k in static}
        # the same, as torch's C++ check takes it: the addresses by position (None elsewhere) and the positions
        self.static_at = [self.static_ptrs.get(k) for k in range(len(inputs))]
        self.static_positions = sorted(self.static_ptrs)
        # (position, the buffer: a 1-d tensor of its own, not a view, which a copy under grad mode may write)
        # copied span to span, which an expanded input (stride 0) needs
        self.copied = spans
        # what a replay copies: into the recorded tensors themselves, all in one call (_copy_inputs), but an input
        # too large for one launch of that call, copied on its own (one_copies); span to span where an input's
        # elements overlap
        self.copy_at, alone, by_span = split_copies([(k, inputs[k]) for k, _ in spans])
        self.one_copies = [(k, inputs[k]) for k in alone]
        self.span_copies = [(k, span) for k, span in spans if k in by_span]
        self.copy_into = [inputs[k] for k in self.copy_at]
        self.outputs = outputs  # the tensors the capture returned: kept, so their blocks stay ours
        input_storages = {_storage_key(inputs[k]): k for k in static}
        storages: dict[int, torch.Tensor] = {}
        for k, _ in self.copied:
            storages.setdefault(_storage_key(inputs[k]), inputs[k])
        self.layout: list[_Out] = []
        for j, out in enumerate(outputs):
            # an attention seed (``seeds``, :func:`seed_outputs`): a 0-d CPU tensor holding 0, which a replay
            # neither writes nor frees; the recording's own tensor is handed out, so it is not pool memory, nor
            # invalidated at the next step, nor a backward still to run
            if not isinstance(out, torch.Tensor) or j in seeds:
                self.layout.append(_Out("const", value=out))
                continue
            ptr = _storage_key(out)
            geometry = dict(size=tuple(out.shape), stride=tuple(out.stride()), offset=out.storage_offset(),
                            dtype=out.dtype, saved=j in saved)
            if ptr in input_storages:
                k = input_storages[ptr]
                whole = (tuple(inputs[k].shape), tuple(inputs[k].stride()), inputs[k].storage_offset()) == \
                    (geometry["size"], geometry["stride"], geometry["offset"])
                self.layout.append(_Out("input" if whole else "input view", index=k, **geometry))
                continue
            storages.setdefault(ptr, out)
            self.layout.append(_Out("owned", index=list(storages).index(ptr), **geometry))
        self.storages = [(ptr, t.device, t.untyped_storage().nbytes()) for ptr, t in storages.items()]
        # what hand_out walks each replay, as plain tuples (~250 outputs a GPT-2 training forward), each owned
        # output with the metadata torch's constructor takes, made once
        self.plan_out = [(spec.kind, spec.value if spec.kind == "const" else spec.index, spec.saved, spec.size,
                          spec.stride, spec.offset, spec.dtype, _metadata(self.storages[spec.index], spec)
                          if spec.kind == "owned" else None) for spec in self.layout]
        self.owned_ptrs = set(storages)
        self.held_bytes = sum(nbytes for _, _, nbytes in self.storages)
        # (owned storage index, saved) -> the storage object the last replay's outputs there are on (over the
        # pool's memory, no deleter), and per output the tensor handed out (None for one not owned). Both kept:
        # a later replay hands the same ones out again where nothing else references them any more (decision
        # 047), and their use counts say whether something does (an output, a view of one, a tensor autograd
        # saved, a gradient taken from one)
        self.handed: dict = {}
        self.cached: list = [None] * len(self.plan_out)
        self.slots: dict = {}  # (owned storage index, saved) -> the output positions on it
        for j, (kind, index, saved, *_) in enumerate(self.plan_out):
            if kind == "owned":
                self.slots.setdefault((index, saved), []).append(j)
        _enable_cached_tensors()
        # a static input is read at its address, not through this tensor: holding it would keep a forward's
        # saved tensors alive for good (a backward's static inputs), which reads as a backward still to run
        self.inputs = [None if k in static else a for k, a in enumerate(inputs)]
        pool.recordings.append(self)
        self.seq = len(pool.recordings) - 1

    def matches(self, args) -> bool:
        """Every static input at the address it was recorded at. A GPT-2 replay has ~180 of them: torch's C++
        check (CUDA builds; what its own CUDA-graph trees call) does them in one call where Python took ~0.1 us
        an input."""
        if _PTRS_EQUAL is not None and type(args) is list:
            return _PTRS_EQUAL(args, self.static_at, self.static_positions)
        return all(args[k].data_ptr() == ptr for k, ptr in self.static_ptrs.items())

    def _alive(self, key, storage) -> bool:
        """Something but this recording references the storage of ``key`` or a tensor handed out on it: the
        storage's users beyond the storage object and the kept tensors, or a kept tensor's beyond the list."""
        cached = self.cached
        kept = 0
        for j in self.slots[key]:
            t = cached[j]
            if t is not None:
                if t._use_count() != 1 or sys.getrefcount(t) > _KEPT_REFS:
                    return True
                kept += 1
        return _USE_COUNT(storage._cdata) != 1 + kept

    def saved_alive(self) -> bool:
        return any(self._alive(key, storage) for key, storage in self.handed.items() if key[1])

    def outputs_alive(self) -> bool:
        return any(self._alive(key, storage) for key, storage in self.handed.items())

    def invalidate(self) -> int:
        """Make the outputs handed out by the last replay that are still referenced raise on access, and stop
        reusing their storages and tensors; returns how many storages that was. The message goes on the
        storage, so every view of an output raises too. The rest is kept for the next replay."""
        return self.invalidate_keys([key for key, storage in self.handed.items() if self._alive(key, storage)])

    def invalidate_keys(self, keys) -> int:
        for key in keys:
            _set_error(self.handed.pop(key))
            self._forget(self.slots[key])
        return len(keys)

    def _forget(self, positions) -> None:
        cached = self.cached
        for j in positions:
            if cached[j] is not None:
                _remove_cached(cached[j])
                cached[j] = None

    def __del__(self):
        try:
            self._forget(range(len(self.cached)))
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def replay(self, args, before_launch: Callable | None = None) -> list:
        """Copy the inputs in, call ``before_launch`` (a step's invalidation: after the copies, since an
        argument may be an output of the step before, a KV cache say), launch, hand out the outputs."""
        copy_into, span_copies, one_copies = self.copy_into, self.span_copies, self.one_copies
        if copy_into or span_copies or one_copies:  # grad mode off for the copies (an inference graph runs with
            # it on; its inputs may require grad), switched directly: torch.no_grad() costs ~1 us a replay of host time
            grad = torch.is_grad_enabled()
            torch._C._set_grad_enabled(False)
            try:
                if copy_into:
                    _copy_inputs(copy_into, [args[k] for k in self.copy_at])
                for k, dst in one_copies:
                    dst.copy_(args[k])
                for k, span in span_copies:
                    _copy_span(span, args[k])
            finally:
                torch._C._set_grad_enabled(grad)
        if before_launch is not None:
            before_launch()
        self.graph.replay()
        return self.hand_out(args)

    def hand_out(self, args) -> list:
        """Tensors over the recorded outputs, on storage objects of their own, so that invalidating them later
        leaves the recording's own tensors (and the pool's blocks) untouched. The storage objects and tensors of
        the last replay are handed out again: a replay comes after the step's invalidation (which drops those
        still referenced) or finds none of its outputs in use. A kept tensor is registered with torch as a
        cached tensor, so that autograd, counting its references, still takes a handed-out gradient as
        ``.grad`` instead of copying it."""
        handed = self.handed  # (owned storage, saved) -> storage: a tensor a backward saved never shares a storage
        # object with one the caller holds, so that a kept user output does not look like a backward still to run
        cached = self.cached
        out = []
        construct = _TENSOR_ON_STORAGE
        for j, (kind, index, saved, size, stride, offset, dtype, meta) in enumerate(self.plan_out):
            if kind == "owned":
                t = cached[j]
                if t is None:
                    storage = handed.get((index, saved))
                    ptr, dev, nbytes = self.storages[index]
                    if storage is None:
                        storage = handed[index, saved] = torch._C._construct_storage_from_data_pointer(
                            ptr, dev, nbytes)
                    if construct is not None and dev.type == "cuda":
                        t = construct(meta, storage)
                    else:
                        t = torch.empty(0, dtype=dtype, device=dev).set_(storage, offset, size, stride)
                    _add_cached(t)
                    cached[j] = t
                out.append(t)
            elif kind == "input":
                out.append(args[index])
            elif kind == "input view":
                out.append(args[index].as_strided(size, stride, offset))
            else:
                out.append(index)  # a constant
        return out


def _metadata(storage: tuple, spec: _Out) -> dict:
    """What torch's tensor-on-storage constructor takes for an owned output."""
    ptr, dev, nbytes = storage
    return {"nbytes": nbytes, "data_ptr": ptr, "size": spec.size, "stride": spec.stride, "dtype": spec.dtype,
            "device": dev, "storage_offset": spec.offset}


# A storage's users (tensors on it and storage objects): 1 when only the storage object holds it
_USE_COUNT = torch._C._storage_Use_Count
_add_cached = torch._C._add_cached_tensor
_remove_cached = torch._C._remove_cached_tensor


def _kept_refs() -> int:
    """What sys.getrefcount reports in Recording._alive for a tensor referenced only by the kept list."""
    cached = [torch.empty(0)]
    for j in range(1):
        t = cached[j]
        return sys.getrefcount(t)
    return 0


_KEPT_REFS = _kept_refs()


def _enable_cached_tensors() -> None:
    """torch's registry of cached tensors (what its own CUDA-graph trees turn on): a registered tensor's
    reference from its cache does not count where autograd decides whether it may take a gradient as it is."""
    torch._C._set_cached_tensors_enabled(True)


# torch._C._tensors_data_ptrs_at_indices_equal(tensors, pointers by position, positions): CUDA builds only
_PTRS_EQUAL = getattr(torch._C, "_tensors_data_ptrs_at_indices_equal", None)

# A tensor over a storage with its metadata in one call (CUDA builds): what torch.empty(0).set_(...) does in two,
# which cost ~20 us of host time an output on an H100's host (decision 036).
_TENSOR_ON_STORAGE = getattr(torch._C, "_construct_CUDA_Tensor_From_Storage_And_Metadata", None)


# The overwritten-output error goes on the StorageImpl (CUDA builds only), so every tensor and view over it
# raises; torch's per-tensor _set_storage_access_error_msg would detach only the one tensor it is given
# (decision 028). The storage was made by hand_out over the pool's memory with no deleter: dropping its data
# pointer frees nothing.
_STORAGE_ERROR = "_set_storage_data_ptr_access_error_msg"


def _set_error(storage: torch.UntypedStorage) -> None:
    getattr(torch._C, _STORAGE_ERROR)(storage._cdata, OVERWRITTEN)


# ------------------------------------------------------------------------------------------------ runner
def _interpreting() -> bool:
    from ... import device as tf_device

    return tf_device.interpreting()


class GraphRunner:
    """Captures and replays one compiled graph (see the module docs); ``run`` runs it uncaptured."""

    def __init__(self, gm: torch.fx.GraphModule, run: Callable, kind: str, graph_id: int, pool: Pool, *,
                 static: Sequence[int] = (), saved: Sequence[int] = (), maybe_static: Sequence[int] = (),
                 capture: Callable | None = None, interpreting: bool | None = None,
                 launches: Callable[[], int] | None = None):
        self.run = run
        self.launches = launches  # the graph's launches (kernels, externs, ATen ops) for the replay-cost rule; None:
        # no rule
        self.kind = kind
        self.graph_id = graph_id
        self.pool = pool
        self.static = set(static)  # parameters and buffers
        self.maybe_static = set(maybe_static)  # a backward's saved inputs: static when they live in the pool
        self.saved = set(saved)  # a forward's outputs saved for the backward
        self.seed_inputs = seed_inputs(gm)  # attention seeds (CPU tensors): read where they are, not copied
        self.seed_outputs = seed_outputs(gm)  # attention seeds: the recording's tensor handed out
        self.capture = capture or capture_cuda_graph
        self.interpreting = _interpreting() if interpreting is None else interpreting
        reasons = call_blockers((), interpreting=True)[:1] if self.interpreting else []
        reasons += graph_blockers(gm, self.static)
        # a graph of static shapes sees one signature (Dynamo guards its inputs' sizes, strides and devices): once
        # that one is refused, every call runs uncaptured with no signature taken (~4 us of host time a call on a
        # 2-core CPU, which a host-bound step of two refused graphs paid twice)
        self.static_shapes = not any(is_symbolic(n.meta.get("val")) for n in gm.graph.nodes if n.op == "placeholder")
        # why every call runs uncaptured, for good: what blocks the graph whatever its arguments, or (above) the
        # refusal of a static-shape graph's one signature
        self.settled: str | None = "; ".join(reasons) if reasons else None
        self.calls: dict[tuple, int] = {}  # signature -> uncaptured calls so far
        self.recordings: dict[tuple, list[Recording]] = {}
        self.refused: dict[tuple, str] = {}  # signature -> why it runs uncaptured for good
        self.timed: dict[tuple, list] = {}  # signature -> (host us, GPU us or None) of its timed uncaptured calls
        self.total_recordings = 0
        self.key_positions: list | None = None  # the arguments a signature reads (all but the parameters)
        self.on_trial: dict[tuple, str] = {}  # signature -> why it waits for its pool's step trial
        self._report: records.CudaGraphReport | None = None
        self._report_generation = -1
        if self.settled:
            config.log(1, f"cuda graph: graph {graph_id} ({kind}) will run uncaptured: {self.settled}")

    @property
    def report(self) -> records.CudaGraphReport:
        """This graph's report, kept until ``reset_stats()`` starts new ones (looking it up under the records'
        lock each call was a third of an uncaptured call's cost in this runner)."""
        if self._report_generation != records._generation:
            self._report = records.cudagraph_report(self.graph_id, self.kind)
            self._report_generation = records._generation
        return self._report

    def _uncaptured(self, reason: str) -> None:
        counts = self.report.uncaptured
        calls = counts.get(reason)
        counts[reason] = 1 if calls is None else calls + 1
        if calls is None:
            config.log(1, f"cuda graph: graph {self.graph_id} ({self.kind}) runs uncaptured: {reason}")

    def _refuse(self, key, reason: str) -> None:
        """``key`` runs uncaptured for good (:meth:`_settle`), counting this call."""
        self._settle(key, reason)
        self._uncaptured(reason)

    def _settle(self, key, reason: str) -> None:
        """``key`` runs uncaptured for good; a static-shape graph for which it is the only signature, with no
        per-call check from now on."""
        self.refused[key] = reason
        if self.static_shapes and not self.recordings and set(self.calls) <= {key}:
            self.settled = reason

    def __call__(self, args: list):
        if self.pool.trial is not None and self._starts_step():
            self.pool.trial_step()
        settled = self.settled
        if settled is not None:
            self._uncaptured(settled)
            return self.run(args)
        positions = self.key_positions
        if positions is None or len(positions) and positions[-1] >= len(args):
            positions = self.key_positions = [k for k in range(len(args))
                                              if k not in self.static or not isinstance(args[k], torch.Tensor)]
        key = signature(args, positions)
        refused = self.refused.get(key)
        if refused is not None:
            self._uncaptured(refused)
            return self.run(args)
        recs = self.recordings.get(key)
        if recs:
            for rec in recs:
                if rec.matches(args):
                    return self._replay(rec, args)
        elif self.calls.get(key, 0) < WARMUP_CALLS:
            self.calls[key] = self.calls.get(key, 0) + 1
            return self.run(args)
        on_trial = self.on_trial.get(key)
        if on_trial is not None and not recs and (self.pool.trial is None or self.pool.trial.phase != "captured"):
            self._uncaptured(on_trial)
            return self.run(args)
        reasons = call_blockers(args, interpreting=False, seeds=self.seed_inputs)
        if reasons:
            self._refuse(key, "; ".join(reasons))
            return self.run(args)
        if self.total_recordings >= MAX_RECORDINGS:
            why = "moved parameters" if recs else "new input shapes"
            reason = (f"{why} beyond the limit of {MAX_RECORDINGS} recordings a graph "
                      f"(tilefuse.compiler.runtime.cudagraphs.MAX_RECORDINGS)")
            if recs:
                self._uncaptured(reason)
            else:
                self._refuse(key, reason)
            return self.run(args)
        static = self._static(args)
        copied = self._copied(args, static)
        if not recs and on_trial is None and self.launches is not None and REPLAY_COST_RULE:
            nbytes = sum(_extent(args[k]) * args[k].element_size() for k in copied)
            tbps = copy_tbps(args[copied[0]].device) if copied else COPY_TBPS_UNKNOWN
            calls = copy_calls([(k, args[k]) for k in copied])
            if not launches_pay_for_replay(nbytes, self.launches(), tbps, calls):
                timed = self.timed.setdefault(key, [])
                if len(timed) < TIMED_CALLS:
                    if self.pool.trial is not None:
                        self.pool.trial.dirty = True
                    out, host_us, gpu_us = _timed_call(self.run, args)
                    timed.append((host_us, gpu_us))
                    self.report.call_us, self.report.call_gpu_us = min(timed, key=lambda t: t[0])
                    return out
                host_us, gpu_us = min(timed, key=lambda t: t[0])
                cost = replay_cost_blocker(nbytes, host_us, tbps, calls, gpu_us)
                if cost is not None:
                    if self._propose(key, args, host_us, gpu_us, calls, cost):
                        self._uncaptured(self.on_trial[key])
                    else:
                        self._refuse(key, cost)
                    return self.run(args)
        return self._record(key, args, static, set(copied), rerecord=bool(recs))

    def _propose(self, key, args, host_us: float, gpu_us: float | None, calls: int, cost: str) -> bool:
        """Put a signature the replay-cost rule refused on the pool's step trial: only where a replay would save at
        least half the timed call's host time (what the rule asks of the host side) and the call's GPU time was
        measured, so that the rule refused it for the GPU time its copies add or for being GPU-bound alone."""
        if not STEP_TRIAL or gpu_us is None:
            return False
        _, replay_host_us = replay_cost_us(0, 1.0, calls)
        if replay_host_us > REPLAY_MAX_FRACTION * host_us:
            return False
        device = next((a.device for a in args if isinstance(a, torch.Tensor) and a.device.type == "cuda"),
                      torch.device("cpu"))
        if not self.pool.propose(self, key, device):
            return False
        self.on_trial[key] = (f"waiting for the step trial (tilefuse.compiler.runtime.cudagraphs.STEP_TRIAL): "
                              f"{STEP_PERIODS} steps timed uncaptured, then as many captured; alone the graph "
                              f"would not be recorded, as {cost}")
        return True

    def _trial_verdict(self, key, keep: bool, text: str) -> None:
        """The pool's step trial decided: keep this signature's recordings, or drop them and run it uncaptured for
        good, with ``text`` as the reason."""
        self.on_trial.pop(key, None)
        self.report.step_trial = text
        if keep:
            return
        for rec in self.recordings.pop(key, []):
            self.pool.drop(rec)
            self.total_recordings -= 1
            self.report.recordings -= 1
            self.report.held_bytes -= rec.held_bytes
        self._settle(key, text)

    def _static(self, args) -> set:
        """The positions a recording reads in place: parameters and buffers, and a backward's saved tensors that
        live in this pool (a captured forward's outputs)."""
        static = set(k for k in self.static if isinstance(args[k], torch.Tensor))
        return static | {k for k in self.maybe_static
                         if isinstance(args[k], torch.Tensor) and self.pool.owns(args[k])}

    def _copied(self, args, static: set) -> list:
        """The positions a recording copies into buffers of its own: every tensor not read in place but an
        attention seed, which is passed as it is (a CPU tensor, which no CUDA buffer may hold and a replay does not
        read; a forward's seed is no storage of the pool, so it is not static either)."""
        return [k for k, a in enumerate(args)
                if isinstance(a, torch.Tensor) and k not in static and k not in self.seed_inputs]

    def _starts_step(self) -> bool:
        return self.kind != "backward" and not self.pool.pending_backward()

    def _start_step(self, alive: list | None = None) -> None:
        """Invalidate what is still referenced: ``alive`` as Pool.step_state found it, or (None) all of it."""
        if alive is None:
            self.report.invalidated += self.pool.start_step()
            return
        self.report.invalidated += sum(r.invalidate_keys((key,)) for r, key in alive)

    def _replay(self, rec: Recording, args):
        # a forward or inference replay with no backward pending starts a step: what was handed out before and is
        # still referenced is invalidated (after the input copies, which may read it), and nothing is in use
        alive = self.pool.step_state() if self.kind != "backward" else None
        starts = alive is not None
        if not starts and self.pool.in_use(rec.seq):
            if self.kind == "backward":
                why = "outputs of this step's earlier replays are still in use: replaying would overwrite them"
            else:
                why = ("tensors a previous replay saved for its backward are still alive (the backward has not "
                       "run): replaying would overwrite them")
            self._uncaptured(why)
            return self.run(args)
        report = self.report
        report.replays += 1
        return rec.replay(args, (lambda: self._start_step(alive)) if starts else None)

    def _record(self, key, args, static: set, copied: set, rerecord: bool):
        inputs, spans = [], []
        with torch.no_grad():
            for k, a in enumerate(args):
                if k in copied:
                    span = torch.empty(_extent(a), dtype=a.dtype, device=a.device)
                    _copy_span(span, a)
                    spans.append((k, span))
                    inputs.append(span.as_strided(a.shape, a.stride(), 0))
                else:
                    inputs.append(a)
        starts = self._starts_step()
        if self.pool.trial is not None:
            self.pool.trial.dirty = True
        try:
            graph, outputs = self.capture(self.run, inputs, self.pool)
        except Exception as exc:
            reason = f"capture failed: {type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
            self._refuse(key, reason)
            return self.run(args)
        rec = Recording(graph, inputs, spans, static, list(outputs), self.pool, self.saved, self.seed_outputs)
        self.recordings.setdefault(key, []).append(rec)
        report = self.report
        report.recordings += 1
        self.total_recordings += 1
        report.rerecordings += int(rerecord)
        report.shapes.append([list(k[0]) for k in key if isinstance(k, tuple)])
        report.held_bytes += rec.held_bytes
        report.inputs_in_place, report.inputs_copied = len(static), len(rec.copied)
        report.copied_bytes = sum(span.untyped_storage().nbytes() for _, span in rec.copied)
        records.bump("cudagraph_recordings")
        if rerecord:
            records.bump("cudagraph_rerecordings")
        config.log(1, f"cuda graph: graph {self.graph_id} ({self.kind}) recorded for shapes "
                      f"{report.shapes[-1]} ({len(static)} inputs in place, {len(rec.copied)} copied, "
                      f"{rec.held_bytes / 2**20:.1f} MiB held)")
        report.replays += 1
        return rec.replay(args, self._start_step if starts else None)


def capture_cuda_graph(run: Callable, inputs: list, pool: Pool):
    """Record ``run(inputs)`` into a CUDA graph on ``pool``; returns (graph, the outputs it wrote).

    cuBLAS keeps a workspace a (handle, stream), made on first use: a matmul in a capture makes one for the
    capture stream (and one more for autograd's thread's handle in a backward), 32 MiB each on Hopper, in the
    pool, and cuBLAS then holds it for good. Releasing cuBLAS's workspaces after the capture hands those blocks
    back to the pool (the graph still uses them as scratch, like any temporary of the capture, which later
    recordings of the pool may reuse under the step rule); held, they were most of the memory a captured
    training step had beyond an uncaptured one (decision 036).

    They are released before the capture as well, so that the capture makes its own in this pool. Every capture
    in the process shares torch's capture stream: a workspace another capture made for it (triton's
    do_bench_cudagraph with a matmul, a user's own graph) lives in that capture's pool, and a graph of ours
    that used it would read freed memory once the release below gave it back to that pool and the next
    ``torch.cuda.empty_cache()`` (which every ``torch.cuda.graph`` calls) returned the pool to the driver: an
    illegal memory access at a replay."""
    dev = next(a.device for a in inputs if isinstance(a, torch.Tensor))
    with torch.cuda.device(dev):  # the capture stream is the inputs' device's, not the current device's
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        release_cublas_workspaces()
        try:
            # thread_local: a backward is recorded on autograd's device thread while the main thread waits
            with torch.cuda.graph(graph, pool=pool.get_handle(), capture_error_mode="thread_local"):
                outputs = run(list(inputs))
            torch.cuda.synchronize()
        finally:
            release_cublas_workspaces()
    return graph, outputs


def release_cublas_workspaces() -> None:
    """Drop cuBLAS's per-stream workspaces (an eager matmul makes its stream's again on its next call)."""
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()


def _tangent(name: str) -> bool:
    return name.startswith("tangents") or "bwd_seed" in name or "bwd_base_offset" in name


def input_roles(gm: torch.fx.GraphModule, kind: str, fw_metadata=None) -> dict:
    """Which inputs of ``gm`` a replay uses in place and which outputs a backward saves, from AOTAutograd's
    metadata of the graph being compiled (``None``: no metadata, every input is copied).

    forward / inference: ``static`` = ``static_input_indices`` (parameters and buffers); a forward's outputs
    past ``num_forward`` (its returns to the caller) are the tensors saved for the backward.
    backward: a saved parameter (``primals_K`` where forward input K-1 is static) is static; the other saved
    values are static when they live in the pool (a captured forward's outputs), else copied; tangents are
    copied."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    fw_static = set(getattr(fw_metadata, "static_input_indices", None) or ())
    if kind == "backward":
        static, maybe = [], []
        for k, p in enumerate(placeholders):
            if _tangent(p.name):
                continue
            if p.name.startswith("primals_") and p.name[8:].isdigit() and int(p.name[8:]) - 1 in fw_static:
                static.append(k)
            else:
                maybe.append(k)
        return {"static": static, "maybe_static": maybe, "saved": []}
    static = sorted(k for k in fw_static if k < len(placeholders))
    saved: list = []
    if kind == "forward" and fw_metadata is not None:
        outputs = next(n for n in gm.graph.nodes if n.op == "output").args[0]
        saved = list(range(int(getattr(fw_metadata, "num_forward", len(outputs))), len(outputs)))
    return {"static": static, "maybe_static": [], "saved": saved}


def runner_for(compiled, gm: torch.fx.GraphModule, kind: str, pool: Pool) -> GraphRunner:
    """The runner of a :class:`runtime.CompiledGraph` being compiled (AOTAutograd's tracing context active)."""
    context = torch._guards.TracingContext.try_get()
    roles = input_roles(gm, kind, context.fw_metadata if context is not None else None)
    return GraphRunner(gm, compiled.run, kind, compiled.graph_id, pool, launches=lambda: graph_launches(compiled),
                       **roles)


def graph_launches(compiled) -> int:
    """The launches an uncaptured call of ``compiled`` makes, for the replay-cost rule: its plan's kernels, extern
    calls and ops run in ATen; for a graph planned per shape or run in ATen, its ATen ops (an upper bound: views
    launch nothing)."""
    report = getattr(compiled, "report", None)
    if report is not None and getattr(compiled, "fallback_reason", None) is None:
        return len(report.kernels) + len(report.externs) + len(report.fallbacks)
    return sum(1 for n in compiled.gm.graph.nodes if n.op == "call_function")
