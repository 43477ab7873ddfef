"""``tilefuse bench models``: the smoke run's rows, the accuracy rule (it must fail on a planted wrong result),
and the command's argument checks. CPU, tiny configs, Triton's interpreter."""
from __future__ import annotations

import argparse

import pytest
import torch

from tilefuse.bench import harness, models_suite, runner

pytest.importorskip("transformers", reason="the models suite builds Hugging Face models (make test installs it)")


def _opts(**kw):
    logs = []
    return runner.SuiteOptions(smoke=True, log=logs.append, **kw), logs


@pytest.fixture(autouse=True)
def _fresh():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


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
