"""The compiled modules. _sketch (service/core/_sketch.c) is required: signing, normalising,
scoring and the index's tables run in its loops, which the package calls directly; the numpy code
they replace is kept as their reference under tests/support/ (reference_sketch.py,
reference_anchors.py, reference_state.py), where the tests compare them result for result. Kafka's
key hash (stream/framework.py) stays optional.

NEARDUP_SKETCH_PATH=/path/to/_sketch.so loads that build of _sketch.c instead of the installed one
(.ci/asan: one built with AddressSanitizer; or another version, for A/B timings). It must load: an
error there is raised, not taken for a missing build."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from types import ModuleType
from typing import TYPE_CHECKING


def extension(name: str, variable: str) -> ModuleType | None:
    """The compiled module `name`: the build that the environment `variable` names a file of
    (NEARDUP_SKETCH_PATH here, NEARDUP_KAFKA_HASH_PATH in stream/framework.py), which must load;
    else the one built at install (pyproject.toml: ext-modules), None if there is none."""
    if path := os.environ.get(variable):
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


if TYPE_CHECKING:  # the stub, _sketch.pyi, types the calls
    from . import _sketch
else:
    _sketch = extension(f"{__package__}._sketch", "NEARDUP_SKETCH_PATH")
    if _sketch is None:  # pragma: no cover - a source checkout without a C compiler
        raise ImportError("neardup.core._sketch is not built: reinstall with a C compiler (pip install -e .)")
