# Corpus of CUDA idioms, written the way the libraries write them. "# site: <kinds>" marks
# each line the rewriter must change; tests/unit/test_rewrite.py reads these markers.
# ruff: noqa: UP031
# fmt: off
"""Hard-coded CUDA on tensors and modules: ``.cuda()``, ``.pin_memory()``, ``.to('cuda')``,
``device='cuda'``."""

import torch
from torch import nn


def run() -> dict:
    x = torch.arange(4.0)
    moved = [
        x.cuda(),  # site: cuda_call
        x.cuda(0),  # site: cuda_call
        x.cuda(non_blocking=True),  # site: cuda_call
        x.pin_memory().cuda(non_blocking=True),  # site: pin_memory, cuda_call
        x.to("cuda"),  # site: device_literal
        x.to("cuda:0", non_blocking=True),  # site: device_literal
        x.to(device="cuda:%d" % 0),  # site: device_literal
        torch.zeros(4, device="cuda") + x,  # site: device_literal
        torch.ones(4, device=torch.device("cuda", 0)) * x,  # site: device_literal
    ]
    model = nn.Linear(4, 1).cuda()  # site: cuda_call
    nn.init.constant_(model.weight, 1.0)
    nn.init.zeros_(model.bias)
    return {
        "devices": sorted({str(t.device) for t in moved}),
        "sums": [t.sum().item() for t in moved],
        "model": model(x).item(),
        "model_device": str(model.weight.device),
    }
