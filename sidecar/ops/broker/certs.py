"""The secured listeners' material: a CA and certificates made with openssl, the SCRAM user."""

from __future__ import annotations

import secrets
import shutil
import subprocess
import sys
from pathlib import Path

from .ports import free_port

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
