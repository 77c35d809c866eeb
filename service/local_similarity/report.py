"""Terminal report for `neardup compare --local`: the three local/global measures and the shared
passages of both texts side by side, coloured on a terminal and marked with [[...]] when piped.
"""

from __future__ import annotations

import functools
import itertools
import re
import shutil
import textwrap
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import NamedTuple

import orjson

from ..core.anchors import anchors_of
from ..core.anchors import containment as anchor_containment
from ..core.anchors import passages as anchor_passages
from ..core.dedup import PASSAGES
from ..core.normalize import canonical_code_points, normalize
from .compare import LocalComparison, compare_local
from .fuzzy import DEFAULT_FUZZY, PrefixReference, parse_prefix_reference

REFERENCE_PATH = Path(__file__).resolve().parents[1] / "data" / "prefix_reference.json"

_RESET = "\x1b[0m"
# Black on a bright background, one colour per passage so a passage in A is found again in B.
_STYLES = ("\x1b[30;103m", "\x1b[30;106m", "\x1b[30;102m", "\x1b[30;105m", "\x1b[30;47m")
_BOLD = "\x1b[1m"
# C0/C1 controls (other than newline and tab) from untrusted text must not reach the terminal.
_CONTROL_RE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_PARAGRAPH_RE = re.compile(r"\n[ \t\r\f\v]*\n")
_TOKEN_RE = re.compile(r"\S+")
MIN_WIDTH = 40


def load_prefix_reference(path: Path | str | None = None, k: int | None = None) -> PrefixReference:
    """Read the reference prefix distribution (default: the one shipped in service/data)."""
    source = Path(path) if path is not None else REFERENCE_PATH
    return parse_prefix_reference(orjson.loads(source.read_bytes()), k)


@functools.cache
def default_prefix_reference() -> PrefixReference | None:
    """The shipped reference, or None when it is missing or unreadable (fuzzy measure omitted)."""
    try:
        return load_prefix_reference()
    except (OSError, ValueError):
        return None


class _Span(NamedTuple):
    start: int
    end: int
    style: int  # index of the passage colour


def _side_spans(passages: Iterable[tuple[int, int]]) -> list[_Span]:
    """Non-overlapping highlight spans for one side's (start, end) of each passage, in passage order
    (which picks the colour); a repeated phrase keeps its first colour."""
    spans: list[_Span] = []
    for (start, end), idx in sorted((passage, idx) for idx, passage in enumerate(passages)):
        if spans and start < spans[-1].end:
            start = spans[-1].end
        if start < end:
            spans.append(_Span(start, end, idx % len(_STYLES)))
    return spans


Line = list[tuple[str, int | None]]  # runs of visible text, each with its style (None = plain)


def _pieces(text: str, spans: Sequence[_Span], lo: int, hi: int) -> Line:
    """text[lo:hi] cut at span boundaries into (piece, style) runs."""
    out: Line = []
    pos = lo
    for span in spans:
        if span.end <= pos or span.start >= hi:
            continue
        if span.start > pos:
            out.append((text[pos : span.start], None))
        end = min(span.end, hi)
        out.append((text[max(span.start, pos) : end], span.style))
        pos = end
    if pos < hi:
        out.append((text[pos:hi], None))
    return out


def _marked_text(text: str, spans: Sequence[_Span]) -> str:
    """Plain-text highlighting: each span enclosed in [[...]]."""
    return "".join(
        piece if style is None else f"[[{piece}]]" for piece, style in _pieces(text, spans, 0, len(text))
    )


def _side_lines(text: str, spans: Sequence[_Span], col: int, color: bool) -> list[Line]:
    """One text in its column: its passages styled for a terminal, else marked in the text."""
    shown = _sanitize(text)
    return _wrap(shown, spans, col) if color else _wrap(_marked_text(shown, spans), [], col)


def _wrap(text: str, spans: Sequence[_Span], width: int) -> list[Line]:
    """Greedy word wrap to `width` visible characters, keeping each run's style.

    Paragraphs (blank-line separated) stay apart; single newlines are re-flowed, as the hard-wrapped
    sources are. Spaces between two words of one passage are styled too, so a passage reads as one
    band.
    """
    lines: list[Line] = []
    line: Line = []  # never empty once a word was read: a word always leaves its last piece here
    used = prev_end = 0  # prev_end: where the previous word ends, read once there is one
    for token in _TOKEN_RE.finditer(text):
        start, end = token.span()
        if line and _PARAGRAPH_RE.search(text, prev_end, start):
            lines += [line, []]
            line, used = [], 0
        elif used and used + 1 + (end - start) > width:
            lines.append(line)
            line, used = [], 0
        while end - start > width:  # a word longer than the column is cut, on lines of its own
            lines.append(_pieces(text, spans, start, start + width))
            start += width
        if used:
            line.append((" ", _gap_style(spans, prev_end, start)))
            used += 1
        line.extend(_pieces(text, spans, start, end))
        used += end - start
        prev_end = end
    if line:
        lines.append(line)
    return lines


def _gap_style(spans: Sequence[_Span], left: int, right: int) -> int | None:
    """The style of the whitespace between two words: that of a span covering both sides."""
    return next((span.style for span in spans if span.start < left and span.end > right), None)


