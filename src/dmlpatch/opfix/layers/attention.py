"""PyTorch's attention fast path, which torch-directml 0.2.5 runs on the CPU, on the device.

``nn.MultiheadAttention`` in eval mode (batch-first self-attention without grad: open-clip, every
``nn.TransformerEncoder`` at inference, torchvision's ViT) does not compose its attention from
``linear``, ``bmm`` and ``softmax``, which DirectML runs: it calls the fused
``_native_multi_head_attention``, and ``nn.TransformerEncoderLayer`` calls the fused
``_transformer_encoder_layer_fwd``. DirectML registers neither, so each call copies the
activations and every projection weight to the host and the result back (an open-clip ViT-B-32
image: 12 calls, 72 copies, 117 MB). Both are composed here of the operators they stand for,
as PyTorch's CPU kernels (``attention.cpp``, ``transformer.cpp``) compute them:

- the input projection (one ``linear`` for self-attention, one per input otherwise), the query
  scaled by ``1/sqrt(head_dim)``, scores ``q @ k^T`` per head;
- the mask (:func:`masked_softmax`): ``mask_type`` 0 is an ``(L, S)`` attention mask, 1 a
  ``(B, S)`` key-padding mask, 2 (or any mask that is not 2-D) one shaped like the scores; a
  float mask counts as ``True`` (excluded) wherever it is not zero, as the CPU kernel converts
  it to bool; a row with every key excluded is NaN, as on the CPU;
- the weighted sum of values, the heads concatenated, the output projection; the weights
  returned only if asked (averaged over the heads if asked), ``None`` otherwise;
- the encoder layer: attention, residual, ``layer_norm``, the feed-forward network (``relu`` or
  exact ``gelu``), residual, ``layer_norm``, in the order ``norm_first`` says.

``_masked_softmax`` (and its backward) is the fast path's softmax, served for callers of its
own. Nested-tensor inputs (``nn.TransformerEncoder`` given a ``src_key_padding_mask``) take
another dispatch key and are not served (see the catalogue's ``nested-tensors``).
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F

from dmlpatch.opfix._accounting import record
from dmlpatch.opfix._kernel import Kernel


def _broadcast_mask(
    scores: torch.Tensor, mask: torch.Tensor, mask_type: Optional[int]
) -> torch.Tensor:
    """A bool mask (True: excluded) that broadcasts against ``scores`` as the CPU reads it."""
    if mask.dtype != torch.bool:
        mask = mask.to(torch.bool)
    if mask.dim() == 2 and scores.dim() == 4:
        if mask_type == 1:  # (B, S): one row of keys per batch element
            return mask.view(mask.shape[0], 1, 1, mask.shape[1])
        if mask_type == 0:  # (L, S): one matrix for every batch element and head
            return mask.view(1, 1, *mask.shape)
    return mask


def masked_softmax(
    scores: torch.Tensor, mask: torch.Tensor, dim: int = -1, mask_type: Optional[int] = None
) -> torch.Tensor:
    """Softmax over ``dim`` of the entries ``mask`` leaves in; excluded entries are 0, and a
    row with none left is NaN (the CPU kernel divides by a zero sum)."""
    excluded = _broadcast_mask(scores, mask, mask_type)
    return scores.masked_fill(excluded, float("-inf")).softmax(dim)


def _check_mask(scores: torch.Tensor, mask: torch.Tensor, mask_type: Optional[int]) -> None:
    """The CPU kernel's checks (``masked_softmax_cpu``), in its words."""
    if mask_type is None:
        raise RuntimeError("Mask Type should be defined")
    if mask.dtype != torch.bool:
        raise RuntimeError("Mask should be a boolean tensor")
    if mask.dim() != 2 or scores.dim() != 4:
        mask_type = 2  # types 0 and 1 are for 2-D masks of 4-D scores only
    if mask_type == 2 and mask.shape != scores.shape:
        raise RuntimeError("For mask_type == 2 mask shape should match input shape")
    if mask_type == 1 and (mask.shape[0], mask.shape[1]) != (scores.shape[0], scores.shape[2]):
        raise RuntimeError("For mask_type == 1 mask shape should be (B, L)")
    if mask_type == 0 and mask.shape != scores.shape[2:]:
        raise RuntimeError("For mask_type == 0 mask shape should be (L, L)")
    if mask_type not in (0, 1, 2):
        raise RuntimeError(
            "Mask Type should be 0 (src_mask) or 1 (src_key_padding_mask), or 2 (default_mask)"
        )


