"""A single-node Kubernetes cluster that runs pods, for the tests on real pods (tests/node/).

:func:`start_node` starts, all inside a network namespace of its own (tests/nodenet.py) and under one folder:
etcd and kube-apiserver (tests/kubecluster.py), kube-controller-manager, kube-scheduler, containerd (Debian's,
with runc and the CNI bridge) and the kubelet, from the cache scripts/install-kube fills; it imports the pause,
app and sidecar images into containerd, and starts a broker for the pods (two listeners: loopback for the
tests, and one the pods reach on the node IP through a relay). Nothing changes on the host:

* containerd runs in a mount namespace where tmpfs lie over /run and /var/lib (its shim sockets, runc's state,
  CNI's cache vanish with it); the kubelet in one where tmpfs lie over /run, /var/lib and /var/log, and files
  of the node's folder over the three kernel settings it rewrites (vm.overcommit_memory, kernel.panic,
  kernel.panic_on_oops). The kubelet's root dir is a shared mount, so the volumes it mounts reach containerd.
* ``makeIPTablesUtilChains: false``, no kube-proxy; ``oomScoreAdj: 0`` and containerd's
  ``restrict_oom_score_adj`` (root here lacks CAP_SYS_RESOURCE).
* At the end: the kubelet and the controllers stopped, every container killed, containerd stopped, the
  mounts and the pods' cgroups removed, the API server stopped before etcd, the namespace and folder gone.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from sidecar.ops.broker.jars import fetch_jars, java_cmd
from sidecar.ops.broker.process import broker_answers, new_cluster_id
from tests.kubecluster import KubeCluster, start_cluster
from tests.nodenet import Relay, in_netns, network_namespace

NODE_IP = "10.213.0.1"
POD_SUBNET = "10.213.128.0/24"
SERVICE_RANGE = "10.213.192.0/24"
NODE_NAME = "dlq-node"
PAUSE_IMAGE = "localhost/pause:3.10-dlq"
APP_IMAGE_REPO = "localhost/dlq-orders-app"
READY_TIMEOUT_S = 120.0
STOP_WAIT_S = 15.0
# What the kubelet would rewrite, and what else the node could touch: compared before and after.
HOST_SYSCTLS = (
    "vm/overcommit_memory",
    "kernel/panic",
    "kernel/panic_on_oops",
    "vm/panic_on_oom",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
    "net/ipv4/ip_forward",
)


def cache_dir() -> Path:
    return Path(os.environ.get("DLQ_CACHE_DIR", Path.home() / ".cache" / "dlq-sidecar"))


def host_state() -> dict[str, str]:
    """The host's rules, routes, links and kernel settings, as the node must leave them."""

    def run(*command: str) -> str:
        proc = subprocess.run(command, capture_output=True, text=True, check=False)
        return proc.stdout if proc.returncode == 0 else f"exit {proc.returncode}: {proc.stderr}"

    state = {
        "iptables-save": "\n".join(
            line for line in run("iptables-save").splitlines() if not line.startswith("#")
        ),
        "ip route": run("ip", "route", "show", "table", "all"),
        "ip link": "\n".join(
            line.split(" link/")[0] for line in run("ip", "-o", "link", "show").splitlines()
        ),
    }
    for name in HOST_SYSCTLS:
        state[name] = Path("/proc/sys", name).read_text().strip()
    return state


