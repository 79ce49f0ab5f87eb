"""`scripts/kafka`'s command line: start, stop, status, fetch."""

from __future__ import annotations

import argparse

from . import __doc__ as USAGE
from .jars import cache_dir, fetch_jars
from .process import start, status, stop


def main() -> int:
    parser = argparse.ArgumentParser(
        description=USAGE, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("command", choices=["start", "stop", "status", "fetch"])
    parser.add_argument(
        "--secured",
        action="store_true",
        help="start: add SASL_SSL (SCRAM) and mTLS listeners, with generated certificates",
    )
    args = parser.parse_args()
    if args.secured and args.command != "start":
        parser.error("--secured goes with start only")
    cache_dir().mkdir(parents=True, exist_ok=True)
    if args.command == "start":
        return start(secured=args.secured)
    if args.command == "stop":
        return stop()
    if args.command == "status":
        return status()
    print(fetch_jars())
    return 0
