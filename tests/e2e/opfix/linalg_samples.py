"""PyTorch's own sample inputs for its linear-algebra operators (the OpInfo database its
test_linalg and test_ops run on every device), each called on the CPU and on the simulated
DirectML device with dmlpatch's fixes; prints one JSON report.

Run in a subprocess by test_opfix_linalg_samples.py: importing PyTorch's test internals
freezes ``torch.backends`` flags for the rest of the process.
"""

from __future__ import annotations

import json
import sys
import warnings
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map

import dmlpatch.sim as sim
from dmlpatch import opfix

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
UP_TO_SIGN = {"svd", "linalg.svd", "linalg.eigh"}
TOLERANCE = {torch.float32: 1e-3, torch.float64: 1e-8}


def _shapes(values: Any) -> list[list[int]]:
    return [list(t.shape) for t in tree_flatten(values)[0] if isinstance(t, torch.Tensor)]


def _span(vectors: torch.Tensor) -> torch.Tensor:
    """The projector onto the span of the orthonormal columns of ``vectors`` (basis-free)."""
    return vectors @ vectors.mT


def _equal(name: str, expected: Any, got: Any, tolerance: float) -> bool:
    wanted, _ = tree_flatten(expected)
    found, _ = tree_flatten(got)
    if len(wanted) != len(found):
        return False
    for index, (a, b) in enumerate(zip(wanted, found)):
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
                if not torch.allclose(_span(a[..., :, k:]), _span(b[..., :, k:]), atol=tolerance):
                    return False
                a, b = a[..., :, :k], b[..., :, :k]
            a, b = a.abs(), b.abs()
        if a.is_complex():
            a, b = torch.view_as_real(a), torch.view_as_real(b)
        if a.is_floating_point():
            if not torch.allclose(a, b, rtol=tolerance, atol=tolerance, equal_nan=True):
                return False
        elif not torch.equal(a, b):
            return False
    return True


def main() -> None:
    warnings.simplefilter("ignore")
    from torch.testing._internal.common_methods_invocations import op_db

    sim.load(PROFILE)
    opfix.install("sim", PROFILE)
    device = sim.device(0)

    def moved(value: Any) -> Any:
        return value.to(device) if isinstance(value, torch.Tensor) else value

    compared = 0
    differences: list[dict[str, Any]] = []
    fallbacks: list[dict[str, Any]] = []
    operators = []
    for op in op_db:
        if not (op.name.startswith("linalg.") or op.name in OTHERS):
            continue
        operators.append(op.name)
        for dtype in (torch.float32, torch.float64):
            if dtype not in op.supported_dtypes("cpu"):
                continue
            for sample in op.sample_inputs("cpu", dtype):
                arguments = (sample.input, *sample.args)
                case = {"op": op.name, "dtype": str(dtype), "shapes": _shapes(arguments)}
                case["options"] = repr(sample.kwargs)
                try:
                    expected: Any = op.op(*arguments, **sample.kwargs)
                except Exception as error:  # the device must raise it too
                    expected = error
                sim.reset_counters()
                try:
                    got: Any = op.op(*tree_map(moved, arguments), **tree_map(moved, sample.kwargs))
                except Exception as error:
                    got = error
                went = sorted(sim.counters()["ops"]["fallback"])
                if went:
                    fallbacks.append({**case, "operators": went})
                compared += 1
                if isinstance(expected, Exception) or isinstance(got, Exception):
                    same = type(expected) is type(got) and str(expected) == str(got)
                else:
                    same = _equal(op.name, expected, got, TOLERANCE[dtype])
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
    main()
