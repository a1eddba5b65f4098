"""``dmlpatch scan`` and ``dmlpatch list``: static, import-free views of CUDA sites and specs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dmlpatch._metadata import version_of
from dmlpatch.commands import scan
from dmlpatch.specs import loading

from support import run_python

TREE = {
    "pkg/__init__.py": "",
    "pkg/model.py": (
        "import torch\n"
        "\n"
        "def pick(device='cuda'):\n"
        "    return torch.device('cuda' if torch.cuda.is_available() else 'cpu')\n"
    ),
    "pkg/ops/__init__.py": "",
    "pkg/ops/act.py": (
        "def act(x):\n"
        "    if x.device.type == 'cpu':\n"
        "        return x.relu()\n"
        "    return cuda_ext.act(x)\n"
        "print('cuda is great')\n"
    ),
}


def _tree(tmp_path: Path) -> Path:
    for relative, content in TREE.items():
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    return tmp_path / "pkg"


def test_scan_a_source_tree_lists_every_site_and_branch(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    result = run_python(["-m", "dmlpatch", "scan", str(root)])
    assert result.code == 0, result.err
    model, act = root / "model.py", root / "ops" / "act.py"
    assert result.out.splitlines() == [
        f"{model}:3: device_literal: 'cuda'",
        f"{model}:4: device_literal: 'cuda'",
        f"{model}:4: is_available: torch.cuda.is_available()",
        f"{act}:2: cuda_branch: x.device.type == 'cpu'",
    ]
    assert result.err_lines == [f"dmlpatch: {root}: 3 CUDA device site(s), 1 CUDA-only branch(es)"]


def test_spec_skeleton_is_a_valid_spec(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    result = run_python(["-m", "dmlpatch", "scan", str(root), "--spec"])
    assert result.code == 0, result.err
    path = tmp_path / "pkg.toml"
    path.write_text(result.out)
    spec = loading.load_file(path)
    assert [(r.modules, r.expect_sites) for r in spec.rewrites] == [(("model",), 3)]
    assert "# [[wrap]]" in result.out and 'target = "ops.act:FUNCTION"' in result.out


def _rewrite_rules() -> list[tuple[str, str, int]]:
    rules = []
    for spec in loading.load_all():
        installed = version_of(spec.distribution)
        if installed is None or not spec.versions.contains(installed, prereleases=True):
            continue
        for rule in spec.rewrites:
            if rule.versions.contains(installed, prereleases=True):
                rules.extend((spec.name, module, rule.expect_sites) for module in rule.modules)
    return rules


def test_there_are_installed_targets_to_check() -> None:
    assert len(_rewrite_rules()) >= 10


@pytest.mark.parametrize(("spec", "module", "expected"), _rewrite_rules())
def test_scan_finds_every_site_the_specs_rely_on(spec: str, module: str, expected: int) -> None:
    found = [f for f in scan.scan(module) if f.kind != "cuda_branch" and f.module == module]
    assert len(found) >= expected, f"{spec}: {module}"


def test_list_reports_every_spec_against_installed_versions() -> None:
    result = run_python(["-m", "dmlpatch", "list", "--json"])
    assert result.code == 0, result.err
    rows = {row["name"]: row for row in json.loads(result.out)}
    assert set(rows) == {spec.name for spec in loading.load_all()}
    for row in rows.values():
        assert row["installed"] == version_of(row["distribution"])
        assert row["status"] in {"active", "not installed", "version not covered: runs unpatched"}
        assert all(entry["why"] for entry in row["entries"])
    text = run_python(["-m", "dmlpatch", "list"])
    assert text.code == 0
    assert all(f"{name}: " in text.out for name in rows)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["scan", "no_such_package_xyz"], "no installed package or path named"),
        (["scan", "torch.no_such_module"], "no module named 'torch.no_such_module'"),
        (["scan"], "usage: dmlpatch scan"),
        (["scan", "facexlib", "--frob"], "usage: dmlpatch scan"),
        (["list", "--frob"], "list takes only --json"),
    ],
)
def test_bad_input(args: list[str], message: str) -> None:
    result = run_python(["-m", "dmlpatch", *args])
    assert result.code == 2
    assert len(result.err_lines) == 1 and message in result.err_lines[0]


#: A torchvision that still ships io/video_reader.py (torch-directml's 0.19.1; 0.29 does not)
#: has a VideoReader whose "cuda" backend decodes on a CUDA device: its seven sites, which no
#: program reaches without that decoder built in.
VIDEO_READER_SITES = [128, 140, 147, 148, 183, 224, 278]


def test_scan_of_a_library_without_cuda_device_sites_is_quiet() -> None:
    """torchvision decides devices from its inputs: nothing to rewrite, no false positives."""
    import torchvision.io

    result = run_python(["-m", "dmlpatch", "scan", "torchvision"])
    assert result.code == 0, result.err
    has_reader = (Path(torchvision.io.__file__).parent / "video_reader.py").is_file()
    expected = [f"io/video_reader.py:{n}" for n in VIDEO_READER_SITES] if has_reader else []
    found = [line.split("torchvision/", 1)[-1].split(": ")[0] for line in result.out.splitlines()]
    assert found == expected
    assert result.err_lines == [
        f"dmlpatch: torchvision: {len(expected)} CUDA device site(s), 0 CUDA-only branch(es)"
    ]
