"""A user's pytest suite runs on the device, with pytest's assertion introspection intact.

The suite chooses its device the three ways test suites do: a ``conftest.py`` fixture returning
``torch.device("cuda" if torch.cuda.is_available() else "cpu")``, a module-level choice, and
``.cuda()`` inside a test; one assert fails on purpose. pytest loads conftest and test modules
through its own import hook (assertion rewriting), first on ``sys.meta_path``; dmlpatch's pytest
plugin composes both rewrites. Under ``dmlpatch run pytest`` and ``python -m dmlpatch -m
pytest`` every test runs on the simulated device with the CPU's values, the failure shows
pytest's introspection exactly as under plain python, and dmlpatch's ``running on`` line is in
a section of pytest's summary, not in a test's captured output. With the plugin switched off
(``-p no:dmlpatch``) the suite runs as under plain python and one line names the modules.

Other import hooks: typeguard's loader is handed dmlpatch's tree (type checks and the device
both hold); jaxtyping's cannot take one, so its module keeps CUDA's meaning and one line at exit
names it. typeguard and jaxtyping live in ``.cache/import-hooks`` (scripts/setup.sh), apart from
the venv, so that their pytest plugins do not load in this suite.
"""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest

from support import REPO, Result, clean_env, run_python

CONFTEST = """
    import pytest
    import torch


    @pytest.fixture
    def device():
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    """

TESTS = """
    import torch

    DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


    def test_first_use_of_the_device_says_nothing_to_the_test(capsys, device):
        x = torch.arange(4.0, device=device)
        print("fixture", x.device, (x * 2).tolist())
        assert capsys.readouterr().err == ""


    def test_module_level_choice():
        x = torch.linspace(0, 1, 5).to(DEVICE)
        print("module", x.device, torch.softmax(x, 0).tolist())


    def test_cuda_call():
        torch.manual_seed(0)
        layer = torch.nn.Linear(3, 2)
        if torch.cuda.is_available():
            layer = layer.cuda()
        out = layer(torch.ones(1, 3, device=layer.weight.device))
        print("cuda", layer.weight.device, out.tolist())


    def test_fails_on_purpose(device):
        y = torch.tensor([1.0, 2.0, 3.0], device=device) * 2
        assert y.tolist() == [2.0, 4.0, 7.0]
    """

INTROSPECTION = [
    "E       assert [2.0, 4.0, 6.0] == [2.0, 4.0, 7.0]",
    "E         At index 2 diff: 6.0 != 7.0",
]
RUNNING = "dmlpatch: running on privateuseone:0 (Simulated Radeon (discrete))"


@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("suite")
    (root / "conftest.py").write_text(textwrap.dedent(CONFTEST))
    (root / "test_model.py").write_text(textwrap.dedent(TESTS))
    return root


def _pytest(suite: Path, *command: str, report: Path | None = None) -> Result:
    args = [*command, "-rA", "-p", "no:cacheprovider", "-p", "no:xdist"]
    env = clean_env(**({"DMLPATCH_REPORT": str(report)} if report else {}))
    return run_python(args, cwd=suite, env=env)


def _printed(result: Result) -> dict[str, list[str]]:
    """What each passing test printed: its device, then its values."""
    lines = [line.split(" ", 2) for line in result.out.splitlines()]
    return {words[0]: words[1:] for words in lines if words[0] in ("fixture", "module", "cuda")}


@pytest.fixture(scope="module")
def plain(suite: Path) -> Result:
    result = _pytest(suite, "-m", "pytest")
    assert result.code == 1, result.out + result.err
    assert {device for device, _ in _printed(result).values()} == {"cpu"}
    return result


def _on_device_like_plain(result: Result, plain: Result) -> None:
    assert result.code == 1, result.out + result.err
    assert "1 failed, 3 passed" in result.out
    got, expected = _printed(result), _printed(plain)
    assert {device for device, _ in got.values()} == {"privateuseone:0"}, result.out
    assert {name: values for name, (_, values) in got.items()} == {
        name: values for name, (_, values) in expected.items()
    }
    for line in INTROSPECTION:
        assert line in plain.out
        assert line in result.out
    # pytest's own section, after the failures, before the short summary.
    section = result.out.index("- dmlpatch -")
    assert result.out.index(RUNNING) > section > result.out.index("FAILURES")
    assert RUNNING not in result.err


def test_dmlpatch_run_pytest_runs_the_suite_on_the_device(suite: Path, plain: Result) -> None:
    result = _pytest(suite, "-m", "dmlpatch", "run", "--device", "sim", "pytest")
    _on_device_like_plain(result, plain)


def test_python_m_dmlpatch_m_pytest_runs_the_suite_on_the_device(
    suite: Path, plain: Result, tmp_path: Path
) -> None:
    report = tmp_path / "report.json"
    result = _pytest(suite, "-m", "dmlpatch", "--device", "sim", "-m", "pytest", report=report)
    _on_device_like_plain(result, plain)
    rewritten = {
        entry["module"]: entry["sites"] for entry in json.loads(report.read_text())["rewritten"]
    }
    # test_model: its choice by availability, the .cuda() test and call, and the four values
    # it hands to torch (device=device twice, .to(DEVICE), device=layer.weight.device).
    assert (rewritten["conftest"], rewritten["test_model"]) == (2, 8)


