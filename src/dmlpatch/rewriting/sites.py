"""Where code is rewritten: the CUDA device sites of one module's source, found and rerouted.

A *site* is a place where a module hard-codes CUDA. Each one becomes a call into
``dmlpatch.rewriting.runtime`` through the module-level alias ``__dmlpatch__``, keeping the original
expression as the argument so the rewritten code still reads like the original::

    torch.device('cuda' if torch.cuda.is_available() else 'cpu')
    torch.device(__dmlpatch__.device('cuda') if __dmlpatch__.is_available() else 'cpu')

Site kinds:

- ``is_available`` / ``cuda_api``: ``torch.cuda.<f>(...)`` for ``f`` in
  ``runtime.CUDA_FUNCTIONS`` → ``__dmlpatch__.<f>(...)``.
- ``device_literal``: ``'cuda'``, ``'cuda:N'``, ``f'cuda:{i}'``, ``'cuda:%d' % i``,
  ``'cuda:' + str(i)``, ``'cuda:{}'.format(i)`` where the value names a device →
  ``__dmlpatch__.device(<expr>)``. A value names a device as an argument of ``torch.device`` /
  ``torch.set_default_device``, the first argument of ``.to(...)``, a keyword argument whose
  name ends in ``device`` or is ``map_location``, the default of a parameter whose name ends
  in ``device``, the value assigned to a name or attribute ending in ``device``, and the
  ``default=`` of ``add_argument('--device', ...)``, and what a function whose name ends in
  ``device`` or ``device_name`` returns (``get_device()``, ``get_device_name()``). Branches
  of ``a if c else b`` and operands of ``a or b`` in those places count too.
  ``torch.device('cuda', i)`` becomes ``torch.device(__dmlpatch__.device(i))``.
- ``device_literal`` also: a CUDA literal chosen in ``a if c else b`` against another
  device's name or by CUDA's availability (``dev = 'cuda' if torch.cuda.is_available() else
  'cpu'``, ``train(model, 'cuda' if use_gpu else 'cpu')``), and one assigned in an ``if`` whose
  condition asks whether CUDA is available, whatever the names.
- ``device_value``: the computed argument of ``torch.device(x)`` (a name, an attribute, a
  call) → ``torch.device(__dmlpatch__.device(x))``, in a module with other sites: yolov5's
  ``select_device`` ends with ``arg = 'cuda:0'`` ... ``return torch.device(arg)``. Values that do
  not name CUDA pass unchanged; a module whose only sites these are is left as it is.
- ``cuda_call``: ``x.cuda(...)`` → ``__dmlpatch__.cuda(x, ...)``.
- ``torch_load``: ``torch.load(f)`` without ``map_location`` → ``__dmlpatch__.load(torch.load,
  f)``, which maps the storages a CUDA machine saved (``cuda:N``) to the target, as CUDA would
  restore them there; in a module with other sites only, like ``device_value``.
- ``inference_mode``: ``torch.inference_mode`` → ``__dmlpatch__.inference_mode``, which is
  torch's except on DirectML, whose kernels refuse parameters inside it
  (``dmlpatch.rewriting.inference``); with ``from torch import inference_mode``, its calls and
  its use as a bare decorator.
- ``cuda_api``: ``torch.cuda.<name>`` for ``name`` in ``cuda_api.NAMES``
  (``get_device_properties``, memory statistics, ``Stream``, ``Event``, ``device``,
  ``FloatTensor``...), called or not → ``__dmlpatch__.torch_cuda.<name>``; ``from torch.cuda
  import <names>`` naming one of them imports from ``dmlpatch.rewriting.cuda_api`` instead,
  which answers the other names with torch.cuda's.
- ``tensor_type``: in a module that names a legacy type (``torch.cuda.FloatTensor``), every
  ``x.type(T)`` call → ``__dmlpatch__.torch_cuda.retype(x, T)``: ``T`` is often a variable
  (``Tensor = torch.cuda.FloatTensor if cuda else torch.FloatTensor``).
- ``accelerator``: ``torch.accelerator`` (torch >= 2.6's device-agnostic API, which
  torch-directml's torch 2.4.1 lacks) → ``__dmlpatch__.accelerator``
  (``dmlpatch.rewriting.accelerator``); ``from torch import accelerator`` imports that module
  when it is the statement's only name.
- ``complex_literal``: arithmetic (``+ - * /``) between a complex literal and another value
  (``mag * (x + 1j * y)``, ``torch.exp(1j * phase)``), in a module that imports torch →
  ``__dmlpatch__.with_complex('*', 1j, y)``: DirectML has no complex type, so a real DirectML
  tensor meeting a complex number is made a complex tensor of dmlpatch's first
  (``dmlpatch.opfix.complex``); anything else is the plain operation.
- ``amp``: calls of ``torch.autocast``, ``torch.amp.autocast``, ``torch.cuda.amp.autocast``,
  ``torch.amp.GradScaler`` and ``torch.cuda.amp.GradScaler`` (or the same names imported) →
  ``__dmlpatch__.autocast(<callee>, ...)`` / ``__dmlpatch__.grad_scaler(<callee>, ...)``, which
  say once that DirectML runs them in float32 (``dmlpatch.rewriting.amp``).

Other ``torch.cuda.<name>`` uses (``jiterator``, ``nccl``, the caching allocator...) are not
sites: they are *unanswered* (``Rewritten.unanswered``), because once a function's sites say CUDA
is available, code behind them would fail without a CUDA GPU. So the sites of the function that
uses one (and of the functions around it; the module's own code where no function is) go to
``dmlpatch.rewriting.runtime_as_written`` through ``__dmlpatch_kept__`` instead, keeping CUDA's
meaning there (``Rewritten.kept``); the rest of the module is rewritten. Names in
``runtime.HARMLESS_CUDA_NAMES`` behave the same with or without one and are not listed;
``dmlpatch.rewriting.cuda_inventory`` classifies every public ``torch.cuda`` name.

Everything else that says ``cuda`` is left alone on purpose: comparisons
(``x.device.type == 'cuda'``), membership tests, dict keys, messages. Rewriting those would
change what the program *checks*, not where it runs.

New nodes take the location of the expression they replace, so every original statement keeps
its line and column numbers and tracebacks point at the original source.
"""

