"""``tilefuse bench models``: the smoke run's rows, the accuracy rule (it must fail on a planted wrong result),
and the command's argument checks. CPU, tiny configs, Triton's interpreter."""
from __future__ import annotations

import argparse
import re

import pytest
import torch

from tilefuse.bench import harness, models_suite, runner

from tests.support import skip_unless_interpreting

pytest.importorskip("transformers", reason="the models suite builds Hugging Face models (make test installs it)")


def _opts(**kw):
    skip_unless_interpreting()  # (a smoke run is the interpreter's: refused where Triton runs on a GPU)
    logs = []
    return runner.SuiteOptions(smoke=True, log=logs.append, **kw), logs


@pytest.fixture(autouse=True)
def _fresh():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.slow
def test_smoke_rows_for_a_language_model_and_a_unet():
    opts, logs = _opts(only=("gpt2", "unet"), mode="train")
    rows = models_suite.run(opts)
    assert [(r.case, r.impl) for r in rows] == [("gpt2-train-b2", "eager"), ("gpt2-train-b2", "tilefuse"),
                                                ("unet-train-b2", "eager"), ("unet-train-b2", "tilefuse")]
    for r in rows:
        assert r.status == "ok", (r.case, r.impl, r.status)
        assert r.ms_p20 <= r.ms_p50 <= r.ms_p80
        assert r.baseline == "eager" and r.vs_baseline > 0
        fields = dict(kv.split("=") for kv in r.note.split("; ")[1:])
        assert float(fields["compile_cold_s"]) > 0
        if r.impl == "tilefuse":
            assert float(fields["compile_warm_s"]) > 0
            assert int(fields["graphs"]) >= 1 and int(fields["kernels"]) >= 1
            assert int(fields["fallbacks"]) >= 0
    assert any("geomean" in line for line in logs)


@pytest.mark.slow
def test_a_planted_wrong_gradient_is_a_wrong_row_not_a_timing(monkeypatch):
    real_step = models_suite.Runner.step

    def step(self, kwargs, keep=False):
        out = real_step(self, kwargs, keep)
        if self.backend == "tilefuse" and keep:
            out[1] = out[1] * 1.01  # one parameter's gradient 1 % off
        return out

    monkeypatch.setattr(models_suite.Runner, "step", step)
    opts, logs = _opts()
    rec = opts.recorder("models", compute_bound=True)
    case = next(c for c in models_suite.cases(True) if c.name == "gpt2")
    rows = models_suite.run_case(rec, case, "train", torch.float32, 2, ("eager", "tilefuse"), True, logs.append)
    by_impl = {r.impl: r for r in rows}
    assert by_impl["tilefuse"].status.startswith("wrong: tensor 1"), by_impl["tilefuse"].status
    assert by_impl["tilefuse"].ms_p50 is None
    assert by_impl["eager"].ok


def test_accuracy_rule():
    torch.manual_seed(0)
    ref = [torch.randn(50, dtype=torch.float64)]
    eager = [ref[0].float() + 1e-6 * torch.randn(50)]
    assert models_suite.accuracy([eager[0].clone()], eager, ref, torch.float32) is None
    # off by more than allclose allows, but no further from float64 than eager: accepted
    near = [ref[0].float() - 1e-6 * torch.randn(50)]
    assert models_suite.accuracy(near, [eager[0] + 1e-3], ref, torch.float32) is None
    assert models_suite.accuracy([eager[0] * 1.01], eager, ref, torch.float32).startswith("tensor 0: rmse")
    bad = eager[0].clone()
    bad[3] = float("nan")
    assert "non-finite" in models_suite.accuracy([bad], eager, ref, torch.float32)
    assert "shape" in models_suite.accuracy([eager[0][:4]], eager, ref, torch.float32)


@pytest.mark.parametrize("argv, match", [
    (["compiler", "--smoke", "--mode", "train"], "models suite alone"),
    (["models", "--smoke", "--backends", "eager,turbo"], "unknown turbo"),
    (["models", "--smoke", "--batch", "-2"], "positive"),
])
def test_bad_arguments_are_refused_before_anything_runs(argv, match):
    p = argparse.ArgumentParser()
    runner.add_arguments(p)
    with pytest.raises(ValueError, match=match):
        runner.main(p.parse_args(argv))


