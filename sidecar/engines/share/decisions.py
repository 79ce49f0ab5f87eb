"""The share engine's decisions (a part of `ShareGroupEngine`): each answer to ACCEPT / RELEASE / REJECT.

Owns `Decisions`: a batch's wait for its answers (a missing one is a release), the one decision on
an answer (the sidecar's count against `delivery.count.limit`, the group's last delivery), the DLQ
write before a REJECT, a long release to its retry tier, the breaker's held records, and the
`Step` that acknowledges them, told to the account of deaths first.

Must not import the ledger, the consumer engine, or confluent-kafka.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

import trio

from sidecar.core.deadletter import ArchiveOutcome
from sidecar.core.outcome import (
    ACK_BY_WORD,
    COUNT_EXHAUSTED,
    LOCK_TIMEOUT,
    SHUTDOWN,
    Accept,
    Ack,
    ArchiveReason,
    DeadLetter,
    ErrorInfo,
    decide,
    error_info,
)
from sidecar.core.record import Tracked
from sidecar.core.wire import AckItem, Answer, AppError
from sidecar.engines.interfaces import Delivery, Outlet, Settled, TierWriter
from sidecar.engines.share.batch import Acquired, Batch, coordinates
from sidecar.engines.share.ports import ConsumerFlags, Deaths, Outcomes
from sidecar.engines.share.tier_write import TierDelay, to_tier_then_accept
from sidecar.kafka.dlq import DlqWriter
from sidecar.kafka.message import Message
from sidecar.kafka.share import ShareSettings, Step

NOT_SENT = Answer("release", AppError(LOCK_TIMEOUT, "never sent before the record lock expired"))


class Decisions:
    """The decisions of :class:`~sidecar.engines.share.group.ShareGroupEngine` on its batches."""

    def __init__(
        self,
        outlet: Outlet[Acquired],
        dlq: DlqWriter,
        tiers: TierWriter,
        tier_delay: TierDelay,
        source: ConsumerFlags,
        deaths: Deaths,
        known: Outcomes,
    ) -> None:
        self._outlet = outlet
        self._dlq = dlq
        self._tiers = tiers
        self._tier_delay = tier_delay
        self._source = source
        self._deaths = deaths
        self._known = known
        self._settings: ShareSettings | None = None

    def use(self, settings: ShareSettings) -> None:
        """The group's settings (its limits), read at start-up: decisions need them."""
        self._settings = settings

    def step(
        self,
        decisions: list[tuple[Message, Ack]],
        flush: bool = False,
        next: Callable[[], Awaitable[Step]] | None = None,
    ) -> Step:
        """The step acknowledging `decisions`, told to the account of deaths first."""
        self._deaths.settle((coordinates(m), t is Ack.RELEASE) for m, t in decisions)
        return Step(decisions, flush, next)

    def answered(self, delivery: Delivery[Acquired], ack: Ack, answer: Answer | AckItem) -> Settled:
        """The app's answer (not a renew): its decision made now and kept on the delivery, told to
        the account of deaths, and counted down on its batch."""
        delivery.answer = answer
        ref = delivery.ref
        settled = (
            Settled.ACCEPTED
            if ack is Ack.ACCEPT
            else self.settle(ref.msg, ack, delivery.delivery_count)
        )
        delivery.settled = settled
        if self._deaths.journal is not None:
            self._deaths.answered(ref.coord, ack is Ack.RELEASE)
        ref.batch.one_answered()
        return settled

    def hold_back(
        self, messages: Sequence[Message]
    ) -> tuple[list[tuple[Message, Ack]], list[Message]]:
        """A poll under way when the DLQ circuit breaker opened (or its probe went out): its records
        do not go to the app; they are released (the broker counts the acquisition) as held, except
        those on the group's last delivery, which the broker would archive (processed as usual)."""
        assert self._settings is not None
        released: list[tuple[Message, Ack]] = []
        kept: list[Message] = []
        for msg in messages:
            if (msg.delivery_count() or 1) >= self._settings.group_delivery_count_limit:
                kept.append(msg)
                continue
            self._known.remember_held(*coordinates(msg))
            self._deaths.unsent(coordinates(msg))
            self._known.outcome_known(msg)  # released by us: not a suspect when it comes back
            released.append((msg, Ack.RELEASE))
        return released, kept

    async def wait_answers(self, batch: Batch, deliveries: Sequence[Delivery[Acquired]]) -> None:
        """Send the batch's deliveries; an answer still missing at the deadline is a release."""
        outlet = self._outlet
        for d in deliveries:
            outlet.send(d)
        with batch.cancel, trio.move_on_at(batch.deadline):
            await batch.answered.wait()
        for d in deliveries:
            if d.answer is None and not d.sent and d.handed_at is None:
                d.answer = NOT_SENT  # no room for it at the app before the lock expired
                outlet.lock_expired(d.topic, d, "lock_expired")
            elif d.answer is None:
                # No answer within the lock (or the sidecar is stopping): a release, like a lock timeout.
                room = outlet.room()
                stopping = room.stopping or room.draining or self._source.stop_requested
                d.answer = Answer(
                    "release",
                    AppError(
                        SHUTDOWN if stopping else LOCK_TIMEOUT,
                        "the sidecar stopped before the app answered"
                        if stopping
                        else "no answer before the record lock expired",
                    ),
                )
                outlet.lock_expired(d.topic, d, "abandoned" if stopping else "lock_expired")

    def decide_all(
        self,
        nursery: trio.Nursery,
        deliveries: Sequence[Delivery[Acquired]],
        out: list[tuple[Message, Ack]],
    ) -> None:
        """Each answered delivery's decision into `out`: at once where none needs a DLQ write (no
        task per record), in a task of its own where one does."""
        accept = Ack.ACCEPT
        for d in deliveries:
            if d.settled is Settled.ACCEPTED:  # the usual case: nothing else to look at
                out.append((d.ref.msg, accept))
                continue
            if (delay := self._tier_delay.of(d)) is not None:  # a long release: to its tier
                nursery.start_soon(to_tier_then_accept, self._tiers, self._dlq, d, delay, out)
                continue
            archive = self.decide(d, out)
            if archive is not None:
                reason, error = archive
                nursery.start_soon(
                    self.archive, d.ref.msg, d.tracked, d.delivery_count, reason, error, out
                )

    def decide(
        self, d: Delivery[Acquired], out: list[tuple[Message, Ack]]
    ) -> tuple[ArchiveReason, ErrorInfo | None] | None:
        """Append the delivery's decision to `out`, or return why it goes to the DLQ (its REJECT
        follows the write: `archive`)."""
        assert d.answer is not None
        msg = d.ref.msg
        answer = d.answer
        if answer is NOT_SENT:  # released unsent: no attempt, not a suspect when it comes back
            self._deaths.unsent(coordinates(msg))
            self._known.outcome_known(msg)
            out.append((msg, Ack.RELEASE))
            return None
        ack = ACK_BY_WORD[answer.ack]
        # Made when the answer came (`answered`), or now for a release nobody answered.
        settled = d.settled if d.settled is not None else self.settle(msg, ack, d.delivery_count)
        if settled is Settled.ACCEPTED:
            out.append((msg, Ack.ACCEPT))
            return None
        if settled is not Settled.DEAD_LETTERED:
            out.append((msg, Ack.RELEASE))  # the broker redelivers it
            self._known.outcome_known(msg)
            return None
        reason = (
            ArchiveReason.REJECTED if ack is Ack.REJECT else ArchiveReason.DELIVERY_COUNT_EXCEEDED
        )
        return reason, error_info(answer.error)

    def settle(self, msg: Message, ack: Ack, count: int) -> Settled:
        """The one decision on an answer (`decide`, on the sidecar's count and limit): a release
        on the broker's last delivery is dead-lettered too, since a release would let the broker
        archive the record without a DLQ record."""
        assert self._settings is not None
        verdict = decide(ack, count, self._settings.delivery_count_limit)
        if isinstance(verdict, Accept):
            return Settled.ACCEPTED
        if isinstance(verdict, DeadLetter):
            return Settled.DEAD_LETTERED
        if (msg.delivery_count() or 1) >= self._settings.group_delivery_count_limit:
            return Settled.DEAD_LETTERED
        return Settled.REDELIVERED

    async def dead_letter_exhausted(
        self,
        msg: Message,
        tracked: Tracked,
        count: int,
        out: list[tuple[Message, Ack]],
    ) -> None:
        """Acquired for the `count`-th time, past the limit: dead-letter it without delivering it.

        Its `count - 1` earlier deliveries are what the DLQ record says: this acquisition was not one.
        """
        assert self._settings is not None
        limit = self._settings.delivery_count_limit
        error = ErrorInfo(
            COUNT_EXHAUSTED,
            f"acquired again after {count - 1} deliveries (the limit is {limit}) whose outcome the "
            "broker never received: the sidecar stopped or the record lock expired",
        )
        await self.archive(
            msg,
            tracked,
            count - 1,
            ArchiveReason.DELIVERY_COUNT_EXCEEDED,
            error,
            out,
            unsent=True,
        )

    async def archive(
        self,
        msg: Message,
        tracked: Tracked,
        delivery_count: int,
        reason: ArchiveReason,
        error: ErrorInfo | None,
        out: list[tuple[Message, Ack]],
        *,
        unsent: bool = False,
    ) -> None:
        """DLQ write, then REJECT; a release when it was not written (the sidecar is stopping)."""
        assert self._settings is not None
        broker = msg.delivery_count() or 1  # the broker's count: its limit is on that
        outcome = await self._outlet.dead_letter(
            tracked,
            delivery_count,
            reason,
            error,
            consequence="stopping without acknowledging it",
            sink=self._dlq,
            # Held means released; on the group's last delivery the broker would archive it
            # without a DLQ record, so it is written even with the breaker open.
            may_hold=broker < self._settings.group_delivery_count_limit,
        )
        if outcome.done:
            out.append((msg, Ack.REJECT))
            return
        if unsent:  # dead-lettered at acquisition: no attempt to count
            self._deaths.unsent(coordinates(msg))
        if outcome is ArchiveOutcome.HELD:
            rec = tracked.record
            self._known.remember_held(rec.topic, rec.partition, rec.offset)
            out.append((msg, Ack.RELEASE))  # the broker hands it out again
            return
        # Not written: never REJECT (that would drop it). A release lets the broker redeliver it,
        # except at the group's limit, where the broker archives it itself.
        if broker >= self._settings.group_delivery_count_limit:  # the broker archives it
            rec = tracked.record
            self._deaths.archived_by_broker(
                (rec.topic, rec.partition, rec.offset), broker, "released"
            )
        out.append((msg, Ack.RELEASE))
        self._known.outcome_known(msg)


__all__ = ["NOT_SENT", "Decisions"]
