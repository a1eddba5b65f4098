"""The table of torch's device parameters holds for the running torch, and the rewriter meets a
device at every one of them, positional or keyword, whatever the value."""

from __future__ import annotations

import ast
import textwrap

import pytest
import torch

from dmlpatch.rewriting import device_signatures
from dmlpatch.rewriting.transform import device_parameters, find_sites, rewrite
from dmlpatch.rewriting.transform.names import AMP, AMP_MODULES

VERSION = torch.__version__.split("+")[0]
#: Calls the amp sites take whole, device argument included.
AMP_CALLS = {f"{module}.{name}" for module in AMP_MODULES for name in AMP}


@pytest.fixture(scope="module")
def derived() -> dict[str, dict[str, device_signatures.Parameter]]:
    return device_signatures.derive(torch)


def test_the_table_was_made_from_the_running_torch_s_line(derived) -> None:
    """Regenerate with scripts/device_parameters.py under each supported torch."""
    minor = ".".join(VERSION.split(".")[:2])
    assert any(v.startswith(minor + ".") for v in device_parameters.TORCH_VERSIONS), (
        f"src/dmlpatch/rewriting/transform/device_parameters.py was not derived from torch "
        f"{minor}: run scripts/device_parameters.py"
    )


def test_every_device_parameter_of_the_running_torch_is_in_the_table(derived) -> None:
    """torch adds a device parameter: the table (and so the rewriter) must know it."""
    missing = []
    for qualified, parameters in sorted(derived.items()):
        known = {p[0]: p for p in device_parameters.CALLABLES.get(qualified, ())}
        for name, position, kind in parameters.values():
            entry = known.get(name)
            if entry is None or entry[2] != kind or (position is not None and entry[1] != position):
                missing.append(f"{qualified}({name}, position {position}, {kind})")
    assert missing == [], "run scripts/device_parameters.py: " + "; ".join(missing)


def test_the_derivation_finds_what_the_issue_names(derived) -> None:
    """The roads a device takes that were missed before: each is derived, not listed."""
    expected = {
        "torch.Generator": ("device", 0, "device"),
        "torch.load": ("map_location", 1, "map_location"),
        "torch.jit.load": ("map_location", 1, "map_location"),
        "torch.Tensor.to": ("device", 0, "device"),
        "torch.nn.Module.to": ("device", 0, "device"),
        "torch.Tensor.pin_memory": ("device", 0, "device"),
        "torch.randn": ("device", None, "device"),
        "torch.tensor": ("device", None, "device"),
        "torch.utils.data.DataLoader": ("pin_memory_device", None, "pin_memory_device"),
        "torch.get_autocast_dtype": ("device_type", 0, "device_type"),
        "torch.cuda.device": ("device", 0, "cuda_api"),
        "torch.nn.Linear": ("device", 3, "device"),
    }
    for qualified, parameter in expected.items():
        assert derived[qualified][parameter[0]] == parameter, qualified
    # Names that mention a device but hold something else are not taken.
    assert "check_device" not in derived.get("torch.testing.assert_close", {})


def test_every_kind_has_a_rule_in_the_rewriter() -> None:
    kinds = {p[2] for params in device_parameters.CALLABLES.values() for p in params}
    assert kinds <= set(device_signatures.KINDS)
    assert kinds == set(device_signatures.KINDS)


def _call(qualified: str, parameter: device_signatures.Parameter, value: str) -> str:
    name, position, _ = parameter
    owner, _, attr = qualified.rpartition(".")
    callee = f"obj.{attr}" if owner in device_parameters.METHOD_CLASSES else qualified
    arguments = f"{name}={value}" if position is None else ", ".join(["a"] * position + [value])
    return f"import torch\nimport torch.utils.data\n{callee}({arguments})\n"


#: The runtime call a value at each kind of parameter becomes: a literal, then a name.
RULES = {
    "device": ("device", "device_argument"),
    "map_location": ("device", "map_location"),
    "device_type": ("device_type", "device_type"),
    "pin_memory_device": ("pin_memory_device", "pin_memory_device"),
}


