"""sidecar.http.seating: whom a full listener closes to make room, and the api.* limits behind it."""

from __future__ import annotations

import logging
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
import yaml
from trio.testing import MockClock

from sidecar.config import ConfigError
from sidecar.http.seating import UNIX_PEER, Seating, SeatState
from sidecar.http.server import CUT_LOG_INTERVAL_S, CUT_LOG_LINES, Limits, ServerStats
from sidecar.service.api import listener_limits
from tests.unit.test_config import MINIMAL, load_dict, patched


def test_a_full_room_closes_the_seat_longest_without_an_answer() -> None:
    room = Seating(3, 3)
    a, _ = room.admit("10.0.0.1", 0.0)
    b, _ = room.admit("10.0.0.2", 1.0)
    c, _ = room.admit("10.0.0.3", 2.0)
    assert a and b and c
    room.enter(a, SeatState.READING, 3.0)  # a slow reader since 3
    room.enter(b, SeatState.BUSY, 4.0)
    room.enter(b, SeatState.WAITING, 5.0)  # b answered a request: it waits again, since 5
    # c has waited since 2: before a began reading.
    d, evicted = room.admit("10.0.0.4", 6.0)
    assert evicted is c and c.evicted and not c.seated
    assert d is not None and room.count == 3
    # The slow reader (since 3) goes before b (waiting since 5) and the fresh d (since 6).
    e, evicted = room.admit("10.0.0.5", 7.0)
    assert evicted is a and e is not None
    e2, evicted = room.admit("10.0.0.6", 8.0)
    assert evicted is b and e2 is not None
    for seat in (d, e, e2):
        room.enter(seat, SeatState.BUSY, 9.0)
    # Every seat busy answering: nobody to close, the new connection is refused.
    assert room.admit("10.0.0.7", 10.0) == (None, None)
    assert room.count == 3 and room.peers == 3


def test_a_peer_at_its_cap_makes_room_among_its_own_connections() -> None:
    room = Seating(10, 2)
    other, _ = room.admit("10.0.0.9", 0.0)  # older than the noisy peer's seats
    first, _ = room.admit("10.0.0.1", 1.0)
    second, _ = room.admit("10.0.0.1", 2.0)
    third, evicted = room.admit("10.0.0.1", 3.0)
    assert evicted is first and third is not None
    assert other is not None and other.seated and room.count == 3
    assert second is not None
    room.enter(second, SeatState.BUSY, 4.0)
    room.enter(third, SeatState.BUSY, 4.0)
    assert room.admit("10.0.0.1", 5.0) == (None, None)  # all its seats busy
    assert room.admit("10.0.0.2", 5.0)[0] is not None  # another peer still gets in


def test_unix_socket_clients_have_no_per_peer_cap_and_a_left_seat_is_free() -> None:
    room = Seating(4, 1)
    seats = [room.admit(UNIX_PEER, float(i)) for i in range(4)]
    assert all(seat is not None and evicted is None for seat, evicted in seats)
    seat = seats[0][0]
    assert seat is not None
    room.leave(seat)
    room.leave(seat)  # idempotent
    room.enter(seat, SeatState.BUSY, 5.0)  # a no-op once left
    assert room.count == 3
    assert room.admit(UNIX_PEER, 6.0)[1] is None


def test_the_body_deadline_follows_the_minimum_rate() -> None:
    limits = Limits(body_timeout_s=10, body_min_rate_bytes_per_s=500)
    assert limits.body_deadline(100.0, 0) == 110.0
    assert limits.body_deadline(100.0, 1000) == 112.0
    assert Limits(body_min_rate_bytes_per_s=0).body_deadline(0.0, 10**9) == 10.0
    with pytest.raises(ValueError, match="max_connections_per_peer"):
        Limits(max_connections_per_peer=0)


def test_the_api_limits_reach_each_listener(tmp_path: Path) -> None:
    api = load_dict(
        tmp_path,
        patched(
            {
                "api": {
                    "max.connections": 100,
                    "max.connections.per.peer": 500 // 10,
                    "idle.timeout.ms": 1500,
                    "keep.alive.timeout.ms": 2000,
                    "header.timeout.ms": 2500,
                    "body.timeout.ms": 3500,
                    "body.min.rate.bytes.per.s": 0,
                    "request.timeout.ms": 4500,
                    "send.timeout.ms": 5500,
                }
            }
        ),
    ).api
    control = listener_limits(api, observability=False, max_connections=100)
    assert (control.max_connections, control.max_connections_per_peer) == (100, 50)
    assert (control.idle_timeout_s, control.header_timeout_s, control.body_timeout_s) == (
        1.5,
        2.5,
        3.5,
    )
    assert (control.request_timeout_s, control.send_timeout_s) == (4.5, 5.5)
    assert control.keep_alive_timeout_s == 2.0
    assert control.body_min_rate_bytes_per_s == 0
    assert control.max_request_bytes == api.max_request_bytes
    observability = listener_limits(api, observability=True, max_connections=20)
    assert observability.max_request_bytes == 4096 and observability.max_header_bytes == 16384
    assert observability.max_connections_per_peer == 20  # never above the listener's cap


