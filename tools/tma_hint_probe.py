"""Do L2 cache hints on the TMA loads spare a decode GEMM the write-back of do_bench's dirty L2?

``triton.testing.do_bench`` zeroes 256 MB before each timed call, which leaves L2 full of dirty lines; a GEMM
that streams a 128 MiB B once (M <= 256, N = K = 8192) pays for writing them back (run 36: 7-8 us of ~44).
Register loads of B with an evict-first hint pay less of it (the ``b_stream`` configs), but Triton 3.6 drops
an eviction policy from its TMA loads (``desc.load`` takes none; its internal ``descriptor_load`` does, and the
PTX comes out the same). PTX has the hint: ``cp.async.bulk.tensor ... .L2::cache_hint [...], policy`` with a
policy from ``createpolicy``. A streaming access-policy window over B (``l2_flush_probe.py --window``, run 72)
saved nothing, so this asks the load-level question directly.

The same host-descriptor GEMM tile as ``tma_desc_probe.py``, compiled four times with different markers; a
Triton ``add_stages_inspection_hook`` rewrites the PTX of three of them before ptxas
(``tilefuse.kernels.ptx_hints.add_hints``, which the library's ``-ef`` configs now use for B): ``b_first`` (B's TMA
loads evict-first), ``a_last`` (A's evict-last: A is re-read by every program), ``both``. Timed in interleaved
rounds with cuBLAS at M = 64, 128, 256 (do_bench median, the dirty flush), each output checked first.

GPU (an H200 image: system python, PYTHONPATH=checkout)::

    python tools/tma_hint_probe.py [--shape MxNxK ...] [--rounds 6] [--csv PATH]

CPU: ``--ptx`` cross-compiles the four variants for sm_90a and prints each one's hinted loads (no GPU needed).
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton import knobs  # noqa: E402

from tma_desc_probe import _desc_gemm, record, write_csv  # noqa: E402

# (shape, tile (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages, GROUP_M)): the library's picks (runs 72-74)
CASES = (("64x8192x8192", (64, 64, 128, 4, 7, 1)), ("128x8192x8192", (64, 128, 64, 4, 8, 8)),
         ("256x8192x8192", (128, 128, 64, 4, 7, 8)))
# variant -> (policy of A's loads, policy of B's loads)
HINTS = {"none": (None, None), "b_first": (None, "evict_first"), "a_last": ("evict_last", None),
         "both": ("evict_last", "evict_first")}
MARK = "tma-hint-probe"  # + " a=<policy> b=<policy>": what the stage hook reads from a variant's PTX


def marker(variant: str) -> str:
    a, b = HINTS[variant]
    return f"// {MARK} a={a or '-'} b={b or '-'}"


@triton.jit
def hinted(a_desc, b_desc, c_ptr, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
           BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, STAGES: tl.constexpr, MARKER: tl.constexpr):
    """tma_desc_probe's host-descriptor tile, with MARKER (an inline asm comment) telling the hook which
    policies to write into its loads; each MARKER value is a kernel of its own in the JIT's cache."""
    tl.inline_asm_elementwise(MARKER, "=r", [], dtype=tl.int32, is_pure=False, pack=1)
    _desc_gemm(a_desc, b_desc, c_ptr, M, N, K, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, STAGES)


def install_hook() -> None:
    """Rewrite the PTX of the marked variants between Triton's ptx and cubin stages."""
    # (imported here: importing tilefuse on a machine without a GPU puts Triton on its interpreter, and --ptx
    # cross-compiles)
    from tilefuse.kernels.ptx_hints import add_hints

    previous = knobs.runtime.add_stages_inspection_hook

    def hook(backend, stages, options, language, capability):
        if previous is not None:
            previous(backend, stages, options, language, capability)
        make_ptx = stages["ptx"]

        def ptx_stage(src, metadata):
            ptx = make_ptx(src, metadata)
            m = re.search(MARK + r" a=(\S+) b=(\S+)", ptx)
            policies = {i: p for i, p in enumerate(m.groups()) if p != "-"} if m else {}
            if policies:
                ptx, n = add_hints(ptx, policies)
                if n == 0:
                    raise RuntimeError(f"{metadata['name']}: no TMA load of the hinted operands found in the PTX")
                metadata["tf_hinted_loads"] = n
            return ptx
        stages["ptx"] = ptx_stage
    knobs.runtime.add_stages_inspection_hook = hook
    knobs.compilation.always_compile = True  # a cached cubin would skip the hook


