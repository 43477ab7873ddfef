"""The compiler's one tuning table: the performance settings of its stages, each read by the stage that uses it.

Lowering reads the split-reduction sizes, the scheduler its fusion switches, codegen its kernel forms and launch
shapes; no stage edits another's settings. :func:`tuning` overrides any of them inside a ``with`` block for a
sweep (``tools/sweep_reductions.py``): ``with tuning(outer_xblock=64): ...``. Only plans built inside the block
see the values (a compiled graph keeps the kernels it planned). Block sizes and warps are launch parameters, not
kernel text: such a setting changes no cache key; the split and fusion settings change the IR, so the kernels'
text too.
"""
from __future__ import annotations

import contextlib

# Launch shapes that the settings below start from (codegen's defaults).
ELEMS_PER_THREAD = 8
POINTWISE_BLOCK = 1024  # 1024 elements / (4 warps x 32 lanes) = 8 a thread: one 16-byte bf16 vector
# A flat pointwise kernel with fewer programs than SMs at POINTWISE_BLOCK is latency-bound: the same 4 warps a
# program over blocks down to this (2 elements a thread), so it spreads over more SMs with a shorter chain a
# thread. The decode step's tanh GeLU over 3072: 3 programs of 8 a thread (318 sm_90 SASS instructions a
# thread) 1.53 us on the H100, Inductor's 12 programs of 256 at 4 warps 1.19 us (a one-element kernel: 1.2 us);
# 256 gives Inductor's launch (97 instructions a thread).
SMALL_POINTWISE_BLOCK = 256
TILE_ELEMS = 1024
PERSISTENT_ELEMS = 4096  # rows per program so that a program holds about this many elements
LOOPED_RBLOCK = 1024  # elements a step of the looped row form (see TUNING["looped_rblock"]; decision 022)
# Reductions over a non-contiguous dim (column sums): OUTER_XBLOCK contiguous columns x OUTER_RBLOCK rows a step.
# On the H200, 64 x 64 at ~0.5 TB/s on a layer norm's weight gradient (128-byte pieces of 64 rows a
# step); 256 columns (512 contiguous bytes of bf16) x 16 rows keeps the step's 4096 elements in longer runs.
# Measured (docs/decisions/021-compiler-column-reductions.md): gelu's backward column kernel (dx and the bias
# partials over 256 chunks of 128 rows, 16384 programs) ran 744 us persistent (64 x 128, 16 warps, 76
# registers: one program an SM), 547 us looped at 256 x 16 (16 warps), 332 us looped at 64 x 8 with 4 warps
# (40 registers, many programs an SM: one program's reduction and stores overlap the others' loads).
OUTER_XBLOCK = 64
OUTER_RBLOCK = 8
OUTER_WARPS = 4
# The columns a program counts as for the split decision (lowering/reductions.py, split_factor): the 256-column
# 16-warp program the split thresholds were set with, so the narrower 4-warp step does not change them.
OUTER_SPLIT_XBLOCK = 256

