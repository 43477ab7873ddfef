"""The decomposition table's contract with AOTAutograd: a decomposition returns every output its op returns.

AOTAutograd records an op's backward, with the op's outputs as its saved values, before the decomposition runs
below autograd; a decomposition whose second output differs from the op's (SDPA's CPU op returned attention
weights where the op returns its logsumexp) makes the backward read the wrong values: every transformer's
gradients were off by 10-1000x while the forward matched. So every multi-output entry of the table is run
here against its op, output by output, in float64; the few ops that cannot be sampled are listed with why.
"""
from __future__ import annotations

import pytest
import torch

from tilefuse.compiler.decompositions import EXCLUDED, decomposition_table

aten = torch.ops.aten
F64 = torch.float64


def _r(*shape):
    return torch.randn(*shape, dtype=F64)


def _bn_args(training: bool):
    x, w, b = _r(4, 3, 5, 5), _r(3).abs() + 0.5, _r(3)
    return (x, w, b, torch.zeros(3, dtype=F64), torch.ones(3, dtype=F64), training, 0.1, 1e-5)


def _samples():
    """(op, args, kwargs) for every multi-output op of the table whose outputs a backward may read."""
    q, k, v = _r(2, 3, 5, 8), _r(2, 3, 6, 8), _r(2, 3, 6, 8)
    yield aten.native_batch_norm.default, _bn_args(True), {}
    yield aten.native_batch_norm.default, _bn_args(False), {}
    yield aten._native_batch_norm_legit_functional.default, _bn_args(True), {}
    args = _bn_args(False)
    yield aten._native_batch_norm_legit_no_training.default, args[:5] + args[6:], {}
    yield aten._native_batch_norm_legit.no_stats, (args[0], args[1], args[2], True, 0.1, 1e-5), {}
    yield aten.native_group_norm.default, (_r(4, 6, 5), _r(6), _r(6), 4, 6, 5, 3, 1e-5), {}
    yield aten.native_layer_norm.default, (_r(4, 3, 5), [3, 5], _r(3, 5), _r(3, 5), 1e-5), {}
    if hasattr(aten, "_fused_rms_norm"):
        yield aten._fused_rms_norm.default, (_r(4, 7), [7], _r(7), 1e-6), {}
    yield aten.max_pool1d_with_indices.default, (_r(2, 3, 9), [3], [2]), {}
    yield aten.adaptive_max_pool1d.default, (_r(2, 3, 9), [4]), {}
    yield aten.log_sigmoid_forward.default, (_r(3, 4),), {}
    target = torch.tensor([0, 1, 4, 2])
    yield aten.nll_loss_forward.default, (_r(4, 5).log_softmax(-1), target, None, 1, -100), {}
    yield aten.nll_loss_forward.default, (_r(4, 5).log_softmax(-1), target, _r(5).abs(), 2, 1), {}
    yield aten.nll_loss2d_forward.default, (_r(2, 5, 3, 3).log_softmax(1), torch.randint(0, 5, (2, 3, 3)), None,
                                            1, -100), {}
    yield aten._weight_norm_interface.default, (_r(4, 3), _r(4, 1), 0), {}
    yield aten.aminmax.default, (_r(4, 5),), {"dim": 1}
    yield aten.std_mean.correction, (_r(4, 5),), {"dim": [1]}
    yield aten.std_mean.default, (_r(4, 5),), {}
    yield aten.std_mean.dim, (_r(4, 5), [0]), {}
    yield aten.var_mean.default, (_r(4, 5),), {}
    yield aten.var_mean.dim, (_r(4, 5), [1]), {"keepdim": True}
    # p = 0 and p = 1 make the random mask certain, so the op and its decomposition can be compared
    yield aten.native_dropout.default, (_r(4, 5), 0.0, True), {}
    yield aten.native_dropout.default, (_r(4, 5), 1.0, True), {}
    yield aten.native_dropout.default, (_r(4, 5), 0.3, False), {}
    bag = (_r(10, 3), torch.tensor([1, 2, 4, 5, 4, 3, 2, 9]), torch.tensor([0, 4]), False)
    for mode in (0, 1, 2):
        yield aten.embedding_bag.default, bag + (mode,), {}
        yield aten.embedding_bag.padding_idx, bag + (mode, False, None, False, 4), {}
    yield aten.lstm_cell.default, (_r(2, 3), [_r(2, 4), _r(2, 4)], _r(16, 3), _r(16, 4), _r(16), _r(16)), {}
    yield aten.gru_cell.default, (_r(2, 3), _r(2, 4), _r(12, 3), _r(12, 4), _r(12), _r(12)), {}
    # the excluded ones: asserted below to differ, so the exclusion is still needed
    yield aten._scaled_dot_product_flash_attention_for_cpu.default, (q, k, v), {"is_causal": True}
    yield aten.multilabel_margin_loss_forward.default, (_r(3, 4), torch.tensor([[3, 0, -1, 1], [0, 1, 2, 3],
                                                                                 [0, -1, 1, 2]]), 1), {}


