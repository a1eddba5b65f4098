"""``DMLPATCH_CPU_OPS=aten::foo,aten::bar.overload``: named operators run on the CPU.

A bare name covers all overloads of the operator and its in-place twin (``aten::add``: add,
add_, add.out); ``aten::add.Tensor`` names one overload. Accepted: operators that reach the
device (not those PyTorch composes of others above it, such as ``aten::linear``: the line
that refuses one names what it is made of) and that the CPU can run: a CPU kernel, a
composite one, or a CPU twin (the backend hooks ``convolution_overrideable`` and
``convolution_backward_overrideable`` run as ``convolution`` and ``convolution_backward``).
Any other name stops the program at its ``import torch`` with one line.

For operators that are wrong or slow on a given adapter. Each call does what DirectML's own
CPU fallback does: copy every device tensor argument to the CPU, run the CPU kernel, copy
written arguments and new results back. Calls count as ``fallback`` with the copies they made
(on the simulated device these are real transfers, so they appear in its transfer counters
too, and the report takes them out of the program's own: :func:`copies_made`). Autograd stays
PyTorch's: only the kernel below it moves.
"""

from __future__ import annotations

import threading
from time import perf_counter
from typing import Any, Callable, Optional

import torch
from torch.utils._pytree import tree_map

from dmlpatch.environment_variables import DMLPATCH_CPU_OPS
from dmlpatch.errors import UsageError
from dmlpatch.opfix._accounting import record

#: Copies these kernels really made: direction -> [count, bytes].
_made = {"d2h": [0, 0], "h2d": [0, 0]}
_made_lock = threading.Lock()


def copies_made() -> dict[str, dict[str, int]]:
    """The device->host and host->device copies CPU kernels made, as the simulated device
    counts transfers."""
    with _made_lock:
        return {k: {"count": c, "bytes": b} for k, (c, b) in _made.items()}


def _made_one(direction: str, nbytes: int) -> None:
    with _made_lock:
        entry = _made[direction]
        entry[0] += 1
        entry[1] += nbytes


def parse(text: str) -> list[str]:
    """``aten::name`` or ``aten::name.overload`` entries, comma-separated, in order."""
    names = []
    for raw in text.split(","):
        entry = raw.strip()
        if not entry:
            continue
        namespace, sep, rest = entry.partition("::")
        if not sep or not namespace or not rest:
            raise UsageError(
                f"{DMLPATCH_CPU_OPS}: {entry!r} is not an operator name like aten::index_add"
            )
        names.append(entry)
    return names


def _overloads(entry: str) -> list[torch._ops.OpOverload]:
    namespace, _, rest = entry.partition("::")
    name, _, overload = rest.partition(".")
    try:
        packet = getattr(getattr(torch.ops, namespace), name)
    except (AttributeError, RuntimeError):
        raise UsageError(f"{DMLPATCH_CPU_OPS}: no operator named {entry!r}") from None
    if overload:
        try:
            return [getattr(packet, overload)]
        except AttributeError:
            raise UsageError(
                f"{DMLPATCH_CPU_OPS}: {namespace}::{name} has no overload {overload!r}"
            ) from None
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


def _convolution_backward(
    grad_output: torch.Tensor,
    input: torch.Tensor,
    weight: torch.Tensor,
    stride: Any,
    padding: Any,
    dilation: Any,
    transposed: bool,
    output_padding: Any,
    groups: int,
    output_mask: Any,
) -> Any:
    # The bias gradient has one entry per output channel.
    channels = weight.shape[1] * groups if transposed else weight.shape[0]
    return torch.ops.aten.convolution_backward.default(
        grad_output,
        input,
        weight,
        [channels],
        stride,
        padding,
        dilation,
        transposed,
        output_padding,
        groups,
        output_mask,
    )


#: Backend hooks whose CPU kernel is none (their composite one raises "not implemented"),
#: and the CPU operator that computes the same.
_CPU_TWINS: dict[str, Callable[..., Any]] = {
    "aten::convolution_overrideable": lambda *a, **k: torch.ops.aten.convolution.default(*a, **k),
    "aten::convolution_backward_overrideable": _convolution_backward,
}

#: What common composites are made of, for the line that refuses them.
_MADE_OF = {
    "linear": "aten::addmm, aten::mm",
    "matmul": "aten::mm, aten::bmm",
    "bilinear": "aten::mm",
    "einsum": "aten::bmm",
    "layer_norm": "aten::native_layer_norm",
    "group_norm": "aten::native_group_norm",
    "batch_norm": "aten::native_batch_norm, aten::_native_batch_norm_legit_no_training",
    "scaled_dot_product_attention": "aten::bmm, aten::_softmax",
    **{
        f"conv{kind}{n}d": "aten::convolution_overrideable"
        for kind in ("", "_transpose")
        for n in (1, 2, 3)
    },
}

