"""Host time of a captured training step's bookkeeping (tilefuse.compiler.runtime.cudagraphs), without a GPU.

A forward recording with ``--saved`` outputs saved for its backward (and one returned), a backward recording with
``--grads`` outputs, over CPU memory, with a replay that launches nothing, each replayed through its runner's
replay path: what is timed is the runner's own work a step (the step-start checks and invalidation, each
recording's hand-out, the in-use check before the backward), as autograd would drive it (the saved tensors held until the backward, the gradients until ``zero_grad``).
GPT-2 124M's training step has ~250 and ~150.

    python tools/replay_host_time.py [--saved 250] [--grads 150] [--steps 2000]

Prints µs a step (the best of 5 rounds). On a CUDA build a hand-out builds CUDA tensors in one call; here, CPU
tensors in two (``empty`` + ``set_``), so the absolute figure is the CPU path's, and a comparison of two versions of
the runner is what it is for.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from tilefuse.compiler.runtime import cudagraphs  # noqa: E402


class _NoGraph:
    def replay(self):
        pass


def _recording(pool, outputs: int, saved: set):
    tensors = [torch.empty(64) for _ in range(outputs)]
    return cudagraphs.Recording(_NoGraph(), [], [], set(), tensors, pool, saved=saved), tensors


def _runner(kind: str, pool) -> cudagraphs.GraphRunner:
    graph = torch.fx.Graph()
    graph.output(None)
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    return cudagraphs.GraphRunner(gm, lambda args: [], kind, 0, pool, interpreting=False)


def step_us(saved: int, grads: int, steps: int) -> float:
    pool = cudagraphs.Pool()
    fw, keep_fw = _recording(pool, saved + 1, set(range(1, saved + 1)))
    bw, keep_bw = _recording(pool, grads, set())
    fw_runner, bw_runner = _runner("forward", pool), _runner("backward", pool)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(steps):
            out = fw_runner._replay(fw, [])  # (the runner's replay path, past its signature lookup)
            stash = out[1:]  # autograd holds the saved tensors until the backward
            del out
            g = bw_runner._replay(bw, [])
            del stash  # the backward has run
            del g  # zero_grad(set_to_none=True)
        best = min(best, (time.perf_counter() - t0) / steps * 1e6)
    del keep_fw, keep_bw
    return best


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--saved", type=int, default=250)
    p.add_argument("--grads", type=int, default=150)
    p.add_argument("--steps", type=int, default=2000)
    a = p.parse_args()
    print(f"{step_us(a.saved, a.grads, a.steps):.1f} us a step ({a.saved} saved, {a.grads} gradients)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
