"""Dynamic shapes through the backward: ``torch.compile(dynamic=True)`` and ``mark_dynamic``, each graph called
at two sizes, outputs and every gradient held to eager and float64 (compiler_checks.check_function). The sizes
a kernel takes as arguments (a mean's count, a variance's n - correction, a row length, a broadcast extent) are
what a dynamic graph can get wrong while a static one gets right: a count baked in at the first size, or a
kernel reused with the first size's masks."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests import compiler_checks as cc
from tests.support import noncontiguous


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _norm_chain(x, w):
    return F.layer_norm(torch.softmax(x * 2.0, -1), x.shape[-1:], w).mean(-1)


def _mean_var(x):
    return x.mean(0) * 3.0 + x.var(-1, correction=1).sum() + x.std(0, unbiased=False).mean()


def _log_softmax_sum(x):
    return torch.log_softmax(x, -1).sum(-1) + x.amax(-1)


def _broadcast(x, b):
    return torch.tanh(x + b[None, :]) * b.sum()


CASES = {
    # name: (fn, make inputs for a size, the two sizes)
    "norm chain": (_norm_chain, lambda n: (torch.randn(n, 33, requires_grad=True), torch.randn(33, requires_grad=True)),
                   (7, 20)),
    "mean and var over rows and cols": (_mean_var, lambda n: (torch.randn(n, n + 3, requires_grad=True),), (5, 12)),
    "log_softmax row length": (_log_softmax_sum, lambda n: (torch.randn(3, n, requires_grad=True),), (33, 129)),
    "broadcast": (_broadcast, lambda n: (torch.randn(9, n, requires_grad=True), torch.randn(n, requires_grad=True)),
                  (7, 30)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_dynamic_true_backward_at_two_sizes(case):
    fn, make, sizes = CASES[case]
    cc.reset()
    compiled = cc.compiled(fn, dynamic=True)
    counts = []
    for k, n in enumerate(sizes):
        s = cc.check_function(fn, *make(n), what=f"{case} n={n}", compiled_fn=compiled, fresh=False)
        counts.append(int(s["graphs"]))
    assert counts[1] == counts[0], f"{case}: dynamic=True compiled new graphs at the second size: {counts}"


@pytest.mark.parametrize("dim", [0, 1])
def test_mark_dynamic_backward_at_two_sizes(dim):
    """One dimension marked dynamic (rows, or the reduced row length): no new graph at the second size."""
    w = torch.randn(33 if dim == 0 else 40, requires_grad=True)

    def fn(x, w):
        h = x * w if dim == 0 else x * w[:x.shape[1]]
        return torch.softmax(h, -1).pow(2).mean(-1, keepdim=True) * h

    cc.reset()
    compiled = cc.compiled(fn)
    counts = []
    for n in (9, 26):
        shape = [n, 33] if dim == 0 else [5, n]
        x = torch.randn(*shape, requires_grad=True)
        torch._dynamo.mark_dynamic(x, dim)
        s = cc.check_function(fn, x, w, what=f"mark_dynamic dim {dim} size {n}", compiled_fn=compiled, fresh=False)
        counts.append((cc.dynamo_graphs(), int(s["graphs"])))
    assert counts[1] == counts[0], f"(dynamo graphs, tilefuse graphs) per size: {counts}: the second size recompiled"


def test_dynamic_noncontiguous_input_backward():
    def fn(x):
        return (x - x.mean(-1, keepdim=True)).pow(2).sum(-1)

    cc.reset()
    compiled = cc.compiled(fn, dynamic=True)
    for n in (7, 19):
        x = noncontiguous(torch.randn(n, 65)).requires_grad_()
        cc.check_function(fn, x, what=f"non-contiguous n={n}", compiled_fn=compiled, fresh=False)


def test_dynamic_index_count_backward():
    """index_select with a dynamic number of indices, repeated, its backward accumulating (an extern)."""
    def fn(x, i):
        return x.index_select(0, i) * 2.0

    cc.reset()
    compiled = cc.compiled(fn, dynamic=True)
    for n in (5, 11):
        x = torch.randn(13, 7, requires_grad=True)
        idx = torch.randint(0, 13, (n,))
        idx[-1] = idx[0]
        cc.check_function(fn, x, idx, what=f"index_select of {n}", compiled_fn=compiled, fresh=False, strict_mode=False,
                          not_fallen_back=("aten.index_select.default",))
