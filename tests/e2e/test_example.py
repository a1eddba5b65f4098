"""The demo: an unmodified CUDA-style CIFAR script trains on the simulated DirectML device,
with exactly the CPU's losses (the correctness oracle) and every copy accounted for."""

from __future__ import annotations

import json
from pathlib import Path

from support import REPO, clean_env, run_python

SCRIPT = str(REPO / "examples" / "train_cnn.py")


def _losses(out: str) -> list[str]:
    return [line for line in out.splitlines() if "loss:" in line]


def test_cifar_script_trains_on_sim_like_on_cpu(tmp_path: Path) -> None:
    cpu = run_python([SCRIPT, "--epochs", "1"])
    assert cpu.code == 0, cpu.err
    report_path = tmp_path / "report.json"
    sim = run_python(
        ["-m", "dmlpatch", "--device", "sim", f"--report={report_path}", SCRIPT, "--epochs", "1"]
    )
    assert sim.code == 0, sim.err
    assert "device: privateuseone:0" in sim.out
    assert "parameters on: privateuseone:0" in sim.out
    assert _losses(sim.out) == _losses(cpu.out) and len(_losses(cpu.out)) == 2
    assert sim.err_lines[0].startswith(
        "dmlpatch: running on privateuseone:0 (Simulated Radeon (discrete))"
    )

    report = json.loads(report_path.read_text())
    assert (report["backend"], report["device"]) == ("sim", "privateuseone:0")
    assert report["patches"]["__main__"]["modules"][0]["sites"] == 4
    assert report["ops"]["refused"] == {}
    assert report["ops"]["fallback"] == {}
    assert report["ops"]["native"]["aten::convolution_overrideable"] == 32
    # 16 batches x (images + labels), plus the 12 parameters and 3 BatchNorm buffers.
    program = report["transfers"]["program"]
    assert program["h2d"]["count"] == 16 * 2 + 12 + 3
    assert program["d2h"]["count"] == 0
    # Every loss.item() waits for the device; no CPU fallback copies anything.
    assert report["transfers"]["syncs"] >= 16
    assert report["transfers"]["fallback"] == {"count": 0, "bytes": 0, "by_operator": {}}
    # All model compute ran on the device, so the run ends without a placement warning.
    compute = report["compute"]
    assert compute["device_share"] == 1.0 and compute["on_cpu"] == {"calls": 0, "flops": 0}
    # 16 forward passes of 2 convolutions, 1 BatchNorm and 3 linear layers.
    assert compute["on_device"]["calls"] == 16 * 6 and compute["cpu_lines"] == []
    assert "warning" not in sim.err


def test_without_dmlpatch_the_script_stays_on_cpu() -> None:
    plain = run_python([SCRIPT, "--epochs", "1", "--samples", "64"])
    assert "parameters on: cpu" in plain.out


def test_two_simulated_adapters_do_not_trigger_data_parallel() -> None:
    result = run_python(
        ["-m", "dmlpatch", "--device", "sim", SCRIPT, "--epochs", "1", "--samples", "64"],
        env=clean_env(DMLPATCH_SIM_DEVICES="2"),
    )
    assert result.code == 0, result.err
    assert "using 2 GPUs" not in result.out
    assert "parameters on: privateuseone:0" in result.out
