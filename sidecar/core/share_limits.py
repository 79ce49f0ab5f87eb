"""The share engine's arithmetic (`engine: share`): how many share consumers, the group limit it needs,
and the room a record lock keeps for the last steps.

Pure: integers in, integers out. The Kafka side (:mod:`sidecar.kafka.share`) raises the group's limit
with `required_group_limit`; the engine (:mod:`sidecar.engines.share.group`) sizes its consumers and
batch deadlines with the other two.
"""

from __future__ import annotations


def share_consumer_count(max_in_flight: int) -> int:
    """How many share consumers one sidecar runs: `min(4, app.max.in.flight)`."""
    return max(1, min(4, max_in_flight))


def required_group_limit(sidecar_limit: int, consumers: int) -> int:
    """The least group `share.delivery.count.limit` that lets a sidecar with this limit act first.

    The broker counts an acquisition as a delivery and archives a record, with no DLQ record, when
    the delivery numbered with the group's limit G ends without an acknowledgement: a release, a
    lock expiry, or the member's death. The sidecar delivers a record to the app at most L times; a
    record acquired again after that (its deliveries' outcomes lost) is dead-lettered at acquisition,
    so that acquisition must not be past the broker's last.

    How far past L it can be: a death charges every record the sidecar held once, and each of its
    other consumers' share fetches still waiting at the broker once more (measured on Kafka 4.4
    with librdkafka 2.16: a record held at count 1 by one of four consumers of a SIGKILLed sidecar
    came back at count 4 or 5, never sent in between; with one consumer, at count 2). A record
    delivered for the L-th time when the sidecar dies comes back at most at L + consumers, and the
    acquisitions between were all below it: G >= L + consumers.
    """
    return sidecar_limit + consumers


def lock_margin_ms(lock_ms: int) -> int:
    """Room for the DLQ write and the acknowledgement to reach the broker before the lock expires."""
    return min(5000, max(1000, lock_ms // 5))


__all__ = ["lock_margin_ms", "required_group_limit", "share_consumer_count"]
