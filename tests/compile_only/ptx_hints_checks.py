"""Cross-compilation checks of the evict-first hint on B's TMA loads (tilefuse.kernels.ptx_hints). Run in a child
process with TILEFUSE_INTERPRET=0 by tests/kernels/test_ptx_hints.py: compiling in an interpreting process fails with
triton 3.6."""
import re

import pytest
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from tilefuse.kernels import ptx_hints
from tilefuse.kernels.gemm import targets as gemm_targets
from tilefuse.kernels.gemm.configs import GemmConfig
from tilefuse.targets import _attrs_for, cubin_resources

TARGETS = {"sm_90a": GPUTarget("cuda", 90, 32), "sm_100a": GPUTarget("cuda", 100, 32)}


def _compile(label, target="sm_90a", b_t=False):
    cfg = GemmConfig.from_label(label)
    fn, ex = gemm_targets.example_for(cfg, target, b_t=b_t)
    src = ASTSource(fn, ex.signature, constexprs=ex.constexprs, attrs=_attrs_for(fn, ex))
    return ex, triton.compile(src, target=TARGETS[target], options=dict(ex.options))


def _loads(ptx):
    """(tensor-map index, hinted) of every TMA load in the PTX."""
    regs = ptx_hints.descriptor_registers(ptx)
    out = []
    for line in ptx.splitlines():
        m = re.search(r"cp\.async\.bulk\.tensor\.\S+ \[[^\]]+\], \[(%rd\d+),", line)
        if m:
            out.append((regs.get(m.group(1)), ".L2::cache_hint" in line))
    return out


@pytest.mark.parametrize("label, b_t", [("T64x128x64-w4-s8-tma", False), ("T128x128x64-w4-s7-tma", True),
                                        ("P128x128x64-w4-s6-tma", False), ("T64x128x128-w4-s4-k2-tma", False)])
def test_only_b_loads_are_hinted_and_ptxas_takes_them(label, b_t):
    ex, plain = _compile(label, b_t=b_t)
    assert ex.constexprs["B_HINT"] is False and ptx_hints.MARKER not in plain.asm["ptx"]
    ex, hinted = _compile(label + "-ef", b_t=b_t)
    assert ex.constexprs["B_HINT"] is True
    ptx = hinted.asm["ptx"]
    assert ptx_hints.MARKER in ptx
    loads = _loads(ptx)
    # every load of B (the second tensor map) hinted, none of A's; the same loads as without the hint
    assert {i for i, _ in loads} == {0, 1}
    assert all(h == (i == 1) for i, h in loads), loads
    assert [i for i, _ in loads] == [i for i, _ in _loads(plain.asm["ptx"])]
    assert ptx.count("createpolicy.fractional.L2::evict_first.b64") == 1 and "evict_last" not in ptx
    assert len(hinted.asm["cubin"]) > 0
    # the same kernel otherwise: the hint adds the policy register, nothing else (no spill, the same smem)
    res, res_plain = cubin_resources(hinted.asm["cubin"]), cubin_resources(plain.asm["cubin"])
    assert res["REG"] <= res_plain["REG"] + 2 and res.get("LOCAL", 0) == res_plain.get("LOCAL", 0) == 0
    assert hinted.metadata.shared == plain.metadata.shared


def test_blackwell_takes_the_hint_too():
    _, hinted = _compile("T64x128x64-w4-s8-tma-ef", target="sm_100a")
    loads = _loads(hinted.asm["ptx"])
    assert loads and all(h == (i == 1) for i, h in loads), loads
