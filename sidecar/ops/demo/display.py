"""What the demo shows: live progress (a rich display on a terminal, a plain line per second otherwise)
and, at the end, a varied pick of the DLQ records it wrote (read with the DLQ tools' reader, `sidecar.kafka.tools.ReadConsumer`).

rich is imported where it is used: the CLI imports the demo to build its parser, and
`dlq-sidecar run` should not pay for rich's import.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING

from sidecar.kafka.tools import KafkaCallError, ReadConsumer, ReadRecord
from sidecar.ops.demo.children import Snapshot
from sidecar.ops.dlq.reader import client_properties, dlq_partitions

if TYPE_CHECKING:
    from rich.console import Console, Group
    from rich.live import Live


# A DLQ record as shown: (partition, offset, headers decoded as UTF-8).
DlqRecord = tuple[int, int, list[tuple[str, str]]]


# --------------------------------------------------------------------------- display


def _fmt_counts(d: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(d.items())) or "0"


class Display:
    """Live progress on a terminal; one plain line per second otherwise (CI, pipes)."""

    def __init__(self, console: Console, total: int) -> None:
        self.console = console
        self.total = total
        self.live: Live | None = None
        self.last_line_at = 0.0
        self.prev: Snapshot | None = None
        self.rate = 0.0

    def __enter__(self) -> Display:
        if self.console.is_terminal:
            from rich.live import Live

            self.live = Live(console=self.console, refresh_per_second=8, transient=False)
            self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.__exit__(None, None, None)

    def update(self, snap: Snapshot, produced: int, elapsed_s: float) -> None:
        if self.prev is not None and snap.at > self.prev.at:
            instant = (snap.attempts - self.prev.attempts) / (snap.at - self.prev.at)
            self.rate = instant if self.rate == 0 else 0.6 * self.rate + 0.4 * instant
        self.prev = snap
        if self.live is not None:
            self.live.update(self._render(snap, produced, elapsed_s))
            return
        if elapsed_s - self.last_line_at >= 1.0 or snap.done >= self.total:
            self.last_line_at = elapsed_s
            self.console.print(
                f"[{elapsed_s:5.1f}s] produced {produced}/{self.total}  done {snap.done}/{self.total}"
                f"  delivered {snap.attempts}  accepted {snap.accepted}"
                f"  released {snap.delivered.get('release', 0)}"
                f"  rejected {snap.delivered.get('reject', 0)}"
                f"  dead-lettered {snap.archived_total}  DLQ records {snap.dlq_written}  in-flight {snap.in_flight}  {self.rate:.0f} deliveries/s",
                markup=False,
                highlight=False,
                soft_wrap=True,
            )

    def _render(self, snap: Snapshot, produced: int, elapsed_s: float) -> Group:
        from rich.console import Group
        from rich.progress_bar import ProgressBar
        from rich.table import Table
        from rich.text import Text

        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold")
        table.add_column(justify="right")
        table.add_row("produced", f"{produced} / {self.total}")
        table.add_row("delivered to the app", str(snap.attempts))
        table.add_row("accepted", f"[green]{snap.accepted}[/]")
        table.add_row(
            "released (redelivered later)", f"[yellow]{snap.delivered.get('release', 0)}[/]"
        )
        table.add_row("rejected", f"[red]{snap.delivered.get('reject', 0)}[/]")
        # Every record on its way to the DLQ, by reason (rejected, at the delivery limit): the
        # final table's "archived at the limit" is one of the two.
        table.add_row("dead-lettered (by reason)", f"[red]{_fmt_counts(snap.archived)}[/]")
        table.add_row("DLQ records written", f"[magenta]{snap.dlq_written}[/]")
        table.add_row("in flight", str(snap.in_flight))
        table.add_row("throughput", f"{self.rate:.0f} deliveries/s")
        if not snap.app_reachable:
            table.add_row("app", "[red]not reachable[/]")
        bar = Table.grid(padding=(0, 1))
        bar.add_row(
            ProgressBar(total=self.total, completed=snap.done, width=40),
            Text(f"{snap.done}/{self.total} done  {elapsed_s:.1f}s"),
        )
        return Group(bar, table)


def read_dlq(bootstrap: str, topic: str, n: int, timeout_s: float = 15) -> list[DlqRecord]:
    """The first `n` DLQ records (by partition, offset) with their headers decoded as UTF-8.

    Read with the DLQ tools' reader (`sidecar.kafka.tools.ReadConsumer`): committed records only, up to the
    ends seen at start; `timeout_s` bounds a broker that stops answering.
    """
    consumer = ReadConsumer(
        client_properties(bootstrap, {}),
        group=f"dlq-sidecar-demo-reader-{uuid.uuid4().hex[:8]}",
    )
    out: list[DlqRecord] = []
    try:
        partitions = dlq_partitions(consumer, topic, timeout_s)
        ends = consumer.watermarks(topic, partitions, timeout_s)
        batches = consumer.read_range(
            topic, ends, stop=lambda: len(out) >= n, stall_timeout_s=timeout_s
        )
        for record in _until_stalled(batches):
            headers = [
                (name, (value or b"").decode(errors="replace")) for name, value in record.headers
            ]
            out.append((record.partition, record.offset, headers))
    finally:
        consumer.close()
    return sorted(out)[:n]


def _until_stalled(batches: Iterator[list[ReadRecord]]) -> Iterator[ReadRecord]:
    """The records of `batches`; what arrived before the broker stalled, as the demo shows what it can."""
    try:
        for batch in batches:
            yield from batch
    except KafkaCallError:
        return


def pick_varied(records: list[DlqRecord], n: int) -> list[DlqRecord]:
    """The first record of each kind of failure (cause and error class), in offset order, then the
    next ones by offset: the kinds come first, as the demo's listing says."""
    seen: set[tuple[str, str]] = set()
    first_of_kind: list[DlqRecord] = []
    for rec in records:
        h = dict(rec[2])
        kind = (h.get("__dlq.errors.message", ""), h.get("__dlq.errors.exception.class.name", ""))
        if kind not in seen:
            seen.add(kind)
            first_of_kind.append(rec)
    chosen = sorted(first_of_kind)[:n]
    return chosen + sorted(r for r in records if r not in chosen)[: n - len(chosen)]


__all__ = ["Display", "DlqRecord", "pick_varied", "read_dlq"]
