"""``tilefuse bench attention``: the Triton flash-attention family vs every attention PyTorch ships.

Implementations, timed in this process on the same inputs (q/k/v read from (B, S, H, D) buffers, as models
hold them):

- ``tilefuse``: :func:`tilefuse.kernels.attention.attention` (``tilefuse-deterministic``: its backward with
  the dQ pass instead of atomics; ``tilefuse-window``: the sliding-window variant through ``window=``, which
  skips the tiles outside the band, where ``tilefuse`` reads the same band from a boolean ``mask=``);
- ``sdpa-cudnn`` / ``sdpa-flash`` / ``sdpa-efficient``: ``F.scaled_dot_product_attention`` pinned to one
  backend with ``torch.nn.attention.sdpa_kernel`` (a backend that refuses a case is a "not run" row);
- ``flex``: ``torch.compile(flex_attention)`` with a ``BlockMask`` and, for the variants, the ``score_mod``;
- ``inductor``: ``torch.compile`` of the plain-PyTorch form ``softmax(mods(q k^T * scale)) @ v`` as models
  write it (masks from ``arange``); a case whose scores would not fit (:data:`PLAIN_MAX_BYTES`) is "not run".

Cases: the headline shapes (:data:`CASES`) with ``baseline`` ``sdpa-flash``, and the **variants** no prebuilt
kernel covers (:data:`VARIANT_CASES`: Gemma-2's tanh softcap, ALiBi, a sliding window + causal mask built from
``arange``) at a Llama-3-8B prefill shape, with ``baseline`` ``inductor`` (the goal there is 2x Inductor).

FLOPs follow FlashAttention's convention: forward ``4 * B * H * Sq * Sk * D``, halved when causal (also for the
sliding window: the convention counts the causal triangle); backward 2.5x the forward (the backward row times
the backward alone, ``autograd.grad`` of a kept graph). Decode rows also report GB/s: reading K and V once is
the whole cost.

Every implementation's output (and gradients) is checked first against a float32 reference of the same inputs
(SDPA, or for a variant an independent formulation: SDPA with the bias or mask as a tensor, an explicit
softcap). Each case x impl has a wall-clock budget (:data:`ROW_LIMIT_S`, ``--time-limit``) over its phases
(compile + check, forward, backward), and the suite one (:data:`SUITE_BUDGET_S`): past either, the rows left are
"not run" with the reason. Progress lines name the case, impl and phase as they start and end.

``--smoke`` (no GPU): tiny shapes in float32 on the interpreter, tilefuse against SDPA's math path; flex and the
plain form run uncompiled (proving the score/mask definitions against the reference); the GPU-only backends are
"not run" rows.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
from typing import Any, Callable

import torch
import torch.nn.functional as F

from . import harness, runner

SUITE = "attention"
BASELINE = "sdpa-flash"
VARIANT_BASELINE = "inductor"  # no prebuilt kernel covers a variant: the peer is Inductor on the plain form
CHECK_TOLERANCE = {torch.bfloat16: 2e-2, torch.float16: 5e-3, torch.float32: 1e-4}
SDPA_BACKENDS = {"sdpa-cudnn": "CUDNN_ATTENTION", "sdpa-flash": "FLASH_ATTENTION",
                 "sdpa-efficient": "EFFICIENT_ATTENTION"}
SOFTCAP = 50.0  # Gemma-2's attention logit cap
WINDOW = 1024  # keys a query sees in the sliding-window variant (itself and the 1023 before it)
# The plain-PyTorch form materialises the fp32 scores and the probabilities (6 bytes a score in the forward,
# about 3x that with the backward's saved and recomputed tensors). (1, 16, 16384, 128) needs 26 GB for the
# forward and ~80 GB with the backward: more than an H100 holds, and minutes of the device budget. Past this,
# the row is "not run" with the figure.
PLAIN_MAX_BYTES = 24 << 30
PLAIN_BYTES_PER_SCORE = {False: 6, True: 18}  # forward only, forward + backward
ROW_LIMIT_S = 45.0  # one case x impl over its phases: a flex compile (forward + backward) is ~10-20 s
SUITE_BUDGET_S = 110.0  # the whole suite must fit one device call's share (~120 s on an H100)


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
    variant: str = ""  # "", "softcap", "alibi" or "window"

    @property
    def shape(self) -> str:
        extra = {"softcap": f" softcap {SOFTCAP:g}", "alibi": " alibi", "window": f" window {WINDOW} (bool mask)"}
        return (f"B{self.B} H{self.H}/{self.H_kv} Sq{self.Sq} Sk{self.Sk} D{self.D}{' causal' if self.causal else ''}"
                + extra.get(self.variant, ""))

    @property
    def baseline(self) -> str:
        return VARIANT_BASELINE if self.variant else BASELINE

    def fwd_flops(self) -> float:
        f = 4.0 * self.B * self.H * self.Sq * self.Sk * self.D
        return f / 2 if self.causal else f

    def kv_bytes(self, dtype) -> float:
        return 2.0 * self.B * self.H_kv * self.Sk * self.D * torch.finfo(dtype).bits / 8

    def plain_bytes(self) -> int:
        return self.B * self.H * self.Sq * self.Sk * PLAIN_BYTES_PER_SCORE[self.backward]


CASES = (
    Case("mha-16k", 1, 16, 16, 16384, 16384, 128, causal=False),
    Case("mha-16k-causal", 1, 16, 16, 16384, 16384, 128, causal=True),
    Case("llama-prefill-gqa", 1, 32, 8, 4096, 4096, 128, causal=True),  # Llama-3-8B heads, a 4k prompt
    Case("decode-gqa", 8, 32, 8, 1, 8192, 128, causal=False, backward=False),  # one token, an 8k cache
)
VARIANT_CASES = (  # issue 31's variants at the Llama-3-8B prefill shape
    Case("softcap-prefill-gqa", 1, 32, 8, 4096, 4096, 128, causal=True, variant="softcap"),
    Case("alibi-prefill-gqa", 1, 32, 8, 4096, 4096, 128, causal=True, variant="alibi"),
    Case("window-prefill-gqa", 1, 32, 8, 4096, 4096, 128, causal=True, variant="window"),
)
# --quick, in the order they run: under the suite's budget, what comes last is what a short budget drops
QUICK = ("mha-16k-causal", "llama-prefill-gqa") + tuple(c.name for c in VARIANT_CASES) + ("decode-gqa",)
SMOKE_WINDOW = 17  # the smoke run's window: several tiles of 65 keys see only part of the band
SMOKE_CASES = (
    Case("mha-smoke", 1, 2, 2, 65, 65, 32, causal=True),
    Case("decode-smoke", 1, 4, 2, 1, 97, 32, causal=False, backward=False),
    Case("softcap-smoke", 1, 4, 2, 65, 65, 32, causal=True, variant="softcap"),
    Case("alibi-smoke", 1, 4, 2, 65, 65, 32, causal=True, variant="alibi"),
    Case("window-smoke", 1, 4, 2, 65, 65, 32, causal=True, variant="window"),
)


def _inputs(case: Case, dtype, device):
    def bshd(H, S):
        return torch.randn(case.B, S, H, case.D, dtype=dtype, device=device).transpose(1, 2).requires_grad_()

    return bshd(case.H, case.Sq), bshd(case.H_kv, case.Sk), bshd(case.H_kv, case.Sk)


def _expand_kv(t, group):
    return t if group == 1 else t.repeat_interleave(group, 1)


def _window(case: Case) -> int:
    return SMOKE_WINDOW if case.Sq < 1024 else WINDOW


def alibi_slopes(H: int, device) -> torch.Tensor:
    """ALiBi's head slopes 2^(-8 (h + 1) / H) (Press et al., for H a power of two)."""
    return torch.tensor([2.0 ** (-8.0 * (h + 1) / H) for h in range(H)], dtype=torch.float32, device=device)


