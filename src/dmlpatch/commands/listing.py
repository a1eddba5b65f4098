"""``dmlpatch list``: the patch catalogue, each spec against the installed library."""

from __future__ import annotations

from typing import Any

from dmlpatch._metadata import version_of
from dmlpatch.specs import loading


def catalogue() -> list[dict[str, Any]]:
    rows = []
    for spec in loading.load_all():
        installed = version_of(spec.distribution)
        matches = None if installed is None else spec.versions.contains(installed, prereleases=True)
        entries: list[dict[str, Any]] = []
        entries += [
            {
                "kind": "rewrite",
                "modules": list(r.modules),
                "expect_sites": r.expect_sites,
                "versions": str(r.versions),
                "why": r.why,
            }
            for r in spec.rewrites
        ]
        entries += [
            {
                "kind": "wrap",
                "target": w.target,
                "fix": w.fix,
                "versions": str(w.versions),
                "why": w.why,
            }
            for w in spec.wraps
        ]
        entries += [
            {
                "kind": "alias",
                "module": a.module,
                "target": a.target,
                "versions": str(a.versions),
                "why": a.why,
            }
            for a in spec.aliases
        ]
        rows.append(
            {
                "name": spec.name,
                "distribution": spec.distribution,
                "versions": str(spec.versions) or "any",
                "installed": installed,
                "status": _status(installed, matches),
                "origin": spec.origin,
                "why": spec.why,
                "entries": entries,
            }
        )
    return rows


def _status(installed: Any, matches: Any) -> str:
    if installed is None:
        return "not installed"
    return "active" if matches else "version not covered: runs unpatched"


def format_catalogue(rows: list[dict[str, Any]]) -> str:
    lines = []
    for row in rows:
        installed = row["installed"] or "-"
        lines.append(
            f"{row['name']}: {row['distribution']} {row['versions']} "
            f"(installed {installed}; {row['status']})"
        )
        if row["why"]:
            lines.append(f"    {row['why']}")
        for entry in row["entries"]:
            if entry["kind"] == "rewrite":
                what = f"rewrite {', '.join(entry['modules'])} (>= {entry['expect_sites']} sites)"
            elif entry["kind"] == "wrap":
                what = f"wrap {entry['target']} with {entry['fix']}"
            else:
                what = f"alias {entry['module']} -> {entry['target']}"
            gate = f" [{entry['versions']}]" if entry["versions"] else ""
            lines.append(f"  - {what}{gate}: {entry['why']}")
    return "\n".join(lines)
