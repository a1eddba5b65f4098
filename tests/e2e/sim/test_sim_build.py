"""Building and loading: cold build, warm load, concurrent builds, and every refusal."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.e2e.sim.helpers import run_python, sim_env

TIMED_LOAD = """
import json, time
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
import dmlpatch.sim as sim
sim.load()
t2 = time.perf_counter()
x = (torch.ones(3, device=sim.device()) * 2).cpu().tolist()
print(json.dumps({"torch": t1 - t0, "load": t2 - t1, "x": x}))
"""


def _timed(cache: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", TIMED_LOAD],
        env=sim_env(DMLPATCH_CACHE_DIR=str(cache)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _result(proc: subprocess.Popen[str]) -> dict[str, float]:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def test_concurrent_cold_builds_then_warm_load(tmp_path: Path) -> None:
    cache = tmp_path / "fresh-cache"
    first, second = _timed(cache), _timed(cache)
    cold = [_result(first), _result(second)]
    assert all(r["x"] == [2.0, 2.0, 2.0] for r in cold)
    built = list((cache / "sim").iterdir())
    assert len(built) == 1 and (built[0] / "complete").is_file()
    warm = _result(_timed(cache))
    print(
        f"\ncold build+load: {max(r['load'] for r in cold):.1f} s (two processes at once); "
        f"warm load: {warm['load'] * 1000:.0f} ms"
    )
    assert warm["load"] < 2.0


def test_unwritable_cache_falls_back_to_temp_dir(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    (tmp_path / "tmp").mkdir()
    proc = run_python(
        "import dmlpatch.sim as sim\nsim.load()\nprint(sim.device_count())",
        DMLPATCH_CACHE_DIR=str(blocker / "cache"),
        TMPDIR=str(tmp_path / "tmp"),
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "1"
    said = [line for line in proc.stderr.splitlines() if line.startswith("dmlpatch:")]
    assert len(said) == 1 and "is not writable; building the simulated device in" in said[0]
    assert str(tmp_path / "tmp") in said[0]


def _load_error(**env: str | None) -> str:
    proc = run_python(
        """
        import sys, dmlpatch.sim as sim
        from dmlpatch.errors import DeviceUnavailable
        try:
            sim.load()
        except DeviceUnavailable as e:
            print(str(e)); sys.exit(2)
        print("loaded")
        """,
        **env,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1
    return lines[0]


def test_no_compiler(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-c++")
    msg = _load_error(DMLPATCH_CACHE_DIR=str(tmp_path / "c1"), CXX=missing)
    assert msg.startswith("cannot build the simulated DirectML device: no C++ compiler")
    assert missing in msg
    msg = _load_error(
        DMLPATCH_CACHE_DIR=str(tmp_path / "c2"), CXX=None, PATH=str(tmp_path / "empty-bin")
    )
    assert "no C++ compiler: 'c++' was not found" in msg


def test_unknown_profile() -> None:
    msg = _load_error(DMLPATCH_SIM_PROFILE="directml-9")
    assert msg == (
        "unknown simulated-device profile 'directml-9'; valid profiles: "
        "torch-directml-0.2.5, permissive, pytorch-directml-1.8"
    )


def test_bad_device_count() -> None:
    assert "DMLPATCH_SIM_DEVICES must be a whole number >= 1" in _load_error(
        DMLPATCH_SIM_DEVICES="0"
    )


def test_torch_directml_already_imported() -> None:
    proc = run_python(
        """
        import sys, types
        sys.modules["torch_directml"] = types.ModuleType("torch_directml")
        import dmlpatch.sim as sim
        from dmlpatch.errors import DeviceUnavailable
        try:
            sim.load()
        except DeviceUnavailable as e:
            print(e)
        print(sim.is_loaded())
        """
    )
    assert proc.returncode == 0, proc.stderr
    first, second = proc.stdout.strip().splitlines()
    assert first.startswith("torch_directml is already imported")
    assert second == "False"


def test_torch_directml_refused_after_load() -> None:
    proc = run_python(
        """
        import dmlpatch.sim as sim
        sim.load()
        try:
            import torch_directml
        except ImportError as e:
            print(e)
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("torch_directml cannot be imported")


def test_import_is_lazy_and_load_idempotent() -> None:
    proc = run_python(
        """
        import sys, time
        import dmlpatch.sim as sim
        assert "torch" not in sys.modules and not sim.is_loaded()
        assert sim.profiles()[0] == "torch-directml-0.2.5" and sim.profile() == sim.profiles()[0]
        ok, why = sim.buildable()
        assert ok and why.startswith("C++ compiler"), why
        sim.load(); t = time.perf_counter(); sim.load(); again = time.perf_counter() - t
        assert again < 0.01
        from dmlpatch.errors import DeviceUnavailable
        try:
            sim.load("permissive")
        except DeviceUnavailable as e:
            print(e)
        print(sim.device(), sim.device_name(), sim.device_count())
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines() == [
        "the simulated device is already loaded with profile 'torch-directml-0.2.5'; "
        "profiles cannot change within a process",
        "privateuseone:0 Simulated Radeon (discrete) 1",
    ]
