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


pytestmark = pytest.mark.usefixtures("on_the_kernels_device")


def _assert_a_device_assert_stops(call: str):
    """On a GPU: ``call`` (a statement using ``indexing`` and ``torch``, tensors made on the GPU) run in a child
    process, as a device assert ends the process's GPU context, must fail there with the kernel's assert."""
    code = ("import torch; from tilefuse.kernels import indexing; torch.set_default_device(torch.device('cuda')); "
            f"{call}; torch.cuda.synchronize(); print('no error')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    said = r.stdout + r.stderr
    assert r.returncode != 0 and "no error" not in said, said[-2000:]
    assert "index out of range" in said or "device-side assert" in said, said[-2000:]


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
    if not device.interpreting():
        _assert_a_device_assert_stops(f"indexing.index_put_(torch.randn(4, 6, 3), [None, torch.tensor([2, {bad}])], "
                                      f"torch.randn(4, 2, 3))")
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


# --------------------------------------------------------------- two writes with one index in one launch
def _pair_reference(dst_a, dst_b, indices, values_a, values_b):
    """The two writes one after the other, by ATen, in float64 (what index_put_pair_ must leave)."""
    a, b = dst_a.double(), dst_b.double()
    torch.ops.aten.index_put_.default(a, indices, values_a.double())
    torch.ops.aten.index_put_.default(b, indices, values_b.double())
    return a, b


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32], ids=str)
@pytest.mark.parametrize("second", ["a view", "contiguous"])
def test_a_pair_is_one_launch_and_both_writes_match_aten(dtype, index_dtype, second):
    """A KV cache's key and value rows: (1, H, 1, D) values viewed out of one projection's row (or, the second,
    a contiguous tensor, as Llama's rotary embedding makes its key rows: strides that differ only at size-1
    dimensions), into two transposed caches (1, H, L, D) at one position given as a negative index; every
    element of both caches compared with the two writes done one after the other."""
    qkv = torch.randn(1, 3 * 5 * 12, dtype=dtype)
    values_a = qkv.as_strided((1, 5, 1, 12), (180, 12, 180, 1), 60)
    values_b = qkv.as_strided((1, 5, 1, 12), (180, 12, 180, 1), 120)
    if second == "contiguous":
        values_b = torch.empty(values_b.shape, dtype=dtype).copy_(values_b)
        assert values_b.stride() != values_a.stride()
    dst_a = torch.randn(1, 19, 5, 12, dtype=dtype).transpose(1, 2)
    dst_b = torch.randn(1, 19, 5, 12, dtype=dtype).transpose(1, 2)
    indices = [None, None, torch.tensor([-3], dtype=index_dtype)]
    want = _pair_reference(dst_a, dst_b, indices, values_a, values_b)
    _forget()
    indexing._pair_plans.clear()
    got = torch.ops.tilefuse.index_put_pair_.default(dst_a, dst_b, indices, values_a, values_b)
    assert got[0] is dst_a and got[1] is dst_b
    assert [k[0] for k in indexing._sites] == [(1, 2)], "not one launch of the paired kernel"
    torch.testing.assert_close(dst_a.double(), want[0], rtol=0, atol=0)
    torch.testing.assert_close(dst_b.double(), want[1], rtol=0, atol=0)


@pytest.mark.parametrize("case", ["other shapes", "other strides", "other dtypes", "one destination",
                                  "values from the other destination", "another form"])
def test_a_pair_that_one_launch_cannot_write_is_two_writes_in_order(case):
    """Where the two calls differ in layout or dtype, share storage (the second's values read the first's
    destination, or both write one tensor), or have a form the kernel does not take: the two calls one after the
    other, with the result of doing so."""
    dst_a, dst_b, idx = torch.randn(4, 9, 3), torch.randn(4, 9, 3), torch.tensor([7, 2])
    values_a, values_b = torch.randn(4, 2, 3), torch.randn(4, 2, 3)
    indices = [None, idx]
    if case == "other shapes":
        dst_b, values_b = torch.randn(4, 11, 3), torch.randn(4, 2, 3)
    elif case == "other strides":
        values_b = torch.randn(3, 2, 4).permute(2, 1, 0)
    elif case == "other dtypes":
        dst_b, values_b = dst_b.half(), values_b.half()
    elif case == "one destination":
        dst_b = dst_a
    elif case == "values from the other destination":
        values_b = dst_a[:, 6:8]  # rows 6 and 7 of the first cache: row 7 is written by the first call
    else:  # two index tensors: not the kernel's form
        dst_a, dst_b = torch.randn(9, 4, 3), torch.randn(9, 4, 3)
        indices = [idx, torch.tensor([0, 1])]
        values_a, values_b = torch.randn(2, 3), torch.randn(2, 3)
    ref_a = dst_a.clone()
    ref_b = ref_a if dst_b is dst_a else dst_b.clone()
    ref_values_b = ref_a[:, 6:8] if case == "values from the other destination" else values_b
    torch.ops.aten.index_put_.default(ref_a, indices, values_a)
    torch.ops.aten.index_put_.default(ref_b, indices, ref_values_b)
    _forget()
    indexing._pair_plans.clear()
    indexing.index_put_pair_(dst_a, dst_b, indices, values_a, values_b)
    torch.testing.assert_close(dst_a, ref_a, rtol=0, atol=0)
    torch.testing.assert_close(dst_b, ref_b, rtol=0, atol=0)
    # (the interpreter runs the paired launch's two rows in order, so only this tells the two calls apart)
    assert not [k for k in indexing._sites if len(k[0]) == 2], "written by the paired launch"


