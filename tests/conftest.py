"""Shared fixtures: real prose to shingle (news articles and technical paragraphs), engines and states.
And how a run is laid out: the `integration` mark, the order tests are handed to parallel workers,
and each test's time budget (see tests/run).

The prose is embedded so the tests need nothing outside the repository.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Callable, Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

from neardup.core.dedup import IndexedArticle
from neardup.core.params import DedupParams
from neardup.messages import Article
from neardup.pipeline.shard import IndexShard
from neardup.pipeline.sign import SignStage
from neardup.pipeline.wire import Provenance
from neardup.state.memory import MemoryState
from neardup.state.port import StateStore
from neardup.state.rocks import RocksOptions, RocksState


class ListChangelog:
    """The changelog's messages in a list (that list itself: what is appended to it shows), read
    `chunk` at a time, as topics.ChangelogReader reads the topic: what a decider rebuilds from in
    the unit tests and benchmarks."""

    def __init__(self, entries: list[tuple[bytes, bytes | None]] | None = None, chunk: int = 2000) -> None:
        self.entries = [] if entries is None else entries
        self.chunk = chunk

    async def end(self) -> int:
        return len(self.entries)

    async def read(self, end: int) -> AsyncIterator[list[tuple[bytes, bytes | None]]]:
        for start in range(0, end, self.chunk):
            yield self.entries[start : min(start + self.chunk, end)]

    async def read_after(
        self, start: int, end: int
    ) -> AsyncIterator[tuple[list[tuple[bytes, bytes | None]], int]]:
        for first in range(start, end, self.chunk):
            after = min(first + self.chunk, end)
            yield self.entries[first:after], after

    async def tombstones_kept_ms(self) -> int | None:
        return None  # a list drops nothing

    def table(self) -> dict[bytes, bytes]:
        """The records it holds: the last value per key, tombstones removing theirs."""
        latest = dict(self.entries)
        return {key: value for key, value in latest.items() if value is not None}


# A wedding-planner sports story (news, ~2 KB).
ROMO = (
    "NFC East rival quarterbacks Tony Romo of the Dallas Cowboys and Eli Manning of the New York Giants "
    "now have something else in common — they've used the same wedding planner to help them tie the "
    'knot. Todd Fiscus, the man with the plan, set up what he called "man food" at Dallas\' Arlington '
    'Hall on Saturday, when Romo married former Miss Missouri Candace Crawford. "I have a lot of '
    'football players to feed," said Fiscus, who had pizza and short ribs on the menu.\n\n'
    'However, Romo apparently put all the tunes together. "Tony picked out every song, and when it '
    'plays, and what the keynote things are," Fiscus said.\n\n'
    "Sounds like a very orderly occasion, but there was one wild card — whether Cowboys owner Jerry "
    "Jones would be able to attend. With the continued lockout, owners and players are not supposed to "
    "have any contact away from the negotiating table. But Jones received special dispensation from the "
    "NFL to attend, just as the Green Bay Packers recently were informed that they will, in fact, "
    "receive their Super Bowl rings in a June 16 ceremony no matter what the labor situation is at that "
    "time. Jones was there along with virtually all of Romo's teammates.\n\n"
    "It is unknown whether Jones and Romo actually discussed any labor issues at the wedding — we're "
    'guessing this was more of a "friendly", though Jones is one of the most powerful owners on the '
    "NFL's side of things and Romo's marquee value gives him a lot of play on the other side.\n\n"
    "Romo, who had been linked romantically before with Jessica Simpson and Carrie Underwood, proposed "
    "to Crawford last December. According to the new Mrs. Romo, the lockout may play a part in the "
    "couple's plans for a honeymoon; usually around this time of year, her husband would be "
    "participating in minicamps and other off-season workouts."
)

# A holiday explainer (news, ~1.6 KB).
MEMORIAL = (
    "Officially, Memorial Day, observed on the last Monday of May (this year it's May 30), honors the "
    "war dead. Unofficially, the day honors the start of summer.\n\n"
    'The upcoming three-day weekend has prompted searches for "when is memorial day," "what is '
    'memorial day," and "memorial day history." The day was originally known as "Decoration Day" '
    "because the day was dedicated to the Civil War dead, when mourners would decorate gravesites as a "
    "remembrance.\n\n"
    "The holiday was first widely observed on May 30, 1868, when 5,000 people helped decorate the "
    "gravesites of 20,000 Union and Confederate soldiers buried at Arlington National Cemetery. After "
    "World War I, the observances were widened to honor the fallen from all American wars, and in 1971, "
    "Congress declared Memorial Day a national holiday.\n\n"
    "Towns across the country now honor military personnel with services, parades, and fireworks. A "
    "national moment of remembrance takes place at 3 p.m. This day is not to be confused with Veterans "
    "Day, which is observed on November 11 to honor military veterans, both alive and dead. However, "
    "confusion abounds anyway, with the weekend marking for many the kickoff of summer, and it is "
    "reserved for weekend getaways, picnics, and sales."
)

SHINGLING = (
    "Finding duplicate files is easy, anyone can do it. Finding files that are almost identical is more "
    "difficult, but it's useful for use cases like detecting plagiarism. The basic idea is to reduce "
    "each document to a set of strings and then use Jaccard similarity to calculate the similarity of "
    "those sets. To reduce a document to a set of strings, we use a technique called shingling. "
    "Shingling extracts the set of all substrings of length k (called k-shingles) from a text. This is "
    "implemented by sliding a window of size k over the input document character by character and "
    "throwing the substrings into a set. Jaccard similarity is a simple measure for expressing "
    "similarity of sets. I first came across this measure when studying recommender systems, but it "
    "keeps showing up in other machine learning contexts, too. Obviously, plagiarized documents have a "
    "higher similarity to the original than unrelated documents."
)

NEAR_DUPLICATES = (
    "Most real-world duplication is not exact. Articles get paraphrased, headlines change, paragraphs "
    "get reordered, and syndication services add or remove bylines and footers. To catch these "
    "near-duplicates, you need a similarity measure that tolerates small differences. The choice of "
    "character-level shingles rather than word-level n-grams is deliberate. Word-level shingles are "
    "sensitive to tokenization choices and vocabulary differences across languages. Character-level "
    "shingles are language-agnostic and naturally capture morphological variations. They also "
    "gracefully handle misspellings and OCR errors, where individual words may differ but most "
    "character sequences remain shared. The problem with computing Jaccard similarity directly is the "
    "cost: for a corpus of N documents, a naive pairwise comparison requires a quadratic number of "
    "similarity computations."
)

BANDING = (
    "Locality sensitive hashing is a widely popular technique used in approximate nearest neighbor "
    "search. It uses an approximate search principle to get better performance while maintaining the "
    "quality of the results. At its core, the final LSH function allows us to segment and hash the same "
    "sample several times, and when we find that a pair of vectors has been hashed to the same value at "
    "least once, we tag them as candidate pairs, that is, potential matches. The signature matrix is "
    "divided into b bands of r rows each; for each band we hash its portion of the column into a "
    "bucket. The results are verified by actually checking whether those documents have similarity "
    "above the threshold, and the top three similar documents are returned with statistics."
)

PROSE: tuple[str, ...] = (ROMO, MEMORIAL, SHINGLING, NEAR_DUPLICATES, BANDING)


@pytest.fixture
def prose() -> tuple[str, ...]:
    """Five unrelated real paragraphs, 0.8-2.5 KB each."""
    return PROSE


@pytest.fixture
def params() -> DedupParams:
    return DedupParams()


@pytest.fixture
def shard(params: DedupParams) -> IndexShard:
    return IndexShard(MemoryState(), params)


def process(
    shard: IndexShard,
    article_id: str,
    text: str,
    published_at: str | None = None,
    *,
    now_ms: int | None = None,
) -> IndexedArticle:
    """Sign one article and decide it on `shard`, as the library does; raises what either raises
    (signing.EmptyText for an empty text)."""
    stage = SignStage(shard.params, 1 << 30, shard.retention.skew_ms)
    signed = stage.sign(Article(article_id, text, published_at=published_at), CALLER, now_ms)
    decided = shard.decide([signed], now=None if now_ms is None else now_ms / 1000)[0]
    if decided.error is not None:
        raise decided.error
    assert decided.article is not None
    return decided.article


CALLER = Provenance("test", None, 0, None)


@pytest.fixture(params=["memory", "rocks", "rocks-without-wal"])
def make_state(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], StateStore]]:
    """A factory for the state adapter under test; for RocksDB each call reopens the same directory
    (close the previous one first). Everything opened is closed at teardown."""
    opened: list[StateStore] = []
    memory = MemoryState()

    def make() -> StateStore:
        if request.param == "memory":
            state: StateStore = memory
        else:  # without a write-ahead log: the stream's derived index, rebuilt after a crash
            state = RocksState(tmp_path / "state", RocksOptions(write_ahead_log=request.param == "rocks"))
        opened.append(state)
        return state

    yield make
    for state in opened:
        with contextlib.suppress(Exception):  # a RocksState closed by the test itself
            state.close()


# --- how a run is laid out ---------------------------------------------------------------------------

TESTS = Path(__file__).resolve().parent
# What one test's call may take, in seconds, as it takes alone on this 2-core machine, unless it
# carries @pytest.mark.budget(seconds): a fault test proves its mechanism on a small stream within
# it. A test past its budget times NEARDUP_TEST_BUDGET_SCALE (2: in a parallel run on a shared
# machine tests took 1.1-2.6 times what they take alone; 0 turns the report off) is listed at the
# end of the run. It is not failed: how long a test took on a busy machine says nothing of whether
# the behaviour it checks is right, and CI's own time limit bounds the whole run.
TEST_BUDGET_S = 20.0
BUDGET_SCALE = float(os.environ.get("NEARDUP_TEST_BUDGET_SCALE", "2"))
OVER_BUDGET = "over_budget"  # the user property a test over its budget carries to the report


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test under tests/integration is marked `integration` (tests/run --fast leaves those
    out but the `smoke` ones). Handed to parallel workers, those go first: they are the long ones,
    and the many short unit tests then fill what is left of each worker's time."""
    integration = TESTS / "integration"
    for item in items:
        if item.path.is_relative_to(integration):
            item.add_marker(pytest.mark.integration)
    if config.getoption("dist", "no") != "no":
        items.sort(key=lambda item: not item.path.is_relative_to(integration))  # stable