from __future__ import annotations

import ast
import re
from collections import deque
from collections.abc import Iterator
from typing import Any, NamedTuple, Optional, TypeVar, Union, cast

from dmlpatch.rewriting.cuda_api import LEGACY_TYPE_NAMES, NAMES
from dmlpatch.rewriting.runtime import ALIAS, CUDA_FUNCTIONS, HARMLESS_CUDA_NAMES, KEPT_ALIAS

_CUDA_LITERAL = re.compile(r"cuda(:\d+)?")
#: Functions of ``torch`` whose first argument (or ``type=``) is a device.
_TORCH_DEVICE_FUNCTIONS = frozenset({"device", "set_default_device"})
_RUNTIME_MODULE = "dmlpatch.rewriting.runtime"
_AS_WRITTEN_MODULE = "dmlpatch.rewriting.runtime_as_written"
#: ``from torch.cuda.random import get_rng_state``: imported from ``cuda_api`` instead.
_ANSWERED_SUBMODULE = "torch.cuda.random"
_CUDA_API_MODULE = "dmlpatch.rewriting.cuda_api"
#: Callees of the ``amp`` sites, by the runtime function that takes them.
_AMP = {"autocast": "autocast", "GradScaler": "grad_scaler"}
_Node = TypeVar("_Node", bound=ast.AST)
#: Site kinds rewritten only in a module with other sites.
_ONLY_BESIDE_CUDA = frozenset({"device_value", "torch_load"})


class Site(NamedTuple):
    """One rewritten place: where it starts (1-based line, UTF-8 byte column), what it is."""

    line: int
    col: int
    kind: str
    text: str


class Rewritten(NamedTuple):
    """The rewritten tree (the unchanged parse when there are no sites), its sites, the
    ``torch.cuda`` names it uses that the runtime does not answer (sorted, without repeats),
    and the functions that keep CUDA's meaning because they use them: ``(qualified name or
    '<module>', names)`` for each one that has sites."""

    tree: ast.Module
    sites: list[Site]
    unanswered: tuple[str, ...] = ()
    kept: tuple[tuple[str, tuple[str, ...]], ...] = ()


def find_sites(source: Union[str, bytes], filename: str = "<unknown>") -> list[Site]:
    """The CUDA device sites of ``source``, in source order; nothing is compiled."""
    return rewrite(source, filename).sites


def rewrite(
    source: Union[str, bytes], filename: str = "<unknown>", runtime: str = _RUNTIME_MODULE
) -> Rewritten:
    """Parse ``source`` and reroute its CUDA device sites to ``runtime`` (imported as
    ``__dmlpatch__``); raises ``SyntaxError`` like compile."""
    tree = ast.parse(source, filename)
    # Another runtime keeps CUDA's meaning: its modules import torch.cuda's names as written.
    answers = _CUDA_API_MODULE if runtime == _RUNTIME_MODULE else None
    transformer = _Transformer(_Names.of(tree), _Lines(source), answers)
    transformer.transform(tree)
    sites = sorted(transformer.sites, key=lambda site: (site.line, site.col))
    if sites and all(site.kind in _ONLY_BESIDE_CUDA for site in sites):
        # torch.device(x) and torch.load(f) alone are device-agnostic code (scipy,
        # torchvision): only a module that hard-codes CUDA somewhere can hand x a CUDA value
        # of its own making, or expect f's tensors back on CUDA.
        return Rewritten(ast.parse(source, filename), [], tuple(sorted(transformer.unanswered)))
    kept: list[tuple[str, tuple[str, ...]]] = []
    if runtime == _RUNTIME_MODULE:
        kept = transformer.keep_tainted(tree)
    if sites and (not kept or _uses_alias(tree, ALIAS)):
        _insert_runtime_import(tree, runtime, ALIAS)
    if kept:
        _insert_runtime_import(tree, _AS_WRITTEN_MODULE, KEPT_ALIAS)
    return Rewritten(tree, sites, tuple(sorted(transformer.unanswered)), tuple(kept))


