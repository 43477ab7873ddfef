"""Cross-compilation of the attention family's VARLEN kernels, run in a child with TILEFUSE_INTERPRET=0 by
tests/kernels/attention/test_attention_varlen.py (compiling in an interpreting process fails with triton 3.6). A few registered
examples, not the whole space: the whole space is `tilefuse targets --kernel attention_fwd_varlen,...`."""
import pytest

from tilefuse import device, targets
from tilefuse.kernels import attention  # noqa: F401  (registers the attention kernels)

assert not device.interpreting()

CHECKS = [  # (kernel, example index, target, matrix family): index 0 top-left, 1 bottom-right
    ("attention_fwd_varlen", 0, "sm_90a", "wgmma"),
    ("attention_fwd_varlen", 1, "gfx942", "v_mfma"),
    ("attention_fwd_varlen", 2, "sm_80", "mma.sync"),
    ("attention_bwd_dkdv_varlen", 0, "sm_90a", "wgmma"),
    ("attention_bwd_dkdv_varlen", 1, "gfx942", "v_mfma"),
    ("attention_bwd_dq_varlen", 1, "sm_90a", "wgmma"),
    ("attention_bwd_dq_varlen", 0, "gfx942", "v_mfma"),
]


@pytest.mark.parametrize("kernel, index, target, family", CHECKS)
def test_varlen_example_compiles_with_matrix_instructions(kernel, index, target, family):
    spec = targets.kernels()[kernel]
    example = spec.examples(target)[index]
    assert example.constexprs["VARLEN"] in (1, 2) and example.signature["cu_q_ptr"] == "*i32"
    result = targets.compile_example(spec, example, target)
    assert result.ok, f"{example.label}: {result.error}"
    assert result.mma == family


VARLEN_OF = {"attention_fwd": "attention_fwd_varlen", "attention_bwd_dkdv": "attention_bwd_dkdv_varlen",
             "attention_bwd_dkdv_d256": "attention_bwd_dkdv_varlen_d256", "attention_bwd_dq": "attention_bwd_dq_varlen"}


@pytest.mark.parametrize("kernel", sorted(VARLEN_OF))
def test_every_config_has_a_varlen_example(kernel):
    """Each varlen kernel compiles the same configs as its non-varlen kernel, on every target."""
    for target in targets.ALL_TARGETS:
        plain = targets.kernels()[kernel].examples(target)
        varlen = targets.kernels()[VARLEN_OF[kernel]].examples(target)
        assert [e.options for e in varlen] == [e.options for e in plain]
        assert [(e.constexprs["BLOCK_M"], e.constexprs["BLOCK_N"]) for e in varlen] == \
            [(e.constexprs["BLOCK_M"], e.constexprs["BLOCK_N"]) for e in plain]
        assert all(e.constexprs["VARLEN"] == 0 and e.constexprs["cu_q_ptr"] is None for e in plain)
        assert {e.constexprs["VARLEN"] for e in varlen} == ({1, 2} if len(varlen) > 1 else {1})
