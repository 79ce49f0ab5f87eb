"""`dlq-sidecar console` over plain HTTP (no browser): what it refuses and the headers it sends.

The console runs as a child process against the real broker, once read-only and once with a token from
a file; requests are plain `http.client` calls, as a script or another site would send them.
"""

from __future__ import annotations

import http.client
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlencode

from sidecar.ops.broker import free_port
from tests.dlqwriters import wait_for
from tests.kafkatools import Broker, Rec


@contextmanager
def _console(broker: Broker, tmp: Path, *args: str) -> Iterator[tuple[int, Path]]:
    port = free_port()
    log = tmp / f"console-{port}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sidecar",
                "console",
                "--bootstrap",
                broker.bootstrap,
                "--port",
                str(port),
                *args,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for(lambda: b"serving on" in log.read_bytes(), 60, "the console", proc, log)
        yield port, log
    finally:
        proc.terminate()
        # SIGTERM stops it cleanly: exit 0.
        assert proc.wait(15) == 0, log.read_text(errors="replace")[-2000:]


def _call(
    port: int,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, str], str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read().decode()
    finally:
        conn.close()


def _form(**fields: str) -> tuple[bytes, dict[str, str]]:
    return urlencode(fields).encode(), {"content-type": "application/x-www-form-urlencoded"}


def _csrf(html: str) -> str:
    match = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert match, html[:500]
    return match.group(1)


def test_a_read_only_console_opens_no_session_and_sends_its_security_headers(
    broker: Broker, tmp_path: Path
) -> None:
    dlq = broker.create_topic(f"dlq.http-{uuid.uuid4().hex[:8]}", partitions=1)
    broker.produce(dlq, [Rec(key=b"k", value=b"v", headers=(), partition=0)])
    with _console(broker, tmp_path, "--read-only") as (port, log):
        assert b"read-only" in log.read_bytes() and b"token" not in log.read_bytes()
        status, headers, html = _call(port, "GET", f"/topics/{dlq}/records")
        assert status == 200
        assert "script-src 'self'" in headers["content-security-policy"]
        assert headers["x-frame-options"] == "DENY"
        body, form_headers = _form(token="anything", who="me", csrf=_csrf(html))
        status, _h, page = _call(port, "POST", "/login", body, form_headers)
        assert status == 403 and "read-only" in page
        body, form_headers = _form(record="0:0", csrf=_csrf(html))
        status, _h, page = _call(port, "POST", f"/topics/{dlq}/redrive", body, form_headers)
        assert status == 403 and "read-only" in page
        # Limits on what one request may ask for, with the CLI's own words for bad filters.
        status, _h, page = _call(port, "GET", f"/topics/{dlq}/records?size=5000")
        assert status == 400 and "size must be between 1 and 200" in page
        status, _h, page = _call(port, "GET", f"/topics/{dlq}/records?since=soon")
        assert status == 400 and "bad time" in page
        # A decoded-field filter without a registry is refused, not ignored; no field input shown.
        assert 'name="field"' not in html
        status, _h, page = _call(port, "GET", f"/topics/{dlq}/records?field=customer.id%3D42")
        assert status == 400 and "needs a schema registry" in page


def test_a_write_needs_the_token_the_csrf_value_and_this_site(
    broker: Broker, tmp_path: Path
) -> None:
    dlq = broker.create_topic(f"dlq.http-{uuid.uuid4().hex[:8]}", partitions=1)
    token_file = tmp_path / "token"
    token_file.write_text("a-token-from-a-file-" + uuid.uuid4().hex)
    with _console(broker, tmp_path, "--token-file", str(token_file)) as (port, log):
        assert token_file.read_text().encode() not in log.read_bytes()  # never printed
        _s, _h, html = _call(port, "GET", "/")
        csrf = _csrf(html)
        host = {"host": f"127.0.0.1:{port}"}
        # No CSRF value, or one from another session: refused before anything else.
        body, form_headers = _form(token=token_file.read_text(), who="me")
        assert _call(port, "POST", "/login", body, {**form_headers, **host})[0] == 403
        # From another site (Origin): refused even with the right CSRF value.
        body, form_headers = _form(token=token_file.read_text(), who="me", csrf=csrf)
        evil = {**form_headers, **host, "origin": "http://evil.example"}
        status, _h, page = _call(port, "POST", "/login", body, evil)
        assert status == 403 and "another site" in page
        # Too large a form.
        big, form_headers = _form(csrf=csrf, record="x" * 70_000)
        assert _call(port, "POST", f"/topics/{dlq}/redrive", big, form_headers)[0] == 413
        # Without a session, a redrive is refused; with the token, the session cookie opens.
        body, form_headers = _form(record="0:0", csrf=csrf)
        status, _h, page = _call(port, "POST", f"/topics/{dlq}/redrive", body, form_headers)
        assert status == 403 and "token" in page
        body, form_headers = _form(token=token_file.read_text(), who="Ada", csrf=csrf)
        status, headers, _page = _call(port, "POST", "/login", body, {**form_headers, **host})
        assert status == 303
        cookie = headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")
        session = cookie.split(";", 1)[0]
        _s, _h, html = _call(port, "GET", "/", headers={"cookie": session})
        assert "Ada" in html
        # The anonymous CSRF value does not carry over to the session.
        body, form_headers = _form(record="0:0", csrf=csrf)
        status, _h, page = _call(
            port, "POST", f"/topics/{dlq}/redrive", body, {**form_headers, "cookie": session}
        )
        assert status == 403 and "CSRF" in page


def test_bad_arguments_exit_2_with_one_line(broker: Broker, tmp_path: Path) -> None:
    empty = tmp_path / "empty-token"
    empty.write_text("")
    env = {k: v for k, v in os.environ.items() if k not in ("KAFKA_BOOTSTRAP", "DLQ_CONSOLE_TOKEN")}
    for args, message in (
        ([], "no broker"),
        (
            ["--bootstrap", broker.bootstrap, "--token-file", str(tmp_path / "missing")],
            "cannot read",
        ),
        (["--bootstrap", broker.bootstrap, "--token-file", str(empty)], "is empty"),
        (["--bootstrap", broker.bootstrap, "--port", "70000"], "--port"),
        (
            ["--bootstrap", broker.bootstrap, "-X", "sasl.password=${DLQ_CONSOLE_UNSET_VAR}"],
            "environment variable DLQ_CONSOLE_UNSET_VAR is not set",
        ),
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "sidecar", "console", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
            check=False,
        )
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.startswith("dlq-sidecar console: ") and message in proc.stderr
        assert "Traceback" not in proc.stderr
