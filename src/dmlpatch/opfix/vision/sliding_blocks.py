"""``F.unfold``/``F.fold`` (``aten::im2col``/``aten::col2im``, ``nn.Unfold``/``nn.Fold``) on the
device.

torch-directml 0.2.5 has neither: every call copies through the CPU, and a model's backward
pays again (each is the other's gradient). Vocos' ISTFT head overlaps its frames with ``fold``;
patch embeddings and sliding-window attention ``unfold``. Both are composed here of strided
slices of the padded image, one per kernel offset or one per block, whichever is fewer:

- ``im2col``: the block values for kernel offset ``(i, j)`` are the padded image sliced from
  ``(i * dilation, j * dilation)`` with the stride's step; stacked, they are the columns;
- ``col2im``: the same slices of a zero image, each added to in turn (overlapping blocks sum).

Registered below autograd: PyTorch's derivatives call ``col2im`` for ``im2col``'s gradient and
the other way round, so the backward runs here too. Shapes are checked by PyTorch's own shape
functions, so a bad call fails with PyTorch's text.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dmlpatch.opfix._accounting import record
from dmlpatch.opfix._kernel import Kernel


def _blocks(size: int, kernel: int, dilation: int, padding: int, stride: int) -> int:
    return (size + 2 * padding - (dilation * (kernel - 1) + 1)) // stride + 1


def _checked(op: torch._ops.OpOverloadPacket, self: torch.Tensor, *args: Sequence[int]) -> None:
    """Raise what the CPU raises for a bad call (the meta kernel sees the shapes first)."""
    try:
        op(torch.empty(self.shape, dtype=self.dtype, device="meta"), *args)
    except RuntimeError:
        op(torch.empty(self.shape, dtype=self.dtype), *args)  # the CPU's own words
        raise


def im2col(
    self: torch.Tensor,
    kernel_size: Sequence[int],
    dilation: Sequence[int],
    padding: Sequence[int],
    stride: Sequence[int],
) -> torch.Tensor:
    _checked(torch.ops.aten.im2col, self, kernel_size, dilation, padding, stride)
    record("fixed", "aten::im2col")
    image = self if self.dim() == 4 else self.unsqueeze(0)
    batch, channels, height, width = image.shape
    (kh, kw), (dh, dw), (ph, pw), (sh, sw) = kernel_size, dilation, padding, stride
    rows, columns = _blocks(height, kh, dh, ph, sh), _blocks(width, kw, dw, pw, sw)
    padded = torch.constant_pad_nd(image, [pw, pw, ph, ph])
    if kh * kw <= rows * columns:
        # [N, C, kh * kw, rows, columns]: one strided slice per kernel offset.
        pieces = [
            padded[
                :,
                :,
                i * dh : i * dh + sh * (rows - 1) + 1 : sh,
                j * dw : j * dw + sw * (columns - 1) + 1 : sw,
            ]
            for i in range(kh)
            for j in range(kw)
        ]
        cols = torch.stack(pieces, 2)
    else:
        # [N, C, kh, kw, rows * columns]: one dilated window per block.
        windows = [
            padded[
                :,
                :,
                r * sh : r * sh + dh * (kh - 1) + 1 : dh,
                c * sw : c * sw + dw * (kw - 1) + 1 : dw,
            ]
            for r in range(rows)
            for c in range(columns)
        ]
        cols = torch.stack(windows, -1)
    out = cols.reshape(batch, channels * kh * kw, rows * columns)
    return out if self.dim() == 4 else out.squeeze(0)


def col2im(
    self: torch.Tensor,
    output_size: Sequence[int],
    kernel_size: Sequence[int],
    dilation: Sequence[int],
    padding: Sequence[int],
    stride: Sequence[int],
) -> torch.Tensor:
    _checked(torch.ops.aten.col2im, self, output_size, kernel_size, dilation, padding, stride)
    record("fixed", "aten::col2im")
    cols = self if self.dim() == 3 else self.unsqueeze(0)
    (height, width), (kh, kw) = output_size, kernel_size
    (dh, dw), (ph, pw), (sh, sw) = dilation, padding, stride
    rows, columns = _blocks(height, kh, dh, ph, sh), _blocks(width, kw, dw, pw, sw)
    batch, channels = cols.shape[0], cols.shape[1] // (kh * kw)
    blocks = cols.reshape(batch, channels, kh, kw, rows, columns)
    image = cols.new_zeros((batch, channels, height + 2 * ph, width + 2 * pw))
    if kh * kw <= rows * columns:
        for i in range(kh):
            for j in range(kw):
                image[
                    :,
                    :,
                    i * dh : i * dh + sh * (rows - 1) + 1 : sh,
                    j * dw : j * dw + sw * (columns - 1) + 1 : sw,
                ].add_(blocks[:, :, i, j])
    else:
        for r in range(rows):
            for c in range(columns):
                image[
                    :,
                    :,
                    r * sh : r * sh + dh * (kh - 1) + 1 : dh,
                    c * sw : c * sw + dw * (kw - 1) + 1 : dw,
                ].add_(blocks[:, :, :, :, r, c])
    out = image[:, :, ph : ph + height, pw : pw + width].contiguous()
    return out if self.dim() == 3 else out.squeeze(0)


KERNELS = (
    Kernel("im2col", im2col, "fallback"),
    Kernel("col2im", col2im, "fallback"),
)
