"""`dlq-sidecar demo`: a local broker, the bundled example app, the sidecar, and orders landing in the DLQ.

Owns the demo's orchestration and nothing else (`Demo`: what it starts, in which order, and what it
stops: its docstring); its pieces live beside it (`setup`, `orders`, `children`, `display`).

It talks to the sidecar over HTTP only: it must not import the engine, the daemon or the API modules;
`sidecar.config` only validates the derived config before anything starts.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from sidecar.ops.demo.children import Child, Producing, Snapshot, http_get_json, spawn
from sidecar.ops.demo.display import Display, pick_varied, read_dlq
from sidecar.ops.demo.orders import Expected, expected_outcomes, plan_orders
from sidecar.ops.demo.setup import (
    DemoError,
    Layout,
    derive_config,
    existing_topics,
    find_layout,
    find_or_start_broker,
    pick_port,
    port_is_free,
    recreate_topic,
    run_kafka_script,
)

if TYPE_CHECKING:
    # rich is imported where it is used: the CLI imports this module to build its parser, and
    # `dlq-sidecar run` should not pay for rich's import.
    from rich.console import Console

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_INTERRUPTED = 130

DEFAULT_RECORDS = 2000
DEFAULT_TOPIC = "orders"
PARTITIONS = 3
# The documented ports of config.example.yaml and the example apps; free ones are used when busy.
DEFAULT_API_PORT = 8787
DEFAULT_APP_PORT = 8080

DLQ_HEADER_PREFIX = "__dlq.errors."


class DemoRefused(DemoError):
    """Topics the demo would replace on a broker it did not start, and no yes: nothing was started."""


class _Stop(Exception):
    """SIGTERM or Ctrl-C: stop everything the demo started."""


# --------------------------------------------------------------------------- the demo

ATTEMPTS_LABEL = "deliveries to the app (attempts)"


@dataclass
class Options:
    records: int
    keep_running: bool
    app_url: str | None
    rate: float
    topic: str
    seed: int
    timeout_s: float
    show_dlq: int
    api_port: int | None = None
    yes: bool = False


class Demo:
    """The demo's orchestration, from the broker to the summary.

    The pieces it orchestrates live beside it: `setup` files, ports, config and broker; `orders` the order stream; `children` the
    producer, the child processes and the status reads; `display` the progress and the DLQ records
    shown. It finds (or starts) a broker through the
    launcher behind `scripts/kafka` (`sidecar.ops.broker`), recreates the `orders` topic (on a broker it
    did not start, only after asking when the topic or its DLQ topic is there, or with `--yes`), derives a
    config from `config.example.yaml`, runs the example app (`examples/python/app.py`) and the sidecar as
    subprocesses — exactly as a user runs them — produces a seeded stream of orders (ok, poison, flaky,
    slow), shows progress read from the sidecar's `GET /v1/status`, and ends with a summary and the first
    DLQ records with their `__dlq.errors.*` headers. It stops everything it started, in order: the sidecar
    (so it drains and commits), the app, the broker.

    It runs from a source checkout and from an installed package alike: the files it needs ship in the
    package. `data/config.example.yaml` and `data/example_app.py` are links to the repository's
    own files (one copy in the repository; the wheel holds their contents), and the broker launcher and its
    Maven POM live in `sidecar/ops/broker`. The children import the same `sidecar` package as the demo.
    """

    def __init__(self, options: Options, console: Console) -> None:
        self.o = options
        self.console = console
        self.children: list[Child] = []
        self.broker_started = False
        self.layout: Layout | None = None
        self.workdir = Path(tempfile.mkdtemp(prefix="dlq-sidecar-demo-"))
        self.keep_workdir = False

    def say(self, msg: str) -> None:
        self.console.print(f"demo: {msg}", markup=False, highlight=False, soft_wrap=True)

    def run(self) -> int:
        try:
            return self._run()
        except DemoRefused:
            raise  # nothing ran: no logs to keep
        except DemoError:
            self.keep_workdir = True  # the logs explain the failure
            raise
        finally:
            self.cleanup()

    def _run(self) -> int:
        o = self.o
        layout = self.layout = find_layout()
        bootstrap, self.broker_started = find_or_start_broker(layout, self.say)
        dlq_topic = f"dlq.{o.topic}"
        if not self.broker_started:
            self._may_replace(bootstrap, [o.topic, dlq_topic])
        self.say(f"recreating topic {o.topic} ({PARTITIONS} partitions); {dlq_topic} is emptied")
        recreate_topic(bootstrap, o.topic, dlq_topic, PARTITIONS)

        if o.api_port is not None:
            api_port = o.api_port
            if not port_is_free(api_port):
                raise DemoError(f"--api-port {api_port} is in use")
        else:
            api_port = pick_port(DEFAULT_API_PORT)
            if api_port != DEFAULT_API_PORT:
                self.say(
                    f"port {DEFAULT_API_PORT} is busy: the sidecar's API is on 127.0.0.1:{api_port}"
                )
        bundled = o.app_url is None
        if bundled:
            app_port = pick_port(DEFAULT_APP_PORT)
            app_url = f"http://127.0.0.1:{app_port}/records"
        else:
            app_url = str(o.app_url)
        group = f"dlq-sidecar-demo-{uuid.uuid4().hex[:8]}"
        config_path = self.workdir / "config.yaml"
        cfg = derive_config(
            layout.example_config,
            config_path,
            bootstrap=bootstrap,
            group=group,
            topic=o.topic,
            app_url=app_url,
            api_listen=f"127.0.0.1:{api_port}",
        )
        limit = int(cfg.get("delivery.count.limit", cfg.get("share.delivery.count.limit", 5)))
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "SIDECAR_API": f"http://127.0.0.1:{api_port}"}

        if bundled:
            self.say(f"starting the example app {layout.example_app} on {app_url}")
            app = self._spawn(
                "app",
                [sys.executable, str(layout.example_app), "--port", str(app_port)],
                env,
            )
            self._wait_for_line(app, "listening on", 15)
        else:
            self.say(f"using your app at {app_url}")

        self.say(f"starting the sidecar: {sys.executable} -m sidecar run -c {config_path}")
        sidecar = self._spawn(
            "sidecar", [sys.executable, "-m", "sidecar", "run", "-c", str(config_path)], env
        )
        self._wait_assigned(sidecar, api_port, 60)

        orders = plan_orders(o.records, o.seed)
        expected = expected_outcomes(orders, limit) if bundled else None
        producing = Producing(bootstrap, o.topic, orders, o.rate)
        self.say(
            f"producing {len(orders)} orders to {o.topic}: "
            + ", ".join(
                f"{k} {sum(1 for x in orders if x.kind == k)}"
                for k in ("ok", "poison", "flaky", "hopeless", "slow")
            )
            + f" (hopeless = flaky that never recovers; delivery limit {limit})"
        )
        started = time.monotonic()
        thread = threading.Thread(target=producing.run, name="demo-producer", daemon=True)
        thread.start()
        try:
            final = self._watch(sidecar, api_port, producing, started)
        finally:
            producing.stop.set()
        elapsed_s = time.monotonic() - started

        ok = self._summary(final, elapsed_s, expected, limit)
        self._show_dlq(bootstrap, dlq_topic, final.dlq_written)
        if not ok:
            self.keep_workdir = True
            self.say(
                f"FAILED: the outcomes differ from the app's decision rule; logs in {self.workdir}"
            )
            return EXIT_FAILURE
        if o.keep_running:
            self._keep_running(sidecar, api_port, config_path)
        return EXIT_OK

    # -- steps

    def _may_replace(self, bootstrap: str, topics: list[str]) -> None:
        """On a broker the demo did not start: ask before deleting topics that are there already."""
        there = existing_topics(bootstrap, topics)
        if not there or self.o.yes:
            return
        names = " and ".join(there)
        them, their = ("it", "its") if len(there) == 1 else ("them", "their")
        question = (
            f"the broker at {bootstrap} was not started by the demo and has {names}: "
            f"the demo deletes and recreates {them} ({their} records are lost)"
        )
        if not sys.stdin.isatty():
            raise DemoRefused(
                f"{question}. Run again with --yes to allow that, or with --topic NAME "
                "for a topic of the demo's own"
            )
        answer = self.console.input(f"demo: {question}. Go on? [y/N] ", markup=False)
        if answer.strip().lower() not in ("y", "yes"):
            raise DemoRefused(
                "nothing was changed; --topic NAME runs the demo on a topic of its own"
            )

    def _spawn(self, name: str, cmd: list[str], env: dict[str, str]) -> Child:
        assert self.layout is not None
        child = spawn(name, cmd, self.workdir / f"{name}.log", env, self.layout.root)
        self.children.append(child)
        return child

    def _wait_for_line(self, child: Child, needle: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if needle in child.tail(5):
                return
            if child.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise DemoError(
            f"the {child.name} did not start; last lines of {child.log_path}:\n{child.tail()}"
        )

    def _wait_assigned(self, sidecar: Child, api_port: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if sidecar.proc.poll() is not None:
                raise DemoError(
                    f"the sidecar exited with code {sidecar.proc.returncode} at start-up; "
                    f"last lines of {sidecar.log_path}:\n{sidecar.tail()}"
                )
            # /readyz answers 503 with its checks until all pass; "assigned" is the one we need
            # (a partition appears in /v1/status only once it has records).
            with contextlib.suppress(OSError, ValueError, KeyError):
                checks = http_get_json(api_port, "/readyz")["checks"]
                if checks.get("assigned") or checks.get("subscribed"):  # subscribed: a share group
                    return
            time.sleep(0.1)
        raise DemoError(f"the sidecar was not assigned its partitions within {timeout_s:.0f} s")

    def _status(self, sidecar: Child, api_port: int) -> Snapshot:
        if sidecar.proc.poll() is not None:
            raise DemoError(
                f"the sidecar stopped (exit {sidecar.proc.returncode}); last lines of "
                f"{sidecar.log_path}:\n{sidecar.tail()}"
            )
        try:
            return Snapshot.from_status(http_get_json(api_port, "/v1/status"), time.monotonic())
        except (OSError, ValueError, KeyError) as exc:
            raise DemoError(f"cannot read the sidecar's /v1/status: {exc}") from None

    def _watch(
        self, sidecar: Child, api_port: int, producing: Producing, started: float
    ) -> Snapshot:
        total = len(producing.orders)
        unreachable_since: float | None = None
        with Display(self.console, total) as display:
            while True:
                snap = self._status(sidecar, api_port)
                now = time.monotonic()
                display.update(snap, producing.produced, now - started)
                if producing.errors:
                    raise DemoError(f"producing the orders failed: {producing.errors[0]}")
                if snap.failure:
                    raise DemoError(f"the sidecar failed: {snap.failure}")
                if snap.done >= total and snap.dlq_written >= snap.archived_total:
                    return snap
                if snap.app_reachable:
                    unreachable_since = None
                elif unreachable_since is None:
                    unreachable_since = now
                elif now - unreachable_since > min(15.0, self.o.timeout_s / 2):
                    raise DemoError(
                        f"the sidecar cannot reach the app at {self.o.app_url or 'the bundled app'}: "
                        f"connection refused for {now - unreachable_since:.0f} s"
                    )
                if now - started > self.o.timeout_s:
                    raise DemoError(
                        f"only {snap.done} of {total} orders were done after {self.o.timeout_s:.0f} s"
                    )
                time.sleep(0.125 if display.live is not None else 0.25)

    def _summary(
        self, snap: Snapshot, elapsed_s: float, expected: Expected | None, limit: int
    ) -> bool:
        """Print the summary table; False when the bundled app's outcomes are not the expected ones."""
        from rich.table import Table

        def want(attr: str) -> int | None:
            return None if expected is None else int(getattr(expected, attr))

        rows: list[tuple[str, int, int | None]] = [
            ("orders produced", self.o.records, None),
            (ATTEMPTS_LABEL, snap.attempts, want("attempts")),
            ("accepted", snap.accepted, want("accepted")),
            ("released (redelivered later)", snap.delivered.get("release", 0), None),
            (
                "rejected by the app -> DLQ",
                snap.archived.get("rejected", 0),
                want("rejected"),
            ),
            (
                f"archived at the limit ({limit}) -> DLQ",
                snap.archived.get("delivery_count_exceeded", 0),
                want("exhausted"),
            ),
            ("DLQ records written", snap.dlq_written, want("archived")),
        ]
        if snap.delivered.get("lock_expired"):
            rows.append(("lock expired (no answer in time)", snap.delivered["lock_expired"], None))
        table = Table(title=f"dlq-sidecar demo: {self.o.records} orders in {elapsed_s:.1f} s")
        table.add_column("")
        table.add_column("count", justify="right")
        if expected is not None:
            table.add_column("expected", justify="right")
        ok = True
        for label, value, wanted in rows:
            cells = [label, str(value)]
            if expected is not None:
                mark = ""
                if wanted is not None and wanted != value:
                    # Outcomes must match the app's rule exactly. Extra attempts alone are
                    # at-least-once redeliveries (say, a lock that expired on a loaded machine).
                    strict = label != ATTEMPTS_LABEL
                    mark = "  MISMATCH" if strict else "  (redeliveries)"
                    ok = ok and not strict
                cells.append("" if wanted is None else f"{wanted}{mark}")
            table.add_row(*cells)
        table.add_row(
            "throughput",
            f"{self.o.records / elapsed_s:.0f} orders/s, {snap.attempts / elapsed_s:.0f} deliveries/s",
        )
        self.console.print(table)
        return ok

    def _show_dlq(self, bootstrap: str, dlq_topic: str, written: int) -> None:
        n = min(self.o.show_dlq, written)
        if n <= 0:
            return
        from rich.table import Table
        from rich.text import Text

        records = pick_varied(read_dlq(bootstrap, dlq_topic, min(written, 1000)), n)
        self.console.print(
            f"\n{len(records)} records of {dlq_topic}: the first of each kind of failure (cause and "
            "exception class), then the next ones by offset (headers decoded):",
            markup=False,
            highlight=False,
        )
        for partition, offset, headers in records:
            table = Table(
                title=f"{dlq_topic}[{partition}]@{offset}", title_justify="left", show_header=False
            )
            table.add_column("header", style="bold", no_wrap=True)
            table.add_column("value", overflow="fold")
            for name, value in headers:
                if not name.startswith(DLQ_HEADER_PREFIX):
                    continue
                shown = value
                if name.endswith(".stacktrace"):
                    lines = value.strip().splitlines()
                    shown = f"{lines[-1] if lines else ''}  ({len(lines)} lines)"
                table.add_row(Text(name), Text(shown))  # record data: never markup
            self.console.print(table)

    def _keep_running(self, sidecar: Child, api_port: int, config_path: Path) -> None:
        self.say(
            "still running. Explore:\n"
            f"  curl -s http://127.0.0.1:{api_port}/v1/status\n"
            f"  curl -s http://127.0.0.1:{api_port}/metrics\n"
            f"  curl -s http://127.0.0.1:{api_port}/readyz\n"
            f"  config {config_path}, logs in {self.workdir}\n"
            "Press Ctrl-C to stop everything."
        )
        while sidecar.proc.poll() is None:
            time.sleep(0.5)
        self.keep_workdir = True
        raise DemoError(
            f"the sidecar exited (code {sidecar.proc.returncode}); logs in {self.workdir}"
        )

    def cleanup(self) -> None:
        # Nothing may interrupt this: a second Ctrl-C would leave processes behind.
        previous = {
            sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)
        }
        try:
            self._stop_all()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _stop_all(self) -> None:
        # The sidecar first: it drains in-flight deliveries and commits while the app still answers.
        for child in sorted(self.children, key=lambda c: c.name != "sidecar"):
            code = child.stop(30 if child.name == "sidecar" else 5)
            if child.name == "sidecar" and code not in (0, None):
                self.say(
                    f"the sidecar exited with code {code}; last lines of its log:\n{child.tail()}"
                )
                self.keep_workdir = True
        self.children.clear()
        if self.broker_started and self.layout is not None:
            self.say("stopping the local broker")
            run_kafka_script(self.layout, "stop", 60)
            self.broker_started = False
        if self.keep_workdir:
            return
        shutil.rmtree(self.workdir, ignore_errors=True)


