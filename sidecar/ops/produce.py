"""`dlq-sidecar produce`: put test records on a topic, one per line of standard input.

Owns the command (`add_produce_parser`, which `sidecar.cli` mounts, and `cmd_produce`): each line is
a record's value (its newline dropped); with `--key-separator` the text before the first separator is
its key; `--header name=value` adds a header to every record. A topic that does not exist is created
first (`--partitions`). Every record is confirmed by the broker (acks=all) before the exit: 0 all
written, 1 a broker failure, 2 bad arguments. For trying a sidecar on one's own topics, not a load
generator. Imports the standard library and `sidecar.kafka.tools` only.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterable
from typing import Any, TextIO

from sidecar.kafka.tools import KafkaCallError, ToolProducer, TopicAdmin

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2
FLUSH_S = 30.0


def add_produce_parser(sub: Any) -> None:
    p = sub.add_parser(
        "produce",
        help="put records on a topic, one per line of standard input (to try the sidecar)",
        description="Each line of standard input is one record's value. "
        "Example: printf 'o-1:{\"id\": 1}\\n' | dlq-sidecar produce --topic orders "
        "--key-separator :",
    )
    p.add_argument("--topic", required=True, help="the topic (created when missing)")
    p.add_argument(
        "--bootstrap",
        default=None,
        metavar="HOST:PORT",
        help="Kafka bootstrap servers (default: $KAFKA_BOOTSTRAP)",
    )
    p.add_argument(
        "-X",
        "--kafka-property",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="librdkafka property (security.protocol, sasl.*, ssl.*); repeatable",
    )
    p.add_argument(
        "--key-separator",
        default=None,
        metavar="SEP",
        help="the text of a line before the first SEP is the record's key (default: no key)",
    )
    p.add_argument(
        "--header",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a header on every record; repeatable",
    )
    p.add_argument(
        "--partitions",
        type=int,
        default=1,
        metavar="N",
        help="partitions of the topic when it has to be created (default 1)",
    )


def _pairs(texts: Iterable[str], what: str) -> list[tuple[str, str]]:
    out = []
    for text in texts:
        name, sep, value = text.partition("=")
        if not sep or not name:
            raise ValueError(f"{what} {text!r}: expected NAME=VALUE")
        out.append((name, value))
    return out


def cmd_produce(
    args: argparse.Namespace, stdin: TextIO | None = None, stderr: TextIO | None = None
) -> int:
    """Produce the lines of `stdin` to `args.topic`; see the module docstring for the exit codes."""
    lines_in = stdin or sys.stdin
    err = stderr or sys.stderr
    bootstrap = args.bootstrap or os.environ.get("KAFKA_BOOTSTRAP")
    if not bootstrap:
        print("dlq-sidecar produce: no broker: pass --bootstrap or set KAFKA_BOOTSTRAP", file=err)
        return EXIT_USAGE
    try:
        props: dict[str, str] = dict(_pairs(args.kafka_property, "-X"))
        headers = [(n, v.encode()) for n, v in _pairs(args.header, "--header")]
    except ValueError as exc:
        print(f"dlq-sidecar produce: {exc}", file=err)
        return EXIT_USAGE
    if args.partitions < 1:
        print("dlq-sidecar produce: --partitions must be at least 1", file=err)
        return EXIT_USAGE
    props["bootstrap.servers"] = bootstrap
    failures: list[str] = []
    sent = 0
    try:
        admin = TopicAdmin(props)
        if args.topic not in admin.topics():
            admin.create_topic(args.topic, args.partitions, -1)  # the broker's replication
            print(f"created topic {args.topic} ({args.partitions} partitions)", file=err)
        producer = ToolProducer(props)
        for line in lines_in:
            text = line.rstrip("\r\n")
            key: bytes | None = None
            if args.key_separator:
                before, sep, after = text.partition(args.key_separator)
                if sep:
                    key, text = before.encode(), after
            why = producer.send(
                args.topic,
                key=key,
                value=text.encode(),
                headers=headers,
                on_done=lambda e: failures.append(e) if e is not None else None,
            )
            if why is not None:
                failures.append(why)
                break
            sent += 1
        left = producer.flush(FLUSH_S)
    except KafkaCallError as exc:
        print(f"dlq-sidecar produce: {exc}", file=err)
        return EXIT_FAILURE
    if failures or left:
        first = failures[0] if failures else f"{left} not confirmed within {FLUSH_S:g} s"
        print(f"dlq-sidecar produce: {len(failures) + left} of {sent} failed: {first}", file=err)
        return EXIT_FAILURE
    print(f"produced {sent} record{'s' if sent != 1 else ''} to {args.topic}", file=err)
    return EXIT_OK


__all__ = ["add_produce_parser", "cmd_produce"]
