"""Structure-aware mutation of Kafka requests, for the fuzz test and bench/fuzz.py.

A *seed* is a valid request for one advertised API and version, encoded by
kio's writer from a sample of its schema (Produce v0-2, which kio cannot
write, from v3's bytes less the transactional id), together with the place
and wire form of each field in it (its *spans*). A mutation rewrites a few
spans the way a buggy or hostile client would (array counts and lengths made
huge, negative, null or off by one; varints over-long; fixed fields set to
their extremes; nullable markers flipped; tagged fields invented), and now
and then truncates the frame, flips bits or garbles the header. Each frame is
a function of (seed number, frame number) only, so a run is reproducible
however its frames are spread over connections.
"""

from __future__ import annotations

import datetime
import random
import struct
from dataclasses import dataclass, fields
from typing import Any
from uuid import UUID

from kio.static.primitive import Records

from kafka_gateway.apis import APIS
from kafka_gateway.codec import (
    ChunkWriter,
    _request_class,
    encode_uvarint,
    entity_writer_for,
)
from kafka_gateway.reader import read_uvarint
from kafka_gateway.thirdparty import (
    EntityField,
    EntityTupleField,
    PrimitiveTupleField,
    classify_field,
    get_field_tag,
    get_schema_field_type,
    is_optional,
)
from testkit.batches import make_batch

PRODUCE = 0
_NO_ID = UUID(int=0)
_FIXED = {"int8": 1, "uint8": 1, "bool": 1, "int16": 2, "uint16": 2, "error_code": 2,
          "int32": 4, "uint32": 4, "timedelta_i32": 4, "int64": 8, "uint64": 8, "float64": 8,
          "timedelta_i64": 8, "datetime_i64": 8, "uuid": 16}


@dataclass(frozen=True, slots=True)
class Span:
    """One field of an encoded body: where it is and its wire form.

    kind: "count" (int32 array count), "ucount" (varint count + 1), "len16" /
    "len32" (string / bytes length), "ulen" (varint length + 1), "int" (a
    fixed field of ``size`` bytes), "marker" (nullable struct), "tags"
    (tagged field count), "text" (string or bytes content).
    """

    start: int
    size: int
    kind: str
    field: str = ""  # "Entity.field", for arrays, strings and bytes


@dataclass(frozen=True, slots=True)
class Seed:
    api_key: int
    version: int
    flexible_header: bool
    body: bytes
    spans: tuple[Span, ...]
    large: bool = False  # arrays of thousands of items: mutated, not swept

    @property
    def name(self) -> str:
        return f"{APIS[self.api_key].name} v{self.version}"


@dataclass(frozen=True, slots=True)
class Names:
    """What the seeds name: topics and a group the fuzzing may churn freely."""

    topic: str = "fz"
    topic_id: UUID = _NO_ID
    created_topic: str = "fzc"  # CreateTopics and DeleteTopics play with this one
    group: str = "fzg"


# ------------------------------------------------------------------ seeds
def seeds(names: Names = Names()) -> list[Seed]:
    """A valid request for every API and version the gateway advertises."""
    out = []
    for api in sorted(APIS.values(), key=lambda a: a.key):
        for version in range(api.min_version, api.max_version + 1):
            cls = _request_class(api.key, version)
            if cls is None and api.key == PRODUCE:
                out.append(_legacy_produce(version, names))
                continue
            assert cls is not None, f"no schema for {api.name} v{version}"
            body = _encode(_sample(cls, names))
            spans: list[Span] = []
            end = _trace(cls, body, 0, spans, nullable=False)
            assert end == len(body), f"{api.name} v{version}: traced {end} of {len(body)} bytes"
            out.append(Seed(api.key, version, bool(cls.__flexible__), body, tuple(spans)))
    for api_key in LARGE_ARRAY_APIS:
        out.append(_seed(api_key, APIS[api_key].max_version, names, LARGE_ARRAY_ITEMS))
    return out


# The transaction APIs with arrays also get a seed whose innermost arrays hold
# this many items (outer ones 3): costly requests near gateway.request.max.array.items.
LARGE_ARRAY_APIS = (24, 28, 61, 65, 66)  # AddPartitionsToTxn, TxnOffsetCommit,
# DescribeProducers, DescribeTransactions, ListTransactions
LARGE_ARRAY_ITEMS = 5000


def _seed(api_key: int, version: int, names: Names, width: int) -> Seed:
    cls = _request_class(api_key, version)
    assert cls is not None
    body = _encode(_sample(cls, names, width))
    spans: list[Span] = []
    end = _trace(cls, body, 0, spans, nullable=False)
    assert end == len(body), f"{api_key} v{version}: traced {end} of {len(body)} bytes"
    return Seed(api_key, version, bool(cls.__flexible__), body, tuple(spans), large=width > 1)


