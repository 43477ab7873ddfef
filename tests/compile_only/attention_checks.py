"""Cross-compilation of the attention family, run in a child with TILEFUSE_INTERPRET=0 by tests/kernels/attention/test_attention.py
(compiling in an interpreting process fails with triton 3.6). A few registered examples, not the whole space:
the whole space is `tilefuse targets --kernel attention_fwd,...` (the slow matrix test compiles it)."""
import pytest

from tilefuse import device, targets
from tilefuse.kernels import attention  # noqa: F401  (registers the attention kernels)

assert not device.interpreting()

CHECKS = [  # (kernel, example index, target, matrix family)
    ("attention_fwd", 0, "sm_90a", "wgmma"),
    ("attention_fwd", 1, "gfx942", "v_mfma"),
    ("attention_bwd_dkdv", 0, "sm_90a", "wgmma"),
    ("attention_bwd_dkdv", 1, "gfx942", "v_mfma"),
    ("attention_decode", 1, "sm_80", "mma.sync"),
    ("attention_bwd_dq", 0, "gfx90a", "v_mfma"),  # the AMD dots take input_precision="ieee" (tf32 is refused)
    # the fourth option set: a generated score_mod reading its operand vector (ALIBI == 2)
    ("attention_fwd", 3, "sm_90a", "wgmma"),
    ("attention_bwd_dkdv", 3, "gfx942", "v_mfma"),
]


@pytest.mark.parametrize("kernel, index, target, family", CHECKS)
def test_attention_example_compiles_with_matrix_instructions(kernel, index, target, family):
    spec = targets.kernels()[kernel]
    example = spec.examples(target)[index]
    if index == 3:
        assert "operands" in example.label, example.label
    result = targets.compile_example(spec, example, target)
    assert result.ok, f"{example.label}: {result.error}"
    assert result.mma == family
    if targets.vendor_of(target) == "amd":
        assert example.options.get("waves_per_eu", 0) >= 1
    else:
        assert "waves_per_eu" not in example.options


def test_every_kernel_of_the_family_is_registered():
    names = {n for n, s in targets.kernels().items() if s.family == "attention"}
    assert names == {"attention_fwd", "attention_decode", "attention_bwd_dkdv", "attention_bwd_dkdv_d256",
                     "attention_bwd_dq", "attention_aux", "attention_combine", "attention_fwd_varlen",
                     "attention_bwd_dkdv_varlen", "attention_bwd_dkdv_varlen_d256", "attention_bwd_dq_varlen"}
