"""Free TCP ports for the broker and tests, picked below the kernel's ephemeral range."""

from __future__ import annotations

import os
import secrets
import socket
from pathlib import Path


def ephemeral_port_range() -> tuple[int, int]:
    """The kernel's range for the source ports of outgoing connections (Linux; else IANA's)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 49152, 65535


# The low end of the ports picked below the ephemeral range (above common services).
PICK_FROM = 15000
# "LOW-HIGH": where free_port picks (each parallel test worker gets a range of its own).
PORT_RANGE_ENV = "DLQ_FREE_PORT_RANGE"


def pick_range() -> range:
    """Where free_port picks: $DLQ_FREE_PORT_RANGE, else from 15000 up to the ephemeral range."""
    given = os.environ.get(PORT_RANGE_ENV, "")
    if given:
        low, _, high = given.partition("-")
        return range(int(low), int(high) + 1)
    return default_pick_range()


def default_pick_range() -> range:
    """From PICK_FROM up to the kernel's ephemeral range (empty when there is no room)."""
    return range(PICK_FROM, ephemeral_port_range()[0])


# The ports free_port gave this process: a second pick before the first is bound could give the same
# one (two servers of one test, each told to listen on "a free port"). Bounded by the range's size.
_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A TCP port free on 127.0.0.1, below the kernel's ephemeral range when there is room.

    A port from the ephemeral range (what binding port 0 gives) can be taken by any outgoing
    connection, as its source port, and is what the next bind to port 0 anywhere may get: between
    the pick and the listener's bind, or while the listener is down (a broker killed and restarted
    on the same ports). Below that range only an explicit bind can take it, and with
    $DLQ_FREE_PORT_RANGE each process sharing the machine (the test workers) picks from its own.
    A process is never given the same port twice.
    """
    candidates = pick_range()
    if len(candidates) >= 100:
        for port in secrets.SystemRandom().sample(candidates, 64):
            if port in _HANDED_OUT:
                continue  # free now, but maybe not yet bound by whoever got it
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
                _HANDED_OUT.add(port)
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
