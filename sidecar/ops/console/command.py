"""`dlq-sidecar console`: its arguments, and serving the app with Hypercorn's trio worker.

Binds 127.0.0.1 unless `--host` says otherwise. Writes (redrives) need the token: `--token-file`, else
$DLQ_CONSOLE_TOKEN, else one generated and printed at start; `--read-only` has none. Exit codes as the
`dlq` commands: 2 for bad arguments, 1 when the server cannot start.

Imports: the standard library, Hypercorn, trio and `sidecar.ops`.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import sys
from typing import Any, cast

from sidecar.ops.dlq.errors import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, UsageError

log = logging.getLogger("sidecar.console")
DEFAULT_PORT = 8686


def add_console_parser(subparsers: Any) -> None:
    """Add `console` to the `dlq-sidecar` sub-commands."""
    p = subparsers.add_parser(
        "console",
        help="a DLQ console in the browser: see, filter, open and redrive dead letters",
        description=(
            "Serve the DLQ console: the DLQ topics found, their dead letters over time, a filtered "
            "table, one record decoded, and redrives (a preview, then a paced run) with the token."
        ),
    )
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
        help="librdkafka property for every client (security.protocol, sasl.*, ssl.*); "
        "${NAME} in a value is read from the environment",
    )
    p.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)"
    )
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    p.add_argument(
        "--prefix",
        default="dlq.",
        help="DLQ topic name prefix (default dlq.); other topics are DLQs when their "
        "newest records carry a known writer's headers",
    )
    p.add_argument(
        "--token-file",
        default=None,
        metavar="PATH",
        help="the token that allows redrives (default: $DLQ_CONSOLE_TOKEN, else a new one, "
        "printed at start)",
    )
    p.add_argument("--read-only", action="store_true", help="no redrives, no token")
    p.add_argument(
        "--registry",
        default=None,
        metavar="URL",
        help="a Schema Registry: values in the Confluent wire format are shown decoded, with their "
        "subject and version (docs/schemas.md)",
    )
    p.add_argument(
        "--redact",
        action="append",
        default=[],
        metavar="FIELD",
        help="a decoded field shown as *** everywhere (a name at any depth, or a dotted path); "
        "repeatable",
    )
    p.add_argument(
        "--show-tagged",
        action="store_true",
        help="show the fields a schema tags sensitive (confluent:tags PII, SENSITIVE, PHI or PCI), "
        "which are redacted by default",
    )
    p.add_argument(
        "--max-replays",
        type=int,
        default=1,
        metavar="N",
        help="the loop guard: skip records already replayed N times (default 1)",
    )


_PLACEHOLDER = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def _kafka_properties(items: list[str]) -> dict[str, str]:
    """`-X KEY=VALUE` items; `${NAME}` in a value is the environment variable's value (the chart
    passes SASL credentials so: never on the command line itself)."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"-X expects KEY=VALUE, got {item!r}")

        out[key.strip()] = _expand(f"-X {key.strip()}", value)
    return out


def _expand(what: str, value: str) -> str:
    """`value` with each `${NAME}` replaced by the environment variable; UsageError when unset."""

    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in os.environ:
            raise UsageError(f"{what}: environment variable {name} is not set")
        return os.environ[name]

    return _PLACEHOLDER.sub(one, value)


def cmd_console(args: argparse.Namespace) -> int:
    """Run the console until SIGINT/SIGTERM: 0 (stopped by a signal), 1 (cannot serve), 2 (bad
    arguments)."""
    try:
        import trio
        from hypercorn.config import Config as ServerConfig
        from hypercorn.trio import serve

        from sidecar.ops.console.access import Access, load_token
        from sidecar.ops.console.app import build_app
        from sidecar.ops.console.context import Console, Settings
        from sidecar.ops.dlq.payloads import payloads_for
    except ImportError as exc:
        print(
            f"dlq-sidecar console: {exc.name} is not installed: pip install 'dlq-sidecar[console]'",
            file=sys.stderr,
        )
        return EXIT_FAILURE
    try:
        kafka = _kafka_properties(args.kafka_property)
        bootstrap = _expand(
            "--bootstrap", args.bootstrap or os.environ.get("KAFKA_BOOTSTRAP") or ""
        )
        if not bootstrap:
            raise UsageError("no broker: pass --bootstrap HOST:PORT or set KAFKA_BOOTSTRAP")
        if not 0 <= args.port <= 65535:
            raise UsageError(f"--port must be 0-65535, got {args.port}")
        if args.max_replays < 1:
            raise UsageError("--max-replays must be 1 or more")
        token, generated = load_token(args.token_file, read_only=args.read_only)
        payloads = payloads_for(None, args.registry, args.redact, (), tagged=not args.show_tagged)
    except UsageError as exc:
        print(f"dlq-sidecar console: {exc}", file=sys.stderr)
        return EXIT_USAGE
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    settings = Settings(
        bootstrap=bootstrap,
        kafka=kafka,
        prefix=args.prefix,
        max_replays=args.max_replays,
    )
    app = build_app(Console(settings=settings, access=Access(token), payloads=payloads))
    config = ServerConfig()
    host = f"[{args.host}]" if ":" in args.host else args.host
    config.bind = [f"{host}:{args.port}"]
    config.accesslog = None  # URLs carry filters, which may name message text: not logged
    config.errorlog = logging.getLogger("sidecar.console.server")

    async def until_signalled() -> None:
        # SIGTERM (Kubernetes) and SIGINT stop intake; Hypercorn lets requests in flight finish.
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for _signum in signals:
                return

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(
                lambda task_status: serve(
                    cast(Any, app),
                    config,
                    shutdown_trigger=until_signalled,
                    task_status=task_status,
                )
            )
            where = ", ".join(binds) if binds else config.bind[0]
            mode = "read-only" if token is None else "redrives need the token"
            print(f"dlq-sidecar console: serving on {where} ({mode})", flush=True)
            if generated:
                print(f"dlq-sidecar console: token {token}", flush=True)

    try:
        trio.run(main)
    except OSError as exc:
        print(f"dlq-sidecar console: cannot serve on {config.bind[0]}: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    return EXIT_OK


__all__ = ["add_console_parser", "cmd_console"]
