"""Cost of each op fix on the simulated device: fixed on the device vs DirectML's CPU-fallback
path (two copies per call, forced with DMLPATCH_CPU_OPS's kernel) vs the CPU, copies per call;
what the fixes of DirectML's wrong answers cost the calls it gets right, before their trigger
(no bool or uint8 tensor on the device yet) and after it; and the accounting observer's cost,
off and on.

    python benchmarks/ops.py [--repeat N] [--only LABEL-PART]

The simulated device runs CPU kernels, so the figures compare code paths (kernel launches,
copies), not a GPU. Copies per call come from the simulator's counters.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any, Callable

import torch

import dmlpatch.sim as sim
from dmlpatch import opfix
from dmlpatch.environment_variables import DMLPATCH_DEVICE_OPS
from dmlpatch.errors import UsageError
from dmlpatch.opfix import cpu_ops
from dmlpatch.opfix.observer import Observer

PROFILE = "torch-directml-0.2.5"


def _time(call: Callable[[], Any], repeat: int) -> float:
    call()
    start = time.perf_counter()
    for _ in range(repeat):
        call()
    return (time.perf_counter() - start) / repeat * 1e6


def _cases(dev: torch.device) -> dict[str, tuple[str, Callable[[torch.device], Any]]]:
    batch = torch.randint(0, 16, (512,))
    image = torch.randn(8, 16, 32, 32)
    small = torch.randn(2, 3, 4, 1, 2)
    base, index = torch.zeros(64, 64), torch.randint(0, 64, (32, 16))
    src = torch.randn(40, 20)
    tensors = {
        d: (batch.to(d), image.to(d), small.to(d), base.to(d), index.to(d), src.to(d))
        for d in (dev, torch.device("cpu"))
    }
    return {
        "unique(return_counts)": (
            "aten::_unique2",
            lambda d: tensors[d][0].unique(return_counts=True),
        ),
        "avg_pool2d(divisor)": (
            "aten::avg_pool2d",
            lambda d: torch.nn.functional.avg_pool2d(tensors[d][1], 3, 2, 1, divisor_override=5),
        ),
        "repeat(5-D)": ("aten::repeat", lambda d: tensors[d][2].repeat(2, 1, 2, 3, 2)),
        "scatter(partial)": (
            "aten::scatter.src",
            lambda d: tensors[d][3].scatter(0, tensors[d][4], tensors[d][5]),
        ),
        **_model_cases(dev),
    }


def _model_cases(dev: torch.device) -> dict[str, tuple[str, Callable[[torch.device], Any]]]:
    """The CPU fallbacks (and the missing LSTM cell) common models meet every step."""
    mask = (torch.rand(8, 1, 128, 128) > 0.5).float() * torch.finfo(torch.float32).min
    x = torch.randn(8, 64, 32, 32)
    weight, bias = torch.randn(64), torch.randn(64)
    mean_rstd = torch.ops.aten.native_group_norm(x, weight, bias, 8, 64, 1024, 32, 1e-5)[1:]
    gates, cell = torch.randn(32, 4 * 256), torch.randn(32, 256)
    probabilities, targets = torch.rand(64, 80).clamp(0.01, 0.99), torch.rand(64, 80)
    betas, rows = torch.linspace(1e-4, 0.02, 1000), torch.randn(64, 512)
    value, grid = torch.randn(8, 32, 20, 20), torch.rand(8, 300, 4, 2) * 2 - 1
    repeats, audio = torch.randint(0, 4, (512,)), torch.randn(4, 80, 500)
    cameras = torch.randn(64, 4, 4) + 4 * torch.eye(4)
    system, rhs = torch.randn(8, 8) + 8 * torch.eye(8), torch.randn(8, 8)
    tall, square = torch.randn(256, 16), torch.randn(16, 64, 64)
    points = torch.randn(256, 3, 3)  # kornia's point-set alignment: 3x3 covariances
    features = torch.randn(32, 32)
    covariance = features @ features.mT / 32 + torch.eye(32)
    generator = torch.randn(16, 8, 8) * 0.3
    factor = torch.linalg.cholesky(covariance)
    indefinite = features + features.mT
    tensors = {
        d: [t.to(d) for t in (mask, x, weight, *mean_rstd, gates, cell, probabilities, targets)]
        + [t.to(d) for t in (betas, rows, value, grid, repeats, audio, cameras, system, rhs)]
        + [t.to(d) for t in (tall, square, points, covariance, generator, factor, indefinite)]
        for d in (dev, torch.device("cpu"))
    }

    def group_norm_backward(d: torch.device) -> Any:
        x, w, mean, rstd = tensors[d][1:5]
        return torch.ops.aten.native_group_norm_backward(
            x, x, mean, rstd, w, 8, 64, 1024, 32, [True, True, True]
        )

    return {
        "isneginf(attn mask)": ("aten::isneginf", lambda d: torch.isneginf(tensors[d][0])),
        "group_norm backward": ("aten::native_group_norm_backward", group_norm_backward),
        "lstm cell (missing)": (
            "",
            lambda d: (
                torch.ops.aten._thnn_fused_lstm_cell(tensors[d][5], tensors[d][5], tensors[d][6])
                if d != torch.device("cpu")
                else torch.lstm_cell(tensors[d][6], (tensors[d][6], tensors[d][6]), *_lstm(d))
            ),
        ),
        "var_mean": ("aten::var_mean", lambda d: torch.var_mean(tensors[d][10], dim=1)),
        "cumprod(1000)": ("aten::cumprod", lambda d: torch.cumprod(1 - tensors[d][9], 0)),
        "eye(256)": ("aten::eye", lambda d: torch.eye(256, device=d)),
        "logit": ("aten::logit", lambda d: torch.logit(tensors[d][7], 1e-6)),
        "binary_cross_entropy": (
            "aten::binary_cross_entropy",
            lambda d: torch.nn.functional.binary_cross_entropy(tensors[d][7], tensors[d][8]),
        ),
        "grid_sample (RT-DETR)": (
            "aten::grid_sampler_2d",
            lambda d: torch.nn.functional.grid_sample(
                tensors[d][11], tensors[d][12], align_corners=False
            ),
        ),
        "repeat_interleave": (
            "aten::repeat_interleave.Tensor",
            lambda d: torch.repeat_interleave(tensors[d][13]),
        ),
        "count_nonzero": (
            "aten::count_nonzero.dim_IntList",
            lambda d: torch.count_nonzero(tensors[d][10], dim=1),
        ),
        "upsample_nearest1d": (
            "aten::upsample_nearest1d",
            lambda d: torch.nn.functional.interpolate(tensors[d][14], scale_factor=2),
        ),
        "AdamW(fused) step": ("aten::_fused_adamw_", lambda d: _fused_optimizer(d).step()),
        "inv of 64 4x4": ("aten::linalg_inv_ex", lambda d: torch.linalg.inv(tensors[d][15])),
        "solve 8x8, 8 columns": (
            "aten::_linalg_solve_ex",
            lambda d: torch.linalg.solve(tensors[d][16], tensors[d][17]),
        ),
        "qr 256x16": ("aten::linalg_qr", lambda d: torch.linalg.qr(tensors[d][18])),
        "qr of 16 64x64": ("aten::linalg_qr", lambda d: torch.linalg.qr(tensors[d][19])),
        "svd of 256 3x3": ("aten::_linalg_svd", lambda d: torch.linalg.svd(tensors[d][20])),
        "eigh of 256 3x3": ("aten::_linalg_eigh", lambda d: torch.linalg.eigh(tensors[d][20])),
        "eigh 32x32": ("aten::_linalg_eigh", lambda d: torch.linalg.eigh(tensors[d][21])),
        "svd 32x32": ("aten::_linalg_svd", lambda d: torch.linalg.svd(tensors[d][21])),
        "cholesky 32x32": (
            "aten::linalg_cholesky_ex",
            lambda d: torch.linalg.cholesky(tensors[d][21]),
        ),
        "lstsq 256x16": (
            "aten::linalg_lstsq",
            lambda d: torch.linalg.lstsq(tensors[d][18], tensors[d][18][:, :2]),
        ),
        "cholesky_inverse 32x32": (
            "aten::cholesky_inverse",
            lambda d: torch.cholesky_inverse(tensors[d][23]),
        ),
        "triangular_solve 32x32": (
            "aten::triangular_solve",
            lambda d: torch.triangular_solve(tensors[d][21], tensors[d][23], upper=False),
        ),
        "ldl_factor 32x32": (
            "aten::linalg_ldl_factor_ex",
            lambda d: torch.linalg.ldl_factor(tensors[d][24]),
        ),
        "matrix_exp of 16 8x8": (
            "aten::linalg_matrix_exp",
            lambda d: torch.linalg.matrix_exp(tensors[d][22]),
        ),
    }


_OPTIMIZERS: dict[torch.device, torch.optim.Optimizer] = {}


def _fused_optimizer(d: torch.device) -> torch.optim.Optimizer:
    """transformers' Trainer default: AdamW(fused=True) over four 256x256 parameters."""
    if d not in _OPTIMIZERS:
        generator = torch.Generator().manual_seed(0)
        params = []
        for _ in range(4):
            param = torch.randn(256, 256, generator=generator).to(d).requires_grad_()
            param.grad = torch.randn(256, 256, generator=generator).to(d)
            params.append(param)
        _OPTIMIZERS[d] = torch.optim.AdamW(params, lr=1e-3, fused=True)
    return _OPTIMIZERS[d]


