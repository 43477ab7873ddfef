"""Every benchmark suite runs in smoke mode (tiny shapes on the interpreter, as CI runs `tilefuse bench SUITE
--smoke`) through the runner's CLI path, and its CSV has DESIGN.md's columns and sane content.

A suite module that does not exist yet (colleagues are writing them) is skipped with that reason; one that
exists and errors, writes a wrong result, or produces no timed row fails.
"""
from __future__ import annotations

import argparse
import csv
import importlib.util
import math
import re

import pytest

from tilefuse.bench import harness, runner

from tests.support import interpreter_only

DESIGN_COLUMNS = "suite,case,impl,dtype,shape,ms_p50,tflops,gbps,vs_baseline,gpu,torch,triton,git_sha,date".split(",")
STATUS = re.compile(r"^(ok|not run: .+|error: .+|wrong: .+)$")
NUMERIC = ("ms_p50", "tflops", "gbps", "vs_baseline", "pct_ceiling", "ms_p20", "ms_p80")

# What each suite must show in a smoke run, beyond the generic checks.
REQUIRED_IMPLS = {
    "compiler": {"eager", "tilefuse", "inductor", "inductor-max-autotune", "tilefuse-compile-cold",
                 "inductor-compile-cold", "tilefuse-compile-warm"},
}
TIMED_IMPLS = {"compiler": {"eager", "tilefuse", "tilefuse-compile-cold", "tilefuse-compile-warm"}}
REQUIRED_CASES = {
    "compiler": {"softmax", "log_softmax", "layer_norm", "rms_norm", "gelu_chain", "silu_chain",
                 "residual_layer_norm", "cross_entropy", "softmax_fwd_bwd", "layer_norm_fwd_bwd",
                 "layer_norm_gelu_fwd_bwd", "cross_entropy_fwd_bwd",
                 # GEMM-bound rows (their Inductor max-autotune impl is "not run" on the interpreter)
                 "linear_bias_gelu", "swiglu_ffn_fwd_bwd", "attention_projections_fwd_bwd",
                 "attention_projections_params_fwd_bwd"},
}


# Cases a suite's smoke run keeps here, where the whole smoke run is slow on the interpreter (the models suite's
# seven tiny models take ~6 minutes; tests/bench/test_bench_models.py runs a language model and the UNet in training).
SMOKE_ONLY = {"models": ["vit"]}


def _suite_module(name: str) -> str:
    return f"tilefuse.bench.{name}_suite"


