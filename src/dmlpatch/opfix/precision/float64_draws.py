"""Seeded float64 draws on an adapter without float64: the CPU's numbers.

On such an adapter a float64 tensor is held as float32 (:mod:`dmlpatch.opfix.dtype_policy`),
so ``torch.randn(n, dtype=torch.float64, device="cuda")`` allocated a float32 tensor and
filled it from the float32 stream: the CPU's float64 kernel turns the generator's bits into
numbers another way, so a seeded program got other data than on the CPU (a solve on it: 0.98
apart). DirectML draws from the CPU's generator, so the float64 factories are served here by
drawing in float64 on the host from that generator and copying to the device, where the
values become float32 as every float64 tensor there does: the CPU's numbers, rounded.

Only ``randn``, ``rand`` and ``normal(mean, std, size)`` asked for float64 on such an adapter
take this road; every other call is the factory PyTorch composes (an empty tensor, filled on
the device). What still differs: an in-place fill of a tensor that already exists
(``x.normal_()`` of a "float64" tensor, which is float32 by then) and ``randn_like``/``rand_like``
of one, which read float32 and draw from the float32 stream.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Callable, Optional

import torch

from dmlpatch.opfix import dtype_policy
from dmlpatch.opfix._accounting import record
from dmlpatch.opfix._kernel import Kernel

_FLOAT64 = torch.float64


def _on_host(device: Optional[torch.device], dtype: Optional[torch.dtype], generator: Any) -> bool:
    """Whether this draw must be made on the host to match the CPU."""
    if dtype is None:
        dtype = torch.get_default_dtype()
    if dtype is not _FLOAT64 or device is None or device.type != "privateuseone":
        return False
    if generator is not None and generator.device.type != "cpu":
        return False
    policy = dtype_policy.current()
    return policy is not None and not policy.has_float64(device.index or 0)


def _factory(draw: Callable[..., torch.Tensor], name: str) -> Callable[..., torch.Tensor]:
    """A factory kernel: drawn on the host where :func:`_on_host` says so, else as PyTorch
    composes it (an empty tensor of the asked dtype, filled on the device)."""

    def kernel(
        size: Sequence[int],
        *,
        generator: Optional[torch.Generator] = None,
        dtype: Optional[torch.dtype] = None,
        layout: Optional[torch.layout] = None,
        device: Optional[torch.device] = None,
        pin_memory: Optional[bool] = None,
    ) -> torch.Tensor:
        if _on_host(device, dtype, generator):
            record("fixed", name)
            drawn = draw(torch.empty(list(size), dtype=_FLOAT64), generator)
            return drawn.to(device)
        made = torch.empty(list(size), dtype=dtype, layout=layout, device=device)
        return draw(made, generator)

    return kernel


def _standard_normal(tensor: torch.Tensor, generator: Any) -> torch.Tensor:
    return tensor.normal_(0.0, 1.0, generator=generator)


def _uniform(tensor: torch.Tensor, generator: Any) -> torch.Tensor:
    return tensor.uniform_(0.0, 1.0, generator=generator)


def _normal(mean: float, std: float, size: Sequence[int], **options: Any) -> torch.Tensor:
    def draw(tensor: torch.Tensor, generator: Any) -> torch.Tensor:
        return tensor.normal_(mean, std, generator=generator)

    return _factory(draw, "aten::normal.float_float")(size, **options)


#: Why no call is cheaper through DirectML's fallback (the registry's ``NO_CHOICE``).
NO_CHOICE = (
    "It keeps float32 draws from standing in for the CPU's float64 numbers (a wrong answer, not a "
    "fallback): drawing on the host and copying once is what any road to those numbers costs."
)

KERNELS = (
    Kernel("randn", _factory(_standard_normal, "aten::randn"), "dtype"),
    Kernel("randn.generator", _factory(_standard_normal, "aten::randn.generator"), "dtype"),
    Kernel("rand", _factory(_uniform, "aten::rand"), "dtype"),
    Kernel("rand.generator", _factory(_uniform, "aten::rand.generator"), "dtype"),
    Kernel("normal.float_float", _normal, "dtype"),
)
