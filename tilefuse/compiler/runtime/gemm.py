"""The runtime's part for GEMM steps (scheduler.GemmStep): their epilogue hooks and wrapper lines.

A fused step becomes one call of the library's GEMM with the generated hook::

    v_gelu = alloc((7, 65), (65, 1), torch.float32)
    v_add = alloc((7, 65), (65, 1), torch.float32)
    launch_gemm_addmm_mm(v_x, view(v_w, ...), (view(v_b, (7, 65), (0, 1), 0), v_add), v_gelu)

``launch_gemm_<step>`` is the step's :class:`GemmSite`: the library's
:func:`tilefuse.kernels.gemm.plan.gemm_with_epilogue` on its first call, then the plan that call made, replayed. A GEMM with no epilogue runs the library GEMM on Triton's interpreter
(the tests exercise it) and cuBLAS (``torch.matmul``) on a GPU, where the tuner's fused-or-split choice
(:func:`tilefuse.kernels.gemm.fusion_choice.epilogue_choice`) left the tail to its own kernel.
"""
from __future__ import annotations

import torch

from ... import config, device as tf_device
from ...kernels.gemm import plan as gemm_plan
from .. import cache, codegen, ir, records, scheduler


def prepare(sched: scheduler.Schedule, target: codegen.LaunchTarget) -> tuple[dict, list]:
    """(step name -> hook function, [(KernelSource, step)]) for the fused GEMM steps of ``sched``."""
    hooks, sources = {}, []
    for st in sched.steps:
        if isinstance(st, scheduler.GemmStep) and st.epilogue is not None:
            ks = codegen.generate_epilogue(st, sched, target)
            fn, origin = cache.load(ks)
            slots = ", ".join(f"e{k} {op.kind} {op.buffer}" for k, op in enumerate(st.operands)) or "none"
            config.log(2, f"gemm epilogue of {st.name} ({st.out_buffer}; slots {slots}): {ks.name} ({origin}) -> "
                          f"{cache.kernel_path(ks)}\n{ks.source}")
            hooks[st.name] = fn
            sources.append((ks, st))
    return hooks, sources


def report(sched: scheduler.Schedule, sources: list) -> list:
    """KernelReports for every GEMM step: the ATen nodes it runs (the matmul and its fused tail)."""
    fused = {st.name: ks for ks, st in sources}
    out = []
    table = sched.graph.by_name()
    for st in sched.steps:
        if not isinstance(st, scheduler.GemmStep):
            continue
        ks = fused.get(st.name)
        origins = list(st.epilogue.origins) if st.epilogue is not None else list(table[st.name].origins)
        stores = ([] if st.discard else [st.out_buffer]) + [op.buffer for op in st.operands if op.kind == "store"]
        name = f"gemm {st.name}" + (f" + epilogue {ks.name}" if ks is not None else "") + \
            (f" ({st.note})" if st.note else "") + (" (the product is not stored)" if st.discard else "")
        out.append(records.KernelReport(name, "gemm+epilogue" if ks is not None else "gemm", origins, stores,
                                        str(cache.kernel_path(ks)) if ks is not None else ""))
        records.bump("gemm_kernels")
    return out


# A GEMM whose operand or output has a row stride that is not a multiple of 16 bytes (a vocabulary of 50257
# columns: a language model's head and its gradients) gets neither TMA nor cuBLAS's aligned kernels: GPT-2's three
# head GEMMs in a training step took 282, 418 and 275 us on an H100 (cuBLAS's align1 kernels twice, a non-TMA
# Triton config), where its aligned GEMMs of as many multiply-adds take ~72. cuBLAS kept its align1 kernels on
# operands copied to aligned rows (the extent, 50257, stays odd); the library's TMA loads take an odd extent
# once the rows are aligned. So such a GEMM runs on the library, its misaligned operands copied to aligned rows
# (one read and one write each); the output is written in place, by masked stores. Below this many multiply-adds
# the copies are not worth their launches.
PAD_MIN_VOLUME = 1 << 28
PAD_BYTES = 16


def _misaligned(x: torch.Tensor) -> bool:
    es = x.element_size()
    return x.data_ptr() % PAD_BYTES != 0 or any(n > 1 and s != 1 and (s * es) % PAD_BYTES != 0
                                                  for n, s in zip(x.shape, x.stride()))


