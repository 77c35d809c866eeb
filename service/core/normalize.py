"""Text → canonical text, and bytes of unknown encoding → text, without ever raising."""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ..errors import Error
from .compiled import _sketch


@dataclass(frozen=True)
class NormalizeOptions:
    """Which canonicalisations to apply; all on by default so trivial re-typing is not a difference."""

    nfkc: bool = True
    casefold: bool = True
    collapse_whitespace: bool = True

    def tag(self) -> str:
        """Compact form recorded in the state header: state built with other options is incompatible."""
        flags = (("n", self.nfkc), ("c", self.casefold), ("w", self.collapse_whitespace))
        return "".join(flag for flag, on in flags if on) or "-"


DEFAULT_NORMALIZE = NormalizeOptions()


def normalize(text: str, options: NormalizeOptions = DEFAULT_NORMALIZE, max_points: int | None = None) -> str:
    """Canonical form: NFKC (folds ligatures, full-width forms), case fold, single spaces, stripped.
    TooLong beyond `max_points` characters after NFKC (None: no limit)."""
    text = _folded(text, options, max_points)
    if options.collapse_whitespace:
        # str.split() and regex \s agree on every Unicode whitespace character; split is cheaper
        text = " ".join(text.split())
    return text


# str.isspace for every code point (1.1 MB, built once): one lookup per character, no clipping
_IS_SPACE = np.zeros(0x110000, dtype=bool)
_IS_SPACE[[c for c in range(0x3001) if chr(c).isspace()]] = True  # none lies above U+3000
CodePoints = npt.NDArray[np.uint32]


class TooLong(Error, ValueError):
    """Normalisation would expand the text beyond the characters allowed: refused before the
    costly steps, so that no text costs more than its size allows."""


# Characters NFKC-normalised at a time while measuring how far a text expands
_EXPANSION_CHUNK = 1 << 14


def check_expansion(text: str, max_points: int) -> None:
    """Raise TooLong when NFKC takes `text` beyond `max_points` characters, at the cost of
    normalising at most that many: NFKC can turn one code point into 18 (U+FDFA), so a text within
    its byte limit can still be costly. Measured in chunks, each normalised on its own; a chunk
    boundary can only split a composition that would shorten the text, so a chunked total above
    the limit by more than the chunks' count is above it whole."""
    if len(text) <= max_points // 18 or unicodedata.is_normalized("NFKC", text):
        return
    expanded = 0
    for chunks, start in enumerate(range(0, len(text), _EXPANSION_CHUNK), 1):
        expanded += len(unicodedata.normalize("NFKC", text[start : start + _EXPANSION_CHUNK]))
        if expanded > max_points + chunks:
            raise TooLong(f"text expands to more than {max_points} characters when normalised")


def _folded(text: str, options: NormalizeOptions, max_points: int | None) -> str:
    """NFKC and case fold where the options ask for them, refusing a text that NFKC takes beyond
    `max_points`."""
    if options.nfkc:
        if max_points is not None:
            check_expansion(text, max_points)
        text = unicodedata.normalize("NFKC", text)
    if max_points is not None and len(text) > max_points:
        raise TooLong(f"text is {len(text)} characters after normalisation, limit {max_points}")
    return text.casefold() if options.casefold else text


def canonical_code_points(
    text: str, options: NormalizeOptions = DEFAULT_NORMALIZE, max_points: int | None = None
) -> CodePoints:
    """`normalize(text)` as UTF-32 code points, the whitespace collapsed in one compiled pass
    (_sketch.collapse_spaces); TooLong beyond `max_points` characters after NFKC (None: no limit).

    Same result as np.frombuffer(normalize(text).encode("utf-32-le"), "<u4"), without normalize()'s
    costliest step on news-sized texts: splitting the text into words and joining them again."""
    text = _folded(text, options, max_points)
    points = code_points(text)
    if not options.collapse_whitespace or points.size == 0:
        return points.astype(np.uint32)
    collapsed = np.empty(points.size, dtype=np.uint32)
    return collapsed[: _sketch.collapse_spaces(points, _IS_SPACE, collapsed)]


