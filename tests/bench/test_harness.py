from tilefuse.bench import harness, report


def _recorder():
    return harness.Recorder("unit", smoke=True, log=lambda s: None)


def test_recorder_times_and_computes_ratio_to_baseline():
    rec = _recorder()
    work = list(range(20000))
    rec.time("sum", "peer", lambda: sum(work), dtype="int", shape=20000, bytes_moved=8 * 20000)
    rec.time("sum", "ours", lambda: sum(work[:10000]), dtype="int", shape=20000, bytes_moved=8 * 20000, baseline="peer")
    rows = rec.finish()
    peer, ours = rows
    assert peer.ok and ours.ok and peer.ms_p50 > 0 and ours.gbps > 0
    assert ours.vs_baseline == peer.ms_p50 / ours.ms_p50
    assert "smoke" in ours.note


def test_failures_are_rows_with_a_status():
    rec = _recorder()
    rec.time("c", "boom", lambda: 1 / 0, dtype="f", shape=1)
    rec.time("c", "wrong", lambda: None, dtype="f", shape=1, check=lambda: "rel error 0.5")
    rec.skip("c", "absent", "needs a GPU")
    rows = rec.finish()
    assert [r.status.split(":")[0] for r in rows] == ["error", "wrong", "not run"]
    assert rows[0].status.startswith("error: ZeroDivisionError")
    assert all(r.ms_p50 is None for r in rows)


def test_csv_round_trip_keeps_the_design_columns(tmp_path):
    rec = _recorder()
    rec.time("c", "x", lambda: None, dtype="bf16", shape="4x4", flops=1e9)
    path = harness.write_csv(rec.finish(), tmp_path / "r.csv")
    header = path.read_text().splitlines()[0].split(",")
    for column in "suite,case,impl,dtype,shape,ms_p50,tflops,gbps,vs_baseline,gpu,torch,triton,git_sha,date".split(","):
        assert column in header
    (row,) = harness.read_csv(path)
    assert row.case == "c" and row.ms_p50 > 0 and row.tflops > 0 and row.status == "ok"


def test_rotation_covers_several_l2_sizes():
    assert harness.rotation_sets(bytes_per_set=10 << 20, l2_bytes=60 << 20) == 8  # capped
    assert harness.rotation_sets(bytes_per_set=100 << 20, l2_bytes=60 << 20) == 2
    assert harness.rotation_sets(bytes_per_set=1 << 30, l2_bytes=60 << 20) == 1
    calls = []
    rot = harness.Rotating(lambda x: calls.append(x), [(1,), (2,), (3,)])
    for _ in range(4):
        rot()
    assert calls == [1, 2, 3, 1]


def test_geomean():
    assert abs(harness.geomean([1.0, 4.0]) - 2.0) < 1e-12
    assert harness.geomean([]) is None


def test_report_shows_ratios_and_not_run_rows(tmp_path):
    rec = _recorder()
    rec.time("gemm 8", "cublas", lambda: sum(range(20000)), dtype="bf16", shape="8", flops=1e12)
    rec.time("gemm 8", "tilefuse", lambda: sum(range(10000)), dtype="bf16", shape="8", flops=1e12, baseline="cublas")
    rec.skip("gemm 8", "rung9", "no GPU", dtype="bf16")
    text = report.render(rec.finish())
    assert "### unit" in text and "× cublas (cublas time / tilefuse time)" in text and "not run" in text and "geomean" in text
    png = report.plot(rec.rows, tmp_path / "r.png")
    assert png.stat().st_size > 1000


def _drifting_bench(base: dict, calls: list):
    """A stand-in for do_bench whose GPU slows by 10 % a call (clocks drifting down at the power limit)."""
    def bench(fn, *, warmup_ms=25, rep_ms=100, smoke=False):
        impl = fn()
        t = base[impl] * (1 + 0.1 * len(calls))
        calls.append((impl, rep_ms))
        return t, t * 0.99, t * 1.01
    return bench


def test_interleaved_rounds_cancel_a_drift(monkeypatch):
    base, calls = {"peer": 1.0, "ours": 2.0}, []
    monkeypatch.setattr(harness, "bench", _drifting_bench(base, calls))
    rec = harness.Recorder("t", rep_ms=100)
    rows = rec.time_interleaved("c", [("peer", lambda: "peer", {}), ("ours", lambda: "ours", {"baseline": "peer"})],
                                dtype="bf16", shape="1", rounds=4)
    rec.finish()
    assert [c[0] for c in calls] == ["peer", "ours", "ours", "peer", "peer", "ours", "ours", "peer"]
    assert all(c[1] == 25 for c in calls)  # each round a quarter of rep_ms
    assert abs(rows[1].vs_baseline - 0.5) < 1e-9, rows[1].vs_baseline
    assert rows[0].ms_p20 < rows[0].ms_p50 < rows[0].ms_p80
    # the same drift timed one impl after the other is off by the drift: what the rounds are for
    calls.clear()
    rec2 = harness.Recorder("t", rep_ms=100)
    rec2.time("c", "peer", lambda: "peer", dtype="bf16", shape="1")
    rec2.time("c", "ours", lambda: "ours", dtype="bf16", shape="1", baseline="peer")
    rec2.finish()
    assert abs(rec2.rows[1].vs_baseline - 0.5) > 0.04


def test_interleaved_medians_rotate_the_order(monkeypatch):
    """The sweeps' and probes' rounds: each round starts one entry later, every entry once a round."""
    import triton.testing

    calls = []
    monkeypatch.setattr(triton.testing, "do_bench",
                        lambda fn, warmup, rep, return_mode: calls.append((fn(), rep)) or float(len(calls)))
    samples = harness.interleaved_medians([("a", lambda: "a"), ("b", lambda: "b"), ("c", lambda: "c")], 3, 7)
    assert [c[0] for c in calls] == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert all(c[1] == 7 for c in calls)
    assert samples == {"a": [1.0, 6.0, 8.0], "b": [2.0, 4.0, 9.0], "c": [3.0, 5.0, 7.0]}


def test_interleaved_wrong_and_failing_impls_are_rows(monkeypatch):
    calls = []
    monkeypatch.setattr(harness, "bench", _drifting_bench({"a": 1.0, "c": 1.0}, calls))

    def boom():
        raise RuntimeError("launch failed")

    rec = harness.Recorder("t")
    rows = rec.time_interleaved("c", [("a", lambda: "a", {}), ("b", lambda: "b", {"check": lambda: "max error 3"}),
                                      ("c", lambda: "c", {"check": boom})], dtype="bf16", shape="1")
    assert rows[0].ok and rows[1].status == "wrong: max error 3" and rows[2].status.startswith("error: RuntimeError")
    assert {c[0] for c in calls} == {"a"}


def test_explicit_git_sha_wins_over_the_enclosing_checkout(monkeypatch):
    """A snapshot run inside another checkout records the commit it was told, not that checkout's HEAD."""
    import dataclasses

    from tilefuse import config
    real = config.get()
    monkeypatch.setattr(config, "get", lambda: dataclasses.replace(real, git_sha="abc123def456"))
    assert harness.environment()["git_sha"] == "abc123def456"
    monkeypatch.setattr(config, "get", lambda: dataclasses.replace(real, git_sha=""))
    assert harness.environment()["git_sha"] == (harness._git_sha() or "unknown")
