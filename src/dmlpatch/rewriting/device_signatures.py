"""Every device parameter of torch's public callables, read from the running torch.

A device reaches torch through a parameter: ``torch.Generator("cuda")``'s first,
``torch.load(f, "cuda")``'s second (``map_location``), ``x.to(dev)``'s first,
``torch.randn(2, device=gpu)``'s keyword. The rewriter meets a device at each of them
(``dmlpatch.rewriting.transform.device_parameters``, the table this module derives), so the
table comes from torch's own signatures, not from a hand list:

- callables written in Python: ``inspect.signature``;
- callables written in C++ (``torch.randn``, ``Tensor.to``, ``torch.Generator``), which have no
  signature to inspect: the type stubs torch ships beside them (``torch/_C/*.pyi``), generated
  from the same declarations as the bindings, every overload of each.

A parameter is a device one when its annotation names a device type (``DeviceLikeType``,
``torch.device``, ``_device``) or its name says so (``device``, ``*_device``, ``device_type``,
``map_location``, ``devices``, ``device_ids``). Its kind says what a value there means
(:data:`KINDS`). Callables of ``torch.cuda`` and ``torch.accelerator`` take the program's CUDA
ordinals: their kind is ``cuda_api``, as the runtime's CUDA API answers those calls whole.

Run by ``scripts/device_parameters.py`` under each supported torch to write the table, and by
``tests/unit/test_device_parameters.py`` against the running torch. It imports torch: nothing
at run time uses it.
"""

from __future__ import annotations

import ast
import inspect
import os
import types
import typing
import warnings
from collections.abc import Iterator
from typing import Any, Optional

#: What a value at a device parameter is, by kind:
#: ``device`` one device (a string, ``torch.device`` or CUDA ordinal); ``map_location``
#: ``torch.load``'s (a device, or a dict or function mapping saved locations); ``device_type``
#: a device's type alone (``"cuda"``); ``pin_memory_device`` the ``DataLoader``'s device to pin
#: host memory for; ``devices`` a sequence of devices or ordinals; ``cuda_api`` an argument of
#: ``torch.cuda`` / ``torch.accelerator`` (a CUDA ordinal).
KINDS = ("device", "map_location", "device_type", "pin_memory_device", "devices", "cuda_api")

#: One device parameter: its name, its position among the positional parameters (``self``
#: not counted for a method; None: keyword-only), and its kind.
Parameter = tuple[str, Optional[int], str]

#: The public namespaces walked, as torch names them. Submodules a torch lacks are skipped.
MODULES = (
    "torch",
    "torch.amp",
    "torch.autograd.graph",
    "torch.cuda",
    "torch.cuda.amp",
    "torch.accelerator",
    "torch.distributed",
    "torch.fft",
    "torch.hub",
    "torch.jit",
    "torch.linalg",
    "torch.nested",
    "torch.nn",
    "torch.nn.functional",
    "torch.nn.init",
    "torch.nn.utils",
    "torch.nn.utils.rnn",
    "torch.random",
    "torch.serialization",
    "torch.sparse",
    "torch.special",
    "torch.testing",
    "torch.utils.checkpoint",
    "torch.utils.data",
)

#: Classes whose methods are called on objects a program holds (``x.to(dev)``,
#: ``model.to_empty(device=...)``, ``storage.pin_memory(dev)``): the rewriter meets them by
#: method name, whatever the object.
METHOD_CLASSES = (
    "torch.Tensor",
    "torch.nn.Module",
    "torch.UntypedStorage",
    "torch.TypedStorage",
    "torch.nn.utils.rnn.PackedSequence",
)

#: Parameter names that are sequences of devices.
_DEVICE_LISTS = frozenset({"devices", "device_ids"})
#: Names that mention a device but hold something else (a mesh of ranks, a device's
#: properties or a map of modules to devices, not a device).
_NOT_DEVICES = frozenset({"device_mesh", "device_map", "device_properties", "devices_mesh"})
#: Annotation words of a device type (``DeviceLikeType``, ``_device``, ``torch.device``).
_DEVICE_ANNOTATIONS = ("DeviceLikeType", "_device", "torch.device", "Device")


def derive(torch: Any) -> dict[str, dict[str, Parameter]]:
    """``{qualified callable: {parameter name: Parameter}}`` of the running torch.

    Methods of :data:`METHOD_CLASSES` are named ``<class>.<method>``.
    """
    stubs = _Stubs(os.path.join(os.path.dirname(torch.__file__), "_C"))
    table: dict[str, dict[str, Parameter]] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecated names warn when looked up
        found_callables = list(_callables(torch))
    for qualified, obj, is_method in found_callables:
        found: dict[str, Parameter] = {}
        for parameter in _parameters(obj, stubs, is_method):
            name, position, kind = parameter
            if qualified.startswith(("torch.cuda.", "torch.accelerator.")):
                kind = "cuda_api"
            found[name] = _merged(found.get(name), (name, position, kind))
        if found:
            table[qualified] = found
    return table


