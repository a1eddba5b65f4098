"""Session fixtures for the GFPGAN workflow: offline weights, the upstream script, no network."""

from __future__ import annotations

import shutil
import sysconfig
import tarfile
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from support import clean_env, run_python

HERE = Path(__file__).resolve().parent
GFPGAN_SDIST = "gfpgan==1.3.8"
#: Real-ESRGAN resolves inference_gfpgan.py's URL to <site-packages>/weights (realesrgan.utils
#: ROOT_DIR); no other location is looked at, so the fixture goes there for the session.
ESRGAN_WEIGHTS = Path(sysconfig.get_paths()["purelib"]) / "weights"

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
    root = tmp_path_factory.mktemp("gfpgan-assets")
    built = run_python(
        ["-m", "dmlpatch", "--device", "cpu", str(HERE / "gfpgan_fixtures.py"), str(root)],
        env=clean_env(),
        timeout=600,
    )
    assert built.code == 0, built.err
    script = _upstream_script(tmp_path_factory.mktemp("gfpgan-sdist"))
    site = root / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(textwrap.dedent(SITECUSTOMIZE))
    created_dir = not ESRGAN_WEIGHTS.exists()
    target = ESRGAN_WEIGHTS / "RealESRGAN_x2plus.pth"
    created_file = not target.exists()
    if created_file:
        ESRGAN_WEIGHTS.mkdir(exist_ok=True)
        shutil.copyfile(root / "realesrgan" / "RealESRGAN_x2plus.pth", target)
    try:
        yield Assets(root, script, site, root / "netlog.txt")
    finally:
        if created_file:
            target.unlink()
        if created_dir:
            shutil.rmtree(ESRGAN_WEIGHTS, ignore_errors=True)


def _upstream_script(directory: Path) -> Path:
    """inference_gfpgan.py from the gfpgan 1.3.8 sdist (pip download, not committed)."""
    fetched = run_python(
        [
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--no-binary",
            ":all:",
            "--no-build-isolation",
            GFPGAN_SDIST,
            "-d",
            str(directory),
        ],
        env=clean_env(),
        timeout=300,
    )
    assert fetched.code == 0, fetched.err
    (archive,) = directory.glob("gfpgan-*.tar.gz")
    with tarfile.open(archive) as tar:
        member = tar.getmember("gfpgan-1.3.8/inference_gfpgan.py")
        source = tar.extractfile(member)
        assert source is not None
        script = directory / "inference_gfpgan.py"
        script.write_bytes(source.read())
    return script
