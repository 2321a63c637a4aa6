"""The length check that runs before kio's native reader (kafka_gateway/body_bounds.py).

kio reserves memory for an array's declared count before reading it, and the
process aborts when the allocator refuses: so no count may reach kio unless
it fits in the bytes left. These tests never hand kio a frame the check
refused; the live reproductions are in test_malformed_requests.py.
"""

from __future__ import annotations

import re
import struct

import pytest

from kafka_gateway.apis import APIS
from kafka_gateway.body_bounds import check_request
from kafka_gateway.codec import (
    MalformedRequest,
    _request_class,
    decode_request,
    encode_uvarint,
    entity_reader_for,
    read_header,
)
from testkit.fuzz import Seed, frame, frame_rng, seeds

SEEDS = seeds()
KIO_SEEDS = [s for s in SEEDS if _request_class(s.api_key, s.version) is not None]
LENGTHS = ("count", "ucount", "len16", "len32", "ulen")
# The only request arrays Kafka's schemas let be null, from the version that does.
NULLABLE_ARRAYS = {"MetadataRequest.topics": 1, "DescribeConfigsResource.configuration_keys": 0,
                   "CreatePartitionsTopic.assignments": 0, "OffsetFetchRequest.topics": 2,
                   "OffsetFetchRequestGroup.topics": 8,
                   "DescribeUserScramCredentialsRequest.users": 0}


def _decode(data: bytes):
    payload = memoryview(data[4:]).toreadonly()
    header, pos = read_header(payload)
    return decode_request(payload, header, pos, APIS[header.api_key].decode)


def _with(seed: Seed, span, value: bytes) -> bytes:
    body = seed.body[: span.start] + value + seed.body[span.start + span.size:]
    return frame(seed, 1, body=body)


def _check(data: bytes, seed: Seed) -> None:
    """check_request alone on a frame's body: kio never sees it."""
    payload = memoryview(data[4:]).toreadonly()
    _header, pos = read_header(payload)
    pos += 1 if seed.flexible_header else 0  # the seeds' empty header tag block
    check_request(_request_class(seed.api_key, seed.version), payload, pos)


def test_every_advertised_version_has_a_seed():
    advertised = {(a.key, v) for a in APIS.values()
                  for v in range(a.min_version, a.max_version + 1)}
    assert {(s.api_key, s.version) for s in SEEDS} == advertised


@pytest.mark.parametrize("seed", KIO_SEEDS, ids=lambda s: s.name)
def test_valid_requests_pass_and_the_check_ends_where_kio_does(seed):
    cls = _request_class(seed.api_key, seed.version)
    check_request(cls, seed.body, 0)
    entity, size = entity_reader_for(cls)(memoryview(seed.body).toreadonly(), 0)
    assert size == len(seed.body)
    if APIS[seed.api_key].decode is None:
        assert _decode(frame(seed, 1)).body == entity


def _huge(span) -> bytes:
    return b"\xff\xff\xff\xff\x0f" if span.kind in ("ucount", "ulen") else (
        struct.pack(">i", 0x7FFFFFFF) if span.size == 4 else struct.pack(">h", 0x7FFF))


@pytest.mark.parametrize("seed", [s for s in KIO_SEEDS if any(x.kind in LENGTHS for x in s.spans)],
                         ids=lambda s: s.name)
def test_every_huge_count_or_length_is_refused(seed):
    for span in (s for s in seed.spans if s.kind in LENGTHS):
        with pytest.raises(MalformedRequest, match=re.escape(span.field) + ": .* does not fit"):
            _check(_with(seed, span, _huge(span)), seed)


@pytest.mark.parametrize("seed", [s for s in SEEDS if s.api_key == 0], ids=lambda s: s.name)
def test_produce_reads_its_own_requests_within_the_same_bounds(seed):
    """Produce's hand-written reader (every version): no count beyond the bytes
    left, no null array, no length past the end."""
    assert _decode(frame(seed, 1)).body.topic_data
    for span in (s for s in seed.spans if s.kind in LENGTHS):
        with pytest.raises(MalformedRequest):
            _decode(_with(seed, span, _huge(span)))
        if span.kind in ("count", "ucount"):
            null = b"\x00" if span.kind == "ucount" else b"\xff\xff\xff\xff"
            with pytest.raises(MalformedRequest, match="where the schema has no null"):
                _decode(_with(seed, span, null))


