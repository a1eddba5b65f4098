"""Complex numbers and the FFT family on the device (``dmlpatch.opfix.complex.spectral``,
``dmlpatch.opfix.complex``): every transform, STFT and operation equals the CPU within
float32 rounding, makes no copy to the host, and keeps autograd; without dmlpatch each stops
with DirectML's ``Invalid or unsupported data type ComplexFloat.``."""

from __future__ import annotations

import math
from typing import Any, Callable

import pytest
import torch
from tests.e2e.opfix.helpers import no_copies, without_fixes

import dmlpatch.sim as sim
from dmlpatch.opfix.complex import dft
from dmlpatch.opfix.complex.ops import ComplexUnsupported
from dmlpatch.opfix.complex.tensor import PairedComplex


def _near(got: torch.Tensor, expected: torch.Tensor, roundings: float = 64) -> None:
    """Equal within float32 rounding of the largest magnitude (a transform's error scales
    with its largest output, not with each one)."""
    got = got.cpu()
    assert got.shape == expected.shape and got.dtype == expected.dtype, (got, expected)
    if not (expected.is_floating_point() or expected.is_complex()):
        assert torch.equal(got, expected)
        return
    scale = max(1.0, float(expected.abs().max())) if expected.numel() else 1.0
    error = float((got - expected).abs().max()) if expected.numel() else 0.0
    assert error <= roundings * torch.finfo(torch.float32).eps * scale, error


