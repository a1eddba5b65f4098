"""``dmlpatch doctor`` on this machine, with the real torch-directml, and with a broken pin."""

from __future__ import annotations

import json
import os
from pathlib import Path

from support import clean_env, run_python

AREAS = {"python", "versions", "directml", "cuda", "activation", "cache", "simulator"}


def _doctor_json(*args: str, env=None) -> tuple[int, list[dict]]:
    result = run_python(["-m", "dmlpatch", "doctor", "--json", *args], env=env)
    data = json.loads(result.out)
    assert data["exit_code"] == result.code
    return result.code, data["checks"]


def _doctor(*args: str, env=None) -> tuple[int, dict]:
    code, checks = _doctor_json(*args, env=env)
    return code, {check["area"]: check for check in checks}


def test_this_machine_has_no_failures_and_a_stable_schema() -> None:
    # One run (it imports every patched library): checks by area, and the library rows.
    code, rows = _doctor_json()
    checks = {check["area"]: check for check in rows}
    assert code == 0
    assert set(checks) >= AREAS
    for check in checks.values():
        assert set(check) == {"area", "status", "message", "fix", "details"}
        assert check["status"] in {"OK", "WARN", "FAIL"}
    assert checks["directml"]["status"] == "WARN"
    assert checks["directml"]["fix"] == "pip install torch-directml  (Windows or WSL2)"
    assert checks["simulator"]["status"] == "OK"
    libraries = [c for c in rows if c["area"] == "library"]
    basicsr = next(c for c in libraries if c["details"]["spec"] == "basicsr")
    assert "plain import fails (ModuleNotFoundError: No module named " in basicsr["message"]
    assert basicsr["message"].endswith("dmlpatch bridges it")
    assert basicsr["status"] == "OK"


def _installed(root: Path, name: str, version: str, *requires: str) -> Path:
    """A distribution's installed metadata (what pip writes), in a directory of its own."""
    info = root / f"{name}-{version}" / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    lines += [f"Requires-Dist: {r}" for r in requires]
    (info / "METADATA").write_text("\n".join(lines) + "\n")
    return info.parent


def test_real_torch_directml_with_another_torch_fails_with_the_fix(
    real_torch_directml: Path, tmp_path: Path
) -> None:
    # A library whose newest release needs a newer torch, an older copy that accepts 2.4.1
    # further down the path, and one with no copy that does.
    paths = [
        real_torch_directml,
        _installed(tmp_path, "newlib", "2.0", "torch>=2.5", "numpy"),
        _installed(tmp_path, "newlib", "1.4", "torch>=2.0"),
        _installed(tmp_path, "onlynew", "3.1", "torch>=2.6; python_version >= '3.8'"),
        _installed(tmp_path, "exportextra", "1.0", "torch>=2.12; extra == 'export'"),
    ]
    path = os.pathsep.join(str(p) for p in paths)
    code, rows = _doctor_json("--no-import", env=clean_env(PYTHONPATH=path))
    checks = {check["area"]: check for check in rows}
    requires = {c["details"]["library"]: c for c in rows if c["area"] == "requires"}
    assert set(requires) == {"newlib", "onlynew"}  # an extra's requirement is not the library's
    assert requires["newlib"]["status"] == "WARN"
    assert requires["newlib"]["message"].startswith(
        "newlib 2.0 requires torch>=2.5, which excludes torch-directml's torch==2.4.1"
    )
    assert requires["newlib"]["message"].endswith("; newlib 1.4, also installed here, accepts it")
    assert requires["newlib"]["fix"] == "pip install newlib==1.4"
    assert "no installed metadata shows a release that accepts it" in requires["onlynew"]["message"]
    assert requires["onlynew"]["fix"] == "dmlpatch pin, then pip install onlynew"
    assert code == 1
    versions = checks["versions"]
    assert versions["status"] == "FAIL"
    assert versions["fix"] == "pip install torch==2.4.1 torchvision==0.19.1"
    assert (
        "torch-directml 0.2.5.dev240914 requires torch==2.4.1, torchvision==0.19.1"
        in (versions["message"])
    )
    # The catalogue's entry, with what to do.
    assert "(known failure torch-replaced; command: dmlpatch pin" in versions["message"]
    assert versions["details"]["known_failure"] == "torch-replaced"
    assert checks["directml"]["status"] == "FAIL"
    assert "cannot load its native library" in checks["directml"]["message"]


def test_text_output_and_bad_flag() -> None:
    from dmlpatch.gaps import catalogue

    result = run_python(["-m", "dmlpatch", "doctor", "--no-import"])
    assert result.code == 0
    assert result.out.splitlines()[0].startswith("OK   python     Python ")
    assert f"OK   failures   {catalogue.summary()}" in result.out
    bad = run_python(["-m", "dmlpatch", "doctor", "--fast"])
    assert bad.code == 2 and bad.err_lines == [
        "dmlpatch: error: doctor takes only --json, --no-import and --failures; unexpected '--fast'"
    ]


def test_failures_lists_the_catalogue_as_text_and_json() -> None:
    from dmlpatch.gaps import catalogue

    text = run_python(["-m", "dmlpatch", "doctor", "--failures"])
    assert text.code == 0
    lines = text.out.splitlines()
    assert lines[0] == catalogue.summary()
    assert any(line.startswith("inference-mode  [rule / rewrite]") for line in lines)
    data = run_python(["-m", "dmlpatch", "doctor", "--failures", "--json"])
    assert data.code == 0
    entries = json.loads(data.out)["failures"]
    assert [entry["key"] for entry in entries] == [f.key for f in catalogue.FAILURES]
    assert entries[0]["text"] == "RuntimeError: Cannot set version_counter for inference tensor"


def test_adapter_families_get_their_route() -> None:
    names = ["AMD Radeon RX 7900 XTX", "Radeon RX 580 Series", "Intel(R) Arc(TM) A770 Graphics"]
    env = clean_env(DMLPATCH_DEVICE="sim", DMLPATCH_SIM_ADAPTERS=";".join(names))
    code, rows = _doctor_json("--no-import", env=env)
    # The exit code is the machine's: 1 beside a torch-directml that cannot load here
    # (.ci/compat's venv), never because of the adapters.
    failing = [c["area"] for c in rows if c["status"] == "FAIL"]
    assert code == (1 if failing else 0) and failing in ([], ["directml"]), failing
    adapters = [c for c in rows if c["area"] == "adapter"]
    assert [a["details"]["name"] for a in adapters] == names
    assert [a["details"]["faster"] for a in adapters] == ["rocm", None, "xpu"]
    assert all(a["details"]["simulated"] for a in adapters)
    assert adapters[0]["message"].startswith(
        "simulated adapter 0: AMD Radeon RX 7900 XTX (AMD RDNA 3): AMD ships PyTorch wheels for "
        "Windows on ROCm"
    )
    assert "(AMD Polaris): DirectML is the path" in adapters[1]["message"]
    assert "whl/xpu" in adapters[2]["message"]
