"""All engine parameters in one frozen value, with the header that state written under them carries."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import Error
from .anchors import ANCHOR_K, ANCHOR_WINDOW
from .lsh import LshParams, explicit_params, optimal_params
from .minhash import ALGORITHM, VERIFIER_BITS, MinHasher
from .normalize import DEFAULT_NORMALIZE, NormalizeOptions
from .shingle import DEFAULT_SHINGLE, ShingleOptions

# 7: anchors (winnowed long shingles) in records and posting lists; 6: deletion markers (a re-added
# id continues its versions); 5: capped buckets, clusters, event
# times, records without signatures, varint heads
STATE_FORMAT_VERSION = 7


class IncompatibleState(Error):
    """State was written with parameters that would make its signatures or band keys meaningless."""


@dataclass(frozen=True)
class DedupParams:
    """What the engine decides with. Only the fields in `header()` must match stored state; the
    verdict thresholds may change between runs."""

    threshold: float = 0.8
    containment_threshold: float | None = 0.9
    # anchor containment from which an article reusing an earlier one's text is `revised`
    revised_threshold: float | None = 0.3
    # the containment index (anchors and their posting lists): excerpts and revisions found at any
    # Jaccard, for a share of the throughput (tests/benchmarks/CONTAINMENT.md). On by default: a
    # reader misses most excerpts and rewrites without it. Off, `partial` comes from LSH candidates
    # alone and there is no `revised`; state written without anchors keeps opening that way
    containment_index: bool = True
    lsh_threshold: float | None = None
    fn_weight: float = 0.5
    bands: int | None = None
    rows: int | None = None
    num_perm: int = 128
    verify_perm: int = 512
    seed: int = 1
    shingle: ShingleOptions = DEFAULT_SHINGLE
    normalize: NormalizeOptions = DEFAULT_NORMALIZE
    top_candidates: int = 3
    max_candidates: int = 1000
    lsh: LshParams = field(init=False, repr=False, compare=False)
    # audit() as computed once: every verdict carries it, and rebuilding it per article is a cost
    # on the hot path for a value that never changes
    _audit: dict[str, Any] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in FIELD_BOUNDS:
            if (problem := bound_problem(name, getattr(self, name))) is not None:
                raise ValueError(f"{name} {problem}")
        if self.verify_perm != 0 and (not 2 <= self.verify_perm <= 4096 or self.verify_perm % self.num_perm):
            raise ValueError(
                f"verify_perm must be 0 (off) or a multiple of num_perm={self.num_perm} up to 4096, "
                f"got {self.verify_perm}"
            )
        if (self.bands is None) != (self.rows is None):
            raise ValueError("give both bands and rows, or neither")
        if self.bands is not None and self.rows is not None:
            lsh = explicit_params(self.candidate_threshold, self.bands, self.rows, self.num_perm)
        else:
            lsh = _cached_optimal(self.candidate_threshold, self.num_perm, self.fn_weight)
        object.__setattr__(self, "lsh", lsh)
        limits = {n: getattr(self, n) for n in ("threshold", "containment_threshold", "revised_threshold")}
        # verify_bits: how the Jaccard estimate was made, for an auditor who recomputes it. Not in the
        # header: state written with wider slots is narrowed when read, so it stays usable.
        object.__setattr__(self, "_audit", {**self.header(), "verify_bits": VERIFIER_BITS, **limits})

    @property
    def candidate_threshold(self) -> float:
        """The similarity LSH is tuned for: below the verdict threshold, so that pairs just above it
        are found almost surely, and low enough to reach truncated copies when containment is on."""
        if self.lsh_threshold is not None:
            return self.lsh_threshold
        return 0.5 if self.containment_threshold is not None else max(0.05, self.threshold - 0.2)

    @property
    def hasher(self) -> MinHasher:
        return MinHasher(self.num_perm, self.seed)

    def header(self) -> dict[str, Any]:
        """What stored signatures and band keys depend on; state refuses to open under another."""
        return {
            "format": STATE_FORMAT_VERSION,
            "algorithm": ALGORITHM,
            "seed": self.seed,
            "num_perm": self.num_perm,
            "verify_perm": self.verify_perm,
            "k": self.shingle.k,
            "unit": self.shingle.unit,
            "normalize": self.normalize.tag(),
            "bands": self.lsh.bands,
            "rows": self.lsh.rows,
            "anchors": f"winnow-k{ANCHOR_K}-w{ANCHOR_WINDOW}" if self.containment_index else "none",
        }

    def audit(self) -> dict[str, Any]:
        """Parameters a verdict carries so that a consumer can audit the decision (a copy)."""
        return dict(self._audit)


# Each field's own bounds, as the words that follow its name when a value is refused: DedupParams
# checks with them, and so does the settings table (service/config.py) for each mode's spelling of
# the name, so that a value is refused in the same words whichever way it was given.
FIELD_BOUNDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "threshold": (lambda v: 0.0 < v <= 1.0, "must be in (0, 1]"),
    "containment_threshold": (lambda v: v is None or 0.0 < v <= 1.0, "must be in (0, 1] or None"),
    "revised_threshold": (lambda v: v is None or 0.0 < v <= 1.0, "must be in (0, 1] or None"),
    "lsh_threshold": (lambda v: v is None or 0.0 < v < 1.0, "must be in (0, 1) or None"),
    "fn_weight": (lambda v: 0.0 <= v <= 1.0, "must be in [0, 1]"),
    "bands": (lambda v: v is None or v >= 1, "must be ≥ 1 or None"),
    "rows": (lambda v: v is None or v >= 1, "must be ≥ 1 or None"),
    "num_perm": (lambda v: 2 <= v <= 4096, "must be in 2..4096"),
    "seed": (lambda v: 0 <= v < 2**63, "must be in 0..2**63-1"),
    "top_candidates": (lambda v: v >= 1, "must be ≥ 1"),
    "max_candidates": (lambda v: v >= 1, "must be ≥ 1"),
}


def bound_problem(name: str, value: Any) -> str | None:
    """Why `value` is out of the field's bounds (the words after its name), or None."""
    accepts, reason = FIELD_BOUNDS[name]
    return None if accepts(value) else f"{reason}, got {value}"


