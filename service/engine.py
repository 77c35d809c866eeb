"""The two stages joined in one process, over any StateStore: the embedded mode's engine."""

from __future__ import annotations

from .core.dedup import IndexedArticle, decide
from .core.params import DedupParams
from .core.signing import fingerprint
from .state.port import StateStore


class Engine:
    """sign → decide → apply, for callers that hold the whole pipeline (CLI, tests, benchmarks)."""

    def __init__(self, state: StateStore, params: DedupParams) -> None:
        state.open_header(params.header())
        self.state = state
        self.params = params

    def process(self, article_id: str, text: str, extra: dict[bytes, bytes] | None = None) -> IndexedArticle:
        """Verdict-bearing record for one article; raises signing.EmptyText for empty texts."""
        fp = fingerprint(text, self.params)
        outcome = decide(article_id, fp, self.state, self.params)
        if outcome.update is not None:
            self.state.apply(outcome.update, extra)
        elif extra:
            self.state.set_meta(extra)
        return outcome.article
