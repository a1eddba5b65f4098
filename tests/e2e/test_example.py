"""The demo: an unmodified CUDA-style CIFAR script trains on the simulated DirectML device,
with exactly the CPU's losses (the correctness oracle) and every copy accounted for, and says
so in a table and one summary line."""

from __future__ import annotations

import json
from pathlib import Path

from support import REPO, clean_env, run_python

SCRIPT = str(REPO / "examples" / "train_cnn.py")


def test_the_demo_trains_on_sim_like_on_cpu(tmp_path: Path) -> None:
    # examples/demo.py is what scripts/demo.sh runs after its set-up: train_cnn.py on the CPU,
    # then on the simulated device, the losses side by side and one summary line.
    report_path = tmp_path / "report.json"
    demo = run_python([str(REPO / "examples" / "demo.py"), f"--report={report_path}"])
    assert demo.code == 0, demo.err
    assert "device: privateuseone:0" in demo.out
    assert "parameters on: privateuseone:0" in demo.out
    assert demo.err_lines == [
        "dmlpatch: running on privateuseone:0 (Simulated Radeon (discrete)): requested sim: "
        "simulated DirectML device, profile torch-directml-0.2.5"
    ]
    lines = demo.out.splitlines()
    table = lines[lines.index(next(x for x in lines if x.strip().startswith("step"))) :]
    assert table[0].split() == ["step", "loss", "on", "the", "CPU", "loss", "on", "privateuseone:0"]
    rows = [row.split() for row in table[1:5]]
    # 32 batches of 16, a loss line every 8: the device's losses are the CPU's, digit for digit.
    assert [row[0] for row in rows] == ["1:8", "1:16", "1:24", "1:32"]
    assert all(row[1] == row[2] for row in rows), rows
    assert table[5] == "the same losses (4 lines)"
    assert table[6] == (
        "summary: 100% of model compute (0.68 GFLOP) on privateuseone:0; CPU fallbacks: 0 "
        "operator(s), 0 calls; fixed on the device: 2 operator(s), 94 calls; host<->device "
        "copies: 79 by the program (6.5 MB), 0 by fallbacks (0 B)"
    )
    assert len(table) == 7  # the summary ends it

    report = json.loads(report_path.read_text())
    assert (report["backend"], report["device"]) == ("sim", "privateuseone:0")
    # The device chosen by availability, device_count twice, and three values handed to torch.
    assert report["patches"]["__main__"]["modules"][0]["sites"] == 7
    assert report["ops"]["refused"] == {}
    assert report["ops"]["fallback"] == {}
    assert report["ops"]["native"]["aten::convolution_overrideable"] == 64
    # 32 batches x (images + labels), plus the 12 parameters and 3 BatchNorm buffers.
    program = report["transfers"]["program"]
    assert program["h2d"]["count"] == 32 * 2 + 12 + 3
    assert program["d2h"]["count"] == 0
    # Every loss.item() waits for the device; no CPU fallback copies anything.
    assert report["transfers"]["syncs"] >= 32
    assert report["transfers"]["fallback"] == {"count": 0, "bytes": 0, "by_operator": {}}
    # All model compute ran on the device, so the run ends without a placement warning.
    compute = report["compute"]
    assert compute["device_share"] == 1.0 and compute["on_cpu"] == {"calls": 0, "flops": 0}
    # 32 forward passes of 2 convolutions, 1 BatchNorm and 3 linear layers.
    assert compute["on_device"]["calls"] == 32 * 6 and compute["cpu_lines"] == []


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
