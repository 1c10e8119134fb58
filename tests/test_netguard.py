"""The test network: the guard allows an address only while it routes to a bridge this run
made, and the SSH hosts' fixture takes a subnet no other run holds and removes only what it
made (``support/netguard.py``, ``support/sshhosts.py``)."""

from __future__ import annotations

import fcntl
import ipaddress
import os
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from support import netguard
from support.sshhosts import Hosts, _claim_tag

_DEFAULT = (ipaddress.IPv4Network("0.0.0.0/0"), "eth0", 0x010200C0)


def _unrouted_test_address() -> str:
    """An address of the test range that no bridge here serves: it routes off the machine."""
    table = netguard.routes()
    for tag in range(256):
        address = ipaddress.IPv4Address(f"10.123.{tag}.11")
        route = netguard.route_for(address, table)
        if route is None or route[0].prefixlen == 0:
            return str(address)
    raise AssertionError("every 10.123.N.0/24 has a route here")


def test_an_address_in_the_test_range_without_a_bridge_is_refused() -> None:
    address = _unrouted_test_address()
    # The decision first, so that a wrong one fails here and sends nothing.
    assert not netguard.allowed(address)
    with socket.socket() as probe, pytest.raises(ConnectionRefusedError, match="network guard"):
        probe.connect((address, 22))
    with socket.socket() as probe, pytest.raises(ConnectionRefusedError, match="network guard"):
        probe.connect_ex((address, 22))
    with pytest.raises(socket.gaierror, match="network guard"):
        socket.getaddrinfo(address, 22)


def test_a_host_is_reachable_while_its_bridge_is_ours_and_not_after(ssh_hosts: Hosts) -> None:
    address = ipaddress.IPv4Address(ssh_hosts.hosts[0].address)
    table = netguard.routes()
    assert netguard.allowed(str(address))
    assert netguard.on_our_bridge(address, table, {ssh_hosts.bridge})
    # The same route through a bridge this run did not make (another run's) is refused.
    assert not netguard.on_our_bridge(address, table, {"skybr-other"})
    # When the bridge has gone, the address routes through the default route: refused.
    without = [route for route in table if route[1] != ssh_hosts.bridge]
    assert not netguard.on_our_bridge(address, [*without, _DEFAULT], {ssh_hosts.bridge})


def test_the_default_route_and_a_gateway_are_never_allowed() -> None:
    address = ipaddress.IPv4Address("10.123.7.11")
    via_gateway = (ipaddress.IPv4Network("10.123.7.0/24"), "skybr7", 0x0101A8C0)
    assert not netguard.on_our_bridge(address, [_DEFAULT], {"eth0"})
    assert not netguard.on_our_bridge(address, [_DEFAULT, via_gateway], {"skybr7"})
    direct = (ipaddress.IPv4Network("10.123.7.0/24"), "skybr7", 0)
    assert netguard.on_our_bridge(address, [_DEFAULT, direct], {"skybr7"})


@contextmanager
def _held_by_another_run(tag: int) -> Iterator[None]:
    """``tag``'s lock, held as another run would hold it (its own open file)."""
    fd = os.open(f"/run/lock/skyward-net-10.123.{tag}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        yield
    finally:
        os.close(fd)


def _next_free_tag() -> int:
    tag, lock = _claim_tag()
    os.close(lock)
    return tag


@pytest.mark.timeout(60)
def test_hosts_skip_a_subnet_another_run_holds() -> None:
    taken = _next_free_tag()
    with _held_by_another_run(taken):
        hosts = Hosts.start(0)
        try:
            assert hosts.tag != taken
            assert hosts.bridge in netguard.our_bridges
        finally:
            hosts.close()
    assert hosts.leftovers() == []
    assert hosts.bridge not in netguard.our_bridges


@pytest.mark.timeout(60)
def test_hosts_skip_and_keep_what_a_killed_run_left() -> None:
    # A namespace of a run that was killed: its lock went with it, its names stayed.
    tag = _next_free_tag()
    left = f"skyward-{tag}-h0"
    with _held_by_another_run(tag):  # made under the lock, as that run did
        subprocess.run(["ip", "netns", "add", left], check=True, timeout=30)
    try:
        hosts = Hosts.start(0)
        try:
            assert hosts.tag != tag
        finally:
            hosts.close()
        names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30)
        assert left in names.stdout.split(), "a fixture removed a namespace it did not make"
    finally:
        with _held_by_another_run(tag):
            subprocess.run(["ip", "netns", "del", left], check=False, timeout=30)


@pytest.mark.timeout(60)
def test_two_sets_of_hosts_in_one_run_leave_each_other_alone() -> None:
    first = Hosts.start(1)
    try:
        second = Hosts.start(1)
        assert second.tag != first.tag
        second.close()
        assert second.leftovers() == []
        # The first set's bridge and host are untouched by the second's close.
        assert os.path.exists(f"/sys/class/net/{first.bridge}")
        with socket.create_connection((first.hosts[0].address, 22), timeout=5) as ssh:
            assert ssh.recv(4).startswith(b"SSH-")
    finally:
        first.close()
    assert first.leftovers() == []