def test_every_backend_compiles_with_known_arguments():
    for b in models_suite.BACKENDS:
        if b != "eager":
            assert models_suite._compile_args(b)["backend"] in ("inductor", "tilefuse")
    assert models_suite._compile_args("inductor-max-autotune") == {"backend": "inductor", "mode": "max-autotune"}
    with pytest.raises(ValueError, match="accepted values"):
        models_suite._compile_args("turbo")


def _tiny(name):
    return next(c for c in models_suite.cases(True) if c.name == name)


def test_decode_step_reads_the_static_cache_like_a_full_forward():
    """The decode runner's step at position P gives the logits a full forward of prompt + token gives at its
    last position; after a rewind the same step gives them again (the timed rounds decode the same positions)."""
    torch.manual_seed(1)
    case = _tiny("llama")
    model = case.build(True).eval()
    prompt = torch.randint(0, 128, (1, 13))
    token = torch.randint(0, 128, (1, 1))
    r = models_suite.Runner(model, "eager", "decode", torch.float32, torch.device("cpu"), prompt=prompt)
    first = r.step({"input_ids": token}, keep=True)[0]
    second = r.step({"input_ids": token}, keep=True)[0]  # position P + 1: attends to one more key
    with torch.no_grad():
        full = model(input_ids=torch.cat([prompt, token], 1)).logits[:, -1:]
    assert first.shape == (1, 1, 128)
    assert harness.rel_error(first, full) < 1e-5
    assert harness.rel_error(second, full) > 1e-4
    r.rewind()
    again = r.step({"input_ids": token}, keep=True)[0]
    assert harness.rel_error(again, first) < 1e-6


def test_decode_rows_for_the_causal_lms_only():
    opts, logs = _opts(only=("gpt2", "bert"), mode="decode")
    rows = models_suite.run(opts)
    assert [(r.case, r.impl) for r in rows] == [("gpt2-decode-b1", "eager"), ("gpt2-decode-b1", "tilefuse")]
    for r in rows:
        assert r.status == "ok", (r.impl, r.status)
        assert "static KV cache" in r.shape and "16-token prompt" in r.shape
    assert any("compile-warm" in line for line in logs) and any("phases compile-cold" in line for line in logs)
    assert all("warm-up" in line for line in logs if "phases compile-cold" in line), logs


def test_a_backend_past_its_time_limit_is_a_not_run_row_and_the_suite_goes_on(monkeypatch):
    """The watchdog stops a phase that does not return (a sleep inside an ``except Exception`` that would swallow
    an ordinary exception, as a compiler's fallback does), not only between phases."""
    import time

    real_step = models_suite.Runner.step

    def step(self, kwargs, keep=False):
        if self.backend == "tilefuse":
            try:
                time.sleep(30)
            except Exception:
                pass
        return real_step(self, kwargs, keep)

    monkeypatch.setattr(models_suite.Runner, "step", step)
    opts, logs = _opts()
    rec = opts.recorder("models", compute_bound=True)
    start = time.perf_counter()
    rows = models_suite.run_case(rec, _tiny("gpt2"), "infer", torch.float32, 2, ("eager", "tilefuse"), True,
                                 logs.append, time_limit=1.0)
    assert time.perf_counter() - start < 20
    by_impl = {r.impl: r for r in rows}
    assert by_impl["tilefuse"].status == "not run: exceeded 1 s in phase compile-cold", by_impl["tilefuse"].status
    assert by_impl["tilefuse"].ms_p50 is None
    assert by_impl["eager"].ok, by_impl["eager"].status


@pytest.mark.slow
def test_time_limit_in_the_timing_phase():
    opts, logs = _opts()
    rec = opts.recorder("models", compute_bound=True)
    limits = []
    real = harness.Deadline

    class Spy(real):  # the eager runner's budget is tiny: it runs out in its first timed round
        def __init__(self, seconds):
            super().__init__(seconds)
            limits.append(self)

        def phase(self, name):
            if name == "timing" and self is limits[0]:
                self.seconds = 1e-9
            return super().phase(name)

    import unittest.mock

    with unittest.mock.patch.object(harness, "Deadline", Spy):
        rows = models_suite.run_case(rec, _tiny("gpt2"), "infer", torch.float32, 2, ("eager", "tilefuse"), True,
                                     logs.append, time_limit=600)
    by_impl = {r.impl: r for r in rows}
    assert by_impl["eager"].status.startswith("not run: exceeded 1e-09 s in phase timing"), by_impl["eager"].status
    assert by_impl["tilefuse"].ok and by_impl["tilefuse"].vs_baseline is None  # no eager time to compare with


