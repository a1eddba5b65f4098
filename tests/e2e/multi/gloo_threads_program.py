"""Which threads free the host tensors dmlpatch hands to gloo (tests/e2e/multi).

Two ranks (torch.multiprocessing.spawn, NCCL requested, .cuda()) train a small DDP model, then
call the collectives a program calls directly. Every CPU tensor handed to gloo through dmlpatch
gets a weak reference whose callback notes the thread that frees it: a Python thread, or a
foreign one (gloo's C++ worker). A foreign thread that frees a Python object needs the GIL, and
aborts the process when that happens while the interpreter finalizes. Rank r writes OUT.r.
"""

import collections
import gc
import json
import sys
import threading
import weakref

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from dmlpatch.patches.torch import gloo_handoff

freed: collections.Counter = collections.Counter()
watched: list = []


def _freed(_reference: object) -> None:
    thread = threading.current_thread()
    foreign = isinstance(thread, threading._DummyThread)
    freed["foreign" if foreign else "python"] += 1


def _watch(value: object) -> None:
    if isinstance(value, torch.Tensor) and value.device.type == "cpu":
        watched.append(weakref.ref(value, _freed))
    elif isinstance(value, (list, tuple)):
        for item in value:
            _watch(item)


_start = gloo_handoff.GlooHandoff.start


def _watching_start(self, name, *args):
    _watch(args)
    return _start(self, name, *args)


gloo_handoff.GlooHandoff.start = _watching_start


def run(rank: int, world: int, port: int, out: str) -> None:
    dist.init_process_group(
        "nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    torch.cuda.set_device(rank)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).cuda()
    ddp = DDP(net, device_ids=[rank])
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for _ in range(10):
        optimizer.zero_grad()
        ddp(torch.randn(4, 8).cuda()).square().mean().backward()
        optimizer.step()
    total = torch.ones(3).cuda()
    dist.all_reduce(total)
    dist.all_reduce(total, op=dist.ReduceOp.AVG)
    dist.broadcast(total, src=0)
    gathered = [None] * world
    dist.all_gather_object(gathered, {"rank": rank})
    dist.barrier()
    del ddp, net, optimizer
    dist.destroy_process_group()
    gc.collect()
    with open(f"{out}.{rank}", "w") as stream:
        json.dump(
            {
                "handed": len(watched),
                "alive": sum(1 for reference in watched if reference() is not None),
                "freed": dict(freed),
            },
            stream,
        )


if __name__ == "__main__":
    port, out = int(sys.argv[1]), sys.argv[2]
    mp.spawn(run, args=(2, port, out), nprocs=2)
