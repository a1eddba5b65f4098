"""Reach: CUDA choices honoured wherever they are written, under every entry point.

A multi-module project whose device is chosen in its own package (``utils.get_device()``, a
``model.cuda()`` in another module, the script's own ``torch.device('cuda' if ...)``) trains on
the simulated device with losses equal to a plain CPU run — next to the script, installed
editable and installed into site-packages (real pip, into a throw-away venv), under the runner,
``import dmlpatch.auto`` and activation (``python train.py``, ``python -m projpkg.train``, a
console script). A third-party library nobody wrote a spec for is rewritten by discovery; scopes
narrow it; a spec's ``[[leave]]`` leaves a module alone and an unanswered CUDA call the function
that makes it, each with one line;
nothing in site-packages changes.
"""

from __future__ import annotations

import json
import os
import shutil
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from support import Result, clean_env, file_stamps, linked_venv, run_python, written_between

UTILS = """
    import torch


    def get_device():
        return torch.device('cuda' if torch.cuda.is_available() else 'cpu')
    """

MODEL = """
    import torch
    from torch import nn


    def build():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
        if torch.cuda.is_available():
            model.cuda()
        return model
    """

TRAIN = """
    import torch

    from projpkg.model import build
    from projpkg.utils import get_device


    def main():
        device = get_device()
        own = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        model = build()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        generator = torch.Generator().manual_seed(1)
        inputs = torch.randn(32, 8, generator=generator)
        targets = torch.randint(0, 2, (32,), generator=generator)
        for step in range(3):
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(inputs.to(device)), targets.to(own))
            loss.backward()
            optimizer.step()
            print(f"loss {step} {loss.item():.6f}")
        print("device", device, own, next(model.parameters()).device)


    if __name__ == "__main__":
        main()
    """

PYPROJECT = """
    [build-system]
    requires = ["setuptools>=61"]
    build-backend = "setuptools.build_meta"

    [project]
    name = "projpkg"
    version = "0.1"

    [project.scripts]
    projpkg-train = "projpkg.train:main"

    [tool.setuptools]
    packages = ["projpkg"]
    """

ON_DEVICE = "device privateuseone:0 privateuseone:0 privateuseone:0"


def _write_tree(root: Path, files: dict[str, str]) -> None:
    for relative, content in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(content).lstrip("\n"), encoding="utf-8")


def _project(root: Path) -> Path:
    _write_tree(
        root,
        {
            "pyproject.toml": PYPROJECT,
            "projpkg/__init__.py": "",
            "projpkg/utils.py": UTILS,
            "projpkg/model.py": MODEL,
            "projpkg/train.py": TRAIN,
        },
    )
    return root


def _losses(result: Result) -> list[float]:
    return [float(line.split()[2]) for line in result.out.splitlines() if line.startswith("loss")]


def _assert_like_cpu(result: Result, cpu: Result) -> None:
    assert result.code == 0, result.err
    assert ON_DEVICE in result.out, result.out + result.err
    assert len(_losses(cpu)) == 3
    assert _losses(result) == pytest.approx(_losses(cpu), abs=1e-5)


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory: pytest.TempPathFactory) -> Result:
    root = _project(tmp_path_factory.mktemp("cpu"))
    script = root / "train.py"
    shutil.copy(root / "projpkg" / "train.py", script)
    result = run_python([str(script)], cwd=root)
    assert result.code == 0, result.err
    assert "device cpu cpu cpu" in result.out
    return result


def _pip(python: str, *args: str) -> None:
    result = run_python(
        ["-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", *args],
        python=python,
        timeout=300,
    )
    assert result.code == 0, result.err


class Placement:
    """A venv where ``projpkg`` is importable one way, and a script that uses it."""

    def __init__(self, python: str, purelib: Path, script: Path) -> None:
        self.python = python
        self.purelib = purelib
        self.script = script


