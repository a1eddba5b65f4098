"""A complex tensor on DirectML, held as pairs of reals.

DirectML has no complex dtype: a DirectML tensor of ``complex64`` cannot exist (the process
stops with ``Invalid or unsupported data type ComplexFloat.``). :class:`PairedComplex` is what
dmlpatch hands a program instead: a tensor subclass that reads as complex (``dtype``,
``shape``, ``device``, ``is_complex()``, strides in complex elements) and holds its values in
one real DirectML tensor, ``pairs``, of shape ``[*shape, 2]`` (real part, imaginary part: the
layout of ``torch.view_as_real``). Every operation on it is answered by
:mod:`dmlpatch.opfix.complex.ops` with real operations on ``pairs``; ``torch.view_as_real``
returns ``pairs`` itself, so ``stft(..., return_complex=False)`` and the ``view_as_real``
idiom get a plain DirectML tensor back.

Only tensors that would otherwise be complex DirectML tensors are of this class: a program
without complex numbers never meets it, and its operations never pass through Python here.
Autograd works through it: PyTorch's autograd sits above this class, and the backward
formulas of the operations it uses are operations on it too.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch

#: The real dtype holding each complex dtype's parts.
PART_DTYPES: dict[torch.dtype, torch.dtype] = {
    torch.complex64: torch.float32,
    torch.complex128: torch.float64,
    torch.complex32: torch.float16,
}
#: The complex dtype whose parts have each real dtype.
COMPLEX_OF: dict[torch.dtype, torch.dtype] = {v: k for k, v in PART_DTYPES.items()}

#: Set by :mod:`dmlpatch.opfix.complex.ops`: answers one aten call on paired tensors.
dispatcher: Optional[Callable[[Any, tuple[Any, ...], dict[str, Any]], Any]] = None


class PairedComplex(torch.Tensor):
    """A complex tensor on a DirectML device whose values live in ``pairs`` (``[..., 2]``)."""

    pairs: torch.Tensor
    __slots__ = ("pairs",)

    # Subclass operations skip __torch_function__: only __torch_dispatch__ sees them.
    __torch_function__ = torch._C._disabled_torch_function_impl

    @staticmethod
    def __new__(cls, pairs: torch.Tensor, dtype: torch.dtype) -> PairedComplex:
        strides = [s // 2 for s in pairs.stride()[:-1]]
        made = torch.Tensor._make_wrapper_subclass(
            cls,
            pairs.shape[:-1],
            strides=strides,
            storage_offset=pairs.storage_offset() // 2,
            dtype=dtype,
            device=pairs.device,
            requires_grad=False,
            # Sizes and strides are read from ``pairs`` when asked, so that in-place view
            # operations (``stft``'s ``transpose_``) need only change ``pairs``.
            dispatch_sizes_strides_policy="sizes",
        )
        made.pairs = pairs
        return made

    @classmethod
    def __torch_dispatch__(
        cls,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: Optional[dict[str, Any]] = None,
    ) -> Any:
        assert dispatcher is not None  # set when the ops module is imported
        return dispatcher(func, args, kwargs or {})

    def __repr__(self, *, tensor_contents: Any = None) -> str:
        text = repr(torch.view_as_complex(self.pairs.detach().cpu().contiguous()))
        extra = f", device='{self.device}'"
        if self.grad_fn is not None:
            extra += f", grad_fn=<{type(self.grad_fn).__name__}>"
        elif self.requires_grad:
            extra += ", requires_grad=True"
        return text[:-1] + extra + ")" if text.endswith(")") else text

    def __reduce_ex__(self, protocol: Any) -> Any:
        # Saved as the host tensor it holds: a DirectML tensor is saved with its values, and
        # torch.load(map_location=...) puts it back where the loader asks.
        return self.detach().cpu().__reduce_ex__(protocol)

    def __deepcopy__(self, memo: dict[int, Any]) -> PairedComplex:
        copied = wrap(self.pairs.detach().clone(), self.dtype)
        copied.requires_grad_(self.requires_grad)
        memo[id(self)] = copied
        return copied


def wrap(pairs: torch.Tensor, dtype: Optional[torch.dtype] = None) -> PairedComplex:
    """The complex tensor whose values are ``pairs`` (``[..., 2]``, last stride 1)."""
    if pairs.stride(-1) != 1 or any(s % 2 for s in pairs.stride()[:-1]):
        pairs = pairs.contiguous()
    return PairedComplex(pairs, dtype or COMPLEX_OF[pairs.dtype])


def is_paired(value: Any) -> bool:
    return isinstance(value, PairedComplex)
