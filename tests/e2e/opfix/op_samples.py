"""PyTorch's own sample inputs for its operators (the OpInfo database its test_ops and
test_linalg run on every device), each called on the CPU and on the simulated DirectML device
with dmlpatch's fixes; prints one JSON report.

``python op_samples.py linalg`` runs the linear-algebra operators in float32 and float64;
``python op_samples.py all DTYPE...`` every other operator in the dtypes named;
``python op_samples.py gradients DTYPE...`` the gradients of every differentiable operator
(eight samples each). Run in a
subprocess by the tests: importing PyTorch's test internals freezes ``torch.backends`` flags
for the rest of the process.
"""

from __future__ import annotations

import json
import sys
import warnings
from typing import Any, Callable

import torch
from torch.utils._pytree import tree_flatten, tree_map

import dmlpatch.sim as sim
from dmlpatch import opfix
from dmlpatch.placement import fallbacks as placement_fallbacks

PROFILE = "torch-directml-0.2.5"
#: Operators outside ``torch.linalg`` that are linear algebra all the same.
OTHERS = {
    "cholesky_inverse",
    "cholesky_solve",
    "det",
    "geqrf",
    "inverse",
    "logdet",
    "lu",
    "lu_solve",
    "lu_unpack",
    "matrix_exp",
    "ormqr",
    "pinverse",
    "qr",
    "svd",
    "triangular_solve",
}
#: Vectors whose sign (or, past the rank, whose basis) PyTorch leaves to the device.
UP_TO_SIGN = {"svd", "linalg.svd", "linalg.eigh", "svd_lowrank", "pca_lowrank"}
#: By the result's dtype: float32's and float16's results are rounded at their operands' scale.
TOLERANCE = {torch.float16: 1e-2, torch.bfloat16: 1e-2, torch.float32: 1e-3, torch.float64: 1e-8}


def _shapes(values: Any) -> list[list[int]]:
    return [list(t.shape) for t in tree_flatten(values)[0] if isinstance(t, torch.Tensor)]


def _span(vectors: torch.Tensor) -> torch.Tensor:
    """The projector onto the span of the orthonormal columns of ``vectors`` (basis-free)."""
    return vectors @ vectors.mT


def _linear_algebra(name: str) -> bool:
    return name.startswith("linalg.") or name in OTHERS


def _equal(name: str, expected: Any, got: Any) -> bool:
    wanted, _ = tree_flatten(expected)
    found, _ = tree_flatten(got)
    if len(wanted) != len(found):
        return False
    for index, (a, b) in enumerate(zip(wanted, found)):
        if a is None or b is None:  # an input autograd gave no gradient
            if (a is None) != (b is None):
                return False
            continue
        if not isinstance(a, torch.Tensor):
            if a != b:
                return False
            continue
        b = b.cpu()
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        if name in UP_TO_SIGN and a.dim() >= 2:
            # svd's U and V (or Vh), eigh's vectors: up to each one's sign, and past the rank
            # of a full svd, the span as a whole (any orthonormal basis of it is right).
            k = wanted[1].shape[-1] if name.endswith("svd") else a.shape[-1]  # the rank
            rows = name == "linalg.svd" and index == 2  # Vh: vectors are rows
            if rows:
                a, b = a.mT, b.mT
            if name.endswith("svd") and a.shape[-1] > k:
                if not torch.allclose(
                    _span(a[..., :, k:]), _span(b[..., :, k:]), atol=TOLERANCE[a.dtype]
                ):
                    return False
                a, b = a[..., :, :k], b[..., :, :k]
            a, b = a.abs(), b.abs()
        if a.is_complex():
            a, b = torch.view_as_real(a.resolve_conj()), torch.view_as_real(b.resolve_conj())
        if a.is_floating_point():
            tolerance = TOLERANCE[a.dtype]
            if not torch.allclose(a, b, rtol=tolerance, atol=tolerance, equal_nan=True):
                return False
        elif not torch.equal(a, b):
            return False
    return True


