"""Build service/data/sample_news.jsonl: ~200 real articles plus seeded near-duplicates of them.

Articles come from the corpus of build_news_corpus.py (public-domain U.S. State of the Union address
excerpts, see service/data/README.md). A seeded subset of them gets one or more derived copies:

  <id>-syn     syndicated copy: byline and outlet line before, copyright footer after
  <id>-edit    lightly edited copy: ~3% of the words substituted, deleted or inserted
  <id>-trunc   truncated copy: the first 60-80% of the text
  <id>-repost  exact re-post of the text under a new id
  <id>-ws      same words with different whitespace, line wrapping and letter case

Originals are n0001..n0200 in stream order; each copy is placed after its original at a random
distance (so mostly not adjacent), and about 1 copy in 10 comes before its original. Records have the
article format {"id", "title", "text", "source", "url"}. Deterministic for a given seed and corpus.

Usage: python tests/data/make_sample_news.py [--corpus FILE] [--out service/data/sample_news.jsonl]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))

import build_news_corpus  # noqa: E402
from make_labelled_set import edit_words, jaccard, reformat_whitespace_case, syndicate, truncate  # noqa: E402

N_ARTICLES = 200
COPY_PROB = {"syn": 0.32, "edit": 0.32, "trunc": 0.30, "repost": 0.22, "ws": 0.22}
SEED = 7
MAX_TEXT = 3000  # keep the committed file small


def variant(kind: str, text: str, rng: random.Random) -> str:
    if kind == "syn":
        return syndicate(text, rng)
    if kind == "edit":
        return edit_words(text, rng, 0.03)
    if kind == "trunc":
        return truncate(text, rng.uniform(0.6, 0.8))
    if kind == "repost":
        return text
    if kind == "ws":
        return reformat_whitespace_case(text, rng)
    raise ValueError(kind)


def build(corpus: list[dict[str, str]], seed: int = SEED) -> list[dict[str, str]]:
    rng = random.Random(seed)
    pool = sorted((r for r in corpus if len(r["text"]) <= MAX_TEXT), key=lambda r: r["id"])
    chosen = sorted(rng.sample(pool, N_ARTICLES), key=lambda r: r["id"])
    rng.shuffle(chosen)
    keyed: list[tuple[float, str, dict[str, str]]] = []
    for i, src in enumerate(chosen, 1):
        nid = f"n{i:04d}"
        base = {
            "id": nid,
            "title": src["title"],
            "text": src["text"],
            "source": src["source"],
            "url": src["url"],
        }
        pos = float(i)
        keyed.append((pos, nid, base))
        for kind, prob in COPY_PROB.items():
            if rng.random() >= prob:
                continue
            rec = dict(base, id=f"{nid}-{kind}", text=variant(kind, src["text"], rng))
            if kind == "syn":
                rec["source"] = "syndicated copy"
                del rec["url"]
            gap = rng.uniform(-12, -1) if rng.random() < 0.1 else rng.expovariate(1 / 15) + 0.5
            keyed.append((pos + gap, rec["id"], rec))
    keyed.sort(key=lambda t: (t[0], t[1]))
    return [rec for _, _, rec in keyed]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", type=Path, default=build_news_corpus.CACHE / "corpus.jsonl")
    ap.add_argument("--out", type=Path, default=REPO / "service" / "data" / "sample_news.jsonl")
    ap.add_argument("--seed", type=int, default=SEED)
    args = ap.parse_args()
    records = build(build_news_corpus.load_corpus(args.corpus), args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", encoding="utf-8", newline="\n") as fh:
        for rec in records:
            fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
    originals = {r["id"]: r["text"] for r in records if "-" not in r["id"]}
    kinds: dict[str, list[float]] = {}
    before = 0
    order = {r["id"]: i for i, r in enumerate(records)}
    for r in records:
        if "-" in r["id"]:
            src, kind = r["id"].split("-", 1)
            kinds.setdefault(kind, []).append(jaccard(originals[src], r["text"]))
            before += order[r["id"]] < order[src]
    print(
        f"wrote {args.out}: {len(records)} records, {len(originals)} originals, "
        f"{len(records) - len(originals)} copies ({before} before their original), "
        f"{args.out.stat().st_size / 1e6:.2f} MB"
    )
    for kind, v in kinds.items():
        print(
            f"  {kind:<7} n={len(v):3d}  char-5 Jaccard mean {sum(v) / len(v):.3f} "
            f"[{min(v):.3f}, {max(v):.3f}]"
        )


if __name__ == "__main__":
    main()
