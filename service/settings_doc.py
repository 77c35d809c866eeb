"""`python -m neardup.settings_doc [FILE]`: the settings table of deploy/docs/configuration.md, made
from the table in neardup.config; printed, or written over the one between FILE's markers."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from .config import markdown

BEGIN = "<!-- settings: made by `python -m neardup.settings_doc FILE` from service/config.py -->\n"
END = "<!-- end of settings -->\n"


def replaced(document: str, table: str) -> str:
    """`document` with `table` between its markers."""
    head, begin, rest = document.partition(BEGIN)
    _, end, tail = rest.partition(END)
    if not begin or not end:
        raise ValueError("the document has no settings markers")
    return f"{head}{BEGIN}{table}{END}{tail}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m neardup.settings_doc", description=__doc__)
    parser.add_argument("file", nargs="?", help="a Markdown file whose settings table to rewrite")
    args = parser.parse_args(argv)
    if args.file is None:
        sys.stdout.write(markdown())
        return 0
    path = Path(args.file)
    try:
        path.write_text(replaced(path.read_text(encoding="utf-8"), markdown()), encoding="utf-8")
    except ValueError as exc:
        parser.error(f"{path}: {exc}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
