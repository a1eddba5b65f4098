"""Device specs and the choice of device, including every way torch-directml fails to load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dmlpatch.devices import resolution
from dmlpatch.errors import DeviceUnavailable, UsageError

from support import clean_env, run_python


@pytest.mark.parametrize(
    ("text", "kind", "indices", "name"),
    [
        ("auto", "auto", (), None),
        ("dml", "dml", (), None),
        ("DML", "dml", (), None),
        ("dml:1", "dml", (1,), None),
        ("dml:0,1", "dml", (0, 1), None),
        ("dml:radeon", "dml", (), "radeon"),
        ("privateuseone:1", "dml", (1,), None),
        ("sim", "sim", (), None),
        ("sim:1", "sim", (1,), None),
        ("cpu", "cpu", (), None),
        ("cuda", "cuda", (), None),
        ("cuda:2", "cuda", (2,), None),
        ("mps", "mps", (), None),
        ("xpu", "xpu", (), None),
    ],
)
def test_valid_specs_parse(text: str, kind: str, indices: tuple[int, ...], name: str) -> None:
    spec = resolution.parse(text)
    assert (spec.kind, spec.indices, spec.name) == (kind, indices, name)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("gpu", "unknown device spec 'gpu'"),
        ("", "unknown device spec ''"),
        ("cuda:x", "only dml takes an adapter name"),
        ("cpu:0", "'cpu' takes no ':...' part"),
        ("dml:0,0", "names an adapter twice"),
        ("cuda:0,1", "only dml and sim take several adapters"),
        ("dml: 1", "unknown device spec"),
    ],
)
def test_bad_specs_are_usage_errors(text: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        resolution.parse(text)


@pytest.mark.parametrize(
    ("capability", "arch_list", "usable"),
    [
        # The seed case: GeForce GT 645M (3.0) under a build whose oldest kernels are sm_35.
        ((3, 0), ["sm_35", "sm_50", "sm_60", "sm_70"], False),
        ((3, 5), ["sm_35", "sm_50"], True),
        ((3, 7), ["sm_35", "sm_50"], True),
        ((8, 6), ["sm_50", "sm_80", "sm_90"], True),
        ((7, 5), ["sm_80", "sm_90"], False),
        ((12, 0), ["sm_80", "sm_90", "compute_90"], True),
        ((8, 0), ["sm_90", "compute_90"], False),
        ((6, 1), [], False),
    ],
)
def test_cuda_capability_against_arch_list(
    capability: tuple[int, int], arch_list: list[str], usable: bool
) -> None:
    assert resolution.capability_supported(capability, arch_list) is usable


def test_cpu_resolution_is_not_an_accelerator() -> None:
    chosen = resolution.resolve("cpu")
    assert (chosen.backend, chosen.device, chosen.is_accelerator) == ("cpu", "cpu", False)
    assert chosen.patches_needed


def test_auto_on_this_machine_falls_back_to_cpu_and_says_why() -> None:
    chosen = resolution.resolve("auto")
    assert chosen.backend == "cpu"
    assert "CUDA unavailable" in chosen.why
    assert "DirectML unavailable" in chosen.why


def test_explicit_cuda_without_gpu_is_a_clear_error() -> None:
    with pytest.raises(DeviceUnavailable, match=r"^CUDA unavailable"):
        resolution.resolve("cuda")


STAND_INS = {
    "not-linux": (
        "raise OSError('libd3d12.so: cannot open shared object file: No such file or directory')",
        "cannot load its native library (libd3d12.so: cannot open shared object file: No such "
        "file or directory); DirectML works only on Windows and WSL2",
    ),
    "pin-mismatch": (
        "raise ImportError('/x/torch_directml_native.so: undefined symbol: "
        "_ZN2at6native12cpu_fallbackERKN3c1014OperatorHandleEPSt6vectorINS2_6IValueESaIS6_EEb')",
        "torch-directml was built for",
    ),
    "unknown-error": (
        "def is_available():\n    raise RuntimeError('Unknown error -2005270527')\n",
        "torch-directml could not query adapters: RuntimeError: Unknown error -2005270527",
    ),
    "no-adapter": (
        "def is_available():\n    return False\n",
        "torch-directml reports no DirectML adapter",
    ),
}


def _stand_in(tmp_path: Path, body: str) -> Path:
    package = tmp_path / "standin" / "torch_directml"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(body + "\n", encoding="utf-8")
    return package.parent


# Only an import of torch-directml (and so of torch) shows these failures: dmlpatch makes it
# when the program imports torch, never before (tests/e2e/test_startup_order.py).
@pytest.mark.parametrize("mode", sorted(STAND_INS))
def test_dml_unavailable_is_one_line_and_exit_2(tmp_path: Path, mode: str) -> None:
    body, expected = STAND_INS[mode]
    script = tmp_path / "program.py"
    script.write_text(
        "import torch\nraise SystemExit('the program must not run')\n", encoding="utf-8"
    )
    env = clean_env(PYTHONPATH=str(_stand_in(tmp_path, body)))
    result = run_python(["-m", "dmlpatch", "--device", "dml", str(script)], env=env)
    assert result.code == 2, result.err
    assert result.err_lines == [result.err_lines[0]], result.err
    assert result.err_lines[0].startswith("dmlpatch: error: DirectML unavailable: ")
    assert expected in result.err_lines[0]
    assert "Traceback" not in result.err
    assert result.out == ""


def test_dml_not_installed(tmp_path: Path) -> None:
    script = tmp_path / "program.py"
    script.write_text("print('ran')\n", encoding="utf-8")
    result = run_python(["-m", "dmlpatch", "--device", "dml", str(script)])
    assert result.code == 2
    assert result.err_lines == [
        "dmlpatch: error: DirectML unavailable: torch-directml is not installed "
        "(pip install torch-directml; Windows or WSL2)"
    ]


def test_auto_with_broken_directml_runs_on_cpu_and_names_the_reason(tmp_path: Path) -> None:
    body, expected = STAND_INS["unknown-error"]
    script = tmp_path / "program.py"
    script.write_text("import torch\nprint('ran')\n", encoding="utf-8")
    env = clean_env(PYTHONPATH=str(_stand_in(tmp_path, body)))
    result = run_python(["-m", "dmlpatch", str(script)], env=env)
    assert result.code == 0, result.err
    assert result.out == "ran\n"
    assert expected in result.err
    assert "using the CPU" in result.err


def test_pin_mismatch_names_the_fix(tmp_path: Path, fake_distribution) -> None:
    site = fake_distribution("torch_directml", "0.2.5.dev240914", {})
    metadata = next(site.glob("torch_directml-*.dist-info")) / "METADATA"
    metadata.write_text(
        metadata.read_text() + "Requires-Dist: torch==2.4.1\nRequires-Dist: torchvision==0.19.1\n"
    )
    body, _ = STAND_INS["pin-mismatch"]
    (site / "torch_directml").mkdir()
    (site / "torch_directml" / "__init__.py").write_text(body + "\n")
    script = tmp_path / "program.py"
    script.write_text("import torch\n")
    result = run_python(
        ["-m", "dmlpatch", "--device", "dml", str(script)], env=clean_env(PYTHONPATH=str(site))
    )
    import torch

    assert result.code == 2
    assert result.err_lines == [
        "dmlpatch: error: DirectML unavailable: torch-directml was built for torch==2.4.1 but "
        f"torch {torch.__version__.split('+')[0]} is installed (undefined symbol); "
        "fix: pip install torch==2.4.1 torchvision==0.19.1"
    ]


def test_unknown_spec_from_command_line_and_environment(tmp_path: Path) -> None:
    script = tmp_path / "program.py"
    script.write_text("print('ran')\n")
    for args, env in (
        (["--device", "gpu0"], clean_env()),
        ([], clean_env(DMLPATCH_DEVICE="gpu0")),
    ):
        result = run_python(["-m", "dmlpatch", *args, str(script)], env=env)
        assert result.code == 2
        assert len(result.err_lines) == 1
        assert result.err_lines[0].startswith("dmlpatch: error: unknown device spec 'gpu0'")
        assert result.out == ""


def test_real_torch_directml_without_d3d12(real_torch_directml: Path, tmp_path: Path) -> None:
    script = tmp_path / "program.py"
    script.write_text("import torch\nprint('ran')\n")
    result = run_python(
        ["-m", "dmlpatch", "--device", "dml", str(script)],
        env=clean_env(PYTHONPATH=str(real_torch_directml)),
    )
    assert result.code == 2
    assert len(result.err_lines) == 1
    assert result.err_lines[0].startswith(
        "dmlpatch: error: DirectML unavailable: torch-directml cannot load its native library"
    )
    assert result.err_lines[0].endswith("DirectML works only on Windows and WSL2")


def test_real_torch_directml_against_another_torch(
    real_torch_directml: Path, tmp_path: Path
) -> None:
    """With its bundled D3D12 stubs found, the next failure is the binary torch pin."""
    import torch

    script = tmp_path / "program.py"
    script.write_text("import torch\nprint('ran')\n")
    env = clean_env(
        PYTHONPATH=str(real_torch_directml),
        LD_LIBRARY_PATH=str(real_torch_directml / "torch_directml"),
    )
    result = run_python(["-m", "dmlpatch", "--device", "dml", str(script)], env=env)
    assert result.code == 2
    assert result.err_lines == [
        "dmlpatch: error: DirectML unavailable: torch-directml was built for torch==2.4.1 but "
        f"torch {torch.__version__.split('+')[0]} is installed (undefined symbol); "
        "fix: pip install torch==2.4.1 torchvision==0.19.1"
    ]


def test_public_device_and_describe() -> None:
    code = (
        "import json, dmlpatch; d = dmlpatch.device(); info = dmlpatch.describe(); "
        "print(repr(d)); print(json.dumps(info, sort_keys=True))"
    )
    result = run_python(["-c", code], env=clean_env(DMLPATCH_DEVICE="sim"))
    assert result.code == 0, result.err
    first, second = result.out.splitlines()
    assert first == "device(type='privateuseone', index=0)"
    info = json.loads(second)
    assert info["backend"] == "sim"
    assert info["device"] == "privateuseone:0"
    assert info["adapters"] == [{"index": 0, "name": "Simulated Radeon (discrete)"}]
    assert "simulated DirectML device" in info["why"]
    result = run_python(
        ["-c", code], env=clean_env(DMLPATCH_DEVICE="sim:1", DMLPATCH_SIM_DEVICES="2")
    )
    assert result.code == 0, result.err
    assert result.out.splitlines()[0] == "device(type='privateuseone', index=1)"
    assert json.loads(result.out.splitlines()[1])["adapter"] == "Simulated UHD (integrated)"


def test_op_fixes_are_installed_by_start_up_s_hook_when_the_process_commits() -> None:
    """resolve() answers and current() commits, and neither installs anything: the fixes come
    from the hook start-up registers, before the resolution is published (or at once, for a
    resolution already made)."""
    program = (
        "import json\n"
        "from dmlpatch import opfix\n"
        "from dmlpatch.devices import resolution\n"
        "from dmlpatch.startup import commitment\n"
        "seen = []\n"
        "resolution.on_commit(lambda chosen: seen.append(resolution.resolved_or_none()))\n"
        "answer = resolution.resolve('sim')\n"
        "resolution.configure('sim')\n"
        "chosen = resolution.current()\n"
        "bare = opfix.installed()\n"
        "commitment.register()\n"
        "late = opfix.installed()\n"
        "print(json.dumps([answer.backend, chosen.backend, seen, bare is None,"
        " late is not None]))\n"
    )
    result = run_python(["-c", program])
    assert result.code == 0, result.err
    assert json.loads(result.out) == ["sim", "sim", [None], True, True]
    program = (
        "import json\n"
        "from dmlpatch import opfix\n"
        "from dmlpatch.devices import resolution\n"
        "from dmlpatch.startup import commitment\n"
        "commitment.register()\n"
        "resolution.configure('cpu')\n"
        "resolution.current()\n"
        "print(json.dumps(opfix.installed() is None))\n"
    )
    result = run_python(["-c", program])
    assert result.code == 0, result.err
    assert json.loads(result.out) is True