#: ``observer(name, args, result, copies, bytes, seconds)``: told of every call a CPU kernel
#: serves (the placement accounting of ordinary runs).
Observer = Callable[[str, tuple[Any, ...], Any, int, int, float], None]
_observer: Optional[Observer] = None


def observe(observer: Optional[Observer]) -> None:
    """Call ``observer`` after each call a CPU kernel serves (None: stop)."""
    global _observer
    _observer = observer


def cpu_kernel(
    op: torch._ops.OpOverload, upcast_half: bool = False, reported: Optional[str] = None
) -> Callable[..., Any]:
    """A PrivateUse1 kernel running ``op`` (or its CPU twin) on CPU copies of its arguments;
    with ``upcast_half``, float16 arguments are computed in float32 there and floating
    results come back as float16 where the CPU kernel has no float16 (it varies between torch
    releases: the first refusal decides, and the CPU's own float16 kernel runs where it has
    one). ``reported``: the
    name it is counted and announced under (DirectML names a structured operator's ``.out``
    kernel), by default the overload's."""
    schema = op._schema
    name = reported or op.name()
    on_the_cpu = _CPU_TWINS.get(name, op)
    tensor_positions = {
        i: argument.name for i, argument in enumerate(schema.arguments) if _takes_a_tensor(argument)
    }
    written = [
        i
        for i, a in enumerate(schema.arguments)
        if a.alias_info is not None and a.alias_info.is_write
    ]

    def kernel(*args: Any, **kwargs: Any) -> Any:
        started = perf_counter()
        copies = 0
        nbytes = 0
        device: list[torch.device] = []
        upcast: list[bool] = []

        on_cpu: dict[int, torch.Tensor] = {}

        def to_cpu(value: Any) -> Any:
            nonlocal copies, nbytes
            if isinstance(value, torch.Tensor) and value.device.type == "privateuseone":
                # One copy per tensor, however many arguments it is (attention's q, k, v).
                if id(value) in on_cpu:
                    return on_cpu[id(value)]
                device.append(value.device)
                copies += 1
                nbytes += _nbytes(value)
                _made_one("d2h", _nbytes(value))
                host = value.cpu()
                if widen and value.dtype is torch.float16:
                    upcast.append(True)
                    host = host.float()
                on_cpu[id(value)] = host
                return host
            if isinstance(value, torch.device) and value.type == "privateuseone":
                device.append(value)
                return torch.device("cpu")
            return value

        widen = upcast_half and name in _NO_CPU_HALF
        cpu_args = tree_map(to_cpu, args)
        cpu_kwargs = tree_map(to_cpu, kwargs)
        run = on_the_cpu
        if _numbers_for_tensors(tensor_positions, cpu_args, cpu_kwargs):
            # A number where the schema takes a tensor: PyTorch wrapped a scalar (x * 2.0,
            # fmod.Scalar's composite calling fmod.Tensor), and Python sees the number again.
            # The operator's own overloads take it as the CPU does (fmod.Scalar).
            run = _packet(op)
        computing = perf_counter()
        try:
            result = run(*cpu_args, **cpu_kwargs)
        except RuntimeError as error:
            # The CPU's own float16 kernel where this torch has one (its rounding is the
            # CPU's); float32 where it has none, learnt from the first refusal.
            if not upcast_half or widen or "not implemented for 'Half'" not in str(error):
                raise
            _NO_CPU_HALF.add(name)
            upcast.append(True)
            cpu_args, cpu_kwargs = tree_map(_widened, (cpu_args, cpu_kwargs))
            result = run(*cpu_args, **cpu_kwargs)
        cpu_ns = int((perf_counter() - computing) * 1e9)
        target = device[0] if device else torch.device("privateuseone", 0)
        originals: dict[int, torch.Tensor] = {}
        for i in written:
            argument = schema.arguments[i]
            before = args[i] if i < len(args) else kwargs.get(argument.name)
            after = cpu_args[i] if i < len(cpu_args) else cpu_kwargs.get(argument.name)
            # A written list (``Tensor(a!)[]``: the foreach and fused optimizers' in-place
            # forms) is written back element by element.
            pairs = zip(before, after) if isinstance(before, (list, tuple)) else [(before, after)]
            for device_tensor, host_tensor in pairs:
                if not isinstance(device_tensor, torch.Tensor) or not isinstance(
                    host_tensor, torch.Tensor
                ):
                    continue
                if device_tensor.shape != host_tensor.shape:
                    device_tensor.resize_(host_tensor.shape)
                device_tensor.copy_(host_tensor)
                copies += 1
                nbytes += _nbytes(host_tensor)
                _made_one("h2d", _nbytes(host_tensor))
                originals[id(host_tensor)] = device_tensor

        def to_device(value: Any) -> Any:
            nonlocal copies, nbytes
            if not isinstance(value, torch.Tensor):
                return value
            if id(value) in originals:
                return originals[id(value)]
            copies += 1
            nbytes += _nbytes(value)
            _made_one("h2d", _nbytes(value))
            if upcast and value.dtype is torch.float32:
                return value.to(target, torch.float16)
            return value.to(target)

        moved = tree_map(to_device, result)
        record("fallback", name, copies, nbytes, cpu_ns)
        observer = _observer
        if observer is not None:
            observer(name, args, result, copies, nbytes, perf_counter() - started)
        return moved

    return kernel


