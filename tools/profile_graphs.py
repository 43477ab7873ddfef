"""Per-kernel GPU time of compiler-bench graphs under tilefuse and Inductor (torch.profiler), for the notes.

    python tools/profile_graphs.py layer_norm_fwd_bwd gelu_chain_fwd_bwd ...

Prints, for each graph and backend, every kernel's total CUDA time over 10 steps at the bench's size
(32768 x 4096 bf16), so a slow graph shows which of its kernels is slow. GPU only.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

import tilefuse  # noqa: E402,F401
from tilefuse.bench import compiler_suite as suite  # noqa: E402

STEPS = 10


def main(cases) -> int:
    graphs = {g.case: g for g in suite.GRAPHS}
    for case in cases:
        graph = graphs[case]
        args = suite.prepare(graph, graph.inputs(suite.ROWS, suite.COLS, suite.VOCAB, torch.bfloat16, "cuda"))
        for backend in ("tilefuse", "inductor"):
            torch._dynamo.reset()
            step = suite.make_step(graph, torch.compile(graph.fn, backend=backend))
            for _ in range(3):
                step(*args)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(STEPS):
                    step(*args)
                torch.cuda.synchronize()
            rows = [(e.key, e.device_time_total / STEPS, e.count // STEPS)
                    for e in prof.key_averages() if e.device_time_total > 0]
            rows.sort(key=lambda r: -r[1])
            total = sum(r[1] for r in rows)
            print(f"== {case} {backend}: {total / 1000:.3f} ms of kernels a step")
            for name, us, count in rows[:12]:
                print(f"   {us:9.1f} us  x{count}  {name[:110]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:] or ["layer_norm_fwd_bwd", "gelu_chain_fwd_bwd", "residual_layer_norm",
                                          "softmax_fwd_bwd"]))
