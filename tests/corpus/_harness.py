"""What the rewrite, hook and cache tests share. Not an idiom file: it carries no site markers."""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import sys
import textwrap
import types
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from dmlpatch import report
from dmlpatch.devices import resolution
from dmlpatch.rewriting import hook
from dmlpatch.rewriting.hook import ModuleTarget

CORPUS = Path(__file__).resolve().parent
_MARKER = re.compile(r"# site: ([a-z_]+(?:, [a-z_]+)*)")


def idiom_files() -> list[Path]:
    return sorted(path for path in CORPUS.glob("*.py") if not path.name.startswith("_"))


def marked_sites(path: Path) -> list[tuple[int, str]]:
    """``(line, kind)`` for every ``# site: kind, kind`` marker, in line order."""
    expected = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        match = _MARKER.search(line)
        if match is not None:
            expected += [(number, kind) for kind in match.group(1).split(", ")]
    return expected


def accelerator(*indices: int) -> resolution.Resolution:
    """A resolution that says "accelerator", for checking where rewritten code routes."""
    indices = indices or (0,)
    return resolution.Resolution(
        spec="sim",
        backend="sim",
        type="privateuseone",
        indices=indices,
        names=tuple(f"Fake adapter {i}" for i in indices),
        why="test",
    )


def cpu() -> resolution.Resolution:
    return resolution.resolve("cpu")


@dataclass
class Sandbox:
    """A throw-away package on ``sys.path`` whose modules can be made hook targets."""

    root: Path
    package: str
    spec: str

    @property
    def directory(self) -> Path:
        return self.root / self.package

    def write(self, name: str, source: str) -> Path:
        path = self.directory / (name.replace(".", "/") + ".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source).lstrip("\n"), encoding="utf-8")
        return path

    def copy(self, corpus_file: Path) -> str:
        (self.directory / corpus_file.name).write_bytes(corpus_file.read_bytes())
        return corpus_file.stem

    def name(self, module: str) -> str:
        return f"{self.package}.{module}"

    def target(self, module: str, expect_sites: int = 0, fingerprint: str = "f1") -> ModuleTarget:
        return ModuleTarget(self.name(module), self.spec, expect_sites, fingerprint)

    def install(self, *modules: str, expect_sites: int = 0) -> None:
        hook.install(self.target(module, expect_sites) for module in modules)

    def load(self, module: str) -> types.ModuleType:
        return importlib.import_module(self.name(module))

    def load_plain(self, module: str) -> types.ModuleType:
        """The same file imported without any hook, under a name of its own."""
        path = self.directory / f"{module}.py"
        spec = importlib.util.spec_from_file_location(f"{self.package}_plain_{module}", path)
        assert spec is not None and spec.loader is not None
        loaded = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(loaded)
        return loaded

    def forget(self) -> None:
        """Drop the package's modules so the next import loads them again."""
        for name in list(sys.modules):
            if name == self.package or name.startswith(self.package + "."):
                del sys.modules[name]
        importlib.invalidate_caches()

    def rewrites(self) -> list[dict]:
        return report.snapshot()["patches"].get(self.spec, {}).get("modules", [])

    def skips(self) -> list[dict]:
        return report.snapshot()["patches"].get(self.spec, {}).get("skipped", [])


@contextmanager
def sandbox(root: Path) -> Iterator[Sandbox]:
    """A fresh package (unique name, so once-only warnings fire again) and a clean hook after."""
    tag = uuid.uuid4().hex[:8]
    box = Sandbox(root, f"dmlpatch_case_{tag}", f"spec-{tag}")
    box.directory.mkdir(parents=True)
    (box.directory / "__init__.py").write_text("", encoding="utf-8")
    saved_meta_path, saved_path = list(sys.meta_path), list(sys.path)
    saved_targets, saved_gate = hook.targets(), hook._gate
    sys.path.insert(0, str(root))
    importlib.invalidate_caches()
    try:
        yield box
    finally:
        hook.uninstall()
        hook._targets.update(saved_targets)
        hook.set_gate(saved_gate)
        sys.meta_path[:] = saved_meta_path
        sys.path[:] = saved_path
        box.forget()


def child_env(**extra: str) -> dict[str, str]:
    """An environment for a child Python that may write bytecode and has no dmlpatch settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DMLPATCH_")}
    for name in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX", "PYTHONPATH"):
        env.pop(name, None)
    env.update(extra)
    return env
