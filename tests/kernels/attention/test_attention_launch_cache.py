"""The attention family's kept launch sites and kept plans (tilefuse.kernels.attention.launch).

A site keeps the kernel its first JIT launch compiled and later calls go to Triton's C launcher; it checks each
tensor's alignment and each integer's specialisation class itself, so its key must hold everything else the
compiled kernel depends on. Here: the key separates what it must, results still match the float64 reference with
a second call through the kept sites, the caches stay bounded, and, with fake C launchers standing in for
compiled kernels (as tests/compiler/test_compiler_launch_path.py does), a second call launches each kernel through
its C launcher with the arguments the JIT was given.
"""
from __future__ import annotations

import inspect

import pytest
import torch
import triton

from tilefuse import device
from tilefuse.kernels import launcher
from tilefuse.kernels.attention import checks, configs, launch
from tilefuse.kernels.attention.kernels import (attn_bwd_dkdv_kernel, attn_bwd_dq_kernel,
                                                attn_bwd_preprocess_kernel, attn_combine_kernel, attn_fwd_kernel)

from tests.kernels.attention.test_attention import (  # noqa: F401  (the fixture: outputs come NaN-filled)
    BF16, F16, F32, poisoned_outputs_on_the_device, reference, run_case)
from tests.support import FakeKernel, assert_close

CFG = configs.INTERPRETER


@pytest.fixture
def used(monkeypatch):
    """Empty site and forward-launch caches for the test; the list of the sites its launches used, in order (a
    forward's from its kept launch, :func:`launch._forward_launch`, made or found; the backward's as it asks)."""
    monkeypatch.setattr(launch, "_sites", {})
    monkeypatch.setattr(launch, "_forward_launches", {})
    sites = []
    real_site, real_forward = launch.site, launch._forward_launch
    inside = []

    def recording(*args, **kwargs):
        found = real_site(*args, **kwargs)
        if not inside:
            sites.append(found)
        return found

    def forward_launch(*args):
        inside.append(True)
        try:
            found = real_forward(*args)
        finally:
            inside.pop()
        sites.extend(s for s in found[:2] if s is not None)
        return found

    monkeypatch.setattr(launch, "site", recording)
    monkeypatch.setattr(launch, "_forward_launch", forward_launch)
    return sites


def _params(q, k, mask=None, causal=False, dropout_p=0.0):
    p, mask_view, _ = checks.check_arguments(
        q, k, k, causal=causal, window=None, softcap=None, alibi=None, mask=mask, score_mod=None,
        score_mod_grad=None, dropout_p=dropout_p, dropout_seed=None, scale=None, deterministic=False,
        needs_grad=False)
    return p, mask_view


def _kernel(site):
    """The kernel a kept site launches (the first element of its key)."""
    (kernel,) = [key[0] for key, s in launch._sites.items() if s is site]
    return kernel


def _kernel_of(site) -> str:
    return _kernel(site).__name__


# --------------------------------------------------------------------------------------------- the key
def test_site_key_separates_what_the_compiled_kernel_depends_on():
    x32, y32 = torch.zeros(64), torch.zeros(64)
    x16 = torch.zeros(64, dtype=torch.float16)
    base = dict(kernel=attn_combine_kernel, grid=(1,), tensors=(x32, x32, x32, x32),
                constexprs={"HEAD_DIM": 64, "BLOCK_D": 64, "BLOCK_R": 16, "SPLITS": 0}, options={"num_warps": 4},
                real=())
    key = launch.site_key(**base)
    # the same in every respect (other tensors of the same dtypes, equal dicts made again): the same key
    assert launch.site_key(**dict(base, tensors=(y32, x32, y32, x32), constexprs=dict(base["constexprs"]),
                                  options={"num_warps": 4})) == key
    others = {
        "another dtype": dict(base, tensors=(x32, x32, x16, x32)),
        "another constexpr": dict(base, constexprs={"HEAD_DIM": 64, "BLOCK_D": 64, "BLOCK_R": 32, "SPLITS": 0}),
        "another num_warps": dict(base, options={"num_warps": 8}),
        "another launch option": dict(base, options={"num_warps": 4, "debug": True}),
        "another grid": dict(base, grid=(2,)),
        "another kernel": dict(base, kernel=attn_bwd_preprocess_kernel),
        "a mask present": dict(base, real=(True, False)),
        "no mask": dict(base, real=(False, False)),
    }
    keys = {name: launch.site_key(**kw) for name, kw in others.items()}
    assert all(k != key for k in keys.values()), [n for n, k in keys.items() if k == key]
    assert len(set(keys.values())) == len(keys)
    assert key[-1] == x32.get_device()  # the device index


