"""neardup.pipeline.wire: signed records, deletions, feed records and packs on the signatures topic,
and the refusals of bytes that are none of them."""

from __future__ import annotations

import itertools
import random
import struct
from pathlib import Path
from typing import Any

import orjson
import pytest

import neardup
from neardup.core import compiled
from neardup.core.lsh import band_keys
from neardup.core.params import DedupParams
from neardup.core.signing import sketch_of
from neardup.pipeline.wire import (
    Provenance,
    Signed,
    SignedDeletion,
    decode_signed,
    decoded_signed,
    encode_deletion,
    encode_signed,
    feed_inputs,
    pack_in_chunks,
    pack_signed,
    unpack_signed,
    with_original,
)
from tests.support.prose import PROSE
from tests.support.signing import SRC, signed


@pytest.mark.parametrize(
    ("keys", "banding"),
    [((b"short",), (1, 5)), ((b"x" * 11,), (1, 5)), ((b"x" * 10,) * 2, (1, 5)), ((b"x" * 10,), (0, 0))],
)
def test_band_keys_of_another_width_or_count_are_refused(
    keys: tuple[bytes, ...], banding: tuple[int, int]
) -> None:
    item = signed("a", PROSE[0])._replace(band_keys=keys, banding=banding)
    with pytest.raises(ValueError, match="band keys"):
        encode_signed(item)


def test_decode_signed_rejects_a_truncated_keys_section() -> None:
    data = encode_signed(signed("a", PROSE[0]))
    (meta_len,) = struct.unpack_from(">I", data, 2)
    at = 6 + meta_len
    with pytest.raises(ValueError, match="band keys"):
        decode_signed(data[:at] + struct.pack(">HH", 9999, 5) + data[at + 4 :])
    with pytest.raises(ValueError, match="band keys"):
        decode_signed(data[: at + 4 + 30])


@pytest.mark.parametrize("slots", [0, -1, 10_000])
def test_decode_signed_rejects_a_signature_it_does_not_hold(slots: int) -> None:
    data = encode_signed(signed("a", PROSE[0]))
    (meta_len,) = struct.unpack_from(">I", data, 2)
    meta = orjson.loads(data[6 : 6 + meta_len])
    changed = orjson.dumps({**meta, "m": slots})
    with pytest.raises(ValueError, match="signature slots"):
        decode_signed(data[:2] + struct.pack(">I", len(changed)) + changed + data[6 + meta_len :])


def test_decode_signed_rejects_other_bytes() -> None:
    with pytest.raises(ValueError, match="not a signed record"):
        decode_signed(b'{"id": "a"}')


def test_packed_signatures_round_trip_in_order() -> None:
    records = [encode_signed(signed(f"id-{n}", PROSE[n % 5], n)) for n in range(7)]
    assert unpack_signed(pack_signed(records)) == records
    assert unpack_signed(pack_signed([])) == []
    assert unpack_signed(records[0]) == [records[0]]  # a single record, as written before packing


