"""A model shared between processes keeps its weights in host shared memory and computes on
the device.

Hogwild-style training (``model = Net().to(device)``, ``model.share_memory()``, then
``mp.Process(target=train, args=(model, ...))``, PyTorch's examples/mnist_hogwild) has every
worker update one set of weights in place. On CUDA the weights stay on the GPU and reach the
workers through CUDA's inter-process handles. DirectML has no inter-process memory: PyTorch
refuses to hand a device tensor to a spawned worker (``_share_fd_: only available on CPU``),
and a forked worker trains a private copy that the parent never sees, where the same program
on the CPU shares its weights.

So ``Module.share_memory()`` of a module with tensors on ``privateuseone`` moves them into host
shared memory (the same Parameter objects: an optimizer made before keeps them) and says so in
one line. The module still computes on the device: each forward of the module, or of one of
its submodules, given a device tensor swaps in device copies of the weights below it (given a
CPU tensor, it runs on the host weights, as on the CPU). The copies are differentiable, so the
backward brings each gradient back to its shared parameter, and the optimizer a worker makes
over ``model.parameters()`` updates the shared weights in place, as Hogwild does on the CPU.
When the forward ends, what it changed in place is copied back: the buffers of a module in
training mode (BatchNorm's running statistics, which PyTorch changes without counting a
version) and any tensor whose version moved. With one worker the losses are the CPU's, bit for
bit; with several, the updates race as they do on the CPU.

What differs from CUDA: a weight read outside a forward (``model.fc.weight`` in a loss term)
is the host tensor, and ``model.to(device)`` of a shared module leaves it in host memory, where
it is shared. Cost: each forward copies every weight to the device, each backward copies
every gradient back (a read from the device), and the optimizer's step runs on the host;
modules nobody shares pay nothing.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Callable, Optional

from dmlpatch import changes

if TYPE_CHECKING:
    import torch
    from torch import nn

#: ``Module.share_memory`` and ``Module._apply`` as they were before :func:`install`.
_original_share_memory: Optional[Callable[..., Any]] = None
_original_apply: Optional[Callable[..., Any]] = None
_lock = threading.Lock()

#: The attribute that marks a module whose weights are shared in host memory: its
#: :class:`HostedWeights`, which a spawned worker gets with the module.
HOSTED = "_dmlpatch_hosted_weights"


class HostedWeights:
    """The forward hooks of a module whose weights are shared in host memory: :meth:`enter`
    puts device copies in place of the weights below the module called, :meth:`leave` puts the
    shared ones back. One instance serves every module of a tree, so a submodule called inside
    its parent's forward uses the copies its parent made."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._depth = 0
        #: (the module's table, key, shared tensor, device copy, the copy's version at entry,
        #: whether to copy it back whatever its version)
        self._swapped: list[tuple[dict[str, Any], str, torch.Tensor, torch.Tensor, int, bool]] = []

    def __getstate__(self) -> dict[str, Any]:
        return {"device": self.device}

    def __setstate__(self, state: dict[str, Any]) -> None:
        # A worker's forwards start afresh: nothing of the parent's swap crosses.
        self.device = state["device"]
        self._depth = 0
        self._swapped = []

    def enter(self, module: nn.Module, args: Any, kwargs: dict[str, Any]) -> None:
        self._depth += 1
        if self._depth > 1 or _given_host_tensors(args, kwargs):
            return
        copies: dict[int, torch.Tensor] = {}  # tied weights: one copy, one gradient
        for owner in module.modules():
            # batch_norm changes its running statistics without PyTorch counting a version:
            # a training module's buffers go back whatever their version says.
            for table, always in ((owner._parameters, False), (owner._buffers, owner.training)):
                for key, shared in table.items():
                    if shared is None or shared.device == self.device:
                        continue
                    copy = copies.get(id(shared))
                    if copy is None:
                        copy = copies[id(shared)] = shared.to(self.device)
                    table[key] = copy
                    self._swapped.append((table, key, shared, copy, copy._version, always))

    def leave(self, module: nn.Module, args: Any, output: Any) -> None:
        self._depth -= 1
        if self._depth > 0:
            return
        import torch

        swapped, self._swapped = self._swapped, []
        for table, key, shared, copy, version, always in swapped:
            table[key] = shared
            if always or copy._version != version:  # changed in place by the forward
                with torch.no_grad():
                    shared.copy_(copy)


