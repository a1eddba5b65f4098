"""A CUDA script that pins its batches before copying them (``x.pin_memory().cuda(
non_blocking=True)``, a prefetcher's idiom) runs on the simulated device and on the CPU.

Page-locked memory is CUDA's: torch 2.4 (torch-directml's torch) pins for CUDA whatever the
device, and torch 2.14 for the CPU-only process of ``--device cpu`` does too, so without a CUDA
driver ``pin_memory()`` fails (``Found no NVIDIA driver``). Under dmlpatch the batch is copied
in ordinary memory, and the script computes what the CPU computes.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from support import clean_env, run_python

SCRIPT = """
import torch

torch.manual_seed(0)
model = torch.nn.Linear(8, 2).cuda()
batch = torch.randn(4, 8)
pinned = batch.pin_memory()
batch.zero_()  # pinning copied the batch: the copy keeps its values
storage = torch.arange(3.0).untyped_storage().pin_memory()
out = model(pinned.cuda(non_blocking=True))
print(out.device.type, out.sum().item(), pinned.device.type, storage.nbytes())
"""


def _expected() -> float:
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 2)
    return float(model(torch.randn(4, 8)).sum().item())


@pytest.mark.parametrize("device", ["cpu", "sim"])
def test_a_script_that_pins_its_batches_runs(tmp_path: Path, device: str) -> None:
    script = tmp_path / "prefetch.py"
    script.write_text(SCRIPT)
    result = run_python(["-m", "dmlpatch", "--device", device, str(script)], env=clean_env())
    assert result.code == 0, result.err
    kind, total, pinned_on, nbytes = result.out.split()
    assert kind == ("privateuseone" if device == "sim" else "cpu")
    assert float(total) == pytest.approx(_expected(), rel=1e-6)
    assert (pinned_on, nbytes) == ("cpu", "12")
