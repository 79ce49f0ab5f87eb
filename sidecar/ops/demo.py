"""`dlq-sidecar demo`: a local broker, the bundled example app, the sidecar, and orders landing in the DLQ.

This module owns the demo's orchestration and nothing else: it finds (or starts) a broker through the
launcher behind `scripts/kafka` (`sidecar.ops.kafka_broker`), recreates the `orders` topic, derives a
config from `config.example.yaml`, runs the example app (`examples/python/app.py`) and the sidecar as
subprocesses — exactly as a user runs them — produces a seeded stream of orders (ok, poison, flaky,
slow), shows progress read from the sidecar's `GET /v1/status`, and ends with a summary and the first
DLQ records with their `__dlq.errors.*` headers. It stops everything it started, in order: the sidecar
(so it drains and commits), the app, the broker.

It runs from a source checkout and from an installed package alike: the files it needs ship in the
package. `demo_data/config.example.yaml` and `demo_data/example_app.py` are links to the repository's
own files (one copy in the repository; the wheel holds their contents), and the broker launcher and its
Maven POM live in `sidecar/ops`. The children import the same `sidecar` package as the demo.

It talks to the sidecar over HTTP only: it must not import the engine, the daemon or the API modules.
`sidecar.config` is imported only to validate the derived config before anything starts.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import yaml

from sidecar.core.errors import SidecarError

if TYPE_CHECKING:
    # rich is imported where it is used: the CLI imports this module to build its parser, and
    # `dlq-sidecar run` should not pay for rich's import.
    from rich.console import Console, Group
    from rich.live import Live

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_INTERRUPTED = 130

DEFAULT_RECORDS = 2000
DEFAULT_TOPIC = "orders"
PARTITIONS = 3
# The documented ports of config.example.yaml and the example apps; free ones are used when busy.
DEFAULT_API_PORT = 8787
DEFAULT_APP_PORT = 8080

# The order mix, in percent: the rest are "ok". A quarter of the flaky orders never recover and
# are archived at the delivery limit; the others are released twice, then accepted.
POISON_PCT = 3
FLAKY_PCT = 6
SLOW_PCT = 3
HOPELESS_FAILS = 99
CUSTOMERS = 200

DLQ_HEADER_PREFIX = "__dlq.errors."

_HERE = Path(__file__).resolve().parent
_DATA = _HERE / "demo_data"

# A DLQ record as shown: (partition, offset, headers decoded as UTF-8).
DlqRecord = tuple[int, int, list[tuple[str, str]]]


class DemoError(SidecarError):
    """Something the demo needs is missing or failed; the message says what and what to do."""


class _Stop(Exception):
    """SIGTERM or Ctrl-C: stop everything the demo started."""


# --------------------------------------------------------------------------- the orders


@dataclass(frozen=True, slots=True)
class Order:
    key: bytes
    value: bytes
    kind: str  # ok | poison | flaky | hopeless | slow


def plan_orders(n: int, seed: int) -> list[Order]:
    """A reproducible stream of orders keyed by customer."""
    rng = random.Random(seed)
    orders = []
    for i in range(n):
        roll = rng.randrange(100)
        kind = "ok"
        if roll < POISON_PCT:
            kind = "poison"
        elif roll < POISON_PCT + FLAKY_PCT:
            kind = "hopeless" if rng.randrange(4) == 0 else "flaky"
        elif roll < POISON_PCT + FLAKY_PCT + SLOW_PCT:
            kind = "slow"
        customer = f"customer-{rng.randrange(CUSTOMERS):03d}"
        body: dict[str, Any] = {
            "id": f"o-{i + 1:05d}",
            "kind": "flaky" if kind == "hopeless" else kind,
            "customer": customer,
            "amount": round(rng.uniform(5, 500), 2),
        }
        if kind == "hopeless":
            body["fails"] = HOPELESS_FAILS
        orders.append(Order(customer.encode(), json.dumps(body).encode(), kind))
    return orders


@dataclass(frozen=True, slots=True)
class Expected:
    """What the bundled app's decision rule must produce for a planned stream."""

    accepted: int
    rejected: int
    exhausted: int
    attempts: int

    @property
    def archived(self) -> int:
        return self.rejected + self.exhausted