class _Names:
    """What the module's imports bind: ``torch``, ``torch.cuda``, its functions, ``torch.device``.

    Scopes are not tracked: a module that rebinds ``torch`` to something else is not worth the
    complexity, and the runtime returns non-CUDA values unchanged anyway. (A plain class: the
    runner rewrites every main script, and dataclasses costs ~6 ms to import.)
    """

    def __init__(self) -> None:
        self.torch: set[str] = {"torch"}
        self.cuda: set[str] = set()
        self.cuda_functions: dict[str, str] = {}
        self.torch_functions: dict[str, str] = {}
        self.inference_mode: set[str] = set()
        #: Bound names of ``torch.amp`` / ``torch.cuda.amp`` and of their autocast/GradScaler.
        self.amp_modules: set[str] = set()
        self.amp_callees: dict[str, str] = {}
        #: Names bound by ``from torch.cuda import X`` (or ``from torch.cuda.X import ...``)
        #: for an unanswered X, and that X: where they are used, CUDA's meaning is kept.
        self.unanswered: dict[str, str] = {}
        #: Whether the module imports torch (or a submodule): complex literals are sites then.
        self.imports_torch = False

    @classmethod
    def of(cls, tree: ast.Module) -> _Names:
        names = cls()
        for node in _statements(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    names.imports_torch |= alias.name.split(".")[0] == "torch"
                    if alias.name == "torch" or (
                        alias.name.startswith("torch.") and alias.asname is None
                    ):
                        names.torch.add(alias.asname or "torch")
                    elif alias.name == "torch.cuda":
                        names.cuda.add(alias.asname or "cuda")
                    if alias.name in ("torch.amp", "torch.cuda.amp") and alias.asname:
                        names.amp_modules.add(alias.asname)
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names.imports_torch |= (node.module or "").split(".")[0] == "torch"
                for alias in node.names:
                    bound = alias.asname or alias.name
                    if node.module == "torch" and alias.name == "cuda":
                        names.cuda.add(bound)
                    elif node.module == "torch" and alias.name in _TORCH_DEVICE_FUNCTIONS:
                        names.torch_functions[bound] = alias.name
                    elif node.module == "torch" and alias.name == "inference_mode":
                        names.inference_mode.add(bound)
                    elif node.module in ("torch", "torch.cuda") and alias.name == "amp":
                        names.amp_modules.add(bound)
                    elif node.module in _AMP_MODULES and alias.name in _AMP:
                        names.amp_callees[bound] = _AMP[alias.name]
                    elif node.module == "torch.cuda" and alias.name in CUDA_FUNCTIONS:
                        names.cuda_functions[bound] = alias.name
                    elif node.module == "torch.cuda" and _unanswered(alias.name):
                        names.unanswered[bound] = alias.name
                if node.module and node.module.startswith("torch.cuda."):
                    # torch.cuda.random's names are answered under their submodule's
                    # (cuda_api holds them all); nvtx's are answered only as torch.cuda.nvtx.
                    submodule = node.module.split(".")[2]
                    if node.module != _ANSWERED_SUBMODULE and (
                        _unanswered(submodule) or submodule in NAMES
                    ):
                        for alias in node.names:
                            names.unanswered[alias.asname or alias.name] = submodule
        return names


#: What holds statements; expressions hold none, so imports are found without walking them.
_BLOCKS = tuple(
    getattr(ast, name) for name in ("stmt", "excepthandler", "match_case") if hasattr(ast, name)
)


def _statements(tree: ast.Module) -> Iterator[ast.AST]:
    """The statements of ``tree`` (and what holds them) in ``ast.walk``'s order."""
    queue: deque[ast.AST] = deque([tree])
    while queue:
        node = queue.popleft()
        yield node
        for field in node._fields:
            value = getattr(node, field, None)
            if isinstance(value, list):
                queue.extend(item for item in value if isinstance(item, _BLOCKS))


class _Lines:
    """Source text by line, for the ``text`` of a site (AST columns count UTF-8 bytes)."""

    def __init__(self, source: Union[str, bytes]) -> None:
        if isinstance(source, bytes):
            # decode_source honours the coding cookie and translates newlines like the parser.
            from importlib.util import decode_source

            text = decode_source(source)
        else:
            text = source.replace("\r\n", "\n").replace("\r", "\n")
        self._lines = [line.encode("utf-8") for line in text.split("\n")]

    def segment(self, node: Union[ast.expr, ast.stmt]) -> str:
        first, last = node.lineno - 1, (node.end_lineno or node.lineno) - 1
        end_col = node.end_col_offset if node.end_col_offset is not None else None
        if first == last:
            return self._lines[first][node.col_offset : end_col].decode("utf-8", "replace")
        parts = [self._lines[first][node.col_offset :], *self._lines[first + 1 : last]]
        parts.append(self._lines[last][:end_col])
        return b"\n".join(parts).decode("utf-8", "replace")


class _Transformer:
    """Visits every node after its children, like ``ast.NodeTransformer``, but without recursion.

    The parser accepts expressions nested deeper than Python's recursion limit allows a
    recursive visitor to follow (sympy's generated ``resolvent_lookup.py`` nests polynomials
    ~570 levels deep), and the rewriter must never fail on a file that compiles.
    """

    def __init__(self, names: _Names, lines: _Lines, cuda_api: Optional[str]) -> None:
        self.names = names
        self.lines = lines
        self.cuda_api = cuda_api
        self.sites: list[Site] = []
        self.unanswered: set[str] = set()
        #: The scope of the node being visited, and the functions (by id; 0: the module's own
        #: code) that use an unanswered name, with their scope and those names.
        self.scope = _Scope(None, None, "")
        self.tainted: dict[int, tuple[_Scope, set[str]]] = {}
        #: Whether the module names a legacy CUDA tensor type, and its ``x.type(T)`` calls.
        self.legacy_types = False
        self.type_calls: list[ast.Call] = []

    def transform(self, tree: ast.Module) -> None:
        """Call ``visit_<Type>`` on each node, children first; put what it returns in its place."""
        visitors = {
            getattr(ast, name[len("visit_") :]): getattr(self, name)
            for name in dir(self)
            if name.startswith("visit_")
        }
        root = self.scope
        stack: list[tuple[_Entry, _Scope]] = [((tree, tree, "", None, False), root)]
        bound = self.names.unanswered
        while stack:
            entry, scope = stack.pop()
            node, parent, field, index, children_done = entry
            if not children_done:
                stack.append(((node, parent, field, index, True), scope))
                inner = _Scope.of(node, scope)
                if bound:
                    for child in ast.iter_child_nodes(node):
                        if isinstance(child, ast.Name) and child.id in bound:
                            self._unanswered_use(bound[child.id], inner)
                stack += [(child, inner) for child in _children(node)]
                continue
            self.scope = scope
            visitor = visitors.get(type(node))
            replacement = visitor(node) if visitor is not None else node
            if replacement is node:
                continue
            if index is None:
                setattr(parent, field, replacement)
            else:
                getattr(parent, field)[index] = replacement
        if self.legacy_types:
            for call in self.type_calls:
                self._retype(call)

    # -- calls --------------------------------------------------------------------------------

    def visit_Attribute(self, node: ast.Attribute) -> ast.expr:
        """``torch.inference_mode`` and the answered ``torch.cuda.<name>`` are rerouted; other
        ``torch.cuda`` names that fail without CUDA are noted and left as they are."""
        owner = node.value
        if (
            node.attr in ("inference_mode", "accelerator")
            and isinstance(owner, ast.Name)
            and owner.id in self.names.torch
            and isinstance(node.ctx, ast.Load)
        ):
            if node.attr == "accelerator":
                self._site(node, "accelerator")
                return _located(_alias("accelerator"), node)
            return self._inference_mode(node)
        of_cuda = (
            isinstance(owner, ast.Attribute)
            and owner.attr == "cuda"
            and isinstance(owner.value, ast.Name)
            and owner.value.id in self.names.torch
        ) or (isinstance(owner, ast.Name) and owner.id in self.names.cuda)
        if of_cuda and node.attr in NAMES and isinstance(node.ctx, ast.Load):
            self.legacy_types |= node.attr in LEGACY_TYPE_NAMES
            self._site(node, "cuda_api")
            routed = ast.Attribute(_alias("torch_cuda"), node.attr, ast.Load())
            return _located(routed, node)
        if of_cuda and _unanswered(node.attr):
            self._unanswered_use(node.attr, self.scope)
        return node

    # -- first do no harm, per function -------------------------------------------------------

    def _unanswered_use(self, name: str, scope: _Scope) -> None:
        """``name`` (a torch.cuda name the runtime does not answer) is used in ``scope``: the
        innermost function around it, and the functions around that, keep CUDA's meaning (the
        module's own code where no function is around it)."""
        self.unanswered.add(name)
        functions = [s for s in scope.chain() if s.is_function]
        owners: list[Optional[_Scope]] = [*functions] or [None]
        for function in owners:
            key = id(function.node) if function is not None else 0
            held = self.tainted.setdefault(key, (function or _Scope(None, None, ""), set()))
            held[1].add(name)

    def keep_tainted(self, tree: ast.Module) -> list[tuple[str, tuple[str, ...]]]:
        """Route the sites of every tainted function (innermost first) to the runtime that
        keeps CUDA's meaning; the functions that had sites, with the names that kept them."""
        kept: list[tuple[str, tuple[str, ...]]] = []
        order = sorted(self.tainted.values(), key=lambda held: -held[0].depth())
        for scope, names in order:
            uses = tuple(sorted(names))
            name = scope.name or "<module>"
            if scope.node is None:
                count = _keep(_module_code(tree), name, uses, imports=False)
            else:
                count = _keep(ast.walk(scope.node), name, uses, imports=True)
            if count:
                kept.append((name, uses))
        return sorted(kept)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> ast.AST:
        """``from torch.cuda import Event``: from ``cuda_api``, which has torch.cuda's others."""
        if (
            node.module == "torch"
            and node.level == 0
            and [alias.name for alias in node.names] == ["accelerator"]
        ):
            self._site(node, "accelerator")
            node.module = "dmlpatch.rewriting" if self.cuda_api else node.module
        if node.module == _ANSWERED_SUBMODULE and node.level == 0:
            self._site(node, "cuda_api")
            node.module = self.cuda_api or node.module
        if node.module == "torch.cuda" and node.level == 0:
            answered = [alias.name for alias in node.names if alias.name in NAMES]
            if answered:
                self.legacy_types |= any(name in LEGACY_TYPE_NAMES for name in answered)
                self._site(node, "cuda_api")
                node.module = self.cuda_api or node.module
        return node

    def visit_Call(self, node: ast.Call) -> ast.expr:
        func = node.func
        if isinstance(func, ast.Name) and func.id in self.names.inference_mode:
            node.func = self._inference_mode(func)
            return node
        amp = self._amp_callee(func)
        if amp is not None:
            self._site(node, "amp")
            node.args = [func, *node.args]
            node.func = _located(_alias(amp), func)
            return node
        if (
            isinstance(func, ast.Attribute)
            and func.attr == "type"
            and self._is_object(func.value)
            and len(node.args) + len(node.keywords) >= 1
            and not any(isinstance(arg, ast.Starred) for arg in node.args)
        ):
            self.type_calls.append(node)
        if self._is_torch_load(node):
            self._site(node, "torch_load")
            node.args = [func, *node.args]
            node.func = _located(_alias("load"), func)
            return node
        function = self._cuda_function(func)
        if function is not None:
            self._site(node, "is_available" if function == "is_available" else "cuda_api")
            node.func = _located(_alias(function), func)
            return node
        if isinstance(func, ast.Attribute) and func.attr == "cuda" and self._is_object(func.value):
            self._site(node, "cuda_call")
            callee = _located(_alias("cuda"), func)
            call = _located(ast.Call(callee, [func.value, *node.args], node.keywords), node)
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
        if self._torch_device_function(func):
            self._device_call(node)
        elif isinstance(func, ast.Attribute) and func.attr == "to" and node.args:
            node.args[0] = self._device_value(node.args[0])
        elif _is_device_option(node):
            for keyword in node.keywords:
                if keyword.arg == "default":
                    keyword.value = self._device_value(keyword.value)
        for keyword in node.keywords:
            if keyword.arg is not None and _names_device(keyword.arg):
                keyword.value = self._device_value(keyword.value)
        return node

    def _is_torch_load(self, node: ast.Call) -> bool:
        """``torch.load(f)`` with no ``map_location``: a checkpoint saved on a GPU comes back
        on CUDA (``Attempting to deserialize object on a CUDA device``)."""
        func = node.func
        return (
            isinstance(func, ast.Attribute)
            and func.attr == "load"
            and isinstance(func.value, ast.Name)
            and func.value.id in self.names.torch
            and len(node.args) == 1
            and not isinstance(node.args[0], ast.Starred)
            and all(k.arg not in (None, "map_location") for k in node.keywords)
        )

    def _device_call(self, node: ast.Call) -> None:
        """``torch.device(...)``: the type argument names a device; ``('cuda', i)`` keeps ``i``."""
        type_keyword = _keyword(node, "type")
        index_keyword = _keyword(node, "index")
        kind = node.args[0] if node.args else (type_keyword.value if type_keyword else None)
        index = node.args[1] if len(node.args) > 1 else None
        if index is None and index_keyword is not None:
            index = index_keyword.value
        if kind is None:
            return
        if index is not None:
            if isinstance(kind, ast.Constant) and kind.value == "cuda":
                # torch.device('privateuseone:0', i) is an error, so route the ordinal alone.
                self._site(node, "device_literal")
                node.args = [_runtime_call("device", [index], kind)]
                node.keywords = [k for k in node.keywords if k.arg not in ("type", "index")]
            return
        if node.args:
            node.args[0] = self._device_value(node.args[0], computed=True)
        elif type_keyword is not None:
            type_keyword.value = self._device_value(type_keyword.value, computed=True)

    # -- definitions and assignments ----------------------------------------------------------

    def visit_BinOp(self, node: ast.BinOp) -> ast.expr:
        """``x * 1j``: see ``complex_literal`` in the module docstring."""
        symbol = _COMPLEX_OPERATORS.get(type(node.op))
        if symbol is None or not self.names.imports_torch:
            return node
        if not (_complex_literal(node.left) or _complex_literal(node.right)):
            return node
        if _number(node.left) and _number(node.right):
            return node  # 3.14 + 2.71j is a Python number, folded into one constant
        self._site(node, "complex_literal")
        args = [_located(ast.Constant(symbol), node), node.left, node.right]
        return _runtime_call("with_complex", args, node)

    def visit_IfExp(self, node: ast.IfExp) -> ast.expr:
        """``'cuda' if c else 'cpu'``: a CUDA literal chosen against another device's name, or
        by CUDA's availability, is a device wherever the value goes (``dev = ...``, an
        argument of the program's own function)."""
        branches = (node.body, node.orelse)
        if any(_says_cuda(branch) for branch in branches) and (
            any(_names_another_device(branch) for branch in branches) or _asks_cuda(node.test)
        ):
            node.body = self._device_value(node.body)
            node.orelse = self._device_value(node.orelse)
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
            return self._device_value(node)
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            node.elts = [self._device_value(e) if _says_cuda(e) else e for e in node.elts]
        return node

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        self._defaults(node.args)
        self._decorators(node.decorator_list)
        self._returns(node)
        return node

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> ast.AST:
        self._defaults(node.args)
        self._decorators(node.decorator_list)
        self._returns(node)
        return node

    def _returns(self, node: Union[ast.FunctionDef, ast.AsyncFunctionDef]) -> None:
        """``def get_device_name(): ... return f'cuda:{rank}'``: what a function named for a
        device returns names one (its nested functions are their own). A name that only
        mentions a device (scipy's ``xp_device_type`` classifies arrays: ``return "cuda"`` for
        CuPy's) is not such a function."""
        if not _names_device_function(node.name):
            return
        for statement in _own_statements(node):
            if isinstance(statement, ast.Return) and statement.value is not None:
                statement.value = self._device_value(statement.value)

    def _decorators(self, decorators: list[ast.expr]) -> None:
        """``@inference_mode`` imported from torch, bare (a call is found as a call)."""
        for index, decorator in enumerate(decorators):
            if isinstance(decorator, ast.Name) and decorator.id in self.names.inference_mode:
                decorators[index] = self._inference_mode(decorator)

    def _inference_mode(self, node: ast.expr) -> ast.expr:
        self._site(node, "inference_mode")
        return _located(_alias("inference_mode"), node)

    def visit_Lambda(self, node: ast.Lambda) -> ast.AST:
        self._defaults(node.args)
        return node

    def _defaults(self, args: ast.arguments) -> None:
        positional = [*args.posonlyargs, *args.args]
        offset = len(positional) - len(args.defaults)
        for i, default in enumerate(args.defaults):
            if _names_device(positional[offset + i].arg):
                args.defaults[i] = self._device_value(default)
        for i, (arg, kw_default) in enumerate(zip(args.kwonlyargs, args.kw_defaults)):
            if kw_default is not None and _names_device(arg.arg):
                args.kw_defaults[i] = self._device_value(kw_default)

    def visit_Assign(self, node: ast.Assign) -> ast.AST:
        if any(_is_device_target(target) for target in node.targets):
            node.value = self._device_value(node.value)
        return node

    def visit_AnnAssign(self, node: ast.AnnAssign) -> ast.AST:
        if node.value is not None and _is_device_target(node.target):
            node.value = self._device_value(node.value)
        return node

    # -- helpers ------------------------------------------------------------------------------

    def _device_value(self, node: ast.expr, computed: bool = False) -> ast.expr:
        """Wrap ``node`` (or the branches of ``a if c else b`` / ``a or b``) if it says CUDA;
        with ``computed``, also a value only known at run time (a name, a call...)."""
        if isinstance(node, ast.IfExp):
            node.body = self._device_value(node.body, computed)
            node.orelse = self._device_value(node.orelse, computed)
            return node
        if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or):
            node.values = [self._device_value(value, computed) for value in node.values]
            return node
        if _says_cuda(node):
            self._site(node, "device_literal")
            return _runtime_call("device", [node], node)
        if (
            computed
            and not isinstance(node, (ast.Constant, ast.JoinedStr))
            and not (_is_runtime_call(node))
        ):
            self._site(node, "device_value")
            return _runtime_call("device", [node], node)
        return node

    def _cuda_function(self, func: ast.expr) -> Optional[str]:
        """``torch.cuda.<f>`` (or an imported alias of it) for a routed ``f``, else None."""
        if isinstance(func, ast.Name):
            return self.names.cuda_functions.get(func.id)
        if not isinstance(func, ast.Attribute) or func.attr not in CUDA_FUNCTIONS:
            return None
        owner = func.value
        if isinstance(owner, ast.Name) and owner.id in self.names.cuda:
            return func.attr
        if (
            isinstance(owner, ast.Attribute)
            and owner.attr == "cuda"
            and isinstance(owner.value, ast.Name)
            and owner.value.id in self.names.torch
        ):
            return func.attr
        return None

    def _amp_callee(self, func: ast.expr) -> Optional[str]:
        """The runtime function for a call of autocast or GradScaler, else None."""
        if isinstance(func, ast.Name):
            return self.names.amp_callees.get(func.id)
        if not isinstance(func, ast.Attribute) or func.attr not in _AMP:
            return None
        owner = func.value
        if isinstance(owner, ast.Name):
            is_amp = owner.id in self.names.amp_modules or owner.id in self.names.torch
        else:
            is_amp = _dotted(owner, self.names.torch) in ("amp", "cuda.amp") or (
                isinstance(owner, ast.Attribute)
                and owner.attr == "amp"
                and isinstance(owner.value, ast.Name)
                and owner.value.id in self.names.cuda
            )
        return _AMP[func.attr] if is_amp else None

    def _retype(self, call: ast.Call) -> None:
        """``x.type(T)`` → ``__dmlpatch__.torch_cuda.retype(x, T)``, in place."""
        func = call.func
        assert isinstance(func, ast.Attribute)
        self._site(call, "tensor_type")
        call.args = [func.value, *call.args]
        routed = ast.Attribute(_alias("torch_cuda"), "retype", ast.Load())
        call.func = _located(routed, func)

    def _torch_device_function(self, func: ast.expr) -> bool:
        if isinstance(func, ast.Name):
            return func.id in self.names.torch_functions
        return (
            isinstance(func, ast.Attribute)
            and func.attr in _TORCH_DEVICE_FUNCTIONS
            and isinstance(func.value, ast.Name)
            and func.value.id in self.names.torch
        )

    def _is_object(self, node: ast.expr) -> bool:
        """Not ``torch`` nor a class under it (``torch.Tensor.cuda(x)`` is unbound), nor us."""
        while isinstance(node, ast.Attribute):
            node = node.value
        return not (
            isinstance(node, ast.Name)
            and (node.id in self.names.torch or node.id in (ALIAS, KEPT_ALIAS))
        )

    def _site(self, node: Union[ast.expr, ast.stmt], kind: str) -> None:
        self.sites.append(Site(node.lineno, node.col_offset, kind, self.lines.segment(node)))