def _masked_softmax(
    self: torch.Tensor,
    mask: torch.Tensor,
    dim: Optional[int] = None,
    mask_type: Optional[int] = None,
) -> torch.Tensor:
    _check_mask(self, mask, mask_type)
    record("fixed", "aten::_masked_softmax")
    return masked_softmax(self, mask, self.dim() - 1 if dim is None else dim, mask_type)


def _masked_softmax_backward(
    grad_output: torch.Tensor, output: torch.Tensor, mask: torch.Tensor, dim: Optional[int] = None
) -> torch.Tensor:
    if mask.dtype != torch.bool:
        raise RuntimeError("Mask should be a boolean tensor")
    if mask.shape != grad_output.shape:
        raise RuntimeError("Mask shape should match grad shape")
    record("fixed", "aten::_masked_softmax_backward")
    dim = output.dim() - 1 if dim is None else dim
    product = (grad_output * output).masked_fill(mask, 0.0)
    grad = output * (grad_output - product.sum(dim, keepdim=True))
    return grad.masked_fill(mask, 0.0)


def _heads(x: torch.Tensor, num_head: int) -> torch.Tensor:
    """``(B, T, D)`` → ``(B, num_head, T, D / num_head)``."""
    batch, length, width = x.shape
    return x.view(batch, length, num_head, width // num_head).transpose(1, 2)


def attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    embed_dim: int,
    num_head: int,
    qkv_weight: torch.Tensor,
    qkv_bias: torch.Tensor,
    proj_weight: torch.Tensor,
    proj_bias: torch.Tensor,
    mask: Optional[torch.Tensor],
    need_weights: bool,
    average_attn_weights: bool,
    mask_type: Optional[int],
) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """``_native_multi_head_attention``'s arithmetic in operators DirectML runs."""
    if query.dim() != 3 or key.dim() != 3 or value.dim() != 3:
        raise RuntimeError(f"expected 3-D `query`, got {query.dim()}-D tensor")
    if embed_dim % num_head:
        raise RuntimeError("`embed_dim` must divide evenly by `num_heads`")
    if query is key and key is value:
        q, k, v = F.linear(query, qkv_weight, qkv_bias).chunk(3, -1)
    else:
        weights, biases = qkv_weight.chunk(3, 0), qkv_bias.chunk(3, 0)
        q, k, v = (F.linear(x, w, b) for x, w, b in zip((query, key, value), weights, biases))
    head_dim = embed_dim // num_head
    q = _heads(q, num_head) * (1.0 / math.sqrt(head_dim))
    scores = q @ _heads(k, num_head).transpose(-2, -1)
    weights = scores.softmax(-1) if mask is None else masked_softmax(scores, mask, -1, mask_type)
    context = (weights @ _heads(v, num_head)).transpose(1, 2)
    output = F.linear(
        context.reshape(query.shape[0], query.shape[1], embed_dim), proj_weight, proj_bias
    )
    if not need_weights:
        return output, None
    if average_attn_weights:
        weights = weights.sum(1) / num_head
    return output, weights


def _native_multi_head_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    embed_dim: int,
    num_head: int,
    qkv_weight: torch.Tensor,
    qkv_bias: torch.Tensor,
    proj_weight: torch.Tensor,
    proj_bias: torch.Tensor,
    mask: Optional[torch.Tensor] = None,
    need_weights: bool = True,
    average_attn_weights: bool = True,
    mask_type: Optional[int] = None,
) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    record("fixed", "aten::_native_multi_head_attention")
    return attention(
        query,
        key,
        value,
        embed_dim,
        num_head,
        qkv_weight,
        qkv_bias,
        proj_weight,
        proj_bias,
        mask,
        need_weights,
        average_attn_weights,
        mask_type,
    )


