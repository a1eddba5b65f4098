"""The report's page (docs/reference/report.md) lists exactly the fields its types
(:mod:`dmlpatch.report_types`, what mypy checks the report's builders and readers by) declare:
a field typed but not documented, or documented but not typed, fails. ``test_report_page.py``
checks the same table against real runs; this one also covers fields those runs never write."""

from __future__ import annotations

import re
from typing import Annotated, Any, Union, get_args, get_origin, get_type_hints

from dmlpatch import report_types

from support import REPO

PAGE = REPO / "docs" / "reference" / "report.md"
#: A row of the page's table of fields: | `compute.cpu_lines[].at` | meaning |
_ROW = re.compile(r"^\| `(?P<field>[^`]+)` \|", re.MULTILINE)


def documented() -> list[str]:
    """The fields the page's table lists, as it writes them (``compute.lines[].cpu.calls``)."""
    text = PAGE.read_text(encoding="utf-8")
    return _ROW.findall(text[text.index("\n## Fields\n") :])


def typed(shape: Any, path: str = "") -> list[str]:
    """Every field below ``path`` that ``shape`` declares, at any depth, written as the page
    writes it: a list's items under ``[]``, a key that is data as its ``<name>``."""
    if get_origin(shape) is Union:
        present = [arm for arm in get_args(shape) if arm is not type(None)]
        assert len(present) == 1, f"{path} is one type or None, not {shape}"
        return typed(present[0], path)
    if get_origin(shape) is list:
        return typed(get_args(shape)[0], f"{path}[]")
    if get_origin(shape) is dict:
        key, value = get_args(shape)
        assert get_origin(key) is Annotated, f"{path}: a key that is data is named (Annotated)"
        field = f"{path}.{key.__metadata__[0]}"
        return [field, *typed(value, field)]
    if isinstance(shape, type) and issubclass(shape, dict):  # a TypedDict
        fields = []
        for name, value in get_type_hints(shape, include_extras=True).items():
            field = f"{path}.{name}" if path else name
            fields += [field, *typed(value, field)]
        return fields
    return []


def test_the_type_walk_reads_lists_data_keys_and_optional_fields() -> None:
    assert typed(report_types.Transfers, "transfers") == [
        "transfers.program",
        "transfers.program.<direction>",
        "transfers.program.<direction>.count",
        "transfers.program.<direction>.bytes",
        "transfers.fallback",
        "transfers.fallback.count",
        "transfers.fallback.bytes",
        "transfers.fallback.by_operator",
        "transfers.fallback.by_operator.<operator>",
        "transfers.fallback.by_operator.<operator>.count",
        "transfers.fallback.by_operator.<operator>.bytes",
        "transfers.syncs",
    ]
    assert "rewritten[].spec" in typed(report_types.Report)  # a total=False field
    assert "compute.lines[].fallbacks[].copies" in typed(report_types.Report)


def test_the_report_page_documents_every_typed_field_and_no_other() -> None:
    fields = documented()
    assert len(fields) == len(set(fields)), "a field the page lists twice"
    declared = typed(report_types.Report)
    undocumented = sorted(set(declared) - set(fields))
    untyped = sorted(set(fields) - set(declared))
    assert (undocumented, untyped) == ([], []), (
        f"typed in dmlpatch.report_types, not on {PAGE.name}; on it, not typed"
    )