# ------------------------------------------------------------------------------------- implementations
def _tilefuse(case, device, deterministic=False, window_arg=False):
    from ..kernels.attention import attention

    kw: dict[str, Any] = {"causal": case.causal, "deterministic": deterministic}
    if case.variant == "softcap":
        kw["softcap"] = SOFTCAP
    elif case.variant == "alibi":
        kw["alibi"] = alibi_slopes(case.H, device)
    elif case.variant == "window" and window_arg:
        kw["window"] = (_window(case) - 1, 0)  # itself and the W - 1 keys before it
    elif case.variant == "window":  # the mask a model builds, handed over as a tensor
        i = torch.arange(case.Sq, device=device)[:, None]
        j = torch.arange(case.Sk, device=device)[None, :]
        kw["mask"] = (j <= i) & (i - j < _window(case))
    return lambda q, k, v: attention(q, k, v, **kw)


def _sdpa(case, backend_name):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = getattr(SDPBackend, backend_name)
    gqa = case.H != case.H_kv

    def fn(q, k, v):
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=case.causal, enable_gqa=gqa)

    return fn


def _flex(case, device, compiled=True):
    """flex_attention with the variant's ``score_mod`` and the case's ``mask_mod`` as a BlockMask."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    run = torch.compile(flex_attention, dynamic=False) if compiled else flex_attention
    window = _window(case)
    if case.variant == "window":
        def mask_mod(b, h, q_idx, kv_idx):
            return (q_idx >= kv_idx) & (q_idx - kv_idx < window)
    elif case.causal:
        def mask_mod(b, h, q_idx, kv_idx):
            return q_idx >= kv_idx
    else:
        mask_mod = None
    score_mod = None
    if case.variant == "softcap":
        def score_mod(score, b, h, q_idx, kv_idx):
            return SOFTCAP * torch.tanh(score / SOFTCAP)
    elif case.variant == "alibi":
        slopes = alibi_slopes(case.H, device)

        def score_mod(score, b, h, q_idx, kv_idx):
            return score - slopes[h] * (q_idx - kv_idx).abs()
    block_mask = None if mask_mod is None else create_block_mask(mask_mod, None, None, case.Sq, case.Sk,
                                                                  device=str(device))
    gqa = case.H != case.H_kv
    if not compiled:  # the smoke run's forward-only check of the mods (no flex backward on the CPU)
        return lambda q, k, v: run(q.detach(), k.detach(), v.detach(), score_mod=score_mod, block_mask=block_mask,
                                   enable_gqa=gqa)
    return lambda q, k, v: run(q, k, v, score_mod=score_mod, block_mask=block_mask, enable_gqa=gqa)


def plain_attention(case: Case, q, k, v):
    """Attention as a model writes it in PyTorch: scores in fp32, the variant's modification, masks built from
    ``arange``, softmax, the probabilities back in the inputs' dtype."""
    group = case.H // case.H_kv
    k, v = _expand_kv(k, group), _expand_kv(v, group)
    s = (q @ k.transpose(-1, -2)).float() * (1.0 / math.sqrt(case.D))
    i = torch.arange(case.Sq, device=q.device)[:, None]
    j = torch.arange(case.Sk, device=q.device)[None, :]
    if case.variant == "softcap":
        s = SOFTCAP * torch.tanh(s / SOFTCAP)
    elif case.variant == "alibi":
        s = s - alibi_slopes(case.H, q.device)[:, None, None] * (i - j).abs()
    if case.variant == "window":
        s = s.masked_fill(~((j <= i) & (i - j < _window(case))), float("-inf"))
    elif case.causal:
        s = s.masked_fill(j > i, float("-inf"))
    return torch.softmax(s, -1).to(q.dtype) @ v


