"""Column reductions in the GPU's kernel forms, run on Triton's interpreter against float64.

The code generator picks block sizes and forms from the launch target; on the interpreter it picks large
blocks (fewer Python-level programs). These tests make it plan for an H200-like target while the kernels
still run on the interpreter, so the forms the GPU runs are the ones checked:

* the row-loop form (codegen ``rowloop``): a norm backward's row kernel computing its weight/bias column
  partial sums over a chunk of rows (scheduler ``columns_into_rows``), in either order of the graph;
* a pointwise gradient in a split column reduction's first stage (scheduler ``split_siblings``: gelu's
  backward), in the persistent and the looped column forms;
* row counts that the split does not divide (a short last chunk, fused all the same), several rows a step, odd
  sizes.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tilefuse.compiler import codegen
from tilefuse.compiler.codegen import kernel_writer
from tilefuse.compiler.tuning import TUNING, tuning
from tilefuse.compiler.lowering import reductions as LR

from tests.compiler_checks import collect_kernels, kernel_sources, reset, strict
from tests.support import assert_close, noncontiguous

GPU = codegen.LaunchTarget(warp_size=32, interpreter=False, multiprocessors=132)


@pytest.fixture
def gpu_forms(monkeypatch):
    """Plan for the GPU target with split thresholds for interpreter-sized shapes (rows of 64 and more
    split into 8 chunks); returns the list of generated kernels' forms, filled as graphs compile."""
    forms: list[str] = []
    real = codegen.generate

    def generate(group, sched, target=None):
        ks = real(group, sched, GPU)
        forms.append(ks.form)
        return ks

    monkeypatch.setattr(codegen, "generate", generate)
    monkeypatch.setattr(LR, "SPLIT_MIN_R", 64)
    monkeypatch.setattr(LR, "SPLIT_MIN_CHUNK", 8)
    monkeypatch.setattr(LR, "SPLIT_TARGET_PROGRAMS", 8)
    reset()
    with tuning(split_outer_chunks=8, split_outer_min_rows=8, rowloop_min_programs=1):
        yield forms
    torch._dynamo.reset()


def _grads(fn, inputs, cotangents):
    out = fn(*inputs)
    outs = list(out) if isinstance(out, tuple) else [out]
    grads = torch.autograd.grad(outs, [t for t in inputs if t.requires_grad], cotangents)
    return outs, list(grads)


def _check(fn, inputs, dtype=torch.float32):
    """fn's outputs and input gradients, compiled, against float64 eager."""
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        outs = fn(*inputs)
    outs = list(outs) if isinstance(outs, tuple) else [outs]
    cots = [torch.randn(o.shape, generator=g).to(o.dtype) for o in outs]
    with strict():
        got, got_grads = _grads(torch.compile(fn, backend="tilefuse"), inputs, cots)
    ref_in = [t.detach().double().requires_grad_(t.requires_grad) for t in inputs]
    want, want_grads = _grads(fn, ref_in, [c.double() for c in cots])
    for k, (a, b) in enumerate(zip(got, want)):
        assert_close(a, b, dtype, what=f"output {k}")
    for k, (a, b) in enumerate(zip(got_grads, want_grads)):
        assert_close(a, b, dtype, what=f"grad {k}")


def _mats(rows, cols, n_mat, n_vec, dtype=torch.float32, transposed=False):
    g = torch.Generator().manual_seed(rows * 7 + cols)
    mats = [torch.randn(rows, cols, generator=g).to(dtype) for _ in range(n_mat)]
    if transposed:
        mats[0] = noncontiguous(mats[0])
    vecs = [(torch.randn(cols, generator=g) * 0.1 + (1.0 if i == 0 else 0.0)).to(dtype) for i in range(n_vec)]
    return [t.requires_grad_() for t in mats + vecs]


def layer_norm(x, w, b):
    return F.layer_norm(x, x.shape[-1:], w, b, 1e-5)


