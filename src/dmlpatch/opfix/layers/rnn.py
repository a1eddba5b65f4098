"""The fused LSTM/GRU cells DirectML lacks, composed on the device.

On a PrivateUse1 device PyTorch runs every step of ``nn.LSTM``/``nn.GRU`` (and ``LSTMCell``/
``GRUCell``) through ``_thnn_fused_lstm_cell`` / ``_thnn_fused_gru_cell``, which have CUDA kernels
only. torch-directml has neither and its CPU fallback finds no CPU kernel, so every recurrent
model dies with ``NotImplementedError: Could not run 'aten::_thnn_fused_lstm_cell' with
arguments from the 'CPU' backend`` (microsoft/DirectML#613, #654, #677).

The cells here are the CPU cell's arithmetic on the device, registered at
``AutogradPrivateUse1``: autograd differentiates through the composition, so the backward
(``_thnn_fused_lstm_cell_backward``, equally missing) is never needed. Gates are summed in the
CPU cell's order, ``(h·Whh + bhh) + (x·Wih + bih)``, so results match it.
"""

from __future__ import annotations

from typing import Optional

import torch

from dmlpatch.opfix._accounting import record
from dmlpatch.opfix._kernel import Kernel


def _with_bias(gates: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    return gates if bias is None else gates + bias


def lstm_cell(
    input_gates: torch.Tensor,
    hidden_gates: torch.Tensor,
    cx: torch.Tensor,
    input_bias: Optional[torch.Tensor] = None,
    hidden_bias: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``_thnn_fused_lstm_cell``: ``(hy, cy, workspace)``; the workspace is only read by the
    fused backward, which autograd does not call here."""
    gates = _with_bias(hidden_gates, hidden_bias) + _with_bias(input_gates, input_bias)
    i, f, g, o = gates.chunk(4, 1)
    cy = torch.sigmoid(f) * cx + torch.sigmoid(i) * torch.tanh(g)
    hy = torch.sigmoid(o) * torch.tanh(cy)
    return hy, cy, gates.detach()


def gru_cell(
    input_gates: torch.Tensor,
    hidden_gates: torch.Tensor,
    hx: torch.Tensor,
    input_bias: Optional[torch.Tensor] = None,
    hidden_bias: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``_thnn_fused_gru_cell``: ``(hy, workspace)``."""
    ir, ii, in_ = _with_bias(input_gates, input_bias).chunk(3, 1)
    hr, hi, hn = _with_bias(hidden_gates, hidden_bias).chunk(3, 1)
    reset = torch.sigmoid(ir + hr)
    update = torch.sigmoid(ii + hi)
    new = torch.tanh(in_ + reset * hn)
    hy = new + update * (hx - new)
    return hy, torch.cat([input_gates, hidden_gates], 1).detach()


def _counted_lstm_cell(
    input_gates: torch.Tensor,
    hidden_gates: torch.Tensor,
    cx: torch.Tensor,
    input_bias: Optional[torch.Tensor] = None,
    hidden_bias: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    record("fixed", "aten::_thnn_fused_lstm_cell")
    return lstm_cell(input_gates, hidden_gates, cx, input_bias, hidden_bias)


def _counted_gru_cell(
    input_gates: torch.Tensor,
    hidden_gates: torch.Tensor,
    hx: torch.Tensor,
    input_bias: Optional[torch.Tensor] = None,
    hidden_bias: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    record("fixed", "aten::_thnn_fused_gru_cell")
    return gru_cell(input_gates, hidden_gates, hx, input_bias, hidden_bias)


#: Why no call is cheaper through DirectML's fallback (the registry's ``NO_CHOICE``).
NO_CHOICE = (
    "DirectML's fallback finds no CPU kernel for the fused cells (NotImplementedError): there "
    "is no fallback to choose."
)

KERNELS = (
    Kernel("_thnn_fused_lstm_cell", _counted_lstm_cell, "missing", "AutogradPrivateUse1"),
    Kernel("_thnn_fused_gru_cell", _counted_gru_cell, "missing", "AutogradPrivateUse1"),
)
