"""DLQ routes in the configuration: ``errors.deadletterqueue.routes`` and ``...routes.app.allowed``.

Owns reading them (`read_routes`, whose docstring shows the keys; `read_allowed`), their start-up check
(`check_routes`), the values `sidecar.core.routes.DlqRoutes` applies (`dlq_routes`), and `route_plain`.

Imports: the standard library, `sidecar.config` modules errors, environment, kinds, syntax and values,
and `sidecar.core.routes`; not schema, checks, load, yamlcore, masking or dump.
"""

from __future__ import annotations

from typing import Any

from sidecar.config.environment import ReadContext
from sidecar.config.errors import Invalid
from sidecar.config.kinds import StrKey, describe_value, join_path, mapping_at
from sidecar.config.syntax import topic_name_error
from sidecar.config.values import Config
from sidecar.core.routes import REASON_LABELS, DlqRoutes, RouteRule, route_topic

__all__ = ["check_routes", "dlq_routes", "route_plain"]

ROUTES_KEY = "errors.deadletterqueue.routes"
ALLOWED_KEY = "errors.deadletterqueue.routes.app.allowed"
_PREFIX_KEY = "errors.deadletterqueue.topic.name.prefix"

# YAML name of each criterion → the RouteRule attribute.
_CRITERIA = {
    "exception.class": "exception_classes",
    "reason": "reasons",
    "source.topic": "source_topics",
}
_TOPIC = "topic.name"
_RULE_KEYS = (*_CRITERIA, _TOPIC)
# Enough for any sane routing table; a bound keeps the per-record scan short.
MAX_ROUTES = 100
MAX_ALLOWED = 100


def _strings(raw: object, path: str, ctx: ReadContext) -> tuple[str, ...]:
    """One non-empty string, or a non-empty list of them (repeats refused)."""
    items = raw if isinstance(raw, list) else [raw]
    if not items:
        raise Invalid(path, "must not be an empty list (leave the key out instead)")
    out: list[str] = []
    for index, item in enumerate(items):
        item_path = f"{path}[{index}]" if isinstance(raw, list) else path
        if not isinstance(item, str):
            raise Invalid(item_path, f"expected a string, got {describe_value(item)}")
        text = StrKey(allow_empty=False).read(item, item_path, ctx)
        if text in out:
            raise Invalid(item_path, f"{text!r} is listed twice")
        out.append(text)
    return tuple(out)


def _read_rule(raw: object, path: str, ctx: ReadContext) -> RouteRule:
    data = mapping_at(raw, path)
    for name in data:
        if name not in _RULE_KEYS:
            raise Invalid(
                join_path(path, name), f"unknown key (a rule has: {', '.join(_RULE_KEYS)})"
            )
    if _TOPIC not in data:
        raise Invalid(
            join_path(path, _TOPIC), "required key is missing (the DLQ topic of the rule)"
        )
    topic = StrKey(allow_empty=False).read(data[_TOPIC], join_path(path, _TOPIC), ctx)
    criteria: dict[str, tuple[str, ...]] = {}
    for name, attr in _CRITERIA.items():
        if name in data:
            criteria[attr] = _strings(data[name], join_path(path, name), ctx)
    if not criteria:
        raise Invalid(
            path,
            f"a rule needs at least one of {', '.join(_CRITERIA)} (records no rule matches go to "
            "errors.deadletterqueue.topic.name)",
        )
    for index, reason in enumerate(criteria.get("reasons", ())):
        if reason not in REASON_LABELS:
            where = join_path(path, "reason")
            where = f"{where}[{index}]" if isinstance(data["reason"], list) else where
            raise Invalid(
                where, f"must be one of {', '.join(sorted(REASON_LABELS))}, got {reason!r}"
            )
    return RouteRule(topic_name=topic, **criteria)


