"""tilefuse.kernels.fast_launch: the generic C launcher. On the CPU its dry-run mode returns the exact parameter
bytes and launch config it would hand cuLaunchKernelEx, so packing, order, config and argument errors are checked
here against fake compiled kernels; on a GPU (``gpu``) a real kernel is launched through it and timed against
Triton's own launcher."""
from __future__ import annotations

import ctypes
import shutil
import struct
import sysconfig
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget

from tilefuse.kernels import fast_launch


def _buildable() -> bool:
    return shutil.which("gcc") is not None and (Path(sysconfig.get_paths()["include"]) / "Python.h").is_file()


@pytest.fixture(scope="module")
def mod():
    m = fast_launch.module()
    if m is None:
        if not _buildable():
            pytest.skip(fast_launch.unavailable_reason())
        pytest.fail(f"gcc and Python.h are here, yet: {fast_launch.unavailable_reason()}")
    return m


@pytest.fixture
def dry(mod):
    was = mod.set_dry_run(True)
    yield mod
    mod.set_dry_run(was)


class _Fake:
    """An object of the given attributes (weakly referable, as CompiledKernel is: prepare keeps refusals so)."""

    def __init__(self, **attrs):
        self.__dict__.update(attrs)


def _compiled(signature: dict, *, backend="cuda", num_warps=4, num_ctas=1, shared=0, scratch=0, profile=0,
              coop=False, pdl=False, function=0x5EED):
    """What prepare() reads of a Triton 3.6 CompiledKernel."""
    meta = _Fake(target=GPUTarget(backend, 90, 32), num_warps=num_warps, num_ctas=num_ctas, shared=shared,
                           global_scratch_size=scratch, global_scratch_align=1, profile_scratch_size=profile,
                           profile_scratch_align=1, launch_cooperative_grid=coop, launch_pdl=pdl)
    return _Fake(metadata=meta, src=_Fake(signature=signature), function=function, name="k")


def _one(mod, kind: str, value):
    p = mod.make(1, (1,), 4, 1, 0, False, False, [kind], name="one")
    params, _ = mod.launch(p, 0, value)
    return params[0]


def _bf16_truncated(v: float) -> bytes:
    return struct.pack("<H", struct.unpack("<I", struct.pack("<f", v))[0] >> 16)


ADDRESS = 0x7F12_3456_7890  # a 47-bit device address, as the allocator hands out

PACKED = [
    ("*fp32", ADDRESS, struct.pack("<Q", ADDRESS)),
    ("*kbf16", 0, bytes(8)),
    ("*i8", 2**64 - 16, struct.pack("<Q", 2**64 - 16)),
    ("i1", True, b"\x01"),
    ("u1", False, b"\x00"),
    ("u1", 1, b"\x01"),
    ("i8", -128, struct.pack("<b", -128)),
    ("i16", -2, struct.pack("<h", -2)),
    ("i32", -5, struct.pack("<i", -5)),
    ("i32", 2**31 - 1, struct.pack("<i", 2**31 - 1)),
    ("i32", np.int64(-7), struct.pack("<i", -7)),
    ("i64", -(2**40) - 3, struct.pack("<q", -(2**40) - 3)),
    ("u8", 255, b"\xff"),
    ("u16", 65535, b"\xff\xff"),
    ("u32", 2**32 - 1, struct.pack("<I", 2**32 - 1)),
    ("u64", 2**63 + 5, struct.pack("<Q", 2**63 + 5)),
    ("fp32", 1.5, struct.pack("<f", 1.5)),
    ("fp32", 0.1, struct.pack("<f", 0.1)),
    ("f32", 3, struct.pack("<f", 3.0)),
    ("fp64", 0.1, struct.pack("<d", 0.1)),
    ("fp16", -2.5, np.float16(-2.5).tobytes()),
    ("fp16", 0.1, np.float16(0.1).tobytes()),  # (rounded to nearest)
    ("bf16", 1.5, torch.tensor(1.5, dtype=torch.bfloat16).view(torch.int16).numpy().tobytes()),
    # 1 + 2**-8 + 2**-20 (fp32 0x3F808008): rounding gives bf16 0x3F81, truncation (Triton's launcher) 0x3F80
    ("bf16", 1 + 2**-8 + 2**-20, _bf16_truncated(1 + 2**-8 + 2**-20)),
]