def rms_norm(x, w):
    return F.rms_norm(x, x.shape[-1:], w, 1e-6)


def residual_layer_norm(x, r, w, b):
    h = x + r
    return h, F.layer_norm(h, h.shape[-1:], w, b, 1e-5)


def gelu_chain(x, b, s):
    return F.gelu(x + b) * s


@pytest.mark.parametrize("rows,cols", [(200, 67), (200, 257), (136, 129)])
@pytest.mark.parametrize("fn,mats,vecs", [(layer_norm, 1, 2), (rms_norm, 1, 1), (residual_layer_norm, 2, 2)],
                         ids=["layer_norm", "rms_norm", "residual_layer_norm"])
def test_norm_backward_column_sums_in_the_row_kernel(gpu_forms, fn, mats, vecs, rows, cols):
    _check(fn, _mats(rows, cols, mats, vecs))
    assert "rowloop" in gpu_forms, f"the column partial sums did not join the row kernel: {gpu_forms}"


@pytest.mark.parametrize("rows_a_step", [1, 4])
def test_row_loop_with_several_rows_a_step_and_a_transposed_input(gpu_forms, rows_a_step):
    with tuning(rowloop_rows=rows_a_step):
        _check(layer_norm, _mats(200, 67, 1, 2, transposed=True))  # 200 rows: 8 chunks of 25
    assert "rowloop" in gpu_forms


@pytest.mark.parametrize("fn, n_mat", [(layer_norm, 1), (rms_norm, 1), (residual_layer_norm, 2)])
@pytest.mark.parametrize("rows_a_step", [1, 4])
def test_row_loop_prefetching_the_next_rows(gpu_kernels, fn, n_mat, rows_a_step):
    """TUNING rowloop_prefetch: each step's row loads issued a step ahead (before the loop for the first,
    masked past the chunk's end: 25 rows a chunk at 4 a step ends on a partial step). The row loads leave the
    loop body for pf_ values; the gradients are float64's."""
    with tuning(rowloop_prefetch=True, rowloop_rows=rows_a_step):
        _check(fn, _mats(200, 67, n_mat, 2 if fn is not rms_norm else 1, transposed=True))
    rowloop = [k for k in gpu_kernels if k.form == "rowloop"]
    assert len(rowloop) == 1, [k.form for k in gpu_kernels]
    src = rowloop[0].source
    loop = src[src.index("    for xoffset"):]
    assert "pf_" in src[:src.index("    for xoffset")] and "xnext = xindex + XBLOCK" in loop
    assert not any("tl.load(" in ln and "xindex" in ln for ln in loop.splitlines()), loop


@pytest.mark.parametrize("fn, n_vec, paired", [(layer_norm, 2, True), (rms_norm, 1, False)])
def test_paired_row_sums(gpu_kernels, fn, n_vec, paired):
    """TUNING pair_row_sums: layer_norm's backward's two independent row sums in one tl.reduce over the pair
    (rms_norm's has one; the forwards' mean and variance depend on each other and stay apart); float64's
    gradients."""
    with tuning(pair_row_sums=True):
        _check(fn, _mats(200, 67, 1, n_vec))
    rowloop = [k for k in gpu_kernels if k.form == "rowloop"]
    assert len(rowloop) == 1 and ("_tf_sum2_combine" in rowloop[0].source) == paired, \
        [k.form for k in gpu_kernels]
    forward = gpu_kernels[0]
    assert "_tf_sum2_combine" not in forward.source


def test_rows_the_split_does_not_divide_are_fused_with_a_short_last_chunk(gpu_forms):
    # 201 rows: 8 chunks by the thresholds, of 201 // 8 = 25 rows, so 9 of them and the last of one row (not 8 of
    # 26 with the last past the end): the row loop's programs write every chunk's partial
    assert LR.split_factor((201, 67), (0,), "sum") == 9
    _check(layer_norm, _mats(201, 67, 1, 2))
    assert "rowloop" in gpu_forms


