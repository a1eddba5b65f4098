"""``dmlpatch.unpatch()`` leaves the process as it found it: a program patched for the simulated
device, a model trained there, then undone, then the same training on the CPU equal to a
process that never started dmlpatch. What cannot be undone (the simulated device's backend,
which torch keeps) is listed in the ledger and said in one line; everything else dmlpatch
changed was in the ledger, or undoing it would have left it changed (the snapshot below
compares every function of torch's and multiprocessing's modules and classes, the import
hooks, the environment, the pickling reducers and the kernels registered for the device)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from support import clean_env, run_python

PROGRAM = r'''
import json
import os
import sys
import types

import torch

KINDS = (types.FunctionType, types.BuiltinFunctionType, types.MethodType, staticmethod, classmethod)


def functions():
    """Every function of torch's, multiprocessing's and importlib's modules and of the classes
    they define, by name -> identity."""
    found = {}
    for name, module in list(sys.modules.items()):
        if module is None or not (
            name == "torch" or name.startswith(("torch.", "multiprocessing", "importlib"))
        ):
            continue
        try:
            members = dict(vars(module))
        except TypeError:
            continue
        for key, value in members.items():
            if isinstance(value, KINDS):
                found[f"{name}.{key}"] = id(value)
            elif isinstance(value, type) and f"{value.__module__}.{value.__qualname__}" == (
                f"{name}.{key}"
            ):
                for attribute, member in list(vars(value).items()):
                    if isinstance(member, KINDS):
                        found[f"{name}.{key}.{attribute}"] = id(member)
    return found


def snapshot():
    from multiprocessing.reduction import ForkingPickler

    return {
        "meta_path": [type(finder).__name__ for finder in sys.meta_path],
        "environment": {
            k: v for k, v in os.environ.items() if k.startswith("DMLPATCH") or k == "PYTHONPATH"
        },
        "reducers": {
            f"{cls.__module__}.{cls.__qualname__}": id(reduce)
            for cls, reduce in vars(ForkingPickler)["_extra_reducers"].items()
        },
        "functions": functions(),
    }


def kernels():
    """aten's operators with a kernel for the device (where dmlpatch's fixes register; torch
    registers other libraries' as their modules are imported, and imports stay)."""
    return {
        key: sorted(
            name
            for name in torch._C._dispatch_get_registrations_for_dispatch_key(key)
            if name.startswith("aten::")
        )
        for key in ("PrivateUse1", "AutogradPrivateUse1")
    }


def train(device):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
        torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 2),
    ).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(8, 3, 8, 8), torch.randn(8, 2)
    losses = []
    for _ in range(4):
        loss = torch.nn.functional.mse_loss(model(x.to(device)), y.to(device))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


mode = sys.argv[1]
if mode == "sim only":
    import dmlpatch.sim as sim

    sim.load()
    print(json.dumps({"kernels": kernels()}))
    raise SystemExit(0)
before = snapshot()
listed, kept, on_device = [], [], None
if mode == "patched":
    import dmlpatch
    from dmlpatch import changes

    dmlpatch.patch("sim")
    on_device = train(dmlpatch.device())
    listed = changes.listing()
    dmlpatch.unpatch()
    kept = changes.listing()
else:
    train("cpu")  # torch's own first-use changes, as the patched run's device training makes
