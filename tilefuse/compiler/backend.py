"""The Dynamo backend: ``torch.compile(model, backend="tilefuse")``.

Capture -> AOTAutograd (forward and backward graphs, torch's min-cut rematerialisation partitioner with the
reads of a written input saved rather than recomputed (:func:`save_reads_of_written_inputs`), the
decomposition table of decompositions.py, input mutations kept in inference graphs as ``copy_``) -> for each
graph a :class:`runtime.CompiledGraph` (lower -> schedule -> codegen -> cache -> wrapper).

A model never fails because of tilefuse: an op that cannot be lowered is an ATen extern (lowering/), a
graph that cannot be planned runs as the ATen graph AOTAutograd produced, and a Dynamo graph AOTAutograd
cannot trace runs as Dynamo captured it. Complex tensors (out of scope) are extern nodes, op by op. Each is
counted in ``stats()["fallbacks"]`` with its reason and shown at ``TILEFUSE_DEBUG=1``. ``TILEFUSE_STRICT=1`` raises instead.

The name ``tilefuse`` is registered by ``tilefuse/__init__`` (lazily) and by the package's
``torch_dynamo_backends`` entry point; this module must not register it again.
"""
from __future__ import annotations

import functools
import time

import torch

from .. import config
from . import lowering, options, records, reinplace, runtime
from .runtime import cudagraphs
from .decompositions import decomposition_table
from .lowering import FallbackError

__all__ = ["tilefuse_backend"]


def _fallback(where: str, reason: str) -> None:
    if config.get().strict:
        raise FallbackError(f"tilefuse strict mode: {where} would fall back to ATen: {reason}")
    records.add_fallback(where, reason)  # (warns: a fallback is never silent)
    records.bump("graph_fallbacks")


def _boxed(gm):
    def run(args):
        return gm(*args)
    run._boxed_call = True
    return run


def _compiler(kind: str, pool=None):
    def compile_graph(gm: torch.fx.GraphModule, example_inputs):
        cfg = config.get()
        t0 = time.perf_counter()
        try:
            in_place = reinplace.write_mutations_in_place(gm)
            if in_place:
                config.log(1, f"{kind} graph: input mutations written in place: {', '.join(in_place)}")
                paired = reinplace.pair_row_writes(gm)
                if paired:
                    config.log(1, f"{kind} graph: row writes with one index paired into one launch: "
                                  f"{', '.join(paired)}")
            compiled = runtime.CompiledGraph(gm, kind, cfg.strict)
        except FallbackError:
            raise
        except Exception as exc:  # the graph as AOTAutograd made it, in ATen
            reason = f"{type(exc).__name__}: {exc}"
            if isinstance(exc, (lowering.GraphFallback, runtime.PlanError)):
                reason = str(exc)
            elif cfg.strict:
                raise
            _fallback(f"{kind} graph", reason)
            report = records.GraphReport(-1, kind, sum(1 for n in gm.graph.nodes if n.op == "call_function"),
                                       whole_graph_fallback=reason)
            records.record(report)
            return _boxed(gm)
        elapsed = time.perf_counter() - t0
        records.bump("graphs")
        records.bump("compile_seconds", elapsed)
        plan = compiled.plan
        if plan is not None:
            _account(plan.report, elapsed)
        else:
            report = records.GraphReport(compiled.graph_id, kind,
                                       sum(1 for n in gm.graph.nodes if n.op == "call_function"))
            report.seconds = {"total": elapsed}
            records.record(report)
            config.log(1, f"graph {compiled.graph_id} ({kind}): dynamic shapes, planned per shape at call time")
            compiled.on_plan = _account
        if cfg.cudagraphs and pool is not None:
            compiled.cudagraphs = cudagraphs.runner_for(compiled, gm, kind, pool)
        return compiled
    # AOTAutograd compiles a backward graph on its first backward: when that runs inside a frame Dynamo is
    # compiling (loss.backward() in a compiled training step), Dynamo would otherwise trace the compiler's own
    # Python (a compiled step had 97 frames converted, the lowering's, scheduler's and codegen's among them, and
    # Dynamo's walks over their globals then raced the compiler's imports: "dictionary changed size").
    return torch._dynamo.disable(compile_graph, reason="tilefuse's compiler is not traced by Dynamo")


def _account(report: records.GraphReport, elapsed: float | None = None) -> None:
    records.bump("kernels", len(report.kernels))
    records.bump("externs", len(report.externs))
    records.add_op_fallbacks(report.graph_id, report.kind, report.fallbacks)  # (one warning a graph)
    records.record(report)
    if config.get().debug >= 1:
        total = elapsed if elapsed is not None else sum(report.seconds.values())
        parts = ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in report.seconds.items())
        names = ", ".join(k.name for k in report.kernels) or "none"
        config.log(1, f"graph {report.graph_id} ({report.kind}): {report.aten_nodes} ATen nodes -> "
                      f"{len(report.kernels)} kernels [{names}], {len(report.externs)} externs; "
                      f"compiled in {total * 1e3:.1f} ms ({parts})")
        for where, reason in report.fallbacks:
            config.log(1, f"fallback: {where} runs in ATen: {reason}")


