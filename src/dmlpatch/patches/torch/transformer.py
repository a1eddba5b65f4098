"""``nn.TransformerEncoder`` with a padding mask, in eval, on DirectML: without nested tensors.

Given ``src_key_padding_mask`` in eval (PyTorch's fast path, ``enable_nested_tensor=True`` by
default), the encoder packs the batch's sequences into a nested tensor, runs its layers on it
and pads the result again with zeros. DirectML has no nested tensors: its CPU fallback builds
one on the host and cannot hand it back, so the encoder that runs under plain python on the CPU
stops on the device. Here the encoder runs the same layers on the padded batch with the padding
mask instead (the layers' own fast path, :mod:`dmlpatch.opfix.layers.attention`), and the padded
positions are zeroed before the final norm, as the nested path leaves them: the result equals
the CPU's. Whether the encoder would have packed is torch's own decision, taken in its forward:
the device's ``_nested_tensor_from_mask`` raises before anything else has run, and only then is
the call made again without packing. Encoders on other devices, or given no padding mask, run
exactly as torch wrote them.
"""

from __future__ import annotations

from typing import Any, Callable

DEVICE_TYPE = "privateuseone"

Wrapper = Callable[..., Any]


def encoder_forward(
    wrapped: Wrapper, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``TransformerEncoder.forward(src, mask=None, src_key_padding_mask=None, ...)``."""
    src = args[0] if args else kwargs.get("src")
    padding = args[2] if len(args) > 2 else kwargs.get("src_key_padding_mask")
    device = getattr(src, "device", None)
    if padding is None or device is None or device.type != DEVICE_TYPE:
        return wrapped(*args, **kwargs)
    from dmlpatch.opfix.layers.attention import NestedTensorsUnsupported

    try:
        return wrapped(*args, **kwargs)
    except NestedTensorsUnsupported:
        pass
    import torch

    from dmlpatch.opfix._accounting import record

    norm = instance.norm
    # Set on the module for this call; a concurrent call of the same module is on the same
    # device and comes through here too.
    instance.use_nested_tensor, instance.norm = False, None
    try:
        output = wrapped(*args, **kwargs)
    finally:
        instance.use_nested_tensor, instance.norm = True, norm
    # The nested path keeps the positions the mask leaves valid (False, or 0 in a float mask).
    padded = padding if padding.dtype == torch.bool else padding != 0
    output = output.masked_fill(padded.unsqueeze(-1), 0.0)
    record("fixed", "aten::_nested_tensor_from_mask")
    return output if norm is None else norm(output)
