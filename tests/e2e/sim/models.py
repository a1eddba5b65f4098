"""Small models covering the layer families the simulated device must run (shared by tests
and benchmarks/sim.py)."""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel


class CNN(nn.Module):
    """Conv + BatchNorm + pooling + linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
        )
        self.head = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


class Encoder(nn.Module):
    """Transformer encoder (attention, LayerNorm, GELU) with a token embedding."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 32)
        layer = nn.TransformerEncoderLayer(
            32, 4, 64, dropout=0.0, activation="gelu", batch_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(32, 10)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(tokens)).mean(1))


class Recurrent(nn.Module):
    """Two-layer LSTM and a GRU over a sequence."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(8, 16, num_layers=2, batch_first=True)
        self.gru = nn.GRU(16, 16, batch_first=True)
        self.head = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(x)
        out, _ = self.gru(out)
        return self.head(out[:, -1])


class UNet(nn.Module):
    """Encoder/decoder with ConvTranspose2d, GroupNorm, skip concatenation, upsampling."""

    def __init__(self) -> None:
        super().__init__()
        self.down = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.GroupNorm(2, 8), nn.SiLU())
        self.pool = nn.Conv2d(8, 16, 4, stride=2, padding=1)
        self.up = nn.ConvTranspose2d(16, 8, 4, stride=2, padding=1)
        self.mix = nn.Conv2d(16, 3, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skip = self.down(x)
        deep = torch.relu(self.pool(skip))
        up = self.up(deep) + nn.functional.interpolate(deep, scale_factor=2.0)[:, :8]
        return self.mix(torch.cat([up, skip], 1)).mean((2, 3)).repeat(1, 4)[:, :10]


def make_input(name: str, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if name == "cnn":
        return torch.randn(4, 3, 16, 16, generator=g)
    if name == "encoder":
        return torch.randint(0, 50, (4, 12), generator=g)
    if name == "recurrent":
        return torch.randn(4, 6, 8, generator=g)
    return torch.randn(2, 3, 16, 16, generator=g)


MODELS: dict[str, Callable[[], nn.Module]] = {
    "cnn": CNN,
    "encoder": Encoder,
    "recurrent": Recurrent,
    "unet": UNet,
}

OPTIMIZERS: dict[str, Callable[..., torch.optim.Optimizer]] = {
    "sgd": lambda p, foreach: torch.optim.SGD(p, lr=0.05, momentum=0.9, foreach=foreach),
    "adam": lambda p, foreach: torch.optim.Adam(p, lr=1e-3, foreach=foreach),
    "adamw": lambda p, foreach: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.1, foreach=foreach),
}


def train(
    name: str, device: torch.device, optimizer: str = "adam", foreach: bool = False, steps: int = 3
) -> dict[str, torch.Tensor]:
    """Forward, backward and ``steps`` optimizer steps from seed 0; returns CPU copies of the
    first output, the first gradients and the final parameters.

    Attention runs PyTorch's math backend on both devices: on a PrivateUse1 device (DirectML
    included) scaled_dot_product_attention takes that path, while the CPU would pick its fused
    flash kernel, a different algorithm with different rounding.
    """
    with sdpa_kernel([SDPBackend.MATH]):
        return _train(name, device, optimizer, foreach, steps)


def _train(
    name: str, device: torch.device, optimizer: str, foreach: bool, steps: int
) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = MODELS[name]().to(device)
    opt = OPTIMIZERS[optimizer](model.parameters(), foreach)
    x = make_input(name).to(device)
    target = torch.arange(x.shape[0]).remainder(10).to(device)
    result: dict[str, torch.Tensor] = {}
    for step in range(steps):
        opt.zero_grad()
        out = model(x)
        loss = nn.functional.cross_entropy(out, target)
        loss.backward()
        if step == 0:
            result["output"] = out.detach().cpu()
            for pname, p in model.named_parameters():
                result["grad." + pname] = p.grad.detach().cpu()
        opt.step()
    for pname, p in model.named_parameters():
        result["param." + pname] = p.detach().cpu()
    for bname, b in model.named_buffers():
        result["buffer." + bname] = b.detach().cpu()
    return result


def max_relative_error(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """Largest ``max|a-b| / max|b|`` over the tensors (b is the CPU reference)."""
    assert a.keys() == b.keys()
    worst = 0.0
    for key in b:
        ref = b[key].double()
        diff = (a[key].double() - ref).abs().max().item()
        scale = ref.abs().max().item()
        worst = max(worst, diff / scale if scale else diff)
    return worst
