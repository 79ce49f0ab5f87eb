"""The errors and exit codes of `dlq-sidecar dlq inspect` and `dlq replay`.

Owns `DlqToolError` and `UsageError` (exit 2; drawn in `sidecar.core.errors.SidecarError`'s tree). A
broker that cannot be reached or refuses a call is reported as `sidecar.kafka.errors.KafkaCallError`
(exit 1).

Imports: the standard library and `sidecar.core.errors` (the root) only.
"""

from __future__ import annotations

from sidecar.core.errors import SidecarError

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2


class DlqToolError(SidecarError):
    """Root of the errors `dlq inspect` and `dlq replay` report."""


class UsageError(DlqToolError):
    """The arguments cannot work (bad filter, unknown topic, a name used with other filters): exit 2."""
