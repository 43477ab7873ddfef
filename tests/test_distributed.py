"""Compiled training under torch.distributed, two processes with gloo on the CPU (issue 6's CPU part).

The two-GPU NCCL run (50 steps, step times vs eager and Inductor DDP) needs the 2-GPU machine:
examples/train_distributed.py is the same program there.
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "train_distributed.py"
STEPS = 8  # enough steps for the optimizer to move the weights; each is a few interpreter launches
TORCHRUN_TIMEOUT_S = 240
LOSS_RTOL = 1e-4  # fp32 throughout: compiled and eager differ only by summation order


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(tmp_path, wrap, backend, cache, *extra):
    out = tmp_path / f"{wrap}-{backend}.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TILEFUSE_CACHE_DIR"] = str(cache)
    # loopback only: gloo otherwise binds to the address the host name resolves to, which on a CI machine
    # without a network can be unreachable (the ranks then wait on each other until the timeout)
    env["GLOO_SOCKET_IFNAME"] = "lo"
    env["TILEFUSE_DIST_TIMEOUT_S"] = "120"
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or "torchrun"
    cmd = [torchrun, "--nnodes=1", "--nproc_per_node=2", "--master-addr=127.0.0.1", f"--master-port={_free_port()}",
           str(SCRIPT), "--wrap", wrap, "--backend", backend, "--steps", str(STEPS), "--out", str(out), *extra]
    # its own session, so that on a timeout the ranks die with torchrun: killing torchrun alone leaves a rank
    # holding the output pipes, and the wait for them never ends
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=TORCHRUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        raise AssertionError(f"torchrun {wrap}/{backend} did not finish in {TORCHRUN_TIMEOUT_S} s:\n"
                             f"{stdout[-2000:]}\n{stderr[-2000:]}") from None
    assert proc.returncode == 0, stdout[-3000:] + stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.slow
@pytest.mark.parametrize("wrap", ["ddp", "fsdp"])
def test_compiled_training_matches_eager_across_two_processes(tmp_path, wrap):
    cache = tmp_path / "cache"
    eager = _torchrun(tmp_path, wrap, "eager", cache)
    # DDP: the model's Linear layers on the tilefuse GEMM too (graph breaks around each GEMM, the bucket hooks
    # in between); FSDP: torch's Linear, so the compiled graphs hold the sharded parameters' all-gathers
    extra = ("--linear", "tilefuse") if wrap == "ddp" else ()
    ours = _torchrun(tmp_path, wrap, "tilefuse", cache, *extra)
    assert eager["world"] == ours["world"] == 2
    assert len(ours["losses"]) == STEPS
    assert eager["losses"][-1] < eager["losses"][0]  # it trains
    for step, (a, b) in enumerate(zip(eager["losses"], ours["losses"])):
        assert abs(a - b) <= LOSS_RTOL * abs(a), f"step {step}: eager loss {a} vs tilefuse {b}"
    assert ours["tilefuse"]["kernels"] > 0  # the backend really compiled kernels
    if extra:
        # every rank reports where its GEMM configs came from (on the interpreter nothing is tuned)
        assert len(ours["gemm_tuning_by_rank"]) == 2
