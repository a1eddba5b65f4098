"""The rewriter on a corpus of real CUDA idioms: which sites, what they become, how they run."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
import traceback
import types
from pathlib import Path
from typing import Any, Callable

import pytest
import torch

from corpus._harness import accelerator, child_env, cpu, idiom_files, marked_sites, sandbox
from dmlpatch.devices import resolution
from dmlpatch.rewriting.transform import Site, find_sites, rewrite
from dmlpatch.runtime import sites as runtime

IDIOMS = idiom_files()


def sites_of(snippet: str) -> list[tuple[str, str]]:
    return [(site.kind, site.text) for site in find_sites(textwrap.dedent(snippet))]


def rewritten(snippet: str) -> str:
    return ast.unparse(rewrite(textwrap.dedent(snippet)).tree)


# -- which sites ------------------------------------------------------------------------------


@pytest.mark.parametrize("path", IDIOMS, ids=lambda path: path.stem)
def test_corpus_sites_are_exactly_the_marked_lines(path: Path) -> None:
    sites = find_sites(path.read_bytes(), str(path))
    assert [(site.line, site.kind) for site in sites] == marked_sites(path)
    lines = path.read_text(encoding="utf-8").splitlines()
    for site in sites:
        assert site.text.splitlines()[0] in lines[site.line - 1]


def test_site_records_position_kind_and_original_text() -> None:
    source = "import torch\nd = torch.device('cuda' if torch.cuda.is_available() else 'cpu')\n"
    assert find_sites(source) == [
        Site(2, 17, "device_literal", "'cuda'"),
        Site(2, 27, "is_available", "torch.cuda.is_available()"),
    ]


@pytest.mark.parametrize(
    ("snippet", "expected"),
    [
        ("torch.device('cuda')", [("device_literal", "'cuda'")]),
        ("torch.device('cuda:1')", [("device_literal", "'cuda:1'")]),
        ("torch.device(f'cuda:{i}')", [("device_literal", "f'cuda:{i}'")]),
        ("torch.device(type='cuda')", [("device_literal", "'cuda'")]),
        ("torch.device('cuda', i)", [("device_literal", "torch.device('cuda', i)")]),
        ("torch.device('cuda', index=0)", [("device_literal", "torch.device('cuda', index=0)")]),
        ("torch.set_default_device('cuda')", [("device_literal", "'cuda'")]),
        ("f(x, device='cuda:0')", [("device_literal", "'cuda:0'")]),
        ("f(x, output_device='cuda')", [("device_literal", "'cuda'")]),
        ("f(device=d or 'cuda')", [("device_argument", "d"), ("device_literal", "'cuda'")]),
        ("torch.load(p, map_location='cuda')", [("device_literal", "'cuda'")]),
        ("x.to('cuda:%d' % rank)", [("device_literal", "'cuda:%d' % rank")]),
        ("x.to('cuda:' + str(rank))", [("device_literal", "'cuda:' + str(rank)")]),
        ("x.to('cuda:{}'.format(rank))", [("device_literal", "'cuda:{}'.format(rank)")]),
        ("x.to(device='cuda')", [("device_literal", "'cuda'")]),
        ("def f(device='cuda'): pass", [("device_literal", "'cuda'")]),
        ("def f(*, map_device='cuda:0'): pass", [("device_literal", "'cuda:0'")]),
        ("f = lambda device='cuda': device", [("device_literal", "'cuda'")]),
        ("device = 'cuda'", [("device_literal", "'cuda'")]),
        ("self.device = 'cuda:0'", [("device_literal", "'cuda:0'")]),
        ("DEVICE: str = 'cuda'", [("device_literal", "'cuda'")]),
        ("p.add_argument('--device', default='cuda')", [("device_literal", "'cuda'")]),
        ("x.cuda()", [("cuda_call", "x.cuda()")]),
        ("self.net.cuda(0)", [("cuda_call", "self.net.cuda(0)")]),
        ("super().cuda(device)", [("cuda_call", "super().cuda(device)")]),
        ("batch.pin_memory()", [("pin_memory", "batch.pin_memory()")]),
        (
            "x.pin_memory().cuda(non_blocking=True)",
            [
                ("pin_memory", "x.pin_memory()"),
                ("cuda_call", "x.pin_memory().cuda(non_blocking=True)"),
            ],
        ),
        ("torch.cuda.is_available()", [("is_available", "torch.cuda.is_available()")]),
        ("torch.cuda.device_count() > 1", [("cuda_api", "torch.cuda.device_count()")]),
        ("torch.cuda.empty_cache()", [("cuda_api", "torch.cuda.empty_cache()")]),
        ("torch.cuda.manual_seed_all(0)", [("cuda_api", "torch.cuda.manual_seed_all")]),
        ("torch.cuda.set_device(rank)", [("cuda_api", "torch.cuda.set_device(rank)")]),
        ("torch.cuda.synchronize()", [("cuda_api", "torch.cuda.synchronize()")]),
        ("with torch.inference_mode(): pass", [("inference_mode", "torch.inference_mode")]),
        (
            "from torch import inference_mode as im\n@im\ndef f(): pass\nwith im(False): pass",
            [("inference_mode", "im"), ("inference_mode", "im")],
        ),
        (
            "def get_device_name():\n    if ok:\n        return f'cuda:{rank}'\n    return 'cpu'",
            [("device_literal", "f'cuda:{rank}'")],
        ),
        (
            "async def pick_device(): return 'cuda'",
            [("device_literal", "'cuda'")],
        ),
        ("x.cuda()\ntorch.device(arg)", [("cuda_call", "x.cuda()"), ("device_value", "arg")]),
        (
            "x.cuda()\ntorch.device(type=cfg.device)",
            [("cuda_call", "x.cuda()"), ("device_value", "cfg.device")],
        ),
        (
            "x.cuda()\ntorch.device('cpu' if cpu else arg)",
            [("cuda_call", "x.cuda()"), ("device_value", "arg")],
        ),
        ("with torch.cuda.device(1): pass", [("cuda_api", "torch.cuda.device")]),
        ("torch.cuda.get_device_properties(0)", [("cuda_api", "torch.cuda.get_device_properties")]),
        ("e = torch.cuda.Event", [("cuda_api", "torch.cuda.Event")]),
        ("isinstance(x, torch.cuda.FloatTensor)", [("cuda_api", "torch.cuda.FloatTensor")]),
        (
            "T = torch.cuda.FloatTensor\nx.type(T)",
            [("cuda_api", "torch.cuda.FloatTensor"), ("tensor_type", "x.type(T)")],
        ),
        (
            "from torch.cuda import HalfTensor, is_available",
            [("cuda_api", "from torch.cuda import HalfTensor, is_available")],
        ),
        (
            "torch.autocast(device_type='cuda')",
            [("amp", "torch.autocast(device_type='cuda')")],
        ),
        ("torch.cuda.amp.autocast()", [("amp", "torch.cuda.amp.autocast()")]),
        ("torch.amp.GradScaler('cuda')", [("amp", "torch.amp.GradScaler('cuda')")]),
        ("from torch import cuda\ncuda.amp.GradScaler()", [("amp", "cuda.amp.GradScaler()")]),
        ("from torch.amp import autocast as ac\nac('cuda')", [("amp", "ac('cuda')")]),
        (
            "@torch.cuda.amp.custom_fwd(cast_inputs=torch.float32)\ndef f(ctx, x): pass",
            [("amp", "torch.cuda.amp.custom_fwd")],
        ),
        (
            "from torch.cuda.amp import custom_fwd, custom_bwd as bwd\n"
            "@custom_fwd\ndef f(ctx, x): pass\n@custom_fwd(cast_inputs=t)\ndef g(ctx, x): pass\n"
            "@bwd\ndef h(ctx, g): pass",
            [("amp", "custom_fwd"), ("amp", "custom_fwd"), ("amp", "bwd")],
        ),
        (
            "from torch.cuda import amp\n@amp.custom_bwd\ndef f(ctx, g): pass",
            [("amp", "amp.custom_bwd")],
        ),
        (
            "import torch.cuda.amp as camp\n@staticmethod\n@camp.custom_fwd\ndef f(ctx): pass",
            [("amp", "camp.custom_fwd")],
        ),
        ("torch.accelerator.synchronize()", [("accelerator", "torch.accelerator")]),
        (
            "x.cuda()\nstate = torch.load(path)",
            [("cuda_call", "x.cuda()"), ("torch_load", "torch.load(path)")],
        ),
        (
            "x.cuda()\ntorch.load(f, weights_only=True)",
            [("cuda_call", "x.cuda()"), ("torch_load", "torch.load(f, weights_only=True)")],
        ),
        (
            "x.cuda()\ntorch.load(p, map_location='cpu')\ntorch.load(p, 'cpu')\n"
            "torch.load(**options)",
            [("cuda_call", "x.cuda()")],
        ),
        (
            "dev = 'cuda' if torch.cuda.is_available() else 'cpu'",
            [("device_literal", "'cuda'"), ("is_available", "torch.cuda.is_available()")],
        ),
        ("run(model, 'cuda' if use_gpu else 'cpu')", [("device_literal", "'cuda'")]),
        ("gpu = 'mps' if mac else 'cuda:1'", [("device_literal", "'cuda:1'")]),
        (
            "x = 'cuda' if torch.cuda.device_count() > 1 else other",
            [("device_literal", "'cuda'"), ("cuda_api", "torch.cuda.device_count()")],
        ),
        (
            "dev = 'cpu'\nif torch.cuda.is_available():\n    dev = 'cuda'",
            [("is_available", "torch.cuda.is_available()"), ("device_literal", "'cuda'")],
        ),
        (
            "if not torch.cuda.is_available():\n    d = 'cpu'\nelse:\n    d = 'cuda:0'",
            [("is_available", "torch.cuda.is_available()"), ("device_literal", "'cuda:0'")],
        ),
        (
            "DEVICES = ['cpu']\nif torch.cuda.is_available():\n    DEVICES.append('cuda')",
            [("is_available", "torch.cuda.is_available()"), ("device_literal", "'cuda'")],
        ),
        (
            "if torch.cuda.device_count() > 1:\n    devices += ['cuda:0', 'cuda:1']",
            [
                ("cuda_api", "torch.cuda.device_count()"),
                ("device_literal", "'cuda:0'"),
                ("device_literal", "'cuda:1'"),
            ],
        ),
        ("from torch import accelerator", [("accelerator", "from torch import accelerator")]),
    ],
)
def test_device_sites(snippet: str, expected: list[tuple[str, str]]) -> None:
    assert sites_of(snippet) == expected


@pytest.mark.parametrize(
    "snippet",
    [
        "x.device.type == 'cuda'",
        "device == 'cuda'",
        "'cuda' in str(dev)",
        "print('using cuda')",
        "log.info('moving to cuda:0')",
        "names = {'cuda': 1}",
        "torch.cuda.get_arch_list()",
        "if use_gpu:\n    backends.append('cuda')",
        "torch.cuda.is_initialized()",
        "torch.cuda.is_available",
        "backend = 'cuda'",
        "device_name = 'cuda'",
        "def f(mode='cuda'): pass",
        "p.add_argument('--backend', default='cuda')",
        "torch.device('cpu' if cpu else 'mps')",
        "torch.device(dev)  # device-agnostic code: no other site, so left alone",
        "torch.device('cpu')",
        "torch.device('cuda:x')",
        "x.to(torch.float16)",
        "x.to('cudax')",
        "x = f'{dev}:0'",
        "torch.Tensor.cuda(x)",
        "torch.nn.Module.cuda(model)",
        "torch.backends.cudnn.benchmark = True",
        "os.environ['CUDA_VISIBLE_DEVICES'] = '0'",
        "torch.is_inference_mode_enabled()",
        "x.inference_mode()",
        "torch.inference_mode = None",
        "torch.cuda.Stream = None",
        "torch.amp.custom_fwd(f)",
        "from torch import amp\n@amp.custom_fwd\ndef f(ctx): pass",
        "from torch.amp import custom_fwd\n@custom_fwd\ndef f(ctx): pass",
        "torch.cuda.amp.custom_fwd = None",
        "torch.cpu.amp.autocast()",
        "x.type()",
        "x.type(torch.float16)",
        "torch.accelerators",
        "def backend(): return 'cuda'",
        "def get_device():\n    def name(): return 'cuda'\n    return name",
        # scipy 1.17's _lib/_array_api.py: a device *type* of an array, for comparisons.
        "def xp_device_type(a):\n    if is_cupy_array(a):\n        return 'cuda'\n"
        "    return 'cuda' if (p := a.device.platform) == 'gpu' else p",
        "def device_type(): return 'cuda'",
        "def is_device_available(): return 'cuda'",
        "kind = 'cuda' if flag else 'other'",
        "torch.load(path)  # a module with no other site: device-agnostic",
        "model.load(path)",
        "label = 'cuda' if gpu else 'CPU only'",
        "if use_gpu:\n    backend = 'cuda'",
        "if torch.backends.mps.is_available():\n    backend = 'cuda'",
    ],
)
def test_not_device_sites(snippet: str) -> None:
    result = rewrite(snippet)
    assert result.sites == []
    assert ast.dump(result.tree) == ast.dump(ast.parse(snippet))


def test_complex_literals_only_next_to_values() -> None:
    """Arithmetic of a complex literal with a value may meet a device tensor; with another
    number it is a Python constant (folded by the compiler, so left as written)."""
    source = "import torch\nz = x * (y + 1j)\nv = (3.14 + 2.71j, -1 - 2j, 2 * 1j, 1j)\n"
    assert [(site.kind, site.text) for site in find_sites(source)] == [
        ("complex_literal", "y + 1j")
    ]


@pytest.mark.parametrize(
    ("snippet", "expected"),
    [
        (
            "import torch.cuda\ntorch.cuda.is_available()",
            "__dmlpatch__.is_available()",
        ),
        ("import torch as th\nth.cuda.device_count()", "__dmlpatch__.device_count()"),
        ("from torch import cuda\ncuda.empty_cache()", "__dmlpatch__.empty_cache()"),
        ("import torch.cuda as tc\ntc.is_available()", "__dmlpatch__.is_available()"),
        (
            "from torch.cuda import device_count as n\nn()",
            "__dmlpatch__.device_count()",
        ),
        (
            "from torch import device as d\nd('cuda')",
            "d(__dmlpatch__.device('cuda'))",
        ),
    ],
)
def test_import_styles(snippet: str, expected: str) -> None:
    assert rewritten(snippet).splitlines()[-1] == expected


def test_unrelated_names_are_not_torch() -> None:
    assert sites_of("import numpy as np\nnp.cuda.is_available()\ncuda.device_count()") == []


# -- what they become -------------------------------------------------------------------------


def test_rewritten_code_reads_like_the_original() -> None:
    source = """
        '''A module.'''
        from __future__ import annotations
        import torch
        device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')
        def load(path, device='cuda'):
            net = Net().cuda()
            x = torch.zeros(1, device='cuda:0')
            y = x.to(f'cuda:{rank}', non_blocking=True)
            return torch.device('cuda', rank)
        if torch.cuda.device_count() > 1:
            net = nn.DataParallel(net)
        """
    assert rewritten(source) == textwrap.dedent(
        """\
        \"\"\"A module.\"\"\"
        from __future__ import annotations
        import dmlpatch.runtime.sites as __dmlpatch__
        import torch
        device = torch.device(__dmlpatch__.device('cuda') if __dmlpatch__.is_available() else 'cpu')

        def load(path, device=__dmlpatch__.device('cuda')):
            net = __dmlpatch__.cuda(Net())
            x = torch.zeros(1, device=__dmlpatch__.device('cuda:0'))
            y = x.to(__dmlpatch__.device(f'cuda:{rank}'), non_blocking=True)
            return torch.device(__dmlpatch__.device(rank))
        if __dmlpatch__.device_count() > 1:
            net = nn.DataParallel(net)"""
    )


def test_runtime_import_is_inserted_once_and_only_with_sites() -> None:
    with_sites = rewrite("x.cuda()\ny.cuda()\n").tree
    imports = [node for node in with_sites.body if isinstance(node, ast.Import)]
    assert [alias.name for node in imports for alias in node.names] == ["dmlpatch.runtime.sites"]
    assert imports[0].names[0].asname == runtime.ALIAS == "__dmlpatch__"
    assert with_sites.body[0] is imports[0]
    without = rewrite("'''doc'''\nimport torch\n").tree
    assert not any(isinstance(node, ast.Import) and node.names[0].asname for node in without.body)


def test_every_rewritten_name_exists_in_the_runtime() -> None:
    for path in IDIOMS:
        tree = rewrite(path.read_bytes(), str(path)).tree
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and getattr(node.value, "id", None) == "__dmlpatch__"
            ):
                assert getattr(runtime, node.attr) is not None, node.attr
            owner = node.value if isinstance(node, ast.Attribute) else None
            if isinstance(owner, ast.Attribute) and getattr(owner.value, "id", None) == (
                "__dmlpatch__"
            ):
                assert callable(getattr(getattr(runtime, owner.attr), node.attr)), node.attr


@pytest.mark.parametrize("path", IDIOMS, ids=lambda path: path.stem)
def test_rewriting_twice_changes_nothing_more(path: Path) -> None:
    once = ast.unparse(rewrite(path.read_bytes(), str(path)).tree)
    result = rewrite(once)
    assert [site.kind for site in result.sites] == []
    assert ast.unparse(result.tree) == once


@pytest.mark.parametrize("path", IDIOMS, ids=lambda path: path.stem)
def test_original_statements_keep_their_positions(path: Path) -> None:
    def positions(tree: ast.AST) -> list[tuple[str, int, int, int, int]]:
        return [
            (
                type(node).__name__,
                node.lineno,
                node.col_offset,
                node.end_lineno,
                node.end_col_offset,
            )
            for node in ast.walk(tree)
            if isinstance(node, ast.stmt)
            and not (isinstance(node, ast.Import) and node.names[0].asname == "__dmlpatch__")
        ]

    source = path.read_bytes()
    assert sorted(positions(rewrite(source).tree)) == sorted(positions(ast.parse(source)))


def test_new_nodes_take_the_location_of_what_they_replace() -> None:
    tree = rewrite("import torch\nx = [1,\n     torch.zeros(2).cuda()]\n").tree
    call = next(
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "cuda"
    )
    assert (call.lineno, call.col_offset, call.end_lineno, call.end_col_offset) == (3, 5, 3, 26)
    for node in ast.walk(call):
        assert getattr(node, "lineno", 3) == 3


def test_calls_spanning_lines_fail_on_the_lines_the_original_did() -> None:
    """CPython names a multi-line method call by its method's line; rewritten calls keep that.

    (Found by the site-packages corpus, tests/e2e/test_rewrite_corpus.py: ``model = Net().cuda(``
    with its argument on the next lines put the rewritten call on the closing line.)
    """
    source = textwrap.dedent(
        """\
        def spread(x, rank):
            return x.cuda(
                rank
            )
        def chained(x):
            return (x
                    .cuda())
        def literal(x, rank):
            return x.to(
                'cuda:%d'
                % rank)
        """
    )
    lines = source.splitlines()

    def line_of(text: str) -> int:
        return next(n for n, line in enumerate(lines, start=1) if text in line)

    def fail(*args: object, **kwargs: object) -> None:
        raise RuntimeError("no device")

    original: dict[str, Any] = {}
    exec(compile(source, "m.py", "exec"), original)
    rewritten: dict[str, Any] = {}
    exec(compile(rewrite(source, "m.py").tree, "m.py", "exec"), rewritten)
    rewritten["__dmlpatch__"] = types.SimpleNamespace(cuda=fail, device=fail)
    tensor = types.SimpleNamespace(cuda=fail, to=fail)

    def failing_line(namespace: dict[str, Any], function: str, *args: object) -> int:
        with pytest.raises(RuntimeError) as caught:
            namespace[function](tensor, *args)
        return [f for f in traceback.extract_tb(caught.value.__traceback__) if f.name == function][
            -1
        ].lineno

    assert failing_line(rewritten, "spread", 0) == failing_line(original, "spread", 0)
    assert failing_line(original, "spread", 0) == line_of("x.cuda(")
    assert failing_line(rewritten, "chained") == failing_line(original, "chained")
    assert failing_line(original, "chained") == line_of(".cuda())")
    # The original fails in .to(...), the rewritten where the literal starts, not where it ends.
    assert failing_line(rewritten, "literal", 0) == line_of("'cuda:%d'")


def test_nesting_deeper_than_the_recursion_limit() -> None:
    """The parser takes expressions nested deeper than a recursive visitor could follow.

    (Found by the site-packages corpus: sympy's generated resolvent_lookup.py nests ~570 deep.)
    """
    # Deeper than a recursive visitor reaches (two frames a level), not so deep that compile()
    # refuses the tree: converting AST objects back counts one recursion level per node level.
    depth = sys.getrecursionlimit() * 3 // 4
    source = "y = x.to('cuda')" + " + 1" * depth + "\n"
    assert [site.kind for site in find_sites(source)] == ["device_literal"]
    namespace: dict[str, Any] = {"x": types.SimpleNamespace(to=lambda device: 0)}
    exec(compile(rewrite(source).tree, "m.py", "exec"), namespace)
    assert namespace["y"] == depth


def test_files_without_sites_compile_to_the_same_code() -> None:
    import json.decoder
    import textwrap as stdlib_module

    paths = [
        Path(json.decoder.__file__),
        Path(stdlib_module.__file__),
        *(p for p in IDIOMS if p.stem == "not_sites"),
    ]
    for path in paths:
        source = path.read_bytes()
        result = rewrite(source, str(path))
        assert result.sites == []
        expected = compile(source, str(path), "exec", dont_inherit=True)
        assert compile(result.tree, str(path), "exec", dont_inherit=True) == expected


def test_encoding_cookie_and_non_ascii_text_before_a_site() -> None:
    source = "# -*- coding: latin-1 -*-\nlabel = 'caf\xe9'; x = t.to('cuda')\n".encode("latin-1")
    [site] = find_sites(source)
    assert (site.line, site.text) == (2, "'cuda'")
    assert (
        source.decode("latin-1").splitlines()[1].encode("utf-8")[site.col :].startswith(b"'cuda'")
    )


def test_multi_line_site_text() -> None:
    [site] = find_sites("x = t.to(\n    'cuda:%d'\n    % rank)\n")
    assert site.text == "'cuda:%d'\n    % rank"


def test_syntax_errors_name_the_file() -> None:
    with pytest.raises(SyntaxError) as caught:
        rewrite("def broken(:\n", "/somewhere/broken.py")
    assert caught.value.filename == "/somewhere/broken.py"


# -- how they run -----------------------------------------------------------------------------

#: What each hard-coded-CUDA module computes when its CUDA means the CPU (its original cannot
#: run here: it asks for a CUDA device this machine does not have).
CPU_RESULTS: dict[str, dict[str, Any]] = {
    "facexlib_style": {
        "helper_device": "cpu",
        "default_device": "cpu",
        "helper_sum": 243.0,
        "default_sum": 243.0,
    },
    "tensor_methods": {
        "devices": ["cpu"],
        "sums": [6.0] * 9,
        "model": 6.0,
        "model_device": "cpu",
    },
    "device_tests": {
        "eq": False,
        "ne": True,
        "str": False,
        "in": False,
        "named": False,
        "contains": False,
        "prefix": False,
        "prefixes": False,
        "table": "torch.bfloat16",
        "get": "torch.bfloat16",
        "display": "gloo",
        "not_cuda": True,
        "where": "cpu",
        "moves_model": False,
        "from_env": "cpu",
        "from_args": "cpu",
        "made": "cpu",
    },
    "assignments": {
        "names": ["cpu"] * 5,
        "backend": "cuda",
        "option": "cpu",
        "explicit": "cpu",
        "loaded": ["cpu", [0.0, 1.0, 2.0], "cpu"],
    },
}

_DRIVER = """
import importlib, importlib.util, json, sys
from dmlpatch.rewriting import hook
sys.path.insert(0, sys.argv[1])
results = {}
for name in sys.argv[2:]:
    path = f"{sys.argv[1]}/corpus/{name}.py"
    spec = importlib.util.spec_from_file_location("plain_" + name, path)
    plain = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plain)
    try:
        original = {"ok": plain.run()}
    except Exception as error:  # torch 2.4 wraps CUDA deserialization errors in UnpicklingError
        original = {"error": f"{type(error).__name__}: {error}"}
    hook.install([hook.ModuleTarget("corpus." + name, "corpus", 0, "f")])
    rewritten = importlib.import_module("corpus." + name).run()
    results[name] = {"original": original, "rewritten": rewritten}
print(json.dumps(results))
"""


def test_corpus_runs_on_cpu_like_the_original(tmp_path: Path) -> None:
    """A fresh process with ``DMLPATCH_DEVICE=cpu``: the real resolution, the real hook."""
    package = tmp_path / "corpus"
    package.mkdir()
    runnable = [path for path in IDIOMS if "def run()" in path.read_text(encoding="utf-8")]
    for path in runnable:
        (package / path.name).write_bytes(path.read_bytes())
    (package / "__init__.py").write_text("", encoding="utf-8")
    completed = subprocess.run(
        [sys.executable, "-c", _DRIVER, str(tmp_path), *(path.stem for path in runnable)],
        env=child_env(DMLPATCH_DEVICE="cpu"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stderr
    results = json.loads(completed.stdout)
    assert sorted(results) == sorted(path.stem for path in runnable)
    for name, result in results.items():
        if name in CPU_RESULTS:
            assert "CUDA" in result["original"]["error"] or "NVIDIA" in result["original"]["error"]
            assert result["rewritten"] == CPU_RESULTS[name], name
        else:
            assert result["rewritten"] == result["original"]["ok"], name


@pytest.fixture
def on_device(monkeypatch: pytest.MonkeyPatch) -> Callable[[resolution.Resolution], None]:
    """Make the runtime answer for a given resolution (ours, not torch's: nothing is mocked)."""

    def use(target: resolution.Resolution) -> None:
        monkeypatch.setattr(resolution, "current", lambda: target)

    return use


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, tuple[Any, ...], dict[str, Any]]]:
    """Record every call rewritten code makes into the runtime (the real functions still run)."""
    seen: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def spy_on(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def spy(*args: Any, **kwargs: Any) -> Any:
            seen.append((name, args, kwargs))
            return original(*args, **kwargs)

        return spy

    for name in sorted(runtime.CUDA_FUNCTIONS | {"device", "cuda", "pin_memory"}):
        monkeypatch.setattr(runtime, name, spy_on(name, getattr(runtime, name)))
    return seen


def corpus_module(box: Any, stem: str) -> Any:
    box.copy(next(path for path in IDIOMS if path.stem == stem))
    box.install(stem)
    return box.load(stem)


def test_cifar_script_lands_on_the_accelerator(tmp_path: Path, on_device, calls) -> None:
    on_device(accelerator(0, 1))
    with sandbox(tmp_path) as box:
        module = corpus_module(box, "cifar_train")
        assert module.device == torch.device("privateuseone:0")
        assert calls == [("is_available", (), {}), ("device", ("cuda:0",), {})]
        calls.clear()
        assert isinstance(module.build(), torch.nn.DataParallel)
        assert calls == [("device_count", (), {})]


def test_cifar_script_on_cpu_keeps_its_cpu_path(tmp_path: Path, on_device, calls) -> None:
    on_device(cpu())
    with sandbox(tmp_path) as box:
        module = corpus_module(box, "cifar_train")
        assert module.device == torch.device("cpu")
        assert calls == [("is_available", (), {})]
        assert module.run() == box.load_plain("cifar_train").run()


def test_defaults_and_helpers_route_to_the_accelerator(tmp_path: Path, on_device, calls) -> None:
    on_device(accelerator(0))
    with sandbox(tmp_path) as box:
        module = corpus_module(box, "facexlib_style")
        assert module.init_detection_model.__defaults__ == (False, "privateuseone:0")
        assert calls == [("device", ("cuda",), {})]


def test_gpu_ids_map_onto_adapters(tmp_path: Path, on_device) -> None:
    on_device(accelerator(3, 5))
    with sandbox(tmp_path) as box:
        module = corpus_module(box, "realesrgan_style")
        assert module.RealESRGANer(2).device == torch.device("privateuseone:3")
        assert module.RealESRGANer(2, gpu_id=1).device == torch.device("privateuseone:5")
        with pytest.raises(RuntimeError, match="invalid device ordinal 2"):
            module.RealESRGANer(2, gpu_id=2)


def test_import_styles_route_to_the_accelerator(tmp_path: Path, on_device) -> None:
    on_device(accelerator(0, 1))
    with sandbox(tmp_path) as box:
        assert corpus_module(box, "import_styles").run() == {
            "available": True,
            "aliased": True,
            "count": 2,
            "imported": 2,
            "device": "privateuseone:0",
        }


def test_assigned_names_route_to_the_accelerator(tmp_path: Path, on_device) -> None:
    on_device(accelerator(0, 1))
    with sandbox(tmp_path) as box:
        module = corpus_module(box, "assignments")
        config = module.Config(index=1)
        assert [module.device, module.DEFAULT_DEVICE, config.device] == ["privateuseone:0"] * 3
        assert [config.eval_device, config.save_device] == ["privateuseone:1"] * 2
        assert config.backend == "cuda"
        assert module.parse([]).device == "privateuseone:0"
        assert module.parse(["--device", "cpu"]).device == "cpu"
        assert module.load.__defaults__ == ("privateuseone:0",)


def test_tensor_methods_call_the_runtime_with_their_arguments(
    tmp_path: Path, on_device, calls
) -> None:
    on_device(cpu())
    with sandbox(tmp_path) as box:
        module = corpus_module(box, "tensor_methods")
        assert module.run() == CPU_RESULTS["tensor_methods"]
    # runtime.cuda() moves through runtime.device(), hence the device call after each move.
    assert [
        (name, args[1:] if name in ("cuda", "pin_memory") else args, kwargs)
        for name, args, kwargs in calls
    ] == [
        ("cuda", (), {}),
        ("device", ("cuda",), {}),
        ("cuda", (0,), {}),
        ("device", (0,), {}),
        ("cuda", (), {"non_blocking": True}),
        ("device", ("cuda",), {}),
        ("pin_memory", (), {}),
        ("cuda", (), {"non_blocking": True}),
        ("device", ("cuda",), {}),
        ("device", ("cuda",), {}),
        ("device", ("cuda:0",), {}),
        ("device", ("cuda:0",), {}),
        ("device", ("cuda",), {}),
        ("device", (0,), {}),
        ("cuda", (), {}),
        ("device", ("cuda",), {}),
    ]


def test_a_bad_ordinal_points_at_the_original_line_and_column(tmp_path: Path, on_device) -> None:
    on_device(accelerator(0))
    with sandbox(tmp_path) as box:
        module = corpus_module(box, "traceback_target")
        with pytest.raises(RuntimeError, match="invalid device ordinal 3") as caught:
            module.pick(3)
    path = box.directory / "traceback_target.py"
    lines = path.read_text(encoding="utf-8").splitlines()
    line = next(n for n, text in enumerate(lines, start=1) if 'f"cuda:{index}"' in text)
    frames = traceback.extract_tb(caught.value.__traceback__)
    frame = [f for f in frames if f.filename == str(path)][-1]
    assert (frame.lineno, frame.line) == (line, lines[line - 1].strip())
    if sys.version_info >= (3, 11):  # column positions in tracebacks are new in 3.11
        assert frame.colno == lines[line - 1].index('f"cuda:{index}"')


KEEPS = """
import torch
from torch.cuda import nccl

DEVICE = 'cuda' if torch.cuda.is_available() else 'cpu'


def fused(x):
    if torch.cuda.is_available():
        return torch.cuda.jiterator._create_jit_fn('...')(x.cuda())
    return x


class Ring:
    def reduce(self, x):
        def send():
            return nccl.all_reduce(x)

        return send, x.to('cuda')

    def move(self, x):
        return x.cuda()
"""


def test_only_the_functions_that_use_an_unanswered_name_keep_cuda_s_meaning() -> None:
    result = rewrite(KEEPS)
    assert result.unanswered == ("jiterator", "nccl")
    assert result.kept == (("Ring.reduce", ("nccl",)), ("fused", ("jiterator",)))
    text = ast.unparse(result.tree)
    assert text.startswith(
        "import dmlpatch.runtime.as_written as __dmlpatch_kept__\n"
        "import dmlpatch.runtime.sites as __dmlpatch__\n"
    )
    assert "DEVICE = __dmlpatch__.device('cuda') if __dmlpatch__.is_available() else" in text
    assert "if __dmlpatch_kept__.is_available(scope='fused', uses=('jiterator',)):" in text
    assert "(__dmlpatch_kept__.cuda(x))" in text
    assert "return (send, x.to(__dmlpatch_kept__.device('cuda')))" in text
    assert "return __dmlpatch__.cuda(x)" in text
    assert [site.kind for site in rewrite(text).sites] == []


def test_a_kept_function_asks_cuda_and_says_why_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from dmlpatch import log
    from dmlpatch.runtime import as_written as runtime_as_written

    namespace = {"__name__": "lib.fused"}
    code = "def ask():\n    return is_available(scope='f', uses=('jiterator', 'nccl'))\n"
    exec(code, {**namespace, "is_available": runtime_as_written.is_available}, namespace)
    log._said.discard("as-written:lib.fused.f")
    assert namespace["ask"]() is torch.cuda.is_available() is False
    assert namespace["ask"]() is False
    assert capsys.readouterr().err == (
        "dmlpatch: warning: lib.fused.f chooses its device as under plain python: it uses "
        "torch.cuda.jiterator (and 1 more), which dmlpatch cannot answer off CUDA\n"
    )


# -- tests of the device against CUDA's name --------------------------------------------------


def test_device_tests_answer_as_on_cuda_for_the_accelerator(
    tmp_path: Path, on_device, monkeypatch: pytest.MonkeyPatch
) -> None:
    on_device(accelerator(0))
    monkeypatch.setenv("CORPUS_DEVICE", "cuda")
    with sandbox(tmp_path) as box:
        found = corpus_module(box, "device_tests").run_on([])
    assert found == {
        "eq": True,
        "ne": False,
        "str": True,
        "in": True,
        "named": True,
        "contains": True,
        "prefix": True,
        "prefixes": True,
        "table": "torch.float16",
        "get": "torch.float16",
        "display": "nccl",
        "not_cuda": False,
        "where": "privateuseone",
        "moves_model": True,
        "from_env": "privateuseone:0",
        "from_args": "privateuseone:0",
    }


def test_device_tests_on_the_cpu_answer_as_plain_python(tmp_path: Path, on_device) -> None:
    on_device(cpu())
    with sandbox(tmp_path) as box:
        module = corpus_module(box, "device_tests")
        plain = box.load_plain("device_tests")
        for argv in (["--device", "cpu"], ["--device", "cpu:0"]):
            assert module.run_on(argv) == plain.run_on(argv)
        found = module.run_on([])
    assert found["eq"] is False and found["where"] == "cpu" and found["table"] == "torch.bfloat16"


def test_a_device_named_on_the_command_line_reaches_the_accelerator(
    tmp_path: Path, on_device
) -> None:
    on_device(accelerator(0, 1))
    with sandbox(tmp_path) as box:
        module = corpus_module(box, "device_tests")
        found = module.run_on(["--device", "cuda:1"])
    assert found["from_args"] == "privateuseone:1"
    assert found["where"] == "privateuseone"
    assert found["str"] is False and found["eq"] is True  # cuda:1, as on CUDA
    assert found["moves_model"] is False  # "cuda:1" != "cuda" on CUDA too


@pytest.mark.skipif(sys.version_info < (3, 10), reason="match is Python 3.10's")
def test_match_on_the_device_type_answers_as_on_cuda(on_device) -> None:
    on_device(accelerator(0))
    source = """
        import torch
        device = torch.device("cuda")
        def kind(d):
            match d.type:
                case "cuda" | "xpu":
                    return "gpu"
                case _:
                    return "other"
        def captured(d):
            match d.type:
                case "cuda":
                    return "gpu"
                case other:
                    return other
        """
    result = rewrite(textwrap.dedent(source))
    assert [site.kind for site in result.sites] == ["device_literal", "cuda_test"]
    namespace: dict[str, Any] = {}
    exec(compile(result.tree, "<match>", "exec"), namespace)
    assert namespace["kind"](namespace["device"]) == "gpu"
    assert namespace["captured"](namespace["device"]) == "privateuseone"


def test_device_tests_alone_are_not_sites() -> None:
    assert sites_of("if x.device.type == 'cuda':\n    y = x.is_cuda\n") == []
    assert sites_of("import torch\nd = torch.device('cuda')\nok = d.type == 'cuda'\n") == [
        ("device_literal", "'cuda'"),
        ("cuda_test", "d.type == 'cuda'"),
    ]


def test_device_test_values_do_not_leave_the_test(on_device) -> None:
    on_device(accelerator(0))
    from dmlpatch.runtime import device_tests

    target = runtime.device("cuda")
    assert target == "privateuseone:0" and isinstance(target, str)
    assert device_tests.as_cuda(target) == "cuda"
    assert device_tests.as_cuda(torch.device("privateuseone:0")) == torch.device("cuda:0")
    assert device_tests.as_cuda("privateuseone:7") == "privateuseone:7"  # no ordinal maps there
    assert device_tests.as_cuda(["cpu", "privateuseone"]) == ["cpu", "cuda"]
    assert device_tests.as_cuda(torch.float16) is torch.float16
    on_cpu = torch.zeros(1)
    assert [device_tests.is_cuda(on_cpu) for _ in range(2)] == [False, False]  # answers cached
    import pickle

    # A checkpoint's configuration loads without dmlpatch.
    assert type(pickle.loads(pickle.dumps(target))) is str


def test_tests_before_a_cuda_only_library_keep_cuda_s_meaning() -> None:
    source = """
        import torch
        from mamba_ssm.ops import selective_scan_fn
        import triton.language as tl
        DEVICE = torch.device("cuda")
        def fast(x):
            if x.device.type == "cuda":
                return selective_scan_fn(x)
            return x
        def kernel(x):
            return tl.sum(x) if x.is_cuda else x
        def plain(x):
            return x.device.type == "cuda"
        """
    result = rewrite(textwrap.dedent(source))
    assert result.kept == (
        ("fast", ("mamba_ssm.ops.selective_scan_fn",)),
        ("kernel", ("triton.language",)),
    )
    code = ast.unparse(result.tree)
    assert "__dmlpatch_kept__.as_cuda(x.device.type, scope='fast'" in code
    assert "__dmlpatch_kept__.is_cuda(x)" in code
    assert "return __dmlpatch__.as_cuda(x.device.type) == 'cuda'" in code


def test_a_test_that_opens_torch_s_device_module_keeps_cuda_s_meaning() -> None:
    # transformers' caching_allocator_warmup: getattr(torch, "privateuseone").mem_get_info
    source = """
        import torch
        DEVICE = torch.device("cuda")
        def warmup(device):
            if device.type in ["cuda", "xpu"]:
                module = getattr(torch, device.type)
                return module.mem_get_info(device.index)[0]
            return 0
        def untested(device):
            return getattr(torch, device.type)
        """
    result = rewrite(textwrap.dedent(source))
    assert result.kept == (("warmup", ("torch.<device type> (getattr)",)),)
    assert [site.kind for site in result.sites] == ["device_literal", "cuda_test"]


def test_a_kept_test_that_finds_the_adapter_says_so_once(
    on_device, capsys: pytest.CaptureFixture[str]
) -> None:
    on_device(accelerator(0))
    source = """
        import torch
        try:
            from flash_attn import flash_attn_func
        except ImportError:  # as the libraries import it
            flash_attn_func = None
        DEVICE = torch.device("cuda")
        def attend(q):
            if q.device.type == "cuda":
                return flash_attn_func(q)
            return "math"
        """
    result = rewrite(textwrap.dedent(source))
    namespace: dict[str, Any] = {"__name__": "models.attention"}
    exec(compile(result.tree, "attention.py", "exec"), namespace)

    class OnAdapter:
        device = torch.device("privateuseone:0")

    assert namespace["attend"](OnAdapter()) == "math"
    assert namespace["attend"](OnAdapter()) == "math"
    assert capsys.readouterr().err.splitlines() == [
        "dmlpatch: warning: models.attention.attend tests its device as under plain python "
        "(not CUDA): it uses flash_attn.flash_attn_func, which dmlpatch cannot answer off CUDA"
    ]


def test_a_test_that_opens_cuda_s_memory_layout_stays_as_written() -> None:
    # ultralytics' trainer: "channels_last (NHWC) is CUDA-only ... numerically wrong on MPS"
    source = """
        import torch
        DEVICE = torch.device("cuda")
        def setup(model, channels_last):
            if channels_last and DEVICE.type == "cuda":
                model = model.to(memory_format=torch.channels_last)
            elif DEVICE.type == "cuda":
                model.cuda_ready = True
            return model
        """
    result = rewrite(textwrap.dedent(source))
    assert [(site.kind, site.text) for site in result.sites] == [
        ("device_literal", '"cuda"'),
        ("cuda_test", 'DEVICE.type == "cuda"'),
    ]
    code = ast.unparse(result.tree)
    assert "if channels_last and DEVICE.type == 'cuda':" in code
    assert "elif __dmlpatch__.as_cuda(DEVICE.type) == 'cuda':" in code