@dataclass
class Node:
    directory: Path
    cluster: KubeCluster
    bootstrap: str  # the broker, for the tests (loopback)
    pod_bootstrap: str  # the same broker, for the pods (the node IP)
    sidecar_image: str
    app_image: str
    host_netns: int = -1  # open file descriptors of the tests' network namespace and the node's
    node_netns: int = -1
    started_s: float = 0.0
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def ctr(self, *args: str, check: bool = True) -> str:
        proc = subprocess.run(
            [
                str(runtime_root() / "usr" / "bin" / "ctr"),
                "--address",
                str(self.directory / "containerd" / "containerd.sock"),
                "--namespace",
                "k8s.io",
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if check:
            assert proc.returncode == 0, f"ctr {args}: {proc.stderr}"
        return proc.stdout

    def log(self, name: str) -> str:
        return (self.directory / f"{name}.log").read_text(errors="replace")

    @contextmanager
    def reach(self, ip: str, port: int) -> Iterator[str]:
        """``host:port`` on the tests' loopback, relayed to ``ip:port`` inside the node (a pod's IP)."""
        from tests.harness import free_port

        local = free_port()
        relay = Relay(self.host_netns, ("127.0.0.1", local), self.node_netns, (ip, port))
        try:
            yield f"127.0.0.1:{local}"
        finally:
            relay.close()


def runtime_root() -> Path:
    return cache_dir() / "node" / "root"


def _write_configs(d: Path, cluster: KubeCluster) -> None:
    cni_bin = runtime_root() / "usr" / "lib" / "cni"
    (d / "cni" / "net.d").mkdir(parents=True)
    (d / "cni" / "net.d" / "10-dlq.conflist").write_text(
        json.dumps(
            {
                "cniVersion": "0.4.0",
                "name": "dlq-node",
                "plugins": [
                    {
                        "type": "bridge",
                        "bridge": "dlqbr0",
                        "isGateway": True,
                        "ipMasq": False,
                        "hairpinMode": True,
                        "ipam": {
                            "type": "host-local",
                            "ranges": [[{"subnet": POD_SUBNET}]],
                            "routes": [{"dst": "0.0.0.0/0"}],
                            "dataDir": str(d / "cni" / "ipam"),
                        },
                    }
                ],
            }
        )
    )
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    (d / "containerd.toml").write_text(
        f"""version = 2
root = "{d}/containerd/root"
state = "{d}/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "{d}/containerd/containerd.sock"
[ttrpc]
  address = "{d}/containerd/containerd.sock.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/containerd/opt"
[{cri}]
  sandbox_image = "{PAUSE_IMAGE}"
  disable_apparmor = true
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  enable_selinux = false
  [{cri}.cni]
    bin_dir = "{cni_bin}"
    conf_dir = "{d}/cni/net.d"
  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri}.containerd.runtimes.runc.options]
        BinaryName = "{runtime_root()}/usr/sbin/runc"
        SystemdCgroup = false
"""
    )
    (d / "resolv.conf").write_text("nameserver 127.0.0.1\n")
    (d / "kubelet.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kubelet.config.k8s.io/v1beta1",
                "kind": "KubeletConfiguration",
                "authentication": {
                    "anonymous": {"enabled": False},
                    "webhook": {"enabled": False},
                },
                "authorization": {"mode": "AlwaysAllow"},
                "address": NODE_IP,
                "readOnlyPort": 0,
                "healthzBindAddress": "127.0.0.1",
                "cgroupDriver": "cgroupfs",
                "failCgroupV1": False,
                "failSwapOn": False,
                "makeIPTablesUtilChains": False,
                "oomScoreAdj": 0,
                "maxOpenFiles": 20000,
                "containerRuntimeEndpoint": f"unix://{d}/containerd/containerd.sock",
                "podLogsDir": str(d / "pod-logs"),
                "resolvConf": str(d / "resolv.conf"),
                "registerNode": True,
                "serializeImagePulls": False,
                "evictionHard": {
                    "memory.available": "1Mi",
                    "nodefs.available": "1%",
                    "imagefs.available": "1%",
                    "nodefs.inodesFree": "1%",
                },
                "imageGCHighThresholdPercent": 100,
                "imageGCLowThresholdPercent": 99,
                "syncFrequency": "10s",
                "fileCheckFrequency": "60s",
                "nodeStatusUpdateFrequency": "4s",
                "shutdownGracePeriod": "0s",
                "logging": {"verbosity": 1},
            }
        )
    )
    for name, value in (
        ("overcommit_memory", "vm/overcommit_memory"),
        ("panic", "kernel/panic"),
        ("panic_on_oops", "kernel/panic_on_oops"),
    ):
        (d / "sysctl").mkdir(exist_ok=True)
        (d / "sysctl" / name).write_text(Path("/proc/sys", value).read_text())


def _kubelet_script(d: Path, cluster: KubeCluster, bin_dir: Path) -> str:
    """The kubelet, in its own mount namespace: tmpfs over the host paths it uses whatever its flags say,
    the node's files over the kernel settings it rewrites."""
    return f"""set -e
mount --make-private /
mount --make-private /proc
mount -t tmpfs -o mode=0755 dlq-node /run
mount -t tmpfs -o mode=0755 dlq-node /var/lib
mount -t tmpfs -o mode=0755 dlq-node /var/log
mount --bind {d}/sysctl/overcommit_memory /proc/sys/vm/overcommit_memory
mount --bind {d}/sysctl/panic /proc/sys/kernel/panic
mount --bind {d}/sysctl/panic_on_oops /proc/sys/kernel/panic_on_oops
exec {bin_dir}/kubelet --config={d}/kubelet.yaml --kubeconfig={cluster.kubeconfig} \\
    --root-dir={d}/kubelet --cert-dir={d}/kubelet-pki --node-ip={NODE_IP} \\
    --hostname-override={NODE_NAME}
"""


