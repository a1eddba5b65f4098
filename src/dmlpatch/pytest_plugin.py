"""The pytest plugin: a test suite run under dmlpatch runs on the device, asserts introspected.

pytest loads ``conftest.py`` and the test modules through its own import hook, which rewrites
their ``assert`` statements so that a failure shows the values involved; it puts that hook first
on ``sys.meta_path`` as a session starts, so without this plugin those modules never reached
dmlpatch's finder and a fixture's ``torch.device("cuda" if torch.cuda.is_available() else "cpu")``
put every test on the CPU. Registered as the ``pytest11`` entry point ``dmlpatch``, this module
is imported by every pytest session of an environment where dmlpatch is installed, after pytest
installs its hook and before any conftest loads, and does nothing unless dmlpatch's import hook is
active in the process (``python -m dmlpatch -m pytest``, ``dmlpatch run pytest``, an activated
environment, a child of those such as a pytest-xdist worker). Then it registers pytest's loader
with ``dmlpatch.rewriting.composition`` (a module with CUDA sites gets them rewritten, then
pytest rewrites its asserts, one compile, cached under a tag naming pytest's version) and puts
dmlpatch's finder back in front of pytest's.

pytest captures stderr while it collects and runs tests, so dmlpatch's lines (``running on ...``,
warnings) said then are held and shown in a ``dmlpatch`` section of the terminal summary
instead of landing in a test's captured output. That section also says where the tests ran,
test by test (:mod:`dmlpatch.placement.by_test`): how many on the device, how many on the CPU as
parametrized, and a warning for each test that asked for CUDA and ran on the CPU, in place of the
whole session's exit warning. ``-p no:dmlpatch`` turns the plugin off: conftest
and test modules then load as pytest has them, their device choices as under plain python, and
one line at exit says so.
"""

from __future__ import annotations

import sys

import pytest

from dmlpatch import log
from dmlpatch.rewriting import hook

TYPE_CHECKING = False
if TYPE_CHECKING:
    import ast
    import types
    from collections.abc import Iterator
    from typing import Any, Optional

    from dmlpatch.rewriting.composition import Composer

#: The loader class of pytest's assertion rewriting.
PYTEST_LOADER = "_pytest.assertion.rewrite.AssertionRewritingHook"


def _composer(loader: Any) -> Composer:
    """dmlpatch's tree, then pytest's ``rewrite_asserts`` with the session's configuration."""
    from _pytest.assertion.rewrite import rewrite_asserts

    from dmlpatch.rewriting.composition import Composer

    config = loader.config
    try:
        pass_hook = bool(config.getini("enable_assertion_pass_hook"))
    except ValueError:  # an ini option another pytest does not know
        pass_hook = False

    def finish(tree: ast.Module, source: bytes, path: str) -> types.CodeType:
        rewrite_asserts(tree, source, path, config)
        return compile(tree, path, "exec", dont_inherit=True)

    import pytest

    return Composer(f"pytest{pytest.__version__}-passhook{int(pass_hook)}", finish)


#: dmlpatch's lines said during the session: pytest captures stderr, so said as they come they
#: would land in the captured output of whichever test was running (and in its ``capsys``).
_held: list[str] = []


def _by_test() -> Optional[types.ModuleType]:
    """The per-test account, where the process counts where compute runs (a suite that never
    imported torch counts nothing, and pays nothing)."""
    if not _patched or "dmlpatch.placement.ledger" not in sys.modules:
        return None
    from dmlpatch.placement import by_test

    return by_test


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: Any, nextitem: Any) -> Iterator[None]:
    """A test's compute, from before its fixtures to after its teardown."""
    account = _by_test()
    if account is not None:
        account.begin()
    yield
    if account is not None:
        account.end(item.nodeid)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item: Any) -> None:
    """The test's arguments, fixtures set up: its device is the value of ``device``."""
    account = _by_test()
    if account is not None:
        account.called(getattr(item, "funcargs", None) or {})


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """dmlpatch's lines (``running on ...``, where the tests ran, warnings) in a section of
    their own."""
    account = _by_test()
    if account is not None:
        account.say()
    if _held:
        terminalreporter.section("dmlpatch", sep="-")
        for line in _held:
            terminalreporter.write_line(line)
        _held.clear()


def pytest_unconfigure(config: Any) -> None:
    """Lines from here on (the exit's) go to stderr, where pytest no longer captures; any
    held line no summary showed (``-p no:terminal``, an xdist worker) goes there too."""
    if _patched:
        account = _by_test()
        if account is not None:
            account.say()
        log.divert(None)
        for line in _held:
            log.say(line.partition("dmlpatch: ")[2])
        _held.clear()


def pytest_collection_modifyitems(items: list[Any]) -> None:
    """A test's ``device`` (or ``dev``) parameter given a CUDA device by name (``"cuda"``,
    ``"cuda:1"``) gets the target's in its place, as a CUDA literal in the suite's source would:
    torchvision's ``cpu_and_cuda()`` returns ``("cpu", pytest.param("cuda",
    marks=pytest.mark.needs_cuda))`` from a helper module, and no site of the test says that
    the string names a device. Only parameters so named are taken: under another name the
    string may be a key (kornia's ``device_name`` looks ``"cuda"`` up in a table of its
    own, which already holds the device). The test keeps its id (``[cuda]``), and ``device ==
    "cuda"`` in a rewritten module still holds (``dmlpatch.runtime.device_tests.CudaSpelled``).
    Off an accelerator the value is the CPU, where the suite's own CUDA check skips it as under
    plain python."""
    if not _patched:
        return
    from dmlpatch.runtime import cuda_device

    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", None)
        if not params:
            continue
        for name in DEVICE_PARAMETERS.intersection(params):
            value = params[name]
            if value.__class__ is not str:
                continue
            if cuda_device.cuda_ordinal(value) is not cuda_device.NOT_CUDA:
                params[name] = cuda_device.device(value)


#: The parameter names suites give the device a test runs on (torchvision's operator and
#: transform tests ``device``, its model tests ``dev``; most suites ``device``).
DEVICE_PARAMETERS = frozenset({"device", "dev"})


_patched = hook.is_installed()
if _patched:
    from dmlpatch.rewriting import composition

    composition.register(PYTEST_LOADER, _composer)
    hook.to_front()
    log.divert(_held.append)