def _legacy_produce(version: int, names: Names) -> Seed:
    """Produce v0-2: v3's body less its leading transactional id (a null string)."""
    v3 = _request_class(PRODUCE, 3)
    body = _encode(_sample(v3, names))
    spans: list[Span] = []
    _trace(v3, body, 0, spans, nullable=False)
    assert body[:2] == b"\xff\xff"
    shifted = tuple(Span(s.start - 2, s.size, s.kind, s.field) for s in spans if s.start >= 2)
    return Seed(PRODUCE, version, False, body[2:], shifted)


def _encode(entity: Any) -> bytes:
    out = ChunkWriter()
    entity_writer_for(type(entity))(out, entity)
    return b"".join(out.chunks)


_INTS = {
    "acks": -1, "count": 2, "num_partitions": 1, "replication_factor": 1, "replica_id": -1,
    "max_bytes": 1 << 20, "partition_max_bytes": 1 << 20, "min_bytes": 1,
    "generation_id": -1, "generation_id_or_member_epoch": -1, "current_leader_epoch": -1,
    "committed_leader_epoch": -1, "last_fetched_epoch": -1, "session_epoch": -1,
    "resource_type": 2, "timestamp": -1, "log_start_offset": -1,
}
_MILLIS = {"max_wait": 0, "timeout": 1000, "session_timeout": 10_000,
           "rebalance_timeout": 10_000, "retention_time": -1}


def _string(owner: str, name: str, names: Names) -> str | None:
    if owner in ("AlterableConfig", "CreatableTopicConfig"):
        return {"name": "retention.ms", "value": "3600000"}.get(name)
    if owner == "JoinGroupRequestProtocol":
        return "range"
    if owner in ("CreatableTopic", "DeleteTopicState") or name == "topic_names":
        return names.created_topic
    if name in ("name", "topic", "resource_name"):
        return names.topic
    if name in ("group_id", "key", "coordinator_keys", "groups", "groups_names"):
        return names.group
    return {"protocol_type": "consumer", "protocol_name": "range", "client_software_name": "fz",
            "client_software_version": "1", "configuration_keys": "retention.ms",
            "states_filter": "Stable"}.get(name, "")


def _value(owner: str, field: Any, kafka_type: str, names: Names) -> Any:
    name = field.name
    if kafka_type == "string":
        optional = is_optional(field)
        if optional and name in ("group_instance_id", "transactional_id", "reason",
                                 "cluster_id", "rack_id"):
            return None
        return _string(owner, name, names)
    if kafka_type == "records":
        return Records(make_batch([b"fuzz"], base_timestamp=1_700_000_000_000))
    if kafka_type == "bytes":
        return b""
    if kafka_type == "uuid":
        return names.topic_id
    if kafka_type == "bool":
        return name == "allow_auto_topic_creation"
    if kafka_type.startswith("timedelta"):
        return datetime.timedelta(milliseconds=_MILLIS.get(name, 0))
    return _INTS.get(name, 0)


def _sample(cls: type, names: Names, width: int = 1) -> Any:
    """An instance of ``cls`` with every (untagged) field set to a plausible value;
    arrays of ``width`` items (3 for arrays of items that hold arrays themselves)."""
    values = {}
    for field in fields(cls):
        if get_field_tag(field) is not None:
            continue  # left at its default: not written
        kind = classify_field(field)
        if isinstance(kind, EntityField):
            values[field.name] = _sample(kind.type_, names)
        elif isinstance(kind, EntityTupleField):
            nested = width > 1 and any(
                isinstance(classify_field(f), EntityTupleField | PrimitiveTupleField)
                for f in fields(kind.type_))
            values[field.name] = tuple(_sample(kind.type_, names, width)
                                       for _ in range(3 if nested else width))
        elif isinstance(kind, PrimitiveTupleField):
            kafka_type = get_schema_field_type(field)
            item = (_string(cls.__name__, field.name, names) if kafka_type == "string"
                    else 0)
            values[field.name] = (item,) * width
        else:
            values[field.name] = _value(cls.__name__, field, get_schema_field_type(field),
                                        names)
    return cls(**values)