@pytest.mark.slow
@interpreter_only
@pytest.mark.parametrize("name", list(runner.SUITES))
def test_suite_smoke_run_writes_sane_rows(name, tmp_path, capsys):
    if importlib.util.find_spec(_suite_module(name)) is None:
        pytest.skip(f"{_suite_module(name)} does not exist yet (a colleague is writing it)")
    args = argparse.Namespace(suites=[name], out=str(tmp_path), quick=False, smoke=True,
                              only=SMOKE_ONLY.get(name, []), rep_ms=100)
    status = runner.main(args)
    out = capsys.readouterr().out
    path = tmp_path / f"{name}-smoke.csv"
    assert path.exists(), f"no CSV written for {name}: {out[-2000:]}"
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        header = reader.fieldnames or []
        raw = list(reader)
    missing = [c for c in DESIGN_COLUMNS if c not in header]
    assert not missing, f"{name}: CSV lacks DESIGN.md columns {missing}"
    assert raw, f"{name}: the smoke run wrote no rows"
    rows = harness.read_csv(path)

    bad = [f"{r.case}/{r.impl}: {r.status}" for r in rows if r.status.startswith(("error", "wrong"))]
    assert not bad, f"{name}: rows that errored or were wrong in the smoke run: {bad}"
    assert status == 0, f"{name}: runner exit status {status}"
    assert any(r.ok for r in rows), f"{name}: no row has a time"

    seen = set()
    for r, text in zip(rows, raw):
        where = f"{name} row {r.case}/{r.impl}"
        assert r.suite == name, f"{where}: suite column {r.suite!r}"
        assert r.case and r.impl and r.dtype, f"{where}: empty case/impl/dtype"
        assert STATUS.match(r.status), f"{where}: status {r.status!r}"
        for field in ("gpu", "torch", "triton", "git_sha"):
            assert getattr(r, field), f"{where}: empty {field}"
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", r.date), f"{where}: date {r.date!r}"
        assert "smoke" in r.note, f"{where}: a smoke row must say so in its note: {r.note!r}"
        for field in NUMERIC:
            value = getattr(r, field)
            if value is not None:
                assert math.isfinite(value) and value >= 0, f"{where}: {field}={value}"
        if r.ok:
            assert r.ms_p50 > 0, f"{where}: ok row with ms_p50={r.ms_p50}"
            assert r.ms_p20 is None or r.ms_p20 <= r.ms_p50 + 1e-9, f"{where}: p20 {r.ms_p20} > p50 {r.ms_p50}"
            assert r.ms_p80 is None or r.ms_p80 + 1e-9 >= r.ms_p50, f"{where}: p80 {r.ms_p80} < p50 {r.ms_p50}"
        else:
            assert r.ms_p50 is None and not text["ms_p50"], f"{where}: a row that did not run has a time"
        if r.vs_baseline is not None:
            assert r.baseline, f"{where}: vs_baseline without a baseline"
            peer = next((p for p in rows if p.case == r.case and p.dtype == r.dtype and p.impl == r.baseline
                         and p.ok), None)
            assert peer is not None, f"{where}: vs_baseline against {r.baseline!r}, which has no timed row"
            assert math.isclose(r.vs_baseline, peer.ms_p50 / r.ms_p50, rel_tol=1e-3), f"{where}: vs_baseline"
        key = (r.case, r.impl, r.dtype, r.shape)
        assert key not in seen, f"{where}: duplicate row {key}"
        seen.add(key)

    impls = {r.impl for r in rows}
    need = REQUIRED_IMPLS.get(name, set()) - impls
    assert not need, f"{name}: smoke run has no rows for {sorted(need)}"
    timed = {r.impl for r in rows if r.ok}
    untimed = TIMED_IMPLS.get(name, set()) - timed
    assert not untimed, f"{name}: no timed row for {sorted(untimed)} in the smoke run"
    cases = {r.case for r in rows}
    absent = REQUIRED_CASES.get(name, set()) - cases
    assert not absent, f"{name}: cases missing: {sorted(absent)}"
    if name == "compiler":
        # the compile-time rows say what the child's cache did: the cold process writes the kernels' sources,
        # the warm one (same cache) writes none and reads them back
        written = {}
        for r in rows:
            m = re.search(r"kernel sources written (\d+), read from the disk cache (\d+)", r.note)
            if r.impl in ("tilefuse-compile-cold", "tilefuse-compile-warm") and r.ok:
                assert m, f"{r.case}/{r.impl}: no kernel counts in the note {r.note!r}"
                written[(r.case, r.impl)] = (int(m.group(1)), int(m.group(2)))
        assert written and any(w > 0 for (c, i), (w, _) in written.items() if i == "tilefuse-compile-cold")
        warm = {c: v for (c, i), v in written.items() if i == "tilefuse-compile-warm"}
        assert warm and all(w == 0 for w, _ in warm.values()), f"the warm compile wrote kernel sources: {warm}"
        assert any(hits > 0 for _, hits in warm.values()), warm  # (a kernel an earlier case loaded is not read again)


