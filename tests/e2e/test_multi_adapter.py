"""Several DirectML adapters: DataParallel and DDP over gloo, on two simulated adapters.

The oracle is the CPU: DataParallel over N adapters must compute what the model computes on the
N chunks of each batch; DDP over N ranks must end with the parameters of one process training
on the whole batch.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from support import REPO, clean_env, run_python

MULTI = Path(__file__).parent / "multi"
DP_PROGRAM = str(MULTI / "dp_program.py")
DDP_PROGRAM = str(MULTI / "ddp_program.py")
GLOO_THREADS_PROGRAM = str(MULTI / "gloo_threads_program.py")
PEER_DIES_PROGRAM = str(MULTI / "peer_dies_program.py")
EXAMPLE = str(REPO / "examples" / "train_cnn.py")
TWO_ADAPTERS = clean_env(DMLPATCH_SIM_DEVICES="2")


def _json_line(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def _close(a: list, b: list, tolerance: float) -> bool:
    flat_a = torch.tensor([x for row in a for x in (row if isinstance(row, list) else [row])])
    flat_b = torch.tensor([x for row in b for x in (row if isinstance(row, list) else [row])])
    return flat_a.shape == flat_b.shape and torch.allclose(flat_a, flat_b, atol=tolerance, rtol=0)


def _dmlpatch(device: str, *args: str, report: Path | None = None):
    options = ["--device", device] + ([f"--report={report}"] if report else [])
    return run_python(["-m", "dmlpatch", *options, *args], env=TWO_ADAPTERS, timeout=300)


# -- DataParallel --------------------------------------------------------------------------


def test_data_parallel_over_two_adapters_equals_the_chunked_cpu_computation(
    tmp_path: Path,
) -> None:
    reference = run_python([DP_PROGRAM, "--reference", "2"])
    assert reference.code == 0, reference.err
    report = tmp_path / "report.json"
    result = _dmlpatch("sim:0,1", DP_PROGRAM, report=report)
    assert result.code == 0, result.err
    got, want = _json_line(result.out), _json_line(reference.out)
    assert (got["wrapped"], got["device_count"], got["device"]) == (True, 2, "privateuseone:0")
    assert _close(got["losses"], want["losses"], 1e-5)
    assert _close(got["parameters"], want["parameters"], 1e-5)

    counters = json.loads(report.read_text())
    assert counters["ops"]["refused"] == {} and counters["ops"]["fallback"] == {}
    # Both replicas ran: 2 convolutions per step, one on each adapter.
    assert counters["ops"]["native"]["aten::convolution_overrideable"] == 4 * 2
    # Per step, adapter 0 <-> adapter 1: the second input chunk, 6 parameters and 3 BatchNorm
    # buffers to the replica, its output back; in backward the output's gradient out and the
    # 6 parameter gradients back. Nothing else crosses. DirectML would copy each as zeros
    # (microsoft/DirectML#443): each goes through the host instead, a d2h and an h2d copy.
    parameters, buffers = 6, 3
    crossings = 4 * (1 + parameters + buffers + 1 + 1 + 6)
    copies = counters["transfers"]["program"]
    assert copies["d2d"]["count"] == 0
    assert counters["ops"]["fixed"]["aten::_to_copy"] == crossings
    # And the program's own read of its 6 parameters at the end (item() is no tensor copy).
    assert copies["d2h"]["count"] == crossings + parameters
    # Both replicas' layers count as the device's: DataParallel is model compute there.
    assert counters["compute"]["device_share"] == 1.0


def test_data_parallel_on_the_one_selected_adapter_is_the_plain_model() -> None:
    cpu = run_python([DP_PROGRAM, "--always-wrap"])
    assert cpu.code == 0, cpu.err
    result = _dmlpatch("sim", DP_PROGRAM, "--always-wrap")
    assert result.code == 0, result.err
    got, want = _json_line(result.out), _json_line(cpu.out)
    # Two adapters exist, one is selected: DataParallel uses that one and nothing is split.
    assert (got["wrapped"], got["device_count"], got["device"]) == (True, 1, "privateuseone:0")
    # Two processes: the CPU's thread pool may split a reduction differently under load, so the
    # last bit can differ (as in tests/e2e/sim, held to one float32 rounding step).
    assert _close(got["losses"], want["losses"], 1e-6)
    assert _close(got["parameters"], want["parameters"], 1e-6)


def test_data_parallel_without_dmlpatch_stays_torchs_own() -> None:
    """The wrappers act only on DirectML: a CPU DataParallel is untouched (same numbers)."""
    plain = run_python([DP_PROGRAM, "--always-wrap"])
    patched = run_python(["-m", "dmlpatch", "--device", "cpu", DP_PROGRAM, "--always-wrap"])
    assert plain.code == patched.code == 0, patched.err
    assert _json_line(plain.out) == _json_line(patched.out)


def test_the_example_cifar_script_uses_both_adapters_when_asked(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    result = _dmlpatch("sim:0,1", EXAMPLE, "--epochs", "1", "--samples", "128", report=report)
    assert result.code == 0, result.err
    assert "using 2 GPUs" in result.out
    assert "parameters on: privateuseone:0" in result.out
    counters = json.loads(report.read_text())
    assert counters["ops"]["native"]["aten::convolution_overrideable"] == 4 * 2 * 2
    # 12 parameters, 3 BatchNorm buffers: 1 + 12 + 3 + 1 forward, 1 + 12 backward, per step,
    # each through the host (microsoft/DirectML#443).
    assert counters["ops"]["fixed"]["aten::_to_copy"] == 4 * 30
    assert counters["transfers"]["program"]["d2d"]["count"] == 0


# -- DDP -----------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _single_process_reference(world: int) -> list[list[float]]:
    sys.path.insert(0, str(MULTI))
    try:
        import ddp_program
    finally:
        sys.path.remove(str(MULTI))
    net = ddp_program.model()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    for inputs, targets in ddp_program.batches(world):
        optimizer.zero_grad()
        ((net(inputs) - targets) ** 2).mean().backward()
        optimizer.step()
    return [p.detach().flatten().tolist() for p in net.parameters()]


def _ddp(tmp_path: Path, hook: str) -> tuple[object, list[dict]]:
    out = tmp_path / "rank"
    result = _dmlpatch("sim:0,1", DDP_PROGRAM, str(_free_port()), str(out), hook)
    ranks = (
        [json.loads(Path(f"{out}.{rank}").read_text()) for rank in range(2)]
        if (result.code == 0)
        else []
    )
    return result, ranks


def test_ddp_trains_two_ranks_on_two_adapters_like_one_process(tmp_path: Path) -> None:
    result, ranks = _ddp(tmp_path, "default")
    assert result.code == 0, result.err
    assert "ranks: 2" in result.out
    assert [r["device"] for r in ranks] == ["privateuseone:0", "privateuseone:1"]
    assert ranks[0]["parameters"] == ranks[1]["parameters"]
    assert _close(ranks[0]["parameters"], _single_process_reference(2), 1e-6)
    # One line for the whole job (rank 0), not one per rank.
    warnings = [line for line in result.err_lines if "no NCCL" in line]
    assert warnings == [
        "dmlpatch: warning: DirectML has no NCCL: backend 'nccl' becomes gloo, "
        "with DirectML tensors staged through the host"
    ]
    assert "Traceback" not in result.err
    for rank in ranks:
        gradient, inputs = rank["gradient_bytes"], rank["input_bytes"]
        for number, step in enumerate(rank["copies_per_step"]):
            extra = {"count": 0, "bytes": 0}
            if number == 1:
                # After the first backward DDP rebuilds its buckets and broadcasts their layout
                # (two small int tensors, each to the device, staged, back, and read).
                extra = {"count": 4, "bytes": 48}
            # The hook: the bucket out once and back once, 2 x gradient bytes in all.
            assert step["d2h"] == {"count": 1 + extra["count"], "bytes": gradient + extra["bytes"]}
            assert step["h2d"] == {
                "count": 2 + 1 + extra["count"],
                "bytes": inputs + gradient + extra["bytes"],
            }
            assert step["d2d"] == {"count": 0, "bytes": 0}
        assert rank["all_reduce"] == 3.0
        assert rank["all_reduce_avg"] == 1.5  # AVG on gloo, which torch 2.4's gloo refuses
        assert rank["broadcast_object"] == {"from": 0}
        assert rank["all_gather_object_in_inference_mode"] == [{"rank": 0}, {"rank": 1}]


def test_ddp_takes_the_programs_own_comm_hook(tmp_path: Path) -> None:
    """fp16_compress_hook registered by the program replaces dmlpatch's (no 'only once')."""
    result, ranks = _ddp(tmp_path, "fp16")
    assert result.code == 0, result.err
    assert ranks[0]["parameters"] == ranks[1]["parameters"]
    assert _close(ranks[0]["parameters"], _single_process_reference(2), 1e-3)
    for rank in ranks:
        staged = rank["copies_per_step"][0]["d2h"]
        assert staged == {"count": 1, "bytes": rank["gradient_bytes"] // 2}  # float16 bucket


def test_ddp_find_unused_parameters_runs_without_it_and_says_so(tmp_path: Path) -> None:
    result, ranks = _ddp(tmp_path, "find-unused")
    assert result.code == 0, result.err
    assert ranks[0]["parameters"] == ranks[1]["parameters"]
    assert _close(ranks[0]["parameters"], _single_process_reference(2), 1e-6)
    said = [line for line in result.err_lines if "find_unused_parameters" in line]
    assert said == [
        "dmlpatch: warning: DDP's find_unused_parameters=True needs pinned host memory, which "
        "DirectML does not have: running with False (a parameter left without a gradient then "
        "stops DDP at the next step, naming it)"
    ]


def test_gloo_never_frees_what_python_handed_it(tmp_path: Path) -> None:
    """gloo's C++ worker must not free a Python object: it would take the GIL, and a rank that
    exits right after its last step then aborts ("terminate called without an active
    exception"). Every host tensor handed to gloo is freed on a Python thread, none is left."""
    out = tmp_path / "rank"
    result = _dmlpatch("sim:0,1", GLOO_THREADS_PROGRAM, str(_free_port()), str(out))
    assert result.code == 0, result.err
    for rank in range(2):
        seen = json.loads(Path(f"{out}.{rank}").read_text())
        # 10 buckets, then all_reduce x2, broadcast, all_gather_object (2 all_gathers of
        # 2 tensors each) and the buffers DDP broadcasts when it starts.
        assert seen["handed"] >= 10 + 3 + 4
        assert seen["freed"] == {"python": seen["handed"]}
        assert seen["alive"] == 0


def test_a_rank_whose_peer_dies_stops_with_gloos_error(tmp_path: Path) -> None:
    """The bucket allreduce fails on gloo's worker; DDP's backward raises gloo's message (as
    DDP's own hook would), and the rank exits 1 at once instead of waiting for gloo's timeout
    (30 minutes) or hanging at exit."""
    port = str(_free_port())
    command = [sys.executable, "-m", "dmlpatch", "--device", "sim:0,1", PEER_DIES_PROGRAM]
    ranks = [
        subprocess.Popen(
            [*command, str(rank), port],
            env=TWO_ADAPTERS,
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    (out0, err0), (_, err1) = (rank.communicate(timeout=180) for rank in ranks)
    assert ranks[1].returncode == 3, err1
    assert ranks[0].returncode == 1, err0
    assert out0 == "step 0\nstep 1\nstep 2\n"
    last = [line for line in err0.splitlines() if "RuntimeError" in line][-1]
    gloo_says = r"gloo/transport/tcp/pair\.cc:\d+\] (Connection closed by peer|Read error)"
    assert re.search(gloo_says, last), err0
    assert "Unable to cast" not in err0  # gloo's error itself, not an exception as a value
    assert "terminate called" not in err0


def test_torchrun_workers_run_the_script_rewritten(tmp_path: Path) -> None:
    """torchrun starts `python -u script.py`; under dmlpatch the workers start through it."""
    out = tmp_path / "rank"
    result = _dmlpatch(
        "sim:0,1",
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(MULTI / "torchrun_program.py"),
        str(out),
    )
    assert result.code == 0, result.err
    ranks = [json.loads(Path(f"{out}.{rank}").read_text()) for rank in range(2)]
    assert [r["device"] for r in ranks] == ["privateuseone:0", "privateuseone:1"]
    assert ranks[0]["parameters"] == ranks[1]["parameters"]
    assert _close(ranks[0]["parameters"], _single_process_reference(2), 1e-6)
    assert sum("running on" in line for line in result.err_lines) == 1


@pytest.mark.parametrize("backend", ["gloo", "nccl"])
def test_process_groups_off_directml_are_torchs_own(backend: str, tmp_path: Path) -> None:
    """Under --device cpu nothing is rerouted: gloo stays gloo, nccl fails as torch makes it."""
    program = tmp_path / "group.py"
    program.write_text(
        "import torch.distributed as dist\n"
        "try:\n"
        f"    dist.init_process_group({backend!r}, init_method='tcp://127.0.0.1:{_free_port()}',"
        " rank=0, world_size=1)\n"
        "    print(dist.get_backend())\n"
        "except Exception as error:\n"
        "    print('failed:', type(error).__name__)\n"
    )
    result = run_python(["-m", "dmlpatch", "--device", "cpu", str(program)])
    assert result.code == 0, result.err
    # torch's own failure for NCCL without a GPU (its type differs between torch releases).
    assert result.out.startswith("gloo" if backend == "gloo" else "failed:")
    assert "NCCL" not in result.err