def _transformer_encoder_layer_fwd(
    src: torch.Tensor,
    embed_dim: int,
    num_heads: int,
    qkv_weight: torch.Tensor,
    qkv_bias: torch.Tensor,
    proj_weight: torch.Tensor,
    proj_bias: torch.Tensor,
    use_gelu: bool,
    norm_first: bool,
    eps: float,
    norm_weight_1: torch.Tensor,
    norm_bias_1: torch.Tensor,
    norm_weight_2: torch.Tensor,
    norm_bias_2: torch.Tensor,
    ffn_weight_1: torch.Tensor,
    ffn_bias_1: torch.Tensor,
    ffn_weight_2: torch.Tensor,
    ffn_bias_2: torch.Tensor,
    mask: Optional[torch.Tensor] = None,
    mask_type: Optional[int] = None,
) -> torch.Tensor:
    record("fixed", "aten::_transformer_encoder_layer_fwd")
    if src.numel() == 0:
        return src.clone()
    shape = (embed_dim,)
    x = F.layer_norm(src, shape, norm_weight_1, norm_bias_1, eps) if norm_first else src
    x = attention(
        x,
        x,
        x,
        embed_dim,
        num_heads,
        qkv_weight,
        qkv_bias,
        proj_weight,
        proj_bias,
        mask,
        False,
        True,
        mask_type,
    )[0]
    x = x + src
    if not norm_first:
        x = F.layer_norm(x, shape, norm_weight_1, norm_bias_1, eps)
    residual = x
    if norm_first:
        x = F.layer_norm(x, shape, norm_weight_2, norm_bias_2, eps)
    hidden = F.linear(x, ffn_weight_1, ffn_bias_1)
    hidden = F.gelu(hidden) if use_gelu else F.relu(hidden)
    x = F.linear(hidden, ffn_weight_2, ffn_bias_2) + residual
    if not norm_first:
        x = F.layer_norm(x, shape, norm_weight_2, norm_bias_2, eps)
    return x


class NestedTensorsUnsupported(RuntimeError):
    """A nested tensor was asked for on DirectML, which has no kernels for one."""


def _nested_tensor_from_mask(
    t: torch.Tensor, mask: torch.Tensor, mask_check: bool = True
) -> torch.Tensor:
    # DirectML's CPU fallback builds the nested tensor on the host and cannot hand it back
    # ("NestedTensorImpl doesn't support strides"), and no kernel would take it past here.
    # nn.TransformerEncoder catches this and runs its layers on the padded batch instead
    # (dmlpatch.patches.torch.transformer).
    raise NestedTensorsUnsupported(
        "aten::_nested_tensor_from_mask: DirectML has no nested tensors (known failure "
        "nested-tensor-encoder)"
    )


def _nested_tensor_from_mask_left_aligned(t: torch.Tensor, mask: torch.Tensor) -> bool:
    """Whether every row of ``mask`` is a run of True then only False (as the CPU's kernel
    answers it), without copying ``t`` to the host as DirectML's fallback does."""
    record("fixed", "aten::_nested_tensor_from_mask_left_aligned")
    if mask.dtype != torch.bool:
        raise RuntimeError("Expected mask to be of type bool")
    if mask.dim() != 2 or mask.numel() == 0:
        return True
    lengths = mask.sum(1, dtype=torch.int64)
    expected = torch.arange(mask.shape[1], device=mask.device)[None, :] < lengths[:, None]
    return not bool((mask != expected).any())


#: Why no call is cheaper through DirectML's fallback (the registry's ``NO_CHOICE``).
NO_CHOICE = (
    "Each fallback reads back and copies the activations and every projection weight (five "
    "read-backs or more) and runs the products on the host, where the composition is 3 to 17 "
    "kernels with no read-back running them on the device (a ViT-B encoder layer of 8 images, "
    "modelled on intel-igpu: 22 ms composed, 209 ms through the CPU); a nested tensor has no "
    "fallback that works."
)

KERNELS = (
    Kernel("_nested_tensor_from_mask", _nested_tensor_from_mask, "fallback"),
    Kernel(
        "_nested_tensor_from_mask_left_aligned", _nested_tensor_from_mask_left_aligned, "fallback"
    ),
    Kernel("_native_multi_head_attention", _native_multi_head_attention, "fallback"),
    Kernel("_transformer_encoder_layer_fwd", _transformer_encoder_layer_fwd, "fallback"),
    Kernel("_masked_softmax", _masked_softmax, "fallback"),
    Kernel("_masked_softmax_backward", _masked_softmax_backward, "fallback"),
)
