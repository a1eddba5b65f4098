"""A model shared between processes (``model.share_memory()`` of a model on the device) keeps
its weights in host shared memory and computes on the device with copies of them: the same
Parameter objects, gradients back on the shared weights, losses equal to the CPU's step by
step. The processes themselves are in tests/e2e/test_hogwild.py."""

from __future__ import annotations

from multiprocessing.reduction import ForkingPickler

import pytest
import torch
from torch import nn

from dmlpatch import log
from dmlpatch.opfix import shared_modules


class TiedNet(nn.Module):
    """A convolution, a BatchNorm (running statistics changed in place by each forward), a
    submodule's weight read by its parent's forward, and one module used twice."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3)
        self.norm = nn.BatchNorm2d(4)
        self.encode = nn.Linear(4 * 6 * 6, 8)
        self.head = nn.Linear(8, 3)
        self.head_twin = self.head  # one module twice: its weights get one copy and one gradient

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = torch.relu(self.norm(self.conv(x))).flatten(1)
        code = self.encode(hidden)
        decoded = code @ self.encode.weight  # the weight, not the module: its parent's copy
        return self.head(code) + self.head_twin(code) + decoded.mean()


def _train(device: torch.device, share: bool, steps: int = 4) -> tuple[list[float], nn.Module]:
    torch.manual_seed(0)
    model = TiedNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)  # made before the move
    model.to(device)
    if share:
        model.share_memory()
    data = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        images = torch.randn(5, 1, 8, 8, generator=data).to(device)
        labels = torch.randint(0, 3, (5,), generator=data).to(device)
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, model


@pytest.fixture(autouse=True)
def _fresh_lines() -> None:
    log._said.clear()


def test_a_shared_model_trains_on_the_device_as_on_the_cpu(
    dev: torch.device, capsys: pytest.CaptureFixture[str]
) -> None:
    expected, on_cpu = _train(torch.device("cpu"), share=True)
    losses, model = _train(dev, share=True)
    assert losses == expected
    for name, tensor in model.state_dict().items():
        assert tensor.device.type == "cpu", name
        assert torch.equal(tensor, on_cpu.state_dict()[name]), name  # running statistics too
    for parameter in model.parameters():
        assert parameter.is_shared() and parameter.grad is not None
        assert parameter.grad.device.type == "cpu"
    (said,) = [line for line in capsys.readouterr().err.splitlines() if "share_memory" in line]
    assert said.startswith("dmlpatch: TiedNet.share_memory() at ")
    assert "test_opfix_shared_modules.py:" in said
    assert said.endswith(
        ": DirectML has no inter-process memory, so its weights are shared in host memory; a "
        "forward given tensors on privateuseone:0 computes there with copies of them, and the "
        "gradients come back to the shared weights"
    )


def test_the_forward_runs_where_its_input_is(dev: torch.device) -> None:
    _, model = _train(dev, share=True, steps=1)
    model.eval()
    images = torch.randn(2, 1, 8, 8)
    on_host = model(images)
    on_device = model(images.to(dev))
    assert on_host.device.type == "cpu" and on_device.device == dev
    assert torch.equal(on_device.cpu(), on_host)
    assert model.conv.weight.device.type == "cpu"  # the shared weight is back after the forward


def test_moving_a_shared_model_to_the_device_keeps_it_shared(dev: torch.device) -> None:
    _, model = _train(dev, share=True, steps=1)
    weight = model.conv.weight
    assert model.to(dev) is model
    assert model.conv.weight is weight and weight.device.type == "cpu" and weight.is_shared()
    model.double()  # a dtype change is not a move to the device: PyTorch's own
    assert model.conv.weight.dtype == torch.float64


def test_a_spawned_worker_gets_the_hooks_with_the_model(dev: torch.device) -> None:
    _, model = _train(dev, share=True, steps=1)
    arrived = ForkingPickler.loads(ForkingPickler.dumps(model))
    hosted = vars(arrived)[shared_modules.HOSTED]
    assert hosted is vars(arrived.head)[shared_modules.HOSTED]  # one for the tree
    assert hosted.device == dev
    images = torch.randn(2, 1, 8, 8).to(dev)
    assert torch.equal(arrived.eval()(images).cpu(), model.eval()(images).cpu())
    with torch.no_grad():
        model.conv.weight.add_(1.0)  # what one process writes, the other reads
    assert torch.equal(arrived.conv.weight, model.conv.weight)


def test_a_model_on_the_cpu_is_shared_as_pytorch_shares_it(dev: torch.device) -> None:
    model = nn.Linear(3, 2).share_memory()
    assert model.weight.is_shared()
    assert shared_modules.HOSTED not in vars(model)
    assert not model._forward_pre_hooks
