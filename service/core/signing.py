"""Stage 1, "sign": article text → sketch (content hash, MinHash signature, shingle count)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import mmh3
import numpy as np

from ..errors import Error
from ._hashing import HashArray
from .anchors import NO_ANCHORS, WINNOWING, Anchors, anchors_of
from .minhash import BatchRow, VerifierArray, estimate_jaccard, estimate_jaccard_verified
from .normalize import CodePoints, canonical_code_points, code_points, has_visible, normalize
from .params import DedupParams
from .shingle import shingle_hashes


class EmptyText(Error, ValueError):
    """Nothing is left of the text after normalization: there is nothing to compare."""


@dataclass(frozen=True, eq=False)
class Sketch:
    """One article's sketch: everything the index stage needs about its text, which is not kept
    (content hash, MinHash signature and verifier, distinct shingle count). "Fingerprint" is the
    passage measures' word (local_similarity/fingerprint.py, fuzzy.py): a text's set of chunk
    digests."""

    content_hash: bytes
    signature: HashArray
    shingle_count: int
    short: bool
    verifier: VerifierArray = field(default_factory=lambda: np.empty(0, dtype=np.uint8))
    # winnowed long shingles with their offsets: containment across sizes, and the shared passages
    anchors: Anchors = NO_ANCHORS

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Sketch)
            and self.content_hash == other.content_hash
            and self.shingle_count == other.shingle_count
            and self.short == other.short
            and bool(np.array_equal(self.signature, other.signature))
            and bool(np.array_equal(self.verifier, other.verifier))
            and self.anchors == other.anchors
        )

    def estimate_jaccard(self, other: Sketch) -> float:
        """From the finest sketches both carry: the verifiers when both have equal-length ones."""
        if self.verifier.size and self.verifier.size == other.verifier.size:
            return estimate_jaccard_verified(self.verifier, other.verifier)
        return estimate_jaccard(self.signature, other.signature)

    __hash__ = None  # type: ignore[assignment]


def sketch_of(text: str, params: DedupParams, max_points: int | None = None) -> Sketch:
    """Normalize, shingle, sign, and pick the anchors (character shingles, containment index on).
    Raises EmptyText when the canonical text has nothing to shingle: no character, under word
    shingles no word (whitespace the normalization keeps is none), or no character that shows
    (normalize.has_visible); and normalize.TooLong when normalisation takes it beyond `max_points`
    characters (None: no limit)."""
    if params.shingle.unit == "char":
        points = _canonical(text, params, max_points)
        units = points.size
        signature, verifier, distinct = params.hasher.sketches_of_units(
            points, params.shingle.k, params.verify_perm
        )
        anchors = anchors_of(points) if params.containment_index else NO_ANCHORS
    else:
        canonical = normalize(text, params.normalize, max_points)
        units = len(canonical.split())
        if not units:  # an empty set would match every other one with a Jaccard of 1
            raise EmptyText("text has no word after normalization")
        points = code_points(canonical)
        if not has_visible(points):
            raise EmptyText("text has only invisible characters after normalization")
        signature, verifier, distinct = params.hasher.sketches(
            shingle_hashes(canonical, params.shingle), params.verify_perm
        )
        anchors = NO_ANCHORS  # anchors are character spans: word shingles go without
    return Sketch(_digest(points), signature, distinct, units < params.shingle.k, verifier, anchors)


def _canonical(text: str, params: DedupParams, max_points: int | None) -> CodePoints:
    """The canonical text's code points under character shingles; EmptyText where none shows."""
    points = canonical_code_points(text, params.normalize, max_points)
    if points.size == 0:
        raise EmptyText("text is empty after normalization")
    if not has_visible(points):
        raise EmptyText("text has only invisible characters after normalization")
    return points


def _digest(points: CodePoints) -> bytes:
    """The exact-duplicate key: 128-bit murmur3 of the canonical text's code points."""
    return mmh3.hash_bytes(points.tobytes())


Passed = tuple[int, int, bytes | None]  # a text's distinct count, unfilled slots, packed anchors


class SketchBatch:
    """The sketches of many texts, each what sketch_of gives it (or the exception it raises), with
    their compiled passes (shingling and MinHash, the verifier, the anchors: most of signing's time)
    on a thread of their own (_sketch.sign_batch) from the start until `results`: a caller signs
    one batch while it decides the one before. Normalization and what follows the passes stay on
    the caller's thread, as does every text the passes do not take as they are (shorter than k,
    word shingles, no verifier): sketch_of signs those."""

    def __init__(self, texts: Sequence[str], params: DedupParams, max_points: int | None = None) -> None:
        self.params, self.max_points, rows = params, max_points, []
        # each text's result, or (text, its points and the buffers its passes write) while under way
        self._texts: list[Sketch | Exception | tuple[str, BatchRow]] = []
        hasher, k = params.hasher, params.shingle.k
        passes = params.shingle.unit == "char" and params.verify_perm > 0  # a multiple of num_perm: params
        for text in texts:
            try:
                points = _canonical(text, params, max_points) if passes else None
                if points is None or points.size < k:
                    self._texts.append(sketch_of(text, params, max_points))
                    continue
                rows.append((points, *hasher.batch_buffers(params.verify_perm), params.containment_index))
                self._texts.append((text, rows[-1]))
            except Exception as exc:  # the caller turns each into a dead letter
                self._texts.append(exc)
        self._batch = hasher.start_batch(rows, k, WINNOWING)

    @property
    def refused(self) -> bool:
        """Whether a text is refused already (empty, too long: found before the passes)."""
        return any(isinstance(done, Exception) for done in self._texts)

    def results(self) -> list[Sketch | Exception]:
        """Each text's sketch, or what sketch_of raised for it, in order (once: the buffers go)."""
        try:
            passed: Iterator[Passed] | None = iter(self._batch.wait())
        except MemoryError:  # each text signed again by itself, its own failure its dead letter
            passed = None
        return [self._result(done, passed) for done in self._texts]

    def _result(
        self,
        done: Sketch | Exception | tuple[str, BatchRow],
        passed: Iterator[Passed] | None,
    ) -> Sketch | Exception:
        """A text's sketch from its passes (None: they failed, it is signed by itself)."""
        if not isinstance(done, tuple):
            return done
        text, (points, signature, verifier, _) = done
        try:
            if passed is None:
                return sketch_of(text, self.params, self.max_points)
            distinct, unfilled, packed = next(passed)
            signature = self.params.hasher.densified(signature, unfilled)
            anchors = NO_ANCHORS if packed is None else Anchors(packed)
            return Sketch(_digest(points), signature, distinct, False, verifier, anchors)
        except Exception as exc:
            return exc
