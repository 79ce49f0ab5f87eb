"""DLQ routes: which DLQ topic an archived record goes to (sans-IO).

Owns `DlqRoutes` (the choice drawn in its docstring) and its rules; the configuration
(`sidecar.config.routes`) builds them and checks every topic a template can give at start-up.

Pure: no trio, no Kafka, no I/O, no clock. Imports only :mod:`sidecar.core.outcome`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sidecar.core.outcome import ArchiveReason, ErrorInfo

__all__ = ["REASON_LABELS", "DlqRoutes", "RouteChoice", "RouteRule", "route_topic"]

#: The reason words a rule may name: the archive reasons' labels (metrics and logs use the same).
REASON_LABELS: frozenset[str] = frozenset(r.label for r in ArchiveReason)


def route_topic(template: str, source_topic: str) -> str:
    """The topic a template names for records of `source_topic` (``{topic}`` substituted)."""
    return template.replace("{topic}", source_topic)


@dataclass(frozen=True, slots=True)
class RouteRule:
    """One ordered rule: its criteria (an empty one is not a criterion) and the topic it picks."""

    topic_name: str
    exception_classes: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()
    source_topics: tuple[str, ...] = ()

    def matches(self, source_topic: str, reason: ArchiveReason, error: ErrorInfo | None) -> bool:
        if self.source_topics and source_topic not in self.source_topics:
            return False
        if self.reasons and reason.label not in self.reasons:
            return False
        if self.exception_classes:
            names = (error.class_name, error.cause_class) if error is not None else ()
            if not any(n is not None and n in self.exception_classes for n in names):
                return False
        return True


@dataclass(frozen=True, slots=True)
class RouteChoice:
    """Where one record goes: `topic`; `rule` the index of the rule that chose it (None: the
    default DLQ or the app's allowed name); `refused` the name the app asked for and may not use."""

    topic: str
    rule: int | None = None
    refused: str | None = None
    by_app: bool = False


@dataclass(frozen=True, slots=True)
class DlqRoutes:
    """The default DLQ template, the ordered rules, and the templates the app may name.

        archived record (source topic, reason, error class and its cause's, the app's named topic)
            │  DlqRoutes.choose()
            ├── the app named a topic in its reject ── on the allow-list ──▶ that topic
            │                                       └─ not on it ─────────▶ the default DLQ, refused = the name
            ├── the first rule that matches ────────────────────────────▶ its topic
            └── none ───────────────────────────────────────────────────▶ the default DLQ

    A rule matches when every criterion it lists holds, and a criterion holds when any of its values
    does: ``exception_classes`` (the error's class or its cause's class, exactly), ``reasons``
    (:attr:`sidecar.core.outcome.ArchiveReason.label`: ``rejected``, ``delivery_count_exceeded``) and
    ``source_topics``. Topic names are templates: ``{topic}`` is the source topic, as in the default DLQ
    name. The configuration (``errors.deadletterqueue.routes``, ``sidecar.config.routes``) builds these
    values and checks every name a template can give at start-up, so :meth:`DlqRoutes.choose` never
    fails.
    """

    default: str
    rules: tuple[RouteRule, ...] = ()
    app_allowed: tuple[str, ...] = ()

    def choose(
        self,
        source_topic: str,
        reason: ArchiveReason,
        error: ErrorInfo | None,
        requested: str | None = None,
    ) -> RouteChoice:
        """The DLQ topic for one archived record."""
        if requested is not None:
            if any(route_topic(t, source_topic) == requested for t in self.app_allowed):
                return RouteChoice(requested, by_app=True)
            return RouteChoice(route_topic(self.default, source_topic), refused=requested)
        for index, rule in enumerate(self.rules):
            if rule.matches(source_topic, reason, error):
                return RouteChoice(route_topic(rule.topic_name, source_topic), rule=index)
        return RouteChoice(route_topic(self.default, source_topic))

    def topics_for(self, source_topics: Iterable[str]) -> list[str]:
        """Every DLQ topic records of `source_topics` may go to, sorted: the default, the rules'
        (a rule limited to other source topics names none for these), the app's allowed names."""
        out: set[str] = set()
        for source in source_topics:
            out.add(route_topic(self.default, source))
            for rule in self.rules:
                if not rule.source_topics or source in rule.source_topics:
                    out.add(route_topic(rule.topic_name, source))
            out.update(route_topic(t, source) for t in self.app_allowed)
        return sorted(out)