def _inductor(case, compiled=True):
    def plain(q, k, v):
        return plain_attention(case, q, k, v)

    return torch.compile(plain, dynamic=False) if compiled else plain


def _reference(case, q, k, v):
    """float32 leaves of the inputs and the output of an independent formulation: SDPA (any backend) with
    the mask or ALiBi bias as a tensor built with ``tril``/``triu``, or the softcap written out with einsum."""
    leaves = [t.detach().float().requires_grad_() for t in (q, k, v)]
    group = case.H // case.H_kv
    lq, lk, lv = leaves[0], _expand_kv(leaves[1], group), _expand_kv(leaves[2], group)
    if case.variant == "softcap":
        s = torch.einsum("bhqd,bhkd->bhqk", lq, lk) / math.sqrt(case.D)
        s = SOFTCAP * torch.tanh(s / SOFTCAP)
        causal = torch.ones(case.Sq, case.Sk, dtype=torch.bool, device=q.device).tril()
        out = torch.einsum("bhqk,bhkd->bhqd", s.masked_fill(~causal, float("-inf")).softmax(-1), lv)
    elif case.variant == "alibi":
        dist = torch.ones(case.Sq, case.Sk, device=q.device).tril(-1).cumsum(0)  # i - j below the diagonal
        bias = -alibi_slopes(case.H, q.device)[:, None, None] * dist
        bias = bias.masked_fill(torch.ones_like(dist, dtype=torch.bool).triu(1), float("-inf"))
        out = F.scaled_dot_product_attention(lq, lk, lv, attn_mask=bias)
    elif case.variant == "window":
        ones = torch.ones(case.Sq, case.Sk, dtype=torch.bool, device=q.device)
        band = ones.tril() & ~ones.tril(-_window(case))
        out = F.scaled_dot_product_attention(lq, lk, lv, attn_mask=band)
    else:
        out = F.scaled_dot_product_attention(lq, lk, lv, is_causal=case.causal)
    return leaves, out