#: A node on the walk's stack: the node, its parent, the parent's field (and list index) that
#: holds it, and whether its children are done.
_Entry = tuple[ast.AST, ast.AST, str, Optional[int], bool]

_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


class _Scope:
    """A function or class around a node (the module's own code: ``node`` None), named by the
    dotted names of the definitions around it."""

    __slots__ = ("is_function", "name", "node", "outer")

    def __init__(self, node: Optional[ast.AST], outer: Optional[_Scope], name: str) -> None:
        self.node = node
        self.outer = outer
        self.name = name
        self.is_function = isinstance(node, _FUNCTIONS)

    @classmethod
    def of(cls, node: ast.AST, outer: _Scope) -> _Scope:
        """The scope of ``node``'s children."""
        if not isinstance(node, (*_FUNCTIONS, ast.ClassDef)):
            return outer
        own = "<lambda>" if isinstance(node, ast.Lambda) else node.name
        return cls(node, outer, f"{outer.name}.{own}" if outer.name else own)

    def chain(self) -> Iterator[_Scope]:
        scope: Optional[_Scope] = self
        while scope is not None:
            yield scope
            scope = scope.outer

    def depth(self) -> int:
        return sum(1 for _ in self.chain())


def _module_code(tree: ast.Module) -> Iterator[ast.AST]:
    """Every node of the module's own code (class bodies included), no function's."""
    queue: deque[ast.AST] = deque([tree])
    while queue:
        node = queue.popleft()
        yield node
        queue.extend(c for c in ast.iter_child_nodes(node) if not isinstance(c, _FUNCTIONS))