def test_compiler_suite_bytes_are_the_minimum():
    """bytes_moved: each input read once, each output (and gradient) written once; forward + backward also
    the backward pass's read of what it needs from the forward (one input-sized tensor, two for SwiGLU)."""
    if importlib.util.find_spec(_suite_module("compiler")) is None:
        pytest.skip("tilefuse.bench.compiler_suite does not exist yet")
    import torch

    from tilefuse.bench import compiler_suite as cs

    rows, cols = 13, 257
    by = {g.case: g for g in cs.GRAPHS}
    x = 4 * rows * cols  # one fp32 matrix
    v = 4 * cols
    expect = {
        "softmax": 2 * x,
        "layer_norm": 2 * x + 2 * v,
        "residual_layer_norm": 4 * x + 2 * v,  # x, r read; h, y written
        "silu_chain": 3 * x,
        "softmax_fwd_bwd": 5 * x,  # x, dy read; y, dx written; y (or x) read again by the backward
        "layer_norm_fwd_bwd": 5 * x + 4 * v,  # x, w, b, dy read; y, dx, dw, db written; x read again
        "silu_chain_fwd_bwd": 8 * x,  # a, g, dy read; y, da, dg written; a, g read again
        "residual_layer_norm_fwd_bwd": 9 * x + 4 * v,  # x, r, w, b, dh, dy; h, y, dx, dr, dw, db; h again
    }
    one_pass = {"softmax_fwd_bwd": 4 * x, "silu_chain_fwd_bwd": 6 * x}
    for case, nbytes in expect.items():
        g = by[case]
        args = cs.prepare(g, g.inputs(rows, cols, 1000, torch.float32, "cpu"))
        assert cs.minimal_bytes(g, args) == nbytes, f"{case}: {cs.minimal_bytes(g, args)} != {nbytes}"
        if case in one_pass:
            assert cs.minimal_bytes(g, args, two_pass=False) == one_pass[case]
    ce = by["cross_entropy"]
    args = cs.prepare(ce, ce.inputs(rows, cols, 1000, torch.float32, "cpu"))
    assert cs.minimal_bytes(ce, args) == 4 * rows * 1000 + 8 * rows + 4


def test_compiler_suite_params_row_holds_its_weights_as_parameters():
    """attention_projections_params_fwd_bwd: the weights are a module's parameters, so AOTAutograd counts them
    static inputs (used in place under CUDA graphs, not copied a replay), the rotating sets share them and leave
    them out of their bytes, and the step's outputs and gradients are the plain row's on the same values."""
    import torch
    from functorch.compile import make_boxed_func
    from torch._functorch.aot_autograd import aot_module_simplified

    from tilefuse.bench import compiler_suite as cs

    by = {g.case: g for g in cs.GRAPHS}
    g, plain = by["attention_projections_params_fwd_bwd"], by["attention_projections_fwd_bwd"]
    assert g.params and g.backward and not plain.params
    torch.manual_seed(0)
    args = cs.prepare(g, cs.as_parameters(g, g.inputs(13, 32, 48, torch.float32, "cpu")))
    weights = cs.weights_of(g, args)
    assert len(weights) == 4 and all(isinstance(w, torch.nn.Parameter) and w.requires_grad for w in weights)
    x, cots = args[0], args[5:]
    assert len(cots) == 3 and not isinstance(x, torch.nn.Parameter)

    sets = cs.rotating_sets(g, args, 3, lambda: g.inputs(13, 32, 48, torch.float32, "cpu"))
    assert all(s[1:5] == weights and all(a is b for a, b in zip(s[1:5], weights)) for s in sets)
    assert sets[1][0] is not x and sets[1][5] is not cots[0]
    nbytes = lambda ts: sum(t.numel() * t.element_size() for t in ts)  # noqa: E731
    assert cs.rotating_bytes(g, args) == nbytes([x, *cots])
    assert cs.rotating_bytes(plain, args) == nbytes(args)

    seen = {}

    def backend(gm, example_inputs):
        def fw(fgm, inputs):
            seen["static"] = sorted(torch._guards.TracingContext.get().fw_metadata.static_input_indices)
            seen["n"] = len(inputs)
            return make_boxed_func(fgm)
        return aot_module_simplified(gm, example_inputs, fw_compiler=fw,
                                     bw_compiler=lambda b, i: make_boxed_func(b))

    torch._dynamo.reset()
    outs, grads = cs.step_of(g, args, lambda fn: torch.compile(fn, backend=backend))(*args)
    assert seen["n"] == 5 and len(seen["static"]) == 4, seen  # the four weights, not x
    want_outs, want_grads = cs.make_step(plain, plain.fn)(*[t.detach().requires_grad_() for t in args[:5]], *cots)
    assert len(grads) == 5
    for a, b in zip([*outs, *grads], [*want_outs, *want_grads]):
        torch.testing.assert_close(a, b)
    torch._dynamo.reset()


