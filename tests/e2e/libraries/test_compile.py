"""torch.compile on the simulated device against the CPU, loss by loss.

torch has no compiler for DirectML: before dmlpatch routed device graphs through AOTAutograd,
Inductor stopped on them (``no scheduling registered for device privateuseone``), and with the
placement accounting on, its global hook broke every graph so the model ran uncompiled, with
torch warning three times about global hooks at the program's line.

The CPU's answer is the same program with Dynamo off (``TORCHDYNAMO_DISABLE=1``): eager
numerics, which AOTAutograd's graphs reproduce operator by operator (Inductor's fused CPU
kernels round differently, and compiling them takes the suite half a minute per program).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from support import Result, clean_env, run_python

COMPILED = """
import json
import torch
import torch.nn as nn
import torch.nn.functional as F

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.norm = nn.BatchNorm2d(8)
        self.head = nn.Linear(8 * 8 * 8, 10)

    def forward(self, x):
        x = F.relu(self.norm(self.conv(x)))
        return self.head(x.flatten(1))


@torch.compile
def loss_fn(logits, target):
    return F.cross_entropy(logits, target) + 1e-3 * logits.pow(2).mean()


found = {}
for variant in ("torch.compile", "module.compile", "reduce-overhead"):
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)  # before the move, CUDA-era
    model.to(device)
    if variant == "module.compile":
        model.compile()
        net = model
    else:
        net = torch.compile(model, mode="reduce-overhead" if variant == "reduce-overhead" else None)
    images = torch.randn(16, 3, 8, 8, device=device)
    labels = torch.randint(0, 10, (16,), device=device)
    losses = []
    for step in range(4):
        loss = loss_fn(net(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    net.eval()
    with torch.no_grad():
        predicted = net(images).argmax(1).tolist()
    found[variant] = {"losses": losses, "predicted": predicted, "device": str(images.device)}
print(json.dumps(found))
"""

# CUDA sites inside a forward that compiles as one graph: each is rewritten to a runtime call,
# which Dynamo must not break the graph on (fullgraph=True would stop).
FULLGRAPH = """
import json
import torch
import torch.nn as nn

torch.manual_seed(0)


dev = "cuda"


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.where = dev

    def forward(self, x):
        noise = torch.zeros(x.shape, device="cuda")
        scale = torch.full((8,), 0.5).cuda()
        mask = torch.ones(8, device=torch.device("cuda"))
        # CUDA's name held in an attribute, checked at run time: Dynamo must see the adapter.
        x = x.to(self.where) + torch.zeros(8, device=self.where)
        if x.device.type == "cuda":
            mask = mask * 2
        if x.is_cuda and torch.cuda.is_available():
            mask = mask + 1
        return self.lin(x + noise) * mask * scale


model = Net().cuda()
x = torch.randn(4, 8).cuda()
explained = torch._dynamo.explain(model)(x)
compiled = torch.compile(model, fullgraph=True)(x)
print(json.dumps({
    "graphs": explained.graph_count,
    "breaks": explained.graph_break_count,
    "compiled": compiled.flatten().tolist(),
    "eager": model(x).flatten().tolist(),
    "device": str(compiled.device),
}))
"""

RESNET = """
import json
import torch, torchvision

torch.manual_seed(0)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = torchvision.models.resnet18(num_classes=10)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
model = model.to(device)
net = torch.compile(model)
x = torch.randn(4, 3, 32, 32, device=device)
y = torch.randint(0, 10, (4,), device=device)
losses = []
for _ in range(4):
    loss = torch.nn.functional.cross_entropy(net(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    losses.append(loss.item())
print(json.dumps({"losses": losses, "device": str(x.device)}))
"""

# A library that compiles on its own: transformers' Trainer with torch_compile=True.
TRAINER = """
import json, sys
import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

torch.manual_seed(0)
config = GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=100, n_positions=32)
model = GPT2LMHeadModel(config)
ids = torch.randint(0, 100, (8, 16))
data = [{"input_ids": row, "labels": row} for row in ids]
arguments = TrainingArguments(
    output_dir=sys.argv[1], max_steps=3, per_device_train_batch_size=4, learning_rate=1e-2,
    logging_steps=1, report_to=[], save_strategy="no", seed=0, dataloader_num_workers=0,
    disable_tqdm=True, torch_compile=True,
)
trainer = Trainer(model=model, args=arguments, train_dataset=data)
trainer.train()
print(json.dumps({
    "device": str(next(model.parameters()).device),
    "losses": [entry["loss"] for entry in trainer.state.log_history if "loss" in entry],
}))
"""

COMPILE_LINE = "dmlpatch: torch.compile: torch has no compiler for DirectML"
CUDA_GRAPHS_LINE = "dmlpatch: torch.compile: mode='reduce-overhead' records CUDA graphs"


def _run(where: Path, source: str, *runner: str, **env: str) -> tuple[dict, Result]:
    (where / "program.py").write_text(source)
    result = run_python(
        [*runner, "program.py", str(where / "out")], cwd=where, env=clean_env(**env), timeout=600
    )
    assert result.code == 0, result.err[-4000:]
    return json.loads(result.out.strip().splitlines()[-1]), result


def _on_cpu(where: Path, source: str) -> dict:
    return _run(where, source, TORCHDYNAMO_DISABLE="1")[0]


def _on_device(where: Path, source: str, **env: str) -> tuple[dict, Result]:
    return _run(where, source, "-m", "dmlpatch", "--device", "sim", **env)


# Inductor's refusal, by torch version: 2.4 "Device privateuseone not supported", later
# releases "KeyError: 'privateuseone'" or "no scheduling registered for device privateuseone".
REFUSED = r"(privateuseone not supported|KeyError: 'privateuseone'|device privateuseone)"

RAW = """
import torch
import dmlpatch.sim as sim

sim.load("torch-directml-0.2.5")
model = torch.nn.Linear(4, 2).to("privateuseone:0")
print(torch.compile(model)(torch.randn(3, 4, device="privateuseone:0")))
"""


def test_without_dmlpatch_inductor_refuses_the_device(tmp_path: Path) -> None:
    result = run_python(["-c", RAW], cwd=tmp_path, timeout=600)
    assert result.code == 1
    assert re.search(REFUSED, result.err), result.err[-2000:]


@pytest.fixture(scope="module")
def compiled_on_cpu(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return _on_cpu(tmp_path_factory.mktemp("cpu"), COMPILED)


@pytest.mark.parametrize("accounting", ["1", "0"])
def test_compiled_models_train_on_the_device_as_on_the_cpu(
    tmp_path: Path, compiled_on_cpu: dict, accounting: str
) -> None:
    found, result = _on_device(tmp_path, COMPILED, DMLPATCH_ACCOUNTING=accounting)
    for variant, expected in compiled_on_cpu.items():
        got = found[variant]
        assert expected["device"] == "cpu" and got["device"] == "privateuseone:0"
        assert got["losses"] == pytest.approx(expected["losses"], rel=1e-5), variant
        assert len(set(got["losses"])) == 4  # it trains
        assert got["predicted"] == expected["predicted"], variant
    lines = result.err_lines
    assert sum(line.startswith(COMPILE_LINE) for line in lines) == 1
    assert sum(line.startswith(CUDA_GRAPHS_LINE) for line in lines) == 1
    # No global-hooks warning, no graph broken into eager code. Training graphs hold batch
    # norm as _native_batch_norm_legit_functional, which DirectML lacks: its CPU fallback runs
    # it, said as DirectML says it (torch's decomposition of it, run on the device, trained
    # ResNet-18 to another loss by the third step: see the test below).
    assert "global hooks" not in result.err
    assert "'aten::_native_batch_norm_legit' is not currently supported" in result.err
    assert "Traceback" not in result.err and "graph break" not in result.err.lower()


def test_a_compiled_resnet_trains_as_on_the_cpu(tmp_path: Path) -> None:
    expected = _on_cpu(tmp_path, RESNET)
    found, _ = _on_device(tmp_path, RESNET)
    assert expected["device"] == "cpu" and found["device"] == "privateuseone:0"
    assert found["losses"] == pytest.approx(expected["losses"], rel=1e-5)


def test_the_accounting_counts_compiled_graphs_on_the_device(tmp_path: Path) -> None:
    _, _ = _on_device(tmp_path, COMPILED, DMLPATCH_REPORT=str(tmp_path / "report.json"))
    compute = json.loads((tmp_path / "report.json").read_text())["compute"]
    # Batch norm's training form runs through DirectML's CPU fallback (see above), and counts
    # there: nothing else does.
    fell_back = {entry["operator"] for entry in compute["cpu_fallbacks"]}
    assert fell_back == {"aten::_native_batch_norm_legit"}, fell_back
    assert sum(e["flops"] for e in compute["cpu_fallbacks"]) == compute["on_cpu"]["flops"]
    assert 0.9 < compute["device_share"] < 1.0
    # Three models, four training and one inference forward each, of one convolution (16
    # images of 8x8, 3 -> 8 channels, 3x3) and one linear layer (512 -> 10): 2 FLOPs a MAC.
    forward = 2 * 16 * 8 * 8 * 8 * 3 * 9 + 2 * 16 * 512 * 10
    assert compute["on_device"]["flops"] >= 3 * 5 * forward


def test_a_forward_with_cuda_sites_compiles_as_one_graph(tmp_path: Path) -> None:
    found, result = _on_device(tmp_path, FULLGRAPH)
    assert "graph break" not in result.err.lower() and "Traceback" not in result.err
    assert found["device"] == "privateuseone:0"
    assert found["graphs"] == 1 and found["breaks"] == 0
    assert found["compiled"] == pytest.approx(found["eager"], rel=1e-6)


def test_a_trainer_that_compiles_on_its_own_trains_as_on_the_cpu(tmp_path: Path) -> None:
    if _torch_before_2_5():
        # transformers 4.57's causal mask cannot be traced by torch 2.4's Dynamo on any device
        # ("more than one element of the written-to tensor refers to a single memory
        # location", the same under plain python on the CPU): dmlpatch must fail no other way.
        (tmp_path / "program.py").write_text(TRAINER)
        plain = run_python(["program.py", str(tmp_path / "out")], cwd=tmp_path, timeout=600)
        patched = run_python(
            ["-m", "dmlpatch", "--device", "sim", "program.py", str(tmp_path / "out")],
            cwd=tmp_path,
            timeout=600,
        )
        failure = "more than one element of the written-to tensor refers to a single memory"
        assert plain.code == patched.code == 1
        assert failure in plain.err and failure in patched.err
        return
    expected = _on_cpu(tmp_path, TRAINER)
    found, result = _on_device(tmp_path, TRAINER)
    assert expected["device"] == "cpu" and found["device"] == "privateuseone:0"
    assert found["losses"] == pytest.approx(expected["losses"], rel=1e-5)
    assert len(expected["losses"]) == 3 and len(set(found["losses"])) == 3
    assert sum(line.startswith(COMPILE_LINE) for line in result.err_lines) == 1


def _torch_before_2_5() -> bool:
    import torch

    major, minor = (int(part) for part in torch.__version__.split(".")[:2])
    return (major, minor) < (2, 5)
