"""``device_literal``, ``device_value``, ``cuda_call``, ``pin_memory`` and ``torch_load``
sites: the places where a value names a device, ``x.cuda()``, ``x.pin_memory()``, and
checkpoints that come back on CUDA."""

from __future__ import annotations

import ast
import re
from collections import deque
from collections.abc import Iterator
from typing import Optional, Union

from dmlpatch.rewriting.transform import device_parameters
from dmlpatch.rewriting.transform.device_parameters import Parameter
from dmlpatch.rewriting.transform.names import BLOCKS, TORCH_DEVICE_FUNCTIONS
from dmlpatch.rewriting.transform.nodes import (
    alias,
    is_runtime_call,
    keyword,
    located,
    runtime_call,
)
from dmlpatch.rewriting.transform.walker import Walker

_CUDA_LITERAL = re.compile(r"cuda(:\d+)?")
#: Other devices a program chooses between with CUDA.
_OTHER_DEVICE = re.compile(r"(cpu|mps|xpu|privateuseone)(:\d+)?")


#: Methods that need CUDA, by the site kind a call of one is: ``x.pin_memory()`` pins for
#: CUDA on torch 2.4 (torch-directml's torch) whatever the device, and fails without it.
_METHOD_SITES = {"cuda": "cuda_call", "pin_memory": "pin_memory"}


