"""The Kafka source: a confluent-kafka consumer driven from trio.

Owns the consumer handle: subscribe, the intake loop, commits with metadata, pause/resume and close.
By default (`source.intake: signal`), where `queue_signal` allows it and the protocol is cooperative,
trio's thread waits on the consumer queue's wake-up and takes the records itself (`_signal_loop`); a
revoke there is held open until the answers are in (`HeldRevokes`). Otherwise a poll thread of its own
hands batches to trio without waiting for each (`_poll_thread`, `HandOver`), its rebalance callbacks
coming back into trio after the batches before them. Must not import the ledger or the HTTP modules:
it hands raw messages and partition events to a `SourceListener`.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from typing import Any

import trio
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from sidecar.core.budget import DEFAULT_BUFFERED_BYTES
from sidecar.core.errors import CommitFailed, KafkaClientError
from sidecar.kafka.commit_waiters import CommitWaiters, Done
from sidecar.kafka.consumer_config import (
    NOT_TRANSIENT,
    broker_error_reason,
    consumer_properties,
)
from sidecar.kafka.errors import kafka_error
from sidecar.kafka.hand_over import HandOver
from sidecar.kafka.held_revokes import HeldRevokes
from sidecar.kafka.logsummary import librdkafka_logger
from sidecar.kafka.message import records_of
from sidecar.kafka.queue_signal import QueueSignal, queue_signal
from sidecar.kafka.source_port import (
    OFFSET_INVALID,
    AssignedPartition,
    LagReading,
    OffsetToCommit,
    PollEnd,
    SourceListener,
    commit_key,
    names,
    read_committed,
    reset_offset,
    start_offsets,
    to_tps,
    values_bytes,
)

log = logging.getLogger("sidecar.source")


def resume_fetching(consumer: Consumer, tps: list[TopicPartition], *, wake: bool) -> None:
    """Resume fetching ``tps``; with ``wake``, seek each to the position it resumes from.

    A resume is applied by librdkafka's main thread and wakes no broker thread; one whose
    partitions are all paused sleeps out its serve timeout of one second before it looks again
    (`rd_kafka_broker_consumer_serve`, src/rdkafka_broker.c). A seek sets the partition's fetch
    state, which wakes its leader's thread (`rd_kafka_toppar_set_fetch_state`,
    src/rdkafka_partition.c); the position is the one the resume would fetch from (what was
    taken, plus one), so nothing is skipped or read twice.
    """
    consumer.resume(tps)
    if not wake:
        return
    for tp in consumer.position(tps):
        if tp.error is not None or tp.offset < 0:
            continue  # nothing taken yet: librdkafka looks the start up itself, and wakes
        try:
            consumer.seek(tp)
        except KafkaException as exc:  # revoked meanwhile: its next owner fetches it
            log.debug("no seek for %s[%d] on resume: %s", tp.topic, tp.partition, exc)


# How long a commit may take before the caller gives up on it. librdkafka defers a commit while it
# has no group coordinator and retries it without a time limit (librdkafka #3740, #3847); a caller
# that waited for it would stall every hand-out behind it. A commit given up on may still land later,
# in order with the ones after it: its state is older, never ahead of what is done.
COMMIT_TIMEOUT_S = 15.0
# The client.id the consumer gets unless the configuration names one (the queue signal's check reads it
# back from librdkafka's handle name).
DEFAULT_CLIENT_ID = "dlq-sidecar"
# How long reading the committed offsets at an assignment may hold trio's thread (wake-up path).
ASSIGN_READ_ON_TRIO_S = 5.0
# How long closing the consumer (final revoke commit, leaving the group) may take at shutdown.
CLOSE_TIMEOUT_S = 10.0


class SourceError(KafkaClientError):
    """A consumer error the sidecar cannot continue after."""


class CommitTimeout(CommitFailed):
    """A commit did not complete in time (it may still land later)."""


# What a call on the consumer handle raises for a reason outside the sidecar: librdkafka's error,
# or confluent-kafka's RuntimeError for a handle already closed. Anything else is a bug and is not
# caught on the poll thread.
_CONSUMER_CALL_ERRORS = (KafkaException, RuntimeError)


class KafkaSource:
    def __init__(
        self,
        kafka: Mapping[str, Any],
        topics: Sequence[str],
        listener: SourceListener,
        batch_size: int = 500,
        poll_timeout_s: float = 0.1,
        max_buffered_bytes: int = DEFAULT_BUFFERED_BYTES,
        queue_signal: bool = False,
    ) -> None:
        self._want_signal = queue_signal  # source.intake: signal
        self._props = consumer_properties(kafka, max_buffered_bytes)
        self._topics = list(topics)
        self._listener = listener
        self._batch_size = batch_size
        self._poll_timeout_s = poll_timeout_s
        self._consumer: Consumer | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._closed = False
        self._stop_polling = False
        self._commit_lock = trio.Lock()
        self.assigned: set[tuple[str, int]] = set()
        # The assignment (counted) each assigned partition came with (`_commit_assigned`).
        self._assignment_of: dict[tuple[str, int], int] = {}
        self._assignments = 0
        self.paused: set[tuple[str, int]] = set()
        self.fatal_error: str | None = None
        self.broker_ok = True
        # Why the broker is not usable (authentication, TLS, connection), while `broker_ok` is False.
        self.broker_error: str | None = None
        self._broker_error_code: int | None = None
        self._stopped = trio.Event()
        # Consumer calls queued for the poll thread: (fn, done-callback or None).
        self._commands: deque[
            tuple[Callable[[Consumer], Any], Callable[[Any, BaseException | None], None] | None]
        ] = deque()
        self._poll_thread_active = False
        self._handed = HandOver(listener)  # the poll thread's batches to trio's thread
        # The poll thread has served its last poll (set under `_commit_waiters.lock`): an async
        # commit issued now would never get its callback, so commits take the synchronous path.
        self._thread_exiting = False
        self._direct_lock = trio.Lock()
        self._busy_until = 0.0
        self._busy_poll_timeout_s = 0.001
        self._next_lag_refresh = 0.0
        self._lag = LagReading()
        self._group_metadata: Any = None
        # Callers waiting for an asynchronous commit's result (from librdkafka's callback).
        self._commit_waiters = CommitWaiters()
        self.commit_timeout_s = COMMIT_TIMEOUT_S
        self.close_timeout_s = CLOSE_TIMEOUT_S
        self._incremental = str(
            self._props.get("group.protocol", "classic")
        ) == "consumer" or "cooperative" in str(
            self._props.get("partition.assignment.strategy", "")
        )
        self._reset_offset = reset_offset(str(self._props.get("auto.offset.reset", "largest")))
        self._props.setdefault("client.id", DEFAULT_CLIENT_ID)
        # The wake-up path (`_signal_loop`): its signal, trio's thread, the wait it may cut short.
        self._signal: QueueSignal | None = None
        self._trio_thread: int | None = None
        self._signal_wait: trio.CancelScope | None = None
        self._rebalanced = False  # a rebalance callback ran inside the current consume()
        self._held = HeldRevokes()  # revokes on trio's thread, finished once the answers are in
        # How records come in: "queue-signal" or "poll-thread" (once `run()` has decided).
        self.intake: str | None = None

    @property
    def consumer(self) -> Consumer:
        assert self._consumer is not None, "start() first"
        return self._consumer

    def start(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        props = dict(self._props)
        props["error_cb"] = self._on_error
        props["on_commit"] = self._commit_waiters.on_commit
        self._consumer = Consumer(props, logger=librdkafka_logger())
        self._consumer.subscribe(
            self._topics,
            on_assign=self._cb_assign,
            on_revoke=self._cb_revoke,
            on_lost=self._cb_lost,
        )

    def _on_error(self, err: KafkaError) -> None:
        # librdkafka's global errors (on the poll thread); all brokers down is what readiness reports.
        code = err.code()
        reason = broker_error_reason(err)
        if reason is not None or code == KafkaError._ALL_BROKERS_DOWN:
            self.broker_ok = False
        if code in NOT_TRANSIENT:
            # Not a network blip: say it plainly, once per cause (librdkafka retries every few
            # hundred milliseconds and logs each attempt itself).
            if self._broker_error_code != code:
                log.error("kafka: %s", reason)
            self._broker_error_code = code
            self.broker_error = reason
            return
        log.warning("kafka client error: %s", err)
        if reason is not None and self._broker_error_code not in NOT_TRANSIENT:
            self.broker_error = reason  # a connection failure never hides an earlier cause

    def _broker_usable(self) -> None:
        self.broker_ok = True
        self.broker_error = None
        self._broker_error_code = None

    # -- rebalance callbacks: run on the poll thread, inside consume() -------------------------

    def _on_trio_thread(self) -> bool:
        return self._trio_thread is not None and threading.get_ident() == self._trio_thread

    def _cb_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        began = time.monotonic()
        try:
            wait = ASSIGN_READ_ON_TRIO_S if self._on_trio_thread() else 30.0
            committed = self._read_committed(consumer, partitions, wait)
            read = True
        except KafkaException as exc:
            # Without the committed state we cannot know what is done; librdkafka reads the
            # committed offsets itself when the assignment starts, so start with no metadata.
            log.warning(
                "reading committed offsets failed: %s; starting without delivery state", exc
            )
            committed = [TopicPartition(p.topic, p.partition, OFFSET_INVALID) for p in partitions]
            read = False
        assigned = [
            AssignedPartition(
                tp.topic,
                tp.partition,
                tp.offset if tp.offset >= 0 else None,
                tp.metadata if tp.offset >= 0 else None,
            )
            for tp in committed
        ]
        if read:
            # Start fetching exactly where the ledger starts: the offsets just read, or the reset
            # policy where there are none. librdkafka would otherwise read the committed offsets a
            # second time, which can disagree with ours if a commit lands in between, and a failed
            # read there can leave a partition that never starts fetching (librdkafka #5586).
            start = start_offsets(consumer, assigned, self._reset_offset, wait)
            if self._incremental:
                consumer.incremental_assign(start)
            else:
                consumer.assign(start)
        self._assignments += 1
        for tp in partitions:
            self.assigned.add((tp.topic, tp.partition))
            self._assignment_of[(tp.topic, tp.partition)] = self._assignments
        self._group_metadata = consumer.consumer_group_metadata()
        self._listen(self._listener.on_assigned, assigned)
        took_ms = round((time.monotonic() - began) * 1000, 1)  # offsets read, looked up, opened
        log.info("assigned %s", names(partitions), extra={"fields": {"took_ms": took_ms}})

    # Reading the committed offsets at an assignment (a module function: tests call it alone).
    _read_committed = staticmethod(read_committed)

    def _cb_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        keys = [(tp.topic, tp.partition) for tp in partitions]
        on_trio = self._on_trio_thread()
        if on_trio:
            self._rebalanced = True
            if self._held.hold(consumer, partitions, self._revoke):
                return
            offsets = self._listener.revoked_now(keys)
        else:
            offsets = self._to_trio(self._listener.on_revoked, keys)
        if offsets:
            try:
                # On trio's thread the commit is not waited for (a lost coordinator would hold
                # every task): librdkafka sends it before the partitions leave.
                if on_trio:
                    consumer.commit(offsets=to_tps(offsets), asynchronous=True)
                else:
                    consumer.commit(offsets=to_tps(offsets), asynchronous=False)
            except KafkaException as exc:
                # The next owner re-reads from the last successful commit: redelivery, never loss.
                log.warning("commit on revoke failed: %s", exc)
        self._forget(keys)
        log.info("revoked %s", names(partitions))

    async def _revoke(self, partitions: list[TopicPartition]) -> None:
        """A revoke held on trio's thread (`HeldRevokes`): the listener's wait, the final commit."""
        keys = [(tp.topic, tp.partition) for tp in partitions]
        try:
            offsets = await self._listener.on_revoked(keys)
            try:
                await self.commit(offsets)
            except CommitFailed as exc:
                log.warning("commit on revoke failed: %s", exc)
        finally:
            self._forget(keys)
            log.info("revoked %s", names(partitions))

    def _forget(self, keys: Sequence[tuple[str, int]]) -> None:
        for key in keys:
            self.assigned.discard(key)
            self._assignment_of.pop(key, None)
            self.paused.discard(key)

    def _cb_lost(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        keys = [(tp.topic, tp.partition) for tp in partitions]
        self._listen(self._listener.on_lost, keys)
        self._forget(keys)
        log.warning("lost %s (no commit possible)", names(partitions))

    def _listen(self, fn: Callable[[Any], Coroutine[Any, Any, None]], arg: Any) -> None:
        """A listener's assignment hook: into trio from the poll thread or a worker; on trio's
        own thread (the wake-up path) run at once: `on_assigned` and `on_lost` never wait."""
        if not self._on_trio_thread():
            self._to_trio(fn, arg)
            return
        self._rebalanced = True
        coro = fn(arg)
        try:
            coro.send(None)
        except StopIteration:
            return
        coro.close()
        raise RuntimeError(f"{fn.__name__} waited inside a rebalance on trio's thread")

    def _to_trio(self, fn: Any, arg: Any) -> Any:
        if self._closed and self._token is None:
            return None
        try:
            return trio.from_thread.run(self._in_order, fn, arg, trio_token=self._token)
        except trio.RunFinishedError:
            return None  # a close() abandoned at shutdown, finishing after trio did

    # -- the poll loop ---------------------------------------------------------------------------

    async def run(self) -> None:
        """Take records until `stop_polling()`; hands every batch to the listener, in order.

        Through the poll thread, or (`source.intake: signal`) the consumer queue's signal on trio's
        thread where `queue_signal` allows it, else the poll thread (said once, with the reason)."""
        consumer = self.consumer
        try:
            if not self._want_signal:
                self.intake = "poll-thread"
                await self._poll_loop(consumer)
                return
            signal: QueueSignal | str = (
                queue_signal(consumer, str(self._props["client.id"]))
                if self._incremental
                else "an eager rebalance protocol's revoke cannot be held open on trio's thread"
            )
            if isinstance(signal, str):
                if self.intake is None:
                    log.info("consumer records through a poll thread: %s", signal)
                self.intake = "poll-thread"
                await self._poll_loop(consumer)
            else:
                self.intake = "queue-signal"
                await self._signal_loop(consumer, signal)
        finally:
            self._stopped.set()

    async def _signal_loop(self, consumer: Consumer, signal: QueueSignal) -> None:
        """Trio's thread takes the records: wait for the queue's signal, drain the queue, hand what
        came to the listener, in this task. librdkafka signals only when the queue goes from empty
        to not empty, so the loop waits only after a `consume` that left it empty. Commits are
        asynchronous (results come through the queue); pause and resume do not block."""
        self._signal = signal
        self._trio_thread = threading.get_ident()
        self._thread_exiting = False
        try:
            async with self._held.open():
                await self._take_signalled(consumer, signal)
        finally:
            self._signal_wait = None
            with self._commit_waiters.lock:
                self._thread_exiting = True
            self._trio_thread = None
            self._signal = None
            signal.close()

    async def _take_signalled(self, consumer: Consumer, signal: QueueSignal) -> None:
        while not self._may_exit():
            now = time.monotonic()
            if now >= self._next_lag_refresh:
                self._lag.refresh(consumer, list(self.assigned))
                self._next_lag_refresh = now + 1.0
            signal.clear()
            self._rebalanced = False
            messages = consumer.consume(self._batch_size, 0)
            if messages:
                self._broker_usable()
                good = self._good_messages(messages)
                if self._rebalanced or self._held.keys:
                    # A revoke served inside this consume came before these reached us, or
                    # one is held (the next owner reads its partitions from its commit).
                    held = self._held.keys
                    good = [
                        m
                        for m in good
                        if (k := (m.topic(), m.partition())) in self.assigned and k not in held
                    ]
                if good:
                    self._listener.on_messages(good)
                    self._listener.messages_taken()
            if len(messages) >= self._batch_size:
                await trio.lowlevel.checkpoint()
                continue
            with trio.CancelScope(
                deadline=trio.current_time() + max(0.0, self._next_lag_refresh - now)
            ) as self._signal_wait:
                try:
                    await trio.lowlevel.wait_readable(signal.fd)
                except trio.ClosedResourceError:
                    return  # close() came first (a stop that did not wait for this loop)

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    async def _poll_loop(self, consumer: Consumer) -> None:
        """Run the poll thread and give its batches to the listener, in order, until it ends."""
        token = self._token
        assert token is not None
        handed = self._handed
        handed.start()
        self._thread_exiting = False
        self._poll_thread_active = True
        thread = threading.Thread(
            target=self._poll_thread, args=(consumer, token), name="sidecar-poll", daemon=True
        )
        thread.start()
        try:
            await handed.ended.wait()
            if handed.error is not None:
                raise handed.error
            end = handed.end
            if end is not None and end.error is not None:
                raise end.error
        finally:
            handed.stop()
            # Shielded: a cancelled poll loop still waits for its thread, which notices within one
            # poll timeout (or after a rebalance callback it is in), so that nothing else uses the
            # handle while it polls.
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(thread.join)
                self._poll_thread_active = False
                # Whatever is still queued runs in a worker thread, so no caller waits forever.
                if self._commands:
                    await trio.to_thread.run_sync(self._run_commands, consumer)

    async def _in_order(self, fn: Callable[[Any], Awaitable[Any]], arg: Any) -> Any:
        """A rebalance callback, after the batches the thread handed over before it (their
        wake-up was queued first, so they are taken already; taking again is for certain)."""
        self._handed.take()
        return await fn(arg)

    def _poll_thread(self, consumer: Consumer, token: trio.lowlevel.TrioToken) -> None:
        """The poll thread: poll, hand batches over to trio without waiting for them, end.

        A hand-over is an append and, unless one is queued already, one wake-up; the thread does not
        wait for trio to take the batch unless what it handed over is more than
        `HANDED_OVER_MAX_BYTES` (backpressure: librdkafka keeps the rest). Rebalance
        callbacks, inside poll(), go through `_in_order`, so the listener sees them in order with
        the batches. After `stop_polling()` the thread goes on serving callbacks until the commits
        issued so far have their results (only a poll delivers them).
        """
        end = PollEnd(None)
        handed = self._handed
        try:
            while not handed.stopping and not self._may_exit():
                handed.wait_room(self._poll_timeout_s)
                if handed.stopping:
                    break
                messages = self._poll_step(consumer)
                if not messages:
                    continue
                self._broker_usable()
                good = self._good_messages(messages)
                if good:
                    handed.put(token, good, values_bytes(good))
        # Not handled here: trio's poll loop raises it, as it would from a to_thread call.
        except BaseException as exc:
            end = PollEnd(exc)
        with self._commit_waiters.lock:
            self._thread_exiting = True
        handed.put(token, end, 0)

    def _may_exit(self) -> bool:
        """After `stop_polling()`: the intake ends once no commit waits for its result (only a
        poll serves the callback). Decided under the waiters' lock, so a commit issued from then on
        sees `_thread_exiting` and commits synchronously (else a final commit could time out)."""
        if not self._stop_polling:
            return False
        with self._commit_waiters.lock:
            if self._commit_waiters.any_locked():
                return False
            self._thread_exiting = True
            return True

    def _good_messages(self, messages: list[Message]) -> list[Message]:
        """The records of a batch; errors logged, a fatal one raised (`SourceError`)."""
        return records_of(messages, self._fatal, log, "consumer")

    def _fatal(self, err: KafkaError) -> SourceError | None:
        if not err.fatal():
            return None
        self.fatal_error = str(err)
        return SourceError(f"fatal consumer error: {err}")

    def _poll_step(self, consumer: Consumer) -> list[Message]:
        """The poll thread's work until there is something for trio: records, a stop, or the
        results of queued consumer calls. Every call on the handle happens on this thread (a call
        from another would wait for consume() to let go); queued calls wait at most one poll
        timeout (100 ms), 1 ms while records wait on each commit (`mark_busy`). Commit results
        come through librdkafka's callback inside the poll. An idle sidecar costs a wake of this
        thread per poll timeout and nothing in trio's thread.
        """
        while True:
            self._run_commands(consumer)
            now = time.monotonic()
            if now >= self._next_lag_refresh:
                self._lag.refresh(consumer, list(self.assigned))
                self._next_lag_refresh = now + 1.0
            timeout = self._busy_poll_timeout_s if self._busy() else self._poll_timeout_s
            # poll(t) returns with the first record (consume(n, t) would wait the whole timeout
            # unless n records arrive): wait for one, then take what else is there.
            first = consumer.poll(timeout)
            if first is not None:
                return [first, *consumer.consume(self._batch_size - 1, 0)]
            if self._stop_polling or self._handed.stopping:
                return []

    def _busy(self) -> bool:
        # Commit results need no short timeout: their callback is served inside a blocking poll.
        return bool(self._commands) or time.monotonic() < self._busy_until

    def mark_busy(self, seconds: float = 1.0) -> None:
        """Records wait on each commit (isolation, write-ahead): keep poll timeouts short so
        queued calls run promptly."""
        self._busy_until = max(self._busy_until, time.monotonic() + seconds)

    def _run_commands(self, consumer: Consumer) -> None:
        while self._commands:
            fn, done = self._commands.popleft()
            try:
                result: Any = fn(consumer)
                error: BaseException | None = None
            except _CONSUMER_CALL_ERRORS as exc:
                result, error = None, exc
            if done is not None:
                done(result, error)

    async def _call(self, fn: Callable[[Consumer], Any]) -> Any:
        """Run `fn(consumer)` on the poll thread and return its result (or raise its error); on
        the wake-up path, at once (only calls that do not block come here then)."""
        if self._signal is not None:
            return fn(self.consumer)
        if not self._poll_thread_active:
            async with self._direct_lock:
                return await trio.to_thread.run_sync(fn, self.consumer)
        finished = trio.Event()
        outcome: list[Any] = []
        token = self._token
        assert token is not None

        def done(result: Any, error: BaseException | None) -> None:
            def wake() -> None:
                outcome.append((result, error))
                finished.set()

            token.run_sync_soon(wake)

        self._commands.append((fn, done))
        await finished.wait()
        result, error = outcome[0]
        if error is not None:
            raise error
        return result

    def _post(self, fn: Callable[[Consumer], Any]) -> None:
        """Queue `fn(consumer)` for the poll thread without waiting (pause/resume)."""
        if self._poll_thread_active:
            self._commands.append((fn, None))
        elif self._consumer is not None and not self._closed:
            fn(self._consumer)

    def stop_polling(self) -> None:
        self._stop_polling = True
        if self._signal_wait is not None:
            self._signal_wait.cancel()

    async def commit(self, offsets: Sequence[OffsetToCommit]) -> None:
        """Commit offsets with their metadata; returns once the broker has them.

        Raises `CommitTimeout` after `commit_timeout_s` (the commit may still land later), or
        `CommitFailed` with librdkafka's error (translated here, at the boundary). The poll thread never waits for a commit: it issues it asynchronously and
        the result comes back through the offset-commit callback, so a commit stuck on a lost group
        coordinator cannot hold consumption, rebalances or the other consumer calls behind it.
        """
        if not offsets:
            return
        # Where the offsets were made, read before anything else runs (`_commit_assigned`).
        held = [self._assignment_of.get((o.topic, o.partition)) for o in offsets]
        try:
            await self._commit(to_tps(offsets), held)
        except _CONSUMER_CALL_ERRORS as exc:
            raise CommitFailed(str(exc)) from exc

    async def _commit(self, tps: list[TopicPartition], held: list[int | None]) -> None:
        async with self._commit_lock:
            active = self._poll_thread_active or self._signal is not None
            if active and await self._commit_async(tps, held):
                return
            # No poll loop serves the callbacks (before `run()`, after it stopped, or its thread
            # has served its last poll): a synchronous commit in a worker thread, abandoned if it
            # outlives the timeout.
            with trio.move_on_after(self.commit_timeout_s) as scope:
                async with self._direct_lock:
                    await trio.to_thread.run_sync(
                        self._commit_sync, self.consumer, tps, abandon_on_cancel=True
                    )
            if scope.cancelled_caught:
                raise CommitTimeout(f"commit took longer than {self.commit_timeout_s:g}s")

    async def _commit_async(self, tps: list[TopicPartition], held: list[int | None]) -> bool:
        """Commit through the poll thread, the result from the callback; False (nothing done) when
        the thread has served its last poll."""
        key = commit_key(tps)
        finished = trio.Event()
        outcome: list[BaseException | None] = []
        token = self._token
        assert token is not None

        def done(error: BaseException | None) -> None:
            def wake() -> None:
                outcome.append(error)
                finished.set()

            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(wake)

        with self._commit_waiters.lock:
            if self._thread_exiting:
                return False
            self._commit_waiters.add_locked(key, done)
        try:
            await self._call(lambda c: self._commit_assigned(c, tps, held, done))
            with trio.move_on_after(self.commit_timeout_s):
                await finished.wait()
        except BaseException:
            self._commit_waiters.forget(done)
            raise
        if not outcome:
            self._commit_waiters.forget(done)
            raise CommitTimeout(f"commit took longer than {self.commit_timeout_s:g}s")
        if outcome[0] is not None:
            raise outcome[0]
        self._broker_usable()
        return True

    def _commit_assigned(
        self, consumer: Consumer, tps: list[TopicPartition], held: list[int | None], done: Done
    ) -> None:
        """Commit what of `tps` is still held from the assignment it was made in (on the thread
        that polls, where assignments change). Queued before a revoke and issued after it, a commit
        would land after the revoke's final one and take the next owner back to an older state
        (what was answered in between delivered again): that part is left out."""
        mine = self._assignment_of
        owned = [
            tp
            for tp, n in zip(tps, held, strict=True)
            if mine.get((tp.topic, tp.partition), -1) == n
        ]
        if len(owned) < len(tps):
            if not owned:
                self._commit_waiters.forget(done)
                done(None)
                return
            self._commit_waiters.rekey(commit_key(owned), done)
        consumer.commit(offsets=owned, asynchronous=True)

    def _commit_sync(self, consumer: Consumer, tps: list[TopicPartition]) -> None:
        try:
            result = consumer.commit(offsets=tps, asynchronous=False)
        except KafkaException as exc:
            if kafka_error(exc).code() == KafkaError._NO_OFFSET:
                return
            raise
        for tp in result or []:
            if tp.error is not None:
                raise KafkaException(tp.error)
        self._broker_usable()

    def group_metadata(self) -> Any:
        """The group metadata (generation, member id) for transactional offset commits.

        Cached by the poll thread at each assignment change: fetching it through the command queue
        could wait on a revoke callback that itself waits for a DLQ transaction.
        """
        return self._group_metadata

    def pause(self, keys: Sequence[tuple[str, int]]) -> None:
        keys = [k for k in keys if k in self.assigned and k not in self.paused]
        if keys:
            tps = [TopicPartition(t, p) for t, p in keys]
            self._post(lambda c: c.pause(tps))
            self.paused.update(keys)

    def resume(self, keys: Sequence[tuple[str, int]]) -> None:
        keys = [k for k in keys if k in self.paused and k not in self._held.keys]
        if keys:
            tps = [TopicPartition(t, p) for t, p in keys]
            # With every partition paused, librdkafka's fetcher may be asleep: wake it.
            wake = self.paused >= self.assigned
            self._post(lambda c: resume_fetching(c, tps, wake=wake))
            self.paused.difference_update(keys)

    async def close(self) -> None:
        """Leave the group: runs the revoke callbacks (final commits) then closes the handle."""
        if self._consumer is None or self._closed:
            return
        consumer = self._consumer
        if self._signal is not None:
            # Before the handle goes: the loop, if it still waits, ends at once.
            trio.lowlevel.notify_closing(self._signal.fd)
            self._signal.close()
        # close() runs the revoke callback's final commit and leaves the group. With the group
        # coordinator unreachable librdkafka retries that without a time limit (librdkafka #3740):
        # give up after `close_timeout_s` rather than hang the shutdown. Every commit so far
        # stands, and the group drops this member when its session times out.
        with trio.move_on_after(self.close_timeout_s) as scope:
            await trio.to_thread.run_sync(consumer.close, abandon_on_cancel=True)
        self._closed = True
        if scope.cancelled_caught:
            log.warning(
                "closing the consumer took longer than %gs; leaving without it",
                self.close_timeout_s,
            )

    def lag(self) -> dict[tuple[str, int], int]:
        """High watermark minus position (not fetched yet) per assigned partition, read each second."""
        return self._lag.lag(self.assigned)

    def high_watermarks(self) -> dict[tuple[str, int], int]:
        """The high watermark per assigned partition, read with `lag` (librdkafka's cached value)."""
        return self._lag.high_watermarks(self.assigned)


__all__ = [
    "OFFSET_INVALID",
    "AssignedPartition",
    "CommitTimeout",
    "KafkaSource",
    "OffsetToCommit",
    "SourceError",
    "SourceListener",
    "broker_error_reason",
    "consumer_properties",
]