def test_compiler_suite_check_catches_a_wrong_answer():
    """The suite's check= rejects an implementation that is off by more than the bf16 tolerance."""
    if importlib.util.find_spec(_suite_module("compiler")) is None:
        pytest.skip("tilefuse.bench.compiler_suite does not exist yet")
    import torch

    from tilefuse.bench import compiler_suite as cs

    g = next(g for g in cs.GRAPHS if g.case == "layer_norm_fwd_bwd")
    args = cs.prepare(g, g.inputs(64, 257, 1000, torch.bfloat16, "cpu"))
    ref = cs.reference(g, args)
    eager = [t.detach() for t in cs._flat(cs.make_step(g, g.fn)(*args))]
    assert cs.check_against(eager, ref, eager, torch.bfloat16) is None
    wrong = [t * 1.1 for t in eager]
    assert cs.check_against(wrong, ref, eager, torch.bfloat16) is not None
    nan = [t.clone() for t in eager]
    nan[1].view(-1)[7] = float("nan")
    assert cs.check_against(nan, ref, eager, torch.bfloat16) is not None


def test_compiler_suite_kernels_row(monkeypatch):
    """record_kernel_time: an ``<impl>-kernels`` row with the median of the profiled rounds (p20/p80 their
    least and most), the bytes' share of the copy ceiling, Inductor's kernels as baseline, returned for
    note_host_times; a profiler failure is an error row, not a missing one; a smoke run says it did not run."""
    if importlib.util.find_spec(_suite_module("compiler")) is None:
        pytest.skip("tilefuse.bench.compiler_suite does not exist yet")
    from tilefuse.bench import compiler_suite as cs

    g = next(g for g in cs.GRAPHS if g.case == "softmax_fwd_bwd")
    monkeypatch.setattr(cs, "kernel_ms", lambda call: [0.30, 0.25, 0.40])
    monkeypatch.setattr(cs, "host_us", lambda call: pytest.fail("the host time is timed by note_host_times"))
    rec = harness.Recorder("compiler", ceiling_gbps=4000.0, log=lambda s: None)
    gpu = argparse.Namespace(smoke=False)
    row = cs.record_kernel_time(rec, g, "tilefuse", lambda: None, [[]], gpu, dtype="bfloat16", shape="8x8",
                                bytes_moved=1.2e9)
    assert row is rec.rows[-1]
    assert (row.impl, row.ms_p50, row.ms_p20, row.ms_p80, row.baseline) == \
        ("tilefuse-kernels", 0.30, 0.25, 0.40, "inductor-kernels")
    assert math.isclose(row.gbps, 1.2e9 / 0.30e-3 / 1e9) and math.isclose(row.pct_ceiling, 100 * row.gbps / 4000)

    def broken(call):
        raise RuntimeError("CUPTI not available")

    monkeypatch.setattr(cs, "kernel_ms", broken)
    assert cs.record_kernel_time(rec, g, "inductor", lambda: None, [[]], gpu, dtype="bfloat16", shape="8x8",
                                 bytes_moved=1.2e9) is None
    assert rec.rows[-1].impl == "inductor-kernels" and rec.rows[-1].status.startswith("error: RuntimeError")
    assert cs.record_kernel_time(rec, g, "tilefuse", lambda: None, [[]], argparse.Namespace(smoke=True),
                                 dtype="bfloat16", shape="8x8", bytes_moved=1.2e9) is None
    assert rec.rows[-1].status.startswith("not run: smoke run")


