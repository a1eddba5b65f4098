"""LSTM and GRU on DirectML: without dmlpatch every recurrent model dies in its first step
(``_thnn_fused_lstm_cell`` has no DirectML kernel and no CPU kernel to fall back to); with it,
training runs on the device, equal to the CPU, with no fallback and no copy."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable

import pytest
import torch
from tests.e2e.opfix.helpers import no_copies, without_fixes
from torch import nn

import dmlpatch.sim as sim


class Seq2Seq(nn.Module):
    """An LSTM encoder-decoder with teacher forcing, as in the PyTorch translation tutorial."""

    def __init__(self, vocabulary: int = 11, hidden: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocabulary, 8)
        self.encoder = nn.LSTM(8, hidden, num_layers=2, batch_first=True)
        self.decoder = nn.LSTM(8, hidden, num_layers=2, batch_first=True)
        self.out = nn.Linear(hidden, vocabulary)

    def forward(self, source: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        _, state = self.encoder(self.embed(source))
        decoded, _ = self.decoder(self.embed(target), state)
        return self.out(decoded)


class GruTagger(nn.Module):
    """A bidirectional GRU tagger."""

    def __init__(self, vocabulary: int = 11, hidden: int = 12, tags: int = 5) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocabulary, 8)
        self.gru = nn.GRU(8, hidden, batch_first=True, bidirectional=True)
        self.out = nn.Linear(2 * hidden, tags)

    def forward(self, source: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        encoded, _ = self.gru(self.embed(source))
        return self.out(encoded)


def _batches(classes: int) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(3)
    return [
        (
            torch.randint(0, 11, (4, 7), generator=generator),
            torch.randint(0, 11, (4, 7), generator=generator),
            torch.randint(0, classes, (4, 7), generator=generator),
        )
        for _ in range(3)
    ]


def _train(model: nn.Module, device: torch.device, classes: int) -> tuple[list[float], nn.Module]:
    model = model.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    losses = []
    for source, target, labels in _batches(classes):
        logits = model(source.to(device), target.to(device))
        loss = nn.functional.cross_entropy(logits.reshape(-1, classes), labels.to(device).view(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, model


MODELS: dict[str, tuple[Callable[[], nn.Module], int]] = {
    "lstm seq2seq": (Seq2Seq, 11),
    "bidirectional gru": (GruTagger, 5),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_trains_three_steps_equal_to_cpu(dev: torch.device, name: str) -> None:
    build, classes = MODELS[name]
    torch.manual_seed(0)
    reference = build()
    expected, trained_cpu = _train(copy.deepcopy(reference), torch.device("cpu"), classes)
    sim.reset_counters()
    got, trained = _train(copy.deepcopy(reference), dev, classes)
    counters = sim.counters()
    assert counters["ops"]["fallback"] == {} and counters["ops"]["refused"] == {}, counters
    cell = "aten::_thnn_fused_lstm_cell" if "lstm" in name else "aten::_thnn_fused_gru_cell"
    assert counters["ops"]["fixed"].get(cell, 0) > 0
    assert got == pytest.approx(expected, rel=1e-5)
    for (key, value), (_, cpu_value) in zip(
        trained.state_dict().items(), trained_cpu.state_dict().items()
    ):
        assert value.device == dev, key
        assert torch.allclose(value.cpu(), cpu_value, rtol=1e-4, atol=1e-5), key


@pytest.mark.parametrize("cell", [nn.LSTMCell, nn.GRUCell])
def test_cells_forward_and_backward_without_copies(dev: torch.device, cell: type) -> None:
    torch.manual_seed(1)
    module = cell(5, 6)
    x, h = torch.randn(3, 5), torch.randn(3, 6)
    state = (h, torch.randn(3, 6)) if cell is nn.LSTMCell else h
    moved = copy.deepcopy(module).to(dev)
    on_device = tuple(s.to(dev) for s in state) if isinstance(state, tuple) else state.to(dev)
    inputs = x.to(dev).requires_grad_()
    x.requires_grad_()
    sim.reset_counters()
    out = moved(inputs, on_device)
    first = out[0] if isinstance(out, tuple) else out
    first.sum().backward()
    assert no_copies(sim.counters()), sim.counters()
    expected = module(x, state)
    expected_first = expected[0] if isinstance(expected, tuple) else expected
    expected_first.sum().backward()
    assert torch.allclose(first.detach().cpu(), expected_first.detach(), rtol=1e-6, atol=1e-6)
    assert inputs.grad is not None and x.grad is not None
    assert torch.allclose(inputs.grad.cpu(), x.grad, rtol=1e-5, atol=1e-6)


def test_without_dmlpatch_every_recurrent_model_dies(dev: torch.device) -> None:
    lstm = nn.LSTM(3, 4).to(dev)
    with without_fixes(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(NotImplementedError, match="'aten::_thnn_fused_lstm_cell' with "):
            lstm(torch.randn(2, 1, 3).to(dev))
        gru = nn.GRU(3, 4).to(dev)
        with pytest.raises(NotImplementedError, match="'aten::_thnn_fused_gru_cell' with "):
            gru(torch.randn(2, 1, 3).to(dev))
