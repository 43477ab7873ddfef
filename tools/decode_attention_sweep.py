"""Time the attention forward's decode form (split-KV, then the combine) under other launch configs, against
PyTorch's SDPA, at decode shapes.

GPU (an H100/H200 image: system python, PYTHONPATH=checkout):

    python tools/decode_attention_sweep.py [--shapes gpt2,llama] [--calls 60] [--csv out.csv]

For each shape and each config (BLOCK_M x BLOCK_N, warps, stages; the split count as plan_forward picks it for
that tile, and a few fixed counts) it first checks the output against a float64 reference (max abs error; a
config over the dtype's tolerance is reported and not timed), then times a call cold: before each call a
256 MiB buffer is read (so the K/V cache is out of L2, as in a decode step, where the rest of the model's
weights pass through L2 between one layer's attention and the next step's; read, not written, so that no
dirty line's write-back lands in the call's time: tools/l2_flush_probe.py), CUDA events around the call
alone, the median over ``--calls``. The flush keeps the GPU busy while the call is queued, so the time is the
GPU's (the forward, the gap, the combine), not the host's. SDPA is timed the same way (whichever backend it
picks). The default config (configs.select) is marked ``*``.

CPU:

    python tools/decode_attention_sweep.py --sass [--shapes gpt2]

cross-compiles each config's forward for sm_90a and prints its SASS counts (instructions, barriers, MMAs,
shared loads/stores, registers; cuobjdump, tilefuse.cuda.build.sass_opcodes): the barriers are what the warps
splitting a tile's keys cost.
"""
from __future__ import annotations

import argparse
import csv
import math
import os
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# (name, B, H, H_kv, Sq, Sk, D, mask): GPT-2 124M's step at the models suite's prompt (512 + 8 slots), and a
# Llama-3-8B-like GQA step (8 KV heads of 4 query heads, a 4k cache)
SHAPES = {
    "gpt2": (1, 12, 12, 1, 520, 64, True),
    "gpt2-b8": (8, 12, 12, 1, 520, 64, True),
    "llama": (1, 32, 8, 1, 4096, 128, False),
}
# (BLOCK_M, BLOCK_N, warps, stages)
CONFIGS = [(16, 128, 4, 3), (16, 64, 4, 3), (16, 128, 2, 3), (16, 64, 2, 3), (16, 64, 1, 3), (16, 32, 1, 3),
           (16, 32, 2, 3), (16, 256, 8, 3)]
FIXED_SPLITS = (1, 2, 4, 8, 16)
TOL = 2e-2


def _inputs(shape, device, dtype):
    import torch

    B, H, Hkv, Sq, Sk, D, masked = shape
    q = torch.randn(B, H, Sq, D, device=device, dtype=dtype)
    k, v = (torch.randn(B, Hkv, Sk, D, device=device, dtype=dtype) for _ in range(2))
    mask = torch.ones(B, 1, Sq, Sk, device=device, dtype=torch.bool) if masked else None
    if mask is not None:
        mask[..., Sk - 7:] = False  # the unwritten slots of a static cache
    return q, k, v, mask


def _reference(q, k, v, mask):
    import torch

    g = q.shape[1] // k.shape[1]
    k64, v64 = (t.double().repeat_interleave(g, dim=1) for t in (k, v))
    s = q.double() @ k64.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s, -1) @ v64


def _cold_us(fn, calls, flush):
    import torch

    for _ in range(3):
        fn()
    times = []
    for _ in range(calls):
        flush.sum()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) * 1e3)
    return statistics.median(times)


