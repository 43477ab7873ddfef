import os

import pytest

from tilefuse import device


def test_cpu_machine_runs_on_the_interpreter():
    dev = device.current()
    if dev.is_gpu:
        pytest.skip("this machine has a GPU")
    assert dev.vendor == "cpu" and dev.interpreter and device.interpreting()
    assert dev.torch_device == "cpu" and str(device.torch_device()) == "cpu"
    assert os.environ.get("TRITON_INTERPRET") == "1"  # set before any @triton.jit ran
    assert "interpreter" in dev.describe()
    assert device.ceilings() is None


def test_triton_kernels_defined_after_import_are_interpreted():
    dev = device.current()
    if not dev.interpreter:
        pytest.skip("kernels are compiled on this machine")
    import triton

    @triton.jit
    def _probe(x):
        pass

    assert type(_probe).__name__ == "InterpretedFunction"


@pytest.mark.parametrize("name, part", [
    ("NVIDIA H200", "NVIDIA H200 SXM"), ("NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM"),
    ("NVIDIA H100 PCIe", "NVIDIA H100 PCIe"), ("NVIDIA A100-SXM4-80GB", "NVIDIA A100 SXM 80GB"),
    ("AMD Instinct MI300X", "AMD Instinct MI300X"), ("AMD Instinct MI325X", "AMD Instinct MI325X"),
    ("NVIDIA B200", "NVIDIA HGX B200"),
])
def test_datasheets_match_device_names(name, part):
    dev = device.Device("nvidia", name, "sm_90", 132, 32, False, "cuda")
    assert device.datasheet(dev).part == part


def test_unknown_device_has_no_datasheet():
    assert device.datasheet(device.Device("nvidia", "NVIDIA GeForce GT 710", "sm_35", 1, 32, False, "cuda")) is None


def test_capability_parses_arch():
    assert device.Device("nvidia", "x", "sm_90", 1, 32, False, "cuda").capability == (9, 0)
    assert device.Device("nvidia", "x", "sm_100", 1, 32, False, "cuda").capability == (10, 0)
    assert device.Device("amd", "x", "gfx942", 1, 64, False, "cuda").capability is None


def test_measured_ceilings_are_cached_per_device(tmp_cache):
    import dataclasses

    dev = device.Device("nvidia", "NVIDIA H200", "sm_90", 132, 32, False, "cuda")
    ceil = device.Ceilings(dev.name, 4230.0, 712.0, 700.0, 8192, "t", "tr", "2026-12-02T00:00:00+00:00")
    from tilefuse import diskcache

    diskcache.write_json(device._ceilings_path(dev), dataclasses.asdict(ceil))
    assert device.ceilings(dev) == ceil
    other = device.Device("nvidia", "NVIDIA A100-SXM4-80GB", "sm_80", 108, 32, False, "cuda")
    assert device.ceilings(other) is None


@pytest.mark.gpu
def test_gpu_device_is_detected_and_ceilings_measure():
    dev = device.current()
    assert dev.is_gpu and not dev.interpreter and dev.multiprocessors > 0
    assert dev.warp_size == (64 if dev.vendor == "amd" else 32)
    ceil = device.measure_ceilings()
    assert ceil.copy_gbps > 100 and ceil.bf16_tflops > 10
    assert device.ceilings() == ceil
