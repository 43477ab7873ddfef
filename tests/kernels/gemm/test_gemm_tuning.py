"""GEMM config spaces, the disk-cached tuner, the target-matrix registration and the bench suite's code path."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest
import torch

import tilefuse
from tilefuse import config, targets
from tilefuse.kernels import gemm as G
from tilefuse.kernels.gemm import configs as C
from tilefuse.kernels.gemm import tuning as T

from tests.support import interpreter_only


def problem(m, n, k, *, dtype="bfloat16", epilogue="plain", tma=True, z=1):
    return C.GemmProblem(m, n, k, z, dtype, dtype, dtype, False, False, tma, epilogue)


H200 = C.Part("nvidia", "sm_90", 132, C.SMEM_BY_ARCH["sm_90"])


# ------------------------------------------------------------------------------------------- spaces
@pytest.mark.parametrize("target", list(C.PART_BY_TARGET))
@pytest.mark.parametrize("shape", [(1, 8192, 8192), (128, 8192, 8192), (256, 8192, 8192), (1024, 1024, 1024),
                                   (8192, 8192, 8192), (16384, 4096, 14336), (7, 13, 29)])
def test_candidates_fit_their_part(target, shape):
    part = C.PART_BY_TARGET[target]
    prob = problem(*shape)
    cands = C.candidates(prob, part)
    assert cands, "every problem gets at least one config"
    for cfg in cands:
        assert C.smem_estimate(cfg, prob) <= part.smem_bytes or cfg == C.SAFE_CONFIG
        assert cfg.split_k >= 1 and cfg.block_m >= 16
        assert not (cfg.tma and not part.has_tma)
        if part.vendor == "amd" and cfg != C.SAFE_CONFIG:
            assert cfg.num_stages == 2 and cfg.matrix_instr_nonkdim == 16
        if target == "gfx950":
            assert cfg.kpack <= 1


def test_shape_classes_and_split_k():
    assert problem(1, 8192, 8192).shape_class() == "decode"
    assert problem(128, 8192, 8192).shape_class() == "skinny"
    assert problem(1024, 1024, 1024).shape_class() == "small"
    assert problem(8192, 8192, 8192).shape_class() == "large"
    # M = 128, N = 8192 with 64x128 tiles: 128 tiles on 132 SMs, no split needed
    first = C.candidates(problem(128, 8192, 8192), H200)[0]
    assert (first.block_m, first.block_n, first.split_k) == (64, 128, 1)
    # with 128x128 tiles: 64 tiles on 132 SMs -> split-K 2 fills the machine
    split = [c for c in C.candidates(problem(128, 8192, 8192), H200) if (c.block_m, c.block_n, c.block_k) == (128, 128, 128)]
    assert split and split[0].split_k == 2
    # decode: BLOCK_M follows M (16 rows is the smallest MMA)
    assert {c.block_m for c in C.candidates(problem(1, 8192, 8192), H200)} == {16}
    assert {c.block_m for c in C.candidates(problem(64, 8192, 8192), H200)} == {64}
    # large: the persistent TMA kernel leads on Hopper, but not where TMA is impossible
    assert C.default_config(problem(8192, 8192, 8192), H200).kernel == "persistent"
    assert not any(c.tma for c in C.candidates(problem(8192, 8192, 8192, tma=False), H200))


def test_warp_specialised_candidates_only_where_they_compile():
    for shape in ((8192, 8192, 8192), (256, 8192, 8192), (1024, 1024, 1024)):
        cands = C.candidates(problem(*shape), H200)
        ws = [c for c in cands if c.warp_specialize]
        assert ws, shape
        for c in ws:  # the combinations triton 3.6 compiles (see gemm_configs.ws_possible)
            assert c.tma and c.num_warps == 4 and c.epi_subtile == 1 and c.split_k == 1
    assert not any(c.warp_specialize for c in C.candidates(problem(8192, 8192, 8192), C.PART_BY_TARGET["sm_100a"]))
    assert not any(c.warp_specialize for c in C.candidates(problem(8192, 8192, 8192, tma=False), H200))
    hooked = dataclasses.replace(problem(8192, 8192, 8192), epilogue="hook=silu:abc")
    assert not any(c.warp_specialize for c in C.candidates(hooked, H200))


def test_smem_pruning():
    small = C.Part("nvidia", "sm_89", 128, 101376)
    prob = problem(8192, 8192, 8192)
    assert all(C.smem_estimate(c, prob) <= small.smem_bytes for c in C.candidates(prob, small))
    assert len(C.candidates(prob, small)) < len(C.candidates(prob, H200))


def test_one_byte_inputs_double_block_k():
    prob = problem(8192, 8192, 8192, dtype="float8_e4m3fn")
    assert all(c.block_k >= 128 for c in C.candidates(prob, H200))


def test_config_json_round_trip():
    cfg = C.GemmConfig("persistent", 128, 256, 64, tma=True, epi_subtile=2)
    assert C.GemmConfig.from_json(json.loads(json.dumps(cfg.to_json()))) == cfg
    assert cfg.label() == "P128x256x64-w4-s3-tma-sub2"
    assert C.GemmConfig(waves_per_eu=2, kpack=2).launch_options("amd")["kpack"] == 2
    assert "kpack" not in C.GemmConfig(kpack=2).launch_options("nvidia")


def test_buckets():
    assert problem(1, 8192, 8192).bucket() == problem(16, 8192, 8192).bucket()
    assert problem(128, 8192, 8192).bucket() != problem(256, 8192, 8192).bucket()
    assert problem(16384, 14336, 4096).bucket()[1] == 16384


# ------------------------------------------------------------------------------------------- tuning
def test_interpreter_uses_the_fixed_config():
    assert not T.tuning_enabled()
    ops = G.prepare(torch.randn(8, 8), torch.randn(8, 8))
    assert T.choose(ops) == C.INTERPRETER_CONFIG


def _fake_timer(times):
    it = iter(times)

    def timer(fn, best):
        fn()
        return next(it)
    return timer


def test_tune_stores_winner_and_new_process_reuses_it(tmp_cache):
    a, b = torch.randn(40, 32), torch.randn(32, 48)
    ops = G.prepare(a, b, activation="relu")
    cfgs = [C.GemmConfig("tiled", 32, 32, 16), C.GemmConfig("tiled", 16, 32, 16, split_k=2),
            C.GemmConfig("persistent", 32, 32, 16)]
    winner = T.tune(ops, cfgs, timer=_fake_timer([3.0, 1.0, 2.0]))
    assert winner == cfgs[1]
    assert T.stored(ops.problem) == cfgs[1]
    entry = json.loads(T._path(T.key_of(ops.problem)).read_text())
    assert [r["ms"] for r in entry["ranking"]] == [1.0, 2.0, 3.0]
    assert entry["winner_label"] == cfgs[1].label()
    code = ("import torch, json; from tilefuse.kernels import gemm as G; from tilefuse.kernels.gemm import tuning as T;"
            "ops = G.prepare(torch.randn(40, 32), torch.randn(32, 48), activation='relu');"
            "print(json.dumps(T.stored(ops.problem).to_json()))")
    env = dict(os.environ, TILEFUSE_CACHE_DIR=str(tmp_cache))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert C.GemmConfig.from_json(json.loads(out.strip().splitlines()[-1])) == cfgs[1]


def test_related_key_seeds_candidates(tmp_cache):
    a, b = torch.randn(40, 32, dtype=torch.float16), torch.randn(32, 48, dtype=torch.float16)
    plain = G.prepare(a, b)
    cfgs = [C.GemmConfig("tiled", 32, 32, 16), C.GemmConfig("tiled", 16, 32, 16, split_k=2),
            C.GemmConfig("persistent", 32, 32, 16)]
    T.tune(plain, cfgs, timer=_fake_timer([3.0, 1.0, 1.08]))  # 1.08: close for RELATED_TOP, not for a final
    fused = G.prepare(a, b, activation="gelu", quantize="fp8_e4m3")
    assert T.related_candidates(fused.problem) == [cfgs[1], cfgs[2]]
    bf16_like = dataclasses.replace(plain.problem, a_dtype="bfloat16", b_dtype="bfloat16", c_dtype="bfloat16")
    assert T.related_candidates(bf16_like) == [cfgs[1], cfgs[2]]
    # tuning the fused key without explicit configs times exactly the two seeded ones
    seen = []

    def timer(fn, best):
        fn()
        seen.append(1)
        return float(len(seen))
    assert T.tune(fused, timer=timer) == cfgs[1]
    assert len(seen) == 2
    # the quantised variant of an epilogue learns from the same epilogue without quantisation
    gelu = G.prepare(a, b, activation="silu")
    T.tune(gelu, cfgs, timer=_fake_timer([1.0, 5.0, 6.0]))
    silu_q = G.prepare(a, b, activation="silu", quantize="int8")
    assert T.related_candidates(silu_q.problem) == [cfgs[0]]  # a clear winner: inherited, not timed
    assert T.tune(silu_q, timer=lambda fn, best: pytest.fail("timed an inherited winner")) == cfgs[0]
    assert T.stored(silu_q.problem) == cfgs[0]


def _tagged_bound(monkeypatch):
    """gemm_launching.bound returning callables that say which config they run (the timer sees only them)."""
    from tilefuse.kernels.gemm import launching as gemm_launching

    real = gemm_launching.bound

    def bound(ops, cfg):
        fn = real(ops, cfg)

        def run():
            fn()
        run.cfg = cfg
        return run
    monkeypatch.setattr(gemm_launching, "bound", bound)


def test_finalists_are_the_close_ones():
    c = [C.GemmConfig("tiled", 16 * (i + 1), 32, 16) for i in range(5)]
    inf = float("inf")
    assert T.finalists({c[0]: 1.0, c[1]: 1.5, c[2]: inf}) == []  # a clear best: no final
    assert T.finalists({c[0]: 1.0}) == []
    got = T.finalists({c[0]: 1.04, c[1]: 1.0, c[2]: 1.02, c[3]: 1.05, c[4]: inf})
    assert got == [c[1], c[2], c[0]]  # fastest first, at most TUNE_FINAL_MAX
    assert T.finalists({c[0]: 1.0, c[1]: 1.0 * T.TUNE_CLOSE + 1e-6}) == []
    assert T.median([3.0, 1.0, 2.0]) == 2.0 and T.median([1.0, 2.0, 4.0, 3.0]) == 2.5
    assert T.early_stop(1.6, 1.0) and not T.early_stop(1.4, 1.0) and not T.early_stop(9.0, None)


def test_final_rounds_overturn_a_noisy_first_pass(tmp_cache, monkeypatch):
    """First pass: c0 looks best by 1 %, c2 is clearly slower (early-stopped), c1 and c3 are close. The final
    times c0, c3, c1 again in rotated order with full measurements (best_ms=None), and c1's median wins."""
    _tagged_bound(monkeypatch)
    a, b = torch.randn(40, 32), torch.randn(32, 48)
    ops = G.prepare(a, b, activation="relu")
    c = [C.GemmConfig("tiled", 32, 32, 16), C.GemmConfig("tiled", 16, 32, 16, split_k=2),
         C.GemmConfig("persistent", 32, 32, 16), C.GemmConfig("tiled", 16, 16, 16)]
    first = {c[0]: 1.00, c[1]: 1.01, c[2]: 2.0, c[3]: 1.05}
    final = {c[0]: [1.06, 1.07], c[1]: [0.97, 0.98], c[3]: [1.04, 1.05]}
    calls = []

    def timer(fn, best):
        fn()
        cfg = fn.cfg
        calls.append((cfg, best))
        if len([x for x in calls if x[0] == cfg]) == 1:
            return first[cfg]
        assert best is None, "a final round is a full measurement"
        return final[cfg].pop(0)
    winner = T.tune(ops, c, timer=timer)
    assert winner == c[1]
    # first pass in the given order (the best so far passed on), then two rounds, rotated
    assert [x[0] for x in calls] == c + [c[0], c[1], c[3]] + [c[1], c[3], c[0]]
    assert [x[1] for x in calls[:4]] == [None, 1.0, 1.0, 1.0]
    entry = json.loads(T._path(T.key_of(ops.problem)).read_text())
    assert entry["winner_label"] == c[1].label() and entry["winner_ms"] == 0.98
    assert entry["final"] == {c[0].label(): [1.0, 1.06, 1.07], c[1].label(): [1.01, 0.97, 0.98],
                              c[3].label(): [1.05, 1.04, 1.05]}
    assert [r["label"] for r in entry["ranking"]] == [c[1].label(), c[3].label(), c[0].label(), c[2].label()]