def test_row_loop_needs_enough_programs(gpu_forms):
    with tuning(rowloop_min_programs=9):  # 8 chunks: fewer programs than asked for
        _check(layer_norm, _mats(200, 67, 1, 2))
    assert "rowloop" not in gpu_forms


def test_row_loop_off(gpu_forms):
    with tuning(columns_into_rows=False):
        _check(layer_norm, _mats(200, 67, 1, 2))
    assert "rowloop" not in gpu_forms


def test_mixed_row_and_column_reductions(gpu_forms):
    """Row reductions with a full-row epilogue (softmax), and column max / any / prod / sum over the same
    rows: every kind a column root can have, in one row-loop kernel."""
    def f(x):
        return x.softmax(1), x.amax(0), (x > 1.5).any(0), (1 + x * 1e-2).prod(0), x.sum(1), (x * x).sum(0)

    x = _mats(200, 67, 1, 0)[0].detach()
    with strict():
        got = torch.compile(f, backend="tilefuse")(x)
    want = f(x.double())
    for k, (a, b) in enumerate(zip(got, want)):
        if a.dtype == torch.bool:
            assert torch.equal(a, b), f"output {k}"
        else:
            assert_close(a, b, torch.float32, what=f"output {k}")
    assert "rowloop" in gpu_forms


@pytest.mark.slow
@pytest.mark.parametrize("persistent_rows", [16, 1 << 20], ids=["looped", "persistent"])
@pytest.mark.parametrize("rows,cols", [(200, 67), (1000, 300)])
def test_gelu_backward_gradient_and_column_sums_in_one_kernel(gpu_forms, persistent_rows, rows, cols):
    """dx = dy * s * gelu'(x + b) and the partials of b's and s's gradients (column sums of dx and of
    dy * gelu(x + b)) from one pass over dy and x, in the column forms (the row loop off)."""
    with tuning(outer_persistent_max_r=persistent_rows, stages_as_rows=False):
        _check(gelu_chain, _mats(rows, cols, 1, 2))
    backward = gpu_forms[1:]
    big = [f for f in backward if f in ("looped", "persistent")]
    # (the two second stages, b's and s's column sums over the partial rows, share one kernel: join_small)
    assert len(backward) == 2, f"expected the fused first stage and the second stages' kernel, got {backward}"
    assert big and big[0] == ("looped" if persistent_rows == 16 else "persistent"), backward


@pytest.mark.slow
@pytest.mark.parametrize("exact", [True, False], ids=["exact_rows", "masked_rows"])
@pytest.mark.parametrize("rows,cols", [(200, 67), (1000, 300)])
def test_gelu_backward_first_stage_as_a_row_loop(gpu_kernels, rows, cols, exact):
    """The same first stage with no row reduction in it goes over whole rows (the row-loop form: dx per
    element, the column partials in registers over a chunk of rows), then the two second stages; on odd
    sizes against float64. At one row a step the loop ends at the chunk's last row and the step has no row
    mask (TUNING rowloop_exact_rows); off, rows past it are masked."""
    with tuning(rowloop_exact_rows=exact):
        _check(gelu_chain, _mats(rows, cols, 1, 2))
    backward = [k.form for k in gpu_kernels[1:]]
    assert backward == ["rowloop", "persistent"], backward  # both second stages in one kernel (join_small)
    rowloop = [k for k in gpu_kernels if k.form == "rowloop"][0]
    assert "tl.sum(" in rowloop.source and ", 1, keep_dims" not in rowloop.source  # column sums only
    assert ("range(0, tl.minimum(xchunk, xnumel - xstart), XBLOCK)" in rowloop.source) == exact, rowloop.source
    assert ("(xindex < xnumel)" in rowloop.source) != exact, rowloop.source