def _as_accurate(op: Any, arguments: Any, options: Any, expected: Any, got: Any) -> bool:
    """A float16 result that is not the CPU's is as near the float64 result as the CPU's is,
    within a factor 2: the CPU's own float16 kernels accumulate in float16 on some torch
    releases (matmul, attention on 2.4.1), where DirectML and the float32 paths do not."""

    def wider(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.dtype is torch.float16:
            return value.double()
        return value

    exact = op.op(*tree_map(wider, arguments), **tree_map(wider, options))
    triples = zip(tree_flatten(exact)[0], tree_flatten(expected)[0], tree_flatten(got)[0])
    for reference, cpu, device in triples:
        if not isinstance(reference, torch.Tensor) or not reference.is_floating_point():
            return False
        cpu_error = (cpu.double() - reference).abs().max()
        device_error = (device.cpu().double() - reference).abs().max()
        if not device_error <= 2 * cpu_error + 1e-3:
            return False
    return True


#: Not compared by their gradients: random draws (the two runs draw different numbers), the
#: forward differences the test lists, and vectors whose sign is the device's to choose.
NOT_FOR_GRADIENTS = (
    "rand", "bernoulli", "dropout", "multinomial", "uniform", "exponential", "geometric",
    "cauchy", "log_normal", "rrelu", "empty", "as_strided", "tensor_split", "sparse",
    "bfloat16", "svd", "eig", "lowrank",
)  # fmt: skip
#: Random draws whose names say less.
RANDOM = {"normal"}


def _forward(op: Any, sample: Any, place: Callable[[Any], Any]) -> Any:
    arguments = tree_map(place, (sample.input, *sample.args))
    return op.op(*arguments, **tree_map(place, sample.kwargs))


def _gradients(op: Any, sample: Any, place: Callable[[Any], Any]) -> list[Any]:
    """The gradients of a fixed weighting of the outputs, for each input that takes one."""
    leaves: list[torch.Tensor] = []

    def leaf(value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        moved: torch.Tensor = place(value.detach())
        if value.requires_grad:
            moved.requires_grad_()
            leaves.append(moved)
        return moved

    arguments = tree_map(leaf, (sample.input, *sample.args))
    results = op.op(*arguments, **tree_map(leaf, sample.kwargs))
    outputs = [
        o
        for o in tree_flatten(results)[0]
        if isinstance(o, torch.Tensor) and o.requires_grad and o.is_floating_point()
    ]
    if not outputs or not leaves:
        return []
    weighted = [
        (o * torch.linspace(-1, 1, o.numel(), dtype=o.dtype, device=o.device).reshape(o.shape))
        for o in outputs
    ]
    total = torch.stack([w.sum() for w in weighted]).sum()
    return list(torch.autograd.grad(total, leaves, allow_unused=True))


def _samples(op: Any, family: str, dtype: torch.dtype) -> list[Any]:
    if family != "gradients":
        return list(op.sample_inputs("cpu", dtype))
    left_out = op.name in RANDOM or any(word in op.name for word in NOT_FOR_GRADIENTS)
    if not op.supports_autograd or left_out:
        return []
    if dtype not in op.supported_backward_dtypes("cpu"):
        return []
    return list(op.sample_inputs("cpu", dtype, requires_grad=True))[:8]


def main(family: str, dtypes: list[torch.dtype]) -> None:
    warnings.simplefilter("ignore")
    from torch.testing._internal.common_methods_invocations import op_db

    sim.load(PROFILE)
    opfix.install("sim", PROFILE)
    # As a run does: DirectML's CPU fallback served by dmlpatch's counting kernels (the
    # path a program's fallbacks take: torch.fmod(x, 1.0) broke there, not in the simulator's
    # own fallback, and these samples did not see it).
    placement_fallbacks.install()
    device = sim.device(0)
    call = _gradients if family == "gradients" else _forward

    def moved(value: Any) -> Any:
        return value.to(device) if isinstance(value, torch.Tensor) else value

    def kept(value: Any) -> Any:
        return value

    compared = 0
    differences: list[dict[str, Any]] = []
    fallbacks: list[dict[str, Any]] = []
    operators = []
    for op in op_db:
        if family != "gradients" and _linear_algebra(op.name) != (family == "linalg"):
            continue
        operators.append(op.name)
        for dtype in dtypes:
            if dtype not in op.supported_dtypes("cpu"):
                continue
            for sample in _samples(op, family, dtype):
                arguments = (sample.input, *sample.args)
                case = {"op": op.name, "dtype": str(dtype), "shapes": _shapes(arguments)}
                case["options"] = repr(sample.kwargs)
                try:
                    expected: Any = call(op, sample, kept)
                except Exception as error:  # the device must raise it too
                    expected = error
                sim.reset_counters()
                try:
                    got: Any = call(op, sample, moved)
                except Exception as error:
                    got = error
                went = sorted(sim.counters()["ops"]["fallback"])
                if went:
                    fallbacks.append({**case, "operators": went})
                compared += 1
                if isinstance(expected, Exception) or isinstance(got, Exception):
                    same = type(expected) is type(got) and str(expected) == str(got)
                else:
                    try:
                        same = _equal(op.name, expected, got)
                        if not same and dtype is torch.float16 and call is _forward:
                            same = _as_accurate(op, arguments, sample.kwargs, expected, got)
                    except Exception as error:  # results of another kind altogether
                        same, got = False, error
                if not same:
                    differences.append(
                        {**case, "cpu": repr(expected)[:200], "device": repr(got)[:200]}
                    )
    json.dump(
        {
            "operators": operators,
            "compared": compared,
            "differences": differences,
            "fallbacks": fallbacks,
        },
        sys.stdout,
    )


if __name__ == "__main__":
    chosen = sys.argv[1]
    named = [getattr(torch, name) for name in sys.argv[2:]]
    main(chosen, named or [torch.float32, torch.float64])