def _paint(line: Line) -> str:
    """A line with each run of one passage coloured (plain lines have no styled run)."""
    out = []
    for style, group in itertools.groupby(line, key=lambda seg: seg[1]):
        text = "".join(piece for piece, _ in group)
        out.append(text if style is None else f"{_STYLES[style]}{text}{_RESET}")
    return "".join(out)


def _columns(left: list[Line], right: list[Line], col: int, bar: str) -> list[str]:
    """The two sides line by line, the left one padded to `col` visible characters."""
    empty: Line = []
    return [
        f"{_paint(la)}{' ' * (col - sum(len(piece) for piece, _ in la))} {bar} {_paint(lb)}".rstrip()
        for la, lb in itertools.zip_longest(left, right, fillvalue=empty)
    ]


def _coverage(text: str, spans: Sequence[_Span]) -> float:
    """Share of the text's characters inside highlighted passages."""
    return sum(s.end - s.start for s in spans) / len(text) if text else 0.0


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def _bold(text: str, color: bool) -> str:
    return f"{_BOLD}{text}{_RESET}" if color else text


def _summary(cmp: LocalComparison, color: bool) -> list[str]:
    fuzzy_label = (
        f"fuzzy-fingerprint (~{DEFAULT_FUZZY.chunk_words} words, k={cmp.fuzzy_k}, r={DEFAULT_FUZZY.r})"
        if cmp.fuzzy_k is not None
        else "fuzzy-fingerprint (no prefix reference)"
    )
    rows = [
        (f"local, chunk identity (n={cmp.n} words)", _fmt(cmp.local)),
        ("containment A in B / B in A", f"{_fmt(cmp.containment_ab)} / {_fmt(cmp.containment_ba)}"),
        (fuzzy_label, _fmt(cmp.fuzzy)),
        ("global, cosine (tf, stems, no stopwords)", _fmt(cmp.cosine)),
    ]
    label_w = max(len(label) for label, _ in rows)
    header = _bold(f"A: {cmp.words_a} words    B: {cmp.words_b} words", color)
    return [header, *(f"{label:<{label_w}}  {_bold(value, color)}" for label, value in rows)]


def _sanitize(text: str) -> str:
    """Same length as the input (offsets stay valid); tabs to spaces, controls to U+FFFD."""
    return _CONTROL_RE.sub("\ufffd", text.replace("\t", " ").replace("\r", " "))


def _anchor_passages(text_a: str, text_b: str, width: int) -> list[str]:
    """The passages a partial or revised verdict of B against A would name, in full: offsets in
    the canonical texts (as the verdict gives them), each passage's canonical text of B."""
    canonical_a, canonical_b = normalize(text_a), normalize(text_b)
    mine, other = anchors_of(canonical_code_points(text_b)), anchors_of(canonical_code_points(text_a))
    shared, inside, contains = anchor_containment(mine, other)
    found = anchor_passages(mine, other, PASSAGES)
    wrap = functools.partial(textwrap.wrap, width=width)
    head = (
        f"anchors: {shared} shared; {inside:.0%} of B's in A, {contains:.0%} of A's in B "
        f"(a verdict on B names {len(found)} passage{'s' * (len(found) != 1)}, canonical offsets):"
    )
    out = ["", *wrap(head)]
    for p in found:
        out += wrap(f"B[{p.start}:{p.end}] ~ A[{p.other_start}:{p.other_end}], {p.anchors} anchors:")
        sides = [("B", canonical_b[p.start : p.end])]
        if canonical_a[p.other_start : p.other_end] != sides[0][1]:
            sides.append(("A", canonical_a[p.other_start : p.other_end]))
        for name, text in sides:
            out += wrap(_sanitize(text), initial_indent=f"  {name}: ", subsequent_indent="     ")
    return out


def render_compare_local(
    text_a: str,
    text_b: str,
    *,
    chunk_words: int = 5,
    color: bool,
    width: int | None = None,
    reference: PrefixReference | None = None,
) -> str:
    """Measures and shared passages of A and B as text for a terminal (`color`) or a pipe.

    `chunk_words` is the chunk size n of the chunk-identity measure and of the passages; the
    fuzzy-fingerprint uses the shipped prefix reference unless `reference` is given, and is shown
    as n/a when there is none.
    """
    cmp = compare_local(text_a, text_b, chunk_words, reference or default_prefix_reference())
    total = max(MIN_WIDTH, width if width is not None else shutil.get_terminal_size((100, 24)).columns)
    col = (total - 3) // 2
    spans_a = _side_spans((p.a_start, p.a_end) for p in cmp.passages)
    spans_b = _side_spans((p.b_start, p.b_end) for p in cmp.passages)
    out = _summary(cmp, color)
    cov_a, cov_b = _coverage(text_a, spans_a), _coverage(text_b, spans_b)
    out.append(f"shared passages of >= {chunk_words} words: {len(cmp.passages)}")
    out.append(f"  covering {cov_a:.0%} of A, {cov_b:.0%} of B (characters)")
    out += _anchor_passages(text_a, text_b, total)
    out.append("")
    left, right = _side_lines(text_a, spans_a, col, color), _side_lines(text_b, spans_b, col, color)
    bar, cross, rule = ("│", "┼", "─") if color else ("|", "+", "-")
    out.append(f"{_bold('A', color)}{' ' * (col - 1)} {bar} {_bold('B', color)}")
    out.append(f"{rule * (col + 1)}{cross}{rule * (col + 1)}")
    out += _columns(left, right, col, bar)
    return "\n".join(out)