# Unicode's Default_Ignorable_Code_Point (DerivedCoreProperties.txt, Unicode 14 to 15.1), as inclusive
# ranges: characters that render as nothing where they are not supported. unicodedata does not
# carry the property; most of these are Cf, Mn or Cn anyway, the Hangul fillers (Lo) are not.
DEFAULT_IGNORABLE: tuple[tuple[int, int], ...] = (
    (0x00AD, 0x00AD),  # soft hyphen
    (0x034F, 0x034F),  # combining grapheme joiner
    (0x061C, 0x061C),  # Arabic letter mark
    (0x115F, 0x1160),  # Hangul choseong and jungseong fillers
    (0x17B4, 0x17B5),  # Khmer inherent vowels
    (0x180B, 0x180F),  # Mongolian variation selectors and vowel separator
    (0x200B, 0x200F),  # zero-width space, joiners, directional marks
    (0x202A, 0x202E),  # directional embeddings and overrides
    (0x2060, 0x206F),  # word joiner, invisible operators, directional isolates, reserved
    (0x3164, 0x3164),  # Hangul filler
    (0xFE00, 0xFE0F),  # variation selectors
    (0xFEFF, 0xFEFF),  # zero-width no-break space (byte order mark)
    (0xFFA0, 0xFFA0),  # half-width Hangul filler
    (0xFFF0, 0xFFF8),  # reserved
    (0x1BCA0, 0x1BCA3),  # shorthand format controls
    (0x1D173, 0x1D17A),  # musical symbol format controls
    (0xE0000, 0xE0FFF),  # tags, variation selectors supplement, reserved
)
# control, format, surrogate, private use, unassigned, separators, combining marks
INVISIBLE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zs", "Zl", "Zp", "Mn", "Mc", "Me"})
# A text's first characters almost always show one that is visible; only past them is the rest
# of the text searched, by its distinct code points.
_VISIBLE_HEAD = 64


def is_default_ignorable(point: int) -> bool:
    """Whether the code point has Unicode's Default_Ignorable_Code_Point property."""
    return any(low <= point <= high for low, high in DEFAULT_IGNORABLE)


def is_visible(point: int) -> bool:
    """A code point outside the invisible categories and not default-ignorable: one that shows."""
    if 0x20 < point < 0x7F:
        return True
    return unicodedata.category(chr(point)) not in INVISIBLE_CATEGORIES and not is_default_ignorable(point)


def has_visible(points: CodePoints) -> bool:
    """Whether the canonical text (its code points) has a character that shows: a text of only
    controls, zero-width or other invisible characters has nothing to compare, and its sketch
    would match every other such text."""
    if any(map(is_visible, points[:_VISIBLE_HEAD].tolist())):
        return True
    return any(map(is_visible, np.unique(points[_VISIBLE_HEAD:]).tolist()))


def code_points(text: str) -> CodePoints:
    """The text's code points, as UTF-32 holds them: a lone surrogate (a Python str may hold one)
    is one point, not an encoding error."""
    return np.frombuffer(text.encode("utf-32-le", errors="surrogatepass"), dtype="<u4")


@dataclass(frozen=True)
class DecodedText:
    """Decoded text and how it was obtained, so callers can report guessed encodings."""

    text: str
    encoding: str
    guessed: bool


def decode_bytes(data: bytes) -> DecodedText:
    """UTF-8 first (the norm); otherwise detect the encoding; as a last resort, UTF-8 with
    replacement characters. Never raises: one non-UTF-8 byte in an archive must not stop a tool
    that reads thousands of files."""
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    try:
        return DecodedText(data.decode("utf-8"), "utf-8", guessed=False)
    except UnicodeDecodeError:
        pass
    from charset_normalizer import from_bytes  # imported here: only a text not in UTF-8 needs it

    best = from_bytes(data).best()
    if best is not None and best.encoding:
        try:
            return DecodedText(data.decode(best.encoding), best.encoding, guessed=True)
        except (UnicodeDecodeError, LookupError):
            pass
    return DecodedText(data.decode("utf-8", errors="replace"), "utf-8-replace", guessed=True)
