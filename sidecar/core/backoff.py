"""Redelivery backoff policy: an immutable value, like urllib3's ``Retry``.

This module owns the arithmetic of "how long does a released record wait before its next attempt".
It is pure: no clock, no random source (the caller passes ``rand`` in [0, 1) so results are
reproducible), no I/O.  It must not import trio, confluent_kafka or anything that performs I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["RETRY_AFTER_MAX_MS", "RetryPolicy", "jitter_rand"]

#: An application's ``retry_after_ms`` is honoured up to this bound (one hour): a typo such as
#: ``retry_after_ms: 86400000000`` must not park a record (and, in key order, its whole key) for years.
RETRY_AFTER_MAX_MS = 3_600_000


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Exponential backoff with subtractive jitter.

    The n-th redelivery (``delivery_count`` attempts already made, n >= 1) waits
    ``min(initial_ms * multiplier ** (n - 1), max_ms)``, reduced by up to ``jitter`` of itself:
    ``delay * (1 - jitter * rand)``.  Jitter only ever shortens the delay, so ``max_ms`` is a true
    upper bound, and records released together do not all come back in the same millisecond.
    """

    initial_ms: int = 1000
    max_ms: int = 60_000
    multiplier: float = 2.0
    jitter: float = 0.2
    retry_after_max_ms: int = RETRY_AFTER_MAX_MS

    def __post_init__(self) -> None:
        if self.initial_ms < 0:
            raise ValueError(f"initial_ms must be >= 0, got {self.initial_ms}")
        if self.max_ms < self.initial_ms:
            raise ValueError(f"max_ms must be >= initial_ms ({self.initial_ms}), got {self.max_ms}")
        if not (math.isfinite(self.multiplier) and self.multiplier >= 1.0):
            raise ValueError(f"multiplier must be a finite number >= 1.0, got {self.multiplier}")
        if not (math.isfinite(self.jitter) and 0.0 <= self.jitter <= 1.0):
            raise ValueError(f"jitter must be a fraction in [0.0, 1.0], got {self.jitter}")
        if self.retry_after_max_ms < 0:
            raise ValueError(f"retry_after_max_ms must be >= 0, got {self.retry_after_max_ms}")

    def base_delay_ms(self, delivery_count: int) -> int:
        """The delay before jitter after ``delivery_count`` attempts (>= 1)."""
        if delivery_count < 1:
            raise ValueError(f"delivery_count must be >= 1, got {delivery_count}")
        if self.initial_ms == 0:
            return 0
        exponent = delivery_count - 1
        # Compare in log space: multiplier ** exponent overflows a float long before a
        # delivery count stops being plausible (2.0 ** 1100 raises OverflowError).
        if self.multiplier > 1.0 and exponent * math.log(self.multiplier) >= math.log(
            self.max_ms / self.initial_ms
        ):
            return self.max_ms
        return min(self.max_ms, int(self.initial_ms * self.multiplier**exponent))

    def delay_ms(self, delivery_count: int, rand: float, retry_after_ms: int | None = None) -> int:
        """Milliseconds to wait before the next attempt.

        ``rand`` must be in [0, 1).  An application's ``retry_after_ms`` (from its answer or a
        ``Retry-After`` header) replaces the computed delay, clamped to [0, retry_after_max_ms].
        """
        if not 0.0 <= rand < 1.0:
            raise ValueError(f"rand must be in [0, 1), got {rand}")
        if retry_after_ms is not None:
            return min(max(retry_after_ms, 0), self.retry_after_max_ms)
        base = self.base_delay_ms(delivery_count)
        return int(base * (1.0 - self.jitter * rand))


_MASK64 = (1 << 64) - 1


def jitter_rand(offset: int, delivery_count: int) -> float:
    """A deterministic ``rand`` in [0, 1) per (offset, attempt): the splitmix64 finaliser.

    The ledger has no random source (it must be reproducible); mixing the offset spreads the
    retries of records released together, which is all jitter is for.
    """
    x = (offset * 0x9E3779B97F4A7C15 + delivery_count) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    x ^= x >> 31
    return (x >> 11) / float(1 << 53)
