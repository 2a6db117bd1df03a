"""The HTTP server's address: ``HOST:PORT`` parsed and checked, one rule for ``--http``,
``[server] http`` and :class:`~deltastream.daemon.service.supervisor.ServiceConfig`, and a
bind probe that finds a port in use (or a host that is not this machine's) before any stream
starts.

Kept apart from :mod:`~deltastream.daemon.service.server` so that checking a configuration
does not import the HTTP server.
"""

from __future__ import annotations

import re
import socket

from deltastream.errors import InvalidArgumentError

__all__ = ["check_bindable", "parse_address"]

#: A host name, an IPv4 address, or an IPv6 address (in brackets or not); an empty host
#: means 127.0.0.1. Anything else (a scheme, a path, spaces) is a mistake worth naming.
_HOST = re.compile(r"^(\[[0-9A-Fa-f:.%\w-]+\]|[0-9A-Fa-f:.%\w-]*)$")


def parse_address(text: str, label: str = "HTTP address") -> tuple[str, int]:
    """``(host, port)`` from ``HOST:PORT`` (``[::1]:9464`` for IPv6; port 0 picks a free
    one; no host: 127.0.0.1). ``label`` names the setting in errors (``--http``, ``'http'``)."""
    host, sep, port = text.rpartition(":")
    if not sep or not _HOST.match(host):
        raise InvalidArgumentError(f"{label} must be HOST:PORT (e.g. 127.0.0.1:9464), not {text!r}")
    if not port.isdigit() or int(port) > 65535:
        raise InvalidArgumentError(
            f"{label} {text!r}: the port must be a number from 0 to 65535, not {port!r}"
        )
    return host.strip("[]") or "127.0.0.1", int(port)


def check_bindable(address: str, label: str = "HTTP address") -> None:
    """Bind (and release) every socket the server would listen on at ``address``: a port in
    use, a host that does not resolve or is not this machine's, or a port below 1024 without
    the right to it is an :class:`~deltastream.errors.InvalidArgumentError` now, at start,
    rather than a failure of the running service. (The server binds again when it starts,
    before any stream; what happens in between is left to that bind.)"""
    host, port = parse_address(address, label)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as e:  # socket.gaierror: unknown host
        raise InvalidArgumentError(f"cannot listen on {address}: {e.strerror or e}") from None
    for family, kind, proto, _, sockaddr in infos:
        with socket.socket(family, kind, proto) as probe:
            # As asyncio's server does, so that a port with connections lingering in
            # TIME_WAIT counts as free here exactly when it is free there.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                probe.bind(sockaddr)
            except OSError as e:
                raise InvalidArgumentError(
                    f"cannot listen on {address}: {e.strerror or e}"
                ) from None