class DeviceSites(Walker):
    # -- calls --------------------------------------------------------------------------------

    def load_call(self, node: ast.Call) -> bool:
        """``torch.load(f)`` with no ``map_location`` (a checkpoint saved on a GPU comes back
        on CUDA: ``Attempting to deserialize object on a CUDA device``), rerouted in place."""
        func = node.func
        if not (
            isinstance(func, ast.Attribute)
            and func.attr == "load"
            and isinstance(func.value, ast.Name)
            and func.value.id in self.names.torch
            and len(node.args) == 1
            and not isinstance(node.args[0], ast.Starred)
            and all(k.arg not in (None, "map_location") for k in node.keywords)
        ):
            return False
        self.site(node, "torch_load")
        node.args = [func, *node.args]
        node.func = located(alias("load"), func)
        return True

    def queue_call(self, node: ast.Call) -> bool:
        """``torch.Stream(...)`` and ``torch.Event(...)``: DirectML has neither, so they are
        answered by the runtime (``__dmlpatch__.queue(torch.Stream, ...)``) like
        ``torch.cuda.Stream``; their device arguments as every device argument."""
        if self.names.qualified(node.func) not in _QUEUES:
            return False
        self.device_arguments(node)
        self.site(node, "cuda_api")
        node.args = [node.func, *node.args]
        node.func = located(alias("queue"), node.func)
        return True

    def cuda_method_call(self, node: ast.Call) -> Union[ast.Call, None]:
        """``x.cuda(...)`` → ``__dmlpatch__.cuda(x, ...)`` and ``x.pin_memory(...)`` →
        ``__dmlpatch__.pin_memory(x, ...)``; None for any other call."""
        func = node.func
        if not (
            isinstance(func, ast.Attribute)
            and func.attr in _METHOD_SITES
            and self.is_object(func.value)
        ):
            return None
        self.site(node, _METHOD_SITES[func.attr])
        callee = located(alias(func.attr), func)
        call = located(ast.Call(callee, [func.value, *node.args], node.keywords), node)
        if (
            func.end_lineno is not None
            and func.end_lineno != func.lineno
            and func.end_col_offset is not None
        ):
            # CPython reports a method call whose object spans lines at the line of its
            # name (``(x\n .cuda())``: the second): start the call there, as tracebacks did.
            call.lineno = func.end_lineno
            call.col_offset = func.end_col_offset - len(func.attr)
        return call

    def device_arguments(self, node: ast.Call) -> None:
        """The arguments of a call that name a device: ``torch.device(...)``'s; each device
        parameter of a torch callable, positional or keyword (``device_parameters``: from
        torch's signatures), whatever value it holds; ``add_argument('--device',
        default=...)``'s default; keywords named for a device on any call."""
        func = node.func
        if self._torch_device_function(func):
            self._device_call(node)
            return
        parameters = self._device_parameters(func)
        if parameters:
            self._parameter_arguments(node, parameters)
        elif _is_device_option(node):
            for option in node.keywords:
                if option.arg == "default":
                    option.value = self.device_value(option.value)
        taken = {name for name, _, _ in parameters}
        for named in node.keywords:
            if named.arg is None or named.arg in taken:
                continue
            if named.arg in _DEVICE_KEYWORDS:
                # torch's own parameter names, on a callee not resolved to torch (an alias,
                # a wrapper that passes them on): every value goes through the check.
                named.value = self.argument(
                    named.value, _DEVICE_KEYWORDS[named.arg], of_torch=False
                )
            elif _names_device(named.arg):
                named.value = self.device_value(named.value, computed=_holds_device(named.value))

    def _device_parameters(self, func: ast.expr) -> tuple[Parameter, ...]:
        """The device parameters of the callee: a torch callable by the name it is imported
        under, or a method of tensors, modules and storages by its name (``x.to``)."""
        qualified = self.names.qualified(func)
        if qualified is not None:
            return device_parameters.FUNCTIONS.get(qualified, ())
        if isinstance(func, ast.Attribute) and self.is_object(func.value):
            return device_parameters.METHODS.get(func.attr, ())
        return ()

    def _parameter_arguments(self, node: ast.Call, parameters: tuple[Parameter, ...]) -> None:
        for name, position, kind in parameters:
            if (
                position is not None
                and position < len(node.args)
                and not any(isinstance(arg, ast.Starred) for arg in node.args[: position + 1])
            ):
                node.args[position] = self.argument(node.args[position], kind)
            for named in node.keywords:
                if named.arg == name:
                    named.value = self.argument(named.value, kind)

    def argument(self, node: ast.expr, kind: str, of_torch: bool = True) -> ast.expr:
        """The value at a device parameter of ``kind``: a CUDA literal becomes the target at
        import; any value that may name a device at run time goes through the runtime's
        check (``__dmlpatch__.device_argument`` and its kin), which passes everything but
        CUDA's names through untouched. Not ``of_torch`` (a keyword named ``device`` on a
        callee that may be anyone's), an integer is left as it is: torch takes one for CUDA's
        ordinal, but others read it their own way (safetensors' ``safe_open(device=0)`` is the
        current accelerator)."""
        if kind == "cuda_api":
            return node  # the runtime's CUDA API answers the whole call
        if kind == "devices":
            return self._listed_device(node)
        if isinstance(node, ast.IfExp):
            node.body = self.argument(node.body, kind, of_torch)
            node.orelse = self.argument(node.orelse, kind, of_torch)
            return node
        if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or):
            node.values = [self.argument(value, kind, of_torch) for value in node.values]
            return node
        if _says_cuda(node) or (of_torch and kind != "device_type" and _is_ordinal(node)):
            self.site(node, "device_literal")
            # A device's name is the target's at import; a device type or a device to pin
            # memory for is answered by the runtime, as its kind says.
            check = "device" if kind in ("device", "map_location") else _CHECKS[kind]
            return runtime_call(check, [node], node)
        if (
            _fixed(node)
            or _is_dtype(node, self.names.torch)
            or (isinstance(node, ast.Call) and self._torch_device_function(node.func))
        ):
            return node  # torch.device(...) is rewritten in itself: never CUDA's now
        self.site(node, "device_argument")
        check = _CHECKS[kind] if of_torch or kind != "device" else "device_keyword"
        return runtime_call(check, [node], node)

    def _device_call(self, node: ast.Call) -> None:
        """``torch.device(...)``: the type argument names a device; ``('cuda', i)`` keeps ``i``."""
        type_keyword = keyword(node, "type")
        index_keyword = keyword(node, "index")
        kind = node.args[0] if node.args else (type_keyword.value if type_keyword else None)
        index = node.args[1] if len(node.args) > 1 else None
        if index is None and index_keyword is not None:
            index = index_keyword.value
        if kind is None:
            return
        if index is not None:
            if isinstance(kind, ast.Constant) and kind.value == "cuda":
                # torch.device('privateuseone:0', i) is an error, so route the ordinal alone.
                self.site(node, "device_literal")
                node.args = [runtime_call("device", [index], kind)]
                node.keywords = [k for k in node.keywords if k.arg not in ("type", "index")]
            return
        if node.args:
            node.args[0] = self.device_value(node.args[0], computed=True)
        elif type_keyword is not None:
            type_keyword.value = self.device_value(type_keyword.value, computed=True)

    def _torch_device_function(self, func: ast.expr) -> bool:
        if isinstance(func, ast.Name):
            return func.id in self.names.torch_functions
        return (
            isinstance(func, ast.Attribute)
            and func.attr in TORCH_DEVICE_FUNCTIONS
            and isinstance(func.value, ast.Name)
            and func.value.id in self.names.torch
        )

    # -- choices, definitions and assignments -------------------------------------------------

    def visit_IfExp(self, node: ast.IfExp) -> ast.expr:
        """``'cuda' if c else 'cpu'``: a CUDA literal chosen against another device's name, or
        by CUDA's availability, is a device wherever the value goes (``dev = ...``, an
        argument of the program's own function)."""
        branches = (node.body, node.orelse)
        if any(_says_cuda(branch) for branch in branches) and (
            any(_names_another_device(branch) for branch in branches) or _asks_cuda(node.test)
        ):
            node.body = self.device_value(node.body)
            node.orelse = self.device_value(node.orelse)
        return node

    def visit_If(self, node: ast.If) -> ast.AST:
        """``if torch.cuda.is_available(): dev = 'cuda'``: assigned under CUDA's availability, a
        CUDA literal is a device whatever the name; so is one added to a collection there
        (``DEVICES.append('cuda')``, ``devices += ['cuda']``, ``devices = ['cpu', 'cuda']``:
        test suites list the devices they parametrize over), where the condition said yes."""
        if _asks_cuda(node.test):
            for statement in (*node.body, *node.orelse):
                if isinstance(statement, (ast.Assign, ast.AugAssign)):
                    statement.value = self._listed_device(statement.value)
                elif isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call):
                    call = statement.value
                    call.args = [self._listed_device(arg) for arg in call.args]
        return node

    def _listed_device(self, node: ast.expr) -> ast.expr:
        """A CUDA literal, or the CUDA literals of a list, tuple or set display, as devices."""
        if _says_cuda(node):
            return self.device_value(node)
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            node.elts = [self.device_value(e) if _says_cuda(e) else e for e in node.elts]
        return node

    def returns(self, node: Union[ast.FunctionDef, ast.AsyncFunctionDef]) -> None:
        """``def get_device_name(): ... return f'cuda:{rank}'``: what a function named for a
        device returns names one (its nested functions are their own). A name that only
        mentions a device (scipy's ``xp_device_type`` classifies arrays: ``return "cuda"`` for
        CuPy's) is not such a function."""
        if not _names_device_function(node.name):
            return
        for statement in _own_statements(node):
            if isinstance(statement, ast.Return) and statement.value is not None:
                statement.value = self.device_value(statement.value)

    def defaults(self, args: ast.arguments) -> None:
        positional = [*args.posonlyargs, *args.args]
        offset = len(positional) - len(args.defaults)
        for i, default in enumerate(args.defaults):
            if _names_device(positional[offset + i].arg):
                args.defaults[i] = self.device_value(default)
        for i, (arg, kw_default) in enumerate(zip(args.kwonlyargs, args.kw_defaults)):
            if kw_default is not None and _names_device(arg.arg):
                args.kw_defaults[i] = self.device_value(kw_default)

    def visit_Assign(self, node: ast.Assign) -> ast.AST:
        if any(_is_device_target(target) for target in node.targets):
            node.value = self.device_value(node.value, computed=_holds_device(node.value))
        return node

    def visit_AnnAssign(self, node: ast.AnnAssign) -> ast.AST:
        if node.value is not None and _is_device_target(node.target):
            node.value = self.device_value(node.value, computed=_holds_device(node.value))
        return node

    def device_value(self, node: ast.expr, computed: bool = False) -> ast.expr:
        """Wrap ``node`` (or the branches of ``a if c else b`` / ``a or b``) if it says CUDA;
        with ``computed``, also a value only known at run time (a name, a call...)."""
        if isinstance(node, ast.IfExp):
            node.body = self.device_value(node.body, computed)
            node.orelse = self.device_value(node.orelse, computed)
            return node
        if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or):
            node.values = [self.device_value(value, computed) for value in node.values]
            return node
        if _says_cuda(node):
            self.site(node, "device_literal")
            return runtime_call("device", [node], node)
        if (
            computed
            and not isinstance(node, (ast.Constant, ast.JoinedStr))
            and not is_runtime_call(node)
        ):
            self.site(node, "device_value")
            return runtime_call("device", [node], node)
        return node


