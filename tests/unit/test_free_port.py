"""The launcher's port picks: free, and out of the range the kernel gives outgoing connections."""

from __future__ import annotations

import socket

import pytest

from sidecar.ops import kafka_broker
from sidecar.ops.kafka_broker import ephemeral_port_range, free_port


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def test_picks_are_free_and_below_the_ephemeral_range() -> None:
    # An outgoing connection's source port comes from the ephemeral range: a broker listening there can
    # lose its port to one while it is down (a kill and restart on the same ports).
    low, high = ephemeral_port_range()
    assert 0 < low <= high <= 65535
    ports = {free_port() for _ in range(30)}
    assert len(ports) > 1  # random picks, not one fixed port
    for port in ports:
        assert 15000 <= port < low, (port, low)
        assert _bindable(port)


def test_a_port_in_use_is_never_picked(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        # Only the taken port and one other below a narrowed "ephemeral" range: the other one is picked.
        monkeypatch.setattr(kafka_broker, "_PICK_FROM", taken - 1 if taken > 1024 else taken)
        monkeypatch.setattr(kafka_broker, "ephemeral_port_range", lambda: (taken + 1000, 65535))
        picks = {free_port() for _ in range(20)}
        assert taken not in picks


def test_without_room_below_the_range_the_kernel_picks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kafka_broker, "ephemeral_port_range", lambda: (15500, 60999))
    port = free_port()
    assert _bindable(port)
