"""The README's "Known to work" table against what the suite installs and runs: every library
``scripts/setup.sh`` installs for the tests to run is a row with that version, every version a
row gives is the one installed, and every test file a row names exists and uses the library.
The patch-specs page (docs/reference/patch-specs.md) names every spec that ships."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

#: Installed for the libraries the suite runs, not run themselves (each: why it is pinned).
SUPPORT = {
    "setuptools": "basicsr's build; pkg_resources for yolov5",
    "wheel": "basicsr's build",
    "cython": "basicsr's build",
    "numpy": "basicsr's build",
    "cloudpickle": "ultralytics 8.4 pickles its DDP trainer with it",
    "pandas": "ultralytics 8.1 and yolov5 import it",
    "seaborn": "ultralytics 8.1 and yolov5 import it",
    "py-cpuinfo": "ultralytics 8.1 imports it",
    "huggingface-hub": "the release yolov5 accepts",
    "roboflow": "yolov5's train.py imports it",
    "requests-toolbelt": "roboflow imports it",
    "python-dotenv": "roboflow imports it",
    "pillow-avif-plugin": "roboflow imports it",
    "tokenizers": "the release transformers 5.24 needs, beside it",
    "httpx2": "transformers 5.24's HTTP client",
    "httpcore2": "transformers 5.24's HTTP client",
    "truststore": "transformers 5.24's HTTP client",
    "wadler-lindig": "jaxtyping imports it",
    "click": "lightning's fabric CLI imports it",
}
#: The module a library's tests import, where it differs from its name.
MODULES = {
    "openai-whisper": "whisper",
    "sentence-transformers": "sentence_transformers",
    "pytorch-lightning": "pytorch_lightning",
}


def _pins() -> dict[str, set[str]]:
    """Every ``name==version`` setup.sh installs (ultralytics twice: 8.4 and 8.1 beside it)."""
    text = (REPO / "scripts" / "setup.sh").read_text(encoding="utf-8")
    pins: dict[str, set[str]] = {}
    for name, version in re.findall(r"([A-Za-z][\w.-]*)==([\w.]+)", text):
        pins.setdefault(name.lower(), set()).add(version)
    return pins


def _rows() -> list[list[str]]:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split("## Known to work", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("| ")]
    return [[cell.strip() for cell in line.strip("|").split(" | ")] for line in lines[2:]]


def _versions(cell: str) -> list[tuple[str, str]]:
    pairs = [part.strip().rsplit(" ", 1) for part in cell.split(",")]
    return [(pair[0], pair[1]) for pair in pairs]


def test_every_library_the_suite_installs_is_a_row_with_its_version() -> None:
    pins = {name: versions for name, versions in _pins().items() if name not in SUPPORT}
    listed: dict[str, set[str]] = {}
    for row in _rows():
        for name, version in _versions(row[1]):
            listed.setdefault(name.lower(), set()).add(version)
    assert listed == pins


def test_every_row_names_tests_that_exist_and_use_it() -> None:
    for row in _rows():
        paths = re.findall(r"`([^`]+\.py)`", row[3])
        assert paths, row
        names = [MODULES.get(name.lower(), name.lower()) for name, _ in _versions(row[1])]
        names += [Path(program).stem for program in re.findall(r"`([^`]+)`", row[0])]
        for path in paths:
            source = (REPO / path).read_text(encoding="utf-8")
            assert any(name.replace("-", "_") in source.lower() for name in names), (path, names)


def test_built_in_specs_are_all_named() -> None:
    text = (REPO / "docs" / "reference" / "patch-specs.md").read_text(encoding="utf-8")
    sentence = text.split("Built in: ", 1)[1].split("\n\n", 1)[0]
    specs = sorted(
        p.parent.name for p in (REPO / "src" / "dmlpatch" / "patches").glob("*/spec.toml")
    )
    assert specs, "no spec found"
    for name in specs:
        assert f"`{name}`" in sentence, name