_LSTM_WEIGHTS: dict[str, Any] = {}


def _lstm(d: torch.device) -> tuple[torch.Tensor, ...]:
    """CPU LSTM cell weights for the CPU column (the CPU has no fused cell)."""
    if "w" not in _LSTM_WEIGHTS:
        _LSTM_WEIGHTS["w"] = (torch.randn(1024, 256), torch.randn(1024, 256))
    return _LSTM_WEIGHTS["w"]


def _right_call_rows(dev: torch.device, repeat: int) -> None:
    """What the fixes of DirectML's wrong answers cost the calls it gets right: DirectML's own
    kernel (no fixes), the fixes installed while their trigger has not appeared (no bool or
    uint8 tensor on the device yet: products and sums are DirectML's own), and after it."""
    x, y = torch.randn(64, 64).to(dev), torch.randn(64, 64).to(dev)
    host = torch.randn(64, 64)
    destination = torch.empty(64, 64).to(dev)
    rows: dict[str, Callable[[], Any]] = {
        "x * y": lambda: x * y,
        "x.mul_(1.0)": lambda: x.mul_(1.0),
        "x + y": lambda: x + y,
        "x.sum(0)": lambda: x.sum(0),
        "x.mean()": lambda: x.mean(),
        "x.to(float16)": lambda: x.to(torch.float16),
        "host.to(device) (_to_copy)": lambda: host.to(dev),
        "dst.copy_(x)": lambda: destination.copy_(x),
        "torch.empty(64, 64, device)": lambda: torch.empty(64, 64, device=dev),
    }
    times: dict[str, dict[str, list[float]]] = {label: {} for label in rows}
    for _ in range(3):  # interleaved rounds, the best of each
        for state in ("directml", "waiting", "armed"):
            opfix.uninstall()
            if state != "directml":
                opfix.install("sim", PROFILE)
            if state == "armed":
                opfix.arm_all()
            for label, call in rows.items():
                times[label].setdefault(state, []).append(_cpu_time(call, repeat * 5))
    opfix.uninstall()
    opfix.install("sim", PROFILE)
    print(
        f"\n{'call DirectML gets right':28} {'directml':>9} {'waiting':>9} {'armed':>9}   us/call"
    )
    for label, by_state in times.items():
        own, waiting, armed = (min(by_state[s]) for s in ("directml", "waiting", "armed"))
        print(f"{label:28} {own:9.2f} {waiting - own:+9.2f} {armed - own:+9.2f}")


