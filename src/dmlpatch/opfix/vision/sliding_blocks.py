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

``im2col`` is two kernels (the padding, the stack of slices), always cheaper than the
fallback's read-back and copies. ``col2im`` adds its slices one kernel each, so a fold of many
blocks with a large kernel (a ViT's patches folded back: 196 adds) costs more than the
fallback's one read-back; the cost model decides per call (:func:`col2im_cost`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dmlpatch.costs.choice import Chooser, CostFunction, Costs, OnDevice
from dmlpatch.opfix._accounting import record
from dmlpatch.opfix._kernel import Kernel
from dmlpatch.opfix.cost_terms import fallback, nbytes, resetting, shapes
from dmlpatch.opfix.on_the_cpu import through_the_cpu


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


def col2im_cost(
    self: torch.Tensor,
    output_size: Sequence[int],
    kernel_size: Sequence[int],
    dilation: Sequence[int],
    padding: Sequence[int],
    stride: Sequence[int],
) -> Costs:
    """The composition: a zero image (1 kernel), one ``add_`` per kernel offset or per block,
    whichever is fewer, each reading and writing its slice (all of them: the columns three
    times over), and the crop of the padding (1, where there is padding). The fallback: the
    columns copied down, the image up, an add per column element on the host."""
    cols = self if self.dim() == 3 else self.unsqueeze(0)
    (height, width), (kh, kw) = output_size, kernel_size
    (dh, dw), (ph, pw), (sh, sw) = dilation, padding, stride
    rows, columns = _blocks(height, kh, dh, ph, sh), _blocks(width, kw, dw, pw, sw)
    batch, channels = cols.shape[0], cols.shape[1] // (kh * kw)
    slices = min(kh * kw, rows * columns)
    padded = batch * channels * (height + 2 * ph) * (width + 2 * pw) * self.element_size()
    image = batch * channels * height * width * self.element_size()
    launches = 1 + slices + (1 if ph or pw else 0)
    device = OnDevice(launches, 0, 3 * nbytes(self) + 2 * padded, float(self.numel()))
    return Costs(device, fallback(self, up=image, host_flops=float(self.numel())))


_COL2IM = Chooser("aten::col2im")
reset = resetting(_COL2IM)
COSTS: dict[str, CostFunction] = {"aten::col2im": col2im_cost}


def col2im(
    self: torch.Tensor,
    output_size: Sequence[int],
    kernel_size: Sequence[int],
    dilation: Sequence[int],
    padding: Sequence[int],
    stride: Sequence[int],
) -> torch.Tensor:
    _checked(torch.ops.aten.col2im, self, output_size, kernel_size, dilation, padding, stride)
    arguments = (self, output_size, kernel_size, dilation, padding, stride)
    key = (*shapes(self), *(tuple(sizes) for sizes in arguments[1:]))
    if not _COL2IM.on_device(key, lambda: col2im_cost(*arguments)):
        return through_the_cpu("aten::col2im", torch.ops.aten.col2im, arguments)
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
