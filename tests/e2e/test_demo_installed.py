"""`dlq-sidecar demo` from an installed wheel: built from this checkout, installed into a fresh venv, run
from outside the checkout against the session's broker.  Both wheels: the pure-Python one (the default
build) and the one with the core compiled by mypyc (``DLQ_SIDECAR_MYPYC=1``, as the image builds it).

The venv gets the wheel only (`--no-deps`); its dependencies come from the test's own environment through
a path entry, so the test needs no package index. That entry is a plain directory on `sys.path`: the
checkout's editable install (a meta-path finder started from a `.pth` file there) is not loaded, and the
test proves that `sidecar` is imported from the new venv.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import time
import zipfile
from pathlib import Path

import pytest

from tests.e2e.test_demo import summary_counts
from tests.harness import ROOT

pytestmark = pytest.mark.slow


def _run(cmd: list[str], cwd: Path, timeout_s: float, **env: str) -> str:
    proc = subprocess.run(
        cmd,
        cwd=cwd,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{cmd} exited with {proc.returncode}:\n{out}"
    return out


@pytest.mark.parametrize("build", ["pure", "compiled"])
def test_demo_runs_from_an_installed_wheel(
    bootstrap: str, unique: str, tmp_path: Path, build: str
) -> None:
    started = time.monotonic()
    wheels = tmp_path / "wheels"
    _run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(ROOT)],
        tmp_path,
        240,
        DLQ_SIDECAR_MYPYC="1" if build == "compiled" else "0",
    )
    (wheel,) = wheels.glob("dlq_sidecar-*.whl")
    abi = f"cp{sys.version_info.major}{sys.version_info.minor}"
    tag = f"{abi}-{abi}-" if build == "compiled" else "py3-none-any"
    assert tag in wheel.name, wheel.name
    with zipfile.ZipFile(wheel) as archive:
        libraries = sorted(name for name in archive.namelist() if name.endswith(".so"))
        assert "sidecar/core/ledger/partition.py" in archive.namelist()  # the fallback
    if build == "compiled":
        assert any(name.startswith("sidecar/core/_native__mypyc.") for name in libraries), libraries
        assert any(name.startswith("sidecar/core/ledger/partition.") for name in libraries)
        assert all(name.startswith("sidecar/core/") for name in libraries), libraries
    else:
        assert libraries == []

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp_path, 60)
    python = venv / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", str(python)]
    _run([*pip, "install", "-q", "--no-deps", str(wheel)], tmp_path, 120)
    purelib = Path(
        _run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            tmp_path,
            30,
        ).strip()
    )
    (purelib / "dlq-sidecar-test-deps.pth").write_text(sysconfig.get_path("purelib") + "\n")

    imported = _run([str(python), "-c", "import sidecar; print(sidecar.__file__)"], tmp_path, 30)
    assert Path(imported.strip()).is_relative_to(purelib), imported
    core = "compiled core" if build == "compiled" else "pure Python core"
    version = _run(
        [str(venv / "bin" / "dlq-sidecar"), "--version"], tmp_path, 30, DLQ_SIDECAR_PURE=""
    )
    assert version.strip().endswith(f"({core})"), version
    # The compiled wheel ships the sources too: the fallback the switch forces.
    forced = _run(
        [str(venv / "bin" / "dlq-sidecar"), "--version"], tmp_path, 30, DLQ_SIDECAR_PURE="1"
    )
    assert forced.strip().endswith("(pure Python core)"), forced

    topic = f"orders-{unique}"
    out = _run(
        [str(venv / "bin" / "dlq-sidecar"), "demo", "--records", "50", "--topic", topic],
        tmp_path,
        120,
        KAFKA_BOOTSTRAP=bootstrap,
        COLUMNS="120",
    )
    # The bundled app and the config come from the package, not from a checkout.
    assert f"starting the example app {purelib}/sidecar/ops/demo/data/example_app.py" in out, out
    assert str(ROOT) not in out, out
    assert "dlq-sidecar demo: 50 orders in" in out, out
    assert "MISMATCH" not in out, out
    rows = summary_counts(out)
    assert rows["DLQ records written"][0] == rows["DLQ records written"][1], out
    assert rows["DLQ records written"][0] > 0, out
    elapsed_s = time.monotonic() - started
    assert elapsed_s < 180, f"wheel, venv and demo took {elapsed_s:.1f}s"
