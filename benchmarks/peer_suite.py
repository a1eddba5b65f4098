"""A peer's own test suite on the simulated DirectML device, compared test by test with the CPU.

kornia's suite takes a device option (``--device cpu`` / ``--device cuda``; its conftest picks
``torch.device("cuda:0")`` when ``torch.cuda.is_available()``), so the same test files run once
under plain pytest on the CPU and once under ``python -m dmlpatch --device sim -m pytest`` with
``--device cuda``, which dmlpatch's pytest plugin sends to the device. The script prints how many
tests pass on the CPU, how many of those pass on the device (the pass rate), the device's
failures grouped by cause, and the operators DirectML's CPU fallback still ran (the run's
dmlpatch report, ``ops.fallback``)::

    python benchmarks/peer_suite.py --source KORNIA_CHECKOUT [--version 0.8.3] [MODULE ...]

``KORNIA_CHECKOUT`` is kornia's repository at the installed version's tag (``git clone --depth 1
--branch v0.8.3 https://github.com/kornia/kornia``; its PyPI sdist ships no tests). kornia is
installed with ``--no-deps`` into ``.cache/peer/kornia-VERSION`` beside the venv (the venv's torch
is kept: ``-c scripts/torch-pin.txt``), and the test files are copied to
``.cache/peer/kornia-VERSION-run``, where they run (kornia's conftest makes a ``weights/``
directory in the working directory); the checkout is only read. MODULEs are paths under
``tests/`` of the checkout; the default is the module directories below.
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
import time
import xml.etree.ElementTree as ElementTree
from collections import Counter
from pathlib import Path
from typing import NamedTuple, Optional

REPO = Path(__file__).resolve().parents[1]
PIN = REPO / "scripts" / "torch-pin.txt"
#: Modules that need no network, weights or optional packages.
DEFAULT_MODULES = (
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


class Outcome(NamedTuple):
    status: str  # passed, failed, error, skipped
    cause: str  # the exception's first line, for a failure or an error


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


def _prepare(source: Path, version: str) -> Path:
    """The checkout's test files, copied where they may write."""
    for needed in ("conftest.py", "pyproject.toml", "tests", "testing"):
        if not (source / needed).exists():
            _fail(f"{source} has no {needed}: pass kornia's repository at tag v{version}")
    said = re.search(r'__version__ = "([^"]+)"', _read(source / "kornia" / "__init__.py"))
    if said and said.group(1) != version:
        _fail(f"{source} is kornia {said.group(1)}, the installed kornia is {version}")
    work = REPO / ".cache" / "peer" / f"kornia-{version}-run"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    for name in ("conftest.py", "pyproject.toml"):
        shutil.copy2(source / name, work / name)
    for name in ("tests", "testing"):
        shutil.copytree(source / name, work / name, ignore=shutil.ignore_patterns("__pycache__"))
    return work


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8") if path.is_file() else ""


def _run(
    label: str, prefix: list[str], device: str, modules: list[str], work: Path, env: dict[str, str]
) -> tuple[Path, float]:
    junit = work / f"{label}.xml"
    command = [sys.executable, *prefix, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    command += ["--no-header", "--color=no", "--device", device, f"--junitxml={junit}", *modules]
    print(f"{label}: {' '.join(command[1:])}", flush=True)
    start = time.perf_counter()
    with open(work / f"{label}.log", "w", encoding="utf-8") as log:
        subprocess.run(
            command, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT, check=False
        )
    if not junit.is_file():
        _fail(f"the {label} run wrote no results; see {work / (label + '.log')}")
    return junit, time.perf_counter() - start


_DEVICE_PARAMETER = re.compile(r"(?<=[\[-])(cpu|cuda)(?=[-\]])")


def _outcomes(junit: Path) -> dict[str, Outcome]:
    """Each test's outcome, by an id that names no device (``[cuda-float32]`` is
    ``[DEVICE-float32]``)."""
    found: dict[str, Outcome] = {}
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        name = _DEVICE_PARAMETER.sub("DEVICE", case.get("name", ""))
        test = f"{case.get('classname', '')}::{name}"
        status, cause = "passed", ""
        for child in case:
            if child.tag in ("failure", "error"):
                status = "failed" if child.tag == "failure" else "error"
                cause = _cause(child.get("message") or "", child.text or "")
            elif child.tag == "skipped":
                status = "skipped"
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


def _environment(kornia: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(kornia), env.get("PYTHONPATH")) if p)
    # kornia's conftest deselects compile tests without it; keep it so in both runs.
    env.pop("KORNIA_TEST_OPTIMIZER", None)
    return env


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


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", type=Path, required=True, help="kornia's repository at the tag")
    parser.add_argument("--version", default="0.8.3", help="the kornia release (default 0.8.3)")
    parser.add_argument("modules", nargs="*", help="test paths under the checkout")
    args = parser.parse_args(argv)
    modules = args.modules or list(DEFAULT_MODULES)
    source = args.source.resolve()
    for module in modules:
        if not (source / module).exists():
            _fail(f"{source} has no {module}")
    kornia = _install(args.version)
    work = _prepare(source, args.version)
    env = _environment(kornia)
    cpu_xml, cpu_seconds = _run("cpu", [], "cpu", modules, work, env)
    report_path = work / "dmlpatch-report.json"
    device_env = {**env, "DMLPATCH_REPORT": str(report_path)}
    device_xml, device_seconds = _run(
        "device", ["-m", "dmlpatch", "--device", "sim"], "cuda", modules, work, device_env
    )
    import torch

    print(
        f"\nkornia {args.version}, torch {torch.__version__}, simulated device (profile "
        f"torch-directml-0.2.5); modules: {' '.join(modules)}; "
        f"CPU run {cpu_seconds:.0f} s, device run {device_seconds:.0f} s"
    )
    report = json.loads(report_path.read_text()) if report_path.is_file() else None
    _summary(_outcomes(cpu_xml), _outcomes(device_xml), report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