@pytest.mark.parametrize("join", [True, False])
def test_independent_small_second_stages_share_a_kernel(gpu_kernels, join):
    """The bias's and the scale's gradients are two column reductions over the same partial rows that read
    different buffers: nothing to save in bytes, one launch to save. Joined, one kernel computes and stores
    both; with join_small_reductions off (or above join_small_bytes) each has its own, as before."""
    with tuning(join_small_reductions=join):
        _check(gelu_chain, _mats(200, 67, 1, 2))
    second = [k for k in gpu_kernels[1:] if k.form == "persistent"]
    assert len(second) == (1 if join else 2), [k.form for k in gpu_kernels]
    if join:
        assert second[0].source.count("tl.store(") == 2 and second[0].source.count("tl.sum(") == 2
    gpu_kernels.clear()
    reset()  # a fresh compile (Dynamo's own cache would reuse the graph above)
    with tuning(join_small_bytes=0):
        _check(gelu_chain, _mats(200, 67, 1, 2))
    assert len([k for k in gpu_kernels[1:] if k.form == "persistent"]) == 2


def test_gelu_backward_split_siblings_off(gpu_forms):
    with tuning(split_siblings=False):
        _check(gelu_chain, _mats(200, 67, 1, 2))
    assert len(gpu_forms) > 4


def test_half_precision_row_loop(gpu_forms):
    _check(layer_norm, _mats(200, 67, 1, 2, dtype=torch.float16), dtype=torch.float16)
    assert "rowloop" in gpu_forms


def test_outer_reduction_forms_on_the_gpu_target(gpu_forms):
    """Column sums of many rows loop over wide column steps; a short one (a second stage) is persistent
    with at least outer_run_bytes of each row."""
    x = torch.randn(3000, 300)
    with strict(), tuning(split_outer_chunks=1, split_outer_min_r=None):
        monkey_min_r = LR.SPLIT_MIN_R
        LR.SPLIT_MIN_R = 1 << 30  # no split: one column reduction over 3000 rows
        try:
            out = torch.compile(lambda t: t.sum(0), backend="tilefuse")(x)
        finally:
            LR.SPLIT_MIN_R = monkey_min_r
    assert_close(out, x.double().sum(0), torch.float32)
    assert gpu_forms == ["looped"], gpu_forms


@pytest.fixture
def gpu_kernels(gpu_forms, monkeypatch):
    """gpu_forms, keeping the generated KernelSources."""
    return collect_kernels(monkeypatch)


@pytest.mark.slow
def test_column_first_stage_with_many_programs_loops_and_second_stage_stays_persistent(gpu_kernels):
    """decision 021: a first stage with many column programs (16384 at 32768 x 4096) ran 744 us persistent, 332
    looped at 64 x 8 with 4 warps; a second stage (few programs) stays persistent. 1000 x 300 in 8 chunks:
    38 first-stage programs against a threshold of 0.1 x 132 SMs, 5 second-stage ones."""
    with tuning(outer_persistent_max_waves=0.1, stages_as_rows=False):
        _check(gelu_chain, _mats(1000, 300, 1, 2))
    backward = [k for k in gpu_kernels[1:] if k.form in ("looped", "persistent")]
    assert [k.form for k in backward] == ["looped", "persistent"], [k.form for k in backward]
    first = backward[0]
    blocks = dict(first.constexprs)  # 38 programs < 132 SMs: the columns a program halve (to 32)
    assert blocks["RBLOCK"] == kernel_writer.OUTER_RBLOCK and blocks["XBLOCK"] in (32, kernel_writer.OUTER_XBLOCK), blocks
    assert first.num_warps == kernel_writer.OUTER_WARPS


def _loads_before_first_sum(source: str) -> bool:
    lines = source.splitlines()
    loop = next(k for k, line in enumerate(lines) if line.lstrip().startswith("for xoffset"))
    body = lines[loop:]
    first_sum = next(k for k, line in enumerate(body) if "tl.sum(" in line)
    return all(k < first_sum for k, line in enumerate(body) if "tl.load(" in line)