def _keep(nodes: Iterator[ast.AST], scope: str, uses: tuple[str, ...], imports: bool) -> int:
    """Point the runtime calls among ``nodes`` at the runtime that keeps CUDA's meaning; its
    ``is_available()`` is told the scope and the names, to say why in one line. Imports of
    ``cuda_api``'s answers go back to ``torch.cuda`` (with ``imports``). Returns how many
    runtime references there are, rerouted here or before (by an inner function)."""
    count = 0
    for node in nodes:
        if isinstance(node, ast.Name) and node.id in (ALIAS, KEPT_ALIAS):
            count += 1
            node.id = KEPT_ALIAS
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "is_available"
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == ALIAS
            and not node.keywords
        ):
            node.keywords = [
                _located(ast.keyword("scope", ast.Constant(scope)), node),
                # A tuple of constants is a constant to the compiler; typeshed lists scalars only.
                _located(ast.keyword("uses", ast.Constant(cast(Any, uses))), node),
            ]
        elif imports and isinstance(node, ast.ImportFrom) and node.level == 0:
            if node.module == _CUDA_API_MODULE:
                node.module = "torch.cuda"
            elif node.module == "dmlpatch.rewriting":
                node.module = "torch"
    return count


def _uses_alias(tree: ast.Module, alias: str) -> bool:
    return any(isinstance(node, ast.Name) and node.id == alias for node in ast.walk(tree))


