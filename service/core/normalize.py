"""Text → canonical text, and bytes of unknown encoding → text, without ever raising."""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from charset_normalizer import from_bytes

from . import compiled


@dataclass(frozen=True)
class NormalizeOptions:
    """Which canonicalisations to apply; all on by default so trivial re-typing is not a difference."""

    nfkc: bool = True
    casefold: bool = True
    collapse_whitespace: bool = True

    def tag(self) -> str:
        """Compact form recorded in the state header: state built with other options is incompatible."""
        return (
            "".join(
                flag
                for flag, on in (("n", self.nfkc), ("c", self.casefold), ("w", self.collapse_whitespace))
                if on
            )
            or "-"
        )


DEFAULT_NORMALIZE = NormalizeOptions()


def normalize(text: str, options: NormalizeOptions = DEFAULT_NORMALIZE) -> str:
    """Canonical form: NFKC (folds ligatures, full-width forms), case fold, single spaces, stripped."""
    if options.nfkc:
        text = unicodedata.normalize("NFKC", text)
    if options.casefold:
        text = text.casefold()
    if options.collapse_whitespace:
        # str.split() and regex \s agree on every Unicode whitespace character; split is cheaper
        text = " ".join(text.split())
    return text


# str.isspace for every code point (1.1 MB, built once): one lookup per character, no clipping
_IS_SPACE = np.zeros(0x110000, dtype=bool)
_IS_SPACE[[c for c in range(0x3001) if chr(c).isspace()]] = True  # none lies above U+3000
CodePoints = npt.NDArray[np.uint32]


def canonical_code_points(text: str, options: NormalizeOptions = DEFAULT_NORMALIZE) -> CodePoints:
    """`normalize(text)` as UTF-32 code points, with the whitespace collapsed in numpy.

    Same result as np.frombuffer(normalize(text).encode("utf-32-le"), "<u4"), without normalize()'s
    costliest step on news-sized texts: splitting the text into words and joining them again."""
    if options.nfkc:
        text = unicodedata.normalize("NFKC", text)
    if options.casefold:
        text = text.casefold()
    points = np.frombuffer(text.encode("utf-32-le", errors="surrogatepass"), dtype="<u4")
    if not options.collapse_whitespace or points.size == 0:
        return points.astype(np.uint32)
    loops = compiled.loops()
    if loops is not None:  # the same in one pass: the numpy below is most of this function's cost
        collapsed = np.empty(points.size, dtype=np.uint32)
        return collapsed[: loops.collapse_spaces(points, _IS_SPACE, collapsed)]
    space = _IS_SPACE[points]
    after_space = np.empty_like(space)
    after_space[0] = True  # drops leading whitespace
    after_space[1:] = space[:-1]
    collapsed = np.where(space, np.uint32(32), points)[~(space & after_space)]
    if collapsed.size and collapsed[-1] == 32:
        collapsed = collapsed[:-1]
    return collapsed.astype(np.uint32, copy=False)


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
    best = from_bytes(data).best()
    if best is not None and best.encoding:
        try:
            return DecodedText(data.decode(best.encoding), best.encoding, guessed=True)
        except (UnicodeDecodeError, LookupError):
            pass
    return DecodedText(data.decode("utf-8", errors="replace"), "utf-8-replace", guessed=True)
