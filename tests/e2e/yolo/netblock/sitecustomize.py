"""Put on ``PYTHONPATH`` by the YOLO tests: every network attempt fails and is written down.

Ultralytics reaches the network for fonts, weights, settings sync and update checks; the tests
run offline and assert that no attempt was made at all, so each one is recorded in the file
named by ``$YOLO_TEST_NETLOG`` (one line per attempt) before it is refused. Local (AF_UNIX)
sockets keep working.
"""

from __future__ import annotations

import os
import socket
from typing import Any

_INTERNET = (socket.AF_INET, socket.AF_INET6)
_connect = socket.socket.connect
_connect_ex = socket.socket.connect_ex


def _record(what: object) -> None:
    path = os.environ.get("YOLO_TEST_NETLOG")
    if path:
        with open(path, "a", encoding="utf-8") as log:
            log.write(f"{what!r}\n")


def _blocked(what: object) -> OSError:
    _record(what)
    return OSError(f"network blocked by the dmlpatch YOLO tests: {what!r}")


def _guarded_connect(self: socket.socket, address: Any) -> None:
    if self.family in _INTERNET:
        raise _blocked(("connect", address))
    _connect(self, address)


def _guarded_connect_ex(self: socket.socket, address: Any) -> int:
    if self.family in _INTERNET:
        raise _blocked(("connect", address))
    return _connect_ex(self, address)


def _refuse_lookup(host: Any, *args: Any, **kwargs: Any) -> Any:
    _record(("getaddrinfo", host))
    raise socket.gaierror(f"network blocked by the dmlpatch YOLO tests: {host!r}")


socket_class: Any = socket.socket  # methods replaced, as no type checker expects
socket_class.connect = _guarded_connect
socket_class.connect_ex = _guarded_connect_ex
socket.getaddrinfo = _refuse_lookup
