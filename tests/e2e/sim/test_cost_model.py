"""The cost model of DirectML on the simulated device: its accounting checked against what known
programs do, its prices against hand-computed ones, and ``dmlpatch calibrate`` recovering the
profile a simulated adapter is configured as."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import dmlpatch.sim as sim
from dmlpatch.costs import active, calibrate, choice, machine, pricing, profiles, simulated
from dmlpatch.sim import counting

#: The figures a simulated adapter models (the host's are this machine's wherever it runs).
DEVICE_FIGURES = (
    "launch_us",
    "readback_us",
    "upload_gbps",
    "download_gbps",
    "memory_gbps",
    "float_tflops",
    "half_tflops",
)


def _run(call) -> tuple[dict, dict]:
    call()
    sim.reset_counters()
    call()
    return sim.counters(), counting.costs()


def test_a_product_is_charged_its_flops_bytes_and_one_launch(dev: torch.device) -> None:
    a = torch.randn(64, 32, device=dev)
    b = torch.randn(32, 16, device=dev)
    counters, costs = _run(lambda: torch.mm(a, b))
    entry = costs["aten::mm.out"]
    assert entry["flops"] == 2 * 64 * 32 * 16
    assert entry["bytes"] == 4 * (64 * 32 + 32 * 16 + 64 * 16)
    for slot, profile in enumerate(simulated.models()):
        priced = simulated.priced(profile, counters)
        roofline = max(
            entry["bytes"] / (profile.memory_gbps * 1e9),
            entry["flops"] / (profile.float_tflops * 1e12),
        )
        assert entry["compute_ps"][slot] * 1e-12 == pytest.approx(roofline, rel=1e-3)
        assert priced.launches == 1
        assert priced.split.launch == pytest.approx(profile.launch_us * 1e-6)
        assert priced.split.readback == 0


def test_a_convolution_is_charged_its_multiply_adds(dev: torch.device) -> None:
    x = torch.randn(2, 3, 16, 16, device=dev)
    w = torch.randn(8, 3, 3, 3, device=dev)
    _, costs = _run(lambda: F.conv2d(x, w, padding=1))
    assert costs["aten::convolution_overrideable"]["flops"] == 2 * (2 * 8 * 16 * 16) * 3 * 9


def test_reads_to_the_host_are_read_backs(dev: torch.device) -> None:
    x = torch.randn(100, device=dev)
    counters, _ = _run(lambda: (x.cpu(), x.sum().item(), torch.nonzero(x > 0)))
    priced = simulated.priced(profiles.SHIPPED["intel-arc"], counters)
    # .cpu(), .item() and nonzero's count
    assert priced.readbacks == 3
    assert priced.split.readback == pytest.approx(3 * 120e-6)
    assert priced.by_operator[pricing.TO_HOST].copy == pytest.approx(400 / 16e9)


def test_a_fallback_costs_a_read_back_per_argument_its_copies_and_its_cpu_kernel(
    dev: torch.device,
) -> None:
    a, b = torch.randn(1000, device=dev), torch.randn(1000, device=dev)
    counters, costs = _run(lambda: torch.lerp(a, b, 0.25))  # no DirectML kernel
    entry = costs["aten::lerp.Scalar_out"]
    assert entry["readbacks"] == 2 and entry["readback_bytes"] == 8000
    assert entry["upload_bytes"] == 4000  # the result, back to the device
    assert entry["cpu_ns"] > 0 and entry["flops"] == 0
    priced = simulated.priced(profiles.SHIPPED["rdna2-desktop"], counters)
    split = priced.by_operator["aten::lerp.Scalar_out"]
    assert split.readback == pytest.approx(2 * 130e-6)
    assert split.copy == pytest.approx(12000 / 16e9)
    assert split.host == pytest.approx(entry["cpu_ns"] * 1e-9)
    assert split.launch == 0


def test_views_and_allocation_launch_nothing(dev: torch.device) -> None:
    x = torch.randn(8, 8, device=dev)
    counters, _ = _run(lambda: (x.view(64), x.t(), torch.empty(4, device=dev)))
    assert simulated.priced(None, counters).launches == 0


def test_one_run_is_priced_on_every_shipped_profile(dev: torch.device) -> None:
    a = torch.randn(512, 512, device=dev)
    counters, _ = _run(lambda: a @ a)
    priced = {p.name: simulated.priced(p, counters).total for p in simulated.models()}
    assert set(profiles.SHIPPED) <= set(priced)
    # An integrated GPU computes a 512^3 product several times slower than a desktop card.
    assert priced["intel-igpu"] > 4 * priced["rdna3-desktop"]


@pytest.mark.parametrize("name", list(profiles.SHIPPED))
def test_calibration_recovers_each_shipped_profile(dev: torch.device, name: str) -> None:
    profile = profiles.SHIPPED[name]
    clock = calibrate.Clock(lambda: simulated.priced(profile).total, f"modelled {name}")
    measured = calibrate.measure(dev, clock, sim.device_name(0)).profile
    for figure in DEVICE_FIGURES:
        assert getattr(measured, figure) == pytest.approx(getattr(profile, figure), rel=0.1), figure
    assert measured.host_call_us > 0 and measured.host_gflops > 0


def _dmlpatch(*arguments: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dmlpatch", *arguments],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=300,
    )


def test_calibrate_on_the_simulated_device_writes_the_profile_it_measured(tmp_path: Path) -> None:
    env = {"DMLPATCH_CACHE_DIR": str(tmp_path), "DMLPATCH_COST_PROFILE": "intel-igpu"}
    done = _dmlpatch("calibrate", "--device", "sim", "--json", env=env)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["compared_with"] == "intel-igpu" and data["driver"] == "simulated"
    for figure in DEVICE_FIGURES:
        expected = getattr(profiles.SHIPPED["intel-igpu"], figure)
        assert data["profile"][figure] == pytest.approx(expected, rel=0.1), figure
    written = Path(data["written"])
    assert written.parent.parent == tmp_path and written.is_file()
    stored = json.loads(written.read_text())
    assert stored["adapter"] == "Simulated Radeon (discrete)"
    assert stored["profile"] == data["profile"]
    # Each probed fix timed both ways (forced), beside the model's price of both.
    checks = {check["label"]: check for check in data["fixes"]}
    assert {"eigh 32x32", "solve_triangular 1024 x 3x3"} <= set(checks)
    assert stored["fixes"] == data["fixes"]
    for check in checks.values():
        assert check["composition_s"] > 0 and check["fallback_s"] > 0
        assert check["modelled_composition_s"] > 0 and check["modelled_fallback_s"] > 0
    # Thousands of launches against one round trip: measured and modelled agree by far.
    eigh = checks["eigh 32x32"]
    assert eigh["composition_s"] > 10 * eigh["fallback_s"] and eigh["agrees"]


def test_calibrate_says_in_one_line_what_it_cannot_measure(tmp_path: Path) -> None:
    env = {"DMLPATCH_CACHE_DIR": str(tmp_path)}
    for arguments, text in (
        (("--device", "cuda"), "measures a DirectML adapter (dml, dml:N) or the simulated"),
        (("--device", "dml:x"), "the adapter must be a number"),
        (("--nonsense",), "calibrate takes only --device, --json and --no-save"),
    ):
        done = _dmlpatch("calibrate", *arguments, env=env)
        assert done.returncode == 2
        assert done.stderr.count("\n") == 1 and text in done.stderr, done.stderr
    assert not any(tmp_path.iterdir())


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    from dmlpatch import paths

    monkeypatch.setenv("DMLPATCH_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(paths, "_subdirectories", {})
    monkeypatch.delenv("DMLPATCH_COST_PROFILE", raising=False)
    return tmp_path


ARC = "Intel(R) Arc(TM) A770 Graphics"


def test_a_measured_profile_prices_later_runs_on_its_adapter(cache: Path) -> None:
    measured = profiles.Profile(
        "measured", ARC, **{**profiles.SHIPPED["intel-arc"].figures(), "launch_us": 21.0}
    )
    machine.save(ARC, "unknown", measured)
    chosen = active.choose("directml", ARC)
    assert chosen.profile.launch_us == 21.0 and "measured on this adapter" in chosen.how
    # Another adapter still gets the shipped profile closest to its name.
    assert active.choose("directml", "AMD Radeon RX 7900 XTX").profile.name == "rdna3-desktop"


@pytest.mark.parametrize(
    "content",
    ["{not json", json.dumps({"format": 99}), json.dumps({"format": 1, "adapter": ARC})],
)
def test_an_unusable_measured_profile_is_ignored_in_one_line_and_removed(
    cache: Path, content: str, capsys: pytest.CaptureFixture[str]
) -> None:
    where = machine.path(ARC, "unknown", create=True)
    assert where is not None
    Path(where).write_text(content)
    from dmlpatch import log

    log._said.clear()
    chosen = active.choose("directml", ARC)
    assert chosen.profile.name == "intel-arc"
    err = capsys.readouterr().err
    assert "ignored the measured profile" in err and "dmlpatch calibrate" in err
    assert not os.path.exists(where)


def test_an_unknown_cost_profile_setting_is_said_and_ignored(
    cache: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from dmlpatch import log

    log._said.clear()
    monkeypatch.setenv("DMLPATCH_COST_PROFILE", "geforce-9000")
    chosen = active.choose("directml", ARC)
    assert chosen.profile.name == "intel-arc"
    err = capsys.readouterr().err
    assert "DMLPATCH_COST_PROFILE='geforce-9000' is neither a shipped profile" in err
    assert err.count("\n") == 2  # that line, and which shipped profile is used instead


def test_the_closest_shipped_profile_follows_the_adapters_name() -> None:
    assert profiles.closest("AMD Radeon RX 6600")[0].name == "rdna2-desktop"
    assert profiles.closest("AMD Radeon RX 7800 XT")[0].name == "rdna3-desktop"
    assert profiles.closest("Intel(R) UHD Graphics 630")[0].name == "intel-igpu"
    assert profiles.closest("Intel(R) Iris(R) Xe Graphics")[0].name == "intel-igpu"
    assert profiles.closest(ARC)[0].name == "intel-arc"
    assert profiles.closest("Some GPU") == (profiles.SHIPPED[profiles.DEFAULT], False)


def test_every_shipped_figure_says_where_it_comes_from() -> None:
    for profile in profiles.SHIPPED.values():
        assert set(profile.sources) == set(profiles.FIGURES), profile.name
        assert all(profile.sources.values())


def test_the_choice_prices_both_sides_on_the_profile(monkeypatch: pytest.MonkeyPatch) -> None:
    profile = profiles.SHIPPED["rdna2-desktop"]
    many = choice.OnDevice(launches=5000, readbacks=4)
    few = choice.OnDevice(launches=10, bytes=1e6)
    fallback = choice.ThroughTheCpu(down_bytes=4096, up_bytes=4096, arguments=1, host_flops=3e5)
    assert choice.device_seconds(many, profile) > choice.fallback_seconds(fallback, profile)
    assert choice.device_seconds(few, profile) < choice.fallback_seconds(fallback, profile)
    monkeypatch.setattr(active, "_chosen", active.Chosen(profile, "test"))
    chooser = choice.Chooser("aten::example")
    asked = []

    def costs() -> choice.Costs:
        asked.append(1)
        return choice.Costs(many, fallback)

    assert chooser.on_device(("32x32", "float32"), costs) is False
    assert chooser.on_device(("32x32", "float32"), costs) is False
    assert len(asked) == 1  # a key seen before is answered from memory
    monkeypatch.setenv("DMLPATCH_DEVICE_OPS", "aten::example")
    chooser.reset()
    assert chooser.on_device(("32x32", "float32"), costs) is True


def test_the_performance_page_lists_the_shipped_profiles_as_they_are() -> None:
    page = Path(__file__).resolve().parents[3] / "docs" / "reference" / "performance.md"
    rows = {}
    for line in page.read_text(encoding="utf-8").splitlines():
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if len(cells) == 7 and cells[0].startswith("`") and cells[0].strip("`") in profiles.SHIPPED:
            rows[cells[0].strip("`")] = cells
    assert set(rows) == set(profiles.SHIPPED)
    for name, cells in rows.items():
        p = profiles.SHIPPED[name]
        assert cells[1] == p.adapter
        assert [float(cells[2]), float(cells[3])] == [p.launch_us, p.readback_us]
        assert [float(x) for x in cells[4].split("/")] == [p.upload_gbps, p.download_gbps]
        assert float(cells[5]) == p.memory_gbps
        assert [float(x) for x in cells[6].split("/")] == [p.float_tflops, p.half_tflops]