# ------------------------------------------------------------------ trace
def _trace(cls: type, body: bytes, pos: int, spans: list[Span], nullable: bool) -> int:
    """Walk a valid body of ``cls`` from ``pos``, noting each field's span."""
    flexible = bool(cls.__flexible__)
    if nullable:
        spans.append(Span(pos, 1, "marker"))
        if body[pos] == 0xFF:
            return pos + 1
        pos += 1
    for field in fields(cls):
        if get_field_tag(field) is not None:
            continue
        kind = classify_field(field)
        if isinstance(kind, EntityField):
            pos = _trace(kind.type_, body, pos, spans, is_optional(field))
        elif isinstance(kind, (EntityTupleField, PrimitiveTupleField)):
            where = f"{cls.__name__}.{field.name}"
            count, pos = _count(body, pos, flexible, spans, where)
            for _ in range(count):
                if isinstance(kind, EntityTupleField):
                    pos = _trace(kind.type_, body, pos, spans, nullable=False)
                else:
                    pos = _primitive(get_schema_field_type(field), body, pos, flexible, spans,
                                     where)
        else:
            pos = _primitive(get_schema_field_type(field), body, pos, flexible, spans,
                             f"{cls.__name__}.{field.name}")
    if flexible:
        count, after = read_uvarint(body, pos)
        assert count == 0, "seeds carry no tagged fields"
        spans.append(Span(pos, after - pos, "tags"))
        pos = after
    return pos


def _count(body: bytes, pos: int, flexible: bool, spans: list[Span],
           where: str) -> tuple[int, int]:
    if flexible:
        value, after = read_uvarint(body, pos)
        spans.append(Span(pos, after - pos, "ucount", where))
        return max(value - 1, 0), after
    (value,) = struct.unpack_from(">i", body, pos)
    spans.append(Span(pos, 4, "count", where))
    return max(value, 0), pos + 4


def _primitive(kafka_type: str, body: bytes, pos: int, flexible: bool,
               spans: list[Span], where: str) -> int:
    size = _FIXED.get(kafka_type)
    if size is not None:
        spans.append(Span(pos, size, "int"))
        return pos + size
    if flexible:
        value, after = read_uvarint(body, pos)
        spans.append(Span(pos, after - pos, "ulen", where))
        length = max(value - 1, 0)
    elif kafka_type == "string":
        (length,) = struct.unpack_from(">h", body, pos)
        spans.append(Span(pos, 2, "len16", where))
        after = pos + 2
    else:
        (length,) = struct.unpack_from(">i", body, pos)
        spans.append(Span(pos, 4, "len32", where))
        after = pos + 4
    length = max(length, 0)
    if length:
        spans.append(Span(after, length, "text", where))
    return after + length


# ---------------------------------------------------------------- mutate
_HUGE_VARINTS = (b"\xff\xff\xff\xff\x0f", b"\xff\xff\xff\xff\x7f", b"\xfe\xff\xff\xff\x07",
                 b"\x80\x80\x80\x80\x08", b"\xff\xff\xff\xff\xff\x01")  # the last: too long


def _int_bytes(size: int, rng: random.Random, current: int) -> bytes:
    bits = size * 8
    low, high = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    value = rng.choice((0, -1, 1, low, high, current + 1, current - 1,
                        rng.randint(low, high), rng.randint(-1000, 1000)))
    return max(low, min(high, value)).to_bytes(size, "big", signed=True)


def _replacement(span: Span, old: bytes, rng: random.Random) -> bytes:
    kind = span.kind
    if kind in ("ucount", "ulen"):
        current, _ = read_uvarint(old, 0)
        return rng.choice((*_HUGE_VARINTS, b"\x00", encode_uvarint(current + 1),
                           encode_uvarint(max(current - 1, 0)),
                           encode_uvarint(rng.randint(0, 1 << 31)),
                           encode_uvarint(rng.randint(0, 300))))
    if kind in ("count", "len32"):
        (current,) = struct.unpack(">i", old)
        return struct.pack(">i", rng.choice((-1, -2, 0, current + 1, current + 1000, 0x7FFFFFFF,
                                             -0x80000000, 0x10000000,
                                             rng.randint(-0x80000000, 0x7FFFFFFF))))
    if kind == "len16":
        (current,) = struct.unpack(">h", old)
        return struct.pack(">h", rng.choice((-1, -2, 0, current + 1, 0x7FFF, -0x8000,
                                             rng.randint(-0x8000, 0x7FFF))))
    if kind == "marker":
        return bytes([rng.choice((0xFF, 0x00, 0x01, 0x7F, rng.randrange(256)))])
    if kind == "tags":
        return rng.choice((
            *_HUGE_VARINTS,
            # one unknown tag, of a size that is right, too long or too short
            b"\x01" + encode_uvarint(rng.randint(0, 200)) + b"\x01\x00",
            b"\x01\x7f" + encode_uvarint(rng.randint(0, 1 << 20)),
            b"\x02\x00\x00\x00",
            # a known tag's number with a content that does not fit
            b"\x01\x00" + encode_uvarint(rng.randint(0, 40)) + bytes(rng.randint(0, 8)),
        ))
    if kind == "text":
        mutated = bytearray(old)
        for _ in range(rng.randint(1, 3)):
            mutated[rng.randrange(len(mutated))] = rng.choice((0, 0xFF, 0xC3, 0x2E,
                                                               rng.randrange(256)))
        return bytes(mutated)
    current = int.from_bytes(old, "big", signed=True)
    return _int_bytes(span.size, rng, current)