def expected_outcomes(orders: list[Order], delivery_limit: int) -> Expected:
    kinds = [o.kind for o in orders]
    n_flaky, n_hopeless = kinds.count("flaky"), kinds.count("hopeless")
    # A flaky order is released at deliveries 1 and 2 and accepted at the 3rd (if the limit allows).
    flaky_ok = n_flaky if delivery_limit >= 3 else 0
    exhausted = n_hopeless + n_flaky - flaky_ok
    return Expected(
        accepted=kinds.count("ok") + kinds.count("slow") + flaky_ok,
        rejected=kinds.count("poison"),
        exhausted=exhausted,
        attempts=kinds.count("ok")
        + kinds.count("slow")
        + kinds.count("poison")
        + 3 * flaky_ok
        + delivery_limit * exhausted,
    )


# --------------------------------------------------------------------------- the pieces on disk


@dataclass(frozen=True, slots=True)
class Layout:
    """Where the demo's files are; `root` is where its children run (it holds `sidecar/`)."""

    root: Path
    kafka_script: Path
    example_config: Path
    example_app: Path


def find_layout() -> Layout:
    """The files the demo runs, shipped in this package (see the module docstring)."""
    # In a checkout the data files are links into the repository: resolved, the demo names (and
    # runs) examples/python/app.py and config.example.yaml themselves.
    layout = Layout(
        _HERE.parent.parent,
        _HERE / "kafka_broker.py",
        (_DATA / "config.example.yaml").resolve(),
        (_DATA / "example_app.py").resolve(),
    )
    missing = [
        str(p)
        for p in (layout.kafka_script, layout.example_config, layout.example_app)
        if not p.is_file()
    ]
    if missing:
        raise DemoError(
            "the dlq-sidecar package is incomplete: the demo cannot find " + ", ".join(missing)
        )
    return layout


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def pick_port(preferred: int) -> int:
    if port_is_free(preferred):
        return preferred
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def derive_config(
    example: Path,
    out: Path,
    *,
    bootstrap: str,
    group: str,
    topic: str,
    app_url: str,
    api_listen: str,
) -> dict[str, Any]:
    """Write the demo's config: config.example.yaml with the run's addresses and short backoffs.

    The example file stays the documented, working file; only what differs per run (and the
    backoffs, so released orders come back within the demo's seconds) is overridden.
    """
    cfg = yaml.safe_load(example.read_text(encoding="utf-8"))
    cfg["kafka"]["bootstrap.servers"] = bootstrap
    cfg["kafka"]["group.id"] = group
    cfg["source"]["topics"] = [topic]
    cfg["app"]["url"] = app_url
    cfg["errors.retry.delay.initial.ms"] = 100
    cfg["errors.retry.delay.max.ms"] = 1000
    cfg["commit.interval.ms"] = 500
    cfg["shutdown.drain.timeout.ms"] = 5000
    cfg["api"]["listen"] = api_listen
    header = (
        f"# Written by `dlq-sidecar demo` from {example}: the same file with this run's broker,\n"
        "# group, topic, app and API addresses, and short retry backoffs.\n"
    )
    out.write_text(header + yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")

    from sidecar.config import ConfigError, load_config

    try:
        load_config(out)
    except ConfigError as exc:
        raise DemoError(f"the derived config {out} is not valid: {exc}") from None
    return dict(cfg)


# --------------------------------------------------------------------------- the broker


def _kafka_script(
    layout: Layout, command: str, timeout_s: float
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(layout.kafka_script), command],
        stdout=subprocess.PIPE,
        stderr=None if command == "start" else subprocess.PIPE,  # start's progress goes to the user
        text=True,
        timeout=timeout_s,
        check=False,
    )


def find_or_start_broker(layout: Layout, say: Callable[[str], None]) -> tuple[str, bool]:
    """(bootstrap, started by us). KAFKA_BOOTSTRAP wins; a running local broker is reused."""
    external = os.environ.get("KAFKA_BOOTSTRAP")
    if not external:
        status = _kafka_script(layout, "status", 30)
        if status.returncode == 0 and status.stdout.strip():
            bootstrap = status.stdout.strip().splitlines()[-1]
            say(f"using the local broker at {bootstrap}")
            return bootstrap, False
        say("starting a local Kafka broker (scripts/kafka start) ...")
    proc = _kafka_script(layout, "start", 600)
    if proc.returncode != 0 or not proc.stdout.strip():
        where = f"KAFKA_BOOTSTRAP={external}" if external else "scripts/kafka start"
        raise DemoError(f"no Kafka broker: {where} failed (exit {proc.returncode}); see above")
    bootstrap = proc.stdout.strip().splitlines()[-1]
    if external:
        say(f"using the broker at {bootstrap} (KAFKA_BOOTSTRAP)")
        return bootstrap, False
    return bootstrap, True


