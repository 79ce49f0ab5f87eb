"""The sidecar under test: which checkout runs (``Side``), its config, running it, asking its API.

``sidecar_config`` writes a scenario's YAML, ``unavailable`` says why a side's sidecar cannot run a
scenario, ``running_sidecar`` runs ``python -m sidecar run`` of a side (optionally under cProfile or
py-spy, see ``BENCH_CPROFILE`` and ``BENCH_PYSPY``) and stops it; the rest read its log or ask its
API.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bench.app import App, UnixHTTPConnection, http_json
from bench.measure import PY

POLL_S = 0.02
# Config keys added to this checkout's sidecar ("new") in every run: `python -m bench --set KEY=VALUE`.
NEW_SIDE_KEYS: dict[str, Any] = {}


def with_keys(config_text: str, keys: dict[str, Any]) -> str:
    """The config with `keys` set: a dotted key whose first part names a section of the config goes
    into it (`source.intake` under `source:`; the sidecar refuses it beside that section), any other
    key at the top level."""
    data = yaml.safe_load(config_text) or {}
    for key, value in keys.items():
        head, dot, rest = key.partition(".")
        section = data.get(head)
        if dot and isinstance(section, dict):
            section[rest] = value
        else:
            data[key] = value
    return str(yaml.safe_dump(data, sort_keys=False))


@dataclass(frozen=True)
class Side:
    """Which sidecar code runs: this checkout ("new") or the ``--baseline`` one ("old")."""

    name: str
    root: Path

    def knows_share_journal(self) -> bool:
        """Whether this checkout's sidecar has `share.journal.path` (older ones refuse the key)."""
        values = self.root / "sidecar" / "config" / "values.py"
        return values.exists() and "journal_path" in values.read_text()

    def env(self) -> dict[str, str]:
        # ``python -m sidecar`` with the checkout as the working directory and first on the path,
        # so its own ``sidecar`` package is the one imported (the venv's packages are shared).
        path = os.environ.get("PYTHONPATH")
        return {"PYTHONPATH": str(self.root) + (os.pathsep + path if path else "")}


