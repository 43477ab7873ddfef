"""The flash-attention kernels: forward (online softmax, optional KV split), backward, decode combine.

Notation: a score tile ``s[i, j]`` is query row ``i`` against key ``j`` of one (batch, head). Every kernel
computes scores through :func:`score_tile`, so the forward and the backward see the same function of
``q @ k^T``, in this order (the order of ``F.scaled_dot_product_attention`` plus Gemma's soft cap and
FlexAttention's ``score_mod``)::

    s = (q @ k^T) * sm_scale
    s = softcap * tanh(s / softcap)                        SOFTCAP
    s = s - slope[b, h] * |i + diag - j|                   ALIBI == 1
    s = s + mask[b, h, i, j]                               MASK_KIND 1 (additive)
    s = SCORE_MOD(s, b, h, i, j)                           SCORE_MOD (a @triton.jit function, or None)
                                                           (ALIBI == 2: SCORE_MOD(s, b, h, i, j, alibi_ptr),
                                                           the pointer to the tensors a generated mod reads)
    s = where(mask[b, h, i, j], s, -inf)                   MASK_KIND 2 (boolean, True = attend)
    s = where(i + lo_off <= j <= i + hi_off and j < Sk, s, -inf)   the band (causal, window) and bounds

The softmax runs in base 2 (``exp2`` is one instruction on both vendors): the running max ``m`` and the saved
logsumexp ``lse`` are in log2 units (``lse2 = lse * log2(e)``). A row with no visible key keeps ``m = -inf``
and ``l = 0``: its output is 0 and its ``lse2`` is ``-inf``; the backward reads ``-inf`` as "no
probability", so its gradients are 0 too.

Tiles that the band leaves fully masked are never visited: :func:`band_tiles` gives, for a block of rows,
the tiles with any visible element and, inside them, the tiles where every element is visible; only the
tiles at the edges pay for the mask (``MASKED`` constexpr). ``BAND_LO`` (a window's left edge) and
``BAND_HI`` (causal or a window's right edge) say which edges exist, so a kernel holds only the loops it
needs: the forward and dQ pass have a leading masked loop only with BAND_LO and always a trailing one (the
diagonal, and the ragged last key tile: keys past Sk must get no probability); the dK/dV pass a leading one
only with BAND_HI and a trailing one only with BAND_LO. Padded rows need no mask in the backward: a query
row past Sq has ``lse = +inf`` (p = 0), and a key row past Sk is zero in K and V (its dK/dV rows are not
stored, its dQ share is ``dS @ 0``).

Dropout: keep ``(i, j)`` of (batch, head) ``bh`` iff ``rand(seed + bh * 2^32, i * Sk + j) >= p`` (Philox,
``tl.rand``): a counter-based draw, so the backward (and :func:`dropout_keep_kernel`, for tests) regenerate
the same mask from the seed. The normaliser ``l`` sums the probabilities before dropout; the kept ones are
scaled by ``1 / (1 - p)``, as ``F.dropout`` does.

VARLEN (packed variable-length sequences, :mod:`.varlen`; 0 off, 1 top-left diagonal, 2 bottom-right): the
forward and both backward kernels take ``cu_q_ptr`` / ``cu_k_ptr`` (int32 cumulative lengths) and read the
batch index of the grid as the sequence index. A program loads its sequence's start and length, moves its q/o/
do/dq and k/v/dk/dv pointers to the start (the launcher passes batch strides of 0 for the packed
``(total, H, D)`` tensors), replaces Sq / Sk (which arrive as the packed totals) by the sequence's lengths, and
returns at once if its row (key) block lies past the sequence's end: the grid is sized by the longest sequence.
Everything after that is the non-varlen code with the sequence's lengths, so keys past the end are masked like a
ragged last tile. ``lse2`` and ``delta`` are ``(H, total_q)``. With VARLEN == 2 the band offsets arrive relative to
the diagonal and each sequence adds its ``Sk - Sq``. The default VARLEN=0 leaves the non-varlen specialisation
untouched (the switch is constexpr, the ``cu_*`` arguments are constexpr None).

``DOT_F32`` (set on Triton's interpreter): every ``tl.dot`` operand is upcast to float32 first, because the
interpreter's ``tl.dot`` multiplies bfloat16 bit patterns as integers (triton 3.6). Values are still rounded
to the input dtype where a GPU rounds them (``p`` before ``p @ v``), so the interpreter's numbers are the GPU's.
"""
from __future__ import annotations

import triton
import triton.language as tl

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


@triton.jit
def tanh_f32(x):
    """tanh from one exp2 (``tl.extra.libdevice`` does not run on the interpreter): odd, exact at 0, and
    ``1 - 2 e / (1 + e)`` with ``e = exp(-2|x|)`` keeps full relative precision near 0 only to ~1e-7 absolute,
    which is what a soft cap of a few tens needs."""
    e = tl.exp2(-2.0 * 1.4426950408889634 * tl.abs(x))
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x < 0, -t, t)


@triton.jit
def dropout_keep(seed, bh, q_idx, k_idx, Sk, dropout_p):
    """The keep mask of (batch*head ``bh``): one Philox stream a (batch, head), counter ``q * Sk + k``."""
    key = seed + (bh.to(tl.int64) << 32)
    return tl.rand(key, q_idx * Sk + k_idx) >= dropout_p