@pytest.mark.parametrize("qualified", sorted(device_parameters.CALLABLES))
def test_a_cuda_literal_and_a_name_at_each_parameter_are_rewritten(qualified: str) -> None:
    """For every callable of the table and each of its device parameters, positional where
    torch takes it so: ``"cuda"`` becomes the target at import, and a name (in the program's
    own code) goes through the runtime's check."""
    for parameter in device_parameters.CALLABLES[qualified]:
        kind = parameter[2]
        if kind in ("cuda_api", "devices") or qualified in ("torch.device", "torch.Stream"):
            continue  # the CUDA API's sites and lists: tested apart, below
        if qualified == "torch.Event" or qualified in AMP_CALLS:
            continue  # the amp sites take the whole call (dmlpatch.runtime.amp)
        if qualified.rpartition(".")[2] in ("cuda", "pin_memory"):
            continue  # x.cuda(d) and x.pin_memory(d): sites of their own, the call whole
        literal, check = RULES[kind]
        for value, runtime in (("'cuda'", literal), ("gpu", check)):
            source = _call(qualified, parameter, value)
            tree = rewrite(source, program=True).tree
            calls = [
                node
                for node in ast.walk(tree)
                if isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "__dmlpatch__"
            ]
            assert [c.func.attr for c in calls] == [runtime], (qualified, parameter, source)
            assert ast.unparse(calls[0].args[0]) == value.strip("'") or value == "'cuda'"


@pytest.mark.parametrize(
    ("snippet", "expected"),
    [
        # Positional device arguments, as diffusers' README writes its generator.
        ("torch.Generator('cuda').manual_seed(0)", [("device_literal", "'cuda'")]),
        ("torch.Generator('cuda:0')", [("device_literal", "'cuda:0'")]),
        ("from torch import Generator\nGenerator('cuda')", [("device_literal", "'cuda'")]),
        ("torch.load(f, 'cuda')", [("device_literal", "'cuda'")]),
        ("torch.jit.load(f, 'cuda:0')", [("device_literal", "'cuda:0'")]),
        ("from torch.serialization import load\nload(f, 'cuda')", [("device_literal", "'cuda'")]),
        ("from torch import nn\nnn.Linear(3, 4, True, 'cuda')", [("device_literal", "'cuda'")]),
        (
            "import torch.nn as tnn\ntnn.Conv2d(3, 4, 3, device='cuda')",
            [("device_literal", "'cuda'")],
        ),
        ("x.to(0)", [("device_literal", "0")]),
        ("torch.get_autocast_dtype('cuda')", [("device_literal", "'cuda'")]),
        (
            "from torch.utils.data import DataLoader\nDataLoader(d, pin_memory_device='cuda')",
            [("device_literal", "'cuda'")],
        ),
        (
            "torch.Stream('cuda')",
            [("cuda_api", "torch.Stream('cuda')"), ("device_literal", "'cuda'")],
        ),
        # A CUDA literal kept in a name, then handed to torch: the name at every parameter.
        ("dev = 'cuda'\nx.to(dev)", [("device_argument", "dev")]),
        ("gpu = 'cuda'\ntorch.randn(2, device=gpu)", [("device_argument", "gpu")]),
        (
            "cfg = {'dev': 'cuda'}\ntorch.empty(2, device=cfg['dev'])",
            [("device_argument", "cfg['dev']")],
        ),
        ("DEVICES = ['cuda']\nmodel.to(DEVICES[0])", [("device_argument", "DEVICES[0]")]),
        ("def run(m, where='cuda'):\n    return m.to(where)", [("device_argument", "where")]),
        ("dev = 'cuda'\ntorch.load(f, dev)", [("device_argument", "dev")]),
        (
            "dev = 'cuda'\nx.to(sys.argv[1], torch.float16)",
            [("device_argument", "sys.argv[1]")],
        ),
        # Beside another site, any value at a device parameter.
        ("x.cuda()\ny.to(z)", [("cuda_call", "x.cuda()"), ("device_argument", "z")]),
        ("x.cuda()\nf(device=d)", [("cuda_call", "x.cuda()"), ("device_argument", "d")]),
        (
            "x.cuda()\ntorch.is_autocast_enabled(kind)",
            [("cuda_call", "x.cuda()"), ("device_argument", "kind")],
        ),
    ],
)
def test_device_parameter_sites(snippet: str, expected: list[tuple[str, str]]) -> None:
    sites = find_sites(textwrap.dedent(snippet))
    assert [(site.kind, site.text) for site in sites] == expected


