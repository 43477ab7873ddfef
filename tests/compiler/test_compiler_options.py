"""``torch.compile(..., backend="tilefuse", options={...})``: per-model settings, validated before anything compiles."""
from __future__ import annotations

import pytest
import torch

from tilefuse import config
from tilefuse.compiler import options

from tests import compiler_checks as cc


@pytest.fixture(autouse=True)
def _fresh():
    cc.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("opts, match", [
    ({"fuse": True}, r"unknown option\(s\) 'fuse'; accepted keys are debug, strict, cache_dir, autotune"),
    ({"debug": 7}, r"options\['debug'\]=7: accepted values are an int 0-3"),
    ({"debug": True}, r"options\['debug'\]=True"),
    ({"strict": 1}, r"options\['strict'\]=1: accepted values are True or False"),
    ({"cache_dir": ""}, r"options\['cache_dir'\]=''"),
    ({"autotune": "yes"}, r"options\['autotune'\]='yes'"),
])
def test_bad_options_are_refused_with_the_key_and_what_is_accepted(opts, match):
    with pytest.raises(ValueError, match=match):
        options.validate(opts)
    with pytest.raises(Exception, match=match):
        torch.compile(lambda t: t + 1, backend="tilefuse", options=opts)(torch.randn(3))


def test_options_apply_to_this_models_compilation_only(tmp_path):
    before = config.get()
    x = torch.randn(4, 5, requires_grad=True)
    cache = tmp_path / "per-model-cache"
    fn = torch.compile(lambda t: torch.softmax(t * 2, -1), backend="tilefuse",
                       options={"cache_dir": str(cache), "debug": 0})
    out = fn(x)
    out.sum().backward()  # the backward graph compiles now, under the same options
    torch.testing.assert_close(out, torch.softmax(x * 2, -1))
    assert any(cache.rglob("*.py")), "no kernel written to the model's cache_dir"
    assert config.get() is before, "the options leaked into the process's settings"


def test_strict_option_raises_where_the_default_falls_back():
    x = torch.randn(6, dtype=torch.complex64)
    fn = torch.compile(lambda t: t * 2, backend="tilefuse", options={"strict": True})
    with pytest.raises(Exception, match="FallbackError: tilefuse strict mode: mul .* would fall back to ATen"):
        fn(x)  # Dynamo wraps the FallbackError in its BackendCompilerFailed
    torch._dynamo.reset()
    with config.override(strict=False):
        out = torch.compile(lambda t: t * 2, backend="tilefuse", options={"strict": False})(x)
    assert torch.equal(out, x * 2)