@pytest.mark.parametrize("kind,value,expected", PACKED, ids=[f"{k}={v!r}"[:40] for k, v, _ in PACKED])
def test_each_kind_packs_to_the_bytes_the_kernel_reads(dry, kind, value, expected):
    assert _one(dry, kind, value) == expected


def test_bf16_is_truncated_like_tritons_launcher_not_rounded(dry):
    v = 1 + 2**-8 + 2**-20
    rounded = torch.tensor(v, dtype=torch.bfloat16).view(torch.int16).numpy().tobytes()
    assert _one(dry, "bf16", v) == b"\x80\x3f" != rounded


def test_parameters_follow_the_runtime_signature_then_two_null_scratch_pointers(dry):
    sig = {"x": "*fp32", "BLOCK": "constexpr", "n": "i32", "alpha": "fp32", "flag": "u1", "big": "i64",
           "y": "*fp16", "HAS_BIAS": "constexpr"}
    compiled = _compiled(sig)
    p = fast_launch.prepare(compiled, (4,), 0)
    assert p is not None, fast_launch.refusal(compiled)
    assert p.kinds == ("ptr", "i32", "fp32", "u1", "i64", "ptr")
    assert fast_launch.runtime_positions(compiled) == (0, 2, 3, 4, 5, 6)
    params, config = dry.launch(p, 0, ADDRESS, 1000, 2.0, True, -(2**35), ADDRESS + 4096)
    assert params == (struct.pack("<Q", ADDRESS), struct.pack("<i", 1000), struct.pack("<f", 2.0), b"\x01",
                      struct.pack("<q", -(2**35)), struct.pack("<Q", ADDRESS + 4096), bytes(8), bytes(8))
    assert config["function"] == 0x5EED


def test_config_grid_block_shared_stream(dry):
    p = fast_launch.prepare(_compiled({"x": "*fp32"}, num_warps=8, shared=49152), (5, 2), 0)
    _, config = dry.launch(p, 0xABC, ADDRESS)
    assert config == {"grid": (5, 2, 1), "block": (256, 1, 1), "shared": 49152, "stream": 0xABC, "attrs": (),
                      "function": 0x5EED, "launch": True}
    assert (p.grid, p.num_warps, p.shared, p.device) == ((5, 2, 1), 8, 49152, 0)


def test_config_clusters_cooperative_and_pdl_as_triton_sets_them(dry):
    p = fast_launch.prepare(_compiled({"x": "*fp32"}, num_ctas=2, coop=True, pdl=True), (3, 4, 5), 1)
    _, config = dry.launch(p, 0, ADDRESS)
    assert config["grid"] == (6, 4, 5)  # x counts CTAs: programs x num_ctas
    assert config["attrs"] == (("pdl", 1), ("cooperative", 1), ("cluster_dim", (2, 1, 1)),
                               ("cluster_scheduling", "spread"))


def test_an_empty_grid_never_calls_the_driver(mod):
    p = mod.make(1, (0, 3), 4, 1, 0, False, False, ["i32"])
    assert mod.launch(p, 0, 5) is None  # (no libcuda needed: nothing to launch)
    was = mod.set_dry_run(True)
    try:
        assert mod.launch(p, 0, 5)[1]["launch"] is False
    finally:
        mod.set_dry_run(was)


def test_wrong_argument_count_names_expected_and_got(dry):
    p = dry.make(1, (1,), 4, 1, 0, False, False, ["*fp32", "i32", "fp32"], name="axpy")
    with pytest.raises(TypeError, match=r"'axpy' takes 3 runtime arguments, got 2"):
        dry.launch(p, 0, ADDRESS, 4)
    with pytest.raises(TypeError, match="takes 3 runtime arguments, got 4"):
        dry.launch(p, 0, ADDRESS, 4, 1.0, 9)
    with pytest.raises(TypeError, match="Prepared"):
        dry.launch(ADDRESS, 0, ADDRESS, 4, 1.0)
    with pytest.raises(TypeError, match="stream"):
        dry.launch(p, None, ADDRESS, 4, 1.0)