def test_compiler_suite_host_times_are_alternated(monkeypatch):
    """note_host_times: every compiled impl's host time a step is timed once a round, each round starting one impl
    later, so that drift of the host falls on all of them; each -kernels row's note gets its median and range;
    a failing timing is said in every note, not dropped."""
    from tilefuse.bench import compiler_suite as cs

    order = []
    hosts = {"tilefuse": iter([530.0, 512.4, 498.0, 700.2, 505.0]),
             "inductor": iter([610.0, 600.0, 590.0, 620.0, 605.0]),
             "tilefuse-reduce-overhead": iter([520.0, 515.0, 900.0, 510.0, 517.0])}
    monkeypatch.setattr(cs, "host_us", lambda call: (order.append(call()), next(hosts[call()]))[1])
    rows = {n: harness.Row("compiler", "softmax_fwd_bwd", f"{n}-kernels", "bfloat16", "8x8", note="GPU time")
            for n in hosts}
    cs.note_host_times(rows, {n: (lambda n=n: n) for n in hosts})
    names = list(hosts)
    assert order == [n for r in range(cs.HOST_ROUNDS) for n in names[r % 3:] + names[:r % 3]], order
    assert rows["tilefuse"].note == ("GPU time; host 512 us a step (median of 5 rounds of 20 steps, alternated with "
                                     "the graph's other 2 compiled impls: 498-700)"), rows["tilefuse"].note
    assert "host 605 us a step" in rows["inductor"].note and "host 517 us" in rows["tilefuse-reduce-overhead"].note

    def broken(call):
        raise RuntimeError("device lost")

    monkeypatch.setattr(cs, "host_us", broken)
    rows = {n: harness.Row("compiler", "softmax_fwd_bwd", f"{n}-kernels", "bfloat16", "8x8", note="GPU time")
            for n in ("tilefuse", "inductor")}
    cs.note_host_times(rows, {n: (lambda: None) for n in rows})
    assert all(r.note == "GPU time; host time not measured: RuntimeError: device lost" for r in rows.values())


def test_recorder_measures_missing_ceilings_on_a_gpu(monkeypatch):
    """A fresh GPU machine has no cached ceilings: the suite measures them first (so pct_ceiling is filled)
    and says so; an interpreter run never measures."""
    from tilefuse import device
    fake = device.Device("nvidia", "H-test", "sm_90", 132, 32, False, "cuda")
    measured = device.Ceilings("H-test", 4000.0, 700.0, 650.0, 8192, "t", "t", "now")
    calls, logged = [], []
    monkeypatch.setattr(device, "current", lambda: fake)
    monkeypatch.setattr(device, "ceilings", lambda *a: None)
    monkeypatch.setattr(device, "measure_ceilings", lambda: calls.append(1) or measured)
    rec = runner.SuiteOptions(log=logged.append).recorder("compiler", compute_bound=False)
    assert calls == [1] and rec.ceiling_gbps == 4000.0 and rec.ceiling_tflops is None
    assert any("measuring copy bandwidth" in m for m in logged), logged
    rec = runner.SuiteOptions(log=logged.append).recorder("gemm", compute_bound=True)
    assert calls == [1, 1] and rec.ceiling_tflops == 700.0
    monkeypatch.setattr(device, "current", lambda: device.Device("cpu", "cpu", "cpu", 8, 32, True, "cpu"))
    rec = runner.SuiteOptions(log=logged.append).recorder("compiler", compute_bound=False)
    assert calls == [1, 1] and rec.ceiling_gbps is None


