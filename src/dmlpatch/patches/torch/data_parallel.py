"""``nn.DataParallel`` on DirectML adapters, with copies DirectML has instead of CUDA's comm.

CUDA scripts wrap their model in DataParallel when ``torch.cuda.device_count() > 1``. Its
scatter, replicate and gather go through ``torch.cuda.comm`` (NCCL-style kernels that exist only
in CUDA builds), and its worker threads enter CUDA streams: on DirectML it fails even for one
adapter. Here the same four steps are made of differentiable ``Tensor.to`` copies:

- adapters: the ones dmlpatch selected (``--device dml:0,1``), never every adapter the machine
  has, so a discrete GPU is not paired with a slower integrated one unless the user asks; the
  program's ``device_ids`` are CUDA ordinals into that selection;
- scatter: each input tensor is split along ``dim`` (``Tensor.chunk``, as CUDA's scatter) and
  every chunk copied to its adapter;
- replicate: per adapter, a shallow replica whose parameters are copies of the originals, so
  each replica's gradients flow back into the original parameters and add up there;
- parallel apply: one thread per replica, with the caller's grad mode;
- gather: outputs copied to ``output_device`` and concatenated along ``dim``.

A DataParallel whose target is not DirectML is left exactly as torch made it.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Optional

import torch

from dmlpatch.devices import resolution
from dmlpatch.runtime import cuda_device
from dmlpatch.specs.arguments import bound_arguments

DEVICE_TYPE = "privateuseone"

Wrapper = Callable[..., Any]


def _on_directml(instance: Any) -> bool:
    device = getattr(instance, "src_device_obj", None)
    return isinstance(device, torch.device) and device.type == DEVICE_TYPE


def _adapter(device: Any) -> int:
    """A DataParallel device id (CUDA ordinal, torch.device or 'cuda:N') → adapter index."""
    if isinstance(device, torch.device) and device.type == DEVICE_TYPE:
        return device.index or 0
    if isinstance(device, str) and device.startswith(DEVICE_TYPE):
        return torch.device(device).index or 0
    return cuda_device.target_index(cuda_device.ordinal_of(device))


def init(wrapped: Wrapper, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """``nn.DataParallel(module, device_ids=None, output_device=None, dim=0)``."""
    if resolution.current().type != DEVICE_TYPE:
        return wrapped(*args, **kwargs)
    named = bound_arguments(wrapped, args, kwargs).arguments
    module, device_ids, output_device, dim = (
        named["module"],
        named["device_ids"],
        named["output_device"],
        named["dim"],
    )
    if device_ids:
        adapters = [_adapter(device) for device in device_ids]
    else:
        adapters = list(resolution.current().indices)
    output = adapters[0] if output_device is None else _adapter(output_device)
    wrapped(module, device_ids=adapters, output_device=output, dim=dim)
    # torch decides the device type from the device modules it can see; the adapters above are
    # DirectML's whatever it decided.
    instance.dim = dim
    instance.device_ids = adapters
    instance.output_device = output
    instance.src_device_obj = torch.device(DEVICE_TYPE, adapters[0])
    if len(adapters) == 1:
        module.to(instance.src_device_obj)
    return None


# -- scatter -------------------------------------------------------------------------------


def _scatter(value: Any, devices: list[torch.device], dim: int) -> list[Any]:
    """``value`` split for each device; like torch's scatter, non-tensors are shared."""
    if isinstance(value, torch.Tensor):
        chunks = value.chunk(len(devices), dim)
        return [chunk.to(device) for chunk, device in zip(chunks, devices)]
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        columns = [_scatter(item, devices, dim) for item in value]
        return [type(value)(*row) for row in zip(*columns)]
    if isinstance(value, (tuple, list)) and len(value) > 0:
        columns = [_scatter(item, devices, dim) for item in value]
        return [type(value)(row) for row in zip(*columns)]
    if isinstance(value, dict) and len(value) > 0:
        columns = [_scatter(item, devices, dim) for item in value.values()]
        return [type(value)(zip(value.keys(), row)) for row in zip(*columns)]
    return [value for _ in devices]