def test_without_the_plugin_one_line_names_what_pytest_loaded(suite: Path) -> None:
    result = _pytest(
        suite, "-m", "dmlpatch", "--device", "sim", "-m", "pytest", "-p", "no:dmlpatch"
    )
    assert "1 failed, 3 passed" in result.out
    assert {device for device, _ in _printed(result).values()} == {"cpu"}
    assert (
        "dmlpatch: warning: 2 module(s) with CUDA sites were loaded by another import hook "
        "(_pytest.assertion.rewrite.AssertionRewritingHook), which dmlpatch cannot compose "
        "with, so their device choices stayed as under plain python: conftest, test_model"
    ) in result.err_lines


#: torchvision's way (test/common_utils.py, test/conftest.py): the devices a test runs on come
#: from a helper module, the CUDA one a ``pytest.param`` that a mark skips without CUDA; no
#: line of the test says that the string names a device.
PARAMETRIZED = {
    "conftest.py": """
        import pytest
        import torch


        def pytest_configure(config):
            config.addinivalue_line("markers", "needs_cuda: a test that needs a CUDA device")


        def pytest_collection_modifyitems(items):
            for item in items:
                if item.get_closest_marker("needs_cuda") and not torch.cuda.is_available():
                    item.add_marker(pytest.mark.skip(reason="CUDA device not available"))
        """,
    "devices.py": """
        import pytest


        def cpu_and_cuda():
            return ("cpu", pytest.param("cuda", marks=pytest.mark.needs_cuda))
        """,
    "test_parametrized.py": """
        import pytest
        import torch
        from devices import cpu_and_cuda


        @pytest.mark.parametrize("device", cpu_and_cuda())
        def test_add(device):
            x = torch.arange(3.0, device=device)
            print("add", x.device, device == "cpu", (x + 1).tolist())


        @pytest.mark.parametrize("dev", cpu_and_cuda())  # torchvision's model tests
        def test_model(dev):
            print("model", torch.nn.Linear(2, 2).to(dev).weight.device)


        # kornia's way: the parameter is a name, looked up in the suite's own table.
        TABLE = {"cpu": torch.device("cpu")}
        if torch.cuda.is_available():
            TABLE["cuda"] = torch.device("cuda:0")


        @pytest.mark.parametrize("device_name", ["cpu", "cuda"])
        def test_named(device_name):
            if device_name not in TABLE:
                pytest.skip(f"no {device_name}")
            print("named", device_name, TABLE[device_name].type)
        """,
}


def test_a_test_parametrized_with_cuda_runs_on_the_device_under_its_own_id(
    tmp_path: Path,
) -> None:
    for name, text in PARAMETRIZED.items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    plain = _pytest(tmp_path, "-m", "pytest")
    assert "3 passed, 3 skipped" in plain.out, plain.out + plain.err
    device = _pytest(tmp_path, "-m", "dmlpatch", "--device", "sim", "-m", "pytest")
    assert "6 passed" in device.out, device.out + device.err
    assert "PASSED test_parametrized.py::test_add[cuda]" in device.out
    assert "PASSED test_parametrized.py::test_named[cuda]" in device.out
    printed = [
        line for line in device.out.splitlines() if line.startswith(("add ", "model ", "named "))
    ]
    assert sorted(printed) == [
        "add cpu True [1.0, 2.0, 3.0]",
        "add privateuseone:0 False [1.0, 2.0, 3.0]",
        "model cpu",
        "model privateuseone:0",
        "named cpu cpu",
        "named cuda privateuseone",
    ]
    # No device: the CUDA tests are skipped as under plain python, under the same ids.
    cpu = _pytest(tmp_path, "-m", "dmlpatch", "--device", "cpu", "-m", "pytest")
    assert "3 passed, 3 skipped" in cpu.out, cpu.out + cpu.err
    assert "SKIPPED [1] test_parametrized.py" in cpu.out


HOOKED = """
    import torch
    import jaxtyping
    from typeguard import TypeCheckError, install_import_hook

    install_import_hook("checked")
    import checked

    try:
        checked.scale(torch.ones(2), "twice")
    except TypeCheckError as error:
        print("typeguard:", error)
    print("checked", checked.pick(), checked.scale(torch.ones(2), 2.0).device)

    with jaxtyping.install_import_hook("shaped", "typeguard.typechecked"):
        import shaped
    print("shaped", shaped.pick())
    """

PACKAGE = """
    import torch


    def pick() -> torch.device:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")


    def scale(x: torch.Tensor, factor: float) -> torch.Tensor:
        return x.to(pick()) * factor
    """


