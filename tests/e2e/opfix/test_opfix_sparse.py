"""A model with a sparse buffer (openai-whisper's ``alignment_heads``) moved to DirectML: without
dmlpatch the move fails (microsoft/DirectML#414); with it the parameters move, the sparse buffer
stays on the CPU, and the model computes what it computes on the CPU."""

from __future__ import annotations

import copy

import pytest
import torch
from tests.e2e.opfix.helpers import without_fixes
from torch import nn

import dmlpatch.sim as sim


class WithAlignmentHeads(nn.Module):
    """Whisper's pattern: a (layers x heads) mask kept as a sparse, non-persistent buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.Sequential(nn.Linear(6, 6), nn.GELU(), nn.Linear(6, 6))
        heads = torch.zeros(4, 3, dtype=torch.bool)
        heads[2:, 1] = True
        heads[3, 0] = True
        self.register_buffer("alignment_heads", heads.to_sparse(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        chosen = self.alignment_heads.indices().T.tolist()  # as whisper's timing code reads it
        return self.blocks(x) * len(chosen)


def test_sparse_buffer_stays_on_the_cpu_as_the_model_moves(dev: torch.device) -> None:
    torch.manual_seed(0)
    model = WithAlignmentHeads()
    x = torch.randn(5, 6)
    expected = model(x)
    sim.reset_counters()
    moved = copy.deepcopy(model).to(dev)
    assert all(p.device == dev for p in moved.parameters())
    assert moved.alignment_heads.is_sparse and moved.alignment_heads.device.type == "cpu"
    assert torch.equal(moved.alignment_heads.to_dense(), model.alignment_heads.to_dense())
    assert sim.counters()["ops"]["fixed"] == {"aten::_sparse_coo_tensor_with_dims_and_tensors": 1}
    got = moved(x.to(dev))
    assert got.device == dev
    assert torch.allclose(got.cpu(), expected, rtol=1e-6, atol=1e-6)
    assert set(moved.state_dict()) == set(model.state_dict())
    back = moved.to("cpu")
    assert back.alignment_heads.is_sparse and back.blocks[0].weight.device.type == "cpu"


def test_without_dmlpatch_the_move_fails(dev: torch.device) -> None:
    with without_fixes(), pytest.raises(NotImplementedError, match="'SparsePrivateUse1' backend"):
        WithAlignmentHeads().to(dev)