def _header(seed: Seed, correlation_id: int, rng: random.Random | None) -> bytes:
    api_key, version, client_id = seed.api_key, seed.version, b"fuzz"
    client_len = len(client_id)
    tags = b"\x00" if seed.flexible_header else b""
    if rng is not None:
        choice = rng.randrange(5)
        if choice == 0:
            version = rng.choice((-1, version + 1, APIS[api_key].max_version + 1, 0x7FFF,
                                  rng.randint(-3, 20)))
        elif choice == 1:
            api_key = rng.choice((*APIS, rng.randint(-2, 100), 0x7FFF))
        elif choice == 2:
            client_len = rng.choice((-1, -2, 0x7FFF, len(client_id) + 1, 0))
        elif choice == 3 and seed.flexible_header:
            tags = rng.choice((*_HUGE_VARINTS, b"\x01\x00\x05ab"))
        else:
            client_id = bytes(rng.randrange(256) for _ in range(rng.randint(0, 8)))
            client_len = len(client_id)
    head = struct.pack(">hhih", api_key, version, correlation_id, client_len)
    return head + client_id + tags


def boundaries(all_seeds: list[Seed]) -> list[tuple[Seed, bytes]]:
    """Every field of every seed at each edge of its range, one field at a time.

    Fixed fields at 0, -1, 1 and their minimum and maximum; arrays empty and
    null; strings and bytes empty and null; nullable structs null; an unknown
    tagged field. Most of these decode: they reach the handlers.
    """
    out = []
    for seed in all_seeds:
        if seed.large:
            continue
        body = seed.body
        for span in seed.spans:
            for value in _edges(span):
                out.append((seed, body[: span.start] + value + body[span.start + span.size:]))
    return out


def _edges(span: Span) -> tuple[bytes, ...]:
    if span.kind == "int":
        bits = span.size * 8
        values = (0, -1, 1, -(1 << (bits - 1)), (1 << (bits - 1)) - 1)
        return tuple(v.to_bytes(span.size, "big", signed=True) for v in values)
    if span.kind in ("ucount", "ulen"):
        return (b"\x01", b"\x00")
    if span.kind in ("count", "len32"):
        return (bytes(4), b"\xff" * 4)
    if span.kind == "len16":
        return (bytes(2), b"\xff" * 2)
    if span.kind == "marker":
        return (b"\xff",)
    if span.kind == "tags":
        return (b"\x01\x7f\x01\x00",)
    return ()


def frame(seed: Seed, correlation_id: int, rng: random.Random | None = None,
          body: bytes | None = None) -> bytes:
    """The seed as a frame (length prefix included): with ``body`` in place of its
    own if given, else mutated when ``rng`` is given."""
    if rng is None:
        payload = _header(seed, correlation_id, None) + (seed.body if body is None else body)
        return struct.pack(">i", len(payload)) + payload
    body = seed.body
    header_rng = rng if rng.random() < 0.1 else None
    roll = rng.random()
    if roll < 0.75 and seed.spans:
        # One to three fields rewritten, the last in the body first so the
        # earlier spans keep their places.
        chosen = rng.sample(seed.spans, min(len(seed.spans), rng.choice((1, 1, 1, 2, 3))))
        for span in sorted(chosen, key=lambda s: s.start, reverse=True):
            old = body[span.start: span.start + span.size]
            body = body[: span.start] + _replacement(span, old, rng) + body[span.start
                                                                             + span.size:]
    elif roll < 0.85:
        body = body[: rng.randrange(len(body) + 1)]  # truncated
    elif roll < 0.95 and body:
        flipped = bytearray(body)
        for _ in range(rng.randint(1, 8)):
            flipped[rng.randrange(len(flipped))] ^= 1 << rng.randrange(8)
        body = bytes(flipped)
    else:
        body = body + bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
    payload = _header(seed, correlation_id, header_rng) + body
    if rng.random() < 0.02:
        payload = payload[: rng.randrange(len(payload) + 1)]  # even the header cut short
    return struct.pack(">i", len(payload)) + payload


def frame_rng(run_seed: int, number: int) -> random.Random:
    """The generator of frame ``number`` of a run: frames do not depend on scheduling."""
    return random.Random(run_seed * 1_000_003 + number)
