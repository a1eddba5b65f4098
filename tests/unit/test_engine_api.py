"""The public process API: dmlpatch.patch() and its opposite, dmlpatch.unpatch().

Each case runs in a fresh interpreter: patching changes process-wide state (the import hook,
the configured device, the scope in the environment)."""

from __future__ import annotations

import json

from support import clean_env, run_python

PROGRAM = """
import json
import dmlpatch
from dmlpatch.specs import engine
from dmlpatch.rewriting import hook

patched = bool(dmlpatch.patch("cpu"))  # the handle: true while patches are active
during = [engine.is_patched(), hook.is_installed()]
# The public functions outlive the import of every subpackage (a subpackage named like one
# would replace it as an attribute of the package).
import dmlpatch.devices.resolution, dmlpatch.patches, dmlpatch.specs.plan  # noqa: E401,F401
assert str(dmlpatch.device()) == "cpu" and dmlpatch.describe()["backend"] == "cpu"
dmlpatch.unpatch()
print(json.dumps([patched, during, [engine.is_patched(), hook.is_installed()]]))
"""


def test_patch_installs_the_hook_and_unpatch_removes_it() -> None:
    result = run_python(["-c", PROGRAM])
    assert result.code == 0, result.err
    assert json.loads(result.out) == [True, [True, True], [False, False]]


def test_patch_is_refused_when_disabled() -> None:
    result = run_python(["-c", PROGRAM], env=clean_env(DMLPATCH_DISABLE="1"))
    assert result.code == 0, result.err
    assert json.loads(result.out) == [False, [False, False], [False, False]]


HANDLE = """
import json, os, sys
import dmlpatch
from dmlpatch.errors import UsageError
from dmlpatch.specs import engine
from dmlpatch.rewriting import hook
from dmlpatch.startup import sequence

def state():
    return [engine.is_patched(), hook.is_installed(), "torch" in hook._watched]

before = state()
with dmlpatch.patch("cpu") as started:
    during = [bool(started), state(), sequence.current() is started]
    again = dmlpatch.patch("cpu") is started  # a process starts once
after = [bool(started), state(), sequence.current()]
try:
    dmlpatch.patch("gpu")
except UsageError as error:
    refused = str(error).split(";")[0]
handle = dmlpatch.patch("cpu")
handle.undo()
print(json.dumps([before, during, again, after, refused, state()]))
"""


def test_patch_returns_a_handle_that_undoes_exactly_what_it_installed() -> None:
    result = run_python(["-c", HANDLE])
    assert result.code == 0, result.err
    before, during, again, after, refused, final = json.loads(result.out)
    assert before == [False, False, False]
    assert during == [True, [True, True, True], True]
    assert again is True
    assert after == [False, [False, False, False], None]
    assert refused == "unknown device spec 'gpu'"
    assert final == [False, False, False]