@pytest.fixture(scope="module")
def placements(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Placement]]:
    """The project next to its script, installed editable, and installed into site-packages."""
    made: dict[str, Placement] = {}
    venvs = [linked_venv() for _ in range(3)]
    try:
        (local_python, local_lib), (editable_python, editable_lib), (site_python, site_lib) = (
            next(v) for v in venvs
        )
        local = _project(tmp_path_factory.mktemp("local"))
        shutil.copy(local / "projpkg" / "train.py", local / "train.py")
        made["local"] = Placement(local_python, local_lib, local / "train.py")
        editable = _project(tmp_path_factory.mktemp("editable"))
        _pip(editable_python, "--editable", str(editable))
        # Scripts live apart from the package: only the installed copy can provide it.
        script = tmp_path_factory.mktemp("editable-script") / "train.py"
        shutil.copy(editable / "projpkg" / "train.py", script)
        made["editable"] = Placement(editable_python, editable_lib, script)
        source = _project(tmp_path_factory.mktemp("site"))
        _pip(site_python, str(source))
        script = tmp_path_factory.mktemp("site-script") / "train.py"
        shutil.copy(source / "projpkg" / "train.py", script)
        shutil.rmtree(source)
        made["site-packages"] = Placement(site_python, site_lib, script)
        yield made
    finally:
        for generator in venvs:
            generator.close()


def _site_stamps(purelib: Path) -> dict[str, tuple[int, int]]:
    stamps = file_stamps(purelib)
    return {path: stamp for path, stamp in stamps.items() if "__pycache__" not in path}


ENTRY_POINTS = [
    "runner",
    "auto",
    "activated: python train.py",
    "activated: python -m projpkg.train",
    "activated: console script",
]


#: A project next to its script has no console script; every other pair is run.
CASES = [
    (placement, entry)
    for placement in ("local", "editable", "site-packages")
    for entry in ENTRY_POINTS
    if not (placement == "local" and entry.endswith("console script"))
]


@pytest.mark.parametrize(("placement", "entry"), CASES)
def test_every_entry_point_reaches_the_projects_own_modules(
    placements: dict[str, Placement], cpu_run: Result, placement: str, entry: str, tmp_path: Path
) -> None:
    where = placements[placement]
    python, script = where.python, where.script
    report = tmp_path / "report.json"
    env = clean_env(DMLPATCH_REPORT=str(report))
    cwd = script.parent
    before = _site_stamps(where.purelib)
    activated = entry.startswith("activated")
    if activated:
        done = run_python(["-m", "dmlpatch", "activate", "--device", "sim"], python=python)
        assert done.code == 0, done.err
    try:
        if entry == "runner":
            result = run_python(
                ["-m", "dmlpatch", "--device", "sim", str(script)], python=python, env=env, cwd=cwd
            )
        elif entry == "auto":
            auto = tmp_path / "train_auto.py"
            text = script.read_text(encoding="utf-8")
            auto.write_text(f'"""Trains."""\nimport dmlpatch.auto\n{text}', encoding="utf-8")
            env.update(DMLPATCH_DEVICE="sim", PYTHONPATH=str(script.parent))
            result = run_python([str(auto)], python=python, env=env, cwd=tmp_path)
        elif entry.endswith("python train.py"):
            result = run_python([str(script)], python=python, env=env, cwd=cwd)
        elif entry.endswith("-m projpkg.train"):
            result = run_python(["-m", "projpkg.train"], python=python, env=env, cwd=cwd)
        else:
            command = str(Path(python).parent / "projpkg-train")
            result = run_python([], python=command, env=env, cwd=tmp_path)
    finally:
        if activated:
            run_python(["-m", "dmlpatch", "deactivate"], python=python)
    _assert_like_cpu(result, cpu_run)
    data = json.loads(report.read_text())
    assert (data["device"], data["scope"]) == ("privateuseone:0", "all")
    modules = {entry["module"]: entry["by"] for entry in data["rewritten"]}
    assert modules["projpkg.utils"] == modules["projpkg.model"] == "discovered"
    runs_script = not entry.endswith(("-m projpkg.train", "console script"))
    assert (modules.get("__main__") == "main script") == runs_script
    assert written_between(before, _site_stamps(where.purelib)) == []


@pytest.fixture(scope="module")
def venv(placements: dict[str, Placement]) -> tuple[str, Path]:
    """The venv without the project: for the tests below."""
    return placements["local"].python, placements["local"].purelib


