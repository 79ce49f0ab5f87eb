"""The launcher's port picks: free, out of the range the kernel gives outgoing connections and port-0
binds, and inside $DLQ_FREE_PORT_RANGE when it is set (each parallel test worker has its own)."""

from __future__ import annotations

import socket

import pytest

from sidecar.ops.broker import PORT_RANGE_ENV, ephemeral_port_range, free_port
from sidecar.ops.broker import ports as kafka_broker


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def test_picks_are_free_and_below_the_ephemeral_range(monkeypatch: pytest.MonkeyPatch) -> None:
    # An outgoing connection's source port, and any bind to port 0, come from the ephemeral range: a
    # broker listening there can lose its port to one while it is down (a kill and restart).
    monkeypatch.delenv(PORT_RANGE_ENV, raising=False)
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
        # The taken port and the 99 after it make up the range: the taken one is never picked.
        monkeypatch.setenv(PORT_RANGE_ENV, f"{taken}-{taken + 99}")
        picks = {free_port() for _ in range(50)}
        assert taken not in picks
        assert all(taken < p <= taken + 99 for p in picks), picks


def test_a_range_of_its_own_is_kept_to(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PORT_RANGE_ENV, "21000-21499")
    assert {free_port() for _ in range(50)} <= set(range(21000, 21500))


def test_without_room_below_the_range_the_kernel_picks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PORT_RANGE_ENV, raising=False)
    monkeypatch.setattr(kafka_broker, "ephemeral_port_range", lambda: (15050, 60999))
    assert _bindable(free_port())


def test_each_test_worker_has_a_range_of_its_own() -> None:
    from tests.conftest import worker_port_range

    low, _ = ephemeral_port_range()
    ranges = [worker_port_range(f"gw{i}", 3) for i in range(3)]
    assert worker_port_range(None, 1) is None  # one process: the whole range
    for i, (lo, hi) in enumerate(ranges):
        assert 15000 <= lo < hi < low and hi - lo >= 1000
        if i:
            assert lo > ranges[i - 1][1]  # disjoint


def test_a_process_is_never_given_the_same_port_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    # Two servers of one test each told to listen on "a free port" before either binds: with picks
    # from a range of 100, 60 picks would give a repeat almost surely without the memory of them.
    monkeypatch.setenv(PORT_RANGE_ENV, "20000-20099")
    monkeypatch.setattr(kafka_broker, "_HANDED_OUT", set())
    ports = [free_port() for _ in range(60)]
    assert len(set(ports)) == len(ports)
