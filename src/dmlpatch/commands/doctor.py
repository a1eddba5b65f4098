"""``dmlpatch doctor``: one screen that says what is wrong with a DirectML environment.

Each check is a line with OK, WARN or FAIL and, where there is one, the exact command that
fixes it. Checks never raise: a check that cannot run reports why. A failure the catalogue of
known torch-directml failures describes (:mod:`dmlpatch.gaps.catalogue`) is named with its
entry and what to do, whether doctor recognises it from an exception (torch-directml's import,
a library's) or from what it checks (a torch that is not torch-directml's).
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from typing import Any, NamedTuple, Optional

from dmlpatch import _metadata
from dmlpatch.environment_variables import (
    DMLPATCH_CACHE_DIR,
    DMLPATCH_DEVICE,
    DMLPATCH_DISABLE,
    DMLPATCH_PATCHES,
)

OK, WARN, FAIL = "OK", "WARN", "FAIL"


class Check(NamedTuple):
    area: str
    status: str
    message: str
    fix: Optional[str] = None
    details: Optional[dict[str, Any]] = None


def run_checks(import_targets: bool = True) -> list[Check]:
    checks = [_python(), *_versions(), _directml(), *_adapters(), _cuda()]
    checks += _excluding_torch()
    checks += _targets(import_targets)
    checks += [_activation(), _pin(), *_local_specs(), _cache(), _simulator(), _known_failures()]
    return checks


def _local_specs() -> list[Check]:
    """The DMLPATCH_PATCHES specs in force (none: no check): their fixes run as dmlpatch's."""
    from dmlpatch.errors import SpecError
    from dmlpatch.specs import loading

    try:
        found = loading.local_specs()
    except SpecError as error:
        return [Check("patches", FAIL, str(error), f"fix the spec, or unset {DMLPATCH_PATCHES}")]
    return [
        Check(
            "patches",
            WARN if replacing else OK,
            loading.describe_local(spec, replacing),
            f"unset {DMLPATCH_PATCHES} to use dmlpatch's own" if replacing else None,
            details={"spec": spec.name, "origin": spec.origin, "replaces": replacing},
        )
        for spec, replacing in found
    ]


def platform_name() -> str:
    system = platform.system()
    if system == "Linux":
        try:
            with open("/proc/version", encoding="utf-8") as stream:
                if "microsoft" in stream.read().lower():
                    return "WSL2"
        except OSError:
            pass
        return "Linux"
    return {"Darwin": "macOS"}.get(system, system)


def _python() -> Check:
    return Check(
        "python",
        OK,
        f"Python {platform.python_version()} on {platform_name()} ({platform.machine()})",
        details={"python": platform.python_version(), "platform": platform_name()},
    )


def _versions() -> list[Check]:
    from packaging.requirements import Requirement

    torch = _metadata.version_of("torch")
    vision = _metadata.version_of("torchvision")
    directml = _metadata.version_of("torch-directml")
    details: dict[str, Any] = {"torch": torch, "torchvision": vision, "torch-directml": directml}
    listed = ", ".join(f"{k} {v or 'not installed'}" for k, v in details.items())
    if torch is None:
        return [Check("versions", FAIL, listed, "pip install torch", details)]
    if directml is None:
        return [Check("versions", OK, listed, details=details)]
    pins = [
        pin
        for pin in (
            _metadata.requirement_of("torch-directml", "torch"),
            _metadata.requirement_of("torch-directml", "torchvision"),
        )
        if pin
    ]
    installed = {"torch": torch, "torchvision": vision}
    broken = [
        pin
        for pin in pins
        if installed.get(Requirement(pin).name) is None
        or not Requirement(pin).specifier.contains(installed[Requirement(pin).name] or "", True)
    ]
    details["pins"] = pins
    if broken:
        details["known_failure"] = "torch-replaced"
        return [
            Check(
                "versions",
                FAIL,
                f"{listed}; torch-directml {directml} requires {', '.join(pins)} "
                "(a different torch makes `import torch_directml` fail with 'undefined symbol')"
                + _known("torch-replaced"),
                f"pip install {' '.join(pins)}",
                details,
            )
        ]
    return [Check("versions", OK, f"{listed}; torch-directml's pins hold", details=details)]


