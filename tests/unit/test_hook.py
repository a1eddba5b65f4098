"""The scoped import hook: only targets are rewritten, and they still look like their files."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import inspect
import linecache
import sys
import traceback
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

import pytest

from corpus._harness import CORPUS, Sandbox, sandbox
from dmlpatch import report
from dmlpatch.rewriting import hook

SITES = """
    import torch

    def move(x):
        return x.to('cuda')

    def count():
        return torch.cuda.device_count()
    """


@pytest.fixture
def box(tmp_path: Path) -> Iterator[Sandbox]:
    with sandbox(tmp_path) as created:
        yield created


def rewritten(module: object) -> bool:
    return "__dmlpatch__" in vars(module)


def test_a_target_is_loaded_rewritten_from_its_own_file(box: Sandbox) -> None:
    path = box.write("mod", SITES)
    box.install("mod", expect_sites=2)
    module = box.load("mod")
    assert rewritten(module)
    assert type(module.__spec__.loader).__name__ == "_RewritingLoader"
    assert isinstance(module.__spec__.loader, importlib.machinery.SourceFileLoader)
    assert module.__file__ == str(path)
    assert module.move.__code__.co_filename == str(path)
    assert box.rewrites() == [{"module": box.name("mod"), "sites": 2, "cached": False}]


def test_other_modules_take_the_normal_path(box: Sandbox) -> None:
    box.write("target", SITES)
    box.write("bystander", SITES)
    box.install("target")
    assert hook._finder.find_spec("json") is None
    assert hook._finder.find_spec(box.name("bystander"), [str(box.directory)]) is None
    bystander = box.load("bystander")
    assert not rewritten(bystander)
    assert type(bystander.__spec__.loader) is importlib.machinery.SourceFileLoader
    assert [entry["module"] for entry in box.rewrites()] == []


def test_install_is_idempotent_and_extends_the_targets(box: Sandbox) -> None:
    box.install("a")
    box.install("a", "b")
    assert sys.meta_path[0] is hook._finder
    assert sys.meta_path.count(hook._finder) == 1
    assert hook.is_installed()
    assert {box.name("a"), box.name("b")} <= set(hook.targets())
    assert hook.targets()[box.name("a")] == box.target("a")


def test_uninstall_removes_the_finder_and_the_targets(box: Sandbox) -> None:
    box.write("mod", SITES)
    box.install("mod")
    hook.uninstall()
    assert not hook.is_installed()
    assert hook.targets() == {}
    assert not rewritten(box.load("mod"))


def test_a_module_imported_before_install_is_named_once(
    box: Sandbox, capsys: pytest.CaptureFixture[str]
) -> None:
    box.write("early", SITES)
    early = box.load("early")
    box.install("early")
    box.install("early")
    err = capsys.readouterr().err
    assert err.count(box.name("early")) == 1
    assert "was imported before dmlpatch" in err
    assert "python -m dmlpatch" in err
    assert box.skips() == [
        {"module": box.name("early"), "reason": "imported before the import hook"}
    ]
    assert sys.modules[box.name("early")] is early
    assert not rewritten(early)


def test_reinstalling_after_a_rewritten_import_says_nothing(
    box: Sandbox, capsys: pytest.CaptureFixture[str]
) -> None:
    box.write("mod", SITES)
    box.install("mod")
    box.load("mod")
    box.install("mod")
    assert capsys.readouterr().err == ""
    assert box.skips() == []


def test_a_stale_spec_warns_and_loads_the_module_unrewritten(
    box: Sandbox, capsys: pytest.CaptureFixture[str]
) -> None:
    box.write("mod", SITES)
    box.install("mod", expect_sites=3)
    module = box.load("mod")
    assert not rewritten(module)
    err = capsys.readouterr().err
    assert box.spec in err
    assert box.name("mod") in err
    assert "expects 3 CUDA site(s)" in err
    assert "found 2" in err
    assert box.rewrites() == []
    assert box.skips() == [
        {"module": box.name("mod"), "reason": "stale spec: found 2 CUDA site(s), expected 3"}
    ]


def test_more_sites_than_expected_are_all_rewritten(box: Sandbox) -> None:
    box.write("mod", SITES)
    box.install("mod", expect_sites=1)
    assert rewritten(box.load("mod"))
    assert box.rewrites()[0]["sites"] == 2


def test_a_target_package_is_rewritten(box: Sandbox) -> None:
    box.write("sub.__init__", SITES)
    box.install("sub")
    package = box.load("sub")
    assert rewritten(package)
    assert package.__path__ == [str(box.directory / "sub")]


def test_specs_that_are_not_python_sources_are_left_alone(box: Sandbox) -> None:
    (box.directory / "namespace").mkdir()
    box.install("namespace")
    namespace = box.load("namespace")
    assert list(namespace.__path__) == [str(box.directory / "namespace")]
    assert not isinstance(namespace.__spec__.loader, importlib.machinery.SourceFileLoader)
    assert box.rewrites() == []


def test_a_finder_behind_the_hook_is_asked_too(box: Sandbox, tmp_path: Path) -> None:
    """Like setuptools' editable-install finders: modules that no ``sys.path`` entry holds."""
    elsewhere = tmp_path / "elsewhere.py"
    elsewhere.write_text("import torch\nDEVICE = 'cuda:0'\n", encoding="utf-8")
    name = box.name("editable")

    class EditableFinder:
        @staticmethod
        def find_spec(
            fullname: str, path: object = None, target: object = None
        ) -> Optional[importlib.machinery.ModuleSpec]:
            if fullname != name:
                return None
            return importlib.util.spec_from_file_location(fullname, elsewhere)

    sys.meta_path.append(EditableFinder())
    box.install("editable")
    assert rewritten(box.load("editable"))


