"""FFTs, STFTs and the complex constructors on DirectML, on the device.

torch-directml registers no FFT and has no complex dtype: ``torch.stft``, ``torch.istft`` and
every ``torch.fft`` function of a DirectML tensor stop the process with ``Invalid or
unsupported data type ComplexFloat.`` (microsoft/DirectML#704), as do ``torch.complex``,
``torch.polar`` and ``torch.view_as_complex`` (#421). Whisper's log-Mel spectrogram, every
iSTFT vocoder, Demucs' spectrogram branch, rotary embeddings written with complex numbers and
FFT convolutions all meet it.

PyTorch composes all of these of five operators, served here: ``_fft_r2c``, ``_fft_c2c`` and
``_fft_c2r`` (:mod:`dmlpatch.opfix.complex.dft`: matrix products DirectML runs natively, no
copy to the host), and ``complex``, ``polar`` and ``view_as_complex``, which make a complex
tensor out of real ones. Their complex results are
:class:`~dmlpatch.opfix.complex.tensor.PairedComplex` tensors, whose further operations
:mod:`dmlpatch.opfix.complex.ops` answers. Only programs that use complex numbers reach any of
this: none of these operators has a DirectML kernel, so the fixes cost nothing elsewhere.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch

from dmlpatch.opfix._accounting import record
from dmlpatch.opfix._kernel import Kernel
from dmlpatch.opfix.complex import dft, ops
from dmlpatch.opfix.complex.tensor import PART_DTYPES, PairedComplex, is_paired, wrap

aten = torch.ops.aten

_BY_ROOT_N, _BY_N = 1, 2  # ATen's fft_norm_mode: none, by_root_n, by_n


def _scaled(t: torch.Tensor, normalization: int, signal: int) -> torch.Tensor:
    if normalization == _BY_N:
        return t * (1.0 / signal)
    if normalization == _BY_ROOT_N:
        return t * (1.0 / math.sqrt(signal))
    return t


def _part_dtype(t: torch.Tensor) -> torch.dtype:
    # Half precision transforms run in float32, as on the CPU (which has no half FFT).
    return torch.float32 if t.dtype in (torch.float16, torch.bfloat16) else t.dtype


def _c2c_along(pairs: torch.Tensor, dim: int, sign: int) -> torch.Tensor:
    moved = pairs.movedim(dim, -2)
    return dft.transform(moved, sign).movedim(-2, dim)


def fft_r2c(x: torch.Tensor, dim: list[int], normalization: int, onesided: bool) -> PairedComplex:
    """``aten::_fft_r2c`` of a real device tensor."""
    record("fixed", "aten::_fft_r2c")
    ndim = x.dim()
    dims = [d % ndim for d in dim]
    last = dims[-1]
    signal = math.prod(x.shape[d] for d in dims)
    real = x.to(_part_dtype(x)).movedim(last, -1)
    n = real.shape[-1]
    pairs = dft.transform_real(real, -1)
    if onesided:
        pairs = pairs[..., : n // 2 + 1, :]
    pairs = pairs.movedim(-2, last)
    for d in dims[:-1]:
        pairs = _c2c_along(pairs, d, -1)
    return wrap(_scaled(pairs, normalization, signal))


def fft_c2c(z: PairedComplex, dim: list[int], normalization: int, forward: bool) -> PairedComplex:
    """``aten::_fft_c2c`` of a paired complex tensor."""
    record("fixed", "aten::_fft_c2c")
    ndim = z.dim()
    dims = [d % ndim for d in dim]
    signal = math.prod(z.shape[d] for d in dims)
    pairs = z.pairs
    for d in dims:
        pairs = _c2c_along(pairs, d, -1 if forward else 1)
    return wrap(_scaled(pairs, normalization, signal), z.dtype)


def fft_c2r(
    z: PairedComplex, dim: list[int], normalization: int, last_dim_size: int
) -> torch.Tensor:
    """``aten::_fft_c2r`` of a paired complex tensor: a real device tensor."""
    record("fixed", "aten::_fft_c2r")
    ndim = z.dim()
    dims = [d % ndim for d in dim]
    last = dims[-1]
    signal = math.prod(z.shape[d] for d in dims[:-1]) * last_dim_size
    pairs = z.pairs
    for d in dims[:-1]:
        pairs = _c2c_along(pairs, d, 1)
    real = dft.transform_to_real(pairs.movedim(last, -2), last_dim_size, 1).movedim(-1, last)
    return _scaled(real, normalization, signal)


def _into(out: torch.Tensor, result: torch.Tensor) -> torch.Tensor:
    if out.shape != result.shape:
        out.resize_(result.shape)
    out.copy_(result)
    return out


def _r2c_kernel(x: torch.Tensor, dim: list[int], normalization: int, onesided: bool) -> Any:
    return fft_r2c(x, dim, normalization, onesided)


def _r2c_out(
    x: torch.Tensor, dim: list[int], normalization: int, onesided: bool, *, out: torch.Tensor
) -> torch.Tensor:
    return _into(out, fft_r2c(x, dim, normalization, onesided))


def _complex(real: torch.Tensor, imag: torch.Tensor) -> PairedComplex:
    """``torch.complex(real, imag)`` of device tensors."""
    record("fixed", "aten::complex")
    if real.dtype != imag.dtype or not real.is_floating_point():
        raise RuntimeError(
            "Expected object of scalar type Float or Double for real and imag, got "
            f"{real.dtype} and {imag.dtype}"
        )
    real, imag = torch.broadcast_tensors(real, imag)
    return wrap(torch.stack((real, imag), dim=-1))


def _complex_out(real: torch.Tensor, imag: torch.Tensor, *, out: torch.Tensor) -> torch.Tensor:
    return _into(out, _complex(real, imag))


def _polar(magnitude: torch.Tensor, angle: torch.Tensor) -> PairedComplex:
    """``torch.polar(abs, angle)`` of device tensors."""
    record("fixed", "aten::polar")
    magnitude, angle = torch.broadcast_tensors(magnitude, angle)
    return wrap(torch.stack((magnitude * angle.cos(), magnitude * angle.sin()), dim=-1))


def _polar_out(magnitude: torch.Tensor, angle: torch.Tensor, *, out: torch.Tensor) -> torch.Tensor:
    return _into(out, _polar(magnitude, angle))


def _view_as_complex(t: torch.Tensor) -> PairedComplex:
    """``torch.view_as_complex(t)`` of a real device tensor: a view of ``t``."""
    record("fixed", "aten::view_as_complex")
    if t.dtype not in PART_DTYPES.values():
        raise RuntimeError(
            f"view_as_complex is only supported for floating point tensors, but got a tensor "
            f"of scalar type: {t.dtype}"
        )
    if t.dim() == 0 or t.shape[-1] != 2:
        raise RuntimeError("Tensor must have a last dimension of size 2")
    if t.stride(-1) != 1:
        raise RuntimeError("Tensor must have a last dimension with stride 1")
    if any(s % 2 for s in t.stride()[:-1]):
        raise RuntimeError("Tensor must have a stride divisible by 2 for all but last dimension")
    if t.storage_offset() % 2:
        raise RuntimeError("Tensor must have a storage_offset divisible by 2")
    return wrap(aten.alias.default(t))


def _paired_only(name: str, run: Callable[..., Any]) -> Callable[..., Any]:
    """A ``__torch_dispatch__`` handler for an operator whose input is complex."""

    def handler(func: Any, z: Any, *args: Any, **kwargs: Any) -> Any:
        if not is_paired(z):
            raise ops.ComplexUnsupported(f"{name} of a real tensor mixed with complex ones")
        out = kwargs.pop("out", None)
        result = run(z, *args, **kwargs)
        return result if out is None else _into(out, result)

    return handler


ops.register(
    {
        aten._fft_c2c.default: _paired_only("_fft_c2c", fft_c2c),
        aten._fft_c2c.out: _paired_only("_fft_c2c", fft_c2c),
        aten._fft_c2r.default: _paired_only("_fft_c2r", fft_c2r),
        aten._fft_c2r.out: _paired_only("_fft_c2r", fft_c2r),
    }
)


#: Why no call is cheaper through DirectML's fallback (the registry's ``NO_CHOICE``).
NO_CHOICE = (
    'DirectML has no complex dtype, so its fallback of these operators fails ("Invalid or '
    'unsupported data type ComplexFloat", microsoft/DirectML#704): there is no fallback to choose.'
)

KERNELS = (
    Kernel("_fft_r2c", _r2c_kernel, "fallback"),
    Kernel("_fft_r2c.out", _r2c_out, "fallback"),
    Kernel("complex", _complex, "fallback"),
    Kernel("complex.out", _complex_out, "fallback"),
    Kernel("polar", _polar, "fallback"),
    Kernel("polar.out", _polar_out, "fallback"),
    Kernel("view_as_complex", _view_as_complex, "fallback"),
)