#: torch's device-agnostic queues, which DirectML lacks (see ``runtime.sites.queue``).
_QUEUES = frozenset({"torch.Stream", "torch.Event"})

#: Keywords that pass a device to torch by their very name, on any call, with their kind.
_DEVICE_KEYWORDS = {
    "device": "device",
    "map_location": "map_location",
    "pin_memory_device": "pin_memory_device",
}
#: The runtime's check of a value known only at run time, by parameter kind.
_CHECKS = {
    "device": "device_argument",
    "map_location": "map_location",
    "device_type": "device_type",
    "pin_memory_device": "pin_memory_device",
}

#: ``torch.<name>`` attributes that are dtypes, never devices (``x.to(torch.float16)``).
_DTYPES = frozenset(
    {
        "float16",
        "half",
        "float32",
        "float",
        "float64",
        "double",
        "bfloat16",
        "complex64",
        "cfloat",
        "complex128",
        "cdouble",
        "uint8",
        "int8",
        "int16",
        "short",
        "int32",
        "int",
        "int64",
        "long",
        "bool",
        "channels_last",
        "contiguous_format",
        "preserve_format",
    }
)


def _fixed(node: ast.expr) -> bool:
    """A value the source fixes that is not CUDA's name: ``"cpu"``, ``None``, a number...;
    rewritten calls too (``__dmlpatch__.device(...)``)."""
    if isinstance(node, ast.Constant) or (
        isinstance(node, ast.UnaryOp) and isinstance(node.operand, ast.Constant)
    ):
        return True  # -1 included: the CPU to the libraries that take an ordinal
    if isinstance(node, ast.JoinedStr):
        return not any(isinstance(value, ast.FormattedValue) for value in node.values)
    return is_runtime_call(node)