#: Nodes the walk need not enter (most of a tree): no visitor, nor any inside them.
_LEAVES = frozenset(
    {
        ast.Name,
        ast.Constant,
        ast.alias,
        *ast.expr_context.__subclasses__(),
        *ast.operator.__subclasses__(),
        *ast.boolop.__subclasses__(),
        *ast.unaryop.__subclasses__(),
        *ast.cmpop.__subclasses__(),
    }
)


def _children(node: ast.AST) -> list[_Entry]:
    """Stack entries for the children of ``node``, last first: the walk visits the first first."""
    entries: list[_Entry] = []
    for field in node._fields:
        value = getattr(node, field, None)
        if isinstance(value, list):
            for index, item in enumerate(value):
                if isinstance(item, ast.AST) and type(item) not in _LEAVES:
                    entries.append((item, node, field, index, False))
        elif isinstance(value, ast.AST) and type(value) not in _LEAVES:
            entries.append((value, node, field, None, False))
    entries.reverse()
    return entries


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
                queue.extend(item for item in value if isinstance(item, _BLOCKS))


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


#: Other devices a program chooses between with CUDA.
_OTHER_DEVICE = re.compile(r"(cpu|mps|xpu|privateuseone)(:\d+)?")


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
            _is_runtime_call(node)
            or (isinstance(node.func.value, ast.Attribute) and node.func.value.attr == "cuda")
        )
        for node in ast.walk(test)
    )


