"""``index_put_`` along one dimension: ``dst[..., idx, ...] = values`` as one Triton kernel.

The form a KV cache's update takes in a compiled graph (``cache[:, :, pos] = kv``, written in place by
``compiler/reinplace.py``): one 1-D integer index tensor at one dimension, ``None`` (a full slice) at the others,
no accumulation. ATen's ``index_put_`` does it with its generic indexing kernel and ~10-20 µs of host time a call
through the dispatcher; here it is one launch through a kept launch site (:class:`..launcher.SiteLauncher`) and
one read of ``values`` and one write of the rows it names, nothing else of ``dst``.

:func:`supported` says whether a call has that form (from shapes and dtypes alone: the compiler decides at
lowering time); :func:`index_put_` runs it, or ATen's ``index_put_`` for any other form. An index out of range
(after Python's negative wrap) is an error, as in eager, never a write elsewhere: on a GPU a device assert (the
kernel is launched with Triton's debug option), on the CPU (Triton's interpreter, whose asserts abort the process
or are dropped) an ``IndexError`` checked on the host before the launch, which costs no synchronisation there.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import device, targets
from .launcher import SiteLauncher, kept_site

MAX_RANK = 4  # the kernel's index space; a higher rank takes ATen's kernel
BLOCK = 1024
SITE_CACHE_MAX = 256  # kept launch sites (one a grid, dtypes and index dimension); then start again
INDEX_DTYPES = (torch.int64, torch.int32)
_ASSERTS = {"debug": True, "sanitize_overflow": False}  # device_assert on (GPU), as the compiler's bounds checks


@triton.jit
def _index_put_dim_kernel(dst, idx, val, dst_b, val_b, n, size_k, s1, s2, s3, d0, d1, d2, d3, v0, v1, v2, v3,
                          i_stride, K: tl.constexpr, PAIR: tl.constexpr, BLOCK: tl.constexpr):
    if PAIR:  # the second write of a pair (same index, layouts and dtypes) on grid row 1
        if tl.program_id(1) == 1:
            dst = dst_b
            val = val_b
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    c3 = offs % s3
    r = offs // s3
    c2 = r % s2
    r = r // s2
    c1 = r % s1
    c0 = r // s1
    if K == 0:
        ck = c0
        dk = d0
    elif K == 1:
        ck = c1
        dk = d1
    elif K == 2:
        ck = c2
        dk = d2
    else:
        ck = c3
        dk = d3
    j = tl.load(idx + ck * i_stride, mask=m, other=0).to(tl.int64)
    j = tl.where(j < 0, j + size_k, j)
    tl.device_assert(((j >= 0) & (j < size_k)) | (offs >= n), "tilefuse: index_put_: index out of range")
    at = c0 * d0 + c1 * d1 + c2 * d2 + c3 * d3 + (j - ck) * dk
    v = tl.load(val + c0 * v0 + c1 * v1 + c2 * v2 + c3 * v3, mask=m)
    tl.store(dst + at, v.to(dst.dtype.element_ty), mask=m)


def _form(dst_shape, dst_stride, dst_dtype, indices, values_shape, values_dtype, accumulate) -> str | None:
    """Why this call is not the kernel's form (None: it is). Shapes, strides and dtypes only."""
    if accumulate:
        return "accumulate=True"
    rank = len(dst_shape)
    if not 1 <= rank <= MAX_RANK:
        return f"a rank-{rank} destination (the kernel takes 1 to {MAX_RANK})"
    if not isinstance(indices, (list, tuple)) or len(indices) > rank:
        return "indices other than one per leading dimension"
    given = [(k, i) for k, i in enumerate(indices) if i is not None]
    if len(given) != 1:
        return f"{len(given)} index tensors (the kernel takes one)"
    k, index = given[0]
    if index[2] not in INDEX_DTYPES or len(index[0]) != 1:
        return f"an index of dtype {index[2]} and {len(index[0])} dimensions (the kernel takes a 1-D int64/int32)"
    if values_dtype != dst_dtype:
        return f"values of dtype {values_dtype} into {dst_dtype}"
    target = list(dst_shape)
    target[k] = index[0][0]
    if not _fits(values_shape, target):
        return f"values of shape {tuple(values_shape)} for an indexed shape {tuple(target)}"
    ordered = sorted((st, sz) for st, sz in zip(dst_stride, dst_shape) if sz > 1)
    reach = 1
    for st, sz in ordered:  # non-overlapping: each dimension's stride at least the span of the smaller ones
        if st < reach:
            return "a destination whose elements overlap in memory"
        reach = st * sz
    return None


