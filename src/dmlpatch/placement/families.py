"""The heavy operator families whose placement is counted, and their cost in FLOPs.

Model compute is what convolutions, matrix products, attention, normalisation and recurrent
layers do: everything else a model runs (activations, pooling, reshapes) is small beside them,
and CPU work outside these families (decoding images, building batches) is not model compute.
Costs are estimates from shapes (a multiply-add is two FLOPs; normalisation about five per
element), meant to rank where the work ran, not to time it.

Two views of the same families:

* **layers** (:func:`layer_family`, :func:`layer_flops`): ``nn.Module`` types, for the cheap
  accounting the runner keeps by default (one dictionary lookup per module call);
* **operators** (:func:`operator_family`, :func:`operator_flops`): ATen overloads below
  autograd, for ``dmlpatch check``'s exhaustive count (functional calls and backward included).
"""

from __future__ import annotations

import math
from typing import Any, Optional, cast

import torch
from torch import nn

from dmlpatch.placement import ledger

CONVOLUTION = "convolution"
MATMUL = "matmul"
ATTENTION = "attention"
NORMALIZATION = "normalization"
RECURRENT = "recurrent"
#: An operator of no family above, counted only where DirectML's CPU fallback ran it (its
#: work: one operation per element it reads and writes, :func:`elements`).
OTHER = ledger.OTHER

# Per element: subtract the mean, divide by the deviation, scale, shift, plus the statistics.
_NORM_FLOPS_PER_ELEMENT = 5

_LAYER_BASES: tuple[tuple[type, str], ...] = (
    (nn.modules.conv._ConvNd, CONVOLUTION),
    (nn.Linear, MATMUL),
    (nn.Bilinear, MATMUL),
    (nn.MultiheadAttention, ATTENTION),
    (nn.RNNBase, RECURRENT),
    (nn.modules.batchnorm._NormBase, NORMALIZATION),
    (nn.LayerNorm, NORMALIZATION),
    (nn.GroupNorm, NORMALIZATION),
    (nn.LocalResponseNorm, NORMALIZATION),
    *(((nn.RMSNorm, NORMALIZATION),) if hasattr(nn, "RMSNorm") else ()),
)

_layer_families: dict[type, Optional[str]] = {}


def layer_family(kind: type) -> Optional[str]:
    """The family of an ``nn.Module`` type (subclasses included), or None; cached per type."""
    if kind in _layer_families:
        return _layer_families[kind]
    family = next((name for base, name in _LAYER_BASES if issubclass(kind, base)), None)
    _layer_families[kind] = family
    return family


def known_layer_families() -> dict[type, Optional[str]]:
    """The cache :func:`layer_family` fills, for a hook that reads it without a call."""
    return _layer_families


def _first_tensor(value: Any) -> Optional[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (tuple, list)):
        for item in value:
            found = _first_tensor(item)
            if found is not None:
                return found
    return None


def layer_output(output: Any) -> Optional[torch.Tensor]:
    """The tensor a layer's call produced (RNNs and attention return tuples)."""
    return _first_tensor(output)


def _parameter_count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters(recurse=False))


