"""Errors that reach users as one line and an exit code, never as a traceback."""

from __future__ import annotations


class DmlpatchError(Exception):
    """A problem the user can fix; its message is the whole story, in one line."""

    exit_code = 2


class DeviceUnavailable(DmlpatchError):
    """The requested device cannot be used here (the message says why)."""


class SpecError(DmlpatchError):
    """A patch spec is malformed; the message names the file and the field."""


class UsageError(DmlpatchError):
    """Bad command-line input."""