def test_no_final_for_a_clear_winner_and_a_failing_finalist_drops_out(tmp_cache, monkeypatch):
    _tagged_bound(monkeypatch)
    ops = G.prepare(torch.randn(24, 16), torch.randn(16, 40), activation="relu")
    c = [C.GemmConfig("tiled", 32, 32, 16), C.GemmConfig("tiled", 16, 32, 16)]
    seen = []

    def clear(fn, best):
        fn()
        seen.append(fn.cfg)
        return {c[0]: 1.0, c[1]: 2.0}[fn.cfg]
    assert T.tune(ops, c, timer=clear) == c[0]
    assert seen == c  # one measurement each

    T.forget()
    ops = G.prepare(torch.randn(24, 16), torch.randn(16, 40), activation="sigmoid")
    n = {c[0]: 0, c[1]: 0}

    def flaky(fn, best):
        fn()
        n[fn.cfg] += 1
        if fn.cfg == c[0] and n[c[0]] > 1:
            raise RuntimeError("launch failed")
        return {c[0]: 1.0, c[1]: 1.03}[fn.cfg]
    assert T.tune(ops, c, timer=flaky) == c[1]
    assert n[c[1]] == 1 + T.TUNE_FINAL_ROUNDS


def test_fp32_keys_say_tf32_or_ieee(monkeypatch):
    """tf32 and exact fp32 are different kernels: separate decisions; other dtypes' keys are unchanged."""
    from tilefuse import device

    fake = dataclasses.replace(device.current(), interpreter=False, vendor="nvidia")
    monkeypatch.setattr(T.device, "current", lambda: fake)
    prob = problem(4096, 4096, 4096, dtype="float32")
    saved = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = True
        tf32 = T.key_of(prob)
        torch.backends.cuda.matmul.allow_tf32 = False
        ieee = T.key_of(prob)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved
    assert tf32 != ieee and ":tf32|" in tf32 and ":ieee|" in ieee
    assert "float32xfloat32->float32:" not in T.key_of(problem(4096, 4096, 4096))
    assert "bfloat16xbfloat16->bfloat16|" in T.key_of(problem(4096, 4096, 4096))


