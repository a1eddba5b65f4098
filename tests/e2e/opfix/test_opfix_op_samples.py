"""PyTorch's own sample inputs for its operators (its OpInfo database: the samples its
test_ops and test_linalg run on each device), called on the simulated DirectML device with
dmlpatch's fixes and on the CPU, sample for sample: about 70,000 calls of some 700 operators,
and the gradients of 6,000 more. The results (or the errors) are the CPU's but for the
differences listed here, each with its reason; for linear algebra, the only calls that still
go through the CPU are the ones the catalogue names.

PyTorch's test internals freeze ``torch.backends`` flags in the process that imports them, so
the samples run in a subprocess (``op_samples.py``), which reports as JSON.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tests.support import clean_env, run_python

SCRIPT = Path(__file__).with_name("op_samples.py")
#: Computed on the host by dmlpatch, as PyTorch's CUDA build computes them (MAGMA's geev).
ON_THE_HOST = {"linalg.eig", "linalg.eigvals"}
#: Operators added after torch 2.4.1, the last torch torch-directml runs on.
NEWER_THAN_DIRECTML = {"linalg.matrix_sqrth", "linalg.polar"}
#: The decompositions whose device kernels these samples must have reached.
CORE = {
    "linalg.inv",
    "linalg.solve",
    "linalg.det",
    "linalg.slogdet",
    "linalg.lu",
    "linalg.lu_factor",
    "linalg.lu_solve",
    "linalg.solve_triangular",
    "linalg.cholesky",
    "linalg.qr",
    "linalg.svd",
    "linalg.eigh",
    "linalg.lstsq",
    "matrix_exp",
    "linalg.householder_product",
    "linalg.ldl_factor",
    "linalg.ldl_solve",
    "cholesky_inverse",
    "cholesky_solve",
    "triangular_solve",
    "geqrf",
    "ormqr",
}


#: Differences that are not dmlpatch's to remove, by operator, each with its reason.
EXPECTED_DIFFERENCES = {
    **dict.fromkeys(
        ("empty", "empty_like", "empty_permuted", "empty_strided", "new_empty"),
        "uninitialised memory",
    ),
    "new_empty_strided": "uninitialised memory",
    "as_strided": "reads its input's storage, which the copy moved to the device does not share",
    "tensor_split": "takes a tensor of indices on the CPU only, as on CUDA (the samples' "
    "indices are moved to the device with the rest)",
    "bfloat16": "DirectML has no bfloat16: it is held as float32 (the dtype policy)",
    "sparse.mm": "DirectML holds no sparse layout",
    "sparse.sampled_addmm": "DirectML holds no sparse layout",
    "to_sparse": "DirectML holds no sparse layout",
}
#: Differences in one dtype only.
EXPECTED_IN = {
    ("nn.functional.scaled_dot_product_attention", "torch.float16"): "the device takes "
    "PyTorch's math path, whose float16 intermediates torch 2.4.1's CPU kernel keeps in float32",
}


def _report(*arguments: str, **environment: str) -> dict[str, Any]:
    result = run_python([str(SCRIPT), *arguments], env=clean_env(**environment), timeout=900)
    assert result.code == 0, result.err[-3000:]
    parsed: dict[str, Any] = json.loads(result.out)
    return parsed


@pytest.fixture(scope="module")
def report() -> dict[str, Any]:
    """The linear-algebra operators, float32 and float64, each call the fixes take composed on
    the device whatever the cost model would pick (these tests are of the compositions)."""
    return _report("linalg", DMLPATCH_DEVICE_OPS="all")


@pytest.fixture(scope="module")
def everything() -> dict[str, Any]:
    """Every other operator, in five dtypes."""
    return _report("all", "float32", "float64", "int64", "bool", "float16")


def test_the_samples_reach_every_decomposition(report: dict[str, Any]) -> None:
    assert set(report["operators"]) >= CORE, CORE - set(report["operators"])
    assert report["compared"] > 3000


def test_every_sample_equals_the_cpu_s(report: dict[str, Any]) -> None:
    differences = report["differences"]
    assert not differences, json.dumps(differences[:10], indent=1)


def test_every_other_operator_s_samples_equal_the_cpu_s(everything: dict[str, Any]) -> None:
    assert len(everything["operators"]) > 600 and everything["compared"] > 50000
    unexplained = [
        case
        for case in everything["differences"]
        if case["op"] not in EXPECTED_DIFFERENCES and (case["op"], case["dtype"]) not in EXPECTED_IN
    ]
    assert not unexplained, json.dumps(unexplained[:10], indent=1)


def _has_an_empty_matrix(shapes: list[list[int]]) -> bool:
    """A sample with a 0-row or 0-column matrix, whose results are not all empty (a 0x0
    determinant is 1): made on the CPU, counted as the fallback it is."""
    return any(len(shape) >= 2 and 0 in shape[-2:] for shape in shapes)


def test_the_only_calls_through_the_cpu_are_the_catalogued_ones(report: dict[str, Any]) -> None:
    unexplained = [
        case
        for case in report["fallbacks"]
        if case["op"] not in ON_THE_HOST | NEWER_THAN_DIRECTML
        and not _has_an_empty_matrix(case["shapes"])
    ]
    assert not unexplained, json.dumps(unexplained[:10], indent=1)
    on_the_host = {case["op"] for case in report["fallbacks"]} & ON_THE_HOST
    assert on_the_host == ON_THE_HOST  # counted as the fallbacks they are


@pytest.fixture(scope="module")
def gradients() -> dict[str, Any]:
    """The gradients of every differentiable operator, float32 and float64 (the compositions',
    as for :func:`report`)."""
    return _report("gradients", "float32", "float64", DMLPATCH_DEVICE_OPS="all")


def test_every_gradient_equals_the_cpu_s(gradients: dict[str, Any]) -> None:
    # Random draws, the forward differences above and sign-free vectors are left out
    # (op_samples.NOT_FOR_GRADIENTS); 0-d unfold and nearest grid_sample's grid were found here.
    assert gradients["compared"] > 5000
    differences = gradients["differences"]
    assert not differences, json.dumps(differences[:10], indent=1)