def _containerd_script(d: Path) -> str:
    """containerd, in its own mount namespace: tmpfs over /run (its shims' sockets, runc's state) and
    /var/lib (CNI's cache)."""
    return f"""set -e
mount --make-private /
mount -t tmpfs -o mode=0755 dlq-node /run
mount -t tmpfs -o mode=0755 dlq-node /var/lib
export PATH={runtime_root()}/usr/bin:{runtime_root()}/usr/sbin:$PATH
exec containerd --config {d}/containerd.toml
"""


def _start(
    node: Node, name: str, netns: Path, command: list[str], env: dict[str, str] | None = None
) -> None:
    log = node.directory / f"{name}.log"
    with log.open("wb") as out:
        node.processes[name] = subprocess.Popen(
            in_netns(netns, *command),
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )


def _stop(proc: subprocess.Popen[bytes], wait_s: float = STOP_WAIT_S) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)


def _wait(what: str, predicate: Any, node: Node, timeout_s: float = READY_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for name, proc in node.processes.items():
            if proc.poll() is not None:
                raise RuntimeError(
                    f"{name} exited with {proc.returncode}:\n{node.log(name)[-3000:]}"
                )
        if predicate():
            return
        time.sleep(0.2)
    raise RuntimeError(f"timed out after {timeout_s:g} s waiting for {what}")


def _node_ready(cluster: KubeCluster) -> bool:
    try:
        found = cluster.get(f"/api/v1/nodes/{NODE_NAME}")
    except Exception:
        return False
    conditions = {c["type"]: c["status"] for c in found.get("status", {}).get("conditions", [])}
    return conditions.get("Ready") == "True"


@contextmanager
def _pod_broker(
    directory: Path, pod_port: int, test_port: int, controller_port: int
) -> Iterator[str]:
    """A KRaft broker for the node's tests: PLAINTEXT on loopback for the tests, PODS on loopback too,
    advertised as the node IP (the relay in the node's namespace carries it)."""
    libs = fetch_jars()
    run_dir = directory / "kafka"
    run_dir.mkdir()
    props = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": f"1@127.0.0.1:{controller_port}",
        "listeners": (
            f"PLAINTEXT://127.0.0.1:{test_port},PODS://127.0.0.1:{pod_port},"
            f"CONTROLLER://127.0.0.1:{controller_port}"
        ),
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{test_port},PODS://{NODE_IP}:{pod_port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,PODS:PLAINTEXT",
        "log.dirs": str(run_dir / "data"),
        "num.partitions": "1",
        "auto.create.topics.enable": "false",
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "4",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "4",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
    }
    config = run_dir / "server.properties"
    config.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    subprocess.run(
        java_cmd(
            libs,
            "kafka.tools.StorageTool",
            "format",
            "--cluster-id",
            new_cluster_id(),
            "--config",
            str(config),
            "--ignore-formatted",
            heap="256m",
        ),
        capture_output=True,
        check=True,
    )
    log = run_dir / "broker.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            java_cmd(libs, "kafka.Kafka", str(config), heap="384m"),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    bootstrap = f"127.0.0.1:{test_port}"
    try:
        deadline = time.monotonic() + 120
        while not broker_answers(bootstrap):
            assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
            assert time.monotonic() < deadline, "the pods' broker did not answer in 120 s"
            time.sleep(0.2)
        yield bootstrap
    finally:
        _stop(proc, 20)


def _cgroup_dirs(top: Path) -> list[Path]:
    """`top` and every directory under it; one removed meanwhile (the kubelet and containerd still
    clean up theirs) is skipped, where `Path.rglob` raised FileNotFoundError."""
    return [Path(root) for root, _dirs, _files in os.walk(top)]


def _kill_containers(directory: Path) -> None:
    """Every process in the pods' cgroups, then the shims of this node's containerd."""
    for cgroup in Path("/sys/fs/cgroup").glob("*/kubepods*"):
        for found in _cgroup_dirs(cgroup):
            try:
                pids = (found / "cgroup.procs").read_text().split()
            except OSError:
                continue  # removed meanwhile
            for pid in pids:
                with suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
    marker = str(directory / "containerd").encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if b"containerd-shim" in cmdline and marker in cmdline:
            with suppress(ProcessLookupError):
                os.kill(int(entry.name), signal.SIGKILL)


def _remove_cgroups() -> None:
    """The pods' cgroups the kubelet made (cgroupfs driver, cgroup root /), deepest first."""
    deadline = time.monotonic() + 30
    for top in Path("/sys/fs/cgroup").glob("*/kubepods*"):
        # Deepest first, `top` last.
        for directory in sorted(_cgroup_dirs(top), key=lambda p: -len(p.parts)):
            while True:
                try:
                    directory.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)