def sidecar_config(
    scenario: str,
    bootstrap: str,
    topic: str,
    group: str,
    app: App,
    api_path: str,
    *,
    ordering: str | None = None,
    engine: str | None = None,
    kafka_extra: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
    topics: list[str] | None = None,
) -> str:
    kind, _, rest = scenario.partition("-")
    transport, _, scenario_ordering = rest.partition("-")
    if kind in ("e", "f") and not scenario_ordering:
        transport, scenario_ordering = "tcp", "key"
    if scenario in ("e-txn", "e-routes", "f-off", "f-on", "f-on-10pct"):
        transport, scenario_ordering = "tcp", "key"
    if kind == "g":
        transport, scenario_ordering, engine = "tcp", "none", engine or "share"
    if kind == "t":
        transport, scenario_ordering = "tcp", "key"
    unix = transport == "unix"
    mode = "batch" if kind == "d" else "single"
    lines = [
        "kafka:",
        f"  bootstrap.servers: {json.dumps(bootstrap)}",
        f"  group.id: {json.dumps(group)}",
        "  auto.offset.reset: earliest",
        *(f"  {k}: {json.dumps(v)}" for k, v in (kafka_extra or {}).items()),
        "source:",
        f"  topics: {json.dumps(topics or [topic])}",
        f"ordering: {ordering or scenario_ordering}",
        "app:",
        f"  url: http://127.0.0.1:{app.port}/records",
        f"  unix_socket: {json.dumps(app.unix_path) if unix else 'null'}",
        f"  mode: {mode}",
        "api:",
        f"  listen: {json.dumps('unix:' + api_path)}",
        "logging:",
        "  level: warning",
    ]
    if engine:
        lines.append(f"engine: {engine}")
    if kind == "e":
        # A released record is retried after 50 ms rather than the default 1 s, so the run's
        # length is the work done, not one retry timer at the tail of a 5 s run.
        lines.append("errors.retry.delay.initial.ms: 50")
    if kind == "t":
        # 10 % released once, 2 s later (no jitter): to a 2 s retry tier (t-tiers, the record's
        # offset committed meanwhile) or kept in the sidecar's memory as without tiers (t-memory).
        lines += ["errors.retry.delay.initial.ms: 2000", "errors.retry.delay.jitter: 0.0"]
        if scenario == "t-tiers":
            lines += ["errors.retry.tiers: [2s]", "errors.retry.tier.threshold.ms: 1000"]
            # A tier topic per run: each run's group reads its own tier from the start.
            lines.append(f"errors.retry.tier.topic.name: {json.dumps('dlq.' + group + '.{tier}')}")
    if scenario == "e-txn":
        lines.append("errors.deadletterqueue.transactional.enable: true")
    if scenario == "e-routes":
        # Every DLQ record routed: the first rule never matches, the second takes the releases at
        # the limit (503), the third the rejects (422, sidecar.HttpStatus422).
        lines += [
            "errors.deadletterqueue.routes:",
            '  - {exception.class: [app.Never, app.NeverEither], topic.name: "dlq.{topic}.never"}',
            '  - {reason: delivery_count_exceeded, topic.name: "dlq.{topic}.exhausted"}',
            '  - {exception.class: sidecar.HttpStatus422, topic.name: "dlq.{topic}.rejected"}',
        ]
    if scenario.startswith("f-on"):
        lines += ["tracing:", "  exporter: otlp-http"]
    if scenario == "g-share-journal":
        journal = os.path.join(os.path.dirname(api_path), f"journal-{group}")
        lines.append(f"share.journal.path: {json.dumps(journal)}")
    elif engine == "share" and "share.journal.path" not in (extra or {}):
        lines.append("share.journal.path: null")  # g-share measures the engine without one
    lines += [f"{k}: {json.dumps(v)}" for k, v in (extra or {}).items()]
    return "\n".join(lines) + "\n"


def unavailable(scenario: str, side: Side) -> str | None:
    """Why a scenario cannot run against this side's sidecar, or None.

    Reads the side's whole package, so a checkout from before or after a module moved is judged alike.
    """
    src = "\n".join(p.read_text() for p in sorted((side.root / "sidecar").rglob("*.py")))
    if scenario == "e-txn" and "transactional_enable" not in src:
        return "errors.deadletterqueue.transactional.enable is parsed but not used by the engine"
    if scenario == "e-routes" and "class DlqRoutes" not in src:
        return "this sidecar has no DLQ routes (errors.deadletterqueue.routes)"
    if scenario.startswith("f-") and "start_attempt" not in src and "start_span" not in src:
        return "the engine creates no spans: tracing.exporter is parsed but unused"
    if scenario.startswith("g-") and "class Share" not in src:
        return "this sidecar has no share-group engine"
    if scenario == "t-tiers" and "tier_threshold_ms" not in src:
        return "this sidecar has no retry tiers (errors.retry.tiers)"
    if scenario == "g-share-journal" and not side.knows_share_journal():
        return "this sidecar has no share.journal.path (no journal of deaths)"
    return None


