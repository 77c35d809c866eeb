"""Writes held beside the store until they are committed: a read overlay over a KeyValue store.

The worker's index is derived from its changelog, and must never be ahead of it: a chunk's writes
wait in a layer of their own until the changelog holds the chunk's records, then reach the store in
one write batch with the changelog offset they correspond to. The store has no transactions and a
write batch cannot be read back, so reads see the held layers, newest first, over the store.
Generic: it knows keys and values, not what they mean.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from .port import Batch, KeyValue

_ABSENT = object()


@dataclass
class _Family:
    """One family's held writes: key → value (None: deleted), and the keys in order for scans. A
    key never leaves a layer, and a dict keeps its keys in the order they came: the keys a scan
    has not sorted yet are the last ones, taken when a scan needs them (a layer takes thousands of
    new keys between two scans, most layers none)."""

    values: dict[bytes, bytes | None] = field(default_factory=dict)
    ordered: list[bytes] = field(default_factory=list)

    def _first(self, prefix: bytes) -> int:
        """Where its first key from `prefix` on is in its ordered keys."""
        if new := len(self.values) - len(self.ordered):
            # a new list: a scan in progress goes on over the one it started with
            self.ordered = sorted([*self.ordered, *itertools.islice(reversed(self.values), new)])
        return bisect.bisect_left(self.ordered, prefix)

    def holds(self, prefix: bytes) -> bool:
        """Whether it holds a key (a value or a deletion) that starts with `prefix`."""
        at = self._first(prefix)
        return at < len(self.ordered) and self.ordered[at].startswith(prefix)

    def keys_from(self, prefix: bytes) -> Iterator[bytes]:
        """Its keys that start with `prefix`, in order."""
        following = itertools.islice(self.ordered, self._first(prefix), None)
        yield from itertools.takewhile(lambda key: key.startswith(prefix), following)


@dataclass
class Layer:
    """The writes of one unit of work (a decided chunk), tagged by its number."""

    tag: int
    main: _Family = field(default_factory=_Family)
    records: _Family = field(default_factory=_Family)


class LayeredKV:
    """A KeyValue over `base` that holds writes in layers while any is open (`hold`), writes them
    to `base` when they are committed (`commit_through`), or forgets them (`discard`). With no
    layer held, a write goes to `base` at once."""

    def __init__(self, base: KeyValue) -> None:
        self.base = base
        self._layers: list[Layer] = []  # oldest first
        # every held key's newest value, by family: a read looks a key up once, whatever the layers
        self._view: dict[str, dict[bytes, bytes | None]] = {"main": {}, "records": {}}

    @property
    def held(self) -> list[int]:
        """The tags of the layers not committed yet, oldest first."""
        return [layer.tag for layer in self._layers]

    def hold(self, tag: int) -> None:
        """Writes from now on go to a new layer tagged `tag` (greater than any held)."""
        if self._layers and tag <= self._layers[-1].tag:
            raise ValueError(f"layer {tag} after layer {self._layers[-1].tag}")
        self._layers.append(Layer(tag))

    def commit_through(self, tag: int, extra: dict[bytes, bytes] | None = None) -> int:
        """Write the layers tagged up to `tag` to the store, with `extra` (main family), in one
        write batch; returns how many were written (0: none was held, and nothing is written)."""
        done = [layer for layer in self._layers if layer.tag <= tag]
        if not done:
            return 0
        batch = Batch()
        for layer in done:
            batch.main.update(layer.main.values)
            batch.records.update(layer.records.values)
        batch.main.update(extra or {})
        self.base.write(batch)
        self._layers = self._layers[len(done) :]
        for family, view in self._view.items():
            view.clear()
            for layer in self._layers:
                view.update(getattr(layer, family).values)
        return len(done)

    def discard(self) -> None:
        """Forget every held layer: the store stays at its last commit."""
        self._layers = []
        for view in self._view.values():
            view.clear()

    # -- the KeyValue port ------------------------------------------------------------------

    def write(self, batch: Batch) -> None:
        if self._layers:
            self._layers[-1].main.values.update(batch.main)
            self._layers[-1].records.values.update(batch.records)
            self._view["main"].update(batch.main)
            self._view["records"].update(batch.records)
        else:
            self.base.write(batch)

    def get_many(self, keys: list[bytes]) -> list[bytes | None]:
        return self._read(keys, "main", self.base.get_many)

    def records(self, keys: list[bytes]) -> list[bytes | None]:
        return self._read(keys, "records", self.base.records)

    def _newest_first(self, family: str) -> list[_Family]:
        """One family ("main" or "records") of every held layer, the newest first."""
        return [getattr(layer, family) for layer in reversed(self._layers)]

    def _read(
        self, keys: list[bytes], family: str, below: Callable[[list[bytes]], list[bytes | None]]
    ) -> list[bytes | None]:
        """`keys` as the newest layer holding each has it, else as the store has it."""
        view = self._view[family]
        if view.keys().isdisjoint(keys):  # none held: a new article's buckets and anchors, mostly
            return below(keys)
        found: list[object] = list(map(view.get, keys, itertools.repeat(_ABSENT)))
        if _ABSENT not in found:
            return found  # type: ignore[return-value]  # all held
        missing = [i for i, value in enumerate(found) if value is _ABSENT]
        for i, value in zip(missing, below([keys[i] for i in missing]), strict=True):
            found[i] = value
        return found  # type: ignore[return-value]  # every _ABSENT was replaced

    def scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        return self._merged(self.base.scan(prefix), "main", prefix)

    def scan_records(self) -> Iterator[tuple[bytes, bytes]]:
        return self._merged(self.base.scan_records(), "records", b"")

    def _merged(
        self, below: Iterator[tuple[bytes, bytes]], family: str, prefix: bytes
    ) -> Iterator[tuple[bytes, bytes]]:
        """The store's entries under `prefix` with the layers' over them, in key order: a key the
        layers hold takes their newest value, and is left out where that is a deletion. Lazy: a
        caller that stops early reads no further, in the store or the layers."""
        # only the layers holding keys under the prefix: most scans (a content's copies, a
        # cluster's members) find none there, and then the store's entries are the answer
        layers = [held for held in self._newest_first(family) if held.holds(prefix)]
        if not layers:
            yield from below
            return
        # each held key once, in order, whichever layers hold it
        held = (key for key, _ in itertools.groupby(heapq.merge(*(f.keys_from(prefix) for f in layers))))
        # the held entries but the deletions, in order
        live = ((key, entry) for key in held if (entry := self._newest(layers, key)) is not None)
        next_live = next(live, None)
        for key, value in below:
            while next_live is not None and next_live[0] <= key:
                yield next_live
                next_live = next(live, None)
            if not any(key in f.values for f in layers):
                yield key, value
        if next_live is not None:
            yield next_live
            yield from live

    @staticmethod
    def _newest(layers: list[_Family], key: bytes) -> bytes | None:
        return next((family.values[key] for family in layers if key in family.values), None)

    def close(self) -> None:
        self.discard()
        self.base.close()

    def clear(self) -> None:
        self.discard()
        self.base.clear()

    def size_bytes(self) -> int:
        return self.base.size_bytes()
