"""Sparse tensors moved to DirectML stay on the CPU, instead of failing.

torch-directml registers no kernel for the ``SparsePrivateUse1`` key, so moving a sparse COO
tensor to the device fails in the operator that builds it: ``NotImplementedError: Could not run
'aten::_sparse_coo_tensor_with_dims_and_tensors' with arguments from the 'SparsePrivateUse1'
backend`` (microsoft/DirectML#414). Models keep index metadata in sparse buffers, and
``model.to(device)`` moves them with the parameters: openai-whisper's ``alignment_heads`` makes
``whisper.load_model(name, device=dml)`` fail before anything runs.

No kernel can build a sparse tensor on DirectML, so this one builds it on the CPU from the
indices and values ``Tensor.to`` already copied over, and says so once: the parameters move, the
sparse buffer stays where it can exist, and code that reads it (``buffer.indices()``) works as on
the CPU. It is registered for ``SparsePrivateUse1`` only, which DirectML leaves empty.
"""

from __future__ import annotations

from typing import Any

import torch

from dmlpatch.opfix._accounting import record
from dmlpatch.opfix._kernel import Kernel


def _sparse_on_host(
    sparse_dim: int,
    dense_dim: int,
    size: list[int],
    indices: torch.Tensor,
    values: torch.Tensor,
    **options: Any,
) -> torch.Tensor:
    from dmlpatch import log

    record("fixed", "aten::_sparse_coo_tensor_with_dims_and_tensors")
    log.warn_once(
        "sparse-on-host",
        "a sparse tensor stays on the CPU: DirectML has no sparse tensors "
        "(microsoft/DirectML#414); a model's sparse buffers stay there as its parameters move",
    )
    options["device"] = torch.device("cpu")
    options["pin_memory"] = False
    return torch.ops.aten._sparse_coo_tensor_with_dims_and_tensors(
        sparse_dim, dense_dim, size, indices.cpu(), values.cpu(), **options
    )


#: Why no call is cheaper through DirectML's fallback (the registry's ``NO_CHOICE``).
NO_CHOICE = (
    "DirectML can hold no sparse tensor, through its fallback or otherwise (the fallback fails): "
    "the fix keeps the tensor on the host, the one place it can be."
)

KERNELS = (
    Kernel(
        "_sparse_coo_tensor_with_dims_and_tensors", _sparse_on_host, "missing", "SparsePrivateUse1"
    ),
)