@contextlib.contextmanager
def running_sidecar(
    config_text: str,
    directory: str,
    name: str,
    side: Side,
    env: dict[str, str] | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    name = f"{side.name}-{name}"
    config_path = os.path.join(directory, f"{name}.yaml")
    if side.name == "new" and NEW_SIDE_KEYS:
        config_text = with_keys(config_text, NEW_SIDE_KEYS)
    if not side.knows_share_journal():
        # An older checkout has no journal (and refuses the key): "none" is what it runs anyway.
        config_text = config_text.replace("share.journal.path: null\n", "")
    Path(config_path).write_text(config_text)
    log_path = os.path.join(directory, f"{name}.log")
    with open(log_path, "wb") as log:
        # Logs go to stderr; stdout carries only console-exported spans.
        # BENCH_CPROFILE=DIR: the sidecar runs under cProfile (bench.profile_sidecar: its trio
        # thread's CPU time; slower, so for where the time goes, not for figures) and writes
        # DIR/<name>.prof when it stops.
        profile = os.environ.get("BENCH_CPROFILE")
        if profile:
            out = os.path.join(profile, f"{name}.prof")
            command = [PY, "-m", "bench.profile_sidecar", out, "run", "-c", config_path]
        else:
            command = [PY, "-m", "sidecar", "run", "-c", config_path]
        proc = subprocess.Popen(
            command,
            cwd=side.root,
            stdout=subprocess.DEVNULL,
            stderr=log,
            env=dict(os.environ, **side.env(), **(env or {})),
        )
    spy = None
    if os.environ.get("BENCH_PYSPY"):
        # Profile the sidecar while it runs: BENCH_PYSPY=DIR writes DIR/<name>.txt (collapsed stacks,
        # with thread names and idle frames) for flame graphs or grep. BENCH_PYSPY_CPU=1 leaves
        # the idle frames out: then a sample is CPU spent (a blocking poll or epoll_wait is not).
        out = os.path.join(os.environ["BENCH_PYSPY"], f"{name}.txt")
        idle = [] if os.environ.get("BENCH_PYSPY_CPU") else ["--idle"]
        spy = subprocess.Popen(
            [str(Path(PY).parent / "py-spy"), "record", "--pid", str(proc.pid), "--rate", "250",
             "--format", "raw", "--threads", *idle, "--output", out, "--nonblocking"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if spy is not None:
            spy.wait(timeout=30)


def log_tail(directory: str, side: Side, name: str, chars: int = 1500) -> str:
    path = Path(directory) / f"{side.name}-{name}.log"
    return path.read_text(errors="replace")[-chars:] if path.exists() else ""


def wait_until(predicate: Any, timeout_s: float, what: str, proc: subprocess.Popen[bytes]) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if proc.poll() is not None:
            raise RuntimeError(f"the sidecar exited ({proc.returncode}) while waiting for {what}")
        time.sleep(POLL_S)
    raise TimeoutError(f"timed out waiting for {what}")


def api_get(api_path: str, path: str) -> Any:
    conn = UnixHTTPConnection(api_path)
    try:
        return http_json(conn, "GET", path)
    except OSError:
        return None
    finally:
        conn.close()


def status_done(api_path: str, topic: str, ends: dict[int, int]) -> bool:
    """Consumer engine: every partition's committable offset is at its end offset."""
    status = api_get(api_path, "/v1/status")
    if not status:
        return False
    seen = {
        p["partition"]: p["committable_offset"] for p in status["partitions"] if p["topic"] == topic
    }
    # None: nothing committable yet (older sidecars say so before their first record is done).
    return all((seen.get(p) or -1) >= end for p, end in ends.items() if end > 0)


def share_idle(api_path: str) -> bool:
    """Share engine: nothing in flight (every answer taken and acknowledged to the broker)."""
    status = api_get(api_path, "/v1/status")
    return (
        bool(status)
        and status.get("in_flight", 1) == 0
        and not status["share"].get("batches_in_flight", 0)
    )


def wait_assigned(api_path: str, proc: subprocess.Popen[bytes]) -> None:
    """Ready: a consumer group's partitions assigned, a share group's consumers subscribed (an
    older sidecar says `assigned` for that too); a share group still delivers nothing until the
    broker assigns it (`warm_up`)."""

    def ready() -> bool:
        checks = (api_get(api_path, "/readyz") or {}).get("checks", {})
        return bool(checks.get("assigned") or checks.get("subscribed"))

    wait_until(ready, 60, "assignment", proc)