def _takes_a_tensor(argument: Any) -> bool:
    kind = str(argument.type)
    return kind in ("Tensor", "Tensor?", "Optional[Tensor]")


def _numbers_for_tensors(
    positions: dict[int, str], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> bool:
    number = (bool, int, float, complex)
    return any(
        isinstance(args[i], number) if i < len(args) else isinstance(kwargs.get(name), number)
        for i, name in positions.items()
    )


def _packet(op: torch._ops.OpOverload) -> Callable[..., Any]:
    """The operator with every overload (``aten::fmod``), which picks the one the arguments
    fit, as a Python call of it does."""
    namespace, _, rest = op.name().partition("::")
    return getattr(getattr(torch.ops, namespace), rest.partition(".")[0])


#: The operators (by reported name) whose CPU kernel refused float16 in this process.
_NO_CPU_HALF: set[str] = set()


def _widened(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.dtype is torch.float16:
        return value.float()
    return value


def _runs_on_the_cpu(name: str, twins: bool = True) -> bool:
    return (twins and name in _CPU_TWINS) or any(
        torch._C._dispatch_has_kernel_for_dispatch_key(name, key)
        for key in ("CPU", "CompositeExplicitAutograd", "CompositeExplicitAutogradNonFunctional")
    )


def _composite(name: str) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(name, "CompositeImplicitAutograd")


def _accepted(overloads: list[torch._ops.OpOverload]) -> list[torch._ops.OpOverload]:
    """The overloads that reach the device and can run on the CPU. An ``out=`` overload runs
    its operator's CPU kernel, so it needs one (a twin serves the named overload alone)."""
    default = next((op for op in overloads if op._overloadname == "default"), None)
    plain = default is None or (
        default.name() not in _CPU_TWINS and _runs_on_the_cpu(default.name(), twins=False)
    )
    return [
        op
        for op in overloads
        if not _composite(op.name())
        and _runs_on_the_cpu(op.name())
        and (plain or not op._overloadname.endswith("out"))
    ]


def resolve(text: str) -> list[torch._ops.OpOverload]:
    """The overloads named in ``text``; a name that cannot be sent to the CPU is a
    :class:`UsageError` that says which names can."""
    chosen = []
    for entry in parse(text):
        overloads = _overloads(entry)
        default = next((op for op in overloads if op._overloadname == "default"), None)
        # aten::linear names the operator a program calls, and PyTorch composes it above the
        # device: its out= overload alone would be a silent no-op.
        composed = (default is not None and _composite(default.name())) or (
            bool(overloads) and all(_composite(op.name()) for op in overloads)
        )
        accepted = [] if composed else _accepted(overloads)
        if accepted:
            chosen.extend(accepted)
        elif composed:
            short = entry.partition("::")[2].split(".", 1)[0]
            made_of = _MADE_OF.get(short)
            instead = f" ({made_of})" if made_of else " (those dmlpatch check lists)"
            raise UsageError(
                f"{DMLPATCH_CPU_OPS}: {entry} never reaches the device: PyTorch composes it "
                f"of other operators; name those instead{instead}"
            )
        else:
            raise UsageError(
                f"{DMLPATCH_CPU_OPS}: {entry} cannot run on the CPU (it has no CPU kernel); "
                "accepted: operators with a CPU kernel, and aten::convolution_overrideable / "
                "aten::convolution_backward_overrideable (the convolution)"
            )
    return chosen


def register(library: torch.library.Library, ops: list[torch._ops.OpOverload]) -> list[str]:
    """Register the CPU kernel for each overload; returns their names."""
    for op in ops:
        library.impl(op.name().split("::", 1)[1], cpu_kernel(op), "PrivateUse1")
    return [op.name() for op in ops]
