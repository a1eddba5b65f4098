"""Libraries that run only on CUDA: a function of a rewritten module that uses a name imported
from one keeps CUDA's meaning (``dmlpatch.rewriting.transform.as_written``), because telling it
that its device is CUDA would send it into a kernel no other device has. The survey of this
environment's site-packages behind the list is in ``docs/reference/device-tests.md``."""

from __future__ import annotations

LIBRARIES = frozenset(
    {
        "apex",
        "bitsandbytes",
        "causal_conv1d",
        "cupy",
        "flash_attn",
        "flash_attn_interface",
        "mamba_ssm",
        "pynvml",
        "triton",
        "xformers",
    }
)


def qualified(name: str) -> str:
    """A name that kept a function its CUDA meaning, as a user reads it: ``torch.cuda.nccl``,
    ``triton.jit``, ``torch.<device module>``."""
    if name.startswith("torch.") or name.split(".", 1)[0] in LIBRARIES:
        return name
    return f"torch.cuda.{name}"
