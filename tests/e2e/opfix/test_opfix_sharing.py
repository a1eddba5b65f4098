"""A device tensor handed to another process (catalogue entry ``shared-memory``): PyTorch's
``_share_fd_: only available on CPU`` without dmlpatch, one line that says why and what to do
with it; CPU tensors are shared as before, a model shared with ``model.share_memory()``
reaches its workers (tests/e2e/test_hogwild.py trains one), and a worker handed the device
itself can compute there."""

from __future__ import annotations

from multiprocessing.reduction import ForkingPickler
from pathlib import Path

import pytest
import torch
from tests.e2e.opfix.helpers import without_fixes

from support import run_python


def test_without_dmlpatch_pytorch_refuses_with_its_own_text(dev: torch.device) -> None:
    with without_fixes(), pytest.raises(RuntimeError, match="_share_fd_: only available on CPU"):
        ForkingPickler.dumps(torch.ones(3, device=dev))


@pytest.mark.parametrize("what", ["tensor", "parameter", "storage"])
def test_a_device_tensor_stops_with_one_line(dev: torch.device, what: str) -> None:
    tensor = torch.ones(3, device=dev)
    value = {
        "tensor": tensor,
        "parameter": torch.nn.Parameter(tensor),
        "storage": tensor.untyped_storage(),
    }[what]
    with pytest.raises(RuntimeError) as raised:
        ForkingPickler.dumps(value)
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith("a tensor on privateuseone:0 cannot be handed to another process")
    assert "catalogue entry shared-memory" in message


def test_cpu_tensors_are_shared_as_before(dev: torch.device) -> None:
    tensor = torch.arange(4.0).share_memory_()
    assert ForkingPickler.loads(ForkingPickler.dumps(tensor)).tolist() == [0.0, 1.0, 2.0, 3.0]


HOGWILD = """
import torch
import torch.multiprocessing as mp


def train(model):
    x = torch.ones(2, 4, device=next(model.parameters()).device)
    model(x).sum().backward()


if __name__ == "__main__":
    mp.set_start_method("spawn")
    model = torch.nn.Linear(4, 2).cuda() if torch.cuda.is_available() else torch.nn.Linear(4, 2)
    model.share_memory()
    workers = [mp.Process(target=train, args=(model,)) for _ in range(2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    print("exit codes", [worker.exitcode for worker in workers])
"""

#: A device tensor itself handed to a worker, and the device for the worker to use.
HANDED = """
import sys

import torch
import torch.multiprocessing as mp


def work(value, device):
    print("worker", torch.ones(2).to(device).device, value.device, flush=True)


if __name__ == "__main__":
    mp.set_start_method("spawn")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    value = torch.ones(3).to(device) if sys.argv[1] == "tensor" else torch.ones(3)
    worker = mp.Process(target=work, args=(value, device))
    worker.start()
    worker.join()
    print("exit code", worker.exitcode)
"""


def test_a_shared_model_reaches_spawned_workers(tmp_path: Path) -> None:
    (tmp_path / "hogwild.py").write_text(HOGWILD)
    plain = run_python(["hogwild.py"], cwd=tmp_path, timeout=300)
    assert plain.code == 0 and "exit codes [0, 0]" in plain.out, plain.err  # on the CPU
    patched = run_python(["-m", "dmlpatch", "--device", "sim", "hogwild.py"], cwd=tmp_path)
    assert patched.code == 0 and "exit codes [0, 0]" in patched.out, patched.err


def test_a_device_tensor_handed_to_a_worker_says_why_it_stops(tmp_path: Path) -> None:
    (tmp_path / "handed.py").write_text(HANDED)
    plain = run_python(["handed.py", "tensor"], cwd=tmp_path, timeout=300)
    assert plain.code == 0 and "worker cpu cpu" in plain.out, plain.err  # on the CPU
    patched = run_python(["-m", "dmlpatch", "--device", "sim", "handed.py", "tensor"], cwd=tmp_path)
    assert patched.code == 1
    assert patched.err_lines[-1].startswith(
        "RuntimeError: a tensor on privateuseone:0 cannot be handed to another process: "
        "DirectML has no inter-process memory"
    )


def test_a_worker_handed_the_device_computes_there(tmp_path: Path) -> None:
    (tmp_path / "handed.py").write_text(HANDED)
    patched = run_python(["-m", "dmlpatch", "--device", "sim", "handed.py", "cpu"], cwd=tmp_path)
    assert patched.code == 0, patched.err
    assert "worker privateuseone:0 cpu" in patched.out and "exit code 0" in patched.out