def test_site_returns_one_site_a_key(used):
    x = torch.zeros(64)
    args = dict(grid=(1,), tensors=(x, x, x, x), constexprs={"HEAD_DIM": 64, "BLOCK_D": 64, "BLOCK_R": 16, "SPLITS": 0},
                options={"num_warps": 4})
    a = launch.site(attn_combine_kernel, **args)
    assert launch.site(attn_combine_kernel, **dict(args, constexprs=dict(args["constexprs"]))) is a
    b = launch.site(attn_combine_kernel, **dict(args, options={"num_warps": 8}))
    c = launch.site(attn_combine_kernel, **dict(args, tensors=(x, x, x.half(), x)))
    assert len({id(a), id(b), id(c)}) == 3 and len(launch._sites) == 3
    assert a.options == {"num_warps": 4, "HEAD_DIM": 64, "BLOCK_D": 64, "BLOCK_R": 16, "SPLITS": 0}


def _forward_sites(used, q, k, mask=None, causal=False, plan=None):
    p, mask_view = _params(q, k, mask, causal)
    used.clear()
    launch.forward(q, k, k, p, mask_view, None, plan)
    return list(used)


def test_forward_sites_differ_where_the_kernel_does_and_are_kept_otherwise(used):
    """Through the forward on the interpreter: each pair has the same grid and differs in one thing the
    compiled kernel depends on; the same call again uses the same site."""
    q, k = torch.randn(1, 2, 9, 16), torch.randn(1, 2, 30, 16)  # one key tile: one split
    (plain,) = _forward_sites(used, q, k)
    assert _kernel_of(plain) == "attn_fwd_kernel"
    assert _forward_sites(used, torch.randn_like(q), torch.randn_like(k)) == [plain]
    assert len(launch._sites) == 1
    mask = torch.rand(1, 1, 9, 30) > 0.3
    mask[..., 0] = True
    variants = {
        "fp16": _forward_sites(used, q.half(), k.half()),
        "bf16": _forward_sites(used, q.to(BF16), k.to(BF16)),
        "causal (BAND_HI)": _forward_sites(used, q, k, causal=True),
        "bool mask": _forward_sites(used, q, k, mask=mask),
        "additive mask": _forward_sites(used, q, k, mask=torch.randn(1, 1, 9, 30)),
        "8 warps": _forward_sites(used, q, k, plan=launch.Plan(configs.AttentionConfig(32, 32, 8, 1), False, 1)),
    }
    for name, (s,) in variants.items():
        assert s.grid == plain.grid, name
        assert s is not plain, name
    assert len({id(s) for (s,) in variants.values()}) == len(variants)
    assert _forward_sites(used, q, k, mask=mask) == variants["bool mask"]  # kept
    assert len(launch._sites) == 1 + len(variants)


def test_split_forward_uses_a_forward_and_a_combine_site(used):
    q, k = torch.randn(1, 4, 1, 32), torch.randn(1, 2, 97, 32)
    sites = _forward_sites(used, q, k, plan=launch.Plan(CFG, True, 2))
    assert [_kernel_of(s) for s in sites] == ["attn_fwd_kernel", "attn_combine_kernel"]
    assert sites[0].grid == (1, 2, 2)  # (row blocks, B * H_kv with the GQA rows packed, splits)
    assert _forward_sites(used, q, k, plan=launch.Plan(CFG, True, 2)) == sites
    one = _forward_sites(used, q, k, plan=launch.Plan(CFG, True, 1))  # no split: no combine, another grid
    assert len(one) == 1 and one[0] is not sites[0]


