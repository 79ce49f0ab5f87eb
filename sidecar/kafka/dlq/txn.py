"""The transactional DLQ protocol: DLQ records and the source offsets in one Kafka transaction.

Owns `DlqWriter`: `PlainDlqWriter` plus the transaction calls and what keeps them safe (a watchdog,
fencing, outcome settling, the check for a skipped ABORT marker), and the transaction state, changed
by one task at a time (told in its docstring).

Imports the pure core, confluent-kafka and the DLQ modules below it; never the ledger, the source, the
engines or the HTTP modules.
"""

from __future__ import annotations

import hashlib
import logging
import socket
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn, Protocol

import trio
from confluent_kafka import (
    ConsumerGroupTopicPartitions,
    IsolationLevel,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import OffsetSpec

from sidecar.config import Config
from sidecar.core.deadletter import FailedRecord
from sidecar.kafka.dlq.errors import (
    RETRIABLE_CODES,
    DlqFatalError,
    DlqTxnAbortable,
    DlqTxnStuck,
    names,
)
from sidecar.kafka.dlq.record import DlqRecord, estimated_size
from sidecar.kafka.dlq.writer import PlainDlqWriter
from sidecar.kafka.errors import kafka_error

log = logging.getLogger("sidecar.dlq")

# Every librdkafka transaction call gets TXN_CALL_TIMEOUT_S and is called again on a
# retriable error for up to TXN_RETRY_BUDGET_S. A call still blocked TXN_CALL_WATCHDOG_S after it began is
# given up on: send_offsets_to_transaction() waits for its result with no time limit, and its coordinator
# request never times out (librdkafka issues #5456, #5511: after a broker restart the group coordinator
# can stay cached as a decommissioned broker, and nothing wakes the request up). Such a producer is
# replaced by a new one with the same transactional.id, which fences it and aborts its transaction.
TXN_CALL_TIMEOUT_S = 10.0
TXN_RETRY_BUDGET_S = 30.0
TXN_CALL_WATCHDOG_S = 25.0
TXN_INIT_TIMEOUT_S = 60.0

# After an abort, the DLQ partitions the transaction wrote to are checked for its ABORT marker: their last
# stable offset must pass the end of the log as it was right after the abort. A Kafka 4.x broker can skip
# the marker when the partition has no leader at that moment (KAFKA-20734: the transaction coordinator
# takes the partition for deleted), which leaves the aborted DLQ records in an open transaction that the
# producer's next commit to that partition would commit: a DLQ record written twice. Other producers'
# transactions may hold the stable offset back for ABORT_SETTLE_S; past that, an abort-only transaction
# (one probe record per partition, then abort) writes the missing marker, at most ABORT_REPAIR_ROUNDS times.
# A partition whose offsets cannot be read within ABORT_CHECK_BUDGET_S (no leader for that long) is checked
# again before the next DLQ record goes to it: that record's transaction is refused and aborted, and its
# abort checks the partition.
ABORT_SETTLE_S = 3.0
ABORT_REPAIR_ROUNDS = 2
ABORT_CHECK_BUDGET_S = 20.0
PROBE_HEADER = "__dlq.sidecar.abort.probe"

# A commit whose outcome is unknown (commit_transaction() failed fatally, overstayed its watchdog, kept
# timing out, or its transaction could not be aborted afterwards) is settled instead of stopping the
# sidecar: the producer is replaced (the new one's init_transactions() returns once the coordinator has
# ended the old transaction, completing a commit that reached it and aborting anything else), then the
# group's committed offsets are read, stable ones only (UNSTABLE_OFFSET_COMMIT is waited out), for up
# to OUTCOME_READ_BUDGET_S and compared with what the transaction sent (`transaction_committed`).
OUTCOME_READ_BUDGET_S = 60.0


def default_transactional_id(config: Config) -> str:
    """`kafka.transactional.id`, else one that is stable across restarts and unique per instance.

    Stable, so a restarted sidecar fences its dead incarnation and aborts its open transaction;
    unique, because two producers with one id fence each other. `group.instance.id` (static
    membership) names the instance when set; otherwise the host name plus the local API's address,
    which no two sidecars on one host can share.
    """
    explicit = config.kafka.get("transactional.id")
    if explicit:
        return str(explicit)
    instance = config.kafka.get("group.instance.id")
    if instance:
        return f"dlq-sidecar.{config.group_id}.{instance}"
    api = hashlib.sha256(config.api.listen.encode()).hexdigest()[:8]
    return f"dlq-sidecar.{config.group_id}.{socket.gethostname()}.{api}"


class CommitOffset(Protocol):
    """One partition's offset and metadata to commit (the source's `OffsetToCommit`, or a
    `TopicPartition`)."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def metadata(self) -> str | None: ...


class DlqWriter(PlainDlqWriter):
    """Plain DLQ writes, and with a `transactional_id` (given when built) the transactional protocol.

    `DlqWriter` is `PlainDlqWriter` plus the transaction calls the consumer engine's transaction loop makes
    (`txn_begin`, `txn_produce`, `txn_commit`, `txn_abort`) and what keeps them safe: a watchdog on every
    librdkafka transaction call, replacing (fencing) a stuck or broken producer, settling a commit whose outcome
    is unknown from the group's stable offsets, and the KAFKA-20734 check for an ABORT marker the broker skipped.

    Who changes what: the transaction state (`_in_txn`, `_stuck`, `_broken`, `_txn_touched`, the producer swap
    in `_replace_producer`) is changed only by these methods, called by one task at a time (the consumer engine's
    transaction loop), in the trio thread; a poll that reports a fatal error only marks the producer `_broken`
    (`_poll_failed`). Without a `transactional_id` none of this runs and the writer is a plain one.
    """

    def _init_protocol(self) -> None:
        self._stuck = False  # a transaction call on the producer overstayed its watchdog
        # The producer's fatal error, when replacing the producer recovers from it (`replaceable`):
        # the producer is replaced before it is used again.
        self._broken: KafkaError | None = None
        self._in_txn = False  # begun and not yet committed or aborted
        self._abandoned: list[Producer] = []  # fenced producers a thread may still be blocked in
        # DLQ partitions the open transaction has written to (or tried to), checked after an abort.
        self._txn_touched: set[tuple[str, int]] = set()
        # DLQ partitions whose check after an abort could not read their offsets (no leader for
        # longer than ABORT_CHECK_BUDGET_S): checked again before a DLQ record goes to them.
        self._unchecked: set[tuple[str, int]] = set()
        self.abort_markers_repaired = 0
        self.producers_replaced = 0
        self.outcomes_settled = 0  # commits whose unknown outcome was read from the group's offsets

    async def _started(self) -> None:
        if self.transactional_id:
            assert self._producer is not None
            # Fences an earlier incarnation with the same id and aborts its open transaction.
            await trio.to_thread.run_sync(self._producer.init_transactions, TXN_INIT_TIMEOUT_S)

    def _poll_failed(self, producer: Producer, err: KafkaError) -> bool:
        if self._is_abandoned(producer):
            # A producer being replaced (or already replaced) reports its own fencing (the
            # successor's init_transactions() fenced it, possibly before the swap in
            # _replace_producer could take the handle lock) or the fatal error it is replaced
            # for. It is never used again.
            log.info("the replaced DLQ producer reported %s; ignored", err)
            return True
        if self.transactional_id and replaceable(err):
            # A transactional producer's fatal error also fails the transaction call under way
            # (if any), which ends its transaction by replacing the producer; the next
            # transaction begins on a new one anyway.
            log.warning(
                "the transactional DLQ producer failed (%s); it is replaced before its next use",
                err,
            )
            self._broken = err
            return True
        return False

    # -- transactional mode: DLQ records and the offset commit in one Kafka transaction -------------
    #
    # librdkafka's rules (rdkafka.h): an error from a transaction call is fatal (the producer is
    # unusable), requires an abort (abort_transaction(), then the transaction may be redone), or
    # is retriable (call the same function again; a timed-out commit_transaction() resumes where it
    # was). A fatal error stops the sidecar only when a new producer cannot get past it (`replaceable`):
    # otherwise the producer is replaced, which ends its transaction. Before commit_transaction() that
    # is an abort, and the transaction is redone; after it the outcome is read (`_settle_outcome`).

    async def _txn_call(self, what: str, fn: Callable[[Producer], Any]) -> Any:
        """Run `fn(producer)` in a thread; DlqTxnStuck when it is still blocked after the watchdog."""
        assert self._producer is not None
        producer = self._producer
        try:
            with trio.move_on_after(TXN_CALL_WATCHDOG_S):
                async with self._handle_lock:
                    # Abandoned, not waited for, past the watchdog: the thread stays blocked in
                    # the old producer until librdkafka lets go, and txn_abort() replaces it.
                    return await trio.to_thread.run_sync(fn, producer, abandon_on_cancel=True)
        finally:
            # A call may queue events (an abort's purged delivery reports, a fatal error's
            # report): the poll loop serves them.
            self._ask_poll()
        self._stuck = True
        raise DlqTxnStuck(f"{what} still blocked after {TXN_CALL_WATCHDOG_S:.0f} s")

    async def txn_begin(self) -> None:
        if self._broken is not None:
            await self._replace_producer()
        try:
            await self._txn_call("begin_transaction", lambda p: p.begin_transaction())
        except KafkaException as exc:
            # Begin fails only on a producer in the wrong state (an earlier transaction not ended),
            # or on one that failed fatally since: a new producer gets past the latter.
            err = kafka_error(exc)
            if not (err.fatal() and replaceable(err)):
                raise DlqFatalError(f"cannot begin a DLQ transaction: {err}") from exc
            log.warning("begin_transaction: %s; replacing the producer", err)
            await self._replace_producer()
            try:
                await self._txn_call("begin_transaction", lambda p: p.begin_transaction())
            except KafkaException as again:
                raise DlqFatalError(
                    f"cannot begin a DLQ transaction: {kafka_error(again)}"
                ) from again
        self._in_txn = True
        self._txn_touched = set()

    async def txn_produce(self, failed: FailedRecord, dlq_topic: str) -> DlqRecord:
        """Produce inside the open transaction and wait for the broker's acknowledgement.

        A record known to be too large goes headers-only up front: inside a transaction a failed
        produce poisons the whole transaction, so there is no retry-and-fall-back as in `write`.
        A retriable failure (a broker restart, a timeout) raises DlqTxnAbortable: the transaction is
        aborted and redone; so does a fatal error that a new producer recovers from (`replaceable`);
        anything else is fatal.
        """
        if dlq_topic not in self.topics.partitions:
            await trio.to_thread.run_sync(self.prepare_topics_sync, [dlq_topic])
        if self._broken is not None:
            raise DlqTxnAbortable(f"the transactional DLQ producer failed: {self._broken}")
        record = self._dlq_record(failed, dlq_topic)
        limit = self.topics.max_bytes.get(dlq_topic)
        dropped = False
        if limit is not None and estimated_size(record) > limit and failed.tier is not None:
            raise DlqFatalError(
                f"the retry tier record of {failed.topic}[{failed.partition}]@{failed.offset} "
                f"(about {estimated_size(record)} bytes) is too large for {dlq_topic} "
                f"(max.message.bytes={limit}); its offset is not committed"
            )
        if limit is not None and estimated_size(record) > limit:
            record = self._dlq_record(
                failed,
                dlq_topic,
                drop_copy_reason=(
                    f"record too large for DLQ topic {dlq_topic} (max.message.bytes={limit}); "
                    "written with the error context headers only"
                ),
            )
            dropped = True
        key = (record.topic, record.partition)
        if key in self._unchecked:
            # An earlier abort's records may still be in an open transaction there (KAFKA-20734):
            # this transaction's commit would make them visible. Its abort checks the partition.
            raise DlqTxnAbortable(
                f"DLQ partition {record.topic}[{record.partition}] is checked for an earlier "
                "abort's ABORT marker before a DLQ record goes to it"
            )
        self._txn_touched.add(key)
        err = await self._produce(record)
        if err is not None:
            self.failed += 1
            what = (
                f"transactional DLQ write of {failed.topic}[{failed.partition}]@{failed.offset} to "
                f"{dlq_topic} failed: {err.name()}: {err.str()}"
            )
            if err.fatal():
                self._raise_fatal(err, what)
            if (
                err.retriable()
                or err.txn_requires_abort()
                or err.code() in RETRIABLE_CODES
                or err.code() in _TXN_PURGED
            ):
                raise DlqTxnAbortable(what)
            raise DlqFatalError(what)
        self.written += 1
        if dropped:
            self.copies_dropped += 1
        self._count_dropped_headers(record, failed)
        return record

    def _raise_fatal(
        self, err: KafkaError, what: str, cause: BaseException | None = None
    ) -> NoReturn:
        """A transaction call failed fatally: DlqFatalError when a new producer cannot get past
        `err` (`replaceable`), else DlqTxnAbortable with the producer replaced before its next use."""
        if not replaceable(err):
            raise DlqFatalError(what) from cause
        self._broken = err
        raise DlqTxnAbortable(what) from cause

    async def txn_commit(self, commit: Sequence[CommitOffset], group_metadata: object) -> None:
        """Add the offsets `commit` names to the open transaction and commit it.

        Returns once it committed. DlqTxnAbortable: it did not commit; abort it (a no-op when it has
        been ended here already), then it may be redone. DlqFatalError: the producer cannot go on
        (`replaceable`), or the outcome stayed unknown (the group's offsets unreadable).

        Once commit_transaction() has been called, the commit may have reached the coordinator
        whatever the call says, and an abort then is refused (INVALID_TXN_STATE, fatal) or would
        let a redo write the DLQ records twice. So every way out of the commit but a success ends
        the transaction here and knows how: an abort that succeeded, or `_settle_outcome`.
        """
        started = trio.current_time()
        if self._broken is not None:
            raise DlqTxnAbortable(f"the transactional DLQ producer failed: {self._broken}")
        offsets = [
            TopicPartition(o.topic, o.partition, o.offset, metadata=o.metadata) for o in commit
        ]
        while offsets:
            try:
                await self._txn_call(
                    "send_offsets_to_transaction",
                    lambda p: p.send_offsets_to_transaction(
                        offsets, group_metadata, TXN_CALL_TIMEOUT_S
                    ),
                )
                break
            except KafkaException as exc:
                # Not committing yet: whatever went wrong, an abort (or a fencing) ends it.
                err = kafka_error(exc)
                if err.fatal():
                    self._raise_fatal(err, f"send_offsets_to_transaction: {err}", exc)
                if (
                    not err.retriable()
                    or err.txn_requires_abort()
                    or trio.current_time() - started > TXN_RETRY_BUDGET_S
                ):
                    raise DlqTxnAbortable(f"send_offsets_to_transaction: {err}") from exc
                log.warning("send_offsets_to_transaction: %s; calling it again", err)
                await trio.sleep(0.5)
        while True:
            try:
                await self._txn_call(
                    "commit_transaction", lambda p: p.commit_transaction(TXN_CALL_TIMEOUT_S)
                )
                self._in_txn = False
                self._txn_touched = set()
                return
            except DlqTxnStuck as exc:
                # commit_transaction() keeps to its timeout; one that did not may have reached
                # the coordinator.
                why = str(exc)
            except KafkaException as exc:
                err = kafka_error(exc)
                if err.fatal() and not replaceable(err):
                    raise DlqFatalError(f"commit_transaction: {err}") from exc
                if err.txn_requires_abort() and not err.fatal():
                    # librdkafka failed the transaction, but an EndTxn(commit) sent before may
                    # still have reached the coordinator (rd_kafka_txn_handle_EndTxn): only an
                    # abort that succeeds proves it did not.
                    if await self._abort_after_commit(f"commit_transaction: {err}"):
                        raise DlqTxnAbortable(f"commit_transaction: {err}") from exc
                    why = f"commit_transaction: {err}, and its abort failed"
                elif err.retriable() and not err.fatal():
                    if trio.current_time() - started <= TXN_RETRY_BUDGET_S:
                        # A timeout: the commit goes on in the background; calling the function
                        # again resumes it.
                        log.warning("commit_transaction: %s; calling it again", err)
                        await trio.sleep(0.5)
                        continue
                    why = f"commit_transaction kept failing for {TXN_RETRY_BUDGET_S:.0f} s: {err}"
                else:
                    why = f"commit_transaction: {err}"
            if await self._settle_outcome(offsets, why):
                return
            raise DlqTxnAbortable(f"{why}; it did not commit")

    async def _abort_after_commit(self, why: str) -> bool:
        """Abort a transaction whose commit failed; True when the abort succeeded (it did not commit).

        False when abort_transaction() failed or overstayed: the outcome is then unknown."""
        log.warning("%s; aborting the transaction", why)
        touched = self._txn_touched
        try:
            await self._txn_call(
                "abort_transaction", lambda p: p.abort_transaction(TXN_CALL_TIMEOUT_S)
            )
        except (KafkaException, DlqTxnStuck) as exc:
            err = kafka_error(exc) if isinstance(exc, KafkaException) else None
            if err is not None and err.fatal() and not replaceable(err):
                raise DlqFatalError(f"abort_transaction: {err}") from exc
            if err is not None and err.fatal():
                self._broken = err
            log.warning("abort_transaction after a failed commit: %s", exc)
            return False
        self._in_txn = False
        self._txn_touched = set()
        if touched:
            await self._check_abort_markers(touched)
        return True

    async def _settle_outcome(self, offsets: list[TopicPartition], why: str) -> bool:
        """End a transaction whose commit's outcome is unknown and learn it: True when it committed.

        The new producer's init_transactions() fences the old one and returns once the coordinator
        has ended the old transaction, as it will stay; the group's stable committed offsets then
        say which way (`transaction_committed`). An aborted one's DLQ partitions are checked for
        the ABORT marker. DlqFatalError when the offsets cannot be read (see OUTCOME_READ_BUDGET_S).
        """
        if not offsets:
            raise DlqFatalError(f"the DLQ transaction commit's outcome is unknown: {why}")
        log.warning(
            "the DLQ transaction commit's outcome is unknown (%s); fencing the producer and reading "
            "the group's committed offsets to learn it",
            why,
        )
        touched, self._txn_touched = self._txn_touched, set()
        await self._replace_producer()
        parts = sorted({(tp.topic, tp.partition) for tp in offsets})
        committed = await self._group_offsets(
            parts, deadline=trio.current_time() + OUTCOME_READ_BUDGET_S
        )
        if committed is None:
            raise DlqFatalError(
                f"the DLQ transaction commit's outcome is unknown ({why}): the group's committed "
                f"offsets for {names(parts)} could not be read within {OUTCOME_READ_BUDGET_S:.0f} s"
            )
        self.outcomes_settled += 1
        if transaction_committed(offsets, committed):
            log.warning("the DLQ transaction had committed (the group's offsets are its own)")
            return True
        log.warning("the DLQ transaction had not committed; it is redone")
        if touched:
            await self._check_abort_markers(touched)
        return False

    async def _group_offsets(
        self, parts: list[tuple[str, int]], *, deadline: float
    ) -> dict[tuple[str, int], tuple[int, str | None]] | None:
        """The group's stable committed offset and metadata of each partition, retried until
        `deadline` (a pending transactional commit, a coordinator loading); None when not read."""
        while True:
            try:
                return await trio.to_thread.run_sync(self._group_offsets_sync, parts)
            except (KafkaException, TimeoutError) as exc:
                if trio.current_time() + 0.5 > deadline:
                    log.warning("reading the group's committed offsets: %s", exc)
                    return None
                log.debug("reading the group's committed offsets: %s; again", exc)
            await trio.sleep(0.5)

    def _group_offsets_sync(
        self, parts: list[tuple[str, int]]
    ) -> dict[tuple[str, int], tuple[int, str | None]]:
        admin = self.admin()  # referenced until the results are in: a dropped client never answers
        request = ConsumerGroupTopicPartitions(self.group, [TopicPartition(t, p) for t, p in parts])
        futures = admin.list_consumer_group_offsets(
            [request], require_stable=True, request_timeout=5
        )
        result = futures[self.group].result(timeout=10)
        out: dict[tuple[str, int], tuple[int, str | None]] = {}
        for tp in result.topic_partitions or []:
            if tp.error is not None:
                # UNSTABLE_OFFSET_COMMIT: a transactional commit is still pending on it.
                raise KafkaException(tp.error)
            out[(tp.topic, tp.partition)] = (tp.offset, tp.metadata)
        return out

    async def txn_abort(self) -> None:
        """End the open transaction without committing it. DlqFatalError when that cannot be done.

        Only for a transaction that did not commit: `txn_commit` settles the ones it has tried to
        commit. An abort that fails or overstays (or a producer stuck in an earlier call, which
        makes abort_transaction() answer "conflicting call in progress", or one that failed
        fatally) is done by fencing instead: a new producer with the same transactional.id; its
        init_transactions() aborts the transaction. Then the DLQ partitions it wrote to are checked
        for the ABORT marker (KAFKA-20734), with those an earlier check could not read
        (`txn_produce` refuses a record for one of them, which ends its transaction here).
        """
        if not self._in_txn and not self._stuck and self._broken is None:
            return
        touched, self._txn_touched = self._txn_touched, set()
        await self._end_open_txn()
        touched |= self._unchecked
        if touched:
            await self._check_abort_markers(touched)

    async def _end_open_txn(self) -> None:
        started = trio.current_time()
        while not self._stuck and self._broken is None:
            try:
                await self._txn_call(
                    "abort_transaction", lambda p: p.abort_transaction(TXN_CALL_TIMEOUT_S)
                )
                self._in_txn = False
                return
            except DlqTxnStuck:
                break
            except KafkaException as exc:
                err = kafka_error(exc)
                if err.fatal():
                    if not replaceable(err):
                        raise DlqFatalError(f"abort_transaction: {err}") from exc
                    # E.g. INVALID_TXN_STATE: librdkafka sends EndTxn(abort) for a transaction
                    # whose AddPartitionsToTxn failed in transport (it cannot know whether the
                    # coordinator got it), and the coordinator, which never did, refuses it.
                    log.warning("abort_transaction: %s; replacing the producer", err)
                    break
                if not err.retriable() or trio.current_time() - started > TXN_RETRY_BUDGET_S:
                    log.warning("abort_transaction: %s; replacing the producer", err)
                    break
                log.warning("abort_transaction: %s; calling it again", err)
                await trio.sleep(0.5)
        await self._replace_producer()

    # -- KAFKA-20734: an ABORT marker the broker skipped ------------------------------------------

    async def _check_abort_markers(self, touched: set[tuple[str, int]]) -> None:
        """Make sure the aborted transaction's DLQ records are really aborted (see ABORT_SETTLE_S)."""
        parts = sorted(touched)
        deadline = trio.current_time() + ABORT_CHECK_BUDGET_S
        targets = await self._log_ends(parts, committed=False, deadline=deadline)
        if targets is None:
            self._unchecked.update(parts)
            log.warning(
                "could not read the end of DLQ partitions %s after an abort; they are checked "
                "before the next DLQ record goes to them",
                names(parts),
            )
            return
        self._unchecked.difference_update(parts)
        for rnd in range(ABORT_REPAIR_ROUNDS + 1):
            hanging = await self._unsettled(targets, deadline)
            if not hanging:
                return
            # A partition found open is repaired at least once, even when reading it took the
            # whole budget (the next record's transaction would otherwise commit what was aborted).
            if rnd == ABORT_REPAIR_ROUNDS or (rnd > 0 and trio.current_time() > deadline):
                log.error(
                    "DLQ partitions %s still hold an open transaction after the abort and %d "
                    "abort-only transactions; if it is this producer's, its next commit to them "
                    "makes the aborted DLQ records visible (a DLQ record written twice)",
                    names(hanging),
                    rnd,
                )
                return
            log.warning(
                "the broker did not write the ABORT marker to DLQ partitions %s (Kafka "
                "KAFKA-20734: no partition leader at that moment); ending the aborted records with "
                "an abort-only transaction",
                names(hanging),
            )
            self.abort_markers_repaired += 1
            await self._abort_only(hanging)

    async def _unsettled(
        self, targets: dict[tuple[str, int], int], deadline: float
    ) -> list[tuple[str, int]]:
        """The partitions whose last stable offset stays short of its target for ABORT_SETTLE_S."""
        settle_at = min(trio.current_time() + ABORT_SETTLE_S, deadline)
        while True:
            stable = await self._log_ends(list(targets), committed=True, deadline=settle_at)
            short = [tp for tp in targets if stable is None or stable.get(tp, -1) < targets[tp]]
            if not short or trio.current_time() >= settle_at:
                return short
            await trio.sleep(0.2)

    async def _log_ends(
        self, parts: list[tuple[str, int]], *, committed: bool, deadline: float
    ) -> dict[tuple[str, int], int] | None:
        """Each partition's end offset (the last stable offset when `committed`), retried until
        `deadline` while a partition has no leader; None when it could not be read in time."""
        while True:
            try:
                return await trio.to_thread.run_sync(self._list_ends_sync, parts, committed)
            except (KafkaException, TimeoutError, _OffsetUnknown) as exc:
                if trio.current_time() + 0.5 > deadline:
                    log.debug("list_offsets on %s: %s", names(parts), exc)
                    return None
            await trio.sleep(0.5)

    def _list_ends_sync(
        self, parts: list[tuple[str, int]], committed: bool
    ) -> dict[tuple[str, int], int]:
        level = IsolationLevel.READ_COMMITTED if committed else IsolationLevel.READ_UNCOMMITTED
        admin = self.admin()  # referenced until the results are in: a dropped client never answers
        futures = admin.list_offsets(
            {TopicPartition(t, p): OffsetSpec.latest() for t, p in parts},  # type: ignore[no-untyped-call]
            isolation_level=level,
            request_timeout=5,
        )
        ends = {
            (tp.topic, tp.partition): int(f.result(timeout=10).offset) for tp, f in futures.items()
        }
        unknown = sorted(tp for tp, offset in ends.items() if offset < 0)
        if unknown:
            # No offset, without an error: a target of -1 would pass any check, so ask again.
            raise _OffsetUnknown(f"no end offset for {names(unknown)}")
        return ends

    async def _abort_only(self, parts: list[tuple[str, int]]) -> None:
        """A transaction with one probe record (no key or value, header PROBE_HEADER) per partition,
        aborted: its ABORT marker also ends the earlier records left open on those partitions."""
        try:
            await self._txn_call("begin_transaction", lambda p: p.begin_transaction())
            self._in_txn = True
            for topic, partition in parts:
                probe = DlqRecord(topic, partition, None, None, ((PROBE_HEADER, b"abort-only"),))
                err = await self._produce(probe)
                if err is not None:
                    log.warning("abort-only probe to %s[%d]: %s", topic, partition, err.str())
        except (KafkaException, DlqTxnStuck) as exc:
            log.warning("abort-only transaction: %s", exc)
        if self._in_txn or self._stuck:
            await self._end_open_txn()

    def _is_abandoned(self, producer: Producer) -> bool:
        return any(producer is p for p in self._abandoned)

    async def _replace_producer(self) -> None:
        old = self._producer
        if old is not None and not self._is_abandoned(old):
            # Marked before the successor fences it: the old handle may report its fencing from a
            # poll that is under way while this still waits for the handle lock to swap them.
            # A thread may also still be blocked in it: it is left to librdkafka (fenced, its
            # transaction aborted), never called by us again once swapped.
            self._abandoned.append(old)
        producer = self._new_producer()
        log.warning(
            "replacing the transactional DLQ producer (transactional.id %s): the new one fences "
            "the old and ends its open transaction (a commit that reached the coordinator is "
            "completed, anything else aborted)",
            self.transactional_id,
        )
        try:
            await trio.to_thread.run_sync(producer.init_transactions, TXN_INIT_TIMEOUT_S)
        except KafkaException as exc:
            raise DlqFatalError(
                f"cannot start a new transactional DLQ producer: {kafka_error(exc)}"
            ) from exc
        async with self._handle_lock:
            self._producer = producer
            self._release_waves()
            self._stuck = False
            self._broken = None
            self._in_txn = False
        self._ask_poll()
        self.producers_replaced += 1


# Fatal producer errors that a new producer with the same transactional.id cannot get past, or must not
# try to: another live producer holds our transactional.id (two sidecars with one id; replacing ours
# would fence theirs, and theirs ours, in turn), or the client is not allowed or not able to do
# transactions at all. Every other fatal error (INVALID_TXN_STATE, an idempotence sequence error, ...)
# is librdkafka giving up on its own transactional state: a new producer starts from the coordinator's.
_FATAL_FOR_GOOD = {
    KafkaError._FENCED,
    KafkaError.PRODUCER_FENCED,
    KafkaError.INVALID_PRODUCER_EPOCH,
    KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    KafkaError.CLUSTER_AUTHORIZATION_FAILED,
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError.GROUP_AUTHORIZATION_FAILED,
    KafkaError._AUTHENTICATION,
    KafkaError.SASL_AUTHENTICATION_FAILED,
    KafkaError.UNSUPPORTED_VERSION,
    KafkaError._UNSUPPORTED_FEATURE,
    KafkaError.INVALID_TRANSACTION_TIMEOUT,
}


class _OffsetUnknown(Exception):
    """list_offsets answered a partition without an offset (-1) and without an error."""


def replaceable(err: KafkaError) -> bool:
    """True for a fatal transactional-producer error that replacing the producer recovers from."""
    return err.code() not in _FATAL_FOR_GOOD


CommittedOffsets = Mapping[tuple[str, int], tuple[int, str | None]]


def transaction_committed(sent: Sequence[TopicPartition], committed: CommittedOffsets) -> bool:
    """Whether a transaction whose outcome was unknown committed, from the group's stable committed
    offsets once it has ended (read after a fencing): True when a partition's committed offset and
    metadata are exactly what the transaction sent.

    One partition is enough, and needed: a transaction commits all its offsets or none, but a partition
    lost meanwhile may have moved on under its next owner. An aborted transaction leaves the earlier
    commit, and that always differs: the transaction carries a record newly counted done on each of its
    partitions (a higher offset, or the done record in the metadata).

    That precondition is the callers' to keep: a transaction that also carried a partition without a newly
    done record (one opened from the group's committed state carries exactly that state) would match here
    after an abort, and its batch's records would be committed past without their DLQ records
    (tests/reliability/test_txn_redo.py reproduces it).
    """
    for tp in sent:
        got = committed.get((tp.topic, tp.partition))
        if got is not None and got[0] == tp.offset and (got[1] or "") == (tp.metadata or ""):
            return True
    return False


# Delivery reports of records purged by an abort: the transaction they were in is gone.
_TXN_PURGED = {KafkaError._PURGE_INFLIGHT, KafkaError._PURGE_QUEUE}


__all__ = [
    "DlqWriter",
    "replaceable",
    "transaction_committed",
]