# Multi-output ops of the table not sampled above, and why no backward can read a wrong output of theirs.
NOT_SAMPLED = {
    "linear algebra (eigh, svd, qr, lu, ldl, slogdet, solve_ex, _lu_with_info)":
        ("linalg_", "svd", "qr", "_lu_with_info", "slogdet"),
    "backward ops (their outputs are gradients, compared by every training test)": ("_backward",),
    "quantization and sparse packing (no autograd)": ("quantized::", "quantized_", "sparse::", "choose_qparams",
                                                      "_choose_qparams", "fbgemm_", "_rowwise_prune"),
    "random and histogram ops (no gradient)": ("_sobol_engine_draw", "histogramdd"),
    "whole RNN layers (decomposed above autograd: the backward is derived from the cells)":
        ("aten::lstm.", "aten::gru.", "aten::rnn_tanh.", "aten::rnn_relu.", "_pad_packed_sequence"),
    "cudnn batch norm (a CUDA-only op, the same decomposition as native_batch_norm)": ("cudnn_batch_norm",),
    "SDPA's math op (composite: the backward is derived from its decomposition)":
        ("_scaled_dot_product_attention_math",),
}


def _multi_output_ops(table):
    for op in table:
        if isinstance(op, torch._ops.OpOverload) and len(op._schema.returns) > 1 and not op._schema.is_mutable:
            yield op


def _label(op):
    return f"{op._schema.name}.{op._overloadname}"


SAMPLES = list(_samples())


def test_every_multi_output_decomposition_is_sampled_or_exempt():
    sampled = {op for op, _, _ in SAMPLES}
    missing = []
    for op in _multi_output_ops(decomposition_table()):
        name = _label(op)
        if op in sampled or name.endswith(".out") or "_out" in op._overloadname:
            continue
        if any(pat in name for pats in NOT_SAMPLED.values() for pat in pats):
            continue
        missing.append(name)
    assert not missing, (f"multi-output decompositions with no sample comparing every output with the op: "
                         f"{missing}; add a sample to tests/compiler/test_compiler_decompositions.py")


@pytest.mark.parametrize("k", range(len(SAMPLES)), ids=[f"{_label(op)}-{i}" for i, (op, _, _) in enumerate(SAMPLES)])
def test_decomposition_returns_what_the_op_returns(k):
    op, args, kwargs = SAMPLES[k]
    from torch._decomp import core_aten_decompositions, decomposition_table as registry

    excluded = op._opname in EXCLUDED
    table = decomposition_table()
    if excluded:
        assert op not in table, f"{_label(op)} is listed in EXCLUDED but still in the table"
        decompose = core_aten_decompositions().get(op) or registry.get(op)
        if decompose is None:
            pytest.skip(f"this torch has no decomposition of {_label(op)} to exclude")
    else:
        decompose = table.get(op)
        assert decompose is not None, f"{_label(op)} is no longer in the table: drop its sample"
    torch.manual_seed(0)
    want = op(*args, **kwargs)
    got = decompose(*args, **kwargs)
    assert got is not NotImplemented
    want = want if isinstance(want, (tuple, list)) else (want,)
    got = got if isinstance(got, (tuple, list)) else (got,)
    assert len(want) == len(got)
    diffs = []
    for i, (w, g) in enumerate(zip(want, got)):
        if not isinstance(w, torch.Tensor) or w.numel() == 0:  # eager's undefined outputs (eval batch norm)
            continue
        if tuple(w.shape) != tuple(g.shape):
            diffs.append(f"output {i}: shape {tuple(g.shape)}, the op's {tuple(w.shape)}")
        elif w.dtype != g.dtype:
            diffs.append(f"output {i}: dtype {g.dtype}, the op's {w.dtype}")
        elif not torch.allclose(g, w, rtol=1e-9, atol=1e-9, equal_nan=True):
            diffs.append(f"output {i}: max difference {(g.double() - w.double()).abs().max().item():.3g}")
    if excluded:
        assert diffs, f"{_label(op)} is in EXCLUDED ({EXCLUDED[op._opname]}) but its decomposition now matches: " \
                      f"take it out of EXCLUDED"
    else:
        assert not diffs, f"{_label(op)}'s decomposition differs from the op: {diffs}; add it to EXCLUDED"
