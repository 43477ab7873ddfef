"""Test set-up: CPU runs go on Triton's interpreter; `gpu` tests run only where a GPU is.

tilefuse.device is imported first: with no GPU it sets TRITON_INTERPRET=1 before any @triton.jit runs.
Every test session gets its own empty TILEFUSE_CACHE_DIR, so no test depends on what an earlier run left.
"""
from __future__ import annotations

import os
import random
import tempfile

import pytest

import tilefuse.device as tf_device  # noqa: E402  (first: decides the interpreter)
from tilefuse import config

_SESSION_CACHE = tempfile.mkdtemp(prefix="tilefuse-test-cache-")
config.set_for_process(cache_dir=_SESSION_CACHE, progress=False)
os.environ["TILEFUSE_CACHE_DIR"] = _SESSION_CACHE  # child processes (CLI tests) use the same cache



def pytest_collection_modifyitems(config, items):
    # `slow` tests first (a stable sort): xdist hands tests out in collection order, so a long test collected
    # last (the real models are) runs alone at the end while the other worker waits
    items.sort(key=lambda item: "slow" not in item.keywords)
    dev = tf_device.current()
    if dev.is_gpu and not dev.interpreter:
        return
    skip = pytest.mark.skip(reason="needs a GPU (this machine has none); run `make gpu-test` on a GPU machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def fresh_seed(request):
    """Fresh random inputs every run; the seed is printed with a failure so it can be replayed."""
    import torch

    seed = int(os.environ.get("TILEFUSE_TEST_SEED", "0")) or random.SystemRandom().randrange(1, 2**31)
    torch.manual_seed(seed)
    random.seed(seed)
    request.node.user_properties.append(("seed", seed))
    yield seed


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        seeds = [v for k, v in item.user_properties if k == "seed"]
        if seeds:
            report.sections.append(("seed", f"replay with TILEFUSE_TEST_SEED={seeds[0]}"))


@pytest.fixture
def device():
    """The torch device tests put tensors on: cuda on a GPU machine, cpu on the interpreter."""
    return tf_device.torch_device()


@pytest.fixture
def on_the_kernels_device():
    """Every tensor a test makes is on the device the kernels run on (cuda on a GPU machine, where a CPU tensor is
    refused or its graph runs in ATen; the CPU on the interpreter). A context, not set_default_device and back:
    setting it back to the CPU leaves a device mode on every later torch call of the process. A module takes it
    with ``pytestmark = pytest.mark.usefixtures("on_the_kernels_device")``."""
    import torch

    with torch.device(tf_device.torch_device()):
        yield


@pytest.fixture
def tmp_cache(tmp_path):
    """A private, empty TILEFUSE_CACHE_DIR for one test."""
    with config.override(cache_dir=tmp_path / "cache"):
        yield tmp_path / "cache"
