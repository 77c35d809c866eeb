"""Band buckets and posting lists held in memory (state/held.py): what is held is what a reopening
finds, every write is one write of the store, and a state keeps the layout it was created with."""

from __future__ import annotations

import math
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest

from neardup.core.compiled import _sketch
from neardup.core.params import DedupParams
from neardup.core.signing import sketch_of
from neardup.state import held as held_module
from neardup.state.held import _NUMBER, DRAIN_KEY, HOLD_KEY, LOG, SNAPSHOT, HeldFamilies
from neardup.state.memory import MemoryKV
from neardup.state.port import Batch, KeyValue
from neardup.state.rocks import HELD, RocksKV, RocksOptions, RocksState
from neardup.state.tables import BAND, POSTING
from tests.support.reference_decide import Outcome, decide
from tests.support.reference_state import pack_changes, unpack_changes
from tests.support.state import contents

PARAMS = DedupParams()


def index(state: RocksState, article_id: str, text: str) -> Outcome:
    outcome = decide(article_id, sketch_of(text, PARAMS), state, PARAMS, time_ms=0)
    assert outcome.update is not None
    state.apply(outcome.update)
    return outcome


class Writes:
    """A store that keeps each batch written to it."""

    def __init__(self, kv: MemoryKV) -> None:
        self.kv, self.batches = kv, []

    def write(self, batch: Batch) -> None:
        self.batches.append(batch)
        self.kv.write(batch)

    def __getattr__(self, name: str) -> object:
        return getattr(self.kv, name)


def random_changes(rng: random.Random, keys: list[bytes], most: int = 30) -> dict[bytes, bytes | None]:
    return {
        rng.choice(keys): None if rng.random() < 0.2 else rng.randbytes(rng.choice([0, 5, 8, 40, 320]))
        for _ in range(rng.randint(1, most))
    }


def table_of(entries: dict[bytes, bytes]) -> _sketch.HeldTable:
    table = _sketch.HeldTable()
    table.apply(_sketch.pack_changes(dict(entries)))
    return table


def contents_of(table: _sketch.HeldTable) -> dict[bytes, bytes]:
    """Every entry of the table, read through items() a few slots at a time."""
    found: dict[bytes, bytes] = {}
    entries, start = table.items(0, 3)
    while entries:
        assert not set(dict(entries)) & set(found), "an entry listed twice"
        found.update(entries)
        entries, start = table.items(start, 3)
    return found


@pytest.mark.parametrize("seed", range(8))
def test_changes_pack_and_apply_as_the_reference_does(seed: int) -> None:
    """The compiled packing against tests/support/reference_state.py, byte for byte, and applied
    to a table as the reference's entries are to a dict, deletions of absent keys included."""
    rng = random.Random(seed)
    keys = [rng.randbytes(rng.choice([0, 1, 5, 12, 255])) for _ in range(50)]
    changes = random_changes(rng, keys) if seed else {}
    packed = _sketch.pack_changes(changes)
    assert packed == pack_changes(changes)
    assert unpack_changes(packed) == list(changes.items())
    start = {key: b"old" for key in keys[::3]}
    applied, expected = table_of(start), dict(start)
    assert applied.apply(packed) == len(changes)
    for key, value in unpack_changes(packed):
        if value is None:
            expected.pop(key, None)
        else:
            expected[key] = value
    assert contents_of(applied) == expected and len(applied) == len(expected)


