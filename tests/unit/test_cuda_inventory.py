"""docs/reference/torch-cuda.md, the inventory of every public ``torch.cuda`` name, holds for the
running torch and for what the rewriter and the runtime really do with each name."""

from __future__ import annotations

import pytest
import torch

from corpus._harness import accelerator
from dmlpatch.devices import resolution
from dmlpatch.rewriting import cuda_inventory
from dmlpatch.rewriting.transform import rewrite
from dmlpatch.runtime import cuda_api
from dmlpatch.runtime import sites as runtime

from support import REPO

DOC = REPO / "docs" / "reference" / "torch-cuda.md"
VERSION = torch.__version__.split("+")[0]


@pytest.fixture(scope="module")
def rows() -> dict[str, dict]:
    return cuda_inventory.parse(DOC.read_text(encoding="utf-8"))


def test_the_running_torch_has_its_column_and_every_public_name_a_row(rows) -> None:
    versions = set().union(*(row["versions"] for row in rows.values()))
    assert VERSION in versions, (
        f"docs/reference/torch-cuda.md has no column for torch {VERSION}: "
        "run scripts/cuda_inventory.py"
    )
    listed = sorted(name for name, row in rows.items() if VERSION in row["versions"])
    assert listed == cuda_inventory.public_names(torch.cuda)


def test_each_row_says_what_dmlpatch_does_now(rows) -> None:
    assert {name: (row["mark"], row["how"]) for name, row in rows.items()} == {
        name: cuda_inventory.classify(name) for name in rows
    }
    columns: dict[str, list[str]] = {}
    for name, row in rows.items():
        for version in row["versions"]:
            columns.setdefault(version, []).append(name)
    ordered = {v: columns[v] for v in sorted(columns, key=lambda v: tuple(map(int, v.split("."))))}
    assert cuda_inventory.markdown(ordered) in DOC.read_text(encoding="utf-8")


def _function_using(name: str) -> str:
    return f"import torch\n\ndef f(x):\n    x.cuda()\n    return torch.cuda.{name}\n"


@pytest.mark.parametrize("name", cuda_inventory.public_names(torch.cuda))
def test_the_rewriter_keeps_cuda_s_meaning_exactly_for_those_marked_so(name: str) -> None:
    mark, _ = cuda_inventory.classify(name)
    kept = rewrite(_function_using(name)).kept
    assert kept == ((("f", (name,)),) if mark == cuda_inventory.CUDA_MEANING else ())


def test_answered_names_are_answered_and_errors_raise_on_the_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(resolution, "current", lambda: accelerator(0))
    for name in cuda_inventory.public_names(torch.cuda):
        mark, _ = cuda_inventory.classify(name)
        if mark == cuda_inventory.ERROR:
            with pytest.raises(RuntimeError, match="CUDA graphs have no DirectML counterpart"):
                getattr(cuda_api, name)()
        elif name in runtime.CUDA_FUNCTIONS:
            assert callable(getattr(runtime, name))
        elif mark == cuda_inventory.ANSWERED and name not in runtime.HARMLESS_CUDA_NAMES:
            assert name in vars(cuda_api) or name == "default_generators", name
