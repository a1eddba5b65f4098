"""``eye``, which torch-directml 0.2.5 runs on the CPU (microsoft/DirectML#431), on the device:
zeros with ones written along the diagonal view."""

from __future__ import annotations

import torch

from dmlpatch.opfix._accounting import record
from dmlpatch.opfix._kernel import Kernel


def _eye_m_out(n: int, m: int, *, out: torch.Tensor) -> torch.Tensor:
    record("fixed", "aten::eye.m_out")
    if n < 0:
        raise RuntimeError(f"n must be greater or equal to 0, got {n}")
    if m < 0:
        raise RuntimeError(f"m must be greater or equal to 0, got {m}")
    out.resize_(n, m)
    out.zero_()
    out.diagonal().fill_(1)
    return out


def _eye_out(n: int, *, out: torch.Tensor) -> torch.Tensor:
    return _eye_m_out(n, n, out=out)


#: Why no call is cheaper through DirectML's fallback (the registry's ``NO_CHOICE``).
NO_CHOICE = (
    "DirectML's fallback of eye loses the out= tensor's resize and returns an empty tensor "
    "(microsoft/DirectML#431), and the composition is two kernels with no read-back."
)

KERNELS = (
    Kernel("eye.m_out", _eye_m_out, "fallback"),
    Kernel("eye.out", _eye_out, "fallback"),
)
