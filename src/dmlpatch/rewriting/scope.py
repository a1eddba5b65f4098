"""The scope setting: which modules discovery rewrites (``--scope`` / ``$DMLPATCH_SCOPE``).

``all``, ``project`` or ``specs`` (``dmlpatch.rewriting.discovery`` says what each covers). The
setting is read by the runner's parser, the specs engine, the report and ``dmlpatch check``'s
causes; it lives apart from discovery so that none of them loads discovery to read it.
"""

from __future__ import annotations

import os

from dmlpatch.environment_variables import DMLPATCH_SCOPE

SCOPES = ("all", "project", "specs")


def parse_scope(text: str) -> str:
    """Validate a scope name; :class:`UsageError` names the accepted ones."""
    from dmlpatch.errors import UsageError

    scope = text.strip().lower()
    if scope not in SCOPES:
        raise UsageError(f"unknown scope {text!r}; expected one of: {', '.join(SCOPES)}")
    return scope


def configured_scope() -> str:
    """``$DMLPATCH_SCOPE``, else ``all``; an unknown value is one warning and means ``all``."""
    text = os.environ.get(DMLPATCH_SCOPE)
    if not text:
        return "all"
    if text.strip().lower() in SCOPES:
        return text.strip().lower()
    from dmlpatch import log

    log.warn_once(
        "scope", f"{DMLPATCH_SCOPE}={text!r} is not one of {', '.join(SCOPES)}; using 'all'"
    )
    return "all"