BAD: list[tuple[dict[str, Any], str, str]] = [
    ({"idle.timeout.ms": 0}, "api.idle.timeout.ms", ""),
    ({"header.timeout.ms": "soon"}, "api.header.timeout.ms", ""),
    ({"body.min.rate.bytes.per.s": -1}, "api.body.min.rate.bytes.per.s", ""),
    ({"max.connections.per.peer": 0}, "api.max.connections.per.peer", ""),
    (
        {"header.timeout.ms": 40_000},
        "api.header.timeout.ms",
        "must not exceed api.request.timeout.ms",
    ),
    ({"body.timeout.ms": 31_000}, "api.body.timeout.ms", "must not exceed"),
    (
        {"max.connections": 10, "max.connections.per.peer": 11},
        "api.max.connections.per.peer",
        "must not exceed api.max.connections (10)",
    ),
]


@pytest.mark.parametrize(("api", "path", "reason"), BAD)
def test_bad_api_limits_name_the_key(
    tmp_path: Path, api: dict[str, Any], path: str, reason: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load_dict(tmp_path, patched({"api": api}))
    assert info.value.path == path
    assert reason in info.value.reason


def test_a_bad_api_limit_exits_2_naming_the_key(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(patched({"api": {"header.timeout.ms": 1}}, MINIMAL)))
    done = subprocess.run(
        [sys.executable, "-m", "sidecar", "check-config", "-c", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "api.header.timeout.ms" in done.stderr


_FIT = """
import resource, sys
from sidecar.config import ApiConfig
from sidecar.service.api import fit_connections
print(fit_connections(ApiConfig(max_connections=1000), 2), resource.getrlimit(resource.RLIMIT_NOFILE)[0])
"""


def _fit_with(nofile: tuple[int, int]) -> tuple[int, int]:
    """fit_connections in a child whose open-file limit is ``nofile`` (this process keeps its own)."""
    done = subprocess.run(
        [sys.executable, "-c", _FIT],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, nofile),
    )
    cap, soft = done.stdout.split()
    return int(cap), int(soft)


def test_the_connection_caps_fit_the_open_file_limit() -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    needed = 1000 * 2 + 256
    assert hard == resource.RLIM_INFINITY or hard >= needed, "this test needs ulimit -Hn >= 2256"
    # A soft limit below the need is raised (the hard one allows it): the cap stays.
    assert _fit_with((1024, needed)) == (1000, needed)
    # A hard limit too low: the cap is lowered to what the descriptors hold, with a warning.
    assert _fit_with((1024, 1024)) == ((1024 - 256) // 2, 1024)


async def test_cuts_are_logged_once_per_peer_per_interval_and_bounded_in_all(
    autojump_clock: MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    stats = ServerStats("observability")
    caplog.set_level(logging.WARNING, logger="sidecar.http.server")
    for _ in range(100):
        stats.cut("idle", "10.0.0.1", "no request")
    stats.cut("keep_alive_idle", "10.0.0.2", "no next request", quiet=True)
    assert len(caplog.records) == 1
    assert "closed a connection from 10.0.0.1 (idle)" in caplog.records[0].getMessage()
    # A thousand peers at once: at most CUT_LOG_LINES lines in the interval.
    for i in range(1000):
        stats.cut("header_timeout", f"10.1.{i // 256}.{i % 256}", "slow")
    assert len(caplog.records) == CUT_LOG_LINES
    await trio.sleep(CUT_LOG_INTERVAL_S)
    stats.cut("idle", "10.0.0.1", "no request")
    line = caplog.records[-1].getMessage()
    assert len(caplog.records) == CUT_LOG_LINES + 1
    assert "(and 99 more cuts not logged" in caplog.records[1].getMessage()
    assert f"(and {1000 - (CUT_LOG_LINES - 1)} more cuts not logged" in line
    assert stats.cuts == {"idle": 101, "keep_alive_idle": 1, "header_timeout": 1000}