def _directml() -> Check:
    from dmlpatch.devices import directml

    found = directml.probe()
    if not found.available:
        installed = _metadata.version_of("torch-directml") is not None
        status = FAIL if installed else WARN
        fix = None if installed else "pip install torch-directml  (Windows or WSL2)"
        known = _recognised(found.reason)
        return Check(
            "directml",
            status,
            f"DirectML unavailable: {found.reason}" + _known(known),
            fix,
            {"known_failure": known} if known else None,
        )
    module = found.module
    adapters = []
    for index, name in enumerate(found.names):
        adapter: dict[str, Any] = {"index": index, "name": name}
        adapter["float64"] = _ask(module, "has_float64_support", index)
        adapter["memory_mb"] = _memory(module, index)
        adapters.append(adapter)
    listing = "; ".join(
        f"{a['index']}: {a['name']} (float64 {'yes' if a['float64'] else 'no'})" for a in adapters
    )
    return Check(
        "directml",
        OK,
        f"{len(adapters)} adapter(s): {listing}; `dml` picks adapter 0 (DirectML lists discrete "
        "GPUs before integrated ones; choose another with dml:N or dml:NAME)",
        details={"adapters": adapters},
    )


def _adapters() -> list[Check]:
    """One line per DirectML adapter: its GPU family, and a faster route where one exists.

    The adapters are DirectML's, or the simulated device's where ``DMLPATCH_DEVICE`` chooses
    it (``DMLPATCH_SIM_ADAPTERS`` names them).
    """
    from dmlpatch.devices import directml, hardware, resolution

    found = directml.probe()
    names, simulated = list(found.names), False
    if not found.available and resolution.configured_spec().startswith("sim"):
        from dmlpatch import sim
        from dmlpatch.errors import DmlpatchError

        try:
            names, simulated = sim.precheck(), True
        except DmlpatchError:
            return []  # the simulator check says why
    checks = []
    for index, name in enumerate(names):
        family = hardware.family(name)
        where = f"simulated adapter {index}" if simulated else f"adapter {index}"
        checks.append(
            Check(
                "adapter",
                OK,
                f"{where}: {hardware.advice(name)}",
                details={
                    "index": index,
                    "name": name,
                    "simulated": simulated,
                    "family": family.name if family else None,
                    "faster": family.faster if family else None,
                },
            )
        )
    return checks


def _excluding_torch() -> list[Check]:
    """Installed libraries whose requirements exclude torch-directml's torch: beside it they
    may fail to import, and installing them replaced it (or will). Read from installed
    metadata only; an older copy of the library installed elsewhere on the path that accepts
    that torch is named."""
    from packaging.requirements import Requirement

    pin = _metadata.requirement_of("torch-directml", "torch")
    if pin is None:
        return []
    exact = [s.version for s in Requirement(pin).specifier if s.operator == "=="]
    if len(exact) != 1:
        return []
    wanted = exact[0]
    checks = []
    for name, copies in _torch_requirements().items():
        (version, specifier, accepts), *others = copies
        if accepts:
            continue
        older = [v for v, _, ok in others if ok]
        message = (
            f"{name} {version} requires torch{specifier}, which excludes torch-directml's "
            f"torch=={wanted}: beside that torch it may fail to import, and installing it "
            "replaces that torch"
        )
        if older:
            last = max(older, key=_version_key)
            message += f"; {name} {last}, also installed here, accepts it"
            fix = f"pip install {name}=={last}"
        else:
            message += (
                "; no installed metadata shows a release that accepts it: with the pin, pip "
                "picks the newest that does"
            )
            fix = f"dmlpatch pin, then pip install {name}"
        checks.append(
            Check(
                "requires",
                WARN,
                message,
                fix,
                {"library": name, "version": version, "requires": f"torch{specifier}"},
            )
        )
    return checks


def _version_key(version: str) -> Any:
    from packaging.version import InvalidVersion, Version

    try:
        return Version(version)
    except InvalidVersion:
        return Version("0")