@triton.jit
def band_tiles(a, b, c_lo, c_hi, N, BLOCK: tl.constexpr):
    """Rows ``a..b`` (inclusive) see columns ``x + c_lo .. x + c_hi`` of ``0..N-1``. Returns tile indices
    ``t0 <= t1 <= t2 <= t3``: tiles ``[t0, t3)`` hold a visible column for some row, tiles ``[t1, t2)`` are
    visible for every row (no mask needed)."""
    any_lo = tl.maximum(a + c_lo, 0)
    any_hi = tl.maximum(tl.minimum(b + c_hi + 1, N), any_lo)
    t0 = any_lo // BLOCK
    t3 = tl.where(any_hi > any_lo, tl.cdiv(any_hi, BLOCK), t0)
    all_lo = tl.maximum(b + c_lo, 0)
    all_hi = tl.minimum(a + c_hi + 1, N)
    t1 = tl.minimum(tl.maximum(tl.cdiv(all_lo, BLOCK), t0), t3)
    t2 = tl.minimum(tl.maximum(all_hi // BLOCK, t1), t3)
    return t0, t1, t2, t3


@triton.jit
def varlen_bounds(cu_q_ptr, cu_k_ptr, seq):
    """(q_start, q_len, k_start, k_len) of packed sequence ``seq`` from the int32 cumulative lengths."""
    q_start = tl.load(cu_q_ptr + seq)
    k_start = tl.load(cu_k_ptr + seq)
    return q_start, tl.load(cu_q_ptr + seq + 1) - q_start, k_start, tl.load(cu_k_ptr + seq + 1) - k_start


@triton.jit
def varlen_diagonal(diag, lo_off, hi_off, Sq, Sk, VARLEN: tl.constexpr):
    """The band of one packed sequence: the offsets are passed relative to its diagonal, which is
    ``Sk - Sq`` of that sequence with VARLEN_BOTTOM_RIGHT (2), ``0`` with VARLEN_TOP_LEFT (1)."""
    if VARLEN == 2:
        shift = Sk - Sq
        diag = diag + shift
        lo_off = lo_off + shift
        hi_off = hi_off + shift
    return diag, lo_off, hi_off


@triton.jit
def score_tile(qk, b, h, q_idx, k_idx, Sq, Sk, sm_scale, softcap, diag, lo_off, hi_off,
               mask_ptr, stride_mb, stride_mh, stride_mm, stride_mn, alibi_ptr, stride_ab, stride_ah,
               MASKED: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, MASK_KIND: tl.constexpr,
               SCORE_MOD: tl.constexpr):
    """Scores of a tile in natural units, from ``qk = q @ k^T`` (fp32). ``q_idx`` and ``k_idx`` broadcast
    against ``qk`` (rows x 1 and 1 x cols, or transposed: the backward works on ``s^T``). Returns
    ``(s, pre, t)``: ``pre`` is the value handed to SCORE_MOD and ``t`` the soft cap's tanh, which the
    backward's chain rule needs."""
    s = qk * sm_scale
    t = s
    if SOFTCAP:
        t = tanh_f32(s / softcap)
        s = softcap * t
    if ALIBI == 1:
        slope = tl.load(alibi_ptr + b * stride_ab + h * stride_ah)
        s = s - slope * tl.abs(q_idx + diag - k_idx).to(tl.float32)
    if MASK_KIND != 0:
        inside = (q_idx < Sq) & (k_idx < Sk)
        base = mask_ptr + b.to(tl.int64) * stride_mb + h.to(tl.int64) * stride_mh
        mv = tl.load(base + q_idx * stride_mm + k_idx * stride_mn, mask=inside, other=0)
        if MASK_KIND == 1:
            s = s + mv.to(tl.float32)
    pre = s
    if SCORE_MOD is not None:
        if ALIBI == 2:  # alibi_ptr holds the mod's operands (a generated score_mod reading tensors)
            s = SCORE_MOD(s, b, h, q_idx, k_idx, alibi_ptr)
        else:
            s = SCORE_MOD(s, b, h, q_idx, k_idx)
    if MASK_KIND == 2:  # after the mod: SCORE_MOD never sees the -inf of a masked-out score
        s = tl.where(mv != 0, s, float("-inf"))
    if MASKED:
        visible = (k_idx < Sk) & (q_idx < Sq) & (k_idx >= q_idx + lo_off) & (k_idx <= q_idx + hi_off)
        s = tl.where(visible, s, float("-inf"))
    return s, pre, t


@triton.jit
def score_grad(ds, b, h, q_idx, k_idx, pre, t, alibi_ptr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr,
               SCORE_MOD_GRAD: tl.constexpr):
    """d loss / d (qk * sm_scale) from d loss / d s: back through SCORE_MOD (its derivative) and the cap."""
    if SCORE_MOD_GRAD is not None:
        if ALIBI == 2:
            ds = ds * SCORE_MOD_GRAD(pre, b, h, q_idx, k_idx, alibi_ptr)
        else:
            ds = ds * SCORE_MOD_GRAD(pre, b, h, q_idx, k_idx)
    if SOFTCAP:
        ds = ds * (1.0 - t * t)
    return ds


# ============================================================================================== forward
@triton.jit
def _fwd_tile(acc, l_i, m_i, q, k_base, v_base, tile, b, h_arg, bh, row_q, Sq, Sk,
              sm_scale, softcap, diag, lo_off, hi_off, dropout_p, seed,
              mask_ptr, stride_mb, stride_mh, stride_mm, stride_mn, alibi_ptr, stride_ab, stride_ah,
              stride_kn, stride_kd, stride_vn, stride_vd,
              HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr,
              SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, MASK_KIND: tl.constexpr, SCORE_MOD: tl.constexpr,
              DROPOUT: tl.constexpr, DOT_F32: tl.constexpr, INPUT_PRECISION: tl.constexpr):
    offs_n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    kv_mask = offs_d[None, :] < HEAD_DIM
    if MASKED:
        kv_mask = kv_mask & (offs_n[:, None] < Sk)
    if BLOCK_D == HEAD_DIM and not MASKED:
        k = tl.load(k_base + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd)
        v = tl.load(v_base + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd)
    else:
        k = tl.load(k_base + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd, mask=kv_mask, other=0.0)
        v = tl.load(v_base + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd, mask=kv_mask, other=0.0)
    in_dtype = v.dtype
    if DOT_F32:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    qk = tl.dot(q, tl.trans(k), input_precision=INPUT_PRECISION)
    k_idx = offs_n[None, :]
    q_idx = row_q[:, None]
    s, _, _ = score_tile(qk, b, h_arg, q_idx, k_idx, Sq, Sk, sm_scale, softcap, diag, lo_off, hi_off,
                         mask_ptr, stride_mb, stride_mh, stride_mm, stride_mn, alibi_ptr, stride_ab, stride_ah,
                         MASKED, SOFTCAP, ALIBI, MASK_KIND, SCORE_MOD)
    s = s * 1.4426950408889634
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing visible yet: no -inf - -inf
    p = tl.exp2(s - m_use[:, None])
    alpha = tl.exp2(m_i - m_use)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    if DROPOUT:
        keep = dropout_keep(seed, bh, q_idx, k_idx, Sk, dropout_p)
        p = tl.where(keep, p * (1.0 / (1.0 - dropout_p)), 0.0)
    p = p.to(in_dtype)
    if DOT_F32:
        p = p.to(tl.float32)
    acc = tl.dot(p, v, acc, input_precision=INPUT_PRECISION)
    return acc, l_i, m_new


@triton.jit
def attn_fwd_kernel(
        # tensors: q (B, H, Sq, D), k/v (B, H // GROUP, Sk, D), o (B, H, Sq, D) [x splits], lse2 [splits, B*H, Sq]
        q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, mask_ptr, alibi_ptr,
        # strides, in elements
        stride_qb, stride_qh, stride_qm, stride_qd,
        stride_kb, stride_kh, stride_kn, stride_kd,
        stride_vb, stride_vh, stride_vn, stride_vd,
        stride_ob, stride_oh, stride_om, stride_od, stride_os,
        stride_ls,
        stride_mb, stride_mh, stride_mm, stride_mn,
        stride_ab, stride_ah,
        # sizes
        H, Sq, Sk, tiles_per_split,
        # score parameters
        sm_scale, softcap, diag, lo_off, hi_off, dropout_p, seed,
        # meta-parameters
        HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        GROUP: tl.constexpr, PACK_GQA: tl.constexpr, BAND_LO: tl.constexpr, BAND_HI: tl.constexpr,
        SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, MASK_KIND: tl.constexpr, SCORE_MOD: tl.constexpr,
        DROPOUT: tl.constexpr, DOT_F32: tl.constexpr, INPUT_PRECISION: tl.constexpr,
        # packed variable-length sequences (see the VARLEN section of the module docstring)
        cu_q_ptr=None, cu_k_ptr=None, VARLEN: tl.constexpr = 0):
    """One program: BLOCK_M query rows of one (batch, head) [, one KV split]. Grid
    ``(cdiv(rows, BLOCK_M), B * H [or B * H_kv with PACK_GQA], splits)``.

    PACK_GQA (decode): a program's rows are (group member, query) pairs of one KV head, ``row = g * Sq + i``,
    so the group's heads share each K/V tile load; the grid's second axis is then ``B * H_kv``.
    With splits > 1 each program covers ``tiles_per_split`` KV tiles and writes its normalised partial output
    (fp32) and partial ``lse2``; :func:`attn_combine_kernel` merges them.

    VARLEN (not with PACK_GQA or splits): "batch" ``b`` is the packed sequence; Sq/Sk arrive as the totals."""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    split = tl.program_id(2)
    if VARLEN:
        total_q = Sq
        q_start, Sq, k_start, Sk = varlen_bounds(cu_q_ptr, cu_k_ptr, pid_bh // H)
        if pid_m * BLOCK_M >= Sq:  # a row block past this sequence's end
            return
        q_ptr += q_start.to(tl.int64) * stride_qm
        o_ptr += q_start.to(tl.int64) * stride_om
        k_ptr += k_start.to(tl.int64) * stride_kn
        v_ptr += k_start.to(tl.int64) * stride_vn
        diag, lo_off, hi_off = varlen_diagonal(diag, lo_off, hi_off, Sq, Sk, VARLEN)
    if PACK_GQA:
        b = pid_bh // (H // GROUP)
        kvh = pid_bh % (H // GROUP)
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = rows < GROUP * Sq
        row_h = kvh * GROUP + tl.minimum(rows // Sq, GROUP - 1)
        row_q = rows % Sq
        h_arg = row_h[:, None]
        q_first = 0
        q_last = Sq - 1
    else:
        b = pid_bh // H
        h = pid_bh % H
        kvh = h // GROUP
        row_q = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = row_q < Sq
        row_h = h
        h_arg = h
        q_first = pid_m * BLOCK_M
        q_last = tl.minimum(q_first + BLOCK_M, Sq) - 1
    bh = b * H + row_h
    b64 = b.to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    q_rows = q_ptr + b64 * stride_qb + row_h.to(tl.int64) * stride_qh + row_q.to(tl.int64) * stride_qm
    q = tl.load(q_rows[:, None] + offs_d[None, :] * stride_qd, mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    if DOT_F32:
        q = q.to(tl.float32)
    k_base = k_ptr + b64 * stride_kb + kvh.to(tl.int64) * stride_kh
    v_base = v_ptr + b64 * stride_vb + kvh.to(tl.int64) * stride_vh

    t0, t1, t2, t3 = band_tiles(q_first, q_last, lo_off, hi_off, Sk, BLOCK_N)
    # this split's share of the visible tiles
    s0 = t0 + split * tiles_per_split
    s3 = tl.minimum(s0 + tiles_per_split, t3)
    s1 = tl.minimum(tl.maximum(t1, s0), s3)
    s2 = tl.minimum(tl.maximum(t2, s1), s3)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    if BAND_LO:
        for tile in range(s0, s1):
            acc, l_i, m_i = _fwd_tile(acc, l_i, m_i, q, k_base, v_base, tile, b, h_arg, bh, row_q, Sq, Sk,
                                      sm_scale, softcap, diag, lo_off, hi_off, dropout_p, seed,
                                      mask_ptr, stride_mb, stride_mh, stride_mm, stride_mn, alibi_ptr, stride_ab,
                                      stride_ah, stride_kn, stride_kd, stride_vn, stride_vd,
                                      HEAD_DIM, BLOCK_D, BLOCK_N, True, SOFTCAP, ALIBI, MASK_KIND, SCORE_MOD,
                                      DROPOUT, DOT_F32, INPUT_PRECISION)
    for tile in range(s1, s2):
        acc, l_i, m_i = _fwd_tile(acc, l_i, m_i, q, k_base, v_base, tile, b, h_arg, bh, row_q, Sq, Sk,
                                  sm_scale, softcap, diag, lo_off, hi_off, dropout_p, seed,
                                  mask_ptr, stride_mb, stride_mh, stride_mm, stride_mn, alibi_ptr, stride_ab,
                                  stride_ah, stride_kn, stride_kd, stride_vn, stride_vd,
                                  HEAD_DIM, BLOCK_D, BLOCK_N, False, SOFTCAP, ALIBI, MASK_KIND, SCORE_MOD,
                                  DROPOUT, DOT_F32, INPUT_PRECISION)
    for tile in range(s2, s3):
        acc, l_i, m_i = _fwd_tile(acc, l_i, m_i, q, k_base, v_base, tile, b, h_arg, bh, row_q, Sq, Sk,
                                  sm_scale, softcap, diag, lo_off, hi_off, dropout_p, seed,
                                  mask_ptr, stride_mb, stride_mh, stride_mm, stride_mn, alibi_ptr, stride_ab,
                                  stride_ah, stride_kn, stride_kd, stride_vn, stride_vd,
                                  HEAD_DIM, BLOCK_D, BLOCK_N, True, SOFTCAP, ALIBI, MASK_KIND, SCORE_MOD,
                                  DROPOUT, DOT_F32, INPUT_PRECISION)

    empty = l_i == 0.0
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    lse2 = tl.where(empty, float("-inf"), m_i + tl.log2(tl.where(empty, 1.0, l_i)))
    o_rows = (o_ptr + split.to(tl.int64) * stride_os + b64 * stride_ob + row_h.to(tl.int64) * stride_oh
              + row_q.to(tl.int64) * stride_om)
    tl.store(o_rows[:, None] + offs_d[None, :] * stride_od, out.to(o_ptr.dtype.element_ty),
             mask=row_ok[:, None] & d_ok[None, :])
    if VARLEN:
        lse_rows = lse_ptr + row_h.to(tl.int64) * total_q + q_start + row_q  # (H, total_q)
    else:
        lse_rows = lse_ptr + split.to(tl.int64) * stride_ls + bh.to(tl.int64) * Sq + row_q
    tl.store(lse_rows, lse2, mask=row_ok)


@triton.jit
def _combine_lse(part_lse_ptr, s, BH, Sq, rows, row_ok):
    return tl.load(part_lse_ptr + s * BH * Sq + rows, mask=row_ok, other=float("-inf"))


@triton.jit
def _combine_term(part_ptr, part_lse_ptr, s, BH, Sq, rows, row_ok, offs_d, d_ok, m_use, HEAD_DIM: tl.constexpr):
    """One split's weight ``2^(lse2_s - max)`` and its weighted partial rows."""
    w = tl.exp2(_combine_lse(part_lse_ptr, s, BH, Sq, rows, row_ok) - m_use)
    part = tl.load(part_ptr + (s * BH * Sq + rows.to(tl.int64))[:, None] * HEAD_DIM + offs_d[None, :],
                   mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    return w, w[:, None] * part


@triton.jit
def attn_combine_kernel(part_ptr, part_lse_ptr, o_ptr, lse_ptr, BH, H, Sq, splits,
                        stride_ob, stride_oh, stride_om, stride_od,
                        HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr,
                        SPLITS: tl.constexpr):
    """Merge the KV splits of the decode form: ``o = sum_s w_s o_s / sum_s w_s``, ``w_s = 2^(lse2_s - max)``.
    Partials are ``(splits, B*H, Sq, D)`` fp32 (contiguous), their lse2 ``(splits, B*H, Sq)``; a row with no
    visible key in any split gets 0 and ``lse2 = -inf``. Grid ``(cdiv(B * H * Sq, BLOCK_R),)``. ``SPLITS`` > 0:
    the split count as a constant, the loops unrolled so that every split's loads are issued before the first
    is used (0: ``splits`` at run time, a loop)."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < BH * Sq
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    m = tl.full([BLOCK_R], float("-inf"), tl.float32)
    if SPLITS > 0:
        for s in tl.static_range(SPLITS):
            m = tl.maximum(m, _combine_lse(part_lse_ptr, s, BH, Sq, rows, row_ok))
    else:
        for s in range(0, splits):
            m = tl.maximum(m, _combine_lse(part_lse_ptr, s, BH, Sq, rows, row_ok))
    m_use = tl.where(m == float("-inf"), 0.0, m)
    total = tl.zeros([BLOCK_R], tl.float32)
    acc = tl.zeros([BLOCK_R, BLOCK_D], tl.float32)
    if SPLITS > 0:
        for s in tl.static_range(SPLITS):
            w, term = _combine_term(part_ptr, part_lse_ptr, s, BH, Sq, rows, row_ok, offs_d, d_ok, m_use, HEAD_DIM)
            acc += term
            total += w
    else:
        for s in range(0, splits):
            w, term = _combine_term(part_ptr, part_lse_ptr, s, BH, Sq, rows, row_ok, offs_d, d_ok, m_use, HEAD_DIM)
            acc += term
            total += w
    empty = total == 0.0
    out = acc / tl.where(empty, 1.0, total)[:, None]
    tl.store(lse_ptr + rows, tl.where(empty, float("-inf"), m_use + tl.log2(tl.where(empty, 1.0, total))), mask=row_ok)
    bh = rows // Sq
    o_rows = o_ptr + (bh // H).to(tl.int64) * stride_ob + (bh % H).to(tl.int64) * stride_oh + (rows % Sq) * stride_om
    tl.store(o_rows[:, None] + offs_d[None, :] * stride_od, out.to(o_ptr.dtype.element_ty),
             mask=row_ok[:, None] & d_ok[None, :])


# ============================================================================================= backward
@triton.jit
def attn_bwd_preprocess_kernel(o_ptr, do_ptr, delta_ptr, H, Sq,
                               stride_ob, stride_oh, stride_om, stride_od,
                               stride_dob, stride_doh, stride_dom, stride_dod,
                               HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr):
    """delta[b*H + h, i] = sum_d dO[b, h, i, d] * O[b, h, i, d] (fp32): the row term of the softmax's
    backward, ``dS = P * (dP - delta)`` (with dropout too: O already holds the dropped probabilities)."""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    ok = (rows < Sq)[:, None] & (offs_d < HEAD_DIM)[None, :]
    o = tl.load(o_ptr + b * stride_ob + h * stride_oh + rows[:, None] * stride_om + offs_d[None, :] * stride_od,
                mask=ok, other=0.0).to(tl.float32)
    do = tl.load(do_ptr + b * stride_dob + h * stride_doh + rows[:, None] * stride_dom + offs_d[None, :] * stride_dod,
                 mask=ok, other=0.0).to(tl.float32)
    tl.store(delta_ptr + pid_bh.to(tl.int64) * Sq + rows, tl.sum(o * do, 1), mask=rows < Sq)


@triton.jit
def _bwd_kv_tile(dk, dv, k, v, q_base, do_base, lse_base, delta_base, dq_base, tile, b, h, bh, k_idx, Sq, Sk,
                 sm_scale, softcap, diag, lo_off, hi_off, dropout_p, seed,
                 mask_ptr, stride_mb, stride_mh, stride_mm, stride_mn, alibi_ptr, stride_ab, stride_ah,
                 stride_qm, stride_qd, stride_dom, stride_dod, stride_dqm, stride_dqd,
                 HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, MASKED: tl.constexpr,
                 SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, MASK_KIND: tl.constexpr, SCORE_MOD: tl.constexpr,
                 SCORE_MOD_GRAD: tl.constexpr, DROPOUT: tl.constexpr, ATOMIC_DQ: tl.constexpr,
                 DOT_F32: tl.constexpr, INPUT_PRECISION: tl.constexpr):
    """One query tile against this program's K/V tile, in the transposed frame (``s^T``: keys x queries)."""
    offs_m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    ld_mask = (offs_d[None, :] < HEAD_DIM) & (offs_m[:, None] < Sq)
    q = tl.load(q_base + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd, mask=ld_mask, other=0.0)
    do = tl.load(do_base + offs_m[:, None] * stride_dom + offs_d[None, :] * stride_dod, mask=ld_mask, other=0.0)
    lse2 = tl.load(lse_base + offs_m, mask=offs_m < Sq, other=float("inf"))
    lse2 = tl.where(lse2 == float("-inf"), float("inf"), lse2)  # a fully masked row: no probability anywhere
    delta = tl.load(delta_base + offs_m, mask=offs_m < Sq, other=0.0)
    in_dtype = q.dtype
    if DOT_F32:
        q = q.to(tl.float32)
        do = do.to(tl.float32)
    qk_t = tl.dot(k, tl.trans(q), input_precision=INPUT_PRECISION)
    q_idx = offs_m[None, :]
    s_t, pre, t = score_tile(qk_t, b, h, q_idx, k_idx, Sq, Sk, sm_scale, softcap, diag, lo_off, hi_off,
                             mask_ptr, stride_mb, stride_mh, stride_mm, stride_mn, alibi_ptr, stride_ab, stride_ah,
                             MASKED, SOFTCAP, ALIBI, MASK_KIND, SCORE_MOD)
    p_t = tl.exp2(s_t * 1.4426950408889634 - lse2[None, :])
    dp_t = tl.dot(v, tl.trans(do), input_precision=INPUT_PRECISION)
    if DROPOUT:
        keep = dropout_keep(seed, bh, q_idx, k_idx, Sk, dropout_p)
        scale = 1.0 / (1.0 - dropout_p)
        pd_t = tl.where(keep, p_t * scale, 0.0)
        dp_t = tl.where(keep, dp_t * scale, 0.0)
    else:
        pd_t = p_t
    pd_t = pd_t.to(in_dtype)
    if DOT_F32:
        pd_t = pd_t.to(tl.float32)
    dv = tl.dot(pd_t, do, dv, input_precision=INPUT_PRECISION)
    ds_t = p_t * (dp_t - delta[None, :])
    ds_t = score_grad(ds_t, b, h, q_idx, k_idx, pre, t, alibi_ptr, SOFTCAP, ALIBI, SCORE_MOD_GRAD)
    ds_t = ds_t.to(in_dtype)
    if DOT_F32:
        ds_t = ds_t.to(tl.float32)
    dk = tl.dot(ds_t, q, dk, input_precision=INPUT_PRECISION)
    if ATOMIC_DQ:
        dq = tl.dot(tl.trans(ds_t), k, input_precision=INPUT_PRECISION) * sm_scale
        tl.atomic_add(dq_base + offs_m[:, None] * stride_dqm + offs_d[None, :] * stride_dqd, dq, mask=ld_mask,
                      sem="relaxed")
    return dk, dv


@triton.jit
def attn_bwd_dkdv_kernel(
        q_ptr, k_ptr, v_ptr, do_ptr, dk_ptr, dv_ptr, dq_ptr, lse_ptr, delta_ptr, mask_ptr, alibi_ptr,
        stride_qb, stride_qh, stride_qm, stride_qd,
        stride_kb, stride_kh, stride_kn, stride_kd,
        stride_vb, stride_vh, stride_vn, stride_vd,
        stride_dob, stride_doh, stride_dom, stride_dod,
        stride_dkb, stride_dkh, stride_dkn, stride_dkd,
        stride_dvb, stride_dvh, stride_dvn, stride_dvd,
        stride_dqb, stride_dqh, stride_dqm, stride_dqd,
        stride_mb, stride_mh, stride_mm, stride_mn,
        stride_ab, stride_ah,
        H, Sq, Sk,
        sm_scale, softcap, diag, lo_off, hi_off, dropout_p, seed,
        HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        GROUP: tl.constexpr, BAND_LO: tl.constexpr, BAND_HI: tl.constexpr,
        SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, MASK_KIND: tl.constexpr, SCORE_MOD: tl.constexpr,
        SCORE_MOD_GRAD: tl.constexpr, DROPOUT: tl.constexpr, ATOMIC_DQ: tl.constexpr,
        DOT_F32: tl.constexpr, INPUT_PRECISION: tl.constexpr,
        cu_q_ptr=None, cu_k_ptr=None, VARLEN: tl.constexpr = 0):
    """dK and dV of BLOCK_N keys of one (batch, KV head), summed over the GROUP query heads that read them
    (GQA/MQA without atomics). Grid ``(cdiv(Sk, BLOCK_N), B * H_kv)``. With ATOMIC_DQ the program also adds
    its ``dS @ K`` share into the fp32 ``dq`` buffer (one backward pass; the sum's order is the scheduler's);
    otherwise :func:`attn_bwd_dq_kernel` computes dQ in a second, deterministic pass."""
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)
    HK = H // GROUP
    b = pid_bh // HK
    kvh = pid_bh % HK
    if VARLEN:
        total_q = Sq
        q_start, Sq, k_start, Sk = varlen_bounds(cu_q_ptr, cu_k_ptr, b)
        if pid_n * BLOCK_N >= Sk:  # a key block past this sequence's end (Sq == 0 still stores zeros)
            return
        q_ptr += q_start.to(tl.int64) * stride_qm
        do_ptr += q_start.to(tl.int64) * stride_dom
        dq_ptr += q_start.to(tl.int64) * stride_dqm
        k_ptr += k_start.to(tl.int64) * stride_kn
        v_ptr += k_start.to(tl.int64) * stride_vn
        dk_ptr += k_start.to(tl.int64) * stride_dkn
        dv_ptr += k_start.to(tl.int64) * stride_dvn
        diag, lo_off, hi_off = varlen_diagonal(diag, lo_off, hi_off, Sq, Sk, VARLEN)
    b64 = b.to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    kv_ok = (offs_n[:, None] < Sk) & (offs_d[None, :] < HEAD_DIM)
    k = tl.load(k_ptr + b64 * stride_kb + kvh.to(tl.int64) * stride_kh + offs_n[:, None] * stride_kn
                + offs_d[None, :] * stride_kd, mask=kv_ok, other=0.0)
    v = tl.load(v_ptr + b64 * stride_vb + kvh.to(tl.int64) * stride_vh + offs_n[:, None] * stride_vn
                + offs_d[None, :] * stride_vd, mask=kv_ok, other=0.0)
    if DOT_F32:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    k_idx = offs_n[:, None]
    # query i sees key j iff j - hi_off <= i <= j - lo_off
    n_first = pid_n * BLOCK_N
    n_last = tl.minimum(n_first + BLOCK_N, Sk) - 1
    t0, t1, t2, t3 = band_tiles(n_first, n_last, -hi_off, -lo_off, Sq, BLOCK_M)
    if not BAND_LO:  # no left edge: only a ragged last query tile is left, and its rows past Sq carry p = 0
        t2 = t3
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    for g in range(0, GROUP):
        h = kvh * GROUP + g
        bh = b * H + h
        q_base = q_ptr + b64 * stride_qb + h.to(tl.int64) * stride_qh
        do_base = do_ptr + b64 * stride_dob + h.to(tl.int64) * stride_doh
        dq_base = dq_ptr + b64 * stride_dqb + h.to(tl.int64) * stride_dqh
        if VARLEN:  # (H, total_q)
            lse_base = lse_ptr + h.to(tl.int64) * total_q + q_start
            delta_base = delta_ptr + h.to(tl.int64) * total_q + q_start
        else:
            lse_base = lse_ptr + bh.to(tl.int64) * Sq
            delta_base = delta_ptr + bh.to(tl.int64) * Sq
        if BAND_HI:
            for tile in range(t0, t1):
                dk, dv = _bwd_kv_tile(dk, dv, k, v, q_base, do_base, lse_base, delta_base, dq_base, tile, b, h, bh,
                                      k_idx, Sq, Sk, sm_scale, softcap, diag, lo_off, hi_off, dropout_p, seed,
                                      mask_ptr, stride_mb, stride_mh, stride_mm, stride_mn, alibi_ptr, stride_ab,
                                      stride_ah, stride_qm, stride_qd, stride_dom, stride_dod, stride_dqm, stride_dqd,
                                      HEAD_DIM, BLOCK_D, BLOCK_M, True, SOFTCAP, ALIBI, MASK_KIND, SCORE_MOD,
                                      SCORE_MOD_GRAD, DROPOUT, ATOMIC_DQ, DOT_F32, INPUT_PRECISION)
        for tile in range(t1, t2):
            dk, dv = _bwd_kv_tile(dk, dv, k, v, q_base, do_base, lse_base, delta_base, dq_base, tile, b, h, bh,
                                  k_idx, Sq, Sk, sm_scale, softcap, diag, lo_off, hi_off, dropout_p, seed,
                                  mask_ptr, stride_mb, stride_mh, stride_mm, stride_mn, alibi_ptr, stride_ab,
                                  stride_ah, stride_qm, stride_qd, stride_dom, stride_dod, stride_dqm, stride_dqd,
                                  HEAD_DIM, BLOCK_D, BLOCK_M, False, SOFTCAP, ALIBI, MASK_KIND, SCORE_MOD,
                                  SCORE_MOD_GRAD, DROPOUT, ATOMIC_DQ, DOT_F32, INPUT_PRECISION)
        if BAND_LO:
            for tile in range(t2, t3):
                dk, dv = _bwd_kv_tile(dk, dv, k, v, q_base, do_base, lse_base, delta_base, dq_base, tile, b, h, bh,
                                      k_idx, Sq, Sk, sm_scale, softcap, diag, lo_off, hi_off, dropout_p, seed,
                                      mask_ptr, stride_mb, stride_mh, stride_mm, stride_mn, alibi_ptr, stride_ab,
                                      stride_ah, stride_qm, stride_qd, stride_dom, stride_dod, stride_dqm, stride_dqd,
                                      HEAD_DIM, BLOCK_D, BLOCK_M, True, SOFTCAP, ALIBI, MASK_KIND, SCORE_MOD,
                                      SCORE_MOD_GRAD, DROPOUT, ATOMIC_DQ, DOT_F32, INPUT_PRECISION)
    dk = dk * sm_scale
    tl.store(dk_ptr + b64 * stride_dkb + kvh.to(tl.int64) * stride_dkh + offs_n[:, None] * stride_dkn
             + offs_d[None, :] * stride_dkd, dk.to(dk_ptr.dtype.element_ty), mask=kv_ok)
    tl.store(dv_ptr + b64 * stride_dvb + kvh.to(tl.int64) * stride_dvh + offs_n[:, None] * stride_dvn
             + offs_d[None, :] * stride_dvd, dv.to(dv_ptr.dtype.element_ty), mask=kv_ok)


@triton.jit
def _bwd_q_tile(dq, q, do, lse2, delta, k_base, v_base, tile, b, h, bh, q_idx, Sq, Sk,
                sm_scale, softcap, diag, lo_off, hi_off, dropout_p, seed,
                mask_ptr, stride_mb, stride_mh, stride_mm, stride_mn, alibi_ptr, stride_ab, stride_ah,
                stride_kn, stride_kd, stride_vn, stride_vd,
                HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr,
                SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, MASK_KIND: tl.constexpr, SCORE_MOD: tl.constexpr,
                SCORE_MOD_GRAD: tl.constexpr, DROPOUT: tl.constexpr, DOT_F32: tl.constexpr,
                INPUT_PRECISION: tl.constexpr):
    offs_n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    kv_mask = (offs_d[None, :] < HEAD_DIM) & (offs_n[:, None] < Sk)
    k = tl.load(k_base + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd, mask=kv_mask, other=0.0)
    v = tl.load(v_base + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd, mask=kv_mask, other=0.0)
    in_dtype = k.dtype
    if DOT_F32:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    qk = tl.dot(q, tl.trans(k), input_precision=INPUT_PRECISION)
    k_idx = offs_n[None, :]
    s, pre, t = score_tile(qk, b, h, q_idx, k_idx, Sq, Sk, sm_scale, softcap, diag, lo_off, hi_off,
                           mask_ptr, stride_mb, stride_mh, stride_mm, stride_mn, alibi_ptr, stride_ab, stride_ah,
                           MASKED, SOFTCAP, ALIBI, MASK_KIND, SCORE_MOD)
    p = tl.exp2(s * 1.4426950408889634 - lse2[:, None])
    dp = tl.dot(do, tl.trans(v), input_precision=INPUT_PRECISION)
    if DROPOUT:
        keep = dropout_keep(seed, bh, q_idx, k_idx, Sk, dropout_p)
        dp = tl.where(keep, dp * (1.0 / (1.0 - dropout_p)), 0.0)
    ds = p * (dp - delta[:, None])
    ds = score_grad(ds, b, h, q_idx, k_idx, pre, t, alibi_ptr, SOFTCAP, ALIBI, SCORE_MOD_GRAD)
    ds = ds.to(in_dtype)
    if DOT_F32:
        ds = ds.to(tl.float32)
    return tl.dot(ds, k, dq, input_precision=INPUT_PRECISION)


@triton.jit
def attn_bwd_dq_kernel(
        q_ptr, k_ptr, v_ptr, do_ptr, dq_ptr, lse_ptr, delta_ptr, mask_ptr, alibi_ptr,
        stride_qb, stride_qh, stride_qm, stride_qd,
        stride_kb, stride_kh, stride_kn, stride_kd,
        stride_vb, stride_vh, stride_vn, stride_vd,
        stride_dob, stride_doh, stride_dom, stride_dod,
        stride_dqb, stride_dqh, stride_dqm, stride_dqd,
        stride_mb, stride_mh, stride_mm, stride_mn,
        stride_ab, stride_ah,
        H, Sq, Sk,
        sm_scale, softcap, diag, lo_off, hi_off, dropout_p, seed,
        HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        GROUP: tl.constexpr, BAND_LO: tl.constexpr, BAND_HI: tl.constexpr,
        SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, MASK_KIND: tl.constexpr, SCORE_MOD: tl.constexpr,
        SCORE_MOD_GRAD: tl.constexpr, DROPOUT: tl.constexpr, DOT_F32: tl.constexpr,
        INPUT_PRECISION: tl.constexpr,
        cu_q_ptr=None, cu_k_ptr=None, VARLEN: tl.constexpr = 0):
    """dQ of BLOCK_M query rows of one (batch, head): the deterministic second pass (each dQ row is summed by
    one program in key order). Grid ``(cdiv(Sq, BLOCK_M), B * H)``."""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    kvh = h // GROUP
    if VARLEN:
        total_q = Sq
        q_start, Sq, k_start, Sk = varlen_bounds(cu_q_ptr, cu_k_ptr, b)
        if pid_m * BLOCK_M >= Sq:
            return
        q_ptr += q_start.to(tl.int64) * stride_qm
        do_ptr += q_start.to(tl.int64) * stride_dom
        dq_ptr += q_start.to(tl.int64) * stride_dqm
        k_ptr += k_start.to(tl.int64) * stride_kn
        v_ptr += k_start.to(tl.int64) * stride_vn
        diag, lo_off, hi_off = varlen_diagonal(diag, lo_off, hi_off, Sq, Sk, VARLEN)
    b64 = b.to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    ld_mask = (offs_m[:, None] < Sq) & (offs_d[None, :] < HEAD_DIM)
    q = tl.load(q_ptr + b64 * stride_qb + h.to(tl.int64) * stride_qh + offs_m[:, None] * stride_qm
                + offs_d[None, :] * stride_qd, mask=ld_mask, other=0.0)
    do = tl.load(do_ptr + b64 * stride_dob + h.to(tl.int64) * stride_doh + offs_m[:, None] * stride_dom
                 + offs_d[None, :] * stride_dod, mask=ld_mask, other=0.0)
    if VARLEN:  # (H, total_q)
        lse2 = tl.load(lse_ptr + h.to(tl.int64) * total_q + q_start + offs_m, mask=offs_m < Sq, other=float("inf"))
    else:
        lse2 = tl.load(lse_ptr + pid_bh.to(tl.int64) * Sq + offs_m, mask=offs_m < Sq, other=float("inf"))
    lse2 = tl.where(lse2 == float("-inf"), float("inf"), lse2)
    if VARLEN:
        delta = tl.load(delta_ptr + h.to(tl.int64) * total_q + q_start + offs_m, mask=offs_m < Sq, other=0.0)
    else:
        delta = tl.load(delta_ptr + pid_bh.to(tl.int64) * Sq + offs_m, mask=offs_m < Sq, other=0.0)
    if DOT_F32:
        q = q.to(tl.float32)
        do = do.to(tl.float32)
    k_base = k_ptr + b64 * stride_kb + kvh.to(tl.int64) * stride_kh
    v_base = v_ptr + b64 * stride_vb + kvh.to(tl.int64) * stride_vh
    q_idx = offs_m[:, None]
    m_first = pid_m * BLOCK_M
    m_last = tl.minimum(m_first + BLOCK_M, Sq) - 1
    t0, t1, t2, t3 = band_tiles(m_first, m_last, lo_off, hi_off, Sk, BLOCK_N)
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    if BAND_LO:
        for tile in range(t0, t1):
            dq = _bwd_q_tile(dq, q, do, lse2, delta, k_base, v_base, tile, b, h, pid_bh, q_idx, Sq, Sk,
                             sm_scale, softcap, diag, lo_off, hi_off, dropout_p, seed,
                             mask_ptr, stride_mb, stride_mh, stride_mm, stride_mn, alibi_ptr, stride_ab, stride_ah,
                             stride_kn, stride_kd, stride_vn, stride_vd,
                             HEAD_DIM, BLOCK_D, BLOCK_N, True, SOFTCAP, ALIBI, MASK_KIND, SCORE_MOD, SCORE_MOD_GRAD,
                             DROPOUT, DOT_F32, INPUT_PRECISION)
    for tile in range(t1, t2):
        dq = _bwd_q_tile(dq, q, do, lse2, delta, k_base, v_base, tile, b, h, pid_bh, q_idx, Sq, Sk,
                         sm_scale, softcap, diag, lo_off, hi_off, dropout_p, seed,
                         mask_ptr, stride_mb, stride_mh, stride_mm, stride_mn, alibi_ptr, stride_ab, stride_ah,
                         stride_kn, stride_kd, stride_vn, stride_vd,
                         HEAD_DIM, BLOCK_D, BLOCK_N, False, SOFTCAP, ALIBI, MASK_KIND, SCORE_MOD, SCORE_MOD_GRAD,
                         DROPOUT, DOT_F32, INPUT_PRECISION)
    for tile in range(t2, t3):
        dq = _bwd_q_tile(dq, q, do, lse2, delta, k_base, v_base, tile, b, h, pid_bh, q_idx, Sq, Sk,
                         sm_scale, softcap, diag, lo_off, hi_off, dropout_p, seed,
                         mask_ptr, stride_mb, stride_mh, stride_mm, stride_mn, alibi_ptr, stride_ab, stride_ah,
                         stride_kn, stride_kd, stride_vn, stride_vd,
                         HEAD_DIM, BLOCK_D, BLOCK_N, True, SOFTCAP, ALIBI, MASK_KIND, SCORE_MOD, SCORE_MOD_GRAD,
                         DROPOUT, DOT_F32, INPUT_PRECISION)
    dq = dq * sm_scale
    tl.store(dq_ptr + b64 * stride_dqb + h.to(tl.int64) * stride_dqh + offs_m[:, None] * stride_dqm
             + offs_d[None, :] * stride_dqd, dq.to(dq_ptr.dtype.element_ty), mask=ld_mask)


@triton.jit
def dropout_keep_kernel(out_ptr, H, Sq, Sk, dropout_p, seed, BLOCK: tl.constexpr):
    """The keep mask (B*H, Sq, Sk) as uint8, the forward's and backward's draw exactly (tests, debugging)."""
    bh = tl.program_id(1)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < Sq * Sk
    keep = dropout_keep(seed, bh, offs // Sk, offs % Sk, Sk, dropout_p)
    tl.store(out_ptr + bh.to(tl.int64) * Sq * Sk + offs, keep.to(tl.uint8), mask=ok)
