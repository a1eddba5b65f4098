"""The cached plan: entries are the records that read them back, keyed on those records' fields."""

from __future__ import annotations

import collections
import marshal
from pathlib import Path
from typing import Any

import pytest

from dmlpatch.rewriting.hook import ModuleTarget
from dmlpatch.specs import plan


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DMLPATCH_CACHE_DIR", str(tmp_path))
    return tmp_path / "plans"


def _builds(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = plan.build

    def counted() -> dict[str, Any]:
        calls.append(1)
        return real()

    monkeypatch.setattr(plan, "build", counted)
    return calls


def test_entries_read_back_as_their_records(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    built = plan.load()
    targets = [ModuleTarget._make(entry) for entry in built["targets"]]
    basicsr = [t for t in targets if t.spec == "basicsr"]
    assert basicsr, "the built-in basicsr spec names rewrite targets"
    assert all(t.module.startswith("basicsr.") and t.expect_sites >= 1 for t in basicsr)
    assert all(t.runtime == "dmlpatch.runtime.sites" for t in basicsr)
    fixes = [plan.RECORDS["wraps"]._make(entry) for entry in built["wraps"]]
    assert all(":" in f.target and f.fix.startswith("dmlpatch.patches.") for f in fixes)

    calls = _builds(monkeypatch)
    assert plan.load() == built
    assert calls == [], "a warm load reads the cache"


def test_a_record_with_another_layout_makes_the_cache_a_miss(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = plan.load()
    (written,) = cache.glob("*.plan")
    calls = _builds(monkeypatch)
    # A later dmlpatch whose target record gained a field before `spec`: an old cache read
    # positionally would put the spec name into that field.
    grown = collections.namedtuple(
        "ModuleTarget", ["module", "origin", "spec", "expect_sites", "fingerprint", "runtime"]
    )
    monkeypatch.setitem(plan.RECORDS, "targets", grown)
    assert plan.layout() != first["layout"]
    again = plan.load()
    assert calls == [1], "the old cache was not reused"
    assert again["layout"] == plan.layout()
    assert marshal.loads(written.read_bytes())["layout"] == plan.layout()


def test_a_cache_from_before_layouts_is_a_miss(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan.load()
    (written,) = cache.glob("*.plan")
    old = marshal.loads(written.read_bytes())
    old.pop("layout")
    old["format"] = 2  # what dmlpatch 0.1.0 wrote: positional lists, no layout
    written.write_bytes(marshal.dumps(old))
    calls = _builds(monkeypatch)
    plan.load()
    assert calls == [1]
