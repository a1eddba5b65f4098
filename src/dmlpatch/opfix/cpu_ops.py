"""``DMLPATCH_CPU_OPS=aten::foo,aten::bar.overload``: named operators run on the CPU.

A bare name covers all overloads of the operator and its in-place twin (``aten::add``: add,
add_, add.out); ``aten::add.Tensor`` names one overload.

For operators that are wrong or slow on a given adapter. Each call does what DirectML's own
CPU fallback does: copy every device tensor argument to the CPU, run the CPU kernel, copy
written arguments and new results back. Calls count as ``fallback`` with the copies they made
(on the simulated device these are real transfers, so they appear in its transfer counters
too). Autograd stays PyTorch's: only the kernel below it moves.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch.utils._pytree import tree_map

from dmlpatch import log
from dmlpatch.errors import UsageError
from dmlpatch.opfix._accounting import record

ENV = "DMLPATCH_CPU_OPS"


def parse(text: str) -> list[str]:
    """``aten::name`` or ``aten::name.overload`` entries, comma-separated, in order."""
    names = []
    for raw in text.split(","):
        entry = raw.strip()
        if not entry:
            continue
        namespace, sep, rest = entry.partition("::")
        if not sep or not namespace or not rest:
            raise UsageError(f"{ENV}: {entry!r} is not an operator name like aten::index_add")
        names.append(entry)
    return names


def _overloads(entry: str) -> list[torch._ops.OpOverload]:
    namespace, _, rest = entry.partition("::")
    name, _, overload = rest.partition(".")
    try:
        packet = getattr(getattr(torch.ops, namespace), name)
    except (AttributeError, RuntimeError):
        raise UsageError(f"{ENV}: no operator named {entry!r}") from None
    if overload:
        try:
            return [getattr(packet, overload)]
        except AttributeError:
            raise UsageError(f"{ENV}: {namespace}::{name} has no overload {overload!r}") from None
    # A bare name covers every dispatcher overload of the operator and of its in-place twin
    # (aten::add: add.Tensor, add.out, add_.Tensor, ...); TorchScript-only overloads
    # (add.int, add.str) never see a tensor.
    names = [name] if name.endswith("_") else [name, name + "_"]
    found = []
    for op_name in names:
        try:
            each = getattr(getattr(torch.ops, namespace), op_name)
        except (AttributeError, RuntimeError):
            continue
        for item in each.overloads():
            qualified = f"{namespace}::{op_name}" + ("" if item == "default" else f".{item}")
            if torch._C._dispatch_has_kernel(qualified):
                found.append(getattr(each, item))
    return found


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def cpu_kernel(op: torch._ops.OpOverload, upcast_half: bool = False) -> Callable[..., Any]:
    """A PrivateUse1 kernel running ``op`` on CPU copies of its arguments; with
    ``upcast_half``, float16 arguments are computed in float32 there and floating results
    come back as float16 (for CPU kernels that have no float16)."""
    schema = op._schema
    name = op.name()
    written = [
        i
        for i, a in enumerate(schema.arguments)
        if a.alias_info is not None and a.alias_info.is_write
    ]

    def kernel(*args: Any, **kwargs: Any) -> Any:
        copies = 0
        nbytes = 0
        device: list[torch.device] = []
        upcast: list[bool] = []

        def to_cpu(value: Any) -> Any:
            nonlocal copies, nbytes
            if isinstance(value, torch.Tensor) and value.device.type == "privateuseone":
                device.append(value.device)
                copies += 1
                nbytes += _nbytes(value)
                if upcast_half and value.dtype is torch.float16:
                    upcast.append(True)
                    return value.cpu().float()
                return value.cpu()
            if isinstance(value, torch.device) and value.type == "privateuseone":
                device.append(value)
                return torch.device("cpu")
            return value

        cpu_args = tree_map(to_cpu, args)
        cpu_kwargs = tree_map(to_cpu, kwargs)
        result = op(*cpu_args, **cpu_kwargs)
        target = device[0] if device else torch.device("privateuseone", 0)
        originals: dict[int, torch.Tensor] = {}
        for i in written:
            argument = schema.arguments[i]
            before = args[i] if i < len(args) else kwargs.get(argument.name)
            after = cpu_args[i] if i < len(cpu_args) else cpu_kwargs.get(argument.name)
            if isinstance(before, torch.Tensor) and isinstance(after, torch.Tensor):
                if before.shape != after.shape:
                    before.resize_(after.shape)
                before.copy_(after)
                copies += 1
                nbytes += _nbytes(after)
                originals[id(after)] = before

        def to_device(value: Any) -> Any:
            nonlocal copies, nbytes
            if not isinstance(value, torch.Tensor):
                return value
            if id(value) in originals:
                return originals[id(value)]
            copies += 1
            nbytes += _nbytes(value)
            if upcast and value.dtype is torch.float32:
                return value.to(target, torch.float16)
            return value.to(target)

        moved = tree_map(to_device, result)
        record("fallback", name, copies, nbytes)
        return moved

    return kernel


def resolve(text: str) -> list[torch._ops.OpOverload]:
    """The overloads named in ``text`` that can reach the device (others are reported)."""
    chosen = []
    for entry in parse(text):
        for op in _overloads(entry):
            if torch._C._dispatch_has_kernel_for_dispatch_key(
                op.name(), "CompositeImplicitAutograd"
            ):
                log.warn_once(
                    f"cpu-ops:{op.name()}",
                    f"{ENV}: {op.name()} never reaches the device (PyTorch composes it of other "
                    "operators); name those instead",
                )
                continue
            chosen.append(op)
    return chosen


def register(library: torch.library.Library, ops: list[torch._ops.OpOverload]) -> list[str]:
    """Register the CPU kernel for each overload; returns their names."""
    for op in ops:
        library.impl(op.name().split("::", 1)[1], cpu_kernel(op), "PrivateUse1")
    return [op.name() for op in ops]