@functools.lru_cache(maxsize=1)
def _partition_fn():
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    def partition(joint_module, joint_inputs, **kwargs):
        save_reads_of_written_inputs(joint_module.graph)
        return min_cut_rematerialization_partition(joint_module, joint_inputs, **kwargs)
    return partition


def save_reads_of_written_inputs(graph: torch.fx.Graph) -> list[torch.fx.Node]:
    """Mark each forward node that reads an input the forward writes into (``copy_`` into a placeholder) as one
    the backward must get saved, not recompute; returns them. The min-cut partitioner may otherwise recompute
    such a read in the backward, after the write: a module that increments a buffer and multiplies by it
    (``self.count.add_(1); y * self.count``) got ``count + 1`` recomputed from the incremented buffer, a gradient
    twice eager's (torch 2.13, every backend that uses the partitioner). Views of the input are followed to
    their readers (a saved view would alias the written input)."""
    from torch.utils.checkpoint import CheckpointPolicy

    aten = torch.ops.aten
    written = {n.args[0] for n in graph.nodes
               if n.op == "call_function" and n.target is aten.copy_.default and n.args[0].op == "placeholder"}
    pinned: list[torch.fx.Node] = []
    for p in written:
        stack, seen = list(p.users), set()
        while stack:
            u = stack.pop()
            if u in seen or u.op != "call_function":
                continue
            seen.add(u)
            if u.target is aten.copy_.default and u.args[0] is p:
                continue  # the write itself
            if getattr(u.target, "is_view", False):  # an OpOverload whose schema aliases an argument, read-only
                stack.extend(u.users)
                continue
            u.meta["recompute"] = CheckpointPolicy.MUST_SAVE
            pinned.append(u)
    return pinned


_MODES_WARNED: set = set()


def check_backend_arguments(kwargs: dict) -> dict:
    """What ``torch.compile(..., mode=, options=)`` hands the backend; returns the config overrides (:mod:`.options`:
    debug, strict, cache_dir, autotune, cudagraphs; an unknown key, bad value or unknown mode is an error).
    ``mode="reduce-overhead"`` is ``options={"cudagraphs": True}``; the max-autotune modes compile the default,
    with a warning a mode."""
    kwargs = dict(kwargs)
    mode, opts = kwargs.pop("mode", None), kwargs.pop("options", None)
    if kwargs:
        raise TypeError(f"tilefuse backend: unexpected argument(s) {', '.join(sorted(kwargs))}; "
                        f"torch.compile passes only mode= and options=")
    overrides = options.validate(opts)
    from_mode, warning = options.mode_options(mode)
    if warning and mode not in _MODES_WARNED:
        import warnings

        _MODES_WARNED.add(mode)
        warnings.warn(warning, stacklevel=2)
    return {**from_mode, **overrides}


def _find_attention(gm: torch.fx.GraphModule) -> None:
    """Attention in the Dynamo graph becomes the flash family's custom op (patterns/attention.py, record 027)."""
    from .codegen import score_mod
    from .patterns import attention as patterns_attention

    try:
        patterns_attention.rewrite(gm, compile_score_mod=score_mod.compile_chain)
    except Exception as exc:  # the graph stays as captured: its attention runs as written
        if config.get().strict:
            raise
        _fallback("attention pass", f"{type(exc).__name__}: {exc}")


def tilefuse_backend(gm: torch.fx.GraphModule, example_inputs, **kwargs):
    """Dynamo backend entry point (``torch.compile(..., backend="tilefuse")``)."""
    from torch._functorch.aot_autograd import aot_module_simplified

    overrides = check_backend_arguments(kwargs)
    pool = cudagraphs.Pool()  # the forward, backward and inference graphs of this Dynamo graph share it
    with options.applied(overrides):
        _find_attention(gm)

    def compiler(kind):
        compile_graph = _compiler(kind, pool)
        if not overrides:
            return compile_graph

        def with_options(gm, example_inputs):
            with options.applied(overrides):
                return compile_graph(gm, example_inputs)
        return with_options

    try:
        with options.applied(overrides):
            return aot_module_simplified(
                gm, example_inputs,
                fw_compiler=compiler("forward"),
                bw_compiler=compiler("backward"),
                inference_compiler=compiler("inference"),
                decompositions=decomposition_table(),
                partition_fn=_partition_fn(),
                keep_inference_input_mutations=True,
            )
    except (FallbackError, torch._dynamo.exc.RestartAnalysis):
        raise  # RestartAnalysis: Dynamo's request to trace the frame again (e.g. with scalars specialised)
    except Exception as exc:
        if config.get().strict:
            raise
        # AOTAutograd itself could not trace the graph: run what Dynamo captured
        _fallback("Dynamo graph", f"AOTAutograd failed: {type(exc).__name__}: {exc}")
        return gm.forward