@pytest.mark.slow
def test_reduce_overhead_rows_never_crash_the_suite():
    """tilefuse-reduce-overhead is either timed (the mode exists) or a 'not run' row with the backend's words,
    never a default-mode timing under its name."""
    opts, logs = _opts(only=("gpt2",), mode="infer", backends=("tilefuse-reduce-overhead",))
    rows = models_suite.run(opts)
    row = next(r for r in rows if r.impl == "tilefuse-reduce-overhead")
    assert row.ok or row.status.startswith("not run: tilefuse backend: mode='reduce-overhead'"), row.status
    assert next(r for r in rows if r.impl == "eager").ok
    if row.ok:  # its note says what its CUDA graphs did over the timed steps (here: the interpreter, uncaptured)
        graphs = models_suite._note_fields(row.note)["cudagraphs"]
        calls = int(re.search(r"(\d+) uncaptured calls", graphs).group(1))
        assert calls >= 1 + models_suite.SMOKE_WARMUP_STEPS + models_suite.SMOKE_ROUNDS * models_suite.SMOKE_STEPS \
            and "interpreter" in graphs, graphs


def test_summary_geomeans_over_eager_and_each_inductor_mode():
    def row(case, impl, vs, note):
        return harness.Row("models", case, impl, "bfloat16", "", ms_p50=1.0, vs_baseline=vs, baseline="eager",
                           note=note)

    rows = [row("a-infer-b1", "tilefuse", 2.0, "compile_cold_s=1; x_inductor=1.5"),
            row("b-infer-b1", "tilefuse", 0.5, "x_inductor=0.6; x_inductor-reduce-overhead=0.9"),
            harness.Row("models", "c-infer-b1", "tilefuse", "bfloat16", "", status="not run: exceeded 5 s in phase "
                        "compile-cold")]
    lines = models_suite.summary(rows)
    assert lines[0].split() == ["tilefuse", "infer", "geomean", "1.000x", "eager", "over", "2", "models;", "0.949x",
                                "inductor", "(2),", "0.900x", "inductor-reduce-overhead", "(1)"], lines[0]
    assert lines[1].split()[-2:] == ["run:", "c-infer-b1"]


@pytest.mark.parametrize("argv, match", [
    (["compiler", "--smoke", "--time-limit", "5"], "attention and models suites"),
    (["models", "--smoke", "--time-limit", "-1"], "positive"),
    (["models", "--smoke", "--budget", "5"], "attention suite alone"),
])
def test_limits_are_refused_where_they_mean_nothing(argv, match):
    p = argparse.ArgumentParser()
    runner.add_arguments(p)
    with pytest.raises(ValueError, match=match):
        runner.main(p.parse_args(argv))


def test_without_the_warm_compile_the_cold_models_are_timed():
    opts, logs = _opts(only=("gpt2",), mode="infer", warm=False)
    rows = models_suite.run(opts)
    assert [r.impl for r in rows] == ["eager", "tilefuse"]
    for r in rows:
        assert r.ok, r.status
        assert "compile_cold_s=" in r.note and "compile_warm_s" not in r.note
    assert not any("compile-warm" in line for line in logs)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["train", "decode"])
def test_inductor_reduce_overhead_rows_on_the_gpu(mode):
    """CUDA graphs replay into the same output buffers: the accuracy step keeps copies, every step starts a new
    generation (cudagraph_mark_step_begin), and the decode step's cache writes stay at static addresses."""
    logs = []
    opts = runner.SuiteOptions(log=logs.append)
    rec = opts.recorder("models", compute_bound=True)
    rows = models_suite.run_case(rec, _tiny("gpt2"), mode, torch.bfloat16, 2, ("eager", "inductor-reduce-overhead"),
                                 False, logs.append, time_limit=300, warm=False)
    by_impl = {r.impl: r for r in rows}
    assert by_impl["inductor-reduce-overhead"].ok, (by_impl["inductor-reduce-overhead"].status, logs[-20:])
    assert "peak_gib=" in by_impl["inductor-reduce-overhead"].note