@pytest.mark.parametrize("kind,value", [("i32", 2**31), ("i32", -(2**31) - 1), ("i8", 128), ("i16", -(2**15) - 1),
                                        ("i64", 2**63), ("u8", 256), ("u8", -1), ("u32", 2**32), ("u64", -1),
                                        ("u64", 2**64), ("*fp32", -16), ("*fp32", 2**64), ("u1", 2), ("i1", -1),
                                        ("fp16", 1e6), ("fp32", 10**400)])
def test_a_value_out_of_range_raises_overflow_naming_the_argument(dry, kind, value):
    p = dry.make(1, (1,), 4, 1, 0, False, False, ["i32", kind], name="k")
    with pytest.raises(OverflowError, match=rf"argument 1 \({'ptr' if kind[0] == '*' else kind}\)"):
        dry.launch(p, 0, 0, value)


@pytest.mark.parametrize("kind,value,expected", [("*fp32", 1.0, "an int"), ("*fp32", None, "an int"),
                                                 ("*fp32", True, "an int"), ("*fp32", torch.zeros(1), "an int"),
                                                 ("*fp32", torch.tensor([16]), "an int"),
                                                 ("*fp32", np.uint64(16), "an int"),
                                                 ("i32", 1.5, "an int"), ("i32", "3", "an int"),
                                                 ("u64", 2.0, "an int"), ("fp32", "1.0", "a float"),
                                                 ("bf16", None, "a float")])
def test_a_value_of_the_wrong_type_raises_type_error_naming_the_argument(dry, kind, value, expected):
    p = dry.make(1, (1,), 4, 1, 0, False, False, [kind], name="k")
    with pytest.raises(TypeError, match=f"argument 0 .* must be {expected}"):
        dry.launch(p, 0, value)


def test_prepare_refuses_what_this_launcher_does_not_pass(mod):
    cases = {
        "global scratch": _compiled({"x": "*fp32"}, scratch=256),
        "profile scratch": _compiled({"x": "*fp32"}, profile=64),
        "tensor descriptors": _compiled({"d": "tensordesc<fp16[64, 64]>", "n": "i32"}),
        "nvTmaDesc": _compiled({"d": "nvTmaDesc"}),
        "fp8e4nv argument": _compiled({"x": "*fp32", "s": "fp8e4nv"}),
        "tuple arguments": _compiled({"xs": ("*fp32", "i32")}),
        "backend 'hip'": _compiled({"x": "*fp32"}, backend="hip"),
        "loaded CUfunction": _compiled({"x": "*fp32"}, function=0),
        "grid": _compiled({"x": "*fp32"}),
    }
    for why, compiled in cases.items():
        grid = (-1,) if why == "grid" else (1,)
        if why == "loaded CUfunction":
            compiled.run = None  # (a fake whose run loads nothing)
        assert fast_launch.prepare(compiled, grid, 0) is None, why
        assert why in fast_launch.refusal(compiled), (why, fast_launch.refusal(compiled))


def test_prepare_accepts_every_scalar_kind_and_forgets_an_earlier_refusal(mod):
    sig = {f"a{i}": t for i, t in enumerate(["*fp16", "i1", "i8", "i16", "i32", "i64", "u1", "u8", "u16", "u32",
                                             "u64", "fp16", "bf16", "fp32", "f32", "fp64"])}
    compiled = _compiled(sig, function=0)
    compiled.run = None
    assert fast_launch.prepare(compiled, (1,), 0) is None
    compiled.function = 42
    p = fast_launch.prepare(compiled, (1,), 0)
    assert p is not None and fast_launch.refusal(compiled) is None
    assert p.kinds[-3:] == ("fp32", "fp32", "fp64") and len(p.kinds) == 16


def test_without_a_driver_a_real_launch_raises_a_clear_runtime_error(mod):
    try:
        ctypes.CDLL("libcuda.so.1")
        pytest.skip("this machine has a CUDA driver")
    except OSError:
        pass
    p = mod.make(1, (1,), 4, 1, 0, False, False, ["i32"])
    with pytest.raises(RuntimeError, match="libcuda.so.1"):
        mod.launch(p, 0, 3)