def _fits(values_shape, target) -> bool:
    """Whether values of ``values_shape`` broadcast to ``target`` (and no larger), as torch broadcasts."""
    values_shape, target = tuple(values_shape), tuple(target)
    return len(values_shape) <= len(target) and all(v in (1, t) for v, t in zip(values_shape[::-1], target[::-1]))


def _meta(t: torch.Tensor) -> tuple:
    return tuple(t.shape), tuple(t.stride()), t.dtype


def supported(dst: torch.Tensor, indices, values: torch.Tensor, accumulate: bool = False) -> str | None:
    """Why ``index_put_(dst, indices, values, accumulate)`` does not run on this module's kernel (None: it does).
    Tensors may be fake (shapes, strides and dtypes are read, never data)."""
    if not isinstance(dst, torch.Tensor) or not isinstance(values, torch.Tensor):
        return "non-tensor arguments"
    metas = [None if i is None else (_meta(i) if isinstance(i, torch.Tensor) else ((), (), None)) for i in indices] \
        if isinstance(indices, (list, tuple)) else indices
    return _form(tuple(dst.shape), tuple(dst.stride()), dst.dtype, metas, tuple(values.shape), values.dtype,
                 accumulate)


_sites: dict[tuple, SiteLauncher] = {}
_plans: dict[tuple, object] = {}  # a call's metadata -> its launch (a tuple) or why it is ATen's (a str)
PLAN_CACHE_MAX = 1024


def _key(dst: torch.Tensor, indices, values: torch.Tensor, accumulate) -> tuple | None:
    """What a call's plan depends on (shapes, strides, dtypes, devices and where the index is), or None where an
    index is neither a tensor nor None (that call is ATen's). ~2 us of host time: the form check and the
    broadcast it needs cost ~80 us a call through ``torch.broadcast_shapes``, 24 calls a GPT-2 decode step."""
    if not isinstance(indices, (list, tuple)):
        return None
    metas = []
    for i in indices:
        if i is None:
            metas.append(None)
        elif isinstance(i, torch.Tensor):
            metas.append((i.shape, i.stride(), i.dtype, i.device))
        else:
            return None
    return (dst.shape, dst.stride(), dst.dtype, dst.device, values.shape, values.stride(), values.dtype,
            values.device, tuple(metas), bool(accumulate))


def _plan(dst: torch.Tensor, indices, values: torch.Tensor, accumulate, pair: bool = False) -> object:
    """The launch of a call of the kernel's form: (site, k, n, the kernel's integer arguments after ``n``), or
    None for an empty write; a str (why) for a call that is ATen's. ``pair``: the site writes two such calls at
    once (:func:`index_put_pair_`), the second on the grid's row 1."""
    why = supported(dst, indices, values, accumulate)
    if why is None and (any(isinstance(i, torch.Tensor) and i.device != dst.device for i in indices) or
                        values.device != dst.device):
        why = "tensors on more than one device"
    if why is None and (dst.device.type == "cpu") != device.interpreting():
        # (CPU tensors run Triton kernels only on its interpreter; a GPU tensor only on a GPU build)
        why = f"a {dst.device.type} tensor without a Triton build for it"
    if why is not None:
        return why
    k = next(p for p, i in enumerate(indices) if i is not None)
    index = indices[k]
    pad = MAX_RANK - dst.dim()
    shape = [1] * pad + list(dst.shape)
    shape[pad + k] = index.shape[0]
    n = 1
    for s in shape:
        n *= s
    if n == 0:
        return None
    d = [0] * pad + list(dst.stride())
    v = [0] * pad + list(values.expand(shape[pad:]).stride())
    on_gpu = dst.device.type != "cpu"
    grid = (triton.cdiv(n, BLOCK), 2) if pair else (triton.cdiv(n, BLOCK),)
    site = kept_site(_sites, SITE_CACHE_MAX, (grid, dst.dtype, index.dtype, pad + k, dst.get_device()),
                     _index_put_dim_kernel, grid, dict(_ASSERTS if on_gpu else {}, num_warps=4),
                     {"K": pad + k, "PAIR": pair, "BLOCK": BLOCK})
    return site, k, (n, dst.shape[k], shape[1], shape[2], shape[3], *d, *v, index.stride(0))


