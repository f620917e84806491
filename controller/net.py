"""Socket helpers shared by the controller's listeners."""

from __future__ import annotations

import socket

OBSERVER_BACKLOG = 64  # the observer port's: one connection per real rank, at start-up


def listener(host: str, backlog: int = 1024) -> socket.socket:
    """A non-blocking TCP listener on `host` at an ephemeral port."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, 0))
    s.listen(backlog)
    s.setblocking(False)
    return s
