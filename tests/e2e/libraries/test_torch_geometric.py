"""torch_geometric on the simulated device, and the modules it writes at run time.

PyG renders its layers' ``propagate`` and ``edge_updater`` into temporary files and imports them
under its own package's names. Installed beside torch, its files also began with torch's
directory name, so they counted as torch's own code: the fallback warning and ``check``'s page
named the temporary file (``gat_conv_GATConv_edge_updater_....py:176``) as the program's line.
PyG lives beside the venv (scripts/setup.sh; ``$DMLPATCH_TORCH_GEOMETRIC`` may point elsewhere).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest

from support import REPO, clean_env, run_python

SITE = Path(
    os.environ.get("DMLPATCH_TORCH_GEOMETRIC", str(REPO / ".cache" / "torch_geometric-2.6.1"))
)

TRAIN = """
import json
import torch
import torch.nn.functional as F
from torch_geometric.nn import GATConv, GCNConv

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
x = torch.randn(30, 8)
edge_index = torch.randint(0, 30, (2, 90))
y = torch.randint(0, 3, (30,))


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.gcn = GCNConv(8, 16)
        self.gat = GATConv(16, 3, heads=2, concat=False)

    def forward(self, x, edge_index):
        return self.gat(F.relu(self.gcn(x, edge_index)), edge_index)


model = Net().to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
x, edge_index, y = x.to(device), edge_index.to(device), y.to(device)
losses = []
for step in range(5):
    optimizer.zero_grad()
    loss = F.cross_entropy(model(x, edge_index), y)
    loss.backward()
    optimizer.step()
    losses.append(loss.item())
print(json.dumps({"losses": losses, "device": str(x.device)}))
"""

#: What dmlpatch makes of a module PyG generates, and of torchmetrics (installed beside torch).
ORIGINS = """
import json, sys
import torch_geometric.nn.conv.gat_conv as gat_conv
import torchmetrics
from torch_geometric.nn import GATConv
from dmlpatch.placement import frames
from dmlpatch.placement_page import sources
from dmlpatch.rewriting.discovery import is_program_path

GATConv(4, 4)  # renders and imports its propagate and edge_updater
name = "torch_geometric.nn.conv.gat_conv_GATConv_edge_updater"
generated, library = sys.modules[name].__file__, gat_conv.__file__
print(json.dumps({
    "generated": generated,
    "internal": frames.internal(generated),
    "kind": [sources.kind_of(generated), sources.kind_of(library)],
    "program": [is_program_path(generated), is_program_path(library)],
    "torchmetrics internal": frames.internal(torchmetrics.__file__),
}))
"""


@pytest.fixture(scope="module")
def env() -> dict[str, str]:
    assert (SITE / "torch_geometric").is_dir(), f"run scripts/setup.sh: no {SITE}"
    return clean_env(PYTHONPATH=str(SITE))


def test_gcn_and_gat_train_on_the_device_as_on_the_cpu_named_by_real_lines(
    tmp_path: Path, env: dict[str, str]
) -> None:
    (tmp_path / "train.py").write_text(TRAIN)
    on_cpu = run_python(["train.py"], cwd=tmp_path, env=env)
    assert on_cpu.code == 0, on_cpu.err[-3000:]
    patched = run_python(
        ["-m", "dmlpatch", "check", "--device", "sim", "--html", "page", "train.py"],
        cwd=tmp_path,
        env=env,
        timeout=600,
    )
    assert patched.code == 0, patched.err[-3000:]
    expected = json.loads(on_cpu.out.splitlines()[-1])
    found = json.loads(patched.out.splitlines()[-1])
    assert found["device"] == "privateuseone:0"
    assert found["losses"] == pytest.approx(expected["losses"], rel=1e-5, abs=1e-6)
    assert len(set(found["losses"])) == 5  # it trains
    (warning,) = [line for line in patched.err_lines if "DML backend" in line]
    named = warning.split(":")[0]  # PyG's own file or the program's, never one PyG wrote
    assert os.path.isfile(named) and named.startswith((str(SITE), str(tmp_path))), warning
    page = (tmp_path / "page" / "index.html").read_text()
    assert "_propagate_" not in page and "_edge_updater_" not in page


def test_a_module_pyg_generates_is_pygs_and_never_the_line_named(env: dict[str, str]) -> None:
    result = run_python(["-c", ORIGINS], env=env)
    assert result.code == 0, result.err[-3000:]
    found = json.loads(result.out.splitlines()[-1])
    assert found["generated"].startswith(tempfile.gettempdir())  # PyG wrote it there
    assert found["internal"]  # the line that called into it is named instead
    generated_kind, library_kind = found["kind"]
    assert generated_kind == library_kind  # PyG's own kind, wherever PyG is installed
    assert found["program"][0] == found["program"][1]
    assert not found["torchmetrics internal"]  # a library beside torch, not torch's own code
