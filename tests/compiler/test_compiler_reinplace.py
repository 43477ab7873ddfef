"""Input mutations written in place (compiler/reinplace.py): ``copy_(x, index_put(x, ...))`` becomes
``index_put_(x, ...)`` where nothing else reads ``x``, and is left alone wherever the rewrite could change a result."""
from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from tests.support import rel_error
from tilefuse import compiler
from tilefuse.compiler import records, reinplace

aten = torch.ops.aten


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    compiler.reset_stats()
    yield
    torch._dynamo.reset()


def _functional_graph(fn, *args) -> torch.fx.GraphModule:
    """``fn``'s graph as AOTAutograd hands an inference graph to the backend: functional ops, and each input
    mutation as a ``copy_`` into the input."""
    gm = make_fx(torch.func.functionalize(fn, remove="mutations_and_views"))(*args)
    for n in gm.graph.nodes:  # make_fx records values under "val" as AOTAutograd does
        if n.op == "placeholder":
            n.meta["val"] = n.meta.get("val", args[[p for p in gm.graph.nodes if p.op == "placeholder"].index(n)])
    return gm


def _ops(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def _cache_write(cache, pos, kv):
    cache[:, pos] = kv
    return cache * 2.0


def _cache_write_and_old_read(cache, pos, kv):
    old = cache.sum()
    cache[:, pos] = kv
    return cache * 2.0, old


def _cache_write_returned(cache, pos, kv):
    cache[:, pos] = kv
    return cache


def _cache_write_of_itself(cache, pos, kv):
    cache[:, pos] = cache[:, :2] + kv
    return cache * 2.0


def _index_copy(cache, pos, kv):
    cache.index_copy_(1, pos, kv)
    return cache + 1.0


def _args():
    return torch.randn(3, 11, 5), torch.tensor([4, 9]), torch.randn(3, 2, 5)


def _run(gm, fn):
    a, b = _args(), _args()
    b = tuple(t.clone() for t in a)
    got, want = gm(*a), fn(*b)
    for x, y in zip(torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(want)):
        assert torch.equal(x, y)
    assert torch.equal(a[0], b[0]), "the input's contents after the call differ from eager's"


@pytest.mark.parametrize("fn, inplace", [(_cache_write, aten.index_put_.default),
                                         (_index_copy, aten.index_copy_.default)])
def test_a_write_copied_back_into_its_input_becomes_the_in_place_op(fn, inplace):
    gm = _functional_graph(fn, *_args())
    assert aten.copy_.default in _ops(gm)
    done = reinplace.write_mutations_in_place(gm)
    assert len(done) == 1, done
    ops = _ops(gm)
    assert inplace in ops and aten.copy_.default not in ops and inplace._overloadpacket.__name__[:-1] not in \
        {getattr(op, "_overloadpacket", op).__name__ for op in ops}
    _run(gm, fn)


@pytest.mark.parametrize("fn", [_cache_write_and_old_read, _cache_write_returned, _cache_write_of_itself],
                         ids=["old value read", "result returned", "input among the values"])
def test_left_alone_where_the_rewrite_could_change_a_result(fn):
    gm = _functional_graph(fn, *_args())
    before = _ops(gm)
    assert reinplace.write_mutations_in_place(gm) == []
    assert _ops(gm) == before
    _run(gm, fn)


def test_a_copy_whose_result_is_used_or_a_layout_change_is_left_alone():
    gm = _functional_graph(_cache_write, *_args())
    copy = next(n for n in gm.graph.nodes if n.target is aten.copy_.default)
    src = copy.args[1]
    src.meta["val"] = torch.empty(3, 5, 11).transpose(1, 2)  # another layout than the input's
    assert reinplace.write_mutations_in_place(gm) == []
    src.meta["val"] = copy.args[0].meta["val"]
    out = next(n for n in gm.graph.nodes if n.op == "output")
    out.args = ((out.args[0], copy),)  # the copy's result read by the output
    assert reinplace.write_mutations_in_place(gm) == []


class _Cache(torch.nn.Module):
    """A KV cache of one layer, written a row per call as transformers' static cache does."""

    def __init__(self):
        super().__init__()
        self.register_buffer("k", torch.zeros(2, 3, 13, 8))
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x, pos):
        self.k[:, :, pos] = self.proj(x)
        return torch.softmax(self.k.sum(-1), -1)


def _compiled_steps(monkeypatch, in_place: bool) -> dict:
    """Four cache writes compiled (with the rewrite or without it), each step's output and cache against eager's;
    returns the stats and the ops each kernel fused."""
    torch._dynamo.reset()
    compiler.reset_stats()
    if not in_place:
        monkeypatch.setattr(reinplace, "write_mutations_in_place", lambda gm: [])
    torch.manual_seed(3)
    eager = _Cache()
    model = _Cache()
    model.load_state_dict(eager.state_dict())
    compiled = torch.compile(model, backend="tilefuse")
    with torch.no_grad():
        for step in range(4):
            x = torch.randn(2, 3, 1, 8)
            pos = torch.tensor([step * 3 + 1])
            want = eager(x, pos)
            got = compiled(x, pos)
            assert rel_error(got, want) <= 1e-5
            assert rel_error(model.k, eager.k) <= 1e-5, f"step {step}: the cache differs from eager's"
    return compiler.stats(), [op for r in records.REPORTS for k in r.kernels for op in k.fuses]


def test_compiled_cache_writes_match_eager_over_steps_and_write_no_copy_back(monkeypatch):
    kept, kept_fused = _compiled_steps(monkeypatch, in_place=True)
    monkeypatch.undo()
    copied, copied_fused = _compiled_steps(monkeypatch, in_place=False)
    assert kept["graphs"] == copied["graphs"] == 1
    assert any("aten.copy_" in op for op in copied_fused), copied_fused  # the copy back, in some kernel
    assert not any("aten.copy_" in op for op in kept_fused), kept_fused
    assert not kept["fallbacks"] and kept["externs"] == 1, kept  # index_put_: the library's kernel, by design
    assert [f for f in copied["fallbacks"] if "index_put" in str(f)], copied["fallbacks"]  # (ATen's, a fallback)
