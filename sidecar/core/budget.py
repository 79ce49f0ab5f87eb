"""The byte budget for buffered records (`max.buffered.bytes`): how it is split, and what a record costs.

Owns `ByteBudget` (the split between librdkafka's prefetch and the sidecar's buffer, drawn in its
docstring), :func:`split_budget` and :func:`record_bytes`.

Pure: imports only the standard library and :mod:`sidecar.core.record`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from sidecar.core.errors import SidecarError
from sidecar.core.record import SourceRecord

__all__ = [
    "BASE_PROCESS_BYTES",
    "DEFAULT_BUFFERED_BYTES",
    "MIN_BUFFERED_BYTES",
    "PARTITION_OVERHEAD_BYTES",
    "RECORD_OVERHEAD_BYTES",
    "BudgetError",
    "ByteBudget",
    "memory_needed_bytes",
    "partitions_within",
    "record_bytes",
    "split_budget",
]

MiB = 1024 * 1024
#: The default budget: the Helm chart's memory limit is 256 Mi, and the interpreter with its
#: libraries takes about 45 MB before any record.
DEFAULT_BUFFERED_BYTES = 64 * MiB
#: The smallest budget accepted: below it one fetch (librdkafka keeps ``fetch.max.bytes`` at least
#: ``message.max.bytes``, 1,000,000 by default) would be more than its eighth.
MIN_BUFFERED_BYTES = 16 * MiB
#: The sidecar's own memory per record held beyond its bytes (record view, ledger entry, indexes).
RECORD_OVERHEAD_BYTES = 1400
#: What an assigned partition costs with nothing held (its ledger and state, librdkafka's partition
#: and fetch-session state), outside the budget: idle RSS grew 13-15 KiB per partition from 100 to
#: 1,000 partitions (the scale bench, docs/scaling.md); rounded up.
PARTITION_OVERHEAD_BYTES = 16 * 1024
#: The process with no partition and no record: idle RSS at 100 partitions, less their overhead.
BASE_PROCESS_BYTES = 55 * MiB


def memory_needed_bytes(max_buffered_bytes: int, partitions: int) -> int:
    """What a sidecar may take with ``partitions`` assigned and its budget full."""
    return BASE_PROCESS_BYTES + max_buffered_bytes + partitions * PARTITION_OVERHEAD_BYTES


def partitions_within(memory_limit_bytes: int, max_buffered_bytes: int) -> int:
    """How many assigned partitions a memory limit holds beside a full budget."""
    room = memory_limit_bytes - BASE_PROCESS_BYTES - max_buffered_bytes
    return max(0, room // PARTITION_OVERHEAD_BYTES)


PREFETCH_KEY = "queued.max.messages.kbytes"
FETCH_KEY = "fetch.max.bytes"
MESSAGES_KEY = "queued.min.messages"
_PREFETCH_DIVISOR = 4
_FETCH_DIVISOR = 8
# The buffer keeps at least this fraction of the budget, whatever the user sets under `kafka:`.
_MIN_BUFFER_DIVISOR = 4


class BudgetError(SidecarError, ValueError):
    """The budget cannot hold what the user's librdkafka settings ask for; ``key`` is to blame."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"{key}: {reason}")
        self.key = key
        self.reason = reason