def layer_flops(family: str, module: nn.Module, inputs: tuple[Any, ...], out: torch.Tensor) -> int:
    """Forward FLOPs of one layer call, from its weights and the shapes it saw."""
    if family == CONVOLUTION:
        weight = cast(torch.Tensor, module.weight)
        if getattr(module, "transposed", False):
            first = _first_tensor(inputs)
            spread = first.numel() if first is not None else 0
            return 2 * spread * weight.numel() // max(1, weight.shape[0])
        return 2 * out.numel() * weight.numel() // max(1, weight.shape[0])
    if family == MATMUL:
        first = _first_tensor(inputs)
        if first is None or first.dim() == 0:
            return 0
        # Every input row meets every weight once.
        return 2 * (first.numel() // first.shape[-1]) * _parameter_count(module)
    if family == NORMALIZATION:
        return _NORM_FLOPS_PER_ELEMENT * out.numel()
    if family == RECURRENT:
        first = _first_tensor(inputs)
        size = getattr(module, "input_size", 0) or 1
        steps = first.numel() // size if first is not None else 0
        return 2 * steps * _parameter_count(module)
    if family == ATTENTION:
        first = _first_tensor(inputs)
        if first is None or first.dim() < 2:
            return 0
        embed = first.shape[-1]
        tokens = first.numel() // embed
        length = first.shape[1] if getattr(module, "batch_first", False) else first.shape[0]
        # Projections, then scores and their weighted sum over every key.
        return 2 * tokens * _parameter_count(module) + 4 * tokens * length * embed
    return 0


# ---- operators ----

_OPERATORS = {
    "mm": MATMUL,
    "addmm": MATMUL,
    "_addmm_activation": MATMUL,
    "bmm": MATMUL,
    "baddbmm": MATMUL,
    "addbmm": MATMUL,
    "mv": MATMUL,
    "addmv": MATMUL,
    "dot": MATMUL,
    "vdot": MATMUL,
    "convolution": CONVOLUTION,
    "convolution_backward": CONVOLUTION,
    # The backend's own (DMLPATCH_CPU_OPS may send them to the CPU).
    "convolution_overrideable": CONVOLUTION,
    "convolution_backward_overrideable": CONVOLUTION,
    "_convolution": CONVOLUTION,
    "native_batch_norm": NORMALIZATION,
    "_native_batch_norm_legit": NORMALIZATION,
    "_native_batch_norm_legit_no_training": NORMALIZATION,
    "native_batch_norm_backward": NORMALIZATION,
    "native_layer_norm": NORMALIZATION,
    "native_layer_norm_backward": NORMALIZATION,
    "native_group_norm": NORMALIZATION,
    "native_group_norm_backward": NORMALIZATION,
    "_fused_rms_norm": NORMALIZATION,
    "_fused_rms_norm_backward": NORMALIZATION,
    "_thnn_fused_lstm_cell": RECURRENT,
    "_thnn_fused_gru_cell": RECURRENT,
    "lstm": RECURRENT,
    "gru": RECURRENT,
    "rnn_tanh": RECURRENT,
    "rnn_relu": RECURRENT,
    "_transformer_encoder_layer_fwd": ATTENTION,
}

#: Whole attention blocks in one operator (nn.MultiheadAttention's and
#: nn.TransformerEncoderLayer's inference fast paths): their projections are inside.
_FUSED_BLOCKS = frozenset({"_native_multi_head_attention", "_transformer_encoder_layer_fwd"})


_WITH_BIAS_FIRST = frozenset({"addmm", "_addmm_activation", "baddbmm", "addbmm", "addmv"})


def operator_family(name: str) -> Optional[str]:
    """The family of an ATen operator (its name without the overload), or None."""
    family = _OPERATORS.get(name)
    if family is None and "attention" in name:
        return ATTENTION  # scaled_dot_product kernels of every backend, forward and backward
    return family


def _shape(value: Any) -> tuple[int, ...]:
    return tuple(value.shape) if isinstance(value, torch.Tensor) else ()


def _numel(value: Any) -> int:
    return value.numel() if isinstance(value, torch.Tensor) else 0


def operator_flops(name: str, args: tuple[Any, ...], result: Any) -> int:
    """FLOPs of one ATen call from its arguments' and result's shapes (0 when unknown)."""
    family = operator_family(name)
    out = _first_tensor(result)
    if family == MATMUL:
        if name in ("dot", "vdot"):
            return 2 * _numel(args[0])
        left = args[1] if name in _WITH_BIAS_FIRST else args[0]
        inner = _shape(left)[-1] if _shape(left) else 0
        return 2 * inner * (out.numel() if out is not None else 0)
    if family == CONVOLUTION:
        if name in ("convolution_backward", "convolution_backward_overrideable"):
            grad_output, weight = args[0], args[2]
            per_output = _numel(weight) // max(1, _shape(weight)[0] if _shape(weight) else 1)
            return 2 * 2 * _numel(grad_output) * per_output  # grad of input and of weight
        weight = args[1]
        per_output = _numel(weight) // max(1, _shape(weight)[0] if _shape(weight) else 1)
        transposed = len(args) > 6 and bool(args[6])
        spread = _numel(args[0]) if transposed else (out.numel() if out is not None else 0)
        return 2 * spread * per_output
    if family == NORMALIZATION:
        return _NORM_FLOPS_PER_ELEMENT * _numel(args[0] if args else None)
    if name in _FUSED_BLOCKS:
        return _fused_block_flops(args)
    if family == ATTENTION:
        query, key = (args[0], args[1]) if len(args) > 1 else (None, None)
        q, k = _shape(query), _shape(key)
        if len(q) < 2 or len(k) < 2:
            return 0
        return 4 * math.prod(q[:-1]) * k[-2] * q[-1]
    if family == RECURRENT:
        return 2 * sum(_numel(a) for a in args if isinstance(a, torch.Tensor))
    return 0


def elements(args: Any, result: Any) -> int:
    """Elements of every tensor among ``args`` and ``result``: the estimate of work for an
    operator without a FLOP formula (a fallback's nms or padding backward)."""
    from torch.utils._pytree import tree_flatten

    flat, _ = tree_flatten((args, result))
    return sum(value.numel() for value in flat if isinstance(value, torch.Tensor))


def _fused_block_flops(args: tuple[Any, ...]) -> int:
    """Every token meets every weight matrix of the block once, then the scores and their
    weighted sum over every key (the query is batch-first: the fast paths' layout)."""
    query = args[0] if args else None
    q = _shape(query)
    if len(q) < 2:
        return 0
    tokens = math.prod(q[:-1])
    key = args[1] if len(args) > 1 and len(_shape(args[1])) >= 2 else query
    weights = sum(
        a.numel()
        for a in args[3:]
        if isinstance(a, torch.Tensor) and a.dim() == 2 and a.is_floating_point()
    )
    return 2 * tokens * weights + 4 * tokens * _shape(key)[-2] * q[-1]