def index_put_(dst: torch.Tensor, indices, values: torch.Tensor, accumulate: bool = False) -> torch.Tensor:
    """``dst.index_put_(indices, values, accumulate)``: this module's kernel where the call has its form
    (:func:`supported`) and its tensors are on one device, else ATen's. Returns ``dst``. A call's plan is kept
    by its metadata (:func:`_key`), so a repeat call only checks the index's range on the CPU and launches."""
    key = _key(dst, indices, values, accumulate)
    plan = _plans.get(key, _plans) if key is not None else "an index that is not a tensor"
    if plan is _plans:
        plan = _plan(dst, indices, values, accumulate)
        if len(_plans) >= PLAN_CACHE_MAX:
            _plans.clear()
        _plans[key] = plan
    if plan is None:
        return dst
    if plan.__class__ is str:
        return torch.ops.aten.index_put_.default(dst, indices, values, accumulate)
    site, k, ints = plan
    index = indices[k]
    if dst.device.type == "cpu":  # (a GPU checks in the kernel: a device assert)
        _check_range(index, k, ints[1])
    site(dst, index, values, dst, values, *ints)
    return dst


def _check_range(index: torch.Tensor, k: int, size: int) -> None:
    lo, hi = int(index.min()), int(index.max())
    if lo < -size or hi >= size:
        raise IndexError(f"index_put_: index {lo if lo < -size else hi} is out of bounds for dimension {k} "
                         f"with size {size}")


_pair_plans: dict[tuple, object] = {}  # as _plans, for index_put_pair_'s one launch


def _addressing(key: tuple) -> tuple:
    """A call's :func:`_key` with the strides of size-1 dimensions (never multiplied by anything but 0 in the
    kernel) set to 0: two calls with equal ones address their elements alike. (Llama's decode: the key rows are
    made contiguous by the rotary embedding, the value rows are a view of the projection; their strides differ
    only at the one-position dimension.)"""
    def flat(shape, stride):
        return tuple(0 if size == 1 else st for size, st in zip(shape, stride))

    dst_shape, dst_stride, *mid, v_shape, v_stride, v_dtype, v_device, metas, acc = key
    return (dst_shape, flat(dst_shape, dst_stride), *mid, v_shape, flat(v_shape, v_stride), v_dtype, v_device,
            metas, acc)


def _one_launch(key: tuple | None, other: tuple | None) -> bool:
    """Whether two calls' keys (:func:`_key`) let one plan write both: equal, or equal but for the strides of
    size-1 dimensions (:func:`_addressing`)."""
    return key is not None and other is not None and (key == other or _addressing(key) == _addressing(other))


