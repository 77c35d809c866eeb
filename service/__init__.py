"""neardup: near-duplicate detection for news text.

As a library, `neardup.open()` gives a Deduplicator that decides about articles in process, with
the engine and verdicts of the stream worker (see neardup.api and the README's "Use it as a
library"). The worker and the embedded mode are the `neardup` command (neardup.cli). Every exception
neardup raises of its own is a `neardup.Error` (the tree: neardup.errors).

The names below are imported when first used, not with the package: the command's entry
(neardup.__main__) sets what numpy reads at its import before anything imports numpy."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .api import ArticleInput, DecisionFailed, Deduplicator, Verdict, open
    from .config import ConfigError
    from .core.params import DedupParams, IncompatibleState
    from .core.shingle import ShingleOptions
    from .errors import Error
    from .messages import Article, InvalidMessage
    from .state.records import CorruptRecord
    from .state.rocks import StateError

_MODULE_OF = {
    name: module
    for module, names in {
        ".api": "ArticleInput DecisionFailed Deduplicator Verdict open",
        ".config": "ConfigError",
        ".core.params": "DedupParams IncompatibleState",
        ".core.shingle": "ShingleOptions",
        ".errors": "Error",
        ".messages": "Article InvalidMessage",
        ".state.records": "CorruptRecord",
        ".state.rocks": "StateError",
    }.items()
    for name in names.split()
}
__all__ = [
    "Article",
    "ArticleInput",
    "ConfigError",
    "CorruptRecord",
    "DecisionFailed",
    "DedupParams",
    "Deduplicator",
    "Error",
    "IncompatibleState",
    "InvalidMessage",
    "ShingleOptions",
    "StateError",
    "Verdict",
    "open",
]


def __getattr__(name: str) -> Any:
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_MODULE_OF[name], __name__), name)
    globals()[name] = value  # found directly from now on
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
