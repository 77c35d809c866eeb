"""Text → canonical text, and bytes of unknown encoding → text, without ever raising."""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass

from charset_normalizer import from_bytes


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
        # str.split() and regex \s agree on all 29 Unicode whitespace characters; split is 3x faster
        text = " ".join(text.split())
    return text


@dataclass(frozen=True)
class DecodedText:
    """Decoded text and how it was obtained, so callers can report guessed encodings."""

    text: str
    encoding: str
    guessed: bool


def decode_bytes(data: bytes) -> DecodedText:
    """UTF-8 first (the norm); otherwise detect the encoding; as a last resort, UTF-8 with
    replacement characters. Never raises: seed 004's tool crashed on a single non-UTF-8 byte."""
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
