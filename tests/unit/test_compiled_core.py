"""The core compiled by mypyc, or its sources: what is loaded, and the switch that forces the sources.

`make compiled` builds the core's extension modules in place (setup.py, ``DLQ_SIDECAR_MYPYC=1``);
CI builds them and runs the suite against them, then `make unit-pure` runs the unit tests again with
``DLQ_SIDECAR_PURE=1`` (the sources, though the extension modules sit beside them).  Without a
build every test here checks the sources are what runs.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
import subprocess
import sys
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path
from types import ModuleType

import sidecar.core
from sidecar.core import NATIVE, PURE_ENV, compiled, core_build

ROOT = Path(__file__).resolve().parents[2]


def _setup_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("_dlq_sidecar_setup", ROOT / "setup.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # defines compiled_sources; builds nothing (not __main__)
    return module


def _compiled_names() -> list[str]:
    """The modules setup.py compiles, as module names."""
    paths = _setup_module().compiled_sources()
    return [path.removesuffix(".py").replace(os.sep, ".") for path in paths]


def _is_extension(module: ModuleType) -> bool:
    return (module.__file__ or "").endswith(tuple(EXTENSION_SUFFIXES))


def _built(name: str) -> bool:
    """An extension module for `name` sits beside its source (what `make compiled` leaves)."""
    source = ROOT / (name.replace(".", os.sep) + ".py")
    return any(source.with_suffix(suffix).exists() for suffix in EXTENSION_SUFFIXES)


def _forced_pure() -> bool:
    return os.environ.get(PURE_ENV, "") not in ("", "0")


def test_setup_compiles_the_core_modules_and_no_package_init() -> None:
    names = _compiled_names()
    assert "sidecar.core.ledger.partition" in names
    assert "sidecar.core.wire.requests" in names
    assert "sidecar.core.commitstate" in names
    assert all(name.startswith("sidecar.core.") for name in names)
    assert not [name for name in names if name.endswith("__init__")]


def test_the_package_looks_for_the_library_setup_builds() -> None:
    setup = _setup_module()
    package, _, group = setup.GROUP.rpartition(".")
    assert package == "sidecar.core"
    assert f"{group}__mypyc" == NATIVE
    assert f"sidecar/core/{NATIVE}.*" == setup.LIBRARY_GLOB


def test_a_build_that_cannot_be_loaded_falls_back_to_the_sources(tmp_path: Path) -> None:
    # A copy of the package whose "build" is not a shared library at all (as one made for another
    # platform would fail to load): the sources run, and the build line says why.
    shutil.copytree(
        ROOT / "sidecar", tmp_path / "sidecar", ignore=shutil.ignore_patterns("*.so", "__pycache__")
    )
    suffix = EXTENSION_SUFFIXES[0]
    (tmp_path / "sidecar" / "core" / f"{NATIVE}{suffix}").write_bytes(b"not a shared library")
    (tmp_path / "sidecar" / "core" / "ledger" / f"partition{suffix}").write_bytes(b"nor this")
    env = {key: value for key, value in os.environ.items() if key != PURE_ENV}
    env["PYTHONPATH"] = str(tmp_path)
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sidecar.core as core, sidecar.core.ledger.partition as p;"
            " print(p.__file__); print(core.core_build())",
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    where, build = done.stdout.splitlines()
    assert where == str(tmp_path / "sidecar" / "core" / "ledger" / "partition.py")
    assert build.startswith("pure Python core; the compiled core did not load: "), build


def test_what_is_loaded_is_the_build_unless_the_sources_are_forced() -> None:
    names = _compiled_names()
    modules = {name: importlib.import_module(name) for name in names}
    loaded = {name for name, module in modules.items() if _is_extension(module)}
    built = {name for name in names if _built(name)}
    if _forced_pure():
        assert loaded == set()
    else:
        # Python imports an extension module in preference to the source beside it.
        assert loaded == built
    assert loaded in (set(), set(names)), "a partly compiled core: rebuild with `make compiled`"
    assert compiled() is bool(loaded)
    assert core_build() == ("compiled core" if loaded else "pure Python core")


def test_the_package_init_files_are_always_sources() -> None:
    import sidecar.core.ledger
    import sidecar.core.wire

    for package in (sidecar.core, sidecar.core.ledger, sidecar.core.wire):
        assert (package.__file__ or "").endswith("__init__.py"), package.__file__


def test_compiled_classes_are_native_and_the_sources_plain() -> None:
    from sidecar.core.ledger import Attempt, PartitionLedger

    # A mypyc native class has no __dict__ for its instances and no __slots__ attribute of its own;
    # the source class keeps the __slots__ it declares.
    if compiled():
        assert not hasattr(Attempt, "__slots__")
        assert not hasattr(Attempt("t", 0, 1, "id", 1, 2, None, None), "__dict__")
        assert _is_extension(sys.modules[PartitionLedger.__module__])
    else:
        assert Attempt.__slots__ == Attempt._FIELDS


def test_the_command_line_names_the_core_it_loaded_and_the_switch_forces_the_sources(
    tmp_path: Path,
) -> None:
    # Run from outside the checkout: the build's shared library must be found through the package.
    env = {key: value for key, value in os.environ.items() if key not in (PURE_ENV, "PYTHONPATH")}

    def version(extra: dict[str, str]) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "sidecar", "--version"],
            env={**env, **extra},
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
            cwd=tmp_path,
        )
        return done.stdout.strip()

    built = all(_built(name) for name in _compiled_names())
    expected = "compiled core" if built else "pure Python core"
    assert version({}) == f"dlq-sidecar {sidecar.__version__} ({expected})"
    assert version({PURE_ENV: "1"}) == f"dlq-sidecar {sidecar.__version__} (pure Python core)"
    assert version({PURE_ENV: "0"}) == f"dlq-sidecar {sidecar.__version__} ({expected})"
