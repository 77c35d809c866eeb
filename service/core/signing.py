"""Stage 1, "sign": article text → fingerprint (content hash, MinHash signature, shingle count)."""

from __future__ import annotations

from dataclasses import dataclass, field

import mmh3
import numpy as np
import numpy.typing as npt

from ._hashing import HashArray
from .minhash import VerifierArray
from .normalize import normalize
from .params import DedupParams
from .shingle import shingle_hashes


class EmptyText(ValueError):
    """Nothing is left of the text after normalization: there is nothing to compare."""


@dataclass(frozen=True, eq=False)
class Fingerprint:
    """Everything the index stage needs about one text; the text itself is not kept."""

    content_hash: bytes
    signature: HashArray
    shingle_count: int
    short: bool
    verifier: VerifierArray = field(default_factory=lambda: np.empty(0, dtype=np.uint32))

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Fingerprint)
            and self.content_hash == other.content_hash
            and self.shingle_count == other.shingle_count
            and self.short == other.short
            and bool(np.array_equal(self.signature, other.signature))
            and bool(np.array_equal(self.verifier, other.verifier))
        )

    def similarity_sketch(self, other: Fingerprint) -> tuple[npt.NDArray[np.unsignedinteger], ...]:
        """The finest sketches both carry: the verifiers when both have equal-length ones."""
        if self.verifier.size and self.verifier.size == other.verifier.size:
            return self.verifier, other.verifier
        return self.signature, other.signature

    __hash__ = None  # type: ignore[assignment]


def content_hash(canonical: str) -> bytes:
    """128-bit murmur3 of the canonical text: the exact-duplicate fast path key."""
    return mmh3.hash_bytes(canonical.encode("utf-8", errors="surrogatepass"))


def fingerprint(text: str, params: DedupParams) -> Fingerprint:
    """Normalize, shingle, sign. Raises EmptyText when the canonical text is empty."""
    canonical = normalize(text, params.normalize)
    if not canonical:
        raise EmptyText("text is empty after normalization")
    hashes = shingle_hashes(canonical, params.shingle)
    signature, verifier, distinct = params.hasher.sketches(hashes, params.verify_perm)
    units = len(canonical) if params.shingle.unit == "char" else len(canonical.split())
    short = units < params.shingle.k
    return Fingerprint(content_hash(canonical), signature, distinct, short, verifier)