def _is_runtime_call(node: ast.expr) -> bool:
    """``__dmlpatch__.<name>(...)``: rewritten already (rewriting twice changes nothing)."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id in (ALIAS, KEPT_ALIAS)
    )


def _cuda_prefix(node: ast.expr) -> bool:
    return (
        isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and node.value.startswith("cuda:")
    )


def _unanswered(name: str) -> bool:
    """A ``torch.cuda`` name that fails without a CUDA GPU and that the runtime does not route."""
    return (
        name not in CUDA_FUNCTIONS
        and name not in NAMES
        and name not in HARMLESS_CUDA_NAMES
        and name != "*"
    )


#: Modules whose autocast / GradScaler the ``amp`` sites take.
_AMP_MODULES = frozenset({"torch", "torch.amp", "torch.cuda.amp"})


def _dotted(node: ast.expr, torch_names: set[str]) -> Optional[str]:
    """``torch.a.b`` (``torch`` under any of its bound names) as ``"a.b"``; else None."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name) and node.id in torch_names and parts:
        return ".".join(reversed(parts))
    return None


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


_COMPLEX_OPERATORS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}


def _complex_literal(node: ast.expr) -> bool:
    """``1j``, ``-2.5j``."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        node = node.operand
    return isinstance(node, ast.Constant) and isinstance(node.value, complex)


def _number(node: ast.expr) -> bool:
    """A numeric literal, signed or not (``3``, ``-2.5``, ``1j``)."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        node = node.operand
    return (
        isinstance(node, ast.Constant)
        and isinstance(node.value, (int, float, complex))
        and not isinstance(node.value, bool)
    )


