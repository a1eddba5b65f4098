# Corpus of CUDA idioms, written the way the libraries write them. "# site: <kinds>" marks
# each line the rewriter must change; tests/unit/test_rewrite.py reads these markers.
# ruff: noqa: E501
# fmt: off
"""The seed's CIFAR classifier: cuda-else-cpu device, DataParallel when several GPUs."""

import torch
from torch import nn

device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")  # site: device_literal, is_available


def build() -> nn.Module:
    net = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    for parameter in net.parameters():
        nn.init.constant_(parameter, 0.1)
    if torch.cuda.device_count() > 1:  # site: cuda_api
        net = nn.DataParallel(net)
    return net


def run() -> dict:
    net = build()
    net.to(device)  # site: device_argument
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    inputs = torch.arange(24.0).reshape(6, 4) / 24
    labels = torch.tensor([0, 1, 0, 1, 0, 1])
    for _ in range(3):
        inputs, labels = inputs.to(device), labels.to(device)  # site: device_argument, device_argument
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(net(inputs), labels)
        loss.backward()
        optimizer.step()
    torch.cuda.empty_cache()  # site: cuda_api
    return {
        "device": str(device),
        "parallel": isinstance(net, nn.DataParallel),
        "loss": round(loss.item(), 6),
    }
