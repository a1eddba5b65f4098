"""The ``_foreach_*`` operators behind every optimizer step, composed of per-tensor operators.

torch picks the foreach path of SGD, Adam, AdamW... (and ``clip_grad_norm_``) for PrivateUse1
devices, so each step calls ``_foreach_lerp_``, ``_foreach_addcmul_``, ``_foreach_norm``... with
every parameter. torch-directml registers none of them: on torch 2.4.1 each call goes through
its CPU fallback, copying every parameter, gradient and optimizer state to the host and back
(microsoft/DirectML#604: ``The operator 'aten::_foreach_lerp_.Scalar' is not currently
supported on the DML backend``). Newer torch composes them of per-tensor operators before they
reach a backend; these kernels do the same on torch-directml's, calling the per-tensor operator
(``lerp_``, ``addcmul_``, ``linalg_vector_norm``...) on each element as the CPU's slow path
does, so the results are the CPU's.

A kernel is generated for each overload of the operators in :data:`OPERATORS` that the running
torch has (functional, in-place and ``out=``).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from dmlpatch.opfix._accounting import record
from dmlpatch.opfix._kernel import Kernel, into

#: The foreach operators served (without ``_foreach_`` and without the in-place ``_``), each with
#: the per-tensor operator it applies.
OPERATORS = {
    **{
        name: name
        for name in (
            "abs",
            "add",
            "addcdiv",
            "addcmul",
            "clamp_max",
            "clamp_min",
            "clone",
            "copy",
            "div",
            "exp",
            "lerp",
            "log",
            "maximum",
            "minimum",
            "mul",
            "neg",
            "pow",
            "reciprocal",
            "rsqrt",
            "sigmoid",
            "sign",
            "sqrt",
            "sub",
            "tanh",
            "zero",
        )
    },
    "norm": "linalg_vector_norm",
}

#: Arguments a per-tensor operator takes by keyword (``addcmul(..., *, value)``) that its
#: foreach operator takes positionally: foreach name -> keyword.
_KEYWORDS = {
    "addcmul": {"value": "value", "scalars": "value"},
    "addcdiv": {"value": "value", "scalars": "value"},
    "norm": {"dtype": "dtype"},
}


#: maximum/minimum take no scalar: with one, the CPU's slow path clamps instead.
_WITH_SCALARS = {"maximum": "clamp_min", "minimum": "clamp_max"}


def _element(argument: Any, value: Any, index: int) -> Any:
    if isinstance(value, torch.Tensor) and argument.name == "scalars":
        return value[index].item()  # addcmul/addcdiv's scalars: a tensor, one per element
    if isinstance(value, (list, tuple)):
        return value[index]
    return value


def _kernel(qualified: str) -> Callable[..., Any]:
    name, _, overload = qualified.split("::", 1)[1].partition(".")
    schema = torch._C._get_schema("aten::" + name, overload)
    base = name[len("_foreach_") :]
    in_place = base.endswith("_")
    keywords = _KEYWORDS.get(base.rstrip("_"), {})
    per_tensor = OPERATORS[base.rstrip("_")]
    if per_tensor in _WITH_SCALARS and overload.startswith("Scalar"):
        per_tensor = _WITH_SCALARS[per_tensor]
    # maximum/minimum have no in-place operator: the CPU writes their result into self.
    writes_back = in_place and not hasattr(torch.ops.aten, per_tensor + "_")
    target = getattr(torch.ops.aten, per_tensor + ("_" if in_place and not writes_back else ""))
    arguments = [a for a in schema.arguments if a.name != "out"]
    positional = [a for a in arguments if not a.kwarg_only]

    def run(*args: Any, **kwargs: Any) -> Any:
        record("fixed", qualified)
        out = kwargs.pop("out", None)
        values = dict(zip((a.name for a in positional), args))
        values.update(kwargs)
        lists = [v for v in values.values() if isinstance(v, (list, tuple))]
        results = []
        for index in range(len(lists[0]) if lists else 0):
            call_args, call_kwargs = [], {}
            for argument in arguments:
                if argument.name not in values:
                    continue  # left to its default, as the per-tensor operator's own
                element = _element(argument, values[argument.name], index)
                keyword = keywords.get(argument.name)
                if argument.kwarg_only:
                    call_kwargs[argument.name] = element
                elif keyword is not None:
                    call_kwargs[keyword] = element
                else:
                    call_args.append(element)
            result = target(*call_args, **call_kwargs)
            if writes_back:
                call_args[0].copy_(result)
            results.append(result)
        if in_place:
            return None
        if out is not None:
            for destination, result in zip(out, results):
                into(destination, result)
            return None
        return results

    return run


def _kernels() -> tuple[Kernel, ...]:
    found = []
    for qualified in sorted(torch._C._dispatch_get_all_op_names()):
        if not qualified.startswith("aten::_foreach_"):
            continue
        base = qualified[len("aten::_foreach_") :].split(".", 1)[0].rstrip("_")
        if base in OPERATORS:
            found.append(Kernel(qualified[len("aten::") :], _kernel(qualified), "fallback"))
    return tuple(found)


#: Why no call is cheaper through DirectML's fallback (the registry's ``NO_CHOICE``).
NO_CHOICE = (
    "A foreach call is one per-tensor operator per element of its lists, each a kernel that costs "
    "less than the fallback's read-back and copies of that element (and those that can cost more, "
    "such as lerp_, choose for themselves)."
)

KERNELS = _kernels()