def test_packs_are_chunked_by_size() -> None:
    records = [bytes([n]) * (100 + n) for n in range(10)]
    packs = pack_in_chunks(records, max_bytes=450)
    assert [r for pack in packs for r in unpack_signed(pack)] == records
    assert len(packs) > 2 and all(len(pack) <= 450 + 6 for pack in packs)
    huge = [b"x" * 1000, b"y"]
    assert [unpack_signed(p) for p in pack_in_chunks(huge, max_bytes=450)] == [[b"x" * 1000], [b"y"]]
    assert pack_in_chunks([]) == []


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b'{"id": "a"}', "not a signatures message"),
        (pack_signed([b"S1abc", b"S1defg"])[:-2], "truncated"),
        (pack_signed([b"S1abc"]) + b"\0", "trailing"),
    ],
)
def test_unpack_rejects_malformed_messages(data: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        unpack_signed(data)


def test_a_record_wrapped_with_its_input_message_decodes_as_the_record() -> None:
    params = DedupParams()
    sketch = sketch_of(PROSE[0], params)
    signed = Signed.of("a", sketch, Provenance("in", 2, 7, 1_000), time_ms=1_000)
    record = encode_signed(signed)
    original = orjson.dumps({"id": "a", "text": PROSE[0]}) + b" "
    headers = (("source", b"wire"), ("empty", b""))
    wrapped = with_original(record, original, headers)
    assert unpack_signed(pack_signed([wrapped])) == [wrapped]
    assert decode_signed(wrapped) == decode_signed(record)  # what it wraps is for the feed only
    assert feed_inputs(wrapped) == {0: (original, headers)}
    deletion = encode_deletion(SignedDeletion("a", Provenance("in", 2, 8, None)))
    assert with_original(deletion, b"", ()) == deletion  # nothing to forward
    with pytest.raises(ValueError, match="input message"):
        decode_signed(wrapped[:20])


def test_feed_inputs_are_found_by_their_records_index_in_the_message() -> None:
    """Two versions of one id in one message each keep their own input message; a record signed
    without one (before the feed was configured) and a deletion have none."""
    first, second = (
        with_original(encode_signed(signed("a", text)), text.encode(), [("v", text[:3].encode())])
        for text in PROSE[:2]
    )
    plain = encode_signed(signed("b", PROSE[2]))
    deletion = encode_deletion(SignedDeletion("c", Provenance("in", 2, 8, None)))
    message = pack_signed([first, plain, deletion, second])
    assert feed_inputs(message) == {
        0: (PROSE[0].encode(), (("v", PROSE[0][:3].encode()),)),
        3: (PROSE[1].encode(), (("v", PROSE[1][:3].encode()),)),
    }
    assert feed_inputs(pack_signed([plain, deletion])) == {}
    # headers given as a mapping, as a Kafka client may hand them, come back as (name, value) pairs
    assert feed_inputs(with_original(plain, b"x", {"k": b"v"})) == {0: (b"x", (("k", b"v"),))}


def test_a_feed_record_with_corrupt_headers_is_refused_when_decoded() -> None:
    """Refused at its decision (a dead letter), not where the feed would publish it."""
    wrapped = with_original(encode_signed(signed("a", PROSE[0])), b"{}", [("k", b"v")])
    corrupt = wrapped.replace(b"]]", b"]}")  # the same length: only the headers' JSON is broken
    with pytest.raises(orjson.JSONDecodeError):
        decode_signed(corrupt)


def compiled_or_python(data: bytes) -> Signed | None:
    """What the compiled decoder gives for `data`, checked against the Python one's: None when it
    leaves the record to it (always where that raises), else the same record, of the same types."""
    fast = compiled._sketch.signed_record(data, Signed, Provenance)
    try:
        plain: Signed | SignedDeletion | Exception = decoded_signed(data)
    except Exception as exc:
        plain = exc
    if fast is not None:
        assert fast == plain and type(fast) is Signed and type(fast.provenance) is Provenance
    return fast


SOURCES = [Provenance("t", 0, 1, None), Provenance("in", None, -(2**63), 2**63 - 1), Provenance("ü", 7, 0, 0)]
IDS = ["a", "ü-ñ 中文 😀", "x" * 512, '"quoted"', "back\\slash", "line\nbreak", "\x00"]


@pytest.mark.parametrize(
    "params", [DedupParams(), DedupParams(containment_index=False), DedupParams(verify_perm=0)]
)
def test_the_compiled_decoder_gives_what_the_python_one_does(params: DedupParams) -> None:
    """Generated records: every one whose JSON has no escape the compiled decoder takes; those
    with one it leaves to the Python decoder; both give the same records."""
    texts = [PROSE[0], PROSE[1][:40], "abc"]
    for n, (article_id, text, src) in enumerate(itertools.product(IDS, texts, SOURCES)):
        sketch = sketch_of(text, params)
        banding = (params.lsh.bands, params.lsh.rows) if n % 2 else (0, 0)  # none: (0, 0) on the wire
        keys = band_keys(sketch.signature, *banding) if n % 2 else ()
        item = Signed.of(article_id, sketch, src, keys, banding, n - 3, n % 3 == 0)
        data = encode_signed(item)
        escaped = b"\\" in data[: 6 + struct.unpack_from(">I", data, 2)[0]]
        assert decoded_signed(data) == item
        assert compiled_or_python(data) == (None if escaped else item)


def test_the_compiled_decoder_leaves_every_cut_or_changed_record_to_the_python_one() -> None:
    """Each cut of a record, and bytes changed all along it: the compiled decoder gives what the
    Python one does or leaves it (.ci/asan: reads stay within the record)."""
    data = encode_signed(signed("a-ü", PROSE[2]))
    meta_end = 6 + struct.unpack_from(">I", data, 2)[0]
    for end in range(len(data)):
        assert compiled_or_python(data[:end]) is None or end >= meta_end + 4
    rng = random.Random(5)
    for _ in range(3000):
        changed = bytearray(data)
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(meta_end + 8) if rng.random() < 0.8 else rng.randrange(len(data))
            changed[at] = rng.randrange(256)
        compiled_or_python(bytes(changed))


def test_the_compiled_decoder_leaves_deletions_and_earlier_versions() -> None:
    item = signed("a", PROSE[0])
    record = encode_signed(item)
    for other in (
        encode_deletion(SignedDeletion("a", SRC)),
        b"S5" + record[2:],
        with_original(b"S5" + record[2:], b"{}"),
    ):
        assert compiled._sketch.signed_record(other, Signed, Provenance) is None
        assert decode_signed(other) is not None


HEADERS = [
    (),
    (("source", b"wire"), ("empty", b""), ("trace", bytes(range(40)))),
    {"ü-name": b"x"},  # not ASCII: left to the Python decoder
    (('quote"d', b"x"),),  # an escape: left
    (("tab\tname", b"x"),),
]


@pytest.mark.parametrize("headers", HEADERS, ids=range(len(HEADERS)))
def test_a_feed_record_decodes_as_the_record_it_wraps_both_ways(headers: Any) -> None:
    """The compiled decoder takes a feed record whose head is as orjson writes it (names printable
    ASCII, values base64) and gives the record inside; the rest it leaves."""
    item = signed("a", PROSE[0])
    data = with_original(encode_signed(item), b'{"id": "a"}', headers)
    names = [name for name, _ in (headers.items() if isinstance(headers, dict) else headers)]
    taken = all(name.isascii() and name.isprintable() and '"' not in name for name in names)
    assert compiled_or_python(data) == (item if taken else None)
    assert decode_signed(data) == item


def test_a_feed_record_cut_or_changed_is_taken_only_as_the_python_decoder_takes_it() -> None:
    data = with_original(encode_signed(signed("a", PROSE[1])), b"{}", (("k", b"value"), ("n", b"")))
    head_end = data.index(b"]]") + 2
    for end in range(len(data)):
        compiled_or_python(data[:end])
    rng = random.Random(9)
    for _ in range(3000):
        changed = bytearray(data)
        for _ in range(rng.randint(1, 2)):
            changed[rng.randrange(head_end)] = rng.choice(b'[]",=+/Aa0 \\x00\xff')
        compiled_or_python(bytes(changed))


def test_real_news_decodes_the_same_both_ways() -> None:
    """The sample news as the sign stage signs it: every record taken by the compiled decoder."""
    lines = (Path(neardup.__file__).parent / "data" / "sample_news.jsonl").read_text().splitlines()
    for n, line in enumerate(lines):
        news = orjson.loads(line)
        data = encode_signed(signed(str(news["id"]), news["text"], n))
        assert compiled_or_python(data) == decoded_signed(data)
