"""Headers-only DLQ records as pointers into their source partitions, and which now point at nothing.

Owns `SourcePointers`: the source offsets of the headers-only DLQ records this process wrote (the
record holds no copy; its payload is read back from the source topic), per source partition, and how
many of them retention or delete-records has since deleted (told by the partitions' log start
offsets, which only move forward). Pure: the caller reads the log starts and passes them. Bounded.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, insort

PartitionKey = tuple[str, int]

# Offsets kept in all (8 bytes each); past it a pointer is not tracked (`untracked`).
MAX_POINTERS = 1_000_000


class SourcePointers:
    """Per source partition, the sorted source offsets of headers-only DLQ records not yet deleted.

    `written` adds one; `log_starts` takes each partition's log start offset and moves every offset
    below it to `gone` (per source topic, a counter: an offset below the log start never comes
    back). `partitions` names the partitions worth asking about (those with offsets left), so a
    process whose DLQ records all hold copies asks nothing.
    """

    def __init__(self, max_pointers: int = MAX_POINTERS) -> None:
        if max_pointers < 0:
            raise ValueError("max_pointers must be 0 or more")
        self.max_pointers = max_pointers
        self._offsets: dict[PartitionKey, array[int]] = {}
        self._size = 0
        self.gone: dict[str, int] = {}  # source topic -> pointers whose offset was deleted
        self.untracked = 0  # pointers not kept: the bound was reached

    @property
    def watched(self) -> int:
        """Pointers whose source offset was still there at the last look."""
        return self._size

    def written(self, topic: str, partition: int, offset: int) -> bool:
        """A headers-only DLQ record for `topic[partition]@offset` was written; False when the
        bound is reached and it is not tracked."""
        if self._size >= self.max_pointers:
            self.untracked += 1
            return False
        offsets = self._offsets.get((topic, partition))
        if offsets is None:
            offsets = self._offsets[(topic, partition)] = array("q")
        if not offsets or offsets[-1] <= offset:
            offsets.append(offset)  # the usual case: DLQ records come roughly in offset order
        else:
            insort(offsets, offset)
        self._size += 1
        return True

    def partitions(self) -> list[PartitionKey]:
        """The partitions that have pointers left, sorted."""
        return sorted(self._offsets)

    def log_starts(self, starts: dict[PartitionKey, int]) -> dict[str, int]:
        """Take the log start offsets just read; returns the pointers newly gone, per topic."""
        newly: dict[str, int] = {}
        for key, start in starts.items():
            offsets = self._offsets.get(key)
            if offsets is None:
                continue
            n = bisect_left(offsets, start)
            if n == 0:
                continue
            del offsets[:n]
            self._size -= n
            if not offsets:
                del self._offsets[key]
            newly[key[0]] = newly.get(key[0], 0) + n
            self.gone[key[0]] = self.gone.get(key[0], 0) + n
        return newly


__all__ = ["MAX_POINTERS", "PartitionKey", "SourcePointers"]