def test_a_forward_launch_is_kept_and_a_dropout_forward_is_not(used, monkeypatch):
    """A repeat forward takes its kept launch without building a site key; a call with dropout (a new seed in its
    Params each call) builds its sites' keys every time and keeps nothing, so the cache does not grow with it."""
    keys = []
    real_key = launch.site_key
    monkeypatch.setattr(launch, "site_key", lambda *a, **kw: keys.append(a[0]) or real_key(*a, **kw))
    q, k = torch.randn(1, 2, 1, 16), torch.randn(1, 2, 97, 16)
    plan = launch.Plan(CFG, False, 2)
    sites = _forward_sites(used, q, k, plan=plan)
    assert len(keys) == 2 and len(launch._forward_launches) == 1  # a forward and a combine site
    assert _forward_sites(used, torch.randn_like(q), torch.randn_like(k), plan=plan) == sites
    assert len(keys) == 2, "a repeat call built its sites' keys again"
    for _ in range(2):
        p, _ = _params(q, k, dropout_p=0.25)
        launch.forward(q, k, k, p, None, None, plan)
    assert len(keys) == 6 and len(launch._forward_launches) == 1


def test_the_ops_checked_arguments_are_kept_by_what_the_checks_read(monkeypatch):
    """The custom ops' argument checks (ops._params): a repeat call without dropout takes the kept Params and makes
    the mask's and slopes' views again from the call's own tensors; anything the checks read that differs (a
    shape, a mask that requires grad under grad mode, the numbers) is checked again; dropout keeps nothing."""
    from tilefuse.kernels.attention import ops

    monkeypatch.setattr(ops, "_checked", {})
    calls = []
    real = ops.check_arguments
    monkeypatch.setattr(ops, "check_arguments", lambda *a, **kw: calls.append(kw) or real(*a, **kw))
    q, k = torch.randn(2, 4, 3, 16), torch.randn(2, 2, 11, 16)
    mask, slopes = torch.rand(1, 1, 3, 11) > 0.5, torch.rand(4, dtype=torch.float16)
    args = (1.0 / 4, 0.0, 1, -1, -1, 0.0, 0)
    first = ops._params(q, k, k, mask, slopes, *args)
    mask2, slopes2 = torch.rand(1, 1, 3, 11) > 0.5, torch.rand(4, dtype=torch.float16)
    again = ops._params(torch.randn_like(q), torch.randn_like(k), torch.randn_like(k), mask2, slopes2, *args)
    assert len(calls) == 1, "a repeat call ran the checks again"
    assert again[0] == first[0]
    assert again[1].dtype == torch.uint8 and again[1].shape == (2, 4, 3, 11) and again[1].stride()[:2] == (0, 0)
    assert torch.equal(again[1], mask2.expand(2, 4, 3, 11).to(torch.uint8))  # the new call's mask, not the first's
    assert again[2].dtype == torch.float32 and torch.equal(again[2], slopes2.float().expand(2, 4))
    ops._params(q, k, k, torch.zeros(1, 1, 3, 11), slopes, *args)  # an additive mask: kept
    with pytest.raises(ValueError, match="mask requires grad"):  # the same metadata, but it requires grad
        ops._params(q, k, k, torch.zeros(1, 1, 3, 11, requires_grad=True), slopes, *args)
    with torch.no_grad():  # (that mask under no_grad: allowed, a key of its own)
        ops._params(q, k, k, torch.zeros(1, 1, 3, 11, requires_grad=True), slopes, *args)
    with pytest.raises(ValueError, match="mask requires grad"):  # and with grad mode back on, refused again
        ops._params(q, k, k, torch.zeros(1, 1, 3, 11, requires_grad=True), slopes, *args)
    longer = ops._params(q, torch.randn(2, 2, 12, 16), torch.randn(2, 2, 12, 16), None, None, *args)
    assert longer[0].Sk == 12 and longer[1] is None and longer[2] is None
    causal_off = ops._params(q, k, k, None, None, 1.0 / 4, 0.0, 0, -1, -1, 0.0, 0)
    assert causal_off[0].band_hi is False and first[0].band_hi is True
    n = len(calls)
    ops._params(q, k, k, None, None, 1.0 / 4, 0.0, 1, -1, -1, 0.25, 7)
    ops._params(q, k, k, None, None, 1.0 / 4, 0.0, 1, -1, -1, 0.25, 7)
    assert len(calls) == n + 2 and len(ops._checked) == 5  # (dropout: checked each time, never kept)


