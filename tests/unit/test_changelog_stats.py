"""neardup.pipeline.stats: `neardup stats --broker`'s figures, from a changelog alone (a list stands
in for the topic): the index rebuilt from it shows what the index that wrote it shows."""

from __future__ import annotations

from pathlib import Path

from neardup.pipeline.decider import Decider
from neardup.pipeline.stats import rebuilt_stats
from neardup.state.rocks import RocksOptions
from tests.support.changelog import ListChangelog
from tests.support.decider import decide, packed
from tests.support.signing import HISTORY, PARAMS


async def test_the_figures_rebuilt_from_a_changelog_are_its_writers(tmp_path: Path) -> None:
    records = ListChangelog()
    owner = Decider(PARAMS, tmp_path / "owner", RocksOptions(), records, in_process=True)
    await owner.open()
    try:
        await decide(owner, packed(HISTORY, 0))
        assert owner.shard is not None
        written = owner.shard.state.stats()
    finally:
        await owner.close(clean=False)
    stats = await rebuilt_stats(PARAMS, records, tmp_path / "scratch")
    assert (stats.articles, stats.clusters) == (written.articles, written.clusters)
    assert stats.articles > 0
    # bytes: the live records, each once, as the compacted changelog holds them
    assert 0 < stats.bytes_on_disk <= sum(len(value) for value in records.table().values())