@dataclass(frozen=True, slots=True)
class ByteBudget:
    """`max.buffered.bytes` split; build it with :func:`split_budget`.

    What the consumer-group engine holds in memory for records is two things: librdkafka's prefetch (its
    consumer queue plus the fetch response being read) and the sidecar's own buffer (records fetched and
    not done, in flight included, in the partition ledgers). One budget bounds both::

        max.buffered.bytes (default 64 MiB)
        ├── prefetch queue   queued.max.messages.kbytes = 1/4   librdkafka: one queue for the whole consumer
        ├── one fetch        fetch.max.bytes            = 1/8   a fetch response may overshoot the queue limit
        └── sidecar buffer   the rest (5/8)             split in equal shares among the assigned partitions

    librdkafka's ``queued.max.messages.kbytes`` applies to the high-level consumer's single queue, whatever
    the number of partitions, and "may be overshot by fetch.message.max.bytes": a fetch is issued while the
    queue is under the limit, and its response (at most ``fetch.max.bytes``, or one record batch larger than
    that) is queued whole. The queue also stops at ``queued.min.messages`` (100,000 by default, counted
    over the whole queue too), which binds first for small records, whose librdkafka bookkeeping outweighs
    their bytes: it is derived as one message per KiB of the queue's part (16,384 by default). Properties
    the user sets under ``kafka:`` are kept and their values counted.

    A partition is paused once its ledger holds its share (:meth:`ByteBudget.share_bytes`) and resumed once
    it holds half of it or less; intake never refuses a record already fetched (a record handed over by
    librdkafka and not kept would be skipped at the next resume), so a record larger than a share is taken,
    delivered, and the partition resumes when it is done. A partition can overshoot its share by what one
    consume batch brought for it.
    """

    total_bytes: int
    prefetch_bytes: int  # librdkafka's consumer queue
    fetch_bytes: int  # one fetch response on top of it
    #: The librdkafka properties to set: those derived from the budget that the user did not set.
    derived: Mapping[str, int] = field(default_factory=dict)

    @property
    def buffer_bytes(self) -> int:
        """What the partition ledgers may hold together."""
        return self.total_bytes - self.prefetch_bytes - self.fetch_bytes

    def share_bytes(self, partitions: int) -> int:
        """One partition's share of the buffer when ``partitions`` are assigned (at least 1 byte)."""
        return max(1, self.buffer_bytes // max(1, partitions))


def _user_int(kafka: Mapping[str, object], key: str) -> int | None:
    value = kafka.get(key)
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    text = str(value).strip()
    return int(text) if text.isdigit() else None  # anything else: librdkafka reports it


def split_budget(total_bytes: int, kafka: Mapping[str, object]) -> ByteBudget:
    """Split ``total_bytes`` given the user's ``kafka:`` properties; BudgetError if they leave the
    sidecar's buffer less than a quarter of it."""
    if total_bytes < MIN_BUFFERED_BYTES:
        raise BudgetError("max.buffered.bytes", f"must be at least {MIN_BUFFERED_BYTES}")
    derived: dict[str, int] = {}
    prefetch_kb = _user_int(kafka, PREFETCH_KEY)
    if prefetch_kb is None:
        prefetch_kb = total_bytes // _PREFETCH_DIVISOR // 1024
        derived[PREFETCH_KEY] = prefetch_kb
    if _user_int(kafka, MESSAGES_KEY) is None:
        derived[MESSAGES_KEY] = max(1, prefetch_kb)
    fetch = _user_int(kafka, FETCH_KEY)
    if fetch is None:
        fetch = total_bytes // _FETCH_DIVISOR
        derived[FETCH_KEY] = fetch
    budget = ByteBudget(total_bytes, prefetch_kb * 1024, fetch, derived)
    if budget.buffer_bytes < total_bytes // _MIN_BUFFER_DIVISOR:
        raise BudgetError(
            "max.buffered.bytes",
            f"{total_bytes} leaves less than a quarter for the sidecar's buffer after librdkafka's "
            f"prefetch (kafka.{PREFETCH_KEY} {prefetch_kb} KiB) and one fetch (kafka.{FETCH_KEY} "
            f"{fetch}); raise it, or lower those",
        )
    return budget


def record_bytes(record: SourceRecord) -> int:
    """What holding ``record`` costs against the budget: key, value and headers twice (the record,
    and its request while in flight), and the overhead.

    The key, value and headers count twice because the HTTP request the record goes out in is a copy
    of them (``sidecar.core.wire`` joins the header block and the body into one ``bytes``), held
    while the record is in flight, which is where a slow app keeps most large records.
    :data:`RECORD_OVERHEAD_BYTES` (the sidecar's own structures per record) dominates for small records.
    """
    size = 0
    if record.key is not None:
        size += len(record.key)
    if record.value is not None:
        size += len(record.value)
    for name, value in record.headers:
        size += len(name) + (len(value) if value is not None else 0)
    return RECORD_OVERHEAD_BYTES + 2 * size