# ------------------------------------------------------------------------------------------------------- GPU
@triton.jit
def _scale_shift(x_ptr, y_ptr, n, a, b, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    tl.store(y_ptr + i, tl.load(x_ptr + i, m) * a + b, m)


def _host_us(fn, calls: int = 2000, warmup: int = 200) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    us = (time.perf_counter() - t0) * 1e6 / calls
    torch.cuda.synchronize()
    return us


@pytest.mark.gpu
def test_gpu_launch_matches_torch_and_times_both_launchers():
    n, block = 5000, 1024
    grid = (triton.cdiv(n, block),)
    x, y = torch.randn(n, device="cuda"), torch.empty(n, device="cuda")
    compiled = _scale_shift[grid](x, y, n, 2.5, 3, BLOCK=block)  # the JIT's launch: loads the function
    torch.testing.assert_close(y, x * 2.5 + 3)
    prepared = fast_launch.prepare(compiled, grid, x.get_device())
    assert prepared is not None, fast_launch.refusal(compiled)
    assert prepared.kinds == ("ptr", "ptr", "i32", "fp32", "i32")
    mod = fast_launch.module()

    x2, y2 = torch.randn(n, device="cuda"), torch.full((n,), float("nan"), device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    mod.launch(prepared, stream, x2.data_ptr(), y2.data_ptr(), n, -1.25, -7)
    torch.cuda.synchronize()
    torch.testing.assert_close(y2, x2 * -1.25 - 7)

    run = compiled.run
    assert type(run).__name__ == "CudaLauncher"
    px, py = x2.data_ptr(), y2.data_ptr()
    coop, pdl = int(run.launch_cooperative_grid), int(run.launch_pdl)
    tri = run.launch
    function, packed = compiled.function, compiled.packed_metadata
    g0 = grid[0]
    ours = mod.launch
    t_triton = _host_us(lambda: tri(g0, 1, 1, stream, function, coop, pdl, None, None, packed, None, None, None,
                                    px, py, n, 0.5, 2, block))
    t_ours = _host_us(lambda: ours(prepared, stream, px, py, n, 0.5, 2))
    torch.testing.assert_close(y2, x2 * 0.5 + 2)
    no_blocks = mod.make(function, (0,), prepared.num_warps, 1, prepared.shared, False, False, prepared.kinds)
    t_host = _host_us(lambda: ours(no_blocks, stream, px, py, n, 0.5, 2))  # (all but the driver call)
    print(f"host us a launch ({torch.cuda.get_device_name()}): Triton's CudaLauncher.launch {t_triton:.2f}, "
          f"fast_launch {t_ours:.2f}, of which outside the driver call {t_host:.2f}")


@triton.jit
def _scalars(ints_ptr, floats_ptr, a: tl.int8, b: tl.int16, c: tl.int32, d: tl.int64, e: tl.uint8, f: tl.uint32,
             g: tl.uint64, flag: tl.int1, h: tl.float16, i: tl.bfloat16, j: tl.float32, k: tl.float64):
    tl.store(ints_ptr + 0, a.to(tl.int64))
    tl.store(ints_ptr + 1, b.to(tl.int64))
    tl.store(ints_ptr + 2, c.to(tl.int64))
    tl.store(ints_ptr + 3, d)
    tl.store(ints_ptr + 4, e.to(tl.int64))
    tl.store(ints_ptr + 5, f.to(tl.int64))
    tl.store(ints_ptr + 6, g.to(tl.int64, bitcast=True))
    tl.store(ints_ptr + 7, flag.to(tl.int64))
    tl.store(floats_ptr + 0, h.to(tl.float64))
    tl.store(floats_ptr + 1, i.to(tl.float64))
    tl.store(floats_ptr + 2, j.to(tl.float64))
    tl.store(floats_ptr + 3, k)


def _read_back(values) -> tuple[list, list]:
    """What _scalars stores for ``values`` (a..k): the integers as int64, the floats as their kind rounds them
    (bf16 truncated, as Triton's launcher packs it)."""
    a, b, c, d, e, f, g, flag, h, i, j, k = values
    ints = [a, b, c, d, e, f, g - 2**64 if g >= 2**63 else g, int(flag)]
    bf16 = torch.tensor(struct.unpack("<h", _bf16_truncated(i))[0], dtype=torch.int16).view(torch.bfloat16)
    floats = [torch.tensor(h, dtype=torch.float16).item(), bf16.item(), struct.unpack("<f", struct.pack("<f", j))[0], k]
    return ints, floats


@pytest.mark.gpu
def test_gpu_every_scalar_kind_reaches_the_kernel_as_the_jit_passes_it():
    ints, floats = torch.zeros(8, dtype=torch.int64, device="cuda"), torch.zeros(4, dtype=torch.float64, device="cuda")
    # (a is not negative here: Triton's launcher parses i8 with "b", an unsigned byte, and refuses -3; ours takes it)
    first = (3, -300, -70001, -(2**40) - 3, 200, 2**32 - 3, 2**63 + 5, True, -2.5, 1 + 2**-8 + 2**-20, 0.1, 0.1)
    compiled = _scalars[(1,)](ints, floats, *first)
    torch.cuda.synchronize()
    assert (ints.tolist(), floats.tolist()) == _read_back(first)  # (the JIT's own launch: the reference)
    prepared = fast_launch.prepare(compiled, (1,), ints.get_device())
    assert prepared is not None, fast_launch.refusal(compiled)
    assert prepared.kinds == ("ptr", "ptr", "i8", "i16", "i32", "i64", "u8", "u32", "u64", "u1", "fp16", "bf16",
                              "fp32", "fp64")
    second = (-128, 32767, 2**31 - 3, 2**62 + 7, 255, 2**31 + 7, 2**64 - 3, False, 65504.0, -3.0e38, -1e-3, 2.0**-1070)
    stream, pi, pf = torch.cuda.current_stream().cuda_stream, ints.data_ptr(), floats.data_ptr()
    ours = fast_launch.module().launch
    ours(prepared, stream, pi, pf, *second)
    torch.cuda.synchronize()
    assert (ints.tolist(), floats.tolist()) == _read_back(second)

    run, function, packed = compiled.run, compiled.function, compiled.packed_metadata
    tri = run.launch
    t_triton = _host_us(lambda: tri(1, 1, 1, stream, function, 0, 0, None, None, packed, None, None, None, pi, pf,
                                    *first))
    t_ours = _host_us(lambda: ours(prepared, stream, pi, pf, *first))
    print(f"host us a launch of a 14-argument kernel: Triton's CudaLauncher.launch {t_triton:.2f}, "
          f"fast_launch {t_ours:.2f}")


@pytest.mark.gpu
@pytest.mark.parametrize("options", [{"num_ctas": 2}, {"launch_pdl": True}, {"launch_cooperative_grid": True}],
                         ids=["clusters", "pdl", "cooperative"])
def test_gpu_launch_attributes(options):
    n, block = 8192, 1024
    grid = (triton.cdiv(n, block),)
    x, y = torch.randn(n, device="cuda"), torch.empty(n, device="cuda")
    try:
        compiled = _scale_shift[grid](x, y, n, 2.0, 5, BLOCK=block, **options)
    except Exception as e:  # (a Triton that cannot build this option here: nothing of ours to test)
        pytest.skip(f"Triton's JIT could not launch with {options}: {type(e).__name__}: {e}")
    torch.cuda.synchronize()
    prepared = fast_launch.prepare(compiled, grid, x.get_device())
    assert prepared is not None, fast_launch.refusal(compiled)
    assert (prepared.num_ctas, prepared.pdl, prepared.cooperative) == (
        options.get("num_ctas", 1), int(options.get("launch_pdl", False)),
        int(options.get("launch_cooperative_grid", False)))
    x2, y2 = torch.randn(n, device="cuda"), torch.full((n,), float("nan"), device="cuda")
    fast_launch.module().launch(prepared, torch.cuda.current_stream().cuda_stream, x2.data_ptr(), y2.data_ptr(), n,
                                0.5, -3)
    torch.cuda.synchronize()
    torch.testing.assert_close(y2, x2 * 0.5 - 3)


@pytest.mark.gpu
def test_gpu_a_driver_error_is_a_runtime_error_with_its_name():
    n, block = 4096, 1024
    x, y = torch.randn(n, device="cuda"), torch.empty(n, device="cuda")
    compiled = _scale_shift[(4,)](x, y, n, 1.0, 7, BLOCK=block)
    mod = fast_launch.module()
    too_much_shared = mod.make(compiled.function, (4,), 4, 1, 10**7, False, False, ["*fp32", "*fp32", "i32", "fp32",
                                                                                    "i32"], name="scale_shift")
    with pytest.raises(RuntimeError, match=r"cuLaunchKernelEx of kernel 'scale_shift' failed: CUDA_ERROR_\w+"):
        mod.launch(too_much_shared, torch.cuda.current_stream().cuda_stream, x.data_ptr(), y.data_ptr(), n, 1.0, 7)
    torch.cuda.synchronize()  # (the error is the launch's, not sticky: the stream still works)


@triton.jit
def _axpy(x_ptr, y_ptr, n, a, ONE: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * a, mask=offs < n)


class _RecordingModule:
    """The built module, its launches recorded with what the dry run returns (a bound site drops the result)."""

    def __init__(self, m):
        self.m, self.got = m, []

    def __getattr__(self, name):
        return getattr(self.m, name)

    def launch(self, *args):
        self.got.append(self.m.launch(*args))


class CudaLauncher:  # (the class name Direct takes the direct form by)
    launch_cooperative_grid = launch_pdl = False
    global_scratch_size = profile_scratch_size = 0
    global_scratch_align, num_ctas = 1, 1

    def launch(self, *args):
        raise AssertionError("Triton's launcher called where our own applies")


def test_a_bound_site_launches_through_our_launcher_with_its_runtime_arguments(dry, monkeypatch):
    """kernels/launcher.py: a site that keeps its kernel launches through fast_launch where prepare accepts the
    kernel, with the runtime arguments alone in signature order (the constexpr tail and a constexpr-specialised
    argument skipped), tensors as their addresses, on the current stream."""
    from tilefuse.kernels import launcher

    rec = _RecordingModule(dry)
    monkeypatch.setattr(fast_launch, "module", lambda: rec)
    monkeypatch.setattr(triton, "__version__", "3.6.0")
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda index: 70 + index, raising=False)
    site = launcher.SiteLauncher(_axpy, (3,), {"num_warps": 4}, {"ONE": 1, "BLOCK": 32})
    # as Triton 3.6 specialises it: n == 1 becomes a constexpr of the signature, the tail too
    compiled = _compiled({"x_ptr": "*fp32", "y_ptr": "*fp32", "n": "constexpr", "a": "fp32", "ONE": "constexpr",
                          "BLOCK": "constexpr"})
    compiled.run, compiled.packed_metadata = CudaLauncher(), (4, 1, 0)
    x, y = torch.randn(64), torch.randn(64)
    site._keep(compiled, (x, y, 1, 2.5), 0)
    assert site.direct.own is not None and site.fast is not None, fast_launch.refusal(compiled)
    site(x, y, 1, 2.5)
    (params, config), = rec.got
    assert params == (struct.pack("<Q", x.data_ptr()), struct.pack("<Q", y.data_ptr()), struct.pack("<f", 2.5),
                      bytes(8), bytes(8))
    assert (config["grid"], config["stream"], config["block"]) == ((3, 1, 1), 70, (128, 1, 1))
    assert "_prepared" in site.fast.source and "_function" not in site.fast.source, site.fast.source


def test_a_failed_build_leaves_triton_s_launcher_and_says_why(monkeypatch, tmp_path, capsys):
    """A source that does not compile (a machine without a working C toolchain, say): module() is None, the
    reason is kept and logged at TILEFUSE_DEBUG=1, prepare() refuses with it, and nothing raises."""
    from tilefuse import config

    broken = tmp_path / "fast_launch.c"
    broken.write_text("#include <Python.h>\nthis is not C;\n")
    monkeypatch.setattr(fast_launch, "_SOURCE", broken)
    monkeypatch.setattr(fast_launch, "_built", {})
    with config.override(debug=1):
        assert fast_launch.module() is None
    reason = fast_launch.unavailable_reason()
    assert reason.startswith("fast_launch could not be built"), reason
    assert "through Triton's launcher" in capsys.readouterr().err
    compiled = _compiled({"x": "*fp32"})
    assert fast_launch.prepare(compiled, (1,), 0) is None and fast_launch.refusal(compiled) == reason
