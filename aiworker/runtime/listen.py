"""Listening addresses given as ADDRESS:PORT (the web plane, its systemd unit)."""

from __future__ import annotations

import ipaddress

from aiworker.errors import InvalidInput

DEFAULT_LISTEN = "127.0.0.1:8765"


def parse_listen(listen: str, option: str = "--listen") -> tuple[str, int]:
    """(host, port) of LISTEN; refused naming OPTION, the option it was given as."""
    host, sep, port = listen.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise InvalidInput(f"{option} {listen!r}: expected ADDRESS:PORT, e.g. {DEFAULT_LISTEN}")
    if host != "localhost":
        try:
            ipaddress.ip_address(host)
        except ValueError:
            raise InvalidInput(f"{option} {listen!r}: {host!r} is not an IP address") from None
    return host, int(port)


def is_loopback(host: str) -> bool:
    return host == "localhost" or ipaddress.ip_address(host).is_loopback
