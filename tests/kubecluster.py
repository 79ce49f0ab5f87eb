"""A real Kubernetes API server for tests: etcd and kube-apiserver on loopback, and a small client for it.

Both binaries are built from source into the cache by scripts/install-kube (found through $DLQ_KUBE_BIN
or ~/.cache/dlq-sidecar/bin). :func:`start_cluster` starts etcd, then kube-apiserver with:

* ``--advertise-address=127.0.0.1 --endpoint-reconciler-type=none`` (a loopback advertise address is
  refused unless the server keeps no Endpoints of its own);
* ``--cert-dir`` (the server makes its own serving certificate; the client trusts that file);
* ``--token-auth-file`` with one static token in ``system:masters`` (helm's kubeconfig uses it);
* a service-account signing key made here, ``--authorization-mode=RBAC``.

There is no kubelet, scheduler or controller-manager: nothing runs, and a Deployment makes no Pods;
admission (webhooks included) runs on every write, so the stored objects are what is checked.
kube-apiserver's graceful shutdown takes more than 10 s on SIGTERM: :meth:`KubeCluster.stop` waits a
bounded time, then kills (the data directory is thrown away anyway).
"""

from __future__ import annotations

import http.client
import json
import os
import secrets
import shutil
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from sidecar.ops.broker import free_port

STOP_WAIT_S = 5.0
START_TIMEOUT_S = 180.0


def kube_bin_dir() -> Path | None:
    """Where etcd and kube-apiserver are: $DLQ_KUBE_BIN, else the cache scripts/install-kube fills."""
    explicit = os.environ.get("DLQ_KUBE_BIN")
    directory = Path(explicit) if explicit else Path.home() / ".cache" / "dlq-sidecar" / "bin"
    if all(os.access(directory / name, os.X_OK) for name in ("etcd", "kube-apiserver")):
        return directory
    return None


class ApiError(Exception):
    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(status, body.get("message", body))
        self.status = status
        self.body = body

    @property
    def message(self) -> str:
        return str(self.body.get("message", ""))


@dataclass
class KubeCluster:
    directory: Path
    url: str
    token: str
    ca_file: Path
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def port(self) -> int:
        return int(self.url.rpartition(":")[2])

    @property
    def kubeconfig(self) -> Path:
        return self.directory / "kubeconfig"

    def _context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_file))

    def request(
        self, method: str, path: str, body: object = None, content_type: str = "application/json"
    ) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method)
        request.add_header("Authorization", f"Bearer {self.token}")
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(request, context=self._context(), timeout=60) as response:
                payload = response.read()
        except urllib.error.HTTPError as exc:
            with exc:
                text = exc.read()
            try:
                parsed = json.loads(text)
            except ValueError:
                parsed = {"message": text.decode("utf-8", "replace")}
            raise ApiError(exc.code, parsed) from None
        return json.loads(payload) if payload else None

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def create(self, path: str, obj: dict[str, Any]) -> Any:
        return self.request("POST", path, obj)

    def delete(self, path: str) -> Any:
        return self.request("DELETE", path)

    def exists(self, path: str) -> bool:
        try:
            self.get(path)
        except ApiError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def namespace(self, name: str, labels: dict[str, str] | None = None) -> None:
        """A namespace and its `default` ServiceAccount (made by the controller-manager, which is not here;
        the ServiceAccount admission plugin refuses pods without it)."""
        self.create("/api/v1/namespaces", {"metadata": {"name": name, "labels": labels or {}}})
        self.create(f"/api/v1/namespaces/{name}/serviceaccounts", {"metadata": {"name": "default"}})

    def apply_crds(self, files: list[Path]) -> None:
        """Create CustomResourceDefinitions and wait until each is Established."""
        names = []
        for path in files:
            crd = yaml.safe_load(path.read_text())
            self.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
            names.append(crd["metadata"]["name"])
        deadline = time.monotonic() + 60
        for name in names:
            while True:
                crd = self.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
                found = (crd.get("status") or {}).get("conditions") or []
                conditions = {c["type"]: c["status"] for c in found}
                if conditions.get("Established") == "True":
                    break
                assert time.monotonic() < deadline, f"CRD {name} not Established: {conditions}"
                time.sleep(0.2)

    def stop(self) -> None:
        for proc in reversed(self.processes):  # the API server first, then etcd
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=STOP_WAIT_S)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=30)