def test_rows_option_is_the_compiler_suites_alone(monkeypatch):
    """--rows sets the compiler suite's row count, for its timed graphs and its compile-time child alike; with
    another suite, --smoke or a count below 1 it is an error that names the option, before anything runs."""
    from tilefuse.bench import compiler_suite as cs

    for suites, smoke, rows in ((["gemm"], False, 65536), (["compiler", "ladder"], False, 65536),
                                (["compiler"], True, 65536), (["compiler"], False, -4)):
        args = argparse.Namespace(suites=suites, out="/nonexistent", quick=False, smoke=smoke, only=[], rep_ms=100,
                                  rows=rows)
        with pytest.raises(ValueError, match="--rows"):
            runner.main(args)
    assert cs._sizes(runner.SuiteOptions(rows=65536))[0] == 65536
    assert cs._sizes(runner.SuiteOptions())[0] == cs.ROWS == 32768
    seen = []

    def fake_run(cmd, **kw):
        seen.append(cmd)
        return argparse.Namespace(returncode=1, stdout="", stderr="stopped here")

    monkeypatch.setattr(cs.subprocess, "run", fake_run)
    cs._child("tilefuse", ["softmax"], False, {}, lambda s: None, 65536)
    cs._child("tilefuse", ["softmax"], False, {}, lambda s: None)
    assert seen[0][-2:] == ["--rows", "65536"] and "--rows" not in seen[1]


def test_reduce_overhead_option_times_the_backward_graphs_under_cuda_graphs(monkeypatch):
    """--reduce-overhead: the compiler suite alone (else an error naming the option, before anything runs);
    forward + backward graphs gain both backends' reduce-overhead impls, forward-only graphs do not; those impls
    compile with mode="reduce-overhead" and begin a CUDA-graph generation before each step."""
    from tilefuse.bench import compiler_suite as cs

    args = argparse.Namespace(suites=["models"], out="/nonexistent", quick=False, smoke=True, only=[], rep_ms=100,
                              reduce_overhead=True)
    with pytest.raises(ValueError, match="--reduce-overhead: accepted for the compiler suite alone"):
        runner.main(args)
    on, off = runner.SuiteOptions(reduce_overhead=True), runner.SuiteOptions()
    bwd = next(g for g in cs.GRAPHS if g.case == "softmax_fwd_bwd")
    fwd = next(g for g in cs.GRAPHS if g.case == "softmax")
    assert cs.impls(bwd, on) == cs.IMPLS + ("inductor-reduce-overhead", "tilefuse-reduce-overhead")
    assert cs.impls(bwd, off) == cs.impls(fwd, on) == cs.IMPLS
    compiled, marks = [], []
    monkeypatch.setattr(cs.torch, "compile", lambda fn, **kw: compiled.append(kw) or fn)
    monkeypatch.setattr(cs.torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(1))
    cs._compile("tilefuse-reduce-overhead", cs.softmax)
    cs._compile("inductor-reduce-overhead", cs.softmax)
    assert compiled == [dict(backend="tilefuse", mode="reduce-overhead"),
                        dict(backend="inductor", mode="reduce-overhead")]
    step = cs._marking_steps(lambda x: x + 1)
    assert step(1) == 2 and step(2) == 3 and marks == [1, 1]
    stats = dict(cudagraph_recordings=2, cudagraph_replays=40, cudagraph_uncaptured_calls=3,
                 cudagraphs=[{"uncaptured": {}}, {"uncaptured": {"a CPU tensor input": 3}}])
    assert cs.cuda_graph_summary(stats) == \
        "cuda graphs: 2 recorded, 40 replays, 3 uncaptured calls (a CPU tensor input)"
    stats["cudagraphs"] = [{"uncaptured": {}, "call_us": 130.4, "call_gpu_us": None},
                           {"uncaptured": {"too dear": 3}, "call_us": 20.6, "call_gpu_us": 6.2}]
    assert cs.cuda_graph_summary(stats) == ("cuda graphs: 2 recorded, 40 replays, 3 uncaptured calls, calls timed at "
                                            "130 / 21 (GPU 6) us of host time (too dear)")
    stats["cudagraphs"][1]["step_trial"] = "step trial: a step took 80 us ...: kept"
    assert cs.cuda_graph_summary(stats) == ("cuda graphs: 2 recorded, 40 replays, 3 uncaptured calls, calls timed at "
                                            "130 / 21 (GPU 6) us of host time; step trial: a step took 80 us ...: "
                                            "kept (too dear)")


