"""The broker process's life: format, start on free ports, wait until it answers, stop, status."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from .certs import SCRAM_MECHANISM, secured_listeners, secured_setup
from .jars import cache_dir, fetch_jars, java_cmd, say
from .ports import free_port

START_TIMEOUT_S = 90.0
# Ports are picked free, then bound by the JVM seconds later: another process may bind one meanwhile.
# Then the start is tried again on new ports.
PORT_ATTEMPTS = 3
_PORT_TAKEN = -1
_BIND_FAILED = "Address already in use"
STOP_TIMEOUT_S = 30.0


def state_dir() -> Path:
    return Path(os.environ.get("DLQ_KAFKA_STATE_DIR", cache_dir() / "run"))


def state_file() -> Path:
    return state_dir() / "broker.json"


def metadata_brokers(bootstrap: str, timeout_s: float = 2.0) -> int:
    """Send a Kafka Metadata request (all topics) and return the number of brokers in the answer.

    Hand-rolled so this script needs no client library. Kafka 4.0 removed the oldest protocol versions;
    Metadata v4 is the oldest one kept and the last non-flexible one, so its framing stays simple.
    """
    host, _, port = bootstrap.rpartition(":")
    client_id = b"dlq-sidecar-probe"
    # Metadata v4 request: topics (nullable array, -1 = all) + allow_auto_topic_creation (bool).
    body = struct.pack(">i", -1) + b"\x00"
    header = struct.pack(">hhih", 3, 4, 7, len(client_id)) + client_id
    payload = header + body
    with socket.create_connection((host, int(port)), timeout=timeout_s) as s:
        s.sendall(struct.pack(">i", len(payload)) + payload)
        size_raw = _recv_exact(s, 4)
        (size,) = struct.unpack(">i", size_raw)
        data = _recv_exact(s, size)
    (correlation,) = struct.unpack(">i", data[:4])
    if correlation != 7:
        raise OSError(f"unexpected correlation id {correlation}")
    # v4 response: throttle_time_ms int32, then brokers array.
    (_throttle, n_brokers) = struct.unpack(">ii", data[4:12])
    return int(n_brokers)


def _recv_exact(s: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise OSError("connection closed by broker")
        buf += chunk
    return bytes(buf)


def broker_answers(bootstrap: str) -> bool:
    try:
        return metadata_brokers(bootstrap) >= 1
    except (OSError, struct.error, ValueError):
        return False


def new_cluster_id() -> str:
    """A random cluster id (base64url of a UUID) that does not start with "-": the storage tool's
    argument parser would read such an id as an option and fail ("--cluster-id: expected one
    argument"), about one start in 64."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


def read_state() -> dict[str, object] | None:
    try:
        data = json.loads(state_file().read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child still "exists"; check /proc for its state.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def log_tail(path: Path, n: int = 40) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(lines[-n:])


def start(secured: bool = False) -> int:
    external = os.environ.get("KAFKA_BOOTSTRAP")
    if external and secured:
        say("--secured starts a broker of its own: unset KAFKA_BOOTSTRAP")
        return 1
    if external:
        if not broker_answers(external):
            say(f"KAFKA_BOOTSTRAP={external} does not answer a metadata request")
            return 1
        print(external)
        return 0

    state = read_state()
    if state and pid_alive(int(state["pid"])) and broker_answers(str(state["bootstrap"])):  # type: ignore[call-overload]
        if secured and "secured" not in state:
            say(f"already running without --secured (pid {state['pid']}): stop it first")
            return 1
        say(f"already running (pid {state['pid']})")
        print(state["bootstrap"])
        return 0
    if state:
        _cleanup(state)

    libs = fetch_jars()
    state_dir().mkdir(parents=True, exist_ok=True)
    for attempt in range(1, PORT_ATTEMPTS + 1):
        rc = _start_once(libs, secured, last=attempt == PORT_ATTEMPTS)
        if rc != _PORT_TAKEN:
            return rc
        say("a port picked for the broker was taken before it could listen; starting on new ports")
    return 1


def _start_once(libs: Path, secured: bool, last: bool) -> int:
    """One start on freshly picked ports: 0 when it answers, _PORT_TAKEN when another process bound one of
    its ports between the pick and the broker's bind (the ports are free when picked, not reserved) and
    this is not the `last` attempt, else 1 with the log's last lines."""
    run_dir = Path(tempfile.mkdtemp(prefix="kafka-", dir=os.environ.get("TMPDIR", "/tmp")))
    data_dir = run_dir / "data"
    broker_port, controller_port = free_port(), free_port()
    while controller_port == broker_port:
        controller_port = free_port()
    bootstrap = f"127.0.0.1:{broker_port}"
    props = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": f"1@127.0.0.1:{controller_port}",
        "listeners": f"PLAINTEXT://127.0.0.1:{broker_port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://{bootstrap}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "log.dirs": str(data_dir),
        "num.partitions": "1",
        "auto.create.topics.enable": "false",
        "delete.topic.enable": "true",
        # Single node: every internal topic has one replica; few partitions keep first use fast.
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "4",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "4",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "share.coordinator.state.topic.num.partitions": "4",
        "group.initial.rebalance.delay.ms": "0",
        "group.coordinator.rebalance.protocols": "classic,consumer,share",
        "log.segment.bytes": str(64 * 1024 * 1024),
        "log.retention.check.interval.ms": "60000",
    }
    # DLQ_KAFKA_EXTRA="name=value,...": broker properties over these (the scale bench's share
    # heartbeat, for instance); a name without "=" is refused.
    for item in filter(None, os.environ.get("DLQ_KAFKA_EXTRA", "").split(",")):
        name, sep, value = item.partition("=")
        if not sep:
            say(f"DLQ_KAFKA_EXTRA: {item!r} is not name=value")
            return 1
        props[name.strip()] = value.strip()
    format_args: list[str] = []
    secured_state: dict[str, object] | None = None
    if secured:
        try:
            secured_props, format_args, secured_state = secured_setup(run_dir)
        except RuntimeError as exc:
            shutil.rmtree(run_dir, ignore_errors=True)
            say(str(exc))
            return 1
        listeners, protocols = secured_listeners(secured_state)
        props["listeners"] += "," + ",".join(listeners)
        props["advertised.listeners"] += "," + ",".join(listeners)
        props["listener.security.protocol.map"] += "," + ",".join(
            f"{k}:{v}" for k, v in protocols.items()
        )
        props.update(secured_props)
    config_path = run_dir / "server.properties"
    config_path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))

    cluster_id = new_cluster_id()
    started = time.monotonic()
    fmt = subprocess.run(
        java_cmd(
            libs,
            "kafka.tools.StorageTool",
            "format",
            "--cluster-id",
            cluster_id,
            "--config",
            str(config_path),
            "--feature",
            "share.version=2",
            "--ignore-formatted",
            *format_args,
            heap="256m",
        ),
        capture_output=True,
        text=True,
        check=False,
    )
    if fmt.returncode != 0:
        shutil.rmtree(run_dir, ignore_errors=True)
        say(f"formatting the storage failed (exit {fmt.returncode}):\n{fmt.stdout}{fmt.stderr}")
        return 1

    log_path = run_dir / "broker.log"
    heap = os.environ.get("DLQ_KAFKA_HEAP", "512m")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            java_cmd(libs, "kafka.Kafka", str(config_path), heap=heap),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # survives the shell that started it; stopped by `stop`
        )
    state = {"pid": proc.pid, "bootstrap": bootstrap, "run_dir": str(run_dir), "log": str(log_path)}
    if secured_state is not None:
        state["secured"] = secured_state
        # It holds the SCRAM password and the client key's: readable by this user only.
        state_file().touch(mode=0o600)
    state_file().write_text(json.dumps(state))

    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            # The whole log: the broker dumps its config (hundreds of lines) after the bind error.
            if not last and _BIND_FAILED in log_path.read_text(errors="replace"):
                _cleanup(state)
                return _PORT_TAKEN
            say(
                f"the broker exited with code {proc.returncode} while starting; last lines of {log_path}:"
            )
            print(log_tail(log_path), file=sys.stderr)
            _cleanup(state, keep_log=True)
            return 1
        if broker_answers(bootstrap):
            say(f"started in {time.monotonic() - started:.1f}s (pid {proc.pid}, log {log_path})")
            if secured_state is not None:
                say(
                    f"SASL_SSL ({SCRAM_MECHANISM}) on {secured_state['sasl_ssl']}, mTLS on "
                    f"{secured_state['mtls']}; CA, client certificate and credentials: "
                    f'{state_file()} ("secured")'
                )
            print(bootstrap)
            return 0
        time.sleep(0.2)
    say(f"the broker did not answer within {START_TIMEOUT_S:.0f}s; last lines of {log_path}:")
    print(log_tail(log_path), file=sys.stderr)
    _cleanup(state, keep_log=True)
    return 1


