"""float16 matrix products and convolutions on the simulated device: computed in float32 and
rounded once (the CPU's float16 kernels, 30-40x slower than float32's, made a mixed-precision
step minutes long). Their order of summation is not the CPU's float16 kernels', so a value may
differ from the CPU's by a few float16 steps: each result is as near the exact one (float64,
from the same float16 inputs) as the CPU's, or within one float16 rounding of it. Mixed
float16 and float32 arguments still meet the CPU kernel's own error."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F


def _as_accurate(got: torch.Tensor, cpu: torch.Tensor, exact: torch.Tensor) -> bool:
    """float16, shaped as the CPU's; its largest error from the exact result no larger than the
    CPU's, or than one float16 rounding of the largest exact value."""
    got = got.detach().cpu()
    if got.dtype != torch.float16 or got.shape != cpu.shape:
        return False
    exact = exact.detach().double()
    rounding = torch.finfo(torch.float16).eps * float(exact.abs().max())
    cpu_error = float((cpu.detach().double() - exact).abs().max())
    return float((got.double() - exact).abs().max()) <= max(cpu_error, rounding)


@pytest.mark.parametrize(
    "product",
    [
        lambda a, b, c: a @ b,
        lambda a, b, c: torch.addmm(c, a, b),
        lambda a, b, c: torch.bmm(a.unsqueeze(0), b.unsqueeze(0)),
        lambda a, b, c: torch.baddbmm(c.unsqueeze(0), a.unsqueeze(0), b.unsqueeze(0)),
    ],
)
def test_float16_products_are_the_cpu_s_within_one_rounding(dev: Any, product: Any) -> None:
    torch.manual_seed(0)
    a, b, c = torch.randn(33, 70).half(), torch.randn(70, 17).half(), torch.randn(33, 17).half()
    got = product(a.to(dev), b.to(dev), c.to(dev))
    assert _as_accurate(got, product(a, b, c), product(a.double(), b.double(), c.double()))


def test_an_out_tensor_is_resized_and_written_in_float16(dev: Any) -> None:
    a, b = torch.randn(8, 5).half(), torch.randn(5, 3).half()
    out = torch.empty(0, dtype=torch.float16, device=dev)
    returned = torch.mm(a.to(dev), b.to(dev), out=out)
    assert returned is out and out.shape == (8, 3) and out.dtype == torch.float16
    assert _as_accurate(out, a @ b, a.double() @ b.double())


def test_float16_convolution_and_its_gradients(dev: Any) -> None:
    torch.manual_seed(0)
    x, w, bias = torch.randn(2, 4, 9, 9), torch.randn(6, 4, 3, 3), torch.randn(6)
    results = []
    for device, dtype in ((dev, torch.float16), ("cpu", torch.float16), ("cpu", torch.float64)):
        leaves = [t.half().to(dtype).to(device).requires_grad_() for t in (x, w, bias)]
        out = F.conv2d(*leaves, padding=1)
        weights = torch.linspace(-1, 1, out.numel(), dtype=torch.float64).reshape(out.shape)
        (out.double() * weights.to(device)).sum().backward()
        results.append([out, *(leaf.grad for leaf in leaves)])
    for got, cpu, exact in zip(*results):
        assert _as_accurate(got, cpu, exact)


def test_mixed_float16_and_float32_arguments_meet_the_cpu_s_error(dev: Any) -> None:
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    with pytest.raises(RuntimeError, match="same dtype"):
        a.half().to(dev) @ b.to(dev)
    with pytest.raises(RuntimeError, match="expected scalar type Half but found Float"):
        F.conv2d(torch.randn(1, 2, 5, 5).half().to(dev), torch.randn(3, 2, 3, 3).to(dev))