# --------------------------------------------------------------------------- CLI


def add_demo_parser(subparsers: Any) -> None:
    """Add `demo` to the `dlq-sidecar` sub-commands (argparse's `add_subparsers()` object)."""
    demo = subparsers.add_parser(
        "demo",
        help="run a local broker, an example app and the sidecar, with poison orders going to the DLQ",
        description=(
            "Start (or reuse) a local Kafka broker, recreate the topic `orders` and its DLQ "
            "`dlq.orders`, run the example app (examples/python/app.py) and the sidecar with a "
            "config derived from config.example.yaml, produce a stream of orders of which some "
            "are poison (rejected), flaky (released, then accepted or archived at the delivery "
            "limit) or slow (acknowledged later through POST /v1/acks), show live progress, and "
            "end with a summary and the first DLQ records. KAFKA_BOOTSTRAP selects a broker; on a broker "
            "it did not start, the demo asks before it deletes topics that are there (--yes)."
        ),
    )
    demo.add_argument(
        "--records",
        type=_positive_int,
        default=DEFAULT_RECORDS,
        metavar="N",
        help=f"orders to produce (default {DEFAULT_RECORDS})",
    )
    demo.add_argument(
        "--keep-running",
        action="store_true",
        help="leave everything running after the summary to explore /v1/status and /metrics; Ctrl-C stops",
    )
    demo.add_argument(
        "--app-url",
        metavar="URL",
        help="push to your own app at this loopback http URL instead of the bundled one",
    )
    demo.add_argument(
        "--rate",
        type=float,
        default=0.0,
        metavar="PER_S",
        help="orders produced per second (default 0: as fast as the broker takes them)",
    )
    demo.add_argument(
        "--api-port",
        type=int,
        metavar="PORT",
        help=(
            "port of the sidecar's local API (default 8787, or a free one when it is busy); "
            "with --app-url, your app sends deferred acks there"
        ),
    )
    demo.add_argument(
        "--topic", default=DEFAULT_TOPIC, help="source topic (default orders; recreated)"
    )
    demo.add_argument(
        "--yes",
        action="store_true",
        help=(
            "on a broker the demo did not start (KAFKA_BOOTSTRAP, or one already running), "
            "delete and recreate the topic and its DLQ topic without asking"
        ),
    )
    demo.add_argument("--seed", type=int, default=7, help="seed of the order mix (default 7)")
    demo.add_argument(
        "--timeout",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="give up when the orders are not all done by then (default 120)",
    )
    demo.add_argument(
        "--show-dlq", type=int, default=3, metavar="N", help="DLQ records to print (default 3)"
    )
    demo.set_defaults(handler=cmd_demo)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _raise_stop(_signum: int, _frame: object) -> None:
    raise _Stop


