"""Compiled training across processes with torch.distributed: DDP or FSDP2, eager / Inductor / tilefuse.

Started by torchrun, one process a device:

    torchrun --nproc_per_node=2 examples/train_distributed.py --wrap ddp --backend tilefuse --steps 50 --out r.json

On a machine with GPUs it uses NCCL on cuda:<local rank>; without, gloo on the CPU (Triton's interpreter runs
the kernels). Every rank starts from the same weights (seed 0) and sees its own shard of a fixed random data
set, so eager and compiled runs are comparable step by step. Rank 0 writes the losses and step times as JSON.
NVLink multicast stays off (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1) whatever the caller set.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time
from pathlib import Path

# Multicast over NVLink can take a shared host's GPUs down: never on, whoever started us.
os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import tilefuse  # noqa: E402,F401  (registers the backend name; decides the interpreter)

WRAPS = ("ddp", "fsdp", "none")
BACKENDS = ("eager", "inductor", "tilefuse")


LINEARS = ("torch", "tilefuse")


def linear_class(kind: str):
    """torch.nn.Linear, or tilefuse.nn.Linear (its GEMMs run on the library's kernels; on a GPU they are
    tuned, by local rank 0 only, the other ranks reading its decisions from the disk cache)."""
    if kind == "tilefuse":
        import tilefuse.nn

        return tilefuse.nn.Linear
    return torch.nn.Linear


class Block(torch.nn.Module):
    def __init__(self, width: int, linear=torch.nn.Linear):
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.up = linear(width, 4 * width)
        self.down = linear(4 * width, width)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class Model(torch.nn.Module):
    def __init__(self, width: int, depth: int, classes: int, linear=torch.nn.Linear):
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block(width, linear) for _ in range(depth))
        self.head = linear(width, classes)

    def forward(self, x, target):
        for block in self.blocks:
            x = block(x)
        return torch.nn.functional.cross_entropy(self.head(x), target)


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--wrap", choices=WRAPS, default="ddp")
    p.add_argument("--backend", choices=BACKENDS, default="tilefuse")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--linear", choices=LINEARS, default="torch", help="the model's Linear layers (default torch)")
    p.add_argument("--width", type=int, default=None, help="default 1024 on GPU, 32 on CPU")
    p.add_argument("--depth", type=int, default=2)
    p.add_argument("--batch", type=int, default=None, help="rows per rank per step (default 8192 on GPU, 16 on CPU)")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default=None, help="default bfloat16 on GPU, float32 on CPU")
    p.add_argument("--out", default=None, help="rank 0 writes JSON here")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse(argv)
    gpu = torch.cuda.is_available()
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local = int(os.environ.get("LOCAL_RANK", 0))
    if world > 1 or args.wrap != "none":
        # a hang (a rank that died, an unreachable address) ends in an error after the timeout, not never
        timeout = datetime.timedelta(seconds=float(os.environ.get("TILEFUSE_DIST_TIMEOUT_S", "300")))
        dist.init_process_group("nccl" if gpu else "gloo", timeout=timeout)
    dev = torch.device("cuda", local) if gpu else torch.device("cpu")
    if gpu:
        torch.cuda.set_device(dev)
    width = args.width or (1024 if gpu else 32)
    batch = args.batch or (8192 if gpu else 16)
    dtype = getattr(torch, args.dtype or ("bfloat16" if gpu else "float32"))

    torch.manual_seed(0)  # the same initial weights on every rank and for every backend
    model = Model(width, args.depth, classes=64, linear=linear_class(args.linear)).to(dev, dtype)
    if args.wrap == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local] if gpu else None)
    elif args.wrap == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
    forward = model if args.backend == "eager" else torch.compile(model, backend=args.backend)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    data = torch.Generator().manual_seed(1234 + rank)  # each rank its own shard, the same for every backend
    xs = [torch.randn(batch, width, generator=data).to(dev, dtype) for _ in range(4)]
    ys = [torch.randint(0, 64, (batch,), generator=data).to(dev) for _ in range(4)]

    losses, times = [], []
    for step in range(args.steps):
        if gpu:
            torch.cuda.synchronize()
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = forward(xs[step % 4], ys[step % 4])
        loss.backward()
        opt.step()
        if gpu:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        value = loss.detach().float()
        if dist.is_initialized():
            dist.all_reduce(value)
            value /= world
        losses.append(value.item())
    result = {"wrap": args.wrap, "backend": args.backend, "world": world, "steps": args.steps, "width": width,
              "batch_per_rank": batch, "dtype": str(dtype).replace("torch.", ""), "losses": losses,
              "step_s_median_after_5": statistics.median(times[5:]) if len(times) > 5 else None,
              "first_step_s": times[0], "device": torch.cuda.get_device_name(dev) if gpu else "cpu"}
    if args.backend == "tilefuse":
        import tilefuse.compiler

        stats = tilefuse.compiler.stats()
        result["tilefuse"] = {k: (len(v) if isinstance(v, list) else v) for k, v in stats.items()}
    result["linear"] = args.linear
    if args.linear == "tilefuse":
        from tilefuse.kernels.gemm import tuning as gemm_tuning

        mine = dict(gemm_tuning.counters)
        every = [None] * world
        if dist.is_initialized():
            dist.all_gather_object(every, mine)
        else:
            every = [mine]
        result["gemm_tuning_by_rank"] = every  # keys tuned / taken from rank 0's decision / defaulted, a rank
    if rank == 0:
        text = json.dumps(result, indent=1)
        if args.out:
            Path(args.out).write_text(text)
        else:
            print(text)
    if dist.is_initialized():
        dist.barrier()  # every rank has finished (and rank 0 has written its JSON) before any leaves
        if gpu:
            dist.destroy_process_group()
        else:
            # gloo: destroy_process_group (and the group's destructor at interpreter exit) on a rank whose
            # peer has already gone can wait forever on the 2-core CI machine, so a CPU rank leaves at once
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