def _torch_requirements() -> dict[str, list[tuple[str, str, bool]]]:
    """Per library that requires torch (always, not for an extra): each installed copy on the
    path, first the one that imports, as (version, specifier, accepts torch-directml's)."""
    from packaging.requirements import InvalidRequirement, Requirement

    pin = _metadata.requirement_of("torch-directml", "torch") or ""
    wanted = pin.partition("==")[2]
    found: dict[str, list[tuple[str, str, bool]]] = {}
    for distribution in _metadata.all_distributions():
        name = distribution.metadata["Name"] or ""
        if name.lower().replace("_", "-") in (
            "torch",
            "torchvision",
            "torchaudio",
            "torch-directml",
        ):
            continue  # the versions check judges torch's own family
        for line in distribution.requires or []:
            try:
                requirement = Requirement(line)
            except InvalidRequirement:
                continue
            if requirement.name.lower() != "torch":
                continue
            if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
                continue
            accepts = requirement.specifier.contains(wanted, prereleases=True)
            found.setdefault(name, []).append(
                (distribution.version, str(requirement.specifier), accepts)
            )
            break
    return found


def _ask(module: Any, name: str, index: int) -> Any:
    try:
        return getattr(module, name)(index)
    except Exception:  # torch-directml raises "Unknown error -NNN" for queries it cannot answer
        return None


def _memory(module: Any, index: int) -> Any:
    try:
        tiles = module.gpu_memory(index, 1)
    except Exception:  # same as _ask
        return None
    return round(sum(tiles)) if isinstance(tiles, (list, tuple)) else tiles


def _cuda() -> Check:
    from dmlpatch.devices import resolution

    try:
        usable, reason = resolution.cuda_status()
    except Exception as error:  # a broken torch install: report it, don't die
        return Check(
            "cuda", FAIL, f"torch failed to load: {error}", "pip install --force-reinstall torch"
        )
    if usable:
        return Check("cuda", OK, f"{reason}: `auto` leaves CUDA programs alone")
    import torch

    if torch.cuda.is_available():
        return Check(
            "cuda", WARN, reason, "use DirectML: python -m dmlpatch --device dml script.py"
        )
    return Check("cuda", OK, reason)


def _targets(import_them: bool) -> list[Check]:
    from dmlpatch.specs import loading

    try:
        loaded = loading.load_all()
    except Exception as error:  # a malformed spec is itself the finding
        return [Check("specs", FAIL, str(error))]
    installed = [(spec, _metadata.version_of(spec.distribution)) for spec in loaded]
    installed = [(spec, version) for spec, version in installed if version is not None]
    modules = [_top_level(spec) for spec, _ in installed]
    # Importing the libraries takes seconds each: all at once, and patched only where needed.
    plain = _imports(modules) if import_them else [None] * len(modules)
    failing = [m for m, failure in zip(modules, plain) if failure is not None]
    patched = dict(zip(failing, _imports(failing, patched=True)))
    checks = []
    for (spec, version), module, failure in zip(installed, modules, plain):
        covered = spec.versions.contains(version, prereleases=True)
        message = f"{spec.distribution} {version}: spec {spec.name!r} " + (
            "covers it" if covered else f"is for {spec.versions}: runs unpatched"
        )
        status = OK if covered else WARN
        details: dict[str, Any] = {"spec": spec.name}
        if failure is not None and patched.get(module) is None:
            message += f"; plain import fails ({failure}), dmlpatch bridges it"
        elif failure is not None:
            status = FAIL
            known = _recognised(patched[module] or "")
            message += f"; import fails even with dmlpatch: {patched[module]}" + _known(known)
            if known:
                details["known_failure"] = known
        checks.append(Check("library", status, message, details=details))
    return checks


def _recognised(said: str) -> Optional[str]:
    """The catalogue entry an error line shows, if any."""
    from dmlpatch.gaps import catalogue

    found = catalogue.for_error(said)
    return found.key if found is not None else None


def _known(key: Optional[str]) -> str:
    """`` (known failure KEY: what to do)`` for a message, or nothing."""
    if key is None:
        return ""
    from dmlpatch.gaps import catalogue

    failure = catalogue.get(key)
    return f" (known failure {key}; {failure.fix}: {failure.remedy})"


