"""DLQ routes: the rule matcher (sidecar.core.routes), their configuration (read, checked with the
key's path, dumped back), the app's `dlq.topic` and `error.cause_class` on the wire, and the DLQ
record's route headers."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.config import ConfigError, dlq_routes, dump_config, parse_config
from sidecar.core.deadletter import FailedRecord
from sidecar.core.outcome import ArchiveReason, ErrorInfo, error_info
from sidecar.core.routes import DlqRoutes, RouteRule
from sidecar.core.wire import interpret_single, parse_ack_request
from sidecar.kafka.dlq.record import H_EXC_CAUSE_CLASS, H_ROUTE_REFUSED, build_dlq_record

REJ, LIM = ArchiveReason.REJECTED, ArchiveReason.DELIVERY_COUNT_EXCEEDED
MINIMAL: dict[str, Any] = {
    "kafka": {"bootstrap.servers": "127.0.0.1:9092", "group.id": "g"},
    "source": {"topics": ["orders", "payments"]},
    "app": {"url": "http://127.0.0.1:8080/records"},
}
ROUTES = "errors.deadletterqueue.routes"
ALLOWED = "errors.deadletterqueue.routes.app.allowed"


def config(**keys: Any) -> Any:
    data = copy.deepcopy(MINIMAL)
    data.update(keys)
    return parse_config(data, env={})


def config_error(**keys: Any) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        config(**keys)
    return info.value


# ------------------------------------------------------------------------------- the matcher

TABLE = DlqRoutes(
    "dlq.{topic}",
    (
        RouteRule("dlq.{topic}.schema", exception_classes=("app.SchemaError",)),
        RouteRule(
            "dlq.payments.exhausted",
            reasons=("delivery_count_exceeded",),
            source_topics=("payments",),
        ),
        RouteRule("dlq.{topic}.timeouts", exception_classes=("sidecar.LockTimeout",)),
    ),
    ("dlq.{topic}.manual",),
)


def test_class_and_its_cause_route_first_match_wins() -> None:
    by_class = TABLE.choose("orders", REJ, ErrorInfo("app.SchemaError", "bad"))
    assert (by_class.topic, by_class.rule) == ("dlq.orders.schema", 0)
    by_cause = TABLE.choose("orders", LIM, ErrorInfo("app.Wrapper", cause_class="app.SchemaError"))
    assert (by_cause.topic, by_cause.rule) == ("dlq.orders.schema", 0)
    # payments at the limit with a schema error: rule 0 comes first.
    both = TABLE.choose("payments", LIM, ErrorInfo("app.SchemaError"))
    assert both.topic == "dlq.payments.schema"


def test_reason_and_source_topic_must_both_hold() -> None:
    assert TABLE.choose("payments", LIM, None).topic == "dlq.payments.exhausted"
    assert TABLE.choose("payments", REJ, None).topic == "dlq.payments"  # rejected: default
    assert TABLE.choose("orders", LIM, None).topic == "dlq.orders"  # other topic: default
    lock = TABLE.choose("orders", LIM, ErrorInfo("sidecar.LockTimeout"))
    assert lock.topic == "dlq.orders.timeouts"


def test_app_named_topic_allowed_or_refused() -> None:
    ok = TABLE.choose("orders", REJ, ErrorInfo("app.SchemaError"), "dlq.orders.manual")
    assert (ok.topic, ok.refused, ok.by_app) == ("dlq.orders.manual", None, True)
    # Allowed for orders only through {topic}: payments may not name the orders topic.
    no = TABLE.choose("payments", REJ, ErrorInfo("app.SchemaError"), "dlq.orders.manual")
    assert (no.topic, no.refused) == ("dlq.payments", "dlq.orders.manual")  # default, not rule 0


def test_topics_for_lists_every_reachable_topic() -> None:
    assert TABLE.topics_for(["orders", "payments"]) == [
        "dlq.orders",
        "dlq.orders.manual",
        "dlq.orders.schema",
        "dlq.orders.timeouts",
        "dlq.payments",
        "dlq.payments.exhausted",
        "dlq.payments.manual",
        "dlq.payments.schema",
        "dlq.payments.timeouts",
    ]


NAMES = st.sampled_from(["a.E", "b.E", "c.E", "sidecar.LockTimeout"])
SOURCES = st.sampled_from(["orders", "payments", "audit"])
RULES = st.builds(
    RouteRule,
    topic_name=st.sampled_from(["dlq.{topic}.x", "dlq.y", "dlq.{topic}.z"]),
    exception_classes=st.lists(NAMES, max_size=2, unique=True).map(tuple),
    reasons=st.lists(st.sampled_from(["rejected", "delivery_count_exceeded"]), max_size=1).map(
        tuple
    ),
    source_topics=st.lists(SOURCES, max_size=2, unique=True).map(tuple),
)


def _holds(rule: RouteRule, topic: str, reason: ArchiveReason, err: ErrorInfo | None) -> bool:
    names = {err.class_name, err.cause_class} if err else set()
    return (
        (not rule.source_topics or topic in rule.source_topics)
        and (not rule.reasons or reason.label in rule.reasons)
        and (not rule.exception_classes or bool(names & set(rule.exception_classes)))
    )


@settings(max_examples=400, deadline=None)
@given(
    rules=st.lists(RULES, max_size=5),
    topic=SOURCES,
    reason=st.sampled_from(list(ArchiveReason)),
    err=st.none()
    | st.builds(ErrorInfo, class_name=st.none() | NAMES, cause_class=st.none() | NAMES),
)
def test_choice_is_the_first_rule_whose_every_criterion_holds(
    rules: list[RouteRule], topic: str, reason: ArchiveReason, err: ErrorInfo | None
) -> None:
    table = DlqRoutes("dlq.{topic}", tuple(rules))
    choice = table.choose(topic, reason, err)
    first = next((i for i, r in enumerate(rules) if _holds(r, topic, reason, err)), None)
    assert choice.rule == first
    expected = rules[first].topic_name if first is not None else "dlq.{topic}"
    assert choice.topic == expected.replace("{topic}", topic)
    assert choice.topic in table.topics_for([topic])  # created at start-up
    assert choice.refused is None


# ------------------------------------------------------------------------------- configuration


def test_routes_read_and_dump_back() -> None:
    keys = {
        ROUTES: [
            {
                "exception.class": ["app.SchemaError", "app.ParseError"],
                "topic.name": "dlq.{topic}.s",
            },
            {
                "reason": "delivery_count_exceeded",
                "source.topic": "payments",
                "topic.name": "dlq.payments.x",
            },
        ],
        ALLOWED: ["dlq.{topic}.manual"],
    }
    cfg = config(**keys)
    assert cfg.errors.dlq.routes == (
        RouteRule("dlq.{topic}.s", exception_classes=("app.SchemaError", "app.ParseError")),
        RouteRule(
            "dlq.payments.x", reasons=("delivery_count_exceeded",), source_topics=("payments",)
        ),
    )
    routes = dlq_routes(cfg)
    assert routes is not None and routes.app_allowed == ("dlq.{topic}.manual",)
    dumped = dump_config(cfg)
    assert dumped[ROUTES][1] == {
        "reason": ["delivery_count_exceeded"],
        "source.topic": ["payments"],
        "topic.name": "dlq.payments.x",
    }
    assert parse_config(dumped, env={}) == cfg


@pytest.mark.parametrize(
    ("keys", "path", "reason"),
    [
        ({ROUTES: {"topic.name": "dlq.x"}}, ROUTES, "expected a list of rules"),
        ({ROUTES: [{"reason": "rejected"}]}, f"{ROUTES}[0].topic.name", "required key"),
        ({ROUTES: [{"topic.name": "dlq.x"}]}, f"{ROUTES}[0]", "at least one of"),
        ({ROUTES: [{"topic.name": "dlq.x", "class": "E"}]}, f"{ROUTES}[0].class", "unknown key"),
        (
            {ROUTES: [{"topic.name": "dlq.x", "reason": "timeout"}]},
            f"{ROUTES}[0].reason",
            "rejected",
        ),
        (
            {ROUTES: [{"topic.name": "dlq.x", "reason": ["rejected", "nope"]}]},
            f"{ROUTES}[0].reason[1]",
            "got 'nope'",
        ),
        (
            {ROUTES: [{"topic.name": "dlq.x", "exception.class": []}]},
            f"{ROUTES}[0].exception.class",
            "empty list",
        ),
        (
            {ROUTES: [{"topic.name": "dlq.x", "exception.class": ["E", "E"]}]},
            f"{ROUTES}[0].exception.class[1]",
            "twice",
        ),
        (
            {ROUTES: [{"topic.name": "dlq.x", "source.topic": "audit"}]},
            f"{ROUTES}[0].source.topic",
            "not one of source.topics",
        ),
        (
            {ROUTES: [{"topic.name": "errors.x", "reason": "rejected"}]},
            f"{ROUTES}[0].topic.name",
            "must start with 'dlq.'",
        ),
        (
            {
                ROUTES: [
                    {"topic.name": "{topic}", "reason": "rejected"},
                ],
                "errors.deadletterqueue.topic.name.prefix": "",
            },
            f"{ROUTES}[0].topic.name",
            "is a source topic",
        ),
        (
            {
                ROUTES: [{"topic.name": "__dlq.x", "reason": "rejected"}],
                "errors.deadletterqueue.topic.name.prefix": "",
            },
            f"{ROUTES}[0].topic.name",
            "'__'",
        ),
        (
            {ROUTES: [{"topic.name": "dlq.{source}", "reason": "rejected"}]},
            f"{ROUTES}[0].topic.name",
            "only '{topic}' is substituted",
        ),
        (
            {ALLOWED: ["dlq.ok", "other.{topic}"]},
            f"{ALLOWED}[1]",
            "'other.orders' (for source topic 'orders') must start with 'dlq.'",
        ),
        ({ALLOWED: "dlq.x"}, ALLOWED, "expected a list"),
        (
            {
                ROUTES: [{"topic.name": "dlq.x", "reason": "rejected"}],
                "errors.deadletterqueue.topic.name": "",
            },
            ROUTES,
            "needs a default DLQ",
        ),
    ],
)
def test_bad_routes_name_the_key(keys: dict[str, Any], path: str, reason: str) -> None:
    error = config_error(**keys)
    assert error.path == path
    assert reason in error.reason


def test_check_config_exits_2_naming_the_rule(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    bad = {
        ROUTES: [
            {"reason": "rejected", "topic.name": "dlq.ok"},
            {"reason": "x", "topic.name": "dlq.y"},
        ]
    }
    path.write_text(yaml.safe_dump({**MINIMAL, **bad}), encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "sidecar", "check-config", "-c", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert f"{ROUTES}[1].reason: must be one of delivery_count_exceeded, rejected" in done.stderr


# ------------------------------------------------------------------------------- the wire


def test_reject_answer_names_a_topic_and_a_cause() -> None:
    body = (
        b'{"ack": "reject", "error": {"class": "app.Wrap", "message": "m", '
        b'"cause_class": "app.Root"}, "dlq": {"topic": "dlq.orders.manual"}}'
    )
    answer = interpret_single(200, [(b"content-type", b"application/json")], body)
    assert answer.ack == "reject"
    assert answer.dlq_topic == "dlq.orders.manual"
    assert answer.error is not None and answer.error.cause_class == "app.Root"
    assert error_info(answer.error) == ErrorInfo("app.Wrap", "m", None, "app.Root")
    bad = interpret_single(
        200, [(b"content-type", b"application/json")], b'{"ack": "reject", "dlq": {"topic": 7}}'
    )
    assert bad.ack == "release" and "dlq.topic" in bad.reason
    items = parse_ack_request(
        b'[{"id": "a", "ack": "reject", "dlq": {"topic": "dlq.x"}, '
        b'"error": {"class": "E", "cause_class": "C"}}]'
    )
    assert items[0].dlq_topic == "dlq.x"
    assert items[0].error is not None and items[0].error.cause_class == "C"


def test_dlq_record_carries_the_cause_and_the_refusal() -> None:
    failed = FailedRecord(
        "orders",
        0,
        5,
        None,
        b"v",
        (),
        "g",
        1,
        "Offset rejected by client.",
        exception_class="app.Wrap",
        exception_cause_class="app.Root",
        route_refused="dlq.nope",
    )
    record = build_dlq_record(failed, "dlq.orders", 1, False, 1024)
    headers = dict(record.headers)
    assert headers[H_EXC_CAUSE_CLASS] == b"app.Root"
    assert headers[H_ROUTE_REFUSED] == b"dlq.nope"
    plain = build_dlq_record(
        FailedRecord("orders", 0, 5, None, b"v", (), "g", 1, "x"), "dlq.orders", 1, False, 1024
    )
    assert H_ROUTE_REFUSED not in dict(plain.headers)
