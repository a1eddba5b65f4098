"""The rewriter cannot break code: this environment's site-packages, and generated programs.

Each ``.py`` file under the interpreter's purelib (torch, torchvision, numpy, the target
libraries, ...) that may hold a site goes through what the import hook does with a target:
``rewrite`` then ``compile`` of the tree. The others (nine in ten: no ``cuda``, no
``inference_mode``) cannot break, because the hook hands them to the normal compiler untouched
(``rules.may_have_sites``); they are counted, not compiled. Files the normal compiler rejects
(another Python's syntax) are counted and skipped. For the rest:

- the rewritten tree compiles;
- without sites, the code is identical to the normal compiler's (see ``code_difference``);
- with sites, lines are kept (see ``line_problems``).

The figures are printed in the terminal summary (``record_property("terminal_summary", ...)``).
Nothing is written or cached: every run rewrites every file again, two processes at a time.

Then hypothesis composes programs from the idioms the rewriter handles and from look-alikes
that must stay as they are, and checks the same properties, where each site's value goes when
the programs run, and that rewriting twice changes nothing more.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import multiprocessing
import sysconfig
import time
import types
from collections import Counter
from collections.abc import Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, Callable, NamedTuple, Optional

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corpus._harness import accelerator
from dmlpatch.devices import resolution
from dmlpatch.rewriting.rules import may_have_sites
from dmlpatch.rewriting.transform import Rewritten, rewrite
from dmlpatch.runtime.sites import ALIAS, KEPT_ALIAS

PURELIB = Path(sysconfig.get_paths()["purelib"])

#: "Identical" code objects: every field that marshal writes into a ``.pyc`` (so what an import
#: would load), compared field by field and recursively through the constants. marshal's bytes
#: themselves cannot be compared: they mark objects referenced more than once, which depends on
#: reference counts, not on the code. ``co_linetable`` (``co_lnotab`` before 3.10) and
#: ``co_firstlineno`` determine ``co_lines()`` and ``co_positions()``, so comparing them compares
#: every instruction's line and column range too.
_CODE_FIELDS = tuple(
    name
    for name in (
        "co_argcount",
        "co_posonlyargcount",
        "co_kwonlyargcount",
        "co_nlocals",
        "co_stacksize",
        "co_flags",
        "co_code",
        "co_names",
        "co_varnames",
        "co_cellvars",
        "co_freevars",
        "co_filename",
        "co_name",
        "co_qualname",
        "co_firstlineno",
        "co_linetable" if hasattr(types.CodeType, "co_linetable") else "co_lnotab",
        "co_exceptiontable",
    )
    if hasattr(types.CodeType, name)
)


class Outcome(NamedTuple):
    """What happened to one file."""

    path: str
    compiles: bool  # with the normal compiler; False files are skipped
    site_kinds: tuple[str, ...]
    problems: tuple[str, ...]
    seconds: float = 0.0  # CPU time spent on the file


def check_file(path: str) -> Outcome:
    """``_check_file``, timed: the summary reports CPU seconds, which other load cannot skew."""
    started = time.process_time()
    outcome = _check_file(path)
    return outcome._replace(seconds=time.process_time() - started)


def _check_file(path: str) -> Outcome:
    """Rewrite and compile ``path`` the way the import hook does, and check the result."""
    source = Path(path).read_bytes()
    try:
        expected = compile(source, path, "exec", dont_inherit=True)
    except Exception:  # SyntaxError, ValueError (NUL bytes), RecursionError: not ours to judge
        return Outcome(path, False, (), ())
    try:
        result = rewrite(source, path)
        code = compile(result.tree, path, "exec", dont_inherit=True)
    except Exception as error:
        failure = f"rewriting failed: {type(error).__name__}: {error}"
        return Outcome(path, True, (), (failure,))
    kinds = tuple(site.kind for site in result.sites)
    if not result.sites:
        difference = code_difference(expected, code)
        problems = () if difference is None else (f"no sites, yet {difference}",)
        return Outcome(path, True, kinds, problems)
    return Outcome(path, True, kinds, tuple(line_problems(source, result, expected, code)))


# -- identical code ---------------------------------------------------------------------------


def code_difference(expected: types.CodeType, actual: types.CodeType) -> Optional[str]:
    """Where ``actual`` first differs from ``expected`` (None: identical), for the message."""
    for field in _CODE_FIELDS:
        if getattr(expected, field) != getattr(actual, field):
            return f"{_qualname(expected)}: {field} differs"
    if len(expected.co_consts) != len(actual.co_consts):
        return f"{_qualname(expected)}: co_consts differ"
    for before, after in zip(expected.co_consts, actual.co_consts):
        if isinstance(before, types.CodeType) and isinstance(after, types.CodeType):
            difference = code_difference(before, after)
            if difference is not None:
                return difference
        elif _constant_key(before) != _constant_key(after):
            return f"{_qualname(expected)}: constant {before!r} became {after!r}"
    return None


def _constant_key(value: object) -> object:
    """Equal for the same constant only: ``1``, ``1.0``, ``True``, ``0.0`` and ``-0.0`` differ."""
    if isinstance(value, types.CodeType):
        return ("code", id(value))  # compared field by field by the caller
    if isinstance(value, tuple):
        return ("tuple", tuple(_constant_key(item) for item in value))
    if isinstance(value, frozenset):
        return ("frozenset", frozenset(_constant_key(item) for item in value))
    return (type(value), repr(value))


def _qualname(code: types.CodeType) -> str:
    return getattr(code, "co_qualname", code.co_name)


# -- kept lines -------------------------------------------------------------------------------


def line_problems(
    source: bytes, result: Rewritten, expected: types.CodeType, code: types.CodeType
) -> Iterator[str]:
    """How the rewritten file fails to keep the original's lines (nothing: it keeps them).

    - Every statement keeps its exact start and end (line and column): tracebacks, ``inspect``
      and coverage see the same statements.
    - The code objects (module, classes, functions, lambdas, comprehensions) are the same ones,
      in the same order, each starting on the same line.
    - Within each, every line the original's instructions map to is still mapped to (a
      breakpoint or a traceback can name it), and every line the rewritten instructions map to
      was mapped to by the original, or is where an original statement starts: the runtime
      import borrows the line of the statement it precedes, which may have no code (``global``).
    """
    original = ast.parse(source)
    kept = _statement_positions(original)
    rewritten = _statement_positions(result.tree) - Counter(_inserted_imports(result.tree))
    if kept != rewritten:
        moved = sorted((kept - rewritten).elements())[:3]
        yield f"statements moved: {moved} (and maybe more)"
    before, after = list(_code_objects(expected)), list(_code_objects(code))
    if _starts(before) != _starts(after):
        yield "code objects changed or moved their first line"
        return
    statement_lines = {node.lineno for node in ast.walk(original) if isinstance(node, ast.stmt)}
    for old, new in zip(before, after):
        old_lines, new_lines = _instruction_lines(old), _instruction_lines(new)
        if not old_lines <= new_lines:
            yield f"{_qualname(old)}: lost lines {sorted(old_lines - new_lines)}"
        invented = new_lines - old_lines - statement_lines
        if invented:
            yield f"{_qualname(old)}: instructions on new lines {sorted(invented)}"


Position = tuple[str, int, int, Optional[int], Optional[int]]


def _statement_positions(tree: ast.Module) -> Counter[Position]:
    return Counter(
        (type(node).__name__, node.lineno, node.col_offset, node.end_lineno, node.end_col_offset)
        for node in ast.walk(tree)
        if isinstance(node, ast.stmt)
    )


def _inserted_imports(tree: ast.Module) -> list[Position]:
    """The runtime imports (``__dmlpatch__``, and ``__dmlpatch_kept__`` where a function keeps
    CUDA's meaning)."""
    statements = [
        node
        for node in tree.body
        if isinstance(node, ast.Import)
        and [alias.asname for alias in node.names] in ([ALIAS], [KEPT_ALIAS])
    ]
    assert statements
    return list(_statement_positions(ast.Module(statements, [])).elements())


def _code_objects(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            yield from _code_objects(constant)


def _starts(codes: list[types.CodeType]) -> list[tuple[str, int]]:
    return [(_qualname(code), code.co_firstlineno) for code in codes]


def _instruction_lines(code: types.CodeType) -> set[int]:
    return {line for _, _, line in code.co_lines() if line is not None}


# -- the test ---------------------------------------------------------------------------------


def test_the_rewriter_cannot_break_site_packages(
    record_property: Callable[[str, object], None],
) -> None:
    started = time.monotonic()
    every = sorted(path for path in PURELIB.rglob("*.py") if path.is_file())
    paths = [str(path) for path in every if may_have_sites(path.read_bytes())]
    # Spawned, not forked: this process may hold torch's threads and locks.
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=2, mp_context=context) as pool:
        outcomes = list(pool.map(check_file, paths, chunksize=64))
    compiled = [outcome for outcome in outcomes if outcome.compiles]
    skipped = [outcome.path for outcome in outcomes if not outcome.compiles]
    kinds = Counter(kind for outcome in compiled for kind in outcome.site_kinds)
    with_sites = sum(1 for outcome in compiled if outcome.site_kinds)
    record_property(
        "terminal_summary",
        f"rewrite corpus ({PURELIB}): {len(every)} files, {len(paths)} may hold sites: "
        f"{len(compiled)} compile, "
        f"{len(skipped)} do not (skipped{': ' + ', '.join(skipped[:3]) if skipped else ''}); "
        f"{with_sites} with {sum(kinds.values())} CUDA sites "
        f"({', '.join(f'{kind} {n}' for kind, n in kinds.most_common())}), "
        f"{len(compiled) - with_sites} without; {time.monotonic() - started:.1f} s "
        f"({sum(outcome.seconds for outcome in outcomes):.0f} s CPU in 2 processes)",
    )
    # The scan must have reached torch's own CUDA code; an empty purelib would prove nothing.
    assert len(compiled) > 1000
    assert any(path.endswith(str(Path("torch", "cuda", "__init__.py"))) for path in paths)
    problems = [f"{o.path}: {problem}" for o in outcomes for problem in o.problems]
    assert not problems, f"{len(problems)} problem(s):\n" + "\n".join(problems[:20])


# -- generated programs -----------------------------------------------------------------------
#
# Programs composed of CUDA idioms (sites) and look-alikes (not sites) in varied surroundings.
# Each runs twice against a stand-in torch that believes it has two CUDA GPUs: as written, and
# rewritten, with the real dmlpatch.runtime.sites answering for a two-adapter accelerator.

#: One source line and how many sites the rewriter must find on it.
Line = tuple[str, int]

#: Where the rewritten programs' CUDA ordinals 0 and 1 land: the accelerator's two adapters.
ON = ("privateuseone:0", "privateuseone:1")
_ACCELERATOR = accelerator(0, 1)


class Fragment(NamedTuple):
    """Statements, then an expression whose value is recorded, and that value in both runs."""

    setup: tuple[Line, ...]
    value: tuple[Line, ...]  # lines after the first stand inside brackets
    original: object
    rewritten: object


def _lines(text: str) -> tuple[Line, ...]:
    """``text`` by line; a line ending in ``  #S`` holds one site, ``  #SS`` two."""
    lines = []
    for line in text.split("\n") if text else ():
        code, marked, marker = line.partition("  #S")
        lines.append((code, 1 + len(marker) if marked else 0))
    return tuple(lines)


def site(value: str, original: object, rewritten: object, setup: str = "") -> Fragment:
    return Fragment(_lines(setup), _lines(value), original, rewritten)


def same(value: str, result: object, setup: str = "") -> Fragment:
    """A look-alike: says cuda, is no site, and gives the same value rewritten."""
    return Fragment(_lines(setup), _lines(value), result, result)


def _per_ordinal(n: int) -> list[Fragment]:
    device, cuda = ("device", f"cuda:{n}"), f"cuda:{n}"
    return [
        site(f"torch.device('cuda:{n}')  #S", device, ("device", ON[n])),
        site(f"torch.device('cuda', {n})  #S", device, ("device", ON[n])),
        site(f"torch.device('cuda', index={n})  #S", device, ("device", ON[n])),
        site(f"torch.set_default_device('cuda:{n}')  #S", ("default", cuda), ("default", ON[n])),
        site(f"torch.cuda.get_device_name({n})  #S", "NVIDIA fake", f"Fake adapter {n}"),
        site(f"Movable().cuda({n})  #S", ("cuda", n), ("to", ON[n])),
        site(f"Movable().cuda(  #S\n    {n}\n)", ("cuda", n), ("to", ON[n])),
        site(f"Movable().to('cuda:{n}')  #S", ("to", cuda), ("to", ON[n])),
        site(f"make(size=2, device='cuda:{n}')  #S", cuda, ON[n]),
        site(f"(lambda device='cuda:{n}': device)()  #S", cuda, ON[n]),
        site("device", cuda, ON[n], setup=f"device = 'cuda:{n}'  #S"),
    ]


FRAGMENTS = [
    *_per_ordinal(0),
    *_per_ordinal(1),
    site("torch.device('cuda')  #S", ("device", "cuda"), ("device", ON[0])),
    site("torch.device(type='cuda')  #S", ("device", "cuda"), ("device", ON[0])),
    site("torch.device(f'cuda:{ordinal}')  #S", ("device", "cuda:1"), ("device", ON[1])),
    site("torch.device('cuda:%d' % ordinal)  #S", ("device", "cuda:1"), ("device", ON[1])),
    site("torch.device('cuda:' + str(ordinal))  #S", ("device", "cuda:1"), ("device", ON[1])),
    site("torch.device('cuda:{}'.format(ordinal))  #S", ("device", "cuda:1"), ("device", ON[1])),
    site(
        "torch.device('cuda' if torch.cuda.is_available() else 'cpu')  #SS",
        ("device", "cuda"),
        ("device", ON[0]),
    ),
    site("torch.cuda.is_available()  #S", "torch: yes", True),
    site("torch.cuda.device_count()  #S", 7, 2),
    site("torch.cuda.synchronize()  #S", "torch: done", None),
    site("torch.cuda.empty_cache()  #S", "torch: done", None),
    site("torch.cuda.manual_seed_all(0)  #S", "torch: done", None),
    site("Movable().cuda()  #S", ("cuda", None), ("to", ON[0])),
    site("Movable().cuda(non_blocking=True)  #S", ("cuda", None), ("to", ON[0])),
    site("(Movable()  #S\n .cuda())", ("cuda", None), ("to", ON[0])),
    site("Movable().to(device='cuda')  #S", ("to", "cuda"), ("to", ON[0])),
    site("Movable().to('cuda' if ordinal else 'cpu')  #S", ("to", "cuda"), ("to", ON[0])),
    site("Movable().to(None or 'cuda')  #S", ("to", "cuda"), ("to", ON[0])),
    site("Movable().to(\n    'cuda:%d'  #S\n    % ordinal)", ("to", "cuda:1"), ("to", ON[1])),
    site("load('weights.pth', map_location='cuda')  #S", "cuda", ON[0]),
    site("Options().add_argument('--device', default='cuda')  #S", "cuda", ON[0]),
    site("pick(0)", "cuda", ON[0], setup="def pick(x, device='cuda'):  #S\n    return device"),
    site(
        "pick()",
        "cuda:1",
        ON[1],
        setup="def pick(*, to_device='cuda:1'):  #S\n    return to_device",
    ),
    site(
        "Holder().device",
        "cuda",
        ON[0],
        setup="class Holder:\n    def __init__(self):\n        self.device = 'cuda'  #S",
    ),
    site("DEVICE", "cuda", ON[0], setup="DEVICE: str = 'cuda'  #S"),
    site(
        "DEVICE",
        ("device", "cuda"),
        ("device", ON[0]),
        setup="DEVICE = torch.device('cuda' if torch.cuda.is_available() else 'cpu')  #SS",
    ),
    site(
        "many",
        "yes",
        "no",
        setup="if torch.cuda.device_count() > 2:  #S\n    many = 'yes'\nelse:\n    many = 'no'",
    ),
    same("'cudas'", "cudas"),
    same("torch.device('cuda:x')", ("device", "cuda:x")),
    same("Movable().to('cudax')", ("to", "cudax")),
    # Tests of a device against CUDA's name answer for the adapter as on CUDA.
    site(
        "Movable().device.type == 'cuda'  #S",
        True,
        True,
        setup="torch.cuda.empty_cache()  #S",  # a test alone is no site: the module chose CUDA
    ),
    site("args_device == 'cuda'  #S", True, True, setup="args_device = 'cuda'  #S"),
    site("DEVICE.startswith('cuda:1')  #S", True, True, setup="DEVICE = 'cuda:1'  #S"),
    site("'cuda' in str(gpu_device)  #S", True, True, setup="gpu_device = 'cuda'  #S"),
    site("the_device in ('cuda', 'mps')  #S", True, True, setup="the_device = 'cuda'  #S"),
    same("'cuda' in 'cuda:0'", True),
    same("{'cuda': 1}['cuda']", 1),
    same("'moving to cuda:0 with x.cuda()'", "moving to cuda:0 with x.cuda()"),
    same("backend", "cuda", setup="backend = 'cuda'"),
    same("device_name", "cuda", setup="device_name = 'cuda'"),
    same("pick()", "cuda", setup="def pick(mode='cuda'):\n    return mode"),
    same("torch.Tensor.cuda(Movable())", "torch: unbound cuda"),
    same("Namespace(cuda=3).cuda", 3),
    same("torch.cuda.is_initialized()", "torch: initialized"),
    site("torch.autocast(device_type='cpu')  #S", ("autocast", "cpu"), ("autocast", "cpu")),
    # torch.device(x) is a site only beside another (here empty_cache): device-agnostic code
    # alone is left as it is (tests/unit/test_rewrite.py).
    site(
        "torch.device(name)  #S",
        ("device", "cuda:1"),
        ("device", ON[1]),
        setup="name = 'cuda' + ':1'\ntorch.cuda.empty_cache()  #S",
    ),
    site(
        "torch.device(other)  #S",
        ("device", "cpu"),
        ("device", "cpu"),
        setup="other = 'cpu'\ntorch.cuda.empty_cache()  #S",
    ),
    same("'cuda:%d' % ordinal", "cuda:1"),
    same("'cu' + 'da'", "cuda"),
    same("f'{backend_name}:0'", "cuda:0"),
    same("Options().add_argument('--backend', default='cuda')", "cuda"),
    same("make(cuda='cuda')", None),
]

#: Module-level statements between fragments that mention CUDA and are no sites.
NOISE = [
    (),
    (("", 0),),
    (("# x.cuda(); torch.device('cuda'); device = 'cuda'", 0),),
    (("'''Moves tensors to cuda:0 with .cuda(); device='cuda'.'''", 0),),
    (("pass", 0),),
]


class _Writer:
    """A program being written, line by line, with the line of every site it must have."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.site_lines: list[int] = []

    def add(self, indent: int, lines: Iterable[Line]) -> None:
        for text, sites in lines:
            self.lines.append(" " * indent + text if text else "")
            self.site_lines += [len(self.lines)] * sites

    def record(self, indent: int, head: str, value: tuple[Line, ...], tail: str = "") -> None:
        """``head`` + the value's lines + ``tail``."""
        (first, sites), *rest = value
        lines = [(head + first, sites), *rest]
        lines[-1] = (lines[-1][0] + tail, lines[-1][1])
        self.add(indent, lines)


def at_module(writer: _Writer, fragment: Fragment, key: str) -> None:
    writer.add(0, fragment.setup)
    writer.record(0, f"out[{key!r}] = ", fragment.value)


def in_function(writer: _Writer, fragment: Fragment, key: str, docstring: bool = False) -> None:
    writer.add(0, [(f"def f_{key}():", 0)])
    if docstring:
        writer.add(4, [("'''Runs on cuda:0: x.cuda(), torch.device('cuda').'''", 0)])
    writer.add(4, fragment.setup)
    writer.record(4, "return ", fragment.value)
    writer.add(0, [(f"out[{key!r}] = f_{key}()", 0)])


def in_documented_function(writer: _Writer, fragment: Fragment, key: str) -> None:
    in_function(writer, fragment, key, docstring=True)


def in_decorated_function(writer: _Writer, fragment: Fragment, key: str) -> None:
    writer.add(0, [("@keep", 0), ("@tagged('cuda', device_type='cuda')", 0)])
    in_function(writer, fragment, key)


def in_nested_function(writer: _Writer, fragment: Fragment, key: str) -> None:
    writer.add(0, [(f"def f_{key}():", 0)])
    writer.add(4, [("def inner():", 0)])
    writer.add(8, fragment.setup)
    writer.record(8, "return ", fragment.value)
    writer.add(4, [("return inner()", 0)])
    writer.add(0, [(f"out[{key!r}] = f_{key}()", 0)])


def in_lambda(writer: _Writer, fragment: Fragment, key: str) -> None:
    writer.add(0, fragment.setup)
    writer.record(0, f"out[{key!r}] = (lambda: ", fragment.value, ")()")


def in_comprehension(writer: _Writer, fragment: Fragment, key: str) -> None:
    writer.add(0, fragment.setup)
    writer.record(0, f"out[{key!r}] = [", fragment.value, " for _ in range(1)][0]")


def in_class_body(writer: _Writer, fragment: Fragment, key: str) -> None:
    writer.add(0, [(f"class C_{key}:", 0)])
    writer.add(4, fragment.setup)
    writer.record(4, "value = ", fragment.value)
    writer.add(0, [(f"out[{key!r}] = C_{key}.value", 0)])


def in_block(head: str, closing: tuple[Line, ...]) -> Callable[[_Writer, Fragment, str], None]:
    def write(writer: _Writer, fragment: Fragment, key: str) -> None:
        writer.add(0, [(head, 0)])
        writer.add(4, fragment.setup)
        writer.record(4, f"out[{key!r}] = ", fragment.value)
        writer.add(0, closing)

    write.__name__ = f"in_block({head!r})"
    return write


CONTEXTS = [
    at_module,
    in_function,
    in_documented_function,
    in_decorated_function,
    in_nested_function,
    in_lambda,
    in_comprehension,
    in_class_body,
    in_block("if ordinal:", (("else:", 0), ("    pass", 0))),
    in_block("try:", (("except ZeroDivisionError:", 0), ("    pass", 0))),
    in_block("with quiet():", ()),
    in_block("for _ in range(1):", ()),
]


class Program(NamedTuple):
    source: str
    site_lines: list[int]
    original: dict[str, object]
    rewritten: dict[str, object]


@st.composite
def programs(draw: st.DrawFn) -> Program:
    alias = draw(st.sampled_from(["torch", "th"]))
    writer = _Writer()
    if draw(st.booleans()):
        writer.add(0, [("'''A module that uses torch.device('cuda') and x.cuda().'''", 0)])
    if draw(st.booleans()):
        writer.add(0, [("from __future__ import annotations", 0)])
    writer.add(0, [("import torch" if alias == "torch" else f"import torch as {alias}", 0)])
    pieces = st.tuples(
        st.sampled_from(FRAGMENTS), st.sampled_from(CONTEXTS), st.sampled_from(NOISE)
    )
    original, rewritten = {}, {}
    for index, (fragment, context, noise) in enumerate(draw(st.lists(pieces, max_size=6))):
        key = f"k{index}"
        writer.add(0, noise)
        context(writer, _aliased(fragment, alias), key)
        original[key], rewritten[key] = fragment.original, fragment.rewritten
    source = "\n".join(writer.lines) + "\n"
    return Program(source, writer.site_lines, original, rewritten)


def _aliased(fragment: Fragment, alias: str) -> Fragment:
    def rename(lines: tuple[Line, ...]) -> tuple[Line, ...]:
        return tuple((text.replace("torch.", f"{alias}."), sites) for text, sites in lines)

    return fragment._replace(setup=rename(fragment.setup), value=rename(fragment.value))


# -- the stand-in world the programs run in ----------------------------------------------------


class Movable:
    """A tensor or a module: where ``.cuda()`` and ``.to()`` would send it."""

    device = types.SimpleNamespace(type="cuda")

    def cuda(self, device: object = None, non_blocking: bool = False) -> tuple[str, object]:
        return ("cuda", device)

    def to(self, *args: object, **kwargs: object) -> tuple[str, str]:
        return ("to", str(args[0] if args else kwargs["device"]))


class Options:
    def add_argument(self, *names: str, default: object = None) -> object:
        return default


#: torch as the programs see it: CUDA with two GPUs (it answers unlike the runtime, on purpose).
_TORCH = types.SimpleNamespace(
    device=lambda type, index=None: ("device", type if index is None else f"{type}:{index}"),
    set_default_device=lambda device: ("default", device),
    autocast=lambda device_type: ("autocast", device_type),
    Tensor=types.SimpleNamespace(cuda=lambda tensor: "torch: unbound cuda"),
    cuda=types.SimpleNamespace(
        is_available=lambda: "torch: yes",
        device_count=lambda: 7,
        get_device_name=lambda device=None: "NVIDIA fake",
        synchronize=lambda: "torch: done",
        empty_cache=lambda: "torch: done",
        manual_seed_all=lambda seed: "torch: done",
        is_initialized=lambda: "torch: initialized",
    ),
)


def _import(name: str, *args: Any, **kwargs: Any) -> Any:
    return _TORCH if name == "torch" else builtins.__import__(name, *args, **kwargs)


def _run(code: types.CodeType) -> dict[str, object]:
    namespace: dict[str, Any] = {
        "__builtins__": {**vars(builtins), "__import__": _import},
        "__name__": "generated",
        "out": {},
        "ordinal": 1,
        "backend_name": "cuda",
        "Movable": Movable,
        "Options": Options,
        "Namespace": types.SimpleNamespace,
        "make": lambda **kwargs: kwargs.get("device"),
        "load": lambda path, map_location=None: map_location,
        "keep": lambda function: function,
        "tagged": lambda *args, **kwargs: lambda function: function,
        "quiet": contextlib.nullcontext,
    }
    exec(code, namespace)
    return namespace["out"]


@settings(max_examples=200, deadline=None, database=None)
@given(programs())
def test_generated_programs_compile_keep_lines_and_route_every_site(program: Program) -> None:
    source = program.source
    expected = compile(source, "generated.py", "exec", dont_inherit=True)
    result = rewrite(source, "generated.py")
    code = compile(result.tree, "generated.py", "exec", dont_inherit=True)
    assert sorted(site.line for site in result.sites) == program.site_lines
    if result.sites:
        assert list(line_problems(source.encode(), result, expected, code)) == []
    else:
        assert code_difference(expected, code) is None
    assert _run(expected) == program.original
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(resolution, "current", lambda: _ACCELERATOR)
        assert _run(code) == program.rewritten
    # Rewriting is idempotent (tests/unit/test_rewrite.py claims it for the idiom corpus too).
    once = ast.unparse(result.tree)
    again = rewrite(once)
    assert again.sites == []
    assert ast.unparse(again.tree) == once
