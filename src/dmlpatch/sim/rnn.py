"""LSTM/GRU cells for the permissive profile.

On a PrivateUse1 device PyTorch runs RNN cells through ``_thnn_fused_lstm_cell`` and
``_thnn_fused_gru_cell``, which have CUDA kernels only. torch-directml has neither, so on
DirectML (and in the simulator's DirectML profiles) ``nn.LSTM`` fails with NotImplementedError
from the CPU fallback (microsoft/DirectML#613). The permissive profile registers these
decompositions at AutogradPrivateUse1 instead; autograd differentiates through them.
"""

from __future__ import annotations

from typing import Optional

import torch

_LIBRARY: Optional[torch.library.Library] = None


def _with_bias(gates: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    return gates if bias is None else gates + bias


def lstm_cell(
    input_gates: torch.Tensor,
    hidden_gates: torch.Tensor,
    cx: torch.Tensor,
    input_bias: Optional[torch.Tensor] = None,
    hidden_bias: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # Summed in the CPU cell's order ((h·Whh + bhh) + (x·Wih + bih)) so results match it.
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
    ir, ii, in_ = _with_bias(input_gates, input_bias).chunk(3, 1)
    hr, hi, hn = _with_bias(hidden_gates, hidden_bias).chunk(3, 1)
    reset = torch.sigmoid(ir + hr)
    update = torch.sigmoid(ii + hi)
    new = torch.tanh(in_ + reset * hn)
    hy = new + update * (hx - new)
    return hy, torch.cat([input_gates, hidden_gates], 1).detach()


def install() -> None:
    """Register both cells at AutogradPrivateUse1 (once per process)."""
    global _LIBRARY
    if _LIBRARY is not None:
        return
    library = torch.library.Library("aten", "IMPL")
    library.impl("_thnn_fused_lstm_cell", lstm_cell, "AutogradPrivateUse1")
    library.impl("_thnn_fused_gru_cell", gru_cell, "AutogradPrivateUse1")
    _LIBRARY = library
