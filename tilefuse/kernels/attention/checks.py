"""Argument checking for the attention family: every wrong argument is a ValueError or TypeError naming the
argument and the accepted values, raised before any launch. The result, :class:`Params`, is everything the
kernels need besides the tensors, with the masks reduced to two diagonal offsets (see :func:`band`)."""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 256
CAUSAL_VALUES = (False, True, "top_left", "bottom_right")
MASK_NONE, MASK_ADDITIVE, MASK_BOOL = 0, 1, 2
# Philox counters are ``q * Sk + k`` in int32 (one stream a (batch, head)): Sq * Sk must stay below 2^31
MAX_DROPOUT_SCORES = 2 ** 31


@dataclasses.dataclass(frozen=True)
class Params:
    """Shapes and score options of one call. ``diag``: the diagonal's key offset (0 top-left,
    ``Sk - Sq`` bottom-right); ``lo_off``/``hi_off``: key ``j`` is visible to query ``i`` iff
    ``i + lo_off <= j <= i + hi_off``."""
    B: int
    H: int
    H_kv: int
    Sq: int
    Sk: int
    D: int
    scale: float
    diag: int
    lo_off: int
    hi_off: int
    band_lo: bool  # a window's left edge: keys before i + lo_off are hidden
    band_hi: bool  # causal or a window's right edge: keys after i + hi_off are hidden
    softcap: float | None
    has_alibi: bool
    mask_kind: int
    score_mod: Any
    score_mod_grad: Any
    dropout_p: float
    seed: int
    deterministic: bool
    # compile options beyond a config's warps and stages: Triton's debug option for a generated score_mod with
    # device asserts (a table lookup's bounds), which a GPU build drops without it
    launch_options: tuple = ()

    @property
    def group(self) -> int:
        return self.H // self.H_kv


def _name(t: torch.Tensor) -> str:
    return f"{tuple(t.shape)} {str(t.dtype).replace('torch.', '')} on {t.device}"