def test_fp32_keys_time_more_candidates(tmp_cache, monkeypatch):
    seen = []
    monkeypatch.setattr(T, "candidates", lambda p, part, limit=None: seen.append(limit) or [C.GemmConfig()])
    T.tune(G.prepare(torch.randn(8, 8), torch.randn(8, 8)), timer=lambda fn, best: 1.0, store=False)
    T.tune(G.prepare(torch.randn(8, 8).half(), torch.randn(8, 8).half()), timer=lambda fn, best: 1.0, store=False)
    assert seen == [T.TUNE_MAX_CANDIDATES_4B, T.TUNE_MAX_CANDIDATES]


def test_budget_stops_tuning(tmp_cache, monkeypatch):
    monkeypatch.setattr(T, "tuning_enabled", lambda: True)
    monkeypatch.setattr(T, "tune", lambda *a, **k: pytest.fail("tuned past the budget"))
    T.forget()
    T.set_budget(0.0)
    T._spent_s = 1.0
    try:
        ops = G.prepare(torch.randn(12, 8), torch.randn(8, 12), activation="sigmoid")
        assert T.choose(ops) == C.default_config(ops.problem)
        assert T.stored(ops.problem) is None
    finally:
        T.set_budget(None)
        T.forget()


def test_choose_tunes_once_then_memo_then_disk(tmp_cache, monkeypatch):
    monkeypatch.setattr(T, "tuning_enabled", lambda: True)
    calls = []

    def fake_time(fn, best):
        fn()
        calls.append(1)
        return 1.0 + len(calls)
    monkeypatch.setattr(T, "_time", fake_time)
    monkeypatch.setattr(T, "candidates", lambda p, part, limit=None: [C.GemmConfig("tiled", 32, 32, 16),
                                                                      C.GemmConfig("tiled", 64, 32, 16)])
    T.forget()
    a, b = torch.randn(33, 20), torch.randn(20, 30)
    out = tilefuse.gemm(a, b, activation="tanh")
    assert len(calls) == 2
    torch.testing.assert_close(out, torch.tanh(a @ b), rtol=1e-4, atol=1e-4)
    tilefuse.gemm(a, b, activation="tanh")
    assert len(calls) == 2  # memo
    T.forget()
    monkeypatch.setattr(T, "tune", lambda *a, **k: pytest.fail("tuned again despite the disk entry"))
    assert T.choose(G.prepare(a, b, activation="tanh")) == C.GemmConfig("tiled", 32, 32, 16)
    T.forget()


