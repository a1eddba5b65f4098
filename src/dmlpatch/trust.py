"""Whose files dmlpatch runs: the directories and files it loads code or verdicts from.

dmlpatch starts inside every Python process of an activated environment, root's included, and
loads what its caches hold: the simulated device's shared library, rewritten bytecode, discovery's
verdicts and patch plans (which name functions to import and wrap). Whoever can write one of
those runs code in the process that reads it. So, as ssh does for ``~/.ssh`` and pip for its
cache, dmlpatch trusts a file only when

- it is a regular file owned by this user (or root, or for rewritten bytecode the source's own
  owner, who can change the source anyway), writable by nobody else, checked on the open
  descriptor (:func:`read`), so that nothing can be swapped in between the check and the read;
- the simulator's library, which the dynamic loader opens by name, also lies in a directory
  whose every ancestor is owned by this user or root and writable by nobody else, unless the
  sticky bit keeps others from renaming what is not theirs (``/tmp``) or the group is the
  user's private one (one member, named after the user: Debian's and Fedora's default with
  umask 002) (:func:`directory_problem`).

What dmlpatch creates is private whatever the umask: directories 0700, files 0600
(:func:`make_directory`, and ``atomic.write``'s ``mode``); a cache directory of its own that an
older release left group-writable is made private again. A cache that fails these checks is not
used (one warning says why) or, file by file, is a miss that is written anew.

Windows has neither owners by number nor these mode bits: there a user's profile (where the
cache lives) is private by its ACL, and none of these checks applies.
"""

from __future__ import annotations

import os
import stat

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Optional

#: Where these checks apply (Windows has no st_uid to compare).
APPLIES = hasattr(os, "geteuid")

PRIVATE_DIRECTORY = 0o700
PRIVATE_FILE = 0o600

_chains: dict[str, Optional[str]] = {}
_private_group: dict[int, bool] = {}


def me() -> int:
    """The effective user id, whose files this process trusts (with root's)."""
    return os.geteuid() if APPLIES else 0


def trusted_owner(uid: int, also: Optional[int] = None) -> bool:
    return uid == me() or uid == 0 or (also is not None and uid == also)


def file_problem(status: os.stat_result, also: Optional[int] = None) -> Optional[str]:
    """Why a file with ``status`` (an ``fstat`` of the open descriptor) is not trusted."""
    if not APPLIES:
        return None
    if not stat.S_ISREG(status.st_mode):
        return "is not a regular file"
    if not trusted_owner(status.st_uid, also):
        return f"belongs to uid {status.st_uid}, not to you (uid {me()})"
    if status.st_mode & 0o022:
        return f"is writable by other users (mode {stat.S_IMODE(status.st_mode):04o})"
    return None


def read(path: str, also: Optional[int] = None) -> Optional[bytes]:
    """The content of ``path`` when it is a file this user can trust, else None (a miss)."""
    try:
        descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
    except OSError:
        return None
    with open(descriptor, "rb") as stream:
        try:
            if file_problem(os.fstat(descriptor), also) is not None:
                return None
            return stream.read()
        except OSError:
            return None


def directory_problem(path: str) -> Optional[str]:
    """Why code in the existing directory ``path`` could be replaced by another user, or None.

    Checks the directory and every ancestor of its real path (symbolic links resolved), as ssh
    checks the path to an ``authorized_keys`` file. Answers are kept for the process.
    """
    if not APPLIES:
        return None
    real = os.path.realpath(path)
    if real in _chains:
        return _chains[real]
    problem = entry_problem(real)
    if problem is None:
        parent = os.path.dirname(real)
        problem = directory_problem(parent) if parent != real else None
    _chains[real] = problem
    return problem


def entry_problem(path: str) -> Optional[str]:
    """Why the directory ``path`` itself (not its ancestors) lets another user replace what it
    holds, or None."""
    if not APPLIES:
        return None
    try:
        status = os.stat(path)
    except OSError as error:
        return f"{path} cannot be examined ({error.strerror})"
    if not stat.S_ISDIR(status.st_mode):
        return f"{path} is not a directory"
    if not trusted_owner(status.st_uid):
        return f"{path} belongs to uid {status.st_uid}, not to you (uid {me()})"
    mode = stat.S_IMODE(status.st_mode)
    if mode & stat.S_ISVTX:
        return None  # others may add entries, but rename or remove only their own
    if mode & 0o002 or (mode & 0o020 and not _group_is_private(status.st_gid)):
        return f"{path} is writable by other users (mode {mode:04o})"
    return None


def _group_is_private(gid: int) -> bool:
    """Whether ``gid`` is this user's private group: its primary one, named after it, with no
    other member (Debian's and Fedora's user-private groups, where umask 002 is the default)."""
    if gid not in _private_group:
        import grp
        import pwd

        try:
            user = pwd.getpwuid(me())
            group = grp.getgrgid(gid)
        except KeyError:
            _private_group[gid] = False
        else:
            _private_group[gid] = (
                user.pw_gid == gid
                and group.gr_name == user.pw_name
                and all(member == user.pw_name for member in group.gr_mem)
            )
    return _private_group[gid]


def make_directory(path: str) -> Optional[str]:
    """Create ``path`` (and missing parents) private, or make an existing one of ours private
    again; then why it cannot be trusted, or None (and nothing made where an ancestor cannot be
    trusted). Raises ``OSError`` when it cannot be made."""
    missing = []
    current = os.path.abspath(path)
    while not os.path.isdir(current):
        missing.append(current)
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    if missing:
        problem = directory_problem(current)  # nothing is made where it would not be used
        if problem is not None:
            return problem
    for directory in reversed(missing):
        try:
            os.mkdir(directory, PRIVATE_DIRECTORY)
        except FileExistsError:
            if not os.path.isdir(directory):
                raise
        else:
            os.chmod(directory, PRIVATE_DIRECTORY)  # what the umask took away
    if APPLIES:
        status = os.stat(path)
        if status.st_uid == me() and stat.S_IMODE(status.st_mode) != PRIVATE_DIRECTORY:
            os.chmod(path, PRIVATE_DIRECTORY)  # whatever the umask, or an older release, made
        _chains.pop(os.path.realpath(path), None)
    return directory_problem(path)


def forget() -> None:
    """Forget the answers kept for this process (tests change modes and owners between runs)."""
    _chains.clear()
    _private_group.clear()
