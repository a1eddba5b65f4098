"""Function-level fixes: applied on import (or at once), reversible, and gated."""

from __future__ import annotations

import inspect
import sys
import textwrap
from pathlib import Path

import pytest

from dmlpatch.specs import loading, wrapping

TARGET = """
def init_model(name, device="cuda"):
    return (name, device)


class Helper:
    def __init__(self, device="cuda"):
        self.device = device

    @staticmethod
    def pick(device="cuda"):
        return device
"""

FIX = """
def to_cpu(wrapped, instance, args, kwargs):
    kwargs["device"] = "cpu"
    return wrapped(*args, **kwargs)
"""


def _fixes(spec: loading.PatchSpec) -> list[wrapping.Fix]:
    return [wrapping.Fix(spec.name, w.target, w.fix, w.why) for w in spec.wraps]


@pytest.fixture
def modules(tmp_path: Path, request):
    name = f"wraptarget_{request.node.name.replace('[', '_').replace(']', '_').replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(TARGET)
    (tmp_path / f"{name}_fix.py").write_text(FIX)
    spec_path = tmp_path / "spec.toml"
    spec_path.write_text(
        textwrap.dedent(
            f"""
            [package]
            name = "{name}"
            [[wrap]]
            target = "{name}:init_model"
            fix = "{name}_fix:to_cpu"
            why = "test"
            [[wrap]]
            target = "{name}:Helper.pick"
            fix = "{name}_fix:to_cpu"
            why = "test"
            """
        )
    )
    sys.path.insert(0, str(tmp_path))
    yield name, loading.load_file(spec_path)
    wrapping.unwrap_all()
    sys.path.remove(str(tmp_path))
    for module in (name, f"{name}_fix"):
        sys.modules.pop(module, None)


def test_fix_applies_when_module_is_imported_later(modules) -> None:
    name, spec = modules
    wrapping.apply(_fixes(spec), gate=lambda: True)
    assert name not in sys.modules
    module = __import__(name)
    assert module.init_model("m") == ("m", "cpu")
    assert module.Helper.pick() == "cpu"
    assert module.init_model.__name__ == "init_model"
    assert set(wrapping.applied_targets()) == {f"{name}:init_model", f"{name}:Helper.pick"}


def test_fix_applies_at_once_to_an_imported_module_and_unwraps(modules) -> None:
    name, spec = modules
    module = __import__(name)
    original = module.init_model
    wrapping.apply(_fixes(spec), gate=lambda: True)
    assert module.init_model("m") == ("m", "cpu")
    wrapping.unwrap_all()
    assert module.init_model is original
    assert module.init_model("m") == ("m", "cuda")
    assert module.Helper.pick() == "cuda"
    assert isinstance(module.Helper.__dict__["pick"], staticmethod)
    wrapping.apply(_fixes(spec), gate=lambda: True)
    assert module.init_model("m") == ("m", "cpu")


def test_closed_gate_leaves_the_library_alone(modules) -> None:
    name, spec = modules
    wrapping.apply(_fixes(spec), gate=lambda: False)
    module = __import__(name)
    assert module.init_model("m") == ("m", "cuda")
    assert wrapping.applied_targets() == []


def test_missing_target_warns_once_and_leaves_module_usable(
    modules, tmp_path: Path, capsys
) -> None:
    name, _ = modules
    spec_path = tmp_path / "broken.toml"
    spec_path.write_text(
        f'[package]\nname = "{name}"\n[[wrap]]\ntarget = "{name}:gone"\n'
        f'fix = "{name}_fix:to_cpu"\nwhy = "test"\n'
    )
    spec = loading.load_file(spec_path)
    wrapping.apply(_fixes(spec), gate=lambda: True)
    module = __import__(name)
    assert module.init_model("m") == ("m", "cuda")
    err = capsys.readouterr().err
    assert f"patch spec 'broken' cannot wrap {name}:gone" in err
    assert err.count("cannot wrap") == 1


BINDINGS = """
class Base:
    def scale(self, x, factor=2):
        "Scale x."
        return x * factor

    @classmethod
    def build(cls, size):
        return (cls.__name__, size)


class Child(Base):
    pass
"""

RECORDER = """
calls = []


def record(wrapped, instance, args, kwargs):
    calls.append((instance, args, kwargs))
    return wrapped(*args, **kwargs)
"""


def test_fix_sees_the_instance_and_class_as_wrapt_passes_them(tmp_path: Path, request) -> None:
    """Methods get ``instance`` and a bound ``wrapped``; classmethods get the class; an
    inherited method is wrapped on the subclass and unwrapping shows the base's again."""
    name = f"bindings_{request.node.name}"
    (tmp_path / f"{name}.py").write_text(BINDINGS)
    (tmp_path / f"{name}_fix.py").write_text(RECORDER)
    rules = [
        wrapping.Fix("t", f"{name}:{target}", f"{name}_fix:record", "test")
        for target in ("Base.scale", "Base.build", "Child.scale")
    ]
    sys.path.insert(0, str(tmp_path))
    try:
        module = __import__(name)
        recorder = __import__(f"{name}_fix")
        wrapping.apply(rules, gate=lambda: True)
        base, child = module.Base(), module.Child()
        assert base.scale(3, factor=4) == 12
        assert module.Base.scale(base, 5) == 10
        assert module.Child.build(7) == ("Child", 7)
        assert child.scale(1) == 2
        assert recorder.calls[:3] == [
            (base, (3,), {"factor": 4}),
            (base, (5,), {}),
            (module.Child, (7,), {}),
        ]
        # Child.scale is wrapped twice: its own wrapper calls the base's.
        assert recorder.calls[3:] == [(child, (1,), {}), (child, (1,), {})]
        assert module.Base.scale.__doc__ == "Scale x."
        assert str(inspect.signature(module.Base.scale)) == "(self, x, factor=2)"
        assert "scale" in vars(module.Child)
        wrapping.unwrap_all()
        assert "scale" not in vars(module.Child)
        assert vars(module.Base)["scale"].__name__ == "scale"
        assert isinstance(vars(module.Base)["build"], classmethod)
        recorder.calls.clear()
        assert child.scale(2) == 4 and recorder.calls == []
    finally:
        wrapping.unwrap_all()
        sys.path.remove(str(tmp_path))
        sys.modules.pop(name, None)
        sys.modules.pop(f"{name}_fix", None)
