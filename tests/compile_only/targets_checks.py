"""Cross-compilation checks on a small matmul kernel defined here. Run in a child process with
TILEFUSE_INTERPRET=0 by tests/test_targets.py: compiling in an interpreting process fails with triton 3.6."""
import pytest
import triton.language as tl
from triton.runtime.jit import JITFunction

from tilefuse import targets


def _tile_matmul(a_ptr, b_ptr, c_ptr, M, N, K, BLOCK: tl.constexpr):
    rm = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    rn = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    rk = tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK, BLOCK), tl.float32)
    for k in range(0, K, BLOCK):
        a = tl.load(a_ptr + rm[:, None] * K + (k + rk)[None, :])
        b = tl.load(b_ptr + (k + rk)[:, None] * N + rn[None, :])
        acc = tl.dot(a, b, acc)
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc.to(tl.float16))


def _scale(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)


# Real JITFunctions even when this process runs on the interpreter: the machinery compiles, never launches.
MATMUL = JITFunction(_tile_matmul)
SCALE = JITFunction(_scale)
MATMUL_SIG = {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp16", "M": "i32", "N": "i32", "K": "i32", "BLOCK": "constexpr"}


def _matmul_examples(target):
    opts = {"num_warps": 4, "num_stages": 2 if targets.vendor_of(target) == "amd" else 3}
    return [targets.Example("fp16 64", MATMUL_SIG, {"BLOCK": 64}, opts, divisible=("M", "N", "K"))]


SPEC = targets.KernelSpec("test_matmul", "test", MATMUL, _matmul_examples,
                          expect_mma={"sm_80": "mma.sync", "sm_90a": "wgmma", "gfx942": "v_mfma"})


@pytest.mark.parametrize("target, family", [("sm_80", "mma.sync"), ("sm_90a", "wgmma"), ("sm_100a", "tcgen05"),
                                            ("gfx90a", "v_mfma"), ("gfx942", "v_mfma"), ("gfx950", "v_mfma")])
def test_matmul_compiles_with_the_target_matrix_instructions(target, family):
    result = targets.compile_example(SPEC, _matmul_examples(target)[0], target)
    assert result.ok, result.error
    assert result.mma == family
    assert result.shared_bytes and result.shared_bytes > 0
    assert result.registers and result.registers > 0
    assert result.spills == 0
    assert result.launch["BLOCK"] == 64 and result.launch["num_warps"] == 4


def test_missing_matrix_instructions_fail_the_cell():
    spec = targets.KernelSpec("scale", "test", SCALE, lambda t: [], expect_mma={"sm_90a": "wgmma"})
    ex = targets.Example("fp32", {"x_ptr": "*fp32", "y_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"},
                         {"BLOCK": 1024}, {"num_warps": 4})
    result = targets.compile_example(spec, ex, "sm_90a")
    assert not result.ok and "expected wgmma" in result.error and result.mma == "none"


def test_a_compile_error_is_a_row_not_an_exception():
    ex = targets.Example("bad", dict(MATMUL_SIG, a_ptr="*fp16", BLOCK="constexpr"), {"BLOCK": 3}, {"num_warps": 4})
    result = targets.compile_example(SPEC, ex, "sm_80")
    assert not result.ok and result.error
