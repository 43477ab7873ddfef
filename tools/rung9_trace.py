#!/usr/bin/env python3
"""Where rung 9's time goes, from inside the kernel: a timeline of every consumer warpgroup's work items.

Stream-K costs rung 9 ~10 us a launch (docs/decisions/005-rung9-stream-k.md), which is why 4096^3 is not
split, and the last round there leaves 8 of 66 clusters idle (~3 % of the kernel): the gap to cuBLAS. This builds
diagnostic copies of rung 9 (``-D TILEFUSE_RUNG9_TRACE=1``: thread 0 of each consumer warpgroup stamps
%globaltimer at the start of each work item's mainloop, its end, the end of its stream-K step and the end of its
epilogue), one with the library's split policy and one that splits wherever stream-K can
(``TILEFUSE_RUNG9_SK_FIXUP_K_TILES=0``), runs each after do_bench's zeroing L2 flush (and the library's own build,
untraced, for what the stamps cost), and prints per phase:

* the launch's span (first entry to last epilogue), and when the whole-tile rounds end (spread over warpgroups);
* mainloop ns a k-tile, in whole tiles, in a balanced round's narrow tiles (240 columns) and in stream-K pieces (a
  piece restarts the pipeline);
* the stream-K step: a piece's partial sums written, or the other pieces' sums waited for and added;
* the epilogue, and the idle gap between one item's epilogue and the next item's mainloop;
* the tail: the last warpgroup's end against the median one's;
* by round (a consumer's j-th whole tile): the mainloop's ns and SM cycles a k-tile, and so the SM clock it ran
  at (a slower round at the same cycles a k-tile is the clock; at more cycles, the memory system or the schedule);
* the TMA-store epilogue of whole tiles in SM cycles, by C chunk and step (thread 0 of a consumer warpgroup, the
  one that issues the stores): the wait for the group's staging buffers and the barrier after it, writing the
  values, and in a group's last chunk the proxy fence, the barrier before the stores and issuing the group's stores
  (to the next chunk's start).

``--sustained N`` traces the last of N back-to-back flushed calls (no sync between them, as do_bench runs a
kernel), so the GPU is at the clock that sustained load gives it (its power limit) rather than fresh from idle.

The library's own builds have none of this code: it is compiled only under the define, and a test checks that the
library's build exports no trace entry point. GPU machine:

    python3 tools/rung9_trace.py [--shapes 4096,8192] [--reps 5] [--sustained N] [--csv PATH]

CPU: ``--build-only`` builds both diagnostic copies (nvcc, sm_90a) and prints their resource reports.
"""
from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
for p in (str(HERE.parent), str(HERE)):
    if p not in sys.path:
        sys.path.insert(0, p)

import ladder_sweep as sweep  # noqa: E402
import rung_ab  # noqa: E402

VARIANTS = {  # name: the defines prepended to the source
    "trace": "#define TILEFUSE_RUNG9_TRACE 1\n",
    "trace-split": "#define TILEFUSE_RUNG9_TRACE 1\n#define TILEFUSE_RUNG9_SK_FIXUP_K_TILES 0\n",
}
PIECE_LATER, PIECE_UNFINISHED, PIECE_NARROW = 1, 2, 4  # the kernel's piece bits (4: a balanced round's narrow tile)
SPLIT_BITS = PIECE_LATER | PIECE_UNFINISHED
EPI_WORDS, EPI_CHUNKS, EPI_STEPS = 8, 4, 5  # the kernel's TRACE_EPI_WORDS: 5 %clock stamps a chunk, then the end
EPI_STEP_NAMES = ("wait", "write", "fence", "barrier", "issue")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="4096,8192", help="comma-separated MxNxK or 4096 / 8192 / 16384x4096")
    p.add_argument("--reps", type=int, default=5, help="traced launches a shape and variant (default 5)")
    p.add_argument("--sustained", type=int, default=0, metavar="N",
                   help="trace the last of N back-to-back flushed calls (default 0: one call after a sync)")
    p.add_argument("--csv", type=Path, default=None, help="every work item of every launch, one row each")
    p.add_argument("--build-only", action="store_true", help="build the diagnostic copies and exit (no GPU)")
    args = p.parse_args(argv)
    if args.reps < 1:
        p.error("--reps: at least 1")
    if args.sustained < 0:
        p.error("--sustained: 0 or more calls")
    args.shape_list = sweep.parse_args(["--shapes", args.shapes]).shape_list
    return args


