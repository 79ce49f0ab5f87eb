"""The container image built from the repository's Dockerfile, for the tests that run it.

:func:`sidecar_image` runs scripts/build-image (podman, runc, a Debian-made Python base; it builds only
when no image of the checkout's source hash exists) and returns the image's reference and, on request, its
docker-archive in the cache (what the test node's containerd imports). :func:`podman_command` is a
``podman run`` line with the flags this kind of machine needs (runc: crun refuses hybrid cgroups; open-file
and process limits root may set here).
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.harness import ROOT

BUILD_TIMEOUT_S = 1200.0


@dataclass(frozen=True)
class BuiltImage:
    reference: str
    archive: Path | None


def sidecar_image(save: bool = False) -> BuiltImage:
    """The image of this checkout (built the first time; minutes), its archive too with ``save``."""
    proc = subprocess.run(
        [str(ROOT / "scripts" / "build-image"), *(["--save"] if save else [])],
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
        check=False,
    )
    assert proc.returncode == 0, f"scripts/build-image failed:\n{proc.stderr[-4000:]}"
    lines = proc.stdout.split()
    return BuiltImage(lines[0], Path(lines[1]) if save else None)


def podman_command(*args: str) -> list[str]:
    return ["podman", "--runtime", "runc", *args]


def podman_run_command(image: str, name: str, *options: str) -> list[str]:
    """``podman run`` of ``image`` in the foreground (its exit code is the container's)."""
    return podman_command(
        "run",
        "--rm",
        "--name",
        name,
        "--ulimit",
        "nofile=20000:20000",
        "--ulimit",
        "nproc=4096:4096",
        *options,
        image,
    )
