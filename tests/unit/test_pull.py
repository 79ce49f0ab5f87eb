"""Pull mode's pure parts: the pull queue, the query parameters, the response body, the config rules.

The pull queue (sidecar.engines.pull.PullQueue) runs on trio's autojump clock: a long poll's wait
is exact and no test depends on the machine's load.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
import trio
from trio.testing import MockClock, wait_all_tasks_blocked

from sidecar.config import AppMode, ConfigError, dump_config, parse_config
from sidecar.core.record import SourceRecord, Tracked
from sidecar.core.wire import RecordView, format_pull_response
from sidecar.engines.pipeline import Delivery, PullQueue
from sidecar.service.api import PullQueryError, parse_pull_query

# ---------------------------------------------------------------------------------------------
# The pull queue


def delivery(n: int) -> Delivery:
    record = SourceRecord(
        topic="t",
        partition=0,
        offset=n,
        key=None,
        value=b"v",
        timestamp_ms=None,
        timestamp_type="none",
        headers=(),
    )
    return Delivery(f"id{n}", Tracked(record), 1, None)


def always(_d: Delivery) -> bool:
    return True


def nothing() -> None:
    return None


async def test_a_poll_takes_what_is_queued_at_once_up_to_its_max() -> None:
    q = PullQueue()
    for n in range(5):
        q.put(delivery(n))
    got = await q.take(3, 10.0, always, nothing)
    assert [d.id for d in got] == ["id0", "id1", "id2"]
    assert q.queued() == 2
    assert [d.id for d in await q.take(10, 0, always, nothing)] == ["id3", "id4"]


async def test_a_poll_with_nothing_queued_waits_and_returns_empty_at_its_time(
    autojump_clock: MockClock,
) -> None:
    q = PullQueue()
    started = trio.current_time()
    assert await q.take(10, 2.5, always, nothing) == []
    assert trio.current_time() - started == pytest.approx(2.5)
    assert q.waiting() == 0 and q.demand() == 0


async def test_demand_is_what_the_waiting_polls_still_take() -> None:
    q = PullQueue()
    woken: list[int] = []
    results: dict[str, list[str]] = {}

    async def poll(name: str, max_records: int) -> None:
        got = await q.take(max_records, 30.0, always, lambda: woken.append(1))
        results[name] = [d.id for d in got]

    async with trio.open_nursery() as nursery:
        nursery.start_soon(poll, "a", 2)
        await wait_all_tasks_blocked()
        nursery.start_soon(poll, "b", 3)
        await wait_all_tasks_blocked()
        assert q.waiting() == 2 and q.demand() == 5 and len(woken) == 2
        for n in range(4):  # what one hand-out puts in one go
            q.put(delivery(n))
        assert q.demand() == 1
    # The oldest poll is filled first; each delivery goes to exactly one poll.
    assert results == {"a": ["id0", "id1"], "b": ["id2", "id3"]}
    assert q.queued() == 0 and q.demand() == 0


async def test_what_no_poll_waits_for_is_queued_and_counts_against_demand() -> None:
    q = PullQueue()
    q.put(delivery(0))
    assert q.queued() == 1 and q.demand() == 0


async def test_a_poll_skips_deliveries_that_expired_while_queued() -> None:
    q = PullQueue()
    for n in range(3):
        q.put(delivery(n))
    got = await q.take(10, 0, lambda d: d.id != "id1", nothing)
    assert [d.id for d in got] == ["id0", "id2"]


async def test_a_cancelled_poll_gives_its_deliveries_back_in_order() -> None:
    q = PullQueue()
    q.put(delivery(9))
    assert [d.id for d in await q.take(1, 0, always, nothing)] == ["id9"]
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:

            async def poll() -> None:
                await q.take(5, 30.0, always, nothing)
                raise AssertionError("not reached: cancelled first")

            nursery.start_soon(poll)
            await wait_all_tasks_blocked()
            scope.cancel()  # the poll is woken with Cancelled; it still waits in the queue ...
            q.put(delivery(0))  # ... so these go to it before its task runs again
            q.put(delivery(1))
    q.put(delivery(2))
    assert [d.id for d in await q.take(5, 0, always, nothing)] == ["id0", "id1", "id2"]
    assert q.waiting() == 0


async def test_a_cancelled_poll_gives_its_deliveries_to_a_poll_still_waiting(
    autojump_clock: MockClock,
) -> None:
    """A poll whose client closed, cancelled just as deliveries came to it: the next waiting poll
    gets them now, not after its own wait (they are not left in the queue behind it)."""
    q = PullQueue()
    first = trio.CancelScope()
    got: list[str] = []

    async def first_poll() -> None:
        with first:
            await q.take(5, 30.0, always, nothing)
            raise AssertionError("not reached: cancelled first")

    async def second_poll() -> None:
        got.extend(d.id for d in await q.take(5, 30.0, always, nothing))

    started = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(first_poll)
        await wait_all_tasks_blocked()
        nursery.start_soon(second_poll)
        await wait_all_tasks_blocked()
        assert q.demand() == 10
        first.cancel()  # woken with Cancelled; it is still the oldest poll ...
        q.put(delivery(0))  # ... so these go to it
        q.put(delivery(1))
    assert got == ["id0", "id1"]
    assert trio.current_time() - started < 1  # not the second poll's 30 s
    assert q.waiting() == 0 and q.queued() == 0


async def test_wait_demand_returns_once_a_poll_waits(autojump_clock: MockClock) -> None:
    q = PullQueue()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(q.take, 1, 5.0, always, nothing)
        with trio.fail_after(1):
            await q.wait_demand()
        assert q.waiting() == 1
    # After the poll is over, nothing waits: the event is a fresh one.
    with trio.move_on_after(1) as scope:
        await q.wait_demand()
    assert scope.cancelled_caught


# ---------------------------------------------------------------------------------------------
# GET /v1/records parameters


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("", (100, 0)),
        ("max=1", (1, 0)),
        ("max=10000&wait_ms=60000", (10000, 60000)),
        ("wait_ms=0&max=7", (7, 0)),
    ],
)
def test_pull_query_defaults_and_bounds(query: str, expected: tuple[int, int]) -> None:
    assert parse_pull_query(query) == expected


@pytest.mark.parametrize(
    ("query", "reason"),
    [
        ("max=0", "max must be from 1 to 10000, got 0"),
        ("max=10001", "max must be from 1 to 10000, got 10001"),
        ("max=", "max must be an integer from 1 to 10000, got ''"),
        ("max=1.5", "max must be an integer"),
        ("max=%EF%BC%91", "max must be an integer"),  # a full-width digit one
        ("max=99999999999999999999", "max must be an integer"),
        ("wait_ms=-5", "wait_ms must be an integer from 0 to 60000"),
        ("wait_ms=60001", "wait_ms must be from 0 to 60000, got 60001"),
        ("timeout=5", "unknown parameter 'timeout' (known: max, wait_ms)"),
        ("max=1&max=1", "max given more than once"),
        ("max", "malformed query string"),
    ],
)
def test_bad_pull_queries_name_the_parameter(query: str, reason: str) -> None:
    with pytest.raises(PullQueryError) as info:
        parse_pull_query(query)
    assert reason in str(info.value)


# ---------------------------------------------------------------------------------------------
# The response body


def test_pull_response_is_the_batch_schema_plus_the_lock() -> None:
    view = RecordView(
        topic="orders",
        partition=2,
        offset=41,
        key=b"\xff",
        value=None,
        timestamp_ms=1700000000000,
        timestamp_type="create",
        headers=(("h", b"a"), ("h", None)),
        delivery_count=3,
        delivery_id="abc",
        traceparent=None,
    )
    body = json.loads(format_pull_response([(view, 1500)], now_epoch_ms=1_000))
    assert body == {
        "records": [
            {
                "id": "abc",
                "topic": "orders",
                "partition": 2,
                "offset": 41,
                "key": base64.b64encode(b"\xff").decode(),
                "value": None,
                "headers": [["h", "YQ=="], ["h", None]],
                "timestamp": 1700000000000,
                "timestamp_type": "create",
                "delivery_count": 3,
                "traceparent": None,
                "tracestate": None,
                "lock_expires_in_ms": 1500,
                "lock_deadline_ms": 2500,
            }
        ]
    }
    assert json.loads(format_pull_response([])) == {"records": []}


# ---------------------------------------------------------------------------------------------
# Configuration

BASE: dict[str, Any] = {
    "kafka": {"bootstrap.servers": "127.0.0.1:9092", "group.id": "g"},
    "source": {"topics": ["orders"]},
}


def test_pull_mode_needs_no_app_url_and_ignores_the_request_timeout() -> None:
    config = parse_config(
        {
            **BASE,
            "app": {"mode": "pull", "timeout.ms": 60000},
            "share.record.lock.duration.ms": 5000,
        },
        env={},
    )
    assert config.app.mode is AppMode.PULL
    assert config.app.url == "" and config.app.host == ""
    # The effective config parses back to the same config.
    assert parse_config(dump_config(config, mask_secrets=False), env={}) == config


@pytest.mark.parametrize(
    ("app", "path", "reason"),
    [
        (
            {"mode": "pull", "url": "http://127.0.0.1:8080/r"},
            "app.url",
            "must be left out with app.mode: pull",
        ),
        ({"mode": "pull", "unix_socket": "/tmp/a.sock"}, "app.unix_socket", "must be left out"),
        ({"mode": "pull", "format": "cloudevents"}, "app.format", "GET /v1/records"),
        ({"mode": "single"}, "app.url", "required with app.mode: single"),
        ({"mode": "batch", "url": ""}, "app.url", "required with app.mode: batch"),
        ({}, "app.url", "required with app.mode: single"),
    ],
)
def test_pull_mode_contradictions_name_the_key(app: dict[str, Any], path: str, reason: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({**BASE, "app": app}, env={})
    assert info.value.path == path
    assert reason in info.value.reason


def test_pull_response_matches_openapi_yaml() -> None:
    import pathlib

    import jsonschema
    import yaml

    document = yaml.safe_load(
        (pathlib.Path(__file__).resolve().parents[2] / "openapi.yaml").read_text()
    )
    schema = {"$ref": "#/components/schemas/PullResponse", "components": document["components"]}
    view = RecordView("t", 0, 5, None, b"\x00", 1, "log-append", (("a", None),), 2, "id")
    body = json.loads(format_pull_response([(view, 0), (view, 30000)]))
    jsonschema.validate(body, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"records": [{**body["records"][0], "extra": 1}]}, schema)
    operation = document["paths"]["/v1/records"]["get"]
    bounds = {p["name"]: p["schema"] for p in operation["parameters"]}
    assert parse_pull_query("") == (bounds["max"]["default"], bounds["wait_ms"]["default"])
    assert parse_pull_query(
        f"max={bounds['max']['maximum']}&wait_ms={bounds['wait_ms']['maximum']}"
    )
    for name in ("max", "wait_ms"):
        with pytest.raises(PullQueryError):
            parse_pull_query(f"{name}={bounds[name]['maximum'] + 1}")


async def test_released_waiters_return_at_once_with_what_they_have(
    autojump_clock: MockClock,
) -> None:
    q = PullQueue()
    results: list[list[Delivery]] = []

    async def poll() -> None:
        results.append(await q.take(5, 30.0, always, nothing))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(poll)
        await wait_all_tasks_blocked()
        started = trio.current_time()
        q.release_waiters()
        q.put(delivery(0))  # after the release: queued for a later poll, not handed out
    assert results == [[]]
    assert trio.current_time() == started
    assert q.queued() == 1