def test_a_backwards_choices_are_kept_and_a_dropout_backward_keeps_none(used, monkeypatch):
    """A backward that gives no form or configs: the second call with the same Params takes the kept choices and
    builds no tuning key, and gives the same gradients; a call with another shape builds its own; dropout (a new
    seed each call) keeps nothing."""
    from tilefuse.kernels.attention import tuning

    monkeypatch.setattr(launch, "_backward_choices", {})
    keys = []
    real_key = tuning.key_of
    monkeypatch.setattr(tuning, "key_of", lambda *a, **kw: keys.append(a[0]) or real_key(*a, **kw))
    q, k, v = torch.randn(1, 2, 9, 16), torch.randn(1, 2, 13, 16), torch.randn(1, 2, 13, 16)
    p, _ = _params(q, k, causal=True)
    out, lse2 = launch.forward(q, k, v, p, plan=launch.Plan(CFG, False, 1))
    do = torch.randn_like(out)
    first = launch.backward(do, q, k, v, out, lse2, p)
    n = len(keys)
    assert n >= 1 and len(launch._backward_choices) == 1
    again = launch.backward(do, q, k, v, out, lse2, p)
    assert len(keys) == n, "a repeat backward built its tuning keys again"
    for a, b in zip(first, again):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    q2 = torch.randn(1, 2, 10, 16)
    p2, _ = _params(q2, k, causal=True)
    out2, lse22 = launch.forward(q2, k, v, p2, plan=launch.Plan(CFG, False, 1))
    launch.backward(torch.randn_like(out2), q2, k, v, out2, lse22, p2)
    assert len(keys) == 2 * n and len(launch._backward_choices) == 2
    pd, _ = _params(q, k, causal=True, dropout_p=0.25)
    outd, lsed = launch.forward(q, k, v, pd, plan=launch.Plan(CFG, False, 1))
    for _ in range(2):
        launch.backward(do, q, k, v, outd, lsed, pd)
    assert len(keys) == 4 * n and len(launch._backward_choices) == 2


# ---------------------------------------------------------------------------- results through kept sites
RESULT_CASES = [
    # (B, H, H_kv, Sq, Sk, D), dtype, attention kwargs
    ((1, 4, 2, 33, 47, 24), F16, {"causal": True}),
    ((2, 3, 1, 1, 97, 40), F32, {"num_splits": 3}),
    ((1, 2, 2, 17, 29, 8), BF16, {"window": (5, 3)}),
]


@pytest.mark.parametrize("case", RESULT_CASES, ids=["gqa-causal-d24", "decode-split-mqa", "window-bf16-d8"])
def test_forward_and_backward_match_the_reference_twice(case, used):
    """The second call of each shape goes through the sites the first one kept (new inputs, same kernels)."""
    (B, H, H_kv, Sq, Sk, D), dtype, kwargs = case
    run_case(B, H, H_kv, Sq, Sk, D, dtype, **kwargs)
    first = list(used)
    kernels = [_kernel_of(s) for s in first]
    assert {"attn_fwd_kernel", "attn_bwd_preprocess_kernel", "attn_bwd_dkdv_kernel", "attn_bwd_dq_kernel"} \
        <= set(kernels)
    assert ("attn_combine_kernel" in kernels) == ("num_splits" in kwargs)
    kept = dict(launch._sites)
    used.clear()
    run_case(B, H, H_kv, Sq, Sk, D, dtype, **kwargs)
    assert used == first and launch._sites == kept