TUNING = {
    # ---- lowering: split reductions (lowering/reductions.py, split_factor). An outer (column) split cuts the
    # rows into at least split_outer_chunks chunks (of at least split_outer_min_rows rows): the first stage can
    # then run inside the row kernel that reads the same rows (the scheduler's columns_into_rows), one program per
    # chunk, and 256 chunks are about two programs per SM of a 132-SM H200. 64 chunks (decision 021) were enough
    # for the 16 x 64 column programs of a separate kernel, not for a program per chunk.
    # Chunks of 8 rows (and 128 row-loop programs, below) let a 1024-row norm backward sum its columns in the row
    # kernel, rows over one dim or several (a model's (batch, sequence)): at 1024 x 4096 bf16 on an H100 the norm
    # and GeLU fwd+bwd graphs' kernels took 0.32-0.47x the GPU time they took with the column sums unsplit
    # (layer_norm 60 -> 19 us a step, Inductor 34; decision 058)
    "split_outer_chunks": 256,
    "split_outer_min_rows": 8,
    # an outer (column) reduction splits from this many rows or SPLIT_MIN_R, the fewer (None: from SPLIT_MIN_R, as
    # a row reduction, which left 1024-row column sums in one 128-program kernel over every row; decision 058)
    "split_outer_min_r": 1024,
    # ... but below SPLIT_MIN_R rows only where it is at most this wide (a norm's weight gradient at a model's
    # width): a bias gradient over 32000 columns already has ~500 programs unsplit, and its split would be 64000
    # programs of 8 rows writing 16 MB of partials (not measured; decision 058)
    "split_outer_short_max_cols": 8192,
    # ---- scheduler: fusion switches and thresholds (scheduler.py)
    # a pointwise root over S*C rows (one dim or several) joins a split reduction's first stage over (S, C, ...)
    # (the gelu backward: the input gradient and the bias gradient's partials in one pass over dy and x)
    "split_siblings": True,
    # a split column reduction's first stage joins the row kernel over the same rows (a norm backward)
    "columns_into_rows": True,
    # ... and a group of such stages with pointwise roots but no row reduction, alone (stages_as_row_loop)
    "stages_as_rows": True,
    # ... when the row-loop kernel then has at least this many programs (one per chunk of rows): about one per
    # SM of a 132-SM H200. 256 (two per SM) kept 1024-row norm backwards out of the row kernel, though its 128
    # programs of 8 rows ran them faster than any other plan measured (decision 058)
    "rowloop_min_programs": 128,
    # independent reductions over the same small space (a norm backward's weight and bias gradients, summed
    # over the row loop's partial rows) share one kernel: nothing is saved in bytes, a launch is
    "join_small_reductions": True,
    "join_small_bytes": 64 << 20,  # ... when the joined kernel reads and writes at most this much
    # independent pointwise roots over the same space of at most this many elements share one kernel: a kernel
    # that small is its launch (a decode step's cache positions and counter increments, one element a layer)
    "join_small_pointwise": True,
    "join_small_pointwise_elems": 4096,
    # ---- codegen: kernel forms and launch shapes (codegen/kernel_writer.py)
    # column (outer) reductions: columns x rows a step (contiguous columns: 64 bf16 = 128 bytes a row)
    "outer_xblock": OUTER_XBLOCK,
    "outer_rblock": OUTER_RBLOCK,
    # fewer column programs than SMs: halve the columns a program (down to this) for more programs
    "outer_min_xblock": 32,
    # an outer reduction up to this many rows keeps the whole column chunk in registers (persistent form,
    # every load issued at once: a split's second stage over 256 partials); longer ones loop. decision 021: a
    # split's stage 1 over 512 rows ran persistent as 8 columns x 512 rows (16 contiguous bytes a row), 457
    # us for 512 MB where Inductor's looped form moved 256 MB in 64 us.
    "outer_persistent_max_r": 256,
    # ... and has at most this many programs (at outer_xblock columns) per SM: a split's second stage (4096
    # columns: 64 programs, latency-bound, all loads at once: 2.5 us against 6.8 looped); a first
    # stage (4096 columns x 256 chunks: 16384 programs) loops, many small programs an SM (744 -> 332 us, decision 021)
    "outer_persistent_max_waves": 4,
    # a persistent column reduction covers at least this many contiguous bytes of each row
    "outer_run_bytes": 128,
    "outer_warps": OUTER_WARPS,  # of the looped column form (0: from the step's elements, warps())
    # rows x columns kernels that also reduce columns (a norm's backward with its weight/bias partial sums):
    # rows a step of the loop over a program's row chunk, and warps (0: from the step's elements)
    "rowloop_rows": 1,
    "rowloop_warps": 0,
    # ... at one row a step, the loop stops at the chunk's last row instead of masking rows past it, so the
    # step has no row mask: its loads and stores unpredicated, its column sums without a select an element
    # (a GeLU chain's backward: 2 of ~54 instructions an element on sm_90a)
    "rowloop_exact_rows": True,
    # ... elements a thread when the step has row sums (warps = the step's elements / (warp size x this)):
    # docs/decisions/022-compiler-row-reductions.md (kernel ms of fwd+bwd): layer_norm's backward at 8 warps
    # (16 a thread, a row's sums exchanged between 8 warps, two 128-register programs an SM) 0.398 -> 0.342,
    # rms_norm 0.334 -> 0.336, layer_norm_gelu (two rows a step: 16 warps either way) unchanged. A loop
    # without row sums (a GeLU chain's backward) keeps ELEMS_PER_THREAD (16 warps a 4096-wide row), and so
    # does a step with more row operands than rowloop_wide_max_loads (residual_layer_norm's backward, three:
    # 172 registers at 8 warps, one program an SM: 0.570 ms fwd+bwd at 16 warps against 0.581)
    "rowloop_thread_elems": 16,
    "rowloop_wide_max_loads": 2,
    # ... two rows a step when the bodies' element_cost() is at least this (decision 022): layer_norm_gelu's
    # backward (cost 50, 78 registers a thread at 16 warps: one program an SM either way) 0.798 -> 0.553 ms
    # with two rows (each step's two row sums and their barriers serve two rows), while layer_norm's (cost
    # 11, 64 registers: two programs an SM at one row) went 0.430 -> 0.465
    "rowloop_heavy_cost": 24,
    # ... each step's row loads issued a step ahead (prefetched_rows), when the step has row sums (whose
    # barriers the loads then run under). Measured (kernel ms, on/off; decision 022): layer_norm fwd+bwd 0.397/0.426,
    # rms_norm 0.333/0.369, layer_norm_gelu 0.472/0.554; a GeLU chain's backward, which has no row
    # sums, 0.432/0.402 (the prefetch's registers and no barrier to hide under)
    "rowloop_prefetch": True,
    "num_stages": 1,  # Triton software pipelining of the looped forms' loads
    # issue a step's loads before its first reduction (row-loop form; the persistent form)
    "rowloop_loads_first": True,
    # tiled pointwise form with no transposed operand: columns a tile (rows: TILE_ELEMS // this); 128 was
    # the tile before the column-reduction sweep (8 x 128; decision 021)
    "tile_contiguous_xblock": TILE_ELEMS,
    # ... and its elements a tile and a thread (a tile with a transposed operand: TILE_ELEMS at
    # ELEMS_PER_THREAD); the 2-D launch grid of every tiled kernel (False: one grid axis, the program id
    # divided by the column blocks)
    "tile_elems": 2 * TILE_ELEMS,
    "tile_thread_elems": 2 * ELEMS_PER_THREAD,
    "tile_grid_2d": True,
    # flat pointwise kernels with fewer programs than SMs: the smallest block (SMALL_POINTWISE_BLOCK; 0: off)
    "small_pointwise_block": SMALL_POINTWISE_BLOCK,
    "persistent_loads_first": False,
    # row reductions, persistent form (whole rows in registers): elements a program (rows a program =
    # this // the row's padded length, at least 1) and elements a thread (warps = a program's elements //
    # (warp size x this), at most MAX_WARPS). Measured (docs/decisions/022-compiler-row-reductions.md, 32768 x
    # 4096 bf16, kernel us): 8 a thread (16 warps a row) -> 32 (4 warps): softmax forward 168 -> 130, layer
    # norm 170 -> 129, softmax + layer norm 233 -> 174, rms norm 144 -> 132, log_softmax's backward 203 ->
    # 185; fewer cross-warp reductions (shuffles, bar.sync) and up to 16 programs an SM instead of 4
    "persistent_elems": PERSISTENT_ELEMS,
    "persistent_thread_elems": 32,
    # ... over fewer rows than SMs (a decode step's layer norm: one row of 768, one program): nothing else on
    # an SM runs while a program waits, so the kernel takes its one dependent chain (loads, two row sums,
    # stores), not its bytes. On the H100 such a layer norm took ~2.3 us against Inductor's 1.5-1.6 (8 warps,
    # every load first). Elements a thread (warps = RBLOCK // (warp size x this)): at 32 a 1024-wide row is one
    # warp of 541 sm_90 SASS instructions a thread; at 8 (one 16-byte bf16 load an operand) 4 warps of 192
    # (8 warps: 145). 8 keeps rows of at most 256 (cross-entropy's 128 and 1 partial rows of its loss) at one
    # warp. Loads first: every load that needs no reduction's value before the first row sum; otherwise
    # the weight's load waits behind the residual's store and the bias's behind the second sum (sm_90 SASS
    # at one warp: three rounds of loads instead of one)
    "latency_rows_thread_elems": ELEMS_PER_THREAD,
    "latency_rows_loads_first": True,
    # row reductions, looped form (rows longer than PERSISTENT_MAX_R): elements a step, elements a thread.
    # Measured (docs/decisions/022-compiler-row-reductions.md, cross-entropy over 32768 x 32000 bf16, kernel ms):
    # 1024 a step at 4 warps 0.788 against 2048 at 8 warps 0.812 (forward), 2.085 against 2.109 (fwd+bwd);
    # 16 a thread at 2048 or 4096 a step slower (0.889, 0.943): the loop is instruction-bound (~20 SASS
    # instructions an element with the online max and sum), not short of loads in flight
    "looped_rblock": LOOPED_RBLOCK,
    "looped_thread_elems": ELEMS_PER_THREAD,
    # looped form: a max and a sum of exp(x - max) over the same x in one loop (online softmax)
    "online_softmax": True,
    # constant all-true masks when a plan's shape fills its blocks (_even_mask), and softmax's division by
    # its sum as one reciprocal a row (KernelWriter.softmax_reciprocal): switches for an A/B sweep
    "fold_even_masks": True,
    # the looped form's partial last step in a loop of its own, after the full steps with the folded mask
    "peel_loop_tail": True,
    # persistent / row-loop forms: two row sums in one tl.reduce over the pair (paired_sums)
    "pair_row_sums": False,
    # the looped form's sums of a one-hot (where(i == t, v, 0) * c over i) as the one term (one_hot_sum)
    "one_hot_sums": True,
    # helpers' half-precision texts (the float32 erfc's degree-6 polynomial) in kernels whose outputs
    # computed from an erf are all float16 / bfloat16
    "half_helpers": True,
    "softmax_reciprocal": True,
}


@contextlib.contextmanager
def tuning(**overrides):
    """Override entries of :data:`TUNING` inside the ``with`` block (unknown names raise ``ValueError``)."""
    saved = []
    try:
        for key, value in overrides.items():
            if key not in TUNING:
                raise ValueError(f"tuning: unknown setting {key!r}; the settings are {sorted(TUNING)}")
            saved.append((key, TUNING[key]))
            TUNING[key] = value
        yield
    finally:
        for key, value in reversed(saved):
            TUNING[key] = value