def scatter(wrapped: Wrapper, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``DataParallel.scatter(inputs, kwargs, device_ids)`` → per-adapter inputs and kwargs."""
    if not _on_directml(instance):
        return wrapped(*args, **kwargs)
    named = bound_arguments(wrapped, args, kwargs).arguments
    inputs, module_kwargs, device_ids = named["inputs"], named["kwargs"], named["device_ids"]
    devices = [torch.device(DEVICE_TYPE, index) for index in device_ids]
    scattered_inputs = _scatter(tuple(inputs), devices, instance.dim) if inputs else []
    scattered_kwargs = _scatter(dict(module_kwargs), devices, instance.dim) if module_kwargs else []
    count = max(len(scattered_inputs), len(scattered_kwargs))
    scattered_inputs = list(scattered_inputs) + [() for _ in range(count - len(scattered_inputs))]
    scattered_kwargs = list(scattered_kwargs) + [{} for _ in range(count - len(scattered_kwargs))]
    return tuple(scattered_inputs), tuple(scattered_kwargs)


# -- replicate -----------------------------------------------------------------------------


def replicate(
    wrapped: Wrapper, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``DataParallel.replicate(module, device_ids)`` → one replica per adapter."""
    if not _on_directml(instance):
        return wrapped(*args, **kwargs)
    named = bound_arguments(wrapped, args, kwargs).arguments
    module, device_ids = named["module"], named["device_ids"]
    detach = not torch.is_grad_enabled()
    return [_replica(module, torch.device(DEVICE_TYPE, index), detach) for index in device_ids]


def _replica(network: torch.nn.Module, device: torch.device, detach: bool) -> torch.nn.Module:
    modules = list(network.modules())
    position = {id(module): i for i, module in enumerate(modules)}
    copies = [module._replicate_for_data_parallel() for module in modules]
    for module, copy in zip(modules, copies):
        for name, child in module._modules.items():
            copy._modules[name] = None if child is None else copies[position[id(child)]]
        for name, parameter in module._parameters.items():
            copy._parameters[name] = (
                None if parameter is None else _moved(parameter, device, detach)
            )
        for name, buffer in module._buffers.items():
            # The replica on the source adapter shares the buffers (BatchNorm's running
            # statistics are updated there, as with CUDA's DataParallel).
            copy._buffers[name] = (
                None
                if buffer is None
                else buffer.detach().to(device)
                if (buffer.device != device)
                else buffer
            )
    return copies[0]


def _moved(parameter: torch.Tensor, device: torch.device, detach: bool) -> torch.Tensor:
    # Tensor.to is differentiable: the replica's gradient arrives in the original parameter.
    # On the source adapter it is the original itself, as torch's replicate makes it.
    copy = parameter.to(device)
    if detach and copy is not parameter:
        return copy.detach()
    return copy


# -- parallel apply ------------------------------------------------------------------------


def parallel_apply(
    wrapped: Wrapper, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> list[Any]:
    """``DataParallel.parallel_apply(replicas, inputs, kwargs)`` → outputs, one per replica."""
    if not _on_directml(instance):
        return wrapped(*args, **kwargs)
    named = bound_arguments(wrapped, args, kwargs).arguments
    replicas, inputs, module_kwargs = named["replicas"], named["inputs"], named["kwargs"]
    if len(replicas) == 1:
        return [replicas[0](*inputs[0], **module_kwargs[0])]
    grad_enabled = torch.is_grad_enabled()
    from dmlpatch import opfix

    # Fixes that wait for their dtype are installed now, not while replicas run on threads.
    opfix.arm_all()
    results: list[Any] = [None] * len(replicas)
    failures: list[Optional[BaseException]] = [None] * len(replicas)

    def work(i: int) -> None:
        try:
            with torch.set_grad_enabled(grad_enabled):
                results[i] = replicas[i](*inputs[i], **module_kwargs[i])
        except BaseException as error:  # re-raised in the caller's thread below
            failures[i] = error

    threads = [threading.Thread(target=work, args=(i,)) for i in range(1, len(replicas))]
    for thread in threads:
        thread.start()
    work(0)
    for thread in threads:
        thread.join()
    for failure in failures:
        if failure is not None:
            raise failure
    return results


# -- gather --------------------------------------------------------------------------------


def _gather(outputs: list[Any], device: torch.device, dim: int) -> Any:
    first = outputs[0]
    if isinstance(first, torch.Tensor):
        if first.dim() == 0:
            return torch.stack([output.to(device) for output in outputs])
        return torch.cat([output.to(device) for output in outputs], dim)
    if first is None:
        return None
    if isinstance(first, dict):
        return type(first)((key, _gather([o[key] for o in outputs], device, dim)) for key in first)
    if isinstance(first, tuple) and hasattr(first, "_fields"):
        return type(first)(*(_gather(list(column), device, dim) for column in zip(*outputs)))
    if isinstance(first, (tuple, list)):
        return type(first)(_gather(list(column), device, dim) for column in zip(*outputs))
    return first


def gather(wrapped: Wrapper, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``DataParallel.gather(outputs, output_device)`` → outputs joined on ``output_device``."""
    if not _on_directml(instance):
        return wrapped(*args, **kwargs)
    named = bound_arguments(wrapped, args, kwargs).arguments
    outputs, output_device = named["outputs"], named["output_device"]
    return _gather(list(outputs), torch.device(DEVICE_TYPE, output_device), instance.dim)
