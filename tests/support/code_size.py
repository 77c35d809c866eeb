"""Lines of code in service/'s Python: the lines that hold code, not blank lines, comment-only lines
or docstrings (a statement that is a string alone, wherever it stands). The C sources and the type
stubs of the compiled modules (*.pyi) do not count: only *.py files.

    .venv/bin/python -m tests.support.code_size     per file, largest first, then the total
"""

from __future__ import annotations

import io
import tokenize
from pathlib import Path

SERVICE = Path(__file__).resolve().parents[2] / "service"
# Tokens that never make a line count as code on their own.
LAYOUT = {
    tokenize.COMMENT,
    tokenize.NL,
    tokenize.NEWLINE,
    tokenize.INDENT,
    tokenize.DEDENT,
    tokenize.ENCODING,
    tokenize.ENDMARKER,
}


def code_lines(source: str) -> int:
    """How many lines of `source` hold code: each logical line's tokens but layout and comments
    mark their lines, unless the logical line is strings alone (a docstring)."""
    lines: set[int] = set()
    statement: list[tokenize.TokenInfo] = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in LAYOUT:
            statement.append(token)
        elif token.type == tokenize.NEWLINE:
            if any(part.type != tokenize.STRING for part in statement):
                for part in statement:
                    lines.update(range(part.start[0], part.end[0] + 1))
            statement = []
    return len(lines)


def sizes(root: Path = SERVICE) -> dict[str, int]:
    """Lines of code per *.py file under `root`, by path relative to it."""
    return {
        str(path.relative_to(root)): code_lines(path.read_text(encoding="utf-8"))
        for path in sorted(root.rglob("*.py"))
        if "__pycache__" not in path.parts
    }


def main() -> None:
    counted = sizes()
    for name, count in sorted(counted.items(), key=lambda item: -item[1]):
        print(f"{count:6d}  {name}")
    print(f"{sum(counted.values()):6d}  total")


if __name__ == "__main__":
    main()