def test_auto_after_other_statements_says_the_script_stays_as_written(
    venv: tuple[str, Path], tmp_path: Path
) -> None:
    python, _ = venv
    script = tmp_path / "late.py"
    script.write_text(
        "import torch\nprint('started')\nimport dmlpatch.auto\n"
        "print(torch.device('cuda' if torch.cuda.is_available() else 'cpu'))\n",
        encoding="utf-8",
    )
    result = run_python([str(script)], python=python, env=clean_env(DMLPATCH_DEVICE="sim"))
    assert result.code == 0, result.err
    assert result.out == "started\ncpu\n"
    assert result.err_lines == [
        "dmlpatch: warning: late.py runs code before `import dmlpatch.auto` (line 3), so its "
        "own 2 CUDA site(s) stay as written; make it the first statement, or run: python -m "
        "dmlpatch late.py"
    ]


def test_auto_keeps_the_programs_traceback_and_exit_status(
    venv: tuple[str, Path], tmp_path: Path
) -> None:
    python, _ = venv
    script = tmp_path / "fails.py"
    script.write_text(
        "import dmlpatch.auto\nimport sys\nimport torch\n"
        "device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')\n"
        "if sys.argv[1:] == ['exit']:\n    sys.exit(f'bye from {device}')\n"
        "raise ValueError(f'failed on {device}')\n",
        encoding="utf-8",
    )
    env = clean_env(DMLPATCH_DEVICE="sim")
    running = (
        "dmlpatch: running on privateuseone:0 (Simulated Radeon (discrete)): requested sim: "
        "simulated DirectML device, profile torch-directml-0.2.5"
    )
    failed = run_python([str(script)], python=python, env=env)
    assert failed.code == 1
    assert failed.err_lines == [
        running,  # the program asked for CUDA and got the device: said as the runner says it
        "Traceback (most recent call last):",
        f'  File "{script}", line 7, in <module>',
        "    raise ValueError(f'failed on {device}')",
        "ValueError: failed on privateuseone:0",
    ]
    exited = run_python([str(script), "exit"], python=python, env=env)
    assert (exited.code, exited.err_lines) == (1, [running, "bye from privateuseone:0"])


LIBRARY = {
    "cudalib/__init__.py": """
        from cudalib.core import DEVICE, Net, load
        """,
    "cudalib/core.py": """
        import torch
        from torch import nn

        DEVICE = 'cuda' if torch.cuda.is_available() else 'cpu'


        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                torch.manual_seed(0)
                self.layer = nn.Linear(4, 3)
                self.register_buffer('offset', torch.ones(3, device=DEVICE))

            def forward(self, x):
                return self.layer(x) + self.offset


        def load(device='cuda'):
            net = Net().to(device if torch.cuda.is_available() else 'cpu')
            return net.eval()
        """,
}

LEAVE_SPEC = """
[package]
name = "cudalib"
versions = ">=1"
[[leave]]
modules = ["cudalib"]
why = "cudalib chooses its device with a private backend probe"
"""

USES_LIBRARY = """
import torch
import cudalib
net = cudalib.load()
with torch.no_grad():
    out = net(torch.ones(2, 4, device=next(net.parameters()).device))
print(cudalib.DEVICE, next(net.parameters()).device, out.device, round(out.sum().item(), 5))
"""


@pytest.fixture(scope="module")
def library(venv: tuple[str, Path], tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """cudalib 1.0 installed into the venv's site-packages; (python, a script that uses it)."""
    python, purelib = venv
    info = purelib / "cudalib-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: cudalib\nVersion: 1.0\n")
    _write_tree(purelib, LIBRARY)
    script = tmp_path_factory.mktemp("uses") / "uses.py"
    script.write_text(USES_LIBRARY, encoding="utf-8")
    return python, script


def _run(library: tuple[str, Path], *options: str, **env: str) -> Result:
    python, script = library
    return run_python(
        ["-m", "dmlpatch", *options, str(script)], python=python, env=clean_env(**env)
    )