def test_under_torchrun_only_local_rank_0_tunes(tmp_cache, monkeypatch):
    """Local rank 1 waits for local rank 0's decision on disk (here written by a thread standing in for rank
    0, half a second later) and runs it; it never tunes itself."""
    import threading

    monkeypatch.setattr(T, "tuning_enabled", lambda: True)
    real_tune = T.tune
    monkeypatch.setattr(T, "tune", lambda *a, **k: pytest.fail("a rank other than local rank 0 tuned"))
    a, b = torch.randn(21, 18), torch.randn(18, 26)
    ops = G.prepare(a, b, activation="silu")
    chosen = C.GemmConfig("tiled", 16, 32, 16, split_k=2)

    def rank0():
        import time as _t
        _t.sleep(0.5)
        real_tune(ops, [chosen], timer=lambda fn, best: 1.0)  # what rank 0's tuner stores

    T.forget()
    with config.override(local_rank=1, local_world_size=2, tune_wait_s=30.0):
        assert T.tuning_role() == "waiter"
        writer = threading.Thread(target=rank0)
        writer.start()
        got = T.choose(ops)
        writer.join()
    assert got == chosen
    with config.override(local_rank=0, local_world_size=2):
        assert T.tuning_role() == "tuner"
    with config.override(local_rank=None, local_world_size=1):
        assert T.tuning_role() == "tuner"
    T.forget()


