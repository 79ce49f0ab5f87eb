"""The record read once at intake, and delivery ids that cannot be guessed (sidecar.core.record).

Issue 20: delivery ids were `topic/partition/offset/epoch.seq` (share engine:
`topic/partition/offset.count.seq`), so one id and /v1/status were enough to find live ones. Now an
id is 128 random bits per attempt and says nothing about the record, the assignment or its neighbours.
"""

from __future__ import annotations

import base64
import itertools
import secrets
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from sidecar.core.record import (
    ANSWERED_REMEMBERED,
    DELIVERY_ID_BYTES,
    CustomDeadLetter,
    LiveIds,
    custom_dead_letter,
    is_delivery_id,
    new_delivery_id,
    source_record,
)
from sidecar.core.wire import AckItem, Answer


class FakeMessage:
    """The slice of a confluent-kafka Message that `source_record` reads (pure code: a fake is fine)."""

    def __init__(self, **fields: Any) -> None:
        self.f = {
            "topic": "orders",
            "partition": 3,
            "offset": 42,
            "key": b"k",
            "value": b"v",
            "headers": None,
            "timestamp": (1, 1700000000000),
            **fields,
        }
        self.reads = 0

    def _get(self, name: str) -> Any:
        self.reads += 1
        return self.f[name]

    def topic(self) -> Any:
        return self._get("topic")

    def partition(self) -> Any:
        return self._get("partition")

    def offset(self) -> Any:
        return self._get("offset")

    def key(self) -> Any:
        return self._get("key")

    def value(self) -> Any:
        return self._get("value")

    def headers(self) -> Any:
        return self._get("headers")

    def timestamp(self) -> Any:
        return self._get("timestamp")


def test_source_record_reads_everything_once() -> None:
    msg = FakeMessage(headers=[("traceparent", b"00-ab-cd-01"), ("h", None), ("h", b"2")])
    rec = source_record(msg)
    assert msg.reads == 7
    assert rec.coordinates == ("orders", 3, 42)
    assert (rec.key, rec.value) == (b"k", b"v")
    assert rec.headers == (("traceparent", b"00-ab-cd-01"), ("h", None), ("h", b"2"))
    assert rec.traceparent == "00-ab-cd-01" and rec.tracestate is None
    assert (rec.timestamp_ms, rec.timestamp_type) == (1700000000000, "create")


def test_source_record_keeps_null_apart_from_empty() -> None:
    rec = source_record(FakeMessage(key=None, value=b"", timestamp=(0, 0)))
    assert rec.key is None and rec.value == b""
    assert (rec.timestamp_ms, rec.timestamp_type) == (None, "none")


def test_custom_dead_letter_parts_only_when_the_answer_has_some() -> None:
    assert custom_dead_letter(Answer("reject")) is None
    assert custom_dead_letter(Answer("reject", dlq_headers=(("x", b"1"),))) == CustomDeadLetter(
        (("x", b"1"),), None, False
    )
    item = AckItem("id", "reject", dlq_value=None, dlq_value_set=True)
    assert custom_dead_letter(item) == CustomDeadLetter((), None, True)


# ------------------------------------------------------------------------------------- ids


def test_a_delivery_id_is_128_random_bits_in_base64url() -> None:
    delivery_id = new_delivery_id(secrets.token_bytes)
    assert DELIVERY_ID_BYTES * 8 >= 96
    raw = base64.urlsafe_b64decode(delivery_id + "==")
    assert len(raw) == DELIVERY_ID_BYTES
    assert is_delivery_id(delivery_id)
    assert (
        new_delivery_id(lambda n: bytes(range(n)))
        == base64.urlsafe_b64encode(bytes(range(16))).rstrip(b"=").decode()
    )


def test_consecutive_ids_are_not_predictable_from_each_other() -> None:
    """Every bit of an id is a coin flip, independent of the id before it (>= 96 bits each).

    With 4,000 ids, each of the 128 bit positions is set in 50 % ± 4 % of them (over 10 standard
    deviations of slack for a fair coin would be needed to fail by chance), and consecutive ids
    differ in about half their bits: nothing carries over from one attempt's id to the next, as a
    sequence number or a counter would.
    """
    ids = [new_delivery_id(secrets.token_bytes) for _ in range(4000)]
    assert len(set(ids)) == len(ids)
    values = [int.from_bytes(base64.urlsafe_b64decode(i + "=="), "big") for i in ids]
    bits = DELIVERY_ID_BYTES * 8
    for position in range(bits):
        ones = sum((v >> position) & 1 for v in values)
        assert 0.46 < ones / len(values) < 0.54, position
    distances = [bin(a ^ b).count("1") for a, b in itertools.pairwise(values)]
    mean = sum(distances) / len(distances)
    assert bits / 2 - 2 < mean < bits / 2 + 2
    assert min(distances) > 30


