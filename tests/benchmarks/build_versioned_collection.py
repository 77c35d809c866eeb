"""Build a collection of versioned documents: the Django documentation across eight releases.

Source: the source distributions of Django on PyPI, at the pinned versions in VERSIONS (sha256 of each
sdist pinned in SDIST_SHA256), downloaded with `pip download django==X --no-deps --no-binary :all:`.
Each sdist carries the full documentation as reStructuredText (docs/**/*.txt). Every documentation
page present in several releases forms a family of revised versions of one document, from almost
identical (patch-level wording fixes) to substantially rewritten (years apart), which is what the
benchmark comparing 50 documents against subsets of 100-800 documents needs.

Licence: BSD-3-Clause. Django and its documentation are distributed under the BSD 3-clause licence in
the LICENSE file of each sdist, copyright Django Software Foundation and individual contributors.

Selection: docs/**/*.txt except release notes (docs/releases/, which are added but not revised across
releases) and the Sphinx theme, with MIN_BYTES <= size <= MAX_BYTES. The text is the reST source with
line endings normalized; no other change.

Output (default ~/.cache/neardup/versioned, not committed):
  docs/<version>/<page path>.txt     one file per document
  index.jsonl                        {"id", "family", "version", "path", "licence"} per document,
                                     path relative to the output directory
  sdists/                            the downloaded sdists (cache)

Usage: python tests/benchmarks/build_versioned_collection.py [--out DIR] [--versions 3.2.25,4.2.30]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tarfile
from collections import Counter, defaultdict
from pathlib import Path

PACKAGE = "django"
VERSIONS = ("2.2.28", "3.0.14", "3.1.14", "3.2.25", "4.0.10", "4.1.13", "4.2.30", "5.0.14")
SDIST_SHA256: dict[str, str] = {
    "2.2.28": "0200b657afbf1bc08003845ddda053c7641b9b24951e52acd51f6abda33a7413",
    "3.0.14": "d58d8394036db75a81896037d757357e79406e8f68816c3e8a28721c1d9d4c11",
    "3.1.14": "72a4a5a136a214c39cf016ccdd6b69e2aa08c7479c66d93f3a9b5e4bb9d8a347",
    "3.2.25": "7ca38a78654aee72378594d63e51636c04b8e28574f5505dff630895b5472777",
    "4.0.10": "2c2f73c16b11cb272c6d5e3b063f0d1be06f378d8dc6005fbe8542565db659cc",
    "4.1.13": "94a3f471e833c8f124ee7a2de11e92f633991d975e3fa5bdd91e8abd66426318",
    "4.2.30": "4ebc7a434e3819db6cf4b399fb5b3f536310a30e8486f08b66886840be84b37c",
    "5.0.14": "29019a5763dbd48da1720d687c3522ef40d1c61be6fb2fad27ed79e9f655bc11",
}
LICENCE = "BSD-3-Clause (Django Software Foundation and individual contributors)"
DEFAULT_OUT = Path.home() / ".cache" / "neardup" / "versioned"
MIN_BYTES = 1000
MAX_BYTES = 60_000


def sdist_path(sdists: Path, version: str) -> Path | None:
    for name in (f"Django-{version}.tar.gz", f"django-{version}.tar.gz"):
        if (sdists / name).exists():
            return sdists / name
    return None


def fetch_sdist(sdists: Path, version: str) -> Path:
    sdists.mkdir(parents=True, exist_ok=True)
    path = sdist_path(sdists, version)
    if path is None:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            f"{PACKAGE}=={version}",
            "--no-deps",
            "--no-binary",
            ":all:",
            "--dest",
            str(sdists),
            "--quiet",
        ]
        subprocess.run(cmd, check=True)
        path = sdist_path(sdists, version)
        if path is None:
            raise SystemExit(f"pip did not leave a Django {version} sdist in {sdists}")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    pinned = SDIST_SHA256.get(version)
    if pinned is not None and digest != pinned:
        raise SystemExit(f"{path}: sha256 {digest} != pinned {pinned}")
    if pinned is None:
        print(f"note: {path.name} sha256 {digest} (not pinned)", file=sys.stderr)
    return path


def doc_members(sdist: Path) -> list[tuple[str, bytes]]:
    """(page path under docs/, bytes) of the selected documentation pages, sorted by path."""
    out = []
    with tarfile.open(sdist, "r:gz") as tf:
        for m in tf.getmembers():
            if not m.isfile() or not m.name.endswith(".txt"):
                continue
            parts = m.name.split("/")
            if len(parts) < 3 or parts[1] != "docs":
                continue
            rel = "/".join(parts[2:])
            if rel.startswith(("releases/", "_theme/", "_ext/")):
                continue
            if not MIN_BYTES <= m.size <= MAX_BYTES:
                continue
            f = tf.extractfile(m)
            if f is not None:
                out.append((rel, f.read()))
    return sorted(out)


def build(out: Path, versions: tuple[str, ...]) -> list[dict[str, str]]:
    index: list[dict[str, str]] = []
    for version in versions:
        sdist = fetch_sdist(out / "sdists", version)
        for rel, data in doc_members(sdist):
            text = data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")
            family = rel[: -len(".txt")]
            path = Path("docs") / version / rel
            (out / path).parent.mkdir(parents=True, exist_ok=True)
            (out / path).write_text(text, encoding="utf-8", newline="\n")
            index.append(
                {
                    "id": f"django-{version}:{family}",
                    "family": family,
                    "version": version,
                    "path": path.as_posix(),
                    "licence": LICENCE,
                }
            )
    with (out / "index.jsonl").open("w", encoding="utf-8") as fh:
        for row in index:
            fh.write(json.dumps(row) + "\n")
    return index


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--versions", default=",".join(VERSIONS), help="comma-separated Django versions")
    args = ap.parse_args()
    versions = tuple(v.strip() for v in args.versions.split(",") if v.strip())
    index = build(args.out, versions)
    fam = defaultdict(list)
    for row in index:
        fam[row["family"]].append(row)
    sizes = sorted((args.out / r["path"]).stat().st_size for r in index)
    digests = Counter(hashlib.sha256((args.out / r["path"]).read_bytes()).hexdigest() for r in index)
    per_version = Counter(r["version"] for r in index)
    multi = [f for f, rows in fam.items() if len(rows) >= 2]
    print(
        f"wrote {args.out}/index.jsonl: {len(index)} documents, {len(fam)} families, {len(versions)} versions"
    )
    print("documents per version: " + ", ".join(f"{v}={per_version[v]}" for v in versions))
    print(
        f"families with >=2 versions: {len(multi)} ({sum(len(fam[f]) for f in multi)} documents); "
        f"with all {len(versions)}: {sum(len(r) == len(versions) for r in fam.values())}"
    )
    dup_docs = sum(n for n in digests.values() if n > 1)
    dup_groups = sum(n > 1 for n in digests.values())
    print(
        f"distinct texts: {len(digests)} "
        f"(byte-identical across versions: {dup_docs} documents in {dup_groups} groups)"
    )
    median = sizes[len(sizes) // 2]
    print(f"bytes: min {sizes[0]} median {median} max {sizes[-1]}; total {sum(sizes) / 1e6:.1f} MB")
    print(f"licence: {LICENCE}")


if __name__ == "__main__":
    main()