def check_qkv(q, k, v, rank: int, layout: str) -> None:
    """q, k, v are tensors of ``rank`` (``layout`` names its dims in the error), of one accepted dtype, on one
    device where tilefuse runs its kernels: the checks the batched and the packed (varlen) APIs share."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != rank:
            raise ValueError(f"{name} must have rank {rank} {layout}, got shape {tuple(t.shape)}")
        if t.dtype not in DTYPES:
            raise TypeError(f"{name} has dtype {t.dtype}: accepted dtypes are float16, bfloat16, float32")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k and v must share one dtype, got q {q.dtype}, k {k.dtype}, v {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k and v must be on one device, got q on {q.device}, k on {k.device}, v on {v.device}")
    from ... import device

    want = device.torch_device().type
    if q.device.type != want:
        raise ValueError(f"q is on {q.device}: tilefuse runs Triton kernels on {want} tensors here "
                         f"({device.current().describe()})")


def check_tensors(q, k, v) -> None:
    check_qkv(q, k, v, 4, "(batch, heads, seq, head_dim)")
    B, H, Sq, D = q.shape
    if k.shape[0] != B or v.shape[0] != B:
        raise ValueError(f"batch sizes differ: q {_name(q)}, k {_name(k)}, v {_name(v)}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have one shape (batch, kv_heads, kv_seq, head_dim), got k {tuple(k.shape)} "
                         f"and v {tuple(v.shape)}")
    if k.shape[3] != D:
        raise ValueError(f"head dims differ: q has {D}, k and v have {k.shape[3]}; they must be equal")
    if not 1 <= D <= MAX_HEAD_DIM:
        raise ValueError(f"head dim {D} is not supported: accepted values are 1 to {MAX_HEAD_DIM}")
    H_kv = k.shape[1]
    if H_kv < 1 or H % H_kv:
        raise ValueError(f"q has {H} heads and k/v have {H_kv}: the kv heads must divide the query heads "
                         f"(GQA/MQA groups of H // H_kv query heads)")
    if B < 1 or H < 1:
        raise ValueError(f"q has an empty batch or head dimension: shape {tuple(q.shape)}")


def normalize_causal(causal) -> str:
    if causal is False or causal is None:
        return "none"
    if causal is True or causal == "top_left":
        return "top_left"
    if causal == "bottom_right":
        return "bottom_right"
    raise ValueError(f"causal={causal!r}: accepted values are False, True (same as 'top_left', the convention of "
                     f"F.scaled_dot_product_attention) and 'bottom_right' (FlashAttention's)")


def normalize_window(window) -> tuple[int, int] | None:
    if window is None:
        return None
    if not isinstance(window, (tuple, list)) or len(window) != 2:
        raise ValueError(f"window={window!r}: accepted values are None or (left, right), each an int >= 0 or "
                         f"None / -1 for unbounded")
    out = []
    for side, w in zip(("left", "right"), window):
        if w is None:
            w = -1
        if isinstance(w, bool) or not isinstance(w, int) or w < -1:
            raise ValueError(f"window {side}={w!r}: accepted values are ints >= 0, or None / -1 for unbounded")
        out.append(w)
    return out[0], out[1]


def band(causal: str, window: tuple[int, int] | None, Sq: int, Sk: int) -> tuple[int, int, int, bool, bool]:
    """(diag, lo_off, hi_off, band_lo, band_hi). The diagonal is top-left (``j = i``) unless
    ``causal='bottom_right'`` (``j = i + Sk - Sq``); a window is measured from that diagonal; causal caps the
    right side at 0. An edge at or past every key is no edge."""
    diag = Sk - Sq if causal == "bottom_right" else 0
    unbounded = Sq + Sk + 1  # past every key from every query: int32-safe
    left, right = window if window is not None else (-1, -1)
    left = unbounded if left < 0 else min(left, unbounded)
    right = unbounded if right < 0 else min(right, unbounded)
    if causal != "none":
        right = 0
    # every key visible from every query on that side: j >= i + diag - left for all i, j (and the same right)
    band_lo = diag - left > -Sq
    band_hi = diag + right < Sk - 1
    return diag, diag - left, diag + right, band_lo, band_hi


def check_mask(mask, B, H, Sq, Sk, device) -> tuple[torch.Tensor | None, int]:
    """The mask as a (B, H, Sq, Sk) view (broadcast dims stride 0; bool viewed as uint8) and its kind."""
    if mask is None:
        return None, MASK_NONE
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"mask must be a torch.Tensor (bool: True = attend, or float: added to the scores) or None, "
                        f"got {type(mask).__name__}")
    if mask.dtype != torch.bool and not mask.dtype.is_floating_point:
        raise TypeError(f"mask has dtype {mask.dtype}: accepted dtypes are bool (True = attend) and floating types "
                        f"(added to the scores)")
    if mask.device != device:
        raise ValueError(f"mask is on {mask.device}, q on {device}: they must be on one device")
    if mask.dim() > 4 or any(m not in (1, t) for m, t in zip(mask.shape[::-1], (Sk, Sq, H, B))):
        raise ValueError(f"mask of shape {tuple(mask.shape)} does not broadcast to (batch, heads, q_seq, kv_seq) = "
                         f"{(B, H, Sq, Sk)}")
    if mask.requires_grad and torch.is_grad_enabled():
        raise ValueError("mask requires grad: gradients w.r.t. the mask are not computed; pass mask.detach() "
                         "(or use score_mod for a learned bias)")
    return mask_view(mask, B, H, Sq, Sk), MASK_BOOL if mask.dtype == torch.bool else MASK_ADDITIVE


def mask_view(mask: torch.Tensor, B: int, H: int, Sq: int, Sk: int) -> torch.Tensor:
    """A checked mask as the kernels read it: (B, H, Sq, Sk), broadcast dims stride 0, bool viewed as uint8."""
    view = mask.expand(B, H, Sq, Sk)
    return view.view(torch.uint8) if mask.dtype == torch.bool else view


def check_alibi(alibi, B, H, device) -> torch.Tensor | None:
    """ALiBi slopes as a (B, H) float32 view (stride 0 over the batch for per-head slopes)."""
    if alibi is None:
        return None
    if not isinstance(alibi, torch.Tensor) or not alibi.dtype.is_floating_point:
        raise TypeError(f"alibi must be a float tensor of slopes of shape (heads,) or (batch, heads), got "
                        f"{type(alibi).__name__ if not isinstance(alibi, torch.Tensor) else alibi.dtype}")
    if tuple(alibi.shape) not in ((H,), (B, H)):
        raise ValueError(f"alibi has shape {tuple(alibi.shape)}: accepted shapes are ({H},) and ({B}, {H})")
    if alibi.device != device:
        raise ValueError(f"alibi is on {alibi.device}, q on {device}: they must be on one device")
    if alibi.requires_grad and torch.is_grad_enabled():
        raise ValueError("alibi requires grad: gradients w.r.t. the slopes are not computed; pass alibi.detach()")
    return alibi_view(alibi, B, H)


def alibi_view(alibi: torch.Tensor, B: int, H: int) -> torch.Tensor:
    """Checked ALiBi slopes as the kernels read them: (B, H) float32, stride 0 over the batch for per-head ones."""
    return alibi.detach().to(torch.float32).expand(B, H)


def _is_jit(fn) -> bool:
    return fn is not None and hasattr(fn, "fn") and callable(getattr(fn, "fn"))  # JITFunction / InterpretedFunction


def check_score_options(head_dim: int, *, softcap, scale, dropout_p, dropout_seed, deterministic, score_mod,
                        score_mod_grad, needs_grad: bool):
    """The options the batched and the packed (varlen) forms share, checked; returns (softcap, scale, dropout_p)
    normalised (scale None -> 1 / sqrt(head_dim))."""
    D = head_dim
    if softcap is not None:
        if isinstance(softcap, bool) or not isinstance(softcap, (int, float)) or not softcap > 0 \
                or not math.isfinite(softcap):
            raise ValueError(f"softcap={softcap!r}: accepted values are None or a finite number > 0")
        softcap = float(softcap)
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    elif isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise ValueError(f"scale={scale!r}: accepted values are None (1 / sqrt(head_dim)) or a finite number")
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)) or not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p={dropout_p!r}: accepted values are numbers in [0, 1)")
    dropout_p = float(dropout_p)
    if dropout_seed is not None and (isinstance(dropout_seed, bool) or not isinstance(dropout_seed, int)
                                     or not 0 <= dropout_seed < 2 ** 32):
        raise ValueError(f"dropout_seed={dropout_seed!r}: accepted values are None or an int in [0, 2^32)")
    if not isinstance(deterministic, bool):
        raise TypeError(f"deterministic must be a bool, got {type(deterministic).__name__}")
    for name, fn in (("score_mod", score_mod), ("score_mod_grad", score_mod_grad)):
        if fn is not None and not _is_jit(fn):
            raise TypeError(f"{name} must be a @triton.jit function {name}(score, b, h, q_idx, k_idx) or None, "
                            f"got {type(fn).__name__}")
    if score_mod_grad is not None and score_mod is None:
        raise ValueError("score_mod_grad was given without score_mod")
    if score_mod is not None and score_mod_grad is None and needs_grad:
        raise ValueError("score_mod with inputs that require grad needs score_mod_grad: a @triton.jit function "
                         "score_mod_grad(score, b, h, q_idx, k_idx) returning d score_mod / d score")
    return softcap, scale, dropout_p


def check_arguments(q, k, v, *, causal, window, softcap, alibi, mask, score_mod, score_mod_grad, dropout_p,
                    dropout_seed, scale, deterministic, needs_grad: bool):
    check_tensors(q, k, v)
    B, H, Sq, D = q.shape
    H_kv, Sk = k.shape[1], k.shape[2]
    causal_kind = normalize_causal(causal)
    win = normalize_window(window)
    softcap, scale, dropout_p = check_score_options(
        D, softcap=softcap, scale=scale, dropout_p=dropout_p, dropout_seed=dropout_seed, deterministic=deterministic,
        score_mod=score_mod, score_mod_grad=score_mod_grad, needs_grad=needs_grad)
    if dropout_p > 0 and Sq * Sk >= MAX_DROPOUT_SCORES:
        raise ValueError(f"dropout_p > 0 with q_seq * kv_seq = {Sq * Sk}: the dropout counters are int32, "
                         f"accepted sizes have q_seq * kv_seq < 2^31")
    mask_view, mask_kind = check_mask(mask, B, H, Sq, Sk, q.device)
    alibi_view = check_alibi(alibi, B, H, q.device)
    diag, lo_off, hi_off, band_lo, band_hi = band(causal_kind, win, Sq, Sk)
    if dropout_p > 0 and dropout_seed is None:
        dropout_seed = int(torch.randint(0, 2 ** 31 - 1, (1,)).item())  # from torch's generator: manual_seed works
    params = Params(B, H, H_kv, Sq, Sk, D, float(scale), diag, lo_off, hi_off, band_lo, band_hi, softcap,
                    alibi_view is not None, mask_kind, score_mod, score_mod_grad, dropout_p,
                    int(dropout_seed or 0), deterministic)
    return params, mask_view, alibi_view