def variant_sources(folder: Path) -> list[Path]:
    """The diagnostic copies of the package's rung 9, one file a variant (the defines first)."""
    from tilefuse.cuda import build

    text = build.rung("9").path.read_text()
    out = []
    for name, defines in VARIANTS.items():
        path = folder / f"{name}.cu"
        path.write_text(defines + text)
        out.append(path)
    return out


def decode(words: list[int], slots: int, layout: tuple[int, int, int]) -> list[dict]:
    """The trace buffer as rows: one a work item a slot, times in ns relative to the earliest entry."""
    per_slot, max_items, item_words = layout
    entries = [words[s * per_slot] for s in range(slots) if words[s * per_slot]]
    if not entries:
        return []
    t0 = min(entries)
    rows = []
    for s in range(slots):
        base = s * per_slot
        if not words[base]:
            continue
        for j in range(min(words[base + 1], max_items)):
            w = words[base + 2 + j * item_words: base + 2 + (j + 1) * item_words]
            if not w[0]:
                continue  # ping-pong's other consumer's items (not traced here: cooperative only)
            info = w[5]
            rows.append({"slot": s, "item": j, "tile": w[4], "k_tiles": info & 0xFFFF, "piece": (info >> 16) & 0xFFFF,
                         "kb": info >> 32, "entry": words[base] - t0, "start": w[0] - t0, "main_end": w[1] - t0,
                         "step_end": w[2] - t0, "epi_end": w[3] - t0,
                         "main_cycles": (w[7] - w[6]) % (1 << 32) if item_words >= 8 else 0})  # 32-bit %clock
            if item_words > EPI_WORDS + EPI_CHUNKS * EPI_STEPS:
                # the epilogue's stamps as cycles since chunk 0's start (None: an item that ran no TMA-store epilogue)
                stamps = w[EPI_WORDS:EPI_WORDS + EPI_CHUNKS * EPI_STEPS + 1]
                # (a raw 0 is a stamp not taken: the fence, barrier and stores of a group are in its last chunk)
                ran = stamps[-1] != 0 and stamps[0] != 0
                rows[-1].update({f"epi{i}": (v - stamps[0]) % (1 << 32) if ran and v else None
                                 for i, v in enumerate(stamps)})
    return rows


