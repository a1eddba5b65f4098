"""What becomes of the dtypes DirectML cannot hold: bfloat16, float64 and the complex dtypes.

DirectML has no bfloat16 and no complex type: a DirectML tensor of either stops the process
(``Invalid or unsupported data type BFloat16.``, microsoft/DirectML#688; ``ComplexFloat.``,
#704, #421). Many adapters, most Intel iGPUs among them, have no float64 either
(``torch_directml.has_float64_support()`` is False, and such a tensor raises ``The GPU device
does not support Double (Float64) operations!``, #438). torch-directml is frozen, so these are
permanent; dmlpatch decides instead what such a tensor becomes on the device:

- **bfloat16 runs as float32** by default. Every bfloat16 value is a float32 value, so a
  bfloat16 checkpoint loads exactly and computes at float32's precision (as on a CPU that
  upcasts). ``DMLPATCH_BF16=float16`` (``--bf16 float16``) chooses float16 instead: half the
  memory, with float16's range (values beyond 65504 become infinite). Said once per run.
- **float64 runs as float32** on an adapter without float64, said once: numpy-born data works,
  at float32's precision. Integer-valued data beyond 2**24 loses its low bits (the catalogue's
  ``float64`` entry).
- **complex tensors are held as pairs of reals** (:mod:`dmlpatch.opfix.complex`), float32
  pairs for complex64, float64 pairs for complex128 where the adapter has float64.

A tensor reads as what it holds: ``.dtype`` of a bfloat16 checkpoint's weights on DirectML is
``torch.float32`` (no tensor of another dtype can be made to compute as float32), and code that
branches on it takes its float32 branch, as it would for a float32 checkpoint. Complex tensors
read as complex.

The choice is applied where a tensor of such a dtype would come to exist on the device (see
:mod:`dmlpatch.opfix.tensors.allocation`): nothing here runs for other dtypes.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Optional

from dmlpatch import log
from dmlpatch.environment_variables import DMLPATCH_BF16
from dmlpatch.gaps.bf16_setting import parse_bf16

if TYPE_CHECKING:
    import torch

#: c10's names of the dtypes (as profiles list them) and torch's.
C10_NAMES = {
    "BFloat16": "bfloat16",
    "ComplexHalf": "complex32",
    "ComplexFloat": "complex64",
    "ComplexDouble": "complex128",
    "Double": "float64",
}


class Policy:
    """The dtype policy of one process (set once the device's gaps are known)."""

    def __init__(
        self,
        unsupported: frozenset[torch.dtype],
        float64_everywhere: Optional[bool],
        bfloat16: torch.dtype,
    ) -> None:
        import torch

        self.unsupported = unsupported
        #: Whether every adapter has float64; None: ask each adapter (real DirectML).
        self.float64_everywhere = float64_everywhere
        self.bfloat16 = bfloat16
        self._float64: dict[int, bool] = {}
        self._bf16, self._f64, self._f32 = torch.bfloat16, torch.float64, torch.float32
        #: Each complex dtype's parts.
        self.parts = {
            torch.complex32: torch.float16,
            torch.complex64: torch.float32,
            torch.complex128: torch.float64,
        }

    def stored(self, dtype: torch.dtype, index: Optional[int]) -> torch.dtype:
        """The dtype a tensor asked for as ``dtype`` has on adapter ``index`` (complex dtypes:
        the dtype of its parts)."""
        if dtype in self.parts:
            return self.stored(self.parts[dtype], index)
        if dtype is self._bf16 and dtype in self.unsupported:
            self._said_bfloat16()
            return self.bfloat16
        if dtype is self._f64 and not self.has_float64(index or 0):
            log.say_once(
                "dtype-float64",
                f"float64 runs as float32 on privateuseone:{index or 0}: the adapter has no "
                "float64 (torch_directml.has_float64_support() is False)",
            )
            return self._f32
        return dtype

    def paired(self, dtype: torch.dtype) -> bool:
        """Whether tensors of ``dtype`` are held as pairs of reals."""
        return dtype in self.parts and dtype in self.unsupported

    def has_float64(self, index: int) -> bool:
        if self.float64_everywhere is not None:
            return self.float64_everywhere
        known = self._float64.get(index)
        if known is None:
            known = self._float64[index] = _ask_float64(index)
        return known

    def _said_bfloat16(self) -> None:
        if self.bfloat16 is self._f32:
            log.say_once(
                "dtype-bfloat16",
                "bfloat16 runs as float32 on DirectML, which has no bfloat16 (exact: every "
                f"bfloat16 value is a float32 one); {DMLPATCH_BF16}=float16 halves the memory",
            )
        else:
            log.say_once(
                "dtype-bfloat16",
                f"bfloat16 runs as float16 on DirectML, which has no bfloat16 ({DMLPATCH_BF16}="
                "float16: half the memory of float32, float16's range)",
            )


def _ask_float64(index: int) -> bool:
    import torch

    module = getattr(torch, "privateuseone", None)
    ask = getattr(module, "has_float64_support", None)
    return bool(ask(index)) if ask is not None else True


_current: Optional[Policy] = None


def configure(unsupported_names: frozenset[str], float64_everywhere: Optional[bool]) -> Policy:
    """Set the process's policy: the c10 names of the dtypes the device lacks, and whether
    every adapter has float64 (None: ask each adapter when it matters)."""
    global _current
    import torch

    unsupported = frozenset(
        getattr(torch, C10_NAMES[n]) for n in unsupported_names if n in C10_NAMES
    )
    bfloat16 = getattr(torch, parse_bf16(os.environ.get(DMLPATCH_BF16)))
    _current = Policy(unsupported, float64_everywhere, bfloat16)
    return _current


def reset() -> None:
    """No policy: the device's fixes are not installed."""
    global _current
    _current = None


def current() -> Optional[Policy]:
    """The process's policy, once the device's fixes are installed."""
    return _current