def _merged(old: Optional[Parameter], new: Parameter) -> Parameter:
    """One parameter seen in several overloads: positional where any overload takes it so."""
    if old is None or old[1] is not None:
        return old or new
    return new


def _callables(torch: Any) -> Iterator[tuple[str, Any, bool]]:
    """Each public callable by every name the walked namespaces give it (``torch.load`` and
    ``torch.serialization.load`` are one function, imported either way)."""
    for module_name in MODULES:
        module = _resolve(module_name)
        if not isinstance(module, types.ModuleType):
            continue
        for name in _public(module):
            obj = getattr(module, name, None)
            if obj is None or isinstance(obj, types.ModuleType) or not callable(obj):
                continue
            home = getattr(obj, "__module__", None) or ""
            if not home.startswith("torch") and module_name != "torch":
                continue  # re-exported from elsewhere (typing, builtins)
            if (
                isinstance(obj, type)
                and module_name != "torch"
                and not home.startswith(module_name)
            ):
                continue  # a class its module imports for its own use (torch.fft's Tensor)
            yield f"{module_name}.{name}", obj, False
    for class_name in METHOD_CLASSES:
        cls = _resolve(class_name)
        if not isinstance(cls, type):
            continue
        for name in dir(cls):
            if name.startswith("_"):
                continue
            member = inspect.getattr_static(cls, name, None)
            if isinstance(member, (staticmethod, classmethod, property)) or not callable(
                getattr(cls, name, None)
            ):
                continue
            yield f"{class_name}.{name}", getattr(cls, name), True


def _resolve(dotted: str) -> Any:
    """The module, class or function a dotted name of torch's names (None: not in this torch)."""
    import importlib

    parts = dotted.split(".")
    for count in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:count]))
        except ImportError:
            continue
        for part in parts[count:]:
            obj = getattr(obj, part, None)
        return obj
    return None


def _public(module: types.ModuleType) -> list[str]:
    names = getattr(module, "__all__", None)
    if names is None:
        names = [name for name in vars(module) if not name.startswith("_")]
    return sorted(set(names))


def _parameters(obj: Any, stubs: _Stubs, is_method: bool) -> Iterator[Parameter]:
    signatures = _signatures(obj, stubs, is_method)
    for parameters in signatures:
        positional = [
            p
            for p in parameters
            if p.kind
            in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        ]
        if (
            (is_method or isinstance(obj, type))
            and positional
            and positional[0].name
            in (
                "self",
                "cls",
            )
        ):
            positional = positional[1:]
        for parameter in parameters:
            kind = _kind(parameter.name, parameter.annotation)
            if kind is None:
                continue
            position = positional.index(parameter) if parameter in positional else None
            yield parameter.name, position, kind


def _kind(name: str, annotation: Any) -> Optional[str]:
    text = annotation if isinstance(annotation, str) else _annotation_text(annotation)
    if name in _NOT_DEVICES or text in ("bool", "_bool", "builtins.bool"):
        return None  # assert_close's check_device says whether to compare devices
    if name in _DEVICE_LISTS:
        return "devices"
    if name in ("map_location", "pin_memory_device"):
        return name
    if name.endswith("device_type"):
        return "device_type"
    if name == "device" or name.endswith("_device"):
        return "device"
    if text and "DeviceMesh" not in text and any(word in text for word in _DEVICE_ANNOTATIONS):
        return "device"
    return None


def _annotation_text(annotation: Any) -> str:
    if annotation is inspect.Parameter.empty:
        return ""
    if isinstance(annotation, type):
        return f"{annotation.__module__}.{annotation.__qualname__}"
    return str(annotation)


