"""A DDP rank whose peer dies mid-training (tests/e2e/multi).

``python peer_dies_program.py RANK PORT``: two ranks started separately, NCCL requested,
.cuda(); rank 1 ends its process abruptly before its fourth step, so rank 0's fourth bucket
allreduce has no partner. Rank 0 must stop with gloo's error, not wait for gloo's timeout.
"""

import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

rank, port = int(sys.argv[1]), int(sys.argv[2])
dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
torch.cuda.set_device(rank)
ddp = DDP(nn.Linear(8, 4).cuda(), device_ids=[rank])
for step in range(5):
    if rank == 1 and step == 3:
        os._exit(3)
    ddp(torch.randn(2, 8).cuda()).sum().backward()
    print(f"step {step}", flush=True)
print("finished")
