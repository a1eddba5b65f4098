"""A peer's own test suite on the simulated DirectML device, compared test by test with the CPU.

kornia's suite takes a device option (``--device cpu`` / ``--device cuda``; its conftest picks
``torch.device("cuda:0")`` when ``torch.cuda.is_available()``), so the same test files run once
under plain pytest on the CPU and once under ``python -m dmlpatch --device sim -m pytest`` with
``--device cuda``, which dmlpatch's pytest plugin sends to the device. torchvision's suite has
no such option: its tests are parametrized over ``cpu_and_cuda()`` (``"cpu"`` and
``pytest.param("cuda", marks=pytest.mark.needs_cuda)``, skipped without CUDA), so both runs are
the same command, and a ``[...-cuda]`` test on the device is compared with the same test's
``[...-cpu]`` on the CPU (tests with no device parameter with themselves). The script prints how
many tests pass on the CPU, how many of those pass on the device (the pass rate), the device's
failures grouped by cause, and the operators DirectML's CPU fallback still ran (the run's
dmlpatch report, ``ops.fallback``)::

    python benchmarks/peer_suite.py --source KORNIA_CHECKOUT [--version 0.8.3] [MODULE ...]
    python benchmarks/peer_suite.py --suite torchvision --source VISION_CHECKOUT [MODULE ...]

``KORNIA_CHECKOUT`` is kornia's repository at the installed version's tag (``git clone --depth 1
--branch v0.8.3 https://github.com/kornia/kornia``; its PyPI sdist ships no tests). kornia is
installed with ``--no-deps`` into ``.cache/peer/kornia-VERSION`` beside the venv (the venv's torch
is kept: ``-c scripts/torch-pin.txt``), and the test files are copied to
``.cache/peer/kornia-VERSION-run``, where they run (kornia's conftest makes a ``weights/``
directory in the working directory); the checkout is only read. ``VISION_CHECKOUT`` is
torchvision's repository at the venv's torchvision's tag (``v0.29.1``; its wheels ship no tests),
whose ``pytest.ini`` and ``test/`` are copied to ``.cache/peer/torchvision-VERSION-run``; the
venv's torchvision runs. MODULEs are paths in the checkout (``test/test_ops.py``,
``tests/geometry``, or a node id); the defaults are the suite's below. ``-k EXPR`` selects tests
as pytest's does.

``--identity`` also runs the suite as on a machine with no device, twice: under ``python -m
dmlpatch --device cpu -m pytest`` and under plain ``python -m pytest`` in an activated
environment (a throw-away venv linked to this one, ``dmlpatch activate`` with its default
device, ``auto``, which finds none here): each run's pass/fail set must be plain python's, test
for test; the differences are printed.
Not part of the CI suite.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import venv
import xml.etree.ElementTree as ElementTree
from collections import Counter
from pathlib import Path
from typing import Callable, NamedTuple, Optional

from dmlpatch.environment_variables import DMLPATCH_REPORT

REPO = Path(__file__).resolve().parents[1]
PIN = REPO / "scripts" / "torch-pin.txt"
#: kornia's modules that need no network, weights or optional packages.
KORNIA_MODULES = (
    "tests/geometry",
    "tests/color",
    "tests/filters",
    "tests/enhance",
    "tests/morphology",
    "tests/losses",
    "tests/metrics",
    "tests/feature",
    "tests/image",
    "tests/core",
)
#: The kornia-rs release installed beside kornia (kornia needs ``kornia-rs>=0.1.9``).
KORNIA_RS = "kornia-rs==0.2.0"
#: torchvision's operator tests: the first of its suite to run on a device.
TORCHVISION_MODULES = ("test/test_ops.py",)


class Outcome(NamedTuple):
    status: str  # passed, failed, error, skipped
    cause: str  # the exception's first line, for a failure or an error


class Run(NamedTuple):
    """One run of the suite: its name, what comes between the interpreter and ``-m pytest``,
    the interpreter (another venv's, for the activated run) and its environment."""

    label: str
    prefix: list[str]
    python: str
    env: dict[str, str]


class Suite(NamedTuple):
    """How a peer's suite is set up and run: its release (when none is given), its default
    modules, the checkout's test files copied where they run and the environment they need,
    and the options that put its tests on the CPU or on CUDA (none: parametrized)."""

    version: Callable[[], str]
    modules: tuple[str, ...]
    prepare: Callable[[Path, str], Path]
    environment: Callable[[str], dict[str, str]]
    device_options: Callable[[str], list[str]]


def _fail(message: str) -> None:
    print(f"peer_suite: {message}", file=sys.stderr)
    raise SystemExit(2)


def _install(version: str) -> Path:
    target = REPO / ".cache" / "peer" / f"kornia-{version}"
    if (target / "kornia").is_dir():
        return target
    print(f"installing kornia {version} into {target.relative_to(REPO)} ...", flush=True)
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    command += ["--no-deps", "-c", str(PIN), "--target", str(target), f"kornia=={version}"]
    if subprocess.run([*command, KORNIA_RS], check=False).returncode != 0:
        shutil.rmtree(target, ignore_errors=True)
        _fail(f"pip could not install kornia {version}")
    return target


def _copy(
    source: Path, name: str, version: str, files: tuple[str, ...], dirs: tuple[str, ...]
) -> Path:
    """The checkout's ``files`` and ``dirs``, copied to ``.cache/peer/NAME-VERSION-run``."""
    for needed in (*files, *dirs):
        if not (source / needed).exists():
            _fail(f"{source} has no {needed}: pass {name}'s repository at tag v{version}")
    work = REPO / ".cache" / "peer" / f"{name}-{version}-run"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    for file in files:
        shutil.copy2(source / file, work / file)
    for directory in dirs:
        shutil.copytree(
            source / directory, work / directory, ignore=shutil.ignore_patterns("__pycache__")
        )
    return work


def _prepare_kornia(source: Path, version: str) -> Path:
    said = re.search(r'__version__ = "([^"]+)"', _read(source / "kornia" / "__init__.py"))
    if said and said.group(1) != version:
        _fail(f"{source} is kornia {said.group(1)}, the installed kornia is {version}")
    return _copy(source, "kornia", version, ("conftest.py", "pyproject.toml"), ("tests", "testing"))


def _prepare_torchvision(source: Path, version: str) -> Path:
    said = _read(source / "version.txt").strip()
    if said and not said.startswith(version.split("+")[0]):
        _fail(f"{source} is torchvision {said}, the installed torchvision is {version}")
    # pytest.ini makes the copy pytest's rootdir, with torchvision's own options.
    return _copy(source, "torchvision", version, ("pytest.ini",), ("test",))


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8") if path.is_file() else ""


def _kornia_environment(version: str) -> dict[str, str]:
    kornia = _install(version)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(kornia), env.get("PYTHONPATH")) if p)
    # kornia's conftest deselects compile tests without it; keep it so in both runs.
    env.pop("KORNIA_TEST_OPTIMIZER", None)
    return env