@pytest.mark.parametrize("first", [True, False])
def test_row_loop_issues_its_loads_before_the_first_reduction(gpu_kernels, first):
    """A residual norm's backward reads dh only for dx, after both row sums: issued after a tl.sum its load
    waits for the sum's barriers (two memory latencies a step). rowloop_loads_first issues it first (the
    order of a step's own loads: with rowloop_prefetch, the default, every row load is a step ahead anyway)."""
    with tuning(rowloop_loads_first=first, rowloop_prefetch=False):
        _check(residual_layer_norm, _mats(200, 67, 2, 2))
    rowloop = [k for k in gpu_kernels if k.form == "rowloop"]
    assert len(rowloop) == 1
    assert _loads_before_first_sum(rowloop[0].source) == first


@pytest.mark.parametrize("transposed", [False, True])
def test_tiled_pointwise_takes_whole_rows_unless_an_operand_is_transposed(gpu_kernels, transposed):
    """gelu(x + b) * s broadcasts b and s along rows (the tiled form): rows of up to TILE_ELEMS columns so
    that b and s are laid out like x; a transposed x keeps 128-column tiles of several rows."""
    x, b, s = _mats(64, 300, 1, 2, transposed=transposed)
    with torch.no_grad(), strict():
        got = torch.compile(gelu_chain, backend="tilefuse")(x, b, s)
    assert_close(got, gelu_chain(x.double(), b.double(), s.double()), torch.float32)
    tiled = [k for k in gpu_kernels if k.form == "tiled"]
    assert len(tiled) == 1, [k.form for k in gpu_kernels]
    blocks = dict(tiled[0].constexprs)
    tile = kernel_writer.TILE_ELEMS if transposed else TUNING["tile_elems"]
    per_thread = kernel_writer.ELEMS_PER_THREAD if transposed else TUNING["tile_thread_elems"]
    assert blocks["XBLOCK"] == (128 if transposed else 512) and blocks["XBLOCK"] * blocks["YBLOCK"] <= tile
    assert tiled[0].num_warps == max(1, blocks["XBLOCK"] * blocks["YBLOCK"] // (32 * per_thread))


@pytest.mark.parametrize("grid_y_limit", [65535, 4])
def test_tiled_pointwise_launches_a_2d_grid_without_dividing_the_program_id(gpu_kernels, monkeypatch,
                                                                           grid_y_limit):
    """Column blocks on the grid's first axis and row blocks on its second, so no program divides its id
    by the column blocks; more row blocks than a grid's second axis holds (CUDA's 65535, lowered to 4
    here) fall back to one axis and the division. Both give eager's result on odd sizes with a
    non-contiguous x."""
    monkeypatch.setattr(kernel_writer, "MAX_GRID_Y", grid_y_limit)
    x, b, s = _mats(37, 1500, 1, 2)
    x = x[:, ::2]  # 37 x 750, row stride 1500
    b, s = b[:750], s[:750]
    with torch.no_grad(), strict():
        got = torch.compile(gelu_chain, backend="tilefuse")(x, b, s)
    assert_close(got, gelu_chain(x.double(), b.double(), s.double()), torch.float32)
    tiled = [k for k in gpu_kernels if k.form == "tiled"]
    assert len(tiled) == 1, [k.form for k in gpu_kernels]
    ks = tiled[0]
    blocks = dict(ks.constexprs)
    yblocks, xblocks = -(-37 // blocks["YBLOCK"]), -(-750 // blocks["XBLOCK"])
    if yblocks <= grid_y_limit:
        assert ks.grid == (xblocks, yblocks) and "tl.program_id(1)" in ks.source and "//" not in ks.source
    else:
        assert ks.grid == (xblocks * yblocks,) and "pid // xblocks" in ks.source


def test_few_rows_spread_over_the_sms(gpu_kernels):
    """A persistent row reduction over fewer rows than a program would take (40 rows of 256; a program holds
    4096 elements) gives each SM a row rather than 3 programs of 16 rows (decision 022: cross-entropy's 128 partial
    rows of its loss in 8 programs took 18 us)."""
    x = _mats(40, 256, 1, 0)[0]
    _check(lambda t: (t * t).sum(-1), [x])
    red = [k for k in gpu_kernels if k.form == "persistent"]
    assert len(red) == 1 and red[0].grid == (40,) and dict(red[0].constexprs)["XBLOCK"] == 1, \
        [(k.form, k.grid, k.constexprs) for k in gpu_kernels]


def layer_norm_gelu(x, w, b):
    return F.gelu(F.layer_norm(x, x.shape[-1:], w, b, 1e-5))


@pytest.mark.parametrize("fn, rows_a_step", [(layer_norm, 1), (layer_norm_gelu, 2)])
def test_row_loop_takes_two_rows_a_step_when_an_element_is_heavy(gpu_kernels, fn, rows_a_step):
    """The row-loop form (a norm's backward with its weight and bias partial sums) steps one row at a time,
    two when the bodies' element cost reaches TUNING rowloop_heavy_cost (a GeLU's backward in the loop);
    200 rows (8 chunks of 25: a program's last step is half a step) give float64's gradients either way, and the
    threshold switched off gives back one row a step."""
    for heavy_cost, want in ((TUNING["rowloop_heavy_cost"], rows_a_step), (1 << 30, 1)):
        gpu_kernels.clear()
        torch._dynamo.reset()
        with tuning(rowloop_heavy_cost=heavy_cost):
            _check(fn, _mats(200, 96, 1, 2))
        rowloop = [k for k in gpu_kernels if k.form == "rowloop"]
        assert len(rowloop) == 1, [k.form for k in gpu_kernels]
        assert dict(rowloop[0].constexprs)["XBLOCK"] == want, dict(rowloop[0].constexprs)


@pytest.mark.parametrize("rows, exact", [(256, True), (272, True), (200, False), (264, False)])
def test_two_rows_a_step_without_row_masks_when_the_steps_are_whole(gpu_kernels, rows, exact):
    """Two rows a step (layer_norm + GeLU's backward) with no row mask when every step is whole: the rows and
    the chunk are even (8 chunks of 32 or 34 rows). The masks' selects before each row sum and column
    accumulation were ~5 of the step's ~55 SASS instructions an element on sm_90a. Odd chunks (25 or 33 rows)
    keep the masked loop. Gradients against float64 either way."""
    _check(layer_norm_gelu, _mats(rows, 96, 1, 2))
    rowloop = [k for k in gpu_kernels if k.form == "rowloop"]
    assert len(rowloop) == 1 and dict(rowloop[0].constexprs)["XBLOCK"] == 2, [k.form for k in gpu_kernels]
    src = rowloop[0].source
    assert ("range(0, tl.minimum(xchunk, xnumel - xstart), XBLOCK)" in src) == exact, src
    assert ("(xindex < xnumel)" in src) != exact, src


def test_tuning_rejects_unknown_settings_and_restores():
    before = dict(TUNING)
    with pytest.raises(ValueError, match="outer_xblock"):
        with tuning(outer_xblock=64, no_such_setting=1):
            pass
    assert TUNING == before
    with tuning(outer_xblock=64):
        assert TUNING["outer_xblock"] == 64
        assert LR.split_factor((32768, 4096), (0,), "sum") == 256
    assert TUNING == before


@pytest.mark.parametrize("rows, cols", [(64, 256), (61, 256), (64, 250), (7, 8)])
def test_block_masks_fold_when_the_shape_fills_the_block(gpu_forms, rows, cols):
    """A plan whose rows fill RBLOCK (and XBLOCK) exactly writes constant all-true masks (Triton then drops
    the selects and load predicates); any other shape keeps the tests. Both give eager's result, and a
    dynamic-shape graph that sees both kinds of shape re-plans each one right (persistent and row-loop
    forms: softmax + layer norm forward and backward)."""
    import re

    from tilefuse.compiler.explain import explain

    def f(x, w, b):
        return F.layer_norm(torch.softmax(x, -1), (x.shape[-1],), w, b)

    x = noncontiguous(torch.randn(rows, cols, dtype=torch.float64).float()).requires_grad_()
    w, b = torch.randn(cols, requires_grad=True), torch.randn(cols, requires_grad=True)
    with strict():
        ex = explain(f, x, w, b)
    texts = kernel_sources(ex)
    assert texts
    full_r = [t for t in texts if "rmask = tl.full([1, RBLOCK], 1, tl.int1)" in t]
    tested_r = [t for t in texts if re.search(r"rmask = rindex < rnumel", t)]
    if cols & (cols - 1) == 0:  # a power of two: the row fills RBLOCK
        assert full_r, f"a {cols}-wide row in RBLOCK {cols} keeps the rnumel test"
    else:
        assert tested_r and not full_r, "a row that does not fill RBLOCK lost its mask"
    xd, wd, bd = (t.detach().double() for t in (x, w, b))
    assert_close(ex.result.double(), f(xd, wd, bd), torch.float32)
    torch._dynamo.reset()


def test_dynamic_shapes_replan_masks_per_shape(gpu_forms):
    """One compiled function (dynamic=True) called with a row that fills the block, then with one that does
    not, then with the first again: each result right (the second shape must not run the first's text)."""
    f = torch.compile(lambda t: torch.softmax(t, -1) * 2.0, backend="tilefuse", dynamic=True)
    with strict():
        for rows, cols in ((32, 128), (33, 120), (32, 128), (9, 129)):
            x = torch.randn(rows, cols)
            assert_close(f(x).double(), torch.softmax(x.double(), -1) * 2.0, torch.float32)


def test_the_two_switches_turn_the_rewrites_off(gpu_forms):
    """fold_even_masks / softmax_reciprocal (sweep settings no_fold_masks / no_softmax_rcp) give back the
    rnumel test and the division, with the same result."""
    from tilefuse.compiler.explain import explain

    x = torch.randn(16, 256)
    want = torch.softmax(x.double(), -1)
    texts = {}
    for on in (True, False):
        reset()
        with tuning(fold_even_masks=on, softmax_reciprocal=on), strict():
            ex = explain(lambda t: torch.softmax(t, -1), x)
        texts[on] = "\n".join(kernel_sources(ex))
        assert_close(ex.result.double(), want, torch.float32)
    assert "rmask = tl.full([1, RBLOCK], 1, tl.int1)" in texts[True] and "(1.0 / red" in texts[True]
    assert "rmask = rindex < rnumel" in texts[False] and "(1.0 / red" not in texts[False]
    torch._dynamo.reset()


@pytest.mark.parametrize("fn, n_mat, n_vec, warps, prefetched", [
    (layer_norm, 1, 2, 2, True),            # two row operands (x, dy), row sums: 16 elements a thread
    (rms_norm, 1, 1, 2, True),
    (residual_layer_norm, 2, 2, 4, True),   # three row operands: 8 a thread
    (gelu_chain, 1, 2, 4, False),           # no row sums: 8 a thread, no prefetch (decision 022)
], ids=["layer_norm", "rms_norm", "residual_layer_norm", "gelu_chain"])
def test_row_loop_thread_share_and_prefetch_follow_its_row_sums(gpu_kernels, fn, n_mat, n_vec, warps, prefetched):
    """decision 022: a row loop with row sums and at most rowloop_wide_max_loads row operands takes 16 elements a
    thread (layer_norm's backward 8 warps a 4096-wide row: 0.398 -> 0.342 ms fwd+bwd); the prefetch only
    where there are row sums to hide it under. 64 rows of 1024 in 8 chunks: warps = 1024 / (32 x share)."""
    _check(fn, _mats(64, 1024, n_mat, n_vec))
    rowloop = [k for k in gpu_kernels if k.form == "rowloop"]
    assert len(rowloop) == 1, [k.form for k in gpu_kernels]
    assert rowloop[0].num_warps == warps
    assert ("pf_" in rowloop[0].source) == prefetched
