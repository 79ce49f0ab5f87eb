"""The container image's pinned, hash-checked dependencies (requirements/*.txt, used by the Dockerfile).

No Docker engine here to build the image; these check the files it installs from: every requirement
pinned with `==` and carrying at least one sha256 hash, nothing that points pip elsewhere, and the pins
covering (and satisfying) pyproject.toml's runtime dependencies and build backend.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
REQUIREMENTS = ROOT / "requirements"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PIN = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>[^\s;\\]+)(?P<rest>.*)$")
HASH = re.compile(r"--hash=sha256:[0-9a-f]{64}\b")


def entries(path: Path) -> list[str]:
    """The file's requirement entries, continuation lines joined, comments and blanks dropped."""
    logical = re.sub(r"\\\n", " ", path.read_text())
    out = []
    for raw in logical.splitlines():
        line = raw.split(" #", 1)[0].strip()
        if line and not line.startswith("#"):
            out.append(line)
    return out


def pins(path: Path) -> dict[str, Version]:
    result = {}
    for entry in entries(path):
        match = PIN.match(entry)
        assert match, f"{path.name}: not pinned with ==: {entry[:80]}"
        result[canonicalize_name(match["name"])] = Version(match["version"])
    return result


@pytest.mark.parametrize("name", ["image.txt", "build.txt"])
def test_every_requirement_is_pinned_and_hashed(name: str) -> None:
    path = REQUIREMENTS / name
    found = entries(path)
    assert found, f"{name} is empty"
    for entry in found:
        assert not entry.startswith("-"), (
            f"{name}: an option line ({entry}) changes where pip looks"
        )
        match = PIN.match(entry)
        assert match, f"{name}: not pinned with ==: {entry[:80]}"
        assert HASH.search(match["rest"]), f"{name}: {match['name']} has no --hash=sha256:"
        assert "*" not in match["version"], f"{name}: {match['name']} has a wildcard pin"


def test_the_image_pins_cover_pyprojects_dependencies() -> None:
    pinned = pins(REQUIREMENTS / "image.txt")
    for spec in PYPROJECT["project"]["dependencies"]:
        req = Requirement(spec)
        name = canonicalize_name(req.name)
        assert name in pinned, f"requirements/image.txt lacks {req.name} (regenerate it)"
        assert req.specifier.contains(pinned[name], prereleases=True), (
            f"requirements/image.txt pins {req.name}=={pinned[name]}, outside {req.specifier}"
        )


def test_the_build_pins_cover_the_build_backend() -> None:
    pinned = pins(REQUIREMENTS / "build.txt")
    for spec in PYPROJECT["build-system"]["requires"]:
        req = Requirement(spec)
        name = canonicalize_name(req.name)
        assert name in pinned, f"requirements/build.txt lacks {req.name} (regenerate it)"
        assert req.specifier.contains(pinned[name], prereleases=True), (req, pinned[name])


def test_dependency_checks_reject_what_they_should() -> None:
    """The parsers above catch an unpinned, an unhashed and a ranged line."""
    assert PIN.match("trio>=0.25") is None
    assert not HASH.search(" --hash=md5:abc")
    match = PIN.match("trio==0.35.0 --hash=sha256:" + "0" * 64)
    assert match is not None and HASH.search(match["rest"])


def test_the_dockerfile_installs_with_require_hashes() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "--require-hashes -r /requirements/image.txt" in dockerfile
    assert "--require-hashes --no-deps -r requirements/build.txt" in dockerfile
    # The project's own wheel is built without fetching an unpinned build backend.
    assert "--no-build-isolation" in dockerfile
    ignored = (ROOT / ".dockerignore").read_text().splitlines()
    assert {"!requirements/image.txt", "!requirements/build.txt"} <= set(ignored)