# optimal_params' choice for the default settings, which every process makes as it starts: the
# areas of that one banding instead of the search over all of them (the same LshParams: test_lsh.py)
KNOWN_CHOICES = {(0.5, 128, 0.5): (25, 5)}


@functools.cache
def _cached_optimal(threshold: float, num_perm: int, fn_weight: float) -> LshParams:
    """optimal_params, once per (threshold, num_perm, fn_weight): params are made often."""
    known = KNOWN_CHOICES.get((threshold, num_perm, fn_weight))
    if known is None:
        return optimal_params(threshold, num_perm, fn_weight)
    return explicit_params(threshold, *known, num_perm)


# header fields named otherwise than the setting that gives them, for the refusal to name it
_SETTING_OF = {"anchors": "containment_index", "k": "shingle_size", "unit": "word_shingles"}
# State an earlier version wrote by default has no anchors, and its records cannot give them (they
# come from the texts): the refusal says both ways out, since the index is now on by default.
_NO_ANCHORS_HINT = (
    "; it was written without the containment index (the default before it was on): set "
    "NEARDUP_CONTAINMENT_INDEX=false (--no-containment-index, containment_index=False) to keep "
    "using it as it is, or run over the input again with a new state directory to index anchors"
)


def check_header(stored: dict[str, Any], expected: dict[str, Any], where: str) -> None:
    """Raise IncompatibleState naming every field that differs (and its setting where the names differ)."""
    diffs = [
        f"{key}: stored {stored.get(key)!r}, configured {value!r}"
        + (f" (setting {_SETTING_OF[key]})" if key in _SETTING_OF else "")
        for key, value in expected.items()
        if stored.get(key) != value
    ]
    if diffs:
        anchorless = stored.get("anchors") == "none" and expected.get("anchors", "none") != "none"
        raise IncompatibleState(
            f"state at {where} was written with incompatible parameters ({'; '.join(diffs)}); "
            "use the same parameters or a new state directory" + (_NO_ANCHORS_HINT if anchorless else "")
        )
