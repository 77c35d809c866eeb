"""The compiled loops of _sketch.c, when built: signing and scoring call them where they exist and
compute the same values with numpy otherwise (the numpy code stays the reference the tests compare
them with). NEARDUP_COMPILED=0 in the environment turns them off, for A/B measurements and to rule
them out when debugging.

NEARDUP_SKETCH_PATH=/path/to/_sketch.so loads that build of _sketch.c instead of the installed one
(.ci/asan: one built with AddressSanitizer; or another version, for A/B timings). It must load: an
error there is raised, not taken for a missing build."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from types import ModuleType


def extension(name: str, variable: str) -> ModuleType | None:
    """The compiled module `name`: the build that the environment `variable` names a file of
    (NEARDUP_SKETCH_PATH here, NEARDUP_KAFKA_HASH_PATH in stream/framework.py), which must load;
    else the one built at install (pyproject.toml: ext-modules, optional), None if there is none."""
    path = os.environ.get(variable)
    if path:
        return _load_build(name, path)
    try:
        return importlib.import_module(name)
    except ImportError:  # pragma: no cover - a source checkout without a C compiler
        return None


def _load_build(name: str, path: str) -> ModuleType:
    """The extension module at `path`, as `name` (its init function is named after the last part
    of that name, whatever the file is called)."""
    loader = importlib.machinery.ExtensionFileLoader(name, path)
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    if spec is None:  # pragma: no cover - only for a path that is not a file name
        raise ImportError(f"{path}: not a loadable module")
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    sys.modules[name] = module
    return module


_sketch = extension(f"{__package__}._sketch", "NEARDUP_SKETCH_PATH")

BUILT = _sketch is not None
_enabled = BUILT and os.environ.get("NEARDUP_COMPILED") != "0"


def loops() -> ModuleType | None:
    """The compiled module, or None: compute it with numpy."""
    return _sketch if _enabled else None


def enable(on: bool) -> bool:
    """Use the compiled loops (when built) or not; returns the previous setting."""
    global _enabled
    previous, _enabled = _enabled, on and BUILT
    return previous
