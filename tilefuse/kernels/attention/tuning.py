"""Choosing an attention config: the space's first candidate, or disk-cached tuning on a GPU.

As :mod:`tilefuse.kernels.gemm.tuning` decides GEMM configs: on the interpreter, or with
``TILEFUSE_AUTOTUNE=0``, the first candidate of the space (:mod:`.configs`) runs. Otherwise the first call
of a key times every candidate of its space on the call's own inputs (``triton.testing.do_bench``,
median; a candidate that fails to compile or launch is skipped), keeps the fastest, and stores the decision
under ``TILEFUSE_CACHE_DIR/tuning/attention/`` so a new process does not tune again.

The key: device and arch, triton version, kernel, dtype, padded head dim, GQA group, the score options that
change the kernel (band edges, mask kind, ALiBi, soft cap, score_mod's name, dropout, deterministic) and the
sequence lengths bucketed to powers of two (the tile counts a config's speed depends on).
"""
from __future__ import annotations

import threading
import time
from typing import Callable, Sequence

import triton

from ... import config as tf_config
from ... import device, diskcache
from .configs import AttentionConfig

CACHE_VERSION = 1
TUNE_WARMUP_MS = 5
TUNE_REP_MS = 20

_memo: dict[str, AttentionConfig] = {}
_lock = threading.Lock()
counters = {"tuned": 0, "from_disk": 0, "untuned": 0}


def tuning_enabled() -> bool:
    dev = device.current()
    if dev.interpreter or not dev.is_gpu:
        return False
    setting = tf_config.get().autotune
    return True if setting is None else bool(setting)


def key_of(kernel: str, p, dtype, block_d: int) -> str:
    dev = device.current()
    mod = getattr(getattr(p.score_mod, "fn", None), "__name__", "") if p.score_mod is not None else ""
    return "|".join(str(x) for x in (
        f"v{CACHE_VERSION}", dev.name, dev.arch, triton.__version__, kernel, str(dtype).replace("torch.", ""),
        block_d, p.group, int(p.band_lo), int(p.band_hi), p.mask_kind, int(p.has_alibi), int(p.softcap is not None),
        mod, int(p.dropout_p > 0), int(p.deterministic), triton.next_power_of_2(max(1, p.Sq)),
        triton.next_power_of_2(max(1, p.Sk)), triton.next_power_of_2(p.B * p.H)))


def _time(fn: Callable[[], object]) -> float:
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=TUNE_WARMUP_MS, rep=TUNE_REP_MS, return_mode="median"))


def choose(key: str, candidates: Sequence[AttentionConfig], run: Callable[[AttentionConfig], object],
           timer: Callable[[Callable[[], object]], float] = _time) -> AttentionConfig:
    """The config for ``key``: remembered, stored on disk, or tuned now by timing ``run(cfg)``."""
    if key in _memo:
        return _memo[key]
    if not tuning_enabled() or len(candidates) == 1:
        counters["untuned"] += 1
        return _memo.setdefault(key, candidates[0])
    with _lock:
        if key in _memo:
            return _memo[key]
        path = diskcache.folder("tuning", "attention") / f"{diskcache.digest(key)}.json"
        stored = diskcache.read_json(path)
        if stored is not None:
            cfg = AttentionConfig(**stored["config"])
            counters["from_disk"] += 1
        else:
            cfg, times = _tune(candidates, run, timer)
            diskcache.write_json(path, {"key": key, "config": cfg.__dict__,
                                        "times_ms": {c.label(): t for c, t in times.items()},
                                        "date": time.strftime("%Y-%m-%d")})
            counters["tuned"] += 1
        _memo[key] = cfg
        return cfg


DEFAULT_ATOMIC_DQ = False  # decision 030: the separate dQ pass was 1.2-1.35x faster than atomics on an H100
_forms: dict[str, bool] = {}


def choose_form(key: str, run: Callable[[bool], object],
                timer: Callable[[Callable[[], object]], float] = _time) -> bool:
    """The backward's dQ form for ``key`` (True: fp32 atomics in the dK/dV pass; False: its own pass):
    :data:`DEFAULT_ATOMIC_DQ` untuned, else both timed with their tuned configs, the decision stored on disk."""
    if key in _forms:
        return _forms[key]
    if not tuning_enabled():
        return _forms.setdefault(key, DEFAULT_ATOMIC_DQ)
    # no lock held here: timing a form tunes its configs through choose(), which takes the lock
    path = diskcache.folder("tuning", "attention") / f"{diskcache.digest(key)}.json"
    stored = diskcache.read_json(path)
    if stored is not None:
        atomic = bool(stored["atomic_dq"])
        counters["from_disk"] += 1
    else:
        times = {}
        for atomic in (False, True):  # each call tunes that form's configs first (outside the lock: it reenters)
            run(atomic)
            times[atomic] = timer(lambda: run(atomic))
        atomic = min(times, key=times.get)
        diskcache.write_json(path, {"key": key, "atomic_dq": atomic,
                                    "times_ms": {("atomic" if a else "two_pass"): t for a, t in times.items()},
                                    "date": time.strftime("%Y-%m-%d")})
        counters["tuned"] += 1
    _forms[key] = atomic
    return atomic


def _tune(candidates, run, timer):
    times: dict[AttentionConfig, float] = {}
    for cfg in candidates:
        try:
            run(cfg)  # compile (and fail here, out of resources, rather than inside the timing)
            times[cfg] = timer(lambda: run(cfg))
        except Exception:  # a candidate that does not fit this part is skipped, never fatal
            continue
    if not times:
        return candidates[0], {}
    best = min(times, key=times.get)
    return best, times


def forget() -> None:
    """Drop this process's decisions (tests)."""
    _memo.clear()
    _forms.clear()