@pytest.mark.parametrize(
    "snippet",
    [
        # Device-agnostic code: devices handed in, never CUDA's name of its own.
        "x.to(dev)",
        "torch.zeros(2, device=x.device)",
        "model.to(device)\ntorch.load(f, map_location=device)",
        "if x.device.type == 'cuda':\n    y = x.to(dev)",
        "DTYPES = {'cuda': torch.float16}\nx.to(dev)",
        "x.to(y) if kind in ('cuda', 'xpu') else x",
        "def xp_device_type(a) -> Literal['cpu', 'cuda']:\n    return a.to(d)",
        # Never a device: dtypes, memory formats, the CPU, -1 (the CPU to the libraries).
        "x.cuda()\nx.to(torch.float16)\nx.to(y.dtype)\nx.to(memory_format=torch.channels_last)",
        "x.cuda()\nx.to(weight_dtype)\nx.to(self.compute_dtype)\nx.to(dtype)",
        "x.cuda()\ntorch.load(f, 'cpu')\nx.to('cpu')\npipeline(device=-1)",
    ],
)
def test_values_that_cannot_be_cuda_s_are_left_alone(snippet: str) -> None:
    kinds = [site.kind for site in find_sites(snippet)]
    assert "device_argument" not in kinds
    assert kinds.count("device_literal") == 0


def test_the_program_s_own_code_checks_every_value_it_hands_to_torch() -> None:
    """A script that reads its device from argv or a config says no CUDA of its own."""
    source = "import sys, torch\nx = torch.ones(2).to(sys.argv[1])\n"
    assert find_sites(source) == []
    assert [s.kind for s in rewrite(source, program=True).sites] == ["device_argument"]
    # A test alone is still device-agnostic, even in the program.
    assert rewrite("ok = x.device.type == 'cuda'\n", program=True).sites == []


# -- the runtime's check ---------------------------------------------------------------------


def test_the_check_answers_cuda_s_names_and_passes_everything_else(monkeypatch) -> None:
    from corpus._harness import accelerator, cpu
    from dmlpatch.devices import resolution
    from dmlpatch.runtime import sites as runtime

    monkeypatch.setattr(resolution, "current", lambda: accelerator(0))
    for cuda in ("cuda", "cuda:0", 0, torch.device("cuda"), torch.device("cuda", 0)):
        assert str(runtime.device_argument(cuda)) == "privateuseone:0", cuda
    tensor = torch.ones(1)
    for other in (None, "cpu", -1, torch.float16, tensor, torch.device("cpu"), True, [0]):
        assert runtime.device_argument(other) is other, other
    assert runtime.map_location({"cuda:1": "cuda:0", "cpu": "cpu"}) == {
        "cuda:1": "privateuseone:0",
        "cpu": "cpu",
    }
    assert runtime.map_location("cpu") == "cpu"
    assert runtime.device_type("cuda") == "privateuseone"
    assert runtime.device_type("cpu") == "cpu"
    assert runtime.pin_memory_device("cuda") == ""
    # Under --device cpu CUDA's names are the CPU, as where dmlpatch chose it.
    monkeypatch.setattr(resolution, "current", cpu)
    assert runtime.device_argument("cuda:0") == "cpu"
    assert runtime.device_type("cuda") == "cuda"


@pytest.mark.parametrize("qualified", sorted(device_parameters.CALLABLES))
def test_a_function_kept_as_written_finds_every_name_its_sites_call(qualified: str) -> None:
    """Sites of a function that keeps CUDA's meaning call ``dmlpatch.runtime.as_written``:
    each name the rewriter emits must be there, doing what the call as written did (anything
    else falls through to ``torch.cuda`` and fails)."""
    from dmlpatch.runtime import as_written

    if qualified.startswith("torch.accelerator.") and not hasattr(torch, "accelerator"):
        return  # torch 2.4.1 has none: nothing to find
    for parameter in device_parameters.CALLABLES[qualified]:
        for value in ("'cuda'", "gpu"):
            source = _call(qualified, parameter, value)
            tree = rewrite(source, runtime="dmlpatch.runtime.as_written", program=True).tree
            for node in ast.walk(tree):
                if isinstance(node, ast.Attribute) and getattr(node.value, "id", "") == (
                    "__dmlpatch__"
                ):
                    # torch.cuda's own names (and torch.accelerator) are the real ones there.
                    assert getattr(as_written, node.attr, None) is not None, (node.attr, source)