def test_a_library_without_a_spec_is_rewritten_by_discovery(
    library: tuple[str, Path], tmp_path: Path
) -> None:
    python, script = library
    plain = run_python([str(script)], python=python)
    assert plain.code == 0, plain.err
    assert plain.out.startswith("cpu cpu cpu ")
    report = tmp_path / "report.json"
    result = _run(library, "--device", "sim", f"--report={report}")
    assert result.code == 0, result.err
    total = plain.out.split()[-1]
    assert result.out == f"privateuseone:0 privateuseone:0 privateuseone:0 {total}\n"
    data = json.loads(report.read_text())
    # DEVICE and 'cuda' chosen by availability, and the two values handed to torch that may
    # hold them (torch.ones(..., device=DEVICE), .to(device if ... else 'cpu')).
    assert {"module": "cudalib.core", "sites": 6, "cached": False, "by": "discovered"} in (
        data["rewritten"]
    )


@pytest.mark.parametrize("scope", ["project", "specs"])
def test_narrower_scopes_leave_site_libraries_alone(
    library: tuple[str, Path], scope: str, tmp_path: Path
) -> None:
    report = tmp_path / "report.json"
    result = _run(library, "--device", "sim", "--scope", scope, f"--report={report}")
    assert result.code == 0, result.err
    assert result.out.startswith("cpu cpu cpu ")
    data = json.loads(report.read_text())
    assert data["scope"] == scope
    # The library is left alone; the script's own device argument (device=...device, a value
    # handed to torch in the program's code) is checked where it runs, as in every scope.
    assert [(entry["module"], entry["sites"]) for entry in data["rewritten"]] == [("__main__", 1)]


def test_scope_project_still_reaches_the_programs_own_modules(
    placements: dict[str, Placement], cpu_run: Result
) -> None:
    python, script = placements["local"].python, placements["local"].script
    env = clean_env(DMLPATCH_SCOPE="project")
    result = run_python(["-m", "dmlpatch", "--device", "sim", str(script)], python=python, env=env)
    _assert_like_cpu(result, cpu_run)
    probe = script.parent / "probe.py"
    probe.write_text(
        "import torch\nfrom projpkg.utils import get_device\n"
        "print(get_device(), torch.device('cuda' if torch.cuda.is_available() else 'cpu'))\n",
        encoding="utf-8",
    )
    narrow = run_python(
        ["-m", "dmlpatch", "--device", "sim", "--scope", "specs", str(probe)],
        python=python,
        env=clean_env(),
    )
    # The script's own line is still rewritten; the package's are not.
    assert (narrow.code, narrow.out) == (0, "cpu privateuseone:0\n"), narrow.err


def test_a_spec_can_leave_a_library_alone_with_one_line(
    library: tuple[str, Path], tmp_path: Path
) -> None:
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "cudalib.toml").write_text(LEAVE_SPEC, encoding="utf-8")
    result = _run(library, "--device", "sim", DMLPATCH_PATCHES=str(specs))
    assert result.code == 0, result.err
    assert result.out.startswith("cpu cpu cpu ")
    left, on_cpu = [line for line in result.err_lines if "warning" in line]
    assert left == (
        "dmlpatch: warning: cudalib.core left unrewritten: patch spec 'cudalib' keeps dmlpatch "
        "out of cudalib (cudalib chooses its device with a private backend probe); its own "
        "device choices stay as under plain python"
    )
    # So its model ran on the CPU, which the run says at exit, naming the spec's reason.
    assert "100% of model compute" in on_cpu and "not on privateuseone:0" in on_cpu
    assert (
        "in module cudalib.core, which dmlpatch did not rewrite: left alone by the spec: "
        "cudalib chooses its device with a private backend probe" in on_cpu
    )


UNANSWERED = {
    "gpuinfo/__init__.py": """
        import torch

        from gpuinfo import streams


        def pick():
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")


        def replay():
            if not torch.cuda.is_available():
                return "cpu"
            torch.cuda.manual_seed_all(7)
            seeded = torch.randn(4, device="cuda")
            state = torch.cuda.get_rng_state()
            first = torch.rand(3, device="cuda")
            torch.cuda.set_rng_state(state)
            again = torch.rand(3, device="cuda")
            same = torch.equal(first, again)
            return f"{seeded.device} {seeded.tolist()} {len(state)}-byte state, replayed {same}"


        def kernel():
            if torch.cuda.is_available():
                return torch.cuda.jiterator._create_jit_fn("template <typename T> T f(T x) {}")
            return "cpu"
        """,
    "gpuinfo/streams.py": """
        import torch


        def capture(device='cuda'):
            return torch.cuda.CUDAGraph()
        """,
}

