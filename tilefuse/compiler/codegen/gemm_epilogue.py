"""Code generation of a fused GEMM epilogue: a scheduler ``GemmStep``'s pointwise consumers -> a ``@triton.jit`` hook
with the contract of :mod:`tilefuse.kernels.gemm.epilogue`, inserted into the library's one GEMM template (decision
026), written by the same :class:`KernelWriter` that writes pointwise kernels."""
from __future__ import annotations

import hashlib
import re

import torch

from ... import device
from .. import ir
from ..ir import float8
from ..ir import primitives as P
from ..scheduler import Schedule
from .kernel_writer import TL_DTYPE, KernelSource, KernelWriter, LaunchTarget, _Scope

EPILOGUE_SLOTS = 4  # tilefuse.kernels.gemm.epilogue.NUM_EXTRA_OPERANDS: the hook's (pointer, row stride, column stride) triples


class EpilogueWriter(KernelWriter):
    """A fused GEMM epilogue (scheduler.GemmStep) as a ``@triton.jit`` hook with the contract of
    :mod:`tilefuse.kernels.gemm.epilogue`: the same expression code as a tiled pointwise kernel, over the GEMM's
    tile (``yindex`` = the tile's rows, ``xindex`` its columns). A load of the GEMM's product at the tile's
    element is the accumulator (rounded to the product's dtype first, as eager reads the stored product); every
    other operand is a slot ``e{k}`` of the hook, read through its row and column strides; outputs besides the
    one the GEMM stores are written through their slots. Sizes are written as literals: the hook has no
    arguments of its own (a plan is made per shape anyway)."""

    def __init__(self, step, sched: Schedule, target: LaunchTarget):
        super().__init__(step.epilogue, sched, target)
        self.step = step
        self.gemm = self.table[step.name]
        self.slots = {(op.kind, op.buffer, op.stride, op.offset): k for k, op in enumerate(step.operands)}

    def size(self, value: int) -> str:
        return str(int(value))

    def symbolic_const(self, c) -> str:
        is_float = isinstance(c.value, float) or P.compute_dtype(c.dtype).is_floating_point
        return repr(float(c.value)) if is_float else str(int(c.value))

    def _slot(self, kind: str, buffer: str, index) -> int:
        from ..scheduler import _affine

        aff = _affine(index, ir.node_meta(self.table[buffer], buffer).stride, len(self.gemm.shape))
        key = (kind, buffer) + (aff if aff is not None else (None, None))
        if key not in self.slots:
            raise AssertionError(f"epilogue of {self.step.name}: no operand slot for {kind} {buffer}")
        return self.slots[key]

    def load(self, e: ir.Load, scope: _Scope):
        key = e
        if e.buffer == self.step.name:
            text = "acc"
            if e.dtype in P.HALF:  # eager's product is stored in the half type, then read by the tail
                text = f"acc.to({TL_DTYPE[e.dtype]}).to(tl.float32)"
            return self.emit(scope, text, P.compute_dtype(e.dtype), key)
        k = self._slot("load", e.buffer, e.index)
        mask = self.slot_mask(k)
        other = "0.0" if e.dtype in float8.FP8_DTYPES else "0"
        text = f"tl.load({self.slot_address(k)}, {mask}, other={other})" if mask else f"tl.load(e{k})"
        if e.dtype in P.HALF:
            text += ".to(tl.float32)"
        text = self.fp8_loaded(text, e.dtype)
        return self.emit(scope, text, P.compute_dtype(e.dtype), key)

    def slot_address(self, k: int) -> str:
        """Slot ``k``'s element addresses over the tile. A dimension the operand is broadcast along (stride 0
        in the plan) is left out, so a bias is a [1, BLOCK_N] vector load, not a tile of equal pointers: with
        128 x 128 tiles at 8 warps a full tile of 64-bit pointers a broadcast operand is 64 registers a
        thread, and the Linear+GeLU hook spilled 96 bytes on sm_90a with it."""
        stride = self.step.operands[k].stride
        terms = []
        if stride[-2]:
            terms.append(f"yindex * e{k}_sm")
        if stride[-1]:
            terms.append(f"xindex * e{k}_sn")
        return f"e{k} + " + " + ".join(terms) if terms else f"e{k}"

    def store_address(self, k: int) -> str:
        """Slot ``k``'s addresses for a store: a whole tile of them. A stride of 0 there is a dimension of size 1
        (legality keeps a store's elements apart), whose variable is 0 in every unmasked lane, but tl.store takes
        a tile of values only at a tile of addresses: a one-element output of a 1 x 1 product (an amax of it) was
        a scalar address."""
        stride = self.step.operands[k].stride
        pad = "".join(f" + 0 * {v}" for v, st in (("yindex", stride[-2]), ("xindex", stride[-1])) if not st)
        return self.slot_address(k) + pad

    def slot_mask(self, k: int) -> str:
        stride = self.step.operands[k].stride
        return {(True, True): "mask", (True, False): "ymask", (False, True): "xmask"}.get(
            (bool(stride[-2]), bool(stride[-1])), "")

    def write_hook(self) -> KernelSource:
        g = self.g
        self.uses_cache = {}
        self.bodies = dict(g.bodies)
        self.positions = dict(g.positions)
        self.local_values = {}
        self.macro_roots = set()
        self.form = "tiled"
        self.pvars, self.masks = ("yindex", "xindex"), ("ymask", "xmask")
        rank = len(self.gemm.shape)
        M, N = self.gemm.shape[-2], self.gemm.shape[-1]
        self.kmap = {f"k{d}": ir.const_index(0) for d in range(rank - 2)}
        self.kmap[f"k{rank - 2}"] = ir.var_index("yindex", M)
        self.kmap[f"k{rank - 1}"] = ir.var_index("xindex", N)
        self.local_uses = {r: (True, False) for r in g.roots}
        top = _Scope(None, "    ", True)
        top.lines += ["    yindex = offs_m[:, None]", "    xindex = offs_n[None, :]",
                      "    ymask = mask_m[:, None]", "    xmask = mask_n[None, :]", "    mask = ymask & xmask"]
        result = "acc"
        for r in g.roots:
            text, reg = self.expr(self.bodies[r], top)
            self.local_values[r] = (text, P.compute_dtype(self.table[r].dtype))
            if r == self.step.out_buffer:
                result = text if reg == torch.float32 else f"{self.tensor_text(text, reg, top)}.to(tl.float32)"
                if self.expr_uses(self.bodies[r]) != (True, True):  # a value constant along rows or columns
                    result = f"({result} + tl.zeros_like(acc))"
            elif r in g.stores:
                k = self._slot("store", r, self.positions[r])
                dtype = self.table[r].dtype
                value = text if dtype == torch.bool else self.stored_text(self.tensor_text(text, reg, top), reg, dtype)
                top.lines.append(f"    tl.store({self.store_address(k)}, {value}, mask)")
        for k, op in enumerate(self.step.operands):
            if op.kind == "store" and op.buffer == self.step.name:  # the raw product too (read elsewhere)
                dtype = self.gemm.dtype
                top.lines.append(f"    tl.store({self.store_address(k)}, acc.to({TL_DTYPE[dtype]}), mask)")
        top.lines.append(f"    return {result}")
        slots = ", ".join(f"e{k}, e{k}_sm, e{k}_sn" for k in range(EPILOGUE_SLOTS))
        sig = f"acc, offs_m, offs_n, mask_m, mask_n, {slots}"
        ops = []
        for o in g.origins:
            short = o.split(":", 1)[1].split(".")[1] if ":" in o and "." in o.split(":", 1)[1] else o
            if short not in ops:
                ops.append(short)
        summary = "_".join(re.sub(r"[^a-z0-9]", "", s.lower()) for s in ops[:4]) or "epilogue"
        helpers = P.helpers_closure(self.helpers)
        on_interpreter = self.target.interpreter or device.interpreting()
        helper_text = "\n\n".join(P.helper_text(h, on_interpreter, False) for h in helpers)
        imports = "import triton\nimport triton.language as tl\n"
        if not on_interpreter and any(h in P.GPU_HELPERS for h in helpers):
            imports += "from triton.language.extra import libdevice\n"
        targets = [o.split(":", 1)[1] if ":" in o else o for o in g.origins]
        # The source names no node of the graph (the step's nodes are in the graph's report and the debug log):
        # the same tail of another step (each layer of a model) is then the same hook, one Triton compile and one
        # tuning decision. GPT-2's training forward had a hook a layer and GEMM, 24 tunings of ~2 s each in its
        # first compile (decision 043).
        header = ["# GEMM epilogue hook (tilefuse.kernels.gemm.epilogue contract)",
                  f"# fuses {len(targets)} ATen nodes:"] + [f"#   {t}" for t in targets]
        stored = "nothing itself (its product is not needed)" if self.step.discard else "its product"
        header.append(f"# the GEMM stores {stored}; slots: "
                      + (", ".join(f"e{k} {op.kind}" for k, op in enumerate(self.step.operands)) or "none"))
        body = "\n".join(top.lines)
        draft = "\n".join(header) + "\n" + helper_text + f"\n@triton.jit\ndef HOOK({sig}):\n{body}\n"
        name = f"tfe_{summary}_{hashlib.sha256(draft.encode()).hexdigest()[:10]}"[:80]
        source = ("# tilefuse generated GEMM epilogue: " + name + "\n" + "\n".join(header) + "\n" + imports
                  + "\n\n" + (helper_text + "\n\n" if helper_text else "") + f"@triton.jit\ndef {name}({sig}):\n{body}\n")
        stores = tuple(r for r in g.stores)
        return KernelSource(name, source, (), (), (), 0, 0, "gemm-epilogue", g.name, stores)


def generate_epilogue(step, sched: Schedule, target: LaunchTarget | None = None) -> KernelSource:
    """The hook source of a fused GEMM step (scheduler.GemmStep with an epilogue)."""
    return EpilogueWriter(step, sched, target or LaunchTarget.current()).write_hook()
