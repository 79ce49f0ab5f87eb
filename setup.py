"""The build's one switch: the pure core compiled by mypyc, or not.  The metadata is in pyproject.toml.

    DLQ_SIDECAR_MYPYC unset or 0   pure Python: a universal wheel, no compiler needed (`pip install .`,
                                   the editable install of `make venv`)
    DLQ_SIDECAR_MYPYC=1            sidecar/core compiled by mypyc into extension modules, shipped beside
                                   their sources (a platform wheel: `make wheel`, the container image,
                                   `make compiled` in place).  Needs mypy and a C compiler; fails if it
                                   cannot compile rather than fall back quietly

Compiled are every module of sidecar/core but the package ``__init__`` files: `sidecar.core` itself
chooses between the extension modules and the sources at import (``DLQ_SIDECAR_PURE=1`` forces the
sources) and tells which it loaded (`sidecar.core.compiled`).  In pip's isolated build environment
mypy is asked for as a build requirement (setuptools' backend installs what ``setup_requires`` names
before it builds), so ``DLQ_SIDECAR_MYPYC=1 pip install .`` works where a compiler is.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from setuptools import setup

SWITCH = "DLQ_SIDECAR_MYPYC"
# The mypy that compiles; the image's pin is in requirements/build.txt.
MYPY = "mypy>=1.10"
# The commands that build extension modules; the others (egg_info, dist_info, sdist) only describe.
BUILDING = {"build", "build_ext", "bdist_wheel", "editable_wheel", "install", "develop"}
ROOT = Path(__file__).resolve().parent
# The compiled modules' shared library: sidecar/core/_native__mypyc.<ABI>.so, inside the package (a
# top-level module would be found only where the checkout's root is on sys.path).
GROUP = "sidecar.core._native"
LIBRARY_GLOB = "sidecar/core/_native__mypyc.*"


def compiled_sources() -> list[str]:
    """sidecar/core's modules, package __init__ files left out, as paths relative to the root."""
    core = ROOT / "sidecar" / "core"
    return sorted(
        str(path.relative_to(ROOT)) for path in core.rglob("*.py") if path.name != "__init__.py"
    )


def main() -> None:
    mode = os.environ.get(SWITCH, "0")
    if mode not in ("", "0", "1"):
        sys.exit(f"setup.py: {SWITCH} must be 0 or 1, got {mode!r}")
    if mode != "1":
        setup()
        return
    try:
        from mypyc.build import mypycify
    except ImportError:
        if BUILDING & set(sys.argv[1:]):
            sys.exit(
                f"setup.py: {SWITCH}=1 needs mypy ({MYPY}) where it builds: install it, or let "
                "pip build in its isolated environment (no --no-build-isolation)"
            )
        setup(setup_requires=[MYPY])
        return
    if not BUILDING & set(sys.argv[1:]):
        setup()  # metadata only: nothing to compile
        return
    os.chdir(ROOT)  # mypyc names modules by their paths
    setup(ext_modules=mypycify(compiled_sources(), opt_level="3", group_name=GROUP))
    if {"--inplace", "-i"} & set(sys.argv[1:]):
        # The shared library's time is the build's: a source newer than it was edited after
        # (tests/conftest.py refuses to run then).  A source touched but unchanged is not relinked.
        for library in ROOT.glob(LIBRARY_GLOB):
            library.touch()


# setuptools runs this file as __main__; tests/unit/test_compiled_core.py imports it for compiled_sources.
if __name__ == "__main__":
    main()