def test_the_reported_frames_are_refused():
    metadata = bytes.fromhex(
        "0000001e0003000c000000010006726f6275737400ffffffff0f0000000000000000")
    with pytest.raises(MalformedRequest, match=r"MetadataRequest\.topics: array count"):
        _decode(metadata)
    body = bytes.fromhex("0014000400000007000772646b61666b6100fffffffe70320000ea6000")
    with pytest.raises(MalformedRequest, match=r"DeleteTopicsRequest\.topic_names: array count"):
        _decode(struct.pack(">i", len(body)) + body)


@pytest.mark.parametrize("seed", KIO_SEEDS, ids=lambda s: s.name)
def test_null_arrays_only_where_the_schema_allows(seed):
    """A null where Kafka's schema has none fails the parse, as in Kafka; kio
    alone would hand the handler None."""
    for span in (s for s in seed.spans if s.kind in ("count", "ucount")):
        data = _with(seed, span, b"\x00" if span.kind == "ucount" else b"\xff\xff\xff\xff")
        refusal = f"{span.field}: array count -1 where the schema has no null"
        if seed.version >= NULLABLE_ARRAYS.get(span.field, 1 << 15):
            try:  # the rest of the body still holds the array's items: may fail later
                _check(data, seed)
            except MalformedRequest as exc:
                assert refusal not in str(exc)
        else:
            with pytest.raises(MalformedRequest, match=re.escape(refusal)):
                _check(data, seed)


def test_a_known_tagged_field_must_fill_exactly_its_size():
    seed = next(s for s in KIO_SEEDS if s.api_key == 1 and s.version == 13)
    tags = seed.spans[-1]
    assert tags.kind == "tags" and tags.start + tags.size == len(seed.body)

    def with_cluster_id(declared: int, content: bytes) -> bytes:  # tag 0: cluster_id
        block = b"\x01\x00" + encode_uvarint(declared) + content
        return frame(seed, 1, body=seed.body[: tags.start] + block)

    assert _decode(with_cluster_id(4, b"\x04abc")).body.cluster_id == "abc"
    for declared, content in ((6, b"\x04abc\x00\x00"), (2, b"\x04abc"), (40, b"\x04abc")):
        with pytest.raises(MalformedRequest):
            _decode(with_cluster_id(declared, content))


def test_unknown_tags_and_a_huge_tag_count_are_bounded():
    seed = next(s for s in KIO_SEEDS if s.api_key == 18 and s.version == 3)
    tags = seed.spans[-1]
    for block in (b"\xff\xff\xff\xff\x0f", b"\x01\x7f\xff\xff\xff\xff\x0f",
                  b"\x02\x7f\x00"):
        with pytest.raises(MalformedRequest, match="does not fit"):
            _check(frame(seed, 1, body=seed.body[: tags.start] + block), seed)


def test_mutated_frames_that_pass_are_read_by_kio_to_the_same_end():
    """The check and kio walk a body alike: wherever kio reads a body the check
    passed, both end at the same byte, so no field goes by unchecked."""
    read = 0
    for number in range(4000):
        rng = frame_rng(11, number)
        seed = KIO_SEEDS[rng.randrange(len(KIO_SEEDS))]
        cls = _request_class(seed.api_key, seed.version)
        body = memoryview(frame(seed, 1, rng)[4:]).toreadonly()[-len(seed.body):]
        try:
            end = check_request(cls, body, 0)
        except MalformedRequest:
            continue
        try:
            _entity, size = entity_reader_for(cls)(body, 0)
        except Exception:  # kio refuses bad UTF-8, bad booleans, unknown tags
            continue
        read += 1
        assert end == size, f"{seed.name}: checked to {end}, kio read to {size}"
    assert read > 1000
