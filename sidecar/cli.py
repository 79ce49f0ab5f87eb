"""The `dlq-sidecar` command line: argument parsing and exit codes only; the work lives in other modules.

Exit codes: 0 ok, 1 runtime failure (e.g. a DLQ write that cannot succeed), 2 bad usage or bad config.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from sidecar import __version__

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
    parser.add_argument("--version", action="version", version=f"dlq-sidecar {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    run = sub.add_parser("run", help="run the sidecar with a config file")
    run.add_argument("-c", "--config", required=True, help="path to the YAML config file")

    check = sub.add_parser("check-config", help="validate a config file without connecting")
    check.add_argument("-c", "--config", required=True, help="path to the YAML config file")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_CONFIG
    print(f"dlq-sidecar: '{args.command}' is not available yet", file=sys.stderr)
    return EXIT_FAILURE


if __name__ == "__main__":
    sys.exit(main())
