"""Request decoding and response encoding, through kio's generated schemas.

The request header is read by hand (it decides which schema to use; reader.py
holds the primitives read by hand); bodies are checked by body_bounds.py,
then read by kio's native reader and written by kio's writer into a list of
chunks, so record bytes pass through without being copied.
"""

from __future__ import annotations

import datetime
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from functools import cache
from types import ModuleType
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from kio.index import UnknownEntity, load_payload_module
from kio.serial import entity_reader, entity_writer
from kio.static.constants import EntityType
from kio.static.primitive import i32Timedelta
from kio.static.protocol import ResponsePayload

from tablets.seam import FileRegion

from .body_bounds import check_request
from .reader import MalformedRequest, skip_tagged_fields

if TYPE_CHECKING:
    from .security.session import Session

API_VERSIONS_KEY = 18
_HEADER = struct.Struct(">hhih")
_SIZE = struct.Struct(">i")
_CORRELATION = struct.Struct(">i")

NO_THROTTLE = i32Timedelta.parse(datetime.timedelta(0))

# A request's body type: the union of kio's classes for the versions an API
# serves (one class per version), or the tuple its own reader returns.
# Covariant: a Request[HeartbeatRequest] is a Request[object] to code that
# reads only its header or session (authorize()).
Body = TypeVar("Body", covariant=True)


