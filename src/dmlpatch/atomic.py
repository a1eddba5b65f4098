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

    ``mode`` sets the permission bits (else the umask decides, as for any new file); ``durable``
    flushes the data to disk before the replace, for files a user relies on across a crash (an
    activation line, a pip configuration), not for caches.
    """
    path = os.fspath(path)
    directory = os.path.dirname(path)
    if directory:
        os.makedirs(directory, exist_ok=True)
    temporary = f"{path}.{os.getpid()}.{_thread.get_ident()}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    try:
        descriptor = os.open(temporary, flags, 0o666)
    except FileExistsError:  # left by a writer that died, whose process id has come round again
        os.unlink(temporary)
        descriptor = os.open(temporary, flags, 0o666)
    try:
        with os.fdopen(descriptor, "wb") as stream:
            stream.write(data)
            if durable:
                stream.flush()
                os.fsync(stream.fileno())
        if mode is not None:
            os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        # Disk full, or on Windows a reader holding the old file open: the old file stays.
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
