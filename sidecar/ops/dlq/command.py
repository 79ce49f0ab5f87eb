"""The `dlq-sidecar dlq inspect|replay` command layer: argparse, exit codes, progress output.

Owns the sub-commands' arguments (`add_dlq_parser`, which `sidecar.cli` mounts), turning them into
`Filters`/`ReplayOptions`, and `cmd_dlq`: 0 ok, 1 failures (broker, replay), 2 bad arguments, every
error one ``dlq-sidecar dlq: ...`` line. `python -m sidecar.ops.dlq.command` runs the same commands.

Imports the standard library, rich, `sidecar.kafka.errors` and the other `sidecar.ops.dlq.*` modules;
no confluent-kafka, never the engines, the ledger, the source, the daemon or the HTTP modules.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any, TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from sidecar.config import ConfigError, dlq_routes, load_config
from sidecar.core.errors import KafkaClientError
from sidecar.ops.dlq.entries import DlqEntry
from sidecar.ops.dlq.errors import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, DlqToolError, UsageError
from sidecar.ops.dlq.filters import Filters, filters_from_values
from sidecar.ops.dlq.formats import FORMATS
from sidecar.ops.dlq.inspect import inspect_dlq
from sidecar.ops.dlq.originals import Originals
from sidecar.ops.dlq.payloads import PayloadReader, parse_field_filter, payloads_for
from sidecar.ops.dlq.reader import client_properties
from sidecar.ops.dlq.render import render_inspect, render_inspect_summary, render_replay_summary
from sidecar.ops.dlq.replay import REPLAY_NAME, Replayer, ReplayOptions, ReplaySummary


def _kafka_property(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be above 0: {text!r}")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more: {text!r}")
    return value


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--bootstrap",
        default=None,
        metavar="HOST:PORT",
        help="Kafka bootstrap servers (default: $KAFKA_BOOTSTRAP)",
    )
    p.add_argument(
        "-X",
        "--kafka-property",
        type=_kafka_property,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="librdkafka property for every client (security.protocol, sasl.*, ssl.*); repeatable",
    )
    f = p.add_argument_group(
        "filters (all must match; repeat an option to allow several values; the source fields are "
        "read from whichever format wrote the record: __dlq.errors.*, __streams.errors.*, "
        "__connect.errors.* or kafka_dlt-*)"
    )
    f.add_argument(
        "--format",
        action="append",
        choices=FORMATS,
        default=[],
        help="which system wrote the record: dlq (dlq-sidecar, share groups), streams, connect, "
        "spring, unknown",
    )
    f.add_argument("--source-topic", action="append", default=[], help="the record's source topic")
    f.add_argument(
        "--source-partition",
        action="append",
        type=_non_negative_int,
        default=[],
        help="the record's source partition",
    )
    f.add_argument(
        "--exception-class",
        action="append",
        default=[],
        help="the record's exception class, or its root cause's (Spring), exactly",
    )
    f.add_argument(
        "--offset-range",
        default=None,
        metavar="A-B",
        help="source offsets, inclusive: A-B, A- or -B",
    )
    f.add_argument(
        "--since",
        default=None,
        help="DLQ record time at or after: ISO 8601 (naive = UTC) or 1h/30m/2d",
    )
    f.add_argument("--until", default=None, help="DLQ record time at or before (same forms)")
    f.add_argument(
        "--reason",
        action="append",
        default=[],
        help="why the writer gave up, exactly: ours the cause text (__dlq.errors.message), "
        "Connect's 'stage STAGE'",
    )
    f.add_argument(
        "--message-contains",
        default=None,
        metavar="TEXT",
        help="text in the exception message or cause, any case",
    )
    s = p.add_argument_group(
        "records with schemas (docs/schemas.md): values in the Confluent wire format are shown decoded "
        "through a Schema Registry, --registry or --config's schemas.registry"
    )
    s.add_argument("--registry", default=None, metavar="URL", help="the Schema Registry's URL")
    s.add_argument(
        "--redact",
        action="append",
        default=[],
        metavar="FIELD",
        help="show this decoded field as *** (a name at any depth, or a dotted path); adds to "
        "--config's schemas.redact; repeatable",
    )
    s.add_argument(
        "--show-tagged",
        action="store_true",
        help="show the fields a schema tags sensitive (confluent:tags PII, SENSITIVE, PHI or PCI), "
        "which are redacted by default",
    )
    s.add_argument(
        "--field",
        action="append",
        default=[],
        metavar="PATH=VALUE",
        help="only records whose decoded value has VALUE at PATH (customer.id=42); repeatable",
    )
    f.add_argument(
        "--record",
        action="append",
        default=[],
        metavar="P:OFFSET",
        help="one DLQ record by partition and offset; repeatable",
    )


def add_dlq_parser(subparsers: Any) -> None:
    """Add `dlq inspect` and `dlq replay` to the `dlq-sidecar` sub-commands (argparse's subparsers)."""
    dlq = subparsers.add_parser(
        "dlq",
        help="inspect and replay dead-letter records",
        description="Inspect DLQ records (headers decoded) and replay them to their source or another topic.",
    )
    sub = dlq.add_subparsers(dest="dlq_command", metavar="ACTION")
    sub.required = True

    inspect = sub.add_parser(
        "inspect",
        help="show DLQ records as a table or JSON lines, with counts",
        description=(
            "Read a DLQ topic from the beginning to its current end (nothing is committed) and show "
            "the records that match the filters, with counts by exception class and source topic."
        ),
    )
    inspect.add_argument(
        "--topic",
        action="append",
        default=[],
        help="a DLQ topic; repeatable (one table each)",
    )
    _add_config(inspect)
    _add_common(inspect)
    inspect.add_argument(
        "--limit", type=_non_negative_int, default=None, help="show at most N records"
    )
    inspect.add_argument(
        "--json",
        action="store_true",
        help="one JSON object per record on stdout (bytes as text or base64); counts on stderr",
    )

    replay = sub.add_parser(
        "replay",
        help="send DLQ records back to their source topic (or --to)",
        description=(
            "Replay DLQ records of any known format (dlq-sidecar and share groups, Kafka Streams, "
            "Kafka Connect, Spring Kafka): original key, value and headers (without the writer's "
            "context headers) plus __dlq.replay.name/from/count markers. The --name is a consumer group on the DLQ topic "
            "(dlq-replay.NAME) that remembers progress, so a rerun replays nothing twice; one name "
            "stands for one filter set. Headers-only records are read back from the source topic."
        ),
    )
    replay.add_argument(
        "--from",
        dest="from_topic",
        action="append",
        default=[],
        help="a DLQ topic; repeatable (replayed one after the other, under the same --name)",
    )
    _add_config(replay)
    replay.add_argument(
        "--to",
        default=None,
        help="target topic (default: each record's source topic; needed for records whose "
        "format names none, e.g. a Kafka Streams punctuator's)",
    )
    replay.add_argument(
        "--name", required=True, help="replay name: remembers progress and the filters"
    )
    _add_common(replay)
    replay.add_argument(
        "--dry-run", action="store_true", help="write and commit nothing; print what would be done"
    )
    replay.add_argument(
        "--rate",
        type=_positive_float,
        default=None,
        metavar="N",
        help="at most N records per second",
    )
    replay.add_argument(
        "--max-replays",
        type=_non_negative_int,
        default=1,
        metavar="N",
        help="skip records already replayed N times (default 1: a record that fails after a replay stays)",
    )
    replay.add_argument(
        "--skip-unrecoverable",
        action="store_true",
        help="commit past headers-only records whose source offset is gone (they are still reported)",
    )
    replay.add_argument(
        "--limit", type=_non_negative_int, default=None, help="replay at most N records this run"
    )
    replay.add_argument(
        "--by",
        default=None,
        metavar="WHO",
        help="who replays: written to __dlq.replay.by (with the time in __dlq.replay.at)",
    )


def _add_config(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        default=None,
        metavar="FILE",
        help="the sidecar's configuration: add every DLQ topic it can write to (the default DLQ "
        "of each source topic, errors.deadletterqueue.routes and routes.app.allowed; for inspect "
        "also its retry tier topics); its "
        "kafka.bootstrap.servers is the broker when neither --bootstrap nor $KAFKA_BOOTSTRAP is set",
    )


def _dlq_topics(args: argparse.Namespace, given: list[str], *, tiers: bool = False) -> list[str]:
    """The DLQ topics to read: those given, then those of `--config` not given (in order, once);
    with `tiers` (inspect, never replay: a tier record is still on its way) its retry tier topics
    too."""
    topics = list(dict.fromkeys(given))
    if args.config is not None:
        config = _config(args)
        routes = dlq_routes(config)
        if routes is None:
            raise UsageError(
                f"--config {args.config}: errors.deadletterqueue.topic.name is blank (no DLQ)"
            )
        topics.extend(t for t in routes.topics_for(config.source.topics) if t not in topics)
        if tiers and config.errors.tiers.enabled:
            ladder = config.errors.tiers
            named = [
                ladder.topic(t, i)
                for t in config.source.topics
                for i in range(len(ladder.delays_ms))
            ]
            topics.extend(t for t in dict.fromkeys(named) if t not in topics)
    if not topics:
        raise UsageError("no DLQ topic: pass --topic/--from (repeatable) or --config FILE")
    return topics


def _config(args: argparse.Namespace) -> Any:
    try:
        return load_config(args.config, os.environ)
    except ConfigError as exc:
        raise UsageError(f"--config: {exc}") from None


def filters_from_args(args: argparse.Namespace) -> Filters:
    return filters_from_values(
        formats=args.format,
        source_topics=args.source_topic,
        source_partitions=args.source_partition,
        exception_classes=args.exception_class,
        since=args.since,
        until=args.until,
        offset_range=args.offset_range,
        reasons=args.reason,
        message_contains=args.message_contains,
        records=args.record,
    )


def _bootstrap(args: argparse.Namespace) -> str:
    bootstrap: str | None = args.bootstrap or os.environ.get("KAFKA_BOOTSTRAP")
    if not bootstrap and args.config is not None:
        bootstrap = str(_config(args).kafka["bootstrap.servers"])
    if not bootstrap:
        raise UsageError("no broker: pass --bootstrap HOST:PORT or set KAFKA_BOOTSTRAP")
    return bootstrap


def cmd_dlq(
    args: argparse.Namespace, stdout: TextIO | None = None, stderr: TextIO | None = None
) -> int:
    """Run `dlq inspect` or `dlq replay`: 0 ok, 1 failures (broker, replay), 2 bad arguments."""
    out = stdout or sys.stdout
    err_stream = stderr or sys.stderr
    console = Console(file=out, width=_width(out))
    errors = Console(file=err_stream, width=_width(err_stream))
    try:
        if args.dlq_command == "inspect":
            return _cmd_inspect(args, console, errors)
        if args.dlq_command == "replay":
            return _cmd_replay(args, console)
        raise UsageError(f"unknown dlq action {args.dlq_command!r}")
    except UsageError as exc:
        errors.print(f"dlq-sidecar dlq: {exc}", markup=False, highlight=False, soft_wrap=True)
        return EXIT_USAGE
    except (DlqToolError, KafkaClientError) as exc:
        # KafkaClientError: the Kafka adapters' translation of a broker failure (KafkaCallError).
        errors.print(f"dlq-sidecar dlq: {exc}", markup=False, highlight=False, soft_wrap=True)
        return EXIT_FAILURE


def _width(stream: TextIO) -> int | None:
    """Rich's width: the terminal's, else $COLUMNS, else wide enough that piped tables stay one line a row."""
    isatty = getattr(stream, "isatty", None)
    if isatty is not None and isatty():
        return None
    try:
        return int(os.environ.get("COLUMNS", "200"))
    except ValueError:
        return 200


def _payloads(args: argparse.Namespace) -> PayloadReader | None:
    config = _config(args) if args.config is not None else None
    fields = [parse_field_filter(text) for text in args.field]
    return payloads_for(config, args.registry, args.redact, fields, tagged=not args.show_tagged)


def _cmd_inspect(args: argparse.Namespace, console: Console, errors: Console) -> int:
    filters = filters_from_args(args)
    topics = _dlq_topics(args, args.topic, tiers=True)
    bootstrap = _bootstrap(args)
    payloads = _payloads(args)
    originals = Originals(client_properties(bootstrap, dict(args.kafka_property)))
    try:

        def emit(entry: DlqEntry) -> None:
            console.file.write(json.dumps(entry.to_json(), ensure_ascii=False) + "\n")

        for topic in topics:  # one topic after the other; --limit applies to each
            result = inspect_dlq(
                bootstrap,
                topic,
                filters,
                limit=args.limit,
                kafka=dict(args.kafka_property),
                on_entry=emit if args.json else None,
                payloads=payloads,
                originals=originals,
            )
            if args.json:
                console.file.flush()
                if len(topics) > 1:
                    errors.print(f"DLQ {topic}", markup=False, highlight=False)
                render_inspect_summary(errors, result)
            else:
                render_inspect(console, result, topic)
    finally:
        originals.close()
        if payloads is not None:
            payloads.close()
    return EXIT_OK


def _cmd_replay(args: argparse.Namespace, console: Console) -> int:
    if not REPLAY_NAME.match(args.name):
        raise UsageError(f"bad --name {args.name!r}: use letters, digits, '.', '_' and '-'")
    topics = _dlq_topics(args, args.from_topic)
    bootstrap = _bootstrap(args)
    worst = EXIT_OK
    for topic in topics:  # one topic after the other, each with its own progress under the name
        if _replay_one(args, console, bootstrap, topic) != EXIT_OK:
            worst = EXIT_FAILURE
    return worst


def _replay_one(args: argparse.Namespace, console: Console, bootstrap: str, topic: str) -> int:
    options = ReplayOptions(
        bootstrap=bootstrap,
        dlq_topic=topic,
        name=args.name,
        filters=filters_from_args(args),
        target_topic=args.to,
        dry_run=args.dry_run,
        rate_per_s=args.rate,
        max_replays=args.max_replays,
        skip_unrecoverable=args.skip_unrecoverable,
        limit=args.limit,
        kafka=dict(args.kafka_property),
        by=args.by,
        payloads=_payloads(args),
    )
    replayer = Replayer(options)
    if console.is_terminal:
        progress = Progress(
            TextColumn("[bold]replay[/bold] {task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        )
        with progress:
            task = progress.add_task(options.dlq_topic, total=None)

            def on_tty_progress(s: ReplaySummary, n: int) -> None:
                progress.update(
                    task,
                    advance=n,
                    total=replayer.total or None,
                    description=f"{options.dlq_topic}: {replayer.planned} "
                    + ("planned" if s.dry_run else "sent"),
                )

            replayer.on_progress = on_tty_progress
            summary = replayer.run()
    else:
        last = [time.monotonic()]

        def on_plain_progress(s: ReplaySummary, _n: int) -> None:
            now = time.monotonic()
            if now - last[0] >= 1.0:
                last[0] = now
                console.print(
                    f"replay {options.dlq_topic}: {s.scanned}/{replayer.total} read, "
                    f"{replayer.planned} {'planned' if s.dry_run else 'sent'}",
                    markup=False,
                    highlight=False,
                )

        replayer.on_progress = on_plain_progress
        summary = replayer.run()
    if options.payloads is not None:
        options.payloads.close()
    render_replay_summary(console, summary, options)
    return EXIT_OK if summary.ok else EXIT_FAILURE


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m sidecar.ops.dlq.command ...`: the same commands without the rest of the CLI."""
    parser = argparse.ArgumentParser(prog="dlq-sidecar")
    add_dlq_parser(parser.add_subparsers(dest="command", required=True))
    return cmd_dlq(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