INFO = """
import torch
import gpuinfo

print(gpuinfo.pick())
if torch.cuda.is_available():
    print(gpuinfo.replay())
else:
    torch.manual_seed(7)
    print("cpu", torch.randn(4).tolist(), "(oracle)")
print(gpuinfo.kernel())
try:
    gpuinfo.streams.capture()
except RuntimeError as error:
    print(str(error).partition(";")[0])
"""


def test_only_the_function_dmlpatch_cannot_make_consistent_keeps_cuda_s_meaning(
    tmp_path: Path, fake_distribution
) -> None:
    """Per function: kernel() uses torch.cuda.jiterator, which nothing answers off CUDA, so it
    chooses the CPU as under plain python (one line says so); the rest of its module runs on
    the device, the RNG family on the device's generator (a get_rng_state round trip, seeds
    equal to the CPU's), and CUDA graphs fail with a clear error instead of losing the module."""
    site = fake_distribution("gpuinfo", "1.0", UNANSWERED)
    script = tmp_path / "info.py"
    script.write_text(INFO, encoding="utf-8")
    env = clean_env(PYTHONPATH=str(site))
    plain = run_python([str(script)], env=env)
    report = tmp_path / "report.json"
    result = run_python(
        ["-m", "dmlpatch", "--device", "sim", f"--report={report}", str(script)], env=env
    )
    assert result.code == 0, result.err
    device, replayed, kernel, graph = result.out.splitlines()
    oracle = plain.out.splitlines()[1]
    assert (device, kernel) == ("privateuseone:0", "cpu")
    assert replayed.startswith("privateuseone:0 " + oracle.split(" ", 1)[1].rpartition(" ")[0])
    assert replayed.endswith(" 5056-byte state, replayed True")
    assert graph == (
        "torch.cuda.CUDAGraph: CUDA graphs have no DirectML counterpart (nothing replays a "
        "captured graph there)"
    )
    # gpuinfo.streams has no function that asks where to run: nothing to say about it.
    assert [line for line in result.err_lines if "warning" in line] == [
        "dmlpatch: warning: gpuinfo.kernel chooses its device as under plain python: it uses "
        "torch.cuda.jiterator, which dmlpatch cannot answer off CUDA"
    ]
    data = json.loads(report.read_text())
    assert data["kept_as_written"] == [
        {
            "module": "gpuinfo.kernel",
            "reason": "uses torch.cuda.jiterator, not answered: its sites keep CUDA's meaning "
            "(the rest of the module is rewritten)",
        },
    ]
    assert {entry["module"]: entry["sites"] for entry in data["rewritten"]} == {
        "__main__": 1,
        "gpuinfo": 10,
        "gpuinfo.streams": 2,
    }


def test_warm_discovery_reads_no_source_without_sites(
    library: tuple[str, Path], tmp_path: Path
) -> None:
    """The second run takes every verdict from the index: nothing is parsed again."""
    python, script = library
    env = clean_env(DMLPATCH_CACHE_DIR=str(tmp_path / "cache"))
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import dmlpatch.rewriting.discovery as d\n"
        "calls = []\n"
        "original = d._examine\n"
        "d._examine = lambda *args: calls.append(args) or original(*args)\n"
        "import atexit, runpy, sys\n"
        "atexit.register(lambda: sys.stderr.write(f'examined {len(calls)}\\n'))\n"
        f"runpy.run_path({str(script)!r})\n",
        encoding="utf-8",
    )
    cold = run_python(["-m", "dmlpatch", "--device", "cpu", str(probe)], python=python, env=env)
    warm = run_python(["-m", "dmlpatch", "--device", "cpu", str(probe)], python=python, env=env)
    assert cold.code == warm.code == 0, cold.err + warm.err
    examined = [int(line.split()[1]) for line in cold.err_lines if line.startswith("examined")]
    assert examined and examined[0] >= 2  # cudalib and cudalib.core at least
    assert "examined 0" in warm.err_lines
    assert os.listdir(tmp_path / "cache" / "discovery")


