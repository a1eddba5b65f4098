"""Parameters keep their identity when a module moves to or from the device.

``Module._apply`` (``model.to(dev)``, ``.cuda()``, ``.half()``, ``.cpu()``) changes a parameter
in place, ``param.data = moved``, only when PyTorch deems the two tensors "shallow-copy
compatible"; a CPU tensor and a CUDA tensor are, a CPU tensor and any ``PrivateUse1`` tensor
(torch-directml's, the simulator's) are not. So a move to DirectML puts a *new* Parameter in
every module, and whatever held the old one silently holds a CPU tensor nobody trains:

- an optimizer made before the move (``opt = Adam(model.parameters()); model.to(dev)``, the
  order accelerate's ``prepare(model, optimizer)`` uses) steps the old CPU parameters, and the
  loss never moves;
- tied weights come apart: the first module visited gets a new Parameter, the second moves the
  old one again, so ``lm_head.weight is embed.weight`` is false and training makes two matrices;
- tensor hooks and anything else keyed by the parameter object see a tensor that is gone.

The fix wraps ``Module._apply``: after PyTorch has done its move, each parameter it replaced
where one end is on ``privateuseone`` (and both are dense, as a CUDA move's would be) takes the
moved tensor into the *old* Python object (``torch._C._swap_tensor_impl``, the primitive of
PyTorch's own ``torch.utils.swap_tensors``), which goes back into the module: the object,
its class, its attributes and its tensor hooks stay, its data is the moved tensor, as
``param.data = moved`` gives on CUDA. A tied parameter is then on the device when its second
module is visited, so it is not moved twice. Nothing changes for a move PyTorch already does in
place (CPU, CUDA, a dtype change on the device), for ``torch.__future__``'s overwrite setting,
or for meta and sparse tensors (CUDA replaces those too). Where the swap is refused (a tensor
something in C++ still holds), the new Parameter stays, as without dmlpatch, and one line says
so.

Cost: one dictionary copy and identity comparisons per module per move (``benchmarks/
module_moves.py``); nothing per step.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Callable, Optional

from dmlpatch import changes

if TYPE_CHECKING:
    import torch

#: ``Module._apply`` as PyTorch defines it, while the fix is installed.
_original_apply: Optional[Callable[..., Any]] = None
_lock = threading.Lock()

#: Device types whose tensors PyTorch moves in place between one another (``TensorImpl::
#: has_compatible_shallow_copy_type``'s dense backends), with ``privateuseone`` added.
_DENSE = frozenset({"cpu", "cuda", "mps", "hip", "xpu", "hpu", "privateuseone"})


def _keeps_identity_on_cuda(old: torch.Tensor, new: torch.Tensor) -> bool:
    """Whether PyTorch would have moved ``old`` in place had ``privateuseone`` been CUDA."""
    import torch

    if "privateuseone" not in (old.device.type, new.device.type):
        return False
    for tensor in (old, new):
        if tensor.device.type not in _DENSE or tensor.layout is not torch.strided:
            return False
    return not torch.__future__.get_overwrite_module_params_on_conversion()


def _take_over(old: torch.nn.Parameter, new: torch.nn.Parameter) -> bool:
    """Give ``old`` the tensor of ``new``, keeping ``old``'s class, attributes and hooks."""
    import torch

    try:
        torch._C._swap_tensor_impl(old, new)
    except RuntimeError:
        return False
    # Tensor hooks live in the Python object, but are registered with the tensor's autograd
    # metadata, which just changed hands: register them with the new one.
    if old._backward_hooks is not None:
        old._backward_hooks = old._backward_hooks
    if getattr(old, "_post_accumulate_grad_hooks", None) is not None:
        old._post_accumulate_grad_hooks = old._post_accumulate_grad_hooks
    return True


def _apply_keeping_parameters(module: torch.nn.Module, fn: Any, *args: Any, **kwargs: Any) -> Any:
    assert _original_apply is not None
    parameters = module._parameters
    if not parameters:  # a container, an activation: nothing of its own to keep
        return _original_apply(module, fn, *args, **kwargs)
    before = parameters.copy()
    result = _original_apply(module, fn, *args, **kwargs)
    parameters = module._parameters
    for key, old in before.items():
        new = parameters.get(key)
        if new is old or new is None or old is None or not _keeps_identity_on_cuda(old, new):
            continue
        if _take_over(old, new):
            parameters[key] = old
        else:
            from dmlpatch import log

            log.warn_once(
                "module-moves",
                f"{type(module).__name__}.{key} is a new Parameter after its move to "
                f"{new.device}, as without dmlpatch (PyTorch refused to hand the moved tensor "
                "to the old one): make the optimizer after moving the model",
            )
    return result


def install() -> None:
    """Wrap ``torch.nn.Module._apply``; idempotent."""
    global _original_apply
    import torch

    with _lock:
        if _original_apply is None:
            _original_apply = torch.nn.Module._apply
            torch.nn.Module._apply = _apply_keeping_parameters
            changes.record(__name__, "function", "torch.nn.Module._apply", uninstall)


def uninstall() -> None:
    """Give ``torch.nn.Module._apply`` back: moves replace parameters again."""
    global _original_apply
    import torch

    with _lock:
        changes.forget(__name__)
        if _original_apply is not None:
            torch.nn.Module._apply = _original_apply
            _original_apply = None


def installed() -> bool:
    return _original_apply is not None