def summarize(rows: list[dict]) -> dict:
    """The phases of one launch (see the module's docstring), in microseconds (ns for a k-tile's mainloop)."""
    us = 1e-3
    med = statistics.median
    by_slot: dict[int, list[dict]] = {}
    for r in rows:
        by_slot.setdefault(r["slot"], []).append(r)
    ends = sorted(max(r["epi_end"] for r in items) for items in by_slot.values())
    whole = [r for r in rows if r["piece"] == 0]
    narrow = [r for r in rows if r["piece"] & PIECE_NARROW]
    pieces = [r for r in rows if r["piece"] & SPLIT_BITS]
    out = {"span_us": ends[-1] * us, "tail_us": (ends[-1] - med(ends)) * us, "items": len(rows),
           "pieces": len(pieces), "narrow": len(narrow)}
    if pieces:  # the whole-tile rounds end where a warpgroup's first piece starts
        firsts = [min(r["start"] for r in items if r["piece"] & SPLIT_BITS) for items in by_slot.values()
                  if any(r["piece"] & SPLIT_BITS for r in items)]
        out["dp_end_us_min"], out["dp_end_us_max"] = min(firsts) * us, max(firsts) * us
    for name, group in (("whole", whole), ("narrow", narrow), ("piece", pieces)):
        if group:
            out[f"{name}_ns_per_ktile"] = med((r["main_end"] - r["start"]) / r["k_tiles"] for r in group)
        stored = [r for r in group if not r["piece"] & PIECE_LATER]  # items that ran the epilogue
        if stored:
            out[f"{name}_epi_us"] = med(r["epi_end"] - r["step_end"] for r in stored) * us
    later = [r for r in pieces if r["piece"] & PIECE_LATER]
    heads = [r for r in pieces if not r["piece"] & PIECE_LATER]
    if later:
        out["partial_write_us"] = med(r["step_end"] - r["main_end"] for r in later) * us
    if heads:
        out["fixup_wait_add_us"] = med(r["step_end"] - r["main_end"] for r in heads) * us
        out["fixup_wait_add_us_max"] = max(r["step_end"] - r["main_end"] for r in heads) * us
    for j in sorted({r["item"] for r in whole}):  # by round: the consumers' j-th whole tiles
        at = [r for r in whole if r["item"] == j]
        ns = med((r["main_end"] - r["start"]) / r["k_tiles"] for r in at)
        out[f"round{j}_ns_per_ktile"] = ns
        if all(r["main_cycles"] > 0 for r in at):
            cyc = med(r["main_cycles"] / r["k_tiles"] for r in at)
            out[f"round{j}_cycles_per_ktile"] = cyc
            out[f"round{j}_mhz"] = 1e3 * med(r["main_cycles"] / (r["main_end"] - r["start"]) for r in at)
    epi = [r for r in whole if r.get(f"epi{EPI_CHUNKS * EPI_STEPS}") is not None]
    for c in range(EPI_CHUNKS) if epi else ():
        for p, name in enumerate(EPI_STEP_NAMES):
            a = c * EPI_STEPS + p
            steps = [r[f"epi{a + 1}"] - r[f"epi{a}"] for r in epi
                     if r[f"epi{a}"] is not None and r[f"epi{a + 1}"] is not None]
            if steps:  # a chunk that ends no group has no fence, barrier or stores of its own
                out[f"epi_c{c}_{name}_cycles"] = med(steps)
    if epi:
        out["epi_cycles"] = med(r[f"epi{EPI_CHUNKS * EPI_STEPS}"] for r in epi)
    gaps = []
    for items in by_slot.values():
        items = sorted(items, key=lambda r: r["item"])
        gaps += [b["start"] - a["epi_end"] for a, b in zip(items, items[1:])]
    if gaps:
        out["gap_us"] = med(gaps) * us
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="rung9_trace-"))
    builds = rung_ab.build_versions("9", variant_sources(folder))  # 'current' too: timed untraced, for the cost
    if args.build_only:
        return 0
    import torch

    from tilefuse.bench import harness
    from tilefuse.cuda import launch

    if not torch.cuda.is_available():
        sweep.log("no CUDA GPU here: nothing to trace (--build-only runs without one)")
        return 2
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    flush = torch.empty(sweep.FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
    all_rows, status = [], 0
    for name, b in builds.items():
        rl = launch.load(b)
        lib = rl.lib
        traced = name != "current"
        if traced:
            lib.tilefuse_rung9_set_trace.restype = ctypes.c_int
            lib.tilefuse_rung9_set_trace.argtypes = [ctypes.c_void_p]
            layout_c = [ctypes.c_int() for _ in range(3)]
            lib.tilefuse_rung9_trace_words(*[ctypes.byref(v) for v in layout_c])
            layout = tuple(v.value for v in layout_c)
            slots = 2 * sms  # one CTA an SM, two consumer warpgroups a CTA
            buf = torch.zeros(slots * layout[0], dtype=torch.int64, device="cuda")
        for m, n, k in args.shape_list:
            shape = f"{m}x{n}x{k}"
            torch.manual_seed(0)
            a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
            c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)

            def call():
                rl(a.data_ptr(), w.data_ptr(), c.data_ptr(), None, m, n, k, k, k, n, "bfloat16", 0,
                   torch.cuda.current_stream().cuda_stream)

            if traced:
                assert lib.tilefuse_rung9_set_trace(ctypes.c_void_p(buf.data_ptr())) == 0
            try:
                call()
                torch.cuda.synchronize()
                err = harness.rel_error(c, a.float() @ w.float().t())
                if err > sweep.CHECK_TOLERANCE:
                    sweep.log(f"{name} {shape}: WRONG, relative error {err:.3g}")
                    status = 1
                for _ in range(3):  # warm-up
                    harness.flushed_call_ms(call, flush.zero_)
                sums: list[dict] = []
                for rep in range(args.reps):
                    if not traced:
                        sums.append({"event_ms": harness.flushed_call_ms(call, flush.zero_)})
                        continue
                    buf.zero_()
                    for _ in range(args.sustained - 1):  # back to back: each overwrites the trace, the last stays
                        flush.zero_()
                        call()
                    ms = harness.flushed_call_ms(call, flush.zero_)
                    rows = decode(buf.cpu().tolist(), slots, layout)
                    if not rows:
                        raise RuntimeError(f"{name} {shape}: the launch left no trace (is the buffer set?)")
                    s = summarize(rows)
                    s["event_ms"] = ms
                    sums.append(s)
                    all_rows += [{"variant": name, "shape": shape, "rep": rep, **r} for r in rows]
            finally:
                if traced:
                    lib.tilefuse_rung9_set_trace(None)
            keys = [key for key in sums[0] if all(key in s for s in sums)]
            sweep.log(f"{name} {shape}: " + ", ".join(
                f"{key} {statistics.median(s[key] for s in sums):.3f}" for key in keys))
    if args.csv is not None:
        sweep.write_rows(args.csv, all_rows)
    return status


if __name__ == "__main__":
    sys.exit(main())