def aligned_copy(x: torch.Tensor) -> torch.Tensor:
    """``x``'s values in a new tensor of its shape, dtype and dimension order whose rows (along ``x``'s
    unit-stride dimension, the last or the one before it) start every ``PAD_BYTES`` bytes: a view of a padded
    buffer."""
    flip = x.dim() >= 2 and x.stride(-1) != 1 and x.stride(-2) == 1
    y = x.transpose(-1, -2) if flip else x
    step = PAD_BYTES // y.element_size()
    n = y.shape[-1]
    view = torch.empty(tuple(y.shape[:-1]) + (-(-n // step) * step,), dtype=y.dtype, device=y.device)[..., :n]
    view.copy_(y)
    return view.transpose(-1, -2) if flip else view


def pad_plan(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> tuple | None:
    """None for a GEMM cuBLAS may take as it is (aligned, or under :data:`PAD_MIN_VOLUME`); else which of ``a``
    and ``b`` the library's GEMM takes through an aligned copy (neither, when only ``out`` is misaligned)."""
    m, k = a.shape[-2], a.shape[-1]
    n = b.shape[-1]
    batch = out.numel() // max(1, m * n) if out.numel() else 0
    if batch * m * n * k < PAD_MIN_VOLUME:
        return None
    plan = (_misaligned(a), _misaligned(b))
    return plan if any(plan) or _misaligned(out) else None


def _alignment(a, b, extras, out) -> tuple:
    return (a.data_ptr() & 15, b.data_ptr() & 15, out.data_ptr() & 15, *(e.data_ptr() & 15 for e in extras))


class GemmSite:
    """One GEMM step of a compiled graph: the library GEMM (with the epilogue hook, if any) into ``out`` (not
    written when ``store_out`` is False: the hook stores every output, and ``out`` is a one-element stand-in).

    The library's repeat call builds the call's signature (each tensor's dtype, shape, strides, alignment, the
    options) to find its plan, and checks that ``out`` shares no memory with an input. A graph's step sees the
    same shapes, strides and dtypes at every call (its wrapper is one shape's), and ``out`` is a buffer the
    wrapper allocated for it. So after the first call the site keeps the plan that call made and replays it,
    checking only the alignment of each tensor and that the settings, the tuner's decisions and tf32 are still
    the plan's; anything else, or no plan kept, takes the library's call."""

    __slots__ = ("hook", "store_out", "kept", "pad", "__name__")

    def __init__(self, hook, store_out: bool):
        self.hook, self.store_out = hook, store_out
        self.kept = None  # (plan, what it was made under, the alignments it holds for): one tuple, set at once
        self.pad = False  # False: not decided yet; None: cuBLAS or the hook as before; else pad_plan's (a, b)
        self.__name__ = "gemm_site"

    @property
    def plan(self):
        return self.kept[0] if self.kept is not None else None

    def __call__(self, a, b, extras, out):
        hook = self.hook
        pad = self.pad
        if pad is False:  # (a wrapper's step sees one layout: decided once, on the first call)
            pad = self.pad = pad_plan(a, b, out)
        if pad is not None:  # (the library's GEMM, even with no epilogue)
            a = aligned_copy(a) if pad[0] else a
            b = aligned_copy(b) if pad[1] else b
        elif hook is None and not tf_device.interpreting():
            torch.matmul(a, b, out=out) if out.is_contiguous() else out.copy_(torch.matmul(a, b))
            return
        kept = self.kept
        if kept is not None and kept[0] is not None and gemm_plan.plan_current(kept[1]) and \
                _alignment(a, b, extras, out) == kept[2]:
            kept[0].run(a, b, None, None, None, None, extras, out, 1.0, 1.0)
            return
        gemm_plan.gemm_with_epilogue(a, b, hook, extras, out.dtype, out=out, store_out=self.store_out)
        self.kept = (*gemm_plan.epilogue_plan(a, b, hook, extras, out, self.store_out), _alignment(a, b, extras, out))


def _strided(writer, buffer: str, shape, stride, offset) -> str:
    return f"view({writer.var(buffer)}, {tuple(shape)!r}, {tuple(stride)!r}, {offset})"


def step_lines(writer, step: scheduler.GemmStep, hooks: dict) -> tuple[list[str], set[str]]:
    """The wrapper lines of one GEMM step (writer: runtime.WrapperWriter)."""
    table = writer.table
    gemm = table[step.name]
    lines, used = [], set()
    writes = [step.out_buffer] + [op.buffer for op in step.operands if op.kind == "store"]
    for name in writes:
        meta = ir.node_meta(table[name], name)
        # a discarded product: one element seen with zero strides (the library writes nothing there)
        stride = (0,) * len(meta.shape) if step.discard and name == step.out_buffer else tuple(meta.stride)
        lines.append(f"    {writer.var(name)} = alloc({tuple(meta.shape)!r}, {stride!r}, {meta.dtype})")
        used.add(writer.var(name))
    a, b = writer.view_expr(gemm.a), writer.view_expr(gemm.b)
    used.update((writer._base_var(gemm.a), writer._base_var(gemm.b)))
    extras = []
    for op in step.operands:
        extras.append(_strided(writer, op.buffer, gemm.shape, op.stride, op.offset))
        used.add(writer.var(op.buffer))
    out = _strided(writer, step.out_buffer, gemm.shape, step.out_stride, step.out_offset) if step.out and not step.discard \
        else writer.var(step.name)
    launcher = "launch_gemm_" + "".join(ch if ch.isalnum() else "_" for ch in step.name)
    while launcher in writer.globals:
        launcher += "_"
    writer.globals[launcher] = GemmSite(hooks.get(step.name), store_out=not step.discard)
    hook = hooks.get(step.name)
    writer.globals.setdefault("_kernel_names", {})[launcher] = f"gemm {step.name}" + (
        f" + {getattr(hook, '__name__', 'epilogue')}" if hook is not None else "")
    extras_text = f"({', '.join(extras)}{',' if len(extras) == 1 else ''})"
    lines.append(f"    {launcher}({a}, {b}, {extras_text}, {out})  # {writer.globals['_kernel_names'][launcher]}")
    return lines, used