def _unmount_under(directory: Path) -> None:
    found = subprocess.run(
        ["findmnt", "-rn", "-o", "TARGET"], capture_output=True, text=True, check=True
    ).stdout.split("\n")
    prefix = str(directory) + "/"
    targets = [t.replace("\\x20", " ") for t in found if t.startswith(prefix)]
    for target in sorted(targets, key=len, reverse=True):
        subprocess.run(["umount", "-l", target], check=False)


@contextmanager
def start_node(bin_dir: Path, sidecar_archive: Path, sidecar_image: str) -> Iterator[Node]:
    """The node, Ready, with its images imported and a broker for the pods; removed at the end."""
    from tests.harness import free_port  # the test workers' port ranges

    started = time.monotonic()
    d = Path(tempfile.mkdtemp(prefix="dlqn-", dir="/tmp"))  # short: unix socket paths live here
    app_archives = sorted((cache_dir() / "node" / "images").glob("app-*.tar"))
    assert app_archives, "no app image: run scripts/install-kube"
    app_image = f"{APP_IMAGE_REPO}:{app_archives[-1].stem.removeprefix('app-')}"
    with ExitStack() as stack:
        stack.callback(shutil.rmtree, d, True)
        netns = stack.enter_context(network_namespace(d / "netns", NODE_IP))
        host_fd = os.open("/proc/self/ns/net", os.O_RDONLY)
        stack.callback(os.close, host_fd)
        node_fd = os.open(netns, os.O_RDONLY)
        stack.callback(os.close, node_fd)

        pod_port, test_port, controller_port = free_port(), free_port(), free_port()
        bootstrap = stack.enter_context(_pod_broker(d, pod_port, test_port, controller_port))
        relay = Relay(node_fd, (NODE_IP, pod_port), host_fd, ("127.0.0.1", pod_port))
        stack.callback(relay.close)

        (d / "control").mkdir()
        api_port = free_port()
        api_relay = Relay(host_fd, ("127.0.0.1", api_port), node_fd, ("127.0.0.1", api_port))
        stack.callback(api_relay.close)
        cluster = stack.enter_context(
            start_cluster(
                d / "control",
                bin_dir,
                wrap=in_netns(netns),
                api_port=api_port,
                extra_api_args=[
                    f"--service-cluster-ip-range={SERVICE_RANGE}",
                    # Webhooks are called at their pods' IPs: there is no kube-proxy for service IPs.
                    "--enable-aggregator-routing=true",
                ],
            )
        )
        node = Node(d, cluster, bootstrap, f"{NODE_IP}:{pod_port}", sidecar_image, app_image)
        node.host_netns, node.node_netns = host_fd, node_fd
        _write_configs(d, cluster)

        # The kubelet's root: a shared mount, so that what it mounts in its namespace reaches containerd's.
        (d / "kubelet").mkdir()
        subprocess.run(["mount", "--bind", str(d / "kubelet"), str(d / "kubelet")], check=True)
        subprocess.run(["mount", "--make-rshared", str(d / "kubelet")], check=True)

        def teardown() -> None:
            for name in ("kube-controller-manager", "kube-scheduler", "kubelet"):
                if name in node.processes:
                    _stop(node.processes[name])
            _kill_containers(d)
            if "containerd" in node.processes:
                _stop(node.processes["containerd"])
            _kill_containers(d)
            _unmount_under(d / "kubelet")
            subprocess.run(["umount", "-l", str(d / "kubelet")], check=False)
            _remove_cgroups()

        stack.callback(teardown)
        unshare = ["unshare", "-m", "--propagation", "unchanged", "--", "sh", "-c"]
        _start(node, "containerd", netns, [*unshare, _containerd_script(d)])
        sock = d / "containerd" / "containerd.sock"
        _wait("containerd", lambda: sock.exists() and node.ctr("version", check=False) != "", node)
        for archive in (
            cache_dir() / "node" / "images" / "pause.tar",
            app_archives[-1],
            sidecar_archive,
        ):
            node.ctr("images", "import", "--no-unpack", str(archive))

        kubeconfig = str(cluster.kubeconfig)
        _start(
            node,
            "kube-controller-manager",
            netns,
            [
                str(bin_dir / "kube-controller-manager"),
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                f"--root-ca-file={cluster.ca_file}",
                f"--service-account-private-key-file={d / 'control' / 'sa.key'}",
                f"--service-cluster-ip-range={SERVICE_RANGE}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                "--use-service-account-credentials=false",
                "--v=1",
            ],
        )
        _start(
            node,
            "kube-scheduler",
            netns,
            [
                str(bin_dir / "kube-scheduler"),
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                "--v=1",
            ],
        )
        _start(node, "kubelet", netns, [*unshare, _kubelet_script(d, cluster, bin_dir)])
        _wait("the node to be Ready", lambda: _node_ready(cluster), node)
        node.started_s = time.monotonic() - started
        yield node