# ----------------------------------------------------------------------------------------------- bounds
def test_the_site_cache_is_bounded(used, monkeypatch):
    monkeypatch.setattr(launch, "SITE_CACHE_MAX", 3)
    x = torch.zeros(64)
    made = []
    for g in range(1, 8):
        made.append(launch.site(attn_combine_kernel, (g,), (x, x, x, x),
                                {"HEAD_DIM": 64, "BLOCK_D": 64, "BLOCK_R": 16, "SPLITS": 0}, {"num_warps": 4}))
        assert len(launch._sites) <= 3
        assert made[-1] in launch._sites.values()
    assert launch.SITE_CACHE_MAX == 3 and len({id(s) for s in made}) == 7


def test_the_plan_cache_is_bounded(monkeypatch):
    monkeypatch.setattr(launch, "_plans", {})
    monkeypatch.setattr(launch, "PLAN_CACHE_MAX", 3)
    for Sk in range(1, 8):
        p, _ = _params(torch.empty(1, 2, 1, 16), torch.empty(1, 2, Sk, 16))
        launch.plan_forward(p, F32)
        assert len(launch._plans) <= 3
    assert any(key[0] == p for key in launch._plans)


# ------------------------------------------------------------------------------------------- the plan
def test_the_plan_is_kept_a_params_dtype_and_part(monkeypatch):
    monkeypatch.setattr(launch, "_plans", {})
    q, k = torch.empty(1, 8, 1, 64), torch.empty(1, 2, 4096, 64)
    p, _ = _params(q, k)
    assert hash(p) == hash(_params(q, k)[0])  # a frozen dataclass: equal calls, equal keys
    plan = launch.plan_forward(p, F16)
    assert plan == launch._plan(p, F16, None, None, None) and plan.pack_gqa
    assert launch.plan_forward(p, F16) is plan and launch.plan_forward(_params(q, k)[0], F16) is plan
    assert len(launch._plans) == 1
    # a field the plan depends on: 100 query rows are no decode (no GQA packing)
    prefill = launch.plan_forward(_params(torch.empty(1, 8, 100, 64), k)[0], F16)
    assert prefill != plan and not prefill.pack_gqa and prefill.num_splits == 1
    # overrides are never kept, and a kept plan does not answer them
    assert launch.plan_forward(p, F16, num_splits=3).num_splits == 3
    assert not launch.plan_forward(p, F16, pack_gqa=False).pack_gqa
    assert len(launch._plans) == 2
    # dropout: its seed, drawn each call, would make every key new
    launch.plan_forward(_params(q, k, dropout_p=0.1)[0], F16)
    assert len(launch._plans) == 2
    # the part's facts are in the key: another part (an H100, or an A100 where this process runs on an H100)
    # plans another config and split count
    hopper = device.Device("nvidia", "NVIDIA H100", "sm_90", 132, 32, False, "cuda")
    ampere = device.Device("nvidia", "NVIDIA A100", "sm_80", 108, 32, False, "cuda")
    here = device.current()
    other = ampere if (here.interpreter, here.capability) == (False, (9, 0)) else hopper
    monkeypatch.setattr(device, "current", lambda: other)
    elsewhere = launch.plan_forward(p, F16)
    assert elsewhere != plan and elsewhere.config == configs.select("decode", 64, interpreter=False,
                                                                    capability=other.capability)
    assert elsewhere == launch._plan(p, F16, None, None, None) and len(launch._plans) == 3


# --------------------------------------------------------------------- the kept kernels, faked on the CPU
def _signature_order(site, args) -> tuple:
    """Every argument of the kernel in signature order, as Triton's JIT hands them to the C launcher: the
    runtime arguments, then the constexprs (and the varlen parameters) given to it by name."""
    sig = inspect.signature(_kernel(site).fn)
    bound = sig.bind(*args, **{k: v for k, v in site.options.items() if k in sig.parameters})
    bound.apply_defaults()
    return tuple(bound.arguments.values())


def _named(entries, inputs, sites) -> list:
    """(kernel, arguments) with each tensor's address named: an input's by its position, any other by its first
    appearance (the buffers a call allocates are new each call)."""
    names = {t.data_ptr(): f"input {i}" for i, t in enumerate(inputs)}
    out = []
    for (kernel, args), s in zip(entries, sites):
        out.append((kernel, tuple(names.setdefault(a, f"buffer {len(names)}") if j in s.aligned else a
                                  for j, a in enumerate(args))))
    return out


