"""The listening socket of a server or router: TCP (so that every accepted socket gets TCP_NODELAY),
SO_REUSEADDR, and with llama-server's `--reuse-port` SO_REUSEPORT, so that several processes may
bind one port and the kernel spreads connections over them. A port that cannot be bound is one line.
"""

from __future__ import annotations

import socket

from slotserver.errors import ConfigError


def bind(host: str, port: int, reuse_port: bool = False) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto=IPPROTO_TCP matters: asyncio only sets TCP_NODELAY on accepted sockets whose proto says
    # TCP, and without it every response waits ~40 ms for Nagle + delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.listen(2048)
    return sock
