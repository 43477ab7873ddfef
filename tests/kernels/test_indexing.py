"""tilefuse.kernels.indexing: index_put_ along one dimension, against ATen's index_put_ on a copy (the whole
destination compared, so a stray write anywhere shows), on the device the kernels run on (Triton's interpreter on
the CPU; a GPU where there is one): each index dimension of ranks 1-4, int64 and int32 and negative indices,
broadcast and strided values, a strided destination; the forms it leaves to ATen; an index out of range is an
error; a repeat call takes the kept plan."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from tilefuse import device
from tilefuse.kernels import indexing


@pytest.fixture(autouse=True)
def _on_the_kernels_device():
    """Every tensor these tests make is on the device the kernels run on. (A context, not set_default_device
    and back: setting it back to the CPU leaves a device mode on every later torch call of the process.)"""
    with torch.device(device.torch_device()):
        yield


def _forget():
    indexing._sites.clear()
    indexing._plans.clear()


def _check(dst, indices, values):
    want = torch.ops.aten.index_put_.default(dst.clone(), indices, values)
    _forget()
    got = indexing.index_put_(dst, indices, values)
    assert got is dst and indexing._sites, "the call did not run on the module's kernel"
    torch.testing.assert_close(dst, want, rtol=0, atol=0)


@pytest.mark.parametrize("shape", [(13,), (5, 7), (3, 5, 9), (2, 3, 11, 5)], ids=str)
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32], ids=str)
def test_each_dimension_of_each_rank_matches_aten(shape, index_dtype):
    for k in range(len(shape)):
        dst = torch.randn(shape)
        idx = torch.tensor([shape[k] - 1, 0, -2][: max(1, min(3, shape[k] - 1))], dtype=index_dtype)
        target = list(shape)
        target[k] = idx.numel()
        indices = [None] * k + [idx]
        assert indexing.supported(dst, indices, torch.empty(target)) is None
        _check(dst, indices, torch.randn(target))


def test_a_kv_cache_row_from_a_strided_view_into_a_strided_cache():
    """GPT-2's decode: (1, H, 1, D) values viewed out of the QKV projection's row, into (1, H, L, D) at one
    position; the cache itself a transposed buffer."""
    qkv = torch.randn(1, 3 * 4 * 16)
    values = qkv.as_strided((1, 4, 1, 16), (192, 16, 192, 1), 64)
    cache = torch.randn(1, 23, 4, 16).transpose(1, 2)  # (1, 4, 23, 16), not contiguous
    _check(cache, [None, None, torch.tensor([17])], values)


def test_broadcast_values_and_a_half_dtype():
    dst = torch.randn(6, 9, dtype=torch.float16)
    _check(dst, [None, torch.tensor([8, 1, 4])], torch.randn(9, 1, dtype=torch.float16)[:1].expand(6, 1))
    _check(dst, [torch.tensor([5, 0])], torch.randn(9, dtype=torch.float16))


@pytest.mark.parametrize("case", ["accumulate", "two indices", "2-D index", "bool index", "dtype mismatch",
                                  "expanded destination", "rank 5"])
def test_other_forms_are_left_to_aten_and_still_right(case):
    dst, idx = torch.randn(5, 6), torch.tensor([1, 3])
    kwargs = {}
    if case == "accumulate":
        args, kwargs = ([idx], torch.randn(2, 6)), {"accumulate": True}
    elif case == "two indices":
        args = ([idx, torch.tensor([0, 2])], torch.randn(2))
    elif case == "2-D index":
        args = ([torch.tensor([[1], [3]])], torch.randn(2, 1, 6))
    elif case == "bool index":
        args = ([torch.tensor([True, False, True, False, False])], torch.randn(2, 6))
    elif case == "dtype mismatch":
        args = ([idx], torch.randn(2, 6, dtype=torch.float64))
    elif case == "expanded destination":
        dst = torch.randn(1, 6).expand(5, 6)
        args = ([idx], torch.randn(6))
    else:
        dst = torch.randn(2, 1, 3, 1, 4)
        args = ([torch.tensor([1])], torch.randn(1, 1, 3, 1, 4))
    assert indexing.supported(dst, args[0], args[1], kwargs.get("accumulate", False)) is not None
    if case == "expanded destination":  # whatever ATen does with it (its op writes the shared row), ours does
        twin = dst._base.clone().expand(5, 6)
        torch.ops.aten.index_put_.default(twin, *args, **kwargs)
        indexing.index_put_(dst, *args, **kwargs)
        torch.testing.assert_close(dst._base, twin._base, rtol=0, atol=0)
        return
    if case == "dtype mismatch":
        with pytest.raises(RuntimeError):
            indexing.index_put_(dst, *args, **kwargs)
        return
    want = torch.ops.aten.index_put_.default(dst.clone(), *args, **kwargs)
    _forget()
    indexing.index_put_(dst, *args, **kwargs)
    torch.testing.assert_close(dst, want, rtol=0, atol=0)
    assert not indexing._sites  # (ATen's kernel ran)


@pytest.mark.parametrize("bad", [6, -7])
def test_an_index_out_of_range_is_an_error(bad):
    if not device.interpreting():  # a device assert ends the process's GPU context: the call runs in a child
        code = ("import torch; from tilefuse.kernels import indexing; "
                "torch.set_default_device(torch.device('cuda'));"
                "dst = torch.randn(4, 6, 3); "
                f"indexing.index_put_(dst, [None, torch.tensor([2, {bad}])], torch.randn(4, 2, 3)); "
                "torch.cuda.synchronize(); print('no error')")
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
        said = r.stdout + r.stderr
        assert r.returncode != 0 and "no error" not in said, said[-2000:]
        assert "index out of range" in said or "device-side assert" in said, said[-2000:]
        return
    dst = torch.randn(4, 6, 3)
    before = dst.clone()
    with pytest.raises(IndexError, match=f"index {bad} is out of bounds for dimension 1 with size 6"):
        indexing.index_put_(dst, [None, torch.tensor([2, bad])], torch.randn(4, 2, 3))
    assert torch.equal(dst, before)  # checked before the launch: nothing written


def test_a_repeat_call_takes_the_kept_plan_and_a_new_form_makes_its_own():
    """The plan is kept by the call's metadata: a repeat call with new data builds nothing and writes the new
    rows; a call whose strides differ (the same shapes) gets a plan of its own, not the first one's."""
    _forget()
    dst, idx = torch.randn(3, 8, 5), torch.tensor([6, 1])
    indexing.index_put_(dst, [None, idx], torch.randn(3, 2, 5))
    assert len(indexing._plans) == 1
    calls = []
    real = indexing._plan
    indexing._plan = lambda *a: calls.append(a) or real(*a)
    try:
        vals = torch.randn(3, 2, 5)
        want = dst.clone()
        want[:, [2, 7]] = vals
        indexing.index_put_(dst, [None, torch.tensor([2, 7])], vals)
        torch.testing.assert_close(dst, want, rtol=0, atol=0)
        assert not calls, "a repeat call built its plan again"
        wide = torch.randn(3, 8, 10)[:, :, ::2]  # same shape, other strides
        want = wide.clone()
        want[:, [0, 5]] = vals
        indexing.index_put_(wide, [None, torch.tensor([0, 5])], vals)
        torch.testing.assert_close(wide, want, rtol=0, atol=0)
        assert len(calls) == 1 and len(indexing._plans) == 2
        bcast = vals[:, :1].expand(3, 2, 5)  # broadcast values: their own plan (zero strides)
        want = dst.clone()
        want[:, [3, 4]] = bcast
        indexing.index_put_(dst, [None, torch.tensor([3, 4])], bcast)
        torch.testing.assert_close(dst, want, rtol=0, atol=0)
        assert len(calls) == 2
    finally:
        indexing._plan = real
