"""A CUDA-style DDP script for torchrun: rank and world from the environment (tests/e2e/multi).

torchrun --standalone --nproc_per_node 2 torchrun_program.py OUT
Each rank trains ddp_program's model on its slice of ddp_program's batches and writes OUT.r.
"""

import json
import os
import sys

import torch
import torch.distributed as dist
from ddp_program import PER_RANK, batches, model
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    net = model().cuda()
    ddp = DDP(net, device_ids=[local_rank])
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for inputs, targets in batches(world):
        mine = slice(PER_RANK * rank, PER_RANK * (rank + 1))
        optimizer.zero_grad()
        loss = ((ddp(inputs[mine].cuda()) - targets[mine].cuda()) ** 2).mean()
        loss.backward()
        optimizer.step()
    with open(f"{sys.argv[1]}.{rank}", "w") as stream:
        json.dump(
            {
                "device": str(next(net.parameters()).device),
                "parameters": [p.detach().cpu().flatten().tolist() for p in net.parameters()],
            },
            stream,
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
