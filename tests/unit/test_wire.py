"""neardup.pipeline.wire: signed records, deletions, feed records and packs on the signatures topic,
and the refusals of bytes that are none of them."""

from __future__ import annotations

import dataclasses
import struct

import orjson
import pytest

from neardup.core.params import DedupParams
from neardup.core.signing import sketch_of
from neardup.pipeline.wire import (
    Provenance,
    Signed,
    SignedDeletion,
    decode_signed,
    encode_deletion,
    encode_signed,
    pack_in_chunks,
    pack_signed,
    unpack_signed,
    with_original,
)
from tests.support.prose import PROSE
from tests.support.signing import signed


@pytest.mark.parametrize(
    ("keys", "banding"),
    [((b"short",), (1, 5)), ((b"x" * 11,), (1, 5)), ((b"x" * 10,) * 2, (1, 5)), ((b"x" * 10,), (0, 0))],
)
def test_band_keys_of_another_width_or_count_are_refused(
    keys: tuple[bytes, ...], banding: tuple[int, int]
) -> None:
    item = dataclasses.replace(signed("a", PROSE[0]), band_keys=keys, banding=banding)
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


def test_a_record_wrapped_with_its_input_message_decodes_with_it() -> None:
    params = DedupParams()
    sketch = sketch_of(PROSE[0], params)
    signed = Signed("a", sketch, Provenance("in", 2, 7, 1_000), time_ms=1_000)
    record = encode_signed(signed)
    original = orjson.dumps({"id": "a", "text": PROSE[0]}) + b" "
    headers = (("source", b"wire"), ("empty", b""))
    wrapped = with_original(record, original, headers)
    assert unpack_signed(pack_signed([wrapped])) == [wrapped]
    decoded = decode_signed(wrapped)
    assert isinstance(decoded, Signed)
    assert decoded.original == original and decoded.headers == headers
    assert dataclasses.replace(decoded, original=None, headers=()) == decode_signed(record)
    deletion = encode_deletion(SignedDeletion("a", Provenance("in", 2, 8, None)))
    assert with_original(deletion, b"", ()) == deletion  # nothing to forward
    with pytest.raises(ValueError, match="input message"):
        decode_signed(wrapped[:20])
