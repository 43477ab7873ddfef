"""Fault injection (issue 28, "nothing silent, nothing lost"; issue 27's bf16 and out= faults).

Each test injects one fault a new user met and asserts the outcome: a correct result, one clear message
naming what was wrong, and nothing lost (a bad cache entry is deleted and rebuilt, never used and never
left behind). The faults: bad TILEFUSE_* values; a corrupt (non-UTF-8), torn or garbage cache entry; a
truncated, empty or random CUDA emulator library; a read-only or unusable cache folder; several threads and
several processes using the library and the caches at once; bad input that a cached plan would otherwise
let through; nn.Linear's errors and zero-size edge cases; numpy 2.4's removal of the array-to-scalar
conversion the interpreter relied on; bf16 dots on the interpreter; ``out=`` aliasing an input.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import tilefuse
from tilefuse import config, diskcache

from .support import assert_close, poisoned_empty

REPO = Path(__file__).resolve().parents[1]


def _python(code: str, env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter with the repository on the path (and ``env`` added)."""
    full = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
                OMP_NUM_THREADS="1")
    full.update(env or {})
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full, timeout=timeout,
                          cwd=str(REPO))


# ------------------------------------------------------------------------------------------- settings
@pytest.mark.parametrize("name, value", [("TILEFUSE_DEBUG", "yes"), ("TILEFUSE_STRICT", "sometimes"),
                                         ("TILEFUSE_INTERPRET", "cpu"), ("TILEFUSE_TUNE_WAIT_S", "soon")])
def test_a_bad_setting_warns_at_import_and_takes_its_default(name, value):
    proc = _python("import warnings; warnings.simplefilter('always')\n"
                   "import tilefuse, torch\n"
                   "print('DEBUG', tilefuse.config.get().debug)\n"
                   "print('GEMM', float((tilefuse.gemm(torch.ones(2, 3), torch.ones(3, 2)) - 3).abs().max()))",
                   {name: value})
    assert proc.returncode == 0, proc.stderr
    assert "DEBUG 0" in proc.stdout and "GEMM 0.0" in proc.stdout
    assert f"{name}={value.lower()!r}" in proc.stderr or f"{name}={value!r}" in proc.stderr
    assert "TilefuseConfigWarning" in proc.stderr and "using the default" in proc.stderr


def test_a_bad_setting_is_a_clear_error_when_loaded_strictly():
    with pytest.raises(ValueError, match=r"TILEFUSE_DEBUG='yes': expected an integer in 0\.\.3"):
        config.load({"TILEFUSE_DEBUG": "yes"})
    with pytest.warns(tilefuse.TilefuseConfigWarning, match="TILEFUSE_DEBUG='yes'"):
        assert config.load({"TILEFUSE_DEBUG": "yes"}, strict=False).debug == 0


def test_warning_categories_are_exported_and_filterable():
    for cls in (tilefuse.TilefuseFallbackWarning, tilefuse.TilefuseCacheWarning, tilefuse.TilefuseConfigWarning):
        assert issubclass(cls, tilefuse.TilefuseWarning) and issubclass(cls, UserWarning)
    with warnings.catch_warnings():
        warnings.simplefilter("error", tilefuse.TilefuseWarning)
        with pytest.raises(tilefuse.TilefuseConfigWarning):
            config.load({"TILEFUSE_STRICT": "x"}, strict=False)


# ---------------------------------------------------------------------------------------- the caches
def _cache_warnings(record) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, tilefuse.TilefuseCacheWarning)]


def _fallback_warnings(record) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, tilefuse.TilefuseFallbackWarning)]


def _pointwise_and_reduction(x, y):
    return torch.relu(x) * 2 + y.sum(-1, keepdim=True)