def cmd_demo(args: argparse.Namespace, stdout: TextIO | None = None) -> int:
    """Run the demo; 0 on success, 1 with a message on failure, 130 when interrupted."""
    from rich.console import Console

    console = Console(file=stdout or sys.stdout)
    options = Options(
        records=args.records,
        keep_running=args.keep_running,
        app_url=args.app_url,
        rate=args.rate,
        topic=args.topic,
        seed=args.seed,
        timeout_s=args.timeout,
        show_dlq=args.show_dlq,
        api_port=args.api_port,
        yes=args.yes,
    )
    previous = signal.signal(signal.SIGTERM, _raise_stop)
    demo: Demo | None = None
    try:
        demo = Demo(options, console)
        return demo.run()
    except DemoError as exc:
        console.print(f"dlq-sidecar demo: {exc}", markup=False, highlight=False, soft_wrap=True)
        if demo is not None and demo.keep_workdir:
            console.print(
                f"dlq-sidecar demo: logs kept in {demo.workdir}", markup=False, highlight=False
            )
        return EXIT_FAILURE
    except (KeyboardInterrupt, _Stop):
        if options.keep_running:
            console.print(
                "dlq-sidecar demo: stopped", markup=False, highlight=False, soft_wrap=True
            )
            return EXIT_OK
        console.print(
            "dlq-sidecar demo: interrupted", markup=False, highlight=False, soft_wrap=True
        )
        return EXIT_INTERRUPTED
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: list[str] | None = None) -> int:
    """`python -m sidecar.ops.demo.runner`: the same as `dlq-sidecar demo`."""
    parser = argparse.ArgumentParser(prog="dlq-sidecar")
    add_demo_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["demo", *(sys.argv[1:] if argv is None else argv)])
    return cmd_demo(args)


if __name__ == "__main__":
    sys.exit(main())
