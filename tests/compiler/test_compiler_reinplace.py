"""Input mutations written in place (compiler/reinplace.py): ``copy_(x, index_put(x, ...))`` becomes
``index_put_(x, ...)`` where nothing else reads ``x``, and is left alone wherever the rewrite could change a result."""
from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from tests.support import rel_error
from tilefuse import compiler, device
from tilefuse.compiler import records, reinplace
from tilefuse.kernels import indexing  # noqa: F401  (registers tilefuse::index_put_pair_)

aten = torch.ops.aten


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    compiler.reset_stats()
    yield
    torch._dynamo.reset()


pytestmark = pytest.mark.usefixtures("on_the_kernels_device")  # (a CPU tensor's graph runs in ATen on a GPU machine)


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
    _steps_against_eager(_Cache, seed=3, first=1, caches=("k",))
    return compiler.stats(), [op for r in records.REPORTS for k in r.kernels for op in k.fuses]


def _steps_against_eager(module, seed: int, first: int, caches: tuple) -> None:
    """Four steps of ``module`` (x, a cache position) compiled and eager from one state: each step's output, and
    each cache buffer named in ``caches`` after it, against eager's."""
    torch.manual_seed(seed)
    eager = module()
    model = module()
    model.load_state_dict(eager.state_dict())
    compiled = torch.compile(model, backend="tilefuse")
    with torch.no_grad():
        for step in range(4):
            x = torch.randn(2, 3, 1, 8)
            pos = torch.tensor([step * 3 + first])
            want = eager(x, pos)
            got = compiled(x, pos)
            assert rel_error(got, want) <= 1e-5
            for name in caches:
                assert rel_error(getattr(model, name), getattr(eager, name)) <= 1e-5, \
                    f"step {step}: cache {name} differs from eager's"


def test_compiled_cache_writes_match_eager_over_steps_and_write_no_copy_back(monkeypatch):
    kept, kept_fused = _compiled_steps(monkeypatch, in_place=True)
    monkeypatch.undo()
    copied, copied_fused = _compiled_steps(monkeypatch, in_place=False)
    assert kept["graphs"] == copied["graphs"] == 1
    assert any("aten.copy_" in op for op in copied_fused), copied_fused  # the copy back, in some kernel
    assert not any("aten.copy_" in op for op in kept_fused), kept_fused
    assert not kept["fallbacks"] and kept["externs"] == 1, kept  # index_put_: the library's kernel, by design
    assert [f for f in copied["fallbacks"] if "index_put" in str(f)], copied["fallbacks"]  # (ATen's, a fallback)


# ------------------------------------------------------------------ two row writes with one index, one launch
PAIR = torch.ops.tilefuse.index_put_pair_.default


def _kv_write(k, v, pos, a, b):
    k[:, pos] = a
    v[:, pos] = b
    return k * 2.0 + v


def _kv_write_first_read_between(k, v, pos, a, b):
    k[:, pos] = a
    seen = k.sum()
    v[:, pos] = b
    return v * 2.0, seen


def _kv_write_second_from_first(k, v, pos, a, b):
    k[:, pos] = a
    v[:, pos] = k[:, pos] * 3.0 + b
    return k + v


def _kv_write_two_indices(k, v, pos, a, b):
    k[:, pos] = a
    v[:, pos + 1] = b
    return k + v


def _kv_args(v_dtype=torch.float32, b_strided=False):
    b = torch.randn(3, 5, 2).transpose(1, 2) if b_strided else torch.randn(3, 2, 5)
    return (torch.randn(3, 11, 5), torch.randn(3, 11, 5).to(v_dtype), torch.tensor([4, 9]), torch.randn(3, 2, 5),
            b.to(v_dtype))


def _run_kv(gm, fn, args):
    mine, theirs = tuple(t.clone() for t in args), tuple(t.clone() for t in args)
    got, want = gm(*mine), fn(*theirs)
    for x, y in zip(torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(want)):
        assert torch.equal(x, y)
    assert torch.equal(mine[0], theirs[0]) and torch.equal(mine[1], theirs[1]), "a cache differs from eager's"