def test_a_pair_with_an_index_out_of_range_is_an_error():
    if not device.interpreting():
        _assert_a_device_assert_stops("indexing.index_put_pair_(torch.randn(4, 6, 3), torch.randn(4, 6, 3), "
                                      "[None, torch.tensor([2, 6])], torch.randn(4, 2, 3), torch.randn(4, 2, 3))")
        return
    dst_a, dst_b = torch.randn(4, 6, 3), torch.randn(4, 6, 3)
    before = dst_a.clone(), dst_b.clone()
    with pytest.raises(IndexError, match="index -7 is out of bounds for dimension 1 with size 6"):
        indexing.index_put_pair_(dst_a, dst_b, [None, torch.tensor([2, -7])], torch.randn(4, 2, 3),
                                 torch.randn(4, 2, 3))
    assert torch.equal(dst_a, before[0]) and torch.equal(dst_b, before[1])  # checked before the launch


# ------------------------------------------------------------------------ index_put with accumulate=True
def _accumulated(base, index, values):
    """``index_put(base, [index], values, accumulate=True)`` in float64 (the reference)."""
    return torch.index_put(base.double(), [index], values.double(), accumulate=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32], ids=str)
def test_accumulate_sums_repeated_rows_like_a_float64_reference(dtype, index_dtype):
    """An embedding's backward: a (2, 7) index into 13 rows, one row used 5 times, negative indices, a
    non-contiguous destination of 3-D rows; every row compared, the unused ones too (they must be the base's)."""
    base = torch.randn(13, 4, 10, dtype=dtype)[:, :, ::2]  # (13, 4, 5), not contiguous
    index = torch.tensor([[2, 12, 2, -1, 5, 2, 0], [2, -11, 7, 3, 2, 12, 6]], dtype=index_dtype)
    values = torch.randn(2, 7, 4, 5, dtype=dtype)
    indexing._sites.clear()
    got = indexing.index_put(base, [index], values, accumulate=True)
    assert any(k[0] == "add_rows" for k in indexing._sites), "the call did not run on the module's kernel"
    assert got.shape == base.shape and got.dtype == dtype and got.data_ptr() != base.data_ptr()
    want = _accumulated(base, index, values)
    tol = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}[dtype]
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol * 4)


def test_accumulate_is_deterministic_and_sums_in_the_order_values_come():
    """No atomics: the same call gives the same bits every time, and a row's sum is in the values' order (fp32
    sums of numbers of very different size show the order)."""
    base = torch.zeros(3, 1)
    index = torch.tensor([1, 1, 1, 0])
    values = torch.tensor([[1.0], [1e8], [-1e8], [5.0]])
    got = indexing.index_put(base, [index], values, accumulate=True)
    # (1 + 1e8) - 1e8 in fp32 is 0 (the 1 is lost, as in eager's sequential adds); the other order would give 1
    assert got[1, 0].item() == 0.0 and got[0, 0].item() == 5.0
    index = torch.randint(0, 7, (200,))
    values = torch.randn(200, 33)
    runs = [indexing.index_put(torch.randn(7, 33).zero_(), [index], values, accumulate=True) for _ in range(3)]
    assert all(torch.equal(r, runs[0]) for r in runs)


def test_accumulate_broadcast_values_an_empty_index_and_forms_left_to_aten():
    base = torch.randn(6, 9)
    index = torch.tensor([4, 1, 4])
    row = torch.randn(9)  # one row for every index
    torch.testing.assert_close(indexing.index_put(base, [index], row, accumulate=True).double(),
                               _accumulated(base, index, row.expand(3, 9)), rtol=1e-6, atol=1e-6)
    empty = indexing.index_put(base, [torch.tensor([], dtype=torch.int64)], torch.randn(0, 9), accumulate=True)
    assert torch.equal(empty, base) and empty.data_ptr() != base.data_ptr()
    cube = torch.randn(6, 9, 4)
    for name, args in {"no accumulate": ([index], torch.randn(3, 9), False),
                       "float64": ([index], torch.randn(3, 9, dtype=torch.float64), True),
                       "indices at dims 0 and 2": ([index, None, torch.tensor([0, 3, 1])], torch.randn(3, 9), True),
                       "indices that do not broadcast": ([index, torch.tensor([0, 3])], torch.randn(3, 4), True),
                       }.items():
        dst = base.double() if name == "float64" else cube if name.startswith("indices") else base
        if name == "indices that do not broadcast":
            with pytest.raises((IndexError, RuntimeError)):
                indexing.index_put(dst, *args)
            continue
        assert indexing.accumulate_form(dst.shape, dst.dtype, [None if i is None else indexing._meta(i)
                                                              for i in args[0]], args[1].shape, args[1].dtype) \
            is not None or name == "no accumulate", name
        indexing._sites.clear()
        got = indexing.index_put(dst, *args)
        torch.testing.assert_close(got, torch.ops.aten.index_put.default(dst, *args), rtol=0, atol=0)
        assert not indexing._sites, f"{name}: not ATen's"