def _impls(case: Case, smoke: bool, device) -> list[tuple[str, Callable[[], Callable] | None, str]]:
    """(impl, a builder of its function (called inside the row's time budget) or None, why not run)."""
    out: list[tuple[str, Callable[[], Callable] | None, str]] = [("tilefuse", lambda: _tilefuse(case, device), "")]
    if case.backward and not case.variant:
        out.append(("tilefuse-deterministic", lambda: _tilefuse(case, device, deterministic=True), ""))
    if case.variant == "window":
        out.append(("tilefuse-window", lambda: _tilefuse(case, device, window_arg=True), ""))
    if not case.variant:
        for name, backend in SDPA_BACKENDS.items():
            out.append((name, None, "smoke run: a GPU backend") if smoke else
                       (name, lambda b=backend: _sdpa(case, b), ""))
        if smoke:
            out.append(("sdpa-math", lambda: _sdpa(case, "MATH"), ""))
    out.append(("flex", lambda: _flex(case, device, compiled=not smoke), ""))
    if not smoke and case.plain_bytes() > PLAIN_MAX_BYTES:
        out.append(("inductor", None, f"the plain-PyTorch form materialises ~{case.plain_bytes() / 2**30:.0f} GiB "
                    f"of scores and probabilities{' with its backward' if case.backward else ''} (limit "
                    f"{PLAIN_MAX_BYTES / 2**30:.0f} GiB)"))
    else:
        out.append(("inductor", lambda: _inductor(case, compiled=not smoke), ""))
    return out


SMOKE_NOTES = {"flex": "flex_attention uncompiled (its math form)", "inductor": "the plain form uncompiled"}
SMOKE_FORWARD_ONLY = {"flex": "smoke run: FlexAttention has no backward on the CPU"}


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


def _no_donated_buffers():
    """AOTAutograd "donates" a compiled backward the tensors it saved (frees them as it goes) and then refuses
    any backward with ``retain_graph=True`` ("compiled with non-empty donated buffers ..."), which is how a
    backward row times the backward alone, many times over one kept graph. The flag is read when the forward
    compiles (the first call), so it is off for the whole case. It changes the backward's peak memory, not its
    kernels."""
    cfg = torch._functorch.config
    return cfg.patch(donated_buffer=False) if hasattr(cfg, "donated_buffer") else contextlib.nullcontext()


