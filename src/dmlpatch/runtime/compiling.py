"""Rewritten code inside a compiled function: Dynamo takes the runtime's answers as constants.

torch.compile traces a forward with Dynamo, which follows every Python call it meets. A CUDA
site rewritten inside that forward calls this runtime (``__dmlpatch__.device("cuda")``), whose
caches, locks and the string class that remembers CUDA's spelling Dynamo cannot follow: a graph
break at each site, and ``fullgraph=True`` stops. The answers depend only on their arguments
and on the process's device, which is decided once, so Dynamo is told to call these functions
while tracing and keep what they return, as ``torch._dynamo.assume_constant_result`` promises.
Marked when the program first imports ``torch._dynamo``; eager calls are untouched.
"""

from __future__ import annotations

from typing import Any


def mark_constant_answers(dynamo: Any) -> None:
    """Mark the runtime functions whose answer is a constant of their arguments."""
    from dmlpatch.runtime import cuda_device, device_tests, sites

    for function in (
        cuda_device.device,
        cuda_device.is_available,
        cuda_device.device_count,
        cuda_device.current_device,
        cuda_device.get_device_name,
        device_tests.as_cuda,
        device_tests._target_type,
        sites.patches_needed,
    ):
        dynamo.assume_constant_result(function)
    from torch._guards import TracingContext

    context = TracingContext.try_get  # set while Dynamo traces a frame, None otherwise

    def dynamo_is_tracing() -> bool:
        return context() is not None

    cuda_device.tracing = dynamo_is_tracing
