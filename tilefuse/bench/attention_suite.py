"""``tilefuse bench attention``: the Triton flash-attention family vs every attention PyTorch ships.

Implementations, timed in this process on the same inputs (q/k/v read from (B, S, H, D) buffers, as models
hold them):

- ``tilefuse``: :func:`tilefuse.kernels.attention.attention` (``tilefuse-deterministic``: its backward with
  the dQ pass instead of atomics);
- ``sdpa-cudnn`` / ``sdpa-flash`` / ``sdpa-efficient``: ``F.scaled_dot_product_attention`` pinned to one
  backend with ``torch.nn.attention.sdpa_kernel`` (a backend that refuses a case is a "not run" row);
- ``flex``: ``torch.compile(flex_attention)`` with a causal ``BlockMask``;
- ``inductor``: ``torch.compile`` of the plain-PyTorch form ``softmax(q k^T * scale + mask) @ v``.

FLOPs follow FlashAttention's convention: forward ``4 * B * H * Sq * Sk * D``, halved when causal; backward
2.5x the forward (the backward row times the backward alone, ``autograd.grad`` of a kept graph). Decode rows
also report GB/s: reading K and V once is the whole cost. ``baseline`` is ``sdpa-flash``.

Every implementation's output (and gradients) is checked first against the float32 SDPA of the same inputs.
``--smoke`` (no GPU): tiny shapes in float32 on the interpreter, tilefuse against SDPA's math path; the
GPU-only backends and the compiled ones are "not run" rows.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import torch
import torch.nn.functional as F

from . import harness, runner

SUITE = "attention"
BASELINE = "sdpa-flash"
CHECK_TOLERANCE = {torch.bfloat16: 2e-2, torch.float16: 5e-3, torch.float32: 1e-4}
SDPA_BACKENDS = {"sdpa-cudnn": "CUDNN_ATTENTION", "sdpa-flash": "FLASH_ATTENTION",
                 "sdpa-efficient": "EFFICIENT_ATTENTION"}


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    B: int
    H: int
    H_kv: int
    Sq: int
    Sk: int
    D: int
    causal: bool
    backward: bool = True

    @property
    def shape(self) -> str:
        return f"B{self.B} H{self.H}/{self.H_kv} Sq{self.Sq} Sk{self.Sk} D{self.D}{' causal' if self.causal else ''}"

    def fwd_flops(self) -> float:
        f = 4.0 * self.B * self.H * self.Sq * self.Sk * self.D
        return f / 2 if self.causal else f

    def kv_bytes(self, dtype) -> float:
        return 2.0 * self.B * self.H_kv * self.Sk * self.D * torch.finfo(dtype).bits / 8


CASES = (
    Case("mha-16k", 1, 16, 16, 16384, 16384, 128, causal=False),
    Case("mha-16k-causal", 1, 16, 16, 16384, 16384, 128, causal=True),
    Case("llama-prefill-gqa", 1, 32, 8, 4096, 4096, 128, causal=True),  # Llama-3-8B heads, a 4k prompt
    Case("decode-gqa", 8, 32, 8, 1, 8192, 128, causal=False, backward=False),  # one token, an 8k cache
)
QUICK = ("mha-16k-causal", "llama-prefill-gqa", "decode-gqa")
SMOKE_CASES = (
    Case("mha-smoke", 1, 2, 2, 65, 65, 32, causal=True),
    Case("decode-smoke", 1, 4, 2, 1, 97, 32, causal=False, backward=False),
)


def _inputs(case: Case, dtype, device):
    def bshd(H, S):
        return torch.randn(case.B, S, H, case.D, dtype=dtype, device=device).transpose(1, 2).requires_grad_()

    return bshd(case.H, case.Sq), bshd(case.H_kv, case.Sk), bshd(case.H_kv, case.Sk)


def _expand_kv(t, group):
    return t if group == 1 else t.repeat_interleave(group, 1)


# ------------------------------------------------------------------------------------- implementations
def _tilefuse(case, deterministic=False):
    from ..kernels.attention import attention

    return lambda q, k, v: attention(q, k, v, causal=case.causal, deterministic=deterministic)


def _sdpa(case, backend_name):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = getattr(SDPBackend, backend_name)
    gqa = case.H != case.H_kv

    def fn(q, k, v):
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=case.causal, enable_gqa=gqa)

    return fn


def _flex(case):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    compiled = torch.compile(flex_attention, dynamic=False)
    block_mask = None
    if case.causal:
        block_mask = create_block_mask(lambda b, h, q_idx, kv_idx: q_idx >= kv_idx, None, None, case.Sq, case.Sk,
                                       device="cuda")
    gqa = case.H != case.H_kv
    return lambda q, k, v: compiled(q, k, v, block_mask=block_mask, enable_gqa=gqa)


def _inductor(case):
    group = case.H // case.H_kv
    scale = 1.0 / math.sqrt(case.D)

    def plain(q, k, v):
        k, v = _expand_kv(k, group), _expand_kv(v, group)
        s = (q @ k.transpose(-1, -2)).float() * scale
        if case.causal:
            keep = torch.ones(case.Sq, case.Sk, dtype=torch.bool, device=q.device).tril()
            s = s.masked_fill(~keep, float("-inf"))
        return torch.softmax(s, -1).to(q.dtype) @ v

    return torch.compile(plain, dynamic=False)


def _reference(case, q, k, v):
    """float32 SDPA (any backend) of the same inputs, and its gradients for ``dout``."""
    leaves = [t.detach().float().requires_grad_() for t in (q, k, v)]
    group = case.H // case.H_kv
    out = F.scaled_dot_product_attention(leaves[0], _expand_kv(leaves[1], group), _expand_kv(leaves[2], group),
                                         is_causal=case.causal)
    return leaves, out


def _impls(case: Case, smoke: bool) -> list[tuple[str, Callable | None, str]]:
    """(impl, fn or None, why not run)."""
    out: list[tuple[str, Callable | None, str]] = [("tilefuse", _tilefuse(case), "")]
    if case.backward:
        out.append(("tilefuse-deterministic", _tilefuse(case, deterministic=True), ""))
    for name, backend in SDPA_BACKENDS.items():
        out.append((name, None, "smoke run: a GPU backend") if smoke else (name, _sdpa(case, backend), ""))
    if smoke:
        out.append(("sdpa-math", _sdpa(case, "MATH"), ""))
        out += [("flex", None, "smoke run: compiled (Triton on the GPU)"),
                ("inductor", None, "smoke run: compiled (C++ on the CPU, not what is measured)")]
    else:
        out += [("flex", _flex(case), ""), ("inductor", _inductor(case), "")]
    return out


# ----------------------------------------------------------------------------------------------- timing
def _check(fn, case, q, k, v, dout, ref_out, ref_grads, dtype, backward: bool) -> Callable[[], str | None]:
    def check():
        out = fn(q, k, v)
        err = harness.rel_error(out.float(), ref_out)
        tol = CHECK_TOLERANCE[dtype]
        if not err <= tol:
            return f"out rel error {err:.3g} > {tol:g}"
        if backward:
            grads = torch.autograd.grad(out, (q, k, v), dout)
            for name, g, r in zip(("dq", "dk", "dv"), grads, ref_grads):
                e = harness.rel_error(g.float(), r)
                if not e <= tol:
                    return f"{name} rel error {e:.3g} > {tol:g}"
        return None

    return check


def _refused(fn, q, k, v) -> str:
    """Why an SDPA backend pinned with sdpa_kernel refuses these inputs ("" if it runs them)."""
    try:
        with torch.no_grad():
            fn(q, k, v)
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return f"the backend refuses this case ({first[:160]})"
    return ""


def time_case(rec: harness.Recorder, case: Case, opts: runner.SuiteOptions, dtype, device) -> None:
    q, k, v = _inputs(case, dtype, device)
    dout = torch.randn(case.B, case.H, case.Sq, case.D, dtype=dtype, device=device)
    leaves, ref = _reference(case, q, k, v)
    ref_grads = torch.autograd.grad(ref, leaves, dout.float()) if case.backward else None
    ref = ref.detach()
    fwd_flops = case.fwd_flops()
    kv_bytes = case.kv_bytes(dtype) if case.Sq <= 16 else None
    for impl, fn, why in _impls(case, opts.smoke):
        base = "" if impl == BASELINE else BASELINE
        if fn is None:
            rec.skip(f"{case.name}-fwd", impl, why, dtype=dtype, shape=case.shape)
            if case.backward:
                rec.skip(f"{case.name}-bwd", impl, why, dtype=dtype, shape=case.shape)
            continue
        if impl.startswith("sdpa-"):
            refused = _refused(fn, q, k, v)
            if refused:
                rec.skip(f"{case.name}-fwd", impl, refused, dtype=dtype, shape=case.shape)
                if case.backward:
                    rec.skip(f"{case.name}-bwd", impl, refused, dtype=dtype, shape=case.shape)
                continue
        check = _check(fn, case, q, k, v, dout, ref, ref_grads, dtype, case.backward)
        def forward_only():
            with torch.no_grad():
                return fn(q, k, v)

        rec.time(f"{case.name}-fwd", impl, forward_only, dtype=dtype, shape=case.shape, flops=fwd_flops,
                 bytes_moved=kv_bytes, baseline=base, check=check)
        if not case.backward:
            continue
        holder: dict[str, Any] = {}

        def backward_only():
            return torch.autograd.grad(holder["out"], (q, k, v), dout, retain_graph=True)

        def prepare():
            holder["out"] = fn(q, k, v)
            return None

        rec.time(f"{case.name}-bwd", impl, backward_only, dtype=dtype, shape=case.shape, flops=2.5 * fwd_flops,
                 baseline=base, check=prepare)
        holder.clear()
    if device != "cpu":
        torch.cuda.empty_cache()


def run(opts: runner.SuiteOptions) -> list[harness.Row]:
    from .. import device as tf_device

    rec = opts.recorder(SUITE, compute_bound=True)
    device = "cpu" if opts.smoke else tf_device.current().torch_device
    dtype = torch.float32 if opts.smoke else torch.bfloat16
    cases = SMOKE_CASES if opts.smoke else tuple(c for c in CASES if not opts.quick or c.name in QUICK)
    torch.manual_seed(0)
    for case in cases:
        if opts.wants(case.name):
            time_case(rec, case, opts, dtype, device)
    return rec.finish()
