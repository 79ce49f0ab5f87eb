"""The child roles: a raw consumer (``ceiling``), a hand-written bridge (``bridge``), the ``floor``.

Each is ``python -m bench.sidecar_bench --child ROLE`` run from this checkout (its ``parse_args``
reads the child's options, its ``main`` calls ``child_main``); ``run_child`` starts one and returns
the one JSON line it prints at the end.

    ceiling  confluent-kafka consume() loop, commits, no app
    bridge   poll() + one blocking POST per record over a keep-alive session (``requests``, else
             http.client), async commit about once a second (what a user writes by hand)
    floor    poll() per record, an asynchronous commit every 1,000 records: what consuming the
             records costs at an offered rate with nothing else to do
"""

from __future__ import annotations

import argparse
import http.client
import importlib.util
import json
import subprocess
import time
import uuid
from typing import Any

from bench.app import App
from bench.broker import Broker
from bench.measure import PY, ROOT


def ensure_requests() -> bool:
    """The bridge uses ``requests``; install it into this interpreter's venv if it is missing."""
    if importlib.util.find_spec("requests") is not None:
        return True
    print("installing requests into the venv for the hand-written bridge ...", flush=True)
    done = subprocess.run(
        [PY, "-m", "pip", "install", "--quiet", "requests"], check=False, capture_output=True
    )
    if done.returncode != 0:
        print("  pip failed; the bridge falls back to http.client", flush=True)
        return False
    importlib.invalidate_caches()
    return importlib.util.find_spec("requests") is not None


def run_child(
    role: str, broker: Broker, topic: str, total: int, app: App | None, **extra: Any
) -> dict[str, Any]:
    group = f"bench-{role}-{uuid.uuid4().hex[:8]}"
    args = [
        PY, "-m", "bench.sidecar_bench", "--child", role,
        "--bootstrap", broker.bootstrap, "--topic", topic, "--group", group,
        "--expect", str(total),
    ]  # fmt: skip
    if app is not None:
        args += ["--url", f"http://127.0.0.1:{app.port}/records"]
    if extra.get("latency"):
        args.append("--latency")
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        message = json.loads(line)
        if message.get("ready") and extra.get("on_ready"):
            extra["on_ready"]()
        lines.append(message)
    proc.wait()
    if proc.returncode != 0:
        raise RuntimeError(f"child {role} failed with {proc.returncode}")
    result: dict[str, Any] = lines[-1]
    return result


def child_main(args: argparse.Namespace) -> None:
    """``--child ceiling|bridge|floor``: read ``--expect`` records once, print one JSON line."""
    import resource

    from confluent_kafka import Consumer

    def ready(_consumer: Any, partitions: list[Any]) -> None:
        if partitions:
            print(json.dumps({"ready": True}), flush=True)

    consumer = Consumer(
        {
            "bootstrap.servers": args.bootstrap,
            "group.id": args.group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([args.topic], on_assign=ready)
    latencies: list[int] = []
    count = 0
    first_ns = 0
    cpu0 = 0.0
    next_commit = 0.0

    def note(msg: Any) -> None:
        if args.latency:
            for name, value in msg.headers() or ():
                if name == "bench-ts":
                    latencies.append(time.monotonic_ns() - int(value))

    if args.child == "ceiling":
        # The fastest loop: batched consume(), nothing else.  In latency mode poll() instead,
        # because consume(n, timeout) waits out its timeout unless n records arrive.
        while count < args.expect:
            messages = consumer.consume(500, 0.1) if not args.latency else [consumer.poll(0.1)]
            got = [m for m in messages if m is not None and m.error() is None]
            if got and not first_ns:
                first_ns, cpu0 = time.monotonic_ns(), time.process_time()
                next_commit = time.monotonic() + 1
            for msg in got:
                note(msg)
            count += len(got)
            if got and time.monotonic() >= next_commit:
                consumer.commit(asynchronous=True)
                next_commit = time.monotonic() + 1
    elif args.child == "floor":
        # The floor: what consuming the records costs with nothing else to do. poll() per record
        # (as at an ordinary rate, where each poll finds one), an asynchronous commit every 1,000.
        while count < args.expect:
            polled = consumer.poll(0.1)
            if polled is None or polled.error() is not None:
                continue
            if not first_ns:
                first_ns, cpu0 = time.monotonic_ns(), time.process_time()
            count += 1
            if count % 1000 == 0:
                consumer.commit(asynchronous=True)
    else:
        post = bridge_poster(args.url)
        while count < args.expect:
            polled = consumer.poll(1.0)
            if polled is None or polled.error() is not None:
                continue
            msg = polled
            if not first_ns:
                first_ns, cpu0 = time.monotonic_ns(), time.process_time()
                next_commit = time.monotonic() + 1
            headers = {
                "Content-Type": "application/octet-stream",
                "Kafka-Topic": msg.topic(),
                "Kafka-Partition": str(msg.partition()),
                "Kafka-Offset": str(msg.offset()),
            }
            key = msg.key()
            if key is not None:
                headers["Kafka-Key"] = key.decode("latin-1")
            for name, value in list(msg.headers() or ()):
                if name == "bench-ts" and isinstance(value, bytes):
                    headers["Kafka-Header"] = f"bench-ts={value.decode()}"
            status = post(msg.value(), headers)
            if status >= 300:
                raise SystemExit(f"the app answered {status}")
            count += 1
            if time.monotonic() >= next_commit:
                consumer.commit(asynchronous=True)
                next_commit = time.monotonic() + 1
    consumer.commit(asynchronous=False)
    end_ns = time.monotonic_ns()
    cpu = time.process_time() - cpu0
    consumer.close()
    elapsed = (end_ns - first_ns) / 1e9
    print(
        json.dumps(
            {
                "records_per_s": count / elapsed,
                "cpu_s_per_10k": cpu / count * 10_000,
                "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                "latencies_ns": latencies,
            }
        ),
        flush=True,
    )


def bridge_poster(url: str) -> Any:
    """One blocking POST per record over a keep-alive session: requests, else http.client."""
    if importlib.util.find_spec("requests") is not None:
        import requests

        session = requests.Session()

        def post_requests(body: bytes, headers: dict[str, str]) -> int:
            status: int = session.post(url, data=body, headers=headers, timeout=10).status_code
            return status

        return post_requests
    host_port = url.split("/")[2]
    host, _, port = host_port.partition(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)

    def post_stdlib(body: bytes, headers: dict[str, str]) -> int:
        conn.request("POST", "/records", body, headers)
        response = conn.getresponse()
        response.read()
        return response.status

    return post_stdlib
