# Corpus of CUDA idioms, written the way the libraries write them. "# site: <kinds>" marks
# each line the rewriter must change; tests/unit/test_rewrite.py reads these markers.
# ruff: noqa: E501
# fmt: off
"""The CUDA API a program calls once it has its device (yolov5's select_device, timing loops,
PyTorch-GAN's legacy tensor types, AMP training loops, torch >= 2.6's torch.accelerator)."""

import time

import torch
from torch import amp, nn
from torch.cuda import Event, OutOfMemoryError  # site: cuda_api
from torch.cuda import FloatTensor as CudaFloat  # site: cuda_api
from torch.cuda.amp import GradScaler, autocast

cuda = torch.cuda.is_available()  # site: is_available
device = torch.device("cuda:0" if cuda else "cpu")  # site: device_literal
Tensor = torch.cuda.FloatTensor if cuda else torch.FloatTensor  # site: cuda_api


def describe() -> dict:
    if not cuda:
        return {"device": "cpu"}
    p = torch.cuda.get_device_properties(0)  # site: cuda_api
    torch.cuda.reset_peak_memory_stats()  # site: cuda_api
    return {
        "name": p.name,
        "memory_mib": p.total_memory / (1 << 20),
        "capability": list(torch.cuda.get_device_capability(device)),  # site: cuda_api
        "bf16": torch.cuda.is_bf16_supported(),  # site: cuda_api
        "allocated": torch.cuda.memory_allocated(device),  # site: cuda_api
        "peak": torch.cuda.max_memory_allocated(),  # site: cuda_api
        "free_total": list(torch.cuda.mem_get_info()),  # site: cuda_api
    }


def timed(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, float]:
    if not cuda:
        started = time.perf_counter()
        return model(x), (time.perf_counter() - started) * 1000
    start, end = Event(enable_timing=True), torch.cuda.Event(enable_timing=True)  # site: cuda_api
    side = torch.cuda.Stream()  # site: cuda_api
    start.record()
    with torch.cuda.stream(side):  # site: cuda_api
        y = model(x)
    end.record()
    torch.cuda.synchronize()  # site: cuda_api
    return y, start.elapsed_time(end)


def legacy(x: torch.Tensor) -> dict:
    ones = Tensor(2, 3).fill_(1.0)
    moved = x.type(Tensor)  # site: tensor_type
    named = x.type("torch.cuda.FloatTensor" if cuda else "torch.FloatTensor")  # site: tensor_type
    with torch.cuda.device(0) if cuda else torch.no_grad():  # site: cuda_api
        inside = moved * 2
    return {
        "ones": ones.tolist(),
        "moved": moved.tolist(),
        "named": named.tolist(),
        "inside": inside.tolist(),
        "same_device": moved.device == ones.device == named.device,
        "is_cuda_float": isinstance(moved, CudaFloat) if cuda else None,
        "type_name": x.type(),
    }


def train_amp(model: nn.Module, x: torch.Tensor) -> list[float]:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = GradScaler(enabled=cuda)  # site: amp
    losses = []
    for _ in range(3):
        optimizer.zero_grad()
        with autocast(enabled=cuda):  # site: amp
            loss = model(x).pow(2).mean()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        losses.append(loss.item())
    with torch.autocast(device_type=device.type, dtype=torch.float16, enabled=cuda):  # site: amp
        last = model(x).float().pow(2).mean().item()
    newer = amp.GradScaler("cuda", enabled=cuda)  # site: amp
    return [*losses, last, float(newer.is_enabled())]


def run() -> dict:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1)).to(device)  # site: device_argument
    x = torch.linspace(-1, 1, 12).reshape(4, 3)
    y, elapsed = timed(model, x.to(device))  # site: device_argument
    accelerator = "cpu"
    if cuda:  # torch-directml's torch 2.4.1 has no torch.accelerator
        accelerator = str(torch.accelerator.current_accelerator())  # site: accelerator
    return {
        "describe": describe(),
        "timed": y.tolist(),
        "elapsed_ok": elapsed >= 0,
        "legacy": legacy(x),
        "amp": train_amp(model, x.to(device)),  # site: device_argument
        "accelerator": accelerator,
        "oom_is_class": isinstance(OutOfMemoryError, type),
    }
