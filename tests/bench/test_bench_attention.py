"""``tilefuse bench attention``: the variant cases (softcap, ALiBi, sliding window) and their peers, the check
that catches a wrong implementation, the row and suite time limits, the plain form's memory rule. CPU smoke
runs (tiny shapes, Triton's interpreter); the compiled peers' backward is a GPU test."""
from __future__ import annotations

import time

import pytest
import torch

from tilefuse.bench import attention_suite as att
from tilefuse.bench import harness, runner

from tests.support import skip_unless_interpreting


def _opts(**kw):
    skip_unless_interpreting()  # (a smoke run is the interpreter's: refused where Triton runs on a GPU)
    logs = []
    return runner.SuiteOptions(smoke=True, log=logs.append, **kw), logs


@pytest.fixture(autouse=True)
def _fresh():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _by(rows):
    return {(r.case, r.impl): r for r in rows}


@pytest.mark.slow
def test_variant_rows_against_inductor():
    opts, logs = _opts(only=("softcap", "alibi", "window"))
    rows = att.run(opts)
    by = _by(rows)
    for variant in ("softcap", "alibi", "window"):
        impls = ["tilefuse", "flex", "inductor"] + (["tilefuse-window"] if variant == "window" else [])
        for impl in impls:
            fwd, bwd = by[(f"{variant}-smoke-fwd", impl)], by[(f"{variant}-smoke-bwd", impl)]
            assert fwd.ok, (variant, impl, fwd.status)
            if impl == "flex":  # no FlexAttention backward on the CPU: said, not dropped
                assert bwd.status == "not run: smoke run: FlexAttention has no backward on the CPU"
            else:
                assert bwd.ok, (variant, impl, bwd.status)
            for r in (fwd, bwd):
                if r.ok and impl != "inductor":
                    assert r.baseline == "inductor"
                    peer = by[(r.case, "inductor")]
                    assert r.vs_baseline == pytest.approx(peer.ms_p50 / r.ms_p50)
        assert not any(r.impl.startswith("sdpa") for r in rows if r.case.startswith(variant))
    assert by[("softcap-smoke-fwd", "tilefuse")].shape.endswith("softcap 50")
    assert any("window-smoke" in line and "compile + check" in line for line in logs)


def test_a_plain_form_that_drops_the_variant_is_wrong(monkeypatch):
    """The check is against an independent formulation: a plain form that forgets the softcap is caught."""
    real = att.plain_attention

    def forgetful(case, q, k, v):
        return real(att.Case(case.name, case.B, case.H, case.H_kv, case.Sq, case.Sk, case.D, case.causal), q, k, v)

    monkeypatch.setattr(att, "plain_attention", forgetful)
    opts, _ = _opts(only=("softcap",))
    by = _by(att.run(opts))
    for phase in ("fwd", "bwd"):
        assert by[(f"softcap-smoke-{phase}", "inductor")].status.startswith("wrong: out rel error")
        assert by[(f"softcap-smoke-{phase}", "tilefuse")].ok


def test_variant_references_agree_with_the_plain_form():
    """Two formulations of each variant (SDPA with the bias or band as a tensor / an explicit softcap, and the
    plain form from arange) agree in float64: neither benchmark definition is off by a sign or a diagonal."""
    torch.manual_seed(3)
    for case in att.SMOKE_CASES:
        q, k, v = (t.detach().double() for t in att._inputs(case, torch.float32, "cpu"))
        _, ref = att._reference(case, q, k, v)
        plain = att.plain_attention(case, q, k, v)
        assert harness.rel_error(plain, ref) < 1e-6, case.name


def test_a_row_past_its_time_limit_is_not_run_and_the_case_goes_on(monkeypatch):
    real = att._tilefuse

    def slow(case, device, **kw):
        try:
            time.sleep(30)  # a compile that never returns, inside a handler that would swallow an Exception
        except Exception:
            pass
        return real(case, device, **kw)

    monkeypatch.setattr(att, "_tilefuse", slow)
    opts, logs = _opts(only=("alibi",), time_limit=0.5)
    start = time.perf_counter()
    by = _by(att.run(opts))
    assert time.perf_counter() - start < 25
    for phase in ("fwd", "bwd"):
        assert by[(f"alibi-smoke-{phase}", "tilefuse")].status == \
            "not run: exceeded 0.5 s in phase compile+check (--time-limit)"
        assert by[(f"alibi-smoke-{phase}", "inductor")].ok


def test_a_spent_suite_budget_leaves_a_row_for_everything(monkeypatch):
    opts, _ = _opts(budget_s=1e-6)
    rows = att.run(opts)
    expected = sum(len(att._impls(c, True, "cpu")) * (2 if c.backward else 1) for c in att.SMOKE_CASES)
    assert len(rows) == expected
    spent = [r for r in rows if r.status == "not run: the suite's time budget (1e-06 s) was spent"]
    smoke_gpu = [r for r in rows if r.status == "not run: smoke run: a GPU backend"]
    assert len(spent) + len(smoke_gpu) == expected and spent


def test_the_plain_form_is_not_run_where_its_scores_would_not_fit():
    by_name = {c.name: c for c in att.CASES + att.VARIANT_CASES}
    impls = dict((name, (build, why)) for name, build, why in att._impls(by_name["mha-16k"], False, "cpu"))
    build, why = impls["inductor"]
    assert build is None and "GiB of scores" in why and f"limit {att.PLAIN_MAX_BYTES >> 30} GiB" in why
    for name in ("llama-prefill-gqa", "softcap-prefill-gqa", "decode-gqa"):
        impls = dict((n, (b, w)) for n, b, w in att._impls(by_name[name], False, "cpu"))
        assert impls["inductor"][0] is not None, name


def test_quick_runs_the_variants_and_the_headline_cases():
    opts = runner.SuiteOptions(quick=True)
    names = [c.name for c in att._ordered_cases(opts)]
    assert names[:2] == ["mha-16k-causal", "llama-prefill-gqa"]
    assert {"softcap-prefill-gqa", "alibi-prefill-gqa", "window-prefill-gqa", "decode-gqa"} <= set(names)
    assert "mha-16k" not in names


def test_donated_buffers_are_off_while_a_case_compiles():
    cfg = torch._functorch.config
    if not hasattr(cfg, "donated_buffer"):
        pytest.skip("this torch has no donated buffers")
    before = cfg.donated_buffer
    with att._no_donated_buffers():
        assert cfg.donated_buffer is False
    assert cfg.donated_buffer == before


@pytest.mark.gpu
def test_compiled_backward_rows_run_on_the_gpu():
    """flex and Inductor's backward rows time ``autograd.grad(..., retain_graph=True)`` many times over one
    graph: compiled with donated buffers that is refused."""
    case = att.Case("small-gpu", 1, 4, 2, 256, 256, 64, causal=True, variant="alibi")
    opts = runner.SuiteOptions(rep_ms=10, warmup_ms=5)
    rec = harness.Recorder("attention", rep_ms=10, warmup_ms=5, log=lambda s: None)
    att.time_case(rec, case, opts, torch.bfloat16, "cuda")
    by = _by(rec.finish())
    for impl in ("tilefuse", "flex", "inductor"):
        for phase in ("fwd", "bwd"):
            assert by[(f"small-gpu-{phase}", impl)].ok, (impl, phase, by[(f"small-gpu-{phase}", impl)].status)
