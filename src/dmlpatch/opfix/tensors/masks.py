"""``isneginf``/``isposinf``, which torch-directml 0.2.5 runs on the CPU, composed on the device.

Every transformers model builds its attention mask with them (``torch.finfo(dtype).min`` fills
and SDPA's mask conversion), so without a fix each forward pass copies the mask to the host and
back. ``x == -inf`` is what the CPU kernel computes; integer and boolean tensors have no
infinities, so the answer is all False, as on the CPU.
"""

from __future__ import annotations

import torch

from dmlpatch.opfix import sentinels
from dmlpatch.opfix._accounting import record
from dmlpatch.opfix._kernel import Kernel, into


def _compared(self: torch.Tensor, value: float) -> torch.Tensor:
    if self.is_floating_point():
        return torch.eq(self, value)
    if self.is_complex():
        raise RuntimeError(
            "isposinf does not support complex inputs."
            if value > 0
            else "isneginf does not support complex inputs."
        )
    return torch.zeros(self.shape, dtype=torch.bool, device=self.device)


def _isneginf_out(self: torch.Tensor, *, out: torch.Tensor) -> torch.Tensor:
    record("fixed", "aten::isneginf.out")
    return into(out, _compared(self, float("-inf")))


def _isposinf_out(self: torch.Tensor, *, out: torch.Tensor) -> torch.Tensor:
    record("fixed", "aten::isposinf.out")
    return into(out, _compared(self, float("inf")))


# The functional forms return the comparison itself: no output tensor to allocate, resize and
# copy into (each a call through the dispatcher, and the allocation one through dmlpatch's).
# They run in Python anyway, so the comparison watchers retire here once a bool tensor exists
# (transformers' masks: the first bool tensor is often this very comparison's).
def _isneginf(self: torch.Tensor) -> torch.Tensor:
    sentinels.stand_aside()
    record("fixed", "aten::isneginf.out")
    return _compared(self, float("-inf"))


def _isposinf(self: torch.Tensor) -> torch.Tensor:
    sentinels.stand_aside()
    record("fixed", "aten::isposinf.out")
    return _compared(self, float("inf"))


#: Why no call is cheaper through DirectML's fallback (the registry's ``NO_CHOICE``).
NO_CHOICE = (
    "One comparison kernel reading the tensor once, against the fallback's read-back and its "
    "copies of the tensor down and the mask up."
)

KERNELS = (
    Kernel("isneginf.out", _isneginf_out, "fallback"),
    Kernel("isneginf", _isneginf, "fallback"),
    Kernel("isposinf.out", _isposinf_out, "fallback"),
    Kernel("isposinf", _isposinf, "fallback"),
)