def test_ids_of_the_old_grammars_are_not_ours() -> None:
    for old in ["orders/3/42/1.7", "orders/3/42.2.15", "no-such-delivery", "nonsense", ""]:
        assert not is_delivery_id(old)


@given(st.binary(min_size=DELIVERY_ID_BYTES, max_size=DELIVERY_ID_BYTES))
def test_every_minted_id_parses(raw: bytes) -> None:
    assert is_delivery_id(new_delivery_id(lambda _n: raw))


@given(st.text(max_size=40))
def test_the_parser_accepts_only_the_grammar(text: str) -> None:
    alphabet = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
    assert is_delivery_id(text) == (len(text) == 22 and set(text) <= alphabet)


# ------------------------------------------------------------------------------------- live ids


class LiveIdsMachine(RuleBasedStateMachine):
    """Invariant: an id is live exactly while issued and not retired, and every id that is not live
    answers by its shape alone (a spent id and a guessed one of the same shape answer alike)."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: LiveIds[object] = LiveIds(secrets.token_bytes)
        self.live: dict[str, object] = {}
        self.spent: list[str] = []

    @rule()
    def issue(self) -> None:
        value = self.ids.issue(lambda i: ("value", i))
        assert isinstance(value, tuple)
        assert value[1] not in self.live and value[1] not in self.spent
        self.live[value[1]] = value

    @precondition(lambda self: bool(self.live))
    @rule(data=st.data())
    def retire(self, data: st.DataObject) -> None:
        delivery_id = data.draw(st.sampled_from(sorted(self.live)))
        self.ids.retire(delivery_id, object())  # not the live value: no effect
        assert self.ids.get(delivery_id) is self.live[delivery_id]
        self.ids.retire(delivery_id, self.live.pop(delivery_id))
        self.spent.append(delivery_id)

    @rule(
        guess=st.text(max_size=30)
        | st.binary(min_size=16, max_size=16).map(lambda raw: new_delivery_id(lambda _n: raw))
    )
    def guess(self, guess: str) -> None:
        if guess in self.live:
            return
        assert self.ids.get(guess) is None
        assert self.ids.not_live_answer(guess) == (
            "expired" if is_delivery_id(guess) else "unknown"
        )

    @invariant()
    def only_the_issued_and_not_retired_are_live(self) -> None:
        assert len(self.ids) == len(self.live)
        for delivery_id, value in self.live.items():
            assert self.ids.get(delivery_id) is value
        for delivery_id in self.spent:
            assert self.ids.get(delivery_id) is None
            assert self.ids.not_live_answer(delivery_id) == "expired"


TestLiveIds = LiveIdsMachine.TestCase


def test_an_answered_id_says_already_and_only_the_last_ones_are_remembered() -> None:
    ids: LiveIds[object] = LiveIds(secrets.token_bytes)
    issued = [ids.issue(lambda i: i) for _ in range(ANSWERED_REMEMBERED + 2)]
    for delivery_id in issued:
        assert isinstance(delivery_id, str)
        ids.retire(delivery_id, delivery_id)
        ids.answered(delivery_id)
    assert ids.not_live_answer(str(issued[-1])) == "already"
    assert ids.not_live_answer(str(issued[2])) == "already"
    # The oldest are forgotten (bounded memory): they answer by their shape again.
    assert ids.not_live_answer(str(issued[0])) == "expired"
    assert ids.not_live_answer(str(issued[1])) == "expired"
    # A retired id that was never answered (lock expired, fenced) stays `expired`.
    other = ids.issue(lambda i: i)
    ids.retire(str(other), other)
    assert ids.not_live_answer(str(other)) == "expired"


def test_an_id_answered_twice_is_remembered_once() -> None:
    """A second answer for one id takes no second place: the others are not forgotten sooner."""
    ids: LiveIds[object] = LiveIds(secrets.token_bytes)
    issued = [str(ids.issue(lambda i: i)) for _ in range(ANSWERED_REMEMBERED)]
    for delivery_id in issued:
        ids.answered(delivery_id)
    for _ in range(10):
        ids.answered(issued[-1])
    assert all(ids.not_live_answer(d) == "already" for d in issued)
    ids.answered(str(ids.issue(lambda i: i)))  # one more new id forgets the oldest only
    assert ids.not_live_answer(issued[0]) == "expired"
    assert ids.not_live_answer(issued[1]) == "already"
