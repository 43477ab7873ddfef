"""L2 cache hints on the TMA loads of a GEMM's streamed operand, which Triton 3.6 cannot ask for.

A decode or skinny GEMM (M <= 256, N = K = 8192) reads its weight B once. After other work has left L2 full of
dirty lines (``triton.testing.do_bench``'s flush zeroes 256 MB before every timed call), each load of B that
evicts one of them pays for writing it back. PTX lets a TMA load carry an L2 policy
(``cp.async.bulk.tensor ... .L2::cache_hint [...], policy`` with ``createpolicy ... L2::evict_first``), so B's
lines go first and the dirty ones stay. Triton 3.6 drops a policy from its TMA loads (``desc.load`` takes none,
and its internal ``descriptor_load`` policy does not reach the PTX).

Measured (docs/decisions/014-gemm-l2-evict-first-on-b.md, ``tools/tma_hint_probe.py``, the same tile with
and without the hint, interleaved with cuBLAS): at 128x8192x8192 44.38 -> 40.19 us (0.999x -> 1.104x cuBLAS),
at 256x8192x8192 51.17 -> 48.78 us.

How: a kernel compiled with ``B_HINT`` puts :data:`MARKER` into its PTX (:func:`mark`, an empty inline asm),
and the stage hook :func:`install` adds, between Triton's ptx and cubin stages, the policy to every TMA load
whose tensor map is the kernel's second host-made descriptor parameter (B's: ``a_desc_h, b_desc_h, c_desc_h``
in the GEMM kernels' order). Kernels without the marker pass through untouched, and a hook that was already
installed still runs first. The marker is in the kernel's source, so the hinted kernel has a cache key of its
own; the hook is installed when :mod:`.gemm_launching` is imported, before any such kernel can be compiled.
NVIDIA only (the marker is PTX); never on Triton's interpreter.
"""
from __future__ import annotations

import re
import threading

import triton
import triton.language as tl

MARKER = "tilefuse-l2-hint b=evict_first"

# a TMA load as Triton 3.6 writes it: the predicate, the copy, [smem], [tensor map, {coords}], [mbarrier]
_TMA_LOAD = re.compile(r"^(\s*(?:@%p\d+\s+)?cp\.async\.bulk\.tensor\.\dd\.shared::cluster\.global\.mbarrier::"
                       r"complete_tx::bytes)( \[[^\]]+\], \[(%rd\d+), \{[^}]*\}\], \[[^\]]+\]);$")
_POLICIES = ("evict_first", "evict_last", "evict_normal", "evict_unchanged")


@triton.jit
def mark():
    """Put :data:`MARKER` into the kernel's PTX (an inline asm that is only a comment)."""
    tl.inline_asm_elementwise("// tilefuse-l2-hint b=evict_first", "=r", [], dtype=tl.int32, is_pure=False, pack=1)


def descriptor_registers(ptx: str) -> dict[str, int]:
    """The registers that hold a 128-byte tensor-map parameter's address, each with the parameter's index
    among the kernel's tensor-map parameters (0 = the first). Triton 3.6 takes the address as
    ``mov.b64 %rdX, NAME_param_P;`` then ``cvta.param.u64 %rdY, %rdX;``."""
    maps = re.findall(r"\.param \.align 64 \.b8 (\w+_param_\d+)\[128\]", ptx)
    moved = {reg: p for reg, p in re.findall(r"mov\.b64\s+(%rd\d+), (\w+_param_\d+);", ptx)}
    return {dst: maps.index(moved[src]) for dst, src in re.findall(r"cvta\.param\.u64\s+(%rd\d+), (%rd\d+);", ptx)
            if moved.get(src) in maps}


def add_hints(ptx: str, policies: dict[int, str]) -> tuple[str, int]:
    """``ptx`` with an L2 policy on the TMA loads of the tensor-map parameters in ``policies`` (index ->
    "evict_first" / "evict_last" / ...), and how many loads got one. The policies are made once, before the
    kernel's first instruction; every other line is left as it is."""
    bad = {p for p in policies.values() if p not in _POLICIES}
    if bad:
        raise ValueError(f"policies: {sorted(bad)} not among {_POLICIES}")
    regs = descriptor_registers(ptx)
    out, hinted, used = [], 0, set()
    for line in ptx.splitlines():
        m = _TMA_LOAD.match(line)
        which = regs.get(m.group(3)) if m else None
        if which in policies:
            line = f"{m.group(1)}.L2::cache_hint{m.group(2)}, %tfpol{which};"
            hinted += 1
            used.add(which)
        out.append(line)
    if not used:
        return ptx, 0
    text = "\n".join(out) + "\n"
    decl = f"\t.reg .b64 \t%tfpol<{max(used) + 1}>;\n" + "".join(
        f"\tcreatepolicy.fractional.L2::{policies[i]}.b64 \t%tfpol{i}, 1.0;\n" for i in sorted(used))
    regs_block = re.search(r"^\s*\.reg [^\n]*\n(?:\s*\.reg [^\n]*\n)*", text, flags=re.M)
    if regs_block is None:
        raise ValueError("no register declarations in the PTX: cannot place the cache policies")
    return text[:regs_block.end()] + decl + text[regs_block.end():], hinted


def hint_marked(ptx: str) -> str:
    """The PTX stage's rewrite: a kernel with :data:`MARKER` gets evict-first on its second tensor map (B).
    A marked kernel with no such load is a kernel this module does not understand: an error, not a silent
    miss."""
    if MARKER not in ptx:
        return ptx
    out, n = add_hints(ptx, {1: "evict_first"})
    if n == 0:
        raise RuntimeError("tilefuse: a kernel asked for an L2 hint on B (B_HINT) but its PTX has no TMA load of "
                           "a second tensor-map parameter; build it without B_HINT")
    return out


_lock = threading.Lock()
_installed = False


def install() -> None:
    """Add :func:`hint_marked` to Triton's NVIDIA pipeline (``knobs.runtime.add_stages_inspection_hook``),
    after whatever hook is there. Idempotent."""
    global _installed
    from triton import knobs

    with _lock:
        if _installed:
            return
        previous = knobs.runtime.add_stages_inspection_hook

        def hook(backend, stages, options, language, capability):
            if previous is not None:
                previous(backend, stages, options, language, capability)
            if "ptx" not in stages:  # not the NVIDIA pipeline
                return
            make_ptx = stages["ptx"]
            stages["ptx"] = lambda src, metadata: hint_marked(make_ptx(src, metadata))
        knobs.runtime.add_stages_inspection_hook = hook
        _installed = True
