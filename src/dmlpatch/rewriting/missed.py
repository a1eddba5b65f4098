"""Where CUDA reached torch although dmlpatch runs the program, and why it was not answered.

A program that still dies with one of CUDA's own errors (``Found no NVIDIA driver``, ``Torch
not compiled with CUDA enabled``, ``Cannot get CUDA generator``, ``CUDA driver version is
insufficient``, ``Attempting to deserialize object on a CUDA device``) handed CUDA's name to
torch on a road dmlpatch did not meet. The innermost frame of the traceback outside torch and
dmlpatch is that road: the call on that line passed the device. :func:`explain` names it, with
the reason, told from what the rewriter does with that file:

- the module was not rewritten: out of the scope (``--scope``), left alone by a spec, torch's
  own, or a library that names no CUDA device itself and was handed this one;
- the function keeps CUDA's meaning (it uses a ``torch.cuda`` name dmlpatch cannot answer);
- the module was rewritten but nothing on that line is a site: the device reached torch
  through a call dmlpatch does not know takes one (``**options``, a function held in a
  variable, ``getattr(torch, name)``).

The runner prints it under the program's traceback (``dmlpatch: CUDA reached torch at ...``)
and ``dmlpatch check`` gives it as its verdict.
"""

from __future__ import annotations

import linecache
from types import TracebackType
from typing import Optional

from dmlpatch.runtime import ALIAS, KEPT_ALIAS

#: The first words of the errors torch raises when CUDA is asked for without a CUDA GPU.
CUDA_ONLY_ERRORS = (
    "Found no NVIDIA driver",
    "Torch not compiled with CUDA enabled",
    "Cannot get CUDA generator",
    "CUDA driver version is insufficient",
    "CUDA error: CUDA driver version is insufficient",
    "Attempting to deserialize object on a CUDA device",
    "No CUDA GPUs are available",
    "CUDA error: no CUDA-capable device is detected",
)


def is_cuda_only(error: BaseException) -> bool:
    text = str(error)
    return any(words in text for words in CUDA_ONLY_ERRORS)


def say(error: BaseException) -> None:
    """Under a traceback of CUDA's own, the line :func:`explain` gives (nothing for any other
    error): the runner's exit line."""
    if not is_cuda_only(error):
        return
    from dmlpatch import log

    try:
        explained = explain(error)
    except Exception as failure:  # a diagnosis must not hide the program's own error
        if log.debug_enabled():
            log.say(f"could not explain where CUDA reached torch: {failure!r}")
        return
    if explained is not None:
        log.say(explained)


def explain(error: BaseException) -> Optional[str]:
    """One line naming the call where CUDA reached torch and why dmlpatch did not answer it;
    None for any other error, or where no frame of the program's or a library's is found."""
    if not is_cuda_only(error):
        return None
    frame = _reaching_frame(error.__traceback__)
    if frame is None:
        return None
    path, line, function, module, rewritten, kept = frame
    text = linecache.getline(path, line).strip()
    from dmlpatch.placement import frames

    where = f"{frames.display(path)}:{line}"
    call = f" ({text})" if text else ""
    why = _why(path, line, module, rewritten, kept)
    return f"CUDA reached torch at {where} in {function}{call}: {why}"


def _reaching_frame(
    tb: Optional[TracebackType],
) -> Optional[tuple[str, int, str, str, bool, bool]]:
    """The innermost frame outside torch and dmlpatch: its file, line, function and module,
    whether its module was rewritten and whether the function keeps CUDA's meaning."""
    from dmlpatch.placement import frames

    found = None
    while tb is not None:
        frame = tb.tb_frame
        path = frame.f_code.co_filename
        if not frames.internal(path):
            module = str(frame.f_globals.get("__name__", ""))
            rewritten = ALIAS in frame.f_globals or KEPT_ALIAS in frame.f_globals
            kept = KEPT_ALIAS in frame.f_code.co_names
            found = (path, tb.tb_lineno, frame.f_code.co_name, module, rewritten, kept)
        tb = tb.tb_next
    return found


def _why(path: str, line: int, module: str, rewritten: bool, kept: bool) -> str:
    from dmlpatch import record

    _, skipped = record.module_fates()
    if kept:
        reason = skipped.get(module) or next(
            (why for name, why in skipped.items() if name.startswith(f"{module}.")), None
        )
        because = f" ({reason.split(', not answered')[0]})" if reason else ""
        return (
            f"this function keeps CUDA's meaning{because}, so dmlpatch leaves its devices "
            "as written"
        )
    if not rewritten:
        reason = skipped.get(module)
        if reason:
            return f"{module or path} was not rewritten: {reason}"
        return _unrewritten(path, line)
    sites = _sites_on(path, line)
    if sites:
        return (
            f"dmlpatch rewrote this line ({', '.join(sites)}), and CUDA still reached torch: "
            "a device made as CUDA's elsewhere, before dmlpatch started; please report it"
        )
    return _UNKNOWN_ROAD


_UNKNOWN_ROAD = (
    "nothing on this line passes a device where dmlpatch looks for one (a parameter of a "
    "torch callable, or a keyword named device, map_location or pin_memory_device): the "
    "device came through a road the rewriter does not know (**options, a callable held in a "
    "variable, getattr)"
)


def _unrewritten(path: str, line: int) -> str:
    from dmlpatch.rewriting import hook

    if not hook.is_installed():
        return "dmlpatch rewrites no code in this run (the device needs none)"
    source = _source(path)
    sites = _sites_on(path, line, source)
    if sites:
        scope = getattr(hook._discovery, "scope", "specs")
        return (
            f"its module was not rewritten ({', '.join(sites)} on this line): the scope "
            f"({scope}) leaves it out, or it was imported before dmlpatch started"
        )
    if source is not None and _holds_cuda(source, path):
        return _UNKNOWN_ROAD
    return (
        "its module was not rewritten: it names no CUDA device of its own, and the one it "
        "was handed reached torch here; the caller's device came from where it was made"
    )


def _source(path: str) -> Optional[bytes]:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError:
        return None


def _holds_cuda(source: bytes, path: str) -> bool:
    import ast

    from dmlpatch.rewriting.transform.device_sites import holds_cuda_literal

    try:
        return holds_cuda_literal(ast.parse(source, path))
    except (SyntaxError, ValueError, RecursionError):
        return False


def _sites_on(path: str, line: int, source: Optional[bytes] = None) -> list[str]:
    """The kinds of the sites the rewriter finds on ``line`` of ``path``."""
    if source is None:
        source = _source(path)
    if source is None:
        return []
    from dmlpatch.rewriting.transform import rewrite

    try:
        found = rewrite(source, path, program=_is_program(path)).sites
    except (SyntaxError, ValueError, RecursionError):
        return []
    return sorted({site.kind for site in found if site.line == line})


def _is_program(path: str) -> bool:
    from dmlpatch.rewriting.discovery import is_program_path

    return is_program_path(path)