@pytest.mark.parametrize("n", [1, 2, 3, 7, 16, 64, 65, 100, 400, 401, 1000, 4096, 8191, 8192])
def test_transforms_of_every_length_equal_numpys_exact_ones(n: int) -> None:
    """The compositions themselves, on the host in float64: against torch.fft in float64."""
    torch.manual_seed(n)
    x = torch.randn(3, n, dtype=torch.float64)
    z = torch.randn(3, n, 2, dtype=torch.float64)
    exact = torch.fft.fft(x)
    got = torch.view_as_complex(dft.transform_real(x, -1))
    assert float((got - exact).abs().max()) <= 1e-9 * max(1.0, float(exact.abs().max()))
    exact = torch.fft.ifft(torch.view_as_complex(z)) * n
    got = torch.view_as_complex(dft.transform(z, 1))
    assert float((got - exact).abs().max()) <= 1e-9 * max(1.0, float(exact.abs().max()))
    half = z[:, : n // 2 + 1].contiguous()
    exact = torch.fft.irfft(torch.view_as_complex(half), n) * n
    got = dft.transform_to_real(half, n, 1)
    assert float((got - exact).abs().max()) <= 1e-9 * max(1.0, float(exact.abs().max()))


FFTS: dict[str, tuple[Callable[[torch.Tensor], Any], bool]] = {
    "fft": (lambda t: torch.fft.fft(t), True),
    "ifft ortho": (lambda t: torch.fft.ifft(t, norm="ortho"), True),
    "rfft": (lambda t: torch.fft.rfft(t), False),
    "rfft n=100 forward": (lambda t: torch.fft.rfft(t, n=100, norm="forward"), False),
    "irfft": (lambda t: torch.fft.irfft(t), True),
    "irfft n=90": (lambda t: torch.fft.irfft(t, n=90), True),
    "fft2": (lambda t: torch.fft.fft2(t), True),
    "ifft2": (lambda t: torch.fft.ifft2(t), True),
    "rfft2": (lambda t: torch.fft.rfft2(t), False),
    "irfft2": (lambda t: torch.fft.irfft2(t), True),
    "fftn": (lambda t: torch.fft.fftn(t, dim=(0, 2)), True),
    "ifftn": (lambda t: torch.fft.ifftn(t), True),
    "rfftn": (lambda t: torch.fft.rfftn(t), False),
    "irfftn": (lambda t: torch.fft.irfftn(t, s=(4, 6, 20)), True),
    "fft of real": (lambda t: torch.fft.fft(t, dim=1), False),
    "fftshift": (lambda t: torch.fft.fftshift(torch.fft.fft2(t)), False),
}


@pytest.mark.parametrize("name", FFTS)
def test_the_fft_family_equals_the_cpu_with_no_copy(dev: torch.device, name: str) -> None:
    run, complex_input = FFTS[name]
    torch.manual_seed(0)
    shape = (4, 6, 50)
    x = torch.randn(*shape, dtype=torch.complex64) if complex_input else torch.randn(*shape)
    on_device = x.to(dev)
    run(on_device)  # a length's first transform uploads its matrices, once
    sim.reset_counters()
    got = run(on_device)
    counters = sim.counters()
    _near(got, run(x))
    assert no_copies(counters), counters
    assert isinstance(got, PairedComplex) == got.is_complex()


STFTS: dict[str, dict[str, Any]] = {
    "whisper": {"n_fft": 400, "hop_length": 160},
    "demucs": {"n_fft": 4096, "hop_length": 1024, "normalized": True, "pad_mode": "reflect"},
    # Hamming: without centring, istft needs a window that is not zero at its ends.
    "no center": {"n_fft": 256, "hop_length": 64, "center": False, "window": "hamming"},
    "two-sided": {"n_fft": 128, "hop_length": 32, "onesided": False},
}


@pytest.mark.parametrize("name", STFTS)
def test_stft_and_istft_round_trip_equal_the_cpu(dev: torch.device, name: str) -> None:
    options = dict(STFTS[name])
    n_fft = options["n_fft"]
    torch.manual_seed(1)
    audio = torch.randn(2, 16000)
    window = torch.hamming_window(n_fft) if options.pop("window", "") else torch.hann_window(n_fft)
    expected = torch.stft(audio, window=window, return_complex=True, **options)
    on_device, window_on_device = audio.to(dev), window.to(dev)

    def round_trip() -> tuple[torch.Tensor, torch.Tensor]:
        spectrum = torch.stft(on_device, window=window_on_device, return_complex=True, **options)
        signal = torch.istft(
            spectrum, window=window_on_device, length=audio.shape[-1], **_istft(options)
        )
        return spectrum, signal

    round_trip()  # the first transforms of each length upload their matrices, once
    sim.reset_counters()
    got, back = round_trip()
    counters = sim.counters()
    _near(got, expected)
    _near(back, torch.istft(expected, window=window, length=audio.shape[-1], **_istft(options)))
    assert no_copies(counters), counters
    real_form = torch.stft(audio.to(dev), window=window.to(dev), return_complex=False, **options)
    assert type(real_form) is torch.Tensor and real_form.dtype == torch.float32
    _near(real_form, torch.view_as_real(expected))


def _istft(options: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in options.items() if k != "pad_mode"}


def test_a_spectral_loss_trains_equal_to_the_cpu(dev: torch.device) -> None:
    """Autograd through stft, abs and the complex operations' backward."""
    torch.manual_seed(2)
    signal = torch.randn(2, 4000)
    weights = torch.randn(8, 1, 9) * 0.1

    def loss_and_grad(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        w = weights.to(device).requires_grad_()
        x = torch.nn.functional.conv1d(signal.to(device).unsqueeze(1), w, padding=4).sum(1)
        window = torch.hann_window(256, device=device)
        spectrum = torch.stft(x, 256, 64, window=window, return_complex=True)
        loss = (spectrum.abs() + 1e-5).log().mean() + spectrum.angle().cos().mean()
        loss.backward()
        assert w.grad is not None
        return loss.detach(), w.grad

    loss, grad = loss_and_grad(dev)
    expected_loss, expected_grad = loss_and_grad(torch.device("cpu"))
    _near(loss, expected_loss)
    _near(grad, expected_grad, roundings=1024)


def _complex_pair() -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(3)
    return torch.randn(3, 4, dtype=torch.complex64), torch.randn(3, 4, dtype=torch.complex64)


OPERATIONS: dict[str, Callable[[torch.Tensor, torch.Tensor, torch.Tensor], Any]] = {
    "abs": lambda a, b, r: a.abs(),
    "angle": lambda a, b, r: a.angle(),
    "real": lambda a, b, r: a.real,
    "imag": lambda a, b, r: a.imag,
    "conj": lambda a, b, r: torch.conj(a),
    "conj then clone": lambda a, b, r: a.conj().clone(),
    "a + b": lambda a, b, r: a + b,
    "a - b": lambda a, b, r: a - b,
    "a * b": lambda a, b, r: a * b,
    "a / b": lambda a, b, r: a / b,
    "a + real": lambda a, b, r: a + r,
    "real - a": lambda a, b, r: r - a,
    "real * a": lambda a, b, r: r * a,
    "a / real": lambda a, b, r: a / (r.abs() + 1),
    "a * 2j": lambda a, b, r: a * 2j,
    "a + 0.5": lambda a, b, r: a + 0.5,
    "a ** 2": lambda a, b, r: a**2,
    "a ** 3": lambda a, b, r: a**3,
    "a ** 0.5": lambda a, b, r: a**0.5,
    "exp": lambda a, b, r: torch.exp(a),
    "log": lambda a, b, r: torch.log(a),
    "sqrt": lambda a, b, r: torch.sqrt(a),
    "reciprocal": lambda a, b, r: torch.reciprocal(a),
    "sgn": lambda a, b, r: torch.sgn(a),
    "neg": lambda a, b, r: -a,
    "sum": lambda a, b, r: a.sum(),
    "sum(1)": lambda a, b, r: a.sum(1),
    "mean(0, keepdim)": lambda a, b, r: a.mean(0, keepdim=True),
    "cumsum": lambda a, b, r: a.cumsum(1),
    "view_as_real": lambda a, b, r: torch.view_as_real(a),
    "view_as_complex": lambda a, b, r: torch.view_as_complex(torch.view_as_real(a) * 2),
    "polar": lambda a, b, r: torch.polar(r.abs(), r),
    "complex": lambda a, b, r: torch.complex(r, r * 2),
    "index": lambda a, b, r: a[1, 2:],
    "bool mask": lambda a, b, r: a[r > 0],
    "index tensor": lambda a, b, r: a[torch.tensor([2, 0])],
    "transpose": lambda a, b, r: a.t().contiguous(),
    "permute, reshape": lambda a, b, r: a.unsqueeze(0).permute(2, 0, 1).reshape(4, 3),
    "flip": lambda a, b, r: a.flip(0),
    "roll": lambda a, b, r: a.roll(1, 1),
    "cat": lambda a, b, r: torch.cat([a, b], 1),
    "stack": lambda a, b, r: torch.stack([a, b]),
    "where": lambda a, b, r: torch.where(r > 0, a, b),
    "masked_fill": lambda a, b, r: a.masked_fill(r > 0, 0),
    "matmul": lambda a, b, r: a @ b.t(),
    "expand": lambda a, b, r: a[:1].expand(3, 4) * 1,
    "pad": lambda a, b, r: torch.nn.functional.pad(a, (1, 2)),
    "zeros_like": lambda a, b, r: torch.zeros_like(a),
    "ones_like": lambda a, b, r: torch.ones_like(a),
    "new_zeros": lambda a, b, r: a.new_zeros(2, 2),
    "full complex": lambda a, b, r: torch.full((2,), 1 + 2j, device=r.device),
    "zeros complex64": lambda a, b, r: torch.zeros(2, 3, dtype=torch.complex64, device=r.device),
    "fill_": lambda a, b, r: a.clone().fill_(3 - 1j),
    "in-place mul": lambda a, b, r: a.clone().mul_(b),
    "in-place on a view": lambda a, b, r: _write_through_view(a),
    "copy_": lambda a, b, r: torch.empty_like(a).copy_(b),
    "eq": lambda a, b, r: a == a.clone(),
    "isfinite": lambda a, b, r: torch.isfinite(a / 0),
    "item": lambda a, b, r: torch.tensor(a[0, 0].item()),
    "to complex128": lambda a, b, r: a.to(torch.complex128),
    "to real": lambda a, b, r: a.real.to(torch.float64),
    "vector norm": lambda a, b, r: torch.linalg.vector_norm(a, dim=1),
    "allclose": lambda a, b, r: torch.tensor(torch.allclose(a, a * 1.0000001)),
    "as_strided": lambda a, b, r: a.as_strided((2, 2), (4, 1), 1) * 1,
    "unbind": lambda a, b, r: torch.stack(a.unbind(1)),
    "chunk": lambda a, b, r: a.chunk(2, 1)[1] * 1,
}


def _write_through_view(a: torch.Tensor) -> torch.Tensor:
    copy = a.clone()
    copy[:, 1] *= 1j
    copy[0].add_(1)
    return copy


@pytest.mark.parametrize("name", OPERATIONS)
def test_complex_operations_equal_the_cpu(dev: torch.device, name: str) -> None:
    run = OPERATIONS[name]
    a, b = _complex_pair()
    r = torch.randn(3, 4)
    expected = run(a, b, r)
    sim.reset_counters()
    got = run(a.to(dev), b.to(dev), r.to(dev))
    counters = sim.counters()
    assert counters["ops"]["fallback"] == {} and counters["ops"]["refused"] == {}, counters
    on_device = got.device.type == "privateuseone"
    assert isinstance(got, PairedComplex) == (on_device and got.is_complex())
    _near(got, expected)


def test_a_complex_tensor_reads_as_complex(dev: torch.device) -> None:
    a, _ = _complex_pair()
    z = a.to(dev)
    assert z.dtype == torch.complex64 and z.is_complex() and z.device == dev
    assert z.shape == (3, 4) and z.stride() == (4, 1) and z.is_contiguous()
    assert z.t().stride() == (1, 4) and not z.t().is_contiguous()
    assert repr(z).endswith(", device='privateuseone:0')") and "j" in repr(z)
    assert torch.equal(z.cpu(), a)


def test_an_operation_not_composed_stops_with_one_line(dev: torch.device) -> None:
    a, _ = _complex_pair()
    with pytest.raises(ComplexUnsupported) as raised:
        torch.tanh(a.to(dev))
    message = str(raised.value)
    assert message.startswith("aten::tanh of a complex tensor is not available on DirectML")
    assert "catalogue entry 'complex'" in message and "\n" not in message


def test_without_dmlpatch_complex_tensors_stop_the_process(dev: torch.device) -> None:
    audio = torch.randn(1, 4000).to(dev)
    with without_fixes():
        for attempt in (
            lambda: torch.stft(
                audio, 400, return_complex=True, window=torch.hann_window(400).to(dev)
            ),
            lambda: torch.fft.rfft(audio),
            lambda: torch.randn(3, dtype=torch.complex64).to(dev),
        ):
            with pytest.raises(
                RuntimeError, match=r"Invalid or unsupported data type ComplexFloat\."
            ):
                attempt()


def test_transform_lengths_to_65536_keep_float32_precision(dev: torch.device) -> None:
    for power in range(10, 17, 2):
        n = 1 << power
        torch.manual_seed(power)
        x = torch.randn(2, n)
        expected = torch.fft.rfft(x)
        got = torch.fft.rfft(x.to(dev))
        # A length-n transform rounds through log2(n) stages: error grows with its depth.
        _near(got, expected, roundings=16 * math.log2(n))
        _near(torch.fft.irfft(got, n), x, roundings=16 * math.log2(n))


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
@pytest.mark.parametrize(
    "draw",
    [
        lambda dtype, where: torch.rand(3, 2, dtype=dtype, device=where),
        lambda dtype, where: torch.randn(4, dtype=dtype, device=where),
        lambda dtype, where: torch.empty(5, dtype=dtype, device=where).normal_(1.0, 2.0),
        lambda dtype, where: torch.empty(2, 3, dtype=dtype, device=where).t().uniform_(-1, 3),
    ],
    ids=["rand", "randn", "normal_", "uniform_ of a view"],
)
def test_seeded_complex_draws_are_the_cpu_s_numbers(
    dev: torch.device, draw: Any, dtype: torch.dtype
) -> None:
    # kornia's Lie groups draw complex rotations (So2.random): the parts come from one real
    # stream, in PyTorch's order, so a seed gives the CPU's numbers.
    torch.manual_seed(0)
    expected = draw(dtype, "cpu")
    torch.manual_seed(0)
    got = draw(dtype, dev)
    assert got.device == dev and got.dtype == dtype
    assert torch.equal(got.cpu(), expected)
