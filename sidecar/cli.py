"""The `dlq-sidecar` command line: argument parsing and exit codes only; the work lives in other modules.

Exit codes: 0 ok, 1 runtime failure (e.g. a DLQ write that cannot succeed), 2 bad usage or bad config.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from sidecar import __version__

if TYPE_CHECKING:
    from sidecar.config import Config

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_CONFIG = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dlq-sidecar",
        description=(
            "Kafka share-group-style delivery with a dead-letter queue, for any app over HTTP. "
            "Consumes Kafka topics, pushes each record to your app, turns its accept/release/reject "
            "answers into redeliveries, and writes records that keep failing to a DLQ topic."
        ),
    )
    from sidecar.core import core_build

    # "dlq-sidecar 0.1.0 (compiled core)" or "(pure Python core)": see sidecar.core.compiled.
    parser.add_argument(
        "--version", action="version", version=f"dlq-sidecar {__version__} ({core_build()})"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    overlay_help = (
        "YAML or JSON mapping merged over the config file (maps key by key, anything else replaced); "
        "the injector passes the keys it owns this way"
    )
    run = sub.add_parser("run", help="run the sidecar with a config file")
    run.add_argument("-c", "--config", required=True, help="path to the YAML config file")
    run.add_argument("--overlay", metavar="YAML", help=overlay_help)

    check = sub.add_parser("check-config", help="validate a config file without connecting")
    check.add_argument("-c", "--config", required=True, help="path to the YAML config file")
    check.add_argument("--overlay", metavar="YAML", help=overlay_help)
    check.add_argument("--print", action="store_true", help="print the effective config as JSON")

    injector = sub.add_parser(
        "injector",
        help="serve the Kubernetes admission webhook that adds the sidecar to annotated pods",
    )
    injector.add_argument(
        "-c", "--config", required=True, help="path to the injector's YAML config"
    )
    injector.add_argument(
        "--shutdown-delay",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="seconds to keep answering after SIGTERM (default 5)",
    )

    from sidecar.ops.demo.runner import add_demo_parser

    add_demo_parser(sub)

    from sidecar.ops.dlq.command import add_dlq_parser

    add_dlq_parser(sub)

    from sidecar.ops.console.command import add_console_parser

    add_console_parser(sub)

    from sidecar.ops.produce import add_produce_parser

    add_produce_parser(sub)
    return parser


def _load(path: str, overlay: str | None = None) -> object:
    from sidecar.config import ConfigError, load_config

    try:
        return load_config(path, overlay=overlay)
    except ConfigError as exc:
        print(f"dlq-sidecar: config error: {exc}", file=sys.stderr)
        return None
    except OSError as exc:
        print(
            f"dlq-sidecar: cannot read config file {path}: {exc.strerror or exc}", file=sys.stderr
        )
        return None


def cmd_run(config_path: str, overlay: str | None = None) -> int:
    import trio

    from sidecar.config import Config
    from sidecar.service.daemon import run_sidecar
    from sidecar.telemetry.logs import setup_logging

    config = _load(config_path, overlay)
    if not isinstance(config, Config):
        return EXIT_CONFIG
    setup_logging(
        config.logging.level.value,
        config.logging.format.value,
        librdkafka_debug="debug" in config.kafka,
    )
    return trio.run(functools.partial(run_sidecar, config, own_process=True))


def cmd_check_config(config_path: str, print_config: bool, overlay: str | None = None) -> int:
    from sidecar.config import Config, dump_config

    config = _load(config_path, overlay)
    if not isinstance(config, Config):
        return EXIT_CONFIG
    for note in config.deprecations:
        print(f"dlq-sidecar: config warning: {note}", file=sys.stderr)
    if print_config:
        print(json.dumps(dump_config(config), indent=2))
    else:
        print(f"{config_path}: ok")
        print(config_summary(config))
    return EXIT_OK


def config_summary(config: Config) -> str:
    """What `check-config` says a valid config will do: the group, where records go, each source
    topic's DLQ and retry tiers, the DLQ routes and the circuit breaker (one fact a line)."""
    app = config.app
    where = "pulled by the app (GET /v1/records)" if not app.url else app.url
    if app.unix_socket:
        where = f"{app.url} over {app.unix_socket}"
    lines = [
        f"  group {config.group_id}, engine {config.engine.value}, app {where} "
        f"({app.mode.value} mode), at most {config.delivery.delivery_count_limit} deliveries a record"
    ]
    tiers = config.errors.tiers
    for topic in config.source.topics:
        line = f"  {topic} -> DLQ {config.dlq_topic_for(topic) or '(none: logged and skipped)'}"
        if tiers.enabled:
            names = ", ".join(tiers.topic(topic, i) for i in range(len(tiers.delays_ms)))
            line += f"; releases longer than {tiers.threshold_ms} ms wait in retry tiers {names}"
        lines.append(line)
    dlq = config.errors.dlq
    for rule in dlq.routes:
        when = [
            *(f"exception.class {c}" for c in rule.exception_classes),
            *(f"reason {r}" for r in rule.reasons),
            *(f"source.topic {t}" for t in rule.source_topics),
        ]
        lines.append(f"  route: {' and '.join(when)} -> {rule.topic_name}")
    if dlq.routes_app_allowed:
        lines.append(f"  a reject may name: {', '.join(dlq.routes_app_allowed)}")
    if dlq.circuit_breaker_enable:
        lines.append(
            f"  circuit breaker: on, trips at more than {dlq.circuit_breaker_ratio:.0%} of at least "
            f"{dlq.circuit_breaker_min_records} records finished within "
            f"{dlq.circuit_breaker_window_ms // 1000} s dead-lettered"
        )
    else:
        lines.append("  circuit breaker: off")
    return "\n".join(lines)