def _keep_fakes(monkeypatch, call, inputs):
    """Run ``call`` once through the JIT (the interpreter computes it), recording each site's arguments; then
    keep a fake compiled kernel in each site, as a GPU's first launch does. Returns the first call's launches
    (kernel, every argument in signature order), the sites, the JIT log and the C launchers' log."""
    monkeypatch.setattr(triton, "__version__", "3.6.0")
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda index: 70 + index, raising=False)
    monkeypatch.setattr(launch, "_sites", {})
    monkeypatch.setattr(launch, "_forward_launches", {})
    jitted = []
    real_jit = launcher.SiteLauncher._jit

    def spy(self, args):
        jitted.append((self, args))
        return real_jit(self, args)

    monkeypatch.setattr(launcher.SiteLauncher, "_jit", spy)
    call()
    first = [(_kernel_of(s), _signature_order(s, args)) for s, args in jitted]
    log: list = []
    for s, args in jitted:
        s._keep(FakeKernel(log, _kernel_of(s), hash(_kernel_of(s)) % 997), args, 0)
        assert s.fast is not None
    sites = [s for s, _ in jitted]
    jitted.clear()
    return first, sites, jitted, log


def _c_launches(log, sites) -> list:
    """The log as (kernel, arguments after the launcher's 13 leading ones), each launch's leading ones checked."""
    out = []
    for (kernel, args), s in zip(log, sites):
        assert args[:13] == (s.grid[0], s.grid[1] if len(s.grid) > 1 else 1, s.grid[2] if len(s.grid) > 2 else 1,
                             70, hash(kernel) % 997, 0, 0, None, None, ("meta", kernel), None, None, None)
        out.append((kernel, args[13:]))
    return out


def _as_addresses(first) -> list:
    return [(k, tuple(a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args)) for k, args in first]


def test_a_second_forward_launches_through_the_c_launchers_with_the_jits_arguments(monkeypatch):
    """The split decode form (forward and combine): after the first call keeps (fake) kernels, the second call
    goes to each C launcher, with the arguments the JIT got in signature order (tensors as their addresses,
    the constexprs and the varlen parameters last) and no JIT launch. A profiler's hook sends every launch back
    to the JIT (the interpreter then computes the right result); an integer of another specialisation class
    sends its launch only."""
    q, k, v = torch.randn(1, 4, 1, 32), torch.randn(1, 2, 97, 32), torch.randn(1, 2, 97, 32)
    p, _ = _params(q, k)
    plan = launch.Plan(CFG, True, 2)
    first, sites, jitted, log = _keep_fakes(monkeypatch, lambda: launch.forward(q, k, v, p, plan=plan), (q, k, v))
    assert [k_ for k_, _ in first] == ["attn_fwd_kernel", "attn_combine_kernel"]
    n_runtime = len(attn_fwd_kernel.arg_names) - len(sites[0].tail)
    assert first[0][1][n_runtime:] == sites[0].tail  # the kept constexprs, as the JIT had them
    assert first[0][1][-3:] == (None, None, 0)  # cu_q_ptr, cu_k_ptr, VARLEN: off

    out, lse2 = launch.forward(q, k, v, p, plan=plan)
    assert jitted == []
    assert _named(_c_launches(log, sites), (q, k, v), sites) == _named(_as_addresses(first), (q, k, v), sites)

    chain = launcher.RUNTIME.launch_enter_hook

    def hook(metadata):
        pass

    chain.add(hook)
    try:
        log.clear()
        out, _ = launch.forward(q, k, v, p, plan=plan)
    finally:
        chain.remove(hook)
    assert log == [] and [s for s, _ in jitted] == sites
    assert_close(out, reference(q, k, v), F32, what="out through the JIT")

    k96, v96 = k[:, :, :96], v[:, :, :96]  # Sk = 96, divisible by 16 where 97 was not: the same site and grid
    p96, _ = _params(q, k96)
    jitted.clear()
    log.clear()
    launch.forward(q, k96, v96, p96, plan=plan)
    assert [_kernel_of(s) for s, _ in jitted] == ["attn_fwd_kernel"] and jitted[0][0] is sites[0]
    assert [k_ for k_, _ in log] == ["attn_combine_kernel"]


