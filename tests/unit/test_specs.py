"""Patch spec loading and validation: a broken spec names its file and field."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from dmlpatch.errors import SpecError
from dmlpatch.specs import loading

GOOD = """
[package]
name = "facexlib"
versions = ">=0.2.5,<0.4"
why = "face detection and parsing helpers used by GFPGAN"

[[rewrite]]
modules = ["facexlib.detection.retinaface", "facexlib.utils.face_restoration_helper"]
expect_sites = 1
why = "picks its own device: torch.device('cuda' if torch.cuda.is_available() else 'cpu')"

[[wrap]]
target = "facexlib.detection:init_detection_model"
fix = "dmlpatch.patches.facexlib.fixes:download_hint"
versions = ">=0.3"
why = "default device='cuda'"
"""


def _write(tmp_path: Path, text: str, name: str = "lib.toml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def test_good_spec_loads_every_field(tmp_path: Path) -> None:
    spec = loading.load_file(_write(tmp_path, GOOD, "facexlib.toml"))
    assert spec.name == "facexlib"
    assert spec.distribution == "facexlib"
    assert spec.versions.contains("0.3.0") and not spec.versions.contains("0.4.0")
    assert spec.modules() == [
        "facexlib.detection.retinaface",
        "facexlib.utils.face_restoration_helper",
    ]
    (rule,) = spec.rewrites
    assert rule.expect_sites == 1
    (wrap,) = spec.wraps
    assert (wrap.module, wrap.qualname) == ("facexlib.detection", "init_detection_model")
    assert wrap.versions.contains("0.3.0") and not wrap.versions.contains("0.2.5")
    assert len(spec.fingerprint) == 16


def test_fingerprint_changes_with_content(tmp_path: Path) -> None:
    first = loading.load_file(_write(tmp_path, GOOD, "a.toml")).fingerprint
    second = loading.load_file(_write(tmp_path, GOOD + "\n# edited\n", "b.toml")).fingerprint
    assert first != second


@pytest.mark.parametrize(
    ("edit", "field", "problem"),
    [
        (lambda t: t.replace('name = "facexlib"', "name = 3"), "package.name", "non-empty string"),
        (lambda t: t.replace('">=0.2.5,<0.4"', '"newest"'), "package.versions", "not a valid"),
        (
            lambda t: t.replace("expect_sites = 1", "expect_sites = -1"),
            "rewrite[0].expect_sites",
            ">= 0",
        ),
        (
            lambda t: t.replace("expect_sites = 1", "expect_sites = true"),
            "rewrite[0].expect_sites",
            "",
        ),
        (
            lambda t: t.replace('"facexlib.detection.retinaface",', '"facexlib/retinaface.py",'),
            "rewrite[0].modules",
            "not a dotted module name",
        ),
        (
            lambda t: t.replace("modules = [", "modules = [1, "),
            "rewrite[0].modules",
            "list of strings",
        ),
        (
            lambda t: t.replace(
                'target = "facexlib.detection:init_detection_model"',
                'target = "facexlib.detection.init_detection_model"',
            ),
            "wrap[0].target",
            "is not 'module:qualified.name'",
        ),
        (
            lambda t: t.replace("why = \"default device='cuda'\"", ""),
            "wrap[0].why",
            "non-empty string",
        ),
        (
            lambda t: t.replace("expect_sites = 1", "expect_sites = 1\nexpected = 2"),
            "rewrite[0]",
            "unknown key(s) expected",
        ),
        (lambda t: t + "\n[extra]\nx = 1\n", "the top level", "unknown key(s) extra"),
        (lambda t: t.replace("[package]", "[pkg]"), "package", "missing"),
    ],
)
def test_malformed_spec_names_file_and_field(
    tmp_path: Path, edit, field: str, problem: str
) -> None:
    path = _write(tmp_path, edit(textwrap.dedent(GOOD)))
    with pytest.raises(SpecError) as caught:
        loading.load_file(path)
    message = str(caught.value)
    assert message.startswith(f"patch spec {path}: field {field!r}")
    assert problem in message
    assert "\n" not in message


def test_invalid_toml(tmp_path: Path) -> None:
    path = _write(tmp_path, "[package\nname=")
    with pytest.raises(SpecError, match=r"not valid TOML"):
        loading.load_file(path)


def test_spec_without_entries_is_refused(tmp_path: Path) -> None:
    path = _write(tmp_path, '[package]\nname = "x"\n')
    with pytest.raises(
        SpecError,
        match=r"at least one \[\[rewrite\]\], \[\[wrap\]\], \[\[alias\]\] or \[\[leave\]\] entry",
    ):
        loading.load_file(path)


def test_environment_directories_and_disabling(tmp_path: Path, monkeypatch) -> None:
    first = tmp_path / "one"
    first.mkdir()
    _write(first, GOOD, "testlib.toml")
    monkeypatch.setenv("DMLPATCH_PATCHES", str(first))
    names = [spec.name for spec in loading.load_all()]
    assert "testlib" in names
    monkeypatch.setenv("DMLPATCH_DISABLE_PATCHES", "testlib")
    assert "testlib" not in [spec.name for spec in loading.load_all()]


def test_local_directory_overrides_a_builtin_spec(tmp_path: Path, monkeypatch) -> None:
    builtin = loading.builtin_directory()
    assert builtin is not None
    name = loading.spec_name(loading.specs_in(builtin)[0])
    _write(tmp_path, GOOD, f"{name}.toml")
    monkeypatch.setenv("DMLPATCH_PATCHES", str(tmp_path))
    (chosen,) = [spec for spec in loading.load_all() if spec.name == name]
    assert chosen.origin == str(tmp_path / f"{name}.toml")


def test_duplicate_names_and_missing_directory(tmp_path: Path, monkeypatch) -> None:
    first, second = tmp_path / "one", tmp_path / "two"
    for directory in (first, second):
        directory.mkdir()
        _write(directory, GOOD, "dup.toml")
    # One local override of a name is allowed; a third spec of that name is a clash.
    third = tmp_path / "three"
    third.mkdir()
    _write(third, GOOD, "dup.toml")
    monkeypatch.setenv("DMLPATCH_PATCHES", f"{first}:{second}:{third}")
    with pytest.raises(SpecError, match="two patch specs are named 'dup'"):
        loading.load_all()
    monkeypatch.setenv("DMLPATCH_PATCHES", str(tmp_path / "absent"))
    with pytest.raises(SpecError, match="not a directory"):
        loading.load_all()


def test_builtin_specs_are_valid() -> None:
    directory = loading.builtin_directory()
    assert directory is not None
    paths = loading.specs_in(directory)
    assert {loading.spec_name(path) for path in paths} >= {"torch", "ultralytics", "gfpgan"}
    for path in paths:
        loading.load_file(path)


def test_every_fix_the_specs_and_their_readme_name_exists() -> None:
    """A fix named in a built-in spec or in the spec format's documentation resolves."""
    import pkgutil
    import re

    directory = loading.builtin_directory()
    assert directory is not None
    named = {w.fix for path in loading.specs_in(directory) for w in loading.load_file(path).wraps}
    readme = (directory / "README.md").read_text(encoding="utf-8")
    documented = set(re.findall(r'^fix = "([^"]+)"', readme, re.M))
    assert documented, "the README shows a [[wrap]] entry"
    for reference in sorted(named | documented):
        assert callable(pkgutil.resolve_name(reference)), reference
