"""Every length in a request body checked against the bytes left, before kio reads it.

kio's native reader reserves room for an array's declared count before it
reads a single element (``Vec::with_capacity(n)``), so a count of 2^32 in a
30-byte frame asks the allocator for 32 GiB and, when that fails, Rust aborts
the whole process. Kafka's own generated parsers refuse a count larger than
the bytes remaining; this module does the same for kio: it walks the body the
way kio will read it, from the same dataclass schemas (kio's own field
introspection decides each field's wire form), and raises
:class:`reader.MalformedRequest` when

- an array's count times its smallest element is more than the bytes left,
- a string, bytes or tagged field is longer than the bytes left,
- a known tagged field's content does not fill exactly its declared size
  (kio reads it by type and ignores the size, so the two would part ways),
- a compact string (flexible versions) is longer than 32767 bytes, the most
  a Kafka string holds (Kafka's parsers refuse it the same way),
- a null arrives where the schema has no null (Kafka: "non-nullable field
  ... was serialized as null"; kio would hand the handler None).

Once this passes, every array kio allocates holds no more items than there
are bytes after it.

It also counts the items of every array in the body and refuses a body with
more than ``max_items`` in all (``gateway.request.max.array.items``): kio's
reader holds the interpreter for about a microsecond per item, so this bounds
how long decoding one request keeps every other client waiting (slicing.py).

Each schema is compiled once into closures; runs of fixed
fields are one step, and an array of fixed-size items is skipped in one.
Produce reads its own requests (apis/produce_request.py) and bounds every
read there, so it does not come through here.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import fields
from functools import cache
from typing import Any

from .reader import MalformedRequest, read_uvarint
from .thirdparty import (
    EntityField,
    EntityTupleField,
    PrimitiveField,
    PrimitiveTupleField,
    classify_field,
    get_field_tag,
    get_schema_field_type,
    is_optional,
)

# A compiled step: (buffer, position, end) -> position after the field.
Step = Callable[[Any, int, int], int]

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_FIXED = {
    "int8": 1, "uint8": 1, "bool": 1,
    "int16": 2, "uint16": 2, "error_code": 2,
    "int32": 4, "uint32": 4, "timedelta_i32": 4,
    "int64": 8, "uint64": 8, "float64": 8, "timedelta_i64": 8, "datetime_i64": 8,
    "uuid": 16,
}
_VARIABLE = ("string", "bytes", "records")
# A Kafka string has an int16 length; a compact one (flexible versions) could
# say more, and Kafka's parsers refuse that.
MAX_STRING_BYTES = 0x7FFF


class TooManyItems(ValueError):
    """A request body with more array items than ``gateway.request.max.array.items``."""


class _Items:
    """The array items counted by the walk in progress (one at a time: it never awaits)."""

    __slots__ = ("left",)

    def __init__(self) -> None:
        self.left = -1  # < 0: not counting


_items = _Items()


def check_request(cls: type, frame: Any, pos: int, max_items: int = -1) -> int:
    """Refuse a body of ``cls`` at ``pos`` whose lengths do not fit in ``frame``,
    or with more than ``max_items`` array items in all (-1: no limit); return
    where the body ends."""
    _items.left = max_items
    try:
        end = _entity(cls, False).walk(frame, pos, len(frame))
    except (struct.error, IndexError) as exc:
        raise MalformedRequest(f"{cls.__name__} runs past the end of the frame") from exc
    except TooManyItems as exc:
        raise MalformedRequest(
            f"{cls.__name__} has more than {max_items} array items "
            f"(gateway.request.max.array.items): {exc}") from exc
    finally:
        _items.left = -1
    if end > len(frame):
        raise MalformedRequest(f"{cls.__name__} runs past the end of the frame")
    return end


class _Compiled:
    """A schema entity, compiled: how to walk it and the fewest bytes it takes."""

    __slots__ = ("fixed_size", "min_size", "tagged_after", "walk")

    def __init__(self, walk: Step, min_size: int, fixed_size: int | None = None,
                 tagged_after: int | None = None) -> None:
        self.walk = walk
        self.min_size = min_size
        self.fixed_size = fixed_size  # every instance takes exactly this many bytes
        # Fixed fields of this many bytes, then only tagged fields (a flexible
        # partition entry, most often): arrays of them walk in one loop.
        self.tagged_after = tagged_after


def _refuse(where: str, what: str, size: int, left: int) -> MalformedRequest:
    return MalformedRequest(
        f"{where}: {what} of {size} does not fit in the {left} bytes left")


@cache
def _entity(cls: type, nullable: bool) -> _Compiled:
    flexible = bool(cls.__flexible__)
    steps: list[Step] = []
    fixed_run = 0
    min_size = 0
    tagged: dict[int, Step] = {}
    for field in fields(cls):
        where = f"{cls.__name__}.{field.name}"
        tag = get_field_tag(field)
        if tag is not None:
            tagged[int(tag)] = _field(field, where, flexible, tagged=True)[0]
            continue
        size = _fixed_size(field)
        if size is not None:
            fixed_run += size
            continue
        if fixed_run:
            steps.append(_skip(fixed_run))
            min_size += fixed_run
            fixed_run = 0
        step, field_min = _field(field, where, flexible, tagged=False)
        steps.append(step)
        min_size += field_min
    if fixed_run:
        steps.append(_skip(fixed_run))
        min_size += fixed_run
    if flexible:
        steps.append(_tagged_fields(cls.__name__, tagged))
        min_size += 1
    walk = _sequence(steps)
    if nullable:
        return _Compiled(_nullable_entity(walk), 1)
    only_fixed = all(_fixed_size(f) is not None for f in fields(cls) if get_field_tag(f) is None)
    if not only_fixed:
        return _Compiled(walk, min_size)
    if flexible:
        return _Compiled(walk, min_size, tagged_after=min_size - 1)
    return _Compiled(walk, min_size, fixed_size=min_size)


def _fixed_size(field: Any) -> int | None:
    """Bytes a field always takes, or None when it has a length or is an entity."""
    kind = classify_field(field)
    if type(kind) is PrimitiveField and get_field_tag(field) is None:
        return _FIXED.get(get_schema_field_type(field))
    if type(kind) is EntityField and not is_optional(field):
        compiled = _entity(kind.type_, False)
        return compiled.fixed_size
    return None


def _field(field: Any, where: str, flexible: bool, tagged: bool) -> tuple[Step, int]:
    """The step for one field, and the fewest bytes it takes."""
    kind = classify_field(field)
    # kio reads a tagged primitive as not nullable (its tag's absence is the null).
    nullable = is_optional(field) and not (tagged and type(kind) is PrimitiveField)
    if type(kind) is PrimitiveField:
        return _primitive(get_schema_field_type(field), flexible, nullable, where)
    if type(kind) is EntityField:
        compiled = _entity(kind.type_, nullable)
        return compiled.walk, compiled.min_size
    if type(kind) is PrimitiveTupleField:
        item, item_min = _primitive(get_schema_field_type(field), flexible, False, where)
        item_fixed = _FIXED.get(get_schema_field_type(field))
        item_tagged_after = None
    elif type(kind) is EntityTupleField:
        compiled = _entity(kind.type_, False)
        item, item_min, item_fixed = compiled.walk, compiled.min_size, compiled.fixed_size
        item_tagged_after = compiled.tagged_after
    else:  # pragma: no cover - kio knows no other kind
        raise TypeError(f"{where}: unknown field kind {kind!r}")
    step = _array(item, max(item_min, 1), item_fixed, item_tagged_after, flexible, nullable,
                  where)
    return step, 1 if flexible else 4


def _primitive(kafka_type: str, flexible: bool, nullable: bool, where: str) -> tuple[Step, int]:
    size = _FIXED.get(kafka_type)
    if size is not None:
        return _skip(size), size
    if kafka_type not in _VARIABLE:  # pragma: no cover - a kio type this does not know
        raise TypeError(f"{where}: unknown kafka type {kafka_type}")
    if flexible:
        return _compact_bytes(nullable, where, kafka_type == "string"), 1
    if kafka_type == "string":
        return _legacy_string(nullable, where), 2
    return _legacy_bytes(nullable, where), 4


def _skip(size: int) -> Step:
    # Past the end is caught by the next length read, or by check_request's last test.
    def walk(buf: Any, pos: int, end: int) -> int:
        return pos + size
    return walk


def _sequence(steps: list[Step]) -> Step:
    if len(steps) == 1:
        return steps[0]
    steps_ = tuple(steps)

    def walk(buf: Any, pos: int, end: int) -> int:
        for step in steps_:
            pos = step(buf, pos, end)
        return pos
    return walk


def _nullable_entity(walk_entity: Step) -> Step:
    def walk(buf: Any, pos: int, end: int) -> int:
        if buf[pos] == 0xFF:  # the int8 marker -1 (KIP-893)
            return pos + 1
        return walk_entity(buf, pos + 1, end)
    return walk


def _compact_bytes(nullable: bool, where: str, string: bool) -> Step:
    def walk(buf: Any, pos: int, end: int) -> int:
        size, pos = read_uvarint(buf, pos)
        if size == 0:
            if not nullable:
                raise MalformedRequest(f"{where}: null where the schema has none")
            return pos
        size -= 1
        if size > end - pos:
            raise _refuse(where, "length", size, end - pos)
        if string and size > MAX_STRING_BYTES:
            # Kafka's generated parsers: "string field ... had invalid length".
            raise MalformedRequest(f"{where}: string of {size} bytes (at most "
                                   f"{MAX_STRING_BYTES})")
        return pos + size
    return walk


def _legacy_string(nullable: bool, where: str) -> Step:
    def walk(buf: Any, pos: int, end: int) -> int:
        (size,) = _I16.unpack_from(buf, pos)
        return _legacy_length(size, pos + 2, end, nullable, where)
    return walk


def _legacy_bytes(nullable: bool, where: str) -> Step:
    def walk(buf: Any, pos: int, end: int) -> int:
        (size,) = _I32.unpack_from(buf, pos)
        return _legacy_length(size, pos + 4, end, nullable, where)
    return walk


def _legacy_length(size: int, pos: int, end: int, nullable: bool, where: str) -> int:
    if size < 0:
        if size == -1 and nullable:
            return pos
        raise MalformedRequest(f"{where}: length {size} where the schema has "
                               f"{'no null' if size == -1 else 'none'}")
    if size > end - pos:
        raise _refuse(where, "length", size, end - pos)
    return pos + size


def _array(item: Step, item_min: int, item_fixed: int | None, item_tagged_after: int | None,
           flexible: bool, nullable: bool, where: str) -> Step:
    def walk(buf: Any, pos: int, end: int) -> int:
        if flexible:
            count, pos = read_uvarint(buf, pos)
            count -= 1  # -1 is null
        else:
            (count,) = _I32.unpack_from(buf, pos)
            pos += 4
        if count < 0:
            if count == -1 and nullable:
                return pos
            raise MalformedRequest(f"{where}: array count {count} where the schema has "
                                   f"{'no null' if count == -1 else 'none'}")
        if count * item_min > end - pos:
            raise _refuse(where, "array count", count, end - pos)
        if _items.left >= 0:
            _items.left -= count
            if _items.left < 0:
                raise TooManyItems(f"{where} has {count}")
        if item_fixed is not None:
            return pos + count * item_fixed
        if item_tagged_after is not None:
            # Most such items carry no tagged fields: their count, 0, after the fixed ones.
            for _ in range(count):
                if buf[pos + item_tagged_after] == 0:
                    pos += item_tagged_after + 1
                else:
                    pos = item(buf, pos, end)
            return pos
        for _ in range(count):
            pos = item(buf, pos, end)
        return pos
    return walk


def _tagged_fields(where: str, known: dict[int, Step]) -> Step:
    def walk(buf: Any, pos: int, end: int) -> int:
        count, pos = read_uvarint(buf, pos)
        if not count:
            return pos
        if count * 2 > end - pos:  # each takes a tag and a size
            raise _refuse(where, "tagged field count", count, end - pos)
        for _ in range(count):
            tag, pos = read_uvarint(buf, pos)
            size, pos = read_uvarint(buf, pos)
            if size > end - pos:
                raise _refuse(f"{where} tag {tag}", "size", size, end - pos)
            step = known.get(tag)
            # kio reads a known tag by its type and ignores the declared size.
            if step is not None and step(buf, pos, pos + size) != pos + size:
                raise MalformedRequest(f"{where} tag {tag}: content does not fill its "
                                       f"{size} bytes")
            pos += size
        return pos
    return walk