@pytest.mark.parametrize("seed", range(6))
def test_the_table_holds_what_a_dict_holds(seed: int) -> None:
    """Random updates and deletions of keys of every length (short ones collide in their slots,
    and a deletion moves the entries after it) against a dict: the same reads, length and
    entries; packed in chunks and applied to a new table, the same again."""
    rng = random.Random(seed)
    keys = [rng.randbytes(rng.choice([0, 1, 2, 9, 255])) for _ in range(400)]
    table, model = _sketch.HeldTable(), {}
    for step in range(300):
        changes = random_changes(rng, keys) if step % 50 else dict.fromkeys(model)  # all deleted
        table.apply(_sketch.pack_changes(changes))
        for key, value in changes.items():
            if value is None:
                model.pop(key, None)
            else:
                model[key] = value
        assert table.get_many(keys) == [model.get(key) for key in keys], step
        assert len(table) == len(model)
    assert contents_of(table) == model
    most = rng.choice([1, 50, 1_000, 10**6])
    chunks = table.pack_range(0, 1, most)  # every entry
    assert all(len(chunk) - 4 - 5 * len(unpack_changes(chunk)) <= max(most, 255 + 320) for chunk in chunks)
    firsts = [value[:8].ljust(8, b"\0") for chunk in chunks for _, value in unpack_changes(chunk)]
    assert firsts == sorted(firsts), "in the order of the values' first bytes (an article's seq side by side)"
    copied = _sketch.HeldTable()
    assert sum(copied.apply(chunk) for chunk in chunks) == len(model)
    assert contents_of(copied) == model
    for steps in (1, 2, 8, 1024):  # a fold a range of hashes at a time: each entry in one range
        ranges = [table.pack_range(step, steps, most) for step in range(steps)]
        packed = [entry for chunks in ranges for chunk in chunks for entry in unpack_changes(chunk)]
        assert len(packed) == len(model) and dict(packed) == model, steps
        reloaded = _sketch.HeldTable()  # as a reopening loads a fold's chunks: slots for all first
        reloaded.reserve(len(packed))
        assert sum(reloaded.apply(chunk) for chunks in ranges for chunk in chunks) == len(model)
        assert contents_of(reloaded) == model
    assert table.get_many([b"k" * 256, *keys[:3]]) == [None, *(model.get(key) for key in keys[:3])]


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "hold a count"),
        (b"\xff\xff\xff\xff", "shorter than its count"),
        (pack_changes({b"b1": b"12345678", b"n2": None}) + b"x", "lengths add up"),
        (pack_changes({b"b1": b"12345678"})[:-1], "lengths add up"),
    ],
)
def test_a_log_value_not_of_one_packed_dict_is_refused(data: bytes, reason: str) -> None:
    table = table_of({b"n2": b"kept"})
    with pytest.raises(ValueError, match=reason):
        table.apply(data)
    assert contents_of(table) == {b"n2": b"kept"}, "nothing applied"


@pytest.mark.parametrize("changes", [{b"k" * 256: b""}, {"k": b""}, {b"k": 1}])
def test_changes_that_cannot_be_packed_are_refused(changes: dict) -> None:
    with pytest.raises(ValueError, match="changes must map"):
        _sketch.pack_changes(changes)
    if all(isinstance(key, bytes) for key in changes):  # a key of a held family: checked
        with pytest.raises(ValueError, match="changes must map"):
            _sketch.split_changes({b"n": b"first", **changes}, b"nk")


@pytest.mark.parametrize("seed", range(6))
def test_a_batch_splits_into_the_held_families_packed_and_the_rest(seed: int) -> None:
    """split_changes against its reference: the changes of the keys that start with the held
    families' bytes packed as pack_changes packs them (None when there is none), the others in a
    dict, both in the batch's order."""
    rng = random.Random(seed)
    keys = [bytes([rng.choice(b"bnat")]) + rng.randbytes(rng.choice([0, 4, 10])) for _ in range(40)]
    changes = random_changes(rng, keys) if seed else {b"": b"empty key", b"a1": None}
    families = rng.choice([b"bn", b"n", b"", b"z"])
    packed, rest = _sketch.split_changes(changes, families)
    held = {key: value for key, value in changes.items() if key[:1] and key[0] in families}
    assert packed == (pack_changes(held) if held else None)
    assert list(rest.items()) == [(key, value) for key, value in changes.items() if key not in held]


class CrashesNow(Writes):
    """A store whose next write raises once `crash` is set, as a crash would end it."""

    crash = False

    def write(self, batch: Batch) -> None:
        if self.crash:
            self.crash = False
            raise OSError("crashed")
        super().write(batch)


