"""The figures of `neardup stats --broker`, from the changelog alone: the index is rebuilt from it
in a scratch directory, as a worker rebuilds it, so the figures are the ones a worker's index
would show (any changelog source: the topic, or a list in the tests)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ..core.params import DedupParams
from ..state.port import IndexStats
from ..state.rocks import RocksOptions
from .decider import Changelog, Decider


async def rebuilt_stats(params: DedupParams, changelog: Changelog, path: Path) -> IndexStats:
    """What a changelog holds: rebuilt by the decider's own rebuild into a new index at `path`
    (a scratch directory), with its figures; bytes are those of its live records."""
    # the store's defaults, not the worker's settings: the figures describe the records alone
    decider = Decider(params, path, RocksOptions(), changelog, in_process=True)
    await decider.open()  # a new directory: rebuilt from the changelog's start
    try:
        assert decider.shard is not None
        state = decider.shard.state
        stats = state.stats()
        # the index holds each live article record once, as the compacted changelog does
        live = sum(len(record) for _, record in state.kv.scan_records())
    finally:
        await decider.close(clean=False)
    return dataclasses.replace(stats, bytes_on_disk=live)