def test_a_models_row_of_a_reduce_overhead_backend_says_whether_its_graphs_were_captured(monkeypatch):
    import tilefuse.compiler as compiler
    from tilefuse.bench import models_suite as ms

    stats = dict(kernels=5, externs=1, fallbacks=[], cudagraph_recordings=0, cudagraph_replays=0,
                 cudagraph_uncaptured_calls=7, cudagraphs=[{"uncaptured": {"x; y makes a CPU tensor": 7}}])
    monkeypatch.setattr(compiler, "stats", lambda: stats)
    note = ms._stats_note("tilefuse-reduce-overhead")
    assert note["cudagraphs"] == "0 recorded, 0 replays, 7 uncaptured calls (x, y makes a CPU tensor)"
    assert "cudagraphs" not in ms._stats_note("tilefuse")  # (the default mode captures nothing to report)
    assert "; " not in ms._fmt_note(note).split("cudagraphs=")[1]  # one field of the row's note


@pytest.mark.gpu
def test_flushed_call_ms_times_the_call_after_the_flush():
    """harness.flushed_call_ms: the flush runs first, then one call is timed by CUDA events; a ten times longer
    call reads several times longer (the GPU's sleep instruction, ~1e6 and ~1e7 cycles, after a warm-up call: the
    first launch of a process pays for loading the kernel, 12.6 ms against 0.5 on the H200)."""
    import torch

    torch.cuda._sleep(1000)
    torch.cuda.synchronize()
    calls = []
    short = harness.flushed_call_ms(lambda: torch.cuda._sleep(1_000_000), lambda: calls.append("flush"))
    long = harness.flushed_call_ms(lambda: torch.cuda._sleep(10_000_000), lambda: calls.append("flush"))
    assert calls == ["flush", "flush"]
    assert 0 < 3 * short < long, (short, long)


def test_smoke_is_refused_where_triton_runs_on_a_gpu(monkeypatch, tmp_path, capsys):
    """The smoke forms build CPU tensors for the interpreter; in a process that runs Triton on a GPU every
    tilefuse row would be an error, so --smoke is refused before anything runs, saying how to get the run."""
    from tilefuse import cli, device

    monkeypatch.setattr(device, "interpreting", lambda: False)
    with pytest.raises(ValueError, match=r"--smoke: .*TILEFUSE_INTERPRET=1"):
        runner.SuiteOptions(smoke=True)
    assert runner.SuiteOptions(smoke=False).smoke is False
    assert cli.main(["bench", "attention", "--smoke", "--out", str(tmp_path)]) == 2
    assert "TILEFUSE_INTERPRET=1" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # nothing ran, nothing written


def test_only_matches_a_text_in_the_name_or_one_name_exactly():
    """--only softmax_fwd_bwd selects log_softmax_fwd_bwd too; --only =softmax_fwd_bwd selects that case alone;
    the compiler suite's selection follows."""
    from tilefuse.bench import compiler_suite as cs

    def picked(*only):
        return [g.case for g in cs.selected(runner.SuiteOptions(only=list(only), log=lambda s: None))]

    assert set(picked("softmax_fwd_bwd")) == {"softmax_fwd_bwd", "log_softmax_fwd_bwd"}
    assert picked("=softmax_fwd_bwd") == ["softmax_fwd_bwd"]
    assert set(picked("=softmax_fwd_bwd", "=rms_norm_fwd_bwd")) == {"softmax_fwd_bwd", "rms_norm_fwd_bwd"}
    assert picked("=softmax") == ["softmax"] and picked("=no_such_case") == []
    assert runner.SuiteOptions().wants("anything")
