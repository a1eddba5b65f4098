"""Session fixtures for the GFPGAN workflow: offline weights, the upstream script, no network."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import sysconfig
import tempfile
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import gfpgan_fixtures
import pytest

from support import REPO, clean_env, run_python

HERE = Path(__file__).resolve().parent
#: Real-ESRGAN resolves inference_gfpgan.py's URL to <site-packages>/weights (realesrgan.utils
#: ROOT_DIR); no other location is looked at, so the fixture goes there for the session.
ESRGAN_WEIGHTS = Path(sysconfig.get_paths()["purelib"]) / "weights"
#: facexlib 0.2.x (module-level device choice) beside the installed 0.3.0, first on PYTHONPATH.
#: scripts/setup.sh installs it; the fixture installs it the same way when it is missing.
FACEXLIB_OLD = "facexlib==0.2.5"
FACEXLIB_OLD_DIR = REPO / ".cache" / "facexlib-0.2.5"

# Installed by the test runner's interpreter as sitecustomize: every socket connection or name
# lookup is refused and logged, so a test can assert that nothing tried the network. With
# $GFPGAN_TEST_SEED it also seeds torch before the program runs (StyleGAN2 noise).
SITECUSTOMIZE = """
import os
import socket

_log = os.environ.get("GFPGAN_TEST_NETLOG")


def _refuse(what):
    def refuse(*args, **kwargs):
        if _log:
            with open(_log, "a", encoding="utf-8") as handle:
                handle.write(f"{what} {args[1:2] if what == 'connect' else args[:1]}\\n")
        raise OSError(f"network blocked by the test ({what})")

    return refuse


socket.socket.connect = _refuse("connect")
socket.socket.connect_ex = _refuse("connect")
socket.getaddrinfo = _refuse("getaddrinfo")
socket.create_connection = _refuse("create_connection")
if os.environ.get("GFPGAN_TEST_SEED"):
    import torch

    torch.manual_seed(int(os.environ["GFPGAN_TEST_SEED"]))
"""


@dataclass(frozen=True)
class Assets:
    root: Path  # holds gfpgan/weights (cwd-relative lookups), realesrgan/, inputs/
    script: Path  # upstream inference_gfpgan.py, unmodified
    site: Path  # the sitecustomize directory
    netlog: Path

    def env(self, seed: int | None = 0, **extra: str) -> dict[str, str]:
        variables = {"PYTHONPATH": str(self.site), "GFPGAN_TEST_NETLOG": str(self.netlog)}
        if seed is not None:
            variables["GFPGAN_TEST_SEED"] = str(seed)
        variables.update(extra)
        return clean_env(**variables)

    def workdir(self, base: Path) -> Path:
        """A working directory where GFPGANer finds gfpgan/weights, as a user's would be."""
        base.mkdir(parents=True, exist_ok=True)
        link = base / "gfpgan"
        if not link.exists():
            link.symlink_to(self.root / "gfpgan", target_is_directory=True)
        return base


@pytest.fixture(scope="session")
def assets(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Assets]:
    root = _built_once_per_run(tmp_path_factory)
    # Each worker its own log: a test clears it before it runs.
    netlog = tmp_path_factory.mktemp("gfpgan-netlog") / "netlog.txt"
    with _in_site_packages(root / "realesrgan" / "RealESRGAN_x2plus.pth"):
        yield Assets(root, root / "upstream" / "inference_gfpgan.py", root / "site", netlog)


def _built_once_per_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The weights (1.2 GB), the upstream script and the sitecustomize in the directory that
    the run's workers share (pytest-xdist gives each its own basetemp below it): built by the
    first worker to ask, read by the others."""
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent
    root = shared / "gfpgan-assets"
    with open(shared / "gfpgan-assets.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (root / "complete").exists():
            shutil.rmtree(root, ignore_errors=True)  # a worker that failed half-way
            root.mkdir()
            fixtures = str(HERE / "gfpgan_fixtures.py")
            built = run_python(
                ["-m", "dmlpatch", "--device", "cpu", fixtures, str(root)],
                env=clean_env(),
                timeout=600,
            )
            assert built.code == 0, built.err
            sdist = root / "upstream"
            sdist.mkdir()
            gfpgan_fixtures.upstream_script(sdist, clean_env())
            for archive in sdist.glob("*.tar.gz"):
                archive.unlink()
            site = root / "site"
            site.mkdir()
            (site / "sitecustomize.py").write_text(textwrap.dedent(SITECUSTOMIZE))
            (root / "complete").touch()
    return root


@contextlib.contextmanager
def _in_site_packages(weights: Path) -> Iterator[None]:
    """Put the fixture where RealESRGANer looks, shared with concurrent test sessions.

    Every session holds a shared lock while it runs; the last one out removes the fixture, and
    only a file a test session put there (marked beside it), never a user's real weights.
    """
    target = ESRGAN_WEIGHTS / weights.name
    marker = target.with_name(target.name + ".dmlpatch-test")
    key = hashlib.sha256(str(target).encode()).hexdigest()[:16]
    with open(Path(tempfile.gettempdir()) / f"dmlpatch-tests-{key}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_SH)
        if not target.exists():
            if not ESRGAN_WEIGHTS.exists():
                ESRGAN_WEIGHTS.mkdir()
                marker.write_text("created the directory")
            else:
                marker.touch()
            partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
            shutil.copyfile(weights, partial)
            os.replace(partial, target)  # concurrent readers never see a torn file
        try:
            yield
        finally:
            if _last_out(lock.fileno()) and marker.exists():
                created_directory = marker.read_text() == "created the directory"
                target.unlink(missing_ok=True)
                marker.unlink()
                if created_directory:
                    shutil.rmtree(ESRGAN_WEIGHTS, ignore_errors=True)


def _last_out(lock: int) -> bool:
    """Turn this session's shared lock exclusive, if no other session holds one."""
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


@pytest.fixture(scope="session")
def facexlib_0_2_5() -> Path:
    """A directory holding facexlib 0.2.5 (put it first on PYTHONPATH)."""
    if not (FACEXLIB_OLD_DIR / "facexlib-0.2.5.dist-info").is_dir():
        target = str(FACEXLIB_OLD_DIR)
        installed = run_python(
            ["-m", "pip", "install", "--quiet", "--no-deps", "--target", target, FACEXLIB_OLD],
            env=clean_env(),
            timeout=300,
        )
        assert installed.code == 0, installed.err
    return FACEXLIB_OLD_DIR


@pytest.fixture(autouse=True)
def _network_log_of_this_test(assets: Assets) -> Iterator[None]:
    """Each test reads only the network attempts of its own runs. The session's tests share the
    log, and one of them tries a download on purpose (missing weights offline): which tests run
    after it depends on the workers' schedule."""
    assets.netlog.unlink(missing_ok=True)
    yield