def test_a_second_backward_launches_through_the_c_launchers_with_the_jits_arguments(monkeypatch):
    B, H, H_kv, Sq, Sk, D = 1, 4, 2, 19, 37, 16
    q, do = torch.randn(B, H, Sq, D), torch.randn(B, H, Sq, D)
    k, v = torch.randn(B, H_kv, Sk, D), torch.randn(B, H_kv, Sk, D)
    mask = torch.randn(1, 1, Sq, Sk)
    p, mask_view = _params(q, k, mask, causal=True)
    out, lse2 = launch.forward(q, k, v, p, mask_view)
    inputs = (do, q, k, v, out, lse2, mask)

    def call():
        return launch.backward(do, q, k, v, out, lse2, p, mask_view, atomic_dq=False, dkdv_config=CFG,
                               dq_config=CFG)

    first, sites, jitted, log = _keep_fakes(monkeypatch, call, inputs)
    assert [k_ for k_, _ in first] == ["attn_bwd_preprocess_kernel", "attn_bwd_dkdv_kernel", "attn_bwd_dq_kernel"]
    call()
    assert jitted == []
    assert _named(_c_launches(log, sites), inputs, sites) == _named(_as_addresses(first), inputs, sites)


def test_every_kernel_keeps_its_constexprs_as_trailing_parameters():
    """A SiteLauncher binds the constexprs after the runtime arguments; the forward's and the backward's varlen
    parameters (after their constexprs) go with them (launch.NO_VARLEN)."""
    for kernel in (attn_fwd_kernel, attn_bwd_dkdv_kernel, attn_bwd_dq_kernel):
        assert kernel.arg_names[-3:] == list(launch.NO_VARLEN)
    for kernel in (attn_combine_kernel, attn_bwd_preprocess_kernel):
        assert kernel.arg_names[-1] != "VARLEN"


def test_a_short_decode_splits_its_keys_to_fill_the_part(monkeypatch):
    """GPT-2's decode shape (12 heads, one row, 520 keys: nine 64-key tiles on Hopper) on a 132-SM part: one split
    would leave 12 programs for 132 SMs, so the keys are split down to a tile each (decisions 041, 052)."""
    monkeypatch.setattr(launch, "_part", lambda: (False, "nvidia", (9, 0), 132))
    q = torch.empty(1, 12, 1, 64)
    plan = launch._plan(_params(q, torch.empty(1, 12, 520, 64))[0], torch.bfloat16, None, None, None)
    assert plan.config.block_n == 64 and plan.num_splits == 9, plan
    monkeypatch.setattr(launch, "_part", lambda: (False, "nvidia", (8, 0), 108))  # (Ampere: 128-key tiles)
    plan = launch._plan(_params(q, torch.empty(1, 12, 520, 64))[0], torch.bfloat16, None, None, None)
    assert plan.config.block_n == 128 and plan.num_splits == 5, plan


@pytest.mark.parametrize("D, most", [(64, 16), (128, 16), (256, 8)])
def test_a_long_decode_splits_no_further_than_an_unrolled_combine_takes(monkeypatch, D, most):
    """A long cache stops splitting where the combine would turn from unrolled to a loop (16 splits, 2048 partial
    elements a row): a Llama-3-8B-like step (8 KV heads, 4096 keys) would want 33 splits to fill the part, and
    33 with the looped combine were slower on an H100 than 16 (decision 052)."""
    monkeypatch.setattr(launch, "_part", lambda: (False, "nvidia", (9, 0), 132))
    p = _params(torch.empty(1, 32, 1, D), torch.empty(1, 8, 4096, D))[0]
    plan = launch._plan(p, torch.bfloat16, None, None, None)
    assert plan.pack_gqa and plan.num_splits == most, plan
    assert most <= launch.COMBINE_UNROLL_MAX and most * launch.block_d(D) <= launch.COMBINE_UNROLL_ELEMS
    assert launch._plan(p, torch.bfloat16, 33, None, None).num_splits == 33  # (a caller's count is kept)
