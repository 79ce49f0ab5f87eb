"""The pure delivery core (sans-IO, like h11): no sockets, no trio, no Kafka, no clock.

Owns the delivery rules both engines share (docs/architecture.md lists its modules) and which of
its builds runs: `compiled` and `core_build` tell whether the mypyc-compiled modules were loaded.

Imports the standard library only, and nothing from the rest of `sidecar`; every other layer may
import it (import-linter contracts in pyproject.toml).
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence
from importlib.abc import MetaPathFinder
from importlib.machinery import (
    EXTENSION_SUFFIXES,
    SOURCE_SUFFIXES,
    FileFinder,
    ModuleSpec,
    SourceFileLoader,
)
from types import ModuleType

__all__ = ["PURE_ENV", "compiled", "core_build"]

#: Set (to anything but "" or "0"), the core imports its Python sources, never its extension modules.
PURE_ENV = "DLQ_SIDECAR_PURE"
#: The build's shared library, which every compiled module loads (setup.py's GROUP + "__mypyc").
NATIVE = "_native__mypyc"
#: Why the build beside the sources could not be loaded (then the sources run); None: it could, or none.
_load_error: str | None = None


class _SourcesOnly(MetaPathFinder):
    """Finds this package's modules as Python sources only (ahead of the normal path finder)."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if not fullname.startswith(__name__ + ".") or path is None:
            return None
        for entry in path:
            spec = FileFinder(entry, (SourceFileLoader, SOURCE_SUFFIXES)).find_spec(fullname)
            if spec is not None:
                return spec
        return None


def _use_sources() -> None:
    if not any(isinstance(finder, _SourcesOnly) for finder in sys.meta_path):
        sys.meta_path.insert(0, _SourcesOnly())


# The build can compile the core's modules (all but the package ``__init__`` files) with mypyc into
# extension modules beside their sources (setup.py, ``DLQ_SIDECAR_MYPYC=1``; the image is built so).
# Python imports an extension module in preference to the source beside it; ``DLQ_SIDECAR_PURE=1``
# makes this package import the sources instead (the fallback, and how the tests run both), and a
# build that is there but cannot be loaded (another platform or Python, damaged) falls back too.
if os.environ.get(PURE_ENV, "") not in ("", "0"):
    _use_sources()
else:
    try:
        importlib.import_module(f"{__name__}.{NATIVE}")
    except ModuleNotFoundError:
        pass  # not built: the sources are all there is
    except ImportError as exc:
        _load_error = str(exc)
        _use_sources()


def compiled() -> bool:
    """Whether the core's hot path (the ledger) runs as mypyc-compiled extension modules."""
    from sidecar.core.ledger import partition

    return (partition.__file__ or "").endswith(tuple(EXTENSION_SUFFIXES))


def core_build() -> str:
    """``"compiled core"`` or ``"pure Python core"``: for ``--version`` and the start-up log.

    After a build that could not be loaded: ``"pure Python core; the compiled core did not load:
    <the import error>"``.
    """
    if compiled():
        return "compiled core"
    if _load_error is not None:
        return f"pure Python core; the compiled core did not load: {_load_error}"
    return "pure Python core"