def _signatures(obj: Any, stubs: _Stubs, is_method: bool) -> list[list[inspect.Parameter]]:
    """The parameters of each signature of ``obj`` (a class: its constructor's)."""
    target = obj
    if isinstance(obj, type):
        init = obj.__dict__.get("__init__") or obj.__dict__.get("__new__")
        python_init = next(
            (
                c.__dict__["__init__"]
                for c in obj.__mro__
                if "__init__" in c.__dict__ and inspect.isfunction(c.__dict__["__init__"])
            ),
            None,
        )
        if python_init is not None and (init is None or inspect.isfunction(init)):
            target = python_init
        else:
            found = stubs.of_class(obj.__name__, "__init__") + stubs.of_class(
                obj.__name__, "__new__"
            )
            if found:
                return found
            target = python_init
            if target is None:
                return []
    if inspect.isfunction(target) or inspect.ismethod(target):
        # Module.to(*args, **kwargs) says what it takes in its typing overloads (Python >= 3.11).
        get_overloads = getattr(typing, "get_overloads", None)
        overloads = list(get_overloads(target)) if get_overloads is not None else []
        found = []
        for function in [target, *overloads]:
            try:
                found.append(list(inspect.signature(function).parameters.values()))
            except (TypeError, ValueError):
                continue
        return found
    # A builtin: its stubs, as a method of its class or a module-level function.
    name = getattr(obj, "__name__", "")
    owner = getattr(obj, "__objclass__", None)
    if owner is not None:
        found = stubs.of_class(owner.__name__, name)
        if found:
            return [_keyword_only_as_documented(obj, parameters) for parameters in found]
    found = stubs.of_function(name)
    if found:
        return [_keyword_only_as_documented(obj, parameters) for parameters in found]
    try:
        return [list(inspect.signature(obj).parameters.values())]
    except (TypeError, ValueError):
        return []


def _keyword_only_as_documented(
    obj: Any, parameters: list[inspect.Parameter]
) -> list[inspect.Parameter]:
    """A stub's parameters, those its docstring's signature line puts after ``*`` keyword-only.

    A few stubs are written by hand and take as positional what the binding refuses
    (``torch.tensor(data, dtype, device)``: "takes 1 positional argument"); the docstring's
    first line (``tensor(data, *, dtype=None, device=None, ...) -> Tensor``) says it right.
    """
    name = getattr(obj, "__name__", "")
    line = next(
        (
            text.strip()
            for text in (getattr(obj, "__doc__", None) or "").splitlines()
            if text.strip().startswith(f"{name}(")
        ),
        None,
    )
    if line is None or "*," not in line:
        return parameters
    after = line[line.index("*,") + 2 : line.rfind(")")]
    keyword_only = {part.split("=")[0].split(":")[0].strip() for part in after.split(",")}
    return [
        p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
        if p.name in keyword_only and p.kind is not inspect.Parameter.VAR_POSITIONAL
        else p
        for p in parameters
    ]


class _Stubs:
    """The definitions of torch's ``_C/*.pyi`` stubs, by name: module-level functions, and
    methods by class (``TensorBase`` is ``Tensor``'s)."""

    def __init__(self, directory: str) -> None:
        self.functions: dict[str, list[list[inspect.Parameter]]] = {}
        self.methods: dict[tuple[str, str], list[list[inspect.Parameter]]] = {}
        try:
            names = sorted(os.listdir(directory))
        except OSError:
            names = []
        # _VariableFunctions holds torch.<name>; it comes first where names repeat.
        names.sort(key=lambda n: n != "_VariableFunctions.pyi")
        for name in names:
            if name.endswith(".pyi"):
                with open(os.path.join(directory, name), encoding="utf-8") as handle:
                    self._read(ast.parse(handle.read()))

    def _read(self, tree: ast.Module) -> None:
        for node in tree.body:
            if isinstance(node, ast.FunctionDef):
                self.functions.setdefault(node.name, []).append(_stub_parameters(node))
            elif isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.FunctionDef):
                        self.methods.setdefault((node.name, item.name), []).append(
                            _stub_parameters(item)
                        )

    def of_function(self, name: str) -> list[list[inspect.Parameter]]:
        return self.functions.get(name, [])

    def of_class(self, cls: str, name: str) -> list[list[inspect.Parameter]]:
        for candidate in (cls, f"_{cls}", f"{cls}Base", "TensorBase" if cls == "Tensor" else ""):
            found = self.methods.get((candidate, name))
            if found:
                return found
        return []


def _stub_parameters(node: ast.FunctionDef) -> list[inspect.Parameter]:
    arguments = node.args
    made: list[inspect.Parameter] = []

    def add(arg: ast.arg, kind: Any) -> None:
        annotation = ast.unparse(arg.annotation) if arg.annotation is not None else ""
        made.append(inspect.Parameter(arg.arg, kind, annotation=annotation))

    for arg in arguments.posonlyargs:
        add(arg, inspect.Parameter.POSITIONAL_ONLY)
    for arg in arguments.args:
        add(arg, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    if arguments.vararg is not None:
        add(arguments.vararg, inspect.Parameter.VAR_POSITIONAL)
    for arg in arguments.kwonlyargs:
        add(arg, inspect.Parameter.KEYWORD_ONLY)
    return made
