"""`neardup evaluate`: LSH + MinHash verdicts against brute-force exact Jaccard, pair by pair."""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from .core.dedup import score
from .core.lsh import band_keys
from .core.normalize import normalize
from .core.params import DedupParams
from .core.shingle import shingle_set
from .core.signing import sketch_of
from .messages import Article
from .pipeline.shard import IndexShard
from .pipeline.wire import Provenance, Signed
from .state.index import DEFAULT_BUCKET_CAP
from .state.memory import MemoryState


@dataclass
class Confusion:
    tp: int = 0
    fp: int = 0
    fn: int = 0
    tn: int = 0

    def add(self, predicted: bool, actual: bool) -> None:
        self.tp += predicted and actual
        self.fp += predicted and not actual
        self.fn += actual and not predicted
        self.tn += not predicted and not actual

    def row(self, label: str) -> str:
        precision = self.tp / (self.tp + self.fp) if self.tp + self.fp else 1.0
        recall = self.tp / (self.tp + self.fn) if self.tp + self.fn else 1.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        return (
            f"{label:<28} TP={self.tp:<6} FP={self.fp:<6} FN={self.fn:<6} TN={self.tn:<9} "
            f"precision={precision:.4f} recall={recall:.4f} F1={f1:.4f}"
        )


@dataclass
class Evaluation:
    articles: int
    pairs: int
    all_pairs: Confusion = field(default_factory=Confusion)
    outside_margin: Confusion = field(default_factory=Confusion)
    candidates_found: int = 0
    true_pairs: int = 0
    # candidate pairs credited through an exact copy: the index proposed the copy's content
    # holder, which stands for it (copies stay out of the buckets)
    represented: int = 0
    abs_errors: list[float] = field(default_factory=list)
    samples: list[tuple[str, list[tuple[str, float, float | None]]]] = field(default_factory=list)


def evaluate(
    articles: Sequence[Article],
    params: DedupParams,
    margin: float = 0.05,
    sample_size: int = 5,
    bucket_cap: int = DEFAULT_BUCKET_CAP,
) -> Evaluation:
    """Every pair (later, earlier) is labelled by exact Jaccard ≥ threshold and predicted by the
    engine: a pair is predicted a duplicate when LSH proposes it, or proposes the holder of its
    content when it is an exact copy (the index keeps copies out of the buckets, represented by
    that holder, whose estimate is theirs), and its estimate passes."""
    sets = [shingle_set(normalize(a.text, params.normalize), params.shingle) for a in articles]
    # what embedded mode and the worker decide and apply with
    shard = IndexShard(MemoryState(bucket_cap), params)
    banding = (params.lsh.bands, params.lsh.rows)
    estimates: list[dict[int, float]] = []
    index_of = {a.article_id: i for i, a in enumerate(articles)}
    same_content: dict[bytes, list[int]] = {}
    result = Evaluation(articles=len(articles), pairs=len(articles) * (len(articles) - 1) // 2)
    for i, article in enumerate(articles):
        sketch = sketch_of(article.text, params)
        keys = tuple(band_keys(sketch.signature, *banding))
        found: dict[int, float] = {}
        for other in shard.state.candidates(keys, article.article_id, params.max_candidates):
            estimate = score(sketch, other.sketch, other.article_id).jaccard
            found[index_of[other.article_id]] = estimate
            for copy in same_content.get(other.sketch.content_hash, ()):
                if copy not in found:
                    found[copy] = estimate
                    result.represented += 1
        estimates.append(found)
        same_content.setdefault(sketch.content_hash, []).append(i)
        src = Provenance("evaluate", None, i, None)
        shard.decide([Signed.of(article.article_id, sketch, src, keys, banding, time_ms=i)])

    rng = random.Random(7)  # the same articles sampled on every run
    sampled = set(rng.sample(range(1, len(articles)), min(sample_size, max(len(articles) - 1, 0))))
    for i, exact_row in enumerate(exact_jaccard_rows(sets)):  # row 0 is empty, and never sampled
        for j, exact in enumerate(exact_row.tolist()):
            proposed = estimates[i].get(j)
            predicted = proposed is not None and proposed >= params.threshold
            actual = exact >= params.threshold
            result.all_pairs.add(predicted, actual)
            if abs(exact - params.threshold) > margin:
                result.outside_margin.add(predicted, actual)
            result.true_pairs += actual
            result.candidates_found += actual and proposed is not None
            if proposed is not None:
                result.abs_errors.append(abs(proposed - exact))
        if i in sampled:
            top = np.argsort(exact_row)[::-1][:3]
            nearest = [(articles[j].article_id, exact_row[j], estimates[i].get(int(j))) for j in top]
            result.samples.append((articles[i].article_id, nearest))
    return result


def exact_jaccard_rows(sets: Sequence[np.ndarray]) -> Iterator[np.ndarray]:
    """Row i: exact Jaccard of set i with every earlier set 0..i-1, by brute force.

    Every pair is computed exactly; instead of one intersection per pair, set i is marked in a
    boolean vector over the global vocabulary and all earlier sets are counted against it at once
    (gather + bincount): one numpy pass per set instead of a Python loop over every pair."""
    if not sets:
        return
    vocabulary, ids = np.unique(np.concatenate(sets), return_inverse=True)
    sizes = np.array([s.size for s in sets], dtype=np.int64)
    offsets = np.concatenate(([0], np.cumsum(sizes)))
    owner = np.repeat(np.arange(len(sets)), sizes)
    mark = np.zeros(vocabulary.size, dtype=bool)
    for i in range(len(sets)):
        own = ids[offsets[i] : offsets[i + 1]]
        mark[own] = True
        upto = offsets[i]
        inter = np.bincount(owner[:upto], weights=mark[ids[:upto]], minlength=i)[:i]
        mark[own] = False
        union = sizes[:i] + sizes[i] - inter
        yield np.where(union > 0, inter / np.maximum(union, 1), 1.0)  # never a division by zero


def render(result: Evaluation, params: DedupParams, margin: float) -> str:
    lines = [
        f"articles={result.articles} pairs={result.pairs} threshold={params.threshold} "
        f"num_perm={params.num_perm} bands={params.lsh.bands} rows={params.lsh.rows} "
        f"(LSH tuned for s={params.candidate_threshold})",
        result.all_pairs.row("all pairs"),
        result.outside_margin.row(f"pairs with |J-t|>{margin}"),
        f"LSH candidate recall on true pairs: {result.candidates_found}/{result.true_pairs} "
        f"({result.represented} candidate pairs through an exact copy's content holder)",
    ]
    if result.abs_errors:
        errors = np.asarray(result.abs_errors)
        lines.append(
            f"estimate vs exact Jaccard on candidate pairs: mean |err|={errors.mean():.4f} "
            f"p99 |err|={np.quantile(errors, 0.99):.4f} (n={errors.size})"
        )
    for article_id, top in result.samples:
        lines.append(f"top-3 earlier articles most similar to {article_id}:")
        for other_id, exact, estimate in top:
            est = "not a candidate" if estimate is None else f"estimate={estimate:.3f}"
            lines.append(f"    {other_id:<24} exact={exact:.3f} {est}")
    return "\n".join(lines)
