"""The same graph compiled again gives the same kernels (and the right answer). Kernel text is the disk cache's
key and what a bug report quotes, so it must be a function of the graph; a difference between two compiles in
one process is a bug in the compiler's bookkeeping, not noise."""
from __future__ import annotations

import pytest
import torch

from tests import compiler_checks as cc

COMPILES = 12


def _flip_slices(x):
    return x.flip(0)[::2] * x[::2]


def test_recompiling_gives_the_same_kernels(monkeypatch):
    kernels = cc.collect_kernels(monkeypatch)
    x = torch.randn(13, 129).requires_grad_()
    texts, problems = set(), []
    for k in range(COMPILES):
        torch._dynamo.reset()
        kernels.clear()
        try:
            cc.check_function(_flip_slices, x, what=f"compile {k}")
        except AssertionError as exc:
            problems.append(str(exc)[:200])
        texts.add(tuple(ks.source for ks in kernels))
    assert len(texts) == 1 and not problems, f"{len(texts)} different kernel sets in {COMPILES} compiles; " \
                                             f"wrong results: {problems}"
