"""Writing a file so that a reader sees the old content or the new, never a torn one.

The data goes to a temporary file beside the destination (same directory: same file system),
which then replaces it with ``os.replace``. The temporary name carries the process and thread,
so concurrent writers never share one, and needs no ``tempfile`` (whose imports would cost the
processes that write a cache at start-up). On any failure the temporary file is removed and the
``OSError`` propagates: a cache skips the write, a command turns it into its one-line error.
"""

from __future__ import annotations

import _thread
import contextlib
import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Optional, Union


def write(
    path: Union[str, os.PathLike[str]],
    data: bytes,
    *,
    mode: Optional[int] = None,
    durable: bool = False,
) -> None:
    """Replace ``path`` with ``data``, creating missing directories.

    ``mode`` sets the permission bits whatever the umask (else the umask decides, as for any new
    file); ``durable`` flushes the data to disk before the replace, for files a user relies on
    across a crash (an activation line, a pip configuration), not for caches.
    """
    path = os.fspath(path)
    directory = os.path.dirname(path)
    if directory:
        os.makedirs(directory, exist_ok=True)
    temporary = f"{path}.{os.getpid()}.{_thread.get_ident()}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    # Created with no more than its final bits: in a directory others can write, a file that is
    # writable by them for a moment could be opened then and written after the replace.
    initial = 0o666 if mode is None else mode
    try:
        descriptor = os.open(temporary, flags, initial)
    except FileExistsError:  # left by a writer that died, whose process id has come round again
        os.unlink(temporary)
        descriptor = os.open(temporary, flags, initial)
    try:
        with os.fdopen(descriptor, "wb") as stream:
            if mode is not None:
                _set_mode(stream.fileno(), temporary, mode)
            stream.write(data)
            if durable:
                stream.flush()
                os.fsync(stream.fileno())
        os.replace(temporary, path)
    except BaseException:
        # Disk full, or on Windows a reader holding the old file open: the old file stays.
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def _set_mode(descriptor: int, path: str, mode: int) -> None:
    """The bits the umask took away, given back (on the descriptor where the platform can)."""
    if hasattr(os, "fchmod"):
        os.fchmod(descriptor, mode)
    else:
        os.chmod(path, mode)