def show_ptx() -> int:
    """CPU: cross-compile the four variants for sm_90a and print the hinted loads and ptxas' verdict."""
    import os

    os.environ["TRITON_INTERPRET"] = "0"
    from triton.backends.compiler import GPUTarget

    install_hook()
    sig = {"a_desc": "tensordesc<bf16[64, 64]>", "b_desc": "tensordesc<bf16[64, 128]>", "c_ptr": "*bf16",
           "M": "i32", "N": "i32", "K": "i32", "BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "BLOCK_K": "constexpr",
           "GROUP_M": "constexpr", "STAGES": "constexpr"}
    sig["MARKER"] = "constexpr"
    for name in HINTS:
        const = {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "STAGES": 8, "MARKER": marker(name)}
        ck = triton.compile(triton.compiler.ASTSource(fn=hinted, signature=sig, constexprs=const),
                            target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
        ptx = ck.asm["ptx"]
        loads = [ln.strip() for ln in ptx.splitlines() if "cp.async.bulk.tensor" in ln]
        pols = [ln.strip() for ln in ptx.splitlines() if "createpolicy" in ln]
        print(f"{name}: {len(loads)} TMA loads, {sum('cache_hint' in ln for ln in loads)} hinted; {pols}; "
              f"cubin {len(ck.asm['cubin'])} bytes")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", action="append", default=[], metavar="MxNxK", help="only these of the cases")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--rep-ms", type=int, default=60, help="do_bench time an entry, over all rounds")
    p.add_argument("--csv", default=None)
    p.add_argument("--ptx", action="store_true", help="CPU: cross-compile and show the hinted loads")
    opts = p.parse_args(argv)
    if opts.ptx:
        return show_ptx()
    import torch
    from triton.tools.tensor_descriptor import TensorDescriptor

    from tilefuse.bench import harness

    install_hook()
    rows = []
    for shape, tile in CASES:
        if opts.shape and shape not in opts.shape:
            continue
        m, n, k = (int(x) for x in shape.split("x"))
        bm, bn, bk, warps, stages, group = tile
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        ref = a @ b
        a_desc, b_desc = TensorDescriptor.from_tensor(a, [bm, bk]), TensorDescriptor.from_tensor(b, [bk, bn])
        grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
        meta = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=group, STAGES=stages, num_warps=warps)
        entries = [("cuBLAS", lambda: torch.matmul(a, b))]
        for name in HINTS:
            c = torch.full_like(ref, float("nan"))
            compiled = hinted[grid](a_desc, b_desc, c, m, n, k, MARKER=marker(name), **meta)
            err = harness.rel_error(c, ref.float())
            n_hinted = getattr(compiled.metadata, "tf_hinted_loads", 0)
            print(f"{shape} hint_{name}: rel err {err:.1e}, hinted TMA loads in the PTX: {n_hinted}", flush=True)
            if not err < 1e-2:
                print(f"{shape} hint_{name}: WRONG, not timed", flush=True)
                continue
            out = torch.empty_like(ref)
            entries.append((f"hint_{name}", lambda name=name, out=out: hinted[grid](a_desc, b_desc, out, m, n, k,
                                                                                     MARKER=marker(name), **meta)))
        samples = harness.interleaved_medians(entries, opts.rounds, max(1, opts.rep_ms // opts.rounds))
        record(rows, shape, tile, samples, name_width=13)
    write_csv(opts.csv, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