#: CUDA chosen into names that do not say "device", and into the program's own functions.
IDIOMS = """
    import json
    import torch


    def run(model, where):
        model.to(where)
        return str(model(torch.ones(1, 4).to(where)).device)


    dev = "cuda" if torch.cuda.is_available() else "cpu"
    gpu = "cpu"
    if torch.cuda.is_available():
        gpu = "cuda:0"
    model = torch.nn.Linear(4, 2)
    print(json.dumps({
        "dev": str(torch.ones(1).to(dev).device),
        "gpu": str(torch.zeros(2, device=gpu).device),
        "argument": run(model, "cuda" if torch.cuda.is_available() else "cpu"),
        "said": "using " + ("cuda" if torch.cuda.is_available() else "cpu"),
    }))
    """


def test_cuda_chosen_into_any_name_or_argument(tmp_path: Path) -> None:
    """``dev = 'cuda' if torch.cuda.is_available() else 'cpu'``: once is_available() says yes,
    the literal it chose must be the device too, or the program dies ('Found no NVIDIA
    driver') where plain python ran on the CPU."""
    script = tmp_path / "idioms.py"
    script.write_text(textwrap.dedent(IDIOMS))
    plain = run_python([str(script)], env=clean_env())
    assert plain.code == 0, plain.err
    assert json.loads(plain.out) == {
        "dev": "cpu",
        "gpu": "cpu",
        "argument": "cpu",
        "said": "using cpu",
    }
    patched = run_python(["-m", "dmlpatch", "--device", "sim", str(script)], env=clean_env())
    assert patched.code == 0, patched.err
    assert json.loads(patched.out) == {
        "dev": "privateuseone:0",
        "gpu": "privateuseone:0",
        "argument": "privateuseone:0",
        "said": "using privateuseone:0",
    }


SAVE_AS_ON_CUDA = """
    import sys, torch, torch.serialization as serialization

    # What a CUDA machine writes: every storage tagged with its GPU.
    serialization.location_tag = lambda storage: "cuda:0"
    torch.save({"weight": torch.arange(6.0).reshape(2, 3)}, sys.argv[1])
    """

LOAD = """
    import sys, torch

    model = torch.nn.Linear(3, 2)
    if torch.cuda.is_available():
        model.cuda()
    state = torch.load(sys.argv[1])
    model.weight.data.copy_(state["weight"])
    print(state["weight"].device, next(model.parameters()).device, model.weight.sum().item())
    """


def test_a_checkpoint_saved_on_a_gpu_loads_onto_the_device(tmp_path: Path) -> None:
    """Released weights are often saved from a GPU; plain ``torch.load(f)`` restores them on
    CUDA, or fails without it. Rewritten, it restores them on the device dmlpatch chose."""
    checkpoint = tmp_path / "weights.pt"
    saver, loader = tmp_path / "save.py", tmp_path / "load.py"
    saver.write_text(textwrap.dedent(SAVE_AS_ON_CUDA))
    loader.write_text(textwrap.dedent(LOAD))
    assert run_python([str(saver), str(checkpoint)], env=clean_env()).code == 0
    plain = run_python([str(loader), str(checkpoint)], env=clean_env())
    assert plain.code == 1
    assert "Attempting to deserialize object on a CUDA device" in plain.err
    patched = run_python(
        ["-m", "dmlpatch", "--device", "sim", str(loader), str(checkpoint)], env=clean_env()
    )
    assert patched.code == 0, patched.err
    assert patched.out.split() == ["privateuseone:0", "privateuseone:0", "15.0"]
    on_cpu = run_python(
        ["-m", "dmlpatch", "--device", "cpu", str(loader), str(checkpoint)], env=clean_env()
    )
    assert on_cpu.code == 0, on_cpu.err
    assert on_cpu.out.split() == ["cpu", "cpu", "15.0"]