def recreate_topic(bootstrap: str, topic: str, dlq_topic: str, partitions: int) -> None:
    """Delete the topic and its DLQ if they exist, so each run starts from empty, then create the topic.

    The DLQ topic is left for the sidecar to create at start-up (errors.deadletterqueue.auto.create.enable).
    """
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.cimpl import NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    try:
        existing = set(admin.list_topics(timeout=15).topics)
    except KafkaException as exc:
        raise DemoError(f"the broker at {bootstrap} does not answer: {exc}") from None
    doomed = [t for t in (topic, dlq_topic) if t in existing]
    if doomed:
        for fut in admin.delete_topics(doomed, operation_timeout=30).values():
            fut.result(timeout=30)
    deadline = time.monotonic() + 60
    while True:
        # Deletion finishes asynchronously; creating too early fails with TOPIC_ALREADY_EXISTS.
        try:
            admin.create_topics([NewTopic(topic, partitions, 1)], operation_timeout=30)[
                topic
            ].result(timeout=30)
            break
        except KafkaException as exc:
            if time.monotonic() > deadline:
                raise DemoError(f"cannot create topic {topic}: {exc}") from None
            time.sleep(0.2)
    while time.monotonic() < deadline:
        md = admin.list_topics(topic, timeout=5).topics.get(topic)
        gone = dlq_topic not in admin.list_topics(timeout=5).topics
        if (
            md
            and md.error is None
            and len(md.partitions) == partitions
            and all(p.leader >= 0 for p in md.partitions.values())
            and gone
        ):
            return
        time.sleep(0.1)
    raise DemoError(f"topic {topic} has no leader after 60 s")


# --------------------------------------------------------------------------- the sidecar's API