def test_a_corrupt_kernel_file_is_named_deleted_and_rebuilt_not_a_fallback(tmp_cache):
    """A cached kernel file with non-UTF-8 bytes made its graph fall back to ATen on every later run, silently,
    and was never repaired. Now: one warning naming the file, the graph runs on tilefuse's kernels, the file
    holds the kernel again, and the next run is a plain cache hit."""
    import tilefuse.compiler as tc
    from tilefuse.compiler import cache

    x, y = torch.randn(7, 33), torch.randn(7, 5)
    ref = _pointwise_and_reduction(x.double(), y.double())
    cache.clear_memory()  # an earlier test in this process may hold one of these kernels in memory: none on disk
    torch._dynamo.reset()
    torch.compile(_pointwise_and_reduction, backend="tilefuse")(x, y)
    files = sorted((tmp_cache / "compiler" / "kernels").glob("*.py"))
    assert files
    good = {f: f.read_bytes() for f in files}
    for f in files:
        f.write_bytes(b"\xff\xfe\x00 not a kernel \x80\x81")
    for attempt in range(2):  # the repair, then a clean hit
        cache.clear_memory()
        torch._dynamo.reset()
        tc.reset_stats()
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            out = torch.compile(_pointwise_and_reduction, backend="tilefuse")(x, y)
        assert_close(out, ref, torch.float32)
        stats = tc.stats()
        assert stats["fallbacks"] == [] and stats["graph_fallbacks"] == 0 and stats["graphs"] == 1
        assert not _fallback_warnings(record)
        said = _cache_warnings(record)
        if attempt == 0:
            assert len(said) == len(files) and all(any(str(f) in m for m in said) for f in files), said
            assert stats["kernels_compiled"] == len(files)
        else:
            assert said == [] and stats["cache_hits"] == len(files)
        assert {f: f.read_bytes() for f in files} == good  # nothing lost: every file is its kernel again


@pytest.mark.parametrize("damage", [b"", b"{\"key\": \"v3|", b"\xff\xfe\xfd garbage", b"[1, 2, 3]\n",
                                    b"{\"key\": \"someone else's\", \"winner\": {}}"])
def test_a_bad_tuning_entry_is_reported_once_deleted_and_rebuilt(tmp_cache, damage):
    from tilefuse.kernels import gemm as G
    from tilefuse.kernels.gemm import configs as C
    from tilefuse.kernels.gemm import tuning as T

    ops = G.prepare(torch.randn(9, 12), torch.randn(12, 10))
    cfg = C.GemmConfig("tiled", 32, 32, 16)
    T.tune(ops, [cfg], timer=lambda fn, best: 1.0)
    path = T._path(T.key_of(ops.problem))
    assert T.stored(ops.problem) == cfg
    path.write_bytes(damage)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert T.stored(ops.problem) is None  # a miss: never a crash, never a wrong config
        assert T.stored(ops.problem) is None  # (and no second message: it was deleted)
    said = _cache_warnings(record)
    assert len(said) == 1 and str(path) in said[0] and "deleted" in said[0], said
    assert not path.exists()
    T.tune(ops, [cfg], timer=lambda fn, best: 1.0)  # rebuilt by its owner
    assert T.stored(ops.problem) == cfg


def test_read_json_guards_the_parse_and_the_content(tmp_cache):
    path = diskcache.folder("faults") / "entry.json"
    diskcache.write_json(path, {"n": 3})
    assert path.stat().st_mode & 0o777 == diskcache.FILE_MODE  # as open() would make it, not mkstemp's 0600
    assert diskcache.read_json(path, check=lambda v: v["n"] == 3) == {"n": 3}
    with pytest.warns(tilefuse.TilefuseCacheWarning, match=r"entry\.json.*KeyError"):
        assert diskcache.read_json(path, check=lambda v: v["m"]) is None
    assert not path.exists() and diskcache.read_json(path) is None  # a miss, silently: nothing is there


