#!/usr/bin/env python3
"""A real, local Apache Kafka broker (KRaft, one combined broker+controller) for development, tests and the demo.

    scripts/kafka start     fetch the jars (once, with Maven), format fresh storage, start, wait, print the bootstrap address
    scripts/kafka start --secured
                            the same broker with two more listeners, SASL_SSL (SCRAM-SHA-512) and SSL with
                            required client certificates (mTLS); a CA, the broker's and a client's certificate
                            are generated with openssl, the SCRAM user is created with Kafka's storage tool at
                            format time; where everything is goes to <state dir>/broker.json ("secured")
    scripts/kafka stop      stop the broker cleanly and delete its storage
    scripts/kafka status    print the bootstrap address if it is running (exit 0), else exit 3
    scripts/kafka fetch     only fetch the jars into the cache

With KAFKA_BOOTSTRAP=host:port set, nothing is fetched or started: `start` and `status` check that broker instead.

Standard library only: it runs before any virtual environment exists (`--secured` also needs `openssl` 1.1.1+).

Environment:
    KAFKA_BOOTSTRAP        use this broker instead of starting one
    DLQ_SIDECAR_CACHE      cache directory (default ~/.cache/dlq-sidecar); jars go to <cache>/kafka-<version>/libs
    DLQ_KAFKA_STATE_DIR    where the running broker's state file lives (default <cache>/run); lets tests run a second broker
    DLQ_KAFKA_HEAP         JVM heap (default 512m)
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import secrets
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

KAFKA_VERSION = "4.4.0"
HERE = Path(__file__).resolve().parent
POM = HERE / "kafka-pom.xml"
START_TIMEOUT_S = 90.0
# Ports are picked free, then bound by the JVM seconds later: another process may bind one meanwhile.
# Then the start is tried again on new ports.
PORT_ATTEMPTS = 3
_PORT_TAKEN = -1
_BIND_FAILED = "Address already in use"
STOP_TIMEOUT_S = 30.0

LOG4J2_PROPERTIES = """\
# Written by scripts/kafka: the broker logs to stdout, which the script sends to <run dir>/broker.log.
status = warn
appender.console.type = Console
appender.console.name = STDOUT
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.stdout.ref = STDOUT
logger.kafka.name = kafka
logger.kafka.level = info
logger.state.name = state.change.logger
logger.state.level = warn
logger.controller.name = kafka.controller
logger.controller.level = info
logger.zk.name = org.apache.kafka.clients
logger.zk.level = warn
"""


def cache_dir() -> Path:
    return Path(os.environ.get("DLQ_SIDECAR_CACHE", Path.home() / ".cache" / "dlq-sidecar"))


def kafka_home() -> Path:
    return cache_dir() / f"kafka-{KAFKA_VERSION}"


def state_dir() -> Path:
    return Path(os.environ.get("DLQ_KAFKA_STATE_DIR", cache_dir() / "run"))


def state_file() -> Path:
    return state_dir() / "broker.json"


def say(msg: str) -> None:
    print(f"kafka: {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- jars


def fetch_jars() -> Path:
    """Resolve the broker's runtime jars with Maven into the cache; a second call downloads nothing."""
    home = kafka_home()
    libs = home / "libs"
    marker = home / ".complete"
    if marker.exists() and any(libs.glob("kafka_2.13-*.jar")):
        return libs
    if shutil.which("mvn") is None:
        sys.exit(
            "kafka: Maven (mvn) is needed to fetch the broker's jars; install it, or set KAFKA_BOOTSTRAP"
        )
    say(f"fetching Apache Kafka {KAFKA_VERSION} jars from Maven Central into {libs} (once)")
    cache_dir().mkdir(parents=True, exist_ok=True)  # a machine where nothing ran yet
    staging = Path(tempfile.mkdtemp(prefix="kafka-libs-", dir=cache_dir()))
    started = time.monotonic()
    cmd = [
        "mvn",
        "-q",
        "-B",
        "-f",
        str(POM),
        "dependency:copy-dependencies",
        "-DincludeScope=runtime",
        f"-DoutputDirectory={staging}",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-30:])
        sys.exit(
            f"kafka: Maven could not fetch the broker's jars (exit {proc.returncode}); "
            f"run `scripts/kafka fetch` where Maven Central is reachable:\n{tail}"
        )
    if libs.exists():
        shutil.rmtree(libs)
    home.mkdir(parents=True, exist_ok=True)
    staging.rename(libs)
    (home / "log4j2.properties").write_text(LOG4J2_PROPERTIES)
    marker.write_text(f"{KAFKA_VERSION}\n")
    size_mb = sum(p.stat().st_size for p in libs.iterdir()) / 1e6
    say(
        f"fetched {len(list(libs.iterdir()))} jars, {size_mb:.0f} MB, in {time.monotonic() - started:.1f}s"
    )
    return libs


