"""`ordering` (docs/guarantees.md): which records of a partition may be in flight together.

One enum, used by the configuration and the ledger alike, so there is one copy; it lives in its
own module so that `sidecar.config` does not import the ledger for it.

Imports the standard library only.
"""

from __future__ import annotations

import enum

__all__ = ["Ordering"]


class Ordering(enum.StrEnum):
    """`ordering` (docs/guarantees.md); the configuration uses this enum too, so there is one copy."""

    KEY = "key"  # one record in flight per key (records without a key are not ordered)
    PARTITION = "partition"  # one record in flight per partition
    NONE = "none"  # no order: any record may go
