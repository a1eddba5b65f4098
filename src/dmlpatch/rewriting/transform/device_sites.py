"""``device_literal``, ``device_value``, ``cuda_call``, ``pin_memory`` and ``torch_load``
sites: the places where a value names a device, ``x.cuda()``, ``x.pin_memory()``, and
checkpoints that come back on CUDA."""

from __future__ import annotations

import ast
import re
from collections import deque
from collections.abc import Iterator
from typing import Union

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
        """The arguments of a call that name a device: ``torch.device(...)``'s, ``.to(x)``'s
        first, ``add_argument('--device', default=...)``'s default, keywords named for one."""
        func = node.func
        if self._torch_device_function(func):
            self._device_call(node)
        elif isinstance(func, ast.Attribute) and func.attr == "to" and node.args:
            first = node.args[0]
            node.args[0] = self.device_value(first, computed=_holds_device(first))
        elif _is_device_option(node):
            for option in node.keywords:
                if option.arg == "default":
                    option.value = self.device_value(option.value)
        for named in node.keywords:
            if named.arg is not None and _names_device(named.arg):
                named.value = self.device_value(named.value, computed=_holds_device(named.value))

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