@dataclass(frozen=True, slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None


@dataclass(frozen=True, slots=True)
class Request(Generic[Body]):
    """A decoded request; its body is read as ``Body`` (apis/<api>.py names it)."""

    header: RequestHeader
    body: Body
    size: int  # frame size in bytes, for metrics
    client_host: str = ""  # the peer's address, as Kafka reports it ("/127.0.0.1")
    connection: int = -1  # the id of the connection it came on (ids increase)
    session: Session | None = None  # listener and principal (None in unit tests)

    @property
    def version(self) -> int:
        return self.header.api_version


@dataclass(frozen=True, slots=True)
class EncodedBody:
    """A response body its handler encoded itself, as chunks: the Fetch hot path
    (apis/fetch_response.py) and Produce v0-2, which kio has no schemas for.
    A Fetch answer's record bytes may be ``FileRegion``s of the log's files,
    sent by the connection without being read (connection/regions.py)."""

    chunks: Sequence[bytes | FileRegion]  # read-only: covariant, a list[bytes] is one
    flexible: bool  # whether the response header carries tagged fields


class ChunkWriter:
    """A write() target for kio that keeps chunks instead of copying them."""

    __slots__ = ("chunks", "size")

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.size = 0

    def write(self, data: bytes) -> None:
        self.chunks.append(data)
        self.size += len(data)


@cache
def request_schema(api_key: int, version: int) -> ModuleType:
    return load_payload_module(api_key, version, EntityType.request)


@cache
def response_schema(api_key: int, version: int) -> ModuleType:
    return load_payload_module(api_key, version, EntityType.response)


@cache
def _request_class(api_key: int, version: int) -> type | None:
    """kio's request class, or None for a version kio has no schema for."""
    try:
        module = request_schema(api_key, version)
    except UnknownEntity:
        return None
    return next(
        obj
        for obj in vars(module).values()
        if isinstance(obj, type) and getattr(obj, "__type__", None) is EntityType.request
    )


@cache
def entity_reader_for(cls: type) -> Any:
    return entity_reader(cls)


@cache
def entity_writer_for(cls: type) -> Any:
    return entity_writer(cls)


def read_header(frame: bytes | memoryview) -> tuple[RequestHeader, int]:
    """The fixed part of any request header, and where the rest begins."""
    if len(frame) < _HEADER.size:
        raise MalformedRequest(f"frame of {len(frame)} bytes is shorter than a request header")
    api_key, api_version, correlation_id, client_len = _HEADER.unpack_from(frame, 0)
    pos = _HEADER.size
    client_id = None
    if client_len >= 0:
        if pos + client_len > len(frame):
            raise MalformedRequest("client id runs past the end of the frame")
        client_id = bytes(frame[pos : pos + client_len]).decode("utf-8", "replace")
        pos += client_len
    return RequestHeader(api_key, api_version, correlation_id, client_id), pos


def decode_request(
    frame: bytes | memoryview,
    header: RequestHeader,
    pos: int,
    decode: Callable[[bytes | memoryview, int, int, int], object] | None = None,
    client_host: str = "",
    connection: int = -1,
    session: Session | None = None,
    max_items: int = -1,
) -> Request[object]:
    """Read the body of a request whose (api_key, version) is supported.

    ``decode`` is the API's own reader where it has one (a hot path, or
    versions kio has no schema for); otherwise kio reads the body. Either
    refuses a body with more than ``max_items`` array items (-1: any number).
    The body is of the type the API's handler takes (``apis.Api``: the class
    kio has for this version is one of its union, tests/test_contract.py).
    """
    version = header.api_version
    cls = _request_class(header.api_key, version)
    body: object
    try:
        if cls is not None and cls.__flexible__:
            pos = skip_tagged_fields(frame, pos)
        if decode is not None:
            body = decode(frame, pos, version, max_items)
        elif cls is None:
            raise MalformedRequest(f"no schema for API {header.api_key} v{version}")
        else:
            check_request(cls, frame, pos, max_items)  # before kio allocates for any count
            body, _size = entity_reader_for(cls)(frame, pos)
    except MalformedRequest:
        raise
    except Exception as exc:  # kio raises several types for bad bytes
        raise MalformedRequest(
            f"cannot decode API {header.api_key} v{version}: {exc}"
        ) from exc
    # Bytes after the body are ignored, as Kafka's own parser does: some
    # clients (librdkafka's Metadata v12) send a few more than the schema has.
    return Request(header, body, len(frame), client_host, connection, session)


def encode_uvarint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


# A response is written as runs of small chunks joined into buffers of about
# this size, and chunks this large or larger (record batches) as they are:
# writev fails (EINVAL in uvloop, the connection closing unanswered) for a
# response of millions of separate buffers, the 2-8 byte fields kio writes.
COALESCE_BYTES = 64 << 10
PASS_THROUGH_BYTES = 16 << 10


class _CoalescingWriter:
    """A write() target that joins small chunks as they come: a response of
    millions of fields never exists as millions of small objects."""

    __slots__ = ("_run", "chunks", "size")

    def __init__(self) -> None:
        self.chunks: list[bytes | bytearray | FileRegion] = []
        self.size = 0
        self._run = bytearray()

    def write(self, data: bytes | FileRegion) -> None:
        size = len(data)
        self.size += size
        # Record batches: passed on, not copied; a file region whatever its size
        # (its bytes are not read here).
        if size >= PASS_THROUGH_BYTES or isinstance(data, FileRegion):
            if self._run:
                self.chunks.append(self._run)
                self._run = bytearray()
            self.chunks.append(data)
            return
        self._run += data
        if len(self._run) >= COALESCE_BYTES:
            self.chunks.append(self._run)
            self._run = bytearray()

    def done(self) -> list[bytes | bytearray | FileRegion]:
        if self._run:
            self.chunks.append(self._run)
            self._run = bytearray()
        return self.chunks


def encode_response(api_key: int, correlation_id: int,
                    body: Any) -> list[bytes | bytearray | FileRegion]:
    """Size prefix, response header and body, as a bounded number of buffers
    for writelines(): about 2 * size / PASS_THROUGH_BYTES + 2."""
    out = _CoalescingWriter()
    if isinstance(body, EncodedBody):  # a hot path, or a version kio has no schema for
        if body.flexible:
            out.write(b"\x00")
        for chunk in body.chunks:
            out.write(chunk)
    else:
        # ApiVersions always answers with header v0 so any client can read it.
        if type(body).__flexible__ and api_key != API_VERSIONS_KEY:
            out.write(b"\x00")  # no tagged fields in the header
        entity_writer_for(type(body))(out, body)
    chunks = out.done()
    head = _SIZE.pack(out.size + _CORRELATION.size) + _CORRELATION.pack(correlation_id)
    if chunks and isinstance(chunks[0], bytearray):
        chunks[0][:0] = head  # small: this run is at most COALESCE_BYTES
    else:
        chunks.insert(0, head)
    return chunks


@cache
def _field_names(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in fields(cls))


def build(cls: type, **values: Any) -> Any:
    """Instantiate a kio entity from the values its version has fields for.

    Handlers describe a response once, with every field any version uses;
    each version's schema keeps the fields it knows.
    """
    names = _field_names(cls)
    return cls(**{k: v for k, v in values.items() if k in names})


def build_response(cls: type, **values: Any) -> ResponsePayload:
    """``build`` for the body a handler answers with (``contract.Response``):
    ``cls`` is read from a schema module, so ``build`` can only return Any."""
    body: ResponsePayload = build(cls, **values)
    return body
