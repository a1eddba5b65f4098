"""Building the simulated device's C++ extension once, and loading it afterwards.

The extension is compiled with ``torch.utils.cpp_extension`` into
``cache_root()/sim/torch-<version>-<source hash>/``. A finished build is marked by a file
written last, which records the library's size and SHA-256, so a warm start reads the library
once to check it and calls ``torch.ops.load_library`` (milliseconds, no ninja). A library that
does not match (truncated: the dynamic loader would die of SIGBUS; deleted; altered) is built
again, from scratch.
Concurrent first builds are serialised with ``filelock`` (a torch dependency): an OS lock on
every platform, which dies with its process, so a killed build never leaves others waiting.

The dynamic loader runs whatever library it is given, so the build directory, its ancestors and
its files must be this user's and writable by nobody else (``dmlpatch.trust``): created 0700,
files made 0600 once built. Where the cache cannot be written, the build goes to
``$TMPDIR/dmlpatch-sim-<uid>``, which must then be this user's own; one that is not (another
user's, planted where the name is predictable) is not used, and the device is unavailable with
one line saying why.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import os
import shlex
import shutil
import sys
import tempfile
from importlib import machinery, resources
from pathlib import Path
from typing import Any, Optional

from dmlpatch import trust
from dmlpatch.environment_variables import DMLPATCH_CACHE_DIR
from dmlpatch.errors import DeviceUnavailable
from dmlpatch.paths import cache_subdirectory

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


@functools.cache
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
        probe = path / f".probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError:
        return False
    return True


def _private(path: Path) -> Optional[str]:
    """Create ``path`` private (or find it so); why it cannot hold the build, or None."""
    try:
        return trust.make_directory(str(path))
    except OSError as error:
        if not path.is_dir():
            return f"{path} cannot be created ({error.strerror})"
        return trust.directory_problem(str(path))  # a read-only cache may hold a finished build


def build_dir() -> Path:
    """Where this torch + these sources build; a temporary directory if the cache is read-only."""
    global _warned_fallback_dir
    key = _key()
    sim = cache_subdirectory("sim")
    if sim is not None:
        preferred = Path(sim) / key
        if _private(preferred) is None and (_writable(preferred) or verified(preferred)):
            return preferred
    user = os.getuid() if hasattr(os, "getuid") else os.getpid()
    own = Path(tempfile.gettempdir()) / f"dmlpatch-sim-{user}"
    fallback = own / key
    problem = _private(own) or _private(fallback)
    if problem is not None:
        raise DeviceUnavailable(
            f"the simulated device's build directory {own} is not used: {problem}; set "
            f"{DMLPATCH_CACHE_DIR} to a directory of yours that only you can write"
        )
    if not _writable(fallback):
        raise DeviceUnavailable(f"cannot write the simulated device's build directory ({fallback})")
    if not _warned_fallback_dir:
        _warned_fallback_dir = True
        where = Path(sim).parent if sim is not None else "the cache directory"
        print(
            f"dmlpatch: cache directory {where} is not writable; "
            f"building the simulated device in {fallback}",
            file=sys.stderr,
        )
    return fallback


def library_path(directory: Path) -> Path:
    return directory / f"{EXT_NAME}{_LIBRARY_SUFFIX}"


def verified(directory: Path) -> bool:
    """Whether ``directory`` holds a finished build whose library is the one recorded: this
    user's, writable by nobody else, of the recorded size and SHA-256."""
    record = trust.read(str(directory / _DONE))
    if record is None:
        return False
    lines = record.decode("utf-8", "replace").split("\n")
    if len(lines) < 2 or lines[0] != _key() or len(lines[1].split()) != 2:
        return False
    size, digest = lines[1].split()
    library = trust.read(str(library_path(directory)))
    return (
        library is not None
        and str(len(library)) == size
        and hashlib.sha256(library).hexdigest() == digest
    )


def ensure_built() -> Path:
    """The built extension's path, compiling it first if needed (raises DeviceUnavailable)."""
    directory = build_dir()
    if verified(directory):
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
            if not verified(directory):
                _clear(directory)
                _compile(directory)
                _seal(directory)
    finally:
        sys.path[:] = search_path
    return library_path(directory)


def _clear(directory: Path) -> None:
    """Everything but the lock: ninja would call a truncated library up to date, and an object
    file damaged with it would be linked again."""
    for entry in directory.iterdir():
        if entry.name != ".dmlpatch.lock":
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()


def _seal(directory: Path) -> None:
    """Make what the build wrote private, then record the library: the record is written last."""
    for entry in directory.iterdir():
        if entry.is_file() and not entry.is_symlink():
            entry.chmod(0o700 if entry == library_path(directory) else trust.PRIVATE_FILE)
    library = library_path(directory).read_bytes()
    record = f"{_key()}\n{len(library)} {hashlib.sha256(library).hexdigest()}\n"
    from dmlpatch import atomic

    atomic.write(directory / _DONE, record.encode("utf-8"), mode=trust.PRIVATE_FILE)


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