def test_the_gate_is_asked_only_for_targets(box: Sandbox) -> None:
    asked: list[bool] = []

    def gate() -> bool:
        asked.append(True)
        return False

    box.write("mod", SITES)
    box.write("other", SITES)
    box.install("mod")
    hook.set_gate(gate)
    assert not rewritten(box.load("other"))
    assert asked == []
    assert not rewritten(box.load("mod"))
    assert asked == [True]
    box.forget()
    hook.set_gate(lambda: True)
    assert rewritten(box.load("mod"))


def test_tracebacks_and_sources_point_at_the_original_file(box: Sandbox) -> None:
    path = box.directory / "traceback_target.py"
    box.copy(CORPUS / "traceback_target.py")
    box.install("traceback_target", expect_sites=4)
    module = box.load("traceback_target")
    assert rewritten(module)
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    with pytest.raises(ValueError, match="failed on cpu") as caught:
        module.fail()
    frame = traceback.extract_tb(caught.value.__traceback__)[-1]
    raise_line = next(n for n, line in enumerate(lines, start=1) if "raise ValueError" in line)
    assert (frame.filename, frame.lineno) == (str(path), raise_line)
    assert frame.line == lines[raise_line - 1].strip()
    assert inspect.getsource(module) == text
    assert inspect.getsource(module.fail) == "\n".join(lines[raise_line - 3 : raise_line]) + "\n"
    assert inspect.getsourcefile(module.fail) == str(path)
    assert linecache.getline(str(path), raise_line) == lines[raise_line - 1] + "\n"


def test_compile_main_rewrites_the_script(box: Sandbox) -> None:
    source = (
        b"import torch\nDEVICE = torch.device('cuda' if torch.cuda.is_available() else 'cpu')\n"
    )
    before = len(report.snapshot()["patches"].get("__main__", {}).get("modules", []))
    code = hook.compile_main(source, "/scripts/train.py")
    assert code.co_filename == "/scripts/train.py"
    assert "__dmlpatch__" in code.co_names
    entries = report.snapshot()["patches"]["__main__"]["modules"]
    assert len(entries) == before + 1
    assert entries[-1] == {"module": "__main__", "sites": 2, "cached": False}


def test_compile_main_without_sites_is_plain_compile() -> None:
    source = b'"""A script."""\nfrom __future__ import annotations\nprint("cuda" == "cuda")\n'
    code = hook.compile_main(source, "/scripts/plain.py")
    assert code == compile(source, "/scripts/plain.py", "exec", dont_inherit=True)


def test_compile_main_respects_the_gate(box: Sandbox) -> None:
    source = b"x = t.to('cuda')\n"
    hook.set_gate(lambda: False)
    code = hook.compile_main(source, "/scripts/gated.py")
    assert code == compile(source, "/scripts/gated.py", "exec", dont_inherit=True)


class _FrontFinder:
    """Another tool's finder, put first on ``sys.meta_path`` after dmlpatch's, whose loader
    (``loader_class``) takes the sandbox's modules."""

    def __init__(self, prefix: str, loader_class: type) -> None:
        self.prefix = prefix
        self.loader_class = loader_class

    def find_spec(
        self, fullname: str, path: Any = None, target: object = None
    ) -> Optional[importlib.machinery.ModuleSpec]:
        if not fullname.startswith(self.prefix + "."):
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        assert spec is not None and spec.origin is not None
        spec.loader = self.loader_class(fullname, spec.origin)
        return spec


class _OtherTool(importlib.machinery.SourceFileLoader):
    """A tool whose rewrite dmlpatch knows how to follow (registered in the test)."""


class _ParsingLoader(importlib.machinery.SourceFileLoader):
    """Like jaxtyping's: parses the source itself, so it cannot take dmlpatch's tree."""

    def source_to_code(self, data: Any, path: Any, *, _optimize: int = -1) -> types.CodeType:
        return compile(importlib.util.decode_source(data), path, "exec")


def test_a_finder_put_in_front_is_passed_and_its_loader_composed(box: Sandbox) -> None:
    from dmlpatch.rewriting import composition

    box.write("mod", SITES)
    box.install("mod")
    front = _FrontFinder(box.package, _OtherTool)
    sys.meta_path.insert(0, front)
    seen: list[str] = []

    def composer(loader: Any) -> composition.Composer:
        def finish(tree: Any, source: bytes, path: str) -> types.CodeType:
            seen.append(path)
            return compile(tree, path, "exec")

        return composition.Composer(None, finish)

    composition.register(f"{__name__}._OtherTool", composer)
    module = box.load("mod")
    assert sys.meta_path[0] is hook._finder and sys.meta_path[1] is front
    assert rewritten(module)
    assert seen == [str(box.directory / "mod.py")]


def test_a_loader_that_cannot_take_the_tree_is_named_in_the_report(box: Sandbox) -> None:
    from dmlpatch.rewriting import composition

    box.write("mod", SITES)
    box.install("mod")
    sys.meta_path.insert(0, _FrontFinder(box.package, _ParsingLoader))
    assert importlib.util.find_spec("dmlpatch_no_such_module") is None  # back in front
    assert sys.meta_path[0] is hook._finder
    module = box.load("mod")
    assert not rewritten(module)
    assert composition.taken_modules()[box.name("mod")] == f"{__name__}._ParsingLoader"
    assert {
        "module": box.name("mod"),
        "reason": f"loaded by another import hook ({__name__}._ParsingLoader), which dmlpatch "
        "cannot compose with",
    } in report.snapshot()["kept_as_written"]
