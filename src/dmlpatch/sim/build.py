"""Building the simulated device's C++ extension once, and loading it afterwards.

The extension is compiled with ``torch.utils.cpp_extension`` into
``cache_root()/sim/torch-<version>-<source hash>/``. A finished build is marked by a file
written last, so a warm start only calls ``torch.ops.load_library`` (milliseconds, no ninja).
Concurrent first builds are serialised with ``filelock`` (a torch dependency): an OS lock on
every platform, which dies with its process, so a killed build never leaves others waiting.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import shlex
import shutil
import sys
import tempfile
from importlib import machinery, resources
from pathlib import Path
from typing import Any

from dmlpatch.errors import DeviceUnavailable
from dmlpatch.paths import cache_root

EXT_NAME = "dmlpatch_sim_ext"
_DONE = "complete"
_CFLAGS = ("-O2", "-fvisibility=hidden")
# torch's builder names a library with the platform's bare extension suffix (.so; .pyd on
# Windows), which Python lists last.
_LIBRARY_SUFFIX = machinery.EXTENSION_SUFFIXES[-1]
_warned_fallback_dir = False


def _sources() -> list[Path]:
    root = resources.files("dmlpatch.sim").joinpath("csrc")
    return sorted(Path(str(p)) for p in root.iterdir() if p.name.endswith((".cpp", ".h")))


def compiler() -> str:
    """The C++ compiler torch's extension builder will run (``$CXX``, else ``c++``)."""
    return os.environ.get("CXX", "c++")


def buildable() -> tuple[bool, str]:
    """Whether the extension can be compiled here, with a one-line reason."""
    words = shlex.split(compiler()) or ["c++"]
    found = shutil.which(words[0])
    if found is None:
        return False, (
            f"no C++ compiler: {words[0]!r} was not found (set CXX or install g++/clang++)"
        )
    try:
        is_ninja_available = _cpp_extension().is_ninja_available
    except ImportError:
        return False, "torch is not installed"
    if not is_ninja_available():
        return False, "ninja is not installed (pip install ninja)"
    return True, f"C++ compiler {found}"


def _key() -> str:
    import torch

    digest = hashlib.sha256()
    for path in _sources():
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    digest.update(" ".join(_CFLAGS).encode())
    digest.update(sys.version.encode())
    return f"torch-{torch.__version__}-{digest.hexdigest()[:16]}"


def _writable(path: Path) -> bool:
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError:
        return False
    return True


def build_dir() -> Path:
    """Where this torch + these sources build; a temporary directory if the cache is read-only."""
    global _warned_fallback_dir
    key = _key()
    preferred = cache_root() / "sim" / key
    if _writable(preferred) or (preferred / _DONE).is_file():
        return preferred
    user = os.getuid() if hasattr(os, "getuid") else os.getpid()
    fallback = Path(tempfile.gettempdir()) / f"dmlpatch-sim-{user}" / key
    if not _writable(fallback):
        raise DeviceUnavailable(
            f"cannot write the simulated device's build directory ({preferred} or {fallback})"
        )
    if not _warned_fallback_dir:
        _warned_fallback_dir = True
        print(
            f"dmlpatch: cache directory {preferred.parent} is not writable; "
            f"building the simulated device in {fallback}",
            file=sys.stderr,
        )
    return fallback


def library_path(directory: Path) -> Path:
    return directory / f"{EXT_NAME}{_LIBRARY_SUFFIX}"


def ensure_built() -> Path:
    """The built extension's path, compiling it first if needed (raises DeviceUnavailable)."""
    directory = build_dir()
    if (directory / _DONE).is_file() and library_path(directory).is_file():
        return library_path(directory)
    # The build imports setuptools, which appends its _vendor directory to sys.path: without
    # this, the program would see another sys.path on a cold run than on every later one.
    search_path = list(sys.path)
    try:
        ok, reason = buildable()
        if not ok:
            raise DeviceUnavailable(f"cannot build the simulated DirectML device: {reason}")
        from filelock import FileLock

        with FileLock(directory / ".dmlpatch.lock"):
            if not (directory / _DONE).is_file():
                _compile(directory)
                (directory / _DONE).write_text(_key() + "\n", "utf-8")
    finally:
        sys.path[:] = search_path
    return library_path(directory)


def _cpp_extension() -> Any:
    """torch.utils.cpp_extension, imported quietly.

    On a CUDA build of torch without a CUDA runtime (torch 2.4.1 from PyPI on this kind of
    machine) its import prints "No CUDA runtime is found": noise in the user's program output.
    """
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        from torch.utils import cpp_extension
    return cpp_extension


def _compile(directory: Path) -> None:
    cpp_extension = _cpp_extension()

    # We hold the build lock: a `lock` file (torch's own) left by a killed build would make
    # torch wait forever.
    with contextlib.suppress(FileNotFoundError):
        (directory / "lock").unlink()
    log = directory / "build.log"
    try:
        built = cpp_extension.load(
            name=EXT_NAME,
            sources=[str(p) for p in _sources() if p.name == "unity.cpp"],
            extra_cflags=list(_CFLAGS),
            build_directory=str(directory),
            is_python_module=False,
            verbose=False,
        )
    except (RuntimeError, OSError, ImportError) as exc:
        log.write_text(str(exc), "utf-8")
        raise DeviceUnavailable(
            f"building the simulated DirectML device failed; see the build log {log}"
        ) from exc
    if built is not None and Path(str(built)) != library_path(directory):
        raise DeviceUnavailable(
            f"the simulated DirectML device was built as {built}, not "
            f"{library_path(directory)}; this torch names libraries differently"
        )
    log.write_text("built\n", "utf-8")