def _wait_ready(
    cluster: KubeCluster, processes: list[subprocess.Popen[bytes]], logs: list[Path]
) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    last: object = None
    while time.monotonic() < deadline:
        for proc, log in zip(processes, logs, strict=True):
            if proc.poll() is not None:
                tail = log.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode}:\n{tail}")
        if cluster.ca_file.exists():
            connection = http.client.HTTPSConnection(
                "127.0.0.1", cluster.port, context=cluster._context(), timeout=5
            )
            try:
                connection.request(
                    "GET", "/readyz", headers={"Authorization": f"Bearer {cluster.token}"}
                )
                response = connection.getresponse()
                response.read()
                if response.status == 200:
                    return
                last = f"/readyz answered {response.status}"
            except OSError as exc:  # not listening yet, or its certificate not written yet
                last = exc
            finally:
                connection.close()
        time.sleep(0.5)
    raise RuntimeError(f"kube-apiserver not ready in {START_TIMEOUT_S:g} s: {last}")


@contextmanager
def start_cluster(
    directory: Path,
    bin_dir: Path,
    wrap: list[str] | None = None,
    api_port: int | None = None,
    extra_api_args: list[str] | None = None,
) -> Iterator[KubeCluster]:
    """etcd and kube-apiserver, each started as ``wrap + command`` (e.g. inside a network namespace, with
    ``api_port`` relayed to the tests' loopback), the API server with ``extra_api_args`` too."""
    etcd_port, etcd_peer_port = free_port(), free_port()
    api_port = api_port or free_port()
    token = secrets.token_hex(16)
    (directory / "tokens.csv").write_text(f"{token},admin,admin-uid,system:masters\n")
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    (directory / "sa.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    (directory / "sa.pub").write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    etcd_url = f"http://127.0.0.1:{etcd_port}"
    peer_url = f"http://127.0.0.1:{etcd_peer_port}"
    etcd_args = [
        str(bin_dir / "etcd"),
        f"--data-dir={directory / 'etcd'}",
        f"--listen-client-urls={etcd_url}",
        f"--advertise-client-urls={etcd_url}",
        f"--listen-peer-urls={peer_url}",
        f"--initial-advertise-peer-urls={peer_url}",
        f"--initial-cluster=default={peer_url}",
        "--log-level=warn",
    ]
    api_args = [
        str(bin_dir / "kube-apiserver"),
        f"--etcd-servers={etcd_url}",
        f"--secure-port={api_port}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        "--endpoint-reconciler-type=none",
        f"--cert-dir={directory / 'certs'}",
        f"--token-auth-file={directory / 'tokens.csv'}",
        "--authorization-mode=RBAC",
        "--service-account-issuer=https://kubernetes.default.svc",
        f"--service-account-key-file={directory / 'sa.pub'}",
        f"--service-account-signing-key-file={directory / 'sa.key'}",
        "--v=1",
    ]
    api_args += extra_api_args or []
    if not any(arg.startswith("--service-cluster-ip-range=") for arg in api_args):
        api_args.append("--service-cluster-ip-range=10.96.0.0/16")
    cluster = KubeCluster(
        directory=directory,
        url=f"https://127.0.0.1:{api_port}",
        token=token,
        ca_file=directory / "certs" / "apiserver.crt",
    )
    logs = [directory / "etcd.log", directory / "kube-apiserver.log"]
    try:
        for args, log in zip((etcd_args, api_args), logs, strict=True):
            with log.open("wb") as out:
                cluster.processes.append(
                    subprocess.Popen([*(wrap or []), *args], stdout=out, stderr=subprocess.STDOUT)
                )
        _wait_ready(cluster, cluster.processes, logs)
        cluster.kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [
                        {
                            "name": "test",
                            "cluster": {
                                "server": cluster.url,
                                "certificate-authority": str(cluster.ca_file),
                            },
                        }
                    ],
                    "users": [{"name": "admin", "user": {"token": token}}],
                    "contexts": [{"name": "test", "context": {"cluster": "test", "user": "admin"}}],
                    "current-context": "test",
                }
            )
        )
        cluster.kubeconfig.chmod(0o600)
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(directory / "etcd", ignore_errors=True)
