"""``dmlpatch scan``: find CUDA device sites in a package or source tree, without importing it.

The sites are found by the same code that rewrites them (``dmlpatch.rewriting.transform``),
with the program's own code (outside site-packages) taken as the runner takes it, so what
``scan`` lists is exactly what a run would change. It also lists CUDA-only branches the
rewriter leaves alone (``x.device.type == 'cpu'`` tests with a CUDA else), which usually need
a ``[[wrap]]`` fix instead.
"""

from __future__ import annotations

import ast
import importlib.util
import os
from collections.abc import Iterator
from typing import NamedTuple, Optional

from dmlpatch.errors import UsageError
from dmlpatch.rewriting.discovery import is_program_path
from dmlpatch.rewriting.transform import rewrite


class Finding(NamedTuple):
    path: str
    module: str
    line: int
    kind: str
    text: str


def locate(target: str) -> tuple[str, str]:
    """(directory or file, dotted module prefix) for an installed package or a path."""
    if os.path.exists(target):
        path = os.path.abspath(target)
        return path, "" if os.path.isdir(path) else _stem(path)
    if not all(part.isidentifier() for part in target.split(".")):
        raise UsageError(f"scan: {target!r} is neither an existing path nor a package name")
    top, _, rest = target.partition(".")
    # find_spec of a top-level name imports nothing; of a dotted name it would import parents.
    spec = importlib.util.find_spec(top)
    if spec is None:
        raise UsageError(f"scan: no installed package or path named {target!r}")
    if spec.submodule_search_locations:
        base = os.path.join(
            next(iter(spec.submodule_search_locations)), *rest.split(".") if rest else []
        )
        for candidate in (base, base + ".py"):
            if os.path.isdir(candidate) or os.path.isfile(candidate):
                return candidate, target
        raise UsageError(f"scan: no module named {target!r}")
    if rest or spec.origin is None or not spec.origin.endswith(".py"):
        raise UsageError(f"scan: {target!r} has no Python source to scan")
    return spec.origin, target


def scan(target: str) -> list[Finding]:
    root, prefix = locate(target)
    findings: list[Finding] = []
    for path, module in _sources(root, prefix):
        try:
            with open(path, "rb") as stream:
                source = stream.read()
        except OSError as error:
            raise UsageError(f"scan: cannot read {path}: {error.strerror}") from None
        try:
            sites = rewrite(source, path, program=is_program_path(path)).sites
            tree = ast.parse(source, path)
        except (SyntaxError, ValueError):
            continue  # not Python this interpreter can parse: nothing the rewriter would touch
        findings.extend(Finding(path, module, s.line, s.kind, s.text) for s in sites)
        findings.extend(
            Finding(path, module, line, "cuda_branch", text) for line, text in _branches(tree)
        )
    return sorted(findings, key=lambda f: (f.path, f.line, f.kind))


def _sources(root: str, prefix: str) -> Iterator[tuple[str, str]]:
    if os.path.isfile(root):
        yield root, prefix or _stem(root)
        return
    for directory, subdirectories, files in os.walk(root):
        subdirectories[:] = sorted(
            d for d in subdirectories if not d.startswith((".", "__pycache__"))
        )
        relative = os.path.relpath(directory, root)
        parts = [] if relative == "." else relative.split(os.sep)
        for name in sorted(files):
            if name.endswith(".py"):
                stem = name[:-3]
                dotted = [*([prefix] if prefix else []), *parts]
                if stem != "__init__":
                    dotted.append(stem)
                yield os.path.join(directory, name), ".".join(dotted) or stem


def _stem(path: str) -> str:
    return os.path.splitext(os.path.basename(path))[0]


def _branches(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """``if <device>.type == 'cpu': ... else: <CUDA path>``, its ``!=`` twin, and the
    early-return form (``if ... == 'cpu': return <CPU path>`` followed by the CUDA path)."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.If):
            continue
        if not node.orelse and not isinstance(node.body[-1], ast.Return):
            continue
        test = node.test
        if (
            isinstance(test, ast.Compare)
            and len(test.ops) == 1
            and isinstance(test.ops[0], (ast.Eq, ast.NotEq))
            and isinstance(test.left, ast.Attribute)
            and test.left.attr == "type"
            and isinstance(test.comparators[0], ast.Constant)
            and test.comparators[0].value == "cpu"
        ):
            yield node.lineno, ast.unparse(test)


def spec_skeleton(target: str, findings: list[Finding]) -> str:
    """A ready-to-edit patch spec for what ``scan`` found."""
    from dmlpatch._metadata import distribution_of, version_of

    top = target.partition(".")[0]
    distribution = distribution_of(top) if not os.path.exists(target) else None
    name = distribution or top
    version = version_of(name) if distribution else None
    counts: dict[str, int] = {}
    for finding in findings:
        if finding.kind != "cuda_branch":
            counts[finding.module] = counts.get(finding.module, 0) + 1
    lines = [
        "[package]",
        f'name = "{name}"',
        f'versions = "=={version}"' if version else 'versions = ""',
        'why = "TODO: what the library is and what breaks on DirectML without this spec"',
    ]
    for module, count in counts.items():
        lines += [
            "",
            "[[rewrite]]",
            f'modules = ["{module}"]',
            f"expect_sites = {count}",
            'why = "TODO: the error a user sees without it"',
        ]
    branches = [f for f in findings if f.kind == "cuda_branch"]
    for finding in branches:
        lines += [
            "",
            f"# {os.path.basename(finding.path)}:{finding.line}: "
            f"CUDA-only branch `{finding.text}`;",
            "# the rewriter leaves it alone: wrap the function that holds it.",
            "# [[wrap]]",
            f'# target = "{finding.module}:FUNCTION"',
            '# fix = "your_package.fixes:FIX"',
            '# why = "TODO"',
        ]
    return "\n".join(lines) + "\n"


def format_findings(findings: list[Finding], base: Optional[str] = None) -> str:
    rows = []
    for finding in findings:
        where = os.path.relpath(finding.path, base) if base else finding.path
        rows.append(f"{where}:{finding.line}: {finding.kind}: {finding.text}")
    return "\n".join(rows)
