"""One root for the sidecar's errors, as drawn in sidecar/core/errors.py."""

from __future__ import annotations

import pytest

from sidecar.config import ConfigError
from sidecar.core.errors import CommitFailed, DlqError, KafkaClientError, SidecarError
from sidecar.core.ledger import ExpiredAttempt, LedgerError, UnknownAttempt
from sidecar.core.wire import WireError
from sidecar.engines.share_group import ShareGroupLimitUnsafe, ShareGroupsUnavailable
from sidecar.http.appclient import AppClientError, AppNotReachable, AppRequestFailed
from sidecar.kafka.dlq import DlqFatalError, DlqStartupError, DlqTxnAbortable, DlqTxnStuck
from sidecar.kafka.source import SourceError


@pytest.mark.parametrize(
    ("error", "parent"),
    [
        (ConfigError, SidecarError),
        (WireError, SidecarError),
        (WireError, ValueError),  # still a ValueError for callers that catch that
        (LedgerError, SidecarError),
        (UnknownAttempt, LedgerError),
        (ExpiredAttempt, LedgerError),
        (AppClientError, SidecarError),
        (AppNotReachable, AppClientError),
        (AppRequestFailed, AppClientError),
        (KafkaClientError, SidecarError),
        (SourceError, KafkaClientError),
        (ShareGroupsUnavailable, SourceError),
        (ShareGroupLimitUnsafe, SourceError),
        (CommitFailed, KafkaClientError),
        (DlqError, SidecarError),
        (DlqStartupError, DlqError),
        (DlqFatalError, DlqError),
        (DlqTxnAbortable, DlqError),
        (DlqTxnStuck, DlqTxnAbortable),
    ],
)
def test_the_hierarchy_is_as_drawn(error: type[Exception], parent: type[Exception]) -> None:
    assert issubclass(error, parent)


def test_the_drawing_names_every_class() -> None:
    import sidecar.core.errors

    drawing = sidecar.core.errors.__doc__ or ""
    for name in [
        "ConfigError",
        "WireError",
        "LedgerError",
        "AppNotReachable",
        "AppRequestFailed",
        "SourceError",
        "ShareGroupsUnavailable",
        "ShareGroupLimitUnsafe",
        "CommitFailed",
        "DlqStartupError",
        "DlqFatalError",
        "DlqTxnAbortable",
        "DlqTxnStuck",
    ]:
        assert name in drawing, name