@pytest.mark.slow
def test_an_unusable_cache_folder_means_a_private_one_and_one_warning(tmp_path):
    """TILEFUSE_CACHE_DIR under a regular file (mkdir fails, as on a read-only folder): every graph fell back
    to ATen and `tilefuse targets` died with a raw OSError. Now: one warning naming the folder, the compiler
    and the GEMM run on tilefuse's kernels, the CLI works."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    env = {"TILEFUSE_CACHE_DIR": str(blocker / "cache")}
    proc = _python("import warnings; warnings.simplefilter('always')\n"
                   "import torch, tilefuse, tilefuse.compiler as tc\n"
                   "from tests.test_faults import _pointwise_and_reduction as f\n"
                   "x, y = torch.randn(7, 33), torch.randn(7, 5)\n"
                   "assert torch.allclose(torch.compile(f, backend='tilefuse')(x, y), f(x, y), atol=1e-5)\n"
                   "a, b = torch.randn(20, 9), torch.randn(9, 11)\n"
                   "assert torch.allclose(tilefuse.gemm(a, b), a @ b, atol=1e-5)\n"
                   "s = tc.stats(); print('STATS', s['graphs'], s['kernels'], len(s['fallbacks']))\n"
                   "print('ROOT', tilefuse.diskcache.root())", env)
    assert proc.returncode == 0, proc.stderr
    assert "STATS 1 2 0" in proc.stdout
    assert proc.stderr.count("TilefuseCacheWarning") == 1 and str(blocker / "cache") in proc.stderr
    assert "TilefuseFallbackWarning" not in proc.stderr
    private = proc.stdout.split("ROOT ")[1].strip()
    assert not Path(private).exists()  # removed at exit
    cli = subprocess.run([sys.executable, "-m", "tilefuse", "targets", "--kernel", "gemm_tiled", "--target", "sm_90a",
                          "--triton-only"], capture_output=True, text=True, cwd=str(REPO), timeout=600,
                         env=dict(os.environ, PYTHONPATH=str(REPO), **env))
    assert cli.returncode == 0, cli.stderr
    assert "Traceback" not in cli.stderr and "wgmma" in cli.stdout
    assert cli.stderr.count("TilefuseCacheWarning") == 1


def test_a_read_only_cache_folder_means_a_private_one(tmp_path):
    """A folder this user may not write: mode 0555, or (root writes there anyway) the immutable attribute."""
    import shutil

    ro = tmp_path / "ro"
    (ro / "cache").mkdir(parents=True)
    if os.geteuid() != 0:
        (ro / "cache").chmod(0o555)
        undo = lambda: (ro / "cache").chmod(0o755)  # noqa: E731
    else:
        if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(ro / "cache")]).returncode:
            pytest.skip("root writes into a 0555 folder, and this filesystem has no immutable attribute")
        undo = lambda: subprocess.run(["chattr", "-i", str(ro / "cache")])  # noqa: E731
    try:
        proc = _python("import warnings; warnings.simplefilter('always')\n"
                       "import torch, tilefuse\n"
                       "a, b = torch.randn(20, 9), torch.randn(9, 11)\n"
                       "assert torch.allclose(tilefuse.gemm(a, b, activation='relu'), torch.relu(a @ b), atol=1e-5)\n"
                       "print('ROOT', tilefuse.diskcache.folder('x'))", {"TILEFUSE_CACHE_DIR": str(ro / "cache")})
    finally:
        undo()
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("TilefuseCacheWarning") == 1 and str(ro / "cache") in proc.stderr
    assert str(ro) not in proc.stdout.split("ROOT ")[1]


def test_a_write_that_fails_later_moves_to_the_private_folder(tmp_cache, monkeypatch):
    path = diskcache.folder("faults") / "late.json"
    real = diskcache._write_once

    def full_disk(p, data):
        if str(p).startswith(str(tmp_cache)):
            raise OSError(28, "No space left on device")
        return real(p, data)
    monkeypatch.setattr(diskcache, "_write_once", full_disk)
    with pytest.warns(tilefuse.TilefuseCacheWarning, match="No space left"):
        written = diskcache.write_json(path, {"n": 1})
    assert not str(written).startswith(str(tmp_cache)) and json.loads(written.read_text()) == {"n": 1}
    assert diskcache.read_json(diskcache.folder("faults") / "late.json") == {"n": 1}  # readers follow


# ------------------------------------------------------------------------- the CUDA emulator's library
@pytest.mark.parametrize("damage", ["half", "empty", "random"])
def test_a_damaged_emulator_library_is_rebuilt_not_loaded(tmp_path, damage):
    """A half-truncated cached .so killed the process with SIGBUS in dlopen (rc 135, no message); an empty or
    random one raised `invalid ELF header` on every run. Now the library is checked against the size and
    checksum recorded at build time before any dlopen: one warning naming the entry, a rebuild, the result."""
    from tilefuse.cuda import build

    if build.host_compiler() is None:
        pytest.skip("no host C++ compiler for the emulator build")
    cache = tmp_path / "cache"
    with config.override(cache_dir=cache):
        built = build.build("1", emulate=True)
    lib = built.library
    size = lib.stat().st_size
    if damage == "half":
        os.truncate(lib, size // 2)
    elif damage == "empty":
        lib.write_bytes(b"")
    else:
        lib.write_bytes(os.urandom(size))
    proc = _python("import warnings; warnings.simplefilter('always')\n"
                   "import torch, tilefuse.cuda as tc\n"
                   "a, b = torch.randn(16, 8).half(), torch.randn(8, 4).half()\n"
                   "out = tc.gemm(a, b, rung=1)\n"
                   "err = ((out.double() - a.double() @ b.double()).norm() / (a.double() @ b.double()).norm()).item()\n"
                   "print('ERR', err)", {"TILEFUSE_CACHE_DIR": str(cache), "TILEFUSE_PROGRESS": "0"})
    assert proc.returncode == 0, f"rc {proc.returncode}: {proc.stderr[-2000:]}"
    assert float(proc.stdout.split("ERR ")[1]) < 3e-3
    said = [ln for ln in proc.stderr.splitlines() if "TilefuseCacheWarning" in ln]
    assert len(said) == 1 and str(lib.parent) in said[0], proc.stderr
    assert build.library_problem(build.Build.from_json(json.loads((lib.parent / "report.json").read_text()))) is None


# ------------------------------------------------------------------------------------ fallbacks
def test_a_whole_graph_fallback_warns_once_with_its_reason(monkeypatch):
    import tilefuse.compiler as tc
    from tilefuse.compiler import runtime

    class Broken:
        def __init__(self, *a, **k):
            raise RuntimeError("injected planning failure")
    monkeypatch.setattr(runtime, "CompiledGraph", Broken)
    torch._dynamo.reset()
    tc.reset_stats()
    x = torch.randn(5, 7)
    with config.override(debug=0, strict=False), warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        out = torch.compile(lambda t: (t * 3).relu(), backend="tilefuse")(x)
    torch._dynamo.reset()
    assert torch.equal(out, (x * 3).relu())  # the model still runs
    said = _fallback_warnings(record)
    assert len(said) == 1 and "injected planning failure" in said[0] and "runs in ATen" in said[0], said
    assert tc.stats()["graph_fallbacks"] == 1


def test_per_op_fallbacks_are_summarised_once_per_graph():
    import tilefuse.compiler as tc

    def f(x, z):
        return torch.relu(x) + (z * z).real.sum()
    x, z = torch.randn(5, 7), torch.randn(4, dtype=torch.complex64)
    torch._dynamo.reset()
    tc.reset_stats()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        compiled = torch.compile(f, backend="tilefuse")
        out = compiled(x, z)
        compiled(x, z)
    torch._dynamo.reset()
    assert torch.allclose(out, f(x, z))
    ops = tc.stats()["fallbacks"]
    said = _fallback_warnings(record)
    assert ops and len(said) == 1, said
    assert f"{len(ops)} op(s) run in ATen" in said[0] and "complex" in said[0]


def test_the_demo_marks_a_step_with_fallbacks_not_ok(monkeypatch, capsys):
    """`tilefuse demo` printed "(ok)" over "0 graphs ... 2 fallbacks"."""
    from tilefuse import demo
    from tilefuse.compiler import runtime

    class Broken:
        def __init__(self, *a, **k):
            raise RuntimeError("injected planning failure")
    monkeypatch.setattr(runtime, "CompiledGraph", Broken)
    monkeypatch.setattr(demo, "STEPS", demo.STEPS[:1])
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tilefuse.TilefuseFallbackWarning)
        status = demo.main(type("Args", (), {"quick": True})())
    torch._dynamo.reset()
    out = capsys.readouterr().out
    assert status == 1
    assert "(ok)" not in out and "FALLBACK" in out and "instead of tilefuse's kernels" in out


# ----------------------------------------------------------------------------- threads and processes
def test_threads_call_gemm_at_once_on_the_interpreter():
    """Three threads calling tilefuse.gemm at once: 5 of 18 calls failed with InterpreterError('Did you forget
    to add @triton.jit ?') (the interpreter patches triton.language process-wide for each launch)."""
    import threading

    failures, done = [], []

    def work(i):
        for j in range(6):
            a, b = torch.randn(33 + i, 20), torch.randn(20, 17 + j % 3)
            out = poisoned_empty(a.shape[0], b.shape[1], dtype=torch.float32, device="cpu")
            try:
                tilefuse.gemm(a, b, out=out)
                assert_close(out, a.double() @ b.double(), torch.float32)
                done.append(1)
            except Exception as exc:  # noqa: BLE001  (collected: the assertion below names them)
                failures.append(repr(exc)[:300])
    threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures and len(done) == 18, failures


def test_threads_share_one_tuning_decision(tmp_cache, monkeypatch):
    import threading

    from tilefuse.kernels.gemm import configs as C
    from tilefuse.kernels.gemm import tuning as T

    monkeypatch.setattr(T, "tuning_enabled", lambda: True)
    timed = []

    def fake_time(fn, best):
        fn()
        timed.append(1)
        return float(len(timed))
    monkeypatch.setattr(T, "_time", fake_time)
    monkeypatch.setattr(T, "candidates", lambda p, part, limit=None: [C.GemmConfig("tiled", 32, 32, 16),
                                                                      C.GemmConfig("tiled", 64, 32, 16)])
    T.forget()
    a, b = torch.randn(41, 24), torch.randn(24, 19)
    results, failures = [], []

    def work():
        try:
            results.append(tilefuse.gemm(a, b, activation="relu"))
        except Exception as exc:  # noqa: BLE001
            failures.append(repr(exc)[:300])
    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    T.forget()
    assert not failures, failures
    assert len(timed) == 2  # tuned once, not once a thread
    for out in results:
        assert_close(out, torch.relu(a.double() @ b.double()), torch.float32)


def test_threads_share_the_compilers_kernel_cache(tmp_cache):
    import threading
    import types

    import tilefuse.compiler as tc
    from tilefuse.compiler import cache

    source = ("import triton\nimport triton.language as tl\n\n\n@triton.jit\n"
              "def tfk_fault_threads(x_ptr, n, BLOCK: tl.constexpr):\n"
              "    offs = tl.arange(0, BLOCK)\n"
              "    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)\n")
    ks = types.SimpleNamespace(name="tfk_fault_threads", source=source)
    cache.clear_memory()
    tc.reset_stats()
    got, failures = [], []

    def work():
        try:
            fn, _ = cache.load(ks)
            x = torch.arange(5, dtype=torch.float32)
            fn[(1,)](x, 5, BLOCK=8)
            assert torch.equal(x, torch.arange(5, dtype=torch.float32) * 2)
            got.append(fn)
        except Exception as exc:  # noqa: BLE001
            failures.append(repr(exc)[:300])
    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures
    assert len({id(fn) for fn in got}) == 1 and tc.stats()["kernels_compiled"] == 1


_WORKER = r"""
import json, sys, threading, warnings
warnings.simplefilter("always")
import torch, tilefuse, tilefuse.compiler as tc
from tilefuse import diskcache
from tests.test_faults import _pointwise_and_reduction as f
me = int(sys.argv[1])
root = diskcache.folder("stress")
seen = 0
for i in range(120):
    data = [me * 1000 + i] * 3000
    diskcache.write_json(root / f"e{i % 3}.json", {"writer": me, "data": data, "sum": sum(data)})
    got = diskcache.read_json(root / f"e{(i + 1) % 3}.json", check=lambda v: v["sum"] == sum(v["data"]))
    seen += got is not None
x, y = torch.randn(7, 33), torch.randn(7, 5)
assert torch.allclose(torch.compile(f, backend="tilefuse")(x, y), f(x, y), atol=1e-5)
errors = []
def work(i):
    try:
        a, b = torch.randn(17 + i, 12), torch.randn(12, 9)
        assert torch.allclose(tilefuse.gemm(a, b), a @ b, atol=1e-5)
    except Exception as exc:
        errors.append(repr(exc))
ts = [threading.Thread(target=work, args=(i,)) for i in range(3)]
[t.start() for t in ts]; [t.join() for t in ts]
assert not errors, errors
s = tc.stats()
print("OK", seen, s["kernels_compiled"] + s["cache_hits"], len(s["fallbacks"]))
"""


def test_processes_write_and_read_one_cache_at_once(tmp_path):
    """Three processes (each with three threads) writing and reading the same entries, compiling the same
    graph and running GEMMs over one cache folder: every read sees a whole entry, nothing is reported bad,
    nothing falls back, and the kernel files left are the kernels."""
    cache = tmp_path / "shared"
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", TILEFUSE_CACHE_DIR=str(cache))
    procs = [subprocess.Popen([sys.executable, "-c", _WORKER, str(i)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env, cwd=str(REPO)) for i in range(3)]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
        assert "OK" in out and out.split()[-1] == "0", out
        assert "TilefuseCacheWarning" not in err and "TilefuseFallbackWarning" not in err, err[-3000:]
    assert sum(int(out.split()[1]) for out, _ in outs) > 0  # the readers did see the others' entries
    kernels = sorted((cache / "compiler" / "kernels").glob("*.py"))
    assert len(kernels) == 2 and not list((cache / "compiler" / "kernels").glob(".*.tmp"))
    for k in kernels:
        compile(k.read_text(), str(k), "exec")  # whole files


@pytest.mark.gpu
def test_threads_call_gemm_at_once_on_the_gpu():
    import threading

    failures = []

    def work(i):
        for j in range(20):
            a = torch.randn(257 + 64 * i, 192, device="cuda", dtype=torch.bfloat16)
            b = torch.randn(192, 129 + j % 4, device="cuda", dtype=torch.bfloat16)
            out = poisoned_empty(a.shape[0], b.shape[1], dtype=torch.bfloat16, device="cuda")
            try:
                tilefuse.gemm(a, b, out=out)
                assert_close(out, a.double() @ b.double(), torch.bfloat16)
            except Exception as exc:  # noqa: BLE001
                failures.append(repr(exc)[:300])
    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    torch.cuda.synchronize()
    assert not failures, failures


# ----------------------------------------------------------------------------------- bad input
def test_a_cached_plan_does_not_skip_the_device_check(device):
    """After one call of a shape, a `meta` tensor of the same shape hit the cached plan (its signature said
    "device -1" for CPU and meta alike) and failed inside a kernel."""
    a, b = torch.randn(16, 8, device=device), torch.randn(8, 4, device=device)
    tilefuse.gemm(a, b)
    with pytest.raises(ValueError, match=r"a is on meta; tilefuse runs its kernels on"):
        tilefuse.gemm(a.to("meta"), b.to("meta"))
    with pytest.raises(ValueError, match=r"b is on meta"):
        tilefuse.gemm(a, b.to("meta"))


@pytest.mark.parametrize("shape", [(4, 8), (2, 3, 8), (8,), (), (4, 17)])
def test_linear_refuses_what_torch_refuses_with_torchs_error_before_any_launch(shape, monkeypatch):
    """`tilefuse.nn.Linear(16, 4)(torch.randn(4, 8))` launched a kernel, then failed in a reshape."""
    from tilefuse import linalg

    ours, theirs = tilefuse.nn.Linear(16, 4), torch.nn.Linear(16, 4)
    monkeypatch.setattr(linalg, "gemm", lambda *a, **k: pytest.fail("a kernel was launched for bad input"))
    x = torch.randn(shape)
    with pytest.raises(RuntimeError) as expected:
        theirs(x)
    with pytest.raises(type(expected.value), match=f"^{re.escape(str(expected.value))}$"):
        ours(x)


def test_linear_refuses_a_dtype_torch_refuses(monkeypatch):
    from tilefuse import linalg

    monkeypatch.setattr(linalg, "gemm", lambda *a, **k: pytest.fail("a kernel was launched for bad input"))
    with pytest.raises(RuntimeError, match="same dtype"):
        tilefuse.nn.Linear(16, 4)(torch.randn(3, 16, dtype=torch.float16))


@pytest.mark.parametrize("features, rows", [((0, 4), (3,)), ((5, 0), (3,)), ((0, 0), (2,)), ((16, 4), (0,)),
                                            ((0, 4), (2, 0)), ((7, 3), (2, 0))])
def test_linear_zero_sizes_match_torch(features, rows, device):
    """`Linear(0, 4)` failed (reshape(-1, 0) of a zero-size tensor) where torch returns the bias."""
    fin, fout = features
    ours = tilefuse.nn.Linear(fin, fout, device=device)
    with torch.no_grad():
        if ours.bias is not None and fout:
            ours.bias.copy_(torch.randn(fout))
    theirs = torch.nn.Linear(fin, fout, device=device)
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(*rows, fin, device=device)
    out = ours(x)
    assert out.shape == theirs(x).shape
    torch.testing.assert_close(out, theirs(x))


def test_linear_fallback_is_not_silent():
    lin = tilefuse.nn.Linear(4, 3).double()
    from tilefuse import nn as tf_nn

    tf_nn._WARNED.discard((torch.float64, "cpu"))
    with pytest.warns(tilefuse.TilefuseFallbackWarning, match="float64 input on cpu runs torch.nn.functional.linear"):
        out = lin(torch.randn(2, 4, dtype=torch.float64))
    assert out.dtype == torch.float64


# ----------------------------------------------------------------------------------- issue 27
def test_bf16_gemm_and_linear_are_right_on_the_interpreter(device):
    """bf16 `tilefuse.gemm` / `tilefuse.nn.Linear` on the interpreter returned ~1e10 where ~0.5 is right."""
    a = torch.randn(37, 70, device=device).bfloat16()
    b = torch.randn(70, 29, device=device).bfloat16()
    out = poisoned_empty(37, 29, dtype=torch.bfloat16, device=device)
    tilefuse.gemm(a, b, out=out)
    assert_close(out, a.double() @ b.double(), torch.bfloat16)
    bias = torch.randn(29, device=device).bfloat16()
    fused = tilefuse.gemm(a, b, bias=bias, activation="gelu")
    assert_close(fused, torch.nn.functional.gelu(a.double() @ b.double() + bias.double()), torch.bfloat16)
    lin = tilefuse.nn.Linear(70, 29, device=device, dtype=torch.bfloat16)
    ref = torch.nn.functional.linear(a.double(), lin.weight.double(), lin.bias.double())
    assert_close(lin(a), ref, torch.bfloat16)
    x = a.detach().requires_grad_(True)
    lin(x).float().sum().backward()  # the backward's GEMMs are bf16 too
    assert_close(x.grad, lin.weight.double().sum(0).expand(37, 70), torch.bfloat16)


@pytest.mark.parametrize("alias", ["a", "b", "a.T", "a-shifted", "bias", "residual-broadcast", "residual-shifted"])
def test_out_overlapping_an_input_is_refused(alias, device):
    """`tilefuse.gemm(A, B, out=A)` was silently wrong; refused now, on the first call and on a planned one."""
    n = 16
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    bias = torch.randn(n, device=device)
    wide = torch.randn(n + 1, n, device=device)
    kwargs, out = {}, None
    if alias == "a":
        out = a
    elif alias == "b":
        out = b
    elif alias == "a.T":
        out = a.t()
    elif alias == "a-shifted":
        big = torch.randn(3 * n, n, device=device)
        a, out = big[:2 * n], big[n:]
    elif alias == "bias":
        buf = torch.randn(n + 1, n, device=device)
        kwargs, out = {"bias": buf[0]}, buf[:n]
    elif alias == "residual-broadcast":
        buf = torch.randn(n, n, device=device)
        kwargs, out = {"residual": buf[0]}, buf
    else:
        kwargs, out = {"residual": wide[1:]}, wide[:n]
    before = out.clone()
    tilefuse.gemm(a.clone(), b.clone(), out=torch.empty_like(out), **{k: v.clone() for k, v in kwargs.items()})
    for _ in range(2):  # the first call, then the one a plan would replay
        with pytest.raises(ValueError, match=r"^out shares memory with (a|b|bias|residual)"):
            tilefuse.gemm(a, b, out=out, **kwargs)
        assert torch.equal(out, before)  # refused before any launch


def test_out_may_be_the_residual_itself(device):
    a, b = torch.randn(19, 11, device=device), torch.randn(11, 13, device=device)
    r = torch.randn(19, 13, device=device)
    ref = a.double() @ b.double() + 0.5 * r.double()
    for _ in range(2):
        res = r.clone()
        out = tilefuse.gemm(a, b, residual=res, beta=0.5, out=res)
        assert out is res
        assert_close(out, ref, torch.float32)


# ------------------------------------------------------------------------------ numpy, install, make
def test_interpreter_scalars_convert_without_numpys_removed_conversion(device):
    """numpy 2.4 removed int() of a one-element 1-D array (deprecated since 1.25), which Triton 3.6's
    interpreter used for every scalar a kernel passes to Python (a loop bound): every kernel failed with
    "only 0-dimensional arrays can be converted to Python scalars". With the deprecation turned into an
    error, an older numpy behaves as 2.4 does."""
    a, b = torch.randn(20, 70, device=device), torch.randn(70, 9, device=device)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*ndim > 0 to a scalar", category=DeprecationWarning)
        out = tilefuse.gemm(a, b, bias=torch.randn(9, device=device), activation="relu")
    assert out.shape == (20, 9)


def test_pyproject_admits_the_numpy_of_every_supported_machine():
    """The GPU image has numpy 2.5 and nothing can be installed there; the CPU machines work with current
    numpy (the interpreter fix above): the requirement must admit both."""
    import tomllib

    from packaging.requirements import Requirement

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    reqs = {Requirement(r).name: Requirement(r) for r in project["dependencies"]}
    for version in ("1.26.4", "2.3.5", "2.4.0", "2.5.0"):
        assert reqs["numpy"].specifier.contains(version), version
    assert reqs["torch"].specifier.contains("2.11.0") and reqs["triton"].specifier.contains("3.6.0")


def test_make_installs_clang_19_where_apt_can():
    """`make test` on a fresh machine needs clang-19 (the HIP compile of the ladder's portable rungs): the
    Makefile's install step installs it when apt can, the same step CI runs."""
    proc = subprocess.run(["make", "-n", "-B", "deps", "VENV=/nonexistent-venv"], capture_output=True, text=True,
                          cwd=str(REPO))
    assert proc.returncode == 0, proc.stderr
    assert "clang-19" in proc.stdout and "apt-get install" in proc.stdout
    assert "make deps" in (REPO / ".ci" / "run").read_text() or "make test" in (REPO / ".ci" / "run").read_text()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's import order: a machine with no GPU")
def test_triton_imported_before_tilefuse_still_runs_reductions(tmp_path):
    """``torch.compile(backend="tilefuse")`` reached after torch imported Triton (no ``import tilefuse`` first):
    Triton's own ``@jit`` library functions (``tl.sum``) were compiled-mode objects, and every reduction
    kernel failed on the interpreter with "Cannot call @triton.jit'd outside of the scope of a kernel"."""
    code = (
        "import triton.language as tl, torch\n"
        "assert type(tl.sum).__name__ == 'JITFunction'\n"
        "import tilefuse\n"
        "torch.manual_seed(0)\n"
        "m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Softmax(-1))\n"
        "x = torch.randn(5, 8)\n"
        "out = torch.compile(m, backend='tilefuse')(x)\n"
        "torch.testing.assert_close(out, m(x))\n"
        "print('rewrapped', type(tl.sum).__name__)\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TILEFUSE_CACHE_DIR"] = str(tmp_path)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600,
                         cwd=Path(__file__).resolve().parents[1])
    assert res.returncode == 0, res.stderr[-3000:]
    assert "rewrapped InterpretedFunction" in res.stdout
