"""The suite's network guard: a test may reach loopback, and an address only while this
machine's route to it is a bridge this run made.

::

    socket.connect / connect_ex / getaddrinfo (patched by conftest.py)
      └ allowed(host): loopback, or a name that stays on this machine ─> go on
                       an address: the longest-prefix route in /proc/net/route
                         via one of ``our_bridges``, no gateway      ─> go on
                         anything else (the default route, another
                         run's bridge, eth0's own subnet)              ─> refused

Allowing the test range by address is not enough: when a bridge goes (another run on this
machine took it down, or our own close), its addresses route through the default route and
off the machine, where a middlebox accepts TCP and never answers (``Error reading SSH
protocol banner``). The route is read at each connect, so a bridge that went is refused at
once. ``sshhosts.Hosts`` adds its bridge to ``our_bridges`` when it is up and takes it out
before it goes.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
from collections.abc import Iterable
from typing import Any

# Bridges this test run made and still owns. Only names: an interface of that name exists
# only while the run holds its lock (sshhosts), so no other run's bridge goes by it.
our_bridges: set[str] = set()

_LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "", None}

Route = tuple[ipaddress.IPv4Network, str, int]  # destination, interface, gateway


def routes() -> list[Route]:
    """This machine's IPv4 routes, as the kernel lists them in ``/proc/net/route``."""
    found: list[Route] = []
    with open("/proc/net/route") as table:
        next(table)  # the header
        for line in table:
            fields = line.split()
            destination = socket.inet_ntoa(struct.pack("<I", int(fields[1], 16)))
            mask = socket.inet_ntoa(struct.pack("<I", int(fields[7], 16)))
            network = ipaddress.IPv4Network(f"{destination}/{mask}", strict=False)
            found.append((network, fields[0], int(fields[2], 16)))
    return found


def route_for(address: ipaddress.IPv4Address, table: Iterable[Route]) -> Route | None:
    """The route the kernel takes to ``address``: the longest prefix that holds it."""
    matches = [route for route in table if address in route[0]]
    return max(matches, key=lambda route: route[0].prefixlen, default=None)


def on_our_bridge(
    address: ipaddress.IPv4Address, table: Iterable[Route], bridges: Iterable[str]
) -> bool:
    """True if ``address`` is reached directly (no gateway, not the default route) through
    one of ``bridges``."""
    route = route_for(address, table)
    if route is None:
        return False
    network, interface, gateway = route
    return network.prefixlen > 0 and gateway == 0 and interface in set(bridges)


def allowed(host: Any) -> bool:
    if host in _LOOPBACK_NAMES or host == socket.gethostname():
        return True
    try:
        address = ipaddress.ip_address(str(host).split("%")[0])
    except ValueError:
        return False  # any other name would be looked up off this machine
    if address.is_loopback:
        return True
    if not isinstance(address, ipaddress.IPv4Address):
        return False  # the test networks are IPv4 only
    return on_our_bridge(address, routes(), our_bridges)


def _check(address: Any) -> None:
    if isinstance(address, tuple) and not allowed(address[0]):
        raise ConnectionRefusedError(
            f"test network guard: refusing to connect to {address!r}: neither loopback nor "
            f"routed to a bridge this run made ({', '.join(sorted(our_bridges)) or 'none'})"
        )


_connect = socket.socket.connect
_connect_ex = socket.socket.connect_ex
_getaddrinfo = socket.getaddrinfo


def _guarded_connect(self: socket.socket, address: Any) -> None:
    _check(address)
    _connect(self, address)


def _guarded_connect_ex(self: socket.socket, address: Any) -> int:
    _check(address)
    return _connect_ex(self, address)


def _guarded_getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
    if isinstance(host, bytes):
        host = host.decode()
    if not allowed(host):
        raise socket.gaierror(f"test network guard: refusing to look up {host!r}")
    return _getaddrinfo(host, *args, **kwargs)


def install() -> None:
    """Guard every socket of this process from now on."""
    socket.socket.connect = _guarded_connect  # type: ignore[method-assign]
    socket.socket.connect_ex = _guarded_connect_ex  # type: ignore[method-assign]
    socket.getaddrinfo = _guarded_getaddrinfo