def _cleanup(state: dict[str, object], keep_log: bool = False) -> None:
    pid = int(state.get("pid", 0))  # type: ignore[call-overload]
    if pid and pid_alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while time.monotonic() < deadline and pid_alive(pid):
            _reap(pid)
            time.sleep(0.1)
        if pid_alive(pid):
            say(f"pid {pid} ignored SIGTERM for {STOP_TIMEOUT_S:.0f}s; killing it")
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            time.sleep(0.2)
        _reap(pid)
    run_dir = state.get("run_dir")
    if run_dir and not keep_log:
        shutil.rmtree(str(run_dir), ignore_errors=True)
    elif run_dir:
        shutil.rmtree(Path(str(run_dir)) / "data", ignore_errors=True)
    with contextlib.suppress(FileNotFoundError):
        state_file().unlink()


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def stop() -> int:
    if os.environ.get("KAFKA_BOOTSTRAP"):
        say("KAFKA_BOOTSTRAP is set: that broker is not ours to stop")
        return 0
    state = read_state()
    if not state:
        say("not running")
        return 0
    started = time.monotonic()
    _cleanup(state)
    say(f"stopped in {time.monotonic() - started:.1f}s")
    return 0


def status() -> int:
    external = os.environ.get("KAFKA_BOOTSTRAP")
    if external:
        ok = broker_answers(external)
        print(f"{external} (external) {'answers' if ok else 'does not answer'}")
        return 0 if ok else 3
    state = read_state()
    if state and pid_alive(int(state["pid"])) and broker_answers(str(state["bootstrap"])):  # type: ignore[call-overload]
        print(state["bootstrap"])
        return 0
    say("not running")
    return 3