def _given_host_tensors(args: Any, kwargs: dict[str, Any]) -> bool:
    """Whether the first tensor a forward is given is off the device: the forward then runs on
    the host weights where its input is, as it would on the CPU (a program that places its
    input with ``next(model.parameters()).device`` finds the host)."""
    import torch

    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            return value.device.type != "privateuseone"
    return False


def _device_of(module: nn.Module) -> Optional[torch.device]:
    for tensor in (*module.parameters(), *module.buffers()):
        if tensor.device.type == "privateuseone":
            return tensor.device
    return None


def _to_host(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.cpu() if tensor.device.type == "privateuseone" else tensor


def _share_memory(module: nn.Module) -> nn.Module:
    assert _original_share_memory is not None
    device = _device_of(module)
    if device is None or HOSTED in vars(module):
        return _original_share_memory(module)
    from dmlpatch import log
    from dmlpatch.placement import frames

    site = frames.site()
    module._apply(_to_host)  # dmlpatch.opfix.module_moves keeps the Parameter objects
    _original_share_memory(module)
    hosted = HostedWeights(device)
    for each in module.modules():
        vars(each)[HOSTED] = hosted
        each.register_forward_pre_hook(hosted.enter, with_kwargs=True)
        each.register_forward_hook(hosted.leave, always_call=True)
    where = f" at {frames.display(site.file)}:{site.line}" if site is not None else ""
    log.say_once(
        f"share_memory:{id(module)}",
        f"{type(module).__name__}.share_memory(){where}: DirectML has no inter-process memory, "
        f"so its weights are shared in host memory; a forward given tensors on {device} "
        "computes there with copies of them, and the gradients come back to the shared weights",
    )
    return module


def _apply_keeping_hosted(module: nn.Module, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """``Module._apply`` that leaves a shared module's host tensors where they are when ``fn``
    would only move them to the device (``model.to(device)`` in a worker)."""
    assert _original_apply is not None
    hosted: Optional[HostedWeights] = vars(module).get(HOSTED)
    if hosted is None or getattr(fn, HOSTED, False):  # not shared, or wrapped by its parent
        return _original_apply(module, fn, *args, **kwargs)

    def moved_unless_to_device(tensor: torch.Tensor) -> Any:
        probe = fn(tensor.new_empty(0))  # what fn does, without copying the tensor
        if probe.device == hosted.device and probe.dtype == tensor.dtype:
            return tensor
        return fn(tensor)

    setattr(moved_unless_to_device, HOSTED, True)
    return _original_apply(module, moved_unless_to_device, *args, **kwargs)


def install() -> None:
    """Wrap ``Module.share_memory`` and ``Module._apply``; idempotent. Install after
    :mod:`dmlpatch.opfix.module_moves` and uninstall before it: the wrappers stack."""
    global _original_share_memory, _original_apply
    import torch

    with _lock:
        if _original_share_memory is None:
            _original_share_memory = torch.nn.Module.share_memory
            _original_apply = torch.nn.Module._apply
            torch.nn.Module.share_memory = _share_memory
            torch.nn.Module._apply = _apply_keeping_hosted
            changes.record(
                __name__,
                "function",
                "torch.nn.Module.share_memory, torch.nn.Module._apply",
                uninstall,
            )


def uninstall() -> None:
    """PyTorch's methods back; modules shared before keep their weights in host memory."""
    global _original_share_memory, _original_apply
    import torch

    with _lock:
        changes.forget(__name__)
        if _original_share_memory is not None and _original_apply is not None:
            torch.nn.Module.share_memory = _original_share_memory
            torch.nn.Module._apply = _original_apply
            _original_share_memory = _original_apply = None
