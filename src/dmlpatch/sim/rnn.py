"""LSTM/GRU cells for the permissive profile, which has every kernel.

DirectML lacks ``_thnn_fused_lstm_cell``/``_thnn_fused_gru_cell`` (the simulator's DirectML
profiles reproduce that); the permissive profile registers the compositions of
:mod:`dmlpatch.opfix.layers.rnn` as if they were native, uncounted as fixes.
"""

from __future__ import annotations

from typing import Optional

import torch

_LIBRARY: Optional[torch.library.Library] = None


def install() -> None:
    """Register both cells at AutogradPrivateUse1 (once per process)."""
    global _LIBRARY
    if _LIBRARY is not None:
        return
    from dmlpatch.opfix.layers.rnn import gru_cell, lstm_cell

    library = torch.library.Library("aten", "IMPL")
    library.impl("_thnn_fused_lstm_cell", lstm_cell, "AutogradPrivateUse1")
    library.impl("_thnn_fused_gru_cell", gru_cell, "AutogradPrivateUse1")
    _LIBRARY = library