def test_two_row_writes_with_one_index_become_one_pair_call():
    args = _kv_args()
    gm = _functional_graph(_kv_write, *args)
    assert len(reinplace.write_mutations_in_place(gm)) == 2
    done = reinplace.pair_row_writes(gm)
    assert len(done) == 1, done
    ops = _ops(gm)
    assert ops.count(PAIR) == 1 and aten.index_put_.default not in ops and aten.copy_.default not in ops
    _run_kv(gm, _kv_write, args)


@pytest.mark.parametrize("fn, v_dtype, b_strided", [(_kv_write_first_read_between, torch.float32, False),
                                                    (_kv_write_second_from_first, torch.float32, False),
                                                    (_kv_write_two_indices, torch.float32, False),
                                                    (_kv_write, torch.float64, False),
                                                    (_kv_write, torch.float32, True)],
                         ids=["first cache read between", "second values from the first cache", "two indices",
                              "another dtype", "values of other strides"])
def test_row_writes_stay_two_where_one_launch_could_change_a_result(fn, v_dtype, b_strided):
    args = _kv_args(v_dtype, b_strided)
    gm = _functional_graph(fn, *args)
    assert len(reinplace.write_mutations_in_place(gm)) == 2
    assert reinplace.pair_row_writes(gm) == []
    ops = _ops(gm)
    assert PAIR not in ops and ops.count(aten.index_put_.default) == 2
    _run_kv(gm, fn, args)


class _KVCache(torch.nn.Module):
    """A layer's key and value caches, each written a row per call at one position, as a static cache does."""

    def __init__(self):
        super().__init__()
        self.register_buffer("k", torch.zeros(2, 3, 13, 8))
        self.register_buffer("v", torch.zeros(2, 3, 13, 8))
        self.proj = torch.nn.Linear(8, 16)

    def forward(self, x, pos):
        kv = self.proj(x)
        self.k[:, :, pos] = kv[..., :8]
        self.v[:, :, pos] = kv[..., 8:]  # (both values views of one projection's rows, as GPT-2's are)
        return torch.softmax(self.k.sum(-1), -1) * self.v.mean(-1)


def test_compiled_key_and_value_writes_are_one_library_call_and_match_eager_over_steps():
    _steps_against_eager(_KVCache, seed=4, first=2, caches=("k", "v"))
    stats = compiler.stats()
    assert stats["graphs"] == 1 and not stats["fallbacks"] and stats["externs"] == 1, stats  # the pair, by design


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_a_decode_step_writes_each_layers_key_and_value_rows_in_one_call(family):
    """Real models (tiny GPT-2 and Llama, transformers' static cache): one pair call a layer and no single row
    write left; three decode steps' logits and both caches of every layer against eager's."""
    from tilefuse.bench import models_suite

    case = next(c for c in models_suite.cases(True) if c.name == family)
    torch.manual_seed(5)
    model = case.build(True).eval()
    prompt = torch.randint(0, 128, (1, 11))
    runs = {b: models_suite.Runner(type(model)(model.config).eval(), b, "decode", torch.float32,
                                   device.torch_device(), prompt=prompt) for b in ("eager", "tilefuse")}
    for r in runs.values():  # (both copies from one state, then each prefilled by its own eager model)
        r.model.load_state_dict(model.state_dict())
        r.decode = models_suite.DecodeCache(r.model, prompt, models_suite.DECODE_ROOM)
    for _ in range(3):
        token = {"input_ids": torch.randint(0, 128, (1, 1))}
        want = runs["eager"].step(token, keep=True)[0]
        got = runs["tilefuse"].step(token, keep=True)[0]
        assert rel_error(got, want) <= 1e-5
    for mine, theirs in zip(runs["tilefuse"].decode.cache.layers, runs["eager"].decode.cache.layers):
        assert rel_error(mine.keys, theirs.keys) <= 1e-6 and rel_error(mine.values, theirs.values) <= 1e-6
    externs = [e[1] for r in records.REPORTS for e in r.externs]
    layers = model.config.num_hidden_layers
    assert externs.count("tilefuse.index_put_pair_.default") == layers, externs
    assert "aten.index_put_.default" not in externs and not compiler.stats()["fallbacks"]