def _is_ordinal(node: ast.expr) -> bool:
    """A non-negative integer literal: CUDA's ordinal where torch takes a device
    (``x.to(0)``, ``pipeline(..., device=0)``; ``-1`` is the CPU to the libraries that take
    it)."""
    return (
        isinstance(node, ast.Constant)
        and isinstance(node.value, int)
        and not isinstance(node.value, bool)
        and node.value >= 0
    )


def _is_dtype(node: ast.expr, torch_names: set[str]) -> bool:
    """``torch.float16``, ``x.dtype``, ``weight_dtype``: a dtype (or memory format) where
    ``.to`` also takes one; a value named for a dtype is never a device."""
    if isinstance(node, ast.Name):
        return node.id.lower().endswith("dtype")
    if not isinstance(node, ast.Attribute):
        return False
    if node.attr.lower().endswith("dtype"):
        return True
    return (
        node.attr in _DTYPES and isinstance(node.value, ast.Name) and node.value.id in torch_names
    )


def holds_cuda_literal(tree: ast.Module) -> bool:
    """Whether ``tree`` keeps a CUDA device literal where a value is kept for later: assigned
    (``dev = "cuda"``, ``self.gpu = "cuda:0"``, ``cfg["dev"] = "cuda"``, a dict or list
    assigned), a parameter's default (``def run(where="cuda")``), a dict display's value. A
    name the module may hand to torch as a device later; a literal that is compared
    (``x.device.type == "cuda"``), a dict key, an annotation or an argument of some call is
    not one."""
    for node in ast.walk(tree):
        kept: list[Optional[ast.expr]] = []
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            kept = [node.value]
        elif isinstance(node, ast.arguments):
            kept = [*node.defaults, *node.kw_defaults]
        elif isinstance(node, ast.Dict):
            kept = list(node.values)
        if any(value is not None and _keeps_cuda(value) for value in kept):
            return True
    return False


def _keeps_cuda(node: ast.expr) -> bool:
    if isinstance(node, ast.IfExp):
        return _keeps_cuda(node.body) or _keeps_cuda(node.orelse)
    if isinstance(node, ast.BoolOp):
        return any(_keeps_cuda(value) for value in node.values)
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return any(_keeps_cuda(element) for element in node.elts)
    return _says_cuda(node)


