"""A Vision Transformer in eval, as open-clip and torchvision run it, on the device.

In eval under ``torch.no_grad`` every ``nn.MultiheadAttention`` of torchvision's
``VisionTransformer`` (open-clip's towers, every ``nn.TransformerEncoder``) takes PyTorch's fast
path, the fused ``_native_multi_head_attention`` DirectML lacks: each block's attention went
through the CPU, activations and weights copied both ways. The program below builds a
``vit_b_16``-style ViT from torchvision's class, small and with random weights, and classifies a
batch the CUDA way; plain python runs it on the CPU (the oracle).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support import run_python

LAYERS = 3

PROGRAM = f"""
import json
import torch
from torchvision.models.vision_transformer import VisionTransformer

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
model = VisionTransformer(
    image_size=32, patch_size=8, num_layers={LAYERS}, num_heads=4, hidden_dim=64, mlp_dim=128,
    num_classes=10,
)
model = model.to(device).eval()
images = torch.rand(2, 3, 32, 32)
with torch.no_grad():
    logits = model(images.to(device))
print(json.dumps({{"device": str(logits.device), "values": logits.cpu().flatten().tolist()}}))
"""


def test_vit_in_eval_on_the_device_equals_the_cpu_with_no_fallback(tmp_path: Path) -> None:
    fixed = _on_the_device_as_on_the_cpu(tmp_path, PROGRAM)
    assert fixed.get("aten::_native_multi_head_attention") == LAYERS, fixed


def _on_the_device_as_on_the_cpu(tmp_path: Path, program: str) -> dict[str, int]:
    """Runs ``program`` under python (the CPU) and on the simulated device, asserts the same
    values, no fallback and no warning; returns the operators fixed on the device."""
    (tmp_path / "program.py").write_text(program)
    plain = run_python(["program.py"], cwd=tmp_path)
    assert plain.code == 0, plain.err
    report = tmp_path / "report.json"
    result = run_python(
        ["-m", "dmlpatch", "--device", "sim", f"--report={report}", "program.py"], cwd=tmp_path
    )
    assert result.code == 0, result.err
    got, expected = json.loads(result.out), json.loads(plain.out)
    assert (got["device"], expected["device"]) == ("privateuseone:0", "cpu")
    assert got["values"] == pytest.approx(expected["values"], rel=1e-4, abs=1e-5)
    ops = json.loads(report.read_text())["ops"]
    assert ops["fallback"] == {} and ops["refused"] == {}, ops
    assert "warning" not in result.err, result.err
    return ops["fixed"]


ENCODER = """
import json
import torch
from torch import nn

device = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)
layer = nn.TransformerEncoderLayer(32, 4, 64, batch_first=True)
encoder = nn.TransformerEncoder(layer, 2, norm=nn.LayerNorm(32)).to(device).eval()
tokens = torch.randn(3, 7, 32)
padding = torch.tensor([[False] * 7, [False] * 4 + [True] * 3, [False] * 6 + [True]])
with torch.no_grad():
    out = encoder(tokens.to(device), src_key_padding_mask=padding.to(device))
print(json.dumps({"device": str(out.device), "values": out.cpu().flatten().tolist()}))
"""


def test_encoder_with_a_padding_mask_runs_on_the_device_as_on_the_cpu(tmp_path: Path) -> None:
    """Packed into a nested tensor on the CPU; on the device the same layers on the padded
    batch (the torch spec), where DirectML's fallback stopped the program."""
    fixed = _on_the_device_as_on_the_cpu(tmp_path, ENCODER)
    assert fixed["aten::_nested_tensor_from_mask"] == 1, fixed
