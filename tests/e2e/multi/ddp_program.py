"""A CUDA-style DDP training script, in the shape of PyTorch's DDP tutorial (tests/e2e/multi).

One process per GPU through torch.multiprocessing.spawn, the NCCL backend, set_device(rank),
.cuda(); each rank trains on its slice of every batch. Rank r writes what it ended with to
OUT.r as JSON: its device, its parameters, the copies each step made (simulated device
counters), and what the collectives it calls directly returned.
"""

import json
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS = 5
PER_RANK = 3


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def batches(world):
    data = torch.Generator().manual_seed(1)
    for _ in range(STEPS):
        yield (
            torch.randn(PER_RANK * world, 8, generator=data),
            torch.randn(PER_RANK * world, 4, generator=data),
        )


def counters():
    import dmlpatch.sim

    return dmlpatch.sim.counters()["transfers"]


def run(rank, world, port, out, hook):
    dist.init_process_group(
        "nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    torch.cuda.set_device(rank)
    net = model().cuda()
    ddp = DDP(net, device_ids=[rank], find_unused_parameters=hook == "find-unused")
    if hook == "fp16":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    steps = []
    for inputs, targets in batches(world):
        before = counters()
        mine = slice(PER_RANK * rank, PER_RANK * (rank + 1))
        inputs, targets = inputs[mine].cuda(), targets[mine].cuda()
        optimizer.zero_grad()
        loss = ((ddp(inputs) - targets) ** 2).mean()
        loss.backward()
        optimizer.step()
        after = counters()
        steps.append(
            {
                kind: {k: after[kind][k] - before[kind][k] for k in ("count", "bytes")}
                for kind in ("h2d", "d2h", "d2d")
            }
        )
    total = torch.tensor([rank + 1.0]).cuda()
    dist.all_reduce(total)
    mean = torch.tensor([rank + 1.0]).cuda()
    dist.all_reduce(mean, op=dist.ReduceOp.AVG)
    shared = [{"from": rank}]
    dist.broadcast_object_list(shared, src=0)
    with torch.inference_mode():  # as ultralytics' validator gathers its statistics
        gathered = [None] * world
        dist.all_gather_object(gathered, {"rank": rank})
    dist.barrier()
    with open(f"{out}.{rank}", "w") as stream:
        json.dump(
            {
                "device": str(next(net.parameters()).device),
                "parameters": [p.detach().cpu().flatten().tolist() for p in net.parameters()],
                "gradient_bytes": sum(p.numel() * p.element_size() for p in net.parameters()),
                "input_bytes": (inputs.numel() + targets.numel()) * inputs.element_size(),
                "copies_per_step": steps,
                "all_reduce": total.cpu().item(),
                "all_reduce_avg": mean.cpu().item(),
                "all_gather_object_in_inference_mode": gathered,
                "broadcast_object": shared[0],
                "backend": dist.get_backend(),
            },
            stream,
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    port, out, hook = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    world = torch.cuda.device_count()
    print(f"ranks: {world}")
    mp.spawn(run, args=(world, port, out, hook), nprocs=world)
