"""Who waits for an asynchronous commit's result: the callers, by what each commits.

Owns `CommitWaiters`: a caller is registered under its commit's identity (`commit_key`) before the
commit is issued, and librdkafka's offset-commit callback (`on_commit`, on the thread that polls)
hands the result to the first caller waiting for that identity; a caller that gives up is forgotten.
Its `lock` also orders the source's last poll against new commits (`KafkaSource`).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from sidecar.kafka.source_port import CommitKey, commit_key

# A caller's end of the wait: called once, with None (committed) or the error.
Done = Callable[[BaseException | None], None]


class CommitWaiters:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._by_key: dict[CommitKey, deque[Done]] = {}

    def any_locked(self) -> bool:
        """Whether any caller waits (the caller holds `lock`)."""
        return bool(self._by_key)

    def add_locked(self, key: CommitKey, done: Done) -> None:
        """Register `done` for the commit of `key` (the caller holds `lock`)."""
        self._by_key.setdefault(key, deque()).append(done)

    def forget(self, done: Done) -> None:
        """The caller gave up (or its commit was not issued): `done` waits no more."""
        with self.lock:
            self._forget_locked(done)

    def rekey(self, new: CommitKey, done: Done) -> None:
        """`done` waits for the commit of `new` instead (a commit cut down before it was issued)."""
        with self.lock:
            self._forget_locked(done)
            self.add_locked(new, done)

    def _forget_locked(self, done: Done) -> None:
        for key, waiters in self._by_key.items():
            if done in waiters:
                waiters.remove(done)
                if not waiters:
                    del self._by_key[key]
                return

    def on_commit(self, err: KafkaError | None, partitions: list[TopicPartition]) -> None:
        """librdkafka's offset-commit callback: hand the result to its caller."""
        key = commit_key(partitions)
        with self.lock:
            waiters = self._by_key.get(key)
            if not waiters:
                return  # a commit whose caller gave up waiting
            done = waiters.popleft()
            if not waiters:
                del self._by_key[key]
        error: BaseException | None = None
        if err is not None and err.code() != KafkaError._NO_OFFSET:
            error = KafkaException(err)
        else:
            bad = next((tp.error for tp in partitions if tp.error is not None), None)
            if bad is not None:
                error = KafkaException(bad)
        done(error)


__all__ = ["CommitWaiters", "Done"]