def _torchvision_version() -> str:
    import torchvision

    return str(torchvision.__version__).split("+")[0]


SUITES = {
    "kornia": Suite(
        lambda: "0.8.3",
        KORNIA_MODULES,
        _prepare_kornia,
        _kornia_environment,
        lambda device: ["--device", device],
    ),
    "torchvision": Suite(
        _torchvision_version,
        TORCHVISION_MODULES,
        _prepare_torchvision,
        lambda version: dict(os.environ),
        lambda device: [],
    ),
}


def _run(run: Run, options: list[str], work: Path) -> tuple[Path, float]:
    junit = work / f"{run.label}.xml"
    command = [run.python, *run.prefix, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    command += ["--no-header", "--color=no", f"--junitxml={junit}", *options]
    print(f"{run.label}: {' '.join(command[1:])}", flush=True)
    start = time.perf_counter()
    with open(work / f"{run.label}.log", "w", encoding="utf-8") as log:
        subprocess.run(
            command, cwd=work, env=run.env, stdout=log, stderr=subprocess.STDOUT, check=False
        )
    if not junit.is_file():
        _fail(f"the {run.label} run wrote no results; see {work / (run.label + '.log')}")
    return junit, time.perf_counter() - start


def _activated(root: Path) -> str:
    """A throw-away venv under ``root`` that sees this one's packages through one .pth, then
    ``dmlpatch activate`` in it with the default device: its interpreter."""
    venv.EnvBuilder(with_pip=False).create(root)
    python = str(root / "bin" / "python")
    paths = [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]
    purelib = Path(subprocess.run(paths, capture_output=True, text=True, check=True).stdout.strip())
    import site

    ours = [p for p in site.getsitepackages() if Path(p).is_dir()]
    (purelib / "_peer_link.pth").write_text(
        "".join(f"import site; site.addsitedir({p!r})\n" for p in ours)
    )
    subprocess.run([python, "-m", "dmlpatch", "activate"], check=True)
    return python


_DEVICE_PARAMETER = re.compile(r"(?<=[\[-])(cpu|cuda)(?=[-\]])")


def _outcomes(junit: Path, device: str = "") -> dict[str, Outcome]:
    """Each test's outcome, by an id that names no device (``[cuda-float32]`` is
    ``[DEVICE-float32]``); where two tests have that id, the one parametrized with ``device``
    (``[cpu-...]`` in the CPU's run, ``[cuda-...]`` in the device's). Without ``device``, by
    the test's own id."""
    found: dict[str, Outcome] = {}
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        name = case.get("name", "")
        own = not device or name == _DEVICE_PARAMETER.sub(device, name)
        name = _DEVICE_PARAMETER.sub("DEVICE", name) if device else name
        test = f"{case.get('classname', '')}::{name}"
        status, cause = "passed", ""
        for child in case:
            if child.tag in ("failure", "error"):
                status = "failed" if child.tag == "failure" else "error"
                cause = _cause(child.get("message") or "", child.text or "")
            elif child.tag == "skipped":
                status = "skipped"
        if own or test not in found:
            found[test] = Outcome(status, cause)
    return found


#: The first line of an error TorchScript re-raises: the cause is the error it wraps.
_TORCHSCRIPT = "The following operation failed in the TorchScript interpreter."
_RAISED = re.compile(r"^E\s+(\w+(Error|Exception): .*)$", re.MULTILINE)


def _cause(message: str, traceback: str) -> str:
    """The exception's first line (the wrapped one's for TorchScript), numbers and long tails
    cut so that like failures group."""
    line = message.strip().splitlines()[0] if message.strip() else "(no message)"
    if _TORCHSCRIPT in line:
        raised = [m.group(1) for m in _RAISED.finditer(traceback) if _TORCHSCRIPT not in m.group(1)]
        line = raised[-1] if raised else line
    line = re.sub(r"0x[0-9a-f]+|\d+(\.\d+)?(e-?\d+)?", "N", line)
    return line[:110]


def _counts(outcomes: dict[str, Outcome]) -> str:
    counted = Counter(outcome.status for outcome in outcomes.values())
    return ", ".join(f"{counted[s]} {s}" for s in ("passed", "failed", "skipped", "error"))


def _summary(
    cpu: dict[str, Outcome], device: dict[str, Outcome], report: Optional[dict[str, object]]
) -> None:
    passing = [test for test, outcome in cpu.items() if outcome.status == "passed"]
    compared = [test for test in passing if test in device]
    on_device = [test for test in compared if device[test].status == "passed"]
    rate = 100.0 * len(on_device) / len(compared) if compared else 0.0
    print()
    print(f"tests collected: {len(cpu)} on the CPU, {len(device)} on the device")
    print(
        f"passing on the CPU: {len(passing)} ({len(passing) - len(compared)} not run on the device)"
    )
    print(f"of those, passing on the device: {len(on_device)} of {len(compared)} ({rate:.1f}%)")
    mapped = [test for test in compared if "DEVICE" in test]
    if len(mapped) < len(compared):
        passed = sum(1 for test in mapped if test in on_device)
        share = 100.0 * passed / len(mapped) if mapped else 0.0
        print(f"  parametrized by device: {passed} of {len(mapped)} ({share:.1f}%); ", end="")
        others = len(compared) - len(mapped)
        print(f"the rest ({others}, no device parameter): {len(on_device) - passed} pass")
    failing = [t for t in compared if t not in on_device]
    causes = Counter(device[t].cause or device[t].status for t in failing)
    if causes:
        print("\nfailures on the device (of tests passing on the CPU), by cause:")
        for cause, count in causes.most_common():
            example = next(t for t in failing if (device[t].cause or device[t].status) == cause)
            print(f"  {count:5}  {cause}\n         e.g. {example}")
    if report is not None:
        ops = report.get("ops")
        fallback = ops.get("fallback", {}) if isinstance(ops, dict) else {}
        fixed = ops.get("fixed", {}) if isinstance(ops, dict) else {}
        print(f"\nCPU fallbacks on the device ({sum(fallback.values())} calls), most called first:")
        for op, calls in sorted(fallback.items(), key=lambda item: -item[1])[:20]:
            print(f"  {calls:7}  {op}")
        calls = sum(fixed.values())
        print(f"\nfixed on the device by dmlpatch: {calls} calls of {len(fixed)} operators")


def _identity(plain: dict[str, Outcome], label: str, other: dict[str, Outcome]) -> None:
    """Whether ``other``'s pass/fail set is plain python's, test for test."""
    differ = sorted(
        test
        for test in plain.keys() | other.keys()
        if (plain.get(test) or Outcome("absent", "")).status
        != (other.get(test) or Outcome("absent", "")).status
    )
    verdict = "the same as plain python's" if not differ else f"{len(differ)} differ"
    print(f"{label}: {_counts(other)}: {verdict}")
    for test in differ:
        was, now = plain.get(test), other.get(test)
        print(f"  {test}: {was.status if was else 'absent'} -> {now.status if now else 'absent'}")
        if now is not None and now.cause:
            print(f"    {now.cause}")


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", choices=sorted(SUITES), default="kornia")
    parser.add_argument(
        "--source", type=Path, required=True, help="the peer's repository at the tag"
    )
    parser.add_argument(
        "--version", help="the peer's release (kornia: 0.8.3; torchvision: the venv's)"
    )
    parser.add_argument("-k", dest="keyword", help="select tests as pytest -k does")
    parser.add_argument(
        "--identity", action="store_true", help="also compare the runs with no device"
    )
    parser.add_argument("modules", nargs="*", help="test paths in the checkout")
    args = parser.parse_args(argv)
    suite = SUITES[args.suite]
    version = args.version or suite.version()
    modules = args.modules or list(suite.modules)
    source = args.source.resolve()
    for module in modules:
        if not (source / module.split("::")[0]).exists():
            _fail(f"{source} has no {module}")
    env = suite.environment(version)
    work = suite.prepare(source, version)
    selected = [*modules, *(["-k", args.keyword] if args.keyword else [])]
    cpu = Run("cpu", [], sys.executable, env)
    cpu_xml, cpu_seconds = _run(cpu, [*suite.device_options("cpu"), *selected], work)
    report_path = work / "dmlpatch-report.json"
    device = Run(
        "device",
        ["-m", "dmlpatch", "--device", "sim"],
        sys.executable,
        {**env, DMLPATCH_REPORT: str(report_path)},
    )
    device_xml, device_seconds = _run(device, [*suite.device_options("cuda"), *selected], work)
    import torch

    print(
        f"\n{args.suite} {version}, torch {torch.__version__}, simulated device (profile "
        f"torch-directml-0.2.5); modules: {' '.join(selected)}; "
        f"CPU run {cpu_seconds:.0f} s, device run {device_seconds:.0f} s"
    )
    plain = _outcomes(cpu_xml)
    print(f"cpu: {_counts(plain)}\ndevice: {_counts(_outcomes(device_xml))}")
    report = json.loads(report_path.read_text()) if report_path.is_file() else None
    _summary(_outcomes(cpu_xml, "cpu"), _outcomes(device_xml, "cuda"), report)
    if args.identity:
        print()
        with tempfile.TemporaryDirectory(prefix="peer-activated-") as root:
            runs = [
                Run("dmlpatch-cpu", ["-m", "dmlpatch", "--device", "cpu"], sys.executable, env),
                Run("activated", [], _activated(Path(root)), env),
            ]
            for run in runs:
                xml, seconds = _run(run, [*suite.device_options("cpu"), *selected], work)
                _identity(plain, f"{run.label} ({seconds:.0f} s)", _outcomes(xml))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