def _top_level(spec: Any) -> str:
    modules = spec.modules() or [w.module for w in spec.wraps]
    return modules[0].partition(".")[0] if modules else spec.distribution.replace("-", "_")


def _imports(modules: list[str], patched: bool = False) -> list[Optional[str]]:
    """For each module, None when it imports in a fresh process, else its last error line."""

    env = {k: v for k, v in os.environ.items() if k != DMLPATCH_DEVICE}
    env[DMLPATCH_DISABLE] = "0" if patched else "1"
    prefix = (
        "import dmlpatch.specs.engine; dmlpatch.specs.engine.install('cpu'); " if patched else ""
    )
    running = [
        subprocess.Popen(
            [sys.executable, "-c", f"{prefix}import {module}"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for module in modules
    ]
    results: list[Optional[str]] = []
    for process in running:
        try:
            _, err = process.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            process.kill()
            results.append("import took over 300 s")
            continue
        lines = [line for line in err.strip().splitlines() if line.strip()]
        failed = process.returncode != 0
        results.append(
            (lines[-1] if lines else f"exit code {process.returncode}") if failed else None
        )
    return results


def _activation() -> Check:
    from dmlpatch.startup import activation

    device = activation.configured_device()
    where = activation.pth_path()
    if device is None:
        return Check(
            "activation", OK, f"not activated ({activation.absence()})", details={"pth": str(where)}
        )
    stale = activation.stale()
    if stale is not None:
        return Check(
            "activation",
            WARN,
            f"not active: {where} {stale}; every process runs unpatched",
            fix=f"dmlpatch activate --device {device}",
            details={"pth": str(where), "device": device, "stale": stale},
        )
    return Check(
        "activation",
        OK,
        f"activated with device {device} ({where}); undo: dmlpatch deactivate",
        details={"pth": str(where), "device": device},
    )


def _pin() -> Check:
    from dmlpatch.pinning import pin as pinning

    try:
        status, message, fix, details = pinning.check()
    except Exception as error:  # an unreadable pip configuration is itself the finding
        return Check("pin", WARN, f"cannot tell: {error}")
    return Check("pin", status, message, fix, details)


def _cache() -> Check:
    from dmlpatch.paths import cache_directory

    root = cache_directory()
    total = 0
    for directory, _, files in os.walk(root):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(directory, name))
            except OSError:
                continue
    from dmlpatch import trust

    problem = trust.directory_problem(root) if os.path.isdir(root) else None
    if problem is not None:
        return Check(
            "cache",
            WARN,
            f"{root} is not used: {problem}, so it could hold another user's code",
            f"set {DMLPATCH_CACHE_DIR} to a directory of yours that only you can write",
            details={"path": root, "bytes": total},
        )
    return Check(
        "cache",
        OK,
        f"{root}: {total / 1e6:.1f} MB (simulated device builds, patch plans); rewritten "
        "bytecode lives beside each target's own __pycache__",
        details={"path": root, "bytes": total},
    )


def _simulator() -> Check:
    from dmlpatch.sim import buildable

    ok, reason = buildable()
    return Check(
        "simulator",
        OK if ok else WARN,
        f"--device sim: {reason}",
        None if ok else "install a C++ compiler (e.g. apt-get install g++) and ninja",
    )


def _known_failures() -> Check:
    from dmlpatch.gaps import catalogue

    return Check(
        "failures",
        OK,
        f"{catalogue.summary()} (dmlpatch doctor --failures lists them)",
        details={"failures": len(catalogue.FAILURES)},
    )


def exit_code(checks: list[Check]) -> int:
    return 1 if any(check.status == FAIL for check in checks) else 0


def format_checks(checks: list[Check]) -> str:
    lines = []
    for check in checks:
        lines.append(f"{check.status:4} {check.area:10} {check.message}")
        if check.fix:
            lines.append(f"{'':16}fix: {check.fix}")
    return "\n".join(lines)


def as_json(checks: list[Check]) -> list[dict[str, Any]]:
    return [check._asdict() for check in checks]
