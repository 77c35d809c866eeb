"""Normalization and decoding: canonical forms, and bytes of any kind decoded without raising."""

from __future__ import annotations

import random

import pytest

from neardup.core.normalize import DEFAULT_NORMALIZE, NormalizeOptions, decode_bytes, normalize

# Seed 004's 1.txt: a news paragraph whose dashes and accents were stored as GBK bytes, which a
# reader assuming ISO-8859-14 shows as "ḂẂ" (A1 AA) and "ẀḊ" (A8 A6). Encoding the text as the reader
# saw it reproduces the exact bytes of the file.
SEED_004_1_TXT = (
    "NFC East rival quarterbacks Tony Romo(notes) of the Dallas Cowboys and Eli Manning(notes) of the "
    "New York Giants now have something else in common ḂẂ they've used the same wedding planner to help "
    "them tie the knot.\n\n"
    "\"But more than anything, (I got the) right ticket from him and his fianceẀḊ ḂẂ Romo's "
    "wife-to-be. (It's) one of prettiest invitations I've ever seen.\n"
)
SEED_004_1_BYTES = SEED_004_1_TXT.encode("iso-8859-14")


@pytest.mark.parametrize(
    ("raw", "canonical"),
    [
        ("The  Cat\tSAT\n\non the mat ", "the cat sat on the mat"),
        ("ﬁnancial ﬂows", "financial flows"),  # ligatures folded by NFKC
        ("ＡＢＣ　１２３", "abc 123"),  # full-width letters, digits and space
        ("Straße", "strasse"),  # case folding, not just lowering
        ("cafe\u0301", "café"),  # combining accent composed
        ("\u00a0 non-breaking\u2003spaces \u200a", "non-breaking spaces"),
        ("", ""),
        (" \t\r\n ", ""),
    ],
)
def test_normalize_canonical_forms(raw: str, canonical: str) -> None:
    assert normalize(raw) == canonical


def test_normalize_is_idempotent(prose: tuple[str, ...]) -> None:
    for text in prose:
        once = normalize(text)
        assert normalize(once) == once
        assert "  " not in once and "\n" not in once


def test_normalize_options_can_be_switched_off() -> None:
    raw = " Ｆine  Day "
    assert normalize(raw, NormalizeOptions(nfkc=False, casefold=False, collapse_whitespace=False)) == raw
    assert normalize(raw, NormalizeOptions(nfkc=False)) == "ｆine day"  # full-width kept, then folded
    assert normalize(raw, NormalizeOptions(casefold=False)) == "Fine Day"
    assert normalize(raw, NormalizeOptions(collapse_whitespace=False)) == " fine  day "


def test_options_tag_names_each_option() -> None:
    assert DEFAULT_NORMALIZE.tag() == "ncw"
    assert NormalizeOptions(casefold=False).tag() == "nw"
    assert NormalizeOptions(False, False, False).tag() == "-"


def test_decode_utf8_and_bom() -> None:
    text = "Grüße — 中文 😀"
    decoded = decode_bytes(text.encode("utf-8"))
    assert (decoded.text, decoded.encoding, decoded.guessed) == (text, "utf-8", False)
    with_bom = decode_bytes(b"\xef\xbb\xbf" + text.encode("utf-8"))
    assert with_bom.text == text and not with_bom.guessed
    assert decode_bytes(b"").text == ""


def test_decode_seed_004_legacy_bytes() -> None:
    with pytest.raises(UnicodeDecodeError):
        SEED_004_1_BYTES.decode("utf-8")
    decoded = decode_bytes(SEED_004_1_BYTES)
    assert decoded.guessed
    assert decoded.encoding != "utf-8"
    assert "Tony Romo" in decoded.text and "wedding planner" in decoded.text
    assert "\ufffd" not in decoded.text  # a real encoding was found, not the replacement fallback


def test_decode_latin1_paragraph(prose: tuple[str, ...]) -> None:
    text = prose[1].replace("Memorial", "Mémorial")
    decoded = decode_bytes(text.encode("latin-1"))
    assert decoded.guessed
    assert "Arlington National Cemetery" in decoded.text


def test_decode_bytes_never_raises_on_garbage() -> None:
    rng = random.Random(4)
    samples = [bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 400))) for _ in range(150)]
    samples += [b"\xff", b"\xc3", b"\x00" * 50, b"\xed\xa0\x80", bytes(range(256)), b"ok\x80\x81ok"]
    for data in samples:
        decoded = decode_bytes(data)
        assert isinstance(decoded.text, str)
        normalize(decoded.text)  # and the result can be normalized


def test_a_text_that_normalisation_expands_past_its_limit_is_refused_cheaply(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import unicodedata

    from neardup.core import normalize as module
    from neardup.core.normalize import TooLong, canonical_code_points, check_expansion

    normalised: list[int] = []  # characters given to NFKC, call by call
    real = unicodedata.normalize

    def counting(form: str, text: str) -> str:
        normalised.append(len(text))
        return real(form, text)

    monkeypatch.setattr(module.unicodedata, "normalize", counting)
    heavy = "\ufdfa" * 50_000  # 18 characters each after NFKC
    with pytest.raises(TooLong, match="more than 100000"):
        canonical_code_points(heavy, max_points=100_000)
    # refused after one chunk: never the whole text, and never NFKC's full output
    assert normalised == [module._EXPANSION_CHUNK] and sum(normalised) < len(heavy)
    monkeypatch.setattr(module.unicodedata, "normalize", real)
    check_expansion("\ufdfa" * 5_000, 100_000)  # 90,000: within the limit
    assert canonical_code_points("\ufdfa" * 5_000, max_points=100_000).size == 90_000
    plain = "word " * 30_000
    assert canonical_code_points(plain, max_points=150_000).size == len(plain) - 1
    with pytest.raises(TooLong, match="150001 characters after normalisation, limit 149999"):
        canonical_code_points(plain + "x", max_points=149_999)