after = snapshot()
changed = sorted(
    name
    for name, identity in before["functions"].items()
    if after["functions"].get(name, identity) != identity
)
print(json.dumps({
    "on_device": on_device,
    "cpu": train("cpu"),
    "listed": listed,
    "kept": kept,
    "meta_path": [before["meta_path"], after["meta_path"]],
    "environment": [before["environment"], after["environment"]],
    "reducers": [before["reducers"], after["reducers"]],
    "changed": changed,
    "kernels": kernels(),
}))
'''


def _run(mode: str) -> dict[str, Any]:
    result = run_python(["-c", PROGRAM, mode], env=clean_env())
    assert result.code == 0, result.err
    return json.loads(result.out.splitlines()[-1])


def test_unpatch_leaves_the_process_as_a_plain_one_but_for_the_device_it_names() -> None:
    plain, patched, sim_only = _run("plain"), _run("patched"), _run("sim only")
    # The CPU run after undo is a plain process's, loss for loss; the device run matched it.
    assert patched["cpu"] == plain["cpu"]
    assert patched["on_device"] == plain["cpu"] or all(
        abs(a - b) <= 1e-5 * max(1.0, abs(b)) for a, b in zip(patched["on_device"], plain["cpu"])
    )
    # The ledger listed what a sim start-up installs, and keeps only what cannot go.
    kinds = {entry["kind"] for entry in patched["listed"]}
    assert {"kernels", "function", "reducers", "import hook", "environment", "device"} <= kinds
    assert [(e["kind"], e["undoable"]) for e in patched["kept"]] == [("device", False)]
    assert "torch keeps a backend" in patched["kept"][0]["why_not"]
    # Nothing else stays: functions, reducers, environment as before (torch's own first-use
    # changes aside, which the plain process makes too), and the import hooks but the
    # simulated device's own guard against importing torch_directml beside it.
    assert patched["changed"] == plain["changed"]
    before, after = patched["reducers"]
    assert after == before
    before, after = patched["environment"]
    assert after == before
    before, after = patched["meta_path"]
    assert before == plain["meta_path"][0]
    # (torch 2.4 imports pkg_resources on first use, whose finders join in both processes)
    assert after == ["_TorchDirectmlBlocker", *plain["meta_path"][1]]
    # The device's kernels are the simulated device's own again: every Python kernel is gone.
    assert patched["kernels"] == sim_only["kernels"]


def test_unpatch_says_in_one_line_what_it_cannot_undo() -> None:
    program = (
        "import dmlpatch, torch\n"
        "dmlpatch.patch('sim')\n"
        "torch.ones(2).to(dmlpatch.device())\n"
        "dmlpatch.unpatch()\n"
    )
    result = run_python(["-c", program], env=clean_env())
    assert result.code == 0, result.err
    said = [line for line in result.err.splitlines() if "could not undo" in line]
    assert said == [
        "dmlpatch: could not undo: the simulated DirectML device, profile torch-directml-0.2.5: "
        "the privateuseone backend, its device module and kernels, and the import hook that "
        "keeps torch_directml out (torch keeps a backend and its device module for the life of "
        "the process)"
    ]


def test_check_and_the_report_list_what_was_installed(tmp_path: Path) -> None:
    program = tmp_path / "program.py"
    program.write_text(
        "import torch\n"
        "layer = torch.nn.Linear(3, 2).cuda()\n"
        "print(layer(torch.randn(4, 3).cuda()).shape)\n",
        encoding="utf-8",
    )
    checked, report = tmp_path / "check.json", tmp_path / "report.json"
    result = run_python(
        ["-m", "dmlpatch", "check", "--json", str(checked), str(program)], env=clean_env()
    )
    assert result.code == 0, result.err
    listed = json.loads(checked.read_text(encoding="utf-8"))["installed"]
    kinds = sorted({entry["kind"] for entry in listed})
    line = next(x for x in result.err.splitlines() if x.startswith("installed: "))
    assert line.startswith(f"installed: {len(listed)} changes to this process (")
    assert line.endswith("1 of them cannot be undone by dmlpatch.unpatch()")
    assert all(f"{kind} " in line for kind in kinds)
    result = run_python(
        ["-m", "dmlpatch", "--device", "sim", f"--report={report}", str(program)],
        env=clean_env(),
    )
    assert result.code == 0, result.err
    installed = json.loads(report.read_text(encoding="utf-8"))["installed"]
    assert {"kernels", "function", "import hook", "device"} <= {e["kind"] for e in installed}
    assert [e["what"] for e in installed if not e["undoable"]] == [
        next(e["what"] for e in installed if e["kind"] == "device")
    ]