@pytest.hookimpl(tryfirst=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """pytest-xdist names a test of an xdist_group "<nodeid>@<group>" by setting `_nodeid`, which
    pytest 9 no longer reads (its node id is `_id`): without this, --dist loadgroup spreads a
    group's tests over every worker, and the heavy ones run side by side. Before xdist's own
    hook sends the collected ids to the scheduler."""
    from _pytest.nodeid import NodeId

    for item in session.items:
        renamed = item.__dict__.get("_nodeid")
        if isinstance(renamed, str) and renamed != item.nodeid:
            item._id = NodeId.parse(renamed)  # type: ignore[attr-defined]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A test that passed but took longer than its budget says so in its report (listed at the
    end of the run by pytest_terminal_summary, from whichever worker ran it)."""
    report = yield
    if call.when == "call" and report.passed and BUDGET_SCALE > 0:
        marker = item.get_closest_marker("budget")
        budget = float(marker.args[0]) if marker else TEST_BUDGET_S
        if call.duration > budget * BUDGET_SCALE:
            report.user_properties.append(
                (OVER_BUDGET, f"{item.nodeid} took {call.duration:.1f} s, budget {budget:g} s")
            )
    return report


_over_budget: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """On the process that reports (xdist's controller too): the tests over their budget."""
    _over_budget.extend(value for name, value in report.user_properties if name == OVER_BUDGET)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    if _over_budget:
        terminalreporter.section(f"over {BUDGET_SCALE:g} times their time budget (reported, not failed)")
        for line in _over_budget:
            terminalreporter.line(line)