def sweep(shape_names, calls, csv_path):
    import torch
    import torch.nn.functional as F

    from tilefuse.kernels.attention import configs, launch
    from tilefuse.kernels.attention import ops as attn_ops

    dtype, dev = torch.bfloat16, "cuda"
    flush = torch.empty(64 * 2**20, device=dev, dtype=torch.float32)
    rows = []
    for name in shape_names:
        shape = SHAPES[name]
        q, k, v, mask = _inputs(shape, dev, dtype)
        ref = _reference(q, k, v, mask)
        params, mask_view, _ = attn_ops._params(q, k, v, mask, None, 1 / math.sqrt(shape[5]), 0.0, 0, -1, -1, 0.0, 0)
        default = launch.plan_forward(params, dtype)
        print(f"{name} {shape} bf16: default plan {default.config.label()} x {default.num_splits} splits", flush=True)

        def sdpa():
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=shape[1] != shape[2])

        err = (sdpa().double() - ref).abs().max().item()
        us = _cold_us(sdpa, calls, flush)
        rows.append(dict(shape=name, impl="sdpa", config="", splits="", us=f"{us:.2f}", max_err=f"{err:.2e}"))
        print(f"  sdpa                         {us:7.2f} us  err {err:.1e}", flush=True)
        for cfg_t in CONFIGS:
            cfg = configs.AttentionConfig(*cfg_t)
            auto = launch._plan(params, dtype, None, None, cfg).num_splits
            for splits in sorted({auto, *FIXED_SPLITS}):
                tiles = math.ceil(shape[4] / cfg.block_n)
                if splits > tiles:
                    continue
                plan = launch.Plan(cfg, default.pack_gqa, splits)
                mark = "*" if (cfg == default.config and splits == default.num_splits) else (
                    "a" if splits == auto else " ")
                try:
                    fn = lambda plan=plan: launch.forward(q, k, v, params, mask_view, None, plan)  # noqa: E731
                    out = fn()[0]
                    err = (out.double() - ref).abs().max().item()
                    if not err <= TOL:
                        raise AssertionError(f"max error {err:.2e} over {TOL}")
                    us = _cold_us(fn, calls, flush)
                except Exception as exc:  # noqa: BLE001 - a row of the report
                    print(f"  {mark} {cfg.label():18s} x{splits:<3d} failed: {type(exc).__name__}: {str(exc)[:160]}",
                          flush=True)
                    rows.append(dict(shape=name, impl="tilefuse", config=cfg.label(), splits=splits, us="",
                                     max_err=f"failed: {type(exc).__name__}"))
                    continue
                rows.append(dict(shape=name, impl="tilefuse" + ("*" if mark == "*" else ""), config=cfg.label(),
                                 splits=splits, us=f"{us:.2f}", max_err=f"{err:.2e}"))
                print(f"  {mark} {cfg.label():18s} x{splits:<3d} {us:7.2f} us  err {err:.1e}", flush=True)
    if csv_path:
        with open(csv_path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    return rows


def sass(shape_names):
    """sm_90a SASS counts of each config's forward at each shape's constexprs (no GPU)."""
    os.environ["TILEFUSE_INTERPRET"] = "0"  # (code generation, not the interpreter: triton 3.6 cannot do both)
    os.environ.pop("TRITON_INTERPRET", None)
    import subprocess
    import tempfile

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from tilefuse import targets
    from tilefuse.cuda import build
    from tilefuse.kernels.attention import targets as attn_targets
    from tilefuse.kernels.attention.kernels import attn_fwd_kernel as fn

    tool = build.cuobjdump()
    if tool is None:
        raise SystemExit("--sass needs cuobjdump (the triton wheel's, or one on the PATH)")
    for name in shape_names:
        B, H, Hkv, Sq, Sk, D, masked = SHAPES[name]
        print(f"{name}: sm_90a, bf16, D={D}, group {H // Hkv}{', bool mask' if masked else ''}")
        for bm, bn, nw, ns in CONFIGS:
            consts = {**attn_targets._unit_strides(fn),
                      **attn_targets._score_constexprs({"MASK_KIND": 2 if masked else 0}),
                      "HEAD_DIM": D, "BLOCK_D": D, "BLOCK_M": bm, "BLOCK_N": bn, "GROUP": H // Hkv,
                      "PACK_GQA": H != Hkv}
            consts = {k: v for k, v in consts.items() if k in fn.arg_names}
            sig, div = attn_targets._signature(fn, "bf16", consts.get("MASK_KIND", 0), consts)
            ex = targets.Example("sweep", sig, consts, {"num_warps": nw, "num_stages": ns}, div)
            src = ASTSource(fn, ex.signature, constexprs=ex.constexprs, attrs=targets._attrs_for(fn, ex))
            compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(ex.options))
            with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
                f.write(compiled.asm["cubin"])
                f.flush()
                ops = build.sass_opcodes(subprocess.run([tool, "-sass", f.name], capture_output=True, text=True,
                                                        check=True).stdout)
            res = targets.cubin_resources(compiled.asm["cubin"])
            print(f"  {bm}x{bn}-w{nw}-s{ns}: {sum(ops.values())} instructions, {ops.get('BAR', 0)} BAR, "
                  f"{ops.get('HMMA', 0)} HMMA, {ops.get('LDS', 0) + ops.get('LDSM', 0)} LDS/LDSM, "
                  f"{ops.get('STS', 0)} STS, {ops.get('SHFL', 0)} SHFL, {res.get('REG')} registers, "
                  f"{compiled.metadata.shared} B shared, spills {res.get('STACK', 0) + res.get('LOCAL', 0)}",
                  flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="gpt2,gpt2-b8,llama", help=f"comma-separated, of {', '.join(SHAPES)}")
    ap.add_argument("--calls", type=int, default=60)
    ap.add_argument("--configs", default="",
                    help="comma-separated BLOCK_MxBLOCK_N-wWARPS-sSTAGES labels (default: all)")
    ap.add_argument("--csv", default="")
    ap.add_argument("--sass", action="store_true", help="print sm_90a SASS counts instead (no GPU needed)")
    a = ap.parse_args()
    names = [s for s in a.shapes.split(",") if s]
    unknown = [s for s in names if s not in SHAPES]
    if unknown:
        ap.error(f"--shapes: unknown {unknown}; accepted: {', '.join(SHAPES)}")
    if a.configs:
        found = [re.fullmatch(r"(\d+)x(\d+)-w(\d+)-s(\d+)", c) for c in a.configs.split(",")]
        if not all(found):
            ap.error(f"--configs {a.configs!r}: accepted labels look like 16x64-w4-s3 (BLOCK_MxBLOCK_N-wWARPS-sSTAGES)")
        CONFIGS[:] = [tuple(int(x) for x in m.groups()) for m in found]
    if a.sass:
        sass(names)
        return 0
    import torch

    if not torch.cuda.is_available():
        print("decode_attention_sweep.py needs a GPU (or --sass)")
        return 2
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    sweep(names, a.calls, a.csv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
