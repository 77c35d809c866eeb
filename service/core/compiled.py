"""The compiled loops of _sketch.c, when built: signing and scoring call them where they exist and
compute the same values with numpy otherwise (the numpy code stays the reference the tests compare
them with). NEARDUP_COMPILED=0 in the environment turns them off, for A/B measurements and to rule
them out when debugging."""

from __future__ import annotations

import os
from types import ModuleType

try:  # built at install (pyproject.toml: ext-modules, optional)
    from . import _sketch
except ImportError:  # pragma: no cover - a source checkout without a C compiler
    _sketch = None  # type: ignore[assignment]

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