def test_waiting_rank_runs_the_default_when_rank_0_never_decides(tmp_cache, monkeypatch, capsys):
    monkeypatch.setattr(T, "tuning_enabled", lambda: True)
    monkeypatch.setattr(T, "tune", lambda *a, **k: pytest.fail("a rank other than local rank 0 tuned"))
    ops = G.prepare(torch.randn(9, 8), torch.randn(8, 7), activation="relu")
    T.forget()
    with config.override(local_rank=3, local_world_size=4, tune_wait_s=0.3):
        assert T.choose(ops) == C.default_config(ops.problem)
    assert T.stored(ops.problem) is None  # nothing stored: a later rank 0 still tunes the key
    assert "no tuning decision from local rank 0" in capsys.readouterr().err
    T.forget()


def test_rank_settings_read_from_torchrun_variables():
    cfg = config.load({"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "TILEFUSE_TUNE_WAIT_S": "12.5"})
    assert (cfg.local_rank, cfg.local_world_size, cfg.tune_wait_s) == (1, 2, 12.5)
    assert config.load({}).local_rank is None
    with pytest.raises(ValueError, match="TILEFUSE_TUNE_WAIT_S"):
        config.load({"TILEFUSE_TUNE_WAIT_S": "-1"})


def test_progress_respects_setting(capsys, monkeypatch):
    monkeypatch.setattr(T, "PROGRESS_AFTER_S", 0.0)
    with config.override(progress=True):
        T.Progress("x").update("compiling 3 configs")
    assert "tuning x: compiling 3 configs" in capsys.readouterr().err
    with config.override(progress=False):
        T.Progress("x").update("compiling 3 configs")
    assert capsys.readouterr().err == ""


def test_out_of_resources_falls_back(monkeypatch):
    import triton

    real = G.launch

    def picky(ops, cfg):
        if cfg != C.SAFE_CONFIG:
            raise triton.runtime.errors.OutOfResources(300000, 232448, "shared memory")
        real(ops, cfg)
    monkeypatch.setattr(G, "launch", picky)
    a, b = torch.randn(10, 12), torch.randn(12, 9)
    res = G.gemm_raw(a, b, config=C.GemmConfig("tiled", 32, 32, 16, num_stages=7))
    torch.testing.assert_close(res.out[0], a @ b, rtol=1e-4, atol=1e-4)


def test_stream_k_is_offered_only_for_a_nearly_empty_long_last_round():
    # 128x256 tiles on 132 SMs: 16384x8192x28672 is 4096 tiles (a last round of 4, 448 steps a tile);
    # 4096^3 (116 of 132, 64 steps), 8192^3 (68 of 132) and the M=256 decode (64 tiles, one partial round) not
    def sk(m, n, k):
        return [c.label() for c in C.candidates(problem(m, n, k), H200) if c.stream_k]
    assert sk(16384, 8192, 28672) == ["P128x256x64-w8-s3-tma-sk", "P128x256x64-w8-s4-tma-sub2-sk"]
    assert sk(4096, 4096, 4096) == sk(8192, 8192, 8192) == sk(256, 8192, 8192) == sk(2048, 2048, 2048) == []
    assert sk(16384, 8192, 4096) == []  # 4096 tiles again, but 64 steps a tile: the round is short
    cfg = C.GemmConfig("persistent", 128, 256, 64, stream_k=True)
    assert not C.stream_k_worth_it(cfg, problem(128 * 132, 256 * 2, 8192), H200)  # whole rounds: no tail


# ------------------------------------------------------------------------------------- registration
def test_registered_with_the_target_matrix():
    from tilefuse import kernels

    kernels.load_all()
    specs = targets.kernels()
    for name in ("gemm_tiled", "gemm_splitk", "gemm_persistent", "gemm_int8", "gemm_quantize_rows"):
        assert name in specs
    for name in ("gemm_tiled", "gemm_splitk", "gemm_persistent"):
        assert specs[name].expect_mma == {"sm_80": "mma.sync", "sm_90a": "wgmma", "sm_100a": "tcgen05",
                                          "gfx90a": "v_mfma", "gfx942": "v_mfma", "gfx950": "v_mfma"}
    for spec in specs.values():
        if spec.family != "gemm":
            continue
        for target in targets.ALL_TARGETS:
            examples = spec.examples(target)
            assert examples
            for ex in examples:
                assert list(ex.signature) == list(spec.fn.arg_names), (spec.name, ex.label)
                assert all(ex.constexprs.get(n, "missing") != "missing" for n, t in ex.signature.items()
                           if t == "constexpr")
    # fp8 examples where the target has fp8 MMA, int8 everywhere
    assert any("fp8e4nv" in ex.label for ex in specs["gemm_tiled"].examples("sm_90a"))
    assert any("fp8e4b8" in ex.label for ex in specs["gemm_tiled"].examples("gfx942"))
    assert not any("fp8" in ex.label for ex in specs["gemm_tiled"].examples("sm_80"))


@pytest.mark.slow
def test_cross_compiles_with_the_right_mma():
    proc = subprocess.run([sys.executable, "-m", "tilefuse", "targets", "--kernel", "gemm_splitk",
                           "--target", "sm_90a,gfx942", "--json", "--triton-only"],
                          capture_output=True, text=True, timeout=600)
    data = json.loads(proc.stdout)
    assert data["failures"] == 0, [r for r in data["results"] if not r["ok"]]
    mma = {r["target"]: r["mma"] for r in data["results"]}
    assert mma == {"sm_90a": "wgmma", "gfx942": "v_mfma"}


# ---------------------------------------------------------------------------------------- the suite
@interpreter_only
def test_bench_suite_smoke_rows_are_checked_and_ok():
    from tilefuse.bench import runner

    rows = runner.run_suite("gemm", runner.SuiteOptions(smoke=True, only=("mm/", "int8/"), log=lambda s: None))
    assert rows and all(r.status == "ok" or r.status.startswith("not run") for r in rows), \
        [(r.case, r.impl, r.status) for r in rows]
    assert {r.impl for r in rows} >= {"cublas", "tilefuse"}
    ours = [r for r in rows if r.impl == "tilefuse" and r.case.startswith("mm/")]
    assert all(r.baseline == "cublas" and r.vs_baseline is not None for r in ours)


def test_sweep_needs_a_gpu():
    from tilefuse.bench import gemm_suite

    with pytest.raises(SystemExit, match="needs a GPU"):
        gemm_suite.main(["--sweep", "--shape", "64x64x64"])
    assert len(gemm_suite.gemm_shapes(__import__("tilefuse.bench.runner").bench.runner.SuiteOptions())) == 14


def test_a_tie_goes_to_the_space_order(tmp_cache, monkeypatch):
    """Scores within TUNE_TIE of the best are a tie, settled by the candidates' order (the space's sweeps); a
    later candidate faster by more than that still wins. The 128x8192x8192 final of
    docs/decisions/019-gemm-tuner-timing.md, as canned times."""
    _tagged_bound(monkeypatch)
    c = [C.GemmConfig("tiled", 32, 32, 16), C.GemmConfig("tiled", 16, 32, 16)]
    inf = float("inf")
    assert T.settle_ties({c[0]: 0.0457, c[1]: 0.0456}, c) == (0.0457, c[0])
    assert T.settle_ties({c[0]: 0.0457, c[1]: 0.0456}, c[::-1]) == (0.0456, c[1])
    assert T.settle_ties({c[0]: 0.0460, c[1]: 0.0456}, c) == (0.0456, c[1])  # 0.9 % apart: not a tie
    assert T.settle_ties({c[0]: inf, c[1]: 0.0456}, c) == (0.0456, c[1])
    assert T.settle_ties({c[0]: inf}, c) is None
    # a candidate missing from the order (a failed one's time is inf) is still ranked by its score
    assert T.settle_ties({c[1]: 0.0456}, [c[0]]) == (0.0456, c[1])

    ops = G.prepare(torch.randn(24, 16), torch.randn(16, 40), activation="relu")
    runs = {c[0]: [0.0451, 0.0457, 0.0457], c[1]: [0.0456, 0.0455, 0.0456]}

    def timer(fn, best):
        fn()
        return runs[fn.cfg].pop(0)
    assert T.tune(ops, c, timer=timer) == c[0]
    entry = json.loads(T._path(T.key_of(ops.problem)).read_text())
    assert entry["winner_label"] == c[0].label() and entry["winner_ms"] == 0.0457
    assert entry["final"] == {c[0].label(): [0.0451, 0.0457, 0.0457], c[1].label(): [0.0456, 0.0455, 0.0456]}