def _cpu_time(call: Callable[[], Any], repeat: int) -> float:
    """Microseconds of this process's CPU per call (a busy machine's other work left out)."""
    call()
    start = time.process_time()
    for _ in range(repeat):
        call()
    return (time.process_time() - start) / repeat * 1e6


def _wrong_answer_rows(dev: torch.device, repeat: int) -> None:
    """The calls DirectML gets wrong, fixed, beside DirectML's own kernel."""
    x = torch.randn(64, 64).to(dev)
    mask = (torch.rand(64, 64) > 0.5).to(dev)
    pixels = torch.randint(0, 255, (64, 64), dtype=torch.uint8).to(dev)
    logits, target = torch.randn(64, 1000).to(dev), torch.randint(0, 1000, (64,)).to(dev)
    grad = torch.ones(64).to(dev)
    total_weight = torch.tensor(64.0).to(dev)

    def nll_backward() -> Any:
        return torch.ops.aten.nll_loss_backward(grad, logits, target, None, 0, -100, total_weight)

    rows: dict[str, tuple[Callable[[], Any], str]] = {
        "x * mask (wrong: bool)": (lambda: x * mask, ""),
        "uint8 sum (fails)": (lambda: pixels.sum(), "fails"),
        "nll backward none (zeros)": (nll_backward, ""),
    }
    print(f"\n{'wrong-answer fix':26} {'fixed us':>9} {'directml us':>11} {'difference':>10}")
    for label, (call, directml_fails) in rows.items():
        fixed = _time(call, repeat * 5)
        opfix.uninstall()
        own = float("nan") if directml_fails else _time(call, repeat * 5)
        opfix.install("sim", PROFILE)
        opfix.arm_all()
        shown = "fails" if directml_fails else f"{own:.1f}"
        print(f"{label:26} {fixed:9.1f} {shown:>11} {fixed - own:+10.1f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--only", default="", help="the op rows whose label contains this")
    arguments = parser.parse_args()
    repeat = arguments.repeat
    # The "fixed" column is the composition's, whatever the cost model would pick per call
    # (benchmarks/choice.py has what the choice itself costs).
    os.environ.setdefault(DMLPATCH_DEVICE_OPS, "all")
    sim.load(PROFILE)
    dev = sim.device()
    opfix.install("sim", PROFILE)
    library = torch.library.Library("aten", "IMPL")  # the CPU-fallback path, per op
    print(f"{'op':24} {'fixed us':>9} {'fallback us':>11} {'cpu us':>8} {'copies/call':>11}")
    for label, (op, call) in _cases(dev).items():
        if arguments.only not in label:
            continue
        fixed = _time(lambda call=call: call(dev), repeat)
        sim.reset_counters()
        call(dev)
        fixed_copies = sum(v["count"] for v in sim.counters()["transfers"].values())
        cpu = _time(lambda call=call: call(torch.device("cpu")), repeat)
        if not op:  # no CPU kernel to fall back to: DirectML fails
            print(f"{label:24} {fixed:9.1f} {'fails':>11} {cpu:8.1f} {fixed_copies:>5} vs -")
            continue
        try:
            overloads = cpu_ops.resolve(op)
        except UsageError:  # composite in this torch: its parts reach the device, not it
            print(f"{label:24} {fixed:9.1f} {'composite':>11} {cpu:8.1f} {fixed_copies:>5} vs -")
            continue
        opfix.uninstall()
        forced = torch.library.Library("aten", "IMPL")
        for overload in overloads:
            forced.impl(overload.name().split("::")[1], cpu_ops.cpu_kernel(overload), "PrivateUse1")
        fallback = _time(lambda call=call: call(dev), repeat)
        sim.reset_counters()
        call(dev)
        fallback_copies = sum(v["count"] for v in sim.counters()["transfers"].values())
        forced._destroy()
        opfix.install("sim", PROFILE)
        print(
            f"{label:24} {fixed:9.1f} {fallback:11.1f} {cpu:8.1f} "
            f"{fixed_copies:>5} vs {fallback_copies:<3}"
        )
    library._destroy()
    if arguments.only:
        return
    _right_call_rows(dev, repeat)
    _wrong_answer_rows(dev, repeat)

    a = torch.randn(64, 64, device=dev)
    step = lambda: torch.relu(a @ a + 1).sum()  # noqa: E731
    off = _time(step, repeat * 5)
    with Observer(PROFILE):
        on = _time(step, repeat * 5)
    print(
        f"observer: off {off:.1f} us/step (no mode installed: the same code path), "
        f"on {on:.1f} us/step ({(on - off) / 4:.1f} us per operator call)"
    )


if __name__ == "__main__":
    main()