def _own_statements(function: Union[ast.FunctionDef, ast.AsyncFunctionDef]) -> Iterator[ast.AST]:
    """The statements of ``function``'s body, without those of functions and classes in it."""
    queue: deque[ast.AST] = deque(function.body)
    while queue:
        node = queue.popleft()
        yield node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        for field in node._fields:
            value = getattr(node, field, None)
            if isinstance(value, list):
                queue.extend(item for item in value if isinstance(item, BLOCKS))


def _says_cuda(node: ast.expr) -> bool:
    """A literal CUDA device, or an expression building one from a ``'cuda:'`` prefix."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str) and _CUDA_LITERAL.fullmatch(node.value) is not None
    if isinstance(node, ast.JoinedStr):
        head = node.values[0] if node.values else None
        return (
            isinstance(head, ast.Constant)
            and isinstance(head.value, str)
            and (head.value == "cuda" or head.value.startswith("cuda:"))
        )
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mod, ast.Add)):
        return _cuda_prefix(node.left)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        return node.func.attr == "format" and _cuda_prefix(node.func.value)
    return False


def _names_another_device(node: ast.expr) -> bool:
    return (
        isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and _OTHER_DEVICE.fullmatch(node.value) is not None
    )


def _asks_cuda(test: ast.expr) -> bool:
    """Whether a condition calls ``torch.cuda.is_available()`` or ``device_count()`` (either
    already rerouted: children are rewritten first)."""
    return any(
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("is_available", "device_count")
        and (
            is_runtime_call(node)
            or (isinstance(node.func.value, ast.Attribute) and node.func.value.attr == "cuda")
        )
        for node in ast.walk(test)
    )


def _cuda_prefix(node: ast.expr) -> bool:
    return (
        isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and node.value.startswith("cuda:")
    )


#: Names a program keeps its settings under: ``args.device`` is the command line's.
_SETTINGS = frozenset(
    {"args", "opt", "opts", "options", "cfg", "config", "conf", "hparams", "hp", "flags"}
)


def _holds_device(node: ast.expr) -> bool:
    """A device read at run time from outside the source, which may say ``cuda`` where the
    program was written for it: a setting (``args.device``, ``self.cfg.device``,
    ``config["device"]``), the environment (``os.environ.get("DEVICE", ...)``,
    ``os.getenv(...)``) or the command line (``sys.argv[1]``). Not any value named for a
    device: ``x.device`` is a tensor's, and rewriting every ``device=device`` would tax calls
    that CUDA names never reach."""
    if isinstance(node, ast.Attribute):
        return _names_device(node.attr) and _read_from_settings(node.value)
    if isinstance(node, ast.Subscript):
        key, owner = node.slice, node.value
        if isinstance(owner, ast.Attribute) and owner.attr == "argv":
            return True
        return (
            isinstance(key, ast.Constant)
            and isinstance(key.value, str)
            and _names_device(key.value.lower())
        )
    if isinstance(node, ast.Call):
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        named = node.args[0] if node.args else None
        return (
            name in ("get", "getenv")
            and isinstance(named, ast.Constant)
            and isinstance(named.value, str)
            and _names_device(named.value.lower())
        )
    return False


def _read_from_settings(node: ast.expr) -> bool:
    """``args``, ``self.cfg``, ``trainer.config.train``: an object of settings."""
    while isinstance(node, ast.Attribute):
        if node.attr in _SETTINGS:
            return True
        node = node.value
    return isinstance(node, ast.Name) and node.id in _SETTINGS


def _names_device(name: str) -> bool:
    return name.lower().endswith("device") or name == "map_location"


def _names_device_function(name: str) -> bool:
    """``get_device``, ``select_device``, ``get_device_name``: functions that return a device."""
    name = name.lower()
    return name.endswith("device") or name.endswith("device_name")


def _is_device_target(target: ast.expr) -> bool:
    if isinstance(target, ast.Name):
        return _names_device(target.id)
    if isinstance(target, ast.Attribute):
        return _names_device(target.attr)
    return False


def _is_device_option(node: ast.Call) -> bool:
    """``parser.add_argument('--device', default='cuda')``: the default names a device."""
    if not (isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument"):
        return False
    return any(
        isinstance(arg, ast.Constant)
        and isinstance(arg.value, str)
        and _names_device(arg.value.lstrip("-").replace("-", "_"))
        for arg in node.args
    )