@pytest.mark.parametrize(("seed", "fold_step"), [(0, 65_536), (1, 65_536), (2, 5), (3, 5), (4, 1)])
def test_a_reopened_store_holds_what_the_live_one_held(
    seed: int, fold_step: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Random writes of held and other keys, folded at random points and by size, a fold in one
    write or over several (a few entries a step), and crashes at random writes, a fold's steps
    among them (the store reopened then): after each write a new HeldFamilies over the same store
    reads the same entries as the live one and as a plain dict, and the store holds no held key as
    a key of its own; once a fold ends, no chunk or log value from before it began."""
    monkeypatch.setattr(held_module, "_SNAPSHOT_FLOOR", 2_000)
    monkeypatch.setattr(held_module, "_FOLD_STEP", fold_step)
    rng = random.Random(seed)
    keys = [
        prefix + rng.randbytes(rng.choice([4, 10]))
        for prefix in (BAND, POSTING, b"a", b"c")
        for _ in range(25)
    ]
    inner, model = MemoryKV(), {}
    store = CrashesNow(inner)
    live = HeldFamilies(store, HELD)  # type: ignore[arg-type]  # a KeyValue by delegation
    folds_over_writes = 0
    for step in range(120):
        changes = random_changes(rng, keys)
        store.crash, before = rng.random() < 0.1, len(store.batches)
        try:
            live.write(Batch(main=dict(changes)))
            if rng.random() < 0.05:
                live.fold()
        except OSError:
            live = HeldFamilies(store, HELD)  # type: ignore[arg-type]  # reopened after the crash
        if len(store.batches) > before:  # its own changes written, whatever came after them
            model.update(changes)
        store.crash = False
        folds_over_writes += live._folding is not None
        if live._folding is None and len(live._chunks):  # no fold under way: one snapshot and its log
            numbers = [_NUMBER.unpack_from(key, 1)[0] for key, _ in inner.scan(SNAPSHOT)]
            assert numbers == list(live._chunks)
        expected = [model.get(key) for key in keys]
        reopened = HeldFamilies(inner, HELD)
        for family in range(0, len(keys), 25):  # a call reads one family
            assert live.get_many(keys[family : family + 25]) == expected[family : family + 25]
            assert reopened.get_many(keys[family : family + 25]) == expected[family : family + 25], step
    stored = {key for key, _ in inner.scan(b"")}
    assert not {key for key in stored if key[:1] in (BAND, POSTING)}
    assert SNAPSHOT in {key[:1] for key in stored}, "folded"
    assert folds_over_writes if fold_step < 10 else not folds_over_writes
    held_keys = sorted(key for key in keys if key[:1] in (BAND, POSTING) and model.get(key) is not None)
    assert [key for key, _ in live.scan(BAND)] + [key for key, _ in live.scan(POSTING)] == held_keys


@pytest.mark.parametrize("rows", [150, 2], ids=["large-writes", "small-writes"])
def test_a_fold_ends_before_the_log_outgrows_the_snapshot_by_half(
    rows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fold goes at least a step a write; a write that logs much (a large batch) takes as many
    steps as end the fold before the log grows by half the snapshot. So the log an open reads
    again stays within one and a half snapshots, and a write or two, whatever the writes' size;
    small writes fold a step each, over several writes."""
    monkeypatch.setattr(held_module, "_SNAPSHOT_FLOOR", 2_000)
    monkeypatch.setattr(held_module, "_FOLD_STEP", 4)
    rng = random.Random(rows)
    keys = [BAND + b"%06d" % n for n in range(400)]
    inner = MemoryKV()
    live = HeldFamilies(inner, HELD)
    largest = folds = 0
    for _ in range(400 if rows < 10 else 60):
        changes = {key: rng.randbytes(8 * rng.randint(1, 6)) for key in rng.sample(keys, rows)}
        largest = max(largest, len(pack_changes(changes)))
        live.write(Batch(main=changes))
        folds += live._folding is not None
        log = sum(len(value) for _, value in inner.scan(LOG))
        assert log <= 1.5 * max(2_000, live._snapshot_bytes) + 2 * largest
    assert folds or rows > 10, "small writes fold a step each, over several writes"
    assert live.get_many(keys) == HeldFamilies(inner, HELD).get_many(keys)


def test_each_write_is_one_write_of_the_store_with_its_log() -> None:
    """What makes the held keys durable is written in the same batch as the rest: a crash keeps
    both or neither."""
    inner = Writes(MemoryKV())
    held = HeldFamilies(inner, HELD)  # type: ignore[arg-type]  # a KeyValue by delegation
    held.write(Batch(main={BAND + b"k": b"12345678", b"a1": b"x"}, records={b"r": b"record"}))
    held.write(Batch(main={b"a2": b"y"}))
    first, second = inner.batches
    assert set(first.main) == {b"a1", LOG + bytes(8), HOLD_KEY} and first.records == {b"r": b"record"}
    assert unpack_changes(first.main[LOG + bytes(8)]) == [(BAND + b"k", b"12345678")]
    assert set(second.main) == {b"a2"}, "a write without held keys logs nothing"
    held.fold()
    assert set(inner.batches[-1].main) == {LOG + bytes(8), SNAPSHOT + bytes(8), HOLD_KEY}
    assert inner.batches[-1].main[LOG + bytes(8)] is None
    assert inner.batches[-1].main[HOLD_KEY] == _NUMBER.pack(1), "the snapshot's entries"


class ScansCounted(MemoryKV):
    """A MemoryKV that counts the scans of each prefix."""

    def __init__(self) -> None:
        super().__init__()
        self.scans: dict[bytes, int] = {}

    def scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        self.scans[prefix] = self.scans.get(prefix, 0) + 1
        return super().scan(prefix)


def test_opening_reads_the_snapshot_once_where_its_mark_counts_its_entries() -> None:
    """A fold's end records the snapshot's entries in the mark, which opening sizes the table by:
    the chunks are read once, to be applied. A mark without the count (a state folded before it
    was recorded) has the chunks counted first, the table the same either way."""
    inner = ScansCounted()
    live = HeldFamilies(inner, HELD)
    keys = [BAND + b"%08d" % n for n in range(300)]
    live.write(Batch(main=dict.fromkeys(keys, b"12345678")))
    live.fold()
    live.write(Batch(main={keys[0]: b"87654321", keys[1]: None}))
    assert inner.get_many([HOLD_KEY]) == [_NUMBER.pack(300)]
    for mark, scans in ((_NUMBER.pack(300), 1), (b"1", 2)):
        inner.write(Batch(main={HOLD_KEY: mark}))
        inner.scans.clear()
        reopened = HeldFamilies(inner, HELD)
        assert inner.scans[SNAPSHOT] == scans
        assert reopened.get_many(keys) == live.get_many(keys)


def test_a_log_is_folded_at_compaction_only_when_a_quarter_of_it_is_stale() -> None:
    """A log of new entries holds what a snapshot would: it is left as it is. Once a quarter more
    entries are stored than held (changes overwritten or removed since), the fold drops them; a
    reopened store reads the same either way."""
    inner = MemoryKV()
    live = HeldFamilies(inner, HELD)
    keys = [BAND + b"%08d" % n for n in range(100)]
    live.write(Batch(main=dict.fromkeys(keys, b"12345678")))
    live.write(Batch(main={keys[0]: b"87654321"}))  # 101 stored for 100 held
    assert not live.fold_if_stale()
    assert not any(key[:1] == SNAPSHOT for key, _ in inner.scan(b"")), "not folded"
    live.write(Batch(main=dict.fromkeys(keys[:12])))  # 113 stored for 88
    assert live.fold_if_stale()
    assert {key[:1] for key, _ in inner.scan(b"")} == {SNAPSHOT, HOLD_KEY[:1]}
    assert not live.fold_if_stale(), "the snapshot holds nothing stale"
    live.write(Batch(main={keys[20]: None, keys[21]: b"x"}))  # 90 stored for 87
    reopened = HeldFamilies(inner, HELD)
    assert reopened.get_many(keys) == live.get_many(keys)
    assert not reopened.fold_if_stale()
    reopened.write(Batch(main=dict.fromkeys(keys[22:47])))  # 115 stored for 62: counted on reopening
    assert reopened.fold_if_stale()


class CountedCompactions:
    """A RocksDB handle that counts its compactions, everything else passed through."""

    def __init__(self, db: object) -> None:
        self.db, self.compactions = db, 0

    def __getattr__(self, name: str) -> object:
        return getattr(self.db, name)

    def compact_range(self, *bounds: object) -> None:
        self.compactions += 1
        self.db.compact_range(*bounds)  # type: ignore[attr-defined]


def test_a_held_state_compacts_its_main_family_only_after_a_fold_or_a_removal(
    tmp_path: Path, prose: tuple[str, ...]
) -> None:
    """A held state rewrites few keys of its own but for its log: compacting the main family of
    one that only grew (a run over distinct news) would rewrite it for nothing. A keyed state's
    is compacted every time: its buckets are rewritten at every article."""
    held, keyed = (
        RocksState(tmp_path / name, RocksOptions(hold_families=name == "held")) for name in ("held", "keyed")
    )
    counted = []
    try:
        for state in (held, keyed):
            counted.append(CountedCompactions(state.rocks._db))
            state.rocks._db = counted[-1]  # type: ignore[assignment]
            for n in range(3):
                index(state, f"a{n}", prose[n])
        assert held.held is not None and keyed.held is None
        held.compact()
        keyed.compact()
        assert [c.compactions for c in counted] == [0, 1], "nothing stale in the held one"
        held.delete("a1")
        held.compact()
        assert counted[0].compactions == 1, "a removal"
        held.compact()
        assert counted[0].compactions == 1
    finally:
        for state, count in zip((held, keyed), counted, strict=False):
            state.rocks._db = count.db  # type: ignore[assignment]
        held.close()
        keyed.close()


def test_a_state_keeps_the_layout_it_was_created_with(tmp_path: Path, prose: tuple[str, ...]) -> None:
    """Created held, it stays held when opened by the worker's options; created with keys (an
    earlier version, or the worker), it keeps them when opened by embedded mode's."""
    for created, opened in ((True, False), (False, True)):
        path = tmp_path / f"created-{created}"
        state = RocksState(path, RocksOptions(hold_families=created))
        for i, text in enumerate(prose):
            index(state, f"a{i}", text)
        buckets = {key: value for key, value in contents(state).items() if key[:1] == BAND}
        state.close()
        raw = RocksKV(path, RocksOptions())
        stored_keys = {key[:1] for key, _ in raw.scan(b"")}
        raw.close()
        assert (BAND in stored_keys) is not created and (LOG in stored_keys) is created
        reopened = RocksState(path, RocksOptions(hold_families=opened))
        assert (reopened.held is not None) is created
        # held posting lists are read from memory, uncached; as keys, through the cache
        assert (reopened.postings.cache_size == 0) is created
        assert {key: value for key, value in contents(reopened).items() if key[:1] == BAND} == buckets
        late = index(reopened, "late", prose[2] + " Late copy.").article
        assert late.decision.match_id == "a2"
        reopened.close()
        read_only = RocksState(path, RocksOptions(), read_only=True)
        assert read_only.stats().buckets == len(buckets)
        read_only.close()


def test_embedded_mode_killed_mid_run_resumes_to_the_uninterrupted_outputs(tmp_path: Path) -> None:
    """SIGKILL of `neardup dedup --state` while it writes, then the same command again: the
    outputs equal one uninterrupted run's (the held families' log and the checkpoint agree)."""
    lines = []
    rng = random.Random(7)
    words = [
        "the",
        "council",
        "voted",
        "to",
        "approve",
        "budget",
        "after",
        "long",
        "debate",
        "on",
        "roads",
        "schools",
        "and",
        "parks",
    ]
    for i in range(3000):
        text = " ".join(rng.choice(words) for _ in range(60))
        lines.append(f'{{"id": "s{i}", "text": "{text}"}}\n')
        if i % 5 == 0:
            lines.append(f'{{"id": "c{i}", "text": "{text} Reporting by the wire desk."}}\n')
    source = tmp_path / "in.jsonl"
    source.write_text("".join(lines))
    command = [sys.executable, "-m", "neardup", "dedup", str(source), "-q", "--sign-processes", "0"]
    subprocess.run(
        [*command, "-o", str(tmp_path / "whole.jsonl"), "--state", str(tmp_path / "whole")], check=True
    )

    out, state = tmp_path / "out.jsonl", tmp_path / "state"
    run = subprocess.Popen([*command, "-o", str(out), "--state", str(state)])
    deadline = time.monotonic() + 60
    while (not out.exists() or out.stat().st_size < 200_000) and time.monotonic() < deadline:
        time.sleep(0.01)
    run.send_signal(signal.SIGKILL)
    run.wait()
    killed_at = out.stat().st_size
    assert 0 < killed_at < (tmp_path / "whole.jsonl").stat().st_size, "killed mid-run"
    subprocess.run([*command, "-o", str(out), "--state", str(state)], check=True)
    assert out.read_bytes() == (tmp_path / "whole.jsonl").read_bytes()


_UNLOGGED_WRITER = """
import sys
from pathlib import Path
from typing import cast
from neardup.state.port import Batch
from neardup.state.rocks import RocksKV, RocksOptions
kv = RocksKV(Path(sys.argv[1]), RocksOptions(write_ahead_log=False, write_buffer_mb=1))
for n in range(100_000):  # each write: its number in both families, and 4 KB to fill the memtables
    number = b"%08d" % n
    kv.write(Batch(main={b"mlast": number, b"x%08d" % n: bytes(4096)}, records={b"last": number}))
    if n == 2_000:  # past a flush of the small main memtable: writes after it are in memory only
        print("written", flush=True)
        sys.stdin.readline()
"""


def test_without_the_write_ahead_log_a_kill_leaves_both_families_at_one_write(tmp_path: Path) -> None:
    """`neardup dedup`'s state skips the write-ahead log (its checkpoint is in its writes): SIGKILL
    after the main family's memtable has flushed, and not the records family's, must leave both at
    the same write, else an id map would name records that are gone. The families' flushes are
    atomic: both hold the write of the last flush, none after it."""
    path = tmp_path / "db"
    writer = subprocess.Popen(
        [sys.executable, "-c", _UNLOGGED_WRITER, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert writer.stdout is not None and writer.stdout.readline() == "written\n"
    writer.send_signal(signal.SIGKILL)
    writer.wait()
    kv = RocksKV(path, RocksOptions())
    try:
        (main,) = kv.get_many([b"mlast"])
        (record,) = kv.records([b"last"])
        assert main is not None and main == record, "the families were flushed together"
        assert int(main) < 2_000, "the writes after the last flush were lost with the process"
    finally:
        kv.close()


def reopened(kv: KeyValue) -> KeyValue:
    """The store as RocksState opens it: held while marked so."""
    return HeldFamilies(kv, HELD) if kv.get_many([HOLD_KEY])[0] is not None else kv


class CrashesOnce(Writes):
    """A store whose first write of a kind raises, as a crash would end it: `first`, the first
    write; `mark`, the one that marks the state as draining; `step`, the second after that; `last`,
    the one that drops the log and the marks."""

    def __init__(self, kv: MemoryKV, kind: str | None) -> None:
        super().__init__(kv)
        self.kind, self.seen, self.after_mark = kind, [], 0

    def write(self, batch: Batch) -> None:
        mark = batch.main.get(DRAIN_KEY, b"-")
        self.after_mark += bool(self.after_mark) or mark == b"1"
        kind = {b"1": "mark", None: "last"}.get(mark, "step" if self.after_mark == 3 else "first")
        if kind == self.kind and kind not in self.seen and (kind != "first" or not self.batches):
            self.seen.append(kind)
            raise OSError("crashed")
        super().write(batch)


@pytest.mark.parametrize("crash_at", [None, "first", "mark", "step", "last"])
def test_held_entries_past_their_bound_go_back_to_keys_a_step_a_write(
    crash_at: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past HELD_ENTRIES the entries go back to being keys, DRAIN_STEP a write, beside the writes'
    own changes to keys still held, keys already moved and new keys; the last step drops the log,
    the snapshot and the marks. After every write, and after a crash at any write of the store
    (the marking, a step, the last), the store reads what a plain dict has, and a reopening finds
    the same; a key of the families left in RocksDB by an earlier version's interrupted spill goes."""
    monkeypatch.setattr(held_module, "HELD_ENTRIES", 10**9)
    monkeypatch.setattr(held_module, "DRAIN_STEP", 7)
    rng = random.Random(str(crash_at))
    keys = [rng.choice([BAND, POSTING]) + rng.randbytes(10) for _ in range(60)]
    inner, model = MemoryKV(), {}
    live: KeyValue = HeldFamilies(inner, HELD)
    for _ in range(5):  # held, folded once
        changes = random_changes(rng, keys[:40])
        live.write(Batch(main=dict(changes)))
        model.update(changes)
    cast(HeldFamilies, live).fold()
    inner.write(Batch(main={keys[-1]: b"left by a spill"}))  # not in the model: must not surface
    monkeypatch.setattr(held_module, "HELD_ENTRIES", 3)
    store = CrashesOnce(inner, crash_at)
    live = HeldFamilies(store, HELD)  # type: ignore[arg-type]  # a KeyValue by delegation
    for written in range(1, 30):
        changes = {**random_changes(rng, keys[:-1], most=3), b"a" + bytes([written]): b"x"}
        before = len(store.batches)
        try:
            live.write(Batch(main=dict(changes)))
        except OSError:
            live = reopened(store)  # type: ignore[arg-type]  # after the crash (the store crashes once)
        if len(store.batches) > before:  # its own changes written, whatever came after them
            model.update(changes)
        assert live.get_many(keys) == [model.get(key) for key in keys]
        assert reopened(inner).get_many(keys) == [model.get(key) for key in keys]
        if inner.get_many([HOLD_KEY])[0] is None:
            break
    assert written > 3 and store.seen == [crash_at] * bool(crash_at)  # drained over several writes
    stored = dict(inner.scan(b""))
    assert not {key[:1] for key in stored} & {LOG, SNAPSHOT} and DRAIN_KEY not in stored
    expected = {key: value for key, value in model.items() if value is not None}
    assert {key: value for key, value in stored.items() if key[:1] in (BAND, POSTING, b"a")} == expected
    live.write(Batch(main={keys[1]: None, keys[2]: b"87654321"}))  # now keys of their own
    assert inner.get_many([keys[1], keys[2]]) == [None, b"87654321"]


@pytest.mark.parametrize("rows", [60, 1], ids=["large-writes", "small-writes"])
def test_a_drain_ends_once_its_writes_change_half_its_entries(
    rows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the bound a write moves DRAIN_STEP entries back to keys, or twice its own changes where
    that is more: writes of many changes drain a large table in a few writes, and the state is keyed
    once they have changed half as many keys as it held. Meanwhile the log an open reads again holds
    at most one and a half changes an entry held when the drain began, and one write's changes."""
    monkeypatch.setattr(held_module, "DRAIN_STEP", 1)
    rng = random.Random(rows)
    keys = [BAND + b"%06d" % n for n in range(1_000)]
    model: dict[bytes, bytes | None] = {key: rng.randbytes(8) for key in keys[:400]}
    inner = MemoryKV()
    live = HeldFamilies(inner, HELD)
    live.write(Batch(main=dict(model)))
    live.fold()
    monkeypatch.setattr(held_module, "HELD_ENTRIES", 300)
    writes = 0
    while inner.get_many([HOLD_KEY])[0] is not None:
        changes = {key: rng.randbytes(16) for key in rng.sample(keys, rows)}
        live.write(Batch(main=dict(changes)))
        model.update(changes)
        writes += 1
        logged = sum(held_module._COUNT.unpack_from(value)[0] for _, value in inner.scan(LOG))
        assert logged <= 1.5 * 400 + rows
        assert reopened(inner).get_many(keys) == [model.get(key) for key in keys]
    assert 3 < writes <= 2 + math.ceil(400 / (2 * rows))
    assert dict(inner.scan(BAND)) == model