def _keyword(node: ast.Call, name: str) -> Optional[ast.keyword]:
    return next((keyword for keyword in node.keywords if keyword.arg == name), None)


def _alias(name: str) -> ast.Attribute:
    return ast.Attribute(ast.Name(ALIAS, ast.Load()), name, ast.Load())


def _runtime_call(name: str, args: list[ast.expr], like: ast.expr) -> ast.Call:
    """``__dmlpatch__.<name>(*args)`` in the place of ``like``, its callee on ``like``'s first line.

    CPython reports a call through an attribute that spans lines at the attribute's last
    line: a callee spanning a multi-line literal would move the call, and the traceback line,
    to the literal's closing line.
    """
    callee = _located(_alias(name), like)
    for part in (callee, callee.value):
        part.end_lineno, part.end_col_offset = part.lineno, part.col_offset
    return _located(ast.Call(callee, args, []), like)


def _located(node: _Node, like: ast.AST) -> _Node:
    """Give ``node`` and its new descendants the location of ``like``; kept nodes keep theirs."""
    for child in ast.walk(node):
        if "lineno" in child._attributes and getattr(child, "lineno", None) is None:
            ast.copy_location(child, like)
    return node


def _insert_runtime_import(tree: ast.Module, runtime: str, alias: str) -> None:
    """``import <runtime> as <alias>`` after the docstring and ``__future__``."""
    body = tree.body
    index = 0
    first = body[0] if body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
        index = 1 if isinstance(first.value.value, str) else 0
    while index < len(body):
        statement = body[index]
        if not (isinstance(statement, ast.ImportFrom) and statement.module == "__future__"):
            break
        index += 1
    # The import borrows the line of the statement it precedes: it has no line of its own.
    anchor = body[min(index, len(body) - 1)]
    statement = ast.Import([ast.alias(runtime, alias)])
    body.insert(index, _located(statement, anchor))
