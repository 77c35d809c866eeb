"""neardup: near-duplicate detection for news text.

As a library, `neardup.open()` gives a Deduplicator that decides about articles in process, with
the engine and verdicts of the stream worker (see neardup.api and the README's "Use it as a
library"). The worker and the embedded mode are the `neardup` command (neardup.cli). Every exception
neardup raises of its own is a `neardup.Error` (the tree: neardup.errors)."""

from .api import ArticleInput, DecisionFailed, Deduplicator, Verdict, open
from .config import ConfigError
from .core.params import DedupParams, IncompatibleState
from .core.shingle import ShingleOptions
from .errors import Error
from .messages import Article, InvalidMessage
from .state.records import CorruptRecord
from .state.rocks import StateError

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
