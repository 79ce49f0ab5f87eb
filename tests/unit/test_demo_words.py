"""The demo's progress says "dead-lettered" for every record on its way to the DLQ, whatever the
reason: "archived" is the final table's word for the records at the delivery limit only."""

from __future__ import annotations

import io

from rich.console import Console

from sidecar.ops.demo.children import Snapshot
from sidecar.ops.demo.display import Display


def test_the_progress_line_counts_dead_letters_as_dead_lettered_not_archived() -> None:
    out = io.StringIO()
    snap = Snapshot(
        at=1.0,
        delivered={"accept": 90, "reject": 3, "release": 12},
        attempts=105,
        archived={"rejected": 3, "delivery_count_exceeded": 2},
        dlq_written=5,
        dlq_failed=0,
        in_flight=0,
        app_reachable=True,
        failure=None,
    )
    with Display(Console(file=out, width=300), total=95) as display:
        display.update(snap, produced=95, elapsed_s=2.0)
    line = out.getvalue()
    assert "dead-lettered 5  DLQ records 5" in line, line
    assert "archived" not in line
