"""float16 through DirectML's CPU fallback, for operators whose CPU kernel has no float16.

An operator DirectML lacks runs on the CPU (two copies per call); CUDA runs it in float16, but
the CPU kernel of some has no float16, so a float16 program that works on CUDA stops on
DirectML with ``NotImplementedError: "grid_sampler_2d_cpu" not implemented for 'Half'`` (image
libraries' float16 runs meet it in resampling and pooling). For the operators listed in
:data:`OPERATORS`, the fallback is dmlpatch's own: the same copies, with float16 arguments
computed in float32 on the CPU and the results brought back as float16 (counted as
fallbacks, as DirectML's are), where the CPU kernel refuses float16; the list differs between
torch releases (2.14 has float16 ``histc`` and ``grid_sampler_3d``), so each operator tries
the CPU's own float16 kernel first, whose rounding is the CPU's, and the first refusal sends
it to float32 for the rest of the process. Calls without float16 arguments behave as
DirectML's fallback. Only operators that fall back (not native on the profile) and that no
other fix serves are taken.
"""

from __future__ import annotations

import torch

from dmlpatch.opfix._kernel import Kernel
from dmlpatch.opfix.cpu_ops import cpu_kernel

#: Operators CUDA runs in float16 whose CPU kernels (torch 2.4 to 2.14) do not: found by
#: running PyTorch's OpInfo samples in float16 on the CPU of each torch (``benchmarks/`` and
#: the tests name them); all overloads of each, less the functional forms of ``out=``
#: kernels DirectML has. The antialiased resizes were here until
#: :mod:`dmlpatch.opfix.vision.resizing` composed them on the device.
OPERATORS = (
    "grid_sampler_2d",
    "grid_sampler_2d_backward",
    "grid_sampler_3d",
    "grid_sampler_3d_backward",
    "max_unpool2d",
    "max_unpool3d",
    "adaptive_max_pool3d",
    "adaptive_max_pool3d_backward",
    "trace",
    "histc",
    "multi_margin_loss",
    "multi_margin_loss_backward",
    "multilabel_margin_loss_forward",
    "multilabel_margin_loss_backward",
    "rrelu_with_noise",
    "_ctc_loss",
    "_ctc_loss_backward",
    "_cdist_backward",
    "_pdist_forward",
    "_pdist_backward",
    # torch 2.4's CPU has none for padding (2.14's has); DirectML computes 1d and 2d forward
    # and reflection's backward itself, so replication's backward and 3d forward are taken.
    "replication_pad1d",
    "replication_pad2d",
    "replication_pad3d",
    "replication_pad1d_backward",
    "replication_pad2d_backward",
    "replication_pad3d_backward",
    "reflection_pad1d",
    "reflection_pad2d",
    "reflection_pad1d_backward",
    "reflection_pad2d_backward",
)


def _overloads() -> list[tuple[torch._ops.OpOverload, str]]:
    """Each overload that reaches the device, with its ``out=`` delegate where it has one."""
    found = []
    for name in OPERATORS:
        packet = getattr(torch.ops.aten, name, None)
        if packet is None:
            continue
        for overload in packet.overloads():
            op = getattr(packet, overload)
            qualified = op.name()
            if torch._C._dispatch_has_kernel_for_dispatch_key(
                qualified, "CompositeImplicitAutograd"
            ):
                continue  # composed of other operators: never reaches the device
            found.append((op, _delegate(name, packet.overloads(), qualified)))
    return found


def _delegate(name: str, overloads: list[str], qualified: str) -> str:
    """A structured functional form's ``out=`` overload (its non-functional composite calls
    it): DirectML registers ``reflection_pad1d.out`` and so serves ``reflection_pad1d``."""
    if not torch._C._dispatch_has_kernel_for_dispatch_key(
        qualified, "CompositeExplicitAutogradNonFunctional"
    ):
        return ""
    written = [overload for overload in ("out", "grad_input") if overload in overloads]
    return f"{name}.{written[0]}" if written else ""


#: Why no call is cheaper through DirectML's fallback (the registry's ``NO_CHOICE``).
NO_CHOICE = (
    "It is DirectML's fallback itself (the same copies, with float16 computed in float32 on the "
    "host where the CPU has no float16 kernel): there is nothing else to choose."
)

#: Of two fixes for one operator, the other's kernel wins: this one serves what no other does.
YIELDS_TO = ("vision.sampling",)

KERNELS = tuple(
    Kernel(
        op.name().split("::", 1)[1],
        # A functional form is counted under its out= kernel, as DirectML's fallback names it.
        cpu_kernel(op, upcast_half=True, reported=f"aten::{delegate}" if delegate else None),
        "fallback",
        delegate=delegate,
    )
    for op, delegate in _overloads()
)
