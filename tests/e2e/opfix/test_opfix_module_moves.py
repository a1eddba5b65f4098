"""Parameters keep their identity when a module moves to the device (catalogue entry
``parameters-replaced``): PyTorch replaces every Parameter moving to a PrivateUse1 device, so an
optimizer made before the move trained nothing and tied weights came apart. Each case trains
several steps and compares the losses, step by step, with the same program on the CPU."""

from __future__ import annotations

import warnings
from typing import Any, Callable

import pytest
import torch
from tests.e2e.opfix.helpers import without_fixes
from torch import nn
from torch.nn.utils import parametrize

from dmlpatch import log
from dmlpatch.opfix import module_moves


class TiedGRU(nn.Module):
    """A language model whose head is its embedding (GPT-2, T5, BERT's MLM head), with a GRU
    whose flat weights PyTorch rebuilds after a move (a linear layer without ``rnn``: DirectML
    has no GRU cell, and the unfixed device cannot run one)."""

    def __init__(self, rnn: bool = True) -> None:
        super().__init__()
        self.embed = nn.Embedding(12, 6)
        self.rnn = nn.GRU(6, 6, batch_first=True) if rnn else None
        self.mix = nn.Linear(6, 6)
        self.head = nn.Linear(6, 12, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(tokens)
        if self.rnn is not None:
            hidden = self.rnn(hidden)[0]
        return self.head(torch.tanh(self.mix(hidden)))


class Symmetric(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.triu() + x.triu(1).transpose(-1, -2)


def _tokens_loss(model: nn.Module, device: Any) -> Callable[[], torch.Tensor]:
    tokens = torch.randint(0, 12, (3, 5)).to(device)
    return lambda: nn.functional.cross_entropy(model(tokens).flatten(0, 1), tokens.flatten())


def _train(device: Any, optimizer_first: bool = True, steps: int = 4) -> tuple[list[float], Any]:
    torch.manual_seed(0)
    model = TiedGRU()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05) if optimizer_first else None
    model.to(device)
    if optimizer is None:
        optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    loss_of = _tokens_loss(model, device)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = loss_of()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, model


def test_an_optimizer_made_before_the_move_trains_as_on_the_cpu(dev: torch.device) -> None:
    on_cpu, _ = _train("cpu")
    on_device, model = _train(dev)
    assert on_device == pytest.approx(on_cpu, rel=1e-5)
    assert len(set(on_device)) == len(on_device)  # it trains: every step's loss differs
    assert model.head.weight is model.embed.weight
    assert model.head.weight.device == dev
    assert on_device == pytest.approx(_train(dev, optimizer_first=False)[0], rel=1e-6)


def test_without_the_fix_the_simulator_reproduces_pytorchs_replacement(
    dev: torch.device,
) -> None:
    with without_fixes():
        assert not module_moves.installed()
        torch.manual_seed(0)
        model = TiedGRU(rnn=False)
        before = model.embed.weight
        optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
        model.to(dev)
        assert model.embed.weight is not before
        assert model.head.weight is not model.embed.weight  # the tie came apart
        loss_of = _tokens_loss(model, dev)
        losses = []
        for _ in range(3):
            optimizer.zero_grad()
            loss = loss_of()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        assert losses[0] == losses[1] == losses[2]  # the optimizer steps the CPU tensors
    assert module_moves.installed()


def test_dtype_and_device_moves_keep_every_parameter_and_its_tie(dev: torch.device) -> None:
    torch.manual_seed(0)
    model = TiedGRU()
    originals = {name: p for name, p in model.named_parameters(remove_duplicate=False)}
    model.to(dev, torch.float16)
    model.float()
    model.half()
    model.to(torch.float32)
    model.to(dev)
    model.cpu()
    model.to(dev)
    for name, parameter in model.named_parameters(remove_duplicate=False):
        assert parameter is originals[name], name
        assert parameter.device == dev and parameter.dtype == torch.float32, name
    assert model.head.weight is model.embed.weight
    assert isinstance(model.embed.weight, nn.Parameter) and model.embed.weight.requires_grad


def test_hooks_gradients_and_attributes_move_with_the_parameter(dev: torch.device) -> None:
    torch.manual_seed(0)
    layer = nn.Linear(3, 2)
    weight = layer.weight
    weight.tag = "kept"  # attributes libraries set on parameters (no_weight_decay and kin)
    seen: list[torch.device] = []
    weight.register_hook(lambda grad: seen.append(grad.device))
    weight.register_post_accumulate_grad_hook(lambda p: seen.append(p.grad.device))
    forwards: list[torch.device] = []
    layer.register_forward_hook(lambda m, i, o: forwards.append(o.device))
    layer(torch.ones(1, 3)).sum().backward()
    grad = weight.grad.clone()
    layer.to(dev)
    assert layer.weight is weight and weight.tag == "kept"
    assert weight.grad is not None and weight.grad.device == dev
    assert torch.equal(weight.grad.cpu(), grad)
    layer(torch.ones(1, 3, device=dev)).sum().backward()
    assert seen == [torch.device("cpu")] * 2 + [dev] * 2
    assert forwards == [torch.device("cpu"), dev]
    assert torch.equal(weight.grad.cpu(), 2 * grad)


def test_a_parametrized_module_trains_as_on_the_cpu(dev: torch.device) -> None:
    def train(device: Any) -> list[float]:
        torch.manual_seed(0)
        layer = nn.Linear(4, 4)
        parametrize.register_parametrization(layer, "weight", Symmetric())
        optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
        original = layer.parametrizations.weight.original
        layer.to(device)
        assert layer.parametrizations.weight.original is original
        x = torch.randn(8, 4).to(device)
        losses = []
        for _ in range(3):
            optimizer.zero_grad()
            loss = layer(x).pow(2).mean()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        assert torch.equal(layer.weight.cpu(), layer.weight.cpu().T)
        return losses

    assert train(dev) == pytest.approx(train("cpu"), rel=1e-5)


def test_moves_pytorch_replaces_on_cuda_too_are_left_alone(dev: torch.device) -> None:
    # From meta (a model built with init_empty_weights): CUDA replaces these Parameters too.
    with torch.device("meta"):
        layer = nn.Linear(2, 2)
    before = layer.weight
    layer.to_empty(device=dev)
    assert layer.weight is not before and layer.weight.device == dev
    # torch.__future__'s overwrite setting asks for new Parameters everywhere.
    torch.__future__.set_overwrite_module_params_on_conversion(True)
    try:
        layer = nn.Linear(2, 2)
        before = layer.weight
        layer.to(dev)
        assert layer.weight is not before
    finally:
        torch.__future__.set_overwrite_module_params_on_conversion(False)


def test_a_refused_handover_keeps_pytorchs_new_parameter_and_says_so_once(
    dev: torch.device, capsys: pytest.CaptureFixture[str]
) -> None:
    log._said.discard("module-moves")
    layer = nn.Linear(2, 2)
    weight = layer.weight
    # A weak reference held in C++ (torch.compile's guards hold such): PyTorch refuses the swap.
    held = torch._C._WeakTensorRef(weight)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        layer.to(dev)
    assert layer.weight is not weight and layer.weight.device == dev
    assert weight.device == torch.device("cpu")
    layer(torch.ones(1, 2, device=dev))  # it still runs, as without dmlpatch
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "dmlpatch: warning: Linear.weight is a new Parameter after its move to privateuseone:0, as "
        "without dmlpatch (PyTorch refused to hand the moved tensor to the old one): make the "
        "optimizer after moving the model"
    ]
    del held


def test_cpu_moves_are_unchanged(dev: torch.device) -> None:
    torch.manual_seed(0)
    layer = nn.Linear(3, 3)
    weight = layer.weight
    layer.half()
    layer.double()
    assert layer.weight is weight and weight.dtype == torch.float64