def test_typeguard_is_composed_and_jaxtyping_named(tmp_path: Path) -> None:
    hooks = Path(os.environ.get("DMLPATCH_IMPORT_HOOKS", str(REPO / ".cache" / "import-hooks")))
    assert (hooks / "typeguard").is_dir(), f"run scripts/setup.sh: {hooks} lacks typeguard"
    for name in ("checked", "shaped"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(textwrap.dedent(PACKAGE))
    (tmp_path / "main.py").write_text(textwrap.dedent(HOOKED))
    result = run_python(
        ["-m", "dmlpatch", "--device", "sim", "main.py"],
        cwd=tmp_path,
        env=clean_env(PYTHONPATH=str(hooks)),
    )
    assert result.code == 0, result.err
    assert result.out.splitlines() == [
        'typeguard: argument "factor" (str) is neither float or int',
        "checked privateuseone:0 privateuseone:0",
        "shaped cpu",
    ]
    assert result.err_lines[-1] == (
        "dmlpatch: warning: 1 module(s) with CUDA sites were loaded by another import hook "
        "(jaxtyping._import_hook._JaxtypingLoader), which dmlpatch cannot compose with, so "
        "their device choices stayed as under plain python: shaped"
    )


#: A suite as peers write theirs: each device test once on the CPU and once on CUDA (from a
#: helper, as torchvision's ``cpu_and_cuda()``), a fixture's device, a test that never mentions
#: CUDA, and one that asks for CUDA yet computes on the CPU (its layer never moved). The CPU
#: tests compare with an explicit ``.to("cpu")``, which the whole session's exit warning took for
#: the cause of all the CPU compute.
ACCOUNTED = {
    "conftest.py": PARAMETRIZED["conftest.py"]
    + """

        @pytest.fixture
        def device():
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        """,
    "devices.py": PARAMETRIZED["devices.py"],
    "test_layers.py": """
        import pytest
        import torch
        from devices import cpu_and_cuda


        @pytest.mark.parametrize("device", cpu_and_cuda())
        def test_conv(device):
            conv = torch.nn.Conv2d(3, 8, 3).to(device)
            out = conv(torch.ones(2, 3, 16, 16, device=device))
            expected = torch.nn.functional.conv2d(
                torch.ones(2, 3, 16, 16), conv.weight.cpu(), conv.bias.cpu()
            )
            torch.testing.assert_close(out.to("cpu"), expected)


        @pytest.mark.parametrize("dev", cpu_and_cuda())
        def test_linear(dev):
            assert torch.nn.Linear(16, 4).to(dev)(torch.ones(2, 16, device=dev)).shape == (2, 4)


        def test_fixture_device(device):
            assert torch.nn.Linear(16, 4).to(device)(torch.ones(2, 16, device=device)).sum() != 0


        def test_never_mentions_the_device():
            assert torch.nn.Linear(16, 4)(torch.ones(2, 16)).shape == (2, 4)


        def test_asks_for_cuda_and_stays_on_the_cpu():
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            layer = torch.nn.Linear(32, 32)
            assert layer(torch.ones(8, 32)).device != device
        """,
}
#: The line of test_asks_for_cuda_and_stays_on_the_cpu's layer call.
ASKED_LINE = (
    textwrap.dedent(ACCOUNTED["test_layers.py"])
    .splitlines()
    .index("    assert layer(torch.ones(8, 32)).device != device")
    + 1
)


def test_a_suite_is_accounted_test_by_test_and_warns_only_for_a_test_that_asked_for_cuda(
    tmp_path: Path,
) -> None:
    for name, text in ACCOUNTED.items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    report = tmp_path / "report.json"
    result = _pytest(
        tmp_path,
        "-m",
        "dmlpatch",
        "run",
        "--device",
        "sim",
        "pytest",
        "test_layers.py",
        report=report,
    )
    assert "7 passed" in result.out, result.out + result.err
    assert (
        "dmlpatch: tests by where they ran: 3 on privateuseone:0, 2 on the CPU as parametrized, "
        "1 on the CPU despite asking for CUDA, 1 on the CPU, never asking for CUDA"
    ) in result.out.splitlines(), result.out
    said = (result.out + result.err).splitlines()
    warnings = [line for line in said if line.startswith("dmlpatch: warning:")]
    assert warnings == [
        "dmlpatch: warning: test_layers.py::test_asks_for_cuda_and_stays_on_the_cpu asked for "
        "CUDA and was given privateuseone:0, yet 100% of its model compute (16.9 kFLOP of 16.9 "
        f"kFLOP) ran on the CPU (first at test_layers.py:{ASKED_LINE} in "
        "test_asks_for_cuda_and_stays_on_the_cpu)"
    ], result.out + result.err
    assert not any("likely cause" in line for line in said)
    compute = json.loads(report.read_text())["compute"]
    assert compute["likely_cause"] is None
    tests = compute["tests"]
    assert [entry["test"] for entry in tests.pop("warned")] == [
        "test_layers.py::test_asks_for_cuda_and_stays_on_the_cpu"
    ]
    assert tests == {
        "on_device": 3,
        "on_cpu_as_parametrized": 2,
        "asked_for_cuda_but_on_cpu": 1,
        "on_cpu_never_asking_for_cuda": 1,
        "no_layer_and_no_device_argument": 0,
    }
