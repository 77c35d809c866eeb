"""The excerpt and revision test set: pairs built by script from public-domain prose, with their
ground truth computed exactly (containment and Jaccard of the canonical texts' 5-shingle sets, by
brute force).

Pair kinds (`Pair.kind`):
- ``excerpt-sentences`` / ``excerpt-cut``: 10-40% of a source, whole sentences or cut anywhere;
  ``excerpt-200`` / ``excerpt-300``: that many characters cut anywhere;
- ``revision``: paragraphs (sentences) dropped and added from another text, sentences reordered,
  words substituted, keeping `kept` of the source's sentences;
- ``quoted``: a passage of the source quoted inside another text;
- ``unrelated``: two texts from different addresses.

Each pair is (earlier, later): an excerpt arrives after its source (`excerpt_first` False) or
before it (True), so both orders are tested. Sources: the news corpus (tests/data/build_news_corpus.py)
when given, else the bundled sample's originals.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from neardup.core.normalize import normalize
from neardup.core.shingle import shingle_set

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "service" / "data" / "sample_news.jsonl"
_SENTENCE = re.compile(r"(?<=[.!?])\s+")


@dataclass(frozen=True)
class Pair:
    kind: str
    earlier: str  # canonical texts
    later: str
    excerpt_first: bool
    containment: float  # share of `later`'s 5-shingles found in `earlier`
    contains: float  # share of `earlier`'s found in `later`
    jaccard: float
    kept: float = 1.0  # revisions: the share of the source's sentences kept


def load_sources(path: Path | None, limit: int, seed: int) -> list[dict[str, Any]]:
    """Distinct originals (the sample's near-duplicates left out), at most `limit`, shuffled."""
    records = [orjson.loads(line) for line in (path or SAMPLE).read_bytes().splitlines() if line.strip()]
    originals = [r for r in records if "-" not in r["id"] or path is not None]
    random.Random(seed).shuffle(originals)
    return originals[:limit]


def _address(record: dict[str, Any]) -> str:
    """The address an excerpt of the corpus comes from: texts of one address share phrases."""
    return str(record.get("url") or record.get("title", "")).split(" (part")[0]


def truth(a: str, b: str) -> tuple[float, float, float]:
    """(containment of b in a, of a in b, Jaccard), exactly, on 5-shingle sets."""
    sa, sb = shingle_set(a), shingle_set(b)
    both = np.intersect1d(sa, sb, assume_unique=True).size
    return both / max(sb.size, 1), both / max(sa.size, 1), both / max(np.union1d(sa, sb).size, 1)


def _pair(kind: str, source: str, other: str, excerpt_first: bool, kept: float = 1.0) -> Pair:
    """`other` derived from `source`; `earlier` is the one that arrives first."""
    earlier, later = (other, source) if excerpt_first else (source, other)
    inside, contains, jaccard = truth(earlier, later)
    return Pair(kind, earlier, later, excerpt_first, inside, contains, jaccard, kept)


def _sentences(text: str) -> list[str]:
    return [s for s in _SENTENCE.split(text) if s]


def excerpt_sentences(text: str, share: float, rng: random.Random) -> str:
    """Consecutive whole sentences, from a random one on, until `share` of the text is reached
    (going back from the end when the text ends first)."""
    sentences = _sentences(text)
    start = end = rng.randrange(len(sentences))
    while len(" ".join(sentences[start:end])) < share * len(text):
        if end < len(sentences):
            end += 1
        else:
            start -= 1
    return " ".join(sentences[start:end])


def excerpt_cut(text: str, length: int, rng: random.Random) -> str:
    length = min(length, len(text))
    start = rng.randrange(len(text) - length + 1)
    return text[start : start + length].strip()


def revise(text: str, filler: str, keep: float, rng: random.Random) -> str:
    """Sentences dropped down to `keep`, as many added from `filler`, some reordered, 3% of the
    kept words substituted."""
    sentences = _sentences(text)
    kept = sorted(rng.sample(range(len(sentences)), max(1, round(keep * len(sentences)))))
    out = [sentences[i] for i in kept]
    extra = _sentences(filler)
    for sentence in rng.sample(extra, min(len(extra), len(sentences) - len(kept))):
        out.insert(rng.randrange(len(out) + 1), sentence)
    for _ in range(max(1, len(out) // 6)):  # a few neighbours swapped
        i = rng.randrange(len(out))
        j = min(len(out) - 1, i + 1)
        out[i], out[j] = out[j], out[i]
    words = " ".join(out).split(" ")
    for _ in range(max(1, len(words) * 3 // 100)):
        words[rng.randrange(len(words))] = rng.choice(["report", "county", "official", "new", "week"])
    return " ".join(words)


def quoted(text: str, host: str, share: float, rng: random.Random) -> str:
    passage = excerpt_sentences(text, share, rng)
    sentences = _sentences(host)
    at = rng.randrange(len(sentences) + 1)
    return " ".join([*sentences[:at], f'"{passage}"', *sentences[at:]])


def build(records: list[dict[str, Any]], seed: int = 0, unrelated: int = 2000) -> list[Pair]:
    """The pairs: per source, excerpts (both orders), a revision and a quoted passage; and
    `unrelated` pairs of texts from different addresses."""
    rng = random.Random(seed)
    texts = [normalize(r["text"]) for r in records]
    addresses = [_address(r) for r in records]
    pairs: list[Pair] = []
    for i, text in enumerate(texts):
        first = bool(i % 2)
        j = (i + 1 + rng.randrange(len(texts) - 1)) % len(texts)
        share = rng.uniform(0.10, 0.40)
        pairs.append(_pair("excerpt-sentences", text, excerpt_sentences(text, share, rng), first))
        pairs.append(_pair("excerpt-cut", text, excerpt_cut(text, int(share * len(text)), rng), not first))
        pairs.append(_pair("excerpt-200", text, excerpt_cut(text, 200, rng), first))
        pairs.append(_pair("excerpt-300", text, excerpt_cut(text, 300, rng), not first))
        keep = rng.uniform(0.5, 0.9)
        pairs.append(_pair("revision", text, revise(text, texts[j], keep, rng), False, keep))
        pairs.append(_pair("quoted", text, quoted(text, texts[j], rng.uniform(0.3, 0.5), rng), False))
    count = 0
    while count < unrelated:
        i, j = rng.randrange(len(texts)), rng.randrange(len(texts))
        if addresses[i] != addresses[j]:
            pairs.append(_pair("unrelated", texts[i], texts[j], False))
            count += 1
    return pairs