@pytest.mark.parametrize("bad", [13, -14])
def test_accumulate_an_index_out_of_range_is_an_error(bad):
    if not device.interpreting():
        _assert_a_device_assert_stops(f"indexing.index_put(torch.zeros(13, 4), [torch.tensor([2, {bad}])], "
                                      f"torch.randn(2, 4), True)")
        return
    with pytest.raises(IndexError, match=f"index {bad} is out of bounds for dimension 0 with size 13"):
        indexing.index_put(torch.zeros(13, 4), [torch.tensor([2, bad])], torch.randn(2, 4), accumulate=True)


@pytest.mark.parametrize("shapes", [((4,), (4,)), ((3, 1), (5,)), ((), (2, 3))], ids=["pairs", "broadcast", "0-d"])
def test_accumulate_with_an_index_for_each_leading_dimension(shapes):
    """``logits[arange(B), lengths]``'s backward: index tensors for dimensions 0 and 1, broadcast together, negative
    and repeated pairs, into rows of the two leading dimensions flattened; against a float64 reference."""
    base = torch.randn(5, 6, 7)
    i0 = torch.randint(-5, 5, shapes[0]) if shapes[0] else torch.tensor(-1)
    i1 = torch.randint(-6, 6, shapes[1])
    if i1.numel() > 1:
        i1.view(-1)[-1] = i1.view(-1)[0]
    values = torch.randn(torch.broadcast_shapes(i0.shape, i1.shape) + (7,))
    indexing._sites.clear()
    got = indexing.index_put(base, [i0, i1], values, accumulate=True)
    assert any(k[0] == "add_rows" for k in indexing._sites), "the call did not run on the module's kernel"
    torch.testing.assert_close(got.double(), _accumulated_many(base, [i0, i1], values), rtol=1e-5, atol=1e-5)


def _accumulated_many(base, indices, values):
    return torch.ops.aten.index_put.default(base.double(), indices, values.double(), True)


@pytest.mark.parametrize("dim", [0, 1])
def test_accumulate_an_index_out_of_range_in_either_leading_dimension_is_an_error(dim):
    """Flattened, (0, 6) into (5, 6) would be the in-range row 6 (1, 0): each index is checked against its own
    dimension."""
    pair = [torch.tensor([1, 0]), torch.tensor([2, 6])] if dim == 1 else [torch.tensor([1, 5]), torch.tensor([2, 0])]
    bad = 6 if dim == 1 else 5
    if not device.interpreting():
        _assert_a_device_assert_stops(f"indexing.index_put(torch.zeros(5, 6, 2), [torch.tensor({pair[0].tolist()}), "
                                      f"torch.tensor({pair[1].tolist()})], torch.randn(2, 2), True)")
        return
    with pytest.raises(IndexError, match=f"index {bad} is out of bounds for dimension {dim}"):
        indexing.index_put(torch.zeros(5, 6, 2), pair, torch.randn(2, 2), accumulate=True)


@pytest.mark.parametrize("where", ["dim 1", "dims 1 and 2", "the last two of an image"])
def test_accumulate_with_index_tensors_after_full_slices(where):
    """Index tensors for adjacent dimensions after full slices (a nearest upsampling's backward indexes the last
    two of an image): the indexed dimensions are moved first and back; against a float64 reference, a result
    laid out as ATen's."""
    if where == "dim 1":
        base, indices = torch.randn(3, 8, 5), [None, torch.tensor([7, 0, -1, 7])]
    elif where == "dims 1 and 2":
        base, indices = torch.randn(3, 8, 5, 2), [None, torch.tensor([[1], [7]]), torch.tensor([4, 0, -5])]
    else:
        h = torch.tensor([0, 0, 1, 1, 2, 2]).view(6, 1)  # 3 rows and 2 columns each read twice (2x nearest)
        w = torch.tensor([0, 0, 1, 1])
        base, indices = torch.zeros(2, 3, 3, 2), [None, None, h, w]
    shape = torch.broadcast_shapes(*(i.shape for i in indices if i is not None))
    d = next(j for j, i in enumerate(indices) if i is not None)
    m = sum(i is not None for i in indices)
    values = torch.randn(tuple(base.shape[:d]) + tuple(shape) + tuple(base.shape[d + m:]))
    indexing._sites.clear()
    got = indexing.index_put(base, indices, values, accumulate=True)
    assert any(k[0] == "add_rows" for k in indexing._sites), "the call did not run on the module's kernel"
    want = torch.ops.aten.index_put.default(base, indices, values, True)
    assert got.shape == want.shape and got.stride() == want.stride()
    torch.testing.assert_close(got.double(), _accumulated_many(base, indices, values), rtol=1e-5, atol=1e-5)