def pairable(dst_a: torch.Tensor, dst_b: torch.Tensor, indices, values_a: torch.Tensor,
             values_b: torch.Tensor) -> bool:
    """Whether :func:`index_put_pair_` writes the two calls in one launch, as far as their metadata tells (tensors
    may be fake): both of the kernel's form, with one plan. (At the call it also checks that no tensor of one
    shares storage with the other's destination.)"""
    return supported(dst_a, indices, values_a) is None and \
        _one_launch(_key(dst_a, indices, values_a, False), _key(dst_b, indices, values_b, False))


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def index_put_pair_(dst_a: torch.Tensor, dst_b: torch.Tensor, indices, values_a: torch.Tensor,
                    values_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``dst_a.index_put_(indices, values_a)`` then ``dst_b.index_put_(indices, values_b)``, in one launch where
    both calls have the kernel's form (:func:`supported`) with the same shapes, dtypes and devices and the same
    strides but at size-1 dimensions (:func:`pairable`), and no tensor of one shares storage with the other's
    destination (the two writes run at once, so neither may see
    the other's); otherwise the two calls one after the other. A KV cache's key and value rows at one position:
    one launch a layer where there were two. Returns ``(dst_a, dst_b)``."""
    key = _key(dst_a, indices, values_a, False)
    if not _one_launch(key, _key(dst_b, indices, values_b, False)):
        return index_put_(dst_a, indices, values_a), index_put_(dst_b, indices, values_b)
    a, b = _storage(dst_a), _storage(dst_b)
    if a == b or _storage(values_a) == b or _storage(values_b) == a or \
            any(i is not None and _storage(i) in (a, b) for i in indices):
        return index_put_(dst_a, indices, values_a), index_put_(dst_b, indices, values_b)
    plan = _pair_plans.get(key, _pair_plans)
    if plan is _pair_plans:
        plan = _plan(dst_a, indices, values_a, False, pair=True)
        if len(_pair_plans) >= PLAN_CACHE_MAX:
            _pair_plans.clear()
        _pair_plans[key] = plan
    if plan is None:
        return dst_a, dst_b
    if plan.__class__ is str:
        return index_put_(dst_a, indices, values_a), index_put_(dst_b, indices, values_b)
    site, k, ints = plan
    index = indices[k]
    if dst_a.device.type == "cpu":
        _check_range(index, k, ints[1])
    site(dst_a, index, values_a, dst_b, values_b, *ints)
    return dst_a, dst_b


# ------------------------------------------------------------------------ index_put with accumulate=True
ACCUMULATE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
ADD_BLOCK = 1024  # columns a program (GPT-2's 768-wide embedding rows: one block)


@triton.jit
def _index_add_rows_kernel(out, keys, order, val, n, rows, inner, v_row, v_col, BLOCK: tl.constexpr):
    """One program a position of the sorted row indices and a block of columns. The first position of each run of
    equal rows sums the run's value rows in their original order (the sort is stable) in fp32 and adds the sum to
    its row of ``out``; every other position has nothing to do. No atomics: the same inputs give the same bits."""
    i = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    cm = cols < inner
    row = tl.load(keys + i)
    prev = tl.load(keys + i - 1, mask=i > 0, other=-1)
    if (i == 0) | (prev != row):
        tl.device_assert((row >= 0) & (row < rows), "tilefuse: index_put: index out of range")
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        j = i
        r = row
        while (r == row) & (j < n):
            src = tl.load(order + j)
            acc += tl.load(val + src * v_row + cols * v_col, mask=cm, other=0.0).to(tl.float32)
            j += 1
            r = tl.load(keys + j, mask=j < n, other=0)
        at = out + row * inner + cols
        tl.store(at, (tl.load(at, mask=cm, other=0.0).to(tl.float32) + acc).to(out.dtype.element_ty), mask=cm)


def _broadcast(shapes) -> tuple | None:
    """The shape ``shapes`` broadcast to (right-aligned, as torch does), or None where they do not."""
    rank = max((len(sh) for sh in shapes), default=0)
    out = []
    for j in range(rank):
        sizes = {sh[len(sh) - rank + j] for sh in shapes if len(sh) - rank + j >= 0} - {1}
        if len(sizes) > 1:
            return None
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def _run_of(indices) -> tuple[int, int] | None:
    """(first, count) of the index tensors where they are one run of adjacent dimensions, else None."""
    present = [j for j, i in enumerate(indices) if i is not None]
    if not present or present != list(range(present[0], present[-1] + 1)):
        return None
    return present[0], len(present)


def accumulate_form(base_shape, base_dtype, indices, values_shape, values_dtype) -> str | None:
    """Why ``index_put(base, indices, values, accumulate=True)`` is not the form of :func:`index_put`'s kernel
    (None: it is): integer index tensors for one run of adjacent dimensions d..d+m-1 (one at dimension 0 for an
    embedding's backward; two leading ones for ``logits[arange(B), lengths]``'s; the last two of an image for a
    nearest upsampling's), broadcasting together to a shape ``I``, and values of the destination's float dtype
    broadcasting to ``base.shape[:d] + I + base.shape[d+m:]``. ``indices`` as ``_form`` takes them: (shape,
    strides, dtype) or None each."""
    if not base_shape:
        return "a 0-d destination"
    if base_dtype not in ACCUMULATE_DTYPES:
        return f"a {base_dtype} destination (the kernel sums float16, bfloat16 and float32)"
    if not isinstance(indices, (list, tuple)) or not indices or len(indices) > len(base_shape):
        return "no index tensor, or more than the destination has dimensions"
    run = _run_of(indices)
    if run is None:
        return "index tensors other than for one run of adjacent dimensions"
    d, m = run
    bad = [i[2] for i in indices[d:d + m] if i[2] not in INDEX_DTYPES]
    if bad:
        return f"an index of dtype {bad[0]} (the kernel takes int64/int32)"
    if values_dtype != base_dtype:
        return f"values of dtype {values_dtype} into {base_dtype}"
    shape = _broadcast([tuple(i[0]) for i in indices[d:d + m]])
    if shape is None:
        return f"index tensors of shapes {[tuple(i[0]) for i in indices[d:d + m]]} that do not broadcast together"
    target = tuple(base_shape[:d]) + shape + tuple(base_shape[d + m:])
    if not _fits(values_shape, target):
        return f"values of shape {tuple(values_shape)} for an indexed shape {target}"
    return None


def index_put(base: torch.Tensor, indices, values: torch.Tensor, accumulate: bool = False) -> torch.Tensor:
    """``torch.index_put(base, indices, values, accumulate)``, a new tensor. With ``accumulate=True`` and the form
    :func:`accumulate_form` takes, on one device this module's kernels run on: ``base`` copied, then each row
    named by the indices gets the sum of its value rows, summed in fp32 in the order they come, without atomics
    (deterministic, unlike a scatter with atomic adds). Several index tensors name a row of their dimensions
    flattened; dimensions before the indexed ones are moved after them, and the result moved back. Anything else
    is ATen's ``index_put``. An index out of range is an error: a device assert on a GPU, an ``IndexError``
    checked on the host on the CPU."""
    if not (accumulate and isinstance(base, torch.Tensor) and isinstance(values, torch.Tensor)
            and isinstance(indices, (list, tuple)) and all(i is None or isinstance(i, torch.Tensor) for i in indices)):
        return torch.ops.aten.index_put.default(base, indices, values, accumulate)
    why = accumulate_form(base.shape, base.dtype, [None if i is None else _meta(i) for i in indices], values.shape,
                          values.dtype)
    if why is not None or any(i is not None and i.device != base.device for i in indices) or \
            values.device != base.device or (base.device.type == "cpu") != device.interpreting():
        return torch.ops.aten.index_put.default(base, indices, values, accumulate)
    d, m = _run_of(indices)
    if d:  # the indexed dimensions moved first (and the values' index shape with them), then moved back
        parts = [i for i in indices if i is not None]
        shape = _broadcast([tuple(i.shape) for i in parts])
        target = tuple(base.shape[:d]) + shape + tuple(base.shape[d + m:])
        moved = values.expand(target).movedim(list(range(d, d + len(shape))), list(range(len(shape))))
        out = index_put(base.movedim(list(range(d, d + m)), list(range(m))), parts, moved, True)
        return out.movedim(list(range(m)), list(range(d, d + m))).contiguous()
    lead = tuple(base.shape[:m])
    rows = 1
    for size in lead:
        rows *= size
    inner = base.numel() // rows if rows else 0
    out = base.clone(memory_format=torch.contiguous_format)
    parts = torch.broadcast_tensors(*indices[:m]) if m > 1 else [indices[0]]
    n = parts[0].numel()
    if n == 0 or inner == 0:
        return out
    if base.device.type == "cpu":  # (a GPU checks in the kernel: a device assert)
        for dim, (t, size) in enumerate(zip(parts, lead)):
            lo, hi = int(t.min()), int(t.max())
            if lo < -size or hi >= size:
                raise IndexError(f"index_put: index {lo if lo < -size else hi} is out of bounds for dimension {dim} "
                                 f"with size {size}")
    keys = None
    out_of_range = None
    for t, size in zip(parts, lead):
        t = t.reshape(n).to(torch.int64)
        if m > 1:  # (each index checked against its own dimension: a flattened row would hide it)
            bad = (t < -size) | (t >= size)
            out_of_range = bad if out_of_range is None else out_of_range | bad
        t = torch.where(t < 0, t + size, t)
        keys = t if keys is None else keys * size + t
    if out_of_range is not None:
        keys = torch.where(out_of_range, rows, keys)  # the row past the end: the kernel's assert
    keys, order = torch.sort(keys, stable=True)
    vals = values.expand(tuple(parts[0].shape) + tuple(base.shape[m:])).reshape(n, inner)
    grid = (n, triton.cdiv(inner, ADD_BLOCK))
    on_gpu = base.device.type != "cpu"
    site = kept_site(_sites, SITE_CACHE_MAX, ("add_rows", grid, base.dtype, base.get_device()),
                     _index_add_rows_kernel, grid, dict(_ASSERTS if on_gpu else {}, num_warps=4),
                     {"BLOCK": ADD_BLOCK})
    site(out, keys, order, vals, n, rows, inner, vals.stride(0), vals.stride(1))
    return out


def _examples(target: str):
    ints = ("n", "size_k", "s1", "s2", "s3", "d0", "d1", "d2", "d3", "v0", "v1", "v2", "v3", "i_stride")
    sig = {"dst": "*bf16", "idx": "*i64", "val": "*bf16", "dst_b": "*bf16", "val_b": "*bf16",
           **{name: "i32" for name in ints}, "K": "constexpr", "PAIR": "constexpr", "BLOCK": "constexpr"}
    return [targets.Example("a KV cache row, bf16, index dim 2", sig, {"K": 2, "PAIR": False, "BLOCK": BLOCK},
                            {"num_warps": 4}),
            targets.Example("a KV cache's key and value rows in one launch, bf16", sig,
                            {"K": 2, "PAIR": True, "BLOCK": BLOCK}, {"num_warps": 4})]


def _add_rows_examples(target: str):
    sig = {"out": "*fp32", "keys": "*i64", "order": "*i64", "val": "*fp32",
           **{name: "i32" for name in ("n", "rows", "inner", "v_row", "v_col")}, "BLOCK": "constexpr"}
    return [targets.Example("an embedding's backward, fp32 rows", sig, {"BLOCK": ADD_BLOCK}, {"num_warps": 4})]


targets.register(targets.KernelSpec(
    "index_put_dim", family="indexing", fn=_index_put_dim_kernel, examples=_examples,
    description="index_put_ along one dimension (a KV cache's row written in place)"))
targets.register(targets.KernelSpec(
    "index_add_rows", family="indexing", fn=_index_add_rows_kernel, examples=_add_rows_examples,
    description="index_put with accumulate=True at dimension 0 (an embedding's backward), deterministic"))


# ``tilefuse::index_put_pair_``: what the compiler puts in place of two such writes (compiler/reinplace.py); its
# outputs alias its destinations, as ``index_put_``'s does, so a later reader of either cache depends on the call
if not hasattr(torch.ops.tilefuse, "index_put_pair_"):
    _lib = torch.library.Library("tilefuse", "FRAGMENT")
    _lib.define("index_put_pair_(Tensor(a!) dst_a, Tensor(b!) dst_b, Tensor?[] indices, Tensor values_a, "
                "Tensor values_b) -> (Tensor(a!), Tensor(b!))")
    _lib.impl("index_put_pair_", index_put_pair_, "CompositeExplicitAutograd")
    _lib.impl("index_put_pair_", lambda dst_a, dst_b, indices, values_a, values_b: (dst_a, dst_b), "Meta")
