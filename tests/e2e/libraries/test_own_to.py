"""Objects that are neither tensors nor modules but have their own ``.cuda()`` / ``.to()``.

spandrel (the model loader ComfyUI uses) documents ``ModelLoader().load_from_file(p).cuda()
.eval()``; its ``ModelDescriptor.to`` takes a device and a dtype and nothing else, so a rewritten
``.cuda()`` that passed ``non_blocking=`` failed with ``TypeError: to() got unexpected keyword
arguments ['non_blocking']``. The program below also moves a ``PackedSequence``, a transformers
``BatchEncoding``, a torchmetrics metric and a container of its own, each as CUDA users write it;
plain python runs it on the CPU (the oracle). The ESRGAN is built from spandrel's own class with
random weights and saved as the state dict spandrel detects.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support import run_python

PROGRAM = """
import json, sys
import torch
from torch.nn.utils.rnn import pack_sequence
from spandrel import ModelLoader
from spandrel.architectures.ESRGAN import ESRGAN
from transformers import BatchEncoding
from torchmetrics.classification import BinaryAccuracy

cuda = sys.argv[2] == "cuda"
torch.manual_seed(0)
path = sys.argv[1] + "/esrgan.pth"
torch.save(ESRGAN(in_nc=3, out_nc=3, num_filters=8, num_blocks=1, scale=2).state_dict(), path)
model = ModelLoader().load_from_file(path)
model = model.cuda().eval() if cuda else model.eval()
image = torch.rand(1, 3, 8, 8)
with torch.no_grad():
    upscaled = model(image.to(model.device)).cpu()
out = {"spandrel": [str(model.device), type(model).__name__], "image": upscaled.flatten().tolist()}

packed = pack_sequence([torch.arange(6.0).reshape(3, 2), torch.ones(2, 2)])
packed = packed.cuda() if cuda else packed
out["packed"] = [str(packed.data.device), packed.data.sum().item(), packed.batch_sizes.tolist()]

batch = BatchEncoding({"input_ids": torch.tensor([[1, 2, 3]])})
batch = batch.to("cuda") if cuda else batch
out["batch"] = str(batch["input_ids"].device)

metric = BinaryAccuracy()
metric = metric.cuda() if cuda else metric
on = metric.device
metric.update(torch.tensor([0.9, 0.1, 0.8], device=on), torch.tensor([1, 0, 0], device=on))
out["metric"] = [str(metric.device), metric.compute().item()]


class Pair:
    def __init__(self, a, b):
        self.a, self.b = a, b

    def to(self, device):
        return Pair(self.a.to(device), self.b.to(device))

    def cuda(self):
        return self.to("cuda")


pair = Pair(torch.ones(1), torch.zeros(1))
pair = pair.cuda() if cuda else pair
out["pair"] = [str(pair.a.device), str(pair.b.device)]
print(json.dumps(out))
"""


def test_own_cuda_and_to_move_each_object_as_on_a_gpu(tmp_path: Path) -> None:
    (tmp_path / "program.py").write_text(PROGRAM)
    plain = run_python(["program.py", str(tmp_path), "cpu"], cwd=tmp_path)
    assert plain.code == 0, plain.err
    result = run_python(
        ["-m", "dmlpatch", "--device", "sim", "program.py", str(tmp_path), "cuda"], cwd=tmp_path
    )
    assert result.code == 0, result.err
    got, expected = json.loads(result.out), json.loads(plain.out)
    assert got["spandrel"] == ["privateuseone:0", "ImageModelDescriptor"]
    assert expected["spandrel"] == ["cpu", "ImageModelDescriptor"]
    assert got["image"] == pytest.approx(expected["image"], rel=1e-5, abs=1e-6)
    assert got["packed"] == ["privateuseone:0", *expected["packed"][1:]]
    assert (got["batch"], expected["batch"]) == ("privateuseone:0", "cpu")
    assert got["metric"] == ["privateuseone:0", expected["metric"][1]]
    assert got["pair"] == ["privateuseone:0", "privateuseone:0"]