# --------------------------------------------------------------------------- broker protocol probe


def ephemeral_port_range() -> tuple[int, int]:
    """The kernel's range for the source ports of outgoing connections (Linux; else IANA's)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 49152, 65535


# The low end of the ports picked below the ephemeral range (above common services).
PICK_FROM = 15000
# "LOW-HIGH": where free_port picks (each parallel test worker gets a range of its own).
PORT_RANGE_ENV = "DLQ_FREE_PORT_RANGE"


def pick_range() -> range:
    """Where free_port picks: $DLQ_FREE_PORT_RANGE, else from 15000 up to the ephemeral range."""
    given = os.environ.get(PORT_RANGE_ENV, "")
    if given:
        low, _, high = given.partition("-")
        return range(int(low), int(high) + 1)
    return default_pick_range()


def default_pick_range() -> range:
    """From PICK_FROM up to the kernel's ephemeral range (empty when there is no room)."""
    return range(PICK_FROM, ephemeral_port_range()[0])


# The ports free_port gave this process: a second pick before the first is bound could give the same
# one (two servers of one test, each told to listen on "a free port"). Bounded by the range's size.
_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A TCP port free on 127.0.0.1, below the kernel's ephemeral range when there is room.

    A port from the ephemeral range (what binding port 0 gives) can be taken by any outgoing
    connection, as its source port, and is what the next bind to port 0 anywhere may get: between
    the pick and the listener's bind, or while the listener is down (a broker killed and restarted
    on the same ports). Below that range only an explicit bind can take it, and with
    $DLQ_FREE_PORT_RANGE each process sharing the machine (the test workers) picks from its own.
    A process is never given the same port twice.
    """
    candidates = pick_range()
    if len(candidates) >= 100:
        for port in secrets.SystemRandom().sample(candidates, 64):
            if port in _HANDED_OUT:
                continue  # free now, but maybe not yet bound by whoever got it
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
                _HANDED_OUT.add(port)
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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


# --------------------------------------------------------------------------- secured listeners

SCRAM_MECHANISM = "SCRAM-SHA-512"
SCRAM_USER = "dlq-sidecar"
CERT_DAYS = 30


def _openssl(*args: str, cwd: Path) -> None:
    if shutil.which("openssl") is None:
        sys.exit("kafka: --secured needs openssl to generate the test certificates; install it")
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"openssl {args[0]} failed (exit {proc.returncode}):\n{proc.stderr}")


def _self_signed_ca(tls_dir: Path, name: str, common_name: str) -> None:
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-sha256",
        "-days",
        str(CERT_DAYS),
        "-keyout",
        f"{name}.key",
        "-out",
        f"{name}.crt",
        "-subj",
        f"/CN={common_name}",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
        cwd=tls_dir,
    )


def _signed_cert(tls_dir: Path, name: str, common_name: str, extensions: str) -> None:
    """A key and a certificate for it signed by ca.key (extensions from a file: OpenSSL 1.1 and 3)."""
    (tls_dir / f"{name}.ext").write_text(extensions)
    _openssl(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-sha256",
        "-keyout",
        f"{name}.key",
        "-out",
        f"{name}.csr",
        "-subj",
        f"/CN={common_name}",
        cwd=tls_dir,
    )
    _openssl(
        "x509",
        "-req",
        "-in",
        f"{name}.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-sha256",
        "-days",
        str(CERT_DAYS),
        "-extfile",
        f"{name}.ext",
        "-out",
        f"{name}.crt",
        cwd=tls_dir,
    )


def make_tls_material(tls_dir: Path) -> dict[str, str]:
    """A throw-away CA, a broker certificate for 127.0.0.1/localhost and a client certificate.

    Everything is PEM: the broker reads it as a PEM key store (key, then its certificate and the CA)
    and a PEM trust store; librdkafka reads the same files (ssl.ca.location, ssl.certificate.location,
    ssl.key.location). The client key is encrypted (ssl.key.password), as platform teams ship them.
    A second, unrelated CA lets tests check that a client trusting the wrong CA is refused.
    """
    tls_dir.mkdir(parents=True, exist_ok=True)
    _self_signed_ca(tls_dir, "ca", "dlq-sidecar test CA")
    _self_signed_ca(tls_dir, "other-ca", "dlq-sidecar untrusted CA")
    _signed_cert(
        tls_dir,
        "broker",
        "localhost",
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth,clientAuth\n",
    )
    _signed_cert(
        tls_dir,
        "client",
        "dlq-sidecar-client",
        "keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n",
    )
    key_password = secrets.token_urlsafe(12)
    _openssl(
        "pkcs8",
        "-topk8",
        "-v2",
        "aes-256-cbc",
        "-in",
        "client.key",
        "-out",
        "client-encrypted.key",
        "-passout",
        f"pass:{key_password}",
        cwd=tls_dir,
    )
    keystore = tls_dir / "broker-keystore.pem"
    keystore.write_text(
        (tls_dir / "broker.key").read_text()
        + (tls_dir / "broker.crt").read_text()
        + (tls_dir / "ca.crt").read_text()
    )
    for leftover in ("ca.key", "other-ca.key", "broker.csr", "client.csr", "client.key"):
        (tls_dir / leftover).unlink()
    return {
        "ca": str(tls_dir / "ca.crt"),
        "untrusted_ca": str(tls_dir / "other-ca.crt"),
        "client_certificate": str(tls_dir / "client.crt"),
        "client_key": str(tls_dir / "client-encrypted.key"),
        "client_key_password": key_password,
        "broker_keystore": str(keystore),
    }


def secured_setup(run_dir: Path) -> tuple[dict[str, str], list[str], dict[str, object]]:
    """What `--secured` adds: (broker properties, storage-format arguments, state for clients).

    Two listeners beside PLAINTEXT (which stays the inter-broker listener, so the broker needs no
    credentials of its own): SASL_SSL with SCRAM and server-only TLS, and MTLS (protocol SSL) with
    `ssl.client.auth=required`. SCRAM credentials live in the KRaft metadata log; `--add-scram` writes
    them at format time, so the user exists before the broker takes its first connection.
    """
    tls = make_tls_material(run_dir / "tls")
    sasl_port, mtls_port = free_port(), free_port()
    while mtls_port == sasl_port:
        mtls_port = free_port()
    password = secrets.token_urlsafe(18)
    mech = SCRAM_MECHANISM.lower()
    props = {
        "sasl.enabled.mechanisms": SCRAM_MECHANISM,
        f"listener.name.sasl_ssl.{mech}.sasl.jaas.config": (
            "org.apache.kafka.common.security.scram.ScramLoginModule required;"
        ),
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": tls["broker_keystore"],
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": tls["ca"],
        "listener.name.sasl_ssl.ssl.client.auth": "none",
        "listener.name.mtls.ssl.client.auth": "required",
    }
    format_args = ["--add-scram", f"{SCRAM_MECHANISM}=[name={SCRAM_USER},password={password}]"]
    state: dict[str, object] = {
        "sasl_ssl": f"127.0.0.1:{sasl_port}",
        "mtls": f"127.0.0.1:{mtls_port}",
        "sasl_mechanism": SCRAM_MECHANISM,
        "sasl_username": SCRAM_USER,
        "sasl_password": password,
        **{k: v for k, v in tls.items() if k != "broker_keystore"},
    }
    return props, format_args, state


def secured_listeners(state: dict[str, object]) -> tuple[list[str], dict[str, str]]:
    """The listener entries (`name://host:port`) and protocol map entries for `secured_setup`'s state."""
    return (
        [f"SASL_SSL://{state['sasl_ssl']}", f"MTLS://{state['mtls']}"],
        {"SASL_SSL": "SASL_SSL", "MTLS": "SSL"},
    )


# --------------------------------------------------------------------------- start / stop


def new_cluster_id() -> str:
    """A random cluster id (base64url of a UUID) that does not start with "-": the storage tool's
    argument parser would read such an id as an option and fail ("--cluster-id: expected one
    argument"), about one start in 64."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


def java_cmd(libs: Path, main: str, *args: str, heap: str | None = None) -> list[str]:
    java = os.environ.get("JAVA_HOME")
    java_bin = str(Path(java) / "bin" / "java") if java else "java"
    cmd = [java_bin]
    if heap:
        cmd += [f"-Xms{heap}", f"-Xmx{heap}"]
    cmd += [
        "-XX:+UseG1GC",
        "-XX:MaxGCPauseMillis=20",
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={kafka_home() / 'log4j2.properties'}",
        "-cp",
        f"{libs}/*",
        main,
        *args,
    ]
    return cmd


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


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
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


if __name__ == "__main__":
    sys.exit(main())