def cmd_injector(config_path: str, shutdown_delay_s: float) -> int:
    import ssl

    import trio

    from sidecar.injector.server import load_settings, run_injector
    from sidecar.injector.settings import InjectorConfigError
    from sidecar.telemetry.logs import setup_logging

    try:
        settings = load_settings(config_path)
    except InjectorConfigError as exc:
        print(f"dlq-sidecar: config error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    if shutdown_delay_s < 0:
        print("dlq-sidecar: --shutdown-delay must not be negative", file=sys.stderr)
        return EXIT_CONFIG
    setup_logging("info", "json")
    try:
        return trio.run(run_injector, settings, shutdown_delay_s)
    except (ssl.SSLError, FileNotFoundError, PermissionError) as exc:
        print(f"dlq-sidecar: config error: {config_path}: tls: cannot load: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except ExceptionGroup as group:
        bind, rest = group.split(OSError)
        if bind is None or rest is not None:
            raise
        first: BaseException = bind
        while isinstance(first, BaseExceptionGroup):
            first = first.exceptions[0]
        print(f"dlq-sidecar: injector: cannot listen: {first}", file=sys.stderr)
        return EXIT_FAILURE


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_CONFIG
    if args.command == "run":
        return cmd_run(args.config, args.overlay)
    if args.command == "check-config":
        return cmd_check_config(args.config, args.print, args.overlay)
    if args.command == "injector":
        return cmd_injector(args.config, args.shutdown_delay)
    if args.command == "dlq":
        from sidecar.ops.dlq.command import cmd_dlq

        return cmd_dlq(args)
    if args.command == "console":
        from sidecar.ops.console.command import cmd_console

        return cmd_console(args)
    if args.command == "produce":
        from sidecar.ops.produce import cmd_produce

        return cmd_produce(args)
    if args.command == "demo":
        from sidecar.ops.demo.runner import cmd_demo

        return cmd_demo(args)
    parser.error(f"unknown command {args.command}")
    return EXIT_CONFIG


if __name__ == "__main__":
    sys.exit(main())
