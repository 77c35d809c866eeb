"""Types of the compiled loops (_sketch.c), which the package requires; their numpy references are
tests/support/reference_sketch.py, reference_anchors.py and reference_state.py (and, for the posting
lists and a record's head, the numpy code in state/tables.py and state/records.py). Any contiguous
buffer of the right length is taken where an array is named, at any alignment; wrong lengths and
values raise ValueError (see the comment at the top of _sketch.c)."""

from collections.abc import Sequence
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

def oph_minima(
    units: npt.NDArray[np.uint64] | npt.NDArray[np.uint32],
    k: int,
    seed_key: int,
    minima: npt.NDArray[np.uint64],
    width: int = 8,
) -> int: ...
def band_keys(signature: npt.NDArray[np.uint64], bands: int, rows: int) -> list[bytes]: ...
def collapse_spaces(
    points: npt.NDArray[np.uint32], is_space: npt.NDArray[np.bool_], out: npt.NDArray[np.uint32]
) -> int: ...
def scores(
    query: npt.NDArray[np.uint8] | bytes,
    others: Sequence[Any],
    size_a: int,
    empty: int,
    chance: float,
    width: int = 1,
    /,
) -> tuple[bytes, bytes, bytes]: ...
def rank(
    query: npt.NDArray[np.uint8] | bytes,
    others: Sequence[Any],
    size_a: int,
    empty: int,
    chance: float,
    top: int,
    threshold: float,
    containment: float,
    width: int = 1,
    /,
) -> tuple[list[tuple[int, float, float, float]], tuple[int, int, float, float, float] | None]: ...
def merge_buckets(buckets: Sequence[bytes | None], count: int) -> list[int]: ...
def count_postings(
    lists: Sequence[bytes | None], width: int, full: int, need: int, top: int
) -> list[tuple[int, int]]: ...
def finish(
    wide: npt.NDArray[np.uint64],
    num_perm: int,
    empty: int,
    empty_slot: int,
    signature: npt.NDArray[np.uint64],
    verifier: npt.NDArray[np.uint8],
) -> int: ...
def varints(data: bytes, position: int, count: int) -> tuple[tuple[int, ...], int]: ...
def anchors(points: npt.NDArray[np.uint32], k: int, window: int, seed_key: int, most: int) -> bytes: ...
def sign_batch(
    rows: Sequence[tuple[npt.NDArray[np.uint32], npt.NDArray[np.uint64], npt.NDArray[np.uint8], bool]],
    k: int,
    seed_key: int,
    num_perm: int,
    empty: int,
    empty_slot: int,
    anchor_k: int,
    window: int,
    anchor_seed: int,
    most: int,
) -> SignBatch: ...

class SignBatch:
    def wait(self) -> list[tuple[int, int, bytes | None]]: ...

def passages(
    mine: bytes, other: bytes, k: int, gap: int, shift: int, repeats: int, limit: int
) -> list[tuple[int, int, int, int, int]]: ...
def posting_keys(anchors: bytes, prefix: bytes) -> list[bytes]: ...
def join_postings(
    names: Sequence[bytes], lists: Sequence[bytes | None], entry: bytes, full: int, into: dict[bytes, Any]
) -> tuple[int, int]: ...
def leave_entries(
    names: Sequence[bytes],
    stored: Sequence[bytes | None],
    entry: bytes,
    masked: bool,
    full: int,
    into: dict[bytes, Any],
    sizes: list[int] | None,
) -> tuple[int, int, list[bytes]]: ...
def pack_changes(changes: dict[bytes, bytes | None]) -> bytes: ...
def split_changes(
    changes: dict[bytes, bytes | None], prefixes: bytes
) -> tuple[bytes | None, dict[bytes, bytes | None]]: ...

class HeldTable:
    def get_many(self, keys: list[bytes], /) -> list[bytes | None]: ...
    def apply(self, data: bytes, /) -> int: ...
    def pack_range(self, step: int, steps: int, most: int, /) -> list[bytes]: ...
    def reserve(self, count: int, /) -> None: ...
    def items(self, start: int, most: int, /) -> tuple[list[tuple[bytes, bytes]], int]: ...
    def __len__(self) -> int: ...

def join_buckets(
    names: Sequence[bytes],
    buckets: Sequence[bytes | None],
    entry: bytes,
    limit: int,
    into: dict[bytes, Any],
    sizes: list[int],
) -> int: ...

# _decide.c: an indexed article (core/dedup.py's IndexedArticle) as a state record and as a verdict
def encode_record(article: Any, /) -> bytes: ...
def verdict_json(article: Any, params: bytes, latency_ms: float | None, /) -> bytes: ...
def decide_fresh(
    items: list[tuple[Any, ...]], seq: int, context: tuple[Any, ...], /
) -> tuple[list[tuple[bytes, bytes, str, bool]], int, tuple[int, int, int, int, int, int | None, int]]: ...

_Signed = TypeVar("_Signed", bound=tuple[Any, ...])

# _decide.c: a signed record (pipeline/wire.py's encode_signed) as `signed_type`, None where it
# leaves the record to wire.decoded_signed
def signed_record(data: bytes, signed_type: type[_Signed], provenance: type[Any], /) -> _Signed | None: ...

# _shard.c: the index shard's rules for each article (its comment says what each takes)
def input_key(provenance: tuple[Any, ...], /) -> str: ...
def replayed(
    provenance: tuple[Any, ...], offset: int, applied_offset: int, inputs: dict[str, int], /
) -> bool: ...
def latency_ms(timestamp_ms: int | None, now_ms: float, /) -> float | None: ...
def mark(memory: Any, offset: int, index: int, deciding: bool, /) -> None: ...
def marked(memory: Any, /) -> tuple[int, int, bool]: ...
def mark_deciding(memory: Any, offset: int, indexes: Sequence[int], n: int, /) -> None: ...
def signed_records(
    message: bytes, signed_type: type[_Signed], provenance: type[Any], memory: Any, offset: int, /
) -> tuple[list[_Signed | bytes], int] | None: ...
def fresh_rows(
    items: Sequence[Any], shell: tuple[Any, ...], /
) -> tuple[list[tuple[Any, ...]], list[str]]: ...
def fresh_results(
    items: Sequence[Any],
    rows_and_keys: tuple[list[tuple[Any, ...]], list[str]],
    written: list[tuple[bytes, bytes, str, bool]],
    shell: tuple[Any, ...],
    /,
) -> tuple[list[Any], int]: ...