def http_get_json(port: int, path: str, timeout_s: float = 2.0) -> dict[str, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        body = json.loads(resp.read())
    finally:
        conn.close()
    if not isinstance(body, dict):
        raise ValueError(f"{path} answered {body!r}")
    return body


@dataclass
class Snapshot:
    """The sidecar's counters at one moment (from GET /v1/status)."""

    at: float
    delivered: dict[str, int]
    attempts: int
    archived: dict[str, int]
    dlq_written: int
    dlq_failed: int
    in_flight: int
    app_reachable: bool
    failure: str | None

    @classmethod
    def from_status(cls, status: dict[str, Any], at: float) -> Snapshot:
        c = status["counters"]
        return cls(
            at=at,
            delivered=dict(c["delivered"]),
            attempts=int(c["attempts"]),
            archived=dict(c["archived"]),
            dlq_written=int(c["dlq_written"]),
            dlq_failed=int(c["dlq_failed"]),
            in_flight=int(status["in_flight"]),
            app_reachable=bool(status["app_reachable"]),
            failure=status.get("failure"),
        )

    @property
    def accepted(self) -> int:
        return self.delivered.get("accept", 0)

    @property
    def archived_total(self) -> int:
        return sum(self.archived.values())

    @property
    def done(self) -> int:
        return self.accepted + self.archived_total


# --------------------------------------------------------------------------- the producer


@dataclass
class Producing:
    """The order stream, produced from a thread; `rate` 0 means as fast as the broker takes it."""

    bootstrap: str
    topic: str
    orders: list[Order]
    rate: float
    produced: int = 0
    errors: list[str] = field(default_factory=list)
    finished: threading.Event = field(default_factory=threading.Event)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        from confluent_kafka import KafkaException, Producer

        try:
            producer = Producer(
                {"bootstrap.servers": self.bootstrap, "enable.idempotence": True, "linger.ms": 5}
            )

            def on_delivery(err: object, _msg: object) -> None:
                if err is None:
                    self.produced += 1
                else:
                    self.errors.append(str(err))

            started = time.monotonic()
            for i, order in enumerate(self.orders):
                if self.stop.is_set():
                    return
                if self.rate > 0:
                    ahead_s = started + i / self.rate - time.monotonic()
                    if ahead_s > 0:
                        producer.poll(ahead_s)
                while True:
                    try:
                        producer.produce(
                            self.topic, value=order.value, key=order.key, on_delivery=on_delivery
                        )
                        break
                    except BufferError:
                        producer.poll(0.05)
                producer.poll(0)
            if producer.flush(30) > 0:
                self.errors.append("records still unsent after 30 s")
        except KafkaException as exc:
            self.errors.append(str(exc))
        finally:
            self.finished.set()


# --------------------------------------------------------------------------- processes


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    log_file: Any

    def tail(self, n: int = 20) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(lines[-n:])

    def stop(self, timeout_s: float) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log_file.close()
        return self.proc.returncode


def spawn(name: str, cmd: list[str], log_path: Path, env: dict[str, str], cwd: Path) -> Child:
    log_file = open(log_path, "wb")  # noqa: SIM115 - closed by Child.stop
    proc = subprocess.Popen(
        cmd,
        stdout=log_file,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
        cwd=cwd,
        # Its own session: Ctrl-C reaches only the demo, which then stops the children in order
        # (the sidecar must drain before the app it delivers to goes away).
        start_new_session=True,
    )
    return Child(name, proc, log_path, log_file)


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
                f"  rejected {snap.delivered.get('reject', 0)}  archived {snap.archived_total}"
                f"  dlq {snap.dlq_written}  in-flight {snap.in_flight}  {self.rate:.0f} deliveries/s",
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
        table.add_row("archived", f"[red]{_fmt_counts(snap.archived)}[/]")
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


class Demo:
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
        limit = int(cfg.get("share.delivery.count.limit", 5))
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
                if http_get_json(api_port, "/readyz")["checks"]["assigned"]:
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
            f"\nFirst {len(records)} records of {dlq_topic}, one per kind of failure first "
            "(headers decoded):",
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
            _kafka_script(self.layout, "stop", 60)
            self.broker_started = False
        if self.keep_workdir:
            return
        shutil.rmtree(self.workdir, ignore_errors=True)


def read_dlq(bootstrap: str, topic: str, n: int, timeout_s: float = 15) -> list[DlqRecord]:
    """The first `n` DLQ records (by partition, offset) with their headers decoded as UTF-8."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"dlq-sidecar-demo-reader-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
        }
    )
    out: list[DlqRecord] = []
    try:
        md = consumer.list_topics(topic, timeout=10).topics[topic]
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in md.partitions])
        deadline = time.monotonic() + timeout_s
        while len(out) < n and time.monotonic() < deadline:
            for msg in consumer.consume(n, 0.5):
                if msg.error():
                    continue
                raw = msg.headers() or []
                items = raw.items() if isinstance(raw, dict) else raw
                headers = [
                    (
                        name,
                        value
                        if isinstance(value, str)
                        else (value or b"").decode(errors="replace"),
                    )
                    for name, value in items
                ]
                out.append((int(msg.partition() or 0), int(msg.offset() or 0), headers))
    finally:
        consumer.close()
    return sorted(out)[:n]


def pick_varied(records: list[DlqRecord], n: int) -> list[DlqRecord]:
    """The first record of each kind of failure (cause and error class), then the next ones, by offset."""
    seen: set[tuple[str, str]] = set()
    first_of_kind: list[DlqRecord] = []
    for rec in records:
        h = dict(rec[2])
        kind = (h.get("__dlq.errors.message", ""), h.get("__dlq.errors.exception.class.name", ""))
        if kind not in seen:
            seen.add(kind)
            first_of_kind.append(rec)
    chosen = first_of_kind[:n]
    chosen += [r for r in records if r not in chosen][: n - len(chosen)]
    return sorted(chosen)


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
            "end with a summary and the first DLQ records. KAFKA_BOOTSTRAP selects a broker."
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
    """`python -m sidecar.ops.demo`: the same as `dlq-sidecar demo`."""
    parser = argparse.ArgumentParser(prog="dlq-sidecar")
    add_demo_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["demo", *(sys.argv[1:] if argv is None else argv)])
    return cmd_demo(args)


if __name__ == "__main__":
    sys.exit(main())