def time_case(rec: harness.Recorder, case: Case, opts: runner.SuiteOptions, dtype, device,
              budget: harness.Deadline | None = None) -> None:
    """The rows of one case: per impl, phases compile + check, fwd, bwd under one :class:`harness.Deadline`
    (``opts.time_limit`` or :data:`ROW_LIMIT_S`, and what is left of ``budget``)."""
    log = opts.log
    q, k, v = _inputs(case, dtype, device)
    dout = torch.randn(case.B, case.H, case.Sq, case.D, dtype=dtype, device=device)
    leaves, ref = _reference(case, q, k, v)
    ref_grads = torch.autograd.grad(ref, leaves, dout.float()) if case.backward else None
    ref = ref.detach()
    del leaves
    fwd_flops = case.fwd_flops()
    kv_bytes = case.kv_bytes(dtype) if case.Sq <= 16 else None
    phases = ("fwd", "bwd") if case.backward else ("fwd",)
    row_limit = opts.time_limit or ROW_LIMIT_S

    def say(impl, what):
        log(f"  {case.name:<28} {impl:<22} {what}")

    def rows_for(impl, phases_left, **kw):
        for ph in phases_left:
            rec._row(f"{case.name}-{ph}", impl, dtype, case.shape, **kw)

    def skip(impl, why, phases_left=phases):
        say(impl, f"not run ({', '.join(phases_left)}): {why}")
        rows_for(impl, phases_left, status=f"not run: {why}")

    # Dynamo keeps its compiled code on the code object, which flex_attention and the plain form share across
    # cases: past its recompile limit (8) a call falls back to eager (flex's math form, the plain form
    # uncompiled) and the row would time that. A fresh Dynamo a case.
    torch._dynamo.reset()
    with _no_donated_buffers():
        for impl, build, why in _impls(case, opts.smoke, device):
            base = "" if impl == case.baseline else case.baseline
            note = SMOKE_NOTES.get(impl, "") if opts.smoke else ""
            if build is None:
                skip(impl, why)
                continue
            left = budget.remaining() if budget is not None else None
            if left is not None and left <= 0:
                skip(impl, f"the suite's time budget ({budget.seconds:g} s) was spent")
                continue
            limit = row_limit if left is None else min(row_limit, left)
            deadline = harness.Deadline(limit)
            backward = case.backward and not (opts.smoke and impl in SMOKE_FORWARD_ONLY)
            impl_phases = ("fwd", "bwd") if backward else ("fwd",)
            done: list[str] = []
            holder: dict[str, Any] = {}
            try:
                say(impl, "compile + check ...")
                with deadline.phase("compile+check"):
                    fn = build()
                    refused = _refused(fn, q, k, v) if impl.startswith("sdpa-") else ""
                    wrong = None
                    if not refused:
                        wrong = _check(fn, case, q, k, v, dout, ref, ref_grads, dtype, backward)()
                say(impl, f"compile + check {deadline.phases['compile+check']:.1f} s")
                if refused:
                    skip(impl, refused, impl_phases)
                    continue
                if wrong:
                    say(impl, f"WRONG {wrong}")
                    rows_for(impl, impl_phases, status=f"wrong: {wrong}", baseline=base, note=note)
                    continue

                # With a backward to time, the forward is timed with grad on too (what training runs, and one
                # compiled graph per compiled impl instead of two: compiles are most of the suite's time).
                grad = backward

                def forward_only():
                    with torch.set_grad_enabled(grad):
                        return fn(q, k, v)

                with deadline.phase("fwd"):
                    rec.time(f"{case.name}-fwd", impl, forward_only, dtype=dtype, shape=case.shape,
                             flops=fwd_flops, bytes_moved=kv_bytes, baseline=base, note=note)
                done.append("fwd")
                if backward:
                    def backward_only():
                        return torch.autograd.grad(holder["out"], (q, k, v), dout, retain_graph=True)

                    def prepare():
                        holder["out"] = fn(q, k, v)
                        return None

                    with deadline.phase("bwd"):
                        rec.time(f"{case.name}-bwd", impl, backward_only, dtype=dtype, shape=case.shape,
                                 flops=2.5 * fwd_flops, baseline=base, check=prepare, note=note)
                    done.append("bwd")
            except harness.TimeLimitExceeded as exc:
                whose = "the suite's budget" if limit < row_limit else "--time-limit" if opts.time_limit else \
                    f"ROW_LIMIT_S={ROW_LIMIT_S:g}"
                skip(impl, f"{exc} ({whose})", tuple(p for p in impl_phases if p not in done))
            except Exception as exc:  # building or checking failed: one impl must not end the suite
                for ph in impl_phases:
                    if ph not in done:
                        rec._error_row(f"{case.name}-{ph}", impl, dtype, case.shape, exc,
                                       {"baseline": base, "note": note})
            finally:
                holder.clear()
                if case.backward and not backward:
                    skip(impl, SMOKE_FORWARD_ONLY[impl], ("bwd",))
                if deadline.phases:
                    say(impl, "phases " + ", ".join(f"{p} {t:.1f} s" for p, t in deadline.phases.items()))
    if device != "cpu":
        torch.cuda.empty_cache()


def _ordered_cases(opts: runner.SuiteOptions) -> tuple[Case, ...]:
    if opts.smoke:
        return SMOKE_CASES
    everything = {c.name: c for c in CASES + VARIANT_CASES}
    names = QUICK if opts.quick else tuple(everything)
    return tuple(everything[n] for n in names)


def run(opts: runner.SuiteOptions) -> list[harness.Row]:
    from .. import device as tf_device

    rec = opts.recorder(SUITE, compute_bound=True)
    device = "cpu" if opts.smoke else tf_device.current().torch_device
    dtype = torch.float32 if opts.smoke else torch.bfloat16
    budget = harness.Deadline(opts.budget_s or (None if opts.smoke else SUITE_BUDGET_S), wall=True)
    torch.manual_seed(0)
    for case in _ordered_cases(opts):
        if opts.wants(case.name):
            opts.log(f"[attention] {case.name}: {case.shape}"
                     + (f" ({budget.remaining():.0f} s of the suite's budget left)" if budget.seconds else ""))
            time_case(rec, case, opts, dtype, device, budget)
    return rec.finish()