def read_routes(raw: object, path: str, ctx: ReadContext) -> tuple[RouteRule, ...]:
    """The rules of ``errors.deadletterqueue.routes``, read (types, keys, reasons)::

        errors.deadletterqueue.routes:            # ordered; the first rule that matches picks the topic
          - exception.class: [com.acme.SchemaError]   # the error's class or its cause's, exactly
            reason: rejected                          # rejected | delivery_count_exceeded
            source.topic: [orders]                    # a source topic
            topic.name: dlq.{topic}.schema            # required; {topic} is the source topic
        errors.deadletterqueue.routes.app.allowed:    # what a reject's `dlq.topic` may name
          - dlq.{topic}.manual

    A rule lists at least one criterion; a criterion is one string or a list of them (any may match),
    and all the criteria a rule lists must match. Read here (`read_routes`, `read_allowed`: types,
    keys, reasons), checked against the rest of the configuration at start-up (`check_routes`: a DLQ to
    route from, source topics that exist, and every topic a template can give obeying the DLQ name
    rules), applied by :class:`sidecar.core.routes.DlqRoutes` (`dlq_routes`). `route_plain` is a rule
    in the file's own shape (`sidecar.config.dump`).
    """
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise Invalid(path, f"expected a list of rules, got {describe_value(raw)}")
    if len(raw) > MAX_ROUTES:
        raise Invalid(path, f"at most {MAX_ROUTES} rules, got {len(raw)}")
    return tuple(_read_rule(item, f"{path}[{index}]", ctx) for index, item in enumerate(raw))


def read_allowed(raw: object, path: str, ctx: ReadContext) -> tuple[str, ...]:
    if raw is None or raw == []:
        return ()
    if not isinstance(raw, list):
        raise Invalid(path, f"expected a list of topic names, got {describe_value(raw)}")
    if len(raw) > MAX_ALLOWED:
        raise Invalid(path, f"at most {MAX_ALLOWED} topic names, got {len(raw)}")
    return _strings(raw, path, ctx)


def _check_topic(config: Config, template: str, path: str) -> None:
    """Every name `template` gives for a source topic obeys the DLQ topic rules."""
    dlq = config.errors.dlq
    sources = set(config.source.topics)
    for source in config.source.topics:
        name = route_topic(template, source)
        shown = repr(name) if name == template else f"{name!r} (for source topic {source!r})"
        if name.startswith("__"):
            raise Invalid(path, f"{shown} must not start with '__' (reserved for Kafka internals)")
        if dlq.topic_name_prefix and not name.startswith(dlq.topic_name_prefix):
            raise Invalid(
                path, f"{shown} must start with {dlq.topic_name_prefix!r} ({_PREFIX_KEY})"
            )
        if name in sources:
            raise Invalid(path, f"{shown} is a source topic; a DLQ must not feed its own source")
        problem = topic_name_error(name)
        if problem:
            if "{" in name or "}" in name:
                problem += " (only '{topic}' is substituted)"
            raise Invalid(path, f"{shown} is not a valid topic name: {problem}")


def check_routes(config: Config) -> None:
    """The routes against the rest of the configuration (raises `Invalid` with the key)."""
    dlq = config.errors.dlq
    if not dlq.routes and not dlq.routes_app_allowed:
        return
    if not dlq.enabled:
        key = ROUTES_KEY if dlq.routes else ALLOWED_KEY
        raise Invalid(
            key,
            "needs a default DLQ: errors.deadletterqueue.topic.name is blank (no DLQ), so there is "
            "nothing to route",
        )
    for index, rule in enumerate(dlq.routes):
        path = f"{ROUTES_KEY}[{index}]"
        for i, topic in enumerate(rule.source_topics):
            if topic not in config.source.topics:
                where = join_path(path, "source.topic")
                where = f"{where}[{i}]" if len(rule.source_topics) > 1 else where
                raise Invalid(where, f"{topic!r} is not one of source.topics")
        _check_topic(config, rule.topic_name, join_path(path, _TOPIC))
    for index, template in enumerate(dlq.routes_app_allowed):
        _check_topic(config, template, f"{ALLOWED_KEY}[{index}]")


def dlq_routes(config: Config) -> DlqRoutes | None:
    """The routes the DLQ step applies; None without a DLQ."""
    dlq = config.errors.dlq
    if not dlq.enabled:
        return None
    return DlqRoutes(dlq.topic_name, dlq.routes, dlq.routes_app_allowed)


def route_plain(rule: RouteRule) -> dict[str, Any]:
    """One rule in the file's own shape: what `_read_rule` reads back to an equal rule."""
    out: dict[str, Any] = {}
    for name, attr in _CRITERIA.items():
        values = getattr(rule, attr)
        if values:
            out[name] = list(values)
    out[_TOPIC] = rule.topic_name
    return out
