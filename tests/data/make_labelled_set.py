"""Build a labelled near-duplicate evaluation set from the real-text corpus.

Sources are drawn (seeded) from the corpus built by build_news_corpus.py; for each source,
`make_variants` derives near-duplicates of controlled edit strength, and unrelated corpus articles are
added as distractors. Output: JSON lines in the article format {"id", "title", "text", "source", "url"},
shuffled (seeded). A variant's id is "<source id>~<kind>", so the derivation is visible, but the ground
truth (which pairs are near-duplicates at a threshold) is computed by brute-force exact Jaccard in
`neardup evaluate`, not taken from the ids.

The edit strengths are chosen so that the exact character-5-shingle Jaccard (after NFKC, casefold and
whitespace collapse) of variant vs. source spreads over about 0.3-1.0; the script prints that
distribution, computed here with a plain set-of-substrings implementation.

`make_variants(text, rng)` and the single transformations (syndicate, edit_words, truncate,
reformat_whitespace_case, ...) are importable for other generators.

Usage:
  python tests/data/make_labelled_set.py [--corpus FILE] [--out FILE] [--sources 300]
                                         [--distractors 700] [--seed 20240501]
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import unicodedata
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import build_news_corpus  # noqa: E402

DEFAULT_OUT = Path.home() / ".cache" / "neardup" / "labelled" / "labelled.jsonl"
SHINGLE = 5

# Fictional outlets and bylines for syndicated copies (no real organization is named).
OUTLETS = (
    "Capital Wire Service",
    "Northern Ledger",
    "Harbor City Gazette",
    "Prairie Daily Courier",
    "Lakeside Morning Post",
    "Continental News Agency",
    "Riverbend Tribune",
    "Summit Evening Star",
)
BYLINES = (
    "By Staff Writer",
    "By Our Washington Correspondent",
    "From Wire Reports",
    "By the Political Desk",
    "By A. Reporter",
    "Special to the {outlet}",
)
DATELINES = ("WASHINGTON —", "WASHINGTON (CWS) —", "WASHINGTON, D.C. —", "")


# --------------------------------------------------------------------------- exact Jaccard (reference)


def normalize(text: str) -> str:
    """NFKC + casefold + whitespace runs collapsed to one space, trimmed."""
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


def shingles(text: str, k: int = SHINGLE) -> set[str]:
    t = normalize(text)
    if len(t) < k:
        return {t} if t else set()
    return {t[i : i + k] for i in range(len(t) - k + 1)}


def jaccard(a: str, b: str, k: int = SHINGLE) -> float:
    sa, sb = shingles(a, k), shingles(b, k)
    if not sa and not sb:
        return 1.0
    return len(sa & sb) / len(sa | sb)


# --------------------------------------------------------------------------- transformations


def _paragraph_words(text: str) -> list[list[str]]:
    return [p.split() for p in re.split(r"\n\s*\n", text) if p.strip()]


def _join(paras: list[list[str]]) -> str:
    return "\n\n".join(" ".join(ws) for ws in paras if ws)


def edit_words(text: str, rng: random.Random, rate: float) -> str:
    """Each word is edited with probability `rate`: substituted (60%) by another word of the same
    text, deleted (25%), or followed by an inserted word (15%). Paragraph breaks are kept."""
    paras = _paragraph_words(text)
    vocab = sorted({w for ws in paras for w in ws})
    out: list[list[str]] = []
    for ws in paras:
        new: list[str] = []
        for w in ws:
            if rng.random() >= rate:
                new.append(w)
                continue
            op = rng.random()
            if op < 0.60:
                new.append(rng.choice(vocab))
            elif op < 0.85:
                continue
            else:
                new.extend((w, rng.choice(vocab)))
        out.append(new)
    return _join(out)


def truncate(text: str, fraction: float) -> str:
    """The first `fraction` of the text, cut back to a word boundary."""
    cut = max(1, int(len(text) * fraction))
    head = text[:cut]
    if cut < len(text) and not text[cut].isspace():
        sp = head.rfind(" ")
        if sp > 0:
            head = head[:sp]
    return head.rstrip()


def syndicate(text: str, rng: random.Random, outlet: str | None = None) -> str:
    """A syndicated copy: byline (and dateline) before, copyright footer after."""
    outlet = outlet or rng.choice(OUTLETS)
    byline = rng.choice(BYLINES).format(outlet=outlet)
    dateline = rng.choice(DATELINES)
    year = rng.randint(2015, 2025)
    footer = rng.choice(
        (
            f"Copyright {year} {outlet}. All rights reserved. This material may not be published, "
            "broadcast, rewritten or redistributed.",
            f"© {year} {outlet}. All rights reserved.",
            f"Distributed by {outlet}. Copyright {year}, all rights reserved.",
        )
    )
    body = f"{dateline} {text}" if dateline else text
    return f"{byline}\n{outlet}\n\n{body}\n\n{footer}"


def reformat_whitespace_case(text: str, rng: random.Random) -> str:
    """Same words, different layout: re-wrapped lines, doubled spaces, tabs, and changed case."""
    paras = _paragraph_words(text)
    style = rng.choice(("upper-first-para", "title-words", "lower", "mixed"))
    out_paras = []
    for pi, ws in enumerate(paras):
        if style == "upper-first-para" and pi == 0:
            ws = [w.upper() for w in ws]
        elif style == "title-words":
            ws = [w.capitalize() if rng.random() < 0.3 else w for w in ws]
        elif style == "lower":
            ws = [w.lower() for w in ws]
        else:
            ws = [w.swapcase() if rng.random() < 0.1 else w for w in ws]
        lines, line = [], ""
        width = rng.randint(50, 90)
        for w in ws:
            sep = rng.choice((" ", " ", " ", "  ", "\t"))
            if line and len(line) + len(w) + 1 > width:
                lines.append(line)
                line = w
            else:
                line = f"{line}{sep}{w}" if line else w
        if line:
            lines.append(line)
        out_paras.append(("\r\n" if pi % 2 else "\n").join(lines))
    return "\n\n\n".join(out_paras) + "\n"


def shuffle_paragraphs(text: str, rng: random.Random) -> str:
    paras = [p for p in re.split(r"\n\s*\n", text) if p.strip()]
    if len(paras) < 2:
        return text
    order = list(range(len(paras)))
    while order == sorted(order):
        rng.shuffle(order)
    return "\n\n".join(paras[i] for i in order)


EDIT_RATES = (0.01, 0.03, 0.06, 0.10, 0.15, 0.22, 0.30, 0.40)
TRUNC_FRACTIONS = (0.9, 0.75, 0.6, 0.45, 0.35)


def make_variants(text: str, rng: random.Random) -> list[tuple[str, str]]:
    """Near-duplicates of `text` of controlled strength, as (kind, variant text).

    Kinds: exact, ws-case, syndicated, shuffle-paras, edit-<rate> (word edit rate), trunc-<fraction>,
    syn+edit-<rate>, trunc+edit-<fraction>-<rate>. Typical exact char-5-shingle Jaccard to `text`:
    1.0 for exact/ws-case, ~0.9 for syndicated, ~fraction for trunc, and decreasing from ~0.95 to
    ~0.3 over the edit rates. Deterministic for a given rng state.
    """
    out: list[tuple[str, str]] = [
        ("exact", text),
        ("ws-case", reformat_whitespace_case(text, rng)),
        ("syndicated", syndicate(text, rng)),
        ("shuffle-paras", shuffle_paragraphs(text, rng)),
    ]
    out += [(f"edit-{r:.2f}", edit_words(text, rng, r)) for r in EDIT_RATES]
    out += [(f"trunc-{f:.2f}", truncate(text, f)) for f in TRUNC_FRACTIONS]
    r = rng.choice((0.02, 0.05))
    out.append((f"syn+edit-{r:.2f}", syndicate(edit_words(text, rng, r), rng)))
    f, r = rng.choice((0.8, 0.6)), rng.choice((0.03, 0.08))
    out.append((f"trunc+edit-{f:.2f}-{r:.2f}", edit_words(truncate(text, f), rng, r)))
    return out


# --------------------------------------------------------------------------- build


def histogram(values: Sequence[float], lo: float = 0.0, step: float = 0.1) -> list[str]:
    bins = [0] * int(round((1.0 - lo) / step) + 1)
    for v in values:
        bins[min(int((v - lo) / step + 1e-9), len(bins) - 1)] += 1
    total = max(1, len(values))
    rows = []
    for i, n in enumerate(bins):
        a = lo + i * step
        label = f"[{a:.1f},{a + step:.1f})" if i < len(bins) - 1 else "  = 1.0  "
        rows.append(f"  {label:>10} {n:6d} {'#' * round(60 * n / total)}")
    return rows


def build(corpus: list[dict[str, str]], n_sources: int, n_distractors: int, seed: int):
    rng = random.Random(seed)
    pool = sorted(corpus, key=lambda r: r["id"])
    picked = rng.sample(pool, min(len(pool), n_sources + n_distractors))
    sources, distractors = picked[:n_sources], picked[n_sources:]
    records: list[dict[str, str]] = []
    scores: list[tuple[str, float]] = []
    for src in sources:
        base = {k: src[k] for k in ("id", "title", "text", "source", "url") if k in src}
        records.append(base)
        for kind, vtext in make_variants(src["text"], rng):
            rec = dict(base, id=f"{src['id']}~{kind}", text=vtext)
            if kind.startswith("syn"):
                rec["source"] = "syndicated copy"
                rec.pop("url", None)
            records.append(rec)
            scores.append((kind, jaccard(src["text"], vtext)))
    for d in distractors:
        records.append({k: d[k] for k in ("id", "title", "text", "source", "url") if k in d})
    rng.shuffle(records)
    return records, scores


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", type=Path, default=build_news_corpus.CACHE / "corpus.jsonl")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--sources", type=int, default=300)
    ap.add_argument("--distractors", type=int, default=700)
    ap.add_argument("--seed", type=int, default=20240501)
    args = ap.parse_args()
    corpus = build_news_corpus.load_corpus(args.corpus)
    records, scores = build(corpus, args.sources, args.distractors, args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", encoding="utf-8") as fh:
        for rec in records:
            fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
    print(
        f"wrote {args.out}: {len(records)} records ({args.sources} sources, {len(scores)} variants, "
        f"{args.distractors} distractors)"
    )
    vals = [s for _, s in scores]
    print(f"exact char-{SHINGLE}-shingle Jaccard, variant vs source (n={len(vals)}):")
    print("\n".join(histogram(vals)))
    by_kind: dict[str, list[float]] = {}
    for kind, s in scores:
        key = re.sub(r"^(syn\+edit|trunc\+edit)-.*", r"\1", kind)
        by_kind.setdefault(key, []).append(s)
    print("per kind: mean [min, max]")
    for kind in sorted(by_kind, key=lambda k: -sum(by_kind[k]) / len(by_kind[k])):
        v = by_kind[kind]
        print(f"  {kind:<14} {sum(v) / len(v):.3f} [{min(v):.3f}, {max(v):.3f}]  n={len(v)}")


if __name__ == "__main__":
    main()
