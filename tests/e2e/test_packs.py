"""Third-party patch packs: a pip-installed package ships specs and fixes through the
``dmlpatch.patches`` entry-point group; a broken pack is skipped with one warning."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from support import clean_env, linked_venv, run_python

TARGET = {
    "pyproject.toml": """
        [build-system]
        requires = ["setuptools"]
        build-backend = "setuptools.build_meta"
        [project]
        name = "cudalib"
        version = "2.0"
        [tool.setuptools]
        py-modules = ["cudalib"]
        """,
    "cudalib.py": """
        import torch

        def pick():
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")

        def load(name, device="cuda"):
            return name, device
        """,
}

SPEC = """
    [package]
    name = "cudalib"
    versions = ">=2,<3"
    why = "a CUDA-only library"
    [[rewrite]]
    modules = ["cudalib"]
    expect_sites = 3
    why = "pick() and load() hard-code CUDA"
    [[wrap]]
    target = "cudalib:load"
    fix = "cudapack.fixes:tag"
    why = "marks calls so the test can see the fix ran"
    """


def _pack(spec: str, fix_module: str = "fixes") -> dict[str, str]:
    return {
        "pyproject.toml": """
            [build-system]
            requires = ["setuptools"]
            build-backend = "setuptools.build_meta"
            [project]
            name = "cudapack"
            version = "0.1"
            [project.entry-points."dmlpatch.patches"]
            cudapack = "cudapack.specs"
            [tool.setuptools]
            packages = ["cudapack", "cudapack.specs"]
            [tool.setuptools.package-data]
            "cudapack.specs" = ["*.toml"]
            """,
        "cudapack/__init__.py": "",
        f"cudapack/{fix_module}.py": """
            def tag(wrapped, instance, args, kwargs):
                name, device = wrapped(*args, **kwargs)
                return f"fixed:{name}", device
            """,
        "cudapack/specs/__init__.py": "",
        "cudapack/specs/cudalib.toml": spec,
    }


def _project(root: Path, files: dict[str, str]) -> Path:
    for relative, content in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(content).lstrip("\n"))
    return root


def _install(python: str, project: Path) -> None:
    result = run_python(
        [
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--disable-pip-version-check",
            str(project),
        ],
        python=python,
    )
    assert result.code == 0, result.err


@pytest.fixture(scope="module")
def venv_with_target(tmp_path_factory) -> Iterator[str]:
    for python, _ in linked_venv():
        _install(python, _project(tmp_path_factory.mktemp("cudalib"), TARGET))
        yield python


PROGRAM = "import cudalib; print(cudalib.pick(), cudalib.load('w'))\n"


def _run(python: str, tmp_path: Path, **env: str) -> tuple[int, str, list[str]]:
    script = tmp_path / "program.py"
    script.write_text(PROGRAM)
    result = run_python(
        ["-m", "dmlpatch", "--device", "sim", str(script)], python=python, env=clean_env(**env)
    )
    return result.code, result.out, result.err_lines


def test_installed_pack_patches_its_library(venv_with_target: str, tmp_path: Path) -> None:
    python = venv_with_target
    _install(python, _project(tmp_path / "pack", _pack(SPEC)))
    try:
        code, out, err = _run(python, tmp_path)
        assert code == 0, err
        assert out == "privateuseone:0 ('fixed:w', 'privateuseone:0')\n"
        listing = run_python(["-m", "dmlpatch", "list"], python=python)
        assert "cudalib: cudalib <3,>=2 (installed 2.0; active)" in listing.out

        # Without the pack its fix is gone; discovery still rewrites the library's sites,
        # unless the scope is only what specs name.
        code, out, err = _run(python, tmp_path, DMLPATCH_DISABLE_PATCHES="cudapack")
        assert code == 0 and out == "privateuseone:0 ('w', 'privateuseone:0')\n"
        code, out, err = _run(
            python, tmp_path, DMLPATCH_DISABLE_PATCHES="cudapack", DMLPATCH_SCOPE="specs"
        )
        assert code == 0 and out == "cpu ('w', 'cuda')\n"
    finally:
        run_python(["-m", "pip", "uninstall", "--quiet", "-y", "cudapack"], python=python)


@pytest.mark.parametrize(
    ("spec", "fix_module", "reason"),
    [
        (
            SPEC.replace("expect_sites = 3", "expect_sites = -3"),
            "fixes",
            "field 'rewrite[0].expect_sites' must be a whole number >= 0",
        ),
        (SPEC, "renamed", "its fix cudapack.fixes:tag cannot be imported (module not found)"),
    ],
)
def test_broken_pack_is_skipped_with_one_warning(
    venv_with_target: str, tmp_path: Path, spec: str, fix_module: str, reason: str
) -> None:
    python = venv_with_target
    _install(python, _project(tmp_path / "pack", _pack(spec, fix_module)))
    try:
        code, out, err = _run(python, tmp_path)
        assert code == 0, err
        assert out == "privateuseone:0 ('w', 'privateuseone:0')\n"  # discovered, not fixed
        code, out, err = _run(python, tmp_path, DMLPATCH_SCOPE="specs")
        assert code == 0, err
        assert out == "cpu ('w', 'cuda')\n"
        warnings = [line for line in err if "warning" in line]
        assert len(warnings) == 1
        assert warnings[0].startswith("dmlpatch: warning: patch pack 'cudapack' skipped: ")
        assert reason in warnings[0]
    finally:
        run_python(["-m", "pip", "uninstall", "--quiet", "-y", "cudapack"], python=python)
