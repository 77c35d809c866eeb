"""Build service/data/prefix_reference.json: the a-priori prefix-class distribution of English index terms.

Fuzzy-fingerprints compare, per chunk, how often index terms fall into k prefix classes against a
reference distribution. This script computes that reference from the English word frequencies of the
`wordfreq` package (pinned in pyproject: wordfreq==3.1.1, wordlist "large", language "en").

Source and licence of the data: wordfreq's English frequencies combine Wikipedia, subtitles
(OpenSubtitles 2018, SUBTLEX), news (NewsCrawl 2014, GlobalVoices), books (Google Books Ngrams 2012),
web text (OSCAR), Twitter and Reddit (wordfreq README, "Sources and supported languages"). wordfreq's
code is Apache-2.0; its data files are redistributable under CC BY-SA 4.0, so the derived numbers in
prefix_reference.json are distributed under CC BY-SA 4.0 with attribution to wordfreq (Robyn Speer)
and its sources.

Index term: a word of the frequency list that is all lowercase ASCII letters and is not a stopword.
The stopwords are the service's own list (neardup.local_similarity.terms.STOPWORDS), so that the
reference counts exactly the terms the fingerprint counts. Probabilities are token probabilities
(word frequency mass), renormalized over index terms.

Classes:
  * k26: one class per first letter a..z (the classic design).
  * kN (N < 26): "balanced" classes. Letters whose mass exceeds the per-class target 1/N are split
    into their heavy two-letter prefixes (e.g. "st", "co"), the rest of the letter staying under the
    one-letter prefix (lookup takes the longest listed prefix). The resulting units are then packed
    greedily into N classes, heaviest unit first into the currently lightest class (LPT), so each class
    carries roughly 1/N of the mass.

Usage:  python tests/data/build_prefix_reference.py [--out service/data/prefix_reference.json]
"""

from __future__ import annotations

import argparse
import json
import math
import re
import string
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from neardup.local_similarity.terms import STOPWORDS  # noqa: E402

WORDFREQ_VERSION = "3.1.1"
WORDLIST = "large"
LANG = "en"
KS = (8, 12, 16, 20, 26)
# A two-letter prefix becomes its own unit when splitting a heavy letter only if it carries at least
# this share of the per-class target; lighter ones stay with the one-letter prefix.
MIN_SPLIT_SHARE = 0.2
LETTERS = string.ascii_lowercase
TERM_RE = re.compile(r"[a-z]+")


def term_frequencies() -> dict[str, float]:
    """Index-term -> probability (sums to 1) from wordfreq's English list."""
    import wordfreq

    version = getattr(wordfreq, "__version__", None)
    if version is None:
        from importlib.metadata import version as dist_version

        version = dist_version("wordfreq")
    if version != WORDFREQ_VERSION:
        print(
            f"warning: wordfreq {version} installed, reference built for {WORDFREQ_VERSION}", file=sys.stderr
        )
    freqs = wordfreq.get_frequency_dict(LANG, wordlist=WORDLIST)
    terms = {w: f for w, f in freqs.items() if TERM_RE.fullmatch(w) and w not in STOPWORDS}
    total = math.fsum(terms.values())
    return {w: f / total for w, f in sorted(terms.items())}


def prefix_mass(terms: dict[str, float], n: int) -> dict[str, float]:
    mass: dict[str, float] = {}
    for w, p in terms.items():
        key = w[:n]
        mass[key] = mass.get(key, 0.0) + p
    return mass


def units_for(k: int, terms: dict[str, float]) -> dict[str, float]:
    """Prefix units (one- or two-letter) with their mass, heavy letters split so no unit is >> 1/k."""
    one = prefix_mass(terms, 1)
    two = prefix_mass(terms, 2)
    target = 1.0 / k
    units: dict[str, float] = {}
    for letter in LETTERS:
        m = one.get(letter, 0.0)
        if m <= target:
            units[letter] = m
            continue
        rest = m
        for pre in sorted(p for p in two if p[0] == letter and len(p) == 2):
            if two[pre] >= MIN_SPLIT_SHARE * target:
                units[pre] = two[pre]
                rest -= two[pre]
        units[letter] = max(rest, 0.0)
    return units


def balanced_classes(k: int, terms: dict[str, float]) -> list[dict[str, object]]:
    units = units_for(k, terms)
    if len(units) < k:
        raise ValueError(f"only {len(units)} prefix units for k={k}")
    bins: list[list[str]] = [[] for _ in range(k)]
    load = [0.0] * k
    # heaviest first; ties by prefix for determinism
    for pre, m in sorted(units.items(), key=lambda kv: (-kv[1], kv[0])):
        i = min(range(k), key=lambda j: (load[j], j))
        bins[i].append(pre)
        load[i] += m
    classes = [{"prefixes": sorted(b), "p": round(load[i], 6)} for i, b in enumerate(bins)]
    classes.sort(key=lambda c: c["prefixes"][0])  # type: ignore[index]
    return classes


def letter_classes(terms: dict[str, float]) -> list[dict[str, object]]:
    one = prefix_mass(terms, 1)
    return [{"prefixes": [c], "p": round(one.get(c, 0.0), 6)} for c in LETTERS]


def describe(name: str, classes: list[dict[str, object]]) -> str:
    ps = [float(c["p"]) for c in classes]  # type: ignore[arg-type]
    ent = -sum(p * math.log2(p) for p in ps if p > 0)
    return (
        f"{name:>4}: {len(ps):2d} classes  min p={min(ps):.4f}  max p={max(ps):.4f}  "
        f"max/min={max(ps) / min(ps):6.2f}  entropy={ent:.3f} bits (max {math.log2(len(ps)):.3f})"
    )


def build() -> dict[str, object]:
    terms = term_frequencies()
    out: dict[str, object] = {
        "source": (
            f"wordfreq {WORDFREQ_VERSION} English '{WORDLIST}' word frequencies (Wikipedia, subtitles, "
            "news, books, web text, Twitter, Reddit), by Robyn Speer et al.; index terms = lowercase "
            f"a-z words minus the service stopword list ({len(STOPWORDS)} words); token-probability mass"
        ),
        "licence": "CC BY-SA 4.0 (derived from wordfreq data files; attribution: wordfreq and its sources)",
        "built_by": "tests/data/build_prefix_reference.py",
        "index_terms": len(terms),
    }
    for k in KS:
        classes = letter_classes(terms) if k == 26 else balanced_classes(k, terms)
        out[f"k{k}"] = {
            "k": k,
            "method": "first letter" if k == 26 else "balanced greedy (LPT) over 1-2 letter prefixes",
            "classes": classes,
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=REPO / "service" / "data" / "prefix_reference.json")
    args = ap.parse_args()
    ref = build()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(ref, indent=1, ensure_ascii=False, sort_keys=False) + "\n"
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out} ({len(text.encode())} bytes, {ref['index_terms']} index terms)")
    for k in KS:
        entry = ref[f"k{k}"]
        print(describe(f"k{k}", entry["classes"]))  # type: ignore[index]
        if k <= 12:
            for c in entry["classes"]:  # type: ignore[index]
                print(f"        {c['p']:.4f}  {' '.join(c['prefixes'])}")


if __name__ == "__main__":
    main()
